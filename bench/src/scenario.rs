//! The benchmark scenarios: the real [`Core`] (queue, workers, cache, executor) behind the
//! [`Gate`] in front of the [`Simulator`] (AWS's throttling buckets, per-call latency), a
//! [`MemorySink`] as the API server and in-process classic agents. Everything runs on tokio
//! time, so under a paused runtime the rate limits and latencies hold in simulated time while
//! the run takes only the CPU it needs.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::task::AbortOnDropHandle;

use eni_operator::cache::Ec2Cache;
use eni_operator::cache::refresher::{Refresher, Scope};
use eni_operator::crd::{CiliumNode, ReleaseState};
use eni_operator::ec2::gate::{Gate, GateConfig, GateLayer};
use eni_operator::ec2::{Bucket, Operation, Tags};
use eni_operator::event_loop::core::{Core, CoreConfig, NodeInput};
use eni_operator::ipam::IpamConfig;
use eni_operator::reconcile::metrics::RuntimeMetrics;
use eni_operator::reconcile::status::ThrottledPasses;
use testkit::agent::step_pods;
use testkit::sim::{SimStats, Simulator, default_instance_types};
use testkit::sink::{MemorySink, WriteCounts};

use super::heap::{self, HeapMeter, HeapShares};
use super::{Row, SharedRow, enis_needed, lower_bound, per_bucket};

const CLUSTER: &str = "bench";

/// How the gate meters calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GateMode {
    /// Per-action buckets at AWS's full published rates (nobody else in the account).
    AwsFull,
    /// As the Cilium operator ships: one bucket for every call, 4 qps, burst 20.
    CiliumLike,
    /// The operator's defaults: per-action buckets at 80 % of AWS's rates.
    Defaults,
}

impl GateMode {
    pub fn config(self) -> GateConfig {
        match self {
            GateMode::AwsFull => GateConfig {
                rate_fraction: 1.0,
                ..GateConfig::aws_defaults()
            },
            GateMode::CiliumLike => GateConfig::cilium_like(),
            GateMode::Defaults => GateConfig::aws_defaults(),
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            GateMode::AwsFull => "AWS buckets",
            GateMode::CiliumLike => "Cilium gate (imitation)",
            GateMode::Defaults => "default gate",
        }
    }
}

/// Knobs shared by every scenario.
#[derive(Clone, Debug)]
pub struct Settings {
    pub instance_type: String,
    pub first_interface_index: i64,
    /// Addresses every node needs in the burst (and before the scale-down).
    pub ips_per_node: i64,
    pub mutating_latency: Duration,
    pub describe_latency: Duration,
    pub workers: usize,
    pub release_delay: Duration,
    /// The core re-plans every node this often (a release starts on a re-plan).
    pub node_rescan_interval: Duration,
    /// Simulated time after which a scenario gives up waiting.
    pub limit: Duration,
    pub seed: u64,
    /// The process's heap counters (the benchmark binary's allocator); `None`: not measured.
    pub heap: Option<HeapMeter>,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            // 4 ENIs of 15 addresses; with first-interface-index 1 the primary ENI is not used
            // for pods, so 30 addresses take new ENIs in both modes.
            instance_type: "m5.xlarge".into(),
            first_interface_index: 1,
            ips_per_node: 30,
            mutating_latency: Duration::from_millis(300),
            describe_latency: Duration::from_millis(150),
            workers: CoreConfig::default().workers,
            release_delay: IpamConfig::default().release_delay,
            node_rescan_interval: CoreConfig::default().node_rescan_interval,
            limit: Duration::from_secs(6 * 3600),
            seed: 7,
            heap: None,
        }
    }
}

/// The burst's flags both benchmark binaries take (`make bench`, `make bench-process`).
#[derive(clap::Args, Clone, Debug)]
pub struct BurstFlags {
    #[arg(long, default_value_t = 300)]
    pub mutating_latency_ms: u64,
    #[arg(long, default_value_t = 150)]
    pub describe_latency_ms: u64,
    /// Addresses each node needs in the burst (its `min-allocate`).
    #[arg(long, default_value_t = 30)]
    pub ips_per_node: i64,
}

impl BurstFlags {
    /// The default settings with these flags.
    pub fn settings(&self) -> Settings {
        Settings {
            ips_per_node: self.ips_per_node,
            mutating_latency: Duration::from_millis(self.mutating_latency_ms),
            describe_latency: Duration::from_millis(self.describe_latency_ms),
            ..Settings::default()
        }
    }
}

impl Settings {
    /// Start a new heap peak (a scenario's own), where the heap is measured.
    fn reset_heap_peak(&self) {
        if let Some(h) = self.heap {
            (h.reset_peak)();
        }
    }
}

/// The result of one scenario run.
#[derive(Clone, Debug)]
pub struct Outcome {
    pub row: Row,
    /// (simulated seconds, nodes whose demand is not met yet).
    pub waiting: Vec<(f64, f64)>,
    pub all_met: bool,
    pub enis_created: u64,
    /// Free-form figures for the report.
    pub notes: Vec<String>,
    /// The heap at the end, by part (where the heap is measured).
    pub heap: Option<HeapShares>,
    /// A quiet window after the demand was met (where measured).
    pub quiet: Option<Quiet>,
}

/// What the operator did in a window where nothing changed (steady state should cost nothing).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Quiet {
    pub seconds: u64,
    /// Node resyncs the window included.
    pub resyncs: u64,
    pub writes: u64,
    pub mutating_calls: u64,
}

type BenchCore = Core<Gate<Simulator>, MemorySink>;

/// The real core against the simulator and the in-memory API server (also `make demo`'s
/// in-memory back-end).
pub(crate) struct World {
    pub(crate) sim: Simulator,
    pub(crate) gate: Arc<Gate<Simulator>>,
    pub(crate) sink: Arc<MemorySink>,
    core: BenchCore,
    /// The core's metrics and EC2 view: the benchmark reads them as an operator's exporter
    /// and refresher do.
    metrics: RuntimeMetrics,
    cache: Arc<RwLock<Ec2Cache>>,
    heap: Option<HeapMeter>,
    tx: mpsc::Sender<NodeInput>,
    /// The core's run task, stopped when the scenario's world goes.
    task: AbortOnDropHandle<eni_operator::ec2::Result<()>>,
    subnet: String,
    vpc: String,
    sg: String,
}

fn world(s: &Settings, mode: GateMode, prefix: bool, release: bool) -> World {
    world_shared(s, mode, prefix, release, 0.0)
}

/// A world whose EC2 account has another tenant using `other_share` of every bucket.
pub(crate) fn world_shared(
    s: &Settings,
    mode: GateMode,
    prefix: bool,
    release: bool,
    other_share: f64,
) -> World {
    let sim = Simulator::new();
    sim.set_seed(s.seed);
    sim.set_other_tenant_share(other_share);
    for op in Operation::ALL {
        let latency = if op.is_mutating() {
            s.mutating_latency
        } else {
            s.describe_latency
        };
        sim.set_latency(op, latency);
    }
    // Room for 5,000 nodes x 30 addresses; /28-aligned blocks for prefixes.
    let cidr = "10.0.0.0/13".parse().expect("cidr");
    let vpc = sim.add_vpc(cidr, &[]);
    let subnet = sim.add_subnet(&vpc, "zone-a", cidr, Tags::new());
    let sg = sim.add_security_group(&vpc, Tags::new());
    sim.add_route_table(&vpc, true, &[]);
    let layer = GateLayer::new(mode.config()).reporting_throttles_to(ThrottledPasses);
    let gate = Arc::new(Gate::new(sim.clone(), layer));
    // Real clusters run Cilium's own CRD, whose API server prunes what it does not list: the
    // write counts must include what that costs.
    let sink = Arc::new(MemorySink::with_ciliums_crd());
    let cfg = CoreConfig {
        workers: s.workers,
        ipam: IpamConfig {
            cluster_name: CLUSTER.into(),
            prefix_delegation: prefix,
            release_excess_ips: release,
            release_delay: s.release_delay,
            ..IpamConfig::default()
        },
        node_rescan_interval: s.node_rescan_interval,
        ..CoreConfig::default()
    };
    let metrics = RuntimeMetrics::default();
    let cache = cfg.ec2_cache();
    let core = Core::new(
        gate.clone(),
        sink.clone(),
        cfg,
        metrics.clone(),
        cache.clone(),
    );
    let (tx, rx) = mpsc::channel(1 << 16);
    let task = AbortOnDropHandle::new(tokio::spawn(core.clone().run(rx, std::future::pending())));
    World {
        sim,
        gate,
        sink,
        core,
        metrics,
        cache,
        heap: s.heap,
        tx,
        task,
        subnet,
        vpc,
        sg,
    }
}

impl World {
    /// Launch an instance and create its CiliumNode as a classic agent does at start.
    pub(crate) fn join(&self, s: &Settings, name: &str, min_allocate: i64) {
        let inst = self.sim.run_instance(
            &s.instance_type,
            &self.subnet,
            std::slice::from_ref(&self.sg),
        );
        let mut n = CiliumNode::new(name, Default::default());
        n.spec.instance_id = inst.id;
        n.spec.eni.instance_type = s.instance_type.clone();
        n.spec.eni.vpc_id = self.vpc.clone();
        n.spec.eni.availability_zone = "zone-a".into();
        n.spec.eni.node_subnet_id = self.subnet.clone();
        n.spec.eni.first_interface_index = Some(s.first_interface_index);
        n.spec.ipam.min_allocate = min_allocate;
        let stored = self.sink.put(&n);
        self.send(stored);
    }

    /// `nodes` nodes, `node-0`…, join at once with `min_allocate` each: their names.
    fn join_all(&self, s: &Settings, nodes: usize, min_allocate: i64) -> Vec<String> {
        let names: Vec<String> = (0..nodes).map(|i| format!("node-{i}")).collect();
        for name in &names {
            self.join(s, name, min_allocate);
        }
        names
    }

    /// What the operator's Pod watch reports: `count` Pods on the node are Pending.
    pub(crate) fn pods_waiting(&self, name: &str, count: usize) {
        let count = u32::try_from(count).unwrap_or(u32::MAX);
        self.input(NodeInput::PendingPods {
            name: name.into(),
            count,
        });
    }

    pub(crate) fn send(&self, node: CiliumNode) {
        self.input(NodeInput::Upsert(Box::new(node)));
    }

    fn input(&self, input: NodeInput) {
        self.tx
            .try_send(input)
            .expect("the core keeps up with its input channel");
    }

    fn snapshot(&self) -> Snapshot {
        Snapshot {
            sim: self.sim.stats(),
            writes: self.sink_writes(),
            plans: self.metrics.plans.get(),
            plan_nanos: self.metrics.plan_nanos.get(),
            at: Instant::now(),
        }
    }

    fn sink_writes(&self) -> WriteCounts {
        self.sink.total_writes()
    }

    /// Stop the core and count what dropping each part frees: the operator (core, its EC2
    /// view, gate, input channel) first, then the in-memory API server, then the simulator.
    /// `None` where the heap is not measured (only the benchmark binary counts it).
    async fn heap_shares(self) -> Option<HeapShares> {
        let World {
            sim,
            gate,
            sink,
            core,
            metrics,
            cache,
            heap: Some(h),
            tx,
            mut task,
            ..
        } = self
        else {
            return None;
        };
        task.abort();
        let _ = (&mut task).await;
        // Aborted workers drop their handles to the core when the runtime next polls them:
        // once the paused clock moves, every ready task has run.
        tokio::time::sleep(Duration::from_millis(1)).await;
        // The operator's largest transient: a full EC2 listing, fetched and merged into the
        // cache while the old view is still held. Measured on the final state with the core
        // stopped, so nothing else allocates or frees meanwhile.
        let refresher = Refresher::new(
            gate.clone(),
            cache.clone(),
            Scope::default(),
            Duration::ZERO,
        );
        let before = (h.live_bytes)();
        (h.reset_peak)();
        refresher.full().await.expect("the simulator lists");
        let refresh_transient = (h.peak_bytes)().saturating_sub(before);
        drop(refresher);
        let share = |f: &mut dyn FnMut()| {
            let before = (h.live_bytes)();
            f();
            before.saturating_sub((h.live_bytes)())
        };
        let mut parts = (Some((core, metrics, tx, gate, task)), Some(sink), Some(sim));
        let mut cache = Some(cache);
        let operator = share(&mut || {
            drop(parts.0.take());
            // Ours is the last handle to the EC2 view unless a worker still holds the core
            // (then the figure would miss the core's share).
            let cache = cache.take().expect("once");
            assert_eq!(Arc::strong_count(&cache), 1, "the core is not dropped yet");
            drop(cache);
        });
        let api_server = share(&mut || drop(parts.1.take()));
        let simulator = share(&mut || drop(parts.2.take()));
        Some(HeapShares {
            operator,
            refresh_transient,
            api_server,
            simulator,
        })
    }
}

/// Counters at one instant; differences of two give a window's figures.
struct Snapshot {
    sim: SimStats,
    writes: WriteCounts,
    plans: u64,
    plan_nanos: u64,
    at: Instant,
}

/// Figures of the window between two snapshots.
struct Window {
    calls: BTreeMap<Operation, u64>,
    ok: BTreeMap<Operation, u64>,
    throttled: u64,
    rejected: u64,
    writes: u64,
    plans: u64,
    plan_nanos: u64,
    elapsed: Duration,
}

fn window(a: &Snapshot, b: &Snapshot) -> Window {
    let diff = |f: fn(&testkit::sim::OpStats) -> u64| -> BTreeMap<Operation, u64> {
        Operation::ALL
            .iter()
            .map(|op| (*op, f(&b.sim.get(*op)) - f(&a.sim.get(*op))))
            .collect()
    };
    Window {
        calls: diff(|s| s.calls),
        ok: diff(|s| s.ok),
        throttled: diff(|s| s.throttled).values().sum(),
        rejected: diff(|s| s.rejected).values().sum(),
        writes: u64::from(b.writes.total() - a.writes.total()),
        plans: b.plans - a.plans,
        plan_nanos: b.plan_nanos - a.plan_nanos,
        elapsed: b.at - a.at,
    }
}

impl Window {
    fn sum(&self, mutating: bool) -> u64 {
        self.calls
            .iter()
            .filter(|(op, _)| op.is_mutating() == mutating)
            .map(|(_, n)| n)
            .sum()
    }

    fn calls_of(&self, op: Operation) -> u64 {
        self.calls.get(&op).copied().unwrap_or(0)
    }

    fn row(&self, heap: Option<HeapMeter>, scenario: String, nodes: usize, time: Duration) -> Row {
        let n = nodes.max(1) as f64;
        let created = self
            .ok
            .get(&Operation::CreateNetworkInterface)
            .copied()
            .unwrap_or(0);
        let per_eni = (created > 0).then(|| {
            (self.calls_of(Operation::CreateNetworkInterface)
                + self.calls_of(Operation::AttachNetworkInterface)
                + self.calls_of(Operation::ModifyNetworkInterfaceAttribute)) as f64
                / created as f64
        });
        Row {
            scenario,
            nodes,
            time,
            lower_bound: None,
            mutating_per_node: self.sum(true) as f64 / n,
            describe_per_node: self.sum(false) as f64 / n,
            calls_per_new_eni: per_eni,
            rejected: self.rejected,
            throttled: self.throttled,
            writes_per_node: self.writes as f64 / n,
            process_heap_peak_mib: heap.map(|h| heap::mib((h.peak_bytes)())),
            operator_heap_mib: None,
            plan_us: if self.plans == 0 {
                0.0
            } else {
                self.plan_nanos as f64 / self.plans as f64 / 1000.0
            },
        }
    }

    fn op_notes(&self, nodes: usize) -> String {
        let n = nodes.max(1) as f64;
        self.calls
            .iter()
            .filter(|(_, c)| **c > 0)
            .map(|(op, c)| format!("{} {:.2}", op.name(), *c as f64 / n))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Peak resident set (`VmHWM`) in MiB; Linux only.
pub fn peak_rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

/// C2 + demand: at least `want` addresses in the pool, every one listed on its ENI in status.
pub fn served(n: &CiliumNode, want: usize) -> bool {
    let Some(status) = n.status.as_ref() else {
        return false;
    };
    n.spec.ipam.pool.len() >= want
        && n.spec.ipam.pool.iter().all(|(ip, a)| {
            status
                .eni
                .enis
                .get(&a.resource)
                .is_some_and(|e| e.addresses.iter().any(|x| x == ip))
        })
}

/// Wait, one simulated second at a time, until `done` holds for every node; `tick` runs first
/// each second (the agents). A node is re-read only when the operator wrote it or the agent
/// changed it since the last look, unless `recheck` says `done` also reads state outside the
/// object (the core's demand), which changes without a write. Returns the time taken, whether all were done and the
/// waiting-nodes curve.
async fn wait_for(
    w: &World,
    names: &[String],
    limit: Duration,
    recheck: bool,
    mut done: impl FnMut(&str, &CiliumNode) -> bool,
    mut tick: impl FnMut(&World, f64) -> BTreeSet<String>,
) -> (Duration, bool, Vec<(f64, f64)>) {
    let start = Instant::now();
    let mut pending: BTreeMap<String, Option<u32>> =
        names.iter().map(|n| (n.clone(), None)).collect();
    let mut curve = vec![(0.0, pending.len() as f64)];
    loop {
        let t = start.elapsed();
        let touched = tick(w, t.as_secs_f64());
        pending.retain(|name, seen| {
            let writes = w.sink.writes(name).total();
            if !recheck && *seen == Some(writes) && !touched.contains(name) {
                return true;
            }
            *seen = Some(writes);
            !w.sink.get(name).is_some_and(|n| done(name, &n))
        });
        curve.push((t.as_secs_f64(), pending.len() as f64));
        if pending.is_empty() || t >= limit {
            return (t, pending.is_empty(), curve);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// [`wait_for`] every node to be [`served`] its `ips_per_node`, nothing ticking meanwhile.
async fn wait_served(
    w: &World,
    names: &[String],
    s: &Settings,
) -> (Duration, bool, Vec<(f64, f64)>) {
    let want = s.ips_per_node as usize;
    wait_for(
        w,
        names,
        s.limit,
        false,
        |_, n| served(n, want),
        |_, _| BTreeSet::new(),
    )
    .await
}

/// Let in-flight passes finish (30 s), then count writes and mutating calls over two resync
/// intervals and a bit: nothing changes in the world meanwhile, so both should be zero.
async fn quiet_window(w: &World) -> Quiet {
    tokio::time::sleep(Duration::from_secs(30)).await;
    let resync = CoreConfig::default().resync_interval;
    let span = resync * 2 + Duration::from_secs(10);
    let a = w.snapshot();
    tokio::time::sleep(span).await;
    let win = window(&a, &w.snapshot());
    Quiet {
        seconds: span.as_secs(),
        resyncs: span.as_secs() / resync.as_secs().max(1),
        writes: win.writes,
        mutating_calls: win.sum(true),
    }
}

fn limits_of(s: &Settings) -> eni_operator::ec2::InstanceTypeLimits {
    default_instance_types()
        .into_iter()
        .find(|t| t.instance_type == s.instance_type)
        .expect("instance type known to the simulator")
}

/// Addresses one new ENI carries: its limit minus the ENI's own primary, ×16 with prefixes.
pub(crate) fn per_new_eni(s: &Settings, prefix: bool) -> u32 {
    let l = limits_of(s).ipv4_per_eni.saturating_sub(1);
    if prefix { l * 16 } else { l }
}

/// The burst's rate-limit lower bound (also the real-process benchmark's): the strictly
/// necessary calls, per node create + attach + modify of each new ENI carrying its addresses
/// (no separate assign; describes fit in their burst), at AWS's full rates, plus the chain
/// describe + create + attach + modify.
pub fn burst_bound(s: &Settings, nodes: usize, prefix: bool) -> Duration {
    let (necessary, chain) = burst_necessary(s, nodes, prefix);
    let aws = GateMode::AwsFull.config();
    lower_bound(&necessary, |b| aws.bucket_limits(b), chain)
}

/// The burst's strictly necessary calls per bucket and the chain of one node's latencies.
fn burst_necessary(s: &Settings, nodes: usize, prefix: bool) -> (BTreeMap<Bucket, u64>, Duration) {
    let enis = u64::from(enis_needed(s.ips_per_node as u32, per_new_eni(s, prefix))) * nodes as u64;
    let necessary = per_bucket([
        (Operation::CreateNetworkInterface, enis),
        (Operation::AttachNetworkInterface, enis),
        (Operation::ModifyNetworkInterfaceAttribute, enis),
    ]);
    (necessary, s.describe_latency + 3 * s.mutating_latency)
}

/// Burst: `nodes` nodes join at once, each needing `ips_per_node` addresses.
pub async fn burst(s: &Settings, nodes: usize, prefix: bool, mode: GateMode) -> Outcome {
    s.reset_heap_peak();
    let w = world(s, mode, prefix, false);
    let before = w.snapshot();
    let names = w.join_all(s, nodes, s.ips_per_node);
    let (took, all_met, curve) = wait_served(&w, &names, s).await;
    let after = w.snapshot();
    let win = window(&before, &after);
    let mode_name = if prefix { "prefix" } else { "secondary IPs" };
    let mut row = win.row(
        s.heap,
        format!("burst, {mode_name}, {}", mode.label()),
        nodes,
        took,
    );

    let enis = u64::from(enis_needed(s.ips_per_node as u32, per_new_eni(s, prefix))) * nodes as u64;
    row.lower_bound = Some(burst_bound(s, nodes, prefix));
    let created = win
        .ok
        .get(&Operation::CreateNetworkInterface)
        .copied()
        .unwrap_or(0);
    let mut notes = vec![
        format!(
            "{}: ENIs created {created} (necessary {enis}); top-up assigns {}; calls per node: {}",
            row.scenario,
            win.calls_of(Operation::AssignPrivateIpAddresses),
            win.op_notes(nodes)
        ),
        format!(
            "{}: gate retries {}, gate throttled {}",
            row.scenario,
            w.gate.stats().total_retries(),
            w.gate.stats().total_throttled()
        ),
    ];
    if let Err(e) = w.sim.check_invariants() {
        panic!("simulator invariants broken: {e}");
    }
    let quiet = quiet_window(&w).await;
    notes.push(format!(
        "{}: steady state (Cilium's CRD): {} CiliumNode writes and {} mutating EC2 calls in {} s \
         ({} resyncs) after the demand was met",
        row.scenario, quiet.writes, quiet.mutating_calls, quiet.seconds, quiet.resyncs
    ));
    let heap = w.heap_shares().await;
    Outcome {
        row,
        waiting: curve,
        all_met,
        enis_created: created,
        notes,
        heap,
        quiet: Some(quiet),
    }
}

/// The result of one shared-account run.
#[derive(Clone, Debug)]
pub struct SharedOutcome {
    pub row: SharedRow,
    /// (simulated seconds, nodes whose demand is not met yet).
    pub waiting: Vec<(f64, f64)>,
    pub notes: Vec<String>,
}

/// Calls made before this much simulated time are the learning phase: the throttled share is
/// reported after it.
pub const LEARNING: Duration = Duration::from_secs(30);

/// Shared account: another tenant uses `other_share` of every AWS bucket (the simulated account
/// throttles both) while `nodes` nodes join at once, each needing `ips_per_node` secondary
/// addresses; the gate in `mode` (the operator's defaults, or Cilium's single bucket).
pub async fn shared_account(
    s: &Settings,
    nodes: usize,
    other_share: f64,
    mode: GateMode,
) -> SharedOutcome {
    let w = world_shared(s, mode, false, false, other_share);
    let before = w.snapshot();
    let names = w.join_all(s, nodes, s.ips_per_node);
    let want = s.ips_per_node as usize;
    let mut learned: Option<Snapshot> = None;
    let (took, _, curve) = wait_for(
        &w,
        &names,
        s.limit,
        false,
        |_, n| served(n, want),
        |w, t| {
            if learned.is_none() && t >= LEARNING.as_secs_f64() {
                learned = Some(w.snapshot());
            }
            BTreeSet::new()
        },
    )
    .await;
    let after = w.snapshot();
    let win = window(&before, &after);
    let late = learned.as_ref().map(|l| window(l, &after));
    let stuck = names
        .iter()
        .filter(|n| !w.sink.get(n).is_some_and(|node| served(&node, want)))
        .count();

    // The necessary calls (as in the burst) against the capacity the other tenant leaves.
    let (necessary, chain) = burst_necessary(s, nodes, false);
    let left = 1.0 - other_share;
    let bound = lower_bound(
        &necessary,
        |b| {
            let (burst, rate) = b.aws_default();
            (burst, f64::from(rate) * left)
        },
        chain,
    );
    let ours = |win: &Window| win.sum(true) + win.sum(false);
    let gate = w.gate.stats();
    let row = SharedRow {
        gate: mode.label().into(),
        other_share,
        nodes,
        time: took,
        lower_bound: bound,
        calls: ours(&win),
        throttled: win.throttled,
        calls_after_learning: late.as_ref().map_or(0, ours),
        throttled_after_learning: late.as_ref().map_or(0, |l| l.throttled),
        failed_operations: gate.total_failed(),
        stuck,
    };
    let rates = w
        .gate
        .rates()
        .into_iter()
        .map(|(b, r)| format!("{b} {r:.2}"))
        .collect::<Vec<_>>()
        .join(", ");
    let notes = vec![
        format!(
            "{}, other tenant {:.0} %: calls per node: {}",
            row.gate,
            other_share * 100.0,
            win.op_notes(nodes)
        ),
        format!(
            "{}, other tenant {:.0} %: gate rates at the end (calls/s): {rates}; gate retries {}; \
             failed operations by action: {}",
            row.gate,
            other_share * 100.0,
            gate.total_retries(),
            by_op(&gate.failed)
        ),
    ];
    if let Err(e) = w.sim.check_invariants() {
        panic!("simulator invariants broken: {e}");
    }
    SharedOutcome {
        row,
        waiting: curve,
        notes,
    }
}

/// `Action n, ...` of the non-zero counts, or `none`.
fn by_op(counts: &BTreeMap<Operation, u64>) -> String {
    let parts: Vec<String> = counts.iter().map(|(op, n)| format!("{op} {n}")).collect();
    if parts.is_empty() {
        "none".into()
    } else {
        parts.join(", ")
    }
}

/// A classic agent: pods hold pool addresses (reported in `status.ipam.used`), release
/// proposals are answered as pkg/ipam/crd.go does.
#[derive(Debug, Default)]
struct Agent {
    pods: BTreeSet<String>,
    target: usize,
    seen_writes: Option<u32>,
    dirty: bool,
}

impl Agent {
    /// Look at the node if the operator wrote it or the agent has work; write back changes.
    /// Returns whether the agent wrote.
    fn step(&mut self, w: &World, name: &str) -> bool {
        let writes = w.sink.writes(name).total();
        if self.seen_writes == Some(writes) && !self.dirty {
            return false;
        }
        self.seen_writes = Some(writes);
        let Some(mut node) = w.sink.get(name) else {
            return false;
        };
        let before = node.status.clone();
        // The first pod stops when there are too many.
        step_pods(&mut self.pods, self.target, &mut node, |_| 0);
        self.dirty = self.pods.len() < self.target;
        if node.status == before {
            return false;
        }
        let stored = w.sink.put(&node);
        w.send(stored);
        true
    }

    fn pending(&self) -> usize {
        self.target.saturating_sub(self.pods.len())
    }
}

fn tick_agents(w: &World, agents: &mut BTreeMap<String, Agent>) -> BTreeSet<String> {
    agents
        .iter_mut()
        .filter_map(|(name, a)| a.step(w, name).then(|| name.clone()))
        .collect()
}

/// Every agent runs its pods and no node needs addresses.
fn settled(core: &BenchCore, agents: &BTreeMap<String, Agent>, name: &str) -> bool {
    agents[name].pending() == 0 && core.demand(name).is_some_and(|d| d.needed <= 0)
}

/// Ticks the agents until every node is [`settled`] or `limit` has passed: how long it took and
/// whether all settled.
async fn settle_agents(
    w: &World,
    names: &[String],
    limit: Duration,
    agents: &mut BTreeMap<String, Agent>,
) -> (Duration, bool) {
    let agents = std::cell::RefCell::new(agents);
    let (took, all, _) = wait_for(
        w,
        names,
        limit,
        true,
        |name, _| settled(&w.core, &agents.borrow(), name),
        |w, _| tick_agents(w, &mut agents.borrow_mut()),
    )
    .await;
    (took, all)
}

/// Churn: pods come and go 10 % per minute for `minutes` simulated minutes on `nodes` nodes,
/// with release-excess on. Counts only the churn window (after every node reached its pods).
pub async fn churn(s: &Settings, nodes: usize, minutes: u32) -> Outcome {
    s.reset_heap_peak();
    let w = world(s, GateMode::AwsFull, false, true);
    let mut rng = StdRng::seed_from_u64(s.seed);
    let names = w.join_all(s, nodes, 0);
    let mut agents: BTreeMap<String, Agent> = names
        .iter()
        .map(|name| {
            let agent = Agent {
                target: 20,
                dirty: true,
                ..Agent::default()
            };
            (name.clone(), agent)
        })
        .collect();
    // Warm-up: every node runs its 20 pods with its pre-allocation in reserve.
    let (_, warm) = settle_agents(&w, &names, s.limit, &mut agents).await;
    if !warm {
        let unsettled: Vec<&String> = names
            .iter()
            .filter(|n| !settled(&w.core, &agents, n))
            .collect();
        if let Some(first) = unsettled.first() {
            panic!(
                "churn warm-up did not settle: {} of {} nodes, e.g. {first}: {} pods waiting, \
                 demand {:?}",
                unsettled.len(),
                names.len(),
                agents[*first].pending(),
                w.core.demand(first),
            );
        }
    }
    let before = w.snapshot();
    let mut pod_seconds_waiting = 0u64;
    let mut max_pending = 0usize;
    for second in 0..u64::from(minutes) * 60 {
        if second % 60 == 0 {
            // 10 % of every node's pods end; the workload drifts by up to 2 pods either way.
            for a in agents.values_mut() {
                let k = a.pods.len().div_ceil(10);
                for _ in 0..k {
                    if a.pods.is_empty() {
                        break;
                    }
                    let i = rng.random_range(0..a.pods.len());
                    let ip = a.pods.iter().nth(i).cloned().expect("in range");
                    a.pods.remove(&ip);
                }
                let drift: i64 = rng.random_range(-2..=2);
                a.target = (a.target as i64 + drift).clamp(10, 30) as usize;
                a.dirty = true;
            }
        }
        tick_agents(&w, &mut agents);
        let pending: usize = agents.values().map(Agent::pending).sum();
        pod_seconds_waiting += pending as u64;
        max_pending = max_pending.max(pending);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let churned = w.snapshot();
    // Settle: time from the end of churn until every node's demand is met.
    let (took, all_met) = settle_agents(&w, &names, s.limit, &mut agents).await;
    let win = window(&before, &churned);
    let row = win.row(
        s.heap,
        format!("churn 10 %/min x {minutes} min"),
        nodes,
        took,
    );
    let per_min = |n: u64| n as f64 / (win.elapsed.as_secs_f64() / 60.0);
    let notes = vec![
        format!(
            "churn: describe calls/min {:.1}, mutating calls/min {:.1}, throttled {}, pod-seconds waiting for an address {pod_seconds_waiting}, most pods waiting at once {max_pending}",
            per_min(win.sum(false)),
            per_min(win.sum(true)),
            win.throttled
        ),
        format!("churn: calls per node: {}", win.op_notes(nodes)),
    ];
    let heap = w.heap_shares().await;
    Outcome {
        row,
        waiting: Vec::new(),
        all_met,
        enis_created: win
            .ok
            .get(&Operation::CreateNetworkInterface)
            .copied()
            .unwrap_or(0),
        notes,
        heap,
        quiet: None,
    }
}

/// Unassign calls needed to release `excess` addresses from ENIs holding `fills` free
/// addresses, one call per ENI, largest first.
pub fn release_calls_needed(fills: &[u32], excess: u32) -> u32 {
    let mut fills = fills.to_vec();
    fills.sort_unstable_by(|a, b| b.cmp(a));
    let mut left = excess;
    let mut calls = 0;
    for f in fills {
        if left == 0 {
            break;
        }
        calls += 1;
        left = left.saturating_sub(f);
    }
    calls
}

/// Scale-down: every node's demand halves; the excess goes through the release handshake.
pub async fn scale_down(s: &Settings, nodes: usize) -> Outcome {
    s.reset_heap_peak();
    let w = world(s, GateMode::AwsFull, false, true);
    let names = w.join_all(s, nodes, s.ips_per_node);
    let mut agents: BTreeMap<String, Agent> = names
        .iter()
        .map(|name| (name.clone(), Agent::default()))
        .collect();
    let (_, up, _) = wait_served(&w, &names, s).await;
    assert!(up, "scale-down: the nodes never reached their demand");
    let half = s.ips_per_node / 2;
    let mut necessary = 0u64;
    for name in &names {
        let n = w
            .sink
            .update(name, |n| n.spec.ipam.min_allocate = half)
            .expect("node exists");
        let fills: Vec<u32> = n
            .status
            .as_ref()
            .map(|st| {
                st.eni
                    .enis
                    .values()
                    .map(|e| e.addresses.len() as u32)
                    .collect()
            })
            .unwrap_or_default();
        let excess = n.spec.ipam.pool.len().saturating_sub(half as usize) as u32;
        necessary += u64::from(release_calls_needed(&fills, excess));
        w.send(n);
    }
    let before = w.snapshot();
    let released = |n: &CiliumNode| {
        n.spec.ipam.pool.len() <= half as usize
            && n.status.as_ref().is_none_or(|st| {
                st.ipam
                    .release_ips
                    .values()
                    .all(|v| v == ReleaseState::Released.as_str())
            })
    };
    let (took, all_met, _) = {
        let agents = std::cell::RefCell::new(&mut agents);
        wait_for(
            &w,
            &names,
            s.limit,
            false,
            |_, n| released(n),
            |w, _| tick_agents(w, &mut agents.borrow_mut()),
        )
        .await
    };
    let after = w.snapshot();
    let win = window(&before, &after);
    let mut row = win.row(s.heap, "scale-down (demand halves)".into(), nodes, took);
    let aws = GateMode::AwsFull.config();
    let calls = per_bucket([(Operation::UnassignPrivateIpAddresses, necessary)]);
    // The release delay is part of the protocol: no address may go before it has passed.
    let chain = s.release_delay + s.mutating_latency;
    row.lower_bound = Some(lower_bound(&calls, |b| aws.bucket_limits(b), chain));
    let notes = vec![format!(
        "scale-down: unassign calls {} (necessary {necessary}); release delay {:?}; calls per node: {}",
        win.calls_of(Operation::UnassignPrivateIpAddresses),
        s.release_delay,
        win.op_notes(nodes)
    )];
    let heap = w.heap_shares().await;
    Outcome {
        row,
        waiting: Vec::new(),
        all_met,
        enis_created: 0,
        notes,
        heap,
        quiet: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn burst_bound_is_the_published_one() {
        // docs/benchmarks.md's bounds: 3 ENIs per node with secondary IPs, 1 with prefixes;
        // attach meters its own bucket (burst 50, 5/s).
        let s = Settings::default();
        let close = |nodes, prefix, want: f64| {
            let got = burst_bound(&s, nodes, prefix).as_secs_f64();
            assert!(
                (got - want).abs() < 1e-6,
                "{nodes} {prefix}: {got} != {want}"
            );
        };
        // (ENIs − 50) / 5 + 0.15 + 3 × 0.3
        close(1000, false, 591.05);
        close(1000, true, 191.05);
        close(5000, false, 2991.05);
        close(5000, true, 991.05);
        close(100, false, 51.05);
    }

    fn small() -> Settings {
        Settings {
            limit: Duration::from_secs(3600),
            ..Settings::default()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_small_burst_meets_every_demand_within_three_calls_per_eni() {
        for prefix in [false, true] {
            let out = burst(&small(), 10, prefix, GateMode::AwsFull).await;
            assert!(out.all_met, "prefix={prefix}: {:?}", out.row);
            assert!(out.enis_created >= 10, "every node got a new ENI");
            let per_eni = out.row.calls_per_new_eni.expect("ENIs were created");
            assert!(per_eni <= 3.0, "prefix={prefix}: {per_eni} calls per ENI");
            assert_eq!(out.row.throttled, 0);
            assert!(out.row.lower_bound.is_some());
            assert!(out.waiting.last().unwrap().1 == 0.0);
            let quiet = out.quiet.expect("measured");
            assert_eq!(
                (quiet.writes, quiet.mutating_calls),
                (0, 0),
                "prefix={prefix}: steady state under Cilium's CRD: {quiet:?}"
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn confirmations_of_a_burst_are_batched_not_one_describe_per_node() {
        let out = burst(&small(), 40, false, GateMode::AwsFull).await;
        assert!(out.all_met, "{:?}", out.row);
        // One confirmation describe per 15 s for every changed instance, plus the start-up
        // and per-minute full listings: far below one per node (it was ~1.6 per node).
        assert!(
            out.row.describe_per_node < 0.5,
            "{} describes per node",
            out.row.describe_per_node
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_cilium_like_gate_also_gets_there() {
        let out = burst(&small(), 5, false, GateMode::CiliumLike).await;
        assert!(out.all_met, "{:?}", out.row);
    }

    #[tokio::test(start_paused = true)]
    async fn a_small_scale_down_releases_through_the_handshake() {
        // Longer than the 60 s resync that starts a release, so one delay vs two is plain.
        let s = Settings {
            release_delay: Duration::from_secs(100),
            ..small()
        };
        let out = scale_down(&s, 4).await;
        assert!(out.all_met, "{:?} {:?}", out.row, out.notes);
        assert!(out.row.mutating_per_node >= 1.0, "something was unassigned");
        // Halving 30 addresses on three ENIs frees two of them: both go after one delay.
        assert!(
            out.row.time < 2 * s.release_delay,
            "took {:?} with a {:?} delay",
            out.row.time,
            s.release_delay
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_small_churn_settles() {
        let out = churn(&small(), 4, 2).await;
        assert!(out.all_met, "{:?} {:?}", out.row, out.notes);
    }

    #[tokio::test(start_paused = true)]
    async fn a_small_burst_in_a_busy_account_converges_without_failures() {
        for mode in [GateMode::Defaults, GateMode::CiliumLike] {
            let out = shared_account(&small(), 40, 0.9, mode).await;
            let r = &out.row;
            assert_eq!(r.stuck, 0, "{r:?}");
            assert_eq!(r.failed_operations, 0, "{r:?}");
            assert!(r.throttled > 0, "the other tenant leaves too little: {r:?}");
        }
    }

    #[test]
    fn release_calls_take_the_fullest_enis_first() {
        assert_eq!(release_calls_needed(&[14, 14, 2], 15), 2);
        assert_eq!(release_calls_needed(&[2, 14], 14), 1);
        assert_eq!(release_calls_needed(&[14], 0), 0);
    }
}
