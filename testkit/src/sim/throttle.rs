//! AWS-style request throttling: one token bucket per [`Bucket`], refilled continuously. A
//! throttled request takes no token (AWS's model). Driven by tokio time so tests can run under
//! `tokio::time::pause()` without waiting.
//!
//! AWS's buckets are per account and region, shared by every caller in the account (other
//! clusters' CNI, Karpenter, Terraform; AWS EC2 API reference, "Request throttling"). The
//! *other tenant* models them: another caller draining each bucket at a share of its refill.
//! Its steady trickle of calls takes its tokens as they come, so only `1 − share` of the refill
//! is left to the operator (the burst is there at the start, as after a quiet period).
//!
//! A *spell* ([`Spell`]) is that tenant's busy time scheduled ahead (a fleet launch, a nightly
//! Terraform apply): at its start it takes every token left and a larger share of the refill,
//! at its end the steady share is back. Scheduled, so a separate process (ec2-sim) plays it at
//! the right moment without a driver calling in.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;

use eni_operator::ec2::model::Bucket;

#[derive(Clone, Debug)]
struct TokenBucket {
    burst: f64,
    per_second: f64,
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    fn new(burst: u32, per_second: u32, now: Instant) -> Self {
        Self {
            burst: f64::from(burst),
            per_second: f64::from(per_second),
            tokens: f64::from(burst),
            last: now,
        }
    }

    fn try_take(&mut self, now: Instant, other_share: f64) -> bool {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        let ours = self.per_second * (1.0 - other_share);
        self.tokens = (self.tokens + elapsed * ours).min(self.burst);
        self.last = now;
        // A hair of tolerance absorbs float rounding of the refill.
        if self.tokens >= 1.0 - 1e-9 {
            self.tokens = (self.tokens - 1.0).max(0.0);
            true
        } else {
            false
        }
    }
}

/// Another tenant's spell: from `start` it empties every bucket and takes `share` of every
/// refill until `start + length`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Spell {
    pub start: Instant,
    pub length: Duration,
    pub share: f64,
}

/// The account's buckets; `None` when throttling is disabled.
#[derive(Clone, Debug)]
pub(crate) struct Throttle {
    buckets: Option<BTreeMap<Bucket, TokenBucket>>,
    /// Share of every bucket's refill the other tenant uses (0 to 1).
    other_share: f64,
    /// A spell scheduled or under way (its start passed: `started`).
    spell: Option<(Spell, bool)>,
}

impl Throttle {
    /// AWS's documented buckets (`Bucket::aws_default`), all full.
    pub(crate) fn aws_default(now: Instant) -> Self {
        let buckets = Bucket::ALL
            .iter()
            .map(|&b| {
                let (burst, rate) = b.aws_default();
                (b, TokenBucket::new(burst, rate, now))
            })
            .collect();
        Self {
            buckets: Some(buckets),
            other_share: 0.0,
            spell: None,
        }
    }

    pub(crate) fn disabled() -> Self {
        Self {
            buckets: None,
            other_share: 0.0,
            spell: None,
        }
    }

    /// The share the other tenant takes now (its spell's while one is under way).
    fn share(&self) -> f64 {
        match self.spell {
            Some((spell, true)) => spell.share,
            _ => self.other_share,
        }
    }

    /// Refill every bucket up to `at` at the share in force.
    fn refill_all(&mut self, at: Instant) {
        let share = self.share();
        if let Some(buckets) = &mut self.buckets {
            for b in buckets.values_mut() {
                let elapsed = at.saturating_duration_since(b.last).as_secs_f64();
                b.tokens = (b.tokens + elapsed * b.per_second * (1.0 - share)).min(b.burst);
                b.last = b.last.max(at);
            }
        }
    }

    /// Play the spell's start and end if `now` has passed them.
    fn advance(&mut self, now: Instant) {
        let Some((spell, started)) = self.spell else {
            return;
        };
        if !started && now >= spell.start {
            self.refill_all(spell.start);
            self.spell = Some((spell, true));
            self.empty(spell.start);
        }
        let end = spell.start + spell.length;
        if now >= end {
            self.refill_all(end);
            self.spell = None;
        }
    }

    /// Another tenant of the account uses `share` of every bucket's refill from now on (after
    /// a spell under way, if any).
    pub(crate) fn set_other_tenant(&mut self, share: f64, now: Instant) {
        // Refill up to now at the old share first.
        self.advance(now);
        self.refill_all(now);
        self.other_share = share.clamp(0.0, 1.0);
    }

    /// Schedule a spell of the other tenant (replacing one not over yet).
    pub(crate) fn set_spell(&mut self, spell: Spell, now: Instant) {
        self.advance(now);
        self.refill_all(now);
        let spell = Spell {
            share: spell.share.clamp(0.0, 1.0),
            ..spell
        };
        self.spell = Some((spell, false));
        self.advance(now);
    }

    /// Another caller's burst (a fleet launch, a Terraform apply) takes every token left in
    /// every bucket now; they refill from empty.
    pub(crate) fn empty(&mut self, now: Instant) {
        if let Some(buckets) = &mut self.buckets {
            for b in buckets.values_mut() {
                b.tokens = 0.0;
                b.last = now;
            }
        }
    }

    /// Replace one bucket (full), enabling throttling with AWS defaults for the others.
    pub(crate) fn set(&mut self, bucket: Bucket, burst: u32, per_second: u32, now: Instant) {
        let buckets = self
            .buckets
            .get_or_insert_with(|| Self::aws_default(now).buckets.unwrap_or_default());
        buckets.insert(bucket, TokenBucket::new(burst, per_second, now));
    }

    /// Take a token from `bucket`; false means answer `RequestLimitExceeded`.
    pub(crate) fn try_take(&mut self, bucket: Bucket, now: Instant) -> bool {
        self.advance(now);
        let share = self.share();
        match &mut self.buckets {
            None => true,
            Some(buckets) => buckets
                .get_mut(&bucket)
                .is_none_or(|b| b.try_take(now, share)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(t: &mut Throttle, bucket: Bucket) -> u32 {
        let mut n = 0;
        while t.try_take(bucket, Instant::now()) {
            n += 1;
            assert!(n < 10_000, "bucket never empties");
        }
        n
    }

    #[tokio::test(start_paused = true)]
    async fn burst_then_refill_at_the_documented_rate() {
        let mut t = Throttle::aws_default(Instant::now());
        assert_eq!(drain(&mut t, Bucket::CreateNetworkInterface), 100);
        // The other buckets are independent.
        assert_eq!(drain(&mut t, Bucket::AttachNetworkInterface), 50);
        assert_eq!(drain(&mut t, Bucket::DescribeSubnets), 100);
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(drain(&mut t, Bucket::CreateNetworkInterface), 10);
        assert_eq!(drain(&mut t, Bucket::AttachNetworkInterface), 10);
        assert_eq!(drain(&mut t, Bucket::DescribeSubnets), 40);
        tokio::time::advance(Duration::from_millis(199)).await;
        assert_eq!(drain(&mut t, Bucket::CreateNetworkInterface), 0);
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(drain(&mut t, Bucket::CreateNetworkInterface), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn refill_is_capped_at_the_burst() {
        let mut t = Throttle::aws_default(Instant::now());
        drain(&mut t, Bucket::DeleteNetworkInterface);
        tokio::time::advance(Duration::from_secs(3600)).await;
        assert_eq!(drain(&mut t, Bucket::DeleteNetworkInterface), 100);
    }

    #[tokio::test(start_paused = true)]
    async fn another_tenant_leaves_the_rest_of_the_refill() {
        let mut t = Throttle::aws_default(Instant::now());
        t.set_other_tenant(0.7, Instant::now());
        // The burst is there at the start.
        assert_eq!(drain(&mut t, Bucket::CreateNetworkInterface), 100);
        assert_eq!(drain(&mut t, Bucket::DescribeSubnets), 100);
        // 30 % of 5/s and 20/s is left: 1.5/s and 6/s.
        tokio::time::advance(Duration::from_secs(10)).await;
        assert_eq!(drain(&mut t, Bucket::CreateNetworkInterface), 15);
        assert_eq!(drain(&mut t, Bucket::DescribeSubnets), 60);
        // The tenant leaves: the whole refill is ours again.
        t.set_other_tenant(0.0, Instant::now());
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(drain(&mut t, Bucket::CreateNetworkInterface), 10);
    }

    #[tokio::test(start_paused = true)]
    async fn another_callers_burst_empties_every_bucket() {
        let mut t = Throttle::aws_default(Instant::now());
        t.set_other_tenant(0.5, Instant::now());
        t.empty(Instant::now());
        assert_eq!(drain(&mut t, Bucket::CreateNetworkInterface), 0);
        assert_eq!(drain(&mut t, Bucket::DescribeSubnets), 0);
        // They refill from empty at the share left: 2.5/s and 10/s.
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(drain(&mut t, Bucket::CreateNetworkInterface), 5);
        assert_eq!(drain(&mut t, Bucket::DescribeSubnets), 20);
    }

    #[tokio::test(start_paused = true)]
    async fn configured_bucket_and_disabled_throttle() {
        let mut t = Throttle::disabled();
        assert_eq!(
            (0..1000)
                .filter(|_| t.try_take(Bucket::DescribeSubnets, Instant::now()))
                .count(),
            1000
        );
        t.set(Bucket::DescribeSubnets, 3, 1, Instant::now());
        assert_eq!(drain(&mut t, Bucket::DescribeSubnets), 3);
        // Setting one bucket enables the AWS defaults for the rest.
        assert_eq!(drain(&mut t, Bucket::AttachNetworkInterface), 50);
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(drain(&mut t, Bucket::DescribeSubnets), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_spell_empties_the_buckets_takes_its_share_then_leaves() {
        let mut t = Throttle::aws_default(Instant::now());
        t.set_other_tenant(0.5, Instant::now());
        t.set_spell(
            Spell {
                start: Instant::now() + Duration::from_secs(10),
                length: Duration::from_secs(20),
                share: 0.9,
            },
            Instant::now(),
        );
        // Before it: the burst, then half the refill.
        assert_eq!(drain(&mut t, Bucket::CreateNetworkInterface), 100);
        tokio::time::advance(Duration::from_secs(4)).await;
        assert_eq!(drain(&mut t, Bucket::CreateNetworkInterface), 10);
        // It starts at 10 s: what was left is gone, a tenth of the refill is ours.
        tokio::time::advance(Duration::from_secs(8)).await;
        assert_eq!(drain(&mut t, Bucket::CreateNetworkInterface), 1);
        assert_eq!(drain(&mut t, Bucket::AttachNetworkInterface), 1);
        tokio::time::advance(Duration::from_secs(10)).await;
        assert_eq!(drain(&mut t, Bucket::CreateNetworkInterface), 5);
        // It ends at 30 s (8 s at 0.5/s, 2 s at 2.5/s), and the steady share is back.
        tokio::time::advance(Duration::from_secs(10)).await;
        assert_eq!(drain(&mut t, Bucket::CreateNetworkInterface), 9);
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(drain(&mut t, Bucket::CreateNetworkInterface), 5);
    }
}
