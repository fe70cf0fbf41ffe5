//! The adaptive rate of one gate bucket: learn the share of an AWS bucket that is left to us.
//!
//! AWS's throttling buckets are per account and region, shared with every other tool in the
//! account (Karpenter, other clusters' VPC CNI, Terraform). The configured rate is only a
//! ceiling; the capacity actually left is learned from the answers, as TCP congestion control
//! and the AWS SDKs' *adaptive* retry mode do. The SDK's client-side rate limiter
//! (`aws-sdk-*` `ClientRateLimiter`, "adaptive" retry mode; Python botocore
//! `retries/adaptive.py`) cuts its fill rate to `beta = 0.7` times the measured send rate on a
//! throttled answer and grows it back along a CUBIC curve `C·(t − K)³ + W_max` with the scale
//! constant `C = 0.4` and a send rate smoothed over half-second bins (smoothing 0.8), never below
//! 0.5 requests per second.
//!
//! We keep the SDK's multiplicative cut (`beta = 0.7`) and replace the time-driven growth by a
//! growth per successful call, as TCP's congestion avoidance grows per acknowledgement:
//!
//! * EC2's mutating buckets refill at 5 requests per second, and a busy account leaves a tenth of
//!   that. CUBIC with `C = 0.4` regains the cut in `K = ∛(W·0.3/0.4)` seconds, about one second
//!   at those rates, i.e. after two or three calls: it would probe (and be throttled) every few
//!   calls. Growing by a fixed fraction per success regains the cut after [`REGAIN_CALLS`]
//!   calls whatever the rate, so throttled answers stay about one per hundred calls at any
//!   share of the account.
//! * Growth needs successes, so a bucket we barely use does not climb back to the ceiling on the
//!   strength of time alone (the SDK caps growth at twice the measured rate for that reason).
//! * One cut per round trip, as TCP cuts once per window: a throttled answer to a call sent
//!   before the last cut says nothing new (the cut had not taken effect yet), so it does not cut
//!   again. Without this, the calls already in flight would each cut the rate.
//!
//! The unused tokens of the AWS bucket absorb the dip after a cut (its burst is 50 to 100
//! calls), so the time below the capacity is not lost.

use tokio::time::Instant;

/// The SDK's multiplicative decrease.
pub const BETA: f64 = 0.7;
/// Successful calls that regain one cut (rate × 1/BETA).
pub const REGAIN_CALLS: f64 = 100.0;
/// The rate never goes below this fraction of the ceiling (the SDK's floor is 0.5 requests per
/// second; relative here because the single Cilium-like bucket and the per-action buckets differ
/// by orders of magnitude).
pub const FLOOR_FRACTION: f64 = 0.01;

/// State of one bucket's adaptive rate (pure: the caller passes the instants).
#[derive(Clone, Debug, PartialEq)]
pub struct RateController {
    ceiling: f64,
    rate: f64,
    /// When the last cut was made: throttled answers to calls sent before it do not cut again.
    last_cut: Option<Instant>,
}

impl RateController {
    /// Starts at the ceiling (calls per second), where the gate behaves as without adaptation.
    pub fn new(ceiling: f64) -> Self {
        let ceiling = if ceiling.is_finite() && ceiling > 0.0 {
            ceiling
        } else {
            1e-3
        };
        Self {
            ceiling,
            rate: ceiling,
            last_cut: None,
        }
    }

    /// A call sent at `sent` was answered "throttled" at `now`: cut the rate, once per round trip.
    /// Returns whether the rate was cut.
    pub fn on_throttle(&mut self, sent: Instant, now: Instant) -> bool {
        if self.last_cut.is_some_and(|cut| sent < cut) {
            return false;
        }
        self.rate = (self.rate * BETA).max(self.floor());
        self.last_cut = Some(now);
        true
    }

    /// A call succeeded: grow the rate by the fraction that regains a cut in [`REGAIN_CALLS`]
    /// successes, up to the ceiling.
    pub fn on_success(&mut self) {
        let step = (1.0 / BETA).powf(1.0 / REGAIN_CALLS);
        self.rate = (self.rate * step).min(self.ceiling);
    }

    /// The rate to pace calls at (calls per second).
    pub fn rate(&self) -> f64 {
        self.rate
    }

    pub fn ceiling(&self) -> f64 {
        self.ceiling
    }

    /// Whether the rate is below the ceiling, i.e. calls must be paced beyond the static limiter.
    pub fn is_limiting(&self) -> bool {
        self.rate < self.ceiling
    }

    fn floor(&self) -> f64 {
        self.ceiling * FLOOR_FRACTION
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9 * b.abs().max(1.0)
    }

    #[tokio::test(start_paused = true)]
    async fn starts_at_the_ceiling_without_limiting() {
        let c = RateController::new(4.0);
        assert_eq!(c.rate(), 4.0);
        assert!(!c.is_limiting());
    }

    #[tokio::test(start_paused = true)]
    async fn a_throttled_answer_cuts_the_rate_by_beta() {
        let mut c = RateController::new(4.0);
        let sent = Instant::now();
        tokio::time::advance(Duration::from_millis(300)).await;
        assert!(c.on_throttle(sent, Instant::now()));
        assert!(close(c.rate(), 2.8), "{}", c.rate());
        assert!(c.is_limiting());
        // A call sent after the cut and throttled again cuts again.
        let sent = Instant::now();
        tokio::time::advance(Duration::from_millis(300)).await;
        assert!(c.on_throttle(sent, Instant::now()));
        assert!(close(c.rate(), 4.0 * 0.7 * 0.7), "{}", c.rate());
    }

    #[tokio::test(start_paused = true)]
    async fn calls_in_flight_at_the_cut_do_not_cut_again() {
        let mut c = RateController::new(4.0);
        let early = Instant::now();
        tokio::time::advance(Duration::from_millis(100)).await;
        let later = Instant::now();
        tokio::time::advance(Duration::from_millis(300)).await;
        assert!(c.on_throttle(early, Instant::now()));
        // `later` was sent before the cut: its answer reflects the old rate.
        assert!(!c.on_throttle(later, Instant::now()));
        assert!(close(c.rate(), 2.8), "{}", c.rate());
    }

    #[tokio::test(start_paused = true)]
    async fn successes_regain_a_cut_after_regain_calls() {
        let mut c = RateController::new(10.0);
        c.on_throttle(Instant::now(), Instant::now());
        assert!(close(c.rate(), 7.0));
        for _ in 0..50 {
            c.on_success();
        }
        // Halfway in calls, geometric: 7 × (1/0.7)^0.5.
        assert!(close(c.rate(), 7.0 / 0.7f64.sqrt()), "{}", c.rate());
        for _ in 0..49 {
            c.on_success();
        }
        assert!(c.is_limiting(), "one call short of regaining the cut");
        c.on_success();
        assert!(close(c.rate(), 10.0), "{}", c.rate());
    }

    #[tokio::test(start_paused = true)]
    async fn growth_stops_at_the_ceiling() {
        let mut c = RateController::new(5.0);
        for _ in 0..1000 {
            c.on_success();
        }
        assert_eq!(c.rate(), 5.0);
        c.on_throttle(Instant::now(), Instant::now());
        for _ in 0..1000 {
            c.on_success();
        }
        assert_eq!(c.rate(), 5.0);
        assert!(!c.is_limiting());
    }

    #[tokio::test(start_paused = true)]
    async fn cuts_stop_at_the_floor() {
        let mut c = RateController::new(4.0);
        for _ in 0..100 {
            let sent = Instant::now();
            tokio::time::advance(Duration::from_millis(1)).await;
            c.on_throttle(sent, Instant::now());
        }
        assert!(close(c.rate(), 4.0 * FLOOR_FRACTION), "{}", c.rate());
    }
}
