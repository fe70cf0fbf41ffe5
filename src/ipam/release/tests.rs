use super::*;
use crate::crd::DEFAULT_POOL;
use crate::crd::{AllocationIp, IpamPoolAllocation};
use crate::ipam::fixtures::*;
use std::time::Duration;

fn config() -> IpamConfig {
    IpamConfig {
        release_excess_ips: true,
        release_delay: Duration::from_secs(180),
        ..Default::default()
    }
}

/// Two passes a release delay apart, `excess` addresses too many: the candidates are proposed
/// and their delay is over at the time returned.
fn proposed_and_ripe(
    mem: &mut NodeMemory,
    node: &CiliumNode,
    usable: &[&NetworkInterface],
    excess: i64,
) -> Instant {
    let t0 = Instant::now();
    let t1 = t0 + config().release_delay;
    mem.classic_pass(node, usable, excess, &config(), t0);
    mem.classic_pass(node, usable, excess, &config(), t1);
    t1
}

fn set_used(node: &mut CiliumNode, ips: &[&str]) {
    let s = node.status.get_or_insert_default();
    s.ipam.used = ips
        .iter()
        .map(|i| (i.to_string(), AllocationIp::default()))
        .collect();
}

fn answer(node: &mut CiliumNode, ip: Ipv4Addr, state: ReleaseState) {
    node.status
        .get_or_insert_default()
        .ipam
        .release_ips
        .insert(ip.to_string(), state.as_str().into());
}

#[test]
fn candidates_prefer_first_prefix_eni_then_the_fullest_enis() {
    let mut a = eni_with_ips("eni-a", 1, "s", 3);
    let b = eni_with_ips("eni-b", 2, "s", 5);
    let used = BTreeSet::from([b.secondary_ips[0]]);
    let c = classic_candidates(&[&a, &b], &used, &BTreeSet::new(), 10);
    let ids: Vec<&str> = c.iter().map(|c| c.eni_id.as_str()).collect();
    assert_eq!(
        ids,
        ["eni-b", "eni-a"],
        "fullest first: 4 on eni-b vs 3 on eni-a"
    );
    assert_eq!(c[0].ips.len(), 4);
    assert_eq!(c[1].ips.len(), 3);
    assert!(!c[0].ips.contains(&b.secondary_ips[0]));
    let c = classic_candidates(&[&a, &b], &used, &BTreeSet::new(), 2);
    assert_eq!(c.len(), 1, "one ENI covers an excess of 2");
    assert_eq!(c[0].ips.len(), 2, "capped at excess");
    let c = classic_candidates(&[&a, &b], &used, &BTreeSet::new(), 6);
    assert_eq!(c[1].ips.len(), 2, "the second ENI gives only the rest");

    a.prefixes = vec![net("10.1.0.0/28"), net("10.1.0.16/28")];
    let used = BTreeSet::from([ip("10.1.0.20")]);
    let c = classic_candidates(&[&a, &b], &used, &BTreeSet::new(), 20);
    assert_eq!(c.len(), 1);
    assert_eq!(c[0].eni_id, "eni-a");
    assert_eq!(c[0].prefixes, [net("10.1.0.0/28")], "used /28 kept");
    assert_eq!(c[0].ips.len(), 3, "then singles up to remaining excess 4");
    let c = classic_candidates(&[&a], &used, &BTreeSet::new(), 15);
    assert!(c[0].prefixes.is_empty(), "excess < 16: no prefix");
    assert!(classic_candidates(&[&a], &used, &BTreeSet::new(), 0).is_empty());
}

#[test]
fn excess_across_enis_is_released_after_one_delay() {
    let mut w = World::new();
    w.enis.push(eni_with_ips("eni-1", 1, "subnet-a", 4));
    w.enis.push(eni_with_ips("eni-2", 2, "subnet-a", 4));
    let usable: Vec<&NetworkInterface> = w.enis.iter().collect();
    let mut node = node();
    let mut mem = NodeMemory::new();
    let cfg = config();
    let t0 = Instant::now();
    let t1 = t0 + cfg.release_delay;
    assert!(mem.classic_pass(&node, &usable, 6, &cfg, t0).is_none());
    assert!(mem.classic_pass(&node, &usable, 6, &cfg, t1).is_none());
    assert_eq!(mem.proposed().count(), 6, "both ENIs proposed in one round");
    for ip in mem.proposed().collect::<Vec<_>>() {
        answer(&mut node, ip, ReleaseState::ReadyForRelease);
    }
    let first = mem.classic_pass(&node, &usable, 6, &cfg, t1).unwrap();
    mem.record_released(&first, t1);
    assert_eq!(first.ips.len(), 4, "the fullest ENI first");
    // The next pass, on the ENI view without those addresses: the other ENI, no new delay.
    let mut w2 = w.clone();
    for e in &mut w2.enis {
        e.secondary_ips.retain(|ip| !first.ips.contains(ip));
    }
    let usable: Vec<&NetworkInterface> = w2.enis.iter().collect();
    let second = mem.classic_pass(&node, &usable, 2, &cfg, t1).unwrap();
    assert_ne!(second.eni_id, first.eni_id);
    assert_eq!(second.ips.len(), 2);
}

#[test]
fn handshake_four_states_for_single_addresses() {
    let w = {
        let mut w = World::new();
        w.enis.push(eni_with_ips("eni-1", 1, "subnet-a", 2));
        w
    };
    let usable: Vec<&NetworkInterface> = w.enis.iter().collect();
    let mut node = node();
    let mut mem = NodeMemory::new();
    let t0 = Instant::now();
    let cfg = config();
    let target = w.enis[1].secondary_ips[0];
    let other = w.enis[1].secondary_ips[1];
    // Before the delay: a candidate, no proposal.
    assert!(mem.classic_pass(&node, &usable, 2, &cfg, t0).is_none());
    assert_eq!(mem.proposed().count(), 0);
    // After the delay: proposed.
    let t1 = t0 + Duration::from_secs(180);
    assert!(mem.classic_pass(&node, &usable, 2, &cfg, t1).is_none());
    assert_eq!(mem.proposed().collect::<Vec<_>>(), [target, other]);
    // The agent acknowledges one and refuses the other.
    answer(&mut node, target, ReleaseState::ReadyForRelease);
    answer(&mut node, other, ReleaseState::DoNotRelease);
    let r = mem.classic_pass(&node, &usable, 2, &cfg, t1).unwrap();
    assert_eq!(r.eni_id, "eni-1");
    assert_eq!(r.ips, [target]);
    assert!(!mem.proposed().any(|p| p == other), "refusal withdraws");
    mem.record_released(&r, t1);
    assert_eq!(mem.released_unpublished().collect::<Vec<_>>(), [target]);
}

#[test]
fn used_address_never_released_even_if_acknowledged() {
    let mut w = World::new();
    w.enis.push(eni_with_ips("eni-1", 1, "subnet-a", 1));
    let usable: Vec<&NetworkInterface> = w.enis.iter().collect();
    let a = w.enis[1].secondary_ips[0];
    let mut node = node();
    let mut mem = NodeMemory::new();
    let t1 = proposed_and_ripe(&mut mem, &node, &usable, 1);
    answer(&mut node, a, ReleaseState::ReadyForRelease);
    set_used(&mut node, &[&a.to_string()]);
    assert!(mem.classic_pass(&node, &usable, 1, &config(), t1).is_none());
}

#[test]
fn prefix_needs_all_sixteen_acknowledgements() {
    let mut w = World::new();
    let mut e = eni("eni-1", 1, "subnet-a");
    e.prefixes = vec![net("10.1.0.0/28")];
    w.enis.push(e);
    let usable: Vec<&NetworkInterface> = w.enis.iter().collect();
    let mut node = node();
    let mut mem = NodeMemory::new();
    let t1 = proposed_and_ripe(&mut mem, &node, &usable, 16);
    assert_eq!(mem.proposed().count(), 16);
    let addrs: Vec<Ipv4Addr> = prefix_addresses(net("10.1.0.0/28")).collect();
    for a in &addrs[..15] {
        answer(&mut node, *a, ReleaseState::ReadyForRelease);
    }
    assert!(
        mem.classic_pass(&node, &usable, 16, &config(), t1)
            .is_none(),
        "15 of 16 acknowledged: not yet"
    );
    answer(&mut node, addrs[15], ReleaseState::DoNotRelease);
    assert!(
        mem.classic_pass(&node, &usable, 16, &config(), t1)
            .is_none()
    );
    assert_eq!(mem.proposed().count(), 0, "one refusal withdraws the /28");
    // The write-back removed the withdrawn entries; a fresh round, all 16 acknowledged.
    node.status.as_mut().unwrap().ipam.release_ips.clear();
    let t2 = t1 + Duration::from_secs(1);
    mem.classic_pass(&node, &usable, 16, &config(), t2);
    let t3 = t2 + Duration::from_secs(180);
    assert!(
        mem.classic_pass(&node, &usable, 16, &config(), t3)
            .is_none()
    );
    assert_eq!(mem.proposed().count(), 16);
    for a in &addrs {
        answer(&mut node, *a, ReleaseState::ReadyForRelease);
    }
    let r = mem.classic_pass(&node, &usable, 16, &config(), t3).unwrap();
    assert_eq!(r.prefixes, [net("10.1.0.0/28")]);
    assert!(r.ips.is_empty());
}

#[test]
fn no_excess_or_disabled_resets_proposals() {
    let mut w = World::new();
    w.enis.push(eni_with_ips("eni-1", 1, "subnet-a", 2));
    let usable: Vec<&NetworkInterface> = w.enis.iter().collect();
    let node = node();
    let mut mem = NodeMemory::new();
    let t1 = proposed_and_ripe(&mut mem, &node, &usable, 2);
    assert_eq!(mem.proposed().count(), 2);
    mem.classic_pass(&node, &usable, 0, &config(), t1);
    assert_eq!(mem.proposed().count(), 0);
    mem.classic_pass(&node, &usable, 2, &config(), t1);
    mem.classic_pass(&node, &usable, 2, &IpamConfig::default(), t1);
    assert_eq!(mem.proposed().count(), 0);
}

#[test]
fn turning_multi_pool_withdraws_proposals() {
    let mut w = World::new();
    w.enis.push(eni_with_ips("eni-1", 1, "subnet-a", 2));
    let usable: Vec<&NetworkInterface> = w.enis.iter().collect();
    let mut mem = NodeMemory::new();
    mem.observe_generation(Generation::Classic);
    let t0 = Instant::now();
    mem.classic_pass(&node(), &usable, 2, &config(), t0);
    mem.classic_pass(
        &node(),
        &usable,
        2,
        &config(),
        t0 + Duration::from_secs(180),
    );
    assert_eq!(mem.proposed().count(), 2);
    mem.observe_generation(Generation::MultiPool);
    assert_eq!(mem.proposed().count(), 0);
}

#[test]
fn multi_pool_tracking_marks_and_unmarks() {
    let mut mem = NodeMemory::new();
    let a = net("10.1.0.0/28");
    let b = net("10.1.0.16/28");
    let c = net("10.0.100.1/32");
    let attached: BTreeMap<Ipv4Net, String> =
        [a, b, c].into_iter().map(|n| (n, "eni-1".into())).collect();
    let t0 = Instant::now();
    // First observation: c is attached but not held: marked now.
    mem.track_multi_pool(&BTreeSet::from([a, b]), &attached, t0);
    assert_eq!(mem.marked_cidrs().collect::<Vec<_>>(), [(c, t0)]);
    // b dropped later: marked at t1; c keeps t0.
    let t1 = t0 + Duration::from_secs(10);
    mem.track_multi_pool(&BTreeSet::from([a]), &attached, t1);
    let marks: BTreeMap<_, _> = mem.marked_cidrs().collect();
    assert_eq!(marks.get(&b), Some(&t1));
    assert_eq!(marks.get(&c), Some(&t0));
    // Agent takes b back; c detached in EC2.
    let attached2: BTreeMap<Ipv4Net, String> =
        [a, b].into_iter().map(|n| (n, "eni-1".into())).collect();
    mem.track_multi_pool(&BTreeSet::from([a, b]), &attached2, t1);
    assert_eq!(mem.marked_cidrs().count(), 0);
}

#[test]
fn attached_cidrs_follow_c3() {
    let mut e = eni_with_ips("eni-1", 1, "s", 2);
    e.prefixes = vec![net("10.1.0.0/28")];
    e.secondary_ips.push(ip("10.1.0.5")); // inside the /28: not a separate /32
    let cidrs = attached_cidrs(&[&e], false);
    assert_eq!(cidrs.len(), 3);
    assert!(cidrs.contains_key(&net("10.1.0.0/28")));
    assert!(!cidrs.contains_key(&net("10.1.0.5/32")));
    assert!(!cidrs.contains_key(&Ipv4Net::from(e.primary_ip)));
    assert!(attached_cidrs(&[&e], true).contains_key(&Ipv4Net::from(e.primary_ip)));
}

#[test]
fn a_release_is_readopted_when_the_agent_lists_any_of_its_addresses_again() {
    let net = |s: &str| s.parse::<Ipv4Net>().unwrap();
    let release = Release {
        eni_id: "eni-1".into(),
        ips: vec!["10.0.1.5".parse().unwrap()],
        prefixes: vec![net("10.0.2.16/28")],
    };
    assert!(!readopted(&release, &BTreeSet::new()));
    assert!(!readopted(
        &release,
        &BTreeSet::from([net("10.0.1.6/32"), net("10.0.2.32/28")])
    ));
    assert!(readopted(&release, &BTreeSet::from([net("10.0.1.5/32")])));
    assert!(readopted(&release, &BTreeSet::from([net("10.0.2.16/28")])));
    assert!(
        readopted(&release, &BTreeSet::from([net("10.0.2.20/32")])),
        "inside the /28"
    );
    assert!(
        readopted(&release, &BTreeSet::from([net("10.0.1.0/28")])),
        "covers the /32"
    );
}

/// Issue 29: the re-read refuses a copy that is classic now or uses an address of it.
#[test]
fn a_fresh_copy_that_is_classic_or_uses_the_addresses_refuses_the_unassign() {
    use crate::crd::{IpamPoolDemand, IpamPoolRequest};
    let release = Release {
        eni_id: "eni-1".into(),
        ips: vec![ip("10.0.1.5")],
        prefixes: vec![net("10.0.2.16/28")],
    };
    let mut multi = node();
    multi.spec.ipam.pools.requested = vec![IpamPoolRequest {
        pool: DEFAULT_POOL.into(),
        needed: IpamPoolDemand {
            ipv4_addrs: 8,
            ..Default::default()
        },
        ..Default::default()
    }];
    assert_eq!(fresh_copy_refuses(&release, &multi), None);
    assert!(fresh_copy_refuses(&release, &node()).is_some(), "classic");
    let mut used = multi.clone();
    set_used(&mut used, &["10.0.2.20"]);
    assert!(fresh_copy_refuses(&release, &used).is_some(), "in use");
}

#[test]
fn multi_pool_release_after_delay_capped_by_excess() {
    let mut e = eni_with_ips("eni-1", 1, "s", 2);
    e.prefixes = vec![net("10.1.0.0/28"), net("10.1.0.16/28")];
    let usable = [&e];
    let attached = attached_cidrs(&usable, false);
    let mut node = node();
    node.spec.ipam.pools.allocated = vec![IpamPoolAllocation {
        pool: DEFAULT_POOL.into(),
        cidrs: vec!["10.1.0.0/28".into()],
        ..Default::default()
    }];
    let allocated = allocated_cidrs(&node);
    let mut mem = NodeMemory::new();
    mem.observe_generation(Generation::MultiPool);
    let t0 = Instant::now();
    mem.track_multi_pool(&allocated, &attached, t0);
    let cfg = config();
    assert!(
        mem.multi_pool_release(&usable, &allocated, 100, &cfg, t0)
            .is_none(),
        "not before the delay"
    );
    let t1 = t0 + Duration::from_secs(180);
    let r = mem
        .multi_pool_release(&usable, &allocated, 17, &cfg, t1)
        .unwrap();
    assert_eq!(r.prefixes, [net("10.1.0.16/28")], "allocated /28 kept");
    assert_eq!(r.ips.len(), 1, "excess 17 = one /28 + one /32");
    let r = mem
        .multi_pool_release(&usable, &allocated, 15, &cfg, t1)
        .unwrap();
    assert!(r.prefixes.is_empty(), "a /28 needs 16 in excess");
    assert_eq!(r.ips.len(), 2);
    assert!(
        mem.multi_pool_release(&usable, &allocated, 0, &cfg, t1)
            .is_none()
    );
    mem.record_released(&r, t1);
    assert_eq!(mem.marked_cidrs().count(), 1);
}
