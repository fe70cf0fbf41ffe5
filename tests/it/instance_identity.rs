//! Whose instance a CiliumNode names (issue 29 item 1, docs/rules.md §15). Every Cilium
//! agent's ServiceAccount may write CiliumNodes: `spec.instance-id` is checked against the Node
//! of the same name, and an instance two live CiliumNodes name is served through neither and
//! released by neither's finalizer.

use std::sync::Arc;
use std::time::Duration;

use eni_operator::crd::{FINALIZER, IGNORE_ANNOTATION};
use eni_operator::ec2::{Instance, Operation};
use eni_operator::event_loop::core::{CoreConfig, NodeInput};
use eni_operator::k8s::input::NodeFacts;
use eni_operator::reconcile::metrics::RuntimeMetrics;
use eni_operator::reconcile::status::WaitReason;
use testkit::cluster::{Cluster, agent_node};
use testkit::running;
use testkit::sink::MemorySink;
use testkit::{served, wait_until};
use tokio::sync::mpsc;

const CLUSTER: &str = "test-cluster";

struct World {
    w: Cluster,
    sink: Arc<MemorySink>,
    tx: mpsc::Sender<NodeInput>,
    metrics: RuntimeMetrics,
    grace: Duration,
    cache: Arc<std::sync::RwLock<eni_operator::cache::Ec2Cache>>,
    status: Arc<eni_operator::reconcile::status::StatusBook>,
    core: eni_operator::event_loop::core::Core<testkit::sim::Simulator, MemorySink>,
    _task: tokio::task::JoinHandle<eni_operator::ec2::Result<()>>,
}

/// A core as the binary runs it (`require_node`: a Node watch feeds it) or as tests drive it.
fn world(require_node: bool) -> World {
    world_with(require_node, false)
}

fn world_with(require_node: bool, require_cluster_tag: bool) -> World {
    let w = Cluster::new();
    let sink = Arc::new(MemorySink::new());
    let cfg = CoreConfig {
        require_node,
        require_cluster_tag,
        ..running::config(2)
    };
    let grace = cfg.node_gone_grace;
    let metrics = RuntimeMetrics::default();
    let running::Running {
        tx,
        task: _task,
        cache,
        core,
    } = running::start(w.sim.clone(), sink.clone(), cfg, metrics.clone());
    let status = core.status_book();
    World {
        w,
        sink,
        tx,
        metrics,
        grace,
        cache,
        status,
        core,
        _task,
    }
}

impl World {
    /// The Node `name` registered for `instance` (providerID), as the watch reports it.
    async fn node(&self, name: &str, instance: &Instance) {
        self.sink.put_node(name, &[]);
        let facts = NodeFacts {
            instance: Some(instance.id.clone()),
            internal_ips: Vec::new(),
        };
        self.send(NodeInput::NodeFacts {
            name: name.into(),
            facts: Some(facts),
        })
        .await;
    }

    /// The Node `name` of a kubelet without the AWS cloud provider: no providerID, only its
    /// InternalIP, the instance's primary private address.
    async fn node_at_ip(&self, name: &str, instance: &Instance) {
        self.sink.put_node(name, &[]);
        let facts = NodeFacts {
            instance: None,
            internal_ips: vec![self.primary_ip(&instance.id)],
        };
        self.send(NodeInput::NodeFacts {
            name: name.into(),
            facts: Some(facts),
        })
        .await;
    }

    fn primary_ip(&self, instance: &str) -> std::net::Ipv4Addr {
        let enis = self.w.sim.network_interfaces();
        let primary = enis
            .iter()
            .find(|e| e.instance_id() == Some(instance) && e.is_primary())
            .expect("the instance's primary ENI");
        primary.primary_ip
    }

    async fn cilium_node(&self, name: &str, instance: &str) {
        let stored = self.sink.put(&agent_node(&self.w, name, instance, 8));
        self.send(NodeInput::Upsert(Box::new(stored))).await;
    }

    async fn send(&self, input: NodeInput) {
        self.tx.send(input).await.unwrap();
    }

    fn error(&self, name: &str) -> String {
        self.sink
            .get(name)
            .and_then(|n| n.status?.ipam.operator_status.error)
            .unwrap_or_default()
    }

    /// Waits until each named node's `operator-status` error starts with its reason (a refusal
    /// is said before anything else happens), failing with what each one says instead.
    async fn refused_with(&self, expected: &[(&str, &str)]) {
        self.refused_within(expected, Duration::from_secs(60)).await;
    }

    async fn refused_within(&self, expected: &[(&str, &str)], within: Duration) {
        let all = || {
            expected
                .iter()
                .all(|(name, reason)| self.error(name).starts_with(reason))
        };
        if !wait_until(all, within).await {
            let said: Vec<_> = expected.iter().map(|(n, _)| (*n, self.error(n))).collect();
            panic!("not refused as {expected:?} within {within:?}: {said:?}");
        }
    }

    fn reasons(&self, name: &str) -> Vec<String> {
        self.sink
            .events(name)
            .into_iter()
            .map(|e| e.reason)
            .collect()
    }

    /// ENIs attached to the instance (its primary included).
    fn enis_of(&self, instance: &str) -> usize {
        self.w
            .sim
            .network_interfaces()
            .iter()
            .filter(|e| e.instance_id() == Some(instance))
            .count()
    }

    fn errors(&self, reason: &str) -> u64 {
        self.metrics
            .errors
            .get_or_create(&vec![("reason", reason.to_string())])
            .get()
    }
}

/// A CiliumNode without a Node, and one whose Node names another instance, get no EC2 call for
/// the instance they name; the real node of that instance is served all the same. On the old
/// main both forged objects had ENIs created and attached to the instances they named.
#[tokio::test(start_paused = true)]
async fn a_forged_cilium_node_gets_no_ec2_call() {
    let t = world(true);
    let (real, victim, other) = (t.w.instance(), t.w.instance(), t.w.instance());
    t.node("n", &real).await;
    t.node("m", &other).await;
    t.send(NodeInput::NodesListed).await;
    t.cilium_node("n", &real.id).await;
    assert!(wait_until(|| served(&t.sink, "n", 8), Duration::from_secs(60)).await);

    // No Node "forged": it names the victim. Node "m" is `other`'s: its CiliumNode lies.
    t.cilium_node("forged", &victim.id).await;
    t.cilium_node("m", &victim.id).await;
    // And one more naming the real node's instance: it must not starve the real one.
    t.cilium_node("squatter", &real.id).await;
    t.refused_with(&[
        ("forged", "NoNode"),
        ("m", "InstanceMismatch"),
        ("squatter", "NoNode"),
    ])
    .await;
    tokio::time::sleep(Duration::from_secs(180)).await;
    assert_eq!(t.enis_of(&victim.id), 1, "only the victim's primary ENI");
    assert_eq!(
        t.enis_of(&other.id),
        1,
        "nothing for m's own instance either"
    );
    for name in ["forged", "m", "squatter"] {
        let node = t.sink.get(name).unwrap();
        assert!(node.spec.ipam.pool.is_empty(), "{name} got a pool");
        assert!(
            node.metadata.finalizers.unwrap_or_default().is_empty(),
            "{name} was taken over"
        );
    }
    assert!(t.reasons("forged").iter().any(|r| r == "NoNode"));
    assert!(t.reasons("m").iter().any(|r| r == "InstanceMismatch"));
    assert_eq!(t.errors("NoNode"), 2, "once per object");
    assert!(served(&t.sink, "n", 8), "the real node is still served");
    assert!(t.error("n").is_empty(), "{}", t.error("n"));
}

/// A CiliumNode created before its Node (the watch has not shown it yet) waits, then is served
/// as soon as the Node appears; before the Nodes are listed nothing is served.
#[tokio::test(start_paused = true)]
async fn a_cilium_node_before_its_node_is_served_once_the_node_appears() {
    let t = world(true);
    let inst = t.w.instance();
    t.cilium_node("n", &inst.id).await;
    tokio::time::sleep(Duration::from_secs(20)).await;
    assert!(t.sink.get("n").unwrap().spec.ipam.pool.is_empty());
    assert!(t.error("n").is_empty(), "not listed yet: no error");
    // It waits, and says why (`eni-operator status`, eni_operator_nodes_waiting).
    let now = tokio::time::Instant::now().into_std();
    let waiting = t.status.node("n", now).and_then(|s| s.waiting);
    let reason = waiting.map(|w| w.reason);
    assert_eq!(reason, Some(WaitReason::NodeNotSeen));
    t.send(NodeInput::NodesListed).await;
    t.refused_within(&[("n", "NoNode")], Duration::from_secs(30))
        .await;
    t.node("n", &inst).await;
    assert!(wait_until(|| served(&t.sink, "n", 8), Duration::from_secs(30)).await);
}

/// Two CiliumNodes naming one running instance (it re-registered under another name; the old
/// NotReady Node is then deleted): while both live, neither is served (loud: operator-status,
/// Event, metric); once the old one is deleted, its finalizer releases nothing, even after the
/// grace period, and the live one is served with the ENIs it had. On the old main the old
/// object's finalizer detached and deleted the live node's ENIs after `--node-gone-grace-period`.
#[tokio::test(start_paused = true)]
async fn the_finalizer_of_a_stale_cilium_node_leaves_the_live_nodes_enis_alone() {
    let t = world(false);
    let inst = t.w.instance();
    t.sink.put_node("old", &[]);
    t.cilium_node("old", &inst.id).await;
    assert!(wait_until(|| served(&t.sink, "old", 8), Duration::from_secs(60)).await);
    let enis = t.enis_of(&inst.id);
    assert!(enis > 1, "ENIs of ours on the instance");

    // The instance re-registers as "new".
    t.sink.put_node("new", &[]);
    t.cilium_node("new", &inst.id).await;
    t.refused_with(&[("new", "InstanceNamedTwice")]).await;
    assert!(t.reasons("new").iter().any(|r| r == "InstanceNamedTwice"));
    assert!(t.errors("InstanceNamedTwice") >= 1);

    // The old Node is deleted (a person, a remediation tool): the old CiliumNode goes.
    t.sink.set_node_exists("old", false);
    t.send(NodeInput::NodePresent {
        name: "old".into(),
        present: false,
    })
    .await;
    assert!(wait_until(|| t.sink.raw("old").is_none(), Duration::from_secs(60)).await);
    tokio::time::sleep(t.grace + Duration::from_secs(60)).await;
    let detaches = t.w.sim.stats().get(Operation::DetachNetworkInterface).calls;
    assert_eq!(detaches, 0, "nothing detached from a live node's instance");
    assert_eq!(t.enis_of(&inst.id), enis, "its ENIs still attached");
    assert!(
        wait_until(|| served(&t.sink, "new", 8), Duration::from_secs(60)).await,
        "the live node is served: {}",
        t.error("new")
    );
    assert_eq!(
        t.w.sim.stats().get(Operation::CreateNetworkInterface).calls,
        (enis - 1) as u64,
        "with the ENIs it had: none created for it"
    );
}

/// EC2 must show the instance with this cluster's tag before anything touches it: an instance
/// of another cluster (or none) gets no call, whatever its Node says; tagged as EKS or as the
/// cloud provider does, it is served. On the old main the untagged instance got ENIs.
#[tokio::test(start_paused = true)]
async fn an_instance_without_the_cluster_tag_is_not_touched() {
    let t = world_with(true, true);
    let (foreign, eks, k8s) = (t.w.instance(), t.w.instance(), t.w.instance());
    let tag = |k: &str, v: &str| [(k.to_string(), v.to_string())].into_iter().collect();
    t.w.sim
        .set_instance_tags(&foreign.id, tag("aws:eks:cluster-name", "another-cluster"));
    t.w.sim
        .set_instance_tags(&eks.id, tag("aws:eks:cluster-name", CLUSTER));
    t.w.sim.set_instance_tags(
        &k8s.id,
        tag(&format!("kubernetes.io/cluster/{CLUSTER}"), "owned"),
    );
    for (name, inst) in [("foreign", &foreign), ("eks", &eks), ("k8s", &k8s)] {
        t.node(name, inst).await;
    }
    t.send(NodeInput::NodesListed).await;
    for (name, inst) in [("foreign", &foreign), ("eks", &eks), ("k8s", &k8s)] {
        t.cilium_node(name, &inst.id).await;
    }
    assert!(wait_until(|| served(&t.sink, "eks", 8), Duration::from_secs(60)).await);
    assert!(wait_until(|| served(&t.sink, "k8s", 8), Duration::from_secs(60)).await);
    t.refused_with(&[("foreign", "NotClusterInstance")]).await;
    tokio::time::sleep(Duration::from_secs(120)).await;
    assert_eq!(t.enis_of(&foreign.id), 1, "only its primary ENI");
    let node = t.sink.get("foreign").unwrap();
    assert!(node.spec.ipam.pool.is_empty());
    assert!(
        t.reasons("foreign")
            .iter()
            .any(|r| r == "NotClusterInstance")
    );
    assert_eq!(t.errors("NotClusterInstance"), 1, "said once");
}

/// The instance is terminated and its Node deleted; Kubernetes' garbage collector then marks the
/// CiliumNode (the Node's dependant) for deletion. A pass that ran between the Node's deletion
/// and the mark refused the CiliumNode (`NoNode`) and made it wait; the mark must end that wait,
/// so the finalizer releases the terminated instance's ENIs at once. On main it waited the
/// refusal out: the e2e clean-up saw the release 30 s after the `NoNode` (multi-pool-ips,
/// static-ip).
#[tokio::test(start_paused = true)]
async fn a_deletion_mark_ends_the_wait_of_a_node_refused_for_its_missing_node() {
    let t = world(true);
    let inst = t.w.instance();
    t.node("n", &inst).await;
    t.send(NodeInput::NodesListed).await;
    t.cilium_node("n", &inst.id).await;
    assert!(wait_until(|| served(&t.sink, "n", 8), Duration::from_secs(60)).await);

    // The Node's deletion as the Node watch reports it: its facts go first, and a pass runs on
    // them before the rest of the event arrives.
    t.sink.set_node_exists("n", false);
    t.send(NodeInput::NodeFacts {
        name: "n".into(),
        facts: None,
    })
    .await;
    t.refused_with(&[("n", "NoNode")]).await;
    assert!(t.w.sim.terminate_instance(&inst.id));
    t.send(NodeInput::NodePresent {
        name: "n".into(),
        present: false,
    })
    .await;
    let marked = tokio::time::Instant::now();
    let deleting = t.sink.begin_delete("n").expect("held by our finalizer");
    t.send(NodeInput::Upsert(Box::new(deleting))).await;
    assert!(
        wait_until(|| t.sink.raw("n").is_none(), Duration::from_secs(120)).await,
        "the finalizer let go"
    );
    let waited = marked.elapsed();
    assert!(
        waited <= Duration::from_secs(5),
        "released {waited:?} after the deletion mark"
    );
}

impl World {
    /// The node handed back (`eni-operator.cilium.io/ignore`): our finalizer goes, the ENIs we
    /// made stay on its instance.
    async fn hand_back(&self, name: &str) {
        let handed = self
            .sink
            .update(name, |n| {
                n.metadata
                    .annotations
                    .get_or_insert_with(Default::default)
                    .insert(IGNORE_ANNOTATION.into(), "true".into());
            })
            .unwrap();
        self.send(NodeInput::Upsert(Box::new(handed))).await;
        let released = || {
            self.sink
                .get(name)
                .is_some_and(|n| n.metadata.finalizers.unwrap_or_default().is_empty())
        };
        assert!(wait_until(released, Duration::from_secs(60)).await);
    }

    /// The Node is deleted, as its watch and a live GET then tell.
    async fn delete_node(&self, name: &str) {
        self.sink.set_node_exists(name, false);
        self.send(NodeInput::NodeFacts {
            name: name.into(),
            facts: None,
        })
        .await;
        self.send(NodeInput::NodePresent {
            name: name.into(),
            present: false,
        })
        .await;
    }
}

/// An agent creates a CiliumNode that names an instance no live CiliumNode names (its own was
/// handed back), with our finalizer and an owner that does not exist; Kubernetes' garbage
/// collector then deletes it. Nothing proves we confirmed that instance for that object: the
/// finalizer goes, nothing is released. On the old main the instance's ENIs of ours were
/// detached and deleted once the grace period was over.
#[tokio::test(start_paused = true)]
async fn a_forged_finalizer_releases_nothing() {
    let t = world(true);
    let victim = t.w.instance();
    t.node("v", &victim).await;
    t.send(NodeInput::NodesListed).await;
    t.cilium_node("v", &victim.id).await;
    assert!(wait_until(|| served(&t.sink, "v", 8), Duration::from_secs(60)).await);
    let enis = t.enis_of(&victim.id);
    assert!(enis > 1, "ENIs of ours on the instance");
    t.hand_back("v").await;

    let mut forged = agent_node(&t.w, "forged", &victim.id, 8);
    forged.metadata.finalizers = Some(vec![FINALIZER.into()]);
    t.sink.put(&forged);
    t.sink.set_node_exists("forged", false);
    let deleting = t
        .sink
        .begin_delete("forged")
        .expect("held by the finalizer");
    t.send(NodeInput::Upsert(Box::new(deleting))).await;
    assert!(
        wait_until(
            || t.sink.raw("forged").is_none(),
            t.grace + Duration::from_secs(120)
        )
        .await,
        "the forged object was let go"
    );
    tokio::time::sleep(t.grace + Duration::from_secs(60)).await;
    let detaches = t.w.sim.stats().get(Operation::DetachNetworkInterface).calls;
    assert_eq!(detaches, 0, "nothing detached from the victim");
    assert_eq!(t.enis_of(&victim.id), enis);
    assert!(t.reasons("forged").iter().any(|r| r == "EnisNotReleased"));
}

/// The agent of a served node changes its `spec.instance-id` to another instance of the cluster
/// (one with ENIs of ours whose CiliumNode was handed back and whose Node is gone); the node is
/// refused from then on. When the node's own Node goes and its instance terminates, its finalizer
/// gives back the instance we confirmed, never the one the object names now. On the old main the
/// other instance's ENIs were detached and deleted after the grace period.
#[tokio::test(start_paused = true)]
async fn an_agent_changing_the_instance_id_does_not_redirect_the_finalizer() {
    let t = world(true);
    let (own, other) = (t.w.instance(), t.w.instance());
    t.node("n", &own).await;
    t.node("o", &other).await;
    t.send(NodeInput::NodesListed).await;
    t.cilium_node("n", &own.id).await;
    t.cilium_node("o", &other.id).await;
    assert!(wait_until(|| served(&t.sink, "n", 8), Duration::from_secs(60)).await);
    assert!(wait_until(|| served(&t.sink, "o", 8), Duration::from_secs(60)).await);
    let other_enis = t.enis_of(&other.id);
    assert!(other_enis > 1);
    t.hand_back("o").await;
    t.delete_node("o").await;

    let changed = t
        .sink
        .update("n", |n| n.spec.instance_id = other.id.clone())
        .unwrap();
    t.send(NodeInput::Upsert(Box::new(changed))).await;
    t.refused_with(&[("n", "InstanceMismatch")]).await;
    assert!(t.w.sim.terminate_instance(&own.id));
    t.delete_node("n").await;
    assert!(
        wait_until(
            || t.sink.raw("n").is_none(),
            t.grace + Duration::from_secs(120)
        )
        .await,
        "the finalizer let go"
    );
    tokio::time::sleep(t.grace + Duration::from_secs(60)).await;
    assert_eq!(
        t.enis_of(&other.id),
        other_enis,
        "the other instance kept its ENIs"
    );
    assert!(!t.reasons("n").iter().any(|r| r == "EnisNotReleased"));
}

/// A CiliumNode refused for the instance it names (no Node, or a Node naming another) brings
/// nothing of that instance into the operator: not described for it, not managed, so never in
/// the full listing's VPC scope nor the ENI GC's. On the old main the upsert made it managed
/// and described before any check.
#[tokio::test(start_paused = true)]
async fn a_refused_cilium_nodes_instance_is_not_managed() {
    let t = world(true);
    let (foreign, other) = (t.w.instance(), t.w.instance());
    t.node("m", &other).await;
    t.send(NodeInput::NodesListed).await;
    t.cilium_node("forged", &foreign.id).await;
    t.cilium_node("m", &foreign.id).await;
    t.refused_with(&[("forged", "NoNode"), ("m", "InstanceMismatch")])
        .await;
    tokio::time::sleep(Duration::from_secs(180)).await;
    assert!(!t.cache.read().unwrap().manages(&foreign.id));

    // Its Node confirms it after all: from then on it is managed and served.
    t.node("forged", &foreign).await;
    assert!(wait_until(|| served(&t.sink, "forged", 8), Duration::from_secs(60)).await);
    assert!(t.cache.read().unwrap().manages(&foreign.id));
}

/// What the core keeps per agent-written object (slots, managed and confirmed instances, their
/// refresh spacing, instance-type lookups) shrinks back when the objects go: a cluster whose
/// nodes churn, or agents naming ever new instances, does not grow the operator's memory.
#[tokio::test(start_paused = true)]
async fn what_the_core_keeps_per_node_goes_with_its_cilium_node() {
    let t = world_with(true, true);
    let tag = |k: &str, v: &str| [(k.to_string(), v.to_string())].into_iter().collect();
    let empty = t.core.tracked();
    let names: Vec<String> = (0..24).map(|i| format!("churn-{i}")).collect();
    let mut instances = Vec::new();
    for name in &names {
        let inst = t.w.instance();
        t.w.sim
            .set_instance_tags(&inst.id, tag("aws:eks:cluster-name", CLUSTER));
        t.node(name, &inst).await;
        instances.push(inst);
    }
    t.send(NodeInput::NodesListed).await;
    for (name, inst) in names.iter().zip(&instances) {
        t.cilium_node(name, &inst.id).await;
    }
    for name in &names {
        assert!(wait_until(|| served(&t.sink, name, 8), Duration::from_secs(120)).await);
    }
    let busy = t.core.tracked();
    assert_eq!(busy.slots, names.len());
    assert_eq!(busy.managed_instances, names.len());
    assert_eq!(busy.confirmed_instances, names.len());
    for name in &names {
        let marked = t.sink.begin_delete(name).expect("held by our finalizer");
        t.send(NodeInput::Upsert(Box::new(marked))).await;
        // Its Node is there (a re-registration): nothing to release, the object goes.
        assert!(wait_until(|| t.sink.raw(name).is_none(), Duration::from_secs(30)).await);
        t.send(NodeInput::Deleted(name.clone())).await;
    }
    let back = || {
        let now = t.core.tracked();
        (
            now.slots,
            now.managed_instances,
            now.confirmed_instances,
            now.refresh_spacing,
        ) == (0, 0, 0, 0)
    };
    assert!(
        wait_until(back, Duration::from_secs(60)).await,
        "before {empty:?}, served {busy:?}, after {:?}",
        t.core.tracked()
    );
    // Type lookups: none kept once their types are known.
    assert_eq!(t.core.tracked().type_lookups, 0);
}

/// A Node without providerID (a kubelet without the AWS cloud provider) has only its
/// InternalIP to confirm the instance its CiliumNode names. An agent naming a stranger there
/// gets nothing of it into the operator: no EC2 call names the stranger, it is never managed;
/// the node is refused once EC2 says whose primary address the InternalIP is. Named right, the
/// node is served. On the old main the upsert managed and described the named instance before
/// any check (`Nodes::may_describe` let a Node with an InternalIP through).
#[tokio::test(start_paused = true)]
async fn a_node_without_provider_id_gets_nothing_for_a_stranger_its_agent_names() {
    let t = world(true);
    let (own, stranger) = (t.w.instance(), t.w.instance());
    t.node_at_ip("n", &own).await;
    t.send(NodeInput::NodesListed).await;
    t.cilium_node("n", &stranger.id).await;
    t.refused_with(&[("n", "InstanceMismatch")]).await;
    assert_eq!(
        t.w.sim.times_named(&stranger.id),
        0,
        "a call named the stranger"
    );
    assert!(!t.cache.read().unwrap().manages(&stranger.id));
    // Refused by EC2's owner of the InternalIP, named in the message.
    assert!(t.error("n").contains(&own.id), "{}", t.error("n"));
    // Several resyncs and refused passes later.
    tokio::time::sleep(Duration::from_secs(180)).await;
    assert_eq!(
        t.w.sim.times_named(&stranger.id),
        0,
        "a call named the stranger"
    );
    assert!(!t.cache.read().unwrap().manages(&stranger.id));
    assert_eq!(
        t.enis_of(&stranger.id),
        1,
        "only the stranger's primary ENI"
    );
    assert!(t.sink.get("n").unwrap().spec.ipam.pool.is_empty());

    // The agent names its own instance: served, like a Node with providerID.
    t.cilium_node("n", &own.id).await;
    assert!(wait_until(|| served(&t.sink, "n", 8), Duration::from_secs(60)).await);
    assert!(t.cache.read().unwrap().manages(&own.id));
    assert_eq!(t.w.sim.times_named(&stranger.id), 0);
}

/// An honest node without providerID is served one lookup (a describe filtered by its
/// InternalIP) later than one with a providerID: with every EC2 call taking 200 ms, 0.4 s later.
#[tokio::test(start_paused = true)]
async fn an_honest_node_without_provider_id_is_served_one_lookup_later() {
    let t = world(true);
    for op in [
        Operation::DescribeNetworkInterfaces,
        Operation::DescribeInstances,
        Operation::DescribeSubnets,
        Operation::DescribeVpcs,
        Operation::DescribeSecurityGroups,
        Operation::DescribeRouteTables,
        Operation::DescribeInstanceTypes,
        Operation::CreateNetworkInterface,
        Operation::AttachNetworkInterface,
        Operation::AssignPrivateIpAddresses,
        Operation::ModifyNetworkInterfaceAttribute,
    ] {
        t.w.sim.set_latency(op, Duration::from_millis(200));
    }
    let (by_id, by_ip) = (t.w.instance(), t.w.instance());
    t.node("by-id", &by_id).await;
    t.node_at_ip("by-ip", &by_ip).await;
    t.send(NodeInput::NodesListed).await;
    tokio::time::sleep(Duration::from_secs(30)).await;
    let start = tokio::time::Instant::now();
    t.cilium_node("by-id", &by_id.id).await;
    assert!(wait_until(|| served(&t.sink, "by-id", 8), Duration::from_secs(60)).await);
    let with_provider_id = start.elapsed();
    let start = tokio::time::Instant::now();
    t.cilium_node("by-ip", &by_ip.id).await;
    assert!(wait_until(|| served(&t.sink, "by-ip", 8), Duration::from_secs(60)).await);
    let with_internal_ip = start.elapsed();
    eprintln!("served in {with_provider_id:?} (providerID), {with_internal_ip:?} (InternalIP)");
    assert!(
        with_internal_ip <= with_provider_id + Duration::from_secs(1),
        "{with_internal_ip:?} vs {with_provider_id:?}"
    );
    assert!(t.error("by-ip").is_empty(), "{}", t.error("by-ip"));
}
