//! Issue 29 item 0: after a start, every node that can be served is served at once. The
//! operator starts with its nodes' CiliumNodes already there (every deploy, upgrade and
//! failover); the first pass after its first EC2 listing must act for each of them, not for
//! one node per instance type while the others wait for the 60 s rescan (as they did when a
//! pass met another pass's limits lookup in flight and planned without limits).
//!
//! The check: every node present at the run's start, still live, has its first addresses
//! (pool or allocated CIDRs), an EC2 refusal of its first call on its status, or an excuse from
//! the account (crate::account) within [`BOUND`] seconds. The bound leaves room for the account's latencies, throttling, the
//! injected faults' retries and a crash-restart in the window (each costs seconds), not for a
//! wait on the resync or rescan timers (60 s). It draws nothing, so no seed moves.

use crate::check::Broken;
use crate::world::{Phase, World};

/// Seconds from the start by which every node present then has its first addresses.
pub const BOUND: u64 = 45;

#[derive(Debug, Default)]
pub struct FirstAction {
    /// The nodes present at the start, until the check ran.
    waiting: Option<Vec<String>>,
}

/// The run's nodes have joined; the operator (started at 0) is to serve each. Runs with two
/// electing replicas are left out: their leader is elected after the start (crate::leadership).
pub fn begin(w: &mut World) {
    if w.leadership.is_none() {
        w.first_action.waiting = Some(w.nodes.keys().cloned().collect());
    }
}

/// At `t`: once the bound has passed, every node still live has been served or is excused.
pub fn check(w: &mut World, t: u64) -> Result<(), Broken> {
    if t < BOUND {
        return Ok(());
    }
    let Some(waiting) = w.first_action.waiting.take() else {
        return Ok(());
    };
    for name in waiting {
        let Some(n) = w.nodes.get(&name) else {
            continue;
        };
        if n.phase != Phase::Live {
            continue;
        }
        let served = w.sink.get(&name).is_some_and(|o| {
            !o.spec.ipam.pool.is_empty()
                || o.spec
                    .ipam
                    .pools
                    .allocated
                    .iter()
                    .any(|a| !a.cidrs.is_empty())
        });
        let status = w
            .sink
            .get(&name)
            .and_then(|o| o.status)
            .and_then(|s| s.ipam.operator_status.error);
        // EC2 refused the node's first call (a full subnet, a refused attach): the operator
        // acted; its retries are the backoff's business, not a wait on a timer.
        let refused = status
            .as_deref()
            .is_some_and(|e| e.starts_with("Ec2Error:"));
        if served || refused || matches!(crate::check::excused(w, &name, n, 1), Some(Ok(()))) {
            continue;
        }
        return Err((
            "every node present at a start served within one pass of the first listing",
            format!("{name} has no address {BOUND} s after the start (operator-status {status:?})"),
        ));
    }
    Ok(())
}
