use super::*;
use crate::ipam::fixtures::*;
use crate::ipam::{Action, Release, plan_node};
use std::time::{Duration, Instant};

fn world_with_prefix() -> World {
    let mut w = World::new();
    let mut e = eni_with_ips("eni-1", 1, "subnet-b", 2);
    e.prefixes = vec![net("10.0.16.32/28")];
    e.tags = tags(&[("k", "v")]);
    w.enis.push(e);
    w
}

fn check_c2_c3(d: &DesiredState) {
    let enis = d.enis.as_ref().unwrap();
    for (ip, entry) in d.pool.as_ref().unwrap() {
        let eni = enis.get(&entry.resource).expect("C2: ENI in status");
        assert!(eni.addresses.contains(ip), "C2: {ip} in {}", entry.resource);
    }
    for eni in enis.values() {
        for p in &eni.prefixes {
            for a in crate::ec2::prefix_addresses(net(p)) {
                assert!(eni.addresses.contains(&a.to_string()), "C3");
            }
        }
        assert!(!eni.vpc.primary_cidr.is_empty(), "C4");
        assert!(!eni.subnet.cidr.is_empty(), "C4");
    }
}

#[test]
fn desired_lists_every_eni_and_pools_usable_ones() {
    let w = world_with_prefix();
    let mut n = node();
    n.spec.eni.first_interface_index = Some(1);
    let d = desired_state(
        &n,
        &w.view(),
        &IpamConfig::default(),
        &NodeMemory::new(),
        None,
    );
    let enis = d.enis.as_ref().unwrap();
    assert_eq!(enis.len(), 2, "excluded primary ENI listed (C5)");
    let e1 = &enis["eni-1"];
    assert_eq!(e1.addresses.len(), 18);
    assert_eq!(e1.number, 1);
    assert_eq!(e1.subnet.cidr, "10.0.16.0/20");
    assert_eq!(e1.vpc.primary_cidr, "10.0.0.0/16");
    assert_eq!(e1.vpc.cidrs, ["100.64.0.0/16"]);
    assert!(!e1.addresses.contains(&e1.ip), "primary not offered");
    let pool = d.pool.as_ref().unwrap();
    assert_eq!(pool.len(), 18, "excluded ENI not pooled");
    assert!(pool.values().all(|a| a.resource == "eni-1"));
    assert_eq!(d.summary.enis, 2);
    assert_eq!(d.summary.available, 18);
    assert_eq!(d.operator_error, None);
    check_c2_c3(&d);

    let cfg = IpamConfig {
        use_primary_address: true,
        ..Default::default()
    };
    let d = desired_state(&n, &w.view(), &cfg, &NodeMemory::new(), None);
    let e1 = &d.enis.as_ref().unwrap()["eni-1"];
    assert!(e1.addresses.contains(&e1.ip));
    assert_eq!(d.pool.as_ref().unwrap().len(), 19);
    check_c2_c3(&d);
}

#[test]
fn incomplete_ec2_data_publishes_nothing() {
    let mut w = world_with_prefix();
    w.vpcs.clear();
    let d = desired_state(
        &node(),
        &w.view(),
        &IpamConfig::default(),
        &NodeMemory::new(),
        None,
    );
    assert_eq!((d.enis.is_none(), d.pool.is_none()), (true, true));
    assert!(d.operator_error.unwrap().starts_with("IncompleteEc2Data"));
    let mut w = world_with_prefix();
    w.subnets.remove("subnet-b");
    let d = desired_state(
        &node(),
        &w.view(),
        &IpamConfig::default(),
        &NodeMemory::new(),
        None,
    );
    assert!(d.enis.is_none());
    assert!(d.operator_error.unwrap().contains("subnet-b"));
    let ch = changes(
        &node(),
        &desired_state(
            &node(),
            &w.view(),
            &IpamConfig::default(),
            &NodeMemory::new(),
            None,
        ),
    );
    assert!(
        ch.writes
            .iter()
            .all(|wr| wr.subresource == Subresource::Status)
    );
}

#[test]
fn given_problem_becomes_operator_error_and_clears() {
    let w = World::new();
    let p = Problem {
        reason: ProblemReason::AtCapacity,
        message: "full".into(),
    };
    let d = desired_state(
        &node(),
        &w.view(),
        &IpamConfig::default(),
        &NodeMemory::new(),
        Some(&p),
    );
    assert_eq!(d.operator_error.as_deref(), Some("AtCapacity: full"));
    let n1 = apply(&node(), &changes(&node(), &d));
    assert_eq!(
        n1.status
            .as_ref()
            .unwrap()
            .ipam
            .operator_status
            .error
            .as_deref(),
        Some("AtCapacity: full")
    );
    let healthy = desired_state(
        &n1,
        &w.view(),
        &IpamConfig::default(),
        &NodeMemory::new(),
        None,
    );
    let ch = changes(&n1, &healthy);
    assert_eq!(ch.writes.len(), 1);
    assert_eq!(
        ch.writes[0].patch,
        json!({"status": {"ipam": {"operator-status": {"error": null}}}})
    );
}

#[test]
fn changes_are_ordered_minimal_and_converge() {
    let w = world_with_prefix();
    let cfg = IpamConfig::default();
    let d = desired_state(&node(), &w.view(), &cfg, &NodeMemory::new(), None);
    let ch = changes(&node(), &d);
    let kinds: Vec<Subresource> = ch.writes.iter().map(|w| w.subresource).collect();
    assert_eq!(
        kinds,
        [Subresource::Status, Subresource::Spec],
        "C1: status first"
    );
    let n1 = apply(&node(), &ch);
    assert!(changes(&n1, &d).is_empty(), "nothing left to write");

    // Order-insensitive: shuffled lists in the object are not a change.
    let mut shuffled = n1.clone();
    for e in shuffled.status.as_mut().unwrap().eni.enis.values_mut() {
        e.addresses.reverse();
    }
    assert!(changes(&shuffled, &d).is_empty());

    // Release: the /28 goes; pool removals come before status.
    let mut w2 = w.clone();
    w2.enis[1].prefixes.clear();
    w2.enis[1].tags.clear();
    let d2 = desired_state(&n1, &w2.view(), &cfg, &NodeMemory::new(), None);
    let ch2 = changes(&n1, &d2);
    let kinds: Vec<Subresource> = ch2.writes.iter().map(|w| w.subresource).collect();
    assert_eq!(kinds, [Subresource::Spec, Subresource::Status]);
    let pool_patch = &ch2.writes[0].patch["spec"]["ipam"]["pool"];
    assert_eq!(pool_patch.as_object().unwrap().len(), 16);
    assert!(pool_patch.as_object().unwrap().values().all(Value::is_null));
    let eni_patch = &ch2.writes[1].patch["status"]["eni"]["enis"]["eni-1"];
    assert_eq!(eni_patch["tags"], json!(null), "removed tags nulled");
    assert_eq!(eni_patch["prefixes"], json!(null));
    let n2 = apply(&n1, &ch2);
    assert!(changes(&n2, &d2).is_empty());
    assert_eq!(n2.spec.ipam.pool.len(), 2);

    // A removed ENI is nulled.
    let mut w3 = w2.clone();
    w3.enis.pop();
    let d3 = desired_state(&n2, &w3.view(), &cfg, &NodeMemory::new(), None);
    let ch3 = changes(&n2, &d3);
    let status = ch3
        .writes
        .iter()
        .find(|w| w.subresource == Subresource::Status)
        .unwrap();
    assert_eq!(status.patch["status"]["eni"]["enis"]["eni-1"], json!(null));
    assert!(!status.needs_resource_version);
}

/// The change set applied one write at a time, C2 checked after each (what an agent may read).
fn apply_checking_c2(node: &CiliumNode, set: &ChangeSet) -> CiliumNode {
    let mut seen = node.clone();
    for write in &set.writes {
        let one = ChangeSet {
            writes: vec![write.clone()],
        };
        seen = apply(&seen, &one);
        assert_eq!(
            c2_violations(&seen),
            Vec::<String>::new(),
            "after {}",
            write.patch
        );
    }
    seen
}

/// An address the cache now has on another ENI of the node (moto hands an address out twice
/// and the cache keeps it on one ENI): its pool entry changes ENI. After every single write the
/// pool's ENI still lists it (C2), or the agent ignores the update and pods wait.
#[test]
fn an_address_moving_to_another_eni_keeps_c2_after_every_write() {
    let cfg = IpamConfig::default();
    let mut w = World::new();
    w.enis.push(eni_with_ips("eni-1", 1, "subnet-b", 2));
    w.enis.push(eni_with_ips("eni-2", 2, "subnet-b", 2));
    let d = desired_state(&node(), &w.view(), &cfg, &NodeMemory::new(), None);
    let n1 = apply(&node(), &changes(&node(), &d));
    assert_eq!(c2_violations(&n1), Vec::<String>::new());

    let moved = w.enis[2].secondary_ips.remove(0);
    w.enis[1].secondary_ips.push(moved);
    let d2 = desired_state(&n1, &w.view(), &cfg, &NodeMemory::new(), None);
    check_c2_c3(&d2);
    let seen = apply_checking_c2(&n1, &changes(&n1, &d2));
    assert_eq!(seen.spec.ipam.pool[&moved.to_string()].resource, "eni-1");
    let enis = &seen.status.as_ref().unwrap().eni.enis;
    assert!(!enis["eni-2"].addresses.contains(&moved.to_string()));
    assert!(
        changes(&seen, &d2).is_empty(),
        "converged in one change set"
    );

    // The ENI it was on leaves at the same time: its entry stays until the pool has moved.
    let mut w3 = World::new();
    w3.enis.push(eni_with_ips("eni-1", 1, "subnet-b", 2));
    w3.enis[1].secondary_ips.push(ip("10.0.102.2"));
    let d3 = desired_state(&n1, &w3.view(), &cfg, &NodeMemory::new(), None);
    let seen = apply_checking_c2(&n1, &changes(&n1, &d3));
    assert!(!seen.status.as_ref().unwrap().eni.enis.contains_key("eni-2"));
    assert!(changes(&seen, &d3).is_empty());
}

/// Cilium's CRD prunes `status.eni-operator`: a node that is otherwise current gets no
/// write for the summary alone, or every resync would patch every node.
#[test]
fn pruned_summary_alone_is_not_rewritten() {
    let w = world_with_prefix();
    let cfg = IpamConfig::default();
    let d = desired_state(&node(), &w.view(), &cfg, &NodeMemory::new(), None);
    let n1 = apply(&node(), &changes(&node(), &d));
    assert!(
        n1.status.as_ref().unwrap().eni_operator.is_some(),
        "written along with the first status write"
    );
    // What the API server stores under Cilium's CRD.
    let mut pruned = n1.clone();
    pruned.status.as_mut().unwrap().eni_operator = None;
    assert!(
        changes(&pruned, &d).is_empty(),
        "{:?}",
        changes(&pruned, &d)
    );
}

#[test]
fn unknown_eni_fields_are_preserved() {
    let w = World::new();
    let d = desired_state(
        &node(),
        &w.view(),
        &IpamConfig::default(),
        &NodeMemory::new(),
        None,
    );
    let mut n1 = apply(&node(), &changes(&node(), &d));
    n1.status
        .as_mut()
        .unwrap()
        .eni
        .enis
        .get_mut("eni-0")
        .unwrap()
        .extra
        .insert("future".into(), json!(1));
    assert!(changes(&n1, &d).is_empty());
}

#[test]
fn release_ips_transitions() {
    let mut w = World::new();
    w.enis.push(eni_with_ips("eni-1", 1, "subnet-a", 3));
    let cfg = IpamConfig {
        release_excess_ips: true,
        release_delay: Duration::from_secs(10),
        ..Default::default()
    };
    let mut n = node();
    n.spec.ipam.pre_allocate = 1; // A 3, U 0, P 1: excess 2
    let mut mem = NodeMemory::new();
    let t0 = Instant::now();
    plan_node(&n, &w.view(), &cfg, &mut mem, t0, 0);
    let t1 = t0 + Duration::from_secs(10);
    let p = plan_node(&n, &w.view(), &cfg, &mut mem, t1, 0);
    assert_eq!(p.demand.excess, 2);
    let d = desired_state(&n, &w.view(), &cfg, &mem, None);
    let ips: Vec<String> = w.enis[1]
        .secondary_ips
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        d.release_ips.get(&ips[0]),
        Some(&Some("marked-for-release".into()))
    );
    let ch = changes(&n, &d);
    let st = ch
        .writes
        .iter()
        .find(|w| w.subresource == Subresource::Status)
        .unwrap();
    assert!(st.needs_resource_version);
    let mut n = apply(&n, &ch);
    // Agent: ready for one, refuses the other. The proposal never overwrites an answer.
    {
        let r = &mut n.status.as_mut().unwrap().ipam.release_ips;
        r.insert(ips[0].clone(), "ready-for-release".into());
        r.insert(ips[1].clone(), "do-not-release".into());
        r.insert("10.9.9.9".into(), "marked-for-release".into()); // stale
    }
    let d = desired_state(&n, &w.view(), &cfg, &mem, None);
    assert_eq!(d.release_ips.get(&ips[0]), None, "answer kept");
    assert_eq!(d.release_ips.get("10.9.9.9"), Some(&None), "stale aborted");
    let p = plan_node(&n, &w.view(), &cfg, &mut mem, t1, 0);
    let Action::Release(r) = p.action else {
        panic!("{:?}", p.action)
    };
    assert_eq!(r.ips, [w.enis[1].secondary_ips[0]]);
    // Executed: the runtime drops the address from the cache and records the release.
    mem.record_released(&r, t1);
    w.enis[1].secondary_ips.remove(0);
    let d = desired_state(&n, &w.view(), &cfg, &mem, None);
    assert_eq!(d.release_ips.get(&ips[0]), Some(&Some("released".into())));
    assert_eq!(d.release_ips.get(&ips[1]), Some(&None), "refused: aborted");
    let ch = changes(&n, &d);
    assert_eq!(
        ch.writes[0].subresource,
        Subresource::Spec,
        "pool removal first"
    );
    let n = apply(&n, &ch);
    assert_eq!(
        n.status
            .as_ref()
            .unwrap()
            .ipam
            .release_ips
            .get(&ips[0])
            .unwrap(),
        "released"
    );
    assert!(!n.spec.ipam.pool.contains_key(&ips[0]));
    // Published; the agent removes it; memory forgets it.
    plan_node(&n, &w.view(), &cfg, &mut mem, t1, 0);
    let mut n2 = n.clone();
    n2.status.as_mut().unwrap().ipam.release_ips.remove(&ips[0]);
    plan_node(&n2, &w.view(), &cfg, &mut mem, t1, 0);
    assert_eq!(mem.released().count(), 0);
    assert!(
        !desired_state(&n2, &w.view(), &cfg, &mem, None)
            .release_ips
            .contains_key(&ips[0])
    );
    let _ = Release::default();
}

#[test]
fn multi_pool_nodes_get_no_release_ips() {
    let w = World::new();
    let mut n = node();
    n.spec
        .ipam
        .pools
        .requested
        .push(crate::crd::IpamPoolRequest {
            pool: "default".into(),
            ..Default::default()
        });
    n.status
        .as_mut()
        .unwrap()
        .ipam
        .release_ips
        .insert("10.0.0.1".into(), "marked-for-release".into());
    let d = desired_state(
        &n,
        &w.view(),
        &IpamConfig::default(),
        &NodeMemory::new(),
        None,
    );
    assert_eq!(d.release_ips.get("10.0.0.1"), Some(&None));
}

#[test]
fn unknown_instance_keeps_published_data() {
    let mut w = World::new();
    w.presence = Presence::Unknown;
    let d = desired_state(
        &node(),
        &w.view(),
        &IpamConfig::default(),
        &NodeMemory::new(),
        None,
    );
    assert!(d.enis.is_none() && d.pool.is_none());
    let mut n = node();
    n.spec.ipam.pool.insert(
        "10.0.0.1".into(),
        AllocationIp {
            resource: "eni-0".into(),
            ..Default::default()
        },
    );
    assert!(
        changes(&n, &d)
            .writes
            .iter()
            .all(|w| w.subresource == Subresource::Status)
    );
}

#[test]
fn every_problem_reason_reaches_operator_status() {
    let w = World::new();
    let reasons = [
        ProblemReason::MissingInstanceId,
        ProblemReason::InvalidSpec,
        ProblemReason::InstanceNotFound,
        ProblemReason::InstanceGone,
        ProblemReason::UnknownInstanceType,
        ProblemReason::NoMatchingSubnet,
        ProblemReason::NoSecurityGroups,
        ProblemReason::IncompleteEc2Data,
        ProblemReason::AtCapacity,
        ProblemReason::Ec2Error,
        ProblemReason::NoStaticIp,
        ProblemReason::OtherAllocatorActive,
    ];
    let names: BTreeSet<&str> = reasons.iter().map(|r| r.as_str()).collect();
    assert_eq!(names.len(), reasons.len(), "distinct names");
    for reason in reasons {
        let p = Problem {
            reason,
            message: "m".into(),
        };
        let d = desired_state(
            &node(),
            &w.view(),
            &IpamConfig::default(),
            &NodeMemory::new(),
            Some(&p),
        );
        assert_eq!(d.operator_error, Some(format!("{}: m", reason.as_str())));
    }
}

/// The object as the API server stores it under Cilium's own CRD.
#[test]
fn merge_diff_basics() {
    assert_eq!(merge_diff(&json!({"a": 1}), &json!({"a": 1})), None);
    assert_eq!(
        merge_diff(&json!({"a": 1, "b": 2}), &json!({"a": 1})),
        Some(json!({"b": null}))
    );
    assert_eq!(
        merge_diff(&json!({"a": [1]}), &json!({"a": [1, 2]})),
        Some(json!({"a": [1, 2]}))
    );
    assert_eq!(
        merge_diff(&json!({}), &json!({"x": {"y": 1}})),
        Some(json!({"x": {"y": 1}}))
    );
}

mod ciliums_crd;
