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

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;
use std::time::Duration;

use clap::{Args, Parser, ValueEnum};

use crate::ec2::Bucket;
use crate::ec2::aws::AwsClientConfig;
use crate::ec2::gate::GateConfig;
use crate::ipam::IpamConfig;
use crate::runtime::core::CoreConfig;
use crate::runtime::leader::LeaderConfig;
use crate::runtime::refresher::Scope;

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

/// The EC2 client.
#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "EC2 client")]
pub struct Ec2Settings {
    /// AWS Region (default: aws-config's chain: AWS_REGION, profile, IMDS).
    #[arg(long, env = "ENI_OPERATOR_AWS_REGION")]
    pub aws_region: Option<String>,
    /// EC2 endpoint override (host or URL; `https://` is prepended when no scheme is given),
    /// e.g. for LocalStack or moto. AWS_ENDPOINT_URL_EC2 works too.
    #[arg(long, env = "ENI_OPERATOR_EC2_API_ENDPOINT")]
    pub ec2_api_endpoint: Option<String>,
    /// MaxResults per Describe page (0: let AWS choose).
    #[arg(
        long,
        env = "ENI_OPERATOR_AWS_MAX_RESULTS_PER_CALL",
        default_value_t = 0,
        allow_negative_numbers = true
    )]
    pub aws_max_results_per_call: i32,
    /// TCP connect timeout to EC2.
    #[arg(long, env = "ENI_OPERATOR_EC2_CONNECT_TIMEOUT", default_value = "5s", value_parser = parse_duration)]
    pub ec2_connect_timeout: Duration,
    /// Timeout of one EC2 operation (one attempt of one call).
    #[arg(long, env = "ENI_OPERATOR_EC2_OPERATION_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    pub ec2_operation_timeout: Duration,
}

/// Client-side EC2 throttling (the gate).
#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "EC2 rate limits")]
pub struct GateSettings {
    /// Share of AWS's per-action token-bucket rates we use, leaving headroom for other callers in
    /// the account and Region. In (0, 1].
    #[arg(long, env = "ENI_OPERATOR_EC2_RATE_FRACTION", default_value_t = 0.8)]
    pub ec2_rate_fraction: f64,
    /// Override one bucket as NAME=BURST/RATE (rate per second), repeatable or comma-separated.
    /// Names: describe, general-mutating, create-network-interface, assign-private-ip-addresses,
    /// unassign-private-ip-addresses, modify-network-interface-attribute, delete-network-interface.
    #[arg(long, env = "ENI_OPERATOR_EC2_BUCKET", value_delimiter = ',')]
    pub ec2_bucket: Vec<BucketOverride>,
    /// Attempts per EC2 call (throttling and transient errors), including the first.
    #[arg(long, env = "ENI_OPERATOR_EC2_MAX_ATTEMPTS", default_value_t = 5)]
    pub ec2_max_attempts: u32,
    /// Cilium-style single bucket for ALL EC2 calls, rate per second. Not recommended (one
    /// action's burst starves the others); kept for comparison. Needs --limit-ipam-api-burst.
    #[arg(long, env = "ENI_OPERATOR_LIMIT_IPAM_API_QPS")]
    pub limit_ipam_api_qps: Option<f64>,
    /// Burst of the single Cilium-style bucket. Needs --limit-ipam-api-qps.
    #[arg(long, env = "ENI_OPERATOR_LIMIT_IPAM_API_BURST")]
    pub limit_ipam_api_burst: Option<u32>,
}

/// IPAM behaviour.
#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "IPAM")]
pub struct IpamSettings {
    /// Assign /28 prefixes instead of single addresses on Nitro instances (per-node opt-out:
    /// spec.eni.disable-prefix-delegation).
    #[arg(long, env = "ENI_OPERATOR_AWS_ENABLE_PREFIX_DELEGATION", default_value_t = false, num_args = 0..=1, require_equals = true, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub aws_enable_prefix_delegation: bool,
    /// Release addresses above the node's needs (after --excess-ip-release-delay).
    #[arg(long, env = "ENI_OPERATOR_AWS_RELEASE_EXCESS_IPS", default_value_t = false, num_args = 0..=1, require_equals = true, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub aws_release_excess_ips: bool,
    /// Seconds an address must stay in excess before it is released.
    #[arg(
        long,
        env = "ENI_OPERATOR_EXCESS_IP_RELEASE_DELAY",
        default_value_t = 180
    )]
    pub excess_ip_release_delay: u64,
    /// Offer each ENI's primary address to pods (+1 per ENI); per-node spec.eni.use-primary-address wins.
    #[arg(long, env = "ENI_OPERATOR_AWS_USE_PRIMARY_ADDRESS", default_value_t = false, num_args = 0..=1, require_equals = true, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub aws_use_primary_address: bool,
    /// Extra tags for the ENIs we create, k=v[,k2=v2], repeatable.
    #[arg(long, env = "ENI_OPERATOR_ENI_TAGS", value_delimiter = ',')]
    pub eni_tags: Vec<Tag>,
    /// Cluster name, stored in the eni-operator.io/cluster-name ownership tag of created ENIs
    /// (the ENI GC deletes by it) [default: derived at start-up from the nodes' instance tags,
    /// aws:eks:cluster-name then kubernetes.io/cluster/<name>; all must agree, else the operator
    /// refuses to start].
    #[arg(long, env = "ENI_OPERATOR_CLUSTER_NAME")]
    pub cluster_name: Option<String>,
    /// New ENIs and addresses only in these subnets (IDs, comma-separated or repeated); a
    /// node's other ENIs are still known and listed.
    #[arg(long, env = "ENI_OPERATOR_SUBNET_IDS_FILTER", value_delimiter = ',')]
    pub subnet_ids_filter: Vec<String>,
    /// New ENIs and addresses only in subnets carrying all these tags, k=v[,k2=v2].
    #[arg(long, env = "ENI_OPERATOR_SUBNET_TAGS_FILTER", value_delimiter = ',')]
    pub subnet_tags_filter: Vec<Tag>,
    /// Only manage nodes whose instances carry all these tags, k=v[,k2=v2]; other nodes'
    /// CiliumNodes are left alone (another operator may serve them).
    #[arg(long, env = "ENI_OPERATOR_INSTANCE_TAGS_FILTER", value_delimiter = ',')]
    pub instance_tags_filter: Vec<Tag>,
    /// Only consider resources in this VPC (default: the VPC of the managed nodes, once known).
    #[arg(long, env = "ENI_OPERATOR_VPC_ID")]
    pub vpc_id: Option<String>,
    /// Put `ipam.cilium.io/ignore: "true"` on every CiliumNode we serve (so Cilium's operator leaves it to us), and remove it when we let a node go (eni-operator.cilium.io/ignore).
    #[arg(long, env = "ENI_OPERATOR_ANNOTATE_CILIUM_IGNORE", default_value_t = false, num_args = 0..=1, require_equals = true, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub annotate_cilium_ignore: bool,
    /// Touch only instances EC2 shows with this cluster's tag (aws:eks:cluster-name=<--cluster-name> or kubernetes.io/cluster/<--cluster-name>); off: any instance a Node's providerID names.
    #[arg(long, env = "ENI_OPERATOR_INSTANCE_CLUSTER_TAG_CHECK", default_value_t = true, num_args = 0..=1, require_equals = true, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub instance_cluster_tag_check: bool,

    // Cilium's instance-limit flags (operator/option/config.go, up to 1.17).
    /// Per-type limits that win over EC2 and the built-in table, type=adapters,ipv4,ipv6
    /// (e.g. a1.medium=2,4,4); repeatable, or `;`-separated in the environment variable.
    #[arg(
        long,
        env = "ENI_OPERATOR_AWS_INSTANCE_LIMIT_MAPPING",
        value_delimiter = ';'
    )]
    pub aws_instance_limit_mapping: Vec<crate::ec2::limits::LimitOverride>,
    /// Read instance-type limits with DescribeInstanceTypes; false: only the built-in table
    /// (AWS's published figures, src/ec2/instance_limits.csv) and --aws-instance-limit-mapping.
    #[arg(long, env = "ENI_OPERATOR_UPDATE_EC2_ADAPTER_LIMIT_VIA_API", default_value_t = true, num_args = 0..=1, require_equals = true, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub update_ec2_adapter_limit_via_api: bool,
}

/// Loops and concurrency of the running operator.
#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "Runtime")]
pub struct RuntimeSettings {
    /// Nodes allocated for concurrently.
    #[arg(
        long,
        env = "ENI_OPERATOR_PARALLEL_ALLOC_WORKERS",
        default_value_t = 50
    )]
    pub parallel_alloc_workers: usize,
    /// Full refresh of the EC2 caches (instances, ENIs, subnets, VPCs).
    #[arg(long, env = "ENI_OPERATOR_EC2_RESYNC_INTERVAL", default_value = "1m", value_parser = parse_duration)]
    pub ec2_resync_interval: Duration,
    /// Minimum spacing between two on-demand EC2 refreshes.
    #[arg(long, env = "ENI_OPERATOR_EC2_REFRESH_MIN_SPACING", default_value = "15s", value_parser = parse_duration)]
    pub ec2_refresh_min_spacing: Duration,
    /// Full rescan of all CiliumNodes.
    #[arg(long, env = "ENI_OPERATOR_NODE_RESYNC_INTERVAL", default_value = "1m", value_parser = parse_duration)]
    pub node_resync_interval: Duration,
    /// Interval of the garbage collector of leaked ENIs (0 disables it). At least 6m
    /// (runtime::gc::MIN_INTERVAL, above the longest create-to-attach under throttling):
    /// smaller values are raised to it, with a warning.
    #[arg(long, env = "ENI_OPERATOR_ENI_GC_INTERVAL", default_value = "6m", value_parser = parse_duration)]
    pub eni_gc_interval: Duration,
    /// At most this many ENIs deleted per GC run.
    #[arg(long, env = "ENI_OPERATOR_ENI_GC_MAX_PER_RUN", default_value_t = 25)]
    pub eni_gc_max_per_run: usize,
    /// How long the finalizer keeps the ENIs of an instance that still runs after its Node
    /// object was deleted (the kubelet re-registers it); released after this with an Event.
    #[arg(long, env = "ENI_OPERATOR_NODE_GONE_GRACE_PERIOD", default_value = "10m", value_parser = parse_duration)]
    pub node_gone_grace_period: Duration,
    /// As Cilium's `--eni-gc-tags`: the GC considers only unattached ENIs (of ours) carrying
    /// all of these tags, and while it is enabled every ENI we create carries them. k=v[,k2=v2],
    /// repeatable.
    #[arg(long, env = "ENI_OPERATOR_ENI_GC_TAGS", value_delimiter = ',')]
    pub eni_gc_tags: Vec<Tag>,
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
            scope: Scope::from_settings(&self.ipam),
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

impl Ec2Settings {
    /// The endpoint URL for the SDK: Cilium accepts a bare host, the SDK needs a scheme.
    pub fn endpoint_url(&self) -> Option<String> {
        self.ec2_api_endpoint.as_ref().map(|e| {
            if e.contains("://") {
                e.clone()
            } else {
                format!("https://{e}")
            }
        })
    }

    /// `MaxResults` for Describe calls, `None` when AWS should choose.
    pub fn max_results(&self) -> Option<i32> {
        (self.aws_max_results_per_call > 0).then_some(self.aws_max_results_per_call)
    }

    /// The EC2 client's Region, endpoint, timeouts and page size.
    pub fn aws_client_config(&self) -> AwsClientConfig {
        AwsClientConfig {
            region: self.aws_region.clone(),
            endpoint_url: self.endpoint_url(),
            connect_timeout: self.ec2_connect_timeout,
            operation_timeout: self.ec2_operation_timeout,
            max_results_per_call: self.max_results(),
        }
    }

    /// The SDK configuration: default credential chain and Region, with our overrides. SDK
    /// retries are disabled because the gate owns the one retry policy (and its metrics).
    pub async fn sdk_config(&self) -> aws_config::SdkConfig {
        use aws_config::{BehaviorVersion, Region, retry::RetryConfig, timeout::TimeoutConfig};
        let mut loader = aws_config::defaults(BehaviorVersion::latest())
            .retry_config(RetryConfig::disabled())
            .timeout_config(
                TimeoutConfig::builder()
                    .connect_timeout(self.ec2_connect_timeout)
                    .operation_attempt_timeout(self.ec2_operation_timeout)
                    .build(),
            );
        if let Some(region) = &self.aws_region {
            loader = loader.region(Region::new(region.clone()));
        }
        if let Some(url) = self.endpoint_url() {
            loader = loader.endpoint_url(url);
        }
        loader.load().await
    }
}

impl GateSettings {
    /// (burst, rate per second) for a bucket: an override, else AWS's default × the fraction.
    pub fn bucket_limits(&self, bucket: Bucket) -> (u32, f64) {
        if let Some(o) = self.ec2_bucket.iter().rev().find(|o| o.bucket == bucket) {
            return (o.burst, o.rate);
        }
        let (burst, rate) = bucket.aws_default();
        let burst = ((burst as f64 * self.ec2_rate_fraction).floor() as u32).max(1);
        (burst, rate as f64 * self.ec2_rate_fraction)
    }

    /// The gate's buckets (every one, overrides applied), single-bucket mode and attempts.
    pub fn gate_config(&self) -> GateConfig {
        GateConfig {
            rate_fraction: self.ec2_rate_fraction,
            overrides: Bucket::ALL
                .iter()
                .map(|b| (*b, self.bucket_limits(*b)))
                .collect(),
            single_bucket: self.limit_ipam_api_qps.zip(self.limit_ipam_api_burst),
            max_attempts: self.ec2_max_attempts,
            ..GateConfig::aws_defaults()
        }
    }
}

impl IpamSettings {
    /// `--cluster-name`, once given or derived (`crate::cluster_name::resolve`, at start-up).
    ///
    /// # Panics
    /// When neither happened: every start-up path resolves it before building the core, so
    /// no ENI is ever tagged, or collected, under a name nobody chose.
    pub fn cluster_name(&self) -> &str {
        self.cluster_name
            .as_deref()
            .expect("--cluster-name is resolved at start-up before it is used")
    }

    pub fn eni_tags(&self) -> BTreeMap<String, String> {
        Tag::map(&self.eni_tags)
    }

    pub fn subnet_tags(&self) -> BTreeMap<String, String> {
        Tag::map(&self.subnet_tags_filter)
    }

    pub fn instance_tags(&self) -> BTreeMap<String, String> {
        Tag::map(&self.instance_tags_filter)
    }

    pub fn excess_ip_release_delay(&self) -> Duration {
        Duration::from_secs(self.excess_ip_release_delay)
    }

    /// The IPAM engine's switches, delay and ENI tags.
    pub fn ipam_config(&self) -> IpamConfig {
        IpamConfig {
            prefix_delegation: self.aws_enable_prefix_delegation,
            release_excess_ips: self.aws_release_excess_ips,
            release_delay: self.excess_ip_release_delay(),
            use_primary_address: self.aws_use_primary_address,
            eni_tags: self.eni_tags(),
            cluster_name: self.cluster_name().to_string(),
            ..IpamConfig::default()
        }
    }
}

impl RuntimeSettings {
    /// The leader's probe limits (`http::LeaderVitals`): its event loop is wedged when it has
    /// not turned for four confirmation ticks (`--ec2-refresh-min-spacing`; it turns on each),
    /// at least 2 minutes; EC2 is unreachable when no full refresh succeeded for three
    /// `--ec2-resync-interval`s, at least 3 minutes (one failed refresh is retried on the next
    /// tick, and at thousands of nodes one refresh takes a while).
    pub fn probe_limits(&self) -> (Duration, Duration) {
        const FLOOR_WEDGED: Duration = Duration::from_secs(120);
        const FLOOR_STALE: Duration = Duration::from_secs(180);
        (
            self.ec2_refresh_min_spacing
                .saturating_mul(4)
                .max(FLOOR_WEDGED),
            self.ec2_resync_interval.saturating_mul(3).max(FLOOR_STALE),
        )
    }

    /// `None` when the ENI GC is disabled (`--eni-gc-interval 0`); at least
    /// [`crate::runtime::gc::MIN_INTERVAL`].
    pub fn eni_gc_interval(&self) -> Option<Duration> {
        (!self.eni_gc_interval.is_zero())
            .then(|| self.eni_gc_interval.max(crate::runtime::gc::MIN_INTERVAL))
    }

    /// `--eni-gc-tags`.
    pub fn eni_gc_tags(&self) -> BTreeMap<String, String> {
        Tag::map(&self.eni_gc_tags)
    }
}

/// Parse a duration in Go's `time.ParseDuration` grammar (`500ms`, `1.5m`, `1h30m`, `0`), as
/// Cilium's flags and Helm values take them, so a value pasted from a Cilium install means the
/// same here. The chart's `values.schema.json` pattern accepts the same strings
/// (`tests/chart.rs` runs both over one table). Negative durations are refused.
pub fn parse_duration(input: &str) -> Result<Duration, String> {
    // Go's one unit-less form (signed too), which the crate does not take.
    let parsed = if input.strip_prefix(['+', '-']).unwrap_or(input) == "0" {
        Ok(go_duration::GoDuration::ZERO)
    } else {
        go_duration::parse_go_duration(input)
    };
    let nanos = parsed
        .map_err(|e| {
            format!("invalid duration {input:?}: {e} (Go's syntax: 500ms, 15s, 1.5m, 1h30m)")
        })?
        .nanoseconds();
    if input.starts_with('-') {
        return Err(format!("invalid duration {input:?}: must not be negative"));
    }
    Ok(Duration::from_nanos(nanos.unsigned_abs()))
}

/// One `key=value` tag.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tag {
    pub key: String,
    pub value: String,
}

impl Tag {
    fn map(tags: &[Tag]) -> BTreeMap<String, String> {
        tags.iter()
            .map(|t| (t.key.clone(), t.value.clone()))
            .collect()
    }
}

impl FromStr for Tag {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.split_once('=') {
            Some((k, v)) if !k.trim().is_empty() => Ok(Tag {
                key: k.trim().to_string(),
                value: v.trim().to_string(),
            }),
            _ => Err(format!("invalid tag {s:?}: expected key=value")),
        }
    }
}

impl fmt::Display for Tag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}", self.key, self.value)
    }
}

/// `NAME=BURST/RATE`: replaces one gate bucket's limits (not scaled by the rate fraction).
#[derive(Clone, Debug, PartialEq)]
pub struct BucketOverride {
    pub bucket: Bucket,
    pub burst: u32,
    /// Tokens per second.
    pub rate: f64,
}

impl FromStr for BucketOverride {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || {
            format!("invalid bucket override {s:?}: expected NAME=BURST/RATE, e.g. describe=100/20")
        };
        let (name, limits) = s.split_once('=').ok_or_else(bad)?;
        let name = name.trim();
        let bucket = Bucket::ALL
            .into_iter()
            .find(|b| b.name() == name)
            .ok_or_else(|| {
                let names: Vec<_> = Bucket::ALL.iter().map(|b| b.name()).collect();
                format!("unknown EC2 bucket {name:?}; known: {}", names.join(", "))
            })?;
        let (burst, rate) = limits.split_once('/').ok_or_else(bad)?;
        let burst: u32 = burst.trim().parse().map_err(|_| bad())?;
        let rate: f64 = rate.trim().parse().map_err(|_| bad())?;
        if burst == 0 || !(rate > 0.0 && rate.is_finite()) {
            return Err(format!(
                "invalid bucket override {s:?}: burst and rate must be positive"
            ));
        }
        Ok(BucketOverride {
            bucket,
            burst,
            rate,
        })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use clap::{CommandFactory, FromArgMatches};

    /// The settings' command line without their environment variables, so a developer's shell
    /// cannot change what a test parses. How the environment overrides defaults and yields to
    /// flags is tested in `tests/config_env.rs` (writing the environment is unsafe).
    fn command() -> clap::Command {
        Settings::command().mut_args(|a| a.env(None))
    }

    fn try_parse(args: &[&str]) -> Result<Settings, clap::Error> {
        let args = std::iter::once("eni-operator").chain(args.iter().copied());
        Settings::from_arg_matches_mut(&mut command().try_get_matches_from(args)?)
    }

    fn parse(args: &[&str]) -> Result<Settings, clap::Error> {
        Settings::load_with(
            command(),
            std::iter::once("eni-operator").chain(args.iter().copied()),
        )
    }

    #[test]
    fn eni_gc_tags_go_on_created_enis_and_the_interval_has_a_floor() {
        let s = parse(&[
            "--cluster-name=c",
            "--eni-gc-tags=team=blue,env=prod",
            "--eni-gc-interval=1m",
        ])
        .unwrap();
        let gc = BTreeMap::from([
            ("team".to_string(), "blue".to_string()),
            ("env".to_string(), "prod".to_string()),
        ]);
        assert_eq!(s.runtime.eni_gc_tags(), gc);
        assert_eq!(s.core_config().ipam.eni_tags, gc, "created ENIs carry them");
        assert_eq!(
            s.runtime.eni_gc_interval(),
            Some(crate::runtime::gc::MIN_INTERVAL)
        );
        let off = parse(&[
            "--cluster-name=c",
            "--eni-gc-tags=team=blue",
            "--eni-gc-interval=0",
        ])
        .unwrap();
        assert_eq!(off.runtime.eni_gc_interval(), None);
        assert!(
            off.core_config().ipam.eni_tags.is_empty(),
            "GC off: not added"
        );
    }

    #[test]
    fn defaults() {
        let s = parse(&["--namespace", "ns", "--identity", "me"]).unwrap();
        assert_eq!(s.server.metrics_addr, "0.0.0.0:9751".parse().unwrap());
        assert_eq!(s.server.health_addr, "0.0.0.0:9752".parse().unwrap());
        assert_eq!(s.server.log_format, LogFormat::Text);
        assert!(s.kube.leader_election);
        assert_eq!(s.kube.leader_election_lease_name, "eni-operator");
        assert_eq!(
            s.kube.leader_election_lease_duration,
            Duration::from_secs(15)
        );
        assert_eq!(
            s.kube.leader_election_renew_deadline,
            Duration::from_secs(10)
        );
        assert_eq!(s.kube.leader_election_retry_period, Duration::from_secs(2));
        assert_eq!(
            (s.kube.k8s_client_qps, s.kube.k8s_client_burst),
            (50.0, 100)
        );
        assert_eq!(s.ec2.aws_region, None);
        assert_eq!(s.ec2.endpoint_url(), None);
        assert_eq!(s.ec2.max_results(), None);
        assert_eq!(s.ec2.ec2_connect_timeout, Duration::from_secs(5));
        assert_eq!(s.ec2.ec2_operation_timeout, Duration::from_secs(30));
        assert_eq!(s.gate.ec2_rate_fraction, 0.8);
        assert!(s.gate.ec2_bucket.is_empty());
        assert_eq!(s.gate.ec2_max_attempts, 5);
        assert_eq!(s.gate.limit_ipam_api_qps, None);
        assert!(!s.ipam.aws_enable_prefix_delegation);
        assert!(!s.ipam.aws_release_excess_ips);
        assert_eq!(s.ipam.excess_ip_release_delay(), Duration::from_secs(180));
        assert!(!s.ipam.aws_use_primary_address);
        assert!(s.ipam.eni_tags().is_empty());
        // No silent `default` (the GC deletes by it): unset until derived at start-up.
        assert_eq!(s.ipam.cluster_name, None);
        assert_eq!(s.ipam.vpc_id, None);
        assert!(!s.ipam.annotate_cilium_ignore);
        assert_eq!(s.runtime.parallel_alloc_workers, 50);
        assert_eq!(s.runtime.ec2_resync_interval, Duration::from_secs(60));
        assert_eq!(s.runtime.ec2_refresh_min_spacing, Duration::from_secs(15));
        assert_eq!(s.runtime.node_resync_interval, Duration::from_secs(60));
        assert_eq!(s.runtime.eni_gc_interval(), Some(Duration::from_secs(360)));
        assert_eq!(s.runtime.eni_gc_max_per_run, 25);
        assert_eq!(s.kube.namespace(), "ns");
        assert_eq!(s.kube.identity(), "me");
    }

    #[test]
    fn downward_api_fallbacks() {
        let mut s = try_parse(&[]).unwrap();
        s.apply_fallbacks(|n| match n {
            "POD_NAMESPACE" => Some("kube-system".into()),
            "POD_NAME" => Some("eni-operator-abc".into()),
            _ => None,
        });
        assert_eq!(s.kube.namespace(), "kube-system");
        assert_eq!(s.kube.identity(), "eni-operator-abc");

        let mut s = try_parse(&[]).unwrap();
        s.apply_fallbacks(|n| (n == "HOSTNAME").then(|| "laptop".to_string()));
        assert_eq!(s.kube.namespace(), DEFAULT_NAMESPACE);
        let id = s.kube.identity();
        assert!(
            id.starts_with("laptop-") && id.len() == "laptop-".len() + 8,
            "{id}"
        );

        // An explicit flag beats the downward API.
        let mut s = try_parse(&["--namespace", "mine"]).unwrap();
        s.apply_fallbacks(|_| Some("other".into()));
        assert_eq!(s.kube.namespace(), "mine");
    }

    #[test]
    fn bool_flags_take_optional_values() {
        let s = parse(&["--aws-enable-prefix-delegation", "--leader-election=false"]).unwrap();
        assert!(s.ipam.aws_enable_prefix_delegation);
        assert!(!s.kube.leader_election);
    }

    /// An optional value is given with `=` only: the word after the flag is the next argument
    /// (`eni-operator --cilium-operator-absent plan` runs `plan`).
    #[test]
    fn an_optional_value_flag_leaves_the_next_word_alone() {
        let s = try_parse(&["--cilium-operator-absent", "plan"]).unwrap();
        assert!(s.handover.cilium_operator_absent);
        assert_eq!(s.mode.command, Some(Command::Plan));
        let s = try_parse(&["--cilium-operator-absent=false", "uninstall"]).unwrap();
        assert!(!s.handover.cilium_operator_absent);
        assert_eq!(s.mode.command, Some(Command::Uninstall));
        for arg in Settings::command().get_arguments() {
            let optional = arg.get_num_args().is_some_and(|n| n.min_values() == 0);
            if optional && !arg.is_positional() {
                assert!(arg.is_require_equals_set(), "--{} takes `=`", arg.get_id());
            }
        }
    }

    #[test]
    fn durations() {
        let d = |s| parse_duration(s);
        // Go's grammar: fractions, compounds in any order, ns/us, a bare 0.
        for (text, want) in [
            ("15s", Duration::from_secs(15)),
            ("5m", Duration::from_secs(300)),
            ("500ms", Duration::from_millis(500)),
            ("2h", Duration::from_secs(7200)),
            ("1m30s", Duration::from_secs(90)),
            ("0", Duration::ZERO),
            ("1.5m", Duration::from_secs(90)),
            ("1h30m", Duration::from_secs(5400)),
            (".5s", Duration::from_millis(500)),
            ("2.s", Duration::from_secs(2)),
            ("1s1m", Duration::from_secs(61)),
            ("+3s", Duration::from_secs(3)),
            ("250us", Duration::from_micros(250)),
        ] {
            assert_eq!(d(text), Ok(want), "{text}");
        }
        for bad in [
            "",
            "s",
            "10x",
            "45",
            "-1s",
            "-0s",
            "m5",
            " 1s",
            "1s ",
            "1 s",
            "1d",
            ".s",
            "1µ",
            "99999999999h",
        ] {
            assert!(d(bad).is_err(), "{bad:?} should be rejected");
        }
    }

    #[test]
    fn tags_and_bucket_overrides() {
        assert_eq!(
            "a=b".parse::<Tag>(),
            Ok(Tag {
                key: "a".into(),
                value: "b".into()
            })
        );
        assert_eq!("a=".parse::<Tag>().unwrap().value, "");
        assert!("=b".parse::<Tag>().is_err());
        assert!("ab".parse::<Tag>().is_err());

        let o: BucketOverride = "create-network-interface=20/2.5".parse().unwrap();
        assert_eq!(o.bucket, Bucket::CreateNetworkInterface);
        assert_eq!((o.burst, o.rate), (20, 2.5));
        for bad in [
            "nope=1/1",
            "describe",
            "describe=10",
            "describe=0/1",
            "describe=1/0",
            "describe=x/1",
        ] {
            assert!(bad.parse::<BucketOverride>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn endpoint_gets_a_scheme() {
        let s = parse(&["--ec2-api-endpoint", "ec2.eu-west-1.amazonaws.com"]).unwrap();
        assert_eq!(
            s.ec2.endpoint_url().as_deref(),
            Some("https://ec2.eu-west-1.amazonaws.com")
        );
        let s = parse(&["--ec2-api-endpoint", "http://127.0.0.1:5000"]).unwrap();
        assert_eq!(
            s.ec2.endpoint_url().as_deref(),
            Some("http://127.0.0.1:5000")
        );
    }

    #[test]
    fn validation_errors() {
        let cases: &[(&[&str], &str)] = &[
            (
                &["--leader-election-renew-deadline", "15s"],
                "--leader-election-renew-deadline",
            ),
            (
                &["--leader-election-retry-period", "10s"],
                "--leader-election-retry-period",
            ),
            (&["--ec2-rate-fraction", "0"], "--ec2-rate-fraction"),
            (&["--ec2-rate-fraction", "1.5"], "--ec2-rate-fraction"),
            (&["--ec2-max-attempts", "0"], "--ec2-max-attempts"),
            (&["--limit-ipam-api-qps", "4"], "set together"),
            (
                &["--limit-ipam-api-qps", "0", "--limit-ipam-api-burst", "2"],
                "positive",
            ),
            (&["--cluster-name", ""], "--cluster-name"),
            (
                &["--parallel-alloc-workers", "0"],
                "--parallel-alloc-workers",
            ),
            (
                &["--ec2-refresh-min-spacing", "2m"],
                "--ec2-refresh-min-spacing",
            ),
            (&["--eni-gc-max-per-run", "0"], "--eni-gc-max-per-run"),
            (
                &["--aws-max-results-per-call", "-1"],
                "--aws-max-results-per-call",
            ),
            (&["--node-resync-interval", "0"], "--node-resync-interval"),
        ];
        for (args, needle) in cases {
            let e = parse(args).expect_err(&format!("{args:?} should be rejected"));
            assert!(e.to_string().contains(needle), "{args:?}: {e}");
        }
        // Every duration flag (issue 29): zero where that breaks the loop or the grace, and
        // past a year (tokio's Instant arithmetic, the Lease's int32 seconds).
        for flag in [
            "--leader-election-lease-duration",
            "--ec2-connect-timeout",
            "--ec2-resync-interval",
            "--ec2-refresh-min-spacing",
            "--node-resync-interval",
            "--node-gone-grace-period",
        ] {
            let e = parse(&[flag, "0"]).expect_err(flag);
            assert!(e.to_string().contains(flag), "{flag}: {e}");
        }
        for flag in [
            "--ec2-resync-interval",
            "--eni-gc-interval",
            "--node-gone-grace-period",
        ] {
            let e = parse(&[flag, "9000h"]).expect_err(flag);
            assert!(e.to_string().contains(flag), "{flag}: {e}");
        }
        let e = parse(&["--node-gone-grace-period", "30s"]).unwrap_err();
        assert!(e.to_string().contains("at least"), "{e}");
        assert!(parse(&["--node-gone-grace-period", "1m"]).is_ok());
        // GC disabled: max-per-run is irrelevant.
        assert!(parse(&["--eni-gc-interval", "0", "--eni-gc-max-per-run", "0"]).is_ok());
        // Parser errors name the flag too.
        let e = parse(&["--ec2-resync-interval", "soon"]).unwrap_err();
        assert!(e.to_string().contains("--ec2-resync-interval"), "{e}");
        let e = parse(&["--ec2-bucket", "nope=1/1"]).unwrap_err();
        assert!(e.to_string().contains("unknown EC2 bucket"), "{e}");
    }

    /// The README's configuration reference (generated from `--help`) lists every setting.
    #[test]
    fn readme_documents_every_setting() {
        let readme = include_str!("../README.md");
        for arg in Settings::command().get_arguments() {
            let (Some(flag), Some(env)) = (arg.get_long(), arg.get_env()) else {
                continue;
            };
            let row = format!("| `--{flag}` | `{}` |", env.to_string_lossy());
            assert!(
                readme.contains(&row),
                "README lacks {row}: regenerate with scripts/config-table.py"
            );
        }
    }

    #[test]
    fn every_flag_has_an_env_var_and_help() {
        for arg in Settings::command().get_arguments() {
            let id = arg.get_id().as_str();
            // The `plan` subcommand is a positional word, not a setting.
            if matches!(id, "help" | "version") || arg.is_positional() {
                continue;
            }
            let env = arg
                .get_env()
                .unwrap_or_else(|| panic!("{id} has no env var"));
            let expected = format!("ENI_OPERATOR_{}", id.to_uppercase());
            assert_eq!(env.to_string_lossy(), expected, "env name of --{id}");
            assert!(arg.get_help().is_some(), "--{id} has no help");
        }
        Settings::command().debug_assert();
    }
    #[test]
    fn ipam_flags_reach_the_ipam_config() {
        let s = parse(&[
            "--aws-enable-prefix-delegation",
            "--aws-release-excess-ips",
            "--excess-ip-release-delay=30",
            "--aws-use-primary-address",
            "--eni-tags=team=blue",
            "--cluster-name=prod",
        ])
        .unwrap();
        let c = s.ipam.ipam_config();
        assert!(c.prefix_delegation && c.release_excess_ips && c.use_primary_address);
        assert_eq!(c.release_delay, Duration::from_secs(30));
        assert_eq!(c.eni_tags, BTreeMap::from([("team".into(), "blue".into())]));
        assert_eq!(c.cluster_name, "prod");
    }

    #[test]
    fn runtime_and_ipam_flags_reach_the_core_config() {
        let s = parse(&[
            "--parallel-alloc-workers=7",
            "--ec2-resync-interval=2m",
            "--node-resync-interval=3m",
            "--ec2-refresh-min-spacing=20s",
            "--annotate-cilium-ignore",
            "--vpc-id=vpc-9",
            "--cluster-name=prod",
        ])
        .unwrap();
        let c = s.core_config();
        assert_eq!(c.workers, 7);
        assert_eq!(c.resync_interval, Duration::from_secs(120));
        assert_eq!(c.node_rescan_interval, Duration::from_secs(180));
        assert_eq!(c.instance_refresh_spacing, Duration::from_secs(20));
        assert!(c.annotate_cilium_ignore);
        assert_eq!(c.scope.vpc_id.as_deref(), Some("vpc-9"));
        assert_eq!(c.ipam.cluster_name, "prod");
        assert!(
            c.require_node,
            "the binary always checks CiliumNodes against their Nodes"
        );
        assert!(
            c.require_cluster_tag,
            "and their instances' cluster tag, unless told not to"
        );
    }

    #[test]
    fn election_flags_reach_the_leader_config() {
        let s = parse(&[
            "--identity=replica-1",
            "--leader-election-lease-duration=20s",
            "--leader-election-renew-deadline=12s",
            "--leader-election-retry-period=3s",
        ])
        .unwrap();
        let c = s.kube.leader_config();
        assert_eq!(c.identity, "replica-1");
        assert_eq!(c.lease_duration, Duration::from_secs(20));
        assert_eq!(c.renew_deadline, Duration::from_secs(12));
        assert_eq!(c.retry_period, Duration::from_secs(3));
    }

    #[test]
    fn ec2_flags_reach_the_aws_client_config() {
        let s = parse(&[
            "--aws-region=eu-west-1",
            "--ec2-api-endpoint=localhost:5000",
            "--ec2-connect-timeout=2s",
            "--ec2-operation-timeout=9s",
            "--aws-max-results-per-call=50",
        ])
        .unwrap();
        let c = s.ec2.aws_client_config();
        assert_eq!(c.region.as_deref(), Some("eu-west-1"));
        assert_eq!(c.endpoint_url.as_deref(), Some("https://localhost:5000"));
        assert_eq!(c.connect_timeout, Duration::from_secs(2));
        assert_eq!(c.operation_timeout, Duration::from_secs(9));
        assert_eq!(c.max_results_per_call, Some(50));
    }

    #[test]
    fn gate_flags_reach_the_gate_config() {
        let s = parse(&[
            "--ec2-rate-fraction=0.5",
            "--ec2-bucket=describe=7/3",
            "--ec2-max-attempts=2",
            "--limit-ipam-api-qps=4",
            "--limit-ipam-api-burst=9",
        ])
        .unwrap();
        let c = s.gate.gate_config();
        assert_eq!(c.rate_fraction, 0.5);
        assert_eq!(c.overrides[&Bucket::Describe], (7, 3.0));
        // Every bucket gets its limits, the others at half of AWS's defaults.
        assert_eq!(c.overrides.len(), Bucket::ALL.len());
        let (burst, rate) = Bucket::DeleteNetworkInterface.aws_default();
        assert_eq!(
            c.overrides[&Bucket::DeleteNetworkInterface],
            (burst / 2, rate as f64 / 2.0)
        );
        assert_eq!(c.single_bucket, Some((4.0, 9)));
        assert_eq!(c.max_attempts, 2);
    }
}

/// Handing nodes over from Cilium's operator (`docs/migrating-from-cilium.md`).
#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "Handover")]
pub struct HandoverSettings {
    /// Namespace of Cilium's operator: its leader Lease `cilium-operator-resource-lock` there
    /// tells whether it runs (the handover guard; needs `get` on that Lease).
    #[arg(
        long,
        env = "ENI_OPERATOR_CILIUM_NAMESPACE",
        default_value = "kube-system"
    )]
    pub cilium_namespace: String,
    /// Read Cilium operator's Lease at all (off: the guard relies on managedFields alone).
    #[arg(long, env = "ENI_OPERATOR_WATCH_CILIUM_LEASE", default_value_t = true, num_args = 0..=1, require_equals = true, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub watch_cilium_lease: bool,
    /// Cilium's operator is not installed in this cluster: a Lease that cannot be read or is
    /// not found does not hold nodes back. Without it the guard fails closed: until the
    /// Lease can be read, nodes not taken over yet wait (a 404 may mean a wrong
    /// --cilium-namespace).
    #[arg(long, env = "ENI_OPERATOR_CILIUM_OPERATOR_ABSENT", default_value_t = false, num_args = 0..=1, require_equals = true, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub cilium_operator_absent: bool,
    /// You verified that Cilium's operator is 1.18 or later, so it honours
    /// `ipam.cilium.io/ignore`: the guard does not read its release from the
    /// `io.cilium.k8s.crd.schema.version` label of the CiliumNode CRD. Without it, while
    /// Cilium's Lease is held and that label names a release before 1.18 (or cannot be read),
    /// no node is taken over (`CiliumIgnoresAnnotation`).
    #[arg(long, env = "ENI_OPERATOR_CILIUM_HONOURS_IGNORE", default_value_t = false, num_args = 0..=1, require_equals = true, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub cilium_honours_ignore: bool,
    /// How long another field manager's write of `spec.ipam.pool` / `status.eni` after ours
    /// counts as a running second allocator (longer than Cilium's one-minute resync).
    #[arg(long, env = "ENI_OPERATOR_HANDOVER_QUIET", default_value = "3m", value_parser = parse_duration)]
    pub handover_quiet: Duration,
    /// Canary handover: serve only CiliumNodes labelled key=value; a served node that loses
    /// the label is handed back (finalizer and Cilium's ignore annotation removed).
    #[arg(long, env = "ENI_OPERATOR_HANDOVER_SELECTOR")]
    pub handover_selector: Option<Tag>,
}
