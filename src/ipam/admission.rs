//! Whether a pass may serve a node, as one value (pure). The runtime gathers the pass's facts
//! ([`Facts`]: the object, its Node, EC2's word on the instance's tags, the other CiliumNodes
//! naming the instance, Cilium's Lease and release, what we confirmed for this object) and
//! [`decide`] returns what to do: serve an [`AdmittedNode`], finalize, hand back, leave alone,
//! wait or refuse. Facts that cost a call (a live GET of the Node, a describe of the instance's
//! tags, the handover guard's ENI baseline, a settling describe) are read only when the decision
//! asks for them ([`Decision::Need`]), in the order the checks run, so a node refused early
//! costs nothing later. Only the decision can make an [`AdmittedNode`]; every later step of the
//! pass takes one. The rules are in docs/rules.md §15 (identity, cluster tag) and §16 (guard).

use std::ops::Deref;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

use crate::crd::{CiliumNode, FINALIZER};
use crate::ipam::ProblemReason;
use crate::ipam::confirmed::Confirmed;
use crate::ipam::handover::{self, CiliumLease, OtherAllocator, Signals, Writers};

/// How soon a node whose Node is not known yet is looked at again (its Node's arrival queues it
/// at once besides).
pub const UNKNOWN_RETRY: Duration = Duration::from_secs(5);
/// How soon a node refused for its identity is looked at again (a Node's change, or the rival's
/// deletion, is the usual end; this is the backstop).
pub const IDENTITY_RETRY: Duration = Duration::from_secs(30);
/// How soon an instance without this cluster's tag is asked about again.
pub const UNTAGGED_RETRY: Duration = Duration::from_secs(60);
/// How soon a node another allocator serves is checked again.
pub const GUARD_RETRY: Duration = Duration::from_secs(15);

/// What its Node says of the instance a CiliumNode names (docs/rules.md §15).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Identity {
    Confirmed,
    /// Not known yet (the Nodes not listed, the instance not described).
    Unknown,
    /// No Node of that name.
    NoNode,
    /// The Node names another instance (or its InternalIP is not the instance's address).
    Mismatch(String),
}

/// EC2's word on whether the instance carries this cluster's tag.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClusterTag {
    /// `--require-cluster-tag` is off (or a shadow, which asks EC2 nothing of the kind).
    NotRequired,
    /// Not asked yet.
    NotRead,
    Tagged,
    Untagged,
    /// EC2 does not list the instance (not yet, or never launched): nothing confirms its tag, so
    /// the node is refused for now (InstanceNotFound) and the tag is asked again.
    UnknownToEc2,
    /// The describe failed.
    Unreadable(String),
}

/// What the handover guard looks at (§16), owned ([`handover::Signals`] borrows it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GuardFacts {
    pub writers: Writers,
    /// `ipam.cilium.io/ignore: "true"` is on the node.
    pub cilium_ignore: bool,
    /// `--annotate-cilium-ignore`.
    pub will_annotate: bool,
    pub lease: CiliumLease,
    pub new_cilium_enis: Vec<String>,
    pub now: Timestamp,
    pub quiet: Duration,
    pub ignore_unsupported: Option<String>,
}

/// The guard's facts: a shadow has no guard (it serves nothing, and another allocator serving
/// the node is the point of it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Guard {
    Off,
    NotRead,
    Read(Box<GuardFacts>),
}

/// Whether a describe of the instance shows what another allocator did before our takeover
/// (§14.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Settled {
    /// Nothing to settle (a shadow; or no foreign write newer than ours).
    Yes,
    NotRead,
    /// Look again after this long (no status: it is a matter of seconds).
    WaitFor(Duration),
}

/// Everything the decision looks at. Built by the runtime; facts not read yet say so.
#[derive(Clone, Debug)]
pub struct Facts {
    pub node: CiliumNode,
    /// What the object's own metadata proves we confirmed and finalized ([`Confirmed`]).
    pub confirmed: Confirmed,
    /// The node opted out of us (handed back to Cilium's operator).
    pub ignored: bool,
    /// `--instance-tags-filter`: `None` while the instance's tags are unknown.
    pub in_scope: Option<bool>,
    /// `--handover-selector` selects the node.
    pub selected: bool,
    /// The Node watch deleted the node's Node.
    pub watch_says_gone: bool,
    /// A live GET after the watch said gone: `None` not asked yet.
    pub gone_now: Option<bool>,
    pub identity: Identity,
    /// Other live CiliumNodes naming the instance that their own Nodes do not refute.
    pub rivals: Vec<String>,
    pub cluster_tag: ClusterTag,
    pub guard: Guard,
    pub settled: Settled,
    /// `--unhealthy-retry`: how soon a fact EC2 could not give is asked again.
    pub unhealthy_retry: Duration,
    /// `--cluster-name` (for the refusal's message).
    pub cluster_name: String,
}

/// A fact that costs a call, asked for by [`decide`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Need {
    /// Is the Node gone right now (a live GET: the watch's delete may be stale)?
    NodeGone,
    ClusterTag,
    Guard,
    Settled,
}

/// What becomes of an object the operator does not serve, quietly or with a log line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaveAlone {
    /// Outside `--instance-tags-filter`: said once in the log; our finalizer goes if present.
    OutOfScope,
    /// Outside `--handover-selector` and never ours: not written at all.
    NotSelected,
    /// Never served by us and its Node is gone: not ours to delete, nor to write.
    NotServed,
}

/// Why a node waits (the status page's reasons the admission gives).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitReason {
    NodeNotSeen,
    OtherAllocator,
    /// DescribeInstances does not list the instance (yet): no tag to confirm it by.
    InstanceUnknown,
}

/// A node refused for now: said on its `operator-status` and in one Warning Event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub reason: ProblemReason,
    pub message: String,
    pub retry: Duration,
    /// Also a wait the status page shows.
    pub wait: Option<WaitReason>,
    /// The guard blocked the node (counted in `eni_operator_other_allocator_blocked_total`).
    pub guard_blocked: bool,
    /// Set `ipam.cilium.io/ignore` now although the node is blocked
    /// ([`handover::annotate_while_blocked`]).
    pub annotate: bool,
}

/// The end of a node's life: what the finalizer may give back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finalize {
    /// Delete the CiliumNode first (its Node is gone).
    pub delete: bool,
    /// The instance the object names (an agent's claim: forgotten, never released).
    pub named: String,
    /// The instance we confirmed for this object and whose finalizer is ours: the only one
    /// whose ENIs may be given back.
    pub release: Option<String>,
}

/// The admission's answer.
#[derive(Debug)]
pub enum Decision {
    Serve(Serve),
    Finalize(Finalize),
    /// Ours no more (ignored, or outside the canary selector after we served it): hand it back
    /// to Cilium's operator and take our finalizer off.
    HandBack,
    LeaveAlone(LeaveAlone),
    /// Look again later; `wait` and its message for the status page, when there is one.
    Wait {
        wait: Option<(WaitReason, String)>,
        retry: Duration,
    },
    Refuse(Refusal),
    /// Read this fact and decide again.
    Need(Need),
}

/// The permission to serve: only [`decide`] makes one, and only it makes an [`AdmittedNode`].
#[derive(Debug)]
pub struct Serve(());

/// A node the admission let through, with what its object proves we confirmed.
#[derive(Clone, Debug)]
pub struct AdmittedNode {
    node: CiliumNode,
    confirmed: Confirmed,
}

impl Facts {
    pub fn admit(self, _: Serve) -> AdmittedNode {
        AdmittedNode {
            node: self.node,
            confirmed: self.confirmed,
        }
    }
}

impl AdmittedNode {
    pub fn confirmed(&self) -> &Confirmed {
        &self.confirmed
    }

    /// Our own writes' answers replace the node (a write never changes whose node it is).
    pub fn replace(&mut self, node: CiliumNode) {
        self.node = node;
    }

    pub fn into_node(self) -> CiliumNode {
        self.node
    }
}

impl Deref for AdmittedNode {
    type Target = CiliumNode;

    fn deref(&self) -> &CiliumNode {
        &self.node
    }
}

/// The admission (pure): the checks in the order they run, each on facts already read.
pub fn decide(f: &Facts) -> Decision {
    // Taken over by us: our field manager put our finalizer there (an agent may add it too).
    let ours = f.confirmed.finalizer_ours;
    if f.ignored {
        return Decision::HandBack;
    }
    match f.in_scope {
        Some(true) => {}
        // The tags are not known yet (the check failed): the next full refresh tells.
        None => return wait(None, f.unhealthy_retry),
        Some(false) => return Decision::LeaveAlone(LeaveAlone::OutOfScope),
    }
    if !f.selected {
        if ours {
            return Decision::HandBack;
        }
        return Decision::LeaveAlone(LeaveAlone::NotSelected);
    }
    let deleting = f.node.metadata.deletion_timestamp.is_some();
    if f.watch_says_gone && !deleting {
        match f.gone_now {
            None => return Decision::Need(Need::NodeGone),
            // Only a node we served is ours to delete; another is its creator's.
            Some(true) if ours => return finalize(f, true),
            Some(true) => return Decision::LeaveAlone(LeaveAlone::NotServed),
            Some(false) => {}
        }
    }
    if deleting {
        return finalize(f, false);
    }
    if let Some(refused) = identity(f) {
        return refused;
    }
    if let Some(refused) = cluster_tag(f) {
        return refused;
    }
    let guard = match &f.guard {
        Guard::Off => None,
        Guard::NotRead => return Decision::Need(Need::Guard),
        Guard::Read(g) => Some(g),
    };
    if let Some(refused) = guard.and_then(|g| other_allocator(g, ours)) {
        return refused;
    }
    match f.settled {
        Settled::Yes => Decision::Serve(Serve(())),
        Settled::NotRead => Decision::Need(Need::Settled),
        Settled::WaitFor(d) => wait(None, d),
    }
}

/// Our finalizer is listed (whoever put it there).
pub fn has_finalizer(node: &CiliumNode) -> bool {
    node.metadata
        .finalizers
        .as_ref()
        .is_some_and(|f| f.iter().any(|x| x == FINALIZER))
}

fn wait(wait: Option<(WaitReason, String)>, retry: Duration) -> Decision {
    Decision::Wait { wait, retry }
}

fn refuse(reason: ProblemReason, message: String, retry: Duration) -> Decision {
    Decision::Refuse(Refusal {
        reason,
        message,
        retry,
        wait: None,
        guard_blocked: false,
        annotate: false,
    })
}

fn finalize(f: &Facts, delete: bool) -> Decision {
    Decision::Finalize(Finalize {
        delete,
        named: f.node.spec.instance_id.clone(),
        release: f.confirmed.releasable().map(str::to_string),
    })
}

/// Is the instance the one its Node says, and named by no other live CiliumNode (§15)?
fn identity(f: &Facts) -> Option<Decision> {
    let instance = &f.node.spec.instance_id;
    // No instance: the plan reports MissingInstanceId; nothing is called for it.
    if instance.is_empty() {
        return None;
    }
    let name = f.node.metadata.name.as_deref().unwrap_or_default();
    match &f.identity {
        Identity::Confirmed => {}
        Identity::Unknown => {
            let why = format!(
                "no Node named {name} seen yet, or EC2 not yet asked which instance its \
                 InternalIP is, to confirm {instance}; served once it is"
            );
            return Some(wait(Some((WaitReason::NodeNotSeen, why)), UNKNOWN_RETRY));
        }
        Identity::NoNode => {
            let message = format!(
                "no Node named {name}: a CiliumNode is served only beside its Node, whose \
                 providerID names {instance}; no EC2 call for it"
            );
            return Some(refuse(ProblemReason::NoNode, message, IDENTITY_RETRY));
        }
        Identity::Mismatch(why) => {
            let message = format!(
                "spec.instance-id {instance} is not this node's instance ({why}); no EC2 call \
                 for it"
            );
            return Some(refuse(
                ProblemReason::InstanceMismatch,
                message,
                IDENTITY_RETRY,
            ));
        }
    }
    (!f.rivals.is_empty()).then(|| {
        let message = format!(
            "{instance} is also named by CiliumNode {}: served through neither until one \
             CiliumNode names it (a Node re-registered under another name? delete the stale \
             Node or CiliumNode)",
            f.rivals.join(", ")
        );
        refuse(ProblemReason::InstanceNamedTwice, message, IDENTITY_RETRY)
    })
}

/// EC2 confirms the instance is this cluster's before any call touches it (§15).
fn cluster_tag(f: &Facts) -> Option<Decision> {
    if f.node.spec.instance_id.is_empty() {
        return None;
    }
    match &f.cluster_tag {
        ClusterTag::NotRequired | ClusterTag::Tagged => None,
        ClusterTag::NotRead => Some(Decision::Need(Need::ClusterTag)),
        // Bad input as far as anyone can tell (a made-up or foreign instance-id), so it is
        // said on the node like any refusal; the status page shows it as a wait.
        ClusterTag::UnknownToEc2 => Some(Decision::Refuse(Refusal {
            reason: ProblemReason::InstanceNotFound,
            message: format!(
                "instance {} not found in EC2 (yet): its cluster tag cannot be confirmed; asked \
                 again",
                f.node.spec.instance_id
            ),
            retry: UNKNOWN_RETRY,
            wait: Some(WaitReason::InstanceUnknown),
            guard_blocked: false,
            annotate: false,
        })),
        ClusterTag::Unreadable(_) => Some(wait(None, f.unhealthy_retry)),
        ClusterTag::Untagged => {
            let (instance, cluster) = (&f.node.spec.instance_id, &f.cluster_name);
            let message = format!(
                "EC2 shows {instance} without this cluster's tag (aws:eks:cluster-name={cluster} \
                 or kubernetes.io/cluster/{cluster}): no EC2 call for it (is --cluster-name the \
                 name its tags give?)"
            );
            Some(refuse(
                ProblemReason::NotClusterInstance,
                message,
                UNTAGGED_RETRY,
            ))
        }
    }
}

/// The handover guard (§16): another allocator serves the node, or Cilium's Lease or the
/// object's managedFields cannot be read for a node not taken over yet (fail closed; nodes
/// already ours go on).
fn other_allocator(g: &GuardFacts, handed_over: bool) -> Option<Decision> {
    let blocked = |reason, message, wait, annotate| {
        Decision::Refuse(Refusal {
            reason,
            message,
            retry: GUARD_RETRY,
            wait,
            guard_blocked: true,
            annotate,
        })
    };
    if let CiliumLease::Unreadable(why) = &g.lease
        && !handed_over
    {
        let message = format!(
            "{why}; this node is not taken over until it can be read (or \
             --cilium-operator-absent says Cilium's operator is not installed)"
        );
        return Some(blocked(
            ProblemReason::CiliumLeaseUnreadable,
            message,
            None,
            false,
        ));
    }
    if !g.writers.recorded && !handed_over {
        let why = "the CiliumNode has no metadata.managedFields: who set ipam.cilium.io/ignore \
                   and who wrote its pool cannot be told, so it is not taken over until they \
                   can (the API server records them on every write)";
        return Some(wait(
            Some((WaitReason::OtherAllocator, why.to_string())),
            GUARD_RETRY,
        ));
    }
    let signals = Signals {
        writers: &g.writers,
        cilium_ignore: g.cilium_ignore,
        will_annotate: g.will_annotate,
        lease: g.lease.view(),
        new_cilium_enis: &g.new_cilium_enis,
        now: g.now,
        quiet: g.quiet,
        ignore_unsupported: g.ignore_unsupported.as_deref(),
    };
    let other: OtherAllocator = handover::other_allocator(&signals)?;
    let annotate = handover::annotate_while_blocked(&signals, &other);
    let wait = Some(WaitReason::OtherAllocator);
    Some(blocked(
        other.problem_reason(),
        other.to_string(),
        wait,
        annotate,
    ))
}

#[cfg(test)]
#[path = "admission_tests.rs"]
mod tests;
