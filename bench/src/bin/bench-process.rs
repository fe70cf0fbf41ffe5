//! `make bench-process NODES=1000`: the real-process benchmark (docs/benchmarks.md, "Real
//! process"). The release operator binary against a real control plane (etcd, kube-apiserver,
//! kube-controller-manager from `KUBEBUILDER_ASSETS`, `testkit::control_plane`) and `ec2-sim`
//! (AWS's per-account buckets, 300 ms per mutating call, 150 ms per describe), with this process
//! as the load generator: it launches the instances in ec2-sim, creates the Nodes and
//! CiliumNodes, and plays the classic agents over the API server (one watch on every
//! CiliumNode; each node's decisions are `testkit::agent::ClassicAgent`'s, the model e2e's
//! agents use; status writes at most once per 15 s per node, as Cilium's agent).
//!
//! Measured: time to meet demand against the simulated benchmark's bound
//! (`scenario::burst_bound`), the operator's RSS (`/proc/PID/status`) and CPU
//! (`/proc/PID/stat`), the API server's `apiserver_request_total` by verb, ec2-sim's
//! `/_sim/stats` by action, per-node time to usable addresses (quiet cluster, during the burst),
//! and a steady-state window of two resyncs. Every figure comes with the machine's load.
//!
//! `--operator-kind cilium|cilium-aws-limits|all` runs Cilium's own operator on the same world
//! (`testkit::cilium_operator` starts it), one fresh world per operator.
//!
//! The pure parts (parsers, percentiles, the bound, the document splice) are in
//! `bench::process` and `bench::scenario`, unit-tested by `make test`; this binary is not run
//! by `make test` (it takes minutes to an hour). The children, the seeding and the watch are
//! `bench::cluster`'s (shared with `make demo`'s real back-end).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use bench::cluster::{self, CLUSTER, Http, NAMESPACE, Proc, World, free_port};
use bench::process::{
    self as p, Ec2Calls, Load, Requests, ec2_between, ec2_mutating, ec2_summary, percentile,
    requests_between, requests_summary, writes_to,
};
use bench::scenario::{BurstFlags, burst_bound, served};
use clap::Parser;
use eni_operator::crd::CiliumNode;
use futures::{StreamExt, TryStreamExt};
use kube::api::{Api, Patch, PatchParams};
use testkit::agent::{ClassicAgent, endpoints};
use testkit::control_plane::{ControlPlane, assets_from_env};

/// The operator's node resync (its default): the steady-state window covers two.
const RESYNC: Duration = Duration::from_secs(60);

#[derive(Parser, Debug, Clone)]
#[command(about = "Real-process benchmark: the release operator, a real API server, ec2-sim")]
struct Args {
    /// Nodes joining at once in the burst.
    #[arg(long, default_value_t = 100)]
    nodes: usize,
    /// Prefix delegation (/28 prefixes) instead of secondary IPs.
    #[arg(long)]
    prefix: bool,
    /// Which operator serves the nodes: `ours` (`--operator`); `cilium`, Cilium's own
    /// (`--cilium-operator`) with its EC2 rate limiter as shipped (4 qps, burst 20);
    /// `cilium-aws-limits`, the same with its limiter raised to AWS's (`--cilium-aws-qps`,
    /// `--cilium-aws-burst`); `all`: the three one after the other, each on a fresh control
    /// plane and ec2-sim, in one table.
    #[arg(long, value_enum, default_value_t = Kind::Ours)]
    operator_kind: Kind,
    /// Our operator binary (the release build; the image's static musl binary is the shipped
    /// one).
    #[arg(long)]
    operator: Option<PathBuf>,
    /// Cilium's `cilium-operator-aws`.
    #[arg(long, env = "CILIUM_OPERATOR")]
    cilium_operator: Option<PathBuf>,
    /// `cilium-aws-limits`: its one bucket for every EC2 call at AWS's largest refill and burst
    /// (the describe bucket's 20/s and 100: docs/benchmarks.md), so AWS's per-action buckets at
    /// ec2-sim bind instead of its limiter.
    #[arg(long, default_value_t = 20)]
    cilium_aws_qps: u32,
    #[arg(long, default_value_t = 100)]
    cilium_aws_burst: u32,
    /// The ec2-sim binary.
    #[arg(long)]
    ec2_sim: PathBuf,
    #[command(flatten)]
    burst: BurstFlags,
    /// Pods every agent runs (plus router and health) once addresses are there.
    #[arg(long, default_value_t = 10)]
    pods: usize,
    /// Nodes that join one at a time in the quiet cluster before the burst (latency samples).
    #[arg(long, default_value_t = 20)]
    quiet_samples: usize,
    /// Nodes that join one at a time during the burst (latency samples), spread over the
    /// bound.
    #[arg(long, default_value_t = 10)]
    burst_probes: usize,
    /// Least time between two status writes of one agent (Cilium's agent: 15 s).
    #[arg(long, default_value_t = 15)]
    agent_min_interval_secs: u64,
    /// Fraction of AWS's rates the operator's gate uses: 1.0 as the simulated "AWS buckets"
    /// rows (nobody else in the account).
    #[arg(long, default_value_t = 1.0)]
    ec2_rate_fraction: f64,
    /// Give up the burst after this many seconds.
    #[arg(long, default_value_t = 4 * 3600)]
    limit_secs: u64,
    /// Write the result block into this Markdown document (between its markers).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Logs of the operator and ec2-sim go here (default: a temp directory, removed at the end).
    #[arg(long)]
    log_dir: Option<PathBuf>,
    /// Start with the `--nodes` waiting: their Nodes, CiliumNodes and agents exist before the
    /// operator starts (every deploy, upgrade and failover). Measures the time from the Lease
    /// being held to each node's first usable addresses, then stops (issue 29 item 0).
    #[arg(long)]
    start: bool,
}

/// Who serves the nodes in one world.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Ours,
    Cilium,
    CiliumAwsLimits,
    All,
}

impl Kind {
    /// The worlds to run, in order.
    fn worlds(self) -> Vec<Kind> {
        match self {
            Kind::All => vec![Kind::Cilium, Kind::CiliumAwsLimits, Kind::Ours],
            k => vec![k],
        }
    }

    /// Its block's key in docs/benchmarks.md (ours keeps the keys of the earlier runs).
    fn key_prefix(self) -> &'static str {
        match self {
            Kind::Ours => "",
            Kind::Cilium => "cilium-",
            Kind::CiliumAwsLimits => "cilium-aws-limits-",
            Kind::All => "compare-",
        }
    }

    /// Where its leader's Lease is: (namespace, name).
    fn lease(self) -> (&'static str, &'static str) {
        match self {
            Kind::Ours => (NAMESPACE, "eni-operator"),
            _ => (
                testkit::cilium_operator::NAMESPACE,
                testkit::cilium_operator::LEASE,
            ),
        }
    }

    fn label(self, a: &Args) -> String {
        match self {
            Kind::Ours | Kind::All => "ours".into(),
            Kind::Cilium => format!(
                "Cilium's, {} qps / burst {} (its defaults)",
                testkit::cilium_operator::DEFAULT_QPS,
                testkit::cilium_operator::DEFAULT_BURST
            ),
            Kind::CiliumAwsLimits => format!(
                "Cilium's, {} qps / burst {} (AWS's)",
                a.cilium_aws_qps, a.cilium_aws_burst
            ),
        }
    }

    /// The binary it runs.
    fn binary(self, a: &Args) -> Result<&Path> {
        let (flag, path) = match self {
            Kind::Ours | Kind::All => ("--operator", &a.operator),
            _ => ("--cilium-operator (or CILIUM_OPERATOR)", &a.cilium_operator),
        };
        let path = path
            .as_deref()
            .with_context(|| format!("{flag} is needed for --operator-kind {self:?}"))?;
        ensure!(path.is_file(), "{flag} {}: no such file", path.display());
        Ok(path)
    }
}

/// What one world gave: its table row and notes, or the `--start` paragraph.
enum Outcome {
    Burst(Box<p::ProcessRow>, Vec<String>),
    Start(String),
}

fn main() -> Result<()> {
    let args = Args::parse();
    let assets = assets_from_env().context(
        "KUBEBUILDER_ASSETS is not set (a directory with etcd, kube-apiserver, kube-controller-manager, kubectl)",
    )?;
    ensure!(
        args.ec2_sim.is_file(),
        "--ec2-sim {}: no such file",
        args.ec2_sim.display()
    );
    let worlds = args.operator_kind.worlds();
    for k in &worlds {
        k.binary(&args)?;
    }
    let log_dir = match &args.log_dir {
        Some(d) => d.clone(),
        None => std::env::temp_dir().join(format!("bench-process-{}", std::process::id())),
    };
    eprintln!("bench-process: logs in {}", log_dir.display());
    let mut rows = Vec::new();
    let mut notes = Vec::new();
    let mut start_text = String::new();
    for kind in worlds {
        // A fresh control plane and ec2-sim for each: the worlds are identical.
        let dir = log_dir.join(format!("{kind:?}").to_lowercase());
        std::fs::create_dir_all(&dir)?;
        eprintln!(
            "bench-process: {} ({})",
            kind.label(&args),
            binary_version(kind.binary(&args)?)
        );
        match one_world(&args, kind, &assets, &dir)? {
            Outcome::Burst(row, n) => {
                rows.push(*row);
                notes.extend(n);
            }
            Outcome::Start(t) => start_text.push_str(&t),
        }
    }
    if args.log_dir.is_none() {
        let _ = std::fs::remove_dir_all(&log_dir);
    }
    let block = if args.start {
        start_text
    } else {
        let mut b = p::process_table(&rows);
        b.push('\n');
        for n in notes {
            b.push_str(&format!("- {n}\n"));
        }
        b
    };
    print!("{block}");
    if let Some(out) = &args.out {
        let doc = std::fs::read_to_string(out).unwrap_or_default();
        let case = if args.start {
            "start"
        } else {
            mode_key(args.prefix)
        };
        let key = format!("{}{case}-{}", args.operator_kind.key_prefix(), args.nodes);
        std::fs::write(out, p::splice_block(&doc, &key, &block))?;
        eprintln!("bench-process: wrote {}", out.display());
    }
    Ok(())
}

/// The first line of `BINARY --version` (both operators answer it).
fn binary_version(bin: &Path) -> String {
    Command::new(bin)
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .next()
                .map(str::to_owned)
        })
        .unwrap_or_else(|| "no --version".into())
}

/// One world: a control plane, ec2-sim, the operator `kind`, the burst (or the start case).
fn one_world(args: &Args, kind: Kind, assets: &Path, log_dir: &Path) -> Result<Outcome> {
    // Every child is started from this (main) thread: their PR_SET_PDEATHSIG follows it.
    let mut cp = ControlPlane::start(assets).context("starting the control plane")?;
    eprintln!("bench-process: control plane ready at {}", cp.server());
    let mut sim = Proc::ec2_sim(
        &args.ec2_sim,
        args.burst.mutating_latency_ms,
        args.burst.describe_latency_ms,
        log_dir,
    )?;
    let endpoint = sim.endpoint.clone().expect("ec2-sim prints its endpoint");
    eprintln!("bench-process: ec2-sim at {endpoint}");

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let kubeconfig = cp.kubeconfig();
    let total = args.nodes + args.quiet_samples + args.burst_probes;
    let prep = rt.block_on(cluster::prepare(&kubeconfig, &endpoint, total));
    let result = match prep {
        Ok((kube, world)) if args.start => start_case(
            args,
            kind,
            &rt,
            kube,
            &world,
            (&kubeconfig, &endpoint, log_dir),
        )
        .map(Outcome::Start),
        Ok((kube, world)) => match operator(args, kind, &kubeconfig, &endpoint, log_dir) {
            Ok(op) => {
                let r = rt.block_on(run(args, kind, kube, world, &op, &sim, &cp));
                drop(op);
                r.map(|(row, notes)| Outcome::Burst(Box::new(row), notes))
            }
            Err(e) => Err(e),
        },
        Err(e) => Err(e),
    };
    drop(rt);
    sim.stop();
    cp.stop();
    result
}

/// The operator under test: ours (the gate at `--ec2-rate-fraction`, prefixes with `--prefix`)
/// or Cilium's with its EC2 limiter as `kind` says.
fn operator(
    a: &Args,
    kind: Kind,
    kubeconfig: &Path,
    endpoint: &str,
    log_dir: &Path,
) -> Result<Proc> {
    if kind == Kind::Ours {
        let mut extra = vec![
            "--ec2-rate-fraction".to_string(),
            a.ec2_rate_fraction.to_string(),
        ];
        if a.prefix {
            extra.push("--aws-enable-prefix-delegation".into());
        }
        return Proc::operator(kind.binary(a)?, kubeconfig, endpoint, log_dir, &extra);
    }
    let (qps, burst) = match kind {
        Kind::CiliumAwsLimits => (a.cilium_aws_qps, a.cilium_aws_burst),
        _ => (
            testkit::cilium_operator::DEFAULT_QPS,
            testkit::cilium_operator::DEFAULT_BURST,
        ),
    };
    let (metrics, health) = (free_port()?, free_port()?);
    // Its defaults, named anyway so the command line says what ran.
    let extra = testkit::cilium_operator::world_args(qps, burst, a.prefix);
    let cmd = testkit::cilium_operator::Launch {
        version: testkit::cilium_operator::Version::V120,
        binary: kind.binary(a)?.to_owned(),
        kubeconfig: kubeconfig.to_owned(),
        ec2_endpoint: endpoint.to_owned(),
        cluster_name: CLUSTER.to_owned(),
        metrics_port: metrics,
        health_port: health,
        work: log_dir.to_owned(),
        extra,
    }
    .command();
    Proc::spawn(
        cmd,
        log_dir,
        Some(format!("http://127.0.0.1:{metrics}")),
        "Cilium's operator",
    )
}

fn mode_key(prefix: bool) -> &'static str {
    if prefix { "prefix" } else { "secondary" }
}

/// `--start`: the nodes join, their agents write, then the operator starts (from this, the
/// main thread: its PR_SET_PDEATHSIG follows it). Each node's wait is from the Lease being held
/// (its holder set, polled every 50 ms) to its first usable addresses.
fn start_case(
    a: &Args,
    kind: Kind,
    rt: &tokio::runtime::Runtime,
    kube: kube::Client,
    w: &World,
    (kubeconfig, endpoint, log_dir): (&Path, &str, &Path),
) -> Result<String> {
    let g: Shared = Arc::default();
    let want = a.burst.ips_per_node as usize;
    let usable = endpoints(a.pods);
    let watch = rt.spawn(watch_nodes(kube.clone(), g.clone(), want, usable));
    let min_interval = Duration::from_secs(a.agent_min_interval_secs);
    let agents = rt.spawn(run_agents(kube.clone(), g.clone(), a.pods, min_interval));
    rt.block_on(async {
        for (i, instance) in w.instances.iter().take(a.nodes).enumerate() {
            join(&kube, &g, a, w, &format!("node-{i}"), instance).await?;
        }
        // The agents' first status writes land before the operator starts.
        tokio::time::sleep(Duration::from_secs(3)).await;
        anyhow::Ok(())
    })?;
    let load_start = loadavg();
    let op = operator(a, kind, kubeconfig, endpoint, log_dir)?;
    let result = rt.block_on(async {
        wait_leader(&kube, kind, &op).await?;
        let held = Instant::now();
        let limit = Duration::from_secs(a.limit_secs.min(900));
        let waits = loop {
            let waits: Option<Vec<Duration>> = {
                let g = g.lock().expect("poisoned");
                g.nodes
                    .values()
                    .map(|st| st.usable.map(|u| u.saturating_duration_since(held)))
                    .collect()
            };
            if let Some(w) = waits {
                break w;
            }
            ensure!(held.elapsed() < limit, "nodes not served {limit:?} after the Lease");
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let pct = |q: f64| {
            p::percentile(&waits, q).map_or("—".into(), |d| format!("{:.1} s", d.as_secs_f64()))
        };
        Ok(format!(
            "{who}: start with {n} nodes waiting (`--nodes {n} --start`{pd}): their Nodes, CiliumNodes and \
             agents exist before the operator starts. From the Lease being held to each node's \
             first usable addresses: p50 **{p50}**, p99 **{p99}**, max **{max}** (load {load_start:.1} \
             at the start, {load_end:.1} at the end).\n",
            who = kind.label(a),
            n = a.nodes,
            pd = if a.prefix { " --prefix" } else { "" },
            p50 = pct(50.0),
            p99 = pct(99.0),
            max = pct(100.0),
            load_end = loadavg(),
        ))
    });
    watch.abort();
    agents.abort();
    drop(op);
    result
}

/// One node as the load generator sees it.
#[derive(Default)]
struct NodeState {
    /// When its CiliumNode was created (the agent's start).
    created: Option<Instant>,
    /// First seen with an address (in its pool and listed on its ENI).
    first: Option<Instant>,
    /// First seen with addresses for all its endpoints (pods + router + health).
    usable: Option<Instant>,
    /// First seen with its whole `min-allocate`.
    met: Option<Instant>,
    latest: Option<CiliumNode>,
    agent: ClassicAgent,
    /// A new version to look at.
    dirty: bool,
    last_write: Option<Instant>,
}

#[derive(Default)]
struct Gen {
    nodes: HashMap<String, NodeState>,
    /// The load generator's own API requests: (creates, status patches, conflicts, errors).
    creates: u64,
    status_patches: u64,
    conflicts: u64,
    errors: u64,
}

type Shared = Arc<Mutex<Gen>>;

/// Applies the watch's events: latest object, first usable and met times.
async fn watch_nodes(kube: kube::Client, g: Shared, want: usize, usable: usize) {
    cluster::watch_ciliumnodes(kube, |cn| {
        let Some(name) = cn.metadata.name.clone() else {
            return;
        };
        let now = Instant::now();
        let mut g = g.lock().expect("poisoned");
        let st = g.nodes.entry(name).or_default();
        if st.first.is_none() && served(&cn, 1) {
            st.first = Some(now);
        }
        if st.usable.is_none() && served(&cn, usable) {
            st.usable = Some(now);
        }
        if st.met.is_none() && served(&cn, want) {
            st.met = Some(now);
        }
        st.latest = Some(cn);
        st.dirty = true;
    })
    .await;
}

/// The classic agents: each node's `ClassicAgent` looks at its latest object and sends its
/// status patch, at most once per `min_interval` per node (Cilium's agent updates its
/// CiliumNode through a trigger with a 15 s minimum interval).
async fn run_agents(kube: kube::Client, g: Shared, pods: usize, min_interval: Duration) {
    let api: Api<CiliumNode> = Api::all(kube);
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = Instant::now();
        let patches: Vec<(String, serde_json::Value)> = {
            let mut g = g.lock().expect("poisoned");
            g.nodes
                .iter_mut()
                .filter(|(_, st)| {
                    st.dirty
                        && st.created.is_some()
                        && st.last_write.is_none_or(|t| now - t >= min_interval)
                })
                .filter_map(|(name, st)| {
                    st.dirty = false;
                    let cn = st.latest.as_ref()?;
                    let step = st.agent.step(cn, pods);
                    let patch = step.status_patch?;
                    st.last_write = Some(now);
                    Some((name.clone(), patch))
                })
                .collect()
        };
        let results: Vec<(String, kube::Result<CiliumNode>)> = futures::stream::iter(patches)
            .map(|(name, patch)| {
                let api = api.clone();
                async move {
                    let r = api
                        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
                        .await;
                    (name, r)
                }
            })
            .buffer_unordered(16)
            .collect()
            .await;
        let mut g = g.lock().expect("poisoned");
        for (name, r) in results {
            match r {
                Ok(_) => g.status_patches += 1,
                Err(e) => {
                    if matches!(&e, kube::Error::Api(s) if s.code == 409) {
                        g.conflicts += 1;
                    } else {
                        g.errors += 1;
                        eprintln!("bench-process: agent {name}: {e}");
                    }
                    // A rejected write: re-read from the next object, as e2e's agents do.
                    if let Some(st) = g.nodes.get_mut(&name) {
                        st.agent = ClassicAgent::new();
                        st.dirty = true;
                    }
                }
            }
        }
    }
}

/// Creates node `i`'s Node and CiliumNode (as a kubelet and a classic agent at start).
async fn join(
    kube: &kube::Client,
    g: &Shared,
    a: &Args,
    w: &World,
    name: &str,
    instance: &str,
) -> Result<()> {
    let uid = cluster::create_node(kube, name, instance).await?;
    g.lock()
        .expect("poisoned")
        .nodes
        .entry(name.into())
        .or_default()
        .created = Some(Instant::now());
    cluster::create_ciliumnode(kube, w, name, instance, uid, a.burst.ips_per_node).await?;
    g.lock().expect("poisoned").creates += 2;
    Ok(())
}

/// Counters of the whole system at one instant.
struct Snap {
    at: Instant,
    requests: Requests,
    ec2: Ec2Calls,
    /// CPU ticks by process label.
    ticks: BTreeMap<&'static str, u64>,
    /// The load generator's requests: status patches sent (conflicts and errors included),
    /// and creates (Node + CiliumNode per join).
    gen_patches: u64,
    gen_creates: u64,
}

struct Pids {
    operator: u32,
    sim: u32,
    control_plane: Vec<(&'static str, u32)>,
}

fn read_ticks(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| p::parse_stat_ticks(&s))
        .unwrap_or(0)
}

fn status_mib(pid: u32, key: &str) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| p::parse_status_mib(&s, key))
        .unwrap_or(0.0)
}

/// Whether `pid` runs: its `/proc` entry is there and not a zombie (our child, not yet reaped).
fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| p::parse_status_state(&s))
        .is_some_and(|c| !matches!(c, 'Z' | 'X'))
}

fn loadavg() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| p::parse_loadavg(&s))
        .map_or(0.0, |l| l[0])
}

fn ticks_per_second() -> u64 {
    // SAFETY: sysconf(3) reads a constant of the system; no memory is passed.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    u64::try_from(t).unwrap_or(100).max(1)
}

async fn snap(
    kube: &kube::Client,
    http: &Http,
    sim: &str,
    pids: &Pids,
    g: &Shared,
) -> Result<Snap> {
    let req = http::Request::builder().uri("/metrics").body(Vec::new())?;
    let requests = p::parse_apiserver_requests(&kube.request_text(req).await?);
    let stats: serde_json::Value =
        serde_json::from_str(&http.get(&format!("{sim}/_sim/stats")).await?)?;
    let mut ticks = BTreeMap::new();
    ticks.insert("operator", read_ticks(pids.operator));
    ticks.insert("ec2-sim", read_ticks(pids.sim));
    ticks.insert("load generator", read_ticks(std::process::id()));
    for (name, pid) in &pids.control_plane {
        ticks.insert(*name, read_ticks(*pid));
    }
    let g = g.lock().expect("poisoned");
    Ok(Snap {
        at: Instant::now(),
        requests,
        ec2: p::parse_sim_stats(&stats),
        ticks,
        gen_patches: g.status_patches + g.conflicts + g.errors,
        gen_creates: g.creates,
    })
}

/// Figures of the window between two snapshots.
struct Win {
    secs: f64,
    requests: Requests,
    ec2: Ec2Calls,
    cpu: BTreeMap<&'static str, (f64, f64)>,
    gen_writes: u64,
    /// The load generator's CiliumNode writes (creates and status patches).
    gen_cn_writes: u64,
}

fn win(a: &Snap, b: &Snap) -> Win {
    let hz = ticks_per_second();
    let elapsed = b.at - a.at;
    Win {
        secs: elapsed.as_secs_f64(),
        requests: requests_between(&a.requests, &b.requests),
        ec2: ec2_between(&a.ec2, &b.ec2),
        cpu: b
            .ticks
            .iter()
            .map(|(k, t)| {
                let t0 = a.ticks.get(k).copied().unwrap_or(0);
                (*k, p::cpu_share(t.saturating_sub(t0), hz, elapsed))
            })
            .collect(),
        gen_writes: (b.gen_patches - a.gen_patches) + (b.gen_creates - a.gen_creates),
        gen_cn_writes: (b.gen_patches - a.gen_patches) + (b.gen_creates - a.gen_creates) / 2,
    }
}

fn cpu_line(w: &Win) -> String {
    w.cpu
        .iter()
        .map(|(k, (s, c))| format!("{k} {s:.1} s ({c:.2} cores)"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn ms(d: Option<Duration>) -> String {
    d.map_or("-".into(), |d| format!("{:.2} s", d.as_secs_f64()))
}

/// Samples RSS and load every second until told to stop.
#[derive(Default)]
struct Sampler {
    load: Load,
    rss_max: f64,
}

async fn sample(pid: u32, s: Arc<Mutex<Sampler>>) {
    loop {
        {
            let mut s = s.lock().expect("poisoned");
            s.load.push(loadavg());
            s.rss_max = s.rss_max.max(status_mib(pid, "VmRSS"));
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Until `kind`'s Lease has a holder (both operators elect a leader on one).
async fn wait_leader(kube: &kube::Client, kind: Kind, op: &Proc) -> Result<()> {
    let (ns, name) = kind.lease();
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> = Api::namespaced(kube.clone(), ns);
    let start = Instant::now();
    loop {
        let holder = leases
            .get_opt(name)
            .await?
            .and_then(|l| l.spec)
            .and_then(|s| s.holder_identity);
        if holder.is_some_and(|h| !h.is_empty()) {
            return Ok(());
        }
        ensure!(
            start.elapsed() < Duration::from_secs(120),
            "the operator (pid {}) held no Lease {ns}/{name} in 120 s",
            op.pid()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn run(
    a: &Args,
    kind: Kind,
    kube: kube::Client,
    w: World,
    op: &Proc,
    sim_proc: &Proc,
    cp: &ControlPlane,
) -> Result<(p::ProcessRow, Vec<String>)> {
    let http = Http::default();
    let sim = sim_proc.endpoint.clone().expect("endpoint");
    let pids = Pids {
        operator: op.pid(),
        sim: sim_proc.pid(),
        control_plane: ["etcd", "kube-apiserver", "kube-controller-manager"]
            .into_iter()
            .zip(cp.pids())
            .collect(),
    };
    let load_start = loadavg();
    wait_leader(&kube, kind, op).await?;
    eprintln!("bench-process: operator {} leads", op.pid());

    let g: Shared = Arc::default();
    let want = a.burst.ips_per_node as usize;
    let usable = endpoints(a.pods);
    let watch = tokio::spawn(watch_nodes(kube.clone(), g.clone(), want, usable));
    let agents = tokio::spawn(run_agents(
        kube.clone(),
        g.clone(),
        a.pods,
        Duration::from_secs(a.agent_min_interval_secs),
    ));
    let sampler = Arc::new(Mutex::new(Sampler::default()));
    let sampling = tokio::spawn(sample(op.pid(), sampler.clone()));
    let mut instances = w.instances.clone().into_iter();

    // Quiet cluster: nodes join one at a time; each waits for its demand.
    let mut quiet_usable = Vec::new();
    let mut quiet_met = Vec::new();
    let quiet_load_start = loadavg();
    for i in 0..a.quiet_samples {
        let name = format!("quiet-{i}");
        join(
            &kube,
            &g,
            a,
            &w,
            &name,
            &instances.next().expect("launched"),
        )
        .await?;
        let start = Instant::now();
        loop {
            let (u, m) = node_times(&g, &name);
            if let (Some(u), Some(m)) = (u, m) {
                quiet_usable.push(u);
                quiet_met.push(m);
                break;
            }
            ensure!(
                start.elapsed() < Duration::from_secs(120),
                "{name} not served in 120 s"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let quiet_load = format!("1-min loadavg {quiet_load_start:.2} → {:.2}", loadavg());
    eprintln!(
        "bench-process: quiet cluster: usable p50 {} p99 {}",
        ms(percentile(&quiet_usable, 50.0)),
        ms(percentile(&quiet_usable, 99.0))
    );
    // Let the quiet nodes' agents write before the burst's window starts.
    tokio::time::sleep(Duration::from_secs(a.agent_min_interval_secs + 5)).await;

    // The burst.
    let settings = a.burst.settings();
    let bound = burst_bound(&settings, a.nodes + a.burst_probes, a.prefix);
    sampler.lock().expect("poisoned").load = Load::default();
    let before = snap(&kube, &http, &sim, &pids, &g).await?;
    let t0 = Instant::now();
    let names: Vec<String> = (0..a.nodes).map(|i| format!("node-{i}")).collect();
    let burst_instances: Vec<String> = instances.by_ref().take(a.nodes).collect();
    futures::stream::iter(names.iter().zip(&burst_instances))
        .map(|(n, i)| join(&kube, &g, a, &w, n, i))
        .buffer_unordered(32)
        .try_collect::<Vec<()>>()
        .await?;
    let created_in = t0.elapsed();
    eprintln!(
        "bench-process: {} nodes created in {:.1} s; bound {:.1} s",
        a.nodes,
        created_in.as_secs_f64(),
        bound.as_secs_f64()
    );
    // Probes: nodes joining one at a time while the burst runs, spread over the bound.
    let probe_names: Vec<String> = (0..a.burst_probes).map(|i| format!("probe-{i}")).collect();
    let probes = {
        let (kube, g, a, names) = (kube.clone(), g.clone(), a.clone(), probe_names.clone());
        let insts: Vec<String> = instances.by_ref().take(a.burst_probes).collect();
        let w = World {
            vpc: w.vpc.clone(),
            subnet: w.subnet.clone(),
            instances: vec![],
        };
        let every = bound / (a.burst_probes as u32 + 1);
        tokio::spawn(async move {
            for (i, (name, inst)) in names.iter().zip(&insts).enumerate() {
                tokio::time::sleep_until((t0 + every * (i as u32 + 1)).into()).await;
                if let Err(e) = join(&kube, &g, &a, &w, name, inst).await {
                    eprintln!("bench-process: probe {name}: {e:#}");
                }
            }
        })
    };
    let all: Vec<String> = names.iter().chain(&probe_names).cloned().collect();
    let limit = Duration::from_secs(a.limit_secs);
    let mut last_log = Instant::now();
    let mut exited_at = None;
    let (took, all_met) = loop {
        let waiting = {
            let g = g.lock().expect("poisoned");
            all.iter()
                .filter(|n| g.nodes.get(*n).is_none_or(|s| s.met.is_none()))
                .count()
        };
        if waiting == 0 {
            let g = g.lock().expect("poisoned");
            let last = all
                .iter()
                .filter_map(|n| g.nodes.get(n).and_then(|s| s.met))
                .max()
                .unwrap_or(t0);
            break (last - t0, true);
        }
        if t0.elapsed() > limit {
            break (t0.elapsed(), false);
        }
        // An operator that exited serves nobody: waiting for the limit would only burn time
        // (Cilium's exits when it loses its Lease; a Deployment would restart it).
        if !running(op.pid()) {
            eprintln!(
                "bench-process: the operator (pid {}) exited {:.0} s into the burst",
                op.pid(),
                t0.elapsed().as_secs_f64()
            );
            exited_at = Some(t0.elapsed());
            break (t0.elapsed(), false);
        }
        if last_log.elapsed() > Duration::from_secs(30) {
            last_log = Instant::now();
            eprintln!(
                "bench-process: {:.0} s: {waiting} nodes waiting; operator RSS {:.0} MiB; load {:.2}",
                t0.elapsed().as_secs_f64(),
                status_mib(op.pid(), "VmRSS"),
                loadavg()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let _ = probes.await;
    let after = snap(&kube, &http, &sim, &pids, &g).await?;
    let burst = win(&before, &after);
    let burst_rss_hwm = status_mib(op.pid(), "VmHWM");
    let burst_load = sampler.lock().expect("poisoned").load.describe(cores());
    eprintln!(
        "bench-process: demand met in {:.1} s (bound {:.1} s)",
        took.as_secs_f64(),
        bound.as_secs_f64()
    );

    let (burst_first, burst_usable, burst_met, probe_usable, probe_met) = {
        let g = g.lock().expect("poisoned");
        let times = |names: &[String], f: fn(&NodeState) -> Option<Instant>| -> Vec<Duration> {
            names
                .iter()
                .filter_map(|n| {
                    let s = g.nodes.get(n)?;
                    Some(f(s)? - s.created?)
                })
                .collect()
        };
        (
            times(&names, |s| s.first),
            times(&names, |s| s.usable),
            times(&names, |s| s.met),
            times(&probe_names, |s| s.usable),
            times(&probe_names, |s| s.met),
        )
    };

    // Steady state: in-flight passes finish, then two resyncs and a bit.
    sampler.lock().expect("poisoned").load = Load::default();
    tokio::time::sleep(Duration::from_secs(30)).await;
    let q0 = snap(&kube, &http, &sim, &pids, &g).await?;
    tokio::time::sleep(RESYNC * 2 + Duration::from_secs(10)).await;
    let q1 = snap(&kube, &http, &sim, &pids, &g).await?;
    let quiet = win(&q0, &q1);
    let events = cilium_node_events(&kube).await?;
    let steady_rss = status_mib(op.pid(), "VmRSS");
    let peak_rss = status_mib(op.pid(), "VmHWM");
    let steady_load = sampler.lock().expect("poisoned").load.describe(cores());
    let rss_max_sampled = sampler.lock().expect("poisoned").rss_max;
    for t in [watch, agents, sampling] {
        t.abort();
    }
    let g = g.lock().expect("poisoned");

    let mode = if a.prefix { "prefix" } else { "secondary IPs" };
    let (cpu_b, cores_b) = burst.cpu.get("operator").copied().unwrap_or_default();
    let (cpu_q, cores_q) = quiet.cpu.get("operator").copied().unwrap_or_default();
    // The operator's: the agents write nothing once every node has its addresses.
    let quiet_writes =
        writes_to(&quiet.requests, "ciliumnodes").saturating_sub(quiet.gen_cn_writes);
    let quiet_mutating = ec2_mutating(&quiet.ec2);
    let all_nodes = a.nodes + a.quiet_samples + a.burst_probes;
    let burst_cn_writes =
        writes_to(&burst.requests, "ciliumnodes").saturating_sub(burst.gen_cn_writes);
    let (throttled, failed) = p::ec2_refused(&burst.ec2);
    let row = p::ProcessRow {
        operator: kind.label(a),
        mode: mode.into(),
        nodes: a.nodes,
        time: took,
        met: all_met,
        bound,
        peak_rss_mib: peak_rss,
        steady_rss_mib: steady_rss,
        cpu_burst: (cpu_b, cores_b),
        cpu_steady: (cpu_q, cores_q),
        quiet: (
            percentile(&quiet_usable, 50.0),
            percentile(&quiet_usable, 99.0),
        ),
        during_burst: (
            percentile(&probe_usable, 50.0),
            percentile(&probe_usable, 99.0),
        ),
        steady_writes: quiet_writes,
        steady_mutating: quiet_mutating,
        first_address: [
            percentile(&burst_first, 50.0),
            percentile(&burst_first, 99.0),
            percentile(&burst_first, 100.0),
        ],
        calls: burst.ec2.values().map(|(n, _, _)| n).sum(),
        mutating: ec2_mutating(&burst.ec2),
        throttled,
        failed,
        // Per node that joined during the burst (its nodes and probes).
        cn_writes_per_node: burst_cn_writes as f64 / (a.nodes + a.burst_probes).max(1) as f64,
        load: burst_load.clone(),
    };
    let resources = ["ciliumnodes", "nodes", "leases", "events"];
    let notes = [
        format!(
            "burst window {:.0} s ({} nodes + {} probes joining; the {} Node + CiliumNode creates took {:.1} s); machine load: {burst_load} (1-min loadavg at the start of the run {load_start:.2}; other sessions build on this machine)",
            burst.secs,
            a.nodes,
            a.burst_probes,
            a.nodes,
            created_in.as_secs_f64()
        ),
        format!(
            "burst: EC2 calls by action (ec2-sim): {}",
            ec2_summary(&burst.ec2)
        ),
        format!(
            "burst: API requests by verb (apiserver_request_total, every client): {}",
            requests_summary(&burst.requests, &resources)
        ),
        format!(
            "burst: the load generator's own writes {} (Node and CiliumNode creates, agents' status patches sent; {} conflicts, {} errors over the whole run), so the operator's CiliumNode writes are {}",
            burst.gen_writes, g.conflicts, g.errors, burst_cn_writes
        ),
        format!("burst: CPU by process: {}", cpu_line(&burst)),
        format!(
            "new-node time to usable addresses ({} of its pods + router + health): quiet cluster p50 {} p99 {} ({} samples, {quiet_load}); during the burst, nodes joining one at a time p50 {} p99 {} ({} probes); the burst's own nodes p50 {} p99 {}",
            a.pods,
            ms(percentile(&quiet_usable, 50.0)),
            ms(percentile(&quiet_usable, 99.0)),
            quiet_usable.len(),
            ms(percentile(&probe_usable, 50.0)),
            ms(percentile(&probe_usable, 99.0)),
            probe_usable.len(),
            ms(percentile(&burst_usable, 50.0)),
            ms(percentile(&burst_usable, 99.0)),
        ),
        format!(
            "new-node time to its whole min-allocate ({}): quiet p50 {} p99 {}; probes p50 {} p99 {}; burst nodes p50 {} p99 {}",
            a.burst.ips_per_node,
            ms(percentile(&quiet_met, 50.0)),
            ms(percentile(&quiet_met, 99.0)),
            ms(percentile(&probe_met, 50.0)),
            ms(percentile(&probe_met, 99.0)),
            ms(percentile(&burst_met, 50.0)),
            ms(percentile(&burst_met, 99.0)),
        ),
        format!(
            "steady state ({:.0} s = 2 resyncs + 10 s, from 30 s after the demand was met; {steady_load}): {quiet_writes} CiliumNode writes, {quiet_mutating} mutating EC2 calls; API requests {}; EC2 calls {}; CPU {}",
            quiet.secs,
            requests_summary(&quiet.requests, &resources),
            ec2_summary(&quiet.ec2),
            cpu_line(&quiet)
        ),
        format!(
            "operator RSS: peak (VmHWM) {peak_rss:.0} MiB, at the end of the burst {burst_rss_hwm:.0} MiB, most sampled once a second {rss_max_sampled:.0} MiB, steady (VmRSS at the end) {steady_rss:.0} MiB"
        ),
        {
            let total: u64 = events.values().sum();
            format!(
                "Events on CiliumNodes by the end of the steady window: {total} ({:.2} per node over {all_nodes} nodes; {}); Event writes to the API server during the burst: {} ({:.2} per node)",
                total as f64 / all_nodes.max(1) as f64,
                events
                    .iter()
                    .map(|(k, n)| format!("{k} {n}"))
                    .collect::<Vec<_>>()
                    .join(", "),
                writes_to(&burst.requests, "events"),
                writes_to(&burst.requests, "events") as f64 / all_nodes.max(1) as f64,
            )
        },
    ];
    let label = kind.label(a);
    let exited = exited_at.map(|t| {
        format!(
            "the operator process exited {:.0} s into the burst (its log says why); the figures after that are of a stopped operator",
            t.as_secs_f64()
        )
    });
    let notes = exited
        .into_iter()
        .chain(notes)
        .map(|n| format!("{label}, {} nodes, {mode}: {n}", a.nodes))
        .collect();
    Ok((row, notes))
}

/// Events about CiliumNodes, by "type reason".
async fn cilium_node_events(kube: &kube::Client) -> Result<BTreeMap<String, u64>> {
    let api: kube::Api<k8s_openapi::api::core::v1::Event> = kube::Api::all(kube.clone());
    let mut out = BTreeMap::new();
    for e in api.list(&Default::default()).await? {
        if e.involved_object.kind.as_deref() != Some("CiliumNode") {
            continue;
        }
        let key = format!(
            "{} {}",
            e.type_.unwrap_or_default(),
            e.reason.unwrap_or_default()
        );
        *out.entry(key).or_default() += 1;
    }
    Ok(out)
}

fn node_times(g: &Shared, name: &str) -> (Option<Duration>, Option<Duration>) {
    let g = g.lock().expect("poisoned");
    let Some(s) = g.nodes.get(name) else {
        return (None, None);
    };
    let Some(c) = s.created else {
        return (None, None);
    };
    (s.usable.map(|u| u - c), s.met.map(|m| m - c))
}

fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}
