//! The simulated cluster the runtime tests run in: one VPC (10.0.0.0/16) with a /18 subnet in
//! `zone-a`, one security group and a main route table in the simulator, m5.large nodes, and
//! their CiliumNodes as a classic agent writes them at start (Cilium's `pkg/nodediscovery`
//! fills `spec.eni` from the instance metadata; the pool is the operator's to fill).

use eni_operator::crd::{CiliumNode, IpamPoolDemand, IpamPoolRequest};
use eni_operator::ec2::{Instance, Tags};

use crate::sim::Simulator;

/// The simulator and the ids of what [`Cluster::new`] created in it.
#[derive(Clone)]
pub struct Cluster {
    pub sim: Simulator,
    pub vpc: String,
    pub subnet: String,
    pub sg: String,
}

/// The ids of a VPC with one subnet and one security group, as [`network`] creates them.
pub struct Network {
    pub vpc: String,
    pub subnet: String,
    pub sg: String,
}

/// A VPC of `vpc_cidr` in `sim`, one untagged subnet of `subnet_cidr` in `zone` and one untagged
/// security group (created in that order).
pub fn network(sim: &Simulator, vpc_cidr: &str, zone: &str, subnet_cidr: &str) -> Network {
    let vpc = sim.add_vpc(vpc_cidr.parse().expect("a VPC CIDR"), &[]);
    let subnet = sim.add_subnet(
        &vpc,
        zone,
        subnet_cidr.parse().expect("a subnet CIDR"),
        Tags::new(),
    );
    let sg = sim.add_security_group(&vpc, Tags::new());
    Network { vpc, subnet, sg }
}

impl Cluster {
    pub fn new() -> Self {
        let sim = Simulator::new();
        let Network { vpc, subnet, sg } = network(&sim, "10.0.0.0/16", "zone-a", "10.0.0.0/18");
        sim.add_route_table(&vpc, true, &[]);
        Self {
            sim,
            vpc,
            subnet,
            sg,
        }
    }

    /// Another untagged subnet of `cidr` in the VPC, in `zone-a`.
    pub fn add_subnet(&self, cidr: &str) -> String {
        let cidr = cidr.parse().expect("a subnet CIDR");
        self.sim.add_subnet(&self.vpc, "zone-a", cidr, Tags::new())
    }

    /// A running m5.large in the subnet, with the security group.
    pub fn instance(&self) -> Instance {
        self.sim
            .run_instance("m5.large", &self.subnet, std::slice::from_ref(&self.sg))
    }
}

impl Default for Cluster {
    fn default() -> Self {
        Self::new()
    }
}

/// A CiliumNode as a classic agent writes it at start (no pool yet) for `instance`, an m5.large
/// of `c`.
pub fn agent_node(c: &Cluster, name: &str, instance: &str, min_allocate: i64) -> CiliumNode {
    let mut n = CiliumNode::new(name, Default::default());
    n.spec.instance_id = instance.into();
    n.spec.eni.instance_type = "m5.large".into();
    n.spec.eni.vpc_id = c.vpc.clone();
    n.spec.eni.availability_zone = "zone-a".into();
    n.spec.eni.node_subnet_id = c.subnet.clone();
    n.spec.eni.first_interface_index = Some(1);
    n.spec.ipam.min_allocate = min_allocate;
    n
}

/// A multi-pool agent's CiliumNode for `instance`: its demand in `pools.requested`.
pub fn multi_pool_node(c: &Cluster, name: &str, instance: &str, requested: i64) -> CiliumNode {
    let mut n = agent_node(c, name, instance, 0);
    set_requested(&mut n, requested);
    n
}

/// A multi-pool agent asks for `requested` addresses of pool `default`.
pub fn set_requested(n: &mut CiliumNode, requested: i64) {
    n.spec.ipam.pools.requested = vec![IpamPoolRequest {
        pool: "default".into(),
        needed: IpamPoolDemand {
            ipv4_addrs: requested,
            ..Default::default()
        },
        ..Default::default()
    }];
}
