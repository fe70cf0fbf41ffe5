//! The classic Cilium agent's side of the release handshake, shared by the benchmark, the
//! simulation and the runtime tests (one model instead of one copy each).

use std::collections::BTreeMap;

use crate::crd::{CiliumNode, ReleaseState};

/// Answer the operator's release proposals as a classic agent does (Cilium's
/// `pkg/ipam/crd.go`): a proposed address still in the pool and not in use is
/// `ready-for-release`, any other proposal is declined with `do-not-release`; a `released`
/// address that has left the pool is forgotten.
pub fn answer_release_proposals(node: &mut CiliumNode, in_use: impl Fn(&str) -> bool) {
    let pool = &node.spec.ipam.pool;
    let status = node.status.get_or_insert_with(Default::default);
    let mut answers = BTreeMap::new();
    for (ip, state) in &status.ipam.release_ips {
        match ReleaseState::parse(state) {
            Some(ReleaseState::MarkedForRelease) => {
                let answer = if pool.contains_key(ip) && !in_use(ip) {
                    ReleaseState::ReadyForRelease
                } else {
                    ReleaseState::DoNotRelease
                };
                answers.insert(ip.clone(), Some(answer.as_str().to_string()));
            }
            Some(ReleaseState::Released) if !pool.contains_key(ip) => {
                answers.insert(ip.clone(), None);
            }
            _ => {}
        }
    }
    for (ip, a) in answers {
        match a {
            Some(s) => status.ipam.release_ips.insert(ip, s),
            None => status.ipam.release_ips.remove(&ip),
        };
    }
}

/// A classic agent answering from its own `status.ipam.used`.
pub fn classic_agent_answers(node: &mut CiliumNode) {
    let used = node
        .status
        .as_ref()
        .map(|s| s.ipam.used.clone())
        .unwrap_or_default();
    answer_release_proposals(node, |ip| used.contains_key(ip));
}
