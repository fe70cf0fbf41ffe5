//! Write-back: desired operator-owned fields and the change set.
use super::*;

pub fn desired_state(
    _node: &CiliumNode,
    _ec2: &Ec2View<'_>,
    _config: &IpamConfig,
    _memory: &NodeMemory,
    _problem: Option<&Problem>,
) -> DesiredState {
    DesiredState::default()
}

pub fn changes(_node: &CiliumNode, _desired: &DesiredState) -> ChangeSet {
    ChangeSet::default()
}
