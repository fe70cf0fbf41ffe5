//! Releasing CIDRs of multi-pool agents: withdrawn from the status before the unassign, never one
//! the agent took back, and failed writes.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use eni_operator::crd::{AllocationIp, CiliumNode, IpamPoolAllocation};
use eni_operator::ec2::Instance;
use eni_operator::event_loop::core::NodeInput;
use testkit::cluster::{Cluster, agent_node, multi_pool_node, set_requested};
use testkit::sim::Simulator;
use testkit::sink::{MemorySink, WriteFault};
use testkit::{served, wait_until};
use tokio::sync::mpsc;

use super::support::{Running, attached_enis, config, pool_addresses, releasing, start, started};

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
    let mut cfg = releasing(4);
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
    let mp = multi_pool_served().await;
    let (w, sink, tx, inst, all) = (&mp.w, &mp.sink, &mp.tx, &mp.inst, &mp.all);

    // The agent holds every CIDR, then its demand drops: 8 in excess.
    let n = sink
        .update("mp", |n| {
            set_allocated(n, all);
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
    sink.update("mp", |n| set_allocated(n, all)).unwrap();
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
    let mp = multi_pool_served().await;
    let (w, sink, tx, inst, all) = (&mp.w, &mp.sink, &mp.tx, &mp.inst, &mp.all);
    assert!(
        wait_until(
            || status_cidrs(sink, "mp").len() == all.len(),
            Duration::from_secs(30)
        )
        .await,
        "published"
    );
    // The agent holds every CIDR; then its demand drops and it gives up one; the API server
    // fails the operator's next writes (a 5xx before commit: nothing written).
    let n = sink.update("mp", |n| set_allocated(n, all)).unwrap();
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
        let listed = status_cidrs(sink, "mp");
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
        status_cidrs(sink, "mp"),
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
    let (w, sink, (_core, tx, _task)) = started(config(4));
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
    let ip = pool_addresses(&sink, "n")[0].clone();
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
