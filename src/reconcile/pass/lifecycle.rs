//! Step 2: whether the node is ours to serve now. Gathers the pass's facts ([`Facts`]), lets
//! [`admission::decide`] (pure) say what becomes of the node, reads a costly fact only when the
//! decision asks for it, and carries the answer out: hand back, leave alone, finalize
//! ([`super::finalize`]), wait or refuse (said by [`super::report`]), or take the admitted node
//! over (record the confirmed instance, our finalizer, Cilium's ignore annotation) before EC2 is
//! touched for it.

use tracing::{info, warn};

use crate::clock;
use crate::crd::{CILIUM_IGNORE_ANNOTATION, CiliumNode, FINALIZER};
use crate::ec2::Ec2;
use crate::ipam::ProblemReason;
use crate::ipam::admission::{
    self, AdmittedNode, ClusterTag, Decision, Facts, Guard, LeaveAlone, Need, Refusal, Settled,
};
use crate::ipam::confirmed::{CONFIRMED_INSTANCE_ANNOTATION, Confirmed};
use crate::k8s::sink::{NodeRef, NodeSink, SinkError, SinkResult};
use crate::k8s::stored::StoredNode;
use crate::reconcile::queue::Outcome;
use crate::reconcile::shared::Shared;

use super::said::{self, End, Said};
use super::snapshot::Snapshot;
use super::{DONE, FAILED, Step, Verdict, ec2_facts, finalize, guard, identity};

/// The admitted node to serve, or the end of the pass.
pub(super) async fn admit<E: Ec2, S: NodeSink>(
    inner: &Shared<E, S>,
    name: &str,
    snap: &Snapshot,
) -> Result<AdmittedNode, End> {
    if let Some(invalid) = &snap.invalid {
        return Err(finalize::invalid(inner, name, invalid.clone(), snap).await);
    }
    let stored = snap.node.as_ref().ok_or(End::from(DONE))?;
    let mut facts = facts(inner, name, stored, snap, false);
    loop {
        match admission::decide(&facts) {
            Decision::Need(need) => read(inner, name, stored, &mut facts, need).await?,
            Decision::Serve(serve) => {
                return Ok(take_over(inner, name, facts.admit(serve)).await?);
            }
            decision => return Err(act(inner, name, facts.node, decision).await),
        }
    }
}

/// The facts that cost no call (locks and the slot's copy). A shadow has no guard and asks EC2
/// nothing of the cluster tag.
pub(super) fn facts<E: Ec2, S: NodeSink>(
    inner: &Shared<E, S>,
    name: &str,
    stored: &StoredNode,
    snap: &Snapshot,
    shadow: bool,
) -> Facts {
    // Parsed outside the slots lock.
    let node = stored.node();
    let instance = &node.spec.instance_id;
    let in_scope = inner.cache.read().expect("cache").in_scope(instance);
    let (identity, rivals) = identity::read(inner, name, instance);
    let cluster_tag = if inner.config.require_cluster_tag && !shadow {
        ClusterTag::NotRead
    } else {
        ClusterTag::NotRequired
    };
    let (guard, settled) = if shadow {
        (Guard::Off, Settled::Yes)
    } else {
        (Guard::NotRead, Settled::NotRead)
    };
    Facts {
        confirmed: stored.confirmed().clone(),
        ignored: snap.ignored,
        in_scope,
        selected: selected(inner, &node),
        watch_says_gone: snap.k8s_node == Some(false),
        gone_now: None,
        identity,
        rivals,
        cluster_tag,
        guard,
        settled,
        unhealthy_retry: inner.config.unhealthy_retry,
        cluster_name: inner.config.ipam.cluster_name.clone(),
        node,
    }
}

/// Read the fact the decision asked for.
async fn read<E: Ec2, S: NodeSink>(
    inner: &Shared<E, S>,
    name: &str,
    stored: &StoredNode,
    facts: &mut Facts,
    need: Need,
) -> Step<()> {
    let instance = facts.node.spec.instance_id.clone();
    match need {
        Need::NodeGone => {
            let gone = finalize::node_gone_now(inner, name).await?;
            facts.gone_now = Some(gone);
            // A Node found again under the name changes what the watch told.
            (facts.identity, facts.rivals) = identity::read(inner, name, &instance);
        }
        Need::ClusterTag => facts.cluster_tag = ec2_facts::read(inner, name, &instance).await,
        Need::Guard => {
            let g = guard::read(inner, name, &facts.node, stored.writers());
            facts.guard = Guard::Read(Box::new(g));
        }
        Need::Settled => {
            facts.settled = ec2_facts::settled(inner, name, &instance, stored.writers()).await;
        }
    }
    Ok(())
}

/// Carry out a decision that does not serve the node; what it says is the report's.
async fn act<E: Ec2, S: NodeSink>(
    inner: &Shared<E, S>,
    name: &str,
    mut node: CiliumNode,
    decision: Decision,
) -> End {
    match decision {
        Decision::HandBack => hand_back(inner, name, node).await.into(),
        Decision::LeaveAlone(LeaveAlone::OutOfScope) => {
            leave_alone(inner, name, &node).await.into()
        }
        Decision::LeaveAlone(LeaveAlone::NotSelected | LeaveAlone::NotServed) => DONE.into(),
        Decision::Wait { wait, retry } => {
            let said = said::waiting(wait, retry, clock::now());
            End::with((Outcome::RetryAfter(retry), None), said)
        }
        Decision::Refuse(refusal) => {
            if refusal.guard_blocked {
                inner.metrics.other_allocator_blocked.inc();
            }
            if refusal.annotate {
                guard::annotate(inner, name, &node).await;
            }
            let verdict = (Outcome::RetryAfter(refusal.retry), None);
            End::with(verdict, refused(inner, name, &node, &refusal))
        }
        Decision::Finalize(f) => {
            if f.delete
                && let Err(end) = delete(inner, name, &mut node).await
            {
                return end.into();
            }
            let r = NodeRef::of(&node);
            finalize::finalize(inner, name, r, &f).await
        }
        Decision::Serve(_) | Decision::Need(_) => unreachable!("decided by `admit`"),
    }
}

/// What a refusal says: its message is new on the node or not (the slot remembers the last).
fn refused<E: Ec2, S: NodeSink>(
    inner: &Shared<E, S>,
    name: &str,
    node: &CiliumNode,
    refusal: &Refusal,
) -> Said {
    if refusal.reason == ProblemReason::InstanceNamedTwice {
        tracing::error!(node = name, "{}", refusal.message);
    }
    let message = said::refusal_message(refusal);
    let new = inner.new_problem(name, &message);
    if new {
        warn!(node = name, "{message}");
    }
    said::refused(NodeRef::of(node), refusal, new, clock::now())
}

/// Take the admitted node over before EC2 is touched for it: the confirmed instance recorded,
/// our finalizer, Cilium's ignore annotation.
async fn take_over<E: Ec2, S: NodeSink>(
    inner: &Shared<E, S>,
    name: &str,
    mut node: AdmittedNode,
) -> Step<AdmittedNode> {
    let proof = node.confirmed().clone();
    record_instance(inner, name, &mut node, &proof).await?;
    add_finalizer(inner, name, &mut node, proof.finalizer_ours).await?;
    claim(inner, name, &mut node).await?;
    Ok(node)
}

fn selected<E: Ec2, S: NodeSink>(inner: &Shared<E, S>, node: &CiliumNode) -> bool {
    let Some((key, value)) = &inner.config.handover_selector else {
        return true;
    };
    node.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(key))
        .is_some_and(|v| v == value)
}

/// Delete the CiliumNode of a Node that is gone; go on as if the deletion was seen.
async fn delete<E: Ec2, S: NodeSink>(
    inner: &Shared<E, S>,
    name: &str,
    node: &mut CiliumNode,
) -> Step<()> {
    let ticket = inner.ticket(name);
    match inner.sink.delete(name).await {
        Ok(()) | Err(SinkError::NotFound) => {}
        Err(e) => {
            warn!(node = name, error = %e, "could not delete the CiliumNode");
            return Err(FAILED);
        }
    }
    node.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
    ));
    inner.store(name, node, ticket);
    Ok(())
}

/// Our finalizer, put there by us: one another writer added (an agent may) is taken off and
/// added again, so that the API server records it as ours ([`Confirmed`]).
async fn add_finalizer<E: Ec2, S: NodeSink>(
    inner: &Shared<E, S>,
    name: &str,
    node: &mut AdmittedNode,
    ours: bool,
) -> Step<()> {
    if admission::has_finalizer(node) && ours {
        return Ok(());
    }
    for present in [false, true] {
        let ticket = inner.ticket(name);
        match inner.sink.set_finalizer(&NodeRef::of(node), present).await {
            Ok(Some(n)) => node.replace(n),
            Ok(None) => continue,
            Err(SinkError::NotFound) => return Err(DONE),
            Err(SinkError::Conflict(fresh)) => return Err(inner.conflict(name, fresh, ticket)),
            Err(e) => {
                warn!(node = name, error = %e, "could not add the finalizer");
                return Err(FAILED);
            }
        }
        inner.store(name, node, ticket);
    }
    Ok(())
}

/// Record on the object, under our field manager, the instance its Node confirmed, before our
/// finalizer goes on: the finalizer gives back only what this names. A record another writer
/// made with the same value is removed first (rewriting an unchanged value moves no ownership).
async fn record_instance<E: Ec2, S: NodeSink>(
    inner: &Shared<E, S>,
    name: &str,
    node: &mut AdmittedNode,
    proof: &Confirmed,
) -> Step<()> {
    let instance = node.spec.instance_id.clone();
    if instance.is_empty() || proof.instance.as_deref() == Some(instance.as_str()) {
        return Ok(());
    }
    let current = node
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(CONFIRMED_INSTANCE_ANNOTATION))
        .cloned();
    let steps = match current {
        Some(v) if v == instance => vec![None, Some(instance.as_str())],
        _ => vec![Some(instance.as_str())],
    };
    for value in steps {
        let ticket = inner.ticket(name);
        let r = NodeRef::of(node);
        match inner
            .sink
            .set_annotation(&r, CONFIRMED_INSTANCE_ANNOTATION, value)
            .await
        {
            Ok(Some(n)) => node.replace(n),
            Ok(None) => {}
            Err(SinkError::NotFound) => return Err(DONE),
            Err(e) => {
                warn!(node = name, error = %e, "could not record the confirmed instance");
                return Err(FAILED);
            }
        }
        inner.store(name, node, ticket);
    }
    Ok(())
}

/// Tell Cilium's operator to keep off before we touch EC2 for the node.
async fn claim<E: Ec2, S: NodeSink>(
    inner: &Shared<E, S>,
    name: &str,
    node: &mut AdmittedNode,
) -> Step<()> {
    let ticket = inner.ticket(name);
    match mark_cilium_ignore(inner, node, true).await {
        Ok(Some(n)) => {
            node.replace(n);
            inner.store(name, node, ticket);
            Ok(())
        }
        Ok(None) => Ok(()),
        Err(SinkError::NotFound) => Err(DONE),
        Err(e) => {
            warn!(node = name, error = %e, "could not set {CILIUM_IGNORE_ANNOTATION}");
            Err(FAILED)
        }
    }
}

/// An ignored node still carrying our finalizer: hand it back (Cilium's operator may serve it
/// again) and remove the finalizer.
async fn hand_back<E: Ec2, S: NodeSink>(
    inner: &Shared<E, S>,
    name: &str,
    node: CiliumNode,
) -> Verdict {
    let node = match mark_cilium_ignore(inner, &node, false).await {
        Ok(fresh) => fresh.unwrap_or(node),
        Err(SinkError::NotFound) => {
            inner.slots.lock().expect("slots").remove(name);
            return DONE;
        }
        Err(e) => {
            warn!(node = name, error = %e, "could not remove {CILIUM_IGNORE_ANNOTATION}");
            return FAILED;
        }
    };
    match inner.sink.set_finalizer(&NodeRef::of(&node), false).await {
        Ok(_) | Err(SinkError::NotFound) => {
            inner.slots.lock().expect("slots").remove(name);
            inner.forget_instance(&node.spec.instance_id);
            DONE
        }
        Err(_) => FAILED,
    }
}

/// A node whose instance lacks the `--instance-tags-filter` tags: no writes, no EC2 calls;
/// only our finalizer goes, should it have one (its instance lost the tags), as for an
/// ignored node. Said once in the log; a rescan checks the tags again.
async fn leave_alone<E: Ec2, S: NodeSink>(
    inner: &Shared<E, S>,
    name: &str,
    node: &CiliumNode,
) -> Verdict {
    const NOT_MANAGED: &str = "instance lacks the --instance-tags-filter tags";
    if inner.new_problem(name, NOT_MANAGED) {
        info!(
            node = name,
            instance = node.spec.instance_id,
            "not managed: {NOT_MANAGED}"
        );
    }
    let r = NodeRef::of(node);
    if !r.finalizers.iter().any(|f| f == FINALIZER) {
        return DONE;
    }
    let ticket = inner.ticket(name);
    match inner.sink.set_finalizer(&r, false).await {
        Ok(_) | Err(SinkError::NotFound) => DONE,
        Err(SinkError::Conflict(fresh)) => inner.conflict(name, fresh, ticket),
        Err(e) => {
            warn!(node = name, error = %e, "could not remove the finalizer");
            FAILED
        }
    }
}

/// `--annotate-cilium-ignore`: make `ipam.cilium.io/ignore` say whether we serve the node,
/// with a merge patch of that one annotation, only when it is wrong (no write otherwise).
async fn mark_cilium_ignore<E: Ec2, S: NodeSink>(
    inner: &Shared<E, S>,
    node: &CiliumNode,
    serve: bool,
) -> SinkResult<Option<CiliumNode>> {
    if !inner.config.annotate_cilium_ignore {
        return Ok(None);
    }
    let current = node
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(CILIUM_IGNORE_ANNOTATION));
    let want = serve.then_some("true");
    if current.map(String::as_str) == want {
        return Ok(None);
    }
    inner
        .sink
        .set_annotation(&NodeRef::of(node), CILIUM_IGNORE_ANNOTATION, want)
        .await
}
