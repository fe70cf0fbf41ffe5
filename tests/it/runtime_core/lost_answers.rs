//! EC2 calls whose answer was lost: the effect is found, never doubled.

use std::sync::Arc;
use std::time::Duration;

use eni_operator::ec2::gate::{Gate, GateConfig};
use eni_operator::ec2::{AddressRequest, Ec2, EniFilter, Operation};
use eni_operator::event_loop::core::NodeInput;
use eni_operator::ipam::{Action, Release};
use eni_operator::reconcile::executor::Executor;
use testkit::cluster::{Cluster, agent_node};
use testkit::{every_page, served, wait_until};

use super::support::{CLUSTER, assert_served, config, join, our_attached, started_gated};
use crate::support::{cache_with, cached_ips};

#[tokio::test(start_paused = true)]
async fn a_lost_answer_to_an_assign_does_not_double_the_addresses() {
    let w = Cluster::new();
    let (sink, (_core, tx, _task)) = started_gated(&w, config(4));
    // m5.xlarge: 14 secondary addresses per ENI, room for a top-up and for its double.
    let inst = w
        .sim
        .run_instance("m5.xlarge", &w.subnet, std::slice::from_ref(&w.sg));
    let mut node = agent_node(&w, "n", &inst.id, 2);
    node.spec.eni.instance_type = "m5.xlarge".into();
    let n = sink.put(&node);
    tx.send(NodeInput::Upsert(Box::new(n))).await.unwrap();
    assert!(wait_until(|| served(&sink, "n", 8), Duration::from_secs(60)).await);
    let before = sink.get("n").unwrap().spec.ipam.pool.len();
    // The next assign is carried out, but its answer never arrives.
    w.sim
        .inject_lost_answer(Operation::AssignPrivateIpAddresses, 1);
    let want = before + 3;
    let n = sink
        .update("n", |n| n.spec.ipam.min_allocate = want as i64)
        .unwrap();
    tx.send(NodeInput::Upsert(Box::new(n))).await.unwrap();
    assert_served(&sink, "n", want, Duration::from_secs(120)).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let enis = our_attached(&w.sim, &inst.id).await;
    let in_ec2: usize = enis.iter().map(|e| e.secondary_ips.len()).sum();
    let pool = sink.get("n").unwrap().spec.ipam.pool.len();
    assert_eq!(in_ec2, pool, "EC2 agrees with the pool");
    assert_eq!(pool, want, "no address assigned twice");
    assert_eq!(
        w.sim.stats().get(Operation::AssignPrivateIpAddresses).ok,
        1,
        "the assign was carried out once"
    );
}

/// The gate retries an unassign whose answer was lost (it took effect) and the retry meets a
/// 5xx: the addresses count as released (the agent gave them up). Counted as still assigned,
/// they stayed in the cache and the pool, the handshake was withdrawn, and pods got addresses
/// EC2 no longer had (`make dst` seed 434).
#[tokio::test(start_paused = true)]
async fn an_unassign_that_took_effect_counts_released_when_its_retry_meets_a_5xx() {
    let w = Cluster::new();
    let inst = w.instance();
    let primary = w.sim.primary_eni_id(&inst.id).unwrap();
    let assigned = w
        .sim
        .assign_private_ip_addresses(&primary, AddressRequest::Ips(4))
        .await
        .unwrap();
    let f = EniFilter::default();
    let enis = every_page(|t| w.sim.describe_network_interfaces(&f, t)).await;
    let cache = cache_with(CLUSTER, &inst.id, enis);
    let gate = Gate::new(w.sim.clone(), GateConfig::aws_defaults());
    let executor = Executor::new(Arc::new(gate), cache.clone());

    // The first attempt is carried out but its answer is lost; every retry meets a 5xx.
    w.sim
        .inject_lost_answer(Operation::UnassignPrivateIpAddresses, 1);
    let sim = w.sim.clone();
    let fail_retries = tokio::spawn(async move {
        while sim.stats().get(Operation::UnassignPrivateIpAddresses).calls == 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        sim.inject_error(Operation::UnassignPrivateIpAddresses, "InternalError", 10);
    });
    let gone = vec![assigned.ips[0], assigned.ips[1]];
    let out = executor
        .execute(&Action::Release(Release {
            eni_id: primary.clone(),
            ips: gone.clone(),
            prefixes: Vec::new(),
        }))
        .await;
    fail_retries.await.unwrap();
    let in_ec2 = w.sim.network_interface(&primary).unwrap().secondary_ips;
    assert!(
        gone.iter().all(|ip| !in_ec2.contains(ip)),
        "the first attempt took effect: {in_ec2:?}"
    );
    assert_eq!(
        out.error.as_ref().map(|e| e.code.as_str()),
        None,
        "the last answer was a 5xx, yet the release counts"
    );
    assert!(out.released.is_some());
    let known = cached_ips(&cache, &primary);
    assert!(
        gone.iter().all(|ip| !known.contains(ip)),
        "the cache still has them: {known:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_lost_answer_to_an_attach_is_found_attached() {
    let w = Cluster::new();
    // The attach is carried out but its answer never arrives: the operator must look, not
    // repeat it (refused "in use") and then try to delete an attached ENI.
    w.sim
        .inject_lost_answer(Operation::AttachNetworkInterface, 1);
    let (sink, (_core, tx, _task)) = started_gated(&w, config(4));
    let inst = join(&w, &sink, &tx, "n", 8).await;
    assert_served(&sink, "n", 8, Duration::from_secs(60)).await;
    let stats = w.sim.stats();
    assert_eq!(
        stats.get(Operation::AttachNetworkInterface).calls,
        1,
        "not repeated"
    );
    assert_eq!(stats.get(Operation::DeleteNetworkInterface).calls, 0);
    assert_eq!(stats.get(Operation::CreateNetworkInterface).calls, 1);
    assert!(
        !sink.events("n").iter().any(|e| e.warning),
        "no error: {:?}",
        sink.events("n")
    );
    assert_eq!(our_attached(&w.sim, &inst.id).await.len(), 1);
}
