//! Kubernetes watches feeding the allocation core.
//!
//! CiliumNodes are watched leniently, as untyped objects parsed one by one: a single malformed
//! object gets its own operator-status error and Event instead of breaking the whole watch.
//! (kube's `DeserializeGuard` does the same but keeps only the metadata of an object that does
//! not parse; we also need its `spec.instance-id` to release its ENIs when it goes.)
//! Nodes are watched to learn whether a CiliumNode's Node still exists (the finalizer's
//! question) and to drive the CiliumNode's deletion when the Node goes. Pending pods are
//! watched (server-side filtered on `status.phase=Pending`) and counted per node for surge
//! allocation: a node with more pods waiting than addresses needed gets them in one go.

use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use serde::de::DeserializeOwned;
use std::collections::BTreeMap;
use std::fmt::Debug;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Resource;
use kube::api::{Api, ApiResource, DynamicObject, NotUsed, Object};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use tokio::sync::mpsc;
use tracing::warn;

use crate::crd::CiliumNode;

use crate::k8s::input::{InvalidNode, NodeFacts, NodeInput};
use crate::k8s::sink::NodeRef;

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
    // Read before parsing: an object that does not parse must still be deletable (metadata),
    // and its ENIs released (the instance ID, when at least that field is a string).
    let instance_id = value
        .pointer("/spec/instance-id")
        .and_then(serde_json::Value::as_str)
        .unwrap_or_default()
        .to_string();
    match parse_node(value) {
        Ok(node) => NodeInput::Upsert(Box::new(node)),
        Err(error) => NodeInput::Invalid(InvalidNode {
            node: node_ref(obj),
            error,
            deleting: obj.metadata.deletion_timestamp.is_some(),
            instance_id,
        }),
    }
}

/// What one Node watch event tells the core. Only a delete (the API server no longer has the
/// Node) means gone: a Node with a `deletionTimestamp` is draining (Karpenter, any Node
/// finalizer) and its instance still runs pods on our addresses.
pub fn node_input<K: Resource>(event: watcher::Event<K>) -> Option<NodeInput> {
    let (node, present) = match event {
        Event::Apply(n) | Event::InitApply(n) => {
            // Planted defect (dst-mutants): a draining Node counted as gone.
            let gone =
                crate::mutants::active("drain-is-gone") && n.meta().deletion_timestamp.is_some();
            (n, !gone)
        }
        Event::Delete(n) => (n, false),
        Event::Init | Event::InitDone => return None,
    };
    Some(NodeInput::NodePresent {
        name: node.meta().name.clone().unwrap_or_default(),
        present,
    })
}

/// The names a watch has delivered, so that a relist can tell what went while it was away.
///
/// kube's `watcher` relists after a watch ends with an error (a 410 Gone, an API server
/// restart): `Init`, an `InitApply` per object that exists now, `InitDone`. It sends no
/// `Delete` for an object deleted while it was away (kube's reflector store drops such objects
/// by replacing its contents; a bare watcher leaves that to its user). Without this, the core
/// would hold such a node forever: its slot, its metrics, its memory of a name that may come
/// back with a new instance.
#[derive(Debug, Default)]
pub struct Listed {
    known: std::collections::BTreeSet<String>,
    relist: Option<std::collections::BTreeSet<String>>,
}

impl Listed {
    /// `Event::Init`: a listing starts.
    pub fn init(&mut self) {
        self.relist = Some(Default::default());
    }

    /// `Apply` or `InitApply` of `name`.
    pub fn seen(&mut self, name: &str) {
        if let Some(r) = &mut self.relist {
            r.insert(name.to_string());
        }
        self.known.insert(name.to_string());
    }

    /// `Delete` of `name`.
    pub fn deleted(&mut self, name: &str) {
        if let Some(r) = &mut self.relist {
            r.remove(name);
        }
        self.known.remove(name);
    }

    /// `InitDone`: the names known before that the listing no longer has (deleted while the
    /// watch was away), now forgotten.
    pub fn init_done(&mut self) -> Vec<String> {
        let Some(listed) = self.relist.take() else {
            return Vec::new();
        };
        let gone: Vec<String> = self.known.difference(&listed).cloned().collect();
        self.known = listed;
        gone
    }
}

/// `api`'s watch, started again with backoff after errors.
fn watch<K>(
    api: Api<K>,
    config: watcher::Config,
) -> BoxStream<'static, Result<Event<K>, watcher::Error>>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    watcher::watcher(api, config).default_backoff().boxed()
}

/// The next event of a watch, riding out (and logging) its errors; `None` once it ends.
async fn next_event<K>(
    stream: &mut (impl futures::Stream<Item = Result<Event<K>, watcher::Error>> + Unpin),
    what: &str,
) -> Option<Event<K>> {
    loop {
        match stream.try_next().await {
            Ok(event) => return event,
            Err(e) => warn!(error = %e, "{what} watch error"),
        }
    }
}

/// Watch CiliumNodes until the channel closes; `on_listed` runs after each complete listing
/// (the first one, and every re-list after the watch had to start over).
pub async fn watch_cilium_nodes(
    client: kube::Client,
    tx: mpsc::Sender<NodeInput>,
    mut on_listed: impl FnMut() + Send,
) {
    let ar = ApiResource::erase::<CiliumNode>(&());
    let api: Api<DynamicObject> = Api::all_with(client, &ar);
    let mut stream = watch(api, watcher::Config::default());
    let mut listed = Listed::default();
    while let Some(event) = next_event(&mut stream, "CiliumNode").await {
        let inputs = match event {
            Event::Apply(obj) | Event::InitApply(obj) => {
                listed.seen(obj.metadata.name.as_deref().unwrap_or_default());
                vec![to_input(&obj)]
            }
            Event::Delete(obj) => {
                let name = obj.metadata.name.unwrap_or_default();
                listed.deleted(&name);
                vec![NodeInput::Deleted(name)]
            }
            Event::InitDone => {
                on_listed();
                // Deleted while the watch was away: only the relist's silence tells.
                let mut inputs: Vec<NodeInput> = listed
                    .init_done()
                    .into_iter()
                    .map(NodeInput::Deleted)
                    .collect();
                inputs.push(NodeInput::CiliumNodesListed);
                inputs
            }
            Event::Init => {
                listed.init();
                continue;
            }
        };
        for input in inputs {
            if tx.send(input).await.is_err() {
                return;
            }
        }
    }
}

/// What a Node says about its instance (docs/rules.md §15): the instance of its providerID,
/// and its InternalIPs (checked against the instance's primary address when it has none).
pub fn node_facts(node: &Node) -> NodeFacts {
    let instance = node
        .spec
        .as_ref()
        .and_then(|s| s.provider_id.as_deref())
        .and_then(instance_from_provider_id);
    let internal_ips = node
        .status
        .as_ref()
        .and_then(|s| s.addresses.as_ref())
        .into_iter()
        .flatten()
        .filter(|a| a.type_ == "InternalIP")
        .filter_map(|a| a.address.parse().ok())
        .collect();
    NodeFacts {
        instance,
        internal_ips,
    }
}

/// The facts input for one Node watch event (`None` for a deletion).
fn facts_input(event: &Event<Node>) -> Option<NodeInput> {
    let (node, facts) = match event {
        Event::Apply(n) | Event::InitApply(n) => (n, Some(node_facts(n))),
        Event::Delete(n) => (n, None),
        Event::Init | Event::InitDone => return None,
    };
    Some(NodeInput::NodeFacts {
        name: node.metadata.name.clone().unwrap_or_default(),
        facts,
    })
}

/// Everything one Node watch event tells the core, in the watch's order: what the Node says
/// about its instance, then whether it is present.
pub fn node_inputs(event: Event<Node>) -> Vec<NodeInput> {
    let mut inputs: Vec<NodeInput> = facts_input(&event).into_iter().collect();
    inputs.extend(node_input(event));
    inputs
}

/// Every Node once, as the watch would deliver them, then `NodesListed` (`eni-operator plan`).
pub async fn list_nodes(client: kube::Client) -> kube::Result<Vec<NodeInput>> {
    let api: Api<Node> = Api::all(client);
    let list = api.list(&Default::default()).await?;
    let mut inputs = Vec::with_capacity(2 * list.items.len() + 1);
    for node in list.items {
        inputs.extend(node_inputs(Event::InitApply(node)));
    }
    inputs.push(NodeInput::NodesListed);
    Ok(inputs)
}

/// Watch Nodes until the channel closes: presence, absence once deleted, and what each says
/// about its instance (its providerID and InternalIP: a CiliumNode is served only for its
/// Node's instance, §15). Whole objects, parsed one event at a time and never kept: only those
/// facts stay.
pub async fn watch_nodes(client: kube::Client, tx: mpsc::Sender<NodeInput>) {
    let api: Api<Node> = Api::all(client);
    let mut stream = watch(api, watcher::Config::default());
    let mut listed = Listed::default();
    while let Some(event) = next_event(&mut stream, "Node").await {
        let gone = match &event {
            Event::Init => {
                listed.init();
                Vec::new()
            }
            // Deleted while the watch was away: only the relist's silence tells.
            Event::InitDone => listed.init_done(),
            _ => Vec::new(),
        };
        let listed_now = matches!(event, Event::InitDone);
        let mut inputs: Vec<NodeInput> = gone
            .into_iter()
            .flat_map(|name| {
                [
                    NodeInput::NodeFacts {
                        name: name.clone(),
                        facts: None,
                    },
                    NodeInput::NodePresent {
                        name,
                        present: false,
                    },
                ]
            })
            .collect();
        inputs.extend(facts_input(&event));
        if listed_now {
            inputs.push(NodeInput::NodesListed);
        }
        if let Some(input) = node_input(event) {
            if let NodeInput::NodePresent { name, present } = &input {
                if *present {
                    listed.seen(name);
                } else {
                    listed.deleted(name);
                }
            }
            inputs.push(input);
        }
        for input in inputs {
            if tx.send(input).await.is_err() {
                return;
            }
        }
    }
}

/// Pending pods per node, from a watch that only sees pending pods. Pure: it returns the
/// per-node counts that changed, for the core.
#[derive(Debug, Default)]
pub struct PendingPods {
    /// Pod UID -> node it is scheduled to.
    pods: BTreeMap<String, String>,
    counts: BTreeMap<String, u32>,
    /// A relist in progress: the new pod set, swapped in at its end.
    relist: Option<BTreeMap<String, String>>,
}

impl PendingPods {
    /// The pod is pending on `node` (`None`: not scheduled yet, so counted nowhere).
    pub fn upsert(&mut self, uid: &str, node: Option<&str>) -> Vec<(String, u32)> {
        if let Some(relist) = &mut self.relist {
            if let Some(node) = node {
                relist.insert(uid.to_string(), node.to_string());
            }
            return Vec::new();
        }
        // In place: one event costs O(log n), not a copy of every pending pod (a scale-out
        // brings thousands, and this runs in the task that also renews the lease).
        let before = match node {
            Some(node) => self.pods.insert(uid.to_string(), node.to_string()),
            None => self.pods.remove(uid),
        };
        let mut changed = Vec::new();
        if before.as_deref() != node {
            if let Some(old) = before {
                changed.push(self.count(&old, -1));
            }
            if let Some(new) = node {
                changed.push(self.count(new, 1));
            }
        }
        changed
    }

    /// The pod left the pending set (started, failed, deleted).
    pub fn remove(&mut self, uid: &str) -> Vec<(String, u32)> {
        match self.pods.remove(uid) {
            Some(node) => vec![self.count(&node, -1)],
            None => Vec::new(),
        }
    }

    /// Adjust one node's count; returns its new count (a node at zero is dropped).
    fn count(&mut self, node: &str, delta: i32) -> (String, u32) {
        let c = self.counts.entry(node.to_string()).or_default();
        *c = c.saturating_add_signed(delta);
        let now = *c;
        if now == 0 {
            self.counts.remove(node);
        }
        (node.to_string(), now)
    }

    pub fn relist_started(&mut self) {
        self.relist = Some(BTreeMap::new());
    }

    pub fn relist_done(&mut self) -> Vec<(String, u32)> {
        let pods = self.relist.take().unwrap_or_default();
        self.replace(pods)
    }

    fn replace(&mut self, pods: BTreeMap<String, String>) -> Vec<(String, u32)> {
        let mut counts: BTreeMap<String, u32> = BTreeMap::new();
        for node in pods.values() {
            *counts.entry(node.clone()).or_default() += 1;
        }
        let mut changed: Vec<(String, u32)> = counts
            .iter()
            .filter(|(n, c)| self.counts.get(*n) != Some(c))
            .map(|(n, c)| (n.clone(), *c))
            .collect();
        changed.extend(
            self.counts
                .keys()
                .filter(|n| !counts.contains_key(*n))
                .map(|n| (n.clone(), 0)),
        );
        self.pods = pods;
        self.counts = counts;
        changed
    }
}

/// The one field of a Pod's spec the pending pods watch uses.
#[derive(Clone, Debug, Default, serde::Deserialize)]
pub struct ScheduledTo {
    #[serde(rename = "nodeName", default)]
    pub node_name: Option<String>,
}

/// A pending Pod as the watch keeps it: its metadata and `spec.nodeName`, nothing else. Every
/// other field (containers, volumes, status) is dropped as each event is parsed, so a cluster
/// with thousands of pending pods does not cost their whole objects in memory.
pub type PendingPod = Object<ScheduledTo, NotUsed>;

/// Watch pending pods until the channel closes, feeding per-node counts to the core.
pub async fn watch_pending_pods(client: kube::Client, tx: mpsc::Sender<NodeInput>) {
    let api: Api<PendingPod> = Api::all_with(client, &ApiResource::erase::<Pod>(&()));
    // A pod that stops being Pending leaves the filtered watch as a delete.
    let config = watcher::Config::default().fields("status.phase=Pending");
    let mut stream = watch(api, config);
    let mut index = PendingPods::default();
    while let Some(event) = next_event(&mut stream, "pending-pod").await {
        let uid = |p: &PendingPod| p.metadata.uid.clone().unwrap_or_default();
        let node = |p: &PendingPod| p.spec.node_name.clone();
        let changed = match event {
            Event::Apply(p) | Event::InitApply(p) => index.upsert(&uid(&p), node(&p).as_deref()),
            Event::Delete(p) => index.remove(&uid(&p)),
            Event::Init => {
                index.relist_started();
                Vec::new()
            }
            Event::InitDone => index.relist_done(),
        };
        for (name, count) in changed {
            if tx
                .send(NodeInput::PendingPods { name, count })
                .await
                .is_err()
            {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests;
