//! The handover guard's facts for the admission (§16): who wrote the node, Cilium's Lease and
//! release, the Cilium ENIs new on the instance (whether a describe shows what another
//! allocator did before our takeover is an EC2 fact: [`super::ec2_facts::settled`]); and the
//! ignore annotation set while Cilium's leader blocks a node. [`crate::ipam::admission`] decides; the report step says why a node waits.

use tracing::debug;

use crate::clock;
use crate::crd::{CILIUM_IGNORE_ANNOTATION, CiliumNode};
use crate::ec2::Ec2;
use crate::ipam::admission::GuardFacts;
use crate::ipam::handover;
use crate::ipam::ownership::is_owned_by;
use crate::k8s::sink::{NodeRef, NodeSink};
use crate::reconcile::shared::Shared;

/// The guard's facts for the admission ([`crate::ipam::admission::GuardFacts`]).
pub(super) fn read<E: Ec2, S: NodeSink>(
    inner: &Shared<E, S>,
    name: &str,
    node: &CiliumNode,
    writers: &handover::Writers,
) -> GuardFacts {
    let cilium_ignore = node
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(CILIUM_IGNORE_ANNOTATION))
        .is_some_and(|v| v.eq_ignore_ascii_case("true"));
    let ignore_unsupported = inner
        .cilium_version
        .read()
        .expect("cilium version")
        .ignore_unsupported();
    GuardFacts {
        writers: writers.clone(),
        cilium_ignore,
        will_annotate: inner.config.annotate_cilium_ignore,
        lease: inner.cilium_lease.read().expect("lease").clone(),
        new_cilium_enis: new_cilium_enis(inner, name, &node.spec.instance_id),
        now: inner.wall_now(),
        quiet: inner.config.handover_quiet,
        ignore_unsupported,
    }
}

/// Sets `ipam.cilium.io/ignore` on a node Cilium's running leader still serves, so its next
/// leader keeps off it ([`handover::annotate_while_blocked`]). A failure is retried on the
/// next check.
pub(super) async fn annotate<E: Ec2, S: NodeSink>(
    inner: &Shared<E, S>,
    name: &str,
    node: &CiliumNode,
) {
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
