//! The EC2 facts of a pass, read before the decision that needs them (I/O at the front): the
//! cluster tag of the instance (docs/rules.md §15) and whether a describe shows what another
//! allocator did before our takeover (§14.3), both read when [`crate::ipam::admission`] asks;
//! the instance's state for the finalizer; and what planning needs (a healthy EC2 view, no
//! not-running hold, the instance type's limits). The decisions are pure; what they decide to
//! change in EC2 is the executor's.
//!
//! The cluster tag: a Node's providerID says which instance a node is; only EC2 says the
//! instance is this cluster's. A confirmation is kept for the process's life (tags naming the
//! cluster do not come and go); a refusal is asked again on the node's next pass.

use std::time::{Duration, Instant};

use tracing::debug;

use crate::cache::DESCRIBE_LAG;
use crate::cache::type_limits::Unresolved;
use crate::clock::{self, now};
use crate::ec2::{Ec2, Ec2Error, InstanceFilter, InstanceState, collect_pages};
use crate::ipam::admission::AdmittedNode;
use crate::ipam::admission::{ClusterTag, GUARD_RETRY, Settled};
use crate::ipam::handover;
use crate::k8s::sink::NodeSink;
use crate::reconcile::events;
use crate::reconcile::queue::Outcome;
use crate::reconcile::shared::Shared;
use crate::reconcile::status::WaitReason;

use super::said::{End, Said};
use super::snapshot::Snapshot;

/// Whether EC2 shows `instance` with this cluster's tag; `None`: EC2 does not know it.
pub(super) async fn tagged<E: Ec2, S: NodeSink>(
    inner: &Shared<E, S>,
    instance: &str,
) -> Result<Option<bool>, Ec2Error> {
    if inner
        .confirmed_instances
        .lock()
        .expect("confirmed")
        .contains(instance)
    {
        return Ok(Some(true));
    }
    let filter = InstanceFilter {
        ids: vec![instance.to_string()],
        ..Default::default()
    };
    let found = match collect_pages(|t| inner.ec2.describe_instances(&filter, t)).await {
        Ok(found) => found.into_iter().find(|i| i.id == instance),
        Err(e) if e.is_not_found() => None,
        Err(e) => return Err(e),
    };
    let Some(found) = found else {
        return Ok(None);
    };
    let ours = crate::ipam::ownership::names_cluster(&found.tags, &inner.config.ipam.cluster_name);
    if ours {
        let mut confirmed = inner.confirmed_instances.lock().expect("confirmed");
        confirmed.insert(instance.to_string());
    }
    Ok(Some(ours))
}

/// The admission's fact, read when it asks (`--require-cluster-tag`, an instance named).
pub(super) async fn read<E: Ec2, S: NodeSink>(
    inner: &Shared<E, S>,
    name: &str,
    instance: &str,
) -> ClusterTag {
    match tagged(inner, instance).await {
        Ok(Some(true)) => ClusterTag::Tagged,
        Ok(Some(false)) => ClusterTag::Untagged,
        Ok(None) => ClusterTag::UnknownToEc2,
        Err(e) => {
            events::count_ec2_error(&inner.metrics, &e);
            tracing::warn!(node = name, error = %e, "cannot read the tags of {instance}");
            ClusterTag::Unreadable(e.to_string())
        }
    }
}

/// The instance's state as EC2 tells it (`None`: EC2 does not know it), for the finalizer.
pub(super) async fn instance_state<E: Ec2, S: NodeSink>(
    inner: &Shared<E, S>,
    instance: &str,
) -> Result<Option<InstanceState>, String> {
    crate::reconcile::finalizer::instance_state(&*inner.ec2, instance)
        .await
        .map_err(|e| {
            events::count_ec2_error(&inner.metrics, &e);
            format!("cannot tell whether {instance} still runs: {e}")
        })
}

/// Another allocator wrote the node's pool after us (a node just handed over): plan only from a
/// listing of its instance that started at least [`DESCRIBE_LAG`] after that write, or a
/// describe may still hide that allocator's last assigns and our pool write would drop addresses
/// EC2 has (found by the e2e `handover` scenario on ec2-sim; docs/rules.md §14.3). The node
/// keeps its pool meanwhile; nothing is written or called for it.
pub(super) async fn settled<E: Ec2, S: NodeSink>(
    inner: &Shared<E, S>,
    name: &str,
    instance: &str,
    writers: &handover::Writers,
) -> Settled {
    let Some(at) = handover::unsettled_foreign_write(writers) else {
        return Settled::Yes;
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
        return Settled::Yes;
    }
    if now < trusted_from {
        debug!(
            node = name,
            "waiting for EC2 to show the other allocator's last calls"
        );
        return Settled::WaitFor(trusted_from - now);
    }
    inner.refresh_instances(&[instance.to_string()], &[]).await;
    if listed(inner).is_some_and(|t| t >= trusted_from) {
        Settled::Yes
    } else {
        Settled::WaitFor(GUARD_RETRY)
    }
}

/// What planning starts from: when it planned, the type's limits when they are unknown, and
/// why the node waits so far.
pub(super) struct PlanFacts {
    pub at: Instant,
    pub limits: Option<Unresolved>,
    pub said: Said,
}

/// The facts planning needs, or the end of the pass: never plan on an EC2 view we could not
/// refresh (§1.2), nor for an instance held as not running. The executor's pending repairs of
/// the instance (delete-on-termination flags that failed earlier) are retried here, before
/// the plan reads the cache.
pub(super) async fn for_plan<E: Ec2, S: NodeSink>(
    inner: &Shared<E, S>,
    name: &str,
    node: &AdmittedNode,
    snap: &Snapshot,
) -> Result<PlanFacts, End> {
    let t = now();
    let mut said = Said::default();
    if !inner.cache.read().expect("cache").healthy {
        // Never act on an EC2 view we could not refresh (§1.2).
        let why = "the last full EC2 refresh failed: nothing changes on a stale view";
        let retry = t + inner.config.unhealthy_retry;
        said.wait(WaitReason::Ec2Unavailable, why, Some(retry));
        let verdict = (Outcome::RetryAfter(inner.config.unhealthy_retry), None);
        return Err(End::with(verdict, said));
    }
    if let Some(until) = snap.hold
        && until > t
    {
        let why = "the instance was not running; left alone until then";
        said.wait(WaitReason::NotRunning, why, Some(until));
        return Err(End::with((Outcome::RetryAfter(until - t), None), said));
    }
    let instance_id = node.spec.instance_id.clone();
    let instance_type = node.spec.eni.instance_type.clone();
    let limits = ensure_limits(inner, &instance_type).await.err();
    if let Some(u) = &limits {
        let why = match &u.error {
            Some(e) => format!("limits of instance type {instance_type:?} unknown: {e}"),
            None => format!("limits of instance type {instance_type:?} unknown"),
        };
        said.wait(WaitReason::LimitsUnknown, why, Some(u.retry_at));
    }
    if !instance_id.is_empty()
        && let Some(e) = inner.executor.retry_pending(&instance_id).await
    {
        debug!(node = name, error = %e, "delete-on-termination retry failed");
    }
    Ok(PlanFacts {
        at: t,
        limits,
        said,
    })
}

/// Make sure the type's limits are known: wait for its lookup in flight, else describe that
/// type alone (`cache::type_limits`). `Err`: still unknown, and when to look again.
async fn ensure_limits<E: Ec2, S: NodeSink>(
    inner: &Shared<E, S>,
    instance_type: &str,
) -> Result<(), Unresolved> {
    if instance_type.is_empty() || !inner.config.limits_via_api {
        return Ok(());
    }
    let known = || {
        inner
            .cache
            .read()
            .expect("cache")
            .limits
            .contains_key(instance_type)
    };
    let types = [instance_type.to_string()];
    let lookup = inner.type_lookups.ensure(instance_type, known, || {
        inner.refresher.instance_types(&types)
    });
    lookup.await.inspect_err(|u| {
        debug!(
            instance_type,
            error = u.error.as_deref().unwrap_or("not in the answer"),
            retry_in = ?u.retry_at.saturating_duration_since(now()),
            "instance type limits unknown; the node waits for the next lookup"
        );
    })
}
