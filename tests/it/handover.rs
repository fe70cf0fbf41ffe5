//! The handover from Cilium's operator, on the core with the test doubles: the guard never lets
//! eni-operator be a second allocator on a node (Cilium's Lease, managedFields), the canary
//! selector, the rollback. Paused clock; `testkit::cilium_signals` plays what Cilium's operator
//! leaves in the API server.

use std::sync::Arc;
use std::time::Duration;

use eni_operator::crd::AllocationIp;
use eni_operator::crd::{CILIUM_IGNORE_ANNOTATION, FINALIZER};
use eni_operator::ec2::{AddressRequest, Ec2, Operation};
use eni_operator::event_loop::core::{Core, CoreConfig, NodeInput};
use eni_operator::reconcile::metrics::RuntimeMetrics;
use testkit::cilium_signals::{
    annotated_ignore, cilium_creates_eni_with, cilium_lease, cilium_pool_write, own_write,
};
use testkit::cluster::{Cluster, agent_node};
use testkit::running;
use testkit::sim::Simulator;
use testkit::sink::MemorySink;
use testkit::{served, wait_until};
use tokio::sync::mpsc;

const HANDOVER_LABEL: &str = "eni-operator.cilium.io/handover";

fn config() -> CoreConfig {
    running::config(4)
}

fn start<E: Ec2>(
    ec2: E,
    sink: &Arc<MemorySink>,
    cfg: CoreConfig,
) -> (Core<E, MemorySink>, mpsc::Sender<NodeInput>) {
    let r = running::start(ec2, sink.clone(), cfg, RuntimeMetrics::default());
    (r.core, r.tx)
}

fn mutating(sim: &Simulator) -> u64 {
    Operation::ALL
        .iter()
        .filter(|o| o.is_mutating())
        .map(|o| sim.stats().get(*o).calls)
        .sum()
}

fn operator_error(sink: &MemorySink, name: &str) -> Option<String> {
    sink.get(name)?.status?.ipam.operator_status.error
}

/// Cilium's operator keeps renewing its Lease, held since `acquired`, as its leader does every
/// few seconds.
fn renew_cilium_lease(
    core: &Core<Simulator, MemorySink>,
    holder: &'static str,
    acquired: k8s_openapi::jiff::Timestamp,
) -> tokio::task::JoinHandle<()> {
    let core = core.clone();
    tokio::spawn(async move {
        loop {
            core.set_cilium_lease(Some(cilium_lease(holder, acquired, core.wall_now())));
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
    })
}

#[tokio::test(start_paused = true)]
async fn a_cilium_operator_that_knew_the_node_before_the_annotation_blocks_it_until_it_restarts() {
    let w = Cluster::new();
    let sink = Arc::new(MemorySink::new());
    let (core, tx) = start(w.sim.clone(), &sink, config());
    let now = core.wall_now();
    // Cilium's leader took over ten minutes ago, served the node, then the node was annotated.
    let old_leader = renew_cilium_lease(&core, "cilium-operator-1", now - Duration::from_secs(600));
    let inst = w.instance();
    let mut node = agent_node(&w, "n", &inst.id, 8);
    cilium_pool_write(&mut node, now - Duration::from_secs(300));
    annotated_ignore(&mut node, now - Duration::from_secs(30));
    let before = mutating(&w.sim);
    let n = sink.put(&node);
    tx.send(NodeInput::Upsert(Box::new(n))).await.unwrap();

    tokio::time::sleep(Duration::from_secs(120)).await;
    assert_eq!(
        mutating(&w.sim),
        before,
        "no EC2 mutation while Cilium serves it"
    );
    assert!(!served(&sink, "n", 8));
    let error = operator_error(&sink, "n").expect("operator-status says why");
    assert!(
        error.starts_with("OtherAllocatorActive") && error.contains("cilium-operator-1"),
        "{error}"
    );
    let stored = sink.get("n").unwrap();
    assert!(
        stored.metadata.finalizers.is_none_or(|f| f.is_empty()),
        "no finalizer while another allocator serves the node"
    );
    let events = sink.events("n");
    let warnings: Vec<_> = events
        .iter()
        .filter(|e| e.reason == "OtherAllocatorActive")
        .collect();
    assert_eq!(warnings.len(), 1, "one Event, not one per pass: {events:?}");
    assert!(warnings[0].warning);
    assert_eq!(sink.writes("n").total(), 1, "the status report only");

    // Cilium's operator restarts: its new leader never takes up the annotated node.
    old_leader.abort();
    let _new_leader = renew_cilium_lease(&core, "cilium-operator-2", core.wall_now());
    assert!(wait_until(|| served(&sink, "n", 8), Duration::from_secs(60)).await);
    assert_eq!(operator_error(&sink, "n"), None, "the error is cleared");
}

#[tokio::test(start_paused = true)]
async fn a_running_cilium_operator_serves_a_node_without_the_annotation() {
    let w = Cluster::new();
    let sink = Arc::new(MemorySink::new());
    let (core, tx) = start(w.sim.clone(), &sink, config());
    let leader = renew_cilium_lease(&core, "cilium-operator-1", core.wall_now());
    let inst = w.instance();
    let n = sink.put(&agent_node(&w, "n", &inst.id, 4));
    let before = mutating(&w.sim);
    tx.send(NodeInput::Upsert(Box::new(n))).await.unwrap();
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(mutating(&w.sim), before);
    assert!(operator_error(&sink, "n").is_some_and(|e| e.contains("lacks")));
    // Cilium's operator stops (scaled to zero): its Lease expires; the node is served.
    leader.abort();
    assert!(wait_until(|| served(&sink, "n", 4), Duration::from_secs(90)).await);
}

#[tokio::test(start_paused = true)]
async fn a_foreign_pool_write_after_the_handover_stops_allocation_until_it_is_quiet() {
    let w = Cluster::new();
    let sink = Arc::new(MemorySink::new());
    let (core, tx) = start(w.sim.clone(), &sink, config());
    let inst = w.instance();
    let n = sink.put(&agent_node(&w, "n", &inst.id, 4));
    tx.send(NodeInput::Upsert(Box::new(n))).await.unwrap();
    assert!(wait_until(|| served(&sink, "n", 4), Duration::from_secs(30)).await);

    // The other allocator keeps writing the handed-over node; the agent asks for more.
    let now = core.wall_now();
    let n = sink
        .update("n", |n| {
            own_write(n, now - Duration::from_secs(20));
            cilium_pool_write(n, now);
            n.spec.ipam.min_allocate = 12;
        })
        .unwrap();
    let before = mutating(&w.sim);
    tx.send(NodeInput::Upsert(Box::new(n))).await.unwrap();
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(mutating(&w.sim), before, "detected: no EC2 mutation");
    assert!(!served(&sink, "n", 12));
    let error = operator_error(&sink, "n").unwrap();
    assert!(
        error.contains("cilium-operator-aws wrote spec.ipam.pool"),
        "{error}"
    );
    assert!(
        sink.events("n")
            .iter()
            .any(|e| e.reason == "OtherAllocatorActive")
    );
    // It stopped: after the quiet time the node is served again.
    assert!(wait_until(|| served(&sink, "n", 12), Duration::from_secs(240)).await);
}

fn labelled(sink: &MemorySink, name: &str, on: bool) -> eni_operator::crd::CiliumNode {
    sink.update(name, |n| {
        let labels = n.metadata.labels.get_or_insert_with(Default::default);
        if on {
            labels.insert(HANDOVER_LABEL.into(), "true".into());
        } else {
            labels.remove(HANDOVER_LABEL);
        }
    })
    .unwrap()
}

#[tokio::test(start_paused = true)]
async fn canary_handover_then_rollback_releases_nothing() {
    let w = Cluster::new();
    let sink = Arc::new(MemorySink::new());
    let mut cfg = config();
    cfg.annotate_cilium_ignore = true;
    cfg.handover_selector = Some((HANDOVER_LABEL.into(), "true".into()));
    let (_core, tx) = start(w.sim.clone(), &sink, cfg);
    for name in ["a", "b"] {
        let inst = w.instance();
        sink.put(&agent_node(&w, name, &inst.id, 4));
    }
    // The canary: only "a" is labelled.
    let a = labelled(&sink, "a", true);
    tx.send(NodeInput::Upsert(Box::new(a))).await.unwrap();
    let b = sink.get("b").unwrap();
    tx.send(NodeInput::Upsert(Box::new(b))).await.unwrap();
    assert!(wait_until(|| served(&sink, "a", 4), Duration::from_secs(60)).await);
    tokio::time::sleep(Duration::from_secs(90)).await;
    assert_eq!(
        sink.writes("b").total(),
        0,
        "a node outside the canary is not written"
    );

    // All: "b" too.
    let b = labelled(&sink, "b", true);
    tx.send(NodeInput::Upsert(Box::new(b))).await.unwrap();
    assert!(wait_until(|| served(&sink, "b", 4), Duration::from_secs(60)).await);

    // Roll "a" back: label removed. Finalizer and Cilium's annotation go, nothing is released.
    let pool_before = sink.get("a").unwrap().spec.ipam.pool.len();
    let unassigned = w
        .sim
        .stats()
        .get(Operation::UnassignPrivateIpAddresses)
        .calls;
    let deleted = w.sim.stats().get(Operation::DeleteNetworkInterface).calls;
    let a = labelled(&sink, "a", false);
    tx.send(NodeInput::Upsert(Box::new(a))).await.unwrap();
    let handed_back = || {
        sink.get("a").is_some_and(|n| {
            !n.metadata
                .finalizers
                .is_some_and(|f| f.iter().any(|x| x == FINALIZER))
                && !n
                    .metadata
                    .annotations
                    .is_some_and(|a| a.contains_key(CILIUM_IGNORE_ANNOTATION))
        })
    };
    assert!(wait_until(handed_back, Duration::from_secs(30)).await);
    let writes = sink.writes("a");
    tokio::time::sleep(Duration::from_secs(150)).await;
    assert_eq!(
        sink.writes("a"),
        writes,
        "a node handed back is never written"
    );
    assert_eq!(sink.get("a").unwrap().spec.ipam.pool.len(), pool_before);
    let stats = w.sim.stats();
    assert_eq!(
        stats.get(Operation::UnassignPrivateIpAddresses).calls,
        unassigned
    );
    assert_eq!(stats.get(Operation::DeleteNetworkInterface).calls, deleted);
    // "b" stays served.
    assert!(
        sink.get("b")
            .unwrap()
            .metadata
            .finalizers
            .is_some_and(|f| f.contains(&FINALIZER.to_string()))
    );
}

#[tokio::test(start_paused = true)]
async fn an_eni_cilium_creates_after_the_handover_stops_allocation() {
    let w = Cluster::new();
    let sink = Arc::new(MemorySink::new());
    let (_core, tx) = start(w.sim.clone(), &sink, config());
    let inst = w.instance();
    let n = sink.put(&agent_node(&w, "n", &inst.id, 4));
    tx.send(NodeInput::Upsert(Box::new(n))).await.unwrap();
    assert!(wait_until(|| served(&sink, "n", 4), Duration::from_secs(30)).await);

    // Cilium's operator still serves the node: it attaches an ENI of its own.
    let eni = testkit::cilium_signals::cilium_creates_eni(&w, &inst.id, 2).await;
    // The next full refresh sees it; the agent asks for more.
    tokio::time::sleep(Duration::from_secs(70)).await;
    let n = sink.update("n", |n| n.spec.ipam.min_allocate = 40).unwrap();
    let before = mutating(&w.sim);
    tx.send(NodeInput::Upsert(Box::new(n))).await.unwrap();
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(mutating(&w.sim), before, "detected: no EC2 mutation");
    let error = operator_error(&sink, "n").unwrap();
    assert!(error.contains(&eni), "{error}");
}

/// Cilium's operator served the node until just before the handover: its last assign is still
/// hidden from describes (EC2's eventual consistency) when eni-operator takes the node over. The
/// first pool write must not drop the addresses Cilium pooled (found by the e2e `handover`
/// scenario on ec2-sim: the pool lost two addresses EC2 had, then an assign failed on the full
/// ENI). Rule: docs/rules.md §14.3.
#[tokio::test(start_paused = true)]
async fn a_takeover_right_after_the_other_allocators_last_assign_keeps_its_pool() {
    let w = Cluster::new();
    let sink = Arc::new(MemorySink::new());
    let (core, tx) = start(w.sim.clone(), &sink, config());
    let inst = w.instance();
    let eni = cilium_creates_eni_with(&w, &inst.id, 1, 4).await;
    // The operator lists the instance before Cilium's last assign (its start-up refresh).
    tokio::time::sleep(Duration::from_secs(5)).await;
    // Cilium's last round: 3 more addresses, invisible to describes for a while (as on AWS).
    w.sim
        .set_eventual_consistency(Duration::from_secs(25), false, 7);
    let more = w
        .sim
        .assign_private_ip_addresses(&eni.id, AddressRequest::Ips(3))
        .await
        .expect("assign");
    let cilium_pool: Vec<String> = eni
        .secondary_ips
        .iter()
        .chain(&more.ips)
        .map(|ip| ip.to_string())
        .collect();
    assert_eq!(cilium_pool.len(), 7);
    let mut node = agent_node(&w, "n", &inst.id, 4);
    for ip in &cilium_pool {
        node.spec.ipam.pool.insert(
            ip.clone(),
            AllocationIp {
                resource: eni.id.clone(),
                ..Default::default()
            },
        );
    }
    // Cilium's operator wrote the pool just now and was stopped (no Lease): the handover.
    cilium_pool_write(&mut node, core.wall_now());
    let n = sink.put(&node);
    tx.send(NodeInput::Upsert(Box::new(n))).await.unwrap();

    // Every moment of the next two minutes: the pool keeps what Cilium gave the node.
    for _ in 0..1200 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let pool = sink.get("n").unwrap().spec.ipam.pool;
        for ip in &cilium_pool {
            assert!(pool.contains_key(ip), "{ip} left the pool: {pool:?}");
        }
    }
    assert!(served(&sink, "n", 7));
    let assigns = w.sim.stats().get(Operation::AssignPrivateIpAddresses);
    assert_eq!(
        assigns.calls - assigns.throttled - assigns.faults,
        assigns.ok,
        "no assign refused (an ENI EC2 already filled): {assigns:?}"
    );
}

/// Issue 32: Cilium's operator before 1.18 does not know `ipam.cilium.io/ignore` (the 1.16
/// binary lacks the string), so a restart after the annotation does not hand the node over: it
/// keeps serving it. With its CRD schema label naming 1.16, ours keeps off the node however the
/// Lease looks; after Cilium's upgrade (label 1.31.x, a new leader) the node is ours. On the old
/// main the restarted 1.16 leader let ours allocate beside it.
#[tokio::test(start_paused = true)]
async fn a_cilium_operator_older_than_the_annotation_keeps_the_node_after_its_restart() {
    use eni_operator::ipam::cilium_version::CiliumVersion;
    let w = Cluster::new();
    let sink = Arc::new(MemorySink::new());
    let metrics = RuntimeMetrics::default();
    let mut cfg = config();
    cfg.annotate_cilium_ignore = true;
    let running::Running { core, tx, .. } =
        running::start(w.sim.clone(), sink.clone(), cfg, metrics.clone());
    core.set_cilium_version(CiliumVersion::from_label(Some("1.29.4")));
    assert_eq!(
        metrics.cilium_ignore_unsupported.get(),
        0,
        "Cilium's operator is not running yet"
    );
    let now = core.wall_now();
    // Cilium served the node, it was annotated, then Cilium's operator restarted.
    let inst = w.instance();
    let mut node = agent_node(&w, "n", &inst.id, 8);
    cilium_pool_write(&mut node, now - Duration::from_secs(600));
    annotated_ignore(&mut node, now - Duration::from_secs(300));
    let leader = renew_cilium_lease(&core, "cilium-operator-116", now - Duration::from_secs(60));
    let before = mutating(&w.sim);
    let n = sink.put(&node);
    tx.send(NodeInput::Upsert(Box::new(n))).await.unwrap();

    tokio::time::sleep(Duration::from_secs(120)).await;
    assert_eq!(metrics.cilium_ignore_unsupported.get(), 1);
    assert_eq!(
        mutating(&w.sim),
        before,
        "no EC2 mutation while 1.16 serves it"
    );
    assert!(!served(&sink, "n", 8));
    let error = operator_error(&sink, "n").expect("operator-status says why");
    assert!(
        error.starts_with("CiliumIgnoresAnnotation")
            && error.contains("Cilium operator 1.16")
            && error.contains("upgrade Cilium to 1.18"),
        "{error}"
    );
    assert!(
        sink.get("n")
            .unwrap()
            .metadata
            .finalizers
            .is_none_or(|f| f.is_empty()),
        "not taken over"
    );
    let events = sink.events("n");
    let warnings = events
        .iter()
        .filter(|e| e.reason == "CiliumIgnoresAnnotation")
        .count();
    assert_eq!(warnings, 1, "one Event: {events:?}");

    // Cilium upgraded: its operator rewrote the label and a new leader started.
    core.set_cilium_version(CiliumVersion::from_label(Some("1.31.10")));
    assert_eq!(metrics.cilium_ignore_unsupported.get(), 0);
    leader.abort();
    let _new = renew_cilium_lease(&core, "cilium-operator-118", core.wall_now());
    assert!(wait_until(|| served(&sink, "n", 8), Duration::from_secs(60)).await);
    assert_eq!(operator_error(&sink, "n"), None, "the error is cleared");
}

/// The guard fails closed when Cilium's release cannot be told (no label, CRD unreadable) while
/// its Lease is held; `--cilium-honours-ignore` (the user vouched) lets the handover go on.
#[tokio::test(start_paused = true)]
async fn an_unknown_cilium_release_holds_the_handover_until_the_user_vouches_for_it() {
    use eni_operator::ipam::cilium_version::CiliumVersion;
    let w = Cluster::new();
    let sink = Arc::new(MemorySink::new());
    let mut cfg = config();
    cfg.annotate_cilium_ignore = true;
    let (core, tx) = start(w.sim.clone(), &sink, cfg);
    core.set_cilium_version(CiliumVersion::from_label(None));
    let now = core.wall_now();
    let inst = w.instance();
    let mut node = agent_node(&w, "n", &inst.id, 8);
    annotated_ignore(&mut node, now - Duration::from_secs(300));
    let _leader = renew_cilium_lease(&core, "cilium-operator-1", now - Duration::from_secs(60));
    let before = mutating(&w.sim);
    let n = sink.put(&node);
    tx.send(NodeInput::Upsert(Box::new(n))).await.unwrap();
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(mutating(&w.sim), before);
    let error = operator_error(&sink, "n").unwrap_or_default();
    assert!(
        error.starts_with("CiliumIgnoresAnnotation") && error.contains("--cilium-honours-ignore"),
        "{error}"
    );
    core.set_cilium_version(CiliumVersion::Vouched);
    assert!(wait_until(|| served(&sink, "n", 8), Duration::from_secs(60)).await);
}
