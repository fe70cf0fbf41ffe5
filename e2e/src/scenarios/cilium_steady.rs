//! The day after the handover (issue 39): `cilium-steady-state`. The cluster is handed over as
//! `docs/migrating-from-cilium.md` says (no selector, `--annotate-cilium-ignore`, Cilium's
//! operator restarted after the annotation) beside Cilium's real `cilium-operator-aws` 1.20 on
//! ec2-sim; then nodes join.
//!
//! With the chart's MutatingAdmissionPolicy (`manifests/cilium-ignore/`): three nodes join (one
//! while Cilium's operator restarts), each served by ours within [`FIRST_ADDRESSES`] of its
//! CiliumNode's creation; their demand rises, one node's falls with release on. Cilium's
//! operator makes no EC2 call for them (ec2-sim's per-client record) and no write to them
//! (managedFields); nothing in use is released, no other pool shrinks. Without the policy: a
//! joining node is seen first by Cilium's running leader, and ours waits with its reason
//! (`OtherAllocatorActive`, "took over at"), making no call for it; a node whose creator sent
//! the annotation in its create is served at once. Both variants share one handover (the
//! policy removed in between). A child module of `scenarios`.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use testkit::agent::Generation;

use super::cilium_handover::calls_on;
use super::real_cilium::Beside;
use super::{Suite, eventually, is_status};
use crate::checks::{self, NodeVariant};
use crate::cilium_op::{self, CiliumOperator, Version};
use crate::operator::OperatorOptions;

/// The promise for a node that joins after the handover, with the policy.
const FIRST_ADDRESSES: Duration = Duration::from_secs(5);

/// The chart's render of the policy and its binding (every CiliumNode).
const POLICY: &str = include_str!("../../../manifests/cilium-ignore/cilium-ignore-policy.yaml");

fn policy_objects() -> Result<Vec<(ApiResource, DynamicObject)>> {
    let mut out = Vec::new();
    for doc in POLICY.split("\n---\n") {
        let obj: DynamicObject = serde_saphyr::from_str(doc).context("policy manifest")?;
        let types = obj.types.clone().context("no apiVersion/kind")?;
        let (group, version) = types.api_version.split_once('/').context("no API group")?;
        let gvk = GroupVersionKind::gvk(group, version, &types.kind);
        // MutatingAdmissionPolicy -> mutatingadmissionpolicies, ...Binding -> ...bindings.
        let kind = types.kind.to_lowercase();
        let plural = match kind.strip_suffix('y') {
            Some(stem) => format!("{stem}ies"),
            None => format!("{kind}s"),
        };
        out.push((ApiResource::from_gvk_with_plural(&gvk, &plural), obj));
    }
    ensure!(out.len() == 2, "policy and binding expected: {POLICY}");
    Ok(out)
}

impl Suite {
    /// Installs the policy and waits until the API server applies it (a dry-run create shows
    /// the annotation).
    async fn install_cilium_ignore_policy(&self) -> Result<Duration> {
        let t0 = Instant::now();
        for (ar, obj) in policy_objects()? {
            let api: Api<DynamicObject> = Api::all_with(self.kube.clone(), &ar);
            let name = obj.metadata.name.clone().context("unnamed")?;
            api.patch(
                &name,
                &PatchParams::apply("eni-operator-e2e").force(),
                &Patch::Apply(&obj),
            )
            .await
            .with_context(|| format!("applying {} {name}", ar.kind))?;
        }
        eventually(self.cfg.timeout, "the policy to act", async || {
            Ok(match self.dry_run_annotation().await? {
                Some(v) if v == "true" => Ok(()),
                other => Err(format!("dry-run create: {IGNORE} {other:?}")),
            })
        })
        .await?;
        Ok(t0.elapsed())
    }

    async fn remove_cilium_ignore_policy(&self) -> Result<()> {
        for (ar, obj) in policy_objects()? {
            let api: Api<DynamicObject> = Api::all_with(self.kube.clone(), &ar);
            let name = obj.metadata.name.clone().context("unnamed")?;
            if let Err(e) = api.delete(&name, &DeleteParams::default()).await
                && !is_status(&e, 404)
            {
                return Err(e.into());
            }
        }
        Ok(())
    }

    /// Removes the policy and waits until the API server no longer applies it.
    async fn remove_cilium_ignore_policy_and_wait(&self) -> Result<()> {
        self.remove_cilium_ignore_policy().await?;
        eventually(self.cfg.timeout, "the policy to stop acting", async || {
            Ok(match self.dry_run_annotation().await? {
                None => Ok(()),
                some => Err(format!("dry-run create: {IGNORE} {some:?}")),
            })
        })
        .await
    }

    /// `ipam.cilium.io/ignore` on a CiliumNode the API server would create now (a dry run).
    async fn dry_run_annotation(&self) -> Result<Option<String>> {
        let probe: eni_operator::crd::CiliumNode = serde_json::from_value(serde_json::json!({
            "apiVersion": "cilium.io/v2",
            "kind": "CiliumNode",
            "metadata": {"name": format!("e2e-{}-policy-probe", self.world.run_id)},
            "spec": {"instance-id": "i-probe"},
        }))?;
        let dry = PostParams {
            dry_run: true,
            ..PostParams::default()
        };
        let made = self.cns().create(&dry, &probe).await?;
        Ok(made.metadata.annotations.unwrap_or_default().remove(IGNORE))
    }

    /// `cilium-steady-state`: against 1.20 (1.16 refuses every handover: `cilium-handover`).
    /// One handover, then the nodes that join with the policy, then (policy removed, same
    /// cluster and Cilium operator) those that join without it.
    pub(super) async fn cilium_steady_state(&mut self) -> Result<()> {
        let why = "; 1.16 refuses every handover (cilium-handover)";
        let Some(sim) = self.cilium_120("cilium-steady-state", why).await? else {
            return Ok(());
        };
        let t0 = Instant::now();
        let mut first = Vec::new();
        for zone in [0, 1] {
            first.push(self.add_classic(zone).await?);
        }
        let id = self.nodes[first[0]].instance.id.clone();
        sim.set_metadata_instance(&id).await?;
        let steps = async |s: &mut Self, c: Beside<'_>| s.steady_state_steps(c, &first).await;
        let body = self.beside_cilium(&sim, Version::V120, steps).await;
        let removed = self.remove_cilium_ignore_policy().await;
        body.and(removed)?;
        println!(
            "     cilium-steady-state: both variants passed in {:.0}s",
            t0.elapsed().as_secs_f64()
        );
        Ok(())
    }

    /// The doc's handover of the whole cluster at once (no selector): ours beside Cilium's
    /// running operator annotates every node and waits; Cilium's operator restarts; ours serves
    /// them all.
    async fn hand_over_all(
        &mut self,
        op: &Mutex<Option<CiliumOperator>>,
        idxs: &[usize],
    ) -> Result<()> {
        self.served_beside(op, idxs, "Cilium's operator to serve the first nodes")
            .await?;
        self.start_ops(
            OperatorOptions {
                cilium_operator_present: true,
                release_delay_secs: Some(5),
                extra_args: vec!["--annotate-cilium-ignore".into()],
                ..Default::default()
            },
            1,
        )
        .await?;
        let what = "ours to annotate every node and wait for Cilium's restart";
        self.wait_for_guard(idxs, what).await?;
        self.restart_cilium(op, Version::V120).await?;
        self.wait_taken_over(idxs, "ours to take every node over")
            .await?;
        self.served_beside(op, idxs, "the handed-over nodes served by ours")
            .await?;
        Ok(())
    }

    async fn steady_state_steps(&mut self, c: Beside<'_>, first: &[usize]) -> Result<()> {
        self.hand_over_all(c.op, first).await?;
        self.joins_with_policy(c, first).await?;
        self.remove_cilium_ignore_policy_and_wait().await?;
        let mark = c.sim.clients().await?.mutating.len();
        self.joins_without_policy(c, mark).await
    }

    async fn joins_with_policy(&mut self, c: Beside<'_>, first: &[usize]) -> Result<()> {
        let Beside { sim, op, .. } = c;
        let name = variant(true);
        let mark = sim.clients().await?.mutating.len();
        let t = self.install_cilium_ignore_policy().await?;
        println!(
            "     cilium-steady-state {name}: cluster handed over; policy acting {:.1}s after it was applied",
            t.as_secs_f64()
        );
        let mut pools = Vec::new();
        for &i in first {
            pools.push((i, self.cn(i).await?.spec.ipam.pool.len()));
        }

        // D joins; E joins while Cilium's operator restarts (its Lease released); F joins.
        let (d, t_d) = self.join_and_time().await?;
        let wall0 = Timestamp::now();
        let stopped = self.stop_cilium_leader(op).await?;
        let (e, t_e) = self.join_and_time().await?;
        self.start_cilium_leader(op, Version::V120, wall0).await?;
        let (f, t_f) = self.join_and_time().await?;
        let joined = [d, e, f];
        println!(
            "     cilium-steady-state {name}: first usable addresses {:.2}s (D), {:.2}s (E, joined {:.1}s into Cilium's restart), {:.2}s (F) after each CiliumNode's creation",
            t_d.as_secs_f64(),
            t_e.as_secs_f64(),
            stopped.as_secs_f64(),
            t_f.as_secs_f64()
        );
        for (n, t) in [("D", t_d), ("E", t_e), ("F", t_f)] {
            ensure!(
                t <= FIRST_ADDRESSES,
                "{n}: first addresses {:.2}s after its creation (at most {}s)",
                t.as_secs_f64(),
                FIRST_ADDRESSES.as_secs()
            );
        }
        self.served_beside(op, &joined, "the joined nodes served")
            .await?;

        // Demand rises on all three, then falls on D with release on (5 s delay).
        for &i in &joined {
            self.set_pods(i, 14);
        }
        self.served_beside(op, &joined, "the joined nodes' new demand met")
            .await?;
        for &i in &joined[1..] {
            pools.push((i, self.cn(i).await?.spec.ipam.pool.len()));
        }
        let high = self.cn(d).await?.spec.ipam.pool.len();
        self.set_pods(d, 2);
        let low = eventually(self.cfg.timeout, "D's excess released", async || {
            let now = self.cn(d).await?.spec.ipam.pool.len();
            Ok(if now < high {
                Ok(now)
            } else {
                Err(format!("D's pool still {now}"))
            })
        })
        .await?;
        self.served_beside(op, &joined, "the joined nodes served after the release")
            .await?;

        // Cilium's operator: no EC2 call and no write for the joined nodes.
        let calls = self.calls_since(sim, mark).await?;
        for &i in &joined {
            let inst = self.nodes[i].instance.id.clone();
            let theirs = calls_on(&calls, &inst, Some(cilium_op::ACCESS_KEY));
            ensure!(
                theirs.is_empty(),
                "Cilium's operator called EC2 for {}: {theirs:?}",
                self.nodes[i].name
            );
            let writers = cilium_writers(&self.cn(i).await?);
            ensure!(
                writers.is_empty(),
                "Cilium's operator wrote {}: {writers:?}",
                self.nodes[i].name
            );
        }
        for (i, before) in pools {
            let now = self.cn(i).await?.spec.ipam.pool.len();
            ensure!(
                now >= before,
                "{}: pool shrank {before} -> {now}",
                self.nodes[i].name
            );
        }
        println!(
            "     cilium-steady-state {name}: demand 4 -> 14 met on D, E, F; D 14 -> 2 pods: pool {high} -> {low}; Cilium's operator: 0 EC2 calls and 0 writes for them"
        );
        Ok(())
    }

    /// Adds a classic m5.large with 4 pods; how long from just before its CiliumNode's
    /// creation until the pool offers an address to use.
    async fn join_and_time(&mut self) -> Result<(usize, Duration)> {
        self.join_and_time_as(NodeVariant::default()).await
    }

    async fn join_and_time_as(&mut self, variant: NodeVariant) -> Result<(usize, Duration)> {
        let inst = self.world.launch(&self.ec2, "m5.large", 0).await?;
        let t0 = Instant::now();
        let idx = self
            .add_node_for(inst, Some(Generation::Classic), 4, variant)
            .await?;
        let limit = t0 + self.cfg.timeout;
        loop {
            let cn = self.cn(idx).await?;
            if checks::available(&cn, Generation::Classic) > 0 {
                return Ok((idx, t0.elapsed()));
            }
            ensure!(
                Instant::now() < limit,
                "{}: no address after {}s: {:?}",
                self.nodes[idx].name,
                self.cfg.timeout.as_secs(),
                super::operator_error(&cn)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Without the policy: Cilium's running leader sees a joining node before our annotation;
    /// ours waits for its next leader and says so, and makes no call for the node.
    async fn joins_without_policy(&mut self, c: Beside<'_>, mark: usize) -> Result<()> {
        let Beside { sim, op, .. } = c;
        let inst = self.world.launch(&self.ec2, "m5.large", 0).await?;
        let t0 = Instant::now();
        let g = self
            .add_node_for(inst, Some(Generation::Classic), 4, NodeVariant::default())
            .await?;
        let status = eventually(self.cfg.timeout, "ours to hold G back", async || {
            let status = super::operator_error(&self.cn(g).await?);
            Ok(if status.contains("took over at") {
                Ok(status)
            } else {
                Err(format!("operator-status {status:?}"))
            })
        })
        .await?;
        let held = t0.elapsed();
        // Its demand rises: nobody serves it (Cilium's leader froze its copy at the annotation).
        self.set_pods(g, 14);
        tokio::time::sleep(Duration::from_secs(20)).await;
        let unserved = self.served_note(g).await?.err();
        ensure!(
            op.lock()
                .expect("op")
                .as_mut()
                .and_then(|o| o.exited())
                .is_none(),
            "Cilium's operator exited"
        );
        let calls = self.calls_since(sim, mark).await?;
        let inst = self.nodes[g].instance.id.clone();
        let ours = calls_on(&calls, &inst, None);
        ensure!(ours.is_empty(), "ours called EC2 for G: {ours:?}");
        let theirs = calls_on(&calls, &inst, Some(cilium_op::ACCESS_KEY));
        println!(
            "     cilium-steady-state {}: G joined; Cilium's leader made {} EC2 calls for it; ours annotated it and holds it back after {:.1}s: {status}; 20 s after its demand rose: {}",
            variant(false),
            theirs.len(),
            held.as_secs_f64(),
            unserved.unwrap_or_else(|| "served".into())
        );
        self.join_annotated_by_creator(c).await
    }

    /// Without the policy, a node whose creator sends `ipam.cilium.io/ignore` in its create
    /// (a script, an agent configured so): Cilium's leader never takes it up, and ours serves
    /// it at once (the annotation's managedFields entry is the create's).
    async fn join_annotated_by_creator(&mut self, c: Beside<'_>) -> Result<()> {
        let Beside { sim, op, .. } = c;
        let mark = sim.clients().await?.mutating.len();
        let (k, t_k) = self
            .join_and_time_as(NodeVariant {
                annotations: [(IGNORE.to_string(), "true".to_string())].into(),
                ..NodeVariant::default()
            })
            .await?;
        ensure!(
            t_k <= FIRST_ADDRESSES,
            "K (annotated by its creator): first addresses {:.2}s after its creation (at most {}s)",
            t_k.as_secs_f64(),
            FIRST_ADDRESSES.as_secs()
        );
        self.set_pods(k, 14);
        self.served_beside(op, &[k], "K's new demand met").await?;
        let calls = self.calls_since(sim, mark).await?;
        let inst = self.nodes[k].instance.id.clone();
        let theirs = calls_on(&calls, &inst, Some(cilium_op::ACCESS_KEY));
        ensure!(
            theirs.is_empty(),
            "Cilium's operator called EC2 for K: {theirs:?}"
        );
        let writers = cilium_writers(&self.cn(k).await?);
        ensure!(writers.is_empty(), "Cilium's operator wrote K: {writers:?}");
        println!(
            "     cilium-steady-state {}: K created with {IGNORE} by its creator: first usable addresses {:.2}s after its creation, 4 -> 14 pods met; Cilium's operator: 0 EC2 calls and 0 writes for it",
            variant(false),
            t_k.as_secs_f64()
        );
        Ok(())
    }
}

const IGNORE: &str = eni_operator::crd::CILIUM_IGNORE_ANNOTATION;

const fn variant(with_policy: bool) -> &'static str {
    if with_policy {
        "with the policy"
    } else {
        "without the policy"
    }
}

/// managedFields managers that are Cilium's operator.
fn cilium_writers(cn: &eni_operator::crd::CiliumNode) -> Vec<String> {
    cn.metadata
        .managed_fields
        .iter()
        .flatten()
        .filter_map(|e| e.manager.clone())
        .filter(|m| m.contains("cilium-operator"))
        .collect()
}
