//! What may be released (§7.2) and the checks on a release against the node as it is now.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;

use ipnet::Ipv4Net;

use crate::crd::{CiliumNode, DEFAULT_POOL, ReleaseState};
use crate::ec2::{NetworkInterface, PREFIX_SIZE, prefix_addresses};

use crate::ipam::Release;
use crate::ipam::capacity::{single_addresses, usable_addresses};

/// Classic release candidates on one ENI (§7.2): what a release of them all would take off.
pub type Candidates = Release;

impl Release {
    /// Its single addresses and those of its prefixes.
    pub(super) fn addresses(&self) -> BTreeSet<Ipv4Addr> {
        let mut set: BTreeSet<Ipv4Addr> = self.ips.iter().copied().collect();
        set.extend(self.prefixes.iter().flat_map(|p| prefix_addresses(*p)));
        set
    }
}

/// The agent's and operator's entries of `status.ipam.release-ips`, parsed.
pub fn release_answers(node: &CiliumNode) -> BTreeMap<Ipv4Addr, ReleaseState> {
    node.status
        .as_ref()
        .map(|s| {
            s.ipam
                .release_ips
                .iter()
                .filter_map(|(k, v)| Some((k.parse().ok()?, ReleaseState::parse(v)?)))
                .collect()
        })
        .unwrap_or_default()
}

/// §7.2: pick the release candidates among the usable (non-excluded) ENIs, one entry per ENI.
/// Skips addresses in `used`, primaries and addresses in `skip` (already released).
///
/// With prefixes, as Cilium: the first ENI holding prefixes. Without, Cilium takes only the ENI
/// with the most releasable addresses, so halving a node's demand costs one release delay per
/// ENI; we take the fullest ENIs first until the excess is covered, and the handshake for all of
/// them runs at once.
pub fn classic_candidates(
    enis: &[&NetworkInterface],
    used: &BTreeSet<Ipv4Addr>,
    skip: &BTreeSet<Ipv4Addr>,
    excess: i64,
) -> Vec<Candidates> {
    if excess <= 0 {
        return Vec::new();
    }
    let mut sorted: Vec<&NetworkInterface> = enis.to_vec();
    sorted.sort_by(|a, b| a.id.cmp(&b.id));
    let free_single = |e: &NetworkInterface| -> Vec<Ipv4Addr> {
        single_addresses(e)
            .into_iter()
            .filter(|ip| *ip != e.primary_ip && !used.contains(ip) && !skip.contains(ip))
            .collect()
    };

    if let Some(eni) = sorted.iter().find(|e| !e.prefixes.is_empty()) {
        let mut left = excess;
        let mut c = Candidates {
            eni_id: eni.id.clone(),
            ..Default::default()
        };
        let mut prefixes = eni.prefixes.clone();
        prefixes.sort();
        for p in prefixes {
            if left < i64::from(PREFIX_SIZE) {
                break;
            }
            let untouched = prefix_addresses(p)
                .all(|a| !used.contains(&a) && !skip.contains(&a) && a != eni.primary_ip);
            if untouched {
                c.prefixes.push(p);
                left -= i64::from(PREFIX_SIZE);
            }
        }
        c.ips = free_single(eni)
            .into_iter()
            .take(usize::try_from(left.max(0)).unwrap_or(0))
            .collect();
        if !c.prefixes.is_empty() || !c.ips.is_empty() {
            return vec![c];
        }
    }

    let mut per_eni: Vec<(&NetworkInterface, Vec<Ipv4Addr>)> = sorted
        .iter()
        .filter(|e| e.prefixes.is_empty())
        .map(|e| (*e, free_single(e)))
        .filter(|(_, ips)| !ips.is_empty())
        .collect();
    // Stable: among equally full ENIs the ascending ID order stays.
    per_eni.sort_by_key(|e| std::cmp::Reverse(e.1.len()));
    let mut left = usize::try_from(excess).unwrap_or(usize::MAX);
    let mut out = Vec::new();
    for (eni, ips) in per_eni {
        if left == 0 {
            break;
        }
        let ips: Vec<Ipv4Addr> = ips.into_iter().take(left).collect();
        left -= ips.len();
        out.push(Candidates {
            eni_id: eni.id.clone(),
            prefixes: vec![],
            ips,
        });
    }
    out
}

/// The CIDRs a multi-pool agent derives from the usable ENIs (C3): each /28, and each address
/// not covered by a prefix as a /32. Maps each CIDR to its ENI.
pub fn attached_cidrs(enis: &[&NetworkInterface], with_primary: bool) -> BTreeMap<Ipv4Net, String> {
    let mut out = BTreeMap::new();
    for eni in enis {
        for p in &eni.prefixes {
            out.insert(p.trunc(), eni.id.clone());
        }
        for a in usable_addresses(eni, with_primary) {
            if !eni.prefixes.iter().any(|p| p.contains(&a)) {
                out.insert(Ipv4Net::from(a), eni.id.clone());
            }
        }
    }
    out
}

/// `spec.ipam.pools.allocated[default].cidrs`, IPv4 only.
pub fn allocated_cidrs(node: &CiliumNode) -> BTreeSet<Ipv4Net> {
    node.spec
        .ipam
        .pools
        .allocated
        .iter()
        .filter(|a| a.pool == DEFAULT_POOL)
        .flat_map(|a| a.cidrs.iter())
        .filter_map(|c| c.parse::<Ipv4Net>().ok().map(|n| n.trunc()))
        .collect()
}

/// §7.4 step 3: whether the agent holds any address of this release again (a CIDR it dropped
/// and re-adopted, Cilium #46674). Overlap, not equality: never release an address that lies
/// in any CIDR the agent lists.
pub fn readopted(release: &Release, allocated: &BTreeSet<Ipv4Net>) -> bool {
    allocated.iter().any(|a| {
        release.ips.iter().any(|ip| a.contains(ip))
            || release
                .prefixes
                .iter()
                .any(|p| a.contains(&p.network()) || p.contains(&a.network()))
    })
}

/// §7.4 step 3, the fresh copy's other refusals (issue 29): the node is classic now (a
/// downgrade, or an agent that reports `used`: a multi-pool release's "dropped CIDR" means
/// nothing to a classic agent, which releases only by the handshake), or an address of the
/// release is in its `status.ipam.used`. `Some(reason)`: do not unassign.
pub fn fresh_copy_refuses(release: &Release, fresh: &CiliumNode) -> Option<&'static str> {
    if crate::ipam::demand::generation(fresh) != crate::ipam::demand::Generation::MultiPool {
        return Some("the node is classic now");
    }
    let used = fresh.status.as_ref().map(|s| &s.ipam.used);
    let in_use = used.is_some_and(|u| {
        u.keys()
            .filter_map(|ip| ip.parse::<Ipv4Addr>().ok())
            .any(|ip| release.cidrs().any(|c| c.contains(&ip)))
    });
    in_use.then_some("an address of it is in use")
}
