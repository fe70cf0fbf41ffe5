//! Node-name reuse (issue 24 item 8): a Node object is deleted and a new one registered under
//! the same name at once (a kubelet re-registers; AWS names Nodes by private IP, and IPs are
//! reused). The Node watch delivers the old object's Delete, and the new object's Added only a
//! few seconds later (kube's watcher delivers in order; a watch that lags shows the Delete
//! while the API server already has the new Node). The operator must confirm with a live GET
//! before it deletes the name's CiliumNode: the check `a present Node keeps its CiliumNode`
//! (crate::guard) catches a deletion on the watch event alone (mutant `delete-on-watch`).
//!
//! Not modelled: Kubernetes' garbage collector. Cilium's agent sets an ownerReference from its
//! CiliumNode to the Node (with the Node's uid), so on a real cluster the collector may delete
//! that CiliumNode once the old uid is gone and the agent writes a new one; the simulated
//! agents set no ownerReference, so what is checked here is the operator's own deletions.
//!
//! Its choices come from a stream of its own (as crate::api's), so adding it moves no other
//! part of a seed's schedule.

use kube::runtime::watcher::Event;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::world::{KARPENTER, Phase, World};

/// Per mille per simulated second, while the faults last.
const P_RECREATE: u32 = 2;

pub struct Reuse {
    rng: StdRng,
    /// New Nodes whose Added the watch delivers at this second.
    adds: Vec<(u64, String)>,
}

impl Reuse {
    pub fn new(seed: u64) -> Self {
        Self {
            rng: StdRng::seed_from_u64(seed ^ 0x2e05_e000_0000_0003),
            adds: Vec::new(),
        }
    }
}

impl Reuse {
    /// Whether the Added of a re-created Node of this name is still to be delivered.
    pub fn pending(&self, name: &str) -> bool {
        self.adds.iter().any(|(_, a)| a == name)
    }
}

/// The seed's Node re-creations of one second (faults phase only).
pub fn events(w: &mut World, t: u64) {
    if w.reuse.rng.random_range(0..1000) >= P_RECREATE {
        return;
    }
    let names: Vec<String> = w
        .nodes
        .iter()
        .filter(|(name, n)| n.phase == Phase::Live && !w.reuse.adds.iter().any(|(_, a)| a == *name))
        .map(|(k, _)| k.clone())
        .collect();
    if names.is_empty() {
        return;
    }
    let name = names[w.reuse.rng.random_range(0..names.len())].clone();
    let after = w.reuse.rng.random_range(1..=8);
    // The old object goes (its finalizers first, or it would only be marked), the new one is
    // there at once; the watch tells the Delete now and the Added later.
    w.sink.remove_node_finalizer(&name, KARPENTER);
    let gone = w.sink.delete_node(&name);
    let n = &w.nodes[&name];
    w.put_node(&name, n.zone, &n.instance_id);
    if let Some(ev) = gone {
        w.node_event(ev);
    }
    w.reuse.adds.push((t + after, name.clone()));
    w.log(
        t,
        format!(
            "{name}: Node deleted and registered again; the watch shows the new one at t={}s",
            t + after
        ),
    );
}

/// Deliver the Added of re-created Nodes that are due (also after the faults stop).
pub fn tick(w: &mut World, t: u64) {
    let due: Vec<String> = w
        .reuse
        .adds
        .iter()
        .filter(|(at, _)| *at <= t)
        .map(|(_, n)| n.clone())
        .collect();
    if due.is_empty() {
        return;
    }
    w.reuse.adds.retain(|(at, _)| *at > t);
    for name in due {
        let Some(node) = w.sink.node(&name) else {
            continue;
        };
        w.node_event(Event::Apply(node));
        w.log(t, format!("{name}: the Node watch shows the new Node"));
    }
}
