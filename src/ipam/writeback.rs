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
    if let Some(enis) = &desired.enis {
        let current: Map<String, Value> = status
            .eni
            .enis
            .iter()
            .map(|(k, v)| (k.clone(), normalized(v)))
            .collect();
        let want: Map<String, Value> = enis
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
        if let Some(diff) = merge_diff(&Value::Object(current), &Value::Object(want)) {
            status_patch.insert("eni".into(), json!({ "enis": diff }));
        }
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
    ChangeSet { writes }
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
mod tests {
    use super::*;
    use crate::ipam::testkit::*;
    use crate::ipam::{Action, Release, plan_node};
    use std::time::{Duration, Instant};

    fn world_with_prefix() -> World {
        let mut w = World::new();
        let mut e = eni_with_ips("eni-1", 1, "subnet-b", 2);
        e.prefixes = vec![net("10.0.16.32/28")];
        e.tags = tags(&[("k", "v")]);
        w.enis.push(e);
        w
    }

    fn check_c2_c3(d: &DesiredState) {
        let enis = d.enis.as_ref().unwrap();
        for (ip, entry) in d.pool.as_ref().unwrap() {
            let eni = enis.get(&entry.resource).expect("C2: ENI in status");
            assert!(eni.addresses.contains(ip), "C2: {ip} in {}", entry.resource);
        }
        for eni in enis.values() {
            for p in &eni.prefixes {
                for a in crate::ec2::prefix_addresses(net(p)) {
                    assert!(eni.addresses.contains(&a.to_string()), "C3");
                }
            }
            assert!(!eni.vpc.primary_cidr.is_empty(), "C4");
            assert!(!eni.subnet.cidr.is_empty(), "C4");
        }
    }

    #[test]
    fn desired_lists_every_eni_and_pools_usable_ones() {
        let w = world_with_prefix();
        let mut n = node();
        n.spec.eni.first_interface_index = Some(1);
        let d = desired_state(
            &n,
            &w.view(),
            &IpamConfig::default(),
            &NodeMemory::new(),
            None,
        );
        let enis = d.enis.as_ref().unwrap();
        assert_eq!(enis.len(), 2, "excluded primary ENI listed (C5)");
        let e1 = &enis["eni-1"];
        assert_eq!(e1.addresses.len(), 18);
        assert_eq!(e1.number, 1);
        assert_eq!(e1.subnet.cidr, "10.0.16.0/20");
        assert_eq!(e1.vpc.primary_cidr, "10.0.0.0/16");
        assert_eq!(e1.vpc.cidrs, ["100.64.0.0/16"]);
        assert!(!e1.addresses.contains(&e1.ip), "primary not offered");
        let pool = d.pool.as_ref().unwrap();
        assert_eq!(pool.len(), 18, "excluded ENI not pooled");
        assert!(pool.values().all(|a| a.resource == "eni-1"));
        assert_eq!(d.summary.enis, 2);
        assert_eq!(d.summary.available, 18);
        assert_eq!(d.operator_error, None);
        check_c2_c3(&d);

        let cfg = IpamConfig {
            use_primary_address: true,
            ..Default::default()
        };
        let d = desired_state(&n, &w.view(), &cfg, &NodeMemory::new(), None);
        let e1 = &d.enis.as_ref().unwrap()["eni-1"];
        assert!(e1.addresses.contains(&e1.ip));
        assert_eq!(d.pool.as_ref().unwrap().len(), 19);
        check_c2_c3(&d);
    }

    #[test]
    fn incomplete_ec2_data_publishes_nothing() {
        let mut w = world_with_prefix();
        w.vpcs.clear();
        let d = desired_state(
            &node(),
            &w.view(),
            &IpamConfig::default(),
            &NodeMemory::new(),
            None,
        );
        assert_eq!((d.enis.is_none(), d.pool.is_none()), (true, true));
        assert!(d.operator_error.unwrap().starts_with("IncompleteEc2Data"));
        let mut w = world_with_prefix();
        w.subnets.remove("subnet-b");
        let d = desired_state(
            &node(),
            &w.view(),
            &IpamConfig::default(),
            &NodeMemory::new(),
            None,
        );
        assert!(d.enis.is_none());
        assert!(d.operator_error.unwrap().contains("subnet-b"));
        let ch = changes(
            &node(),
            &desired_state(
                &node(),
                &w.view(),
                &IpamConfig::default(),
                &NodeMemory::new(),
                None,
            ),
        );
        assert!(
            ch.writes
                .iter()
                .all(|wr| wr.subresource == Subresource::Status)
        );
    }

    #[test]
    fn given_problem_becomes_operator_error_and_clears() {
        let w = World::new();
        let p = Problem {
            reason: ProblemReason::AtCapacity,
            message: "full".into(),
        };
        let d = desired_state(
            &node(),
            &w.view(),
            &IpamConfig::default(),
            &NodeMemory::new(),
            Some(&p),
        );
        assert_eq!(d.operator_error.as_deref(), Some("AtCapacity: full"));
        let n1 = apply(&node(), &changes(&node(), &d));
        assert_eq!(
            n1.status
                .as_ref()
                .unwrap()
                .ipam
                .operator_status
                .error
                .as_deref(),
            Some("AtCapacity: full")
        );
        let healthy = desired_state(
            &n1,
            &w.view(),
            &IpamConfig::default(),
            &NodeMemory::new(),
            None,
        );
        let ch = changes(&n1, &healthy);
        assert_eq!(ch.writes.len(), 1);
        assert_eq!(
            ch.writes[0].patch,
            json!({"status": {"ipam": {"operator-status": {"error": null}}}})
        );
    }

    #[test]
    fn changes_are_ordered_minimal_and_converge() {
        let w = world_with_prefix();
        let cfg = IpamConfig::default();
        let d = desired_state(&node(), &w.view(), &cfg, &NodeMemory::new(), None);
        let ch = changes(&node(), &d);
        let kinds: Vec<Subresource> = ch.writes.iter().map(|w| w.subresource).collect();
        assert_eq!(
            kinds,
            [Subresource::Status, Subresource::Spec],
            "C1: status first"
        );
        let n1 = apply(&node(), &ch);
        assert!(changes(&n1, &d).is_empty(), "nothing left to write");

        // Order-insensitive: shuffled lists in the object are not a change.
        let mut shuffled = n1.clone();
        for e in shuffled.status.as_mut().unwrap().eni.enis.values_mut() {
            e.addresses.reverse();
        }
        assert!(changes(&shuffled, &d).is_empty());

        // Release: the /28 goes; pool removals come before status.
        let mut w2 = w.clone();
        w2.enis[1].prefixes.clear();
        w2.enis[1].tags.clear();
        let d2 = desired_state(&n1, &w2.view(), &cfg, &NodeMemory::new(), None);
        let ch2 = changes(&n1, &d2);
        let kinds: Vec<Subresource> = ch2.writes.iter().map(|w| w.subresource).collect();
        assert_eq!(kinds, [Subresource::Spec, Subresource::Status]);
        let pool_patch = &ch2.writes[0].patch["spec"]["ipam"]["pool"];
        assert_eq!(pool_patch.as_object().unwrap().len(), 16);
        assert!(pool_patch.as_object().unwrap().values().all(Value::is_null));
        let eni_patch = &ch2.writes[1].patch["status"]["eni"]["enis"]["eni-1"];
        assert_eq!(eni_patch["tags"], json!(null), "removed tags nulled");
        assert_eq!(eni_patch["prefixes"], json!(null));
        let n2 = apply(&n1, &ch2);
        assert!(changes(&n2, &d2).is_empty());
        assert_eq!(n2.spec.ipam.pool.len(), 2);

        // A removed ENI is nulled.
        let mut w3 = w2.clone();
        w3.enis.pop();
        let d3 = desired_state(&n2, &w3.view(), &cfg, &NodeMemory::new(), None);
        let ch3 = changes(&n2, &d3);
        let status = ch3
            .writes
            .iter()
            .find(|w| w.subresource == Subresource::Status)
            .unwrap();
        assert_eq!(status.patch["status"]["eni"]["enis"]["eni-1"], json!(null));
        assert!(!status.needs_resource_version);
    }

    /// Cilium's CRD prunes `status.eni-operator`: a node that is otherwise current gets no
    /// write for the summary alone, or every resync would patch every node.
    #[test]
    fn pruned_summary_alone_is_not_rewritten() {
        let w = world_with_prefix();
        let cfg = IpamConfig::default();
        let d = desired_state(&node(), &w.view(), &cfg, &NodeMemory::new(), None);
        let n1 = apply(&node(), &changes(&node(), &d));
        assert!(
            n1.status.as_ref().unwrap().eni_operator.is_some(),
            "written along with the first status write"
        );
        // What the API server stores under Cilium's CRD.
        let mut pruned = n1.clone();
        pruned.status.as_mut().unwrap().eni_operator = None;
        assert!(
            changes(&pruned, &d).is_empty(),
            "{:?}",
            changes(&pruned, &d)
        );
    }

    #[test]
    fn unknown_eni_fields_are_preserved() {
        let w = World::new();
        let d = desired_state(
            &node(),
            &w.view(),
            &IpamConfig::default(),
            &NodeMemory::new(),
            None,
        );
        let mut n1 = apply(&node(), &changes(&node(), &d));
        n1.status
            .as_mut()
            .unwrap()
            .eni
            .enis
            .get_mut("eni-0")
            .unwrap()
            .extra
            .insert("future".into(), json!(1));
        assert!(changes(&n1, &d).is_empty());
    }

    #[test]
    fn release_ips_transitions() {
        let mut w = World::new();
        w.enis.push(eni_with_ips("eni-1", 1, "subnet-a", 3));
        let cfg = IpamConfig {
            release_excess_ips: true,
            release_delay: Duration::from_secs(10),
            ..Default::default()
        };
        let mut n = node();
        n.spec.ipam.pre_allocate = 1; // A 3, U 0, P 1: excess 2
        let mut mem = NodeMemory::new();
        let t0 = Instant::now();
        plan_node(&n, &w.view(), &cfg, &mut mem, t0, 0);
        let t1 = t0 + Duration::from_secs(10);
        let p = plan_node(&n, &w.view(), &cfg, &mut mem, t1, 0);
        assert_eq!(p.demand.excess, 2);
        let d = desired_state(&n, &w.view(), &cfg, &mem, None);
        let ips: Vec<String> = w.enis[1]
            .secondary_ips
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            d.release_ips.get(&ips[0]),
            Some(&Some("marked-for-release".into()))
        );
        let ch = changes(&n, &d);
        let st = ch
            .writes
            .iter()
            .find(|w| w.subresource == Subresource::Status)
            .unwrap();
        assert!(st.needs_resource_version);
        let mut n = apply(&n, &ch);
        // Agent: ready for one, refuses the other. The proposal never overwrites an answer.
        {
            let r = &mut n.status.as_mut().unwrap().ipam.release_ips;
            r.insert(ips[0].clone(), "ready-for-release".into());
            r.insert(ips[1].clone(), "do-not-release".into());
            r.insert("10.9.9.9".into(), "marked-for-release".into()); // stale
        }
        let d = desired_state(&n, &w.view(), &cfg, &mem, None);
        assert_eq!(d.release_ips.get(&ips[0]), None, "answer kept");
        assert_eq!(d.release_ips.get("10.9.9.9"), Some(&None), "stale aborted");
        let p = plan_node(&n, &w.view(), &cfg, &mut mem, t1, 0);
        let Action::Release(r) = p.action else {
            panic!("{:?}", p.action)
        };
        assert_eq!(r.ips, [w.enis[1].secondary_ips[0]]);
        // Executed: the runtime drops the address from the cache and records the release.
        mem.record_released(&r, t1);
        w.enis[1].secondary_ips.remove(0);
        let d = desired_state(&n, &w.view(), &cfg, &mem, None);
        assert_eq!(d.release_ips.get(&ips[0]), Some(&Some("released".into())));
        assert_eq!(d.release_ips.get(&ips[1]), Some(&None), "refused: aborted");
        let ch = changes(&n, &d);
        assert_eq!(
            ch.writes[0].subresource,
            Subresource::Spec,
            "pool removal first"
        );
        let n = apply(&n, &ch);
        assert_eq!(
            n.status
                .as_ref()
                .unwrap()
                .ipam
                .release_ips
                .get(&ips[0])
                .unwrap(),
            "released"
        );
        assert!(!n.spec.ipam.pool.contains_key(&ips[0]));
        // Published; the agent removes it; memory forgets it.
        plan_node(&n, &w.view(), &cfg, &mut mem, t1, 0);
        let mut n2 = n.clone();
        n2.status.as_mut().unwrap().ipam.release_ips.remove(&ips[0]);
        plan_node(&n2, &w.view(), &cfg, &mut mem, t1, 0);
        assert_eq!(mem.released().count(), 0);
        assert!(
            !desired_state(&n2, &w.view(), &cfg, &mem, None)
                .release_ips
                .contains_key(&ips[0])
        );
        let _ = Release::default();
    }

    #[test]
    fn multi_pool_nodes_get_no_release_ips() {
        let w = World::new();
        let mut n = node();
        n.spec
            .ipam
            .pools
            .requested
            .push(crate::crd::IpamPoolRequest {
                pool: "default".into(),
                ..Default::default()
            });
        n.status
            .as_mut()
            .unwrap()
            .ipam
            .release_ips
            .insert("10.0.0.1".into(), "marked-for-release".into());
        let d = desired_state(
            &n,
            &w.view(),
            &IpamConfig::default(),
            &NodeMemory::new(),
            None,
        );
        assert_eq!(d.release_ips.get("10.0.0.1"), Some(&None));
    }

    #[test]
    fn unknown_instance_keeps_published_data() {
        let mut w = World::new();
        w.presence = Presence::Unknown;
        let d = desired_state(
            &node(),
            &w.view(),
            &IpamConfig::default(),
            &NodeMemory::new(),
            None,
        );
        assert!(d.enis.is_none() && d.pool.is_none());
        let mut n = node();
        n.spec.ipam.pool.insert(
            "10.0.0.1".into(),
            AllocationIp {
                resource: "eni-0".into(),
                ..Default::default()
            },
        );
        assert!(
            changes(&n, &d)
                .writes
                .iter()
                .all(|w| w.subresource == Subresource::Status)
        );
    }

    #[test]
    fn every_problem_reason_reaches_operator_status() {
        let w = World::new();
        let reasons = [
            ProblemReason::MissingInstanceId,
            ProblemReason::InvalidSpec,
            ProblemReason::InstanceNotFound,
            ProblemReason::InstanceGone,
            ProblemReason::UnknownInstanceType,
            ProblemReason::NoMatchingSubnet,
            ProblemReason::NoSecurityGroups,
            ProblemReason::IncompleteEc2Data,
            ProblemReason::AtCapacity,
            ProblemReason::Ec2Error,
            ProblemReason::NoStaticIp,
            ProblemReason::OtherAllocatorActive,
        ];
        let names: BTreeSet<&str> = reasons.iter().map(|r| r.as_str()).collect();
        assert_eq!(names.len(), reasons.len(), "distinct names");
        for reason in reasons {
            let p = Problem {
                reason,
                message: "m".into(),
            };
            let d = desired_state(
                &node(),
                &w.view(),
                &IpamConfig::default(),
                &NodeMemory::new(),
                Some(&p),
            );
            assert_eq!(d.operator_error, Some(format!("{}: m", reason.as_str())));
        }
    }

    /// The object as the API server stores it under Cilium's own CRD.
    fn stored_under_ciliums_crd(n: &CiliumNode) -> CiliumNode {
        let mut v = serde_json::to_value(n).unwrap();
        super::prune::StructuralSchema::cilium().prune_object(&mut v);
        serde_json::from_value(v).unwrap()
    }

    fn status_write(set: &ChangeSet) -> Option<&Write> {
        set.writes
            .iter()
            .find(|w| w.subresource == Subresource::Status)
    }

    #[test]
    fn a_summary_pruned_by_ciliums_crd_counts_as_unchanged() {
        let w = world_with_prefix();
        let cfg = IpamConfig::default();
        let d = desired_state(&node(), &w.view(), &cfg, &NodeMemory::new(), None);
        let first = changes(&node(), &d);
        assert!(
            status_write(&first).unwrap().patch["status"]["eni-operator"].is_object(),
            "the summary rides along with the first status write"
        );
        let n1 = stored_under_ciliums_crd(&apply(&node(), &first));
        assert_eq!(n1.status.as_ref().unwrap().eni_operator, None, "pruned");
        let d1 = desired_state(&n1, &w.view(), &cfg, &NodeMemory::new(), None);
        assert_eq!(
            changes(&n1, &d1).writes,
            [],
            "nothing to write on the next pass"
        );

        // A real change still carries the summary (our CRD would keep it).
        let mut w2 = w.clone();
        w2.enis[1].prefixes.clear();
        let d2 = desired_state(&n1, &w2.view(), &cfg, &NodeMemory::new(), None);
        let ch2 = changes(&n1, &d2);
        assert!(status_write(&ch2).unwrap().patch["status"]["eni-operator"].is_object());
    }

    /// Under our CRD (which keeps the summary) a summary that went stale because the agent's
    /// `used` moved is not written on its own (every agent write would be followed by one of
    /// ours); the next real status change carries the fresh one.
    #[test]
    fn a_stale_summary_alone_is_not_written_but_rides_along_with_a_real_change() {
        let w = world_with_prefix();
        let cfg = IpamConfig::default();
        let d = desired_state(&node(), &w.view(), &cfg, &NodeMemory::new(), None);
        let mut n1 = apply(&node(), &changes(&node(), &d));
        assert_eq!(
            n1.status.as_ref().unwrap().eni_operator.as_ref(),
            Some(&d.summary)
        );
        assert!(changes(&n1, &d).is_empty());
        n1.status
            .as_mut()
            .unwrap()
            .eni_operator
            .as_mut()
            .unwrap()
            .used = 99;
        assert_eq!(changes(&n1, &d).writes, [], "the summary alone is no write");

        let mut w2 = w.clone();
        w2.enis[1].prefixes.clear();
        let d2 = desired_state(&n1, &w2.view(), &cfg, &NodeMemory::new(), None);
        let ch2 = changes(&n1, &d2);
        assert_eq!(
            status_write(&ch2).unwrap().patch["status"]["eni-operator"],
            serde_json::to_value(&d2.summary).unwrap(),
            "a real change carries the fresh summary"
        );
    }

    #[test]
    fn every_field_we_write_survives_ciliums_crd_but_the_known_prunable_ones() {
        let mut w = world_with_prefix();
        w.enis[1].ipv6_prefixes = vec!["2001:db8::/80".into()];
        w.enis[1].public_ip = Some("54.0.0.1".into());
        w.enis[1].description = "eni-operator".into();
        let cfg = IpamConfig::default();
        let p = Problem {
            reason: ProblemReason::AtCapacity,
            message: "full".into(),
        };
        let mut d = desired_state(&node(), &w.view(), &cfg, &NodeMemory::new(), Some(&p));
        d.release_ips
            .insert("10.0.99.1".into(), Some("marked-for-release".into()));
        let written = apply(&node(), &changes(&node(), &d));
        let stored = stored_under_ciliums_crd(&written);
        let dropped = super::prune::dropped_paths(
            &serde_json::to_value(&written).unwrap(),
            &serde_json::to_value(&stored).unwrap(),
        );
        let mut expected: BTreeSet<String> = ["/status/eni-operator".to_string()].into();
        for field in PRUNABLE_ENI_FIELDS {
            expected.insert(format!("/status/eni/enis/eni-1/{field}"));
        }
        assert_eq!(dropped, expected);
        let st = stored.status.as_ref().unwrap();
        assert_eq!(st.ipam.release_ips["10.0.99.1"], "marked-for-release");
        assert_eq!(
            st.ipam.operator_status.error.as_deref(),
            Some("AtCapacity: full")
        );
        assert_eq!(st.eni.enis["eni-1"].public_ip, "54.0.0.1");
        assert_eq!(stored.spec.ipam.pool.len(), 18);
        assert!(
            changes(&stored, &d).is_empty(),
            "settled under Cilium's CRD"
        );

        // Where the CRD keeps them (ours), a pruned-looking field that changes is written.
        w.enis[1].ipv6_prefixes.clear();
        let d2 = desired_state(&written, &w.view(), &cfg, &NodeMemory::new(), Some(&p));
        let ch = changes(&written, &d2);
        assert_eq!(
            status_write(&ch).unwrap().patch["status"]["eni"]["enis"]["eni-1"]["ipv6-prefixes"],
            json!(null)
        );
    }

    #[test]
    fn merge_diff_basics() {
        assert_eq!(merge_diff(&json!({"a": 1}), &json!({"a": 1})), None);
        assert_eq!(
            merge_diff(&json!({"a": 1, "b": 2}), &json!({"a": 1})),
            Some(json!({"b": null}))
        );
        assert_eq!(
            merge_diff(&json!({"a": [1]}), &json!({"a": [1, 2]})),
            Some(json!({"a": [1, 2]}))
        );
        assert_eq!(
            merge_diff(&json!({}), &json!({"x": {"y": 1}})),
            Some(json!({"x": {"y": 1}}))
        );
    }
}
