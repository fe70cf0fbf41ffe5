//! The dependency set stays lean (issue 22, part 4): one YAML stack (serde-saphyr, which
//! kube-client already builds; the deprecated serde_yaml is gone), one `sha2`, and tokio with
//! only the features each crate uses (never `full`).

use std::path::Path;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Versions of `crate_name` in Cargo.lock.
fn locked_versions(crate_name: &str) -> Vec<String> {
    let lock = std::fs::read_to_string(root().join("Cargo.lock")).unwrap();
    let name = format!("name = \"{crate_name}\"");
    let lines: Vec<&str> = lock.lines().collect();
    lines
        .iter()
        .enumerate()
        .filter(|(_, l)| **l == name)
        .filter_map(|(i, _)| lines.get(i + 1)?.strip_prefix("version = "))
        .map(|v| v.trim_matches('"').to_string())
        .collect()
}

#[test]
fn one_yaml_stack_and_one_sha2() {
    assert_eq!(locked_versions("serde_yaml"), Vec::<String>::new());
    assert_eq!(locked_versions("unsafe-libyaml"), Vec::<String>::new());
    assert_eq!(locked_versions("serde-saphyr").len(), 1);
    assert_eq!(
        locked_versions("sha2").len(),
        1,
        "aws-sigv4 brings sha2; ours must be the same version"
    );
}

#[test]
fn tokio_features_are_named_per_crate() {
    for manifest in [
        "Cargo.toml",
        "bench/Cargo.toml",
        "crd-gen/Cargo.toml",
        "dst/Cargo.toml",
        "e2e/Cargo.toml",
        "testkit/Cargo.toml",
    ] {
        let text = std::fs::read_to_string(root().join(manifest)).unwrap();
        for line in text.lines().filter(|l| l.starts_with("tokio ")) {
            assert!(!line.contains("\"full\""), "{manifest}: {line}");
        }
    }
}
