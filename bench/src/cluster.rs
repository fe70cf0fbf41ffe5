//! The real processes of `make bench-process` and `make demo`'s real back-end: ec2-sim and the
//! operator binary as children of this process, a plain HTTP client for ec2-sim and the
//! operator's metrics, the seeding of both worlds (Cilium's CRD and the namespace in the API
//! server; a VPC, subnet and instances in ec2-sim), nodes joining as a kubelet and a classic
//! agent create them, and a watch of every CiliumNode.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail, ensure};
use bytes::Bytes;
use eni_operator::crd::CiliumNode;
use futures::{StreamExt, TryStreamExt};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use k8s_openapi::api::core::v1::{Namespace, Node, NodeSpec};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Api, PostParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};

use crate::process as p;

/// Cilium's own CiliumNode CRD (what real clusters run; the API server prunes what it does not
/// list).
const CILIUM_CRD: &str = include_str!("../../tests/fixtures/ciliumnodes.cilium.io.yaml");
pub const NAMESPACE: &str = "eni-operator";
pub const CLUSTER: &str = "bench";
pub const ZONE: &str = "us-east-1a";
/// Every node's instance type (4 ENIs of 15 addresses), and the first ENI pods use.
pub const INSTANCE_TYPE: &str = "m5.xlarge";
pub const FIRST_INTERFACE_INDEX: i64 = 1;

/// A child process, SIGTERMed (then SIGKILLed) on drop.
pub struct Proc {
    child: Child,
    /// ec2-sim's EC2 endpoint, the operator's metrics address.
    pub endpoint: Option<String>,
}

impl Proc {
    /// ec2-sim with AWS's buckets and these latencies, on a free port.
    pub fn ec2_sim(
        path: &Path,
        mutating_latency_ms: u64,
        describe_latency_ms: u64,
        log_dir: &Path,
    ) -> Result<Self> {
        let log = std::fs::File::create(log_dir.join("ec2-sim.log"))?;
        let mut cmd = Command::new(path);
        cmd.args([
            "--listen",
            "127.0.0.1:0",
            "--mutate-latency-ms",
            &mutating_latency_ms.to_string(),
            "--describe-latency-ms",
            &describe_latency_ms.to_string(),
            // The zone the nodes are in (the others are not used).
            "--zones",
            ZONE,
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log);
        testkit::control_plane::die_with_parent(&mut cmd);
        let mut child = cmd.spawn().context("starting ec2-sim")?;
        let stdout = child.stdout.take().context("ec2-sim stdout")?;
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line)?;
        let mut p = Proc {
            child,
            endpoint: None,
        };
        let endpoint = line.trim();
        if !endpoint.starts_with("http://") {
            p.stop();
            bail!("ec2-sim printed {line:?} instead of its endpoint");
        }
        p.endpoint = Some(endpoint.to_owned());
        Ok(p)
    }

    /// The operator binary against the API server of `kubeconfig` and ec2-sim at `endpoint`,
    /// with `extra` flags; its log in `log_dir`.
    pub fn operator(
        path: &Path,
        kubeconfig: &Path,
        endpoint: &str,
        log_dir: &Path,
        extra: &[String],
    ) -> Result<Self> {
        let metrics = free_port()?;
        let health = free_port()?;
        let log = std::fs::File::create(log_dir.join("operator.log"))?;
        let mut cmd = Command::new(path);
        cmd.args([
            "--cluster-name",
            CLUSTER,
            "--namespace",
            NAMESPACE,
            "--ec2-api-endpoint",
            endpoint,
            "--aws-region",
            "us-east-1",
            "--metrics-addr",
            &format!("127.0.0.1:{metrics}"),
            "--health-addr",
            &format!("127.0.0.1:{health}"),
            // The debug pages on the metrics listener: several operators run on one host.
            "--debug-addr",
            &format!("127.0.0.1:{metrics}"),
            // No Cilium operator in the benchmark's cluster: the guard need not wait for its
            // Lease.
            "--cilium-operator-absent",
        ]);
        cmd.args(extra);
        cmd.env("KUBECONFIG", kubeconfig)
            .env("AWS_ACCESS_KEY_ID", "bench")
            .env("AWS_SECRET_ACCESS_KEY", "bench")
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        testkit::control_plane::die_with_parent(&mut cmd);
        let child = cmd.spawn().context("starting the operator")?;
        Ok(Proc {
            child,
            endpoint: Some(format!("http://127.0.0.1:{metrics}")),
        })
    }

    /// Another program (Cilium's operator) from `cmd`, its output in `log_dir/operator.log`.
    pub fn spawn(
        mut cmd: Command,
        log_dir: &Path,
        endpoint: Option<String>,
        what: &str,
    ) -> Result<Self> {
        let log = std::fs::File::create(log_dir.join("operator.log"))?;
        cmd.stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        testkit::control_plane::die_with_parent(&mut cmd);
        let child = cmd.spawn().with_context(|| format!("starting {what}"))?;
        Ok(Proc { child, endpoint })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn stop(&mut self) {
        if let Ok(Some(_)) = self.child.try_wait() {
            return;
        }
        if let Ok(pid) = i32::try_from(self.child.id()) {
            // SAFETY: kill(2) on our own child, not reaped yet (try_wait above), so the pid is
            // still ours.
            unsafe {
                libc::kill(pid, libc::SIGTERM);
            }
        }
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(10) {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.stop();
    }
}

pub fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// A plain HTTP client for ec2-sim and the operator's metrics.
#[derive(Clone)]
pub struct Http(HttpClient<HttpConnector, Full<Bytes>>);

impl Default for Http {
    fn default() -> Self {
        Self::new()
    }
}

impl Http {
    pub fn new() -> Self {
        Self(HttpClient::builder(TokioExecutor::new()).build_http())
    }

    pub async fn send(&self, method: &str, url: &str, body: String) -> Result<(u16, String)> {
        let mut req = http::Request::builder().method(method).uri(url);
        if !body.is_empty() {
            req = req.header("content-type", "application/x-www-form-urlencoded");
        }
        let resp = self
            .0
            .request(req.body(Full::new(Bytes::from(body)))?)
            .await?;
        let status = resp.status().as_u16();
        let bytes = resp.into_body().collect().await?.to_bytes();
        Ok((status, String::from_utf8_lossy(&bytes).into_owned()))
    }

    pub async fn get(&self, url: &str) -> Result<String> {
        let (status, body) = self.send("GET", url, String::new()).await?;
        ensure!(status == 200, "GET {url}: {status} {body}");
        Ok(body)
    }

    /// An EC2 Query API call (ec2-sim checks no signature).
    pub async fn ec2(&self, endpoint: &str, params: &[(&str, String)]) -> Result<String> {
        let mut form = form_urlencoded::Serializer::new(String::new());
        form.append_pair("Version", "2016-11-15");
        for (k, v) in params {
            form.append_pair(k, v);
        }
        let (status, body) = self.send("POST", endpoint, form.finish()).await?;
        ensure!(status == 200, "EC2 {params:?}: {status} {body}");
        Ok(body)
    }
}

/// What was seeded in ec2-sim.
pub struct World {
    pub vpc: String,
    pub subnet: String,
    /// Instances launched (running, tagged as the cluster's), in order.
    pub instances: Vec<String>,
}

/// Cilium's CiliumNode CRD and the operator's namespace in the API server; one VPC, subnet and
/// security group and `total` instances in ec2-sim.
pub async fn prepare(
    kubeconfig: &Path,
    endpoint: &str,
    total: usize,
) -> Result<(kube::Client, World)> {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig)?;
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?;
    let kube = kube::Client::try_from(cfg)?;

    let crd: CustomResourceDefinition = serde_saphyr::from_str(CILIUM_CRD)?;
    let crds: Api<CustomResourceDefinition> = Api::all(kube.clone());
    crds.create(&PostParams::default(), &crd).await?;
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(NAMESPACE.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<Namespace>::all(kube.clone())
        .create(&PostParams::default(), &ns)
        .await?;
    // The CRD is served once Established.
    let name = crd.metadata.name.clone().unwrap_or_default();
    let start = Instant::now();
    loop {
        let c = crds.get(&name).await?;
        let established = c.status.and_then(|s| s.conditions).is_some_and(|cs| {
            cs.iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
        });
        if established {
            break;
        }
        ensure!(
            start.elapsed() < Duration::from_secs(60),
            "{name} not Established"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let cns: Api<CiliumNode> = Api::all(kube.clone());
    let start = Instant::now();
    while cns.list(&Default::default()).await.is_err() {
        ensure!(
            start.elapsed() < Duration::from_secs(60),
            "ciliumnodes not served"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // EC2: one VPC and one subnet large enough for 5,000 nodes x 30 addresses (a /13, as the
    // simulated benchmark; AWS caps a VPC block at /16, where this would take several subnets).
    let http = Http::new();
    let cidr = "10.0.0.0/13".to_string();
    let vpc = first_value(
        &http
            .ec2(
                endpoint,
                &[("Action", "CreateVpc".into()), ("CidrBlock", cidr.clone())],
            )
            .await?,
        "vpcId",
    )?;
    let subnet = first_value(
        &http
            .ec2(
                endpoint,
                &[
                    ("Action", "CreateSubnet".into()),
                    ("VpcId", vpc.clone()),
                    ("CidrBlock", cidr),
                    ("AvailabilityZone", ZONE.into()),
                ],
            )
            .await?,
        "subnetId",
    )?;
    let sg = first_value(
        &http
            .ec2(
                endpoint,
                &[
                    ("Action", "CreateSecurityGroup".into()),
                    ("VpcId", vpc.clone()),
                    ("GroupName", "bench".into()),
                    ("GroupDescription", "bench".into()),
                ],
            )
            .await?,
        "groupId",
    )?;
    let mut instances = Vec::with_capacity(total);
    while instances.len() < total {
        let n = (total - instances.len()).min(500);
        let body = http
            .ec2(
                endpoint,
                &[
                    ("Action", "RunInstances".into()),
                    ("ImageId", "ami-bench".into()),
                    ("InstanceType", INSTANCE_TYPE.into()),
                    ("SubnetId", subnet.clone()),
                    ("SecurityGroupId.1", sg.clone()),
                    ("MinCount", n.to_string()),
                    ("MaxCount", n.to_string()),
                    // As EKS and Karpenter tag them: the operator touches no instance without
                    // its cluster's tag.
                    ("TagSpecification.1.ResourceType", "instance".into()),
                    (
                        "TagSpecification.1.Tag.1.Key",
                        format!("kubernetes.io/cluster/{CLUSTER}"),
                    ),
                    ("TagSpecification.1.Tag.1.Value", "owned".into()),
                ],
            )
            .await?;
        let ids = p::xml_values(&body, "instanceId");
        ensure!(
            ids.len() == n,
            "RunInstances gave {} of {n} instances",
            ids.len()
        );
        instances.extend(ids);
    }
    Ok((
        kube,
        World {
            vpc,
            subnet,
            instances,
        },
    ))
}

fn first_value(xml: &str, tag: &str) -> Result<String> {
    p::xml_values(xml, tag)
        .into_iter()
        .next()
        .ok_or_else(|| anyhow!("no <{tag}> in {xml}"))
}

/// Node `name` on `instance` registers, as the kubelet does (cordoned: no pods are scheduled
/// in this cluster). Returns its uid (the CiliumNode's owner).
pub async fn create_node(kube: &kube::Client, name: &str, instance: &str) -> Result<String> {
    let node = Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(BTreeMap::from([
                ("topology.kubernetes.io/zone".into(), ZONE.into()),
                (
                    "node.kubernetes.io/instance-type".into(),
                    INSTANCE_TYPE.into(),
                ),
            ])),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            provider_id: Some(format!("aws:///{ZONE}/{instance}")),
            unschedulable: Some(true),
            ..Default::default()
        }),
        ..Default::default()
    };
    let node = Api::<Node>::all(kube.clone())
        .create(&PostParams::default(), &node)
        .await?;
    Ok(node.metadata.uid.unwrap_or_default())
}

/// Node `name`'s CiliumNode, as a classic agent creates it at start (with `min_allocate`),
/// owned by its Node (`node_uid`).
pub async fn create_ciliumnode(
    kube: &kube::Client,
    w: &World,
    name: &str,
    instance: &str,
    node_uid: String,
    min_allocate: i64,
) -> Result<()> {
    let mut cn = CiliumNode::new(name, Default::default());
    cn.spec.instance_id = instance.into();
    cn.spec.eni.instance_type = INSTANCE_TYPE.into();
    cn.spec.eni.vpc_id = w.vpc.clone();
    cn.spec.eni.availability_zone = ZONE.into();
    cn.spec.eni.node_subnet_id = w.subnet.clone();
    cn.spec.eni.first_interface_index = Some(FIRST_INTERFACE_INDEX);
    cn.spec.ipam.min_allocate = min_allocate;
    cn.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "v1".into(),
        kind: "Node".into(),
        name: name.into(),
        uid: node_uid,
        ..Default::default()
    }]);
    Api::<CiliumNode>::all(kube.clone())
        .create(&PostParams::default(), &cn)
        .await?;
    Ok(())
}

/// Watch every CiliumNode and hand each version seen to `on` (until the watch ends).
pub async fn watch_ciliumnodes(kube: kube::Client, mut on: impl FnMut(CiliumNode)) {
    let api: Api<CiliumNode> = Api::all(kube);
    let mut stream = watcher::watcher(api, watcher::Config::default())
        .default_backoff()
        .boxed();
    loop {
        match stream.try_next().await {
            Ok(Some(Event::Apply(cn) | Event::InitApply(cn))) => on(cn),
            Ok(Some(_)) => {}
            Ok(None) => return,
            Err(e) => eprintln!("watch of CiliumNodes: {e}"),
        }
    }
}

/// Wait until the operator whose metrics are at `metrics` leads (its `eni_operator_leader` gauge
/// is 1), at most 120 s.
pub async fn wait_leader(http: &Http, metrics: &str, pid: u32) -> Result<()> {
    let start = Instant::now();
    loop {
        if let Ok(t) = http.get(&format!("{metrics}/metrics")).await
            && t.lines().any(|l| l.trim() == "eni_operator_leader 1")
        {
            return Ok(());
        }
        ensure!(
            start.elapsed() < Duration::from_secs(120),
            "the operator (pid {pid}) did not become leader in 120 s"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
