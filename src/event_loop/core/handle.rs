//! What the process around the core tells it (Cilium's Lease and release, for the handover
//! guard) and reads of it (status, shadow book, warmth, heartbeat, a node's figures).

use std::sync::Arc;

use crate::ec2::Ec2;
use crate::ipam::Demand;
use crate::k8s::sink::NodeSink;
use crate::reconcile::shadow::ShadowBook;

use super::Core;

/// Sizes of what the core keeps per object agents write (CiliumNodes, the instances and
/// types they name): each shrinks back when its objects go.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tracked {
    pub slots: usize,
    pub managed_instances: usize,
    pub confirmed_instances: usize,
    pub refresh_spacing: usize,
    pub type_lookups: usize,
}

impl<E: Ec2, S: NodeSink> Core<E, S> {
    /// What it keeps per agent-written object, counted.
    pub fn tracked(&self) -> Tracked {
        let i = &self.inner;
        Tracked {
            slots: i.slots.lock().expect("slots").len(),
            managed_instances: i.cache.read().expect("cache").managed_count(),
            confirmed_instances: i.confirmed_instances.lock().expect("confirmed").len(),
            refresh_spacing: i.refresher.spaced(),
            type_lookups: i.type_lookups.tracked(),
        }
    }

    /// Cilium operator's leader Lease as last read (the handover guard); `None`: absent.
    pub fn set_cilium_lease(&self, lease: Option<crate::ipam::handover::LeaseView>) {
        use crate::ipam::handover::CiliumLease;
        self.set_cilium_lease_state(lease.map_or(CiliumLease::Absent, CiliumLease::Held));
    }

    /// The guard's view of Cilium operator's Lease, an unreadable one included (§16).
    pub fn set_cilium_lease_state(&self, lease: crate::ipam::handover::CiliumLease) {
        let unreadable = matches!(lease, crate::ipam::handover::CiliumLease::Unreadable(_));
        self.inner
            .metrics
            .cilium_lease_unreadable
            .set(i64::from(unreadable));
        *self.inner.cilium_lease.write().expect("lease") = lease;
        self.update_ignore_gauge();
    }

    /// Cilium operator's release as the handover guard knows it.
    pub fn set_cilium_version(&self, version: crate::ipam::cilium_version::CiliumVersion) {
        *self.inner.cilium_version.write().expect("cilium version") = version;
        self.update_ignore_gauge();
    }

    /// `eni_operator_cilium_ignore_unsupported`: 1 while Cilium's operator runs (its Lease is
    /// fresh) and cannot be relied on to honour `ipam.cilium.io/ignore`, i.e. while the guard
    /// takes no node over for that reason; a cluster without Cilium stays at 0.
    fn update_ignore_gauge(&self) {
        let running = self
            .inner
            .cilium_lease
            .read()
            .expect("lease")
            .view()
            .is_some_and(|l| l.fresh(self.inner.wall_now()));
        let unsupported = self
            .inner
            .cilium_version
            .read()
            .expect("cilium version")
            .ignore_unsupported()
            .is_some();
        self.inner
            .metrics
            .cilium_ignore_unsupported
            .set(i64::from(running && unsupported));
    }

    /// Wall time by the core's clock (paused in tests).
    pub fn wall_now(&self) -> k8s_openapi::jiff::Timestamp {
        self.inner.wall_now()
    }

    /// The shadow's comparison, if this is a shadow core.
    pub fn shadow_book(&self) -> Option<Arc<ShadowBook>> {
        self.inner.shadow.clone()
    }

    /// Per-node status (`/debug/nodes`).
    pub fn status_book(&self) -> Arc<crate::reconcile::status::StatusBook> {
        self.inner.status.clone()
    }

    /// Becomes true once [`Core::run`] has rebuilt its EC2 view and starts serving nodes.
    pub fn warm(&self) -> tokio::sync::watch::Receiver<bool> {
        self.inner.warm.subscribe()
    }

    /// When the event loop last turned: it turns at least every `instance_refresh_spacing`
    /// (its confirmation tick), so an older beat means the loop is stuck.
    pub fn last_beat(&self) -> std::time::Instant {
        *self.inner.beat.lock().expect("beat")
    }

    /// When the last successful full EC2 refresh started.
    pub fn last_full_refresh(&self) -> Option<std::time::Instant> {
        self.inner.cache.read().expect("cache").last_full_refresh
    }

    /// The last demand figures of a node.
    pub fn demand(&self, name: &str) -> Option<Demand> {
        let slots = self.inner.slots.lock().expect("slots");
        slots.get(name).map(|s| s.demand.clone())
    }

    /// The resourceVersion of the copy of a node the core plans with, and whether it is
    /// marked for deletion (for the simulation's "no agent update lost" check, §12.1).
    pub fn stored_version(&self, name: &str) -> Option<(String, bool)> {
        let slots = self.inner.slots.lock().expect("slots");
        let stored = slots.get(name)?.node.as_ref()?;
        let version = stored.node().metadata.resource_version.unwrap_or_default();
        Some((version, stored.deleting()))
    }
}
