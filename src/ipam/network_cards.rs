//! Instances with several network cards and EFA interfaces (p4d, p5, trn; docs/rules.md §5.4),
//! with the engine's pure functions: the primary ENI is card 0's device 0, only ENA
//! `interface`s serve pods, new ENIs go on card 0 within its own interface limit. The ENI
//! lists put an EFA interface first on purpose: EC2's describe order is not the card order.

use std::net::Ipv4Addr;
use std::time::Instant;

use super::capacity::{is_excluded, usable_addresses};
use super::fixtures::*;
use super::selection::{next_device_index, select_security_groups};
use super::static_ip::primary_eni;
use super::{Action, IpamConfig, NodeMemory, plan_node};
use crate::ec2::{InstanceTypeLimits, InterfaceType, NetworkInterface};

/// p5.48xlarge as DescribeInstanceTypes reports it: 64 interfaces, 32 cards of 2 each.
fn p5() -> InstanceTypeLimits {
    InstanceTypeLimits {
        instance_type: "t.test".into(),
        max_enis: 64,
        ipv4_per_eni: 50,
        ipv6_per_eni: 50,
        nitro: true,
        bare_metal: false,
        enis_per_card: vec![2; 32],
    }
}

/// An interface at device 0 of network card `card`.
fn on_card(id: &str, card: u32, kind: InterfaceType) -> NetworkInterface {
    let mut e = eni(id, 0, "subnet-a");
    e.attachment.as_mut().unwrap().network_card_index = card;
    e.security_groups = vec!["sg-efa".into()];
    e.primary_ip = if kind == InterfaceType::EfaOnly {
        Ipv4Addr::UNSPECIFIED
    } else {
        Ipv4Addr::new(10, 0, 254, card as u8)
    };
    e.interface_type = kind;
    e
}

/// EFA interfaces on cards 1 and 2 listed before the primary (card 0, device 0, `sg-0`).
fn p5_world() -> World {
    let mut w = World::new();
    w.limits = Some(p5());
    w.enis = vec![
        on_card("eni-efa", 1, InterfaceType::Efa),
        on_card("eni-efa-only", 2, InterfaceType::EfaOnly),
        eni("eni-0", 0, "subnet-a"),
    ];
    w
}

#[test]
fn the_primary_eni_is_card_0_device_0() {
    let w = p5_world();
    let primary = primary_eni(INSTANCE, &w.enis).expect("a primary");
    assert_eq!(
        primary.id, "eni-0",
        "never an EFA at device 0 of another card"
    );
}

#[test]
fn new_enis_take_the_primarys_groups_never_an_efas() {
    let w = p5_world();
    let groups = select_security_groups(&node(), &w.view(), &w.enis).unwrap();
    assert_eq!(groups, ["sg-0"]);
    // A primary that is itself an EFA: no groups inherited, the node is told why.
    let mut efa_primary = p5_world();
    efa_primary.enis[2].interface_type = InterfaceType::Efa;
    let err = select_security_groups(&node(), &efa_primary.view(), &efa_primary.enis);
    assert!(err.is_err(), "{err:?}");
}

#[test]
fn efa_interfaces_never_serve_pods() {
    let w = p5_world();
    let spec = &node().spec.eni;
    assert!(is_excluded(&w.enis[0], spec), "efa");
    assert!(is_excluded(&w.enis[1], spec), "efa-only");
    assert!(!is_excluded(&w.enis[2], spec), "the primary");
    // An efa-only interface has no address, and 0.0.0.0 is never offered.
    assert!(usable_addresses(&w.enis[1], true).is_empty());
}

#[test]
fn new_enis_go_on_card_0_within_its_own_limit() {
    let w = p5_world();
    // Card 0 takes 2: the primary and one more; EFAs on other cards' device 0 do not count.
    assert_eq!(next_device_index(&w.enis, 1, p5().pod_max_enis()), Some(1));
    let mut full = w.enis.clone();
    full.push(eni("eni-pods", 1, "subnet-a"));
    assert_eq!(next_device_index(&full, 1, p5().pod_max_enis()), None);
}

#[test]
fn a_p5_node_is_served_on_card_0_with_the_primary_address_offered() {
    let w = p5_world();
    let cfg = IpamConfig {
        use_primary_address: true,
        ..IpamConfig::default()
    };
    let n = node();
    let mut memory = NodeMemory::default();
    let plan = plan_node(&n, &w.view(), &cfg, &mut memory, Instant::now(), 0);
    match &plan.action {
        Action::Assign(a) => assert_eq!(a.eni_id, "eni-0", "{plan:?}"),
        other => panic!("expected addresses on the primary, got {other:?}"),
    }
    // The published view: no EFA address, no 0.0.0.0.
    let desired = super::desired_state(&n, &w.view(), &cfg, &memory, None);
    let pool: Vec<&String> = desired.pool.as_ref().expect("complete").keys().collect();
    assert!(
        pool.contains(&&"10.0.255.1".to_string()),
        "the primary's own: {pool:?}"
    );
    assert!(
        pool.iter()
            .all(|ip| ip.as_str() != "0.0.0.0" && !ip.starts_with("10.0.254.")),
        "no EFA address and no 0.0.0.0: {pool:?}"
    );
}
