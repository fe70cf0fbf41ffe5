//! The Helm chart (`charts/eni-operator/`), the one source of the install: its version is the
//! crate's, `ci/every-value.yaml` sets every value, `helm lint --strict` passes with the defaults,
//! with every value and in shadow mode, and `manifests/` is exactly its output
//! (`scripts/render-manifests.sh`, `make manifests`).
//!
//! The tests that run `helm` take it from `HELM` (a path; `.ci/run` unpacks it): nothing here
//! downloads it. Without it they say NOT RUN on stderr and return. The install, upgrade,
//! rollback and uninstall on a real API server are the e2e scenario `helm-install`
//! (e2e/src/scenarios/helm.rs), which shares the e2e suite's control plane.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

const VERSION: &str = env!("CARGO_PKG_VERSION");

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn chart() -> PathBuf {
    root().join("charts/eni-operator")
}

fn yaml(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn helm(test: &str) -> Option<PathBuf> {
    match std::env::var_os("HELM").filter(|h| !h.is_empty()) {
        Some(h) => Some(PathBuf::from(h)),
        None => {
            use std::io::Write;
            let _ = writeln!(
                std::io::stderr(),
                "*** tests/it/chart.rs {test}: NOT RUN: HELM is not set (the path of a helm binary; \
                 .ci/run sets it)"
            );
            None
        }
    }
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{cmd:?} failed:\n{text}");
    text
}

#[test]
fn the_chart_names_the_crates_version() {
    let c = yaml(&chart().join("Chart.yaml"));
    assert_eq!(c["apiVersion"], "v2");
    assert_eq!(c["version"], VERSION);
    assert_eq!(c["appVersion"], VERSION);
}

/// Leaves of a values tree: key path -> value (lists and empty maps are leaves).
fn leaves(v: &Value, path: Vec<String>, out: &mut Vec<(Vec<String>, Value)>) {
    match v {
        Value::Object(m) if !m.is_empty() => {
            for (k, x) in m {
                let mut p = path.clone();
                p.push(k.clone());
                leaves(x, p, out);
            }
        }
        _ => out.push((path, v.clone())),
    }
}

fn lookup<'a>(v: &'a Value, path: &[String]) -> Option<&'a Value> {
    path.iter().try_fold(v, |v, k| v.get(k))
}

/// Values `ci/every-value.yaml` keeps at their default on purpose: `mode` (shadow is linted and
/// rendered on its own), what the rest of the file needs on, and the admission API version the
/// e2e's server-side dry run of this file needs served (v1 on Kubernetes 1.36; v1beta1 is off).
const KEPT_AT_DEFAULT: &[&str] = &[
    "mode",
    "ciliumIgnoreAtCreation.apiVersion",
    "metrics.service.enabled",
    "podDisruptionBudget.enabled",
    "nodeSelector.kubernetes.io/os",
];

/// A value added to values.yaml must be exercised by the lint and the server-side dry run of
/// every value: `ci/every-value.yaml` gives each one something other than its default.
#[test]
fn every_value_file_sets_every_value() {
    let defaults = yaml(&chart().join("values.yaml"));
    let every = yaml(&chart().join("ci/every-value.yaml"));
    let mut all = Vec::new();
    leaves(&defaults, Vec::new(), &mut all);
    assert!(all.len() > 40, "{all:?}");
    for (path, default) in all {
        let name = path.join(".");
        let set = lookup(&every, &path)
            .unwrap_or_else(|| panic!("ci/every-value.yaml does not set {name}"));
        if !KEPT_AT_DEFAULT.contains(&name.as_str()) {
            assert_ne!(
                set, &default,
                "ci/every-value.yaml leaves {name} at its default"
            );
        }
    }
    // Keys values.yaml does not have: the schema refuses them (`helm lint` below).
}

/// Every top-level value is in the schema, which refuses unknown keys.
#[test]
fn the_schema_lists_every_value() {
    let defaults = yaml(&chart().join("values.yaml"));
    let text = std::fs::read_to_string(chart().join("values.schema.json")).unwrap();
    let schema: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(schema["additionalProperties"], false);
    let mut listed: BTreeSet<&String> = schema["properties"].as_object().unwrap().keys().collect();
    // Helm's own: an umbrella chart hands its globals to every subchart
    // (`the_chart_works_as_a_subchart`).
    assert!(listed.remove(&"global".to_string()));
    let values: BTreeSet<&String> = defaults.as_object().unwrap().keys().collect();
    assert_eq!(listed, values);
}

/// `helm template` of the chart with extra arguments: the output, or the error.
fn render(helm: &Path, args: &[&str]) -> Result<String, String> {
    let out = Command::new(helm)
        .args(["template", "eni-operator"])
        .arg(chart())
        .args(["-n", "eni-operator"])
        .args(args)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    if out.status.success() {
        Ok(stdout)
    } else {
        Err(stderr)
    }
}

/// The rendered ConfigMap's data as the operator's command line: each key
/// `ENI_OPERATOR_FOO_BAR` is the flag `--foo-bar` (the ConfigMap's own header says so).
fn configmap_args(rendered: &str) -> Vec<String> {
    let doc = rendered
        .split("\n---")
        .find(|d| d.contains("kind: ConfigMap"))
        .expect("a ConfigMap");
    let cm: Value = serde_saphyr::from_str(doc).unwrap();
    let mut args = vec!["eni-operator".to_string()];
    for (k, v) in cm["data"].as_object().unwrap() {
        let flag = k
            .strip_prefix("ENI_OPERATOR_")
            .unwrap_or_else(|| panic!("{k}: not an operator setting"))
            .to_lowercase()
            .replace('_', "-");
        args.push(format!("--{flag}={}", v.as_str().unwrap()));
    }
    args
}

fn operator_settings(rendered: &str) -> eni_operator::config::Settings {
    use clap::Parser;
    let args = configmap_args(rendered);
    let s = eni_operator::config::Settings::try_parse_from(&args)
        .unwrap_or_else(|e| panic!("the operator refuses the ConfigMap {args:?}: {e}"));
    s.validate()
        .unwrap_or_else(|e| panic!("the operator refuses the ConfigMap {args:?}: {e}"));
    s
}

/// What the docs tell users to set is a chart value, and the ConfigMap it renders starts the
/// operator with that setting; the chart's defaults are the operator's.
#[test]
fn every_setting_the_docs_name_is_a_value_the_operator_takes() {
    use clap::Parser;
    let Some(helm) = helm("every_setting_the_docs_name_is_a_value_the_operator_takes") else {
        return;
    };
    let every = chart().join("ci/every-value.yaml");
    let s = operator_settings(&render(&helm, &["-f", &every.display().to_string()]).unwrap());
    let tag = |key: &str, value: &str| {
        let (key, value) = (key.into(), value.into());
        Some(eni_operator::config::values::Tag { key, value })
    };
    assert!(s.ipam.annotate_cilium_ignore);
    let selector = tag("eni-operator.cilium.io/handover", "true");
    assert_eq!(s.handover.handover_selector, selector);
    assert_eq!(s.handover.handover_quiet.as_secs(), 150);
    assert_eq!(s.ipam.static_ip_required_tag, tag("egress", "eni-operator"));
    assert!(!s.handover.watch_cilium_lease);
    assert_eq!(
        s.server.metrics_compat,
        eni_operator::metrics_compat::MetricsCompat::Cilium
    );
    assert_eq!(s.gate.ec2_rate_fraction, 0.5);
    assert_eq!(s.gate.ec2_bucket.len(), 1);
    assert_eq!(s.runtime.parallel_alloc_workers, 20);
    assert_eq!(s.kube.k8s_client_qps, 25.5);
    assert_eq!(s.kube.k8s_client_burst, 50);
    assert_eq!(s.ipam.excess_ip_release_delay, 60);
    assert!(s.ipam.aws_use_primary_address);
    assert_eq!(s.runtime.eni_gc_interval.as_secs(), 450);
    // ipFamily IPv6: every listener on an IPv6 address, the probes on ::1.
    assert_eq!(s.server.metrics_addr.to_string(), "[::]:9761");
    assert_eq!(s.server.health_addr.to_string(), "[::1]:9762");
    assert_eq!(s.server.debug_addr.to_string(), "[::1]:9763");
    let every_rendered = render(&helm, &["-f", &every.display().to_string()]).unwrap();
    assert_eq!(every_rendered.matches("host: \"::1\"").count(), 2);

    let chart_defaults = operator_settings(&render(&helm, &[]).unwrap());
    let own = eni_operator::config::Settings::try_parse_from(["eni-operator"]).unwrap();
    assert_eq!(
        chart_defaults.gate.ec2_rate_fraction,
        own.gate.ec2_rate_fraction
    );
    assert_eq!(
        chart_defaults.runtime.parallel_alloc_workers,
        own.runtime.parallel_alloc_workers
    );
    assert_eq!(chart_defaults.kube.k8s_client_qps, own.kube.k8s_client_qps);
    assert_eq!(
        chart_defaults.kube.k8s_client_burst,
        own.kube.k8s_client_burst
    );
    assert_eq!(
        chart_defaults.ipam.excess_ip_release_delay,
        own.ipam.excess_ip_release_delay
    );
    assert_eq!(
        chart_defaults.handover.handover_quiet,
        own.handover.handover_quiet
    );

    // No step of the docs has the user edit the rendered ConfigMap: values do it.
    for doc in [
        "docs/migrating-from-cilium.md",
        "docs/runbook.md",
        "docs/upgrading.md",
    ] {
        let text = std::fs::read_to_string(root().join(doc)).unwrap();
        assert!(
            !text.contains("04-configmap.yaml"),
            "{doc} has the user edit manifests/04-configmap.yaml"
        );
    }
}

/// Values that would install something broken are refused at `helm install`, naming the value.
#[test]
fn the_chart_refuses_values_that_break_the_install() {
    let Some(helm) = helm("the_chart_refuses_values_that_break_the_install") else {
        return;
    };
    for (args, needle) in [
        (
            vec!["--set", "ports.health=9751"],
            "ports.metrics and ports.health",
        ),
        (vec!["--set", "ports.debug=9752"], "ports.debug is 9752"),
        (
            vec!["--set", "podDisruptionBudget.minAvailable=2"],
            "podDisruptionBudget.minAvailable",
        ),
        (
            vec![
                "--set",
                "replicas=3",
                "--set",
                "podDisruptionBudget.minAvailable=100%",
            ],
            "podDisruptionBudget.minAvailable",
        ),
        (vec!["--set", "replicas=0"], "/replicas"),
        (vec!["--set", "ec2RateFraction=0"], "/ec2RateFraction"),
        (
            vec!["--set", "handoverSelector=handover"],
            "/handoverSelector",
        ),
        (
            vec!["--set", "staticIPRequiredTag=egress"],
            "/staticIPRequiredTag",
        ),
        (vec!["--set", "metricsCompat=prometheus"], "/metricsCompat"),
    ] {
        let err = render(&helm, &args).expect_err(&format!("{args:?} rendered"));
        assert!(err.contains(needle), "{args:?}: {err}");
    }
    for args in [
        vec![
            "--set",
            "replicas=3",
            "--set",
            "podDisruptionBudget.minAvailable=2",
        ],
        vec![
            "--set",
            "replicas=3",
            "--set",
            "podDisruptionBudget.minAvailable=50%",
        ],
        vec!["--set", "replicas=1"],
        vec!["--set", "mode=shadow"],
    ] {
        render(&helm, &args).unwrap_or_else(|e| panic!("{args:?}: {e}"));
    }
}

/// An umbrella chart passes `global` to its subcharts: the schema must take it.
#[test]
fn the_chart_works_as_a_subchart() {
    let Some(helm) = helm("the_chart_works_as_a_subchart") else {
        return;
    };
    let dir = fresh_temp_dir("umbrella");
    std::fs::create_dir_all(dir.join("charts")).unwrap();
    std::fs::write(
        dir.join("Chart.yaml"),
        "apiVersion: v2\nname: platform\nversion: 1.0.0\ndependencies:\n  - name: eni-operator\n    version: \"*\"\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("values.yaml"),
        "global:\n  imageRegistry: registry.example.com\neni-operator:\n  clusterName: c1\n",
    )
    .unwrap();
    run(Command::new("cp")
        .arg("-r")
        .arg(chart())
        .arg(dir.join("charts")));
    let out = run(Command::new(&helm).args(["template", "platform"]).arg(&dir));
    assert!(out.contains("ENI_OPERATOR_CLUSTER_NAME: \"c1\""), "{out}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn helm_lint_strict_passes_with_defaults_every_value_and_shadow() {
    let Some(helm) = helm("helm_lint_strict_passes_with_defaults_every_value_and_shadow") else {
        return;
    };
    let every = chart().join("ci/every-value.yaml");
    for extra in [
        vec![],
        vec!["-f".to_string(), every.display().to_string()],
        vec!["--set".to_string(), "mode=shadow".to_string()],
        // Go's grammar, as Cilium users paste it (the operator parses it the same way).
        vec!["--set".to_string(), "eni.gcInterval=1.5m".to_string()],
    ] {
        let out = run(Command::new(&helm)
            .args(["lint", "--strict"])
            .arg(chart())
            .args(&extra));
        assert!(out.contains("0 chart(s) failed"), "{extra:?}: {out}");
    }
    // The schema is enforced: a duration below makes the lint fail, as a typo in a value does.
    for bad in [
        "eni.gcInterval=5 minutes",
        "eni.gcInterval=45",
        "eni.gcIntervall=5m",
        "mode=passive",
    ] {
        let out = Command::new(&helm)
            .args(["lint", "--strict"])
            .arg(chart())
            .args(["--set", bad])
            .output()
            .unwrap();
        assert!(!out.status.success(), "lint accepted --set {bad}");
    }
}

/// The schema's duration pattern and the operator's parser (Go's `time.ParseDuration`) agree:
/// a value `helm install` accepts starts the operator, and one the operator would refuse (a
/// crash loop) is refused by `helm install` already. Empty is the schema's "unset" (the
/// ConfigMap then omits the key: the operator's default).
#[test]
fn the_schemas_duration_pattern_is_the_operators_parser() {
    let text = std::fs::read_to_string(chart().join("values.schema.json")).unwrap();
    let schema: Value = serde_json::from_str(&text).unwrap();
    let pattern = schema["definitions"]["duration"]["pattern"]
        .as_str()
        .unwrap();
    let re = regex::Regex::new(pattern).unwrap();
    let both_accept = [
        "0", "+0", "0s", "500ms", "15s", "1m", "1.5m", "1h30m", "1h30m15s", "2.s", ".5s", "1s1m",
        "+3s", "250us", "250µs", "250μs", "10ns", "6m", "8760h",
    ];
    let both_refuse = [
        "45",
        "00",
        "-1s",
        "-0",
        "-0s",
        "1.5",
        ".s",
        "s",
        "m5",
        "1d",
        "1w",
        "5 minutes",
        " 1s",
        "1s ",
        "1 s",
        "1M",
        "1H",
        "1sec",
        "1.5.5s",
        "1e3s",
        "1,5m",
        "0x10s",
    ];
    for v in both_accept {
        assert!(re.is_match(v), "the schema refuses {v:?}");
        let parsed = eni_operator::config::values::parse_duration(v);
        assert!(parsed.is_ok(), "the operator refuses {v:?}: {parsed:?}");
    }
    for v in both_refuse {
        assert!(!re.is_match(v), "the schema accepts {v:?}");
        assert!(
            eni_operator::config::values::parse_duration(v).is_err(),
            "the operator accepts {v:?}"
        );
    }
    assert!(re.is_match(""), "empty (unset) must pass the schema");
}

/// An empty directory of this test process under the temp dir.
fn fresh_temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("eni-operator-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The files of manifests/ that the chart renders (the rest, crd/ and aws/, are not its).
fn rendered_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for sub in ["", "shadow", "monitoring", "cilium-ignore"] {
        let d = dir.join(sub);
        for entry in std::fs::read_dir(&d).unwrap() {
            let p = entry.unwrap().path();
            if p.extension().is_some_and(|e| e == "yaml") {
                files.push(p.strip_prefix(dir).unwrap().to_path_buf());
            }
        }
    }
    files.sort();
    files
}

/// `kubectl apply -f manifests/` (and manifests/shadow/, manifests/monitoring/) installs exactly
/// what `helm install` with the default values does: the committed files are the chart's output.
#[test]
fn manifests_are_the_charts_output() {
    let Some(helm) = helm("manifests_are_the_charts_output") else {
        return;
    };
    let out = fresh_temp_dir("manifests");
    run(Command::new("bash")
        .arg(root().join("scripts/render-manifests.sh"))
        .arg(&out)
        .env("HELM", &helm));
    let committed = rendered_files(&root().join("manifests"));
    let fresh = rendered_files(&out);
    assert_eq!(
        committed, fresh,
        "manifests/ has other files than the chart renders: run `make manifests`"
    );
    assert!(fresh.len() >= 12, "{fresh:?}");
    for f in &fresh {
        let a = std::fs::read_to_string(root().join("manifests").join(f)).unwrap();
        let b = std::fs::read_to_string(out.join(f)).unwrap();
        assert!(
            a == b,
            "manifests/{} differs from the chart's output: run `make manifests` (HELM=...)",
            f.display()
        );
    }
    let _ = std::fs::remove_dir_all(&out);
}

/// Each alert links its own section of docs/runbook.md (GitHub's heading anchors), and the ways
/// out of a hanging node deletion are named where a user looks: NOTES.txt and the runbook.
#[test]
fn every_alert_links_its_runbook_section() {
    let runbook = std::fs::read_to_string(root().join("docs/runbook.md")).unwrap();
    let anchors: BTreeSet<String> = runbook
        .lines()
        .filter_map(|l| l.strip_prefix("### "))
        .map(|h| h.trim().to_lowercase())
        .collect();
    let rules = yaml(&root().join("manifests/monitoring/prometheusrule.yaml"));
    let mut alerts = 0;
    for group in rules["spec"]["groups"].as_array().unwrap() {
        for rule in group["rules"].as_array().unwrap() {
            let alert = rule["alert"].as_str().unwrap();
            let url = rule["annotations"]["runbook_url"]
                .as_str()
                .unwrap_or_else(|| panic!("{alert}: no runbook_url"));
            let (page, anchor) = url.split_once('#').unwrap();
            assert!(page.ends_with("docs/runbook.md"), "{alert}: {url}");
            assert_eq!(anchor, alert.to_lowercase(), "{alert}: {url}");
            assert!(
                anchors.contains(anchor),
                "docs/runbook.md has no section {alert}"
            );
            alerts += 1;
        }
    }
    assert!(alerts >= 7);
    let notes = std::fs::read_to_string(chart().join("templates/NOTES.txt")).unwrap();
    for text in [&notes, &runbook] {
        assert!(text.contains("eni-operator uninstall"));
        assert!(text.contains("eni-operator.cilium.io/release-enis"));
    }
    for section in [
        "## Install",
        "## Upgrade",
        "## Roll back",
        "## Uninstall",
        "## The operator is down and node deletions hang",
    ] {
        assert!(runbook.contains(section), "docs/runbook.md lacks {section}");
    }
}

/// The image (`make image`, scripts/image.sh + Containerfile) is what the chart runs: the
/// Deployment's command is the Containerfile's entrypoint, the user is the pods' 65532, no base
/// image is pulled (FROM scratch, no `# syntax=` frontend), both platforms are cross-compiled
/// as static musl binaries, and the Makefile's targets run those steps. Building it is too heavy
/// for CI (README, "The image"); this keeps the wiring from drifting.
#[test]
fn the_image_is_what_the_chart_runs() {
    let containerfile = std::fs::read_to_string(root().join("Containerfile")).unwrap();
    let lines: Vec<&str> = containerfile
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    assert!(
        !lines[0].starts_with("# syntax"),
        "a syntax line pulls a frontend"
    );
    let from: Vec<&&str> = lines.iter().filter(|l| l.starts_with("FROM ")).collect();
    assert_eq!(from, [&"FROM scratch"]);
    assert!(lines.contains(&"USER 65532:65532"));
    assert!(lines.contains(&"COPY bin/${TARGETARCH}/eni-operator /usr/local/bin/eni-operator"));
    let entrypoint = lines
        .iter()
        .find_map(|l| l.strip_prefix("ENTRYPOINT "))
        .expect("an ENTRYPOINT");
    let entrypoint: Vec<String> = serde_json::from_str(entrypoint).unwrap();

    let deployment = yaml(&root().join("manifests/05-deployment.yaml"));
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(
        pod["containers"][0]["command"],
        serde_json::json!(entrypoint)
    );
    assert_eq!(pod["securityContext"]["runAsUser"], 65532);
    assert_eq!(pod["securityContext"]["runAsGroup"], 65532);

    let script = std::fs::read_to_string(root().join("scripts/image.sh")).unwrap();
    for needle in [
        "x86_64-unknown-linux-musl:amd64",
        "aarch64-unknown-linux-musl:arm64",
        "cargo zigbuild --locked --release",
        "--platform linux/amd64,linux/arm64",
        "--timestamp 0",
        "-f Containerfile",
        "nonroot:x:65532:65532",
        "--runtime runc",
    ] {
        assert!(script.contains(needle), "scripts/image.sh lacks {needle}");
    }
    let makefile = std::fs::read_to_string(root().join("Makefile")).unwrap();
    for needle in [
        "bash scripts/image.sh binaries",
        "bash scripts/image.sh build",
        "bash scripts/image.sh smoke",
    ] {
        assert!(makefile.contains(needle), "Makefile lacks {needle}");
    }
    // Every step of the release workflow is a make target that exists.
    let workflow = std::fs::read_to_string(root().join(".github/workflows/release.yml")).unwrap();
    let mut steps = 0;
    for line in workflow.lines() {
        if let Some(cmd) = line.trim().strip_prefix("run: make ") {
            let target = cmd.split_whitespace().next().unwrap();
            assert!(
                makefile
                    .lines()
                    .any(|l| l.starts_with(&format!("{target}:"))),
                "release.yml runs make {target}, which the Makefile lacks"
            );
            steps += 1;
        }
    }
    assert!(steps >= 9, "{steps} make steps in release.yml");
}

/// The rules of a rendered PrometheusRule: (alert, expr).
fn rules_of(rendered: &str) -> Vec<(String, String)> {
    let doc = rendered
        .split("\n---")
        .find(|d| d.contains("kind: PrometheusRule"))
        .expect("a PrometheusRule");
    let v: Value = serde_saphyr::from_str(doc).unwrap();
    let mut out = Vec::new();
    for group in v["spec"]["groups"].as_array().unwrap() {
        for rule in group["rules"].as_array().unwrap() {
            out.push((
                rule["alert"].as_str().unwrap().to_string(),
                rule["expr"].as_str().unwrap().to_string(),
            ));
        }
    }
    out
}

/// A shadow gets the shadow's rules (it never leads: the active set's EniOperatorNoLeader fired
/// for its whole run); every expression selects its own install's series and aggregates by
/// (cluster, namespace, job), so one install never fires another's alerts and a scale-up is
/// one alert, not one per node.
#[test]
fn each_mode_renders_its_own_scoped_rules() {
    let Some(helm) = helm("each_mode_renders_its_own_scoped_rules") else {
        return;
    };
    let active = rules_of(&render(&helm, &["--set", "prometheusRule.enabled=true"]).unwrap());
    let shadow = Command::new(&helm)
        .args(["template", "eni-operator-shadow"])
        .arg(chart())
        .args(["-n", "eni-operator", "--set", "mode=shadow"])
        .args(["--set", "prometheusRule.enabled=true"])
        .output()
        .unwrap();
    assert!(shadow.status.success());
    let shadow = rules_of(&String::from_utf8_lossy(&shadow.stdout));

    let names = |rules: &[(String, String)]| -> BTreeSet<String> {
        rules.iter().map(|(a, _)| a.clone()).collect()
    };
    let (a, s) = (names(&active), names(&shadow));
    // (tests/it/monitoring.rs lists the active alerts the docs promise.)
    assert!(a.contains("EniOperatorNoLeader"));
    assert!(!s.is_empty());
    for alert in &s {
        assert!(
            alert.starts_with("EniOperatorShadow"),
            "the shadow renders the active operator's {alert}"
        );
    }
    assert!(a.iter().all(|x| !x.starts_with("EniOperatorShadow")));

    let by = regex::Regex::new(r"\bby \(([^)]*)\)").unwrap();
    let selector = regex::Regex::new(r"\b(eni_operator_[a-z0-9_]+)\{([^}]*)\}").unwrap();
    for (job, rules) in [
        ("eni-operator-metrics", &active),
        ("eni-operator-shadow-metrics", &shadow),
    ] {
        for (alert, expr) in rules {
            let groupings: Vec<_> = by.captures_iter(expr).collect();
            assert!(!groupings.is_empty(), "{alert} does not aggregate: {expr}");
            for g in groupings {
                for label in ["cluster", "namespace", "job"] {
                    assert!(
                        g[1].split(',').any(|l| l.trim() == label),
                        "{alert}: `by ({})` lacks {label}",
                        &g[1]
                    );
                }
                assert!(
                    !g[1].contains("target_node") || expr.starts_with("count by"),
                    "{alert} fires once per node: {expr}"
                );
            }
            let selectors: Vec<_> = selector.captures_iter(expr).collect();
            let metrics = expr.matches("eni_operator_").count();
            assert_eq!(
                selectors.len(),
                metrics,
                "{alert}: a metric without a selector: {expr}"
            );
            for sel in selectors {
                assert!(
                    sel[2].contains(r#"namespace="eni-operator""#)
                        && sel[2].contains(&format!(r#"job="{job}""#)),
                    "{alert}: {} is not scoped to its install: {expr}",
                    &sel[1]
                );
            }
        }
    }
    // The alerts' runbook sections exist for the shadow's rules too.
    let runbook = std::fs::read_to_string(root().join("docs/runbook.md")).unwrap();
    for alert in s.iter().chain(&a) {
        assert!(
            runbook.contains(&format!("### {alert}\n")),
            "docs/runbook.md has no section {alert}"
        );
    }
}

/// The first ```sh block after `marker` in a doc.
fn sh_block_after(doc: &str, marker: &str) -> String {
    let rest = &doc[doc.find(marker).unwrap_or_else(|| panic!("no {marker:?}"))..];
    let start = rest.find("```sh\n").expect("a sh block") + "```sh\n".len();
    let len = rest[start..].find("```").expect("its end");
    rest[start..start + len].to_string()
}

/// docs/upgrading.md's move from the plain manifests to Helm, as written, on a real API
/// server: `kubectl apply -f manifests/`, the doc's adoption commands, then `helm install`
/// adopts every object (the Role in kube-system included). A `--create-namespace` install
/// is told, in its NOTES, how to label its namespace for Pod Security.
#[test]
fn the_adoption_steps_in_docs_upgrading_work() {
    let Some(helm) = helm("the_adoption_steps_in_docs_upgrading_work") else {
        return;
    };
    let Some(assets) = testkit::control_plane::assets_from_env() else {
        eprintln!(
            "*** tests/it/chart.rs the_adoption_steps_in_docs_upgrading_work: NOT RUN: \
             KUBEBUILDER_ASSETS is not set (etcd, kube-apiserver, kubectl)"
        );
        return;
    };
    let cp = testkit::control_plane::ControlPlane::start(&assets).unwrap();
    let path = format!(
        "{}:{}",
        assets.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let sh = |script: &str| {
        run(Command::new("bash")
            .args(["-euo", "pipefail", "-c", script])
            .current_dir(root())
            .env("PATH", &path)
            .env("KUBECONFIG", cp.kubeconfig()))
    };
    sh("kubectl apply -f manifests/");
    let doc = std::fs::read_to_string(root().join("docs/upgrading.md")).unwrap();
    // The doc's block as written, with this checkout's chart and helm binary and a value.
    let helm = helm.display().to_string();
    let block = sh_block_after(&doc, "**From the plain manifests to Helm**");
    let published = "oci://ghcr.io/eni-operator/charts/eni-operator --version <version>";
    assert!(block.contains(published), "{block}");
    let block = block
        .replace(published, "charts/eni-operator")
        .replace("helm install", &format!("{helm} install"))
        .replace("-f values.yaml", "--set clusterName=c1");
    let out = sh(&block);
    assert!(out.contains("STATUS: deployed"), "{out}");
    let role = sh(
        "kubectl -n kube-system get role -l app.kubernetes.io/managed-by=Helm -o name \
         | grep eni-operator",
    );
    assert!(!role.trim().is_empty());
    // A privileged namespace (the manifests' own) needs no advice; a bare one does.
    assert!(
        !out.contains("pod-security.kubernetes.io/enforce=privileged"),
        "{out}"
    );
    let bare = sh(&format!(
        "{helm} install other charts/eni-operator -n bare --create-namespace \
         --set clusterName=c1 --set leaderElection.leaseName=other"
    ));
    assert!(
        bare.contains("kubectl label namespace bare pod-security.kubernetes.io/enforce=privileged"),
        "{bare}"
    );
}

/// Every problem reason (operator-status, Events) and every wait reason has its row in
/// docs/runbook.md: what it means and what to do.
#[test]
fn the_runbook_explains_every_problem_and_wait_reason() {
    let runbook = std::fs::read_to_string(root().join("docs/runbook.md")).unwrap();
    let ipam = std::fs::read_to_string(root().join("src/ipam/problem.rs")).unwrap();
    let problems: Vec<&str> = ipam
        .lines()
        .filter_map(|l| l.trim().strip_prefix("Self::"))
        .filter_map(|l| l.split_once(" => \""))
        .map(|(_, name)| name.trim_end_matches("\",").trim_end_matches('"'))
        .collect();
    assert!(problems.len() >= 19, "{problems:?}");
    assert!(problems.contains(&"CiliumIgnoresAnnotation"));
    let status = std::fs::read_to_string(root().join("src/reconcile/status.rs")).unwrap();
    let enum_body = &status[status.find("pub enum WaitReason").unwrap()..];
    let enum_body = &enum_body[..enum_body.find("\n}").unwrap()];
    let waits: Vec<String> = enum_body
        .lines()
        .map(str::trim)
        .filter(|l| l.ends_with(',') && !l.starts_with("//") && !l.starts_with('#'))
        .map(|l| {
            let camel = l.trim_end_matches(',');
            let mut kebab = String::new();
            for (i, c) in camel.chars().enumerate() {
                if c.is_ascii_uppercase() && i > 0 {
                    kebab.push('-');
                }
                kebab.push(c.to_ascii_lowercase());
            }
            kebab
        })
        .collect();
    assert!(waits.len() >= 9, "{waits:?}");
    for reason in problems.iter().map(|s| s.to_string()).chain(waits) {
        assert!(
            runbook.contains(&format!("| `{reason}` |")),
            "docs/runbook.md has no row for {reason}"
        );
    }
}

/// `eni-operator status` inside the leader, as README and docs/runbook.md say: the Lease's
/// holderIdentity is the pod's name (POD_NAME from the Downward API), the container runs the
/// image's binary at the path the docs exec, and `status`'s default address is the chart's
/// metrics port on the pod's (host) loopback.
#[test]
fn status_by_exec_into_the_leader_is_what_the_chart_runs() {
    use clap::Parser;
    let deployment = yaml(&root().join("manifests/05-deployment.yaml"));
    let pod = &deployment["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    assert_eq!(pod["hostNetwork"], true);
    let binary = container["command"][0].as_str().unwrap();
    let pod_name = container["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "POD_NAME")
        .expect("POD_NAME");
    assert_eq!(
        pod_name["valueFrom"]["fieldRef"]["fieldPath"],
        "metadata.name"
    );
    // The identity falls back to POD_NAME (src/main.rs); nothing in the ConfigMap overrides it.
    let cm = std::fs::read_to_string(root().join("manifests/04-configmap.yaml")).unwrap();
    assert!(!cm.contains("ENI_OPERATOR_IDENTITY"));
    // `status` reads the debug listener the ConfigMap sets, which is the operator's default.
    let defaults = eni_operator::config::Settings::try_parse_from(["eni-operator"]).unwrap();
    let configured = format!(
        "ENI_OPERATOR_DEBUG_ADDR: \"{}\"",
        defaults.server.debug_addr
    );
    assert!(cm.contains(&configured), "the ConfigMap lacks {configured}");
    let status = eni_operator::status_cli::StatusArgs::try_parse_from(["status"]).unwrap();
    assert_eq!(
        status.address,
        format!("http://{}", defaults.server.debug_addr)
    );
    let lease = yaml(&chart().join("values.yaml"))["leaderElection"]["leaseName"]
        .as_str()
        .unwrap()
        .to_string();
    let command = format!(
        "kubectl -n eni-operator get lease {lease} -o jsonpath='{{.spec.holderIdentity}}')\n\
         kubectl -n eni-operator exec \"$LEADER\" -- {binary} status --waiting"
    );
    for doc in ["README.md", "docs/runbook.md"] {
        let text = std::fs::read_to_string(root().join(doc)).unwrap();
        assert!(text.contains(&command), "{doc} lacks:\n{command}");
    }
}
