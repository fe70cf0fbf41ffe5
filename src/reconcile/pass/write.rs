//! Step 5: what the CiliumNode should say after the action (against the updated cache), and
//! the change set that gets it there; nothing is written when nothing changed.

use tracing::{debug, warn};

use crate::crd::CiliumNode;
use crate::ec2::Ec2;
use crate::ipam::admission::AdmittedNode;
use crate::ipam::demand::Demand;
use crate::ipam::{self, NodeMemory};
use crate::k8s::sink::{NodeRef, NodeSink, SinkError};
use crate::reconcile::queue::{Outcome, Priority};
use crate::reconcile::shared::Shared;

use super::execute::Executed;
use super::plan::Planned;
use super::{DONE, Step};

pub(super) struct Written {
    pub outcome: Outcome,
    /// Look again at once (the write met a newer version).
    pub again: Option<Priority>,
    /// The node as written (or the newer version a conflict returned).
    pub node: Option<CiliumNode>,
    /// The slot's watch delivery right before the write: `node` is kept only if it holds.
    pub ticket: super::Ticket,
    /// The node's demand after the pass's EC2 action (`None`: watermarks invalid).
    pub demand: Option<Demand>,
}

pub(super) async fn write<E: Ec2, S: NodeSink>(
    inner: &Shared<E, S>,
    name: &str,
    node: &AdmittedNode,
    planned: &Planned,
    executed: &Executed,
    memory: &NodeMemory,
) -> Step<Written> {
    let desired = {
        let cache = inner.cache.read().expect("cache");
        let held = super::held_back(&cache, node);
        let view = cache.view_with(
            &planned.instance_id,
            &planned.instance_type,
            held.as_deref(),
        );
        let problem = executed.problem.as_ref();
        ipam::desired_state(node, &view, &inner.config.ipam, memory, problem)
    };
    let changes = ipam::changes(node, &desired);
    let mut written = Written {
        outcome: Outcome::Done,
        again: None,
        node: None,
        ticket: inner.ticket(name),
        demand: desired.demand,
    };
    if changes.is_empty() {
        return Ok(written);
    }
    debug!(node = name, ?changes, "writing the CiliumNode");
    match inner.sink.apply(&NodeRef::of(node), &changes).await {
        Ok(n) => written.node = n,
        Err(SinkError::NotFound) => return Err(DONE),
        Err(SinkError::Conflict(fresh)) => {
            // Recompute against the fresh object next pass.
            written.node = fresh.map(|f| *f);
            written.again = Some(Priority::Routine);
        }
        Err(e) => {
            warn!(node = name, error = %e, "CiliumNode write failed");
            written.outcome = Outcome::Failed;
            // A 5xx can hide a committed write, whose watch event may be seconds away: diff the
            // next pass against what the server has. Against our older copy, a pool address
            // the lost write added would not be removed when the status drops it (C1, C2).
            if let Ok(Some(fresh)) = inner.sink.fetch(name).await {
                written.node = Some(fresh);
            }
        }
    }
    Ok(written)
}
