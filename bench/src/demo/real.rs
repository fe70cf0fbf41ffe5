//! The real back-end: the operator binary against a real control plane (etcd, kube-apiserver,
//! kube-controller-manager from `KUBEBUILDER_ASSETS`) and ec2-sim (AWS's buckets, 300 ms per
//! mutating call, 150 ms per describe), as `make bench-process` runs them ([`crate::cluster`]).
//! The agents write over the API server; real time.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use eni_operator::crd::CiliumNode;
use kube::api::{Api, Patch, PatchParams};
use serde_json::Value;
use testkit::agent::Step;
use testkit::control_plane::{ControlPlane, assets_from_env};

use super::drive::{Backend, Outcome, drive};
use super::plan::Plan;
use super::view::View;
use crate::cluster::{self, Http, Proc, World};
use crate::process::parse_sim_stats;

const MUTATING_LATENCY_MS: u64 = 300;
const DESCRIBE_LATENCY_MS: u64 = 150;

/// The binaries the real back-end runs.
#[derive(Clone, Debug)]
pub struct Binaries {
    pub operator: PathBuf,
    pub ec2_sim: PathBuf,
}

/// The running world as the driver sees it.
struct Real {
    kube: kube::Client,
    world: World,
    joined: usize,
    /// The latest version of every CiliumNode, from one watch.
    latest: Arc<Mutex<HashMap<String, CiliumNode>>>,
    http: Http,
    sim: String,
}

impl Backend for Real {
    async fn join(&mut self, name: &str) -> Result<()> {
        let instance = self
            .world
            .instances
            .get(self.joined)
            .context("an instance for every node")?
            .clone();
        self.joined += 1;
        let uid = cluster::create_node(&self.kube, name, &instance).await?;
        cluster::create_ciliumnode(&self.kube, &self.world, name, &instance, uid, 0).await
    }

    fn latest(&self, name: &str) -> Option<CiliumNode> {
        self.latest.lock().expect("poisoned").get(name).cloned()
    }

    async fn write(&mut self, name: &str, step: &Step) -> Result<()> {
        let api: Api<CiliumNode> = Api::all(self.kube.clone());
        let pp = PatchParams::default();
        let mut wrote_spec = false;
        if let Some(spec) = &step.spec_patch {
            wrote_spec = conflict_is_fine(api.patch(name, &pp, &Patch::Merge(spec)).await)?;
        }
        if let Some(status) = &step.status_patch {
            // The spec write moved the resourceVersion the status patch was made against.
            let status = if wrote_spec {
                without_metadata(status.clone())
            } else {
                status.clone()
            };
            conflict_is_fine(api.patch_status(name, &pp, &Patch::Merge(&status)).await)?;
        }
        Ok(())
    }

    async fn ec2(&self) -> Result<BTreeMap<String, (u64, u64)>> {
        let stats: Value =
            serde_json::from_str(&self.http.get(&format!("{}/_sim/stats", self.sim)).await?)?;
        // The view counts calls and throttled answers; failed ones show in the operator's log.
        Ok(parse_sim_stats(&stats)
            .into_iter()
            .map(|(action, (calls, throttled, _failed))| (action, (calls, throttled)))
            .collect())
    }

    async fn other_tenant(&mut self, share: f64, empty: bool) -> Result<()> {
        let url = format!("{}/_sim/other-tenant?share={share}&empty={empty}", self.sim);
        let (status, body) = self.http.send("POST", &url, String::new()).await?;
        ensure!(status == 204, "{url}: {status} {body}");
        Ok(())
    }

    /// The played agents create no Pod objects, so the real operator's Pod watch sees none
    /// here: its passes are urgent only for nodes with no free address.
    async fn pods_waiting(&mut self, _: &str, _: usize) -> Result<()> {
        Ok(())
    }
}

/// A write refused for a stale resourceVersion (the operator wrote meanwhile) is not an error:
/// the agent looks again at the next version, as Cilium's agents do. Whether it was written.
fn conflict_is_fine(r: kube::Result<CiliumNode>) -> Result<bool> {
    match r {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
        Err(e) => Err(e.into()),
    }
}

fn without_metadata(mut patch: Value) -> Value {
    if let Some(o) = patch.as_object_mut() {
        o.remove("metadata");
    }
    patch
}

/// The operator's flags: release-excess on with the plan's delay, the plan's re-plan interval
/// (a release starts on one); no Cilium operator in this cluster.
fn operator_flags(plan: &Plan) -> Vec<String> {
    vec![
        "--aws-release-excess-ips".into(),
        format!("--excess-ip-release-delay={}", plan.release_delay.as_secs()),
        format!("--node-resync-interval={}s", plan.rescan.as_secs()),
    ]
}

/// Run `plan` against the real processes (from the main thread: the children's
/// PR_SET_PDEATHSIG follows the thread that starts them). Logs go to `log_dir`.
pub fn run(
    plan: &Plan,
    bin: &Binaries,
    view: &mut dyn View,
    log_dir: &std::path::Path,
) -> Result<Outcome> {
    ensure!(
        plan.instance_type == cluster::INSTANCE_TYPE
            && plan.first_interface_index == cluster::FIRST_INTERFACE_INDEX,
        "the plan's nodes are the cluster's"
    );
    for (what, path) in [("the operator", &bin.operator), ("ec2-sim", &bin.ec2_sim)] {
        ensure!(
            path.is_file(),
            "{what}: {} not found (cargo build --workspace --all-targets)",
            path.display()
        );
    }
    let assets = assets_from_env().context("KUBEBUILDER_ASSETS is not set")?;
    std::fs::create_dir_all(log_dir)?;
    let mut cp = ControlPlane::start(&assets).context("starting the control plane")?;
    let mut sim = Proc::ec2_sim(
        &bin.ec2_sim,
        MUTATING_LATENCY_MS,
        DESCRIBE_LATENCY_MS,
        log_dir,
    )?;
    let endpoint = sim.endpoint.clone().context("ec2-sim's endpoint")?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let kubeconfig = cp.kubeconfig();
    let result = rt
        .block_on(cluster::prepare(&kubeconfig, &endpoint, plan.nodes()))
        .and_then(|(kube, world)| {
            let op = Proc::operator(
                &bin.operator,
                &kubeconfig,
                &endpoint,
                log_dir,
                &operator_flags(plan),
            )?;
            let r = rt.block_on(async {
                let http = Http::new();
                let metrics = op.endpoint.clone().context("metrics address")?;
                cluster::wait_leader(&http, &metrics, op.pid()).await?;
                let latest: Arc<Mutex<HashMap<String, CiliumNode>>> = Arc::default();
                let watch = {
                    let latest = latest.clone();
                    tokio::spawn(cluster::watch_ciliumnodes(kube.clone(), move |cn| {
                        if let Some(name) = cn.metadata.name.clone() {
                            latest.lock().expect("poisoned").insert(name, cn);
                        }
                    }))
                };
                let mut real = Real {
                    kube,
                    world,
                    joined: 0,
                    latest,
                    http,
                    sim: endpoint.clone(),
                };
                let chain = Duration::from_millis(DESCRIBE_LATENCY_MS + 3 * MUTATING_LATENCY_MS);
                let r = drive(&mut real, plan, view, None, chain).await;
                watch.abort();
                r
            });
            drop(op);
            r
        });
    drop(rt);
    sim.stop();
    cp.stop();
    result
}
