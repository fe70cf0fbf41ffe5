//! The per-node status of the active core (`/debug/nodes`, `eni-operator status`) on the test
//! doubles: a node that waits says why, with the time it is retried, on the page and on
//! `eni_operator_nodes_waiting{reason}`; once served it waits no more and shows its last
//! action. Paused clock.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use eni_operator::clock::now;
use eni_operator::ec2::gate::{Gate, GateConfig, GateLayer};
use eni_operator::ec2::{Ec2, Operation};
use eni_operator::event_loop::core::{Core, NodeInput};
use eni_operator::metrics::MetricsRegistry;
use eni_operator::reconcile::metrics::RuntimeMetrics;
use eni_operator::reconcile::status::{ThrottledPasses, WaitReason, Would};
use testkit::cilium_signals::{annotated_ignore, cilium_lease, cilium_pool_write};
use testkit::cluster::{Cluster, agent_node};
use testkit::running;
use testkit::served;
use testkit::sink::MemorySink;
use tokio::sync::mpsc;

fn start<E: Ec2>(
    ec2: E,
    sink: &Arc<MemorySink>,
) -> (
    Core<E, MemorySink>,
    mpsc::Sender<NodeInput>,
    MetricsRegistry,
) {
    let registry = MetricsRegistry::new();
    let metrics = registry.with(RuntimeMetrics::register);
    let r = running::start(ec2, sink.clone(), running::config(4), metrics);
    (r.core, r.tx, registry)
}

fn waiting_gauge(registry: &MetricsRegistry, reason: WaitReason) -> String {
    let text = registry.encode();
    let series = format!(
        "eni_operator_nodes_waiting{{reason=\"{}\"}} ",
        reason.as_str()
    );
    text.lines()
        .find_map(|l| l.strip_prefix(series.as_str()))
        .unwrap_or("absent")
        .to_string()
}

/// Step the paused clock by `step` until `done`, collecting the wait reasons of `name` seen.
async fn watch<E: Ec2>(
    core: &Core<E, MemorySink>,
    name: &str,
    step: Duration,
    limit: Duration,
    mut done: impl FnMut() -> bool,
) -> (BTreeSet<WaitReason>, bool) {
    let book = core.status_book();
    let mut seen = BTreeSet::new();
    let end = now() + limit;
    while now() < end {
        if let Some(w) = book.node(name, now()).and_then(|n| n.waiting) {
            assert!(!w.detail.is_empty(), "a wait says why: {w:?}");
            assert!(
                w.retry_at.is_some(),
                "a wait says when it is retried: {w:?}"
            );
            seen.insert(w.reason);
        }
        if done() {
            return (seen, true);
        }
        tokio::time::sleep(step).await;
    }
    (seen, false)
}

#[tokio::test(start_paused = true)]
async fn a_node_another_allocator_serves_waits_for_it_and_says_so() {
    let w = Cluster::new();
    let sink = Arc::new(MemorySink::new());
    let (core, tx, registry) = start(w.sim.clone(), &sink);
    let wall = core.wall_now();
    core.set_cilium_lease(Some(cilium_lease(
        "cilium-operator-1",
        wall - Duration::from_secs(600),
        wall,
    )));
    let inst = w.instance();
    let mut node = agent_node(&w, "n", &inst.id, 8);
    cilium_pool_write(&mut node, wall - Duration::from_secs(300));
    annotated_ignore(&mut node, wall - Duration::from_secs(30));
    let n = sink.put(&node);
    tx.send(NodeInput::Upsert(Box::new(n))).await.unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;

    let page = core.status_book().page(now());
    let status = &page.nodes["n"];
    let wait = status.waiting.as_ref().expect("the node waits");
    assert_eq!(wait.reason, WaitReason::OtherAllocator);
    assert!(wait.detail.contains("cilium-operator-1"), "{}", wait.detail);
    let retry = wait.retry_in_seconds.expect("a retry time");
    assert!(
        retry > 0.0 && retry <= 15.0,
        "rechecked within 15 s: {retry}"
    );
    assert_eq!(page.totals.nodes_waiting, 1);
    assert_eq!(waiting_gauge(&registry, WaitReason::OtherAllocator), "1");
    assert_eq!(waiting_gauge(&registry, WaitReason::Throttled), "0");
    assert!(status.last_action.is_none(), "nothing done for it");
}

#[tokio::test(start_paused = true)]
async fn a_throttled_node_says_so_while_the_gate_retries_then_shows_what_it_got() {
    let w = Cluster::new();
    // The account's bucket is drained by other tools: the first attaches are throttled.
    w.sim
        .inject_error(Operation::AttachNetworkInterface, "RequestLimitExceeded", 3);
    let sink = Arc::new(MemorySink::new());
    // The gate reports throttled calls to the passes' status, as the operator's does.
    let layer = GateLayer::new(GateConfig::aws_defaults()).reporting_throttles_to(ThrottledPasses);
    let gate = Gate::new(w.sim.clone(), layer);
    let (core, tx, registry) = start(gate, &sink);
    let inst = w.instance();
    let n = sink.put(&agent_node(&w, "n", &inst.id, 8));
    tx.send(NodeInput::Upsert(Box::new(n))).await.unwrap();

    let step = Duration::from_millis(50);
    let (seen, ok) = watch(&core, "n", step, Duration::from_secs(120), || {
        served(&sink, "n", 8)
    })
    .await;
    assert!(ok, "served");
    assert!(
        seen.contains(&WaitReason::Throttled),
        "status showed the throttled attach: {seen:?}"
    );
    // The next passes see the node served: it waits no more.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let status = core.status_book().node("n", now()).unwrap();
    assert_eq!(status.waiting, None, "{status:?}");
    assert_eq!(waiting_gauge(&registry, WaitReason::Throttled), "0");
    let last = status.last_action.clone().expect("its last action");
    assert!(
        matches!(last.what, Would::CreateEni { .. } | Would::Assign { .. }),
        "{last:?}"
    );
    assert!(status.figures.available >= 8, "{status:?}");
}
