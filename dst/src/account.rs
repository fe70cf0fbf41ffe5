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

    /// Why a live node's demand may stay unmet after the settle bound: its pod subnets are full
    /// (no subnet of its zone has room for the missing addresses and a new ENI's primary), or
    /// they have no /28 left and single addresses filled every slot of the node's ENIs (prefix
    /// mode in a fragmented subnet: the instance holds fewer addresses than its prefix
    /// capacity); and its `operator-status` says why. `Err` names what is wrong.
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
        if room.values().any(|&f| f as usize > node.missing) && !slots_full(node, enis) {
            return Err(format!(
                "a pod subnet of {zone} has room: free {room:?}, operator-status {:?}",
                node.operator_error
            ));
        }
        match node.operator_error {
            Some(e) if !e.is_empty() => Ok(()),
            _ => Err(format!(
                "the pod subnets of {zone} are full (free {room:?}) but operator-status says nothing"
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

/// Every ENI slot the node may use holds an address or a /28: as many ENIs as the type allows,
/// and each one the operator may use (device index at or above the first interface index, not
/// another owner's) full.
fn slots_full(node: &NodeFacts<'_>, enis: &[NetworkInterface]) -> bool {
    let attached: Vec<&NetworkInterface> = enis
        .iter()
        .filter(|e| e.instance_id() == Some(node.instance_id))
        .collect();
    attached.len() as u32 >= node.max_enis
        && attached
            .iter()
            .filter(|e| {
                e.device_index()
                    .is_some_and(|i| i >= node.first_interface_index)
            })
            .filter(|e| !node.foreign.contains(&e.id))
            .all(|e| {
                1 + e.secondary_ips.len() as u32 + e.prefixes.len() as u32 >= node.ipv4_per_eni
            })
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
