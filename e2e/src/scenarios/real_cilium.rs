//! Cilium's real operator on the suite's world (issue 32): `cilium-operator`.
//!
//! `cilium-operator-aws` (from `CILIUM_OPERATOR`, and `CILIUM_OPERATOR_116` when set) runs with
//! only flags and environment against the control plane and ec2-sim (its EC2 endpoint and its
//! instance metadata endpoint), and serves classic CiliumNodes written by our agent simulators.
//! Without the binary the scenario prints NOT RUN. A child module of `scenarios`.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use testkit::agent::Generation;
use testkit::wire::clients::Record;

use super::{Abort, Suite, eventually};
use crate::checks::{self, NodeVariant};
use crate::cilium_op::{self, CiliumOperator, Version};
use crate::simctl::SimControl;

/// Where the suite's logs go (`E2E_WORK_DIR`, as `make e2e-local` sets it).
pub fn work_dir() -> std::path::PathBuf {
    std::env::var_os("E2E_WORK_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| "e2e/.work".into())
}

impl Suite {
    /// Cilium's real operator `v` on this suite's world: its API server, ec2-sim and cluster
    /// name, logs in the work directory.
    pub(super) async fn start_cilium(&self, v: Version) -> Result<CiliumOperator> {
        CiliumOperator::start(
            v,
            &self.kube,
            &self.ops.settings.ec2_endpoint,
            &self.cfg.cluster_name,
            &work_dir(),
            &[],
        )
        .await
    }

    /// Cilium's operator `v` started on `sim`'s world, `steps` run beside it, then
    /// [`Suite::stop_cilium`]. The steps get the operator and the count of mutating calls
    /// ec2-sim had seen before it started.
    pub(super) async fn beside_cilium(
        &mut self,
        sim: &SimControl,
        v: Version,
        steps: impl AsyncFnOnce(&mut Self, Beside<'_>) -> Result<()>,
    ) -> Result<()> {
        let seen = sim.clients().await?.mutating.len();
        let op = std::sync::Mutex::new(Some(self.start_cilium(v).await?));
        let beside = Beside {
            sim,
            v,
            op: &op,
            seen,
        };
        let body = steps(self, beside).await;
        self.stop_cilium(op, body).await
    }

    /// After a scenario's steps: stop the operator they left running (if any) and remove its
    /// Lease, so the next scenario starts without Cilium; the steps' error comes first.
    pub(super) async fn stop_cilium(
        &self,
        op: std::sync::Mutex<Option<CiliumOperator>>,
        body: Result<()>,
    ) -> Result<()> {
        let stop = match op.into_inner().expect("op") {
            Some(op) => op.stop(Duration::from_secs(20)).await,
            None => Ok(()),
        };
        cilium_op::delete_lease(&self.kube).await?;
        body.and(stop)
    }
}

/// What steps run beside Cilium's operator get ([`Suite::beside_cilium`]).
#[derive(Clone, Copy)]
pub(super) struct Beside<'a> {
    pub sim: &'a SimControl,
    pub v: Version,
    /// The running operator (`None` once the steps stopped it).
    pub op: &'a std::sync::Mutex<Option<CiliumOperator>>,
    /// Mutating calls ec2-sim had seen before it started.
    pub seen: usize,
}

/// The versions whose binaries are given, 1.20 first.
pub fn versions() -> Vec<Version> {
    [Version::V120, Version::V116]
        .into_iter()
        .filter(|v| v.binary().is_some())
        .collect()
}

/// ec2-sim's record, its mutating calls from the `seen`-th on (those before are another step's).
pub(super) async fn record_since(sim: &SimControl, seen: usize) -> Result<Record> {
    let mut record = sim.clients().await?;
    record.mutating.drain(..seen.min(record.mutating.len()));
    Ok(record)
}

/// Mutating calls by anyone but `client` on `instances`.
pub fn mutating_by_others(r: &Record, client: &str, instances: &[String]) -> Vec<String> {
    r.mutating
        .iter()
        .filter(|c| c.client != client)
        .filter(|c| {
            c.instance
                .as_ref()
                .is_none_or(|i| instances.iter().any(|x| x == i))
        })
        .map(|c| {
            format!(
                "{} {} by {} at {} ms",
                c.action, c.answer, c.client, c.at_ms
            )
        })
        .collect()
}

impl Suite {
    /// ec2-sim's control connection and the Cilium versions given (1.20 first) for a scenario
    /// that runs Cilium's operator; `None` (NOT RUN printed) when no binary is given.
    pub(super) async fn cilium_versions(
        &self,
        scenario: &str,
    ) -> Result<Option<(SimControl, Vec<Version>)>> {
        let versions = versions();
        if versions.is_empty() {
            println!(
                "NOT RUN {scenario}: neither CILIUM_OPERATOR nor CILIUM_OPERATOR_116 is set (paths to Cilium's cilium-operator-aws; see e2e/README.md)"
            );
            return Ok(None);
        }
        ensure!(
            self.ops.is_local(),
            "{scenario} runs Cilium's operator next to the suite: local mode only"
        );
        let sim = SimControl::connect(&self.ops.settings.ec2_endpoint)
            .await
            .context("Cilium's operator needs ec2-sim's metadata endpoint")?;
        Ok(Some((sim, versions)))
    }

    /// Runs `run` against each Cilium version given (1.20 first), checking the invariants and
    /// cleaning up between versions; NOT RUN when no binary is given.
    pub(super) async fn per_cilium_version(
        &mut self,
        scenario: &str,
        mut run: impl AsyncFnMut(&mut Self, &SimControl, Version) -> Result<()>,
    ) -> Result<()> {
        let Some((sim, versions)) = self.cilium_versions(scenario).await? else {
            return Ok(());
        };
        for (n, v) in versions.into_iter().enumerate() {
            if n > 0 {
                self.check_invariants().await?;
                self.cleanup().await?;
            }
            let t0 = Instant::now();
            run(self, &sim, v).await?;
            println!(
                "     {scenario} {v}: passed in {:.0}s",
                t0.elapsed().as_secs_f64()
            );
        }
        Ok(())
    }

    /// ec2-sim's control connection for a scenario that needs Cilium 1.20; `None` (NOT RUN
    /// printed, with `why` when given) without it.
    pub(super) async fn cilium_120(&self, scenario: &str, why: &str) -> Result<Option<SimControl>> {
        let Some((sim, versions)) = self.cilium_versions(scenario).await? else {
            return Ok(None);
        };
        if !versions.contains(&Version::V120) {
            println!("NOT RUN {scenario}: CILIUM_OPERATOR (1.20) is not set{why}");
            return Ok(None);
        }
        Ok(Some(sim))
    }

    /// The real operator's process died: stop waiting.
    fn cilium_exited(op: &mut CiliumOperator) -> Result<()> {
        match op.exited() {
            Some(note) => Err(Abort(note).into()),
            None => Ok(()),
        }
    }

    /// Waits until `idxs` are served while Cilium's operator runs; how long that took.
    pub(super) async fn wait_served_by_cilium(
        &self,
        op: &std::sync::Mutex<CiliumOperator>,
        idxs: &[usize],
        what: &str,
    ) -> Result<Duration> {
        let t0 = Instant::now();
        eventually(self.cfg.timeout, what, async || {
            Self::cilium_exited(&mut op.lock().expect("op"))?;
            self.served_notes(idxs).await
        })
        .await
        .with_context(|| {
            let op = op.lock().expect("op");
            format!("Cilium's operator log: {}", op.tail(6))
        })?;
        Ok(t0.elapsed())
    }

    /// `cilium-operator`: for each version given, three m5.large nodes with classic agents
    /// (our simulator) are served by Cilium's operator alone, then one node's demand grows past
    /// its first ENI. Every mutating EC2 call on their instances is Cilium's (ec2-sim's record
    /// per access key), its ENIs carry its description and tags, and the suite's invariants
    /// (no address on two nodes, pools on their instances, no in-use address released) hold.
    pub(super) async fn cilium_operator(&mut self) -> Result<()> {
        let versions = versions();
        if versions.is_empty() {
            println!(
                "NOT RUN cilium-operator: CILIUM_OPERATOR is not set (a path to Cilium's cilium-operator-aws; see e2e/README.md)"
            );
            return Ok(());
        }
        let sim = SimControl::connect(&self.ops.settings.ec2_endpoint)
            .await
            .context("Cilium's operator needs ec2-sim's metadata endpoint")?;
        for v in versions {
            self.cilium_operator_version(&sim, v).await?;
        }
        Ok(())
    }

    async fn cilium_operator_version(&mut self, sim: &SimControl, v: Version) -> Result<()> {
        let mut idxs = Vec::new();
        for (zone, pods) in [(0, 4), (1, 8), (0, 12)] {
            idxs.push(
                self.add_node(
                    "m5.large",
                    zone,
                    Some(Generation::Classic),
                    pods,
                    NodeVariant::default(),
                )
                .await?,
            );
        }
        let instances: Vec<String> = idxs
            .iter()
            .map(|&i| self.nodes[i].instance.id.clone())
            .collect();
        // The operator "runs on" the first node: its metadata names that instance and VPC.
        sim.set_metadata_instance(&instances[0]).await?;
        // Only this run's calls: ec2-sim's record also holds the earlier scenarios' (our
        // operators' creates name no instance, so they would count as on these nodes).
        let before = sim.clients().await?;
        let seen = before.mutating.len();
        let start = Instant::now();
        let op = self.start_cilium(v).await?;
        let op = std::sync::Mutex::new(op);
        let body = async {
            let first = self
                .wait_served_by_cilium(&op, &idxs, "Cilium's operator to serve three nodes")
                .await?;
            println!(
                "     cilium-operator {v}: three nodes served {:.1}s after its start",
                first.as_secs_f64()
            );
            let holder = cilium_op::lease_holder(&self.kube).await?;
            ensure!(holder.is_some(), "Cilium's operator holds no Lease");
            // More demand than its first ENI holds (16 endpoints + 8 spare, capped at the m5.large's 18
            // secondary addresses): a second ENI.
            self.set_pods(idxs[2], 14);
            let grew = self
                .wait_served_by_cilium(&op, &[idxs[2]], "Cilium's operator to serve 14 pods")
                .await?;
            println!(
                "     cilium-operator {v}: 14 pods (a second ENI) served {:.1}s after the demand",
                grew.as_secs_f64()
            );
            let record = record_since(sim, seen).await?;
            let others = mutating_by_others(&record, cilium_op::ACCESS_KEY, &instances);
            ensure!(
                others.is_empty(),
                "mutating EC2 calls on the nodes' instances by someone else: {others:?}"
            );
            let mine = record
                .mutating
                .iter()
                .filter(|c| c.client == cilium_op::ACCESS_KEY)
                .count();
            ensure!(
                mine > 0,
                "ec2-sim recorded no mutating call by Cilium's operator"
            );
            let calls = calls_since(&before, &record, cilium_op::ACCESS_KEY);
            println!(
                "     cilium-operator {v}: its EC2 calls: {}",
                calls
                    .iter()
                    .map(|(a, n)| format!("{a} {n}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            for inst in &instances {
                let enis = crate::ec2seed::instance_enis(&self.ec2, inst).await?;
                for e in enis.iter().filter(|e| e.device_index.unwrap_or(0) > 0) {
                    ensure!(
                        e.tags.get("io.cilium/cilium-managed").map(String::as_str) == Some("true"),
                        "{}: an ENI without Cilium's tags on {inst}: {:?}",
                        e.id,
                        e.tags
                    );
                }
            }
            // Its dashboards' figures, per node (Cilium's `pkg/ipam/node.go` stats):
            // `available_ips` is the instance's capacity (measured: 18 on an m5.large whose pool
            // held 14; ours publishes the pool, docs/monitoring.md), `used_ips` the agent's
            // `status.ipam.used`.
            // Cilium refreshes them on its own passes: they agree within `GAUGE_REFRESH`.
            let port = op.lock().expect("op").metrics_port();
            let text = eventually(
                cilium_op::GAUGE_REFRESH,
                "Cilium's per-node gauges",
                async || {
                    let text = cilium_op::http_get(port, "/metrics").await?;
                    for &i in &idxs {
                        let name = &self.nodes[i].name;
                        let cap =
                            checks::max_ips(&self.nodes[i].instance.instance_type).unwrap_or(0);
                        let used = self.cn(i).await?.status.map_or(0, |s| s.ipam.used.len());
                        for want in [
                            format!(
                                "cilium_operator_ipam_available_ips{{target_node=\"{name}\"}} {cap}"
                            ),
                            format!(
                                "cilium_operator_ipam_used_ips{{target_node=\"{name}\"}} {used}"
                            ),
                        ] {
                            if !text.lines().any(|l| l == want) {
                                let have: Vec<&str> = text
                                    .lines()
                                    .filter(|l| {
                                        l.starts_with("cilium_operator_ipam_")
                                            && l.contains(name.as_str())
                                    })
                                    .collect();
                                let failed = op.lock().expect("op").failed_listings();
                                return Ok(Err(format!(
                                    "{want} not in Cilium's /metrics: {have:?} (its failed EC2 listings: {failed})"
                                )));
                            }
                        }
                    }
                    Ok(Ok(text))
                },
            )
            .await?;
            let _ = std::fs::write(
                work_dir().join(format!("cilium-operator-{v}.metrics")),
                &text,
            );
            let errors = op.lock().expect("op").log_lines("level=error");
            if !errors.is_empty() {
                tracing::warn!(
                    "Cilium's operator logged {} errors, first: {}",
                    errors.len(),
                    errors[0]
                );
            }
            Ok(())
        }
        .await;
        let op = op.into_inner().expect("op");
        let stop = op.stop(Duration::from_secs(15)).await;
        tracing::info!(version = %v, secs = start.elapsed().as_secs_f64(), "Cilium's operator stopped");
        cilium_op::delete_lease(&self.kube).await?;
        body.and(stop)
    }
}

/// `client`'s calls per action between two records (ec2-sim's counts cover every earlier
/// scenario's Cilium operator too).
fn calls_since(before: &Record, after: &Record, client: &str) -> Vec<(String, u64)> {
    let earlier = before.clients.get(client);
    after
        .clients
        .get(client)
        .into_iter()
        .flatten()
        .map(|(action, c)| {
            let was = earlier.and_then(|e| e.get(action)).map_or(0, |c| c.calls);
            (action.clone(), c.calls.saturating_sub(was))
        })
        .filter(|(_, n)| *n > 0)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use testkit::wire::clients::MutatingCall;

    #[test]
    fn a_runs_calls_are_those_after_its_start() {
        use testkit::wire::clients::Counts;
        let counts = |pairs: &[(&str, u64)]| {
            let actions = pairs
                .iter()
                .map(|(a, n)| {
                    let c = Counts {
                        calls: *n,
                        ..Default::default()
                    };
                    (a.to_string(), c)
                })
                .collect();
            Record {
                clients: [("CILIUM".to_string(), actions)].into(),
                mutating: vec![],
            }
        };
        let before = counts(&[("AssignPrivateIpAddresses", 6), ("DescribeVpcs", 2)]);
        let after = counts(&[
            ("AssignPrivateIpAddresses", 9),
            ("DescribeVpcs", 2),
            ("DescribeSubnets", 1),
        ]);
        assert_eq!(
            calls_since(&before, &after, "CILIUM"),
            vec![
                ("AssignPrivateIpAddresses".to_string(), 3),
                ("DescribeSubnets".to_string(), 1)
            ]
        );
        assert!(calls_since(&before, &after, "other").is_empty());
    }

    #[test]
    fn only_other_clients_calls_on_the_instances_count() {
        let call = |client: &str, instance: Option<&str>| MutatingCall {
            at_ms: 1,
            client: client.into(),
            action: "AssignPrivateIpAddresses".into(),
            answer: "ok".into(),
            instance: instance.map(String::from),
        };
        let r = Record {
            clients: Default::default(),
            mutating: vec![
                call("CILIUM", Some("i-1")),
                call("ours", Some("i-9")),
                call("ours", Some("i-1")),
                call("ours", None),
            ],
        };
        let found = mutating_by_others(&r, "CILIUM", &["i-1".into()]);
        assert_eq!(found.len(), 2, "{found:?}");
    }
}
