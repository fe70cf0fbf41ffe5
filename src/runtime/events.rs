//! Every Event reason the operator emits, and the one place that publishes Events and counts
//! errors (`eni_operator_errors_total{reason}`).
//!
//! A node's [`ProblemReason`] is its Event reason and its error label at once (as
//! Stackable's operator-rs does with an error's category). A failed EC2 call is counted under
//! its EC2 error code (more telling than `Ec2Error`), by [`count_ec2_error`]; its Event says
//! `Ec2Error`.

use crate::ec2::Ec2Error;
use crate::ipam::ProblemReason;

use super::metrics::RuntimeMetrics;
use super::sink::{NodeEvent, NodeRef, NodeSink};

/// Why an Event was emitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventReason {
    EniCreated,
    /// An ENI of ours left unattached earlier was attached.
    EniAttached,
    IpsAllocated,
    IpsReleased,
    /// The finalizer gave back the ENIs of a deleted node.
    EnisReleased,
    /// The Node is gone while its instance runs: its ENIs are kept (or, after the grace
    /// period, released anyway).
    EnisKept,
    /// The finalizer disassociated a deleted node's static IP (Elastic IP).
    StaticIpReleased,
    /// The finalizer failed for the grace period and was removed; the node's ENIs of ours are
    /// left to the ENI GC.
    FinalizerLetGo,
    /// /28 prefixes were refused; single addresses were assigned instead.
    PrefixesNotGranted,
    /// The node cannot be (fully) served.
    Problem(ProblemReason),
}

impl EventReason {
    pub const EC2_ERROR: Self = Self::Problem(ProblemReason::Ec2Error);

    /// The Event's `reason` (CamelCase).
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::EniCreated => "EniCreated",
            Self::EniAttached => "EniAttached",
            Self::IpsAllocated => "IpsAllocated",
            Self::IpsReleased => "IpsReleased",
            Self::EnisReleased => "EnisReleased",
            Self::EnisKept => "EnisKept",
            Self::StaticIpReleased => "StaticIpReleased",
            Self::FinalizerLetGo => "FinalizerLetGo",
            Self::PrefixesNotGranted => "PrefixesNotGranted",
            Self::Problem(p) => p.as_str(),
        }
    }

    pub const fn is_warning(self) -> bool {
        matches!(
            self,
            Self::PrefixesNotGranted | Self::EnisKept | Self::FinalizerLetGo | Self::Problem(_)
        )
    }

    /// The `errors_total` label this Event counts under, if any. `Ec2Error` counts nothing
    /// here: the failed call was counted under its code when it failed.
    pub const fn error_label(self) -> Option<&'static str> {
        match self {
            Self::Problem(ProblemReason::Ec2Error) => None,
            Self::Problem(p) => Some(p.as_str()),
            _ => None,
        }
    }
}

/// Publish one Event on `node`, counting its error (if it is one).
pub async fn publish<S: NodeSink>(
    sink: &S,
    metrics: &RuntimeMetrics,
    node: &NodeRef,
    reason: EventReason,
    message: impl Into<String>,
) {
    if let Some(label) = reason.error_label() {
        metrics.error(label);
    }
    let event = if reason.is_warning() {
        NodeEvent::warning(reason.as_str(), message)
    } else {
        NodeEvent::normal(reason.as_str(), message)
    };
    sink.event(node, event).await;
}

/// An EC2 call failed: count it under its error code.
pub fn count_ec2_error(metrics: &RuntimeMetrics, e: &Ec2Error) {
    metrics.error(&e.code);
}
