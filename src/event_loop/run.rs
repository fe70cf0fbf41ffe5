//! The work the event loop ([`Loop`]) starts and takes back: passes from the deficit queue,
//! per-instance and full EC2 refreshes, and what each reports when it ends. The loop alone owns
//! the queue, the running tasks and the refresh schedule.

use std::sync::Arc;

use crate::ec2::Ec2;
use crate::ec2::gate::urgency;

use crate::clock::now;
use crate::event_loop::owners;
use crate::event_loop::schedule::InstanceRefresh;
use crate::event_loop::state::Loop;
use crate::event_loop::tasks::Done;
use crate::k8s::sink::NodeSink;
use crate::reconcile::pass::pass;
use crate::reconcile::queue::Outcome;
use crate::reconcile::shared::Shared;

impl Loop {
    /// Start every ready node we have a worker for.
    pub fn start_passes<E: Ec2, S: NodeSink>(&mut self, inner: &Arc<Shared<E, S>>) {
        while self.workers < inner.config.workers.max(1) {
            let Some(name) = self.queue.pop(now()) else {
                break;
            };
            self.workers += 1;
            let inner = inner.clone();
            let priority = inner.priority(&name);
            let on_panic = Done::Pass(name.clone(), Outcome::Failed, Some(priority));
            self.tasks.spawn(
                urgency::scope(priority.is_urgent(), async move {
                    let (outcome, again) = pass(&inner, &name).await;
                    Done::Pass(name, outcome, again)
                }),
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

    /// Look up the instances behind the InternalIPs nodes wait for, unless a lookup runs.
    pub fn start_lookup<E: Ec2, S: NodeSink>(&mut self, inner: &Arc<Shared<E, S>>) {
        let Some(ips) = self.owners.next() else {
            return;
        };
        let inner = inner.clone();
        let on_panic = Done::Owners(ips.clone(), None);
        let task = async move {
            let vpc = inner.refresher.vpc_scope();
            match owners::look_up(&*inner.ec2, &ips, vpc).await {
                Ok(found) => Done::Owners(ips, Some(found)),
                Err(e) => {
                    tracing::warn!(error = %e, "looking up the instances of Nodes' InternalIPs failed");
                    Done::Owners(ips, None)
                }
            }
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
            Done::Owners(ips, found) => {
                if let Some(found) = found {
                    inner.nodes.lock().expect("nodes").set_owners(found, now());
                }
                for name in self.owners.done(&ips) {
                    super::intake::reconsider(inner, self, &name);
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
                // Resync pass: every node, neediest first; an InternalIP whose lookup failed
                // or refuted a claim long enough ago is asked about again.
                inner.requeue_all(&mut self.queue);
                let names: Vec<String> =
                    inner.slots.lock().expect("slots").keys().cloned().collect();
                for name in names {
                    super::intake::ask_owners(inner, self, &name);
                }
                inner.publish_totals();
            }
        }
    }
}
