//! The cache's rules, one listing or change at a time.

use super::*;
use crate::ec2::{Assigned, Attachment, InterfaceType, Tags};
use std::time::Duration;

pub(crate) fn eni(id: &str, instance: Option<(&str, u32)>, subnet: &str) -> NetworkInterface {
    NetworkInterface {
        id: id.into(),
        subnet_id: subnet.into(),
        vpc_id: "vpc-1".into(),
        availability_zone: "az-a".into(),
        mac: "02:00:00:00:00:01".into(),
        description: String::new(),
        primary_ip: Ipv4Addr::new(10, 0, 0, 10),
        secondary_ips: vec![],
        prefixes: vec![],
        ipv6_prefixes: vec![],
        security_groups: vec![],
        tags: Tags::new(),
        state: if instance.is_some() {
            EniState::InUse
        } else {
            EniState::Available
        },
        attachment: instance.map(|(i, d)| Attachment {
            id: format!("attach-{id}"),
            instance_id: i.into(),
            device_index: d,
            delete_on_termination: true,
            network_card_index: 0,
        }),
        public_ip: None,
        interface_type: InterfaceType::Interface,
    }
}

/// 10.0.0.`n`, the address space of [`eni`].
fn ip(n: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 0, 0, n)
}

/// `e` holding the secondary addresses 10.0.0.`n` of `ns`.
fn holding(mut e: NetworkInterface, ns: &[u8]) -> NetworkInterface {
    e.secondary_ips = ns.iter().map(|&n| ip(n)).collect();
    e
}

fn subnet(id: &str, free: u32) -> Subnet {
    Subnet {
        id: id.into(),
        vpc_id: "vpc-1".into(),
        availability_zone: "az-a".into(),
        cidr: "10.0.0.0/24".parse().unwrap(),
        available_addresses: free,
        tags: Tags::new(),
    }
}

fn snap(started: Instant, enis: Vec<NetworkInterface>) -> FullSnapshot {
    FullSnapshot {
        started,
        subnets: vec![subnet("subnet-1", 200)],
        vpcs: vec![],
        security_groups: vec![],
        route_tables: vec![],
        enis,
        pod_subnets: None,
        tagged_instances: None,
    }
}

#[test]
fn a_filtered_full_refresh_never_drops_an_instance() {
    let t = Instant::now();
    let mut c = Ec2Cache::new();
    c.apply_full(snap(t, vec![eni("eni-a", Some(("i-a", 0)), "subnet-1")]));
    c.manage("i-b");
    c.apply_instances(
        &["i-b".into()],
        vec![eni("eni-b", Some(("i-b", 0)), "subnet-x")],
        t,
    );
    // The next full listing misses i-b (its only ENI is outside the filtered subnets).
    c.apply_full(snap(
        t + Duration::from_secs(60),
        vec![eni("eni-a", Some(("i-a", 0)), "subnet-1")],
    ));
    assert!(matches!(
        c.view("i-b", "m5.large").instance,
        InstanceView::Known { enis, .. } if enis.len() == 1
    ));
    assert!(c.healthy);
}

#[test]
fn only_a_per_instance_describe_without_enis_marks_an_instance_gone() {
    let t = Instant::now();
    let mut c = Ec2Cache::new();
    c.apply_full(snap(t, vec![eni("eni-a", Some(("i-a", 0)), "subnet-1")]));
    c.apply_instances(&["i-a".into()], vec![], t + Duration::from_secs(1));
    assert!(matches!(c.view("i-a", "x").instance, InstanceView::Gone));
    assert!(matches!(c.view("i-z", "x").instance, InstanceView::Unknown));
    assert!(c.needs_instance_refresh("i-z"));
    assert!(!c.needs_instance_refresh("i-a"));
}

#[test]
fn a_refresh_older_than_our_change_does_not_overwrite_it() {
    let t = Instant::now();
    let mut c = Ec2Cache::new();
    c.apply_full(snap(t, vec![eni("eni-a", Some(("i-a", 0)), "subnet-1")]));
    let new = eni("eni-new", None, "subnet-1");
    let attach = Attachment {
        id: "attach-new".into(),
        instance_id: "i-a".into(),
        device_index: 1,
        delete_on_termination: false,
        network_card_index: 0,
    };
    c.add_attached_eni(new, attach, t + Duration::from_secs(5));
    assert_eq!(c.subnets["subnet-1"].available_addresses, 199);
    // A listing that started before the change arrives later.
    c.apply_full(snap(
        t + Duration::from_secs(4),
        vec![eni("eni-a", Some(("i-a", 0)), "subnet-1")],
    ));
    assert_eq!(c.instance("i-a").unwrap().enis.len(), 2);
    // One that started long enough after it replaces.
    c.apply_full(snap(
        t + Duration::from_secs(5) + DESCRIBE_LAG,
        vec![eni("eni-a", Some(("i-a", 0)), "subnet-1")],
    ));
    assert_eq!(c.instance("i-a").unwrap().enis.len(), 1);
}

#[test]
fn a_forgotten_instance_is_not_brought_back_by_a_listing_older_than_our_release() {
    // `make dst` seed 171: the finalizer detaches an ENI of a gone Node's instance, the
    // Node comes back, its CiliumNode goes (the instance is forgotten) and a new one comes.
    let t = Instant::now();
    let s = Duration::from_secs;
    let attached = vec![
        eni("eni-p", Some(("i-a", 0)), "subnet-1"),
        eni("eni-a", Some(("i-a", 1)), "subnet-1"),
    ];
    let mut c = Ec2Cache::new();
    c.apply_full(snap(t, attached.clone()));
    let only_primary = |c: &Ec2Cache| {
        matches!(c.view("i-a", "x").instance,
            InstanceView::Known { enis, .. } if enis.len() == 1 && enis[0].id == "eni-p")
    };
    c.releasing("i-a", t + s(10), |e| e.id == "eni-a");
    // The Node is back before the CiliumNode goes: the cache no longer offers eni-a, and
    // listings that started within the lag of the detach (showing it attached) change nothing.
    assert!(only_primary(&c));
    c.apply_instances(&["i-a".into()], attached.clone(), t + s(11));
    assert!(only_primary(&c));
    // The old CiliumNode goes (the instance is forgotten), a new one comes: the instance
    // is back as we knew it, not as the lagging listings show it.
    c.drop_instance("i-a");
    c.apply_instances(&["i-a".into()], attached.clone(), t + s(12));
    assert!(only_primary(&c));
    c.apply_full(snap(t + s(20), attached.clone()));
    assert!(only_primary(&c));
    // Forgotten again (the CiliumNode went once more), named again: still as we knew it.
    c.drop_instance("i-a");
    c.manage("i-a");
    assert!(only_primary(&c));
    c.drop_instance("i-a");
    c.apply_instances(&["i-a".into()], attached.clone(), t + s(25));
    assert!(only_primary(&c));
    // After the lag, the listing is the truth: eni-a is no longer attached.
    c.apply_instances(
        &["i-a".into()],
        attached[..1].to_vec(),
        t + s(10) + DESCRIBE_LAG,
    );
    assert!(matches!(
        c.view("i-a", "x").instance,
        InstanceView::Known { enis, .. } if enis.len() == 1
    ));
}

#[test]
fn a_refresh_started_just_after_our_unassign_does_not_bring_the_addresses_back() {
    let t = Instant::now();
    let with_ips = holding(eni("eni-a", Some(("i-a", 0)), "subnet-1"), &[20, 21]);
    let mut c = Ec2Cache::new();
    c.apply_full(snap(t, vec![with_ips.clone()]));
    c.remove_addresses("eni-a", &[ip(20)], &[], t + Duration::from_secs(10));
    // Describes lag behind the unassign: listings that start a few seconds after it may
    // still show the address (EC2 may meanwhile have given it to another node).
    c.apply_full(snap(t + Duration::from_secs(12), vec![with_ips.clone()]));
    c.apply_instances(
        &["i-a".into()],
        vec![with_ips.clone()],
        t + Duration::from_secs(13),
    );
    assert_eq!(c.instance("i-a").unwrap().enis[0].secondary_ips, [ip(21)]);
    // Once the lag is over, the listing is the truth again.
    c.apply_instances(
        &["i-a".into()],
        vec![with_ips],
        t + Duration::from_secs(10) + DESCRIBE_LAG,
    );
    assert_eq!(
        c.instance("i-a").unwrap().enis[0].secondary_ips,
        [ip(20), ip(21)]
    );
}

#[test]
fn an_assigned_address_leaves_every_other_eni_a_lagging_listing_showed_it_on() {
    let t = Instant::now();
    let a = holding(eni("eni-a", Some(("i-a", 1)), "subnet-1"), &[20, 21]);
    let b = eni("eni-b", Some(("i-a", 2)), "subnet-1");
    let mut c = Ec2Cache::new();
    c.apply_full(snap(t, vec![a, b]));
    let assigned = Assigned {
        ips: vec![ip(20)],
        prefixes: vec![],
    };
    c.merge_assigned("eni-b", &assigned, t + Duration::from_secs(1));
    let enis = &c.instance("i-a").unwrap().enis;
    let on = |id: &str| {
        enis.iter()
            .find(|e| e.id == id)
            .unwrap()
            .secondary_ips
            .clone()
    };
    assert_eq!(on("eni-a"), [ip(21)], "EC2 moved it: not on eni-a any more");
    assert_eq!(on("eni-b"), [ip(20)]);
}

#[test]
fn own_results_merge_as_sets_and_adjust_subnet_counts() {
    let t = Instant::now();
    let mut c = Ec2Cache::new();
    c.apply_full(snap(t, vec![eni("eni-a", Some(("i-a", 0)), "subnet-1")]));
    let assigned = Assigned {
        ips: vec![ip(20), ip(21)],
        prefixes: vec!["10.0.0.16/28".parse().unwrap()],
    };
    c.merge_assigned("eni-a", &assigned, t);
    // An emulator answering with the whole set again changes nothing.
    let all = Assigned {
        ips: vec![ip(10), ip(20), ip(21)],
        prefixes: assigned.prefixes.clone(),
    };
    c.merge_assigned("eni-a", &all, t);
    let e = &c.instance("i-a").unwrap().enis[0];
    assert_eq!(e.secondary_ips, vec![ip(20), ip(21)]);
    assert_eq!(e.prefixes.len(), 1);
    assert_eq!(c.subnets["subnet-1"].available_addresses, 200 - 18);
    c.remove_addresses("eni-a", &[ip(20)], &assigned.prefixes, t);
    let e = &c.instance("i-a").unwrap().enis[0];
    assert_eq!(e.secondary_ips, vec![ip(21)]);
    assert!(e.prefixes.is_empty());
    assert_eq!(c.subnets["subnet-1"].available_addresses, 200 - 1);
}

#[test]
fn our_unattached_enis_of_managed_instances_are_kept_as_leftovers() {
    use crate::ipam::ownership::ownership_tags;
    let t = Instant::now();
    let mut c = Ec2Cache::for_cluster("prod");
    // A CiliumNode names i-a (the core calls `manage` on every upsert).
    c.manage("i-a");
    let owned = |id: &str, instance: &str, cluster: &str| {
        let mut e = eni(id, None, "subnet-1");
        e.tags = ownership_tags(cluster, instance);
        e
    };
    c.apply_full(snap(
        t,
        vec![
            eni("eni-a", Some(("i-a", 0)), "subnet-1"),
            owned("eni-left", "i-a", "prod"),
            owned("eni-other-cluster", "i-a", "staging"),
            owned("eni-unmanaged", "i-z", "prod"),
            eni("eni-untagged", None, "subnet-1"),
        ],
    ));
    let ids =
        |c: &Ec2Cache| -> Vec<String> { c.leftovers("i-a").iter().map(|e| e.id.clone()).collect() };
    assert_eq!(ids(&c), ["eni-left"]);
    assert!(
        c.instance("i-z").is_none(),
        "no entry for an unmanaged instance"
    );
    // A per-instance describe cannot see it: it stays.
    c.apply_instances(
        &["i-a".into()],
        vec![eni("eni-a", Some(("i-a", 0)), "subnet-1")],
        t + Duration::from_secs(1),
    );
    assert_eq!(ids(&c), ["eni-left"]);
    // Attached by us: no longer a leftover, and its addresses were counted already.
    let free = c.subnets["subnet-1"].available_addresses;
    let attach = Attachment {
        id: "attach-left".into(),
        instance_id: "i-a".into(),
        device_index: 1,
        delete_on_termination: false,
        network_card_index: 0,
    };
    c.add_attached_eni(
        owned("eni-left", "i-a", "prod"),
        attach,
        t + Duration::from_secs(2),
    );
    assert!(ids(&c).is_empty());
    assert_eq!(c.subnets["subnet-1"].available_addresses, free);
    // One of our own (throttled attach) survives a listing that started before it.
    c.add_leftover(
        "i-a",
        owned("eni-new", "i-a", "prod"),
        t + Duration::from_secs(5),
    );
    c.apply_full(snap(t + Duration::from_secs(4), vec![]));
    assert_eq!(ids(&c), ["eni-new"]);
    c.remove_leftover("eni-new");
    assert!(ids(&c).is_empty());
}

#[test]
fn next_free_index_skips_used() {
    let used: BTreeSet<u32> = [0, 1, 2, 4].into();
    assert_eq!(next_free_index(&used, 1), 3);
    assert_eq!(next_free_index(&used, 3), 5);
}

#[test]
fn instances_neither_managed_nor_listed_are_forgotten() {
    let t = Instant::now();
    let mut c = Ec2Cache::new();
    c.manage("i-a");
    c.apply_full(snap(
        t,
        vec![
            eni("eni-a", Some(("i-a", 0)), "subnet-1"),
            eni("eni-x", Some(("i-x", 0)), "subnet-1"),
        ],
    ));
    // A late per-instance answer for an instance no node names any more.
    c.apply_instances(&["i-late".into()], vec![], t);
    assert!(c.instance("i-x").is_some() && c.instance("i-late").is_some());
    c.apply_full(snap(t + Duration::from_secs(60), vec![]));
    assert!(c.instance("i-a").is_some(), "managed: kept (#46513)");
    assert!(c.instance("i-x").is_none());
    assert!(c.instance("i-late").is_none());
    assert_eq!(c.managed_vpcs(), BTreeSet::from(["vpc-1".to_string()]));
    c.drop_instance("i-a");
    assert!(c.managed_vpcs().is_empty());
}

#[test]
fn instance_tags_decide_the_scope_of_managed_instances() {
    let t = Instant::now();
    let mut c = Ec2Cache::new();
    c.manage("i-a");
    c.manage("i-b");
    let mut s = snap(
        t,
        vec![
            eni("eni-a", Some(("i-a", 0)), "subnet-1"),
            eni("eni-b", Some(("i-b", 0)), "subnet-1"),
            eni("eni-x", Some(("i-x", 0)), "subnet-1"),
        ],
    );
    s.tagged_instances = Some(["i-a".to_string()].into());
    c.apply_full(s);
    assert_eq!(c.in_scope("i-a"), Some(true));
    assert_eq!(c.in_scope("i-b"), Some(false), "managed, untagged");
    assert!(
        c.instance("i-x").is_none(),
        "untagged and unmanaged: not cached"
    );
    assert_eq!(c.in_scope("i-new"), None, "not checked yet");
    assert!(c.needs_instance_refresh("i-new"));
    c.set_instance_tags(&["i-new".into(), "i-a".into()], &["i-new".into()].into());
    assert_eq!(c.in_scope("i-new"), Some(true));
    assert_eq!(c.in_scope("i-a"), Some(false));
}

#[test]
fn an_address_listed_on_two_enis_of_an_instance_counts_once() {
    // moto can give two ENIs of one node the same address; EC2 never does.
    let t = Instant::now();
    let a = holding(eni("eni-a", Some(("i-a", 1)), "subnet-1"), &[20, 21]);
    let b = holding(eni("eni-b", Some(("i-a", 2)), "subnet-1"), &[21, 22, 10]);
    let on = |c: &Ec2Cache, id: &str| {
        c.instance("i-a")
            .unwrap()
            .enis
            .iter()
            .find(|e| e.id == id)
            .map(|e| e.secondary_ips.clone())
            .unwrap_or_default()
    };
    let mut c = Ec2Cache::new();
    c.apply_full(snap(t, vec![b.clone(), a.clone()]));
    assert_eq!(on(&c, "eni-a"), [ip(20), ip(21)]);
    assert_eq!(
        on(&c, "eni-b"),
        [ip(22)],
        "not a second time, nor a primary"
    );
    c.apply_instances(
        &["i-a".into()],
        vec![a.clone(), b.clone()],
        t + Duration::from_secs(1),
    );
    assert_eq!(on(&c, "eni-b"), [ip(22)]);
    // A new ENI's answer that names an address the instance has.
    let n = holding(eni("eni-c", None, "subnet-1"), &[20, 23]);
    let attach = Attachment {
        id: "attach-c".into(),
        instance_id: "i-a".into(),
        device_index: 3,
        delete_on_termination: true,
        network_card_index: 0,
    };
    c.add_attached_eni(n, attach, t + Duration::from_secs(2));
    assert_eq!(on(&c, "eni-c"), [ip(23)]);
    assert_eq!(on(&c, "eni-a"), [ip(20), ip(21)]);
}
