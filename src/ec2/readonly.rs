//! The EC2 client of a shadow process (`--mode=shadow`, `eni-operator plan`): every describe
//! passes through to the wrapped (gated) client; every mutating call is refused before it leaves
//! the process, counted, and logged as an error. Shadow mode is this type, not a flag checked in
//! each step: code that reaches a mutating call with it cannot change anything in AWS.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::layer::{Layered, MutationGuard};
use super::{Ec2Error, ErrorKind, Operation, Result};

/// The error code of a refused mutating call.
pub const REFUSED_CODE: &str = "ShadowModeReadOnly";

/// Describes only.
pub type ReadOnlyEc2<E> = Layered<E, Refuse>;

/// Refuses every mutating call (and, as the read-only sink's layer, every write), and counts
/// them. Cheap to share: the count is behind an `Arc`.
#[derive(Debug, Default)]
pub struct Refuse {
    refused: Arc<AtomicU64>,
}

impl Refuse {
    /// Count one refusal.
    pub fn count(&self) {
        self.refused.fetch_add(1, Ordering::Relaxed);
    }

    /// Refusals so far (a shadow that works as designed keeps this at 0).
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// A handle on the refusal count, for the metrics.
    pub fn counter(&self) -> Arc<AtomicU64> {
        self.refused.clone()
    }
}

impl MutationGuard for Refuse {
    async fn before(&self, operation: Operation) -> Result<()> {
        self.count();
        tracing::error!(%operation, "shadow mode: mutating EC2 call refused");
        Err(Ec2Error::new(
            operation,
            ErrorKind::Unauthorized,
            REFUSED_CODE,
            "a shadow process makes no mutating EC2 call",
        ))
    }
}

impl<E> ReadOnlyEc2<E> {
    pub fn read_only(inner: E) -> Self {
        Self::new(inner, Refuse::default())
    }

    /// Mutating calls refused so far.
    pub fn refused(&self) -> u64 {
        self.layer().refused()
    }

    /// A handle on the refusal count, for the metrics.
    pub fn refused_counter(&self) -> Arc<AtomicU64> {
        self.layer().counter()
    }
}
