use super::*;
use crate::ipam::fixtures::*;
use crate::ipam::{Action, ChangeSet, Release, Subresource, Write, plan_node};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

/// What `n` should say on `w`'s view, with the default settings, no memory and no problem.
fn desired(n: &CiliumNode, w: &World) -> DesiredState {
    desired_with(n, w, None)
}

/// [`desired`] with `problem` to report.
fn desired_with(n: &CiliumNode, w: &World, problem: Option<&Problem>) -> DesiredState {
    desired_state(
        n,
        &w.view(),
        &IpamConfig::default(),
        &NodeMemory::new(),
        problem,
    )
}

/// The change set's write to `/status`, if it has one.
fn status_write(set: &ChangeSet) -> Option<&Write> {
    set.writes
        .iter()
        .find(|w| w.subresource == Subresource::Status)
}

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
    let d = desired(&n, &w);
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
    let d = desired(&node(), &w);
    assert_eq!((d.enis.is_none(), d.pool.is_none()), (true, true));
    assert!(d.operator_error.unwrap().starts_with("IncompleteEc2Data"));
    let mut w = world_with_prefix();
    w.subnets.remove("subnet-b");
    let d = desired(&node(), &w);
    assert!(d.enis.is_none());
    assert!(d.operator_error.unwrap().contains("subnet-b"));
    let ch = changes(&node(), &desired(&node(), &w));
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
    let d = desired_with(&node(), &w, Some(&p));
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
    let healthy = desired(&n1, &w);
    let ch = changes(&n1, &healthy);
    assert_eq!(ch.writes.len(), 1);
    assert_eq!(
        ch.writes[0].patch,
        json!({"status": {"ipam": {"operator-status": {"error": null}}}})
    );
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
    let st = status_write(&ch).unwrap();
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
    let d = desired(&n, &w);
    assert_eq!(d.release_ips.get("10.0.0.1"), Some(&None));
}

#[test]
fn unknown_instance_keeps_published_data() {
    let mut w = World::new();
    w.presence = Presence::Unknown;
    let d = desired(&node(), &w);
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
        let d = desired_with(&node(), &w, Some(&p));
        assert_eq!(d.operator_error, Some(format!("{}: m", reason.as_str())));
    }
}

/// The object as the API server stores it under Cilium's own CRD.
mod ciliums_crd;

mod changes;
