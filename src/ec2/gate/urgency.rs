//! Whose call it is: a call made for a node that has no free address, or pods waiting, takes a
//! bucket's next token before a call that only tops up a reserve.
//!
//! The gate cannot see the pass behind a call through the [`crate::ec2::Ec2`] trait, so the
//! worker that runs a pass names its urgency for the whole task ([`scope`]), as tracing names
//! a span. Calls outside any pass (refreshes, the GC) are not urgent.

use std::future::Future;

tokio::task_local! {
    static URGENT: bool;
}

/// Run `work` with its EC2 calls marked urgent (or not).
pub async fn scope<F: Future>(urgent: bool, work: F) -> F::Output {
    URGENT.scope(urgent, work).await
}

/// Whether the current task's calls are urgent.
pub(super) fn current() -> bool {
    URGENT.try_with(|u| *u).unwrap_or(false)
}
