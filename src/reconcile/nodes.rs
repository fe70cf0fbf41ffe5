//! What the core knows of each node (its [`Slot`]) and how the sources' [`NodeInput`]s change
//! it. Pure: no awaits, no I/O; the event loop applies what [`accept`] asks for ([`Accepted`]).
//!
//! Ownership: the event loop changes slots through [`accept`]; a node's pass reads its slot at
//! the start (a snapshot) and writes back what the pass learned at the end. The queue never
//! runs two passes of one node at once, so a slot has one writer per node at a time.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, RwLock};
use std::time::Instant;

use crate::crd::{CiliumNode, FINALIZER, IGNORE_ANNOTATION};
use crate::ipam::capacity::InterfaceStats;
use crate::ipam::{Demand, NodeMemory};

use crate::cache::Ec2Cache;
use crate::k8s::input::{InvalidNode, NodeInput};
use crate::k8s::stored::StoredNode;
use crate::reconcile::queue::Priority;

/// Everything the core holds for one node name.
#[derive(Debug, Default)]
pub struct Slot {
    pub node: Option<StoredNode>,
    pub invalid: Option<InvalidNode>,
    pub invalid_reported: Option<String>,
    pub memory: NodeMemory,
    /// `None`: not known yet (treated as present: never pull ENIs from a live node).
    pub k8s_node: Option<bool>,
    pub not_running_until: Option<Instant>,
    /// Since when the finalizer has seen the Kubernetes Node gone while its instance still
    /// runs (the grace period of `--node-gone-grace-period` counts from here).
    pub node_gone_since: Option<Instant>,
    /// Since when the finalizer has been failing (it is let go after the grace period).
    pub finalize_failing_since: Option<Instant>,
    pub last_problem: Option<String>,
    pub demand_seen: Option<Instant>,
    pub pending_pods: u32,
    pub demand: Demand,
    pub errored: bool,
    /// The last pass found every ENI full and no interface slot free.
    pub at_capacity: bool,
    /// Cilium's interface figures from the last pass that knew the instance.
    pub interfaces: Option<InterfaceStats>,
    /// Annotated `eni-operator.cilium.io/ignore`: only our finalizer is left to remove.
    pub ignored: bool,
    /// The handover guard: ENIs with Cilium's description on the instance, and when each was
    /// first seen after the first check (`None`: there already, before we took the node over).
    pub cilium_enis: Option<BTreeMap<String, Option<Instant>>>,
    /// The number of the watch delivery `node` came from (0: none yet). A pass takes it
    /// right before a write and keeps the write's answer only if it has not moved (§12.1).
    pub delivery: u64,
    /// Routine successes not yet published as Events (see [`crate::reconcile::events::Folded`]).
    pub folded: crate::reconcile::events::Folded,
}

/// Watch deliveries, numbered across all slots (a slot removed and made again never sees a
/// number twice). Only compared for equality, so a seeded simulation stays deterministic.
static DELIVERIES: AtomicU64 = AtomicU64::new(0);

fn next_delivery() -> u64 {
    DELIVERIES.fetch_add(1, Ordering::Relaxed) + 1
}

/// By name, ordered: the resync requeues nodes in this order, and a seeded simulation must
/// see the same order in every process (std's `HashMap` order is randomly seeded).
pub type Slots = BTreeMap<String, Slot>;

/// How urgently a node's next pass is due.
pub fn priority_of(slot: &Slot) -> Priority {
    match &slot.node {
        _ if slot.invalid.as_ref().is_some_and(|i| i.deleting) => Priority::Deleting,
        Some(n) if n.deleting() => Priority::Deleting,
        Some(_) if slot.k8s_node == Some(false) => Priority::Deleting,
        Some(n) if n.pool_empty() && slot.demand == Demand::default() => Priority::NoFreeIp,
        _ => Priority::from_demand(
            slot.demand.available,
            slot.demand.used,
            slot.demand.needed,
            slot.demand.excess,
            slot.pending_pods,
        ),
    }
}

/// What the event loop does after an input was taken in.
#[derive(Debug, Default, PartialEq)]
pub struct Accepted {
    /// Queue the node at this priority.
    pub queue: Option<(String, Priority)>,
    /// Take the node out of the queue.
    pub dequeue: Option<String>,
    /// Queue the node only after its instance is refreshed: (instance, node).
    pub wait: Option<(String, String)>,
    /// Drop this instance from the cache and the refresh spacing.
    pub forget: Option<String>,
    /// Take the node out of any wait before queueing it: the CiliumNode was just marked for
    /// deletion, and a wait a refusal set (`NoNode` once its Node went first) must not hold
    /// back the finalizer's release.
    pub unwait: bool,
}

impl Accepted {
    fn queue(name: String, p: Priority) -> Self {
        Self {
            queue: Some((name, p)),
            ..Self::default()
        }
    }

    /// The node is let go: out of the slots and the queue, its instance out of the cache.
    fn gone(slots: &mut Slots, name: String) -> Self {
        Self {
            forget: slots
                .remove(&name)
                .and_then(|s| s.node)
                .map(|n| n.instance_id().to_string()),
            dequeue: Some(name),
            ..Self::default()
        }
    }
}

/// Take one input into the slots. `cache` is only touched for an upsert whose instance
/// `admitted` lets through (its Node confirms it, §15): the instance becomes managed, and one
/// not described yet makes the node wait for its refresh. An instance a refused CiliumNode
/// names is never described, listed or garbage-collected for it.
pub fn accept(
    slots: &Mutex<Slots>,
    input: NodeInput,
    cache: &RwLock<Ec2Cache>,
    admitted: impl Fn(&str, &str) -> bool,
) -> Accepted {
    // A node's serialised form is built before the slots lock is taken.
    let stored = match &input {
        NodeInput::Upsert(node) => Some(StoredNode::new(node)),
        _ => None,
    };
    let slots = &mut *slots.lock().expect("slots");
    match input {
        NodeInput::Upsert(node) => {
            let name = node.metadata.name.as_deref().unwrap_or_default();
            let cache = admitted(name, &node.spec.instance_id).then_some(cache);
            upsert(slots, &node, stored.expect("stored"), cache)
        }
        NodeInput::Invalid(invalid) => {
            let name = invalid.node.name.clone();
            let slot = slots.entry(name.clone()).or_default();
            let p = if invalid.deleting || slot.k8s_node == Some(false) {
                Priority::Deleting
            } else {
                Priority::Routine
            };
            slot.invalid = Some(invalid);
            Accepted::queue(name, p)
        }
        NodeInput::Deleted(name) => Accepted::gone(slots, name),
        NodeInput::NodePresent { name, present } => {
            // Only for nodes we hold: a slot made here for a Node without a CiliumNode (or
            // whose CiliumNode is already gone) would never be removed. Not known counts as
            // present.
            let Some(slot) = slots.get_mut(&name) else {
                return Accepted::default();
            };
            slot.k8s_node = Some(present);
            if present {
                // The grace period counts one absence of the Node; one that came back ends it.
                slot.node_gone_since = None;
            }
            if !present && (slot.node.is_some() || slot.invalid.is_some()) {
                return Accepted::queue(name, Priority::Deleting);
            }
            Accepted::default()
        }
        NodeInput::PendingPods { name, count } => pending_pods(slots, name, count),
        NodeInput::NodeFacts { .. } | NodeInput::NodesListed | NodeInput::CiliumNodesListed => {
            Accepted::default()
        }
    }
}

fn annotated(node: &CiliumNode, key: &str) -> bool {
    node.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .is_some_and(|v| v == "true")
}

fn upsert(
    slots: &mut Slots,
    node: &CiliumNode,
    stored: StoredNode,
    cache: Option<&RwLock<Ec2Cache>>,
) -> Accepted {
    let name = node.metadata.name.clone().unwrap_or_default();
    if annotated(node, IGNORE_ANNOTATION) {
        // Opted out: let go of the node, including our finalizer if it has one.
        let ours = node
            .metadata
            .finalizers
            .as_ref()
            .is_some_and(|f| f.iter().any(|x| x == FINALIZER));
        if ours {
            let slot = slots.entry(name.clone()).or_default();
            slot.ignored = true;
            slot.node = Some(stored);
            slot.delivery = next_delivery();
            return Accepted::queue(name, Priority::Deleting);
        }
        return Accepted::gone(slots, name);
    }
    // Another object under the same name (deleted and created again, its Deleted event not
    // seen: a watch that relisted meanwhile delivers only the new one, `make dst` seed 28):
    // nothing known of the old one (the grace period's start, memory, errors) carries over.
    let replaced = slots
        .get(&name)
        .and_then(|s| s.node.as_ref())
        .is_some_and(|old| {
            old.uid().is_some()
                && node.metadata.uid.is_some()
                && old.uid() != node.metadata.uid.as_deref()
        });
    if replaced {
        let old = slots.remove(&name).unwrap_or_default();
        // What the Node and Pod watches said still holds: they are about the name.
        slots.insert(
            name.clone(),
            Slot {
                k8s_node: old.k8s_node,
                pending_pods: old.pending_pods,
                ..Slot::default()
            },
        );
    }
    let slot = slots.entry(name.clone()).or_default();
    slot.ignored = false;
    // Any update is a sign of life (§5.2).
    slot.not_running_until = None;
    slot.invalid = None;
    let instance = node.spec.instance_id.clone();
    let marked = stored.deleting() && !slot.node.as_ref().is_some_and(StoredNode::deleting);
    slot.node = Some(stored);
    slot.delivery = next_delivery();
    let p = priority_of(slot);
    let unknown = cache.is_some_and(|cache| enroll(cache, &instance, p));
    if unknown {
        Accepted {
            wait: Some((instance, name)),
            ..Accepted::default()
        }
    } else {
        Accepted {
            unwait: marked,
            ..Accepted::queue(name, p)
        }
    }
}

/// The instance of an admitted node becomes managed; whether the node must wait for its
/// describe first.
pub fn enroll(cache: &RwLock<Ec2Cache>, instance: &str, p: Priority) -> bool {
    let mut cache = cache.write().expect("cache");
    cache.manage(instance);
    !instance.is_empty() && p != Priority::Deleting && cache.needs_instance_refresh(instance)
}

fn pending_pods(slots: &mut Slots, name: String, count: u32) -> Accepted {
    // A count may come before the node's CiliumNode: kept while non-zero, and a slot holding
    // nothing else goes when it drops to zero.
    if count == 0 && !slots.contains_key(&name) {
        return Accepted::default();
    }
    let slot = slots.entry(name.clone()).or_default();
    let mut accepted = Accepted::default();
    if slot.pending_pods != count {
        slot.pending_pods = count;
        if slot.node.is_some() {
            let p = if count > 0 {
                Priority::PodsWaiting(count).max(priority_of(slot))
            } else {
                priority_of(slot)
            };
            accepted = Accepted::queue(name.clone(), p);
        }
    }
    if slot.node.is_none() && slot.invalid.is_none() && slot.pending_pods == 0 {
        slots.remove(&name);
    }
    accepted
}

/// Cluster-wide figures for the metrics.
#[derive(Debug, Default, PartialEq)]
pub struct Totals {
    pub available: i64,
    pub used: i64,
    pub needed: i64,
    /// Nodes per state (`ok`, `in-deficit`, `at-capacity`, `error`).
    pub states: BTreeMap<&'static str, i64>,
    /// (name, available, used, needed) of every served node.
    pub per_node: Vec<(String, i64, i64, i64)>,
    /// Cilium's `interface_candidates` and `empty_interface_slots`, over the served nodes.
    pub interface_candidates: i64,
    pub empty_interface_slots: i64,
}

/// The `state` label of each node, in the order the metric lists them.
pub const STATES: [&str; 4] = ["ok", "in-deficit", "at-capacity", "error"];

pub fn totals(slots: &Slots) -> Totals {
    let mut t = Totals {
        per_node: Vec::with_capacity(slots.len()),
        ..Totals::default()
    };
    for (name, s) in slots {
        let d = &s.demand;
        if s.node.is_some() && !s.ignored {
            t.per_node
                .push((name.clone(), d.available, d.used, d.needed));
            if let Some(i) = s.interfaces {
                t.interface_candidates += i64::from(i.candidates);
                t.empty_interface_slots += i64::from(i.empty_slots);
            }
        }
        t.available += d.available;
        t.used += d.used;
        t.needed += d.needed.max(0);
        let state = if s.at_capacity {
            "at-capacity"
        } else if s.errored {
            "error"
        } else if d.needed > 0 {
            "in-deficit"
        } else {
            "ok"
        };
        *t.states.entry(state).or_default() += 1;
    }
    t
}

#[cfg(test)]
mod tests;
