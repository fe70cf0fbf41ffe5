//! Every Event reason the operator emits, and the one place that publishes Events and counts
//! errors (`eni_operator_errors_total{reason}`).
//!
//! A node's [`ProblemReason`] is its Event reason and its error label at once (as
//! Stackable's operator-rs does with an error's category). A failed EC2 call is counted under
//! its EC2 error code (more telling than `Ec2Error`), by [`count_ec2_error`]; its Event says
//! `Ec2Error`.

use crate::ec2::Ec2Error;
use crate::ipam::ProblemReason;

use crate::k8s::sink::{NodeEvent, NodeRef, NodeSink};
use crate::reconcile::metrics::RuntimeMetrics;

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
    /// The finalizer let a CiliumNode go without releasing anything: nothing on the object
    /// proves we confirmed its instance and put the finalizer there.
    EnisNotReleased,
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
            Self::EnisNotReleased => "EnisNotReleased",
            Self::FinalizerLetGo => "FinalizerLetGo",
            Self::PrefixesNotGranted => "PrefixesNotGranted",
            Self::Problem(p) => p.as_str(),
        }
    }

    pub const fn is_warning(self) -> bool {
        matches!(
            self,
            Self::PrefixesNotGranted
                | Self::EnisKept
                | Self::EnisNotReleased
                | Self::FinalizerLetGo
                | Self::Problem(_)
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
    let message = event_message(reason, message.into());
    let event = if reason.is_warning() {
        NodeEvent::warning(reason.as_str(), message)
    } else {
        NodeEvent::normal(reason.as_str(), message)
    };
    sink.event(node, event).await;
}

/// Where a problem's Event sends the reader: the runbook's table of every reason.
pub const PROBLEMS_DOC: &str = "docs/runbook.md, \"Problems on a node\"";

/// A problem's Event says where its reason is explained (the message itself is what
/// `operator-status` says).
pub fn event_message(reason: EventReason, message: String) -> String {
    match reason {
        EventReason::Problem(_) => format!("{message} (what to do: {PROBLEMS_DOC})"),
        _ => message,
    }
}

/// An EC2 call failed: count it under its error code.
pub fn count_ec2_error(metrics: &RuntimeMetrics, e: &Ec2Error) {
    metrics.error(&e.code);
}

/// How long routine successes of a node may wait to be published (a node whose demand keeps
/// changing never settles).
pub const FOLD_MAX: std::time::Duration = std::time::Duration::from_secs(60);

/// A node's routine successes (ENIs created or attached, addresses allocated or released)
/// folded into one Normal Event per kind, published when the node settles (a pass with no EC2
/// change) or after [`FOLD_MAX`]. Every success used to be its own Event, through the same
/// client budget (`--k8s-client-qps`) as the CiliumNode writes pods wait for: a burst of
/// 1,000 nodes made several Events per node (docs/benchmarks.md). Warnings are never folded.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Folded {
    since: Option<std::time::Instant>,
    /// Per kind, in the order first seen: calls, addresses, ENIs.
    kinds: Vec<(EventReason, u32, u32, Vec<String>)>,
}

impl Folded {
    /// Fold one success in.
    pub fn add(&mut self, success: &crate::reconcile::executor::Success, now: std::time::Instant) {
        use crate::reconcile::executor::Success as S;
        let (reason, eni, addresses) = match success {
            S::EniCreated { eni_id, addresses } => (EventReason::EniCreated, eni_id, addresses),
            S::EniAttached { eni_id, addresses } => (EventReason::EniAttached, eni_id, addresses),
            S::IpsAllocated { eni_id, addresses } => (EventReason::IpsAllocated, eni_id, addresses),
            S::IpsReleased { eni_id, addresses } => (EventReason::IpsReleased, eni_id, addresses),
        };
        self.since.get_or_insert(now);
        let i = match self.kinds.iter().position(|k| k.0 == reason) {
            Some(i) => i,
            None => {
                self.kinds.push((reason, 0, 0, Vec::new()));
                self.kinds.len() - 1
            }
        };
        let k = &mut self.kinds[i];
        k.1 += 1;
        k.2 += addresses;
        if !k.3.contains(eni) {
            k.3.push(eni.clone());
        }
    }

    /// The Events to publish now: everything folded once the node `settled` or the oldest
    /// success is [`FOLD_MAX`] old; none otherwise.
    pub fn take(&mut self, settled: bool, now: std::time::Instant) -> Vec<(EventReason, String)> {
        let due = self
            .since
            .is_some_and(|s| settled || now.saturating_duration_since(s) >= FOLD_MAX);
        if !due {
            return Vec::new();
        }
        self.since = None;
        std::mem::take(&mut self.kinds)
            .into_iter()
            .map(|(reason, calls, addresses, enis)| {
                let on = enis.join(", ");
                let message = match reason {
                    EventReason::EniCreated if calls == 1 => {
                        format!("created and attached {on} with {addresses} addresses")
                    }
                    EventReason::EniCreated => {
                        format!(
                            "created and attached {calls} ENIs ({on}) with {addresses} addresses"
                        )
                    }
                    EventReason::EniAttached => format!(
                        "attached {on} (left unattached earlier) with {addresses} addresses"
                    ),
                    EventReason::IpsAllocated if calls == 1 => {
                        format!("allocated {addresses} addresses on {on}")
                    }
                    EventReason::IpsAllocated => {
                        format!("allocated {addresses} addresses in {calls} calls on {on}")
                    }
                    _ if calls == 1 => format!("released {addresses} addresses from {on}"),
                    _ => format!("released {addresses} addresses in {calls} calls from {on}"),
                };
                (reason, message)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reconcile::executor::Success;
    use std::time::{Duration, Instant};

    #[test]
    fn a_problems_event_points_at_the_runbooks_table() {
        let m = event_message(
            EventReason::Problem(ProblemReason::NoSecurityGroups),
            "no security group".into(),
        );
        assert_eq!(
            m,
            "no security group (what to do: docs/runbook.md, \"Problems on a node\")"
        );
        let runbook = include_str!("../../docs/runbook.md");
        assert!(runbook.contains("## Problems on a node"));
        assert_eq!(
            event_message(EventReason::EniCreated, "created".into()),
            "created"
        );
    }

    #[test]
    fn routine_successes_make_one_event_per_kind_when_the_node_settles() {
        let t0 = Instant::now();
        let mut f = Folded::default();
        let created = Success::EniCreated {
            eni_id: "eni-1".into(),
            addresses: 8,
        };
        let allocated = |eni: &str| Success::IpsAllocated {
            eni_id: eni.into(),
            addresses: 4,
        };
        f.add(&created, t0);
        assert!(f.take(false, t0).is_empty(), "still changing");
        f.add(&allocated("eni-1"), t0 + Duration::from_secs(1));
        f.add(&allocated("eni-2"), t0 + Duration::from_secs(2));
        let events = f.take(true, t0 + Duration::from_secs(3));
        assert_eq!(
            events,
            [
                (
                    EventReason::EniCreated,
                    "created and attached eni-1 with 8 addresses".to_string()
                ),
                (
                    EventReason::IpsAllocated,
                    "allocated 8 addresses in 2 calls on eni-1, eni-2".to_string()
                ),
            ]
        );
        assert!(
            f.take(true, t0 + Duration::from_secs(4)).is_empty(),
            "taken"
        );
        assert_eq!(f, Folded::default());
    }

    #[test]
    fn a_node_that_never_settles_still_gets_its_events_after_the_fold_limit() {
        let t0 = Instant::now();
        let mut f = Folded::default();
        let released = Success::IpsReleased {
            eni_id: "eni-1".into(),
            addresses: 2,
        };
        f.add(&released, t0);
        assert!(
            f.take(false, t0 + FOLD_MAX - Duration::from_secs(1))
                .is_empty()
        );
        let events = f.take(false, t0 + FOLD_MAX);
        assert_eq!(
            events,
            [(
                EventReason::IpsReleased,
                "released 2 addresses from eni-1".to_string()
            )]
        );
    }
}
