//! `make e2e` (e2e/run-kind.sh) fails fast, with one clear line, when a tool, the Docker
//! engine or the EC2 emulator is missing or unhealthy: before a kind cluster is created; and
//! scripts/check-install.sh (the server-side dry run of the README's install command) fails
//! when that path holds a CRD or the ciliumnodes CRD changes. The scripts run here against fake
//! `docker`/`kind`/`kubectl`/`cargo`/`curl` commands (small shell scripts in a temporary PATH)
//! that record what they were asked to do.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Mutex, MutexGuard};

/// One test of this module at a time: the scripts under test are run as a user runs them, one
/// after the other (their fakes are written so that no fork sees them open, see [`fake`]).
fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The absolute path of a real command, from this process's PATH.
fn which(name: &str) -> PathBuf {
    std::env::split_paths(&std::env::var_os("PATH").unwrap())
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("{name} not found in PATH"))
}

/// A fresh directory to serve as the script's whole PATH.
fn bin_dir(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("eni-e2e-scripts-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// An executable shell script, written by a child `sh` and not by this process: another test of
/// this binary that forks (helm, moto, a control plane) while this process holds the file open
/// for writing would keep it open in its child until that child's exec, and running the script
/// then fails with ETXTBSY ("Text file busy").
fn fake(dir: &Path, name: &str, body: &str) {
    let status = Command::new(which("sh"))
        .args([
            "-c",
            "printf '#!/bin/sh\\n%s\\n' \"$2\" > \"$1\" && chmod 755 \"$1\"",
        ])
        .arg("sh")
        .arg(dir.join(name))
        .arg(body)
        .status()
        .unwrap();
    assert!(status.success(), "writing the fake {name}");
}

/// Real basic tools (the script checks for them too) plus recording fakes of the heavy ones.
fn fake_world(test: &str, docker: &str, curl: &str) -> PathBuf {
    let dir = bin_dir(test);
    for tool in ["cat", "cp", "grep", "mkdir", "mktemp", "rm", "sed", "sleep"] {
        std::os::unix::fs::symlink(which(tool), dir.join(tool)).unwrap();
    }
    let log = dir.join("calls.log");
    let record = format!("echo \"$(basename \"$0\") $*\" >> '{}'", log.display());
    fake(&dir, "basename", "echo \"${1##*/}\"");
    fake(&dir, "docker", &format!("{record}\n{docker}"));
    fake(&dir, "curl", &format!("{record}\n{curl}"));
    for tool in ["kind", "kubectl", "cargo"] {
        fake(&dir, tool, &record);
    }
    dir
}

fn run_kind(path: &Path, extra_env: &[(&str, &str)]) -> (Output, String) {
    let mut cmd = Command::new(which("bash"));
    cmd.arg(root().join("e2e/run-kind.sh"))
        .env_clear()
        .env("PATH", path)
        .env("HOME", std::env::temp_dir())
        .env("E2E_EMULATOR_NAME", "eni-e2e-scripts-test")
        .current_dir(root());
    for (k, v) in extra_env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (out, stderr)
}

fn calls(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("calls.log")).unwrap_or_default()
}

#[test]
fn make_e2e_names_every_missing_tool_before_doing_anything() {
    let _serial = serial();
    let empty = bin_dir("missing");
    let (out, stderr) = run_kind(&empty, &[]);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    let line = stderr
        .lines()
        .find(|l| l.starts_with("error: make e2e needs:"))
        .unwrap_or_else(|| panic!("no clear message: {stderr}"));
    for tool in ["docker", "kind", "kubectl", "cargo", "curl"] {
        assert!(line.split_whitespace().any(|w| w == tool), "{tool}: {line}");
    }
}

#[test]
fn make_e2e_fails_fast_when_the_docker_engine_is_down() {
    let _serial = serial();
    let dir = fake_world("engine", "[ \"$1\" = info ] && exit 1; exit 0", "exit 7");
    let (out, stderr) = run_kind(&dir, &[]);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("error: the Docker engine is not reachable"),
        "{stderr}"
    );
    assert!(!calls(&dir).contains("docker run"), "{}", calls(&dir));
    assert!(!calls(&dir).contains("kind create"), "{}", calls(&dir));
}

#[test]
fn make_e2e_fails_fast_when_the_emulator_exits_and_shows_its_logs() {
    let _serial = serial();
    // LocalStack without a token: the container stops at once.
    let docker = r#"case "$1" in
  inspect) echo false ;;
  logs) echo "License activation failed: no LOCALSTACK_AUTH_TOKEN" ;;
esac
exit 0"#;
    let dir = fake_world("exited", docker, "exit 7");
    let (out, stderr) = run_kind(&dir, &[("LOCALSTACK_AUTH_TOKEN", "secret-token-value")]);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("container (localstack/localstack:4.14.0) exited"),
        "{stderr}"
    );
    assert!(stderr.contains("LOCALSTACK_AUTH_TOKEN"), "{stderr}");
    assert!(
        stderr.contains("License activation failed"),
        "logs shown: {stderr}"
    );
    let calls = calls(&dir);
    assert!(!calls.contains("kind create"), "{calls}");
    // The token is passed through by name, never on the command line.
    let run = calls.lines().find(|l| l.starts_with("docker run")).unwrap();
    assert!(run.contains("-e LOCALSTACK_AUTH_TOKEN "), "{run}");
    assert!(!run.contains("secret-token-value"), "{run}");
    assert!(
        run.contains("localstack/localstack:4.14.0"),
        "pinned image: {run}"
    );
    // Cleanup removed the container (once before starting it, once on exit).
    assert_eq!(
        calls.matches("docker rm -f eni-e2e-scripts-test").count(),
        2,
        "{calls}"
    );
}

#[test]
fn make_e2e_fails_fast_when_the_emulator_never_becomes_healthy() {
    let _serial = serial();
    let docker = r#"[ "$1" = inspect ] && echo true; exit 0"#;
    let dir = fake_world("unhealthy", docker, "exit 7");
    let (out, stderr) = run_kind(&dir, &[("E2E_EC2", "moto"), ("E2E_EMULATOR_TIMEOUT", "1")]);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("error: moto is not healthy after 1s (http://127.0.0.1:4566/moto-api/"),
        "{stderr}"
    );
    let calls = calls(&dir);
    assert!(calls.contains("motoserver/moto:"), "{calls}");
    assert!(!calls.contains("kind create"), "{calls}");
}

#[test]
fn make_e2e_rejects_an_unknown_emulator() {
    let _serial = serial();
    let dir = fake_world("unknown", "exit 0", "exit 0");
    let (out, stderr) = run_kind(&dir, &[("E2E_EC2", "aws")]);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("E2E_EC2 must be localstack or moto, not 'aws'"),
        "{stderr}"
    );
    assert!(!calls(&dir).contains("docker run"));
}

/// scripts/check-install.sh against a fake API server (`kubectl`): `dry_run` is what
/// `kubectl apply --dry-run=server -o name` prints; the CRD's resourceVersion is read from the
/// file `crd-version` in the fake's directory, so a test can change it between reads.
fn check_install(test: &str, dry_run: &str, bump_crd_on_apply: bool) -> (Output, String, String) {
    let dir = bin_dir(test);
    std::os::unix::fs::symlink(which("grep"), dir.join("grep")).unwrap();
    std::os::unix::fs::symlink(which("cat"), dir.join("cat")).unwrap();
    let d = dir.display();
    std::fs::write(dir.join("crd-version"), "100 1.31\n").unwrap();
    let bump = if bump_crd_on_apply {
        format!("echo '101 1.31' > '{d}/crd-version'")
    } else {
        String::new()
    };
    fake(
        &dir,
        "kubectl",
        &format!(
            r#"echo "kubectl $*" >> '{d}/calls.log'
case "$*" in
  *jsonpath*) cat '{d}/crd-version' ;;
  *dry-run=server*) {bump}
    printf '%s\n' '{dry_run}' ;;
esac
exit 0"#
        ),
    );
    let out = Command::new(which("bash"))
        .arg(root().join("scripts/check-install.sh"))
        .env_clear()
        .env("PATH", &dir)
        .current_dir(root())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let calls = calls(&dir);
    (out, stderr, calls)
}

#[test]
fn check_install_passes_a_clean_dry_run_and_writes_nothing_else() {
    let _serial = serial();
    let (out, stderr, calls) = check_install(
        "install-ok",
        "namespace/eni-operator\ndeployment.apps/eni-operator",
        false,
    );
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("ok: 2 objects apply cleanly"), "{stderr}");
    assert!(calls.contains("apply --dry-run=server -f"), "{calls}");
    // The namespace exists (the fake answers every `get`), so nothing is applied for real.
    let real_applies: Vec<_> = calls
        .lines()
        .filter(|l| l.starts_with("kubectl apply") && !l.contains("--dry-run=server"))
        .collect();
    assert!(real_applies.is_empty(), "{real_applies:?}");
}

#[test]
fn check_install_fails_when_the_apply_path_holds_a_crd() {
    let _serial = serial();
    let (out, stderr, _) = check_install(
        "install-crd",
        "customresourcedefinition.apiextensions.k8s.io/ciliumnodes.cilium.io\nnamespace/eni-operator",
        false,
    );
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("error: the default apply path contains a CRD"),
        "{stderr}"
    );
}

#[test]
fn check_install_fails_when_the_ciliumnodes_crd_changes() {
    let _serial = serial();
    let (out, stderr, _) = check_install("install-bump", "namespace/eni-operator", true);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("error: the ciliumnodes CRD changed during the check"),
        "{stderr}"
    );
}

/// `make e2e-local` with `KUBEBUILDER_ASSETS` set and `KUBECONFIG` unset: fake assets, a fake
/// `control-plane` binary in a fake target dir, and a fake suite binary that stops the run at
/// its first call (exit 3), so the cleanup path runs too.
fn run_local_own_control_plane(
    test: &str,
    control_plane: &str,
    kubeconfig: Option<&str>,
) -> (Output, String, PathBuf) {
    let dir = fake_world(test, "exit 0", "exit 0");
    for tool in ["python3", "base64", "chmod", "date"] {
        std::os::unix::fs::symlink(which(tool), dir.join(tool)).unwrap();
    }
    let log = dir.join("calls.log");
    let assets = dir.join("assets");
    std::fs::create_dir_all(&assets).unwrap();
    for bin in ["etcd", "kube-apiserver", "kube-controller-manager"] {
        fake(&assets, bin, "exit 1");
    }
    fake(
        &assets,
        "kubectl",
        &format!(
            "echo \"assets-kubectl KUBECONFIG=$KUBECONFIG $*\" >> '{}'",
            log.display()
        ),
    );
    let target = dir.join("target");
    std::fs::create_dir_all(target.join("debug")).unwrap();
    fake(
        &target.join("debug"),
        "control-plane",
        &control_plane.replace("LOG", &log.display().to_string()),
    );
    fake(
        &target.join("debug"),
        "eni-operator-e2e",
        &format!("echo \"suite $*\" >> '{}'; exit 3", log.display()),
    );
    let work = dir.join("work");
    let mut cmd = Command::new(which("bash"));
    cmd.arg(root().join("e2e/run-local.sh"))
        .env_clear()
        .env("PATH", &dir)
        .env("HOME", std::env::temp_dir())
        .env("KUBEBUILDER_ASSETS", &assets)
        .env("CARGO_TARGET_DIR", &target)
        .env("E2E_WORK_DIR", &work)
        .env("EC2_ENDPOINT", "http://127.0.0.1:1")
        .env("E2E_CONTROL_PLANE_TIMEOUT", "20")
        .current_dir(root());
    if let Some(kc) = kubeconfig {
        cmd.env("KUBECONFIG", kc);
    }
    let out = cmd.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (out, stderr, dir)
}

/// A control plane that writes its kubeconfig at once and records its stop.
const GOOD_CONTROL_PLANE: &str = "echo \"control-plane $*\" >> 'LOG'
trap 'echo control-plane stopped >> LOG; exit 0' TERM INT
echo 'apiVersion: v1' > \"$2\"
while :; do sleep 0.1; done";

#[test]
fn make_e2e_local_starts_and_stops_its_own_control_plane_from_kubebuilder_assets() {
    let _serial = serial();
    let (out, stderr, dir) = run_local_own_control_plane("own-cp", GOOD_CONTROL_PLANE, None);
    let calls = calls(&dir);
    // The fake suite's exit code: the run got past the control plane to the suite.
    assert_eq!(out.status.code(), Some(3), "{stderr}\n{calls}");
    let kc = dir.join("work/control-plane.kubeconfig");
    assert!(
        calls.contains(&format!("control-plane --kubeconfig {}", kc.display())),
        "{calls}"
    );
    // Every kubectl call: the assets' kubectl, on the control plane's kubeconfig.
    assert!(calls.contains("assets-kubectl"), "{calls}");
    assert!(
        !calls.lines().any(|l| l.starts_with("kubectl ")),
        "PATH's kubectl used: {calls}"
    );
    for l in calls.lines().filter(|l| l.starts_with("assets-kubectl")) {
        assert!(l.contains(&format!("KUBECONFIG={} ", kc.display())), "{l}");
    }
    // One build, with the features `make test` unifies.
    let builds: Vec<&str> = calls.lines().filter(|l| l.starts_with("cargo ")).collect();
    assert_eq!(
        builds,
        ["cargo build --quiet --locked --workspace --all-targets"],
        "{calls}"
    );
    // Stopped on exit (here: the suite failed).
    assert!(calls.contains("control-plane stopped"), "{stderr}\n{calls}");
}

#[test]
fn make_e2e_local_uses_kubeconfig_when_it_is_set_even_with_kubebuilder_assets() {
    let _serial = serial();
    let (out, stderr, dir) = run_local_own_control_plane(
        "given-kubeconfig",
        GOOD_CONTROL_PLANE,
        Some("/nonexistent/kubeconfig"),
    );
    let calls = calls(&dir);
    assert_eq!(out.status.code(), Some(3), "{stderr}\n{calls}");
    assert!(!calls.contains("control-plane"), "{calls}");
    assert!(calls.lines().any(|l| l.starts_with("kubectl ")), "{calls}");
}

#[test]
fn make_e2e_local_fails_fast_with_the_log_when_its_control_plane_dies() {
    let _serial = serial();
    let dying =
        "echo 'control plane: etcd exited (exit status: 1): bind: address in use' >&2; exit 1";
    let (out, stderr, dir) = run_local_own_control_plane("dying-cp", dying, None);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("error: the control plane did not start"),
        "{stderr}"
    );
    assert!(
        stderr.contains("bind: address in use"),
        "the launcher's log: {stderr}"
    );
    assert!(!calls(&dir).contains("suite"), "{}", calls(&dir));
}
