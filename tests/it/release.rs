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
