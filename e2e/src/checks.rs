//! Pure pieces of the suite: the objects it creates as a cloud and an agent would, and the
//! checks it runs on what it reads back. No I/O here, so all of it is unit-tested.

use std::collections::{BTreeMap, BTreeSet};

use eni_operator::crd::{CiliumNode, CiliumNodeSpec, EniSpec};
use k8s_openapi::api::core::v1::{Node, NodeSpec, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::ObjectMeta;

use crate::ec2seed::{EniView, Instance, OWNER_INSTANCE_TAG, POD_TAG, World};
use testkit::agent::{Generation, MULTI_POOL_PRE_ALLOCATE, derive_cidrs, endpoints};

/// Label on every Kubernetes object the suite creates (value: the run id), for clean-up.
pub const RUN_LABEL: &str = "eni-operator-e2e/run";

/// Taint on the suite's API-only Nodes.
pub const FAKE_NODE_TAINT: &str = "eni-operator-e2e/no-kubelet";

/// Addresses usable for pods on an instance type with first-interface-index 1 and no prefix
/// delegation: (ENIs − 1) × (IPv4 per ENI − 1). Only the types the suite launches.
pub fn max_ips(instance_type: &str) -> Option<usize> {
    let (enis, per_eni) = match instance_type {
        "m5.large" => (3, 10),
        "t3.large" => (3, 12),
        "m5.xlarge" | "c5.xlarge" => (4, 15),
        _ => return None,
    };
    Some((enis - 1) * (per_eni - 1))
}

/// Secondary IPs one ENI of this type holds.
pub fn ips_per_eni(instance_type: &str) -> Option<usize> {
    Some(match instance_type {
        "m5.large" => 9,
        "t3.large" => 11,
        "m5.xlarge" | "c5.xlarge" => 14,
        _ => return None,
    })
}

/// The API-only Node an instance would register (no kubelet behind it).
pub fn node_object(name: &str, inst: &Instance, run_id: &str) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            labels: Some(BTreeMap::from([
                (RUN_LABEL.to_string(), run_id.to_string()),
                ("topology.kubernetes.io/zone".to_string(), inst.az.clone()),
                (
                    "node.kubernetes.io/instance-type".to_string(),
                    inst.instance_type.clone(),
                ),
            ])),
            ..Default::default()
        },
        // No kubelet stands behind it: keep every pod (the operator's own included) off it.
        spec: Some(NodeSpec {
            provider_id: Some(format!("aws:///{}/{}", inst.az, inst.id)),
            unschedulable: Some(true),
            taints: Some(vec![Taint {
                key: FAKE_NODE_TAINT.to_string(),
                value: Some("true".to_string()),
                effect: "NoSchedule".to_string(),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// How a node's agent configured its CiliumNode.
#[derive(Clone, Debug, Default)]
pub struct NodeVariant {
    /// Override `spec.instance-id` (unknown instance).
    pub instance_id: Option<String>,
    /// Explicit `subnet-ids` instead of the pod subnet tags.
    pub subnet_ids: Option<Vec<String>>,
    /// `spec.ipam.pre-allocate` (negative: invalid input).
    pub pre_allocate: i64,
    pub min_allocate: i64,
    /// `spec.ipam.static-ip-tags` (the agent's `--ipam-static-ip-tags`): the node wants an
    /// Elastic IP carrying these tags.
    pub static_ip_tags: BTreeMap<String, String>,
    /// Annotations the creator sends with the CiliumNode (e.g. `ipam.cilium.io/ignore`).
    pub annotations: BTreeMap<String, String>,
}

/// The CiliumNode an agent creates on first start: owned by its Node, with the IMDS facts and
/// the ENI settings of a typical install (pods on tagged subnets, first-interface-index 1).
pub fn cilium_node_object(
    node: &Node,
    inst: &Instance,
    world: &World,
    v: &NodeVariant,
) -> CiliumNode {
    let name = node.metadata.name.clone().unwrap_or_default();
    let tag = BTreeMap::from([(POD_TAG.to_string(), "true".to_string())]);
    let mut eni = EniSpec {
        instance_type: inst.instance_type.clone(),
        vpc_id: world.vpc_id.clone(),
        availability_zone: inst.az.clone(),
        node_subnet_id: inst.subnet_id.clone(),
        first_interface_index: Some(1),
        security_group_tags: tag.clone(),
        delete_on_termination: Some(true),
        ..Default::default()
    };
    match &v.subnet_ids {
        Some(ids) => eni.subnet_ids = ids.clone(),
        None => eni.subnet_tags = tag,
    }
    let mut spec = CiliumNodeSpec {
        instance_id: v.instance_id.clone().unwrap_or_else(|| inst.id.clone()),
        eni,
        ..Default::default()
    };
    spec.ipam.pre_allocate = v.pre_allocate;
    spec.ipam.min_allocate = v.min_allocate;
    spec.ipam.static_ip_tags = v.static_ip_tags.clone();
    let mut cn = CiliumNode::new(&name, spec);
    if !v.annotations.is_empty() {
        cn.metadata.annotations = Some(v.annotations.clone());
    }
    cn.metadata.labels = Some(BTreeMap::from([(
        RUN_LABEL.to_string(),
        world.run_id.clone(),
    )]));
    cn.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "v1".into(),
        kind: "Node".into(),
        name,
        uid: node.metadata.uid.clone().unwrap_or_default(),
        ..Default::default()
    }]);
    cn
}

/// Addresses a node offers for pods as its agent sees them.
pub fn available(cn: &CiliumNode, generation: Generation) -> usize {
    match generation {
        Generation::Classic => cn.spec.ipam.pool.len(),
        Generation::MultiPool => derive_cidrs(cn).iter().map(|c| c.size()).sum(),
    }
}

/// Served: every endpoint has an address and the pre-allocation headroom (8) is there, capped
/// by what the instance can hold.
pub fn served(available: usize, pods: usize, unsatisfied: usize, cap: Option<usize>) -> bool {
    let want = endpoints(pods) + MULTI_POOL_PRE_ALLOCATE;
    unsatisfied == 0 && available >= cap.map_or(want, |c| want.min(c))
}

/// Addresses listed in the pool of more than one node: address -> nodes.
pub fn shared_addresses(
    pools: &BTreeMap<String, BTreeSet<String>>,
) -> BTreeMap<String, Vec<String>> {
    let mut seen: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for (node, ips) in pools {
        for ip in ips {
            seen.entry(ip).or_default().push(node.clone());
        }
    }
    seen.into_iter()
        .filter(|(_, n)| n.len() > 1)
        .map(|(ip, n)| (ip.to_string(), n))
        .collect()
}

/// Of the shared addresses, those EC2 itself holds on fewer than two ENIs: the operator's
/// fault. (An address on two ENIs in EC2 is an emulator's duplicate, see docs/emulators.md.)
pub fn operator_duplicates(shared: &BTreeMap<String, Vec<String>>, vpc: &[EniView]) -> Vec<String> {
    shared
        .keys()
        .filter(|ip| {
            vpc.iter()
                .filter(|e| eni_addresses(e).any(|a| a == **ip))
                .count()
                < 2
        })
        .cloned()
        .collect()
}

/// Problems with the ENIs carrying our ownership tags: `available` ones, and two of ours on one
/// instance at the same device index (a duplicate emulators accept).
pub fn owned_eni_problems(owned: &[EniView]) -> Vec<String> {
    let mut out = Vec::new();
    let mut slots: BTreeMap<(String, i32), Vec<&str>> = BTreeMap::new();
    for e in owned {
        if e.status == "available" {
            out.push(format!("{} is available (unattached)", e.id));
        }
        if let (Some(i), Some(d)) = (&e.instance_id, e.device_index) {
            slots.entry((i.clone(), d)).or_default().push(&e.id);
        }
        if let (Some(i), Some(tagged)) = (&e.instance_id, e.tags.get(OWNER_INSTANCE_TAG))
            && i != tagged
        {
            out.push(format!(
                "{} is tagged for {tagged} but attached to {i}",
                e.id
            ));
        }
    }
    for ((i, d), ids) in slots {
        if ids.len() > 1 {
            out.push(format!("{i}: device index {d} holds {}", ids.join(", ")));
        }
    }
    out
}

/// The addresses an ENI holds for pods: its secondary addresses and every address of its /28
/// prefixes (EC2 lists prefix addresses only as `Ipv4Prefixes`, not among the private ones).
pub fn eni_addresses(e: &EniView) -> impl Iterator<Item = String> + '_ {
    let in_prefixes = e
        .prefixes
        .iter()
        .filter_map(|p| p.parse::<ipnet::Ipv4Net>().ok())
        .flat_map(eni_operator::ec2::prefix_addresses)
        .map(|a| a.to_string());
    e.addresses.iter().cloned().chain(in_prefixes)
}

/// Problems with a node's pool against EC2: every address must be on an ENI attached to the
/// node's own instance.
pub fn pool_not_on_instance(cn: &CiliumNode, instance_enis: &[EniView]) -> Vec<String> {
    let on: BTreeSet<String> = instance_enis.iter().flat_map(eni_addresses).collect();
    cn.spec
        .ipam
        .pool
        .keys()
        .filter(|ip| !on.contains(ip.as_str()))
        .cloned()
        .collect()
}

/// One permission: (group, resource, subresource, verb).
pub type Access = (&'static str, &'static str, &'static str, &'static str);

/// What the operator's ServiceAccount must be allowed; each entry lists alternatives, one of
/// which suffices (writes may be patches or updates; Events of either API group).
pub const REQUIRED_ACCESS: &[&[Access]] = &[
    &[("cilium.io", "ciliumnodes", "", "get")],
    &[("cilium.io", "ciliumnodes", "", "list")],
    &[("cilium.io", "ciliumnodes", "", "watch")],
    &[
        ("cilium.io", "ciliumnodes", "", "patch"),
        ("cilium.io", "ciliumnodes", "", "update"),
    ],
    &[
        ("cilium.io", "ciliumnodes", "status", "patch"),
        ("cilium.io", "ciliumnodes", "status", "update"),
    ],
    &[("", "nodes", "", "get")],
    &[("coordination.k8s.io", "leases", "", "get")],
    &[("coordination.k8s.io", "leases", "", "create")],
    &[
        ("coordination.k8s.io", "leases", "", "patch"),
        ("coordination.k8s.io", "leases", "", "update"),
    ],
    &[
        ("", "events", "", "create"),
        ("events.k8s.io", "events", "", "create"),
    ],
];

/// The namespace a permission is checked in: leases live in the operator's namespace, Events
/// about cluster-scoped objects in `default`; everything else is cluster-scoped.
pub fn access_namespace(resource: &str, operator_ns: &str) -> Option<String> {
    match resource {
        "leases" => Some(operator_ns.to_string()),
        "events" => Some("default".to_string()),
        _ => None,
    }
}

/// The object a permission is checked on: the RBAC grants get/update only on the operator's own
/// Lease (`resourceNames`), so a check without the name would be denied.
pub fn access_name(resource: &str, lease_name: &str) -> Option<String> {
    (resource == "leases").then(|| lease_name.to_string())
}

/// Access an operator must not have (proof it is not running as admin).
pub const FORBIDDEN_ACCESS: &[Access] = &[
    ("", "nodes", "", "delete"),
    ("", "secrets", "", "list"),
    ("", "pods", "", "create"),
    // Least privilege: the operator only merge-patches CiliumNodes and writes events.k8s.io
    // Events (manifests/03-rbac.yaml).
    ("cilium.io", "ciliumnodes", "", "update"),
    ("", "events", "", "create"),
];

/// How long the CiliumNodes must stay unwritten before `cilium-crd-steady-state` calls them
/// converged: two resyncs, and at least [`DESCRIBE_LAG`] plus a resync after the operator's last
/// EC2 change. Within that lag the operator keeps what its own calls answered and ignores
/// describes (they may lag behind); the first describe after it is mirrored, and where the
/// endpoint describes an ENI differently from its create answer, that is one legitimate write.
/// moto does: an attached ENI's security groups come back as its own plus the instance's
/// (`NetworkInterface.group_set`, moto 5.2.5 `ec2/models/elastic_network_interfaces.py`), where
/// AWS keeps an ENI's own groups. The first real-API-server run failed on exactly that write,
/// 34 s after a 12 s settle window.
///
/// [`DESCRIBE_LAG`]: eni_operator::cache::DESCRIBE_LAG
pub fn settle_window(resync: std::time::Duration) -> std::time::Duration {
    let margin = std::time::Duration::from_secs(2);
    (resync * 2 + margin).max(eni_operator::cache::DESCRIBE_LAG + resync + margin)
}

/// Whether a CiliumNode CRD (as read from the cluster) prunes `status.eni-operator`, our
/// summary: true for Cilium's own CRD, false for ours (which preserves unknown fields).
pub fn crd_prunes_summary(crd: &serde_json::Value) -> Result<bool, String> {
    let schema = testkit::prune::StructuralSchema::from_crd(crd, "v2")?;
    let mut probe = serde_json::json!({"status": {"eni-operator": {"enis": 1}}});
    schema.prune_object(&mut probe);
    Ok(probe.pointer("/status/eni-operator").is_none())
}

/// What a quiet window must leave as it was on one CiliumNode: its resourceVersion (any write
/// changes it) and, to say who wrote, each field manager's last write time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeMark {
    pub resource_version: String,
    /// `manager operation [subresource]` → time of its last write.
    pub managers: BTreeMap<String, String>,
}

pub fn node_mark(cn: &CiliumNode) -> NodeMark {
    let managers = cn
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .map(|m| {
            let key = format!(
                "{} {} {}",
                m.manager.as_deref().unwrap_or("?"),
                m.operation.as_deref().unwrap_or("?"),
                m.subresource.as_deref().unwrap_or("")
            );
            let time = serde_json::to_value(&m.time)
                .ok()
                .and_then(|t| t.as_str().map(str::to_string))
                .unwrap_or_default();
            (key.trim_end().to_string(), time)
        })
        .collect();
    NodeMark {
        resource_version: cn.metadata.resource_version.clone().unwrap_or_default(),
        managers,
    }
}

/// An ENI as compared across a quiet window: everything a mutating call could change.
fn eni_state(e: &EniView) -> String {
    let mut addresses = e.addresses.clone();
    addresses.sort();
    let mut prefixes = e.prefixes.clone();
    prefixes.sort();
    format!(
        "{} attached to {:?} at {:?}, addresses {addresses:?}, prefixes {prefixes:?}",
        e.status, e.instance_id, e.device_index
    )
}

/// Everything that changed across a quiet window: CiliumNode writes (with the managers that
/// wrote) and ENIs created, deleted, attached, detached or given/taken addresses.
pub fn quiet_changes(
    nodes_before: &BTreeMap<String, NodeMark>,
    nodes_after: &BTreeMap<String, NodeMark>,
    enis_before: &[EniView],
    enis_after: &[EniView],
) -> Vec<String> {
    let mut out = Vec::new();
    for (name, before) in nodes_before {
        match nodes_after.get(name) {
            None => out.push(format!("CiliumNode {name} is gone")),
            Some(after) if after.resource_version != before.resource_version => {
                let writers: Vec<&str> = after
                    .managers
                    .iter()
                    .filter(|(k, t)| before.managers.get(*k) != Some(t))
                    .map(|(k, _)| k.as_str())
                    .collect();
                out.push(format!(
                    "CiliumNode {name} written (resourceVersion {} -> {}; by {})",
                    before.resource_version,
                    after.resource_version,
                    if writers.is_empty() {
                        "a manager writing within the same second".to_string()
                    } else {
                        writers.join(", ")
                    }
                ));
            }
            Some(_) => {}
        }
    }
    let state = |list: &[EniView]| -> BTreeMap<String, String> {
        list.iter().map(|e| (e.id.clone(), eni_state(e))).collect()
    };
    let (before, after) = (state(enis_before), state(enis_after));
    for (id, b) in &before {
        match after.get(id) {
            None => out.push(format!("ENI {id} deleted (was {b})")),
            Some(a) if a != b => out.push(format!("ENI {id}: {b} -> {a}")),
            Some(_) => {}
        }
    }
    for (id, a) in &after {
        if !before.contains_key(id) {
            out.push(format!("ENI {id} created ({a})"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ec2seed::Subnet;
    use eni_operator::crd::AllocationIp;

    fn world() -> World {
        World {
            run_id: "r1".into(),
            vpc_id: "vpc-1".into(),
            zones: ["us-east-1a".into(), "us-east-1b".into()],
            subnets: vec![Subnet {
                id: "subnet-n".into(),
                az: "us-east-1a".into(),
                cidr: "10.0.0.0/24".into(),
                pods: false,
            }],
            pod_security_group: "sg-p".into(),
            other_security_group: "sg-o".into(),
            image_id: "ami-1".into(),
            instances: vec![],
            cluster_name: String::new(),
        }
    }

    fn inst() -> Instance {
        Instance {
            id: "i-1".into(),
            instance_type: "m5.xlarge".into(),
            az: "us-east-1a".into(),
            subnet_id: "subnet-n".into(),
        }
    }

    fn eni(
        id: &str,
        status: &str,
        inst: Option<&str>,
        dev: Option<i32>,
        addrs: &[&str],
    ) -> EniView {
        EniView {
            id: id.into(),
            status: status.into(),
            instance_id: inst.map(String::from),
            device_index: dev,
            addresses: addrs.iter().map(|s| s.to_string()).collect(),
            prefixes: vec![],
            tags: inst
                .map(|i| BTreeMap::from([(OWNER_INSTANCE_TAG.to_string(), i.to_string())]))
                .unwrap_or_default(),
        }
    }

    #[test]
    fn node_and_cilium_node_look_like_a_cloud_and_an_agent_made_them() {
        let mut node = node_object("n1", &inst(), "r1");
        assert_eq!(
            node.spec.as_ref().unwrap().provider_id.as_deref(),
            Some("aws:///us-east-1a/i-1")
        );
        let spec = node.spec.as_ref().unwrap();
        assert_eq!(spec.unschedulable, Some(true));
        assert_eq!(spec.taints.as_ref().unwrap()[0].key, FAKE_NODE_TAINT);
        node.metadata.uid = Some("uid-1".into());
        let cn = cilium_node_object(&node, &inst(), &world(), &NodeVariant::default());
        let v = serde_json::to_value(&cn).unwrap();
        assert_eq!(v["spec"]["instance-id"], "i-1");
        assert_eq!(v["spec"]["eni"]["instance-type"], "m5.xlarge");
        assert_eq!(v["spec"]["eni"]["vpc-id"], "vpc-1");
        assert_eq!(v["spec"]["eni"]["node-subnet-id"], "subnet-n");
        assert_eq!(v["spec"]["eni"]["first-interface-index"], 1);
        assert_eq!(v["spec"]["eni"]["subnet-tags"][POD_TAG], "true");
        assert_eq!(v["metadata"]["ownerReferences"][0]["kind"], "Node");
        assert_eq!(v["metadata"]["ownerReferences"][0]["uid"], "uid-1");
        assert!(v["spec"]["ipam"].get("pre-allocate").is_none());
        assert!(v["spec"]["ipam"].get("static-ip-tags").is_none());
        let bad = NodeVariant {
            subnet_ids: Some(vec!["subnet-x".into()]),
            pre_allocate: -1,
            static_ip_tags: BTreeMap::from([("eip".into(), "yes".into())]),
            ..Default::default()
        };
        let v = serde_json::to_value(cilium_node_object(&node, &inst(), &world(), &bad)).unwrap();
        assert_eq!(v["spec"]["ipam"]["static-ip-tags"]["eip"], "yes");
        assert_eq!(v["spec"]["eni"]["subnet-ids"][0], "subnet-x");
        assert!(v["spec"]["eni"].get("subnet-tags").is_none());
        assert_eq!(v["spec"]["ipam"]["pre-allocate"], -1);
    }

    #[test]
    fn served_needs_headroom_capped_by_the_instance() {
        assert!(served(14, 4, 0, Some(42)));
        assert!(!served(13, 4, 0, Some(42)));
        assert!(!served(14, 4, 1, Some(42)));
        assert!(served(10, 4, 0, Some(10)));
        assert_eq!(max_ips("m5.xlarge"), Some(42));
        assert_eq!(max_ips("m5.large"), Some(18));
        assert_eq!(max_ips("x"), None);
    }

    #[test]
    fn shared_addresses_are_blamed_on_the_operator_only_when_ec2_has_them_once() {
        let pools = BTreeMap::from([
            (
                "a".to_string(),
                BTreeSet::from(["10.0.0.1".to_string(), "10.0.0.2".to_string()]),
            ),
            (
                "b".to_string(),
                BTreeSet::from([
                    "10.0.0.2".to_string(),
                    "10.0.0.3".to_string(),
                    "10.0.0.4".to_string(),
                ]),
            ),
            ("c".to_string(), BTreeSet::from(["10.0.0.4".to_string()])),
        ]);
        let shared = shared_addresses(&pools);
        assert_eq!(
            shared.keys().cloned().collect::<Vec<_>>(),
            vec!["10.0.0.2", "10.0.0.4"]
        );
        let vpc = vec![
            eni("eni-1", "in-use", Some("i-1"), Some(1), &["10.0.0.2"]),
            eni(
                "eni-2",
                "in-use",
                Some("i-2"),
                Some(1),
                &["10.0.0.2", "10.0.0.4"],
            ),
        ];
        assert_eq!(
            operator_duplicates(&shared, &vpc),
            vec!["10.0.0.4".to_string()]
        );
    }

    #[test]
    fn owned_eni_problems_finds_available_clashing_and_misplaced_enis() {
        let mut wrong = eni("eni-4", "in-use", Some("i-2"), Some(2), &[]);
        wrong.tags.insert(OWNER_INSTANCE_TAG.into(), "i-9".into());
        let problems = owned_eni_problems(&[
            eni("eni-1", "in-use", Some("i-1"), Some(1), &[]),
            eni("eni-2", "in-use", Some("i-1"), Some(1), &[]),
            eni("eni-3", "available", None, None, &[]),
            wrong,
            eni("eni-5", "in-use", Some("i-1"), Some(2), &[]),
        ]);
        assert_eq!(problems.len(), 3, "{problems:?}");
        assert!(problems.iter().any(|p| p.contains("eni-3")));
        assert!(problems.iter().any(|p| p.contains("eni-1, eni-2")));
        assert!(problems.iter().any(|p| p.contains("i-9")));
        assert!(
            owned_eni_problems(&[eni("eni-1", "in-use", Some("i-1"), Some(1), &[])]).is_empty()
        );
    }

    #[test]
    fn pool_addresses_must_be_on_the_nodes_instance() {
        let mut cn = CiliumNode::new("n1", CiliumNodeSpec::default());
        for ip in ["10.0.0.1", "10.0.0.2"] {
            cn.spec.ipam.pool.insert(ip.into(), AllocationIp::default());
        }
        let enis = [eni("eni-1", "in-use", Some("i-1"), Some(1), &["10.0.0.1"])];
        assert_eq!(
            pool_not_on_instance(&cn, &enis),
            vec!["10.0.0.2".to_string()]
        );
        // Prefix delegation: the pool's addresses are on the ENI as a /28.
        cn.spec
            .ipam
            .pool
            .insert("10.0.1.17".into(), AllocationIp::default());
        let mut with_prefix = eni("eni-2", "in-use", Some("i-1"), Some(2), &[]);
        with_prefix.prefixes = vec!["10.0.1.16/28".into()];
        assert_eq!(
            pool_not_on_instance(&cn, &[enis[0].clone(), with_prefix]),
            vec!["10.0.0.2".to_string()]
        );
    }

    #[test]
    fn access_namespaces() {
        assert_eq!(access_namespace("leases", "ns").as_deref(), Some("ns"));
        assert_eq!(access_namespace("events", "ns").as_deref(), Some("default"));
        assert_eq!(access_namespace("ciliumnodes", "ns"), None);
        assert_eq!(access_name("leases", "l").as_deref(), Some("l"));
        assert_eq!(access_name("ciliumnodes", "l"), None);
        assert!(REQUIRED_ACCESS.iter().all(|alts| !alts.is_empty()));
    }

    #[test]
    fn available_counts_pool_or_cidrs() {
        let mut cn = CiliumNode::new("n1", CiliumNodeSpec::default());
        cn.spec
            .ipam
            .pool
            .insert("10.0.0.1".into(), AllocationIp::default());
        assert_eq!(available(&cn, Generation::Classic), 1);
        assert_eq!(available(&cn, Generation::MultiPool), 0, "no ENI in status");
    }
    #[test]
    fn ciliums_crd_prunes_the_summary_and_ours_keeps_it() {
        use testkit::prune::{CILIUM_CRD_YAML, OUR_CRD_YAML};
        let as_json = |yaml: &str| -> serde_json::Value {
            serde_saphyr::from_multiple::<serde_json::Value>(yaml)
                .unwrap()
                .into_iter()
                .find(|v: &serde_json::Value| v["kind"] == "CustomResourceDefinition")
                .unwrap()
        };
        assert_eq!(crd_prunes_summary(&as_json(CILIUM_CRD_YAML)), Ok(true));
        assert_eq!(crd_prunes_summary(&as_json(OUR_CRD_YAML)), Ok(false));
        assert!(crd_prunes_summary(&serde_json::json!({"spec": {}})).is_err());
    }

    fn in_use(id: &str, addresses: &[&str]) -> EniView {
        eni(id, "in-use", Some("i-1"), Some(1), addresses)
    }

    #[test]
    fn the_settle_window_outlasts_the_describe_lag_after_our_own_changes() {
        use std::time::Duration;
        let lag = eni_operator::cache::DESCRIBE_LAG;
        for resync in [
            Duration::from_secs(1),
            Duration::from_secs(5),
            Duration::from_secs(60),
        ] {
            let w = settle_window(resync);
            assert!(w > lag + resync, "resync {resync:?}: {w:?}");
            assert!(w >= resync * 2, "resync {resync:?}: {w:?}");
        }
    }

    #[test]
    fn quiet_changes_name_every_write_and_ec2_change() {
        let mark = |rv: &str, t: &str| NodeMark {
            resource_version: rv.into(),
            managers: [
                ("eni-operator Update status".to_string(), t.to_string()),
                ("agent Update".to_string(), "t0".to_string()),
            ]
            .into(),
        };
        let nodes: BTreeMap<String, NodeMark> = [("n1".to_string(), mark("5", "t1"))].into();
        let enis = [
            in_use("eni-1", &["10.0.0.2", "10.0.0.1"]),
            in_use("eni-2", &[]),
        ];
        // The same state, listed in another order: nothing changed.
        let reordered = [
            in_use("eni-2", &[]),
            in_use("eni-1", &["10.0.0.1", "10.0.0.2"]),
        ];
        assert_eq!(
            quiet_changes(&nodes, &nodes, &enis, &reordered),
            Vec::<String>::new()
        );

        let written: BTreeMap<String, NodeMark> = [("n1".to_string(), mark("6", "t2"))].into();
        let changed = [in_use("eni-1", &["10.0.0.1"]), in_use("eni-3", &[])];
        let got = quiet_changes(&nodes, &written, &enis, &changed);
        assert_eq!(got.len(), 4, "{got:?}");
        assert!(got[0].contains("n1 written") && got[0].contains("by eni-operator Update status"));
        assert!(got[1].starts_with("ENI eni-1:"), "{got:?}");
        assert!(got[2].starts_with("ENI eni-2 deleted"), "{got:?}");
        assert!(got[3].starts_with("ENI eni-3 created"), "{got:?}");
    }

    #[test]
    fn node_mark_reads_version_and_managers() {
        let mut cn = CiliumNode::new("n1", CiliumNodeSpec::default());
        cn.metadata.resource_version = Some("7".into());
        cn.metadata.managed_fields = Some(vec![
            k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry {
                manager: Some("eni-operator".into()),
                operation: Some("Update".into()),
                subresource: Some("status".into()),
                ..Default::default()
            },
        ]);
        let m = node_mark(&cn);
        assert_eq!(m.resource_version, "7");
        assert_eq!(
            m.managers.keys().collect::<Vec<_>>(),
            ["eni-operator Update status"]
        );
    }
}
