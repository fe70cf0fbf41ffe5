//! The `eni-operator` binary: settings, logs, HTTP endpoints, Kubernetes client, signals; then
//! [`run_operator`].

use std::process::ExitCode;
use std::time::Duration;

use eni_operator::config::{LogFormat, Settings};
use eni_operator::http::{self, Readiness};
use eni_operator::metrics::MetricsRegistry;
use tokio_util::sync::CancellationToken;
use tracing_subscriber::EnvFilter;

/// How long the start-up check of the API server may take before we give up.
const API_SERVER_CHECK_TIMEOUT: Duration = Duration::from_secs(30);

#[tokio::main]
async fn main() -> ExitCode {
    let settings = match Settings::load() {
        Ok(s) => s,
        Err(e) => return config_error(e),
    };
    init_tracing(settings.server.log_format);

    let shutdown = CancellationToken::new();
    tokio::spawn(cancel_on_signal(shutdown.clone()));

    let registry = MetricsRegistry::new();
    let readiness = Readiness::new();
    let server = match http::start(
        &settings.server,
        registry.clone(),
        readiness.clone(),
        shutdown.clone(),
    )
    .await
    {
        Ok(s) => s,
        Err(e) => return fail(format!("cannot start the HTTP server: {e}")),
    };

    let client = tokio::select! {
        result = connect_kube() => match result {
            Ok(c) => c,
            Err(e) => return fail(format!("cannot reach the Kubernetes API server: {e}")),
        },
        _ = shutdown.cancelled() => return ExitCode::SUCCESS,
    };

    let result = run_operator(settings, client, registry, readiness, shutdown.clone()).await;
    shutdown.cancel();
    if let Err(e) = server
        .task
        .await
        .unwrap_or_else(|e| Err(std::io::Error::other(e)))
    {
        tracing::warn!(error = %e, "HTTP server ended with an error");
    }
    match result {
        Ok(()) => {
            tracing::info!("stopped");
            ExitCode::SUCCESS
        }
        Err(e) => fail(format!("{e:#}")),
    }
}

/// The operator proper: runs until `shutdown` is cancelled. For now it only reports ready; the
/// runtime (leader election, caches, reconciler, GC) plugs in here.
async fn run_operator(
    settings: Settings,
    client: kube::Client,
    registry: MetricsRegistry,
    readiness: Readiness,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let _ = (settings, client, registry);
    readiness.set(true);
    shutdown.cancelled().await;
    readiness.set(false);
    Ok(())
}

/// In-cluster config or KUBECONFIG, checked with one cheap call so a bad config fails now.
async fn connect_kube() -> anyhow::Result<kube::Client> {
    let client = kube::Client::try_default().await?;
    let version = tokio::time::timeout(API_SERVER_CHECK_TIMEOUT, client.apiserver_version())
        .await
        .map_err(|_| anyhow::anyhow!("no answer within {API_SERVER_CHECK_TIMEOUT:?}"))??;
    tracing::info!(version = %version.git_version, "connected to the Kubernetes API server");
    Ok(client)
}

fn init_tracing(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

/// SIGTERM (Kubernetes) or SIGINT (Ctrl-C) starts a clean shutdown.
async fn cancel_on_signal(shutdown: CancellationToken) {
    use tokio::signal::unix::{SignalKind, signal};
    let (mut term, mut int) = match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(t), Ok(i)) => (t, i),
        (Err(e), _) | (_, Err(e)) => {
            tracing::error!(error = %e, "cannot install signal handlers");
            return;
        }
    };
    let name = tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    };
    tracing::info!(signal = name, "shutting down");
    shutdown.cancel();
}

/// `--help`/`--version` print and exit 0; anything else is one line and exit 1.
fn config_error(e: clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
        e.exit();
    }
    let text = e.to_string();
    let line = text.lines().next().unwrap_or_default();
    let line = line.strip_prefix("error: ").unwrap_or(line);
    eprintln!("error: invalid configuration: {line}");
    ExitCode::from(1)
}

/// One line on stderr (not through tracing: logs may be JSON, this line is for humans).
fn fail(message: String) -> ExitCode {
    eprintln!("error: {message}");
    ExitCode::from(1)
}
