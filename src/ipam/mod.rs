//! The IPAM engine: pure decisions for one node, no I/O.
//!
//! Given a node's [`CiliumNode`], the EC2 view of its instance ([`Ec2View`]) and the operator's
//! settings ([`IpamConfig`]), the engine decides what to do next ([`plan_node`] -> [`NodePlan`])
//! and what the CiliumNode should say afterwards ([`desired_state`] -> [`DesiredState`]), then
//! which writes that takes ([`changes`] -> [`ChangeSet`]). The runtime executes the action,
//! applies its result to the cache, and writes the change set. Nothing here calls EC2 or
//! Kubernetes, so every rule is tested with plain values.
//!
//! Behavioural reference: `docs/rules.md` (formulas, selection rules, release; rules C1-C10) and
//! `docs/ciliumnode.md` (which CiliumNode fields are read and written).

pub mod admission;
pub mod capacity;
pub mod cilium_version;
pub mod confirmed;
pub mod demand;
pub mod handover;
pub mod ownership;
pub mod plan;
pub mod published;
pub mod release;
pub mod selection;
pub mod static_ip;
pub mod withdrawal;
pub mod writeback;

#[cfg(test)]
mod cilium_tables;
#[cfg(test)]
pub(crate) mod fixtures;
#[cfg(test)]
mod network_cards;
#[cfg(test)]
mod proptests;

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use ipnet::Ipv4Net;

use crate::crd::{AllocationIp, CiliumNode, EniEntry, OperatorSummary};
use crate::ec2::{
    CreateEniRequest, Instance, InstanceTypeLimits, NetworkInterface, RouteTable, SecurityGroup,
    Subnet, Tags, Vpc,
};

pub use demand::{Demand, Generation};
pub use release::NodeMemory;

/// Operator-level settings that shape planning (from the command line).
#[derive(Clone, Debug)]
pub struct IpamConfig {
    /// `--aws-enable-prefix-delegation`.
    pub prefix_delegation: bool,
    /// `--aws-release-excess-ips`.
    pub release_excess_ips: bool,
    /// `--excess-ip-release-delay`.
    pub release_delay: Duration,
    /// `--aws-use-primary-address`: list primary addresses in `addresses` and the pool.
    pub use_primary_address: bool,
    /// `--eni-tags`: extra tags on every ENI we create (ownership tags win on a conflict).
    pub eni_tags: Tags,
    /// `--cluster-name`: goes into the ownership tags.
    pub cluster_name: String,
    /// How long a subnet that failed a /28 is skipped for prefixes.
    pub prefix_cooldown: Duration,
    /// This process's part of every `ClientToken` (random per process; seeded in the
    /// simulation): a new process never replays a token an earlier one spent, since token
    /// generations restart at 0 with it (`ownership::client_token`).
    pub token_nonce: u64,
    /// `--static-ip-required-tag`: the tag an Elastic IP must carry before a node's
    /// `static-ip-tags` may claim it; `None`: this cluster's ownership tag.
    pub static_ip_required_tag: Option<(String, String)>,
}

impl IpamConfig {
    /// The tag every Elastic IP we associate carries (the operator's allow-list: the agent's
    /// `static-ip-tags` only choose among these).
    pub fn static_ip_required_tag(&self) -> (String, String) {
        self.static_ip_required_tag.clone().unwrap_or_else(|| {
            (
                ownership::CLUSTER_TAG.to_string(),
                self.cluster_name.clone(),
            )
        })
    }
}

impl Default for IpamConfig {
    fn default() -> Self {
        Self {
            prefix_delegation: false,
            release_excess_ips: false,
            release_delay: Duration::from_secs(180),
            use_primary_address: false,
            eni_tags: Tags::new(),
            cluster_name: "default".into(),
            prefix_cooldown: Duration::from_secs(300),
            token_nonce: 0,
            static_ip_required_tag: None,
        }
    }
}

/// What the cache knows of a node's instance.
#[derive(Clone, Copy, Debug)]
pub enum InstanceView<'a> {
    /// Not in the cache (yet): the runtime refreshes it; the node gets an explicit status.
    Unknown,
    /// Shutting down or terminated: nothing more is planned for it.
    Gone,
    /// Known, with every ENI attached to it (excluded ones included).
    Known {
        instance: Option<&'a Instance>,
        enis: &'a [NetworkInterface],
    },
}

/// The EC2 view the engine plans against, borrowed from the runtime's cache.
#[derive(Clone, Copy, Debug)]
pub struct Ec2View<'a> {
    pub instance: InstanceView<'a>,
    /// Limits of the node's instance type; `None` when unknown (no plan, explicit error).
    pub limits: Option<&'a InstanceTypeLimits>,
    pub subnets: &'a BTreeMap<String, Subnet>,
    pub vpcs: &'a BTreeMap<String, Vpc>,
    pub security_groups: &'a BTreeMap<String, SecurityGroup>,
    pub route_tables: &'a [RouteTable],
    /// Subnets that recently had no room for a /28, with when that was seen.
    pub prefix_cooldown: &'a BTreeMap<String, Instant>,
    /// The operator's `--subnet-*-filter`: the only subnets new ENIs and addresses may use
    /// (`None`: any). Never narrows what is known of the node's ENIs.
    pub pod_subnets: Option<&'a BTreeSet<String>>,
}

impl Ec2View<'_> {
    /// New ENIs and addresses may go in this subnet (the operator's subnet filters).
    pub fn is_pod_subnet(&self, subnet_id: &str) -> bool {
        self.pod_subnets.is_none_or(|s| s.contains(subnet_id))
    }
}

/// Why a node cannot be served: becomes `status.ipam.operator-status.error`, an Event reason
/// and an `errors by reason` metric label.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ProblemReason {
    /// `spec.instance-id` is empty.
    MissingInstanceId,
    /// A number in `spec.ipam` is negative, or a field is otherwise unusable.
    InvalidSpec,
    /// The instance is not known to EC2 (yet).
    InstanceNotFound,
    /// The instance is shutting down or terminated.
    InstanceGone,
    /// `DescribeInstanceTypes` does not know the instance type.
    UnknownInstanceType,
    /// No subnet matches the node's selectors / VPC / AZ, or all are full.
    NoMatchingSubnet,
    /// No security group could be determined.
    NoSecurityGroups,
    /// VPC or subnet data needed for `status.eni.enis` is missing from the cache.
    IncompleteEc2Data,
    /// The node needs addresses but every ENI is full and no interface slot is free.
    AtCapacity,
    /// The last EC2 call for the node failed (set by the runtime).
    Ec2Error,
    /// `spec.ipam.static-ip-tags` is set and no unassociated Elastic IP carries them (set by
    /// the runtime's static-IP step; nothing is allocated until one is found, as in Cilium).
    NoStaticIp,
    /// Free Elastic IPs carry the node's `static-ip-tags` but not `--static-ip-required-tag`:
    /// they are never associated (an agent chooses only among the addresses the operator may
    /// use).
    StaticIpNotAllowed,
    /// Another allocator (Cilium's operator) serves the node: we leave it alone
    /// ([`handover`]).
    OtherAllocatorActive,
    /// The node's CiliumNode is being deleted and our finalizer cannot finish (an EC2 or API
    /// error, e.g. a missing IAM permission): retried until the grace period, then let go.
    FinalizerBlocked,
    /// No Node of the CiliumNode's name exists: it is not served (§15).
    NoNode,
    /// The Node of the CiliumNode's name names another instance (§15).
    InstanceMismatch,
    /// Another live CiliumNode names the same instance: served through neither (§15).
    InstanceNamedTwice,
    /// EC2 shows the instance without this cluster's tag (§15).
    NotClusterInstance,
    /// Cilium operator's Lease cannot be read: a node not handed over yet waits (§16).
    CiliumLeaseUnreadable,
    /// Cilium's running operator is older than `ipam.cilium.io/ignore` (or its release cannot
    /// be told): the annotation would not keep it off the node, so we keep off it
    /// ([`cilium_version`]).
    CiliumIgnoresAnnotation,
}

impl ProblemReason {
    /// CamelCase name, used as Event reason and metrics label.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::MissingInstanceId => "MissingInstanceId",
            Self::InvalidSpec => "InvalidSpec",
            Self::InstanceNotFound => "InstanceNotFound",
            Self::InstanceGone => "InstanceGone",
            Self::UnknownInstanceType => "UnknownInstanceType",
            Self::NoMatchingSubnet => "NoMatchingSubnet",
            Self::NoSecurityGroups => "NoSecurityGroups",
            Self::IncompleteEc2Data => "IncompleteEc2Data",
            Self::AtCapacity => "AtCapacity",
            Self::Ec2Error => "Ec2Error",
            Self::NoStaticIp => "NoStaticIp",
            Self::StaticIpNotAllowed => "StaticIpNotAllowed",
            Self::OtherAllocatorActive => "OtherAllocatorActive",
            Self::FinalizerBlocked => "FinalizerBlocked",
            Self::NoNode => "NoNode",
            Self::InstanceMismatch => "InstanceMismatch",
            Self::InstanceNamedTwice => "InstanceNamedTwice",
            Self::NotClusterInstance => "NotClusterInstance",
            Self::CiliumLeaseUnreadable => "CiliumLeaseUnreadable",
            Self::CiliumIgnoresAnnotation => "CiliumIgnoresAnnotation",
        }
    }
}

/// A reason the node cannot be (fully) served, with a message for humans.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    pub reason: ProblemReason,
    pub message: String,
}

/// Addresses to take off one ENI.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Release {
    pub eni_id: String,
    pub ips: Vec<Ipv4Addr>,
    pub prefixes: Vec<Ipv4Net>,
}

impl Release {
    /// Its CIDRs as a multi-pool agent names them: each /28, each single address as a /32.
    pub fn cidrs(&self) -> impl Iterator<Item = Ipv4Net> + '_ {
        let ips = self.ips.iter().map(|ip| Ipv4Net::from(*ip));
        self.prefixes.iter().map(Ipv4Net::trunc).chain(ips)
    }
}

/// A new ENI: the create attempts in order, then attach and delete-on-termination.
#[derive(Clone, Debug, PartialEq)]
pub struct CreateEni {
    pub instance_id: String,
    pub device_index: u32,
    /// Try in order; move to the next only when one fails for lack of an aligned /28
    /// (other subnets with prefixes first, then single addresses).
    pub attempts: Vec<CreateEniRequest>,
    /// `spec.eni.delete-on-termination` is not explicitly false.
    pub delete_on_termination: bool,
}

/// Top up an existing ENI.
#[derive(Clone, Debug, PartialEq)]
pub struct Assign {
    pub eni_id: String,
    pub subnet_id: String,
    pub request: crate::ec2::AddressRequest,
    /// If `request` asks for prefixes and the subnet has no aligned /28: this many single
    /// addresses instead.
    pub fallback_ips: Option<u32>,
}

/// The one EC2 step to take for a node in this pass.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Nothing to do in EC2.
    None,
    Assign(Assign),
    CreateEni(CreateEni),
    /// Unassign acknowledged (classic) or dropped (multi-pool) addresses.
    Release(Release),
}

/// The engine's decision for one node.
#[derive(Clone, Debug, PartialEq)]
pub struct NodePlan {
    pub demand: Demand,
    pub action: Action,
    /// Set when the node cannot be (fully) served.
    pub problem: Option<Problem>,
}

/// What the CiliumNode's operator-owned fields should say.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DesiredState {
    /// `status.eni.enis`: every ENI of the instance. `None` when EC2 data is incomplete: keep
    /// what is published rather than publish a partial ENI (C4).
    pub enis: Option<BTreeMap<String, EniEntry>>,
    /// `spec.ipam.pool`. `None` together with `enis`.
    pub pool: Option<BTreeMap<String, AllocationIp>>,
    /// `status.ipam.release-ips` entries the operator sets (`Some(state)`) or removes (`None`).
    /// Entries not listed are left as they are.
    pub release_ips: BTreeMap<String, Option<String>>,
    /// `status.ipam.operator-status.error`; `None` clears it.
    pub operator_error: Option<String>,
    pub summary: OperatorSummary,
    /// The node's demand on the EC2 view this state was computed from (after the pass's EC2
    /// action); `None` when its watermarks are invalid.
    pub demand: Option<demand::Demand>,
}

/// Which endpoint a write goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Subresource {
    Spec,
    Status,
}

/// One JSON merge patch, for the main resource or `/status`.
#[derive(Clone, Debug, PartialEq)]
pub struct Write {
    pub subresource: Subresource,
    pub patch: serde_json::Value,
    /// Carry `metadata.resourceVersion` (optimistic concurrency): set when the write touches
    /// `release-ips`, which agents write too.
    pub needs_resource_version: bool,
}

/// The writes that take the CiliumNode from its current state to the desired one, in the order
/// C1 requires (pool removals, then status, then pool additions). Empty: nothing to write.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ChangeSet {
    pub writes: Vec<Write>,
}

impl ChangeSet {
    pub fn is_empty(&self) -> bool {
        self.writes.is_empty()
    }
}

/// Decide the next EC2 step for one node. Updates `memory` (release bookkeeping) as a side
/// effect; otherwise pure. `pending_pods` feeds surge allocation.
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
/// // One bare primary ENI and the default pre-allocation of 8: top it up with 8 addresses.
/// let plan = plan_node(&node, &view, &config, &mut memory, Instant::now(), 0);
/// assert_eq!(plan.demand.needed, 8);
/// match plan.action {
///     Action::Assign(assign) => assert_eq!(assign.request, AddressRequest::Ips(8)),
///     other => panic!("unexpected {other:?}"),
/// }
/// ```
pub fn plan_node(
    node: &CiliumNode,
    ec2: &Ec2View<'_>,
    config: &IpamConfig,
    memory: &mut NodeMemory,
    now: Instant,
    pending_pods: u32,
) -> NodePlan {
    plan::plan_node(node, ec2, config, memory, now, pending_pods)
}

/// What the node's operator-owned fields should say, given the (updated) EC2 view.
/// `problem` is the plan's (or the executor's) problem, published as operator-status.
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
/// enis[0].secondary_ips = vec!["10.0.0.11".parse().unwrap(), "10.0.0.12".parse().unwrap()];
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
/// let eni = &desired.enis.as_ref().unwrap()["eni-0"];
/// assert_eq!(eni.addresses, ["10.0.0.11", "10.0.0.12"]);
/// assert_eq!(eni.vpc.primary_cidr, "10.0.0.0/16");
/// assert_eq!(desired.pool.as_ref().unwrap()["10.0.0.11"].resource, "eni-0");
/// assert_eq!(desired.operator_error, None);
/// ```
pub fn desired_state(
    node: &CiliumNode,
    ec2: &Ec2View<'_>,
    config: &IpamConfig,
    memory: &NodeMemory,
    problem: Option<&Problem>,
) -> DesiredState {
    writeback::desired_state(node, ec2, config, memory, problem)
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
    writeback::changes(node, desired)
}
