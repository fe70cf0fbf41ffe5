//! What the event loop holds between two events: the deficit queue, the tasks in flight, the
//! refresh schedule, the address lookups and the worker count. Its own file so that the intake
//! and the loop's turns (`run.rs`) both take it without importing each other.

use crate::event_loop::owners::Lookups;
use crate::event_loop::schedule::RefreshSchedule;
use crate::event_loop::start::FirstListing;
use crate::event_loop::tasks::Tasks;
use crate::jitter::Jitter;
use crate::reconcile::queue::DeficitQueue;

pub(super) struct Loop {
    pub queue: DeficitQueue<String>,
    pub tasks: Tasks,
    pub schedule: RefreshSchedule,
    /// The InternalIPs whose instance nodes wait for.
    pub owners: Lookups,
    /// Passes running.
    pub workers: usize,
    /// The backoff jitter of failed passes.
    pub jitter: Jitter,
    /// When the leadership's first full listing may start.
    pub first: FirstListing,
}

impl Loop {
    pub fn new(jitter_seed: Option<u64>, first: FirstListing) -> Self {
        Self {
            queue: DeficitQueue::default(),
            tasks: Tasks::default(),
            schedule: RefreshSchedule::default(),
            owners: Lookups::default(),
            workers: 0,
            jitter: Jitter::new(jitter_seed),
            first,
        }
    }
}
