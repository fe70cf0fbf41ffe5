//! The scenarios and the harness they share: nodes (EC2 instance + API-only Node + CiliumNode +
//! simulated agent), polling helpers, and the invariants checked after every scenario.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail, ensure};
use eni_operator::crd::{CiliumNode, FINALIZER};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::{Event, Node};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::checks::{
    self, FORBIDDEN_ACCESS, NodeVariant, REQUIRED_ACCESS, RUN_LABEL, available, served,
};
use crate::ec2seed::{self, EniView, Instance, OWNER_INSTANCE_TAG, World};
use crate::faultproxy::{Fault, FaultProxy};
use crate::kube_agent::{AgentHandle, spawn_agent};
use crate::operator::{OperatorOptions, Operators};
use crate::simctl::SimControl;
use eni_operator::reconcile::status::WaitReason;
use testkit::agent::{Generation, endpoints};

mod adopt;
mod cilium_handover;
mod cilium_probe;
mod cilium_refusal;
mod cilium_shadow;
mod cilium_steady;
mod helm;
mod real_cilium;
mod reregister;
mod status;
mod tenant_spell;

/// Every scenario, in the order they run.
pub const ALL: &[&str] = &[
    "classic-ips",
    "multi-pool-ips",
    "mixed-fleet",
    "prefix-delegation",
    "demand-growth",
    "demand-drop",
    "node-deletion",
    "node-reregister",
    "draining-node",
    "leader-failover",
    "restart-mid-allocation",
    "attach-faults",
    "bad-input",
    "rbac",
    "cilium-crd-steady-state",
    "throttled-account",
    "tenant-spell",
    "shadow",
    "plan",
    "handover",
    "static-ip",
    "start-with-nodes",
    "helm-install",
    "cilium-operator",
    "cilium-handover",
    "cilium-steady-state",
    "cilium-shadow",
    "cilium-frozen-copy",
    "cilium-ipam-crd",
];

/// Probes of Cilium's real operator that watch it for minutes (issue 39): run only when named
/// (`--scenario NAME`), never in the default list.
pub const ON_REQUEST: &[&str] = &["cilium-frozen-copy", "cilium-ipam-crd"];

/// Scenarios that need ec2-sim's control endpoints (`E2E_EC2=sim`): left out of the default
/// list on other endpoints (moto and LocalStack never throttle).
pub const SIM_ONLY: &[&str] = &[
    "throttled-account",
    "tenant-spell",
    "cilium-operator",
    "cilium-handover",
    "cilium-steady-state",
    "cilium-shadow",
];

/// Scenarios that need the operator on this machine (a fault proxy in front of EC2): left out
/// of the default list in-cluster.
pub const LOCAL_ONLY: &[&str] = &[
    "attach-faults",
    "shadow",
    "plan",
    "handover",
    "helm-install",
    "cilium-handover",
    "cilium-steady-state",
    "cilium-shadow",
];

/// Scenarios that need `helm` (the path in `HELM`): left out of the default list, with a NOT RUN
/// line, when it is not set.
pub const NEEDS_HELM: &[&str] = &["helm-install"];

/// Scenarios that need Elastic IPs and StopInstances on the wire (moto, LocalStack, AWS):
/// left out of the default list on ec2-sim, which does not serve them.
pub const NOT_ON_SIM: &[&str] = &["static-ip"];

/// Suite settings.
#[derive(Clone, Debug)]
pub struct SuiteConfig {
    pub cluster_name: String,
    pub service_account: String,
    /// Budget of one wait (allocation, deletion, ...).
    pub timeout: Duration,
    pub resync: Duration,
    pub gc: Duration,
    /// The operator's leader lease duration (15 s by default).
    pub lease: Duration,
    pub agent_period: Duration,
}

/// One simulated node.
pub struct TestNode {
    pub name: String,
    pub instance: Instance,
    pub agent: Option<AgentHandle>,
}

impl TestNode {
    fn generation(&self) -> Generation {
        self.agent
            .as_ref()
            .map_or(Generation::Classic, |a| a.generation)
    }
}

pub struct Suite {
    pub kube: kube::Client,
    pub ec2: aws_sdk_ec2::Client,
    pub world: World,
    pub ops: Operators,
    pub cfg: SuiteConfig,
    nodes: Vec<TestNode>,
    seq: u32,
    /// A scenario's fault proxy, kept until its operators are stopped in the clean-up.
    fault_proxy: Option<FaultProxy>,
}

/// Returned by a poll to stop waiting at once.
#[derive(Debug)]
struct Abort(String);

impl std::fmt::Display for Abort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Abort {}

/// Polls `f` every 2 s until it yields `Ok(Ok(_))`, or fails after `timeout` with the last note.
/// `Ok(Err(note))` and errors (API hiccups) retry; an [`Abort`] error stops at once.
async fn eventually<T>(
    timeout: Duration,
    what: &str,
    mut f: impl AsyncFnMut() -> Result<std::result::Result<T, String>>,
) -> Result<T> {
    let deadline = Instant::now() + timeout;
    loop {
        let last = match f().await {
            Ok(Ok(v)) => return Ok(v),
            Ok(Err(note)) => note,
            Err(e) if e.downcast_ref::<Abort>().is_some() => return Err(e),
            Err(e) => format!("error: {e:#}"),
        };
        if Instant::now() > deadline {
            bail!(
                "timed out after {}s waiting for {what}: {last}",
                timeout.as_secs()
            );
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// A check of [`eventually`] from its notes: met when there are none, else the notes joined.
fn all_met(notes: Vec<String>) -> Result<std::result::Result<(), String>> {
    Ok(if notes.is_empty() {
        Ok(())
    } else {
        Err(notes.join("; "))
    })
}

fn is_status(e: &kube::Error, code: u16) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == code)
}

/// The finalizer `draining-node` puts on a Node so that deleting it leaves it draining (with a
/// `deletionTimestamp`), as Karpenter's `karpenter.sh/termination` does.
const DRAIN_FINALIZER: &str = "eni-operator-e2e/drain";

/// The merge patch that drops `finalizer` from these finalizers (`None`: not among them), with
/// the resourceVersion so another controller's finalizer added meanwhile is never lost.
fn finalizer_removal(
    finalizers: &[String],
    finalizer: &str,
    resource_version: Option<&str>,
) -> Option<serde_json::Value> {
    if !finalizers.iter().any(|f| f == finalizer) {
        return None;
    }
    let kept: Vec<&String> = finalizers.iter().filter(|f| *f != finalizer).collect();
    Some(json!({"metadata": {"finalizers": kept, "resourceVersion": resource_version}}))
}

/// What EC2 shows of an instance's ENIs, comparable across time: ENI ID -> (state, device
/// index, sorted addresses, sorted prefixes).
type EniSnapshot = BTreeMap<String, (String, Option<i32>, Vec<String>, Vec<String>)>;

fn eni_snapshot(enis: &[EniView]) -> EniSnapshot {
    enis.iter()
        .map(|e| {
            let mut addresses = e.addresses.clone();
            addresses.sort();
            let mut prefixes = e.prefixes.clone();
            prefixes.sort();
            (
                e.id.clone(),
                (e.status.clone(), e.device_index, addresses, prefixes),
            )
        })
        .collect()
}

impl Suite {
    pub fn new(
        kube: kube::Client,
        ec2: aws_sdk_ec2::Client,
        world: World,
        ops: Operators,
        cfg: SuiteConfig,
    ) -> Self {
        Self {
            kube,
            ec2,
            world,
            ops,
            cfg,
            nodes: Vec::new(),
            seq: 0,
            fault_proxy: None,
        }
    }

    fn cns(&self) -> Api<CiliumNode> {
        Api::all(self.kube.clone())
    }

    fn k8s_nodes(&self) -> Api<Node> {
        Api::all(self.kube.clone())
    }

    /// Runs one scenario with its invariants and clean-up; returns the error if it failed.
    pub async fn run(&mut self, name: &str) -> Result<()> {
        self.ops.reset_logs();
        let body = match name {
            "classic-ips" => self.classic_ips().await,
            "multi-pool-ips" => self.multi_pool_ips().await,
            "mixed-fleet" => self.mixed_fleet().await,
            "prefix-delegation" => self.prefix_delegation().await,
            "demand-growth" => self.demand_growth().await,
            "demand-drop" => self.demand_drop().await,
            "node-deletion" => self.node_deletion().await,
            "node-reregister" => self.node_reregister().await,
            "draining-node" => self.draining_node().await,
            "leader-failover" => self.leader_failover().await,
            "restart-mid-allocation" => self.restart_mid_allocation().await,
            "attach-faults" => self.attach_faults().await,
            "bad-input" => self.bad_input().await,
            "rbac" => self.rbac().await,
            "cilium-crd-steady-state" => self.cilium_crd_steady_state().await,
            "throttled-account" => self.throttled_account().await,
            "tenant-spell" => self.tenant_spell().await,
            "shadow" => self.shadow().await,
            "plan" => self.plan().await,
            "handover" => self.handover().await,
            "static-ip" => self.static_ip().await,
            "start-with-nodes" => self.start_with_nodes().await,
            "helm-install" => self.helm_install().await,
            "cilium-operator" => self.cilium_operator().await,
            "cilium-handover" => self.cilium_handover().await,
            "cilium-steady-state" => self.cilium_steady_state().await,
            "cilium-shadow" => self.cilium_shadow().await,
            "cilium-frozen-copy" => self.cilium_frozen_copy().await,
            "cilium-ipam-crd" => self.cilium_ipam_crd().await,
            other => Err(anyhow!(
                "unknown scenario {other:?} (known: {})",
                ALL.join(", ")
            )),
        };
        let invariants = if body.is_ok() {
            self.check_invariants().await
        } else {
            Ok(())
        };
        let cleanup = self.cleanup().await;
        self.fault_proxy = None;
        body.and(invariants).and(cleanup)
    }

    // ---- nodes -------------------------------------------------------------------------------

    /// Launches an instance, registers its Node and CiliumNode, and starts an agent.
    async fn add_node(
        &mut self,
        instance_type: &str,
        zone: usize,
        generation: Option<Generation>,
        pods: usize,
        variant: NodeVariant,
    ) -> Result<usize> {
        let inst = self.world.launch(&self.ec2, instance_type, zone).await?;
        self.add_node_for(inst, generation, pods, variant).await
    }

    /// A node on a new `instance_type` instance in `zone`, its agent using `pods` addresses.
    /// A classic m5.large with 4 pods in `zone`: the real-Cilium scenarios' node.
    async fn add_classic(&mut self, zone: usize) -> Result<usize> {
        self.add_plain("m5.large", zone, Some(Generation::Classic), 4)
            .await
    }

    async fn add_plain(
        &mut self,
        instance_type: &str,
        zone: usize,
        generation: Option<Generation>,
        pods: usize,
    ) -> Result<usize> {
        self.add_node(
            instance_type,
            zone,
            generation,
            pods,
            NodeVariant::default(),
        )
        .await
    }

    /// A classic node in zone 0 and a multi-pool node in zone 1, each `(instance type, pods)`:
    /// the scenarios' usual pair of agent generations.
    async fn add_both_generations(
        &mut self,
        (classic, classic_pods): (&str, usize),
        (multi_pool, multi_pool_pods): (&str, usize),
    ) -> Result<[usize; 2]> {
        let a = self
            .add_plain(classic, 0, Some(Generation::Classic), classic_pods)
            .await?;
        let b = self
            .add_plain(multi_pool, 1, Some(Generation::MultiPool), multi_pool_pods)
            .await?;
        Ok([a, b])
    }

    async fn add_node_for(
        &mut self,
        inst: Instance,
        generation: Option<Generation>,
        pods: usize,
        variant: NodeVariant,
    ) -> Result<usize> {
        self.seq += 1;
        let name = format!("e2e-{}-{}", self.world.run_id, self.seq);
        let node = self.register_node(&name, &inst).await?;
        let idx = self.nodes.len();
        self.nodes.push(TestNode {
            name: name.clone(),
            instance: inst.clone(),
            agent: None,
        });
        self.create_cilium_node(idx, &node, &variant).await?;
        if let Some(g) = generation {
            self.start_agent(idx, g, pods);
        }
        Ok(idx)
    }

    /// The Node `name` of `inst`, as its kubelet registers it.
    async fn register_node(&self, name: &str, inst: &Instance) -> Result<Node> {
        let node = checks::node_object(name, inst, &self.world.run_id);
        let created = self.k8s_nodes().create(&PostParams::default(), &node).await;
        created.with_context(|| format!("registering Node {name}"))
    }

    async fn create_cilium_node(
        &self,
        idx: usize,
        node: &Node,
        variant: &NodeVariant,
    ) -> Result<()> {
        let cn = checks::cilium_node_object(node, &self.nodes[idx].instance, &self.world, variant);
        self.cns()
            .create(&PostParams::default(), &cn)
            .await
            .context("creating CiliumNode")?;
        Ok(())
    }

    fn start_agent(&mut self, idx: usize, generation: Generation, pods: usize) {
        if let Some(old) = self.nodes[idx].agent.take() {
            old.stop();
        }
        let h = spawn_agent(
            self.kube.clone(),
            self.nodes[idx].name.clone(),
            generation,
            pods,
            self.cfg.agent_period,
        );
        self.nodes[idx].agent = Some(h);
    }

    fn set_pods(&self, idx: usize, pods: usize) {
        if let Some(a) = &self.nodes[idx].agent {
            a.set_pods(pods);
        }
    }

    /// The longest wait for an address node `idx`'s agent saw since the last call (zero
    /// without an agent); starts the next such figure.
    fn longest_wait(&self, idx: usize) -> std::time::Duration {
        let agent = self.nodes[idx].agent.as_ref();
        agent.map(|h| h.take_longest_wait()).unwrap_or_default()
    }

    async fn cn(&self, idx: usize) -> Result<CiliumNode> {
        Ok(self.cns().get(&self.nodes[idx].name).await?)
    }

    /// Why node `idx` is not served yet, or `Ok(())`.
    async fn served_note(&self, idx: usize) -> Result<std::result::Result<(), String>> {
        let n = &self.nodes[idx];
        let Some(agent) = &n.agent else {
            return Ok(Ok(()));
        };
        let cn = self.cn(idx).await?;
        let r = agent.report();
        let avail = available(&cn, agent.generation);
        let cap = checks::max_ips(&n.instance.instance_type);
        if r.settled && r.pods == agent.pods() && served(avail, r.pods, r.unsatisfied, cap) {
            return Ok(Ok(()));
        }
        let err = operator_error(&cn);
        Ok(Err(format!(
            "{} ({}, {}): pods {}, in use {}, unsatisfied {}, available {avail}, operator-status {err:?}",
            n.name,
            agent.generation,
            n.instance.instance_type,
            r.pods,
            r.used.len(),
            r.unsatisfied
        )))
    }

    /// How many of `idxs` are served right now.
    async fn nodes_served(&self, idxs: &[usize]) -> Result<usize> {
        let mut n = 0;
        for &i in idxs {
            n += usize::from(self.served_note(i).await?.is_ok());
        }
        Ok(n)
    }

    /// One operator, then one classic m5.xlarge node with `pods` pods in the first zone,
    /// served: the start of the scenarios about one node's life. Its index.
    pub(super) async fn one_served_node(&mut self, pods: usize) -> Result<usize> {
        self.start_ops(OperatorOptions::default(), 1).await?;
        let a = self
            .add_plain("m5.xlarge", 0, Some(Generation::Classic), pods)
            .await?;
        self.wait_served(&[a], self.cfg.timeout).await?;
        Ok(a)
    }

    async fn wait_served(&self, idxs: &[usize], timeout: Duration) -> Result<()> {
        eventually(timeout, "nodes to be served", async || {
            if let Some(note) = self.ops.exited_note() {
                return Err(Abort(note).into());
            }
            self.served_notes(idxs).await
        })
        .await
    }

    /// `Ok` when every node of `idxs` is served, else what each unserved one lacks.
    async fn served_notes(&self, idxs: &[usize]) -> Result<std::result::Result<(), String>> {
        let mut notes = Vec::new();
        for &i in idxs {
            if let Err(n) = self.served_note(i).await? {
                notes.push(n);
            }
        }
        all_met(notes)
    }

    async fn owned_enis(&self) -> Result<Vec<EniView>> {
        ec2seed::owned_enis(&self.ec2, &self.cfg.cluster_name).await
    }

    /// Our ENIs made for `instance` (by ownership tag), attached or not.
    async fn enis_for(&self, instance: &str) -> Result<Vec<EniView>> {
        Ok(self
            .owned_enis()
            .await?
            .into_iter()
            .filter(|e| e.tags.get(OWNER_INSTANCE_TAG).map(String::as_str) == Some(instance))
            .collect())
    }

    /// The IDs of the ENIs we made for an instance: what "ENIs changed" checks compare.
    async fn eni_ids_for(&self, instance: &str) -> Result<BTreeSet<String>> {
        Ok(self
            .enis_for(instance)
            .await?
            .into_iter()
            .map(|e| e.id)
            .collect())
    }

    /// ENIs a node needs at least for `pods` (ENIs are filled before new ones are made).
    fn enis_needed(&self, idx: usize, pods: usize) -> usize {
        let per = checks::ips_per_eni(&self.nodes[idx].instance.instance_type).unwrap_or(1);
        (endpoints(pods) + testkit::agent::MULTI_POOL_PRE_ALLOCATE).div_ceil(per)
    }

    async fn assert_eni_count_at_most(&self, idx: usize, pods: usize) -> Result<()> {
        let n = &self.nodes[idx];
        // Unattached leftovers (a create cut short) are the GC's, checked by the invariants.
        let enis: Vec<EniView> = self
            .enis_for(&n.instance.id)
            .await?
            .into_iter()
            .filter(|e| e.instance_id.as_deref() == Some(n.instance.id.as_str()))
            .collect();
        let max = self.enis_needed(idx, pods);
        ensure!(
            enis.len() <= max,
            "{}: {} ENIs of ours for {} where {max} suffice: {:?}",
            n.name,
            enis.len(),
            n.instance.id,
            enis.iter().map(|e| &e.id).collect::<Vec<_>>()
        );
        Ok(())
    }

    async fn warning_events(&self, name: &str) -> Result<Vec<String>> {
        let api: Api<Event> = Api::all(self.kube.clone());
        let list = api
            .list(&ListParams::default().fields(&format!("involvedObject.name={name}")))
            .await?;
        Ok(list
            .items
            .into_iter()
            .filter(|e| e.type_.as_deref() == Some("Warning"))
            .map(|e| {
                format!(
                    "{}: {}",
                    e.reason.unwrap_or_default(),
                    e.message.unwrap_or_default()
                )
            })
            .collect())
    }

    async fn start_ops(&mut self, opts: OperatorOptions, replicas: u32) -> Result<()> {
        self.ops.start(&opts, replicas).await
    }

    // ---- invariants and clean-up -------------------------------------------------------------

    /// After every scenario: agents saw no released in-use address and no C2 break; no ENI of
    /// ours stays unattached; no two of ours share a device slot; no IP is on two nodes; every
    /// pool address is on the node's own instance; the operator was never refused by RBAC.
    async fn check_invariants(&self) -> Result<()> {
        let mut problems = Vec::new();
        for n in &self.nodes {
            if let Some(a) = &n.agent {
                problems.extend(a.report().violations);
            }
        }
        let slack = self.cfg.gc * 2 + self.cfg.resync * 2 + Duration::from_secs(60);
        if let Err(e) = eventually(slack, "no ENI of ours left unattached", async || {
            let p = checks::owned_eni_problems(&self.owned_enis().await?);
            all_met(p)
        })
        .await
        {
            problems.push(format!("{e:#}"));
        }
        if let Err(e) = eventually(
            self.cfg.resync * 3 + Duration::from_secs(30),
            "pools on their instances",
            async || {
                let mut notes = Vec::new();
                let mut pools = BTreeMap::new();
                for n in &self.nodes {
                    let Some(cn) = self.cns().get_opt(&n.name).await? else {
                        continue;
                    };
                    pools.insert(
                        n.name.clone(),
                        cn.spec.ipam.pool.keys().cloned().collect::<BTreeSet<_>>(),
                    );
                    if self.world.instances.iter().any(|x| x.id == n.instance.id) {
                        let enis = ec2seed::instance_enis(&self.ec2, &n.instance.id).await?;
                        let stray = checks::pool_not_on_instance(&cn, &enis);
                        if !stray.is_empty() {
                            notes.push(format!(
                                "{}: pool addresses not on {}: {stray:?}",
                                n.name, n.instance.id
                            ));
                        }
                    }
                }
                let shared = checks::shared_addresses(&pools);
                if !shared.is_empty() {
                    let vpc = ec2seed::vpc_enis(&self.ec2, &self.world.vpc_id).await?;
                    let ours = checks::operator_duplicates(&shared, &vpc);
                    for ip in shared.keys().filter(|ip| !ours.contains(ip)) {
                        tracing::warn!(
                            "{ip} is on two ENIs in EC2 (emulator duplicate, not counted)"
                        );
                    }
                    if !ours.is_empty() {
                        notes.push(format!("addresses on two nodes: {ours:?}"));
                    }
                }
                all_met(notes)
            },
        )
        .await
        {
            problems.push(format!("{e:#}"));
        }
        let refused = self.ops.log_lines("forbidden");
        if !refused.is_empty() {
            problems.push(format!(
                "operator refused by RBAC: {}",
                refused[..refused.len().min(3)].join(" | ")
            ));
        }
        ensure!(problems.is_empty(), "invariants: {}", problems.join("; "));
        Ok(())
    }

    /// Stops agents, deletes the scenario's Nodes (the operator's finalizer must let their
    /// CiliumNodes go), then stops the operators. Stuck finalizers are removed and reported.
    /// Ends instances as the cloud does when their nodes are removed (an ASG or Karpenter
    /// terminates the instance, then the Node object goes). The operator keeps the ENIs of a
    /// Node whose instance still runs (docs/rules.md §9), so a scenario that removes a node
    /// ends its instance first.
    /// One call per instance: EC2 refuses a whole batch that names an unknown instance (as
    /// `bad-input`'s made-up one), and such an instance has nothing to end.
    async fn terminate_instances(&self, ids: Vec<String>) -> Result<()> {
        for id in ids {
            if let Err(e) = self
                .ec2
                .terminate_instances()
                .instance_ids(&id)
                .send()
                .await
            {
                let code = aws_sdk_ec2::error::ProvideErrorMetadata::code(&e);
                if code != Some("InvalidInstanceID.NotFound") {
                    return Err(anyhow!("TerminateInstances {id}: {e}"));
                }
            }
        }
        Ok(())
    }

    async fn cleanup(&mut self) -> Result<()> {
        let mut problems = Vec::new();
        for n in &self.nodes {
            if let Some(a) = &n.agent {
                a.stop();
            }
        }
        let names: Vec<String> = self.nodes.iter().map(|n| n.name.clone()).collect();
        let instances = self.nodes.iter().map(|n| n.instance.id.clone()).collect();
        if let Err(e) = self.terminate_instances(instances).await {
            problems.push(format!("ending the instances: {e:#}"));
        }
        for name in &names {
            // A Node left draining by a failed `draining-node` would never go.
            if let Err(e) = self.drop_node_finalizer(name, DRAIN_FINALIZER).await {
                problems.push(format!("releasing Node {name}: {e:#}"));
            }
            if let Err(e) = self
                .k8s_nodes()
                .delete(name, &DeleteParams::background())
                .await
                && !is_status(&e, 404)
            {
                problems.push(format!("deleting Node {name}: {e}"));
            }
        }
        let running = !self.ops.running().await.unwrap_or_default().is_empty();
        let wait = if running {
            self.cfg.timeout
        } else {
            Duration::from_secs(5)
        };
        let gone = eventually(wait, "CiliumNodes to go", async || {
            let mut left = Vec::new();
            for name in &names {
                if self.cns().get_opt(name).await?.is_some() {
                    left.push(name.clone());
                }
            }
            Ok(if left.is_empty() {
                Ok(())
            } else {
                Err(format!("left: {left:?}"))
            })
        })
        .await;
        if let Err(e) = gone {
            for name in &names {
                if let Ok(Some(cn)) = self.cns().get_opt(name).await {
                    if running {
                        problems.push(format!("{name} stuck: {e:#}"));
                    }
                    self.remove_finalizer(&cn).await;
                    let _ = self.cns().delete(name, &DeleteParams::default()).await;
                }
            }
        }
        if running {
            let slack = self.cfg.gc * 2 + Duration::from_secs(60);
            if let Err(e) = eventually(
                slack,
                "no ENI of ours unattached after clean-up",
                async || {
                    let p = checks::owned_eni_problems(&self.owned_enis().await?);
                    all_met(p)
                },
            )
            .await
            {
                problems.push(format!("{e:#}"));
            }
        }
        if let Err(e) = self.ops.stop_all().await {
            problems.push(format!("stopping operators: {e:#}"));
        }
        self.nodes.clear();
        ensure!(problems.is_empty(), "clean-up: {}", problems.join("; "));
        Ok(())
    }

    /// Drops `finalizer` from the Node, if it has it.
    async fn drop_node_finalizer(&self, name: &str, finalizer: &str) -> Result<()> {
        let Some(node) = self.k8s_nodes().get_opt(name).await? else {
            return Ok(());
        };
        let finalizers = node.metadata.finalizers.clone().unwrap_or_default();
        if let Some(patch) = finalizer_removal(
            &finalizers,
            finalizer,
            node.metadata.resource_version.as_deref(),
        ) {
            self.k8s_nodes()
                .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .with_context(|| format!("removing {finalizer} from Node {name}"))?;
        }
        Ok(())
    }

    async fn instance_snapshot(&self, instance: &str) -> Result<EniSnapshot> {
        Ok(eni_snapshot(
            &ec2seed::instance_enis(&self.ec2, instance).await?,
        ))
    }

    async fn remove_finalizer(&self, cn: &CiliumNode) {
        let Some(name) = cn.metadata.name.as_deref() else {
            return;
        };
        let kept: Vec<String> = cn
            .metadata
            .finalizers
            .iter()
            .flatten()
            .filter(|f| *f != FINALIZER)
            .cloned()
            .collect();
        let patch = json!({ "metadata": { "finalizers": kept, "resourceVersion": cn.metadata.resource_version } });
        if let Err(e) = self
            .cns()
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            tracing::warn!("removing finalizer of {name}: {e}");
        }
    }

    // ---- scenarios ---------------------------------------------------------------------------

    async fn classic_ips(&mut self) -> Result<()> {
        let plan = [("m5.large", 0, 5), ("t3.large", 1, 8), ("m5.xlarge", 0, 20)];
        self.one_generation_ips(Generation::Classic, plan).await
    }

    async fn multi_pool_ips(&mut self) -> Result<()> {
        let plan = [
            ("m5.xlarge", 0, 5),
            ("c5.xlarge", 1, 12),
            ("t3.large", 1, 3),
        ];
        self.one_generation_ips(Generation::MultiPool, plan).await
    }

    /// Nodes of one agent generation (instance type, zone, pods each) served as that generation
    /// reads its addresses: classic from `status.ipam.used` and our finalizer, multi-pool from
    /// the published pool (C9) with nothing in `used`.
    async fn one_generation_ips(
        &mut self,
        generation: Generation,
        plan: [(&str, usize, usize); 3],
    ) -> Result<()> {
        self.start_ops(OperatorOptions::default(), 1).await?;
        let mut idxs = Vec::new();
        for (t, z, pods) in plan {
            idxs.push(self.add_plain(t, z, Some(generation), pods).await?);
        }
        self.wait_served(&idxs, self.cfg.timeout).await?;
        for &i in &idxs {
            self.assert_pod_enis_follow_spec(i).await?;
            let cn = self.cn(i).await?;
            let name = &self.nodes[i].name;
            match generation {
                Generation::Classic => {
                    let used = cn.status.as_ref().map_or(0, |s| s.ipam.used.len());
                    ensure!(
                        used == endpoints(self.nodes[i].agent.as_ref().unwrap().pods()),
                        "{name}: used has {used} entries"
                    );
                    ensure!(ours(&cn), "{name}: no finalizer");
                }
                Generation::MultiPool => {
                    ensure!(
                        cn.status.as_ref().is_none_or(|s| s.ipam.used.is_empty()),
                        "{name}: status.ipam.used not empty"
                    );
                    ensure!(
                        !cn.spec.ipam.pool.is_empty(),
                        "{name}: pool not published for a multi-pool node (C9)"
                    );
                }
            }
        }
        Ok(())
    }

    /// The operator's ENIs are in the node's AZ, on a tagged pod subnet, at device index ≥ 1.
    async fn assert_pod_enis_follow_spec(&self, idx: usize) -> Result<()> {
        let n = &self.nodes[idx];
        let cn = self.cn(idx).await?;
        let pod_subnets: BTreeMap<&str, &str> = self
            .world
            .subnets
            .iter()
            .filter(|s| s.pods && s.az == n.instance.az)
            .map(|s| (s.id.as_str(), s.cidr.as_str()))
            .collect();
        let ours = self.enis_for(&n.instance.id).await?;
        ensure!(!ours.is_empty(), "{}: no ENI of ours", n.name);
        let status = cn.status.unwrap_or_default();
        for e in &ours {
            let entry = status
                .eni
                .enis
                .get(&e.id)
                .ok_or_else(|| anyhow!("{}: {} missing from status", n.name, e.id))?;
            ensure!(
                pod_subnets.get(entry.subnet.id.as_str()) == Some(&entry.subnet.cidr.as_str()),
                "{}: {} on subnet {} ({}), not a tagged pod subnet of {}",
                n.name,
                e.id,
                entry.subnet.id,
                entry.subnet.cidr,
                n.instance.az
            );
            ensure!(
                entry
                    .security_groups
                    .contains(&self.world.pod_security_group),
                "{}: {} lacks the tagged security group: {:?}",
                n.name,
                e.id,
                entry.security_groups
            );
            ensure!(
                entry.number >= 1,
                "{}: {} at device index {}",
                n.name,
                e.id,
                entry.number
            );
            ensure!(
                !entry.vpc.primary_cidr.is_empty(),
                "{}: {} without vpc.primary-cidr (C4)",
                n.name,
                e.id
            );
        }
        Ok(())
    }

    async fn mixed_fleet(&mut self) -> Result<()> {
        self.start_ops(OperatorOptions::default(), 1).await?;
        let plan = [
            ("m5.large", 0, Generation::Classic, 3),
            ("t3.large", 1, Generation::Classic, 5),
            ("c5.xlarge", 0, Generation::MultiPool, 4),
            ("m5.xlarge", 1, Generation::MultiPool, 6),
        ];
        let mut idxs = Vec::new();
        for (t, z, g, pods) in plan {
            idxs.push(self.add_plain(t, z, Some(g), pods).await?);
        }
        self.wait_served(&idxs, self.cfg.timeout).await?;
        // A rolling agent upgrade: node 0's classic agent is replaced by a multi-pool one.
        let first = idxs[0];
        self.start_agent(first, Generation::MultiPool, 6);
        self.wait_served(&idxs, self.cfg.timeout).await?;
        let cn = self.cn(first).await?;
        ensure!(
            cn.status.as_ref().is_none_or(|s| s.ipam.used.is_empty()),
            "upgraded node still has used entries"
        );
        Ok(())
    }

    async fn prefix_delegation(&mut self) -> Result<()> {
        self.start_ops(
            OperatorOptions {
                prefix_delegation: true,
                ..Default::default()
            },
            1,
        )
        .await?;
        let [a, b] = self
            .add_both_generations(("m5.xlarge", 4), ("c5.xlarge", 4))
            .await?;
        let mut reported = BTreeSet::new();
        eventually(self.cfg.timeout, "prefix nodes to be served", async || {
            for i in [a, b] {
                let cn = self.cn(i).await?;
                let err = cn
                    .status
                    .as_ref()
                    .and_then(|s| s.ipam.operator_status.error.clone());
                if err.is_some_and(|e| e.to_lowercase().contains("prefix")) {
                    reported.insert(self.nodes[i].name.clone());
                }
            }
            self.served_notes(&[a, b]).await
        })
        .await?;
        let mut with_prefixes = false;
        let mut before = BTreeMap::new();
        for i in [a, b] {
            let enis = self.enis_for(&self.nodes[i].instance.id).await?;
            with_prefixes |= enis.iter().any(|e| !e.prefixes.is_empty());
            before.insert(
                i,
                enis.iter().map(|e| e.id.clone()).collect::<BTreeSet<_>>(),
            );
        }
        if !with_prefixes {
            // The endpoint hands back no prefixes (emulators): the operator must say so on the
            // node (status or Event) and have served it with secondary IPs instead.
            for i in [a, b] {
                let name = self.nodes[i].name.clone();
                let events = self.warning_events(&name).await?;
                let evented = events.iter().any(|e| e.to_lowercase().contains("prefix"));
                ensure!(
                    reported.contains(&name) || evented,
                    "{name}: got no prefixes but reported nothing about it (events: {events:?})"
                );
            }
        }
        // No loop: over three resyncs, no ENI is added or replaced.
        tokio::time::sleep(self.cfg.resync * 3).await;
        for i in [a, b] {
            let after = self.eni_ids_for(&self.nodes[i].instance.id).await?;
            ensure!(
                after == before[&i],
                "{}: ENIs changed while idle: {:?} -> {after:?}",
                self.nodes[i].name,
                before[&i]
            );
            // Both types take 4 ENIs, the primary one not ours.
            ensure!(
                after.len() <= 3,
                "{}: {} ENIs",
                self.nodes[i].name,
                after.len()
            );
        }
        Ok(())
    }

    async fn demand_growth(&mut self) -> Result<()> {
        self.start_ops(OperatorOptions::default(), 1).await?;
        let [a, b] = self
            .add_both_generations(("m5.xlarge", 2), ("c5.xlarge", 2))
            .await?;
        self.wait_served(&[a, b], self.cfg.timeout).await?;
        let mut before = BTreeMap::new();
        for i in [a, b] {
            before.insert(i, self.enis_for(&self.nodes[i].instance.id).await?.len());
            self.set_pods(i, 20);
        }
        self.wait_served(&[a, b], self.cfg.timeout).await?;
        for i in [a, b] {
            let after = self.enis_for(&self.nodes[i].instance.id).await?;
            ensure!(
                after.len() > before[&i],
                "{}: still {} ENIs after growth",
                self.nodes[i].name,
                after.len()
            );
            ensure!(
                after.iter().all(|e| e.status == "in-use"),
                "{}: new ENI not attached: {after:?}",
                self.nodes[i].name
            );
            self.assert_eni_count_at_most(i, 20).await?;
            self.assert_pod_enis_follow_spec(i).await?;
        }
        Ok(())
    }

    async fn demand_drop(&mut self) -> Result<()> {
        self.start_ops(
            OperatorOptions {
                release_delay_secs: Some(5),
                ..Default::default()
            },
            1,
        )
        .await?;
        let [a, b] = self
            .add_both_generations(("m5.xlarge", 20), ("c5.xlarge", 20))
            .await?;
        self.wait_served(&[a, b], self.cfg.timeout).await?;
        let mut before = BTreeMap::new();
        for i in [a, b] {
            let ids = self.eni_ids_for(&self.nodes[i].instance.id).await?;
            before.insert(i, ids);
            self.set_pods(i, 2);
        }
        let target = endpoints(2) + testkit::agent::MULTI_POOL_PRE_ALLOCATE;
        eventually(self.cfg.timeout, "excess to be released", async || {
            let mut notes = Vec::new();
            for i in [a, b] {
                let cn = self.cn(i).await?;
                let avail = available(&cn, self.nodes[i].generation());
                if avail > target || self.served_note(i).await?.is_err() {
                    notes.push(format!(
                        "{}: {avail} available, want {target}",
                        self.nodes[i].name
                    ));
                }
            }
            all_met(notes)
        })
        .await?;
        let classic = self.nodes[a].agent.as_ref().unwrap().report();
        ensure!(
            classic.ready_answers > 0,
            "classic node released without a ready-for-release answer"
        );
        for i in [a, b] {
            let ids = self.eni_ids_for(&self.nodes[i].instance.id).await?;
            ensure!(
                ids == before[&i],
                "{}: release changed ENIs {:?} -> {ids:?}",
                self.nodes[i].name,
                before[&i]
            );
        }
        Ok(())
    }

    async fn node_deletion(&mut self) -> Result<()> {
        self.start_ops(OperatorOptions::default(), 1).await?;
        let [a, b] = self
            .add_both_generations(("m5.xlarge", 14), ("m5.xlarge", 4))
            .await?;
        self.wait_served(&[a, b], self.cfg.timeout).await?;
        let inst_a = self.nodes[a].instance.id.clone();
        ensure!(
            !self.enis_for(&inst_a).await?.is_empty(),
            "no ENI made for {inst_a}"
        );

        // The Node goes: garbage collection deletes the CiliumNode, the finalizer our ENIs.
        let name_a = self.nodes[a].name.clone();
        self.nodes[a].agent.as_ref().unwrap().stop();
        self.terminate_instances(vec![inst_a.clone()]).await?;
        self.k8s_nodes()
            .delete(&name_a, &DeleteParams::background())
            .await?;
        eventually(
            self.cfg.timeout,
            "CiliumNode and ENIs of the deleted Node to go",
            async || {
                let cn = self.cns().get_opt(&name_a).await?;
                let left = self.enis_for(&inst_a).await?;
                Ok(if cn.is_none() && left.is_empty() {
                    Ok(())
                } else {
                    Err(format!(
                        "CiliumNode present: {}, ENIs left: {:?}",
                        cn.is_some(),
                        left.iter().map(|e| &e.id).collect::<Vec<_>>()
                    ))
                })
            },
        )
        .await?;

        // Only the CiliumNode goes (the Node stays): ENIs stay and are adopted again.
        let name_b = self.nodes[b].name.clone();
        let inst_b = self.nodes[b].instance.id.clone();
        let enis_b = self.eni_ids_for(&inst_b).await?;
        self.nodes[b].agent.as_ref().unwrap().stop();
        self.cns()
            .delete(&name_b, &DeleteParams::background())
            .await?;
        eventually(self.cfg.timeout, "the CiliumNode to go", async || {
            Ok(if self.cns().get_opt(&name_b).await?.is_none() {
                Ok(())
            } else {
                Err("still there".into())
            })
        })
        .await?;
        let still = self.eni_ids_for(&inst_b).await?;
        ensure!(
            still == enis_b,
            "ENIs of a live Node changed on CiliumNode deletion: {enis_b:?} -> {still:?}"
        );
        let node = self.k8s_nodes().get(&name_b).await?;
        self.create_cilium_node(b, &node, &NodeVariant::default())
            .await?;
        self.start_agent(b, Generation::MultiPool, 4);
        self.wait_served(&[b], self.cfg.timeout).await?;
        let again = self.eni_ids_for(&inst_b).await?;
        ensure!(
            again == enis_b,
            "recreated CiliumNode did not adopt its ENIs: {enis_b:?} -> {again:?}"
        );
        Ok(())
    }

    /// A Node that is deleted but held by another finalizer (Karpenter draining it) still has
    /// its instance running: nothing changes for it until the Node is really gone.
    async fn draining_node(&mut self) -> Result<()> {
        let a = self.one_served_node(14).await?;
        let name = self.nodes[a].name.clone();
        let inst = self.nodes[a].instance.id.clone();
        ensure!(
            !self.enis_for(&inst).await?.is_empty(),
            "no ENI made for {inst}"
        );
        // Settled: the same EC2 picture one resync apart.
        let pause = self.cfg.resync + Duration::from_secs(2);
        let before = eventually(self.cfg.timeout, "the node's ENIs to settle", async || {
            let first = self.instance_snapshot(&inst).await?;
            tokio::time::sleep(pause).await;
            let second = self.instance_snapshot(&inst).await?;
            Ok(if first == second {
                Ok(second)
            } else {
                Err(format!("{first:?} -> {second:?}"))
            })
        })
        .await?;

        // Karpenter's way: its finalizer on the Node, then the delete. The Node stays.
        let node = self.k8s_nodes().get(&name).await?;
        let mut finalizers = node.metadata.finalizers.clone().unwrap_or_default();
        finalizers.push(DRAIN_FINALIZER.to_string());
        let patch = json!({"metadata": {
            "finalizers": finalizers,
            "resourceVersion": node.metadata.resource_version,
        }});
        self.k8s_nodes()
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .context("adding the drain finalizer")?;
        self.k8s_nodes()
            .delete(&name, &DeleteParams::background())
            .await?;
        let node = self.k8s_nodes().get(&name).await?;
        ensure!(
            node.metadata.deletion_timestamp.is_some(),
            "the Node has no deletionTimestamp"
        );

        // Draining for several resyncs (and a GC run): no EC2 change, the CiliumNode stays.
        let hold = self.cfg.resync * 4 + self.cfg.gc;
        let until = Instant::now() + hold;
        while Instant::now() < until {
            let cn = self.cns().get_opt(&name).await?;
            ensure!(
                cn.as_ref()
                    .is_some_and(|c| c.metadata.deletion_timestamp.is_none()),
                "the CiliumNode of a draining Node was deleted"
            );
            let now = self.instance_snapshot(&inst).await?;
            ensure!(
                now == before,
                "EC2 changed for a draining Node: {before:?} -> {now:?}"
            );
            tokio::time::sleep(Duration::from_secs(2)).await;
        }

        // Drained: the instance ends and the Node goes; its CiliumNode and our ENIs with it.
        self.nodes[a].agent.as_ref().unwrap().stop();
        self.terminate_instances(vec![inst.clone()]).await?;
        self.drop_node_finalizer(&name, DRAIN_FINALIZER).await?;
        eventually(
            self.cfg.timeout,
            "Node, CiliumNode and ENIs of the drained Node to go",
            async || {
                let node = self.k8s_nodes().get_opt(&name).await?;
                let cn = self.cns().get_opt(&name).await?;
                let left = self.enis_for(&inst).await?;
                Ok(if node.is_none() && cn.is_none() && left.is_empty() {
                    Ok(())
                } else {
                    Err(format!(
                        "Node present: {}, CiliumNode present: {}, ENIs left: {:?}",
                        node.is_some(),
                        cn.is_some(),
                        left.iter().map(|e| &e.id).collect::<Vec<_>>()
                    ))
                })
            },
        )
        .await?;
        Ok(())
    }

    async fn leader_failover(&mut self) -> Result<()> {
        self.start_ops(OperatorOptions::default(), 2).await?;
        let leader = eventually(self.cfg.timeout, "a leader", async || {
            let running = self.ops.running().await?;
            Ok(match self.ops.leader().await? {
                Some(l) if running.iter().any(|r| l.contains(r.as_str())) => Ok(l),
                other => Err(format!("lease holder {other:?}, running {running:?}")),
            })
        })
        .await?;
        let [a, b] = self
            .add_both_generations(("m5.xlarge", 2), ("c5.xlarge", 2))
            .await?;
        self.wait_served(&[a, b], self.cfg.timeout).await?;

        self.ops.kill(&leader).await?;
        let killed = Instant::now();
        for i in [a, b] {
            self.set_pods(i, 15);
        }
        let takeover = self.cfg.lease + self.cfg.resync + Duration::from_secs(15);
        let new_leader = eventually(takeover, "another operator to take the lease", async || {
            let running = self.ops.running().await?;
            Ok(match self.ops.leader().await? {
                Some(l) if l != leader && running.iter().any(|r| l.contains(r.as_str())) => Ok(l),
                other => Err(format!("lease holder {other:?}")),
            })
        })
        .await?;
        tracing::info!(%leader, %new_leader, "failover");
        self.wait_served(&[a, b], takeover + self.cfg.timeout)
            .await?;
        // Issue 24's target (a figure, not asserted): every node served <= 20 s after the kill
        // with a 15 s lease.
        let seconds = killed.elapsed().as_secs_f64();
        tracing::info!(
            seconds,
            "the survivor served every node this long after the SIGKILL"
        );
        for i in [a, b] {
            self.assert_eni_count_at_most(i, 15).await?;
        }
        Ok(())
    }

    /// Issue 29 item 0: the operator starts while three classic m5.large nodes' CiliumNodes
    /// exist and their agents write (every deploy, upgrade and failover), with production's
    /// 60 s resyncs: every node is served within seconds of the Lease being held. Two of the
    /// three used to wait for the 60 s rescan (their first pass met the first one's
    /// instance-type lookup in flight and planned without limits). Logs the figure.
    async fn start_with_nodes(&mut self) -> Result<()> {
        let mut idxs = Vec::new();
        for zone in [0, 1, 0] {
            let i = self
                .add_plain("m5.large", zone, Some(Generation::Classic), 2)
                .await?;
            idxs.push(i);
        }
        let opts = OperatorOptions {
            resync_secs: Some(60),
            ..OperatorOptions::default()
        };
        self.start_ops(opts, 1).await?;
        // Tight polls: the figure is a few seconds.
        let deadline = Instant::now() + self.cfg.timeout;
        let held = loop {
            if let Some(note) = self.ops.exited_note() {
                bail!("{note}");
            }
            if self.ops.leader().await?.is_some() {
                break Instant::now();
            }
            ensure!(Instant::now() < deadline, "no operator took the Lease");
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        loop {
            match self.served_notes(&idxs).await? {
                Ok(()) => break,
                Err(note) => ensure!(
                    Instant::now() < deadline,
                    "nodes present at the start not served: {note}"
                ),
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        let seconds = held.elapsed().as_secs_f64();
        tracing::info!(
            seconds,
            "first convergence of the nodes present at the start, after the Lease was held"
        );
        // Not a speed target (that is the figure above, <= 5 s on these machines): the bound
        // only tells a node that waited for the 60 s rescan from one that did not.
        ensure!(
            seconds < 40.0,
            "the nodes present at the start took {seconds:.1} s after the Lease was held: \
             some waited for the rescan"
        );
        Ok(())
    }

    async fn restart_mid_allocation(&mut self) -> Result<()> {
        self.start_ops(OperatorOptions::default(), 1).await?;
        let mut idxs = Vec::new();
        for (t, z, g) in [
            ("m5.xlarge", 0, Generation::Classic),
            ("c5.xlarge", 1, Generation::Classic),
            ("m5.xlarge", 1, Generation::MultiPool),
        ] {
            idxs.push(self.add_plain(t, z, Some(g), 18).await?);
        }
        let instances: BTreeSet<String> = idxs
            .iter()
            .map(|&i| self.nodes[i].instance.id.clone())
            .collect();
        // Kill as soon as the first ENI for any of them exists: polled tightly, since an
        // emulator answers in milliseconds and the whole allocation takes only seconds.
        let deadline = Instant::now() + self.cfg.timeout;
        loop {
            let any = self.owned_enis().await?.iter().any(|e| {
                e.tags
                    .get(OWNER_INSTANCE_TAG)
                    .is_some_and(|i| instances.contains(i))
            });
            if any {
                break;
            }
            if let Some(note) = self.ops.exited_note() {
                bail!("{note}");
            }
            ensure!(
                Instant::now() < deadline,
                "no ENI created within {}s",
                self.cfg.timeout.as_secs()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let served_before_kill = self.nodes_served(&idxs).await?;
        tracing::info!(served_before_kill, "killing the operator mid-allocation");
        for id in self.ops.running().await? {
            self.ops.kill(&id).await?;
        }
        self.ops.stop_all().await?;
        self.start_ops(OperatorOptions::default(), 1).await?;
        self.wait_served(&idxs, self.cfg.lease + self.cfg.timeout)
            .await?;
        for &i in &idxs {
            self.assert_eni_count_at_most(i, 18).await?;
        }
        Ok(())
    }

    /// The first attaches are refused for good by EC2 (a fault proxy between the operator and
    /// the endpoint answers them `InvalidParameterValue`). The operator deletes each refused
    /// ENI and creates the next with a fresh ClientToken (the old one now names a deleted ENI),
    /// so every node converges and none of our ENIs stays `available`.
    async fn attach_faults(&mut self) -> Result<()> {
        const FAULTS: usize = 3;
        const ATTACH: &str = "AttachNetworkInterface";
        ensure!(
            self.ops.is_local(),
            "attach-faults needs local mode: the fault proxy runs next to the suite"
        );
        let proxy = FaultProxy::start(&self.ops.settings.ec2_endpoint).await?;
        proxy.fail_next(ATTACH, FAULTS, Fault::refused("InvalidParameterValue"));
        let url = proxy.url();
        self.fault_proxy = Some(proxy);
        self.start_ops(
            OperatorOptions {
                ec2_endpoint: Some(url),
                ..Default::default()
            },
            1,
        )
        .await?;
        // 12 pods need a second ENI on both types: at least two attaches after the faults.
        let mut idxs = Vec::new();
        for (t, z, g) in [
            ("m5.large", 0, Generation::Classic),
            ("m5.xlarge", 1, Generation::MultiPool),
        ] {
            idxs.push(self.add_plain(t, z, Some(g), 12).await?);
        }
        self.wait_served(&idxs, self.cfg.timeout).await?;
        let proxy = self.fault_proxy.as_ref().expect("set above");
        ensure!(
            proxy.injected(ATTACH) == FAULTS,
            "{} of {FAULTS} attach faults were injected ({} attaches forwarded)",
            proxy.injected(ATTACH),
            proxy.forwarded(ATTACH)
        );
        for &i in &idxs {
            self.assert_eni_count_at_most(i, 12).await?;
        }
        // At once, not only after the GC intervals the invariants allow: a refused attach
        // deletes its ENI.
        let left: Vec<String> = self
            .owned_enis()
            .await?
            .into_iter()
            .filter(|e| e.status == "available")
            .map(|e| e.id)
            .collect();
        ensure!(left.is_empty(), "ENIs of ours left available: {left:?}");
        Ok(())
    }

    async fn bad_input(&mut self) -> Result<()> {
        self.start_ops(OperatorOptions::default(), 1).await?;
        let good = [
            self.add_plain("m5.large", 0, Some(Generation::Classic), 3)
                .await?,
            self.add_plain("t3.large", 1, Some(Generation::MultiPool), 3)
                .await?,
        ];
        let z0 = self.world.node_subnet(0).clone();
        let ghost = Instance {
            id: "i-0e2e0000000000dead".into(),
            instance_type: "m5.large".into(),
            az: z0.az.clone(),
            subnet_id: z0.id.clone(),
        };
        let unknown = self
            .add_node_for(ghost, Some(Generation::Classic), 1, NodeVariant::default())
            .await?;
        let other_zone = NodeVariant {
            subnet_ids: Some(vec![self.world.pod_subnet(1).id.clone()]),
            ..Default::default()
        };
        let no_subnet = self
            .add_node("m5.large", 0, Some(Generation::Classic), 1, other_zone)
            .await?;
        let mut bad = vec![unknown, no_subnet];
        let invalid = NodeVariant {
            pre_allocate: -1,
            min_allocate: -3,
            ..Default::default()
        };
        match self
            .add_node("m5.large", 1, Some(Generation::Classic), 1, invalid)
            .await
        {
            Ok(i) => bad.push(i),
            // The CRD's schema refusing the numbers is a clear answer too.
            Err(e)
                if e.chain().any(|c| {
                    c.downcast_ref::<kube::Error>()
                        .is_some_and(|k| is_status(k, 422))
                }) =>
            {
                tracing::info!("invalid numbers rejected by the API server: {e:#}");
            }
            Err(e) => return Err(e),
        }
        self.wait_served(&good, self.cfg.timeout).await?;
        eventually(
            self.cfg.timeout,
            "bad nodes to get operator-status and a Warning Event",
            async || {
                let mut notes = Vec::new();
                for &i in &bad {
                    let name = &self.nodes[i].name;
                    let cn = self.cn(i).await?;
                    let err = cn
                        .status
                        .as_ref()
                        .and_then(|s| s.ipam.operator_status.error.clone())
                        .unwrap_or_default();
                    let events = self.warning_events(name).await?;
                    if err.is_empty() || events.is_empty() {
                        notes.push(format!(
                            "{name}: operator-status {err:?}, warning events {}",
                            events.len()
                        ));
                    }
                }
                all_met(notes)
            },
        )
        .await?;
        let ghost_enis = self.enis_for(&self.nodes[unknown].instance.id).await?;
        ensure!(
            ghost_enis.is_empty(),
            "ENIs created for an unknown instance: {ghost_enis:?}"
        );
        // Good nodes stay served.
        self.wait_served(&good, self.cfg.timeout).await
    }

    /// Per node of `idxs`: its CiliumNode's resourceVersion and field managers.
    async fn node_marks(&self, idxs: &[usize]) -> Result<BTreeMap<String, checks::NodeMark>> {
        let mut out = BTreeMap::new();
        for &i in idxs {
            out.insert(
                self.nodes[i].name.clone(),
                checks::node_mark(&self.cn(i).await?),
            );
        }
        Ok(out)
    }

    /// Every ENI of the nodes' instances: attached ones (ours or not) and ours by tag.
    async fn instance_enis(&self, idxs: &[usize]) -> Result<Vec<EniView>> {
        let mut out: BTreeMap<String, EniView> = BTreeMap::new();
        for &i in idxs {
            let id = &self.nodes[i].instance.id;
            for e in ec2seed::instance_enis(&self.ec2, id).await? {
                out.insert(e.id.clone(), e);
            }
            for e in self.enis_for(id).await? {
                out.insert(e.id.clone(), e);
            }
        }
        Ok(out.into_values().collect())
    }

    /// Steady state costs nothing: once the nodes are served and their CiliumNodes stopped
    /// changing, a quiet minute (many resyncs) brings no CiliumNode write and no EC2 change.
    /// Meant for `E2E_CRD=cilium` (Cilium's own CRD, which prunes `status.eni-operator`: the
    /// operator used to rewrite it on every pass); under our CRD the same holds and the summary
    /// must be there.
    async fn cilium_crd_steady_state(&mut self) -> Result<()> {
        let crds: Api<CustomResourceDefinition> = Api::all(self.kube.clone());
        let crd = crds
            .get("ciliumnodes.cilium.io")
            .await
            .context("reading the CiliumNode CRD")?;
        let prunes = checks::crd_prunes_summary(&serde_json::to_value(&crd)?)
            .map_err(|e| anyhow!("the installed CiliumNode CRD: {e}"))?;
        tracing::info!(
            "installed CiliumNode CRD {}",
            if prunes {
                "prunes status.eni-operator (Cilium's)"
            } else {
                "keeps status.eni-operator (ours; E2E_CRD=cilium tests Cilium's)"
            }
        );
        self.start_ops(OperatorOptions::default(), 1).await?;
        let [a, b] = self
            .add_both_generations(("m5.large", 5), ("c5.xlarge", 4))
            .await?;
        let idxs = [a, b];
        self.wait_served(&idxs, self.cfg.timeout).await?;
        // Converged: nothing written to the CiliumNodes for two resyncs and the describe lag
        // after the operator's own EC2 changes (checks::settle_window).
        let settle = checks::settle_window(self.cfg.resync);
        let before = eventually(self.cfg.timeout, "the CiliumNodes to settle", async || {
            let first = self.node_marks(&idxs).await?;
            tokio::time::sleep(settle).await;
            let second = self.node_marks(&idxs).await?;
            Ok(if first == second {
                Ok(second)
            } else {
                Err(checks::quiet_changes(&first, &second, &[], &[]).join("; "))
            })
        })
        .await?;
        let enis_before = self.instance_enis(&idxs).await?;
        let quiet = Duration::from_secs(60).max(self.cfg.resync * 2 + Duration::from_secs(5));
        tokio::time::sleep(quiet).await;
        let after = self.node_marks(&idxs).await?;
        let enis_after = self.instance_enis(&idxs).await?;
        let changes = checks::quiet_changes(&before, &after, &enis_before, &enis_after);
        ensure!(
            changes.is_empty(),
            "in a quiet {}s after convergence (resync every {}s): {}",
            quiet.as_secs(),
            self.cfg.resync.as_secs(),
            changes.join("; ")
        );
        for i in idxs {
            let summary = self
                .cn(i)
                .await?
                .status
                .and_then(|s| s.eni_operator)
                .is_some();
            ensure!(
                summary != prunes,
                "{}: status.eni-operator {} although the CRD {} it",
                self.nodes[i].name,
                if summary { "present" } else { "absent" },
                if prunes { "prunes" } else { "keeps" }
            );
        }
        // Still served at the end (the agents saw nothing go).
        self.wait_served(&idxs, self.cfg.timeout).await
    }

    async fn rbac(&mut self) -> Result<()> {
        let user = format!(
            "system:serviceaccount:{}:{}",
            self.ops.settings.namespace, self.cfg.service_account
        );
        let ns = self.ops.settings.namespace.clone();
        let mut missing = Vec::new();
        for alternatives in REQUIRED_ACCESS {
            let mut ok = false;
            for &(group, resource, sub, verb) in *alternatives {
                let at = checks::access_namespace(resource, &ns);
                let name = checks::access_name(resource, &self.ops.settings.lease_name);
                ok |= self
                    .allowed(&user, (group, resource, sub, verb), at, name)
                    .await?;
            }
            if !ok {
                let (_, resource, sub, verb) = alternatives[0];
                let slash = if sub.is_empty() { "" } else { "/" };
                missing.push(format!("{verb} {resource}{slash}{sub}"));
            }
        }
        ensure!(missing.is_empty(), "{user} lacks: {}", missing.join(", "));
        for &(group, resource, sub, verb) in FORBIDDEN_ACCESS {
            ensure!(
                !self
                    .allowed(&user, (group, resource, sub, verb), None, None)
                    .await?,
                "{user} may {verb} {resource}: not least privilege"
            );
        }
        if self.ops.is_local() {
            ensure!(
                std::env::var_os("E2E_OPERATOR_KUBECONFIG").is_some(),
                "local operators run with the suite's own identity: set E2E_OPERATOR_KUBECONFIG to the ServiceAccount's kubeconfig"
            );
        }
        // And the identity really does the job: allocation, finalizer, node deletion.
        self.start_ops(
            OperatorOptions {
                release_delay_secs: Some(5),
                ..Default::default()
            },
            1,
        )
        .await?;
        let a = self
            .add_plain("m5.large", 0, Some(Generation::Classic), 3)
            .await?;
        self.wait_served(&[a], self.cfg.timeout).await?;
        Ok(())
    }

    async fn allowed(
        &self,
        user: &str,
        (group, resource, sub, verb): checks::Access,
        namespace: Option<String>,
        name: Option<String>,
    ) -> Result<bool> {
        let sar = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(user.to_string()),
                groups: Some(vec![
                    "system:serviceaccounts".into(),
                    "system:authenticated".into(),
                    format!("system:serviceaccounts:{}", self.ops.settings.namespace),
                ]),
                resource_attributes: Some(ResourceAttributes {
                    group: Some(group.to_string()),
                    resource: Some(resource.to_string()),
                    subresource: (!sub.is_empty()).then(|| sub.to_string()),
                    verb: Some(verb.to_string()),
                    namespace,
                    name,
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let api: Api<SubjectAccessReview> = Api::all(self.kube.clone());
        let out = api
            .create(&PostParams::default(), &sar)
            .await
            .context("SubjectAccessReview")?;
        Ok(out.status.is_some_and(|s| s.allowed))
    }

    /// Deletes leftovers of this run (Nodes and CiliumNodes with our run label).
    pub async fn purge(&self) -> Result<()> {
        let lp = ListParams::default().labels(&format!("{RUN_LABEL}={}", self.world.run_id));
        for n in self.k8s_nodes().list(&lp).await?.items {
            let name = n.metadata.name.as_deref().unwrap_or_default();
            let _ = self.drop_node_finalizer(name, DRAIN_FINALIZER).await;
            let _ = self
                .k8s_nodes()
                .delete(name, &DeleteParams::background())
                .await;
        }
        for cn in self.cns().list(&lp).await?.items {
            self.remove_finalizer(&cn).await;
            let _ = self
                .cns()
                .delete(
                    cn.metadata.name.as_deref().unwrap_or_default(),
                    &DeleteParams::default(),
                )
                .await;
        }
        Ok(())
    }
}

/// The account's throttling buckets, nearly empty: (bucket, burst, refill per second). AWS's
/// buckets are per account and Region and shared with every other tool (see
/// `testkit::sim::throttle`); here the others have left this much.
const THROTTLED_BUCKETS: &[(&str, u32, u32)] = &[
    ("describe", 5, 2),
    ("general-mutating", 2, 1),
    ("create-network-interface", 2, 1),
    ("assign-private-ip-addresses", 2, 1),
    ("unassign-private-ip-addresses", 2, 1),
    ("modify-network-interface-attribute", 2, 1),
    ("delete-network-interface", 2, 1),
];

impl Suite {
    /// A throttled account (ec2-sim only): every bucket refills at 1-2 calls a second, so
    /// ec2-sim answers many calls `RequestLimitExceeded` (HTTP 503) while four nodes need
    /// several ENIs each. The operator backs off and still serves every node within the usual
    /// budget, with no extra ENI; the buckets are AWS's again before the invariants run.
    async fn throttled_account(&mut self) -> Result<()> {
        let sim = SimControl::connect(&self.ops.settings.ec2_endpoint).await?;
        let result = self.throttled_account_on(&sim).await;
        let reset = sim.reset_throttling().await;
        let (idxs, throttled) = result?;
        reset?;
        println!("     throttled-account: ec2-sim answered {throttled} calls RequestLimitExceeded");
        for (i, pods) in idxs {
            self.assert_eni_count_at_most(i, pods).await?;
        }
        Ok(())
    }

    /// The nodes (index, pods) and the throttled answers while they were served.
    async fn throttled_account_on(
        &mut self,
        sim: &SimControl,
    ) -> Result<(Vec<(usize, usize)>, u64)> {
        let before = sim.throttled().await?;
        for (bucket, burst, per_second) in THROTTLED_BUCKETS {
            sim.set_bucket(bucket, *burst, *per_second).await?;
        }
        self.start_ops(OperatorOptions::default(), 1).await?;
        let mut idxs = Vec::new();
        for (t, z, g, pods) in [
            ("m5.large", 0, Generation::Classic, 14),
            ("m5.xlarge", 1, Generation::MultiPool, 20),
            ("t3.large", 0, Generation::MultiPool, 14),
            ("m5.large", 1, Generation::Classic, 14),
        ] {
            let i = self.add_plain(t, z, Some(g), pods).await?;
            idxs.push((i, pods));
        }
        let nodes: Vec<usize> = idxs.iter().map(|(i, _)| *i).collect();
        // `eni-operator status` while they are served: it says why every waiting node waits,
        // and a throttled node says so.
        let seen = self.wait_served_reading_status(&nodes).await?;
        self.assert_status_showed(&seen, WaitReason::Throttled)?;
        let throttled = sim.throttled().await? - before;
        ensure!(
            throttled > 0,
            "ec2-sim answered no call RequestLimitExceeded: the account was not throttled"
        );
        Ok((idxs, throttled))
    }
}

impl Suite {
    /// Static IPs (`spec.ipam.static-ip-tags`, Cilium's Elastic IP feature) on the real path:
    /// two nodes want the one free tagged Elastic IP (one gets it, associated with its primary
    /// ENI's primary address and published in `status.ipam.assigned-static-ip`; the other
    /// reports `NoStaticIp` in operator-status and an Event and gets nothing allocated) while a
    /// node without tags is served; the operator restarts with the winner's published address
    /// lost and a second free address added: the winner adopts its own (never a second one),
    /// the other node gets the new one; the winner's instance stops and its Node goes: its
    /// address is disassociated, not released.
    async fn static_ip(&mut self) -> Result<()> {
        let run = self.world.run_id.clone();
        let first = ec2seed::allocate_eip(&self.ec2, &run, &self.cfg.cluster_name).await?;
        self.start_ops(OperatorOptions::default(), 1).await?;
        let wants = NodeVariant {
            static_ip_tags: BTreeMap::from([(ec2seed::EIP_TAG.to_string(), run.clone())]),
            ..Default::default()
        };
        // Both instances first, so the two CiliumNodes arrive back to back.
        let ia = self.world.launch(&self.ec2, "m5.large", 0).await?;
        let ib = self.world.launch(&self.ec2, "t3.large", 1).await?;
        let a = self
            .add_node_for(ia, Some(Generation::Classic), 3, wants.clone())
            .await?;
        let b = self
            .add_node_for(ib, Some(Generation::MultiPool), 3, wants.clone())
            .await?;
        let plain = self
            .add_plain("m5.large", 1, Some(Generation::Classic), 3)
            .await?;

        // One wins the address; the other says why it has nothing; the plain node is served.
        let (winner, loser) = eventually(
            self.cfg.timeout,
            "one node to get the Elastic IP and the other to report NoStaticIp",
            async || {
                let (ca, cb) = (self.cn(a).await?, self.cn(b).await?);
                let (sa, sb) = (assigned_static_ip(&ca), assigned_static_ip(&cb));
                let (winner, loser, lost) = match (sa.as_str(), sb.as_str()) {
                    (ip, "") if ip == first.public_ip => (a, b, cb),
                    ("", ip) if ip == first.public_ip => (b, a, ca),
                    _ => return Ok(Err(format!("assigned-static-ip: {sa:?}, {sb:?}"))),
                };
                let error = operator_error(&lost);
                let name = &self.nodes[loser].name;
                let events = self.warning_events(name).await?;
                let evented = events.iter().any(|e| e.starts_with("NoStaticIp:"));
                let nothing = self.nothing_allocated(loser).await?;
                Ok(if error.contains("static-ip-tags") && evented && nothing {
                    Ok((winner, loser))
                } else {
                    Err(format!(
                        "{name}: operator-status {error:?}, events {events:?}, pool {}",
                        lost.spec.ipam.pool.len()
                    ))
                })
            },
        )
        .await?;
        self.wait_served(&[winner, plain], self.cfg.timeout).await?;
        self.assert_static_ips(&[(winner, &first.public_ip)])
            .await?;
        ensure!(
            self.nothing_allocated(loser).await?,
            "{}: addresses allocated before its static IP",
            self.nodes[loser].name
        );

        // A restart while the loser waits, with the winner's published address lost (a status
        // write that never landed) and a new free address: the winner adopts its own.
        self.ops.stop_all().await?;
        let name = self.nodes[winner].name.clone();
        let clear = json!({"status": {"ipam": {"assigned-static-ip": null}}});
        self.cns()
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&clear))
            .await
            .context("clearing assigned-static-ip")?;
        ensure!(
            assigned_static_ip(&self.cn(winner).await?).is_empty(),
            "{name}: assigned-static-ip not cleared"
        );
        let second = ec2seed::allocate_eip(&self.ec2, &run, &self.cfg.cluster_name).await?;
        self.start_ops(OperatorOptions::default(), 1).await?;
        eventually(
            self.cfg.timeout,
            "both nodes to have their Elastic IP published",
            async || {
                let sw = assigned_static_ip(&self.cn(winner).await?);
                let sl = assigned_static_ip(&self.cn(loser).await?);
                Ok(if sw == first.public_ip && sl == second.public_ip {
                    Ok(())
                } else {
                    Err(format!("winner {sw:?}, loser {sl:?}"))
                })
            },
        )
        .await?;
        self.wait_served(&[winner, loser, plain], self.cfg.timeout)
            .await?;
        self.assert_static_ips(&[(winner, &first.public_ip), (loser, &second.public_ip)])
            .await?;

        // The winner's instance stops (EC2 keeps an address associated with a stopped
        // instance) and its Node goes: the operator disassociates the address and keeps it.
        self.nodes[winner].agent.as_ref().expect("agent").stop();
        let instance = self.nodes[winner].instance.id.clone();
        self.ec2
            .stop_instances()
            .instance_ids(&instance)
            .send()
            .await
            .context("StopInstances")?;
        self.k8s_nodes()
            .delete(&name, &DeleteParams::background())
            .await?;
        eventually(
            self.cfg.timeout,
            "the Elastic IP of the removed node to be disassociated",
            async || {
                let gone = self.cns().get_opt(&name).await?.is_none();
                let now = ec2seed::eips(&self.ec2, &run).await?;
                let kept = now.iter().find(|e| e.allocation_id == first.allocation_id);
                let Some(e) = kept else {
                    return Err(Abort(format!("{} was released", first.allocation_id)).into());
                };
                Ok(match e {
                    e if gone && e.association_id.is_none() => Ok(()),
                    e => Err(format!(
                        "CiliumNode gone: {gone}, {} association {:?}",
                        e.allocation_id, e.association_id
                    )),
                })
            },
        )
        .await?;
        // The other node keeps its address.
        self.assert_static_ips(&[(loser, &second.public_ip)]).await
    }

    /// Nothing allocated to the node: no ENI of ours, an empty pool (Cilium allocates only once
    /// the static IP is assigned).
    async fn nothing_allocated(&self, idx: usize) -> Result<bool> {
        let pool = self.cn(idx).await?.spec.ipam.pool.len();
        let enis = self.enis_for(&self.nodes[idx].instance.id).await?;
        Ok(pool == 0 && enis.is_empty())
    }

    /// Each node's published address is the one EC2 associates with its primary ENI's primary
    /// private address, and no ENI of the run has more than one of the run's addresses.
    async fn assert_static_ips(&self, expected: &[(usize, &String)]) -> Result<()> {
        let eips = ec2seed::eips(&self.ec2, &self.world.run_id).await?;
        let mut per_eni: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for e in &eips {
            if let Some(eni) = e.network_interface_id.as_deref() {
                per_eni.entry(eni).or_default().push(&e.public_ip);
            }
        }
        let doubled: Vec<_> = per_eni.iter().filter(|(_, v)| v.len() > 1).collect();
        ensure!(doubled.is_empty(), "ENIs with two Elastic IPs: {doubled:?}");
        for &(i, ip) in expected {
            let n = &self.nodes[i];
            let published = assigned_static_ip(&self.cn(i).await?);
            ensure!(
                &published == ip,
                "{}: assigned-static-ip {published:?}, want {ip}",
                n.name
            );
            let (eni, private) = ec2seed::primary_address(&self.ec2, &n.instance.id).await?;
            let e = eips
                .iter()
                .find(|e| &e.public_ip == ip)
                .with_context(|| format!("{ip} not among the run's Elastic IPs"))?;
            ensure!(
                e.network_interface_id.as_deref() == Some(eni.as_str())
                    && e.private_ip.as_deref().is_none_or(|p| p == private),
                "{}: {ip} is on {:?} ({:?}), not on its primary ENI {eni} ({private})",
                n.name,
                e.network_interface_id,
                e.private_ip
            );
        }
        Ok(())
    }
}

fn assigned_static_ip(cn: &CiliumNode) -> String {
    cn.status
        .as_ref()
        .map(|s| s.ipam.assigned_static_ip.clone())
        .unwrap_or_default()
}

/// Whether the CiliumNode carries our finalizer.
fn ours(cn: &CiliumNode) -> bool {
    cn.metadata
        .finalizers
        .iter()
        .flatten()
        .any(|f| f == FINALIZER)
}

fn operator_error(cn: &CiliumNode) -> String {
    cn.status
        .as_ref()
        .and_then(|s| s.ipam.operator_status.error.clone())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn eventually_returns_success_times_out_and_aborts() {
        let mut calls = 0;
        let v = eventually(Duration::ZERO, "x", async || {
            calls += 1;
            Ok(Ok(7))
        })
        .await
        .unwrap();
        assert_eq!((v, calls), (7, 1));

        let err = eventually::<()>(Duration::ZERO, "the thing", async || {
            Ok(Err("not yet".to_string()))
        })
        .await
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "timed out after 0s waiting for the thing: not yet"
        );

        let err = eventually::<()>(Duration::from_secs(600), "y", async || {
            Err(Abort("operator died".into()).into())
        })
        .await
        .unwrap_err();
        assert_eq!(err.to_string(), "operator died");

        let err = eventually::<()>(Duration::ZERO, "z", async || Err(anyhow!("api hiccup")))
            .await
            .unwrap_err();
        assert!(err.to_string().ends_with("error: api hiccup"), "{err}");
    }

    #[test]
    fn the_drain_finalizer_is_removed_and_others_are_kept() {
        let list = vec![
            "karpenter.sh/termination".to_string(),
            DRAIN_FINALIZER.into(),
        ];
        assert_eq!(
            finalizer_removal(&list, DRAIN_FINALIZER, Some("7")),
            Some(json!({"metadata": {
                "finalizers": ["karpenter.sh/termination"],
                "resourceVersion": "7",
            }}))
        );
        assert_eq!(
            finalizer_removal(&list[..1], DRAIN_FINALIZER, Some("7")),
            None
        );
        assert_eq!(
            finalizer_removal(&list[1..], DRAIN_FINALIZER, None),
            Some(json!({"metadata": {"finalizers": [], "resourceVersion": null}}))
        );
    }

    #[test]
    fn an_eni_snapshot_ignores_order_but_sees_every_change() {
        let eni = |id: &str, addresses: &[&str]| EniView {
            id: id.into(),
            status: "in-use".into(),
            instance_id: Some("i-1".into()),
            device_index: Some(1),
            addresses: addresses.iter().map(|a| a.to_string()).collect(),
            prefixes: vec![],
            tags: BTreeMap::new(),
        };
        let a = eni_snapshot(&[eni("eni-1", &["10.0.0.1", "10.0.0.2"]), eni("eni-2", &[])]);
        let b = eni_snapshot(&[eni("eni-2", &[]), eni("eni-1", &["10.0.0.2", "10.0.0.1"])]);
        assert_eq!(a, b);
        let fewer = eni_snapshot(&[eni("eni-1", &["10.0.0.1"]), eni("eni-2", &[])]);
        assert_ne!(a, fewer, "an address released");
        let mut detached = eni("eni-2", &[]);
        detached.status = "available".into();
        let c = eni_snapshot(&[eni("eni-1", &["10.0.0.1", "10.0.0.2"]), detached]);
        assert_ne!(a, c, "an ENI detached");
        assert_ne!(
            a,
            eni_snapshot(&[eni("eni-1", &["10.0.0.1", "10.0.0.2"])]),
            "an ENI gone"
        );
    }

    #[test]
    fn every_scenario_is_documented() {
        let readme = include_str!("../README.md");
        for name in ALL {
            assert!(
                readme.contains(&format!("| `{name}` |")),
                "{name} missing from README"
            );
        }
    }
}
