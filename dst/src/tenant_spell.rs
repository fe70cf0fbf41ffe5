//! Another tenant's spell (issue 41): in some runs another tool of the account (a fleet launch,
//! an apply) empties every throttling bucket and takes 90 % of their refill for 20 to 120 s,
//! while every live node's demand rises, so the operator's calls meet empty buckets and its gate
//! cuts their rates. The invariant: after the spell ends, every bucket of a live operator process
//! that was below its ceiling (and held at it for [`HELD`] before the spell) is back at its
//! ceiling within [`BOUND`] (the gate's restore probe,
//! `src/ec2/gate/rate.rs`). Growth by successes alone takes minutes at the DST's few calls
//! (planted defect `growth-only-by-successes`).
//!
//! Only in runs where the account leaves the ceiling to us once the spell is over: no steady
//! tenant (`crate::account`) and no Cilium operator beside ours (`crate::cilium`), whose calls
//! would hold the rates below the ceiling with no defect. Its choices come from a stream of its
//! own, so adding it moves no other draw of a seed's schedule.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use eni_operator::ec2::Bucket;
use eni_operator::ec2::gate::Gate;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::check::Broken;
use crate::world::World;

/// The share of every refill the tenant takes during its spell (the bench's `spell` rows).
const SHARE: f64 = 0.9;
/// Back at the ceiling within this long after the spell: the early probe interval (8 s), a ramp
/// from the floor (7 s), and room for injected throttled answers on the way.
pub const BOUND: u64 = 60;
/// Only buckets held at their ceiling this long before the spell are watched: a bucket cut
/// earlier (an injected throttled answer) may have left the gate's early phase, where its probe
/// interval doubles past the bound (`rate::RESET_AFTER` at the ceiling starts it afresh).
const HELD: u64 = 120;

/// (bucket, current rate, ceiling) of one operator process's gate; `None` once it is gone.
pub type Rates = Arc<dyn Fn() -> Option<Vec<(&'static str, f64, f64)>> + Send + Sync>;

/// The rates of `gate`'s buckets beside their ceilings.
pub fn rates<E>(gate: &Gate<E>) -> Vec<(&'static str, f64, f64)> {
    let ceiling = |name: &str| {
        Bucket::ALL
            .into_iter()
            .find(|b| b.name() == name)
            .map_or(f64::INFINITY, |b| gate.config().bucket_limits(b).1)
    };
    gate.rates()
        .into_iter()
        .map(|(name, rate)| (name, rate, ceiling(name)))
        .collect()
}

/// The gates of every operator process the run started (`crate::probes::Probes::gates`).
#[derive(Clone, Default)]
pub struct Gates(Arc<Mutex<Vec<Rates>>>);

impl Gates {
    pub fn watch(&self, rates: Rates) {
        let mut all = self.0.lock().expect("gates");
        all.retain(|r| r().is_some());
        all.push(rates);
    }

    fn live(&self) -> Vec<Rates> {
        self.0
            .lock()
            .expect("gates")
            .iter()
            .filter(|r| r().is_some())
            .cloned()
            .collect()
    }
}

pub struct TenantSpell {
    /// (start, length) in simulated seconds, drawn for every run.
    plan: (u64, u64),
    started: bool,
    /// From [`HELD`] before the spell to its start: each live process's buckets at their ceiling
    /// all along.
    held: Vec<(Rates, Vec<&'static str>)>,
    /// From the spell's end: each live process's buckets that were below their ceiling, and
    /// whether each has been back at it since.
    watched: Vec<(Rates, Vec<(&'static str, bool)>)>,
}

impl TenantSpell {
    pub fn new(seed: u64) -> Self {
        let mut rng = StdRng::seed_from_u64(seed ^ 0x7e4a_4750_e110_0041);
        let start = if rng.random_bool(0.5) {
            rng.random_range(HELD + 30..=900)
        } else {
            u64::MAX
        };
        Self {
            plan: (start, rng.random_range(20..=120)),
            started: false,
            held: Vec::new(),
            watched: Vec::new(),
        }
    }
}

/// While the faults last: the spell starts at its second, if the run's account allows one.
pub fn events(w: &mut World, t: u64) {
    let (start, length) = w.tenant_spell.plan;
    if t != start || w.account.tenant_share > 0.0 || w.cilium.is_some() {
        return;
    }
    w.tenant_spell.started = true;
    w.sim
        .tenant_spell(Duration::ZERO, Duration::from_secs(length), SHARE);
    let names: Vec<String> = w
        .nodes
        .iter_mut()
        .filter(|(_, n)| n.running())
        .map(|(name, n)| {
            n.agent.target = n.capacity;
            name.clone()
        })
        .collect();
    w.log(
        t,
        format!(
            "tenant spell: every bucket emptied, {:.0} % of the refill taken for {length} s; demand of {} -> capacity",
            SHARE * 100.0,
            names.join(", ")
        ),
    );
}

/// Every second: at the spell's end, note the buckets below their ceiling; within [`BOUND`]
/// after it, each must have been back at its ceiling.
pub fn check(w: &mut World, t: u64) -> Result<(), Broken> {
    let gates = w.probes.gates.clone();
    let spell = &mut w.tenant_spell;
    let (start, length) = spell.plan;
    if start == u64::MAX {
        return Ok(());
    }
    if t == start - HELD {
        spell.held = gates.live().into_iter().map(|r| (r, Vec::new())).collect();
        for (r, names) in &mut spell.held {
            *names = r().unwrap_or_default().iter().map(|(n, ..)| *n).collect();
        }
    }
    if t > start - HELD && t <= start {
        for (r, names) in &mut spell.held {
            let now = r().unwrap_or_default();
            names.retain(|n| {
                now.iter()
                    .any(|(m, rate, ceiling)| m == n && rate >= ceiling)
            });
        }
    }
    if !spell.started || t < start + length || t > start + length + BOUND {
        return Ok(());
    }
    if t == start + length {
        spell.watched = std::mem::take(&mut spell.held)
            .into_iter()
            .filter_map(|(r, held)| {
                let below: Vec<_> = r()?
                    .into_iter()
                    .filter(|(n, rate, ceiling)| rate < ceiling && held.contains(n))
                    .map(|(name, ..)| (name, false))
                    .collect();
                Some((r, below))
            })
            .collect();
        let cut: usize = spell.watched.iter().map(|(_, b)| b.len()).sum();
        w.log(
            t,
            format!("tenant spell over: {cut} buckets below their ceiling"),
        );
        return Ok(());
    }
    for (r, buckets) in &mut spell.watched {
        // A process that ended meanwhile (a crash, a lost lease) has no rate to come back.
        let Some(now) = r() else {
            buckets.clear();
            continue;
        };
        for (name, back) in buckets.iter_mut() {
            *back |= now
                .iter()
                .any(|(n, rate, ceiling)| *n == *name && rate >= ceiling);
        }
    }
    if t < start + length + BOUND {
        return Ok(());
    }
    let late: Vec<&str> = spell
        .watched
        .iter()
        .flat_map(|(_, b)| b.iter().filter(|(_, back)| !back).map(|(n, _)| *n))
        .collect();
    if late.is_empty() {
        return Ok(());
    }
    Err((
        "back at the ceiling within the bound after a tenant's spell",
        format!(
            "{BOUND} s after a spell of {length} s, still below the ceiling: {}",
            late.join(", ")
        ),
    ))
}
