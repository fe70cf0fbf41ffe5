//! The EC2 actions the operator calls and the AWS throttling bucket of each.

use std::fmt;

/// The EC2 actions the operator calls. The gate meters each against its AWS bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Operation {
    DescribeInstanceTypes,
    DescribeInstances,
    DescribeNetworkInterfaces,
    DescribeSubnets,
    DescribeVpcs,
    DescribeSecurityGroups,
    DescribeRouteTables,
    CreateNetworkInterface,
    AttachNetworkInterface,
    ModifyNetworkInterfaceAttribute,
    AssignPrivateIpAddresses,
    UnassignPrivateIpAddresses,
    DetachNetworkInterface,
    DeleteNetworkInterface,
    // Static IPs (Elastic IPs), spec.ipam.static-ip-tags.
    DescribeAddresses,
    AssociateAddress,
    DisassociateAddress,
}

/// AWS's throttling buckets (per account and Region), as documented in "Request throttling for
/// the Amazon EC2 API". Several actions share a bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Bucket {
    /// Filtered or paginated non-mutating calls: 100 burst, 20/s.
    Describe,
    /// Mutating actions without a bucket of their own (attach, detach): 50 burst, 5/s.
    GeneralMutating,
    CreateNetworkInterface,
    AssignPrivateIpAddresses,
    UnassignPrivateIpAddresses,
    ModifyNetworkInterfaceAttribute,
    DeleteNetworkInterface,
}

impl Bucket {
    pub const ALL: [Bucket; 7] = [
        Bucket::Describe,
        Bucket::GeneralMutating,
        Bucket::CreateNetworkInterface,
        Bucket::AssignPrivateIpAddresses,
        Bucket::UnassignPrivateIpAddresses,
        Bucket::ModifyNetworkInterfaceAttribute,
        Bucket::DeleteNetworkInterface,
    ];

    /// AWS's published (burst, refill per second) for this bucket.
    pub const fn aws_default(self) -> (u32, u32) {
        match self {
            Bucket::Describe => (100, 20),
            Bucket::GeneralMutating => (50, 5),
            _ => (100, 5),
        }
    }

    pub const fn name(self) -> &'static str {
        match self {
            Bucket::Describe => "describe",
            Bucket::GeneralMutating => "general-mutating",
            Bucket::CreateNetworkInterface => "create-network-interface",
            Bucket::AssignPrivateIpAddresses => "assign-private-ip-addresses",
            Bucket::UnassignPrivateIpAddresses => "unassign-private-ip-addresses",
            Bucket::ModifyNetworkInterfaceAttribute => "modify-network-interface-attribute",
            Bucket::DeleteNetworkInterface => "delete-network-interface",
        }
    }
}

impl Operation {
    pub const ALL: [Operation; 17] = [
        Operation::DescribeInstanceTypes,
        Operation::DescribeInstances,
        Operation::DescribeNetworkInterfaces,
        Operation::DescribeSubnets,
        Operation::DescribeVpcs,
        Operation::DescribeSecurityGroups,
        Operation::DescribeRouteTables,
        Operation::CreateNetworkInterface,
        Operation::AttachNetworkInterface,
        Operation::ModifyNetworkInterfaceAttribute,
        Operation::AssignPrivateIpAddresses,
        Operation::UnassignPrivateIpAddresses,
        Operation::DetachNetworkInterface,
        Operation::DeleteNetworkInterface,
        Operation::DescribeAddresses,
        Operation::AssociateAddress,
        Operation::DisassociateAddress,
    ];

    /// The AWS action name, also the `operation` metrics label.
    pub const fn name(self) -> &'static str {
        match self {
            Operation::DescribeInstanceTypes => "DescribeInstanceTypes",
            Operation::DescribeInstances => "DescribeInstances",
            Operation::DescribeNetworkInterfaces => "DescribeNetworkInterfaces",
            Operation::DescribeSubnets => "DescribeSubnets",
            Operation::DescribeVpcs => "DescribeVpcs",
            Operation::DescribeSecurityGroups => "DescribeSecurityGroups",
            Operation::DescribeRouteTables => "DescribeRouteTables",
            Operation::CreateNetworkInterface => "CreateNetworkInterface",
            Operation::AttachNetworkInterface => "AttachNetworkInterface",
            Operation::ModifyNetworkInterfaceAttribute => "ModifyNetworkInterfaceAttribute",
            Operation::AssignPrivateIpAddresses => "AssignPrivateIpAddresses",
            Operation::UnassignPrivateIpAddresses => "UnassignPrivateIpAddresses",
            Operation::DetachNetworkInterface => "DetachNetworkInterface",
            Operation::DeleteNetworkInterface => "DeleteNetworkInterface",
            Operation::DescribeAddresses => "DescribeAddresses",
            Operation::AssociateAddress => "AssociateAddress",
            Operation::DisassociateAddress => "DisassociateAddress",
        }
    }

    /// The AWS bucket this action draws from (we always filter or paginate describes).
    pub const fn bucket(self) -> Bucket {
        match self {
            Operation::DescribeInstanceTypes
            | Operation::DescribeInstances
            | Operation::DescribeNetworkInterfaces
            | Operation::DescribeSubnets
            | Operation::DescribeVpcs
            | Operation::DescribeSecurityGroups
            | Operation::DescribeRouteTables
            | Operation::DescribeAddresses => Bucket::Describe,
            // AWS lists no bucket of their own for the address actions: they draw from the
            // general mutating one ("Request throttling for the Amazon EC2 API").
            Operation::AttachNetworkInterface
            | Operation::DetachNetworkInterface
            | Operation::AssociateAddress
            | Operation::DisassociateAddress => Bucket::GeneralMutating,
            Operation::CreateNetworkInterface => Bucket::CreateNetworkInterface,
            Operation::ModifyNetworkInterfaceAttribute => Bucket::ModifyNetworkInterfaceAttribute,
            Operation::AssignPrivateIpAddresses => Bucket::AssignPrivateIpAddresses,
            Operation::UnassignPrivateIpAddresses => Bucket::UnassignPrivateIpAddresses,
            Operation::DeleteNetworkInterface => Bucket::DeleteNetworkInterface,
        }
    }

    /// Whether repeating a call whose answer was lost (timeout, 5xx) is harmless. AWS may have
    /// carried out such a call ("a timeout can hide a call that took effect"). Assign carries
    /// no idempotency token: a repeat of one that took effect assigns the addresses twice.
    /// Attach has none either: a repeat of one that took effect is refused ("in use"). Their
    /// callers look at the ENI instead. AssociateAddress (AllowReassociation false) is refused
    /// once it took effect (`Resource.AlreadyAssociated`): its caller describes the address.
    /// Throttled answers were not carried out: always repeatable.
    pub const fn repeatable_after_lost_answer(self) -> bool {
        !matches!(
            self,
            Operation::AssignPrivateIpAddresses
                | Operation::AttachNetworkInterface
                | Operation::AssociateAddress
        )
    }

    pub const fn is_mutating(self) -> bool {
        !matches!(self.bucket(), Bucket::Describe)
    }
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
