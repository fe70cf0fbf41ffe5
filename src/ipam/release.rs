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

use crate::crd::{CiliumNode, ReleaseState};
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

mod candidates;
pub use candidates::{
    Candidates, allocated_cidrs, attached_cidrs, classic_candidates, fresh_copy_refuses, readopted,
    release_answers,
};

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
mod tests;
