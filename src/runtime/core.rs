//! The allocation core's event loop: takes [`NodeInput`]s, runs bounded passes from the
//! deficit queue, and starts the EC2 refreshes the [`RefreshSchedule`] asks for. No Kubernetes
//! client in here, so tests and the benchmark drive it with the simulator and a `MemorySink`.
//!
//! Who owns what: the loop alone owns the queue, the running tasks and the refresh schedule;
//! node slots ([`super::nodes`]) are changed by the loop on input and by a node's pass
//! ([`super::pass`]: snapshot -> lifecycle -> plan -> execute -> write -> report); the EC2
//! cache is written by the executor and the refresher. Errors become `operator-status` + a
//! Warning Event ([`super::events`]); the node backs off.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use rand::Rng;
use tokio::sync::mpsc;
use tokio::task::{Id, JoinError, JoinSet};
use tracing::{debug, warn};

use crate::ec2::{Ec2, Ec2Error};
use crate::ipam::{Demand, IpamConfig};

use super::cache::Ec2Cache;
use super::clock::now;
use super::events;
use super::executor::Executor;
use super::metrics::RuntimeMetrics;
use super::nodes::{self, Slots};
use super::pass::pass;
use super::queue::{DeficitQueue, Outcome, Priority};
use super::refresher::{Refresher, Scope};
use super::schedule::{InstanceRefresh, RefreshSchedule};
use super::sink::NodeSink;

pub use super::nodes::{InvalidNode, NodeInput};

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

/// What the passes share: the clients, the EC2 cache and the node slots.
pub(super) struct Inner<E, S> {
    pub ec2: Arc<E>,
    pub sink: Arc<S>,
    pub cache: Arc<RwLock<Ec2Cache>>,
    pub refresher: Refresher<E>,
    pub executor: Executor<E>,
    pub config: CoreConfig,
    pub slots: Mutex<Slots>,
    /// When each instance type's limits were last looked up.
    pub type_lookups: Mutex<HashMap<String, Instant>>,
    pub metrics: RuntimeMetrics,
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

enum Done {
    Pass(String, Outcome, Option<Priority>),
    Refreshed(Vec<String>),
    FullRefresh,
}

/// The event loop's own state.
#[derive(Default)]
struct Loop {
    queue: DeficitQueue<String>,
    tasks: JoinSet<Done>,
    /// What each task was for, so a panicking task is finished like a failed one instead of
    /// leaving its node marked in progress (or a refresh marked running) for good.
    running: BTreeMap<Id, Done>,
    schedule: RefreshSchedule,
    workers: usize,
}

impl Loop {
    fn spawn(&mut self, task: impl Future<Output = Done> + Send + 'static, on_panic: Done) {
        let id = self.tasks.spawn(task).id();
        self.running.insert(id, on_panic);
    }

    fn finished(&mut self, joined: Result<(Id, Done), JoinError>) -> Option<Done> {
        let done = joined
            .map(|(id, done)| {
                self.running.remove(&id);
                done
            })
            .or_else(|e| {
                warn!(error = %e, "a runtime task failed; finishing it as failed");
                self.running.remove(&e.id()).ok_or(e)
            });
        done.inspect_err(|e| warn!(error = %e, "an untracked runtime task failed"))
            .ok()
    }
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
        let slots = self.inner.slots.lock().expect("slots");
        slots.get(name).map(|s| s.demand.clone())
    }

    /// Run until `shutdown` completes (or the future is dropped: every worker is aborted with
    /// it, which is how a lost lease stops all mutating work at once).
    pub async fn run(
        self,
        mut inputs: mpsc::Receiver<NodeInput>,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), Ec2Error> {
        let (inner, config) = (&self.inner, &self.inner.config);
        // A new leader rebuilds its view before acting (§14).
        if config.preload_instance_types {
            inner.refresher.instance_types(&[]).await?;
        }
        inner.refresher.full().await?;
        inner.metrics.leader.set(1);
        inner.warm.send_replace(true);

        let mut l = Loop::default();
        let mut resync = interval(config.resync_interval).await;
        let mut rescan = interval(config.node_rescan_interval).await;
        let mut confirm_tick = interval(config.instance_refresh_spacing).await;
        tokio::pin!(shutdown);
        let mut inputs_open = true;
        loop {
            self.start_passes(&mut l);
            if let Some(refresh) = l.schedule.next_refresh() {
                self.start_refresh(&mut l, refresh);
            }
            inner.metrics.queue_depth.set(l.queue.depth() as i64);
            // Only wake for a due node when a worker is free to take it: with every worker
            // busy a due time in the past would make the select below return at once,
            // forever (a busy loop; under a paused clock, a livelock).
            let free = l.workers < config.workers.max(1);
            let next_due = if free { l.queue.next_due() } else { None };
            tokio::select! {
                () = &mut shutdown => break,
                input = inputs.recv(), if inputs_open => match input {
                    None => inputs_open = false,
                    Some(input) => self.accept(input, &mut l),
                },
                Some(joined) = l.tasks.join_next_with_id(), if !l.tasks.is_empty() => {
                    if let Some(done) = l.finished(joined) {
                        self.on_done(done, &mut l);
                    }
                }
                _ = resync.tick() => self.start_full(&mut l),
                // Re-plan every node on the cached view, between full EC2 refreshes.
                _ = rescan.tick() => self.requeue_all(&mut l.queue),
                _ = confirm_tick.tick() => l.schedule.confirm_tick(),
                () = sleep_until(next_due) => {}
            }
        }
        inner.metrics.leader.set(0);
        inner.warm.send_replace(false);
        Ok(())
    }

    /// Start every ready node we have a worker for.
    fn start_passes(&self, l: &mut Loop) {
        while l.workers < self.inner.config.workers.max(1) {
            let Some(name) = l.queue.pop(now()) else {
                break;
            };
            l.workers += 1;
            let core = self.clone();
            let on_panic = Done::Pass(name.clone(), Outcome::Failed, Some(self.priority(&name)));
            l.spawn(
                async move {
                    let (outcome, again) = pass(&core.inner, &name).await;
                    Done::Pass(name, outcome, again)
                },
                on_panic,
            );
        }
    }

    /// Describe the instances nodes wait for, and confirm our own changes.
    fn start_refresh(&self, l: &mut Loop, refresh: InstanceRefresh) {
        let InstanceRefresh { new, confirm } = refresh;
        let core = self.clone();
        let on_panic = Done::Refreshed(new.clone());
        let task = async move {
            let refresher = &core.inner.refresher;
            if !new.is_empty()
                && let Err(e) = refresher.instances(&new, false).await
            {
                warn!(error = %e, "per-instance refresh failed");
            }
            if !confirm.is_empty()
                && let Err(e) = refresher.instances(&confirm, true).await
            {
                debug!(error = %e, "confirmation refresh failed");
            }
            Done::Refreshed(new)
        };
        l.spawn(task, on_panic);
    }

    fn start_full(&self, l: &mut Loop) {
        if !l.schedule.start_full() {
            return;
        }
        let core = self.clone();
        let task = async move {
            if let Err(e) = core.inner.refresher.full().await {
                warn!(error = %e, "full EC2 refresh failed; mutations blocked");
                events::count_ec2_error(&core.inner.metrics, &e);
            }
            Done::FullRefresh
        };
        l.spawn(task, Done::FullRefresh);
    }

    fn on_done(&self, done: Done, l: &mut Loop) {
        match done {
            Done::Pass(name, outcome, again) => {
                l.workers -= 1;
                l.queue
                    .finish(&name, outcome, now(), rand::rng().random::<f64>());
                if outcome == Outcome::Done
                    && again.is_some()
                    && let Some(i) = self.instance_of(&name)
                {
                    l.schedule.changed(i);
                }
                if let Some(p) = again {
                    l.queue.push(name, p);
                }
                if l.queue.depth() == 0 && l.workers == 0 {
                    self.publish_totals();
                }
            }
            Done::Refreshed(ids) => {
                for name in l.schedule.refreshed(ids) {
                    let p = self.priority(&name);
                    l.queue.push(name, p);
                }
            }
            Done::FullRefresh => {
                l.schedule.full_done();
                // Resync pass: every node, neediest first.
                self.requeue_all(&mut l.queue);
                self.publish_totals();
            }
        }
    }

    fn accept(&self, input: NodeInput, l: &mut Loop) {
        let a = nodes::accept(&self.inner.slots, input, &self.inner.cache);
        if let Some(name) = a.dequeue {
            l.queue.remove(&name);
        }
        if let Some(instance) = a.forget {
            self.inner.forget_instance(&instance);
        }
        if let Some((instance, name)) = a.wait {
            l.schedule.wait(instance, name);
        }
        if let Some((name, p)) = a.queue {
            l.queue.push(name, p);
        }
    }

    /// Queue every known node at its current severity.
    fn requeue_all(&self, queue: &mut DeficitQueue<String>) {
        let slots = self.inner.slots.lock().expect("slots");
        for (name, slot) in slots.iter() {
            queue.push(name.clone(), nodes::priority_of(slot));
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
            .map_or(Priority::Routine, nodes::priority_of)
    }

    fn publish_totals(&self) {
        let t = nodes::totals(&self.inner.slots.lock().expect("slots"));
        let m = &self.inner.metrics;
        m.ips_available.set(t.available);
        m.ips_used.set(t.used);
        m.ips_needed.set(t.needed);
        m.publish_nodes(
            t.per_node
                .iter()
                .map(|(n, a, u, d)| (n.as_str(), *a, *u, *d)),
        );
        for state in nodes::STATES {
            let n = t.states.get(state).copied().unwrap_or(0);
            m.nodes
                .get_or_create(&vec![("state", state.to_string())])
                .set(n);
        }
        let cache = self.inner.cache.read().expect("cache");
        m.enis_managed.set(cache.totals().0 as i64);
        m.publish_subnets(cache.subnets.values().map(|s| {
            let (id, az) = (s.id.as_str(), s.availability_zone.as_str());
            (id, az, s.available_addresses)
        }));
    }
}

/// A tokio interval whose first (immediate) tick is spent.
async fn interval(period: Duration) -> tokio::time::Interval {
    let mut i = tokio::time::interval(period);
    i.tick().await;
    i
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}
