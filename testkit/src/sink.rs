//! An in-memory API server for CiliumNodes and Nodes, the [`NodeSink`] of the runtime tests,
//! the benchmark and the simulation: it keeps objects in memory and counts writes. Given a CRD
//! schema ([`MemorySink::pruning`]), it prunes what it stores as the API server does (real
//! clusters run Cilium's CRD, which drops every field it does not list; see [`crate::prune`]).

use std::collections::BTreeMap;
use std::sync::Mutex;

use eni_operator::crd::{CILIUM_IGNORE_ANNOTATION, CiliumNode};
use eni_operator::ipam::handover::{HANDOVER_FIELD_MANAGER, OWN_FIELD_MANAGER};
use eni_operator::ipam::{ChangeSet, Subresource};
use eni_operator::k8s::sink::{
    NodeEvent, NodeRef, NodeSink, SinkError, SinkResult, Written, annotation_patch,
    finalizer_patch, with_version,
};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::runtime::watcher;
use serde_json::{Value, json};

use crate::managed_fields;
use crate::prune::StructuralSchema;

/// Our field manager for a write to this key (`None`: our finalizer), as `KubeSink` sends them.
fn operator_manager(key: Option<&str>) -> &'static str {
    match key {
        Some(CILIUM_IGNORE_ANNOTATION) => HANDOVER_FIELD_MANAGER,
        _ => OWN_FIELD_MANAGER,
    }
}

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
    /// Objects created so far (Nodes and CiliumNodes): each gets its own uid.
    created: u64,
    /// Kubernetes Nodes known to be gone (every other Node exists).
    gone_nodes: std::collections::BTreeSet<String>,
    /// Kubernetes Nodes put by a test, as the API server holds them (metadata only).
    nodes: BTreeMap<String, Node>,
}

/// A fault the in-memory API server answers one of the operator's writes with (a PATCH or a
/// DELETE through [`NodeSink`]; the harness's own `put`/`update` never meet one). Modelled on
/// what kube-apiserver does:
/// * optimistic concurrency: an update or patch that carries a `metadata.resourceVersion`
///   other than the stored one gets 409 Conflict; a merge patch without one is applied to
///   whatever version is current (the server's guaranteed update retries internally);
/// * 5xx: the server (or its etcd) may fail a request before it is committed (500 "etcdserver:
///   leader changed", 503 while it restarts, 429/503 from API priority and fairness), or
///   commit it and still answer an error (504 / 500 "etcdserver: request timed out": the write
///   happened, the client is told "may still be processing").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteFault {
    /// Another writer (an agent, another controller) updated the object just before this
    /// write: its resourceVersion moves on, so a versioned write gets 409 Conflict.
    Conflict,
    /// 5xx and nothing written.
    Unavailable,
    /// 5xx although the write was committed.
    CommittedButFailed,
}

/// An in-memory API server for CiliumNodes: applies patches like Kubernetes (spec and status
/// through separate endpoints, resourceVersion checks, finalizers hold deletion, and with a
/// schema, structural pruning of every create, update and patch). Writes succeed unless a
/// test injects [`WriteFault`]s ([`MemorySink::inject_write_fault`]).
#[derive(Debug, Default)]
pub struct MemorySink {
    state: Mutex<MemoryState>,
    schema: Option<StructuralSchema>,
    /// Faults the next writes meet, one each, in order.
    faults: Mutex<std::collections::VecDeque<WriteFault>>,
    /// How long the answers to the next `apply`s take after they are committed, one each
    /// (a slow response: the watch may deliver later writes before it arrives).
    slow_answers: Mutex<std::collections::VecDeque<std::time::Duration>>,
    /// Wall time at a tokio instant: when set, managedFields entries get their `time`.
    clock: Mutex<Option<(k8s_openapi::jiff::Timestamp, tokio::time::Instant)>>,
}

impl MemorySink {
    /// Stores every field (like our CRD, which preserves unknown fields).
    pub fn new() -> Self {
        Self::default()
    }

    /// Prunes every stored object by `schema`, as the API server does with the CRD installed.
    pub fn pruning(schema: StructuralSchema) -> Self {
        Self {
            schema: Some(schema),
            ..Self::default()
        }
    }

    /// Stamp managedFields entries with the wall time `at` was at `instant`, moving with tokio's
    /// clock (the simulation's one clock; the core's `wall_epoch`).
    pub fn stamp_times(&self, at: k8s_openapi::jiff::Timestamp, instant: tokio::time::Instant) {
        *self.clock.lock().expect("clock") = Some((at, instant));
    }

    /// Now as a managedFields `time` (seconds), if the sink has a clock.
    fn stamp(&self) -> Option<String> {
        let (at, instant) = (*self.clock.lock().expect("clock"))?;
        let elapsed = tokio::time::Instant::now().saturating_duration_since(instant);
        let now = at.checked_add(elapsed).ok()?;
        k8s_openapi::jiff::Timestamp::from_second(now.as_second())
            .ok()
            .map(|t| t.to_string())
    }

    /// Records the agent as the manager of what `v` sets beyond `before`; the time it stamped.
    fn record_agent(&self, v: &mut Value, before: &managed_fields::Owned) -> Option<String> {
        let time = self.stamp();
        let manager = |_: Option<&str>| managed_fields::AGENT_MANAGER;
        managed_fields::record_at(v, before, manager, time.as_deref());
        time
    }

    /// The next `times` writes of the operator (patches and deletes) meet `fault`.
    pub fn inject_write_fault(&self, fault: WriteFault, times: usize) {
        let mut f = self.faults.lock().expect("faults");
        f.extend(std::iter::repeat_n(fault, times));
    }

    /// Faults injected and not met yet.
    pub fn pending_write_faults(&self) -> usize {
        self.faults.lock().expect("faults").len()
    }

    /// Forget the injected write faults not met yet.
    pub fn drop_write_faults(&self) {
        self.faults.lock().expect("faults").clear();
        self.slow_answers.lock().expect("slow answers").clear();
    }

    /// The answer to the operator's next change set (`apply`) comes `delay` after its writes
    /// were committed (tokio time).
    pub fn inject_slow_answer(&self, delay: std::time::Duration) {
        self.slow_answers
            .lock()
            .expect("slow answers")
            .push_back(delay);
    }

    fn next_fault(&self) -> Option<WriteFault> {
        self.faults.lock().expect("faults").pop_front()
    }

    /// Another writer's update, of which only the new resourceVersion matters here.
    fn bump_version(&self, name: &str) {
        let mut s = self.state.lock().expect("sink lock");
        s.next_version += 1;
        let version = s.next_version.to_string();
        if let Some(v) = s.objects.get_mut(name) {
            v["metadata"]["resourceVersion"] = json!(version);
        }
    }

    /// A write through [`NodeSink`], meeting the next injected fault if any.
    fn faulty_write<T>(&self, name: &str, write: impl FnOnce() -> SinkResult<T>) -> SinkResult<T> {
        match self.next_fault() {
            None => write(),
            Some(WriteFault::Conflict) => {
                self.bump_version(name);
                write()
            }
            Some(WriteFault::Unavailable) => Err(SinkError::Other(
                "503 Service Unavailable (injected; nothing written)".into(),
            )),
            Some(WriteFault::CommittedButFailed) => {
                write()?;
                Err(SinkError::Other(
                    "504 Gateway Timeout: the server may still be processing the request \
                     (injected; it was written)"
                        .into(),
                ))
            }
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
            // An update without managedFields keeps the stored ones, as the API server does.
            if node.metadata.managed_fields.is_none()
                && let Some(x) = old.pointer("/metadata/managedFields")
            {
                v["metadata"]["managedFields"] = x.clone();
            }
            let _ = self.record_agent(&mut v, &managed_fields::Owned::of(old));
        } else {
            // A creator owns what it set, unless the test forges the record itself.
            if node.metadata.managed_fields.is_none() {
                let time = self.record_agent(&mut v, &managed_fields::Owned::default());
                managed_fields::record_creator(
                    &mut v,
                    managed_fields::AGENT_MANAGER,
                    time.as_deref(),
                );
            }
            // Like the API server: every new object gets a new uid, also under a name used
            // before (a deleted CiliumNode written again).
            s.created += 1;
            v["metadata"]["uid"] = json!(format!("uid-{name}-{}", s.created));
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
        self.put_node_with(name, finalizers, None)
    }

    /// As [`Self::put_node`], with `spec.providerID` (`aws:///<zone>/<instance-id>`, as the
    /// AWS cloud provider sets it): the fact a CiliumNode's instance is checked against.
    pub fn put_node_with(
        &self,
        name: &str,
        finalizers: &[&str],
        provider_id: Option<&str>,
    ) -> Node {
        let mut s = self.state.lock().expect("sink lock");
        s.created += 1;
        let node = Node {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                // A new object gets a new uid (a Node re-registered under its old name too).
                uid: Some(format!("node-uid-{name}-{}", s.created)),
                finalizers: Some(finalizers.iter().map(|f| f.to_string()).collect()),
                ..ObjectMeta::default()
            },
            spec: provider_id.map(|p| k8s_openapi::api::core::v1::NodeSpec {
                provider_id: Some(p.to_string()),
                ..Default::default()
            }),
            ..Node::default()
        };
        s.gone_nodes.remove(name);
        s.nodes.insert(name.to_string(), node.clone());
        node
    }

    /// As [`Self::put_node`], for a kubelet without the AWS cloud provider: no
    /// `spec.providerID`, only its InternalIP in `status.addresses` (the instance's primary
    /// private address), which is then all a CiliumNode's instance is checked against.
    pub fn put_node_at_ip(&self, name: &str, finalizers: &[&str], internal_ip: &str) -> Node {
        let mut node = self.put_node_with(name, finalizers, None);
        node.status = Some(k8s_openapi::api::core::v1::NodeStatus {
            addresses: Some(vec![k8s_openapi::api::core::v1::NodeAddress {
                type_: "InternalIP".into(),
                address: internal_ip.to_string(),
            }]),
            ..Default::default()
        });
        let mut s = self.state.lock().expect("sink lock");
        s.nodes.insert(name.to_string(), node.clone());
        node
    }

    /// The names of the Kubernetes Nodes put by a test that exist now, sorted.
    pub fn node_names(&self) -> Vec<String> {
        let s = self.state.lock().expect("sink lock");
        s.nodes.keys().cloned().collect()
    }

    /// The names of the stored CiliumNodes, sorted.
    pub fn names(&self) -> Vec<String> {
        let s = self.state.lock().expect("sink lock");
        s.objects.keys().cloned().collect()
    }

    /// The Kubernetes Node of this name as the API server holds it now (put by a test).
    pub fn node(&self, name: &str) -> Option<Node> {
        self.state
            .lock()
            .expect("sink lock")
            .nodes
            .get(name)
            .cloned()
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
    fn patch(&self, name: &str, patch: &Value, sub: Option<Subresource>) -> Written {
        let time = self.stamp();
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
        let before = managed_fields::Owned::of(obj);
        json_patch::merge(obj, &p);
        managed_fields::record_at(obj, &before, operator_manager, time.as_deref());
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

impl MemorySink {
    fn apply_now(&self, node: &NodeRef, changes: &ChangeSet) -> Written {
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
}

impl NodeSink for MemorySink {
    async fn apply(&self, node: &NodeRef, changes: &ChangeSet) -> Written {
        let answer = self.faulty_write(&node.name, || self.apply_now(node, changes));
        let slow = self.slow_answers.lock().expect("slow answers").pop_front();
        if let Some(delay) = slow {
            tokio::time::sleep(delay).await;
        }
        answer
    }

    async fn event(&self, node: &NodeRef, event: NodeEvent) {
        self.state
            .lock()
            .expect("sink lock")
            .events
            .push((node.name.clone(), event));
    }

    async fn set_finalizer(&self, node: &NodeRef, present: bool) -> Written {
        match finalizer_patch(node, present) {
            None => Ok(None),
            Some(p) => self.faulty_write(&node.name, || self.patch(&node.name, &p, None)),
        }
    }

    async fn set_annotation(&self, node: &NodeRef, key: &str, value: Option<&str>) -> Written {
        let p = annotation_patch(key, value);
        self.faulty_write(&node.name, || self.patch(&node.name, &p, None))
    }

    async fn delete(&self, name: &str) -> SinkResult<()> {
        self.faulty_write(name, || {
            self.begin_delete(name);
            Ok(())
        })
    }

    async fn node_exists(&self, name: &str) -> SinkResult<bool> {
        // Like the API server: a Node being deleted is still returned by a GET.
        let s = self.state.lock().expect("sink lock");
        Ok(!s.gone_nodes.contains(name))
    }

    async fn fetch(&self, name: &str) -> Written {
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
    use eni_operator::crd::FINALIZER;
    use eni_operator::ipam::Write;

    fn node(name: &str) -> CiliumNode {
        let mut n = CiliumNode::new(name, Default::default());
        n.spec.instance_id = "i-1".into();
        n
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

    #[tokio::test]
    async fn injected_write_faults_answer_like_the_api_server() {
        let sink = MemorySink::new();
        let stored = sink.put(&node("n1"));
        let r = NodeRef::of(&stored);
        let write = |versioned: bool, error: &str| ChangeSet {
            writes: vec![Write {
                subresource: Subresource::Status,
                patch: json!({"status": {"ipam": {"operator-status": {"error": error}}}}),
                needs_resource_version: versioned,
            }],
        };
        let error = |s: &MemorySink| {
            s.get("n1")
                .and_then(|n| n.status)
                .and_then(|st| st.ipam.operator_status.error)
        };
        // Another writer came first: a versioned write conflicts and nothing is written...
        sink.inject_write_fault(WriteFault::Conflict, 1);
        let err = sink.apply(&r, &write(true, "a")).await.unwrap_err();
        assert!(matches!(err, SinkError::Conflict(Some(_))), "{err:?}");
        assert_eq!(error(&sink), None);
        // ...while a write without a resourceVersion lands on the newer version.
        let fresh = NodeRef::of(&sink.get("n1").unwrap());
        sink.inject_write_fault(WriteFault::Conflict, 1);
        sink.apply(&fresh, &write(false, "b")).await.unwrap();
        assert_eq!(error(&sink).as_deref(), Some("b"));
        // 5xx before the commit: nothing written.
        sink.inject_write_fault(WriteFault::Unavailable, 1);
        let fresh = NodeRef::of(&sink.get("n1").unwrap());
        assert!(matches!(
            sink.apply(&fresh, &write(false, "c")).await,
            Err(SinkError::Other(_))
        ));
        assert_eq!(error(&sink).as_deref(), Some("b"));
        // 5xx after the commit: written all the same.
        sink.inject_write_fault(WriteFault::CommittedButFailed, 1);
        assert!(matches!(
            sink.set_finalizer(&fresh, true).await,
            Err(SinkError::Other(_))
        ));
        let after = sink.get("n1").unwrap();
        assert_eq!(
            after.metadata.finalizers.as_deref(),
            Some(&[FINALIZER.to_string()][..])
        );
        // Faults are used up one write each; then writes succeed as before.
        assert_eq!(sink.pending_write_faults(), 0);
        sink.apply(&NodeRef::of(&after), &write(true, "d"))
            .await
            .unwrap();
        assert_eq!(error(&sink).as_deref(), Some("d"));
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
            Some(&json!("uid-n1-1")),
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
