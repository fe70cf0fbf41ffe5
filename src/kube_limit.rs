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
use crate::k8s::fence::Fence;
use crate::kube_fence::FenceLayer;
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
    configured(kube::Config::infer().await?, qps, burst, metrics)
}

/// The leader's Lease renewals' own budget: a renewal (a GET and a PUT every retry period, 2 s
/// by default) never waits behind the writes' tokens; under load it used to wait seconds there
/// and leadership flapped.
pub const LEASE_QPS: f64 = 5.0;
pub const LEASE_BURST: u32 = 10;

/// The clients of an operator process: `main` for every watch, read and write (one bucket of
/// `--k8s-client-qps`/`--k8s-client-burst`; each write checked against `fence` as it leaves,
/// [`crate::kube_fence`]), `lease` for its leader election's Lease alone (a bucket of its own).
#[derive(Clone)]
pub struct Clients {
    pub main: Client,
    pub lease: Client,
}

impl Clients {
    /// In-cluster config or KUBECONFIG.
    pub async fn infer(
        qps: f64,
        burst: u32,
        metrics: KubeClientMetrics,
        fence: Fence,
    ) -> anyhow::Result<Self> {
        Self::for_config(kube::Config::infer().await?, qps, burst, metrics, fence)
    }

    pub fn for_config(
        config: kube::Config,
        qps: f64,
        burst: u32,
        metrics: KubeClientMetrics,
        fence: Fence,
    ) -> anyhow::Result<Self> {
        Ok(Self {
            main: build(config.clone(), qps, burst, metrics.clone(), fence)?,
            lease: build(config, LEASE_QPS, LEASE_BURST, metrics, Fence::open())?,
        })
    }
}

/// `User-Agent` of every request: cluster admins tell ours apart in the API server's audit log
/// (kube sends none of its own, which the log shows as `?`).
pub const USER_AGENT: &str = concat!("eni-operator/", env!("CARGO_PKG_VERSION"));

/// A client for `config` with our user agent, the rate limit on every request, and `metrics`.
pub fn configured(
    config: kube::Config,
    qps: f64,
    burst: u32,
    metrics: KubeClientMetrics,
) -> anyhow::Result<Client> {
    build(config, qps, burst, metrics, Fence::open())
}

fn build(
    mut config: kube::Config,
    qps: f64,
    burst: u32,
    metrics: KubeClientMetrics,
    fence: Fence,
) -> anyhow::Result<Client> {
    // axum's `http` is the one kube's headers are typed with (http 1).
    config.headers.push((
        axum::http::header::USER_AGENT,
        axum::http::HeaderValue::from_static(USER_AGENT),
    ));
    // The outer layer waits for a token; the fence checks a write once it has one; the inner
    // one times the request alone.
    Ok(kube::client::ClientBuilder::try_from(config)?
        .with_layer(&RequestMetricsLayer(metrics.clone()))
        .with_layer(&FenceLayer(fence))
        .with_layer(&RateLimitLayer::new(qps, burst).with_metrics(metrics))
        .build())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tower::ServiceExt;

    /// Issue 29: the API server sees `eni-operator/<version>`, not `?`.
    #[tokio::test]
    async fn requests_carry_our_user_agent() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut head = Vec::new();
            let mut buf = [0u8; 1024];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = s.read(&mut buf).await.unwrap();
                if n == 0 {
                    break;
                }
                head.extend_from_slice(&buf[..n]);
            }
            let body = r#"{"major":"1","minor":"36","gitVersion":"v1.36.2","gitCommit":"","gitTreeState":"","buildDate":"","goVersion":"","compiler":"","platform":""}"#;
            let answer = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            s.write_all(answer.as_bytes()).await.unwrap();
            String::from_utf8_lossy(&head).to_lowercase()
        });
        let config = kube::Config::new(format!("http://{addr}").parse().unwrap());
        let client = configured(config, 100.0, 100, KubeClientMetrics::default()).unwrap();
        client.apiserver_version().await.unwrap();
        let head = server.await.unwrap();
        let want = format!("user-agent: {}", USER_AGENT.to_lowercase());
        assert!(head.contains(&want), "{head}");
        assert!(USER_AGENT.starts_with("eni-operator/0."), "{USER_AGENT}");
    }

    /// A loopback API server answering every request with its version, until dropped.
    async fn version_server() -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut s, _)) = listener.accept().await else {
                    return;
                };
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut buf = [0u8; 1024];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                        match s.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&buf[..n]),
                        }
                    }
                    let body = r#"{"major":"1","minor":"36","gitVersion":"v1.36.2","gitCommit":"","gitTreeState":"","buildDate":"","goVersion":"","compiler":"","platform":""}"#;
                    let answer = format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = s.write_all(answer.as_bytes()).await;
                });
            }
        });
        (addr, task)
    }

    /// Issue 29 item 6: the Lease's renewals have a bucket of their own. With the writes'
    /// bucket spent (0.5 per second, burst 1), renewals (a GET and a PUT each) go at once; on
    /// one shared client (as before), each of them waited 2 s for a token.
    #[tokio::test]
    async fn lease_renewals_do_not_wait_for_the_writes_tokens() {
        let (addr, server) = version_server().await;
        let config = kube::Config::new(format!("http://{addr}").parse().unwrap());
        let metrics = KubeClientMetrics::default();
        let clients = Clients::for_config(config, 0.5, 1, metrics.clone(), Fence::open()).unwrap();
        clients.main.apiserver_version().await.unwrap();
        assert_eq!(metrics.rate_limiter_waits.get(), 0, "the burst");
        for _ in 0..4 {
            clients.lease.apiserver_version().await.unwrap();
        }
        assert_eq!(
            metrics.rate_limiter_waits.get(),
            0,
            "a renewal waited behind the writes' bucket"
        );
        server.abort();
    }

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
