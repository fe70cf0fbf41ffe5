//! The one gate every EC2 call passes through: token buckets, backoff, metrics.
//!
//! * **Buckets.** By default one governor bucket per AWS throttling [`Bucket`], at
//!   `rate_fraction` of AWS's published burst and refill (headroom for other callers in the
//!   account), each overridable. Alternatively one bucket shared by every call (Cilium's mode), so
//!   the benchmark can compare the two. Every attempt, and every page of a describe, takes a token.
//! * **Retries.** `backon` exponential backoff with jitter, bounded attempts, only for throttled
//!   and transient errors; client errors return at once. A transient failure (timeout, 5xx)
//!   of a call without an idempotency token (assign, attach) is not repeated: it may have
//!   taken effect, so the caller looks at EC2 instead. The SDK's own retry is off
//!   ([`super::aws`]), so this is the only policy.
//! * **Throttle penalty.** A throttled answer means the *account's* bucket at AWS is empty, so
//!   every caller of that bucket, not only the failing call, must slow down. Each of our buckets
//!   keeps a "not before" instant that all its callers wait for before taking a token. It is set
//!   to `now + base_delay × 2^(strikes−1)` (capped at `max_delay` and at [`THROTTLED_MAX_DELAY`]),
//!   where `strikes` counts consecutive throttled answers of the bucket; any success resets the
//!   strikes. The retry backoff of a throttled call has the same cap: the learned rate already
//!   spaces the calls, and a longer sleep only outlasts the spell that caused it. This is
//!   simpler than rescaling the governor quota and adapts without configuration. It answers
//!   "the AWS bucket is empty *now*"; the adaptive rate below answers "how much of it is ours".
//! * **Adaptive rate.** The configured rate is a ceiling: AWS's buckets are per account and
//!   region, shared with every other tool in the account. Each bucket has a [`RateController`]
//!   (see [`rate`]) that cuts its rate on throttled answers, grows it back on successes and
//!   probes for the ceiling on a schedule. The governor limiter stays at the ceiling (quotas are
//!   immutable; rebuilding one would lose its state); in front of it a [`LocalBucket`] refills
//!   at the learned rate and is emptied, with the governor's, by every throttled answer. At the
//!   ceiling the local bucket equals the governor's, so with nobody else in the account the gate
//!   behaves exactly as the static limiter. The current rate of each bucket is the gauge
//!   `ec2_rate_limit_qps{bucket}`; probes that reached the ceiling count in
//!   `ec2_rate_limit_recoveries_total{bucket}`.
//! * **Order under scarcity.** While a bucket's rate is below its ceiling, calls that complete
//!   half-done work (attach, delete-on-termination, unassign, ...) take its next slot before
//!   calls that start new work
//!   (`CreateNetworkInterface`); describes keep their place (`Class`).
//! * **Time** is tokio's (a governor [`Clock`] over `tokio::time::Instant`, waits with
//!   `tokio::time::sleep`), so tests and benchmarks run under `tokio::time::pause()` at simulated
//!   speed.

use std::collections::BTreeMap;
use std::future::Future;
use std::net::Ipv4Addr;
use std::num::NonZeroU32;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use governor::clock::Clock;
use governor::middleware::NoOpMiddleware;
use governor::state::{InMemoryState, NotKeyed};
use governor::{Quota, RateLimiter};
use ipnet::Ipv4Net;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tokio::time::Instant;

use self::local::LocalBucket;
use self::rate::RateController;
use super::error::ErrorKind;
use super::model::*;
use super::{Ec2, Ec2Error, Result};
use crate::jitter::Jitter;

/// Rates, bursts and retry policy of the gate.
#[derive(Clone, Debug, PartialEq)]
pub struct GateConfig {
    /// Fraction of AWS's burst and refill used by default (burst at least 1).
    pub rate_fraction: f64,
    /// Per-bucket (burst, refill per second), replacing the scaled AWS default.
    pub overrides: BTreeMap<Bucket, (u32, f64)>,
    /// One bucket (refill per second, burst) for every call instead of per-action buckets.
    pub single_bucket: Option<(f64, u32)>,
    /// Attempts per call, the first included, counting failures other than throttling.
    pub max_attempts: u32,
    /// How long a call keeps retrying throttled answers: time since its first send, less the
    /// time it then waited its turn for tokens (under pacing a call waits its turn for
    /// minutes; only the attempts and their backoff count).
    /// A throttled call was not executed, so retrying is always safe; giving up early would
    /// turn scarcity into failed operations (and the executor's error paths), so the bound is
    /// generous.
    pub throttle_deadline: Duration,
    pub base_delay: Duration,
    pub max_delay: Duration,
    /// Seed of the retries' jitter; `None` (production): `backon` seeds from the OS. The
    /// simulation sets it so a seed replays exactly ([`crate::jitter`]).
    pub jitter_seed: Option<u64>,
}

impl Default for GateConfig {
    fn default() -> Self {
        Self::aws_defaults()
    }
}

impl GateConfig {
    /// Per-action buckets at 80 % of AWS's published figures.
    pub fn aws_defaults() -> Self {
        Self {
            rate_fraction: 0.8,
            overrides: BTreeMap::new(),
            single_bucket: None,
            max_attempts: 5,
            throttle_deadline: Duration::from_secs(300),
            base_delay: Duration::from_millis(200),
            max_delay: Duration::from_secs(20),
            jitter_seed: None,
        }
    }

    /// Cilium's operator: one bucket of 4 qps, burst 20, for every call.
    pub fn cilium_like() -> Self {
        Self {
            single_bucket: Some((4.0, 20)),
            ..Self::aws_defaults()
        }
    }

    /// (burst, refill per second) the gate uses for `bucket` in per-action mode.
    pub fn bucket_limits(&self, bucket: Bucket) -> (u32, f64) {
        if let Some(limits) = self.overrides.get(&bucket) {
            return *limits;
        }
        let (burst, rate) = bucket.aws_default();
        let burst = ((f64::from(burst) * self.rate_fraction).floor() as u32).max(1);
        (burst, f64::from(rate) * self.rate_fraction)
    }
}

/// governor clock on tokio's time, so a paused runtime drives the buckets.
#[derive(Clone, Copy, Debug, Default)]
pub struct TokioClock;

impl Clock for TokioClock {
    type Instant = std::time::Instant;

    fn now(&self) -> Self::Instant {
        Instant::now().into_std()
    }
}

/// A governor bucket on tokio's time.
pub(crate) type Limiter =
    RateLimiter<NotKeyed, InMemoryState, TokioClock, NoOpMiddleware<std::time::Instant>>;

/// A bucket of `burst` tokens refilled at `per_sec`.
pub(crate) fn limiter(burst: u32, per_sec: f64) -> Limiter {
    let per_sec = if per_sec.is_finite() && per_sec > 0.0 {
        per_sec
    } else {
        1e-3
    };
    let period = Duration::from_secs_f64(1.0 / per_sec).max(Duration::from_nanos(1));
    let quota = Quota::with_period(period)
        .expect("non-zero period")
        .allow_burst(NonZeroU32::new(burst.max(1)).expect("burst at least 1"));
    RateLimiter::direct_with_clock(quota, TokioClock)
}

/// The throttle penalty of one bucket (see the module docs).
#[derive(Debug)]
struct Penalty {
    not_before: Instant,
    strikes: u32,
}

/// The adaptive pacing of one bucket (see the module docs).
#[derive(Debug)]
struct Pacing {
    controller: RateController,
    local: LocalBucket,
    /// Recoveries already counted in the metrics.
    reported: u64,
}

/// How long one call has been retrying: from its first send, less its later waits for tokens.
#[derive(Debug, Default)]
struct RetryClock {
    first_sent: Option<Instant>,
    queued: Duration,
}

impl RetryClock {
    /// An attempt is sent at `at` after waiting `waited` for its tokens.
    fn sent(&mut self, at: Instant, waited: Duration) {
        match self.first_sent {
            None => self.first_sent = Some(at),
            Some(_) => self.queued += waited,
        }
    }

    fn retrying(&self) -> Duration {
        self.first_sent
            .map_or(Duration::ZERO, |t| t.elapsed().saturating_sub(self.queued))
    }
}

/// A throttled call's retry delay and a bucket's penalty never exceed this: the learned rate
/// spaces the calls, so a longer sleep would only outlast the spell that caused it.
pub const THROTTLED_MAX_DELAY: Duration = Duration::from_secs(2);

/// A paced caller looks again at least this often, so that a probe's ramp reaches it.
const PACING_RECHECK: Duration = Duration::from_secs(1);

struct BucketState {
    limiter: Limiter,
    penalty: Mutex<Penalty>,
    pacing: Mutex<Pacing>,
    /// Callers waiting that complete half-done work; new work yields to them.
    urgent_waiting: AtomicUsize,
}

/// Decrements the urgent-waiter count when the wait ends, also when the caller is cancelled.
struct UrgentGuard<'a>(&'a AtomicUsize);

impl Drop for UrgentGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl BucketState {
    fn new(burst: u32, per_sec: f64) -> Self {
        let now = Instant::now();
        Self {
            limiter: limiter(burst, per_sec),
            penalty: Mutex::new(Penalty {
                not_before: now,
                strikes: 0,
            }),
            pacing: Mutex::new(Pacing {
                controller: RateController::new(per_sec, now),
                local: LocalBucket::new(burst, now),
                reported: 0,
            }),
            urgent_waiting: AtomicUsize::new(0),
        }
    }

    /// Wait out the penalty, the adaptive pacing (urgent callers first), then for a token.
    async fn acquire(&self, class: Class) {
        let urgent = class == Class::Completes;
        let _guard = urgent.then(|| {
            self.urgent_waiting.fetch_add(1, Ordering::Relaxed);
            UrgentGuard(&self.urgent_waiting)
        });
        loop {
            let not_before = self.penalty.lock().expect("penalty lock").not_before;
            let now = Instant::now();
            if now < not_before {
                tokio::time::sleep_until(not_before).await;
                continue;
            }
            // Everything is re-evaluated after every wait: a cut meanwhile spaces calls further,
            // and urgent callers that arrived meanwhile go first.
            let wake = {
                let mut p = self.pacing.lock().expect("pacing lock");
                let Pacing {
                    controller, local, ..
                } = &mut *p;
                controller.advance(now);
                let rate = controller.rate();
                local.refill(now, rate, controller.ceiling());
                let token = local.wait(rate);
                // Only under scarcity (the bucket was throttled and is not back at its
                // ceiling): otherwise every call goes in its turn, as before.
                let scarce = controller.is_limiting();
                let wait = if scarce
                    && class == Class::Starts
                    && self.urgent_waiting.load(Ordering::Relaxed) > 0
                {
                    // New work lets the urgent callers take the next slot, then looks again.
                    token.unwrap_or_default() + Duration::from_secs_f64(1.0 / rate)
                } else if let Some(token) = token {
                    token
                } else {
                    match self.limiter.check() {
                        Ok(()) => {
                            local.take();
                            controller.on_send(now);
                            return;
                        }
                        Err(not_until) => not_until.wait_time_from(TokioClock.now()),
                    }
                };
                // A probe may raise the rate meanwhile.
                let wait = match controller.next_change(now) {
                    Some(change) => wait.min(change.max(PACING_RECHECK)),
                    None => wait,
                };
                now + wait
            };
            tokio::time::sleep_until(wake).await;
        }
    }

    /// A throttled answer to a call sent at `sent`: penalty, cut, and both local buckets
    /// emptied. Returns whether the rate changed.
    fn throttled(&self, sent: Instant, base: Duration, max: Duration) -> bool {
        let now = Instant::now();
        let mut p = self.penalty.lock().expect("penalty lock");
        p.strikes = p.strikes.saturating_add(1);
        let factor = 1u32 << (p.strikes - 1).min(16);
        let delay = base
            .saturating_mul(factor)
            .min(max)
            .min(THROTTLED_MAX_DELAY);
        p.not_before = p.not_before.max(now + delay);
        let mut pacing = self.pacing.lock().expect("pacing lock");
        pacing.local.empty(now);
        // governor has no way to empty a bucket but taking its tokens (at most the burst).
        while self.limiter.check().is_ok() {}
        pacing.controller.on_throttle(sent, now)
    }

    /// A success: resets the penalty's strikes and grows the rate.
    fn succeeded(&self) {
        self.penalty.lock().expect("penalty lock").strikes = 0;
        let mut pacing = self.pacing.lock().expect("pacing lock");
        pacing.controller.on_success(Instant::now());
    }

    fn rate(&self) -> f64 {
        let mut p = self.pacing.lock().expect("pacing lock");
        p.controller.advance(Instant::now());
        p.controller.rate()
    }

    /// The current rate and the recoveries not yet counted in the metrics.
    fn report(&self) -> (f64, u64) {
        let mut p = self.pacing.lock().expect("pacing lock");
        p.controller.advance(Instant::now());
        let new = p.controller.recoveries() - p.reported;
        p.reported = p.controller.recoveries();
        (p.controller.rate(), new)
    }
}

/// Calls that start new work yield a bucket's next slot to calls completing work already begun
/// (attach after create, delete-on-termination, releases): under scarcity, finishing what is
/// half done keeps the cluster correct; a new ENI can wait. Describes neither yield nor are
/// yielded to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Class {
    Starts,
    Completes,
    Neutral,
}

impl Class {
    fn of(op: Operation) -> Self {
        if op == Operation::CreateNetworkInterface {
            Class::Starts
        } else if op.is_mutating() {
            Class::Completes
        } else {
            Class::Neutral
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OpLabels {
    operation: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BucketLabels {
    bucket: &'static str,
}

/// The `bucket` label in single-bucket mode.
const SINGLE_BUCKET: &str = "all";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    operation: &'static str,
    outcome: &'static str,
}

/// Cilium's `ec2_api_duration_seconds` labels: `response_code` is `OK`, or the AWS error code
/// (`RequestLimitExceeded`, ...) or a local one (`Timeout`) of a failed call.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CallLabels {
    operation: &'static str,
    response_code: String,
}

type HistogramFamily = Family<OpLabels, Histogram, fn() -> Histogram>;

fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.005, 2.0, 14))
}

/// Prometheus metrics of the gate. Clones share the same series.
#[derive(Clone, Debug)]
pub struct GateMetrics {
    calls: Family<OutcomeLabels, Counter>,
    duration: Family<CallLabels, Histogram, fn() -> Histogram>,
    wait: HistogramFamily,
    retries: Family<OpLabels, Counter>,
    throttled: Family<OpLabels, Counter>,
    rate: Family<BucketLabels, Gauge<f64, AtomicU64>>,
    recoveries: Family<BucketLabels, Counter>,
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

fn op_index(op: Operation) -> usize {
    Operation::ALL
        .iter()
        .position(|o| *o == op)
        .expect("every operation is in ALL")
}

const OPS: usize = Operation::ALL.len();

/// Cheap in-process counters, readable by benchmarks without parsing Prometheus output.
#[derive(Debug, Default)]
struct Counters {
    calls: [AtomicU64; OPS],
    throttled: [AtomicU64; OPS],
    retries: [AtomicU64; OPS],
    wait_nanos: [AtomicU64; OPS],
    failed: [AtomicU64; OPS],
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

/// Rate-limited, retrying wrapper of any [`Ec2`].
pub struct Gate<E: Ec2> {
    inner: E,
    config: GateConfig,
    /// Per-action mode: indexed like [`Bucket::ALL`]; single-bucket mode: one entry.
    buckets: Vec<BucketState>,
    metrics: GateMetrics,
    counters: Counters,
    /// Draws one `backon` jitter seed per call when the config has a seed.
    jitter: Jitter,
}

impl<E: Ec2> Gate<E> {
    pub fn new(inner: E, config: GateConfig) -> Self {
        let buckets = match config.single_bucket {
            Some((qps, burst)) => vec![BucketState::new(burst, qps)],
            None => Bucket::ALL
                .iter()
                .map(|b| {
                    let (burst, rate) = config.bucket_limits(*b);
                    BucketState::new(burst, rate)
                })
                .collect(),
        };
        let gate = Self {
            inner,
            jitter: Jitter::new(config.jitter_seed),
            config,
            buckets,
            metrics: GateMetrics::default(),
            counters: Counters::default(),
        };
        for (bucket, rate) in gate.rates() {
            let labels = BucketLabels { bucket };
            gate.metrics.rate.get_or_create(&labels).set(rate);
            // Exported from the start at 0, so that rate() sees the first recovery.
            let _ = gate.metrics.recoveries.get_or_create(&labels);
        }
        gate
    }

    pub fn inner(&self) -> &E {
        &self.inner
    }

    pub fn config(&self) -> &GateConfig {
        &self.config
    }

    pub fn metrics(&self) -> &GateMetrics {
        &self.metrics
    }

    pub fn stats(&self) -> GateStats {
        let read = |arr: &[AtomicU64; OPS]| {
            Operation::ALL
                .iter()
                .map(|op| (*op, arr[op_index(*op)].load(Ordering::Relaxed)))
                .filter(|(_, n)| *n > 0)
                .collect::<BTreeMap<_, _>>()
        };
        GateStats {
            calls: read(&self.counters.calls),
            throttled: read(&self.counters.throttled),
            retries: read(&self.counters.retries),
            failed: read(&self.counters.failed),
            waited: read(&self.counters.wait_nanos)
                .into_iter()
                .map(|(op, n)| (op, Duration::from_nanos(n)))
                .collect(),
        }
    }

    /// The `bucket` label of `op`'s gate bucket.
    fn bucket_label(&self, op: Operation) -> &'static str {
        if self.buckets.len() == 1 {
            SINGLE_BUCKET
        } else {
            op.bucket().name()
        }
    }

    /// Publish `op`'s bucket's rate and its new recoveries.
    fn report(&self, op: Operation) {
        let labels = BucketLabels {
            bucket: self.bucket_label(op),
        };
        let (rate, recovered) = self.bucket(op).report();
        self.metrics.rate.get_or_create(&labels).set(rate);
        if recovered > 0 {
            self.metrics
                .recoveries
                .get_or_create(&labels)
                .inc_by(recovered);
        }
    }

    /// The current adaptive rate of each gate bucket (calls per second), by bucket name
    /// (`"all"` in single-bucket mode).
    pub fn rates(&self) -> Vec<(&'static str, f64)> {
        if self.buckets.len() == 1 {
            return vec![(SINGLE_BUCKET, self.buckets[0].rate())];
        }
        Bucket::ALL
            .iter()
            .zip(&self.buckets)
            .map(|(b, state)| (b.name(), state.rate()))
            .collect()
    }

    fn bucket(&self, op: Operation) -> &BucketState {
        if self.buckets.len() == 1 {
            return &self.buckets[0];
        }
        let i = Bucket::ALL
            .iter()
            .position(|b| *b == op.bucket())
            .expect("every bucket is in ALL");
        &self.buckets[i]
    }

    /// One attempt: token, call, bookkeeping. `call` is lazy: nothing is sent before the token.
    /// `tokens` is the number of AWS calls the trait call makes (unassign may make two).
    /// `clock` measures the call's retrying time (the throttle deadline).
    async fn attempt<T>(
        &self,
        op: Operation,
        tokens: u32,
        clock: &Mutex<RetryClock>,
        call: impl Future<Output = Result<T>>,
    ) -> Result<T> {
        let i = op_index(op);
        let labels = OpLabels {
            operation: op.name(),
        };
        let bucket = self.bucket(op);
        let waiting = Instant::now();
        let class = Class::of(op);
        for _ in 0..tokens {
            bucket.acquire(class).await;
        }
        let waited = waiting.elapsed();
        self.metrics
            .wait
            .get_or_create(&labels)
            .observe(waited.as_secs_f64());
        self.counters.wait_nanos[i].fetch_add(waited.as_nanos() as u64, Ordering::Relaxed);

        let started = Instant::now();
        clock.lock().expect("retry clock").sent(started, waited);
        self.counters.calls[i].fetch_add(u64::from(tokens), Ordering::Relaxed);
        let result = call.await;
        self.metrics
            .duration
            .get_or_create(&CallLabels {
                operation: op.name(),
                response_code: match &result {
                    Ok(_) => "OK".to_string(),
                    Err(e) => e.code.clone(),
                },
            })
            .observe(started.elapsed().as_secs_f64());
        let outcome = match &result {
            Ok(_) => {
                bucket.succeeded();
                "success"
            }
            Err(e) => {
                if e.is_throttled() {
                    let cut =
                        bucket.throttled(started, self.config.base_delay, self.config.max_delay);
                    tracing::debug!(%op, bucket = op.bucket().name(), cut, "throttled: slowing the bucket");
                    self.counters.throttled[i].fetch_add(1, Ordering::Relaxed);
                    self.metrics.throttled.get_or_create(&labels).inc();
                }
                outcome_label(e.kind)
            }
        };
        self.report(op);
        self.metrics
            .calls
            .get_or_create(&OutcomeLabels {
                operation: op.name(),
                outcome,
            })
            .inc();
        result
    }

    /// Run `call` through the bucket of `op`, retrying throttled and transient failures.
    async fn call<T, F, Fut>(&self, op: Operation, call: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        self.call_n(op, 1, call).await
    }

    async fn call_n<T, F, Fut>(&self, op: Operation, tokens: u32, mut call: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let mut backoff = ExponentialBuilder::default()
            .with_min_delay(self.config.base_delay)
            .with_max_delay(self.config.max_delay)
            .without_max_times()
            .with_jitter();
        if let Some(seed) = self.jitter.seed() {
            backoff = backoff.with_jitter_seed(seed);
        }
        let clock = Mutex::new(RetryClock::default());
        let mut failures = 0u32;
        (|| self.attempt(op, tokens, &clock, call()))
            .retry(backoff)
            .sleep(tokio::time::sleep)
            .adjust(|e: &Ec2Error, delay| {
                if e.is_throttled() {
                    delay.map(|d| d.min(THROTTLED_MAX_DELAY))
                } else {
                    delay
                }
            })
            .when(|e: &Ec2Error| {
                if e.is_throttled() {
                    // Not executed: wait (the bucket is paced meanwhile) and try again.
                    let retrying = clock.lock().expect("retry clock").retrying();
                    return retrying < self.config.throttle_deadline;
                }
                failures += 1;
                e.is_retryable()
                    && op.repeatable_after_lost_answer()
                    && failures < self.config.max_attempts
            })
            .notify(|err: &Ec2Error, delay: Duration| {
                self.counters.retries[op_index(op)].fetch_add(1, Ordering::Relaxed);
                self.metrics
                    .retries
                    .get_or_create(&OpLabels {
                        operation: op.name(),
                    })
                    .inc();
                tracing::debug!(%op, code = %err.code, ?delay, "retrying EC2 call");
                if err.is_throttled() {
                    crate::reconcile::status::note_throttled(op.name(), delay);
                }
            })
            .await
            .inspect_err(|_| {
                self.counters.failed[op_index(op)].fetch_add(1, Ordering::Relaxed);
            })
    }
}

impl<E: Ec2> Ec2 for Gate<E> {
    async fn describe_instance_types(
        &self,
        types: &[String],
        next_token: Option<String>,
    ) -> Result<Page<InstanceTypeLimits>> {
        self.call(Operation::DescribeInstanceTypes, || {
            self.inner
                .describe_instance_types(types, next_token.clone())
        })
        .await
    }

    async fn describe_instances(
        &self,
        filter: &InstanceFilter,
        next_token: Option<String>,
    ) -> Result<Page<Instance>> {
        self.call(Operation::DescribeInstances, || {
            self.inner.describe_instances(filter, next_token.clone())
        })
        .await
    }

    async fn describe_network_interfaces(
        &self,
        filter: &EniFilter,
        next_token: Option<String>,
    ) -> Result<Page<NetworkInterface>> {
        self.call(Operation::DescribeNetworkInterfaces, || {
            self.inner
                .describe_network_interfaces(filter, next_token.clone())
        })
        .await
    }

    async fn describe_subnets(
        &self,
        filter: &ResourceFilter,
        next_token: Option<String>,
    ) -> Result<Page<Subnet>> {
        self.call(Operation::DescribeSubnets, || {
            self.inner.describe_subnets(filter, next_token.clone())
        })
        .await
    }

    async fn describe_vpcs(
        &self,
        filter: &ResourceFilter,
        next_token: Option<String>,
    ) -> Result<Page<Vpc>> {
        self.call(Operation::DescribeVpcs, || {
            self.inner.describe_vpcs(filter, next_token.clone())
        })
        .await
    }

    async fn describe_security_groups(
        &self,
        filter: &ResourceFilter,
        next_token: Option<String>,
    ) -> Result<Page<SecurityGroup>> {
        self.call(Operation::DescribeSecurityGroups, || {
            self.inner
                .describe_security_groups(filter, next_token.clone())
        })
        .await
    }

    async fn describe_route_tables(
        &self,
        filter: &ResourceFilter,
        next_token: Option<String>,
    ) -> Result<Page<RouteTable>> {
        self.call(Operation::DescribeRouteTables, || {
            self.inner.describe_route_tables(filter, next_token.clone())
        })
        .await
    }

    async fn create_network_interface(
        &self,
        request: &CreateEniRequest,
    ) -> Result<NetworkInterface> {
        self.call(Operation::CreateNetworkInterface, || {
            self.inner.create_network_interface(request)
        })
        .await
    }

    async fn attach_network_interface(
        &self,
        eni_id: &str,
        instance_id: &str,
        device_index: u32,
    ) -> Result<String> {
        self.call(Operation::AttachNetworkInterface, || {
            self.inner
                .attach_network_interface(eni_id, instance_id, device_index)
        })
        .await
    }

    async fn set_delete_on_termination(
        &self,
        eni_id: &str,
        attachment_id: &str,
        delete_on_termination: bool,
    ) -> Result<()> {
        self.call(Operation::ModifyNetworkInterfaceAttribute, || {
            self.inner
                .set_delete_on_termination(eni_id, attachment_id, delete_on_termination)
        })
        .await
    }

    async fn assign_private_ip_addresses(
        &self,
        eni_id: &str,
        request: AddressRequest,
    ) -> Result<Assigned> {
        self.call(Operation::AssignPrivateIpAddresses, || {
            self.inner.assign_private_ip_addresses(eni_id, request)
        })
        .await
    }

    async fn unassign_private_ip_addresses(
        &self,
        eni_id: &str,
        ips: &[Ipv4Addr],
        prefixes: &[Ipv4Net],
    ) -> Result<()> {
        if ips.is_empty() && prefixes.is_empty() {
            return Ok(());
        }
        // One AWS call per non-empty kind (see `AwsEc2`), so one token each.
        let tokens = u32::from(!ips.is_empty()) + u32::from(!prefixes.is_empty());
        self.call_n(Operation::UnassignPrivateIpAddresses, tokens, || {
            self.inner
                .unassign_private_ip_addresses(eni_id, ips, prefixes)
        })
        .await
    }

    async fn detach_network_interface(&self, attachment_id: &str, force: bool) -> Result<()> {
        self.call(Operation::DetachNetworkInterface, || {
            self.inner.detach_network_interface(attachment_id, force)
        })
        .await
    }

    async fn delete_network_interface(&self, eni_id: &str) -> Result<()> {
        self.call(Operation::DeleteNetworkInterface, || {
            self.inner.delete_network_interface(eni_id)
        })
        .await
    }
    async fn describe_addresses(&self, tags: &Tags) -> Result<Vec<Address>> {
        self.call(Operation::DescribeAddresses, || {
            self.inner.describe_addresses(tags)
        })
        .await
    }

    async fn associate_address(
        &self,
        allocation_id: &str,
        eni_id: &str,
        private_ip: Ipv4Addr,
    ) -> Result<String> {
        self.call(Operation::AssociateAddress, || {
            self.inner
                .associate_address(allocation_id, eni_id, private_ip)
        })
        .await
    }

    async fn disassociate_address(&self, association_id: &str) -> Result<()> {
        self.call(Operation::DisassociateAddress, || {
            self.inner.disassociate_address(association_id)
        })
        .await
    }
}

pub mod local;
pub mod rate;

#[cfg(test)]
mod tests;
