//! The crash §14.1 of docs/rules.md is about (`make dst` seed 25): the operator stops right after
//! an unassign took effect, while describes may still list the address on its ENI for up to the
//! account's lag; the next process must not put it back in a pool (EC2 may already have given
//! it to another node). Random crashes (`P_CRASH`) land in that window too rarely for the
//! planted defect `trust-lagging-describe` to be found within 200 seeds; this event aims at it.
//!
//! Its choices come from a stream of its own (as crate::reuse's), so adding it moves no other
//! draw of a seed's schedule.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use eni_operator::ec2::Operation;

use crate::world::World;

/// Per mille, for each simulated second in which an unassign succeeded.
const P_CRASH_AFTER_UNASSIGN: u32 = 100;

pub struct UnassignCrash {
    rng: StdRng,
    /// Successful unassigns seen so far.
    seen: u64,
}

impl UnassignCrash {
    pub fn new(seed: u64) -> Self {
        Self {
            rng: StdRng::seed_from_u64(seed ^ 0x0a55_1600_0000_0025),
            seen: 0,
        }
    }
}

/// While the faults last: maybe crash the operator right after this second's unassigns.
pub fn events(w: &mut World, t: u64) {
    let ok = w.sim.stats().get(Operation::UnassignPrivateIpAddresses).ok;
    let fresh = ok > w.unassign_crash.seen;
    w.unassign_crash.seen = ok;
    if fresh && w.unassign_crash.rng.random_range(0..1000) < P_CRASH_AFTER_UNASSIGN {
        w.log(t, "operator crashes right after an unassign".into());
        w.crash_and_restart(t);
    }
}
