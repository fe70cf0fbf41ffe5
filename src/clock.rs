//! The runtime's one clock: tokio's (so tests and the benchmark run on a paused clock) as a
//! std `Instant` (what the pure parts, queue, cache and engine, take).

use std::time::{Duration, Instant};

/// Now, on tokio's clock.
pub fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}

/// A tokio interval whose first (immediate) tick is spent.
pub async fn ticks(period: Duration) -> tokio::time::Interval {
    let mut i = tokio::time::interval(period);
    i.tick().await;
    i
}

/// Sleep until `at`; forever if `None`.
pub async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn follows_the_paused_tokio_clock() {
        let before = now();
        tokio::time::advance(Duration::from_secs(90)).await;
        assert_eq!(now().duration_since(before), Duration::from_secs(90));
    }
}
