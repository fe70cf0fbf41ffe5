//! Allocation planning.
use std::time::Instant;

use super::*;

pub fn plan_node(
    _node: &CiliumNode,
    _ec2: &Ec2View<'_>,
    _config: &IpamConfig,
    _memory: &mut NodeMemory,
    _now: Instant,
    _pending_pods: u32,
) -> NodePlan {
    NodePlan {
        demand: Demand::default(),
        action: Action::None,
        problem: None,
    }
}
