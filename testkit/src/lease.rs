//! A Lease in memory: the [`LeaseLock`] the leader-election tests race electors on.

use std::sync::Mutex;

use eni_operator::k8s::leader::{LeaseError, LeaseLock, LeaseRecord};

/// A Lease in memory, shared by electors in tests. `partition(id)` makes calls from that
/// identity fail (as if its API server connection broke).
#[derive(Debug, Default)]
pub struct MemoryLease {
    state: Mutex<MemoryLeaseState>,
}

#[derive(Debug, Default)]
struct MemoryLeaseState {
    record: Option<LeaseRecord>,
    version: u64,
    partitioned: Vec<String>,
}

impl MemoryLease {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn holder(&self) -> Option<String> {
        self.state
            .lock()
            .expect("lease")
            .record
            .as_ref()
            .and_then(|r| r.holder.clone())
    }

    pub fn partition(&self, identity: &str, cut: bool) {
        let mut s = self.state.lock().expect("lease");
        s.partitioned.retain(|i| i != identity);
        if cut {
            s.partitioned.push(identity.to_string());
        }
    }
}

/// One identity's handle on a [`MemoryLease`].
#[derive(Clone, Debug)]
pub struct MemoryLeaseClient {
    pub lease: std::sync::Arc<MemoryLease>,
    pub identity: String,
}

impl MemoryLeaseClient {
    fn check(&self) -> Result<std::sync::MutexGuard<'_, MemoryLeaseState>, LeaseError> {
        let s = self.lease.state.lock().expect("lease");
        if s.partitioned.contains(&self.identity) {
            return Err(LeaseError::Other("partitioned".into()));
        }
        Ok(s)
    }
}

impl LeaseLock for MemoryLeaseClient {
    async fn get(&self) -> Result<Option<(LeaseRecord, String)>, LeaseError> {
        let s = self.check()?;
        Ok(s.record.clone().map(|r| (r, s.version.to_string())))
    }

    async fn create(&self, record: &LeaseRecord) -> Result<(), LeaseError> {
        let mut s = self.check()?;
        if s.record.is_some() {
            return Err(LeaseError::Conflict);
        }
        s.record = Some(record.clone());
        s.version += 1;
        Ok(())
    }

    async fn update(&self, record: &LeaseRecord, version: &str) -> Result<(), LeaseError> {
        let mut s = self.check()?;
        if s.version.to_string() != version {
            return Err(LeaseError::Conflict);
        }
        s.record = Some(record.clone());
        s.version += 1;
        Ok(())
    }
}
