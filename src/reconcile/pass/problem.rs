//! A node the pass leaves alone for a reason the user must see: `status.ipam.operator-status`
//! and one Warning Event (counted in `eni_operator_errors_total{reason}`), once per message.

use serde_json::json;
use tracing::warn;

use crate::crd::CiliumNode;
use crate::ec2::Ec2;
use crate::ipam::{ChangeSet, ProblemReason, Subresource, Write};
use crate::k8s::sink::{NodeRef, NodeSink};
use crate::reconcile::events::{self, EventReason};
use crate::reconcile::shared::Shared;

/// Say `message` (prefixed with the reason) on the node, unless it is what was said last.
pub(super) async fn say<E: Ec2, S: NodeSink>(
    inner: &Shared<E, S>,
    name: &str,
    node: &CiliumNode,
    reason: ProblemReason,
    message: &str,
) {
    let message = format!("{}: {message}", reason.as_str());
    let said = inner.with_slot(name, |s| s.last_problem.replace(message.clone()));
    if said.flatten().as_deref() == Some(message.as_str()) {
        return;
    }
    warn!(node = name, "{message}");
    let r = NodeRef::of(node);
    let changes = ChangeSet {
        writes: vec![Write {
            subresource: Subresource::Status,
            patch: json!({"status": {"ipam": {"operator-status": {"error": message}}}}),
            needs_resource_version: false,
        }],
    };
    if let Err(e) = inner.sink.apply(&r, &changes).await {
        warn!(node = name, error = %e, "could not report {}", reason.as_str());
    }
    events::publish(
        &*inner.sink,
        &inner.metrics,
        &r,
        EventReason::Problem(reason),
        message,
    )
    .await;
}
