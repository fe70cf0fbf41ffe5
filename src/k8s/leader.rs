//! Leader election on a `coordination.k8s.io/v1` Lease (client-go's algorithm).
//!
//! Why our own: kube-lease-manager 0.13 has no renew deadline (a leader whose renewals fail
//! keeps believing it leads) and measures expiry on the wall clock of the holder's record. Here:
//! * expiry is judged by when *this* replica last saw the record change (local monotonic
//!   time), so clock skew between replicas does not matter;
//! * a leader that has not renewed within the renew deadline (< lease duration) gives up at
//!   once: [`Elector::run`] drops the work future, which aborts every mutating task, before
//!   any other replica can consider the lease expired.
//!
//! The Lease itself is behind [`LeaseLock`], so tests race electors on an in-memory Lease
//! (`testkit::lease::MemoryLease`).

use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, ObjectMeta, PostParams};
use tokio::time::Instant;
use tracing::{info, warn};

use crate::k8s::fence::Fence;

/// What the Lease says.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LeaseRecord {
    pub holder: Option<String>,
    pub lease_duration_seconds: i32,
    pub transitions: i32,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LeaseError {
    /// Someone else wrote the Lease first.
    #[error("conflict")]
    Conflict,
    #[error("{0}")]
    Other(String),
}

/// Storage of the Lease, with optimistic concurrency on an opaque version.
pub trait LeaseLock: Send + Sync + 'static {
    fn get(&self)
    -> impl Future<Output = Result<Option<(LeaseRecord, String)>, LeaseError>> + Send;
    fn create(&self, record: &LeaseRecord) -> impl Future<Output = Result<(), LeaseError>> + Send;
    /// Replace the record if it is still at `version`.
    fn update(
        &self,
        record: &LeaseRecord,
        version: &str,
    ) -> impl Future<Output = Result<(), LeaseError>> + Send;
}

#[derive(Clone, Debug)]
pub struct LeaderConfig {
    pub identity: String,
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
}

impl LeaderConfig {
    pub fn new(identity: impl Into<String>) -> Self {
        Self {
            identity: identity.into(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

/// The Lease's `leaseDurationSeconds` (whole seconds, an int32) for `d`: rounded up, so that
/// another replica never waits less than this one's fence trusts (2.5 s written as 2 s let it
/// take the lease while our fence, 2.4 s, still let calls out), and saturated (never wrapping
/// to a negative or short value).
pub fn whole_seconds_up(d: Duration) -> i32 {
    let secs = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    i32::try_from(secs).unwrap_or(i32::MAX)
}

/// Leadership was lost (or could not be renewed in time).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("leadership lost: the lease could not be renewed within the renew deadline")]
pub struct LeadershipLost;

pub struct Elector<L> {
    lock: L,
    config: LeaderConfig,
    /// Granted at the start of each successful renewal, for the renew deadline (§14.2).
    fence: Fence,
    /// When the last successful acquisition or renewal started.
    renewed_from: Option<Instant>,
    /// The record version last seen and when it was first seen.
    observed: Option<(String, Instant)>,
}

impl<L: LeaseLock> Elector<L> {
    pub fn new(lock: L, config: LeaderConfig) -> Self {
        assert!(
            config.renew_deadline < config.lease_duration,
            "the renew deadline must be shorter than the lease"
        );
        Self {
            lock,
            config,
            fence: Fence::closed(),
            renewed_from: None,
            observed: None,
        }
    }

    /// Grant `fence` (the one this process's EC2 client and sink check, §14.2) while leading.
    pub fn with_fence(mut self, fence: Fence) -> Self {
        self.fence = fence;
        self
    }

    /// This process's lease, as every mutating call checks it.
    pub fn fence(&self) -> Fence {
        self.fence.clone()
    }

    pub fn lock(&self) -> &L {
        &self.lock
    }

    /// One attempt: take the lease if free or expired, renew it if ours.
    pub async fn try_acquire_or_renew(&mut self) -> Result<bool, LeaseError> {
        let now = Instant::now();
        let me = self.config.identity.clone();
        let mine = |transitions| LeaseRecord {
            holder: Some(me.clone()),
            lease_duration_seconds: whole_seconds_up(self.config.lease_duration),
            transitions,
        };
        // Valid from the *start* of the request: a competitor may count the lease duration from
        // any moment after it, never from before.
        let valid_until = now + self.config.renew_deadline;
        let Some((record, version)) = self.lock.get().await? else {
            self.lock.create(&mine(0)).await?;
            self.renewed_from = Some(now);
            self.fence.grant(valid_until);
            return Ok(true);
        };
        if self.observed.as_ref().is_none_or(|(v, _)| *v != version) {
            self.observed = Some((version.clone(), now));
        }
        let seen_at = self.observed.as_ref().map(|(_, t)| *t).unwrap_or(now);
        let duration = Duration::from_secs(record.lease_duration_seconds.max(1) as u64);
        let held_by_other = record
            .holder
            .as_ref()
            .is_some_and(|h| !h.is_empty() && *h != me);
        if held_by_other && now < seen_at + duration {
            return Ok(false);
        }
        let transitions = if held_by_other || record.holder.is_none() {
            record.transitions + 1
        } else {
            record.transitions
        };
        self.lock.update(&mine(transitions), &version).await?;
        self.renewed_from = Some(now);
        self.fence.grant(valid_until);
        Ok(true)
    }

    /// Wait until this replica leads.
    pub async fn acquire(&mut self) {
        loop {
            match self.try_acquire_or_renew().await {
                Ok(true) => {
                    info!(identity = %self.config.identity, "became leader");
                    return;
                }
                Ok(false) | Err(LeaseError::Conflict) => {}
                Err(e) => warn!(error = %e, "leader election: lease unavailable"),
            }
            tokio::time::sleep(self.config.retry_period).await;
        }
    }

    /// Renew every retry period; return as soon as the renew deadline passes without a
    /// successful renewal (or the lease is someone else's).
    pub async fn hold(&mut self) -> LeadershipLost {
        let lost = self.renew_until_lost().await;
        self.fence.revoke();
        lost
    }

    async fn renew_until_lost(&mut self) -> LeadershipLost {
        // When the last successful renewal *started* (the lease runs from then, at the latest).
        let mut last_ok = self.renewed_from.unwrap_or_else(Instant::now);
        loop {
            tokio::time::sleep(self.config.retry_period).await;
            let deadline = last_ok + self.config.renew_deadline;
            let attempt = Instant::now();
            let left = deadline.saturating_duration_since(attempt);
            match tokio::time::timeout(left, self.try_acquire_or_renew()).await {
                Ok(Ok(true)) => last_ok = self.renewed_from.unwrap_or(attempt),
                Ok(Ok(false)) => return LeadershipLost,
                Ok(Err(e)) => warn!(error = %e, "lease renewal failed"),
                Err(_) => return LeadershipLost,
            }
            if Instant::now() >= last_ok + self.config.renew_deadline {
                return LeadershipLost;
            }
        }
    }

    /// Give the lease up (on shutdown), so a standby takes over without waiting.
    pub async fn release(&mut self) {
        self.fence.revoke();
        if let Ok(Some((record, version))) = self.lock.get().await
            && record.holder.as_deref() == Some(self.config.identity.as_str())
        {
            let free = LeaseRecord {
                holder: None,
                ..record
            };
            let _ = self.lock.update(&free, &version).await;
        }
    }

    /// Acquire, then run `work` while holding the lease. Losing the lease drops `work` at once
    /// (aborting everything it owns) and returns `Err(LeadershipLost)`.
    pub async fn run<T>(&mut self, work: impl Future<Output = T>) -> Result<T, LeadershipLost> {
        self.acquire().await;
        // `biased`: a lost lease wins a tie (and a simulation replays the same choice).
        let out = tokio::select! {
            biased;
            lost = self.hold() => Err(lost),
            out = work => Ok(out),
        };
        if out.is_ok() {
            self.release().await;
        }
        out
    }
}

// ---------------------------------------------------------------------------------------------

/// The Lease on the API server.
#[derive(Clone)]
pub struct KubeLease {
    api: Api<Lease>,
    name: String,
}

impl KubeLease {
    pub fn new(client: kube::Client, namespace: &str, name: impl Into<String>) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            name: name.into(),
        }
    }
}

fn kube_err(e: kube::Error) -> LeaseError {
    match &e {
        kube::Error::Api(s) if s.code == 409 => LeaseError::Conflict,
        _ => LeaseError::Other(e.to_string()),
    }
}

impl KubeLease {
    fn to_lease(&self, record: &LeaseRecord, version: Option<&str>) -> Lease {
        let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
        Lease {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                resource_version: version.map(str::to_string),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: record.holder.clone(),
                lease_duration_seconds: Some(record.lease_duration_seconds),
                lease_transitions: Some(record.transitions),
                renew_time: Some(now.clone()),
                acquire_time: Some(now),
                ..Default::default()
            }),
        }
    }
}

impl LeaseLock for KubeLease {
    async fn get(&self) -> Result<Option<(LeaseRecord, String)>, LeaseError> {
        let Some(lease) = self.api.get_opt(&self.name).await.map_err(kube_err)? else {
            return Ok(None);
        };
        let spec = lease.spec.unwrap_or_default();
        let record = LeaseRecord {
            holder: spec.holder_identity.filter(|h| !h.is_empty()),
            lease_duration_seconds: spec.lease_duration_seconds.unwrap_or(15),
            transitions: spec.lease_transitions.unwrap_or(0),
        };
        Ok(Some((
            record,
            lease.metadata.resource_version.unwrap_or_default(),
        )))
    }

    async fn create(&self, record: &LeaseRecord) -> Result<(), LeaseError> {
        self.api
            .create(&PostParams::default(), &self.to_lease(record, None))
            .await
            .map(|_| ())
            .map_err(kube_err)
    }

    async fn update(&self, record: &LeaseRecord, version: &str) -> Result<(), LeaseError> {
        self.api
            .replace(
                &self.name,
                &PostParams::default(),
                &self.to_lease(record, Some(version)),
            )
            .await
            .map(|_| ())
            .map_err(kube_err)
    }
}
