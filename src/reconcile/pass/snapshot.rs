//! Step 1: copy what the pass needs out of the node's slot (the lock is not held across
//! awaits).

use std::time::Instant;

use crate::ec2::Ec2;
use crate::ipam::NodeMemory;
use crate::k8s::input::InvalidNode;
use crate::k8s::sink::NodeSink;
use crate::k8s::stored::StoredNode;
use crate::reconcile::shared::Shared;

use super::{DONE, Step};

#[derive(Debug)]
pub(super) struct Snapshot {
    pub node: Option<StoredNode>,
    pub memory: NodeMemory,
    pub invalid: Option<InvalidNode>,
    pub invalid_reported: Option<String>,
    pub k8s_node: Option<bool>,
    /// Left alone until then (the instance was not running).
    pub hold: Option<Instant>,
    pub pending_pods: u32,
    pub ignored: bool,
}

/// The node's slot, or the end of the pass if it is gone.
pub(super) fn take<E: Ec2, S: NodeSink>(inner: &Shared<E, S>, name: &str) -> Step<Snapshot> {
    let slots = inner.slots.lock().expect("slots");
    let slot = slots.get(name).ok_or(DONE)?;
    Ok(Snapshot {
        node: slot.node.clone(),
        memory: slot.memory.clone(),
        invalid: slot.invalid.clone(),
        invalid_reported: slot.invalid_reported.clone(),
        k8s_node: slot.k8s_node,
        hold: slot.not_running_until,
        pending_pods: slot.pending_pods,
        ignored: slot.ignored,
    })
}
