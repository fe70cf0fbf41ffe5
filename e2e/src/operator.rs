//! Starting, stopping and killing the operator under test: local processes of the binary
//! (`ENI_OPERATOR_BIN`, run with the ServiceAccount's kubeconfig) or the in-cluster Deployment.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result, anyhow};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use serde_json::json;
use tokio::process::{Child, Command};

/// Runs a subcommand of the operator to its end within `secs`: its stdout, or an error with
/// its stderr.
async fn stdout_of(mut cmd: Command, what: &str, secs: u64) -> Result<Vec<u8>> {
    let out = tokio::time::timeout(Duration::from_secs(secs), cmd.output())
        .await
        .with_context(|| format!("{what} did not exit within {secs} s"))??;
    anyhow::ensure!(
        out.status.success(),
        "{what} exited with {}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(out.stdout)
}

/// A local operator's environment: the ServiceAccount's kubeconfig, and test credentials for
/// the emulator unless the caller's are set.
fn local_env(cmd: &mut Command, kubeconfig: Option<&PathBuf>) {
    if let Some(k) = kubeconfig {
        cmd.env("KUBECONFIG", k);
    }
    for (k, v) in [
        ("AWS_ACCESS_KEY_ID", "test"),
        ("AWS_SECRET_ACCESS_KEY", "test"),
    ] {
        if std::env::var_os(k).is_none() {
            cmd.env(k, v);
        }
    }
}

/// What a scenario needs from the operator.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OperatorOptions {
    pub prefix_delegation: bool,
    /// `Some(delay)`: `--aws-release-excess-ips --excess-ip-release-delay <delay>`.
    pub release_delay_secs: Option<u64>,
    /// The EC2 endpoint instead of the suite's (local mode: a fault proxy in front of it).
    pub ec2_endpoint: Option<String>,
    /// Flags appended last, local mode only (e.g. `--mode=shadow`, `--handover-selector`).
    pub extra_args: Vec<String>,
    /// The node and EC2 resync intervals instead of the suite's (e.g. production's 60 s).
    pub resync_secs: Option<u64>,
    /// Cilium's real operator runs beside it: no `--cilium-operator-absent`, so the guard
    /// fails closed on a Lease it cannot read, as in production.
    pub cilium_operator_present: bool,
}

/// Settings shared by every operator the suite starts.
#[derive(Clone, Debug)]
pub struct OperatorSettings {
    pub cluster_name: String,
    pub namespace: String,
    pub lease_name: String,
    pub ec2_endpoint: String,
    pub region: String,
    pub resync_secs: u64,
    pub gc_secs: u64,
    /// `suffix` → `5s`; anything else → `5` (the operator's duration syntax).
    pub duration_style: String,
    /// Extra arguments appended verbatim (`E2E_OPERATOR_ARGS`).
    pub extra_args: Vec<String>,
}

impl OperatorSettings {
    fn duration(&self, secs: u64) -> String {
        if self.duration_style == "suffix" {
            format!("{secs}s")
        } else {
            secs.to_string()
        }
    }

    /// Command-line flags for one operator. The flags that vary per scenario come last so that
    /// the in-cluster mode can strip and re-add them.
    pub fn args(
        &self,
        identity: Option<&str>,
        ports: Option<(u16, u16)>,
        opts: &OperatorOptions,
    ) -> Vec<String> {
        let resync = opts.resync_secs.unwrap_or(self.resync_secs);
        let mut a: Vec<String> = vec![
            "--cluster-name".into(),
            self.cluster_name.clone(),
            "--ec2-api-endpoint".into(),
            opts.ec2_endpoint
                .clone()
                .unwrap_or_else(|| self.ec2_endpoint.clone()),
            "--aws-region".into(),
            self.region.clone(),
            "--namespace".into(),
            self.namespace.clone(),
            "--leader-election-lease-name".into(),
            self.lease_name.clone(),
            "--node-resync-interval".into(),
            self.duration(resync),
            "--ec2-resync-interval".into(),
            self.duration(resync),
            // The refresh after our own changes may not be spaced wider than the full resync.
            "--ec2-refresh-min-spacing".into(),
            self.duration(resync.min(2)),
            "--eni-gc-interval".into(),
            self.duration(self.gc_secs),
        ];
        if !opts.cilium_operator_present {
            // No Cilium operator runs in the e2e cluster (its other allocator writes as one
            // but holds no Lease): without this the guard fails closed on the missing Lease.
            a.push("--cilium-operator-absent".into());
        }
        if let Some(id) = identity {
            a.extend(["--identity".into(), id.into()]);
        }
        if let Some((metrics, health)) = ports {
            a.extend(["--metrics-addr".into(), format!("127.0.0.1:{metrics}")]);
            a.extend(["--health-addr".into(), format!("127.0.0.1:{health}")]);
            // The debug pages (`status`, `/debug/shadow`) on the metrics listener: several
            // operators share this host's loopback.
            a.extend(["--debug-addr".into(), format!("127.0.0.1:{metrics}")]);
        }
        a.extend(self.extra_args.iter().cloned());
        a.extend(scenario_flags(opts));
        a.extend(opts.extra_args.iter().cloned());
        a
    }
}

/// The per-scenario flags.
pub fn scenario_flags(opts: &OperatorOptions) -> Vec<String> {
    let mut a = Vec::new();
    if opts.prefix_delegation {
        a.push("--aws-enable-prefix-delegation".to_string());
    }
    if let Some(d) = opts.release_delay_secs {
        a.push("--aws-release-excess-ips".to_string());
        a.push("--excess-ip-release-delay".to_string());
        a.push(d.to_string());
    }
    a
}

/// Removes the per-scenario flags from an argument list (in-cluster mode edits the Deployment).
pub fn strip_scenario_flags(args: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--aws-enable-prefix-delegation" | "--aws-release-excess-ips" => {}
            "--excess-ip-release-delay" => {
                it.next();
            }
            s if s.starts_with("--excess-ip-release-delay=")
                || s.starts_with("--aws-enable-prefix-delegation=")
                || s.starts_with("--aws-release-excess-ips=") => {}
            _ => out.push(a.clone()),
        }
    }
    out
}

/// Where the operators run.
pub enum Mode {
    Local {
        bin: PathBuf,
        kubeconfig: Option<PathBuf>,
        log_dir: PathBuf,
    },
    InCluster {
        deployment: String,
    },
}

struct LocalOperator {
    identity: String,
    child: Child,
    log: PathBuf,
    /// Its --metrics-addr port (127.0.0.1).
    metrics_port: u16,
}

/// The operators of the current scenario.
pub struct Operators {
    pub settings: OperatorSettings,
    mode: Mode,
    kube: kube::Client,
    // A std Mutex: never held across an await.
    local: std::sync::Mutex<Vec<LocalOperator>>,
    /// Logs of the operators started since the last `reset_logs`.
    logs: Vec<PathBuf>,
    started: u32,
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

impl Operators {
    pub fn new(settings: OperatorSettings, mode: Mode, kube: kube::Client) -> Self {
        Self {
            settings,
            mode,
            kube,
            local: std::sync::Mutex::new(Vec::new()),
            logs: Vec::new(),
            started: 0,
        }
    }

    pub fn is_local(&self) -> bool {
        matches!(self.mode, Mode::Local { .. })
    }

    /// Starts `replicas` operators with `opts`.
    pub async fn start(&mut self, opts: &OperatorOptions, replicas: u32) -> Result<()> {
        match &self.mode {
            Mode::Local {
                bin,
                kubeconfig,
                log_dir,
            } => {
                let (bin, kubeconfig, log_dir) = (bin.clone(), kubeconfig.clone(), log_dir.clone());
                for _ in 0..replicas {
                    self.started += 1;
                    // Fixed width, so that no identity contains another.
                    let identity = format!("e2e-operator-{:04}", self.started);
                    let metrics_port = free_port()?;
                    let args = self.settings.args(
                        Some(&identity),
                        Some((metrics_port, free_port()?)),
                        opts,
                    );
                    std::fs::create_dir_all(&log_dir)?;
                    let log = log_dir.join(format!("{identity}.log"));
                    let out = std::fs::File::create(&log)?;
                    let mut cmd = Command::new(&bin);
                    cmd.args(&args)
                        .stdin(Stdio::null())
                        .stdout(out.try_clone()?)
                        .stderr(out)
                        .kill_on_drop(true);
                    local_env(&mut cmd, kubeconfig.as_ref());
                    if std::env::var_os("RUST_LOG").is_none() {
                        cmd.env("RUST_LOG", "info");
                    }
                    let child = cmd
                        .spawn()
                        .with_context(|| format!("starting {}", bin.display()))?;
                    tracing::info!(%identity, log = %log.display(), "operator started: {}", args.join(" "));
                    self.logs.push(log.clone());
                    self.local.lock().expect("poisoned").push(LocalOperator {
                        identity,
                        child,
                        log,
                        metrics_port,
                    });
                }
                Ok(())
            }
            Mode::InCluster { deployment } => {
                self.scale_deployment(deployment.clone(), opts, replicas)
                    .await
            }
        }
    }

    async fn scale_deployment(
        &self,
        name: String,
        opts: &OperatorOptions,
        replicas: u32,
    ) -> Result<()> {
        let api: Api<Deployment> = Api::namespaced(self.kube.clone(), &self.settings.namespace);
        let d = api
            .get(&name)
            .await
            .with_context(|| format!("Deployment {name}"))?;
        let container = d
            .spec
            .as_ref()
            .and_then(|s| s.template.spec.as_ref())
            .and_then(|s| s.containers.first())
            .ok_or_else(|| anyhow!("Deployment {name} has no container"))?;
        let mut args = strip_scenario_flags(container.args.as_deref().unwrap_or_default());
        args.extend(scenario_flags(opts));
        let patch = json!({ "spec": { "replicas": replicas, "template": { "spec": {
            "containers": [{ "name": container.name, "args": args }] } } } });
        api.patch(&name, &PatchParams::default(), &Patch::Strategic(&patch))
            .await?;
        wait_rollout(&api, &name, replicas).await
    }

    /// Identities of the running operators (local mode) or pod names (in-cluster).
    pub async fn running(&self) -> Result<Vec<String>> {
        match &self.mode {
            Mode::Local { .. } => {
                let mut alive = Vec::new();
                for op in self.local.lock().expect("poisoned").iter_mut() {
                    if op.child.try_wait()?.is_none() {
                        alive.push(op.identity.clone());
                    }
                }
                Ok(alive)
            }
            Mode::InCluster { deployment } => {
                let deployments: Api<Deployment> =
                    Api::namespaced(self.kube.clone(), &self.settings.namespace);
                let d = deployments.get(deployment).await?;
                let selector: Vec<String> = d
                    .spec
                    .and_then(|s| s.selector.match_labels)
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect();
                let pods: Api<Pod> = Api::namespaced(self.kube.clone(), &self.settings.namespace);
                let list = pods
                    .list(&ListParams::default().labels(&selector.join(",")))
                    .await?;
                Ok(list
                    .items
                    .into_iter()
                    .filter(|p| p.metadata.deletion_timestamp.is_none())
                    .filter_map(|p| p.metadata.name)
                    .collect())
            }
        }
    }

    /// The current holder of the leader Lease.
    pub async fn leader(&self) -> Result<Option<String>> {
        let api: Api<Lease> = Api::namespaced(self.kube.clone(), &self.settings.namespace);
        Ok(api
            .get_opt(&self.settings.lease_name)
            .await?
            .and_then(|l| l.spec)
            .and_then(|s| s.holder_identity)
            .filter(|h| !h.is_empty()))
    }

    /// Kills the operator whose identity is `identity` without letting it clean up (SIGKILL, or
    /// deleting its pod with no grace period).
    pub async fn kill(&mut self, identity: &str) -> Result<()> {
        match &self.mode {
            Mode::Local { .. } => {
                let mut local = self.local.lock().expect("poisoned");
                let op = local
                    .iter_mut()
                    .find(|o| identity.contains(o.identity.as_str()))
                    .ok_or_else(|| anyhow!("no local operator {identity}"))?;
                op.child.start_kill()?;
                Ok(())
            }
            Mode::InCluster { .. } => {
                let pods: Api<Pod> = Api::namespaced(self.kube.clone(), &self.settings.namespace);
                let names = self.running().await?;
                let pod = names
                    .iter()
                    .find(|p| identity.contains(p.as_str()))
                    .ok_or_else(|| anyhow!("no operator pod for identity {identity}"))?;
                pods.delete(
                    pod,
                    &DeleteParams {
                        grace_period_seconds: Some(0),
                        ..Default::default()
                    },
                )
                .await?;
                Ok(())
            }
        }
    }

    /// Stops every operator gracefully (SIGTERM, then SIGKILL after 20 s).
    pub async fn stop_all(&mut self) -> Result<()> {
        match &self.mode {
            Mode::Local { .. } => {
                let ops = std::mem::take(&mut *self.local.lock().expect("poisoned"));
                for mut op in ops {
                    if let Some(pid) = op.child.id() {
                        // SIGTERM lets the operator release its lease.
                        let _ = std::process::Command::new("kill")
                            .args(["-TERM", &pid.to_string()])
                            .status();
                    }
                    if tokio::time::timeout(Duration::from_secs(20), op.child.wait())
                        .await
                        .is_err()
                    {
                        let _ = op.child.kill().await;
                    }
                }
                Ok(())
            }
            Mode::InCluster { deployment } => {
                let api: Api<Deployment> =
                    Api::namespaced(self.kube.clone(), &self.settings.namespace);
                let patch = json!({ "spec": { "replicas": 0 } });
                api.patch(deployment, &PatchParams::default(), &Patch::Merge(&patch))
                    .await?;
                wait_rollout(&api, deployment, 0).await
            }
        }
    }

    /// `eni-operator plan --output json` with the operators' flags (local mode): its stdout.
    pub async fn run_plan(&self, opts: &OperatorOptions) -> Result<String> {
        let Mode::Local {
            bin, kubeconfig, ..
        } = &self.mode
        else {
            return Err(anyhow!("plan runs the local binary: local mode only"));
        };
        let mut cmd = Command::new(bin);
        cmd.arg("plan")
            .args(self.settings.args(None, None, opts))
            .args(["--output", "json"])
            .stdin(Stdio::null())
            .kill_on_drop(true);
        local_env(&mut cmd, kubeconfig.as_ref());
        let out = stdout_of(cmd, "plan", 120).await?;
        Ok(String::from_utf8(out)?)
    }

    /// `eni-operator status --address <address> --output json` (local mode): the page it read.
    pub async fn run_status(
        &self,
        address: &str,
    ) -> Result<eni_operator::reconcile::status::page::Page> {
        let Mode::Local { bin, .. } = &self.mode else {
            return Err(anyhow!("status runs the local binary: local mode only"));
        };
        let mut cmd = Command::new(bin);
        cmd.args(["status", "--address", address, "--output", "json"])
            .stdin(Stdio::null())
            .kill_on_drop(true);
        let out = stdout_of(cmd, "status", 30).await?;
        Ok(serde_json::from_slice(&out)?)
    }

    /// `127.0.0.1:<port>` of each running local operator's metrics listener (empty in-cluster).
    pub fn metrics_addrs(&self) -> Vec<String> {
        self.local
            .lock()
            .expect("poisoned")
            .iter()
            .map(|o| format!("127.0.0.1:{}", o.metrics_port))
            .collect()
    }

    /// Forgets the logs of earlier scenarios.
    pub fn reset_logs(&mut self) {
        self.logs.clear();
    }

    /// Set when every local operator has exited on its own: waiting longer is pointless.
    pub fn exited_note(&self) -> Option<String> {
        let mut local = self.local.lock().expect("poisoned");
        if local.is_empty()
            || local
                .iter_mut()
                .any(|o| matches!(o.child.try_wait(), Ok(None)))
        {
            return None;
        }
        let tail: Vec<String> = local
            .iter()
            .filter_map(|o| std::fs::read_to_string(&o.log).ok())
            .flat_map(|s| {
                s.lines()
                    .rev()
                    .take(5)
                    .map(String::from)
                    .collect::<Vec<_>>()
            })
            .collect();
        Some(format!(
            "every operator process exited; last log lines: {}",
            tail.join(" | ")
        ))
    }

    /// Lines of this scenario's local operator logs containing `needle` (empty in-cluster).
    pub fn log_lines(&self, needle: &str) -> Vec<String> {
        let needle = needle.to_lowercase();
        self.logs
            .iter()
            .filter_map(|l| std::fs::read_to_string(l).ok())
            .flat_map(|s| s.lines().map(String::from).collect::<Vec<_>>())
            .filter(|l| l.to_lowercase().contains(&needle))
            .collect()
    }
}

async fn wait_rollout(api: &Api<Deployment>, name: &str, replicas: u32) -> Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(180);
    loop {
        let d = api.get(name).await?;
        let gen_ok = d.status.as_ref().and_then(|s| s.observed_generation) >= d.metadata.generation;
        let s = d.status.unwrap_or_default();
        let want = i32::try_from(replicas)?;
        if gen_ok
            && s.replicas.unwrap_or(0) == want
            && s.updated_replicas.unwrap_or(0) == want
            // Standbys may report unready until they lead: one ready replica is enough.
            && s.ready_replicas.unwrap_or(0) >= want.min(1)
        {
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            return Err(anyhow!(
                "Deployment {name} did not reach {replicas} ready replicas"
            ));
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> OperatorSettings {
        OperatorSettings {
            cluster_name: "e2e".into(),
            namespace: "eni-operator".into(),
            lease_name: "eni-operator".into(),
            ec2_endpoint: "http://127.0.0.1:5000".into(),
            region: "us-east-1".into(),
            resync_secs: 5,
            gc_secs: 10,
            duration_style: "suffix".into(),
            extra_args: vec!["--x".into()],
        }
    }

    #[test]
    fn the_operator_accepts_the_command_lines_the_suite_gives_it() {
        // Plain seconds (`E2E_DURATION_STYLE=seconds`) are for operators that take them; ours
        // takes Go's grammar only.
        for style in ["suffix"] {
            for opts in [
                OperatorOptions::default(),
                OperatorOptions {
                    prefix_delegation: true,
                    release_delay_secs: Some(3),
                    ..Default::default()
                },
            ] {
                let s = OperatorSettings {
                    duration_style: style.into(),
                    extra_args: vec![],
                    ..settings()
                };
                let args = s.args(Some("op-1"), Some((9000, 9001)), &opts);
                let parsed = parsed(&args);
                assert_eq!(
                    parsed.ipam.aws_enable_prefix_delegation,
                    opts.prefix_delegation
                );
            }
        }
    }

    /// The operator's settings from `args`, parsed and validated as at its start.
    fn parsed(args: &[String]) -> eni_operator::config::Settings {
        use clap::Parser;
        let parsed = eni_operator::config::Settings::try_parse_from(
            std::iter::once("eni-operator".to_string()).chain(args.iter().cloned()),
        )
        .unwrap_or_else(|e| panic!("{args:?}: {e}"));
        parsed
            .validate()
            .unwrap_or_else(|e| panic!("{args:?}: {e}"));
        parsed
    }

    #[test]
    fn the_operator_accepts_the_kind_overlays_command_line() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/overlay/deployment-patch.yaml");
        let ops: Vec<serde_json::Value> =
            serde_saphyr::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let args: Vec<String> = ops
            .iter()
            .find(|op| op["path"].as_str().is_some_and(|p| p.ends_with("/args")))
            .expect("the overlay sets the container's args")["value"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| {
                a.as_str()
                    .unwrap()
                    .replace("@EC2_ENDPOINT@", "http://10.0.0.1:4566")
                    .replace("$(POD_NAME)", "eni-operator-abc")
            })
            .collect();
        let parsed = parsed(&args);
        assert_eq!(parsed.ipam.cluster_name.as_deref(), Some("e2e"));
    }

    #[test]
    fn args_carry_identity_ports_and_scenario_flags() {
        let opts = OperatorOptions {
            prefix_delegation: true,
            release_delay_secs: Some(3),
            ..Default::default()
        };
        let a = settings().args(Some("op-1"), Some((9000, 9001)), &opts);
        let joined = a.join(" ");
        assert!(joined.contains("--cluster-name e2e"));
        assert!(joined.contains("--node-resync-interval 5s"));
        assert!(joined.contains("--ec2-refresh-min-spacing 2s"));
        assert!(joined.contains("--eni-gc-interval 10s"));
        assert!(joined.contains("--identity op-1"));
        assert!(joined.contains("--metrics-addr 127.0.0.1:9000"));
        assert!(joined.contains("--debug-addr 127.0.0.1:9000"));
        assert!(joined.ends_with("--x --aws-enable-prefix-delegation --aws-release-excess-ips --excess-ip-release-delay 3"));
        assert!(joined.contains("--cilium-operator-absent"));
        let beside = OperatorOptions {
            cilium_operator_present: true,
            ..Default::default()
        };
        assert!(
            !settings()
                .args(None, None, &beside)
                .iter()
                .any(|x| x == "--cilium-operator-absent"),
            "beside Cilium's operator the guard must fail closed"
        );
        let mut s = settings();
        s.duration_style = "seconds".into();
        assert!(
            s.args(None, None, &OperatorOptions::default())
                .join(" ")
                .contains("--node-resync-interval 5 ")
        );
    }

    #[test]
    fn scenario_flags_round_trip_through_strip() {
        let base: Vec<String> = [
            "--cluster-name",
            "e2e",
            "--excess-ip-release-delay=9",
            "--aws-release-excess-ips",
        ]
        .map(String::from)
        .to_vec();
        let stripped = strip_scenario_flags(&base);
        assert_eq!(
            stripped,
            vec!["--cluster-name".to_string(), "e2e".to_string()]
        );
        let mut with = stripped.clone();
        with.extend(scenario_flags(&OperatorOptions {
            prefix_delegation: false,
            release_delay_secs: Some(4),
            ..Default::default()
        }));
        assert_eq!(strip_scenario_flags(&with), stripped);
    }
}

#[cfg(test)]
mod process_tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// A scratch directory named for `test` holding a fake operator that prints `started` and
    /// its arguments, then runs `body`; and local operators of that binary.
    fn fake_operators(test: &str, body: &str) -> (PathBuf, Operators) {
        let dir = std::env::temp_dir().join(format!("{test}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let bin = dir.join("fake-operator");
        std::fs::write(&bin, format!("#!/bin/sh\necho \"started $*\"\n{body}\n")).unwrap();
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
        let ops = operators(bin, &dir);
        (dir, ops)
    }

    fn operators(bin: PathBuf, dir: &std::path::Path) -> Operators {
        let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
        let kube = kube::Client::try_from(config).unwrap();
        let settings = OperatorSettings {
            cluster_name: "e2e".into(),
            namespace: "ns".into(),
            lease_name: "lease".into(),
            ec2_endpoint: "http://127.0.0.1:1".into(),
            region: "us-east-1".into(),
            resync_secs: 5,
            gc_secs: 10,
            duration_style: "suffix".into(),
            extra_args: vec![],
        };
        let mode = Mode::Local {
            bin,
            kubeconfig: Some(dir.join("kc")),
            log_dir: dir.join("logs"),
        };
        Operators::new(settings, mode, kube)
    }

    async fn wait_running(ops: &Operators, n: usize) -> Vec<String> {
        for _ in 0..100 {
            let r = ops.running().await.unwrap();
            if r.len() == n {
                return r;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("never {n} running");
    }

    #[tokio::test]
    async fn local_operators_start_get_killed_and_stop() {
        let (dir, mut ops) =
            fake_operators("e2e-ops", "echo \"KUBECONFIG=$KUBECONFIG\"\nexec sleep 30");
        let opts = OperatorOptions {
            prefix_delegation: true,
            release_delay_secs: None,
            ..Default::default()
        };
        ops.start(&opts, 2).await.unwrap();
        let ids = wait_running(&ops, 2).await;
        assert_eq!(
            ids,
            vec![
                "e2e-operator-0001".to_string(),
                "e2e-operator-0002".to_string()
            ]
        );
        // Both have written their first line before one is killed.
        for _ in 0..100 {
            if ops.log_lines("started").len() == 2 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        ops.kill("e2e-operator-0001").await.unwrap();
        assert_eq!(
            wait_running(&ops, 1).await,
            vec!["e2e-operator-0002".to_string()]
        );
        assert!(ops.exited_note().is_none(), "one is still running");
        assert!(ops.kill("nobody").await.is_err());
        let started = ops.log_lines("started");
        assert_eq!(started.len(), 2, "{started:?}");
        assert!(started[0].contains("--identity e2e-operator-0001"));
        assert!(started[0].contains("--aws-enable-prefix-delegation"));
        assert!(
            !ops.log_lines(&format!("KUBECONFIG={}", dir.join("kc").display()))
                .is_empty()
        );
        ops.stop_all().await.unwrap();
        assert!(ops.running().await.unwrap().is_empty());
        ops.reset_logs();
        assert!(ops.log_lines("started").is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn exited_note_reports_operators_that_died() {
        let (dir, mut ops) =
            fake_operators("e2e-ops-exit", "echo 'error: unexpected argument'\nexit 2");
        assert!(ops.exited_note().is_none(), "nothing started yet");
        ops.start(&OperatorOptions::default(), 1).await.unwrap();
        let mut note = None;
        for _ in 0..100 {
            note = ops.exited_note();
            if note.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let note = note.expect("the fake operator exits at once");
        assert!(note.contains("unexpected argument"), "{note}");
        ops.stop_all().await.unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
