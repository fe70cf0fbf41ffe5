//! How the event loop takes one [`NodeInput`]: what the Nodes say goes to the identity table
//! (§15), the rest to the node slots ([`crate::reconcile::nodes::accept`], pure), and the loop queues,
//! dequeues or makes a node wait for its instance's describe as the slots ask. A node whose Node
//! has no providerID first waits for the lookup of its InternalIP's instance
//! ([`super::owners`]).

use crate::ec2::Ec2;

use crate::event_loop::state::Loop;
use crate::k8s::input::NodeInput;
use crate::k8s::sink::NodeSink;
use crate::reconcile::nodes;
use crate::reconcile::shared::Shared;
use crate::reconcile::status::WaitReason;

pub(super) fn accept<E: Ec2, S: NodeSink>(inner: &Shared<E, S>, input: NodeInput, l: &mut Loop) {
    // What the Nodes say (§15) goes to the identity table; a CiliumNode waiting for its
    // Node is planned again as soon as the Node speaks.
    match &input {
        NodeInput::NodeFacts { name, facts } => {
            let changed = inner.nodes.lock().expect("nodes").set(name, facts.clone());
            let held = inner.slots.lock().expect("slots").contains_key(name);
            if changed && held {
                reconsider(inner, l, name);
                ask_owners(inner, l, name);
            }
            return;
        }
        NodeInput::CiliumNodesListed => {
            l.first.cilium_nodes_listed();
            return;
        }
        NodeInput::NodesListed => {
            inner.nodes.lock().expect("nodes").set_listed();
            inner.requeue_all(&mut l.queue);
            return;
        }
        _ => {}
    }
    if let (Some(book), NodeInput::Deleted(name)) = (&inner.shadow, &input) {
        book.forget(name);
    }
    let upserted = match &input {
        NodeInput::Upsert(node) => node.metadata.name.clone(),
        _ => None,
    };
    let a = nodes::accept(&inner.slots, input, &inner.cache, |name, instance| {
        admitted(inner, name, instance)
    });
    if let Some(name) = a.dequeue {
        inner.status.forget(&name);
        l.queue.remove(&name);
    }
    if let Some(instance) = a.forget {
        inner.forget_instance(&instance);
    }
    if let Some((instance, name)) = a.wait {
        wait(inner, l, instance, &name);
    }
    if let Some((name, p)) = a.queue {
        if a.unwait {
            l.queue.wake(name, p);
        } else {
            l.queue.push(name, p);
        }
    }
    if let Some(name) = upserted {
        ask_owners(inner, l, &name);
    }
}

/// What a node's Node (or EC2's answer about its InternalIP) says changed: a CiliumNode refused
/// so far may be admitted now (its instance is managed and described), and any wait a refusal
/// set ends (the reason may be gone).
pub(super) fn reconsider<E: Ec2, S: NodeSink>(inner: &Shared<E, S>, l: &mut Loop, name: &str) {
    if !inner.slots.lock().expect("slots").contains_key(name) {
        return;
    }
    let p = inner.priority(name);
    let instance = inner.instance_of(name).filter(|i| admitted(inner, name, i));
    match instance {
        Some(i) if nodes::enroll(&inner.cache, &i, p) => wait(inner, l, i, name),
        _ => l.queue.wake(name.to_string(), p),
    }
}

/// Look up the instance behind the InternalIPs of `name`'s Node when it has no providerID and
/// no answer (or an old one refuting the claim) is at hand: the claim is judged by that answer.
pub(super) fn ask_owners<E: Ec2, S: NodeSink>(inner: &Shared<E, S>, l: &mut Loop, name: &str) {
    let Some(instance) = inner.instance_of(name) else {
        return;
    };
    let due = {
        let nodes = inner.nodes.lock().expect("nodes");
        nodes.lookups_due(name, &instance, crate::clock::now())
    };
    for ip in due {
        l.owners.wait(ip, name.to_string());
    }
}

/// Whether the instance a CiliumNode names may be described and managed before a pass judges
/// the node (§15): only when its Node confirms it (its providerID, or EC2's owner of its
/// InternalIP).
pub(super) fn admitted<E: Ec2, S: NodeSink>(
    inner: &Shared<E, S>,
    name: &str,
    instance: &str,
) -> bool {
    let nodes = inner.nodes.lock().expect("nodes");
    nodes.may_describe(name, instance, inner.config.require_node)
}

/// The node is queued once its instance is described.
fn wait<E: Ec2, S: NodeSink>(inner: &Shared<E, S>, l: &mut Loop, instance: String, name: &str) {
    let why = format!("instance {instance} is not in the EC2 view yet; described next");
    inner
        .status
        .waits_now(name, WaitReason::InstanceNotListed, why);
    l.schedule.wait(instance, name.to_string());
}
