//! The runtime's one clock: tokio's (so tests and the benchmark run on a paused clock) as a
//! std `Instant` (what the pure parts, queue, cache and engine, take).

use std::time::Instant;

/// Now, on tokio's clock.
pub fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn follows_the_paused_tokio_clock() {
        let before = now();
        tokio::time::advance(Duration::from_secs(90)).await;
        assert_eq!(now().duration_since(before), Duration::from_secs(90));
    }
}
