//! Runs a real control plane (etcd, kube-apiserver, kube-controller-manager from
//! `KUBEBUILDER_ASSETS`) until SIGTERM or SIGINT; see `testkit::control_plane` for the details.
//!
//! ```text
//! KUBEBUILDER_ASSETS=/dir cargo run -p testkit --bin control-plane -- --kubeconfig PATH
//! ```
//!
//! PATH (the admin kubeconfig) is written atomically once the API server is ready, OpenAPI
//! included, and removed on exit: wait for it to exist, then use it. Exits 1 if a component
//! dies, 2 on bad usage; everything it started stops with it on every exit path.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use testkit::control_plane::{ASSETS_ENV, ControlPlane, assets_from_env};
use tokio::signal::unix::{SignalKind, signal};

fn usage() -> ExitCode {
    eprintln!("usage: {ASSETS_ENV}=DIR control-plane --kubeconfig PATH");
    ExitCode::from(2)
}

// One thread: the children's PR_SET_PDEATHSIG follows the thread that started them (main).
#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let out = match args.as_slice() {
        [flag, path] if flag == "--kubeconfig" => PathBuf::from(path),
        [flag] if flag.starts_with("--kubeconfig=") => {
            PathBuf::from(&flag["--kubeconfig=".len()..])
        }
        _ => return usage(),
    };
    let Some(assets) = assets_from_env() else {
        eprintln!(
            "control-plane: {ASSETS_ENV} is not set (a directory with etcd, kube-apiserver, kube-controller-manager and kubectl)"
        );
        return usage();
    };
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        eprintln!("control-plane: cannot install signal handlers");
        return ExitCode::FAILURE;
    };
    let mut cp = match ControlPlane::start(&assets) {
        Ok(cp) => cp,
        Err(e) => {
            eprintln!("control-plane: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    let tmp = out.with_extension("tmp");
    let written = std::fs::copy(cp.kubeconfig(), &tmp).and_then(|_| std::fs::rename(&tmp, &out));
    if let Err(e) = written {
        eprintln!("control-plane: writing {}: {e}", out.display());
        return ExitCode::FAILURE;
    }
    eprintln!(
        "control-plane: ready: {} (kubeconfig {}, data and logs in {})",
        cp.server(),
        out.display(),
        cp.dir().display()
    );
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let code = loop {
        tokio::select! {
            _ = term.recv() => break ExitCode::SUCCESS,
            _ = int.recv() => break ExitCode::SUCCESS,
            _ = tick.tick() => {
                if let Some(exited) = cp.exited() {
                    eprintln!("control-plane: {exited}");
                    break ExitCode::FAILURE;
                }
            }
        }
    };
    let _ = std::fs::remove_file(&out);
    cp.stop();
    eprintln!("control-plane: stopped");
    code
}
