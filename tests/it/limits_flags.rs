//! Cilium's instance-limit flags on the running core (issue 22, part 2):
//! `--update-ec2-adapter-limit-via-api=false` makes no DescribeInstanceTypes call and serves
//! nodes from the built-in table; `--aws-instance-limit-mapping` caps a type below EC2's figures.

use std::sync::Arc;
use std::time::Duration;

use eni_operator::ec2::Operation;
use eni_operator::ec2::limits::LimitOverride;
use eni_operator::event_loop::core::{CoreConfig, NodeInput};
use eni_operator::ipam::IpamConfig;
use eni_operator::reconcile::metrics::RuntimeMetrics;
use testkit::cluster::{Cluster, agent_node};
use testkit::sim::Simulator;
use testkit::sink::MemorySink;
use testkit::{served, wait_until};
use tokio::sync::mpsc;

fn config() -> CoreConfig {
    CoreConfig {
        workers: 4,
        ipam: IpamConfig {
            cluster_name: "test-cluster".into(),
            ..IpamConfig::default()
        },
        ..CoreConfig::default()
    }
}

fn start(sim: &Simulator, sink: &Arc<MemorySink>, cfg: CoreConfig) -> mpsc::Sender<NodeInput> {
    testkit::running::start(sim.clone(), sink.clone(), cfg, RuntimeMetrics::default()).tx
}

async fn join(w: &Cluster, sink: &MemorySink, tx: &mpsc::Sender<NodeInput>, name: &str) {
    let inst = w.instance();
    let n = sink.put(&agent_node(w, name, &inst.id, 12));
    tx.send(NodeInput::Upsert(Box::new(n))).await.unwrap();
}

fn describe_instance_types(sim: &Simulator) -> u64 {
    sim.stats().get(Operation::DescribeInstanceTypes).calls
}

#[tokio::test(start_paused = true)]
async fn without_the_api_limits_come_from_the_built_in_table() {
    // With the API (the default), limits are described.
    let w = Cluster::new();
    let sink = Arc::new(MemorySink::new());
    let tx = start(&w.sim, &sink, config());
    join(&w, &sink, &tx, "api").await;
    assert!(wait_until(|| served(&sink, "api", 12), Duration::from_secs(120)).await);
    assert!(describe_instance_types(&w.sim) > 0);

    let w = Cluster::new();
    let sink = Arc::new(MemorySink::new());
    let cfg = CoreConfig {
        limits_via_api: false,
        ..config()
    };
    let tx = start(&w.sim, &sink, cfg);
    join(&w, &sink, &tx, "table").await;
    assert!(wait_until(|| served(&sink, "table", 12), Duration::from_secs(120)).await);
    assert_eq!(
        describe_instance_types(&w.sim),
        0,
        "no DescribeInstanceTypes"
    );
}

#[tokio::test(start_paused = true)]
async fn a_limit_mapping_caps_the_type_below_ec2s_figures() {
    let w = Cluster::new();
    let sink = Arc::new(MemorySink::new());
    // m5.large really has 3 ENIs x 10 addresses; say 2 x 4. With first-interface-index 1 the
    // node can use one ENI with 3 secondary addresses.
    let cfg = CoreConfig {
        limit_overrides: vec!["m5.large=2,4,4".parse::<LimitOverride>().unwrap()],
        ..config()
    };
    let tx = start(&w.sim, &sink, cfg);
    join(&w, &sink, &tx, "capped").await;
    assert!(wait_until(|| served(&sink, "capped", 3), Duration::from_secs(120)).await);
    tokio::time::sleep(Duration::from_secs(600)).await;
    let node = sink.get("capped").unwrap();
    assert_eq!(
        node.spec.ipam.pool.len(),
        3,
        "never beyond the mapped limits"
    );
    assert_eq!(
        node.status.unwrap().eni.enis.len(),
        2,
        "the primary ENI and one more, never a third"
    );
    assert!(describe_instance_types(&w.sim) > 0, "the API is still read");
}

#[test]
fn the_flags_reach_the_core() {
    use clap::Parser;
    let s = eni_operator::config::Settings::try_parse_from([
        "eni-operator",
        "--cluster-name=test-cluster",
        "--update-ec2-adapter-limit-via-api=false",
        "--aws-instance-limit-mapping=a1.medium=2,4,4",
        "--aws-instance-limit-mapping=c5.xlarge=4, 10 ,10;t3.large=3,6,6",
    ])
    .unwrap();
    let core = s.core_config();
    assert!(!core.limits_via_api);
    let types: Vec<&str> = core
        .limit_overrides
        .iter()
        .map(|o| o.instance_type.as_str())
        .collect();
    assert_eq!(types, ["a1.medium", "c5.xlarge", "t3.large"]);
    assert_eq!(core.limit_overrides[1].ipv4, 10);
    // The table plus the overrides are in the core's EC2 view from the start.
    let cache = core.ec2_cache();
    let cache = cache.read().unwrap();
    assert_eq!(cache.limits["c5.xlarge"].ipv4_per_eni, 10);
    assert_eq!(cache.limits["m5.large"].ipv4_per_eni, 10);
    assert!(cache.limits.len() > 500);
    // Defaults: the API, no overrides, nothing preloaded.
    let d = eni_operator::config::Settings::try_parse_from(["eni-operator", "--cluster-name=c"])
        .unwrap()
        .core_config();
    assert!(d.limits_via_api && d.limit_overrides.is_empty());
    assert!(d.ec2_cache().read().unwrap().limits.is_empty());
    assert!(
        eni_operator::config::Settings::try_parse_from([
            "eni-operator",
            "--aws-instance-limit-mapping=m5.large=3,10"
        ])
        .is_err()
    );
}
