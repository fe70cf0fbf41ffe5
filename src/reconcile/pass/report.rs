//! Step 6: Events for what the pass did ([`select_events`], pure), how it ends (the queue's
//! outcome and the next priority), and what the node's slot keeps (memory, problem, demand,
//! the written version, the demand latency). Also the report of a pass the admission ended: a
//! refusal ([`refused`]: `status.ipam.operator-status` and one Warning Event, counted in
//! `eni_operator_errors_total{reason}`, once per message) or a wait ([`waiting`]).

use std::time::Duration;

use serde_json::json;
use tracing::{info, warn};

use crate::clock::now;
use crate::crd::CiliumNode;
use crate::ec2::Ec2;
use crate::ipam::admission::{self, Refusal};
use crate::ipam::{Action, ChangeSet, NodeMemory, Problem, ProblemReason, Subresource, Write};
use crate::k8s::sink::{NodeRef, NodeSink};
use crate::k8s::stored::StoredNode;
use crate::reconcile::events::{self, EventReason};
use crate::reconcile::executor::ExecOutcome;
use crate::reconcile::queue::{Outcome, Priority};
use crate::reconcile::shared::Shared;
use crate::reconcile::status::{Figures, WaitReason, Would};

use super::Verdict;
use super::execute::Executed;
use super::plan::Planned;
use super::write::Written;

pub(super) async fn report<E: Ec2, S: NodeSink>(
    inner: &Shared<E, S>,
    name: &str,
    node: &CiliumNode,
    mut planned: Planned,
    executed: Executed,
    written: Written,
    memory: NodeMemory,
) -> Verdict {
    let node_ref = NodeRef::of(written.node.as_ref().unwrap_or(node));
    let previous = inner.with_slot(name, |s| s.last_problem.clone()).flatten();
    let problem = executed.problem.as_ref();
    let mut out = select_events(&executed.exec, problem, previous.as_deref());
    // Routine successes: folded, one Event per kind once the node settles.
    let (exec, t) = (&executed.exec, now());
    let folded = inner.with_slot(name, |s| {
        if let Some(success) = &exec.success {
            s.folded.add(success, t);
        }
        s.folded.take(!exec.changed, t)
    });
    out.extend(folded.unwrap_or_default());
    for (reason, message) in out {
        events::publish(&*inner.sink, &inner.metrics, &node_ref, reason, message).await;
    }
    // After a change, what the node still lacks is the demand on the updated view: requeued
    // and remembered at the demand from before the action, a node that just got an ENI would
    // outrank nodes with no address at all (a burst served depth first).
    if executed.exec.changed
        && let Some(after) = written.demand.clone()
    {
        planned.plan.demand = after;
    }
    let verdict = verdict(inner, name, &planned, &executed.exec, &written);
    record_status(inner, name, &planned, &executed, &memory);
    remember(inner, name, planned, executed, written, memory);
    verdict
}

/// A node the admission refused for now: its status page, then `operator-status` and one
/// Warning Event, unless that message was the last said.
pub(super) async fn refused<E: Ec2, S: NodeSink>(
    inner: &Shared<E, S>,
    name: &str,
    node: &CiliumNode,
    refusal: &Refusal,
) {
    if let Some(reason) = refusal.wait {
        let why = refusal.message.clone();
        waiting(inner, name, reason, why, refusal.retry);
    }
    let reason = refusal.reason;
    if reason == ProblemReason::InstanceNamedTwice {
        tracing::error!(node = name, "{}", refusal.message);
    }
    let message = format!("{}: {}", reason.as_str(), refusal.message);
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
    let reason = EventReason::Problem(reason);
    events::publish(&*inner.sink, &inner.metrics, &r, reason, message).await;
}

/// A node the admission holds back for `retry`, on its status page.
pub(super) fn waiting<E: Ec2, S: NodeSink>(
    inner: &Shared<E, S>,
    name: &str,
    reason: admission::WaitReason,
    why: String,
    retry: Duration,
) {
    let reason = match reason {
        admission::WaitReason::NodeNotSeen => WaitReason::NodeNotSeen,
        admission::WaitReason::OtherAllocator => WaitReason::OtherAllocator,
        admission::WaitReason::InstanceUnknown => WaitReason::InstanceNotListed,
    };
    inner.status.wait(name, reason, why, Some(now() + retry));
}

/// The Events a pass publishes at once: a /28 fallback, and its problem when that changed
/// from `previous` (the last problem's message). Its success is folded
/// ([`events::Folded`]).
pub(super) fn select_events(
    exec: &ExecOutcome,
    problem: Option<&Problem>,
    previous: Option<&str>,
) -> Vec<(EventReason, String)> {
    let mut events = Vec::new();
    if let Some(w) = &exec.warning {
        events.push((EventReason::PrefixesNotGranted, w.clone()));
    }
    if let Some(p) = problem
        && Some(p.message.as_str()) != previous
    {
        events.push((EventReason::Problem(p.reason), p.message.clone()));
    }
    events
}

/// How the pass ends: held while the instance is not running, failed on an EC2 error, looked
/// at again at once after a change (one action may not give all that is needed).
fn verdict<E: Ec2, S: NodeSink>(
    inner: &Shared<E, S>,
    name: &str,
    planned: &Planned,
    exec: &ExecOutcome,
    written: &Written,
) -> Verdict {
    let (mut outcome, mut again) = (written.outcome, written.again);
    if exec.not_running {
        outcome = Outcome::RetryAfter(inner.config.not_running_hold);
    } else if exec.error.is_some() {
        outcome = Outcome::Failed;
    } else if exec.changed {
        let d = &planned.plan.demand;
        let pending = inner.with_slot(name, |s| s.pending_pods).unwrap_or(0);
        again = Some(Priority::from_demand(
            d.available,
            d.used,
            d.needed,
            d.excess,
            pending,
        ));
        info!(node = name, "EC2 changed for the node");
    } else if let Some(u) = &planned.limits
        && outcome == Outcome::Done
    {
        // Planned without the type's limits: look again when they can be looked up again,
        // not at the next rescan.
        outcome = Outcome::RetryAfter(u.retry_at.saturating_duration_since(now()));
    }
    (outcome, again)
}

/// The node's status (`/debug/nodes`): figures, the action, and why it waits if it does.
fn record_status<E: Ec2, S: NodeSink>(
    inner: &Shared<E, S>,
    name: &str,
    planned: &Planned,
    executed: &Executed,
    memory: &NodeMemory,
) {
    let (status, t) = (&inner.status, now());
    let would = Would::of(&planned.action);
    let figures = Figures::of(&planned.instance_id, &planned.plan.demand);
    status.observed(name, figures, would.clone());
    let exec = &executed.exec;
    if exec.success.is_some() {
        status.acted(name, would, t);
    }
    if exec.not_running {
        let (why, until) = (
            "the instance is not running",
            t + inner.config.not_running_hold,
        );
        status.wait(name, WaitReason::NotRunning, why, Some(until));
    } else if let Some(p) = &executed.problem {
        status.error(name, p.message.clone(), t);
        let throttled = exec.error.as_ref().is_some_and(|e| e.is_throttled());
        let reason = WaitReason::of_problem(p.reason, throttled);
        status.wait(name, reason, p.message.clone(), None);
    } else if matches!(planned.action, Action::None) && memory.proposed().next().is_some() {
        let n = memory.proposed().count();
        let why = format!("{n} addresses marked-for-release; the agent has not answered");
        status.wait(name, WaitReason::ReleaseAnswer, why, None);
    }
}

/// What the slot keeps of the pass.
fn remember<E: Ec2, S: NodeSink>(
    inner: &Shared<E, S>,
    name: &str,
    planned: Planned,
    executed: Executed,
    written: Written,
    memory: NodeMemory,
) {
    let t_end = now();
    let hold = executed
        .exec
        .not_running
        .then(|| t_end + inner.config.not_running_hold);
    let problem = executed.problem;
    let demand = planned.plan.demand;
    // Serialised before the slots lock is taken.
    let stored = written.node.as_ref().map(StoredNode::new);
    let met = demand.needed <= 0 && !executed.exec.changed;
    inner.with_slot(name, |s| {
        if hold.is_some() {
            s.not_running_until = hold;
        }
        s.memory = memory;
        if planned.interfaces.is_some() {
            s.interfaces = planned.interfaces;
        }
        s.errored = problem.is_some();
        s.at_capacity = problem
            .as_ref()
            .is_some_and(|p| p.reason == ProblemReason::AtCapacity);
        s.last_problem = problem.map(|p| p.message);
        // An agent's update the watch delivered during the write stays (§12.1).
        if let (Some(mut stored), Some(node)) = (stored, &written.node)
            && written.ticket.holds(s)
        {
            stored.keep_proof_of(node, s.node.as_ref());
            s.node = Some(stored);
        }
        match (s.demand_seen, met) {
            (None, false) => s.demand_seen = Some(planned.at),
            (Some(seen), true) => {
                let latency = t_end.duration_since(seen).as_secs_f64();
                inner.metrics.demand_latency.observe(latency);
                s.demand_seen = None;
            }
            _ => {}
        }
        s.demand = demand;
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reconcile::executor::Success;

    fn problem(reason: ProblemReason, message: &str) -> Problem {
        Problem {
            reason,
            message: message.into(),
        }
    }

    #[test]
    fn a_prefix_fallback_makes_an_event_at_once_and_a_success_is_folded() {
        let exec = ExecOutcome {
            success: Some(Success::IpsAllocated {
                eni_id: "eni-1".into(),
                addresses: 16,
            }),
            warning: Some("no /28 left".into()),
            ..ExecOutcome::default()
        };
        let events = select_events(&exec, None, None);
        let reasons: Vec<_> = events.iter().map(|e| e.0.as_str()).collect();
        assert_eq!(reasons, ["PrefixesNotGranted"]);
    }

    #[test]
    fn a_problem_is_reported_once_per_message() {
        let exec = ExecOutcome::default();
        let full = problem(ProblemReason::AtCapacity, "no slot free");
        let events = select_events(&exec, Some(&full), None);
        assert_eq!(
            events,
            [(
                EventReason::Problem(ProblemReason::AtCapacity),
                "no slot free".into()
            )]
        );
        assert!(select_events(&exec, Some(&full), Some("no slot free")).is_empty());
        assert_eq!(select_events(&exec, Some(&full), Some("other")).len(), 1);
        assert!(select_events(&exec, None, Some("no slot free")).is_empty());
    }
}
