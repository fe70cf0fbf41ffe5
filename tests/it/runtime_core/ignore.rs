//! Which nodes are ours: the ignore annotations, Cilium's ignore annotation we may write, and the
//! instance-tags scope.

use std::sync::Arc;
use std::time::Duration;

use eni_operator::crd::{CiliumNode, FINALIZER};
use eni_operator::ec2::Tags;
use eni_operator::event_loop::core::NodeInput;
use testkit::cluster::{Cluster, agent_node};
use testkit::sink::MemorySink;
use testkit::{served, wait_until};

use testkit::sim::Simulator;

use super::support::{Running, attached_enis, config, join, start, started};

#[tokio::test(start_paused = true)]
async fn an_ignored_node_is_let_go_with_its_finalizer() {
    let (w, sink, (_core, tx, _task)) = started(config(4));
    join(&w, &sink, &tx, "n", 4).await;
    assert!(wait_until(|| served(&sink, "n", 4), Duration::from_secs(30)).await);
    let n = sink
        .update("n", |n| {
            n.metadata.annotations = Some(
                [(
                    eni_operator::crd::IGNORE_ANNOTATION.to_string(),
                    "true".to_string(),
                )]
                .into(),
            );
            n.spec.ipam.min_allocate = 12;
        })
        .unwrap();
    tx.send(NodeInput::Upsert(Box::new(n))).await.unwrap();
    let no_finalizer = || {
        sink.get("n")
            .and_then(|n| n.metadata.finalizers)
            .is_none_or(|f| f.is_empty())
    };
    assert!(wait_until(no_finalizer, Duration::from_secs(10)).await);
    let writes = sink.writes("n");
    tokio::time::sleep(Duration::from_secs(130)).await;
    assert_eq!(sink.writes("n"), writes, "an ignored node is never written");
    assert!(!served(&sink, "n", 12));
}

#[tokio::test(start_paused = true)]
async fn a_node_cilium_is_told_to_ignore_is_served_by_us() {
    // `ipam.cilium.io/ignore` hands the node over from Cilium's operator (C10): we serve it.
    let (w, sink, (_core, tx, _task)) = started(config(4));
    let inst = w.instance();
    let mut node = agent_node(&w, "handed-over", &inst.id, 12);
    node.metadata.annotations = Some(
        [(
            eni_operator::crd::CILIUM_IGNORE_ANNOTATION.to_string(),
            "true".to_string(),
        )]
        .into(),
    );
    let n = sink.put(&node);
    tx.send(NodeInput::Upsert(Box::new(n))).await.unwrap();
    assert!(wait_until(|| served(&sink, "handed-over", 12), Duration::from_secs(60)).await);
}

/// A core that writes Cilium's ignore annotation, told of node "n" (annotated `team: net`).
async fn annotating_with_team_node(
    min_allocate: i64,
) -> (Cluster, Arc<MemorySink>, Running<Simulator>) {
    let w = Cluster::new();
    let sink = Arc::new(MemorySink::new());
    let mut cfg = config(4);
    cfg.annotate_cilium_ignore = true;
    let running = start(w.sim.clone(), &sink, cfg);
    let inst = w.instance();
    let mut node = agent_node(&w, "n", &inst.id, min_allocate);
    node.metadata.annotations = Some([("team".to_string(), "net".to_string())].into());
    let n = sink.put(&node);
    running
        .1
        .send(NodeInput::Upsert(Box::new(n)))
        .await
        .unwrap();
    (w, sink, running)
}

/// Someone else changes node "n"'s annotations.
fn edit_annotations(
    sink: &MemorySink,
    f: impl FnOnce(&mut std::collections::BTreeMap<String, String>),
) -> CiliumNode {
    sink.update("n", |n| f(n.metadata.annotations.as_mut().unwrap()))
        .unwrap()
}

fn annotation(sink: &MemorySink, name: &str, key: &str) -> Option<String> {
    sink.get(name)?.metadata.annotations?.get(key).cloned()
}

#[tokio::test(start_paused = true)]
async fn annotate_cilium_ignore_marks_served_nodes_once_and_keeps_other_annotations() {
    use eni_operator::crd::CILIUM_IGNORE_ANNOTATION;
    let (_w, sink, (_core, tx, _task)) = annotating_with_team_node(8).await;
    assert!(wait_until(|| served(&sink, "n", 8), Duration::from_secs(60)).await);
    assert_eq!(
        annotation(&sink, "n", CILIUM_IGNORE_ANNOTATION).as_deref(),
        Some("true")
    );
    assert_eq!(annotation(&sink, "n", "team").as_deref(), Some("net"));
    // The confirmed-instance record, the finalizer and the annotation: one metadata write each.
    assert_eq!(sink.writes("n").metadata, 3);

    // Steady state: rescans and full refreshes write nothing, also after the agent's updates.
    let n = sink.update("n", |_| {}).unwrap();
    tx.send(NodeInput::Upsert(Box::new(n))).await.unwrap();
    let writes = sink.writes("n");
    tokio::time::sleep(Duration::from_secs(190)).await;
    assert_eq!(sink.writes("n"), writes, "no write in steady state");

    // Someone removes it: it comes back (and only it is written).
    let n = edit_annotations(&sink, |a| {
        a.remove(CILIUM_IGNORE_ANNOTATION);
    });
    tx.send(NodeInput::Upsert(Box::new(n))).await.unwrap();
    assert!(
        wait_until(
            || annotation(&sink, "n", CILIUM_IGNORE_ANNOTATION).is_some(),
            Duration::from_secs(30)
        )
        .await
    );
    assert_eq!(sink.writes("n").metadata, writes.metadata + 1);
    assert_eq!(sink.writes("n").total(), writes.total() + 1);
}

#[tokio::test(start_paused = true)]
async fn opting_a_node_out_removes_the_cilium_ignore_annotation() {
    use eni_operator::crd::{CILIUM_IGNORE_ANNOTATION, IGNORE_ANNOTATION};
    let (_w, sink, (_core, tx, _task)) = annotating_with_team_node(4).await;
    assert!(
        wait_until(
            || annotation(&sink, "n", CILIUM_IGNORE_ANNOTATION).is_some(),
            Duration::from_secs(30)
        )
        .await
    );
    let n = edit_annotations(&sink, |a| {
        a.insert(IGNORE_ANNOTATION.into(), "true".into());
    });
    tx.send(NodeInput::Upsert(Box::new(n))).await.unwrap();
    let let_go = || {
        sink.get("n").is_some_and(|n| {
            n.metadata.finalizers.is_none_or(|f| f.is_empty())
                && n.metadata
                    .annotations
                    .is_some_and(|a| !a.contains_key(CILIUM_IGNORE_ANNOTATION))
        })
    };
    assert!(wait_until(let_go, Duration::from_secs(30)).await);
    assert_eq!(annotation(&sink, "n", "team").as_deref(), Some("net"));
    assert_eq!(
        annotation(&sink, "n", IGNORE_ANNOTATION).as_deref(),
        Some("true")
    );
    let writes = sink.writes("n");
    tokio::time::sleep(Duration::from_secs(130)).await;
    assert_eq!(sink.writes("n"), writes, "a node let go is never written");
}

#[tokio::test(start_paused = true)]
async fn without_annotate_cilium_ignore_the_annotation_is_never_written() {
    use eni_operator::crd::CILIUM_IGNORE_ANNOTATION;
    let (w, sink, (_core, tx, _task)) = started(config(4));
    join(&w, &sink, &tx, "n", 4).await;
    assert!(wait_until(|| served(&sink, "n", 4), Duration::from_secs(30)).await);
    assert_eq!(annotation(&sink, "n", CILIUM_IGNORE_ANNOTATION), None);
    assert_eq!(
        sink.writes("n").metadata,
        2,
        "the confirmed-instance record and the finalizer only"
    );
}

#[tokio::test(start_paused = true)]
async fn nodes_whose_instances_lack_the_instance_tags_are_left_alone() {
    // --instance-tags-filter (Cilium: only instances with these tags are managed): a node on
    // an untagged instance gets no write and no EC2 change; one whose instance loses the tags
    // is let go with our finalizer, as an ignored node.
    let w = Cluster::new();
    let tags: Tags = [("team".to_string(), "blue".to_string())].into();
    let sink = Arc::new(MemorySink::new());
    let mut cfg = config(4);
    cfg.scope.instance_tags = tags.clone();
    let (_core, tx, _task) = start(w.sim.clone(), &sink, cfg);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let ours = w.instance();
    w.sim.set_instance_tags(&ours.id, tags.clone());
    let theirs = w.instance();
    for (name, inst) in [("ours", &ours.id), ("theirs", &theirs.id)] {
        let n = sink.put(&agent_node(&w, name, inst, 12));
        tx.send(NodeInput::Upsert(Box::new(n))).await.unwrap();
    }
    assert!(wait_until(|| served(&sink, "ours", 12), Duration::from_secs(30)).await);
    tokio::time::sleep(Duration::from_secs(130)).await;
    assert_eq!(sink.writes("theirs").total(), 0, "never written");
    assert_eq!(
        attached_enis(&w.sim, &theirs.id).await.len(),
        1,
        "no ENI added"
    );

    // The tags go: we let go of the node, finalizer included, and write nothing else.
    w.sim.set_instance_tags(&ours.id, Tags::new());
    let no_finalizer = || {
        sink.get("ours")
            .and_then(|n| n.metadata.finalizers)
            .is_none_or(|f| !f.contains(&FINALIZER.to_string()))
    };
    assert!(wait_until(no_finalizer, Duration::from_secs(130)).await);
    let writes = sink.writes("ours");
    tokio::time::sleep(Duration::from_secs(130)).await;
    assert_eq!(sink.writes("ours"), writes);
}
