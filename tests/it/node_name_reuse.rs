//! Node-name reuse (issue 24 item 8): a Node deleted and created again quickly under the same
//! name (AWS names Nodes by private IP, and IPs are reused; a kubelet re-registers). The watch's
//! Delete of the old Node may arrive when the new one already exists: the operator confirms
//! with a live GET before it deletes the name's CiliumNode.

use std::sync::Arc;
use std::time::Duration;

use eni_operator::ec2::{InstanceState, Operation};
use eni_operator::event_loop::core::NodeInput;
use eni_operator::reconcile::metrics::RuntimeMetrics;
use testkit::cluster::{Cluster, agent_node};
use testkit::running;
use testkit::sink::MemorySink;
use testkit::{served, wait_until};
use tokio::sync::mpsc;

/// A core serving one classic node "n" (its Node present), and what the tests look at.
struct Served {
    w: Cluster,
    sink: Arc<MemorySink>,
    tx: mpsc::Sender<NodeInput>,
    metrics: RuntimeMetrics,
    inst: eni_operator::ec2::Instance,
    grace: Duration,
    _task: tokio::task::JoinHandle<eni_operator::ec2::Result<()>>,
}

async fn served_node() -> Served {
    let w = Cluster::new();
    let sink = Arc::new(MemorySink::new());
    let cfg = running::config(2);
    let grace = cfg.node_gone_grace;
    let metrics = RuntimeMetrics::default();
    let running::Running {
        tx, task: _task, ..
    } = running::start(w.sim.clone(), sink.clone(), cfg, metrics.clone());
    let inst = w.instance();
    sink.put_node("n", &[]);
    let stored = sink.put(&agent_node(&w, "n", &inst.id, 8));
    tx.send(NodeInput::Upsert(Box::new(stored))).await.unwrap();
    assert!(wait_until(|| served(&sink, "n", 8), Duration::from_secs(60)).await);
    Served {
        w,
        sink,
        tx,
        metrics,
        inst,
        grace,
        _task,
    }
}

#[tokio::test(start_paused = true)]
async fn a_node_deleted_and_created_again_keeps_its_cilium_node() {
    let Served {
        w, sink, tx, inst, ..
    } = served_node().await;
    let before = sink.raw("n").unwrap();

    // The old Node was deleted and a new one registered under the name before the watch's
    // Delete arrived: the API server has a Node "n" (a new object, a new uid).
    sink.set_node_exists("n", false);
    sink.put_node("n", &[]);
    running::node_present(&tx, "n", false).await;
    tokio::time::sleep(Duration::from_secs(30)).await;
    let now = sink
        .raw("n")
        .expect("the CiliumNode of a present Node is kept");
    assert_eq!(
        now.pointer("/metadata/uid"),
        before.pointer("/metadata/uid"),
        "the same object"
    );
    assert!(
        now.pointer("/metadata/deletionTimestamp").is_none(),
        "not being deleted: {now}"
    );
    assert!(served(&sink, "n", 8), "still served");

    // Once the Node is really gone (and its instance with it), the watch's word is confirmed.
    w.sim
        .set_instance_state(&inst.id, eni_operator::ec2::InstanceState::Terminated);
    running::node_gone(&sink, &tx, "n").await;
    assert!(wait_until(|| sink.raw("n").is_none(), Duration::from_secs(120)).await);
}

/// A finalizer that cannot finish (here: every DetachNetworkInterface refused, as with a
/// missing IAM permission) says so on the object, once (operator-status, one Warning Event,
/// `errors_total{reason="FinalizerBlocked"}`), keeps retrying, and after the grace period lets
/// the CiliumNode go (`FinalizerLetGo`, `finalizers_let_go_total`) so that the name is free for
/// a new instance's CiliumNode. On the old main the object stayed Terminating for ever, with
/// one `Ec2Error` Event per retry and nothing on its status.
#[tokio::test(start_paused = true)]
async fn a_finalizer_that_cannot_finish_says_so_and_lets_go_after_the_grace_period() {
    let node = served_node().await;
    let (w, sink, tx, metrics) = (&node.w, &node.sink, &node.tx, &node.metrics);
    let (inst, grace) = (&node.inst, node.grace);

    // The instance is terminated and its Node deleted, but every detach is refused.
    w.sim.inject_error(
        Operation::DetachNetworkInterface,
        "UnauthorizedOperation",
        10_000,
    );
    w.sim
        .set_instance_state(&inst.id, InstanceState::Terminated);
    sink.set_node_exists("n", false);
    let marked = sink.begin_delete("n").expect("held by our finalizer");
    running::node_present(tx, "n", false).await;
    tx.send(NodeInput::Upsert(Box::new(marked))).await.unwrap();
    let error = |sink: &MemorySink| {
        sink.get("n")
            .and_then(|n| n.status?.ipam.operator_status.error)
            .unwrap_or_default()
    };
    assert!(
        wait_until(
            || error(sink).starts_with("FinalizerBlocked"),
            Duration::from_secs(120)
        )
        .await,
        "reported on the object: {:?}",
        error(sink)
    );
    assert!(
        error(sink).contains("UnauthorizedOperation"),
        "{}",
        error(sink)
    );
    // Retried meanwhile, reported once.
    tokio::time::sleep(grace / 2).await;
    let detaches = w.sim.stats().get(Operation::DetachNetworkInterface).calls;
    assert!(detaches > 2, "retried: {detaches} detaches");
    let reasons = |sink: &MemorySink| -> Vec<String> {
        sink.events("n").into_iter().map(|e| e.reason).collect()
    };
    let blocked = |sink: &MemorySink| {
        reasons(sink)
            .iter()
            .filter(|r| *r == "FinalizerBlocked")
            .count()
    };
    assert_eq!(blocked(sink), 1, "{:?}", reasons(sink));
    assert!(sink.raw("n").is_some(), "held within the grace period");
    assert_eq!(
        metrics
            .errors
            .get_or_create(&vec![("reason", "FinalizerBlocked".to_string())])
            .get(),
        1
    );

    // After the grace period the object goes; nothing of the name is held any longer.
    assert!(wait_until(|| sink.raw("n").is_none(), grace).await);
    assert!(
        reasons(sink).iter().any(|r| r == "FinalizerLetGo"),
        "{:?}",
        reasons(sink)
    );
    assert_eq!(metrics.finalizers_let_go.get(), 1);
    assert_eq!(blocked(sink), 1);
}

/// Issue 29 item 6 (the e2e `node-reregister`): a CiliumNode deleted while its instance runs
/// and its Node is there (a kubelet re-registration), let go by our finalizer at once, then
/// created again by the agent under the name (a new uid). The new object is served within
/// seconds with the ENIs and addresses the instance has: no new ENI, no assign. It used to
/// wait out `DESCRIBE_LAG` (30 s) after our last change to the instance: forgetting the
/// instance kept only that change's time, so every listing within the lag was dropped and the
/// instance stayed unknown (the e2e: served 32.4 s after the Node came back).
#[tokio::test(start_paused = true)]
async fn a_cilium_node_created_again_for_its_running_instance_is_served_at_once_as_it_was() {
    let Served {
        w, sink, tx, inst, ..
    } = served_node().await;
    let pool = |sink: &MemorySink| {
        let n = sink.get("n").expect("the CiliumNode");
        n.spec.ipam.pool.keys().cloned().collect::<Vec<_>>()
    };
    let before = pool(&sink);
    let marked = sink.begin_delete("n").expect("held by our finalizer");
    tx.send(NodeInput::Upsert(Box::new(marked))).await.unwrap();
    // Its Node is there: nothing to release, the object goes.
    assert!(wait_until(|| sink.raw("n").is_none(), Duration::from_secs(10)).await);
    tx.send(NodeInput::Deleted("n".into())).await.unwrap();
    let changes = |w: &Cluster| {
        let calls = |op| w.sim.stats().get(op).calls;
        (
            calls(Operation::CreateNetworkInterface),
            calls(Operation::AssignPrivateIpAddresses),
        )
    };
    let changed = changes(&w);
    let back = tokio::time::Instant::now();
    let fresh = sink.put(&agent_node(&w, "n", &inst.id, 8));
    tx.send(NodeInput::Upsert(Box::new(fresh))).await.unwrap();
    assert!(wait_until(|| served(&sink, "n", 8), Duration::from_secs(120)).await);
    let took = back.elapsed().as_secs_f64();
    assert!(
        took <= 5.0,
        "served {took:.1} s after its CiliumNode came back"
    );
    assert_eq!(pool(&sink), before, "the addresses it had");
    assert_eq!(changes(&w), changed, "no new ENI, no assign");
}
