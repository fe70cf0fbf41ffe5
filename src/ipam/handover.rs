//! The handover guard's decision (pure): is another allocator serving this node right now?
//! Fed by the pass with what the CiliumNode's `metadata.managedFields` say ([`Writers`]), Cilium
//! operator's leader Lease ([`LeaseView`]) and the clock. Why each signal means what it means
//! (read from Cilium's operator source) is in `docs/migrating-from-cilium.md`, "The guard".

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ManagedFieldsEntry, ObjectMeta};
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
    /// The object's creator sent `ipam.cilium.io/ignore` in its create request ([`Self::of`]).
    pub ignore_by_creator: bool,
    /// The object has managedFields entries (the API server records one for every create):
    /// without them none of the above can be told, and the guard fails closed.
    pub recorded: bool,
}

impl Writers {
    pub fn from_managed_fields(entries: &[ManagedFieldsEntry]) -> Self {
        let mut w = Self {
            recorded: !entries.is_empty(),
            ..Self::default()
        };
        for e in entries {
            let fields = e.fields_v1.as_ref().map(|f| &f.0);
            let owns = |path: &[&str]| fields.is_some_and(|f| owns(f, path));
            let owns_ignore = fields.is_some_and(owns_ignore);
            w.ignore_owned |= owns_ignore;
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
            if owns_ignore {
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

    /// The writers of an object, from its `managedFields`, with what its creation time tells
    /// ([`Self::ignore_by_creator`]).
    pub fn of(meta: &ObjectMeta) -> Self {
        let entries = meta.managed_fields.as_deref().unwrap_or_default();
        let mut w = Self::from_managed_fields(entries);
        w.ignore_by_creator = meta
            .creation_timestamp
            .as_ref()
            .is_some_and(|created| creator_set_ignore(entries, created.0));
        w
    }

    /// `ipam.cilium.io/ignore` (when the node has it) was set as the API server created the
    /// object. Every write through the API (create, update, patch, apply) records its fields in
    /// `metadata.managedFields` under its manager before admission runs; a field that a mutating
    /// admission policy adds on CREATE is recorded under nobody (tried on kube-apiserver 1.36:
    /// the chart's policy, then a spec update and a status update by the creator, the
    /// annotation stays unowned). So an annotation no entry owns was there from the creation on,
    /// and any later setting of it (by us, `kubectl annotate`, an apply) has an owner and a time.
    /// A creator that sends the annotation itself owns it under its create's entry
    /// ([`Self::ignore_by_creator`]).
    pub const fn ignore_at_creation(&self) -> bool {
        !self.ignore_owned || self.ignore_by_creator
    }
}

/// The entry of the request that created the object owns `ipam.cilium.io/ignore`. The API
/// server stamps a create's entry (operation `Update`, or `Apply` for a server-side apply)
/// before it sets `creationTimestamp`, so that entry's time is at most the creation time (both
/// whole seconds); every later write is stamped at or after it. The entry must also own
/// `spec.instance-id`, which the creator (an agent, a script) sends with the object: a second
/// writer that annotates within the creation's second owns the annotation alone. Not ours: we
/// create no CiliumNode. A creator that re-wrote its fields since (a later time) is judged as
/// annotated later, the safe side.
fn creator_set_ignore(entries: &[ManagedFieldsEntry], created: Timestamp) -> bool {
    entries.iter().any(|e| {
        let fields = e.fields_v1.as_ref().map(|f| &f.0);
        let ours = matches!(
            e.manager.as_deref(),
            Some(OWN_FIELD_MANAGER | HANDOVER_FIELD_MANAGER)
        );
        !ours
            && e.subresource.is_none()
            && e.time.as_ref().is_some_and(|t| t.0 <= created)
            && fields.is_some_and(|f| owns_ignore(f) && owns(f, &["f:spec", "f:instance-id"]))
    })
}

fn owns_ignore(fields: &Value) -> bool {
    let annotation = format!("f:{CILIUM_IGNORE_ANNOTATION}");
    owns(fields, &["f:metadata", "f:annotations", &annotation])
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
    // Annotated as the API server created it (the chart's MutatingAdmissionPolicy, or its
    // creator's own create request): no leader of Cilium's operator ever upserted the node. Its ciliumNodeSynchronizer (1.18+) skips the
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
    // managedFields times are cut to the second: an annotation stamped `t` was set before
    // `t + 1 s`, so a leader that took over in that second may have upserted the node first.
    let (annotated, latest) = if s.cilium_ignore {
        let at = w.ignore_set_at?;
        (
            at,
            at.saturating_add(SignedDuration::from_secs(1))
                .unwrap_or(at),
        )
    } else {
        (s.now, s.now)
    };
    let knew = lease.acquired < latest && !crate::mutants::active("serve-cilium-known-node");
    knew.then(|| OtherAllocator::CiliumLeaderKnewNode {
        holder: lease.who(),
        acquired: lease.acquired,
        annotated,
    })
}

#[cfg(test)]
mod tests;
