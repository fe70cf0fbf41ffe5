//! The event loop's running tasks (passes and refreshes). A task that panics is finished like
//! a failed one, from what it was started for, instead of leaving its node marked in progress
//! (or a refresh marked running) for good.

use std::collections::BTreeMap;
use std::future::Future;

use tokio::task::{Id, JoinSet};
use tracing::warn;

use crate::reconcile::queue::{Outcome, Priority};

/// What a task reports when it ends.
pub enum Done {
    /// A node's pass: its outcome and the priority to queue it again at.
    Pass(String, Outcome, Option<Priority>),
    /// The per-instance refresh of these instances (the ones nodes wait for).
    Refreshed(Vec<String>),
    FullRefresh,
    /// The lookup of these InternalIPs' instances, and EC2's answer (`None`: it failed).
    Owners(
        Vec<std::net::Ipv4Addr>,
        Option<BTreeMap<std::net::Ipv4Addr, std::collections::BTreeSet<String>>>,
    ),
}

#[derive(Default)]
pub struct Tasks {
    set: JoinSet<Done>,
    /// What each task reports should it panic.
    on_panic: BTreeMap<Id, Done>,
}

impl Tasks {
    pub fn spawn(&mut self, task: impl Future<Output = Done> + Send + 'static, on_panic: Done) {
        let id = self.set.spawn(task).id();
        self.on_panic.insert(id, on_panic);
    }

    pub fn is_empty(&self) -> bool {
        self.set.is_empty()
    }

    /// The next task to end (cancel-safe). `None`: none runs.
    pub async fn join(&mut self) -> Option<Done> {
        loop {
            match self.set.join_next_with_id().await? {
                Ok((id, done)) => {
                    self.on_panic.remove(&id);
                    return Some(done);
                }
                Err(e) => {
                    warn!(error = %e, "a runtime task failed; finishing it as failed");
                    match self.on_panic.remove(&e.id()) {
                        Some(done) => return Some(done),
                        None => warn!(error = %e, "an untracked runtime task failed"),
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_panicking_pass_finishes_as_failed() {
        let mut tasks = Tasks::default();
        let on_panic = Done::Pass("n1".into(), Outcome::Failed, Some(Priority::Routine));
        tasks.spawn(async { panic!("boom") }, on_panic);
        match tasks.join().await {
            Some(Done::Pass(name, Outcome::Failed, Some(Priority::Routine))) => {
                assert_eq!(name, "n1")
            }
            _ => panic!("expected the failed pass"),
        }
        assert!(tasks.is_empty());
        assert!(tasks.on_panic.is_empty());
    }
}
