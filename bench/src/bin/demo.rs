//! `make demo`: the operator doing its job with nothing else installed (see `bench::demo`).
//! Without `KUBEBUILDER_ASSETS`, the operator's core against the EC2 simulator and the
//! in-memory API server on a paused clock, paced to about a minute; with it, the operator
//! binary against a real control plane and ec2-sim, in real time.

use std::path::PathBuf;

use anyhow::{Context, Result, ensure};
use bench::demo::{self, memory, plan::Plan, real, view};
use clap::{Parser, ValueEnum};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum BackendArg {
    /// `process` when KUBEBUILDER_ASSETS is set, else `memory`.
    Auto,
    Memory,
    Process,
}

#[derive(Parser, Debug)]
#[command(
    about = "The operator at work: nodes joining in waves, demand rising and falling, a throttled account"
)]
struct Args {
    #[arg(long, value_enum, default_value_t = BackendArg::Auto)]
    backend: BackendArg,
    /// The short run of the tests (30 nodes; in memory, as fast as the CPU allows).
    #[arg(long)]
    quick: bool,
    /// In memory: simulated seconds per real second (0: as fast as the CPU allows).
    #[arg(long, default_value_t = 6.0)]
    speed: f64,
    /// Write the plot (SVG) here.
    #[arg(long, default_value = "target/demo.svg")]
    plot: PathBuf,
    /// Write the figures (JSON) here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// The operator binary (process back-end; default: next to this program).
    #[arg(long)]
    operator: Option<PathBuf>,
    /// The ec2-sim binary (process back-end; default: next to this program).
    #[arg(long)]
    ec2_sim: Option<PathBuf>,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let process = match args.backend {
        BackendArg::Auto => std::env::var_os("KUBEBUILDER_ASSETS").is_some_and(|v| !v.is_empty()),
        BackendArg::Memory => false,
        BackendArg::Process => true,
    };
    let plan = match (args.quick, process) {
        (true, _) => Plan::quick(),
        (false, true) => Plan::real(),
        (false, false) => Plan::full(),
    };
    let (outcome, backend, seconds) = if process {
        let here = std::env::current_exe()?;
        let dir = here.parent().context("the program's directory")?;
        let bin = real::Binaries {
            operator: args
                .operator
                .clone()
                .unwrap_or_else(|| dir.join("eni-operator")),
            ec2_sim: args.ec2_sim.clone().unwrap_or_else(|| dir.join("ec2-sim")),
        };
        let log_dir =
            std::env::temp_dir().join(format!("eni-operator-demo-{}", std::process::id()));
        println!(
            "demo: logs of the operator and ec2-sim in {}",
            log_dir.display()
        );
        let mut v = view::for_stdout(plan.nodes(), 10.0);
        let o = real::run(&plan, &bin, v.as_mut(), &log_dir)?;
        let _ = std::fs::remove_dir_all(&log_dir);
        (
            o,
            "real processes: the operator binary, kube-apiserver and etcd, ec2-sim",
            "seconds",
        )
    } else {
        let pace = (!args.quick && args.speed > 0.0).then(|| 1.0 / args.speed);
        let mut v = view::for_stdout(plan.nodes(), 10.0);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()?;
        let o = rt.block_on(memory::run(&plan, v.as_mut(), pace))?;
        (
            o,
            "in memory: the operator's core, the EC2 simulator, the in-memory API server",
            "simulated seconds",
        )
    };
    println!();
    for line in demo::summary(&outcome, backend) {
        println!("{line}");
    }
    if let Some(dir) = args.plot.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&args.plot, demo::plot_svg(&outcome, seconds)?)
        .with_context(|| format!("writing {}", args.plot.display()))?;
    println!(
        "plot: {} (nodes served against the rate-limit bound)",
        args.plot.display()
    );
    if let Some(path) = &args.json {
        std::fs::write(
            path,
            serde_json::to_string_pretty(&demo::summary_json(&outcome, backend))?,
        )?;
    }
    ensure!(outcome.figures.waiting() == 0, "nodes still waiting");
    Ok(())
}
