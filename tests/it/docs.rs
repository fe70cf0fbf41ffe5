//! Every reference the code makes to the project's rules resolves inside this repository:
//! `§N` (a section of `docs/rules.md`), `C1`-`C10` (its rules), `docs/<page>.md` (a page that
//! exists), and nothing points at the specification the project was started from, which is not
//! part of the repository.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Where references may appear. Every file below these is scanned, whatever its kind.
const SCANNED: &[&str] = &[
    "src",
    "tests",
    "e2e",
    "crd-gen",
    "docs",
    "scripts",
    "manifests",
    "testkit",
    "bench",
];
const SCANNED_FILES: &[&str] = &["README.md", "Makefile", "Cargo.toml"];

/// `§`, spelt so that this file does not cite a section itself.
const SECTION: char = '\u{a7}';

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// (path relative to the root, text) of every UTF-8 file in the scanned places.
fn scanned_files() -> Vec<(String, String)> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, out);
            } else {
                out.push(path);
            }
        }
    }
    let mut paths = Vec::new();
    for dir in SCANNED {
        walk(&root().join(dir), &mut paths);
    }
    paths.extend(SCANNED_FILES.iter().map(|f| root().join(f)));
    paths.sort();
    let files: Vec<_> = paths
        .into_iter()
        .filter_map(|p| {
            let text = String::from_utf8(std::fs::read(&p).ok()?).ok()?;
            let rel = p.strip_prefix(root()).ok()?.display().to_string();
            Some((rel, text))
        })
        .collect();
    assert!(
        files.iter().any(|(p, _)| p == "testkit/src/lib.rs")
            && files.iter().any(|(p, _)| p == "bench/src/lib.rs"),
        "the scan misses the testkit or bench crate"
    );
    assert!(
        files.iter().any(|(p, _)| p == "src/lib.rs"),
        "the scan found no source"
    );
    files
}

fn rules_page() -> String {
    std::fs::read_to_string(root().join("docs/rules.md")).expect("docs/rules.md exists")
}

/// Section numbers of the headings of `docs/rules.md` ("## 7. ...", "### 7.4 ...").
fn sections(rules: &str) -> BTreeSet<String> {
    rules
        .lines()
        .filter(|l| l.starts_with('#'))
        .filter_map(|l| l.trim_start_matches('#').split_whitespace().next())
        .map(|n| n.trim_end_matches('.').to_string())
        .filter(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit() || c == '.'))
        .collect()
}

/// The rules defined on the page: list items starting with "**C<n> ".
fn rules_defined(rules: &str) -> BTreeSet<u32> {
    rules
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("- **C"))
        .filter_map(|rest| {
            let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
            digits.parse().ok()
        })
        .collect()
}

/// Every `§N(.N)*` in `text`.
fn section_refs(text: &str) -> Vec<String> {
    text.split(SECTION)
        .skip(1)
        .filter_map(|after| {
            let mut number = String::new();
            let mut chars = after.chars().peekable();
            while let Some(&c) = chars.peek() {
                if c.is_ascii_digit() {
                    number.push(c);
                } else if c == '.' && number.chars().last().is_some_and(|l| l.is_ascii_digit()) {
                    // A dot belongs to the number only when a digit follows ("§7.4", not "§2.").
                    let mut ahead = chars.clone();
                    ahead.next();
                    if !ahead.peek().is_some_and(char::is_ascii_digit) {
                        break;
                    }
                    number.push(c);
                } else {
                    break;
                }
                chars.next();
            }
            (!number.is_empty()).then_some(number)
        })
        .collect()
}

/// Every stand-alone `C<digits>` word in `text` ("C2", "C1-C9"; not "EC2", not "C2x").
fn rule_refs(text: &str) -> Vec<u32> {
    let bytes = text.as_bytes();
    let word = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let mut found = Vec::new();
    for (i, _) in text.match_indices('C') {
        if i > 0 && word(bytes[i - 1]) {
            continue;
        }
        let digits: String = text[i + 1..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        let end = i + 1 + digits.len();
        if digits.is_empty() || bytes.get(end).is_some_and(|b| word(*b)) {
            continue;
        }
        found.push(digits.parse().expect("digits"));
    }
    found
}

/// Fails with `what` and every place where `unresolved` finds, in the text of a scanned file,
/// a citation that does not resolve.
fn assert_citations_resolve(what: &str, unresolved: impl Fn(&str) -> Vec<String>) {
    let mut missing = Vec::new();
    for (path, text) in scanned_files() {
        missing.extend(unresolved(&text).into_iter().map(|c| format!("{path}{c}")));
    }
    assert!(missing.is_empty(), "{what}:\n{}", missing.join("\n"));
}

/// The citations among `refs` that are not `known`, each as `: {prefix}{n}`.
fn unknown<N: Ord + std::fmt::Display>(
    refs: Vec<N>,
    known: &BTreeSet<N>,
    prefix: impl std::fmt::Display,
) -> Vec<String> {
    let refs = refs.into_iter().filter(|n| !known.contains(n));
    refs.map(|n| format!(": {prefix}{n}")).collect()
}

#[test]
fn section_references_resolve_to_headings_of_the_rules_page() {
    let known = sections(&rules_page());
    assert!(known.contains("7.4") && known.contains("14"), "{known:?}");
    let what = "sections cited but not in docs/rules.md";
    assert_citations_resolve(what, |text| unknown(section_refs(text), &known, SECTION));
}

#[test]
fn rule_references_resolve_to_rules_of_the_rules_page() {
    let known = rules_defined(&rules_page());
    assert_eq!(known, (1..=10).collect::<BTreeSet<_>>());
    let what = "rules cited but not defined in docs/rules.md";
    assert_citations_resolve(what, |text| unknown(rule_refs(text), &known, "C"));
}

#[test]
fn no_file_points_outside_the_repository_for_its_rules() {
    // Spelt in pieces so that this file does not match itself.
    let stale = [concat!("shared", "/spec"), concat!("behaviour", ".md")];
    let what = "references to a specification outside the repository (cite docs/ instead)";
    assert_citations_resolve(what, |text| {
        let lines = text.lines().enumerate();
        lines
            .filter(|(_, line)| stale.iter().any(|s| line.contains(s)))
            .map(|(i, line)| format!(":{}: {}", i + 1, line.trim()))
            .collect()
    });
}

#[test]
fn cited_docs_pages_exist() {
    assert_citations_resolve("docs pages cited but missing", |text| {
        let mut missing = Vec::new();
        for (i, _) in text.match_indices("docs/") {
            let name: String = text[i + 5..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || "-_.".contains(*c))
                .collect();
            let name = name.trim_end_matches('.');
            if name.ends_with(".md") && !root().join("docs").join(name).is_file() {
                missing.push(format!(": docs/{name}"));
            }
        }
        missing
    });
}

#[test]
fn the_reference_parsers_find_what_they_should() {
    let text = format!(
        "x {SECTION}7.4 step 3, {SECTION}5-{SECTION}8, end {SECTION}2. C1-C9, EC2 C10x (C5)"
    );
    assert_eq!(section_refs(&text), ["7.4", "5", "8", "2"]);
    assert_eq!(rule_refs(&text), [1, 9, 5]);
    let page = "## 7. Release\n### 7.4 Multi-pool\n- **C3 - a /28.**\n";
    assert_eq!(sections(page), BTreeSet::from(["7".into(), "7.4".into()]));
    assert_eq!(rules_defined(page), BTreeSet::from([3]));
}

/// The paths the architecture page names in backticks (`src/...`, `tests/...`, a crate's
/// folder): the page is a newcomer's map, so each must lead to a file or folder that exists.
fn missing_paths(page: &str) -> Vec<String> {
    const ROOTS: &[&str] = &[
        "src/", "tests/", "testkit/", "bench/", "dst/", "e2e/", "crd-gen/", "charts/", "docs/",
    ];
    page.split('`')
        .skip(1)
        .step_by(2)
        .filter(|t| ROOTS.iter().any(|r| t.starts_with(r)))
        .filter(|t| !t.contains(|c: char| c.is_whitespace() || "*{<".contains(c)))
        .filter(|t| !root().join(t).exists())
        .map(str::to_string)
        .collect()
}

#[test]
fn every_path_the_architecture_page_names_exists() {
    let page = std::fs::read_to_string(root().join("docs/architecture.md")).unwrap();
    let missing = missing_paths(&page);
    assert!(
        missing.is_empty(),
        "docs/architecture.md names paths that do not exist:\n{}",
        missing.join("\n")
    );
    assert_eq!(
        missing_paths("see `src/nowhere.rs` and `src/ipam/` and `cargo test`"),
        ["src/nowhere.rs"]
    );
}
