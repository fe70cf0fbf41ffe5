//! The [`NodeSink`] of a shadow process: reads (`node_exists`, `fetch`) pass through to the
//! wrapped sink; every write (patch, finalizer, annotation, delete) and every Event is refused
//! before it leaves the process, counted, and logged as an error. With [`ReadOnlyEc2`] this is
//! what makes a process a shadow: the pass code cannot write through these types.
//!
//! [`ReadOnlyEc2`]: crate::ec2::readonly::ReadOnlyEc2

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use crate::ec2::readonly::Refuse;

use super::sink_layer::{LayeredSink, Write, WriteGuard};
use crate::k8s::sink::{SinkError, SinkResult};

/// Reads only.
pub type ReadOnlySink<S> = LayeredSink<Arc<S>, Refuse>;

impl WriteGuard for Refuse {
    async fn before(&self, write: Write<'_>) -> SinkResult<()> {
        self.count();
        let (node, what) = (write.node(), write.what());
        tracing::error!(node, what, "shadow mode: Kubernetes write refused");
        Err(SinkError::Other(format!(
            "shadow mode: {what} refused (a shadow writes nothing)"
        )))
    }
}

impl<S> ReadOnlySink<S> {
    pub fn read_only(inner: Arc<S>) -> Self {
        Self::new(inner, Refuse::default())
    }

    /// Writes and Events refused so far.
    pub fn refused(&self) -> u64 {
        self.layer().refused()
    }

    pub fn refused_counter(&self) -> Arc<AtomicU64> {
        self.layer().counter()
    }
}
