//! What the watches hand the event loop: one [`NodeInput`] per change of a CiliumNode, a Node
//! or a node's pending pods. Plain data, so the loop can be driven without Kubernetes (tests,
//! the benchmark, the simulation push these into the core's channel).

use std::net::Ipv4Addr;

use crate::crd::CiliumNode;
use crate::k8s::sink::NodeRef;

/// What the sources tell the core.
#[derive(Clone, Debug)]
pub enum NodeInput {
    /// A CiliumNode was added or changed (parsed).
    Upsert(Box<CiliumNode>),
    /// A CiliumNode that does not parse: report it on that object only.
    Invalid(InvalidNode),
    /// The CiliumNode object is gone.
    Deleted(String),
    /// Whether the Kubernetes Node of that name exists.
    NodePresent { name: String, present: bool },
    /// Pending pods scheduled to the node (surge allocation).
    PendingPods { name: String, count: u32 },
    /// What the Node of that name says about its instance (`None`: the Node was deleted);
    /// taken by the identity table (`Nodes` in the reconcile wing), not by the slots.
    NodeFacts {
        name: String,
        facts: Option<NodeFacts>,
    },
    /// The Node watch's listing is complete: a name it did not show has no Node.
    NodesListed,
    /// The CiliumNode watch's listing is complete: every node present at the start is in (the
    /// first EC2 listing need not wait for more nodes to learn their VPC, `event_loop::start`).
    CiliumNodesListed,
}

/// A CiliumNode that does not parse: what its metadata (and a lenient read) still tell, so its
/// deletion and our finalizer are handled all the same.
#[derive(Clone, Debug)]
pub struct InvalidNode {
    pub node: NodeRef,
    pub error: String,
    /// It carries a `deletionTimestamp`.
    pub deleting: bool,
    /// `spec.instance-id` when that field is readable, else empty.
    pub instance_id: String,
}

/// What a Node says about its instance.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeFacts {
    /// From `spec.providerID`.
    pub instance: Option<String>,
    /// `status.addresses` of type InternalIP.
    pub internal_ips: Vec<Ipv4Addr>,
}
