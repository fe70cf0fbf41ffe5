//! Release of excess addresses (docs/rules.md §7), with the per-node memory it needs.
//!
//! * **Classic agents:** candidates per §7.2, then the four-state handshake on
//!   `status.ipam.release-ips` (§7.3): propose `marked-for-release` after the release delay,
//!   unassign only what the agent acknowledged `ready-for-release`. A /28 goes only when all 16
//!   of its addresses are acknowledged; one `do-not-release` withdraws the whole prefix.
//! * **Multi-pool agents:** the agent drops CIDRs from `spec.ipam.pools.allocated`; we track
//!   those drops on every plan (§7.4) and unassign dropped CIDRs once older than the delay,
//!   capped by the excess formula (§7.5) so a node never flaps between allocate and release.
//!
//! Never released: an address in `status.ipam.used`, a CIDR still in `pools.allocated`, an
//! ENI's primary address. ENIs are never deleted for excess.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::time::Instant;

use ipnet::Ipv4Net;

use crate::crd::{CiliumNode, DEFAULT_POOL, ReleaseState};
use crate::ec2::{NetworkInterface, PREFIX_SIZE, prefix_addresses};

use super::capacity::{single_addresses, usable_addresses};
use super::demand::Generation;
use super::withdrawal::{WITHDRAW_GRACE, status_lists};
use super::{IpamConfig, Release};

/// In-memory release state of one node; lost on restart (a handshake then restarts, as in
/// Cilium). The runtime keeps one per CiliumNode and passes it to every plan.
#[derive(Clone, Debug, Default)]
pub struct NodeMemory {
    classic: ClassicMemory,
    multi_pool: Option<MultiPoolMemory>,
    generation: Option<Generation>,
    /// Goes into the node's next `ClientToken`; moved on whenever a token is spent, so a token
    /// is only ever reused to retry the very same request (see `ownership::client_token`).
    eni_token_generation: u32,
}

#[derive(Clone, Debug, Default)]
struct ClassicMemory {
    /// When each candidate address was first seen as a candidate.
    first_seen: BTreeMap<Ipv4Addr, Instant>,
    /// Addresses the operator proposes as `marked-for-release`.
    proposed: BTreeSet<Ipv4Addr>,
    /// Unassigned addresses, to be published as `released` until the agent removes them.
    released: BTreeMap<Ipv4Addr, Released>,
}

#[derive(Clone, Copy, Debug)]
struct Released {
    at: Instant,
    /// Seen in the object as `released`: once it disappears again, the agent removed it.
    published: bool,
}

#[derive(Clone, Debug, Default)]
struct MultiPoolMemory {
    /// `pools.allocated` at the previous observation.
    previous: BTreeSet<Ipv4Net>,
    /// CIDRs the agent dropped, with when the drop was first seen.
    marked: BTreeMap<Ipv4Net, Instant>,
    /// CIDRs chosen for release and left out of what is published, with since when the node's
    /// status no longer lists them (see `withdrawal`).
    withdrawn: BTreeMap<Ipv4Net, Instant>,
}

/// Classic release candidates on one ENI (§7.2).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Candidates {
    pub eni_id: String,
    pub prefixes: Vec<Ipv4Net>,
    pub ips: Vec<Ipv4Addr>,
}

impl Candidates {
    fn addresses(&self) -> BTreeSet<Ipv4Addr> {
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
    if super::demand::generation(fresh) != super::Generation::MultiPool {
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

impl NodeMemory {
    pub fn new() -> Self {
        Self::default()
    }

    /// Note the node's generation. When a node turns multi-pool, the operator's handshake
    /// proposals are withdrawn; when it turns classic, CIDR marks are dropped.
    pub fn observe_generation(&mut self, generation: Generation) {
        match (self.generation, generation) {
            (Some(Generation::MultiPool), Generation::MultiPool) => {}
            (_, Generation::MultiPool) => self.classic = ClassicMemory::default(),
            (_, Generation::Classic) => self.multi_pool = None,
        }
        self.generation = Some(generation);
    }

    /// Addresses proposed as `marked-for-release`.
    pub fn proposed(&self) -> impl Iterator<Item = Ipv4Addr> + '_ {
        self.classic.proposed.iter().copied()
    }

    /// Addresses unassigned by the operator that are not yet published as `released`.
    pub fn released_unpublished(&self) -> impl Iterator<Item = Ipv4Addr> + '_ {
        self.classic
            .released
            .iter()
            .filter(|(_, r)| !r.published)
            .map(|(ip, _)| *ip)
    }

    /// Every address unassigned by the operator and still remembered, with when.
    pub fn released(&self) -> impl Iterator<Item = (Ipv4Addr, Instant)> + '_ {
        self.classic.released.iter().map(|(ip, r)| (*ip, r.at))
    }

    /// Multi-pool CIDRs the agent dropped and that are still attached, with when first seen.
    pub fn marked_cidrs(&self) -> impl Iterator<Item = (Ipv4Net, Instant)> + '_ {
        self.multi_pool
            .iter()
            .flat_map(|m| m.marked.iter().map(|(c, t)| (*c, *t)))
    }

    /// Call after a successful unassign of `release`: its addresses become `released` in
    /// `release-ips` (classic) and its CIDRs are unmarked (multi-pool). On a partial failure,
    /// call it with only what was unassigned; the rest stays pending and is retried.
    pub fn record_released(&mut self, release: &Release, now: Instant) {
        let addresses = release
            .ips
            .iter()
            .copied()
            .chain(release.prefixes.iter().flat_map(|p| prefix_addresses(*p)));
        let classic = self.generation != Some(Generation::MultiPool);
        for ip in addresses {
            self.classic.first_seen.remove(&ip);
            self.classic.proposed.remove(&ip);
            if classic {
                self.classic.released.insert(
                    ip,
                    Released {
                        at: now,
                        published: false,
                    },
                );
            }
        }
        if let Some(m) = self.multi_pool.as_mut() {
            for c in release.cidrs() {
                m.marked.remove(&c);
                m.withdrawn.remove(&c);
            }
        }
    }

    /// One classic pass (§7.3 steps 1-4): updates candidates, first-seen times and proposals;
    /// returns the acknowledged addresses to unassign now, if any. `usable` are the
    /// non-excluded ENIs, `usable_addresses` what they hold now.
    pub(crate) fn classic_pass(
        &mut self,
        node: &CiliumNode,
        usable: &[&NetworkInterface],
        excess: i64,
        config: &IpamConfig,
        now: Instant,
    ) -> Option<Release> {
        let answers = release_answers(node);
        let held: BTreeSet<Ipv4Addr> = usable
            .iter()
            .flat_map(|e| usable_addresses(e, true))
            .collect();
        // Forget `released` entries the agent removed, and those EC2 gave back to us.
        self.classic.released.retain(|ip, r| {
            if held.contains(ip) {
                return false;
            }
            match answers.get(ip) {
                Some(ReleaseState::Released) => {
                    r.published = true;
                    true
                }
                Some(_) => true,
                None => !r.published,
            }
        });
        let reset = |c: &mut ClassicMemory| {
            c.first_seen.clear();
            c.proposed.clear();
        };
        if !config.release_excess_ips {
            reset(&mut self.classic);
            return None;
        }
        let mut used = super::demand::used_addresses(node);
        if crate::mutants::active("release-used") {
            used.clear();
        }
        let skip: BTreeSet<Ipv4Addr> = self.classic.released.keys().copied().collect();
        let cands = classic_candidates(usable, &used, &skip, excess);
        if cands.is_empty() {
            reset(&mut self.classic);
            return None;
        }
        // Candidates that dropped out (another ENI now, or no longer excess) are forgotten.
        let all: BTreeSet<Ipv4Addr> = cands.iter().flat_map(Candidates::addresses).collect();
        let c = &mut self.classic;
        c.first_seen.retain(|ip, _| all.contains(ip));
        c.proposed.retain(|ip| all.contains(ip));
        for ip in &all {
            c.first_seen.entry(*ip).or_insert(now);
        }
        let ripe = |c: &ClassicMemory, ip: &Ipv4Addr| {
            c.first_seen
                .get(ip)
                .is_some_and(|t| now.saturating_duration_since(*t) >= config.release_delay)
        };
        let primaries: BTreeSet<Ipv4Addr> = usable.iter().map(|e| e.primary_ip).collect();
        let releasable = |ip: &Ipv4Addr| !used.contains(ip) && !primaries.contains(ip);

        // Every ENI's proposals advance in this pass; one unassign call per pass, so the first
        // ENI with acknowledged addresses is released now and the next on the following pass.
        let mut first_queued: Option<Release> = None;
        for cand in &cands {
            let mut queued = Release {
                eni_id: cand.eni_id.clone(),
                ..Default::default()
            };
            for prefix in &cand.prefixes {
                let addrs: Vec<Ipv4Addr> = prefix_addresses(*prefix).collect();
                if addrs
                    .iter()
                    .any(|a| answers.get(a) == Some(&ReleaseState::DoNotRelease))
                {
                    // One refusal withdraws the whole /28.
                    for a in &addrs {
                        c.first_seen.remove(a);
                        c.proposed.remove(a);
                    }
                    continue;
                }
                let all_ready = addrs.iter().all(|a| {
                    answers.get(a) == Some(&ReleaseState::ReadyForRelease)
                        && ripe(c, a)
                        && releasable(a)
                });
                if all_ready {
                    queued.prefixes.push(*prefix);
                } else {
                    let ripe_addrs: Vec<Ipv4Addr> =
                        addrs.iter().copied().filter(|a| ripe(c, a)).collect();
                    c.proposed.extend(ripe_addrs);
                }
            }
            for ip in &cand.ips {
                if !ripe(c, ip) {
                    continue;
                }
                match answers.get(ip) {
                    Some(ReleaseState::ReadyForRelease) if releasable(ip) => queued.ips.push(*ip),
                    _ if crate::mutants::active("release-used") => queued.ips.push(*ip),
                    Some(ReleaseState::DoNotRelease) => {
                        c.first_seen.remove(ip);
                        c.proposed.remove(ip);
                    }
                    _ => {
                        c.proposed.insert(*ip);
                    }
                }
            }
            let any = !queued.ips.is_empty() || !queued.prefixes.is_empty();
            if any && first_queued.is_none() {
                first_queued = Some(queued);
            }
        }
        first_queued
    }

    /// §7.4 tracking, on every plan of a multi-pool node: mark CIDRs the agent dropped from
    /// `pools.allocated`, unmark those it took back or that are no longer attached.
    pub fn track_multi_pool(
        &mut self,
        allocated: &BTreeSet<Ipv4Net>,
        attached: &BTreeMap<Ipv4Net, String>,
        now: Instant,
    ) {
        match self.multi_pool.as_mut() {
            None => {
                // First observation (also after a restart): whatever is attached but not held
                // by the agent counts as dropped now.
                let marked = attached
                    .keys()
                    .filter(|c| !allocated.contains(c))
                    .map(|c| (*c, now))
                    .collect();
                self.multi_pool = Some(MultiPoolMemory {
                    previous: allocated.clone(),
                    marked,
                    withdrawn: BTreeMap::new(),
                });
            }
            Some(m) => {
                for gone in m.previous.difference(allocated) {
                    m.marked.entry(*gone).or_insert(now);
                }
                m.previous = allocated.clone();
            }
        }
        if let Some(m) = self.multi_pool.as_mut() {
            m.marked
                .retain(|c, _| !allocated.contains(c) && attached.contains_key(c));
        }
    }

    /// CIDRs left out of the published status and pool until their unassign (`withdrawal`).
    pub fn withdrawn_cidrs(&self) -> Vec<Ipv4Net> {
        self.multi_pool
            .iter()
            .flat_map(|m| m.withdrawn.keys().copied())
            .collect()
    }

    /// §7.4 with the withdrawal first (`withdrawal`): the CIDRs chosen for release (prefixes
    /// first, single addresses on a later pass: one unassign call per pass) are withdrawn from
    /// what is published; the release returned holds only those `node`'s status has not listed
    /// for [`WITHDRAW_GRACE`]. A CIDR no longer chosen (taken back, no longer in excess) is
    /// published again.
    pub(crate) fn multi_pool_withdraw(
        &mut self,
        node: &CiliumNode,
        usable: &[&NetworkInterface],
        allocated: &BTreeSet<Ipv4Net>,
        excess: i64,
        config: &IpamConfig,
        now: Instant,
    ) -> Option<Release> {
        let mut chosen = self.multi_pool_release(usable, allocated, excess, config, now);
        if let Some(r) = chosen.as_mut().filter(|r| !r.prefixes.is_empty()) {
            r.ips.clear();
        }
        // Planted defect (dst-mutants): unassigned while the status still lists it.
        if crate::mutants::active("unassign-before-withdraw") {
            return chosen;
        }
        let m = self.multi_pool.as_mut()?;
        let cidrs: BTreeSet<Ipv4Net> = chosen.iter().flat_map(Release::cidrs).collect();
        m.withdrawn.retain(|c, _| cidrs.contains(c));
        for c in &cidrs {
            let since = m.withdrawn.entry(*c).or_insert(now);
            if status_lists(node, c) {
                // Not out of the status yet (the write is still to come, or failed).
                *since = now;
            }
        }
        let ready = |c: Ipv4Net| {
            m.withdrawn
                .get(&c)
                .is_some_and(|t| now.saturating_duration_since(*t) >= WITHDRAW_GRACE)
        };
        let mut release = chosen?;
        release.prefixes.retain(|p| ready(p.trunc()));
        release.ips.retain(|ip| ready(Ipv4Net::from(*ip)));
        (!release.prefixes.is_empty() || !release.ips.is_empty()).then_some(release)
    }

    /// §7.4 release + §7.5 cap: dropped CIDRs older than the delay, on one ENI, whose total
    /// size stays within `excess` (a /28 counts 16). Never a CIDR still allocated, never a
    /// primary address.
    pub(crate) fn multi_pool_release(
        &self,
        usable: &[&NetworkInterface],
        allocated: &BTreeSet<Ipv4Net>,
        excess: i64,
        config: &IpamConfig,
        now: Instant,
    ) -> Option<Release> {
        if !config.release_excess_ips || excess <= 0 {
            return None;
        }
        let m = self.multi_pool.as_ref()?;
        let ripe: BTreeSet<Ipv4Net> = m
            .marked
            .iter()
            .filter(|(c, t)| {
                now.saturating_duration_since(**t) >= config.release_delay && !allocated.contains(c)
            })
            .map(|(c, _)| *c)
            .collect();
        let mut sorted: Vec<&NetworkInterface> = usable.to_vec();
        sorted.sort_by(|a, b| a.id.cmp(&b.id));
        for eni in sorted {
            let mut budget = excess;
            let mut out = Release {
                eni_id: eni.id.clone(),
                ..Default::default()
            };
            let mut prefixes: Vec<Ipv4Net> = eni.prefixes.iter().map(|p| p.trunc()).collect();
            prefixes.sort();
            for p in prefixes {
                if ripe.contains(&p) && budget >= i64::from(PREFIX_SIZE) {
                    out.prefixes.push(p);
                    budget -= i64::from(PREFIX_SIZE);
                }
            }
            for ip in single_addresses(eni) {
                if budget >= 1 && ip != eni.primary_ip && ripe.contains(&Ipv4Net::from(ip)) {
                    out.ips.push(ip);
                    budget -= 1;
                }
            }
            if !out.ips.is_empty() || !out.prefixes.is_empty() {
                return Some(out);
            }
        }
        None
    }
}

/// The ENI token generation (kept apart from the release bookkeeping above).
impl NodeMemory {
    /// The generation the node's next `CreateNetworkInterface` token is derived from.
    pub fn eni_token_generation(&self) -> u32 {
        self.eni_token_generation
    }

    /// The current token is spent (its ENI was attached or deleted, or EC2 answered it with an
    /// ENI that no longer exists or a parameter mismatch): the next intent gets a fresh one.
    pub fn retire_eni_token(&mut self) {
        // Planted defect (dst-mutants): a spent token is used again.
        if crate::mutants::active("reuse-burned-token") {
            return;
        }
        self.eni_token_generation = self.eni_token_generation.wrapping_add(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::{AllocationIp, IpamPoolAllocation};
    use crate::ipam::testkit::*;
    use std::time::Duration;

    fn config() -> IpamConfig {
        IpamConfig {
            release_excess_ips: true,
            release_delay: Duration::from_secs(180),
            ..Default::default()
        }
    }

    fn set_used(node: &mut CiliumNode, ips: &[&str]) {
        let s = node.status.get_or_insert_default();
        s.ipam.used = ips
            .iter()
            .map(|i| (i.to_string(), AllocationIp::default()))
            .collect();
    }

    fn answer(node: &mut CiliumNode, ip: Ipv4Addr, state: ReleaseState) {
        node.status
            .get_or_insert_default()
            .ipam
            .release_ips
            .insert(ip.to_string(), state.as_str().into());
    }

    #[test]
    fn candidates_prefer_first_prefix_eni_then_the_fullest_enis() {
        let mut a = eni_with_ips("eni-a", 1, "s", 3);
        let b = eni_with_ips("eni-b", 2, "s", 5);
        let used = BTreeSet::from([b.secondary_ips[0]]);
        let c = classic_candidates(&[&a, &b], &used, &BTreeSet::new(), 10);
        let ids: Vec<&str> = c.iter().map(|c| c.eni_id.as_str()).collect();
        assert_eq!(
            ids,
            ["eni-b", "eni-a"],
            "fullest first: 4 on eni-b vs 3 on eni-a"
        );
        assert_eq!(c[0].ips.len(), 4);
        assert_eq!(c[1].ips.len(), 3);
        assert!(!c[0].ips.contains(&b.secondary_ips[0]));
        let c = classic_candidates(&[&a, &b], &used, &BTreeSet::new(), 2);
        assert_eq!(c.len(), 1, "one ENI covers an excess of 2");
        assert_eq!(c[0].ips.len(), 2, "capped at excess");
        let c = classic_candidates(&[&a, &b], &used, &BTreeSet::new(), 6);
        assert_eq!(c[1].ips.len(), 2, "the second ENI gives only the rest");

        a.prefixes = vec![net("10.1.0.0/28"), net("10.1.0.16/28")];
        let used = BTreeSet::from([ip("10.1.0.20")]);
        let c = classic_candidates(&[&a, &b], &used, &BTreeSet::new(), 20);
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].eni_id, "eni-a");
        assert_eq!(c[0].prefixes, [net("10.1.0.0/28")], "used /28 kept");
        assert_eq!(c[0].ips.len(), 3, "then singles up to remaining excess 4");
        let c = classic_candidates(&[&a], &used, &BTreeSet::new(), 15);
        assert!(c[0].prefixes.is_empty(), "excess < 16: no prefix");
        assert!(classic_candidates(&[&a], &used, &BTreeSet::new(), 0).is_empty());
    }

    #[test]
    fn excess_across_enis_is_released_after_one_delay() {
        let mut w = World::new();
        w.enis.push(eni_with_ips("eni-1", 1, "subnet-a", 4));
        w.enis.push(eni_with_ips("eni-2", 2, "subnet-a", 4));
        let usable: Vec<&NetworkInterface> = w.enis.iter().collect();
        let mut node = node();
        let mut mem = NodeMemory::new();
        let cfg = config();
        let t0 = Instant::now();
        let t1 = t0 + cfg.release_delay;
        assert!(mem.classic_pass(&node, &usable, 6, &cfg, t0).is_none());
        assert!(mem.classic_pass(&node, &usable, 6, &cfg, t1).is_none());
        assert_eq!(mem.proposed().count(), 6, "both ENIs proposed in one round");
        for ip in mem.proposed().collect::<Vec<_>>() {
            answer(&mut node, ip, ReleaseState::ReadyForRelease);
        }
        let first = mem.classic_pass(&node, &usable, 6, &cfg, t1).unwrap();
        mem.record_released(&first, t1);
        assert_eq!(first.ips.len(), 4, "the fullest ENI first");
        // The next pass, on the ENI view without those addresses: the other ENI, no new delay.
        let mut w2 = w.clone();
        for e in &mut w2.enis {
            e.secondary_ips.retain(|ip| !first.ips.contains(ip));
        }
        let usable: Vec<&NetworkInterface> = w2.enis.iter().collect();
        let second = mem.classic_pass(&node, &usable, 2, &cfg, t1).unwrap();
        assert_ne!(second.eni_id, first.eni_id);
        assert_eq!(second.ips.len(), 2);
    }

    #[test]
    fn handshake_four_states_for_single_addresses() {
        let w = {
            let mut w = World::new();
            w.enis.push(eni_with_ips("eni-1", 1, "subnet-a", 2));
            w
        };
        let usable: Vec<&NetworkInterface> = w.enis.iter().collect();
        let mut node = node();
        let mut mem = NodeMemory::new();
        let t0 = Instant::now();
        let cfg = config();
        let target = w.enis[1].secondary_ips[0];
        let other = w.enis[1].secondary_ips[1];
        // Before the delay: a candidate, no proposal.
        assert!(mem.classic_pass(&node, &usable, 2, &cfg, t0).is_none());
        assert_eq!(mem.proposed().count(), 0);
        // After the delay: proposed.
        let t1 = t0 + Duration::from_secs(180);
        assert!(mem.classic_pass(&node, &usable, 2, &cfg, t1).is_none());
        assert_eq!(mem.proposed().collect::<Vec<_>>(), [target, other]);
        // The agent acknowledges one and refuses the other.
        answer(&mut node, target, ReleaseState::ReadyForRelease);
        answer(&mut node, other, ReleaseState::DoNotRelease);
        let r = mem.classic_pass(&node, &usable, 2, &cfg, t1).unwrap();
        assert_eq!(r.eni_id, "eni-1");
        assert_eq!(r.ips, [target]);
        assert!(!mem.proposed().any(|p| p == other), "refusal withdraws");
        mem.record_released(&r, t1);
        assert_eq!(mem.released_unpublished().collect::<Vec<_>>(), [target]);
    }

    #[test]
    fn used_address_never_released_even_if_acknowledged() {
        let mut w = World::new();
        w.enis.push(eni_with_ips("eni-1", 1, "subnet-a", 1));
        let usable: Vec<&NetworkInterface> = w.enis.iter().collect();
        let a = w.enis[1].secondary_ips[0];
        let mut node = node();
        let mut mem = NodeMemory::new();
        let t0 = Instant::now();
        let t1 = t0 + Duration::from_secs(200);
        mem.classic_pass(&node, &usable, 1, &config(), t0);
        mem.classic_pass(&node, &usable, 1, &config(), t1);
        answer(&mut node, a, ReleaseState::ReadyForRelease);
        set_used(&mut node, &[&a.to_string()]);
        assert!(mem.classic_pass(&node, &usable, 1, &config(), t1).is_none());
    }

    #[test]
    fn prefix_needs_all_sixteen_acknowledgements() {
        let mut w = World::new();
        let mut e = eni("eni-1", 1, "subnet-a");
        e.prefixes = vec![net("10.1.0.0/28")];
        w.enis.push(e);
        let usable: Vec<&NetworkInterface> = w.enis.iter().collect();
        let mut node = node();
        let mut mem = NodeMemory::new();
        let t0 = Instant::now();
        let t1 = t0 + Duration::from_secs(180);
        mem.classic_pass(&node, &usable, 16, &config(), t0);
        mem.classic_pass(&node, &usable, 16, &config(), t1);
        assert_eq!(mem.proposed().count(), 16);
        let addrs: Vec<Ipv4Addr> = prefix_addresses(net("10.1.0.0/28")).collect();
        for a in &addrs[..15] {
            answer(&mut node, *a, ReleaseState::ReadyForRelease);
        }
        assert!(
            mem.classic_pass(&node, &usable, 16, &config(), t1)
                .is_none(),
            "15 of 16 acknowledged: not yet"
        );
        answer(&mut node, addrs[15], ReleaseState::DoNotRelease);
        assert!(
            mem.classic_pass(&node, &usable, 16, &config(), t1)
                .is_none()
        );
        assert_eq!(mem.proposed().count(), 0, "one refusal withdraws the /28");
        // The write-back removed the withdrawn entries; a fresh round, all 16 acknowledged.
        node.status.as_mut().unwrap().ipam.release_ips.clear();
        let t2 = t1 + Duration::from_secs(1);
        mem.classic_pass(&node, &usable, 16, &config(), t2);
        let t3 = t2 + Duration::from_secs(180);
        assert!(
            mem.classic_pass(&node, &usable, 16, &config(), t3)
                .is_none()
        );
        assert_eq!(mem.proposed().count(), 16);
        for a in &addrs {
            answer(&mut node, *a, ReleaseState::ReadyForRelease);
        }
        let r = mem.classic_pass(&node, &usable, 16, &config(), t3).unwrap();
        assert_eq!(r.prefixes, [net("10.1.0.0/28")]);
        assert!(r.ips.is_empty());
    }

    #[test]
    fn no_excess_or_disabled_resets_proposals() {
        let mut w = World::new();
        w.enis.push(eni_with_ips("eni-1", 1, "subnet-a", 2));
        let usable: Vec<&NetworkInterface> = w.enis.iter().collect();
        let node = node();
        let mut mem = NodeMemory::new();
        let t0 = Instant::now();
        let t1 = t0 + Duration::from_secs(180);
        mem.classic_pass(&node, &usable, 2, &config(), t0);
        mem.classic_pass(&node, &usable, 2, &config(), t1);
        assert_eq!(mem.proposed().count(), 2);
        mem.classic_pass(&node, &usable, 0, &config(), t1);
        assert_eq!(mem.proposed().count(), 0);
        mem.classic_pass(&node, &usable, 2, &config(), t1);
        mem.classic_pass(&node, &usable, 2, &IpamConfig::default(), t1);
        assert_eq!(mem.proposed().count(), 0);
    }

    #[test]
    fn turning_multi_pool_withdraws_proposals() {
        let mut w = World::new();
        w.enis.push(eni_with_ips("eni-1", 1, "subnet-a", 2));
        let usable: Vec<&NetworkInterface> = w.enis.iter().collect();
        let mut mem = NodeMemory::new();
        mem.observe_generation(Generation::Classic);
        let t0 = Instant::now();
        mem.classic_pass(&node(), &usable, 2, &config(), t0);
        mem.classic_pass(
            &node(),
            &usable,
            2,
            &config(),
            t0 + Duration::from_secs(180),
        );
        assert_eq!(mem.proposed().count(), 2);
        mem.observe_generation(Generation::MultiPool);
        assert_eq!(mem.proposed().count(), 0);
    }

    #[test]
    fn multi_pool_tracking_marks_and_unmarks() {
        let mut mem = NodeMemory::new();
        let a = net("10.1.0.0/28");
        let b = net("10.1.0.16/28");
        let c = net("10.0.100.1/32");
        let attached: BTreeMap<Ipv4Net, String> =
            [a, b, c].into_iter().map(|n| (n, "eni-1".into())).collect();
        let t0 = Instant::now();
        // First observation: c is attached but not held: marked now.
        mem.track_multi_pool(&BTreeSet::from([a, b]), &attached, t0);
        assert_eq!(mem.marked_cidrs().collect::<Vec<_>>(), [(c, t0)]);
        // b dropped later: marked at t1; c keeps t0.
        let t1 = t0 + Duration::from_secs(10);
        mem.track_multi_pool(&BTreeSet::from([a]), &attached, t1);
        let marks: BTreeMap<_, _> = mem.marked_cidrs().collect();
        assert_eq!(marks.get(&b), Some(&t1));
        assert_eq!(marks.get(&c), Some(&t0));
        // Agent takes b back; c detached in EC2.
        let attached2: BTreeMap<Ipv4Net, String> =
            [a, b].into_iter().map(|n| (n, "eni-1".into())).collect();
        mem.track_multi_pool(&BTreeSet::from([a, b]), &attached2, t1);
        assert_eq!(mem.marked_cidrs().count(), 0);
    }

    #[test]
    fn attached_cidrs_follow_c3() {
        let mut e = eni_with_ips("eni-1", 1, "s", 2);
        e.prefixes = vec![net("10.1.0.0/28")];
        e.secondary_ips.push(ip("10.1.0.5")); // inside the /28: not a separate /32
        let cidrs = attached_cidrs(&[&e], false);
        assert_eq!(cidrs.len(), 3);
        assert!(cidrs.contains_key(&net("10.1.0.0/28")));
        assert!(!cidrs.contains_key(&net("10.1.0.5/32")));
        assert!(!cidrs.contains_key(&Ipv4Net::from(e.primary_ip)));
        assert!(attached_cidrs(&[&e], true).contains_key(&Ipv4Net::from(e.primary_ip)));
    }

    #[test]
    fn a_release_is_readopted_when_the_agent_lists_any_of_its_addresses_again() {
        let net = |s: &str| s.parse::<Ipv4Net>().unwrap();
        let release = Release {
            eni_id: "eni-1".into(),
            ips: vec!["10.0.1.5".parse().unwrap()],
            prefixes: vec![net("10.0.2.16/28")],
        };
        assert!(!readopted(&release, &BTreeSet::new()));
        assert!(!readopted(
            &release,
            &BTreeSet::from([net("10.0.1.6/32"), net("10.0.2.32/28")])
        ));
        assert!(readopted(&release, &BTreeSet::from([net("10.0.1.5/32")])));
        assert!(readopted(&release, &BTreeSet::from([net("10.0.2.16/28")])));
        assert!(
            readopted(&release, &BTreeSet::from([net("10.0.2.20/32")])),
            "inside the /28"
        );
        assert!(
            readopted(&release, &BTreeSet::from([net("10.0.1.0/28")])),
            "covers the /32"
        );
    }

    /// Issue 29: the re-read refuses a copy that is classic now or uses an address of it.
    #[test]
    fn a_fresh_copy_that_is_classic_or_uses_the_addresses_refuses_the_unassign() {
        use crate::crd::{IpamPoolDemand, IpamPoolRequest};
        let release = Release {
            eni_id: "eni-1".into(),
            ips: vec![ip("10.0.1.5")],
            prefixes: vec![net("10.0.2.16/28")],
        };
        let mut multi = node();
        multi.spec.ipam.pools.requested = vec![IpamPoolRequest {
            pool: DEFAULT_POOL.into(),
            needed: IpamPoolDemand {
                ipv4_addrs: 8,
                ..Default::default()
            },
            ..Default::default()
        }];
        assert_eq!(fresh_copy_refuses(&release, &multi), None);
        assert!(fresh_copy_refuses(&release, &node()).is_some(), "classic");
        let mut used = multi.clone();
        set_used(&mut used, &["10.0.2.20"]);
        assert!(fresh_copy_refuses(&release, &used).is_some(), "in use");
    }

    #[test]
    fn multi_pool_release_after_delay_capped_by_excess() {
        let mut e = eni_with_ips("eni-1", 1, "s", 2);
        e.prefixes = vec![net("10.1.0.0/28"), net("10.1.0.16/28")];
        let usable = [&e];
        let attached = attached_cidrs(&usable, false);
        let mut node = node();
        node.spec.ipam.pools.allocated = vec![IpamPoolAllocation {
            pool: DEFAULT_POOL.into(),
            cidrs: vec!["10.1.0.0/28".into()],
            ..Default::default()
        }];
        let allocated = allocated_cidrs(&node);
        let mut mem = NodeMemory::new();
        mem.observe_generation(Generation::MultiPool);
        let t0 = Instant::now();
        mem.track_multi_pool(&allocated, &attached, t0);
        let cfg = config();
        assert!(
            mem.multi_pool_release(&usable, &allocated, 100, &cfg, t0)
                .is_none(),
            "not before the delay"
        );
        let t1 = t0 + Duration::from_secs(180);
        let r = mem
            .multi_pool_release(&usable, &allocated, 17, &cfg, t1)
            .unwrap();
        assert_eq!(r.prefixes, [net("10.1.0.16/28")], "allocated /28 kept");
        assert_eq!(r.ips.len(), 1, "excess 17 = one /28 + one /32");
        let r = mem
            .multi_pool_release(&usable, &allocated, 15, &cfg, t1)
            .unwrap();
        assert!(r.prefixes.is_empty(), "a /28 needs 16 in excess");
        assert_eq!(r.ips.len(), 2);
        assert!(
            mem.multi_pool_release(&usable, &allocated, 0, &cfg, t1)
                .is_none()
        );
        mem.record_released(&r, t1);
        assert_eq!(mem.marked_cidrs().count(), 1);
    }
}
