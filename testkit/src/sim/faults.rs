//! Injected trouble and per-operation counters: latency, random faults at a seeded rate,
//! one-off errors for the next N calls of an operation.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use eni_operator::ec2::error::Ec2Error;
use eni_operator::ec2::model::Operation;

/// Counters of one operation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpStats {
    /// Every call, whatever its answer.
    pub calls: u64,
    /// Calls answered `RequestLimitExceeded` by the simulated buckets.
    pub throttled: u64,
    /// Calls answered with an injected fault (random or one-off).
    pub faults: u64,
    /// Calls that reached the simulated EC2 and succeeded.
    pub ok: u64,
    /// Calls that reached the simulated EC2 and failed on its rules.
    pub rejected: u64,
}

/// A snapshot of the counters of every operation called so far.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SimStats {
    pub ops: BTreeMap<Operation, OpStats>,
}

impl SimStats {
    pub fn get(&self, op: Operation) -> OpStats {
        self.ops.get(&op).copied().unwrap_or_default()
    }

    /// Sum over every operation.
    pub fn total(&self) -> OpStats {
        self.ops.values().fold(OpStats::default(), |a, s| OpStats {
            calls: a.calls + s.calls,
            throttled: a.throttled + s.throttled,
            faults: a.faults + s.faults,
            ok: a.ok + s.ok,
            rejected: a.rejected + s.rejected,
        })
    }
}

/// An error answer to inject: AWS code, message and HTTP status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fault {
    pub code: String,
    pub message: String,
    pub http_status: u16,
}

impl Fault {
    pub fn new(code: &str, message: &str, http_status: u16) -> Self {
        Self {
            code: code.to_owned(),
            message: message.to_owned(),
            http_status,
        }
    }

    /// EC2's generic server error.
    pub fn internal_error() -> Self {
        Self::new(
            "InternalError",
            "An internal error has occurred (injected).",
            500,
        )
    }

    fn to_error(&self, op: Operation) -> Ec2Error {
        Ec2Error::from_aws(op, &self.code, &self.message, Some(self.http_status))
    }
}

#[derive(Debug)]
pub(crate) struct Faults {
    latency: BTreeMap<Operation, Duration>,
    rates: BTreeMap<Operation, (f64, Fault)>,
    queued: BTreeMap<Operation, VecDeque<Fault>>,
    /// Calls of an operation still to be carried out and then answered with a timeout.
    lost_answers: BTreeMap<Operation, usize>,
    rng: StdRng,
    pub(crate) stats: SimStats,
}

impl Faults {
    pub(crate) fn new(seed: u64) -> Self {
        Self {
            latency: BTreeMap::new(),
            rates: BTreeMap::new(),
            queued: BTreeMap::new(),
            lost_answers: BTreeMap::new(),
            rng: StdRng::seed_from_u64(seed),
            stats: SimStats::default(),
        }
    }

    pub(crate) fn reseed(&mut self, seed: u64) {
        self.rng = StdRng::seed_from_u64(seed);
    }

    pub(crate) fn latency(&self, op: Operation) -> Duration {
        self.latency.get(&op).copied().unwrap_or_default()
    }

    pub(crate) fn set_latency(&mut self, op: Operation, latency: Duration) {
        self.latency.insert(op, latency);
    }

    /// Fail a fraction `rate` (0..=1) of the calls of `op` with `fault`.
    pub(crate) fn set_rate(&mut self, op: Operation, rate: f64, fault: Fault) {
        if rate <= 0.0 {
            self.rates.remove(&op);
        } else {
            self.rates.insert(op, (rate.min(1.0), fault));
        }
    }

    pub(crate) fn queue(&mut self, op: Operation, fault: Fault, times: usize) {
        self.queued
            .entry(op)
            .or_default()
            .extend(std::iter::repeat_n(fault, times));
    }

    /// Forget the one-off faults and lost answers not met yet (configured rates stay).
    pub(crate) fn drop_queued(&mut self) {
        self.queued.clear();
        self.lost_answers.clear();
    }

    pub(crate) fn lose_answers(&mut self, op: Operation, times: usize) {
        *self.lost_answers.entry(op).or_default() += times;
    }

    /// Whether the answer to this (carried out) call of `op` is lost.
    pub(crate) fn answer_lost(&mut self, op: Operation) -> bool {
        match self.lost_answers.get_mut(&op) {
            Some(n) if *n > 0 => {
                *n -= 1;
                true
            }
            _ => false,
        }
    }

    /// The fault to answer this call of `op` with, if any (one-off faults first).
    pub(crate) fn next(&mut self, op: Operation) -> Option<Ec2Error> {
        if let Some(f) = self.queued.get_mut(&op).and_then(VecDeque::pop_front) {
            return Some(f.to_error(op));
        }
        let (rate, fault) = self.rates.get(&op)?;
        self.rng.random_bool(*rate).then(|| fault.to_error(op))
    }

    pub(crate) fn count(&mut self, op: Operation) -> &mut OpStats {
        self.stats.ops.entry(op).or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use eni_operator::ec2::error::ErrorKind;

    #[test]
    fn queued_faults_answer_exactly_n_calls() {
        let op = Operation::AttachNetworkInterface;
        let mut f = Faults::new(1);
        f.queue(op, Fault::new("RequestLimitExceeded", "slow down", 503), 2);
        let errs: Vec<_> = (0..4).map(|_| f.next(op)).collect();
        assert_eq!(errs[0].as_ref().map(|e| e.kind), Some(ErrorKind::Throttled));
        assert!(errs[1].is_some());
        assert!(errs[2].is_none() && errs[3].is_none());
        assert!(f.next(Operation::DescribeVpcs).is_none());
    }

    #[test]
    fn dropped_one_off_faults_answer_no_later_call() {
        let op = Operation::AttachNetworkInterface;
        let mut f = Faults::new(1);
        f.queue(op, Fault::internal_error(), 3);
        f.lose_answers(op, 2);
        assert!(f.next(op).is_some());
        f.drop_queued();
        assert!(f.next(op).is_none());
        assert!(f.lost_answers.is_empty());
    }

    #[test]
    fn fault_rate_is_seeded_and_roughly_right() {
        let op = Operation::CreateNetworkInterface;
        let run = |seed| {
            let mut f = Faults::new(seed);
            f.set_rate(op, 0.25, Fault::internal_error());
            (0..4000).map(|_| f.next(op).is_some()).collect::<Vec<_>>()
        };
        let a = run(7);
        assert_eq!(a, run(7), "same seed, same faults");
        let n = a.iter().filter(|&&x| x).count();
        assert!((800..1200).contains(&n), "{n} faults of 4000 at 25%");
        let mut f = Faults::new(1);
        f.set_rate(op, 0.25, Fault::internal_error());
        f.reseed(7);
        let reseeded: Vec<_> = (0..4000).map(|_| f.next(op).is_some()).collect();
        assert_eq!(a, reseeded, "reseeding keeps the configured rate");
        f.set_rate(op, 1.0, Fault::internal_error());
        let e = f.next(op).unwrap();
        assert_eq!(
            (e.kind, e.code.as_str()),
            (ErrorKind::Transient, "InternalError")
        );
        f.set_rate(op, 0.0, Fault::internal_error());
        assert!(f.next(op).is_none());
    }
}
