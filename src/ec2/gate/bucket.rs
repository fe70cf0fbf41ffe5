//! One bucket of the gate: its governor limiter, throttle penalty and adaptive pacing, and the
//! order in which waiting calls take its slots (see the gate's module docs).

use std::num::NonZeroU32;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use governor::clock::Clock;
use governor::middleware::NoOpMiddleware;
use governor::state::{InMemoryState, NotKeyed};
use governor::{Quota, RateLimiter};
use tokio::time::Instant;

use super::local::LocalBucket;
use super::rate::RateController;
use crate::ec2::model::Operation;

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

/// A throttled call's retry delay and a bucket's penalty never exceed this: the learned rate
/// spaces the calls, so a longer sleep would only outlast the spell that caused it.
pub const THROTTLED_MAX_DELAY: Duration = Duration::from_secs(2);

/// A paced caller looks again at least this often, so that a probe's ramp reaches it.
pub(super) const PACING_RECHECK: Duration = Duration::from_secs(1);

pub(super) struct BucketState {
    limiter: Limiter,
    penalty: Mutex<Penalty>,
    pacing: Mutex<Pacing>,
    /// Mutating callers waiting, by [`Rank`]: a caller yields to those ranked before it.
    waiting: Waiting,
}

/// Where a waiting mutating call stands: calls for a node's first addresses (or pods waiting,
/// [`super::urgency`]) before reserves; under scarcity, within each, calls that complete
/// half-done work before calls that start new work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Rank {
    urgent: bool,
    completes: bool,
}

impl Rank {
    fn index(self) -> usize {
        usize::from(self.urgent) * 2 + usize::from(self.completes)
    }

    /// Whether a caller of this rank lets one of `other` take the next token first.
    fn yields_to(self, other: Rank, scarce: bool) -> bool {
        if self.urgent != other.urgent {
            return other.urgent;
        }
        scarce && !self.completes && other.completes
    }
}

/// Counts of waiting callers per [`Rank`].
#[derive(Debug, Default)]
struct Waiting([AtomicUsize; 4]);

impl Waiting {
    fn any_before(&self, me: Rank, scarce: bool) -> bool {
        [false, true]
            .into_iter()
            .flat_map(|urgent| [false, true].map(|completes| Rank { urgent, completes }))
            .any(|r| me.yields_to(r, scarce) && self.0[r.index()].load(Ordering::Relaxed) > 0)
    }
}

/// Counts a caller as waiting until its wait ends, also when it is cancelled.
struct WaitGuard<'a>(&'a AtomicUsize);

impl<'a> WaitGuard<'a> {
    fn new(count: &'a AtomicUsize) -> Self {
        count.fetch_add(1, Ordering::Relaxed);
        Self(count)
    }
}

impl Drop for WaitGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl BucketState {
    pub(super) fn new(burst: u32, per_sec: f64) -> Self {
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
            waiting: Waiting::default(),
        }
    }

    /// Wait out the penalty, the adaptive pacing (callers ranked before first), then for a
    /// token. Describes neither yield nor are yielded to.
    pub(super) async fn acquire(&self, class: Class, urgent: bool) {
        let rank = (class != Class::Neutral).then_some(Rank {
            urgent,
            completes: class == Class::Completes,
        });
        let _guard = rank.map(|r| WaitGuard::new(&self.waiting.0[r.index()]));
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
                // Completing before starting only under scarcity (the bucket was throttled
                // and is not back at its ceiling); urgent passes first always.
                let scarce = controller.is_limiting();
                let wait = if rank.is_some_and(|r| self.waiting.any_before(r, scarce)) {
                    // Let the callers ranked before take the next slot, then look again.
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
    pub(super) fn throttled(&self, sent: Instant, base: Duration, max: Duration) -> bool {
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
    pub(super) fn succeeded(&self) {
        self.penalty.lock().expect("penalty lock").strikes = 0;
        let mut pacing = self.pacing.lock().expect("pacing lock");
        pacing.controller.on_success(Instant::now());
    }

    pub(super) fn rate(&self) -> f64 {
        let mut p = self.pacing.lock().expect("pacing lock");
        p.controller.advance(Instant::now());
        p.controller.rate()
    }

    /// The current rate and the recoveries not yet counted in the metrics.
    pub(super) fn report(&self) -> (f64, u64) {
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
pub(super) enum Class {
    Starts,
    Completes,
    Neutral,
}

impl Class {
    pub(super) fn of(op: Operation) -> Self {
        if op == Operation::CreateNetworkInterface {
            Class::Starts
        } else if op.is_mutating() {
            Class::Completes
        } else {
            Class::Neutral
        }
    }
}
