//! The handover guard's decision (pure): is another allocator serving this node right now?
//! Fed by the pass with what the CiliumNode's `metadata.managedFields` say ([`Writers`]), Cilium
//! operator's leader Lease ([`LeaseView`]) and the clock. Why each signal means what it means
//! (read from Cilium's operator source) is in `docs/migrating-from-cilium.md`, "The guard".

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use serde_json::Value;

use crate::crd::CILIUM_IGNORE_ANNOTATION;
use crate::ipam::ProblemReason;

/// Our field manager for every write but the Cilium ignore annotation.
pub const OWN_FIELD_MANAGER: &str = "eni-operator";
/// Our field manager for `ipam.cilium.io/ignore` alone, so its managedFields entry dates the
/// annotation (the main manager's time moves with every pool write).
pub const HANDOVER_FIELD_MANAGER: &str = "eni-operator-handover";
/// Cilium operator's leader-election Lease (`operator/cmd/root.go`, `leaderElectionResourceLockName`).
pub const CILIUM_OPERATOR_LEASE: &str = "cilium-operator-resource-lock";

/// The description Cilium's operator gives the ENIs it creates (`pkg/aws/eni/node.go`,
/// `CreateInterface`: `"Cilium-CNI (" + instanceID + ")"`).
pub fn cilium_eni_description(instance_id: &str) -> String {
    format!("Cilium-CNI ({instance_id})")
}

/// Who wrote the allocation fields of a CiliumNode, and when (from `metadata.managedFields`;
/// managedFields times have one-second resolution).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Writers {
    /// Our own last write of the object / of its status.
    pub own_spec: Option<Timestamp>,
    pub own_status: Option<Timestamp>,
    /// The latest write by another manager that owns `spec.ipam.pool` / `status.eni`.
    pub other_pool: Option<(String, Timestamp)>,
    pub other_eni: Option<(String, Timestamp)>,
    /// When `ipam.cilium.io/ignore` was set, if a manager other than our main one owns it.
    pub ignore_set_at: Option<Timestamp>,
    /// Some entry (any manager, with or without a time) owns `ipam.cilium.io/ignore`.
    pub ignore_owned: bool,
}

impl Writers {
    pub fn from_managed_fields(entries: &[ManagedFieldsEntry]) -> Self {
        let mut w = Self::default();
        let annotation = format!("f:{CILIUM_IGNORE_ANNOTATION}");
        let annotation = ["f:metadata", "f:annotations", annotation.as_str()];
        for e in entries {
            let fields = e.fields_v1.as_ref().map(|f| &f.0);
            let owns = |path: &[&str]| fields.is_some_and(|f| owns(f, path));
            w.ignore_owned |= owns(&annotation);
            let (Some(manager), Some(time)) = (e.manager.as_deref(), e.time.as_ref()) else {
                continue;
            };
            let at = time.0;
            let status = e.subresource.as_deref() == Some("status");
            if manager == OWN_FIELD_MANAGER {
                let own = if status {
                    &mut w.own_status
                } else {
                    &mut w.own_spec
                };
                *own = (*own).max(Some(at));
                continue;
            }
            if owns(&annotation) {
                w.ignore_set_at = w.ignore_set_at.max(Some(at));
            }
            if owns(&["f:spec", "f:ipam", "f:pool"]) {
                later(&mut w.other_pool, manager, at);
            }
            if owns(&["f:status", "f:eni"]) {
                later(&mut w.other_eni, manager, at);
            }
        }
        w
    }

    /// `ipam.cilium.io/ignore` (when the node has it) was set as the API server created the
    /// object. Every write through the API (create, update, patch, apply) records its fields in
    /// `metadata.managedFields` under its manager before admission runs; a field that a mutating
    /// admission policy adds on CREATE is recorded under nobody (tried on kube-apiserver 1.36:
    /// the chart's policy, then a spec update and a status update by the creator, the
    /// annotation stays unowned). So an annotation no entry owns was there from the creation on,
    /// and any later setting of it (by us, `kubectl annotate`, an apply) has an owner and a time.
    /// A creator that sends the annotation itself owns it: such a node is treated as annotated
    /// later (the same second as the creation cannot be told from our own annotation then).
    pub const fn ignore_at_creation(&self) -> bool {
        !self.ignore_owned
    }
}

fn owns(fields: &Value, path: &[&str]) -> bool {
    path.iter().try_fold(fields, |v, k| v.get(*k)).is_some()
}

fn later(slot: &mut Option<(String, Timestamp)>, manager: &str, at: Timestamp) {
    if slot.as_ref().is_none_or(|(_, t)| at > *t) {
        *slot = Some((manager.to_string(), at));
    }
}

/// Cilium operator's leader Lease as last read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseView {
    /// Empty when released.
    pub holder: String,
    pub acquired: Timestamp,
    pub renewed: Timestamp,
    pub duration: Duration,
}

impl LeaseView {
    /// Released by its last holder (client-go's `ReleaseOnCancel`: an empty holder; Cilium's
    /// operator does it when it stops, e.g. in a rollout restart).
    pub const fn released(&self) -> bool {
        self.holder.is_empty()
    }

    /// Cilium's operator runs: renewed within its duration. A released Lease counts as held for
    /// its expiry plus one more duration: the next leader (a restarting pod, a standby) takes it
    /// within that, and until it does nothing says it will keep off the nodes it would serve.
    pub fn fresh(&self, now: Timestamp) -> bool {
        let d = if self.released() {
            self.duration.saturating_mul(2)
        } else {
            self.duration
        };
        let d = SignedDuration::try_from(d).unwrap_or(SignedDuration::MAX);
        self.renewed.checked_add(d).is_ok_and(|until| until >= now)
    }

    /// Who holds it, for the node's operator-status.
    pub fn who(&self) -> String {
        if self.released() {
            format!(
                "none: its Lease was released at {} (restarting), its next leader is awaited",
                self.renewed
            )
        } else {
            self.holder.clone()
        }
    }
}

/// Cilium operator's leader Lease as the guard knows it (§16: the guard fails closed).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CiliumLease {
    /// Read, and never held (no renew time); or the user said Cilium's operator is absent
    /// (`--cilium-operator-absent`). A released Lease is [`Held`](Self::Held) with an empty
    /// holder ([`LeaseView::released`]).
    Absent,
    Held(LeaseView),
    /// Cannot be read (not yet, an API error, or not found where Cilium's operator should
    /// be): a node not handed over yet gets no EC2 call and no takeover write.
    Unreadable(String),
}

impl CiliumLease {
    /// The Lease's view when it is held.
    pub fn view(&self) -> Option<&LeaseView> {
        match self {
            Self::Held(v) => Some(v),
            _ => None,
        }
    }
}

/// What the pass knows about one node.
#[derive(Clone, Debug)]
pub struct Signals<'a> {
    pub writers: &'a Writers,
    /// `ipam.cilium.io/ignore: "true"` is on the node.
    pub cilium_ignore: bool,
    /// We are about to set it (`--annotate-cilium-ignore`).
    pub will_annotate: bool,
    pub lease: Option<&'a LeaseView>,
    /// Cilium-described ENIs on the instance we had not seen when we took the node over.
    pub new_cilium_enis: &'a [String],
    pub now: Timestamp,
    /// How long a foreign pool write counts as a running allocator (`--handover-quiet`).
    pub quiet: Duration,
    /// Why Cilium's operator cannot be relied on to honour the annotation
    /// ([`super::cilium_version::CiliumVersion::ignore_unsupported`]); `None`: it can.
    pub ignore_unsupported: Option<&'a str>,
}

/// Another allocator serves the node: why we think so.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OtherAllocator {
    /// Another field manager wrote the pool after our own last write.
    ForeignWrite {
        manager: String,
        field: &'static str,
        at: Timestamp,
    },
    /// Cilium's operator runs and the node is not annotated: it upserts and serves it.
    CiliumNotIgnored { holder: String },
    /// Cilium's leader acquired its Lease before the annotation: its node manager kept the node.
    CiliumLeaderKnewNode {
        holder: String,
        acquired: Timestamp,
        annotated: Timestamp,
    },
    /// ENIs with Cilium's description appeared after the handover.
    CiliumEni { enis: Vec<String> },
    /// Cilium's operator runs and does not honour the annotation (too old, or its release
    /// cannot be told): annotated or not, it serves the node.
    CiliumIgnoresAnnotation { holder: String, why: String },
}

impl OtherAllocator {
    /// The reason on the node's operator-status and its Event.
    pub const fn problem_reason(&self) -> ProblemReason {
        match self {
            Self::CiliumIgnoresAnnotation { .. } => ProblemReason::CiliumIgnoresAnnotation,
            _ => ProblemReason::OtherAllocatorActive,
        }
    }
}

impl std::fmt::Display for OtherAllocator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::ForeignWrite { manager, field, at } => write!(
                f,
                "another allocator serves this node: {manager} wrote {field} at {at}, after \
                 eni-operator took the node over; no EC2 call until it stops"
            ),
            Self::CiliumNotIgnored { holder } => write!(
                f,
                "Cilium's operator ({holder}) is running and the node lacks \
                 {CILIUM_IGNORE_ANNOTATION}=true: it serves this node"
            ),
            Self::CiliumLeaderKnewNode {
                holder,
                acquired,
                annotated,
            } => write!(
                f,
                "Cilium's operator leader {holder} took over at {acquired}, before \
                 {CILIUM_IGNORE_ANNOTATION} was set at {annotated}: it keeps resyncing this node \
                 until it restarts (kubectl rollout restart deploy/cilium-operator)"
            ),
            Self::CiliumEni { enis } => write!(
                f,
                "Cilium's operator created {} on this instance after the handover: it still \
                 serves this node",
                enis.join(", ")
            ),
            Self::CiliumIgnoresAnnotation { holder, why } => write!(
                f,
                "Cilium's operator ({holder}) is running and serves this node: {why}"
            ),
        }
    }
}

/// Another allocator's last write of the node's allocation fields (`spec.ipam.pool`,
/// `status.eni`) when it is newer than our own last write of the object: a describe that
/// started less than the describe lag after it may not show that allocator's last calls yet, so
/// we must not plan or write the pool from one (§14.3).
pub fn unsettled_foreign_write(w: &Writers) -> Option<Timestamp> {
    let other = [&w.other_pool, &w.other_eni]
        .into_iter()
        .flatten()
        .map(|(_, at)| *at)
        .max()?;
    w.own_spec.is_none_or(|own| other > own).then_some(other)
}

/// While Cilium's running leader blocks a node we are to annotate (`--annotate-cilium-ignore`),
/// set the annotation now: else it is never set (we annotate only once through the guard) and
/// no restart of Cilium's operator could ever clear the block, as the e2e `cilium-handover`
/// scenario found with Cilium's real operator. The write only tells Cilium's next leader to
/// keep off the node; it makes no EC2 call.
pub fn annotate_while_blocked(s: &Signals, other: &OtherAllocator) -> bool {
    s.will_annotate
        && !s.cilium_ignore
        && matches!(other, OtherAllocator::CiliumLeaderKnewNode { .. })
}

/// The guard's decision: `Some` means no mutating call for this node now.
pub fn other_allocator(s: &Signals) -> Option<OtherAllocator> {
    let w = s.writers;
    let quiet = SignedDuration::try_from(s.quiet).unwrap_or(SignedDuration::MAX);
    let recent = |at: Timestamp| s.now.duration_since(at) < quiet;
    // Direct evidence first: a foreign write of the pool after ours.
    // Measured against our last write of the object itself (finalizer, pool), not of its
    // status: our own error report on the status must not hide the evidence.
    let foreign = [
        ("spec.ipam.pool", &w.other_pool),
        ("status.eni", &w.other_eni),
    ];
    for (field, other) in foreign {
        if let (Some((manager, at)), Some(own)) = (other, w.own_spec)
            && *at > own
            && recent(*at)
        {
            return Some(OtherAllocator::ForeignWrite {
                manager: manager.clone(),
                field,
                at: *at,
            });
        }
    }
    if !s.new_cilium_enis.is_empty() {
        return Some(OtherAllocator::CiliumEni {
            enis: s.new_cilium_enis.to_vec(),
        });
    }
    let lease = s.lease.filter(|l| l.fresh(s.now))?;
    if !s.cilium_ignore && !s.will_annotate {
        return Some(OtherAllocator::CiliumNotIgnored {
            holder: lease.who(),
        });
    }
    // Everything below relies on Cilium's operator honouring the annotation: one that does
    // not (before 1.18, cilium_version.rs; the 1.16 binary lacks the string) serves every
    // node, restarted after the annotation or not.
    if let Some(why) = s.ignore_unsupported {
        return Some(OtherAllocator::CiliumIgnoresAnnotation {
            holder: lease.who(),
            why: why.to_string(),
        });
    }
    // Annotated as the API server created it (the chart's MutatingAdmissionPolicy): no leader
    // of Cilium's operator ever upserted the node. Its ciliumNodeSynchronizer (1.18+) skips the
    // Upsert of an annotated node, and every event it ever had for this one showed the
    // annotation; so whatever its Lease says (held, renewed, released), it has no copy to
    // resync, and the node is ours at once. Operators that ignore the annotation (before 1.18)
    // were stopped above.
    if s.cilium_ignore && w.ignore_at_creation() {
        return None;
    }
    // Annotated later (or about to be): the running leader still serves the node if it took
    // over before the annotation. Set by us just now: the annotation is newer than any leader.
    // A released Lease dates its release: a node annotated after it waits for the next holder.
    let annotated = if s.cilium_ignore {
        w.ignore_set_at?
    } else {
        s.now
    };
    (lease.acquired < annotated).then(|| OtherAllocator::CiliumLeaderKnewNode {
        holder: lease.who(),
        acquired: lease.acquired,
        annotated,
    })
}

#[cfg(test)]
mod tests {
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
        let mut s = signals(&w, Some(&l), 105);
        s.cilium_ignore = false;
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
        let mut s = signals(&w, Some(&before), 105);
        s.cilium_ignore = false;
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
        let mut s = signals(&w, Some(&before), 105);
        s.cilium_ignore = false;
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
        let mut s = signals(&w, Some(&running), 105);
        s.cilium_ignore = false;
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
        let mut s = signals(&w, Some(&released), 105);
        s.cilium_ignore = false;
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
}
