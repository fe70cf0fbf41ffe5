//! `make bench`: the scale benchmark (see docs/benchmarks.md). Runs every scenario on a paused
//! current-thread tokio runtime (tokio's `test-util`, an ordinary dependency of this crate):
//! simulated time jumps ahead whenever every task waits, so rate limits and latencies hold in
//! simulated time and the run costs only CPU.
//!
//! The heap counting allocator and the SVG plots live here, in the benchmark's binary, so the
//! operator's library has no unsafe code and no plotting.

use std::time::Duration;

use bench::heap;
use bench::plot;
use bench::scenario::{
    BurstFlags, GateMode, Outcome, Settings, burst, churn, peak_rss_mib, scale_down, shared_account,
};
use bench::spell::{self, SpellCase, spell_table};
use bench::{Row, SharedRow, shared_table, table};
use clap::{Parser, ValueEnum};

// Counts heap bytes so each scenario can report the operator's share of the process.
#[global_allocator]
static ALLOCATOR: counting::CountingAllocator = counting::CountingAllocator;

/// The system allocator, counting live and peak bytes. Hand-written: the counting-allocator
/// crates checked either cannot reset the peak (`cap`, `stats_alloc` has no peak at all) or
/// turn every `realloc` into allocate + copy + free (`peak_alloc` 0.3), which would count a
/// growing buffer twice and change the heap figures.
mod counting {
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::sync::atomic::{AtomicUsize, Ordering};

    use bench::heap::HeapMeter;

    static LIVE: AtomicUsize = AtomicUsize::new(0);
    static PEAK: AtomicUsize = AtomicUsize::new(0);

    pub struct CountingAllocator;

    fn grew(bytes: usize) {
        let live = LIVE.fetch_add(bytes, Ordering::Relaxed) + bytes;
        PEAK.fetch_max(live, Ordering::Relaxed);
    }

    // SAFETY: every call is forwarded unchanged to `System`; only counters are added.
    unsafe impl GlobalAlloc for CountingAllocator {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            // SAFETY: same contract as the caller's.
            let p = unsafe { System.alloc(layout) };
            if !p.is_null() {
                grew(layout.size());
            }
            p
        }

        unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
            // SAFETY: same contract as the caller's.
            let p = unsafe { System.alloc_zeroed(layout) };
            if !p.is_null() {
                grew(layout.size());
            }
            p
        }

        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            // SAFETY: same contract as the caller's.
            unsafe { System.dealloc(ptr, layout) };
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        }

        unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            // SAFETY: same contract as the caller's.
            let p = unsafe { System.realloc(ptr, layout, new_size) };
            if !p.is_null() {
                LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
                grew(new_size);
            }
            p
        }
    }

    fn live_bytes() -> usize {
        LIVE.load(Ordering::Relaxed)
    }

    fn peak_bytes() -> usize {
        PEAK.load(Ordering::Relaxed)
    }

    fn reset_peak() {
        PEAK.store(live_bytes(), Ordering::Relaxed);
    }

    /// The counters, for the scenarios.
    pub const METER: HeapMeter = HeapMeter {
        live_bytes,
        peak_bytes,
        reset_peak,
    };
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Scenario {
    Burst,
    Churn,
    ScaleDown,
    SharedAccount,
    Spell,
    All,
}

#[derive(Parser, Debug)]
#[command(about = "Scale benchmark of the allocation core against the EC2 simulator")]
struct Args {
    /// Node counts of the burst scenario.
    #[arg(long, value_delimiter = ',', default_value = "100,1000,5000")]
    nodes: Vec<usize>,
    /// Node counts of the churn and scale-down scenarios (more than one shows how describe
    /// calls per minute depend on the node count).
    #[arg(long, value_delimiter = ',', default_value = "100,1000")]
    steady_nodes: Vec<usize>,
    /// Simulated minutes of churn.
    #[arg(long, default_value_t = 10)]
    churn_minutes: u32,
    #[arg(long, value_enum, default_value_t = Scenario::All)]
    scenario: Scenario,
    #[command(flatten)]
    burst: BurstFlags,
    #[arg(long, default_value = "m5.xlarge")]
    instance_type: String,
    #[arg(long, default_value_t = 1)]
    first_interface_index: i64,
    /// Node counts of the burst with the Cilium-like gate (default: the burst sizes up to 1000).
    #[arg(long, value_delimiter = ',')]
    cilium_nodes: Option<Vec<usize>>,
    /// Node count of the shared-account scenario.
    #[arg(long, default_value_t = 1000)]
    shared_nodes: usize,
    /// Shares of every AWS bucket another tenant of the account uses, one run each.
    #[arg(long, value_delimiter = ',', default_value = "0.5,0.7,0.9")]
    shares: Vec<f64>,
    /// Spells of another tenant (seconds at 90 % after emptying every bucket), one run each,
    /// and the share drop (90 % to 50 %). Every 5 s up to two minutes: recovery depends on
    /// where the spell's end falls between two probes, so the worst length is swept for.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "10,15,20,25,30,35,40,45,50,55,60,65,70,75,80,85,90,95,100,105,110,115,120,600"
    )]
    spells: Vec<u64>,
    /// Small sizes for a CI smoke run; writes no file (the documented figures stay).
    #[arg(long)]
    quick: bool,
    /// Write the results table (Markdown) here.
    #[arg(long)]
    out: Option<std::path::PathBuf>,
    /// Write the burst plot (SVG) here.
    #[arg(long)]
    plot: Option<std::path::PathBuf>,
    /// Write the shared-account plot (SVG) here.
    #[arg(long)]
    shared_plot: Option<std::path::PathBuf>,
}

const BEGIN: &str = "<!-- bench:begin -->";
const END: &str = "<!-- bench:end -->";
/// The shared-account results have markers of their own, so each part can be rerun alone.
const SHARED_BEGIN: &str = "<!-- bench:shared:begin -->";
const SHARED_END: &str = "<!-- bench:shared:end -->";
const SPELL_BEGIN: &str = "<!-- bench:spell:begin -->";
const SPELL_END: &str = "<!-- bench:spell:end -->";

/// [`splice`] the results into the document at `path` (created if missing).
fn splice_into(
    path: &std::path::Path,
    results: &str,
    begin: &str,
    end: &str,
) -> std::io::Result<()> {
    let existing = std::fs::read_to_string(path).ok();
    std::fs::write(path, splice(existing, results, begin, end))
}

/// Replace the part of an existing document between the markers (keeping the prose around it);
/// without markers the results are appended.
fn splice(existing: Option<String>, results: &str, begin: &str, end: &str) -> String {
    let doc = existing.unwrap_or_default();
    if let (Some(b), Some(e)) = (doc.find(begin), doc.find(end))
        && b < e
    {
        return format!("{}{begin}\n{results}{}", &doc[..b], &doc[e..]);
    }
    format!("{doc}{begin}\n{results}{end}\n")
}

const COLORS: [[u8; 3]; 8] = [
    [31, 119, 180],
    [255, 127, 14],
    [44, 160, 44],
    [214, 39, 40],
    [148, 103, 189],
    [140, 86, 75],
    [227, 119, 194],
    [127, 127, 127],
];

fn main() -> anyhow::Result<()> {
    let mut args = Args::parse();
    if args.quick {
        args.nodes = vec![10, 50];
        args.steady_nodes = vec![20];
        args.churn_minutes = 3;
        args.shared_nodes = 50;
        args.spells = vec![20];
        // The smoke run's figures are not the documented ones: print them, keep the docs.
        args.out = None;
        args.plot = None;
        args.shared_plot = None;
    }
    let settings = Settings {
        instance_type: args.instance_type.clone(),
        first_interface_index: args.first_interface_index,
        heap: Some(counting::METER),
        ..args.burst.settings()
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()?;
    let wall = std::time::Instant::now();
    let mut rows: Vec<Row> = Vec::new();
    let mut notes: Vec<String> = Vec::new();
    let mut curves: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    // One size in the plot, so the runs share a scale: the largest burst up to 1,000 nodes.
    let plot_size = args
        .nodes
        .iter()
        .copied()
        .filter(|n| *n <= 1000)
        .max()
        .or_else(|| args.nodes.iter().copied().min())
        .unwrap_or(0);
    let mut record = |mut out: Outcome, curve: bool| {
        eprintln!(
            "{} x {}: demand met {} in {:.1} s simulated ({:.0} s wall so far)",
            out.row.scenario,
            out.row.nodes,
            if out.all_met { "by all" } else { "NOT by all" },
            out.row.time.as_secs_f64(),
            wall.elapsed().as_secs_f64()
        );
        if !out.all_met {
            notes.push(format!(
                "{} x {}: NOT every node's demand was met within the limit",
                out.row.scenario, out.row.nodes
            ));
        }
        notes.extend(
            out.notes
                .iter()
                .map(|n| format!("{} nodes, {n}", out.row.nodes)),
        );
        if let Some(h) = out.heap {
            out.row.operator_heap_mib = Some(heap::mib(h.operator));
            notes.push(format!(
                "{} nodes, {}: heap at the end: operator {:.1} MiB (+{:.1} MiB while a full EC2 \
                 refresh runs), in-memory API server {:.1} MiB, simulator {:.1} MiB",
                out.row.nodes,
                out.row.scenario,
                heap::mib(h.operator),
                heap::mib(h.refresh_transient),
                heap::mib(h.api_server),
                heap::mib(h.simulator),
            ));
        }
        if curve && out.row.nodes == plot_size {
            curves.push((
                format!("{} x {}", out.row.scenario, out.row.nodes),
                out.waiting,
            ));
        }
        rows.push(out.row);
    };
    let run_burst = matches!(args.scenario, Scenario::Burst | Scenario::All);
    if run_burst {
        let cilium = args
            .cilium_nodes
            .clone()
            .unwrap_or_else(|| args.nodes.iter().copied().filter(|n| *n <= 1000).collect());
        for &n in &args.nodes {
            for prefix in [false, true] {
                record(
                    rt.block_on(burst(&settings, n, prefix, GateMode::AwsFull)),
                    true,
                );
            }
            if cilium.contains(&n) {
                record(
                    rt.block_on(burst(&settings, n, false, GateMode::CiliumLike)),
                    true,
                );
            }
        }
    }
    for &n in &args.steady_nodes {
        if matches!(args.scenario, Scenario::Churn | Scenario::All) {
            record(rt.block_on(churn(&settings, n, args.churn_minutes)), false);
        }
        if matches!(args.scenario, Scenario::ScaleDown | Scenario::All) {
            record(rt.block_on(scale_down(&settings, n)), false);
        }
    }

    let mut shared_rows: Vec<SharedRow> = Vec::new();
    let mut shared_notes: Vec<String> = Vec::new();
    let mut shared_curves: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    if matches!(args.scenario, Scenario::SharedAccount | Scenario::All) {
        for mode in [GateMode::Defaults, GateMode::CiliumLike] {
            for &share in &args.shares {
                let out = rt.block_on(shared_account(&settings, args.shared_nodes, share, mode));
                let r = &out.row;
                eprintln!(
                    "shared account, {}, other tenant {:.0} % x {}: {:.1} s simulated, bound \
                     {:.1} s, {:.2}x, throttled {} / {} ({:.0} s wall so far)",
                    r.gate,
                    share * 100.0,
                    r.nodes,
                    r.time.as_secs_f64(),
                    r.lower_bound.as_secs_f64(),
                    r.ratio(),
                    r.throttled,
                    r.calls,
                    wall.elapsed().as_secs_f64()
                );
                shared_curves.push((
                    format!("{}, other tenant {:.0} %", r.gate, share * 100.0),
                    out.waiting,
                ));
                shared_notes.extend(out.notes);
                shared_rows.push(out.row);
            }
        }
    }
    if !shared_rows.is_empty() {
        let tbl = shared_table(&shared_rows);
        println!("{tbl}");
        for n in &shared_notes {
            println!("- {n}");
        }
        let legend = legend_of(&shared_curves);
        if let Some(path) = &args.out {
            let mut md = format!("{tbl}\n");
            for n in &shared_notes {
                md.push_str(&format!("- {n}\n"));
            }
            md.push_str(&plot_caption(&shared_curves, args.shared_nodes, &legend));
            splice_into(path, &md, SHARED_BEGIN, SHARED_END)?;
        }
        if let Some(path) = &args.shared_plot {
            write_plot(path, &shared_curves, args.shared_nodes, &legend)?;
        }
    }
    if matches!(args.scenario, Scenario::Spell | Scenario::All) {
        let cases = args
            .spells
            .iter()
            .map(|d| SpellCase::spell(Duration::from_secs(*d)))
            .chain([SpellCase::share_drop()]);
        let mut spell_rows = Vec::new();
        for case in cases {
            let r = rt.block_on(spell::run(&settings, &case));
            eprintln!(
                "{}: recovered after {:?}, rates at their ceiling after {:?} (target {:?}), \
                 throttled {:?} ({:.0} s wall so far)",
                r.case,
                r.recovered,
                r.at_ceiling,
                r.target,
                r.throttled,
                wall.elapsed().as_secs_f64()
            );
            spell_rows.push(r);
        }
        let tbl = spell_table(&spell_rows);
        println!("{tbl}");
        if let Some(path) = &args.out {
            splice_into(path, &tbl, SPELL_BEGIN, SPELL_END)?;
        }
    }
    if rows.is_empty() {
        eprintln!("wall time {:.0} s", wall.elapsed().as_secs_f64());
        return Ok(());
    }

    let tbl = table(&rows);
    println!("{tbl}");
    for n in &notes {
        println!("- {n}");
    }
    println!(
        "\nwall time {:.0} s; peak RSS of the whole benchmark process {:.0} MiB; settings: {} \
         (first-interface-index {}), {} addresses per node, mutating latency {} ms, describe \
         latency {} ms",
        wall.elapsed().as_secs_f64(),
        peak_rss_mib().unwrap_or(0.0),
        settings.instance_type,
        settings.first_interface_index,
        settings.ips_per_node,
        args.burst.mutating_latency_ms,
        args.burst.describe_latency_ms
    );
    let legend = legend_of(&curves);
    if let Some(path) = &args.out {
        let mut md = format!("{tbl}\n");
        for n in &notes {
            md.push_str(&format!("- {n}\n"));
        }
        md.push_str(&plot_caption(&curves, plot_size, &legend));
        splice_into(path, &md, BEGIN, END)?;
    }
    if let Some(path) = &args.plot {
        write_plot(path, &curves, plot_size, &legend)?;
    }
    Ok(())
}

type Curves = [(String, Vec<(f64, f64)>)];

fn legend_of(curves: &Curves) -> Vec<String> {
    curves
        .iter()
        .zip(COLORS.iter().cycle())
        .map(|((name, _), c)| format!("- rgb({},{},{}): {name}", c[0], c[1], c[2]))
        .collect()
}

fn plot_caption(curves: &Curves, nodes: usize, legend: &[String]) -> String {
    let max_t = curves
        .iter()
        .flat_map(|(_, pts)| pts.iter().map(|p| p.0))
        .fold(0.0, f64::max);
    format!(
        "\nPlot: x = simulated seconds from 0 to {max_t:.0} (grid every tenth), y = nodes still \
         waiting, 0 to {nodes}. Colours:\n{}\n",
        legend.join("\n")
    )
}

fn write_plot(
    path: &std::path::Path,
    curves: &Curves,
    nodes: usize,
    legend: &[String],
) -> anyhow::Result<()> {
    let series: Vec<plot::Series> = curves
        .iter()
        .zip(COLORS.iter().cycle())
        .map(|((name, points), c)| plot::Series {
            name,
            color: *c,
            points,
        })
        .collect();
    let y_desc = format!("nodes still waiting (of {nodes})");
    std::fs::write(
        path,
        plot::svg((900, 450), "simulated seconds", &y_desc, &series)?,
    )?;
    eprintln!("plot written to {}", path.display());
    for l in legend {
        eprintln!("{l}");
    }
    Ok(())
}
