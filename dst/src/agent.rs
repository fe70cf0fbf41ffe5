//! A classic Cilium agent (`ipam: eni`, pkg/ipam/crd.go): pods hold pool addresses, reported in
//! `status.ipam.used`; release proposals (`status.ipam.release-ips`) are answered against the
//! pods running at that moment: testkit's model (`step_pods`, also the benchmark's), with the
//! seed choosing which pod stops.

use std::collections::BTreeSet;

use eni_operator::crd::CiliumNode;
use rand::Rng;
use rand::rngs::StdRng;
use testkit::agent::step_pods;

#[derive(Debug, Default)]
pub struct Agent {
    /// Addresses held by running pods.
    pub pods: BTreeSet<String>,
    /// Pods the node should run (the demand).
    pub target: usize,
}

impl Agent {
    /// One look at the node: answer release proposals, stop extra pods, start missing ones on
    /// free pool addresses not being released. `None` when nothing changed (no write).
    pub fn step(&mut self, node: &CiliumNode, rng: &mut StdRng) -> Option<CiliumNode> {
        let mut node = node.clone();
        let before = node.status.clone();
        // Which pod stops is the seed's choice.
        step_pods(&mut self.pods, self.target, &mut node, |n| {
            rng.random_range(0..n)
        });
        (node.status != before).then_some(node)
    }
}
