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
                self.lengthen_interval(now);
                self.reach_ceiling(now);
            } else {
                self.rate = ramp;
            }
        } else if self.next_probe.is_some_and(|at| now >= at) {
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
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9 * b.abs().max(1.0)
    }

    fn secs(s: f64) -> Duration {
        Duration::from_secs_f64(s)
    }

    /// A controller at `ceiling` that sent `n` calls evenly over the last [`MEASURE`] before
    /// `t0`, so the measured rate is `n / 2` per second.
    fn sending(ceiling: f64, n: u32, t0: Instant) -> RateController {
        let mut c = RateController::new(ceiling, t0);
        for i in 0..n {
            c.on_send(t0 - MEASURE + MEASURE * (i + 1) / (n + 1));
        }
        c
    }

    #[test]
    fn starts_at_the_ceiling_without_limiting() {
        let c = RateController::new(4.0, Instant::now());
        assert_eq!(c.rate(), 4.0);
        assert!(!c.is_limiting());
        assert_eq!(c.next_change(Instant::now()), None);
    }

    #[test]
    fn a_throttled_answer_cuts_the_rate_by_beta() {
        let t0 = Instant::now();
        let mut c = sending(4.0, 20, t0);
        assert!(c.on_throttle(t0, t0 + secs(0.3)));
        assert!(close(c.rate(), 2.8), "{}", c.rate());
        assert!(c.is_limiting());
        // A call sent after the cut and throttled again cuts again.
        assert!(c.on_throttle(t0 + secs(0.4), t0 + secs(0.7)));
        assert!(close(c.rate(), 4.0 * 0.7 * 0.7), "{}", c.rate());
    }

    #[test]
    fn a_cut_starts_from_the_measured_send_rate_when_lower() {
        let t0 = Instant::now();
        // One call a second against a ceiling of 4: the cut lands below what was sent.
        let mut c = sending(4.0, 2, t0);
        c.on_send(t0);
        assert!(c.on_throttle(t0, t0 + secs(0.3)));
        assert!(close(c.rate(), 1.5 * BETA), "{}", c.rate());
    }

    #[test]
    fn calls_in_flight_at_the_cut_do_not_cut_again() {
        let t0 = Instant::now();
        let mut c = sending(4.0, 20, t0);
        let later = t0 + secs(0.1);
        assert!(c.on_throttle(t0, t0 + secs(0.4)));
        // `later` was sent before the cut: its answer reflects the old rate.
        assert!(!c.on_throttle(later, t0 + secs(0.4)));
        assert!(close(c.rate(), 2.8), "{}", c.rate());
    }

    #[test]
    fn successes_regain_a_cut_after_regain_calls() {
        let t0 = Instant::now();
        let mut c = sending(10.0, 40, t0);
        c.on_throttle(t0, t0);
        assert!(close(c.rate(), 7.0));
        // Within the first probe's delay: only the successes move the rate.
        let t = t0 + secs(1.0);
        for _ in 0..50 {
            c.on_success(t);
        }
        // Halfway in calls, geometric: 7 × (1/0.7)^0.5.
        assert!(close(c.rate(), 7.0 / 0.7f64.sqrt()), "{}", c.rate());
        for _ in 0..49 {
            c.on_success(t);
        }
        assert!(c.is_limiting(), "one call short of regaining the cut");
        c.on_success(t);
        assert!(close(c.rate(), 10.0), "{}", c.rate());
        assert_eq!(c.next_change(t), None, "no probe due at the ceiling");
    }

    #[test]
    fn a_throttled_answer_after_a_steady_stretch_cuts_shallow_and_regains_in_regain_calls() {
        let t0 = Instant::now();
        let mut c = sending(10.0, 40, t0);
        c.on_throttle(t0, t0);
        assert!(
            close(c.rate(), 7.0),
            "a fresh controller cuts deep: {}",
            c.rate()
        );
        // Within the first probe's delay: only the cuts and successes move the rate.
        let t = t0 + secs(1.0);
        for _ in 0..STEADY_CALLS {
            c.on_success(t);
        }
        let before = c.rate();
        let t = t0 + secs(1.5);
        // Sent at the learned rate or above: the cut starts from the rate.
        for _ in 0..20 {
            c.on_send(t);
        }
        assert!(c.on_throttle(t, t));
        // 0.9x, not the SDK's 0.7x: the dip under the share stays small.
        assert!(
            close(c.rate(), before * 0.9),
            "a steady stretch ends with a shallow cut: {} from {before}",
            c.rate()
        );
        // The cut is regained in as many successes as a deep one.
        for _ in 0..99 {
            c.on_success(t);
        }
        assert!(c.rate() < before, "one call short: {}", c.rate());
        c.on_success(t);
        assert!(close(c.rate(), before), "{} vs {before}", c.rate());
        // Another steady stretch ends: shallow again; a call sent after that cut and throttled
        // too means the share fell: cut deep.
        let t = t0 + secs(1.8);
        c.on_send(t);
        assert!(c.on_throttle(t, t));
        assert!(close(c.rate(), before * BETA_STEADY), "{}", c.rate());
        let shallow = c.rate();
        let t = t0 + secs(1.9);
        c.on_send(t);
        assert!(c.on_throttle(t, t));
        assert!(
            close(c.rate(), shallow * BETA),
            "{} from {shallow}",
            c.rate()
        );
    }

    #[test]
    fn growth_stops_at_the_ceiling() {
        let t0 = Instant::now();
        let mut c = sending(5.0, 20, t0);
        for _ in 0..1000 {
            c.on_success(t0);
        }
        assert_eq!(c.rate(), 5.0);
        c.on_throttle(t0, t0);
        for _ in 0..1000 {
            c.on_success(t0 + secs(1.0));
        }
        assert_eq!(c.rate(), 5.0);
        assert!(!c.is_limiting());
    }

    #[test]
    fn cuts_stop_at_the_floor() {
        let t0 = Instant::now();
        let mut c = sending(4.0, 20, t0);
        for i in 0..100 {
            let t = t0 + secs(f64::from(i) * 0.001);
            c.on_throttle(t, t);
        }
        assert!(close(c.rate(), 4.0 * FLOOR_FRACTION), "{}", c.rate());
    }

    /// Cut to the floor at `t0` (as in a spell), with the first probe due at `t0 + 2 s`.
    fn at_the_floor(ceiling: f64, t0: Instant) -> RateController {
        let mut c = sending(ceiling, 20, t0);
        for i in 0..40 {
            let t = t0 + secs(f64::from(i) * 0.001);
            c.on_throttle(t, t);
        }
        assert!(close(c.rate(), ceiling * FLOOR_FRACTION), "{}", c.rate());
        c
    }

    #[test]
    fn a_probe_two_seconds_after_a_cut_ramps_to_the_ceiling_doubling_each_second() {
        let t0 = Instant::now();
        let mut c = at_the_floor(4.0, t0);
        // Later cuts did not put off the probe due 2 s after the first.
        assert_eq!(c.next_change(t0), Some(FIRST_PROBE));
        c.advance(t0 + secs(1.9));
        assert!(close(c.rate(), 0.04), "no probe before its time");
        let start = t0 + FIRST_PROBE;
        c.advance(start);
        c.advance(start + secs(3.0));
        assert!(close(c.rate(), 0.04 * 8.0), "{}", c.rate());
        // 0.04 × 2^t reaches 4 after log2(100) = 6.64 s.
        c.advance(start + secs(6.6));
        assert!(c.is_limiting());
        c.advance(start + secs(6.7));
        assert_eq!(c.rate(), 4.0);
        assert_eq!(c.recoveries(), 1);
        assert_eq!(c.next_change(start + secs(7.0)), None);
    }

    #[test]
    fn a_throttled_answer_during_the_probe_returns_to_the_saved_rate_and_doubles_the_interval() {
        // A ceiling of 400: the floor (4/s) is above a cut of what the probe sent (0.5/s).
        let t0 = Instant::now();
        let mut c = at_the_floor(400.0, t0);
        let mut probe = t0 + FIRST_PROBE;
        let mut interval = FIRST_PROBE;
        let mut delays = Vec::new();
        for _ in 0..23 {
            c.advance(probe);
            let t = probe + secs(2.0);
            c.advance(t);
            assert!(close(c.rate(), 16.0), "ramping: {}", c.rate());
            assert!(c.on_throttle(t, t + secs(0.3)));
            assert!(close(c.rate(), 4.0), "back to the saved rate: {}", c.rate());
            let next = c.next_change(t + secs(0.3)).expect("a probe is due");
            delays.push(next.as_secs());
            let early = t + secs(0.3) < t0 + EARLY_PHASE;
            let cap = if early {
                EARLY_INTERVAL
            } else {
                MAX_PROBE_INTERVAL
            };
            interval = (interval * 2).min(cap);
            assert_eq!(next, interval);
            probe = t + secs(0.3) + next;
        }
        // A probe every 10.3 s (8 s and the 2.3 s ramp) until the early phase is over.
        let mut expected = vec![4];
        expected.extend([8; 14]);
        expected.extend([16, 32, 64, 128, 256, 512, 600, 600]);
        assert_eq!(
            delays, expected,
            "doubling up to 8 s in the early phase, then up to the cap"
        );
        assert_eq!(c.recoveries(), 0);
    }

    /// Drives `c` from `t0` until `end`, in steps of 50 ms: the account leaves `left(t)` calls
    /// a second, and a rate above it is answered "throttled" (one answer per step); with
    /// `succeed`, calls at a rate within it are sent and succeed. Returns when the rate reached
    /// the ceiling after `from`, and the rate changes by throttled answers.
    fn drive(
        c: &mut RateController,
        t0: Instant,
        (from, end): (Duration, Duration),
        succeed: bool,
        left: impl Fn(Duration) -> f64,
    ) -> (Option<Duration>, u32) {
        let mut cuts = 0;
        let mut credit = 0.0;
        let mut t = Duration::ZERO;
        while t < end {
            c.advance(t0 + t);
            if c.rate() > left(t) {
                if c.on_throttle(t0 + t, t0 + t) {
                    cuts += 1;
                }
            } else if succeed {
                credit += c.rate() * 0.05;
                while credit >= 1.0 {
                    credit -= 1.0;
                    c.on_send(t0 + t);
                    c.on_success(t0 + t);
                }
            }
            if t >= from && !c.is_limiting() {
                return (Some(t), cuts);
            }
            t += secs(0.05);
        }
        (None, cuts)
    }

    #[test]
    fn a_spell_of_two_minutes_is_found_over_within_seconds() {
        // Another tenant leaves 10 % of the ceiling for D; the rate must be back at the ceiling
        // within the early interval and the ramp after the end, wherever the end falls.
        for d in [20.0, 60.0, 95.0, 120.0, 133.0] {
            let t0 = Instant::now();
            let mut c = at_the_floor(5.0, t0);
            let end = secs(d);
            let (back, _) = drive(&mut c, t0, (end, end + secs(60.0)), true, |t| {
                if t < end { 0.5 } else { 5.0 }
            });
            let back = back.expect("back at the ceiling");
            assert!(
                back - end <= EARLY_INTERVAL + secs(4.0),
                "a spell of {d} s: back {:?} after its end",
                back - end
            );
        }
    }

    #[test]
    fn a_share_held_for_an_hour_costs_few_failed_probes() {
        // The early phase costs its probes once; after it the interval doubles to the cap.
        let t0 = Instant::now();
        let mut c = at_the_floor(5.0, t0);
        let (back, cuts) = drive(&mut c, t0, (secs(0.0), secs(3600.0)), false, |_| 0.5);
        assert_eq!(back, None);
        assert!(cuts <= 30, "{cuts} failed probes in an hour");
    }

    #[test]
    fn a_probe_throttled_below_the_ceiling_keeps_a_cut_of_what_it_sent() {
        // A tenant took 90 % and now takes half: the ramp finds the new share.
        let t0 = Instant::now();
        let mut c = at_the_floor(5.0, t0);
        let start = t0 + FIRST_PROBE;
        c.advance(start);
        // Three calls a second went through the ramp's last two seconds.
        for i in 0..6 {
            c.on_send(start + secs(4.1 + f64::from(i) / 3.0));
        }
        let t = start + secs(6.0);
        assert!(c.on_throttle(t, t));
        assert!(close(c.rate(), 3.0 * BETA), "{}", c.rate());
        assert_eq!(c.next_change(t), Some(FIRST_PROBE * 2));
    }

    #[test]
    fn a_probe_failing_at_the_level_of_the_last_returns_to_the_saved_rate() {
        // A steady share of 0.5/s: each ramp spends the few tokens the account's bucket saved
        // and is throttled at about the same send rate as the last. A cut of that rate would
        // sit above the share and cost two more throttled answers each time.
        let t0 = Instant::now();
        let mut c = at_the_floor(4.0, t0);
        let mut probe = t0 + FIRST_PROBE;
        for i in 0..4 {
            c.advance(probe);
            let saved = c.rate();
            // Three calls went through the ramp's last two seconds: 1.5/s, three times the share.
            for i in 0..3 {
                c.on_send(probe + secs(0.5 + f64::from(i) * 0.6));
            }
            let t = probe + secs(2.0);
            c.advance(t);
            assert!(c.on_throttle(t, t));
            if i == 0 {
                // The first failure has none to compare with: a cut of what it sent.
                assert!(close(c.rate(), 1.5 * BETA), "{}", c.rate());
            } else {
                assert!(
                    close(c.rate(), saved),
                    "back to the saved rate {saved}, not {}",
                    c.rate()
                );
            }
            // The rate above the share is cut before the next probe.
            let cut = t + secs(1.0);
            c.on_send(cut);
            assert!(c.on_throttle(cut, cut));
            probe = cut + c.next_change(cut).expect("a probe is due");
        }
    }

    #[test]
    fn two_minutes_at_the_ceiling_reset_the_interval() {
        let t0 = Instant::now();
        let mut c = at_the_floor(4.0, t0);
        // One failed probe: the next is 4 s after it.
        c.advance(t0 + secs(2.0));
        c.on_throttle(t0 + secs(2.5), t0 + secs(3.0));
        // The second succeeds.
        let start = t0 + secs(7.0);
        c.advance(start);
        c.advance(start + secs(7.0));
        assert!(!c.is_limiting());
        // Cut again soon after: the ceiling was reached but not held, so the interval doubled
        // as after a failed probe.
        let t = start + secs(60.0);
        c.on_throttle(t, t);
        assert_eq!(c.next_change(t), Some(secs(8.0)));
        // Recovered and held for two minutes: back to the first interval.
        let start = t + secs(8.0);
        c.advance(start);
        c.advance(start + secs(4.0));
        assert!(!c.is_limiting());
        c.advance(start + secs(4.0) + RESET_AFTER);
        let t = start + secs(200.0);
        c.on_throttle(t, t);
        assert_eq!(c.next_change(t), Some(FIRST_PROBE));
    }
}
