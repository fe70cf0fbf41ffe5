//! Part of step 2: the handover guard. Before the first write that takes a node over and on
//! every pass after, ask [`handover::other_allocator`] (pure) whether another allocator serves
//! the node; if so, end the pass: no EC2 call, no pool write; the node's
//! `status.ipam.operator-status` and one Warning Event (`OtherAllocatorActive`, or
//! `CiliumIgnoresAnnotation` when Cilium's operator is too old for the annotation; counted in
//! `eni_operator_errors_total`) say why, once per message; the node is checked again shortly.

use std::time::Duration;

use tracing::debug;

use crate::cache::DESCRIBE_LAG;
use crate::clock;
use crate::crd::{CILIUM_IGNORE_ANNOTATION, CiliumNode, FINALIZER};
use crate::ec2::Ec2;
use crate::ipam::ProblemReason;
use crate::ipam::handover::{self, CiliumLease, Signals};
use crate::ipam::ownership::is_owned_by;
use crate::k8s::sink::NodeRef;
use crate::k8s::sink::NodeSink;
use crate::reconcile::queue::Outcome;
use crate::reconcile::shared::Shared;
use crate::reconcile::status::WaitReason;

use super::Step;
use super::snapshot::Snapshot;

/// How soon a blocked node is checked again.
pub(super) const RECHECK: Duration = Duration::from_secs(15);

pub(super) async fn check<E: Ec2, S: NodeSink>(
    inner: &Shared<E, S>,
    name: &str,
    node: &CiliumNode,
    snap: &Snapshot,
) -> Step<()> {
    let Some(stored) = snap.node.as_ref() else {
        return Ok(());
    };
    let lease = inner.cilium_lease.read().expect("lease").clone();
    // Fail closed (§16): without the Lease we cannot tell whether Cilium's operator serves
    // a node we have not taken over yet. Nodes already ours go on.
    if let CiliumLease::Unreadable(why) = &lease
        && !handed_over(node)
    {
        inner.metrics.other_allocator_blocked.inc();
        let message = format!(
            "{why}; this node is not taken over until it can be read (or --cilium-operator-absent says Cilium's operator is not installed)"
        );
        super::problem::say(
            inner,
            name,
            node,
            ProblemReason::CiliumLeaseUnreadable,
            &message,
        )
        .await;
        return Err((Outcome::RetryAfter(RECHECK), None));
    }
    let cilium_ignore = node
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(CILIUM_IGNORE_ANNOTATION))
        .is_some_and(|v| v.eq_ignore_ascii_case("true"));
    let new_enis = new_cilium_enis(inner, name, &node.spec.instance_id);
    let ignore_unsupported = inner
        .cilium_version
        .read()
        .expect("cilium version")
        .ignore_unsupported();
    let signals = Signals {
        writers: stored.writers(),
        cilium_ignore,
        will_annotate: inner.config.annotate_cilium_ignore,
        lease: lease.view(),
        new_cilium_enis: &new_enis,
        now: inner.wall_now(),
        quiet: inner.config.handover_quiet,
        ignore_unsupported: ignore_unsupported.as_deref(),
    };
    let Some(other) = handover::other_allocator(&signals) else {
        return settled(inner, name, &node.spec.instance_id, stored.writers()).await;
    };
    inner.metrics.other_allocator_blocked.inc();
    if handover::annotate_while_blocked(&signals, &other) {
        annotate(inner, name, node).await;
    }
    let message = other.to_string();
    let retry = clock::now() + RECHECK;
    inner.status.wait(
        name,
        WaitReason::OtherAllocator,
        message.clone(),
        Some(retry),
    );
    super::problem::say(inner, name, node, other.problem_reason(), &message).await;
    Err((Outcome::RetryAfter(RECHECK), None))
}

/// Sets `ipam.cilium.io/ignore` on a node Cilium's running leader still serves, so its next
/// leader keeps off it ([`handover::annotate_while_blocked`]). A failure is retried on the
/// next check.
async fn annotate<E: Ec2, S: NodeSink>(inner: &Shared<E, S>, name: &str, node: &CiliumNode) {
    let ticket = inner.ticket(name);
    match inner
        .sink
        .set_annotation(&NodeRef::of(node), CILIUM_IGNORE_ANNOTATION, Some("true"))
        .await
    {
        Ok(Some(fresh)) => inner.store(name, &fresh, ticket),
        Ok(None) => {}
        Err(e) => debug!(node = name, error = %e, "could not set {CILIUM_IGNORE_ANNOTATION}"),
    }
}

/// Another allocator wrote the node's pool after us (a node just handed over): plan only from a
/// listing of its instance that started at least [`DESCRIBE_LAG`] after that write, or a
/// describe may still hide that allocator's last assigns and our pool write would drop addresses
/// EC2 has (found by the e2e `handover` scenario on ec2-sim; docs/rules.md §14.3). The node
/// keeps its pool meanwhile; nothing is written or called for it.
async fn settled<E: Ec2, S: NodeSink>(
    inner: &Shared<E, S>,
    name: &str,
    instance: &str,
    writers: &handover::Writers,
) -> Step<()> {
    let Some(at) = handover::unsettled_foreign_write(writers) else {
        return Ok(());
    };
    let now = clock::now();
    let age = Duration::try_from(inner.wall_now().duration_since(at)).unwrap_or_default();
    // managedFields times are truncated to the second: the write may be up to 1 s later.
    let written = now.checked_sub(age).unwrap_or(now) + Duration::from_secs(1);
    let trusted_from = written + DESCRIBE_LAG;
    let listed = |inner: &Shared<E, S>| {
        let cache = inner.cache.read().expect("cache");
        cache.instance(instance).and_then(|e| e.listed_at)
    };
    if listed(inner).is_some_and(|t| t >= trusted_from) {
        return Ok(());
    }
    if now < trusted_from {
        debug!(
            node = name,
            "waiting for EC2 to show the other allocator's last calls"
        );
        return Err((Outcome::RetryAfter(trusted_from - now), None));
    }
    inner.refresh_instances(&[instance.to_string()], &[]).await;
    if listed(inner).is_some_and(|t| t >= trusted_from) {
        Ok(())
    } else {
        Err((Outcome::RetryAfter(RECHECK), None))
    }
}

/// ENIs with Cilium's description (and without our ownership tags) that appeared on the instance since the first check, within
/// `--handover-quiet` of their first sighting (then they are just ENIs the node has).
fn new_cilium_enis<E: Ec2, S: NodeSink>(
    inner: &Shared<E, S>,
    name: &str,
    instance: &str,
) -> Vec<String> {
    let description = handover::cilium_eni_description(instance);
    let current: Vec<String> = {
        let cache = inner.cache.read().expect("cache");
        match cache.instance(instance) {
            // Not described yet: no baseline to compare with.
            Some(e) if !e.enis.is_empty() => e
                .enis
                .iter()
                // Ours carry the same description (ownership.rs), and our tags.
                .filter(|x| x.description == description)
                .filter(|x| !is_owned_by(x, &inner.config.ipam.cluster_name))
                .map(|x| x.id.clone())
                .collect(),
            _ => return Vec::new(),
        }
    };
    let now = clock::now();
    let quiet = inner.config.handover_quiet;
    inner
        .with_slot(name, |s| {
            let seen = s
                .cilium_enis
                .get_or_insert_with(|| current.iter().map(|id| (id.clone(), None)).collect());
            for id in &current {
                seen.entry(id.clone()).or_insert(Some(now));
            }
            seen.iter()
                .filter(|(_, t)| t.is_some_and(|t| now.duration_since(t) < quiet))
                .map(|(id, _)| id.clone())
                .collect()
        })
        .unwrap_or_default()
}

/// Taken over: our finalizer is on it (set right after this guard first lets it through).
fn handed_over(node: &CiliumNode) -> bool {
    node.metadata
        .finalizers
        .as_ref()
        .is_some_and(|f| f.iter().any(|x| x == FINALIZER))
}
