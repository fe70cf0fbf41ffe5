//! EC2 domain types: what the operator knows of AWS, independent of the SDK.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use ipnet::Ipv4Net;

/// EC2 tags (key -> value).
pub type Tags = BTreeMap<String, String>;

/// Size of a /28 prefix in addresses.
pub const PREFIX_SIZE: u32 = 16;

mod operation;
pub use operation::{Bucket, Operation};

/// An Elastic IP (`DescribeAddresses`), as static IPs use it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Address {
    pub allocation_id: String,
    pub public_ip: Ipv4Addr,
    /// Set while the address is associated.
    pub association_id: Option<String>,
    pub network_interface_id: Option<String>,
    pub private_ip: Option<Ipv4Addr>,
    pub tags: Tags,
}

/// One page of a paginated describe.
#[derive(Clone, Debug, PartialEq)]
pub struct Page<T> {
    pub items: Vec<T>,
    /// Token for the next page; `None` on the last page.
    pub next_token: Option<String>,
}

impl<T> Page<T> {
    pub fn last(items: Vec<T>) -> Self {
        Self {
            items,
            next_token: None,
        }
    }
}

/// Per-instance-type network limits (`DescribeInstanceTypes`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InstanceTypeLimits {
    pub instance_type: String,
    /// `NetworkInfo.MaximumNetworkInterfaces`.
    pub max_enis: u32,
    /// `NetworkInfo.Ipv4AddressesPerInterface` (primary included).
    pub ipv4_per_eni: u32,
    /// `NetworkInfo.Ipv6AddressesPerInterface`.
    pub ipv6_per_eni: u32,
    /// `Hypervisor == nitro`.
    pub nitro: bool,
    pub bare_metal: bool,
    /// `NetworkInfo.NetworkCards[].MaximumNetworkInterfaces` by `NetworkCardIndex` (empty: one
    /// card that takes every interface). p5.48xlarge: 32 cards of 2 interfaces each, 64 in all.
    pub enis_per_card: Vec<u32>,
}

impl InstanceTypeLimits {
    /// How many interfaces network card `card` takes.
    pub fn card_max_enis(&self, card: u32) -> u32 {
        match self.enis_per_card.as_slice() {
            [] if card == 0 => self.max_enis,
            [] => 0,
            cards => cards.get(card as usize).copied().unwrap_or(0),
        }
    }

    /// The interfaces pod ENIs may use: network card 0's, where they are attached (§5.1; Cilium
    /// attaches without a `NetworkCardIndex` too, which EC2 takes as card 0). Counting the
    /// whole instance's `MaximumNetworkInterfaces` would plan device indexes card 0 does not
    /// have (64 on a p5.48xlarge whose card 0 takes 2).
    pub fn pod_max_enis(&self) -> u32 {
        self.card_max_enis(0).min(self.max_enis)
    }

    /// /28 prefix delegation is available on Nitro and bare-metal types.
    pub fn supports_prefix_delegation(&self) -> bool {
        self.nitro || self.bare_metal
    }
}

/// EC2 instance state names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InstanceState {
    Pending,
    Running,
    ShuttingDown,
    Terminated,
    Stopping,
    Stopped,
    Unknown,
}

impl InstanceState {
    pub fn parse(s: &str) -> Self {
        match s {
            "pending" => Self::Pending,
            "running" => Self::Running,
            "shutting-down" => Self::ShuttingDown,
            "terminated" => Self::Terminated,
            "stopping" => Self::Stopping,
            "stopped" => Self::Stopped,
            _ => Self::Unknown,
        }
    }

    /// The instance is gone or going: plan nothing more for it.
    pub fn is_gone(self) -> bool {
        matches!(self, Self::ShuttingDown | Self::Terminated)
    }
}

/// An EC2 instance (`DescribeInstances`).
#[derive(Clone, Debug, PartialEq)]
pub struct Instance {
    pub id: String,
    pub instance_type: String,
    pub state: InstanceState,
    pub availability_zone: String,
    pub vpc_id: String,
    pub subnet_id: String,
    pub tags: Tags,
}

/// A subnet (`DescribeSubnets`).
#[derive(Clone, Debug, PartialEq)]
pub struct Subnet {
    pub id: String,
    pub vpc_id: String,
    pub availability_zone: String,
    pub cidr: Ipv4Net,
    /// `AvailableIpAddressCount`: free single addresses (EC2 does not report free /28 blocks).
    pub available_addresses: u32,
    pub tags: Tags,
}

/// A VPC (`DescribeVpcs`).
#[derive(Clone, Debug, PartialEq)]
pub struct Vpc {
    pub id: String,
    pub primary_cidr: Ipv4Net,
    /// Associated IPv4 CIDR blocks other than the primary.
    pub secondary_cidrs: Vec<Ipv4Net>,
}

/// A security group (`DescribeSecurityGroups`).
#[derive(Clone, Debug, PartialEq)]
pub struct SecurityGroup {
    pub id: String,
    pub vpc_id: String,
    pub tags: Tags,
}

/// A route table (`DescribeRouteTables`): only which subnets it serves.
#[derive(Clone, Debug, PartialEq)]
pub struct RouteTable {
    pub id: String,
    pub vpc_id: String,
    /// The VPC's main table also serves every subnet without an explicit association.
    pub main: bool,
    pub subnet_ids: Vec<String>,
}

/// `Status` of a network interface.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EniState {
    Available,
    Attaching,
    InUse,
    Detaching,
    Unknown,
}

impl EniState {
    pub fn parse(s: &str) -> Self {
        match s {
            "available" => Self::Available,
            "attaching" => Self::Attaching,
            "in-use" => Self::InUse,
            "detaching" => Self::Detaching,
            _ => Self::Unknown,
        }
    }

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Available => "available",
            Self::Attaching => "attaching",
            Self::InUse => "in-use",
            Self::Detaching => "detaching",
            Self::Unknown => "unknown",
        }
    }
}

/// The attachment of an ENI to an instance.
#[derive(Clone, Debug, PartialEq)]
pub struct Attachment {
    pub id: String,
    pub instance_id: String,
    pub device_index: u32,
    pub delete_on_termination: bool,
    /// `NetworkCardIndex` (0 on single-card types). Device indexes count per card: on a p5
    /// every one of the 32 cards has a device index 0.
    pub network_card_index: u32,
}

/// `InterfaceType` of a network interface. Only [`InterfaceType::Interface`] ENIs serve pods:
/// an `efa` interface is an EFA device (with ENA addresses) for the workload's own traffic, an
/// `efa-only` one has no IP address at all; `trunk`, `branch` and the managed kinds are not
/// ours to use either.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum InterfaceType {
    #[default]
    Interface,
    Efa,
    EfaOnly,
    /// Any other kind, as EC2 names it.
    Other(String),
}

impl InterfaceType {
    pub fn parse(s: &str) -> Self {
        match s {
            "" | "interface" => Self::Interface,
            "efa" => Self::Efa,
            "efa-only" => Self::EfaOnly,
            other => Self::Other(other.to_string()),
        }
    }

    pub fn as_str(&self) -> &str {
        match self {
            Self::Interface => "interface",
            Self::Efa => "efa",
            Self::EfaOnly => "efa-only",
            Self::Other(s) => s,
        }
    }
}

/// A network interface (`DescribeNetworkInterfaces`, `CreateNetworkInterface`).
#[derive(Clone, Debug, PartialEq)]
pub struct NetworkInterface {
    pub id: String,
    pub subnet_id: String,
    pub vpc_id: String,
    pub availability_zone: String,
    pub mac: String,
    pub description: String,
    pub primary_ip: Ipv4Addr,
    /// Secondary private addresses, primary excluded (prefix addresses are not listed here).
    pub secondary_ips: Vec<Ipv4Addr>,
    /// Delegated /28 prefixes.
    pub prefixes: Vec<Ipv4Net>,
    pub ipv6_prefixes: Vec<String>,
    pub security_groups: Vec<String>,
    pub tags: Tags,
    pub state: EniState,
    pub attachment: Option<Attachment>,
    /// Public IP of an associated Elastic IP, if any.
    pub public_ip: Option<String>,
    pub interface_type: InterfaceType,
}

impl NetworkInterface {
    /// An ENA `interface`: the only kind that serves pods (§5.4).
    pub fn serves_pods(&self) -> bool {
        self.interface_type == InterfaceType::Interface
    }

    /// The instance's primary ENI: network card 0, device index 0 (§5.4; each card of a
    /// multi-card type has its own device index 0).
    pub fn is_primary(&self) -> bool {
        self.attachment
            .as_ref()
            .is_some_and(|a| a.device_index == 0 && a.network_card_index == 0)
    }

    /// The network card it is attached on.
    pub fn network_card(&self) -> Option<u32> {
        self.attachment.as_ref().map(|a| a.network_card_index)
    }

    /// Whether every key/value of `selector` is among the ENI's tags (an empty selector matches
    /// nothing: it selects no ENI for exclusion).
    pub fn has_all_tags(&self, selector: &Tags) -> bool {
        !selector.is_empty() && selector.iter().all(|(k, v)| self.tags.get(k) == Some(v))
    }

    pub fn device_index(&self) -> Option<u32> {
        self.attachment.as_ref().map(|a| a.device_index)
    }

    pub fn instance_id(&self) -> Option<&str> {
        self.attachment.as_ref().map(|a| a.instance_id.as_str())
    }
}

/// Filters of `DescribeNetworkInterfaces`. Empty fields do not filter.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EniFilter {
    /// `NetworkInterfaceIds` (never combined with a page size: AWS refuses it).
    pub ids: Vec<String>,
    pub vpc_id: Option<String>,
    /// `attachment.instance-id`.
    pub instance_ids: Vec<String>,
    pub subnet_ids: Vec<String>,
    /// One `tag:<key>` filter per entry.
    pub tags: Tags,
    /// `status`.
    pub state: Option<EniState>,
    /// `addresses.private-ip-address`: an ENI with any of these among its private IPv4
    /// addresses (AWS matches primary and secondary ones; moto only the primary).
    pub private_ips: Vec<Ipv4Addr>,
}

/// Filters of `DescribeInstances`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct InstanceFilter {
    pub ids: Vec<String>,
    pub vpc_id: Option<String>,
    pub tags: Tags,
}

/// Filters of `DescribeSubnets`, `DescribeSecurityGroups`, `DescribeVpcs`, `DescribeRouteTables`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ResourceFilter {
    pub ids: Vec<String>,
    pub vpc_id: Option<String>,
    pub tags: Tags,
}

/// What to put on an ENI in one call: single addresses or /28 prefixes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AddressRequest {
    /// `SecondaryPrivateIpAddressCount`.
    Ips(u32),
    /// `Ipv4PrefixCount`.
    Prefixes(u32),
}

impl AddressRequest {
    /// Addresses this request yields when granted in full.
    pub fn addresses(self) -> u32 {
        match self {
            AddressRequest::Ips(n) => n,
            AddressRequest::Prefixes(n) => n * PREFIX_SIZE,
        }
    }
}

/// The AWS calls one unassign is made of: `UnassignPrivateIpAddresses` takes addresses or
/// prefixes, not both, so one call per non-empty kind, addresses first. Nothing to unassign is
/// no call at all.
pub fn unassign_calls<'a>(
    ips: &'a [Ipv4Addr],
    prefixes: &'a [Ipv4Net],
) -> impl Iterator<Item = (&'a [Ipv4Addr], &'a [Ipv4Net])> {
    let ips = (!ips.is_empty()).then_some((ips, &[][..]));
    let prefixes = (!prefixes.is_empty()).then_some((&[][..], prefixes));
    ips.into_iter().chain(prefixes)
}

/// `CreateNetworkInterface`: everything inline, so a new ENI costs no extra assign call.
#[derive(Clone, Debug, PartialEq)]
pub struct CreateEniRequest {
    pub subnet_id: String,
    pub security_groups: Vec<String>,
    pub description: String,
    /// Set at creation (`TagSpecifications`): ownership is never missing, even after a crash.
    pub tags: Tags,
    /// Addresses or prefixes requested inline (`Ips(0)` requests none).
    pub addresses: AddressRequest,
    /// Idempotency token: the same intent never creates a second ENI.
    pub client_token: String,
}

/// What EC2 reports as assigned by an `AssignPrivateIpAddresses` call. Emulators may list every
/// address of the ENI here: callers merge it as a set, never count it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Assigned {
    pub ips: Vec<Ipv4Addr>,
    pub prefixes: Vec<Ipv4Net>,
}

/// All 16 addresses of a /28 prefix.
pub fn prefix_addresses(prefix: Ipv4Net) -> impl Iterator<Item = Ipv4Addr> {
    let base = u32::from(prefix.network());
    let len = 1u32 << (32 - u32::from(prefix.prefix_len()));
    (0..len).map(move |i| Ipv4Addr::from(base + i))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unassign_is_one_call_per_kind_it_names_addresses_first() {
        let ips = [Ipv4Addr::new(10, 0, 0, 9)];
        let prefixes: [Ipv4Net; 1] = ["10.0.1.16/28".parse().unwrap()];
        let calls: Vec<_> = unassign_calls(&ips, &prefixes).collect();
        assert_eq!(calls, [(&ips[..], &[][..]), (&[][..], &prefixes[..])]);
        assert_eq!(unassign_calls(&[], &prefixes).count(), 1);
        assert_eq!(unassign_calls(&ips, &[]).count(), 1);
        assert_eq!(unassign_calls(&[], &[]).count(), 0, "nothing: no call");
    }
}
