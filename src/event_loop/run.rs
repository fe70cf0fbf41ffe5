//! The event loop's own state ([`Loop`]) and the work it starts and takes back: passes from
//! the deficit queue, per-instance and full EC2 refreshes, and what each reports when it ends.
//! The loop alone owns the queue, the running tasks and the refresh schedule.

use std::sync::Arc;

use crate::ec2::Ec2;
use crate::jitter::Jitter;

use crate::clock::now;
use crate::event_loop::schedule::{InstanceRefresh, RefreshSchedule};
use crate::event_loop::start::FirstListing;
use crate::event_loop::tasks::{Done, Tasks};
use crate::k8s::sink::NodeSink;
use crate::reconcile::pass::pass;
use crate::reconcile::queue::{DeficitQueue, Outcome};
use crate::reconcile::shared::Shared;

pub(super) struct Loop {
    pub queue: DeficitQueue<String>,
    pub tasks: Tasks,
    pub schedule: RefreshSchedule,
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
            workers: 0,
            jitter: Jitter::new(jitter_seed),
            first,
        }
    }

    /// Start every ready node we have a worker for.
    pub fn start_passes<E: Ec2, S: NodeSink>(&mut self, inner: &Arc<Shared<E, S>>) {
        while self.workers < inner.config.workers.max(1) {
            let Some(name) = self.queue.pop(now()) else {
                break;
            };
            self.workers += 1;
            let inner = inner.clone();
            let on_panic = Done::Pass(name.clone(), Outcome::Failed, Some(inner.priority(&name)));
            self.tasks.spawn(
                async move {
                    let (outcome, again) = pass(&inner, &name).await;
                    Done::Pass(name, outcome, again)
                },
                on_panic,
            );
        }
    }

    /// Describe the instances nodes wait for, and confirm our own changes.
    pub fn start_refresh<E: Ec2, S: NodeSink>(
        &mut self,
        inner: &Arc<Shared<E, S>>,
        refresh: InstanceRefresh,
    ) {
        let InstanceRefresh { new, confirm } = refresh;
        let inner = inner.clone();
        let on_panic = Done::Refreshed(new.clone());
        let task = async move {
            inner.refresh_instances(&new, &confirm).await;
            Done::Refreshed(new)
        };
        self.tasks.spawn(task, on_panic);
    }

    /// Start a full refresh unless one runs; whether one was started.
    pub fn start_full<E: Ec2, S: NodeSink>(&mut self, inner: &Arc<Shared<E, S>>) -> bool {
        let started = self.schedule.start_full();
        if started {
            let inner = inner.clone();
            let task = async move {
                inner.refresh_full().await;
                Done::FullRefresh
            };
            self.tasks.spawn(task, Done::FullRefresh);
        }
        started
    }

    /// A task ended: free its worker, queue what it asks for, publish the totals when idle.
    pub fn on_done<E: Ec2, S: NodeSink>(&mut self, inner: &Shared<E, S>, done: Done) {
        match done {
            Done::Pass(name, outcome, again) => {
                self.workers -= 1;
                self.queue.finish(&name, outcome, now(), self.jitter.unit());
                // The instance the object names now: an agent may have rewritten it while the
                // pass ran, and one its Node does not confirm is never described (§15, N2).
                if outcome == Outcome::Done
                    && again.is_some()
                    && let Some(i) = inner.instance_of(&name)
                    && super::intake::admitted(inner, &name, &i)
                {
                    self.schedule.changed(i);
                }
                if let Some(p) = again {
                    self.queue.push(name.clone(), p);
                }
                let (failed, t) = (outcome == Outcome::Failed, now());
                inner.status.end(&name, failed, self.queue.due(&name, t), t);
                if self.queue.depth() == 0 && self.workers == 0 {
                    inner.publish_totals();
                }
            }
            Done::Refreshed(ids) => {
                self.first.described();
                for name in self.schedule.refreshed(ids) {
                    let p = inner.priority(&name);
                    self.queue.push(name, p);
                }
            }
            Done::FullRefresh => {
                self.schedule.full_done();
                // Resync pass: every node, neediest first.
                inner.requeue_all(&mut self.queue);
                inner.publish_totals();
            }
        }
    }
}
