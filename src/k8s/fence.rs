//! Fencing per call (docs/rules.md §14.2): right before each mutating EC2 call and each
//! CiliumNode write, the process checks on the monotonic clock that its lease is still valid,
//! with margin; otherwise the call is not made. The elector grants the fence at the *start* of
//! each successful renewal, for the renew deadline (10 s of a 15 s lease): another replica can
//! take the lease only a lease duration after it saw our last renewal, which it cannot have seen
//! before we sent it.
//!
//! Why per call: the elector drops the leader's work at its renew deadline, but after a freeze
//! longer than the lease (SIGSTOP, a cgroup freeze, a VM pause) every timer fires at once, and a
//! task may send a call it planned before the freeze before the elector has run. The checks sit
//! in wrappers every call passes ([`Fenced`] inside the gate, so each retry is checked too;
//! [`FencedSink`] around the sink), not in the steps that make the calls.

use std::sync::{Arc, Mutex};

use tokio::time::Instant;

use crate::ec2::layer::{Layered, MutationGuard};
use crate::ec2::{Ec2Error, ErrorKind, Operation, Result};

use super::sink_layer::{LayeredSink, Write, WriteGuard};
use crate::k8s::sink::{SinkError, SinkResult};

/// The error code of a call the fence stopped (never sent to EC2).
pub const LEASE_EXPIRED: &str = "LeaseExpired";

/// Until when this process may make mutating calls. Cheap to clone (a handle).
#[derive(Clone, Debug)]
pub struct Fence {
    /// `None` in `until`: closed. `open`: no election, always valid.
    until: Arc<Mutex<Option<Instant>>>,
    open: bool,
}

impl Fence {
    /// Always valid: a process that runs without leader election.
    pub fn open() -> Self {
        Self {
            until: Arc::default(),
            open: true,
        }
    }

    /// Closed until the elector grants it.
    pub fn closed() -> Self {
        Self {
            until: Arc::default(),
            open: false,
        }
    }

    /// Valid until `until` (a renewal that started at `until` - renew deadline succeeded).
    pub fn grant(&self, until: Instant) {
        let mut u = self.until.lock().expect("fence");
        *u = Some(u.map_or(until, |t| t.max(until)));
    }

    /// No longer valid (leadership lost or given up).
    pub fn revoke(&self) {
        *self.until.lock().expect("fence") = None;
    }

    /// Whether a mutating call may be made now.
    pub fn valid(&self) -> bool {
        if self.open || crate::mutants::active("no-fence") {
            return true;
        }
        self.until
            .lock()
            .expect("fence")
            .is_some_and(|until| Instant::now() < until)
    }

    fn check(&self, op: Operation) -> Result<()> {
        if self.valid() {
            return Ok(());
        }
        Err(Ec2Error::new(
            op,
            ErrorKind::Other,
            LEASE_EXPIRED,
            "not sent: this process's lease may have expired",
        ))
    }

    fn check_write(&self) -> SinkResult<()> {
        if self.valid() {
            return Ok(());
        }
        Err(SinkError::Other(format!(
            "{LEASE_EXPIRED}: not sent: this process's lease may have expired"
        )))
    }
}

/// An EC2 client whose mutating calls pass the [`Fence`] (describes do not need it).
pub type Fenced<E> = Layered<E, Fence>;

impl MutationGuard for Fence {
    async fn before(&self, operation: Operation) -> Result<()> {
        self.check(operation)
    }
}

/// A sink whose writes (patches, finalizer, annotation, delete, Events) pass the [`Fence`];
/// reads do not need it.
pub type FencedSink<S> = LayeredSink<S, Fence>;

impl WriteGuard for Fence {
    async fn before(&self, _: Write<'_>) -> SinkResult<()> {
        self.check_write()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_fence_is_valid_until_its_grant_and_never_after_a_revoke() {
        let fence = Fence::closed();
        assert!(!fence.valid(), "closed until granted");
        fence.grant(Instant::now() + Duration::from_secs(10));
        assert!(fence.valid());
        tokio::time::advance(Duration::from_secs(10)).await;
        assert!(!fence.valid(), "expired at its end");
        fence.grant(Instant::now() + Duration::from_secs(10));
        fence.revoke();
        assert!(!fence.valid(), "revoked");
        assert!(Fence::open().valid());
    }
}
