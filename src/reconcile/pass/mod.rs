//! One pass over one node, as named steps in the order they run:
//! [`snapshot`] (the node's slot, copied) -> [`lifecycle`] (the facts, and the one admission
//! decision of [`crate::ipam::admission`] carried out: hand back, leave alone, finalize, wait,
//! refuse, or take the admitted node over; may end the pass) -> [`ec2_facts::for_plan`]
//! (health, hold, limits) -> [`plan`] (the engine's plan, the multi-pool re-read) ->
//! [`execute`] (the one EC2 action) -> [`write`] (desired state, change set, sink) ->
//! [`report`] (Events, next priority, what the slot keeps). [`static_ip`] runs between
//! lifecycle and the plan's facts (a static IP comes before any allocation, as in Cilium). A
//! step that ends the pass returns its [`Verdict`] as the error.
//!
//! EC2 is read in [`ec2_facts`] (the facts a decision asks for, read before it) and changed
//! only by the executor ([`crate::reconcile::executor`]): the engine's action, and the
//! finalizer's and the static IP's calls.
//!
//! State: a pass owns its node's slot from snapshot to report (the queue never runs two passes
//! of a node at once); the EC2 cache is shared, written only by the executor and refresher.

mod ec2_facts;
mod execute;
mod finalize;
mod guard;
mod identity;
mod lifecycle;
mod plan;
mod report;
mod said;
mod shadow;
mod snapshot;
mod static_ip;
mod write;

use std::time::Duration;

use crate::crd::{CiliumNode, ReleaseState};
use crate::ec2::{Ec2, NetworkInterface};

use crate::cache::Ec2Cache;
use crate::k8s::sink::NodeSink;
use crate::k8s::stored::StoredNode;
use crate::reconcile::nodes::Slot;
use crate::reconcile::queue::{Outcome, Priority};
use crate::reconcile::shared::Shared;

use said::End;

/// How a pass ends: the queue's outcome, and the priority to queue the node again at (`None`:
/// not at once).
pub(super) type Verdict = (Outcome, Option<Priority>);

/// A step's result: go on with `T`, or end the pass.
type Step<T> = Result<T, Verdict>;

const DONE: Verdict = (Outcome::Done, None);
const FAILED: Verdict = (Outcome::Failed, None);

/// One pass over one node. Never runs twice at once for a node (the queue sees to it).
pub(crate) async fn pass<E: Ec2, S: NodeSink>(inner: &Shared<E, S>, name: &str) -> Verdict {
    inner.metrics.passes.inc();
    let start = crate::clock::now();
    let work = one_pass(inner, name);
    // The gate reports throttled answers to the node's status through this scope.
    let book = inner.status.clone();
    let verdict = crate::reconcile::status::scope(book, name, start, work).await;
    let seconds = crate::clock::now().saturating_duration_since(start);
    // Cilium's pool-maintainer ("deficit_resolver") trigger run duration.
    inner
        .metrics
        .cilium
        .deficit_duration
        .observe(seconds.as_secs_f64());
    verdict
}

/// The chain of steps; a pass a step ended is reported by [`report::ended`]. A shadow core
/// (built only from read-only types: `Core::shadow`) compares, never acts.
async fn one_pass<E: Ec2, S: NodeSink>(inner: &Shared<E, S>, name: &str) -> Verdict {
    let Some(book) = &inner.shadow else {
        return match chain(inner, name).await {
            Ok(verdict) => verdict,
            Err(end) => report::ended(inner, name, end).await,
        };
    };
    shadow::pass(inner, name, book).await
}

async fn chain<E: Ec2, S: NodeSink>(inner: &Shared<E, S>, name: &str) -> Result<Verdict, End> {
    let mut snap = snapshot::take(inner, name)?;
    let mut memory = std::mem::take(&mut snap.memory);
    let node = lifecycle::admit(inner, name, &snap).await?;
    let (node, statics) = static_ip::ensure(inner, name, node).await?;
    let facts = ec2_facts::for_plan(inner, name, &node, &snap).await?;
    let mut planned = plan::plan(inner, name, &node, &mut memory, &snap, facts).await?;
    statics.hold(&mut planned);
    let executed = execute::execute(inner, &planned, &mut memory).await;
    let written = write::write(inner, name, &node, &planned, &executed, &memory).await?;
    let verdict = report::report(inner, name, &node, planned, executed, written, memory).await;
    Ok(statics.verdict(verdict))
}

/// The node's ENIs without what a lagging describe may show early in a leadership and its
/// agent may not use: not in its pool, or given up in the release handshake
/// (`ready-for-release`, `released`: the previous leader may have unassigned it and crashed
/// before writing the pool; handing it back to the agent would let a pod use an address EC2
/// no longer has, `make dst` seed 220) (§14.1); `None`: the cache's own.
fn held_back(cache: &Ec2Cache, node: &CiliumNode) -> Option<Vec<NetworkInterface>> {
    let pool = &node.spec.ipam.pool;
    let answers = crate::ipam::release::release_answers(node);
    cache.held_back_enis(&node.spec.instance_id, |ip| {
        let given_up = matches!(
            answers.get(ip),
            Some(ReleaseState::ReadyForRelease | ReleaseState::Released)
        );
        pool.contains_key(&ip.to_string()) && !given_up
    })
}

impl<E: Ec2, S: NodeSink> Shared<E, S> {
    pub(super) fn with_slot<T>(&self, name: &str, f: impl FnOnce(&mut Slot) -> T) -> Option<T> {
        let mut slots = self.slots.lock().expect("slots");
        slots.get_mut(name).map(f)
    }

    /// Remember `message` as the node's last problem: whether it is new (a message is said
    /// once, however often its pass repeats).
    fn new_problem(&self, name: &str, message: &str) -> bool {
        let last = self.with_slot(name, |s| s.last_problem.replace(message.to_string()));
        last.flatten().as_deref() != Some(message)
    }

    /// The slot's watch delivery number, taken right before a write (see [`Ticket`]).
    fn ticket(&self, name: &str) -> Ticket {
        Ticket(self.with_slot(name, |s| s.delivery))
    }

    /// Keep this version of the node (one we wrote, or a fresher one a conflict returned),
    /// unless the watch delivered another since `ticket` was taken (§12.1).
    fn store(&self, name: &str, node: &CiliumNode, ticket: Ticket) {
        // Serialised before the slots lock is taken.
        let mut stored = StoredNode::new(node);
        self.with_slot(name, |s| {
            if ticket.holds(s) {
                stored.keep_proof_of(node, s.node.as_ref());
                s.node = Some(stored);
            }
        });
    }

    /// A write met a newer version: keep it and try again shortly.
    fn conflict(&self, name: &str, fresh: Option<Box<CiliumNode>>, ticket: Ticket) -> Verdict {
        if let Some(f) = fresh {
            self.store(name, &f, ticket);
        }
        (Outcome::RetryAfter(Duration::from_millis(500)), None)
    }
}

/// The slot's watch delivery number right before a write. The answer to the write (or the
/// object a conflict or a failed write's re-read returns) goes into the slot only while that
/// number holds: an agent's update the watch delivered meanwhile may be newer than the answer
/// (its write landed after ours) and the watch would never deliver it again. resourceVersions
/// are opaque (Kubernetes promises no numeric order), so the watch's own order decides: an
/// object it delivered after our write was sent is kept, and if that one is older than our
/// answer, the watch delivers our write's own event next (§12.1).
#[derive(Clone, Copy, Debug)]
pub(super) struct Ticket(Option<u64>);

impl Ticket {
    /// Nothing delivered since the ticket was taken (and the slot is the same).
    fn holds(self, slot: &Slot) -> bool {
        // Planted defect (dst-mutants): the write's answer always wins (the behaviour before
        // issue 29).
        if crate::mutants::active("keep-write-answer") {
            return true;
        }
        self.0 == Some(slot.delivery)
    }
}
