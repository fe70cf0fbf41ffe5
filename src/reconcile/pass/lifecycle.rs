//! Step 2: whether the node is ours to serve now. Ends the pass for an ignored node (handed
//! back), a node out of `--instance-tags-filter` scope (left alone), a node whose Kubernetes
//! Node is gone (deleted) or that is being deleted ([`super::finalize`]), a node whose Node does
//! not confirm its instance or whose instance another CiliumNode names ([`super::identity`]).
//! Otherwise records the confirmed instance on the object and makes sure of our finalizer and of
//! Cilium's ignore annotation before EC2 is touched for the node.

use tracing::{info, warn};

use crate::crd::{CILIUM_IGNORE_ANNOTATION, CiliumNode, FINALIZER};
use crate::ec2::Ec2;
use crate::ipam::confirmed::{CONFIRMED_INSTANCE_ANNOTATION, Confirmed};
use crate::k8s::sink::{NodeRef, NodeSink, SinkError, SinkResult};
use crate::k8s::stored::StoredNode;
use crate::reconcile::queue::Outcome;
use crate::reconcile::shared::Shared;

use super::snapshot::Snapshot;
use super::{DONE, FAILED, Step, Verdict, cluster_tag, finalize, guard, identity};

/// The parsed node to serve, or the end of the pass.
pub(super) async fn admit<E: Ec2, S: NodeSink>(
    inner: &Shared<E, S>,
    name: &str,
    snap: &Snapshot,
) -> Step<CiliumNode> {
    if let Some(invalid) = &snap.invalid {
        return Err(finalize::invalid(inner, name, invalid.clone(), snap).await);
    }
    // Parsed outside the slots lock.
    let mut node = snap.node.as_ref().map(StoredNode::node).ok_or(DONE)?;
    let proof = snap
        .node
        .as_ref()
        .map(|s| s.confirmed().clone())
        .unwrap_or_default();
    if snap.ignored {
        return Err(hand_back(inner, name, node).await);
    }
    // --instance-tags-filter: an instance without the tags is not ours (another operator may
    // serve it, as with Cilium's filter): leave its CiliumNode alone.
    let in_scope = inner
        .cache
        .read()
        .expect("cache")
        .in_scope(&node.spec.instance_id);
    match in_scope {
        Some(true) => {}
        // Tags not known yet (the check failed): the next full refresh tells.
        None => return Err((Outcome::RetryAfter(inner.config.unhealthy_retry), None)),
        Some(false) => return Err(leave_alone(inner, name, &node).await),
    }
    // Canary handover: a node outside `--handover-selector` is not ours; one we served is
    // handed back (rollback), others are not written at all.
    if !selected(inner, &node) {
        if has_finalizer(&node) {
            return Err(hand_back(inner, name, node).await);
        }
        return Err(DONE);
    }
    // The Kubernetes Node is gone: delete the CiliumNode; the finalizer runs next.
    if snap.k8s_node == Some(false)
        && node.metadata.deletion_timestamp.is_none()
        && finalize::node_gone_now(inner, name).await?
    {
        delete(inner, name, &mut node).await?;
    }
    if node.metadata.deletion_timestamp.is_some() {
        let r = NodeRef::of(&node);
        let named = &node.spec.instance_id;
        return Err(finalize::finalize(inner, name, &r, named, proof.releasable()).await);
    }
    identity::check(inner, name, &node).await?;
    cluster_tag::confirm(inner, name, &node).await?;
    guard::check(inner, name, &node, snap).await?;
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

fn has_finalizer(node: &CiliumNode) -> bool {
    node.metadata
        .finalizers
        .as_ref()
        .is_some_and(|f| f.iter().any(|x| x == FINALIZER))
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
    node: &mut CiliumNode,
    ours: bool,
) -> Step<()> {
    if has_finalizer(node) && ours {
        return Ok(());
    }
    for present in [false, true] {
        let ticket = inner.ticket(name);
        match inner.sink.set_finalizer(&NodeRef::of(node), present).await {
            Ok(Some(n)) => *node = n,
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
    node: &mut CiliumNode,
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
            Ok(Some(n)) => *node = n,
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
    node: &mut CiliumNode,
) -> Step<()> {
    let ticket = inner.ticket(name);
    match mark_cilium_ignore(inner, node, true).await {
        Ok(Some(n)) => {
            *node = n;
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
    let said = inner.with_slot(name, |s| s.last_problem.replace(NOT_MANAGED.into()));
    if said.flatten().as_deref() != Some(NOT_MANAGED) {
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
