//! Kubernetes watches feeding the allocation core.
//!
//! CiliumNodes are watched leniently, as untyped objects parsed one by one: a single malformed
//! object gets its own operator-status error and Event instead of breaking the whole watch.
//! Nodes are watched to learn whether a CiliumNode's Node still exists (the finalizer's
//! question) and to drive the CiliumNode's deletion when the Node goes.

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use tokio::sync::mpsc;
use tracing::warn;

use crate::crd::CiliumNode;

use super::core::NodeInput;
use super::sink::NodeRef;

/// Parse one CiliumNode; the error names what is wrong, for the object's operator-status.
pub fn parse_node(value: serde_json::Value) -> Result<CiliumNode, String> {
    serde_json::from_value(value).map_err(|e| format!("the CiliumNode does not parse: {e}"))
}

/// `aws:///<az>/<instance-id>` -> instance ID.
pub fn instance_from_provider_id(provider_id: &str) -> Option<String> {
    let rest = provider_id.strip_prefix("aws://")?;
    let id = rest.rsplit('/').next()?;
    id.starts_with("i-").then(|| id.to_string())
}

fn node_ref(obj: &DynamicObject) -> NodeRef {
    NodeRef {
        name: obj.metadata.name.clone().unwrap_or_default(),
        uid: obj.metadata.uid.clone(),
        resource_version: obj.metadata.resource_version.clone(),
        finalizers: obj.metadata.finalizers.clone().unwrap_or_default(),
    }
}

/// Turn one watched object into the core's input.
pub fn to_input(obj: &DynamicObject) -> NodeInput {
    let value = serde_json::to_value(obj).unwrap_or_default();
    match parse_node(value) {
        Ok(node) => NodeInput::Upsert(Box::new(node)),
        Err(error) => NodeInput::Invalid {
            node: node_ref(obj),
            error,
        },
    }
}

/// Watch CiliumNodes until the channel closes.
pub async fn watch_cilium_nodes(client: kube::Client, tx: mpsc::Sender<NodeInput>) {
    let ar = ApiResource::erase::<CiliumNode>(&());
    let api: Api<DynamicObject> = Api::all_with(client, &ar);
    let mut stream = watcher::watcher(api, watcher::Config::default())
        .default_backoff()
        .boxed();
    loop {
        let event = match stream.try_next().await {
            Ok(Some(e)) => e,
            Ok(None) => return,
            Err(e) => {
                warn!(error = %e, "CiliumNode watch error");
                continue;
            }
        };
        let input = match event {
            Event::Apply(obj) | Event::InitApply(obj) => to_input(&obj),
            Event::Delete(obj) => NodeInput::Deleted(obj.metadata.name.unwrap_or_default()),
            Event::Init | Event::InitDone => continue,
        };
        if tx.send(input).await.is_err() {
            return;
        }
    }
}

/// Watch Nodes until the channel closes: presence, and absence once deleted.
pub async fn watch_nodes(client: kube::Client, tx: mpsc::Sender<NodeInput>) {
    let api: Api<Node> = Api::all(client);
    let mut stream = watcher::watcher(api, watcher::Config::default())
        .default_backoff()
        .boxed();
    loop {
        let event = match stream.try_next().await {
            Ok(Some(e)) => e,
            Ok(None) => return,
            Err(e) => {
                warn!(error = %e, "Node watch error");
                continue;
            }
        };
        let input = match event {
            Event::Apply(n) | Event::InitApply(n) => NodeInput::NodePresent {
                present: n.metadata.deletion_timestamp.is_none(),
                name: n.metadata.name.unwrap_or_default(),
            },
            Event::Delete(n) => NodeInput::NodePresent {
                name: n.metadata.name.unwrap_or_default(),
                present: false,
            },
            Event::Init | Event::InitDone => continue,
        };
        if tx.send(input).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
            NodeInput::Invalid { node, error } => {
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
}
