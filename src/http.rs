//! The HTTP endpoints: `/healthz` (the process is alive), `/readyz` (this replica can do its
//! job, see [`Readiness`]), `/metrics` (Prometheus) and the JSON pages `/debug/<page>`. Each
//! group has its own address (`--metrics-addr`, `--health-addr`, `--debug-addr`); equal
//! addresses share one listener. The debug pages name every node, instance and error, so they
//! default to loopback (Cilium keeps its operator API on localhost too): with host networking
//! anything on `0.0.0.0` is reachable from every pod's network.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::clock::now;
use crate::config::ServerSettings;
use crate::metrics::MetricsRegistry;

/// What `/readyz` answers: ready when the API server answered the last probe and
/// * as a **standby**: nothing else. A standby runs no watches and holds no caches (by design:
///   no memory or API load per replica at thousands of nodes; a new leader rebuilds its view
///   first), so "synced" is vacuous for it; it must be Ready or a rolling update and the PDB
///   would wait on it forever, and it can take the lease as soon as it reaches the API server;
/// * as the **leader**: its CiliumNode watch has listed every object, its EC2 caches are
///   built (the first full refresh succeeded), and a full refresh succeeded within
///   [`LeaderVitals::ec2_stale_after`]: a leader that cannot reach EC2 (broken IRSA, a
///   missing VPC endpoint) says so here instead of looking healthy, and a rolling update stops
///   on it.
///
/// Not ready while shutting down. `/healthz` (liveness) fails only when the leader's event
/// loop has not turned for [`LeaderVitals::wedged_after`]: a restart hands the Lease to the
/// standby.
#[derive(Clone, Default, Debug)]
pub struct Readiness(Arc<Mutex<ReadyState>>);

#[derive(Debug, Default)]
struct ReadyState {
    api_server: bool,
    leading: bool,
    nodes_listed: bool,
    caches_warm: bool,
    stopping: bool,
    vitals: Option<LeaderVitals>,
}

/// What the leader's event loop shows the probes, read when a probe asks.
#[derive(Clone)]
pub struct LeaderVitals {
    /// When the loop last turned (`Core::last_beat`).
    pub last_beat: Arc<dyn Fn() -> Instant + Send + Sync>,
    /// When the last successful full EC2 refresh started (`Core::last_full_refresh`).
    pub last_ec2_refresh: Arc<dyn Fn() -> Option<Instant> + Send + Sync>,
    /// A loop that has not turned this long is wedged.
    pub wedged_after: Duration,
    /// No successful full refresh for this long: EC2 is unreachable.
    pub ec2_stale_after: Duration,
}

impl std::fmt::Debug for LeaderVitals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaderVitals")
            .field("wedged_after", &self.wedged_after)
            .field("ec2_stale_after", &self.ec2_stale_after)
            .finish_non_exhaustive()
    }
}

/// Liveness of a leader whose loop last turned at `beat`.
pub fn loop_alive(now: Instant, beat: Instant, wedged_after: Duration) -> Result<(), String> {
    let idle = now.saturating_duration_since(beat);
    if idle > wedged_after {
        return Err(format!(
            "leader: the event loop has not turned for {}s (limit {}s): wedged",
            idle.as_secs(),
            wedged_after.as_secs()
        ));
    }
    Ok(())
}

/// Whether the leader's EC2 view is fresh: the last full refresh succeeded at `last`.
pub fn ec2_fresh(now: Instant, last: Option<Instant>, stale_after: Duration) -> Result<(), String> {
    let Some(last) = last else {
        return Err("leader: EC2 caches not built yet".into());
    };
    let age = now.saturating_duration_since(last);
    if age > stale_after {
        return Err(format!(
            "leader: EC2 unreachable: no full refresh has succeeded for {}s (limit {}s: three \
             --ec2-resync-interval); see the logs and \
             eni_operator_ec2_api_duration_seconds_count{{response_code!=\"OK\"}} \
             (docs/runbook.md, EniOperatorEc2RefreshFailing)",
            age.as_secs(),
            stale_after.as_secs()
        ));
    }
    Ok(())
}

impl Readiness {
    pub fn new() -> Self {
        Self::default()
    }

    fn with<T>(&self, f: impl FnOnce(&mut ReadyState) -> T) -> T {
        f(&mut self.0.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Result of the last API server probe.
    pub fn set_api_server(&self, answered: bool) {
        self.with(|s| s.api_server = answered);
    }

    /// This replica starts (true) or stops (false) leading; a new leader starts unsynced.
    pub fn set_leading(&self, leading: bool) {
        self.with(|s| {
            s.leading = leading;
            s.nodes_listed = false;
            s.caches_warm = false;
            s.vitals = None;
        });
    }

    /// The leader's event loop runs: from now on the probes read its vitals.
    pub fn set_leader_vitals(&self, vitals: LeaderVitals) {
        self.with(|s| s.vitals = Some(vitals));
    }

    /// `Ok`, or why this replica is not alive (`/healthz`).
    pub fn live(&self) -> Result<(), String> {
        let vitals = self.with(|s| s.vitals.clone().filter(|_| s.leading && !s.stopping));
        match vitals {
            Some(v) => loop_alive(now(), (v.last_beat)(), v.wedged_after),
            None => Ok(()),
        }
    }

    /// The leader's CiliumNode watch finished its initial listing.
    pub fn set_nodes_listed(&self) {
        self.with(|s| s.nodes_listed = true);
    }

    /// The leader's EC2 caches are built.
    pub fn set_caches_warm(&self) {
        self.with(|s| s.caches_warm = true);
    }

    pub fn set_stopping(&self) {
        self.with(|s| s.stopping = true);
    }

    /// `Ok`, or why this replica is not ready.
    pub fn check(&self) -> Result<(), String> {
        let vitals = self.with(|s| {
            if s.stopping {
                Err("shutting down")
            } else if !s.api_server {
                Err("the Kubernetes API server did not answer the last probe")
            } else if s.leading && !s.nodes_listed {
                Err("leader: CiliumNodes not listed yet")
            } else if s.leading && !s.caches_warm {
                Err("leader: EC2 caches not built yet")
            } else {
                Ok(s.vitals.clone().filter(|_| s.leading))
            }
        })?;
        match vitals {
            Some(v) => ec2_fresh(now(), (v.last_ec2_refresh)(), v.ec2_stale_after),
            None => Ok(()),
        }
    }

    pub fn is_ready(&self) -> bool {
        self.check().is_ok()
    }
}

/// Probe the API server every `interval` (each probe may take at most that long) and record
/// the answer in `readiness`, until dropped.
pub async fn probe_api_server<F, Fut, T, E>(readiness: Readiness, interval: Duration, mut probe: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
    E: std::fmt::Display,
{
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last = None;
    loop {
        tick.tick().await;
        let answered = match tokio::time::timeout(interval, probe()).await {
            Ok(Ok(_)) => true,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "the Kubernetes API server probe failed");
                false
            }
            Err(_) => {
                tracing::warn!(
                    ?interval,
                    "the Kubernetes API server did not answer in time"
                );
                false
            }
        };
        if last != Some(answered) {
            readiness.set_api_server(answered);
            last = Some(answered);
        }
    }
}

/// The running server(s): the bound addresses, and the task that ends after shutdown.
pub struct HttpServer {
    pub metrics_addr: SocketAddr,
    pub health_addr: SocketAddr,
    pub debug_addr: SocketAddr,
    pub task: JoinHandle<std::io::Result<()>>,
}

/// Which endpoint groups one listener serves.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Endpoints {
    pub metrics: bool,
    pub health: bool,
    pub debug: bool,
}

impl Endpoints {
    pub const ALL: Self = Self {
        metrics: true,
        health: true,
        debug: true,
    };
    const METRICS: Self = Self {
        metrics: true,
        health: false,
        debug: false,
    };
    const HEALTH: Self = Self {
        metrics: false,
        health: true,
        debug: false,
    };
    const DEBUG: Self = Self {
        metrics: false,
        health: false,
        debug: true,
    };

    fn add(&mut self, other: Self) {
        self.metrics |= other.metrics;
        self.health |= other.health;
        self.debug |= other.debug;
    }
}

/// The configured addresses grouped: one entry per distinct address (pure).
pub fn placement(settings: &ServerSettings) -> Vec<(SocketAddr, Endpoints)> {
    let mut groups: Vec<(SocketAddr, Endpoints)> = Vec::new();
    for (addr, set) in [
        (settings.metrics_addr, Endpoints::METRICS),
        (settings.health_addr, Endpoints::HEALTH),
        (settings.debug_addr, Endpoints::DEBUG),
    ] {
        match groups.iter_mut().find(|(a, _)| *a == addr) {
            Some((_, e)) => e.add(set),
            None => groups.push((addr, set)),
        }
    }
    groups
}

/// Bind the configured addresses (one listener per distinct address) and serve until
/// `shutdown`.
pub async fn start(
    settings: &ServerSettings,
    registry: MetricsRegistry,
    readiness: Readiness,
    shutdown: CancellationToken,
) -> std::io::Result<HttpServer> {
    let mut listeners = Vec::new();
    for (addr, endpoints) in placement(settings) {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|e| std::io::Error::new(e.kind(), format!("cannot listen on {addr}: {e}")))?;
        listeners.push((listener, endpoints));
    }
    start_on(listeners, registry, readiness, shutdown)
}

/// Serve on already bound listeners, each its endpoint groups (every group on one of them).
pub fn start_on(
    listeners: Vec<(TcpListener, Endpoints)>,
    registry: MetricsRegistry,
    readiness: Readiness,
    shutdown: CancellationToken,
) -> std::io::Result<HttpServer> {
    let addr_of = |pick: fn(&Endpoints) -> bool| -> std::io::Result<SocketAddr> {
        let (l, _) = listeners.iter().find(|(_, e)| pick(e)).ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "an endpoint group has no listener",
            )
        })?;
        l.local_addr()
    };
    let metrics_addr = addr_of(|e| e.metrics)?;
    let health_addr = addr_of(|e| e.health)?;
    let debug_addr = addr_of(|e| e.debug)?;
    let mut tasks = Vec::new();
    for (listener, endpoints) in listeners {
        let mut router = Router::new();
        if endpoints.metrics {
            let r = Router::new().route("/metrics", get(serve_metrics));
            router = router.merge(r.with_state(registry.clone()));
        }
        if endpoints.debug {
            let r = Router::new().route("/debug/{page}", get(serve_debug));
            router = router.merge(r.with_state(registry.clone()));
        }
        if endpoints.health {
            let r = Router::new()
                .route("/healthz", get(serve_live))
                .route("/readyz", get(serve_ready));
            router = router.merge(r.with_state(readiness.clone()));
        }
        let token = shutdown.clone();
        let serve = axum::serve(listener, router)
            .with_graceful_shutdown(async move { token.cancelled().await });
        tasks.push(tokio::spawn(async move { serve.await }));
    }
    let task = tokio::spawn(async move {
        let mut result = Ok(());
        for t in tasks {
            let r = t.await.map_err(std::io::Error::other)?;
            result = result.and(r);
        }
        result
    });
    tracing::info!(%metrics_addr, %health_addr, %debug_addr, "HTTP server listening");
    Ok(HttpServer {
        metrics_addr,
        health_addr,
        debug_addr,
        task,
    })
}

async fn serve_metrics(State(registry): State<MetricsRegistry>) -> impl IntoResponse {
    let (content_type, body) = registry.scrape();
    ([(header::CONTENT_TYPE, content_type)], body)
}

/// A component's JSON page (`/debug/shadow`), 404 when none is registered under that name.
async fn serve_debug(
    State(registry): State<MetricsRegistry>,
    axum::extract::Path(page): axum::extract::Path<String>,
) -> axum::response::Response {
    match registry.debug_page(&page) {
        Some(json) => (
            [(header::CONTENT_TYPE, "application/json")],
            json.to_string(),
        )
            .into_response(),
        None => (StatusCode::NOT_FOUND, "no such page").into_response(),
    }
}

async fn serve_ready(State(readiness): State<Readiness>) -> impl IntoResponse {
    probe_answer(readiness.check())
}

async fn serve_live(State(readiness): State<Readiness>) -> impl IntoResponse {
    probe_answer(readiness.live())
}

fn probe_answer(verdict: Result<(), String>) -> (StatusCode, String) {
    match verdict {
        Ok(()) => (StatusCode::OK, "ok".into()),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, why),
    }
}

#[cfg(test)]
mod tests;
