//! `--metrics-compat=cilium` (issue 22, part 3): after a small run, the scrape carries every
//! ENI IPAM family of Cilium's operator with Cilium's name, type and label names, in the
//! Prometheus text format Cilium serves, with our figures where we have them.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use eni_operator::ec2::gate::{Gate, GateConfig};
use eni_operator::event_loop::core::NodeInput;
use eni_operator::metrics::MetricsRegistry;
use eni_operator::metrics_compat::{MetricsCompat, TEXT_CONTENT_TYPE, parse_sample};
use eni_operator::reconcile::metrics::RuntimeMetrics;
use testkit::cluster::{Cluster, agent_node};
use testkit::running;
use testkit::sink::MemorySink;
use testkit::{served, wait_until};

/// Cilium operator's ENI IPAM families (name, type, label names), read from
/// github.com/cilium/cilium `operator/pkg/ipam/metrics/metrics.go` (commit
/// 09b89c6c9e2548486913ac5dfce38c0bcabdd6e6: namespace `cilium_operator`, subsystem `ipam`) and
/// `pkg/api/metrics/metrics.go` (commit 19e73125f5e5f1a598bde216a00fd84aa63f57bd, subsystem
/// `ec2` from `operator/pkg/ipam/allocator/aws/metrics.go`); the triggers' families are added by
/// [`cilium_families`].
const CILIUM: &[(&str, &str, &[&str])] = &[
    (
        "cilium_operator_ipam_available_ips",
        "gauge",
        &["target_node"],
    ),
    ("cilium_operator_ipam_used_ips", "gauge", &["target_node"]),
    ("cilium_operator_ipam_needed_ips", "gauge", &["target_node"]),
    (
        "cilium_operator_ipam_ip_allocation_ops",
        "counter",
        &["subnet_id"],
    ),
    (
        "cilium_operator_ipam_ip_release_ops",
        "counter",
        &["subnet_id"],
    ),
    (
        "cilium_operator_ipam_interface_creation_ops",
        "counter",
        &["subnet_id"],
    ),
    ("cilium_operator_ipam_interface_candidates", "gauge", &[]),
    ("cilium_operator_ipam_empty_interface_slots", "gauge", &[]),
    (
        "cilium_operator_ipam_available_ips_per_subnet",
        "gauge",
        &["subnet_id", "availability_zone"],
    ),
    ("cilium_operator_ipam_nodes", "gauge", &["category"]),
    ("cilium_operator_ipam_resync_total", "counter", &[]),
    (
        "cilium_operator_ipam_allocation_duration_seconds",
        "histogram",
        &["type", "status", "subnet_id"],
    ),
    (
        "cilium_operator_ipam_release_duration_seconds",
        "histogram",
        &["type", "status", "subnet_id"],
    ),
    (
        "cilium_operator_ipam_background_sync_duration_seconds",
        "histogram",
        &["status"],
    ),
    (
        "cilium_operator_ec2_api_duration_seconds",
        "histogram",
        &["operation", "response_code"],
    ),
    (
        "cilium_operator_ec2_api_rate_limit_duration_seconds",
        "histogram",
        &["operation"],
    ),
];

/// Cilium's IPAM triggers: each has the four families of Cilium's `pkg/trigger` metrics
/// (`_queued_total`, `_folds`, `_duration_seconds`, `_latency_seconds`), without labels.
const CILIUM_TRIGGERS: [&str; 3] = ["deficit_resolver", "k8s_sync", "resync"];

/// [`CILIUM`] and the families of [`CILIUM_TRIGGERS`].
fn cilium_families() -> Vec<(String, &'static str, &'static [&'static str])> {
    let fixed = CILIUM.iter().map(|(f, k, l)| (f.to_string(), *k, *l));
    let triggers = CILIUM_TRIGGERS.iter().flat_map(|t| {
        [
            ("queued_total", "counter"),
            ("folds", "gauge"),
            ("duration_seconds", "histogram"),
            ("latency_seconds", "histogram"),
        ]
        .map(|(suffix, kind)| (format!("cilium_operator_ipam_{t}_{suffix}"), kind, &[][..]))
    });
    fixed.chain(triggers).collect()
}

async fn scrape(compat: MetricsCompat) -> (&'static str, String) {
    let c = Cluster::new();
    let registry = MetricsRegistry::new().with_compat(compat);
    let gate = Arc::new(Gate::new(c.sim.clone(), GateConfig::aws_defaults()));
    registry.with(|r| gate.metrics().register(r));
    let metrics = registry.with(RuntimeMetrics::register);
    let sink = Arc::new(MemorySink::new());
    let tx = running::start_shared(gate, sink.clone(), running::config(4), metrics).tx;
    let inst = c.instance();
    let n = sink.put(&agent_node(&c, "a", &inst.id, 16));
    tx.send(NodeInput::Upsert(Box::new(n))).await.unwrap();
    assert!(wait_until(|| served(&sink, "a", 16), Duration::from_secs(120)).await);
    tokio::time::sleep(Duration::from_secs(90)).await;
    registry.scrape()
}

#[tokio::test(start_paused = true)]
async fn cilium_compat_exposes_every_cilium_family_with_its_name_type_and_labels() {
    let (content_type, text) = scrape(MetricsCompat::Cilium).await;
    assert_eq!(content_type, TEXT_CONTENT_TYPE);
    assert!(
        !text.contains("# EOF"),
        "text format 0.0.4, not OpenMetrics"
    );
    let types: BTreeMap<&str, &str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_once(' '))
        .collect();
    for (family, kind, labels) in cilium_families() {
        assert_eq!(
            types.get(family.as_str()),
            Some(&kind),
            "# TYPE of {family}"
        );
        let want: BTreeSet<&str> = labels.iter().copied().collect();
        for s in text.lines().filter_map(parse_sample) {
            let base = match kind {
                "histogram" => ["_bucket", "_sum", "_count"]
                    .iter()
                    .find_map(|suffix| s.name.strip_suffix(suffix))
                    .unwrap_or(&s.name),
                _ => &s.name,
            };
            if base != family {
                continue;
            }
            let got: BTreeSet<&str> = s
                .labels
                .iter()
                .map(|(k, _)| k.as_str())
                .filter(|k| *k != "le")
                .collect();
            assert_eq!(got, want, "label names of {}", s.name);
        }
    }
    // Our figures under Cilium's names: the node, its subnet, the EC2 calls.
    let value = |prefix: &str| {
        text.lines()
            .find(|l| l.starts_with(prefix))
            .and_then(|l| l.rsplit(' ').next())
            .unwrap_or_else(|| panic!("no sample {prefix}\n{text}"))
            .parse::<f64>()
            .unwrap()
    };
    assert!(value("cilium_operator_ipam_available_ips{target_node=\"a\"}") >= 16.0);
    assert_eq!(
        value("cilium_operator_ipam_needed_ips{target_node=\"a\"}"),
        0.0
    );
    assert_eq!(value("cilium_operator_ipam_nodes{category=\"total\"}"), 1.0);
    // One m5.large (3 interfaces, 9 secondary addresses each): 16 addresses take both ENIs of
    // ours, so no interface slot is left; the first is full, the second has room (the primary
    // ENI is excluded by first-interface-index 1, as Cilium's agent sets it by default).
    assert_eq!(
        value("cilium_operator_ipam_interface_candidates "),
        1.0,
        "{text}"
    );
    assert_eq!(value("cilium_operator_ipam_empty_interface_slots "), 0.0);
    assert!(value("cilium_operator_ipam_ip_allocation_ops{subnet_id=") >= 16.0);
    assert!(value("cilium_operator_ipam_interface_creation_ops{subnet_id=") >= 1.0);
    assert!(value("cilium_operator_ipam_available_ips_per_subnet{subnet_id=") > 0.0);
    assert!(
        value(
            "cilium_operator_ec2_api_duration_seconds_count{operation=\"CreateNetworkInterface\",response_code=\"OK\"}"
        ) >= 1.0
    );
    assert!(text.contains("cilium_operator_ec2_api_rate_limit_duration_seconds_count{operation="));
    // The families filled from reconcile::metrics_cilium (issue 22, part 3).
    assert!(value("cilium_operator_ipam_resync_total ") >= 1.0);
    assert!(
        value("cilium_operator_ipam_background_sync_duration_seconds_count{status=\"success\"}")
            >= 1.0
    );
    assert!(
        value(
            "cilium_operator_ipam_allocation_duration_seconds_count{type=\"createInterfaceAndAllocateIP\",status=\"success\",subnet_id=\"subnet-"
        ) >= 1.0
    );
    assert!(value("cilium_operator_ipam_deficit_resolver_queued_total ") >= 1.0);
    assert!(value("cilium_operator_ipam_deficit_resolver_duration_seconds_count ") >= 1.0);
    assert!(
        text.contains(
            "cilium_operator_ipam_deficit_resolver_duration_seconds_bucket{le=\"0.005\"}"
        ),
        "Cilium's trigger buckets"
    );
    assert!(
        !text.contains("cilium_operator_ipam_ip_allocation_ops_total"),
        "Cilium's counters keep their name"
    );
    // Our own families stay, in the same format.
    assert!(text.contains("# TYPE eni_operator_ipam_ips_allocated_total counter"));
    assert!(text.contains("# TYPE eni_operator_build_info gauge"));
}

#[tokio::test(start_paused = true)]
async fn without_compat_no_cilium_names_and_openmetrics() {
    let (content_type, text) = scrape(MetricsCompat::None).await;
    assert!(content_type.starts_with("application/openmetrics-text"));
    assert!(text.ends_with("# EOF\n"));
    assert!(!text.contains("cilium_operator_"));
}
