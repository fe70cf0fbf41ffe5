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
                "*** tests/chart.rs {test}: NOT RUN: HELM is not set (the path of a helm binary; \
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
/// rendered on its own) and what the rest of the file needs on.
const KEPT_AT_DEFAULT: &[&str] = &[
    "mode",
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
    let listed: BTreeSet<&String> = schema["properties"].as_object().unwrap().keys().collect();
    let values: BTreeSet<&String> = defaults.as_object().unwrap().keys().collect();
    assert_eq!(listed, values);
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
    let out = std::env::temp_dir().join(format!("eni-operator-manifests-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out).unwrap();
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
