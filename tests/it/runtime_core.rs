//! The allocation core without Kubernetes: the simulator behind the gate, a `MemorySink` as the
//! API server, paused tokio time.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use eni_operator::crd::{
    AllocationIp, CiliumNode, FINALIZER, IpamPoolAllocation, IpamPoolDemand, IpamPoolRequest,
    ReleaseState,
};
use eni_operator::ec2::gate::{Gate, GateConfig};
use eni_operator::ec2::{
    Address, AddressRequest, Assigned, CreateEniRequest, Ec2, EniFilter, EniState, Instance,
    InstanceFilter, InstanceState, InstanceTypeLimits, NetworkInterface, Operation, Page,
    ResourceFilter, Result, RouteTable, SecurityGroup, Subnet, Tags, Vpc, collect_pages,
};
use eni_operator::ipam::ownership::ownership_tags;
use eni_operator::ipam::{Action, IpamConfig, Release};
use eni_operator::runtime::cache::Ec2Cache;
use eni_operator::runtime::core::{Core, CoreConfig, NodeInput};
use eni_operator::runtime::executor::Executor;
use eni_operator::runtime::gc::EniGc;
use eni_operator::runtime::leader::{Elector, LeaderConfig, LeadershipLost};
use eni_operator::runtime::metrics::RuntimeMetrics;
use eni_operator::runtime::source::{node_input, parse_node, to_input};
use ipnet::Ipv4Net;
use kube::api::DynamicObject;
use kube::runtime::watcher::Event;
use testkit::agent::classic_agent_answers;
use testkit::cluster::{Cluster, agent_node};
use testkit::lease::{MemoryLease, MemoryLeaseClient};
use testkit::prune::StructuralSchema;
use testkit::sim::Simulator;
use testkit::sink::{MemorySink, WriteFault};
use testkit::{served, wait_until};
use tokio::sync::mpsc;

const CLUSTER: &str = "test-cluster";

fn config(workers: usize) -> CoreConfig {
    CoreConfig {
        workers,
        ipam: IpamConfig {
            cluster_name: CLUSTER.into(),
            ..IpamConfig::default()
        },
        ..CoreConfig::default()
    }
}

/// A classic node joins: an m5.large starts, its agent writes the CiliumNode, the core hears
/// of it.
async fn join(
    w: &Cluster,
    sink: &MemorySink,
    tx: &mpsc::Sender<NodeInput>,
    name: &str,
    min_allocate: i64,
) -> eni_operator::ec2::Instance {
    let inst = w.instance();
    let n = sink.put(&agent_node(w, name, &inst.id, min_allocate));
    tx.send(NodeInput::Upsert(Box::new(n))).await.unwrap();
    inst
}

/// A running core: the handle, its input and its task.
type Running<E> = (
    Core<E, MemorySink>,
    mpsc::Sender<NodeInput>,
    tokio::task::JoinHandle<Result<()>>,
);

fn start<E: Ec2>(ec2: E, sink: &Arc<MemorySink>, cfg: CoreConfig) -> Running<E> {
    start_with_cache(ec2, sink, cfg).0
}

/// As [`start`], also handing back the core's EC2 view to look into.
fn start_with_cache<E: Ec2>(
    ec2: E,
    sink: &Arc<MemorySink>,
    cfg: CoreConfig,
) -> (Running<E>, Arc<RwLock<Ec2Cache>>) {
    let cache = cfg.ec2_cache();
    let core = Core::new(
        Arc::new(ec2),
        sink.clone(),
        cfg,
        RuntimeMetrics::default(),
        cache.clone(),
    );
    let (tx, rx) = mpsc::channel(4096);
    let task = tokio::spawn(core.clone().run(rx, std::future::pending()));
    ((core, tx, task), cache)
}

fn operator_error(sink: &MemorySink, name: &str) -> Option<String> {
    sink.get(name)?.status?.ipam.operator_status.error
}

#[tokio::test(start_paused = true)]
async fn a_burst_of_nodes_all_reach_their_demand() {
    const NODES: usize = 50;
    const WANT: i64 = 16; // more than one ENI of an m5.large holds: every node gets a new ENI
    let w = Cluster::new();
    // Cilium's CRD, as on real clusters: the steady-state count below is under its pruning.
    let sink = Arc::new(MemorySink::with_ciliums_crd());
    let gate = Gate::new(w.sim.clone(), GateConfig::aws_defaults());
    let (core, tx, _task) = start(gate, &sink, config(50));
    let mut names = Vec::new();
    for i in 0..NODES {
        let inst = w.instance();
        let name = format!("node-{i}");
        let stored = sink.put(&agent_node(&w, &name, &inst.id, WANT));
        tx.send(NodeInput::Upsert(Box::new(stored))).await.unwrap();
        names.push(name);
    }
    let started = tokio::time::Instant::now();
    let all = wait_until(
        || names.iter().all(|n| served(&sink, n, WANT as usize)),
        Duration::from_secs(600),
    )
    .await;
    let took = started.elapsed();
    for n in &names {
        assert!(
            served(&sink, n, WANT as usize),
            "{n} not served: {:?}",
            sink.get(n).map(|c| c.status)
        );
        assert_eq!(operator_error(&sink, n), None, "{n}");
        let fin = sink.get(n).unwrap().metadata.finalizers.unwrap_or_default();
        assert!(
            fin.contains(&FINALIZER.to_string()),
            "{n} has our finalizer"
        );
    }
    assert!(all);
    // Let a resync pass run: a node already served gets no further write.
    let before = sink.total_writes();
    tokio::time::sleep(Duration::from_secs(130)).await;
    let after = sink.total_writes();
    assert_eq!(before, after, "no writes when nothing changed");
    w.sim.check_invariants().unwrap();

    let stats = w.sim.stats();
    let nodes = NODES as f64;
    let mutating: u64 = Operation::ALL
        .iter()
        .filter(|o| o.is_mutating())
        .map(|o| stats.get(*o).calls)
        .sum();
    let describes: u64 = Operation::ALL
        .iter()
        .filter(|o| !o.is_mutating())
        .map(|o| stats.get(*o).calls)
        .sum();
    let writes = sink.total_writes();
    eprintln!("== burst: {NODES} nodes x {WANT} addresses, served in {took:?} (simulated)");
    for op in Operation::ALL {
        let s = stats.get(op);
        if s.calls > 0 {
            eprintln!(
                "   {:<34} calls {:>4} ({:.2}/node) throttled {}",
                op.name(),
                s.calls,
                s.calls as f64 / nodes,
                s.throttled
            );
        }
    }
    eprintln!(
        "   EC2 calls per node: {:.2} ({:.2} mutating, {:.2} describe, incl. 2 min of resyncs)",
        (mutating + describes) as f64 / nodes,
        mutating as f64 / nodes,
        describes as f64 / nodes
    );
    eprintln!(
        "   CiliumNode writes per node: {:.2} (spec {:.2}, status {:.2}, metadata/finalizer {:.2})",
        writes.total() as f64 / nodes,
        writes.spec as f64 / nodes,
        writes.status as f64 / nodes,
        writes.metadata as f64 / nodes
    );
    assert!(
        stats.get(Operation::CreateNetworkInterface).calls <= 2 * NODES as u64,
        "two ENIs per node (9 addresses each on an m5.large, primary ENI excluded)"
    );
    assert!(core.demand("node-0").unwrap().needed <= 0);
}

fn mutating_calls(sim: &Simulator) -> u64 {
    let stats = sim.stats();
    Operation::ALL
        .iter()
        .filter(|o| o.is_mutating())
        .map(|o| stats.get(*o).calls)
        .sum()
}

/// Steady state costs nothing under either CRD: once the nodes are served, three resyncs pass
/// without a CiliumNode write or a mutating EC2 call. Cilium's CRD prunes `status.eni-operator`;
/// a diff that took the pruned summary for a missing one rewrote status on every pass.
#[tokio::test(start_paused = true)]
async fn steady_state_writes_nothing_under_ciliums_crd_or_ours() {
    const NODES: usize = 3;
    const WANT: i64 = 12;
    for (crd, schema) in [
        ("Cilium's", StructuralSchema::cilium()),
        ("ours", StructuralSchema::ours()),
    ] {
        let w = Cluster::new();
        let sink = Arc::new(MemorySink::pruning(schema));
        let gate = Gate::new(w.sim.clone(), GateConfig::aws_defaults());
        let cfg = config(4);
        let resync = cfg.resync_interval;
        let (_core, tx, task) = start(gate, &sink, cfg);
        let mut names = Vec::new();
        for i in 0..NODES {
            let inst = w.instance();
            let name = format!("node-{i}");
            let stored = sink.put(&agent_node(&w, &name, &inst.id, WANT));
            tx.send(NodeInput::Upsert(Box::new(stored))).await.unwrap();
            names.push(name);
        }
        let all = wait_until(
            || names.iter().all(|n| served(&sink, n, WANT as usize)),
            Duration::from_secs(600),
        )
        .await;
        assert!(all, "{crd} CRD: nodes not served");
        // In-flight passes (confirmations of the new ENIs) finish first.
        tokio::time::sleep(Duration::from_secs(30)).await;
        let writes = sink.total_writes();
        let mutating = mutating_calls(&w.sim);
        tokio::time::sleep(resync * 3 + Duration::from_secs(5)).await;
        assert_eq!(
            sink.total_writes(),
            writes,
            "{crd} CRD: CiliumNode writes in steady state"
        );
        assert_eq!(
            mutating_calls(&w.sim),
            mutating,
            "{crd} CRD: mutating EC2 calls in steady state"
        );
        // The summary is there exactly where the CRD keeps it.
        for n in &names {
            let summary = sink.get(n).unwrap().status.unwrap().eni_operator;
            assert_eq!(
                summary.is_some(),
                crd == "ours",
                "{crd} CRD, {n}: {summary:?}"
            );
        }
        task.abort();
    }
}

#[tokio::test(start_paused = true)]
async fn a_node_with_a_bad_spec_gets_an_error_and_the_rest_proceed() {
    let w = Cluster::new();
    let sink = Arc::new(MemorySink::new());
    let (_core, tx, _task) = start(w.sim.clone(), &sink, config(4));
    // Malformed: a string where a number belongs. The source reports it per object.
    let inst = w.instance();
    let bad = sink.put(&agent_node(&w, "bad", &inst.id, 4));
    let mut raw = serde_json::to_value(&bad).unwrap();
    raw["spec"]["ipam"]["pre-allocate"] = serde_json::json!("lots");
    parse_node(raw.clone()).expect_err("does not parse");
    tx.send(to_input(&serde_json::from_value(raw).unwrap()))
        .await
        .unwrap();
    // Parses, but no instance ID: the engine refuses it.
    let noid = sink.put(&agent_node(&w, "noid", "", 4));
    tx.send(NodeInput::Upsert(Box::new(noid))).await.unwrap();
    let mut good = Vec::new();
    for i in 0..5 {
        let inst = w.instance();
        let name = format!("good-{i}");
        let n = sink.put(&agent_node(&w, &name, &inst.id, 12));
        tx.send(NodeInput::Upsert(Box::new(n))).await.unwrap();
        good.push(name);
    }
    assert!(
        wait_until(
            || good.iter().all(|n| served(&sink, n, 12)),
            Duration::from_secs(120)
        )
        .await
    );
    let bad_error = operator_error(&sink, "bad").expect("bad node has an error");
    assert!(bad_error.contains("InvalidSpec"), "{bad_error}");
    assert!(
        sink.events("bad")
            .iter()
            .any(|e| e.warning && e.reason == "InvalidSpec")
    );
    assert!(operator_error(&sink, "noid").is_some());
    assert!(sink.events("noid").iter().any(|e| e.warning));
    assert!(sink.get("bad").unwrap().spec.ipam.pool.is_empty());
    for n in &good {
        assert_eq!(operator_error(&sink, n), None);
        assert!(sink.events(n).iter().any(|e| !e.warning));
    }
}

async fn our_available_enis(sim: &Simulator) -> Vec<NetworkInterface> {
    let filter = EniFilter {
        state: Some(EniState::Available),
        ..Default::default()
    };
    collect_pages(|t| sim.describe_network_interfaces(&filter, t))
        .await
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_crash_between_create_and_attach_leaves_an_eni_that_gc_removes() {
    let w = Cluster::new();
    w.sim
        .set_latency(Operation::AttachNetworkInterface, Duration::from_secs(30));
    let sink = Arc::new(MemorySink::new());
    let (_core, tx, task) = start(w.sim.clone(), &sink, config(4));
    join(&w, &sink, &tx, "n", 16).await;
    let sim = w.sim.clone();
    assert!(
        wait_until(
            || sim.stats().get(Operation::CreateNetworkInterface).ok >= 1,
            Duration::from_secs(60)
        )
        .await
    );
    // The operator dies while the attach is in flight.
    task.abort();
    let _ = task.await;
    w.sim
        .set_latency(Operation::AttachNetworkInterface, Duration::ZERO);
    let leaked = our_available_enis(&w.sim).await;
    assert_eq!(leaked.len(), 1, "the created ENI was never attached");
    let leaked = leaked[0].id.clone();
    // An untagged ENI in the same state must survive.
    let foreign = w
        .sim
        .create_network_interface(&CreateEniRequest {
            subnet_id: w.subnet.clone(),
            security_groups: vec![w.sg.clone()],
            description: "someone else's".into(),
            tags: Tags::new(),
            addresses: AddressRequest::Ips(0),
            client_token: String::new(),
        })
        .await
        .unwrap();

    let mut gc = EniGc::new(CLUSTER, 25).with_vpcs([w.vpc.clone()]);
    let first = gc.run_once(&w.sim, &[]).await.unwrap();
    assert!(first.deleted.is_empty(), "one sighting is not enough");
    assert!(w.sim.network_interface(&leaked).is_some());
    let second = gc.run_once(&w.sim, &[]).await.unwrap();
    assert_eq!(second.deleted, vec![leaked.clone()]);
    assert!(w.sim.network_interface(&leaked).is_none());
    assert!(
        w.sim.network_interface(&foreign.id).is_some(),
        "untagged ENI untouched"
    );
}

/// Records every mutating call with whether its caller held the lease at that moment.
struct Guarded<E> {
    inner: E,
    lease: Arc<MemoryLease>,
    identity: String,
    log: Arc<Mutex<Vec<(String, bool)>>>,
}

impl<E> Guarded<E> {
    fn record(&self) {
        let holds = self.lease.holder().as_deref() == Some(self.identity.as_str());
        self.log
            .lock()
            .unwrap()
            .push((self.identity.clone(), holds));
    }
}

impl<E: Ec2> Ec2 for Guarded<E> {
    async fn describe_instance_types(
        &self,
        t: &[String],
        n: Option<String>,
    ) -> Result<Page<InstanceTypeLimits>> {
        self.inner.describe_instance_types(t, n).await
    }
    async fn describe_instances(
        &self,
        f: &InstanceFilter,
        n: Option<String>,
    ) -> Result<Page<eni_operator::ec2::Instance>> {
        self.inner.describe_instances(f, n).await
    }
    async fn describe_network_interfaces(
        &self,
        f: &EniFilter,
        n: Option<String>,
    ) -> Result<Page<NetworkInterface>> {
        self.inner.describe_network_interfaces(f, n).await
    }
    async fn describe_subnets(
        &self,
        f: &ResourceFilter,
        n: Option<String>,
    ) -> Result<Page<Subnet>> {
        self.inner.describe_subnets(f, n).await
    }
    async fn describe_vpcs(&self, f: &ResourceFilter, n: Option<String>) -> Result<Page<Vpc>> {
        self.inner.describe_vpcs(f, n).await
    }
    async fn describe_security_groups(
        &self,
        f: &ResourceFilter,
        n: Option<String>,
    ) -> Result<Page<SecurityGroup>> {
        self.inner.describe_security_groups(f, n).await
    }
    async fn describe_route_tables(
        &self,
        f: &ResourceFilter,
        n: Option<String>,
    ) -> Result<Page<RouteTable>> {
        self.inner.describe_route_tables(f, n).await
    }
    async fn create_network_interface(&self, r: &CreateEniRequest) -> Result<NetworkInterface> {
        self.record();
        self.inner.create_network_interface(r).await
    }
    async fn attach_network_interface(&self, e: &str, i: &str, d: u32) -> Result<String> {
        self.record();
        self.inner.attach_network_interface(e, i, d).await
    }
    async fn set_delete_on_termination(&self, e: &str, a: &str, d: bool) -> Result<()> {
        self.record();
        self.inner.set_delete_on_termination(e, a, d).await
    }
    async fn assign_private_ip_addresses(&self, e: &str, r: AddressRequest) -> Result<Assigned> {
        self.record();
        self.inner.assign_private_ip_addresses(e, r).await
    }
    async fn unassign_private_ip_addresses(
        &self,
        e: &str,
        i: &[Ipv4Addr],
        p: &[Ipv4Net],
    ) -> Result<()> {
        self.record();
        self.inner.unassign_private_ip_addresses(e, i, p).await
    }
    async fn detach_network_interface(&self, a: &str, f: bool) -> Result<()> {
        self.record();
        self.inner.detach_network_interface(a, f).await
    }
    async fn delete_network_interface(&self, e: &str) -> Result<()> {
        self.record();
        self.inner.delete_network_interface(e).await
    }

    async fn describe_addresses(&self, tags: &Tags) -> Result<Vec<Address>> {
        self.inner.describe_addresses(tags).await
    }

    async fn associate_address(&self, a: &str, e: &str, ip: Ipv4Addr) -> Result<String> {
        self.record();
        self.inner.associate_address(a, e, ip).await
    }

    async fn disassociate_address(&self, a: &str) -> Result<()> {
        self.record();
        self.inner.disassociate_address(a).await
    }
}

#[tokio::test(start_paused = true)]
async fn two_cores_racing_for_one_lease_never_both_mutate() {
    let w = Cluster::new();
    let sink = Arc::new(MemorySink::new());
    let lease = Arc::new(MemoryLease::new());
    let log = Arc::new(Mutex::new(Vec::new()));
    let mut senders = Vec::new();
    let mut tasks = Vec::new();
    for id in ["a", "b"] {
        let ec2 = Guarded {
            inner: w.sim.clone(),
            lease: lease.clone(),
            identity: id.into(),
            log: log.clone(),
        };
        let cfg = config(8);
        let cache = cfg.ec2_cache();
        let core = Core::new(
            Arc::new(ec2),
            sink.clone(),
            cfg,
            RuntimeMetrics::default(),
            cache,
        );
        let (tx, rx) = mpsc::channel(4096);
        senders.push(tx);
        let mut elector = Elector::new(
            MemoryLeaseClient {
                lease: lease.clone(),
                identity: id.into(),
            },
            LeaderConfig::new(id),
        );
        tasks.push(tokio::spawn(async move {
            elector.run(core.run(rx, std::future::pending())).await
        }));
        // "a" starts first and wins.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut names = Vec::new();
    for i in 0..10 {
        let inst = w.instance();
        let name = format!("n{i}");
        let n = sink.put(&agent_node(&w, &name, &inst.id, 8));
        for tx in &senders {
            tx.send(NodeInput::Upsert(Box::new(n.clone())))
                .await
                .unwrap();
        }
        names.push(name);
    }
    assert!(
        wait_until(
            || names.iter().all(|n| served(&sink, n, 8)),
            Duration::from_secs(60)
        )
        .await
    );
    assert_eq!(lease.holder().as_deref(), Some("a"));

    // "a" loses the API server; demand grows meanwhile, watched by both. "a" may still act
    // until its renew deadline; "b" only after the lease expired.
    let grow = |want: i64| {
        let senders = senders.clone();
        let sink = sink.clone();
        let names = names.clone();
        async move {
            for name in &names {
                let n = sink
                    .update(name, |n| n.spec.ipam.min_allocate = want)
                    .unwrap();
                for tx in &senders {
                    // The old leader's core is gone once it stepped down.
                    let _ = tx.send(NodeInput::Upsert(Box::new(n.clone()))).await;
                }
            }
        }
    };
    lease.partition("a", true);
    grow(12).await;
    let l = lease.clone();
    assert!(
        wait_until(
            || l.holder().as_deref() == Some("b"),
            Duration::from_secs(30)
        )
        .await
    );
    grow(16).await;
    assert!(
        wait_until(
            || names.iter().all(|n| served(&sink, n, 16)),
            Duration::from_secs(180)
        )
        .await
    );
    let a_result = tokio::time::timeout(Duration::from_secs(1), &mut tasks[0]).await;
    assert!(
        matches!(a_result, Ok(Ok(Err(LeadershipLost)))),
        "the old leader stepped down"
    );
    let log = log.lock().unwrap();
    let violations: Vec<_> = log.iter().filter(|(_, held)| !held).collect();
    assert!(
        violations.is_empty(),
        "mutations without the lease: {violations:?}"
    );
    assert!(log.iter().any(|(id, _)| id == "a"));
    assert!(
        log.iter().any(|(id, _)| id == "b"),
        "the new leader took over the work"
    );
}

async fn attached_enis(sim: &Simulator, instance: &str) -> Vec<NetworkInterface> {
    let filter = EniFilter {
        instance_ids: vec![instance.to_string()],
        ..Default::default()
    };
    collect_pages(|t| sim.describe_network_interfaces(&filter, t))
        .await
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn the_finalizer_deletes_only_our_enis_and_only_when_the_node_is_gone() {
    let w = Cluster::new();
    w.sim.set_detach_delay(Duration::from_secs(3));
    let sink = Arc::new(MemorySink::new());
    let (_core, tx, _task) = start(w.sim.clone(), &sink, config(4));
    let gone = w.instance();
    let kept = w.instance();
    // Someone else's ENI on the instance whose node goes away: never ours to delete.
    let foreign = w
        .sim
        .create_network_interface(&CreateEniRequest {
            subnet_id: w.subnet.clone(),
            security_groups: vec![w.sg.clone()],
            description: "vendor".into(),
            tags: Tags::new(),
            addresses: AddressRequest::Ips(0),
            client_token: String::new(),
        })
        .await
        .unwrap();
    for (name, inst) in [("gone", &gone), ("kept", &kept)] {
        let n = sink.put(&agent_node(&w, name, &inst.id, 8));
        tx.send(NodeInput::Upsert(Box::new(n))).await.unwrap();
        tx.send(NodeInput::NodePresent {
            name: name.into(),
            present: true,
        })
        .await
        .unwrap();
    }
    assert!(
        wait_until(
            || served(&sink, "gone", 8) && served(&sink, "kept", 8),
            Duration::from_secs(60)
        )
        .await
    );
    // Attached after allocation, so the engine has not used it (it would: any ENI counts).
    w.sim
        .attach_network_interface(&foreign.id, &gone.id, 2)
        .await
        .unwrap();
    let ours = |enis: &[NetworkInterface], inst: &str| {
        enis.iter()
            .filter(|e| {
                ownership_tags(CLUSTER, inst)
                    .iter()
                    .all(|(k, v)| e.tags.get(k) == Some(v))
            })
            .count()
    };
    assert_eq!(ours(&attached_enis(&w.sim, &gone.id).await, &gone.id), 1);

    // The instance stops and the Node "gone" is deleted: the operator deletes the CiliumNode
    // and releases our ENI (a running instance keeps them: the next test).
    w.sim.set_instance_state(&gone.id, InstanceState::Stopped);
    sink.set_node_exists("gone", false);
    tx.send(NodeInput::NodePresent {
        name: "gone".into(),
        present: false,
    })
    .await
    .unwrap();
    assert!(wait_until(|| sink.get("gone").is_none(), Duration::from_secs(120)).await);
    let left = attached_enis(&w.sim, &gone.id).await;
    assert_eq!(ours(&left, &gone.id), 0, "our ENI detached and deleted");
    assert!(
        left.iter().any(|e| e.id == foreign.id),
        "foreign ENI untouched"
    );
    assert!(
        left.iter().any(|e| e.device_index() == Some(0)),
        "primary untouched"
    );
    assert!(
        our_available_enis(&w.sim).await.is_empty(),
        "nothing left behind"
    );

    // "kept" is deleted by hand while its Node exists: nothing is released.
    let marked = sink.begin_delete("kept").expect("held by our finalizer");
    tx.send(NodeInput::Upsert(Box::new(marked))).await.unwrap();
    assert!(wait_until(|| sink.get("kept").is_none(), Duration::from_secs(60)).await);
    assert_eq!(ours(&attached_enis(&w.sim, &kept.id).await, &kept.id), 1);
}

#[tokio::test(start_paused = true)]
async fn release_handshake_with_a_classic_agent() {
    let w = Cluster::new();
    let sink = Arc::new(MemorySink::new());
    let mut cfg = config(4);
    cfg.ipam.release_excess_ips = true;
    cfg.ipam.release_delay = Duration::from_secs(10);
    cfg.resync_interval = Duration::from_secs(5);
    let (_core, tx, _task) = start(w.sim.clone(), &sink, cfg);
    let inst = join(&w, &sink, &tx, "n", 16).await;
    assert!(wait_until(|| served(&sink, "n", 16), Duration::from_secs(60)).await);

    // Three addresses in use; demand drops back to the default pre-allocation.
    let in_use: Vec<String> = sink
        .get("n")
        .unwrap()
        .spec
        .ipam
        .pool
        .keys()
        .take(3)
        .cloned()
        .collect();
    let n = sink
        .update("n", |n| {
            n.spec.ipam.min_allocate = 0;
            let status = n.status.get_or_insert_with(Default::default);
            for ip in &in_use {
                let eni = n.spec.ipam.pool[ip].resource.clone();
                status.ipam.used.insert(
                    ip.clone(),
                    AllocationIp {
                        owner: "default/pod".into(),
                        resource: eni,
                        ..Default::default()
                    },
                );
            }
        })
        .unwrap();
    tx.send(NodeInput::Upsert(Box::new(n))).await.unwrap();
    let before = sink.get("n").unwrap().spec.ipam.pool.len();

    // The agent answers on every change it sees, every simulated second.
    let mut saw_marked = false;
    for _ in 0..120 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let cur = sink.get("n").unwrap();
        let st = cur.status.clone().unwrap_or_default();
        saw_marked |= st
            .ipam
            .release_ips
            .values()
            .any(|s| s == ReleaseState::MarkedForRelease.as_str());
        let n = sink.update("n", classic_agent_answers).unwrap();
        tx.send(NodeInput::Upsert(Box::new(n))).await.unwrap();
        if cur.spec.ipam.pool.len() < before && st.ipam.release_ips.is_empty() {
            break;
        }
    }
    let end = sink.get("n").unwrap();
    let status = end.status.clone().unwrap();
    assert!(saw_marked, "the operator proposed before releasing");
    assert!(end.spec.ipam.pool.len() < before, "excess released");
    assert!(
        status.ipam.release_ips.is_empty(),
        "handshake completed: {:?}",
        status.ipam.release_ips
    );
    for ip in &in_use {
        assert!(end.spec.ipam.pool.contains_key(ip), "in-use {ip} kept");
    }
    // EC2 agrees with the pool.
    let enis = attached_enis(&w.sim, &inst.id).await;
    let ec2_ips: usize = enis
        .iter()
        .filter(|e| e.device_index() != Some(0))
        .map(|e| e.secondary_ips.len())
        .sum();
    assert_eq!(ec2_ips, end.spec.ipam.pool.len());
    assert!(sink.events("n").iter().any(|e| e.reason == "IpsReleased"));
}

#[tokio::test(start_paused = true)]
async fn an_unhealthy_ec2_view_blocks_mutations_until_a_full_refresh_succeeds() {
    let w = Cluster::new();
    let sink = Arc::new(MemorySink::new());
    let (_core, tx, _task) = start(w.sim.clone(), &sink, config(4));
    join(&w, &sink, &tx, "n", 4).await;
    assert!(wait_until(|| served(&sink, "n", 4), Duration::from_secs(30)).await);

    // The next full refresh fails: the view is unhealthy.
    w.sim
        .inject_error(Operation::DescribeVpcs, "InternalError", 1);
    tokio::time::sleep(Duration::from_secs(61)).await;
    let mutating = |sim: &Simulator| -> u64 {
        Operation::ALL
            .iter()
            .filter(|o| o.is_mutating())
            .map(|o| sim.stats().get(*o).calls)
            .sum()
    };
    let before = mutating(&w.sim);
    let n = sink.update("n", |n| n.spec.ipam.min_allocate = 12).unwrap();
    tx.send(NodeInput::Upsert(Box::new(n))).await.unwrap();
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(
        mutating(&w.sim),
        before,
        "no EC2 mutation on an unhealthy view"
    );
    assert!(!served(&sink, "n", 12));
    // The next full refresh succeeds; the node is served.
    assert!(wait_until(|| served(&sink, "n", 12), Duration::from_secs(180)).await);
}

#[tokio::test(start_paused = true)]
async fn an_ignored_node_is_let_go_with_its_finalizer() {
    let w = Cluster::new();
    let sink = Arc::new(MemorySink::new());
    let (_core, tx, _task) = start(w.sim.clone(), &sink, config(4));
    join(&w, &sink, &tx, "n", 4).await;
    assert!(wait_until(|| served(&sink, "n", 4), Duration::from_secs(30)).await);
    let n = sink
        .update("n", |n| {
            n.metadata.annotations = Some(
                [(
                    eni_operator::crd::IGNORE_ANNOTATION.to_string(),
                    "true".to_string(),
                )]
                .into(),
            );
            n.spec.ipam.min_allocate = 12;
        })
        .unwrap();
    tx.send(NodeInput::Upsert(Box::new(n))).await.unwrap();
    let no_finalizer = || {
        sink.get("n")
            .and_then(|n| n.metadata.finalizers)
            .is_none_or(|f| f.is_empty())
    };
    assert!(wait_until(no_finalizer, Duration::from_secs(10)).await);
    let writes = sink.writes("n");
    tokio::time::sleep(Duration::from_secs(130)).await;
    assert_eq!(sink.writes("n"), writes, "an ignored node is never written");
    assert!(!served(&sink, "n", 12));
}

#[tokio::test(start_paused = true)]
async fn a_node_cilium_is_told_to_ignore_is_served_by_us() {
    // `ipam.cilium.io/ignore` hands the node over from Cilium's operator (C10): we serve it.
    let w = Cluster::new();
    let sink = Arc::new(MemorySink::new());
    let (_core, tx, _task) = start(w.sim.clone(), &sink, config(4));
    let inst = w.instance();
    let mut node = agent_node(&w, "handed-over", &inst.id, 12);
    node.metadata.annotations = Some(
        [(
            eni_operator::crd::CILIUM_IGNORE_ANNOTATION.to_string(),
            "true".to_string(),
        )]
        .into(),
    );
    let n = sink.put(&node);
    tx.send(NodeInput::Upsert(Box::new(n))).await.unwrap();
    assert!(wait_until(|| served(&sink, "handed-over", 12), Duration::from_secs(60)).await);
}

fn annotation(sink: &MemorySink, name: &str, key: &str) -> Option<String> {
    sink.get(name)?.metadata.annotations?.get(key).cloned()
}

#[tokio::test(start_paused = true)]
async fn annotate_cilium_ignore_marks_served_nodes_once_and_keeps_other_annotations() {
    use eni_operator::crd::CILIUM_IGNORE_ANNOTATION;
    let w = Cluster::new();
    let sink = Arc::new(MemorySink::new());
    let mut cfg = config(4);
    cfg.annotate_cilium_ignore = true;
    let (_core, tx, _task) = start(w.sim.clone(), &sink, cfg);
    let inst = w.instance();
    let mut node = agent_node(&w, "n", &inst.id, 8);
    node.metadata.annotations = Some([("team".to_string(), "net".to_string())].into());
    let n = sink.put(&node);
    tx.send(NodeInput::Upsert(Box::new(n))).await.unwrap();
    assert!(wait_until(|| served(&sink, "n", 8), Duration::from_secs(60)).await);
    assert_eq!(
        annotation(&sink, "n", CILIUM_IGNORE_ANNOTATION).as_deref(),
        Some("true")
    );
    assert_eq!(annotation(&sink, "n", "team").as_deref(), Some("net"));
    // The confirmed-instance record, the finalizer and the annotation: one metadata write each.
    assert_eq!(sink.writes("n").metadata, 3);

    // Steady state: rescans and full refreshes write nothing, also after the agent's updates.
    let n = sink.update("n", |_| {}).unwrap();
    tx.send(NodeInput::Upsert(Box::new(n))).await.unwrap();
    let writes = sink.writes("n");
    tokio::time::sleep(Duration::from_secs(190)).await;
    assert_eq!(sink.writes("n"), writes, "no write in steady state");

    // Someone removes it: it comes back (and only it is written).
    let n = sink
        .update("n", |n| {
            n.metadata
                .annotations
                .as_mut()
                .unwrap()
                .remove(CILIUM_IGNORE_ANNOTATION);
        })
        .unwrap();
    tx.send(NodeInput::Upsert(Box::new(n))).await.unwrap();
    assert!(
        wait_until(
            || annotation(&sink, "n", CILIUM_IGNORE_ANNOTATION).is_some(),
            Duration::from_secs(30)
        )
        .await
    );
    assert_eq!(sink.writes("n").metadata, writes.metadata + 1);
    assert_eq!(sink.writes("n").total(), writes.total() + 1);
}

#[tokio::test(start_paused = true)]
async fn opting_a_node_out_removes_the_cilium_ignore_annotation() {
    use eni_operator::crd::{CILIUM_IGNORE_ANNOTATION, IGNORE_ANNOTATION};
    let w = Cluster::new();
    let sink = Arc::new(MemorySink::new());
    let mut cfg = config(4);
    cfg.annotate_cilium_ignore = true;
    let (_core, tx, _task) = start(w.sim.clone(), &sink, cfg);
    let inst = w.instance();
    let mut node = agent_node(&w, "n", &inst.id, 4);
    node.metadata.annotations = Some([("team".to_string(), "net".to_string())].into());
    let n = sink.put(&node);
    tx.send(NodeInput::Upsert(Box::new(n))).await.unwrap();
    assert!(
        wait_until(
            || annotation(&sink, "n", CILIUM_IGNORE_ANNOTATION).is_some(),
            Duration::from_secs(30)
        )
        .await
    );
    let n = sink
        .update("n", |n| {
            n.metadata
                .annotations
                .as_mut()
                .unwrap()
                .insert(IGNORE_ANNOTATION.into(), "true".into());
        })
        .unwrap();
    tx.send(NodeInput::Upsert(Box::new(n))).await.unwrap();
    let let_go = || {
        sink.get("n").is_some_and(|n| {
            n.metadata.finalizers.is_none_or(|f| f.is_empty())
                && n.metadata
                    .annotations
                    .is_some_and(|a| !a.contains_key(CILIUM_IGNORE_ANNOTATION))
        })
    };
    assert!(wait_until(let_go, Duration::from_secs(30)).await);
    assert_eq!(annotation(&sink, "n", "team").as_deref(), Some("net"));
    assert_eq!(
        annotation(&sink, "n", IGNORE_ANNOTATION).as_deref(),
        Some("true")
    );
    let writes = sink.writes("n");
    tokio::time::sleep(Duration::from_secs(130)).await;
    assert_eq!(sink.writes("n"), writes, "a node let go is never written");
}

#[tokio::test(start_paused = true)]
async fn without_annotate_cilium_ignore_the_annotation_is_never_written() {
    use eni_operator::crd::CILIUM_IGNORE_ANNOTATION;
    let w = Cluster::new();
    let sink = Arc::new(MemorySink::new());
    let (_core, tx, _task) = start(w.sim.clone(), &sink, config(4));
    join(&w, &sink, &tx, "n", 4).await;
    assert!(wait_until(|| served(&sink, "n", 4), Duration::from_secs(30)).await);
    assert_eq!(annotation(&sink, "n", CILIUM_IGNORE_ANNOTATION), None);
    assert_eq!(
        sink.writes("n").metadata,
        2,
        "the confirmed-instance record and the finalizer only"
    );
}

#[tokio::test(start_paused = true)]
async fn a_core_is_warm_once_its_first_full_refresh_succeeded() {
    let w = Cluster::new();
    w.sim
        .set_latency(Operation::DescribeSubnets, Duration::from_secs(3));
    let sink = Arc::new(MemorySink::new());
    let cfg = config(4);
    let cache = cfg.ec2_cache();
    let core = Core::new(
        Arc::new(w.sim.clone()),
        sink.clone(),
        cfg,
        RuntimeMetrics::default(),
        cache,
    );
    let warm = core.warm();
    assert!(!*warm.borrow());
    let (_tx, rx) = mpsc::channel(16);
    let _task = tokio::spawn(core.clone().run(rx, std::future::pending()));
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!*warm.borrow(), "still listing subnets");
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(*warm.borrow());
}

/// Issue 29 item 6: a leadership's first full EC2 listing covers the managed nodes' VPC only.
/// It used to run before any node was known, so it listed every ENI, subnet and security
/// group of the Region: a failover took as long as the account was large, not the cluster.
#[tokio::test(start_paused = true)]
async fn the_first_listing_of_a_leadership_covers_only_the_managed_nodes_vpc() {
    let w = Cluster::new();
    w.sim.set_page_size(10);
    // Another VPC of the account, busy and none of the cluster's business.
    let other = w.sim.add_vpc("10.1.0.0/16".parse().unwrap(), &[]);
    let other_sg = w.sim.add_security_group(&other, Tags::new());
    for i in 0..20u8 {
        let cidr = format!("10.1.{i}.0/24").parse().unwrap();
        let subnet = w.sim.add_subnet(&other, "zone-a", cidr, Tags::new());
        for _ in 0..3 {
            w.sim
                .run_instance("m5.large", &subnet, std::slice::from_ref(&other_sg));
        }
    }
    let sink = Arc::new(MemorySink::new());
    let ((core, tx, _task), cache) = start_with_cache(w.sim.clone(), &sink, config(4));
    let mut warm = core.warm();
    for i in 0..3 {
        join(&w, &sink, &tx, &format!("n{i}"), 8).await;
    }
    warm.wait_for(|w| *w).await.unwrap();
    let stats = w.sim.stats();
    let (enis, subnets) = (
        stats.get(Operation::DescribeNetworkInterfaces).calls,
        stats.get(Operation::DescribeSubnets).calls,
    );
    let listed: BTreeSet<String> = {
        let c = cache.read().unwrap();
        c.subnets.values().map(|s| s.vpc_id.clone()).collect()
    };
    assert_eq!(
        listed,
        BTreeSet::from([w.vpc.clone()]),
        "subnets of the managed VPC only ({enis} describes of ENIs, {subnets} of subnets)"
    );
    // The other VPC's 60 ENIs and 20 subnets alone are 6 and 2 pages. Here: the describes of
    // the nodes' instances (the first node's, then the others'), one page of their VPC's
    // ENIs and one of its subnets.
    assert!(
        enis <= 3 && subnets <= 1,
        "describes before the first action: {enis} of ENIs, {subnets} of subnets"
    );
    assert!(
        wait_until(
            || (0..3).all(|i| served(&sink, &format!("n{i}"), 8)),
            Duration::from_secs(5)
        )
        .await,
        "each node served within 5 s of the first listing"
    );
}

// ---- ClientTokens and ENIs left unattached (a burned token must never block a node) ----

fn create_calls(sim: &Simulator) -> u64 {
    sim.stats().get(Operation::CreateNetworkInterface).calls
}

/// Our ENIs attached to the instance (the primary excluded).
async fn our_attached(sim: &Simulator, instance: &str) -> Vec<NetworkInterface> {
    attached_enis(sim, instance)
        .await
        .into_iter()
        .filter(|e| e.device_index() != Some(0))
        .collect()
}

fn throttled() -> testkit::sim::Fault {
    testkit::sim::Fault::new("RequestLimitExceeded", "Request limit exceeded.", 503)
}

#[tokio::test(start_paused = true)]
async fn a_throttled_attach_keeps_the_eni_and_the_next_pass_attaches_it() {
    let w = Cluster::new();
    // Every attempt the gate makes for the first attach is throttled (the account's bucket is
    // drained by other tools): the gate gives up after its 5 attempts.
    w.sim.inject_error(
        Operation::AttachNetworkInterface,
        "RequestLimitExceeded",
        GateConfig::aws_defaults().max_attempts as usize,
    );
    let sink = Arc::new(MemorySink::new());
    let gate = Gate::new(w.sim.clone(), GateConfig::aws_defaults());
    let (_core, tx, _task) = start(gate, &sink, config(4));
    let inst = join(&w, &sink, &tx, "n", 8).await;
    assert!(
        wait_until(|| served(&sink, "n", 8), Duration::from_secs(120)).await,
        "served: {:?}",
        operator_error(&sink, "n")
    );
    assert_eq!(
        create_calls(&w.sim),
        1,
        "the kept ENI was attached, none created"
    );
    assert_eq!(
        w.sim.stats().get(Operation::DeleteNetworkInterface).calls,
        0,
        "a throttled attach never deletes the ENI"
    );
    assert_eq!(our_attached(&w.sim, &inst.id).await.len(), 1);
    assert!(our_available_enis(&w.sim).await.is_empty());
    w.sim.check_invariants().unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_refused_attach_does_not_leave_the_node_stuck_on_its_token() {
    let w = Cluster::new();
    // EC2 refuses the first attach for good: the ENI is deleted, so its token now answers
    // with an ENI that does not exist.
    w.sim.inject_error(
        Operation::AttachNetworkInterface,
        "InvalidParameterValue",
        1,
    );
    let sink = Arc::new(MemorySink::new());
    let (_core, tx, _task) = start(w.sim.clone(), &sink, config(4));
    let inst = join(&w, &sink, &tx, "n", 8).await;
    assert!(
        wait_until(|| served(&sink, "n", 8), Duration::from_secs(120)).await,
        "served: {:?}",
        operator_error(&sink, "n")
    );
    assert_eq!(create_calls(&w.sim), 2, "one fresh token after the refusal");
    assert_eq!(our_attached(&w.sim, &inst.id).await.len(), 1);
    assert!(our_available_enis(&w.sim).await.is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_token_burned_before_a_restart_does_not_block_the_node() {
    let w = Cluster::new();
    w.sim.set_fault_rate(
        Operation::AttachNetworkInterface,
        1.0,
        testkit::sim::Fault::new("InvalidParameterValue", "refused (injected)", 400),
    );
    let sink = Arc::new(MemorySink::new());
    let (_core, tx, task) = start(w.sim.clone(), &sink, config(4));
    let inst = join(&w, &sink, &tx, "n", 8).await;
    let sim = w.sim.clone();
    assert!(
        wait_until(
            || sim.stats().get(Operation::DeleteNetworkInterface).ok >= 1,
            Duration::from_secs(60)
        )
        .await
    );
    // The operator restarts with no memory of the token it burned.
    task.abort();
    let _ = task.await;
    w.sim
        .set_fault_rate(Operation::AttachNetworkInterface, 0.0, throttled());
    let (_core, tx, _task) = start(w.sim.clone(), &sink, config(4));
    tx.send(NodeInput::Upsert(Box::new(sink.get("n").unwrap())))
        .await
        .unwrap();
    assert!(
        wait_until(|| served(&sink, "n", 8), Duration::from_secs(120)).await,
        "served: {:?}",
        operator_error(&sink, "n")
    );
    assert_eq!(our_attached(&w.sim, &inst.id).await.len(), 1);
    assert!(our_available_enis(&w.sim).await.is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_new_eni_at_a_reused_device_index_gets_a_fresh_token() {
    let w = Cluster::new();
    let sink = Arc::new(MemorySink::new());
    let (_core, tx, _task) = start(w.sim.clone(), &sink, config(4));
    let inst = join(&w, &sink, &tx, "n", 8).await;
    assert!(wait_until(|| served(&sink, "n", 8), Duration::from_secs(60)).await);
    // The ENI at device index 1 goes away (detached and deleted by someone); the node needs a
    // new one at the same index, with the same attached set as the first time.
    let first = our_attached(&w.sim, &inst.id).await.remove(0);
    assert_eq!(first.device_index(), Some(1));
    w.sim
        .detach_network_interface(&first.attachment.as_ref().unwrap().id, false)
        .await
        .unwrap();
    w.sim.delete_network_interface(&first.id).await.unwrap();
    let sim = w.sim.clone();
    let replaced = wait_until(
        || {
            sim.check_invariants().is_ok()
                && sink.get("n").is_some_and(|n| {
                    n.spec.ipam.pool.len() >= 8
                        && n.spec.ipam.pool.values().all(|a| a.resource != first.id)
                })
        },
        Duration::from_secs(300),
    )
    .await;
    assert!(replaced, "served again: {:?}", operator_error(&sink, "n"));
    assert!(served(&sink, "n", 8));
    let now = our_attached(&w.sim, &inst.id).await;
    assert_eq!(now.len(), 1);
    assert_ne!(now[0].id, first.id);
    assert_eq!(now[0].device_index(), Some(1));
}

/// Start a core, let it create an ENI for a node and kill it while the attach is in flight.
/// Returns the ENI left `available`.
async fn crash_between_create_and_attach(
    w: &Cluster,
    sink: &Arc<MemorySink>,
    node: &CiliumNode,
) -> NetworkInterface {
    w.sim
        .set_latency(Operation::AttachNetworkInterface, Duration::from_secs(30));
    let (_core, tx, task) = start(w.sim.clone(), sink, config(4));
    tx.send(NodeInput::Upsert(Box::new(node.clone())))
        .await
        .unwrap();
    let sim = w.sim.clone();
    assert!(
        wait_until(
            || sim.stats().get(Operation::CreateNetworkInterface).ok >= 1,
            Duration::from_secs(60)
        )
        .await
    );
    task.abort();
    let _ = task.await;
    w.sim
        .set_latency(Operation::AttachNetworkInterface, Duration::ZERO);
    let mut left = our_available_enis(&w.sim).await;
    assert_eq!(left.len(), 1, "the created ENI was never attached");
    left.remove(0)
}

#[tokio::test(start_paused = true)]
async fn an_eni_left_by_a_crash_between_create_and_attach_is_attached_instead_of_a_new_create() {
    let w = Cluster::new();
    let sink = Arc::new(MemorySink::new());
    let inst = w.instance();
    let n = sink.put(&agent_node(&w, "n", &inst.id, 16));
    let left = crash_between_create_and_attach(&w, &sink, &n).await;
    // Demand moves before the new leader acts: the same token would now be a mismatch.
    let n = sink.update("n", |n| n.spec.ipam.min_allocate = 2).unwrap();
    let (_core, tx, _task) = start(w.sim.clone(), &sink, config(4));
    tx.send(NodeInput::Upsert(Box::new(n))).await.unwrap();
    assert!(
        wait_until(|| served(&sink, "n", 8), Duration::from_secs(120)).await,
        "served: {:?}",
        operator_error(&sink, "n")
    );
    assert_eq!(create_calls(&w.sim), 1, "no second create");
    let attached = our_attached(&w.sim, &inst.id).await;
    assert_eq!(attached.len(), 1);
    assert_eq!(attached[0].id, left.id, "the leftover was attached");
    assert!(our_available_enis(&w.sim).await.is_empty());
    assert!(sink.events("n").iter().any(|e| e.reason == "EniAttached"));
}

#[tokio::test(start_paused = true)]
async fn idempotent_parameter_mismatch_moves_to_a_fresh_token() {
    let w = Cluster::new();
    let sg2 = w.sim.add_security_group(&w.vpc, Tags::new());
    let sink = Arc::new(MemorySink::new());
    let inst = w.instance();
    let mut node = agent_node(&w, "n", &inst.id, 8);
    node.spec.eni.security_groups = vec![w.sg.clone()];
    let n = sink.put(&node);
    let left = crash_between_create_and_attach(&w, &sink, &n).await;
    // The security groups change before the retry: the leftover no longer fits, and the
    // token of the first request now comes with other parameters.
    let n = sink
        .update("n", |n| n.spec.eni.security_groups = vec![sg2.clone()])
        .unwrap();
    let (_core, tx, _task) = start(w.sim.clone(), &sink, config(4));
    tx.send(NodeInput::Upsert(Box::new(n))).await.unwrap();
    assert!(
        wait_until(|| served(&sink, "n", 8), Duration::from_secs(120)).await,
        "served: {:?}",
        operator_error(&sink, "n")
    );
    let attached = our_attached(&w.sim, &inst.id).await;
    assert_eq!(attached.len(), 1);
    assert_eq!(attached[0].security_groups, vec![sg2]);
    assert!(
        w.sim.network_interface(&left.id).is_none(),
        "misfit deleted"
    );
    assert!(our_available_enis(&w.sim).await.is_empty());
}

#[tokio::test(start_paused = true)]
async fn the_gc_removing_a_kept_eni_does_not_block_the_node() {
    let w = Cluster::new();
    w.sim
        .set_fault_rate(Operation::AttachNetworkInterface, 1.0, throttled());
    let sink = Arc::new(MemorySink::new());
    let gate = Gate::new(w.sim.clone(), GateConfig::aws_defaults());
    let (_core, tx, _task) = start(gate, &sink, config(4));
    let inst = join(&w, &sink, &tx, "n", 8).await;
    let sim = w.sim.clone();
    assert!(
        wait_until(
            || sim.stats().get(Operation::CreateNetworkInterface).ok >= 1,
            Duration::from_secs(60)
        )
        .await
    );
    // The kept ENI stays available over two GC runs and is collected.
    let mut gc = EniGc::new(CLUSTER, 25).with_vpcs([w.vpc.clone()]);
    gc.run_once(&w.sim, &[]).await.unwrap();
    let report = gc.run_once(&w.sim, &[]).await.unwrap();
    assert_eq!(report.deleted.len(), 1);
    w.sim
        .set_fault_rate(Operation::AttachNetworkInterface, 0.0, throttled());
    assert!(
        wait_until(|| served(&sink, "n", 8), Duration::from_secs(300)).await,
        "served: {:?}",
        operator_error(&sink, "n")
    );
    assert_eq!(our_attached(&w.sim, &inst.id).await.len(), 1);
    assert!(our_available_enis(&w.sim).await.is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_lost_answer_to_an_assign_does_not_double_the_addresses() {
    let w = Cluster::new();
    let sink = Arc::new(MemorySink::new());
    let gate = Gate::new(w.sim.clone(), GateConfig::aws_defaults());
    let (_core, tx, _task) = start(gate, &sink, config(4));
    // m5.xlarge: 14 secondary addresses per ENI, room for a top-up and for its double.
    let inst = w
        .sim
        .run_instance("m5.xlarge", &w.subnet, std::slice::from_ref(&w.sg));
    let mut node = agent_node(&w, "n", &inst.id, 2);
    node.spec.eni.instance_type = "m5.xlarge".into();
    let n = sink.put(&node);
    tx.send(NodeInput::Upsert(Box::new(n))).await.unwrap();
    assert!(wait_until(|| served(&sink, "n", 8), Duration::from_secs(60)).await);
    let before = sink.get("n").unwrap().spec.ipam.pool.len();
    // The next assign is carried out, but its answer never arrives.
    w.sim
        .inject_lost_answer(Operation::AssignPrivateIpAddresses, 1);
    let want = before + 3;
    let n = sink
        .update("n", |n| n.spec.ipam.min_allocate = want as i64)
        .unwrap();
    tx.send(NodeInput::Upsert(Box::new(n))).await.unwrap();
    assert!(
        wait_until(|| served(&sink, "n", want), Duration::from_secs(120)).await,
        "served: {:?}",
        operator_error(&sink, "n")
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    let enis = our_attached(&w.sim, &inst.id).await;
    let in_ec2: usize = enis.iter().map(|e| e.secondary_ips.len()).sum();
    let pool = sink.get("n").unwrap().spec.ipam.pool.len();
    assert_eq!(in_ec2, pool, "EC2 agrees with the pool");
    assert_eq!(pool, want, "no address assigned twice");
    assert_eq!(
        w.sim.stats().get(Operation::AssignPrivateIpAddresses).ok,
        1,
        "the assign was carried out once"
    );
}

/// The gate retries an unassign whose answer was lost (it took effect) and the retry meets a
/// 5xx: the addresses count as released (the agent gave them up). Counted as still assigned,
/// they stayed in the cache and the pool, the handshake was withdrawn, and pods got addresses
/// EC2 no longer had (`make dst` seed 434).
#[tokio::test(start_paused = true)]
async fn an_unassign_that_took_effect_counts_released_when_its_retry_meets_a_5xx() {
    let w = Cluster::new();
    let inst = w.instance();
    let primary = w.sim.primary_eni_id(&inst.id).unwrap();
    let assigned = w
        .sim
        .assign_private_ip_addresses(&primary, AddressRequest::Ips(4))
        .await
        .unwrap();
    let f = EniFilter::default();
    let enis = collect_pages(|t| w.sim.describe_network_interfaces(&f, t))
        .await
        .unwrap();
    let cache = Arc::new(RwLock::new(Ec2Cache::for_cluster(CLUSTER)));
    cache.write().unwrap().apply_instances(
        std::slice::from_ref(&inst.id),
        enis,
        tokio::time::Instant::now().into_std(),
    );
    let gate = Gate::new(w.sim.clone(), GateConfig::aws_defaults());
    let executor = Executor::new(Arc::new(gate), cache.clone());

    // The first attempt is carried out but its answer is lost; every retry meets a 5xx.
    w.sim
        .inject_lost_answer(Operation::UnassignPrivateIpAddresses, 1);
    let sim = w.sim.clone();
    let fail_retries = tokio::spawn(async move {
        while sim.stats().get(Operation::UnassignPrivateIpAddresses).calls == 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        sim.inject_error(Operation::UnassignPrivateIpAddresses, "InternalError", 10);
    });
    let gone = vec![assigned.ips[0], assigned.ips[1]];
    let out = executor
        .execute(&Action::Release(Release {
            eni_id: primary.clone(),
            ips: gone.clone(),
            prefixes: Vec::new(),
        }))
        .await;
    fail_retries.await.unwrap();
    let in_ec2 = w.sim.network_interface(&primary).unwrap().secondary_ips;
    assert!(
        gone.iter().all(|ip| !in_ec2.contains(ip)),
        "the first attempt took effect: {in_ec2:?}"
    );
    assert_eq!(
        out.error.as_ref().map(|e| e.code.as_str()),
        None,
        "the last answer was a 5xx, yet the release counts"
    );
    assert!(out.released.is_some());
    let known = cache
        .read()
        .unwrap()
        .eni(&primary)
        .unwrap()
        .secondary_ips
        .clone();
    assert!(
        gone.iter().all(|ip| !known.contains(ip)),
        "the cache still has them: {known:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn twenty_nodes_under_a_tenth_of_the_aws_rates_all_get_their_enis() {
    // Other tools drain the account's buckets: EC2 lets us have a tenth of its published rates
    // (refills rounded up to 1/s), while the gate believes it has 80 %. Throttled attaches
    // must not strand a node behind a burned token.
    const NODES: usize = 20;
    let w = Cluster::new();
    for b in eni_operator::ec2::Bucket::ALL {
        let (burst, rate) = b.aws_default();
        w.sim.set_bucket(b, (burst / 10).max(1), (rate / 10).max(1));
    }
    let sink = Arc::new(MemorySink::new());
    let gate = Gate::new(w.sim.clone(), GateConfig::aws_defaults());
    let (_core, tx, _task) = start(gate, &sink, config(20));
    let mut names = Vec::new();
    for i in 0..NODES {
        let inst = w.instance();
        let name = format!("node-{i}");
        let n = sink.put(&agent_node(&w, &name, &inst.id, 8));
        tx.send(NodeInput::Upsert(Box::new(n))).await.unwrap();
        names.push(name);
    }
    let all = wait_until(
        || names.iter().all(|n| served(&sink, n, 8)),
        Duration::from_secs(600),
    )
    .await;
    let stuck: Vec<_> = names
        .iter()
        .filter(|n| !served(&sink, n, 8))
        .map(|n| (n.clone(), operator_error(&sink, n)))
        .collect();
    assert!(all, "stuck: {stuck:?}");
    assert!(
        w.sim
            .stats()
            .get(Operation::AttachNetworkInterface)
            .throttled
            > 0,
        "the scenario throttled attaches"
    );
    // Served nodes leave nothing behind (the GC would, after two rounds).
    assert!(our_available_enis(&w.sim).await.is_empty());
    w.sim.check_invariants().unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_lost_answer_to_an_attach_is_found_attached() {
    let w = Cluster::new();
    // The attach is carried out but its answer never arrives: the operator must look, not
    // repeat it (refused "in use") and then try to delete an attached ENI.
    w.sim
        .inject_lost_answer(Operation::AttachNetworkInterface, 1);
    let sink = Arc::new(MemorySink::new());
    let gate = Gate::new(w.sim.clone(), GateConfig::aws_defaults());
    let (_core, tx, _task) = start(gate, &sink, config(4));
    let inst = join(&w, &sink, &tx, "n", 8).await;
    assert!(
        wait_until(|| served(&sink, "n", 8), Duration::from_secs(60)).await,
        "served: {:?}",
        operator_error(&sink, "n")
    );
    let stats = w.sim.stats();
    assert_eq!(
        stats.get(Operation::AttachNetworkInterface).calls,
        1,
        "not repeated"
    );
    assert_eq!(stats.get(Operation::DeleteNetworkInterface).calls, 0);
    assert_eq!(stats.get(Operation::CreateNetworkInterface).calls, 1);
    assert!(
        !sink.events("n").iter().any(|e| e.warning),
        "no error: {:?}",
        sink.events("n")
    );
    assert_eq!(our_attached(&w.sim, &inst.id).await.len(), 1);
}

/// Our ENIs of an instance (ownership tags), with their addresses: what must not change while
/// its Node drains.
async fn our_enis(sim: &Simulator, instance: &str) -> Vec<(String, Vec<Ipv4Addr>, Vec<Ipv4Net>)> {
    let tags = ownership_tags(CLUSTER, instance);
    let mut out: Vec<_> = attached_enis(sim, instance)
        .await
        .into_iter()
        .filter(|e| tags.iter().all(|(k, v)| e.tags.get(k) == Some(v)))
        .map(|mut e| {
            e.secondary_ips.sort();
            (e.id, e.secondary_ips, e.prefixes)
        })
        .collect();
    out.sort();
    out
}

/// Karpenter's finalizer on the Nodes it drains.
const KARPENTER: &str = "karpenter.sh/termination";

#[tokio::test(start_paused = true)]
async fn a_draining_node_keeps_its_enis_until_it_is_gone() {
    let w = Cluster::new();
    let sink = Arc::new(MemorySink::new());
    let (_core, tx, _task) = start(w.sim.clone(), &sink, config(4));
    let inst = join(&w, &sink, &tx, "d", 8).await;
    let node = sink.put_node("d", &[KARPENTER]);
    tx.send(node_input(Event::Apply(node)).unwrap())
        .await
        .unwrap();
    assert!(wait_until(|| served(&sink, "d", 8), Duration::from_secs(60)).await);
    let before = our_enis(&w.sim, &inst.id).await;
    assert_eq!(before.len(), 1, "one ENI of ours: {before:?}");

    // Karpenter drains: the Node gets its deletionTimestamp and stays, held by its finalizer,
    // while the instance still runs pods on our addresses.
    let event = sink.delete_node("d").expect("the Node exists");
    assert!(matches!(&event, Event::Apply(_)), "held by Karpenter");
    tx.send(node_input(event).unwrap()).await.unwrap();
    // Long enough for full refreshes and rescans of every node.
    tokio::time::sleep(Duration::from_secs(150)).await;
    let kept = sink.get("d").expect("the CiliumNode is kept");
    assert!(kept.metadata.deletion_timestamp.is_none(), "not deleted");
    assert_eq!(our_enis(&w.sim, &inst.id).await, before, "no EC2 change");
    assert!(
        !sink.events("d").iter().any(|e| e.reason == "EnisReleased"),
        "{:?}",
        sink.events("d")
    );

    // Karpenter is done: the instance shuts down, the Node goes, and with it the CiliumNode
    // and our ENI.
    w.sim
        .set_instance_state(&inst.id, InstanceState::ShuttingDown);
    let event = sink
        .remove_node_finalizer("d", KARPENTER)
        .expect("the Node exists");
    assert!(matches!(&event, Event::Delete(_)), "gone");
    tx.send(node_input(event).unwrap()).await.unwrap();
    assert!(wait_until(|| sink.raw("d").is_none(), Duration::from_secs(120)).await);
    assert_eq!(our_enis(&w.sim, &inst.id).await, vec![], "our ENI released");
    assert!(our_available_enis(&w.sim).await.is_empty(), "and deleted");
}

#[tokio::test(start_paused = true)]
async fn an_unparsable_node_is_deleted_with_its_enis_once_its_node_is_gone() {
    let w = Cluster::new();
    let sink = Arc::new(MemorySink::new());
    let (_core, tx, _task) = start(w.sim.clone(), &sink, config(4));
    let inst = join(&w, &sink, &tx, "bad", 8).await;
    let node = sink.put_node("bad", &[]);
    tx.send(node_input(Event::Apply(node)).unwrap())
        .await
        .unwrap();
    assert!(wait_until(|| served(&sink, "bad", 8), Duration::from_secs(60)).await);
    assert_eq!(our_enis(&w.sim, &inst.id).await.len(), 1);

    // Something our types reject: reported on the object.
    let raw = sink
        .edit_raw("bad", |v| {
            v["spec"]["ipam"]["pre-allocate"] = serde_json::json!("lots")
        })
        .unwrap();
    let obj: DynamicObject = serde_json::from_value(raw).unwrap();
    tx.send(to_input(&obj)).await.unwrap();
    let error = |sink: &MemorySink| {
        sink.raw("bad")
            .and_then(|v| {
                v.pointer("/status/ipam/operator-status/error")
                    .and_then(|e| e.as_str().map(String::from))
            })
            .unwrap_or_default()
    };
    assert!(
        wait_until(
            || error(&sink).contains("InvalidSpec"),
            Duration::from_secs(30)
        )
        .await
    );

    // The instance terminates and the Node goes; Kubernetes' garbage collector deletes the
    // CiliumNode (Cilium makes the Node its owner) and our finalizer holds it.
    w.sim
        .set_instance_state(&inst.id, InstanceState::ShuttingDown);
    let event = sink.delete_node("bad").expect("the Node exists");
    tx.send(node_input(event).unwrap()).await.unwrap();
    sink.begin_delete("bad");
    if let Some(raw) = sink.raw("bad") {
        assert!(raw.pointer("/metadata/deletionTimestamp").is_some());
        let obj: DynamicObject = serde_json::from_value(raw).unwrap();
        tx.send(to_input(&obj)).await.unwrap();
    }
    assert!(
        wait_until(|| sink.raw("bad").is_none(), Duration::from_secs(120)).await,
        "hangs in Terminating: {:?}",
        sink.raw("bad")
    );
    assert_eq!(our_enis(&w.sim, &inst.id).await, vec![], "our ENI released");
}

/// A multi-pool agent's CiliumNode: its demand in `pools.requested`.
fn multi_pool_node(w: &Cluster, name: &str, instance: &str, requested: i64) -> CiliumNode {
    let mut n = agent_node(w, name, instance, 0);
    set_requested(&mut n, requested);
    n
}

fn set_requested(n: &mut CiliumNode, requested: i64) {
    n.spec.ipam.pools.requested = vec![IpamPoolRequest {
        pool: "default".into(),
        needed: IpamPoolDemand {
            ipv4_addrs: requested,
            ..Default::default()
        },
        ..Default::default()
    }];
}

/// The agent's CIDRs of the instance's non-primary ENIs (C3: each /28, each other address as a
/// /32; the simulator grants no /28s).
async fn agent_cidrs(sim: &Simulator, instance: &str) -> Vec<String> {
    let mut out: Vec<String> = attached_enis(sim, instance)
        .await
        .iter()
        .filter(|e| e.device_index() != Some(0))
        .flat_map(|e| e.secondary_ips.iter().map(|ip| format!("{ip}/32")))
        .collect();
    out.sort();
    out
}

fn set_allocated(n: &mut CiliumNode, cidrs: &[String]) {
    n.spec.ipam.pools.allocated = vec![IpamPoolAllocation {
        pool: "default".into(),
        cidrs: cidrs.to_vec(),
        ..Default::default()
    }];
}

/// A multi-pool node "mp" served (16 requested with the default pre-allocation of 8: 8 in use,
/// 16 wanted), release on (delay 10 s, a rescan every 5 s), and its CIDRs on EC2.
struct MultiPoolServed {
    w: Cluster,
    sink: Arc<MemorySink>,
    tx: mpsc::Sender<NodeInput>,
    inst: Instance,
    all: Vec<String>,
    _running: Running<Simulator>,
}

async fn multi_pool_served() -> MultiPoolServed {
    let w = Cluster::new();
    let sink = Arc::new(MemorySink::new());
    let mut cfg = config(4);
    cfg.ipam.release_excess_ips = true;
    cfg.ipam.release_delay = Duration::from_secs(10);
    cfg.node_rescan_interval = Duration::from_secs(5);
    let running = start(w.sim.clone(), &sink, cfg);
    let tx = running.1.clone();
    let inst = w.instance();
    let n = sink.put(&multi_pool_node(&w, "mp", &inst.id, 16));
    tx.send(NodeInput::Upsert(Box::new(n))).await.unwrap();
    assert!(
        wait_until_async(|| async { agent_cidrs(&w.sim, &inst.id).await.len() >= 16 }).await,
        "allocated"
    );
    let all = agent_cidrs(&w.sim, &inst.id).await;
    MultiPoolServed {
        w,
        sink,
        tx,
        inst,
        all,
        _running: running,
    }
}

#[tokio::test(start_paused = true)]
async fn a_cidr_the_agent_takes_back_before_the_unassign_is_not_released() {
    let MultiPoolServed {
        w,
        sink,
        tx,
        inst,
        all,
        _running,
    } = multi_pool_served().await;

    // The agent holds every CIDR, then its demand drops: 8 in excess.
    let n = sink
        .update("mp", |n| {
            set_allocated(n, &all);
            set_requested(n, 8);
        })
        .unwrap();
    tx.send(NodeInput::Upsert(Box::new(n))).await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    // It drops one CIDR (the operator sees it) ...
    let taken_back = all.last().unwrap().clone();
    let n = sink
        .update("mp", |n| set_allocated(n, &all[..all.len() - 1]))
        .unwrap();
    tx.send(NodeInput::Upsert(Box::new(n))).await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    // ... and re-adopts it as demand grows again (Cilium #46674), before the release delay is
    // up; the operator's copy still lacks it (a lagging watch, a throttled pass).
    sink.update("mp", |n| set_allocated(n, &all)).unwrap();
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert!(
        agent_cidrs(&w.sim, &inst.id).await.contains(&taken_back),
        "{taken_back} was released though the agent holds it again"
    );
    assert!(
        !sink.events("mp").iter().any(|e| e.reason == "IpsReleased"),
        "{:?}",
        sink.events("mp")
    );

    // A CIDR the agent really gives up is released (the check does not block releases).
    let dropped = all[0].clone();
    let n = sink.update("mp", |n| set_allocated(n, &all[1..])).unwrap();
    tx.send(NodeInput::Upsert(Box::new(n))).await.unwrap();
    assert!(
        wait_until_async(|| async { !agent_cidrs(&w.sim, &inst.id).await.contains(&dropped) })
            .await,
        "{dropped} not released"
    );
    let left = agent_cidrs(&w.sim, &inst.id).await;
    assert!(left.contains(&taken_back));
    assert_eq!(left.len(), all.len() - 1);
}

/// The CIDRs a multi-pool agent may take from the node's `status.eni.enis` (C3), non-primary
/// ENIs only (as [`agent_cidrs`]).
fn status_cidrs(sink: &MemorySink, name: &str) -> BTreeSet<String> {
    sink.get(name)
        .and_then(|n| n.status)
        .map(|s| {
            s.eni
                .enis
                .values()
                .filter(|e| e.number != 0)
                .flat_map(|e| e.addresses.iter().map(|a| format!("{a}/32")))
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(start_paused = true)]
async fn a_dropped_cidr_leaves_the_status_before_its_unassign_even_when_writes_fail() {
    let MultiPoolServed {
        w,
        sink,
        tx,
        inst,
        all,
        _running,
    } = multi_pool_served().await;
    assert!(
        wait_until(
            || status_cidrs(&sink, "mp").len() == all.len(),
            Duration::from_secs(30)
        )
        .await,
        "published"
    );
    // The agent holds every CIDR; then its demand drops and it gives up one; the API server
    // fails the operator's next writes (a 5xx before commit: nothing written).
    let n = sink.update("mp", |n| set_allocated(n, &all)).unwrap();
    tx.send(NodeInput::Upsert(Box::new(n))).await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let dropped = all.last().unwrap().clone();
    let n = sink
        .update("mp", |n| {
            set_allocated(n, &all[..all.len() - 1]);
            set_requested(n, 8);
        })
        .unwrap();
    tx.send(NodeInput::Upsert(Box::new(n))).await.unwrap();
    // (After the write of the new demand, before the release delay is up.)
    tokio::time::sleep(Duration::from_secs(3)).await;
    sink.inject_write_fault(WriteFault::Unavailable, 3);
    // Until the CIDR is gone from EC2, and a while after: whatever the status lists is on EC2
    // (the agent takes addresses from the status, Cilium #46674), and the status stopped
    // listing the CIDR before it went.
    let mut released_at = None;
    for step in 0..480 {
        let on_ec2 = agent_cidrs(&w.sim, &inst.id).await;
        let listed = status_cidrs(&sink, "mp");
        let unassigned: Vec<&String> = listed.iter().filter(|c| !on_ec2.contains(c)).collect();
        assert!(
            unassigned.is_empty(),
            "step {step}: the status lists {unassigned:?}, which EC2 no longer has"
        );
        if released_at.is_none() && !on_ec2.contains(&dropped) {
            released_at = Some(step);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(
        released_at.is_some(),
        "{dropped} was never released; status {:?}; events {:?}",
        status_cidrs(&sink, "mp"),
        sink.events("mp")
    );
    assert_eq!(
        sink.pending_write_faults(),
        0,
        "the operator wrote meanwhile"
    );
}

#[tokio::test(start_paused = true)]
async fn a_write_committed_behind_a_5xx_is_not_diffed_against_the_older_copy() {
    let w = Cluster::new();
    let sink = Arc::new(MemorySink::new());
    let (_core, tx, _task) = start(w.sim.clone(), &sink, config(4));
    let inst = w.instance();
    let n = sink.put(&agent_node(&w, "n", &inst.id, 8));
    tx.send(NodeInput::Upsert(Box::new(n))).await.unwrap();
    assert!(
        wait_until(|| served(&sink, "n", 8), Duration::from_secs(60)).await,
        "served"
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    let before = sink.total_writes();
    // The agent puts a pod on an address: the operator tops the node up and writes once
    // (status, then the pool's additions); the API server commits that but answers 504.
    let ip = sink
        .get("n")
        .unwrap()
        .spec
        .ipam
        .pool
        .keys()
        .next()
        .unwrap()
        .clone();
    let n = sink
        .update("n", |n| {
            n.status
                .get_or_insert_default()
                .ipam
                .used
                .insert(ip, AllocationIp::default());
        })
        .unwrap();
    sink.inject_write_fault(WriteFault::CommittedButFailed, 1);
    tx.send(NodeInput::Upsert(Box::new(n))).await.unwrap();
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(sink.pending_write_faults(), 0, "the operator wrote");
    let after = sink.total_writes();
    // Diffed against the older copy, the next pass would write the same patch again; a patch
    // computed that way can also drop from the status what the lost write added to the pool.
    assert_eq!(
        (after.spec, after.status),
        (before.spec + 1, before.status + 1),
        "one change set: {before:?} -> {after:?}"
    );
}

/// [`wait_until`] for a condition that needs the simulator (60 simulated seconds at most).
async fn wait_until_async<F: std::future::Future<Output = bool>>(
    mut cond: impl FnMut() -> F,
) -> bool {
    for _ in 0..240 {
        if cond().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    cond().await
}

/// `status.eni.enis` of a node: ENI ID -> subnet ID.
fn status_enis(sink: &MemorySink, name: &str) -> BTreeMap<String, String> {
    sink.get(name)
        .and_then(|n| n.status)
        .map(|s| {
            s.eni
                .enis
                .into_iter()
                .map(|(id, e)| (id, e.subnet.id))
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(start_paused = true)]
async fn a_subnet_filter_never_hides_a_nodes_primary_eni() {
    // The node subnet is outside --subnet-ids-filter (custom networking: pods in the pod
    // subnet). The primary ENI must still be published (C5) from the first pass on, and after
    // every full refresh; new ENIs go only to the pod subnet.
    let w = Cluster::new();
    let pod_subnet = w.sim.add_subnet(
        &w.vpc,
        "zone-a",
        "10.0.64.0/18".parse().unwrap(),
        Tags::new(),
    );
    let sink = Arc::new(MemorySink::new());
    let mut cfg = config(4);
    cfg.scope.subnet_ids = vec![pod_subnet.clone()];
    let ((_core, tx, _task), cache) = start_with_cache(w.sim.clone(), &sink, cfg);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let inst = w.instance();
    let primary = w.sim.primary_eni_id(&inst.id).unwrap();
    let n = sink.put(&agent_node(&w, "n", &inst.id, 8));
    tx.send(NodeInput::Upsert(Box::new(n))).await.unwrap();
    // Well before the next full refresh (60 s).
    assert!(wait_until(|| served(&sink, "n", 8), Duration::from_secs(20)).await);
    assert_eq!(operator_error(&sink, "n"), None);
    let enis = status_enis(&sink, "n");
    assert_eq!(enis.get(&primary), Some(&w.subnet), "primary ENI listed");
    assert!(
        enis.iter()
            .filter(|(id, _)| **id != primary)
            .all(|(_, subnet)| *subnet == pod_subnet),
        "new ENIs only in the filtered subnet: {enis:?}"
    );
    // Full refreshes come and go: the primary ENI stays known and listed.
    tokio::time::sleep(Duration::from_secs(130)).await;
    let after = status_enis(&sink, "n");
    assert_eq!(after, enis, "status unchanged by the full refreshes");
    assert_eq!(operator_error(&sink, "n"), None);
    let cache = cache.read().unwrap();
    let cached = &cache.instance(&inst.id).unwrap().enis;
    assert!(cached.iter().any(|e| e.id == primary), "{cached:?}");
}

#[tokio::test(start_paused = true)]
async fn the_ec2_cache_holds_only_the_managed_nodes_vpc_and_forgets_the_rest() {
    // No --vpc-id: the listing is scoped to the managed nodes' VPC once it is known (Cilium
    // #41392 lists the whole Region), and an instance that is neither managed nor listed any
    // more is forgotten.
    let w = Cluster::new();
    let other_vpc = w.sim.add_vpc("10.1.0.0/16".parse().unwrap(), &[]);
    let other_subnet = w.sim.add_subnet(
        &other_vpc,
        "zone-a",
        "10.1.0.0/18".parse().unwrap(),
        Tags::new(),
    );
    let other_sg = w.sim.add_security_group(&other_vpc, Tags::new());
    let elsewhere = w
        .sim
        .run_instance("m5.large", &other_subnet, std::slice::from_ref(&other_sg));
    let bystander = w.instance();
    let inst = w.instance();
    let sink = Arc::new(MemorySink::new());
    let ((_core, tx, _task), cache) = start_with_cache(w.sim.clone(), &sink, config(4));
    let n = sink.put(&agent_node(&w, "n", &inst.id, 4));
    tx.send(NodeInput::Upsert(Box::new(n))).await.unwrap();
    assert!(wait_until(|| served(&sink, "n", 4), Duration::from_secs(30)).await);
    w.sim.terminate_instance(&bystander.id);
    tokio::time::sleep(Duration::from_secs(130)).await;
    let cache = cache.read().unwrap();
    assert!(cache.instance(&inst.id).is_some(), "the managed node stays");
    assert!(
        cache.instance(&elsewhere.id).is_none(),
        "another VPC's instance is not listed any more"
    );
    assert!(
        cache.instance(&bystander.id).is_none(),
        "a terminated instance no node names is forgotten"
    );
    assert!(
        !cache.subnets.contains_key(&other_subnet),
        "subnets scoped to the VPC"
    );
}

#[tokio::test(start_paused = true)]
async fn late_node_events_for_unknown_nodes_leave_no_state() {
    let w = Cluster::new();
    let sink = Arc::new(MemorySink::new());
    let ((core, tx, _task), cache) = start_with_cache(w.sim.clone(), &sink, config(4));
    let inst = join(&w, &sink, &tx, "n", 4).await;
    assert!(wait_until(|| served(&sink, "n", 4), Duration::from_secs(30)).await);
    tx.send(NodeInput::Deleted("n".into())).await.unwrap();
    // Events that arrive after the CiliumNode is gone, or for Nodes without one.
    for input in [
        NodeInput::NodePresent {
            name: "n".into(),
            present: false,
        },
        NodeInput::PendingPods {
            name: "n".into(),
            count: 0,
        },
        NodeInput::NodePresent {
            name: "fargate-1".into(),
            present: true,
        },
        NodeInput::PendingPods {
            name: "pending-1".into(),
            count: 3,
        },
    ] {
        tx.send(input).await.unwrap();
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(core.demand("n").is_none(), "no slot for a deleted node");
    assert!(
        core.demand("fargate-1").is_none(),
        "no slot for a Node alone"
    );
    assert!(
        core.demand("pending-1").is_some(),
        "a pending count waits for its CiliumNode"
    );
    tx.send(NodeInput::PendingPods {
        name: "pending-1".into(),
        count: 0,
    })
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(core.demand("pending-1").is_none(), "and goes at zero");
    assert!(
        cache.read().unwrap().instance(&inst.id).is_none(),
        "the deleted node's instance is forgotten"
    );
}

#[tokio::test(start_paused = true)]
async fn nodes_whose_instances_lack_the_instance_tags_are_left_alone() {
    // --instance-tags-filter (Cilium: only instances with these tags are managed): a node on
    // an untagged instance gets no write and no EC2 change; one whose instance loses the tags
    // is let go with our finalizer, as an ignored node.
    let w = Cluster::new();
    let tags: Tags = [("team".to_string(), "blue".to_string())].into();
    let sink = Arc::new(MemorySink::new());
    let mut cfg = config(4);
    cfg.scope.instance_tags = tags.clone();
    let (_core, tx, _task) = start(w.sim.clone(), &sink, cfg);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let ours = w.instance();
    w.sim.set_instance_tags(&ours.id, tags.clone());
    let theirs = w.instance();
    for (name, inst) in [("ours", &ours.id), ("theirs", &theirs.id)] {
        let n = sink.put(&agent_node(&w, name, inst, 12));
        tx.send(NodeInput::Upsert(Box::new(n))).await.unwrap();
    }
    assert!(wait_until(|| served(&sink, "ours", 12), Duration::from_secs(30)).await);
    tokio::time::sleep(Duration::from_secs(130)).await;
    assert_eq!(sink.writes("theirs").total(), 0, "never written");
    assert_eq!(
        attached_enis(&w.sim, &theirs.id).await.len(),
        1,
        "no ENI added"
    );

    // The tags go: we let go of the node, finalizer included, and write nothing else.
    w.sim.set_instance_tags(&ours.id, Tags::new());
    let no_finalizer = || {
        sink.get("ours")
            .and_then(|n| n.metadata.finalizers)
            .is_none_or(|f| !f.contains(&FINALIZER.to_string()))
    };
    assert!(wait_until(no_finalizer, Duration::from_secs(130)).await);
    let writes = sink.writes("ours");
    tokio::time::sleep(Duration::from_secs(130)).await;
    assert_eq!(sink.writes("ours"), writes);
}

/// The elector against an in-memory Lease (moved from `src/runtime/leader.rs`: the Lease double
/// lives in testkit).
mod leader {
    use std::sync::Arc;
    use std::time::Duration;

    use eni_operator::runtime::leader::{Elector, LeaderConfig};
    use testkit::lease::{MemoryLease, MemoryLeaseClient};
    use tokio::time::Instant;

    fn elector(lease: &Arc<MemoryLease>, id: &str) -> Elector<MemoryLeaseClient> {
        Elector::new(
            MemoryLeaseClient {
                lease: lease.clone(),
                identity: id.into(),
            },
            LeaderConfig::new(id),
        )
    }

    #[tokio::test(start_paused = true)]
    async fn a_standby_waits_for_expiry_and_the_old_leader_stops_first() {
        let lease = Arc::new(MemoryLease::new());
        let mut a = elector(&lease, "a");
        let mut b = elector(&lease, "b");
        assert!(a.try_acquire_or_renew().await.unwrap());
        assert!(!b.try_acquire_or_renew().await.unwrap());
        let start = Instant::now();
        lease.partition("a", true);
        let lost = tokio::spawn(async move {
            a.hold().await;
            Instant::now()
        });
        b.acquire().await;
        let taken = Instant::now();
        let a_stopped = lost.await.unwrap();
        assert!(
            a_stopped < taken,
            "old leader must stop before the takeover"
        );
        assert!(a_stopped - start <= Duration::from_secs(10) + Duration::from_secs(2));
        assert!(taken - start >= Duration::from_secs(15));
        assert_eq!(lease.holder().as_deref(), Some("b"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_released_lease_is_taken_at_once() {
        let lease = Arc::new(MemoryLease::new());
        let mut a = elector(&lease, "a");
        let mut b = elector(&lease, "b");
        assert_eq!(a.run(async { 7 }).await, Ok(7));
        assert_eq!(lease.holder(), None);
        assert!(b.try_acquire_or_renew().await.unwrap());
    }
}

/// The refresher against the simulator (moved from `src/runtime/refresher.rs`).
mod refresher {
    use std::collections::BTreeSet;
    use std::sync::{Arc, RwLock};
    use std::time::Duration;

    use eni_operator::ec2::Tags;
    use eni_operator::runtime::cache::Ec2Cache;
    use eni_operator::runtime::refresher::{Refresher, Scope};
    use testkit::sim::Simulator;

    #[tokio::test(start_paused = true)]
    async fn without_a_vpc_id_the_filtered_subnets_name_the_vpc_to_list() {
        let sim = Simulator::new();
        let vpc = sim.add_vpc("10.0.0.0/16".parse().unwrap(), &[]);
        let nodes = sim.add_subnet(&vpc, "zone-a", "10.0.0.0/18".parse().unwrap(), Tags::new());
        let pods = sim.add_subnet(&vpc, "zone-a", "10.0.64.0/18".parse().unwrap(), Tags::new());
        let sg = sim.add_security_group(&vpc, Tags::new());
        let ours = sim.run_instance("m5.large", &nodes, std::slice::from_ref(&sg));
        let other_vpc = sim.add_vpc("10.1.0.0/16".parse().unwrap(), &[]);
        let far = sim.add_subnet(
            &other_vpc,
            "zone-a",
            "10.1.0.0/18".parse().unwrap(),
            Tags::new(),
        );
        let far_sg = sim.add_security_group(&other_vpc, Tags::new());
        let elsewhere = sim.run_instance("m5.large", &far, std::slice::from_ref(&far_sg));
        let cache = Arc::new(RwLock::new(Ec2Cache::new()));
        let scope = Scope {
            subnet_ids: vec![pods.clone()],
            ..Default::default()
        };
        let r = Refresher::new(Arc::new(sim), cache.clone(), scope, Duration::from_secs(15));
        r.full().await.unwrap();
        let c = cache.read().unwrap();
        assert!(c.instance(&ours.id).is_some(), "the VPC's instances listed");
        assert!(c.instance(&elsewhere.id).is_none(), "other VPCs not listed");
        // Every subnet of the VPC is known (the node subnet too); only the filtered one takes
        // new ENIs.
        assert_eq!(
            c.subnets.keys().cloned().collect::<BTreeSet<_>>(),
            BTreeSet::from([nodes, pods.clone()])
        );
        assert_eq!(c.pod_subnets, Some(BTreeSet::from([pods])));
    }
}

/// Event publishing into MemorySink (moved from `src/runtime/events.rs`).
mod events {
    use eni_operator::ipam::ProblemReason;
    use eni_operator::runtime::events::{EventReason, PROBLEMS_DOC, publish};
    use eni_operator::runtime::metrics::RuntimeMetrics;
    use eni_operator::runtime::sink::{NodeEvent, NodeRef};
    use testkit::sink::MemorySink;

    fn errors(m: &RuntimeMetrics, label: &str) -> u64 {
        m.errors
            .get_or_create(&vec![("reason", label.to_string())])
            .get()
    }

    #[tokio::test]
    async fn a_problem_is_a_warning_and_an_error_under_its_reason() {
        let (sink, m) = (MemorySink::new(), RuntimeMetrics::default());
        let r = NodeRef {
            name: "n1".into(),
            ..NodeRef::default()
        };
        let reason = EventReason::Problem(ProblemReason::AtCapacity);
        publish(&sink, &m, &r, reason, "full").await;
        publish(&sink, &m, &r, EventReason::IpsAllocated, "2").await;
        publish(&sink, &m, &r, EventReason::EC2_ERROR, "throttled").await;
        assert_eq!(
            sink.events("n1"),
            [
                // A problem's Event points at the runbook's table of reasons.
                NodeEvent::warning("AtCapacity", format!("full (what to do: {PROBLEMS_DOC})")),
                NodeEvent::normal("IpsAllocated", "2"),
                NodeEvent::warning(
                    "Ec2Error",
                    format!("throttled (what to do: {PROBLEMS_DOC})")
                ),
            ]
        );
        assert_eq!(errors(&m, "AtCapacity"), 1);
        assert_eq!(errors(&m, "Ec2Error"), 0, "counted under its code instead");
    }
}

/// The Node object of a running instance is deleted (`kubectl delete node`, a remediation
/// tool): its ENIs stay; when the Node and its CiliumNode come back they are served again with
/// the same ENIs; deleted again and never back, the ENIs go after the grace period, with an
/// Event. On the old main both ENIs went at once and the returning node got new ones.
#[tokio::test(start_paused = true)]
async fn a_deleted_node_of_a_running_instance_keeps_its_enis_until_the_grace_period() {
    let w = Cluster::new();
    let sink = Arc::new(MemorySink::new());
    let cfg = config(4);
    let grace = cfg.node_gone_grace;
    assert_eq!(grace, Duration::from_secs(600), "the documented default");
    let (_core, tx, _task) = start(w.sim.clone(), &sink, cfg);
    let inst = join(&w, &sink, &tx, "r", 8).await;
    let node = sink.put_node("r", &[]);
    tx.send(node_input(Event::Apply(node)).unwrap())
        .await
        .unwrap();
    assert!(wait_until(|| served(&sink, "r", 8), Duration::from_secs(60)).await);
    let ids = |v: Vec<(String, Vec<Ipv4Addr>, Vec<Ipv4Net>)>| {
        v.into_iter().map(|(id, _, _)| id).collect::<Vec<_>>()
    };
    let before = ids(our_enis(&w.sim, &inst.id).await);
    assert_eq!(before.len(), 1, "one ENI of ours");

    // The Node object goes while the instance runs; Kubernetes' garbage collector deletes the
    // CiliumNode it owns, our finalizer holds it.
    let delete_node = |sink: &MemorySink| {
        let event = sink.delete_node("r").expect("the Node exists");
        assert!(matches!(&event, Event::Delete(_)));
        let marked = sink.begin_delete("r").expect("held by our finalizer");
        (node_input(event).unwrap(), marked)
    };
    let (gone, marked) = delete_node(&sink);
    tx.send(gone).await.unwrap();
    tx.send(NodeInput::Upsert(Box::new(marked))).await.unwrap();
    tokio::time::sleep(Duration::from_secs(180)).await;
    assert_eq!(ids(our_enis(&w.sim, &inst.id).await), before, "kept");
    assert!(sink.raw("r").is_some(), "held while the instance runs");
    let reasons = |sink: &MemorySink| -> Vec<String> {
        sink.events("r").into_iter().map(|e| e.reason).collect()
    };
    assert!(
        reasons(&sink).iter().any(|r| r == "EnisKept"),
        "{:?}",
        reasons(&sink)
    );
    assert!(!reasons(&sink).iter().any(|r| r == "EnisReleased"));

    // The kubelet re-registers the Node: our finalizer goes, the agent writes a new
    // CiliumNode, and it is served with the ENI it has.
    let node = sink.put_node("r", &[]);
    tx.send(node_input(Event::Apply(node)).unwrap())
        .await
        .unwrap();
    assert!(wait_until(|| sink.raw("r").is_none(), Duration::from_secs(120)).await);
    let n = sink.put(&agent_node(&w, "r", &inst.id, 8));
    tx.send(NodeInput::Upsert(Box::new(n))).await.unwrap();
    assert!(wait_until(|| served(&sink, "r", 8), Duration::from_secs(120)).await);
    assert_eq!(ids(our_enis(&w.sim, &inst.id).await), before, "re-adopted");

    // Gone again for good, the instance still running: released after the grace period.
    let (gone, marked) = delete_node(&sink);
    tx.send(gone).await.unwrap();
    tx.send(NodeInput::Upsert(Box::new(marked))).await.unwrap();
    tokio::time::sleep(grace - Duration::from_secs(30)).await;
    assert_eq!(
        ids(our_enis(&w.sim, &inst.id).await),
        before,
        "within the grace"
    );
    assert!(wait_until(|| sink.raw("r").is_none(), Duration::from_secs(120)).await);
    assert_eq!(
        our_enis(&w.sim, &inst.id).await,
        vec![],
        "released after the grace"
    );
    assert!(our_available_enis(&w.sim).await.is_empty(), "and deleted");
}

/// Two clusters in one account, both keeping the default `--cluster-name`, in their own VPCs:
/// each one's GC deletes its own leftover and never the other's (an ENI waiting for its
/// attach, or mid-finalizer). On the old main the GC listed the whole region by the cluster tag
/// alone and deleted both.
#[tokio::test(start_paused = true)]
async fn two_clusters_with_the_default_name_never_collect_each_others_enis() {
    let a = Cluster::new();
    let vpc_b = a.sim.add_vpc("10.1.0.0/16".parse().unwrap(), &[]);
    let subnet_b = a.sim.add_subnet(
        &vpc_b,
        "zone-a",
        "10.1.0.0/18".parse().unwrap(),
        Tags::new(),
    );
    let sg_b = a.sim.add_security_group(&vpc_b, Tags::new());
    let leftover = |subnet: &str, sg: &str, instance: &str| CreateEniRequest {
        subnet_id: subnet.into(),
        security_groups: vec![sg.into()],
        description: "a leftover waiting for its attach".into(),
        tags: ownership_tags("default", instance),
        addresses: AddressRequest::Ips(0),
        client_token: String::new(),
    };
    let eni_a = a
        .sim
        .create_network_interface(&leftover(&a.subnet, &a.sg, "i-a"))
        .await
        .unwrap();
    let eni_b = a
        .sim
        .create_network_interface(&leftover(&subnet_b, &sg_b, "i-b"))
        .await
        .unwrap();
    let mut gc_a = EniGc::new("default", 25).with_vpcs([a.vpc.clone()]);
    gc_a.run_once(&a.sim, &[]).await.unwrap();
    let report = gc_a.run_once(&a.sim, &[]).await.unwrap();
    assert_eq!(report.deleted, vec![eni_a.id.clone()]);
    assert!(
        a.sim.network_interface(&eni_b.id).is_some(),
        "the other cluster's ENI is not ours to collect"
    );
    // A GC that knows no managed VPC yet lists nothing (never the region).
    let mut blind = EniGc::new("default", 25);
    blind.run_once(&a.sim, &[]).await.unwrap();
    assert!(
        blind
            .run_once(&a.sim, &[])
            .await
            .unwrap()
            .deleted
            .is_empty()
    );
    assert!(a.sim.network_interface(&eni_b.id).is_some());
}

/// Token generations restart at 0 with a new process: after k refused attaches (each ENI
/// deleted, its token spent), a restarted operator replayed the k spent tokens one by one
/// (EC2 answers each with its deleted ENI: a not-ready wait and a failed pass apiece). With a
/// per-process nonce in the token it never replays one: one create after the restart.
#[tokio::test(start_paused = true)]
async fn a_restart_after_refused_attaches_replays_no_spent_token() {
    const REFUSED: u64 = 3;
    let w = Cluster::new();
    w.sim.set_fault_rate(
        Operation::AttachNetworkInterface,
        1.0,
        testkit::sim::Fault::new("InvalidParameterValue", "refused (injected)", 400),
    );
    let sink = Arc::new(MemorySink::new());
    let (_core, tx, task) = start(w.sim.clone(), &sink, config(4));
    let inst = join(&w, &sink, &tx, "n", 8).await;
    let sim = w.sim.clone();
    assert!(
        wait_until(
            || sim.stats().get(Operation::DeleteNetworkInterface).ok >= REFUSED,
            Duration::from_secs(300)
        )
        .await
    );
    task.abort();
    let _ = task.await;
    let before = create_calls(&w.sim);
    assert!(before >= REFUSED, "{before} creates before the restart");
    w.sim
        .set_fault_rate(Operation::AttachNetworkInterface, 0.0, throttled());
    let (_core, tx, _task) = start(w.sim.clone(), &sink, config(4));
    tx.send(NodeInput::Upsert(Box::new(sink.get("n").unwrap())))
        .await
        .unwrap();
    assert!(
        wait_until(|| served(&sink, "n", 8), Duration::from_secs(300)).await,
        "served: {:?}",
        operator_error(&sink, "n")
    );
    assert_eq!(
        create_calls(&w.sim) - before,
        1,
        "one create after the restart, no spent token replayed"
    );
    assert_eq!(our_attached(&w.sim, &inst.id).await.len(), 1);
    assert!(our_available_enis(&w.sim).await.is_empty());
}

/// C8: the versioned `release-ips` write is based on the version the operator observed. An
/// agent write after that observation made no conflict when a pool removal went first in the
/// same pass: the removal (unversioned) landed on the agent's version and the handshake write
/// carried the version that removal returned.
#[tokio::test(start_paused = true)]
async fn an_agent_write_before_a_release_proposal_makes_it_conflict_even_after_a_pool_removal() {
    use eni_operator::ipam::{DesiredState, changes};
    use eni_operator::runtime::sink::{NodeRef, NodeSink, SinkError};

    let sink = MemorySink::new();
    let mut n = CiliumNode::new("n", Default::default());
    for ip in ["10.0.0.5", "10.0.0.6", "10.0.0.7"] {
        n.spec.ipam.pool.insert(
            ip.into(),
            AllocationIp {
                resource: "eni-1".into(),
                ..Default::default()
            },
        );
    }
    let observed = sink.put(&n);
    // What the operator wants: 10.0.0.7 out of the pool, 10.0.0.6 proposed for release.
    let mut pool = observed.spec.ipam.pool.clone();
    pool.remove("10.0.0.7");
    let desired = DesiredState {
        enis: None,
        pool: Some(pool),
        release_ips: [("10.0.0.6".to_string(), Some("marked".to_string()))].into(),
        operator_error: None,
        summary: Default::default(),
        demand: None,
    };
    let set = changes(&observed, &desired);
    assert_eq!(set.writes.len(), 2, "{set:?}");
    // The agent writes after the operator's observation (its status, say).
    sink.update("n", |n| n.spec.ipam.pre_allocate = 9).unwrap();
    let r = sink.apply(&NodeRef::of(&observed), &set).await;
    assert!(matches!(r, Err(SinkError::Conflict(_))), "{r:?}");
    let after = sink.get("n").unwrap();
    assert!(
        after
            .status
            .as_ref()
            .is_none_or(|s| s.ipam.release_ips.is_empty()),
        "no proposal over an unseen agent write: {:?}",
        after.status
    );
    assert_eq!(
        after.spec.ipam.pool.len(),
        3,
        "the whole pass recomputes against the agent's version"
    );
}

/// A burst is served breadth first: a node that just got its first ENI goes back into the queue
/// with what it still lacks *after* that ENI, behind nodes that have no address at all. With the
/// demand from before the action, it went back at its whole deficit and got all its ENIs before
/// the next node got one (seen in the real-process benchmark: node-0 had three ENIs before
/// node-999 had its first, docs/benchmarks.md).
#[tokio::test(start_paused = true)]
async fn a_burst_gives_every_node_its_first_eni_before_any_node_its_second() {
    const NODES: usize = 5;
    const WANT: i64 = 16; // two ENIs of an m5.large
    let w = Cluster::new();
    w.sim.set_latency(
        Operation::CreateNetworkInterface,
        Duration::from_millis(300),
    );
    let sink = Arc::new(MemorySink::new());
    // One worker: the queue's order is the order of service.
    let (_core, tx, _task) = start(w.sim.clone(), &sink, config(1));
    let mut instances = Vec::new();
    for i in 0..NODES {
        instances.push(join(&w, &sink, &tx, &format!("node-{i}"), WANT).await.id);
    }
    let names: Vec<String> = (0..NODES).map(|i| format!("node-{i}")).collect();
    assert!(
        wait_until(
            || names.iter().all(|n| served(&sink, n, WANT as usize)),
            Duration::from_secs(300)
        )
        .await
    );
    // ENI IDs are handed out in creation order.
    let mut enis: Vec<_> = w
        .sim
        .network_interfaces()
        .into_iter()
        .filter(|e| {
            e.tags
                .contains_key(eni_operator::ipam::ownership::CLUSTER_TAG)
        })
        .collect();
    enis.sort_by(|a, b| a.id.cmp(&b.id));
    let order: Vec<String> = enis
        .iter()
        .filter_map(|e| e.instance_id().map(str::to_string))
        .collect();
    assert_eq!(order.len(), 2 * NODES, "{order:?}");
    let first: BTreeSet<&String> = order[..NODES].iter().collect();
    assert_eq!(
        first.len(),
        NODES,
        "every node's first ENI comes before any node's second: {order:?}"
    );
}
