//! The scale benchmark (`make bench`, `src/main.rs`): scenarios that drive the real
//! allocation core against the simulator under paused tokio time ([`scenario`]), the pure
//! figures derived from them (lower bound, table rows; here), the recovery after another
//! tenant's spell ([`spell`]) and the heap figures' types
//! ([`heap`]). The binary counts the heap and draws the plots ([`plot`]). `make demo` is
//! [`demo`] (its binary is `src/bin/demo.rs`).

pub mod cluster;
pub mod demo;
pub mod heap;
pub mod plot;
pub mod process;
pub mod scenario;
pub mod spell;

use std::collections::BTreeMap;
use std::time::Duration;

use eni_operator::ec2::{Bucket, Operation};

/// The rate-limit lower bound of a run: for each bucket, the calls beyond its burst divided by
/// its refill rate; the largest of these plus one chain of call latencies (the one sequence of
/// calls no amount of parallelism removes).
pub fn lower_bound(
    calls: &BTreeMap<Bucket, u64>,
    limits: impl Fn(Bucket) -> (u32, f64),
    chain: Duration,
) -> Duration {
    let drain = calls
        .iter()
        .map(|(b, n)| {
            let (burst, refill) = limits(*b);
            let beyond = n.saturating_sub(u64::from(burst)) as f64;
            if beyond == 0.0 { 0.0 } else { beyond / refill }
        })
        .fold(0.0, f64::max);
    Duration::from_secs_f64(drain) + chain
}

/// Calls per AWS bucket of a list of (operation, count).
pub fn per_bucket(calls: impl IntoIterator<Item = (Operation, u64)>) -> BTreeMap<Bucket, u64> {
    let mut out = BTreeMap::new();
    for (op, n) in calls {
        *out.entry(op.bucket()).or_default() += n;
    }
    out
}

/// ENIs a node needs beyond those it has, to hold `demand` addresses: each new ENI takes
/// `per_eni` of them (secondary IPs: limit − 1; prefixes: (limit − 1) × 16).
pub fn enis_needed(demand: u32, per_eni: u32) -> u32 {
    demand.div_ceil(per_eni.max(1))
}

/// One line of the results table.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Row {
    pub scenario: String,
    pub nodes: usize,
    /// Simulated time until every node's demand was met.
    pub time: Duration,
    /// `None` where no lower bound is defined (steady-state churn).
    pub lower_bound: Option<Duration>,
    pub mutating_per_node: f64,
    pub describe_per_node: f64,
    /// Mutating calls per ENI created (create + attach + modify), `None` without new ENIs.
    pub calls_per_new_eni: Option<f64>,
    /// Calls answered with a client error (a request bound to fail).
    pub rejected: u64,
    pub throttled: u64,
    pub writes_per_node: f64,
    /// Peak live heap of the whole process during the scenario (simulator and in-memory API
    /// server included); `None` without the counting allocator.
    pub process_heap_peak_mib: Option<f64>,
    /// Heap the operator core held at the end (`None` without the counting allocator).
    pub operator_heap_mib: Option<f64>,
    /// Microseconds of CPU per `plan_node` call.
    pub plan_us: f64,
}

impl Row {
    pub fn ratio(&self) -> Option<f64> {
        let lb = self.lower_bound?.as_secs_f64();
        (lb > 0.0).then(|| self.time.as_secs_f64() / lb)
    }
}

fn secs(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}

/// The results as a Markdown table.
pub fn table(rows: &[Row]) -> String {
    let mut out = String::from(
        "| scenario | nodes | demand met | lower bound | ratio | mutating/node | describe/node \
         | calls/new ENI | failed calls | throttled | CiliumNode writes/node | process heap peak \
         | operator heap | CPU/plan |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in rows {
        let lb = r.lower_bound.map_or("-".into(), secs);
        let ratio = r.ratio().map_or("-".into(), |x| format!("{x:.2}x"));
        let per_eni = r
            .calls_per_new_eni
            .map_or("-".into(), |x| format!("{x:.2}"));
        let mib = |m: Option<f64>| m.map_or("-".into(), |m| format!("{m:.0} MiB"));
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {:.2} | {:.2} | {} | {} | {} | {:.2} | {} | {} | {:.1} µs |\n",
            r.scenario,
            r.nodes,
            secs(r.time),
            lb,
            ratio,
            r.mutating_per_node,
            r.describe_per_node,
            per_eni,
            r.rejected,
            r.throttled,
            r.writes_per_node,
            mib(r.process_heap_peak_mib),
            mib(r.operator_heap_mib),
            r.plan_us,
        ));
    }
    out
}

/// One line of the shared-account table.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SharedRow {
    pub gate: String,
    /// Share of every AWS bucket the other tenant uses.
    pub other_share: f64,
    pub nodes: usize,
    /// Simulated time until every node's demand was met (or the limit).
    pub time: Duration,
    /// The lower bound at the capacity the other tenant leaves.
    pub lower_bound: Duration,
    /// Our calls (attempts, pages included) and the throttled answers among them.
    pub calls: u64,
    pub throttled: u64,
    /// The same after the learning phase (`scenario::LEARNING`).
    pub calls_after_learning: u64,
    pub throttled_after_learning: u64,
    /// EC2 calls that returned an error to the operator after the gate's retries.
    pub failed_operations: u64,
    /// Nodes whose demand was never met.
    pub stuck: usize,
}

impl SharedRow {
    pub fn ratio(&self) -> f64 {
        self.time.as_secs_f64() / self.lower_bound.as_secs_f64().max(1e-9)
    }

    /// Throttled answers after the learning phase, as a share of our calls then.
    pub fn throttled_share_after_learning(&self) -> f64 {
        self.throttled_after_learning as f64 / (self.calls_after_learning.max(1)) as f64
    }
}

/// The shared-account results as a Markdown table.
pub fn shared_table(rows: &[SharedRow]) -> String {
    let mut out = String::from(
        "| gate | other tenant | nodes | demand met | bound (capacity left) | ratio | throttled \
         / calls | throttled after 30 s | failed operations | nodes stuck |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in rows {
        out.push_str(&format!(
            "| {} | {:.0} % | {} | {} | {} | {:.2}x | {} / {} | {:.1} % ({} / {}) | {} | {} |\n",
            r.gate,
            r.other_share * 100.0,
            r.nodes,
            secs(r.time),
            secs(r.lower_bound),
            r.ratio(),
            r.throttled,
            r.calls,
            r.throttled_share_after_learning() * 100.0,
            r.throttled_after_learning,
            r.calls_after_learning,
            r.failed_operations,
            r.stuck,
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn aws(b: Bucket) -> (u32, f64) {
        let (burst, rate) = b.aws_default();
        (burst, f64::from(rate))
    }

    #[test]
    fn lower_bound_is_the_slowest_bucket_plus_the_chain() {
        let calls = per_bucket([
            (Operation::CreateNetworkInterface, 1100), // (1100-100)/5 = 200 s
            (Operation::AttachNetworkInterface, 1100), // (1100-50)/5 = 210 s
            (Operation::DescribeNetworkInterfaces, 50), // within the burst
        ]);
        let lb = lower_bound(&calls, aws, Duration::from_millis(900));
        assert_eq!(lb, Duration::from_secs(210) + Duration::from_millis(900));
    }

    #[test]
    fn calls_within_every_burst_leave_only_the_chain() {
        let calls = per_bucket([(Operation::CreateNetworkInterface, 100)]);
        assert_eq!(
            lower_bound(&calls, aws, Duration::from_secs(1)),
            Duration::from_secs(1)
        );
    }

    #[test]
    fn detach_and_attach_have_buckets_of_their_own() {
        let calls = per_bucket([
            (Operation::AttachNetworkInterface, 3),
            (Operation::DetachNetworkInterface, 4),
        ]);
        assert_eq!(calls.get(&Bucket::AttachNetworkInterface), Some(&3));
        assert_eq!(calls.get(&Bucket::DetachNetworkInterface), Some(&4));
    }

    #[test]
    fn shared_table_reports_the_ratio_and_the_late_throttled_share() {
        let row = SharedRow {
            gate: "default gate".into(),
            other_share: 0.7,
            nodes: 10,
            time: Duration::from_secs(120),
            lower_bound: Duration::from_secs(100),
            calls: 300,
            throttled: 20,
            calls_after_learning: 200,
            throttled_after_learning: 4,
            failed_operations: 0,
            stuck: 0,
        };
        let t = shared_table(&[row]);
        assert_eq!(t.lines().count(), 3);
        let line = t.lines().last().unwrap();
        assert!(line.contains("| 70 % |"), "{line}");
        assert!(line.contains("| 1.20x |"), "{line}");
        assert!(line.contains("| 2.0 % (4 / 200) |"), "{line}");
        assert_eq!(
            t.lines().nth(1).unwrap().matches('|').count(),
            line.matches('|').count()
        );
    }

    #[test]
    fn enis_needed_rounds_up() {
        assert_eq!(enis_needed(30, 14), 3);
        assert_eq!(enis_needed(28, 14), 2);
        assert_eq!(enis_needed(30, 14 * 16), 1);
    }

    #[test]
    fn table_has_one_line_per_row_and_the_ratio() {
        let row = Row {
            scenario: "burst".into(),
            nodes: 10,
            time: Duration::from_secs(22),
            lower_bound: Some(Duration::from_secs(20)),
            ..Row::default()
        };
        assert_eq!(row.ratio(), Some(1.1));
        let t = table(&[
            row.clone(),
            Row {
                lower_bound: None,
                ..row
            },
        ]);
        assert_eq!(t.lines().count(), 4);
        assert!(t.contains("1.10x"), "{t}");
        assert!(t.lines().last().unwrap().contains("| - | - |"), "{t}");
        assert_eq!(
            t.lines().nth(1).unwrap().matches('|').count(),
            t.lines().nth(2).unwrap().matches('|').count(),
            "header and rows have the same columns"
        );
    }
}
