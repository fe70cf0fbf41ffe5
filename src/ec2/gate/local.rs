//! The local token bucket of one gate bucket at the learned rate (pure: the caller passes the
//! instants). It refills at the controller's rate, holds the configured burst scaled by the
//! learned share of the ceiling, and is emptied by every throttled answer: tokens saved while
//! the account had nothing to spare must not go out at once when the rate returns, into an AWS
//! bucket that may still be empty.

use std::time::Duration;

use tokio::time::Instant;

#[derive(Clone, Debug, PartialEq)]
pub struct LocalBucket {
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl LocalBucket {
    /// A full bucket of `burst` tokens (the configured burst, at the ceiling).
    pub fn new(burst: u32, now: Instant) -> Self {
        let burst = f64::from(burst.max(1));
        Self {
            burst,
            tokens: burst,
            last: now,
        }
    }

    /// Refill up to `now` at `rate`; the bucket holds `burst × rate / ceiling` (at least one).
    pub fn refill(&mut self, now: Instant, rate: f64, ceiling: f64) {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        let capacity = (self.burst * (rate / ceiling).min(1.0)).max(1.0);
        self.tokens = (self.tokens + elapsed * rate).min(capacity);
        self.last = now;
    }

    /// How long until a token is there at `rate`; `None` when one is there now.
    pub fn wait(&self, rate: f64) -> Option<Duration> {
        // A hair of tolerance absorbs float rounding of the refill.
        let missing = 1.0 - 1e-9 - self.tokens;
        (missing > 0.0).then(|| Duration::from_secs_f64(missing / rate.max(1e-9)))
    }

    pub fn take(&mut self) {
        self.tokens = (self.tokens - 1.0).max(0.0);
    }

    /// A throttled answer: the account's bucket is empty, so is ours.
    pub fn empty(&mut self, now: Instant) {
        self.tokens = 0.0;
        self.last = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn refills_at_the_learned_rate_up_to_the_scaled_burst() {
        let start = Instant::now();
        let mut b = LocalBucket::new(40, start);
        b.empty(start);
        assert!(b.wait(1.0).is_some());
        // At a quarter of the ceiling: one token a second, at most 10 kept.
        b.refill(start + Duration::from_secs(3), 1.0, 4.0);
        for _ in 0..3 {
            assert_eq!(b.wait(1.0), None);
            b.take();
        }
        assert!(b.wait(1.0).is_some());
        b.refill(start + Duration::from_secs(100), 1.0, 4.0);
        let mut n = 0;
        while b.wait(1.0).is_none() {
            b.take();
            n += 1;
        }
        assert_eq!(n, 10, "burst scaled to the learned share");
    }

    #[tokio::test(start_paused = true)]
    async fn a_throttled_answer_empties_it() {
        let start = Instant::now();
        let mut b = LocalBucket::new(40, start);
        b.refill(start, 4.0, 4.0);
        assert_eq!(b.wait(4.0), None);
        b.empty(start);
        assert_eq!(
            b.wait(4.0),
            Some(Duration::from_secs_f64((1.0 - 1e-9) / 4.0))
        );
    }
}
