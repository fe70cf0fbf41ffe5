//! Client-side rate limit of Kubernetes API requests (`--k8s-client-qps`,
//! `--k8s-client-burst`).
//!
//! client-go has a token bucket built in (what Cilium's flags set; raised to 50/100 after it
//! bottlenecked a 4,000-node test, Cilium #33946); kube-rs has none. This tower layer goes on
//! the kube [`Client`]'s service stack and takes one governor token per request: reads, writes
//! and the start of each list or watch alike. Time is tokio's, as in the EC2 gate.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use governor::clock::Clock;
use kube::Client;
use tower::{Layer, Service};

use crate::ec2::gate::{Limiter, TokioClock, limiter};
use crate::kube_metrics::{KubeClientMetrics, RequestMetricsLayer};

/// Builds [`RateLimit`] services sharing one bucket.
#[derive(Clone)]
pub struct RateLimitLayer {
    limiter: Arc<Limiter>,
    metrics: KubeClientMetrics,
}

impl RateLimitLayer {
    /// `qps` requests per second on average, `burst` at once.
    pub fn new(qps: f64, burst: u32) -> Self {
        Self {
            limiter: Arc::new(limiter(burst, qps)),
            metrics: KubeClientMetrics::default(),
        }
    }

    /// Count the waits in `metrics` (exported ones).
    pub fn with_metrics(mut self, metrics: KubeClientMetrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// How many times a request had to wait for a token.
    pub fn waits(&self) -> u64 {
        self.metrics.rate_limiter_waits.get()
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimit<S>;

    fn layer(&self, inner: S) -> RateLimit<S> {
        RateLimit {
            inner,
            limiter: self.limiter.clone(),
            metrics: self.metrics.clone(),
            sleep: None,
            permitted: false,
        }
    }
}

/// A service that is ready only once the bucket grants a token.
pub struct RateLimit<S> {
    inner: S,
    limiter: Arc<Limiter>,
    metrics: KubeClientMetrics,
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
    /// A token was taken for the next call.
    permitted: bool,
}

impl<S: Service<R>, R> Service<R> for RateLimit<S> {
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        loop {
            if let Some(sleep) = self.sleep.as_mut() {
                ready!(sleep.as_mut().poll(cx));
                self.sleep = None;
            }
            if self.permitted {
                return self.inner.poll_ready(cx);
            }
            match self.limiter.check() {
                Ok(()) => self.permitted = true,
                Err(not_until) => {
                    let wait = not_until.wait_time_from(TokioClock.now());
                    self.metrics.rate_limiter_waits.inc();
                    self.metrics
                        .rate_limiter_wait_seconds
                        .inc_by(wait.as_secs_f64());
                    self.sleep = Some(Box::pin(tokio::time::sleep(wait)));
                }
            }
        }
    }

    fn call(&mut self, request: R) -> S::Future {
        self.permitted = false;
        self.inner.call(request)
    }
}

/// In-cluster config or KUBECONFIG, with the rate limit on every request; requests and the
/// limiter's waits counted in `metrics` ([`crate::kube_metrics`]).
pub async fn client(qps: f64, burst: u32, metrics: KubeClientMetrics) -> anyhow::Result<Client> {
    let config = kube::Config::infer().await?;
    // The outer layer waits for a token; the inner one times the request alone.
    Ok(kube::client::ClientBuilder::try_from(config)?
        .with_layer(&RequestMetricsLayer(metrics.clone()))
        .with_layer(&RateLimitLayer::new(qps, burst).with_metrics(metrics))
        .build())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tower::ServiceExt;

    #[tokio::test(start_paused = true)]
    async fn requests_beyond_the_burst_wait_for_the_configured_rate() {
        // 5 per second, burst 10: 30 requests need 20 more tokens, i.e. at least 4 s.
        let layer = RateLimitLayer::new(5.0, 10);
        let mut svc = layer.layer(tower::service_fn(|n: u32| async move {
            Ok::<_, std::convert::Infallible>(n)
        }));
        let started = tokio::time::Instant::now();
        for n in 0..30 {
            let answer = svc.ready().await.unwrap().call(n).await.unwrap();
            assert_eq!(answer, n);
        }
        let took = started.elapsed();
        assert!(took >= Duration::from_secs(4), "took {took:?}");
        assert!(took < Duration::from_secs(5), "took {took:?}");
        assert_eq!(layer.waits(), 20);
    }
}
