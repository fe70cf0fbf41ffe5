//! What `/metrics` exports after a small run (simulator behind the gate, `MemorySink`, paused
//! time): Cilium-style names and labels, bounded per-node series; and the files under
//! `manifests/monitoring/` refer only to metrics that exist, every metric is in the README.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use eni_operator::crd::AllocationIp;
use eni_operator::ec2::Operation;
use eni_operator::ec2::gate::{Gate, GateConfig};
use eni_operator::event_loop::core::{CoreConfig, NodeInput};
use eni_operator::ipam::IpamConfig;
use eni_operator::metrics::MetricsRegistry;
use eni_operator::reconcile::gc::EniGc;
use eni_operator::reconcile::metrics::RuntimeMetrics;
use serde_json::Value;
use testkit::agent::classic_agent_answers;
use testkit::cluster::{Cluster, agent_node};
use testkit::running;
use testkit::sink::MemorySink;
use testkit::wait_until;

const CLUSTER: &str = "test-cluster";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn pool_size(sink: &MemorySink, name: &str) -> usize {
    sink.get(name).map_or(0, |n| n.spec.ipam.pool.len())
}

/// The scrape after: two nodes served (new ENIs; one create throttled once, one refused
/// once), node "a" releasing its excess through the classic handshake, node "b" deleted (its
/// ENIs released), two GC runs. Families without a series are not exported at all, hence the
/// faults: every family the monitoring files use gets a series.
async fn scrape_after_a_small_run() -> (String, String) {
    let c = Cluster::new();
    let sim = c.sim.clone();
    sim.inject_error(Operation::CreateNetworkInterface, "RequestLimitExceeded", 1);
    sim.inject_error(
        Operation::CreateNetworkInterface,
        "InvalidParameterValue",
        1,
    );

    let registry = MetricsRegistry::new();
    let gate = Arc::new(Gate::new(sim.clone(), GateConfig::aws_defaults()));
    registry.with(|r| gate.metrics().register(r));
    let metrics = registry.with(RuntimeMetrics::register);
    // The Kubernetes client's families, as `main` registers them (no client here: one
    // request is played through the layer).
    let kube = registry.with(eni_operator::kube_metrics::KubeClientMetrics::register);
    kube.rate_limiter_waits.inc();
    {
        use tower::{Layer, ServiceExt};
        let svc = eni_operator::kube_metrics::RequestMetricsLayer(kube.clone()).layer(
            tower::service_fn(|_: http::Request<()>| async {
                Ok::<_, std::convert::Infallible>(http::Response::new(()))
            }),
        );
        let req = http::Request::patch("/apis/cilium.io/v2/ciliumnodes/a/status")
            .body(())
            .unwrap();
        svc.oneshot(req).await.unwrap();
    }

    let sink = Arc::new(MemorySink::new());
    let cfg = CoreConfig {
        workers: 4,
        resync_interval: Duration::from_secs(5),
        ipam: IpamConfig {
            cluster_name: CLUSTER.into(),
            release_excess_ips: true,
            release_delay: Duration::from_secs(10),
            ..IpamConfig::default()
        },
        ..CoreConfig::default()
    };
    let running::Running { tx, .. } =
        running::start_shared(gate.clone(), sink.clone(), cfg, metrics.clone());

    let mut instances = BTreeMap::new();
    for name in ["a", "b"] {
        let inst = c.instance();
        instances.insert(name, inst.id.clone());
        running::add(&sink, &tx, &agent_node(&c, name, &inst.id, 16)).await;
    }
    assert!(
        wait_until(
            || pool_size(&sink, "a") >= 16 && pool_size(&sink, "b") >= 16,
            Duration::from_secs(600)
        )
        .await,
        "{} {:?} {:?}\n{}",
        pool_size(&sink, "a"),
        sink.get("a")
            .and_then(|n| n.status)
            .map(|s| s.ipam.operator_status),
        sink.get("b")
            .and_then(|n| n.status)
            .map(|s| s.ipam.operator_status),
        registry.encode()
    );

    // "a": three addresses in use, demand back to the default pre-allocation: the excess goes.
    let n = sink
        .update("a", |n| {
            n.spec.ipam.min_allocate = 0;
            let in_use: Vec<_> = n.spec.ipam.pool.keys().take(3).cloned().collect();
            let status = n.status.get_or_insert_with(Default::default);
            for ip in in_use {
                let eni = n.spec.ipam.pool[&ip].resource.clone();
                let owner = "default/pod".into();
                let used = AllocationIp {
                    owner,
                    resource: eni,
                    ..Default::default()
                };
                status.ipam.used.insert(ip, used);
            }
        })
        .unwrap();
    tx.send(NodeInput::Upsert(Box::new(n))).await.unwrap();
    let before = pool_size(&sink, "a");
    for _ in 0..120 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let n = sink.update("a", classic_agent_answers).unwrap();
        tx.send(NodeInput::Upsert(Box::new(n))).await.unwrap();
        if pool_size(&sink, "a") < before {
            break;
        }
    }
    assert!(pool_size(&sink, "a") < before, "excess released");

    // "b": its instance stops and its Node goes; the operator deletes the CiliumNode and
    // releases its ENI.
    c.sim
        .set_instance_state(&instances["b"], eni_operator::ec2::InstanceState::Stopped);
    running::node_gone(&sink, &tx, "b").await;
    assert!(wait_until(|| sink.get("b").is_none(), Duration::from_secs(120)).await);

    let mut gc = EniGc::new(CLUSTER, 25)
        .with_metrics(metrics.clone())
        .with_vpcs([c.vpc.clone()]);
    gc.run_once(&*gate, &[]).await.unwrap();
    gc.run_once(&*gate, &[]).await.unwrap();
    // Past a full refresh, which publishes the per-node and per-subnet gauges.
    tokio::time::sleep(Duration::from_secs(12)).await;
    (registry.encode(), c.subnet.clone())
}

/// Samples of an OpenMetrics text: name -> label sets (as `k="v"` strings).
fn samples(text: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, _value)) = line.rsplit_once(' ') else {
            continue;
        };
        let (name, labels) = match series.split_once('{') {
            Some((n, l)) => (n, l.trim_end_matches('}')),
            None => (series, ""),
        };
        out.entry(name.to_string())
            .or_default()
            .insert(labels.to_string());
    }
    out
}

/// Every name a query may use: counters as `_total`, histograms as `_bucket`/`_sum`/`_count`,
/// from the `# TYPE` lines (so families without a series yet count too).
fn queryable_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let mut it = rest.split_whitespace();
        let (Some(name), Some(kind)) = (it.next(), it.next()) else {
            continue;
        };
        let suffixes: &[&str] = match kind {
            "counter" => &["_total"],
            "histogram" => &["_bucket", "_sum", "_count"],
            "info" => &["_info"],
            _ => &[""],
        };
        names.extend(suffixes.iter().map(|s| format!("{name}{s}")));
    }
    names.extend(samples(text).into_keys());
    names
}

fn has(s: &BTreeMap<String, BTreeSet<String>>, name: &str, labels: &str) -> bool {
    s.get(name)
        .is_some_and(|sets| sets.iter().any(|l| l == labels))
}

#[tokio::test(start_paused = true)]
async fn metrics_carry_ciliums_names_and_labels() {
    let (text, subnet) = scrape_after_a_small_run().await;
    let s = samples(&text);
    let sub = format!("subnet_id=\"{subnet}\"");
    for (name, labels) in [
        ("eni_operator_ipam_available_ips", "target_node=\"a\""),
        ("eni_operator_ipam_used_ips", "target_node=\"a\""),
        ("eni_operator_ipam_needed_ips", "target_node=\"a\""),
        (
            "eni_operator_ipam_available_ips_per_subnet",
            &format!("{sub},availability_zone=\"zone-a\""),
        ),
        ("eni_operator_ipam_interface_creation_ops_total", &sub),
        ("eni_operator_ipam_allocation_ops_total", &sub),
        ("eni_operator_ipam_release_ops_total", &sub),
        ("eni_operator_ipam_ips_allocated_total", &sub),
        ("eni_operator_ipam_ips_released_total", &sub),
        ("eni_operator_enis_attached_total", ""),
        ("eni_operator_enis_deleted_total", "reason=\"node-deleted\""),
        (
            "eni_operator_errors_total",
            "reason=\"InvalidParameterValue\"",
        ),
        (
            "eni_operator_ec2_api_throttled_total",
            "operation=\"CreateNetworkInterface\"",
        ),
        (
            "eni_operator_ec2_api_duration_seconds_count",
            "operation=\"CreateNetworkInterface\",response_code=\"RequestLimitExceeded\"",
        ),
        ("eni_operator_gc_runs_total", "outcome=\"success\""),
        ("eni_operator_gc_enis_marked", ""),
        ("eni_operator_nodes", "state=\"at-capacity\""),
        ("eni_operator_nodes", "state=\"in-deficit\""),
        (
            "eni_operator_ec2_api_duration_seconds_count",
            "operation=\"CreateNetworkInterface\",response_code=\"OK\"",
        ),
        (
            "eni_operator_ec2_api_duration_seconds_count",
            "operation=\"UnassignPrivateIpAddresses\",response_code=\"OK\"",
        ),
    ] {
        assert!(has(&s, name, labels), "no {name}{{{labels}}} in\n{text}");
    }
    // Node "b" is gone: so are its series (bounded per-node gauges).
    assert!(!text.contains("target_node=\"b\""), "{text}");
    let value = |prefix: &str| -> f64 {
        text.lines()
            .find(|l| l.starts_with(prefix))
            .and_then(|l| l.rsplit_once(' '))
            .map(|(_, v)| v.parse().unwrap())
            .unwrap()
    };
    let created = value("eni_operator_ipam_interface_creation_ops_total{");
    assert!(created >= 2.0, "at least one new ENI per node");
    assert_eq!(value("eni_operator_enis_attached_total "), created);
}

// ---------------------------------------------------------------------------------------------
// PromQL in the monitoring files.

/// Aggregation operators, keywords and set operators: identifiers that are not metric names
/// although no `(` follows them directly (with [`LABEL_LISTS`], keywords too).
const KEYWORDS: &[&str] = &[
    "sum",
    "min",
    "max",
    "avg",
    "count",
    "stddev",
    "stdvar",
    "topk",
    "bottomk",
    "quantile",
    "count_values",
    "group",
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "atan2",
    "inf",
    "nan",
];

/// Modifiers whose parenthesised list names labels, not series.
const LABEL_LISTS: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];

#[derive(Debug, PartialEq)]
enum Tok {
    Ident(String),
    Open,
    Close,
}

/// Metric names in a PromQL expression: identifiers that are not functions (followed by `(`),
/// keywords, label names (inside `{...}` or a `by (...)` list), strings, durations (`[...]`),
/// numbers or Grafana variables (`$x`).
fn promql_metric_names(expr: &str) -> BTreeSet<String> {
    let chars: Vec<char> = expr.chars().collect();
    let mut toks = Vec::new();
    let mut i = 0;
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    while i < chars.len() {
        let c = chars[i];
        match c {
            '"' | '\'' | '`' => {
                i += 1;
                while i < chars.len() && chars[i] != c {
                    i += if chars[i] == '\\' { 2 } else { 1 };
                }
                i += 1;
            }
            '{' | '[' => {
                let close = if c == '{' { '}' } else { ']' };
                while i < chars.len() && chars[i] != close {
                    if chars[i] == '"' {
                        i += 1;
                        while i < chars.len() && chars[i] != '"' {
                            i += if chars[i] == '\\' { 2 } else { 1 };
                        }
                    }
                    i += 1;
                }
                i += 1;
            }
            '(' => {
                toks.push(Tok::Open);
                i += 1;
            }
            ')' => {
                toks.push(Tok::Close);
                i += 1;
            }
            '$' | '0'..='9' | '.' => {
                i += 1;
                while i < chars.len() && (ident(chars[i]) || chars[i] == '.') {
                    i += 1;
                }
            }
            c if c.is_ascii_alphabetic() || c == '_' || c == ':' => {
                let start = i;
                while i < chars.len() && ident(chars[i]) {
                    i += 1;
                }
                toks.push(Tok::Ident(chars[start..i].iter().collect()));
            }
            _ => i += 1,
        }
    }
    let mut names = BTreeSet::new();
    let mut k = 0;
    while k < toks.len() {
        if let Tok::Ident(id) = &toks[k] {
            let next_open = toks.get(k + 1) == Some(&Tok::Open);
            if LABEL_LISTS.contains(&id.as_str()) && next_open {
                // Skip the label list.
                k += 2;
                let mut depth = 1;
                while k < toks.len() && depth > 0 {
                    match toks[k] {
                        Tok::Open => depth += 1,
                        Tok::Close => depth -= 1,
                        _ => {}
                    }
                    k += 1;
                }
                continue;
            }
            let word = id.to_ascii_lowercase();
            let keyword = KEYWORDS.contains(&word.as_str()) || LABEL_LISTS.contains(&word.as_str());
            if !next_open && !keyword {
                names.insert(id.clone());
            }
        }
        k += 1;
    }
    names
}

#[test]
fn the_promql_tokenizer_finds_metric_names_only() {
    let cases: &[(&str, &[&str])] = &[
        (
            r#"sum by (operation) (rate(foo_total{a="b}",c=~"x"}[5m])) > 0.05"#,
            &["foo_total"],
        ),
        (
            "histogram_quantile(0.99, sum by (le, operation) (rate(x_bucket[$__rate_interval])))",
            &["x_bucket"],
        ),
        ("max(a) < 1 or absent(b)", &["a", "b"]),
        (
            "-sum by (s) (rate(c[1m])) / on (s) group_left (z) d",
            &["c", "d"],
        ),
        (r#"topk(20, max by (t) (e{t=~"$node"})) offset 5m"#, &["e"]),
        ("sum(changes(f[1h])) > 6", &["f"]),
    ];
    for (expr, want) in cases {
        let want: BTreeSet<String> = want.iter().map(|s| s.to_string()).collect();
        assert_eq!(promql_metric_names(expr), want, "{expr}");
    }
}

/// Every `expr` string anywhere in a JSON document (Grafana targets, nested rows included).
fn exprs(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                match (k.as_str(), x) {
                    ("expr", Value::String(s)) => out.push(s.clone()),
                    _ => exprs(x, out),
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|x| exprs(x, out)),
        _ => {}
    }
}

fn monitoring(file: &str) -> PathBuf {
    root().join("manifests/monitoring").join(file)
}

fn yaml(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap();
    serde_saphyr::from_str(&text).unwrap()
}

/// (where, expression) of every query in the monitoring files.
fn monitoring_queries() -> Vec<(String, String)> {
    let mut queries = Vec::new();
    let rules = yaml(&monitoring("prometheusrule.yaml"));
    assert_eq!(rules["kind"], "PrometheusRule");
    for group in rules["spec"]["groups"].as_array().unwrap() {
        for rule in group["rules"].as_array().unwrap() {
            let name = rule["alert"].as_str().or(rule["record"].as_str()).unwrap();
            queries.push((
                format!("rule {name}"),
                rule["expr"].as_str().unwrap().into(),
            ));
        }
    }
    // The dashboard ships in a ConfigMap (Grafana's sidecar format) so that
    // `kubectl apply -f manifests/monitoring/` applies every file.
    let cm = yaml(&monitoring("grafana-dashboard.yaml"));
    assert_eq!(cm["kind"], "ConfigMap");
    assert_eq!(cm["metadata"]["labels"]["grafana_dashboard"], "1");
    let text = cm["data"]["eni-operator.json"].as_str().unwrap();
    let dashboard: Value = serde_json::from_str(text).unwrap();
    let mut found = Vec::new();
    exprs(&dashboard["panels"], &mut found);
    queries.extend(
        found
            .into_iter()
            .map(|e| ("dashboard panel".to_string(), e)),
    );
    // Template variables: label_values(<metric>, <label>).
    for var in dashboard["templating"]["list"].as_array().unwrap() {
        if let Some(q) = var["definition"].as_str()
            && let Some(args) = q.strip_prefix("label_values(")
        {
            let metric = args.split(',').next().unwrap().trim();
            queries.push((format!("variable {}", var["name"]), metric.to_string()));
        }
    }
    queries
}

#[tokio::test(start_paused = true)]
async fn monitoring_files_use_only_exported_metrics() {
    let (text, _) = scrape_after_a_small_run().await;

    let exported = queryable_names(&text);
    let queries = monitoring_queries();
    let mut used = BTreeSet::new();
    for (place, expr) in &queries {
        let names = promql_metric_names(expr);
        assert!(!names.is_empty(), "{place}: no metric in {expr}");
        for name in names {
            assert!(
                exported.contains(&name),
                "{place} uses {name}, which /metrics does not export: {expr}"
            );
            used.insert(name);
        }
    }
    // The alerts the install docs promise are there.
    let alerts: BTreeSet<&str> = queries
        .iter()
        .filter_map(|(p, _)| p.strip_prefix("rule "))
        .collect();
    for a in [
        "EniOperatorSubnetNearlyExhausted",
        "EniOperatorNodesAtCapacity",
        "EniOperatorNodesWaitingForAddresses",
        "EniOperatorEc2Throttled",
        "EniOperatorLeaderFlapping",
        "EniOperatorEc2RefreshFailing",
        "EniOperatorGcFailing",
        "EniOperatorHandoverBlocked",
        "EniOperatorCiliumLeaseUnreadable",
        "EniOperatorCiliumIgnoresAnnotation",
        "EniOperatorFinalizerBlocked",
    ] {
        assert!(alerts.contains(a), "missing alert {a}");
    }
    assert!(
        used.len() >= 20,
        "the dashboard covers the metrics: {used:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn every_exported_metric_is_documented_in_the_readme() {
    let (text, _) = scrape_after_a_small_run().await;
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let families: BTreeSet<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert!(families.len() > 20, "{families:?}");
    for f in families {
        assert!(readme.contains(f), "README.md does not document {f}");
    }
}

/// Issue 30: per-node waits, the Kubernetes client's requests and rate limiter, and the
/// standard process metrics are exported.
#[tokio::test(start_paused = true)]
async fn the_waiting_kube_client_and_process_families_are_exported() {
    let (text, _) = scrape_after_a_small_run().await;
    for series in [
        "eni_operator_nodes_waiting{reason=\"throttled\"} ",
        "eni_operator_kube_client_requests_total{verb=\"patch\",resource=\"ciliumnodes/status\",code=\"200\"} 1",
        "eni_operator_kube_client_request_duration_seconds_count{verb=\"patch\",resource=\"ciliumnodes/status\"} 1",
        "eni_operator_kube_client_rate_limiter_waits_total 1",
        "eni_operator_kube_client_rate_limiter_wait_seconds_total ",
        "\nprocess_cpu_seconds_total ",
        "\nprocess_resident_memory_bytes ",
        "\nprocess_open_fds ",
        "\nprocess_start_time_seconds ",
    ] {
        assert!(text.contains(series), "no {series} in\n{text}");
    }
}

#[test]
fn the_service_monitor_scrapes_the_metrics_service() {
    let sm = yaml(&monitoring("servicemonitor.yaml"));
    assert_eq!(sm["kind"], "ServiceMonitor");
    let selector = sm["spec"]["selector"]["matchLabels"].as_object().unwrap();
    let port = sm["spec"]["endpoints"][0]["port"].as_str().unwrap();
    let namespaces = &sm["spec"]["namespaceSelector"]["matchNames"];
    // The Service among the top-level manifests (`kubectl apply -f manifests/`).
    let mut services = Vec::new();
    for entry in std::fs::read_dir(root().join("manifests")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "yaml") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        for v in serde_saphyr::from_multiple::<Value>(&text).unwrap() {
            if v["kind"] == "Service" {
                services.push(v);
            }
        }
    }
    let service = services
        .iter()
        .find(|s| {
            selector
                .iter()
                .all(|(k, v)| s["metadata"]["labels"][k] == *v)
        })
        .expect("a Service carries the ServiceMonitor's selector labels");
    assert!(
        namespaces
            .as_array()
            .unwrap()
            .contains(&service["metadata"]["namespace"])
    );
    assert!(
        service["spec"]["ports"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["name"] == port),
        "the Service has a port named {port}"
    );
}
