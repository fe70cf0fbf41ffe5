//! The HTTP endpoints: `/healthz` (the process is alive), `/readyz` (the runtime says it can do
//! its job) and `/metrics` (Prometheus). Health and metrics may share one address.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::config::ServerSettings;
use crate::metrics::{self, MetricsRegistry};

/// Set by the runtime: ready once it can serve (as leader with warm caches, or as a standby
/// waiting for the lease), unset when it cannot (e.g. lost the API server).
#[derive(Clone, Default, Debug)]
pub struct Readiness(Arc<AtomicBool>);

impl Readiness {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn set(&self, ready: bool) {
        self.0.store(ready, Ordering::Release);
    }

    pub fn is_ready(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

/// The running server(s): the bound addresses, and the task that ends after shutdown.
pub struct HttpServer {
    pub metrics_addr: SocketAddr,
    pub health_addr: SocketAddr,
    pub task: JoinHandle<std::io::Result<()>>,
}

/// Bind the configured addresses (one listener when they are equal) and serve until `shutdown`.
pub async fn start(
    settings: &ServerSettings,
    registry: MetricsRegistry,
    readiness: Readiness,
    shutdown: CancellationToken,
) -> std::io::Result<HttpServer> {
    let bind = |addr: SocketAddr| async move {
        TcpListener::bind(addr)
            .await
            .map_err(|e| std::io::Error::new(e.kind(), format!("cannot listen on {addr}: {e}")))
    };
    let metrics = bind(settings.metrics_addr).await?;
    let health = if settings.health_addr == settings.metrics_addr {
        None
    } else {
        Some(bind(settings.health_addr).await?)
    };
    start_on(metrics, health, registry, readiness, shutdown)
}

/// Serve on already bound listeners; `health: None` puts every endpoint on `metrics`.
pub fn start_on(
    metrics: TcpListener,
    health: Option<TcpListener>,
    registry: MetricsRegistry,
    readiness: Readiness,
    shutdown: CancellationToken,
) -> std::io::Result<HttpServer> {
    let metrics_addr = metrics.local_addr()?;
    let health_addr = match &health {
        Some(h) => h.local_addr()?,
        None => metrics_addr,
    };
    let metrics_router = Router::new()
        .route("/metrics", get(serve_metrics))
        .with_state(registry);
    let health_router = Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(serve_ready))
        .with_state(readiness);
    let serve = |listener: TcpListener, router: Router, token: CancellationToken| {
        axum::serve(listener, router).with_graceful_shutdown(async move { token.cancelled().await })
    };
    let task = match health {
        None => {
            let s = serve(metrics, metrics_router.merge(health_router), shutdown);
            tokio::spawn(async move { s.await })
        }
        Some(health) => {
            let m = serve(metrics, metrics_router, shutdown.clone());
            let h = serve(health, health_router, shutdown);
            tokio::spawn(async move {
                let (m, h) = tokio::join!(m, h);
                m.and(h)
            })
        }
    };
    tracing::info!(%metrics_addr, %health_addr, "HTTP server listening");
    Ok(HttpServer {
        metrics_addr,
        health_addr,
        task,
    })
}

async fn serve_metrics(State(registry): State<MetricsRegistry>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, metrics::CONTENT_TYPE)],
        registry.encode(),
    )
}

async fn serve_ready(State(readiness): State<Readiness>) -> impl IntoResponse {
    if readiness.is_ready() {
        (StatusCode::OK, "ok")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    /// Minimal HTTP/1.1 GET: (status code, body).
    async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        let request = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).await.unwrap();
        let status = response[9..12].parse().unwrap();
        let body = response
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_string())
            .unwrap();
        (status, body)
    }

    async fn check_endpoints(server: &HttpServer, readiness: &Readiness) {
        assert_eq!(
            get(server.health_addr, "/healthz").await,
            (200, "ok".into())
        );
        assert_eq!(get(server.health_addr, "/readyz").await.0, 503);
        readiness.set(true);
        assert_eq!(get(server.health_addr, "/readyz").await, (200, "ok".into()));
        let (status, body) = get(server.metrics_addr, "/metrics").await;
        assert_eq!(status, 200);
        assert!(body.contains("eni_operator_build_info"), "{body}");
    }

    #[tokio::test]
    async fn one_listener_serves_all_three_and_shuts_down() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (readiness, shutdown) = (Readiness::new(), CancellationToken::new());
        let server = start_on(
            listener,
            None,
            MetricsRegistry::new(),
            readiness.clone(),
            shutdown.clone(),
        )
        .unwrap();
        assert_eq!(server.metrics_addr, server.health_addr);
        check_endpoints(&server, &readiness).await;
        shutdown.cancel();
        server.task.await.unwrap().unwrap();
        assert!(TcpStream::connect(server.metrics_addr).await.is_err());
    }

    #[tokio::test]
    async fn separate_listeners_split_the_endpoints() {
        let settings = ServerSettings {
            metrics_addr: "127.0.0.1:0".parse().unwrap(),
            health_addr: "127.0.0.1:0".parse().unwrap(),
            log_format: crate::config::LogFormat::Text,
        };
        // Equal configured addresses: one listener.
        let (readiness, shutdown) = (Readiness::new(), CancellationToken::new());
        let server = start(
            &settings,
            MetricsRegistry::new(),
            readiness.clone(),
            shutdown.clone(),
        )
        .await
        .unwrap();
        assert_eq!(server.metrics_addr, server.health_addr);
        shutdown.cancel();
        server.task.await.unwrap().unwrap();

        let metrics = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let health = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (readiness, shutdown) = (Readiness::new(), CancellationToken::new());
        let server = start_on(
            metrics,
            Some(health),
            MetricsRegistry::new(),
            readiness.clone(),
            shutdown.clone(),
        )
        .unwrap();
        assert_ne!(server.metrics_addr, server.health_addr);
        check_endpoints(&server, &readiness).await;
        assert_eq!(get(server.metrics_addr, "/healthz").await.0, 404);
        assert_eq!(get(server.health_addr, "/metrics").await.0, 404);
        shutdown.cancel();
        server.task.await.unwrap().unwrap();
    }
}
