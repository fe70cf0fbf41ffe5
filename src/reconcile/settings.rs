//! Settings of the allocation core ([`CoreConfig`]); `main` fills them from the command line.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use crate::ipam::IpamConfig;

use crate::cache::Ec2Cache;
use crate::cache::refresher::Scope;

/// Settings of the core.
#[derive(Clone, Debug)]
pub struct CoreConfig {
    /// `--parallel-alloc-workers`.
    pub workers: usize,
    /// Full EC2 refresh followed by a rescan of every node.
    pub resync_interval: Duration,
    /// Rescan of every node on the cached EC2 view (`--node-resync-interval`).
    pub node_rescan_interval: Duration,
    /// Minimum spacing of per-instance refreshes after our own changes.
    pub instance_refresh_spacing: Duration,
    /// How long a node whose instance is "not running" is left alone.
    pub not_running_hold: Duration,
    /// `--node-gone-grace-period`: how long the ENIs of a running instance whose Node object is
    /// gone are kept before the finalizer releases them anyway.
    pub node_gone_grace: Duration,
    /// Retry spacing while the EC2 view is unhealthy.
    pub unhealthy_retry: Duration,
    /// Load every instance type's limits at start (else only types seen on nodes).
    pub preload_instance_types: bool,
    pub ipam: IpamConfig,
    pub scope: Scope,
    /// `--annotate-cilium-ignore`: keep `ipam.cilium.io/ignore: "true"` on the nodes we serve.
    pub annotate_cilium_ignore: bool,
    /// Seed of the work queue's backoff jitter; `None` (production): the OS's randomness.
    /// The simulation sets it so a seed replays exactly ([`crate::jitter`]).
    pub jitter_seed: Option<u64>,
    /// Wall time at a clock instant, for `wall_now`; `None` (production): the system's clock at
    /// the core's start. The simulation gives every process of a run one clock, as the API
    /// server's timestamps are.
    pub wall_epoch: Option<(k8s_openapi::jiff::Timestamp, std::time::Instant)>,
    /// `--update-ec2-adapter-limit-via-api`: limits from `DescribeInstanceTypes`; false: from
    /// the built-in table only, and no `DescribeInstanceTypes` call is ever made.
    pub limits_via_api: bool,
    /// `--aws-instance-limit-mapping`.
    pub limit_overrides: Vec<crate::ec2::limits::LimitOverride>,
    /// The handover guard: how long another manager's pool write counts as a running
    /// allocator (`--handover-quiet`).
    pub handover_quiet: Duration,
    /// Canary handover (`--handover-selector key=value`): serve only CiliumNodes with this
    /// label; a served node that loses it is handed back.
    pub handover_selector: Option<(String, String)>,
    /// A Node watch feeds the core (production, shadow, `plan`): a CiliumNode is served only
    /// once the Nodes are listed and its Node confirms its instance (§15). Off (tests and the
    /// benchmark drive the core without one): a name no Node input spoke of is taken on trust.
    pub require_node: bool,
    /// EC2 must show a node's instance with this cluster's tag before any call touches it
    /// (§15; `--instance-cluster-tag-check`). Off in tests whose simulated instances carry no
    /// tags.
    pub require_cluster_tag: bool,
}

impl CoreConfig {
    /// An empty EC2 view for the core: it keeps this cluster's unattached ENIs as leftovers.
    pub fn ec2_cache(&self) -> Arc<RwLock<Ec2Cache>> {
        let mut cache = Ec2Cache::for_cluster(self.ipam.cluster_name.clone());
        if !self.limits_via_api {
            cache.set_limits(crate::ec2::limits::builtin().values().cloned());
        }
        cache.set_limit_overrides(self.limit_overrides.iter().cloned());
        Arc::new(RwLock::new(cache))
    }
}

impl Default for CoreConfig {
    fn default() -> Self {
        Self {
            workers: 50,
            resync_interval: Duration::from_secs(60),
            node_rescan_interval: Duration::from_secs(60),
            instance_refresh_spacing: Duration::from_secs(15),
            not_running_hold: Duration::from_secs(60),
            node_gone_grace: crate::reconcile::finalizer::NODE_GONE_GRACE,
            unhealthy_retry: Duration::from_secs(60),
            preload_instance_types: true,
            ipam: IpamConfig::default(),
            scope: Scope::default(),
            annotate_cilium_ignore: false,
            jitter_seed: None,
            wall_epoch: None,
            limits_via_api: true,
            limit_overrides: Vec::new(),
            handover_quiet: Duration::from_secs(180),
            handover_selector: None,
            require_node: false,
            require_cluster_tag: false,
        }
    }
}
