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

/// A Cilium object our types read and write back whole: Cilium's kebab-case names, the
/// fields not modelled kept in `extra` (serde `flatten`, absent from the schema, which keeps
/// unknown fields instead), and "empty" meaning all-default (Go's `omitempty`).
macro_rules! preserved {
    ($($(#[$meta:meta])* pub struct $name:ident { $($body:tt)* })*) => {$(
        $(#[$meta])*
        #[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
        #[serde(rename_all = "kebab-case")]
        #[schemars(extend("x-kubernetes-preserve-unknown-fields" = true))]
        pub struct $name {
            $($body)*
            #[serde(flatten)]
            #[schemars(skip)]
            pub extra: Extra,
        }

        impl Empty for $name {
            fn is_empty(&self) -> bool {
                self == &Self::default()
            }
        }
    )*};
}

/// All-default, so left out when written (Go's `omitempty`).
trait Empty {
    fn is_empty(&self) -> bool;
}

preserved! {
/// `spec.eni`.
///
/// Kept in `extra`: obsolete `instance-id`, `min-allocate`, ... of old schemas: preserved, never used.
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
}

/// `spec.ipam`.
///
/// Kept in `extra`: `podCIDRs`, `ipv6-pool`, thresholds of other IPAM modes: preserved.
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
}

/// One entry of `spec.ipam.pool` or `status.ipam.used`.
#[derive(Eq)]
pub struct AllocationIp {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub owner: String,
    /// The ENI ID holding the address.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub resource: String,
}

/// `spec.ipam.pools`.
pub struct IpamPools {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub requested: Vec<IpamPoolRequest>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allocated: Vec<IpamPoolAllocation>,
}

/// One entry of `spec.ipam.pools.requested`.
pub struct IpamPoolRequest {
    pub pool: String,
    #[serde(default)]
    pub needed: IpamPoolDemand,
}

/// `needed` of a pool request.
pub struct IpamPoolDemand {
    #[serde(default, skip_serializing_if = "is_zero")]
    pub ipv4_addrs: i64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub ipv6_addrs: i64,
}

/// One entry of `spec.ipam.pools.allocated`.
pub struct IpamPoolAllocation {
    pub pool: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cidrs: Vec<String>,
}

/// `status` of a CiliumNode.
pub struct CiliumNodeStatus {
    #[serde(default, skip_serializing_if = "EniStatus::is_empty")]
    pub eni: EniStatus,
    #[serde(default, skip_serializing_if = "IpamStatus::is_empty")]
    pub ipam: IpamStatus,
    /// eni-operator's summary for `kubectl get cn` (pruned harmlessly under Cilium's CRD).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eni_operator: Option<OperatorSummary>,
}

/// `status.eni`.
pub struct EniStatus {
    /// Every ENI attached to the instance, keyed by ENI ID. Operator-owned, replaced whole.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub enis: BTreeMap<String, EniEntry>,
}

/// One ENI as published in `status.eni.enis`.
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
}

/// `subnet` of an ENI entry.
#[derive(Eq)]
pub struct EniSubnet {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub id: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub cidr: String,
}

/// `vpc` of an ENI entry.
#[derive(Eq)]
pub struct EniVpc {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub id: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub primary_cidr: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cidrs: Vec<String>,
}

/// `status.ipam`.
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
}

/// `status.ipam.operator-status`.
#[derive(Eq)]
pub struct OperatorStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
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
mod yaml;
pub use yaml::crd_yaml;

#[cfg(test)]
mod tests;
