//! The refresher against the simulator (moved from `src/runtime/refresher.rs`).

use std::collections::BTreeSet;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use eni_operator::cache::Ec2Cache;
use eni_operator::cache::refresher::{Refresher, Scope};
use eni_operator::ec2::Tags;
use testkit::cluster::network;
use testkit::sim::Simulator;

#[tokio::test(start_paused = true)]
async fn without_a_vpc_id_the_filtered_subnets_name_the_vpc_to_list() {
    let sim = Simulator::new();
    let vpc = sim.add_vpc("10.0.0.0/16".parse().unwrap(), &[]);
    let nodes = sim.add_subnet(&vpc, "zone-a", "10.0.0.0/18".parse().unwrap(), Tags::new());
    let pods = sim.add_subnet(&vpc, "zone-a", "10.0.64.0/18".parse().unwrap(), Tags::new());
    let sg = sim.add_security_group(&vpc, Tags::new());
    let ours = sim.run_instance("m5.large", &nodes, std::slice::from_ref(&sg));
    let far = network(&sim, "10.1.0.0/16", "zone-a", "10.1.0.0/18");
    let elsewhere = sim.run_instance("m5.large", &far.subnet, std::slice::from_ref(&far.sg));
    let cache = Arc::new(RwLock::new(Ec2Cache::new()));
    let scope = Scope {
        subnet_ids: vec![pods.clone()],
        ..Default::default()
    };
    let r = Refresher::new(Arc::new(sim), cache.clone(), scope, Duration::from_secs(15));
    r.full().await.unwrap();
    let c = cache.read().unwrap();
    assert!(c.instance(&ours.id).is_some(), "the VPC's instances listed");
    assert!(c.instance(&elsewhere.id).is_none(), "other VPCs not listed");
    // Every subnet of the VPC is known (the node subnet too); only the filtered one takes
    // new ENIs.
    assert_eq!(
        c.subnets.keys().cloned().collect::<BTreeSet<_>>(),
        BTreeSet::from([nodes, pods.clone()])
    );
    assert_eq!(c.pod_subnets, Some(BTreeSet::from([pods])));
}
