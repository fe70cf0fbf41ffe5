use super::*;
use crate::ipam::fixtures;
use crate::k8s::sink::NodeRef;

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
    let mut n = fixtures::node();
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
        node: Some(StoredNode::new(&fixtures::node())),
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
