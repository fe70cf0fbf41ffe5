//! What the per-second checks and the agents read, re-read only when it changed: the EC2
//! snapshot when the simulator's generation moved, a CiliumNode when its resourceVersion
//! moved. Parsing every CiliumNode and copying every ENI each simulated second was most of a
//! seed's CPU time; the checks themselves still run every second over the whole state.

use std::collections::BTreeMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;

use eni_operator::crd::CiliumNode;
use eni_operator::ec2::NetworkInterface;
use testkit::sim::Simulator;
use testkit::sink::MemorySink;

use crate::agent::Agent;

/// What an agent's step read: the CiliumNode's resourceVersion and the agent's own state
/// (target, pods). A step that changed nothing is a fixed point: run again on the same inputs
/// it changes nothing again and draws nothing from the seed (it draws only to stop pods, which
/// changes `status.ipam.used`), so the world skips it until one of these moves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Quiet {
    version: Option<String>,
    target: usize,
    pods: u64,
}

impl Quiet {
    pub fn of(node: &CiliumNode, agent: &Agent) -> Self {
        let mut h = DefaultHasher::new();
        agent.pods.hash(&mut h);
        Self {
            version: node.metadata.resource_version.clone(),
            target: agent.target,
            pods: h.finish(),
        }
    }
}

/// The inputs of [`crate::check::always`], summed up: the simulator's generation, the sink's,
/// and the world's tables the check reads (which nodes run on which instance, the other
/// owners' ENIs). A check that reads anything else must add it here.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Inputs {
    sim: u64,
    sink: u64,
    nodes: Vec<(String, String, bool, u32)>,
    foreign: Vec<(String, bool)>,
    /// The multi-pool agents' addresses in use and what they observed (crate::multipool).
    agents: u64,
}

/// A simulator generation, every ENI then, and AWS's rules checked then.
type Ec2At = (
    u64,
    Arc<BTreeMap<String, NetworkInterface>>,
    Result<(), String>,
);

#[derive(Default)]
pub struct View {
    /// The EC2 snapshot and AWS's own rules, as of a simulator generation.
    ec2: Option<Ec2At>,
    /// Parsed CiliumNodes by name, with the resourceVersion they were parsed at.
    nodes: BTreeMap<String, (String, Option<Arc<CiliumNode>>)>,
    /// The inputs of the last `always` check that passed: the same inputs pass again.
    pub passed: Option<Inputs>,
}

impl View {
    fn ec2_at(&mut self, sim: &Simulator) -> &Ec2At {
        let generation = sim.generation();
        if self.ec2.as_ref().is_none_or(|(g, ..)| *g != generation) {
            let enis = sim
                .network_interfaces()
                .into_iter()
                .map(|e| (e.id.clone(), e))
                .collect();
            self.ec2 = Some((generation, Arc::new(enis), sim.check_invariants()));
        }
        self.ec2.as_ref().expect("just filled")
    }

    /// Every ENI of the account by id.
    pub fn enis(&mut self, sim: &Simulator) -> Arc<BTreeMap<String, NetworkInterface>> {
        self.ec2_at(sim).1.clone()
    }

    /// AWS's own rules over the account (`Simulator::check_invariants`).
    pub fn aws_rules(&mut self, sim: &Simulator) -> Result<(), String> {
        self.ec2_at(sim).2.clone()
    }

    /// The stored CiliumNode `name` (what `MemorySink::get` returns).
    pub fn node(&mut self, sink: &MemorySink, name: &str) -> Option<Arc<CiliumNode>> {
        let Some(version) = sink.resource_version(name) else {
            self.nodes.remove(name);
            return None;
        };
        match self.nodes.get(name) {
            Some((v, parsed)) if *v == version => parsed.clone(),
            _ => {
                let parsed = sink.get(name).map(Arc::new);
                self.nodes
                    .insert(name.to_string(), (version, parsed.clone()));
                parsed
            }
        }
    }

    /// The inputs of the `always` check now.
    pub fn inputs(w: &crate::world::World) -> Inputs {
        Inputs {
            sim: w.sim.generation(),
            sink: w.sink.generation(),
            nodes: w
                .nodes
                .iter()
                .map(|(name, n)| {
                    (
                        name.clone(),
                        n.instance_id.clone(),
                        n.running(),
                        n.limits.max_enis,
                    )
                })
                .collect(),
            foreign: w
                .foreign
                .iter()
                .map(|(id, snap)| (id.clone(), snap.is_some()))
                .collect(),
            agents: {
                let mut h = DefaultHasher::new();
                w.agents.violations.len().hash(&mut h);
                for (name, n) in &w.nodes {
                    if let Some(mp) = &n.multi_pool {
                        name.hash(&mut h);
                        mp.in_use().for_each(|ip| ip.hash(&mut h));
                    }
                }
                h.finish()
            },
        }
    }
}
