//! Figures kept for Cilium operator's ENI IPAM families that have a real counterpart here;
//! `--metrics-compat=cilium` exposes them under Cilium's names (`metrics_compat::source`).
//! Names, label names and buckets follow github.com/cilium/cilium
//! `operator/pkg/ipam/metrics/metrics.go` (commit 09b89c6c9e2548486913ac5dfce38c0bcabdd6e6).

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

type Labels = Vec<(&'static str, String)>;
type Histograms = Family<Labels, Histogram, fn() -> Histogram>;

/// `type` label values of the allocation and release histograms, as Cilium's
/// `pkg/ipam/node.go` names them (commit 0013798761eec0dda0217042f6ee3ccfa857f7ff, the
/// constants `createInterfaceAndAllocateIP`, `allocateIP`, `releaseIP`).
pub const CREATE_INTERFACE: &str = "createInterfaceAndAllocateIP";
pub const ALLOCATE_IP: &str = "allocateIP";
pub const RELEASE_IP: &str = "releaseIP";

/// Cilium's allocation/release/background-sync buckets: `merge(LinearBuckets(0.25, 0.25, 2),
/// LinearBuckets(1, 1, 60))`, whose `merge` starts from a zero bucket (metrics.go, `merge`).
fn latency_histogram() -> Histogram {
    let buckets = [0.0, 0.25, 0.5].into_iter().chain((1..=60).map(f64::from));
    Histogram::new(buckets)
}

/// Cilium's trigger buckets (metrics.go, `newTriggerDuration`).
fn trigger_histogram() -> Histogram {
    Histogram::new([
        0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0,
        10.0, 15.0, 20.0, 30.0, 45.0, 60.0,
    ])
}

fn status(ok: bool) -> String {
    if ok { "success" } else { "failed" }.to_string()
}

#[derive(Clone, Debug)]
pub struct CiliumFigures {
    /// One EC2 action that adds addresses: `type`, `status`, `subnet_id`.
    pub allocation: Histograms,
    /// One EC2 action that releases addresses.
    pub release: Histograms,
    /// One full EC2 refresh (Cilium's background instances-API resync), by `status`.
    pub background_sync: Histograms,
    /// Successful full refreshes, each followed by a pass over every node (Cilium's
    /// `NodeManager.Resync` runs only after a successful instances-API resync).
    pub resyncs: Counter,
    /// Nodes put on the deficit queue (Cilium's pool-maintainer trigger calls).
    pub deficit_queued: Counter,
    /// One node's pass (Cilium's pool-maintainer run).
    pub deficit_duration: Histogram,
}

impl Default for CiliumFigures {
    fn default() -> Self {
        Self {
            allocation: Family::new_with_constructor(latency_histogram),
            release: Family::new_with_constructor(latency_histogram),
            background_sync: Family::new_with_constructor(latency_histogram),
            resyncs: Counter::default(),
            deficit_queued: Counter::default(),
            deficit_duration: trigger_histogram(),
        }
    }
}

impl CiliumFigures {
    /// Register under our prefix (`eni_operator_ipam_*`).
    pub fn register(&self, r: &mut Registry) {
        r.register(
            "ipam_allocation_duration_seconds",
            "Duration of one EC2 action adding addresses (type, status, subnet_id as Cilium)",
            self.allocation.clone(),
        );
        r.register(
            "ipam_release_duration_seconds",
            "Duration of one EC2 action releasing addresses",
            self.release.clone(),
        );
        r.register(
            "ipam_background_sync_duration_seconds",
            "Duration of one full EC2 refresh, by status",
            self.background_sync.clone(),
        );
        r.register(
            "ipam_resync",
            "Successful full EC2 refreshes, each followed by a pass over every node",
            self.resyncs.clone(),
        );
        r.register(
            "ipam_deficit_resolver_queued",
            "Nodes put on the deficit queue",
            self.deficit_queued.clone(),
        );
        r.register(
            "ipam_deficit_resolver_duration_seconds",
            "Duration of one node's pass",
            self.deficit_duration.clone(),
        );
    }

    /// One EC2 action of `kind` (one of the `type` constants) on `subnet_id`.
    pub fn action(&self, kind: &'static str, ok: bool, subnet_id: &str, seconds: f64) {
        let labels = vec![
            ("type", kind.to_string()),
            ("status", status(ok)),
            ("subnet_id", subnet_id.to_string()),
        ];
        let family = if kind == RELEASE_IP {
            &self.release
        } else {
            &self.allocation
        };
        family.get_or_create(&labels).observe(seconds);
    }

    pub fn background_sync(&self, ok: bool, seconds: f64) {
        self.background_sync
            .get_or_create(&vec![("status", status(ok))])
            .observe(seconds);
        if ok {
            self.resyncs.inc();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_ciliums() {
        let mut r = Registry::with_prefix("eni_operator");
        let f = CiliumFigures::default();
        f.register(&mut r);
        f.action(CREATE_INTERFACE, true, "subnet-1", 0.3);
        f.action(RELEASE_IP, false, "subnet-1", 61.0);
        f.background_sync(true, 1.5);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &r).unwrap();
        // The value of the one sample named `name` whose labels include all of `labels`.
        let value = |name: &str, labels: &[&str]| -> f64 {
            let hits: Vec<&str> = text
                .lines()
                .filter(|l| l.split(['{', ' ']).next() == Some(name))
                .filter(|l| labels.iter().all(|x| l.contains(x)))
                .collect();
            assert_eq!(hits.len(), 1, "{name} {labels:?} in\n{text}");
            hits[0].rsplit(' ').next().unwrap().parse().unwrap()
        };
        let bucket = "eni_operator_ipam_allocation_duration_seconds_bucket";
        // 63 buckets and +Inf; 0.3 s falls in le=0.5, not in le=0.25.
        assert_eq!(text.lines().filter(|l| l.starts_with(bucket)).count(), 64);
        let created =
            r#"type="createInterfaceAndAllocateIP",status="success",subnet_id="subnet-1""#;
        assert_eq!(value(bucket, &[created, r#"le="0.5""#]), 1.0);
        assert_eq!(value(bucket, &[created, r#"le="0.25""#]), 0.0);
        assert_eq!(value(bucket, &[created, r#"le="0.0""#]), 0.0);
        let failed = r#"type="releaseIP",status="failed",subnet_id="subnet-1""#;
        assert_eq!(
            value(
                "eni_operator_ipam_release_duration_seconds_count",
                &[failed]
            ),
            1.0
        );
        assert_eq!(
            value(
                "eni_operator_ipam_background_sync_duration_seconds_count",
                &[r#"status="success""#]
            ),
            1.0
        );
        assert_eq!(value("eni_operator_ipam_resync_total", &[]), 1.0);
    }
}
