//! Every branch of the admission, on plain values.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use super::*;
use crate::crd::{CILIUM_IGNORE_ANNOTATION, FINALIZER};
use crate::ipam::fixtures::{INSTANCE, node};
use crate::ipam::handover::LeaseView;

fn t(s: i64) -> Timestamp {
    Timestamp::from_second(1_700_000_000 + s).expect("time")
}

fn guard() -> GuardFacts {
    GuardFacts {
        writers: Writers {
            recorded: true,
            ..Writers::default()
        },
        cilium_ignore: true,
        will_annotate: true,
        lease: CiliumLease::Absent,
        new_cilium_enis: Vec::new(),
        now: t(100),
        quiet: Duration::from_secs(30),
        ignore_unsupported: None,
    }
}

/// A node we served: everything read, everything fine.
fn served() -> Facts {
    let mut n = node();
    n.metadata.finalizers = Some(vec![FINALIZER.into()]);
    Facts {
        node: n,
        confirmed: Confirmed {
            instance: Some(INSTANCE.into()),
            finalizer_ours: true,
        },
        ignored: false,
        in_scope: Some(true),
        selected: true,
        watch_says_gone: false,
        gone_now: None,
        identity: Identity::Confirmed,
        rivals: Vec::new(),
        cluster_tag: ClusterTag::Tagged,
        guard: Guard::Read(Box::new(guard())),
        settled: Settled::Yes,
        unhealthy_retry: Duration::from_secs(10),
        cluster_name: "c1".into(),
    }
}

/// A node we never served.
fn new_node() -> Facts {
    let mut f = served();
    f.node.metadata.finalizers = None;
    f.confirmed = Confirmed::default();
    f
}

fn refusal(d: Decision) -> Refusal {
    match d {
        Decision::Refuse(r) => r,
        other => panic!("not a refusal: {other:?}"),
    }
}

/// Why `decide` leaves the object alone, if it does.
fn left_alone(f: &Facts) -> Option<LeaveAlone> {
    match decide(f) {
        Decision::LeaveAlone(why) => Some(why),
        _ => None,
    }
}

fn finalized(d: Decision) -> Finalize {
    match d {
        Decision::Finalize(f) => f,
        other => panic!("not finalized: {other:?}"),
    }
}

fn deleting(mut f: Facts) -> Facts {
    f.node.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
    f
}

#[test]
fn a_confirmed_node_in_scope_is_served_and_only_the_decision_admits_it() {
    let f = served();
    let Decision::Serve(serve) = decide(&f) else {
        panic!("not served: {:?}", decide(&f));
    };
    let admitted = f.admit(serve);
    assert_eq!(admitted.spec.instance_id, INSTANCE);
    assert!(admitted.confirmed().finalizer_ours);
    // A shadow: no guard, no tag, nothing to settle; served all the same.
    let mut shadow = new_node();
    shadow.guard = Guard::Off;
    shadow.cluster_tag = ClusterTag::NotRequired;
    assert!(matches!(decide(&shadow), Decision::Serve(_)));
}

#[test]
fn an_ignored_node_is_handed_back_before_anything_else() {
    let mut f = deleting(served());
    f.ignored = true;
    f.identity = Identity::NoNode;
    assert!(matches!(decide(&f), Decision::HandBack));
}

#[test]
fn out_of_scope_is_left_alone_and_unknown_scope_waits_for_the_refresh() {
    let mut f = served();
    f.in_scope = Some(false);
    assert_eq!(left_alone(&f), Some(LeaveAlone::OutOfScope));
    f.in_scope = None;
    let Decision::Wait { wait, retry } = decide(&f) else {
        panic!("no wait");
    };
    assert_eq!((wait, retry), (None, Duration::from_secs(10)));
}

#[test]
fn outside_the_selector_a_served_node_is_handed_back_and_others_untouched() {
    let mut f = served();
    f.selected = false;
    assert!(matches!(decide(&f), Decision::HandBack));
    let mut f = new_node();
    f.selected = false;
    assert_eq!(left_alone(&f), Some(LeaveAlone::NotSelected));
}

#[test]
fn a_gone_node_is_asked_about_live_then_deleted_and_finalized() {
    let mut f = served();
    f.watch_says_gone = true;
    assert!(matches!(decide(&f), Decision::Need(Need::NodeGone)));
    f.gone_now = Some(true);
    let fin = finalized(decide(&f));
    assert!(fin.delete);
    assert_eq!(fin.release.as_deref(), Some(INSTANCE));
    // Back under the name (a live GET found it): served as before.
    f.gone_now = Some(false);
    assert!(matches!(decide(&f), Decision::Serve(_)));
}

/// A CiliumNode we never served is not ours to delete when its Node goes (nor to hand back
/// outside the selector): an agent's object, forged finalizer or not, is left as it is.
#[test]
fn a_node_we_never_served_is_neither_deleted_nor_handed_back() {
    let mut f = new_node();
    f.watch_says_gone = true;
    f.gone_now = Some(true);
    f.identity = Identity::NoNode;
    assert_eq!(left_alone(&f), Some(LeaveAlone::NotServed));
    // With our finalizer added by an agent: the same.
    f.node.metadata.finalizers = Some(vec![FINALIZER.into()]);
    assert_eq!(left_alone(&f), Some(LeaveAlone::NotServed));
    let mut f = new_node();
    f.node.metadata.finalizers = Some(vec![FINALIZER.into()]);
    f.selected = false;
    assert_eq!(left_alone(&f), Some(LeaveAlone::NotSelected));
}

#[test]
fn deleting_releases_only_the_confirmed_instance_whatever_the_object_names_now() {
    let fin = finalized(decide(&deleting(served())));
    assert!(!fin.delete);
    assert_eq!(fin.release.as_deref(), Some(INSTANCE));
    // An agent changed spec.instance-id after we served the node: the record decides.
    let mut changed = deleting(served());
    changed.node.spec.instance_id = "i-victim".into();
    let fin = finalized(decide(&changed));
    assert_eq!(fin.named, "i-victim");
    assert_eq!(fin.release.as_deref(), Some(INSTANCE));
    // Deleting comes before identity: a node refused for its identity is still finalized.
    let mut refused = deleting(served());
    refused.identity = Identity::NoNode;
    assert!(matches!(decide(&refused), Decision::Finalize(_)));
}

#[test]
fn a_forged_finalizer_releases_nothing() {
    // An agent created the object with our finalizer and a record of its choosing.
    let mut forged = deleting(new_node());
    forged.node.metadata.finalizers = Some(vec![FINALIZER.into()]);
    forged.confirmed = Confirmed {
        instance: Some("i-victim".into()),
        finalizer_ours: false,
    };
    forged.node.spec.instance_id = "i-victim".into();
    let fin = finalized(decide(&forged));
    assert_eq!(fin.release, None);
    assert_eq!(fin.named, "i-victim");
    // Our finalizer, but no record of ours: nothing either.
    forged.confirmed = Confirmed {
        instance: None,
        finalizer_ours: true,
    };
    assert_eq!(finalized(decide(&forged)).release, None);
}

#[test]
fn a_node_not_seen_waits_with_a_reason_and_says_nothing() {
    let mut f = new_node();
    f.identity = Identity::Unknown;
    let Decision::Wait { wait, retry } = decide(&f) else {
        panic!("no wait");
    };
    assert_eq!(retry, UNKNOWN_RETRY);
    let (reason, why) = wait.expect("a wait reason");
    assert_eq!(reason, WaitReason::NodeNotSeen);
    assert!(why.contains("no Node named node-1"), "{why}");
}

#[test]
fn a_refused_object_naming_a_foreign_instance_gets_no_ec2_fact_read() {
    // A CiliumNode naming an instance in a peered VPC: its Node (if any) names another one.
    let mut f = new_node();
    f.node.spec.instance_id = "i-peered".into();
    f.identity = Identity::Mismatch("the Node's providerID names i-1".into());
    f.cluster_tag = ClusterTag::NotRead;
    f.guard = Guard::NotRead;
    f.settled = Settled::NotRead;
    let r = refusal(decide(&f));
    assert_eq!(r.reason, ProblemReason::InstanceMismatch);
    assert!(r.message.contains("i-peered"), "{}", r.message);
    assert_eq!(r.retry, IDENTITY_RETRY);
    assert!(!r.guard_blocked);
    // Without any Node.
    f.identity = Identity::NoNode;
    assert_eq!(refusal(decide(&f)).reason, ProblemReason::NoNode);
    // Named by another live CiliumNode too.
    f.identity = Identity::Confirmed;
    f.rivals = vec!["node-2".into()];
    let r = refusal(decide(&f));
    assert_eq!(r.reason, ProblemReason::InstanceNamedTwice);
    assert!(r.message.contains("node-2"));
}

#[test]
fn no_instance_named_leaves_the_plan_to_report_it() {
    let mut f = new_node();
    f.node.spec.instance_id.clear();
    f.identity = Identity::NoNode;
    f.cluster_tag = ClusterTag::NotRead;
    assert!(matches!(decide(&f), Decision::Serve(_)));
}

#[test]
fn the_cluster_tag_is_read_when_asked_and_refuses_an_instance_of_another_cluster() {
    let mut f = new_node();
    f.cluster_tag = ClusterTag::NotRead;
    assert!(matches!(decide(&f), Decision::Need(Need::ClusterTag)));
    f.cluster_tag = ClusterTag::Untagged;
    let r = refusal(decide(&f));
    assert_eq!(r.reason, ProblemReason::NotClusterInstance);
    assert_eq!(r.retry, UNTAGGED_RETRY);
    assert!(r.message.contains("kubernetes.io/cluster/c1"));
    f.cluster_tag = ClusterTag::Unreadable("throttled".into());
    assert!(matches!(decide(&f), Decision::Wait { wait: None, .. }));
}

/// An instance DescribeInstances does not know (not listed yet, or never launched) carries no
/// tag to confirm: the node waits with a reason and is asked about again, never admitted.
#[test]
fn an_instance_ec2_does_not_know_waits_and_is_not_admitted() {
    let mut f = new_node();
    f.cluster_tag = ClusterTag::UnknownToEc2;
    // Not admitted, and said on the node (bad input gets operator-status and an Event).
    let r = refusal(decide(&f));
    assert_eq!(r.reason, ProblemReason::InstanceNotFound);
    assert!(
        r.message.contains(&f.node.spec.instance_id),
        "{}",
        r.message
    );
    assert_eq!(r.retry, UNKNOWN_RETRY);
    assert_eq!(r.wait, Some(WaitReason::InstanceUnknown));
    assert!(!r.guard_blocked);
}

#[test]
fn an_unreadable_cilium_lease_blocks_only_nodes_not_taken_over() {
    let mut g = guard();
    g.lease = CiliumLease::Unreadable("no Lease yet".into());
    let mut f = new_node();
    f.guard = Guard::Read(Box::new(g.clone()));
    let r = refusal(decide(&f));
    assert_eq!(r.reason, ProblemReason::CiliumLeaseUnreadable);
    assert!(r.guard_blocked);
    assert_eq!((r.retry, r.wait), (GUARD_RETRY, None));
    let mut ours = served();
    ours.guard = Guard::Read(Box::new(g));
    assert!(matches!(decide(&ours), Decision::Serve(_)));
}

/// An agent may add our finalizer to its own CiliumNode: only the one our field manager put
/// there says the node was taken over, so a forged one does not open the guard.
#[test]
fn a_finalizer_an_agent_added_does_not_count_as_taken_over() {
    let mut g = guard();
    g.lease = CiliumLease::Unreadable("no Lease yet".into());
    let mut forged = new_node();
    forged.node.metadata.finalizers = Some(vec![FINALIZER.into()]);
    forged.guard = Guard::Read(Box::new(g));
    let r = refusal(decide(&forged));
    assert_eq!(r.reason, ProblemReason::CiliumLeaseUnreadable);
    assert!(r.guard_blocked);
}

/// Without `metadata.managedFields` nothing tells who set `ipam.cilium.io/ignore` or who wrote
/// the pool: the guard used to read that as "annotated at creation, no foreign write" and
/// serve at once. It waits, saying why.
#[test]
fn a_node_without_managed_fields_waits_for_the_guard_to_be_able_to_tell() {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry};
    let mut g = guard();
    g.lease = lease("cilium-operator-1", 10);
    let mut f = new_node();
    for missing in [None, Some(Vec::new())] {
        f.node.metadata.managed_fields = missing;
        g.writers = Writers::of(&f.node.metadata);
        f.guard = Guard::Read(Box::new(g.clone()));
        let Decision::Wait { wait, retry } = decide(&f) else {
            panic!("not a wait: {:?}", decide(&f));
        };
        assert_eq!(retry, GUARD_RETRY);
        let (reason, why) = wait.expect("a wait reason");
        assert_eq!(reason, WaitReason::OtherAllocator);
        assert!(why.contains("managedFields"), "{why}");
    }
    // The creator's entry (what the API server records for any create): annotated at creation.
    f.node.metadata.managed_fields = Some(vec![ManagedFieldsEntry {
        manager: Some("cilium-agent".into()),
        operation: Some("Update".into()),
        fields_v1: Some(FieldsV1(
            serde_json::json!({"f:spec": {"f:instance-id": {}}}),
        )),
        ..ManagedFieldsEntry::default()
    }]);
    g.writers = Writers::of(&f.node.metadata);
    f.guard = Guard::Read(Box::new(g));
    assert!(matches!(decide(&f), Decision::Serve(_)));
}

fn lease(holder: &str, acquired: i64) -> CiliumLease {
    CiliumLease::Held(LeaseView {
        holder: holder.into(),
        acquired: t(acquired),
        renewed: t(99),
        duration: Duration::from_secs(15),
    })
}

#[test]
fn annotated_at_creation_is_ours_at_once_annotated_later_waits_for_the_next_leader() {
    let mut g = guard();
    g.lease = lease("cilium-operator-1", 10);
    let mut f = new_node();
    f.node
        .metadata
        .annotations
        .get_or_insert_default()
        .insert(CILIUM_IGNORE_ANNOTATION.into(), "true".into());
    // Annotated as the API server created it: nobody else owns the annotation.
    f.guard = Guard::Read(Box::new(g.clone()));
    assert!(matches!(decide(&f), Decision::Serve(_)));
    // Annotated later by someone, after Cilium's running leader took over.
    g.writers.ignore_owned = true;
    g.writers.ignore_set_at = Some(t(50));
    f.guard = Guard::Read(Box::new(g.clone()));
    let r = refusal(decide(&f));
    assert_eq!(r.reason, ProblemReason::OtherAllocatorActive);
    assert_eq!(r.wait, Some(WaitReason::OtherAllocator));
    assert!(r.guard_blocked);
    assert!(!r.annotate, "the annotation is on already");
    // Not annotated yet: we annotate while blocked, so that Cilium's next leader keeps off.
    g.cilium_ignore = false;
    g.writers.ignore_owned = false;
    g.writers.ignore_set_at = None;
    f.node.metadata.annotations = None;
    f.guard = Guard::Read(Box::new(g));
    assert!(refusal(decide(&f)).annotate);
}

#[test]
fn a_released_cilium_lease_lets_a_node_annotated_before_the_release_through() {
    let mut g = guard();
    g.writers.ignore_owned = true;
    g.writers.ignore_set_at = Some(t(50));
    g.lease = lease("", 60);
    let mut f = new_node();
    f.guard = Guard::Read(Box::new(g.clone()));
    assert!(matches!(decide(&f), Decision::Serve(_)));
    // Annotated after the release: the next holder may have it; wait.
    g.writers.ignore_set_at = Some(t(70));
    f.guard = Guard::Read(Box::new(g));
    assert_eq!(
        refusal(decide(&f)).reason,
        ProblemReason::OtherAllocatorActive
    );
}

#[test]
fn the_guard_and_the_settling_describe_are_read_last_and_only_when_asked() {
    let mut f = new_node();
    f.guard = Guard::NotRead;
    f.settled = Settled::NotRead;
    assert!(matches!(decide(&f), Decision::Need(Need::Guard)));
    f.guard = Guard::Read(Box::new(guard()));
    assert!(matches!(decide(&f), Decision::Need(Need::Settled)));
    f.settled = Settled::WaitFor(Duration::from_secs(3));
    let Decision::Wait { wait, retry } = decide(&f) else {
        panic!("no wait");
    };
    assert_eq!((wait, retry), (None, Duration::from_secs(3)));
}
