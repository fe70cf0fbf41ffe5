//! The node of the pass a task runs, for code deep in that pass with no handle on the book:
//! the EC2 gate reports a throttled call through [`ThrottledPasses`].

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::ec2::Operation;
use crate::ec2::gate::ThrottleObserver;

use super::{StatusBook, WaitReason};

tokio::task_local! {
    /// The book and node of the pass this task runs (see [`scope`]).
    static CURRENT: (Arc<StatusBook>, String);
}

/// Run a pass over `name`, begun at `start`, with its book reachable from code that has no
/// handle on it.
pub async fn scope<F: Future>(
    book: Arc<StatusBook>,
    name: &str,
    start: Instant,
    pass: F,
) -> F::Output {
    book.begin(name, start);
    CURRENT.scope((book, name.to_string()), pass).await
}

/// The gate's [`ThrottleObserver`]: a throttled call of a pass marks that pass's node as waiting
/// until the retry. Nothing outside a pass (refreshes, the GC).
#[derive(Clone, Copy, Debug, Default)]
pub struct ThrottledPasses;

impl ThrottleObserver for ThrottledPasses {
    fn throttled(&self, operation: Operation, delay: Duration) {
        let _ = CURRENT.try_with(|(book, name)| {
            let retry = crate::clock::now() + delay;
            let detail =
                format!("{operation} answered RequestLimitExceeded; the EC2 gate retries it");
            book.wait_live(name, WaitReason::Throttled, detail, retry);
        });
    }
}
