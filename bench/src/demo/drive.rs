//! The demo's driver: plays the [`Plan`] against a back-end once a second (nodes join, their
//! agents look and write, demand moves, the account is throttled), turns what it sees into
//! [`Event`]s for the [`Figures`], and shows them. The same loop for both back-ends: the
//! in-memory one ([`super::memory`]) and the real processes ([`super::real`]).

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Result, bail};
use eni_operator::crd::CiliumNode;
use testkit::agent::{Agent, Generation, Step, ready_answers};
use tokio::time::Instant;

use super::model::{Event, Figures};
use super::plan::Plan;
use super::view::View;

/// An agent writes its CiliumNode at most this often: Cilium's agent updates it through a
/// trigger with a 15 s minimum interval (`--ipam-cilium-node-update-rate`, multi-pool too).
const AGENT_WRITE_INTERVAL: Duration = Duration::from_secs(15);
/// After the demand falls, the run ends once every node is served, an address was unassigned
/// and the pool has not changed for this long (the releases are done).
const SETTLED: Duration = Duration::from_secs(10);

/// What the demo runs against.
pub(crate) trait Backend {
    /// Launch node `name`'s instance and create its Node and CiliumNode (its agent starts).
    async fn join(&mut self, name: &str) -> Result<()>;
    /// The node's CiliumNode as its agent sees it now.
    fn latest(&self, name: &str) -> Option<CiliumNode>;
    /// Send an agent's patches (spec, then status).
    async fn write(&mut self, name: &str, step: &Step) -> Result<()>;
    /// The account's EC2 counters so far, per action: (calls, throttled answers).
    async fn ec2(&self) -> Result<BTreeMap<String, (u64, u64)>>;
    /// Another tenant takes `share` of every bucket's refill from now on (0: nobody); with
    /// `empty`, its burst first takes every token left.
    async fn other_tenant(&mut self, share: f64, empty: bool) -> Result<()>;
    /// `count` of the node's pods wait for an address: Pods in phase Pending, which the
    /// operator's Pod watch counts per node.
    async fn pods_waiting(&mut self, name: &str, count: usize) -> Result<()>;
}

/// One node's agent as the driver plays it.
struct Played {
    agent: Agent,
    pods: usize,
    /// What the last step looked at: the object's resourceVersion and the pods.
    seen: Option<(Option<String>, usize)>,
    last_write: Option<Instant>,
    /// A step produced patches the write interval held back.
    owes_write: bool,
    /// Pods without an address when the agent last looked.
    waiting: usize,
}

/// The result of a run.
#[derive(Clone, Debug)]
pub struct Outcome {
    pub figures: Figures,
    /// (seconds, nodes served at most): the rate-limit bound at each sample.
    pub bound: Vec<(f64, f64)>,
    pub took: Duration,
    /// When the demand rose, and how many nodes the run had.
    pub rise: Duration,
    pub nodes: usize,
}

impl Outcome {
    /// Every node served again after the rise: ours against the bound.
    pub fn after_rise(&self) -> Option<super::served::AfterRise> {
        super::served::AfterRise::of(
            &self.figures.served_curve,
            &self.bound,
            self.rise.as_secs_f64(),
            self.nodes,
        )
    }
}

/// Play `plan` against `b`, one step a second, until every node is served after the demand
/// fell and the releases settled (or the plan's limit: an error). `pace`: real time to spend
/// per second of the run (a paused clock runs as fast as the CPU allows otherwise).
pub(crate) async fn drive<B: Backend>(
    b: &mut B,
    plan: &Plan,
    view: &mut dyn View,
    pace: Option<f64>,
    chain: Duration,
) -> Result<Outcome> {
    let start = Instant::now();
    let mut f = Figures::default();
    let mut bound = Vec::new();
    let mut agents: BTreeMap<String, Played> = BTreeMap::new();
    let mut joined = 0;
    let mut throttled = false;
    let mut pool = (0, start);
    loop {
        let now = Instant::now();
        let t = now - start;
        let at = t.as_secs_f64();
        f.apply(at, Event::Phase(plan.phase_at(t)));
        if plan.throttled_at(t) != throttled {
            throttled = !throttled;
            let share = if throttled { plan.throttle_share } else { 0.0 };
            b.other_tenant(share, throttled).await?;
        }
        while joined < plan.joined_by(t) {
            let (name, generation) = plan.node(joined);
            b.join(&name).await?;
            agents.insert(
                name.clone(),
                Played {
                    agent: Agent::new(generation),
                    pods: plan.pods_at(t),
                    seen: None,
                    last_write: None,
                    owes_write: false,
                    waiting: 0,
                },
            );
            f.apply(
                at,
                Event::Joined {
                    node: name,
                    generation,
                },
            );
            joined += 1;
        }
        let pods = plan.pods_at(t);
        for (name, a) in agents.iter_mut() {
            if a.pods != pods {
                if pods > a.pods {
                    f.apply(at, Event::Demand { node: name.clone() });
                }
                a.pods = pods;
            }
            let Some(cn) = b.latest(name) else { continue };
            let may_write = a.last_write.is_none_or(|w| now - w >= AGENT_WRITE_INTERVAL);
            let look = (cn.metadata.resource_version.clone(), a.pods);
            if a.seen.as_ref() == Some(&look) && !(a.owes_write && may_write) {
                continue;
            }
            a.seen = Some(look);
            let step = a.agent.step(&cn, a.pods);
            if !step.violations.is_empty() {
                bail!(
                    "{name}: the agent saw the operator misbehave: {:?}",
                    step.violations
                );
            }
            if step.unsatisfied != a.waiting {
                a.waiting = step.unsatisfied;
                b.pods_waiting(name, a.waiting).await?;
            }
            let patches = step.spec_patch.is_some() || step.status_patch.is_some();
            let mut ready = 0;
            if patches && may_write {
                b.write(name, &step).await?;
                a.last_write = Some(now);
                ready = ready_answers(&step);
            }
            a.owes_write = patches && !may_write;
            let (addresses, enis) = pool_of(&cn, plan.first_interface_index);
            f.apply(
                at,
                Event::Looked {
                    node: name.clone(),
                    unsatisfied: step.unsatisfied,
                    addresses,
                    enis,
                    ready_answers: ready,
                },
            );
        }
        f.apply(at, Event::Ec2(b.ec2().await?));
        f.sample();
        bound.push((at, plan.bound_served(t, chain) as f64));
        view.show(&f);

        if f.addresses() != pool.0 {
            pool = (f.addresses(), now);
        }
        let released = f.calls_of("UnassignPrivateIpAddresses") > 0
            && (f.joined_of(Generation::Classic) == 0 || f.ready_answers > 0);
        if t >= plan.fall_at
            && joined == plan.nodes()
            && f.waiting() == 0
            && released
            && now - pool.1 >= SETTLED
        {
            view.finish(&f);
            return Ok(Outcome {
                figures: f,
                bound,
                took: t,
                rise: plan.rise_at,
                nodes: plan.nodes(),
            });
        }
        if t >= plan.limit {
            view.finish(&f);
            bail!(
                "not done after {:.0} s: {} of {} nodes waiting, {} unassign calls, {} \
                 ready-for-release answers",
                t.as_secs_f64(),
                f.waiting(),
                plan.nodes(),
                f.calls_of("UnassignPrivateIpAddresses"),
                f.ready_answers
            );
        }
        let next = start + Duration::from_secs(t.as_secs() + 1);
        tokio::time::sleep_until(next).await;
        if let Some(p) = pace {
            // The paused clock jumped a second: spend the real time the pace asks for. Blocking
            // on purpose: the runtime's other tasks must not run meanwhile (simulated time
            // stands still).
            std::thread::sleep(Duration::from_secs_f64(p));
        }
    }
}

/// Addresses and ENIs the operator gave the node (ENIs from `first_interface_index` on).
fn pool_of(cn: &CiliumNode, first_interface_index: i64) -> (usize, usize) {
    let Some(st) = cn.status.as_ref() else {
        return (0, 0);
    };
    st.eni
        .enis
        .values()
        .filter(|e| e.number >= first_interface_index)
        .fold((0, 0), |(a, n), e| (a + e.addresses.len(), n + 1))
}
