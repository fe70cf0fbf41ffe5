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
//! * A cut starts from the rate actually sent (measured over [`MEASURE`]) when that is below the
//!   learned rate, as the SDK's does: at low demand a cut of an unused rate would change nothing.
//! * Two depths of cut. A throttled answer after a steady stretch ([`STEADY_CALLS`] successes
//!   since the last cut) means the rate has just crept above the share left: a shallow cut
//!   ([`BETA_STEADY`]) keeps the dip below the share small, so a 30-s window still gets 90 % of
//!   it. A throttled answer sooner means the share fell: [`BETA`], to find it in a few round
//!   trips. Either cut is regained in [`REGAIN_CALLS`] successes, so a steady share costs about
//!   one throttled answer per two hundred calls whatever the depth (a hundred below the share,
//!   about as many above it while the account's bucket gives back what the dip left).
//!
//! Growth per success alone is slow to notice that a spell of another tenant is over: near the
//! floor a hundred successes take minutes. So a *restore probe* runs on an exponential schedule
//! (as TCP's retransmission backoff): [`FIRST_PROBE`] after a cut from the ceiling, the rate is
//! saved and ramps to the ceiling, doubling every second; a throttled answer during the ramp
//! returns to the saved rate and doubles the interval (up to [`MAX_PROBE_INTERVAL`]); reaching
//! the ceiling ends the probe (and doubles the interval too, in case a steady tenant's share
//! only lent the ramp the bucket's saved tokens), and [`RESET_AFTER`] held there resets the
//! interval. In a steady
//! share of the account the probes fail a few times, each costing the answers in flight, and then
//! become rare; after a spell the rate is back at the ceiling within the current interval plus a
//! few seconds of ramp.
//!
//! Nothing we see tells a spell from a steady share: at the learned rate both answer with
//! successes, and only a probe finds the spell over. Left to double, the interval is as long as
//! the spell so far, so a two-minute spell would wait a minute more. Another tenant's spells (a
//! fleet launch, an apply) mostly last seconds to a couple of minutes, a steady share much
//! longer; so for the first [`EARLY_PHASE`] below the ceiling the interval stops doubling at
//! [`EARLY_INTERVAL`], and doubles on from there after. A share held for an hour pays a dozen
//! more failed probes in its first minutes, once.
//!
//! What a failed probe sent tells a steady share from a larger one. In a steady share every
//! ramp spends the few tokens the account's bucket saved and is throttled at about the same
//! send rate; a cut of that rate would still sit above the share and cost two more throttled
//! answers per probe, so the rate returns to the saved one. A probe throttled at more than
//! [`GROWN`] times the lowest send rate any probe failed at since the rate left the ceiling
//! found a larger share (the tenant takes less, without leaving the ceiling to us), and the
//! first failed probe has none to compare with: the rate keeps a cut of what it sent, and the
//! share is found at once, not by successes.
//!
//! A probe after a long interval can reach the ceiling on the tokens the account's bucket saved
//! meanwhile, and find it empty a round trip later. A throttled answer within the probe's own
//! duration (at least [`MEASURE`]) after it reached the ceiling fails that probe: the rate
//! returns to its saved rate, not down a chain of cuts from the ceiling, one per round trip.
//!
//! The unused tokens of the AWS bucket absorb the dip after a cut (its burst is 50 to 100
//! calls), so the time below the capacity is not lost.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

/// The SDK's multiplicative decrease.
pub const BETA: f64 = 0.7;
/// Successful calls that regain one cut (rate × 1/BETA).
pub const REGAIN_CALLS: f64 = 100.0;
/// The cut of a throttled answer that ends a steady stretch ([`STEADY_CALLS`] successes since
/// the last cut): the rate was just above the share left, so a shallow cut keeps the dip small.
/// The calls per cycle (and so the throttled answers per call) do not depend on the depth: the
/// growth per success regains a cut in [`REGAIN_CALLS`] calls, whatever the cut.
pub const BETA_STEADY: f64 = 0.9;
/// Successes since the last cut after which a throttled answer ends a steady stretch; fewer
/// mean the share fell, and the cut is [`BETA`] to find it within a few round trips.
pub const STEADY_CALLS: u32 = 50;
/// The rate never goes below this fraction of the ceiling (the SDK's floor is 0.5 requests per
/// second; relative here because the single Cilium-like bucket and the per-action buckets differ
/// by orders of magnitude).
pub const FLOOR_FRACTION: f64 = 0.01;
/// The send rate a cut starts from is measured over this window.
pub const MEASURE: Duration = Duration::from_secs(2);
/// The first probe after a cut from the ceiling (and after a reset).
pub const FIRST_PROBE: Duration = Duration::from_secs(2);
/// The probe interval doubles on each failed probe up to this.
pub const MAX_PROBE_INTERVAL: Duration = Duration::from_secs(600);
/// Held at the ceiling this long, the probe interval starts again from [`FIRST_PROBE`].
pub const RESET_AFTER: Duration = Duration::from_secs(120);
/// For this long after the rate first left the ceiling, the probe interval doubles only up to
/// [`EARLY_INTERVAL`]: a spell of up to two minutes is found over within that and the ramp.
pub const EARLY_PHASE: Duration = Duration::from_secs(150);
/// The longest probe interval within [`EARLY_PHASE`].
pub const EARLY_INTERVAL: Duration = Duration::from_secs(8);

/// A failed probe that sent more than this times the lowest send rate a probe failed at (since
/// the rate left the ceiling) found a larger share. The send rate is counted over [`MEASURE`]
/// in whole calls, so a steady share's failures differ by up to this ratio at EC2's mutating
/// rates (two or three calls in two seconds).
pub const GROWN: f64 = 1.5;

/// A restore probe under way: the rate ramps from `saved`, doubling every second from `start`.
#[derive(Clone, Debug, PartialEq)]
struct Probe {
    start: Instant,
    saved: f64,
}

/// A probe that reached the ceiling: a throttled answer until `until` means it rode on the
/// tokens the account's bucket had saved, and it failed after all.
#[derive(Clone, Debug, PartialEq)]
struct Reached {
    until: Instant,
    saved: f64,
    lowest_failure: Option<f64>,
}

/// State of one bucket's adaptive rate (pure: the caller passes the instants).
#[derive(Clone, Debug, PartialEq)]
pub struct RateController {
    ceiling: f64,
    rate: f64,
    /// When the last cut was made: throttled answers to calls sent before it do not cut again.
    last_cut: Option<Instant>,
    /// Instants of the calls sent within the last [`MEASURE`].
    sent: VecDeque<Instant>,
    probe: Option<Probe>,
    /// When the next probe starts; `None` at the ceiling.
    next_probe: Option<Instant>,
    interval: Duration,
    /// Since when the rate is at the ceiling; `None` below it.
    at_ceiling_since: Option<Instant>,
    /// When the rate first left the ceiling since the interval was last reset.
    limited_since: Option<Instant>,
    /// Probes that reached the ceiling.
    recoveries: u64,
    /// The lowest send rate a probe failed at since the rate left the ceiling.
    lowest_failure: Option<f64>,
    /// The last probe that reached the ceiling, while a throttled answer still fails it.
    reached: Option<Reached>,
    /// Successful calls since the last cut (saturating); a new controller has seen none, so
    /// its first cut is a deep one.
    since_cut: u32,
    /// The growth factor per success: regains the last cut in [`REGAIN_CALLS`] successes.
    step: f64,
}

impl RateController {
    /// Starts at the ceiling (calls per second), where the gate behaves as without adaptation.
    pub fn new(ceiling: f64, now: Instant) -> Self {
        let ceiling = if ceiling.is_finite() && ceiling > 0.0 {
            ceiling
        } else {
            1e-3
        };
        Self {
            ceiling,
            rate: ceiling,
            last_cut: None,
            sent: VecDeque::new(),
            probe: None,
            next_probe: None,
            interval: FIRST_PROBE,
            at_ceiling_since: Some(now),
            limited_since: None,
            recoveries: 0,
            lowest_failure: None,
            reached: None,
            since_cut: 0,
            step: regain_step(BETA),
        }
    }

    /// Moves the time-driven part (probe start, ramp, interval reset) to `now`.
    pub fn advance(&mut self, now: Instant) {
        if let Some(p) = &self.probe {
            let ramp = p.saved * 2f64.powf(now.saturating_duration_since(p.start).as_secs_f64());
            if ramp >= self.ceiling {
                self.recoveries += 1;
                // The ceiling is reached, not yet held: the account's bucket may have lent the
                // ramp its saved tokens. Until [`RESET_AFTER`] at the ceiling, the next probe
                // comes later, as after a failed one.
                let reached = Reached {
                    until: now + now.saturating_duration_since(p.start).max(MEASURE),
                    saved: p.saved,
                    lowest_failure: self.lowest_failure,
                };
                self.lengthen_interval(now);
                self.reach_ceiling(now);
                self.reached = Some(reached);
            } else {
                self.rate = ramp;
            }
        } else if self.next_probe.is_some_and(|at| now >= at)
            && !crate::mutants::active("growth-only-by-successes")
        {
            self.next_probe = None;
            self.probe = Some(Probe {
                start: now,
                saved: self.rate,
            });
        }
        if self
            .at_ceiling_since
            .is_some_and(|since| now.saturating_duration_since(since) >= RESET_AFTER)
        {
            self.interval = FIRST_PROBE;
            self.limited_since = None;
        }
    }

    /// A call was sent at `now` (measured for the cuts).
    pub fn on_send(&mut self, now: Instant) {
        while self
            .sent
            .front()
            .is_some_and(|t| now.saturating_duration_since(*t) >= MEASURE)
        {
            self.sent.pop_front();
        }
        self.sent.push_back(now);
    }

    /// A call sent at `sent` was answered "throttled" at `now`: cut the rate, once per round
    /// trip; during a probe, return to the saved rate and probe later. Returns whether the rate
    /// changed.
    pub fn on_throttle(&mut self, sent: Instant, now: Instant) -> bool {
        self.advance(now);
        if self.last_cut.is_some_and(|cut| sent < cut) {
            return false;
        }
        self.last_cut = Some(now);
        self.at_ceiling_since = None;
        self.limited_since.get_or_insert(now);
        let steady = self.since_cut >= STEADY_CALLS;
        self.since_cut = 0;
        if let Some(r) = self.reached.take().filter(|r| now <= r.until) {
            // The ramp spent the account's saved tokens and the bucket is empty: at the
            // ceiling, a chain of cuts (one per round trip) would follow. A failed probe.
            self.rate = r.saved;
            self.lowest_failure = r.lowest_failure;
            self.next_probe = Some(now + self.interval);
            return true;
        }
        if let Some(p) = self.probe.take() {
            let sent = self.measured(now);
            // No failure to compare with yet: the cuts before the first probe may have gone
            // below the share, and what the ramp sent is the best measure of it.
            let grown = self.lowest_failure.is_none_or(|low| sent > low * GROWN);
            self.rate = if grown {
                p.saved.max(sent.min(self.ceiling) * BETA)
            } else {
                p.saved
            };
            self.lowest_failure = Some(self.lowest_failure.map_or(sent, |low| low.min(sent)));
            self.lengthen_interval(now);
            self.next_probe = Some(now + self.interval);
            return true;
        }
        let measured = self.measured(now);
        let beta = if steady { BETA_STEADY } else { BETA };
        self.step = regain_step(beta);
        self.rate = (self.rate.min(measured) * beta).max(self.floor());
        // Only the first cut below the ceiling schedules a probe: later cuts must not put off
        // the one already due.
        self.next_probe.get_or_insert(now + self.interval);
        true
    }

    /// A call succeeded at `now`: grow the rate by the fraction that regains a cut in
    /// [`REGAIN_CALLS`] successes, up to the ceiling. During a probe, time drives the rate.
    pub fn on_success(&mut self, now: Instant) {
        self.advance(now);
        self.since_cut = self.since_cut.saturating_add(1);
        if self.probe.is_some() || self.at_ceiling_since.is_some() {
            return;
        }
        self.rate *= self.step;
        if self.rate >= self.ceiling {
            self.reach_ceiling(now);
        }
    }

    /// The rate to pace calls at (calls per second), as of the last `advance`.
    pub fn rate(&self) -> f64 {
        self.rate
    }

    pub fn ceiling(&self) -> f64 {
        self.ceiling
    }

    /// Whether the rate is below the ceiling, i.e. the account has less than the configured rate.
    pub fn is_limiting(&self) -> bool {
        self.rate < self.ceiling
    }

    /// Probes that took the rate back to the ceiling so far.
    pub fn recoveries(&self) -> u64 {
        self.recoveries
    }

    /// How long until the time-driven part may change the rate (a probe due or under way).
    pub fn next_change(&self, now: Instant) -> Option<Duration> {
        if self.probe.is_some() {
            return Some(Duration::ZERO);
        }
        self.next_probe.map(|at| at.saturating_duration_since(now))
    }

    /// After a probe: double the interval, up to [`EARLY_INTERVAL`] within [`EARLY_PHASE`] of
    /// the rate leaving the ceiling, up to [`MAX_PROBE_INTERVAL`] after.
    fn lengthen_interval(&mut self, now: Instant) {
        let early = self
            .limited_since
            .is_some_and(|since| now.saturating_duration_since(since) < EARLY_PHASE);
        let cap = if early {
            EARLY_INTERVAL
        } else {
            MAX_PROBE_INTERVAL
        };
        self.interval = (self.interval * 2).min(cap);
    }

    fn reach_ceiling(&mut self, now: Instant) {
        self.rate = self.ceiling;
        self.lowest_failure = None;
        self.reached = None;
        self.probe = None;
        self.next_probe = None;
        self.at_ceiling_since = Some(now);
    }

    /// Calls per second sent within the last [`MEASURE`] (the throttled call included).
    fn measured(&self, now: Instant) -> f64 {
        let recent = self
            .sent
            .iter()
            .filter(|t| now.saturating_duration_since(**t) < MEASURE)
            .count()
            .max(1);
        recent as f64 / MEASURE.as_secs_f64()
    }

    fn floor(&self) -> f64 {
        self.ceiling * FLOOR_FRACTION
    }
}

/// The growth per success that regains a cut by `beta` in [`REGAIN_CALLS`] successes.
fn regain_step(beta: f64) -> f64 {
    (1.0 / beta).powf(1.0 / REGAIN_CALLS)
}

#[cfg(test)]
mod tests;
