//! Issue 29 item 4: instances with several network cards and EFA interfaces (p4d, p5, trn),
//! end to end through the core against the simulator (docs/rules.md §5.4). The EFAs are
//! launched with the instance and listed before its primary ENI (EC2 lists by ID, not by card).

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Duration;

use eni_operator::crd::CiliumNode;
use eni_operator::ec2::gate::{Gate, GateConfig};
use eni_operator::ec2::{Instance, InterfaceType, NetworkInterface, Tags};
use eni_operator::event_loop::core::NodeInput;
use eni_operator::ipam::ownership::CLUSTER_TAG;
use eni_operator::reconcile::metrics::RuntimeMetrics;
use testkit::cluster::{Cluster, agent_node};
use testkit::running;
use testkit::sim::{Efa, Simulator};
use testkit::sink::MemorySink;
use testkit::{served, wait_until};
use tokio::sync::mpsc;

const P5: &str = "p5.48xlarge";

fn start(sim: &Simulator, sink: &Arc<MemorySink>) -> mpsc::Sender<NodeInput> {
    let gate = Gate::new(sim.clone(), GateConfig::aws_defaults());
    running::start(
        gate,
        sink.clone(),
        running::config(4),
        RuntimeMetrics::default(),
    )
    .tx
}

/// A p5 with an `efa` interface on card 1 and `efa-only` ones on cards 2 and 3, all in
/// `efa_sg` (the EFA guide's group that lets all traffic in from itself).
fn p5(w: &Cluster, efa_sg: &str) -> Instance {
    let efa = |card, efa_only| Efa {
        card,
        device_index: 0,
        efa_only,
        groups: vec![efa_sg.to_owned()],
    };
    w.sim
        .try_run_instance_with_efas(
            P5,
            &w.subnet,
            std::slice::from_ref(&w.sg),
            Tags::new(),
            &[efa(1, false), efa(2, true), efa(3, true)],
        )
        .unwrap()
}

fn p5_node(w: &Cluster, name: &str, instance: &str, first_interface_index: i64) -> CiliumNode {
    let mut n = agent_node(w, name, instance, 0);
    n.spec.eni.instance_type = P5.into();
    n.spec.eni.first_interface_index = Some(first_interface_index);
    n
}

async fn add(sink: &MemorySink, tx: &mpsc::Sender<NodeInput>, node: &CiliumNode) {
    let n = sink.put(node);
    tx.send(NodeInput::Upsert(Box::new(n))).await.unwrap();
}

fn enis_of(sim: &Simulator, instance: &str) -> Vec<NetworkInterface> {
    sim.network_interfaces()
        .into_iter()
        .filter(|e| e.instance_id() == Some(instance))
        .collect()
}

fn efas(sim: &Simulator, instance: &str) -> Vec<NetworkInterface> {
    enis_of(sim, instance)
        .into_iter()
        .filter(|e| e.interface_type != InterfaceType::Interface)
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_p5_is_served_on_card_0_and_its_efa_interfaces_are_left_alone() {
    let w = Cluster::new();
    let efa_sg = w.sim.add_security_group(&w.vpc, Tags::new());
    let eip_tags = Tags::from([("pool".to_string(), "egress".to_string())]);
    // The address also carries the tag every address we associate must carry.
    let mut address_tags = eip_tags.clone();
    address_tags.insert(CLUSTER_TAG.to_string(), "test-cluster".to_string());
    w.sim
        .add_address(Ipv4Addr::new(198, 51, 100, 7), address_tags);
    let sink = Arc::new(MemorySink::with_ciliums_crd());
    let tx = start(&w.sim, &sink);

    // "pods": first-interface-index 1, so its pods need a new ENI (card 0 takes two
    // interfaces: the primary and that one); it wants a static IP.
    let a = p5(&w, &efa_sg);
    let mut pods = p5_node(&w, "pods", &a.id, 1);
    pods.spec.ipam.static_ip_tags = eip_tags;
    add(&sink, &tx, &pods).await;
    // "primary": its primary ENI serves pods and offers its primary address.
    let b = p5(&w, &efa_sg);
    let mut primary = p5_node(&w, "primary", &b.id, 0);
    primary.spec.eni.use_primary_address = Some(true);
    add(&sink, &tx, &primary).await;

    let both = || served(&sink, "pods", 8) && served(&sink, "primary", 8);
    assert!(
        wait_until(both, Duration::from_secs(120)).await,
        "pods: {:?}\nprimary: {:?}",
        sink.get("pods").and_then(|n| n.status),
        sink.get("primary").and_then(|n| n.status)
    );

    // The new ENI: ours, on card 0 at device 1, in the primary ENI's group (never the EFA's).
    let ours: Vec<NetworkInterface> = enis_of(&w.sim, &a.id)
        .into_iter()
        .filter(|e| e.tags.contains_key(CLUSTER_TAG))
        .collect();
    assert_eq!(ours.len(), 1, "{ours:?}");
    let att = ours[0].attachment.as_ref().unwrap();
    assert_eq!((att.network_card_index, att.device_index), (0, 1));
    assert_eq!(ours[0].security_groups, std::slice::from_ref(&w.sg));
    // The static IP is on the primary ENI (card 0, device 0), never on an EFA.
    let primary_eni = w.sim.primary_eni_id(&a.id).unwrap();
    let on: Vec<Option<String>> = w
        .sim
        .addresses()
        .into_iter()
        .map(|a| a.network_interface_id)
        .collect();
    assert_eq!(on, [Some(primary_eni)]);

    // No EFA interface got an address or lent one to a pool; 0.0.0.0 is nobody's.
    for instance in [&a.id, &b.id] {
        for e in efas(&w.sim, instance) {
            assert!(e.secondary_ips.is_empty() && e.prefixes.is_empty(), "{e:?}");
        }
    }
    let efa_ips: BTreeSet<String> = efas(&w.sim, &b.id)
        .iter()
        .map(|e| e.primary_ip.to_string())
        .collect();
    let pool = sink.get("primary").unwrap().spec.ipam.pool;
    assert!(!pool.contains_key("0.0.0.0"), "{pool:?}");
    assert!(pool.keys().all(|ip| !efa_ips.contains(ip)), "{pool:?}");
    let b_primary = w.sim.primary_eni_id(&b.id).unwrap();
    let b_ip = w.sim.network_interface(&b_primary).unwrap().primary_ip;
    assert!(
        pool.contains_key(&b_ip.to_string()),
        "the primary address is offered"
    );
    // Served without a failing top-up on an efa-only interface.
    for name in ["pods", "primary"] {
        let status = sink.get(name).unwrap().status.unwrap();
        assert_eq!(status.ipam.operator_status.error, None, "{name}");
    }
}
