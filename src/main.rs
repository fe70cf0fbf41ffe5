//! The `eni-operator` binary: settings, logs, HTTP endpoints, Kubernetes client, signals; then
//! [`run_operator`].

use std::process::ExitCode;
use std::time::Duration;

use eni_operator::config::{Command, LogFormat, Mode, Settings};
use eni_operator::http::{self, Readiness};
use eni_operator::metrics::MetricsRegistry;
use tokio_util::sync::CancellationToken;
use tracing_subscriber::EnvFilter;

/// How long the start-up check of the API server may take before we give up.
const API_SERVER_CHECK_TIMEOUT: Duration = Duration::from_secs(30);

/// Spacing (and timeout) of the readiness probe of the API server: one cheap `GET /version`.
const API_SERVER_PROBE_INTERVAL: Duration = Duration::from_secs(5);

#[tokio::main]
async fn main() -> ExitCode {
    // `status` reads a running operator: none of the operator's settings apply.
    if std::env::args_os().nth(1).is_some_and(|a| a == "status") {
        init_tracing(LogFormat::Text, true);
        let args = std::iter::once("eni-operator status".into()).chain(std::env::args_os().skip(2));
        return eni_operator::status_cli::main(args).await;
    }
    let settings = match Settings::load() {
        Ok(s) => s,
        Err(e) => return config_error(e),
    };
    // `plan` prints its table or JSON on stdout (`uninstall` its report): their logs go to
    // stderr, so `plan --output json | jq` reads JSON only.
    let planning = settings.mode.command == Some(Command::Plan);
    init_tracing(settings.server.log_format, settings.mode.command.is_some());
    if planning {
        return plan(settings).await;
    }
    if settings.mode.command == Some(Command::Uninstall) {
        return uninstall(settings).await;
    }

    let shutdown = CancellationToken::new();
    tokio::spawn(cancel_on_signal(shutdown.clone()));

    let registry = MetricsRegistry::new().with_compat(settings.server.metrics_compat);
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

    // Every mutating call and write checks this process's lease right before it goes (§14.2):
    // inside the gate (each retry too), around the sink, and on the Kubernetes client once a
    // write has its rate-limit token (`kube_fence`). Shadow mode writes nothing and leads
    // nothing.
    let fence = if settings.kube.leader_election && settings.mode.mode == Mode::Active {
        eni_operator::k8s::fence::Fence::closed()
    } else {
        eni_operator::k8s::fence::Fence::open()
    };
    let clients = tokio::select! {
        result = connect_kube(settings.kube.k8s_client_qps, settings.kube.k8s_client_burst, &registry, fence.clone()) => match result {
            Ok(c) => c,
            Err(e) => return fail(format!("cannot reach the Kubernetes API server: {e}")),
        },
        _ = shutdown.cancelled() => return ExitCode::SUCCESS,
    };
    let client = clients.main.clone();
    let probe = {
        let client = client.clone();
        let readiness = readiness.clone();
        tokio::spawn(http::probe_api_server(
            readiness,
            API_SERVER_PROBE_INTERVAL,
            move || {
                let client = client.clone();
                async move { client.apiserver_version().await }
            },
        ))
    };

    let result = match settings.mode.mode {
        Mode::Active => {
            run_operator(
                settings,
                clients,
                fence,
                registry,
                readiness,
                shutdown.clone(),
            )
            .await
        }
        Mode::Shadow => {
            eni_operator::modes::run_shadow(settings, client, registry, readiness, shutdown.clone())
                .await
        }
    };
    shutdown.cancel();
    probe.abort();
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

/// `eni-operator plan`: no HTTP server, no Lease; prints the plan on stdout, exits 0.
async fn plan(settings: Settings) -> ExitCode {
    let client = match connect_kube(
        settings.kube.k8s_client_qps,
        settings.kube.k8s_client_burst,
        &MetricsRegistry::new(),
        eni_operator::k8s::fence::Fence::open(),
    )
    .await
    {
        Ok(c) => c.main,
        Err(e) => return fail(format!("cannot reach the Kubernetes API server: {e}")),
    };
    match eni_operator::modes::run_plan(settings, client).await {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => fail(format!("{e:#}")),
    }
}

/// `eni-operator uninstall` (src/uninstall.rs): prints what it removed, exits 0.
async fn uninstall(settings: Settings) -> ExitCode {
    // Long enough for the Lease of an operator stopped just before to lapse.
    let wait = settings.kube.leader_election_lease_duration * 4;
    let (qps, burst) = (settings.kube.k8s_client_qps, settings.kube.k8s_client_burst);
    // A one-shot command: its client's metrics are not served anywhere.
    let open = eni_operator::k8s::fence::Fence::open();
    let client = match connect_kube(qps, burst, &MetricsRegistry::new(), open).await {
        Ok(c) => c.main,
        Err(e) => return fail(format!("cannot reach the Kubernetes API server: {e}")),
    };
    let namespace = settings.kube.namespace().to_string();
    let lease = &settings.kube.leader_election_lease_name;
    match eni_operator::uninstall::run(client, &namespace, lease, wait).await {
        Ok(report) => {
            print!("{report}");
            ExitCode::SUCCESS
        }
        Err(e) => fail(format!("{e:#}")),
    }
}

/// The operator proper: runs until `shutdown` is cancelled, or fails when leadership is lost
/// (the process then exits non-zero and Kubernetes restarts it with a clean state).
///
/// Standby replicas only take part in the election: no watches, no EC2 calls, no writes.
/// Readiness: see [`Readiness`]; this function reports leadership and the leader's sync.
async fn run_operator(
    settings: Settings,
    clients: eni_operator::kube_limit::Clients,
    fence: eni_operator::k8s::fence::Fence,
    registry: MetricsRegistry,
    readiness: Readiness,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    use std::sync::Arc;

    use eni_operator::ec2::aws::AwsEc2;
    use eni_operator::ec2::gate::{Gate, GateLayer};
    use eni_operator::event_loop::core::Core;
    use eni_operator::k8s::fence::{Fenced, FencedSink};
    use eni_operator::k8s::leader::{Elector, KubeLease};
    use eni_operator::k8s::sink::KubeSink;
    use eni_operator::k8s::source;
    use eni_operator::reconcile::gc;
    use eni_operator::reconcile::metrics::RuntimeMetrics;
    use eni_operator::reconcile::status::ThrottledPasses;

    let aws = AwsEc2::new(&settings.ec2.aws_client_config()).await;
    tokio::spawn(eni_operator::credentials::warn_if_instance_role(
        aws.credentials_provider(),
    ));
    let client = clients.main;
    let aws = Fenced::new(aws, fence.clone());
    // A throttled call shows as its node's wait (`/debug/nodes`).
    let gate = GateLayer::new(settings.gate.gate_config()).reporting_throttles_to(ThrottledPasses);
    let ec2 = Arc::new(Gate::new(aws, gate));
    registry.with(|r| ec2.metrics().register(r));
    let metrics = registry.with(RuntimeMetrics::register);

    let sink = Arc::new(FencedSink::new(
        KubeSink::new(client.clone(), Some(settings.kube.identity().to_string())),
        fence.clone(),
    ));

    // Everything a leader does, in one future: dropping it aborts all of it at once. Boxed: the
    // fenced client and sink nest the types deeper than the compiler's layout limit.
    let work = Box::pin({
        let ec2 = ec2.clone();
        let client = client.clone();
        let shutdown = shutdown.clone();
        let metrics = metrics.clone();
        let mut settings = settings.clone();
        let readiness = readiness.clone();
        let registry = registry.clone();
        async move {
            // Only the leader reads EC2 (standbys make no EC2 call), so the name is derived
            // here, before anything is created or collected under it.
            // Boxed: see `work` above.
            Box::pin(eni_operator::cluster_name::settle(
                &mut settings,
                &client,
                &*ec2,
            ))
            .await
            .map_err(anyhow::Error::msg)?;
            let core_config = settings.core_config();
            readiness.set_leading(true);
            // Only the leader writes (a standby says nothing of annotating, §14).
            if settings.ipam.annotate_cilium_ignore {
                tracing::info!("annotating served CiliumNodes with ipam.cilium.io/ignore=true");
            }
            let (tx, rx) = tokio::sync::mpsc::channel(4096);
            let cache = core_config.ec2_cache();
            let gc_cache = cache.clone();
            let core = Core::new(ec2.clone(), sink, core_config, metrics.clone(), cache);
            readiness.set_leader_vitals({
                let (beat, refreshed) = (core.clone(), core.clone());
                let (wedged_after, ec2_stale_after) = settings.runtime.probe_limits();
                http::LeaderVitals {
                    last_beat: Arc::new(move || beat.last_beat()),
                    last_ec2_refresh: Arc::new(move || refreshed.last_full_refresh()),
                    wedged_after,
                    ec2_stale_after,
                }
            });
            let book = core.status_book();
            registry.set_debug_page("nodes", move || {
                let page = book.page(eni_operator::clock::now());
                serde_json::to_value(page).unwrap_or_default()
            });
            let mut warm = core.warm();
            let caches_warm = async {
                if warm.wait_for(|w| *w).await.is_ok() {
                    readiness.set_caches_warm();
                }
                std::future::pending::<()>().await
            };
            let gc_loop = async {
                match settings.runtime.eni_gc_interval() {
                    Some(interval) => {
                        if interval > settings.runtime.eni_gc_interval {
                            tracing::warn!(
                                "--eni-gc-interval {:?} raised to {interval:?}: ENIs are still \
                                 unattached that long while their attach is throttled",
                                settings.runtime.eni_gc_interval
                            );
                        }
                        let collector = gc::EniGc::new(
                            settings.ipam.cluster_name().to_string(),
                            settings.runtime.eni_gc_max_per_run,
                        )
                        .with_metrics(metrics.clone())
                        .with_tags(settings.runtime.eni_gc_tags());
                        // Only the managed VPC(s): --vpc-id, else those of the managed nodes.
                        let vpc_id = settings.ipam.vpc_id.clone();
                        let vpcs = move || match &vpc_id {
                            Some(v) => std::collections::BTreeSet::from([v.clone()]),
                            None => gc_cache.read().expect("cache").managed_vpcs(),
                        };
                        gc::run_loop(
                            ec2.clone(),
                            collector,
                            settings.ipam.subnet_ids_filter.clone(),
                            interval,
                            vpcs,
                        )
                        .await
                    }
                    None => std::future::pending().await,
                }
            };
            // The handover guard's view of Cilium operator's Lease.
            let (lease_client, lease_core) = (client.clone(), core.clone());
            let lease_clock = core.clone();
            let cilium_namespace = settings.handover.cilium_namespace.clone();
            let watch_lease = settings.handover.watch_cilium_lease;
            let absent = settings.handover.cilium_operator_absent;
            if watch_lease && !absent {
                // Fail closed until the first read (§16).
                core.set_cilium_lease_state(eni_operator::ipam::handover::CiliumLease::Unreadable(
                    "Cilium operator's Lease not read yet".into(),
                ));
            }
            // The guard's view of Cilium operator's release: fails closed until read, unless
            // the user vouched for it. Read with --cilium-operator-absent too: a Lease that is
            // found is still obeyed, and so is the release of the operator that holds it.
            let (version_client, version_core) = (client.clone(), core.clone());
            let read_version = watch_lease && !settings.handover.cilium_honours_ignore;
            if read_version {
                core.set_cilium_version(
                    eni_operator::ipam::cilium_version::CiliumVersion::Unknown(
                        "the CiliumNode CRD's label not read yet".into(),
                    ),
                );
            }
            let cilium_version = async move {
                if read_version {
                    eni_operator::k8s::cilium_version::watch(version_client, move |v| {
                        version_core.set_cilium_version(v);
                    })
                    .await;
                }
                std::future::pending::<()>().await
            };
            let cilium_lease = async move {
                if watch_lease {
                    eni_operator::k8s::cilium_lease::watch(
                        lease_client,
                        &cilium_namespace,
                        absent,
                        move || lease_clock.wall_now(),
                        move |v| lease_core.set_cilium_lease_state(v),
                    )
                    .await;
                }
                std::future::pending::<()>().await
            };
            tokio::select! {
                result = core.clone().run(rx, shutdown.cancelled()) => result.map_err(anyhow::Error::from),
                () = cilium_lease => Ok(()),
                () = cilium_version => Ok(()),
                () = source::watch_cilium_nodes(client.clone(), tx.clone(), || readiness.set_nodes_listed()) => Ok(()),
                () = source::watch_nodes(client.clone(), tx.clone()) => Ok(()),
                () = source::watch_pending_pods(client, tx) => Ok(()),
                () = gc_loop => Ok(()),
                () = caches_warm => Ok(()),
            }
        }
    });

    let result = if settings.kube.leader_election {
        // Its own client: renewals never wait behind the writes' rate-limit tokens.
        let lease = KubeLease::new(
            clients.lease,
            settings.kube.namespace(),
            settings.kube.leader_election_lease_name.clone(),
        );
        let mut elector = Elector::new(lease, settings.kube.leader_config()).with_fence(fence);
        let outcome = tokio::select! {
            r = elector.run(work) => Some(r),
            () = shutdown.cancelled() => None,
        };
        match outcome {
            Some(Ok(inner)) => inner,
            Some(Err(lost)) => {
                metrics.leader.set(0);
                Err(anyhow::Error::from(lost))
            }
            None => {
                // Hand the lease over at once instead of making the standby wait it out.
                elector.release().await;
                Ok(())
            }
        }
    } else {
        work.await
    };
    readiness.set_stopping();
    result
}

/// In-cluster config or KUBECONFIG, rate-limited (`--k8s-client-qps`/`--k8s-client-burst`),
/// checked with one cheap call so a bad config fails now.
async fn connect_kube(
    qps: f64,
    burst: u32,
    registry: &MetricsRegistry,
    fence: eni_operator::k8s::fence::Fence,
) -> anyhow::Result<eni_operator::kube_limit::Clients> {
    use eni_operator::kube_metrics::KubeClientMetrics;
    let metrics = registry.with(KubeClientMetrics::register);
    let clients = eni_operator::kube_limit::Clients::infer(qps, burst, metrics, fence).await?;
    let client = &clients.main;
    let version = tokio::time::timeout(API_SERVER_CHECK_TIMEOUT, client.apiserver_version())
        .await
        .map_err(|_| anyhow::anyhow!("no answer within {API_SERVER_CHECK_TIMEOUT:?}"))??;
    tracing::info!(version = %version.git_version, "connected to the Kubernetes API server");
    Ok(clients)
}

fn init_tracing(format: LogFormat, to_stderr: bool) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    match (format, to_stderr) {
        (LogFormat::Text, false) => builder.init(),
        (LogFormat::Json, false) => builder.json().init(),
        (LogFormat::Text, true) => builder.with_writer(std::io::stderr).init(),
        (LogFormat::Json, true) => builder.json().with_writer(std::io::stderr).init(),
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
