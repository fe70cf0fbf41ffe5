//! Two operator instances electing a leader through a Lease, as the real binary runs with
//! `--leader-election` (src/main.rs): each replica runs `Elector::run(work)`, where `work` is
//! everything a leader does (the core with its watches, the ENI GC). A standby only takes part
//! in the election: no watches, no writes, no EC2 calls. A leader whose renewals fail (its API
//! server connection breaks) or stall gives up at the renew deadline by dropping `work`, which
//! aborts every call it has in flight; its process then exits non-zero and Kubernetes restarts
//! it (as a standby, with empty memory). The other replica takes the lease once it has seen the
//! record unchanged for a lease duration, and starts with empty memory on the same EC2 and API
//! state.
//!
//! The invariant observed here: no two leaders writing at once. Every mutating EC2 call and
//! every API write of an instance is checked, when it is issued, against the Lease: issued while
//! the Lease names another holder is a violation. client-go's election (and ours,
//! `k8s::leader`) guarantees this only because the renew deadline (10 s) is shorter than
//! the lease duration (15 s): the old leader stops issuing calls at its renew deadline, at
//! least 5 s before anyone may take over. Calls it issued before and that are still in flight
//! when the lease moves are the stated grace (the 5 s margin covers them: the simulator answers
//! within 0.4 s); they are not counted.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use eni_operator::ec2::gate::{Gate, GateConfig, GateLayer};
use eni_operator::ec2::layer::{Layered, MutationGuard};
use eni_operator::ec2::{Operation, Result};
use eni_operator::event_loop::core::{Core, CoreConfig, NodeInput};
use eni_operator::k8s::fence::{Fence, Fenced, FencedSink};
use eni_operator::k8s::leader::{Elector, LeaderConfig, LeaseError, LeaseLock, LeaseRecord};
use eni_operator::k8s::sink::SinkResult;
use eni_operator::k8s::sink_layer::{LayeredSink, Write, WriteGuard};
use eni_operator::reconcile::gc;
use eni_operator::reconcile::metrics::RuntimeMetrics;
use eni_operator::reconcile::status::ThrottledPasses;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use testkit::lease::{MemoryLease, MemoryLeaseClient};
use testkit::sim::Simulator;
use testkit::sink::MemorySink;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::task::AbortOnDropHandle;

use crate::probes::{Probes, Withdrawal};
use crate::world::{CLUSTER, GC_INTERVAL, World};

/// The EC2 client of one process as the simulation runs it: the gate, the pause point, the
/// operator's fence (§14.2), and the observer at the simulator.
type SimEc2 = Gate<Observed<Fenced<Observed<Layered<Simulator, Withdrawal>>>>>;
/// Its sink: pause point, fence, observer.
type SimSink = ObservedSink<FencedSink<ObservedSink<Arc<MemorySink>>>>;
/// The core as the simulation runs it: every EC2 call and API write observed.
pub type SimCore = Core<SimEc2, SimSink>;

/// A Lease (15 s, `LeaderConfig::new`): a call issued this long after the start of its
/// process's last successful Lease write is issued by a process whose lease had expired.
const LEASE_DURATION: std::time::Duration = std::time::Duration::from_secs(15);
/// Per mille per simulated second, while the faults last: the leader's process is frozen at
/// its next call, for longer than the lease.
const P_FREEZE: u32 = 2;

/// Per mille per simulated second, while the faults last: the leader's Lease connection breaks.
const P_LEASE_BREAK: u32 = 3;
/// Runs with two instances electing a leader (the others run one operator without election).
const P_TWO_INSTANCES: f64 = 0.5;

/// Watches one instance's calls against the Lease.
#[derive(Clone)]
pub struct Observer {
    identity: String,
    /// `None`: the instance runs without election (checked by nothing).
    lease: Option<Arc<MemoryLease>>,
    breaches: Arc<Mutex<Vec<String>>>,
    start: Instant,
    /// When this process's last successful Lease write was sent (its lease runs from then).
    renewed_from: Arc<Mutex<Option<Instant>>>,
    /// Calls issued after this process's lease had expired.
    expired: Arc<Mutex<Vec<String>>>,
    /// This process's pauses (SIGSTOP, a cgroup freeze, a VM pause).
    freeze: Freeze,
}

impl Observer {
    pub fn alone() -> Self {
        Self {
            identity: "operator".into(),
            lease: None,
            breaches: Arc::default(),
            start: Instant::now(),
            renewed_from: Arc::default(),
            expired: Arc::default(),
            freeze: Freeze::default(),
        }
    }

    fn issued(&self, what: &str) {
        let Some(lease) = &self.lease else { return };
        let renewed = *self.renewed_from.lock().expect("renewed");
        if renewed.is_none_or(|r| Instant::now() >= r + LEASE_DURATION) {
            let t = Instant::now().duration_since(self.start).as_secs();
            let ago = renewed.map(|r| Instant::now().duration_since(r));
            self.expired.lock().expect("expired").push(format!(
                "{} issued {what} at t={t}s, its last renewal sent {ago:?} before (lease {LEASE_DURATION:?})",
                self.identity
            ));
        }
        let holder = lease.holder();
        if holder.as_deref() != Some(self.identity.as_str()) {
            let t = Instant::now().duration_since(self.start).as_secs();
            self.breaches.lock().expect("breaches").push(format!(
                "{} issued {what} at t={t}s while the Lease names {holder:?}",
                self.identity
            ));
        }
    }
}

/// An EC2 client that tells its [`Observer`] of every mutating call it issues (`Role::Issue`,
/// right at the simulator), or that holds each call while its process is frozen
/// (`Role::Pause`, before the operator's fence check: a freeze can fall anywhere before it).
pub type Observed<E> = Layered<E, Watch>;

/// The guard of an [`Observed`] client: its observer, and what it does before a call.
pub struct Watch {
    pub observer: Observer,
    pub role: Role,
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Pause,
    Issue,
}

impl Observer {
    async fn before(&self, role: Role, what: &str) {
        match role {
            Role::Pause => self.freeze.thawed().await,
            Role::Issue => self.issued(what),
        }
    }
}

impl MutationGuard for Watch {
    async fn before(&self, operation: Operation) -> Result<()> {
        self.observer.before(self.role, operation.name()).await;
        Ok(())
    }
}

/// The API server as one instance sees it: every write told to its [`Observer`].
pub type ObservedSink<S> = LayeredSink<S, Watch>;

impl WriteGuard for Watch {
    async fn before(&self, write: Write<'_>) -> SinkResult<()> {
        let what = match write {
            Write::Patch(n) => format!("a CiliumNode write of {}", n.name),
            Write::Event(n) => format!("an Event on {}", n.name),
            Write::Finalizer(n) => format!("a finalizer write of {}", n.name),
            Write::Annotation(n) => format!("an annotation write of {}", n.name),
            Write::Delete(name) => format!("a CiliumNode delete of {name}"),
        };
        self.observer.before(self.role, &what).await;
        Ok(())
    }
}

/// What one operator process runs: the core and the ENI GC, on a gate of its own (the
/// throttling buckets that matter are the account's, in the simulator).
pub struct Parts {
    pub core: SimCore,
    pub tx: mpsc::Sender<NodeInput>,
    pub run: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>,
}

#[allow(clippy::too_many_arguments)]
pub fn build(
    sim: &Simulator,
    sink: &Arc<MemorySink>,
    cfg: &CoreConfig,
    subnets: Vec<String>,
    observer: Observer,
    fence: Fence,
    jitter: u64,
    probes: &Probes,
) -> Parts {
    let withdrawal = Withdrawal {
        sink: sink.clone(),
        sim: sim.clone(),
        probes: probes.clone(),
    };
    let issue = Observed::new(
        Layered::new(sim.clone(), withdrawal),
        Watch {
            observer: observer.clone(),
            role: Role::Issue,
        },
    );
    let ec2 = Observed::new(
        Fenced::new(issue, fence.clone()),
        Watch {
            observer: observer.clone(),
            role: Role::Pause,
        },
    );
    let gate_config = GateConfig {
        jitter_seed: Some(jitter),
        ..GateConfig::aws_defaults()
    };
    let layer = GateLayer::new(gate_config).reporting_throttles_to(ThrottledPasses);
    let gate = Arc::new(Gate::new(ec2, layer));
    let weak = Arc::downgrade(&gate);
    probes.gates.watch(Arc::new(move || {
        weak.upgrade().map(|g| crate::tenant_spell::rates(&g))
    }));
    let metrics = RuntimeMetrics::default();
    let issue = ObservedSink::new(
        sink.clone(),
        Watch {
            observer: observer.clone(),
            role: Role::Issue,
        },
    );
    let sink = Arc::new(ObservedSink::new(
        FencedSink::new(issue, fence),
        Watch {
            observer,
            role: Role::Pause,
        },
    ));
    let cfg = CoreConfig {
        jitter_seed: Some(!jitter),
        ..cfg.clone()
    };
    let cache = cfg.ec2_cache();
    probes.watch_cache(&cache);
    // The GC lists the managed VPC(s), learned as in production (no --vpc-id).
    let vpcs = {
        let cache = cache.clone();
        move || cache.read().expect("cache").managed_vpcs()
    };
    let core = Core::new(gate.clone(), sink, cfg, metrics.clone(), cache);
    let (tx, rx) = mpsc::channel(1 << 14);
    let run = {
        let core = core.clone();
        Box::pin(async move {
            // `biased`: tokio picks unbiased branches at random, which a seed cannot replay.
            tokio::select! {
                biased;
                r = core.run(rx, std::future::pending()) => {
                    if let Err(e) = r {
                        tracing::warn!(error = %e, "core ended");
                    }
                }
                () = gc::run_loop(gate, gc::EniGc::new(CLUSTER, 50).with_metrics(metrics), subnets, GC_INTERVAL, vpcs) => {}
            }
        })
    };
    Parts { core, tx, run }
}

/// A Lease client whose calls can stall (never answer), as when the API server accepts the
/// connection but does not respond; partitions (calls fail at once) are `MemoryLease`'s own.
#[derive(Clone)]
struct Stallable {
    inner: MemoryLeaseClient,
    stalled: Arc<AtomicBool>,
    /// When the last successful write was sent (the observer's [`Observer::renewed_from`]).
    renewed_from: Arc<Mutex<Option<Instant>>>,
}

impl Stallable {
    fn renewed(&self, sent: Instant, ok: bool) {
        if ok {
            *self.renewed_from.lock().expect("renewed") = Some(sent);
        }
    }
}

impl Stallable {
    async fn gate(&self) {
        if self.stalled.load(Ordering::Relaxed) {
            std::future::pending::<()>().await;
        }
    }
}

impl LeaseLock for Stallable {
    async fn get(&self) -> std::result::Result<Option<(LeaseRecord, String)>, LeaseError> {
        self.gate().await;
        self.inner.get().await
    }
    async fn create(&self, record: &LeaseRecord) -> std::result::Result<(), LeaseError> {
        let sent = Instant::now();
        self.gate().await;
        let r = self.inner.create(record).await;
        self.renewed(sent, r.is_ok());
        r
    }
    async fn update(
        &self,
        record: &LeaseRecord,
        version: &str,
    ) -> std::result::Result<(), LeaseError> {
        let sent = Instant::now();
        self.gate().await;
        let r = self.inner.update(record, version).await;
        self.renewed(sent, r.is_ok());
        r
    }
}

/// What a leading instance publishes for the world: its core (for the checks) and its input
/// channel (for its watches).
type Published = Arc<Mutex<Option<(SimCore, mpsc::Sender<NodeInput>)>>>;

/// One replica (a pod): its process, restarted by Kubernetes when it exits.
struct Replica {
    name: &'static str,
    /// Incarnations so far (each process has its own identity).
    generation: u32,
    identity: String,
    process: Option<AbortOnDropHandle<()>>,
    stalled: Arc<AtomicBool>,
    published: Published,
    /// Its watches are connected (the listing was delivered).
    connected: bool,
    /// The process's pauses.
    freeze: Freeze,
    restart_at: Option<u64>,
}

pub struct Leadership {
    rng: StdRng,
    lease: Arc<MemoryLease>,
    replicas: Vec<Replica>,
    breaches: Arc<Mutex<Vec<String>>>,
    /// Calls issued by a process whose lease had expired (every incarnation's).
    expired: Arc<Mutex<Vec<String>>>,
    start: Instant,
}

impl Leadership {
    /// Whether this seed's run has two electing instances (drawn from a stream of its own).
    pub fn draw(seed: u64) -> Option<Self> {
        let mut rng = StdRng::seed_from_u64(seed ^ 0x1ea0_e500_0000_0002);
        rng.random_bool(P_TWO_INSTANCES).then(|| Self {
            rng,
            lease: Arc::new(MemoryLease::new()),
            replicas: ["op-a", "op-b"]
                .into_iter()
                .map(|name| Replica {
                    name,
                    generation: 0,
                    identity: String::new(),
                    process: None,
                    stalled: Arc::default(),
                    published: Arc::default(),
                    connected: false,
                    freeze: Freeze::default(),
                    restart_at: Some(0),
                })
                .collect(),
            breaches: Arc::default(),
            expired: Arc::default(),
            start: Instant::now(),
        })
    }

    /// The cores of the instances leading now.
    pub fn cores(&self) -> Vec<SimCore> {
        self.replicas
            .iter()
            .filter_map(|r| {
                r.published
                    .lock()
                    .expect("published")
                    .as_ref()
                    .map(|p| p.0.clone())
            })
            .collect()
    }

    pub fn breaches(&self) -> Vec<String> {
        self.breaches.lock().expect("breaches").clone()
    }

    fn leader(&self) -> Option<usize> {
        let holder = self.lease.holder()?;
        self.replicas.iter().position(|r| r.identity == holder)
    }
}

/// Start one replica's process: elect, and lead until the lease is lost.
fn start(w: &mut World, i: usize, t: u64) {
    let subnets = w.subnet_ids();
    let l = w.leadership.as_mut().expect("leadership");
    let r = &mut l.replicas[i];
    r.generation += 1;
    r.identity = format!("{}#{}", r.name, r.generation);
    let generation = r.generation;
    r.stalled = Arc::default();
    r.published = Arc::default();
    r.connected = false;
    r.freeze = Freeze::default();
    r.restart_at = None;
    l.lease.partition(&r.identity, false);
    let renewed_from: Arc<Mutex<Option<Instant>>> = Arc::default();
    let observer = Observer {
        identity: r.identity.clone(),
        lease: Some(l.lease.clone()),
        breaches: l.breaches.clone(),
        start: l.start,
        renewed_from: renewed_from.clone(),
        expired: l.expired.clone(),
        freeze: r.freeze.clone(),
    };
    let lock = Stallable {
        inner: MemoryLeaseClient {
            lease: l.lease.clone(),
            identity: r.identity.clone(),
        },
        stalled: r.stalled.clone(),
        renewed_from,
    };
    let freeze = r.freeze.clone();
    let published = r.published.clone();
    let identity = r.identity.clone();
    let (sim, sink, cfg) = (w.sim.clone(), w.sink.clone(), w.core_config());
    let probes = w.probes.clone();
    let jitter = w.jitter_seed(((i as u64 + 1) << 32) | u64::from(generation));
    let process = async move {
        let fence = Fence::closed();
        let mut elector = Elector::new(lock, LeaderConfig::new(identity)).with_fence(fence.clone());
        let work = async {
            let parts = build(&sim, &sink, &cfg, subnets, observer, fence, jitter, &probes);
            *published.lock().expect("published") = Some((parts.core, parts.tx));
            parts.run.await;
        };
        // Lost: the work (and every call in it) is dropped; the process exits non-zero.
        let _ = elector.run(work).await;
        published.lock().expect("published").take();
    };
    let l = w.leadership.as_mut().expect("leadership");
    // A frozen process's own future (the elector, the core's loop, its watches) is not polled.
    let process = freeze.wrap(process);
    l.replicas[i].process = Some(AbortOnDropHandle::new(tokio::spawn(process)));
    let id = l.replicas[i].identity.clone();
    w.log(t, format!("replica {id} starts (standby until elected)"));
}

/// One simulated second: restart exited replicas, connect the watches of a new leader.
pub fn tick(w: &mut World, t: u64) {
    let Some(l) = w.leadership.as_mut() else {
        return;
    };
    let mut due = Vec::new();
    let mut lines = Vec::new();
    for (i, r) in l.replicas.iter_mut().enumerate() {
        if r.process.as_ref().is_some_and(|p| p.is_finished()) {
            r.process = None;
            // Kubernetes restarts the container after its crash-loop backoff.
            let at = t + l.rng.random_range(5..=30);
            r.restart_at = Some(at);
            lines.push(format!(
                "replica {} lost the lease and exits; restart at t={at}s",
                r.identity
            ));
        }
        if r.restart_at.is_some_and(|at| at <= t) {
            due.push(i);
        }
    }
    let now = Instant::now();
    for r in &l.replicas {
        if let Some(since) = r.freeze.thaw_due(now) {
            lines.push(format!(
                "replica {} thaws (frozen {}s)",
                r.identity,
                now.duration_since(since).as_secs()
            ));
        }
    }
    let mut connect = Vec::new();
    for r in &mut l.replicas {
        if r.connected {
            continue;
        }
        if let Some((core, tx)) = r.published.lock().expect("published").as_ref() {
            r.connected = true;
            connect.push((r.identity.clone(), core.clone(), tx.clone()));
        }
    }
    for line in lines {
        w.log(t, line);
    }
    for i in due {
        start(w, i, t);
    }
    if !connect.is_empty() {
        let listing = crate::api::listing(w);
        for (id, core, tx) in connect {
            w.api.connect_core(Some(core), tx, &listing);
            w.log(t, format!("replica {id} leads; its watches list"));
        }
        crate::cilium::tell(w);
    }
}

/// The seed's leadership events of one second (faults phase only): the leader's connection to
/// the Lease breaks (its renewals fail) or stalls (they never answer).
pub fn events(w: &mut World, t: u64) {
    let Some(l) = w.leadership.as_mut() else {
        return;
    };
    if l.rng.random_range(0..1000) < P_FREEZE
        && let Some(i) = l.leader()
        && l.replicas[i].process.is_some()
    {
        // Longer than the lease: the other replica takes it meanwhile.
        let secs = l.rng.random_range(20..=45);
        let r = &l.replicas[i];
        r.freeze.arm(std::time::Duration::from_secs(secs));
        let line = format!(
            "replica {} will freeze for {secs}s at its next call",
            r.identity
        );
        w.log(t, line);
        return;
    }
    let Some(l) = w.leadership.as_mut() else {
        return;
    };
    if l.rng.random_range(0..1000) >= P_LEASE_BREAK {
        return;
    }
    let Some(i) = l.leader() else { return };
    let stall = l.rng.random_bool(0.5);
    let r = &l.replicas[i];
    if r.process.is_none() {
        return;
    }
    if stall {
        r.stalled.store(true, Ordering::Relaxed);
    } else {
        l.lease.partition(&r.identity, true);
    }
    let line = format!(
        "lease renewals of {} {}",
        r.identity,
        if stall { "stall" } else { "fail" }
    );
    w.log(t, line);
}

/// The leader's process is killed (no release of the Lease: the other waits it out).
pub fn crash(w: &mut World, t: u64) {
    let Some(l) = w.leadership.as_mut() else {
        return;
    };
    let Some(i) = l.leader() else { return };
    let r = &mut l.replicas[i];
    if r.process.take().is_none() {
        return;
    }
    r.published.lock().expect("published").take();
    let at = t + l.rng.random_range(5..=30);
    r.restart_at = Some(at);
    let line = format!("replica {} crashed; restart at t={at}s", r.identity);
    w.log(t, line);
}

/// No two leaders writing at once.
pub fn check(w: &World) -> std::result::Result<(), crate::check::Broken> {
    let Some(l) = &w.leadership else {
        return Ok(());
    };
    if let Some(e) = l.expired.lock().expect("expired").first() {
        return Err((
            "no mutating call from a process whose lease had expired",
            e.clone(),
        ));
    }
    match l.breaches().first() {
        None => Ok(()),
        Some(b) => Err(("no two leaders writing at once", b.clone())),
    }
}

/// A process's pauses (SIGSTOP, a cgroup freeze, a VM pause): armed by the harness, it begins
/// at the process's next mutating call (so calls are in flight), holds every call of the
/// process at its pause point and the process's own future (elector, core loop, watches), and
/// ends when the harness thaws it. On thaw the held calls are woken before the process's
/// future, the order that hurts: a task may send what it planned before the elector runs.
#[derive(Clone)]
pub struct Freeze(Arc<FreezeState>);

struct FreezeState {
    frozen: tokio::sync::watch::Sender<bool>,
    armed: Mutex<Option<std::time::Duration>>,
    /// Frozen since, and for how long.
    span: Mutex<Option<(Instant, std::time::Duration)>>,
    process: Mutex<Option<std::task::Waker>>,
}

impl Default for Freeze {
    fn default() -> Self {
        Self(Arc::new(FreezeState {
            frozen: tokio::sync::watch::Sender::new(false),
            armed: Mutex::default(),
            span: Mutex::default(),
            process: Mutex::default(),
        }))
    }
}

impl Freeze {
    fn arm(&self, span: std::time::Duration) {
        *self.0.armed.lock().expect("armed") = Some(span);
    }

    /// A call's pause point: freeze here if armed; wait while frozen.
    async fn thawed(&self) {
        if let Some(span) = self.0.armed.lock().expect("armed").take() {
            *self.0.span.lock().expect("span") = Some((Instant::now(), span));
            self.0.frozen.send_replace(true);
        }
        let mut rx = self.0.frozen.subscribe();
        let _ = rx.wait_for(|frozen| !*frozen).await;
    }

    /// Thaw if the freeze has lasted its span; returns when it began.
    fn thaw_due(&self, now: Instant) -> Option<Instant> {
        let mut span = self.0.span.lock().expect("span");
        let (since, len) = (*span)?;
        if now < since + len {
            return None;
        }
        *span = None;
        // The held calls first (woken in order), then the process's own future.
        self.0.frozen.send_replace(false);
        if let Some(w) = self.0.process.lock().expect("waker").take() {
            w.wake();
        }
        Some(since)
    }

    fn wrap<F: std::future::Future>(&self, inner: F) -> Frozen<F> {
        Frozen {
            inner: Box::pin(inner),
            freeze: self.clone(),
        }
    }
}

/// A process's future that is not polled while its [`Freeze`] holds.
struct Frozen<F> {
    inner: std::pin::Pin<Box<F>>,
    freeze: Freeze,
}

impl<F: std::future::Future> std::future::Future for Frozen<F> {
    type Output = F::Output;
    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<F::Output> {
        if *self.freeze.0.frozen.borrow() {
            *self.freeze.0.process.lock().expect("waker") = Some(cx.waker().clone());
            return std::task::Poll::Pending;
        }
        self.inner.as_mut().poll(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_call_issued_while_the_lease_names_another_holder_is_a_breach() {
        let lease = Arc::new(MemoryLease::new());
        let breaches: Arc<Mutex<Vec<String>>> = Arc::default();
        let renewed_from: Arc<Mutex<Option<Instant>>> = Arc::new(Mutex::new(Some(Instant::now())));
        let observer = |identity: &str| Observer {
            identity: identity.into(),
            lease: Some(lease.clone()),
            breaches: breaches.clone(),
            start: Instant::now(),
            renewed_from: renewed_from.clone(),
            expired: Arc::default(),
            freeze: Freeze::default(),
        };
        let mut a = Elector::new(
            MemoryLeaseClient {
                lease: lease.clone(),
                identity: "a".into(),
            },
            LeaderConfig::new("a"),
        );
        assert!(a.try_acquire_or_renew().await.unwrap());
        observer("a").issued("CreateNetworkInterface");
        assert!(breaches.lock().unwrap().is_empty(), "the holder may call");
        observer("b").issued("AttachNetworkInterface");
        let seen = breaches.lock().unwrap().clone();
        assert_eq!(seen.len(), 1, "{seen:?}");
        assert!(
            seen[0].contains("b issued AttachNetworkInterface"),
            "{seen:?}"
        );
        // Without election nothing is checked.
        let alone = Observer::alone();
        alone.issued("DeleteNetworkInterface");
        assert!(alone.breaches.lock().unwrap().is_empty());
    }
}
