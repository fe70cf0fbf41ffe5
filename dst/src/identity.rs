//! Whose instance a CiliumNode names (issue 29 item 1, docs/rules.md §15). Every Cilium agent's
//! ServiceAccount may create CiliumNodes, so `spec.instance-id` is a claim; the Node of the same
//! name, with its `spec.providerID`, is the fact. Two events:
//!
//! * **A CiliumNode without a Node** (forged, or left by a broken agent): it names either an
//!   instance of the VPC that is no node of the cluster (a "stranger", launched in the nodes'
//!   subnets) or a live node's instance, and is deleted after a while. Invariant: no EC2 change
//!   for it: the stranger's ENIs stay exactly as EC2 launched them, and the forged object gets
//!   no pool (planted defect `serve-without-node`: a CiliumNode without a Node is served).
//! * **Two CiliumNodes naming one instance**: a node registers again under a new hostname (a
//!   new Node whose providerID names the same instance, and the agent's new CiliumNode); the
//!   old Node stays NotReady until a person or a remediation tool deletes it 10-120 s later,
//!   and Kubernetes' garbage collector then deletes the old CiliumNode, which our finalizer
//!   holds. Invariant: while the old CiliumNode exists, no ENI of ours leaves the instance the
//!   live node runs on (its finalizer must not release them after the grace period; planted
//!   defect `release-named-instance`). In between, neither is served (`InstanceNamedTwice`);
//!   the node is served once the old one goes. Half the new Nodes carry no providerID (a
//!   kubelet without the AWS cloud provider; only their InternalIP names the instance), so
//!   that the other CiliumNode is all that keeps the old finalizer's hands off.
//!
//! "A Node deleted while its instance runs" is `World::orphan`. Every draw here comes from a
//! stream of its own (as crate::slow_answer's), so adding this moves no other draw of a seed.

use std::collections::BTreeMap;
use std::sync::Mutex;

use eni_operator::crd::CiliumNode;
use eni_operator::ec2::{EniState, NetworkInterface};
use eni_operator::event_loop::core::NodeInput;
use kube::runtime::watcher::Event;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::check::{Broken, ours};
use crate::world::{KARPENTER, PRE_ALLOCATE, Phase, TYPES, World};

/// Per mille per simulated second, while the faults last.
const P_FORGE: u32 = 2;
const P_RENAME: u32 = 2;

/// A CiliumNode without a Node.
#[derive(Debug)]
struct Forged {
    delete_at: u64,
}

/// A node registered again under a new name while its old Node stays.
#[derive(Debug)]
struct Renamed {
    new: String,
    instance: String,
    /// The old Node is deleted then (`None`: done).
    old_node_goes_at: Option<u64>,
}

pub struct Identity {
    rng: StdRng,
    forged: BTreeMap<String, Forged>,
    /// Instances of the VPC that are no node of the cluster: id -> their ENIs as launched.
    strangers: BTreeMap<String, Vec<NetworkInterface>>,
    /// By the old name.
    renamed: BTreeMap<String, Renamed>,
    /// Our ENIs on the instance of a renamed node while its old CiliumNode exists, as of the
    /// previous check: ENI id -> (instance, the live node's name).
    held: Mutex<BTreeMap<String, (String, String)>>,
    next: u32,
}

impl Identity {
    pub fn new(seed: u64) -> Self {
        Self {
            rng: StdRng::seed_from_u64(seed ^ 0x1de7_1710_0000_0029),
            forged: BTreeMap::new(),
            strangers: BTreeMap::new(),
            renamed: BTreeMap::new(),
            held: Mutex::default(),
            next: 0,
        }
    }
}

/// The seed's identity events of one second (faults phase only).
pub fn events(w: &mut World, t: u64) {
    if w.identity.rng.random_range(0..1000) < P_FORGE {
        forge(w, t);
    }
    if w.identity.rng.random_range(0..1000) < P_RENAME {
        rename(w, t);
    }
}

/// Scheduled ends (also after the faults stop): forged CiliumNodes deleted, old Nodes deleted.
pub fn tick(w: &mut World, t: u64) {
    let due: Vec<String> = w
        .identity
        .forged
        .iter()
        .filter(|(_, f)| f.delete_at == t)
        .map(|(k, _)| k.clone())
        .collect();
    for name in due {
        delete_cilium_node(w, &name);
        w.log(
            t,
            format!("{name}: the CiliumNode without a Node is deleted"),
        );
    }
    let due: Vec<String> = w
        .identity
        .renamed
        .iter()
        .filter(|(_, r)| r.old_node_goes_at.is_some_and(|at| at <= t))
        .map(|(k, _)| k.clone())
        .collect();
    for old in due {
        w.identity
            .renamed
            .get_mut(&old)
            .expect("due")
            .old_node_goes_at = None;
        w.sink.remove_node_finalizer(&old, KARPENTER);
        if let Some(ev) = w.sink.delete_node(&old) {
            w.node_event(ev);
        }
        // Kubernetes' garbage collector: the CiliumNode is owned by its Node.
        delete_cilium_node(w, &old);
        w.log(
            t,
            format!("{old}: the old Node is deleted (its instance runs on as another node)"),
        );
    }
}

fn delete_cilium_node(w: &mut World, name: &str) {
    if w.sink.raw(name).is_none() {
        return;
    }
    match w.sink.begin_delete(name) {
        Some(marked) => w.send(NodeInput::Upsert(Box::new(marked))),
        None => w.send(NodeInput::Deleted(name.to_string())),
    }
}

/// A CiliumNode appears that no Node stands behind.
fn forge(w: &mut World, t: u64) {
    let id = &mut w.identity;
    let name = format!("forged-{}", id.next);
    id.next += 1;
    let delete_at = t + id.rng.random_range(60..300);
    let stranger = id.rng.random_bool(0.5);
    let ty = TYPES[id.rng.random_range(0..TYPES.len())];
    let subnet = id.rng.random_range(0..w.subnets.len());
    let live: Vec<&String> = w
        .nodes
        .iter()
        .filter(|(_, n)| n.phase == Phase::Live)
        .map(|(k, _)| k)
        .collect();
    let pick = (!live.is_empty()).then(|| live[id.rng.random_range(0..live.len())].clone());
    let mut spec = match pick.filter(|_| !stranger) {
        // A copy of a live node's own spec: only the name (and so the missing Node) differs.
        Some(of) => {
            let Some(obj) = w.sink.get(&of) else { return };
            let mut spec = obj.spec;
            spec.ipam.pool.clear();
            spec.ipam.static_ip_tags.clear();
            spec
        }
        None => {
            let (subnet, zone) = w.subnets[subnet].clone();
            let inst = w.sim.run_instance(ty, &subnet, std::slice::from_ref(&w.sg));
            let enis: Vec<NetworkInterface> = w
                .sim
                .network_interfaces()
                .into_iter()
                .filter(|e| e.instance_id() == Some(inst.id.as_str()))
                .collect();
            w.identity.strangers.insert(inst.id.clone(), enis);
            let mut spec = eni_operator::crd::CiliumNodeSpec {
                instance_id: inst.id,
                ..Default::default()
            };
            spec.eni.instance_type = ty.into();
            spec.eni.vpc_id = w.vpc.clone();
            spec.eni.availability_zone = zone.into();
            spec.eni.node_subnet_id = subnet;
            spec.eni.first_interface_index = Some(0);
            spec.ipam.pre_allocate = PRE_ALLOCATE;
            spec
        }
    };
    spec.ipam.pool.clear();
    let instance = spec.instance_id.clone();
    let n = CiliumNode::new(&name, spec);
    w.sink.set_node_exists(&name, false);
    let stored = w.sink.put(&n);
    w.send(NodeInput::Upsert(Box::new(stored)));
    w.identity.forged.insert(name.clone(), Forged { delete_at });
    let whose = if w.identity.strangers.contains_key(&instance) {
        "a stranger instance"
    } else {
        "a live node's instance"
    };
    w.log(
        t,
        format!("{name}: a CiliumNode without a Node names {instance} ({whose}); deleted at t={delete_at}s"),
    );
}

/// A live classic node registers again under a new name; its old Node stays for a while.
fn rename(w: &mut World, t: u64) {
    let names: Vec<String> = w
        .nodes
        .iter()
        .filter(|(_, n)| n.phase == Phase::Live && n.multi_pool.is_none())
        .map(|(k, _)| k.clone())
        .filter(|k| !w.reuse.pending(k))
        .collect();
    if names.is_empty() {
        return;
    }
    let old = names[w.identity.rng.random_range(0..names.len())].clone();
    let goes_at = t + w.identity.rng.random_range(10..=120);
    let Some(stored) = w.sink.get(&old) else {
        return;
    };
    let new = format!("{old}-r");
    if w.nodes.contains_key(&new) || w.sink.raw(&new).is_some() {
        return;
    }
    let mut n = w.nodes.remove(&old).expect("picked");
    w.pods_gone(&old);
    n.agent.pods.clear();
    n.quiet = None;
    // Half register from a kubelet without the AWS cloud provider: no providerID, only the
    // InternalIP (§15 checks it against the instance's primary address). No other Node's
    // providerID names the instance then, so only the other CiliumNode stops the old one's
    // finalizer.
    let by_ip = w.identity.rng.random_bool(0.5);
    let primary = w
        .sim
        .network_interfaces()
        .into_iter()
        .find(|e| e.instance_id() == Some(n.instance_id.as_str()) && e.device_index() == Some(0))
        .map(|e| e.primary_ip);
    let node = match primary.filter(|_| by_ip) {
        Some(ip) => w.sink.put_node_at_ip(&new, &[KARPENTER], &ip.to_string()),
        None => w.put_node(&new, n.zone, &n.instance_id),
    };
    w.node_event(Event::Apply(node));
    let mut again = CiliumNode::new(&new, stored.spec.clone());
    again.spec.ipam.pool.clear();
    // A starting agent names its own instance (from the instance metadata), whatever the
    // object it wrote before says (an agent may have rewritten that one's instance-id).
    again.spec.instance_id.clone_from(&n.instance_id);
    w.agent_creates(again, t);
    w.identity.renamed.insert(
        old.clone(),
        Renamed {
            new: new.clone(),
            instance: n.instance_id.clone(),
            old_node_goes_at: Some(goes_at),
        },
    );
    w.log(
        t,
        format!(
            "{old}: registers again as {new} on {}{}; the old Node is deleted at t={goes_at}s",
            n.instance_id,
            if by_ip && primary.is_some() {
                " (Node without providerID)"
            } else {
                ""
            }
        ),
    );
    w.nodes.insert(new, n);
}

/// Checked after every simulated second.
impl Identity {
    /// The names of CiliumNodes of no simulated node: forged ones and the old names of renamed
    /// nodes (the operator must let go of each once it is gone).
    pub fn names(&self) -> impl Iterator<Item = &String> {
        self.forged.keys().chain(self.renamed.keys())
    }

    /// Instances only CiliumNodes without a Node name.
    pub fn strangers(&self) -> impl Iterator<Item = &String> {
        self.strangers.keys()
    }
}

pub fn check(w: &World) -> Result<(), Broken> {
    let enis = w.sim.network_interfaces();
    for (instance, launched) in &w.identity.strangers {
        let now: Vec<&NetworkInterface> = enis
            .iter()
            .filter(|e| e.instance_id() == Some(instance.as_str()))
            .collect();
        if now.len() != launched.len() || now.iter().zip(launched).any(|(a, b)| *a != b) {
            return Err((
                "no EC2 call for a CiliumNode without its Node",
                format!(
                    "{instance} (no Node names it) changed: launched with {launched:?}, now {now:?}"
                ),
            ));
        }
    }
    for name in w.identity.forged.keys() {
        if let Some(obj) = w.sink.get(name)
            && !obj.spec.ipam.pool.is_empty()
        {
            return Err((
                "no EC2 call for a CiliumNode without its Node",
                format!(
                    "{name} (no Node) was given a pool of {}",
                    obj.spec.ipam.pool.len()
                ),
            ));
        }
    }
    let t = w.seconds();
    let grace = crate::world::NODE_GONE_GRACE;
    let keeps = |name: &str| w.nodes.get(name).is_some_and(|n| n.keeps_enis(t, grace));
    let mut held = w.identity.held.lock().expect("identity");
    for (id, (instance, live)) in held.iter() {
        if !keeps(live) {
            continue;
        }
        let e = enis.iter().find(|e| &e.id == id);
        let still = e.is_some_and(|e| {
            e.state != EniState::Detaching && e.instance_id() == Some(instance.as_str())
        });
        if !still {
            return Err((
                "no finalizer releases ENIs of an instance another live CiliumNode names",
                format!("our {id} left {instance}, which {live} runs on; EC2 has {e:?}"),
            ));
        }
    }
    *held = w
        .identity
        .renamed
        .iter()
        .filter(|(old, r)| w.sink.raw(old).is_some() && keeps(&r.new))
        .flat_map(|(_, r)| {
            enis.iter()
                .filter(|e| ours(e) && e.instance_id() == Some(r.instance.as_str()))
                .filter(|e| e.state != EniState::Detaching)
                .map(|e| (e.id.clone(), (r.instance.clone(), r.new.clone())))
        })
        .collect();
    Ok(())
}
