use super::*;

/// Issue 29 item 6: the pending pods watch keeps a Pod's metadata and node name only.
/// (Watched as `Pod`, the containers, their environment and the status stayed.)
#[test]
fn a_pending_pod_is_kept_as_its_node_name_and_metadata() {
    let env: Vec<serde_json::Value> = (0..200)
        .map(|i| serde_json::json!({"name": format!("VAR_{i}"), "value": "x".repeat(100)}))
        .collect();
    let pod = serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "namespace": "default", "uid": "u1"},
        "spec": {"nodeName": "node-a", "containers": [{"name": "c", "image": "i", "env": env}]},
        "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "True"}]}
    });
    let full = serde_json::to_string(&pod).unwrap().len();
    let kept: PendingPod = serde_json::from_value(pod).unwrap();
    assert_eq!(kept.spec.node_name.as_deref(), Some("node-a"));
    assert_eq!(kept.metadata.uid.as_deref(), Some("u1"));
    let debug = format!("{kept:?}");
    assert!(!debug.contains("VAR_0"), "{debug}");
    assert!(
        debug.len() * 20 < full,
        "kept {} of {full} bytes",
        debug.len()
    );
    // The unscheduled: no node name.
    let unscheduled: PendingPod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "q", "uid": "u2"}, "spec": {"containers": []}
    }))
    .unwrap();
    assert_eq!(unscheduled.spec.node_name, None);
}

#[test]
fn provider_ids() {
    assert_eq!(
        instance_from_provider_id("aws:///us-east-1a/i-0abc").as_deref(),
        Some("i-0abc")
    );
    assert_eq!(instance_from_provider_id("gce://p/z/n"), None);
    assert_eq!(instance_from_provider_id("aws:///us-east-1a/"), None);
}

#[test]
fn a_malformed_object_becomes_an_invalid_input_for_that_object_only() {
    let obj: DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "cilium.io/v2", "kind": "CiliumNode",
        "metadata": {"name": "n1", "uid": "u1", "resourceVersion": "7"},
        "spec": {"ipam": {"pre-allocate": "lots"}}
    }))
    .unwrap();
    match to_input(&obj) {
        NodeInput::Invalid(InvalidNode { node, error, .. }) => {
            assert_eq!(node.name, "n1");
            assert_eq!(node.resource_version.as_deref(), Some("7"));
            assert!(error.contains("does not parse"), "{error}");
        }
        other => panic!("expected Invalid, got {other:?}"),
    }
    let ok: DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "cilium.io/v2", "kind": "CiliumNode",
        "metadata": {"name": "n2"}, "spec": {"instance-id": "i-1"}
    }))
    .unwrap();
    assert!(matches!(to_input(&ok), NodeInput::Upsert(n) if n.spec.instance_id == "i-1"));
}

#[test]
fn an_unparsable_object_being_deleted_is_reported_with_its_deletion_and_instance() {
    let obj: DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "cilium.io/v2", "kind": "CiliumNode",
        "metadata": {"name": "n1", "finalizers": [crate::crd::FINALIZER],
                     "deletionTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"instance-id": "i-1", "ipam": {"pre-allocate": "lots"}}
    }))
    .unwrap();
    match to_input(&obj) {
        NodeInput::Invalid(i) => {
            assert!(i.deleting);
            assert_eq!(i.instance_id, "i-1");
            assert_eq!(i.node.finalizers, vec![crate::crd::FINALIZER.to_string()]);
        }
        other => panic!("expected Invalid, got {other:?}"),
    }
}

#[test]
fn a_draining_node_is_still_present() {
    let mut node = Node::default();
    node.metadata.name = Some("n1".into());
    node.metadata.finalizers = Some(vec!["karpenter.sh/termination".into()]);
    node.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
    ));
    let present = |e| match node_input(e) {
        Some(NodeInput::NodePresent { name, present }) if name == "n1" => present,
        other => panic!("expected NodePresent for n1, got {other:?}"),
    };
    assert!(present(Event::Apply(node.clone())), "draining, not gone");
    assert!(present(Event::InitApply(node.clone())));
    assert!(
        !present(Event::Delete(node)),
        "gone once the API server drops it"
    );
    assert!(node_input::<Node>(Event::InitDone).is_none());
}

#[test]
fn a_relist_reports_what_was_deleted_while_the_watch_was_away() {
    let mut l = Listed::default();
    l.init();
    l.seen("a");
    l.seen("b");
    l.seen("c");
    assert_eq!(l.init_done(), Vec::<String>::new(), "first listing");
    l.deleted("c");
    l.seen("d");
    // The watch ends; "a" and "d" go while it is away, "e" comes.
    l.init();
    l.seen("b");
    l.seen("e");
    assert_eq!(l.init_done(), vec!["a".to_string(), "d".to_string()]);
    // A delete seen during a listing is not reported twice.
    l.init();
    l.seen("b");
    l.deleted("e");
    assert_eq!(l.init_done(), Vec::<String>::new());
    assert!(l.init_done().is_empty(), "no listing in progress");
}

/// A loopback stand-in for the API server's CiliumNode list and watch: the first list has
/// n1 and n2, its watch ends with 410 Gone (the resourceVersion is too old, as after an
/// etcd compaction), the relist has n1 only (n2 was deleted meanwhile), and that watch
/// stays open without events.
async fn fake_relisting_api() -> kube::Client {
    use axum::extract::State;
    use axum::http::header;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};
    let item = |name: &str| {
        serde_json::json!({"apiVersion": "cilium.io/v2", "kind": "CiliumNode",
                "metadata": {"name": name, "uid": format!("u-{name}"), "resourceVersion": "5"},
                "spec": {"instance-id": format!("i-{name}")}})
    };
    let lists = Arc::new(AtomicU32::new(0));
    let app = axum::Router::new()
        .route(
            "/apis/cilium.io/v2/ciliumnodes",
            axum::routing::get(
                move |State(lists): State<Arc<AtomicU32>>, uri: axum::http::Uri| async move {
                    let json = [(header::CONTENT_TYPE, "application/json")];
                    if uri.query().unwrap_or_default().contains("watch=true") {
                        if lists.load(Ordering::SeqCst) == 1 {
                            let gone = serde_json::json!({"type": "ERROR", "object": {
                                    "kind": "Status", "apiVersion": "v1", "metadata": {},
                                    "status": "Failure", "reason": "Expired", "code": 410,
                                    "message": "too old resource version"}});
                            return (json, axum::body::Body::from(format!("{gone}\n")));
                        }
                        let quiet = futures::stream::pending::<Result<String, std::io::Error>>();
                        return (json, axum::body::Body::from_stream(quiet));
                    }
                    let n = lists.fetch_add(1, Ordering::SeqCst);
                    let items = if n == 0 {
                        vec![item("n1"), item("n2")]
                    } else {
                        vec![item("n1")]
                    };
                    let list = serde_json::json!({"apiVersion": "cilium.io/v2",
                            "kind": "CiliumNodeList", "metadata": {"resourceVersion": "10"},
                            "items": items});
                    (json, axum::body::Body::from(list.to_string()))
                },
            ),
        )
        .with_state(lists);
    crate::k8s::stand_in::client(app).await
}

#[tokio::test]
async fn a_cilium_node_deleted_while_the_watch_was_away_is_reported_deleted() {
    let (tx, mut rx) = mpsc::channel(16);
    let client = fake_relisting_api().await;
    let watch = tokio::spawn(watch_cilium_nodes(client, tx, || {}));
    let mut seen = Vec::new();
    while !seen.iter().any(|s: &String| s.starts_with("deleted")) {
        let next = tokio::time::timeout(std::time::Duration::from_secs(20), rx.recv()).await;
        match next {
            Ok(Some(NodeInput::Upsert(n))) => {
                seen.push(format!("upsert {}", n.metadata.name.unwrap_or_default()))
            }
            Ok(Some(NodeInput::Deleted(name))) => seen.push(format!("deleted {name}")),
            Ok(Some(NodeInput::CiliumNodesListed)) => seen.push("listed".into()),
            Ok(other) => panic!("unexpected {other:?} after {seen:?}"),
            Err(_) => panic!("no deletion of n2 reported after the relist: {seen:?}"),
        }
    }
    watch.abort();
    assert_eq!(
        seen,
        [
            "upsert n1",
            "upsert n2",
            "listed",
            "upsert n1",
            "deleted n2"
        ]
    );
}

#[test]
fn pending_pods_are_counted_per_node_and_reported_when_they_change() {
    let mut p = PendingPods::default();
    assert_eq!(p.upsert("a", Some("n1")), vec![("n1".to_string(), 1)]);
    assert_eq!(p.upsert("b", Some("n1")), vec![("n1".to_string(), 2)]);
    assert_eq!(
        p.upsert("c", None),
        vec![],
        "unscheduled pods count nowhere"
    );
    assert_eq!(p.upsert("b", Some("n1")), vec![], "no change, no report");
    assert_eq!(p.remove("a"), vec![("n1".to_string(), 1)]);
    // A relist replaces the set: n1's pod is gone, n2 has one.
    p.relist_started();
    assert_eq!(p.upsert("d", Some("n2")), vec![]);
    let mut changed = p.relist_done();
    changed.sort();
    assert_eq!(changed, vec![("n1".to_string(), 0), ("n2".to_string(), 1)]);
}

#[test]
fn a_rescheduled_pod_moves_its_count_and_unscheduling_drops_it() {
    let mut p = PendingPods::default();
    p.upsert("a", Some("n1"));
    p.upsert("b", Some("n1"));
    assert_eq!(
        p.upsert("a", Some("n2")),
        vec![("n1".to_string(), 1), ("n2".to_string(), 1)]
    );
    assert_eq!(p.upsert("a", None), vec![("n2".to_string(), 0)]);
    assert_eq!(p.remove("a"), vec![], "already counted nowhere");
    assert_eq!(p.remove("b"), vec![("n1".to_string(), 0)]);
    assert!(p.counts.is_empty() && p.pods.is_empty());
}
