//! Two cores and one Lease: never both mutate; a core is warm after its first full refresh.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use eni_operator::ec2::layer::{Layered, MutationGuard};
use eni_operator::ec2::{Operation, Result};
use eni_operator::event_loop::core::{Core, NodeInput};
use eni_operator::k8s::leader::{Elector, LeaderConfig, LeadershipLost};
use eni_operator::reconcile::metrics::RuntimeMetrics;
use testkit::cluster::{Cluster, agent_node};
use testkit::lease::{MemoryLease, MemoryLeaseClient};
use testkit::sink::MemorySink;
use testkit::{all_served, wait_until};
use tokio::sync::mpsc;

use super::support::config;

/// Records every mutating call with whether its caller held the lease at that moment.
struct Recorder {
    lease: Arc<MemoryLease>,
    identity: String,
    log: Arc<Mutex<Vec<(String, bool)>>>,
}

impl MutationGuard for Recorder {
    async fn before(&self, _: Operation) -> Result<()> {
        let holds = self.lease.holder().as_deref() == Some(self.identity.as_str());
        self.log
            .lock()
            .unwrap()
            .push((self.identity.clone(), holds));
        Ok(())
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
        let ec2: Layered<_, Recorder> = Layered::new(
            w.sim.clone(),
            Recorder {
                lease: lease.clone(),
                identity: id.into(),
                log: log.clone(),
            },
        );
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
    assert!(all_served(&sink, &names, 8, Duration::from_secs(60)).await);
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
    assert!(all_served(&sink, &names, 16, Duration::from_secs(180)).await);
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
