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
pub use testkit::cilium_operator::{ACCESS_KEY, LEASE, NAMESPACE, Version};

pub struct CiliumOperator {
    pub version: Version,
    child: Child,
    pub metrics_port: u16,
    pub log: PathBuf,
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
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
        let bin = version
            .binary()
            .with_context(|| format!("{} is not set", version.var()))?;
        let kubeconfig = std::env::var_os("KUBECONFIG")
            .map(PathBuf::from)
            .context("KUBECONFIG (the admin kubeconfig) is not set")?;
        let (metrics_port, health_port) = (free_port()?, free_port()?);
        std::fs::create_dir_all(work.join("logs"))?;
        let log = work
            .join("logs")
            .join(format!("cilium-operator-{version}-{health_port}.log"));
        let out = std::fs::File::create(&log)?;
        let launch = testkit::cilium_operator::Launch {
            version,
            binary: &bin,
            kubeconfig: &kubeconfig,
            ec2_endpoint,
            cluster_name,
            metrics_port,
            health_port,
            work,
            extra,
        };
        let a = launch.all_args();
        let child = Command::from(launch.command())
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        tracing::info!(%version, log = %log.display(), "Cilium's operator started: {}", a.join(" "));
        Ok(Self {
            version,
            child,
            metrics_port,
            log,
        })
    }

    /// Why it is not running any more, with its last log lines.
    pub fn exited(&mut self) -> Option<String> {
        match self.child.try_wait() {
            Ok(Some(status)) => Some(format!(
                "Cilium's operator {} exited ({status}): {}",
                self.version,
                self.tail(8)
            )),
            _ => None,
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
            tracing::warn!(version = %self.version, "Cilium's operator ignored SIGTERM; killing it");
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
    fn chunked_bodies_decode() {
        assert_eq!(
            dechunk("5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"),
            "hello world"
        );
    }
}
