//! Per-node status of the running operator (`/debug/nodes`, `eni-operator status`): for every
//! node its demand figures, what the operator did last and when, what it would do next,
//! whether it waits and why, with the time it is retried, and its last error.
//!
//! Passes record into the [`StatusBook`] with one call each ([`StatusBook::wait`] when a pass
//! decides to wait, [`StatusBook::observed`] with its plan); the event loop closes each pass
//! ([`StatusBook::end`]) with the time the queue looks at the node again, and that is where
//! a wait is published: `eni_operator_nodes_waiting{reason}` and one debug line with the retry
//! time. The shadow (`--mode=shadow`) records through the same calls, so `/debug/nodes` and
//! `/debug/shadow` share the figures ([`Figures`]) and the action ([`Would`]) of a node.
//!
//! Code deep in a pass that has no handle on the book (the EC2 gate retrying a throttled
//! call) reports to [`ThrottledPasses`], the observer the gate is given, which finds the node's
//! book and name in a task local set for the pass ([`scope`]).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Instant;

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use serde::{Deserialize, Serialize};

use crate::ipam::{Action, Demand, Generation, ProblemReason};

mod in_pass;
pub mod page;

pub use in_pass::{ThrottledPasses, scope};
use page::{Message, NodeStatus, Page, Stamped, Wait};

type Labels = Vec<(&'static str, String)>;

/// Why a node waits. The label of `eni_operator_nodes_waiting{reason}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WaitReason {
    /// EC2 answered `RequestLimitExceeded`: the gate waits and retries the call.
    Throttled,
    /// Addresses a listing from early in this leadership shows are held back until a listing
    /// started after a time confirms them (§14.1).
    HeldBack,
    /// Addresses were proposed for release; the agent has not answered (`ready-for-release`).
    ReleaseAnswer,
    /// The instance type's limits are not known yet (DescribeInstanceTypes).
    LimitsUnknown,
    /// Another allocator (Cilium's operator) serves the node.
    OtherAllocator,
    /// The node's instance is not in the EC2 view yet (its describe is queued).
    InstanceNotListed,
    /// No Node of the CiliumNode's name has been seen yet to confirm its instance (§15).
    NodeNotSeen,
    /// The instance was not running: left alone for a while.
    NotRunning,
    /// The EC2 view could not be refreshed: nothing is changed on a stale view.
    Ec2Unavailable,
    /// The last EC2 call or the node's input failed (see `last_error`).
    Error,
}

impl WaitReason {
    pub const ALL: [WaitReason; 10] = [
        WaitReason::Throttled,
        WaitReason::HeldBack,
        WaitReason::ReleaseAnswer,
        WaitReason::LimitsUnknown,
        WaitReason::OtherAllocator,
        WaitReason::InstanceNotListed,
        WaitReason::NodeNotSeen,
        WaitReason::NotRunning,
        WaitReason::Ec2Unavailable,
        WaitReason::Error,
    ];

    /// The wait of a node whose pass ended with `problem` (`throttled`: the failed EC2 call
    /// was throttled past the gate's deadline).
    pub const fn of_problem(problem: ProblemReason, throttled: bool) -> Self {
        match problem {
            ProblemReason::Ec2Error if throttled => WaitReason::Throttled,
            ProblemReason::UnknownInstanceType => WaitReason::LimitsUnknown,
            ProblemReason::OtherAllocatorActive | ProblemReason::CiliumIgnoresAnnotation => {
                WaitReason::OtherAllocator
            }
            ProblemReason::InstanceNotFound => WaitReason::InstanceNotListed,
            _ => WaitReason::Error,
        }
    }

    pub const fn as_str(self) -> &'static str {
        match self {
            WaitReason::Throttled => "throttled",
            WaitReason::HeldBack => "held-back",
            WaitReason::ReleaseAnswer => "release-answer",
            WaitReason::LimitsUnknown => "limits-unknown",
            WaitReason::OtherAllocator => "other-allocator",
            WaitReason::InstanceNotListed => "instance-not-listed",
            WaitReason::NodeNotSeen => "node-not-seen",
            WaitReason::NotRunning => "not-running",
            WaitReason::Ec2Unavailable => "ec2-unavailable",
            WaitReason::Error => "error",
        }
    }
}

/// A node's demand figures as a pass planned them (shared by `/debug/nodes` and
/// `/debug/shadow`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Figures {
    pub instance: String,
    pub mode: String,
    pub available: i64,
    pub used: i64,
    pub needed: i64,
}

impl Figures {
    pub fn of(instance: &str, d: &Demand) -> Self {
        Self {
            instance: instance.to_string(),
            mode: match d.generation {
                Generation::Classic => "classic",
                Generation::MultiPool => "multi-pool",
            }
            .to_string(),
            available: d.available,
            used: d.used,
            needed: d.needed.max(0),
        }
    }
}

/// One EC2 action of the engine, without EC2 types: what the operator did, does next, or (in
/// shadow mode) would do.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "kebab-case")]
pub enum Would {
    #[default]
    Nothing,
    Assign {
        eni: String,
        subnet: String,
        addresses: u32,
    },
    CreateEni {
        subnet: String,
        security_groups: Vec<String>,
        addresses: u32,
    },
    Release {
        eni: String,
        addresses: u32,
    },
}

impl Would {
    pub fn of(action: &Action) -> Self {
        match action {
            Action::None => Would::Nothing,
            Action::Assign(a) => Would::Assign {
                eni: a.eni_id.clone(),
                subnet: a.subnet_id.clone(),
                addresses: a.request.addresses(),
            },
            Action::CreateEni(c) => {
                let first = c.attempts.first();
                Would::CreateEni {
                    subnet: first.map(|r| r.subnet_id.clone()).unwrap_or_default(),
                    security_groups: first.map(|r| r.security_groups.clone()).unwrap_or_default(),
                    addresses: first.map_or(0, |r| r.addresses.addresses()),
                }
            }
            Action::Release(r) => Would::Release {
                eni: r.eni_id.clone(),
                addresses: (r.ips.len() + 16 * r.prefixes.len()) as u32,
            },
        }
    }

    /// One line for people (`eni-operator status`).
    pub fn describe(&self) -> String {
        match self {
            Would::Nothing => "nothing".into(),
            Would::Assign { eni, addresses, .. } => format!("assign {addresses} on {eni}"),
            Would::CreateEni {
                subnet, addresses, ..
            } => format!("create an ENI in {subnet} with {addresses}"),
            Would::Release { eni, addresses } => format!("release {addresses} from {eni}"),
        }
    }
}

/// A wait as recorded (times on the core's clock).
#[derive(Clone, Debug, PartialEq)]
struct Waiting {
    reason: WaitReason,
    detail: String,
    retry_at: Option<Instant>,
}

/// What the book keeps of a node.
#[derive(Clone, Debug, Default)]
struct Entry {
    figures: Figures,
    running: bool,
    last_pass: Option<Instant>,
    last_action: Option<(Would, Instant)>,
    next: Would,
    /// This pass's wait, until [`StatusBook::end`] publishes it.
    pending: Option<Waiting>,
    waiting: Option<Waiting>,
    last_error: Option<(String, Instant)>,
}

/// Per-node status, shared by the passes, the event loop, the metrics and `/debug/nodes`.
#[derive(Debug)]
pub struct StatusBook {
    nodes: Mutex<BTreeMap<String, Entry>>,
    /// `eni_operator_nodes_waiting{reason}`.
    waiting: Family<Labels, Gauge>,
    /// Wall time at a clock instant (the core's `epoch`).
    epoch: (Timestamp, Instant),
    /// When every node is planned again at the latest (the rescan).
    next_rescan: Mutex<Option<Instant>>,
}

impl StatusBook {
    pub fn new(waiting: Family<Labels, Gauge>, epoch: (Timestamp, Instant)) -> Self {
        for r in WaitReason::ALL {
            let _ = waiting.get_or_create(&label(r));
        }
        Self {
            nodes: Mutex::default(),
            waiting,
            epoch,
            next_rescan: Mutex::default(),
        }
    }

    fn with<T>(&self, name: &str, f: impl FnOnce(&mut Entry) -> T) -> T {
        let mut nodes = self.nodes.lock().unwrap_or_else(|e| e.into_inner());
        f(nodes.entry(name.to_string()).or_default())
    }

    /// A pass over `name` starts.
    pub fn begin(&self, name: &str, now: Instant) {
        self.with(name, |e| {
            e.running = true;
            e.pending = None;
            e.last_pass = Some(now);
        });
    }

    /// The pass decided to wait (the one call a pass makes): why, and when it is retried if
    /// the pass knows (else the queue's time, or the next rescan, is filled in at its end).
    /// A later call in the same pass replaces an earlier one.
    pub fn wait(
        &self,
        name: &str,
        reason: WaitReason,
        detail: impl Into<String>,
        retry_at: Option<Instant>,
    ) {
        let detail = detail.into();
        self.with(name, |e| {
            e.pending = Some(Waiting {
                reason,
                detail,
                retry_at,
            });
        });
    }

    /// What the pass planned: the node's figures and its next action.
    pub fn observed(&self, name: &str, figures: Figures, next: Would) {
        self.with(name, |e| {
            e.figures = figures;
            e.next = next;
        });
    }

    /// An EC2 action was carried out for the node (a throttled answer before it is over).
    pub fn acted(&self, name: &str, what: Would, at: Instant) {
        self.with(name, |e| {
            e.last_action = Some((what, at));
            if e.pending
                .as_ref()
                .is_some_and(|w| w.reason == WaitReason::Throttled)
            {
                e.pending = None;
            }
        });
    }

    /// As [`StatusBook::wait`], shown at once (a pass that waits inside an EC2 call).
    fn wait_live(&self, name: &str, reason: WaitReason, detail: String, retry_at: Instant) {
        let mut nodes = self.nodes.lock().unwrap_or_else(|e| e.into_inner());
        let e = nodes.entry(name.to_string()).or_default();
        let w = Waiting {
            reason,
            detail,
            retry_at: Some(retry_at),
        };
        e.pending = Some(w.clone());
        let changed = e.waiting.as_ref().map(|w| w.reason) != Some(reason);
        e.waiting = Some(w);
        if changed {
            self.publish(&nodes);
        }
    }

    /// The node's error (a failed call, bad input, a problem), kept as its last error.
    pub fn error(&self, name: &str, message: impl Into<String>, at: Instant) {
        let message = message.into();
        self.with(name, |e| e.last_error = Some((message, at)));
    }

    /// When the loop plans every node again at the latest.
    pub fn set_next_rescan(&self, at: Instant) {
        *self.next_rescan.lock().unwrap_or_else(|e| e.into_inner()) = Some(at);
    }

    /// The pass is over; `due` is when the queue looks at the node again (`None`: not before
    /// an input or the rescan), `failed` whether it ended in an error (backoff). Publishes the
    /// node's wait: the gauge, and one debug line with the retry time.
    pub fn end(&self, name: &str, failed: bool, due: Option<Instant>, now: Instant) {
        let rescan = *self.next_rescan.lock().unwrap_or_else(|e| e.into_inner());
        let mut nodes = self.nodes.lock().unwrap_or_else(|e| e.into_inner());
        let Some(e) = nodes.get_mut(name) else {
            return;
        };
        e.running = false;
        let before = e.waiting.as_ref().map(|w| w.reason);
        e.waiting = settle(e.pending.take(), failed, e.last_error.as_ref(), due, rescan);
        if let Some(w) = &e.waiting {
            let retry_in = w.retry_at.map(|t| t.saturating_duration_since(now));
            tracing::debug!(
                node = name,
                reason = w.reason.as_str(),
                detail = %w.detail,
                retry_at = %self.wall_opt(w.retry_at),
                ?retry_in,
                "node waits"
            );
        }
        let after = e.waiting.as_ref().map(|w| w.reason);
        if before != after {
            self.publish(&nodes);
        }
    }

    /// The node waits before any pass (its instance is not described yet, ...).
    pub fn waits_now(&self, name: &str, reason: WaitReason, detail: impl Into<String>) {
        self.wait(name, reason, detail, None);
        self.end(name, false, None, crate::clock::now());
    }

    /// The node is gone.
    pub fn forget(&self, name: &str) {
        let mut nodes = self.nodes.lock().unwrap_or_else(|e| e.into_inner());
        if nodes.remove(name).is_some() {
            self.publish(&nodes);
        }
    }

    fn publish(&self, nodes: &BTreeMap<String, Entry>) {
        let mut counts: BTreeMap<WaitReason, i64> = BTreeMap::new();
        for w in nodes.values().filter_map(|e| e.waiting.as_ref()) {
            *counts.entry(w.reason).or_default() += 1;
        }
        for r in WaitReason::ALL {
            let n = counts.get(&r).copied().unwrap_or(0);
            self.waiting.get_or_create(&label(r)).set(n);
        }
    }

    fn wall(&self, at: Instant) -> Timestamp {
        let (wall, base) = self.epoch;
        let signed = if at >= base {
            SignedDuration::try_from(at - base).unwrap_or_default()
        } else {
            -SignedDuration::try_from(base - at).unwrap_or_default()
        };
        wall.saturating_add(signed).unwrap_or(wall)
    }

    fn wall_opt(&self, at: Option<Instant>) -> String {
        at.map_or_else(
            || "at the next input or rescan".into(),
            |t| self.wall(t).to_string(),
        )
    }

    /// One node's status as served.
    pub fn node(&self, name: &str, now: Instant) -> Option<NodeStatus> {
        let nodes = self.nodes.lock().unwrap_or_else(|e| e.into_inner());
        nodes.get(name).map(|e| self.render(e, now))
    }

    fn render(&self, e: &Entry, now: Instant) -> NodeStatus {
        NodeStatus {
            figures: e.figures.clone(),
            running: e.running,
            last_pass: e.last_pass.map(|t| self.wall(t).to_string()),
            last_action: e.last_action.as_ref().map(|(w, at)| Stamped {
                what: w.clone(),
                at: self.wall(*at).to_string(),
            }),
            next: e.next.clone(),
            waiting: e.waiting.as_ref().map(|w| Wait {
                reason: w.reason,
                detail: w.detail.clone(),
                retry_at: w.retry_at.map(|t| self.wall(t).to_string()),
                retry_in_seconds: w
                    .retry_at
                    .map(|t| t.saturating_duration_since(now).as_secs_f64()),
            }),
            last_error: e.last_error.as_ref().map(|(m, at)| Stamped {
                what: Message { message: m.clone() },
                at: self.wall(*at).to_string(),
            }),
        }
    }

    /// `/debug/nodes`, rendered from a copy: the passes record into the book while a page of
    /// thousands of nodes is formatted.
    pub fn page(&self, now: Instant) -> Page {
        let nodes = self.nodes.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let mut page = Page::default();
        for (name, e) in &nodes {
            let s = self.render(e, now);
            page.totals.nodes += 1;
            page.totals.nodes_with_errors += usize::from(s.last_error.is_some());
            if let Some(w) = &s.waiting {
                page.totals.nodes_waiting += 1;
                *page.totals.waiting.entry(w.reason).or_default() += 1;
            }
            page.nodes.insert(name.clone(), s);
        }
        page
    }
}

fn label(r: WaitReason) -> Labels {
    vec![("reason", r.as_str().to_string())]
}

/// The node's wait after a pass (pure): the pass's own, else an error if it failed, else
/// none. A wait without a time of its own is retried when the queue looks again (`due`), or
/// at the rescan.
fn settle(
    pending: Option<Waiting>,
    failed: bool,
    last_error: Option<&(String, Instant)>,
    due: Option<Instant>,
    rescan: Option<Instant>,
) -> Option<Waiting> {
    let mut w = match (pending, failed) {
        (Some(w), _) => w,
        (None, true) => Waiting {
            reason: WaitReason::Error,
            detail: last_error.map_or_else(|| "the pass failed".into(), |(m, _)| m.clone()),
            retry_at: None,
        },
        (None, false) => return None,
    };
    if w.retry_at.is_none() {
        w.retry_at = due.or(rescan);
    }
    Some(w)
}

#[cfg(test)]
mod tests;
