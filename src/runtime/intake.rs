//! How the event loop takes one [`NodeInput`]: what the Nodes say goes to the identity table
//! (§15), the rest to the node slots ([`super::nodes::accept`], pure), and the loop queues,
//! dequeues or makes a node wait for its instance's describe as the slots ask.

use crate::ec2::Ec2;

use super::event_loop::Loop;
use super::nodes::{self, NodeInput};
use super::shared::Shared;
use super::sink::NodeSink;
use super::status::WaitReason;

pub(super) fn accept<E: Ec2, S: NodeSink>(inner: &Shared<E, S>, input: NodeInput, l: &mut Loop) {
    // What the Nodes say (§15) goes to the identity table; a CiliumNode waiting for its
    // Node is planned again as soon as the Node speaks.
    match &input {
        NodeInput::NodeFacts { name, facts } => {
            let changed = inner.nodes.lock().expect("nodes").set(name, facts.clone());
            let held = inner.slots.lock().expect("slots").contains_key(name);
            if changed && held {
                // Out of any wait the refusal set: the reason may be gone.
                l.queue.wake(name.clone(), inner.priority(name));
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
    let a = nodes::accept(&inner.slots, input, &inner.cache);
    if let Some(name) = a.dequeue {
        inner.status.forget(&name);
        l.queue.remove(&name);
    }
    if let Some(instance) = a.forget {
        inner.forget_instance(&instance);
    }
    if let Some((instance, name)) = a.wait {
        let why = format!("instance {instance} is not in the EC2 view yet; described next");
        inner
            .status
            .waits_now(&name, WaitReason::InstanceNotListed, why);
        l.schedule.wait(instance, name);
    }
    if let Some((name, p)) = a.queue {
        if a.unwait {
            l.queue.wake(name, p);
        } else {
            l.queue.push(name, p);
        }
    }
}
