//! The invariants. `always` holds after every simulated second, faults or not; the others hold
//! once the faults have stopped and the settle bound has passed.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use eni_operator::ec2::{EniState, NetworkInterface};
use eni_operator::ipam::ownership::{CLUSTER_TAG, INSTANCE_TAG};

use crate::view::View;
use crate::world::{CLUSTER, World};

pub type Broken = (&'static str, String);

/// Whether EC2 has `ip` on `eni` (primary, secondary or inside a delegated prefix).
pub(crate) fn holds(eni: &NetworkInterface, ip: Ipv4Addr) -> bool {
    eni.primary_ip == ip
        || eni.secondary_ips.contains(&ip)
        || eni.prefixes.iter().any(|p| p.contains(&ip))
}

/// Ownership read from the tags here, not through the operator's `is_owned_by` (a planted
/// defect there must not blind the check).
pub fn ours(e: &NetworkInterface) -> bool {
    e.tags.get(CLUSTER_TAG).map(String::as_str) == Some(CLUSTER)
        && e.tags.get(INSTANCE_TAG).is_some_and(|v| !v.is_empty())
}

pub fn always(w: &World) -> Result<(), Broken> {
    // Every call and write since the last second, whatever else changed (crate::leadership).
    crate::leadership::check(w)?;
    // A core's copies against what its watch delivered (crate::api; not a function of the
    // inputs below: a pass's write answer changes only the core's memory).
    crate::api::check(w)?;
    // Each unassign against the status, each process's managed set (crate::probes).
    crate::probes::check(w)?;
    // The same inputs as at the last pass give the same answer (crate::view).
    let inputs = View::inputs(w);
    if w.view.borrow().passed.as_ref() == Some(&inputs) {
        return Ok(());
    }
    always_on(w)?;
    w.view.borrow_mut().passed = Some(inputs);
    Ok(())
}

fn always_on(w: &World) -> Result<(), Broken> {
    crate::statics::check(w)?;
    w.view
        .borrow_mut()
        .aws_rules(&w.sim)
        .map_err(|e| ("aws-rules: one owner per address, limits per ENI", e))?;
    let enis = w.view.borrow_mut().enis(&w.sim);
    // Never more ENIs than the instance's limit, never two at one device index.
    let mut slots: BTreeMap<(&str, u32), &str> = BTreeMap::new();
    let mut per_instance: BTreeMap<&str, u32> = BTreeMap::new();
    for e in enis.values() {
        if let Some(a) = &e.attachment {
            if let Some(other) = slots.insert((&a.instance_id, a.device_index), &e.id) {
                return Err((
                    "one ENI per device index",
                    format!(
                        "{other} and {} at {} of {}",
                        e.id, a.device_index, a.instance_id
                    ),
                ));
            }
            *per_instance.entry(&a.instance_id).or_default() += 1;
        }
    }
    for n in w.nodes.values() {
        let count = per_instance
            .get(n.instance_id.as_str())
            .copied()
            .unwrap_or(0);
        if count > n.limits.max_enis {
            return Err((
                "ENIs within the instance's limit",
                format!(
                    "{} has {count} ENIs, limit {}",
                    n.instance_id, n.limits.max_enis
                ),
            ));
        }
    }
    // Other owners' ENIs: never detached, deleted or modified.
    for (id, snap) in &w.foreign {
        let Some(snap) = snap else { continue };
        match enis.get(id) {
            Some(now) if now == snap => {}
            Some(now) => {
                return Err((
                    "never touch an ENI we do not own",
                    format!("{id} changed: was {snap:?}, now {now:?}"),
                ));
            }
            None => {
                return Err(("never touch an ENI we do not own", format!("{id} deleted")));
            }
        }
    }
    // Before the guard, which would see a finalizer's release too, under its own name.
    crate::identity::check(w)?;
    crate::cilium::check(w)?;
    crate::forgery::check(w)?;
    w.guard.check(w)?;
    let mut pooled: BTreeMap<String, &str> = BTreeMap::new();
    for (name, n) in &w.nodes {
        if !n.running() {
            continue;
        }
        let Some(obj) = w.view.borrow_mut().node(&w.sink, name) else {
            continue;
        };
        // No address an agent uses ever unassigned (or moved off the node's instance).
        if let Some(status) = &obj.status {
            for (ip, a) in &status.ipam.used {
                let addr: Ipv4Addr = ip.parse().map_err(|_| ("parsable used", ip.clone()))?;
                let ok = enis.get(&a.resource).is_some_and(|e| {
                    holds(e, addr)
                        && e.attachment
                            .as_ref()
                            .is_some_and(|at| at.instance_id == n.instance_id)
                });
                if !ok {
                    return Err((
                        "no address in use unassigned",
                        format!(
                            "{name}: {ip} used on {} but EC2 has {:?}; release-ips {:?}",
                            a.resource,
                            enis.get(&a.resource),
                            status.ipam.release_ips
                        ),
                    ));
                }
            }
        }
        // C2: every pool address is listed on its ENI in status.
        let listed = |ip: &String, res: &String| {
            obj.status.as_ref().is_some_and(|s| {
                s.eni
                    .enis
                    .get(res)
                    .is_some_and(|e| e.addresses.iter().any(|x| x == ip))
            })
        };
        for (ip, a) in &obj.spec.ipam.pool {
            if !listed(ip, &a.resource) {
                return Err((
                    "pool within status (C2)",
                    format!("{name}: {ip} on {} not in status", a.resource),
                ));
            }
            // No address on two nodes (that its agent may use: one given up to a release in
            // flight may already be another node's).
            if !crate::multipool::agent_may_use(&obj, n.multi_pool.is_some(), ip) {
                continue;
            }
            if let Some(other) = pooled.insert(ip.clone(), name) {
                let release = |n: &str| {
                    w.sink
                        .get(n)
                        .and_then(|o| o.status)
                        .and_then(|s| s.ipam.release_ips.get(ip).cloned())
                };
                let holder = ip
                    .parse::<Ipv4Addr>()
                    .ok()
                    .and_then(|addr| enis.values().find(|e| holds(e, addr)).map(|e| e.id.clone()));
                return Err((
                    "no address on two nodes",
                    format!(
                        "{ip} in the pools of {other} (release {:?}) and {name} (release {:?}); \
                         EC2 has it on {holder:?}",
                        release(other),
                        release(name)
                    ),
                ));
            }
        }
    }
    crate::multipool::check(w)
}

/// Every running node's pods run (its demand is met) and its pool is within status.
pub fn demand_met(w: &World) -> Result<(), Broken> {
    for (name, n) in &w.nodes {
        if n.phase != crate::world::Phase::Live {
            continue;
        }
        if n.agent.pods.len() < n.agent.target {
            let missing = n.agent.target - n.agent.pods.len();
            let excuse = excused(w, name, n, missing);
            if let Some(Ok(())) = excuse {
                continue;
            }
            let obj = w.sink.get(name);
            let pool = obj.as_ref().map(|o| o.spec.ipam.pool.len());
            // What the operator says of the node: why it does not serve it.
            let said = obj
                .as_ref()
                .and_then(|o| o.status.as_ref())
                .and_then(|s| s.ipam.operator_status.error.clone())
                .map(|e| format!("; operator-status: {e}"))
                .unwrap_or_default();
            return Err((
                "demand met within the settle bound",
                format!(
                    "{name}: {} of {} pods (pool {pool:?}, capacity {}): {}{said}",
                    n.agent.pods.len(),
                    n.agent.target,
                    n.capacity,
                    excuse.and_then(Result::err).unwrap_or_default()
                ),
            ));
        }
    }
    Ok(())
}

/// Whether the account excuses `missing` addresses of node `name` (pod subnets that ran out,
/// and its status says why); `None`: no CiliumNode.
pub fn excused(
    w: &World,
    name: &str,
    n: &crate::world::SimNode,
    missing: usize,
) -> Option<Result<(), String>> {
    let obj = w.sink.get(name)?;
    let foreign: Vec<String> = w.foreign.keys().cloned().collect();
    let facts = crate::account::NodeFacts {
        zone: &obj.spec.eni.availability_zone,
        instance_id: &n.instance_id,
        first_interface_index: n.first_interface_index,
        max_enis: n.limits.max_enis,
        ipv4_per_eni: n.limits.ipv4_per_eni,
        missing,
        operator_error: obj
            .status
            .as_ref()
            .and_then(|s| s.ipam.operator_status.error.as_deref()),
        foreign: &foreign,
    };
    Some(w.account.excuse(&facts, &w.sim.network_interfaces()))
}

/// No ENI of ours left `available` (two GC intervals have passed within the settle bound).
pub fn no_available_owned(w: &World) -> Result<(), Broken> {
    let left: Vec<String> = w
        .sim
        .network_interfaces()
        .into_iter()
        // In the cluster's VPC: a same-named cluster's ENIs elsewhere are not ours
        // (crate::forgery's peered VPC).
        .filter(|e| ours(e) && e.attachment.is_none() && e.state == EniState::Available)
        .filter(|e| e.vpc_id == w.vpc)
        .map(|e| e.id)
        .collect();
    if left.is_empty() {
        Ok(())
    } else {
        Err(("no owned ENI left available", format!("{left:?}")))
    }
}

/// The operator holds no node whose CiliumNode the API server no longer has: a deletion it
/// missed (a watch that was away) would stay in its memory, queue and metrics for good, and a
/// node that comes back under that name would inherit it.
pub fn no_vanished_nodes(w: &World) -> Result<(), Broken> {
    for core in w.cores() {
        let others = w.identity.names().chain(w.forgery.names());
        for name in w.nodes.keys().chain(others) {
            if w.sink.raw(name).is_none() && core.demand(name).is_some() {
                return Err((
                    "no node held after its CiliumNode is gone",
                    format!("the operator still holds {name}"),
                ));
            }
        }
    }
    Ok(())
}
