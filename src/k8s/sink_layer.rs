//! The one forwarder of the [`NodeSink`] trait. What sits between the core and the API server
//! (the leader's fence, a shadow's refusal, the simulation's observers) is a [`SinkLayer`]: it
//! is told of each write and makes it (or not). Reads (`node_exists`, `fetch`) pass untouched.
//! The same pattern as the EC2 port's (`ec2::layer`).

use std::future::Future;
use std::pin::Pin;

use crate::ipam::ChangeSet;

use super::sink::{NodeEvent, NodeRef, NodeSink, SinkResult, Written};

/// One write of the [`NodeSink`] trait, as a layer sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Write<'a> {
    /// `apply`: a change set's patches.
    Patch(&'a NodeRef),
    Event(&'a NodeRef),
    Finalizer(&'a NodeRef),
    Annotation(&'a NodeRef),
    /// `delete`, by name.
    Delete(&'a str),
}

impl Write<'_> {
    /// The CiliumNode written.
    pub fn node(&self) -> &str {
        match self {
            Self::Patch(n) | Self::Event(n) | Self::Finalizer(n) | Self::Annotation(n) => &n.name,
            Self::Delete(name) => name,
        }
    }

    /// What is written, for a log line or an error.
    pub fn what(&self) -> &'static str {
        match self {
            Self::Patch(_) => "CiliumNode patch",
            Self::Event(_) => "Event",
            Self::Finalizer(_) => "finalizer change",
            Self::Annotation(_) => "annotation change",
            Self::Delete(_) => "CiliumNode delete",
        }
    }
}

/// One write, boxed and not yet started: layers see every write as the same type.
pub type Pending<'a, T> = Pin<Box<dyn Future<Output = SinkResult<T>> + Send + 'a>>;

/// What runs around each write of a [`LayeredSink`]. A layer that refuses the write does not
/// await `send` (nothing is sent before it is); an Event it refuses is dropped (Events have no
/// answer).
pub trait SinkLayer: Send + Sync + 'static {
    fn around<'a, T: Send + 'a>(
        &'a self,
        write: Write<'a>,
        send: Pending<'a, T>,
    ) -> impl Future<Output = SinkResult<T>> + Send + 'a;
}

/// The common layer: a check before each write, which is not made when it refuses.
pub trait WriteGuard: Send + Sync + 'static {
    fn before(&self, write: Write<'_>) -> impl Future<Output = SinkResult<()>> + Send;
}

impl<G: WriteGuard> SinkLayer for G {
    async fn around<'a, T: Send + 'a>(
        &'a self,
        write: Write<'a>,
        send: Pending<'a, T>,
    ) -> SinkResult<T> {
        self.before(write).await?;
        send.await
    }
}

/// `inner` behind `layer`: a [`NodeSink`] again, so layers stack.
pub struct LayeredSink<S, L> {
    inner: S,
    layer: L,
}

impl<S, L> LayeredSink<S, L> {
    pub fn new(inner: S, layer: L) -> Self {
        Self { inner, layer }
    }

    pub fn inner(&self) -> &S {
        &self.inner
    }

    pub fn layer(&self) -> &L {
        &self.layer
    }
}

impl<S: NodeSink, L: SinkLayer> NodeSink for LayeredSink<S, L> {
    async fn apply(&self, node: &NodeRef, changes: &ChangeSet) -> Written {
        let send = Box::pin(self.inner.apply(node, changes));
        self.layer.around(Write::Patch(node), send).await
    }

    async fn event(&self, node: &NodeRef, event: NodeEvent) {
        let send = Box::pin(async {
            self.inner.event(node, event).await;
            Ok(())
        });
        let _ = self.layer.around(Write::Event(node), send).await;
    }

    async fn set_finalizer(&self, node: &NodeRef, present: bool) -> Written {
        let send = Box::pin(self.inner.set_finalizer(node, present));
        self.layer.around(Write::Finalizer(node), send).await
    }

    async fn set_annotation(&self, node: &NodeRef, key: &str, value: Option<&str>) -> Written {
        let send = Box::pin(self.inner.set_annotation(node, key, value));
        self.layer.around(Write::Annotation(node), send).await
    }

    async fn delete(&self, name: &str) -> SinkResult<()> {
        let send = Box::pin(self.inner.delete(name));
        self.layer.around(Write::Delete(name), send).await
    }

    async fn node_exists(&self, name: &str) -> SinkResult<bool> {
        self.inner.node_exists(name).await
    }

    async fn fetch(&self, name: &str) -> Written {
        self.inner.fetch(name).await
    }
}
