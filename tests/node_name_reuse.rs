//! Node-name reuse (issue 24 item 8): a Node deleted and created again quickly under the same
//! name (AWS names Nodes by private IP, and IPs are reused; a kubelet re-registers). The watch's
//! Delete of the old Node may arrive when the new one already exists: the operator confirms
//! with a live GET before it deletes the name's CiliumNode.

use std::sync::Arc;
use std::time::Duration;

use eni_operator::ipam::IpamConfig;
use eni_operator::runtime::core::{Core, CoreConfig, NodeInput};
use eni_operator::runtime::metrics::RuntimeMetrics;
use testkit::cluster::{Cluster, agent_node};
use testkit::sink::MemorySink;
use testkit::{served, wait_until};
use tokio::sync::mpsc;

const CLUSTER: &str = "test-cluster";

#[tokio::test(start_paused = true)]
async fn a_node_deleted_and_created_again_keeps_its_cilium_node() {
    let w = Cluster::new();
    let sink = Arc::new(MemorySink::new());
    let cfg = CoreConfig {
        workers: 2,
        ipam: IpamConfig {
            cluster_name: CLUSTER.into(),
            ..IpamConfig::default()
        },
        ..CoreConfig::default()
    };
    let cache = cfg.ec2_cache();
    let core = Core::new(
        Arc::new(w.sim.clone()),
        sink.clone(),
        cfg,
        RuntimeMetrics::default(),
        cache,
    );
    let (tx, rx) = mpsc::channel(64);
    let _task = tokio::spawn(core.clone().run(rx, std::future::pending()));
    let inst = w.instance();
    sink.put_node("n", &[]);
    let stored = sink.put(&agent_node(&w, "n", &inst.id, 8));
    tx.send(NodeInput::Upsert(Box::new(stored))).await.unwrap();
    assert!(wait_until(|| served(&sink, "n", 8), Duration::from_secs(60)).await);
    let before = sink.raw("n").unwrap();

    // The old Node was deleted and a new one registered under the name before the watch's
    // Delete arrived: the API server has a Node "n" (a new object, a new uid).
    sink.set_node_exists("n", false);
    sink.put_node("n", &[]);
    tx.send(NodeInput::NodePresent {
        name: "n".into(),
        present: false,
    })
    .await
    .unwrap();
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
    sink.set_node_exists("n", false);
    tx.send(NodeInput::NodePresent {
        name: "n".into(),
        present: false,
    })
    .await
    .unwrap();
    assert!(wait_until(|| sink.raw("n").is_none(), Duration::from_secs(120)).await);
}
