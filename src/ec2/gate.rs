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
//! * **Order.** Calls of a pass for a node with no free address, or with pods waiting, take a
//!   bucket's next slot before calls that top up a reserve ([`urgency`]): the passes run side by
//!   side, so the account is used whole, and the urgent ones are served first. While a bucket's
//!   rate is below its ceiling, calls that complete half-done work (attach,
//!   delete-on-termination, unassign, ...) also go before calls that start new work
//!   (`CreateNetworkInterface`); describes keep their place (`Class`).
//! * **Time** is tokio's (a governor [`Clock`] over `tokio::time::Instant`, waits with
//!   `tokio::time::sleep`), so tests and benchmarks run under `tokio::time::pause()` at simulated
//!   speed.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use tokio::time::Instant;

use self::bucket::{BucketState, Class};
pub(crate) use self::bucket::{Limiter, limiter};
pub use self::bucket::{THROTTLED_MAX_DELAY, TokioClock};
use self::metrics::{BucketLabels, CallLabels, Counters, OPS, OpLabels, OutcomeLabels};
pub use self::metrics::{GateMetrics, GateStats, outcome_label};
use self::metrics::{SINGLE_BUCKET, op_index};
use super::layer::{Call, Layer, Layered, MakeCall};
use super::model::*;
use super::{Ec2Error, Result};
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

/// Rate-limited, retrying client of any [`Ec2`].
pub type Gate<E> = Layered<E, GateLayer>;

/// The gate's layer: the buckets, the retry policy and their metrics.
pub struct GateLayer {
    config: GateConfig,
    /// Per-action mode: indexed like [`Bucket::ALL`]; single-bucket mode: one entry.
    buckets: Vec<BucketState>,
    metrics: GateMetrics,
    counters: Counters,
    /// Draws one `backon` jitter seed per call when the config has a seed.
    jitter: Jitter,
    throttles: Arc<dyn ThrottleObserver>,
}

/// Told of each throttled answer the gate is about to retry, with the delay before the retry
/// (the operator shows it as the wait of the node whose pass made the call).
pub trait ThrottleObserver: Send + Sync + 'static {
    fn throttled(&self, operation: Operation, retry_in: Duration);
}

/// Nobody to tell.
impl ThrottleObserver for () {
    fn throttled(&self, _: Operation, _: Duration) {}
}

impl From<GateConfig> for GateLayer {
    fn from(config: GateConfig) -> Self {
        Self::new(config)
    }
}

/// The gate's figures, read on the client.
impl<E> Gate<E> {
    pub fn config(&self) -> &GateConfig {
        self.layer().config()
    }

    pub fn metrics(&self) -> &GateMetrics {
        self.layer().metrics()
    }

    pub fn stats(&self) -> GateStats {
        self.layer().stats()
    }

    pub fn rates(&self) -> Vec<(&'static str, f64)> {
        self.layer().rates()
    }
}

impl Layer for GateLayer {
    fn around<'a, T: Send + 'a>(
        &'a self,
        call: Call,
        send: &'a MakeCall<'a, T>,
    ) -> impl Future<Output = Result<T>> + Send + 'a {
        self.call(call.operation, call.aws_calls, send)
    }
}

impl GateLayer {
    pub fn new(config: GateConfig) -> Self {
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
            jitter: Jitter::new(config.jitter_seed),
            config,
            buckets,
            metrics: GateMetrics::default(),
            counters: Counters::default(),
            throttles: Arc::new(()),
        };
        for (bucket, rate) in gate.rates() {
            let labels = BucketLabels { bucket };
            gate.metrics.rate.get_or_create(&labels).set(rate);
            // Exported from the start at 0, so that rate() sees the first recovery.
            let _ = gate.metrics.recoveries.get_or_create(&labels);
        }
        gate
    }

    /// The gate that tells `observer` of the throttled calls it retries.
    pub fn reporting_throttles_to(mut self, observer: impl ThrottleObserver) -> Self {
        self.throttles = Arc::new(observer);
        self
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

    /// Publish every bucket's rate and new recoveries: a probe raises an idle bucket's rate with
    /// time, and its gauge must not stay at the cut until that bucket's next call.
    fn report(&self) {
        let labels: Vec<&'static str> = if self.buckets.len() == 1 {
            vec![SINGLE_BUCKET]
        } else {
            Bucket::ALL.iter().map(|b| b.name()).collect()
        };
        for (bucket, state) in labels.into_iter().zip(&self.buckets) {
            let labels = BucketLabels { bucket };
            let (rate, recovered) = state.report();
            self.metrics.rate.get_or_create(&labels).set(rate);
            if recovered > 0 {
                self.metrics
                    .recoveries
                    .get_or_create(&labels)
                    .inc_by(recovered);
            }
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
        clock: &std::sync::Mutex<RetryClock>,
        call: impl Future<Output = Result<T>>,
    ) -> Result<T> {
        let i = op_index(op);
        let labels = OpLabels {
            operation: op.name(),
        };
        let bucket = self.bucket(op);
        let waiting = Instant::now();
        let (class, urgent) = (Class::of(op), urgency::current());
        for _ in 0..tokens {
            bucket.acquire(class, urgent).await;
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
        self.report();
        self.metrics
            .calls
            .get_or_create(&OutcomeLabels {
                operation: op.name(),
                outcome,
            })
            .inc();
        result
    }

    /// Run `call` (`tokens` AWS calls) through the bucket of `op`, retrying throttled and
    /// transient failures.
    async fn call<'a, T: Send + 'a>(
        &'a self,
        op: Operation,
        tokens: u32,
        call: &'a MakeCall<'a, T>,
    ) -> Result<T> {
        let mut backoff = ExponentialBuilder::default()
            .with_min_delay(self.config.base_delay)
            .with_max_delay(self.config.max_delay)
            .without_max_times()
            .with_jitter();
        if let Some(seed) = self.jitter.seed() {
            backoff = backoff.with_jitter_seed(seed);
        }
        let clock = std::sync::Mutex::new(RetryClock::default());
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
                    self.throttles.throttled(op, delay);
                }
            })
            .await
            .inspect_err(|_| {
                self.counters.failed[op_index(op)].fetch_add(1, Ordering::Relaxed);
            })
    }
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

mod bucket;
pub mod local;
mod metrics;
pub mod rate;
pub mod urgency;

#[cfg(test)]
mod tests;
