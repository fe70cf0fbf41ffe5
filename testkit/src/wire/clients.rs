//! Who called what: ec2-sim's record per client, so a test with two allocators on one account
//! (ours and Cilium's operator, a shadow beside a serving allocator, a handover) can tell their
//! calls apart, as CloudTrail does on AWS (`userIdentity.accessKeyId`, `userAgent`).
//!
//! A client is the access key ID of the request's SigV4 `Authorization` header
//! (`AWS4-HMAC-SHA256 Credential=AKID/date/region/ec2/aws4_request, ...`); unsigned requests
//! are `anonymous`. Every answered EC2 action is counted per client; every mutating one is also
//! kept as an entry (when, who, which action, its answer, and the instance it touched: named by
//! the call, or the one the ENI was attached to when the call came), so that "never two
//! allocators mutating one node within a minute" can be checked after the fact.
//! `GET /_sim/clients` answers both as JSON; `POST /_sim/clients/reset` clears them.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Instant;

use axum::http::HeaderMap;
use serde::{Deserialize, Serialize};

/// The client of a request: its SigV4 access key ID.
pub fn client_of(headers: &HeaderMap) -> String {
    headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|a| a.split("Credential=").nth(1))
        .and_then(|c| c.split('/').next())
        .filter(|k| !k.is_empty())
        .unwrap_or("anonymous")
        .to_owned()
}

/// One mutating call as answered.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct MutatingCall {
    /// Milliseconds since ec2-sim started.
    pub at_ms: u64,
    pub client: String,
    pub action: String,
    /// `ok` or the error code.
    pub answer: String,
    /// The instance the call touched, when it names one or its ENI was attached to one.
    pub instance: Option<String>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Counts {
    pub calls: u64,
    pub ok: u64,
    pub errors: u64,
}

#[derive(Debug)]
pub struct ClientLog {
    started: Instant,
    inner: Mutex<Record>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Record {
    /// client -> action -> counts.
    pub clients: BTreeMap<String, BTreeMap<String, Counts>>,
    pub mutating: Vec<MutatingCall>,
}

impl Default for ClientLog {
    fn default() -> Self {
        Self {
            started: Instant::now(),
            inner: Mutex::new(Record::default()),
        }
    }
}

/// The EC2 actions that change something (the seeding ones are not the allocators').
pub fn is_mutating(action: &str) -> bool {
    matches!(
        action,
        "CreateNetworkInterface"
            | "AttachNetworkInterface"
            | "ModifyNetworkInterfaceAttribute"
            | "AssignPrivateIpAddresses"
            | "UnassignPrivateIpAddresses"
            | "DetachNetworkInterface"
            | "DeleteNetworkInterface"
            | "AssociateAddress"
            | "DisassociateAddress"
    )
}

impl ClientLog {
    pub fn record(&self, client: &str, action: &str, answer: &str, instance: Option<String>) {
        let mut r = self.inner.lock().expect("client log");
        let c = r
            .clients
            .entry(client.to_owned())
            .or_default()
            .entry(action.to_owned())
            .or_default();
        c.calls += 1;
        if answer == "ok" {
            c.ok += 1;
        } else {
            c.errors += 1;
        }
        if is_mutating(action) {
            let at_ms = self.started.elapsed().as_millis() as u64;
            r.mutating.push(MutatingCall {
                at_ms,
                client: client.to_owned(),
                action: action.to_owned(),
                answer: answer.to_owned(),
                instance,
            });
        }
    }

    pub fn snapshot(&self) -> Record {
        self.inner.lock().expect("client log").clone()
    }

    pub fn reset(&self) {
        *self.inner.lock().expect("client log") = Record::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_client_is_the_sigv4_access_key_and_mutating_calls_are_kept() {
        let mut h = HeaderMap::new();
        assert_eq!(client_of(&h), "anonymous");
        h.insert(
            axum::http::header::AUTHORIZATION,
            "AWS4-HMAC-SHA256 Credential=AKIDCILIUM/20260101/us-east-1/ec2/aws4_request, SignedHeaders=host, Signature=x"
                .parse()
                .unwrap(),
        );
        assert_eq!(client_of(&h), "AKIDCILIUM");
        let log = ClientLog::default();
        log.record("a", "DescribeSubnets", "ok", None);
        log.record("a", "AssignPrivateIpAddresses", "ok", Some("i-1".into()));
        log.record(
            "b",
            "AssignPrivateIpAddresses",
            "InvalidParameterValue",
            None,
        );
        let r = log.snapshot();
        assert_eq!(r.clients["a"]["DescribeSubnets"].calls, 1);
        assert_eq!(r.clients["b"]["AssignPrivateIpAddresses"].errors, 1);
        assert_eq!(r.mutating.len(), 2);
        assert_eq!(r.mutating[0].instance.as_deref(), Some("i-1"));
        log.reset();
        assert!(log.snapshot().mutating.is_empty());
    }
}
