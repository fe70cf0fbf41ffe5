//! Trying eni-operator beside another allocator (issue 21): `shadow`.
//!
//! A child module of `scenarios`, so it uses the suite's harness as the other scenarios do.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::core::v1::Event;
use kube::api::{Api, DeleteParams, ListParams};
use serde_json::Value;
use testkit::agent::Generation;

use super::{Suite, all_met, eventually};
use crate::checks::NodeVariant;
use crate::faultproxy::FaultProxy;
use crate::operator::OperatorOptions;
use crate::other_alloc::OtherAllocator;
use eni_operator::reconcile::status::WaitReason;

/// Field managers of the operator's writes (`src/k8s/sink.rs`, `src/ipam/handover.rs`).
const OUR_MANAGERS: &[&str] = &[
    eni_operator::ipam::handover::OWN_FIELD_MANAGER,
    eni_operator::ipam::handover::HANDOVER_FIELD_MANAGER,
];

/// `GET http://<addr><path>` over a plain TCP connection (the operator's metrics listener).
pub(super) async fn http_get(addr: &str, path: &str) -> Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr)
        .await
        .with_context(|| format!("connecting to {addr}"))?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").context("no HTTP header end")?;
    ensure!(head.contains(" 200 "), "GET {path}: {head}");
    Ok(body.to_string())
}

/// Why `node` is not yet seen in deficit by the shadow, or `Ok(())`.
fn in_deficit(summary: &Value, node: &str) -> std::result::Result<(), String> {
    match summary["nodes"][node]["in_deficit"].as_bool() {
        Some(true) => Ok(()),
        Some(false) => Err(format!(
            "{node}: not in deficit: {}",
            summary["nodes"][node]
        )),
        None => Err(format!("{node}: not in the summary yet")),
    }
}

/// Mutating EC2 actions among those forwarded (everything but `Describe*`).
fn mutating(forwarded: &std::collections::BTreeMap<String, usize>) -> Vec<String> {
    forwarded
        .iter()
        .filter(|(a, _)| !a.starts_with("Describe"))
        .map(|(a, n)| format!("{a} x{n}"))
        .collect()
}

impl Suite {
    /// The shadow's `/debug/shadow` JSON.
    pub(super) async fn shadow_summary(&self) -> Result<Value> {
        let addr = self
            .ops
            .metrics_addrs()
            .into_iter()
            .next()
            .context("no local operator")?;
        Ok(serde_json::from_str(
            &http_get(&addr, "/debug/shadow").await?,
        )?)
    }

    /// Names, instances and zones of the nodes `idxs`, for the other allocator.
    fn other_view(&self, idxs: &[usize]) -> Vec<(String, crate::ec2seed::Instance, usize)> {
        idxs.iter()
            .map(|&i| {
                let n = &self.nodes[i];
                let zone = usize::from(n.instance.az != self.world.zones[0]);
                (n.name.clone(), n.instance.clone(), zone)
            })
            .collect()
    }

    /// Rounds of the other allocator every 2 s until `idxs` are served.
    async fn other_serves(&self, other: &OtherAllocator, idxs: &[usize]) -> Result<()> {
        let view = self.other_view(idxs);
        eventually(
            self.cfg.timeout,
            "the other allocator to serve",
            async || {
                other.round(&view).await?;
                self.served_notes(idxs).await
            },
        )
        .await
    }

    /// What the operator wrote to the API server about these nodes: managedFields naming our
    /// field managers, our finalizer, Events it reported.
    pub(super) async fn our_writes(&self, names: &[String]) -> Result<Vec<String>> {
        let mut found = Vec::new();
        for name in names {
            let Some(cn) = self.cns().get_opt(name).await? else {
                continue;
            };
            for m in cn.metadata.managed_fields.iter().flatten() {
                let manager = m.manager.as_deref().unwrap_or_default();
                if OUR_MANAGERS.contains(&manager) {
                    found.push(format!("{name}: managedFields name {manager}"));
                }
            }
            if cn
                .metadata
                .finalizers
                .iter()
                .flatten()
                .any(|f| f == eni_operator::crd::FINALIZER)
            {
                found.push(format!("{name}: our finalizer"));
            }
            let events: Api<Event> = Api::all(self.kube.clone());
            let list = events
                .list(&ListParams::default().fields(&format!("involvedObject.name={name}")))
                .await?;
            for e in list.items {
                let by = e
                    .reporting_component
                    .clone()
                    .or_else(|| e.source.as_ref().and_then(|s| s.component.clone()))
                    .unwrap_or_default();
                if by.contains("eni-operator") {
                    found.push(format!(
                        "{name}: Event {} by {by}",
                        e.reason.unwrap_or_default()
                    ));
                }
            }
        }
        Ok(found)
    }

    /// `--mode=shadow` beside a scripted other allocator (Cilium's operator, slower), nodes
    /// churning: the shadow makes no write to the API server and no mutating EC2 call (counted
    /// at a proxy in front of EC2 that only it uses), and `/debug/shadow` reports the deficits
    /// the other allocator left.
    pub(super) async fn shadow(&mut self) -> Result<()> {
        ensure!(
            self.ops.is_local(),
            "shadow needs local mode: the EC2 proxy that counts its calls runs next to the suite"
        );
        let proxy = FaultProxy::start(&self.ops.settings.ec2_endpoint).await?;
        let url = proxy.url();
        self.fault_proxy = Some(proxy);
        self.start_ops(
            OperatorOptions {
                ec2_endpoint: Some(url),
                extra_args: vec!["--mode=shadow".into()],
                ..Default::default()
            },
            1,
        )
        .await?;
        let other = OtherAllocator::new(self.kube.clone(), self.ec2.clone(), self.world.clone());
        let idxs = self.two_classic_nodes().await?;
        let names = |s: &Suite, idxs: &[usize]| -> Vec<String> {
            idxs.iter().map(|&i| s.nodes[i].name.clone()).collect()
        };
        // The other allocator is late: the shadow sees both nodes short of addresses first.
        let first = names(self, &idxs);
        eventually(
            self.cfg.timeout,
            "the shadow to see the deficits",
            async || {
                if let Some(note) = self.ops.exited_note() {
                    return Err(super::Abort(note).into());
                }
                let summary = self.shadow_summary().await?;
                let notes: Vec<String> = first
                    .iter()
                    .filter_map(|n| in_deficit(&summary, n).err())
                    .collect();
                all_met(notes)
            },
        )
        .await?;
        self.other_serves(&other, &idxs).await?;

        // Churn: a node joins (served by the other allocator only), one goes (its instance
        // ends first, as the cloud does).
        let joined = self
            .add_node(
                "m5.xlarge",
                0,
                Some(Generation::Classic),
                2,
                NodeVariant::default(),
            )
            .await?;
        let gone = idxs[0];
        if let Some(a) = self.nodes[gone].agent.take() {
            a.stop();
        }
        self.terminate_instances(vec![self.nodes[gone].instance.id.clone()])
            .await?;
        self.k8s_nodes()
            .delete(&self.nodes[gone].name, &DeleteParams::background())
            .await?;
        self.other_serves(&other, &[idxs[1], joined]).await?;

        // The summary: every node seen in deficit, for a while; none now.
        let all = names(self, &[idxs[0], idxs[1], joined]);
        let live = names(self, &[idxs[1], joined]);
        let summary = eventually(
            self.cfg.timeout,
            "the shadow to see them served",
            async || {
                let summary = self.shadow_summary().await?;
                Ok(
                    match live.iter().find(|n| in_deficit(&summary, n).is_ok()) {
                        Some(n) => Err(format!("{n} still in deficit: {}", summary["nodes"][n])),
                        None => Ok(summary),
                    },
                )
            },
        )
        .await?;
        for n in live.iter().chain(std::iter::once(&all[0])) {
            let node = &summary["nodes"][n];
            let (episodes, seconds) = (
                node["deficits"].as_u64().unwrap_or(0),
                node["deficit_seconds"].as_f64().unwrap_or(0.0),
            );
            // The deleted node may have left the summary; if it is there, it has its episode,
            // which may still be open (it never gets served, so it never closes) and then has
            // no seconds counted yet.
            if n == &all[0] {
                ensure!(
                    node.is_null() || episodes >= 1,
                    "{n}: the shadow reports no deficit episode for the deleted node: {node}"
                );
                continue;
            }
            ensure!(
                episodes >= 1 && seconds > 0.0,
                "{n}: the shadow reports no deficit ({episodes} episodes, {seconds} s): {node}"
            );
        }
        ensure!(
            summary["totals"]["deficit_seconds"].as_f64().unwrap_or(0.0) > 0.0,
            "no deficit-seconds in the totals: {}",
            summary["totals"]
        );
        ensure!(
            summary["refused_writes"] == 0 && summary["refused_ec2_calls"] == 0,
            "the read-only types refused calls (something tried to write): {}",
            summary
        );
        tracing::info!(totals = %summary["totals"], "shadow summary");

        // Zero writes, counted from the API server; zero mutating EC2 calls, counted at the
        // proxy only the shadow talks through (the other allocator talks to EC2 directly).
        let writes = self.our_writes(&all).await?;
        ensure!(writes.is_empty(), "the shadow wrote: {writes:?}");
        ensure!(
            self.ops.leader().await?.is_none(),
            "a leader Lease exists: the shadow took part in an election"
        );
        let proxy = self.fault_proxy.as_ref().expect("set above");
        let forwarded = proxy.forwarded_all();
        let calls = mutating(&forwarded);
        ensure!(
            calls.is_empty(),
            "mutating EC2 calls by the shadow: {calls:?}"
        );
        ensure!(
            forwarded.keys().any(|a| a == "DescribeNetworkInterfaces"),
            "the shadow never read EC2 through the proxy: {forwarded:?}"
        );
        let other_calls = other
            .mutating_calls
            .load(std::sync::atomic::Ordering::SeqCst);
        ensure!(other_calls > 0, "the other allocator made no call");
        tracing::info!(
            ?forwarded,
            other_calls,
            "shadow: EC2 calls through the proxy"
        );
        Ok(())
    }
}

/// One node's row of `plan --output json`, reduced to what the scenario compares.
#[derive(Clone, Debug, PartialEq)]
struct PlannedCreate {
    subnet: String,
    security_groups: Vec<String>,
    addresses: u64,
}

/// `node`'s planned action if it is an ENI creation, else why not.
fn planned_create(plan: &Value, node: &str) -> std::result::Result<PlannedCreate, String> {
    let row = plan["nodes"]
        .as_array()
        .and_then(|rows| rows.iter().find(|r| r["node"] == node))
        .ok_or_else(|| format!("{node}: no row in the plan"))?;
    let a = &row["action"];
    if a["action"] != "create-eni" {
        return Err(format!("{node}: planned {row}, not an ENI creation"));
    }
    Ok(PlannedCreate {
        subnet: a["subnet"].as_str().unwrap_or_default().to_string(),
        security_groups: a["security_groups"]
            .as_array()
            .map(|g| {
                g.iter()
                    .filter_map(|s| s.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default(),
        addresses: a["addresses"].as_u64().unwrap_or(0),
    })
}

impl Suite {
    /// The ENIs attached to `instance` at device index > 0: (subnet, sorted groups, secondary
    /// addresses).
    async fn secondary_enis(&self, instance: &str) -> Result<Vec<PlannedCreate>> {
        let out = self
            .ec2
            .describe_network_interfaces()
            .filters(
                aws_sdk_ec2::types::Filter::builder()
                    .name("attachment.instance-id")
                    .values(instance)
                    .build(),
            )
            .send()
            .await
            .context("DescribeNetworkInterfaces")?;
        Ok(out
            .network_interfaces()
            .iter()
            .filter(|e| e.attachment().and_then(|a| a.device_index()).unwrap_or(0) > 0)
            .map(|e| {
                let mut groups: Vec<String> = e
                    .groups()
                    .iter()
                    .filter_map(|g| g.group_id().map(String::from))
                    .collect();
                groups.sort();
                PlannedCreate {
                    subnet: e.subnet_id().unwrap_or_default().to_string(),
                    security_groups: groups,
                    addresses: e
                        .private_ip_addresses()
                        .iter()
                        .filter(|a| a.primary() != Some(true))
                        .count() as u64,
                }
            })
            .collect())
    }

    /// `eni-operator plan --output json` against the e2e world, then the active operator:
    /// what the plan said per node (an ENI in subnet X with groups G and N addresses) is what
    /// the operator then did; a second plan says nothing is left to do. Nodes without agents,
    /// so demand stays what the plan saw (Cilium's pre-allocation).
    pub(super) async fn plan(&mut self) -> Result<()> {
        ensure!(
            self.ops.is_local(),
            "plan runs the operator's binary next to the suite: local mode only"
        );
        let mut idxs = Vec::new();
        for (t, zone) in [("m5.large", 0), ("m5.xlarge", 1)] {
            idxs.push(
                self.add_node(t, zone, None, 0, NodeVariant::default())
                    .await?,
            );
        }
        let opts = OperatorOptions::default();
        let text = self.ops.run_plan(&opts).await?;
        let plan: Value = serde_json::from_str(&text)
            .with_context(|| format!("plan --output json printed something else: {text}"))?;
        tracing::info!(%plan, "plan");
        let mut expected = Vec::new();
        for &i in &idxs {
            let name = self.nodes[i].name.clone();
            let mut p = planned_create(&plan, &name).map_err(anyhow::Error::msg)?;
            p.security_groups.sort();
            ensure!(
                p.addresses > 0,
                "{name}: plan creates an ENI with no address"
            );
            expected.push((i, p));
        }
        // Nothing happened: a plan writes nothing and calls nothing that mutates.
        for &i in &idxs {
            let n = &self.nodes[i];
            ensure!(
                self.secondary_enis(&n.instance.id).await?.is_empty(),
                "{}: an ENI appeared after plan",
                n.name
            );
            let cn = self.cn(i).await?;
            ensure!(
                cn.metadata.finalizers.unwrap_or_default().is_empty()
                    && cn.spec.ipam.pool.is_empty(),
                "{}: plan wrote the CiliumNode",
                n.name
            );
        }

        self.start_ops(opts.clone(), 1).await?;
        for (i, want) in &expected {
            let n = &self.nodes[*i];
            let instance = n.instance.id.clone();
            let got = eventually(self.cfg.timeout, "the planned ENI", async || {
                let enis = self.secondary_enis(&instance).await?;
                let pool = self.cn(*i).await?.spec.ipam.pool.len() as u64;
                Ok(match enis.as_slice() {
                    [_] if pool == want.addresses => Ok(enis),
                    _ => Err(format!(
                        "{instance}: ENIs {enis:?}, pool {pool}, planned {want:?}"
                    )),
                })
            })
            .await?;
            // moto reports an attached ENI's groups united with its instance's
            // (moto/ec2/models/elastic_network_interfaces.py, `group_set`; AWS keeps the
            // ENI's own): the instance's group is allowed on top of the planned ones.
            let mut seen = got[0].clone();
            seen.security_groups
                .retain(|g| g != &self.world.other_security_group);
            ensure!(
                &seen == want,
                "{}: the operator did {got:?}, the plan said {want:?}",
                n.name
            );
        }
        // Settled: the plan now says there is nothing to do.
        let text = self.ops.run_plan(&opts).await?;
        let after: Value = serde_json::from_str(&text)?;
        for &i in &idxs {
            let name = &self.nodes[i].name;
            let row = after["nodes"]
                .as_array()
                .and_then(|rows| rows.iter().find(|r| r["node"] == name.as_str()))
                .cloned()
                .unwrap_or_default();
            ensure!(
                row["action"]["action"] == "nothing" && row["needed"] == 0,
                "{name}: after the operator served it the plan says {row}"
            );
        }
        Ok(())
    }
}

/// The canary label of the `handover` scenario (`--handover-selector`).
pub(super) const HANDOVER_LABEL: (&str, &str) = ("eni-operator-e2e/handover", "true");

impl Suite {
    /// Puts (`true`) or removes the canary label on node `idx`'s CiliumNode.
    pub(super) async fn set_handover_label(&self, idx: usize, on: bool) -> Result<()> {
        let value = on.then_some(HANDOVER_LABEL.1);
        let patch = serde_json::json!({"metadata": {"labels": {HANDOVER_LABEL.0: value}}});
        self.cns()
            .patch(
                &self.nodes[idx].name,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&patch),
            )
            .await?;
        Ok(())
    }

    pub(super) async fn has_our_finalizer(&self, idx: usize) -> Result<bool> {
        Ok(self
            .cn(idx)
            .await?
            .metadata
            .finalizers
            .unwrap_or_default()
            .iter()
            .any(|f| f == eni_operator::crd::FINALIZER))
    }

    /// `ensure` that the operator never wrote node `idx` (it is the other allocator's).
    pub(super) async fn untouched(&self, idx: usize, when: &str) -> Result<()> {
        let name = self.nodes[idx].name.clone();
        let writes = self.our_writes(std::slice::from_ref(&name)).await?;
        ensure!(
            writes.is_empty(),
            "{when}: the operator wrote {name}, which the other allocator serves: {writes:?}"
        );
        Ok(())
    }

    /// Two classic m5.xlarge nodes, one per zone, each with 2 pods: the nodes the shadow and
    /// handover scenarios watch two allocators serve.
    async fn two_classic_nodes(&mut self) -> Result<Vec<usize>> {
        let mut idxs = Vec::new();
        for zone in [0, 1] {
            let variant = NodeVariant::default();
            let kind = Some(Generation::Classic);
            idxs.push(self.add_node("m5.xlarge", zone, kind, 2, variant).await?);
        }
        Ok(idxs)
    }

    /// Nodes served by the other allocator, handed over one (canary) then all, one handed
    /// back; the detection fires when the other allocator writes a handed-over node.
    pub(super) async fn handover(&mut self) -> Result<()> {
        let other = OtherAllocator::new(self.kube.clone(), self.ec2.clone(), self.world.clone());
        let idxs = self.two_classic_nodes().await?;
        let (a, b) = (idxs[0], idxs[1]);
        self.other_serves(&other, &idxs).await?;
        let selector = format!("{}={}", HANDOVER_LABEL.0, HANDOVER_LABEL.1);
        self.start_ops(
            OperatorOptions {
                extra_args: vec![
                    format!("--handover-selector={selector}"),
                    // Cilium resyncs every minute; the script writes only when told to.
                    "--handover-quiet=5s".into(),
                ],
                ..Default::default()
            },
            1,
        )
        .await?;

        // Canary: the other allocator lets A go (as Cilium's operator after its restart), A
        // gets the label, the operator takes it over and serves more pods; B stays the other
        // allocator's, and the operator never writes it.
        self.set_handover_label(a, true).await?;
        eventually(self.cfg.timeout, "the canary taken over", async || {
            Ok(if self.has_our_finalizer(a).await? {
                Ok(())
            } else {
                Err("no finalizer on the canary yet".to_string())
            })
        })
        .await?;
        self.set_pods(a, 12);
        // The script's one ENI (14 addresses on an m5.xlarge) holds 4 pods, their 2 internal
        // endpoints and Cilium's pre-allocation of 8.
        self.set_pods(b, 4);
        let view_b = self.other_view(&[b]);
        eventually(
            self.cfg.timeout,
            "A served by us, B by the other",
            async || {
                other.round(&view_b).await?;
                self.served_notes(&[a, b]).await
            },
        )
        .await?;
        tracing::info!("handover: canary served by us, B by the other allocator");
        self.untouched(b, "canary").await?;
        ensure!(
            !self.enis_for(&self.nodes[a].instance.id).await?.is_empty(),
            "the canary was served without an ENI of ours"
        );

        // All: B too.
        self.set_handover_label(b, true).await?;
        self.set_pods(b, 12);
        self.wait_served(&[a, b], self.cfg.timeout).await?;
        ensure!(
            self.has_our_finalizer(b).await?,
            "B served without our finalizer"
        );

        tracing::info!("handover: both served by us");
        // Detection: the other allocator writes A again (it kept serving a handed-over node).
        // managedFields times have one-second resolution: the foreign write must come after
        // our last one.
        tokio::time::sleep(Duration::from_millis(1100)).await;
        let view_a = self.other_view(&[a]);
        other.round(&view_a).await?;
        let name_a = self.nodes[a].name.clone();
        eventually(self.cfg.timeout, "OtherAllocatorActive on A", async || {
            let events = self.warning_events(&name_a).await?;
            let status = super::operator_error(&self.cn(a).await?);
            Ok(
                if events.iter().any(|e| e.starts_with("OtherAllocatorActive"))
                    && status.contains("another allocator")
                {
                    Ok(())
                } else {
                    Err(format!("events {events:?}, operator-status {status:?}"))
                },
            )
        })
        .await?;
        tracing::info!("handover: detection fired");
        // `eni-operator status` says why A waits, and when it is looked at again.
        eventually(
            self.cfg.timeout,
            "status: A waits for the other allocator",
            async || {
                let Some(page) = self.status_page().await? else {
                    return Ok(Err("no status page yet".to_string()));
                };
                let unexplained = super::status::unexplained(&page);
                let a = page.nodes.get(&name_a).and_then(|n| n.waiting.clone());
                Ok(match a {
                    Some(w) if w.reason == WaitReason::OtherAllocator && unexplained.is_empty() => {
                        println!(
                            "     status: {name_a} waits: {}: {}",
                            w.reason.as_str(),
                            w.detail
                        );
                        Ok(())
                    }
                    other => Err(format!("A waits {other:?}; unexplained: {unexplained:?}")),
                })
            },
        )
        .await?;
        // The other allocator stops: after --handover-quiet the node is served again.
        eventually(self.cfg.timeout, "A's operator-status clear", async || {
            let status = super::operator_error(&self.cn(a).await?);
            Ok(if status.is_empty() {
                Ok(())
            } else {
                Err(status)
            })
        })
        .await?;

        tracing::info!("handover: A served again after the quiet period");
        // Rollback of B: the label goes; the finalizer and the ignore annotation go, nothing is
        // released (B's ENIs and addresses as they were).
        let instance_b = self.nodes[b].instance.id.clone();
        let before = self.instance_snapshot(&instance_b).await?;
        let pool_before = self.cn(b).await?.spec.ipam.pool.len();
        self.set_handover_label(b, false).await?;
        eventually(self.cfg.timeout, "B handed back", async || {
            let cn = self.cn(b).await?;
            let annotated = cn
                .metadata
                .annotations
                .unwrap_or_default()
                .contains_key(eni_operator::crd::CILIUM_IGNORE_ANNOTATION);
            Ok(if !self.has_our_finalizer(b).await? && !annotated {
                Ok(())
            } else {
                Err("finalizer or annotation still on B".to_string())
            })
        })
        .await?;
        // One resync: time for a wrong release (the finalizer's path) to show.
        tokio::time::sleep(self.cfg.resync).await;
        let after = self.instance_snapshot(&instance_b).await?;
        ensure!(
            before == after,
            "handing B back changed its ENIs: {before:?} -> {after:?}"
        );
        let pool_after = self.cn(b).await?.spec.ipam.pool.len();
        ensure!(
            pool_after >= pool_before,
            "B's pool shrank after the hand-back: {pool_before} -> {pool_after}"
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_describes_are_not_mutating() {
        let f = std::collections::BTreeMap::from([
            ("DescribeInstances".to_string(), 3),
            ("AssignPrivateIpAddresses".to_string(), 1),
        ]);
        assert_eq!(mutating(&f), ["AssignPrivateIpAddresses x1"]);
    }

    #[test]
    fn deficit_reading() {
        let s =
            serde_json::json!({"nodes": {"a": {"in_deficit": true}, "b": {"in_deficit": false}}});
        assert!(in_deficit(&s, "a").is_ok());
        assert!(in_deficit(&s, "b").is_err());
        assert!(
            in_deficit(&s, "c")
                .unwrap_err()
                .contains("not in the summary")
        );
    }
}
