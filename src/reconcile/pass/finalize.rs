//! Ends of a node's life, and CiliumNodes that do not parse: the finalizer (give back the
//! ENIs of a node whose Kubernetes Node is gone, then remove our finalizer and forget the
//! node) and the error report on an unparsable object.

use tracing::warn;

use crate::clock;
use crate::crd::FINALIZER;
use crate::ec2::Ec2;
use crate::ipam::ProblemReason;
use crate::ipam::admission::Finalize;
use crate::k8s::input::InvalidNode;
use crate::k8s::sink::{NodeRef, NodeSink, SinkError};
use crate::reconcile::events::{self, EventReason};
use crate::reconcile::finalizer::{GoneNode, gone_node};
use crate::reconcile::queue::Outcome;
use crate::reconcile::shared::Shared;
use crate::reconcile::status::WaitReason;

use super::said::{End, Note, Said};
use super::snapshot::Snapshot;
use super::{DONE, FAILED, Step, Verdict};

/// The CiliumNode is being deleted. With its Node gone and its instance gone or stopped, give
/// back our ENIs first; with the instance still running, keep them (the Node may come back)
/// and look again, up to the grace period; with the Node still there (deleted by hand), touch
/// nothing. A give-back that keeps failing is reported and, after the grace period, let go.
/// Only the admission's `release` is ever given back: the instance the object proves we served
/// it as ([`crate::ipam::confirmed`]), never the one it names (`named`, an agent's claim).
pub(super) async fn finalize<E: Ec2, S: NodeSink>(
    inner: &Shared<E, S>,
    name: &str,
    r: NodeRef,
    decided: &Finalize,
) -> End {
    let mut said = Said::on(r.clone());
    let (named, confirmed) = (decided.named.as_str(), decided.release.as_deref());
    let verdict = let_go(inner, name, &r, named, confirmed, &mut said).await;
    End::with(verdict, said)
}

async fn let_go<E: Ec2, S: NodeSink>(
    inner: &Shared<E, S>,
    name: &str,
    r: &NodeRef,
    named: &str,
    confirmed: Option<&str>,
    said: &mut Said,
) -> Verdict {
    if r.finalizers.iter().any(|f| f == FINALIZER) {
        let result = match confirmed {
            Some(instance) => give_back(inner, name, instance, said).await,
            None => {
                said.event(EventReason::EnisNotReleased, unconfirmed(r, named));
                Ok(None)
            }
        };
        match result {
            Ok(None) => {}
            Ok(Some(wait)) => {
                // Only failures in a row count towards letting go.
                inner.with_slot(name, |s| s.finalize_failing_since = None);
                return (Outcome::RetryAfter(wait), None);
            }
            Err(failure) => {
                let instance = confirmed.unwrap_or(named);
                if !blocked(inner, name, instance, &failure, said) {
                    return FAILED;
                }
            }
        }
        let ticket = inner.ticket(name);
        match inner.sink.set_finalizer(r, false).await {
            Ok(_) | Err(SinkError::NotFound) => {}
            Err(SinkError::Conflict(fresh)) => return inner.conflict(name, fresh, ticket),
            Err(e) => {
                warn!(node = name, error = %e, "could not remove the finalizer");
                return FAILED;
            }
        }
    }
    inner.slots.lock().expect("slots").remove(name);
    inner.forget_instance(named);
    if let Some(instance) = confirmed.filter(|c| *c != named) {
        inner.forget_instance(instance);
    }
    DONE
}

/// A finalizer with nothing to prove it ours (an agent may add it, and name any instance):
/// release nothing, say so (the Event's message), let the object go.
fn unconfirmed(r: &NodeRef, named: &str) -> String {
    let message = format!(
        "nothing released: this CiliumNode does not prove that eni-operator confirmed its \
         instance ({}) and added its finalizer",
        if named.is_empty() {
            "none named"
        } else {
            named
        }
    );
    warn!(node = %r.name, "{message}");
    message
}

/// Give back what the node holds if its Node is gone: `Ok(Some(wait))` while its instance
/// runs (look again then), `Err` with what failed.
async fn give_back<E: Ec2, S: NodeSink>(
    inner: &Shared<E, S>,
    name: &str,
    instance: &str,
    said: &mut Said,
) -> Result<Option<std::time::Duration>, String> {
    // Planted defect (dst-mutants): trust the watch's "gone" instead of asking again.
    let watch_says_gone = crate::mutants::active("drain-is-gone")
        && inner.with_slot(name, |s| s.k8s_node) == Some(Some(false));
    let gone = watch_says_gone
        || !inner
            .sink
            .node_exists(name)
            .await
            .map_err(|e| format!("cannot tell whether the Node exists: {e}"))?;
    if !gone || instance.is_empty() {
        return Ok(None);
    }
    // Another live CiliumNode names the instance (it re-registered under another name, §15):
    // its pods use these ENIs and that static IP. Nothing is given back; our finalizer goes.
    let mut rivals = super::identity::rivals(inner, name, instance);
    // Planted defect (dst-mutants): the finalizer asks no other CiliumNode.
    if crate::mutants::active("release-named-instance") {
        rivals.clear();
    }
    if !rivals.is_empty() {
        tracing::info!(
            node = name,
            instance,
            "the Node is gone but CiliumNode {} names its instance: nothing released",
            rivals.join(", ")
        );
        return Ok(None);
    }
    // Another Node whose providerID names the instance: it runs as that node, whose pods use
    // these ENIs, whatever its CiliumNode says (this name's Node: the live GET above).
    let claimed = inner.nodes.lock().expect("nodes").named_by(instance, name);
    if let Some(node) = claimed {
        tracing::info!(
            node = name,
            instance,
            "Node {node}'s providerID names the instance: nothing released"
        );
        return Ok(None);
    }
    // Only an instance of this cluster is touched (§15); one EC2 does not know any more has
    // nothing attached to touch (our ENIs left behind are released by their tags).
    if inner.config.require_cluster_tag {
        let tagged = super::ec2_facts::tagged(inner, instance)
            .await
            .map_err(|e| format!("cannot read the tags of {instance}: {e}"))?;
        if tagged == Some(false) {
            warn!(
                node = name,
                instance, "EC2 shows the instance without this cluster's tag: nothing released"
            );
            return Ok(None);
        }
    }
    if let Some(wait) = instance_holds(inner, name, instance, said).await? {
        return Ok(Some(wait));
    }
    let ec2_failed = |what: &str, e: crate::ec2::Ec2Error| {
        events::count_ec2_error(&inner.metrics, &e);
        format!("cannot {what} of {instance}: {e}")
    };
    super::static_ip::disassociate(inner, name, instance, said)
        .await
        .map_err(|e| ec2_failed("disassociate the static IP", e))?;
    release(inner, instance, said)
        .await
        .map_err(|e| ec2_failed("release the ENIs", e))?;
    Ok(None)
}

/// The give-back failed: say so on the object (operator-status, a Warning Event, counted in
/// `eni_operator_errors_total{reason="FinalizerBlocked"}`, once per message) and retry; once it
/// has failed for the grace period, let the object go (true) so that a new instance with this
/// name gets its CiliumNode; our ENIs left behind are the ENI GC's once unattached.
fn blocked<E: Ec2, S: NodeSink>(
    inner: &Shared<E, S>,
    name: &str,
    instance: &str,
    failure: &str,
    said: &mut Said,
) -> bool {
    let now = clock::now();
    let since = inner
        .with_slot(name, |s| *s.finalize_failing_since.get_or_insert(now))
        .unwrap_or(now);
    let grace = inner.config.node_gone_grace;
    if now.saturating_duration_since(since) >= grace {
        let message = format!(
            "the finalizer has failed for {grace:?} (--node-gone-grace-period): letting the \
             CiliumNode go; ENIs of ours left on {instance} go to the ENI GC once unattached. \
             Last failure: {failure}"
        );
        // Once, however often the removal itself has to be retried.
        if inner.new_problem(name, &message) {
            warn!(node = name, "{message}");
            inner.metrics.finalizers_let_go.inc();
            said.event(EventReason::FinalizerLetGo, message);
        }
        return true;
    }
    let reason = ProblemReason::FinalizerBlocked;
    let message = format!(
        "{}: {failure} (retrying; the CiliumNode is let go after {grace:?} of failures)",
        reason.as_str()
    );
    warn!(node = name, "{message}");
    if inner.new_problem(name, &message) {
        said.problem(reason, &message);
    }
    false
}

/// The watch said the Node is gone: is it, right now? A live GET before the CiliumNode is
/// deleted, because the watch's Delete may be about an object that a new Node of the same
/// name has since replaced (AWS names Nodes by private IP, and IPs are reused; a Node deleted
/// and re-registered quickly): any Node of that name now, whatever its uid, means the name's
/// CiliumNode is in use. A Node seen present again ends the slot's "gone" (and its grace).
pub(super) async fn node_gone_now<E: Ec2, S: NodeSink>(
    inner: &Shared<E, S>,
    name: &str,
) -> Step<bool> {
    // Planted defect (dst-mutants): delete on the watch event alone.
    if crate::mutants::active("delete-on-watch") {
        return Ok(true);
    }
    // Planted defect (dst-mutants): a draining Node counted as gone (the watch's word, taken
    // here as in `finalize`, where the live GET would otherwise catch it).
    if crate::mutants::active("drain-is-gone")
        && inner.with_slot(name, |s| s.k8s_node) == Some(Some(false))
    {
        return Ok(true);
    }
    if !node_exists(inner, name).await? {
        return Ok(true);
    }
    inner.with_slot(name, |s| {
        s.k8s_node = Some(true);
        s.node_gone_since = None;
    });
    Ok(false)
}

async fn node_exists<E: Ec2, S: NodeSink>(inner: &Shared<E, S>, name: &str) -> Step<bool> {
    inner.sink.node_exists(name).await.map_err(|e| {
        warn!(node = name, error = %e, "cannot tell whether the Node exists");
        FAILED
    })
}

/// The Node is gone: may its instance's ENIs go now (`None`), or does the instance still run
/// (`Some`: look again after this long)? A Node object is deleted while its instance keeps
/// running by remediation tools and people; its kubelet re-registers it, and its pods keep
/// using these ENIs meanwhile.
async fn instance_holds<E: Ec2, S: NodeSink>(
    inner: &Shared<E, S>,
    name: &str,
    instance: &str,
    said: &mut Said,
) -> Result<Option<std::time::Duration>, String> {
    // Planted defect (dst-mutants): release at once, without looking at the instance.
    if crate::mutants::active("release-running-instance") {
        return Ok(None);
    }
    let state = super::ec2_facts::instance_state(inner, instance).await?;
    let now = clock::now();
    let since = inner
        .with_slot(name, |s| *s.node_gone_since.get_or_insert(now))
        .unwrap_or(now);
    let grace = inner.config.node_gone_grace;
    match gone_node(state, now.saturating_duration_since(since), grace) {
        GoneNode::Release => Ok(None),
        GoneNode::Keep(wait) => {
            if since == now {
                let message = format!(
                    "the Node is gone but {instance} still runs: its ENIs are kept for up to \
                     {grace:?} (released earlier once the instance stops or terminates)"
                );
                said.event(EventReason::EnisKept, message);
            }
            Ok(Some(wait))
        }
        GoneNode::ReleaseAfterGrace => {
            let message = format!(
                "the Node has been gone for {grace:?} (--node-gone-grace-period) while {instance} \
                 still runs: releasing its ENIs"
            );
            warn!(node = name, instance, "{message}");
            said.event(EventReason::EnisKept, message);
            Ok(None)
        }
    }
}

/// Detach and delete the instance's ENIs of ours (the executor's action).
async fn release<E: Ec2, S: NodeSink>(
    inner: &Shared<E, S>,
    instance: &str,
    said: &mut Said,
) -> Result<(), crate::ec2::Ec2Error> {
    let cluster = &inner.config.ipam.cluster_name;
    let n = inner.executor.give_back_enis(cluster, instance).await?;
    if n > 0 {
        let message = format!("detached and deleted {n} ENIs of {instance}");
        said.event(EventReason::EnisReleased, message);
    }
    Ok(())
}

/// A CiliumNode that does not parse. Its deletion works from metadata alone (with the Node
/// gone, delete it; once deleted, release and drop our finalizer), so it never hangs in
/// Terminating; otherwise the error goes on the object (once per message). Its error is on the
/// status page either way.
pub(super) async fn invalid<E: Ec2, S: NodeSink>(
    inner: &Shared<E, S>,
    name: &str,
    mut invalid: InvalidNode,
    snap: &Snapshot,
) -> End {
    let mut said = Said::on(invalid.node.clone());
    said.add(Note::Error(invalid.error.clone()));
    said.wait(WaitReason::Error, invalid.error.clone(), None);
    let gone = snap.k8s_node == Some(false)
        && !invalid.deleting
        && match node_gone_now(inner, name).await {
            Ok(gone) => gone,
            Err(verdict) => return End::with(verdict, said),
        };
    if gone {
        match inner.sink.delete(name).await {
            Ok(()) | Err(SinkError::NotFound) => {}
            Err(e) => {
                warn!(node = name, error = %e, "could not delete the CiliumNode");
                return End::with(FAILED, said);
            }
        }
        invalid.deleting = true;
        inner.with_slot(name, |s| {
            if let Some(i) = s.invalid.as_mut() {
                i.deleting = true;
            }
        });
    }
    if invalid.deleting {
        // The instance from the object itself, else from its last version that parsed; what
        // may be released only from what that version, the same object, proved.
        let last = snap
            .node
            .as_ref()
            .filter(|n| n.uid() == invalid.node.uid.as_deref());
        let release = last.and_then(|n| n.confirmed().releasable().map(str::to_string));
        let named = if invalid.instance_id.is_empty() {
            last.map(|n| n.instance_id().to_string())
                .unwrap_or_default()
        } else {
            invalid.instance_id
        };
        let decided = Finalize {
            delete: false,
            named,
            release,
        };
        let end = finalize(inner, name, invalid.node, &decided).await;
        said.extend(end.said);
        return End::with(end.verdict, said);
    }
    // Said until written ([`Note::Invalid`]).
    if snap.invalid_reported.as_deref() != Some(invalid.error.as_str()) {
        said.add(Note::Invalid {
            error: invalid.error,
        });
    }
    End::with(DONE, said)
}
