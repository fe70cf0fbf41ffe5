//! The gate's metrics: Prometheus series (Cilium's names where Cilium has one) and cheap
//! in-process counters for the benchmark.

use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::ec2::error::ErrorKind;
use crate::ec2::model::Operation;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct OpLabels {
    pub(super) operation: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct BucketLabels {
    pub(super) bucket: &'static str,
}

/// The `bucket` label in single-bucket mode.
pub(super) const SINGLE_BUCKET: &str = "all";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct OutcomeLabels {
    pub(super) operation: &'static str,
    pub(super) outcome: &'static str,
}

/// Cilium's `ec2_api_duration_seconds` labels: `response_code` is `OK`, or the AWS error code
/// (`RequestLimitExceeded`, ...) or a local one (`Timeout`) of a failed call.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct CallLabels {
    pub(super) operation: &'static str,
    pub(super) response_code: String,
}

type HistogramFamily = Family<OpLabels, Histogram, fn() -> Histogram>;

fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.005, 2.0, 14))
}

/// Prometheus metrics of the gate. Clones share the same series.
#[derive(Clone, Debug)]
pub struct GateMetrics {
    pub(super) calls: Family<OutcomeLabels, Counter>,
    pub(super) duration: Family<CallLabels, Histogram, fn() -> Histogram>,
    pub(super) wait: HistogramFamily,
    pub(super) retries: Family<OpLabels, Counter>,
    pub(super) throttled: Family<OpLabels, Counter>,
    pub(super) rate: Family<BucketLabels, Gauge<f64, AtomicU64>>,
    pub(super) recoveries: Family<BucketLabels, Counter>,
}

impl Default for GateMetrics {
    fn default() -> Self {
        Self {
            calls: Family::default(),
            duration: Family::new_with_constructor(latency_histogram),
            wait: Family::new_with_constructor(latency_histogram),
            retries: Family::default(),
            throttled: Family::default(),
            rate: Family::default(),
            recoveries: Family::default(),
        }
    }
}

impl GateMetrics {
    /// Register under `ec2_api_calls_total`, `ec2_api_duration_seconds`,
    /// `ec2_rate_limit_wait_seconds`, `ec2_api_retries_total`, `ec2_api_throttled_total`,
    /// `ec2_rate_limit_qps`, `ec2_rate_limit_recoveries_total`.
    pub fn register(&self, registry: &mut Registry) {
        // prometheus-client appends `_total` to counters.
        registry.register(
            "ec2_api_calls",
            "EC2 API calls (attempts) by operation and outcome",
            self.calls.clone(),
        );
        registry.register(
            "ec2_api_duration_seconds",
            "Latency of one EC2 API call, by operation and response code",
            self.duration.clone(),
        );
        registry.register(
            "ec2_rate_limit_wait_seconds",
            "Time an EC2 call waited for the client-side rate limiter",
            self.wait.clone(),
        );
        registry.register(
            "ec2_api_retries",
            "EC2 API calls retried after a throttled or transient failure",
            self.retries.clone(),
        );
        registry.register(
            "ec2_api_throttled",
            "EC2 API answers that were throttled",
            self.throttled.clone(),
        );
        registry.register(
            "ec2_rate_limit_qps",
            "Current adaptive rate of each client-side bucket (calls per second; the configured \
             rate is its ceiling)",
            self.rate.clone(),
        );
        registry.register(
            "ec2_rate_limit_recoveries",
            "Restore probes that took a client-side bucket's adaptive rate back to its ceiling \
             (the account's spare capacity came back)",
            self.recoveries.clone(),
        );
    }
}

/// The `outcome` label of a failed call.
pub fn outcome_label(kind: ErrorKind) -> &'static str {
    match kind {
        ErrorKind::Throttled => "throttled",
        ErrorKind::SubnetExhausted => "subnet_exhausted",
        ErrorKind::InsufficientCidrBlocks => "insufficient_cidr_blocks",
        ErrorKind::AttachmentLimitExceeded => "attachment_limit_exceeded",
        ErrorKind::IpLimitExceeded => "ip_limit_exceeded",
        ErrorKind::DeviceIndexInUse => "device_index_in_use",
        ErrorKind::InstanceNotRunning => "instance_not_running",
        ErrorKind::NotFound(_) => "not_found",
        ErrorKind::IdempotencyMismatch => "idempotency_mismatch",
        ErrorKind::Unauthorized => "unauthorized",
        ErrorKind::Transient => "transient",
        ErrorKind::Other => "other",
    }
}

pub(super) fn op_index(op: Operation) -> usize {
    Operation::ALL
        .iter()
        .position(|o| *o == op)
        .expect("every operation is in ALL")
}

pub(super) const OPS: usize = Operation::ALL.len();

/// Cheap in-process counters, readable by benchmarks without parsing Prometheus output.
#[derive(Debug, Default)]
pub(super) struct Counters {
    pub(super) calls: [AtomicU64; OPS],
    pub(super) throttled: [AtomicU64; OPS],
    pub(super) retries: [AtomicU64; OPS],
    pub(super) wait_nanos: [AtomicU64; OPS],
    pub(super) failed: [AtomicU64; OPS],
}

/// A snapshot of the gate's counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GateStats {
    /// API calls made (attempts, pages included) per operation.
    pub calls: BTreeMap<Operation, u64>,
    /// Throttled answers per operation.
    pub throttled: BTreeMap<Operation, u64>,
    /// Retries per operation.
    pub retries: BTreeMap<Operation, u64>,
    /// Total time spent waiting for tokens and penalties, per operation.
    pub waited: BTreeMap<Operation, Duration>,
    /// Calls that returned an error to the caller (after the retries), per operation.
    pub failed: BTreeMap<Operation, u64>,
}

impl GateStats {
    pub fn total_calls(&self) -> u64 {
        self.calls.values().sum()
    }

    pub fn total_throttled(&self) -> u64 {
        self.throttled.values().sum()
    }

    pub fn total_retries(&self) -> u64 {
        self.retries.values().sum()
    }

    pub fn total_failed(&self) -> u64 {
        self.failed.values().sum()
    }
}
