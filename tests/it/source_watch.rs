//! The Kubernetes watches against a canned API server (a tower service behind kube's Client).

use std::convert::Infallible;

use eni_operator::event_loop::core::NodeInput;
use eni_operator::k8s::source::watch_nodes;
use tokio::sync::mpsc;

/// The Node watch delivers, per Node, what it says about its instance (providerID,
/// InternalIP: a CiliumNode is served only for its Node's instance, docs/rules.md §15) and its
/// presence, then `NodesListed` once the listing is complete. (It used to ask for metadata
/// only; the facts need the spec and status, which are parsed and dropped, never kept.)
#[tokio::test]
async fn the_node_watch_reports_each_nodes_instance_then_the_end_of_the_listing() {
    let api_server = tower::service_fn(move |req: http::Request<kube::client::Body>| {
        let watch = req.uri().query().unwrap_or_default().contains("watch=");
        async move {
            if watch {
                // No further events: the watch stays open.
                std::future::pending::<()>().await;
            }
            let list = serde_json::json!({
                "apiVersion": "v1",
                "kind": "NodeList",
                "metadata": {"resourceVersion": "1"},
                "items": [{
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {"name": "node-1", "resourceVersion": "1"},
                    "spec": {"providerID": "aws:///us-east-1a/i-0abc"},
                    "status": {"addresses": [
                        {"type": "InternalIP", "address": "10.0.0.5"},
                        {"type": "Hostname", "address": "node-1"}
                    ]}
                }]
            });
            let body = kube::client::Body::from(serde_json::to_vec(&list).unwrap());
            Ok::<_, Infallible>(http::Response::new(body))
        }
    });
    let client = kube::Client::new(api_server, "default");
    let (tx, mut rx) = mpsc::channel(8);
    let watch = tokio::spawn(watch_nodes(client, tx));
    let facts = next(&mut rx).await;
    match &facts {
        NodeInput::NodeFacts {
            name,
            facts: Some(f),
        } if name == "node-1" => {
            assert_eq!(f.instance.as_deref(), Some("i-0abc"));
            assert_eq!(
                f.internal_ips,
                vec!["10.0.0.5".parse::<std::net::Ipv4Addr>().unwrap()]
            );
        }
        other => panic!("expected the facts of node-1, got {other:?}"),
    }
    let present = next(&mut rx).await;
    assert!(
        matches!(&present, NodeInput::NodePresent { name, present: true } if name == "node-1"),
        "{present:?}"
    );
    let listed = next(&mut rx).await;
    assert!(matches!(listed, NodeInput::NodesListed), "{listed:?}");
    watch.abort();
}

async fn next(rx: &mut mpsc::Receiver<NodeInput>) -> NodeInput {
    tokio::time::timeout(std::time::Duration::from_secs(10), rx.recv())
        .await
        .expect("an input within 10 s")
        .expect("an input")
}
