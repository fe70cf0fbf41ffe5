//! Settings: every flag is also an `ENI_OPERATOR_*` environment variable (flag wins).
//!
//! Flag names follow Cilium's operator where it has one, so existing values carry over.
//! Standard variables are read by the libraries themselves, not here:
//! * `KUBECONFIG` (or the in-cluster service account): kube's `Client::try_default`;
//! * `AWS_REGION`, `AWS_ENDPOINT_URL` / `AWS_ENDPOINT_URL_EC2`, `AWS_ACCESS_KEY_ID`,
//!   `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_PROFILE`, web identity (IRSA) and pod
//!   identity variables: aws-config's default chain (`--aws-region` and `--ec2-api-endpoint`
//!   override them when set);
//! * `RUST_LOG`: the tracing filter (default `info`);
//! * `POD_NAMESPACE` / `POD_NAME` (downward API): fallbacks for `--namespace` / `--identity`.

use std::net::SocketAddr;
use std::time::Duration;

use clap::{Args, Parser, ValueEnum};

use crate::event_loop::core::CoreConfig;
use crate::k8s::leader::LeaderConfig;

pub mod ec2_client;
pub mod ipam;
pub mod loops;
pub mod values;

use ec2_client::{Ec2Settings, GateSettings};
use ipam::{HandoverSettings, IpamSettings};
use loops::RuntimeSettings;
use values::parse_duration;

pub const DEFAULT_NAMESPACE: &str = "eni-operator";

/// The invalid-configuration error: one line, naming the setting.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid configuration: {0}")]
pub struct ConfigError(pub String);

/// All settings of the operator.
#[derive(Parser, Debug, Clone)]
#[command(
    name = "eni-operator",
    version,
    about = "Gives AWS nodes their pod IP capacity (ENIs, secondary IPs, /28 prefixes) through Cilium's CiliumNode objects",
    after_help = "Every flag can also be set by the environment variable shown with it. \
Also read: KUBECONFIG (or in-cluster config), AWS_REGION, AWS_ENDPOINT_URL / AWS_ENDPOINT_URL_EC2 \
and the AWS credential chain (AWS_ACCESS_KEY_ID, AWS_PROFILE, IRSA, ...), RUST_LOG (default info), \
POD_NAMESPACE and POD_NAME."
)]
pub struct Settings {
    #[command(flatten)]
    pub server: ServerSettings,
    #[command(flatten)]
    pub kube: KubeSettings,
    #[command(flatten)]
    pub ec2: Ec2Settings,
    #[command(flatten)]
    pub gate: GateSettings,
    #[command(flatten)]
    pub ipam: IpamSettings,
    #[command(flatten)]
    pub runtime: RuntimeSettings,
    #[command(flatten)]
    pub handover: HandoverSettings,
    #[command(flatten)]
    pub mode: ModeSettings,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// HTTP endpoints and logging.
#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "Server")]
pub struct ServerSettings {
    /// Address serving Prometheus `/metrics`.
    // The ports: the operator runs with host networking, so it shares every node's ports with
    // Cilium, which runs host-networked too (operator: 9963 metrics, 9234 API, 9891 gops, 6061
    // pprof; agent: 9962, 9879, 9890, 4240, 4244; relay/clustermesh: 4245, 9892-9893, 9880-9883,
    // 9964-9966; see Cilium's "Firewall Rules" port list). 9751/9752 are clear of all of them.
    #[arg(
        long,
        env = "ENI_OPERATOR_METRICS_ADDR",
        default_value = "0.0.0.0:9751"
    )]
    pub metrics_addr: SocketAddr,
    /// Address serving `/healthz` and `/readyz` (may equal --metrics-addr: one listener).
    #[arg(long, env = "ENI_OPERATOR_HEALTH_ADDR", default_value = "0.0.0.0:9752")]
    pub health_addr: SocketAddr,
    /// Address serving the JSON pages `/debug/nodes` and `/debug/shadow` (every node, instance
    /// and error): loopback, as Cilium keeps its operator API on localhost; read them with
    /// `kubectl port-forward` (may equal --metrics-addr: one listener).
    #[arg(
        long,
        env = "ENI_OPERATOR_DEBUG_ADDR",
        default_value = "127.0.0.1:9753"
    )]
    pub debug_addr: SocketAddr,
    /// Log format (the filter comes from RUST_LOG, default `info`).
    #[arg(long, env = "ENI_OPERATOR_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Also expose another operator's metric names on /metrics: `cilium` adds Cilium operator's
    /// ENI IPAM families (cilium_operator_ipam_*, cilium_operator_ec2_api_*) with Cilium's
    /// names, labels and types, and serves the Prometheus text format 0.0.4 as Cilium does.
    #[arg(long, env = "ENI_OPERATOR_METRICS_COMPAT", value_enum, default_value_t = crate::metrics_compat::MetricsCompat::None)]
    pub metrics_compat: crate::metrics_compat::MetricsCompat,
}

/// Kubernetes client and leader election.
#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "Kubernetes and leader election")]
pub struct KubeSettings {
    /// Namespace of the leader-election Lease [fallback env: POD_NAMESPACE; default: eni-operator].
    #[arg(long, env = "ENI_OPERATOR_NAMESPACE")]
    pub namespace: Option<String>,
    /// Run leader election (turn off only for a single replica, e.g. local runs).
    #[arg(long, env = "ENI_OPERATOR_LEADER_ELECTION", default_value_t = true, num_args = 0..=1, require_equals = true, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub leader_election: bool,
    /// Name of the leader-election Lease.
    #[arg(
        long,
        env = "ENI_OPERATOR_LEADER_ELECTION_LEASE_NAME",
        default_value = "eni-operator"
    )]
    pub leader_election_lease_name: String,
    /// How long a leader's lease is valid without renewal.
    #[arg(long, env = "ENI_OPERATOR_LEADER_ELECTION_LEASE_DURATION", default_value = "15s", value_parser = parse_duration)]
    pub leader_election_lease_duration: Duration,
    /// The leader steps down if it cannot renew within this time.
    #[arg(long, env = "ENI_OPERATOR_LEADER_ELECTION_RENEW_DEADLINE", default_value = "10s", value_parser = parse_duration)]
    pub leader_election_renew_deadline: Duration,
    /// Interval between lease acquisition/renewal attempts.
    #[arg(long, env = "ENI_OPERATOR_LEADER_ELECTION_RETRY_PERIOD", default_value = "2s", value_parser = parse_duration)]
    pub leader_election_retry_period: Duration,
    /// This replica's identity in the Lease [fallback env: POD_NAME; default: hostname + random suffix].
    #[arg(long, env = "ENI_OPERATOR_IDENTITY")]
    pub identity: Option<String>,
    /// Client-side rate limit on Kubernetes API requests, per second (every request, including
    /// the start of each list and watch).
    #[arg(long, env = "ENI_OPERATOR_K8S_CLIENT_QPS", default_value_t = 50.0)]
    pub k8s_client_qps: f64,
    /// Requests that may go at once above --k8s-client-qps.
    #[arg(long, env = "ENI_OPERATOR_K8S_CLIENT_BURST", default_value_t = 100)]
    pub k8s_client_burst: u32,
}

/// What the process does: serve nodes, shadow the allocator serving them now, or print a plan.
#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "Mode")]
pub struct ModeSettings {
    /// `plan`: read the cluster and EC2 once, print what the operator would do for each node
    /// now, and exit (writes nothing, no mutating EC2 call). Takes every flag of the operator.
    #[arg(value_enum)]
    pub command: Option<Command>,
    /// `active`: serve nodes (leader-elected). `shadow`: watch, plan and compare with the
    /// allocator serving the nodes now (Cilium's operator), with a read-only Kubernetes client
    /// and EC2 client: no write, no mutating EC2 call, no Lease (docs/shadow-mode.md).
    #[arg(long, env = "ENI_OPERATOR_MODE", value_enum, default_value_t = Mode::Active)]
    pub mode: Mode,
    /// Output of `plan`.
    #[arg(long, env = "ENI_OPERATOR_OUTPUT", value_enum, default_value_t = Output::Table)]
    pub output: Output,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum Command {
    /// Print what the operator would do now, per node, and exit.
    Plan,
    /// Once the operator is stopped for good: remove its finalizer from every CiliumNode and
    /// delete its Lease (waits for the Lease to lapse; refuses while an operator holds it).
    Uninstall,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    Active,
    Shadow,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Table,
    Json,
}

impl Settings {
    /// Parse the process's arguments and environment, apply fallbacks, validate.
    pub fn load() -> Result<Self, clap::Error> {
        Self::load_from(std::env::args_os())
    }

    /// As [`Settings::load`] with explicit arguments (environment still from the process).
    pub fn load_from<I, T>(args: I) -> Result<Self, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        use clap::CommandFactory;
        Self::load_with(Self::command(), args)
    }

    /// [`Settings::load_from`] with the command line `cmd` defines (the unit tests' has no
    /// environment variables, so they never write the process's environment).
    fn load_with<I, T>(mut cmd: clap::Command, args: I) -> Result<Self, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        use clap::FromArgMatches;
        let mut matches = cmd.try_get_matches_from_mut(args)?;
        let mut settings =
            Self::from_arg_matches_mut(&mut matches).map_err(|e| e.format(&mut cmd))?;
        settings.apply_fallbacks(|name| std::env::var(name).ok());
        settings
            .validate()
            .map_err(|e| cmd.error(clap::error::ErrorKind::ValueValidation, e.0))?;
        Ok(settings)
    }

    /// Fill `namespace` and `identity` from the downward-API variables or their defaults.
    pub fn apply_fallbacks(&mut self, env: impl Fn(&str) -> Option<String>) {
        let non_empty = |v: Option<String>| v.filter(|s| !s.is_empty());
        if non_empty(self.kube.namespace.clone()).is_none() {
            self.kube.namespace =
                Some(non_empty(env("POD_NAMESPACE")).unwrap_or_else(|| DEFAULT_NAMESPACE.into()));
        }
        if non_empty(self.kube.identity.clone()).is_none() {
            self.kube.identity = Some(non_empty(env("POD_NAME")).unwrap_or_else(|| {
                let host = non_empty(env("HOSTNAME"))
                    .or_else(|| {
                        std::fs::read_to_string("/etc/hostname")
                            .ok()
                            .map(|s| s.trim().to_string())
                    })
                    .filter(|s| !s.is_empty())
                    .unwrap_or_else(|| "eni-operator".into());
                // Two local runs on one host must not share a leader identity.
                format!("{host}-{:08x}", rand::random::<u32>())
            }));
        }
    }

    /// Cross-field rules clap cannot express.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let err = |m: String| Err(ConfigError(m));
        let k = &self.kube;
        if k.leader_election_renew_deadline >= k.leader_election_lease_duration {
            return err(format!(
                "--leader-election-renew-deadline ({:?}) must be shorter than --leader-election-lease-duration ({:?})",
                k.leader_election_renew_deadline, k.leader_election_lease_duration
            ));
        }
        if k.leader_election_retry_period >= k.leader_election_renew_deadline {
            return err(format!(
                "--leader-election-retry-period ({:?}) must be shorter than --leader-election-renew-deadline ({:?})",
                k.leader_election_retry_period, k.leader_election_renew_deadline
            ));
        }
        if k.leader_election_retry_period.is_zero() {
            return err("--leader-election-retry-period must be positive".into());
        }
        if k.leader_election_lease_name.is_empty() {
            return err("--leader-election-lease-name must not be empty".into());
        }
        if !(k.k8s_client_qps > 0.0 && k.k8s_client_qps.is_finite()) || k.k8s_client_burst == 0 {
            return err("--k8s-client-qps and --k8s-client-burst must be positive".into());
        }
        let e = &self.ec2;
        if e.aws_max_results_per_call < 0 {
            return err("--aws-max-results-per-call must be >= 0".into());
        }
        if e.ec2_connect_timeout.is_zero() || e.ec2_operation_timeout.is_zero() {
            return err(
                "--ec2-connect-timeout and --ec2-operation-timeout must be positive".into(),
            );
        }
        if e.ec2_api_endpoint.as_deref() == Some("") {
            return err("--ec2-api-endpoint must not be empty when set".into());
        }
        let g = &self.gate;
        if !(g.ec2_rate_fraction > 0.0 && g.ec2_rate_fraction <= 1.0) {
            return err(format!(
                "--ec2-rate-fraction must be in (0, 1], got {}",
                g.ec2_rate_fraction
            ));
        }
        if g.ec2_max_attempts == 0 {
            return err("--ec2-max-attempts must be at least 1".into());
        }
        match (g.limit_ipam_api_qps, g.limit_ipam_api_burst) {
            (None, None) => {}
            (Some(q), Some(b)) if q > 0.0 && q.is_finite() && b > 0 => {}
            (Some(_), Some(_)) => {
                return err(
                    "--limit-ipam-api-qps and --limit-ipam-api-burst must be positive".into(),
                );
            }
            _ => {
                return err(
                    "--limit-ipam-api-qps and --limit-ipam-api-burst must be set together".into(),
                );
            }
        }
        let i = &self.ipam;
        if i.cluster_name.as_deref() == Some("") {
            return err("--cluster-name must not be empty".into());
        }
        if i.static_ip_required_tag
            .as_ref()
            .is_some_and(|t| t.value.is_empty())
        {
            return err("--static-ip-required-tag needs a value: key=value".into());
        }
        let r = &self.runtime;
        if r.parallel_alloc_workers == 0 {
            return err("--parallel-alloc-workers must be at least 1".into());
        }
        if r.ec2_resync_interval.is_zero() || r.node_resync_interval.is_zero() {
            return err("--ec2-resync-interval and --node-resync-interval must be positive".into());
        }
        if r.ec2_refresh_min_spacing > r.ec2_resync_interval {
            return err(format!(
                "--ec2-refresh-min-spacing ({:?}) must not exceed --ec2-resync-interval ({:?})",
                r.ec2_refresh_min_spacing, r.ec2_resync_interval
            ));
        }
        if !r.eni_gc_interval.is_zero() && r.eni_gc_max_per_run == 0 {
            return err("--eni-gc-max-per-run must be at least 1 while the GC is enabled".into());
        }
        if self.handover.handover_quiet.is_zero() {
            return err(
                "--handover-quiet must be positive: it is how long another allocator's \
                        write of a node's pool keeps us off that node; 0 would let two \
                        allocators serve it at once"
                    .into(),
            );
        }
        self.validate_durations()
    }

    /// Every duration flag within bounds (issue 29): a zero spacing once passed here and then
    /// panicked in `tokio::time::interval` after the lease was taken (a crash loop), a zero
    /// grace period released a running instance's ENIs as soon as its Node went, and a value
    /// past a year overflows tokio's `Instant` arithmetic or the Lease's int32 seconds.
    fn validate_durations(&self) -> Result<(), ConfigError> {
        const MAX: Duration = Duration::from_secs(365 * 24 * 3600);
        // A kubelet restart or `kubectl delete node` re-registers within seconds to minutes.
        const MIN_GRACE: Duration = Duration::from_secs(60);
        let (k, e, r) = (&self.kube, &self.ec2, &self.runtime);
        // (flag, value, may it be zero: 0 disables the ENI GC)
        let all = [
            (
                "--leader-election-lease-duration",
                k.leader_election_lease_duration,
                false,
            ),
            (
                "--leader-election-renew-deadline",
                k.leader_election_renew_deadline,
                false,
            ),
            (
                "--leader-election-retry-period",
                k.leader_election_retry_period,
                false,
            ),
            ("--ec2-connect-timeout", e.ec2_connect_timeout, false),
            ("--ec2-operation-timeout", e.ec2_operation_timeout, false),
            ("--ec2-resync-interval", r.ec2_resync_interval, false),
            (
                "--ec2-refresh-min-spacing",
                r.ec2_refresh_min_spacing,
                false,
            ),
            ("--node-resync-interval", r.node_resync_interval, false),
            ("--eni-gc-interval", r.eni_gc_interval, true),
            ("--node-gone-grace-period", r.node_gone_grace_period, false),
        ];
        for (flag, value, zero_ok) in all {
            if value.is_zero() && !zero_ok {
                return Err(ConfigError(format!("{flag} must be positive")));
            }
            if value > MAX {
                return Err(ConfigError(format!(
                    "{flag} ({value:?}) must not exceed a year"
                )));
            }
        }
        if r.node_gone_grace_period < MIN_GRACE {
            return Err(ConfigError(format!(
                "--node-gone-grace-period ({:?}) must be at least {MIN_GRACE:?}: a running \
                 instance's ENIs are released that long after its Node object is gone",
                r.node_gone_grace_period
            )));
        }
        Ok(())
    }

    /// The allocation core's configuration: loops, workers, IPAM rules and the managed scope.
    pub fn core_config(&self) -> CoreConfig {
        CoreConfig {
            workers: self.runtime.parallel_alloc_workers,
            resync_interval: self.runtime.ec2_resync_interval,
            node_rescan_interval: self.runtime.node_resync_interval,
            instance_refresh_spacing: self.runtime.ec2_refresh_min_spacing,
            node_gone_grace: self.runtime.node_gone_grace_period,
            ipam: {
                let mut ipam = self.ipam.ipam_config();
                // As Cilium: the GC's tags go on every ENI created while the GC runs.
                if self.runtime.eni_gc_interval().is_some() {
                    ipam.eni_tags.extend(self.runtime.eni_gc_tags());
                }
                ipam
            },
            scope: self.ipam.scope(),
            annotate_cilium_ignore: self.ipam.annotate_cilium_ignore,
            limits_via_api: self.ipam.update_ec2_adapter_limit_via_api,
            limit_overrides: self.ipam.aws_instance_limit_mapping.clone(),
            handover_quiet: self.handover.handover_quiet,
            handover_selector: self
                .handover
                .handover_selector
                .as_ref()
                .map(|t| (t.key.clone(), t.value.clone())),
            // Every mode runs (or, for `plan`, lists) the Node watch.
            require_node: true,
            require_cluster_tag: self.ipam.instance_cluster_tag_check,
            ..CoreConfig::default()
        }
    }
}

impl KubeSettings {
    /// Namespace of the Lease (after [`Settings::apply_fallbacks`]).
    pub fn namespace(&self) -> &str {
        self.namespace.as_deref().unwrap_or(DEFAULT_NAMESPACE)
    }

    /// This replica's leader-election identity (after [`Settings::apply_fallbacks`]).
    pub fn identity(&self) -> &str {
        self.identity.as_deref().unwrap_or("eni-operator")
    }

    /// Leader election timings and this replica's identity.
    pub fn leader_config(&self) -> LeaderConfig {
        LeaderConfig {
            identity: self.identity().to_string(),
            lease_duration: self.leader_election_lease_duration,
            renew_deadline: self.leader_election_renew_deadline,
            retry_period: self.leader_election_retry_period,
        }
    }
}

#[cfg(test)]
pub(crate) mod tests;
