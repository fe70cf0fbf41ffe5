use super::*;

#[test]
fn a_foreign_allocation_write_newer_than_ours_is_unsettled() {
    let mut w = Writers::default();
    assert_eq!(unsettled_foreign_write(&w), None, "nobody wrote");
    w.other_eni = Some(("cilium-operator-aws".into(), t(10)));
    assert_eq!(
        unsettled_foreign_write(&w),
        Some(t(10)),
        "never written by us"
    );
    w.other_pool = Some(("cilium-operator-aws".into(), t(12)));
    assert_eq!(
        unsettled_foreign_write(&w),
        Some(t(12)),
        "the later of the two"
    );
    w.own_spec = Some(t(12));
    assert_eq!(unsettled_foreign_write(&w), None, "we wrote since");
    w.own_spec = Some(t(11));
    assert_eq!(unsettled_foreign_write(&w), Some(t(12)));
}
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, Time};
use serde_json::json;

fn t(s: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + s).unwrap()
}

fn entry(manager: &str, sub: Option<&str>, at: i64, fields: Value) -> ManagedFieldsEntry {
    ManagedFieldsEntry {
        manager: Some(manager.into()),
        operation: Some("Update".into()),
        subresource: sub.map(Into::into),
        time: Some(Time(t(at))),
        fields_type: Some("FieldsV1".into()),
        fields_v1: Some(FieldsV1(fields)),
        api_version: Some("cilium.io/v2".into()),
    }
}

fn pool_fields() -> Value {
    json!({"f:spec": {"f:ipam": {"f:pool": {"f:10.0.0.5": {}}}}})
}

/// The writers of a node our handover annotated with `ipam.cilium.io/ignore` at `at`.
fn annotated_by_handover(at: i64) -> Writers {
    Writers::from_managed_fields(&[entry(
        HANDOVER_FIELD_MANAGER,
        None,
        at,
        json!({"f:metadata": {"f:annotations": {"f:ipam.cilium.io/ignore": {}}}}),
    )])
}

/// [`signals`] for a node without Cilium's ignore annotation.
fn not_ignored<'a>(w: &'a Writers, lease: Option<&'a LeaseView>, now: i64) -> Signals<'a> {
    Signals {
        cilium_ignore: false,
        ..signals(w, lease, now)
    }
}

fn signals<'a>(w: &'a Writers, lease: Option<&'a LeaseView>, now: i64) -> Signals<'a> {
    Signals {
        writers: w,
        cilium_ignore: true,
        will_annotate: false,
        lease,
        new_cilium_enis: &[],
        now: t(now),
        quiet: Duration::from_secs(180),
        ignore_unsupported: None,
    }
}

fn lease(acquired: i64, renewed: i64) -> LeaseView {
    LeaseView {
        holder: "cilium-operator-abc".into(),
        acquired: t(acquired),
        renewed: t(renewed),
        duration: Duration::from_secs(15),
    }
}

#[test]
fn writers_come_from_managed_fields() {
    let entries = [
        entry(
            OWN_FIELD_MANAGER,
            None,
            10,
            json!({"f:metadata": {"f:finalizers": {}}}),
        ),
        entry(
            OWN_FIELD_MANAGER,
            Some("status"),
            12,
            json!({"f:status": {}}),
        ),
        entry("cilium-operator-aws", None, 20, pool_fields()),
        entry(
            "cilium-operator-aws",
            Some("status"),
            21,
            json!({"f:status": {"f:eni": {"f:enis": {}}}}),
        ),
        entry(
            "cilium-agent",
            None,
            30,
            json!({"f:spec": {"f:ipam": {"f:pre-allocate": {}}}}),
        ),
        entry(
            "kubectl-annotate",
            None,
            5,
            json!({"f:metadata": {"f:annotations": {"f:ipam.cilium.io/ignore": {}}}}),
        ),
    ];
    let w = Writers::from_managed_fields(&entries);
    assert_eq!(w.own_spec, Some(t(10)));
    assert_eq!(w.own_status, Some(t(12)));
    assert_eq!(w.other_pool, Some(("cilium-operator-aws".into(), t(20))));
    assert_eq!(w.other_eni, Some(("cilium-operator-aws".into(), t(21))));
    assert_eq!(w.ignore_set_at, Some(t(5)));
}

#[test]
fn a_foreign_pool_write_after_ours_blocks_until_it_is_quiet() {
    let entries = [
        entry(OWN_FIELD_MANAGER, None, 10, pool_fields()),
        entry("cilium-operator-aws", None, 20, pool_fields()),
    ];
    let w = Writers::from_managed_fields(&entries);
    let got = other_allocator(&signals(&w, None, 30)).expect("blocked");
    assert!(matches!(
        got,
        OtherAllocator::ForeignWrite {
            field: "spec.ipam.pool",
            ..
        }
    ));
    assert!(got.to_string().contains("cilium-operator-aws"));
    assert_eq!(
        other_allocator(&signals(&w, None, 20 + 180)),
        None,
        "quiet since"
    );
}

#[test]
fn the_previous_allocators_writes_before_our_claim_do_not_block() {
    let entries = [
        entry("cilium-operator-aws", None, 5, pool_fields()),
        entry(
            OWN_FIELD_MANAGER,
            None,
            10,
            json!({"f:metadata": {"f:finalizers": {}}}),
        ),
    ];
    let w = Writers::from_managed_fields(&entries);
    assert_eq!(other_allocator(&signals(&w, None, 11)), None);
    // Not claimed yet: Cilium is the allocator we take over from.
    let w = Writers::from_managed_fields(&entries[..1]);
    assert_eq!(other_allocator(&signals(&w, None, 6)), None);
}

#[test]
fn a_running_cilium_operator_serves_unannotated_nodes() {
    let w = Writers::default();
    let l = lease(0, 100);
    let mut s = not_ignored(&w, Some(&l), 105);
    assert!(matches!(
        other_allocator(&s),
        Some(OtherAllocator::CiliumNotIgnored { .. })
    ));
    // Expired Lease: Cilium's operator is gone.
    s.now = t(200);
    assert_eq!(other_allocator(&s), None);
}

#[test]
fn cilium_must_restart_after_the_annotation() {
    let w = annotated_by_handover(50);
    let before = lease(0, 100);
    assert!(matches!(
        other_allocator(&signals(&w, Some(&before), 105)),
        Some(OtherAllocator::CiliumLeaderKnewNode { .. })
    ));
    let restarted = lease(60, 100);
    assert_eq!(other_allocator(&signals(&w, Some(&restarted), 105)), None);
    // About to annotate it ourselves, Cilium running since before: blocked as well.
    let w = Writers::default();
    let mut s = not_ignored(&w, Some(&before), 105);
    s.will_annotate = true;
    assert!(matches!(
        other_allocator(&s),
        Some(OtherAllocator::CiliumLeaderKnewNode { .. })
    ));
}

#[test]
fn a_node_blocked_before_our_annotation_is_annotated_so_a_restart_frees_it() {
    // Cilium's leader since before; we are to annotate the node and have not yet.
    let w = Writers::default();
    let before = lease(0, 100);
    let mut s = not_ignored(&w, Some(&before), 105);
    s.will_annotate = true;
    let other = other_allocator(&s).expect("blocked");
    assert!(annotate_while_blocked(&s, &other), "annotate now");
    // Not annotated, even a leader that restarted a second ago is older than "now": only
    // the annotation written while blocked can ever let the node through.
    let restarted = lease(104, 105);
    s.lease = Some(&restarted);
    assert!(other_allocator(&s).is_some());
    // Annotated (by us, dated by our handover manager) before the restart: free.
    let w = annotated_by_handover(102);
    let mut s = signals(&w, Some(&restarted), 105);
    s.will_annotate = true;
    assert_eq!(other_allocator(&s), None);
    // Already annotated, or another reason: no write.
    let mut s = signals(&w, Some(&before), 105);
    s.will_annotate = true;
    let other = other_allocator(&s).expect("blocked");
    assert!(!annotate_while_blocked(&s, &other));
    let other = OtherAllocator::CiliumNotIgnored { holder: "x".into() };
    s.cilium_ignore = false;
    assert!(!annotate_while_blocked(&s, &other));
}

#[test]
fn a_cilium_operator_older_than_the_annotation_serves_annotated_nodes_even_after_a_restart() {
    use crate::ipam::cilium_version::CiliumVersion;
    let w = annotated_by_handover(50);
    // Restarted after the annotation: a 1.18+ leader keeps off the node.
    let restarted = lease(60, 100);
    let v116 = CiliumVersion::from_label(Some("1.29.4"))
        .ignore_unsupported()
        .unwrap();
    let mut s = signals(&w, Some(&restarted), 105);
    assert_eq!(other_allocator(&s), None);
    s.ignore_unsupported = Some(&v116);
    let other = other_allocator(&s).expect("1.16 serves it anyway");
    assert_eq!(
        other.problem_reason(),
        ProblemReason::CiliumIgnoresAnnotation
    );
    let text = other.to_string();
    assert!(
        text.contains("cilium-operator-abc") && text.contains("Cilium operator 1.16"),
        "{text}"
    );
    // Ours is to annotate it: no annotation written for a refused handover.
    s.cilium_ignore = false;
    s.will_annotate = true;
    assert!(!annotate_while_blocked(&s, &other_allocator(&s).unwrap()));
    // Cilium's operator stopped (Lease expired): nothing to keep off.
    let s = Signals { now: t(200), ..s };
    assert_eq!(other_allocator(&s), None);
}

/// The CiliumNode as the API server stores it when the chart's MutatingAdmissionPolicy set
/// `ipam.cilium.io/ignore` at its creation (seen on kube-apiserver 1.36,
/// tests/it/cilium_ignore_policy.rs): the creator's entries own its spec and status, nobody
/// owns the annotation.
fn annotated_at_creation() -> Writers {
    Writers::from_managed_fields(&[
        entry(
            "cilium-agent",
            None,
            0,
            json!({"f:spec": {".": {}, "f:instance-id": {}}}),
        ),
        entry(
            "cilium-agent",
            Some("status"),
            1,
            json!({"f:status": {"f:ipam": {"f:used": {}}}}),
        ),
    ])
}

#[test]
fn a_node_annotated_at_its_creation_is_served_whatever_ciliums_lease_says() {
    let w = annotated_at_creation();
    assert!(w.ignore_at_creation() && w.ignore_set_at.is_none());
    // Cilium's leader since long before the node, renewing: no leader ever upserted it.
    let running = lease(-1000, 100);
    assert_eq!(other_allocator(&signals(&w, Some(&running), 105)), None);
    let released = LeaseView {
        holder: String::new(),
        ..lease(100, 100)
    };
    assert_eq!(other_allocator(&signals(&w, Some(&released), 105)), None);
    // Not annotated at all: Cilium's running operator serves it.
    let s = not_ignored(&w, Some(&running), 105);
    assert!(matches!(
        other_allocator(&s),
        Some(OtherAllocator::CiliumNotIgnored { .. })
    ));
    // Cilium's operator 1.16 ignores the annotation: at creation or not, it serves the node.
    let v116 = "Cilium operator 1.16".to_string();
    let mut s = signals(&w, Some(&running), 105);
    s.ignore_unsupported = Some(&v116);
    assert!(matches!(
        other_allocator(&s),
        Some(OtherAllocator::CiliumIgnoresAnnotation { .. })
    ));
}

#[test]
fn a_node_annotated_after_its_creation_waits_for_a_leader_newer_than_the_annotation() {
    let mut entries = vec![entry(
        "cilium-agent",
        None,
        0,
        json!({"f:spec": {".": {}, "f:instance-id": {}}}),
    )];
    // Whoever set it later owns it: kubectl, our handover manager, or the creator itself
    // (the same second as the creation: cannot be told from a write just after it).
    for manager in ["kubectl-annotate", HANDOVER_FIELD_MANAGER, "cilium-agent"] {
        entries.push(entry(
            manager,
            None,
            50,
            json!({"f:metadata": {"f:annotations": {"f:ipam.cilium.io/ignore": {}}}}),
        ));
        let w = Writers::from_managed_fields(&entries);
        assert!(!w.ignore_at_creation(), "{manager}");
        let knew = lease(0, 100);
        assert!(
            matches!(
                other_allocator(&signals(&w, Some(&knew), 105)),
                Some(OtherAllocator::CiliumLeaderKnewNode { .. })
            ),
            "{manager}"
        );
        let newer = lease(60, 100);
        assert_eq!(other_allocator(&signals(&w, Some(&newer), 105)), None);
        entries.pop();
    }
    // Owned by an entry without a time (a no-op apply): not "at creation" either.
    let mut e = entry(
        HANDOVER_FIELD_MANAGER,
        None,
        50,
        json!({"f:metadata": {"f:annotations": {"f:ipam.cilium.io/ignore": {}}}}),
    );
    e.time = None;
    assert!(!Writers::from_managed_fields(&[e]).ignore_at_creation());
}

#[test]
fn a_released_lease_blocks_as_a_held_one_until_a_new_holder_or_its_expiry_plus_its_duration() {
    // Released at 100 (client-go: empty holder, renew = acquire = the release).
    let released = LeaseView {
        holder: String::new(),
        ..lease(100, 100)
    };
    assert!(released.released());
    // Not annotated, not ours to annotate: its next leader serves it.
    let w = Writers::default();
    let mut s = not_ignored(&w, Some(&released), 105);
    let other = other_allocator(&s).expect("blocked while released");
    assert!(other.to_string().contains("released at"), "{other}");
    // Ours to annotate now: after the release, so only its next leader's Lease clears it.
    s.will_annotate = true;
    for now in [105, 129] {
        s.now = t(now);
        assert!(
            matches!(
                other_allocator(&s),
                Some(OtherAllocator::CiliumLeaderKnewNode { .. })
            ),
            "{now}"
        );
    }
    // Expiry (100 + 15) plus the duration (15): no Cilium operator any more.
    s.now = t(131);
    assert_eq!(other_allocator(&s), None);
    // A new holder that took over after our annotation (at 105, dated by our manager).
    let w = annotated_by_handover(105);
    let next = lease(110, 110);
    assert_eq!(other_allocator(&signals(&w, Some(&next), 111)), None);
    // Annotated before the release: the leader that knew it is gone, the next keeps off.
    let w = annotated_by_handover(90);
    assert_eq!(other_allocator(&signals(&w, Some(&released), 105)), None);
}

#[test]
fn new_cilium_enis_block() {
    let w = Writers::default();
    let enis = ["eni-1".to_string()];
    let mut s = signals(&w, None, 0);
    s.new_cilium_enis = &enis;
    assert!(other_allocator(&s).unwrap().to_string().contains("eni-1"));
    assert_eq!(cilium_eni_description("i-0abc"), "Cilium-CNI (i-0abc)");
}

mod creation;
