//! Bad input and late events: a node that cannot be served gets an error and the rest proceed;
//! events for nodes the core never knew leave no state.

use std::sync::Arc;
use std::time::Duration;

use eni_operator::event_loop::core::NodeInput;
use eni_operator::k8s::source::{parse_node, to_input};
use testkit::cluster::{Cluster, agent_node};
use testkit::sink::MemorySink;
use testkit::{all_served, served, wait_until};

use super::support::{config, join, operator_error, start_with_cache, started};

#[tokio::test(start_paused = true)]
async fn a_node_with_a_bad_spec_gets_an_error_and_the_rest_proceed() {
    let (w, sink, (_core, tx, _task)) = started(config(4));
    // Malformed: a string where a number belongs. The source reports it per object.
    let inst = w.instance();
    let bad = sink.put(&agent_node(&w, "bad", &inst.id, 4));
    let mut raw = serde_json::to_value(&bad).unwrap();
    raw["spec"]["ipam"]["pre-allocate"] = serde_json::json!("lots");
    parse_node(raw.clone()).expect_err("does not parse");
    tx.send(to_input(&serde_json::from_value(raw).unwrap()))
        .await
        .unwrap();
    // Parses, but no instance ID: the engine refuses it.
    let noid = sink.put(&agent_node(&w, "noid", "", 4));
    tx.send(NodeInput::Upsert(Box::new(noid))).await.unwrap();
    let mut good = Vec::new();
    for i in 0..5 {
        let inst = w.instance();
        let name = format!("good-{i}");
        let n = sink.put(&agent_node(&w, &name, &inst.id, 12));
        tx.send(NodeInput::Upsert(Box::new(n))).await.unwrap();
        good.push(name);
    }
    assert!(all_served(&sink, &good, 12, Duration::from_secs(120)).await);
    let bad_error = operator_error(&sink, "bad").expect("bad node has an error");
    assert!(bad_error.contains("InvalidSpec"), "{bad_error}");
    assert!(
        sink.events("bad")
            .iter()
            .any(|e| e.warning && e.reason == "InvalidSpec")
    );
    assert!(operator_error(&sink, "noid").is_some());
    assert!(sink.events("noid").iter().any(|e| e.warning));
    assert!(sink.get("bad").unwrap().spec.ipam.pool.is_empty());
    for n in &good {
        assert_eq!(operator_error(&sink, n), None);
        assert!(sink.events(n).iter().any(|e| !e.warning));
    }
}

#[tokio::test(start_paused = true)]
async fn late_node_events_for_unknown_nodes_leave_no_state() {
    let w = Cluster::new();
    let sink = Arc::new(MemorySink::new());
    let ((core, tx, _task), cache) = start_with_cache(w.sim.clone(), &sink, config(4));
    let inst = join(&w, &sink, &tx, "n", 4).await;
    assert!(wait_until(|| served(&sink, "n", 4), Duration::from_secs(30)).await);
    tx.send(NodeInput::Deleted("n".into())).await.unwrap();
    // Events that arrive after the CiliumNode is gone, or for Nodes without one.
    for input in [
        NodeInput::NodePresent {
            name: "n".into(),
            present: false,
        },
        NodeInput::PendingPods {
            name: "n".into(),
            count: 0,
        },
        NodeInput::NodePresent {
            name: "fargate-1".into(),
            present: true,
        },
        NodeInput::PendingPods {
            name: "pending-1".into(),
            count: 3,
        },
    ] {
        tx.send(input).await.unwrap();
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(core.demand("n").is_none(), "no slot for a deleted node");
    assert!(
        core.demand("fargate-1").is_none(),
        "no slot for a Node alone"
    );
    assert!(
        core.demand("pending-1").is_some(),
        "a pending count waits for its CiliumNode"
    );
    tx.send(NodeInput::PendingPods {
        name: "pending-1".into(),
        count: 0,
    })
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(core.demand("pending-1").is_none(), "and goes at zero");
    assert!(
        cache.read().unwrap().instance(&inst.id).is_none(),
        "the deleted node's instance is forgotten"
    );
}
