//! Shadow mode's comparison (`--mode=shadow`): for each node, what the serving allocator (Cilium's
//! operator) did against what eni-operator would do, from the same passes the active operator
//! runs (snapshot, plan), with nothing executed or written. The [`ShadowBook`] keeps per-node
//! figures (addresses available vs needed, deficits and how long they lasted, ENIs it would
//! create, addresses it would release, subnet and security-group choices, errors), counts
//! disagreements by [`Kind`], logs one line per disagreement, publishes the
//! `eni_operator_shadow_*` metrics and the JSON summary of `/debug/shadow`.
//!
//! The comparison itself ([`NodeState::observe`]) is pure: an observation and a time in, the
//! disagreements it starts out.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use serde::Serialize;

use crate::ec2::NetworkInterface;
use crate::ipam::{Action, Demand, NodePlan};
use crate::reconcile::status::Figures;

type Labels = Vec<(&'static str, String)>;

/// A way eni-operator would act differently from the serving allocator on a node. Counted
/// when it starts (a plan that stays the same over several passes is one disagreement).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    /// We would assign addresses to an ENI the node already has (the node is short).
    WouldAssign,
    /// We would create and attach an ENI (the node is short and its ENIs are full).
    WouldCreateEni,
    /// We would release addresses the serving allocator keeps.
    WouldRelease,
    /// We could not serve the node (no subnet, unknown type, ...).
    Error,
    /// The serving allocator put a new ENI in another subnet than the one we would pick.
    Subnet,
    /// ... or gave it other security groups than ours.
    SecurityGroups,
}

impl Kind {
    pub const ALL: [Kind; 6] = [
        Kind::WouldAssign,
        Kind::WouldCreateEni,
        Kind::WouldRelease,
        Kind::Error,
        Kind::Subnet,
        Kind::SecurityGroups,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            Kind::WouldAssign => "would-assign",
            Kind::WouldCreateEni => "would-create-eni",
            Kind::WouldRelease => "would-release",
            Kind::Error => "error",
            Kind::Subnet => "subnet",
            Kind::SecurityGroups => "security-groups",
        }
    }
}

/// What eni-operator would do for a node now (shared with `/debug/nodes`).
pub use crate::reconcile::status::Would;

fn would_kind(w: &Would) -> Option<Kind> {
    match w {
        Would::Nothing => None,
        Would::Assign { .. } => Some(Kind::WouldAssign),
        Would::CreateEni { .. } => Some(Kind::WouldCreateEni),
        Would::Release { .. } => Some(Kind::WouldRelease),
    }
}

/// An ENI attached to the node's instance (device index > 0: not the primary).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct EniSeen {
    pub id: String,
    pub subnet: String,
    pub security_groups: Vec<String>,
}

impl EniSeen {
    /// The secondary ENIs of an instance (the primary comes with the instance, not an allocator).
    pub fn secondary(enis: &[NetworkInterface]) -> Vec<EniSeen> {
        enis.iter()
            .filter(|e| e.attachment.as_ref().is_some_and(|a| a.device_index > 0))
            .map(|e| EniSeen {
                id: e.id.clone(),
                subnet: e.subnet_id.clone(),
                security_groups: e.security_groups.clone(),
            })
            .collect()
    }
}

/// One pass's view of a node: the CiliumNode as the serving allocator left it, and our plan.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Observation {
    pub figures: Figures,
    pub would: Would,
    pub error: Option<String>,
    /// `None`: the instance is not in the EC2 cache (its ENIs are unknown).
    pub enis: Option<Vec<EniSeen>>,
}

impl Observation {
    /// `seen`: the node's figures as its agent sees them (`ipam::published`), else the plan's.
    pub fn of(
        instance: &str,
        plan: &NodePlan,
        seen: Option<&Demand>,
        action: &Action,
        enis: Option<Vec<EniSeen>>,
    ) -> Self {
        Self {
            figures: Figures::of(instance, seen.unwrap_or(&plan.demand)),
            would: Would::of(action),
            error: plan.problem.as_ref().map(|p| p.message.clone()),
            enis,
        }
    }
}

/// A disagreement as logged: which node, which kind, what we would have done instead.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Disagreement {
    pub kind: Kind,
    pub detail: String,
}

/// The comparison figures of one node (the JSON of `/debug/shadow` per node).
#[derive(Clone, Debug, Default, Serialize)]
pub struct NodeState {
    /// The figures `/debug/nodes` shows too.
    #[serde(flatten)]
    pub figures: Figures,
    pub in_deficit: bool,
    /// Deficit episodes seen (needed > 0 after none).
    pub deficits: u64,
    /// Seconds spent in deficit, all episodes (the current one up to the last pass).
    pub deficit_seconds: f64,
    pub longest_deficit_seconds: f64,
    /// What we would do now.
    pub would: Would,
    pub error: Option<String>,
    /// How often a plan to create an ENI started, and the addresses plans to release named.
    pub would_create_enis: u64,
    pub would_release_addresses: u64,
    /// The subnet and security groups we would give the next ENI (our last create plan).
    pub our_choice: Option<(String, Vec<String>)>,
    /// Secondary ENIs the serving allocator attached while we watched.
    pub enis_created_by_other: u64,
    pub disagreements: BTreeMap<Kind, u64>,
    #[serde(skip)]
    deficit_since: Option<Instant>,
    #[serde(skip)]
    last_seen: Option<Instant>,
    #[serde(skip)]
    known_enis: Option<BTreeSet<String>>,
}

impl NodeState {
    /// Fold one observation in at `now`; the disagreements that start with it. Also returns the
    /// deficit seconds this observation added (for the cluster counter).
    pub fn observe(&mut self, obs: Observation, now: Instant) -> (Vec<Disagreement>, f64) {
        let mut out = Vec::new();
        // Deficit time: from the pass that first saw needed > 0 to the one that saw none.
        let mut added = 0.0;
        if let (Some(_), Some(last)) = (self.deficit_since, self.last_seen) {
            added = now.saturating_duration_since(last).as_secs_f64();
            self.deficit_seconds += added;
        }
        let short = obs.figures.needed > 0;
        if let Some(since) = self.deficit_since {
            // The current episode, up to now (it may end now).
            let episode = now.saturating_duration_since(since).as_secs_f64();
            self.longest_deficit_seconds = self.longest_deficit_seconds.max(episode);
        }
        match (self.deficit_since, short) {
            (None, true) => {
                self.deficit_since = Some(now);
                self.deficits += 1;
            }
            (Some(_), false) => self.deficit_since = None,
            _ => {}
        }
        self.last_seen = Some(now);
        self.in_deficit = short;

        // The plan: a new kind of action (or a new error) is a disagreement.
        let kind = would_kind(&obs.would);
        if let Some(k) = kind
            && kind != would_kind(&self.would)
        {
            match &obs.would {
                Would::CreateEni { .. } => self.would_create_enis += 1,
                Would::Release { addresses, .. } => {
                    self.would_release_addresses += u64::from(*addresses)
                }
                _ => {}
            }
            out.push(Disagreement {
                kind: k,
                detail: format!("{:?}", obs.would),
            });
        }
        if let Would::CreateEni {
            subnet,
            security_groups,
            ..
        } = &obs.would
        {
            let mut sgs = security_groups.clone();
            sgs.sort();
            self.our_choice = Some((subnet.clone(), sgs));
        }
        if let Some(e) = &obs.error
            && self.error.as_ref() != Some(e)
        {
            out.push(Disagreement {
                kind: Kind::Error,
                detail: e.clone(),
            });
        }

        // New ENIs of the serving allocator against the choice we would have made.
        if let Some(enis) = &obs.enis {
            let ids: BTreeSet<String> = enis.iter().map(|e| e.id.clone()).collect();
            if let Some(known) = &self.known_enis {
                for e in enis.iter().filter(|e| !known.contains(&e.id)) {
                    self.enis_created_by_other += 1;
                    let Some((subnet, sgs)) = &self.our_choice else {
                        continue;
                    };
                    if &e.subnet != subnet {
                        out.push(Disagreement {
                            kind: Kind::Subnet,
                            detail: format!("{} in {}, ours: {subnet}", e.id, e.subnet),
                        });
                    }
                    let mut theirs = e.security_groups.clone();
                    theirs.sort();
                    if &theirs != sgs {
                        out.push(Disagreement {
                            kind: Kind::SecurityGroups,
                            detail: format!("{} has {theirs:?}, ours: {sgs:?}", e.id),
                        });
                    }
                }
            }
            self.known_enis = Some(ids);
        }
        for d in &out {
            *self.disagreements.entry(d.kind).or_default() += 1;
        }
        self.figures = obs.figures;
        self.would = obs.would;
        self.error = obs.error;
        (out, added)
    }
}

/// Cluster totals (the JSON of `/debug/shadow`).
#[derive(Clone, Debug, Default, Serialize)]
pub struct Totals {
    pub nodes: usize,
    pub nodes_in_deficit: usize,
    pub deficit_seconds: f64,
    pub longest_deficit_seconds: f64,
    pub would_create_enis: u64,
    pub would_release_addresses: u64,
    pub nodes_with_errors: usize,
    pub disagreements: BTreeMap<Kind, u64>,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Summary {
    pub totals: Totals,
    /// Writes and mutating EC2 calls refused by the read-only types (0 unless there is a bug).
    pub refused_writes: u64,
    pub refused_ec2_calls: u64,
    pub nodes: BTreeMap<String, NodeState>,
}

/// `eni_operator_shadow_*`.
#[derive(Clone, Debug, Default)]
pub struct ShadowMetrics {
    pub nodes_in_deficit: Gauge,
    pub deficit_seconds: Counter<f64>,
    pub disagreements: Family<Labels, Counter>,
    pub node_in_deficit: Family<Labels, Gauge>,
    pub node_deficit_seconds: Family<Labels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    pub node_disagreements: Family<Labels, Gauge>,
    pub refused_writes: Gauge,
    pub refused_ec2_calls: Gauge,
}

impl ShadowMetrics {
    pub fn register(r: &mut Registry) -> Self {
        let m = Self::default();
        r.register(
            "shadow_nodes_in_deficit",
            "Nodes the serving allocator leaves short of addresses (needed > 0)",
            m.nodes_in_deficit.clone(),
        );
        r.register(
            "shadow_deficit_seconds",
            "Seconds nodes spent in deficit, summed over nodes",
            m.deficit_seconds.clone(),
        );
        r.register(
            "shadow_disagreements",
            "Times eni-operator would have acted otherwise than the serving allocator, by kind",
            m.disagreements.clone(),
        );
        r.register(
            "shadow_node_in_deficit",
            "1 while the node is short of addresses",
            m.node_in_deficit.clone(),
        );
        r.register(
            "shadow_node_deficit_seconds",
            "Seconds the node spent in deficit",
            m.node_deficit_seconds.clone(),
        );
        r.register(
            "shadow_node_disagreements",
            "Disagreements on the node, by kind",
            m.node_disagreements.clone(),
        );
        r.register(
            "shadow_refused_writes",
            "Kubernetes writes the read-only sink refused (0 unless there is a bug)",
            m.refused_writes.clone(),
        );
        r.register(
            "shadow_refused_ec2_calls",
            "Mutating EC2 calls the read-only client refused (0 unless there is a bug)",
            m.refused_ec2_calls.clone(),
        );
        for k in Kind::ALL {
            let _ = m.disagreements.get_or_create(&kind(k));
        }
        m
    }
}

fn node(name: &str) -> Labels {
    vec![("target_node", name.to_string())]
}

fn kind(k: Kind) -> Labels {
    vec![("kind", k.as_str().to_string())]
}

/// The shadow's per-node comparison, shared by the passes, the metrics and `/debug/shadow`.
#[derive(Debug, Default)]
pub struct ShadowBook {
    nodes: Mutex<BTreeMap<String, NodeState>>,
    metrics: ShadowMetrics,
    refused_writes: Option<Arc<AtomicU64>>,
    refused_ec2: Option<Arc<AtomicU64>>,
}

impl ShadowBook {
    pub fn new(metrics: ShadowMetrics) -> Self {
        Self {
            metrics,
            ..Self::default()
        }
    }

    /// The refusal counts of the read-only sink and EC2 client, for the summary.
    pub fn with_refusals(mut self, writes: Arc<AtomicU64>, ec2: Arc<AtomicU64>) -> Self {
        self.refused_writes = Some(writes);
        self.refused_ec2 = Some(ec2);
        self
    }

    /// One pass's observation of a node: compare, log each disagreement, publish.
    pub fn observe(&self, name: &str, obs: Observation, now: Instant) -> Vec<Disagreement> {
        let mut nodes = self.nodes.lock().expect("shadow");
        let state = nodes.entry(name.to_string()).or_default();
        let (found, added) = state.observe(obs, now);
        let m = &self.metrics;
        m.deficit_seconds.inc_by(added);
        for d in &found {
            // One structured line per disagreement (a shadow writes no Events).
            tracing::info!(
                node = name,
                instance = state.figures.instance,
                kind = d.kind.as_str(),
                available = state.figures.available,
                used = state.figures.used,
                needed = state.figures.needed,
                detail = d.detail,
                "shadow: eni-operator would act otherwise"
            );
            m.disagreements.get_or_create(&kind(d.kind)).inc();
            let mut l = node(name);
            l.push(("kind", d.kind.as_str().to_string()));
            m.node_disagreements
                .get_or_create(&l)
                .set(state.disagreements[&d.kind] as i64);
        }
        m.node_in_deficit
            .get_or_create(&node(name))
            .set(i64::from(state.in_deficit));
        m.node_deficit_seconds
            .get_or_create(&node(name))
            .set(state.deficit_seconds);
        m.nodes_in_deficit
            .set(nodes.values().filter(|n| n.in_deficit).count() as i64);
        self.publish_refusals();
        found
    }

    /// The node is gone: drop its figures and series.
    pub fn forget(&self, name: &str) {
        let mut nodes = self.nodes.lock().expect("shadow");
        if let Some(state) = nodes.remove(name) {
            let m = &self.metrics;
            m.node_in_deficit.remove(&node(name));
            m.node_deficit_seconds.remove(&node(name));
            for k in state.disagreements.keys() {
                let mut l = node(name);
                l.push(("kind", k.as_str().to_string()));
                m.node_disagreements.remove(&l);
            }
            m.nodes_in_deficit
                .set(nodes.values().filter(|n| n.in_deficit).count() as i64);
        }
    }

    fn publish_refusals(&self) {
        let read = |c: &Option<Arc<AtomicU64>>| c.as_ref().map_or(0, |c| c.load(Ordering::Relaxed));
        self.metrics
            .refused_writes
            .set(read(&self.refused_writes) as i64);
        self.metrics
            .refused_ec2_calls
            .set(read(&self.refused_ec2) as i64);
    }

    pub fn node(&self, name: &str) -> Option<NodeState> {
        self.nodes.lock().expect("shadow").get(name).cloned()
    }

    pub fn summary(&self) -> Summary {
        self.publish_refusals();
        let nodes = self.nodes.lock().expect("shadow").clone();
        let mut t = Totals {
            nodes: nodes.len(),
            ..Totals::default()
        };
        for n in nodes.values() {
            t.nodes_in_deficit += usize::from(n.in_deficit);
            t.deficit_seconds += n.deficit_seconds;
            t.longest_deficit_seconds = t.longest_deficit_seconds.max(n.longest_deficit_seconds);
            t.would_create_enis += n.would_create_enis;
            t.would_release_addresses += n.would_release_addresses;
            t.nodes_with_errors += usize::from(n.error.is_some());
            for (k, c) in &n.disagreements {
                *t.disagreements.entry(*k).or_default() += c;
            }
        }
        let read = |c: &Option<Arc<AtomicU64>>| c.as_ref().map_or(0, |c| c.load(Ordering::Relaxed));
        Summary {
            totals: t,
            refused_writes: read(&self.refused_writes),
            refused_ec2_calls: read(&self.refused_ec2),
            nodes,
        }
    }
}

#[cfg(test)]
mod tests;
