//! Nodes going away: the finalizer, draining nodes, deleted Nodes of running instances, and the ENI
//! GC (only ours, only this cluster's).

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Duration;

use eni_operator::ec2::{
    AddressRequest, CreateEniRequest, Ec2, InstanceState, NetworkInterface, Tags,
};
use eni_operator::event_loop::core::NodeInput;
use eni_operator::ipam::ownership::ownership_tags;
use eni_operator::k8s::source::{node_input, to_input};
use eni_operator::reconcile::gc::EniGc;
use ipnet::Ipv4Net;
use kube::api::DynamicObject;
use kube::runtime::watcher::Event;
use testkit::cluster::{Cluster, Network, agent_node, network};
use testkit::running;
use testkit::sim::Simulator;
use testkit::sink::MemorySink;
use testkit::{served, wait_until};

use super::support::{
    CLUSTER, attached_enis, config, crash_between_create_and_attach, join, our_available_enis,
    start, started,
};

/// An ENI without our tags in the cluster's subnet, as another tool creates one.
async fn untagged_eni(w: &Cluster, description: &str) -> NetworkInterface {
    let request = CreateEniRequest {
        subnet_id: w.subnet.clone(),
        security_groups: vec![w.sg.clone()],
        description: description.into(),
        tags: Tags::new(),
        addresses: AddressRequest::Ips(0),
        client_token: String::new(),
    };
    w.sim.create_network_interface(&request).await.unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_crash_between_create_and_attach_leaves_an_eni_that_gc_removes() {
    let w = Cluster::new();
    let sink = Arc::new(MemorySink::new());
    let inst = w.instance();
    let n = sink.put(&agent_node(&w, "n", &inst.id, 16));
    // The operator dies while the attach is in flight.
    let leaked = crash_between_create_and_attach(&w, &sink, &n).await.id;
    // An untagged ENI in the same state must survive.
    let foreign = untagged_eni(&w, "someone else's").await;

    let mut gc = EniGc::new(CLUSTER, 25).with_vpcs([w.vpc.clone()]);
    let first = gc.run_once(&w.sim, &[]).await.unwrap();
    assert!(first.deleted.is_empty(), "one sighting is not enough");
    assert!(w.sim.network_interface(&leaked).is_some());
    let second = gc.run_once(&w.sim, &[]).await.unwrap();
    assert_eq!(second.deleted, vec![leaked.clone()]);
    assert!(w.sim.network_interface(&leaked).is_none());
    assert!(
        w.sim.network_interface(&foreign.id).is_some(),
        "untagged ENI untouched"
    );
}

#[tokio::test(start_paused = true)]
async fn the_finalizer_deletes_only_our_enis_and_only_when_the_node_is_gone() {
    let w = Cluster::new();
    w.sim.set_detach_delay(Duration::from_secs(3));
    let sink = Arc::new(MemorySink::new());
    let (_core, tx, _task) = start(w.sim.clone(), &sink, config(4));
    let gone = w.instance();
    let kept = w.instance();
    // Someone else's ENI on the instance whose node goes away: never ours to delete.
    let foreign = untagged_eni(&w, "vendor").await;
    for (name, inst) in [("gone", &gone), ("kept", &kept)] {
        running::add(&sink, &tx, &agent_node(&w, name, &inst.id, 8)).await;
    }
    assert!(
        wait_until(
            || served(&sink, "gone", 8) && served(&sink, "kept", 8),
            Duration::from_secs(60)
        )
        .await
    );
    // Attached after allocation, so the engine has not used it (it would: any ENI counts).
    w.sim
        .attach_network_interface(&foreign.id, &gone.id, 2)
        .await
        .unwrap();
    let ours = |enis: &[NetworkInterface], inst: &str| {
        enis.iter()
            .filter(|e| {
                ownership_tags(CLUSTER, inst)
                    .iter()
                    .all(|(k, v)| e.tags.get(k) == Some(v))
            })
            .count()
    };
    assert_eq!(ours(&attached_enis(&w.sim, &gone.id).await, &gone.id), 1);

    // The instance stops and the Node "gone" is deleted: the operator deletes the CiliumNode
    // and releases our ENI (a running instance keeps them: the next test).
    w.sim.set_instance_state(&gone.id, InstanceState::Stopped);
    running::node_gone(&sink, &tx, "gone").await;
    assert!(wait_until(|| sink.get("gone").is_none(), Duration::from_secs(120)).await);
    let left = attached_enis(&w.sim, &gone.id).await;
    assert_eq!(ours(&left, &gone.id), 0, "our ENI detached and deleted");
    assert!(
        left.iter().any(|e| e.id == foreign.id),
        "foreign ENI untouched"
    );
    assert!(
        left.iter().any(|e| e.device_index() == Some(0)),
        "primary untouched"
    );
    assert!(
        our_available_enis(&w.sim).await.is_empty(),
        "nothing left behind"
    );

    // "kept" is deleted by hand while its Node exists: nothing is released.
    let marked = sink.begin_delete("kept").expect("held by our finalizer");
    tx.send(NodeInput::Upsert(Box::new(marked))).await.unwrap();
    assert!(wait_until(|| sink.get("kept").is_none(), Duration::from_secs(60)).await);
    assert_eq!(ours(&attached_enis(&w.sim, &kept.id).await, &kept.id), 1);
}

/// Our ENIs of an instance (ownership tags), with their addresses: what must not change while
/// its Node drains.
async fn our_enis(sim: &Simulator, instance: &str) -> Vec<(String, Vec<Ipv4Addr>, Vec<Ipv4Net>)> {
    let tags = ownership_tags(CLUSTER, instance);
    let mut out: Vec<_> = attached_enis(sim, instance)
        .await
        .into_iter()
        .filter(|e| tags.iter().all(|(k, v)| e.tags.get(k) == Some(v)))
        .map(|mut e| {
            e.secondary_ips.sort();
            (e.id, e.secondary_ips, e.prefixes)
        })
        .collect();
    out.sort();
    out
}

/// Karpenter's finalizer on the Nodes it drains.
const KARPENTER: &str = "karpenter.sh/termination";

#[tokio::test(start_paused = true)]
async fn a_draining_node_keeps_its_enis_until_it_is_gone() {
    let (w, sink, (_core, tx, _task)) = started(config(4));
    let inst = join(&w, &sink, &tx, "d", 8).await;
    let node = sink.put_node("d", &[KARPENTER]);
    tx.send(node_input(Event::Apply(node)).unwrap())
        .await
        .unwrap();
    assert!(wait_until(|| served(&sink, "d", 8), Duration::from_secs(60)).await);
    let before = our_enis(&w.sim, &inst.id).await;
    assert_eq!(before.len(), 1, "one ENI of ours: {before:?}");

    // Karpenter drains: the Node gets its deletionTimestamp and stays, held by its finalizer,
    // while the instance still runs pods on our addresses.
    let event = sink.delete_node("d").expect("the Node exists");
    assert!(matches!(&event, Event::Apply(_)), "held by Karpenter");
    tx.send(node_input(event).unwrap()).await.unwrap();
    // Long enough for full refreshes and rescans of every node.
    tokio::time::sleep(Duration::from_secs(150)).await;
    let kept = sink.get("d").expect("the CiliumNode is kept");
    assert!(kept.metadata.deletion_timestamp.is_none(), "not deleted");
    assert_eq!(our_enis(&w.sim, &inst.id).await, before, "no EC2 change");
    assert!(
        !sink.events("d").iter().any(|e| e.reason == "EnisReleased"),
        "{:?}",
        sink.events("d")
    );

    // Karpenter is done: the instance shuts down, the Node goes, and with it the CiliumNode
    // and our ENI.
    w.sim
        .set_instance_state(&inst.id, InstanceState::ShuttingDown);
    let event = sink
        .remove_node_finalizer("d", KARPENTER)
        .expect("the Node exists");
    assert!(matches!(&event, Event::Delete(_)), "gone");
    tx.send(node_input(event).unwrap()).await.unwrap();
    assert!(wait_until(|| sink.raw("d").is_none(), Duration::from_secs(120)).await);
    assert_eq!(our_enis(&w.sim, &inst.id).await, vec![], "our ENI released");
    assert!(our_available_enis(&w.sim).await.is_empty(), "and deleted");
}

#[tokio::test(start_paused = true)]
async fn an_unparsable_node_is_deleted_with_its_enis_once_its_node_is_gone() {
    let (w, sink, (_core, tx, _task)) = started(config(4));
    let inst = join(&w, &sink, &tx, "bad", 8).await;
    let node = sink.put_node("bad", &[]);
    tx.send(node_input(Event::Apply(node)).unwrap())
        .await
        .unwrap();
    assert!(wait_until(|| served(&sink, "bad", 8), Duration::from_secs(60)).await);
    assert_eq!(our_enis(&w.sim, &inst.id).await.len(), 1);

    // Something our types reject: reported on the object.
    let raw = sink
        .edit_raw("bad", |v| {
            v["spec"]["ipam"]["pre-allocate"] = serde_json::json!("lots")
        })
        .unwrap();
    let obj: DynamicObject = serde_json::from_value(raw).unwrap();
    tx.send(to_input(&obj)).await.unwrap();
    let error = |sink: &MemorySink| {
        sink.raw("bad")
            .and_then(|v| {
                v.pointer("/status/ipam/operator-status/error")
                    .and_then(|e| e.as_str().map(String::from))
            })
            .unwrap_or_default()
    };
    assert!(
        wait_until(
            || error(&sink).contains("InvalidSpec"),
            Duration::from_secs(30)
        )
        .await
    );

    // The instance terminates and the Node goes; Kubernetes' garbage collector deletes the
    // CiliumNode (Cilium makes the Node its owner) and our finalizer holds it.
    w.sim
        .set_instance_state(&inst.id, InstanceState::ShuttingDown);
    let event = sink.delete_node("bad").expect("the Node exists");
    tx.send(node_input(event).unwrap()).await.unwrap();
    sink.begin_delete("bad");
    if let Some(raw) = sink.raw("bad") {
        assert!(raw.pointer("/metadata/deletionTimestamp").is_some());
        let obj: DynamicObject = serde_json::from_value(raw).unwrap();
        tx.send(to_input(&obj)).await.unwrap();
    }
    assert!(
        wait_until(|| sink.raw("bad").is_none(), Duration::from_secs(120)).await,
        "hangs in Terminating: {:?}",
        sink.raw("bad")
    );
    assert_eq!(our_enis(&w.sim, &inst.id).await, vec![], "our ENI released");
}

/// The Node object of a running instance is deleted (`kubectl delete node`, a remediation
/// tool): its ENIs stay; when the Node and its CiliumNode come back they are served again with
/// the same ENIs; deleted again and never back, the ENIs go after the grace period, with an
/// Event. On the old main both ENIs went at once and the returning node got new ones.
#[tokio::test(start_paused = true)]
async fn a_deleted_node_of_a_running_instance_keeps_its_enis_until_the_grace_period() {
    let w = Cluster::new();
    let sink = Arc::new(MemorySink::new());
    let cfg = config(4);
    let grace = cfg.node_gone_grace;
    assert_eq!(grace, Duration::from_secs(600), "the documented default");
    let (_core, tx, _task) = start(w.sim.clone(), &sink, cfg);
    let inst = join(&w, &sink, &tx, "r", 8).await;
    let node = sink.put_node("r", &[]);
    tx.send(node_input(Event::Apply(node)).unwrap())
        .await
        .unwrap();
    assert!(wait_until(|| served(&sink, "r", 8), Duration::from_secs(60)).await);
    let ids = |v: Vec<(String, Vec<Ipv4Addr>, Vec<Ipv4Net>)>| {
        v.into_iter().map(|(id, _, _)| id).collect::<Vec<_>>()
    };
    let before = ids(our_enis(&w.sim, &inst.id).await);
    assert_eq!(before.len(), 1, "one ENI of ours");

    // The Node object goes while the instance runs; Kubernetes' garbage collector deletes the
    // CiliumNode it owns, our finalizer holds it.
    let delete_node = |sink: &MemorySink| {
        let event = sink.delete_node("r").expect("the Node exists");
        assert!(matches!(&event, Event::Delete(_)));
        let marked = sink.begin_delete("r").expect("held by our finalizer");
        (node_input(event).unwrap(), marked)
    };
    let (gone, marked) = delete_node(&sink);
    tx.send(gone).await.unwrap();
    tx.send(NodeInput::Upsert(Box::new(marked))).await.unwrap();
    tokio::time::sleep(Duration::from_secs(180)).await;
    assert_eq!(ids(our_enis(&w.sim, &inst.id).await), before, "kept");
    assert!(sink.raw("r").is_some(), "held while the instance runs");
    let reasons = |sink: &MemorySink| -> Vec<String> {
        sink.events("r").into_iter().map(|e| e.reason).collect()
    };
    assert!(
        reasons(&sink).iter().any(|r| r == "EnisKept"),
        "{:?}",
        reasons(&sink)
    );
    assert!(!reasons(&sink).iter().any(|r| r == "EnisReleased"));

    // The kubelet re-registers the Node: our finalizer goes, the agent writes a new
    // CiliumNode, and it is served with the ENI it has.
    let node = sink.put_node("r", &[]);
    tx.send(node_input(Event::Apply(node)).unwrap())
        .await
        .unwrap();
    assert!(wait_until(|| sink.raw("r").is_none(), Duration::from_secs(120)).await);
    let n = sink.put(&agent_node(&w, "r", &inst.id, 8));
    tx.send(NodeInput::Upsert(Box::new(n))).await.unwrap();
    assert!(wait_until(|| served(&sink, "r", 8), Duration::from_secs(120)).await);
    assert_eq!(ids(our_enis(&w.sim, &inst.id).await), before, "re-adopted");

    // Gone again for good, the instance still running: released after the grace period.
    let (gone, marked) = delete_node(&sink);
    tx.send(gone).await.unwrap();
    tx.send(NodeInput::Upsert(Box::new(marked))).await.unwrap();
    tokio::time::sleep(grace - Duration::from_secs(30)).await;
    assert_eq!(
        ids(our_enis(&w.sim, &inst.id).await),
        before,
        "within the grace"
    );
    assert!(wait_until(|| sink.raw("r").is_none(), Duration::from_secs(120)).await);
    assert_eq!(
        our_enis(&w.sim, &inst.id).await,
        vec![],
        "released after the grace"
    );
    assert!(our_available_enis(&w.sim).await.is_empty(), "and deleted");
}

/// Two clusters in one account, both keeping the default `--cluster-name`, in their own VPCs:
/// each one's GC deletes its own leftover and never the other's (an ENI waiting for its
/// attach, or mid-finalizer). On the old main the GC listed the whole region by the cluster tag
/// alone and deleted both.
#[tokio::test(start_paused = true)]
async fn two_clusters_with_the_default_name_never_collect_each_others_enis() {
    let a = Cluster::new();
    let Network {
        subnet: subnet_b,
        sg: sg_b,
        ..
    } = network(&a.sim, "10.1.0.0/16", "zone-a", "10.1.0.0/18");
    let leftover = |subnet: &str, sg: &str, instance: &str| CreateEniRequest {
        subnet_id: subnet.into(),
        security_groups: vec![sg.into()],
        description: "a leftover waiting for its attach".into(),
        tags: ownership_tags("default", instance),
        addresses: AddressRequest::Ips(0),
        client_token: String::new(),
    };
    let eni_a = a
        .sim
        .create_network_interface(&leftover(&a.subnet, &a.sg, "i-a"))
        .await
        .unwrap();
    let eni_b = a
        .sim
        .create_network_interface(&leftover(&subnet_b, &sg_b, "i-b"))
        .await
        .unwrap();
    let mut gc_a = EniGc::new("default", 25).with_vpcs([a.vpc.clone()]);
    gc_a.run_once(&a.sim, &[]).await.unwrap();
    let report = gc_a.run_once(&a.sim, &[]).await.unwrap();
    assert_eq!(report.deleted, vec![eni_a.id.clone()]);
    assert!(
        a.sim.network_interface(&eni_b.id).is_some(),
        "the other cluster's ENI is not ours to collect"
    );
    // A GC that knows no managed VPC yet lists nothing (never the region).
    let mut blind = EniGc::new("default", 25);
    blind.run_once(&a.sim, &[]).await.unwrap();
    assert!(
        blind
            .run_once(&a.sim, &[])
            .await
            .unwrap()
            .deleted
            .is_empty()
    );
    assert!(a.sim.network_interface(&eni_b.id).is_some());
}
