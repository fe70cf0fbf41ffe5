//! The runtime's Prometheus metrics (namespace `eni_operator`).

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

type Labels = Vec<(&'static str, String)>;

/// Handles to every runtime metric; cheap to clone.
#[derive(Clone, Debug)]
pub struct RuntimeMetrics {
    pub leader: Gauge,
    pub queue_depth: Gauge,
    /// `state` = ok / in-deficit / error / deleting.
    pub nodes: Family<Labels, Gauge>,
    pub ips_available: Gauge,
    pub ips_used: Gauge,
    pub ips_needed: Gauge,
    pub enis_managed: Gauge,
    /// Seconds from the first pass that saw a deficit to the first pass that saw none.
    pub demand_latency: Histogram,
    /// `reason` = a `ProblemReason` or an EC2 error code.
    pub errors: Family<Labels, Counter>,
    pub passes: Counter,
    /// Planning decisions (`plan_node` calls) and the thread time they took, in nanoseconds:
    /// the benchmark's CPU-per-decision figure. Not exported.
    pub plans: Counter,
    pub plan_nanos: Counter,
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
            enis_managed: Gauge::default(),
            demand_latency: Histogram::new([
                0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0,
            ]),
            errors: Family::default(),
            passes: Counter::default(),
            plans: Counter::default(),
            plan_nanos: Counter::default(),
        }
    }
}

impl RuntimeMetrics {
    /// Create the metrics and register them in `registry` (which carries the `eni_operator`
    /// prefix).
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        let r = registry;
        r.register("leader", "1 while this replica leads", m.leader.clone());
        r.register(
            "queue_depth",
            "Nodes waiting for a worker",
            m.queue_depth.clone(),
        );
        r.register("nodes", "Managed nodes by state", m.nodes.clone());
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
            "enis_managed",
            "ENIs of managed instances",
            m.enis_managed.clone(),
        );
        r.register(
            "demand_met_seconds",
            "Time from demand seen to demand met",
            m.demand_latency.clone(),
        );
        r.register("errors", "Node errors by reason", m.errors.clone());
        r.register("passes", "Maintenance passes", m.passes.clone());
        m
    }

    pub fn error(&self, reason: &str) {
        self.errors
            .get_or_create(&vec![("reason", reason.to_string())])
            .inc();
    }
}
