//! Installing with Helm (issue 31): `helm-install`, on the suite's API server.
//!
//! The chart (`charts/eni-operator`) is rendered with the defaults, with every value
//! (`ci/every-value.yaml`) and in shadow mode, and each rendering passes `kubectl apply
//! --dry-run=server`. Then `helm install`, and the operator started as the installed Deployment
//! starts it: its command (the image's binary, here the local build) and args, its env and the
//! ConfigMap it reads, the ServiceAccount's own token (`kubectl create token`). It serves a node.
//! `helm upgrade` with a changed value changes the pods' checksum/config annotation, `helm
//! rollback` restores it. The operator stops (as `helm uninstall` deletes its pods), `helm
//! uninstall` leaves nothing labelled with the release, a deleted CiliumNode hangs on our
//! finalizer, and `eni-operator uninstall` (which refuses while an operator holds the Lease)
//! lets it go and deletes the Lease.
//!
//! Needs `HELM` (the path of a helm binary) and kubectl in PATH; run by `make e2e-local`, which
//! has both when `.ci/run` sets HELM. Without HELM the suite leaves it out and says NOT RUN.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail, ensure};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Container};
use kube::api::{Api, DeleteParams};
use testkit::agent::Generation;
use tokio::process::Command;

use super::{Suite, eventually, ours};
use crate::checks::NodeVariant;

const RELEASE: &str = "eni-operator-helm";
const NAMESPACE: &str = "eni-operator-helm";
const LEASE: &str = "eni-operator-helm";
/// The image's binary (Containerfile): the Deployment's command.
const IMAGE_BINARY: &str = "/usr/local/bin/eni-operator";
/// Namespaces `ci/every-value.yaml` puts objects in (Cilium's, Grafana's).
const EVERY_VALUE_NAMESPACES: &[&str] = &["cilium", "monitoring"];

/// The Prometheus Operator's two CRDs, reduced to what the API server needs to accept the chart's
/// ServiceMonitor and PrometheusRule (the dry run of every value).
fn monitoring_crds() -> String {
    ["ServiceMonitor", "PrometheusRule"]
        .map(|kind| {
            let singular = kind.to_lowercase();
            format!(
                r#"apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {{name: {singular}s.monitoring.coreos.com}}
spec:
  group: monitoring.coreos.com
  scope: Namespaced
  names: {{kind: {kind}, plural: {singular}s, singular: {singular}, listKind: {kind}List}}
  versions:
    - name: v1
      served: true
      storage: true
      schema: {{openAPIV3Schema: {{type: object, x-kubernetes-preserve-unknown-fields: true}}}}
"#
            )
        })
        .join("---\n")
}

fn chart() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/eni-operator")
}

fn work_dir() -> PathBuf {
    std::env::var_os("E2E_WORK_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir)
        .join("helm")
}

/// Runs a command; its stdout, or an error with both outputs.
async fn output(program: &Path, args: &[&str], stdin: Option<&[u8]>) -> Result<String> {
    let mut cmd = Command::new(program);
    cmd.args(args)
        .stdin(testkit::piped_if(stdin.is_some()))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = cmd
        .spawn()
        .with_context(|| format!("starting {}", program.display()))?;
    if let Some(input) = stdin {
        use tokio::io::AsyncWriteExt;
        let mut pipe = child.stdin.take().expect("piped");
        pipe.write_all(input).await?;
        drop(pipe);
    }
    let out = child.wait_with_output().await?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    ensure!(
        out.status.success(),
        "{} {} failed ({}):\n{stdout}{}",
        program.display(),
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(stdout)
}

/// N distinct free ports (all bound at once, so no two are the same).
fn free_ports<const N: usize>() -> Result<[u16; N]> {
    let listeners = (0..N)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0"))
        .collect::<std::io::Result<Vec<_>>>()?;
    let mut ports = [0; N];
    for (port, l) in ports.iter_mut().zip(&listeners) {
        *port = l.local_addr()?.port();
    }
    Ok(ports)
}

/// The environment the kubelet would give the container: the ConfigMap (envFrom), then `env`
/// (values, and the pod's name and namespace for fieldRefs).
fn container_env(
    c: &Container,
    config_maps: &BTreeMap<String, ConfigMap>,
    pod: &str,
) -> Result<Vec<(String, String)>> {
    let mut env = Vec::new();
    for from in c.env_from.iter().flatten() {
        let name = &from
            .config_map_ref
            .as_ref()
            .context("envFrom: a ConfigMap only")?
            .name;
        let cm = config_maps
            .get(name)
            .with_context(|| format!("ConfigMap {name}"))?;
        for (k, v) in cm.data.iter().flatten() {
            env.push((k.clone(), v.clone()));
        }
    }
    for e in c.env.iter().flatten() {
        let value = match (&e.value, &e.value_from) {
            (Some(v), _) => v.clone(),
            (None, Some(from)) => match from.field_ref.as_ref().map(|f| f.field_path.as_str()) {
                Some("metadata.name") => pod.to_string(),
                Some("metadata.namespace") => NAMESPACE.to_string(),
                other => bail!("env {}: unsupported source {other:?}", e.name),
            },
            (None, None) => String::new(),
        };
        env.push((e.name.clone(), value));
    }
    Ok(env)
}

impl Suite {
    pub(super) async fn helm_install(&mut self) -> Result<()> {
        let helm = PathBuf::from(std::env::var_os("HELM").context("HELM is not set")?);
        let kubectl = PathBuf::from("kubectl");
        let bin = PathBuf::from(
            std::env::var_os("ENI_OPERATOR_BIN").context("ENI_OPERATOR_BIN is not set")?,
        );
        let dir = work_dir();
        std::fs::create_dir_all(&dir)?;
        let chart = chart();
        let chart_arg = chart.to_str().context("chart path")?;

        // Namespaces and CRDs the renderings need (created, then dropped at the end).
        for ns in std::iter::once(&NAMESPACE).chain(EVERY_VALUE_NAMESPACES) {
            let yaml = format!("apiVersion: v1\nkind: Namespace\nmetadata: {{name: {ns}}}\n");
            output(&kubectl, &["apply", "-f", "-"], Some(yaml.as_bytes())).await?;
        }
        let crds = monitoring_crds();
        output(&kubectl, &["apply", "-f", "-"], Some(crds.as_bytes())).await?;
        output(
            &kubectl,
            &[
                "wait",
                "--for=condition=established",
                "crd/servicemonitors.monitoring.coreos.com",
                "crd/prometheusrules.monitoring.coreos.com",
                "--timeout=60s",
            ],
            None,
        )
        .await?;
        let result = self
            .helm_steps(&helm, &kubectl, &bin, &dir, chart_arg)
            .await;

        // Clean-up whatever happened (the release may be half-installed after a failure).
        let _ = output(&helm, &["uninstall", RELEASE, "-n", NAMESPACE], None).await;
        for ns in std::iter::once(&NAMESPACE).chain(EVERY_VALUE_NAMESPACES) {
            let _ = output(&kubectl, &["delete", "namespace", ns, "--wait=false"], None).await;
        }
        let _ = output(
            &kubectl,
            &[
                "delete",
                "crd",
                "servicemonitors.monitoring.coreos.com",
                "prometheusrules.monitoring.coreos.com",
                "--wait=false",
            ],
            None,
        )
        .await;
        result
    }

    async fn helm_steps(
        &mut self,
        helm: &Path,
        kubectl: &Path,
        bin: &Path,
        dir: &Path,
        chart: &str,
    ) -> Result<()> {
        // 1. Every rendering passes the API server's validation (server-side dry run).
        let every = format!("{chart}/ci/every-value.yaml");
        for (what, extra) in [
            ("defaults", vec![]),
            ("every value", vec!["-f", every.as_str()]),
            ("shadow", vec!["--set", "mode=shadow"]),
        ] {
            let mut args = vec!["template", RELEASE, chart, "-n", NAMESPACE];
            args.extend(extra);
            let rendered = output(helm, &args, None).await?;
            let applied = output(
                kubectl,
                &["apply", "--dry-run=server", "-o", "name", "-f", "-"],
                Some(rendered.as_bytes()),
            )
            .await
            .with_context(|| format!("the chart with {what}"))?;
            tracing::info!(
                "helm template ({what}) | kubectl apply --dry-run=server: {} objects",
                applied.lines().count()
            );
        }

        // 2. helm install, with what this test's EC2 endpoint and timings need.
        // Every listener on a free port: the other e2e runs share this host's loopback.
        let [metrics, health, debug] = free_ports()?;
        // Its own cluster name: the ENIs this scenario leaves attached (uninstall does not
        // release them) are never counted by the next scenarios' checks.
        let cluster = &self.cfg.cluster_name;
        let values = format!(
            r#"clusterName: {cluster}-helm
region: {region}
leaderElection: {{leaseName: {LEASE}}}
ports: {{metrics: {metrics}, health: {health}, debug: {debug}}}
logFormat: text
# No Cilium operator in the test cluster: the handover guard would otherwise fail closed.
ciliumOperatorAbsent: true
eni:
  ec2APIEndpoint: "{endpoint}"
extraArgs:
  - --node-resync-interval=5s
  - --ec2-resync-interval=5s
  - --ec2-refresh-min-spacing=2s
extraEnv:
  - {{name: AWS_ACCESS_KEY_ID, value: test}}
  - {{name: AWS_SECRET_ACCESS_KEY, value: test}}
  - {{name: RUST_LOG, value: info}}
"#,
            region = self.ops.settings.region,
            endpoint = self.ops.settings.ec2_endpoint,
        );
        let values_file = dir.join("values.yaml");
        std::fs::write(&values_file, values)?;
        let values_arg = values_file.to_str().context("values path")?;
        output(
            helm,
            &[
                "install",
                RELEASE,
                chart,
                "-n",
                NAMESPACE,
                "--create-namespace",
                "-f",
                values_arg,
            ],
            None,
        )
        .await?;

        // 3. The operator as the installed Deployment starts it.
        let deployments: Api<Deployment> = Api::namespaced(self.kube.clone(), NAMESPACE);
        let deploy = deployments.get(RELEASE).await.context("the Deployment")?;
        let checksum = |d: &Deployment| -> Option<String> {
            d.spec
                .as_ref()?
                .template
                .metadata
                .as_ref()?
                .annotations
                .as_ref()?
                .get("checksum/config")
                .cloned()
        };
        let installed_checksum = checksum(&deploy).context("no checksum/config annotation")?;
        let pod = deploy
            .spec
            .as_ref()
            .and_then(|s| s.template.spec.clone())
            .context("pod")?;
        ensure!(
            pod.host_network == Some(true),
            "the active operator runs host-networked"
        );
        let c = pod.containers.first().context("a container")?;
        ensure!(
            c.command.as_deref() == Some(&[IMAGE_BINARY.to_string()][..]),
            "command {:?}",
            c.command
        );
        let config_maps: BTreeMap<String, ConfigMap> =
            Api::<ConfigMap>::namespaced(self.kube.clone(), NAMESPACE)
                .list(&Default::default())
                .await?
                .items
                .into_iter()
                .filter_map(|cm| Some((cm.metadata.name.clone()?, cm)))
                .collect();
        let env = container_env(c, &config_maps, "eni-operator-helm-pod-1")?;
        let sa = pod
            .service_account_name
            .clone()
            .context("serviceAccountName")?;
        let kubeconfig = self.service_account_kubeconfig(kubectl, &sa, dir).await?;
        let log = dir.join("operator.log");
        let out = std::fs::File::create(&log)?;
        let mut child = Command::new(bin)
            .args(c.args.iter().flatten())
            .env_clear()
            .envs(env)
            .env("KUBECONFIG", &kubeconfig)
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .kill_on_drop(true)
            .spawn()
            .context("starting the operator")?;
        tracing::info!(log = %log.display(), "operator started as the chart's Deployment");

        let served = async {
            // The instance carries the release's cluster tag, as EKS tags its nodes: the
            // operator touches no instance of another cluster (issue 29 item 1).
            let suite_cluster = std::mem::replace(
                &mut self.world.cluster_name,
                format!("{}-helm", self.cfg.cluster_name),
            );
            let idx = self
                .add_node(
                    "m5.large",
                    0,
                    Some(Generation::Classic),
                    5,
                    NodeVariant::default(),
                )
                .await;
            self.world.cluster_name = suite_cluster;
            let idx = idx?;
            self.wait_served(&[idx], self.cfg.timeout).await?;
            let cn = self.cn(idx).await?;
            ensure!(ours(&cn), "served, but no finalizer");
            Ok::<_, anyhow::Error>(idx)
        }
        .await;
        let idx = match served {
            Ok(i) => i,
            Err(e) => {
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(30).collect();
                bail!(
                    "{e:#}\noperator log (last lines, newest first):\n{}",
                    tail.join("\n")
                );
            }
        };
        // The leader wrote the chart's Lease.
        let leases: Api<Lease> = Api::namespaced(self.kube.clone(), NAMESPACE);
        ensure!(
            leases.get_opt(LEASE).await?.is_some(),
            "no Lease {NAMESPACE}/{LEASE}"
        );

        // 4. An operator still holds the Lease: `eni-operator uninstall` refuses, touching nothing.
        let short_lease = [
            "uninstall",
            "--namespace",
            NAMESPACE,
            "--leader-election-lease-name",
            LEASE,
            "--leader-election-lease-duration",
            "3s",
            "--leader-election-renew-deadline",
            "2s",
            "--leader-election-retry-period",
            "1s",
        ];
        let refused = output(bin, &short_lease, None).await;
        let note = format!(
            "{:#}",
            refused
                .as_ref()
                .err()
                .context("uninstall ran beside a running operator")?
        );
        ensure!(note.contains("still running"), "{note}");
        ensure!(
            self.has_finalizer(idx).await?,
            "the refused uninstall removed the finalizer"
        );

        // 5. helm upgrade with a changed value rolls the pods (new checksum); rollback restores.
        let upgrade = [
            "upgrade",
            RELEASE,
            chart,
            "-n",
            NAMESPACE,
            "-f",
            values_arg,
            "--set",
            "eni.gcTags.e2e=upgraded",
        ];
        output(helm, &upgrade, None).await?;
        let upgraded = deployments.get(RELEASE).await?;
        let upgraded_checksum = checksum(&upgraded).context("checksum after the upgrade")?;
        ensure!(
            upgraded_checksum != installed_checksum,
            "helm upgrade changed the ConfigMap but not the pods' checksum"
        );
        let cm: Api<ConfigMap> = Api::namespaced(self.kube.clone(), NAMESPACE);
        let data = cm.get(RELEASE).await?.data.unwrap_or_default();
        ensure!(
            data.get("ENI_OPERATOR_ENI_GC_TAGS").map(String::as_str) == Some("e2e=upgraded"),
            "{data:?}"
        );
        output(helm, &["rollback", RELEASE, "1", "-n", NAMESPACE], None).await?;
        let rolled = deployments.get(RELEASE).await?;
        ensure!(
            checksum(&rolled).as_deref() == Some(installed_checksum.as_str()),
            "rollback did not restore the checksum"
        );
        let data = cm.get(RELEASE).await?.data.unwrap_or_default();
        ensure!(
            !data.contains_key("ENI_OPERATOR_ENI_GC_TAGS"),
            "rollback kept the upgraded config: {data:?}"
        );

        // 6. helm uninstall (its pods go: the operator stops), and nothing of the release is left.
        child.kill().await.ok();
        output(
            helm,
            &["uninstall", RELEASE, "-n", NAMESPACE, "--wait"],
            None,
        )
        .await?;
        let selector = format!("app.kubernetes.io/instance={RELEASE}");
        for (ns, kinds) in [
            (None, "clusterroles,clusterrolebindings"),
            (
                Some(NAMESPACE),
                "deployments,configmaps,serviceaccounts,services,poddisruptionbudgets,roles,rolebindings",
            ),
            (Some("kube-system"), "roles,rolebindings"),
        ] {
            let mut args = vec!["get", kinds, "-l", selector.as_str(), "-o", "name"];
            if let Some(ns) = ns {
                args.extend(["-n", ns]);
            }
            let left = output(kubectl, &args, None).await?;
            ensure!(left.trim().is_empty(), "left after helm uninstall: {left}");
        }

        // 7. The operator is gone: a deleted CiliumNode hangs on our finalizer ...
        if let Some(agent) = self.nodes[idx].agent.take() {
            agent.stop();
        }
        let name = self.nodes[idx].name.clone();
        self.cns()
            .delete(&name, &DeleteParams::background())
            .await?;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let stuck = self
            .cns()
            .get_opt(&name)
            .await?
            .context("the CiliumNode went without the operator")?;
        ensure!(
            stuck.metadata.deletion_timestamp.is_some(),
            "not being deleted"
        );
        // ... until `eni-operator uninstall` (as NOTES.txt and docs/runbook.md say) lets it go.
        let report = output(
            bin,
            &[
                "uninstall",
                "--namespace",
                NAMESPACE,
                "--leader-election-lease-name",
                LEASE,
            ],
            None,
        )
        .await?;
        ensure!(report.contains("from 1 CiliumNodes"), "{report}");
        ensure!(report.contains("deleted the leader Lease"), "{report}");
        eventually(
            Duration::from_secs(30),
            "the CiliumNode to go",
            async || {
                Ok(if self.cns().get_opt(&name).await?.is_none() {
                    Ok(())
                } else {
                    Err("still there".into())
                })
            },
        )
        .await?;
        ensure!(leases.get_opt(LEASE).await?.is_none(), "the Lease is left");
        for cn in self.cns().list(&Default::default()).await?.items {
            ensure!(!ours(&cn), "{:?} keeps our finalizer", cn.metadata.name);
        }
        Ok(())
    }

    async fn has_finalizer(&self, idx: usize) -> Result<bool> {
        Ok(ours(&self.cn(idx).await?))
    }

    /// A kubeconfig for the ServiceAccount `sa`: the suite's cluster, a token from `kubectl
    /// create token` (what a pod of the Deployment would mount).
    async fn service_account_kubeconfig(
        &self,
        kubectl: &Path,
        sa: &str,
        dir: &Path,
    ) -> Result<PathBuf> {
        let token = output(
            kubectl,
            &["create", "token", sa, "-n", NAMESPACE, "--duration=1h"],
            None,
        )
        .await?;
        let view = |path: &'static str| async move {
            output(
                kubectl,
                &[
                    "config",
                    "view",
                    "--minify",
                    "--raw",
                    "-o",
                    &format!("jsonpath={{{path}}}"),
                ],
                None,
            )
            .await
        };
        let server = view(".clusters[0].cluster.server").await?;
        let ca_data = view(".clusters[0].cluster.certificate-authority-data").await?;
        let ca_file = view(".clusters[0].cluster.certificate-authority").await?;
        let ca = match (ca_data.is_empty(), ca_file.is_empty()) {
            (false, _) => format!("certificate-authority-data: {ca_data}"),
            (true, false) => format!("certificate-authority: {ca_file}"),
            (true, true) => return Err(anyhow!("the suite's kubeconfig names no CA")),
        };
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {server}\n    {ca}\n\
             users:\n- name: {sa}\n  user:\n    token: {}\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: {sa}\n    namespace: {NAMESPACE}\n\
             current-context: c\n",
            token.trim()
        );
        let path = dir.join("operator.kubeconfig");
        std::fs::write(&path, text)?;
        Ok(path)
    }
}
