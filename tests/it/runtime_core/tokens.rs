//! ClientTokens and ENIs left unattached: a burned token never blocks a node.

use std::sync::Arc;
use std::time::Duration;

use eni_operator::ec2::gate::GateConfig;
use eni_operator::ec2::{Ec2, Instance, NetworkInterface, Operation, Tags};
use eni_operator::event_loop::core::NodeInput;
use eni_operator::reconcile::gc::EniGc;
use testkit::cluster::{Cluster, agent_node};
use testkit::sim::Simulator;
use testkit::sink::MemorySink;
use testkit::{served, wait_until};

use super::support::{
    CLUSTER, an_eni_created, assert_served, config, crash_between_create_and_attach, join,
    ok_calls, operator_error, our_attached, our_available_enis, start, started, started_gated,
    throttled,
};

fn create_calls(sim: &Simulator) -> u64 {
    sim.stats().get(Operation::CreateNetworkInterface).calls
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
    let (sink, (_core, tx, _task)) = started_gated(&w, config(4));
    let inst = join(&w, &sink, &tx, "n", 8).await;
    assert_served(&sink, "n", 8, Duration::from_secs(120)).await;
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
    assert_served(&sink, "n", 8, Duration::from_secs(120)).await;
    assert_eq!(create_calls(&w.sim), 2, "one fresh token after the refusal");
    assert_eq!(our_attached(&w.sim, &inst.id).await.len(), 1);
    assert!(our_available_enis(&w.sim).await.is_empty());
}

/// An operator whose every attach is refused until `refused` ENIs were deleted (each one's
/// token spent) dies; EC2 then accepts attaches again. Returns the node's instance.
async fn burn_tokens(
    w: &Cluster,
    sink: &Arc<MemorySink>,
    refused: u64,
    limit: Duration,
) -> Instance {
    w.sim.set_fault_rate(
        Operation::AttachNetworkInterface,
        1.0,
        testkit::sim::Fault::new("InvalidParameterValue", "refused (injected)", 400),
    );
    let (_core, tx, task) = start(w.sim.clone(), sink, config(4));
    let inst = join(w, sink, &tx, "n", 8).await;
    assert!(ok_calls(&w.sim, Operation::DeleteNetworkInterface, refused, limit).await);
    task.abort();
    let _ = task.await;
    w.sim
        .set_fault_rate(Operation::AttachNetworkInterface, 0.0, throttled());
    inst
}

/// A new operator with no memory of the last one hears of "n" as stored and serves it, with
/// one ENI of ours attached and none left available. Returns that ENI.
async fn restart_serves(
    w: &Cluster,
    sink: &Arc<MemorySink>,
    inst: &Instance,
    limit: Duration,
) -> NetworkInterface {
    let (_core, tx, _task) = start(w.sim.clone(), sink, config(4));
    tx.send(NodeInput::Upsert(Box::new(sink.get("n").unwrap())))
        .await
        .unwrap();
    assert_served(sink, "n", 8, limit).await;
    let mut attached = our_attached(&w.sim, &inst.id).await;
    assert_eq!(attached.len(), 1);
    assert!(our_available_enis(&w.sim).await.is_empty());
    attached.remove(0)
}

#[tokio::test(start_paused = true)]
async fn a_token_burned_before_a_restart_does_not_block_the_node() {
    let w = Cluster::new();
    let sink = Arc::new(MemorySink::new());
    // The operator restarts with no memory of the token it burned.
    let inst = burn_tokens(&w, &sink, 1, Duration::from_secs(60)).await;
    restart_serves(&w, &sink, &inst, Duration::from_secs(120)).await;
}

#[tokio::test(start_paused = true)]
async fn a_new_eni_at_a_reused_device_index_gets_a_fresh_token() {
    let (w, sink, (_core, tx, _task)) = started(config(4));
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

#[tokio::test(start_paused = true)]
async fn an_eni_left_by_a_crash_between_create_and_attach_is_attached_instead_of_a_new_create() {
    let w = Cluster::new();
    let sink = Arc::new(MemorySink::new());
    let inst = w.instance();
    let n = sink.put(&agent_node(&w, "n", &inst.id, 16));
    let left = crash_between_create_and_attach(&w, &sink, &n).await;
    // Demand moves before the new leader acts: the same token would now be a mismatch.
    sink.update("n", |n| n.spec.ipam.min_allocate = 2).unwrap();
    let attached = restart_serves(&w, &sink, &inst, Duration::from_secs(120)).await;
    assert_eq!(create_calls(&w.sim), 1, "no second create");
    assert_eq!(attached.id, left.id, "the leftover was attached");
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
    sink.update("n", |n| n.spec.eni.security_groups = vec![sg2.clone()])
        .unwrap();
    let attached = restart_serves(&w, &sink, &inst, Duration::from_secs(120)).await;
    assert_eq!(attached.security_groups, vec![sg2]);
    assert!(
        w.sim.network_interface(&left.id).is_none(),
        "misfit deleted"
    );
}

#[tokio::test(start_paused = true)]
async fn the_gc_removing_a_kept_eni_does_not_block_the_node() {
    let w = Cluster::new();
    w.sim
        .set_fault_rate(Operation::AttachNetworkInterface, 1.0, throttled());
    let (sink, (_core, tx, _task)) = started_gated(&w, config(4));
    let inst = join(&w, &sink, &tx, "n", 8).await;
    assert!(an_eni_created(&w.sim).await);
    // The kept ENI stays available over two GC runs and is collected.
    let mut gc = EniGc::new(CLUSTER, 25).with_vpcs([w.vpc.clone()]);
    gc.run_once(&w.sim, &[]).await.unwrap();
    let report = gc.run_once(&w.sim, &[]).await.unwrap();
    assert_eq!(report.deleted.len(), 1);
    w.sim
        .set_fault_rate(Operation::AttachNetworkInterface, 0.0, throttled());
    assert_served(&sink, "n", 8, Duration::from_secs(300)).await;
    assert_eq!(our_attached(&w.sim, &inst.id).await.len(), 1);
    assert!(our_available_enis(&w.sim).await.is_empty());
}

/// Token generations restart at 0 with a new process: after k refused attaches (each ENI
/// deleted, its token spent), a restarted operator replayed the k spent tokens one by one
/// (EC2 answers each with its deleted ENI: a not-ready wait and a failed pass apiece). With a
/// per-process nonce in the token it never replays one: one create after the restart.
#[tokio::test(start_paused = true)]
async fn a_restart_after_refused_attaches_replays_no_spent_token() {
    const REFUSED: u64 = 3;
    let w = Cluster::new();
    let sink = Arc::new(MemorySink::new());
    let inst = burn_tokens(&w, &sink, REFUSED, Duration::from_secs(300)).await;
    let before = create_calls(&w.sim);
    assert!(before >= REFUSED, "{before} creates before the restart");
    restart_serves(&w, &sink, &inst, Duration::from_secs(300)).await;
    assert_eq!(
        create_calls(&w.sim) - before,
        1,
        "one create after the restart, no spent token replayed"
    );
}
