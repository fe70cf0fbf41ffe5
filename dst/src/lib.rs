//! Deterministic simulation testing (`make dst`): the real [`Core`] behind the real [`Gate`] in
//! front of the EC2 [`Simulator`], a [`MemorySink`] with Cilium's CRD as the API server, and
//! in-process classic agents, all on one paused current-thread tokio runtime. Every choice the
//! harness makes comes from one seed, so a seed replays its schedule exactly; the invariants
//! are checked after every simulated second. See docs/testing.md for the model and its limits.

pub mod account;
pub mod agent;
pub mod api;
pub mod check;
pub mod cilium;
pub mod first_action;
pub mod forgery;
pub mod guard;
pub mod identity;
pub mod leadership;
pub mod multipool;
pub mod probes;
pub mod refusals;
mod replay;
pub mod reuse;
pub mod slow_answer;
pub mod statics;
pub mod tenant_spell;
pub mod unassign_crash;
pub mod view;
pub mod world;

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use eni_operator::ec2::Operation;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::world::World;

/// How long a run lasts and when the faults stop.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// Simulated minutes with events and faults.
    pub fault_minutes: u64,
    /// Bound on the time every node's demand must be met once the faults stop.
    pub settle: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            fault_minutes: 25,
            settle: Duration::from_secs(8 * 60),
        }
    }
}

/// One broken invariant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    pub invariant: &'static str,
    pub detail: String,
    /// Simulated seconds since the start.
    pub at: u64,
}

/// What one seed did.
#[derive(Clone, Debug)]
pub struct Outcome {
    pub seed: u64,
    /// The first violation (the run stops there).
    pub violation: Option<Violation>,
    /// Every harness event and observation, in order.
    pub trace: Vec<String>,
    /// A hash of the trace with a fixed hasher: equal for two runs of the same seed.
    pub trace_hash: u64,
    /// Simulated seconds the run lasted.
    pub simulated: u64,
}

impl Outcome {
    /// The report of a failed seed: seed, invariant, and the events that led to it.
    pub fn report(&self, last: usize) -> String {
        let Some(v) = &self.violation else {
            return format!("seed {}: ok", self.seed);
        };
        let from = self.trace.len().saturating_sub(last);
        let mut s = format!(
            "seed {} violated `{}` at t={}s: {}\n  replay: make dst SEED={}\n  last events:\n",
            self.seed, v.invariant, v.at, v.detail, self.seed
        );
        for line in &self.trace[from..] {
            s.push_str("    ");
            s.push_str(line);
            s.push('\n');
        }
        s
    }
}

/// A current-thread runtime with paused time: what a seed (and a check's own test) runs on.
pub fn paused_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime")
}

/// Run one seed on its own paused current-thread runtime.
pub fn run_seed(seed: u64, opts: &Options) -> Outcome {
    let rt = paused_runtime();
    let watch = Arc::new(Watch::default());
    // Dropping `done` wakes the watchdog at once (a seed must not wait out its sleep).
    let (done, finished) = std::sync::mpsc::channel::<()>();
    let dog = {
        let watch = watch.clone();
        std::thread::spawn(move || watchdog(seed, &watch, &finished))
    };
    let out = rt.block_on(simulate(seed, opts, &watch));
    drop(done);
    let _ = dog.join();
    out
}

/// What the watchdog sees of a running seed.
#[derive(Default)]
struct Watch {
    sink: std::sync::OnceLock<Arc<testkit::sink::MemorySink>>,
    seconds: AtomicU64,
}

/// CiliumNode writes allowed per simulated second (plus a start allowance) before a run counts
/// as a write storm.
const STORM_WRITES_PER_SECOND: u64 = 50;

/// A write storm (the operator writing in a loop without awaiting anything that takes time)
/// never lets the paused clock advance, so no simulated check would ever run again. This thread
/// looks from outside: it compares the writes so far with the simulated seconds (both
/// deterministic; the wall clock only sets how often it looks) and ends the process with the
/// report.
fn watchdog(seed: u64, watch: &Watch, finished: &std::sync::mpsc::Receiver<()>) {
    while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
        finished.recv_timeout(Duration::from_millis(200))
    {
        let Some(sink) = watch.sink.get() else {
            continue;
        };
        let writes = u64::from(sink.total_writes().total());
        let seconds = watch.seconds.load(Ordering::Relaxed);
        if writes > 10_000 + STORM_WRITES_PER_SECOND * seconds {
            eprintln!(
                "seed {seed} violated `no write storm` at t={seconds}s: {writes} CiliumNode writes \
                 while simulated time stands still\n  replay: make dst SEED={seed}"
            );
            println!("dst: 1 seeds, 1 violations");
            std::process::exit(1);
        }
    }
}

/// Events drawn each simulated second (per mille), while the faults last.
const P_DEMAND: u32 = 40;
const P_JOIN: u32 = 4;
const P_DRAIN: u32 = 3;
const P_TERMINATE: u32 = 2;
const P_CRASH: u32 = 3;
const P_ORPHAN: u32 = 2;
const P_EC2_FAULT: u32 = 30;

async fn simulate(seed: u64, opts: &Options, watch: &Watch) -> Outcome {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut w = World::new(seed, &mut rng).await;
    let _ = watch.sink.set(w.sink.clone());
    let nodes = rng.random_range(3..=6);
    for _ in 0..nodes {
        w.join(&mut rng).await;
    }
    first_action::begin(&mut w);
    let fault_end = opts.fault_minutes * 60;
    let settle_end = fault_end + opts.settle.as_secs();
    refusals::begin(&mut w);
    let mut violation = None;
    let mut t = 0u64;
    while t < settle_end {
        if t < fault_end {
            events(&mut w, &mut rng, t).await;
        } else if t == fault_end {
            refusals::end(&mut w, t);
            cilium::faults_end(&mut w, t);
            // "After the faults stop" means it: one-off faults still queued for a call that has
            // not come (an attach fault waiting for the next node to join) go too.
            w.sim.drop_queued_faults();
            w.sink.drop_write_faults();
        }
        w.tick(&mut rng, t).await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        t += 1;
        watch.seconds.store(t, Ordering::Relaxed);
        if let Err((invariant, detail)) = check::always(&w)
            .and_then(|()| first_action::check(&mut w, t))
            .and_then(|()| tenant_spell::check(&mut w, t))
        {
            violation = Some(Violation {
                invariant,
                detail,
                at: t,
            });
            break;
        }
        if t.is_multiple_of(60) {
            w.observe(t);
        }
    }
    if violation.is_none() {
        violation = finish(&mut w, &mut rng, t)
            .await
            .err()
            .map(|(invariant, detail)| Violation {
                invariant,
                detail,
                at: t,
            });
    }
    let end = tokio::time::Instant::now()
        .duration_since(w.start)
        .as_secs();
    w.digest(end);
    let trace = std::mem::take(&mut w.trace);
    let mut h = std::collections::hash_map::DefaultHasher::new();
    trace.hash(&mut h);
    Outcome {
        seed,
        violation,
        trace_hash: h.finish(),
        trace,
        simulated: tokio::time::Instant::now()
            .duration_since(w.start)
            .as_secs(),
    }
}

/// The seed's events of one second.
async fn events(w: &mut World, rng: &mut StdRng, t: u64) {
    let roll = |rng: &mut StdRng, p: u32| rng.random_range(0..1000) < p;
    if roll(rng, P_DEMAND) {
        w.change_demand(rng, t);
    }
    if roll(rng, P_JOIN) && w.live_nodes() < 8 {
        w.join(rng).await;
    }
    if roll(rng, P_DRAIN) && w.live_nodes() > 2 {
        w.drain(rng, t);
    }
    if roll(rng, P_TERMINATE) && w.live_nodes() > 2 {
        w.terminate(rng, t);
    }
    if roll(rng, P_CRASH) {
        w.crash_and_restart(t);
    }
    if roll(rng, P_ORPHAN) && w.live_nodes() > 2 {
        w.orphan(rng, t);
    }
    w.agent_events(t);
    api::events(w, t);
    leadership::events(w, t);
    reuse::events(w, t);
    unassign_crash::events(w, t);
    slow_answer::events(w, t);
    identity::events(w, t);
    cilium::events(w, t);
    forgery::events(w, t).await;
    tenant_spell::events(w, t);
    if roll(rng, P_EC2_FAULT) {
        let op = *[
            Operation::CreateNetworkInterface,
            Operation::AttachNetworkInterface,
            Operation::AssignPrivateIpAddresses,
            Operation::UnassignPrivateIpAddresses,
            Operation::DetachNetworkInterface,
            Operation::DeleteNetworkInterface,
            Operation::ModifyNetworkInterfaceAttribute,
            Operation::DescribeNetworkInterfaces,
            Operation::DescribeInstances,
        ]
        .get(rng.random_range(0..9))
        .expect("in range");
        let times = rng.random_range(1..=3);
        let kind = rng.random_range(0..3);
        let what = match kind {
            0 => {
                w.sim.inject_error(op, "RequestLimitExceeded", times);
                "throttled"
            }
            1 => {
                w.sim.inject_error(op, "InternalError", times);
                "5xx"
            }
            _ if op.is_mutating() => {
                w.sim.inject_lost_answer(op, times);
                "lost-answer"
            }
            _ => {
                w.sim.inject_error(op, "Unavailable", times);
                "unavailable"
            }
        };
        w.log(t, format!("ec2 {what} x{times} on {}", op.name()));
    }
}

/// After the faults: every demand met within the bound (checked at the end of the settle
/// phase), no ENI of ours left `available`, then a quiet window of no writes and no mutating
/// calls.
async fn finish(w: &mut World, rng: &mut StdRng, t: u64) -> Result<(), (&'static str, String)> {
    check::demand_met(w)?;
    check::no_available_owned(w)?;
    check::no_vanished_nodes(w)?;
    let before = w.quiet_counters();
    // Two resyncs and a bit: nothing changes in the world, so nothing may be written or mutated.
    let span = 130;
    for s in 0..span {
        w.tick(rng, t + s).await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        check::always(w)?;
    }
    let after = w.quiet_counters();
    if after != before {
        return Err((
            "quiet",
            format!(
                "in {span}s with nothing changing: {} CiliumNode writes, {} mutating EC2 calls {:?}",
                after.0 - before.0,
                after.1 - before.1,
                after
                    .2
                    .iter()
                    .filter_map(|(op, n)| {
                        let was = before.2.get(op).copied().unwrap_or(0);
                        (*n > was).then(|| format!("{op} +{}", n - was))
                    })
                    .collect::<Vec<_>>()
            ),
        ));
    }
    Ok(())
}

/// Counters of the quiet check: CiliumNode writes, mutating calls, mutating calls by name.
pub type QuietCounters = (u64, u64, BTreeMap<&'static str, u64>);

/// Seeds listed one per line (`#` starts a comment).
pub fn seed_list(text: &str) -> Vec<u64> {
    text.lines()
        .filter_map(|l| l.split('#').next())
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_replays_the_same_trace() {
        let opts = Options {
            fault_minutes: 10,
            settle: Duration::from_secs(8 * 60),
        };
        let a = run_seed(3, &opts);
        let b = run_seed(3, &opts);
        assert!(a.trace.len() > 10, "{:?}", a.trace);
        // The seed's schedule (every harness event) replays exactly. The per-minute
        // observations show the operator's progress, which still moves by a pass between runs
        // while the queue's and the gate's retry jitter are not seeded (docs/testing.md, "Known
        // limit"); seed 3 with the API server's write faults and leadership showed a pool of 64
        // in one run and 48 in the other at one minute.
        let schedule = |o: &Outcome| -> Vec<String> {
            o.trace
                .iter()
                .filter(|l| !l.contains(" observe "))
                .cloned()
                .collect()
        };
        assert_eq!(schedule(&a), schedule(&b));
        assert_eq!(a.trace.len(), b.trace.len());
    }

    /// `make test`'s share: 20 seeds plus every seed that ever failed (dst/regressions.txt),
    /// on two threads. The seeds in dst/known-failing.txt are run by `make dst` only.
    #[test]
    fn twenty_seeds_and_the_regressions_hold_every_invariant() {
        let mut seeds: Vec<u64> = (1..=20).collect();
        seeds.extend(seed_list(include_str!("../regressions.txt")));
        let opts = Options::default();
        let (a, b): (Vec<u64>, Vec<u64>) = seeds.iter().partition(|s| s.is_multiple_of(2));
        let failed: Vec<String> = std::thread::scope(|s| {
            let run = |list: Vec<u64>| {
                s.spawn(move || {
                    list.into_iter()
                        .map(|seed| run_seed(seed, &opts))
                        .filter(|o| o.violation.is_some())
                        .map(|o| o.report(25))
                        .collect::<Vec<_>>()
                })
            };
            let (x, y) = (run(a), run(b));
            let mut f = x.join().expect("seeds a");
            f.extend(y.join().expect("seeds b"));
            f
        });
        assert!(failed.is_empty(), "{}", failed.join("\n"));
    }

    #[test]
    fn seed_lists_skip_comments() {
        assert_eq!(seed_list("# found by x\n7\n 12 # y\n\n"), vec![7, 12]);
    }
}
