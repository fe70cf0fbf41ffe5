use super::*;
use crate::crd::{AllocationIp, IpamPoolRequest};
use crate::ec2::InstanceState;
use crate::ipam::fixtures::*;
use crate::ipam::ownership::{CLUSTER_TAG, INSTANCE_TAG};
use std::time::Duration;

fn run(node: &CiliumNode, w: &World, config: &IpamConfig, pending: u32) -> NodePlan {
    plan_node(
        node,
        &w.view(),
        config,
        &mut NodeMemory::new(),
        Instant::now(),
        pending,
    )
}

fn pd_config() -> IpamConfig {
    IpamConfig {
        prefix_delegation: true,
        cluster_name: "prod".into(),
        ..Default::default()
    }
}

fn reason(p: &NodePlan) -> Option<ProblemReason> {
    p.problem.as_ref().map(|p| p.reason)
}

/// The default world with its primary ENI full (9 secondary addresses).
fn first_eni_full() -> World {
    let mut w = World::new();
    w.enis[0] = eni_with_ips("eni-0", 0, "subnet-a", 9);
    w
}

/// Why planning `n` on `w` with the default settings and no pending pods stops, if it does.
fn problem(n: &CiliumNode, w: &World) -> Option<ProblemReason> {
    reason(&run(n, w, &IpamConfig::default(), 0))
}

/// One change to a default value.
type Change<T> = fn(&mut T);

#[test]
fn problems_stop_planning() {
    let w = World::new();
    let cfg = IpamConfig::default();
    // Each node, then each world, differs from the default in one way that stops planning.
    let nodes: [(Change<CiliumNode>, ProblemReason); 3] = [
        (
            |n| n.spec.instance_id.clear(),
            ProblemReason::MissingInstanceId,
        ),
        (
            |n| n.spec.ipam.pre_allocate = -2,
            ProblemReason::InvalidSpec,
        ),
        (
            |n| n.spec.eni.first_interface_index = Some(-1),
            ProblemReason::InvalidSpec,
        ),
    ];
    for (i, (change, expected)) in nodes.into_iter().enumerate() {
        let mut n = node();
        change(&mut n);
        assert_eq!(problem(&n, &w), Some(expected), "node {i}");
    }
    let worlds: [(&str, Change<World>, ProblemReason); 5] = [
        (
            "unknown",
            |w| w.presence = Presence::Unknown,
            ProblemReason::InstanceNotFound,
        ),
        (
            "no ENIs",
            |w| w.enis.clear(),
            ProblemReason::InstanceNotFound,
        ),
        (
            "another instance's ENIs",
            |w| w.enis[0].attachment.as_mut().unwrap().instance_id = "i-other".into(),
            ProblemReason::InstanceNotFound,
        ),
        (
            "gone",
            |w| w.presence = Presence::Gone,
            ProblemReason::InstanceGone,
        ),
        (
            "shutting down",
            |w| w.instance.state = InstanceState::ShuttingDown,
            ProblemReason::InstanceGone,
        ),
    ];
    for (what, change, expected) in worlds {
        let mut changed = World::new();
        change(&mut changed);
        assert_eq!(problem(&node(), &changed), Some(expected), "{what}");
    }
    let mut no_limits = World::new();
    no_limits.limits = None;
    let p = run(&node(), &no_limits, &cfg, 0);
    assert_eq!(reason(&p), Some(ProblemReason::UnknownInstanceType));
    assert_eq!(p.action, Action::None);
}

#[test]
fn top_up_first_eni_by_device_index_with_watermark_and_surge() {
    let mut w = World::new();
    w.enis.push(eni_with_ips("eni-2", 2, "subnet-b", 2));
    w.enis.push(eni_with_ips("eni-1", 1, "subnet-a", 0));
    let mut n = node();
    n.spec.ipam.max_above_watermark = 1;
    // A = 2, U = 0, P = 8: needed 6; W 1; pending 7 -> surge 1; room on eni-0: 9.
    let p = run(&n, &w, &IpamConfig::default(), 7);
    assert_eq!(p.demand.needed, 6);
    let Action::Assign(a) = p.action else {
        panic!("{:?}", p.action)
    };
    assert_eq!(a.eni_id, "eni-0");
    assert_eq!(a.request, AddressRequest::Ips(8));
    assert_eq!(a.fallback_ips, None);
}

#[test]
fn top_up_bounded_by_subnet_and_room_and_max() {
    let mut w = World::new();
    w.subnets.get_mut("subnet-a").unwrap().available_addresses = 3;
    let mut n = node();
    n.spec.ipam.min_allocate = 20;
    let p = run(&n, &w, &IpamConfig::default(), 0);
    assert_eq!(
        p.action,
        Action::Assign(Assign {
            eni_id: "eni-0".into(),
            subnet_id: "subnet-a".into(),
            request: AddressRequest::Ips(3),
            fallback_ips: None
        })
    );
    let mut w = World::new();
    w.enis[0] = eni_with_ips("eni-0", 0, "subnet-a", 7);
    n.spec.ipam.max_allocate = 8;
    let p = run(&n, &w, &IpamConfig::default(), 50);
    assert_eq!(
        p.action_request(),
        Some(AddressRequest::Ips(1)),
        "max-allocate"
    );
}

impl NodePlan {
    fn action_request(&self) -> Option<AddressRequest> {
        match &self.action {
            Action::Assign(a) => Some(a.request),
            _ => None,
        }
    }
}

#[test]
fn prefix_node_requests_whole_prefixes_with_fallback() {
    let w = World::new();
    let mut n = node();
    n.spec.ipam.min_allocate = 20;
    let p = run(&n, &w, &pd_config(), 0);
    let Action::Assign(a) = p.action else {
        panic!()
    };
    assert_eq!(a.request, AddressRequest::Prefixes(2));
    assert_eq!(a.fallback_ips, Some(9));
    // Subnet cooling down: single addresses straight away.
    let mut cool = World::new();
    cool.cooldown.insert("subnet-a".into(), Instant::now());
    let p = run(&n, &cool, &pd_config(), 0);
    assert_eq!(p.action_request(), Some(AddressRequest::Ips(9)));
}

#[test]
fn create_eni_when_full_with_everything_inline() {
    let mut w = first_eni_full();
    w.enis[0].security_groups = vec!["sg-b".into(), "sg-a".into()];
    let mut n = node();
    n.spec.ipam.min_allocate = 17; // 9 available: a deficit of 8
    let cfg = IpamConfig {
        cluster_name: "prod".into(),
        eni_tags: tags(&[("team", "net")]),
        ..Default::default()
    };
    let p = run(&n, &w, &cfg, 0);
    let Action::CreateEni(c) = p.action else {
        panic!("{:?}", p.action)
    };
    assert_eq!(c.device_index, 1);
    assert!(c.delete_on_termination);
    assert_eq!(c.attempts.len(), 1);
    let r = &c.attempts[0];
    assert_eq!(r.subnet_id, "subnet-a");
    assert_eq!(r.security_groups, ["sg-a", "sg-b"]);
    assert_eq!(r.description, "Cilium-CNI (i-1)");
    assert_eq!(r.tags.get(CLUSTER_TAG).unwrap(), "prod");
    assert_eq!(r.tags.get(INSTANCE_TAG).unwrap(), "i-1");
    assert_eq!(r.tags.get("team").unwrap(), "net");
    assert_eq!(r.addresses, AddressRequest::Ips(8));
    n.spec.eni.delete_on_termination = Some(false);
    let Action::CreateEni(c) = run(&n, &w, &cfg, 0).action else {
        panic!()
    };
    assert!(!c.delete_on_termination);
}

#[test]
fn create_eni_prefix_attempts_order() {
    let mut w = first_eni_full();
    w.add_subnet(subnet("subnet-c", "10.0.32.0/20", 300));
    w.add_subnet(subnet("subnet-d", "10.0.48.0/20", 30));
    w.cooldown.insert("subnet-c".into(), Instant::now());
    let mut n = node();
    n.spec.eni.subnet_ids = vec!["subnet-b".into(), "subnet-c".into(), "subnet-d".into()];
    n.spec.ipam.min_allocate = 9 + 40;
    let p = run(&n, &w, &pd_config(), 0);
    let Action::CreateEni(c) = p.action else {
        panic!("{:?}", p.action)
    };
    let got: Vec<(String, AddressRequest)> = c
        .attempts
        .iter()
        .map(|a| (a.subnet_id.clone(), a.addresses))
        .collect();
    // Chosen: most free among the listed, subnet-c, but it cools down for /28s.
    assert_eq!(
        got,
        [
            ("subnet-b".to_string(), AddressRequest::Prefixes(3)),
            ("subnet-d".to_string(), AddressRequest::Prefixes(1)),
            ("subnet-c".to_string(), AddressRequest::Ips(9)),
        ]
    );
    let tokens: std::collections::BTreeSet<&str> =
        c.attempts.iter().map(|a| a.client_token.as_str()).collect();
    assert_eq!(tokens.len(), 3, "one token per intent");
}

#[test]
fn a_retired_token_is_not_reused_for_the_next_create() {
    let w = first_eni_full();
    let mut n = node();
    n.spec.ipam.min_allocate = 17;
    let cfg = IpamConfig::default();
    let mut mem = NodeMemory::new();
    let token = |mem: &mut NodeMemory| match plan_node(&n, &w.view(), &cfg, mem, Instant::now(), 0)
        .action
    {
        Action::CreateEni(c) => c.attempts[0].client_token.clone(),
        other => panic!("{other:?}"),
    };
    let first = token(&mut mem);
    assert_eq!(
        first,
        token(&mut mem),
        "a retry of the same intent repeats it"
    );
    mem.retire_eni_token();
    assert_ne!(
        first,
        token(&mut mem),
        "same instance, index, subnet, attached set"
    );
}

#[test]
fn at_capacity_and_full_subnets() {
    let mut w = World::new();
    w.enis = vec![
        eni_with_ips("eni-0", 0, "subnet-a", 9),
        eni_with_ips("eni-1", 1, "subnet-a", 9),
        eni_with_ips("eni-2", 2, "subnet-a", 9),
    ];
    let mut n = node();
    n.spec.ipam.min_allocate = 40;
    assert_eq!(
        run(&n, &w, &IpamConfig::default(), 0).demand.needed,
        0,
        "instance max"
    );
    n.spec.ipam.max_allocate = 100; // above the instance maximum of 27
    let p = run(&n, &w, &IpamConfig::default(), 0);
    assert_eq!(reason(&p), Some(ProblemReason::AtCapacity));
    assert_eq!(p.action, Action::None);
    w.enis[2] = eni_with_ips("eni-2", 2, "subnet-a", 1);
    w.subnets.get_mut("subnet-a").unwrap().available_addresses = 0;
    assert_eq!(problem(&n, &w), Some(ProblemReason::NoMatchingSubnet));
}

#[test]
fn create_eni_reports_selection_problems() {
    let w = first_eni_full();
    let mut n = node();
    n.spec.ipam.min_allocate = 20;
    n.spec.eni.subnet_ids = vec!["subnet-x".into()];
    assert_eq!(problem(&n, &w), Some(ProblemReason::NoMatchingSubnet));
    n.spec.eni.subnet_ids.clear();
    n.spec.eni.security_group_tags = tags(&[("k", "v")]);
    assert_eq!(problem(&n, &w), Some(ProblemReason::NoSecurityGroups));
}

#[test]
fn excluded_enis_are_not_used_or_counted() {
    let mut w = World::new();
    w.enis[0] = eni_with_ips("eni-0", 0, "subnet-a", 5);
    w.enis.push(eni_with_ips("eni-1", 1, "subnet-a", 0));
    let mut n = node();
    n.spec.eni.first_interface_index = Some(1);
    let p = run(&n, &w, &IpamConfig::default(), 0);
    assert_eq!(p.demand.available, 0);
    let Action::Assign(a) = p.action else {
        panic!()
    };
    assert_eq!(a.eni_id, "eni-1");
}

#[test]
fn multi_pool_demand_from_requested() {
    let w = World::new();
    let mut n = node();
    let mut req = IpamPoolRequest {
        pool: "default".into(),
        ..Default::default()
    };
    req.needed.ipv4_addrs = 5;
    n.spec.ipam.pools.requested.push(req);
    let p = run(&n, &w, &IpamConfig::default(), 0);
    assert_eq!(p.demand.generation, Generation::MultiPool);
    assert_eq!((p.demand.used, p.demand.needed), (0, 8));
    n.status
        .as_mut()
        .unwrap()
        .ipam
        .used
        .insert("10.0.0.9".into(), AllocationIp::default());
    assert_eq!(
        run(&n, &w, &IpamConfig::default(), 0).demand.generation,
        Generation::Classic
    );
}

#[test]
fn release_comes_before_allocation_and_needs_the_delay() {
    let mut w = first_eni_full();
    w.enis.push(eni_with_ips("eni-1", 1, "subnet-a", 9));
    let n = node();
    let cfg = IpamConfig {
        release_excess_ips: true,
        release_delay: Duration::from_secs(1),
        ..Default::default()
    };
    let mut mem = NodeMemory::new();
    let t0 = Instant::now();
    let p = plan_node(&n, &w.view(), &cfg, &mut mem, t0, 0);
    assert_eq!(p.demand.excess, 10);
    assert_eq!(p.action, Action::None);
    let p = plan_node(
        &n,
        &w.view(),
        &cfg,
        &mut mem,
        t0 + Duration::from_secs(1),
        0,
    );
    assert_eq!(p.action, Action::None, "proposed, waiting for the agent");
    assert_eq!(
        mem.proposed().count(),
        10,
        "the fullest ENIs, together capped at the excess"
    );
}
