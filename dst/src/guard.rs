//! Invariants about nodes whose Kubernetes Node still exists (live or draining: Karpenter keeps
//! a deleted Node, and its instance running pods, until its finalizer goes). Such a node keeps
//! its CiliumNode, and keeps every ENI of ours attached to its instance: nothing the operator
//! does may detach or delete one of them (only the instance's termination or the Node's end
//! lets them go). The "no address in use unassigned" check cannot see this on its own: once a
//! CiliumNode is deleted there is no `status.ipam.used` left to check.

use std::collections::BTreeMap;
use std::sync::Mutex;

use eni_operator::ec2::EniState;

use crate::check::{Broken, ours};
use crate::world::World;

/// Our ENIs attached to the instances of present nodes, as of the previous check:
/// ENI id -> (node, instance).
#[derive(Debug, Default)]
pub struct Guard {
    attached: Mutex<BTreeMap<String, (String, String)>>,
}

impl Guard {
    /// Checked after every simulated second.
    pub fn check(&self, w: &World) -> Result<(), Broken> {
        let enis: BTreeMap<String, _> = w
            .sim
            .network_interfaces()
            .into_iter()
            .map(|e| (e.id.clone(), e))
            .collect();
        for (name, n) in &w.nodes {
            if n.running() && w.sink.raw(name).is_none() {
                return Err((
                    "a present Node keeps its CiliumNode",
                    format!(
                        "{name}: the CiliumNode is gone while the Node is {:?}",
                        n.phase
                    ),
                ));
            }
        }
        let mut before = self.attached.lock().expect("guard");
        let t = w.seconds();
        let grace = crate::world::NODE_GONE_GRACE;
        for (id, (name, instance)) in before.iter() {
            // Still present (and its instance still running), or gone while the instance runs
            // and within the grace period, this second?
            if !w.nodes.get(name).is_some_and(|n| n.keeps_enis(t, grace)) {
                continue;
            }
            let now = enis.get(id);
            let still = now.is_some_and(|e| {
                e.state != EniState::Detaching
                    && e.attachment
                        .as_ref()
                        .is_some_and(|a| &a.instance_id == instance)
            });
            if !still {
                return Err((
                    "a present Node keeps its ENIs",
                    format!(
                        "{name} ({:?}): our {id} left {instance}; EC2 has {now:?}",
                        w.nodes[name].phase
                    ),
                ));
            }
        }
        let by_instance: BTreeMap<&str, &str> = w
            .nodes
            .iter()
            .filter(|(_, n)| n.keeps_enis(t, grace))
            .map(|(name, n)| (n.instance_id.as_str(), name.as_str()))
            .collect();
        *before = enis
            .values()
            .filter(|e| ours(e))
            .filter_map(|e| {
                let a = e.attachment.as_ref()?;
                let name = by_instance.get(a.instance_id.as_str())?;
                Some((e.id.clone(), (name.to_string(), a.instance_id.clone())))
            })
            .collect();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use eni_operator::ec2::Ec2;

    use crate::world::{Phase, World};

    /// A draining node whose ENI of ours is detached (what a finalizer run too early does) is a
    /// violation; the same node live, before the detach, is not.
    #[test]
    fn a_draining_node_losing_an_eni_of_ours_is_caught() {
        crate::paused_runtime().block_on(async {
            let (mut w, mut rng) = World::seeded(11).await;
            w.join(&mut rng).await;
            let (name, instance) = {
                let (name, n) = w.nodes.iter_mut().next().expect("one node");
                n.agent.target = n.capacity.max(1);
                (name.clone(), n.instance_id.clone())
            };
            // Until the operator has attached an ENI of ours to the instance.
            let mut ours = None;
            for t in 0..300 {
                w.tick(&mut rng, t).await;
                tokio::time::sleep(Duration::from_secs(1)).await;
                w.guard.check(&w).expect("nothing wrong yet");
                ours = w.sim.network_interfaces().into_iter().find(|e| {
                    crate::check::ours(e)
                        && e.attachment
                            .as_ref()
                            .is_some_and(|a| a.instance_id == instance)
                });
                if ours.is_some() {
                    break;
                }
            }
            let eni = ours.expect("the operator attached an ENI of ours");
            w.drain(&mut rng, 300);
            assert!(matches!(w.nodes[&name].phase, Phase::Draining { .. }));
            w.guard.check(&w).expect("draining, nothing taken yet");
            let attachment = eni.attachment.expect("attached").id;
            w.sim
                .detach_network_interface(&attachment, true)
                .await
                .expect("detach");
            tokio::time::sleep(Duration::from_secs(1)).await;
            let (invariant, detail) = w.guard.check(&w).expect_err("caught");
            assert_eq!(invariant, "a present Node keeps its ENIs", "{detail}");
        });
    }
}
