//! Part of step 2 and of the finalizer: EC2 confirms that the instance carries this cluster's
//! tag (`aws:eks:cluster-name` = `--cluster-name`, or `kubernetes.io/cluster/<--cluster-name>`)
//! before any call that touches it (docs/rules.md §15). A Node's providerID says which
//! instance a node is; only EC2 says the instance is this cluster's. A confirmation is kept for
//! the process's life (tags naming the cluster do not come and go); a refusal is asked again
//! on the node's next pass.

use std::time::Duration;

use crate::crd::CiliumNode;
use crate::ec2::{Ec2, Ec2Error, InstanceFilter, collect_pages};
use crate::ipam::ProblemReason;
use crate::ipam::ownership::names_cluster;
use crate::k8s::sink::NodeSink;
use crate::reconcile::events;
use crate::reconcile::queue::Outcome;
use crate::reconcile::shared::Shared;

use super::Step;

/// How soon a refused node is asked about again.
const REFUSED_RETRY: Duration = Duration::from_secs(60);

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
    let ours = names_cluster(&found.tags, &inner.config.ipam.cluster_name);
    if ours {
        let mut confirmed = inner.confirmed_instances.lock().expect("confirmed");
        confirmed.insert(instance.to_string());
    }
    Ok(Some(ours))
}

/// The pass's check, before anything is called or written for the node.
pub(super) async fn confirm<E: Ec2, S: NodeSink>(
    inner: &Shared<E, S>,
    name: &str,
    node: &CiliumNode,
) -> Step<()> {
    let instance = &node.spec.instance_id;
    if !inner.config.require_cluster_tag || instance.is_empty() {
        return Ok(());
    }
    match tagged(inner, instance).await {
        Ok(Some(true)) => Ok(()),
        // Not known to EC2: the plan says so (InstanceNotFound); nothing can touch it.
        Ok(None) => Ok(()),
        Ok(Some(false)) => {
            let cluster = &inner.config.ipam.cluster_name;
            let message = format!(
                "EC2 shows {instance} without this cluster's tag (aws:eks:cluster-name={cluster} \
                 or kubernetes.io/cluster/{cluster}): no EC2 call for it (is --cluster-name the \
                 name its tags give?)"
            );
            super::problem::say(
                inner,
                name,
                node,
                ProblemReason::NotClusterInstance,
                &message,
            )
            .await;
            Err((Outcome::RetryAfter(REFUSED_RETRY), None))
        }
        Err(e) => {
            events::count_ec2_error(&inner.metrics, &e);
            tracing::warn!(node = name, error = %e, "cannot read the tags of {instance}");
            Err((Outcome::RetryAfter(inner.config.unhealthy_retry), None))
        }
    }
}
