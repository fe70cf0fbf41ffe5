//! The `spell` scenario: how fast the gate is back at full speed after another tenant of the
//! account had a throttled spell, and how fast it finds a larger share when the tenant takes
//! less. The operator has a backlog throughout (a burst of nodes larger than the run can
//! serve), so every constrained bucket would use all the account leaves. Per-second samples of
//! the simulator's answers and the gate's rates; [`recovered_at`] reads them (pure).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use tokio::time::Instant;

use eni_operator::ec2::{Bucket, Operation};

use crate::scenario::{GateMode, Settings, world_shared};

/// What the other tenant does: from `at`, it takes `share` of every bucket's refill; with
/// `empty`, it first takes every token left (a fleet launch).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TenantStep {
    pub at: Duration,
    pub share: f64,
    pub empty: bool,
}

/// One run: the tenant's steps, the step after which recovery is measured, and the target.
#[derive(Clone, Debug, PartialEq)]
pub struct SpellCase {
    pub name: String,
    /// The spell's length (`None`: not a spell, the share drop).
    pub spell: Option<Duration>,
    pub steps: Vec<TenantStep>,
    /// Recovery is measured from this step's `at` (the spell's end, the share's drop).
    pub from: usize,
    pub target: Duration,
    /// Whether recovered also needs the rate gauge at its ceiling (not when the account
    /// leaves less than the ceiling).
    pub at_ceiling: bool,
    /// Seconds over which successes are compared with what the account leaves.
    pub window: usize,
}

impl SpellCase {
    /// Another tenant empties every bucket at 30 s and takes 90 % of the refill for `d`.
    pub fn spell(d: Duration) -> Self {
        let start = Duration::from_secs(30);
        Self {
            name: format!("spell of {} s", d.as_secs()),
            spell: Some(d),
            steps: vec![
                TenantStep {
                    at: start,
                    share: 0.9,
                    empty: true,
                },
                TenantStep {
                    at: start + d,
                    share: 0.0,
                    empty: false,
                },
            ],
            from: 1,
            target: if d <= Duration::from_secs(120) {
                Duration::from_secs(20)
            } else {
                d + Duration::from_secs(20)
            },
            at_ceiling: true,
            window: WINDOW,
        }
    }

    /// The tenant takes 90 % from the start and 50 % from 50 s.
    pub fn share_drop() -> Self {
        Self {
            name: "share 90 % to 50 % at 50 s".into(),
            spell: None,
            steps: vec![
                TenantStep {
                    at: Duration::ZERO,
                    share: 0.9,
                    empty: false,
                },
                TenantStep {
                    at: Duration::from_secs(50),
                    share: 0.5,
                    empty: false,
                },
            ],
            from: 1,
            target: Duration::from_secs(30),
            at_ceiling: false,
            // Below the ceiling the rate is cut and regained about every hundred calls (the
            // account's bucket keeps what a dip leaves): the share is met over half a minute,
            // not in every 5 s.
            window: 30,
        }
    }

    fn from(&self) -> Duration {
        self.steps[self.from].at
    }

    fn share_at(&self, t: Duration) -> f64 {
        self.steps
            .iter()
            .rev()
            .find(|s| s.at <= t)
            .map_or(0.0, |s| s.share)
    }

    /// The run ends this long after the start: the target and half a minute to show it holds.
    fn horizon(&self) -> Duration {
        self.from() + self.target + Duration::from_secs(30 + self.window as u64)
    }
}

/// The account's state and our figures at one second of the run (cumulative counts).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Sample {
    pub t: f64,
    pub ok: BTreeMap<Bucket, u64>,
    pub throttled: BTreeMap<Bucket, u64>,
    /// The gate's rate of each bucket (by its name) and whether it is at its ceiling.
    pub at_ceiling: BTreeMap<Bucket, bool>,
}

/// Seconds over which successes are compared with what the account leaves after a spell.
pub const WINDOW: usize = 5;
/// Successes over a window must be at least this share of what the account leaves.
pub const ENOUGH: f64 = 0.9;

/// The first sample index at or after `from` from which, for every later full window of
/// `window` seconds, each of `buckets` had at least [`ENOUGH`] of `left(bucket)` successes a
/// second (and, with `at_ceiling`, its rate at the ceiling at the window's start). `None`: never
/// within the run.
pub fn recovered_at(
    samples: &[Sample],
    window: usize,
    from: usize,
    buckets: &BTreeSet<Bucket>,
    left: impl Fn(Bucket) -> f64,
    at_ceiling: bool,
) -> Option<usize> {
    let ok = |i: usize| {
        i + window < samples.len()
            && buckets.iter().all(|b| {
                let got = samples[i + window].ok.get(b).copied().unwrap_or(0)
                    - samples[i].ok.get(b).copied().unwrap_or(0);
                got as f64 >= ENOUGH * left(*b) * window as f64
                    && (!at_ceiling || samples[i].at_ceiling.get(b).copied().unwrap_or(false))
            })
    };
    let last = samples.len().checked_sub(window + 1)?;
    // Scan back from the last full window: the answer is where the run of good windows starts.
    let mut start = None;
    for i in (from..=last).rev() {
        if ok(i) {
            start = Some(i);
        } else {
            break;
        }
    }
    start
}

/// The figures of one run.
#[derive(Clone, Debug, PartialEq)]
pub struct SpellRow {
    pub case: String,
    pub spell: Option<Duration>,
    pub nodes: usize,
    pub target: Duration,
    /// From the spell's end (the share's drop) to recovered; `None`: not within the run.
    pub recovered: Option<Duration>,
    /// From the spell's end to the second from which every constrained bucket's rate gauge
    /// stays at its ceiling (the gate's own recovery; the e2e and the DST watch this one).
    pub at_ceiling: Option<Duration>,
    /// The buckets the backlog kept busy (measured).
    pub buckets: Vec<&'static str>,
    /// Throttled answers per constrained bucket from the first step to the end of the run.
    pub throttled: Vec<(&'static str, u64)>,
    pub failed_operations: u64,
}

impl SpellRow {
    pub fn met(&self) -> bool {
        self.recovered.is_some_and(|r| r <= self.target)
    }
}

/// Spells up to this long have the short target; the sweep over them finds the worst length.
pub const SHORT: Duration = Duration::from_secs(120);
/// Spell lengths the table always shows in full; the other short ones are the sweep's, shown
/// in full only when worst and otherwise listed in one line under the table.
pub const SHOWN: [u64; 3] = [20, 120, 600];

/// The short spell that recovered last (not within the run counts as the worst).
fn worst_short(rows: &[SpellRow]) -> Option<&SpellRow> {
    rows.iter()
        .filter(|r| r.spell.is_some_and(|d| d <= SHORT))
        .max_by_key(|r| (r.recovered.is_none(), r.recovered, r.spell))
}

fn recovered_text(r: &SpellRow) -> String {
    r.recovered.map_or("not within the run".to_string(), |d| {
        format!("{:.0} s", d.as_secs_f64())
    })
}

/// The spell results as a Markdown table: the named lengths, the share drop and the worst short
/// spell in rows; every short spell's recovery in one line under it (with more than the named).
pub fn spell_table(rows: &[SpellRow]) -> String {
    let worst = worst_short(rows);
    let mut out = String::from(
        "| case | nodes (backlog) | recovered after | rates at their ceiling after | target | \
         met | throttled answers per bucket (from the first step) | failed operations |\n\
         |---|---:|---:|---:|---:|---|---|---:|\n",
    );
    let shown = |r: &SpellRow| {
        r.spell.is_none_or(|d| SHOWN.contains(&d.as_secs())) || worst.is_some_and(|w| w == r)
    };
    for r in rows.iter().filter(|r| shown(r)) {
        let throttled = r
            .throttled
            .iter()
            .map(|(b, n)| format!("{b} {n}"))
            .collect::<Vec<_>>()
            .join(", ");
        let case = if worst.is_some_and(|w| w == r) {
            format!("{} (worst of the short spells)", r.case)
        } else {
            r.case.clone()
        };
        out.push_str(&format!(
            "| {} | {} | {} | {} | ≤ {} s | {} | {} | {} |\n",
            case,
            r.nodes,
            recovered_text(r),
            r.at_ceiling
                .map_or("-".to_string(), |d| format!("{:.0} s", d.as_secs_f64())),
            r.target.as_secs(),
            if r.met() { "yes" } else { "NO" },
            throttled,
            r.failed_operations,
        ));
    }
    let short: Vec<&SpellRow> = rows
        .iter()
        .filter(|r| r.spell.is_some_and(|d| d <= SHORT))
        .collect();
    if let Some(w) = worst.filter(|_| short.iter().any(|r| !shown(r))) {
        let each = short
            .iter()
            .map(|r| {
                format!(
                    "{} s → {}",
                    r.spell.unwrap_or_default().as_secs(),
                    recovered_text(r)
                )
            })
            .collect::<Vec<_>>()
            .join(", ");
        out.push_str(&format!(
            "\nEvery spell of up to {} s ({} lengths): the worst recovered after {} (a spell of \
             {} s; target {} s). Spell length → recovered after: {each}.\n",
            SHORT.as_secs(),
            short.len(),
            recovered_text(w),
            w.spell.unwrap_or_default().as_secs(),
            w.target.as_secs(),
        ));
    }
    out
}

/// Run `case` with AWS's full rates in the gate (its ceiling is what an empty account leaves,
/// so "at the ceiling" and "what the account leaves" are the same figure).
pub async fn run(s: &Settings, case: &SpellCase) -> SpellRow {
    let mode = GateMode::AwsFull;
    let w = world_shared(s, mode, false, false, 0.0);
    let horizon = case.horizon();
    // A backlog throughout: more ENIs than the whole run could create at the full refill.
    let per_eni = crate::scenario::per_new_eni(s, false);
    let per_node = u64::from(crate::enis_needed(s.ips_per_node as u32, per_eni)).max(1);
    let (_, refill) = Bucket::CreateNetworkInterface.aws_default();
    let nodes = (u64::from(refill) * horizon.as_secs() * 6 / 5 / per_node) as usize + 50;
    for i in 0..nodes {
        w.join(s, &format!("node-{i}"), s.ips_per_node);
    }
    let start = Instant::now();
    let mut steps = case.steps.iter().peekable();
    let mut samples = Vec::new();
    let ceiling = |b: Bucket| mode.config().bucket_limits(b).1;
    loop {
        let t = start.elapsed();
        while let Some(step) = steps.next_if(|st| st.at <= t) {
            if step.empty {
                w.sim.empty_buckets();
            }
            w.sim.set_other_tenant_share(step.share);
        }
        samples.push(sample(&w, t, ceiling));
        if t >= horizon {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let from = case.from().as_secs() as usize;
    // Constrained: the buckets that used at least 80 % of what the account left in the ten
    // seconds before the first step (or after it, when it is at the start).
    let before = case.steps[0].at.as_secs() as usize;
    let (a, b) = if before >= 10 {
        (before - 10, before)
    } else {
        (from - 10, from)
    };
    let share = case.share_at(Duration::from_secs(a as u64));
    let buckets: BTreeSet<Bucket> = Bucket::ALL
        .into_iter()
        .filter(|bk| {
            let got = samples[b].ok.get(bk).copied().unwrap_or(0)
                - samples[a].ok.get(bk).copied().unwrap_or(0);
            let (_, refill) = bk.aws_default();
            got as f64 >= 0.8 * f64::from(refill) * (1.0 - share) * (b - a) as f64
        })
        .collect();
    let after = case.share_at(case.from());
    let recovered = recovered_at(
        &samples,
        case.window,
        from,
        &buckets,
        |bk| f64::from(bk.aws_default().1) * (1.0 - after),
        case.at_ceiling,
    )
    .map(|i| Duration::from_secs((i - from) as u64));
    let at_ceiling = case
        .at_ceiling
        .then(|| recovered_at(&samples, 1, from, &buckets, |_| 0.0, true))
        .flatten()
        .map(|i| Duration::from_secs((i - from) as u64));
    let first = case.steps[0].at.as_secs() as usize;
    let last = samples.last().expect("sampled");
    let throttled = buckets
        .iter()
        .map(|bk| {
            let n = last.throttled.get(bk).copied().unwrap_or(0)
                - samples[first].throttled.get(bk).copied().unwrap_or(0);
            (bk.name(), n)
        })
        .collect();
    if let Err(e) = w.sim.check_invariants() {
        panic!("simulator invariants broken: {e}");
    }
    SpellRow {
        case: case.name.clone(),
        spell: case.spell,
        nodes,
        target: case.target,
        recovered,
        at_ceiling,
        buckets: buckets.iter().map(|b| b.name()).collect(),
        throttled,
        failed_operations: w.gate.stats().total_failed(),
    }
}

fn sample(w: &crate::scenario::World, t: Duration, ceiling: impl Fn(Bucket) -> f64) -> Sample {
    let stats = w.sim.stats();
    let mut s = Sample {
        t: t.as_secs_f64(),
        ..Sample::default()
    };
    for op in Operation::ALL {
        let st = stats.get(op);
        *s.ok.entry(op.bucket()).or_default() += st.ok + st.rejected;
        *s.throttled.entry(op.bucket()).or_default() += st.throttled;
    }
    let rates: BTreeMap<&str, f64> = w.gate.rates().into_iter().collect();
    for b in Bucket::ALL {
        let rate = rates.get(b.name()).copied().unwrap_or(0.0);
        s.at_ceiling.insert(b, rate >= ceiling(b));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn samples(per_second: &[u64], ceiling_from: usize) -> Vec<Sample> {
        let mut total = 0;
        per_second
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let s = Sample {
                    t: i as f64,
                    ok: [(Bucket::CreateNetworkInterface, total)].into(),
                    throttled: BTreeMap::new(),
                    at_ceiling: [(Bucket::CreateNetworkInterface, i >= ceiling_from)].into(),
                };
                total += n;
                s
            })
            .collect()
    }

    fn create() -> BTreeSet<Bucket> {
        [Bucket::CreateNetworkInterface].into()
    }

    /// The backlog's first ENIs run out during the run: the reserves that follow must not wait
    /// for the last urgent passes, or the create bucket idles while they finish.
    #[tokio::test(start_paused = true)]
    async fn the_account_is_used_whole_after_a_spell_of_90_s() {
        let row = run(
            &Settings::default(),
            &SpellCase::spell(Duration::from_secs(90)),
        )
        .await;
        assert!(row.met(), "{row:?}");
        assert_eq!(row.failed_operations, 0);
    }

    #[test]
    fn recovered_where_the_good_windows_start_and_stay() {
        // 5/s left: a window needs 22.5 successes. Slow until 10, then full speed, with one
        // slow second at 4 that a later good run must not hide.
        let mut per = vec![1; 10];
        per[4] = 0;
        per.extend([5; 20]);
        let s = samples(&per, 0);
        assert_eq!(
            recovered_at(&s, WINDOW, 2, &create(), |_| 5.0, false),
            Some(10)
        );
        // The rate gauge reached its ceiling only at 12.
        let s = samples(&per, 12);
        assert_eq!(
            recovered_at(&s, WINDOW, 2, &create(), |_| 5.0, true),
            Some(12)
        );
    }

    fn row(d: u64, recovered: Option<u64>) -> SpellRow {
        let case = SpellCase::spell(Duration::from_secs(d));
        SpellRow {
            case: case.name,
            spell: case.spell,
            nodes: 1,
            target: case.target,
            recovered: recovered.map(Duration::from_secs),
            at_ceiling: recovered.map(Duration::from_secs),
            buckets: vec![],
            throttled: vec![],
            failed_operations: 0,
        }
    }

    #[test]
    fn the_table_shows_the_worst_short_spell_and_lists_the_sweep() {
        let rows = [
            row(10, Some(6)),
            row(20, Some(7)),
            row(45, Some(12)),
            row(50, Some(9)),
            row(120, Some(8)),
            row(600, Some(70)),
        ];
        let t = spell_table(&rows);
        assert!(
            t.contains("| spell of 45 s (worst of the short spells) | 1 | 12 s | 12 s |"),
            "{t}"
        );
        assert!(t.contains("| spell of 20 s | 1 | 7 s | 7 s |"), "{t}");
        assert!(
            t.contains("| spell of 600 s | 1 | 70 s | 70 s | ≤ 620 s |"),
            "{t}"
        );
        assert!(
            !t.contains("| spell of 50 s"),
            "a sweep length that is not the worst: {t}"
        );
        assert!(
            t.contains("the worst recovered after 12 s (a spell of 45 s; target 20 s)"),
            "{t}"
        );
        assert!(
            t.contains("10 s → 6 s, 20 s → 7 s, 45 s → 12 s, 50 s → 9 s, 120 s → 8 s."),
            "{t}"
        );
        // A run that never recovered is the worst, whatever the others took.
        let t = spell_table(&[row(20, Some(7)), row(35, None), row(40, Some(19))]);
        assert!(
            t.contains("| spell of 35 s (worst of the short spells) | 1 | not within"),
            "{t}"
        );
        // Only the named lengths: no sweep line.
        let t = spell_table(&[row(20, Some(7)), row(120, Some(9))]);
        assert!(!t.contains("Every spell"), "{t}");
    }

    #[test]
    fn a_dip_at_the_end_means_not_recovered() {
        let mut per = vec![5; 20];
        per[17] = 0;
        let s = samples(&per, 0);
        assert_eq!(recovered_at(&s, WINDOW, 0, &create(), |_| 5.0, false), None);
    }
}
