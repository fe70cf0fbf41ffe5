//! Static IPs (`spec.ipam.static-ip-tags`, Cilium's Elastic IP feature) end to end through the
//! core, against the simulator: the Elastic IP comes before any allocation, two nodes never
//! share one and a node never gets a second (a lost race, a lost answer, a restart), a node
//! without a free one reports it and others proceed, and a gone node's address is
//! disassociated, never released.

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Duration;

use eni_operator::crd::CiliumNode;
use eni_operator::ec2::gate::{Gate, GateConfig};
use eni_operator::ec2::{Address, Ec2, InstanceState, Operation, Result, Tags};
use eni_operator::event_loop::core::NodeInput;
use eni_operator::ipam::ownership::CLUSTER_TAG;
use eni_operator::reconcile::metrics::RuntimeMetrics;
use testkit::cluster::{Cluster, agent_node};
use testkit::running;
use testkit::sim::Simulator;
use testkit::sink::MemorySink;
use testkit::{served, wait_until};
use tokio::sync::mpsc;

type Running = (mpsc::Sender<NodeInput>, tokio::task::JoinHandle<Result<()>>);

fn start(sim: &Simulator, sink: &Arc<MemorySink>) -> Running {
    let gate = Gate::new(sim.clone(), GateConfig::aws_defaults());
    let r = running::start(
        gate,
        sink.clone(),
        running::config(4),
        RuntimeMetrics::default(),
    );
    (r.tx, r.task)
}

fn eip_tags() -> Tags {
    Tags::from([("pool".to_string(), "egress".to_string())])
}

/// What the user's Elastic IPs carry: the node's tags and the operator's required tag
/// (`--static-ip-required-tag`, by default the cluster's tag).
fn allowed_eip_tags() -> Tags {
    let mut t = eip_tags();
    t.insert(CLUSTER_TAG.to_string(), "test-cluster".to_string());
    t
}

fn static_node(w: &Cluster, name: &str, instance: &str) -> CiliumNode {
    let mut n = agent_node(w, name, instance, 4);
    n.spec.ipam.static_ip_tags = eip_tags();
    n
}

fn assigned(sink: &MemorySink, name: &str) -> Option<String> {
    let ip = sink.get(name)?.status?.ipam.assigned_static_ip;
    (!ip.is_empty()).then_some(ip)
}

fn operator_error(sink: &MemorySink, name: &str) -> Option<String> {
    sink.get(name)?.status?.ipam.operator_status.error
}

/// The Elastic IPs associated with `instance`'s primary ENI.
fn on_primary(sim: &Simulator, instance: &str) -> Vec<Address> {
    let primary = sim.primary_eni_id(instance).unwrap();
    sim.addresses()
        .into_iter()
        .filter(|a| a.network_interface_id.as_deref() == Some(primary.as_str()))
        .collect()
}

/// The invariant: no node has two Elastic IPs (EC2 itself holds an address to one ENI).
fn at_most_one_each(sim: &Simulator, instances: &[&str]) {
    for i in instances {
        assert!(on_primary(sim, i).len() <= 1, "{i} has a second Elastic IP");
    }
}

fn ip(a: [u8; 4]) -> Ipv4Addr {
    Ipv4Addr::from(a)
}

#[tokio::test(start_paused = true)]
async fn a_node_gets_a_free_tagged_eip_before_any_allocation() {
    let w = Cluster::new();
    w.sim.record_calls();
    // Associated elsewhere, untagged, and free + tagged: only the last one is the node's.
    let taken = w.sim.add_address(ip([198, 51, 100, 1]), allowed_eip_tags());
    let other = w.instance();
    let other_eni = w.sim.primary_eni_id(&other.id).unwrap();
    let other_ip = w.sim.network_interface(&other_eni).unwrap().primary_ip;
    w.sim
        .associate_address(&taken, &other_eni, other_ip)
        .await
        .unwrap();
    w.sim.add_address(ip([198, 51, 100, 2]), Tags::new());
    w.sim.add_address(ip([198, 51, 100, 3]), allowed_eip_tags());
    let sink = Arc::new(MemorySink::with_ciliums_crd());
    let (tx, _task) = start(&w.sim, &sink);
    let inst = w.instance();
    running::add(&sink, &tx, &static_node(&w, "n", &inst.id)).await;
    assert!(wait_until(|| served(&sink, "n", 4), Duration::from_secs(60)).await);
    assert_eq!(assigned(&sink, "n").as_deref(), Some("198.51.100.3"));
    let mine = on_primary(&w.sim, &inst.id);
    assert_eq!(mine.len(), 1);
    let primary = w.sim.primary_eni_id(&inst.id).unwrap();
    assert_eq!(
        mine[0].private_ip,
        Some(w.sim.network_interface(&primary).unwrap().primary_ip),
        "on the primary ENI's primary address"
    );
    // Before allocating (Cilium's order): the association precedes every assign or create.
    let calls = w.sim.take_calls();
    let first = |op| calls.iter().position(|c| c.op == op && c.answer == "ok");
    let associated = first(Operation::AssociateAddress).expect("associated");
    for op in [
        Operation::CreateNetworkInterface,
        Operation::AssignPrivateIpAddresses,
    ] {
        assert!(first(op).is_none_or(|i| i > associated), "{op} came first");
    }
}

#[tokio::test(start_paused = true)]
async fn two_nodes_racing_for_the_same_eip_end_with_one_each() {
    let w = Cluster::new();
    // Both passes describe at once, then associate the same first free address; the slow
    // associate makes the race certain. The loser moves on to the next address.
    w.sim
        .set_latency(Operation::AssociateAddress, Duration::from_millis(500));
    w.sim.add_address(ip([203, 0, 113, 1]), allowed_eip_tags());
    w.sim.add_address(ip([203, 0, 113, 2]), allowed_eip_tags());
    let sink = Arc::new(MemorySink::new());
    let (tx, _task) = start(&w.sim, &sink);
    let (a, b) = (w.instance(), w.instance());
    running::add(&sink, &tx, &static_node(&w, "a", &a.id)).await;
    running::add(&sink, &tx, &static_node(&w, "b", &b.id)).await;
    assert!(
        wait_until(
            || assigned(&sink, "a").is_some() && assigned(&sink, "b").is_some(),
            Duration::from_secs(60)
        )
        .await
    );
    assert_ne!(assigned(&sink, "a"), assigned(&sink, "b"));
    at_most_one_each(&w.sim, &[&a.id, &b.id]);
    let stats = w.sim.stats().get(Operation::AssociateAddress);
    assert_eq!(stats.ok, 2);
    assert_eq!(stats.rejected, 1, "the race was run and lost once");
    assert!(
        wait_until(
            || served(&sink, "a", 4) && served(&sink, "b", 4),
            Duration::from_secs(60)
        )
        .await
    );
}

#[tokio::test(start_paused = true)]
async fn no_free_eip_is_reported_and_retried_and_other_nodes_proceed() {
    let w = Cluster::new();
    w.sim.add_address(ip([203, 0, 113, 1]), allowed_eip_tags());
    let sink = Arc::new(MemorySink::new());
    let (tx, _task) = start(&w.sim, &sink);
    let (a, b, c) = (w.instance(), w.instance(), w.instance());
    running::add(&sink, &tx, &static_node(&w, "a", &a.id)).await;
    assert!(wait_until(|| served(&sink, "a", 4), Duration::from_secs(60)).await);
    running::add(&sink, &tx, &static_node(&w, "b", &b.id)).await;
    running::add(&sink, &tx, &agent_node(&w, "plain", &c.id, 4)).await;
    assert!(
        wait_until(
            || operator_error(&sink, "b").is_some_and(|e| e.contains("NoStaticIp")),
            Duration::from_secs(60)
        )
        .await,
        "{:?}",
        operator_error(&sink, "b")
    );
    assert!(wait_until(|| served(&sink, "plain", 4), Duration::from_secs(60)).await);
    // Nothing is allocated for "b" while it waits (Cilium's order), and it says why.
    assert!(sink.get("b").unwrap().spec.ipam.pool.is_empty());
    assert!(
        sink.events("b").iter().any(|e| e.reason == "NoStaticIp"),
        "an Event"
    );
    // An address turns up: the retry (backoff) takes it and the node is served.
    w.sim.add_address(ip([203, 0, 113, 2]), allowed_eip_tags());
    assert!(wait_until(|| served(&sink, "b", 4), Duration::from_secs(600)).await);
    assert_eq!(assigned(&sink, "b").as_deref(), Some("203.0.113.2"));
    assert_eq!(operator_error(&sink, "b"), None, "the error is cleared");
    at_most_one_each(&w.sim, &[&a.id, &b.id, &c.id]);
    assert!(on_primary(&w.sim, &c.id).is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_lost_answer_to_an_associate_is_adopted_not_doubled() {
    let w = Cluster::new();
    w.sim.add_address(ip([203, 0, 113, 1]), allowed_eip_tags());
    w.sim.add_address(ip([203, 0, 113, 2]), allowed_eip_tags());
    w.sim.inject_lost_answer(Operation::AssociateAddress, 1);
    let sink = Arc::new(MemorySink::new());
    let (tx, _task) = start(&w.sim, &sink);
    let inst = w.instance();
    running::add(&sink, &tx, &static_node(&w, "n", &inst.id)).await;
    assert!(wait_until(|| served(&sink, "n", 4), Duration::from_secs(120)).await);
    assert_eq!(assigned(&sink, "n").as_deref(), Some("203.0.113.1"));
    assert_eq!(
        on_primary(&w.sim, &inst.id).len(),
        1,
        "one address, not two"
    );
    assert_eq!(w.sim.stats().get(Operation::AssociateAddress).ok, 1);
}

#[tokio::test(start_paused = true)]
async fn a_restart_adopts_the_eip_already_on_the_primary_eni() {
    let w = Cluster::new();
    let first = w.sim.add_address(ip([203, 0, 113, 1]), allowed_eip_tags());
    w.sim.add_address(ip([203, 0, 113, 2]), allowed_eip_tags());
    let inst = w.instance();
    // The previous leader associated the second address and stopped before writing it.
    let primary = w.sim.primary_eni_id(&inst.id).unwrap();
    let private = w.sim.network_interface(&primary).unwrap().primary_ip;
    let second = w
        .sim
        .addresses()
        .into_iter()
        .find(|a| a.allocation_id != first)
        .unwrap();
    w.sim
        .associate_address(&second.allocation_id, &primary, private)
        .await
        .unwrap();
    let before = w.sim.stats().get(Operation::AssociateAddress).ok;
    let sink = Arc::new(MemorySink::new());
    let (tx, _task) = start(&w.sim, &sink);
    running::add(&sink, &tx, &static_node(&w, "n", &inst.id)).await;
    assert!(wait_until(|| served(&sink, "n", 4), Duration::from_secs(60)).await);
    assert_eq!(assigned(&sink, "n").as_deref(), Some("203.0.113.2"));
    assert_eq!(w.sim.stats().get(Operation::AssociateAddress).ok, before);
    assert_eq!(on_primary(&w.sim, &inst.id).len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_gone_nodes_eip_is_disassociated_never_released() {
    let w = Cluster::new();
    let alloc = w.sim.add_address(ip([203, 0, 113, 1]), allowed_eip_tags());
    let sink = Arc::new(MemorySink::new());
    let (tx, _task) = start(&w.sim, &sink);
    let inst = w.instance();
    running::add(&sink, &tx, &static_node(&w, "n", &inst.id)).await;
    assert!(wait_until(|| served(&sink, "n", 4), Duration::from_secs(60)).await);
    assert_eq!(on_primary(&w.sim, &inst.id).len(), 1);
    // The instance ends with its Node (a Node gone while its instance runs keeps its ENIs and
    // its address for the grace period, rules §9).
    w.sim
        .set_instance_state(&inst.id, InstanceState::ShuttingDown);
    running::node_gone(&sink, &tx, "n").await;
    assert!(wait_until(|| sink.get("n").is_none(), Duration::from_secs(120)).await);
    let all = w.sim.addresses();
    let eip = all.iter().find(|a| a.allocation_id == alloc).expect("kept");
    assert_eq!(eip.association_id, None, "disassociated");
    assert_eq!(w.sim.stats().get(Operation::DisassociateAddress).ok, 1);
}

/// An agent's `static-ip-tags` select among the Elastic IPs the operator may use, never beyond:
/// a free address carrying the node's tags but not the required tag (another tenant's, or one
/// the user keeps for something else) is never associated; the node says why and waits.
#[tokio::test(start_paused = true)]
async fn an_eip_without_the_required_tag_is_never_associated() {
    let w = Cluster::new();
    let foreign = w.sim.add_address(ip([192, 0, 2, 7]), eip_tags());
    let sink = Arc::new(MemorySink::new());
    let (tx, _task) = start(&w.sim, &sink);
    let inst = w.instance();
    running::add(&sink, &tx, &static_node(&w, "n", &inst.id)).await;
    assert!(
        wait_until(
            || operator_error(&sink, "n").is_some_and(|e| e.contains("StaticIpNotAllowed")),
            Duration::from_secs(60)
        )
        .await,
        "{:?}",
        operator_error(&sink, "n")
    );
    let error = operator_error(&sink, "n").unwrap();
    assert!(
        error.contains(&foreign) && error.contains("eni-operator.io/cluster-name=test-cluster"),
        "names the address and the tag it lacks: {error}"
    );
    assert!(
        sink.events("n")
            .iter()
            .any(|e| e.reason == "StaticIpNotAllowed"),
        "an Event"
    );
    assert_eq!(w.sim.stats().get(Operation::AssociateAddress).calls, 0);
    assert!(on_primary(&w.sim, &inst.id).is_empty());
    assert!(sink.get("n").unwrap().spec.ipam.pool.is_empty());
    // The user tags an address for the cluster: the retry takes that one, never the other.
    w.sim.add_address(ip([192, 0, 2, 8]), allowed_eip_tags());
    assert!(wait_until(|| served(&sink, "n", 4), Duration::from_secs(600)).await);
    assert_eq!(assigned(&sink, "n").as_deref(), Some("192.0.2.8"));
    let kept = w.sim.addresses();
    let kept = kept.iter().find(|a| a.allocation_id == foreign).unwrap();
    assert_eq!(kept.association_id, None);
}
