//! What makes equal traces mean equal runs: each minute (and at the end) the trace gets a digest
//! of every EC2 call the operator (and the other tool) made since the last one, with its
//! simulated instant and its answer, and a digest of the whole EC2 and CiliumNode state. Two
//! runs of a seed whose traces agree made the same calls at the same instants and reached the
//! same states; where they part, the first differing line names the minute.

use std::hash::{DefaultHasher, Hash, Hasher};

use crate::world::World;

impl World {
    /// Log the digests of the calls since the last one and of the state now.
    pub fn digest(&mut self, t: u64) {
        // DefaultHasher::new() has fixed keys: the same in every process.
        let mut calls = DefaultHasher::new();
        let log = self.sim.take_calls();
        for c in &log {
            c.at.duration_since(self.start).as_nanos().hash(&mut calls);
            c.op.name().hash(&mut calls);
            c.answer.hash(&mut calls);
        }
        let mut state = DefaultHasher::new();
        for e in self.sim.network_interfaces() {
            format!("{e:?}").hash(&mut state);
        }
        let names: Vec<String> = self.nodes.keys().cloned().collect();
        for name in &names {
            let node = self.view.get_mut().node(&self.sink, name);
            format!("{name} {node:?}").hash(&mut state);
        }
        self.log(
            t,
            format!(
                "digest: {} EC2 calls {:016x}, state {:016x}",
                log.len(),
                calls.finish(),
                state.finish()
            ),
        );
    }
}
