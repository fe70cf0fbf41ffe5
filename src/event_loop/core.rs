//! The allocation core's event loop: takes [`NodeInput`]s, runs bounded passes from the
//! deficit queue, and starts the EC2 refreshes the
//! [`RefreshSchedule`](crate::event_loop::schedule::RefreshSchedule) asks for. No Kubernetes
//! client in here, so tests and the benchmark drive it with the simulator and a `MemorySink`.
//!
//! Who owns what: the loop alone owns the queue, the running tasks and the refresh schedule;
//! node slots ([`crate::reconcile::nodes`]) are changed by the loop on input and by a node's pass
//! (`pass`: snapshot -> lifecycle -> plan -> execute -> write -> report); the EC2
//! cache is written by the executor and the refresher. Errors become `operator-status` + a
//! Warning Event ([`crate::reconcile::events`]); the node backs off.

use std::future::Future;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio::sync::mpsc;

use crate::ec2::readonly::ReadOnlyEc2;
use crate::ec2::{Ec2, Ec2Error};

use crate::cache::Ec2Cache;
use crate::clock::{self, now};
use crate::event_loop::intake;
use crate::event_loop::start::FirstListing;
use crate::event_loop::state::Loop;
use crate::k8s::readonly::ReadOnlySink;
use crate::k8s::sink::NodeSink;
use crate::reconcile::metrics::RuntimeMetrics;
use crate::reconcile::shadow::ShadowBook;
use crate::reconcile::shared::Shared;

mod handle;
pub use handle::Tracked;

pub use crate::k8s::input::{InvalidNode, NodeInput};
pub use crate::reconcile::settings::CoreConfig;

/// The allocation core. Cheap to clone (a handle).
pub struct Core<E, S> {
    inner: Arc<Shared<E, S>>,
}

impl<E, S> Clone for Core<E, S> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

/// Shadow mode (`--mode=shadow`): a core that can only be built from the read-only sink and EC2
/// client. It watches, caches and plans as the active one, and compares with `book` instead of
/// acting (`pass::shadow`); no Lease is needed, several may run.
impl<E: Ec2, S: NodeSink> Core<ReadOnlyEc2<E>, ReadOnlySink<S>> {
    pub fn shadow(
        ec2: Arc<ReadOnlyEc2<E>>,
        sink: Arc<ReadOnlySink<S>>,
        config: CoreConfig,
        metrics: RuntimeMetrics,
        cache: Arc<RwLock<Ec2Cache>>,
        book: Arc<ShadowBook>,
    ) -> Self {
        let mut shared = Shared::new(ec2, sink, config, metrics, cache);
        shared.shadow = Some(book);
        Self {
            inner: Arc::new(shared),
        }
    }
}

impl<E: Ec2, S: NodeSink> Core<E, S> {
    /// A core writing `metrics` and keeping its EC2 view in `cache` (from
    /// [`CoreConfig::ec2_cache`]); the caller keeps clones of both to export or read them.
    pub fn new(
        ec2: Arc<E>,
        sink: Arc<S>,
        config: CoreConfig,
        metrics: RuntimeMetrics,
        cache: Arc<RwLock<Ec2Cache>>,
    ) -> Self {
        let inner = Arc::new(Shared::new(ec2, sink, config, metrics, cache));
        Self { inner }
    }

    /// Run until `shutdown` completes (or the future is dropped: every worker is aborted with
    /// it, which is how a lost lease stops all mutating work at once).
    pub async fn run(
        self,
        mut inputs: mpsc::Receiver<NodeInput>,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), Ec2Error> {
        let (inner, config) = (&self.inner, &self.inner.config);
        // A new leader rebuilds its view and acts at once (§14); what a describe may still show
        // of the previous leader's last calls is held back until a listing started after
        // DESCRIBE_LAG confirms it (§14.1; `make dst` seed 25: a restart listed an address it
        // had just unassigned and put it back in the pool).
        let trust_from = {
            let mut cache = inner.cache.write().expect("cache");
            cache.begin_leadership(now());
            cache.trust_listings_from()
        };
        // The first full listing waits for the managed nodes' VPC (`crate::event_loop::start`): meanwhile
        // the loop takes the nodes in and describes their instances, and starts no pass.
        let (go, ready) = tokio::sync::oneshot::channel::<()>();
        let mut go = Some(go);
        // Boxed: nested in `run`'s future it took the binary's main future past the
        // compiler's layout depth limit (with the dst mutants feature).
        let mut first_listing = Box::pin(async {
            let _ = ready.await;
            inner.refresher.full().await
        });
        let mut listed = false;
        // Every type's limits (DescribeInstanceTypes over all types: several pages, seconds on
        // moto and on AWS) load beside the first passes, not before them, so a new leader acts
        // as soon as EC2 is listed; a pass whose type is not known yet describes that type
        // alone (`pass::plan::ensure_limits`). (The e2e failover: 2 s of the survivor's time.)
        let preload = async {
            if config.preload_instance_types
                && config.limits_via_api
                && let Err(e) = inner.refresher.instance_types(&[]).await
            {
                tracing::warn!(
                    error = %e,
                    "could not load every instance type's limits; each type is described when \
                     a node needs it"
                );
            }
        };
        tokio::pin!(preload);
        let mut preloaded = false;

        let first = FirstListing::new(now(), config.scope.vpc_id.is_some());
        let mut l = Loop::new(config.jitter_seed, first);
        let mut resync = clock::ticks(config.resync_interval).await;
        let mut rescan = clock::ticks(config.node_rescan_interval).await;
        inner
            .status
            .set_next_rescan(now() + config.node_rescan_interval);
        let mut confirm_tick = clock::ticks(config.instance_refresh_spacing).await;
        // The first full listing that can confirm what was held back (§14.1).
        let mut confirming = trust_from;
        tokio::pin!(shutdown);
        let mut inputs_open = true;
        loop {
            *inner.beat.lock().expect("beat") = now();
            if l.first
                .due(now(), l.schedule.describing() || l.owners.busy())
                && let Some(go) = go.take()
            {
                let _ = go.send(());
            }
            if listed {
                l.start_passes(inner);
            }
            if let Some(refresh) = l.schedule.next_refresh() {
                l.start_refresh(inner, refresh);
            }
            l.start_lookup(inner);
            inner.metrics.queue_depth.set(l.queue.depth() as i64);
            let pushed = l.queue.take_pushes();
            inner.metrics.cilium.deficit_queued.inc_by(pushed);
            // Only wake for a due node when a worker is free to take it: with every worker
            // busy a due time in the past would make the select below return at once,
            // forever (a busy loop; under a paused clock, a livelock).
            let free = listed && l.workers < config.workers.max(1);
            let next_due = if free { l.queue.next_due() } else { None };
            // `biased`: branches are polled in this order, not tokio's random one, so a
            // seeded simulation replays exactly. The bounded sources (finished tasks, at most
            // one per worker or refresh; ticks) come before the inputs, so a stream of watch
            // events cannot starve them.
            tokio::select! {
                biased;
                () = &mut shutdown => break,
                Some(done) = l.tasks.join(), if !l.tasks.is_empty() => l.on_done(inner, done),
                listing = &mut first_listing, if !listed => {
                    listing?;
                    listed = true;
                    // A shadow leads nothing (several may run beside the leader).
                    inner.metrics.leader.set(i64::from(inner.shadow.is_none()));
                    inner.warm.send_replace(true);
                    inner.requeue_all(&mut l.queue);
                }
                () = clock::sleep_until(l.first.deadline()) => {}
                // Not before the listing: beside the first passes, as the comment above says
                // (a pass of a type being described waits for that answer, §11).
                () = &mut preload, if listed && !preloaded => preloaded = true,
                _ = resync.tick(), if listed => { l.start_full(inner); }
                () = clock::sleep_until(confirming), if listed && confirming.is_some() => {
                    // Only when something is held back (otherwise the resync confirms as
                    // usual); a full refresh still running started too early: try after it.
                    let held = inner.cache.read().expect("cache").holds_back();
                    confirming = (held && !l.start_full(inner))
                        .then(|| now() + Duration::from_secs(1));
                }
                // Re-plan every node on the cached view, between full EC2 refreshes.
                _ = rescan.tick() => {
                    let next = now() + config.node_rescan_interval;
                    inner.status.set_next_rescan(next);
                    inner.requeue_all(&mut l.queue);
                }
                _ = confirm_tick.tick() => l.schedule.confirm_tick(),
                input = inputs.recv(), if inputs_open => match input {
                    None => inputs_open = false,
                    Some(input) => intake::accept(inner, input, &mut l),
                },
                () = clock::sleep_until(next_due) => {}
            }
        }
        inner.metrics.leader.set(0);
        inner.warm.send_replace(false);
        Ok(())
    }
}
