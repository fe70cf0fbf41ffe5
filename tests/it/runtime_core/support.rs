//! Helpers shared by the topics of `runtime_core`: a core on the simulator and a `MemorySink`,
//! and what the tests read back.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use eni_operator::cache::Ec2Cache;
use eni_operator::crd::CiliumNode;
use eni_operator::ec2::gate::{Gate, GateConfig};
use eni_operator::ec2::{Ec2, EniFilter, EniState, NetworkInterface, Operation, Result};
use eni_operator::event_loop::core::{Core, CoreConfig, NodeInput};
use eni_operator::reconcile::metrics::RuntimeMetrics;
use testkit::cluster::{Cluster, agent_node};
use testkit::running;
use testkit::sim::Simulator;
use testkit::sink::MemorySink;
use testkit::{every_page, served, wait_until};
use tokio::sync::mpsc;

pub const CLUSTER: &str = "test-cluster";

pub use testkit::running::config;

/// [`config`] with release on: excess released after 10 s.
pub fn releasing(workers: usize) -> CoreConfig {
    let mut cfg = config(workers);
    cfg.ipam.release_excess_ips = true;
    cfg.ipam.release_delay = Duration::from_secs(10);
    cfg
}

/// A classic node joins: an m5.large starts, its agent writes the CiliumNode, the core hears
/// of it.
pub async fn join(
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

/// `count` classic nodes `node-0`, `node-1`, ... join, each wanting `min_allocate`. Returns
/// their names.
pub async fn join_many(
    w: &Cluster,
    sink: &MemorySink,
    tx: &mpsc::Sender<NodeInput>,
    count: usize,
    min_allocate: i64,
) -> Vec<String> {
    let mut names = Vec::new();
    for i in 0..count {
        let name = format!("node-{i}");
        join(w, sink, tx, &name, min_allocate).await;
        names.push(name);
    }
    names
}

/// Waits up to `limit` until `sim` answered `op` successfully `at_least` times.
pub async fn ok_calls(sim: &Simulator, op: Operation, at_least: u64, limit: Duration) -> bool {
    wait_until(|| sim.stats().get(op).ok >= at_least, limit).await
}

/// Waits up to a minute for the first successful CreateNetworkInterface.
pub async fn an_eni_created(sim: &Simulator) -> bool {
    ok_calls(
        sim,
        Operation::CreateNetworkInterface,
        1,
        Duration::from_secs(60),
    )
    .await
}

/// A running core: the handle, its input and its task.
pub type Running<E> = (
    Core<E, MemorySink>,
    mpsc::Sender<NodeInput>,
    tokio::task::JoinHandle<Result<()>>,
);

pub fn start<E: Ec2>(ec2: E, sink: &Arc<MemorySink>, cfg: CoreConfig) -> Running<E> {
    start_with_cache(ec2, sink, cfg).0
}

/// As [`start`], also handing back the core's EC2 view to look into.
pub fn start_with_cache<E: Ec2>(
    ec2: E,
    sink: &Arc<MemorySink>,
    cfg: CoreConfig,
) -> (Running<E>, Arc<RwLock<Ec2Cache>>) {
    let r = running::start(ec2, sink.clone(), cfg, RuntimeMetrics::default());
    ((r.core, r.tx, r.task), r.cache)
}

pub fn operator_error(sink: &MemorySink, name: &str) -> Option<String> {
    sink.get(name)?.status?.ipam.operator_status.error
}

/// Waits up to `limit` for node `name` to be served `want` addresses; fails with its
/// operator-status error otherwise.
pub async fn assert_served(sink: &MemorySink, name: &str, want: usize, limit: Duration) {
    assert!(
        wait_until(|| served(sink, name, want), limit).await,
        "{name} not served: {:?}",
        operator_error(sink, name)
    );
}

pub async fn our_available_enis(sim: &Simulator) -> Vec<NetworkInterface> {
    let filter = EniFilter {
        state: Some(EniState::Available),
        ..Default::default()
    };
    every_page(|t| sim.describe_network_interfaces(&filter, t)).await
}

pub async fn attached_enis(sim: &Simulator, instance: &str) -> Vec<NetworkInterface> {
    let filter = EniFilter {
        instance_ids: vec![instance.to_string()],
        ..Default::default()
    };
    every_page(|t| sim.describe_network_interfaces(&filter, t)).await
}

/// Our ENIs attached to the instance (the primary excluded).
pub async fn our_attached(sim: &Simulator, instance: &str) -> Vec<NetworkInterface> {
    attached_enis(sim, instance)
        .await
        .into_iter()
        .filter(|e| e.device_index() != Some(0))
        .collect()
}

pub fn throttled() -> testkit::sim::Fault {
    testkit::sim::Fault::new("RequestLimitExceeded", "Request limit exceeded.", 503)
}

/// Start a core, let it create an ENI for a node and kill it while the attach is in flight.
/// Returns the ENI left `available`.
pub async fn crash_between_create_and_attach(
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
    assert!(an_eni_created(&w.sim).await);
    task.abort();
    let _ = task.await;
    w.sim
        .set_latency(Operation::AttachNetworkInterface, Duration::ZERO);
    let mut left = our_available_enis(&w.sim).await;
    assert_eq!(left.len(), 1, "the created ENI was never attached");
    left.remove(0)
}

/// The addresses in the node's pool, in order.
pub fn pool_addresses(sink: &MemorySink, name: &str) -> Vec<String> {
    sink.get(name)
        .unwrap()
        .spec
        .ipam
        .pool
        .keys()
        .cloned()
        .collect()
}

/// A core with `cfg` on a fresh cluster, and the sink it writes to.
pub fn started(cfg: CoreConfig) -> (Cluster, Arc<MemorySink>, Running<Simulator>) {
    let w = Cluster::new();
    let sink = Arc::new(MemorySink::new());
    let running = start(w.sim.clone(), &sink, cfg);
    (w, sink, running)
}

/// A core with `cfg` on the cluster's simulator behind the gate (AWS's buckets and retries),
/// and the sink it writes to.
pub fn started_gated(w: &Cluster, cfg: CoreConfig) -> (Arc<MemorySink>, Running<Gate<Simulator>>) {
    let sink = Arc::new(MemorySink::new());
    let gate = Gate::new(w.sim.clone(), GateConfig::aws_defaults());
    let running = start(gate, &sink, cfg);
    (sink, running)
}
