//! The classic agent's pods (`ipam: eni`, Cilium's pkg/ipam/crd.go): pods hold pool addresses,
//! reported in `status.ipam.used`; release proposals are answered against the pods running at
//! that moment. One model for the benchmark and the simulation; pure: it edits the CiliumNode
//! it is given.

use std::collections::BTreeSet;

use eni_operator::crd::{AllocationIp, CiliumNode};

use super::answer_release_proposals;

/// One look at `node` by an agent whose pods hold `pods` and should number `target`: answer
/// release proposals, forget pods whose address left the pool, stop extra pods (`pick(n)`
/// chooses which of the `n` running ones), start missing ones on free pool addresses not being
/// released, and list the pods in `status.ipam.used`.
pub fn step_pods(
    pods: &mut BTreeSet<String>,
    target: usize,
    node: &mut CiliumNode,
    mut pick: impl FnMut(usize) -> usize,
) {
    let pool = node.spec.ipam.pool.clone();
    answer_release_proposals(node, |ip| pods.contains(ip));
    let status = node.status.get_or_insert_with(Default::default);
    // A pod whose address left the pool cannot exist in a correct run (the callers' checks
    // catch the unassignment); the agent forgets it so the run goes on.
    pods.retain(|ip| pool.contains_key(ip));
    while pods.len() > target {
        let ip = pods
            .iter()
            .nth(pick(pods.len()))
            .cloned()
            .expect("in range");
        pods.remove(&ip);
    }
    for ip in pool.keys() {
        if pods.len() >= target {
            break;
        }
        if !pods.contains(ip) && !status.ipam.release_ips.contains_key(ip) {
            pods.insert(ip.clone());
        }
    }
    status.ipam.used = pods
        .iter()
        .map(|ip| {
            (
                ip.clone(),
                AllocationIp {
                    owner: format!("default/pod-{ip}"),
                    resource: pool[ip].resource.clone(),
                    ..Default::default()
                },
            )
        })
        .collect();
}
