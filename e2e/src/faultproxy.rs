//! A fault-injecting HTTP proxy in front of the EC2 endpoint, so scenarios can make EC2 fail
//! (moto and LocalStack never do) without any fault hook in the operator's binary: the operator
//! under test gets the proxy's URL as its EC2 endpoint.
//!
//! EC2 speaks the Query protocol: every call is a form-encoded POST whose `Action` names the
//! operation. The proxy answers the next N calls of an action with an EC2 error document (the
//! `<Response><Errors><Error>` format of the EC2 API reference, "Error codes") and forwards
//! everything else unchanged, Host header and signature included (emulators do not check
//! signatures).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result};
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::net::TcpListener;

/// The largest request body the proxy reads (EC2 requests are small).
const MAX_BODY: usize = 16 << 20;

/// An error to answer instead of forwarding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fault {
    pub status: u16,
    pub code: String,
    pub message: String,
}

impl Fault {
    /// A client error the operator must not retry (HTTP 400, like EC2's validation errors).
    pub fn refused(code: &str) -> Self {
        Self {
            status: 400,
            code: code.to_owned(),
            message: "injected by the e2e fault proxy".to_owned(),
        }
    }

    fn response(&self) -> Response {
        let xml = format!(
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Response><Errors><Error><Code>{}</Code>\
             <Message>{}</Message></Error></Errors><RequestID>e2e-fault-proxy</RequestID></Response>",
            self.code, self.message
        );
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::BAD_REQUEST);
        (
            status,
            [(header::CONTENT_TYPE, "text/xml;charset=UTF-8")],
            xml,
        )
            .into_response()
    }
}

#[derive(Default)]
struct Counts {
    /// Action -> faults still to inject.
    pending: BTreeMap<String, Vec<Fault>>,
    injected: BTreeMap<String, usize>,
    forwarded: BTreeMap<String, usize>,
}

struct Shared {
    upstream: Uri,
    client: Client<HttpConnector, Full<Bytes>>,
    counts: Mutex<Counts>,
}

/// A running proxy; stops when dropped.
pub struct FaultProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The `Action` of a Query-protocol request (form body, or the query string of a GET).
pub fn action_of(query: Option<&str>, body: &[u8]) -> Option<String> {
    let from = |raw: &[u8]| {
        form_pairs(raw)
            .into_iter()
            .find(|(k, _)| k == "Action")
            .map(|(_, v)| v)
    };
    from(body).or_else(|| query.and_then(|q| from(q.as_bytes())))
}

/// `a=b&c=d` pairs; action names need no percent-decoding beyond `+`.
fn form_pairs(raw: &[u8]) -> Vec<(String, String)> {
    String::from_utf8_lossy(raw)
        .split('&')
        .filter_map(|pair| {
            let (k, v) = pair.split_once('=')?;
            Some((k.replace('+', " "), v.replace('+', " ")))
        })
        .collect()
}

impl FaultProxy {
    /// Listen on a free loopback port and forward to `upstream` (`http://host:port`).
    pub async fn start(upstream: &str) -> Result<Self> {
        let upstream: Uri = upstream
            .parse()
            .with_context(|| format!("EC2 endpoint {upstream:?} is not a URL"))?;
        anyhow::ensure!(
            upstream.scheme_str() == Some("http"),
            "the fault proxy forwards to plain http endpoints only (emulators), not {upstream}"
        );
        let shared = Arc::new(Shared {
            upstream,
            client: Client::builder(TokioExecutor::new()).build_http(),
            counts: Mutex::new(Counts::default()),
        });
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let app = Router::new().fallback(handle).with_state(shared.clone());
        let task = tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                tracing::warn!(error = %e, "fault proxy stopped");
            }
        });
        Ok(Self { addr, shared, task })
    }

    /// The URL to give the operator as its EC2 endpoint.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Answer the next `times` calls of `action` with `fault`.
    pub fn fail_next(&self, action: &str, times: usize, fault: Fault) {
        let mut c = self.shared.counts.lock().expect("poisoned");
        c.pending
            .entry(action.to_owned())
            .or_default()
            .extend(std::iter::repeat_n(fault, times));
    }

    /// Calls of `action` answered with an injected fault so far.
    pub fn injected(&self, action: &str) -> usize {
        let c = self.shared.counts.lock().expect("poisoned");
        c.injected.get(action).copied().unwrap_or(0)
    }

    /// Every action forwarded so far, with its count.
    pub fn forwarded_all(&self) -> BTreeMap<String, usize> {
        let c = self.shared.counts.lock().expect("poisoned");
        c.forwarded.clone()
    }

    /// Calls of `action` forwarded so far.
    pub fn forwarded(&self, action: &str) -> usize {
        let c = self.shared.counts.lock().expect("poisoned");
        c.forwarded.get(action).copied().unwrap_or(0)
    }
}

async fn handle(State(shared): State<Arc<Shared>>, req: Request) -> Response {
    let (mut parts, body) = req.into_parts();
    let body = match axum::body::to_bytes(body, MAX_BODY).await {
        Ok(b) => b,
        Err(e) => return (StatusCode::BAD_REQUEST, e.to_string()).into_response(),
    };
    let action = action_of(parts.uri.query(), &body).unwrap_or_default();
    let fault = {
        let mut c = shared.counts.lock().expect("poisoned");
        let fault = c.pending.get_mut(&action).and_then(|q| {
            if q.is_empty() {
                None
            } else {
                Some(q.remove(0))
            }
        });
        let counter = if fault.is_some() {
            &mut c.injected
        } else {
            &mut c.forwarded
        };
        *counter.entry(action.clone()).or_default() += 1;
        fault
    };
    if let Some(f) = fault {
        tracing::info!(%action, code = %f.code, "fault proxy: injected an error");
        return f.response();
    }
    let path = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    let mut target = shared.upstream.clone().into_parts();
    target.path_and_query = match path.parse() {
        Ok(p) => Some(p),
        Err(e) => return (StatusCode::BAD_REQUEST, e.to_string()).into_response(),
    };
    parts.uri = match Uri::from_parts(target) {
        Ok(u) => u,
        Err(e) => return (StatusCode::BAD_REQUEST, e.to_string()).into_response(),
    };
    let forwarded = axum::http::Request::from_parts(parts, Full::new(body));
    match shared.client.request(forwarded).await {
        Ok(resp) => resp.map(Body::new),
        Err(e) => (
            StatusCode::BAD_GATEWAY,
            format!("fault proxy: upstream failed: {e}"),
        )
            .into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_action_in_the_form_body_or_the_query() {
        assert_eq!(
            action_of(None, b"Action=AttachNetworkInterface&Version=2016-11-15").as_deref(),
            Some("AttachNetworkInterface")
        );
        assert_eq!(
            action_of(Some("Action=DescribeVpcs&Version=2016-11-15"), b"").as_deref(),
            Some("DescribeVpcs")
        );
        assert_eq!(action_of(None, b"Version=2016-11-15"), None);
    }

    /// moto's `moto_server`, killed on drop (`ENI_OPERATOR_MOTO_SERVER`, else `.venv`).
    struct Moto(std::process::Child, String);

    impl Drop for Moto {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    async fn moto() -> Moto {
        let bin = std::env::var_os("ENI_OPERATOR_MOTO_SERVER")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| {
                std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                    .join("../.venv/bin/moto_server")
            });
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let child = std::process::Command::new(&bin)
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start moto ({}): {e}; run `make venv` or set ENI_OPERATOR_MOTO_SERVER",
                    bin.display()
                )
            });
        let m = Moto(child, format!("http://127.0.0.1:{port}"));
        for _ in 0..300 {
            if tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
            {
                return m;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        panic!("moto did not start answering on port {port}");
    }

    #[tokio::test]
    async fn injects_the_next_n_calls_of_an_action_and_forwards_the_rest_to_moto() {
        let moto = moto().await;
        let proxy = FaultProxy::start(&moto.1).await.unwrap();
        let ec2 = crate::ec2seed::client(&crate::ec2seed::Ec2Target {
            endpoint: proxy.url(),
            region: "us-east-1".into(),
        })
        .await;
        ec2.describe_vpcs().send().await.expect("forwarded to moto");
        assert_eq!(proxy.forwarded("DescribeVpcs"), 1);

        proxy.fail_next(
            "AttachNetworkInterface",
            1,
            Fault::refused("InvalidParameterValue"),
        );
        let attach = || {
            ec2.attach_network_interface()
                .network_interface_id("eni-12345678")
                .instance_id("i-12345678")
                .device_index(1)
                .send()
        };
        let err = attach().await.unwrap_err();
        let meta = aws_sdk_ec2::error::ProvideErrorMetadata::meta(&err);
        assert_eq!(meta.code(), Some("InvalidParameterValue"));
        assert_eq!(meta.message(), Some("injected by the e2e fault proxy"));
        // The next one reaches moto, which knows no such ENI.
        let err = attach().await.unwrap_err();
        let meta = aws_sdk_ec2::error::ProvideErrorMetadata::meta(&err);
        assert_ne!(meta.message(), Some("injected by the e2e fault proxy"));
        assert_eq!(
            (
                proxy.injected("AttachNetworkInterface"),
                proxy.forwarded("AttachNetworkInterface")
            ),
            (1, 1)
        );
    }
}
