//! `make dst`: run seeds of the deterministic simulation, two at a time (each on its own
//! single-threaded paused runtime, so parallelism does not touch determinism).
//!
//! `dst --seed N` replays one seed with its whole trace; `dst --seeds N` runs seeds 1..=N plus
//! every seed listed with `--also FILE` (regressions). Last line: `dst: N seeds, M violations`.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use dst::{Options, Outcome, run_seed};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let value = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    if args.iter().any(|a| a == "--list-mutants") {
        for m in eni_operator::mutants::ALL {
            println!("{m}");
        }
        return;
    }
    let mut seeds: Vec<u64> = Vec::new();
    let single = value("--seed").map(|s| s.parse::<u64>().expect("--seed takes a number"));
    if let Some(s) = single {
        seeds.push(s);
    } else {
        let n: u64 = value("--seeds").map_or(20, |s| s.parse().expect("--seeds takes a number"));
        seeds.extend(1..=n);
        for file in args
            .iter()
            .enumerate()
            .filter(|(_, a)| *a == "--also")
            .filter_map(|(i, _)| args.get(i + 1))
        {
            seeds.extend(dst::seed_list(
                &std::fs::read_to_string(file).unwrap_or_default(),
            ));
        }
    }
    // `DST_LOG=eni_operator=debug make dst SEED=n`: the operator's own log of a replay.
    if let Ok(filter) = std::env::var("DST_LOG") {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .without_time()
            .init();
    }
    if std::env::var_os("ENI_DST_MUTANT").is_some() && !eni_operator::mutants::COMPILED {
        eprintln!("ENI_DST_MUTANT is set but this build has no planted defects (make dst-mutants)");
        std::process::exit(2);
    }
    // A mutant run stops at its first violation: one is all it takes to catch it.
    let stop_at_first = args.iter().any(|a| a == "--stop-at-first");
    let stop = std::sync::atomic::AtomicBool::new(false);
    let jobs: usize = value("--jobs").map_or(2, |s| s.parse().expect("--jobs takes a number"));
    let opts = Options::default();
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Outcome>> = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..jobs.max(1) {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(&seed) = seeds.get(i) else { break };
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let out = run_seed(seed, &opts);
                    if out.violation.is_some() {
                        eprintln!("{}", out.report(25));
                        if stop_at_first {
                            stop.store(true, Ordering::Relaxed);
                        }
                    }
                    results.lock().expect("results").push(out);
                }
            });
        }
    });
    let results = results.into_inner().expect("results");
    if single.is_some() {
        for o in &results {
            for line in &o.trace {
                println!("{line}");
            }
            println!(
                "trace hash {:016x}, {} simulated s",
                o.trace_hash, o.simulated
            );
        }
    }
    let violations = results.iter().filter(|o| o.violation.is_some()).count();
    let mut failed: Vec<u64> = results
        .iter()
        .filter(|o| o.violation.is_some())
        .map(|o| o.seed)
        .collect();
    failed.sort_unstable();
    if !failed.is_empty() {
        println!("failed seeds: {failed:?}");
    }
    println!("dst: {} seeds, {violations} violations", results.len());
    if violations > 0 {
        std::process::exit(1);
    }
}
