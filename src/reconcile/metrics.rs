//! The runtime's Prometheus metrics (namespace `eni_operator`).
//!
//! Where Cilium's operator has the same figure, the name and labels mirror its
//! `cilium_operator_ipam_*` families (`target_node`, `subnet_id`, `availability_zone`), so
//! dashboards carry over by swapping the prefix. Per-node and per-subnet series are removed
//! when their node or subnet goes, so the series count stays bounded by what exists.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

type Labels = Vec<(&'static str, String)>;

/// Why an ENI of ours was deleted (`reason` of `enis_deleted_total`).
pub const DELETED_ATTACH_FAILED: &str = "attach-failed";
pub const DELETED_NODE_GONE: &str = "node-deleted";
pub const DELETED_GC: &str = "gc";

/// Handles to every runtime metric; cheap to clone.
#[derive(Clone, Debug)]
pub struct RuntimeMetrics {
    pub leader: Gauge,
    pub queue_depth: Gauge,
    /// `state` = ok / in-deficit / at-capacity / error.
    pub nodes: Family<Labels, Gauge>,
    pub ips_available: Gauge,
    pub ips_used: Gauge,
    pub ips_needed: Gauge,
    /// Cilium's interface figures, summed over the served nodes.
    pub interface_candidates: Gauge,
    pub empty_interface_slots: Gauge,
    /// Per node (`target_node`), as Cilium's `ipam_{available,used,needed}_ips`.
    pub node_available: Family<Labels, Gauge>,
    pub node_used: Family<Labels, Gauge>,
    pub node_needed: Family<Labels, Gauge>,
    /// Free addresses per subnet (`subnet_id`, `availability_zone`), from the EC2 cache.
    pub subnet_available: Family<Labels, Gauge>,
    pub enis_managed: Gauge,
    /// ENIs created, per subnet (Cilium's `ipam_interface_creation_ops`).
    pub interface_creations: Family<Labels, Counter>,
    pub enis_attached: Counter,
    /// `reason` = attach-failed / node-deleted / gc.
    pub enis_deleted: Family<Labels, Counter>,
    /// Assign / unassign calls that succeeded, per subnet (Cilium's `ipam_{allocation,release}_ops`).
    pub allocation_ops: Family<Labels, Counter>,
    pub release_ops: Family<Labels, Counter>,
    /// Addresses (a /28 prefix counts 16) allocated and released, per subnet.
    pub ips_allocated: Family<Labels, Counter>,
    pub ips_released: Family<Labels, Counter>,
    /// ENI GC runs by `outcome` (success / error), and ENIs it found unattached this run
    /// (deleted next run if still so).
    pub gc_runs: Family<Labels, Counter>,
    pub gc_enis_marked: Gauge,
    /// Seconds from the first pass that saw a deficit to the first pass that saw none.
    pub demand_latency: Histogram,
    /// `reason` = a `ProblemReason` or an EC2 error code.
    pub errors: Family<Labels, Counter>,
    pub passes: Counter,
    /// Passes ended by the handover guard: another allocator serves the node.
    pub other_allocator_blocked: Counter,
    /// 1 while Cilium operator's Lease cannot be read (nodes not handed over yet wait, §16).
    pub cilium_lease_unreadable: Gauge,
    /// 1 while Cilium's operator runs and cannot be relied on to honour
    /// `ipam.cilium.io/ignore` (its CRD schema label names a release before 1.18, or none can
    /// be read): no node is taken over.
    pub cilium_ignore_unsupported: Gauge,
    /// Finalizers removed after failing for the grace period (their ENIs left to the GC).
    pub finalizers_let_go: Counter,
    /// Planning decisions (`plan_node` calls) and the thread time they took, in nanoseconds:
    /// the benchmark's CPU-per-decision figure. Not exported.
    pub plans: Counter,
    pub plan_nanos: Counter,
    /// Nodes waiting, by `reason` (`reconcile::status::WaitReason`).
    pub nodes_waiting: Family<Labels, Gauge>,
    /// Label values of the per-node and per-subnet series now exported (to remove stale ones).
    published_nodes: Arc<Mutex<BTreeSet<String>>>,
    /// The figures behind Cilium's families that have a counterpart here.
    pub cilium: crate::reconcile::metrics_cilium::CiliumFigures,
    published_subnets: Arc<Mutex<BTreeSet<(String, String)>>>,
}

impl Default for RuntimeMetrics {
    fn default() -> Self {
        Self {
            leader: Gauge::default(),
            queue_depth: Gauge::default(),
            nodes: Family::default(),
            ips_available: Gauge::default(),
            ips_used: Gauge::default(),
            ips_needed: Gauge::default(),
            interface_candidates: Gauge::default(),
            empty_interface_slots: Gauge::default(),
            node_available: Family::default(),
            node_used: Family::default(),
            node_needed: Family::default(),
            subnet_available: Family::default(),
            enis_managed: Gauge::default(),
            interface_creations: Family::default(),
            enis_attached: Counter::default(),
            enis_deleted: Family::default(),
            allocation_ops: Family::default(),
            release_ops: Family::default(),
            ips_allocated: Family::default(),
            ips_released: Family::default(),
            gc_runs: Family::default(),
            gc_enis_marked: Gauge::default(),
            demand_latency: Histogram::new([
                0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0,
            ]),
            errors: Family::default(),
            passes: Counter::default(),
            other_allocator_blocked: Counter::default(),
            cilium_lease_unreadable: Gauge::default(),
            cilium_ignore_unsupported: Gauge::default(),
            finalizers_let_go: Counter::default(),
            plans: Counter::default(),
            plan_nanos: Counter::default(),
            nodes_waiting: Family::default(),
            published_nodes: Arc::default(),
            published_subnets: Arc::default(),
            cilium: Default::default(),
        }
    }
}

fn subnet(id: &str) -> Labels {
    vec![("subnet_id", id.to_string())]
}

fn node(name: &str) -> Labels {
    vec![("target_node", name.to_string())]
}

impl RuntimeMetrics {
    /// Create the metrics and register them in `registry` (which carries the `eni_operator`
    /// prefix). prometheus-client appends `_total` to counters.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        m.register_node_figures(registry);
        m.register_ec2_figures(registry);
        m.cilium.register(registry);
        m
    }

    /// Leadership, queue, and the address figures of nodes and subnets.
    fn register_node_figures(&self, r: &mut Registry) {
        let m = self;
        r.register("leader", "1 while this replica leads", m.leader.clone());
        r.register(
            "queue_depth",
            "Nodes waiting for a worker",
            m.queue_depth.clone(),
        );
        r.register("nodes", "Managed nodes by state", m.nodes.clone());
        r.register(
            "nodes_waiting",
            "Nodes waiting, by reason (eni-operator status says why and until when)",
            m.nodes_waiting.clone(),
        );
        r.register(
            "ips_available",
            "Addresses in all pools",
            m.ips_available.clone(),
        );
        r.register("ips_used", "Addresses in use", m.ips_used.clone());
        r.register(
            "ips_needed",
            "Addresses still to allocate",
            m.ips_needed.clone(),
        );
        r.register(
            "ipam_interface_candidates",
            "Attached ENIs usable for pods with room for another address (Cilium's figure)",
            m.interface_candidates.clone(),
        );
        r.register(
            "ipam_empty_interface_slots",
            "Interfaces the nodes' instances can still attach (Cilium's figure)",
            m.empty_interface_slots.clone(),
        );
        r.register(
            "ipam_available_ips",
            "Addresses in the node's pool",
            m.node_available.clone(),
        );
        r.register(
            "ipam_used_ips",
            "Addresses of the node in use by pods",
            m.node_used.clone(),
        );
        r.register(
            "ipam_needed_ips",
            "Addresses the node still needs",
            m.node_needed.clone(),
        );
        r.register(
            "ipam_available_ips_per_subnet",
            "Free addresses in the subnet (EC2's AvailableIpAddressCount)",
            m.subnet_available.clone(),
        );
    }

    /// ENIs, EC2 operations, GC, latency, errors and passes.
    fn register_ec2_figures(&self, r: &mut Registry) {
        let m = self;
        r.register(
            "enis_managed",
            "ENIs of managed instances",
            m.enis_managed.clone(),
        );
        r.register(
            "ipam_interface_creation_ops",
            "ENIs created, by subnet",
            m.interface_creations.clone(),
        );
        r.register(
            "enis_attached",
            "ENIs attached to instances",
            m.enis_attached.clone(),
        );
        r.register(
            "enis_deleted",
            "ENIs of ours deleted, by reason",
            m.enis_deleted.clone(),
        );
        r.register(
            "ipam_allocation_ops",
            "Successful address assignments (AssignPrivateIpAddresses or creation with addresses), by subnet",
            m.allocation_ops.clone(),
        );
        r.register(
            "ipam_release_ops",
            "Successful address releases (UnassignPrivateIpAddresses), by subnet",
            m.release_ops.clone(),
        );
        r.register(
            "ipam_ips_allocated",
            "Addresses allocated (a /28 prefix counts 16), by subnet",
            m.ips_allocated.clone(),
        );
        r.register(
            "ipam_ips_released",
            "Addresses released (a /28 prefix counts 16), by subnet",
            m.ips_released.clone(),
        );
        r.register("gc_runs", "ENI GC runs by outcome", m.gc_runs.clone());
        r.register(
            "gc_enis_marked",
            "Leaked ENIs the last GC run found; deleted next run if still unattached",
            m.gc_enis_marked.clone(),
        );
        r.register(
            "demand_met_seconds",
            "Time from demand seen to demand met",
            m.demand_latency.clone(),
        );
        r.register("errors", "Node errors by reason", m.errors.clone());
        r.register("passes", "Maintenance passes", m.passes.clone());
        r.register(
            "handover_blocked_passes",
            "Passes that left a node alone because another allocator serves it",
            m.other_allocator_blocked.clone(),
        );
        r.register(
            "cilium_lease_unreadable",
            "1 while Cilium operator's Lease cannot be read: nodes not handed over yet wait",
            m.cilium_lease_unreadable.clone(),
        );
        r.register(
            "cilium_ignore_unsupported",
            "1 while Cilium's operator runs and is older than ipam.cilium.io/ignore or its release cannot be told: no node is taken over",
            m.cilium_ignore_unsupported.clone(),
        );
        r.register(
            "finalizers_let_go",
            "Finalizers removed after failing for --node-gone-grace-period (ENIs left to the GC)",
            m.finalizers_let_go.clone(),
        );
    }

    pub fn error(&self, reason: &str) {
        self.errors
            .get_or_create(&vec![("reason", reason.to_string())])
            .inc();
    }

    /// An ENI was created in `subnet_id` with `addresses` addresses (0: none inline).
    pub fn eni_created(&self, subnet_id: &str, addresses: u32) {
        self.interface_creations
            .get_or_create(&subnet(subnet_id))
            .inc();
        if addresses > 0 {
            self.allocated(subnet_id, addresses);
        }
    }

    pub fn eni_deleted(&self, reason: &'static str, n: u64) {
        if n > 0 {
            self.enis_deleted
                .get_or_create(&vec![("reason", reason.to_string())])
                .inc_by(n);
        }
    }

    pub fn allocated(&self, subnet_id: &str, addresses: u32) {
        self.allocation_ops.get_or_create(&subnet(subnet_id)).inc();
        self.ips_allocated
            .get_or_create(&subnet(subnet_id))
            .inc_by(u64::from(addresses));
    }

    pub fn released(&self, subnet_id: &str, addresses: u32) {
        self.release_ops.get_or_create(&subnet(subnet_id)).inc();
        self.ips_released
            .get_or_create(&subnet(subnet_id))
            .inc_by(u64::from(addresses));
    }

    pub fn gc_run(&self, ok: bool, marked: usize) {
        let outcome = if ok { "success" } else { "error" };
        self.gc_runs
            .get_or_create(&vec![("outcome", outcome.to_string())])
            .inc();
        if ok {
            self.gc_enis_marked.set(marked as i64);
        }
    }

    /// Set the per-node gauges of exactly these nodes: (name, available, used, needed).
    /// Series of nodes not listed (gone, or let go) are removed.
    pub fn publish_nodes<'a>(&self, nodes: impl IntoIterator<Item = (&'a str, i64, i64, i64)>) {
        let mut now = BTreeSet::new();
        for (name, available, used, needed) in nodes {
            let labels = node(name);
            self.node_available.get_or_create(&labels).set(available);
            self.node_used.get_or_create(&labels).set(used);
            self.node_needed.get_or_create(&labels).set(needed.max(0));
            now.insert(name.to_string());
        }
        let mut published = self.published_nodes.lock().expect("published nodes");
        for gone in published.difference(&now) {
            let labels = node(gone);
            self.node_available.remove(&labels);
            self.node_used.remove(&labels);
            self.node_needed.remove(&labels);
        }
        *published = now;
    }

    /// Set the per-subnet gauge of exactly these subnets: (id, availability zone, free).
    pub fn publish_subnets<'a>(&self, subnets: impl IntoIterator<Item = (&'a str, &'a str, u32)>) {
        let labels = |id: &str, az: &str| {
            vec![
                ("subnet_id", id.to_string()),
                ("availability_zone", az.to_string()),
            ]
        };
        let mut now = BTreeSet::new();
        for (id, az, free) in subnets {
            self.subnet_available
                .get_or_create(&labels(id, az))
                .set(i64::from(free));
            now.insert((id.to_string(), az.to_string()));
        }
        let mut published = self.published_subnets.lock().expect("published subnets");
        for (id, az) in published.difference(&now) {
            self.subnet_available.remove(&labels(id, az));
        }
        *published = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(m: &RuntimeMetrics) -> String {
        // Family clones share their series.
        let mut registry = Registry::with_prefix("eni_operator");
        registry.register("ipam_available_ips", "", m.node_available.clone());
        registry.register("ipam_needed_ips", "", m.node_needed.clone());
        registry.register(
            "ipam_available_ips_per_subnet",
            "",
            m.subnet_available.clone(),
        );
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
        out
    }

    #[test]
    fn per_node_and_per_subnet_series_go_with_their_node_or_subnet() {
        let m = RuntimeMetrics::default();
        m.publish_nodes([("a", 10, 4, -2), ("b", 0, 0, 8)]);
        m.publish_subnets([("subnet-1", "zone-a", 100), ("subnet-2", "zone-b", 7)]);
        let t = text(&m);
        for line in [
            "eni_operator_ipam_available_ips{target_node=\"a\"} 10",
            "eni_operator_ipam_needed_ips{target_node=\"a\"} 0",
            "eni_operator_ipam_needed_ips{target_node=\"b\"} 8",
            "eni_operator_ipam_available_ips_per_subnet{subnet_id=\"subnet-2\",availability_zone=\"zone-b\"} 7",
        ] {
            assert!(t.contains(line), "{line} not in {t}");
        }

        m.publish_nodes([("b", 8, 0, 0)]);
        m.publish_subnets([("subnet-1", "zone-a", 90)]);
        let t = text(&m);
        assert!(!t.contains("target_node=\"a\""), "{t}");
        assert!(
            t.contains("eni_operator_ipam_available_ips{target_node=\"b\"} 8"),
            "{t}"
        );
        assert!(!t.contains("subnet-2"), "{t}");
        assert!(
            t.contains("subnet_id=\"subnet-1\",availability_zone=\"zone-a\"} 90"),
            "{t}"
        );
    }
}
