//! The in-memory back-end: the operator's real core (queue, workers, cache, executor) behind
//! its EC2 gate, in front of the simulator with AWS's buckets and latencies, and the in-memory
//! API server, as `make bench` runs them (`scenario::World`). Run on a paused tokio clock:
//! rate limits and latencies hold in simulated time.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, Result};
use eni_operator::crd::CiliumNode;
use eni_operator::ec2::Operation;
use serde_json::Value;
use testkit::agent::Step;

use super::drive::{Backend, Outcome, drive};
use super::plan::Plan;
use super::view::View;
use crate::scenario::{GateMode, Settings, World, world_shared};

/// The in-memory world of one run.
pub struct Memory {
    settings: Settings,
    world: World,
}

impl Memory {
    pub fn new(plan: &Plan) -> Self {
        let settings = Settings {
            instance_type: plan.instance_type.into(),
            first_interface_index: plan.first_interface_index,
            release_delay: plan.release_delay,
            node_rescan_interval: plan.rescan,
            ..Settings::default()
        };
        // The operator's default gate (80 % of AWS's rates), release-excess on.
        let world = world_shared(&settings, GateMode::Defaults, false, true, 0.0);
        Self { settings, world }
    }

    /// One chain of call latencies (describe, create, attach, modify): the least time a node
    /// can wait.
    pub fn chain(&self) -> Duration {
        self.settings.describe_latency + 3 * self.settings.mutating_latency
    }
}

/// An agent's merge patch without its `metadata` (the resourceVersion precondition: the
/// driver reads and writes with nothing in between here).
fn without_metadata(mut patch: Value) -> Value {
    if let Some(o) = patch.as_object_mut() {
        o.remove("metadata");
    }
    patch
}

impl Backend for Memory {
    async fn join(&mut self, name: &str) -> Result<()> {
        self.world.join(&self.settings, name, 0);
        Ok(())
    }

    fn latest(&self, name: &str) -> Option<CiliumNode> {
        self.world.sink.get(name)
    }

    async fn write(&mut self, name: &str, step: &Step) -> Result<()> {
        let node = self.world.sink.get(name).context("the node exists")?;
        let mut v = serde_json::to_value(&node)?;
        for patch in [&step.spec_patch, &step.status_patch].into_iter().flatten() {
            json_patch::merge(&mut v, &without_metadata(patch.clone()));
        }
        let node: CiliumNode = serde_json::from_value(v)?;
        let stored = self.world.sink.put(&node);
        self.world.send(stored);
        Ok(())
    }

    async fn ec2(&self) -> Result<BTreeMap<String, (u64, u64)>> {
        let stats = self.world.sim.stats();
        Ok(Operation::ALL
            .iter()
            .map(|op| (*op, stats.get(*op)))
            .filter(|(_, s)| s.calls > 0)
            .map(|(op, s)| (op.name().to_owned(), (s.calls, s.throttled)))
            .collect())
    }

    async fn other_tenant(&mut self, share: f64, empty: bool) -> Result<()> {
        self.world.sim.set_other_tenant_share(share);
        if empty {
            self.world.sim.empty_buckets();
        }
        Ok(())
    }

    async fn pods_waiting(&mut self, name: &str, count: usize) -> Result<()> {
        self.world.pods_waiting(name, count);
        Ok(())
    }
}

/// Run `plan` in memory (call from a paused current-thread runtime). `pace`: real seconds per
/// simulated second (`None`: as fast as the CPU allows).
pub async fn run(plan: &Plan, view: &mut dyn View, pace: Option<f64>) -> Result<Outcome> {
    let mut m = Memory::new(plan);
    let chain = m.chain();
    drive(&mut m, plan, view, pace, chain).await
}
