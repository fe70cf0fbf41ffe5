//! The allocation core against moto's EC2 server: the real SDK client on the wire, behind the
//! gate, with a `MemorySink` in place of the API server. The simulator proves AWS's rules; this
//! proves the core's describes, filters and call sequence work with a real EC2 endpoint, and that
//! an emulator that silently ignores /28 prefixes does not make the operator loop.

// Shared with the contract suite; this file uses only part of the seeded world.
#[allow(dead_code)]
use std::sync::Arc;
use std::time::Duration;

use crate::support::moto::{MotoServer, aws_ec2, seed};
use eni_operator::crd::CiliumNode;
use eni_operator::ec2::gate::{Gate, GateConfig};
use eni_operator::ec2::{Ec2, EniFilter, Operation};
use eni_operator::event_loop::core::{CoreConfig, NodeInput};
use eni_operator::ipam::IpamConfig;
use eni_operator::ipam::ownership::ownership_tags;
use eni_operator::reconcile::metrics::RuntimeMetrics;
use testkit::sink::MemorySink;
use testkit::world::{SeededInstance, World};
use testkit::{every_page, wait_until};

const CLUSTER: &str = "moto-test";

/// A CiliumNode as a classic agent writes it at start: no pool yet, primary ENI not for pods.
fn agent_node(world: &World, name: &str, instance: &SeededInstance, min: i64) -> CiliumNode {
    let mut n = CiliumNode::new(name, Default::default());
    n.spec.instance_id = instance.id.clone();
    n.spec.eni.instance_type = instance.instance_type.clone();
    n.spec.eni.vpc_id = world.vpc_id.clone();
    n.spec.eni.availability_zone = instance.availability_zone.clone();
    n.spec.eni.node_subnet_id = instance.subnet_id.clone();
    n.spec.eni.first_interface_index = Some(1);
    n.spec.ipam.min_allocate = min;
    n
}

/// C2 + demand: every pool address is on its ENI in status, and the node's pod ENIs hold
/// enough addresses. Counted per ENI, not as unique pool keys: moto hands out the same address
/// on two ENIs (docs/emulators.md), which AWS never does.
fn served(sink: &MemorySink, name: &str, want: usize) -> bool {
    let Some(n) = sink.get(name) else {
        return false;
    };
    let enis = n.status.map(|s| s.eni.enis).unwrap_or_default();
    let held: usize = enis
        .values()
        .filter(|e| e.number >= 1)
        .map(|e| e.addresses.len())
        .sum();
    held >= want
        && n.spec.ipam.pool.iter().all(|(ip, a)| {
            enis.get(&a.resource)
                .is_some_and(|e| e.addresses.iter().any(|x| x == ip))
        })
}

async fn start(
    server: &MotoServer,
    prefix_delegation: bool,
) -> (
    Arc<Gate<eni_operator::ec2::aws::AwsEc2>>,
    Arc<MemorySink>,
    tokio::sync::mpsc::Sender<NodeInput>,
) {
    let gate = Arc::new(Gate::new(
        aws_ec2(server.endpoint()).await,
        GateConfig::aws_defaults(),
    ));
    let sink = Arc::new(MemorySink::new());
    let config = CoreConfig {
        workers: 8,
        resync_interval: Duration::from_secs(2),
        node_rescan_interval: Duration::from_secs(1),
        instance_refresh_spacing: Duration::from_secs(1),
        ipam: IpamConfig {
            cluster_name: CLUSTER.into(),
            prefix_delegation,
            ..IpamConfig::default()
        },
        ..CoreConfig::default()
    };
    let tx = testkit::running::start_shared(
        gate.clone(),
        sink.clone(),
        config,
        RuntimeMetrics::default(),
    )
    .tx;
    (gate, sink, tx)
}

#[tokio::test]
async fn classic_nodes_get_new_enis_with_our_tags_over_the_wire() {
    let server = MotoServer::start();
    let world = seed(server.endpoint()).await;
    let (gate, sink, tx) = start(&server, false).await;
    // m5.large holds 9 addresses per ENI and t3.medium 5 (primary excluded): both need two ENIs.
    let nodes = [
        ("node-a", &world.instances[0], 12),
        ("node-b", &world.instances[1], 8),
    ];
    for (name, instance, min) in nodes {
        let n = sink.put(&agent_node(&world, name, instance, min));
        tx.send(NodeInput::Upsert(Box::new(n))).await.unwrap();
    }
    for (name, _, min) in nodes {
        assert!(
            wait_until(
                || served(&sink, name, min as usize),
                Duration::from_secs(60)
            )
            .await,
            "{name} not served: {:?}",
            sink.get(name).map(|n| n.status)
        );
        let node = sink.get(name).unwrap();
        let status = node.status.unwrap();
        assert_eq!(status.ipam.operator_status.error, None, "{name}");
        // The primary ENI is listed (C5) but none of its addresses is in the pool.
        let primary =
            &status.eni.enis[&nodes.iter().find(|n| n.0 == name).unwrap().1.primary_eni_id];
        assert!(primary.number == 0 && !primary.vpc.primary_cidr.is_empty());
        assert!(
            node.spec
                .ipam
                .pool
                .values()
                .all(|a| a.resource != primary.id)
        );
    }

    // Every ENI we created carries our ownership tags, is attached to its node's instance, and
    // nothing we own is left unattached.
    for instance in &world.instances[..2] {
        let filter = EniFilter {
            tags: ownership_tags(CLUSTER, &instance.id),
            ..EniFilter::default()
        };
        let ours = every_page(|t| gate.describe_network_interfaces(&filter, t)).await;
        assert!(!ours.is_empty(), "{} got an ENI of ours", instance.id);
        for eni in &ours {
            assert_eq!(eni.instance_id(), Some(instance.id.as_str()), "{}", eni.id);
            assert!(eni.device_index().unwrap() >= 1);
        }
    }
    let stats = gate.stats();
    let creates = stats.calls[&Operation::CreateNetworkInterface];
    let attaches = stats.calls[&Operation::AttachNetworkInterface];
    assert_eq!(creates, attaches, "every ENI created was attached once");
    // node-a: 12 = 9 + 3 on two ENIs; node-b: the default pre-allocate of 8 = 5 + 3, two ENIs.
    assert_eq!(
        creates, 4,
        "exactly the ENIs demand needs: {:?}",
        stats.calls
    );
    assert_eq!(stats.total_throttled(), 0);
}

#[tokio::test]
async fn an_emulator_that_ignores_prefixes_does_not_make_the_operator_loop() {
    let server = MotoServer::start();
    let world = seed(server.endpoint()).await;
    let (gate, sink, tx) = start(&server, true).await;
    // m5.large is Nitro: prefix delegation applies, but moto hands back no prefix at all.
    let n = sink.put(&agent_node(&world, "pd", &world.instances[0], 12));
    tx.send(NodeInput::Upsert(Box::new(n))).await.unwrap();
    let served_in_time = wait_until(|| served(&sink, "pd", 12), Duration::from_secs(60)).await;
    // Whatever the outcome, the operator must settle: no more mutating calls over several
    // resyncs once it has given its answer.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mutating = |s: &eni_operator::ec2::gate::GateStats| -> u64 {
        s.calls
            .iter()
            .filter(|(op, _)| op.is_mutating())
            .map(|(_, n)| n)
            .sum()
    };
    let settled = mutating(&gate.stats());
    tokio::time::sleep(Duration::from_secs(6)).await;
    let later = gate.stats();
    assert_eq!(
        mutating(&later),
        settled,
        "mutating calls kept coming: {:?}",
        later.calls
    );
    assert!(later.calls[&Operation::CreateNetworkInterface] <= 3);
    let status = sink.get("pd").unwrap().status.unwrap_or_default();
    assert!(served_in_time, "served with single addresses: {status:?}");
    assert!(
        sink.events("pd")
            .iter()
            .any(|e| e.warning && e.reason == "PrefixesNotGranted"),
        "the fallback is reported on the node: {:?}",
        sink.events("pd")
    );
}
