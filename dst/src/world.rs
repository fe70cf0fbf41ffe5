//! The simulated world: an EC2 account (the simulator), an API server (MemorySink with
//! Cilium's CRD and the Node model), classic agents, and the operator (core + ENI GC) that can
//! crash and restart with empty memory on the same EC2 and API state.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use eni_operator::crd::CiliumNode;
use eni_operator::ec2::{
    AddressRequest, CreateEniRequest, Ec2, InstanceTypeLimits, NetworkInterface, Operation, Tags,
};
use eni_operator::event_loop::core::{CoreConfig, NodeInput};
use eni_operator::ipam::IpamConfig;
use eni_operator::k8s::source::node_inputs;
use k8s_openapi::api::core::v1::Node;
use kube::runtime::watcher::Event;
use rand::Rng;
use rand::rngs::StdRng;
use testkit::sim::{Simulator, default_instance_types};
use testkit::sink::MemorySink;
use tokio::time::Instant;
use tokio_util::task::AbortOnDropHandle;

use crate::QuietCounters;
use crate::account::Account;
use crate::agent::Agent;
use crate::api::ApiServer;
use crate::leadership::{Leadership, Observer, SimCore};
use crate::multipool::{Agents, MultiPool};
use crate::view::{Quiet, View};

pub const CLUSTER: &str = "dst";
/// Karpenter's Node finalizer: a deleted Node stays, draining, until Karpenter is done.
pub const KARPENTER: &str = "karpenter.sh/termination";
/// The ENI GC's interval in the simulation.
pub const GC_INTERVAL: Duration = Duration::from_secs(120);
/// Types whose limits the simulator knows (Nitro, so prefix mode works on all).
pub(crate) const TYPES: [&str; 5] = ["m5.large", "m5.xlarge", "c5.large", "t3.large", "t3.medium"];
pub(crate) const PRE_ALLOCATE: i64 = 2;
const MAX_PODS: usize = 55;

/// `--node-gone-grace-period` of the simulated operator, in seconds.
pub const NODE_GONE_GRACE: u64 = 180;

/// Tags of another tool's ENIs on our instances.
fn other_tool_tags() -> Tags {
    Tags::from([("owner".to_string(), "another-tool".to_string())])
}

/// Where a node is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    Live,
    /// The Node has its `deletionTimestamp`; Karpenter terminates the instance and removes its
    /// finalizer at `until`.
    Draining {
        until: u64,
    },
    /// The instance is terminated but the Node is still there; the cloud controller deletes it
    /// at `node_gone_at`.
    Terminated {
        node_gone_at: u64,
    },
    /// Node and instance are gone; the CiliumNode goes through deletion.
    Gone,
    /// The Node object was deleted (`kubectl delete node`, a remediation tool) while its
    /// instance keeps running; its kubelet re-registers it at `back_at` (if ever).
    Orphaned {
        since: u64,
        back_at: Option<u64>,
    },
    /// The Node is back; the agent writes a new CiliumNode once the old one is gone. `late`:
    /// it came back after the grace period had ended.
    Returning {
        late: bool,
    },
}

#[derive(Debug)]
pub struct SimNode {
    pub instance_id: String,
    /// The instance's availability zone (its Node's providerID names it).
    pub zone: &'static str,
    pub limits: InstanceTypeLimits,
    pub first_interface_index: u32,
    /// Pods the node can hold at most (what the demand is drawn under).
    pub capacity: usize,
    pub phase: Phase,
    /// The classic agent; for a multi-pool node it holds the demand and mirrors the pods.
    pub agent: Agent,
    /// The node runs the multi-pool agent instead of the classic one.
    pub multi_pool: Option<MultiPool>,
    /// A restarting agent writes nothing before this second.
    pub agent_down_until: u64,
    /// What the agent's last step saw when it changed nothing (crate::view::Quiet).
    pub quiet: Option<Quiet>,
}

impl SimNode {
    /// The instance runs and its agent with it.
    pub fn running(&self) -> bool {
        matches!(self.phase, Phase::Live | Phase::Draining { .. })
    }

    /// Its instance keeps our ENIs attached whatever the operator does (crate::guard): the
    /// Node is present, or it is gone while the instance runs and for less than `grace`
    /// (`--node-gone-grace-period`), or it is coming back.
    pub fn keeps_enis(&self, t: u64, grace: u64) -> bool {
        match self.phase {
            Phase::Orphaned { since, .. } => t < since + grace,
            // Back after the grace period: the operator was right to start releasing (rule of
            // issue 24 item 1: kept "up to a grace period, after which they are released"), and
            // a release under way when the Node came back may still finish (a detach already
            // sent, `make dst` seeds 42, 66, 75). Protected again once the node is live (its
            // new CiliumNode is written only after the old one, and so the release, is done).
            Phase::Returning { late } => !late,
            _ => self.running(),
        }
    }
}

/// The operator process: dropped on a crash (its tasks abort), built anew on restart.
struct Operator {
    core: SimCore,
    task: AbortOnDropHandle<()>,
}

pub struct World {
    pub sim: Simulator,
    pub sink: Arc<MemorySink>,
    pub nodes: BTreeMap<String, SimNode>,
    /// ENIs of other owners (another tool, Cilium's operator): id -> how they must stay. When
    /// their instance terminates, as EC2 leaves them (detached, or `None`: deleted with it).
    pub foreign: BTreeMap<String, Option<NetworkInterface>>,
    /// Invariants about present nodes (crate::guard).
    pub guard: crate::guard::Guard,
    pub trace: Vec<String>,
    pub start: Instant,
    pub prefix: bool,
    /// The agents' own draws and observations (dst/src/multipool.rs).
    pub agents: Agents,
    /// What the checks and agents read, cached by generation (crate::view).
    pub view: RefCell<View>,
    seed: u64,
    /// The account's behaviour drawn for this run (lag, tenant, small subnets).
    pub account: Account,
    cfg: CoreConfig,
    pub(crate) subnets: Vec<(String, &'static str)>,
    pub(crate) vpc: String,
    pub(crate) sg: String,
    operator: Option<Operator>,
    next_node: u32,
    restarts: u32,
    /// Watches and write faults of the API server (dst/src/api.rs).
    pub api: ApiServer,
    /// Two replicas electing a leader instead of one operator, in some runs.
    pub leadership: Option<Leadership>,
    /// The CiliumNodes that agents of re-registering Nodes write again (Phase::Returning).
    reregister: BTreeMap<String, CiliumNode>,
    /// The operator's process exited on its own; Kubernetes starts it again at this second.
    exited_restart_at: Option<u64>,
    /// Nodes deleted and registered again under their name (crate::reuse).
    pub reuse: crate::reuse::Reuse,
    /// Crashes right after an unassign (crate::unassign_crash).
    pub unassign_crash: crate::unassign_crash::UnassignCrash,
    /// The nodes present at the start, to be served at once (crate::first_action).
    pub first_action: crate::first_action::FirstAction,
    /// Slow answers to the operator's writes (crate::slow_answer).
    pub slow_answer: crate::slow_answer::SlowAnswer,
    /// CiliumNodes without a Node and instances named twice (crate::identity).
    pub identity: crate::identity::Identity,
    /// Cilium's own operator beside ours, in some runs (crate::cilium).
    pub cilium: Option<crate::cilium::Cilium>,
    /// What agents write that they should not (crate::forgery).
    pub forgery: crate::forgery::Forgery,
    /// What the checks see inside each operator process (crate::probes).
    pub probes: crate::probes::Probes,
    /// Another tenant's spell on the account's buckets (crate::tenant_spell).
    pub tenant_spell: crate::tenant_spell::TenantSpell,
}

impl World {
    /// A world for a check's own test, with the rng of the same seed it was made with.
    #[cfg(test)]
    pub async fn seeded(seed: u64) -> (Self, StdRng) {
        use rand::SeedableRng;
        let mut rng = StdRng::seed_from_u64(seed);
        let w = Self::new(seed, &mut rng).await;
        (w, rng)
    }

    pub async fn new(seed: u64, rng: &mut StdRng) -> Self {
        let sim = Simulator::new();
        sim.set_seed(seed);
        sim.record_calls();
        for op in Operation::ALL {
            let ms = if op.is_mutating() {
                rng.random_range(50..400)
            } else {
                rng.random_range(20..200)
            };
            sim.set_latency(op, Duration::from_millis(ms));
        }
        let vpc = sim.add_vpc("10.0.0.0/16".parse().expect("cidr"), &[]);
        let subnets = vec![
            (
                sim.add_subnet(
                    &vpc,
                    "zone-a",
                    "10.0.0.0/18".parse().expect("cidr"),
                    Tags::new(),
                ),
                "zone-a",
            ),
            (
                sim.add_subnet(
                    &vpc,
                    "zone-b",
                    "10.0.64.0/18".parse().expect("cidr"),
                    Tags::new(),
                ),
                "zone-b",
            ),
        ];
        let sg = sim.add_security_group(&vpc, Tags::new());
        sim.add_route_table(&vpc, true, &[]);
        crate::statics::seed(&sim);
        let mut account = Account::draw(seed);
        account.apply(&sim, &vpc, seed);
        let prefix = rng.random_bool(0.3);
        let cfg = CoreConfig {
            workers: 4,
            ipam: IpamConfig {
                cluster_name: CLUSTER.into(),
                prefix_delegation: prefix,
                release_excess_ips: true,
                release_delay: Duration::from_secs(rng.random_range(5..60)),
                ..IpamConfig::default()
            },
            // Shorter than the default 10 minutes, so that grace periods end (and Nodes come
            // back after them) within the run.
            node_gone_grace: Duration::from_secs(NODE_GONE_GRACE),
            // As production: a CiliumNode is served only beside its Node, whose providerID
            // names the same instance (docs/rules.md §15; crate::identity plays the rest).
            require_node: true,
            ..CoreConfig::default()
        };
        let (agents, pruned) = Agents::new(seed);
        let sink = if pruned {
            MemorySink::with_ciliums_crd()
        } else {
            MemorySink::new()
        };
        let mut w = Self {
            sim,
            sink: Arc::new(sink),
            nodes: BTreeMap::new(),
            foreign: BTreeMap::new(),
            guard: Default::default(),
            trace: Vec::new(),
            start: Instant::now(),
            prefix,
            agents,
            view: RefCell::default(),
            seed,
            account,
            cfg,
            subnets,
            vpc,
            sg,
            operator: None,
            next_node: 0,
            restarts: 0,
            api: ApiServer::new(seed),
            leadership: Leadership::draw(seed),
            reregister: BTreeMap::new(),
            exited_restart_at: None,
            reuse: crate::reuse::Reuse::new(seed),
            unassign_crash: crate::unassign_crash::UnassignCrash::new(seed),
            first_action: Default::default(),
            slow_answer: crate::slow_answer::SlowAnswer::new(seed),
            identity: crate::identity::Identity::new(seed),
            cilium: crate::cilium::Cilium::draw(seed),
            forgery: crate::forgery::Forgery::new(seed),
            probes: crate::probes::Probes::default(),
            tenant_spell: crate::tenant_spell::TenantSpell::new(seed),
        };
        // One wall clock for the run: the API server's managedFields times and every core's.
        w.cfg.wall_epoch = Some((crate::cilium::epoch(), w.start.into_std()));
        w.sink.stamp_times(crate::cilium::epoch(), w.start);
        if w.cilium.is_some() {
            w.cfg.annotate_cilium_ignore = true;
            w.log(0, "Cilium's operator runs beside ours".into());
        }
        w.log(
            0,
            format!(
                "world: prefix={prefix} release-delay={:?}",
                w.cfg.ipam.release_delay
            ),
        );
        let line = format!(
            "world: cilium-crd-pruning={pruned} multi-pool-share={} pending-pods={}",
            w.agents.multi_pool_share, w.agents.pending_pods
        );
        w.log(0, line);
        w.log(0, w.account.describe());
        // Cilium's operator's leftover ENIs in our subnets: never ours to collect.
        for i in 0..rng.random_range(0..=2) {
            let subnet = w.subnets[i % 2].0.clone();
            let tags = Tags::from([
                ("io.cilium/cilium-managed".to_string(), "true".to_string()),
                ("io.cilium/cluster-name".to_string(), CLUSTER.to_string()),
            ]);
            let eni = w.foreign_eni(&subnet, tags, &format!("cilium-{i}")).await;
            w.log(0, format!("foreign available ENI {}", eni.id));
            w.foreign.insert(eni.id.clone(), Some(eni));
        }
        // With election the replicas start at the first tick (crate::leadership).
        if w.leadership.is_none() {
            w.start_operator(0);
        } else {
            w.log(0, "two replicas elect a leader".into());
        }
        w
    }

    /// Another tool creates an ENI, through the same account (its calls take tokens from the
    /// shared throttling buckets and meet the injected faults, so it retries like any client).
    pub(crate) async fn foreign_eni(
        &self,
        subnet: &str,
        tags: Tags,
        token: &str,
    ) -> NetworkInterface {
        let req = CreateEniRequest {
            subnet_id: subnet.to_string(),
            security_groups: vec![self.sg.clone()],
            description: "not ours".into(),
            tags,
            addresses: AddressRequest::Ips(1),
            client_token: token.to_string(),
        };
        loop {
            match self.sim.create_network_interface(&req).await {
                Ok(e) => return e,
                Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
            }
        }
    }

    /// The other tool attaches its ENI, retrying until EC2 shows it attached.
    pub(crate) async fn foreign_attach(
        &self,
        eni: &str,
        instance: &str,
        at: u32,
    ) -> NetworkInterface {
        loop {
            let _ = self.sim.attach_network_interface(eni, instance, at).await;
            let now = self.sim.network_interface(eni).expect("exists");
            if now.attachment.is_some() {
                return now;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    pub fn log(&mut self, t: u64, line: String) {
        self.trace.push(format!("t={t}s {line}"));
    }

    /// Start (or restart) the operator with empty memory.
    fn start_operator(&mut self, t: u64) {
        let parts = crate::leadership::build(
            &self.sim,
            &self.sink,
            &self.cfg,
            self.subnet_ids(),
            Observer::alone(),
            eni_operator::k8s::fence::Fence::open(),
            // Retry jitter from the seed (one stream per operator start): a seed replays exactly.
            self.jitter_seed(u64::from(self.restarts)),
            &self.probes,
        );
        let core = Some(parts.core.clone());
        self.operator = Some(Operator {
            core: parts.core,
            task: AbortOnDropHandle::new(tokio::spawn(parts.run)),
        });
        // What the watches list at start: every Node, then every CiliumNode.
        let listing = crate::api::listing(self);
        self.api.connect_core(core, parts.tx, &listing);
        crate::cilium::tell(self);
        self.report_pending(true);
        if t > 0 {
            self.log(t, format!("operator restarted ({})", self.restarts));
        }
    }

    /// A change, as the running operator instances' watches deliver it.
    pub(crate) fn send(&mut self, input: NodeInput) {
        self.api.deliver(input);
    }

    /// A Node watch event, as the runtime's source turns it into inputs (what the Node says
    /// about its instance, then its presence).
    pub(crate) fn node_event(&mut self, ev: Event<Node>) {
        for i in node_inputs(ev) {
            self.send(i);
        }
    }

    /// The kubelet registers the Node of an instance (with Karpenter's finalizer); the AWS
    /// cloud provider sets `spec.providerID` to `aws:///<zone>/<instance-id>`.
    pub(crate) fn put_node(&self, name: &str, zone: &str, instance: &str) -> Node {
        let provider_id = format!("aws:///{zone}/{instance}");
        self.sink
            .put_node_with(name, &[KARPENTER], Some(&provider_id))
    }

    pub fn core(&self) -> &SimCore {
        &self.operator.as_ref().expect("running").core
    }

    /// The cores running now (the operator, or the replicas that lead).
    pub fn cores(&self) -> Vec<SimCore> {
        match &self.leadership {
            Some(l) => l.cores(),
            None => self.operator.iter().map(|o| o.core.clone()).collect(),
        }
    }

    /// A seed for one operator process's retry jitter (queue and gate), from the run's seed and
    /// `salt` (which start this is): every choice comes from the seed, so a seed replays exactly.
    pub(crate) fn jitter_seed(&self, salt: u64) -> u64 {
        self.seed ^ salt.rotate_right(16)
    }

    /// Every subnet the ENI GC watches: the nodes' own and the account's small ones.
    pub(crate) fn subnet_ids(&self) -> Vec<String> {
        self.subnets
            .iter()
            .map(|(s, _)| s.clone())
            .chain(self.account.extra_subnets())
            .collect()
    }

    pub(crate) fn core_config(&self) -> CoreConfig {
        self.cfg.clone()
    }

    /// An operator whose core ended on its own (`Core::run` returns an error when its first
    /// EC2 listing fails after the gate's retries; src/main.rs then exits non-zero) is
    /// restarted by Kubernetes, as a crashed one: after the kubelet's first crash-loop backoff
    /// of 10 s. (`make dst` seed 53: the simulation left it stopped, and no node was served
    /// again.) With election, crate::leadership restarts exited replicas.
    fn restart_exited(&mut self, t: u64) {
        if self.operator.as_ref().is_some_and(|o| o.task.is_finished()) {
            self.operator = None;
            let at = t + 10;
            self.exited_restart_at = Some(at);
            self.log(t, format!("operator exited; restart at t={at}s"));
        }
        if self.exited_restart_at.is_some_and(|at| at <= t) {
            self.exited_restart_at = None;
            self.restarts += 1;
            self.start_operator(t);
        }
    }

    /// The operator crashes (every task stops wherever it awaits) and restarts with empty
    /// memory on the same EC2 and API state.
    pub fn crash_and_restart(&mut self, t: u64) {
        if self.leadership.is_some() {
            crate::leadership::crash(self, t);
            return;
        }
        self.operator = None;
        self.exited_restart_at = None;
        self.restarts += 1;
        self.log(t, "operator crashed".into());
        self.start_operator(t);
    }

    pub fn live_nodes(&self) -> usize {
        self.nodes
            .values()
            .filter(|n| n.phase == Phase::Live)
            .count()
    }

    /// A node joins: an instance of a random type in a random zone, maybe another tool's ENI
    /// attached at device index 1, the Node (with Karpenter's finalizer) and the agent's
    /// CiliumNode.
    pub async fn join(&mut self, rng: &mut StdRng) {
        let name = format!("node-{}", self.next_node);
        self.next_node += 1;
        let ty = TYPES[rng.random_range(0..TYPES.len())];
        let limits = default_instance_types()
            .into_iter()
            .find(|l| l.instance_type == ty)
            .expect("known type");
        let (subnet, zone) = self.subnets[rng.random_range(0..self.subnets.len())].clone();
        let inst = self
            .sim
            .run_instance(ty, &subnet, std::slice::from_ref(&self.sg));
        let fii: u32 = rng.random_range(0..=1);
        let t = self.now();
        let mut foreign = 0;
        if limits.max_enis > 2 && rng.random_bool(0.3) {
            let eni = self
                .foreign_eni(&subnet, other_tool_tags(), &format!("tool-{name}"))
                .await;
            let at = 1;
            let eni = self.foreign_attach(&eni.id, &inst.id, at).await;
            self.log(t, format!("foreign ENI {} on {name} at {at}", eni.id));
            self.foreign.insert(eni.id.clone(), Some(eni));
            foreign = 1;
        }
        let per_eni = (limits.ipv4_per_eni - 1) as usize * if self.prefix { 16 } else { 1 };
        let enis = (limits.max_enis - fii - foreign) as usize;
        // Half of what the instance holds, and at most Kubernetes' default 110 pods per node
        // halved (prefix mode would allow hundreds; they cost run time and find nothing more).
        let capacity = ((enis * per_eni).saturating_sub(PRE_ALLOCATE as usize) / 2).min(MAX_PODS);
        let mut n = CiliumNode::new(&name, Default::default());
        n.spec.instance_id = inst.id.clone();
        n.spec.eni.instance_type = ty.into();
        n.spec.eni.vpc_id = self.vpc.clone();
        n.spec.eni.availability_zone = zone.into();
        n.spec.eni.node_subnet_id = subnet.clone();
        n.spec.eni.first_interface_index = Some(i64::from(fii));
        n.spec.ipam.pre_allocate = PRE_ALLOCATE;
        // The user excludes the other tool's ENIs (a Multus interface, say): never used, counted
        // or modified. Without the exclusion the operator allocates on any attached ENI the
        // spec allows, as Cilium does (docs/migrating-from-cilium.md).
        n.spec.eni.exclude_interface_tags = other_tool_tags();
        n.spec.eni.subnet_tags = self.account.subnet_tags();
        if crate::statics::wants(self.next_node - 1) {
            n.spec.ipam.static_ip_tags = crate::statics::tags();
        }
        let node = self.put_node(&name, zone, &inst.id);
        self.node_event(Event::Apply(node));
        self.agent_creates(n, t);
        let target = rng.random_range(0..=capacity);
        let multi_pool = self.agents.draw_multi_pool();
        self.log(
            t,
            format!(
                "join {name} {ty} {zone} {} fii={fii} capacity={capacity} target={target}{}",
                inst.id,
                if multi_pool.is_some() {
                    " multi-pool"
                } else {
                    ""
                }
            ),
        );
        self.nodes.insert(
            name,
            SimNode {
                instance_id: inst.id,
                zone,
                limits,
                first_interface_index: fii,
                capacity,
                phase: Phase::Live,
                agent: Agent {
                    target,
                    ..Agent::default()
                },
                multi_pool,
                agent_down_until: 0,
                quiet: None,
            },
        );
    }

    pub(crate) fn seconds(&self) -> u64 {
        self.now()
    }

    fn now(&self) -> u64 {
        Instant::now().duration_since(self.start).as_secs()
    }

    fn pick(&self, rng: &mut StdRng, phase: Phase) -> Option<String> {
        let names: Vec<&String> = self
            .nodes
            .iter()
            .filter(|(_, n)| n.phase == phase)
            .map(|(k, _)| k)
            .collect();
        (!names.is_empty()).then(|| names[rng.random_range(0..names.len())].clone())
    }

    /// Pods come or go on one live node.
    pub fn change_demand(&mut self, rng: &mut StdRng, t: u64) {
        let Some(name) = self.pick(rng, Phase::Live) else {
            return;
        };
        let n = self.nodes.get_mut(&name).expect("picked");
        let target = rng.random_range(0..=n.capacity);
        n.agent.target = target;
        self.log(t, format!("demand {name} -> {target}"));
    }

    /// Karpenter deletes a Node: it drains (deletionTimestamp, still present, pods still
    /// running), then terminates the instance and removes its finalizer.
    pub fn drain(&mut self, rng: &mut StdRng, t: u64) {
        let Some(name) = self.pick(rng, Phase::Live) else {
            return;
        };
        let until = t + rng.random_range(30..300);
        if let Some(ev) = self.sink.delete_node(&name) {
            self.node_event(ev);
        }
        self.nodes.get_mut(&name).expect("picked").phase = Phase::Draining { until };
        self.log(t, format!("drain {name} until t={until}s"));
    }

    /// The instance terminates without a Node delete (spot reclaim, a human in the console).
    pub fn terminate(&mut self, rng: &mut StdRng, t: u64) {
        let Some(name) = self.pick(rng, Phase::Live) else {
            return;
        };
        let node_gone_at = t + rng.random_range(20..180);
        self.terminate_instance(&name, t);
        self.nodes.get_mut(&name).expect("picked").phase = Phase::Terminated { node_gone_at };
        self.log(
            t,
            format!("terminate {name}'s instance; Node goes at t={node_gone_at}s"),
        );
    }

    fn terminate_instance(&mut self, name: &str, t: u64) {
        let id = self.nodes[name].instance_id.clone();
        self.sim.terminate_instance(&id);
        // EC2 detaches (or deletes) what was attached: other owners' ENIs change legitimately,
        // and then stay as EC2 left them (the other tool cleans up its own).
        for (eni, snap) in self.foreign.iter_mut() {
            if snap
                .as_ref()
                .and_then(|s| s.attachment.as_ref())
                .is_some_and(|a| a.instance_id == id)
            {
                *snap = self.sim.network_interface(eni);
                self.trace
                    .push(format!("t={t}s foreign ENI {eni} released by termination"));
            }
        }
        let n = self.nodes.get_mut(name).expect("known");
        n.agent.pods.clear();
        n.agent.target = 0;
    }

    /// The Node object of a running instance is deleted (`kubectl delete node`, a remediation
    /// tool; Karpenter's finalizer is not on it or was removed by hand): Kubernetes' garbage
    /// collector deletes the CiliumNode it owns and the pod GC the Node's pods; the instance
    /// keeps running and its kubelet re-registers the Node, before or after the operator's
    /// grace period, or never. Classic nodes only (a multi-pool agent's state is not redrawn).
    pub fn orphan(&mut self, rng: &mut StdRng, t: u64) {
        let names: Vec<String> = self
            .nodes
            .iter()
            .filter(|(_, n)| n.phase == Phase::Live && n.multi_pool.is_none())
            .map(|(k, _)| k.clone())
            .collect();
        if names.is_empty() {
            return;
        }
        let name = names[rng.random_range(0..names.len())].clone();
        let back_at = rng
            .random_bool(0.7)
            .then(|| t + rng.random_range(20..2 * NODE_GONE_GRACE));
        let Some(stored) = self.sink.get(&name) else {
            return;
        };
        let mut again = CiliumNode::new(&name, stored.spec.clone());
        again.spec.ipam.pool.clear();
        self.reregister.insert(name.clone(), again);
        self.sink.remove_node_finalizer(&name, KARPENTER);
        if let Some(ev) = self.sink.delete_node(&name) {
            self.node_event(ev);
        }
        match self.sink.begin_delete(&name) {
            Some(marked) => self.send(NodeInput::Upsert(Box::new(marked))),
            None => self.send(NodeInput::Deleted(name.clone())),
        }
        let n = self.nodes.get_mut(&name).expect("picked");
        n.phase = Phase::Orphaned { since: t, back_at };
        n.agent.pods.clear();
        n.quiet = None;
        self.log(
            t,
            format!("{name}: Node object deleted, instance keeps running; back at {back_at:?}"),
        );
    }

    /// Orphaned Nodes whose kubelet re-registers now, and returning ones whose old CiliumNode
    /// is gone (the agent writes a new one).
    fn reregister(&mut self, t: u64) {
        let names: Vec<(String, Phase)> = self
            .nodes
            .iter()
            .filter(|(_, n)| match n.phase {
                Phase::Orphaned { back_at, .. } => back_at.is_some_and(|b| b <= t),
                Phase::Returning { .. } => true,
                _ => false,
            })
            .map(|(k, n)| (k.clone(), n.phase))
            .collect();
        for (name, phase) in names {
            if let Phase::Orphaned { since, .. } = phase {
                let n = &self.nodes[&name];
                let node = self.put_node(&name, n.zone, &n.instance_id.clone());
                self.node_event(Event::Apply(node));
                let late = t >= since + NODE_GONE_GRACE;
                self.nodes.get_mut(&name).expect("known").phase = Phase::Returning { late };
                self.log(t, format!("{name}: Node re-registers"));
                continue;
            }
            if self.sink.raw(&name).is_some() {
                continue;
            }
            let mut again = self.reregister.remove(&name).expect("kept at orphan");
            // A starting agent names its own instance (from the instance metadata), whatever
            // the object it wrote before said.
            again
                .spec
                .instance_id
                .clone_from(&self.nodes[&name].instance_id);
            self.agent_creates(again, t);
            self.nodes.get_mut(&name).expect("known").phase = Phase::Live;
            self.log(t, format!("{name}: agent writes its CiliumNode again"));
        }
    }

    /// An agent creates its node's CiliumNode: the API server's admission (the chart's
    /// policy may annotate it), then Cilium's running leader sees the creation before we do.
    /// Every agent creation goes through here, a node's first and a re-created one alike.
    pub(crate) fn agent_creates(&mut self, mut n: CiliumNode, t: u64) {
        crate::cilium::admit(self, &mut n);
        let stored = self.sink.put(&n);
        crate::cilium::created(self, &stored, t);
        self.send(NodeInput::Upsert(Box::new(stored)));
    }

    /// The Node is gone: Kubernetes' garbage collector deletes the CiliumNode it owns.
    fn node_gone(&mut self, name: &str, t: u64) {
        let ev = match self.sink.remove_node_finalizer(name, KARPENTER) {
            Some(Event::Delete(n)) => Some(Event::Delete(n)),
            _ => self.sink.delete_node(name),
        };
        if let Some(ev) = ev {
            self.node_event(ev);
        }
        match self.sink.begin_delete(name) {
            Some(marked) => self.send(NodeInput::Upsert(Box::new(marked))),
            None => self.send(NodeInput::Deleted(name.to_string())),
        }
        self.nodes.get_mut(name).expect("known").phase = Phase::Gone;
        self.log(t, format!("{name}: Node gone, CiliumNode deleted"));
    }

    /// One simulated second of the world: scheduled transitions, then every running agent.
    pub async fn tick(&mut self, rng: &mut StdRng, t: u64) {
        self.restart_exited(t);
        crate::api::tick(self, t);
        crate::leadership::tick(self, t);
        crate::cilium::tick(self, t);
        crate::reuse::tick(self, t);
        crate::identity::tick(self, t);
        crate::forgery::tick(self, t);
        let due: Vec<(String, Phase)> = self
            .nodes
            .iter()
            .filter(|(_, n)| match n.phase {
                Phase::Draining { until } => until <= t,
                Phase::Terminated { node_gone_at } => node_gone_at <= t,
                _ => false,
            })
            .map(|(k, n)| (k.clone(), n.phase))
            .collect();
        for (name, phase) in due {
            if matches!(phase, Phase::Draining { .. }) {
                self.terminate_instance(&name, t);
            }
            self.node_gone(&name, t);
        }
        self.reregister(t);
        let names: Vec<String> = self
            .nodes
            .iter()
            .filter(|(_, n)| n.running())
            .map(|(k, _)| k.clone())
            .collect();
        for name in names {
            let Some(obj) = self.view.get_mut().node(&self.sink, &name) else {
                continue;
            };
            let n = self.nodes.get_mut(&name).expect("known");
            if n.agent_down_until > t {
                continue;
            }
            // A classic agent's step is a pure function of what Quiet sums up (crate::view);
            // the multi-pool agent keeps state of its own and steps every second.
            let seen = Quiet::of(&obj, &n.agent);
            if n.multi_pool.is_none() && n.quiet.as_ref() == Some(&seen) {
                continue;
            }
            let edited = match n.multi_pool.as_mut() {
                Some(mp) => mp
                    .step(&obj, &mut n.agent, &mut self.agents.violations)
                    .filter(|_| mp.may_write(t)),
                None => n.agent.step(&obj, rng),
            };
            match edited {
                Some(edited) => {
                    n.quiet = None;
                    let stored = self.sink.put(&edited);
                    self.send(NodeInput::Upsert(Box::new(stored)));
                }
                None => n.quiet = Some(seen),
            }
        }
        self.report_pending(false);
    }

    /// A line per node in the trace (pool, pods): what the run looked like each minute.
    pub fn observe(&mut self, t: u64) {
        let lines: Vec<String> = self
            .nodes
            .iter()
            .filter(|(_, n)| n.running())
            .map(|(name, n)| {
                let pool = self
                    .sink
                    .get(name)
                    .map(|o| o.spec.ipam.pool.len())
                    .unwrap_or(0);
                format!(
                    "observe {name} pool={pool} pods={}/{}",
                    n.agent.pods.len(),
                    n.agent.target
                )
            })
            .collect();
        for l in lines {
            self.log(t, l);
        }
        self.digest(t);
    }

    /// CiliumNode writes, mutating EC2 calls in total and by name.
    pub fn quiet_counters(&self) -> QuietCounters {
        let stats = self.sim.stats();
        let by: BTreeMap<&'static str, u64> = Operation::ALL
            .iter()
            .filter(|op| op.is_mutating())
            .map(|op| (op.name(), stats.get(*op).calls))
            .collect();
        (
            u64::from(self.sink.total_writes().total()),
            by.values().sum(),
            by,
        )
    }
}
