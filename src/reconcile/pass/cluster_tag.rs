//! A fact for the admission and the finalizer: EC2 confirms that the instance carries this
//! cluster's tag (`aws:eks:cluster-name` = `--cluster-name`, or
//! `kubernetes.io/cluster/<--cluster-name>`) before any call that touches it (docs/rules.md
//! §15). A Node's providerID says which instance a node is; only EC2 says the instance is this
//! cluster's. A confirmation is kept for the process's life (tags naming the cluster do not come
//! and go); a refusal is asked again on the node's next pass.

use crate::ec2::{Ec2, Ec2Error, InstanceFilter, collect_pages};
use crate::ipam::admission::ClusterTag;
use crate::k8s::sink::NodeSink;
use crate::reconcile::events;
use crate::reconcile::shared::Shared;

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
