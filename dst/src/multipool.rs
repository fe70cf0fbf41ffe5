//! The agents' side of the world beyond the classic model (dst/src/agent.rs): multi-pool agents
//! mixed with classic ones, agent restarts, and the pending pods the operator watches. Every
//! choice comes from its own stream ([`Agents::rng`], derived from the seed), so these draws do
//! not shift the schedule the rest of the harness draws from the seed's main stream.
//!
//! The multi-pool agent is the end-to-end suite's pure model (`testkit::agent`, from
//! Cilium's pkg/ipam multi-pool code in ENI mode): it derives its CIDRs from `status.eni.enis`
//! (C3), hands addresses to endpoints (router, health, then pods), re-adopts dropped CIDRs when it
//! runs short (Cilium #46674), and writes `spec.ipam.pools.requested` (in use + pending +
//! pre-allocation) and `allocated`. The operator reads its use as requested - pre-allocate (C7).

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;

use eni_operator::crd::{CiliumNode, ReleaseState};
use eni_operator::ec2::NetworkInterface;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::Value;
use testkit::agent::{Cidr, INTERNAL_ENDPOINTS, MultiPoolAgent};

use crate::agent::Agent;

/// Agent restarts per mille per simulated second (about 4-5 in 25 minutes).
pub const P_AGENT_RESTART: u32 = 3;
/// How long a restarting agent writes nothing (Cilium's agent restores its state and resumes
/// its CiliumNode sync within seconds to a minute of a restart).
const RESTART_DOWNTIME: std::ops::Range<u64> = 5..60;

/// What the agents of one run are like, and what they saw go wrong.
pub struct Agents {
    /// This module's own stream of the seed.
    pub rng: StdRng,
    /// Share of joining nodes that run the multi-pool agent (0 in some runs: classic only).
    pub multi_pool_share: f64,
    /// Whether the operator gets the pending-pod counts (its pod watch) in this run.
    pub pending_pods: bool,
    /// Pending-pod counts last told the operator, per node.
    pub pending_sent: BTreeMap<String, u32>,
    /// Misbehaviour the multi-pool agents observed (an address in use left `status.eni`, C2).
    pub violations: Vec<String>,
}

impl Agents {
    /// The run's draws: whether the API server prunes by Cilium's CRD (else the operator's own
    /// CRD, which preserves unknown fields), the multi-pool share, pending pods on or off.
    pub fn new(seed: u64) -> (Self, bool) {
        let mut rng = StdRng::seed_from_u64(seed ^ 0xA6E7_5EED_0000_0001);
        let pruned = rng.random_bool(0.7);
        let multi_pool_share = [0.0, 0.3, 0.5, 1.0][rng.random_range(0..4)];
        let pending_pods = rng.random_bool(0.7);
        (
            Self {
                rng,
                multi_pool_share,
                pending_pods,
                pending_sent: BTreeMap::new(),
                violations: Vec::new(),
            },
            pruned,
        )
    }

    /// A joining node's agent generation.
    pub fn draw_multi_pool(&mut self) -> Option<MultiPool> {
        self.rng
            .random_bool(self.multi_pool_share)
            .then(MultiPool::default)
    }

    /// Whether an agent restarts this second, and for how long it is down.
    pub fn draw_restart(&mut self) -> Option<u64> {
        (self.rng.random_range(0..1000) < P_AGENT_RESTART)
            .then(|| self.rng.random_range(RESTART_DOWNTIME))
    }

    /// Pick one of `names`.
    pub fn pick<'a>(&mut self, names: &'a [String]) -> Option<&'a String> {
        (!names.is_empty()).then(|| &names[self.rng.random_range(0..names.len())])
    }
}

/// The agent writes its CiliumNode at most this often: Cilium's
/// `--ipam-cilium-node-update-rate` (default 15 s). Between writes it hands out addresses it
/// has not listed in `allocated` yet.
const UPDATE_RATE: u64 = 15;

/// A node's multi-pool agent.
#[derive(Debug, Default)]
pub struct MultiPool {
    pub agent: MultiPoolAgent,
    /// The simulated second of its last CiliumNode write.
    last_write: Option<u64>,
}

impl MultiPool {
    /// One look at the node with `classic.target` pods wanted: the agent's spec and status
    /// patches applied to the object (`None` when it writes nothing). `classic.pods` mirrors the
    /// pods' addresses, so the demand checks and the trace read both generations alike.
    pub fn step(
        &mut self,
        node: &CiliumNode,
        classic: &mut Agent,
        violations: &mut Vec<String>,
    ) -> Option<CiliumNode> {
        let step = self.agent.step(node, classic.target);
        let name = node.metadata.name.clone().unwrap_or_default();
        violations.extend(step.violations.iter().map(|v| format!("{name}: {v}")));
        classic.pods = self
            .agent
            .in_use()
            .iter()
            .filter(|(_, idx)| **idx >= INTERNAL_ENDPOINTS)
            .map(|(ip, _)| ip.to_string())
            .collect();
        if step.spec_patch.is_none() && step.status_patch.is_none() {
            return None;
        }
        let mut v = serde_json::to_value(node).expect("serialise");
        for patch in [step.spec_patch, step.status_patch].into_iter().flatten() {
            json_patch::merge(&mut v, &without_metadata(patch));
        }
        Some(serde_json::from_value(v).expect("the agent's patch keeps the object valid"))
    }

    /// Whether the agent may write at second `t` (its update rate); noted as a write if so.
    pub fn may_write(&mut self, t: u64) -> bool {
        let due = self.last_write.is_none_or(|w| t >= w + UPDATE_RATE);
        if due {
            self.last_write = Some(t);
        }
        due
    }

    /// The agent restarts: its endpoints keep running on their addresses (Cilium restores
    /// them from its endpoint state), everything else is rebuilt from the CiliumNode.
    pub fn restart(&mut self) {
        self.agent = MultiPoolAgent::restored(self.agent.in_use().clone());
    }

    /// Addresses held by the node's endpoints (router, health, pods).
    pub fn in_use(&self) -> impl Iterator<Item = Ipv4Addr> + '_ {
        self.agent.in_use().keys().copied()
    }
}

/// The patch's `metadata.resourceVersion` is the agent's optimistic-concurrency guard; the
/// harness applies a step atomically on the object it just read, so the guard always holds.
fn without_metadata(mut patch: Value) -> Value {
    if let Some(o) = patch.as_object_mut() {
        o.remove("metadata");
    }
    patch
}

/// Whether EC2 has `ip` on `eni` (primary, secondary or inside a delegated prefix).
fn holds(eni: &NetworkInterface, ip: Ipv4Addr) -> bool {
    eni.primary_ip == ip
        || eni.secondary_ips.contains(&ip)
        || eni.prefixes.iter().any(|p| p.contains(&ip))
}

/// Whether the node's agent may still put a pod on pool address `ip`. Not once it gave the
/// address up: a classic agent that acknowledged its release (`ready-for-release`, `released`),
/// a multi-pool agent that no longer lists it in `allocated`. Such an address may already be
/// another node's while the operator's unassign is in flight (a lost answer, the gate's retry
/// seconds later) and the node's CiliumNode still lists it: harmless, as its agent no longer
/// uses it.
pub fn agent_may_use(node: &CiliumNode, multi_pool: bool, ip: &str) -> bool {
    if multi_pool {
        let Ok(addr) = ip.parse::<Ipv4Addr>() else {
            return true;
        };
        return node
            .spec
            .ipam
            .pools
            .allocated
            .iter()
            .flat_map(|a| &a.cidrs)
            .filter_map(|c| Cidr::parse(c))
            .any(|c| c.contains(addr));
    }
    let given_up = node
        .status
        .as_ref()
        .and_then(|s| s.ipam.release_ips.get(ip))
        .and_then(|s| ReleaseState::parse(s))
        .is_some_and(|s| matches!(s, ReleaseState::ReadyForRelease | ReleaseState::Released));
    !given_up
}

/// No address a multi-pool agent's endpoints hold is ever unassigned or moved off the node's
/// instance; nothing the agents observed went wrong.
pub fn check(w: &crate::world::World) -> Result<(), crate::check::Broken> {
    if let Some(v) = w.agents.violations.first() {
        return Err(("multi-pool agent sees its addresses and C2 hold", v.clone()));
    }
    let enis = w.view.borrow_mut().enis(&w.sim);
    for (name, n) in &w.nodes {
        let Some(mp) = n.multi_pool.as_ref().filter(|_| n.running()) else {
            continue;
        };
        let on_instance: Vec<&NetworkInterface> = enis
            .values()
            .filter(|e| {
                e.attachment
                    .as_ref()
                    .is_some_and(|a| a.instance_id == n.instance_id)
            })
            .collect();
        let lost: BTreeSet<Ipv4Addr> = mp
            .in_use()
            .filter(|ip| !on_instance.iter().any(|e| holds(e, *ip)))
            .collect();
        if !lost.is_empty() {
            let allocated = w
                .sink
                .get(name)
                .map(|o| o.spec.ipam.pools.allocated)
                .unwrap_or_default();
            return Err((
                "no address a multi-pool agent allocated unassigned",
                format!("{name}: {lost:?} not on its instance; allocated {allocated:?}"),
            ));
        }
    }
    Ok(())
}

impl crate::world::World {
    /// This second's agent events: maybe one running agent restarts (its memory is lost; it
    /// writes nothing until it is back; its pods keep running).
    pub fn agent_events(&mut self, t: u64) {
        let Some(down) = self.agents.draw_restart() else {
            return;
        };
        let names: Vec<String> = self
            .nodes
            .iter()
            .filter(|(_, n)| n.running() && n.agent_down_until <= t)
            .map(|(k, _)| k.clone())
            .collect();
        let Some(name) = self.agents.pick(&names).cloned() else {
            return;
        };
        let n = self.nodes.get_mut(&name).expect("picked");
        n.agent_down_until = t + down;
        if let Some(mp) = n.multi_pool.as_mut() {
            mp.restart();
        }
        self.log(
            t,
            format!("agent on {name} restarts, back at t={}s", t + down),
        );
    }

    /// The pods bound to `name` are gone (the pod GC, once the Node of that name is): its pod
    /// watch reports no pending pod there any more. (`make dst` seed 21: a renamed node's old
    /// name kept its count, and a restarted operator held that name for good.)
    pub fn pods_gone(&mut self, name: &str) {
        if self.agents.pending_sent.remove(name).is_some_and(|c| c > 0) {
            self.send(eni_operator::event_loop::core::NodeInput::PendingPods {
                name: name.to_string(),
                count: 0,
            });
        }
    }

    /// Tell the operator how many pods wait on each node (scheduled, no address yet: the pods
    /// wanted beyond those running), when that count changed; `all` repeats every non-zero
    /// count (a new operator's pod watch lists them at start).
    pub fn report_pending(&mut self, all: bool) {
        if !self.agents.pending_pods {
            return;
        }
        if all {
            let sent: Vec<(String, u32)> = self
                .agents
                .pending_sent
                .iter()
                .filter(|(_, count)| **count > 0)
                .map(|(name, count)| (name.clone(), *count))
                .collect();
            for (name, count) in sent {
                self.send(eni_operator::event_loop::core::NodeInput::PendingPods { name, count });
            }
            return;
        }
        let counts: Vec<(String, u32)> = self
            .nodes
            .iter()
            .map(|(name, n)| {
                let pending = if n.phase == crate::world::Phase::Live {
                    n.agent.target.saturating_sub(n.agent.pods.len())
                } else {
                    0
                };
                (name.clone(), pending as u32)
            })
            .collect();
        for (name, count) in counts {
            let was = self.agents.pending_sent.get(&name).copied().unwrap_or(0);
            if was != count {
                self.agents.pending_sent.insert(name.clone(), count);
                self.send(eni_operator::event_loop::core::NodeInput::PendingPods { name, count });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use eni_operator::ec2::Ec2;

    use super::*;
    use crate::world::World;

    /// A world with one multi-pool node running `pods` pods, after two simulated minutes.
    async fn one_multi_pool_node(seed: u64, pods: usize) -> (World, StdRng) {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut w = World::new(seed, &mut rng).await;
        w.agents.multi_pool_share = 1.0;
        w.join(&mut rng).await;
        let n = w.nodes.get_mut("node-0").expect("joined");
        n.agent.target = pods;
        n.agent_down_until = 0;
        for t in 0..120 {
            w.tick(&mut rng, t).await;
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        (w, rng)
    }

    #[test]
    fn an_address_a_multi_pool_agent_holds_unassigned_is_caught() {
        crate::paused_runtime().block_on(async {
            let (w, _) = one_multi_pool_node(7, 3).await;
            let n = &w.nodes["node-0"];
            assert_eq!(n.agent.pods.len(), 3, "the agent runs its pods");
            let node = w.sink.get("node-0").expect("stored");
            assert!(!node.spec.ipam.pools.requested.is_empty(), "{node:?}");
            check(&w).expect("holds while nobody releases anything");
            // Take a pod's address away behind everyone's back.
            let mp = n.multi_pool.as_ref().expect("multi-pool");
            let ip = mp.in_use().last().expect("a pod");
            let eni = w
                .sim
                .network_interfaces()
                .into_iter()
                .find(|e| holds(e, ip))
                .expect("assigned");
            let (ips, prefixes): (Vec<Ipv4Addr>, Vec<_>) =
                match eni.prefixes.iter().find(|p| p.contains(&ip)) {
                    Some(p) => (vec![], vec![*p]),
                    None => (vec![ip], vec![]),
                };
            w.sim
                .unassign_private_ip_addresses(&eni.id, &ips, &prefixes)
                .await
                .expect("unassigned");
            let (invariant, detail) = check(&w).expect_err("caught");
            assert_eq!(
                invariant,
                "no address a multi-pool agent allocated unassigned"
            );
            assert!(detail.contains(&ip.to_string()), "{detail}");
        });
    }

    #[test]
    fn an_address_given_up_to_a_release_is_no_longer_the_agents() {
        use eni_operator::crd::IpamPoolAllocation;
        let mut node = CiliumNode::new("n", Default::default());
        node.spec.ipam.pools.allocated.push(IpamPoolAllocation {
            pool: "default".into(),
            cidrs: vec!["10.0.0.16/28".into(), "10.0.0.5/32".into()],
            ..Default::default()
        });
        assert!(agent_may_use(&node, true, "10.0.0.5"));
        assert!(agent_may_use(&node, true, "10.0.0.20"));
        assert!(!agent_may_use(&node, true, "10.0.0.6"), "dropped");
        let status = node.status.get_or_insert_default();
        for (ip, state) in [
            ("10.0.0.6", ReleaseState::MarkedForRelease),
            ("10.0.0.7", ReleaseState::ReadyForRelease),
            ("10.0.0.8", ReleaseState::Released),
            ("10.0.0.9", ReleaseState::DoNotRelease),
        ] {
            status
                .ipam
                .release_ips
                .insert(ip.into(), state.as_str().into());
        }
        assert!(agent_may_use(&node, false, "10.0.0.5"));
        assert!(
            agent_may_use(&node, false, "10.0.0.6"),
            "maybe still in use"
        );
        assert!(!agent_may_use(&node, false, "10.0.0.7"));
        assert!(!agent_may_use(&node, false, "10.0.0.8"));
        assert!(agent_may_use(&node, false, "10.0.0.9"));
    }

    #[test]
    fn a_restarted_multi_pool_agent_keeps_its_pods_and_rewrites_nothing() {
        crate::paused_runtime().block_on(async {
            let (mut w, _) = one_multi_pool_node(11, 4).await;
            let node = w.sink.get("node-0").expect("stored");
            let n = w.nodes.get_mut("node-0").expect("joined");
            let before: Vec<Ipv4Addr> = n.multi_pool.as_ref().expect("mp").in_use().collect();
            let pods = n.agent.pods.clone();
            let mp = n.multi_pool.as_mut().expect("mp");
            mp.restart();
            let mut violations = Vec::new();
            let edited = mp.step(&node, &mut n.agent, &mut violations);
            assert!(
                edited.is_none(),
                "nothing to write: same CIDRs, same demand: {edited:?}"
            );
            assert!(violations.is_empty(), "{violations:?}");
            let after: Vec<Ipv4Addr> = mp.in_use().collect();
            assert_eq!(before, after);
            assert_eq!(n.agent.pods, pods);
            assert_eq!(pods.len(), 4);
        });
    }
}
