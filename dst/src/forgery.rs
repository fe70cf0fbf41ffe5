//! What an agent may write that it should not (issue 40): every Cilium agent's ServiceAccount
//! may write every CiliumNode, so the operator must judge each object before it acts. Three
//! events, each against an instance that is no node of the cluster (a "bystander": a node
//! handed back to Cilium, or one without an agent, whose ENIs of ours are still attached; or an
//! instance in a peered VPC):
//!
//! * **A forged finalizer**: an agent creates a CiliumNode naming a bystander, with our
//!   finalizer and our confirmed-instance annotation written by itself (no Node), and deletes it
//!   30-120 s later. Planted defect `trust-forged-finalizer`: the record is read without its
//!   managedFields owner (src/ipam/confirmed.rs).
//! * **An instance-id change**: an agent rewrites a served node's `spec.instance-id` to a
//!   bystander; Karpenter then drains the node and its CiliumNode is deleted. Planted defect
//!   `trust-named-instance`: the finalizer releases the instance the object names, not the one we
//!   confirmed (src/runtime/stored.rs).
//! * **A refused object naming a foreign VPC**: a CiliumNode without a Node names an instance in
//!   a peered VPC, where an available ENI carries our cluster's tags (a cluster of the same name
//!   there); it is deleted 300-600 s later (two GC intervals and more). Planted defect
//!   `manage-refused-instance`: its instance is described and managed before it is judged
//!   (src/runtime/identity.rs `may_describe`), so the ENI GC lists and collects that VPC.
//!
//! Invariant, checked every second: **nothing is released on an instance we did not confirm for
//! that object's uid, and nothing of a refused object reaches EC2**: every bystander's ENIs stay
//! exactly as they were, and so does every ENI of the peered VPC. (That a refused object is
//! never described shows only through these effects here: the simulator's call record has no
//! arguments.) Draws come from a stream of their own, so no other draw of a seed moves.

use std::collections::BTreeMap;

use eni_operator::crd::{CiliumNode, FINALIZER};
use eni_operator::ec2::{NetworkInterface, Tags};
use eni_operator::ipam::confirmed::CONFIRMED_INSTANCE_ANNOTATION;
use eni_operator::ipam::ownership::ownership_tags;
use eni_operator::k8s::input::NodeInput;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::check::Broken;
use crate::world::{CLUSTER, PRE_ALLOCATE, Phase, TYPES, World};

/// Per mille per simulated second, while the faults last.
const P_FINALIZER: u32 = 1;
const P_INSTANCE_ID: u32 = 1;
const P_FOREIGN_VPC: u32 = 1;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Finalizer,
    ForeignVpc,
}

/// A peered VPC with an instance, and every ENI in it as it must stay.
#[derive(Clone, Debug)]
struct Peered {
    vpc: String,
    subnet: String,
    instance: String,
    enis: Vec<Print>,
}

pub struct Forgery {
    rng: StdRng,
    /// Instances that are no node of the cluster: id -> their ENIs as they must stay.
    bystanders: BTreeMap<String, Vec<Print>>,
    /// The calls that named each bystander while the harness set it up (its own attach).
    named_at_setup: BTreeMap<String, u64>,
    /// Bystanders named by a node whose Node has no providerID: describing the instance (its
    /// primary address against the Node's InternalIP) is the one fact that refuses it (§15).
    read_to_refuse: std::collections::BTreeSet<String>,
    /// The peered VPC, once made.
    peered: Option<Peered>,
    /// Forged CiliumNodes: name -> (kind, when it is deleted).
    forged: BTreeMap<String, (Kind, u64)>,
    /// Nodes whose instance-id an agent rewrote: name -> when Karpenter drains them.
    rewritten: BTreeMap<String, u64>,
    next: u32,
}

impl Forgery {
    pub fn new(seed: u64) -> Self {
        Self {
            rng: StdRng::seed_from_u64(seed ^ 0xf0e6_e000_0000_0040),
            bystanders: BTreeMap::new(),
            named_at_setup: BTreeMap::new(),
            read_to_refuse: std::collections::BTreeSet::new(),
            peered: None,
            forged: BTreeMap::new(),
            rewritten: BTreeMap::new(),
            next: 0,
        }
    }

    /// The names of the CiliumNodes forged here (no simulated node stands behind them).
    pub fn names(&self) -> impl Iterator<Item = &String> {
        self.forged.keys()
    }

    /// Instances no node of the cluster runs on: the bystanders and the peered VPC's.
    pub fn not_ours(&self) -> impl Iterator<Item = &String> {
        self.bystanders
            .keys()
            .chain(self.peered.iter().map(|p| &p.instance))
    }

    /// The peered VPC's instance, once made.
    pub fn peered_instance(&self) -> Option<&String> {
        self.peered.as_ref().map(|p| &p.instance)
    }

    /// Each bystander no call may name, with the calls that named it while the harness set it
    /// up (one only an InternalIP can refuse is described: not in here).
    pub fn bystanders_named_at_setup(&self) -> impl Iterator<Item = (&String, u64)> {
        self.named_at_setup
            .iter()
            .filter(|(i, _)| !self.read_to_refuse.contains(*i))
            .map(|(i, n)| (i, *n))
    }
}

/// The seed's forgeries of one second (faults phase only).
pub async fn events(w: &mut World, t: u64) {
    if w.forgery.rng.random_range(0..1000) < P_FINALIZER {
        forge_finalizer(w, t).await;
    }
    if w.forgery.rng.random_range(0..1000) < P_INSTANCE_ID {
        rewrite_instance_id(w, t).await;
    }
    if w.forgery.rng.random_range(0..1000) < P_FOREIGN_VPC {
        name_foreign_vpc(w, t).await;
    }
}

/// Scheduled ends (also after the faults): forged objects deleted, rewritten nodes drained.
pub fn tick(w: &mut World, t: u64) {
    let due: Vec<String> = w
        .forgery
        .forged
        .iter()
        .filter(|(_, (_, at))| *at == t)
        .map(|(k, _)| k.clone())
        .collect();
    for name in due {
        match w.sink.begin_delete(&name) {
            Some(marked) => w.send(NodeInput::Upsert(Box::new(marked))),
            None => w.send(NodeInput::Deleted(name.clone())),
        }
        w.log(
            t,
            format!("{name}: the agent deletes its forged CiliumNode"),
        );
    }
    let due: Vec<String> = w
        .forgery
        .rewritten
        .iter()
        .filter(|(_, at)| **at == t)
        .map(|(k, _)| k.clone())
        .collect();
    for name in due {
        if w.nodes.get(&name).is_none_or(|n| n.phase != Phase::Live) {
            continue;
        }
        let until = t + w.forgery.rng.random_range(30..120);
        if let Some(ev) = w.sink.delete_node(&name) {
            w.node_event(ev);
        }
        w.nodes.get_mut(&name).expect("live").phase = Phase::Draining { until };
        w.log(
            t,
            format!("drain {name} (instance-id rewritten) until t={until}s"),
        );
    }
}

/// A running instance in the nodes' subnets with an ENI of ours attached, that no node runs on.
async fn bystander(w: &mut World, t: u64) -> String {
    let ty = TYPES[w.forgery.rng.random_range(0..TYPES.len())];
    let (subnet, _) = w.subnets[w.forgery.rng.random_range(0..w.subnets.len())].clone();
    let inst = w.sim.run_instance(ty, &subnet, std::slice::from_ref(&w.sg));
    let tags = ownership_tags(CLUSTER, &inst.id);
    let token = format!("bystander-{}", inst.id);
    let eni = w.foreign_eni(&subnet, tags, &token).await;
    w.foreign_attach(&eni.id, &inst.id, 1).await;
    let enis = on(&w.sim.network_interfaces(), &inst.id);
    w.log(
        t,
        format!(
            "{}: a bystander instance with our {} attached",
            inst.id, eni.id
        ),
    );
    w.forgery.bystanders.insert(inst.id.clone(), enis);
    let setup = w.sim.times_named(&inst.id);
    w.forgery.named_at_setup.insert(inst.id.clone(), setup);
    inst.id
}

/// What EC2 shows of an ENI that only a call can change: its attachment, addresses,
/// prefixes, Elastic IP, and whether it is on its way off (not the attach's own progress).
pub type Print = (
    String,
    Option<(String, u32, bool)>,
    bool,
    Vec<String>,
    Option<String>,
);

pub fn print(e: &NetworkInterface) -> Print {
    let addresses = e
        .secondary_ips
        .iter()
        .map(ToString::to_string)
        .chain(e.prefixes.iter().map(ToString::to_string))
        .collect();
    (
        e.id.clone(),
        e.attachment.as_ref().map(|a| {
            (
                a.instance_id.clone(),
                a.device_index,
                a.delete_on_termination,
            )
        }),
        e.state == eni_operator::ec2::EniState::Detaching,
        addresses,
        e.public_ip.clone(),
    )
}

/// The prints of the ENIs attached to `instance`.
pub fn on(enis: &[NetworkInterface], instance: &str) -> Vec<Print> {
    enis.iter()
        .filter(|e| e.instance_id() == Some(instance))
        .map(print)
        .collect()
}

/// A CiliumNode spec naming `instance`, as an agent writes it.
fn spec_naming(instance: &str, vpc: &str, subnet: &str) -> eni_operator::crd::CiliumNodeSpec {
    let mut spec = eni_operator::crd::CiliumNodeSpec {
        instance_id: instance.to_string(),
        ..Default::default()
    };
    spec.eni.instance_type = TYPES[0].into();
    spec.eni.vpc_id = vpc.to_string();
    spec.eni.node_subnet_id = subnet.to_string();
    spec.eni.first_interface_index = Some(0);
    spec.ipam.pre_allocate = PRE_ALLOCATE;
    spec
}

/// Put a forged CiliumNode (no Node behind it) and tell the watches.
fn put_forged(w: &mut World, n: &CiliumNode, kind: Kind, delete_at: u64) {
    let name = n.metadata.name.clone().unwrap_or_default();
    w.sink.set_node_exists(&name, false);
    let stored = w.sink.put(n);
    w.send(NodeInput::Upsert(Box::new(stored)));
    w.forgery.forged.insert(name, (kind, delete_at));
}

/// An agent creates a CiliumNode naming a bystander, with our finalizer and our record.
async fn forge_finalizer(w: &mut World, t: u64) {
    let instance = bystander(w, t).await;
    let name = format!("forged-finalizer-{}", w.forgery.next);
    w.forgery.next += 1;
    let subnet = w.subnets[0].0.clone();
    let mut n = CiliumNode::new(&name, spec_naming(&instance, &w.vpc, &subnet));
    n.metadata.finalizers = Some(vec![FINALIZER.to_string()]);
    n.metadata.annotations =
        Some([(CONFIRMED_INSTANCE_ANNOTATION.to_string(), instance.clone())].into());
    let delete_at = t + w.forgery.rng.random_range(30..120);
    put_forged(w, &n, Kind::Finalizer, delete_at);
    w.log(
        t,
        format!("{name}: an agent forges our finalizer and record naming {instance}; deleted at t={delete_at}s"),
    );
}

/// An agent rewrites a served classic node's instance-id to a bystander; the node is drained.
async fn rewrite_instance_id(w: &mut World, t: u64) {
    let served: Vec<String> = w
        .nodes
        .iter()
        .filter(|(_, n)| n.phase == Phase::Live && n.multi_pool.is_none())
        .map(|(k, _)| k.clone())
        .filter(|k| !w.reuse.pending(k) && !w.forgery.rewritten.contains_key(k))
        .filter(|k| {
            w.sink.get(k).is_some_and(|o| {
                o.metadata
                    .annotations
                    .as_ref()
                    .is_some_and(|a| a.contains_key(CONFIRMED_INSTANCE_ANNOTATION))
            })
        })
        .collect();
    if served.is_empty() {
        return;
    }
    let name = served[w.forgery.rng.random_range(0..served.len())].clone();
    let instance = bystander(w, t).await;
    let by_ip = w
        .sink
        .node(&name)
        .is_some_and(|n| n.spec.and_then(|s| s.provider_id).is_none());
    if by_ip {
        w.forgery.read_to_refuse.insert(instance.clone());
    }
    let Some(stored) = w
        .sink
        .update(&name, |n| n.spec.instance_id = instance.clone())
    else {
        return;
    };
    w.send(NodeInput::Upsert(Box::new(stored)));
    let drain_at = t + w.forgery.rng.random_range(10..60);
    w.forgery.rewritten.insert(name.clone(), drain_at);
    w.log(
        t,
        format!(
            "{name}: its agent rewrites spec.instance-id to {instance}; drained at t={drain_at}s"
        ),
    );
}

/// A CiliumNode without a Node names an instance in a peered VPC where a cluster of the same
/// name left an available ENI.
async fn name_foreign_vpc(w: &mut World, t: u64) {
    if w.forgery.peered.is_none() {
        let vpc = w.sim.add_vpc("172.16.0.0/16".parse().expect("cidr"), &[]);
        let subnet = w.sim.add_subnet(
            &vpc,
            "zone-a",
            "172.16.0.0/20".parse().expect("cidr"),
            Tags::new(),
        );
        let sg = w.sim.add_security_group(&vpc, Tags::new());
        w.sim.add_route_table(&vpc, true, &[]);
        let inst = w
            .sim
            .run_instance(TYPES[0], &subnet, std::slice::from_ref(&sg));
        let tags = ownership_tags(CLUSTER, "i-elsewhere");
        let req = eni_operator::ec2::CreateEniRequest {
            subnet_id: subnet.clone(),
            security_groups: vec![sg],
            description: "a same-named cluster's".into(),
            tags,
            addresses: eni_operator::ec2::AddressRequest::Ips(1),
            client_token: format!("peered-{vpc}"),
        };
        let eni = loop {
            match eni_operator::ec2::Ec2::create_network_interface(&w.sim, &req).await {
                Ok(e) => break e,
                Err(_) => tokio::time::sleep(std::time::Duration::from_millis(500)).await,
            }
        };
        w.log(
            t,
            format!(
                "peered {vpc}: instance {} and an available ENI {} tagged with our cluster",
                inst.id, eni.id
            ),
        );
        let enis = w
            .sim
            .network_interfaces()
            .into_iter()
            .filter(|e| e.vpc_id == vpc)
            .map(|e| print(&e))
            .collect();
        w.forgery.peered = Some(Peered {
            vpc,
            subnet,
            instance: inst.id,
            enis,
        });
    }
    let Peered {
        vpc,
        subnet,
        instance,
        ..
    } = w.forgery.peered.clone().expect("made");
    let name = format!("forged-peered-{}", w.forgery.next);
    w.forgery.next += 1;
    let n = CiliumNode::new(&name, spec_naming(&instance, &vpc, &subnet));
    let delete_at = t + w.forgery.rng.random_range(300..600);
    put_forged(w, &n, Kind::ForeignVpc, delete_at);
    w.log(
        t,
        format!("{name}: a CiliumNode without a Node names {instance} in peered {vpc}; deleted at t={delete_at}s"),
    );
}

/// Every live node's CiliumNode that holds our finalizer records the instance the node runs on
/// (§15: the record is written first, then the finalizer, both before any EC2 call): a
/// finalizer can only ever give back what we confirmed. Planted defect `trust-named-instance`
/// (the named instance counts as recorded, so the record is never written).
fn recorded(w: &World) -> Result<(), Broken> {
    for (name, n) in w.nodes.iter().filter(|(_, n)| n.phase == Phase::Live) {
        let Some(obj) = w.sink.get(name) else {
            continue;
        };
        if obj.metadata.deletion_timestamp.is_some()
            || !eni_operator::ipam::admission::has_finalizer(&obj)
        {
            continue;
        }
        let record = obj
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(CONFIRMED_INSTANCE_ANNOTATION));
        if record != Some(&n.instance_id) {
            return Err((
                "a CiliumNode we hold records the instance we confirmed",
                format!(
                    "{name} runs on {} and holds our finalizer; its record: {record:?}",
                    n.instance_id
                ),
            ));
        }
    }
    Ok(())
}

/// Checked after every simulated second.
pub fn check(w: &World) -> Result<(), Broken> {
    recorded(w)?;
    let enis = w.sim.network_interfaces();
    for (instance, was) in &w.forgery.bystanders {
        let now = on(&enis, instance);
        if &now != was {
            return Err((
                "nothing released on an instance not confirmed for that object",
                format!("bystander {instance} (no node runs on it) changed: {was:?} -> {now:?}"),
            ));
        }
    }
    if let Some(p) = &w.forgery.peered {
        let now: Vec<Print> = enis
            .iter()
            .filter(|e| e.vpc_id == p.vpc)
            .map(print)
            .collect();
        if now != p.enis {
            return Err((
                "nothing of a refused object reaches EC2",
                format!(
                    "peered {} (only a refused CiliumNode names {}) changed: {:?} -> {now:?}",
                    p.vpc, p.instance, p.enis
                ),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use eni_operator::ec2::Ec2;

    use super::*;

    /// A bystander that loses its ENI of ours is a violation; untouched, it is not.
    #[test]
    fn a_bystander_losing_an_eni_of_ours_is_caught() {
        crate::paused_runtime().block_on(async {
            let (mut w, _) = World::seeded(7).await;
            let instance = bystander(&mut w, 0).await;
            check(&w).expect("untouched");
            let ours = w
                .sim
                .network_interfaces()
                .into_iter()
                .find(|e| e.instance_id() == Some(instance.as_str()) && crate::check::ours(e))
                .expect("an ENI of ours on the bystander");
            let attachment = ours.attachment.expect("attached").id;
            w.sim
                .detach_network_interface(&attachment, true)
                .await
                .expect("detach");
            let (invariant, detail) = check(&w).expect_err("caught");
            assert_eq!(
                invariant, "nothing released on an instance not confirmed for that object",
                "{detail}"
            );
        });
    }
}
