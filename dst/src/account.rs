//! The AWS account's behaviour beyond the per-second faults, drawn once per run: eventual
//! consistency of describes, attach "not ready" after a create, a noisy tenant sharing the
//! throttling buckets, and small pod subnets that run out.
//!
//! Drawn from an RNG of its own (derived from the seed), so a seed's schedule of events stays
//! what it was before these were modelled; only the account behaves differently.

use std::collections::BTreeMap;
use std::time::Duration;

use eni_operator::ec2::{NetworkInterface, PREFIX_SIZE, Tags};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use testkit::sim::Simulator;

/// The tag that marks the small pod subnets (custom networking: `spec.eni.subnet-tags`).
const POD_SUBNET_TAG: &str = "dst-pods";

/// One run's account.
#[derive(Clone, Debug, Default)]
pub struct Account {
    /// Longest time a change to an ENI stays invisible to describes (zero: consistent).
    pub lag: Duration,
    /// Calls naming a just-created ENI answer `InvalidNetworkInterfaceID.NotFound`.
    pub not_ready: bool,
    /// Share of every throttling bucket's refill another tenant of the account takes.
    pub tenant_share: f64,
    /// Pod subnets (custom networking) too small for the nodes' demand: ID, zone, CIDR.
    pub pod_subnets: Vec<(String, &'static str, &'static str)>,
}

impl Account {
    /// Draw this run's account from the seed.
    pub fn draw(seed: u64) -> Self {
        let mut rng = StdRng::seed_from_u64(seed ^ 0x0ec2_acc0_u64.rotate_left(32));
        let mut a = Self::default();
        // AWS: "might not be immediately visible"; a few seconds is what users report, so up to
        // 8 s. Half of the runs.
        if rng.random_bool(0.5) {
            a.lag = Duration::from_millis(rng.random_range(1000..=8000));
            a.not_ready = rng.random_bool(0.7);
        }
        // Half of the runs share the buckets with another tool of the account (AWS's buckets
        // are per account and region), taking 10-70 % of every refill.
        if rng.random_bool(0.5) {
            a.tenant_share = f64::from(rng.random_range(10..=70u32)) / 100.0;
        }
        // A quarter of the runs put pods in small subnets (a /26 and a /27 per zone).
        if rng.random_bool(0.25) {
            a.pod_subnets = vec![
                (String::new(), "zone-a", "10.0.128.0/26"),
                (String::new(), "zone-a", "10.0.128.64/27"),
                (String::new(), "zone-b", "10.0.129.0/26"),
                (String::new(), "zone-b", "10.0.129.64/27"),
            ];
        }
        a
    }

    /// Set the account up in the simulator (the VPC exists).
    pub fn apply(&mut self, sim: &Simulator, vpc: &str, seed: u64) {
        sim.set_eventual_consistency(self.lag, self.not_ready, seed);
        sim.set_other_tenant_share(self.tenant_share);
        for (id, zone, cidr) in &mut self.pod_subnets {
            *id = sim.add_subnet(vpc, zone, cidr.parse().expect("cidr"), pod_subnet_tags());
        }
    }

    /// The trace line.
    pub fn describe(&self) -> String {
        format!(
            "account: describe-lag<={:?} not-ready={} tenant-share={} small-pod-subnets={}",
            self.lag,
            self.not_ready,
            self.tenant_share,
            self.pod_subnets.len()
        )
    }

    /// The node's `spec.eni.subnet-tags`: the pod subnets when there are any.
    pub fn subnet_tags(&self) -> Tags {
        if self.pod_subnets.is_empty() {
            Tags::new()
        } else {
            pod_subnet_tags()
        }
    }

    /// Subnet IDs the ENI GC lists besides the node subnets.
    pub fn extra_subnets(&self) -> impl Iterator<Item = String> + '_ {
        self.pod_subnets.iter().map(|(id, ..)| id.clone())
    }

    /// Why a live node's demand may stay unmet after the settle bound: the operator can get it
    /// no address, and its `operator-status` says why. It can get one (as the planner does,
    /// `src/ipam/plan.rs` `allocate`, like Cilium's ENI allocator) by topping up an ENI of the
    /// node with a free slot whose subnet has a free address (single addresses when no /28 is
    /// left), or by creating an ENI at a free interface slot in a pod subnet of its zone with
    /// room for the new ENI's primary and one address. Room in a subnet the node reaches by
    /// neither (its ENI there full, no interface slot free: seed 388) is no room for it.
    /// `Err` names what is wrong.
    pub fn excuse(&self, node: &NodeFacts<'_>, enis: &[NetworkInterface]) -> Result<(), String> {
        if self.pod_subnets.is_empty() {
            return Err("the subnets have room".into());
        }
        let zone = node.zone;
        let free = free_addresses(&self.pod_subnets, enis);
        let room: BTreeMap<&str, u32> = self
            .pod_subnets
            .iter()
            .filter(|(_, z, _)| *z == zone)
            .map(|(id, ..)| (id.as_str(), free.get(id.as_str()).copied().unwrap_or(0)))
            .collect();
        let attached: Vec<&NetworkInterface> = enis
            .iter()
            .filter(|e| e.instance_id() == Some(node.instance_id))
            .collect();
        // The node subnets (a /18 each) never run out in this model: an ENI there with a free
        // slot can always be topped up.
        let top_up = attached.iter().find(|e| {
            usable(node, e)
                && held_slots(e) < node.ipv4_per_eni
                && free.get(e.subnet_id.as_str()).is_none_or(|&f| f > 0)
        });
        if let Some(e) = top_up {
            return Err(format!(
                "{} has a free slot and its subnet {} has room ({} missing): free {room:?}, \
                 operator-status {:?}",
                e.id, e.subnet_id, node.missing, node.operator_error
            ));
        }
        if (attached.len() as u32) < node.max_enis && room.values().any(|&f| f >= 2) {
            return Err(format!(
                "an interface slot is free and a pod subnet of {zone} has room for a new ENI \
                 ({} missing): free {room:?}, operator-status {:?}",
                node.missing, node.operator_error
            ));
        }
        match node.operator_error {
            Some(e) if !e.is_empty() => Ok(()),
            _ => Err(format!(
                "the node can get no address (free {room:?}) but operator-status says nothing"
            )),
        }
    }
}

/// What [`Account::excuse`] looks at of one node.
pub struct NodeFacts<'a> {
    pub zone: &'a str,
    pub instance_id: &'a str,
    pub first_interface_index: u32,
    pub max_enis: u32,
    pub ipv4_per_eni: u32,
    /// Pods the agent could not start.
    pub missing: usize,
    pub operator_error: Option<&'a str>,
    /// Other owners' ENIs (never used for pods).
    pub foreign: &'a [String],
}

/// Address slots an ENI fills: its primary, each secondary address, each /28.
fn held_slots(e: &NetworkInterface) -> u32 {
    1 + e.secondary_ips.len() as u32 + e.prefixes.len() as u32
}

/// An ENI the operator may put the node's addresses on: at or above the first interface index,
/// not another owner's.
fn usable(node: &NodeFacts<'_>, e: &NetworkInterface) -> bool {
    e.device_index()
        .is_some_and(|i| i >= node.first_interface_index)
        && !node.foreign.contains(&e.id)
}

fn pod_subnet_tags() -> Tags {
    Tags::from([(POD_SUBNET_TAG.to_string(), "true".to_string())])
}

/// Free addresses per pod subnet, from EC2's truth: the subnet's size less AWS's five reserved
/// addresses and every address or /28 an ENI holds there.
fn free_addresses<'a>(
    subnets: &'a [(String, &'static str, &'static str)],
    enis: &[NetworkInterface],
) -> BTreeMap<&'a str, u32> {
    subnets
        .iter()
        .map(|(id, _, cidr)| {
            let len: u32 = cidr
                .rsplit('/')
                .next()
                .and_then(|l| l.parse().ok())
                .expect("a CIDR");
            let size = 1u32 << (32 - len);
            let used: u32 = enis
                .iter()
                .filter(|e| &e.subnet_id == id)
                .map(|e| 1 + e.secondary_ips.len() as u32 + e.prefixes.len() as u32 * PREFIX_SIZE)
                .sum();
            (id.as_str(), size.saturating_sub(5 + used))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use eni_operator::ec2::{Attachment, EniState, InterfaceType};
    use std::net::Ipv4Addr;

    const INSTANCE: &str = "i-1";

    /// An ENI of ours at `index` of [`INSTANCE`] in `subnet` with `n` single addresses.
    fn eni(id: &str, index: u32, subnet: &str, n: u8) -> NetworkInterface {
        NetworkInterface {
            id: id.into(),
            subnet_id: subnet.into(),
            primary_ip: Ipv4Addr::new(10, 9, index as u8, 0),
            secondary_ips: (1..=n)
                .map(|i| Ipv4Addr::new(10, 9, index as u8, i))
                .collect(),
            state: EniState::InUse,
            attachment: Some(Attachment {
                id: format!("attach-{id}"),
                instance_id: INSTANCE.into(),
                device_index: index,
                delete_on_termination: true,
                network_card_index: 0,
            }),
            vpc_id: "vpc".into(),
            availability_zone: "zone-a".into(),
            mac: String::new(),
            description: String::new(),
            prefixes: vec![],
            ipv6_prefixes: vec![],
            security_groups: vec![],
            tags: Tags::new(),
            public_ip: None,
            interface_type: InterfaceType::Interface,
        }
    }

    /// The same on another instance.
    fn elsewhere(id: &str, subnet: &str, n: u8) -> NetworkInterface {
        let mut e = eni(id, 1, subnet, n);
        e.attachment.as_mut().expect("attached").instance_id = "i-2".into();
        e
    }

    /// The node's ENIs of seed 388 (the other tool's at slot 1 if `other`, `in_small`
    /// addresses on its ENI in the /27), and another node's filling the /26.
    fn seed_388(other: bool, in_small: u8) -> Vec<NetworkInterface> {
        let mut enis = vec![eni("primary", 0, "node", 0)];
        if other {
            enis.push(eni("other", 1, "node", 1));
        }
        enis.extend([
            eni("in-small", 2, "small", in_small),
            eni("in-big", 3, "big", 6),
            elsewhere("fill-big", "big", 51),
        ]);
        enis
    }

    fn account() -> Account {
        Account {
            pod_subnets: vec![
                ("big".into(), "zone-a", "10.0.128.0/26"),
                ("small".into(), "zone-a", "10.0.128.64/27"),
            ],
            ..Default::default()
        }
    }

    fn facts<'a>(error: Option<&'a str>, foreign: &'a [String]) -> NodeFacts<'a> {
        NodeFacts {
            zone: "zone-a",
            instance_id: INSTANCE,
            first_interface_index: 1,
            max_enis: 4,
            ipv4_per_eni: 15,
            missing: 1,
            operator_error: error,
            foreign,
        }
    }

    /// Seed 388: the node's ENI in the /27 is full, its ENI in the /26 has free slots but the
    /// /26 is full, another tool's ENI takes the fourth interface slot. The /27's two free
    /// addresses are out of the node's reach: no ENI of its own there can take one, and no
    /// interface slot is left for a new ENI.
    #[test]
    fn room_the_node_cannot_reach_excuses_it() {
        let foreign = vec!["other".to_string()];
        // Another node's ENIs fill the /26 (59 usable) and leave 2 of the /27's 27.
        let mut enis = seed_388(true, 14);
        enis.push(elsewhere("fill-small", "small", 9));
        let a = account();
        let free = free_addresses(&a.pod_subnets, &enis);
        assert_eq!((free["big"], free["small"]), (0, 2));
        let why = "NoMatchingSubnet: the subnets of the node's ENIs are full";
        assert_eq!(a.excuse(&facts(Some(why), &foreign), &enis), Ok(()));
        // The status must still say why.
        assert!(a.excuse(&facts(None, &foreign), &enis).is_err());
    }

    /// Room the node does reach is no excuse: an ENI with a free slot in a subnet with a free
    /// address, or a free interface slot and a pod subnet with room for a new ENI.
    #[test]
    fn room_the_node_can_reach_is_no_excuse() {
        let foreign = vec!["other".to_string()];
        let why = Some("NoMatchingSubnet");
        // The ENI in the /27 has a free slot and the /27 has room.
        let enis = seed_388(true, 13);
        let err = account().excuse(&facts(why, &foreign), &enis).unwrap_err();
        assert!(err.contains("in-small has a free slot"), "{err}");
        // No other tool's ENI: slot 1 is free for a new ENI in the /27.
        let enis = seed_388(false, 14);
        let err = account().excuse(&facts(why, &[]), &enis).unwrap_err();
        assert!(err.contains("an interface slot is free"), "{err}");
    }
}
