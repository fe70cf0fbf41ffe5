//! `make demo` in quick mode, as a user runs it: the binary, its exit code, its figures and
//! its plot.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use quick_xml::Reader;
use quick_xml::events::Event;

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("demo-test-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

/// Runs the demo; returns its figures and its plot.
fn run(backend: &str, dir: &Path) -> (serde_json::Value, String) {
    let (plot, json) = (dir.join("demo.svg"), dir.join("demo.json"));
    let started = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_demo"))
        .args(["--quick", "--backend", backend, "--plot"])
        .arg(&plot)
        .arg("--json")
        .arg(&json)
        .output()
        .expect("the demo starts");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!(
        "demo --quick --backend {backend}: {:.1} s of wall time",
        started.elapsed().as_secs_f64()
    );
    // Not a terminal: plain lines, and the summary.
    assert!(stdout.contains("nodes   30 joined"), "{stdout}");
    assert!(
        stdout.contains("nodes (20 classic, 10 multi-pool) served"),
        "{stdout}"
    );
    let figures = serde_json::from_str(&std::fs::read_to_string(&json).expect("figures"))
        .expect("figures are JSON");
    (figures, std::fs::read_to_string(&plot).expect("plot"))
}

/// The elements of a well-formed XML document (the reader fails on mismatched tags).
fn elements(xml: &str) -> Vec<String> {
    let mut r = Reader::from_str(xml);
    let mut out = Vec::new();
    let mut depth = 0i32;
    loop {
        match r.read_event().expect("well-formed XML") {
            Event::Start(e) => {
                depth += 1;
                out.push(e.name().into_inner().to_owned());
            }
            Event::Empty(e) => out.push(e.name().into_inner().to_owned()),
            Event::End(_) => depth -= 1,
            Event::Eof => break,
            _ => {}
        }
    }
    assert_eq!(depth, 0, "every element closed");
    out
}

fn check(figures: &serde_json::Value, svg: &str) {
    let n = |k: &str| {
        figures[k]
            .as_u64()
            .unwrap_or_else(|| panic!("{k} in {figures}"))
    };
    assert_eq!(n("joined"), 30, "{figures}");
    assert_eq!(
        (n("served"), n("waiting")),
        (30, 0),
        "every node served: {figures}"
    );
    assert_eq!((n("classic"), n("multi_pool")), (20, 10));
    let calls = |a: &str| figures["calls"][a]["calls"].as_u64().unwrap_or(0);
    assert!(
        calls("CreateNetworkInterface") >= 30 && calls("AttachNetworkInterface") >= 30,
        "at least one new ENI per node: {figures}"
    );
    assert!(n("enis") >= 30, "{figures}");
    assert!(
        calls("UnassignPrivateIpAddresses") > 0,
        "a release: {figures}"
    );
    assert!(n("ready_answers") > 0, "through the handshake: {figures}");
    assert!(n("throttled") > 0, "a throttled moment: {figures}");
    assert!(figures["slowest"]["seconds"].as_f64().unwrap() > 0.0);

    let els = elements(svg);
    assert_eq!(els.first().map(String::as_str), Some("svg"), "{svg}");
    // The two lines and their legend samples.
    assert!(
        els.iter().filter(|e| *e == "polyline").count() >= 4,
        "{els:?}"
    );
    for text in ["nodes served", "rate-limit bound"] {
        assert!(svg.contains(text), "{text} in the plot");
    }
}

#[test]
fn the_quick_demo_serves_every_node_releases_and_is_throttled_in_memory() {
    let dir = scratch("memory");
    let (figures, svg) = run("memory", &dir);
    check(&figures, &svg);
    let _ = std::fs::remove_dir_all(dir);
}
