//! Step 4: carry out the planned action through the executor (which updates the cache at
//! once) and note in the node's memory what it released and whether its create token is spent.

use crate::clock::now;
use crate::ec2::Ec2;
use crate::ipam::{NodeMemory, Problem, ProblemReason};
use crate::k8s::sink::NodeSink;
use crate::reconcile::events;
use crate::reconcile::executor::ExecOutcome;
use crate::reconcile::shared::Shared;

use super::plan::Planned;

pub(super) struct Executed {
    pub exec: ExecOutcome,
    /// The node's problem after the action: the failed call's, else the plan's.
    pub problem: Option<Problem>,
}

pub(super) async fn execute<E: Ec2, S: NodeSink>(
    inner: &Shared<E, S>,
    planned: &Planned,
    memory: &mut NodeMemory,
) -> Executed {
    let exec = inner.executor.execute(&planned.action).await;
    if let Some(r) = &exec.released {
        memory.record_released(r, now());
    }
    if exec.retire_token {
        memory.retire_eni_token();
    }
    let problem = match &exec.error {
        Some(e) => {
            events::count_ec2_error(&inner.metrics, e);
            Some(Problem {
                reason: ProblemReason::Ec2Error,
                message: e.to_string(),
            })
        }
        None => planned.plan.problem.clone(),
    };
    Executed { exec, problem }
}
