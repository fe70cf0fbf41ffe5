//! `cilium-handover` against Cilium 1.16 (issue 32): that operator does not know
//! `ipam.cilium.io/ignore` (the string is not in its binary; Cilium added it for 1.18), so the
//! handover must not happen while it runs. The guard reads its release from the CiliumNode CRD's
//! schema label and refuses: the canary stays Cilium's, before and after a restart of Cilium's
//! operator (after which, on the old main, ours took the node over beside it). A child module of
//! `scenarios`.

use std::time::{Duration, Instant};

use anyhow::{Result, ensure};

use super::cilium_handover::calls_on;
use super::real_cilium::Beside;
use super::{Suite, eventually};
use crate::cilium_op::{self, Version};
use crate::simctl::SimControl;

impl Suite {
    pub(super) async fn cilium_handover_refused(
        &mut self,
        sim: &SimControl,
        v: Version,
    ) -> Result<()> {
        let mut idxs = Vec::new();
        for zone in [0, 1] {
            idxs.push(self.add_classic(zone).await?);
        }
        sim.set_metadata_instance(&self.nodes[idxs[0]].instance.id)
            .await?;
        // A cluster that runs 1.16 has never had a newer Cilium; the suite's 1.20 runs left
        // their label, which 1.16 would not lower.
        cilium_op::forget_crd_schema_label(&self.kube).await?;
        let steps = async |s: &mut Self, c: Beside<'_>| s.cilium_refusal_steps(c, &idxs).await;
        self.beside_cilium(sim, v, steps).await
    }

    async fn cilium_refusal_steps(&mut self, c: Beside<'_>, idxs: &[usize]) -> Result<()> {
        let Beside { sim, v, op, seen } = c;
        let (a, b) = (idxs[0], idxs[1]);
        let t = self
            .served_beside(op, idxs, "Cilium's operator to serve two nodes")
            .await?;
        let label = cilium_op::crd_schema_label(&self.kube).await?;
        println!(
            "     cilium-handover {v}: two nodes served by Cilium's operator {:.1}s after its start; it wrote CiliumNode CRD {}={label:?}",
            t.as_secs_f64(),
            eni_operator::ipam::cilium_version::SCHEMA_LABEL,
        );
        // Ours installed beside it as for the real handover, the canary labelled.
        self.start_ours_for_handover(&[]).await?;
        self.set_handover_label(a, true).await?;
        let refused = |s: &str| s.starts_with("CiliumIgnoresAnnotation") && s.contains("1.16");
        let t_refused = Instant::now();
        let status = eventually(self.cfg.timeout, "ours to refuse the canary", async || {
            let s = super::operator_error(&self.cn(a).await?);
            Ok(if refused(&s) { Ok(s) } else { Err(s) })
        })
        .await?;
        println!(
            "     cilium-handover {v}: refused after {:.1}s: {status}",
            t_refused.elapsed().as_secs_f64()
        );
        ensure!(
            !self.cilium_ignore_on(a).await?,
            "ours annotated a node it refuses to take over"
        );
        // The user annotates the canary anyway and restarts Cilium's operator: what 1.16 does
        // with the annotation, and that ours still keeps off (the old guard let it in here).
        let patch = serde_json::json!({"metadata": {"annotations": {
            eni_operator::crd::CILIUM_IGNORE_ANNOTATION: "true"}}});
        self.cns()
            .patch(
                &self.nodes[a].name,
                &kube::api::PatchParams::apply("kubectl-annotate").force(),
                &kube::api::Patch::Apply(&serde_json::json!({
                    "apiVersion": "cilium.io/v2",
                    "kind": "CiliumNode",
                    "metadata": patch["metadata"],
                })),
            )
            .await?;
        let (stopped, led) = self.restart_cilium(op, v).await?;
        let mark = sim.clients().await?.mutating.len();
        self.set_pods(a, 14);
        let t_grow = Instant::now();
        self.served_beside(op, &[a], "the annotated canary served by Cilium 1.16")
            .await?;
        let grown = t_grow.elapsed();
        // One more guard recheck (15 s) with the new leader: ours still keeps off.
        tokio::time::sleep(Duration::from_secs(20)).await;
        let calls = self.calls_since(sim, mark).await?;
        let inst = |i: usize| self.nodes[i].instance.id.clone();
        let theirs = calls_on(&calls, &inst(a), Some(cilium_op::ACCESS_KEY)).len();
        println!(
            "     cilium-handover {v}: restart (stopped {:.1}s, new leader {:.1}s); the annotated canary's new demand met by Cilium 1.16 in {:.1}s with {theirs} calls of its own: it ignores {}",
            stopped.as_secs_f64(),
            led.as_secs_f64(),
            grown.as_secs_f64(),
            eni_operator::crd::CILIUM_IGNORE_ANNOTATION
        );
        let all = self.calls_since(sim, seen).await?;
        for &i in idxs {
            let ours = calls_on(&all, &inst(i), None);
            ensure!(
                ours.is_empty(),
                "ours called EC2 for {} while Cilium 1.16 serves it: {ours:?}",
                self.nodes[i].name
            );
            ensure!(
                !self.has_our_finalizer(i).await?,
                "{} taken over while Cilium 1.16 serves it",
                self.nodes[i].name
            );
        }
        let s = super::operator_error(&self.cn(a).await?);
        ensure!(
            refused(&s),
            "the canary's operator-status after the restart: {s:?}"
        );
        self.untouched(b, "refusal").await?;
        Ok(())
    }
}
