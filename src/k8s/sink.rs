//! Where the allocation core writes its results: CiliumNode patches, Events, our finalizer.
//!
//! [`KubeSink`] talks to the API server with JSON merge patches of operator-owned fields only
//! (C8). The in-memory API server of the tests and the benchmark (`MemorySink`) is in the
//! `testkit` crate.

use std::future::Future;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use serde_json::{Value, json};

use crate::crd::{CiliumNode, FINALIZER};
use crate::ipam::{ChangeSet, Subresource};

/// The object a write or Event is about.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeRef {
    pub name: String,
    pub uid: Option<String>,
    pub resource_version: Option<String>,
    pub finalizers: Vec<String>,
}

impl NodeRef {
    pub fn of(node: &CiliumNode) -> Self {
        Self {
            name: node.metadata.name.clone().unwrap_or_default(),
            uid: node.metadata.uid.clone(),
            resource_version: node.metadata.resource_version.clone(),
            finalizers: node.metadata.finalizers.clone().unwrap_or_default(),
        }
    }
}

/// An Event on a CiliumNode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeEvent {
    pub warning: bool,
    pub reason: String,
    pub message: String,
}

impl NodeEvent {
    pub fn normal(reason: &str, message: impl Into<String>) -> Self {
        Self {
            warning: false,
            reason: reason.into(),
            message: message.into(),
        }
    }
    pub fn warning(reason: &str, message: impl Into<String>) -> Self {
        Self {
            warning: true,
            reason: reason.into(),
            message: message.into(),
        }
    }
}

#[derive(Clone, Debug, thiserror::Error)]
pub enum SinkError {
    /// The object is gone: drop the work silently.
    #[error("not found")]
    NotFound,
    /// Someone wrote first: recompute against this fresh copy on the next pass.
    #[error("conflict")]
    Conflict(Option<Box<CiliumNode>>),
    #[error("{0}")]
    Other(String),
}

pub type SinkResult<T> = Result<T, SinkError>;

/// What a write answers: the object after it (`None` when it took effect but the object does
/// not parse: an invalid CiliumNode's error report).
pub type Written = SinkResult<Option<CiliumNode>>;

/// The core's only way to the outside world.
pub trait NodeSink: Send + Sync + 'static {
    /// Apply the change set's writes in order. Returns the object after the last write (`None`
    /// when it took effect but the object does not parse: an invalid CiliumNode's error report).
    fn apply(&self, node: &NodeRef, changes: &ChangeSet) -> impl Future<Output = Written> + Send;

    fn event(&self, node: &NodeRef, event: NodeEvent) -> impl Future<Output = ()> + Send;

    /// Add (`present`) or remove our finalizer; a no-op when already so.
    fn set_finalizer(&self, node: &NodeRef, present: bool) -> impl Future<Output = Written> + Send;

    /// Set (`Some`) or remove (`None`) one annotation, touching no other key.
    fn set_annotation(
        &self,
        node: &NodeRef,
        key: &str,
        value: Option<&str>,
    ) -> impl Future<Output = Written> + Send;

    fn delete(&self, name: &str) -> impl Future<Output = SinkResult<()>> + Send;

    /// Whether the Kubernetes Node of this name exists right now. Asked by the finalizer at the
    /// moment it decides, not taken from a watch that may lag behind the CiliumNode's deletion.
    /// A Node with a `deletionTimestamp` exists: it is draining (Karpenter, any Node finalizer)
    /// and its instance still runs; only the API server's 404 means gone.
    fn node_exists(&self, name: &str) -> impl Future<Output = SinkResult<bool>> + Send;

    /// The CiliumNode as the API server has it now (`None`: gone). For the last check before
    /// an irreversible EC2 call, when the watched copy may be seconds old.
    fn fetch(&self, name: &str) -> impl Future<Output = Written> + Send;
}

/// A shared sink is a sink (wrappers such as `fence::FencedSink` hold one).
impl<S: NodeSink> NodeSink for std::sync::Arc<S> {
    async fn apply(&self, node: &NodeRef, changes: &ChangeSet) -> Written {
        S::apply(self, node, changes).await
    }
    async fn event(&self, node: &NodeRef, event: NodeEvent) {
        S::event(self, node, event).await
    }
    async fn set_finalizer(&self, node: &NodeRef, present: bool) -> Written {
        S::set_finalizer(self, node, present).await
    }
    async fn set_annotation(&self, node: &NodeRef, key: &str, value: Option<&str>) -> Written {
        S::set_annotation(self, node, key, value).await
    }
    async fn delete(&self, name: &str) -> SinkResult<()> {
        S::delete(self, name).await
    }
    async fn node_exists(&self, name: &str) -> SinkResult<bool> {
        S::node_exists(self, name).await
    }
    async fn fetch(&self, name: &str) -> Written {
        S::fetch(self, name).await
    }
}

/// The merge patch that sets (or removes) our finalizer, with optimistic concurrency so
/// another controller's finalizer is never lost.
pub fn finalizer_patch(node: &NodeRef, present: bool) -> Option<Value> {
    let has = node.finalizers.iter().any(|f| f == FINALIZER);
    if has == present {
        return None;
    }
    let mut list: Vec<String> = node
        .finalizers
        .iter()
        .filter(|f| *f != FINALIZER)
        .cloned()
        .collect();
    if present {
        list.push(FINALIZER.to_string());
    }
    Some(json!({"metadata": {
        "finalizers": list,
        "resourceVersion": node.resource_version,
    }}))
}

/// The merge patch of one annotation (`null` removes it): no resourceVersion is needed, since it
/// cannot drop anyone else's annotation or field.
pub fn annotation_patch(key: &str, value: Option<&str>) -> Value {
    json!({"metadata": {"annotations": {key: value}}})
}

/// A write's patch, with `metadata.resourceVersion` when it asks for one.
pub fn with_version(patch: &Value, needs: bool, version: Option<&str>) -> Value {
    let mut p = patch.clone();
    if needs && let (Some(v), Some(obj)) = (version, p.as_object_mut()) {
        let meta = obj.entry("metadata").or_insert_with(|| json!({}));
        if let Some(m) = meta.as_object_mut() {
            m.insert("resourceVersion".into(), json!(v));
        }
    }
    p
}

// ---------------------------------------------------------------------------------------------

/// Writes to a real API server.
#[derive(Clone)]
pub struct KubeSink {
    api: Api<CiliumNode>,
    nodes: Api<Node>,
    recorder: Recorder,
    params: PatchParams,
}

impl KubeSink {
    pub fn new(client: kube::Client, instance: Option<String>) -> Self {
        let reporter = Reporter {
            controller: "eni-operator".into(),
            instance,
        };
        Self {
            api: Api::all(client.clone()),
            nodes: Api::all(client.clone()),
            recorder: Recorder::new(client, reporter),
            params: PatchParams {
                field_manager: Some("eni-operator".into()),
                ..PatchParams::default()
            },
        }
    }

    async fn classify(&self, name: &str, e: kube::Error) -> SinkError {
        match &e {
            kube::Error::Api(s) if s.code == 404 => SinkError::NotFound,
            kube::Error::Api(s) if s.code == 409 => {
                SinkError::Conflict(self.api.get_opt(name).await.ok().flatten().map(Box::new))
            }
            _ => SinkError::Other(e.to_string()),
        }
    }
}

impl NodeSink for KubeSink {
    async fn apply(&self, node: &NodeRef, changes: &ChangeSet) -> Written {
        let mut version = node.resource_version.clone();
        let mut last = None;
        for (i, w) in changes.writes.iter().enumerate() {
            let patch = with_version(&w.patch, w.needs_resource_version, version.as_deref());
            let result = match w.subresource {
                Subresource::Spec => {
                    self.api
                        .patch(&node.name, &self.params, &Patch::Merge(&patch))
                        .await
                }
                Subresource::Status => {
                    self.api
                        .patch_status(&node.name, &self.params, &Patch::Merge(&patch))
                        .await
                }
            };
            match result {
                Ok(obj) => {
                    version = obj.metadata.resource_version.clone();
                    last = Some(obj);
                }
                // The last write went through; only the answer does not parse.
                Err(kube::Error::SerdeError(_)) if i + 1 == changes.writes.len() => {
                    return Ok(None);
                }
                Err(e) => return Err(self.classify(&node.name, e).await),
            }
        }
        Ok(last)
    }

    async fn event(&self, node: &NodeRef, event: NodeEvent) {
        let reference = k8s_openapi::api::core::v1::ObjectReference {
            api_version: Some("cilium.io/v2".into()),
            kind: Some("CiliumNode".into()),
            name: Some(node.name.clone()),
            uid: node.uid.clone(),
            ..Default::default()
        };
        let ev = Event {
            type_: if event.warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: event.reason.clone(),
            note: Some(event.message.chars().take(1000).collect()),
            action: "Reconcile".into(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&ev, &reference).await {
            tracing::warn!(node = %node.name, error = %e, "could not publish an Event");
        }
    }

    async fn set_finalizer(&self, node: &NodeRef, present: bool) -> Written {
        let Some(patch) = finalizer_patch(node, present) else {
            return Ok(None);
        };
        match self
            .api
            .patch(&node.name, &self.params, &Patch::Merge(&patch))
            .await
        {
            Ok(obj) => Ok(Some(obj)),
            // The patch went through; only the answer does not parse (an invalid CiliumNode,
            // whose deletion must not depend on its spec).
            Err(kube::Error::SerdeError(_)) => Ok(None),
            Err(e) => Err(self.classify(&node.name, e).await),
        }
    }

    async fn set_annotation(&self, node: &NodeRef, key: &str, value: Option<&str>) -> Written {
        let patch = annotation_patch(key, value);
        // Cilium's ignore annotation under its own field manager: its managedFields entry then
        // dates the handover (the handover guard compares it with Cilium's Lease).
        let handover = PatchParams {
            field_manager: Some(crate::ipam::handover::HANDOVER_FIELD_MANAGER.into()),
            ..PatchParams::default()
        };
        let params = if key == crate::crd::CILIUM_IGNORE_ANNOTATION {
            &handover
        } else {
            &self.params
        };
        match self
            .api
            .patch(&node.name, params, &Patch::Merge(&patch))
            .await
        {
            Ok(obj) => Ok(Some(obj)),
            Err(e) => Err(self.classify(&node.name, e).await),
        }
    }

    async fn delete(&self, name: &str) -> SinkResult<()> {
        match self.api.delete(name, &DeleteParams::default()).await {
            Ok(_) | Err(kube::Error::SerdeError(_)) => Ok(()),
            Err(e) => match self.classify(name, e).await {
                SinkError::NotFound => Ok(()),
                other => Err(other),
            },
        }
    }

    async fn node_exists(&self, name: &str) -> SinkResult<bool> {
        // Metadata only: a Node's status (images, conditions) is large and not needed here.
        match self.nodes.get_metadata_opt(name).await {
            Ok(n) => Ok(n.is_some()),
            Err(e) => Err(SinkError::Other(e.to_string())),
        }
    }

    async fn fetch(&self, name: &str) -> Written {
        self.api
            .get_opt(name)
            .await
            .map_err(|e| SinkError::Other(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ipam::Write;

    #[test]
    fn merge_patch_follows_rfc7386() {
        let mut t = json!({"a": {"b": 1, "c": 2}, "d": [1]});
        json_patch::merge(&mut t, &json!({"a": {"b": null, "e": 3}, "d": [2]}));
        assert_eq!(t, json!({"a": {"c": 2, "e": 3}, "d": [2]}));
    }

    /// A loopback stand-in for the API server's `GET /api/v1/nodes/{name}`: "draining" has a
    /// `deletionTimestamp` and Karpenter's finalizer, every other Node answers 404 (the
    /// server's `Status` body). It answers a metadata-only GET as the API server does.
    async fn fake_node_api() -> kube::Client {
        use axum::extract::Path;
        use axum::http::{HeaderMap, StatusCode, header};
        let app = axum::Router::new().route(
            "/api/v1/nodes/{name}",
            axum::routing::get(|Path(name): Path<String>, headers: HeaderMap| async move {
                let json = [(header::CONTENT_TYPE, "application/json")];
                if name != "draining" {
                    let status = json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
                        "status": "Failure", "reason": "NotFound", "code": 404,
                        "message": format!("nodes \"{name}\" not found")});
                    return (StatusCode::NOT_FOUND, json, status.to_string());
                }
                let metadata = json!({"name": name, "uid": "u1", "resourceVersion": "5",
                    "finalizers": ["karpenter.sh/termination"],
                    "deletionTimestamp": "2026-01-01T00:00:00Z"});
                let accept = headers
                    .get(header::ACCEPT)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default();
                let body = if accept.contains("as=PartialObjectMetadata") {
                    json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
                        "metadata": metadata})
                } else {
                    json!({"apiVersion": "v1", "kind": "Node", "metadata": metadata,
                        "spec": {"providerID": "aws:///zone-a/i-1"}})
                };
                (StatusCode::OK, json, body.to_string())
            }),
        );
        crate::k8s::stand_in::client(app).await
    }

    #[tokio::test]
    async fn kube_sink_counts_a_draining_node_as_present_and_only_a_404_as_gone() {
        let sink = KubeSink::new(fake_node_api().await, None);
        assert!(
            sink.node_exists("draining").await.unwrap(),
            "a Node with a deletionTimestamp is still there"
        );
        assert!(!sink.node_exists("gone").await.unwrap());
    }

    /// A loopback stand-in for the API server answering every PATCH and DELETE of a CiliumNode
    /// with an object our types reject (the write took effect; only the answer does not parse).
    async fn fake_unparsable_cilium_node_api() -> kube::Client {
        use axum::http::header;
        let answer = || async {
            let body = json!({"apiVersion": "cilium.io/v2", "kind": "CiliumNode",
                "metadata": {"name": "bad", "resourceVersion": "9",
                             "deletionTimestamp": "2026-01-01T00:00:00Z"},
                "spec": {"instance-id": "i-1", "ipam": {"pre-allocate": "lots"}}});
            (
                [(header::CONTENT_TYPE, "application/json")],
                body.to_string(),
            )
        };
        let app = axum::Router::new()
            .route(
                "/apis/cilium.io/v2/ciliumnodes/{name}",
                axum::routing::patch(answer).delete(answer),
            )
            .route(
                "/apis/cilium.io/v2/ciliumnodes/{name}/status",
                axum::routing::patch(answer),
            );
        crate::k8s::stand_in::client(app).await
    }

    #[tokio::test]
    async fn kube_sink_deletes_and_finalizes_a_cilium_node_that_does_not_parse() {
        let sink = KubeSink::new(fake_unparsable_cilium_node_api().await, None);
        let r = NodeRef {
            name: "bad".into(),
            resource_version: Some("8".into()),
            finalizers: vec![FINALIZER.into()],
            ..NodeRef::default()
        };
        assert!(matches!(sink.set_finalizer(&r, false).await, Ok(None)));
        assert!(sink.delete("bad").await.is_ok());
        let report = ChangeSet {
            writes: vec![Write {
                subresource: Subresource::Status,
                patch: json!({"status": {"ipam": {"operator-status": {"error": "x"}}}}),
                needs_resource_version: false,
            }],
        };
        assert!(matches!(sink.apply(&r, &report).await, Ok(None)));
    }
}
