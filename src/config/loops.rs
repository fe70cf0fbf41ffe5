//! Loops and concurrency of the running operator (workers, resyncs, GC, probes).

use std::collections::BTreeMap;
use std::time::Duration;

use clap::Args;

use super::values::{Tag, parse_duration};

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
    /// (reconcile::gc::MIN_INTERVAL, above the longest create-to-attach under throttling):
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
    /// [`crate::reconcile::gc::MIN_INTERVAL`].
    pub fn eni_gc_interval(&self) -> Option<Duration> {
        (!self.eni_gc_interval.is_zero())
            .then(|| self.eni_gc_interval.max(crate::reconcile::gc::MIN_INTERVAL))
    }

    /// `--eni-gc-tags`.
    pub fn eni_gc_tags(&self) -> BTreeMap<String, String> {
        Tag::map(&self.eni_gc_tags)
    }
}
