//! The kube layer of the Cilium agent simulator: polls a node's CiliumNode and sends the merge
//! patches the pure agent models ([`testkit::agent`]) decide on. A demand script
//! ([`PodsScript`]) drives how many pods each node runs.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use eni_operator::crd::CiliumNode;
use testkit::agent::{Agent, ClassicAgent, Generation, ready_answers};

/// A demand script: `secs:pods` pairs, e.g. `0:10,60:30,120:5`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodsScript(Vec<(u64, usize)>);

impl PodsScript {
    pub fn parse(s: &str) -> Result<Self, String> {
        let mut steps = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (t, n) = part
                .split_once(':')
                .ok_or_else(|| format!("{part:?}: expected SECS:PODS"))?;
            let t: u64 = t.trim().parse().map_err(|e| format!("{part:?}: {e}"))?;
            let n: usize = n.trim().parse().map_err(|e| format!("{part:?}: {e}"))?;
            steps.push((t, n));
        }
        if steps.is_empty() {
            return Err("empty pods script".into());
        }
        steps.sort_by_key(|s| s.0);
        Ok(Self(steps))
    }

    /// Pods wanted `elapsed` seconds after the start (0 before the first step).
    pub fn pods_at(&self, elapsed: u64) -> usize {
        self.0
            .iter()
            .take_while(|(t, _)| *t <= elapsed)
            .last()
            .map_or(0, |s| s.1)
    }

    /// Seconds after which nothing changes any more.
    pub fn last_change(&self) -> u64 {
        self.0.last().map_or(0, |s| s.0)
    }
}

/// What an agent tells the suite, shared with the task that runs it.
#[derive(Clone, Debug, Default)]
pub struct AgentReport {
    pub pods: usize,
    pub used: BTreeSet<String>,
    pub unsatisfied: usize,
    pub violations: BTreeSet<String>,
    pub writes: u64,
    pub conflicts: u64,
    pub ignored_updates: u64,
    /// `ready-for-release` answers sent: proof that release went through the handshake.
    pub ready_answers: u64,
    /// Set once the agent has seen the object after the last demand change.
    pub settled: bool,
    /// Since when pods have been waiting for an address (unsatisfied > 0), if they are.
    pub waiting_since: Option<std::time::Instant>,
    /// The longest such wait that ended since the last [`AgentHandle::take_longest_wait`].
    pub longest_wait: Duration,
}

impl AgentReport {
    /// Keeps the wait figures: a wait starts when a poll finds pods without an address and
    /// ends at the first poll that finds none (so it is exact to one agent period).
    fn track_wait(&mut self, unsatisfied: usize, now: std::time::Instant) {
        match (unsatisfied > 0, self.waiting_since) {
            (true, None) => self.waiting_since = Some(now),
            (false, Some(since)) => {
                self.longest_wait = self.longest_wait.max(now - since);
                self.waiting_since = None;
            }
            _ => {}
        }
    }
}

/// Handle to a running agent: set its demand, read its report, stop it.
#[derive(Clone)]
pub struct AgentHandle {
    pub node: String,
    pub generation: Generation,
    demand: Arc<Mutex<usize>>,
    report: Arc<Mutex<AgentReport>>,
    stop: Arc<tokio::sync::Notify>,
}

impl AgentHandle {
    pub fn set_pods(&self, pods: usize) {
        *self.demand.lock().expect("poisoned") = pods;
        self.report.lock().expect("poisoned").settled = false;
    }
    pub fn pods(&self) -> usize {
        *self.demand.lock().expect("poisoned")
    }
    pub fn report(&self) -> AgentReport {
        self.report.lock().expect("poisoned").clone()
    }
    pub fn stop(&self) {
        self.stop.notify_one();
    }
    /// The longest wait for an address since the last call, a wait still going counted to
    /// now; resets the figure.
    pub fn take_longest_wait(&self) -> Duration {
        let mut r = self.report.lock().expect("poisoned");
        let open = r.waiting_since.map(|s| s.elapsed()).unwrap_or_default();
        let longest = std::mem::take(&mut r.longest_wait).max(open);
        if r.waiting_since.is_some() {
            r.waiting_since = Some(std::time::Instant::now());
        }
        longest
    }
}

/// Starts an agent task polling `node`'s CiliumNode every `period`.
pub fn spawn_agent(
    client: kube::Client,
    node: String,
    generation: Generation,
    pods: usize,
    period: Duration,
) -> AgentHandle {
    let handle = AgentHandle {
        node,
        generation,
        demand: Arc::new(Mutex::new(pods)),
        report: Arc::new(Mutex::new(AgentReport {
            pods,
            ..Default::default()
        })),
        stop: Arc::new(tokio::sync::Notify::new()),
    };
    let h = handle.clone();
    tokio::spawn(async move {
        let mut agent = Agent::new(h.generation);
        loop {
            if let Err(e) = run_once(&client, &h, &mut agent).await {
                tracing::debug!(node = %h.node, "agent step: {e}");
            }
            tokio::select! {
                _ = h.stop.notified() => break,
                _ = tokio::time::sleep(period) => {}
            }
        }
    });
    handle
}

async fn run_once(client: &kube::Client, h: &AgentHandle, agent: &mut Agent) -> kube::Result<()> {
    use kube::api::{Api, Patch, PatchParams};
    let api: Api<CiliumNode> = Api::all(client.clone());
    let Some(cn) = api.get_opt(&h.node).await? else {
        return Ok(());
    };
    if cn.metadata.deletion_timestamp.is_some() {
        return Ok(());
    }
    let pods = h.pods();
    let step = agent.step(&cn, pods);
    let mut conflicts = 0;
    let mut writes = 0;
    let pp = PatchParams::default();
    let mut failed = None;
    if let Some(p) = &step.spec_patch {
        match api.patch(&h.node, &pp, &Patch::Merge(p)).await {
            Ok(_) => writes += 1,
            Err(kube::Error::Api(s)) if s.code == 409 => conflicts += 1,
            Err(e) => failed = Some(e),
        }
    }
    if let Some(p) = &step.status_patch {
        match api.patch_status(&h.node, &pp, &Patch::Merge(p)).await {
            Ok(_) => writes += 1,
            Err(kube::Error::Api(s)) if s.code == 409 => conflicts += 1,
            Err(e) => failed = Some(e),
        }
    }
    if conflicts > 0 || failed.is_some() {
        // The agent's in-memory view stays; the next poll recomputes from the fresh object.
        *agent = rebuild_after_failure(agent);
    }
    let mut r = h.report.lock().expect("poisoned");
    r.pods = pods;
    r.used = agent.used();
    r.unsatisfied = step.unsatisfied;
    r.track_wait(step.unsatisfied, std::time::Instant::now());
    r.violations
        .extend(step.violations.iter().map(|v| format!("{}: {v}", h.node)));
    r.writes += writes;
    r.conflicts += conflicts;
    r.ignored_updates += u64::from(step.ignored);
    if writes > 0 {
        r.ready_answers += ready_answers(&step);
    }
    r.settled = !step.ignored && conflicts == 0 && failed.is_none();
    drop(r);
    failed.map_or(Ok(()), Err)
}

/// After a rejected write the object still shows the old `used`; a classic agent re-reads it,
/// which is what a fresh [`ClassicAgent`] does. Multi-pool agents keep their endpoints.
fn rebuild_after_failure(agent: &Agent) -> Agent {
    match agent {
        Agent::Classic(_) => Agent::Classic(ClassicAgent::new()),
        Agent::MultiPool(a) => Agent::MultiPool(a.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pods_script_parses_and_steps() {
        let s = PodsScript::parse("60:30, 0:10,120:5").unwrap();
        assert_eq!(s.pods_at(0), 10);
        assert_eq!(s.pods_at(59), 10);
        assert_eq!(s.pods_at(60), 30);
        assert_eq!(s.pods_at(500), 5);
        assert_eq!(s.last_change(), 120);
        assert_eq!(PodsScript::parse("10:3").unwrap().pods_at(0), 0);
        assert!(PodsScript::parse("").is_err());
        assert!(PodsScript::parse("a:1").is_err());
        assert!(PodsScript::parse("5").is_err());
    }

    #[test]
    fn a_wait_lasts_from_the_first_unsatisfied_poll_to_the_first_satisfied_one() {
        let t0 = std::time::Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut r = AgentReport::default();
        r.track_wait(0, at(0));
        assert_eq!(r.waiting_since, None);
        r.track_wait(2, at(1));
        r.track_wait(1, at(5));
        assert_eq!(
            r.waiting_since,
            Some(at(1)),
            "the wait started at the first poll"
        );
        r.track_wait(0, at(8));
        assert_eq!(r.longest_wait, Duration::from_secs(7));
        r.track_wait(3, at(10));
        r.track_wait(0, at(12));
        assert_eq!(
            r.longest_wait,
            Duration::from_secs(7),
            "the longest is kept"
        );
    }
}
