//! When was `ipam.cilium.io/ignore` set: at the creation, or after a leader took over.

use super::*;

fn meta(created: i64, entries: Vec<ManagedFieldsEntry>) -> ObjectMeta {
    ObjectMeta {
        creation_timestamp: Some(Time(t(created))),
        managed_fields: Some(entries),
        ..ObjectMeta::default()
    }
}

/// The entry of a create request that sent `ipam.cilium.io/ignore` with the object, as
/// kube-apiserver 1.36 records it (tests/cilium_ignore_policy.rs): it owns the annotation
/// and the spec.
fn created_with_annotation(manager: &str, at: i64) -> ManagedFieldsEntry {
    entry(
        manager,
        None,
        at,
        json!({
            "f:metadata": {"f:annotations": {".": {}, "f:ipam.cilium.io/ignore": {}}},
            "f:spec": {".": {}, "f:instance-id": {}},
        }),
    )
}

#[test]
fn a_node_its_creator_annotated_in_its_create_is_served_whatever_ciliums_lease_says() {
    let running = lease(-1000, 100);
    for manager in ["cilium-agent", "kubectl-create"] {
        // Stamped in the creation's second, or the one before (the entry is stamped first).
        for at in [0, -1] {
            let w = Writers::of(&meta(0, vec![created_with_annotation(manager, at)]));
            assert!(w.ignore_at_creation(), "{manager} at {at}");
            assert_eq!(
                other_allocator(&signals(&w, Some(&running), 105)),
                None,
                "{manager} at {at}"
            );
        }
    }
    // The creator's later status writes are an entry of their own.
    let w = Writers::of(&meta(
        0,
        vec![
            created_with_annotation("cilium-agent", 0),
            entry("cilium-agent", Some("status"), 30, json!({"f:status": {}})),
        ],
    ));
    assert!(w.ignore_at_creation());
}

#[test]
fn an_annotation_set_after_the_create_is_not_taken_for_the_creators() {
    let knew = lease(-1000, 100);
    let held = |m: ObjectMeta| {
        let w = Writers::of(&m);
        assert!(!w.ignore_at_creation(), "{m:?}");
        assert!(
            matches!(
                other_allocator(&signals(&w, Some(&knew), 105)),
                Some(OtherAllocator::CiliumLeaderKnewNode { .. })
            ),
            "{m:?}"
        );
    };
    // The creator's entry is a second younger than the object: it annotated (or re-wrote
    // its fields) after the create.
    held(meta(0, vec![created_with_annotation("cilium-agent", 1)]));
    // Another writer annotated within the creation's second: it owns the annotation alone.
    let spec_only = entry(
        "cilium-agent",
        None,
        0,
        json!({"f:spec": {".": {}, "f:instance-id": {}}}),
    );
    let annotate = entry(
        "kubectl-annotate",
        None,
        0,
        json!({"f:metadata": {"f:annotations": {"f:ipam.cilium.io/ignore": {}}}}),
    );
    held(meta(0, vec![spec_only.clone(), annotate]));
    // Ours, even within the creation's second: we create no CiliumNode.
    held(meta(
        0,
        vec![
            spec_only,
            created_with_annotation(HANDOVER_FIELD_MANAGER, 0),
        ],
    ));
    // No creation time.
    held(ObjectMeta {
        managed_fields: Some(vec![created_with_annotation("cilium-agent", 0)]),
        ..ObjectMeta::default()
    });
}

#[test]
fn a_leader_that_took_over_within_the_annotations_second_knew_the_node() {
    // managedFields say 10 (the annotation was set in [10, 11)); the leader took over at 10.3.
    let w = annotated_by_handover(10);
    let mut l = lease(10, 20);
    l.acquired = t(10) + SignedDuration::from_millis(300);
    assert!(
        matches!(
            other_allocator(&signals(&w, Some(&l), 25)),
            Some(OtherAllocator::CiliumLeaderKnewNode { .. })
        ),
        "the leader may have upserted the node before the annotation"
    );
    // A leader from the next second on came after it.
    l.acquired = t(11);
    assert_eq!(other_allocator(&signals(&w, Some(&l), 25)), None);
}
