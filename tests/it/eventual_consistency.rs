//! The core against an eventually consistent EC2 (the simulator's `set_eventual_consistency`):
//! AWS documents that a call naming a resource just created may answer that it does not exist,
//! and that describes lag behind changes ("Eventual consistency in the Amazon EC2 API").

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Duration;

use crate::support::{cache_with, cached_ips};
use eni_operator::crd::CiliumNode;
use eni_operator::ec2::{
    AddressRequest, Ec2, EniFilter, EniState, NetworkInterface, Operation, Tags,
};
use eni_operator::event_loop::core::{Core, CoreConfig, NodeInput};
use eni_operator::ipam::{Action, Assign, IpamConfig, Release};
use eni_operator::reconcile::executor::Executor;
use eni_operator::reconcile::metrics::RuntimeMetrics;
use testkit::every_page;
use testkit::running;
use testkit::sim::Simulator;
use testkit::sink::MemorySink;
use tokio::sync::mpsc;

const CLUSTER: &str = "test-cluster";

/// One account: a VPC with a /18 in zone-a, a security group, a route table, and an m5.large
/// instance there. Returns the VPC, the subnet and the instance id.
fn account(sim: &Simulator) -> (String, String, String) {
    let vpc = sim.add_vpc("10.0.0.0/16".parse().unwrap(), &[]);
    let subnet = sim.add_subnet(&vpc, "zone-a", "10.0.0.0/18".parse().unwrap(), Tags::new());
    let sg = sim.add_security_group(&vpc, Tags::new());
    sim.add_route_table(&vpc, true, &[]);
    let inst = sim.run_instance("m5.large", &subnet, std::slice::from_ref(&sg));
    (vpc, subnet, inst.id)
}

/// The core as production configures it from `--cluster-name` alone, on a cluster without
/// Cilium's operator (`--cilium-operator-absent`: the handover guard would otherwise wait for its
/// Lease, which no test here has).
fn production_config() -> CoreConfig {
    eni_operator::config::Settings::load_from([
        "eni-operator",
        "--cluster-name",
        CLUSTER,
        "--cilium-operator-absent",
    ])
    .unwrap()
    .core_config()
}

/// What production requires before serving a node (issue 29 item 1): the instance carries the
/// cluster's tag, and the Node of that name names the instance; then the Node watch's listing
/// is complete.
async fn as_in_production(sim: &Simulator, tx: &mpsc::Sender<NodeInput>, nodes: &[(&str, &str)]) {
    for (name, instance) in nodes {
        sim.set_instance_tags(
            instance,
            Tags::from([(
                format!("kubernetes.io/cluster/{CLUSTER}"),
                "owned".to_string(),
            )]),
        );
        let facts = eni_operator::k8s::input::NodeFacts {
            instance: Some(instance.to_string()),
            internal_ips: Vec::new(),
        };
        tx.send(NodeInput::NodeFacts {
            name: name.to_string(),
            facts: Some(facts),
        })
        .await
        .unwrap();
    }
    tx.send(NodeInput::NodesListed).await.unwrap();
}

/// A core with two workers on `sim` and the agent's CiliumNode for the instance, `edit`ed, sent
/// to it. Keep the sender: the core ends when its input closes.
async fn serve(
    sim: &Simulator,
    account: &(String, String, String),
    edit: impl FnOnce(&mut CiliumNode),
) -> (
    Arc<MemorySink>,
    mpsc::Sender<NodeInput>,
    tokio::task::JoinHandle<eni_operator::ec2::Result<()>>,
) {
    let cfg = CoreConfig {
        workers: 2,
        ipam: IpamConfig {
            cluster_name: CLUSTER.into(),
            ..IpamConfig::default()
        },
        ..CoreConfig::default()
    };
    serve_with(sim, account, cfg, edit).await
}

/// [`serve`] with the core configured by `cfg`.
async fn serve_with(
    sim: &Simulator,
    (vpc, subnet, instance): &(String, String, String),
    cfg: CoreConfig,
    edit: impl FnOnce(&mut CiliumNode),
) -> (
    Arc<MemorySink>,
    mpsc::Sender<NodeInput>,
    tokio::task::JoinHandle<eni_operator::ec2::Result<()>>,
) {
    let sink = Arc::new(MemorySink::new());
    let running::Running { tx, task, .. } =
        running::start(sim.clone(), sink.clone(), cfg, RuntimeMetrics::default());
    let mut n = CiliumNode::new("n", Default::default());
    n.spec.instance_id = instance.clone();
    n.spec.eni.instance_type = "m5.large".into();
    n.spec.eni.vpc_id = vpc.clone();
    n.spec.eni.availability_zone = "zone-a".into();
    n.spec.eni.node_subnet_id = subnet.clone();
    edit(&mut n);
    let n = sink.put(&n);
    tx.send(NodeInput::Upsert(Box::new(n))).await.unwrap();
    (sink, tx, task)
}

#[tokio::test(start_paused = true)]
async fn an_eni_ec2_does_not_show_yet_after_its_create_is_attached_not_created_again() {
    let sim = Simulator::new();
    let account = account(&sim);
    // Every new ENI stays unknown to the other calls for up to 6 s.
    sim.set_eventual_consistency(Duration::from_secs(6), true, 1);
    let (sink, _tx, _task) = serve(&sim, &account, |n| {
        n.spec.eni.first_interface_index = Some(1);
        n.spec.ipam.min_allocate = 8;
    })
    .await;

    let mut served = false;
    for _ in 0..240 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        if sink.get("n").is_some_and(|n| n.spec.ipam.pool.len() >= 8) {
            served = true;
            break;
        }
    }
    let attach = sim.stats().get(Operation::AttachNetworkInterface);
    assert!(
        attach.rejected >= 1,
        "EC2 answered the first attach with NotFound: {attach:?}"
    );
    assert!(served, "{:?}", sink.get("n").and_then(|n| n.status));
    let creates = sim.stats().get(Operation::CreateNetworkInterface).calls;
    assert_eq!(creates, 1, "the ENI was waited for, not created again");
    tokio::time::sleep(Duration::from_secs(10)).await;
    let f = EniFilter::default();
    let all = every_page(|t| sim.describe_network_interfaces(&f, t)).await;
    let available: Vec<_> = all
        .iter()
        .filter(|e| e.state == EniState::Available)
        .map(|e| e.id.clone())
        .collect();
    assert!(available.is_empty(), "left available: {available:?}");
}

/// The previous operator's last call, on an account whose describes lag 6 s: of four addresses
/// on the instance's primary ENI, one unassigned; EC2 gives it to another instance at once
/// (lowest free address first: its primary). Returns the account, the ENI, the four addresses
/// and the one unassigned.
async fn unassigned_just_before(
    sim: &Simulator,
) -> ((String, String, String), String, Vec<Ipv4Addr>, Ipv4Addr) {
    let account = account(sim);
    let primary = sim.primary_eni_id(&account.2).unwrap();
    let assigned = sim
        .assign_private_ip_addresses(&primary, eni_operator::ec2::AddressRequest::Ips(4))
        .await
        .unwrap();
    sim.set_eventual_consistency(Duration::from_secs(6), false, 4);
    let gone = assigned.ips[0];
    sim.unassign_private_ip_addresses(&primary, &[gone], &[])
        .await
        .unwrap();
    let other = sim.run_instance("m5.large", &account.1, &[]);
    let other = sim
        .network_interface(&sim.primary_eni_id(&other.id).unwrap())
        .unwrap();
    assert_eq!(
        other.primary_ip, gone,
        "EC2 gave the address to another instance"
    );
    (account, primary, assigned.ips, gone)
}

/// Put `ips` in the node's pool, on `eni`.
fn pool_on(n: &mut CiliumNode, eni: &str, ips: &[Ipv4Addr]) {
    for ip in ips {
        n.spec.ipam.pool.insert(
            ip.to_string(),
            eni_operator::crd::AllocationIp {
                resource: eni.to_string(),
                ..Default::default()
            },
        );
    }
}

/// A new operator (restart after a crash, or a new leader) starts while describes still show an
/// address the previous one unassigned a moment ago (and wrote its pool without). It acts at
/// once (§14: no waiting for describes to catch up) but holds the address back (§14.1): it never
/// goes back into the pool while EC2 no longer has it (`make dst` seed 25).
#[tokio::test(start_paused = true)]
async fn a_restarted_operator_acts_at_once_and_does_not_pool_an_address_unassigned_just_before() {
    let sim = Simulator::new();
    // Its pool written without the address.
    let (account, primary, assigned, gone) = unassigned_just_before(&sim).await;
    let f = EniFilter::default();
    let shown = every_page(|t| sim.describe_network_interfaces(&f, t)).await;
    assert!(
        shown
            .iter()
            .any(|e| e.id == primary && e.secondary_ips.contains(&gone)),
        "describes still show the unassigned address"
    );
    sim.record_calls();
    let started = tokio::time::Instant::now();
    let kept = assigned[1..].to_vec();
    let (sink, _tx, _task) = serve(&sim, &account, |n| {
        n.spec.eni.first_interface_index = Some(0);
        // Three addresses pooled, five wanted: the new operator must assign at once.
        n.spec.ipam.pre_allocate = 5;
        pool_on(n, &primary, &kept);
    })
    .await;

    let mut pooled = 0;
    let mut served_after = None;
    for _ in 0..360 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let pool = sink.get("n").map(|n| n.spec.ipam.pool).unwrap_or_default();
        // What EC2 really has on the ENI now (not what a lagging describe shows).
        let held = sim.network_interface(&primary).unwrap().secondary_ips;
        let ghost: Vec<_> = pool
            .keys()
            .filter(|a| !held.iter().any(|h| h.to_string() == **a))
            .collect();
        assert!(
            ghost.is_empty(),
            "{ghost:?} pooled while EC2 no longer has them"
        );
        pooled = pool.len();
        if pooled >= 5 && served_after.is_none() {
            served_after = Some(tokio::time::Instant::now() - started);
        }
    }
    assert!(pooled >= 5, "the node was served: pool {pooled}");
    first_mutation_within_5s(&sim, started);
    assert!(
        served_after.is_some_and(|d| d <= Duration::from_secs(5)),
        "served after {served_after:?}"
    );
}

/// As above, but the previous operator crashed between its unassign and its pool write: the
/// address is still in the pool, the agent had given it up (`ready-for-release`), and the node
/// now wants more addresses than it holds. The new operator must not hand the address back to
/// the agent (drop its release entry while the pool lists it) on a describe that lags behind
/// the unassign: a pod would get an address EC2 has given to another instance (`make dst`
/// seed 220, §14.1).
#[tokio::test(start_paused = true)]
async fn a_restarted_operator_does_not_hand_back_an_acknowledged_address_unassigned_just_before() {
    let sim = Simulator::new();
    let (account, primary, assigned, gone) = unassigned_just_before(&sim).await;
    let cfg = CoreConfig {
        workers: 2,
        ipam: IpamConfig {
            cluster_name: CLUSTER.into(),
            release_excess_ips: true,
            ..IpamConfig::default()
        },
        ..CoreConfig::default()
    };
    let (sink, _tx, _task) = serve_with(&sim, &account, cfg, |n| {
        n.spec.eni.first_interface_index = Some(0);
        // Four pooled, six wanted: no excess any more, so a release not yet done is withdrawn.
        n.spec.ipam.pre_allocate = 6;
        pool_on(n, &primary, &assigned);
        let status = n.status.get_or_insert_with(Default::default);
        status
            .ipam
            .release_ips
            .insert(gone.to_string(), "ready-for-release".into());
    })
    .await;

    for _ in 0..240 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let Some(n) = sink.get("n") else { continue };
        let held = sim.network_interface(&primary).unwrap().secondary_ips;
        let release = n.status.map(|s| s.ipam.release_ips).unwrap_or_default();
        for ip in n.spec.ipam.pool.keys() {
            if held.iter().any(|h| h.to_string() == *ip) {
                continue;
            }
            let state = release.get(ip).map(String::as_str);
            assert!(
                matches!(state, Some("ready-for-release" | "released")),
                "{ip} is in the pool for the agent to use ({state:?}) while EC2 no longer has it"
            );
        }
    }
    let pool = sink.get("n").unwrap().spec.ipam.pool;
    assert!(!pool.contains_key(&gone.to_string()), "gone from the pool");
    assert!(pool.len() >= 6, "the node was served: pool {}", pool.len());
}

/// The core as production configures it (`--cluster-name` alone) makes its first mutating
/// call within 5 s of its start (it becomes leader right before): no waiting for describes to
/// catch up (§14; it waited `DESCRIBE_LAG`, 30 s, before this: every start and failover).
#[tokio::test(start_paused = true)]
async fn a_new_leader_as_production_configures_it_acts_within_five_seconds() {
    let sim = Simulator::new();
    let account = account(&sim);
    sim.set_eventual_consistency(Duration::from_secs(6), false, 4);
    sim.record_calls();
    let started = tokio::time::Instant::now();
    let (_sink, tx, _task) = serve_with(&sim, &account, production_config(), |n| {
        n.spec.eni.first_interface_index = Some(0);
        n.spec.ipam.pre_allocate = 4;
    })
    .await;
    as_in_production(&sim, &tx, &[("n", &account.2)]).await;
    tokio::time::sleep(Duration::from_secs(60)).await;
    first_mutation_within_5s(&sim, started);
}

/// The first mutating call of the run came within 5 s of `started`.
fn first_mutation_within_5s(sim: &Simulator, started: tokio::time::Instant) {
    let first_mutating = sim
        .take_calls()
        .into_iter()
        .find(|c| c.op.is_mutating())
        .map(|c| c.at.duration_since(started))
        .expect("an assign");
    assert!(
        first_mutating <= Duration::from_secs(5),
        "first mutating call {first_mutating:?} after the start"
    );
}

/// Every ENI as describes show it now.
async fn described(sim: &Simulator) -> Vec<NetworkInterface> {
    let f = EniFilter::default();
    every_page(|t| sim.describe_network_interfaces(&f, t)).await
}

/// An assign whose answer was lost is judged by a describe; right after our unassign that
/// describe still shows the unassigned addresses. They are not the assign's: taken for new
/// they went back into the cache and the pool while EC2 no longer had them, and pods got them
/// (`make dst` seeds 115, 269, 344).
#[tokio::test(start_paused = true)]
async fn an_assign_without_an_answer_does_not_take_back_addresses_just_unassigned() {
    let sim = Simulator::new();
    let (_, subnet, instance) = account(&sim);
    let primary = sim.primary_eni_id(&instance).unwrap();
    let assigned = sim
        .assign_private_ip_addresses(&primary, AddressRequest::Ips(4))
        .await
        .unwrap();
    let listed = described(&sim).await;
    let cache = cache_with(CLUSTER, &instance, listed);
    let executor = Executor::new(Arc::new(sim.clone()), cache.clone());
    sim.set_eventual_consistency(Duration::from_secs(6), false, 4);

    // The agent gave one address up; the operator unassigns it.
    let gone = assigned.ips[0];
    let out = executor
        .execute(&Action::Release(Release {
            eni_id: primary.clone(),
            ips: vec![gone],
            prefixes: Vec::new(),
        }))
        .await;
    assert!(out.released.is_some(), "{:?}", out.error);
    assert!(
        described(&sim)
            .await
            .iter()
            .any(|e| e.id == primary && e.secondary_ips.contains(&gone)),
        "describes still show the unassigned address"
    );

    // The next assign is carried out, but its answer never arrives.
    sim.inject_lost_answer(Operation::AssignPrivateIpAddresses, 1);
    executor
        .execute(&Action::Assign(Assign {
            eni_id: primary.clone(),
            subnet_id: subnet,
            request: AddressRequest::Ips(2),
            fallback_ips: None,
        }))
        .await;
    let known = cached_ips(&cache, &primary);
    assert!(
        !known.contains(&gone),
        "{gone} is back in the cache: {known:?}"
    );
    let in_ec2 = sim.network_interface(&primary).unwrap().secondary_ips;
    assert!(
        known.iter().all(|ip| in_ec2.contains(ip)),
        "the cache has {known:?}, EC2 {in_ec2:?}"
    );
}

/// Issue 29 item 0: an operator (re)started while its nodes' CiliumNodes exist serves every
/// one of them within seconds, not one at once and the rest at the next resync. Three classic
/// m5.large nodes, as production configures the core (`--cluster-name` alone: every type's
/// limits load beside the first passes), on an account whose `DescribeInstanceTypes` takes
/// 1.5 s (moto's figure; AWS pages it). Before the fix the second and third node's first pass
/// met the first one's limits lookup in flight, planned without limits ("limits of instance
/// type unknown") and waited for the 60 s rescan.
#[tokio::test(start_paused = true)]
async fn a_start_with_three_nodes_of_one_type_serves_each_within_five_seconds() {
    let sim = Simulator::new();
    let (vpc, subnet, first) = account(&sim);
    let sg = sim.add_security_group(&vpc, Tags::new());
    let mut instances = vec![first];
    for _ in 0..2 {
        instances.push(
            sim.run_instance("m5.large", &subnet, std::slice::from_ref(&sg))
                .id,
        );
    }
    sim.set_latency(
        Operation::DescribeInstanceTypes,
        Duration::from_millis(1500),
    );
    for op in Operation::ALL {
        if op != Operation::DescribeInstanceTypes {
            let ms = if op.is_mutating() { 300 } else { 150 };
            sim.set_latency(op, Duration::from_millis(ms));
        }
    }
    let cfg = production_config();
    let sink = Arc::new(MemorySink::new());
    let (tx, rx) = mpsc::channel(64);
    let names: Vec<(String, String)> = instances
        .iter()
        .enumerate()
        .map(|(i, inst)| (format!("n{i}"), inst.clone()))
        .collect();
    let pairs: Vec<(&str, &str)> = names
        .iter()
        .map(|(n, i)| (n.as_str(), i.as_str()))
        .collect();
    as_in_production(&sim, &tx, &pairs).await;
    for (i, instance) in instances.iter().enumerate() {
        let name = format!("n{i}");
        let mut n = CiliumNode::new(&name, Default::default());
        n.spec.instance_id = instance.clone();
        n.spec.eni.instance_type = "m5.large".into();
        n.spec.eni.vpc_id = vpc.clone();
        n.spec.eni.availability_zone = "zone-a".into();
        n.spec.eni.node_subnet_id = subnet.clone();
        n.spec.eni.first_interface_index = Some(1);
        n.spec.ipam.pre_allocate = 8;
        let n = sink.put(&n);
        // What the watches list at start: the Nodes, then the CiliumNodes.
        tx.send(NodeInput::NodePresent {
            name: name.clone(),
            present: true,
        })
        .await
        .unwrap();
        tx.send(NodeInput::Upsert(Box::new(n))).await.unwrap();
    }
    let core = Core::new(
        Arc::new(sim.clone()),
        sink.clone(),
        cfg.clone(),
        RuntimeMetrics::default(),
        cfg.ec2_cache(),
    );
    let started = tokio::time::Instant::now();
    let _task = tokio::spawn(core.run(rx, std::future::pending()));
    let mut served: Vec<Option<Duration>> = vec![None; instances.len()];
    while served.iter().any(Option::is_none) && started.elapsed() < Duration::from_secs(120) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        for (i, at) in served.iter_mut().enumerate() {
            if at.is_none()
                && sink
                    .get(&format!("n{i}"))
                    .is_some_and(|n| n.spec.ipam.pool.len() >= 8)
            {
                *at = Some(started.elapsed());
            }
        }
    }
    for (i, at) in served.iter().enumerate() {
        let at = at.unwrap_or_else(|| panic!("n{i} never served: {served:?}"));
        assert!(
            at <= Duration::from_secs(5),
            "n{i} was served {at:?} after the start (all: {served:?})"
        );
    }
}
