//! Why a node cannot be (fully) served: one reason per cause, with a message for humans.

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
    /// ([`super::handover`]).
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
    /// ([`super::cilium_version`]).
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
