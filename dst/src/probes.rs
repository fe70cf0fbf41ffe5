//! What the checks see inside each operator process, beyond the state after each second: a
//! pass unassigns and writes within one second, and a refused object's instance can enter the
//! managed set and leave it again in between.
//!
//! * **The unassign, at the moment it is made** ([`Withdrawal`], a layer right at the
//!   simulator): no address a multi-pool node's published `status.eni.enis` lists is
//!   unassigned (docs/rules.md §7.4: the CIDR leaves the status first and is unassigned only
//!   once the status has not listed it for 30 s; the agent takes addresses from what the status
//!   lists). Planted defect `unassign-before-withdraw`.
//! * **The instances a call names** (`Simulator::times_named`): never one only refused objects
//!   name (a stranger, the peered VPC's instance, a bystander an agent's rewritten
//!   `spec.instance-id` names, even while a pass for that node's real instance ends): not
//!   described, not attached to (issue 40 N2). Planted defect `manage-refused-instance`.
//! * **What each process manages** (its EC2 cache): never such an instance, never a VPC other
//!   than the cluster's, so the full listing and the ENI GC stay in the cluster's VPC (N2).

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex, RwLock, Weak};

use eni_operator::cache::Ec2Cache;
use eni_operator::crd::CiliumNode;
use eni_operator::ec2::layer::{Call, Layer, MakeCall};
use eni_operator::ec2::{Operation, Result};
use eni_operator::ipam::demand::{Generation, generation};
use testkit::sim::Simulator;
use testkit::sink::MemorySink;

use crate::check::{Broken, holds};
use crate::world::World;

/// Shared by the world and every operator process it starts.
#[derive(Clone, Default)]
pub struct Probes {
    broken: Arc<Mutex<Vec<Broken>>>,
    caches: Arc<Mutex<Vec<Weak<RwLock<Ec2Cache>>>>>,
    /// Each process's gate rates (crate::tenant_spell).
    pub gates: crate::tenant_spell::Gates,
}

impl Probes {
    /// A process's cache, looked at every second while the process lives.
    pub fn watch_cache(&self, cache: &Arc<RwLock<Ec2Cache>>) {
        let mut caches = self.caches.lock().expect("caches");
        caches.retain(|c| c.strong_count() > 0);
        caches.push(Arc::downgrade(cache));
    }

    fn broke(&self, invariant: &'static str, detail: String) {
        self.broken
            .lock()
            .expect("broken")
            .push((invariant, detail));
    }
}

/// The simulator behind a layer that checks each unassign against the published status.
pub struct Withdrawal {
    pub sink: Arc<MemorySink>,
    pub sim: Simulator,
    pub probes: Probes,
}

/// (node, ENI, address) a multi-pool node's status lists and EC2 holds, right now.
fn listed(sink: &MemorySink, sim: &Simulator) -> Vec<(String, String, Ipv4Addr)> {
    let listed_by = |n: &CiliumNode| -> Vec<(String, Ipv4Addr)> {
        if n.metadata.deletion_timestamp.is_some() || generation(n) != Generation::MultiPool {
            return Vec::new();
        }
        let Some(status) = &n.status else {
            return Vec::new();
        };
        status
            .eni
            .enis
            .iter()
            .flat_map(|(eni, s)| s.addresses.iter().map(move |a| (eni, a)))
            .filter_map(|(eni, a)| Some((eni.clone(), a.parse().ok()?)))
            .collect()
    };
    let enis = sim.network_interfaces();
    sink.names()
        .into_iter()
        .filter_map(|name| sink.get(&name).map(|n| (name, n)))
        .flat_map(|(name, n)| {
            listed_by(&n)
                .into_iter()
                .map(move |(eni, ip)| (name.clone(), eni, ip))
        })
        .filter(|(_, eni, ip)| enis.iter().any(|e| &e.id == eni && holds(e, *ip)))
        .collect()
}

impl Layer for Withdrawal {
    async fn around<'a, T: Send + 'a>(
        &'a self,
        call: Call,
        send: &'a MakeCall<'a, T>,
    ) -> Result<T> {
        if call.operation != Operation::UnassignPrivateIpAddresses {
            return send().await;
        }
        let before = listed(&self.sink, &self.sim);
        let result = send().await;
        // Only this call can take an address off these ENIs meanwhile: a node's passes never
        // run twice at once, and another node's CIDR left its status 30 s before its unassign.
        let enis = self.sim.network_interfaces();
        for (node, eni, ip) in before {
            if let Some(e) = enis.iter().find(|e| e.id == eni)
                && !holds(e, ip)
            {
                self.probes.broke(
                    "no address unassigned while the status lists it (multi-pool, §7.4)",
                    format!("{ip} unassigned from {eni} while {node}'s status.eni.enis listed it"),
                );
            }
        }
        result
    }
}

/// Checked after every simulated second.
pub fn check(w: &World) -> Result<(), Broken> {
    if let Some(b) = w.probes.broken.lock().expect("broken").first() {
        return Err(b.clone());
    }
    let refused: BTreeSet<&String> = w.identity.strangers().chain(w.forgery.not_ours()).collect();
    // Every instance only refused objects name, a bystander too (an ENI of ours on it is no
    // reason to name it in a call: the listing shows that ENI, and a finalizer gives back only
    // the instance confirmed for its object); less the harness's own attach that set it up.
    let setup = w.forgery.bystanders_named_at_setup();
    let named = w
        .identity
        .strangers()
        .chain(w.forgery.peered_instance())
        .map(|i| (i, 0))
        .chain(setup);
    for (i, before) in named {
        let calls = w.sim.times_named(i).saturating_sub(before);
        if calls > 0 {
            return Err((
                "no EC2 call names an instance no Node confirmed",
                format!("{calls} calls named {i}, which only refused CiliumNodes name"),
            ));
        }
    }
    let caches = w.probes.caches.lock().expect("caches");
    for cache in caches.iter().filter_map(Weak::upgrade) {
        let cache = cache.read().expect("cache");
        if let Some(i) = refused.iter().find(|i| cache.manages(i)) {
            return Err((
                "nothing of a refused object reaches the cache or the GC",
                format!("{i}, named only by refused CiliumNodes, is managed"),
            ));
        }
        let vpcs = cache.managed_vpcs();
        if vpcs.iter().any(|v| *v != w.vpc) {
            return Err((
                "nothing of a refused object reaches the cache or the GC",
                format!("the managed VPCs {vpcs:?} leave the cluster's {}", w.vpc),
            ));
        }
    }
    Ok(())
}
