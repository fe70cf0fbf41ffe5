//! A classic Cilium agent (`ipam: eni`, pkg/ipam/crd.go): pods hold pool addresses, reported in
//! `status.ipam.used`; release proposals (`status.ipam.release-ips`) are answered against the
//! pods running at that moment. The same model as the benchmark's agent
//! (bench/src/scenario.rs), kept pure: it reads a CiliumNode and returns the edited one.

use std::collections::BTreeSet;
use testkit::agent::answer_release_proposals;

use eni_operator::crd::{AllocationIp, CiliumNode};
use rand::Rng;
use rand::rngs::StdRng;

#[derive(Debug, Default)]
pub struct Agent {
    /// Addresses held by running pods.
    pub pods: BTreeSet<String>,
    /// Pods the node should run (the demand).
    pub target: usize,
}

impl Agent {
    /// One look at the node: answer release proposals, stop extra pods, start missing ones on
    /// free pool addresses not being released. `None` when nothing changed (no write).
    pub fn step(&mut self, node: &CiliumNode, rng: &mut StdRng) -> Option<CiliumNode> {
        let mut node = node.clone();
        let before = node.status.clone();
        let pool = node.spec.ipam.pool.clone();
        let pods = &self.pods;
        answer_release_proposals(&mut node, |ip| pods.contains(ip));
        let status = node.status.get_or_insert_with(Default::default);
        // A pod whose address left the pool cannot exist in a correct run (the invariant checks
        // catch the unassignment); the agent forgets it so the run goes on.
        self.pods.retain(|ip| pool.contains_key(ip));
        while self.pods.len() > self.target {
            // Which pod stops is the seed's choice.
            let i = rng.random_range(0..self.pods.len());
            let ip = self.pods.iter().nth(i).cloned().expect("in range");
            self.pods.remove(&ip);
        }
        for ip in pool.keys() {
            if self.pods.len() >= self.target {
                break;
            }
            if !self.pods.contains(ip) && !status.ipam.release_ips.contains_key(ip) {
                self.pods.insert(ip.clone());
            }
        }
        status.ipam.used = self
            .pods
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
        (node.status != before).then_some(node)
    }
}
