//! [`changes`]: the ordered, minimal merge patches from what a CiliumNode says to what it
//! should say (C1: pool removals, then status, then pool additions), and [`apply`] of them.

use std::borrow::Cow;
use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

use crate::crd::{AllocationIp, CiliumNode, EniEntry};

use super::super::{ChangeSet, DesiredState, Subresource, Write};

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

/// The minimal, correctly ordered writes from `node` to `desired`.
///
/// ```
/// # use std::collections::BTreeMap;
/// # use std::time::Instant;
/// # use eni_operator::crd::{CiliumNode, CiliumNodeSpec};
/// # use eni_operator::ec2::*;
/// # use eni_operator::ipam::*;
/// # let limits = InstanceTypeLimits { instance_type: "m5.large".into(), max_enis: 3,
/// #     ipv4_per_eni: 10, ipv6_per_eni: 10, nitro: true, bare_metal: false,
/// #     enis_per_card: vec![] };
/// # let subnet = Subnet { id: "subnet-a".into(), vpc_id: "vpc-1".into(),
/// #     availability_zone: "az-1".into(), cidr: "10.0.0.0/20".parse().unwrap(),
/// #     available_addresses: 100, tags: Tags::new() };
/// # let subnets = BTreeMap::from([(subnet.id.clone(), subnet)]);
/// # let vpcs = BTreeMap::from([("vpc-1".to_string(), Vpc { id: "vpc-1".into(),
/// #     primary_cidr: "10.0.0.0/16".parse().unwrap(), secondary_cidrs: vec![] })]);
/// # let primary = NetworkInterface { id: "eni-0".into(), subnet_id: "subnet-a".into(),
/// #     vpc_id: "vpc-1".into(), availability_zone: "az-1".into(),
/// #     mac: "02:00:00:00:00:01".into(), description: String::new(),
/// #     primary_ip: "10.0.0.10".parse().unwrap(), secondary_ips: vec![], prefixes: vec![],
/// #     ipv6_prefixes: vec![], security_groups: vec!["sg-1".into()], tags: Tags::new(),
/// #     state: EniState::InUse, attachment: Some(Attachment { id: "attach-0".into(),
/// #     instance_id: "i-1".into(), device_index: 0, delete_on_termination: true,
/// #     network_card_index: 0 }),
/// #     public_ip: None, interface_type: Default::default() };
/// # let mut enis = vec![primary];
/// # let (security_groups, cooldown) = (BTreeMap::new(), BTreeMap::new());
/// # let mut node = CiliumNode::new("node-1", CiliumNodeSpec::default());
/// # node.spec.instance_id = "i-1".into();
/// # let config = IpamConfig::default();
/// # let mut memory = NodeMemory::default();
/// enis[0].secondary_ips = vec!["10.0.0.11".parse().unwrap()];
/// let view = Ec2View {
///     instance: InstanceView::Known { instance: None, enis: &enis },
///     limits: Some(&limits),
///     subnets: &subnets,
///     vpcs: &vpcs,
///     security_groups: &security_groups,
///     route_tables: &[],
///     prefix_cooldown: &cooldown,
///     pod_subnets: None,
/// };
/// let desired = desired_state(&node, &view, &config, &memory, None);
/// let set = changes(&node, &desired);
/// // New addresses: the ENI goes to status before the address enters the pool (C1).
/// let order: Vec<Subresource> = set.writes.iter().map(|w| w.subresource).collect();
/// assert_eq!(order, [Subresource::Status, Subresource::Spec]);
/// assert_eq!(set.writes[1].patch["spec"]["ipam"]["pool"]["10.0.0.11"]["resource"], "eni-0");
/// ```
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
