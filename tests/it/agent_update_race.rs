//! Issue 29 item 2: an agent's update the watch delivers while a pass's write is in flight is
//! not overwritten by that write's answer (docs/rules.md §12.1).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use eni_operator::event_loop::core::NodeInput;
use eni_operator::k8s::sink::SinkResult;
use eni_operator::k8s::sink_layer::{LayeredSink, Pending, SinkLayer, Write};
use eni_operator::reconcile::metrics::RuntimeMetrics;
use testkit::cluster::{Cluster, agent_node, set_requested};
use testkit::running;
use testkit::sink::MemorySink;
use tokio::sync::mpsc;

/// The API server, with an agent that answers the operator's next write at once: its update
/// lands right after the operator's (a newer version) and the watch delivers it before the
/// operator's answer arrives (a slow response; the operator's pass then still publishes its
/// Event and ends).
type RacingSink = LayeredSink<Arc<MemorySink>, Race>;

struct Race {
    memory: Arc<MemorySink>,
    /// The agent's update and where the watch delivers it; taken by the next write.
    race: Mutex<Option<(mpsc::Sender<NodeInput>, i64)>>,
}

impl SinkLayer for Race {
    async fn around<'a, T: Send + 'a>(
        &'a self,
        write: Write<'a>,
        send: Pending<'a, T>,
    ) -> SinkResult<T> {
        let answer = send.await;
        let race = match write {
            Write::Patch(_) => self.race.lock().unwrap().take(),
            _ => None,
        };
        if let Some((tx, requested)) = race {
            let theirs = self
                .memory
                .update(write.node(), |n| set_requested(n, requested))
                .expect("the node exists");
            tx.send(NodeInput::Upsert(Box::new(theirs))).await.unwrap();
            // The answer is slow: the core's event loop takes the watch's event in first.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        answer
    }
}

fn pool_size(sink: &MemorySink) -> usize {
    sink.get("mp").map_or(0, |n| n.spec.ipam.pool.len())
}

/// Multi-pool (the case): the agent raises `requested` right after a pass's write; with
/// the pass's answer stored over it, the operator would plan with the older `requested` (needed
/// 0) and leave the node short until the agent happened to write again.
#[tokio::test(start_paused = true)]
async fn an_agent_update_delivered_during_a_write_is_not_overwritten_by_its_answer() {
    let w = Cluster::new();
    let memory = Arc::new(MemorySink::new());
    let sink = Arc::new(RacingSink::new(
        memory.clone(),
        Race {
            memory: memory.clone(),
            race: Mutex::new(None),
        },
    ));
    let tx = running::start(
        w.sim.clone(),
        sink.clone(),
        running::config(2),
        RuntimeMetrics::default(),
    )
    .tx;

    // An m5.large with first-interface-index 1: 2 ENIs x 9 addresses. 10 requested with the
    // default pre-allocation of 8: 10 addresses wanted.
    let inst = w.instance();
    let mut n = agent_node(&w, "mp", &inst.id, 0);
    set_requested(&mut n, 10);
    let n = memory.put(&n);
    tx.send(NodeInput::Upsert(Box::new(n))).await.unwrap();
    assert!(
        testkit::wait_until(|| pool_size(&memory) == 10, Duration::from_secs(60)).await,
        "first demand met: pool {}",
        pool_size(&memory)
    );

    // The agent wants 13; the operator's write for them is answered by the agent at once
    // with 18 (its pods keep coming).
    *sink.layer().race.lock().unwrap() = Some((tx.clone(), 18));
    let n = memory.update("mp", |n| set_requested(n, 13)).unwrap();
    tx.send(NodeInput::Upsert(Box::new(n))).await.unwrap();
    assert!(
        testkit::wait_until(|| pool_size(&memory) == 18, Duration::from_secs(120)).await,
        "the agent's 18 (delivered during the operator's write) is met: pool {}",
        pool_size(&memory)
    );
    assert!(
        sink.layer().race.lock().unwrap().is_none(),
        "the race happened"
    );
}
