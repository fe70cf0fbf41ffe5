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

mod families;
pub use families::{CILIUM_FAMILIES, Family};
use families::{Source, source};

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
mod tests;
