//! A shadow's pass over one node (`--mode=shadow`): [`super::snapshot`] and [`super::plan`] as
//! the active operator runs them, then the comparison ([`ShadowBook::observe`]) instead of
//! execute, write and report. Nothing here writes or mutates; the shadow's sink and EC2 client
//! are read-only types besides ([`crate::k8s::readonly`], [`crate::ec2::readonly`]), so a
//! step that tried would be refused and counted.

use std::sync::Arc;
use std::time::Instant;

use crate::clock::now;
use crate::ec2::Ec2;
use crate::ipam::admission::{self, Decision};
use crate::k8s::sink::NodeSink;
use crate::reconcile::queue::Outcome;
use crate::reconcile::shadow::{EniSeen, Observation, ShadowBook};
use crate::reconcile::shared::Shared;

use super::{DONE, Step, Verdict, ec2_facts, lifecycle, plan, report, snapshot};

pub(super) async fn pass<E: Ec2, S: NodeSink>(
    inner: &Shared<E, S>,
    name: &str,
    book: &Arc<ShadowBook>,
) -> Verdict {
    let (seen, verdict) = match steps(inner, name).await {
        Ok(done) => done,
        Err(verdict) => (Seen::Nothing, verdict),
    };
    match seen {
        Seen::Nothing => {}
        Seen::Gone => {
            book.forget(name);
            inner.status.forget(name);
        }
        Seen::NotCompared => book.forget(name),
        Seen::Observed(obs, at) => {
            book.observe(name, obs, at);
        }
    }
    verdict
}

/// What a shadow's pass tells its book of the node.
enum Seen {
    Nothing,
    /// The slot is gone: the node's figures and its status go.
    Gone,
    /// Not ours to compare (opted out, out of scope, going away).
    NotCompared,
    /// Compared (or the active operator's error, as ours), planned at that time.
    Observed(Observation, Instant),
}

/// The node's observation as an error of ours.
fn error(message: String) -> (Seen, Verdict) {
    let obs = Observation {
        error: Some(message),
        ..Observation::default()
    };
    (Seen::Observed(obs, now()), DONE)
}

async fn steps<E: Ec2, S: NodeSink>(inner: &Shared<E, S>, name: &str) -> Step<(Seen, Verdict)> {
    let Ok(mut snap) = snapshot::take(inner, name) else {
        return Ok((Seen::Gone, DONE));
    };
    if let Some(invalid) = &snap.invalid {
        // What the active operator would report on the node, as an error of ours.
        return Ok(error(invalid.error.clone()));
    }
    let stored = snap.node.as_ref().ok_or(DONE)?;
    // The active operator's admission, without the guard (another allocator serves the node:
    // that is the point of a shadow) and without EC2 calls of its own.
    let facts = lifecycle::facts(inner, name, stored, &snap, true);
    let node = match admission::decide(&facts) {
        Decision::Serve(serve) => facts.admit(serve),
        Decision::Wait { retry, .. } => return Err((Outcome::RetryAfter(retry), None)),
        // The active operator's refusal (§15), as an error of ours.
        Decision::Refuse(r) => return Ok(error(format!("{}: {}", r.reason.as_str(), r.message))),
        // Opted out, out of scope, or going away (the live GET is the active operator's):
        // nothing to compare.
        Decision::HandBack
        | Decision::LeaveAlone(_)
        | Decision::Finalize(_)
        | Decision::Need(_) => return Ok((Seen::NotCompared, DONE)),
    };
    let instance = node.spec.instance_id.clone();
    // The serving allocator's changes reach our cache only through describes (we make none of
    // our own to confirm): describe the instance when its CiliumNode names an ENI, address or
    // prefix we do not know, so that a deficit ends on the write that serves it, not at our
    // next full listing (docs/shadow-mode.md).
    if names_unknown(inner, &node) {
        inner
            .refresh_instances(std::slice::from_ref(&instance), &[])
            .await;
    }
    let mut memory = std::mem::take(&mut snap.memory);
    // Planning's waits go on the status page as the active operator's report puts them (a
    // shadow's plan says nothing else).
    let planned = async {
        let facts = ec2_facts::for_plan(inner, name, &node, &snap).await?;
        plan::plan(inner, name, &node, &mut memory, &snap, facts).await
    };
    let mut planned = match planned.await {
        Ok(p) => p,
        Err(end) => {
            inner.with_slot(name, |s| s.memory = memory);
            report::say(inner, name, end.said).await;
            return Err(end.verdict);
        }
    };
    report::say(inner, name, std::mem::take(&mut planned.facts.said)).await;
    if let Some(u) = planned.facts.limits.as_ref().filter(|u| !u.invalid_type) {
        // Our own missing data (the lookup failed), not a disagreement with the serving
        // allocator: compare once the limits are known.
        inner.with_slot(name, |s| s.memory = memory);
        return Err((
            Outcome::RetryAfter(u.retry_at.saturating_duration_since(now())),
            None,
        ));
    }
    // The deficit is the agent's: addresses count once the serving allocator has written them.
    let (enis, seen) = {
        let cache = inner.cache.read().expect("cache");
        let view = cache.view(&instance, &planned.instance_type);
        let enis = match view.instance {
            crate::ipam::InstanceView::Known { enis, .. } => Some(EniSeen::secondary(enis)),
            _ => None,
        };
        let seen = crate::ipam::published::agent_demand(&node, &view, &inner.config.ipam);
        (enis, seen)
    };
    let obs = Observation::of(
        &instance,
        &planned.plan,
        seen.as_ref(),
        &planned.action,
        enis,
    );
    inner
        .status
        .observed(name, obs.figures.clone(), obs.would.clone());
    if let Some(e) = &obs.error {
        inner.status.error(name, e.clone(), planned.facts.at);
    }
    let demand = planned.plan.demand.clone();
    inner.with_slot(name, |s| {
        s.memory = memory;
        s.demand = demand;
    });
    // Nothing was done: the next input (or the rescan) plans the node again.
    Ok((Seen::Observed(obs, planned.facts.at), DONE))
}

/// The CiliumNode lists an ENI the EC2 cache does not have on its instance, or an address or
/// prefix (in `status.eni.enis` or the pool) that the cache's copy of the ENI lacks: the
/// serving allocator changed EC2 since our last describe of the instance.
fn names_unknown<E: Ec2, S: NodeSink>(inner: &Shared<E, S>, node: &crate::crd::CiliumNode) -> bool {
    let cache = inner.cache.read().expect("cache");
    let view = cache.view(&node.spec.instance_id, &node.spec.eni.instance_type);
    let crate::ipam::InstanceView::Known { enis, .. } = view.instance else {
        return false;
    };
    let lacks = |eni: &str, addr: &str| -> bool {
        let Some(e) = enis.iter().find(|e| e.id == eni) else {
            return true;
        };
        if let Ok(ip) = addr.parse::<std::net::Ipv4Addr>() {
            return ip != e.primary_ip
                && !e.secondary_ips.contains(&ip)
                && !e.prefixes.iter().any(|p| p.contains(&ip));
        }
        addr.parse::<ipnet::Ipv4Net>()
            .is_ok_and(|net| !e.prefixes.contains(&net))
    };
    let in_status = node.status.as_ref().is_some_and(|s| {
        s.eni.enis.iter().any(|(id, entry)| {
            !enis.iter().any(|e| &e.id == id)
                || entry.addresses.iter().any(|a| lacks(id, a))
                || entry.prefixes.iter().any(|p| lacks(id, p))
        })
    });
    in_status
        || node
            .spec
            .ipam
            .pool
            .iter()
            .any(|(ip, a)| !a.resource.is_empty() && lacks(&a.resource, ip))
}
