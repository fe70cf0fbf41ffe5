//! A real handover from Cilium's operator to ours and back (issue 32 item 4):
//! `cilium-handover`, `docs/migrating-from-cilium.md` step by step with Cilium's real
//! `cilium-operator-aws` (1.20, and 1.16 when `CILIUM_OPERATOR_116` is set) on ec2-sim.
//!
//! Who made which EC2 call comes from ec2-sim's per-client record (`GET /_sim/clients`: Cilium's
//! operator signs with its own access key). A child module of `scenarios`.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use kube::api::Api;
use testkit::agent::Generation;
use testkit::wire::clients::MutatingCall;

use super::adopt::HANDOVER_LABEL;
use super::real_cilium::{Beside, record_since, work_dir};
use super::{Abort, Suite, all_met, eventually};
use crate::checks::NodeVariant;
use crate::cilium_op::{self, CiliumOperator, Version};
use crate::operator::OperatorOptions;
use crate::simctl::SimControl;

/// "Never two allocators making mutating calls for one node within the same minute."
const WINDOW_MS: u64 = 60_000;

/// Instance lifecycle calls are the suite's (it plays the cloud), not an allocator's.
fn allocator_call(c: &MutatingCall) -> bool {
    !matches!(
        c.action.as_str(),
        "RunInstances" | "TerminateInstances" | "StopInstances" | "StartInstances"
    )
}

/// Allocator calls on one instance by two clients less than `window_ms` apart.
pub fn overlaps(calls: &[MutatingCall], window_ms: u64) -> Vec<String> {
    let mut by_instance: BTreeMap<&str, Vec<&MutatingCall>> = BTreeMap::new();
    for c in calls.iter().filter(|c| allocator_call(c)) {
        if let Some(i) = &c.instance {
            by_instance.entry(i).or_default().push(c);
        }
    }
    let mut found = Vec::new();
    for (instance, mut cs) in by_instance {
        cs.sort_by_key(|c| c.at_ms);
        // Two clients' calls closer than the window have, between them, two adjacent calls of
        // different clients closer still: adjacent pairs suffice.
        for w in cs.windows(2) {
            if w[0].client != w[1].client && w[1].at_ms - w[0].at_ms < window_ms {
                found.push(format!(
                    "{instance}: {} by {} at {} ms, then {} by {} at {} ms",
                    w[0].action, w[0].client, w[0].at_ms, w[1].action, w[1].client, w[1].at_ms
                ));
            }
        }
    }
    found
}

/// Allocator calls on `instance` by `client` (`Some`) or by anyone but Cilium (`None`).
pub(super) fn calls_on<'a>(
    calls: &'a [MutatingCall],
    instance: &str,
    client: Option<&str>,
) -> Vec<&'a MutatingCall> {
    calls
        .iter()
        .filter(|c| allocator_call(c) && c.instance.as_deref() == Some(instance))
        .filter(|c| match client {
            Some(k) => c.client == k,
            None => c.client != cilium_op::ACCESS_KEY,
        })
        .collect()
}

/// What one run found, printed and checked at its end.
#[derive(Default)]
struct Figures {
    /// Per step, the longest time a node's pods waited for an address.
    waits: Vec<(String, Duration)>,
}

impl Suite {
    /// ec2-sim's mutating calls from index `from` on.
    pub(super) async fn calls_since(
        &self,
        sim: &SimControl,
        from: usize,
    ) -> Result<Vec<MutatingCall>> {
        Ok(record_since(sim, from).await?.mutating)
    }

    /// Waits until `idxs` are served while Cilium's operator (if one runs) is alive.
    pub(super) async fn served_beside(
        &self,
        op: &Mutex<Option<CiliumOperator>>,
        idxs: &[usize],
        what: &str,
    ) -> Result<Duration> {
        let t0 = Instant::now();
        eventually(self.cfg.timeout, what, async || {
            if let Some(note) = op.lock().expect("op").as_mut().and_then(|o| o.exited()) {
                return Err(Abort(note).into());
            }
            if let Some(note) = self.ops.exited_note() {
                return Err(Abort(note).into());
            }
            self.served_notes(idxs).await
        })
        .await
        .with_context(|| {
            let tail = op.lock().expect("op").as_ref().map(|o| o.tail(6));
            format!("Cilium's operator log: {tail:?}")
        })?;
        Ok(t0.elapsed())
    }

    /// Node `idx` is served within `within`: how long it took, or `None`.
    async fn served_within(&self, idx: usize, within: Duration) -> Result<Option<Duration>> {
        let t0 = Instant::now();
        while t0.elapsed() < within {
            if self.served_note(idx).await?.is_ok() {
                return Ok(Some(t0.elapsed()));
            }
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        Ok(None)
    }

    pub(super) async fn cilium_ignore_on(&self, idx: usize) -> Result<bool> {
        Ok(self
            .cn(idx)
            .await?
            .metadata
            .annotations
            .unwrap_or_default()
            .get(eni_operator::crd::CILIUM_IGNORE_ANNOTATION)
            .is_some_and(|v| v == "true"))
    }

    /// Ours started beside Cilium's operator as docs/migrating-from-cilium.md installs it for a
    /// handover: the canary label's selector, `--annotate-cilium-ignore`, and `extra` flags.
    pub(super) async fn start_ours_for_handover(&mut self, extra: &[&str]) -> Result<()> {
        let selector = format!("{}={}", HANDOVER_LABEL.0, HANDOVER_LABEL.1);
        let mut extra_args = vec![
            format!("--handover-selector={selector}"),
            "--annotate-cilium-ignore".into(),
        ];
        extra_args.extend(extra.iter().map(|a| a.to_string()));
        let options = OperatorOptions {
            cilium_operator_present: true,
            extra_args,
            ..Default::default()
        };
        self.start_ops(options, 1).await
    }

    /// Labels `idxs` for the handover and waits until ours has annotated them and says it
    /// waits for Cilium's leader (the guard: that leader knew the nodes before the annotation).
    async fn label_and_wait_for_guard(&self, idxs: &[usize]) -> Result<()> {
        for &i in idxs {
            self.set_handover_label(i, true).await?;
        }
        let what = "ours to annotate the labelled nodes and wait for Cilium's restart";
        self.wait_for_guard(idxs, what).await
    }

    /// Waits until ours has annotated `idxs` and says it waits for Cilium's leader.
    pub(super) async fn wait_for_guard(&self, idxs: &[usize], what: &str) -> Result<()> {
        eventually(self.cfg.timeout, what, async || {
            let mut notes = Vec::new();
            for &i in idxs {
                let status = super::operator_error(&self.cn(i).await?);
                if !self.cilium_ignore_on(i).await? || !status.contains("took over at") {
                    notes.push(format!(
                        "{}: annotated {}, operator-status {status:?}",
                        self.nodes[i].name,
                        self.cilium_ignore_on(i).await?
                    ));
                }
            }
            all_met(notes)
        })
        .await
    }

    /// Waits until our finalizer is on every node of `idxs`.
    pub(super) async fn wait_taken_over(&self, idxs: &[usize], what: &str) -> Result<()> {
        eventually(self.cfg.timeout, what, async || {
            let mut left = Vec::new();
            for &i in idxs {
                if !self.has_our_finalizer(i).await? {
                    left.push(self.nodes[i].name.clone());
                }
            }
            Ok(if left.is_empty() {
                Ok(())
            } else {
                Err(format!("no finalizer of ours on {left:?}"))
            })
        })
        .await
    }

    /// `kubectl rollout restart deploy/cilium-operator`: SIGTERM, then a new process that waits
    /// for the Lease as a new pod does. Returns when the new leader holds it, with how long the
    /// old one took to stop and the new one to lead.
    pub(super) async fn restart_cilium(
        &self,
        op: &Mutex<Option<CiliumOperator>>,
        v: Version,
    ) -> Result<(Duration, Duration)> {
        let (t0, wall0) = (Instant::now(), Timestamp::now());
        let stopped = self.stop_cilium_leader(op).await?;
        self.start_cilium_leader(op, v, wall0).await?;
        Ok((stopped, t0.elapsed()))
    }

    /// The first half of [`Self::restart_cilium`]: SIGTERM; how long the process took to go.
    pub(super) async fn stop_cilium_leader(
        &self,
        op: &Mutex<Option<CiliumOperator>>,
    ) -> Result<Duration> {
        let old = op
            .lock()
            .expect("op")
            .take()
            .context("no Cilium operator")?;
        let t0 = Instant::now();
        old.stop(Duration::from_secs(20)).await?;
        Ok(t0.elapsed())
    }

    /// The second half: a new process that waits for the Lease as a new pod does; returns when
    /// it holds the Lease acquired at `wall0` or later, with how long that took.
    pub(super) async fn start_cilium_leader(
        &self,
        op: &Mutex<Option<CiliumOperator>>,
        v: Version,
        wall0: Timestamp,
    ) -> Result<Duration> {
        let t0 = Instant::now();
        let new = CiliumOperator::start_keeping_lease(
            v,
            &self.ops.settings.ec2_endpoint,
            &self.cfg.cluster_name,
            &work_dir(),
            &[],
        )?;
        *op.lock().expect("op") = Some(new);
        let leases: Api<Lease> = Api::namespaced(self.kube.clone(), cilium_op::NAMESPACE);
        eventually(self.cfg.timeout, "Cilium's new leader", async || {
            if let Some(note) = op.lock().expect("op").as_mut().and_then(|o| o.exited()) {
                return Err(Abort(note).into());
            }
            let spec = leases.get_opt(cilium_op::LEASE).await?.and_then(|l| l.spec);
            let acquired = spec
                .as_ref()
                .and_then(|s| s.acquire_time.as_ref())
                .map(|t| t.0);
            let held = spec
                .as_ref()
                .and_then(|s| s.holder_identity.as_deref())
                .is_some_and(|h| !h.is_empty());
            // managed times are whole seconds.
            Ok(match acquired {
                Some(t) if held && t.as_second() >= wall0.as_second() => Ok(()),
                other => Err(format!("Lease acquired at {other:?}")),
            })
        })
        .await?;
        Ok(t0.elapsed())
    }

    /// `cilium-handover`: the migration doc step by step against Cilium's real operator 1.20;
    /// against 1.16, which ignores `ipam.cilium.io/ignore`, the guard's refusal
    /// (`cilium_refusal.rs`). See the module doc and e2e/README.md.
    pub(super) async fn cilium_handover(&mut self) -> Result<()> {
        self.per_cilium_version("cilium-handover", async |s, sim, v| match v {
            Version::V120 => s.cilium_handover_version(sim, v).await,
            Version::V116 => s.cilium_handover_refused(sim, v).await,
        })
        .await
    }

    async fn cilium_handover_version(&mut self, sim: &SimControl, v: Version) -> Result<()> {
        let mut idxs = Vec::new();
        // C, handed back at the end, has room to grow twice (an m5.large holds 18 addresses
        // for pods, 16 endpoints and the pre-allocation at 14 pods).
        for (t, zone) in [("m5.large", 0), ("m5.large", 1), ("m5.xlarge", 0)] {
            let kind = Some(Generation::Classic);
            let variant = NodeVariant::default();
            idxs.push(self.add_node(t, zone, kind, 4, variant).await?);
        }
        let first = self.nodes[idxs[0]].instance.id.clone();
        sim.set_metadata_instance(&first).await?;
        let steps = async |s: &mut Self, c: Beside<'_>| s.cilium_handover_steps(c, &idxs).await;
        self.beside_cilium(sim, v, steps).await
    }

    async fn cilium_handover_steps(&mut self, c: Beside<'_>, idxs: &[usize]) -> Result<()> {
        let Beside { sim, v, op, seen } = c;
        let (a, b, c) = (idxs[0], idxs[1], idxs[2]);
        let ids: Vec<String> = self.nodes.iter().map(|n| n.instance.id.clone()).collect();
        let inst = |i: usize| ids[i].clone();
        let mut figures = Figures::default();
        let t = self
            .served_beside(op, idxs, "Cilium's operator to serve three nodes")
            .await?;
        println!(
            "     cilium-handover {v}: three nodes served by Cilium's operator {:.1}s after its start; CiliumNode CRD {}={:?}",
            t.as_secs_f64(),
            eni_operator::ipam::cilium_version::SCHEMA_LABEL,
            cilium_op::crd_schema_label(&self.kube).await?
        );
        // Step 1: the starting point.
        let mut before = Vec::new();
        for &i in idxs {
            before.push(self.cn(i).await?.spec.ipam.pool.len());
        }
        // The agents' longest waits count from here.
        for &i in idxs {
            self.longest_wait(i);
        }

        // Steps 2 and 4 of the doc, in the safe order: ours installed and ready first, beside
        // Cilium's running operator; the guard keeps it off every node Cilium serves.
        self.start_ours_for_handover(&["--metrics-compat=cilium"])
            .await?;
        eventually(self.cfg.timeout, "ours to lead", async || {
            Ok(match self.ops.leader().await? {
                Some(_) => Ok(()),
                None => Err("no leader yet".to_string()),
            })
        })
        .await?;

        // Step 3, the canary: A labelled; ours annotates it and waits for Cilium's restart.
        self.label_and_wait_for_guard(&[a]).await?;
        let annotated = sim.clients().await?.mutating.len();
        // What Cilium's running leader does with `ipam.cilium.io/ignore` on a node it serves:
        // A's demand grows past its first ENI; look for one resync and a half.
        self.set_pods(a, 14);
        let kept = self.served_within(a, Duration::from_secs(80)).await?;
        let calls = self.calls_since(sim, annotated).await?;
        let cilium_on_a = calls_on(&calls, &inst(a), Some(cilium_op::ACCESS_KEY));
        let ours_on_a = calls_on(&calls, &inst(a), None);
        ensure!(
            ours_on_a.is_empty(),
            "ours called EC2 for the canary while Cilium's leader held it: {ours_on_a:?}"
        );
        let verdict = match (kept, cilium_on_a.len()) {
            (Some(t), n) if n > 0 => format!(
                "kept serving it: the new demand met in {:.1}s by {n} calls of its own",
                t.as_secs_f64()
            ),
            (None, 0) => "stopped at once: no call for it and its new demand not met in 80s".into(),
            (kept, n) => format!("served {kept:?}, {n} calls of its own"),
        };
        println!(
            "     cilium-handover {v}: ipam.cilium.io/ignore on a node it serves, Cilium's running operator {verdict}"
        );

        // The restart (doc step 3): A goes to ours; B, Cilium's, grows during the restart.
        let mark = sim.clients().await?.mutating.len();
        self.set_pods(b, 14);
        let t_b = Instant::now();
        let (stopped, led) = self.restart_cilium(op, v).await?;
        self.served_beside(op, &[b], "B served by Cilium's new leader")
            .await?;
        let b_served = t_b.elapsed();
        self.served_beside(op, &[a], "the canary A served by ours")
            .await?;
        ensure!(
            self.has_our_finalizer(a).await?,
            "A served without our finalizer"
        );
        let a_wait = self.longest_wait(a);
        let b_wait = self.longest_wait(b);
        let calls = self.calls_since(sim, mark).await?;
        ensure!(
            calls_on(&calls, &inst(b), None).is_empty(),
            "ours called EC2 for B, Cilium's node: {:?}",
            calls_on(&calls, &inst(b), None)
        );
        ensure!(
            calls_on(&calls, &inst(a), Some(cilium_op::ACCESS_KEY)).is_empty(),
            "Cilium's new leader called EC2 for the annotated canary: {:?}",
            calls_on(&calls, &inst(a), Some(cilium_op::ACCESS_KEY))
        );
        println!(
            "     cilium-handover {v}: restart: old process stopped in {:.1}s, new leader after {:.1}s; B (new demand at the SIGTERM) served by it after {:.1}s; canary A served by ours, its pods waited {:.1}s",
            stopped.as_secs_f64(),
            led.as_secs_f64(),
            b_served.as_secs_f64(),
            a_wait.as_secs_f64()
        );
        figures.waits.push(("canary (A)".into(), a_wait));
        figures.waits.push(("Cilium restart (B)".into(), b_wait));
        self.untouched(b, "canary").await?;

        // The whole cluster: B and C labelled, annotated by ours; Cilium restarted at once.
        self.label_and_wait_for_guard(&[b, c]).await?;
        let mark = sim.clients().await?.mutating.len();
        self.set_pods(b, 16);
        self.set_pods(c, 14);
        let (stopped, led) = self.restart_cilium(op, v).await?;
        // Taken over (our finalizer) first: their pools may already cover the new demand.
        self.wait_taken_over(idxs, "ours to take B and C over")
            .await?;
        self.served_beside(op, idxs, "all three served by ours")
            .await?;
        let calls = self.calls_since(sim, mark).await?;
        for &i in idxs {
            let theirs = calls_on(&calls, &inst(i), Some(cilium_op::ACCESS_KEY));
            ensure!(
                theirs.is_empty(),
                "Cilium's new leader called EC2 for an annotated node: {theirs:?}"
            );
        }
        let mut all_wait = Duration::ZERO;
        for &i in &[b, c] {
            let w = self.longest_wait(i);
            all_wait = all_wait.max(w);
        }
        println!(
            "     cilium-handover {v}: all: Cilium restarted (stopped {:.1}s, new leader {:.1}s); B and C served by ours, longest wait {:.1}s",
            stopped.as_secs_f64(),
            led.as_secs_f64(),
            all_wait.as_secs_f64()
        );
        figures.waits.push(("all (B, C)".into(), all_wait));

        // Rollback of C: the label goes; ours removes its finalizer and the annotation; Cilium's
        // running leader takes C up on that event, at once, from its EC2 view of up to a minute
        // ago (seen: a call for C right after the hand-back, planned from a listing that
        // lacked ours' last ENI). So the hand-back comes a minute and one Cilium sync after
        // ours' last call for C, as the doc says.
        let c_inst = inst(c);
        let all = self.calls_since(sim, seen).await?;
        let last_ours = calls_on(&all, &c_inst, None)
            .last()
            .map(|c| c.at_ms)
            .unwrap_or(0);
        let now_ms = all.last().map_or(0, |c| c.at_ms);
        let rest = (last_ours + WINDOW_MS + 5_000).saturating_sub(now_ms);
        tokio::time::sleep(Duration::from_millis(rest)).await;
        let c_before = self.instance_snapshot(&c_inst).await?;
        let c_pool = self.cn(c).await?.spec.ipam.pool.len();
        self.set_handover_label(c, false).await?;
        eventually(self.cfg.timeout, "C handed back", async || {
            Ok(
                if !self.has_our_finalizer(c).await? && !self.cilium_ignore_on(c).await? {
                    Ok(())
                } else {
                    Err("finalizer or annotation still on C".to_string())
                },
            )
        })
        .await?;
        let handed_back = sim.clients().await?.mutating.len();
        self.set_pods(c, 24);
        let t = self
            .served_beside(op, &[c], "C served by Cilium again")
            .await?;
        let calls = self.calls_since(sim, handed_back).await?;
        let ours_c = calls_on(&calls, &c_inst, None);
        ensure!(
            ours_c.is_empty(),
            "ours called EC2 for C after the hand-back: {ours_c:?}"
        );
        let theirs_c = calls_on(&calls, &c_inst, Some(cilium_op::ACCESS_KEY));
        ensure!(
            !theirs_c.is_empty(),
            "C's new demand was met without a call of Cilium's"
        );
        let c_after = self.instance_snapshot(&c_inst).await?;
        for (eni, (_, _, addrs, _)) in &c_before {
            let kept = c_after.get(eni).map(|e| &e.2);
            ensure!(
                kept.is_some_and(|now| addrs.iter().all(|x| now.contains(x))),
                "rollback: {eni} on C lost addresses or went: {addrs:?} -> {kept:?}"
            );
        }
        let c_pool_after = self.cn(c).await?.spec.ipam.pool.len();
        ensure!(
            c_pool_after >= c_pool,
            "rollback: C's pool shrank {c_pool} -> {c_pool_after}"
        );
        let c_wait = self.longest_wait(c);
        println!(
            "     cilium-handover {v}: rollback: C served by Cilium again {:.1}s after its demand grew ({} calls of Cilium's), nothing released",
            t.as_secs_f64(),
            theirs_c.len()
        );
        figures.waits.push(("rollback (C)".into(), c_wait));

        // Throughout: never two allocators within a minute on one node; no pool shrank.
        let all = self.calls_since(sim, seen).await?;
        let overlapping = overlaps(&all, WINDOW_MS);
        ensure!(
            overlapping.is_empty(),
            "two allocators on one node within a minute: {overlapping:?}"
        );
        for (k, &i) in idxs.iter().enumerate() {
            let now = self.cn(i).await?.spec.ipam.pool.len();
            ensure!(
                now >= before[k],
                "{}: pool shrank {} -> {now}",
                self.nodes[i].name,
                before[k]
            );
        }
        self.wait_served(idxs, self.cfg.timeout).await?;
        let longest = figures
            .waits
            .iter()
            .max_by_key(|(_, d)| *d)
            .cloned()
            .unwrap_or_default();
        println!(
            "     cilium-handover {v}: longest wait for an address: {:.1}s ({}); all: {}",
            longest.1.as_secs_f64(),
            longest.0,
            figures
                .waits
                .iter()
                .map(|(s, d)| format!("{s} {:.1}s", d.as_secs_f64()))
                .collect::<Vec<_>>()
                .join(", ")
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(client: &str, at_s: u64, instance: &str, action: &str) -> MutatingCall {
        MutatingCall {
            at_ms: at_s * 1000,
            client: client.into(),
            action: action.into(),
            answer: "ok".into(),
            instance: Some(instance.into()),
        }
    }

    #[test]
    fn two_clients_on_one_instance_within_a_minute_overlap() {
        let calls = [
            call(cilium_op::ACCESS_KEY, 0, "i-1", "AssignPrivateIpAddresses"),
            call(cilium_op::ACCESS_KEY, 10, "i-1", "AssignPrivateIpAddresses"),
            call("test", 75, "i-1", "AssignPrivateIpAddresses"),
            // Another instance at the same time: no overlap.
            call("test", 12, "i-2", "CreateNetworkInterface"),
            // The suite ending an instance is not an allocator.
            call("suite", 80, "i-1", "TerminateInstances"),
        ];
        assert!(overlaps(&calls, WINDOW_MS).is_empty());
        let mut close = calls.to_vec();
        close.push(call(
            cilium_op::ACCESS_KEY,
            100,
            "i-1",
            "AttachNetworkInterface",
        ));
        let found = overlaps(&close, WINDOW_MS);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].contains("i-1"), "{found:?}");
        assert_eq!(calls_on(&close, "i-1", None).len(), 1, "ours: not Cilium's");
    }
}
