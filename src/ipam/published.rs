//! What a node's agent can use: the addresses EC2 holds on the node's usable ENIs that its
//! CiliumNode also publishes. A classic agent takes addresses from `spec.ipam.pool`, a
//! multi-pool agent from `status.eni.enis` (Cilium's `pkg/ipam/crd.go` and `multipool.go`): an
//! address assigned in EC2 and not yet written there is no use to a pod.
//!
//! Shadow mode judges the serving allocator's deficit on this count, so a deficit ends with the
//! write that serves the node, not with the EC2 call before it. The two can be far apart: Cilium
//! 1.16 assigned four addresses, its follow-up `DescribeInstanceTypes` failed, and it wrote the
//! pool about 30 s later (e2e `cilium-shadow`; the shadow, counting EC2, had seen the node served).

use std::collections::BTreeSet;
use std::net::Ipv4Addr;

use crate::crd::CiliumNode;

use super::capacity::Room;
use super::demand::{self, Demand, Generation};
use super::{Ec2View, InstanceView, IpamConfig};

/// The node's demand figures with `available` counting only what its CiliumNode publishes.
/// `None` when they cannot be known (invalid watermarks, instance or limits unknown): the plan
/// reports why.
pub fn agent_demand(node: &CiliumNode, ec2: &Ec2View<'_>, config: &IpamConfig) -> Option<Demand> {
    let marks = demand::watermarks(node).ok()?;
    let InstanceView::Known { enis, .. } = ec2.instance else {
        return None;
    };
    let room = Room::of(
        &node.spec.instance_id,
        &node.spec.eni,
        enis,
        ec2.limits?,
        config,
    );
    let shown = shown_addresses(node);
    let available = room.available(|ip| shown.contains(ip));
    Some(demand::compute(node, &marks, available, room.instance_max))
}

/// The addresses the node's agent reads: the pool's keys (classic) or the addresses listed
/// under `status.eni.enis` (multi-pool; prefixes are flattened there, C3). Unparsable entries
/// are skipped.
fn shown_addresses(node: &CiliumNode) -> BTreeSet<Ipv4Addr> {
    let listed: Vec<&String> = match demand::generation(node) {
        Generation::Classic => node.spec.ipam.pool.keys().collect(),
        Generation::MultiPool => node
            .status
            .iter()
            .flat_map(|s| s.eni.enis.values())
            .flat_map(|e| e.addresses.iter())
            .collect(),
    };
    listed.into_iter().filter_map(|a| a.parse().ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::{AllocationIp, EniEntry, IpamPoolRequest};
    use crate::ipam::fixtures::{World, eni_with_ips, node};

    /// A world whose second ENI holds 6 addresses, and a node listing `shown` of them.
    fn world() -> World {
        let mut w = World::new();
        w.enis.push(eni_with_ips("eni-1", 1, "subnet-a", 6));
        w
    }

    fn pooled(n: &mut CiliumNode, w: &World, shown: usize) {
        for ip in w.enis[1].secondary_ips.iter().take(shown) {
            n.spec.ipam.pool.insert(
                ip.to_string(),
                AllocationIp {
                    resource: "eni-1".into(),
                    ..Default::default()
                },
            );
        }
    }

    #[test]
    fn a_classic_agent_counts_only_the_addresses_of_its_pool() {
        let w = world();
        let mut n = node();
        pooled(&mut n, &w, 2);
        let cfg = IpamConfig::default();
        let d = agent_demand(&n, &w.view(), &cfg).expect("known");
        assert_eq!(d.available, 2, "4 of EC2's 6 are not written yet: {d:?}");
        assert_eq!(d.needed, 6, "8 spare wanted, 2 shown: {d:?}");
        pooled(&mut n, &w, 6);
        let d = agent_demand(&n, &w.view(), &cfg).expect("known");
        assert_eq!((d.available, d.needed), (6, 2), "{d:?}");
    }

    #[test]
    fn a_pool_address_ec2_does_not_hold_is_no_use() {
        let w = world();
        let mut n = node();
        pooled(&mut n, &w, 6);
        n.spec
            .ipam
            .pool
            .insert("10.0.200.9".into(), AllocationIp::default());
        let d = agent_demand(&n, &w.view(), &IpamConfig::default()).expect("known");
        assert_eq!(d.available, 6, "{d:?}");
    }

    #[test]
    fn a_multi_pool_agent_counts_the_addresses_status_lists() {
        let w = world();
        let mut n = node();
        n.spec.ipam.pools.requested.push(IpamPoolRequest {
            pool: "default".into(),
            ..Default::default()
        });
        // A pool entry is no use to a multi-pool agent; the ENI's listed addresses are.
        pooled(&mut n, &w, 6);
        let listed = w.enis[1].secondary_ips[..3]
            .iter()
            .map(|ip| ip.to_string())
            .collect();
        n.status
            .get_or_insert_with(Default::default)
            .eni
            .enis
            .insert(
                "eni-1".into(),
                EniEntry {
                    id: "eni-1".into(),
                    addresses: listed,
                    ..Default::default()
                },
            );
        let d = agent_demand(&n, &w.view(), &IpamConfig::default()).expect("known");
        assert_eq!(d.generation, Generation::MultiPool);
        assert_eq!(d.available, 3, "{d:?}");
    }

    #[test]
    fn nothing_is_said_of_an_instance_or_type_not_known() {
        let mut w = world();
        w.limits = None;
        assert!(agent_demand(&node(), &w.view(), &IpamConfig::default()).is_none());
        let mut w = world();
        w.presence = crate::ipam::fixtures::Presence::Unknown;
        assert!(agent_demand(&node(), &w.view(), &IpamConfig::default()).is_none());
    }
}
