//! Write-back: the operator-owned fields a CiliumNode should carry, and the minimal, ordered
//! JSON merge patches that get it there (`docs/ciliumnode.md`, rules C1-C9).
//!
//! * `status.eni.enis`: every ENI of the instance, excluded ones included (C5), prefixes
//!   flattened into `addresses` (C3), subnet and VPC CIDRs filled (C4). If any of that data is
//!   missing from the cache, nothing is published (never a partial ENI) and the node reports
//!   [`ProblemReason::IncompleteEc2Data`].
//! * `spec.ipam.pool`: every address of every non-excluded ENI, `resource` = the ENI (C2, C9).
//! * `status.ipam.release-ips`: only the operator's transitions; an agent's answer is never
//!   overwritten by a proposal; stale entries are aborted; multi-pool nodes get none.
//! * `status.ipam.operator-status` and `status.eni-operator`.
//!
//! [`changes`] compares order-insensitively and emits: pool removals (spec), then status, then
//! pool additions (spec) (C1: a pool address is always in status first and last).
//!
//! Fields that Cilium's own CRD does not list ([`PRUNABLE_ENI_FIELDS`] and the summary in
//! `status.eni-operator`) never survive a write on real clusters: the API server prunes them.
//! They are written along with a real change, and compared only when the object carries them
//! (a pruned field is "unchanged", not "missing"), so steady state costs zero writes under
//! either CRD.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value, json};

use crate::crd::{
    AllocationIp, CiliumNode, EniEntry, EniSubnet, EniVpc, OperatorSummary, ReleaseState,
};
use crate::ec2::NetworkInterface;

use super::capacity::{
    instance_enis, is_excluded, is_prefix_delegated, max_allocatable, offers_primary,
    usable_addresses,
};
use super::demand::{self, Generation};
use super::{
    ChangeSet, DesiredState, Ec2View, InstanceView, IpamConfig, NodeMemory, Problem, ProblemReason,
    Subresource, Write,
};

/// See [`super::desired_state`].
pub fn desired_state(
    node: &CiliumNode,
    ec2: &Ec2View<'_>,
    config: &IpamConfig,
    memory: &NodeMemory,
    problem: Option<&Problem>,
) -> DesiredState {
    let instance_id = node.spec.instance_id.as_str();
    let spec = &node.spec.eni;
    let with_primary = offers_primary(config, spec);
    let mut problem = problem.cloned();

    let attached: Vec<&NetworkInterface> = match ec2.instance {
        InstanceView::Known { enis, .. } if !instance_id.is_empty() => {
            instance_enis(instance_id, enis)
        }
        _ => Vec::new(),
    };
    // No ENI known (not yet listed, or a cache gap): keep what is published.
    let (enis, pool) = if attached.is_empty() {
        (None, None)
    } else {
        match eni_map(&attached, ec2, with_primary) {
            Ok(mut map) => {
                let mut pool = attached
                    .iter()
                    .filter(|e| !is_excluded(e, spec))
                    .flat_map(|e| {
                        usable_addresses(e, with_primary).into_iter().map(|ip| {
                            (
                                ip.to_string(),
                                AllocationIp {
                                    resource: e.id.clone(),
                                    ..Default::default()
                                },
                            )
                        })
                    })
                    .collect();
                // Multi-pool CIDRs on their way out leave before their unassign (§7.4).
                super::withdrawal::strip(&mut map, &mut pool, &memory.withdrawn_cidrs());
                (Some(map), Some(pool))
            }
            Err(missing) => {
                problem.get_or_insert(Problem {
                    reason: ProblemReason::IncompleteEc2Data,
                    message: format!("EC2 data missing from the cache: {missing}; refreshing"),
                });
                (None, None)
            }
        }
    };

    let generation = demand::generation(node);
    let release_ips = release_transitions(node, memory, generation, pool.as_ref());

    let usable: Vec<&&NetworkInterface> =
        attached.iter().filter(|e| !is_excluded(e, spec)).collect();
    let available: i64 = usable
        .iter()
        .map(|e| usable_addresses(e, with_primary).len() as i64)
        .sum();
    let after = demand::watermarks(node).ok().map(|marks| {
        let pd = is_prefix_delegated(config, ec2.limits, spec);
        let max = max_allocatable(ec2.limits, spec.first_interface_index, pd);
        demand::compute(node, &marks, available, max)
    });
    let (used, needed) = after.as_ref().map_or((0, 0), |d| (d.used, d.needed));
    DesiredState {
        summary: OperatorSummary {
            enis: attached.len() as i64,
            available: pool
                .as_ref()
                .map_or(available, |p: &BTreeMap<_, _>| p.len() as i64),
            used,
            needed,
        },
        enis,
        pool,
        release_ips,
        operator_error: problem.map(|p| format!("{}: {}", p.reason.as_str(), p.message)),
        demand: after,
    }
}

/// `status.eni.enis` for the attached ENIs, or the IDs whose subnet or VPC is not cached.
fn eni_map(
    attached: &[&NetworkInterface],
    ec2: &Ec2View<'_>,
    with_primary: bool,
) -> Result<BTreeMap<String, EniEntry>, String> {
    let mut missing = BTreeSet::new();
    let mut map = BTreeMap::new();
    for eni in attached {
        let subnet = ec2.subnets.get(&eni.subnet_id);
        let vpc = ec2.vpcs.get(&eni.vpc_id);
        let (Some(subnet), Some(vpc)) = (subnet, vpc) else {
            if subnet.is_none() {
                missing.insert(format!("subnet {}", eni.subnet_id));
            }
            if vpc.is_none() {
                missing.insert(format!("VPC {}", eni.vpc_id));
            }
            continue;
        };
        let entry = EniEntry {
            id: eni.id.clone(),
            ip: eni.primary_ip.to_string(),
            mac: eni.mac.clone(),
            availability_zone: eni.availability_zone.clone(),
            description: eni.description.clone(),
            number: i64::from(eni.device_index().unwrap_or(0)),
            subnet: EniSubnet {
                id: subnet.id.clone(),
                cidr: subnet.cidr.to_string(),
                ..Default::default()
            },
            vpc: EniVpc {
                id: vpc.id.clone(),
                primary_cidr: vpc.primary_cidr.to_string(),
                cidrs: vpc
                    .secondary_cidrs
                    .iter()
                    .filter(|c| **c != vpc.primary_cidr)
                    .map(ToString::to_string)
                    .collect(),
                ..Default::default()
            },
            addresses: usable_addresses(eni, with_primary)
                .iter()
                .map(ToString::to_string)
                .collect(),
            prefixes: eni.prefixes.iter().map(|p| p.trunc().to_string()).collect(),
            ipv6_prefixes: eni.ipv6_prefixes.clone(),
            security_groups: eni.security_groups.clone(),
            tags: eni.tags.clone(),
            public_ip: eni.public_ip.clone().unwrap_or_default(),
            ..Default::default()
        };
        map.insert(eni.id.clone(), entry);
    }
    if missing.is_empty() {
        Ok(map)
    } else {
        Err(missing.into_iter().collect::<Vec<_>>().join(", "))
    }
}

/// The operator's transitions of `status.ipam.release-ips` (§7.3 steps 3 and 5).
fn release_transitions(
    node: &CiliumNode,
    memory: &NodeMemory,
    generation: Generation,
    pool: Option<&BTreeMap<String, AllocationIp>>,
) -> BTreeMap<String, Option<String>> {
    let empty = BTreeMap::new();
    let current = node.status.as_ref().map_or(&empty, |s| &s.ipam.release_ips);
    let mut out = BTreeMap::new();
    if generation == Generation::MultiPool {
        // Multi-pool agents do not use the handshake: withdraw everything (as Cilium does).
        for key in current.keys() {
            out.insert(key.clone(), None);
        }
        return out;
    }
    let in_pool = |ip: &str| pool.is_some_and(|p| p.contains_key(ip));
    let proposed: BTreeSet<String> = memory.proposed().map(|ip| ip.to_string()).collect();
    let unpublished: BTreeSet<String> = memory
        .released_unpublished()
        .map(|ip| ip.to_string())
        .collect();
    let marked = ReleaseState::MarkedForRelease.as_str().to_string();
    for ip in &proposed {
        match current.get(ip).and_then(|s| ReleaseState::parse(s)) {
            // No answer yet: propose (a no-op when already proposed).
            None | Some(ReleaseState::MarkedForRelease) => {
                out.insert(ip.clone(), Some(marked.clone()));
            }
            // The agent's answer (or an earlier release) stands.
            Some(_) => {}
        }
    }
    for ip in &unpublished {
        if in_pool(ip) {
            out.insert(ip.clone(), None);
        } else {
            out.insert(
                ip.clone(),
                Some(ReleaseState::Released.as_str().to_string()),
            );
        }
    }
    for (ip, state) in current {
        if proposed.contains(ip) || unpublished.contains(ip) {
            continue;
        }
        let keep = state == ReleaseState::Released.as_str() && !in_pool(ip);
        if !keep {
            // Aborted proposal (no longer a candidate), or a released address back in use.
            out.insert(ip.clone(), None);
        }
    }
    out
}

/// An entry as compared and published: lists sorted, unknown fields left out (never touched).
fn normalized(entry: &EniEntry) -> Value {
    let mut e = entry.clone();
    e.extra.clear();
    e.subnet.extra.clear();
    e.vpc.extra.clear();
    for list in [
        &mut e.addresses,
        &mut e.prefixes,
        &mut e.ipv6_prefixes,
        &mut e.security_groups,
        &mut e.vpc.cidrs,
    ] {
        list.sort();
        list.dedup();
    }
    serde_json::to_value(e).unwrap_or(Value::Null)
}

/// Fields of a `status.eni.enis` entry that Cilium's CRD does not list, so the API server prunes
/// them where that CRD is installed (tests/fixtures/ciliumnodes.cilium.io.yaml; a test checks
/// this list against it). Our CRD keeps them.
pub const PRUNABLE_ENI_FIELDS: &[&str] = &["ipv6-prefixes"];

/// Whether `want` differs from `cur` only by `prunable` keys that `cur` lacks (the server may
/// have pruned them: unchanged, not missing).
fn same_but_pruned(cur: &Value, want: &Value, prunable: &[&str]) -> bool {
    let mut want = want.clone();
    if let (Value::Object(w), Value::Object(c)) = (&mut want, cur) {
        for key in prunable {
            if !c.contains_key(*key) {
                w.remove(*key);
            }
        }
    }
    merge_diff(cur, &want).is_none()
}

/// RFC 7386 merge patch from `current` to `desired`; `None` when they are equal. Keys missing
/// from `desired` become `null`; arrays and scalars are replaced whole.
pub fn merge_diff(current: &Value, desired: &Value) -> Option<Value> {
    match (current, desired) {
        (Value::Object(cur), Value::Object(want)) => {
            let mut out = Map::new();
            for key in cur.keys().filter(|k| !want.contains_key(*k)) {
                out.insert(key.clone(), Value::Null);
            }
            for (key, w) in want {
                match cur.get(key) {
                    Some(c) => {
                        if let Some(d) = merge_diff(c, w) {
                            out.insert(key.clone(), d);
                        }
                    }
                    None => {
                        out.insert(key.clone(), w.clone());
                    }
                }
            }
            (!out.is_empty()).then_some(Value::Object(out))
        }
        _ => (current != desired).then(|| desired.clone()),
    }
}

/// See [`super::changes`].
pub fn changes(node: &CiliumNode, desired: &DesiredState) -> ChangeSet {
    let mut writes = Vec::new();
    let status = node.status.clone().unwrap_or_default();

    let mut removals = Map::new();
    let mut additions = Map::new();
    if let Some(pool) = &desired.pool {
        let current = &node.spec.ipam.pool;
        for key in current.keys().filter(|k| !pool.contains_key(*k)) {
            removals.insert(key.clone(), Value::Null);
        }
        for (key, want) in pool {
            if current.get(key).is_none_or(|c| c.resource != want.resource) {
                additions.insert(key.clone(), json!({ "resource": want.resource }));
            }
        }
    }
    if !removals.is_empty() {
        writes.push(Write {
            subresource: Subresource::Spec,
            patch: json!({ "spec": { "ipam": { "pool": removals } } }),
            needs_resource_version: false,
        });
    }

    let mut status_patch = Map::new();
    let mut ipam_patch = Map::new();
    // A pool entry moving to another ENI stays listed by its old one until the pool has moved
    // (C2), and only the last write drops it there.
    let interim = desired.enis.as_ref().map(|enis| {
        keep_moving(
            enis,
            &status.eni.enis,
            &moving(&node.spec.ipam.pool, desired),
        )
    });
    if let Some(enis) = &interim
        && let Some(diff) = enis_diff(&status.eni.enis, enis)
    {
        status_patch.insert("eni".into(), json!({ "enis": diff }));
    }
    let mut release = Map::new();
    for (ip, want) in &desired.release_ips {
        let cur = status.ipam.release_ips.get(ip);
        match want {
            Some(state) if cur != Some(state) => {
                release.insert(ip.clone(), Value::String(state.clone()));
            }
            None if cur.is_some() => {
                release.insert(ip.clone(), Value::Null);
            }
            _ => {}
        }
    }
    let touches_release = !release.is_empty();
    if touches_release {
        ipam_patch.insert("release-ips".into(), Value::Object(release));
    }
    if status.ipam.operator_status.error != desired.operator_error {
        let error = desired
            .operator_error
            .clone()
            .map_or(Value::Null, Value::String);
        ipam_patch.insert("operator-status".into(), json!({ "error": error }));
    }
    if !ipam_patch.is_empty() {
        status_patch.insert("ipam".into(), Value::Object(ipam_patch));
    }
    // The summary never causes a write of its own: it rides along with a real status change
    // (when it differs from the stored one). Its `used` mirrors the agent's, so refreshing it on
    // its own would follow every agent status write with one of ours during pod churn (issue 24
    // item 6), and under Cilium's CRD, which prunes it, it is never stored at all.
    // Planted defect (dst-mutants): the summary's "unchanged" check skipped.
    let summary_stale = crate::mutants::active("write-every-pass")
        || (!status_patch.is_empty() && status.eni_operator.as_ref() != Some(&desired.summary));
    if summary_stale {
        status_patch.insert(
            "eni-operator".into(),
            serde_json::to_value(&desired.summary).unwrap_or(Value::Null),
        );
    }
    if !status_patch.is_empty() {
        if touches_release {
            // The versioned handshake write must be based on the version we observed (the
            // agent's last write), C8: the sink takes each write's version from the answer to
            // the one before, so the pool removals before it carry the observed version too.
            // Unversioned, they would land on an agent write made since and hand its version
            // on: the handshake write would then pass over an answer we never saw.
            for w in &mut writes {
                w.needs_resource_version = true;
            }
        }
        writes.push(Write {
            subresource: Subresource::Status,
            patch: json!({ "status": status_patch }),
            needs_resource_version: touches_release,
        });
    }

    if !additions.is_empty() {
        writes.push(Write {
            subresource: Subresource::Spec,
            patch: json!({ "spec": { "ipam": { "pool": additions } } }),
            needs_resource_version: false,
        });
    }
    if let (Some(interim), Some(enis)) = (&interim, &desired.enis)
        && let Some(diff) = enis_diff(interim, enis)
    {
        writes.push(Write {
            subresource: Subresource::Status,
            patch: json!({ "status": { "eni": { "enis": diff } } }),
            needs_resource_version: false,
        });
    }
    ChangeSet { writes }
}

/// Pool addresses whose entry names another ENI in `desired` than in `current`, with the ENI
/// they leave.
fn moving<'a>(
    current: &'a BTreeMap<String, AllocationIp>,
    desired: &DesiredState,
) -> Vec<(&'a str, &'a str)> {
    let Some(pool) = &desired.pool else {
        return Vec::new();
    };
    current
        .iter()
        .filter(|(ip, c)| pool.get(*ip).is_some_and(|w| w.resource != c.resource))
        .map(|(ip, c)| (ip.as_str(), c.resource.as_str()))
        .collect()
}

/// `want` with each moving address still on the ENI it leaves: that ENI keeps its published
/// entry if it is going away.
fn keep_moving<'a>(
    want: &'a BTreeMap<String, EniEntry>,
    published: &BTreeMap<String, EniEntry>,
    moving: &[(&str, &str)],
) -> Cow<'a, BTreeMap<String, EniEntry>> {
    if moving.is_empty() {
        return Cow::Borrowed(want);
    }
    let mut out = want.clone();
    for (ip, from) in moving {
        match out.get_mut(*from) {
            Some(e) if !e.addresses.iter().any(|a| a == ip) => e.addresses.push(ip.to_string()),
            Some(_) => {}
            None => {
                if let Some(e) = published.get(*from) {
                    out.insert(from.to_string(), e.clone());
                }
            }
        }
    }
    Cow::Owned(out)
}

/// Rule C2: every pool address is listed by its ENI in `status.eni.enis`. Returns the offending
/// addresses (a real agent ignores the whole update when there is any). [`changes`] keeps it
/// after every write it emits; the test agents and the e2e check it on what they read.
pub fn c2_violations(cn: &CiliumNode) -> Vec<String> {
    let enis = cn.status.as_ref().map(|s| &s.eni.enis);
    cn.spec
        .ipam
        .pool
        .iter()
        .filter(|(ip, a)| {
            !enis
                .and_then(|m| m.get(&a.resource))
                .is_some_and(|e| e.addresses.iter().any(|x| x == *ip))
        })
        .map(|(ip, a)| format!("{ip} (resource {:?})", a.resource))
        .collect()
}

/// The merge patch of `status.eni.enis` from `current` to `want` (`None`: nothing to write).
fn enis_diff(
    current: &BTreeMap<String, EniEntry>,
    want: &BTreeMap<String, EniEntry>,
) -> Option<Value> {
    let current: Map<String, Value> = current
        .iter()
        .map(|(k, v)| (k.clone(), normalized(v)))
        .collect();
    let want: Map<String, Value> = want
        .iter()
        .map(|(k, v)| {
            let want = normalized(v);
            match current.get(k) {
                // Nothing to write for this ENI: leave it as the server keeps it.
                Some(cur) if same_but_pruned(cur, &want, PRUNABLE_ENI_FIELDS) => {
                    (k.clone(), cur.clone())
                }
                _ => (k.clone(), want),
            }
        })
        .collect();
    merge_diff(&Value::Object(current), &Value::Object(want))
}

/// Apply a change set to a node as the API server would (merge patches), for tests and for
/// callers that want the expected result.
pub fn apply(node: &CiliumNode, set: &ChangeSet) -> CiliumNode {
    let mut value = serde_json::to_value(node).unwrap_or(Value::Null);
    for write in &set.writes {
        json_patch::merge(&mut value, &write.patch);
    }
    serde_json::from_value(value).unwrap_or_else(|_| node.clone())
}

/// The API server's structural pruning, for the tests below: testkit's model (the one MemorySink
/// uses), compiled in by path. It is pure and holds none of this crate's types; a dev-dependency
/// on testkit would bring a second copy of them into the lib's unit tests.
#[cfg(test)]
#[allow(dead_code)]
#[path = "../../testkit/src/prune.rs"]
mod prune;

#[cfg(test)]
mod tests;
