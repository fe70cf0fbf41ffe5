//! Multi-pool release, step 0 (docs/rules.md §7.4): a dropped CIDR leaves `status.eni.enis` and
//! `spec.ipam.pool` *before* its unassign, and stays out while the unassign is pending.
//!
//! Why: the multi-pool agent takes addresses from any CIDR `status.eni.enis` lists, re-adopting
//! one it dropped when it runs short (Cilium #46674), and publishes that in `pools.allocated`
//! only with its next CiliumNode write (at most every 15 s, `--ipam-cilium-node-update-rate`).
//! So a CIDR the status still lists can be in use although `allocated` (even re-read right
//! before the call) does not say so yet; and when the status write after an unassign fails,
//! the status goes on listing a CIDR EC2 no longer has. Once the status no longer lists it, the
//! agent takes nothing new from it (Cilium's `podCIDRPool`, pkg/ipam/pool.go: a CIDR removed
//! while in use is kept for its addresses, allocates nothing new, and stays in the agent's
//! list "to re-gain ownership"), so after [`WITHDRAW_GRACE`] `allocated` tells the whole truth.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::time::Duration;

use ipnet::Ipv4Net;

use crate::crd::{AllocationIp, CiliumNode, EniEntry};

/// How long a withdrawn CIDR stays out of the status before its unassign: the agents' update
/// interval (15 s) with room for a write that had to be retried.
pub const WITHDRAW_GRACE: Duration = Duration::from_secs(30);

/// Whether the node's `status.eni.enis` lists any address of `cidr` (as an address or inside
/// a prefix): the agent may still take it.
pub fn status_lists(node: &CiliumNode, cidr: &Ipv4Net) -> bool {
    let Some(status) = node.status.as_ref() else {
        return false;
    };
    status.eni.enis.values().any(|e| {
        e.addresses
            .iter()
            .filter_map(|a| a.parse::<Ipv4Addr>().ok())
            .any(|a| cidr.contains(&a))
            || e.prefixes
                .iter()
                .filter_map(|p| p.parse::<Ipv4Net>().ok())
                .any(|p| p.contains(&cidr.network()) || cidr.contains(&p.network()))
    })
}

/// Leave the withdrawn CIDRs out of what is published: their prefixes and addresses in
/// `status.eni.enis`, their addresses in `spec.ipam.pool` (C2 holds: the pool loses what the
/// status loses).
pub fn strip(
    enis: &mut BTreeMap<String, EniEntry>,
    pool: &mut BTreeMap<String, AllocationIp>,
    withdrawn: &[Ipv4Net],
) {
    if withdrawn.is_empty() {
        return;
    }
    let out = |a: &str| {
        a.parse::<Ipv4Addr>()
            .is_ok_and(|a| withdrawn.iter().any(|c| c.contains(&a)))
    };
    for e in enis.values_mut() {
        e.addresses.retain(|a| !out(a));
        e.prefixes.retain(|p| {
            p.parse::<Ipv4Net>()
                .map_or(true, |p| !withdrawn.contains(&p.trunc()))
        });
    }
    pool.retain(|a, _| !out(a));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::CiliumNodeStatus;
    use crate::ipam::fixtures::{net, node};

    fn entry(addresses: &[&str], prefixes: &[&str]) -> EniEntry {
        EniEntry {
            id: "eni-1".into(),
            addresses: addresses.iter().map(ToString::to_string).collect(),
            prefixes: prefixes.iter().map(ToString::to_string).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn a_withdrawn_prefix_leaves_status_and_pool_with_all_its_addresses() {
        let prefix: Vec<String> = (16..32).map(|i| format!("10.0.0.{i}")).collect();
        let mut addresses: Vec<&str> = prefix.iter().map(String::as_str).collect();
        addresses.extend(["10.0.0.5", "10.0.0.6"]);
        let mut enis =
            BTreeMap::from([("eni-1".to_string(), entry(&addresses, &["10.0.0.16/28"]))]);
        let mut pool: BTreeMap<String, AllocationIp> = addresses
            .iter()
            .map(|a| (a.to_string(), AllocationIp::default()))
            .collect();
        strip(
            &mut enis,
            &mut pool,
            &[net("10.0.0.16/28"), net("10.0.0.6/32")],
        );
        assert_eq!(enis["eni-1"].addresses, ["10.0.0.5"]);
        assert!(enis["eni-1"].prefixes.is_empty());
        assert_eq!(pool.keys().collect::<Vec<_>>(), ["10.0.0.5"]);
    }

    #[test]
    fn the_status_lists_a_cidr_by_any_of_its_addresses_or_its_prefix() {
        let mut node = node();
        node.status = None;
        assert!(!status_lists(&node, &net("10.0.0.5/32")));
        let mut status = CiliumNodeStatus::default();
        status
            .eni
            .enis
            .insert("eni-1".into(), entry(&["10.0.0.5"], &["10.0.0.16/28"]));
        node.status = Some(status);
        assert!(status_lists(&node, &net("10.0.0.5/32")));
        assert!(status_lists(&node, &net("10.0.0.16/28")));
        assert!(!status_lists(&node, &net("10.0.0.6/32")));
        assert!(!status_lists(&node, &net("10.0.0.32/28")));
    }
}
