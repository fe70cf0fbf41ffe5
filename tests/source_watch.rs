//! The Kubernetes watches against a canned API server (a tower service behind kube's Client).

use std::convert::Infallible;

use eni_operator::runtime::core::NodeInput;
use eni_operator::runtime::source::watch_nodes;
use tokio::sync::mpsc;

#[tokio::test]
async fn the_node_watch_asks_for_metadata_only() {
    // A whole Node (images, conditions) is often 10-20 KB; only its existence matters, so the
    // watch must ask the API server for PartialObjectMetadata.
    let (accepts, mut seen) = mpsc::unbounded_channel::<String>();
    let api_server = tower::service_fn(move |req: http::Request<kube::client::Body>| {
        let accept = req
            .headers()
            .get(http::header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        let watch = req.uri().query().unwrap_or_default().contains("watch=");
        let _ = accepts.send(accept);
        async move {
            if watch {
                // No further events: the watch stays open.
                std::future::pending::<()>().await;
            }
            let list = serde_json::json!({
                "apiVersion": "meta.k8s.io/v1",
                "kind": "PartialObjectMetadataList",
                "metadata": {"resourceVersion": "1"},
                "items": [{
                    "apiVersion": "meta.k8s.io/v1",
                    "kind": "PartialObjectMetadata",
                    "metadata": {"name": "node-1", "resourceVersion": "1"}
                }]
            });
            let body = kube::client::Body::from(serde_json::to_vec(&list).unwrap());
            Ok::<_, Infallible>(http::Response::new(body))
        }
    });
    let client = kube::Client::new(api_server, "default");
    let (tx, mut rx) = mpsc::channel(8);
    let watch = tokio::spawn(watch_nodes(client, tx));
    let accept = seen.recv().await.unwrap();
    assert!(
        accept.contains("as=PartialObjectMetadata"),
        "the Node list asked for {accept:?}"
    );
    // A full-object watch could not even parse this answer: bound the wait.
    let input = tokio::time::timeout(std::time::Duration::from_secs(10), rx.recv())
        .await
        .expect("an input within 10 s")
        .expect("a presence input");
    assert!(
        matches!(&input, NodeInput::NodePresent { name, present: true } if name == "node-1"),
        "{input:?}"
    );
    watch.abort();
}
