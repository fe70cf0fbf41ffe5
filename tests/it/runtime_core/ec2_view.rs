//! The core's EC2 view: unhealthy until a full refresh succeeds, only the managed nodes' VPC,
//! subnet filters.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use eni_operator::ec2::{Operation, Tags};
use eni_operator::event_loop::core::NodeInput;
use testkit::cluster::{Cluster, agent_node, network};
use testkit::sim::Simulator;
use testkit::sink::MemorySink;
use testkit::{served, wait_until};

use super::support::{config, join, operator_error, start_with_cache, started};

#[tokio::test(start_paused = true)]
async fn an_unhealthy_ec2_view_blocks_mutations_until_a_full_refresh_succeeds() {
    let (w, sink, (_core, tx, _task)) = started(config(4));
    join(&w, &sink, &tx, "n", 4).await;
    assert!(wait_until(|| served(&sink, "n", 4), Duration::from_secs(30)).await);

    // The next full refresh fails: the view is unhealthy.
    w.sim
        .inject_error(Operation::DescribeVpcs, "InternalError", 1);
    tokio::time::sleep(Duration::from_secs(61)).await;
    let mutating = |sim: &Simulator| -> u64 {
        Operation::ALL
            .iter()
            .filter(|o| o.is_mutating())
            .map(|o| sim.stats().get(*o).calls)
            .sum()
    };
    let before = mutating(&w.sim);
    let n = sink.update("n", |n| n.spec.ipam.min_allocate = 12).unwrap();
    tx.send(NodeInput::Upsert(Box::new(n))).await.unwrap();
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(
        mutating(&w.sim),
        before,
        "no EC2 mutation on an unhealthy view"
    );
    assert!(!served(&sink, "n", 12));
    // The next full refresh succeeds; the node is served.
    assert!(wait_until(|| served(&sink, "n", 12), Duration::from_secs(180)).await);
}

/// Issue 29 item 6: a leadership's first full EC2 listing covers the managed nodes' VPC only.
/// It used to run before any node was known, so it listed every ENI, subnet and security
/// group of the Region: a failover took as long as the account was large, not the cluster.
#[tokio::test(start_paused = true)]
async fn the_first_listing_of_a_leadership_covers_only_the_managed_nodes_vpc() {
    let w = Cluster::new();
    w.sim.set_page_size(10);
    // Another VPC of the account, busy and none of the cluster's business.
    let other = w.sim.add_vpc("10.1.0.0/16".parse().unwrap(), &[]);
    let other_sg = w.sim.add_security_group(&other, Tags::new());
    for i in 0..20u8 {
        let cidr = format!("10.1.{i}.0/24").parse().unwrap();
        let subnet = w.sim.add_subnet(&other, "zone-a", cidr, Tags::new());
        for _ in 0..3 {
            w.sim
                .run_instance("m5.large", &subnet, std::slice::from_ref(&other_sg));
        }
    }
    let sink = Arc::new(MemorySink::new());
    let ((core, tx, _task), cache) = start_with_cache(w.sim.clone(), &sink, config(4));
    let mut warm = core.warm();
    for i in 0..3 {
        join(&w, &sink, &tx, &format!("n{i}"), 8).await;
    }
    warm.wait_for(|w| *w).await.unwrap();
    let stats = w.sim.stats();
    let (enis, subnets) = (
        stats.get(Operation::DescribeNetworkInterfaces).calls,
        stats.get(Operation::DescribeSubnets).calls,
    );
    let listed: BTreeSet<String> = {
        let c = cache.read().unwrap();
        c.subnets.values().map(|s| s.vpc_id.clone()).collect()
    };
    assert_eq!(
        listed,
        BTreeSet::from([w.vpc.clone()]),
        "subnets of the managed VPC only ({enis} describes of ENIs, {subnets} of subnets)"
    );
    // The other VPC's 60 ENIs and 20 subnets alone are 6 and 2 pages. Here: the describes of
    // the nodes' instances (the first node's, then the others'), one page of their VPC's
    // ENIs and one of its subnets.
    assert!(
        enis <= 3 && subnets <= 1,
        "describes before the first action: {enis} of ENIs, {subnets} of subnets"
    );
    assert!(
        wait_until(
            || (0..3).all(|i| served(&sink, &format!("n{i}"), 8)),
            Duration::from_secs(5)
        )
        .await,
        "each node served within 5 s of the first listing"
    );
}

/// `status.eni.enis` of a node: ENI ID -> subnet ID.
fn status_enis(sink: &MemorySink, name: &str) -> BTreeMap<String, String> {
    sink.get(name)
        .and_then(|n| n.status)
        .map(|s| {
            s.eni
                .enis
                .into_iter()
                .map(|(id, e)| (id, e.subnet.id))
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(start_paused = true)]
async fn a_subnet_filter_never_hides_a_nodes_primary_eni() {
    // The node subnet is outside --subnet-ids-filter (custom networking: pods in the pod
    // subnet). The primary ENI must still be published (C5) from the first pass on, and after
    // every full refresh; new ENIs go only to the pod subnet.
    let w = Cluster::new();
    let pod_subnet = w.add_subnet("10.0.64.0/18");
    let sink = Arc::new(MemorySink::new());
    let mut cfg = config(4);
    cfg.scope.subnet_ids = vec![pod_subnet.clone()];
    let ((_core, tx, _task), cache) = start_with_cache(w.sim.clone(), &sink, cfg);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let inst = w.instance();
    let primary = w.sim.primary_eni_id(&inst.id).unwrap();
    let n = sink.put(&agent_node(&w, "n", &inst.id, 8));
    tx.send(NodeInput::Upsert(Box::new(n))).await.unwrap();
    // Well before the next full refresh (60 s).
    assert!(wait_until(|| served(&sink, "n", 8), Duration::from_secs(20)).await);
    assert_eq!(operator_error(&sink, "n"), None);
    let enis = status_enis(&sink, "n");
    assert_eq!(enis.get(&primary), Some(&w.subnet), "primary ENI listed");
    assert!(
        enis.iter()
            .filter(|(id, _)| **id != primary)
            .all(|(_, subnet)| *subnet == pod_subnet),
        "new ENIs only in the filtered subnet: {enis:?}"
    );
    // Full refreshes come and go: the primary ENI stays known and listed.
    tokio::time::sleep(Duration::from_secs(130)).await;
    let after = status_enis(&sink, "n");
    assert_eq!(after, enis, "status unchanged by the full refreshes");
    assert_eq!(operator_error(&sink, "n"), None);
    let cache = cache.read().unwrap();
    let cached = &cache.instance(&inst.id).unwrap().enis;
    assert!(cached.iter().any(|e| e.id == primary), "{cached:?}");
}

#[tokio::test(start_paused = true)]
async fn the_ec2_cache_holds_only_the_managed_nodes_vpc_and_forgets_the_rest() {
    // No --vpc-id: the listing is scoped to the managed nodes' VPC once it is known (Cilium
    // #41392 lists the whole Region), and an instance that is neither managed nor listed any
    // more is forgotten.
    let w = Cluster::new();
    let other = network(&w.sim, "10.1.0.0/16", "zone-a", "10.1.0.0/18");
    let elsewhere = w
        .sim
        .run_instance("m5.large", &other.subnet, std::slice::from_ref(&other.sg));
    let bystander = w.instance();
    let inst = w.instance();
    let sink = Arc::new(MemorySink::new());
    let ((_core, tx, _task), cache) = start_with_cache(w.sim.clone(), &sink, config(4));
    let n = sink.put(&agent_node(&w, "n", &inst.id, 4));
    tx.send(NodeInput::Upsert(Box::new(n))).await.unwrap();
    assert!(wait_until(|| served(&sink, "n", 4), Duration::from_secs(30)).await);
    w.sim.terminate_instance(&bystander.id);
    tokio::time::sleep(Duration::from_secs(130)).await;
    let cache = cache.read().unwrap();
    assert!(cache.instance(&inst.id).is_some(), "the managed node stays");
    assert!(
        cache.instance(&elsewhere.id).is_none(),
        "another VPC's instance is not listed any more"
    );
    assert!(
        cache.instance(&bystander.id).is_none(),
        "a terminated instance no node names is forgotten"
    );
    assert!(
        !cache.subnets.contains_key(&other.subnet),
        "subnets scoped to the VPC"
    );
}
