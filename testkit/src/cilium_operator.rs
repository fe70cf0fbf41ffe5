//! How to start Cilium's own operator (`cilium-operator-aws`) on a test world: its flags and
//! environment for ENI IPAM against a local control plane and ec2-sim. Shared by e2e's launcher
//! (`e2e/src/cilium_op.rs`, which runs it under tokio) and the real-process benchmark
//! (`bench/src/bin/bench-process.rs`, which runs it beside ours on fresh worlds).
//!
//! What it needs (observed running the binaries; the README beside them lists it): an instance
//! metadata endpoint (ec2-sim serves one on its own port: `AWS_EC2_METADATA_SERVICE_ENDPOINT`),
//! the EC2 endpoint (`AWS_ENDPOINT_URL_EC2`: plain HTTP; `--ec2-api-endpoint` would prefix
//! `https://`), static credentials (their access key ID names it in ec2-sim's per-client
//! record), a kubeconfig, and the flags that keep it to ENI IPAM on a cluster without agents. It
//! always runs leader election on the Lease `cilium-operator-resource-lock` (15 s).

use std::path::{Path, PathBuf};
use std::process::Command;

/// The Lease Cilium's operator elects its leader on.
pub const LEASE: &str = "cilium-operator-resource-lock";
/// Namespace of that Lease (`--k8s-namespace`).
pub const NAMESPACE: &str = "kube-system";
/// The access key ID its EC2 calls carry (ec2-sim's per-client record).
pub const ACCESS_KEY: &str = "CILIUMOPERATOR";
/// Its EC2 rate limiter as shipped (`--limit-ipam-api-qps`, `--limit-ipam-api-burst`: one
/// bucket for every EC2 call; Cilium's `operator/option` defaults).
pub const DEFAULT_QPS: u32 = 4;
pub const DEFAULT_BURST: u32 = 20;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Version {
    V120,
    V116,
}

impl Version {
    pub fn var(self) -> &'static str {
        match self {
            Version::V120 => "CILIUM_OPERATOR",
            Version::V116 => "CILIUM_OPERATOR_116",
        }
    }

    /// The binary, if its variable names an existing file.
    pub fn binary(self) -> Option<PathBuf> {
        std::env::var_os(self.var())
            .map(PathBuf::from)
            .filter(|p| p.is_file())
    }
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Version::V120 => "1.20",
            Version::V116 => "1.16",
        })
    }
}

/// Flags for an ENI-IPAM-only operator on a test cluster (the README's list).
pub fn args(
    version: Version,
    kubeconfig: &Path,
    cluster_name: &str,
    metrics_port: u16,
    health_port: u16,
    work: &Path,
) -> Vec<String> {
    let mut a: Vec<String> = [
        format!("--k8s-kubeconfig-path={}", kubeconfig.display()),
        format!("--k8s-namespace={NAMESPACE}"),
        "--ipam=eni".into(),
        format!("--cluster-name={cluster_name}"),
        "--identity-allocation-mode=crd".into(),
        "--enable-ipv6=false".into(),
        // Else CiliumNodes without a (kubelet-run) Node would be garbage-collected.
        "--nodes-gc-interval=0".into(),
        // With their defaults SIGTERM hung once (README).
        "--remove-cilium-node-taints=false".into(),
        "--set-cilium-is-up-condition=false".into(),
        format!("--operator-prometheus-serve-addr=127.0.0.1:{metrics_port}"),
        "--enable-metrics".into(),
        format!("--operator-api-serve-addr=127.0.0.1:{health_port}"),
    ]
    .into();
    if version == Version::V120 {
        // 1.16 knows none of these three (it refuses to start on an unknown flag).
        a.push("--enable-lb-ipam=false".into());
        a.push("--enable-gops=false".into());
        a.push(format!(
            "--shell-sock-path={}",
            work.join(format!("cilium-shell-{health_port}.sock"))
                .display()
        ));
    }
    a
}

/// Where and how one operator runs. Owned, so a supervisor can keep it to start the same
/// process again.
#[derive(Clone, Debug)]
pub struct Launch {
    pub version: Version,
    pub binary: PathBuf,
    pub kubeconfig: PathBuf,
    pub ec2_endpoint: String,
    pub cluster_name: String,
    pub metrics_port: u16,
    pub health_port: u16,
    /// Its shell socket goes here (1.20).
    pub work: PathBuf,
    /// More flags, after [`args`]'s (a later flag wins).
    pub extra: Vec<String>,
}

impl Launch {
    /// Every flag it is started with.
    pub fn all_args(&self) -> Vec<String> {
        let mut a = args(
            self.version,
            &self.kubeconfig,
            &self.cluster_name,
            self.metrics_port,
            self.health_port,
            &self.work,
        );
        a.extend(self.extra.iter().cloned());
        a
    }

    /// The command with its flags and environment; the caller sets stdio and spawns it.
    pub fn command(&self) -> Command {
        let endpoint = self.ec2_endpoint.trim_end_matches('/');
        let mut cmd = Command::new(&self.binary);
        cmd.args(self.all_args())
            .env("AWS_ENDPOINT_URL_EC2", endpoint)
            // ec2-sim serves the instance metadata on the same port (`wire::imds`).
            .env("AWS_EC2_METADATA_SERVICE_ENDPOINT", endpoint)
            .env("AWS_ACCESS_KEY_ID", ACCESS_KEY)
            .env("AWS_SECRET_ACCESS_KEY", "cilium-test")
            .env_remove("AWS_PROFILE");
        cmd
    }
}

/// Flags that set its EC2 rate limiter.
pub fn limit_args(qps: u32, burst: u32) -> Vec<String> {
    vec![
        format!("--limit-ipam-api-qps={qps}"),
        format!("--limit-ipam-api-burst={burst}"),
    ]
}

/// Its flags for a benchmark world: the rate limiter, and prefix delegation when the world
/// runs on /28 prefixes (an operator flag in Cilium, `--aws-enable-prefix-delegation`, in
/// `--help` of both binaries; without it Cilium assigns secondary IPs whatever the agents do).
pub fn world_args(qps: u32, burst: u32, prefix: bool) -> Vec<String> {
    let mut args = limit_args(qps, burst);
    if prefix {
        args.push("--aws-enable-prefix-delegation=true".into());
    }
    args
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_world_turns_on_its_prefix_delegation() {
        let secondary = world_args(4, 20, false);
        assert_eq!(secondary, limit_args(4, 20));
        let prefix = world_args(4, 20, true);
        assert!(prefix.contains(&"--aws-enable-prefix-delegation=true".to_string()));
        assert!(prefix.contains(&"--limit-ipam-api-qps=4".to_string()));
    }

    #[test]
    fn flags_differ_by_version() {
        let a = args(Version::V120, Path::new("/k"), "c", 1, 2, Path::new("/w"));
        assert!(a.contains(&"--nodes-gc-interval=0".to_string()));
        assert!(a.contains(&"--enable-gops=false".to_string()));
        let b = args(Version::V116, Path::new("/k"), "c", 1, 2, Path::new("/w"));
        assert!(!b.iter().any(|x| x.starts_with("--enable-gops")));
        assert!(!b.iter().any(|x| x.starts_with("--shell-sock-path")));
        assert!(!b.iter().any(|x| x.starts_with("--enable-lb-ipam")));
    }

    #[test]
    fn command_points_ec2_and_metadata_at_the_endpoint_and_extra_flags_come_last() {
        let extra = limit_args(20, 100);
        let l = Launch {
            version: Version::V120,
            binary: "/bin/cilium-operator-aws".into(),
            kubeconfig: "/k".into(),
            ec2_endpoint: "http://127.0.0.1:5000/".into(),
            cluster_name: "c".into(),
            metrics_port: 1,
            health_port: 2,
            work: "/w".into(),
            extra: extra.clone(),
        };
        let cmd = l.command();
        let env: Vec<(String, Option<String>)> = cmd
            .get_envs()
            .map(|(k, v)| {
                (
                    k.to_string_lossy().into_owned(),
                    v.map(|v| v.to_string_lossy().into_owned()),
                )
            })
            .collect();
        let get = |k: &str| {
            env.iter()
                .find(|(x, _)| x == k)
                .and_then(|(_, v)| v.clone())
        };
        assert_eq!(
            get("AWS_ENDPOINT_URL_EC2").as_deref(),
            Some("http://127.0.0.1:5000")
        );
        assert_eq!(
            get("AWS_EC2_METADATA_SERVICE_ENDPOINT").as_deref(),
            Some("http://127.0.0.1:5000")
        );
        assert_eq!(get("AWS_ACCESS_KEY_ID").as_deref(), Some(ACCESS_KEY));
        let args: Vec<String> = cmd
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        assert_eq!(&args[args.len() - 2..], &extra[..]);
        assert!(args.contains(&"--ipam=eni".to_string()));
    }
}
