//! Cilium's own operator (`cilium-operator-aws`) as a local process beside ours, on the suite's
//! control plane and ec2-sim. The binary comes from `CILIUM_OPERATOR` (1.20) or
//! `CILIUM_OPERATOR_116` (1.16), a path like `KUBEBUILDER_ASSETS`: nothing here downloads or
//! builds it; without it a scenario that needs it says NOT RUN.
//!
//! What it needs (observed, see the README beside the binaries): an instance metadata endpoint
//! (ec2-sim serves one on its own port: `AWS_EC2_METADATA_SERVICE_ENDPOINT`), the EC2 endpoint
//! (`AWS_ENDPOINT_URL_EC2`: plain HTTP; `--ec2-api-endpoint` would prefix `https://`), static
//! credentials (their access key ID names it in ec2-sim's per-client record), a kubeconfig, and
//! the flags that keep it to ENI IPAM on a cluster without agents. It always runs leader
//! election on the Lease `cilium-operator-resource-lock` (15 s), deleted before each start.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, DeleteParams};
use tokio::process::{Child, Command};

// The flags and environment are testkit's (the benchmark starts the same operator).
pub use testkit::cilium_operator::{ACCESS_KEY, LEASE, Launch, NAMESPACE, Version};

pub struct CiliumOperator {
    child: Child,
    pub log: PathBuf,
    /// What it was started with, to start it again as the kubelet would.
    launch: Launch,
    /// Times it exited on its own and was started again.
    pub restarts: u32,
}

/// How often a process that exits on its own is started again before a scenario gives up on it.
/// In a cluster its Deployment's pod has `restartPolicy: Always`: the kubelet restarts a container
/// that exits, whatever its status (Kubernetes docs, "Pod Lifecycle", container restart policy).
/// Cilium 1.16 exits (`level=fatal`, "Unable to start eni allocator") when its first EC2
/// synchronization fails, and its AWS SDK (2024) does not retry a response whose connection Go's
/// transport closed while it was read ("use of closed network connection", aws-sdk-go-v2 #2737,
/// retried only from January 2025, PR #2949): seen once in CI on ec2-sim at 1.16's start.
const RESTARTS: u32 = 3;

/// How often Cilium's `ipam-node-interval-refresh` controller runs (`pkg/ipam/node_manager.go`,
/// `Start`: `RunInterval: time.Minute`).
const CILIUM_RESYNC: Duration = Duration::from_secs(60);

/// How long Cilium's per-node gauges (`cilium_operator_ipam_{available,used,needed}_ips`) may lag
/// the state. It sets them only in that controller's `Resync` (`resyncNode`), and the controller
/// skips `Resync` when its EC2 listing fails ("Unable to synchronize EC2 ..."). 1.16's SDK fails
/// one now and then (the closed connection of `RESTARTS`; CI: at +60 s, gauges stale until after
/// a 75 s wait), so a wait spans two of its minutes and a margin.
pub const GAUGE_REFRESH: Duration = Duration::from_secs(2 * CILIUM_RESYNC.as_secs() + 20);

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// Starts the process of `launch`, its output in a log named by version, health port and
/// `suffix`.
fn spawn(launch: &Launch, suffix: &str) -> Result<(Child, PathBuf)> {
    let logs = launch.work.join("logs");
    std::fs::create_dir_all(&logs)?;
    let log = logs.join(format!(
        "cilium-operator-{}-{}{suffix}.log",
        launch.version, launch.health_port
    ));
    let out = std::fs::File::create(&log)?;
    let child = Command::from(launch.command())
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {}", launch.binary.display()))?;
    tracing::info!(version = %launch.version, log = %log.display(), "Cilium's operator started: {}", launch.all_args().join(" "));
    Ok((child, log))
}

impl CiliumOperator {
    /// Deletes a Lease left by an earlier process (a SIGKILLed leader's would hold the next one
    /// back for its 15 s), then starts the binary. `extra` flags go last.
    pub async fn start(
        version: Version,
        kube: &kube::Client,
        ec2_endpoint: &str,
        cluster_name: &str,
        work: &Path,
        extra: &[String],
    ) -> Result<Self> {
        delete_lease(kube).await?;
        Self::start_keeping_lease(version, ec2_endpoint, cluster_name, work, extra)
    }

    /// Starts the binary without touching its Lease: a restart as a rollout does it (the new
    /// process waits for the old leader's Lease, released on SIGTERM or expired after 15 s).
    pub fn start_keeping_lease(
        version: Version,
        ec2_endpoint: &str,
        cluster_name: &str,
        work: &Path,
        extra: &[String],
    ) -> Result<Self> {
        let binary = version
            .binary()
            .with_context(|| format!("{} is not set", version.var()))?;
        let kubeconfig = std::env::var_os("KUBECONFIG")
            .map(PathBuf::from)
            .context("KUBECONFIG (the admin kubeconfig) is not set")?;
        let launch = Launch {
            version,
            binary,
            kubeconfig,
            ec2_endpoint: ec2_endpoint.to_owned(),
            cluster_name: cluster_name.to_owned(),
            metrics_port: free_port()?,
            health_port: free_port()?,
            work: work.to_owned(),
            extra: extra.to_vec(),
        };
        Self::spawn_first(launch)
    }

    fn spawn_first(launch: Launch) -> Result<Self> {
        let (child, log) = spawn(&launch, "")?;
        Ok(Self {
            child,
            log,
            launch,
            restarts: 0,
        })
    }

    pub fn version(&self) -> Version {
        self.launch.version
    }

    /// Its Prometheus port.
    pub fn metrics_port(&self) -> u16 {
        self.launch.metrics_port
    }

    /// Why it is not running any more, with its last log lines; `None` while it runs. A process
    /// that exited on its own is started again, same flags and ports, as its pod's kubelet would
    /// ([`RESTARTS`] times; the Lease it may still hold is left to expire, as in a cluster).
    pub fn exited(&mut self) -> Option<String> {
        let status = match self.child.try_wait() {
            Ok(Some(status)) => status,
            _ => return None,
        };
        let note = format!(
            "Cilium's operator {} exited ({status}): {}",
            self.version(),
            self.tail(8)
        );
        if self.restarts >= RESTARTS {
            return Some(format!("{note} (after {} restarts)", self.restarts));
        }
        self.restarts += 1;
        let suffix = format!("-restart{}", self.restarts);
        match spawn(&self.launch, &suffix) {
            Ok((child, log)) => {
                println!(
                    "     Cilium's operator {} restarted as its kubelet would (restart {} of {RESTARTS}): {note}",
                    self.version(),
                    self.restarts
                );
                self.child = child;
                self.log = log;
                None
            }
            Err(e) => Some(format!("{note}; starting it again failed: {e:#}")),
        }
    }

    pub fn tail(&self, n: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join(" | ")
    }

    /// Lines of its log containing `needle` (case-insensitive).
    pub fn log_lines(&self, needle: &str) -> Vec<String> {
        let needle = needle.to_lowercase();
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.to_lowercase().contains(&needle))
            .map(String::from)
            .collect()
    }

    /// Its EC2 listings that failed: each skipped a minute of its per-node gauges.
    pub fn failed_listings(&self) -> usize {
        self.log_lines("Unable to synchronize EC2").len()
    }

    /// SIGTERM, then SIGKILL after `grace`.
    pub async fn stop(mut self, grace: Duration) -> Result<()> {
        if let Some(pid) = self.child.id() {
            let _ = std::process::Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status();
        }
        if tokio::time::timeout(grace, self.child.wait())
            .await
            .is_err()
        {
            tracing::warn!(version = %self.version(), "Cilium's operator ignored SIGTERM; killing it");
            self.child.kill().await?;
        }
        Ok(())
    }
}

pub async fn delete_lease(kube: &kube::Client) -> Result<()> {
    let leases: Api<Lease> = Api::namespaced(kube.clone(), NAMESPACE);
    match leases.delete(LEASE, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// The `io.cilium.k8s.crd.schema.version` label on the CiliumNode CRD: the newest schema a
/// Cilium operator registered (what our handover guard reads).
pub async fn crd_schema_label(kube: &kube::Client) -> Result<Option<String>> {
    use eni_operator::ipam::cilium_version::{CILIUM_NODE_CRD, SCHEMA_LABEL};
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let crds: Api<CustomResourceDefinition> = Api::all(kube.clone());
    Ok(crds
        .get_metadata(CILIUM_NODE_CRD)
        .await?
        .metadata
        .labels
        .and_then(|l| l.get(SCHEMA_LABEL).cloned()))
}

/// Removes that label, as on a cluster where no newer Cilium ever ran: Cilium's operator only
/// raises it (`pkg/k8s/apis/crdhelpers/register.go`, `needsUpdateV1`), so after the suite's 1.20
/// runs an older operator would leave 1.20's label in place. Without it the next Cilium
/// operator to start registers its own schema and label.
pub async fn forget_crd_schema_label(kube: &kube::Client) -> Result<()> {
    use eni_operator::ipam::cilium_version::{CILIUM_NODE_CRD, SCHEMA_LABEL};
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::api::{Patch, PatchParams};
    let crds: Api<CustomResourceDefinition> = Api::all(kube.clone());
    let patch = serde_json::json!({"metadata": {"labels": {SCHEMA_LABEL: null}}});
    crds.patch(
        CILIUM_NODE_CRD,
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await?;
    Ok(())
}

/// The holder of Cilium's Lease, if any.
pub async fn lease_holder(kube: &kube::Client) -> Result<Option<String>> {
    let leases: Api<Lease> = Api::namespaced(kube.clone(), NAMESPACE);
    Ok(leases
        .get_opt(LEASE)
        .await?
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity))
}

/// A plain HTTP GET on loopback.
pub async fn http_get(port: u16, path: &str) -> Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    let req = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await?;
    let mut answer = Vec::new();
    s.read_to_end(&mut answer).await?;
    let answer = String::from_utf8_lossy(&answer).into_owned();
    let Some((head, body)) = answer.split_once("\r\n\r\n") else {
        bail!("GET {path}: no HTTP answer");
    };
    if !head.starts_with("HTTP/1.1 200") {
        bail!("GET {path}: {}", head.lines().next().unwrap_or_default());
    }
    // Chunked bodies (Go's server answers /metrics chunked when it streams).
    if head.to_lowercase().contains("transfer-encoding: chunked") {
        return Ok(dechunk(body));
    }
    Ok(body.to_owned())
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        body = rest[n..].trim_start_matches("\r\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_for_ciliums_gauges_outlasts_a_skipped_minute() {
        // One failed listing skips a refresh: the next comes two minutes after the state.
        assert!(GAUGE_REFRESH > 2 * CILIUM_RESYNC, "{GAUGE_REFRESH:?}");
    }

    /// A stand-in binary: exits 1 its first `fail` runs (counted in a file), then stays up.
    fn flaky_binary(dir: &Path, fail: u32) -> PathBuf {
        let bin = dir.join("flaky-operator");
        let count = dir.join("runs");
        std::fs::write(
            &bin,
            format!(
                "#!/bin/sh\necho run >> {c}\n[ \"$(wc -l < {c})\" -gt {fail} ] || exit 1\nexec sleep 30\n",
                c = count.display()
            ),
        )
        .unwrap();
        std::process::Command::new("chmod")
            .args(["+x", &bin.display().to_string()])
            .status()
            .unwrap();
        bin
    }

    /// An empty directory of this test's own.
    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("e2e-cilium-op-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn launch(dir: &Path, binary: PathBuf) -> Launch {
        Launch {
            version: Version::V116,
            binary,
            kubeconfig: dir.join("kubeconfig"),
            ec2_endpoint: "http://127.0.0.1:1".into(),
            cluster_name: "test".into(),
            metrics_port: 1,
            health_port: 1,
            work: dir.to_owned(),
            extra: vec![],
        }
    }

    /// Exited within 5 s, as `exited` says it.
    async fn exit_note(op: &mut CiliumOperator) -> Option<String> {
        for _ in 0..50 {
            let restarts = op.restarts;
            if let Some(note) = op.exited() {
                return Some(note);
            }
            if op.restarts > restarts {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("the stand-in neither exited nor was restarted in 5 s");
    }

    #[tokio::test]
    async fn a_process_that_exits_on_its_own_is_started_again_like_its_kubelet_would() {
        let dir = scratch("restarted");
        let bin = flaky_binary(&dir, 1);
        let mut op = CiliumOperator::spawn_first(launch(&dir, bin)).unwrap();
        assert_eq!(exit_note(&mut op).await, None, "restarted, not reported");
        assert_eq!(op.restarts, 1);
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(op.exited(), None, "the second run stays up");
        assert!(op.log.display().to_string().ends_with("-restart1.log"));
        op.stop(Duration::from_secs(5)).await.unwrap();
    }

    #[tokio::test]
    async fn a_process_that_keeps_exiting_is_reported_after_its_restarts() {
        let dir = scratch("reported");
        let bin = flaky_binary(&dir, 100);
        let mut op = CiliumOperator::spawn_first(launch(&dir, bin)).unwrap();
        let mut notes = vec![];
        while notes.len() <= RESTARTS as usize {
            notes.push(exit_note(&mut op).await);
        }
        assert_eq!(
            notes.iter().filter(|n| n.is_none()).count(),
            RESTARTS as usize
        );
        let last = notes.last().unwrap().as_deref().unwrap_or_default();
        assert!(last.contains("after 3 restarts"), "{last}");
        assert_eq!(
            std::fs::read_to_string(dir.join("runs"))
                .unwrap()
                .lines()
                .count(),
            1 + RESTARTS as usize
        );
    }

    #[test]
    fn chunked_bodies_decode() {
        assert_eq!(
            dechunk("5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"),
            "hello world"
        );
    }
}
