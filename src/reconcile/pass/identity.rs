//! Part of step 2: is the instance this CiliumNode names its Node's, and named by no other
//! live CiliumNode (docs/rules.md §15)? Otherwise the pass ends before any EC2 call or write
//! of ours but the report: `operator-status` and a Warning Event (`NoNode`,
//! `InstanceMismatch`, `InstanceNamedTwice`, counted in `eni_operator_errors_total`).

use std::net::Ipv4Addr;
use std::time::Duration;

use tracing::debug;

use crate::crd::CiliumNode;
use crate::ec2::Ec2;
use crate::ipam::ProblemReason;
use crate::k8s::sink::NodeSink;
use crate::reconcile::identity::{self, Verdict};
use crate::reconcile::queue::Outcome;
use crate::reconcile::shared::Shared;
use crate::reconcile::status::WaitReason;

use super::Step;

/// How soon a node whose Node is not known yet is looked at again (its Node's arrival queues it
/// at once besides).
const UNKNOWN_RETRY: Duration = Duration::from_secs(5);
/// How soon a refused node is looked at again (a Node's change, or the rival's deletion, is the
/// usual end; this is the backstop).
const REFUSED_RETRY: Duration = Duration::from_secs(30);

/// Why the node is not served now.
pub(super) enum Refusal {
    /// Not known yet: wait, say nothing.
    Unknown,
    /// Say this on the node.
    Say(ProblemReason, String),
}

/// The instance's primary private address as EC2 lists it: its primary ENI's, card 0 device 0
/// (on an instance with several network cards another card's device 0 may be an EFA).
fn primary_ip<E: Ec2, S: NodeSink>(inner: &Shared<E, S>, instance: &str) -> Option<Ipv4Addr> {
    let cache = inner.cache.read().expect("cache");
    let entry = cache.instance(instance)?;
    entry
        .enis
        .iter()
        .find(|e| e.is_primary())
        .map(|e| e.primary_ip)
}

fn verdict<E: Ec2, S: NodeSink>(inner: &Shared<E, S>, name: &str, instance: &str) -> Verdict {
    let ip = primary_ip(inner, instance);
    let verdict = {
        let nodes = inner.nodes.lock().expect("nodes");
        nodes.verdict(name, instance, ip, inner.config.require_node)
    };
    // A live GET found a Node the watch has not shown yet (one registered again under the
    // name, `node_gone_now`): its facts are on their way.
    let found = inner.with_slot(name, |s| s.k8s_node) == Some(Some(true));
    match verdict {
        Verdict::NoNode if found => Verdict::Unknown,
        v => v,
    }
}

/// The other live CiliumNodes naming `instance` that their own Nodes do not refute.
pub(super) fn rivals<E: Ec2, S: NodeSink>(
    inner: &Shared<E, S>,
    name: &str,
    instance: &str,
) -> Vec<String> {
    let candidates: Vec<String> = {
        let slots = inner.slots.lock().expect("slots");
        identity::rivals(&slots, name, instance, |_| false)
    };
    candidates
        .into_iter()
        .filter(|other| {
            !matches!(
                verdict(inner, other, instance),
                Verdict::NoNode | Verdict::Mismatch(_)
            )
        })
        .collect()
}

/// `None`: serve the node.
pub(super) fn judge<E: Ec2, S: NodeSink>(
    inner: &Shared<E, S>,
    name: &str,
    instance: &str,
) -> Option<Refusal> {
    if instance.is_empty() {
        // The plan reports MissingInstanceId; nothing is called for it.
        return None;
    }
    match verdict(inner, name, instance) {
        Verdict::Confirmed => {}
        Verdict::Unknown => return Some(Refusal::Unknown),
        Verdict::NoNode => {
            return Some(Refusal::Say(
                ProblemReason::NoNode,
                format!(
                    "no Node named {name}: a CiliumNode is served only beside its Node, whose \
                     providerID names {instance}; no EC2 call for it"
                ),
            ));
        }
        Verdict::Mismatch(why) => {
            return Some(Refusal::Say(
                ProblemReason::InstanceMismatch,
                format!(
                    "spec.instance-id {instance} is not this node's instance ({why}); no EC2 \
                     call for it"
                ),
            ));
        }
    }
    let rivals = rivals(inner, name, instance);
    (!rivals.is_empty()).then(|| {
        Refusal::Say(
            ProblemReason::InstanceNamedTwice,
            format!(
                "{instance} is also named by CiliumNode {}: served through neither until one \
                 CiliumNode names it (a Node re-registered under another name? delete the stale \
                 Node or CiliumNode)",
                rivals.join(", ")
            ),
        )
    })
}

pub(super) async fn check<E: Ec2, S: NodeSink>(
    inner: &Shared<E, S>,
    name: &str,
    node: &CiliumNode,
) -> Step<()> {
    match judge(inner, name, &node.spec.instance_id) {
        None => Ok(()),
        Some(Refusal::Unknown) => {
            debug!(node = name, "waiting for the Node to confirm its instance");
            let why = format!(
                "no Node named {name} seen yet to confirm {}; served once it is",
                node.spec.instance_id
            );
            let retry = crate::clock::now() + UNKNOWN_RETRY;
            let reason = WaitReason::NodeNotSeen;
            inner.status.wait(name, reason, why, Some(retry));
            Err((Outcome::RetryAfter(UNKNOWN_RETRY), None))
        }
        Some(Refusal::Say(reason, message)) => {
            if reason == ProblemReason::InstanceNamedTwice {
                tracing::error!(node = name, "{message}");
            }
            super::problem::say(inner, name, node, reason, &message).await;
            Err((Outcome::RetryAfter(REFUSED_RETRY), None))
        }
    }
}
