//! Releasing excess addresses of classic agents: the release handshake and its optimistic
//! concurrency.

use std::sync::Arc;
use std::time::Duration;

use eni_operator::crd::{AllocationIp, CiliumNode, ReleaseState};
use eni_operator::event_loop::core::NodeInput;
use testkit::agent::classic_agent_answers;
use testkit::cluster::Cluster;
use testkit::sink::MemorySink;
use testkit::{served, wait_until};

use super::support::{attached_enis, join, pool_addresses, releasing, start};

#[tokio::test(start_paused = true)]
async fn release_handshake_with_a_classic_agent() {
    let w = Cluster::new();
    let sink = Arc::new(MemorySink::new());
    let mut cfg = releasing(4);
    cfg.resync_interval = Duration::from_secs(5);
    let (_core, tx, _task) = start(w.sim.clone(), &sink, cfg);
    let inst = join(&w, &sink, &tx, "n", 16).await;
    assert!(wait_until(|| served(&sink, "n", 16), Duration::from_secs(60)).await);

    // Three addresses in use; demand drops back to the default pre-allocation.
    let in_use: Vec<String> = pool_addresses(&sink, "n").into_iter().take(3).collect();
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

/// C8: the versioned `release-ips` write is based on the version the operator observed. An
/// agent write after that observation made no conflict when a pool removal went first in the
/// same pass: the removal (unversioned) landed on the agent's version and the handshake write
/// carried the version that removal returned.
#[tokio::test(start_paused = true)]
async fn an_agent_write_before_a_release_proposal_makes_it_conflict_even_after_a_pool_removal() {
    use eni_operator::ipam::{DesiredState, changes};
    use eni_operator::k8s::sink::{NodeRef, NodeSink, SinkError};

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
