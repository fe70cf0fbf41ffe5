//! eni-operator end-to-end suite.
//!
//! * `run [--scenario NAME]...`: seeds EC2, runs the scenarios against the current KUBECONFIG,
//!   prints `PASS|FAIL <name> <seconds>s` per scenario and `N passed, M failed`.
//! * `agents --count N --generation classic|multi-pool --pods-script 0:10,60:30`: plays N
//!   agents on existing CiliumNodes.
//! * `filter-manifests --kinds A,B FILE...`: prints the YAML documents of the given kinds (the
//!   local mode applies only the Namespace, ServiceAccount and RBAC from `manifests/`).

mod checks;
mod cilium_op;
mod ec2seed;
mod faultproxy;
mod kube_agent;
mod operator;
mod other_alloc;
mod prom_compare;
mod scenarios;
mod simctl;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use eni_operator::crd::CiliumNode;
use kube::api::{Api, ListParams};

use crate::kube_agent::{PodsScript, spawn_agent};
use crate::operator::{Mode, OperatorSettings, Operators};
use crate::scenarios::{Suite, SuiteConfig};
use testkit::agent::Generation;

#[derive(Parser)]
#[command(
    name = "eni-operator-e2e",
    about = "End-to-end suite and Cilium agent simulator for eni-operator"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the scenarios.
    Run(Box<RunArgs>),
    /// Play N agents against the current KUBECONFIG.
    Agents(AgentsArgs),
    /// Seed the EC2 endpoint only and print what was made (a check of the endpoint).
    Seed {
        #[arg(long, env = "EC2_ENDPOINT")]
        ec2_endpoint: String,
        #[arg(long, env = "AWS_REGION", default_value = "us-east-1")]
        region: String,
    },
    /// Print the YAML documents of the given kinds.
    FilterManifests {
        #[arg(long, value_delimiter = ',')]
        kinds: Vec<String>,
        files: Vec<PathBuf>,
    },
}

#[derive(clap::Args)]
struct RunArgs {
    /// Scenarios to run (repeatable); all when absent.
    #[arg(long = "scenario")]
    scenarios: Vec<String>,
    /// Cluster name given to the operator; our ENIs carry it as eni-operator.io/cluster-name.
    #[arg(long, default_value = "e2e")]
    cluster_name: String,
    /// EC2 endpoint the suite seeds (and, in local mode, the operator uses).
    #[arg(long, env = "EC2_ENDPOINT")]
    ec2_endpoint: String,
    /// EC2 endpoint as seen by the operator, when it differs (in-cluster: the LocalStack service).
    #[arg(long, env = "E2E_OPERATOR_EC2_ENDPOINT")]
    operator_ec2_endpoint: Option<String>,
    #[arg(long, env = "AWS_REGION", default_value = "us-east-1")]
    region: String,
    /// Use the in-cluster Deployment instead of local processes.
    #[arg(long)]
    in_cluster: bool,
    #[arg(long, default_value = "eni-operator")]
    deployment: String,
    #[arg(long, default_value = "eni-operator")]
    namespace: String,
    #[arg(long, default_value = "eni-operator")]
    service_account: String,
    #[arg(long, env = "E2E_LEASE_NAME", default_value = "eni-operator")]
    lease_name: String,
    /// The operator binary (local mode).
    #[arg(long, env = "ENI_OPERATOR_BIN")]
    operator_bin: Option<PathBuf>,
    /// Kubeconfig the local operators use: the ServiceAccount's (see run-local.sh).
    #[arg(long, env = "E2E_OPERATOR_KUBECONFIG")]
    operator_kubeconfig: Option<PathBuf>,
    /// Where the local operators' logs go.
    #[arg(long, env = "E2E_WORK_DIR", default_value = "e2e/.work")]
    work_dir: PathBuf,
    /// Budget in seconds of each wait.
    #[arg(long, default_value_t = 300)]
    timeout: u64,
    /// `--node-resync-interval` / `--ec2-resync-interval` given to the operator, seconds.
    #[arg(long, default_value_t = 5)]
    resync: u64,
    /// `--eni-gc-interval` given to the operator, seconds.
    #[arg(long, default_value_t = 10)]
    gc: u64,
    /// The operator's leader lease duration, seconds.
    #[arg(long, default_value_t = 15)]
    lease: u64,
    /// Duration syntax of the operator's interval flags: `suffix` (5s) or `seconds` (5).
    #[arg(long, env = "E2E_DURATION_STYLE", default_value = "suffix")]
    duration_style: String,
    /// Extra operator arguments, whitespace-separated (local mode).
    #[arg(long, env = "E2E_OPERATOR_ARGS", default_value = "")]
    operator_args: String,
}

#[derive(clap::Args)]
struct AgentsArgs {
    #[arg(long)]
    count: usize,
    #[arg(long, value_parser = parse_generation)]
    generation: Generation,
    #[arg(long)]
    pods_script: String,
    /// Only CiliumNodes matching this label selector.
    #[arg(long, default_value = "")]
    selector: String,
    /// Seconds to keep playing after the script's last step.
    #[arg(long, default_value_t = 60)]
    hold: u64,
}

fn parse_generation(s: &str) -> Result<Generation, String> {
    Generation::parse(s).ok_or_else(|| format!("{s:?}: expected classic or multi-pool"))
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,kube=warn,aws=warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let res = match Cli::parse().cmd {
        Cmd::Run(a) => run(*a).await,
        Cmd::Agents(a) => agents(a).await,
        Cmd::Seed {
            ec2_endpoint,
            region,
        } => seed(ec2_endpoint, region).await,
        Cmd::FilterManifests { kinds, files } => filter_manifests(&kinds, &files),
    };
    match res {
        Ok(true) => std::process::ExitCode::SUCCESS,
        Ok(false) => std::process::ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(a: RunArgs) -> Result<bool> {
    let names: Vec<String> = if a.scenarios.is_empty() {
        let ec2_sim = simctl::SimControl::connect(&a.ec2_endpoint).await.is_ok();
        scenarios::ALL
            .iter()
            .filter(|s| !scenarios::ON_REQUEST.contains(s))
            .filter(|s| !(a.in_cluster && scenarios::LOCAL_ONLY.contains(s)))
            .filter(|s| ec2_sim || !scenarios::SIM_ONLY.contains(s))
            .filter(|s| !(ec2_sim && scenarios::NOT_ON_SIM.contains(s)))
            .filter(|s| {
                let run = !scenarios::NEEDS_HELM.contains(s) || std::env::var_os("HELM").is_some();
                if !run {
                    println!("NOT RUN {s}: HELM is not set (the path of a helm binary)");
                }
                run
            })
            .map(|s| s.to_string())
            .collect()
    } else {
        a.scenarios.clone()
    };
    if let Some(bad) = names.iter().find(|n| !scenarios::ALL.contains(&n.as_str())) {
        bail!(
            "unknown scenario {bad:?} (known: {})",
            scenarios::ALL.join(", ")
        );
    }
    let kube = kube::Client::try_default().await.context("KUBECONFIG")?;
    let target = ec2seed::Ec2Target {
        endpoint: a.ec2_endpoint.clone(),
        region: a.region.clone(),
    };
    let ec2 = ec2seed::client(&target).await;
    let run_id = format!(
        "{:x}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_secs()
            % 0xffffff
    );
    let mut world = ec2seed::World::seed(&ec2, &run_id)
        .await
        .context("seeding EC2")?;
    world.cluster_name = a.cluster_name.clone();
    tracing::info!(run_id, vpc = %world.vpc_id, zones = ?world.zones, "EC2 seeded");

    let settings = OperatorSettings {
        cluster_name: a.cluster_name.clone(),
        namespace: a.namespace.clone(),
        lease_name: a.lease_name.clone(),
        ec2_endpoint: a
            .operator_ec2_endpoint
            .clone()
            .unwrap_or_else(|| a.ec2_endpoint.clone()),
        region: a.region.clone(),
        resync_secs: a.resync,
        gc_secs: a.gc,
        duration_style: a.duration_style.clone(),
        extra_args: a
            .operator_args
            .split_whitespace()
            .map(String::from)
            .collect(),
    };
    let mode = if a.in_cluster {
        Mode::InCluster {
            deployment: a.deployment.clone(),
        }
    } else {
        let bin = a
            .operator_bin
            .clone()
            .context("local mode needs ENI_OPERATOR_BIN")?;
        Mode::Local {
            bin,
            kubeconfig: a.operator_kubeconfig.clone(),
            log_dir: a.work_dir.join("logs"),
        }
    };
    let ops = Operators::new(settings, mode, kube.clone());
    let cfg = SuiteConfig {
        cluster_name: a.cluster_name.clone(),
        service_account: a.service_account.clone(),
        timeout: Duration::from_secs(a.timeout),
        resync: Duration::from_secs(a.resync),
        gc: Duration::from_secs(a.gc),
        lease: Duration::from_secs(a.lease),
        agent_period: Duration::from_secs(1),
    };
    let mut suite = Suite::new(kube, ec2.clone(), world, ops, cfg);
    // Start from a stopped operator (in-cluster: the Deployment is scaled per scenario).
    suite.ops.stop_all().await?;

    let (mut passed, mut failed) = (0, 0);
    for name in &names {
        let t0 = Instant::now();
        let res = suite.run(name).await;
        let secs = t0.elapsed().as_secs_f64();
        match res {
            Ok(()) => {
                passed += 1;
                println!("PASS {name} {secs:.1}s");
            }
            Err(e) => {
                failed += 1;
                println!("FAIL {name} {secs:.1}s");
                println!("     {e:#}");
            }
        }
    }
    if let Err(e) = suite.purge().await {
        tracing::warn!("purge: {e:#}");
    }
    suite.world.terminate_all(&ec2).await;
    println!("{passed} passed, {failed} failed");
    Ok(failed == 0)
}

async fn seed(endpoint: String, region: String) -> Result<bool> {
    let ec2 = ec2seed::client(&ec2seed::Ec2Target { endpoint, region }).await;
    let mut world = ec2seed::World::seed(&ec2, "seed-check").await?;
    for (t, z) in [
        ("m5.large", 0),
        ("t3.large", 1),
        ("m5.xlarge", 0),
        ("c5.xlarge", 1),
    ] {
        let inst = world.launch(&ec2, t, z).await?;
        let enis = ec2seed::instance_enis(&ec2, &inst.id).await?;
        println!("{inst:?}: ENIs {enis:?}");
        if enis.len() != 1 || enis[0].device_index != Some(0) {
            bail!("{}: expected one primary ENI at device index 0", inst.id);
        }
    }
    println!("{world:#?}");
    // The queries the assertions rely on, against an ENI made the way the operator makes them.
    let inst = world.instances[0].clone();
    let cluster = format!("seed-check-{}", std::process::id());
    let eni = ec2seed::create_owned_eni(&ec2, &world, &inst, &cluster, 3).await?;
    let owned = ec2seed::owned_enis(&ec2, &cluster).await?;
    println!("owned: {owned:?}");
    if owned.len() != 1
        || owned[0].id != eni
        || owned[0].status != "in-use"
        || owned[0].instance_id.as_deref() != Some(inst.id.as_str())
        || owned[0].device_index != Some(1)
        || owned[0].addresses.len() != 3
    {
        bail!("the endpoint does not answer the ownership-tag query as expected: {owned:?}");
    }
    if ec2seed::instance_enis(&ec2, &inst.id).await?.len() != 2 {
        bail!("attachment.instance-id filter: expected the primary and the new ENI");
    }
    ec2seed::delete_eni(&ec2, &eni).await?;
    if !ec2seed::owned_enis(&ec2, &cluster).await?.is_empty() {
        bail!("{eni} still listed after deletion");
    }
    world.terminate_all(&ec2).await;
    println!("EC2 endpoint OK");
    Ok(true)
}

async fn agents(a: AgentsArgs) -> Result<bool> {
    let script = PodsScript::parse(&a.pods_script).map_err(anyhow::Error::msg)?;
    let kube = kube::Client::try_default().await.context("KUBECONFIG")?;
    let api: Api<CiliumNode> = Api::all(kube.clone());
    let mut names: Vec<String> = api
        .list(&ListParams::default().labels(&a.selector))
        .await?
        .items
        .into_iter()
        .filter_map(|c| c.metadata.name)
        .collect();
    names.sort();
    names.truncate(a.count);
    if names.len() < a.count {
        bail!(
            "only {} CiliumNodes match {:?}, {} wanted",
            names.len(),
            a.selector,
            a.count
        );
    }
    let handles: Vec<_> = names
        .iter()
        .map(|n| {
            spawn_agent(
                kube.clone(),
                n.clone(),
                a.generation,
                script.pods_at(0),
                Duration::from_secs(1),
            )
        })
        .collect();
    let t0 = Instant::now();
    let end = script.last_change() + a.hold;
    loop {
        let elapsed = t0.elapsed().as_secs();
        for h in &handles {
            if h.pods() != script.pods_at(elapsed) {
                h.set_pods(script.pods_at(elapsed));
            }
        }
        if elapsed.is_multiple_of(10) {
            for h in &handles {
                let r = h.report();
                println!(
                    "{:>5}s {} {}: pods {}, in use {}, unsatisfied {}, writes {}, violations {}",
                    elapsed,
                    h.node,
                    h.generation,
                    r.pods,
                    r.used.len(),
                    r.unsatisfied,
                    r.writes,
                    r.violations.len()
                );
            }
        }
        if elapsed >= end {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let mut ok = true;
    for h in &handles {
        h.stop();
        for v in h.report().violations {
            ok = false;
            println!("VIOLATION {v}");
        }
    }
    Ok(ok)
}

/// The YAML documents of `text` whose `kind` is in `kinds`, re-serialised.
fn filter_docs(text: &str, kinds: &[String]) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for v in serde_saphyr::from_multiple::<serde_json::Value>(text)? {
        let kind = v.get("kind").and_then(|k| k.as_str()).unwrap_or_default();
        if kinds.iter().any(|k| k == kind) {
            out.push(serde_saphyr::to_string(&v)?);
        }
    }
    Ok(out)
}

fn filter_manifests(kinds: &[String], files: &[PathBuf]) -> Result<bool> {
    let mut docs = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(f).with_context(|| f.display().to_string())?;
        docs.extend(filter_docs(&text, kinds).with_context(|| f.display().to_string())?);
    }
    print!("{}", docs.join("---\n"));
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filter_docs_keeps_only_the_requested_kinds() {
        let text = "kind: Namespace\nmetadata: {name: a}\n---\nkind: Deployment\nmetadata: {name: b}\n---\n# empty\n---\nkind: ClusterRole\nmetadata: {name: c}\n";
        let kinds = vec!["Namespace".to_string(), "ClusterRole".to_string()];
        let docs = filter_docs(text, &kinds).unwrap();
        assert_eq!(docs.len(), 2);
        assert!(docs[0].contains("name: a"));
        assert!(docs[1].contains("name: c"));
        assert!(filter_docs("kind: [", &kinds).is_err());
    }

    #[test]
    fn cli_parses_run_and_agents() {
        let cli = Cli::try_parse_from([
            "e2e",
            "run",
            "--scenario",
            "rbac",
            "--scenario",
            "bad-input",
            "--ec2-endpoint",
            "http://x",
        ])
        .unwrap();
        match cli.cmd {
            Cmd::Run(a) => assert_eq!(a.scenarios, vec!["rbac", "bad-input"]),
            _ => panic!("not run"),
        }
        let cli = Cli::try_parse_from([
            "e2e",
            "agents",
            "--count",
            "3",
            "--generation",
            "multi-pool",
            "--pods-script",
            "0:10,60:30,120:5",
        ])
        .unwrap();
        match cli.cmd {
            Cmd::Agents(a) => {
                assert_eq!(a.count, 3);
                assert_eq!(a.generation, Generation::MultiPool);
            }
            _ => panic!("not agents"),
        }
        assert!(
            Cli::try_parse_from([
                "e2e",
                "agents",
                "--count",
                "1",
                "--generation",
                "x",
                "--pods-script",
                "0:1"
            ])
            .is_err()
        );
    }

    #[test]
    fn every_scenario_name_is_dispatched() {
        // The dispatcher in Suite::run matches these literally; a typo would only show on a cluster.
        let src = include_str!("scenarios.rs");
        for name in scenarios::ALL {
            assert!(
                src.contains(&format!("\"{name}\" => self.")),
                "{name} not dispatched"
            );
        }
    }
}
