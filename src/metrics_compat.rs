//! `--metrics-compat=cilium`: `/metrics` also exposes Cilium operator's ENI IPAM metric families
//! under Cilium's exact names, label names and types, so Cilium's dashboards and alert rules
//! query us unchanged (issue 22, part 3).
//!
//! Cilium's Go client serves the Prometheus text format 0.0.4, where a counter's sample keeps
//! its family name (`cilium_operator_ipam_ip_allocation_ops`, no `_total`); OpenMetrics, which
//! our registry encodes, requires `_total`. So in compat mode the whole scrape is served as 0.0.4:
//! our own families converted ([`openmetrics_to_text`]), then Cilium's families derived from
//! ours ([`cilium_families`]). Where we have no figure for a Cilium family it is declared
//! (`# HELP`/`# TYPE`) without samples, never filled with made-up values (docs/monitoring.md
//! lists which).
//!
//! Sources (github.com/cilium/cilium): `operator/pkg/ipam/metrics/metrics.go` (commit
//! 09b89c6c9e2548486913ac5dfce38c0bcabdd6e6), `operator/pkg/ipam/allocator/aws/metrics.go`
//! (commit 51946e569e406b0060916315962d6f8fc2038a90) and `pkg/api/metrics/metrics.go` (commit
//! 19e73125f5e5f1a598bde216a00fd84aa63f57bd).

use std::collections::BTreeMap;
use std::fmt::Write;

/// `Content-Type` of the Prometheus text format 0.0.4.
pub const TEXT_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Which extra names `/metrics` carries.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum MetricsCompat {
    /// Our own families only (OpenMetrics).
    #[default]
    None,
    /// Also Cilium operator's ENI IPAM families (Prometheus text 0.0.4).
    Cilium,
}

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
enum Source {
    /// Same samples, renamed (counters: our `_total` sample).
    Rename(&'static str),
    /// `eni_operator_nodes{state}`: total, in-deficit, at-capacity.
    Nodes,
    /// A histogram of ours; `response_code` other than `OK` becomes `Failed`.
    Histogram(&'static str),
    /// No figure of ours: declared without samples.
    None,
}

fn source(cilium: &str) -> Source {
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

/// One sample line: name, labels in order, value as written.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: Vec<(String, String)>,
    pub value: String,
}

/// Parse a sample line of the text formats (`name{a="x",b="y"} value`); `None` for comments
/// and blank lines.
pub fn parse_sample(line: &str) -> Option<Sample> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let name_end = line.find(['{', ' '])?;
    let name = line[..name_end].to_string();
    let mut labels = Vec::new();
    let mut rest = &line[name_end..];
    if let Some(body) = rest.strip_prefix('{') {
        let mut end = None;
        let (mut key, mut value, mut in_value, mut escaped) =
            (String::new(), String::new(), false, false);
        for (i, c) in body.char_indices() {
            if in_value {
                if escaped {
                    value.push(if c == 'n' { '\n' } else { c });
                    escaped = false;
                } else if c == '\\' {
                    escaped = true;
                } else if c == '"' {
                    in_value = false;
                    labels.push((std::mem::take(&mut key), std::mem::take(&mut value)));
                } else {
                    value.push(c);
                }
            } else {
                match c {
                    '}' => {
                        end = Some(i);
                        break;
                    }
                    '"' => in_value = true,
                    ',' | '=' | ' ' => {}
                    c => key.push(c),
                }
            }
        }
        rest = &body[end? + 1..];
    }
    let value = rest.split_whitespace().next()?.to_string();
    Some(Sample {
        name,
        labels,
        value,
    })
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn write_sample(out: &mut String, name: &str, labels: &[(String, String)], value: &str) {
    out.push_str(name);
    if !labels.is_empty() {
        let body: Vec<String> = labels
            .iter()
            .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
            .collect();
        let _ = write!(out, "{{{}}}", body.join(","));
    }
    let _ = writeln!(out, " {value}");
}

fn num(v: &str) -> f64 {
    match v {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().unwrap_or(0.0),
    }
}

fn fmt_num(v: f64) -> String {
    if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.to_string()
    } else {
        format!("{v}")
    }
}

/// Our OpenMetrics exposition as Prometheus text 0.0.4: no `# EOF`/`# UNIT`, counters' `HELP`
/// and `TYPE` name their `_total` sample, `info` becomes a gauge named by its `_info` sample.
pub fn openmetrics_to_text(openmetrics: &str) -> String {
    let mut out = String::new();
    let mut help: Option<(String, String)> = None;
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, text) = rest.split_once(' ').unwrap_or((rest, ""));
            help = Some((name.to_string(), text.to_string()));
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, "untyped"));
            let (name, kind) = match kind {
                "counter" => (format!("{name}_total"), "counter"),
                "info" => (format!("{name}_info"), "gauge"),
                "gauge" | "histogram" | "summary" => (name.to_string(), kind),
                _ => (name.to_string(), "untyped"),
            };
            if let Some((_, text)) = help.take() {
                let _ = writeln!(out, "# HELP {name} {text}");
            }
            let _ = writeln!(out, "# TYPE {name} {kind}");
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// Cilium's families, derived from the samples of our exposition.
pub fn cilium_families(ours: &[Sample]) -> String {
    let mut out = String::new();
    for f in CILIUM_FAMILIES {
        let _ = writeln!(out, "# HELP {} {}", f.name, f.help);
        let _ = writeln!(out, "# TYPE {} {}", f.name, f.kind);
        match source(f.name) {
            Source::Rename(from) => {
                for s in ours.iter().filter(|s| s.name == from) {
                    write_sample(&mut out, f.name, &s.labels, &s.value);
                }
            }
            Source::Nodes => {
                let mut by =
                    BTreeMap::from([("total", 0.0), ("in-deficit", 0.0), ("at-capacity", 0.0)]);
                for s in ours.iter().filter(|s| s.name == "eni_operator_nodes") {
                    let v = num(&s.value);
                    *by.get_mut("total").expect("total") += v;
                    let state = s.labels.iter().find(|(k, _)| k == "state");
                    if let Some((_, state)) = state
                        && let Some(slot) = by.get_mut(state.as_str())
                    {
                        *slot += v;
                    }
                }
                for (category, v) in by {
                    let labels = [("category".to_string(), category.to_string())];
                    write_sample(&mut out, f.name, &labels, &fmt_num(v));
                }
            }
            Source::Histogram(from) => histogram(&mut out, f.name, from, ours),
            Source::None => {}
        }
    }
    out
}

/// The `operation` label value Cilium's operator gives an EC2 action in family `family`.
/// Observed with the real `cilium-operator-aws` 1.20 (e2e `cilium-shadow`): its API-duration
/// histogram names `ModifyNetworkInterfaceAttribute` after its Go method, `ModifyNetworkInterface`,
/// while its rate-limit histogram keeps the action's name.
fn cilium_operation<'a>(family: &str, action: &'a str) -> &'a str {
    match (family, action) {
        ("cilium_operator_ec2_api_duration_seconds", "ModifyNetworkInterfaceAttribute") => {
            "ModifyNetworkInterface"
        }
        _ => action,
    }
}

/// Re-emit histogram `from` as `to`, merging series whose `response_code` maps to `Failed`.
fn histogram(out: &mut String, to: &str, from: &str, ours: &[Sample]) {
    type Key = Vec<(String, String)>;
    #[derive(Default)]
    struct Series {
        buckets: Vec<(f64, f64)>,
        sum: f64,
        count: f64,
    }
    let mut series: BTreeMap<Key, Series> = BTreeMap::new();
    for s in ours {
        let Some(suffix) = s.name.strip_prefix(from) else {
            continue;
        };
        let mut le = None;
        let key: Key = s
            .labels
            .iter()
            .filter_map(|(k, v)| {
                if k == "le" {
                    le = Some(num(v));
                    return None;
                }
                let v = if k == "response_code" && v != "OK" {
                    "Failed".to_string()
                } else if k == "operation" {
                    cilium_operation(to, v).to_string()
                } else {
                    v.clone()
                };
                Some((k.clone(), v))
            })
            .collect();
        let e = series.entry(key).or_default();
        let v = num(&s.value);
        match (suffix, le) {
            ("_bucket", Some(le)) => match e.buckets.iter_mut().find(|(b, _)| *b == le) {
                Some((_, c)) => *c += v,
                None => e.buckets.push((le, v)),
            },
            ("_sum", _) => e.sum += v,
            ("_count", _) => e.count += v,
            _ => {}
        }
    }
    for (labels, mut s) in series {
        s.buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        for (le, c) in s.buckets {
            let mut l = labels.clone();
            l.push(("le".into(), fmt_num(le)));
            write_sample(out, &format!("{to}_bucket"), &l, &fmt_num(c));
        }
        write_sample(out, &format!("{to}_sum"), &labels, &fmt_num(s.sum));
        write_sample(out, &format!("{to}_count"), &labels, &fmt_num(s.count));
    }
}

/// The whole compat scrape: ours in text 0.0.4, then Cilium's families.
pub fn compat_text(openmetrics: &str) -> String {
    let samples: Vec<Sample> = openmetrics.lines().filter_map(parse_sample).collect();
    let mut out = openmetrics_to_text(openmetrics);
    out.push_str(&cilium_families(&samples));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modify_is_named_as_cilium_names_it_per_family() {
        let ours = [
            "eni_operator_ec2_api_duration_seconds_count{operation=\"ModifyNetworkInterfaceAttribute\",response_code=\"OK\"} 2",
            "eni_operator_ec2_rate_limit_wait_seconds_count{operation=\"ModifyNetworkInterfaceAttribute\"} 2",
        ];
        let samples: Vec<Sample> = ours.iter().filter_map(|l| parse_sample(l)).collect();
        let text = cilium_families(&samples);
        assert!(
            text.contains("cilium_operator_ec2_api_duration_seconds_count{operation=\"ModifyNetworkInterface\",response_code=\"OK\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("cilium_operator_ec2_api_rate_limit_duration_seconds_count{operation=\"ModifyNetworkInterfaceAttribute\"} 2"),
            "{text}"
        );
    }

    #[test]
    fn parses_labels_with_escapes() {
        let s = parse_sample(r#"x_bucket{a="1",b="q\"uote",le="+Inf"} 3"#).unwrap();
        assert_eq!(s.name, "x_bucket");
        assert_eq!(
            s.labels,
            vec![
                ("a".into(), "1".into()),
                ("b".into(), "q\"uote".into()),
                ("le".into(), "+Inf".into())
            ]
        );
        assert_eq!(s.value, "3");
        assert_eq!(parse_sample("y 2.5").unwrap().labels, vec![]);
        assert_eq!(parse_sample("# HELP y z"), None);
    }

    #[test]
    fn openmetrics_becomes_text_0_0_4() {
        let om = "# HELP a_b Build.\n# TYPE a_b info\na_b_info{version=\"1\"} 1\n\
                  # HELP c Calls.\n# TYPE c counter\nc_total 4\n# EOF\n";
        let text = openmetrics_to_text(om);
        assert_eq!(
            text,
            "# HELP a_b_info Build.\n# TYPE a_b_info gauge\na_b_info{version=\"1\"} 1\n\
             # HELP c_total Calls.\n# TYPE c_total counter\nc_total 4\n"
        );
    }

    #[test]
    fn histograms_merge_failures_and_keep_buckets_ordered() {
        let om = "\
x_sum{operation=\"A\",response_code=\"OK\"} 1.5
x_count{operation=\"A\",response_code=\"OK\"} 2
x_bucket{le=\"1.0\",operation=\"A\",response_code=\"OK\"} 1
x_bucket{le=\"+Inf\",operation=\"A\",response_code=\"OK\"} 2
x_sum{operation=\"A\",response_code=\"Throttling\"} 1
x_count{operation=\"A\",response_code=\"Throttling\"} 1
x_bucket{le=\"1.0\",operation=\"A\",response_code=\"Throttling\"} 1
x_bucket{le=\"+Inf\",operation=\"A\",response_code=\"Throttling\"} 1
x_sum{operation=\"A\",response_code=\"Timeout\"} 9
x_count{operation=\"A\",response_code=\"Timeout\"} 1
x_bucket{le=\"1.0\",operation=\"A\",response_code=\"Timeout\"} 0
x_bucket{le=\"+Inf\",operation=\"A\",response_code=\"Timeout\"} 1
";
        let samples: Vec<Sample> = om.lines().filter_map(parse_sample).collect();
        let mut out = String::new();
        histogram(&mut out, "y", "x", &samples);
        assert!(out.contains("y_bucket{operation=\"A\",response_code=\"Failed\",le=\"1\"} 1\n"));
        assert!(out.contains("y_bucket{operation=\"A\",response_code=\"Failed\",le=\"+Inf\"} 2\n"));
        assert!(out.contains("y_count{operation=\"A\",response_code=\"Failed\"} 2\n"));
        assert!(out.contains("y_sum{operation=\"A\",response_code=\"OK\"} 1.5\n"));
    }
}
