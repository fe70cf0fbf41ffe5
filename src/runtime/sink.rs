//! Where the allocation core writes its results: CiliumNode patches, Events, our finalizer.
//!
//! [`KubeSink`] talks to the API server with JSON merge patches of operator-owned fields only
//! (C8); [`MemorySink`] keeps objects in memory and counts writes, for tests and the benchmark.
//! Given a CRD schema ([`MemorySink::pruning`]), it prunes what it stores as the API server does
//! (real clusters run Cilium's CRD, which drops every field it does not list).

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Mutex;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::watcher;
use serde_json::{Value, json};

use crate::crd::{CiliumNode, FINALIZER};
use crate::ipam::{ChangeSet, Subresource};

use super::prune::StructuralSchema;

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

/// The core's only way to the outside world.
pub trait NodeSink: Send + Sync + 'static {
    /// Apply the change set's writes in order. Returns the object after the last write (`None`
    /// when it took effect but the object does not parse: an invalid CiliumNode's error report).
    fn apply(
        &self,
        node: &NodeRef,
        changes: &ChangeSet,
    ) -> impl Future<Output = SinkResult<Option<CiliumNode>>> + Send;

    fn event(&self, node: &NodeRef, event: NodeEvent) -> impl Future<Output = ()> + Send;

    /// Add (`present`) or remove our finalizer; a no-op when already so.
    fn set_finalizer(
        &self,
        node: &NodeRef,
        present: bool,
    ) -> impl Future<Output = SinkResult<Option<CiliumNode>>> + Send;

    /// Set (`Some`) or remove (`None`) one annotation, touching no other key.
    fn set_annotation(
        &self,
        node: &NodeRef,
        key: &str,
        value: Option<&str>,
    ) -> impl Future<Output = SinkResult<Option<CiliumNode>>> + Send;

    fn delete(&self, name: &str) -> impl Future<Output = SinkResult<()>> + Send;

    /// Whether the Kubernetes Node of this name exists right now. Asked by the finalizer at the
    /// moment it decides, not taken from a watch that may lag behind the CiliumNode's deletion.
    /// A Node with a `deletionTimestamp` exists: it is draining (Karpenter, any Node finalizer)
    /// and its instance still runs; only the API server's 404 means gone.
    fn node_exists(&self, name: &str) -> impl Future<Output = SinkResult<bool>> + Send;

    /// The CiliumNode as the API server has it now (`None`: gone). For the last check before
    /// an irreversible EC2 call, when the watched copy may be seconds old.
    fn fetch(&self, name: &str) -> impl Future<Output = SinkResult<Option<CiliumNode>>> + Send;
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
fn with_version(patch: &Value, needs: bool, version: Option<&str>) -> Value {
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
    async fn apply(&self, node: &NodeRef, changes: &ChangeSet) -> SinkResult<Option<CiliumNode>> {
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

    async fn set_finalizer(&self, node: &NodeRef, present: bool) -> SinkResult<Option<CiliumNode>> {
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

    async fn set_annotation(
        &self,
        node: &NodeRef,
        key: &str,
        value: Option<&str>,
    ) -> SinkResult<Option<CiliumNode>> {
        let patch = annotation_patch(key, value);
        match self
            .api
            .patch(&node.name, &self.params, &Patch::Merge(&patch))
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

    async fn fetch(&self, name: &str) -> SinkResult<Option<CiliumNode>> {
        self.api
            .get_opt(name)
            .await
            .map_err(|e| SinkError::Other(e.to_string()))
    }
}

// ---------------------------------------------------------------------------------------------

/// Counts of writes to one node.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WriteCounts {
    pub spec: u32,
    pub status: u32,
    pub metadata: u32,
}

impl WriteCounts {
    pub fn total(&self) -> u32 {
        self.spec + self.status + self.metadata
    }
}

/// A stored object as our types read it, if they do (from the JSON in place: no copy of it).
fn parse(v: &Value) -> Option<CiliumNode> {
    serde::Deserialize::deserialize(v).ok()
}

#[derive(Debug, Default)]
struct MemoryState {
    objects: BTreeMap<String, Value>,
    writes: BTreeMap<String, WriteCounts>,
    events: Vec<(String, NodeEvent)>,
    next_version: u64,
    /// Kubernetes Nodes known to be gone (every other Node exists).
    gone_nodes: std::collections::BTreeSet<String>,
    /// Kubernetes Nodes put by a test, as the API server holds them (metadata only).
    nodes: BTreeMap<String, Node>,
}

/// An in-memory API server for CiliumNodes: applies patches like Kubernetes (spec and status
/// through separate endpoints, resourceVersion checks, finalizers hold deletion, and with a
/// schema, structural pruning of every create, update and patch).
#[derive(Debug, Default)]
pub struct MemorySink {
    state: Mutex<MemoryState>,
    schema: Option<StructuralSchema>,
}

impl MemorySink {
    /// Stores every field (like our CRD, which preserves unknown fields).
    pub fn new() -> Self {
        Self::default()
    }

    /// Prunes every stored object by `schema`, as the API server does with the CRD installed.
    pub fn pruning(schema: StructuralSchema) -> Self {
        Self {
            state: Mutex::default(),
            schema: Some(schema),
        }
    }

    /// Pruning by Cilium's own CiliumNode CRD: what real clusters run.
    pub fn with_ciliums_crd() -> Self {
        Self::pruning(StructuralSchema::cilium())
    }

    fn prune(&self, object: &mut Value) {
        if let Some(s) = &self.schema {
            s.prune_object(object);
        }
    }

    /// Create or replace an object as an agent would; returns the stored copy.
    pub fn put(&self, node: &CiliumNode) -> CiliumNode {
        let mut s = self.state.lock().expect("sink lock");
        s.next_version += 1;
        let mut v = serde_json::to_value(node).expect("serialise");
        let name = node.metadata.name.clone().unwrap_or_default();
        if let Some(old) = s.objects.get(&name) {
            // Keep what the server owns: uid, finalizers, deletion mark.
            for key in ["uid", "finalizers", "deletionTimestamp"] {
                if let Some(x) = old.pointer(&format!("/metadata/{key}")) {
                    v["metadata"][key] = x.clone();
                }
            }
        } else {
            v["metadata"]["uid"] = json!(format!("uid-{name}"));
        }
        v["metadata"]["resourceVersion"] = json!(s.next_version.to_string());
        self.prune(&mut v);
        s.objects.insert(name, v.clone());
        serde_json::from_value(v).expect("parse")
    }

    /// Edit a stored object as an agent would (bumps the resourceVersion).
    pub fn update(&self, name: &str, edit: impl FnOnce(&mut CiliumNode)) -> Option<CiliumNode> {
        let mut node = self.get(name)?;
        edit(&mut node);
        Some(self.put(&node))
    }

    /// The stored object, if it exists and parses.
    pub fn get(&self, name: &str) -> Option<CiliumNode> {
        let s = self.state.lock().expect("sink lock");
        s.objects.get(name).and_then(parse)
    }

    /// Edit a stored object's JSON (e.g. into something our types reject); bumps the
    /// resourceVersion. Returns the stored JSON, as a watch would deliver it.
    pub fn edit_raw(&self, name: &str, edit: impl FnOnce(&mut Value)) -> Option<Value> {
        let mut s = self.state.lock().expect("sink lock");
        s.next_version += 1;
        let version = s.next_version.to_string();
        let v = s.objects.get_mut(name)?;
        edit(v);
        v["metadata"]["resourceVersion"] = json!(version);
        Some(v.clone())
    }

    /// The stored object's resourceVersion, without parsing it (a harness's cache key).
    pub fn resource_version(&self, name: &str) -> Option<String> {
        let s = self.state.lock().expect("sink lock");
        s.objects
            .get(name)?
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            .map(str::to_string)
    }

    /// The last resourceVersion handed out: it changes whenever a stored CiliumNode changes
    /// (or a write is refused), so equal numbers mean nothing changed since.
    pub fn generation(&self) -> u64 {
        self.state.lock().expect("sink lock").next_version
    }

    pub fn raw(&self, name: &str) -> Option<Value> {
        self.state
            .lock()
            .expect("sink lock")
            .objects
            .get(name)
            .cloned()
    }

    pub fn writes(&self, name: &str) -> WriteCounts {
        let s = self.state.lock().expect("sink lock");
        s.writes.get(name).copied().unwrap_or_default()
    }

    pub fn total_writes(&self) -> WriteCounts {
        let s = self.state.lock().expect("sink lock");
        s.writes
            .values()
            .fold(WriteCounts::default(), |a, w| WriteCounts {
                spec: a.spec + w.spec,
                status: a.status + w.status,
                metadata: a.metadata + w.metadata,
            })
    }

    pub fn events(&self, name: &str) -> Vec<NodeEvent> {
        let s = self.state.lock().expect("sink lock");
        s.events
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, e)| e.clone())
            .collect()
    }

    /// Record whether the Kubernetes Node of this name exists.
    pub fn set_node_exists(&self, name: &str, exists: bool) {
        let mut s = self.state.lock().expect("sink lock");
        if exists {
            s.gone_nodes.remove(name);
        } else {
            s.gone_nodes.insert(name.to_string());
            s.nodes.remove(name);
        }
    }

    /// Create a Kubernetes Node with these finalizers (Karpenter's `karpenter.sh/termination`,
    /// for one); returns it as a watch would deliver it.
    pub fn put_node(&self, name: &str, finalizers: &[&str]) -> Node {
        let mut s = self.state.lock().expect("sink lock");
        let node = Node {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                uid: Some(format!("node-uid-{name}")),
                finalizers: Some(finalizers.iter().map(|f| f.to_string()).collect()),
                ..ObjectMeta::default()
            },
            ..Node::default()
        };
        s.gone_nodes.remove(name);
        s.nodes.insert(name.to_string(), node.clone());
        node
    }

    /// `kubectl delete node`, as the API server does it: a Node with finalizers only gets a
    /// `deletionTimestamp` and stays (draining, its instance still running) until the last
    /// finalizer goes; one without is removed at once. Returns what a Node watch then sees.
    pub fn delete_node(&self, name: &str) -> Option<watcher::Event<Node>> {
        let mut s = self.state.lock().expect("sink lock");
        let node = s.nodes.get_mut(name)?;
        if node
            .metadata
            .finalizers
            .as_ref()
            .is_some_and(|f| !f.is_empty())
        {
            node.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
            return Some(watcher::Event::Apply(node.clone()));
        }
        let node = s.nodes.remove(name)?;
        s.gone_nodes.insert(name.to_string());
        Some(watcher::Event::Delete(node))
    }

    /// Another controller removes its finalizer from a Node; the Node goes once it is being
    /// deleted and no finalizer is left. Same answer as [`Self::delete_node`].
    pub fn remove_node_finalizer(
        &self,
        name: &str,
        finalizer: &str,
    ) -> Option<watcher::Event<Node>> {
        let mut s = self.state.lock().expect("sink lock");
        let node = s.nodes.get_mut(name)?;
        if let Some(f) = node.metadata.finalizers.as_mut() {
            f.retain(|x| x != finalizer);
        }
        let deleting = node.metadata.deletion_timestamp.is_some();
        if !(deleting
            && node
                .metadata
                .finalizers
                .as_ref()
                .is_none_or(|f| f.is_empty()))
        {
            return Some(watcher::Event::Apply(node.clone()));
        }
        let node = s.nodes.remove(name)?;
        s.gone_nodes.insert(name.to_string());
        Some(watcher::Event::Delete(node))
    }

    /// Start deleting an object: with finalizers it only gets a deletion mark. Returns the
    /// marked object (if it parses).
    pub fn begin_delete(&self, name: &str) -> Option<CiliumNode> {
        let mut s = self.state.lock().expect("sink lock");
        // Like the API server, the deletion mark (or the removal) is a new resourceVersion.
        s.next_version += 1;
        let version = s.next_version.to_string();
        let v = s.objects.get_mut(name)?;
        let has_finalizers = v
            .pointer("/metadata/finalizers")
            .and_then(Value::as_array)
            .is_some_and(|a| !a.is_empty());
        if has_finalizers {
            v["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
            v["metadata"]["resourceVersion"] = json!(version);
            parse(v)
        } else {
            s.objects.remove(name);
            None
        }
    }

    /// Apply a patch; returns the object after it, `None` when that does not parse (the patch
    /// still took effect, as on the API server).
    fn patch(
        &self,
        name: &str,
        patch: &Value,
        sub: Option<Subresource>,
    ) -> SinkResult<Option<CiliumNode>> {
        let mut s = self.state.lock().expect("sink lock");
        s.next_version += 1;
        let version = s.next_version.to_string();
        let obj = s.objects.get_mut(name).ok_or(SinkError::NotFound)?;
        if let Some(want) = patch
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            && obj
                .pointer("/metadata/resourceVersion")
                .and_then(Value::as_str)
                != Some(want)
        {
            let fresh = parse(obj).map(Box::new);
            return Err(SinkError::Conflict(fresh));
        }
        let mut p = patch.clone();
        if let Some(m) = p.get_mut("metadata").and_then(Value::as_object_mut) {
            m.remove("resourceVersion");
        }
        // Like the API server: the main resource ignores status, /status ignores spec.
        if let Some(o) = p.as_object_mut() {
            match sub {
                Some(Subresource::Spec) | None => {
                    o.remove("status");
                }
                Some(Subresource::Status) => {
                    o.remove("spec");
                }
            }
        }
        json_patch::merge(obj, &p);
        if let Some(schema) = &self.schema {
            schema.prune_object(obj);
        }
        obj["metadata"]["resourceVersion"] = json!(version);
        let finalizers_empty = obj
            .pointer("/metadata/finalizers")
            .and_then(Value::as_array)
            .is_none_or(|a| a.is_empty());
        let deleting = obj.pointer("/metadata/deletionTimestamp").is_some();
        let out = parse(obj);
        let counts = s.writes.entry(name.to_string()).or_default();
        match sub {
            Some(Subresource::Spec) => counts.spec += 1,
            Some(Subresource::Status) => counts.status += 1,
            None => counts.metadata += 1,
        }
        if deleting && finalizers_empty {
            s.objects.remove(name);
        }
        Ok(out)
    }
}

impl NodeSink for MemorySink {
    async fn apply(&self, node: &NodeRef, changes: &ChangeSet) -> SinkResult<Option<CiliumNode>> {
        let mut version = node.resource_version.clone();
        let mut last = None;
        for (i, w) in changes.writes.iter().enumerate() {
            let patch = with_version(&w.patch, w.needs_resource_version, version.as_deref());
            // Like KubeSink, whose typed answer fails to parse after the write took effect.
            let Some(obj) = self.patch(&node.name, &patch, Some(w.subresource))? else {
                if i + 1 == changes.writes.len() {
                    return Ok(None);
                }
                return Err(SinkError::Other("the CiliumNode does not parse".into()));
            };
            version = obj.metadata.resource_version.clone();
            last = Some(obj);
        }
        Ok(last)
    }

    async fn event(&self, node: &NodeRef, event: NodeEvent) {
        self.state
            .lock()
            .expect("sink lock")
            .events
            .push((node.name.clone(), event));
    }

    async fn set_finalizer(&self, node: &NodeRef, present: bool) -> SinkResult<Option<CiliumNode>> {
        match finalizer_patch(node, present) {
            None => Ok(None),
            Some(p) => self.patch(&node.name, &p, None),
        }
    }

    async fn set_annotation(
        &self,
        node: &NodeRef,
        key: &str,
        value: Option<&str>,
    ) -> SinkResult<Option<CiliumNode>> {
        self.patch(&node.name, &annotation_patch(key, value), None)
    }

    async fn delete(&self, name: &str) -> SinkResult<()> {
        self.begin_delete(name);
        Ok(())
    }

    async fn node_exists(&self, name: &str) -> SinkResult<bool> {
        // Like the API server: a Node being deleted is still returned by a GET.
        let s = self.state.lock().expect("sink lock");
        Ok(!s.gone_nodes.contains(name))
    }

    async fn fetch(&self, name: &str) -> SinkResult<Option<CiliumNode>> {
        match self.raw(name) {
            None => Ok(None),
            // Like KubeSink's typed GET of an object our types reject.
            Some(v) => serde_json::from_value(v)
                .map(Some)
                .map_err(|e| SinkError::Other(e.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ipam::Write;

    fn node(name: &str) -> CiliumNode {
        let mut n = CiliumNode::new(name, Default::default());
        n.spec.instance_id = "i-1".into();
        n
    }

    #[test]
    fn merge_patch_follows_rfc7386() {
        let mut t = json!({"a": {"b": 1, "c": 2}, "d": [1]});
        json_patch::merge(&mut t, &json!({"a": {"b": null, "e": 3}, "d": [2]}));
        assert_eq!(t, json!({"a": {"c": 2, "e": 3}, "d": [2]}));
    }

    #[tokio::test]
    async fn memory_sink_counts_writes_and_checks_versions() {
        let sink = MemorySink::new();
        let stored = sink.put(&node("n1"));
        let r = NodeRef::of(&stored);
        let changes = ChangeSet {
            writes: vec![
                Write {
                    subresource: Subresource::Status,
                    patch: json!({"status": {"ipam": {"operator-status": {"error": "x"}}}, "spec": {"instance-id": "ignored"}}),
                    needs_resource_version: true,
                },
                Write {
                    subresource: Subresource::Spec,
                    patch: json!({"spec": {"ipam": {"pool": {"10.0.0.1": {"resource": "eni-1"}}}}}),
                    needs_resource_version: false,
                },
            ],
        };
        let out = sink.apply(&r, &changes).await.unwrap().unwrap();
        assert_eq!(
            out.spec.instance_id, "i-1",
            "status write cannot touch spec"
        );
        assert_eq!(out.spec.ipam.pool.len(), 1);
        assert_eq!(
            out.status.unwrap().ipam.operator_status.error.as_deref(),
            Some("x")
        );
        assert_eq!(
            sink.writes("n1"),
            WriteCounts {
                spec: 1,
                status: 1,
                metadata: 0
            }
        );
        // The stale version now conflicts on a versioned write.
        let err = sink.apply(&r, &changes).await.unwrap_err();
        assert!(matches!(err, SinkError::Conflict(Some(_))));
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
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        let config = kube::Config::new(format!("http://{addr}").parse().unwrap());
        kube::Client::try_from(config).unwrap()
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
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        let config = kube::Config::new(format!("http://{addr}").parse().unwrap());
        kube::Client::try_from(config).unwrap()
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

    /// A harness caches parsed objects by resourceVersion (dst's view): every change of a
    /// stored object, the deletion mark included, must be a new resourceVersion, as on the API
    /// server.
    #[test]
    fn a_deletion_mark_is_a_new_resource_version() {
        let sink = MemorySink::new();
        let mut n = node("a");
        n.metadata.finalizers = Some(vec!["example.com/hold".into()]);
        let stored = sink.put(&n);
        let before = sink.generation();
        let marked = sink.begin_delete("a").expect("held by its finalizer");
        assert!(marked.metadata.deletion_timestamp.is_some());
        assert_ne!(
            marked.metadata.resource_version,
            stored.metadata.resource_version
        );
        assert_eq!(sink.resource_version("a"), marked.metadata.resource_version);
        assert!(sink.generation() > before);
    }

    #[tokio::test]
    async fn a_draining_node_exists_until_its_last_finalizer_goes() {
        let sink = MemorySink::new();
        sink.put_node("n1", &["karpenter.sh/termination"]);
        match sink.delete_node("n1") {
            Some(watcher::Event::Apply(n)) => assert!(n.metadata.deletion_timestamp.is_some()),
            other => panic!("expected the Node still there, got {other:?}"),
        }
        assert!(sink.node_exists("n1").await.unwrap(), "draining, not gone");
        assert!(matches!(
            sink.remove_node_finalizer("n1", "karpenter.sh/termination"),
            Some(watcher::Event::Delete(_))
        ));
        assert!(!sink.node_exists("n1").await.unwrap());
        // Without finalizers a Node goes at once.
        sink.put_node("n2", &[]);
        assert!(matches!(
            sink.delete_node("n2"),
            Some(watcher::Event::Delete(_))
        ));
        assert!(!sink.node_exists("n2").await.unwrap());
    }

    #[tokio::test]
    async fn a_pruning_sink_stores_what_ciliums_crd_keeps() {
        let sink = MemorySink::with_ciliums_crd();
        let mut n = node("n1");
        n.spec.extra.insert("not-in-the-schema".into(), json!(1));
        n.spec.extra.insert("bootid".into(), json!("b"));
        let stored = sink.put(&n);
        assert!(
            !stored.spec.extra.contains_key("not-in-the-schema"),
            "create pruned"
        );
        assert_eq!(stored.spec.extra["bootid"], json!("b"));
        let changes = ChangeSet {
            writes: vec![Write {
                subresource: Subresource::Status,
                patch: json!({"status": {
                    "eni-operator": {"enis": 1, "available": 0, "used": 0, "needed": 0},
                    "ipam": {"operator-status": {"error": "x"}}
                }}),
                needs_resource_version: false,
            }],
        };
        let out = sink
            .apply(&NodeRef::of(&stored), &changes)
            .await
            .unwrap()
            .unwrap();
        let status = out.status.unwrap();
        assert_eq!(status.eni_operator, None, "patch pruned");
        assert_eq!(status.ipam.operator_status.error.as_deref(), Some("x"));
        assert_eq!(sink.writes("n1").status, 1, "the write still counts");
        assert_eq!(
            sink.raw("n1").unwrap().pointer("/metadata/uid"),
            Some(&json!("uid-n1")),
            "metadata is the server's, not pruned"
        );
        // Without a schema everything is kept.
        let plain = MemorySink::new();
        assert!(plain.put(&n).spec.extra.contains_key("not-in-the-schema"));
    }

    #[tokio::test]
    async fn an_annotation_patch_touches_only_its_key() {
        let sink = MemorySink::new();
        let mut n = node("n1");
        n.metadata.annotations = Some([("other".to_string(), "kept".to_string())].into());
        let stored = sink.put(&n);
        let out = sink
            .set_annotation(&NodeRef::of(&stored), "k", Some("true"))
            .await
            .unwrap()
            .unwrap();
        let a = out.metadata.annotations.unwrap();
        assert_eq!(a.get("k").map(String::as_str), Some("true"));
        assert_eq!(a.get("other").map(String::as_str), Some("kept"));
        // A stale version does not matter: the patch carries none.
        let out = sink
            .set_annotation(&NodeRef::of(&stored), "k", None)
            .await
            .unwrap()
            .unwrap();
        let a = out.metadata.annotations.unwrap();
        assert!(!a.contains_key("k"));
        assert_eq!(a.get("other").map(String::as_str), Some("kept"));
        assert_eq!(sink.writes("n1").metadata, 2);
    }

    #[tokio::test]
    async fn finalizer_holds_deletion_until_removed() {
        let sink = MemorySink::new();
        let stored = sink.put(&node("n1"));
        let with = sink
            .set_finalizer(&NodeRef::of(&stored), true)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            with.metadata.finalizers.as_deref(),
            Some(&[FINALIZER.to_string()][..])
        );
        assert!(
            sink.set_finalizer(&NodeRef::of(&with), true)
                .await
                .unwrap()
                .is_none()
        );
        let marked = sink.begin_delete("n1").expect("held by the finalizer");
        assert!(marked.metadata.deletion_timestamp.is_some());
        sink.set_finalizer(&NodeRef::of(&marked), false)
            .await
            .unwrap();
        assert!(sink.get("n1").is_none());
    }
}
