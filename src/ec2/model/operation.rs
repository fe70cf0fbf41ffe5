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

/// AWS's throttling buckets (per account and Region), one per action, as documented in
/// "Request throttling for the Amazon EC2 API"
/// (docs.aws.amazon.com/ec2/latest/devguide/ec2-api-throttling.html): "each API is evaluated
/// individually ... Each request that you make removes one token from the API's bucket", and
/// "Limits are applied to individual API actions, not API action categories". Its table gives
/// the sizes: `CreateNetworkInterface`, `DeleteNetworkInterface`, `AssignPrivateIpAddresses`,
/// `UnassignPrivateIpAddresses` and `ModifyNetworkInterfaceAttribute` are "uncategorized
/// actions" of 100 tokens refilled at 5 a second; the other mutating actions we call (attach,
/// detach, associate, disassociate) are "mutating actions", 50 at 5; the describes (always
/// filtered or paginated) "non-mutating actions", 100 at 20. The page's category figures are
/// each action's own bucket, not one shared by the category.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Bucket {
    DescribeInstanceTypes,
    DescribeInstances,
    DescribeNetworkInterfaces,
    DescribeSubnets,
    DescribeVpcs,
    DescribeSecurityGroups,
    DescribeRouteTables,
    DescribeAddresses,
    CreateNetworkInterface,
    AttachNetworkInterface,
    ModifyNetworkInterfaceAttribute,
    AssignPrivateIpAddresses,
    UnassignPrivateIpAddresses,
    DetachNetworkInterface,
    DeleteNetworkInterface,
    AssociateAddress,
    DisassociateAddress,
}

/// Names of the shared buckets of earlier versions (`--ec2-bucket`, ec2-sim's `--bucket`):
/// each still sets every bucket it was split into.
pub const BUCKET_GROUPS: [(&str, &[Bucket]); 2] = [
    // The describes come first in `Bucket::ALL`.
    ("describe", Bucket::ALL.split_at(8).0),
    (
        "general-mutating",
        &[
            Bucket::AttachNetworkInterface,
            Bucket::DetachNetworkInterface,
            Bucket::AssociateAddress,
            Bucket::DisassociateAddress,
        ],
    ),
];

impl Bucket {
    pub const ALL: [Bucket; 17] = [
        Bucket::DescribeInstanceTypes,
        Bucket::DescribeInstances,
        Bucket::DescribeNetworkInterfaces,
        Bucket::DescribeSubnets,
        Bucket::DescribeVpcs,
        Bucket::DescribeSecurityGroups,
        Bucket::DescribeRouteTables,
        Bucket::DescribeAddresses,
        Bucket::CreateNetworkInterface,
        Bucket::AttachNetworkInterface,
        Bucket::ModifyNetworkInterfaceAttribute,
        Bucket::AssignPrivateIpAddresses,
        Bucket::UnassignPrivateIpAddresses,
        Bucket::DetachNetworkInterface,
        Bucket::DeleteNetworkInterface,
        Bucket::AssociateAddress,
        Bucket::DisassociateAddress,
    ];

    /// AWS's published (burst, refill per second) for this bucket.
    pub const fn aws_default(self) -> (u32, u32) {
        match self {
            Bucket::DescribeInstanceTypes
            | Bucket::DescribeInstances
            | Bucket::DescribeNetworkInterfaces
            | Bucket::DescribeSubnets
            | Bucket::DescribeVpcs
            | Bucket::DescribeSecurityGroups
            | Bucket::DescribeRouteTables
            | Bucket::DescribeAddresses => (100, 20),
            Bucket::AttachNetworkInterface
            | Bucket::DetachNetworkInterface
            | Bucket::AssociateAddress
            | Bucket::DisassociateAddress => (50, 5),
            Bucket::CreateNetworkInterface
            | Bucket::ModifyNetworkInterfaceAttribute
            | Bucket::AssignPrivateIpAddresses
            | Bucket::UnassignPrivateIpAddresses
            | Bucket::DeleteNetworkInterface => (100, 5),
        }
    }

    pub const fn name(self) -> &'static str {
        match self {
            Bucket::DescribeInstanceTypes => "describe-instance-types",
            Bucket::DescribeInstances => "describe-instances",
            Bucket::DescribeNetworkInterfaces => "describe-network-interfaces",
            Bucket::DescribeSubnets => "describe-subnets",
            Bucket::DescribeVpcs => "describe-vpcs",
            Bucket::DescribeSecurityGroups => "describe-security-groups",
            Bucket::DescribeRouteTables => "describe-route-tables",
            Bucket::DescribeAddresses => "describe-addresses",
            Bucket::CreateNetworkInterface => "create-network-interface",
            Bucket::AttachNetworkInterface => "attach-network-interface",
            Bucket::ModifyNetworkInterfaceAttribute => "modify-network-interface-attribute",
            Bucket::AssignPrivateIpAddresses => "assign-private-ip-addresses",
            Bucket::UnassignPrivateIpAddresses => "unassign-private-ip-addresses",
            Bucket::DetachNetworkInterface => "detach-network-interface",
            Bucket::DeleteNetworkInterface => "delete-network-interface",
            Bucket::AssociateAddress => "associate-address",
            Bucket::DisassociateAddress => "disassociate-address",
        }
    }

    /// The buckets a name sets: one by its [`Bucket::name`], or a group of [`BUCKET_GROUPS`].
    pub fn named(name: &str) -> Option<Vec<Bucket>> {
        if let Some(b) = Bucket::ALL.into_iter().find(|b| b.name() == name) {
            return Some(vec![b]);
        }
        BUCKET_GROUPS
            .iter()
            .find(|(group, _)| *group == name)
            .map(|(_, buckets)| buckets.to_vec())
    }

    /// Every name [`Bucket::named`] knows, for error messages.
    pub fn known_names() -> Vec<&'static str> {
        Bucket::ALL
            .iter()
            .map(|b| b.name())
            .chain(BUCKET_GROUPS.iter().map(|(g, _)| *g))
            .collect()
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

    /// The AWS bucket this action draws from: its own (we always filter or paginate
    /// describes, so they draw from the larger one).
    pub const fn bucket(self) -> Bucket {
        match self {
            Operation::DescribeInstanceTypes => Bucket::DescribeInstanceTypes,
            Operation::DescribeInstances => Bucket::DescribeInstances,
            Operation::DescribeNetworkInterfaces => Bucket::DescribeNetworkInterfaces,
            Operation::DescribeSubnets => Bucket::DescribeSubnets,
            Operation::DescribeVpcs => Bucket::DescribeVpcs,
            Operation::DescribeSecurityGroups => Bucket::DescribeSecurityGroups,
            Operation::DescribeRouteTables => Bucket::DescribeRouteTables,
            Operation::DescribeAddresses => Bucket::DescribeAddresses,
            Operation::CreateNetworkInterface => Bucket::CreateNetworkInterface,
            Operation::AttachNetworkInterface => Bucket::AttachNetworkInterface,
            Operation::ModifyNetworkInterfaceAttribute => Bucket::ModifyNetworkInterfaceAttribute,
            Operation::AssignPrivateIpAddresses => Bucket::AssignPrivateIpAddresses,
            Operation::UnassignPrivateIpAddresses => Bucket::UnassignPrivateIpAddresses,
            Operation::DetachNetworkInterface => Bucket::DetachNetworkInterface,
            Operation::DeleteNetworkInterface => Bucket::DeleteNetworkInterface,
            Operation::AssociateAddress => Bucket::AssociateAddress,
            Operation::DisassociateAddress => Bucket::DisassociateAddress,
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
        !matches!(
            self,
            Operation::DescribeInstanceTypes
                | Operation::DescribeInstances
                | Operation::DescribeNetworkInterfaces
                | Operation::DescribeSubnets
                | Operation::DescribeVpcs
                | Operation::DescribeSecurityGroups
                | Operation::DescribeRouteTables
                | Operation::DescribeAddresses
        )
    }
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// AWS's table ("Request throttling for the Amazon EC2 API", request token bucket sizes and
    /// refill rates) for each action we call: (bucket maximum capacity, refill per second).
    const DOCUMENTED: [(&str, u32, u32); 17] = [
        ("DescribeInstanceTypes", 100, 20),
        ("DescribeInstances", 100, 20),
        ("DescribeNetworkInterfaces", 100, 20),
        ("DescribeSubnets", 100, 20),
        ("DescribeVpcs", 100, 20),
        ("DescribeSecurityGroups", 100, 20),
        ("DescribeRouteTables", 100, 20),
        ("DescribeAddresses", 100, 20),
        ("CreateNetworkInterface", 100, 5),
        ("AttachNetworkInterface", 50, 5),
        ("ModifyNetworkInterfaceAttribute", 100, 5),
        ("AssignPrivateIpAddresses", 100, 5),
        ("UnassignPrivateIpAddresses", 100, 5),
        ("DetachNetworkInterface", 50, 5),
        ("DeleteNetworkInterface", 100, 5),
        ("AssociateAddress", 50, 5),
        ("DisassociateAddress", 50, 5),
    ];

    #[test]
    fn every_action_we_call_has_a_bucket_of_its_own_of_the_documented_size() {
        for op in Operation::ALL {
            let (_, burst, refill) = DOCUMENTED
                .iter()
                .find(|(name, ..)| *name == op.name())
                .unwrap_or_else(|| panic!("{op} is not in AWS's table"));
            assert_eq!(op.bucket().aws_default(), (*burst, *refill), "{op}");
            let sharing: Vec<_> = Operation::ALL
                .iter()
                .filter(|o| **o != op && o.bucket() == op.bucket())
                .collect();
            assert!(
                sharing.is_empty(),
                "{op} shares its bucket with {sharing:?}"
            );
        }
    }
}
