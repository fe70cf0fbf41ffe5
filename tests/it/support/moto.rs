//! moto's EC2 server for integration tests: found, started on a free loopback port, reset, and
//! killed on drop; plus [`seed`], which creates the shared test [`World`] in it.
//!
//! A missing moto is a failure, never a skip: install it with `make venv`.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use aws_sdk_ec2::Client;
use aws_sdk_ec2::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_ec2::types::{InstanceType, Tag};
use eni_operator::ec2::aws::{AwsClientConfig, AwsEc2};

use testkit::world::{SeededInstance, SeededSubnet, World};

pub const REGION: &str = "us-east-1";
/// The tag that marks the pod subnet and security group of the world.
pub const POD_TAG: (&str, &str) = ("eni-operator-test/pods", "true");

/// A running `moto_server`, killed when dropped.
pub struct MotoServer {
    child: Child,
    port: u16,
    endpoint: String,
}

/// `ENI_OPERATOR_MOTO_SERVER`, else `<workspace>/.venv/bin/moto_server`, else `moto_server` on
/// `PATH`.
fn find_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("ENI_OPERATOR_MOTO_SERVER") {
        return PathBuf::from(path);
    }
    let venv = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/moto_server");
    if venv.is_file() {
        return venv;
    }
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("moto_server"))
            .find(|p| p.is_file())
    });
    on_path.unwrap_or_else(|| {
        panic!(
            "moto_server not found: run `make venv` (installs moto[server] into .venv), or set \
             ENI_OPERATOR_MOTO_SERVER to a moto_server binary, or put moto_server on PATH"
        )
    })
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind a free loopback port")
        .port()
}

/// A minimal HTTP/1.1 exchange, so the harness needs no HTTP client crate. Returns the status.
fn http(port: u16, method: &str, path: &str) -> std::io::Result<u16> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    answer
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("not an HTTP answer: {answer:.80}")))
}

impl MotoServer {
    /// Start moto on a free port and wait (up to 30 s) until it answers.
    pub fn start() -> Self {
        let binary = find_binary();
        // A port may be taken between probing and binding: try a few.
        for _ in 0..3 {
            let port = free_port();
            let mut child = Command::new(&binary)
                .args(["-H", "127.0.0.1", "-p", &port.to_string()])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap_or_else(|e| panic!("cannot start {}: {e}", binary.display()));
            let deadline = Instant::now() + Duration::from_secs(30);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    break;
                }
                if http(port, "GET", "/moto-api/").is_ok() {
                    return Self {
                        child,
                        port,
                        endpoint: format!("http://127.0.0.1:{port}"),
                    };
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("{} did not start answering", binary.display());
    }

    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Forget every resource (`POST /moto-api/reset`).
    pub fn reset(&self) {
        let status = http(self.port, "POST", "/moto-api/reset").expect("reset moto");
        assert_eq!(status, 200, "moto reset answered {status}");
    }
}

impl Drop for MotoServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn credentials() -> Credentials {
    Credentials::new("testing", "testing", None, None, "eni-operator-tests")
}

/// A raw SDK client for seeding (region us-east-1, dummy credentials).
pub fn sdk_client(endpoint: &str) -> Client {
    Client::from_conf(
        aws_sdk_ec2::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .region(Region::new(REGION))
            .credentials_provider(credentials())
            .endpoint_url(endpoint)
            .build(),
    )
}

/// Our client, configured as in production apart from static credentials.
pub async fn aws_ec2(endpoint: &str) -> AwsEc2 {
    let config = AwsClientConfig {
        region: Some(REGION.into()),
        endpoint_url: Some(endpoint.into()),
        connect_timeout: Duration::from_secs(2),
        // moto hangs on some requests (more IPs than the subnet holds): never wait forever.
        operation_timeout: Duration::from_secs(10),
        max_results_per_call: None,
    };
    AwsEc2::from_loader(
        config.loader().credentials_provider(credentials()),
        config.max_results_per_call,
    )
    .await
}

fn tag(key: &str, value: &str) -> Tag {
    Tag::builder().key(key).value(value).build()
}

/// Tags resource `id` with `tags` (none: no call).
async fn tag_resource(ec2: &Client, id: &str, tags: &[(String, String)]) {
    if tags.is_empty() {
        return;
    }
    ec2.create_tags()
        .resources(id)
        .set_tags(Some(tags.iter().map(|(k, v)| tag(k, v)).collect()))
        .send()
        .await
        .unwrap_or_else(|e| panic!("tag {id}: {e}"));
}

async fn create_subnet(
    ec2: &Client,
    vpc_id: &str,
    cidr: &str,
    zone: &str,
    tags: Vec<(String, String)>,
) -> SeededSubnet {
    let out = ec2
        .create_subnet()
        .vpc_id(vpc_id)
        .cidr_block(cidr)
        .availability_zone(zone)
        .send()
        .await
        .expect("create subnet");
    let id = out
        .subnet()
        .and_then(|s| s.subnet_id())
        .expect("subnet id")
        .to_string();
    tag_resource(ec2, &id, &tags).await;
    SeededSubnet {
        id,
        availability_zone: zone.into(),
        cidr: cidr.into(),
        tags,
    }
}

async fn run_instance(
    ec2: &Client,
    image_id: &str,
    instance_type: &str,
    subnet: &SeededSubnet,
) -> SeededInstance {
    let out = ec2
        .run_instances()
        .image_id(image_id)
        .instance_type(InstanceType::from(instance_type))
        .subnet_id(&subnet.id)
        .min_count(1)
        .max_count(1)
        .send()
        .await
        .expect("run instance");
    let instance = out.instances().first().expect("one instance");
    let primary_eni_id = instance
        .network_interfaces()
        .iter()
        .find(|n| n.attachment().and_then(|a| a.device_index()) == Some(0))
        .and_then(|n| n.network_interface_id())
        .expect("primary ENI at device index 0")
        .to_string();
    SeededInstance {
        id: instance.instance_id().expect("instance id").to_string(),
        instance_type: instance_type.into(),
        availability_zone: subnet.availability_zone.clone(),
        subnet_id: subnet.id.clone(),
        primary_eni_id,
    }
}

/// Create the [`World`] in a fresh moto.
pub async fn seed(endpoint: &str) -> World {
    let ec2 = sdk_client(endpoint);
    let zone_a = format!("{REGION}a");
    let zone_b = format!("{REGION}b");
    let vpc_cidr = "10.0.0.0/16";
    let vpc_secondary_cidr = "100.64.0.0/16";

    let vpc_id = ec2
        .create_vpc()
        .cidr_block(vpc_cidr)
        .send()
        .await
        .expect("create VPC")
        .vpc()
        .and_then(|v| v.vpc_id())
        .expect("VPC id")
        .to_string();
    ec2.associate_vpc_cidr_block()
        .vpc_id(&vpc_id)
        .cidr_block(vpc_secondary_cidr)
        .send()
        .await
        .expect("associate secondary CIDR");

    let pod_tag = vec![(POD_TAG.0.to_string(), POD_TAG.1.to_string())];
    let subnets = vec![
        create_subnet(&ec2, &vpc_id, "10.0.0.0/24", &zone_a, vec![]).await,
        create_subnet(&ec2, &vpc_id, "100.64.0.0/20", &zone_a, pod_tag.clone()).await,
        create_subnet(&ec2, &vpc_id, "10.0.16.0/24", &zone_b, vec![]).await,
        create_subnet(&ec2, &vpc_id, "10.0.32.0/28", &zone_a, vec![]).await,
    ];

    let mut security_groups = Vec::new();
    for (name, tags) in [("pods", pod_tag.clone()), ("other", vec![])] {
        let id = ec2
            .create_security_group()
            .group_name(format!("eni-operator-test-{name}"))
            .description("eni-operator tests")
            .vpc_id(&vpc_id)
            .send()
            .await
            .expect("create security group")
            .group_id()
            .expect("group id")
            .to_string();
        tag_resource(&ec2, &id, &tags).await;
        security_groups.push(id);
    }

    // Any AMI moto knows will do; it ships a catalogue of Amazon images.
    let images = ec2
        .describe_images()
        .owners("amazon")
        .send()
        .await
        .expect("describe images");
    let image_id = images
        .images()
        .iter()
        .find_map(|i| i.image_id())
        .expect("moto lists at least one AMI")
        .to_string();
    let instances = vec![
        run_instance(&ec2, &image_id, "m5.large", &subnets[0]).await,
        run_instance(&ec2, &image_id, "t3.medium", &subnets[2]).await,
    ];

    World {
        region: REGION.into(),
        zone_a,
        zone_b,
        vpc_id,
        vpc_cidr: vpc_cidr.into(),
        vpc_secondary_cidr: vpc_secondary_cidr.into(),
        subnets,
        security_groups,
        instances,
        enforces_aws_rules: false,
    }
}
