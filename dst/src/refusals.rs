//! EC2 refusing an attach: `AttachmentLimitExceeded` for one `AttachNetworkInterface`, as when
//! another tool's ENI held the instance's last slot for a moment (attached and detached again
//! between two of our describes). The executor deletes the ENI it could not attach, so the
//! client token of that create is spent: the next create for the same slot must use a new one,
//! or EC2 answers with the deleted ENI for hours (EC2's idempotency, docs/rules.md).
//!
//! Drawn from its own stream of the seed, so the other events of a seed stay as they were.

use eni_operator::ec2::Operation;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::world::World;

/// Per mille per simulated second, while the faults last.
const P_REFUSE_ATTACH: u32 = 2;

pub struct Refusals {
    rng: StdRng,
}

impl Refusals {
    pub fn new(seed: u64) -> Self {
        Self {
            rng: StdRng::seed_from_u64(seed ^ 0xa77a_c4ed),
        }
    }

    /// The refusals of one second.
    pub fn tick(&mut self, w: &mut World, t: u64) {
        if self.rng.random_range(0..1000) < P_REFUSE_ATTACH {
            w.sim.inject_error(
                Operation::AttachNetworkInterface,
                "AttachmentLimitExceeded",
                1,
            );
            w.log(
                t,
                "ec2 refuses the next attach (AttachmentLimitExceeded)".into(),
            );
        }
    }
}
