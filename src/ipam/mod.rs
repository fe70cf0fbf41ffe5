//! The IPAM engine: pure decisions for one node, no I/O.
//!
//! Given a node's [`CiliumNode`](crate::crd::CiliumNode), the EC2 view of its instance
//! ([`Ec2View`]) and the operator's settings ([`IpamConfig`]), the engine decides what to do
//! next ([`plan_node`] -> [`NodePlan`]) and what the CiliumNode should say afterwards
//! ([`desired_state`] -> [`DesiredState`]), then which writes that takes ([`changes`] ->
//! [`ChangeSet`]). The runtime executes the action, applies its result to the cache, and
//! writes the change set. Nothing here calls EC2 or Kubernetes, so every rule is tested with
//! plain values.
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
mod problem;
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

use crate::crd::{AllocationIp, EniEntry, OperatorSummary};
use crate::ec2::{
    CreateEniRequest, Instance, InstanceTypeLimits, NetworkInterface, RouteTable, SecurityGroup,
    Subnet, Tags, Vpc,
};

pub use demand::{Demand, Generation};
pub use plan::plan_node;
pub use problem::{Problem, ProblemReason};
pub use release::NodeMemory;
pub use writeback::{changes, desired_state};

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
