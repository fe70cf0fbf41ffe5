//! `ec2-sim`: the [simulator](crate::sim) served over HTTP as the EC2 Query API, so the real
//! aws-sdk-ec2 (the operator binary, the e2e suite) can talk to it like to AWS.
//!
//! * Every action the operator calls goes through the simulator's API path ([`Ec2`] on
//!   [`Simulator`]): its per-account throttling buckets (`RequestLimitExceeded`, HTTP 503), latency,
//!   injected faults, counters and AWS's rules. `MaxResults` and `NextToken` paginate as AWS does.
//! * The seeding actions a test harness needs (`CreateVpc`, `AssociateVpcCidrBlock`,
//!   `CreateSubnet`, `CreateSecurityGroup`, `RunInstances`, `TerminateInstances`,
//!   `DescribeAvailabilityZones`, `DescribeImages`) change the state directly: they are neither
//!   throttled nor counted.
//! * Request signatures are not checked (any credentials are accepted), and only API version
//!   2016-11-15's shapes are written.
//! * `/_sim/...` is the simulator's own control plane: `GET /_sim/stats` (per-action counters as
//!   JSON), `POST /_sim/bucket?bucket=NAME&burst=N&per_second=N`,
//!   `POST /_sim/reset-throttling`, `POST /_sim/fault?operation=OP&code=CODE&times=N`,
//!   `POST /_sim/other-tenant?share=F[&empty=true]` (another tenant uses that share of every
//!   bucket's refill from now on; with `empty`, its burst first takes every token left),
//!   `POST /_sim/tenant-spell?after_ms=N&length_ms=N[&share=F]` (that tenant's spell, scheduled:
//!   after `after_ms` it takes every token left and `share`, 0.9 by default, of every refill
//!   for `length_ms`).
//!
//! Adding an action is one line in [`dispatch`] and one function in `actions`.

mod actions;
pub mod clients;
mod imds;
mod query;
mod xml;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use eni_operator::ec2::model::{Bucket, Operation};
use eni_operator::ec2::{Ec2Error, ErrorKind};

use crate::sim::{SeedError, Simulator};
pub use query::Params;
pub use xml::{NAMESPACE, Xml};

/// An error answer: HTTP status, AWS error code and message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WireError {
    pub status: u16,
    pub code: String,
    pub message: String,
}

impl WireError {
    /// A client error (HTTP 400), as AWS answers bad input.
    pub fn client(code: &str, message: impl Into<String>) -> Self {
        Self {
            status: 400,
            code: code.to_owned(),
            message: message.into(),
        }
    }

    /// What AWS would answer for the simulator's error: 503 for throttling and unavailability,
    /// 500 for other server-side trouble (an injected lost answer becomes an `InternalError`:
    /// AWS documents that such a call may have taken effect), 403 for permissions, 400 for the
    /// rest.
    pub fn from_ec2(e: Ec2Error) -> Self {
        let status = match e.kind {
            ErrorKind::Throttled => 503,
            ErrorKind::Transient
                if matches!(
                    e.code.as_str(),
                    "Unavailable" | "ServiceUnavailable" | "RequestLimitExceeded"
                ) =>
            {
                503
            }
            ErrorKind::Transient => 500,
            ErrorKind::Unauthorized => 403,
            _ => 400,
        };
        let code = if e.code == "Timeout" {
            "InternalError".to_owned()
        } else {
            e.code
        };
        Self {
            status,
            code,
            message: e.message,
        }
    }
}

impl From<SeedError> for WireError {
    fn from(e: SeedError) -> Self {
        let status = if e.code == "InternalError" { 500 } else { 400 };
        Self {
            status,
            code: e.code.to_owned(),
            message: e.message,
        }
    }
}

impl From<Ec2Error> for WireError {
    fn from(e: Ec2Error) -> Self {
        Self::from_ec2(e)
    }
}

/// What an action writes into its answer.
pub type Body = Box<dyn FnOnce(&mut Xml) + Send>;
type Answer = Result<Body, WireError>;

/// The shared state of the server.
#[derive(Clone)]
pub struct Server {
    sim: Simulator,
    /// Availability zones `DescribeAvailabilityZones` lists (the simulator takes any name).
    zones: Arc<Vec<String>>,
    requests: Arc<AtomicU64>,
    /// Calls per client (access key ID) and every mutating call (`clients`).
    clients: Arc<clients::ClientLog>,
    /// The instance the metadata endpoint describes (`imds`); `None`: the first running one.
    metadata_instance: Arc<Mutex<Option<String>>>,
}

impl Server {
    pub fn new(sim: Simulator, zones: Vec<String>) -> Self {
        Self {
            sim,
            zones: Arc::new(zones),
            requests: Arc::new(AtomicU64::new(0)),
            clients: Arc::default(),
            metadata_instance: Arc::default(),
        }
    }

    /// The instance the metadata endpoint describes (default: the running one with the
    /// smallest ID).
    pub fn with_metadata_instance(self, instance_id: Option<String>) -> Self {
        *self.metadata_instance.lock().expect("metadata") = instance_id;
        self
    }

    /// The per-client record so far.
    pub fn client_record(&self) -> clients::Record {
        self.clients.snapshot()
    }

    /// The HTTP routes: the EC2 endpoint at `/` and the control plane under `/_sim/`.
    pub fn router(self) -> Router {
        Router::new()
            .route("/", post(ec2).get(ec2))
            .route("/_sim/stats", get(stats))
            .route("/_sim/bucket", post(set_bucket))
            .route("/_sim/other-tenant", post(set_other_tenant))
            .route("/_sim/tenant-spell", post(set_tenant_spell))
            .route("/_sim/reset-throttling", post(reset_throttling))
            .route("/_sim/fault", post(inject_fault))
            .route("/_sim/clients", get(client_record))
            .route("/_sim/clients/reset", post(reset_clients))
            .route("/_sim/metadata", post(imds::set_instance))
            // The instance metadata service (IMDSv2 token, identity document, meta-data).
            .route("/latest/api/token", put(imds::token))
            .route(
                "/latest/dynamic/instance-identity/document",
                get(imds::identity),
            )
            .route("/latest/meta-data", get(imds::meta_data))
            .route("/latest/meta-data/", get(imds::meta_data))
            .route("/latest/meta-data/{*path}", get(imds::meta_data))
            .with_state(self)
    }

    /// Serve on `listener` until the task is dropped.
    pub async fn serve(self, listener: tokio::net::TcpListener) -> std::io::Result<()> {
        axum::serve(listener, self.router()).await
    }

    /// Bind `addr` (port 0: a free one), serve in a background task; returns the bound address.
    pub async fn spawn(
        self,
        addr: &str,
    ) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<std::io::Result<()>>)> {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let bound = listener.local_addr()?;
        Ok((bound, tokio::spawn(self.serve(listener))))
    }

    fn request_id(&self) -> String {
        let n = self.requests.fetch_add(1, Ordering::Relaxed);
        format!(
            "{:08x}-0000-4000-8000-{:012x}",
            n >> 48,
            n & 0xffff_ffff_ffff
        )
    }
}

/// One action to its handler. Unknown actions get AWS's `InvalidAction`.
async fn dispatch(s: &Server, action: &str, p: &Params) -> Answer {
    use actions as a;
    match action {
        "DescribeInstanceTypes" => a::describe_instance_types(&s.sim, p).await,
        "DescribeInstances" => a::describe_instances(&s.sim, p).await,
        "DescribeNetworkInterfaces" => a::describe_network_interfaces(&s.sim, p).await,
        "DescribeSubnets" => a::describe_subnets(&s.sim, p).await,
        "DescribeVpcs" => a::describe_vpcs(&s.sim, p).await,
        "DescribeSecurityGroups" => a::describe_security_groups(&s.sim, p).await,
        "DescribeRouteTables" => a::describe_route_tables(&s.sim, p).await,
        "CreateNetworkInterface" => a::create_network_interface(&s.sim, p).await,
        "AttachNetworkInterface" => a::attach_network_interface(&s.sim, p).await,
        "ModifyNetworkInterfaceAttribute" => a::modify_network_interface_attribute(&s.sim, p).await,
        "AssignPrivateIpAddresses" => a::assign_private_ip_addresses(&s.sim, p).await,
        "UnassignPrivateIpAddresses" => a::unassign_private_ip_addresses(&s.sim, p).await,
        "DetachNetworkInterface" => a::detach_network_interface(&s.sim, p).await,
        "DeleteNetworkInterface" => a::delete_network_interface(&s.sim, p).await,
        "DescribeAddresses" => a::describe_addresses(&s.sim, p).await,
        "AssociateAddress" => a::associate_address(&s.sim, p).await,
        // Seeding (not throttled, not counted).
        "DescribeAvailabilityZones" => a::describe_availability_zones(&s.zones, p),
        "DescribeImages" => a::describe_images(p),
        "CreateVpc" => a::create_vpc(&s.sim, p),
        "AssociateVpcCidrBlock" => a::associate_vpc_cidr_block(&s.sim, p),
        "CreateSubnet" => a::create_subnet(&s.sim, p),
        "CreateSecurityGroup" => a::create_security_group(&s.sim, p),
        "RunInstances" => a::run_instances(&s.sim, p),
        "TerminateInstances" => a::terminate_instances(&s.sim, p),
        other => Err(WireError::client(
            "InvalidAction",
            format!("The action {other} is not valid for this web service."),
        )),
    }
}

fn xml_response(status: u16, body: Vec<u8>) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut r = (status, body).into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/xml;charset=UTF-8"),
    );
    r
}

async fn ec2(
    State(s): State<Server>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
    body: Bytes,
) -> Response {
    let p = Params::parse(query.as_deref(), &body);
    let request_id = s.request_id();
    let action = p.require("Action").map(str::to_owned);
    let instance = action
        .as_deref()
        .ok()
        .filter(|a| clients::is_mutating(a))
        .and_then(|_| touched_instance(&s.sim, &p));
    let result = match &action {
        Ok(action) => dispatch(&s, action, &p).await,
        Err(e) => Err(e.clone()),
    };
    if let Ok(action) = &action {
        let answer = result.as_ref().map_or_else(|e| e.code.as_str(), |_| "ok");
        s.clients
            .record(&clients::client_of(&headers), action, answer, instance);
    }
    match (action, result) {
        (Ok(action), Ok(body)) => xml_response(200, Xml::answer(&action, &request_id, body)),
        (_, Err(e)) => xml_response(e.status, Xml::error(&e.code, &e.message, &request_id)),
        (Err(e), _) => xml_response(e.status, Xml::error(&e.code, &e.message, &request_id)),
    }
}

/// The instance a mutating call touches: named by it, or its ENI's attachment before the call.
fn touched_instance(sim: &Simulator, p: &Params) -> Option<String> {
    if let Some(i) = p.get("InstanceId") {
        return Some(i.to_owned());
    }
    let eni = p.get("NetworkInterfaceId")?;
    sim.network_interface(eni)?
        .attachment
        .map(|a| a.instance_id)
}

/// `GET /_sim/clients`: calls per client and action, and every mutating call (`clients`).
async fn client_record(State(s): State<Server>) -> Response {
    let mut r = serde_json::to_string(&s.clients.snapshot())
        .unwrap_or_default()
        .into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

async fn reset_clients(State(s): State<Server>) -> Response {
    s.clients.reset();
    StatusCode::NO_CONTENT.into_response()
}

fn control_error(message: String) -> Response {
    (StatusCode::BAD_REQUEST, message).into_response()
}

/// Per-action counters (the simulator's `SimStats`) as JSON: `{"total": {...}, "ops": {...}}`.
async fn stats(State(s): State<Server>) -> Response {
    let stats = s.sim.stats();
    let counters = |o: eni_operator::ec2::model::Operation| {
        let c = stats.get(o);
        serde_json::json!({
            "calls": c.calls, "throttled": c.throttled, "faults": c.faults,
            "ok": c.ok, "rejected": c.rejected,
        })
    };
    let ops: serde_json::Map<String, serde_json::Value> = stats
        .ops
        .keys()
        .map(|o| (o.name().to_owned(), counters(*o)))
        .collect();
    let t = stats.total();
    let body = serde_json::json!({
        "total": {
            "calls": t.calls, "throttled": t.throttled, "faults": t.faults,
            "ok": t.ok, "rejected": t.rejected,
        },
        "ops": ops,
    });
    let mut r = body.to_string().into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

/// Throttling buckets by name (`Bucket::name`, e.g. `create-network-interface`, or a group of
/// earlier versions such as `general-mutating`: each of its buckets).
pub fn parse_bucket(name: &str) -> Option<Vec<Bucket>> {
    Bucket::named(name)
}

/// An operation by its AWS action name.
pub fn parse_operation(name: &str) -> Option<Operation> {
    Operation::ALL.into_iter().find(|o| o.name() == name)
}

async fn set_bucket(State(s): State<Server>, RawQuery(q): RawQuery, body: Bytes) -> Response {
    let p = Params::parse(q.as_deref(), &body);
    let Some(buckets) = p.get("bucket").and_then(parse_bucket) else {
        let names = Bucket::known_names();
        return control_error(format!("bucket must be one of {names:?}"));
    };
    let (Ok(Some(burst)), Ok(Some(rate))) = (p.int("burst"), p.int("per_second")) else {
        return control_error("burst and per_second must be integers".into());
    };
    for bucket in buckets {
        s.sim
            .set_bucket(bucket, burst.max(0) as u32, rate.max(0) as u32);
    }
    StatusCode::NO_CONTENT.into_response()
}

/// `share` (0..=1) of every bucket's refill goes to another tenant of the account from now on;
/// `empty=true`: its burst takes every token left first.
async fn set_other_tenant(State(s): State<Server>, RawQuery(q): RawQuery, body: Bytes) -> Response {
    let p = Params::parse(q.as_deref(), &body);
    match p.get("share").and_then(|v| v.parse::<f64>().ok()) {
        Some(share) if (0.0..=1.0).contains(&share) => {
            s.sim.set_other_tenant_share(share);
            if p.get("empty") == Some("true") {
                s.sim.empty_buckets();
            }
            StatusCode::NO_CONTENT.into_response()
        }
        _ => control_error("share must be a number from 0 to 1".into()),
    }
}

/// Schedule another tenant's spell (see [`crate::sim::Simulator::tenant_spell`]).
async fn set_tenant_spell(State(s): State<Server>, RawQuery(q): RawQuery, body: Bytes) -> Response {
    let p = Params::parse(q.as_deref(), &body);
    let (Ok(Some(after)), Ok(Some(length))) = (p.int("after_ms"), p.int("length_ms")) else {
        return control_error("after_ms and length_ms must be integers".into());
    };
    let share = match p.get("share").map(str::parse::<f64>) {
        None => 0.9,
        Some(Ok(share)) if (0.0..=1.0).contains(&share) => share,
        Some(_) => return control_error("share must be a number from 0 to 1".into()),
    };
    let ms = |n: i64| Duration::from_millis(n.max(0) as u64);
    s.sim.tenant_spell(ms(after), ms(length), share);
    StatusCode::NO_CONTENT.into_response()
}

async fn reset_throttling(State(s): State<Server>) -> Response {
    s.sim.reset_throttling();
    StatusCode::NO_CONTENT.into_response()
}

async fn inject_fault(State(s): State<Server>, RawQuery(q): RawQuery, body: Bytes) -> Response {
    let p = Params::parse(q.as_deref(), &body);
    let Some(op) = p.get("operation").and_then(parse_operation) else {
        return control_error("operation must be an action the operator calls".into());
    };
    let code = p.get("code").unwrap_or("InternalError");
    let times = p.int("times").ok().flatten().unwrap_or(1).max(0) as usize;
    s.sim.inject_error(op, code, times);
    StatusCode::NO_CONTENT.into_response()
}
