//! Where retry jitter comes from. In production from the OS, as before (so two operators never
//! retry in step); with a seed (only the simulation sets one, from its own seed) from a
//! `StdRng`, so a simulated run replays exactly: the work queue's backoff and the gate's
//! `backon` delays are the same in every run of that seed (docs/testing.md).

use std::sync::Mutex;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// A jitter source, shared by the tasks of one component.
#[derive(Debug)]
pub struct Jitter {
    seeded: Option<Mutex<StdRng>>,
}

impl Jitter {
    /// `None`: the OS's randomness (production); `Some(seed)`: a replayable sequence.
    pub fn new(seed: Option<u64>) -> Self {
        Self {
            seeded: seed.map(|s| Mutex::new(StdRng::seed_from_u64(s))),
        }
    }

    /// A number in [0, 1).
    pub fn unit(&self) -> f64 {
        match &self.seeded {
            Some(rng) => rng.lock().expect("jitter rng").random(),
            None => rand::rng().random(),
        }
    }

    /// A seed for a component with its own generator (`backon`'s jitter); `None` when that
    /// component should seed itself from the OS.
    pub fn seed(&self) -> Option<u64> {
        self.seeded
            .as_ref()
            .map(|rng| rng.lock().expect("jitter rng").random())
    }
}

/// A per-process random number (the `ClientToken` nonce): from the OS in production, from
/// `seed` in the simulation (a stream of its own, so the jitter sequence does not move).
pub fn nonce(seed: Option<u64>) -> u64 {
    match seed {
        Some(s) => StdRng::seed_from_u64(s ^ 0x0c11_e470_4e11_0ce5).random(),
        None => rand::rng().random(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_gives_the_same_sequence_and_none_leaves_it_to_the_os() {
        let (a, b) = (Jitter::new(Some(7)), Jitter::new(Some(7)));
        let xs: Vec<f64> = (0..5).map(|_| a.unit()).collect();
        let ys: Vec<f64> = (0..5).map(|_| b.unit()).collect();
        assert_eq!(xs, ys);
        assert!(xs.iter().all(|x| (0.0..1.0).contains(x)));
        assert_eq!(a.seed(), b.seed());
        assert!(a.seed().is_some());
        let os = Jitter::new(None);
        assert_eq!(os.seed(), None);
        assert!((0.0..1.0).contains(&os.unit()));
    }
}
