//! What Cilium's real 1.20 operator does beside ours once the handover is over (issue 39 item
//! 3), run on request only (`--scenario NAME`; minutes of watching, not a CI check):
//!
//! - `cilium-frozen-copy`: a node Cilium's leader served first, then annotated (by ours, as
//!   without the chart's policy) and taken over by ours without Cilium restarting (ours started
//!   with `--watch-cilium-lease=false`, so only managedFields and Cilium-made ENIs hold it
//!   back). Cilium's node manager keeps its frozen copy; over [`WATCH`] (three of its one-minute
//!   resyncs) while the node's demand rises, then again while it falls and ours releases, the
//!   probe records Cilium's EC2 calls for the node (ec2-sim's per-client record), its writes
//!   (managedFields times), the pool's size and ours' operator-status.
//! - `cilium-ipam-crd`: Cilium's operator started with `--ipam=crd` (agents untouched: still ENI
//!   mode) and `--remove-cilium-node-taints=true`: does it run, hold its Lease, remove
//!   `node.cilium.io/agent-not-ready` once the node's Cilium pod is ready, and leave an
//!   unannotated node's ENIs and CiliumNode alone, so ours serves every node with no annotation?
//!
//! Each prints what it saw and fails only when the behaviour the docs rely on changed. A child
//! module of `scenarios`.

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

use super::cilium_handover::calls_on;
use super::real_cilium::{Beside, work_dir};
use super::{Suite, eventually};
use crate::cilium_op::{self, CiliumOperator, Version};
use crate::operator::OperatorOptions;
use crate::simctl::SimControl;

/// Three of Cilium's one-minute resyncs and a margin.
const WATCH: Duration = Duration::from_secs(200);

/// The taint Cilium's operator removes once the node's Cilium pod is ready.
const AGENT_NOT_READY: &str = "node.cilium.io/agent-not-ready";

/// What one watch saw on one CiliumNode.
#[derive(Default)]
struct Watched {
    /// (manager, subresource, time) of every write by Cilium's operator seen after `since`.
    cilium_writes: BTreeSet<(String, String, Timestamp)>,
    /// Pool sizes in the order seen (consecutive repeats folded).
    pool_sizes: Vec<usize>,
    /// Distinct operator-status texts of ours, in the order seen.
    statuses: Vec<String>,
}

impl Watched {
    fn shrinks(&self) -> usize {
        self.pool_sizes.windows(2).filter(|w| w[1] < w[0]).count()
    }

    fn summary(&self) -> String {
        let writes: Vec<String> = self
            .cilium_writes
            .iter()
            .map(|(m, sub, at)| format!("{m}{sub} at {at}"))
            .collect();
        format!(
            "Cilium writes {} {writes:?}; pool sizes {:?} ({} shrinks); ours' operator-status {:?}",
            writes.len(),
            self.pool_sizes,
            self.shrinks(),
            self.statuses
        )
    }
}

impl Suite {
    /// Samples node `idx` once a second for `d`: Cilium's writes newer than `since`, the pool
    /// size, ours' operator-status.
    async fn watch_node(&self, idx: usize, since: Timestamp, d: Duration) -> Result<Watched> {
        let mut w = Watched::default();
        let t0 = Instant::now();
        while t0.elapsed() < d {
            let cn = self.cn(idx).await?;
            for e in cn.metadata.managed_fields.iter().flatten() {
                let (Some(m), Some(at)) = (&e.manager, &e.time) else {
                    continue;
                };
                if m.contains("cilium-operator") && at.0 > since {
                    let sub = e
                        .subresource
                        .as_deref()
                        .map(|s| format!("/{s}"))
                        .unwrap_or_default();
                    w.cilium_writes.insert((m.clone(), sub, at.0));
                }
            }
            let size = cn.spec.ipam.pool.len();
            if w.pool_sizes.last() != Some(&size) {
                w.pool_sizes.push(size);
            }
            let status = super::operator_error(&cn);
            if w.statuses.last() != Some(&status) {
                w.statuses.push(status);
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        Ok(w)
    }

    /// Cilium's EC2 calls on node `idx`'s instance since `mark`, as `action answer +ms`.
    async fn cilium_calls_on(
        &self,
        sim: &SimControl,
        mark: usize,
        idx: usize,
    ) -> Result<Vec<String>> {
        let calls = self.calls_since(sim, mark).await?;
        let inst = &self.nodes[idx].instance.id;
        Ok(calls_on(&calls, inst, Some(cilium_op::ACCESS_KEY))
            .into_iter()
            .map(|c| format!("{} {} at {} ms", c.action, c.answer, c.at_ms))
            .collect())
    }

    /// Watches node `g` for [`WATCH`] after a change of its demand (`after`) and says what
    /// Cilium did meanwhile: its writes and its EC2 calls for the node since `mark`.
    async fn watch_frozen_copy(
        &self,
        sim: &SimControl,
        mark: usize,
        g: usize,
        since: Timestamp,
        after: &str,
    ) -> Result<(Watched, Vec<String>)> {
        let watched = self.watch_node(g, since, WATCH).await?;
        let calls = self.cilium_calls_on(sim, mark, g).await?;
        println!(
            "     cilium-frozen-copy: {}s after {after}: Cilium's EC2 calls for G {calls:?}; {}",
            WATCH.as_secs(),
            watched.summary()
        );
        Ok((watched, calls))
    }

    /// For a scenario on Cilium 1.20: ec2-sim's control connection and a classic node whose
    /// instance Cilium's operator runs on (its metadata answers with it).
    async fn cilium_120_node(&mut self, scenario: &str) -> Result<Option<(SimControl, usize)>> {
        let Some(sim) = self.cilium_120(scenario, "").await? else {
            return Ok(None);
        };
        let idx = self.add_classic(0).await?;
        sim.set_metadata_instance(&self.nodes[idx].instance.id)
            .await?;
        Ok(Some((sim, idx)))
    }

    /// `cilium-frozen-copy` (module doc).
    pub(super) async fn cilium_frozen_copy(&mut self) -> Result<()> {
        let Some((sim, g)) = self.cilium_120_node("cilium-frozen-copy").await? else {
            return Ok(());
        };
        let steps = async |s: &mut Self, c: Beside<'_>| s.frozen_copy_steps(c, g).await;
        self.beside_cilium(&sim, Version::V120, steps).await
    }

    async fn frozen_copy_steps(&mut self, c: Beside<'_>, g: usize) -> Result<()> {
        let Beside { sim, op, .. } = c;
        self.served_beside(op, &[g], "Cilium's operator to serve G first")
            .await?;
        let first_pool = self.cn(g).await?.spec.ipam.pool.len();
        let mark = sim.clients().await?.mutating.len();
        self.start_ops(
            OperatorOptions {
                cilium_operator_present: true,
                release_delay_secs: Some(5),
                extra_args: vec![
                    "--annotate-cilium-ignore".into(),
                    "--watch-cilium-lease=false".into(),
                ],
                ..Default::default()
            },
            1,
        )
        .await?;
        let t0 = Instant::now();
        eventually(self.cfg.timeout, "ours to annotate G", async || {
            Ok(if self.cilium_ignore_on(g).await? {
                Ok(())
            } else {
                Err("not annotated".to_string())
            })
        })
        .await?;
        let annotated = Timestamp::now();
        let t_annotated = t0.elapsed();
        self.wait_taken_over(&[g], "ours to take G over").await?;
        let t_taken = t0.elapsed();
        println!(
            "     cilium-frozen-copy: G served by Cilium's leader first (pool {first_pool}); ours annotated it {:.1}s after its start and took it over {:.1}s after its start, Cilium's leader running throughout",
            t_annotated.as_secs_f64(),
            t_taken.as_secs_f64()
        );

        // Demand rises: ours serves it; Cilium's copy still shows the old demand.
        self.set_pods(g, 14);
        self.served_beside(op, &[g], "ours to meet G's new demand")
            .await?;
        let after = "G's demand rose 4 -> 14 pods (served by ours)";
        self.watch_frozen_copy(sim, mark, g, annotated, after)
            .await?;

        // Demand falls: ours releases (5 s delay) below what Cilium's copy last asked for.
        let mark_down = sim.clients().await?.mutating.len();
        self.set_pods(g, 1);
        let after = "G's demand fell to 1 pod (release on in ours)";
        let (down, calls_down) = self
            .watch_frozen_copy(sim, mark_down, g, annotated, after)
            .await?;
        let leader = op.lock().expect("op").as_ref().map(|o| {
            o.log_lines("Resolving IP deficit").len() + o.log_lines("Releasing excess").len()
        });
        println!(
            "     cilium-frozen-copy: Cilium's log lines resolving a deficit or releasing: {leader:?}"
        );
        // docs/migrating-from-cilium.md holds such nodes back because of this.
        ensure!(
            !calls_down.is_empty() || !down.cilium_writes.is_empty(),
            "Cilium's frozen copy stayed quiet after ours released: the docs' reason to hold such nodes back changed"
        );
        Ok(())
    }

    /// `cilium-ipam-crd` (module doc).
    pub(super) async fn cilium_ipam_crd(&mut self) -> Result<()> {
        let Some((sim, h)) = self.cilium_120_node("cilium-ipam-crd").await? else {
            return Ok(());
        };
        self.taint_agent_not_ready(h).await?;
        let extra = [
            "--ipam=crd".to_string(),
            "--remove-cilium-node-taints=true".to_string(),
        ];
        let mark = sim.clients().await?.mutating.len();
        let started = Timestamp::now();
        let op = CiliumOperator::start(
            Version::V120,
            &self.kube,
            &self.ops.settings.ec2_endpoint,
            &self.cfg.cluster_name,
            &work_dir(),
            &extra,
        )
        .await?;
        let op = Mutex::new(Some(op));
        let body = self.ipam_crd_steps(&sim, &op, h, mark, started).await;
        let pod = self.delete_cilium_pod(h).await;
        self.stop_cilium(op, body.and(pod)).await
    }

    async fn ipam_crd_steps(
        &mut self,
        sim: &SimControl,
        op: &Mutex<Option<CiliumOperator>>,
        h: usize,
        mark: usize,
        started: Timestamp,
    ) -> Result<()> {
        let holder = eventually(self.cfg.timeout, "Cilium's operator to lead", async || {
            if let Some(note) = op.lock().expect("op").as_mut().and_then(|o| o.exited()) {
                return Err(super::Abort(note).into());
            }
            Ok(match cilium_op::lease_holder(&self.kube).await? {
                Some(h) if !h.is_empty() => Ok(h),
                other => Err(format!("Lease holder {other:?}")),
            })
        })
        .await?;
        // Its Cilium pod becomes ready: the taint should go.
        let t0 = Instant::now();
        self.ready_cilium_pod(h).await?;
        let untainted = eventually(
            Duration::from_secs(60),
            "the agent-not-ready taint removed",
            async || {
                Ok(if self.has_agent_not_ready(h).await? {
                    Err("still tainted".to_string())
                } else {
                    Ok(t0.elapsed())
                })
            },
        )
        .await;
        // A minute and a half (one resync and more): no EC2 call, no write for H.
        tokio::time::sleep(Duration::from_secs(90)).await;
        let alive = op.lock().expect("op").as_mut().and_then(|o| o.exited());
        let calls = self.cilium_calls_on(sim, mark, h).await?;
        let writes = self.watch_node(h, started, Duration::from_secs(1)).await?;
        let pool = self.cn(h).await?.spec.ipam.pool.len();
        println!(
            "     cilium-ipam-crd: Cilium's operator --ipam=crd: leader {holder}; exited {alive:?}; taint removed {:?}; after 90 s: its EC2 calls for H {calls:?}, {}; H's pool {pool}",
            untainted
                .as_ref()
                .map(|d| format!("{:.1}s after its pod was ready", d.as_secs_f64())),
            writes.summary()
        );
        ensure!(alive.is_none(), "Cilium's operator exited: {alive:?}");
        ensure!(
            calls.is_empty() && writes.cilium_writes.is_empty(),
            "Cilium's operator allocated for H"
        );

        // Ours, reading no Lease and annotating nothing, serves H; Cilium stays out.
        self.start_ops(
            OperatorOptions {
                cilium_operator_present: true,
                extra_args: vec!["--watch-cilium-lease=false".into()],
                ..Default::default()
            },
            1,
        )
        .await?;
        let t1 = Instant::now();
        self.served_beside(op, &[h], "ours to serve H").await?;
        let served = t1.elapsed();
        self.set_pods(h, 14);
        self.served_beside(op, &[h], "ours to meet H's new demand")
            .await?;
        tokio::time::sleep(Duration::from_secs(70)).await;
        let calls = self.cilium_calls_on(sim, mark, h).await?;
        let writes = self.watch_node(h, started, Duration::from_secs(1)).await?;
        println!(
            "     cilium-ipam-crd: ours served H {:.1}s after its start, then 4 -> 14 pods; 70 s later Cilium's EC2 calls for H {calls:?}, {}",
            served.as_secs_f64(),
            writes.summary()
        );
        ensure!(
            calls.is_empty() && writes.cilium_writes.is_empty(),
            "Cilium's operator allocated for H"
        );
        untainted.map(|_| ())
    }

    async fn taint_agent_not_ready(&self, idx: usize) -> Result<()> {
        let nodes: Api<Node> = Api::all(self.kube.clone());
        let name = &self.nodes[idx].name;
        let node = nodes.get(name).await?;
        let mut taints: Vec<serde_json::Value> = node
            .spec
            .and_then(|s| s.taints)
            .unwrap_or_default()
            .into_iter()
            .map(|t| serde_json::to_value(t).expect("taint"))
            .collect();
        taints.push(json!({"key": AGENT_NOT_READY, "value": "true", "effect": "NoSchedule"}));
        nodes
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"taints": taints}})),
            )
            .await?;
        Ok(())
    }

    async fn has_agent_not_ready(&self, idx: usize) -> Result<bool> {
        let nodes: Api<Node> = Api::all(self.kube.clone());
        Ok(nodes
            .get(&self.nodes[idx].name)
            .await?
            .spec
            .and_then(|s| s.taints)
            .unwrap_or_default()
            .iter()
            .any(|t| t.key == AGENT_NOT_READY))
    }

    fn cilium_pod_name(&self, idx: usize) -> String {
        format!("cilium-{}", self.nodes[idx].name)
    }

    /// A Pod as Cilium's DaemonSet would have on the node (`k8s-app=cilium` in Cilium's
    /// namespace), reported ready through its status (no kubelet here).
    async fn ready_cilium_pod(&self, idx: usize) -> Result<()> {
        let pods: Api<Pod> = Api::namespaced(self.kube.clone(), cilium_op::NAMESPACE);
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": self.cilium_pod_name(idx), "labels": {"k8s-app": "cilium"}},
            "spec": {
                "nodeName": self.nodes[idx].name,
                "containers": [{"name": "cilium-agent", "image": "quay.io/cilium/cilium:v1.20.0"}],
                "tolerations": [{"operator": "Exists"}],
            },
        }))?;
        pods.create(&PostParams::default(), &pod)
            .await
            .context("creating the Cilium pod")?;
        let now = Timestamp::now().to_string();
        let status = json!({"status": {
            "phase": "Running",
            "conditions": [
                {"type": "Ready", "status": "True", "lastTransitionTime": now},
                {"type": "ContainersReady", "status": "True", "lastTransitionTime": now},
            ],
        }});
        pods.patch_status(
            &self.cilium_pod_name(idx),
            &PatchParams::default(),
            &Patch::Merge(status),
        )
        .await
        .context("reporting the Cilium pod ready")?;
        Ok(())
    }

    async fn delete_cilium_pod(&self, idx: usize) -> Result<()> {
        let pods: Api<Pod> = Api::namespaced(self.kube.clone(), cilium_op::NAMESPACE);
        let dp = DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        };
        match pods.delete(&self.cilium_pod_name(idx), &dp).await {
            Err(e) if !super::is_status(&e, 404) => Err(e.into()),
            _ => Ok(()),
        }
    }
}
