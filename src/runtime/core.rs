//! The allocation core: cache, deficit queue, bounded workers, executor, node memory.
//!
//! Input: [`NodeInput`]s through a channel (CiliumNode upserts and deletions, malformed
//! objects, whether the Kubernetes Node exists). Output: a [`NodeSink`]. No Kubernetes client
//! in here, so tests and the benchmark drive it with the simulator and a `MemorySink`.
//!
//! Per node and pass: plan -> execute (results go into the cache at once) -> desired state ->
//! change set -> sink. Errors become `operator-status` + a Warning Event; the node backs off.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use rand::Rng;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tracing::{debug, info, warn};

use crate::crd::{CILIUM_IGNORE_ANNOTATION, CiliumNode, FINALIZER, IGNORE_ANNOTATION};
use crate::ec2::{Ec2, Ec2Error};
use crate::ipam::release::{allocated_cidrs, readopted};
use crate::ipam::{
    self, Action, ChangeSet, Demand, Generation, IpamConfig, NodeMemory, Problem, ProblemReason,
    Release, Subresource, Write,
};

use super::cache::Ec2Cache;
use super::executor::{Executor, Success};
use super::finalizer::release_instance_enis;
use super::metrics::{self, RuntimeMetrics};
use super::queue::{DeficitQueue, Outcome, Priority};
use super::refresher::{INSTANCE_BATCH, Refresher, Scope};
use super::sink::{NodeEvent, NodeRef, NodeSink, SinkError, SinkResult};
use super::stored::StoredNode;

/// Settings of the core.
#[derive(Clone, Debug)]
pub struct CoreConfig {
    /// `--parallel-alloc-workers`.
    pub workers: usize,
    /// Full EC2 refresh followed by a rescan of every node.
    pub resync_interval: Duration,
    /// Rescan of every node on the cached EC2 view (`--node-resync-interval`).
    pub node_rescan_interval: Duration,
    /// Minimum spacing of per-instance refreshes after our own changes.
    pub instance_refresh_spacing: Duration,
    /// How long a node whose instance is "not running" is left alone.
    pub not_running_hold: Duration,
    /// Retry spacing while the EC2 view is unhealthy.
    pub unhealthy_retry: Duration,
    /// Load every instance type's limits at start (else only types seen on nodes).
    pub preload_instance_types: bool,
    pub ipam: IpamConfig,
    pub scope: Scope,
    /// `--annotate-cilium-ignore`: keep `ipam.cilium.io/ignore: "true"` on the nodes we serve.
    pub annotate_cilium_ignore: bool,
}

impl Default for CoreConfig {
    fn default() -> Self {
        Self {
            workers: 50,
            resync_interval: Duration::from_secs(60),
            node_rescan_interval: Duration::from_secs(60),
            instance_refresh_spacing: Duration::from_secs(15),
            not_running_hold: Duration::from_secs(60),
            unhealthy_retry: Duration::from_secs(60),
            preload_instance_types: true,
            ipam: IpamConfig::default(),
            scope: Scope::default(),
            annotate_cilium_ignore: false,
        }
    }
}

/// What the sources tell the core.
#[derive(Clone, Debug)]
pub enum NodeInput {
    /// A CiliumNode was added or changed (parsed).
    Upsert(Box<CiliumNode>),
    /// A CiliumNode that does not parse: report it on that object only.
    Invalid(InvalidNode),
    /// The CiliumNode object is gone.
    Deleted(String),
    /// Whether the Kubernetes Node of that name exists.
    NodePresent { name: String, present: bool },
    /// Pending pods scheduled to the node (surge allocation).
    PendingPods { name: String, count: u32 },
}

/// A CiliumNode that does not parse: what its metadata (and a lenient read) still tell, so its
/// deletion and our finalizer are handled all the same.
#[derive(Clone, Debug)]
pub struct InvalidNode {
    pub node: NodeRef,
    pub error: String,
    /// It carries a `deletionTimestamp`.
    pub deleting: bool,
    /// `spec.instance-id` when that field is readable, else empty.
    pub instance_id: String,
}

#[derive(Debug, Default)]
struct Slot {
    node: Option<StoredNode>,
    invalid: Option<InvalidNode>,
    invalid_reported: Option<String>,
    memory: NodeMemory,
    /// `None`: not known yet (treated as present: never pull ENIs from a live node).
    k8s_node: Option<bool>,
    not_running_until: Option<Instant>,
    last_problem: Option<String>,
    demand_seen: Option<Instant>,
    pending_pods: u32,
    demand: Demand,
    errored: bool,
    /// The last pass found every ENI full and no interface slot free.
    at_capacity: bool,
    /// Annotated `eni-operator.cilium.io/ignore`: only our finalizer is left to remove.
    ignored: bool,
}

struct Inner<E, S> {
    ec2: Arc<E>,
    sink: Arc<S>,
    cache: Arc<RwLock<Ec2Cache>>,
    refresher: Refresher<E>,
    executor: Executor<E>,
    config: CoreConfig,
    slots: Mutex<HashMap<String, Slot>>,
    type_lookups: Mutex<HashMap<String, Instant>>,
    metrics: RuntimeMetrics,
    /// True while `run` has warm caches (after the first full EC2 refresh).
    warm: tokio::sync::watch::Sender<bool>,
}

/// The allocation core. Cheap to clone (a handle).
pub struct Core<E, S> {
    inner: Arc<Inner<E, S>>,
}

impl<E, S> Clone for Core<E, S> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}

fn priority_of(slot: &Slot) -> Priority {
    match &slot.node {
        _ if slot.invalid.as_ref().is_some_and(|i| i.deleting) => Priority::Deleting,
        Some(n) if n.deleting() => Priority::Deleting,
        Some(_) if slot.k8s_node == Some(false) => Priority::Deleting,
        Some(n) if n.pool_empty() && slot.demand == Demand::default() => Priority::NoFreeIp(8),
        _ => Priority::from_demand(
            slot.demand.available,
            slot.demand.used,
            slot.demand.needed,
            slot.demand.excess,
        ),
    }
}

enum Done {
    Pass(String, Outcome, Option<Priority>),
    Refreshed(Vec<String>),
    FullRefresh,
}

impl<E: Ec2, S: NodeSink> Core<E, S> {
    pub fn new(ec2: Arc<E>, sink: Arc<S>, config: CoreConfig, metrics: RuntimeMetrics) -> Self {
        let cache = Arc::new(RwLock::new(Ec2Cache::for_cluster(
            config.ipam.cluster_name.clone(),
        )));
        let refresher = Refresher::new(
            ec2.clone(),
            cache.clone(),
            config.scope.clone(),
            config.instance_refresh_spacing,
        );
        let executor = Executor::new(ec2.clone(), cache.clone()).with_metrics(metrics.clone());
        Self {
            inner: Arc::new(Inner {
                ec2,
                sink,
                cache,
                refresher,
                executor,
                config,
                slots: Mutex::new(HashMap::new()),
                type_lookups: Mutex::new(HashMap::new()),
                metrics,
                warm: tokio::sync::watch::Sender::new(false),
            }),
        }
    }

    pub fn cache(&self) -> &Arc<RwLock<Ec2Cache>> {
        &self.inner.cache
    }

    pub fn metrics(&self) -> &RuntimeMetrics {
        &self.inner.metrics
    }

    /// Becomes true once [`Core::run`] has rebuilt its EC2 view and starts serving nodes.
    pub fn warm(&self) -> tokio::sync::watch::Receiver<bool> {
        self.inner.warm.subscribe()
    }

    /// Handles to this core still alive (the benchmark waits for 1 before it measures what
    /// dropping the core frees).
    pub fn handles(&self) -> usize {
        Arc::strong_count(&self.inner)
    }

    /// The last demand figures of a node.
    pub fn demand(&self, name: &str) -> Option<Demand> {
        self.inner
            .slots
            .lock()
            .expect("slots")
            .get(name)
            .map(|s| s.demand.clone())
    }

    /// Run until `shutdown` completes (or the future is dropped: every worker is aborted with
    /// it, which is how a lost lease stops all mutating work at once).
    pub async fn run(
        self,
        mut inputs: mpsc::Receiver<NodeInput>,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), Ec2Error> {
        let inner = &self.inner;
        // A new leader rebuilds its view before acting (§14).
        if inner.config.preload_instance_types {
            inner.refresher.instance_types(&[]).await?;
        }
        inner.refresher.full().await?;
        inner.metrics.leader.set(1);
        inner.warm.send_replace(true);

        let mut queue: DeficitQueue<String> = DeficitQueue::new();
        let mut tasks: JoinSet<Done> = JoinSet::new();
        // What each task was for, so a panicking task is finished like a failed one instead of
        // leaving its node marked in progress (or the refresh flags set) for good.
        let mut running: BTreeMap<tokio::task::Id, Done> = BTreeMap::new();
        let mut waiting: BTreeMap<String, BTreeSet<String>> = BTreeMap::new(); // instance -> nodes
        let mut refreshing = false;
        let mut full_running = false;
        let mut confirm: BTreeSet<String> = BTreeSet::new();
        let mut confirm_due = false;
        let mut resync = tokio::time::interval(inner.config.resync_interval);
        resync.tick().await;
        let mut rescan = tokio::time::interval(inner.config.node_rescan_interval);
        rescan.tick().await;
        let mut confirm_tick = tokio::time::interval(inner.config.instance_refresh_spacing);
        confirm_tick.tick().await;
        tokio::pin!(shutdown);
        let mut inputs_open = true;
        let mut workers = 0usize;

        loop {
            // Start every ready node we have a worker for.
            while workers < inner.config.workers.max(1) {
                let Some(name) = queue.pop(now()) else { break };
                workers += 1;
                let core = self.clone();
                let on_panic =
                    Done::Pass(name.clone(), Outcome::Failed, Some(self.priority(&name)));
                let id = tasks
                    .spawn(async move {
                        let (outcome, again) = core.pass(&name).await;
                        Done::Pass(name, outcome, again)
                    })
                    .id();
                running.insert(id, on_panic);
            }
            // Batched per-instance refresh of new instances at once; confirmations of our own
            // changes at most once per `instance_refresh_spacing`, in one batch, so describe
            // calls per minute do not grow with the number of nodes (§10). More
            // changed instances than one batch holds are left to the next full refresh, which
            // lists them all anyway.
            if confirm_due && confirm.len() > INSTANCE_BATCH {
                confirm_due = false;
            }
            let confirm_now = confirm_due && waiting.is_empty() && !confirm.is_empty();
            if !refreshing && (!waiting.is_empty() || confirm_now) {
                let ids: Vec<String> = waiting.keys().cloned().collect();
                let confirm_ids: Vec<String> = if confirm_now {
                    std::mem::take(&mut confirm).into_iter().collect()
                } else {
                    Vec::new()
                };
                confirm_due &= !confirm_now;
                refreshing = true;
                let core = self.clone();
                let on_panic = Done::Refreshed(ids.clone());
                let id = tasks
                    .spawn(async move {
                        if !ids.is_empty()
                            && let Err(e) = core.inner.refresher.instances(&ids, false).await
                        {
                            warn!(error = %e, "per-instance refresh failed");
                        }
                        if !confirm_ids.is_empty()
                            && let Err(e) = core.inner.refresher.instances(&confirm_ids, true).await
                        {
                            debug!(error = %e, "confirmation refresh failed");
                        }
                        Done::Refreshed(ids)
                    })
                    .id();
                running.insert(id, on_panic);
            }
            inner.metrics.queue_depth.set(queue.depth() as i64);

            // Only wake for a due node when a worker is free to take it: with every worker busy
            // a due time in the past would make the select below return at once, forever (a
            // busy loop; under a paused clock, a livelock).
            let next_due = if workers < inner.config.workers.max(1) {
                queue.next_due()
            } else {
                None
            };
            tokio::select! {
                () = &mut shutdown => break,
                input = inputs.recv(), if inputs_open => match input {
                    None => inputs_open = false,
                    Some(input) => self.accept(input, &mut queue, &mut waiting, refreshing),
                },
                Some(joined) = tasks.join_next_with_id(), if !tasks.is_empty() => match joined
                    .map(|(id, done)| { running.remove(&id); done })
                    .or_else(|e| {
                        warn!(error = %e, "a runtime task failed; finishing it as failed");
                        running.remove(&e.id()).ok_or(e)
                    })
                {
                    Ok(Done::Pass(name, outcome, again)) => {
                        workers -= 1;
                        queue.finish(&name, outcome, now(), rand::rng().random::<f64>());
                        if let Some(p) = again {
                            queue.push(name.clone(), p);
                        }
                        if outcome == Outcome::Done && again.is_some()
                            && let Some(i) = self.instance_of(&name)
                        {
                            confirm.insert(i);
                        }
                        if queue.depth() == 0 && workers == 0 {
                            self.publish_totals();
                        }
                    }
                    Ok(Done::Refreshed(ids)) => {
                        refreshing = false;
                        for id in ids {
                            for name in waiting.remove(&id).unwrap_or_default() {
                                let p = self.priority(&name);
                                queue.push(name, p);
                            }
                        }
                    }
                    Ok(Done::FullRefresh) => {
                        full_running = false;
                        // Resync pass: every node, neediest first.
                        self.requeue_all(&mut queue);
                        self.publish_totals();
                    }
                    Err(e) => warn!(error = %e, "an untracked runtime task failed"),
                },
                _ = resync.tick() => {
                    if !full_running {
                        full_running = true;
                        // The full listing covers every change made before it starts.
                        confirm.clear();
                        let core = self.clone();
                        let id = tasks.spawn(async move {
                            if let Err(e) = core.inner.refresher.full().await {
                                warn!(error = %e, "full EC2 refresh failed; mutations blocked");
                                core.inner.metrics.error(&e.code);
                            }
                            Done::FullRefresh
                        }).id();
                        running.insert(id, Done::FullRefresh);
                    }
                }
                _ = rescan.tick() => {
                    // Re-plan every node on the cached view, between full EC2 refreshes.
                    self.requeue_all(&mut queue);
                }
                _ = confirm_tick.tick() => confirm_due = true,
                () = async {
                    match next_due {
                        Some(at) => tokio::time::sleep_until(at.into()).await,
                        None => std::future::pending().await,
                    }
                } => {}
            }
        }
        inner.metrics.leader.set(0);
        inner.warm.send_replace(false);
        Ok(())
    }

    /// Queue every known node at its current severity.
    fn requeue_all(&self, queue: &mut DeficitQueue<String>) {
        let slots = self.inner.slots.lock().expect("slots");
        for (name, slot) in slots.iter() {
            queue.push(name.clone(), priority_of(slot));
        }
    }

    fn instance_of(&self, name: &str) -> Option<String> {
        let slots = self.inner.slots.lock().expect("slots");
        let id = slots.get(name)?.node.as_ref()?.instance_id();
        (!id.is_empty()).then(|| id.to_string())
    }

    fn priority(&self, name: &str) -> Priority {
        let slots = self.inner.slots.lock().expect("slots");
        slots
            .get(name)
            .map(priority_of)
            .unwrap_or(Priority::Routine)
    }

    fn accept(
        &self,
        input: NodeInput,
        queue: &mut DeficitQueue<String>,
        waiting: &mut BTreeMap<String, BTreeSet<String>>,
        _refreshing: bool,
    ) {
        let inner = &self.inner;
        // A node's serialised form is built before the slots lock is taken.
        let stored = match &input {
            NodeInput::Upsert(node) => Some(StoredNode::new(node)),
            _ => None,
        };
        let mut slots = inner.slots.lock().expect("slots");
        match input {
            NodeInput::Upsert(node) => {
                let name = node.metadata.name.clone().unwrap_or_default();
                let ignored = node
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(IGNORE_ANNOTATION))
                    .is_some_and(|v| v == "true");
                if ignored {
                    // Opted out: let go of the node, including our finalizer if it has one.
                    let ours = node
                        .metadata
                        .finalizers
                        .as_ref()
                        .is_some_and(|f| f.iter().any(|x| x == FINALIZER));
                    if ours {
                        let slot = slots.entry(name.clone()).or_default();
                        slot.ignored = true;
                        slot.node = stored;
                        queue.push(name, Priority::Deleting);
                    } else {
                        if let Some(node) = slots.remove(&name).and_then(|s| s.node) {
                            self.forget_instance(node.instance_id());
                        }
                        queue.remove(&name);
                    }
                    return;
                }
                let slot = slots.entry(name.clone()).or_default();
                slot.ignored = false;
                // Any update is a sign of life (§5.2).
                slot.not_running_until = None;
                slot.invalid = None;
                let instance = node.spec.instance_id.clone();
                slot.node = stored;
                let p = priority_of(slot);
                let unknown = {
                    let mut cache = inner.cache.write().expect("cache");
                    cache.manage(&instance);
                    !instance.is_empty()
                        && p != Priority::Deleting
                        && cache.needs_instance_refresh(&instance)
                };
                if unknown {
                    waiting.entry(instance).or_default().insert(name);
                } else {
                    queue.push(name, p);
                }
            }
            NodeInput::Invalid(invalid) => {
                let name = invalid.node.name.clone();
                let slot = slots.entry(name.clone()).or_default();
                let p = if invalid.deleting || slot.k8s_node == Some(false) {
                    Priority::Deleting
                } else {
                    Priority::Routine
                };
                slot.invalid = Some(invalid);
                queue.push(name, p);
            }
            NodeInput::Deleted(name) => {
                queue.remove(&name);
                if let Some(slot) = slots.remove(&name)
                    && let Some(node) = slot.node
                {
                    inner
                        .cache
                        .write()
                        .expect("cache")
                        .drop_instance(node.instance_id());
                    inner.refresher.forget(node.instance_id());
                }
            }
            NodeInput::NodePresent { name, present } => {
                // Only for nodes we hold: a slot made here for a Node without a CiliumNode
                // (or whose CiliumNode is already gone) would never be removed. Not known
                // counts as present.
                if let Some(slot) = slots.get_mut(&name) {
                    slot.k8s_node = Some(present);
                    if !present && (slot.node.is_some() || slot.invalid.is_some()) {
                        queue.push(name, Priority::Deleting);
                    }
                }
            }
            NodeInput::PendingPods { name, count } => {
                // A count may come before the node's CiliumNode: kept while non-zero, and a
                // slot holding nothing else goes when it drops to zero.
                if count == 0 && !slots.contains_key(&name) {
                    return;
                }
                let slot = slots.entry(name.clone()).or_default();
                if slot.pending_pods != count {
                    slot.pending_pods = count;
                    if slot.node.is_some() {
                        queue.push(name.clone(), Priority::Deficit(count));
                    }
                }
                if slot.node.is_none() && slot.invalid.is_none() && slot.pending_pods == 0 {
                    slots.remove(&name);
                }
            }
        }
    }

    fn publish_totals(&self) {
        let slots = self.inner.slots.lock().expect("slots");
        let m = &self.inner.metrics;
        let (mut a, mut u, mut n) = (0, 0, 0);
        let mut states: BTreeMap<&str, i64> = BTreeMap::new();
        let mut per_node = Vec::with_capacity(slots.len());
        for (name, s) in slots.iter() {
            if s.node.is_some() && !s.ignored {
                let d = &s.demand;
                per_node.push((name.clone(), d.available, d.used, d.needed));
            }
            a += s.demand.available;
            u += s.demand.used;
            n += s.demand.needed.max(0);
            let state = if s.at_capacity {
                "at-capacity"
            } else if s.errored {
                "error"
            } else if s.demand.needed > 0 {
                "in-deficit"
            } else {
                "ok"
            };
            *states.entry(state).or_default() += 1;
        }
        m.ips_available.set(a);
        m.ips_used.set(u);
        m.ips_needed.set(n);
        drop(slots);
        m.publish_nodes(per_node.iter().map(|(n, a, u, d)| (n.as_str(), *a, *u, *d)));
        for state in ["ok", "in-deficit", "at-capacity", "error"] {
            m.nodes
                .get_or_create(&vec![("state", state.to_string())])
                .set(states.get(state).copied().unwrap_or(0));
        }
        let cache = self.inner.cache.read().expect("cache");
        let (enis, _) = cache.totals();
        m.enis_managed.set(enis as i64);
        m.publish_subnets(cache.subnets.values().map(|s| {
            (
                s.id.as_str(),
                s.availability_zone.as_str(),
                s.available_addresses,
            )
        }));
    }

    /// One pass over one node. Never runs twice at once for a node (the queue sees to it).
    async fn pass(&self, name: &str) -> (Outcome, Option<Priority>) {
        let inner = &self.inner;
        inner.metrics.passes.inc();
        let (node, mut memory, invalid, invalid_reported, k8s_node, hold, pending, ignored) = {
            let slots = inner.slots.lock().expect("slots");
            let Some(slot) = slots.get(name) else {
                return (Outcome::Done, None);
            };
            (
                slot.node.clone(),
                slot.memory.clone(),
                slot.invalid.clone(),
                slot.invalid_reported.clone(),
                slot.k8s_node,
                slot.not_running_until,
                slot.pending_pods,
                slot.ignored,
            )
        };
        if let Some(invalid) = invalid {
            let last_instance = node.as_ref().map(|n| n.instance_id().to_string());
            return self
                .pass_invalid(name, invalid, invalid_reported, k8s_node, last_instance)
                .await;
        }
        // Parsed outside the slots lock.
        let Some(mut node) = node.as_ref().map(StoredNode::node) else {
            return (Outcome::Done, None);
        };
        if ignored {
            // Handing the node back: Cilium's operator may serve it again.
            let node = match self.mark_cilium_ignore(&node, false).await {
                Ok(fresh) => fresh.unwrap_or(node),
                Err(SinkError::NotFound) => {
                    inner.slots.lock().expect("slots").remove(name);
                    return (Outcome::Done, None);
                }
                Err(e) => {
                    warn!(node = name, error = %e, "could not remove {CILIUM_IGNORE_ANNOTATION}");
                    return (Outcome::Failed, None);
                }
            };
            return match inner.sink.set_finalizer(&NodeRef::of(&node), false).await {
                Ok(_) | Err(SinkError::NotFound) => {
                    inner.slots.lock().expect("slots").remove(name);
                    self.forget_instance(&node.spec.instance_id);
                    (Outcome::Done, None)
                }
                Err(_) => (Outcome::Failed, None),
            };
        }

        // --instance-tags-filter: an instance without the tags is not ours (another operator
        // may serve it, as with Cilium's filter): leave its CiliumNode alone.
        let in_scope = inner
            .cache
            .read()
            .expect("cache")
            .in_scope(&node.spec.instance_id);
        match in_scope {
            Some(true) => {}
            // Tags not known yet (the check failed): the next full refresh tells.
            None => return (Outcome::RetryAfter(inner.config.unhealthy_retry), None),
            Some(false) => return self.leave_alone(name, &node).await,
        }

        // The Kubernetes Node is gone: delete the CiliumNode; the finalizer runs next.
        if k8s_node == Some(false) && node.metadata.deletion_timestamp.is_none() {
            match inner.sink.delete(name).await {
                Ok(()) | Err(SinkError::NotFound) => {}
                Err(e) => {
                    warn!(node = name, error = %e, "could not delete the CiliumNode");
                    return (Outcome::Failed, None);
                }
            }
            node.metadata.deletion_timestamp =
                Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
                ));
            let stored = StoredNode::new(&node);
            self.with_slot(name, |s| s.node = Some(stored));
        }
        if node.metadata.deletion_timestamp.is_some() {
            return self
                .finalize(name, &NodeRef::of(&node), &node.spec.instance_id)
                .await;
        }

        let has_finalizer = node
            .metadata
            .finalizers
            .as_ref()
            .is_some_and(|f| f.iter().any(|x| x == FINALIZER));
        if !has_finalizer {
            match inner.sink.set_finalizer(&NodeRef::of(&node), true).await {
                Ok(Some(n)) => node = n,
                Ok(None) => {}
                Err(SinkError::NotFound) => return (Outcome::Done, None),
                Err(SinkError::Conflict(fresh)) => {
                    if let Some(f) = fresh {
                        let stored = StoredNode::new(&f);
                        self.with_slot(name, |s| s.node = Some(stored));
                    }
                    return (Outcome::RetryAfter(Duration::from_millis(500)), None);
                }
                Err(e) => {
                    warn!(node = name, error = %e, "could not add the finalizer");
                    return (Outcome::Failed, None);
                }
            }
            let stored = StoredNode::new(&node);
            self.with_slot(name, |s| s.node = Some(stored));
        }
        // Tell Cilium's operator to keep off before we touch EC2 for the node.
        match self.mark_cilium_ignore(&node, true).await {
            Ok(Some(n)) => {
                node = n;
                let stored = StoredNode::new(&node);
                self.with_slot(name, |s| s.node = Some(stored));
            }
            Ok(None) => {}
            Err(SinkError::NotFound) => return (Outcome::Done, None),
            Err(e) => {
                warn!(node = name, error = %e, "could not set {CILIUM_IGNORE_ANNOTATION}");
                return (Outcome::Failed, None);
            }
        }

        let t = now();
        if !inner.cache.read().expect("cache").healthy {
            // Never act on an EC2 view we could not refresh (§1.2).
            return (Outcome::RetryAfter(inner.config.unhealthy_retry), None);
        }
        if let Some(until) = hold
            && until > t
        {
            return (Outcome::RetryAfter(until - t), None);
        }

        let instance_id = node.spec.instance_id.clone();
        let instance_type = node.spec.eni.instance_type.clone();
        self.ensure_limits(&instance_type).await;
        if !instance_id.is_empty()
            && let Some(e) = inner.executor.retry_pending(&instance_id).await
        {
            debug!(node = name, error = %e, "delete-on-termination retry failed");
        }

        let plan = {
            let cache = inner.cache.read().expect("cache");
            let view = cache.view(&instance_id, &instance_type);
            // Real (not tokio) time: planning is synchronous, so this is its CPU cost.
            let started = std::time::Instant::now();
            let plan = ipam::plan_node(&node, &view, &inner.config.ipam, &mut memory, t, pending);
            inner.metrics.plans.inc();
            inner
                .metrics
                .plan_nanos
                .inc_by(started.elapsed().as_nanos() as u64);
            plan
        };
        let checked;
        let mut action = &plan.action;
        if plan.demand.generation == Generation::MultiPool
            && let Action::Release(r) = &plan.action
        {
            match self.check_multi_pool_release(name, r).await {
                Ok(Some(release)) => {
                    checked = Action::Release(release);
                    action = &checked;
                }
                Ok(None) => {
                    // Taken back: no EC2 call; the re-adoption's update re-plans the node.
                    self.with_slot(name, |s| s.memory = memory);
                    return (Outcome::Done, None);
                }
                Err(outcome) => return (outcome, None),
            }
        }
        let exec = inner.executor.execute(action).await;
        if let Some(r) = &exec.released {
            memory.record_released(r, now());
        }
        if exec.retire_token {
            memory.retire_eni_token();
        }
        let problem = match &exec.error {
            Some(e) => {
                inner.metrics.error(&e.code);
                Some(Problem {
                    reason: ProblemReason::Ec2Error,
                    message: e.to_string(),
                })
            }
            None => plan.problem.clone(),
        };

        let desired = {
            let cache = inner.cache.read().expect("cache");
            let view = cache.view(&instance_id, &instance_type);
            ipam::desired_state(&node, &view, &inner.config.ipam, &memory, problem.as_ref())
        };
        let changes = ipam::changes(&node, &desired);
        let mut outcome = Outcome::Done;
        let mut again = None;
        let mut written = None;
        if !changes.is_empty() {
            match inner.sink.apply(&NodeRef::of(&node), &changes).await {
                Ok(n) => written = n,
                Err(SinkError::NotFound) => return (Outcome::Done, None),
                Err(SinkError::Conflict(fresh)) => {
                    // Recompute against the fresh object next pass.
                    written = fresh.map(|f| *f);
                    again = Some(Priority::Routine);
                }
                Err(e) => {
                    warn!(node = name, error = %e, "CiliumNode write failed");
                    outcome = Outcome::Failed;
                }
            }
        }

        // Events: successes, and a Warning whenever the problem changes.
        let node_ref = NodeRef::of(written.as_ref().unwrap_or(&node));
        if let Some(s) = &exec.success {
            let ev = match s {
                Success::EniCreated { eni_id, addresses } => NodeEvent::normal(
                    "EniCreated",
                    format!("created and attached {eni_id} with {addresses} addresses"),
                ),
                Success::EniAttached { eni_id, addresses } => NodeEvent::normal(
                    "EniAttached",
                    format!(
                        "attached {eni_id} (left unattached earlier) with {addresses} addresses"
                    ),
                ),
                Success::IpsAllocated { eni_id, addresses } => NodeEvent::normal(
                    "IpsAllocated",
                    format!("allocated {addresses} addresses on {eni_id}"),
                ),
                Success::IpsReleased { eni_id, addresses } => NodeEvent::normal(
                    "IpsReleased",
                    format!("released {addresses} addresses from {eni_id}"),
                ),
            };
            inner.sink.event(&node_ref, ev).await;
        }
        if let Some(w) = &exec.warning {
            inner
                .sink
                .event(&node_ref, NodeEvent::warning("PrefixesNotGranted", w))
                .await;
        }
        let message = problem.as_ref().map(|p| p.message.clone());
        let previous = self.with_slot(name, |s| s.last_problem.clone()).flatten();
        if message != previous
            && let Some(p) = &problem
        {
            if p.reason != ProblemReason::Ec2Error {
                inner.metrics.error(p.reason.as_str());
            }
            inner
                .sink
                .event(&node_ref, NodeEvent::warning(p.reason.as_str(), &p.message))
                .await;
        }

        if exec.not_running {
            let until = now() + inner.config.not_running_hold;
            self.with_slot(name, |s| s.not_running_until = Some(until));
            outcome = Outcome::RetryAfter(inner.config.not_running_hold);
        } else if exec.error.is_some() {
            outcome = Outcome::Failed;
        } else if exec.changed {
            // More may be needed than one action gives: look again at once.
            again = Some(Priority::from_demand(
                plan.demand.available,
                plan.demand.used,
                plan.demand.needed,
                plan.demand.excess,
            ));
            info!(node = name, "EC2 changed for the node");
        }

        let t_end = now();
        let demand = plan.demand.clone();
        // Serialised before the slots lock is taken.
        let written = written.as_ref().map(StoredNode::new);
        self.with_slot(name, |s| {
            s.memory = memory;
            s.last_problem = message;
            s.errored = problem.is_some();
            s.at_capacity = problem
                .as_ref()
                .is_some_and(|p| p.reason == ProblemReason::AtCapacity);
            if written.is_some() {
                s.node = written;
            }
            let met = demand.needed <= 0 && !exec.changed;
            match (s.demand_seen, met) {
                (None, false) => s.demand_seen = Some(t),
                (Some(seen), true) => {
                    inner
                        .metrics
                        .demand_latency
                        .observe(t_end.duration_since(seen).as_secs_f64());
                    s.demand_seen = None;
                }
                _ => {}
            }
            s.demand = demand;
        });
        (outcome, again)
    }

    /// A node whose instance lacks the `--instance-tags-filter` tags: no writes, no EC2 calls;
    /// only our finalizer goes, should it have one (its instance lost the tags), as for an
    /// ignored node. Said once in the log; a rescan checks the tags again.
    async fn leave_alone(&self, name: &str, node: &CiliumNode) -> (Outcome, Option<Priority>) {
        const NOT_MANAGED: &str = "instance lacks the --instance-tags-filter tags";
        let said = self.with_slot(name, |s| s.last_problem.replace(NOT_MANAGED.into()));
        if said.flatten().as_deref() != Some(NOT_MANAGED) {
            info!(
                node = name,
                instance = node.spec.instance_id,
                "not managed: {NOT_MANAGED}"
            );
        }
        let r = NodeRef::of(node);
        if !r.finalizers.iter().any(|f| f == FINALIZER) {
            return (Outcome::Done, None);
        }
        match self.inner.sink.set_finalizer(&r, false).await {
            Ok(_) | Err(SinkError::NotFound) => (Outcome::Done, None),
            Err(SinkError::Conflict(fresh)) => {
                if let Some(f) = fresh {
                    let stored = StoredNode::new(&f);
                    self.with_slot(name, |s| s.node = Some(stored));
                }
                (Outcome::RetryAfter(Duration::from_millis(500)), None)
            }
            Err(e) => {
                warn!(node = name, error = %e, "could not remove the finalizer");
                (Outcome::Failed, None)
            }
        }
    }

    /// The node is gone from our state: its instance too (cache and refresh spacing).
    fn forget_instance(&self, instance: &str) {
        if !instance.is_empty() {
            self.inner
                .cache
                .write()
                .expect("cache")
                .drop_instance(instance);
            self.inner.refresher.forget(instance);
        }
    }

    fn with_slot<T>(&self, name: &str, f: impl FnOnce(&mut Slot) -> T) -> Option<T> {
        let mut slots = self.inner.slots.lock().expect("slots");
        slots.get_mut(name).map(f)
    }

    /// Describe a type we have no limits for (just that type, at most once a minute).
    async fn ensure_limits(&self, instance_type: &str) {
        if instance_type.is_empty()
            || self
                .inner
                .cache
                .read()
                .expect("cache")
                .limits
                .contains_key(instance_type)
        {
            return;
        }
        let t = now();
        {
            let mut lookups = self.inner.type_lookups.lock().expect("lookups");
            if lookups
                .get(instance_type)
                .is_some_and(|at| t.duration_since(*at) < Duration::from_secs(60))
            {
                return;
            }
            lookups.insert(instance_type.to_string(), t);
        }
        if let Err(e) = self
            .inner
            .refresher
            .instance_types(&[instance_type.to_string()])
            .await
        {
            debug!(instance_type, error = %e, "instance type lookup failed");
        }
    }

    /// §7.4 step 3, the last check before a multi-pool unassign: read the CiliumNode afresh
    /// and release nothing the agent lists in `pools.allocated` again. The plan's copy can be
    /// seconds old (a lagging watch; awaits that last 20 s under throttling), and the agent
    /// re-adopts a dropped CIDR that is still attached when its demand grows (Cilium #46674).
    /// One unassign call per pass (prefixes first, single addresses on the next pass), so the
    /// check always directly precedes the call. `Ok(None)`: skip this pass.
    async fn check_multi_pool_release(
        &self,
        name: &str,
        planned: &Release,
    ) -> Result<Option<Release>, Outcome> {
        let mut release = planned.clone();
        if !release.prefixes.is_empty() {
            release.ips.clear();
        }
        let fresh = match self.inner.sink.fetch(name).await {
            Ok(Some(fresh)) => fresh,
            // Gone: the watch's delete follows.
            Ok(None) => return Err(Outcome::Done),
            Err(e) => {
                warn!(node = name, error = %e, "cannot re-read the CiliumNode before a release");
                return Err(Outcome::Failed);
            }
        };
        if readopted(&release, &allocated_cidrs(&fresh)) {
            // The slot keeps the watched copy: the watch delivers this update (or a newer one)
            // and re-plans; storing our read could overwrite a newer watched version.
            info!(node = name, eni = %release.eni_id, "the agent took back CIDRs planned for release; not releasing");
            return Ok(None);
        }
        Ok(Some(release))
    }

    /// A CiliumNode that does not parse. Its deletion works from metadata alone (with the Node
    /// gone, delete it; once deleted, release and drop our finalizer), so it never hangs in
    /// Terminating; otherwise the error goes on the object.
    async fn pass_invalid(
        &self,
        name: &str,
        mut invalid: InvalidNode,
        reported: Option<String>,
        k8s_node: Option<bool>,
        last_instance: Option<String>,
    ) -> (Outcome, Option<Priority>) {
        if k8s_node == Some(false) && !invalid.deleting {
            match self.inner.sink.delete(name).await {
                Ok(()) | Err(SinkError::NotFound) => {}
                Err(e) => {
                    warn!(node = name, error = %e, "could not delete the CiliumNode");
                    return (Outcome::Failed, None);
                }
            }
            invalid.deleting = true;
            self.with_slot(name, |s| {
                if let Some(i) = s.invalid.as_mut() {
                    i.deleting = true;
                }
            });
        }
        if invalid.deleting {
            // The instance from the object itself, else from its last version that parsed.
            let instance = if invalid.instance_id.is_empty() {
                last_instance.unwrap_or_default()
            } else {
                invalid.instance_id
            };
            return self.finalize(name, &invalid.node, &instance).await;
        }
        self.report_invalid(name, &invalid.node, &invalid.error, reported)
            .await
    }

    /// A CiliumNode that does not parse: say so on that object (once per message).
    async fn report_invalid(
        &self,
        name: &str,
        node: &NodeRef,
        error: &str,
        reported: Option<String>,
    ) -> (Outcome, Option<Priority>) {
        if reported.as_deref() == Some(error) {
            return (Outcome::Done, None);
        }
        let message = format!("{}: {error}", ProblemReason::InvalidSpec.as_str());
        let changes = ChangeSet {
            writes: vec![Write {
                subresource: Subresource::Status,
                patch: serde_json::json!({"status": {"ipam": {"operator-status": {"error": message}}}}),
                needs_resource_version: false,
            }],
        };
        self.inner
            .metrics
            .error(ProblemReason::InvalidSpec.as_str());
        let result = self.inner.sink.apply(node, &changes).await;
        self.inner
            .sink
            .event(
                node,
                NodeEvent::warning(ProblemReason::InvalidSpec.as_str(), &message),
            )
            .await;
        match result {
            Ok(_) | Err(SinkError::NotFound) => {
                self.with_slot(name, |s| s.invalid_reported = Some(error.to_string()));
                (Outcome::Done, None)
            }
            Err(_) => (Outcome::Failed, None),
        }
    }

    /// `--annotate-cilium-ignore`: make `ipam.cilium.io/ignore` say whether we serve the node,
    /// with a merge patch of that one annotation, only when it is wrong (no write otherwise).
    async fn mark_cilium_ignore(
        &self,
        node: &CiliumNode,
        serve: bool,
    ) -> SinkResult<Option<CiliumNode>> {
        if !self.inner.config.annotate_cilium_ignore {
            return Ok(None);
        }
        let current = node
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(CILIUM_IGNORE_ANNOTATION));
        let want = serve.then_some("true");
        if current.map(String::as_str) == want {
            return Ok(None);
        }
        self.inner
            .sink
            .set_annotation(&NodeRef::of(node), CILIUM_IGNORE_ANNOTATION, want)
            .await
    }

    /// The CiliumNode is being deleted. With its Node gone, give back our ENIs first; with the
    /// Node still there (deleted by hand), touch nothing.
    async fn finalize(
        &self,
        name: &str,
        r: &NodeRef,
        instance: &str,
    ) -> (Outcome, Option<Priority>) {
        let inner = &self.inner;
        let has_finalizer = r.finalizers.iter().any(|f| f == FINALIZER);
        let k8s_node_exists = if has_finalizer {
            match inner.sink.node_exists(name).await {
                Ok(exists) => exists,
                Err(e) => {
                    warn!(node = name, error = %e, "cannot tell whether the Node exists");
                    return (Outcome::Failed, None);
                }
            }
        } else {
            true
        };
        if has_finalizer && !k8s_node_exists && !instance.is_empty() {
            match release_instance_enis(&*inner.ec2, &inner.config.ipam.cluster_name, instance)
                .await
            {
                Ok(n) => {
                    inner
                        .metrics
                        .eni_deleted(metrics::DELETED_NODE_GONE, n as u64);
                    if n > 0 {
                        inner
                            .sink
                            .event(
                                r,
                                NodeEvent::normal(
                                    "EnisReleased",
                                    format!("detached and deleted {n} ENIs of {instance}"),
                                ),
                            )
                            .await;
                    }
                }
                Err(e) => {
                    inner.metrics.error(&e.code);
                    inner
                        .sink
                        .event(r, NodeEvent::warning("Ec2Error", e.to_string()))
                        .await;
                    return (Outcome::Failed, None);
                }
            }
        }
        if has_finalizer {
            match inner.sink.set_finalizer(r, false).await {
                Ok(_) | Err(SinkError::NotFound) => {}
                Err(SinkError::Conflict(fresh)) => {
                    if let Some(f) = fresh {
                        let stored = StoredNode::new(&f);
                        self.with_slot(name, |s| s.node = Some(stored));
                    }
                    return (Outcome::RetryAfter(Duration::from_millis(500)), None);
                }
                Err(e) => {
                    warn!(node = name, error = %e, "could not remove the finalizer");
                    return (Outcome::Failed, None);
                }
            }
        }
        inner.slots.lock().expect("slots").remove(name);
        if !instance.is_empty() {
            inner.cache.write().expect("cache").drop_instance(instance);
            inner.refresher.forget(instance);
        }
        (Outcome::Done, None)
    }
}
