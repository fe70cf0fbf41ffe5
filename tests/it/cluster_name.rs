//! `--cluster-name` unset: derived at start-up from the nodes' instance tags (issue 21 part 4).
//! The Nodes come from a canned API server (a tower service behind kube's Client), the
//! instances from the EC2 simulator; the decision itself is unit-tested in `src/cluster_name.rs`.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use eni_operator::cluster_name::{Source, resolve, settle};
use eni_operator::ec2::{Operation, Tags};
use eni_operator::ipam::ownership::EKS_TAG;
use testkit::sim::Simulator;

/// An API server that answers every request with a NodeList of these provider IDs (`None`:
/// a Node without one), and counts the requests.
fn api_server(provider_ids: Vec<Option<String>>) -> (kube::Client, Arc<AtomicUsize>) {
    let requests = Arc::new(AtomicUsize::new(0));
    let seen = requests.clone();
    let service = tower::service_fn(move |req: http::Request<kube::client::Body>| {
        seen.fetch_add(1, Ordering::SeqCst);
        assert_eq!(
            req.uri().path(),
            "/api/v1/nodes",
            "only the Nodes are listed"
        );
        let items: Vec<serde_json::Value> = provider_ids
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let mut node = serde_json::json!({
                    "apiVersion": "v1", "kind": "Node",
                    "metadata": {"name": format!("node-{i}"), "resourceVersion": "1"},
                    "spec": {}
                });
                if let Some(p) = p {
                    node["spec"]["providerID"] = p.clone().into();
                }
                node
            })
            .collect();
        let list = serde_json::json!({
            "apiVersion": "v1", "kind": "NodeList",
            "metadata": {"resourceVersion": "1"}, "items": items
        });
        async move {
            let body = kube::client::Body::from(serde_json::to_vec(&list).unwrap());
            Ok::<_, Infallible>(http::Response::new(body))
        }
    });
    (kube::Client::new(service, "default"), requests)
}

/// `n` running instances in one subnet, each tagged by `tags(i)`; their IDs.
fn instances(sim: &Simulator, n: usize, tags: impl Fn(usize) -> Tags) -> Vec<String> {
    let vpc = sim.add_vpc("10.0.0.0/16".parse().unwrap(), &[]);
    let subnet = sim.add_subnet(&vpc, "zone-a", "10.0.0.0/18".parse().unwrap(), Tags::new());
    let sg = sim.add_security_group(&vpc, Tags::new());
    (0..n)
        .map(|i| {
            let id = sim
                .run_instance("m5.large", &subnet, std::slice::from_ref(&sg))
                .id;
            sim.set_instance_tags(&id, tags(i));
            id
        })
        .collect()
}

fn tag(k: &str, v: &str) -> Tags {
    Tags::from([(k.to_string(), v.to_string())])
}

fn provider(id: &str) -> Option<String> {
    Some(format!("aws:///zone-a/{id}"))
}

/// EKS's and the cloud provider's tags both name the cluster; a Node without a provider ID
/// and a Node whose instance EC2 no longer knows are passed over; only describes are made.
#[tokio::test]
async fn the_nodes_instances_name_the_cluster() {
    let sim = Simulator::new();
    let ids = instances(&sim, 3, |i| match i {
        0 => tag(EKS_TAG, "prod"),
        _ => tag("kubernetes.io/cluster/prod", "owned"),
    });
    let mut nodes: Vec<Option<String>> = ids.iter().map(|i| provider(i)).collect();
    nodes.push(None);
    nodes.push(provider("i-0000000000gone"));
    let (client, _) = api_server(nodes);
    let (name, source) = resolve(None, &client, &sim, &Tags::new())
        .await
        .expect("derived");
    assert_eq!(name, "prod");
    assert_eq!(source, Source::Derived { instances: 3 });
    let stats = sim.stats();
    assert_eq!(
        stats.total().calls,
        stats.get(Operation::DescribeInstances).calls,
        "nothing but DescribeInstances: {stats:?}"
    );
}

#[tokio::test]
async fn instances_naming_two_clusters_refuse_the_start_with_one_line_naming_the_flag() {
    let sim = Simulator::new();
    let ids = instances(&sim, 2, |i| tag(EKS_TAG, ["prod", "staging"][i]));
    let (client, _) = api_server(ids.iter().map(|i| provider(i)).collect());
    let err = resolve(None, &client, &sim, &Tags::new())
        .await
        .unwrap_err();
    assert!(err.starts_with("--cluster-name is not set"), "{err}");
    assert!(err.contains("prod") && err.contains("staging"), "{err}");
    assert!(err.contains("set --cluster-name"), "{err}");
    assert!(!err.contains('\n'), "one line: {err}");
}

#[tokio::test]
async fn untagged_instances_refuse_the_start() {
    let sim = Simulator::new();
    let ids = instances(&sim, 1, |_| tag("Name", "bare"));
    let (client, _) = api_server(ids.iter().map(|i| provider(i)).collect());
    let err = resolve(None, &client, &sim, &Tags::new())
        .await
        .unwrap_err();
    assert!(
        err.contains(&ids[0]) && err.contains("--cluster-name"),
        "{err}"
    );
}

/// One Node whose instance names no cluster (a self-managed node) among tagged ones: skipped,
/// the start goes on with the name the others agree on. On the old main every leader refused
/// to start (CrashLoopBackOff at the next failover).
#[tokio::test]
async fn an_untagged_instance_among_tagged_ones_is_skipped() {
    let sim = Simulator::new();
    let ids = instances(&sim, 3, |i| match i {
        1 => tag("Name", "bare"),
        _ => tag(EKS_TAG, "prod"),
    });
    let (client, _) = api_server(ids.iter().map(|i| provider(i)).collect());
    let got = resolve(None, &client, &sim, &Tags::new()).await.unwrap();
    assert_eq!(got, ("prod".to_string(), Source::Derived { instances: 3 }));
}

#[tokio::test]
async fn no_node_refuses_the_start() {
    let sim = Simulator::new();
    let (client, _) = api_server(vec![]);
    let err = resolve(None, &client, &sim, &Tags::new())
        .await
        .unwrap_err();
    assert!(
        err.contains("no node") && err.contains("--cluster-name"),
        "{err}"
    );
}

/// A given flag is used as is: no Node list, no EC2 call.
#[tokio::test]
async fn the_flag_wins_without_a_call() {
    let sim = Simulator::new();
    instances(&sim, 1, |_| tag(EKS_TAG, "prod"));
    let (client, requests) = api_server(vec![]);
    let got = resolve(Some("pinned"), &client, &sim, &Tags::new())
        .await
        .unwrap();
    assert_eq!(got, ("pinned".to_string(), Source::Flag));
    assert_eq!(requests.load(Ordering::SeqCst), 0);
    assert_eq!(sim.stats().total().calls, 0);
}

/// `settle` puts the derived name in the settings the core is built from.
#[tokio::test]
async fn the_derived_name_reaches_the_core_config() {
    let sim = Simulator::new();
    let ids = instances(&sim, 1, |_| tag(EKS_TAG, "prod"));
    let (client, _) = api_server(ids.iter().map(|i| provider(i)).collect());
    let mut settings = eni_operator::config::Settings::load_from(["eni-operator"]).unwrap();
    assert_eq!(settings.ipam.cluster_name, None, "no silent default");
    settle(&mut settings, &client, &sim).await.unwrap();
    assert_eq!(settings.core_config().ipam.cluster_name, "prod");
}
