//! Cilium agent simulator: what a node's agent writes into its own CiliumNode.
//!
//! The decision logic ([`ClassicAgent::step`], [`MultiPoolAgent::step`]) is pure: it takes the
//! CiliumNode as read and the node's demand, and returns the merge patches the agent would send.
//! The kube layer that polls the object and sends those patches is e2e's (`e2e/src/kube_agent.rs`);
//! the classic agent's release answers ([`release`]) are the one model the benchmark, the
//! simulation and the runtime tests share.
//!
//! Both generations also watch the operator: an address the agent holds that leaves the pool (or
//! a held CIDR that is no longer attached) means the operator released something in use, and a
//! pool entry missing from its ENI's `addresses` breaks rule C2. Both are recorded as violations.

use eni_operator::crd::{AllocationIp, CiliumNode, DEFAULT_POOL, EniEntry, ReleaseState};
use serde_json::{Map, Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::Ipv4Addr;

pub mod pods;
pub mod release;

pub use pods::step_pods;
pub use release::{answer_release_proposals, classic_agent_answers, release_answers};

/// Addresses every agent holds besides its pods: the router and the health endpoint.
pub const INTERNAL_ENDPOINTS: usize = 2;
/// The multi-pool agent's constant pre-allocation (it does not read `spec.ipam.pre-allocate`).
pub const MULTI_POOL_PRE_ALLOCATE: usize = 8;

/// Endpoints (addresses in use) for a number of pods.
pub const fn endpoints(pods: usize) -> usize {
    pods + INTERNAL_ENDPOINTS
}

/// Which agent generation to play.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Generation {
    Classic,
    MultiPool,
}

impl Generation {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "classic" => Some(Self::Classic),
            "multi-pool" | "multipool" => Some(Self::MultiPool),
            _ => None,
        }
    }
}

impl fmt::Display for Generation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Classic => "classic",
            Self::MultiPool => "multi-pool",
        })
    }
}

/// Owner names of the endpoints, in allocation order: freeing drops from the end.
fn owner(index: usize) -> String {
    match index {
        0 => "router".to_string(),
        1 => "health".to_string(),
        n => format!("e2e/pod-{}", n - INTERNAL_ENDPOINTS),
    }
}

fn owner_rank(owner: &str) -> usize {
    match owner {
        "router" => 0,
        "health" => 1,
        other => other
            .strip_prefix("e2e/pod-")
            .and_then(|n| n.parse::<usize>().ok())
            .map_or(usize::MAX, |n| n + INTERNAL_ENDPOINTS),
    }
}

fn parse_ip(s: &str) -> Option<Ipv4Addr> {
    s.parse().ok()
}

/// An IPv4 CIDR as multi-pool agents hold them (/28 prefixes and /32 addresses).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Cidr {
    pub addr: Ipv4Addr,
    pub len: u8,
}

impl Cidr {
    pub fn parse(s: &str) -> Option<Self> {
        let (a, l) = s.split_once('/')?;
        let len: u8 = l.parse().ok()?;
        if len > 32 {
            return None;
        }
        let addr: Ipv4Addr = a.parse().ok()?;
        let cidr = Self { addr, len };
        // A CIDR with host bits set is not something either side writes.
        (u32::from(addr) & !cidr.mask() == 0).then_some(cidr)
    }

    fn mask(self) -> u32 {
        if self.len == 0 {
            0
        } else {
            u32::MAX << (32 - u32::from(self.len))
        }
    }

    pub fn host(addr: Ipv4Addr) -> Self {
        Self { addr, len: 32 }
    }

    pub fn size(self) -> usize {
        1usize << (32 - u32::from(self.len))
    }

    pub fn contains(self, ip: Ipv4Addr) -> bool {
        u32::from(ip) & self.mask() == u32::from(self.addr)
    }

    /// Every address, first and last included (multi-pool agents use all 16 of a /28).
    pub fn addresses(self) -> impl Iterator<Item = Ipv4Addr> {
        let base = u32::from(self.addr);
        (0..self.size() as u32).map(move |i| Ipv4Addr::from(base + i))
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

/// ENIs the agent may use: device index at or above `first-interface-index`, and not matching
/// every pair of `exclude-interface-tags`.
fn usable_enis(cn: &CiliumNode) -> impl Iterator<Item = &EniEntry> {
    let first = cn.spec.eni.first_interface_index.unwrap_or(0);
    let exclude = &cn.spec.eni.exclude_interface_tags;
    cn.status
        .as_ref()
        .into_iter()
        .flat_map(|s| s.eni.enis.values())
        .filter(move |e| e.number >= first)
        .filter(move |e| {
            exclude.is_empty() || !exclude.iter().all(|(k, v)| e.tags.get(k) == Some(v))
        })
}

pub use eni_operator::ipam::writeback::c2_violations;

/// What one step of an agent produced.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Step {
    /// Merge patch for the main resource (multi-pool: `spec.ipam.pools`), if anything changed.
    pub spec_patch: Option<Value>,
    /// Merge patch for `/status` (classic: `used` and handshake answers; multi-pool: zeroing a
    /// `used` left by a classic agent), if anything changed.
    pub status_patch: Option<Value>,
    /// Endpoints that found no address.
    pub unsatisfied: usize,
    /// Operator misbehaviour observed in this step (see module docs).
    pub violations: Vec<String>,
    /// True when the update was ignored because of a C2 violation (the operator's C1 window).
    pub ignored: bool,
}

impl Step {
    /// validateENIConfig fails on a C2 break: the agent ignores the whole update (true), and
    /// the break is a violation.
    fn ignores_a_c2_break(&mut self, cn: &CiliumNode) -> bool {
        let c2 = c2_violations(cn);
        if c2.is_empty() {
            return false;
        }
        self.violations.push(format!(
            "C2: pool addresses missing from their ENI: {}",
            c2.join(", ")
        ));
        self.ignored = true;
        true
    }
}

fn with_resource_version(cn: &CiliumNode, mut patch: Value) -> Value {
    // Optimistic concurrency like the real agents' updates: release-ips is shared with the
    // operator, and `requested` must not be computed from a stale view.
    if let Some(rv) = &cn.metadata.resource_version {
        patch["metadata"] = json!({ "resourceVersion": rv });
    }
    patch
}

/// Addresses an agent must not hand out: proposed, acknowledged or released.
fn withheld(state: Option<&String>) -> bool {
    state
        .and_then(|s| ReleaseState::parse(s))
        .is_some_and(|s| s != ReleaseState::DoNotRelease)
}

/// The classic (CRD allocator) agent of one node. Its `used` map is its own state; it is seeded
/// from the object on first sight, so a restarted simulator adopts what it had handed out.
#[derive(Clone, Debug, Default)]
pub struct ClassicAgent {
    used: Option<BTreeMap<String, AllocationIp>>,
}

impl ClassicAgent {
    pub fn new() -> Self {
        Self::default()
    }

    /// Addresses currently handed out.
    pub fn used(&self) -> BTreeSet<String> {
        self.used.iter().flat_map(|m| m.keys().cloned()).collect()
    }

    pub fn step(&mut self, cn: &CiliumNode, pods: usize) -> Step {
        let mut step = Step::default();
        let reported: BTreeMap<String, AllocationIp> = cn
            .status
            .as_ref()
            .map(|s| s.ipam.used.clone())
            .unwrap_or_default();
        let used = self.used.get_or_insert_with(|| reported.clone());
        let pool = &cn.spec.ipam.pool;

        // Something we hand out left the pool: the operator released an address in use.
        for ip in used.keys() {
            if !pool.contains_key(ip) {
                step.violations
                    .push(format!("in-use address {ip} left spec.ipam.pool"));
            }
        }
        if step.ignores_a_c2_break(cn) {
            return step;
        }

        let release_ips = cn
            .status
            .as_ref()
            .map(|s| s.ipam.release_ips.clone())
            .unwrap_or_default();
        let answers: Map<String, Value> = release::release_answers(cn, |ip| used.contains_key(ip))
            .into_iter()
            .map(|(ip, a)| (ip, a.map_or(Value::Null, |s| json!(s.as_str()))))
            .collect();

        let target = endpoints(pods);
        // Free the most recently started pods first; router and health stay.
        if used.len() > target {
            let mut by_rank: Vec<(usize, String)> = used
                .iter()
                .map(|(ip, a)| (owner_rank(&a.owner), ip.clone()))
                .collect();
            by_rank.sort();
            for (_, ip) in by_rank.into_iter().skip(target) {
                used.remove(&ip);
            }
        }
        if used.len() < target {
            let taken: BTreeSet<usize> = used.values().map(|a| owner_rank(&a.owner)).collect();
            let mut missing = (0..).filter(|i| !taken.contains(i));
            let usable: BTreeSet<&str> = usable_enis(cn).map(|e| e.id.as_str()).collect();
            let mut free: Vec<(Ipv4Addr, &String, &AllocationIp)> = pool
                .iter()
                .filter(|(ip, a)| {
                    !used.contains_key(*ip)
                        && !withheld(release_ips.get(*ip))
                        && usable.contains(a.resource.as_str())
                })
                .filter_map(|(ip, a)| parse_ip(ip).map(|p| (p, ip, a)))
                .collect();
            free.sort_by_key(|f| f.0);
            let mut free = free.into_iter();
            while used.len() < target {
                let Some((_, ip, a)) = free.next() else { break };
                let idx = missing.next().expect("unbounded range");
                used.insert(
                    ip.clone(),
                    AllocationIp {
                        owner: owner(idx),
                        resource: a.resource.clone(),
                        ..Default::default()
                    },
                );
            }
        }
        step.unsatisfied = target.saturating_sub(used.len());

        let mut used_patch = Map::new();
        for ip in reported.keys() {
            if !used.contains_key(ip) {
                used_patch.insert(ip.clone(), Value::Null);
            }
        }
        for (ip, a) in used.iter() {
            if reported.get(ip) != Some(a) {
                used_patch.insert(ip.clone(), serde_json::to_value(a).expect("serialisable"));
            }
        }
        let mut ipam = Map::new();
        if !used_patch.is_empty() {
            ipam.insert("used".into(), Value::Object(used_patch));
        }
        if !answers.is_empty() {
            ipam.insert("release-ips".into(), Value::Object(answers));
        }
        if !ipam.is_empty() {
            step.status_patch = Some(with_resource_version(
                cn,
                json!({ "status": { "ipam": ipam } }),
            ));
        }
        step
    }
}

/// CIDRs a multi-pool agent derives from `status.eni.enis` (rule C3): each /28 prefix, and each
/// address not covered by a prefix of the same ENI as a /32.
pub fn derive_cidrs(cn: &CiliumNode) -> BTreeSet<Cidr> {
    let mut out = BTreeSet::new();
    for eni in usable_enis(cn) {
        let prefixes: Vec<Cidr> = eni.prefixes.iter().filter_map(|p| Cidr::parse(p)).collect();
        out.extend(prefixes.iter().copied());
        for a in eni.addresses.iter().filter_map(|a| parse_ip(a)) {
            if !prefixes.iter().any(|p| p.contains(a)) {
                out.insert(Cidr::host(a));
            }
        }
    }
    out
}

/// The multi-pool agent of one node.
#[derive(Clone, Debug, Default)]
pub struct MultiPoolAgent {
    /// Attached CIDRs the agent gave back (dropped from `allocated`) and may re-adopt.
    dropped: Option<BTreeSet<Cidr>>,
    /// The CIDRs it allocates from (Cilium's per-CIDR allocators), as of its last step: what it
    /// lists in `allocated` with its next write, which may come later (its update rate).
    held: BTreeSet<Cidr>,
    /// Address -> endpoint index.
    in_use: BTreeMap<Ipv4Addr, usize>,
}

impl MultiPoolAgent {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn used(&self) -> BTreeSet<String> {
        self.in_use.keys().map(ToString::to_string).collect()
    }

    /// Address -> endpoint index (0 router, 1 health, then pods).
    pub fn in_use(&self) -> &BTreeMap<Ipv4Addr, usize> {
        &self.in_use
    }

    /// A restarted agent: its endpoints kept running on their addresses (Cilium restores them
    /// from its endpoint state at start), everything else is rebuilt from the CiliumNode on the
    /// first step.
    pub fn restored(in_use: BTreeMap<Ipv4Addr, usize>) -> Self {
        Self {
            dropped: None,
            held: BTreeSet::new(),
            in_use,
        }
    }

    pub fn step(&mut self, cn: &CiliumNode, pods: usize) -> Step {
        let mut step = Step::default();
        let attached = derive_cidrs(cn);
        let listed: BTreeSet<Cidr> = cn
            .spec
            .ipam
            .pools
            .allocated
            .iter()
            .filter(|a| a.pool == DEFAULT_POOL)
            .flat_map(|a| a.cidrs.iter().filter_map(|c| Cidr::parse(c)))
            .collect();
        // First sight (or a simulator restart): what is attached but not listed was given back.
        let dropped = self.dropped.get_or_insert_with(|| {
            if listed.is_empty() {
                BTreeSet::new()
            } else {
                &attached - &listed
            }
        });
        dropped.retain(|c| attached.contains(c));

        // A CIDR it holds (listed, or taken since its last write) that the status dropped while
        // in use: kept for its addresses, nothing new taken from it, still listed in
        // `allocated` to regain it (Cilium's podCIDRPool, pkg/ipam/pool.go, "in-use pod CIDR
        // was removed"). The operator withdraws a CIDR from the status before its unassign, and
        // the agent may have taken it just before.
        let removed: BTreeSet<Cidr> = (&listed | &self.held)
            .iter()
            .filter(|c| !attached.contains(c) && self.in_use.keys().any(|ip| c.contains(*ip)))
            .copied()
            .collect();
        // An address in use in no CIDR it has: the operator released it under us.
        let lost: Vec<Ipv4Addr> = self
            .in_use
            .keys()
            .filter(|ip| !attached.iter().chain(&removed).any(|c| c.contains(**ip)))
            .copied()
            .collect();
        for ip in lost {
            step.violations
                .push(format!("in-use address {ip} is no longer attached"));
            self.in_use.remove(&ip);
        }
        if step.ignores_a_c2_break(cn) {
            return step;
        }

        let target = endpoints(pods);
        if self.in_use.len() > target {
            let mut by_idx: Vec<(usize, Ipv4Addr)> =
                self.in_use.iter().map(|(ip, i)| (*i, *ip)).collect();
            by_idx.sort();
            for (_, ip) in by_idx.into_iter().skip(target) {
                self.in_use.remove(&ip);
            }
        }
        let mut held: BTreeSet<Cidr> = &attached - dropped;
        // Allocate from held CIDRs in order; re-adopt dropped ones when they run out (#46674).
        while self.in_use.len() < target {
            let next = held
                .iter()
                .flat_map(|c| c.addresses())
                .find(|ip| !self.in_use.contains_key(ip));
            match next {
                Some(ip) => {
                    let taken: BTreeSet<usize> = self.in_use.values().copied().collect();
                    let idx = (0..).find(|i| !taken.contains(i)).expect("unbounded range");
                    self.in_use.insert(ip, idx);
                }
                None => match dropped.pop_first() {
                    Some(c) => {
                        held.insert(c);
                    }
                    None => break,
                },
            }
        }
        step.unsatisfied = target.saturating_sub(self.in_use.len());
        let in_use = self.in_use.len();
        // Free addresses are counted in the CIDRs it may allocate from (not the removed ones).
        let in_held = |h: &BTreeSet<Cidr>, in_use: &BTreeMap<Ipv4Addr, usize>| {
            in_use
                .keys()
                .filter(|ip| h.iter().any(|c| c.contains(**ip)))
                .count()
        };
        let capacity = |h: &BTreeSet<Cidr>| h.iter().map(|c| c.size()).sum::<usize>();
        // Keep the pre-allocation free: re-adopt when short, drop from the last CIDR backwards
        // while free − free(CIDR) ≥ needed − in-use.
        while capacity(&held) < in_held(&held, &self.in_use) + MULTI_POOL_PRE_ALLOCATE {
            match dropped.pop_first() {
                Some(c) => {
                    held.insert(c);
                }
                None => break,
            }
        }
        let mut free = capacity(&held) - in_held(&held, &self.in_use);
        for c in held.clone().iter().rev() {
            let busy = self.in_use.keys().any(|ip| c.contains(*ip));
            if !busy && free >= c.size() + MULTI_POOL_PRE_ALLOCATE {
                held.remove(c);
                dropped.insert(*c);
                free -= c.size();
            }
        }

        // needed = in use + pending + pre-allocation; pending are endpoints still without address.
        let requested = (in_use + step.unsatisfied + MULTI_POOL_PRE_ALLOCATE) as i64;
        let held: BTreeSet<Cidr> = &held | &removed;
        self.held.clone_from(&held);
        let cidrs: Vec<String> = held.iter().map(ToString::to_string).collect();
        let current_req = cn
            .spec
            .ipam
            .pools
            .requested
            .iter()
            .find(|r| r.pool == DEFAULT_POOL)
            .map(|r| r.needed.ipv4_addrs);
        let current_cidrs: BTreeSet<Cidr> = listed;
        if current_req != Some(requested) || current_cidrs != held {
            let patch = json!({ "spec": { "ipam": { "pools": {
                "requested": [{ "pool": DEFAULT_POOL, "needed": { "ipv4-addrs": requested } }],
                "allocated": [{ "pool": DEFAULT_POOL, "cidrs": cidrs }],
            }}}});
            step.spec_patch = Some(with_resource_version(cn, patch));
        }
        // Zero out a `used` map left by a classic agent (Cilium PR #45154): that is how the
        // operator tells the generations apart.
        if let Some(used) = cn
            .status
            .as_ref()
            .map(|s| &s.ipam.used)
            .filter(|u| !u.is_empty())
        {
            let nulls: Map<String, Value> = used.keys().map(|k| (k.clone(), Value::Null)).collect();
            step.status_patch = Some(json!({ "status": { "ipam": { "used": nulls } } }));
        }
        step
    }
}

/// `ready-for-release` answers in a step's status patch: proof that a release went through the
/// handshake.
pub fn ready_answers(step: &Step) -> u64 {
    let ready = ReleaseState::ReadyForRelease.as_str();
    step.status_patch
        .as_ref()
        .and_then(|p| p.pointer("/status/ipam/release-ips"))
        .and_then(Value::as_object)
        .map_or(0, |m| {
            m.values().filter(|v| v.as_str() == Some(ready)).count() as u64
        })
}

/// One agent of either generation.
#[derive(Clone, Debug)]
pub enum Agent {
    Classic(ClassicAgent),
    MultiPool(MultiPoolAgent),
}

impl Agent {
    pub fn new(generation: Generation) -> Self {
        match generation {
            Generation::Classic => Self::Classic(ClassicAgent::new()),
            Generation::MultiPool => Self::MultiPool(MultiPoolAgent::new()),
        }
    }

    pub fn step(&mut self, cn: &CiliumNode, pods: usize) -> Step {
        match self {
            Self::Classic(a) => a.step(cn, pods),
            Self::MultiPool(a) => a.step(cn, pods),
        }
    }

    pub fn used(&self) -> BTreeSet<String> {
        match self {
            Self::Classic(a) => a.used(),
            Self::MultiPool(a) => a.used(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use eni_operator::crd::{CiliumNodeSpec, CiliumNodeStatus, EniEntry};

    fn eni(id: &str, number: i64, addresses: &[&str], prefixes: &[&str]) -> EniEntry {
        EniEntry {
            id: id.into(),
            number,
            addresses: addresses.iter().map(|s| s.to_string()).collect(),
            prefixes: prefixes.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
    }

    /// A node whose pool is exactly the ENIs' addresses.
    fn node(enis: Vec<EniEntry>) -> CiliumNode {
        let mut cn = CiliumNode::new("n1", CiliumNodeSpec::default());
        cn.metadata.resource_version = Some("7".into());
        let mut status = CiliumNodeStatus::default();
        for e in enis {
            if e.number >= 1 {
                for a in &e.addresses {
                    cn.spec.ipam.pool.insert(
                        a.clone(),
                        AllocationIp {
                            resource: e.id.clone(),
                            ..Default::default()
                        },
                    );
                }
            }
            status.eni.enis.insert(e.id.clone(), e);
        }
        cn.spec.eni.first_interface_index = Some(1);
        cn.status = Some(status);
        cn
    }

    fn ips(prefix: &str, range: std::ops::Range<u8>) -> Vec<String> {
        range.map(|i| format!("{prefix}.{i}")).collect()
    }

    fn refs(v: &[String]) -> Vec<&str> {
        v.iter().map(String::as_str).collect()
    }

    /// Applies a merge patch to the JSON form, the way the API server would.
    fn apply(cn: &CiliumNode, patch: &Value) -> CiliumNode {
        fn merge(target: &mut Value, patch: &Value) {
            if let Value::Object(p) = patch {
                if !target.is_object() {
                    *target = json!({});
                }
                let t = target.as_object_mut().unwrap();
                for (k, v) in p {
                    if v.is_null() {
                        t.remove(k);
                    } else {
                        merge(t.entry(k.clone()).or_insert(Value::Null), v);
                    }
                }
            } else {
                *target = patch.clone();
            }
        }
        let mut v = serde_json::to_value(cn).unwrap();
        let mut p = patch.clone();
        p.as_object_mut().unwrap().remove("metadata");
        merge(&mut v, &p);
        serde_json::from_value(v).unwrap()
    }

    fn release_state(cn: &CiliumNode, ip: &str) -> Option<String> {
        cn.status
            .as_ref()
            .unwrap()
            .ipam
            .release_ips
            .get(ip)
            .cloned()
    }

    #[test]
    fn classic_allocates_router_health_and_pods_from_the_pool() {
        let addrs = ips("10.0.1", 10..20);
        let cn = node(vec![
            eni("eni-0", 0, &["10.0.0.5"], &[]),
            eni("eni-1", 1, &refs(&addrs), &[]),
        ]);
        let mut agent = ClassicAgent::new();
        let step = agent.step(&cn, 3);
        assert_eq!(step.unsatisfied, 0);
        assert!(step.violations.is_empty());
        let patch = step.status_patch.expect("used is written");
        assert_eq!(patch["metadata"]["resourceVersion"], "7");
        let used = patch["status"]["ipam"]["used"].as_object().unwrap();
        assert_eq!(used.len(), 5);
        assert_eq!(used["10.0.1.10"]["owner"], "router");
        assert_eq!(used["10.0.1.11"]["owner"], "health");
        assert_eq!(used["10.0.1.12"]["resource"], "eni-1");
        assert_eq!(used["10.0.1.14"]["owner"], "e2e/pod-2");
        assert!(
            step.spec_patch.is_none(),
            "classic agents write only status"
        );
        // Nothing changed: nothing written.
        let cn2 = apply(&cn, &patch);
        assert_eq!(agent.step(&cn2, 3), Step::default());
    }

    #[test]
    fn classic_counts_unsatisfied_and_orders_addresses_numerically() {
        let cn = node(vec![eni("eni-1", 1, &["10.0.1.100", "10.0.1.9"], &[])]);
        let mut agent = ClassicAgent::new();
        let step = agent.step(&cn, 4);
        assert_eq!(step.unsatisfied, 4);
        let used = &step.status_patch.unwrap()["status"]["ipam"]["used"];
        assert_eq!(used["10.0.1.9"]["owner"], "router");
        assert_eq!(used["10.0.1.100"]["owner"], "health");
    }

    #[test]
    fn classic_skips_excluded_enis_and_addresses_in_release() {
        let mut cn = node(vec![eni(
            "eni-1",
            1,
            &["10.0.1.1", "10.0.1.2", "10.0.1.3"],
            &[],
        )]);
        let mut ex = eni("eni-2", 2, &["10.0.2.1"], &[]);
        ex.tags.insert("skip".into(), "yes".into());
        cn.spec.ipam.pool.insert(
            "10.0.2.1".into(),
            AllocationIp {
                resource: "eni-2".into(),
                ..Default::default()
            },
        );
        cn.status
            .as_mut()
            .unwrap()
            .eni
            .enis
            .insert("eni-2".into(), ex);
        cn.spec
            .eni
            .exclude_interface_tags
            .insert("skip".into(), "yes".into());
        cn.status
            .as_mut()
            .unwrap()
            .ipam
            .release_ips
            .insert("10.0.1.1".into(), "marked-for-release".into());
        let mut agent = ClassicAgent::new();
        let step = agent.step(&cn, 1);
        assert_eq!(step.unsatisfied, 1);
        let used: BTreeSet<String> = agent.used();
        assert_eq!(
            used,
            BTreeSet::from(["10.0.1.2".to_string(), "10.0.1.3".to_string()])
        );
    }

    #[test]
    fn classic_handshake_answers_ready_or_do_not_release() {
        let mut cn = eni1_node(16);
        let mut agent = ClassicAgent::new();
        let cn1 = apply(&cn, &agent.step(&cn, 1).status_patch.unwrap());
        // 10.0.1.10..12 are in use; the operator proposes two used and one free address, plus
        // one that already left the pool.
        cn = cn1;
        let rel = &mut cn.status.as_mut().unwrap().ipam.release_ips;
        for ip in ["10.0.1.10", "10.0.1.11", "10.0.1.15", "10.0.9.9"] {
            rel.insert(ip.into(), "marked-for-release".into());
        }
        let step = agent.step(&cn, 1);
        let answers = &step.status_patch.as_ref().unwrap()["status"]["ipam"]["release-ips"];
        assert_eq!(answers["10.0.1.10"], "do-not-release");
        assert_eq!(answers["10.0.1.11"], "do-not-release");
        assert_eq!(answers["10.0.1.15"], "ready-for-release");
        assert_eq!(answers["10.0.9.9"], "do-not-release");
        assert_eq!(answers.as_object().unwrap().len(), 4);
        assert_eq!(ready_answers(&step), 1);
        let cn = apply(&cn, step.status_patch.as_ref().unwrap());
        // Answered entries are not answered again.
        assert!(agent.step(&cn, 1).status_patch.is_none());
        // A marked address is never handed out, even when demand grows.
        let mut cn = cn;
        cn.status
            .as_mut()
            .unwrap()
            .ipam
            .release_ips
            .remove("10.0.9.9");
        cn.status
            .as_mut()
            .unwrap()
            .ipam
            .release_ips
            .remove("10.0.1.10");
        cn.status
            .as_mut()
            .unwrap()
            .ipam
            .release_ips
            .remove("10.0.1.11");
        let step = agent.step(&cn, 10);
        assert!(!agent.used().contains("10.0.1.15"));
        assert_eq!(step.unsatisfied, 12 - 5);
    }

    /// A node whose eni-1 (device index 1) holds 10.0.1.10 up to `end` (excluded).
    fn eni1_node(end: u8) -> CiliumNode {
        let addrs = ips("10.0.1", 10..end);
        node(vec![eni("eni-1", 1, &refs(&addrs), &[])])
    }

    /// The address leaves the pool and eni-1's addresses (EC2 took it back).
    fn leave_pool_and_eni(cn: &mut CiliumNode, addr: &str) {
        cn.spec.ipam.pool.remove(addr);
        cn.status
            .as_mut()
            .unwrap()
            .eni
            .enis
            .get_mut("eni-1")
            .unwrap()
            .addresses
            .retain(|a| a != addr);
    }

    #[test]
    fn classic_deletes_released_entries_once_the_address_left_the_pool() {
        let mut cn = eni1_node(14);
        let mut agent = ClassicAgent::new();
        cn = apply(&cn, &agent.step(&cn, 0).status_patch.unwrap());
        cn.status
            .as_mut()
            .unwrap()
            .ipam
            .release_ips
            .insert("10.0.1.13".into(), "released".into());
        // Still in the pool: keep the entry.
        assert!(agent.step(&cn, 0).status_patch.is_none());
        leave_pool_and_eni(&mut cn, "10.0.1.13");
        let step = agent.step(&cn, 0);
        let patch = step.status_patch.unwrap();
        assert_eq!(
            patch["status"]["ipam"]["release-ips"]["10.0.1.13"],
            Value::Null
        );
        let cn = apply(&cn, &patch);
        assert_eq!(release_state(&cn, "10.0.1.13"), None);
        assert!(step.violations.is_empty());
    }

    #[test]
    fn classic_frees_pods_on_demand_drop_with_null_entries() {
        let mut cn = eni1_node(20);
        let mut agent = ClassicAgent::new();
        cn = apply(&cn, &agent.step(&cn, 5).status_patch.unwrap());
        assert_eq!(cn.status.as_ref().unwrap().ipam.used.len(), 7);
        let patch = agent.step(&cn, 1).status_patch.unwrap();
        let used = patch["status"]["ipam"]["used"].as_object().unwrap();
        assert_eq!(used.len(), 4);
        assert!(used.values().all(Value::is_null));
        let cn = apply(&cn, &patch);
        let owners: BTreeSet<String> = cn
            .status
            .as_ref()
            .unwrap()
            .ipam
            .used
            .values()
            .map(|a| a.owner.clone())
            .collect();
        assert_eq!(
            owners,
            BTreeSet::from(["router".into(), "health".into(), "e2e/pod-0".into()])
        );
    }

    #[test]
    fn classic_adopts_used_after_restart_and_flags_released_in_use_address() {
        let mut cn = eni1_node(14);
        cn = apply(&cn, &ClassicAgent::new().step(&cn, 1).status_patch.unwrap());
        let mut restarted = ClassicAgent::new();
        assert!(
            restarted.step(&cn, 1).status_patch.is_none(),
            "adopts the reported used map"
        );
        leave_pool_and_eni(&mut cn, "10.0.1.12");
        let step = restarted.step(&cn, 1);
        assert_eq!(step.violations.len(), 1, "{:?}", step.violations);
        assert!(step.violations[0].contains("10.0.1.12"));
    }

    #[test]
    fn classic_ignores_an_update_that_breaks_c2() {
        let mut cn = node(vec![eni("eni-1", 1, &["10.0.1.1"], &[])]);
        cn.spec.ipam.pool.insert(
            "10.0.1.2".into(),
            AllocationIp {
                resource: "eni-1".into(),
                ..Default::default()
            },
        );
        assert_eq!(c2_violations(&cn).len(), 1);
        let step = ClassicAgent::new().step(&cn, 0);
        assert!(step.ignored);
        assert!(step.status_patch.is_none());
        assert!(
            step.violations[0].contains("10.0.1.2"),
            "{:?}",
            step.violations
        );
    }

    #[test]
    fn cidrs_are_derived_as_prefixes_and_uncovered_addresses() {
        let mut addrs = ips("10.0.1", 16..32);
        addrs.push("10.0.1.40".into());
        let cn = node(vec![
            eni("eni-0", 0, &["10.0.0.9"], &[]),
            eni("eni-1", 1, &refs(&addrs), &["10.0.1.16/28"]),
        ]);
        let cidrs: Vec<String> = derive_cidrs(&cn).iter().map(ToString::to_string).collect();
        assert_eq!(cidrs, vec!["10.0.1.16/28", "10.0.1.40/32"]);
        assert_eq!(Cidr::parse("10.0.1.16/28").unwrap().size(), 16);
        assert!(Cidr::parse("10.0.1.17/28").is_none());
        assert!(Cidr::parse("10.0.1.16/33").is_none());
    }

    #[test]
    fn multi_pool_requests_in_use_plus_eight_and_holds_what_it_needs() {
        let addrs = ips("10.0.1", 10..40);
        let cn = node(vec![eni("eni-1", 1, &refs(&addrs), &[])]);
        let mut agent = MultiPoolAgent::new();
        let step = agent.step(&cn, 4);
        assert_eq!(step.unsatisfied, 0);
        assert!(step.status_patch.is_none(), "used stays empty");
        let patch = step.spec_patch.unwrap();
        let pools = &patch["spec"]["ipam"]["pools"];
        assert_eq!(pools["requested"][0]["pool"], "default");
        assert_eq!(pools["requested"][0]["needed"]["ipv4-addrs"], 6 + 8);
        // 6 in use + 8 free held; the other 16 /32s are dropped.
        assert_eq!(pools["allocated"][0]["cidrs"].as_array().unwrap().len(), 14);
        let cn = apply(&cn, &patch);
        assert!(agent.step(&cn, 4).spec_patch.is_none(), "stable");
    }

    #[test]
    fn multi_pool_requests_pending_endpoints_before_any_eni() {
        let cn = node(vec![eni("eni-0", 0, &["10.0.0.5"], &[])]);
        let step = MultiPoolAgent::new().step(&cn, 3);
        assert_eq!(step.unsatisfied, 5);
        let pools = &step.spec_patch.unwrap()["spec"]["ipam"]["pools"];
        assert_eq!(pools["requested"][0]["needed"]["ipv4-addrs"], 5 + 8);
        assert_eq!(pools["allocated"][0]["cidrs"], json!([]));
    }

    #[test]
    fn withheld_states() {
        assert!(withheld(Some(&"marked-for-release".to_string())));
        assert!(withheld(Some(&"ready-for-release".to_string())));
        assert!(withheld(Some(&"released".to_string())));
        assert!(!withheld(Some(&"do-not-release".to_string())));
        assert!(!withheld(None));
    }

    #[test]
    fn multi_pool_drops_on_demand_drop_and_readopts_on_growth() {
        let addrs = ips("10.0.1", 10..40);
        let mut cn = node(vec![eni("eni-1", 1, &refs(&addrs), &[])]);
        let mut agent = MultiPoolAgent::new();
        cn = apply(&cn, &agent.step(&cn, 20).spec_patch.unwrap());
        let held = |cn: &CiliumNode| cn.spec.ipam.pools.allocated[0].cidrs.len();
        assert_eq!(
            held(&cn),
            30,
            "22 in use + 8 wanted > 30 attached: keeps all"
        );
        assert_eq!(cn.spec.ipam.pools.requested[0].needed.ipv4_addrs, 30);
        cn = apply(&cn, &agent.step(&cn, 2).spec_patch.unwrap());
        assert_eq!(held(&cn), 12);
        assert_eq!(cn.spec.ipam.pools.requested[0].needed.ipv4_addrs, 12);
        // No dropped CIDR holds an address in use.
        let kept: BTreeSet<String> = cn.spec.ipam.pools.allocated[0]
            .cidrs
            .iter()
            .cloned()
            .collect();
        for ip in agent.used() {
            assert!(kept.contains(&format!("{ip}/32")));
        }
        // Demand grows again: the dropped but still attached CIDRs are taken back.
        let step = agent.step(&cn, 15);
        assert_eq!(step.unsatisfied, 0);
        cn = apply(&cn, &step.spec_patch.unwrap());
        assert_eq!(held(&cn), 25);
    }

    #[test]
    fn multi_pool_never_drops_a_prefix_with_an_address_in_use() {
        let p1 = ips("10.0.1", 16..32);
        let p2 = ips("10.0.1", 32..48);
        let all: Vec<String> = p1.iter().chain(&p2).cloned().collect();
        let cn = node(vec![eni(
            "eni-1",
            1,
            &refs(&all),
            &["10.0.1.16/28", "10.0.1.32/28"],
        )]);
        let mut agent = MultiPoolAgent::new();
        let step = agent.step(&cn, 0);
        // Router and health sit in the first /28; free = 30, and dropping the idle second
        // /28 leaves 14 ≥ 8 free: it goes.
        let cidrs =
            &step.spec_patch.as_ref().unwrap()["spec"]["ipam"]["pools"]["allocated"][0]["cidrs"];
        assert_eq!(cidrs, &json!(["10.0.1.16/28"]));
        let cn = apply(&cn, step.spec_patch.as_ref().unwrap());
        // 10 pods: 12 in use needs 20 with headroom: the /28 comes back.
        let step = agent.step(&cn, 10);
        let cidrs =
            &step.spec_patch.as_ref().unwrap()["spec"]["ipam"]["pools"]["allocated"][0]["cidrs"];
        assert_eq!(cidrs, &json!(["10.0.1.16/28", "10.0.1.32/28"]));
    }

    #[test]
    fn multi_pool_keeps_an_in_use_cidr_the_status_drops_and_flags_one_it_lost() {
        let mut cn = eni1_node(20);
        cn.status
            .as_mut()
            .unwrap()
            .ipam
            .used
            .insert("10.0.1.10".into(), AllocationIp::default());
        let mut agent = MultiPoolAgent::new();
        let step = agent.step(&cn, 0);
        assert_eq!(
            step.status_patch.unwrap()["status"]["ipam"]["used"]["10.0.1.10"],
            Value::Null
        );
        cn = apply(&cn, &step.spec_patch.unwrap());
        leave_pool_and_eni(&mut cn, "10.0.1.10");
        // Out of the status while in use: kept, still listed, nothing new taken from it.
        let step = agent.step(&cn, 0);
        assert!(step.violations.is_empty(), "{:?}", step.violations);
        assert!(agent.in_use().contains_key(&"10.0.1.10".parse().unwrap()));
        let listed = |cn: &CiliumNode| cn.spec.ipam.pools.allocated[0].cidrs.clone();
        assert!(listed(&cn).contains(&"10.0.1.10/32".to_string()));
        if let Some(patch) = step.spec_patch {
            cn = apply(&cn, &patch);
        }
        assert!(listed(&cn).contains(&"10.0.1.10/32".to_string()));
        // After a restart (its CIDRs rebuilt from the CiliumNode) the address is in no CIDR the
        // object lists: it was released under it.
        cn.spec.ipam.pools.allocated[0]
            .cidrs
            .retain(|c| c != "10.0.1.10/32");
        let mut agent = MultiPoolAgent::restored(agent.in_use().clone());
        let step = agent.step(&cn, 0);
        assert_eq!(step.violations.len(), 1);
        assert!(step.violations[0].contains("10.0.1.10"));
    }

    #[test]
    fn multi_pool_restart_treats_unlisted_attached_cidrs_as_dropped() {
        let mut cn = eni1_node(40);
        cn = apply(&cn, &MultiPoolAgent::new().step(&cn, 0).spec_patch.unwrap());
        assert_eq!(cn.spec.ipam.pools.allocated[0].cidrs.len(), 10);
        let mut restarted = MultiPoolAgent::new();
        assert!(restarted.step(&cn, 0).spec_patch.is_none());
    }

    #[test]
    fn generation_parses() {
        assert_eq!(Generation::parse("classic"), Some(Generation::Classic));
        assert_eq!(Generation::parse("multi-pool"), Some(Generation::MultiPool));
        assert_eq!(Generation::parse("x"), None);
        assert_eq!(Generation::MultiPool.to_string(), "multi-pool");
    }
}
