//! Facts for the admission: is the instance this CiliumNode names its Node's, and named by no
//! other live CiliumNode (docs/rules.md §15)? Read from the Node watch and the EC2 cache; the
//! decision is [`crate::ipam::admission`]'s.

use std::net::Ipv4Addr;

use crate::ec2::Ec2;
use crate::ipam::admission::Identity;
use crate::k8s::sink::NodeSink;
use crate::reconcile::identity::{self, Verdict};
use crate::reconcile::shared::Shared;

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

/// What the node's Node says of `instance`, and the rivals once it confirms it (the rivals are
/// asked only then: the listing walks every slot).
pub(super) fn read<E: Ec2, S: NodeSink>(
    inner: &Shared<E, S>,
    name: &str,
    instance: &str,
) -> (Identity, Vec<String>) {
    if instance.is_empty() {
        // The plan reports MissingInstanceId; nothing is called for it.
        return (Identity::Confirmed, Vec::new());
    }
    match verdict(inner, name, instance) {
        Verdict::Confirmed => (Identity::Confirmed, rivals(inner, name, instance)),
        Verdict::Unknown => (Identity::Unknown, Vec::new()),
        Verdict::NoNode => (Identity::NoNode, Vec::new()),
        Verdict::Mismatch(why) => (Identity::Mismatch(why), Vec::new()),
    }
}
