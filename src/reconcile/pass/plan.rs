//! Step 3: decide the node's one action from the facts [`super::ec2_facts::for_plan`] read
//! (a healthy view, no hold, the type's limits): asks the engine, and re-reads the CiliumNode
//! right before a multi-pool release (§7.4).

use tracing::{info, warn};

use crate::ec2::Ec2;
use crate::ipam::admission::AdmittedNode;
use crate::ipam::capacity::{self, InterfaceStats};
use crate::ipam::release::{allocated_cidrs, fresh_copy_refuses, readopted};
use crate::ipam::withdrawal::status_lists;
use crate::ipam::{self, Action, Generation, InstanceView, NodeMemory, NodePlan, Release};
use crate::k8s::sink::NodeSink;
use crate::reconcile::shared::Shared;
use crate::reconcile::status::WaitReason;

use super::ec2_facts::PlanFacts;
use super::said::End;
use super::snapshot::Snapshot;
use super::{DONE, FAILED, Step};

/// The engine's plan and the action to carry out (the plan's, or its checked release).
pub(super) struct Planned {
    /// Its `action` is taken out (see `action`).
    pub plan: NodePlan,
    pub action: Action,
    pub instance_id: String,
    pub instance_type: String,
    /// Cilium's interface figures of the node, from the view planned against.
    pub interfaces: Option<InterfaceStats>,
    /// What planning started from (when, the type's limits if unknown), and why the node
    /// waits when planning found a reason (said by the report).
    pub facts: PlanFacts,
}

pub(super) async fn plan<E: Ec2, S: NodeSink>(
    inner: &Shared<E, S>,
    name: &str,
    node: &AdmittedNode,
    memory: &mut NodeMemory,
    snap: &Snapshot,
    mut facts: PlanFacts,
) -> Result<Planned, End> {
    let (t, said) = (facts.at, &mut facts.said);
    let instance_id = node.spec.instance_id.clone();
    let instance_type = node.spec.eni.instance_type.clone();
    let (mut plan, interfaces) = {
        let cache = inner.cache.read().expect("cache");
        let held = super::held_back(&cache, node);
        let view = cache.view_with(&instance_id, &instance_type, held.as_deref());
        let interfaces =
            match (view.instance, view.limits) {
                (InstanceView::Known { enis, .. }, Some(limits)) => Some(
                    capacity::interface_stats(&instance_id, &node.spec.eni, enis, limits),
                ),
                _ => None,
            };
        // Real (not tokio) time: planning is synchronous, so this is its CPU cost.
        let started = std::time::Instant::now();
        let plan = ipam::plan_node(
            node,
            &view,
            &inner.config.ipam,
            memory,
            t,
            snap.pending_pods,
        );
        inner.metrics.plans.inc();
        let nanos = started.elapsed().as_nanos() as u64;
        inner.metrics.plan_nanos.inc_by(nanos);
        if held.is_some() && plan.demand.needed > 0 && matches!(plan.action, Action::None) {
            let why = "addresses an early listing shows are held back until a later listing \
                       confirms them (§14.1)";
            let until = cache.trust_listings_from();
            said.wait(WaitReason::HeldBack, why, until);
        }
        (plan, interfaces)
    };
    // The action moves out of the plan (the rest of the pass needs its demand and problem).
    let action = match std::mem::replace(&mut plan.action, Action::None) {
        Action::Release(r) if plan.demand.generation == Generation::MultiPool => {
            match check_multi_pool_release(inner, name, &r).await {
                Ok(Some(release)) => Action::Release(release),
                Ok(None) => {
                    // Taken back: no EC2 call; the re-adoption's update re-plans the node.
                    let memory = std::mem::take(memory);
                    inner.with_slot(name, |s| s.memory = memory);
                    return Err(End::with(DONE, facts.said));
                }
                Err(verdict) => return Err(End::with(verdict, facts.said)),
            }
        }
        action => action,
    };
    Ok(Planned {
        plan,
        action,
        instance_id,
        instance_type,
        interfaces,
        facts,
    })
}

/// §7.4 step 3, the last check before a multi-pool unassign: read the CiliumNode afresh and
/// release nothing the agent lists in `pools.allocated` again, nor anything the status lists
/// again (the engine withdrew it from the status first: `ipam::withdrawal`). The plan's copy
/// can be seconds old (a lagging watch; awaits that last 20 s under throttling), and the agent
/// re-adopts a dropped CIDR that is still listed when its demand grows (Cilium #46674). One
/// unassign call per pass, so the check always directly precedes the call. `Ok(None)`: skip
/// this pass.
async fn check_multi_pool_release<E: Ec2, S: NodeSink>(
    inner: &Shared<E, S>,
    name: &str,
    planned: &Release,
) -> Step<Option<Release>> {
    let fresh = match inner.sink.fetch(name).await {
        Ok(Some(fresh)) => fresh,
        // Gone: the watch's delete follows.
        Ok(None) => return Err(DONE),
        Err(e) => {
            warn!(node = name, error = %e, "cannot re-read the CiliumNode before a release");
            return Err(FAILED);
        }
    };
    if readopted(planned, &allocated_cidrs(&fresh)) {
        // The slot keeps the watched copy: the watch delivers this update (or a newer one)
        // and re-plans; storing our read could overwrite a newer watched version.
        info!(node = name, eni = %planned.eni_id, "the agent took back CIDRs planned for release; not releasing");
        return Ok(None);
    }
    if let Some(why) = fresh_copy_refuses(planned, &fresh) {
        info!(node = name, eni = %planned.eni_id, "not releasing CIDRs: {why}");
        return Ok(None);
    }
    if !crate::mutants::active("unassign-before-withdraw")
        && planned.cidrs().any(|c| status_lists(&fresh, &c))
    {
        // Someone published it again (another replica's write): the agent may take it.
        info!(node = name, eni = %planned.eni_id, "CIDRs planned for release are listed again; not releasing");
        return Ok(None);
    }
    Ok(Some(planned.clone()))
}
