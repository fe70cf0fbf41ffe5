//! `node-reregister` (issue 29 item 6): a kubelet restart with a lost registration. The Node is
//! deleted while its instance runs (the garbage collector then deletes the CiliumNode, which
//! our finalizer holds for `--node-gone-grace-period`), then registered again under its name
//! with a new UID; the agent re-creates its CiliumNode and retries while the old one is still
//! there (AlreadyExists). The old object must let go within seconds, and the node is served
//! again with the ENIs and addresses it had: no new ENI, no address change.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use kube::api::{DeleteParams, PostParams};
use testkit::agent::Generation;

use super::Suite;
use crate::checks::{self, NodeVariant};

/// Seconds the old CiliumNode may hold the agent's create back (it used to hold it for the
/// whole grace period, ten minutes by default).
const LET_GO_BOUND: f64 = 15.0;

/// Seconds from the Node's return until the node is served again: a few, with room for CI. It
/// used to be 32.4 s: the instance, forgotten with the old CiliumNode, stayed unknown until a
/// listing started `DESCRIBE_LAG` (30 s) after our last change to it.
const SERVED_BOUND: f64 = 10.0;

impl Suite {
    pub(super) async fn node_reregister(&mut self) -> Result<()> {
        let a = self.one_served_node(14).await?;
        let (name, inst) = (self.nodes[a].name.clone(), self.nodes[a].instance.clone());
        let before = self.addresses_of(&inst.id).await?;
        ensure!(!before.is_empty(), "no ENI of ours on {}", inst.id);

        // The Node goes, the instance runs on; the GC deletes the CiliumNode, our finalizer
        // holds it (the instance still runs: its ENIs are kept for the grace period).
        self.nodes[a].agent.as_ref().unwrap().stop();
        self.k8s_nodes()
            .delete(&name, &DeleteParams::background())
            .await?;
        let deadline = Instant::now() + self.cfg.timeout;
        loop {
            let cn = self.cns().get_opt(&name).await?;
            match cn {
                Some(cn) if cn.metadata.deletion_timestamp.is_some() => break,
                None => bail!("the CiliumNode went at once: our finalizer did not hold it"),
                Some(_) => {}
            }
            ensure!(
                Instant::now() < deadline,
                "the CiliumNode was never deleted"
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }

        // The kubelet registers the Node again (a new object, a new UID) and the agent
        // creates its CiliumNode, retrying while the old one is still there.
        let node = self.register_node(&name, &inst).await?;
        let back = Instant::now();
        let fresh = checks::cilium_node_object(&node, &inst, &self.world, &NodeVariant::default());
        loop {
            match self.cns().create(&PostParams::default(), &fresh).await {
                Ok(_) => break,
                Err(kube::Error::Api(e)) if e.code == 409 => {}
                Err(e) => return Err(e).context("the agent's create"),
            }
            ensure!(
                back.elapsed().as_secs_f64() < 4.0 * LET_GO_BOUND,
                "the old CiliumNode still blocks the agent's create"
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        let let_go = back.elapsed().as_secs_f64();
        self.start_agent(a, Generation::Classic, 14);
        self.wait_served(&[a], self.cfg.timeout).await?;
        let served = back.elapsed().as_secs_f64();
        tracing::info!(
            let_go,
            served,
            "node registered again: the agent's create went through, then the node was served \
             (seconds after the Node came back)"
        );
        let after = self.addresses_of(&inst.id).await?;
        ensure!(
            after == before,
            "the node's ENIs or addresses changed: {before:?} -> {after:?}"
        );
        ensure!(
            let_go < LET_GO_BOUND,
            "the old CiliumNode held the agent's create back for {let_go:.1} s"
        );
        ensure!(
            served <= SERVED_BOUND,
            "served {served:.1} s after the Node came back (bound {SERVED_BOUND} s)"
        );
        Ok(())
    }

    /// Our ENIs for `instance` and the addresses and prefixes EC2 has on each.
    async fn addresses_of(&self, instance: &str) -> Result<BTreeMap<String, BTreeSet<String>>> {
        Ok(self
            .enis_for(instance)
            .await?
            .into_iter()
            .map(|e| {
                let held = e.addresses.into_iter().chain(e.prefixes).collect();
                (e.id, held)
            })
            .collect())
    }
}
