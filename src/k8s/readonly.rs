//! The [`NodeSink`] of a shadow process: reads (`node_exists`, `fetch`) pass through to the
//! wrapped sink; every write (patch, finalizer, annotation, delete) and every Event is refused
//! before it leaves the process, counted, and logged as an error. With [`ReadOnlyEc2`] this is
//! what makes a process a shadow: the pass code cannot write through these types.
//!
//! [`ReadOnlyEc2`]: crate::ec2::readonly::ReadOnlyEc2

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::crd::CiliumNode;
use crate::ipam::ChangeSet;

use crate::k8s::sink::{NodeEvent, NodeRef, NodeSink, SinkError, SinkResult};

#[derive(Debug)]
pub struct ReadOnlySink<S> {
    inner: Arc<S>,
    refused: Arc<AtomicU64>,
}

impl<S: NodeSink> ReadOnlySink<S> {
    pub fn new(inner: Arc<S>) -> Self {
        Self {
            inner,
            refused: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Writes and Events refused so far (a shadow that works as designed keeps this at 0).
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    pub fn refused_counter(&self) -> Arc<AtomicU64> {
        self.refused.clone()
    }

    fn refuse<T>(&self, what: &str, node: &str) -> SinkResult<T> {
        self.refused.fetch_add(1, Ordering::Relaxed);
        tracing::error!(node, what, "shadow mode: Kubernetes write refused");
        Err(SinkError::Other(format!(
            "shadow mode: {what} refused (a shadow writes nothing)"
        )))
    }
}

impl<S: NodeSink> NodeSink for ReadOnlySink<S> {
    async fn apply(&self, node: &NodeRef, _: &ChangeSet) -> SinkResult<Option<CiliumNode>> {
        self.refuse("CiliumNode patch", &node.name)
    }

    async fn event(&self, node: &NodeRef, _: NodeEvent) {
        let _ = self.refuse::<()>("Event", &node.name);
    }

    async fn set_finalizer(&self, node: &NodeRef, _: bool) -> SinkResult<Option<CiliumNode>> {
        self.refuse("finalizer change", &node.name)
    }

    async fn set_annotation(
        &self,
        node: &NodeRef,
        _: &str,
        _: Option<&str>,
    ) -> SinkResult<Option<CiliumNode>> {
        self.refuse("annotation change", &node.name)
    }

    async fn delete(&self, name: &str) -> SinkResult<()> {
        self.refuse("CiliumNode delete", name)
    }

    async fn node_exists(&self, name: &str) -> SinkResult<bool> {
        self.inner.node_exists(name).await
    }

    async fn fetch(&self, name: &str) -> SinkResult<Option<CiliumNode>> {
        self.inner.fetch(name).await
    }
}
