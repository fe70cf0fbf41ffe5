//! The API server's side of the world, beyond what `MemorySink` stores: write faults (409
//! Conflict, 5xx) and watches that end and relist, delivered to every running operator
//! instance the way the runtime's watches (`k8s::source`) would deliver them.
//!
//! Watches, as kube's `watcher` has them: when a watch ends with an error (the API server
//! restarts, a 410 Gone because the resourceVersion is too old), the watcher backs off and
//! lists again: `Init`, an `InitApply` per object that exists *now*, `InitDone`. Whatever
//! happened while it was away is never delivered as such: an object deleted meanwhile only
//! shows as an absence from the listing. The source turns `InitApply` into the same inputs as
//! `Apply` (`to_input`, `node_input`) and hands the listing to [`Listed`], which reports the
//! names the listing no longer has.
//!
//! Every choice here comes from a stream of its own, seeded from the run's seed, so adding this
//! model does not move the rest of the run's schedule.

use std::collections::BTreeMap;

use eni_operator::event_loop::core::NodeInput;
use eni_operator::k8s::source::{Listed, node_inputs, to_input};
use kube::api::DynamicObject;
use kube::runtime::watcher::Event;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use testkit::sink::WriteFault;
use tokio::sync::mpsc;

use crate::leadership::SimCore;
use crate::world::World;

/// Per mille per simulated second, while the faults last.
const P_WRITE_FAULT: u32 = 15;
const P_WATCH_RESTART: u32 = 4;

/// One of the two watches the operator runs on the API server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Watch {
    Nodes,
    CiliumNodes,
}

impl Watch {
    /// The watch an input comes through.
    fn of(input: &NodeInput) -> Option<Self> {
        match input {
            NodeInput::NodePresent { .. }
            | NodeInput::NodeFacts { .. }
            | NodeInput::NodesListed => Some(Self::Nodes),
            NodeInput::Upsert(_)
            | NodeInput::Invalid(_)
            | NodeInput::Deleted(_)
            | NodeInput::CiliumNodesListed => Some(Self::CiliumNodes),
            NodeInput::PendingPods { .. } => None,
        }
    }
}

/// One operator instance's two watches: where they deliver and what each has delivered.
struct Watcher {
    tx: mpsc::Sender<NodeInput>,
    nodes: Listed,
    cilium_nodes: Listed,
    /// The core they deliver to (for [`check`]) and the newest resourceVersion of each
    /// CiliumNode delivered to it (`MemorySink` numbers versions in order; the operator may
    /// not rely on that, the harness may).
    core: Option<SimCore>,
    delivered: BTreeMap<String, u64>,
}

impl Watcher {
    fn listed(&mut self, watch: Watch) -> &mut Listed {
        match watch {
            Watch::Nodes => &mut self.nodes,
            Watch::CiliumNodes => &mut self.cilium_nodes,
        }
    }

    /// Deliver as the watch would, noting the name the way the source does.
    fn deliver(&mut self, input: NodeInput) {
        match &input {
            NodeInput::NodePresent { name, present } => {
                if *present {
                    self.nodes.seen(name);
                } else {
                    self.nodes.deleted(name);
                }
            }
            NodeInput::Upsert(n) => {
                let name = n.metadata.name.clone().unwrap_or_default();
                let version = n.metadata.resource_version.as_deref().unwrap_or_default();
                if let Ok(v) = version.parse::<u64>() {
                    let newest = self.delivered.entry(name.clone()).or_default();
                    *newest = (*newest).max(v);
                }
                self.cilium_nodes.seen(&name);
            }
            NodeInput::Invalid(i) => self.cilium_nodes.seen(&i.node.name),
            NodeInput::Deleted(name) => {
                self.delivered.remove(name);
                self.cilium_nodes.deleted(name);
            }
            NodeInput::PendingPods { .. }
            | NodeInput::NodeFacts { .. }
            | NodeInput::NodesListed
            | NodeInput::CiliumNodesListed => {}
        }
        // A closed channel is an instance that stopped (crash, lost lease): its watches went
        // with it.
        match self.tx.try_send(input) {
            Ok(()) | Err(mpsc::error::TrySendError::Closed(_)) => {}
            Err(mpsc::error::TrySendError::Full(_)) => {
                panic!("the core keeps up with its input channel")
            }
        }
    }

    /// A complete listing of one watch: `Init`, the objects, `InitDone`.
    fn relist(&mut self, watch: Watch, listing: &[NodeInput]) {
        self.listed(watch).init();
        for input in listing {
            self.deliver(input.clone());
        }
        for name in self.listed(watch).init_done() {
            let gone = match watch {
                Watch::Nodes => {
                    self.deliver(NodeInput::NodeFacts {
                        name: name.clone(),
                        facts: None,
                    });
                    NodeInput::NodePresent {
                        name,
                        present: false,
                    }
                }
                Watch::CiliumNodes => NodeInput::Deleted(name),
            };
            self.deliver(gone);
        }
        // As `k8s::source` at `InitDone`: a name the Node listing did not show has no
        // Node (§15); the CiliumNodes present at the start are in (the first EC2 listing).
        self.deliver(match watch {
            Watch::Nodes => NodeInput::NodesListed,
            Watch::CiliumNodes => NodeInput::CiliumNodesListed,
        });
    }
}

pub struct ApiServer {
    rng: StdRng,
    watchers: Vec<Watcher>,
    /// A watch that ended, and the simulated second its watcher lists again.
    down: Vec<(Watch, u64)>,
}

impl ApiServer {
    pub fn new(seed: u64) -> Self {
        Self {
            rng: StdRng::seed_from_u64(seed ^ 0x0a91_5e4e_0000_0001),
            watchers: Vec::new(),
            down: Vec::new(),
        }
    }

    /// Deliver a change to every running instance whose watch of it is up; a watch that is
    /// down misses it (its relist tells the outcome).
    pub fn deliver(&mut self, input: NodeInput) {
        self.watchers.retain(|w| !w.tx.is_closed());
        // Pending pods come through the Pod watch, which this model keeps up.
        if let Some(watch) = Watch::of(&input)
            && self.down.iter().any(|(w, _)| *w == watch)
        {
            return;
        }
        for w in &mut self.watchers {
            w.deliver(input.clone());
        }
    }

    /// A new operator instance starts its watches: each lists first.
    pub fn connect(&mut self, tx: mpsc::Sender<NodeInput>, listing: &Listing) {
        self.connect_core(None, tx, listing);
    }

    /// As [`Self::connect`], for `core` (whose copies [`check`] compares with what it was
    /// delivered).
    pub fn connect_core(
        &mut self,
        core: Option<SimCore>,
        tx: mpsc::Sender<NodeInput>,
        listing: &Listing,
    ) {
        let mut w = Watcher {
            tx,
            nodes: Listed::default(),
            cilium_nodes: Listed::default(),
            core,
            delivered: BTreeMap::new(),
        };
        w.relist(Watch::Nodes, &listing.nodes);
        w.relist(Watch::CiliumNodes, &listing.cilium_nodes);
        self.watchers.push(w);
    }

    fn relist(&mut self, watch: Watch, listing: &Listing) {
        let items = match watch {
            Watch::Nodes => &listing.nodes,
            Watch::CiliumNodes => &listing.cilium_nodes,
        };
        self.watchers.retain(|w| !w.tx.is_closed());
        for w in &mut self.watchers {
            w.relist(watch, items);
        }
    }
}

/// What a listing of each watch returns now.
pub struct Listing {
    nodes: Vec<NodeInput>,
    cilium_nodes: Vec<NodeInput>,
}

/// The API server's objects as a list call returns them, turned into inputs as the source
/// turns `InitApply`s: a Node says what instance it is on and is present (draining or not,
/// `node_inputs`), a CiliumNode goes through `to_input` from its stored JSON (so one that does
/// not parse is `Invalid`). Every object the API server has, also those of no simulated node
/// (crate::identity's forged CiliumNodes, the old Node of a node registered under a new name).
pub fn listing(w: &World) -> Listing {
    let nodes = w
        .sink
        .node_names()
        .iter()
        .filter_map(|name| w.sink.node(name))
        .flat_map(|node| node_inputs(Event::InitApply(node)))
        .collect();
    let cilium_nodes = w
        .sink
        .names()
        .iter()
        .filter_map(|name| w.sink.raw(name))
        .filter_map(|raw| serde_json::from_value::<DynamicObject>(raw).ok())
        .map(|obj| to_input(&obj))
        .collect();
    Listing {
        nodes,
        cilium_nodes,
    }
}

/// The seed's API server events of one second (faults phase only).
pub fn events(w: &mut World, t: u64) {
    let api = &mut w.api;
    if api.rng.random_range(0..1000) < P_WRITE_FAULT {
        let (fault, what) = match api.rng.random_range(0..3) {
            0 => (WriteFault::Conflict, "409 conflict"),
            1 => (WriteFault::Unavailable, "5xx before commit"),
            _ => (WriteFault::CommittedButFailed, "5xx after commit"),
        };
        let times = api.rng.random_range(1..=3);
        w.sink.inject_write_fault(fault, times);
        w.log(t, format!("api {what} x{times} on the operator's writes"));
    }
    let api = &mut w.api;
    if api.rng.random_range(0..1000) < P_WATCH_RESTART {
        // An API server restart ends both watches; a 410 Gone or a dropped connection one.
        let which: &[Watch] = match api.rng.random_range(0..3) {
            0 => &[Watch::Nodes],
            1 => &[Watch::CiliumNodes],
            _ => &[Watch::Nodes, Watch::CiliumNodes],
        };
        // kube's default backoff plus the list call: a second to half a minute.
        let back = t + api.rng.random_range(1..=30);
        let mut ended = Vec::new();
        for watch in which {
            if !api.down.iter().any(|(w, _)| w == watch) {
                api.down.push((*watch, back));
                ended.push(*watch);
            }
        }
        if !ended.is_empty() {
            w.log(t, format!("api watches {ended:?} end; relist at t={back}s"));
        }
    }
}

/// No agent update lost (§12.1): a running core's copy of a CiliumNode is never older than the
/// newest version its watch delivered (a pass's write answer stored over an agent's update
/// delivered meanwhile would be, and the watch never delivers that update again). Copies
/// marked for deletion are the finalizer's own (it stores the object it deleted).
pub fn check(w: &World) -> Result<(), crate::check::Broken> {
    for watcher in &w.api.watchers {
        let Some(core) = watcher.core.as_ref().filter(|_| !watcher.tx.is_closed()) else {
            continue;
        };
        // Inputs still queued: the core has not taken in what was delivered (a frozen
        // replica's loop is not polled, crate::leadership::Freeze).
        if watcher.tx.capacity() != watcher.tx.max_capacity() {
            continue;
        }
        for (name, newest) in &watcher.delivered {
            let Some((version, false)) = core.stored_version(name) else {
                continue;
            };
            let held = version.parse::<u64>().unwrap_or(0);
            if held < *newest {
                return Err((
                    "no agent update lost",
                    format!(
                        "{name}: the operator plans with version {held}, its watch delivered \
                         {newest}"
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// Watches whose backoff is over list again (also after the faults stop).
pub fn tick(w: &mut World, t: u64) {
    let due: Vec<Watch> = w
        .api
        .down
        .iter()
        .filter(|(_, at)| *at <= t)
        .map(|(watch, _)| *watch)
        .collect();
    if due.is_empty() {
        return;
    }
    w.api.down.retain(|(_, at)| *at > t);
    let listing = listing(w);
    for watch in &due {
        w.api.relist(*watch, &listing);
    }
    w.log(t, format!("api watches {due:?} relisted"));
}

#[cfg(test)]
mod tests {
    use super::*;
    use eni_operator::crd::CiliumNode;

    fn upsert(name: &str) -> NodeInput {
        let mut n = CiliumNode::new(name, Default::default());
        n.spec.instance_id = "i-1".into();
        NodeInput::Upsert(Box::new(n))
    }

    fn drain(rx: &mut mpsc::Receiver<NodeInput>) -> Vec<String> {
        let mut out = Vec::new();
        while let Ok(i) = rx.try_recv() {
            out.push(match i {
                NodeInput::Upsert(n) => format!("upsert {}", n.metadata.name.unwrap_or_default()),
                NodeInput::Deleted(n) => format!("deleted {n}"),
                NodeInput::NodePresent { name, present } => format!("node {name} {present}"),
                other => format!("{other:?}"),
            });
        }
        out
    }

    #[test]
    fn a_watch_that_was_away_misses_changes_and_its_relist_tells_what_went() {
        let mut api = ApiServer::new(1);
        let (tx, mut rx) = mpsc::channel(64);
        let listing = Listing {
            nodes: vec![NodeInput::NodePresent {
                name: "n1".into(),
                present: true,
            }],
            cilium_nodes: vec![upsert("n1"), upsert("n2")],
        };
        api.connect(tx, &listing);
        assert_eq!(
            drain(&mut rx),
            [
                "node n1 true",
                "NodesListed",
                "upsert n1",
                "upsert n2",
                "CiliumNodesListed"
            ]
        );
        api.down.push((Watch::CiliumNodes, 10));
        api.deliver(NodeInput::Deleted("n2".into()));
        api.deliver(upsert("n3"));
        api.deliver(NodeInput::NodePresent {
            name: "n3".into(),
            present: true,
        });
        assert_eq!(
            drain(&mut rx),
            ["node n3 true"],
            "only the Node watch is up"
        );
        api.down.clear();
        let now = Listing {
            nodes: Vec::new(),
            cilium_nodes: vec![upsert("n1"), upsert("n3")],
        };
        api.relist(Watch::CiliumNodes, &now);
        assert_eq!(
            drain(&mut rx),
            ["upsert n1", "upsert n3", "deleted n2", "CiliumNodesListed"]
        );
    }
}
