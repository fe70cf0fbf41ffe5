//! What a replay compares: the calls the simulator answered (when, which operation, which
//! answer), recorded on request. Two runs of one simulation seed are the same run when they
//! made the same calls at the same simulated instants and got the same answers.

use tokio::time::Instant;

use eni_operator::ec2::Operation;
use eni_operator::ec2::Result;

/// One answered call.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Call {
    /// When it was answered (tokio time).
    pub at: Instant,
    pub op: Operation,
    /// `"ok"` or the error code (`RequestLimitExceeded`, `Timeout`, an AWS client error, ...).
    pub answer: String,
}

/// Off by default (a benchmark makes millions of calls); [`super::Simulator::record_calls`].
#[derive(Debug, Default)]
pub(crate) struct CallLog {
    pub(crate) on: bool,
    pub(crate) calls: Vec<Call>,
    /// How many calls named each instance (a describe's instance filter, an attach), whether
    /// or not `on`: one counter per instance, so it stays as small as the account.
    pub(crate) named: std::collections::BTreeMap<String, u64>,
}

impl CallLog {
    pub(crate) fn record<T>(&mut self, at: Instant, op: Operation, result: &Result<T>) {
        if self.on {
            let answer = match result {
                Ok(_) => "ok".to_string(),
                Err(e) => e.code.clone(),
            };
            self.calls.push(Call { at, op, answer });
        }
    }
}
