//! Test fixtures for the engine: a small EC2 world and CiliumNode builders.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::time::Instant;

use ipnet::Ipv4Net;

use crate::crd::{CiliumNode, CiliumNodeSpec, CiliumNodeStatus};
use crate::ec2::{
    Attachment, EniState, Instance, InstanceState, InstanceTypeLimits, InterfaceType,
    NetworkInterface, RouteTable, SecurityGroup, Subnet, Tags, Vpc,
};

use super::{Ec2View, InstanceView};

pub const INSTANCE: &str = "i-1";
pub const VPC: &str = "vpc-1";
pub const AZ: &str = "az-1";

pub fn ip(s: &str) -> Ipv4Addr {
    s.parse().unwrap()
}

pub fn net(s: &str) -> Ipv4Net {
    s.parse().unwrap()
}

pub fn tags(pairs: &[(&str, &str)]) -> Tags {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

pub fn limits(max_enis: u32, ipv4_per_eni: u32, nitro: bool) -> InstanceTypeLimits {
    InstanceTypeLimits {
        instance_type: "t.test".into(),
        max_enis,
        ipv4_per_eni,
        ipv6_per_eni: 0,
        nitro,
        bare_metal: false,
        enis_per_card: Vec::new(),
    }
}

/// An attached ENI of [`INSTANCE`] without secondary addresses.
pub fn eni(id: &str, device_index: u32, subnet: &str) -> NetworkInterface {
    NetworkInterface {
        id: id.into(),
        subnet_id: subnet.into(),
        vpc_id: VPC.into(),
        availability_zone: AZ.into(),
        mac: format!("02:00:00:00:00:{device_index:02x}"),
        description: String::new(),
        primary_ip: Ipv4Addr::new(10, 0, 255, device_index as u8 + 1),
        secondary_ips: vec![],
        prefixes: vec![],
        ipv6_prefixes: vec![],
        security_groups: vec![format!("sg-{device_index}")],
        tags: Tags::new(),
        state: EniState::InUse,
        attachment: Some(Attachment {
            id: format!("attach-{id}"),
            instance_id: INSTANCE.into(),
            device_index,
            delete_on_termination: true,
            network_card_index: 0,
        }),
        public_ip: None,
        interface_type: InterfaceType::Interface,
    }
}

/// An ENI with `n` single secondary addresses 10.0.<100+index>.1...
pub fn eni_with_ips(id: &str, device_index: u32, subnet: &str, n: u32) -> NetworkInterface {
    let mut e = eni(id, device_index, subnet);
    e.secondary_ips = (0..n)
        .map(|i| Ipv4Addr::new(10, 0, 100 + device_index as u8, i as u8 + 1))
        .collect();
    e
}

pub fn subnet(id: &str, cidr: &str, free: u32) -> Subnet {
    Subnet {
        id: id.into(),
        vpc_id: VPC.into(),
        availability_zone: AZ.into(),
        cidr: net(cidr),
        available_addresses: free,
        tags: Tags::new(),
    }
}

pub fn sg(id: &str, pairs: &[(&str, &str)]) -> SecurityGroup {
    SecurityGroup {
        id: id.into(),
        vpc_id: VPC.into(),
        tags: tags(pairs),
    }
}

/// A classic node on [`INSTANCE`] in subnet-a, first-interface-index 0.
pub fn node() -> CiliumNode {
    let mut spec = CiliumNodeSpec {
        instance_id: INSTANCE.into(),
        ..Default::default()
    };
    spec.eni.vpc_id = VPC.into();
    spec.eni.availability_zone = AZ.into();
    spec.eni.node_subnet_id = "subnet-a".into();
    spec.eni.first_interface_index = Some(0);
    spec.eni.instance_type = "t.test".into();
    let mut n = CiliumNode::new("node-1", spec);
    n.status = Some(CiliumNodeStatus::default());
    n
}

/// Whether the instance is in the cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Presence {
    Known,
    Unknown,
    Gone,
}

/// An owned EC2 world; [`World::view`] borrows it as the engine sees it.
#[derive(Clone, Debug)]
pub struct World {
    pub presence: Presence,
    pub instance: Instance,
    pub enis: Vec<NetworkInterface>,
    pub limits: Option<InstanceTypeLimits>,
    pub subnets: BTreeMap<String, Subnet>,
    pub vpcs: BTreeMap<String, Vpc>,
    pub security_groups: BTreeMap<String, SecurityGroup>,
    pub route_tables: Vec<RouteTable>,
    pub cooldown: BTreeMap<String, Instant>,
    /// The operator's subnet filters (`None`: none).
    pub pod_subnets: Option<std::collections::BTreeSet<String>>,
}

impl World {
    /// m5.large-like limits (3 ENIs, 10 addresses), the primary ENI in subnet-a (free 100), and
    /// subnet-b (free 200) sharing the main route table.
    pub fn new() -> Self {
        let subnets = [
            subnet("subnet-a", "10.0.0.0/20", 100),
            subnet("subnet-b", "10.0.16.0/20", 200),
        ]
        .into_iter()
        .map(|s| (s.id.clone(), s))
        .collect();
        let vpcs = BTreeMap::from([(
            VPC.to_string(),
            Vpc {
                id: VPC.into(),
                primary_cidr: net("10.0.0.0/16"),
                secondary_cidrs: vec![net("100.64.0.0/16")],
            },
        )]);
        Self {
            presence: Presence::Known,
            instance: Instance {
                id: INSTANCE.into(),
                instance_type: "t.test".into(),
                state: InstanceState::Running,
                availability_zone: AZ.into(),
                vpc_id: VPC.into(),
                subnet_id: "subnet-a".into(),
                tags: Tags::new(),
            },
            enis: vec![eni("eni-0", 0, "subnet-a")],
            limits: Some(limits(3, 10, true)),
            subnets,
            vpcs,
            security_groups: BTreeMap::new(),
            route_tables: vec![RouteTable {
                id: "rtb-main".into(),
                vpc_id: VPC.into(),
                main: true,
                subnet_ids: vec![],
            }],
            cooldown: BTreeMap::new(),
            pod_subnets: None,
        }
    }

    pub fn add_subnet(&mut self, s: Subnet) {
        self.subnets.insert(s.id.clone(), s);
    }

    pub fn view(&self) -> Ec2View<'_> {
        Ec2View {
            instance: match self.presence {
                Presence::Known => InstanceView::Known {
                    instance: Some(&self.instance),
                    enis: &self.enis,
                },
                Presence::Unknown => InstanceView::Unknown,
                Presence::Gone => InstanceView::Gone,
            },
            limits: self.limits.as_ref(),
            subnets: &self.subnets,
            vpcs: &self.vpcs,
            security_groups: &self.security_groups,
            route_tables: &self.route_tables,
            prefix_cooldown: &self.cooldown,
            pod_subnets: self.pod_subnets.as_ref(),
        }
    }
}
