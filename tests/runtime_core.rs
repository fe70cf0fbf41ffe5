//! The allocation core without Kubernetes: the simulator behind the gate, a `MemorySink` as the
//! API server, paused tokio time.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use eni_operator::crd::{AllocationIp, CiliumNode, FINALIZER, ReleaseState};
use eni_operator::ec2::gate::{Gate, GateConfig};
use eni_operator::ec2::sim::Simulator;
use eni_operator::ec2::{
    AddressRequest, Assigned, CreateEniRequest, Ec2, EniFilter, EniState, InstanceFilter,
    InstanceTypeLimits, NetworkInterface, Operation, Page, ResourceFilter, Result, RouteTable,
    SecurityGroup, Subnet, Tags, Vpc, collect_pages,
};
use eni_operator::ipam::IpamConfig;
use eni_operator::ipam::ownership::ownership_tags;
use eni_operator::runtime::core::{Core, CoreConfig, NodeInput};
use eni_operator::runtime::gc::EniGc;
use eni_operator::runtime::leader::{
    Elector, LeaderConfig, LeadershipLost, MemoryLease, MemoryLeaseClient,
};
use eni_operator::runtime::metrics::RuntimeMetrics;
use eni_operator::runtime::sink::{MemorySink, NodeRef};
use eni_operator::runtime::source::parse_node;
use ipnet::Ipv4Net;
use tokio::sync::mpsc;

const CLUSTER: &str = "test-cluster";

struct World {
    sim: Simulator,
    vpc: String,
    subnet: String,
    sg: String,
}

fn world() -> World {
    let sim = Simulator::new();
    let vpc = sim.add_vpc("10.0.0.0/16".parse().unwrap(), &[]);
    let subnet = sim.add_subnet(&vpc, "zone-a", "10.0.0.0/18".parse().unwrap(), Tags::new());
    let sg = sim.add_security_group(&vpc, Tags::new());
    sim.add_route_table(&vpc, true, &[]);
    World {
        sim,
        vpc,
        subnet,
        sg,
    }
}

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

/// A CiliumNode as a classic agent writes it at start (no pool yet).
fn agent_node(w: &World, name: &str, instance: &str, min_allocate: i64) -> CiliumNode {
    let mut n = CiliumNode::new(name, Default::default());
    n.spec.instance_id = instance.into();
    n.spec.eni.instance_type = "m5.large".into();
    n.spec.eni.vpc_id = w.vpc.clone();
    n.spec.eni.availability_zone = "zone-a".into();
    n.spec.eni.node_subnet_id = w.subnet.clone();
    n.spec.eni.first_interface_index = Some(1);
    n.spec.ipam.min_allocate = min_allocate;
    n
}

fn start<E: Ec2>(
    ec2: E,
    sink: &Arc<MemorySink>,
    cfg: CoreConfig,
) -> (
    Core<E, MemorySink>,
    mpsc::Sender<NodeInput>,
    tokio::task::JoinHandle<Result<()>>,
) {
    let core = Core::new(Arc::new(ec2), sink.clone(), cfg, RuntimeMetrics::default());
    let (tx, rx) = mpsc::channel(4096);
    let task = tokio::spawn(core.clone().run(rx, std::future::pending()));
    (core, tx, task)
}

/// C2 + demand: every pool address is listed on its ENI in status, and the pool is big enough.
fn served(sink: &MemorySink, name: &str, want: usize) -> bool {
    let Some(n) = sink.get(name) else {
        return false;
    };
    let enis = n
        .status
        .as_ref()
        .map(|s| s.eni.enis.clone())
        .unwrap_or_default();
    n.spec.ipam.pool.len() >= want
        && n.spec.ipam.pool.iter().all(|(ip, a)| {
            enis.get(&a.resource)
                .is_some_and(|e| e.addresses.iter().any(|x| x == ip))
        })
}

async fn wait_until(mut cond: impl FnMut() -> bool, limit: Duration) -> bool {
    let step = Duration::from_millis(250);
    let mut waited = Duration::ZERO;
    while waited < limit {
        if cond() {
            return true;
        }
        tokio::time::sleep(step).await;
        waited += step;
    }
    cond()
}

fn operator_error(sink: &MemorySink, name: &str) -> Option<String> {
    sink.get(name)?.status?.ipam.operator_status.error
}

#[tokio::test(start_paused = true)]
async fn a_burst_of_nodes_all_reach_their_demand() {
    const NODES: usize = 50;
    const WANT: i64 = 16; // more than one ENI of an m5.large holds: every node gets a new ENI
    let w = world();
    let sink = Arc::new(MemorySink::new());
    let gate = Gate::new(w.sim.clone(), GateConfig::aws_defaults());
    let (core, tx, _task) = start(gate, &sink, config(50));
    let mut names = Vec::new();
    for i in 0..NODES {
        let inst = w
            .sim
            .run_instance("m5.large", &w.subnet, std::slice::from_ref(&w.sg));
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

#[tokio::test(start_paused = true)]
async fn a_node_with_a_bad_spec_gets_an_error_and_the_rest_proceed() {
    let w = world();
    let sink = Arc::new(MemorySink::new());
    let (_core, tx, _task) = start(w.sim.clone(), &sink, config(4));
    // Malformed: a string where a number belongs. The source reports it per object.
    let inst = w
        .sim
        .run_instance("m5.large", &w.subnet, std::slice::from_ref(&w.sg));
    let bad = sink.put(&agent_node(&w, "bad", &inst.id, 4));
    let mut raw = serde_json::to_value(&bad).unwrap();
    raw["spec"]["ipam"]["pre-allocate"] = serde_json::json!("lots");
    let err = parse_node(raw).expect_err("does not parse");
    tx.send(NodeInput::Invalid {
        node: NodeRef::of(&bad),
        error: err,
    })
    .await
    .unwrap();
    // Parses, but no instance ID: the engine refuses it.
    let noid = sink.put(&agent_node(&w, "noid", "", 4));
    tx.send(NodeInput::Upsert(Box::new(noid))).await.unwrap();
    let mut good = Vec::new();
    for i in 0..5 {
        let inst = w
            .sim
            .run_instance("m5.large", &w.subnet, std::slice::from_ref(&w.sg));
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
    let w = world();
    w.sim
        .set_latency(Operation::AttachNetworkInterface, Duration::from_secs(30));
    let sink = Arc::new(MemorySink::new());
    let (_core, tx, task) = start(w.sim.clone(), &sink, config(4));
    let inst = w
        .sim
        .run_instance("m5.large", &w.subnet, std::slice::from_ref(&w.sg));
    let n = sink.put(&agent_node(&w, "n", &inst.id, 16));
    tx.send(NodeInput::Upsert(Box::new(n))).await.unwrap();
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

    let mut gc = EniGc::new(CLUSTER, 25);
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
}

#[tokio::test(start_paused = true)]
async fn two_cores_racing_for_one_lease_never_both_mutate() {
    let w = world();
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
        let core = Core::new(
            Arc::new(ec2),
            sink.clone(),
            config(8),
            RuntimeMetrics::default(),
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
        let inst = w
            .sim
            .run_instance("m5.large", &w.subnet, std::slice::from_ref(&w.sg));
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
    let w = world();
    w.sim.set_detach_delay(Duration::from_secs(3));
    let sink = Arc::new(MemorySink::new());
    let (_core, tx, _task) = start(w.sim.clone(), &sink, config(4));
    let gone = w
        .sim
        .run_instance("m5.large", &w.subnet, std::slice::from_ref(&w.sg));
    let kept = w
        .sim
        .run_instance("m5.large", &w.subnet, std::slice::from_ref(&w.sg));
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

    // The Node "gone" is deleted: the operator deletes the CiliumNode and releases our ENI.
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

/// A classic agent's answer to the operator's release proposals (pkg/ipam/crd.go).
fn classic_agent_answers(n: &mut CiliumNode) {
    let pool = n.spec.ipam.pool.clone();
    let status = n.status.get_or_insert_with(Default::default);
    let used = status.ipam.used.clone();
    let mut answers = BTreeMap::new();
    for (ip, state) in &status.ipam.release_ips {
        match ReleaseState::parse(state) {
            Some(ReleaseState::MarkedForRelease) => {
                let answer = if pool.contains_key(ip) && !used.contains_key(ip) {
                    ReleaseState::ReadyForRelease
                } else {
                    ReleaseState::DoNotRelease
                };
                answers.insert(ip.clone(), Some(answer.as_str().to_string()));
            }
            Some(ReleaseState::Released) if !pool.contains_key(ip) => {
                answers.insert(ip.clone(), None);
            }
            _ => {}
        }
    }
    for (ip, a) in answers {
        match a {
            Some(s) => status.ipam.release_ips.insert(ip, s),
            None => status.ipam.release_ips.remove(&ip),
        };
    }
}

#[tokio::test(start_paused = true)]
async fn release_handshake_with_a_classic_agent() {
    let w = world();
    let sink = Arc::new(MemorySink::new());
    let mut cfg = config(4);
    cfg.ipam.release_excess_ips = true;
    cfg.ipam.release_delay = Duration::from_secs(10);
    cfg.resync_interval = Duration::from_secs(5);
    let (_core, tx, _task) = start(w.sim.clone(), &sink, cfg);
    let inst = w
        .sim
        .run_instance("m5.large", &w.subnet, std::slice::from_ref(&w.sg));
    let n = sink.put(&agent_node(&w, "n", &inst.id, 16));
    tx.send(NodeInput::Upsert(Box::new(n))).await.unwrap();
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
    let w = world();
    let sink = Arc::new(MemorySink::new());
    let (_core, tx, _task) = start(w.sim.clone(), &sink, config(4));
    let inst = w
        .sim
        .run_instance("m5.large", &w.subnet, std::slice::from_ref(&w.sg));
    let n = sink.put(&agent_node(&w, "n", &inst.id, 4));
    tx.send(NodeInput::Upsert(Box::new(n))).await.unwrap();
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
    let w = world();
    let sink = Arc::new(MemorySink::new());
    let (_core, tx, _task) = start(w.sim.clone(), &sink, config(4));
    let inst = w
        .sim
        .run_instance("m5.large", &w.subnet, std::slice::from_ref(&w.sg));
    let n = sink.put(&agent_node(&w, "n", &inst.id, 4));
    tx.send(NodeInput::Upsert(Box::new(n))).await.unwrap();
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
    let w = world();
    let sink = Arc::new(MemorySink::new());
    let (_core, tx, _task) = start(w.sim.clone(), &sink, config(4));
    let inst = w
        .sim
        .run_instance("m5.large", &w.subnet, std::slice::from_ref(&w.sg));
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
    let w = world();
    let pod_subnet = w.sim.add_subnet(
        &w.vpc,
        "zone-a",
        "10.0.64.0/18".parse().unwrap(),
        Tags::new(),
    );
    let sink = Arc::new(MemorySink::new());
    let mut cfg = config(4);
    cfg.scope.subnet_ids = vec![pod_subnet.clone()];
    let (_core, tx, _task) = start(w.sim.clone(), &sink, cfg);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let inst = w
        .sim
        .run_instance("m5.large", &w.subnet, std::slice::from_ref(&w.sg));
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
    let cache = _core.cache().read().unwrap();
    let cached = &cache.instance(&inst.id).unwrap().enis;
    assert!(cached.iter().any(|e| e.id == primary), "{cached:?}");
}

#[tokio::test(start_paused = true)]
async fn the_ec2_cache_holds_only_the_managed_nodes_vpc_and_forgets_the_rest() {
    // No --vpc-id: the listing is scoped to the managed nodes' VPC once it is known (Cilium
    // #41392 lists the whole Region), and an instance that is neither managed nor listed any
    // more is forgotten.
    let w = world();
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
    let bystander = w
        .sim
        .run_instance("m5.large", &w.subnet, std::slice::from_ref(&w.sg));
    let inst = w
        .sim
        .run_instance("m5.large", &w.subnet, std::slice::from_ref(&w.sg));
    let sink = Arc::new(MemorySink::new());
    let (core, tx, _task) = start(w.sim.clone(), &sink, config(4));
    let n = sink.put(&agent_node(&w, "n", &inst.id, 4));
    tx.send(NodeInput::Upsert(Box::new(n))).await.unwrap();
    assert!(wait_until(|| served(&sink, "n", 4), Duration::from_secs(30)).await);
    w.sim.terminate_instance(&bystander.id);
    tokio::time::sleep(Duration::from_secs(130)).await;
    let cache = core.cache().read().unwrap();
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
    let w = world();
    let sink = Arc::new(MemorySink::new());
    let (core, tx, _task) = start(w.sim.clone(), &sink, config(4));
    let inst = w
        .sim
        .run_instance("m5.large", &w.subnet, std::slice::from_ref(&w.sg));
    let n = sink.put(&agent_node(&w, "n", &inst.id, 4));
    tx.send(NodeInput::Upsert(Box::new(n))).await.unwrap();
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
        core.cache().read().unwrap().instance(&inst.id).is_none(),
        "the deleted node's instance is forgotten"
    );
}

#[tokio::test(start_paused = true)]
async fn nodes_whose_instances_lack_the_instance_tags_are_left_alone() {
    // --instance-tags-filter (Cilium: only instances with these tags are managed): a node on
    // an untagged instance gets no write and no EC2 change; one whose instance loses the tags
    // is let go with our finalizer, as an ignored node.
    let w = world();
    let tags: Tags = [("team".to_string(), "blue".to_string())].into();
    let sink = Arc::new(MemorySink::new());
    let mut cfg = config(4);
    cfg.scope.instance_tags = tags.clone();
    let (_core, tx, _task) = start(w.sim.clone(), &sink, cfg);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let ours = w
        .sim
        .run_instance("m5.large", &w.subnet, std::slice::from_ref(&w.sg));
    w.sim.set_instance_tags(&ours.id, tags.clone());
    let theirs = w
        .sim
        .run_instance("m5.large", &w.subnet, std::slice::from_ref(&w.sg));
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
