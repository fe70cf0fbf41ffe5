//! The control-plane launcher (`testkit::control_plane` and the `control-plane` binary) on the
//! real binaries of `KUBEBUILDER_ASSETS`.
//!
//! Without `KUBEBUILDER_ASSETS` (a user's clone, where nothing provides the binaries) each test
//! says so on stderr and returns without asserting: the binaries are not the project's to
//! download. `.ci/run` unpacks them and exports the variable before `make test`, so CI runs
//! these tests for real (see docs/testing.md).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use testkit::control_plane::{ControlPlane, assets_from_env};

fn assets(test: &str) -> Option<PathBuf> {
    static SAID: std::sync::Once = std::sync::Once::new();
    let a = assets_from_env();
    if a.is_none() {
        // Once per run, straight to stderr: the test harness captures eprintln! of passing tests.
        SAID.call_once(|| {
            use std::io::Write;
            let _ = writeln!(
                std::io::stderr(),
                "*** testkit/tests/control_plane.rs ({test} and the others): NOT RUN: \
                 KUBEBUILDER_ASSETS is not set (a directory with etcd, kube-apiserver, \
                 kube-controller-manager and kubectl; .ci/run sets it)"
            );
        });
    }
    a
}

fn kubectl(assets: &Path, kubeconfig: &Path, args: &[&str]) -> (bool, String) {
    let out = Command::new(assets.join("kubectl"))
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("running kubectl");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

fn eventually(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    cond()
}

fn alive(pid: u32) -> bool {
    // A zombie (exited, not yet reaped by its parent) counts as gone.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            s.rsplit(')')
                .next()
                .is_some_and(|r| !r.trim_start().starts_with('Z'))
        })
        .unwrap_or(false)
}

/// The children of `parent` according to /proc.
fn children(parent: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // pid (comm) state ppid ...
        let ppid = stat
            .rsplit(')')
            .next()
            .and_then(|r| r.split_whitespace().nth(1));
        if ppid == Some(&parent.to_string()) {
            out.push(pid);
        }
    }
    out
}

#[test]
fn control_plane_serves_crds_rbac_and_garbage_collection_then_stops() {
    let Some(assets) = assets("control_plane_serves_crds_rbac_and_garbage_collection_then_stops")
    else {
        return;
    };
    let cp = ControlPlane::start(&assets).expect("control plane starts");
    let kc = cp.kubeconfig();
    let (pids, dir) = (cp.pids(), cp.dir().to_path_buf());
    assert_eq!(pids.len(), 3);

    // A CRD through kubectl's client-side validation (needs OpenAPI served at once).
    let crd =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../manifests/crd/ciliumnodes.cilium.io.yaml");
    let k = |args: &[&str]| kubectl(&assets, &kc, args);
    let (ok, out) = k(&["apply", "-f", &crd.display().to_string()]);
    assert!(ok, "kubectl apply of the CRD: {out}");
    let established = "--for=condition=established";
    let (ok, out) = k(&[
        "wait",
        established,
        "crd/ciliumnodes.cilium.io",
        "--timeout=60s",
    ]);
    assert!(ok, "CRD established: {out}");

    // RBAC is on: a user without bindings is refused.
    let (_, out) = k(&["auth", "can-i", "list", "nodes", "--as=nobody"]);
    assert_eq!(
        out.lines().next(),
        Some("no"),
        "RBAC must refuse an unbound user: {out}"
    );

    // The garbage collector runs: a dependent goes with its owner.
    let (ok, out) = k(&["create", "configmap", "owner"]);
    assert!(ok, "{out}");
    let (_, uid) = k(&[
        "get",
        "configmap",
        "owner",
        "-o",
        "jsonpath={.metadata.uid}",
    ]);
    let dependent = format!(
        "{{\"apiVersion\":\"v1\",\"kind\":\"ConfigMap\",\"metadata\":{{\"name\":\"dependent\",\
         \"ownerReferences\":[{{\"apiVersion\":\"v1\",\"kind\":\"ConfigMap\",\"name\":\"owner\",\"uid\":\"{uid}\"}}]}}}}"
    );
    let path = dir.join("dependent.json");
    std::fs::write(&path, dependent).unwrap();
    let (ok, out) = k(&["create", "-f", &path.display().to_string()]);
    assert!(ok, "{out}");
    let (ok, out) = k(&["delete", "configmap", "owner"]);
    assert!(ok, "{out}");
    assert!(
        eventually(Duration::from_secs(120), || {
            let (ok, out) = k(&["get", "configmap", "dependent"]);
            !ok && out.contains("NotFound")
        }),
        "kube-controller-manager's garbage collector did not delete the dependent"
    );

    drop(cp);
    for pid in pids {
        assert!(
            !alive(pid),
            "process {pid} still runs after the control plane was dropped"
        );
    }
    assert!(
        !dir.exists(),
        "data directory {} left behind",
        dir.display()
    );
}

/// The binary: ready kubeconfig, then SIGTERM stops every child and removes the kubeconfig; a
/// SIGKILLed launcher takes its children with it (PR_SET_PDEATHSIG).
#[test]
fn control_plane_binary_stops_its_children_on_sigterm_and_when_killed() {
    let Some(assets) = assets("control_plane_binary_stops_its_children_on_sigterm_and_when_killed")
    else {
        return;
    };
    for signal in [libc::SIGTERM, libc::SIGKILL] {
        let kc = std::env::temp_dir().join(format!(
            "cp-test-{}-{signal}.kubeconfig",
            std::process::id()
        ));
        let mut launcher = Command::new(env!("CARGO_BIN_EXE_control-plane"))
            .arg("--kubeconfig")
            .arg(&kc)
            .env("KUBEBUILDER_ASSETS", &assets)
            .stdin(Stdio::null())
            .spawn()
            .expect("starting the control-plane binary");
        assert!(
            eventually(Duration::from_secs(180), || kc.exists()),
            "no kubeconfig from the launcher"
        );
        let (ok, out) = kubectl(&assets, &kc, &["get", "--raw", "/readyz"]);
        assert!(ok && out.trim() == "ok", "{out}");
        let kids = children(launcher.id());
        assert_eq!(
            kids.len(),
            3,
            "etcd, kube-apiserver, kube-controller-manager: {kids:?}"
        );

        // SAFETY: kill(2) on our own child, not yet reaped.
        unsafe { libc::kill(launcher.id() as i32, signal) };
        let status = launcher.wait().unwrap();
        assert!(
            eventually(Duration::from_secs(30), || kids.iter().all(|&p| !alive(p))),
            "after signal {signal} to the launcher, still running: {:?}",
            kids.iter().filter(|&&p| alive(p)).collect::<Vec<_>>()
        );
        if signal == libc::SIGTERM {
            assert!(status.success(), "{status}");
            assert!(
                !kc.exists(),
                "the kubeconfig must go with the control plane"
            );
        } else {
            let _ = std::fs::remove_file(&kc);
        }
    }
}

/// A picked port that another process took before its component bound it: the start is made
/// again with new ports, whichever component lost its port (etcd exits at once; the controller
/// manager exits after its start-up, where a plain connect to its port would have succeeded).
#[test]
fn a_port_taken_between_its_pick_and_its_use_starts_the_control_plane_again() {
    let Some(assets) =
        assets("a_port_taken_between_its_pick_and_its_use_starts_the_control_plane_again")
    else {
        return;
    };
    // Picks: etcd client, etcd peer, kube-apiserver, kube-controller-manager.
    for (taken_at, component) in [(0, "etcd"), (3, "kube-controller-manager")] {
        let holder = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let taken = holder.local_addr().unwrap().port();
        let mut picks = 0;
        let mut cp = ControlPlane::start_with_ports(&assets, || {
            picks += 1;
            if picks == taken_at + 1 {
                Ok(taken)
            } else {
                testkit::control_plane::free_port()
            }
        })
        .unwrap_or_else(|e| panic!("{component}'s port taken: the start failed: {e:#}"));
        assert_eq!(
            picks, 8,
            "{component}'s port taken: one start again, four new ports"
        );
        assert!(
            !cp.server().ends_with(&format!(":{taken}")),
            "{component}: served on the taken port"
        );
        std::thread::sleep(Duration::from_secs(2));
        assert_eq!(
            cp.exited(),
            None,
            "{component}'s port taken: a component exited"
        );
        let (ok, out) = kubectl(&assets, &cp.kubeconfig(), &["get", "ns", "default"]);
        assert!(ok, "{component}'s port taken: {out}");
        drop(holder);
    }
}
