//! The instance metadata service (IMDS) of one simulated instance, on ec2-sim's own port under
//! `/latest/`: Cilium's operator refuses to run ENI IPAM without it (it reads its Region from
//! the instance identity document; 1.20 also reads the VPC and subnet of its own instance).
//!
//! What AWS serves (EC2 User Guide, "Use the Instance Metadata Service", "Instance identity
//! documents", "Instance metadata categories"): IMDSv2's `PUT /latest/api/token` (header
//! `X-aws-ec2-metadata-token-ttl-seconds`, 1..=21600) answers a token as text; reads are `GET`s
//! of text, one value per path, a directory as its entries one per line; an unknown path is a
//! 404. The identity document is JSON with `region`, `availabilityZone`, `instanceId`,
//! `instanceType`, `privateIp`, `accountId`, `imageId`, `architecture`, `version`,
//! `pendingTime`. A token is accepted when sent (`X-aws-ec2-metadata-token`) and not required
//! (IMDSv1 allowed: AWS's default for instances launched without `HttpTokens=required`).
//!
//! Which instance: the one set by `POST /_sim/metadata?instance-id=ID` (or `--metadata-instance`),
//! else the running instance with the smallest ID; with none, only the Region is known (the
//! identity document carries it; the meta-data paths of an instance answer 404).

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};

use super::Server;

/// The instance the metadata describes, as the simulator holds it now.
struct Me {
    id: String,
    instance_type: String,
    zone: String,
    vpc: String,
    subnet: String,
    mac: String,
    ip: String,
}

impl Server {
    /// The Region: the zones' names without their trailing letter (`us-east-1a` → `us-east-1`).
    fn region(&self) -> String {
        self.zones
            .first()
            .map(|z| {
                z.trim_end_matches(|c: char| c.is_ascii_alphabetic())
                    .to_owned()
            })
            .unwrap_or_else(|| "us-east-1".to_owned())
    }

    fn me(&self) -> Option<Me> {
        let chosen = self.metadata_instance.lock().expect("metadata").clone();
        let id = match chosen {
            Some(id) => id,
            None => self.sim.instance_ids().into_iter().find(|id| {
                self.sim
                    .instance(id)
                    .is_some_and(|i| i.state == eni_operator::ec2::model::InstanceState::Running)
            })?,
        };
        let i = self.sim.instance(&id)?;
        let eni = self
            .sim
            .primary_eni_id(&id)
            .and_then(|e| self.sim.network_interface(&e));
        Some(Me {
            id,
            instance_type: i.instance_type,
            zone: i.availability_zone,
            vpc: i.vpc_id,
            subnet: i.subnet_id,
            mac: eni.as_ref().map(|e| e.mac.clone()).unwrap_or_default(),
            ip: eni.map(|e| e.primary_ip.to_string()).unwrap_or_default(),
        })
    }
}

fn text(s: impl Into<String>) -> Response {
    (StatusCode::OK, s.into()).into_response()
}

fn not_found() -> Response {
    (StatusCode::NOT_FOUND, "Not Found").into_response()
}

/// `PUT /latest/api/token`: a token for the asked lifetime (400 without a valid one, as AWS).
pub async fn token(State(s): State<Server>, headers: HeaderMap) -> Response {
    let ttl = headers
        .get("x-aws-ec2-metadata-token-ttl-seconds")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u32>().ok());
    match ttl {
        Some(t) if (1..=21_600).contains(&t) => {
            let n = s.requests.load(std::sync::atomic::Ordering::Relaxed);
            let mut r = text(format!("ec2-sim-imds-token-{n:016x}"));
            r.headers_mut().insert(
                "x-aws-ec2-metadata-token-ttl-seconds",
                t.to_string().parse().expect("digits"),
            );
            r
        }
        _ => (StatusCode::BAD_REQUEST, "Bad Request").into_response(),
    }
}

/// `GET /latest/dynamic/instance-identity/document`.
pub async fn identity(State(s): State<Server>) -> Response {
    let region = s.region();
    let me = s.me();
    let doc = serde_json::json!({
        "accountId": super::actions::OWNER,
        "architecture": "x86_64",
        "availabilityZone": me.as_ref().map(|m| m.zone.clone()).unwrap_or_default(),
        "imageId": "ami-ec2sim",
        "instanceId": me.as_ref().map(|m| m.id.clone()).unwrap_or_default(),
        "instanceType": me.as_ref().map(|m| m.instance_type.clone()).unwrap_or_default(),
        "pendingTime": "2026-01-01T00:00:00Z",
        "privateIp": me.as_ref().map(|m| m.ip.clone()).unwrap_or_default(),
        "region": region,
        "version": "2017-09-30",
    });
    let mut r = text(serde_json::to_string_pretty(&doc).expect("json"));
    r.headers_mut().insert(
        axum::http::header::CONTENT_TYPE,
        "text/plain".parse().expect("static"),
    );
    r
}

/// `GET /latest/meta-data/<path>`: the paths an ENI allocator reads.
pub async fn meta_data(State(s): State<Server>, path: Option<Path<String>>) -> Response {
    let path = path.map(|Path(p)| p).unwrap_or_default();
    let path = path.trim_end_matches('/');
    let Some(me) = s.me() else {
        return not_found();
    };
    let mac_dir = format!("network/interfaces/macs/{}", me.mac);
    let answer = match path {
        "" => "instance-id\ninstance-type\nlocal-ipv4\nmac\nnetwork/\nplacement/".to_owned(),
        "instance-id" => me.id,
        "instance-type" => me.instance_type,
        "mac" => me.mac,
        "local-ipv4" => me.ip,
        "placement" => "availability-zone\nregion".to_owned(),
        "placement/availability-zone" => me.zone,
        "placement/region" => s.region(),
        "network" => "interfaces/".to_owned(),
        "network/interfaces" => "macs/".to_owned(),
        "network/interfaces/macs" => format!("{}/", me.mac),
        p if p == mac_dir => "device-number\nlocal-ipv4s\nmac\nsubnet-id\nvpc-id".to_owned(),
        p => match p.strip_prefix(&mac_dir).and_then(|r| r.strip_prefix('/')) {
            Some("vpc-id") => me.vpc,
            Some("subnet-id") => me.subnet,
            Some("mac") => me.mac,
            Some("device-number") => "0".to_owned(),
            Some("local-ipv4s") => me.ip,
            _ => return not_found(),
        },
    };
    text(answer)
}

/// `POST /_sim/metadata?instance-id=ID`: the instance the metadata describes from now on.
pub async fn set_instance(
    State(s): State<Server>,
    axum::extract::RawQuery(q): axum::extract::RawQuery,
) -> Response {
    let p = super::Params::parse(q.as_deref(), b"");
    let Some(id) = p.get("instance-id") else {
        return (StatusCode::BAD_REQUEST, "instance-id is required").into_response();
    };
    if s.sim.instance(id).is_none() {
        return (StatusCode::BAD_REQUEST, format!("no instance {id}")).into_response();
    }
    *s.metadata_instance.lock().expect("metadata") = Some(id.to_owned());
    StatusCode::NO_CONTENT.into_response()
}
