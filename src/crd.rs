//! `CiliumNode` (`cilium.io/v2`): the fields ENI IPAM reads or writes, with Cilium's JSON names.
//!
//! Compatibility rules (see `docs/ciliumnode.md` and rule C8 of `docs/rules.md`):
//! * every struct keeps the fields it does not model in `extra` (serde `flatten`), so an object
//!   read and written back loses nothing an agent or a newer Cilium put there;
//! * the generated schema marks every object `x-kubernetes-preserve-unknown-fields`, so the API
//!   server never prunes Cilium's other fields when our CRD is the one installed;
//! * Cilium writes every field "omit when empty"; an absent field reads as its zero value, and we
//!   omit empty fields the same way. The four optional pointers of `spec.eni` stay `Option`.

use std::collections::BTreeMap;

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Fields of an object that our types do not model, kept verbatim.
pub type Extra = BTreeMap<String, Value>;

/// Tag sets (`subnet-tags`, ENI `tags`, ...).
pub type Tags = BTreeMap<String, String>;

fn is_zero(n: &i64) -> bool {
    *n == 0
}

/// The finalizer eni-operator puts on the CiliumNodes it manages.
pub const FINALIZER: &str = "eni-operator.cilium.io/release-enis";

/// Annotation with which a user opts a node out of eni-operator. Deliberately not Cilium's
/// `ipam.cilium.io/ignore`: that one tells Cilium's operator to leave a node to us (C10), so
/// honouring it too would leave such nodes served by nobody.
pub const IGNORE_ANNOTATION: &str = "eni-operator.cilium.io/ignore";

/// Cilium's own opt-out annotation: Cilium's operator skips nodes carrying it; we serve them.
pub const CILIUM_IGNORE_ANNOTATION: &str = "ipam.cilium.io/ignore";

/// The only pool name multi-pool agents use in ENI mode.
pub const DEFAULT_POOL: &str = "default";

/// `spec` of a CiliumNode.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "cilium.io",
    version = "v2",
    kind = "CiliumNode",
    plural = "ciliumnodes",
    shortname = "cn",
    shortname = "ciliumn",
    status = "CiliumNodeStatus",
    printcolumn = r#"{"name":"Instance","type":"string","jsonPath":".spec.instance-id"}"#,
    printcolumn = r#"{"name":"Type","type":"string","jsonPath":".spec.eni.instance-type"}"#,
    printcolumn = r#"{"name":"ENIs","type":"integer","jsonPath":".status.eni-operator.enis"}"#,
    printcolumn = r#"{"name":"Available","type":"integer","jsonPath":".status.eni-operator.available"}"#,
    printcolumn = r#"{"name":"Used","type":"integer","jsonPath":".status.eni-operator.used"}"#,
    printcolumn = r#"{"name":"Error","type":"string","priority":1,"jsonPath":".status.ipam.operator-status.error"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "kebab-case")]
#[schemars(extend("x-kubernetes-preserve-unknown-fields" = true))]
pub struct CiliumNodeSpec {
    /// EC2 instance ID (`i-…`), written by the agent from IMDS.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub instance_id: String,
    /// ENI settings written by the agent; the operator only reads them.
    #[serde(default, skip_serializing_if = "EniSpec::is_empty")]
    pub eni: EniSpec,
    /// IPAM: `pool` is the operator's; demand and watermarks are the agent's or the user's.
    #[serde(default, skip_serializing_if = "IpamSpec::is_empty")]
    pub ipam: IpamSpec,
    /// `addresses`, `health`, `encryption`, ... : never touched.
    #[serde(flatten)]
    #[schemars(skip)]
    pub extra: Extra,
}

/// `spec.eni`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "kebab-case")]
#[schemars(extend("x-kubernetes-preserve-unknown-fields" = true))]
pub struct EniSpec {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub instance_type: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub vpc_id: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub availability_zone: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub node_subnet_id: String,
    /// ENIs with a device index below this are not used for pods. Absent: not set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_interface_index: Option<i64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub subnet_ids: Vec<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub subnet_tags: Tags,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub security_groups: Vec<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub security_group_tags: Tags,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub exclude_interface_tags: Tags,
    /// Absent or true: set DeleteOnTermination on ENIs we create. Explicit false: don't.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delete_on_termination: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub use_primary_address: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disable_prefix_delegation: Option<bool>,
    /// Obsolete `instance-id`, `min-allocate`, ... of old schemas: preserved, never used.
    #[serde(flatten)]
    #[schemars(skip)]
    pub extra: Extra,
}

impl EniSpec {
    fn is_empty(&self) -> bool {
        self == &Self::default()
    }
}

/// `spec.ipam`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "kebab-case")]
#[schemars(extend("x-kubernetes-preserve-unknown-fields" = true))]
pub struct IpamSpec {
    /// Every IPv4 address usable for pods, with its ENI as `resource`. Operator-owned.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub pool: BTreeMap<String, AllocationIp>,
    /// Multi-pool agents' demand and holdings. Agent-owned: never written by the operator.
    #[serde(default, skip_serializing_if = "IpamPools::is_empty")]
    pub pools: IpamPools,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub pre_allocate: i64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub min_allocate: i64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub max_allocate: i64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub max_above_watermark: i64,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub static_ip_tags: Tags,
    /// `podCIDRs`, `ipv6-pool`, thresholds of other IPAM modes: preserved.
    #[serde(flatten)]
    #[schemars(skip)]
    pub extra: Extra,
}

impl IpamSpec {
    fn is_empty(&self) -> bool {
        self == &Self::default()
    }
}

/// One entry of `spec.ipam.pool` or `status.ipam.used`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "kebab-case")]
#[schemars(extend("x-kubernetes-preserve-unknown-fields" = true))]
pub struct AllocationIp {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub owner: String,
    /// The ENI ID holding the address.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub resource: String,
    #[serde(flatten)]
    #[schemars(skip)]
    pub extra: Extra,
}

/// `spec.ipam.pools`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "kebab-case")]
#[schemars(extend("x-kubernetes-preserve-unknown-fields" = true))]
pub struct IpamPools {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub requested: Vec<IpamPoolRequest>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allocated: Vec<IpamPoolAllocation>,
    #[serde(flatten)]
    #[schemars(skip)]
    pub extra: Extra,
}

impl IpamPools {
    fn is_empty(&self) -> bool {
        self == &Self::default()
    }
}

/// One entry of `spec.ipam.pools.requested`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "kebab-case")]
#[schemars(extend("x-kubernetes-preserve-unknown-fields" = true))]
pub struct IpamPoolRequest {
    pub pool: String,
    #[serde(default)]
    pub needed: IpamPoolDemand,
    #[serde(flatten)]
    #[schemars(skip)]
    pub extra: Extra,
}

/// `needed` of a pool request.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "kebab-case")]
#[schemars(extend("x-kubernetes-preserve-unknown-fields" = true))]
pub struct IpamPoolDemand {
    #[serde(default, skip_serializing_if = "is_zero")]
    pub ipv4_addrs: i64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub ipv6_addrs: i64,
    #[serde(flatten)]
    #[schemars(skip)]
    pub extra: Extra,
}

/// One entry of `spec.ipam.pools.allocated`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "kebab-case")]
#[schemars(extend("x-kubernetes-preserve-unknown-fields" = true))]
pub struct IpamPoolAllocation {
    pub pool: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cidrs: Vec<String>,
    #[serde(flatten)]
    #[schemars(skip)]
    pub extra: Extra,
}

/// `status` of a CiliumNode.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "kebab-case")]
#[schemars(extend("x-kubernetes-preserve-unknown-fields" = true))]
pub struct CiliumNodeStatus {
    #[serde(default, skip_serializing_if = "EniStatus::is_empty")]
    pub eni: EniStatus,
    #[serde(default, skip_serializing_if = "IpamStatus::is_empty")]
    pub ipam: IpamStatus,
    /// eni-operator's summary for `kubectl get cn` (pruned harmlessly under Cilium's CRD).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eni_operator: Option<OperatorSummary>,
    #[serde(flatten)]
    #[schemars(skip)]
    pub extra: Extra,
}

/// `status.eni`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "kebab-case")]
#[schemars(extend("x-kubernetes-preserve-unknown-fields" = true))]
pub struct EniStatus {
    /// Every ENI attached to the instance, keyed by ENI ID. Operator-owned, replaced whole.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub enis: BTreeMap<String, EniEntry>,
    #[serde(flatten)]
    #[schemars(skip)]
    pub extra: Extra,
}

impl EniStatus {
    fn is_empty(&self) -> bool {
        self == &Self::default()
    }
}

/// One ENI as published in `status.eni.enis`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "kebab-case")]
#[schemars(extend("x-kubernetes-preserve-unknown-fields" = true))]
pub struct EniEntry {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub id: String,
    /// The ENI's primary address.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub ip: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub mac: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub availability_zone: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
    /// Device index; Cilium omits 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub number: i64,
    #[serde(default, skip_serializing_if = "EniSubnet::is_empty")]
    pub subnet: EniSubnet,
    #[serde(default, skip_serializing_if = "EniVpc::is_empty")]
    pub vpc: EniVpc,
    /// Secondary addresses plus the 16 addresses of every /28 prefix.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub prefixes: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ipv6_prefixes: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub security_groups: Vec<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tags: Tags,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub public_ip: String,
    #[serde(flatten)]
    #[schemars(skip)]
    pub extra: Extra,
}

/// `subnet` of an ENI entry.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "kebab-case")]
#[schemars(extend("x-kubernetes-preserve-unknown-fields" = true))]
pub struct EniSubnet {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub id: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub cidr: String,
    #[serde(flatten)]
    #[schemars(skip)]
    pub extra: Extra,
}

impl EniSubnet {
    fn is_empty(&self) -> bool {
        self == &Self::default()
    }
}

/// `vpc` of an ENI entry.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "kebab-case")]
#[schemars(extend("x-kubernetes-preserve-unknown-fields" = true))]
pub struct EniVpc {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub id: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub primary_cidr: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cidrs: Vec<String>,
    #[serde(flatten)]
    #[schemars(skip)]
    pub extra: Extra,
}

impl EniVpc {
    fn is_empty(&self) -> bool {
        self == &Self::default()
    }
}

/// `status.ipam`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "kebab-case")]
#[schemars(extend("x-kubernetes-preserve-unknown-fields" = true))]
pub struct IpamStatus {
    /// Classic agents: every address in use. Agent-owned.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub used: BTreeMap<String, AllocationIp>,
    /// The classic release handshake: address -> state (see [`ReleaseState`]).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub release_ips: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "OperatorStatus::is_empty")]
    pub operator_status: OperatorStatus,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub assigned_static_ip: String,
    #[serde(flatten)]
    #[schemars(skip)]
    pub extra: Extra,
}

impl IpamStatus {
    fn is_empty(&self) -> bool {
        self == &Self::default()
    }
}

/// `status.ipam.operator-status`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "kebab-case")]
#[schemars(extend("x-kubernetes-preserve-unknown-fields" = true))]
pub struct OperatorStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(flatten)]
    #[schemars(skip)]
    pub extra: Extra,
}

impl OperatorStatus {
    fn is_empty(&self) -> bool {
        self == &Self::default()
    }
}

/// `status.eni-operator`: counts for `kubectl get cn` (JSONPath cannot count map entries).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub struct OperatorSummary {
    /// ENIs attached to the instance.
    pub enis: i64,
    /// Addresses usable for pods (size of `spec.ipam.pool`).
    pub available: i64,
    /// Addresses in use, as reported or derived from the agent's demand.
    pub used: i64,
    /// Addresses the operator still has to add.
    pub needed: i64,
}

/// The CRD manifest (`manifests/crd/ciliumnodes.cilium.io.yaml`), as written by `crd-gen`.
pub fn crd_yaml() -> String {
    use kube::CustomResourceExt;
    let crd = serde_json::to_value(CiliumNode::crd()).expect("a CRD always serializes");
    let options = serde_saphyr::ser_options! { prefer_block_scalars: false };
    let body = serde_saphyr::to_string_with_options(&FileStyle(&crd), options)
        .expect("a CRD always serializes");
    format!(
        "# generated by crd-gen, do not edit (regenerate with `make crds`)\n\
         # Only for clusters without Cilium (and tests): Cilium ships its own ciliumnodes CRD, and\n\
         # replacing it makes Cilium's operator and GitOps tools fight over it. Hence not in the\n\
         # default apply path (`kubectl apply -f manifests/` does not recurse into crd/).\n{body}"
    )
}

/// The CRD file's YAML style (the one `serde_yaml` wrote, so the file stays byte-identical
/// across the switch to serde-saphyr): a string that needs quotes is single-quoted, unless it
/// needs escapes (then serde-saphyr's double quotes, as serde_yaml did), and long strings stay
/// on one line (`prefer_block_scalars: false`).
struct FileStyle<'a>(&'a Value);

impl Serialize for FileStyle<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::{SerializeMap, SerializeSeq};
        match self.0 {
            Value::String(v) => {
                // serde-saphyr's own verdict on whether the string needs quotes.
                let quoted = serde_saphyr::to_string(v).is_ok_and(|y| y.starts_with('"'));
                let escapes = v.chars().any(|c| c == '\\' || c.is_control());
                if quoted && !escapes {
                    serde_saphyr::SingleQuoted(v.as_str()).serialize(s)
                } else {
                    s.serialize_str(v)
                }
            }
            Value::Array(items) => {
                let mut seq = s.serialize_seq(Some(items.len()))?;
                for item in items {
                    seq.serialize_element(&FileStyle(item))?;
                }
                seq.end()
            }
            Value::Object(fields) => {
                let mut map = s.serialize_map(Some(fields.len()))?;
                for (k, v) in fields {
                    map.serialize_entry(k, &FileStyle(v))?;
                }
                map.end()
            }
            other => other.serialize(s),
        }
    }
}

/// States of `status.ipam.release-ips` entries (classic agents only).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ReleaseState {
    /// Operator: proposes to release the address.
    MarkedForRelease,
    /// Agent: acknowledged, not in use.
    ReadyForRelease,
    /// Agent: refused, in use.
    DoNotRelease,
    /// Operator: unassigned in EC2.
    Released,
}

impl ReleaseState {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::MarkedForRelease => "marked-for-release",
            Self::ReadyForRelease => "ready-for-release",
            Self::DoNotRelease => "do-not-release",
            Self::Released => "released",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "marked-for-release" => Self::MarkedForRelease,
            "ready-for-release" => Self::ReadyForRelease,
            "do-not-release" => Self::DoNotRelease,
            "released" => Self::Released,
            _ => return None,
        })
    }
}

/// Compatibility: objects written by real Cilium agents survive a read/write through our types.
///
/// "Survive" follows Cilium's omit-when-empty convention: Go's `omitempty` never writes `0`,
/// `false`, `""`, `{}` or `[]`, and every reader treats absent as the zero value, so our types
/// may drop such explicit empties (e.g. `"number": 0`, `"operator-status": {}`). Every
/// non-empty value must come back identical, unknown fields included, and nothing may be added.
/// The optional pointers of `spec.eni` are the exception: an explicit `false` there means
/// something and must survive exactly.
#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const MULTIPOOL: &str = include_str!("../tests/fixtures/ciliumnode-multipool-prefix.json");
    const SEED: &str = include_str!("../tests/fixtures/ciliumnode-seed-pr45154.json");

    fn is_empty(v: &Value) -> bool {
        match v {
            Value::Null => true,
            Value::Bool(b) => !b,
            Value::Number(n) => n.as_f64() == Some(0.0),
            Value::String(s) => s.is_empty(),
            Value::Array(a) => a.is_empty(),
            Value::Object(o) => o.values().all(is_empty),
        }
    }

    /// `back` keeps every non-empty value of `orig` and adds nothing.
    fn assert_preserved(orig: &Value, back: &Value, path: &str) {
        match (orig, back) {
            (Value::Object(o), Value::Object(b)) => {
                for (k, ov) in o {
                    let p = format!("{path}.{k}");
                    match b.get(k) {
                        Some(bv) => assert_preserved(ov, bv, &p),
                        None => assert!(is_empty(ov), "{p} was lost: {ov}"),
                    }
                }
                for k in b.keys() {
                    assert!(o.contains_key(k), "{path}.{k} was added");
                }
            }
            (Value::Array(o), Value::Array(b)) => {
                assert_eq!(o.len(), b.len(), "{path}: length changed");
                for (i, (ov, bv)) in o.iter().zip(b).enumerate() {
                    assert_preserved(ov, bv, &format!("{path}[{i}]"));
                }
            }
            _ => assert_eq!(orig, back, "{path} changed"),
        }
    }

    fn round_trip(orig: &Value) -> CiliumNode {
        let node: CiliumNode = serde_json::from_value(orig.clone()).expect("deserializes");
        let back = serde_json::to_value(&node).unwrap();
        assert_preserved(orig, &back, "");
        // And a second pass is a fixed point.
        let again: CiliumNode = serde_json::from_value(back.clone()).unwrap();
        assert_eq!(serde_json::to_value(&again).unwrap(), back);
        node
    }

    #[test]
    fn spec_example_round_trips() {
        let orig: Value = serde_json::from_str(MULTIPOOL).unwrap();
        let node = round_trip(&orig);
        let eni = &node.spec.eni;
        assert_eq!(node.spec.instance_id, "i-0b2f5c6d7e8f90123");
        assert_eq!(eni.first_interface_index, Some(1));
        assert_eq!(eni.delete_on_termination, Some(true));
        assert_eq!(eni.use_primary_address, Some(false));
        assert_eq!(eni.disable_prefix_delegation, Some(false));
        assert_eq!(node.spec.ipam.pool.len(), 32);
        assert_eq!(node.spec.ipam.pools.requested[0].needed.ipv4_addrs, 20);
        assert_eq!(node.spec.ipam.min_allocate, 16);
        // Agent fields we do not model are kept verbatim.
        assert_eq!(node.spec.extra["health"], json!({"ipv4": "100.120.26.177"}));
        let status = node.status.unwrap();
        let secondary = &status.eni.enis["eni-024ee4a1e521cda8c"];
        assert_eq!(secondary.number, 1);
        assert_eq!(secondary.addresses.len(), 32);
        assert_eq!(secondary.vpc.primary_cidr, "10.0.0.0/19");
        assert_eq!(status.eni.enis["eni-0c9d8e7f6a5b43210"].number, 0);
        assert_eq!(status.ipam.operator_status.error, None);
    }

    #[test]
    fn seed_from_cilium_pr_45154_round_trips() {
        let orig: Value = serde_json::from_str(SEED).unwrap();
        let node = round_trip(&orig);
        assert_eq!(node.spec.ipam.pre_allocate, 1);
        assert_eq!(node.spec.ipam.min_allocate, 3);
        assert_eq!(
            node.spec.ipam.pools.allocated[0].cidrs,
            ["100.120.116.112/28", "100.120.26.176/28"]
        );
        let eni = &node.status.unwrap().eni.enis["eni-024ee4a1e521cda8c"];
        assert_eq!(eni.prefixes.len(), 2);
        assert_eq!(eni.tags["io.cilium/cilium-managed"], "true");
    }

    #[test]
    fn classic_agent_node_round_trips() {
        let orig = json!({
            "apiVersion": "cilium.io/v2",
            "kind": "CiliumNode",
            "metadata": {"name": "classic", "finalizers": [FINALIZER],
                         "annotations": {IGNORE_ANNOTATION: "false"}},
            "spec": {
                "instance-id": "i-1",
                "eni": {"delete-on-termination": false, "first-interface-index": 0,
                        "exclude-interface-tags": {"no-pods": "true"},
                        "instance-id": "i-1", "pre-allocate": 8},
                "ipam": {"pool": {"10.0.0.5": {"resource": "eni-1"}}, "podCIDRs": ["10.1.0.0/24"],
                         "max-above-watermark": 4, "static-ip-tags": {"eip": "yes"}}
            },
            "status": {
                "ipam": {
                    "used": {"10.0.0.5": {"owner": "default/pod-a", "resource": "eni-1"}},
                    "release-ips": {"10.0.0.6": "marked-for-release", "10.0.0.7": "ready-for-release"},
                    "operator-status": {"error": "no subnet"},
                    "pod-cidrs": {"10.1.0.0/24": {"status": "in-use"}}
                }
            }
        });
        let node = round_trip(&orig);
        // Explicit false / 0 in the optional pointers is meaningful and must survive.
        assert_eq!(node.spec.eni.delete_on_termination, Some(false));
        assert_eq!(node.spec.eni.first_interface_index, Some(0));
        let back = serde_json::to_value(&node).unwrap();
        assert_eq!(back["spec"]["eni"]["delete-on-termination"], json!(false));
        assert_eq!(back["spec"]["eni"]["first-interface-index"], json!(0));
        let ipam = &node.status.unwrap().ipam;
        assert_eq!(
            ReleaseState::parse(&ipam.release_ips["10.0.0.6"]),
            Some(ReleaseState::MarkedForRelease)
        );
        assert_eq!(ipam.operator_status.error.as_deref(), Some("no subnet"));
    }

    /// Paths (dot-joined object keys, `*` for a map entry) whose objects are maps, not structs.
    const MAPS: [&str; 9] = [
        "spec.ipam.pool",
        "spec.ipam.static-ip-tags",
        "spec.eni.subnet-tags",
        "spec.eni.security-group-tags",
        "spec.eni.exclude-interface-tags",
        "status.eni.enis",
        "status.eni.enis.*.tags",
        "status.ipam.used",
        "status.ipam.release-ips",
    ];

    /// Add an unknown field to every struct-shaped object below `path`. `metadata` is
    /// k8s-openapi's `ObjectMeta`, whose schema the API server owns: not ours to preserve.
    fn inject_unknown(v: &mut Value, path: &str) {
        if path == "metadata" {
            return;
        }
        match v {
            Value::Object(o) => {
                let is_map = MAPS.contains(&path);
                for (k, child) in o.iter_mut() {
                    let key = if is_map { "*" } else { k.as_str() };
                    let p = if path.is_empty() {
                        key.to_string()
                    } else {
                        format!("{path}.{key}")
                    };
                    inject_unknown(child, &p);
                }
                if !is_map && !path.is_empty() {
                    o.insert(
                        "x-future-field".into(),
                        json!({"from": path, "list": [1, "two", {"three": true}]}),
                    );
                }
            }
            Value::Array(a) => a.iter_mut().for_each(|c| inject_unknown(c, path)),
            _ => {}
        }
    }

    #[test]
    fn unknown_fields_at_every_level_survive() {
        let mut orig: Value = serde_json::from_str(MULTIPOOL).unwrap();
        orig["spec"]["ipam"]["pools"]["allocated"][0]["allow-first-last-ips"] = json!(true);
        orig["status"]["ipam"]["operator-status"] = json!({"error": "x"});
        inject_unknown(&mut orig, "");
        // Sanity: the injection reached the deepest structs.
        assert!(
            orig["status"]["eni"]["enis"]["eni-024ee4a1e521cda8c"]["vpc"]["x-future-field"]
                .is_object()
        );
        assert!(
            orig["spec"]["ipam"]["pools"]["requested"][0]["needed"]["x-future-field"].is_object()
        );
        assert!(orig["spec"]["ipam"]["pool"]["100.120.26.176"]["x-future-field"].is_object());
        let node = round_trip(&orig);
        let back = serde_json::to_value(&node).unwrap();
        assert_eq!(
            back["status"]["eni"]["enis"]["eni-024ee4a1e521cda8c"]["subnet"]["x-future-field"]["from"],
            json!("status.eni.enis.*.subnet")
        );
        assert_eq!(
            back["spec"]["ipam"]["pools"]["allocated"][0]["allow-first-last-ips"],
            json!(true)
        );
    }

    #[test]
    fn missing_fields_read_as_zero_values() {
        let node: CiliumNode = serde_json::from_value(json!({
            "apiVersion": "cilium.io/v2", "kind": "CiliumNode",
            "metadata": {"name": "bare"}, "spec": {}
        }))
        .unwrap();
        assert_eq!(node.spec, CiliumNodeSpec::default());
        assert!(node.status.is_none());
        let back = serde_json::to_value(&node).unwrap();
        assert_eq!(back["spec"], json!({}));
    }

    #[test]
    fn crd_yaml_has_header_and_parses() {
        let yaml = crd_yaml();
        assert!(yaml.starts_with("# generated by crd-gen, do not edit"));
        let crd: Value = serde_saphyr::from_str(&yaml).unwrap();
        assert_eq!(crd["metadata"]["name"], json!("ciliumnodes.cilium.io"));
    }
}
