//! The deficit queue: which node gets a worker next.
//!
//! Pure: no clocks, no I/O. Callers pass `now` and a jitter sample, so every rule is tested with
//! plain values.
//! * ordered by urgency: a node with no free address first (first come, first served: a node
//!   that has none outranks one that has some whatever the counts), then nodes whose pods wait
//!   for addresses, then reserves by the biggest deficit, then excess to release, then routine
//!   passes;
//! * first addresses before reserves: the order above hands out workers; the EC2 gate orders
//!   the calls of the passes that run (`ec2::gate::urgency`), so a reserve pass may start
//!   beside an urgent one without taking its tokens, and the account is used whole;
//! * a node keeps its urgency through a failed pass or a wait: after its delay it comes back
//!   where it was, not behind every reserve;
//! * one entry per node (a push while queued raises the priority, never duplicates);
//! * never two workers on one node: a node being worked on is not handed out again; a push
//!   meanwhile is remembered and re-queued when the worker finishes;
//! * per-node exponential backoff on errors (1 s doubling to 5 min, with jitter).

use std::cmp::Ordering;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::hash::Hash;
use std::time::{Duration, Instant};

/// How urgently a node needs a worker. Higher sorts first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Priority {
    /// Nothing known to be wrong: a periodic rescan.
    Routine,
    /// Addresses in excess (release work), by how many.
    Excess(u32),
    /// Addresses missing for the node's reserve, by how many; some are still free.
    Deficit(u32),
    /// Addresses missing while pods wait for them (the Pod watch's count), by how many pods.
    PodsWaiting(u32),
    /// No free address at all: the next pod cannot start.
    NoFreeIp,
    /// Deletion work (finalizer): unblock it first.
    Deleting,
}

impl Priority {
    /// The node lacks addresses a pod needs now (its first ones, or for pods waiting).
    pub fn is_urgent(self) -> bool {
        matches!(self, Priority::NoFreeIp | Priority::PodsWaiting(_))
    }

    /// From the node's last known demand figures and the pods waiting on it.
    pub fn from_demand(
        available: i64,
        used: i64,
        needed: i64,
        excess: i64,
        pending_pods: u32,
    ) -> Self {
        let clamp = |n: i64| u32::try_from(n.max(0)).unwrap_or(u32::MAX);
        if needed > 0 && available - used <= 0 {
            Priority::NoFreeIp
        } else if needed > 0 && pending_pods > 0 {
            Priority::PodsWaiting(pending_pods)
        } else if needed > 0 {
            Priority::Deficit(clamp(needed))
        } else if excess > 0 {
            Priority::Excess(clamp(excess))
        } else {
            Priority::Routine
        }
    }
}

/// Backoff bounds.
pub const BACKOFF_INITIAL: Duration = Duration::from_secs(1);
pub const BACKOFF_MAX: Duration = Duration::from_secs(300);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Key {
    priority: Priority,
    seq: u64,
}

impl Ord for Key {
    fn cmp(&self, other: &Self) -> Ordering {
        // Highest priority first; FIFO among equals.
        other
            .priority
            .cmp(&self.priority)
            .then(self.seq.cmp(&other.seq))
    }
}

impl PartialOrd for Key {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// The queue of nodes waiting for a worker.
#[derive(Debug)]
pub struct DeficitQueue<K: Clone + Eq + Hash + Ord> {
    ready: BTreeSet<(Key, K)>,
    queued: HashMap<K, Key>,
    /// Nodes held back until a time (backoff or an explicit delay).
    delayed: HashMap<K, (Instant, Priority)>,
    /// `delayed` ordered by due time: finding the next due node must not scan every node.
    due: BTreeSet<(Instant, K)>,
    /// Handed out, with the priority it had: a failed or waiting pass queues it at that again.
    running: HashMap<K, Priority>,
    /// Pushed while running: re-queue on finish.
    again: HashMap<K, Priority>,
    /// Woken while running ([`DeficitQueue::wake`]): re-queued on finish without the delay
    /// the pass's outcome asks for.
    woken: HashSet<K>,
    failures: HashMap<K, u32>,
    seq: u64,
    /// `push` calls not yet counted (Cilium's trigger "queued" figure; folded ones included).
    pushes: u64,
}

impl<K: Clone + Eq + Hash + Ord> Default for DeficitQueue<K> {
    fn default() -> Self {
        Self {
            ready: BTreeSet::new(),
            queued: HashMap::new(),
            delayed: HashMap::new(),
            due: BTreeSet::new(),
            running: HashMap::new(),
            again: HashMap::new(),
            woken: HashSet::new(),
            failures: HashMap::new(),
            seq: 0,
            pushes: 0,
        }
    }
}

/// How a worker's pass ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Done,
    /// Failed: back off exponentially.
    Failed,
    /// Not an error, but look again after this long (waiting for a refresh, not running, ...).
    RetryAfter(Duration),
}

impl<K: Clone + Eq + Hash + Ord> DeficitQueue<K> {
    pub fn new() -> Self {
        Self::default()
    }

    /// Ask for a pass over `node`. De-duplicated; raises the priority of a queued entry.
    pub fn push(&mut self, node: K, priority: Priority) {
        self.pushes += 1;
        if self.running.contains_key(&node) {
            let p = self.again.entry(node).or_insert(priority);
            *p = (*p).max(priority);
            return;
        }
        if let Some((_, p)) = self.delayed.get_mut(&node) {
            // A node in backoff keeps its delay (errors must slow it down), but remembers the
            // highest priority asked for.
            *p = (*p).max(priority);
            return;
        }
        if let Some(key) = self.queued.get(&node).copied() {
            if priority <= key.priority {
                return;
            }
            self.ready.remove(&(key, node.clone()));
        }
        self.insert_ready(node, priority);
    }

    fn insert_ready(&mut self, node: K, priority: Priority) {
        self.seq += 1;
        let key = Key {
            priority,
            seq: self.seq,
        };
        self.queued.insert(node.clone(), key);
        self.ready.insert((key, node));
    }

    /// Move delayed entries whose time has come into the ready set.
    fn promote(&mut self, now: Instant) {
        while let Some((at, _)) = self.due.first()
            && *at <= now
        {
            let (_, node) = self.due.pop_first().expect("non-empty");
            if let Some((_, p)) = self.delayed.remove(&node) {
                self.insert_ready(node, p);
            }
        }
    }

    /// The most urgent ready node; it counts as running until [`finish`](Self::finish).
    pub fn pop(&mut self, now: Instant) -> Option<K> {
        self.promote(now);
        let (key, node) = self.ready.pop_first()?;
        self.queued.remove(&node);
        self.running.insert(node.clone(), key.priority);
        Some(node)
    }

    /// A worker is done with `node`. `jitter` in [0, 1) spreads backoff delays.
    pub fn finish(&mut self, node: &K, outcome: Outcome, now: Instant, jitter: f64) {
        let held = self.running.remove(node);
        let again = self.again.remove(node);
        // What a failed or waiting pass did not serve is as urgent as before it.
        let kept = again.max(held).unwrap_or(Priority::Routine);
        if self.woken.remove(node) {
            // The reason for any wait this pass sets may be gone: look again at once.
            if outcome == Outcome::Failed {
                *self.failures.entry(node.clone()).or_insert(0) += 1;
            }
            self.insert_ready(node.clone(), kept);
            return;
        }
        match outcome {
            Outcome::Done => {
                self.failures.remove(node);
                if let Some(p) = again {
                    self.insert_ready(node.clone(), p);
                }
            }
            Outcome::Failed => {
                let n = self.failures.entry(node.clone()).or_insert(0);
                *n += 1;
                let delay = backoff_delay(*n, jitter);
                self.delay(node, now + delay, kept);
            }
            Outcome::RetryAfter(delay) => self.delay(node, now + delay, kept),
        }
    }

    fn delay(&mut self, node: &K, at: Instant, p: Priority) {
        if let Some((old, _)) = self.delayed.insert(node.clone(), (at, p)) {
            self.due.remove(&(old, node.clone()));
        }
        self.due.insert((at, node.clone()));
    }

    /// Ask for a pass over `node` now, out of any wait: what it waited for may have changed
    /// (its Node came or went, its CiliumNode was marked for deletion). A node being worked on
    /// gets a pass right after, whatever delay that pass's outcome asks for (a `push` would
    /// keep the delay: a Node that came back during a pass that waited for it was looked at
    /// again only at the next rescan).
    pub fn wake(&mut self, node: K, priority: Priority) {
        if self.running.contains_key(&node) {
            self.woken.insert(node.clone());
        } else {
            self.remove(&node);
        }
        self.push(node, priority);
    }

    /// Forget a node (CiliumNode deleted). A running worker finishes on its own.
    pub fn remove(&mut self, node: &K) {
        if let Some(key) = self.queued.remove(node) {
            self.ready.remove(&(key, node.clone()));
        }
        if let Some((at, _)) = self.delayed.remove(node) {
            self.due.remove(&(at, node.clone()));
        }
        self.again.remove(node);
        self.woken.remove(node);
        self.failures.remove(node);
    }

    /// When the earliest delayed node becomes ready.
    pub fn next_due(&self) -> Option<Instant> {
        self.due.first().map(|(at, _)| *at)
    }

    /// When `node` gets a worker again: its delay's end, `now` if it is ready, `None` if it is
    /// not queued (the next input or rescan).
    pub fn due(&self, node: &K, now: Instant) -> Option<Instant> {
        match self.delayed.get(node) {
            Some((at, _)) => Some(*at),
            None => self.queued.contains_key(node).then_some(now),
        }
    }

    /// `push` calls since the last call of this.
    pub fn take_pushes(&mut self) -> u64 {
        std::mem::take(&mut self.pushes)
    }

    /// Nodes waiting (ready or delayed), not counting running ones.
    pub fn depth(&self) -> usize {
        self.ready.len() + self.delayed.len()
    }

    pub fn is_running(&self, node: &K) -> bool {
        self.running.contains_key(node)
    }

    pub fn running(&self) -> usize {
        self.running.len()
    }

    pub fn failures(&self, node: &K) -> u32 {
        self.failures.get(node).copied().unwrap_or(0)
    }
}

/// Delay after the `failures`-th consecutive failure: 1 s, 2 s, 4 s, ... capped at 5 min, then
/// "equal jitter": between half and all of that.
pub fn backoff_delay(failures: u32, jitter: f64) -> Duration {
    let exp = failures.saturating_sub(1).min(20);
    let base = BACKOFF_INITIAL.saturating_mul(1u32 << exp).min(BACKOFF_MAX);
    let jitter = jitter.clamp(0.0, 1.0);
    base / 2 + base.mul_f64(jitter / 2.0)
}

#[cfg(test)]
mod tests;
