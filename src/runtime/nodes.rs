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

use super::cache::Ec2Cache;
use super::queue::Priority;
use super::sink::NodeRef;
use super::stored::StoredNode;

/// What the sources tell the core.
#[derive(Clone, Debug)]
pub enum NodeInput {
    /// A CiliumNode was added or changed (parsed).
    Upsert(Box<CiliumNode>),
    /// A CiliumNode that does not parse: report it on that object only.
    Invalid(InvalidNode),
    /// The CiliumNode object is gone.
    Deleted(String),
    /// Whether the Kubernetes Node of that name exists.
    NodePresent { name: String, present: bool },
    /// Pending pods scheduled to the node (surge allocation).
    PendingPods { name: String, count: u32 },
    /// What the Node of that name says about its instance (`None`: the Node was deleted);
    /// taken by the core's [`super::identity::Nodes`], not by the slots.
    NodeFacts {
        name: String,
        facts: Option<super::identity::NodeFacts>,
    },
    /// The Node watch's listing is complete: a name it did not show has no Node.
    NodesListed,
    /// The CiliumNode watch's listing is complete: every node present at the start is in (the
    /// first EC2 listing need not wait for more nodes to learn their VPC, `super::start`).
    CiliumNodesListed,
}

/// A CiliumNode that does not parse: what its metadata (and a lenient read) still tell, so its
/// deletion and our finalizer are handled all the same.
#[derive(Clone, Debug)]
pub struct InvalidNode {
    pub node: NodeRef,
    pub error: String,
    /// It carries a `deletionTimestamp`.
    pub deleting: bool,
    /// `spec.instance-id` when that field is readable, else empty.
    pub instance_id: String,
}

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
    /// Routine successes not yet published as Events (see [`super::events::Folded`]).
    pub folded: super::events::Folded,
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
        NodeInput::Deleted(name) => Accepted {
            forget: slots
                .remove(&name)
                .and_then(|s| s.node)
                .map(|n| n.instance_id().to_string()),
            dequeue: Some(name),
            ..Accepted::default()
        },
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
        return Accepted {
            forget: slots
                .remove(&name)
                .and_then(|s| s.node)
                .map(|n| n.instance_id().to_string()),
            dequeue: Some(name),
            ..Accepted::default()
        };
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
mod tests {
    use super::*;
    use crate::ipam::testkit;

    fn cache() -> RwLock<Ec2Cache> {
        RwLock::new(Ec2Cache::for_cluster("test"))
    }

    /// Every instance admitted (its Node confirms it).
    fn all(_: &str, _: &str) -> bool {
        true
    }

    #[test]
    fn a_refused_nodes_instance_is_neither_managed_nor_described() {
        let slots = Mutex::new(Slots::new());
        let cache = cache();
        let a = accept(
            &slots,
            NodeInput::Upsert(node("n1", "i-1")),
            &cache,
            |_, _| false,
        );
        assert_eq!(a.wait, None, "no describe");
        assert!(a.queue.is_some(), "queued: the pass reports the refusal");
        assert!(!cache.read().unwrap().manages("i-1"));
        let a = accept(&slots, NodeInput::Upsert(node("n1", "i-1")), &cache, all);
        assert_eq!(a.wait, Some(("i-1".into(), "n1".into())));
        assert!(cache.read().unwrap().manages("i-1"));
    }

    fn node(name: &str, instance: &str) -> Box<CiliumNode> {
        let mut n = testkit::node();
        n.metadata.name = Some(name.into());
        n.spec.instance_id = instance.into();
        Box::new(n)
    }

    #[test]
    fn an_upsert_of_an_unknown_instance_waits_for_its_refresh() {
        let slots = Mutex::new(Slots::new());
        let a = accept(&slots, NodeInput::Upsert(node("n1", "i-1")), &cache(), all);
        assert_eq!(a.wait, Some(("i-1".into(), "n1".into())));
        assert_eq!(a.queue, None);
        assert!(slots.lock().unwrap()["n1"].node.is_some());
    }

    #[test]
    fn an_upsert_without_an_instance_is_queued_at_once() {
        let slots = Mutex::new(Slots::new());
        let a = accept(&slots, NodeInput::Upsert(node("n1", "")), &cache(), all);
        assert_eq!(a.wait, None);
        assert_eq!(a.queue.map(|(n, _)| n).as_deref(), Some("n1"));
    }

    #[test]
    fn an_ignored_node_without_our_finalizer_is_let_go() {
        let slots = Mutex::new(Slots::new());
        let cache = cache();
        accept(&slots, NodeInput::Upsert(node("n1", "i-1")), &cache, all);
        let mut n = node("n1", "i-1");
        n.metadata.annotations = Some([(IGNORE_ANNOTATION.into(), "true".into())].into());
        let a = accept(&slots, NodeInput::Upsert(n.clone()), &cache, all);
        assert_eq!(a.forget.as_deref(), Some("i-1"));
        assert_eq!(a.dequeue.as_deref(), Some("n1"));
        assert!(slots.lock().unwrap().is_empty());

        // With our finalizer it stays until the finalizer is removed.
        n.metadata.finalizers = Some(vec![FINALIZER.into()]);
        let a = accept(&slots, NodeInput::Upsert(n), &cache, all);
        assert_eq!(a.queue, Some(("n1".into(), Priority::Deleting)));
        assert!(slots.lock().unwrap()["n1"].ignored);
    }

    #[test]
    fn a_deleted_node_forgets_its_instance() {
        let slots = Mutex::new(Slots::new());
        accept(&slots, NodeInput::Upsert(node("n1", "i-1")), &cache(), all);
        let a = accept(&slots, NodeInput::Deleted("n1".into()), &cache(), all);
        assert_eq!(a.forget.as_deref(), Some("i-1"));
        assert_eq!(a.dequeue.as_deref(), Some("n1"));
        assert!(slots.lock().unwrap().is_empty());
    }

    #[test]
    fn node_presence_only_counts_for_nodes_we_hold() {
        let slots = Mutex::new(Slots::new());
        let gone = |n: &str| NodeInput::NodePresent {
            name: n.into(),
            present: false,
        };
        assert_eq!(
            accept(&slots, gone("n1"), &cache(), all),
            Accepted::default()
        );
        assert!(slots.lock().unwrap().is_empty());
        accept(&slots, NodeInput::Upsert(node("n1", "")), &cache(), all);
        let a = accept(&slots, gone("n1"), &cache(), all);
        assert_eq!(a.queue, Some(("n1".into(), Priority::Deleting)));
        assert_eq!(
            priority_of(&slots.lock().unwrap()["n1"]),
            Priority::Deleting
        );
    }

    /// `make dst` seed 28: a CiliumNode deleted and written again under the same name while
    /// the watch relisted (no Deleted seen) kept the old object's grace-period start, so the
    /// next deletion of the Node released the ENIs of its running instance at once.
    #[test]
    fn a_new_object_under_the_same_name_starts_afresh() {
        let slots = Mutex::new(Slots::new());
        let cache = cache();
        let with_uid = |uid: &str| {
            let mut n = node("n1", "");
            n.metadata.uid = Some(uid.into());
            n
        };
        accept(&slots, NodeInput::Upsert(with_uid("u1")), &cache, all);
        let since = Instant::now();
        slots.lock().unwrap().get_mut("n1").unwrap().node_gone_since = Some(since);
        slots.lock().unwrap().get_mut("n1").unwrap().pending_pods = 2;
        accept(&slots, NodeInput::Upsert(with_uid("u1")), &cache, all);
        assert_eq!(
            slots.lock().unwrap()["n1"].node_gone_since,
            Some(since),
            "the same object keeps what is known of it"
        );
        accept(&slots, NodeInput::Upsert(with_uid("u2")), &cache, all);
        let s = &slots.lock().unwrap()["n1"];
        assert_eq!(s.node_gone_since, None, "a new object starts afresh");
        assert_eq!(s.pending_pods, 2, "the Pod watch's count is about the name");
    }

    #[test]
    fn a_node_seen_present_again_ends_its_grace_period() {
        let slots = Mutex::new(Slots::new());
        accept(&slots, NodeInput::Upsert(node("n1", "")), &cache(), all);
        slots.lock().unwrap().get_mut("n1").unwrap().node_gone_since = Some(Instant::now());
        let present = |present| NodeInput::NodePresent {
            name: "n1".into(),
            present,
        };
        accept(&slots, present(false), &cache(), all);
        assert!(slots.lock().unwrap()["n1"].node_gone_since.is_some());
        accept(&slots, present(true), &cache(), all);
        assert_eq!(slots.lock().unwrap()["n1"].node_gone_since, None);
    }

    #[test]
    fn pending_pods_before_the_cilium_node_are_kept_until_zero() {
        let slots = Mutex::new(Slots::new());
        let pods = |count| NodeInput::PendingPods {
            name: "n1".into(),
            count,
        };
        assert_eq!(accept(&slots, pods(3), &cache(), all), Accepted::default());
        assert_eq!(slots.lock().unwrap()["n1"].pending_pods, 3);
        accept(&slots, pods(0), &cache(), all);
        assert!(slots.lock().unwrap().is_empty());
        accept(&slots, NodeInput::Upsert(node("n1", "")), &cache(), all);
        let a = accept(&slots, pods(4), &cache(), all);
        // Pods wait on a node with no address yet: the most urgent kind.
        assert_eq!(a.queue, Some(("n1".into(), Priority::NoFreeIp)));
    }

    #[test]
    fn an_invalid_node_is_queued_to_report_or_delete() {
        let slots = Mutex::new(Slots::new());
        let invalid = |deleting| {
            NodeInput::Invalid(InvalidNode {
                node: NodeRef {
                    name: "n1".into(),
                    ..NodeRef::default()
                },
                error: "bad".into(),
                deleting,
                instance_id: String::new(),
            })
        };
        let a = accept(&slots, invalid(false), &cache(), all);
        assert_eq!(a.queue, Some(("n1".into(), Priority::Routine)));
        let a = accept(&slots, invalid(true), &cache(), all);
        assert_eq!(a.queue, Some(("n1".into(), Priority::Deleting)));
    }

    #[test]
    fn totals_count_states_and_only_served_nodes() {
        let mut slots = Slots::new();
        let served = |available, used, needed| Slot {
            node: Some(StoredNode::new(&testkit::node())),
            demand: Demand {
                available,
                used,
                needed,
                ..Demand::default()
            },
            ..Slot::default()
        };
        slots.insert("a".into(), served(10, 4, -2));
        slots.insert("b".into(), served(0, 0, 8));
        let mut full = served(16, 16, 4);
        full.at_capacity = true;
        slots.insert("c".into(), full);
        slots.insert("d".into(), Slot::default());
        let t = totals(&slots);
        assert_eq!((t.available, t.used, t.needed), (26, 20, 12));
        assert_eq!(t.states.get("ok"), Some(&2));
        assert_eq!(t.states.get("in-deficit"), Some(&1));
        assert_eq!(t.states.get("at-capacity"), Some(&1));
        let mut names: Vec<_> = t.per_node.iter().map(|p| p.0.as_str()).collect();
        names.sort();
        assert_eq!(names, ["a", "b", "c"]);
    }
}
