//! Cilium operator's ENI IPAM families as its source declares them, and which of ours each is
//! derived from.

/// One of Cilium's families: name, type, label names (without `le`), help.
pub struct Family {
    pub name: &'static str,
    pub kind: &'static str,
    pub labels: &'static [&'static str],
    pub help: &'static str,
}

const fn fam(
    name: &'static str,
    kind: &'static str,
    labels: &'static [&'static str],
    help: &'static str,
) -> Family {
    Family {
        name,
        kind,
        labels,
        help,
    }
}

const TRIGGER_QUEUED: &str = "Number of queued triggers";
const TRIGGER_FOLDS: &str = "Current level of folding";
const TRIGGER_DURATION: &str = "Duration of trigger runs";
const TRIGGER_LATENCY: &str = "Latency between queue and trigger run";

/// Every ENI IPAM family of Cilium's operator, as its source declares it.
pub const CILIUM_FAMILIES: &[Family] = &[
    fam(
        "cilium_operator_ipam_available_ips",
        "gauge",
        &["target_node"],
        "Total available IPs on Node for IPAM allocation",
    ),
    fam(
        "cilium_operator_ipam_used_ips",
        "gauge",
        &["target_node"],
        "Total used IPs on Node for IPAM allocation",
    ),
    fam(
        "cilium_operator_ipam_needed_ips",
        "gauge",
        &["target_node"],
        "Number of IPs that are needed on the Node to satisfy IPAM allocation requests",
    ),
    fam(
        "cilium_operator_ipam_ip_allocation_ops",
        "counter",
        &["subnet_id"],
        "Number of IP allocation operations",
    ),
    fam(
        "cilium_operator_ipam_ip_release_ops",
        "counter",
        &["subnet_id"],
        "Number of IP release operations",
    ),
    fam(
        "cilium_operator_ipam_interface_creation_ops",
        "counter",
        &["subnet_id"],
        "Number of interfaces allocated",
    ),
    fam(
        "cilium_operator_ipam_interface_candidates",
        "gauge",
        &[],
        "Number of attached interfaces with IPs available for allocation",
    ),
    fam(
        "cilium_operator_ipam_empty_interface_slots",
        "gauge",
        &[],
        "Number of empty interface slots available for interfaces to be attached",
    ),
    fam(
        "cilium_operator_ipam_available_ips_per_subnet",
        "gauge",
        &["subnet_id", "availability_zone"],
        "Number of available IPs per subnet ID",
    ),
    fam(
        "cilium_operator_ipam_nodes",
        "gauge",
        &["category"],
        "Number of nodes by category { total | in-deficit | at-capacity }",
    ),
    fam(
        "cilium_operator_ipam_resync_total",
        "counter",
        &[],
        "Number of resync operations to synchronize and resolve IP deficit of nodes",
    ),
    fam(
        "cilium_operator_ipam_allocation_duration_seconds",
        "histogram",
        &["type", "status", "subnet_id"],
        "Allocation ip or interface latency in seconds",
    ),
    fam(
        "cilium_operator_ipam_release_duration_seconds",
        "histogram",
        &["type", "status", "subnet_id"],
        "Release ip or interface latency in seconds",
    ),
    fam(
        "cilium_operator_ipam_background_sync_duration_seconds",
        "histogram",
        &["status"],
        "Duration in seconds of the background API resync",
    ),
    fam(
        "cilium_operator_ipam_deficit_resolver_queued_total",
        "counter",
        &[],
        TRIGGER_QUEUED,
    ),
    fam(
        "cilium_operator_ipam_deficit_resolver_folds",
        "gauge",
        &[],
        TRIGGER_FOLDS,
    ),
    fam(
        "cilium_operator_ipam_deficit_resolver_duration_seconds",
        "histogram",
        &[],
        TRIGGER_DURATION,
    ),
    fam(
        "cilium_operator_ipam_deficit_resolver_latency_seconds",
        "histogram",
        &[],
        TRIGGER_LATENCY,
    ),
    fam(
        "cilium_operator_ipam_k8s_sync_queued_total",
        "counter",
        &[],
        TRIGGER_QUEUED,
    ),
    fam(
        "cilium_operator_ipam_k8s_sync_folds",
        "gauge",
        &[],
        TRIGGER_FOLDS,
    ),
    fam(
        "cilium_operator_ipam_k8s_sync_duration_seconds",
        "histogram",
        &[],
        TRIGGER_DURATION,
    ),
    fam(
        "cilium_operator_ipam_k8s_sync_latency_seconds",
        "histogram",
        &[],
        TRIGGER_LATENCY,
    ),
    fam(
        "cilium_operator_ipam_resync_queued_total",
        "counter",
        &[],
        TRIGGER_QUEUED,
    ),
    fam(
        "cilium_operator_ipam_resync_folds",
        "gauge",
        &[],
        TRIGGER_FOLDS,
    ),
    fam(
        "cilium_operator_ipam_resync_duration_seconds",
        "histogram",
        &[],
        TRIGGER_DURATION,
    ),
    fam(
        "cilium_operator_ipam_resync_latency_seconds",
        "histogram",
        &[],
        TRIGGER_LATENCY,
    ),
    fam(
        "cilium_operator_ec2_api_duration_seconds",
        "histogram",
        &["operation", "response_code"],
        "Duration of interactions with API",
    ),
    fam(
        "cilium_operator_ec2_api_rate_limit_duration_seconds",
        "histogram",
        &["operation"],
        "Duration of client-side rate limiter blocking",
    ),
];

/// How a Cilium family is fed from ours (names as exposed, with our `eni_operator_` prefix).
pub(super) enum Source {
    /// Same samples, renamed (counters: our `_total` sample).
    Rename(&'static str),
    /// `eni_operator_nodes{state}`: total, in-deficit, at-capacity.
    Nodes,
    /// A histogram of ours; `response_code` other than `OK` becomes `Failed`.
    Histogram(&'static str),
    /// No figure of ours: declared without samples.
    None,
}

pub(super) fn source(cilium: &str) -> Source {
    match cilium {
        "cilium_operator_ipam_available_ips" => Source::Rename("eni_operator_ipam_available_ips"),
        "cilium_operator_ipam_used_ips" => Source::Rename("eni_operator_ipam_used_ips"),
        "cilium_operator_ipam_needed_ips" => Source::Rename("eni_operator_ipam_needed_ips"),
        "cilium_operator_ipam_available_ips_per_subnet" => {
            Source::Rename("eni_operator_ipam_available_ips_per_subnet")
        }
        // Cilium adds the number of addresses (AddIPAllocation(subnet, n)).
        "cilium_operator_ipam_ip_allocation_ops" => {
            Source::Rename("eni_operator_ipam_ips_allocated_total")
        }
        "cilium_operator_ipam_ip_release_ops" => {
            Source::Rename("eni_operator_ipam_ips_released_total")
        }
        "cilium_operator_ipam_interface_creation_ops" => {
            Source::Rename("eni_operator_ipam_interface_creation_ops_total")
        }
        "cilium_operator_ipam_nodes" => Source::Nodes,
        "cilium_operator_ipam_interface_candidates" => {
            Source::Rename("eni_operator_ipam_interface_candidates")
        }
        "cilium_operator_ipam_empty_interface_slots" => {
            Source::Rename("eni_operator_ipam_empty_interface_slots")
        }
        // reconcile::metrics_cilium: the same events Cilium counts and times.
        "cilium_operator_ipam_resync_total" => Source::Rename("eni_operator_ipam_resync_total"),
        "cilium_operator_ipam_allocation_duration_seconds" => {
            Source::Histogram("eni_operator_ipam_allocation_duration_seconds")
        }
        "cilium_operator_ipam_release_duration_seconds" => {
            Source::Histogram("eni_operator_ipam_release_duration_seconds")
        }
        "cilium_operator_ipam_background_sync_duration_seconds" => {
            Source::Histogram("eni_operator_ipam_background_sync_duration_seconds")
        }
        "cilium_operator_ipam_deficit_resolver_queued_total" => {
            Source::Rename("eni_operator_ipam_deficit_resolver_queued_total")
        }
        "cilium_operator_ipam_deficit_resolver_duration_seconds" => {
            Source::Histogram("eni_operator_ipam_deficit_resolver_duration_seconds")
        }
        "cilium_operator_ec2_api_duration_seconds" => {
            Source::Histogram("eni_operator_ec2_api_duration_seconds")
        }
        "cilium_operator_ec2_api_rate_limit_duration_seconds" => {
            Source::Histogram("eni_operator_ec2_rate_limit_wait_seconds")
        }
        _ => Source::None,
    }
}
