//! The classic Cilium agent's side of the release handshake: the one model of its answers,
//! used by [`super::ClassicAgent`] (e2e), the benchmark, the simulation and the runtime tests.

use std::collections::BTreeMap;

use eni_operator::crd::{CiliumNode, ReleaseState};

/// The classic Cilium agent's answer to each entry of `status.ipam.release-ips` (Cilium's
/// `pkg/ipam/crd.go`): a proposed address still in the pool and not in use is
/// `ready-for-release`, any other proposal is declined with `do-not-release`; a `released`
/// address that has left the pool is forgotten (`None`: the entry is deleted). Entries that
/// need no answer are absent.
pub fn release_answers(
    node: &CiliumNode,
    in_use: impl Fn(&str) -> bool,
) -> BTreeMap<String, Option<ReleaseState>> {
    let pool = &node.spec.ipam.pool;
    let mut answers = BTreeMap::new();
    let Some(status) = &node.status else {
        return answers;
    };
    for (ip, state) in &status.ipam.release_ips {
        match ReleaseState::parse(state) {
            Some(ReleaseState::MarkedForRelease) => {
                let answer = if pool.contains_key(ip) && !in_use(ip) {
                    ReleaseState::ReadyForRelease
                } else {
                    ReleaseState::DoNotRelease
                };
                answers.insert(ip.clone(), Some(answer));
            }
            Some(ReleaseState::Released) if !pool.contains_key(ip) => {
                answers.insert(ip.clone(), None);
            }
            _ => {}
        }
    }
    answers
}

/// Answer the operator's release proposals in place, as [`release_answers`] decides.
pub fn answer_release_proposals(node: &mut CiliumNode, in_use: impl Fn(&str) -> bool) {
    let answers = release_answers(node, in_use);
    let status = node.status.get_or_insert_with(Default::default);
    for (ip, a) in answers {
        match a {
            Some(s) => status.ipam.release_ips.insert(ip, s.as_str().to_string()),
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
