//! Step 6, the one writer of what a pass says ([`say`]: Events, `operator-status`, the status
//! page, from the [`Said`] values the steps return): Events for what the pass did
//! ([`select_events`], pure), how it ends (the queue's outcome and the next priority), and what
//! the node's slot keeps (memory, problem, demand, the written version, the demand latency).
//! A pass a step ended early (a refusal, a wait, the finalizer, an unparsable object) is
//! reported by [`ended`].

use serde_json::json;
use tracing::{info, warn};

use crate::clock::now;
use crate::ec2::Ec2;
use crate::ipam::admission::AdmittedNode;
use crate::ipam::{Action, ChangeSet, NodeMemory, Problem, ProblemReason, Subresource, Write};
use crate::k8s::sink::{NodeRef, NodeSink, SinkError};
use crate::k8s::stored::StoredNode;
use crate::reconcile::events::{self, EventReason};
use crate::reconcile::executor::ExecOutcome;
use crate::reconcile::queue::{Outcome, Priority};
use crate::reconcile::shared::Shared;
use crate::reconcile::status::{Figures, WaitReason, Would};

use super::execute::Executed;
use super::plan::Planned;
use super::said::{End, Note, Said};
use super::write::Written;
use super::{FAILED, Verdict};

pub(super) async fn report<E: Ec2, S: NodeSink>(
    inner: &Shared<E, S>,
    name: &str,
    node: &AdmittedNode,
    mut planned: Planned,
    executed: Executed,
    written: Written,
    memory: NodeMemory,
) -> Verdict {
    // What planning found (a wait on the status page) comes first: a later wait replaces it.
    say(inner, name, std::mem::take(&mut planned.facts.said)).await;
    let node_ref = NodeRef::of(written.node.as_ref().unwrap_or(&**node));
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
    let mut said = Said::on(node_ref);
    for (reason, message) in out {
        said.event(reason, message);
    }
    say(inner, name, said).await;
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

/// A pass that ended before its report: say what its steps found, and how it ends.
pub(super) async fn ended<E: Ec2, S: NodeSink>(
    inner: &Shared<E, S>,
    name: &str,
    end: End,
) -> Verdict {
    if say(inner, name, end.said).await {
        end.verdict
    } else {
        FAILED
    }
}

/// Say what the steps found, in their order: the one place a pass publishes Events, writes
/// `operator-status` and records on the status page. `false`: an unparsable object's error
/// could not be written (the pass fails; it is said again).
pub(super) async fn say<E: Ec2, S: NodeSink>(inner: &Shared<E, S>, name: &str, said: Said) -> bool {
    let (sink, m) = (&*inner.sink, &inner.metrics);
    let mut landed = true;
    for note in said.notes {
        let r = said.on.as_ref();
        match (note, r) {
            (Note::Wait(reason, why, until), _) => inner.status.wait(name, reason, why, until),
            (Note::Error(message), _) => inner.status.error(name, message, now()),
            (Note::Event(reason, message), Some(r)) => {
                events::publish(sink, m, r, reason, message).await;
            }
            (Note::Status(message), Some(r)) => {
                if let Err(e) = sink.apply(r, &operator_status(&message)).await {
                    warn!(node = name, error = %e, "could not write operator-status");
                }
            }
            (Note::Invalid { error }, Some(r)) => {
                let reason = ProblemReason::InvalidSpec;
                let message = format!("{}: {error}", reason.as_str());
                let result = sink.apply(r, &operator_status(&message)).await;
                events::publish(sink, m, r, EventReason::Problem(reason), message).await;
                match result {
                    Ok(_) | Err(SinkError::NotFound) => {
                        inner.with_slot(name, |s| s.invalid_reported = Some(error));
                    }
                    Err(_) => landed = false,
                }
            }
            (note, None) => warn!(node = name, ?note, "nothing to say it on"),
        }
    }
    landed
}

/// The merge patch of `status.ipam.operator-status.error`.
fn operator_status(message: &str) -> ChangeSet {
    ChangeSet {
        writes: vec![Write {
            subresource: Subresource::Status,
            patch: json!({"status": {"ipam": {"operator-status": {"error": message}}}}),
            needs_resource_version: false,
        }],
    }
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
    } else if let Some(u) = &planned.facts.limits
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
            (None, false) => s.demand_seen = Some(planned.facts.at),
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

    /// What in `dir`'s pass steps says something itself instead of returning it to the report
    /// step: `file: call` for each Event, `operator-status` write or status-page record outside
    /// `report.rs` (a shadow's pass is its own report: it records on the page, nothing else).
    fn writers_besides_report(dir: &std::path::Path) -> Vec<String> {
        let mut found = Vec::new();
        for entry in std::fs::read_dir(dir).expect("the pass's folder") {
            let path = entry.expect("an entry").path();
            let file = path.file_name().unwrap().to_string_lossy().to_string();
            if file == "report.rs" || path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let text = std::fs::read_to_string(&path).expect("a step");
            // Code only, without whitespace: a call split over lines is found too.
            let code: String = text
                .lines()
                .filter(|l| !l.trim_start().starts_with("//"))
                .flat_map(|l| l.chars().filter(|c| !c.is_whitespace()))
                .collect();
            let mut calls = vec!["events::publish(", ".event(&", "\"operator-status\""];
            if file != "shadow.rs" {
                calls.extend(["status.wait(", "status.error(", "status.observed("]);
            }
            for call in calls.into_iter().filter(|c| code.contains(c)) {
                found.push(format!("{file}: {call}"));
            }
        }
        found.sort();
        found
    }

    #[test]
    fn only_the_report_step_says_anything() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/reconcile/pass");
        assert_eq!(writers_besides_report(&dir), Vec::<String>::new());
    }
}
