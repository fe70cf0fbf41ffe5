//! Cilium's own operator left running beside ours after the handover (issue 39), as
//! docs/migrating-from-cilium.md ("The guard"), docs/ciliumnode.md and src/ipam/handover.rs
//! read it from Cilium's source (`pkg/ipam/node_manager.go`, `operator/cmd/root.go`) and as the
//! e2e `cilium-handover` saw Cilium's real 1.20 operator do:
//!
//! * its replicas elect a leader through the Lease `cilium-operator-resource-lock` (15 s; a
//!   stopping leader releases it: empty holder, client-go's `ReleaseOnCancel`), which our
//!   operator reads for the guard ([`tell`]; every core of a run reads one clock, the sink's);
//! * its running leader `Upsert`s every CiliumNode its watch shows without
//!   `ipam.cilium.io/ignore: "true"` (1.18+ `ciliumNodeSynchronizer`), at once: it sees a new
//!   node before we can annotate it (the e2e saw its first ENI 0.2 s after the creation, our
//!   annotation at +0.5 s);
//! * a node it upserted keeps being resynced from its frozen copy after the annotation (it may
//!   allocate for it) until that leader stops: a leader change drops the copies, and the next
//!   leader's listing upserts only nodes still without the annotation;
//! * a node annotated as the API server created it (the chart's MutatingAdmissionPolicy: the
//!   annotation has no managedFields owner) it never upserts.
//!
//! Nodes join after the handover, half annotated at their creation as the policy does ([`admit`]),
//! the others annotated later by us (`--annotate-cilium-ignore`). Cilium's operator restarts now
//! and then, and once more after the faults if it still holds a node (the user follows the
//! node's operator-status: `kubectl rollout restart deploy/cilium-operator`).
//!
//! Not modelled: its own EC2 calls for a node it holds (the invariant below is about ours), and
//! Cilium before 1.18, which ignores the annotation (src/ipam/cilium_version.rs; the guard then
//! serves no node while it runs, tests/handover.rs).
//!
//! Invariants, checked every second:
//! * **no node served by both allocators**: while Cilium's running leader holds a node (it
//!   upserted it), no ENI of that node's instance changes (ours attached, addresses assigned or
//!   unassigned, detached): we made no EC2 call for it (planted defect
//!   `serve-cilium-known-node`: the guard drops the `CiliumLeaderKnewNode` rule);
//! * **a node annotated at its creation is ours at once**: its operator-status never says
//!   another allocator serves it.

use std::collections::{BTreeMap, BTreeSet};

use eni_operator::crd::{CILIUM_IGNORE_ANNOTATION, CiliumNode};
use eni_operator::ipam::handover::LeaseView;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry};
use k8s_openapi::jiff::Timestamp;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::check::Broken;
use crate::forgery::{Print, on};
use crate::world::World;

/// Runs with Cilium's operator beside ours.
const P_CILIUM: f64 = 0.4;
/// Per mille per simulated second, while the faults last: Cilium's leader stops.
const P_RESTART: u32 = 2;
/// Share of joining nodes annotated at their creation (the admission policy).
const P_AT_CREATION: f64 = 0.5;
/// Cilium's `--leader-election-lease-duration` default.
const LEASE_SECONDS: u64 = 15;
/// After the faults, the user restarts Cilium's operator this much later if it holds a node.
const USER_RESTART_AFTER: u64 = 30;

/// The wall time of the simulation's second 0 (any fixed instant: a seed replays its times).
pub fn epoch() -> Timestamp {
    Timestamp::from_second(1_800_000_000).expect("a valid instant")
}

fn wall(t: u64) -> Timestamp {
    epoch()
        .checked_add(k8s_openapi::jiff::SignedDuration::from_secs(
            i64::try_from(t).unwrap_or(i64::MAX),
        ))
        .unwrap_or_else(|_| epoch())
}

#[derive(Debug)]
enum Leader {
    Running {
        holder: String,
        acquired: u64,
    },
    /// Stopped at `released` (Lease released); the next leader acquires at `next_at`.
    Restarting {
        released: u64,
        next_at: u64,
    },
}

/// A node the running leader upserted: its object and its instance's ENIs then.
#[derive(Debug)]
struct Held {
    uid: String,
    instance: String,
    enis: Vec<Print>,
}

#[derive(Debug)]
pub struct Cilium {
    rng: StdRng,
    leader: Leader,
    generation: u32,
    held: BTreeMap<String, Held>,
    /// Nodes annotated at their creation: name -> uid.
    at_creation: BTreeMap<String, String>,
    /// After the faults: when the user restarts Cilium's operator if it still holds a node.
    user_restart_at: Option<u64>,
    /// The faults are over: the user restarts a leader that holds a node, each time.
    after_faults: bool,
    /// Nodes the running leader upserted whose instance another object names too: not watched
    /// by the invariant, but its frozen copy keeps them all the same.
    shared: BTreeSet<String>,
    /// The run's first second has passed (the nodes of the start have joined).
    ticked: bool,
}

impl Cilium {
    /// Whether this seed's run has Cilium's operator (a stream of its own: no other draw moves).
    pub fn draw(seed: u64) -> Option<Self> {
        let mut rng = StdRng::seed_from_u64(seed ^ 0xc111_0000_0000_0039);
        rng.random_bool(P_CILIUM).then(|| Self::running(rng))
    }

    /// Its leader runs since the start.
    fn running(rng: StdRng) -> Self {
        Self {
            rng,
            leader: Leader::Running {
                holder: "cilium-operator-0".into(),
                acquired: 0,
            },
            generation: 0,
            held: BTreeMap::new(),
            at_creation: BTreeMap::new(),
            user_restart_at: None,
            after_faults: false,
            shared: BTreeSet::new(),
            ticked: false,
        }
    }

    /// The Lease as our operator reads it.
    fn lease(&self, t: u64) -> LeaseView {
        let duration = std::time::Duration::from_secs(LEASE_SECONDS);
        match &self.leader {
            Leader::Running { holder, acquired } => LeaseView {
                holder: holder.clone(),
                acquired: wall(*acquired),
                renewed: wall(t),
                duration,
            },
            // client-go's release: no holder, renew = acquire = the release (what
            // k8s::cilium_lease::view reads with at least Cilium's duration).
            Leader::Restarting { released, .. } => LeaseView {
                holder: String::new(),
                acquired: wall(*released),
                renewed: wall(*released),
                duration,
            },
        }
    }
}

fn annotated(obj: &CiliumNode) -> bool {
    obj.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(CILIUM_IGNORE_ANNOTATION))
        .is_some_and(|v| v.eq_ignore_ascii_case("true"))
}

/// A joining node's CiliumNode as the API server admits it: in a run with Cilium's operator,
/// those of the start and half of the later ones get `ipam.cilium.io/ignore: "true"` from the admission policy, owned by no manager
/// (what kube-apiserver 1.36 records for a field a MutatingAdmissionPolicy adds on CREATE).
pub fn admit(w: &mut World, n: &mut CiliumNode) {
    // The nodes of the start were handed over before (all annotated; Cilium's leader took the
    // Lease after that).
    let Some(c) = w.cilium.as_mut() else { return };
    if c.rng.random_bool(P_AT_CREATION) || !c.ticked {
        n.metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(CILIUM_IGNORE_ANNOTATION.into(), "true".into());
        // The create's own entry: the agent owns the spec it sent, not the annotation.
        n.metadata.managed_fields = Some(vec![ManagedFieldsEntry {
            manager: Some(testkit::managed_fields::AGENT_MANAGER.into()),
            operation: Some("Update".into()),
            fields_type: Some("FieldsV1".into()),
            fields_v1: Some(FieldsV1(
                serde_json::json!({"f:spec": {"f:instance-id": {}}}),
            )),
            ..ManagedFieldsEntry::default()
        }]);
    }
}

/// A CiliumNode was created: Cilium's running leader sees it first and upserts it unless it
/// carries the annotation.
pub fn created(w: &mut World, obj: &CiliumNode, t: u64) {
    let name = obj.metadata.name.clone().unwrap_or_default();
    let uid = obj.metadata.uid.clone().unwrap_or_default();
    let Some(c) = w.cilium.as_mut() else { return };
    if annotated(obj) {
        c.at_creation.insert(name.clone(), uid);
        w.log(t, format!("{name}: annotated at its creation"));
        return;
    }
    if upsert(w, obj) {
        w.log(
            t,
            format!("{name}: Cilium's leader upserts it (not annotated)"),
        );
    }
}

/// The running leader upserts `obj` if it is not annotated and not held yet.
fn upsert(w: &mut World, obj: &CiliumNode) -> bool {
    let Some(c) = w.cilium.as_mut() else {
        return false;
    };
    let name = obj.metadata.name.clone().unwrap_or_default();
    let uid = obj.metadata.uid.clone().unwrap_or_default();
    if !matches!(c.leader, Leader::Running { .. })
        || annotated(obj)
        || obj.metadata.deletion_timestamp.is_some()
        || c.held.get(&name).is_some_and(|h| h.uid == uid)
    {
        return false;
    }
    let instance = obj.spec.instance_id.clone();
    // Another object names the instance too (a node registered again under a new name, a
    // forged copy): neither is served by us meanwhile (identity's invariants); the instance is
    // not this node's alone to watch.
    let shared = w.sink.names().iter().any(|other| {
        *other != name
            && w.sink
                .get(other)
                .is_some_and(|o| o.spec.instance_id == instance)
    });
    if shared {
        let c = w.cilium.as_mut().expect("checked");
        c.shared.insert(name);
        return false;
    }
    let enis = w.sim.network_interfaces();
    let c = w.cilium.as_mut().expect("checked");
    c.held.insert(
        name,
        Held {
            uid,
            enis: on(&enis, &instance),
            instance,
        },
    );
    true
}

/// Cilium's leader stops (a rollout restart, a node drain, an OOM kill): the Lease is
/// released, the frozen copies go with the process, and the next leader takes the Lease 3-20 s
/// later.
fn restart(w: &mut World, t: u64, why: &str) {
    let Some(c) = w.cilium.as_mut() else { return };
    if !matches!(c.leader, Leader::Running { .. }) {
        return;
    }
    let next_at = t + c.rng.random_range(3..=20);
    // The Lease is dated by the clock our operator and the API server read (the loop's second
    // can lag it while a second's events await).
    let released = w.seconds();
    let Some(c) = w.cilium.as_mut() else { return };
    c.leader = Leader::Restarting { released, next_at };
    c.shared.clear();
    let dropped = std::mem::take(&mut c.held).len();
    w.log(
        t,
        format!("Cilium's operator stops ({why}): Lease released, {dropped} frozen copies dropped; next leader at t={next_at}s"),
    );
}

/// The seed's Cilium events of one second (faults phase only).
pub fn events(w: &mut World, t: u64) {
    let Some(c) = w.cilium.as_mut() else { return };
    if c.rng.random_range(0..1000) < P_RESTART {
        restart(w, t, "restart");
    }
}

/// The faults stop: if Cilium's leader still holds a node then, the user restarts it as the
/// node's operator-status says.
pub fn faults_end(w: &mut World, t: u64) {
    if let Some(c) = w.cilium.as_mut() {
        c.after_faults = true;
        c.user_restart_at = Some(t + USER_RESTART_AFTER);
    }
}

/// One simulated second: a new leader lists and upserts, the running one's watch upserts
/// nodes still without the annotation and forgets deleted ones; our operator reads the Lease.
pub fn tick(w: &mut World, t: u64) {
    let Some(c) = w.cilium.as_mut() else { return };
    c.ticked = true;
    if let Leader::Restarting { next_at, .. } = c.leader
        && next_at <= t
    {
        c.generation += 1;
        let holder = format!("cilium-operator-{}", c.generation);
        let acquired = w.seconds();
        let Some(c) = w.cilium.as_mut() else { return };
        c.leader = Leader::Running {
            holder: holder.clone(),
            acquired,
        };
        w.log(t, format!("Cilium's operator: {holder} takes the Lease"));
    }
    let asked = asks_restart(w);
    let c = w.cilium.as_mut().expect("checked");
    if c.user_restart_at == Some(t) {
        c.user_restart_at = None;
        if asked || !c.held.is_empty() || !c.shared.is_empty() {
            restart(w, t, "the user restarts it: it holds nodes");
        }
    }
    // After the faults the user watches the operator-status of every node: a leader that holds
    // one (again), or one a node's status says may hold it, is restarted once more.
    let asked = asks_restart(w);
    let c = w.cilium.as_mut().expect("checked");
    if c.after_faults
        && c.user_restart_at.is_none()
        && matches!(c.leader, Leader::Running { .. })
        && (asked || !c.held.is_empty() || !c.shared.is_empty())
    {
        c.user_restart_at = Some(t + USER_RESTART_AFTER);
    }
    // Its watch (and a new leader's listing): every object without the annotation.
    for name in w.sink.names() {
        let Some(obj) = w.sink.get(&name) else {
            continue;
        };
        if upsert(w, &obj) {
            w.log(
                t,
                format!("{name}: Cilium's leader upserts it (not annotated)"),
            );
        }
    }
    let c = w.cilium.as_mut().expect("checked");
    c.held.retain(|name, h| {
        w.sink
            .get(name)
            .is_some_and(|o| o.metadata.uid.as_deref() == Some(h.uid.as_str()))
    });
    tell(w);
}

/// What the user reads (docs/migrating-from-cilium.md, step 4): a node whose operator-status
/// says Cilium's leader took over before the annotation waits until Cilium's operator restarts
/// once more. The guard dates managedFields to the second, so it may say so of a leader that
/// listed the node already annotated in that second: the user restarts all the same.
fn asks_restart(w: &World) -> bool {
    w.sink
        .names()
        .iter()
        .filter_map(|n| w.sink.get(n))
        .any(|o| {
            o.status
                .as_ref()
                .and_then(|s| s.ipam.operator_status.error.as_deref())
                .is_some_and(|e| e.starts_with("OtherAllocatorActive") && e.contains("restarts"))
        })
}

/// Every running core of ours reads Cilium's Lease (the real one every 5 s; here at once and
/// every second, also right when a core's watches connect).
pub fn tell(w: &World) {
    let Some(c) = w.cilium.as_ref() else { return };
    let lease = c.lease(w.seconds());
    for core in w.cores() {
        core.set_cilium_lease(Some(lease.clone()));
    }
}

/// Checked after every simulated second.
pub fn check(w: &World) -> Result<(), Broken> {
    let Some(c) = w.cilium.as_ref() else {
        return Ok(());
    };
    let enis = w.sim.network_interfaces();
    for (name, h) in &c.held {
        let live = w
            .nodes
            .get(name)
            .is_some_and(|n| n.running() && n.instance_id == h.instance);
        if !live {
            continue;
        }
        let now = on(&enis, &h.instance);
        if now != h.enis {
            return Err((
                "no node served by both allocators",
                format!(
                    "{name}: Cilium's leader holds it (upserted before the annotation) and {} changed: {:?} -> {now:?}",
                    h.instance, h.enis
                ),
            ));
        }
    }
    for (name, uid) in &c.at_creation {
        let Some(obj) = w.sink.get(name) else {
            continue;
        };
        if obj.metadata.uid.as_deref() != Some(uid.as_str()) {
            continue;
        }
        let error = obj
            .status
            .as_ref()
            .and_then(|s| s.ipam.operator_status.error.clone());
        if let Some(e) = error.filter(|e| e.starts_with("OtherAllocatorActive")) {
            return Err((
                "a node annotated at its creation is ours at once",
                format!("{name}: {e}"),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use rand::SeedableRng;
    use rand::rngs::StdRng;

    use super::*;

    /// A node Cilium's leader upserted (joined without the annotation) whose instance gets an
    /// ENI attached is a violation; once its leader stopped (frozen copies dropped), the same
    /// change is not; a node annotated at its creation is never upserted.
    #[test]
    fn a_change_on_a_node_ciliums_leader_holds_is_caught() {
        crate::paused_runtime().block_on(async {
            let (mut w, mut rng) = World::seeded(5).await;
            let mut c = Cilium::running(StdRng::seed_from_u64(1));
            // Joins after the start: half annotated at creation.
            c.ticked = true;
            w.cilium = Some(c);
            tell(&w);
            for _ in 0..6 {
                w.join(&mut rng).await;
            }
            let c = w.cilium.as_ref().expect("cilium");
            assert!(!c.held.is_empty() && !c.at_creation.is_empty(), "{c:?}");
            assert!(c.held.keys().all(|n| !c.at_creation.contains_key(n)));
            check(&w).expect("nothing changed yet");
            let (name, instance) = {
                let (name, h) = c.held.iter().next().expect("held");
                (name.clone(), h.instance.clone())
            };
            let subnet = w.subnets[0].0.clone();
            let eni = w.foreign_eni(&subnet, Default::default(), "x").await;
            let index = 2 + w.nodes[&name].limits.max_enis.saturating_sub(3);
            w.foreign_attach(&eni.id, &instance, index).await;
            let (invariant, detail) = check(&w).expect_err("caught");
            assert_eq!(invariant, "no node served by both allocators", "{detail}");
            restart(&mut w, 10, "test");
            check(&w).expect("its leader stopped: nothing held");
            tokio::time::sleep(Duration::from_secs(1)).await;
        });
    }
}
