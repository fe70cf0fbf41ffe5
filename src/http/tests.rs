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

/// `listeners` served with an empty registry: the server, its readiness and its shutdown.
fn serve_on(
    listeners: Vec<(TcpListener, Endpoints)>,
) -> (HttpServer, Readiness, CancellationToken) {
    let (readiness, shutdown) = (Readiness::new(), CancellationToken::new());
    let server = start_on(
        listeners,
        MetricsRegistry::new(),
        readiness.clone(),
        shutdown.clone(),
    )
    .unwrap();
    (server, readiness, shutdown)
}

async fn check_endpoints(server: &HttpServer, readiness: &Readiness) {
    assert_eq!(
        get(server.health_addr, "/healthz").await,
        (200, "ok".into())
    );
    assert_eq!(
        get(server.health_addr, "/readyz").await,
        (
            503,
            "the Kubernetes API server did not answer the last probe".into()
        )
    );
    readiness.set_api_server(true);
    assert_eq!(get(server.health_addr, "/readyz").await, (200, "ok".into()));
    let (status, body) = get(server.metrics_addr, "/metrics").await;
    assert_eq!(status, 200);
    assert!(body.contains("eni_operator_build_info"), "{body}");
}

#[test]
fn a_standby_is_ready_once_the_api_server_answers() {
    let r = Readiness::new();
    assert!(!r.is_ready(), "no API server answer yet");
    r.set_api_server(true);
    assert_eq!(r.check(), Ok(()));
    r.set_api_server(false);
    assert!(!r.is_ready(), "lost the API server");
    r.set_api_server(true);
    r.set_stopping();
    assert_eq!(r.check(), Err("shutting down".into()));
}

#[test]
fn a_leader_is_ready_only_with_listed_nodes_and_warm_caches() {
    let r = Readiness::new();
    r.set_api_server(true);
    r.set_leading(true);
    assert_eq!(r.check(), Err("leader: CiliumNodes not listed yet".into()));
    r.set_nodes_listed();
    assert_eq!(r.check(), Err("leader: EC2 caches not built yet".into()));
    r.set_caches_warm();
    assert_eq!(r.check(), Ok(()));
    r.set_api_server(false);
    assert!(!r.is_ready());
    // A new term starts unsynced again.
    r.set_api_server(true);
    r.set_leading(true);
    assert!(!r.is_ready());
}

/// A leader with warm caches whose loop beats at `beat` and last refreshed EC2 at
/// `refreshed` (both set by the test).
fn leader_with_vitals(
    beat: &Arc<Mutex<Instant>>,
    refreshed: &Arc<Mutex<Option<Instant>>>,
) -> Readiness {
    let r = Readiness::new();
    r.set_api_server(true);
    r.set_leading(true);
    r.set_nodes_listed();
    r.set_caches_warm();
    let (b, f) = (beat.clone(), refreshed.clone());
    r.set_leader_vitals(LeaderVitals {
        last_beat: Arc::new(move || *b.lock().unwrap()),
        last_ec2_refresh: Arc::new(move || *f.lock().unwrap()),
        wedged_after: Duration::from_secs(120),
        ec2_stale_after: Duration::from_secs(180),
    });
    r
}

/// `/healthz`'s answer: status and body.
async fn healthz(r: &Readiness) -> (u16, String) {
    let response = serve_live(State(r.clone())).await.into_response();
    let code = response.status().as_u16();
    let body = axum::body::to_bytes(response.into_body(), 1 << 16)
        .await
        .unwrap();
    (code, String::from_utf8(body.to_vec()).unwrap())
}

#[tokio::test(start_paused = true)]
async fn a_wedged_leader_loop_fails_healthz() {
    let beat = Arc::new(Mutex::new(now()));
    let refreshed = Arc::new(Mutex::new(Some(now())));
    let r = leader_with_vitals(&beat, &refreshed);
    assert_eq!(healthz(&r).await, (200, "ok".into()));
    tokio::time::advance(Duration::from_secs(121)).await;
    *refreshed.lock().unwrap() = Some(now());
    let (code, body) = healthz(&r).await;
    assert_eq!(code, 503);
    assert!(
        body.contains("event loop has not turned for 121s"),
        "{body}"
    );
    // The loop turns again: alive.
    *beat.lock().unwrap() = now();
    assert_eq!(healthz(&r).await.0, 200);
    // A standby has no loop to wedge.
    tokio::time::advance(Duration::from_secs(300)).await;
    assert!(r.live().is_err());
    r.set_leading(false);
    assert_eq!(healthz(&r).await, (200, "ok".into()));
}

#[tokio::test(start_paused = true)]
async fn a_leader_that_cannot_refresh_ec2_says_so_in_readyz() {
    let beat = Arc::new(Mutex::new(now()));
    let refreshed = Arc::new(Mutex::new(Some(now())));
    let r = leader_with_vitals(&beat, &refreshed);
    assert_eq!(r.check(), Ok(()));
    tokio::time::advance(Duration::from_secs(180)).await;
    *beat.lock().unwrap() = now();
    assert_eq!(r.check(), Ok(()), "at the limit");
    tokio::time::advance(Duration::from_secs(5)).await;
    *beat.lock().unwrap() = now();
    let why = r.check().unwrap_err();
    assert!(
        why.contains("EC2 unreachable") && why.contains("for 185s"),
        "{why}"
    );
    assert_eq!(r.live(), Ok(()), "EC2 trouble is no reason to restart");
    *refreshed.lock().unwrap() = Some(now());
    assert_eq!(r.check(), Ok(()));
}

#[tokio::test(start_paused = true)]
async fn the_probe_follows_the_api_server() {
    use std::sync::atomic::{AtomicU8, Ordering};
    // 0: answers, 1: errors, 2: hangs.
    let mode = Arc::new(AtomicU8::new(0));
    let r = Readiness::new();
    let probe = {
        let mode = mode.clone();
        move || {
            let m = mode.load(Ordering::SeqCst);
            async move {
                match m {
                    0 => Ok(()),
                    1 => Err("connection refused"),
                    _ => std::future::pending().await,
                }
            }
        }
    };
    let task = tokio::spawn(probe_api_server(r.clone(), Duration::from_secs(5), probe));
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(r.is_ready());
    mode.store(1, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(!r.is_ready(), "an error unsets readiness");
    mode.store(0, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(r.is_ready());
    mode.store(2, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(11)).await;
    assert!(!r.is_ready(), "a probe that hangs counts as no answer");
    task.abort();
}

#[tokio::test]
async fn debug_pages_are_served_as_json_on_the_metrics_listener() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (registry, shutdown) = (MetricsRegistry::new(), CancellationToken::new());
    let server = start_on(
        vec![(listener, Endpoints::ALL)],
        registry.clone(),
        Readiness::new(),
        shutdown.clone(),
    )
    .unwrap();
    assert_eq!(get(server.metrics_addr, "/debug/shadow").await.0, 404);
    registry.set_debug_page("shadow", || serde_json::json!({"nodes": 3}));
    let (code, body) = get(server.metrics_addr, "/debug/shadow").await;
    assert_eq!(code, 200);
    assert!(body.contains(r#"{"nodes":3}"#), "{body}");
    shutdown.cancel();
    server.task.await.unwrap().unwrap();
}

#[tokio::test]
async fn one_listener_serves_all_three_and_shuts_down() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (server, readiness, shutdown) = serve_on(vec![(listener, Endpoints::ALL)]);
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
        debug_addr: "127.0.0.1:0".parse().unwrap(),
        log_format: crate::config::LogFormat::Text,
        metrics_compat: Default::default(),
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
    let debug = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (server, readiness, shutdown) = serve_on(vec![
        (metrics, Endpoints::METRICS),
        (health, Endpoints::HEALTH),
        (debug, Endpoints::DEBUG),
    ]);
    assert_ne!(server.metrics_addr, server.health_addr);
    check_endpoints(&server, &readiness).await;
    assert_eq!(get(server.metrics_addr, "/healthz").await.0, 404);
    assert_eq!(get(server.health_addr, "/metrics").await.0, 404);
    assert_eq!(get(server.metrics_addr, "/debug/x").await.0, 404);
    assert_eq!(get(server.health_addr, "/debug/x").await.0, 404);
    shutdown.cancel();
    server.task.await.unwrap().unwrap();
}

/// The debug pages list every node, instance and error: by default they are on loopback only,
/// never on the metrics listener that host networking exposes on the node's addresses.
#[tokio::test]
async fn the_debug_pages_default_to_loopback_and_stay_off_the_metrics_listener() {
    use clap::Parser;
    let defaults = crate::config::Settings::try_parse_from(["eni-operator"]).unwrap();
    assert!(defaults.server.debug_addr.ip().is_loopback());
    assert_ne!(defaults.server.debug_addr, defaults.server.metrics_addr);
    assert_eq!(
        placement(&defaults.server)
            .iter()
            .filter(|(_, e)| e.debug)
            .map(|(a, e)| (*a, *e))
            .collect::<Vec<_>>(),
        vec![(defaults.server.debug_addr, Endpoints::DEBUG)]
    );
    // Set equal, the pages share the metrics listener (one port, as before).
    let mut shared = defaults.server.clone();
    shared.debug_addr = shared.metrics_addr;
    assert!(
        placement(&shared)
            .iter()
            .any(|(a, e)| *a == shared.metrics_addr && e.metrics && e.debug)
    );

    let registry = MetricsRegistry::new();
    registry.set_debug_page("nodes", || serde_json::json!({"nodes": 1}));
    let metrics = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let debug = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let shutdown = CancellationToken::new();
    let server = start_on(
        vec![
            (
                metrics,
                Endpoints {
                    metrics: true,
                    health: true,
                    debug: false,
                },
            ),
            (debug, Endpoints::DEBUG),
        ],
        registry,
        Readiness::new(),
        shutdown.clone(),
    )
    .unwrap();
    assert_eq!(get(server.metrics_addr, "/debug/nodes").await.0, 404);
    assert_eq!(get(server.debug_addr, "/debug/nodes").await.0, 200);
    assert_eq!(get(server.debug_addr, "/metrics").await.0, 404);
    shutdown.cancel();
    server.task.await.unwrap().unwrap();
}
