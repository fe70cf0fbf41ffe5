//! The change set: ordered (C1), minimal, converging, C2 after every single write.

use super::*;

#[test]
fn changes_are_ordered_minimal_and_converge() {
    let w = world_with_prefix();
    let d = desired(&node(), &w);
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
    let d2 = desired(&n1, &w2);
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
    let d3 = desired(&n2, &w3);
    let ch3 = changes(&n2, &d3);
    let status = status_write(&ch3).unwrap();
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
    let mut w = World::new();
    w.enis.push(eni_with_ips("eni-1", 1, "subnet-b", 2));
    w.enis.push(eni_with_ips("eni-2", 2, "subnet-b", 2));
    let d = desired(&node(), &w);
    let n1 = apply(&node(), &changes(&node(), &d));
    assert_eq!(c2_violations(&n1), Vec::<String>::new());

    let moved = w.enis[2].secondary_ips.remove(0);
    w.enis[1].secondary_ips.push(moved);
    let d2 = desired(&n1, &w);
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
    let d3 = desired(&n1, &w3);
    let seen = apply_checking_c2(&n1, &changes(&n1, &d3));
    assert!(!seen.status.as_ref().unwrap().eni.enis.contains_key("eni-2"));
    assert!(changes(&seen, &d3).is_empty());
}

/// Cilium's CRD prunes `status.eni-operator`: a node that is otherwise current gets no
/// write for the summary alone, or every resync would patch every node.
#[test]
fn pruned_summary_alone_is_not_rewritten() {
    let w = world_with_prefix();
    let d = desired(&node(), &w);
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
    let d = desired(&node(), &w);
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
