//! A core started the way the runtime tests start one: its EC2 view from its own config, fed by
//! a channel, running until the test's runtime ends (nothing else stops it: the tests that
//! need a shutdown or a lost lease build their own).

use std::sync::{Arc, RwLock};

use eni_operator::cache::Ec2Cache;
use eni_operator::crd::CiliumNode;
use eni_operator::ec2::{Ec2, Ec2Error};
use eni_operator::event_loop::core::{Core, CoreConfig, NodeInput};
use eni_operator::k8s::sink::NodeSink;
use eni_operator::reconcile::metrics::RuntimeMetrics;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::sink::MemorySink;

/// Room for every input a test sends before the core reads any: a test never waits on the
/// channel.
const INPUTS: usize = 4096;

/// A started core: a clone of it to read its books, the sender of its inputs and its task.
pub struct Running<E, S> {
    pub core: Core<E, S>,
    pub tx: mpsc::Sender<NodeInput>,
    pub task: JoinHandle<Result<(), Ec2Error>>,
    /// The core's EC2 cache (what it describes and manages).
    pub cache: Arc<RwLock<Ec2Cache>>,
}

/// Starts `Core::run` on `ec2` and `sink` with `config`, writing `metrics`.
pub fn start<E: Ec2, S: NodeSink>(
    ec2: E,
    sink: Arc<S>,
    config: CoreConfig,
    metrics: RuntimeMetrics,
) -> Running<E, S> {
    start_shared(Arc::new(ec2), sink, config, metrics)
}

/// As [`start`], on a client the test keeps a handle on (a gate whose books it reads).
pub fn start_shared<E: Ec2, S: NodeSink>(
    ec2: Arc<E>,
    sink: Arc<S>,
    config: CoreConfig,
    metrics: RuntimeMetrics,
) -> Running<E, S> {
    let cache = config.ec2_cache();
    let core = Core::new(ec2, sink, config, metrics, cache.clone());
    let (tx, rx) = mpsc::channel(INPUTS);
    let task = tokio::spawn(core.clone().run(rx, std::future::pending()));
    Running {
        core,
        tx,
        task,
        cache,
    }
}

/// The runtime tests' usual config: `workers` workers, cluster `test-cluster`, the rest default.
pub fn config(workers: usize) -> CoreConfig {
    CoreConfig {
        workers,
        ipam: eni_operator::ipam::IpamConfig {
            cluster_name: "test-cluster".into(),
            ..Default::default()
        },
        ..CoreConfig::default()
    }
}

/// A CiliumNode and its Node appear, as the watches report them: the object is stored in
/// `sink`, then the core hears of it and of its Node. Returns the object as stored.
pub async fn add(sink: &MemorySink, tx: &mpsc::Sender<NodeInput>, node: &CiliumNode) -> CiliumNode {
    let stored = sink.put(node);
    tx.send(NodeInput::Upsert(Box::new(stored.clone())))
        .await
        .unwrap();
    node_present(tx, &stored.metadata.name.clone().unwrap_or_default(), true).await;
    stored
}

/// The Node `name` is deleted: the API server no longer has it and the watch says so.
pub async fn node_gone(sink: &MemorySink, tx: &mpsc::Sender<NodeInput>, name: &str) {
    sink.set_node_exists(name, false);
    node_present(tx, name, false).await;
}

/// The Node watch reports `name` present or gone.
pub async fn node_present(tx: &mpsc::Sender<NodeInput>, name: &str, present: bool) {
    tx.send(NodeInput::NodePresent {
        name: name.into(),
        present,
    })
    .await
    .unwrap();
}
