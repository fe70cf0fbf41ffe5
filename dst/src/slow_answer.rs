//! An agent's write that lands between a pass's write and the pass's end (issue 29 item 2,
//! docs/rules.md §12.1): the answer to one of the operator's writes is slow (committed at once,
//! answered 1-3 s later, as a loaded API server or a slow network answers), so the agents, who
//! read the committed object, react within that time (a classic agent starts pods on new pool
//! addresses and writes `used`, answers a release proposal; a multi-pool agent reports its
//! demand) and the watch delivers their update before the pass stores what its write returned.
//! The invariant is `crate::api::check` ("no agent update lost").
//!
//! Its choices come from a stream of its own (as crate::unassign_crash's), so adding it moves
//! no other draw of a seed's schedule.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::world::World;

/// Per mille per simulated second, while the faults last.
const P_SLOW_ANSWER: u32 = 60;

pub struct SlowAnswer {
    rng: StdRng,
}

impl SlowAnswer {
    pub fn new(seed: u64) -> Self {
        Self {
            rng: StdRng::seed_from_u64(seed ^ 0x5107_a45e_0000_0029),
        }
    }
}

/// While the faults last: maybe make the answer to the operator's next write slow.
pub fn events(w: &mut World, t: u64) {
    let rng = &mut w.slow_answer.rng;
    if rng.random_range(0..1000) >= P_SLOW_ANSWER {
        return;
    }
    let ms = rng.random_range(1_000..=3_000);
    w.sink.inject_slow_answer(Duration::from_millis(ms));
    w.log(
        t,
        format!("api answers the operator's next write {ms} ms late"),
    );
}
