//! The handover guard fails closed (issue 29 item 3, docs/rules.md §16): while Cilium
//! operator's Lease cannot be read, a node not taken over yet gets no EC2 call and no takeover
//! write; one already served goes on; the node is served once the Lease is readable (or the
//! user says Cilium's operator is absent). On the old main an unreadable Lease blocked nothing.

use std::sync::Arc;
use std::time::Duration;

use eni_operator::ec2::Operation;
use eni_operator::event_loop::core::NodeInput;
use eni_operator::ipam::handover::CiliumLease;
use eni_operator::reconcile::metrics::RuntimeMetrics;
use testkit::cluster::{Cluster, agent_node};
use testkit::running;
use testkit::sink::MemorySink;
use testkit::{served, wait_until};

#[tokio::test(start_paused = true)]
async fn an_unreadable_cilium_lease_holds_back_every_node_not_taken_over_yet() {
    let w = Cluster::new();
    let sink = Arc::new(MemorySink::new());
    let metrics = RuntimeMetrics::default();
    let running::Running { core, tx, .. } = running::start(
        w.sim.clone(),
        sink.clone(),
        running::config(2),
        metrics.clone(),
    );
    let (a, b) = (w.instance(), w.instance());
    for (name, inst) in [("served", &a), ("new", &b)] {
        sink.put_node(name, &[]);
        let n = sink.put(&agent_node(&w, name, &inst.id, 8));
        if name == "served" {
            tx.send(NodeInput::Upsert(Box::new(n))).await.unwrap();
            assert!(wait_until(|| served(&sink, "served", 8), Duration::from_secs(60)).await);
            // A 404 in --cilium-namespace from now on.
            core.set_cilium_lease_state(CiliumLease::Unreadable(
                "Lease kube-system/cilium-operator-resource-lock not found".into(),
            ));
        } else {
            tx.send(NodeInput::Upsert(Box::new(n))).await.unwrap();
        }
    }
    let error = |name: &str| {
        sink.get(name)
            .and_then(|n| n.status?.ipam.operator_status.error)
            .unwrap_or_default()
    };
    assert!(
        wait_until(
            || error("new").starts_with("CiliumLeaseUnreadable"),
            Duration::from_secs(60)
        )
        .await,
        "{}",
        error("new")
    );
    // What the user reads: the reason, then what to do, in plain words.
    assert!(
        error("new").contains("until it can be read (or --cilium-operator-absent says"),
        "{}",
        error("new")
    );
    let attaches = w.sim.stats().get(Operation::AttachNetworkInterface).calls;
    tokio::time::sleep(Duration::from_secs(120)).await;
    let new = sink.get("new").unwrap();
    assert!(
        new.spec.ipam.pool.is_empty(),
        "no pool for a node not taken over"
    );
    assert!(
        new.metadata.finalizers.unwrap_or_default().is_empty(),
        "not taken over"
    );
    assert_eq!(
        w.sim.stats().get(Operation::AttachNetworkInterface).calls,
        attaches,
        "no EC2 call for it"
    );
    assert!(
        sink.events("new")
            .iter()
            .any(|e| e.reason == "CiliumLeaseUnreadable")
    );
    assert_eq!(metrics.cilium_lease_unreadable.get(), 1);
    assert!(served(&sink, "served", 8), "a node already ours goes on");

    // The user says Cilium's operator is absent (or the Lease becomes readable).
    core.set_cilium_lease_state(CiliumLease::Absent);
    assert_eq!(metrics.cilium_lease_unreadable.get(), 0);
    assert!(wait_until(|| served(&sink, "new", 8), Duration::from_secs(60)).await);
}
