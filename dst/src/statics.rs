//! Static IPs in the simulation: every fourth node asks for an Elastic IP
//! (`spec.ipam.static-ip-tags`), drawn from a pool the account holds from the start (no random
//! draw: the other choices of a seed stay as they were). The invariants, checked at every step:
//! * a live node's published `assigned-static-ip` is the address EC2 has on one of its
//!   instance's ENIs (never one it lost a race for, never one it gave up);
//! * no two live nodes publish the same address;
//! * no instance holds two of the pool's addresses (never a second one per node);
//! * no address without the operator's required tag is ever associated: the account also holds
//!   addresses with the nodes' `static-ip-tags` but not the cluster's tag (another team's), first
//!   in allocation-ID order (planted defect `static-ip-any-tag`).

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use eni_operator::ec2::Tags;
use testkit::sim::Simulator;

use crate::check::Broken;
use crate::world::{Phase, World};

/// Enough for every static node a run has at once (a run keeps far fewer nodes).
const POOL: u8 = 64;
/// Addresses an agent's tags match that the cluster was not given.
const NOT_GIVEN: u8 = 4;

pub fn tags() -> Tags {
    Tags::from([("dst/static-ip".to_string(), "pool".to_string())])
}

/// Whether node number `n` asks for a static IP.
pub fn wants(n: u32) -> bool {
    n.is_multiple_of(4)
}

/// The account's Elastic IPs for static nodes (the user allocated them and gave them to the
/// cluster with its tag, the operator's default `--static-ip-required-tag`; it never allocates).
pub fn seed(sim: &Simulator) {
    for i in 1..=NOT_GIVEN {
        sim.add_address(Ipv4Addr::new(198, 51, 100, 200 + i), tags());
    }
    let mut given = tags();
    given.insert(
        eni_operator::ipam::ownership::CLUSTER_TAG.to_string(),
        crate::world::CLUSTER.to_string(),
    );
    for i in 1..=POOL {
        sim.add_address(Ipv4Addr::new(198, 51, 100, i), given.clone());
    }
}

pub fn check(w: &World) -> Result<(), Broken> {
    let addresses = w.sim.addresses();
    let enis = w.sim.network_interfaces();
    let instance_of = |eni: &str| {
        enis.iter()
            .find(|e| e.id == eni)
            .and_then(|e| e.instance_id().map(str::to_string))
    };
    let given = |a: &eni_operator::ec2::Address| {
        a.tags
            .get(eni_operator::ipam::ownership::CLUSTER_TAG)
            .map(String::as_str)
            == Some(crate::world::CLUSTER)
    };
    if let Some(a) = addresses
        .iter()
        .find(|a| a.association_id.is_some() && !given(a))
    {
        return Err((
            "never an Elastic IP without the required tag",
            format!(
                "{} ({}) associated with {:?}",
                a.public_ip, a.allocation_id, a.network_interface_id
            ),
        ));
    }
    let mut per_instance: BTreeMap<String, Vec<Ipv4Addr>> = BTreeMap::new();
    for a in &addresses {
        if let Some(i) = a.network_interface_id.as_deref().and_then(instance_of) {
            per_instance.entry(i).or_default().push(a.public_ip);
        }
    }
    if let Some((i, ips)) = per_instance.iter().find(|(_, ips)| ips.len() > 1) {
        return Err((
            "never a second static IP per node",
            format!("{i} holds {ips:?}"),
        ));
    }
    let mut published: BTreeMap<String, &str> = BTreeMap::new();
    for (name, n) in &w.nodes {
        if n.phase != Phase::Live {
            continue;
        }
        let Some(node) = w.sink.get(name) else {
            continue;
        };
        let ip = node
            .status
            .as_ref()
            .map(|s| s.ipam.assigned_static_ip.clone())
            .unwrap_or_default();
        if ip.is_empty() || node.metadata.deletion_timestamp.is_some() {
            continue;
        }
        if let Some(other) = published.insert(ip.clone(), name) {
            return Err((
                "no static IP on two nodes",
                format!("{other} and {name} publish {ip}"),
            ));
        }
        let held = per_instance
            .get(&n.instance_id)
            .cloned()
            .unwrap_or_default();
        if !held.iter().any(|h| h.to_string() == ip) {
            return Err((
                "a published static IP is the node's in EC2",
                format!(
                    "{name} publishes {ip}, its instance {} holds {held:?}",
                    n.instance_id
                ),
            ));
        }
    }
    Ok(())
}
