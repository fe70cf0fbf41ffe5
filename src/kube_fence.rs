//! The lease fence (docs/rules.md §14.2) on the Kubernetes client, at the last moment a request
//! can still be stopped: inside the client-side rate limiter ([`crate::kube_limit`]), so a write
//! that waited for a token is checked when the token comes, not when it was planned, and once
//! per request (a change set of three patches is three checks). `k8s::fence::FencedSink`
//! still checks first (cheap, and it covers sinks that are no HTTP client); this layer is what
//! makes "right before each request leaves" true.
//!
//! Reads (GET, HEAD, and every list and watch) pass: a standby and an expired leader may read.
//! Lease writes pass too: a renewal is what grants the fence (and it goes through a client of
//! its own, `kube_limit::Clients::lease`).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::{Method, Request};
use tower::{BoxError, Layer, Service};

use crate::k8s::fence::{Fence, LEASE_EXPIRED};

/// A request the fence stopped: never sent.
#[derive(Debug, thiserror::Error)]
#[error("{LEASE_EXPIRED}: not sent: this process's lease may have expired")]
pub struct FenceExpired;

/// Builds [`FenceService`]s checking one [`Fence`].
#[derive(Clone)]
pub struct FenceLayer(pub Fence);

impl<S> Layer<S> for FenceLayer {
    type Service = FenceService<S>;

    fn layer(&self, inner: S) -> FenceService<S> {
        FenceService {
            inner,
            fence: self.0.clone(),
        }
    }
}

#[derive(Clone)]
pub struct FenceService<S> {
    inner: S,
    fence: Fence,
}

/// Whether the fence must allow `request`: any write but a Lease's.
pub fn fenced<B>(request: &Request<B>) -> bool {
    let read = matches!(
        *request.method(),
        Method::GET | Method::HEAD | Method::OPTIONS
    );
    !read
        && !request
            .uri()
            .path()
            .starts_with("/apis/coordination.k8s.io/")
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B> Service<Request<B>> for FenceService<S>
where
    S: Service<Request<B>>,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = BoxFuture<Result<S::Response, BoxError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        if fenced(&request) && !self.fence.valid() {
            return Box::pin(async { Err(Box::new(FenceExpired) as BoxError) });
        }
        let answer = self.inner.call(request);
        Box::pin(async move { answer.await.map_err(Into::into) })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::Duration;

    use tokio::time::Instant;
    use tower::ServiceExt;

    use super::*;
    use crate::kube_limit::RateLimitLayer;

    fn patch(path: &str) -> Request<()> {
        Request::builder()
            .method(Method::PATCH)
            .uri(path)
            .body(())
            .unwrap()
    }

    /// Three writes planned while the lease is valid, through a limiter of one request a
    /// second: the third gets its token after the fence ran out and is not sent. (Checked
    /// before the limiter, as `FencedSink` alone did, all three went.) Reads and Lease writes
    /// pass a closed fence.
    #[tokio::test(start_paused = true)]
    async fn a_write_that_waited_for_a_token_is_checked_when_it_leaves() {
        let sent = Arc::new(AtomicU32::new(0));
        let counter = sent.clone();
        let server = tower::service_fn(move |_: Request<()>| {
            counter.fetch_add(1, Ordering::Relaxed);
            async { Ok::<_, BoxError>(()) }
        });
        let fence = Fence::closed();
        fence.grant(Instant::now() + Duration::from_millis(1500));
        // As `kube_limit::configured` stacks them: the limiter outside, the fence inside.
        let svc = RateLimitLayer::new(1.0, 1).layer(FenceLayer(fence.clone()).layer(server));
        let mut results = Vec::new();
        let mut svc = svc;
        let mut planned = Vec::new();
        for _ in 0..3 {
            // What a check before the limiter (`FencedSink` alone) saw: valid every time.
            planned.push(fence.valid());
            let r = svc
                .ready()
                .await
                .unwrap()
                .call(patch("/apis/cilium.io/v2/ciliumnodes/n1"))
                .await;
            results.push(r.is_ok());
        }
        assert_eq!(planned, [true, true, true]);
        assert_eq!(results, [true, true, false], "at 0 s, 1 s and 2 s");
        assert_eq!(sent.load(Ordering::Relaxed), 2, "the third never left");
        let mut open = FenceLayer(fence).layer(tower::service_fn(|_: Request<()>| async {
            Ok::<_, BoxError>(())
        }));
        let get = Request::get("/apis/cilium.io/v2/ciliumnodes")
            .body(())
            .unwrap();
        assert!(open.ready().await.unwrap().call(get).await.is_ok());
        let lease = patch("/apis/coordination.k8s.io/v1/namespaces/x/leases/l");
        assert!(open.ready().await.unwrap().call(lease).await.is_ok());
        let err = open
            .ready()
            .await
            .unwrap()
            .call(patch("/api/v1/namespaces/x/events"))
            .await
            .unwrap_err();
        assert!(err.to_string().contains(LEASE_EXPIRED), "{err}");
    }
}
