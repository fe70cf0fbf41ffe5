//! What the event loop and the passes share ([`Shared`]): the clients, the EC2 cache, the node
//! slots, the metrics. The slots are changed by the loop on input ([`crate::reconcile::nodes::accept`])
//! and by a node's own pass; the cache by the executor and the refresher.

use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

use tracing::{debug, warn};

use crate::ec2::Ec2;

use crate::cache::Ec2Cache;
use crate::cache::refresher::Refresher;
use crate::reconcile::events;
use crate::reconcile::executor::Executor;
use crate::reconcile::metrics::RuntimeMetrics;
use crate::reconcile::nodes::{self, Slots};
use crate::reconcile::queue::{DeficitQueue, Priority};
use crate::reconcile::settings::CoreConfig;

pub struct Shared<E, S> {
    pub ec2: Arc<E>,
    pub sink: Arc<S>,
    pub cache: Arc<RwLock<Ec2Cache>>,
    pub refresher: Refresher<E>,
    pub executor: Executor<E>,
    pub config: CoreConfig,
    pub slots: Mutex<Slots>,
    /// What each Node says about its instance (§15).
    pub nodes: Mutex<crate::reconcile::identity::Nodes>,
    /// Instances EC2 showed with this cluster's tag (§15).
    pub confirmed_instances: Mutex<std::collections::BTreeSet<String>>,
    /// Lookups of instance types' limits, one per type at a time (passes wait for it).
    pub type_lookups: crate::cache::type_limits::TypeLookups,
    pub metrics: RuntimeMetrics,
    /// True while `run` has warm caches (after the first full EC2 refresh).
    pub warm: tokio::sync::watch::Sender<bool>,
    /// When `run`'s loop last turned (the liveness probe's heartbeat, `http::LeaderVitals`).
    pub beat: Mutex<Instant>,
    /// Cilium operator's leader Lease as last read (the handover guard). `Absent` until told
    /// otherwise: `main` starts it `Unreadable` when it reads the Lease (§16); a core driven
    /// by tests or the benchmark has no Cilium operator.
    pub cilium_lease: RwLock<crate::ipam::handover::CiliumLease>,
    /// Cilium operator's release as the guard knows it (the CRD's schema label).
    pub cilium_version: RwLock<crate::ipam::cilium_version::CiliumVersion>,
    /// Wall time at a clock instant: the guard compares managedFields and Lease times with
    /// the core's clock (paused in tests).
    pub epoch: (k8s_openapi::jiff::Timestamp, Instant),
    /// Set only by `Core::shadow` (read-only sink and EC2 client): passes compare, never act.
    pub shadow: Option<Arc<crate::reconcile::shadow::ShadowBook>>,
    /// Per-node status (`/debug/nodes`): what each node waits for, its last action and error.
    pub status: Arc<crate::reconcile::status::StatusBook>,
}

impl<E: Ec2, S> Shared<E, S> {
    pub fn new(
        ec2: Arc<E>,
        sink: Arc<S>,
        mut config: CoreConfig,
        metrics: RuntimeMetrics,
        cache: Arc<RwLock<Ec2Cache>>,
    ) -> Self {
        // Each process (core) its own: token generations restart at 0 with it.
        config.ipam.token_nonce = crate::jitter::nonce(config.jitter_seed);
        // The cache decides which unattached ENIs are ours by the cluster name.
        debug_assert_eq!(
            cache.read().expect("cache").cluster,
            config.ipam.cluster_name,
            "the EC2 cache comes from CoreConfig::ec2_cache"
        );
        let refresher = Refresher::new(
            ec2.clone(),
            cache.clone(),
            config.scope.clone(),
            config.instance_refresh_spacing,
        );
        let executor = Executor::new(ec2.clone(), cache.clone()).with_metrics(metrics.clone());
        let epoch = config
            .wall_epoch
            .unwrap_or_else(|| (k8s_openapi::jiff::Timestamp::now(), crate::clock::now()));
        let status =
            crate::reconcile::status::StatusBook::new(metrics.nodes_waiting.clone(), epoch);
        Self {
            ec2,
            sink,
            cache,
            refresher,
            executor,
            config,
            slots: Mutex::new(Slots::new()),
            nodes: Mutex::new(crate::reconcile::identity::Nodes::default()),
            confirmed_instances: Mutex::default(),
            type_lookups: Default::default(),
            metrics,
            warm: tokio::sync::watch::Sender::new(false),
            beat: Mutex::new(crate::clock::now()),
            cilium_lease: RwLock::new(crate::ipam::handover::CiliumLease::Absent),
            // Set by the runtime when it reads the label (main.rs); a core without a reader
            // (tests, the benchmark) models a Cilium that honours the annotation.
            cilium_version: RwLock::new(crate::ipam::cilium_version::CiliumVersion::Vouched),
            epoch,
            shadow: None,
            status: Arc::new(status),
        }
    }

    /// Wall time by the core's clock.
    pub fn wall_now(&self) -> k8s_openapi::jiff::Timestamp {
        let elapsed = crate::clock::now().saturating_duration_since(self.epoch.1);
        let elapsed = k8s_openapi::jiff::SignedDuration::try_from(elapsed).unwrap_or_default();
        self.epoch.0.saturating_add(elapsed).unwrap_or(self.epoch.0)
    }

    /// The node is gone from our state: its instance too (cache and refresh spacing), unless
    /// another CiliumNode we hold still names it (§15: two objects naming one instance; the
    /// other one's view must not go with this one).
    pub fn forget_instance(&self, instance: &str) {
        let named = {
            let slots = self.slots.lock().expect("slots");
            slots
                .values()
                .any(|s| s.node.as_ref().is_some_and(|n| n.instance_id() == instance))
        };
        if !instance.is_empty() && !named {
            self.cache.write().expect("cache").drop_instance(instance);
            self.refresher.forget(instance);
            // Agents name instances: a confirmation outlives no object naming it (a new one
            // is confirmed again with one describe).
            self.confirmed_instances
                .lock()
                .expect("confirmed")
                .remove(instance);
        }
    }

    /// Describe the instances nodes wait for, then the ones we changed (a confirmation). A
    /// failure is logged; the nodes go on with what the cache holds.
    pub async fn refresh_instances(&self, new: &[String], confirm: &[String]) {
        if !new.is_empty()
            && let Err(e) = self.refresher.instances(new, false).await
        {
            warn!(error = %e, "per-instance refresh failed");
        }
        if !confirm.is_empty()
            && let Err(e) = self.refresher.instances(confirm, true).await
        {
            debug!(error = %e, "confirmation refresh failed");
        }
    }

    /// List everything again. On failure the cache is unhealthy, which blocks mutations.
    pub async fn refresh_full(&self) {
        let start = crate::clock::now();
        let result = self.refresher.full().await;
        let seconds = crate::clock::now()
            .saturating_duration_since(start)
            .as_secs_f64();
        // Cilium's background sync and resync count (`pkg/ipam/node_manager.go`).
        self.metrics.cilium.background_sync(result.is_ok(), seconds);
        if let Err(e) = result {
            warn!(error = %e, "full EC2 refresh failed; mutations blocked");
            events::count_ec2_error(&self.metrics, &e);
        }
    }

    /// Queue every known node at its current severity.
    pub fn requeue_all(&self, queue: &mut DeficitQueue<String>) {
        let slots = self.slots.lock().expect("slots");
        for (name, slot) in slots.iter() {
            queue.push(name.clone(), nodes::priority_of(slot));
        }
    }

    pub fn instance_of(&self, name: &str) -> Option<String> {
        let slots = self.slots.lock().expect("slots");
        let id = slots.get(name)?.node.as_ref()?.instance_id();
        (!id.is_empty()).then(|| id.to_string())
    }

    pub fn priority(&self, name: &str) -> Priority {
        let slots = self.slots.lock().expect("slots");
        slots
            .get(name)
            .map_or(Priority::Routine, nodes::priority_of)
    }

    /// Cluster-wide gauges: address totals, nodes per state, per-node and per-subnet series.
    pub fn publish_totals(&self) {
        let t = nodes::totals(&self.slots.lock().expect("slots"));
        let m = &self.metrics;
        m.ips_available.set(t.available);
        m.ips_used.set(t.used);
        m.ips_needed.set(t.needed);
        m.interface_candidates.set(t.interface_candidates);
        m.empty_interface_slots.set(t.empty_interface_slots);
        m.publish_nodes(
            t.per_node
                .iter()
                .map(|(n, a, u, d)| (n.as_str(), *a, *u, *d)),
        );
        for state in nodes::STATES {
            let n = t.states.get(state).copied().unwrap_or(0);
            m.nodes
                .get_or_create(&vec![("state", state.to_string())])
                .set(n);
        }
        let cache = self.cache.read().expect("cache");
        m.enis_managed.set(cache.totals().0 as i64);
        m.publish_subnets(cache.subnets.values().map(|s| {
            let (id, az) = (s.id.as_str(), s.availability_zone.as_str());
            (id, az, s.available_addresses)
        }));
    }
}
