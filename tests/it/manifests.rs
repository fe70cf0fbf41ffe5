//! Every object in the default apply path (`kubectl apply -f manifests/`) parses into its
//! k8s-openapi type and loses no field doing so (a misspelt field fails), that path installs no
//! CRD (Cilium's own must stay untouched), the kustomize base is the same path, the CRD in
//! `manifests/crd/` matches the Rust types, the ConfigMap only sets real settings, no port is one
//! of Cilium's, RBAC and the README agree, and the IAM policy grants exactly the EC2 actions the
//! operator calls, scoped to one cluster's ENIs.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, JSONSchemaProps, JSONSchemaPropsOrArray, JSONSchemaPropsOrBool,
};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::support::{child, settings};

const NAMESPACE: &str = "eni-operator";

const CRD_FILE: &str = "crd/ciliumnodes.cilium.io.yaml";

fn root_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn manifests_dir() -> PathBuf {
    root_dir().join("manifests")
}

/// The files `kubectl apply -f manifests/` reads: the directory's own `.yaml`, `.yml` and
/// `.json` files, sorted (kubectl does not recurse without `-R`).
fn default_apply_path() -> Vec<PathBuf> {
    let mut files: Vec<_> = std::fs::read_dir(manifests_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .filter(|p| {
            p.extension()
                .is_some_and(|e| e == "yaml" || e == "yml" || e == "json")
        })
        .collect();
    files.sort();
    files
}

/// All objects of the default apply path, in file order, with their file name.
fn documents() -> Vec<(String, Value)> {
    documents_in(default_apply_path())
}

fn documents_in(files: Vec<PathBuf>) -> Vec<(String, Value)> {
    let mut docs = Vec::new();
    for file in files {
        let name = file.file_name().unwrap().to_string_lossy().into_owned();
        let text = std::fs::read_to_string(&file).unwrap();
        let values: Vec<Value> = serde_saphyr::from_multiple(&text)
            .unwrap_or_else(|e| panic!("{name}: invalid YAML: {e}"));
        for value in values {
            if !value.is_null() {
                docs.push((name.clone(), value));
            }
        }
    }
    docs
}

/// Parse into `T`, then check that serializing it back gives the same JSON: a field `T` does
/// not know (a typo) would be dropped and show up as a difference.
fn typed<T: DeserializeOwned + Serialize>(file: &str, value: &Value) -> T {
    let parsed: T = serde_json::from_value(value.clone())
        .unwrap_or_else(|e| panic!("{file}: {} does not parse: {e}", value["kind"]));
    let back = serde_json::to_value(&parsed).unwrap();
    assert_eq!(
        &back, value,
        "{file}: {} has fields its type does not know",
        value["kind"]
    );
    parsed
}

#[derive(Default)]
struct Objects {
    crds: Vec<CustomResourceDefinition>,
    namespaces: Vec<Namespace>,
    service_accounts: Vec<ServiceAccount>,
    cluster_roles: Vec<ClusterRole>,
    cluster_role_bindings: Vec<ClusterRoleBinding>,
    roles: Vec<Role>,
    role_bindings: Vec<RoleBinding>,
    config_maps: Vec<ConfigMap>,
    deployments: Vec<Deployment>,
    pdbs: Vec<PodDisruptionBudget>,
    services: Vec<Service>,
    admission_policies: Vec<ValidatingAdmissionPolicy>,
    admission_policy_bindings: Vec<ValidatingAdmissionPolicyBinding>,
}

/// The CRD for clusters without Cilium (not in the default apply path).
fn crd() -> CustomResourceDefinition {
    let docs = documents_in(vec![manifests_dir().join(CRD_FILE)]);
    assert_eq!(docs.len(), 1, "{CRD_FILE}: one object");
    typed(CRD_FILE, &docs[0].1)
}

fn objects() -> Objects {
    let mut o = Objects::default();
    for (file, v) in documents() {
        let known = take(&mut o.crds, &file, &v)
            || take(&mut o.namespaces, &file, &v)
            || take(&mut o.service_accounts, &file, &v)
            || take(&mut o.cluster_roles, &file, &v)
            || take(&mut o.cluster_role_bindings, &file, &v)
            || take(&mut o.roles, &file, &v)
            || take(&mut o.role_bindings, &file, &v)
            || take(&mut o.config_maps, &file, &v)
            || take(&mut o.deployments, &file, &v)
            || take(&mut o.pdbs, &file, &v)
            || take(&mut o.services, &file, &v)
            || take(&mut o.admission_policies, &file, &v)
            || take(&mut o.admission_policy_bindings, &file, &v);
        assert!(
            known,
            "{file}: unexpected object {} {}",
            v["apiVersion"], v["kind"]
        );
    }
    o
}

/// Parses `v` into `into` if its apiVersion and kind are those of `K`.
fn take<K>(into: &mut Vec<K>, file: &str, v: &Value) -> bool
where
    K: k8s_openapi::Resource + DeserializeOwned + Serialize,
{
    let is = v["apiVersion"] == K::API_VERSION && v["kind"] == K::KIND;
    if is {
        into.push(typed(file, v));
    }
    is
}

#[test]
fn every_object_parses_and_the_set_is_complete() {
    let o = objects();
    let counts = [
        o.namespaces.len(),
        o.service_accounts.len(),
        o.cluster_roles.len(),
        o.cluster_role_bindings.len(),
        o.roles.len(),
        o.role_bindings.len(),
        o.config_maps.len(),
        o.deployments.len(),
        o.pdbs.len(),
        o.services.len(),
        o.admission_policies.len(),
        o.admission_policy_bindings.len(),
    ];
    // Two Roles and RoleBindings: leader election, and Cilium's Lease (in kube-system); two
    // ClusterRoles and bindings: the operator's, and the CiliumNode CRD's label; two admission
    // policies and their bindings: what a Cilium agent may write to CiliumNodes and to Nodes
    // (docs/rules.md).
    assert_eq!(counts, [1, 1, 2, 2, 2, 2, 1, 1, 1, 1, 2, 2]);
    // Cluster-scoped, and each binding names its policy.
    for (policy, binding) in o
        .admission_policies
        .iter()
        .zip(&o.admission_policy_bindings)
    {
        assert_eq!(policy.metadata.namespace, None);
        assert_eq!(binding.metadata.namespace, None);
        assert_eq!(
            binding.spec.as_ref().and_then(|s| s.policy_name.clone()),
            policy.metadata.name
        );
    }
    assert_eq!(o.namespaces[0].metadata.name.as_deref(), Some(NAMESPACE));
    // Namespaced objects all live in the operator's namespace (but the Role to read Cilium's
    // Lease, `rbac_reads_only_cilium_operators_lease`).
    let namespaced = [
        &o.service_accounts[0].metadata,
        &o.roles[0].metadata,
        &o.role_bindings[0].metadata,
        &o.config_maps[0].metadata,
        &o.deployments[0].metadata,
        &o.pdbs[0].metadata,
        &o.services[0].metadata,
    ];
    for meta in namespaced {
        assert_eq!(
            meta.namespace.as_deref(),
            Some(NAMESPACE),
            "{:?}",
            meta.name
        );
    }
}

#[test]
fn files_are_ordered_namespace_first() {
    let docs = documents();
    assert_eq!(docs[0].1["kind"], "Namespace");
    // The IAM policy must not sit where `kubectl apply -f manifests/` would pick it up.
    let json_at_top = default_apply_path()
        .iter()
        .any(|p| p.extension().is_some_and(|x| x == "json"));
    assert!(!json_at_top, "no .json directly in manifests/");
}

/// On a cluster running Cilium, `kubectl apply -f manifests/` (the README's install command)
/// must leave Cilium's ciliumnodes CRD alone: replacing it drops Cilium's schema-version label,
/// Cilium's operator rewrites it, and GitOps tools fight over it.
#[test]
fn default_apply_path_installs_no_crd() {
    let docs = documents();
    assert!(!docs.is_empty());
    for (file, v) in &docs {
        assert_ne!(
            v["kind"], "CustomResourceDefinition",
            "{file}: a CRD in the default apply path"
        );
        assert_ne!(v["apiVersion"], "apiextensions.k8s.io/v1", "{file}");
    }
    assert!(objects().crds.is_empty());
    // The CRD for clusters without Cilium is still there, one level down.
    assert_eq!(
        crd().metadata.name.as_deref(),
        Some("ciliumnodes.cilium.io")
    );
}

/// The kustomize base at the repository root is exactly the default apply path: same files, no
/// CRD, so a kustomize user gets what `kubectl apply -f manifests/` gives.
#[test]
fn kustomize_base_lists_the_default_apply_path() {
    let text = std::fs::read_to_string(root_dir().join("kustomization.yaml")).unwrap();
    let k: Value = serde_saphyr::from_str(&text).unwrap();
    assert_eq!(k["kind"], "Kustomization");
    let listed: Vec<String> = k["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap().to_string())
        .collect();
    let expected: Vec<String> = default_apply_path()
        .iter()
        .map(|p| format!("manifests/{}", p.file_name().unwrap().to_string_lossy()))
        .collect();
    assert_eq!(listed, expected);
    // The e2e overlay builds on this base.
    let overlay = std::fs::read_to_string(root_dir().join("e2e/overlay/kustomization.yaml"));
    let overlay: Value = serde_saphyr::from_str(&overlay.unwrap()).unwrap();
    assert_eq!(overlay["resources"], serde_json::json!(["../.."]));
}

#[test]
fn crd_file_matches_the_types() {
    let file = std::fs::read_to_string(manifests_dir().join(CRD_FILE)).unwrap();
    assert!(
        file == eni_operator::crd::crd_yaml(),
        "manifests/{CRD_FILE} is stale: run `make crds`"
    );
}

#[test]
fn crd_declares_cilium_io_v2() {
    let crd = crd();
    assert_eq!(crd.metadata.name.as_deref(), Some("ciliumnodes.cilium.io"));
    let spec = &crd.spec;
    assert_eq!(spec.group, "cilium.io");
    assert_eq!(spec.scope, "Cluster");
    assert_eq!(spec.names.kind, "CiliumNode");
    assert_eq!(spec.names.plural, "ciliumnodes");
    assert_eq!(
        spec.names.short_names.as_deref(),
        Some(&["cn".to_string(), "ciliumn".to_string()][..])
    );
    assert_eq!(spec.versions.len(), 1);
    let v2 = &spec.versions[0];
    assert_eq!(v2.name, "v2");
    assert!(v2.served && v2.storage);
    assert!(v2.subresources.as_ref().unwrap().status.is_some());
    let columns: Vec<_> = v2
        .additional_printer_columns
        .as_ref()
        .unwrap()
        .iter()
        .map(|c| (c.name.as_str(), c.json_path.as_str()))
        .collect();
    for (name, path) in [
        ("Instance", ".spec.instance-id"),
        ("Type", ".spec.eni.instance-type"),
        ("ENIs", ".status.eni-operator.enis"),
        ("Available", ".status.eni-operator.available"),
        ("Used", ".status.eni-operator.used"),
        ("Age", ".metadata.creationTimestamp"),
    ] {
        assert!(columns.contains(&(name, path)), "column {name} {path}");
    }

    let root = v2
        .schema
        .as_ref()
        .unwrap()
        .open_api_v3_schema
        .as_ref()
        .unwrap();
    let props = root.properties.as_ref().unwrap();
    check_structural("", root);
    // Cilium's fields we do not model (spec.addresses, status.ipam.pod-cidrs, ...) survive.
    for path in [
        &["spec"][..],
        &["spec", "eni"],
        &["spec", "ipam"],
        &["status"],
        &["status", "eni"],
        &["status", "ipam"],
    ] {
        let mut node = &props[path[0]];
        for p in &path[1..] {
            node = &node.properties.as_ref().unwrap()[*p];
        }
        assert_eq!(
            node.x_kubernetes_preserve_unknown_fields,
            Some(true),
            "{path:?} must preserve unknown fields"
        );
    }
}

/// The API server rejects a schema that has `additionalProperties` next to `properties`, or a
/// node without a type (outside preserve-unknown-fields / int-or-string).
fn check_structural(path: &str, s: &JSONSchemaProps) {
    assert!(
        !(s.properties.is_some() && s.additional_properties.is_some()),
        "{path}: properties and additionalProperties together"
    );
    assert!(
        s.type_.is_some() || s.x_kubernetes_preserve_unknown_fields == Some(true),
        "{path}: no type"
    );
    for (name, child) in s.properties.iter().flatten() {
        check_structural(&format!("{path}.{name}"), child);
    }
    if let Some(JSONSchemaPropsOrBool::Schema(child)) = &s.additional_properties {
        check_structural(&format!("{path}[*]"), child);
    }
    if let Some(JSONSchemaPropsOrArray::Schema(child)) = &s.items {
        check_structural(&format!("{path}[]"), child);
    }
}

#[test]
fn configmap_sets_only_real_settings() {
    use eni_operator::config::Settings;
    let cm = objects().config_maps.remove(0);
    let data = cm.data.unwrap();
    let known: BTreeSet<String> = settings::env_names().into_iter().collect();
    for key in data.keys() {
        assert!(known.contains(key), "ConfigMap key {key} is not a setting");
    }
    // The values parse and validate: the rest runs in a child process whose environment is the
    // ConfigMap's (and no variable of a developer's shell).
    if !child::in_child() {
        child::run_alone(module_path!(), "configmap_sets_only_real_settings", |cmd| {
            for name in &known {
                cmd.env_remove(name);
            }
            cmd.envs(&data);
        });
        return;
    }
    let settings = Settings::load_from(["eni-operator"]).unwrap_or_else(|e| panic!("{e}"));
    // No value below its floor: the operator would raise it with a warning at every start (the
    // manifests once set ENI_OPERATOR_ENI_GC_INTERVAL "5m", under the 6m floor).
    assert_eq!(
        settings.runtime.eni_gc_interval(),
        Some(settings.runtime.eni_gc_interval),
        "--eni-gc-interval below its floor"
    );
    // Unset: derived at start-up from the nodes' instance tags (the GC deletes by it, so no
    // value shipped here may stand for every cluster); a user's value would reach the setting.
    assert!(!data.contains_key("ENI_OPERATOR_CLUSTER_NAME"));
    assert_eq!(settings.ipam.cluster_name, None);

    // The Deployment's ports and probes match the configured addresses.
    let deploy = objects().deployments.remove(0);
    let container = &deploy.spec.unwrap().template.spec.unwrap().containers[0];
    let port = |name: &str| {
        container
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some(name))
            .unwrap()
            .container_port
    };
    assert_eq!(port("metrics") as u16, settings.server.metrics_addr.port());
    assert_eq!(port("health") as u16, settings.server.health_addr.port());
    let env_from = container.env_from.as_ref().unwrap();
    assert_eq!(
        env_from[0].config_map_ref.as_ref().unwrap().name,
        cm.metadata.name.unwrap()
    );
    let probe_path = |p: &Option<k8s_openapi::api::core::v1::Probe>| {
        p.as_ref().unwrap().http_get.as_ref().unwrap().path.clone()
    };
    assert_eq!(
        probe_path(&container.liveness_probe).as_deref(),
        Some("/healthz")
    );
    assert_eq!(
        probe_path(&container.readiness_probe).as_deref(),
        Some("/readyz")
    );
    // Host networking puts every 0.0.0.0 listener on the node's addresses: health and the
    // debug pages stay on loopback (as Cilium's operator API), the kubelet probes 127.0.0.1
    // (Cilium's chart: `host: "127.0.0.1"` when the operator is host-networked); only
    // /metrics is for Prometheus.
    assert!(settings.server.health_addr.ip().is_loopback());
    assert!(settings.server.debug_addr.ip().is_loopback());
    assert!(settings.server.metrics_addr.ip().is_unspecified());
    let probe_host = |p: &Option<k8s_openapi::api::core::v1::Probe>| {
        p.as_ref().unwrap().http_get.as_ref().unwrap().host.clone()
    };
    for probe in [&container.liveness_probe, &container.readiness_probe] {
        assert_eq!(probe_host(probe).as_deref(), Some("127.0.0.1"));
    }
}

#[test]
fn deployment_is_hardened_and_uses_the_service_account() {
    let o = objects();
    let deploy = &o.deployments[0];
    let spec = deploy.spec.as_ref().unwrap();
    assert_eq!(spec.replicas, Some(2));
    let pod = spec.template.spec.as_ref().unwrap();
    let sa = o.service_accounts[0].metadata.name.clone();
    assert_eq!(pod.service_account_name, sa);
    let pod_sc = pod.security_context.as_ref().unwrap();
    assert_eq!(pod_sc.run_as_non_root, Some(true));
    assert_eq!(
        pod_sc.seccomp_profile.as_ref().unwrap().type_,
        "RuntimeDefault"
    );
    let c = &pod.containers[0];
    let sc = c.security_context.as_ref().unwrap();
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    assert_eq!(
        sc.capabilities.as_ref().unwrap().drop.as_deref(),
        Some(&["ALL".to_string()][..])
    );
    let res = c.resources.as_ref().unwrap();
    assert!(res.requests.is_some() && res.limits.is_some());
    let env: Vec<_> = c.env.iter().flatten().map(|e| e.name.as_str()).collect();
    assert!(env.contains(&"POD_NAME") && env.contains(&"POD_NAMESPACE"));
    assert!(
        pod.affinity
            .as_ref()
            .and_then(|a| a.pod_anti_affinity.as_ref())
            .is_some()
    );

    // Bindings point at the ServiceAccount; the PDB and Service select the pods.
    let subject_ok = |subjects: &Option<Vec<k8s_openapi::api::rbac::v1::Subject>>| {
        subjects.iter().flatten().any(|s| {
            s.kind == "ServiceAccount"
                && Some(&s.name) == sa.as_ref()
                && s.namespace.as_deref() == Some(NAMESPACE)
        })
    };
    assert!(subject_ok(&o.cluster_role_bindings[0].subjects));
    assert!(subject_ok(&o.role_bindings[0].subjects));
    assert_eq!(
        o.cluster_role_bindings[0].role_ref.name,
        o.cluster_roles[0].metadata.name.clone().unwrap()
    );
    assert_eq!(
        o.role_bindings[0].role_ref.name,
        o.roles[0].metadata.name.clone().unwrap()
    );
    let pod_labels = spec
        .template
        .metadata
        .as_ref()
        .unwrap()
        .labels
        .clone()
        .unwrap();
    let selects = |sel: &std::collections::BTreeMap<String, String>| {
        sel.iter().all(|(k, v)| pod_labels.get(k) == Some(v))
    };
    let pdb = o.pdbs[0].spec.as_ref().unwrap();
    assert!(selects(
        pdb.selector
            .as_ref()
            .unwrap()
            .match_labels
            .as_ref()
            .unwrap()
    ));
    assert_eq!(
        pdb.min_available,
        Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(1))
    );
    assert!(selects(
        o.services[0]
            .spec
            .as_ref()
            .unwrap()
            .selector
            .as_ref()
            .unwrap()
    ));
}

/// The operator gives nodes their pod network, so it must be scheduled where none exists yet
/// (issue 31): it tolerates every taint (Cilium recommends `node.cilium.io/agent-not-ready` with
/// `NoExecute`, which a `NoSchedule` toleration does not cover), runs on Linux nodes only, never
/// two replicas on one node, spread over zones; host networking with the node's DNS.
#[test]
fn deployment_schedules_before_the_pod_network_exists() {
    use k8s_openapi::api::core::v1::Toleration;
    let o = objects();
    let pod = o.deployments[0]
        .spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .clone()
        .unwrap();
    let tolerations = pod.tolerations.unwrap_or_default();
    let tolerates = |key: &str, effect: &str| {
        tolerations.iter().any(|t: &Toleration| {
            t.operator.as_deref() == Some("Exists")
                && t.key.as_deref().is_none_or(|k| k == key)
                && t.effect.as_deref().is_none_or(|e| e == effect)
        })
    };
    for (key, effect) in [
        ("node.cilium.io/agent-not-ready", "NoExecute"),
        ("node.cilium.io/agent-not-ready", "NoSchedule"),
        ("node.kubernetes.io/not-ready", "NoExecute"),
        ("node.kubernetes.io/network-unavailable", "NoSchedule"),
        ("node-role.kubernetes.io/control-plane", "NoSchedule"),
    ] {
        assert!(tolerates(key, effect), "does not tolerate {key}:{effect}");
    }
    assert_eq!(
        pod.node_selector
            .unwrap_or_default()
            .get("kubernetes.io/os")
            .map(String::as_str),
        Some("linux")
    );
    let anti = pod.affinity.unwrap().pod_anti_affinity.unwrap();
    let required = anti
        .required_during_scheduling_ignored_during_execution
        .unwrap_or_default();
    assert!(
        required
            .iter()
            .any(|t| t.topology_key == "kubernetes.io/hostname"),
        "replicas on distinct nodes is required, not preferred"
    );
    let spread: Vec<String> = pod
        .topology_spread_constraints
        .unwrap_or_default()
        .into_iter()
        .map(|c| c.topology_key)
        .collect();
    assert!(
        spread.contains(&"topology.kubernetes.io/zone".to_string()),
        "{spread:?}"
    );
    assert!(
        spread.contains(&"kubernetes.io/hostname".to_string()),
        "{spread:?}"
    );
    assert_eq!(pod.host_network, Some(true));
    assert_eq!(pod.dns_policy.as_deref(), Some("Default"));
    assert_eq!(
        pod.priority_class_name.as_deref(),
        Some("system-cluster-critical")
    );
}

/// Default ports of Cilium's components (Cilium docs, "Firewall Rules" and the Helm values):
/// the agent, the operator and cilium-envoy run with host networking, so any of these on the
/// same node makes one of the two fail to bind.
const CILIUM_PORTS: &[u16] = &[
    2379, 2380, // etcd / kvstore
    4240, 4244, 4245, 4250, 4251, // health, Hubble server and relay, mutual auth, SPIRE
    6060, 6061, 6062, 6063, // pprof: agent, operator, relay, clustermesh-apiserver
    6081, 8472, 51871, // Geneve, VXLAN, WireGuard
    9234,  // operator API (health)
    9876, 9878, 9879, 9880, 9881, 9882, 9883, // envoy/agent health, clustermesh health
    9890, 9891, 9892, 9893, // gops: agent, operator, clustermesh-apiserver, relay
    9901, // cilium-envoy admin
    9962, 9963, 9964, 9965, 9966, // metrics: agent, operator, envoy, Hubble, relay
];

#[test]
fn no_default_port_is_one_of_ciliums() {
    use clap::CommandFactory;
    use eni_operator::config::Settings;
    let mut ports: Vec<(String, u16)> = Vec::new();
    // Built-in defaults of the flags.
    for arg in Settings::command().get_arguments() {
        for d in arg.get_default_values() {
            if let Ok(addr) = d.to_string_lossy().parse::<std::net::SocketAddr>() {
                ports.push((format!("--{}", arg.get_long().unwrap()), addr.port()));
            }
        }
    }
    assert!(
        ports.len() >= 2,
        "metrics and health defaults found: {ports:?}"
    );
    let o = objects();
    for (key, value) in o.config_maps[0].data.iter().flatten() {
        if let Ok(addr) = value.parse::<std::net::SocketAddr>() {
            ports.push((key.clone(), addr.port()));
        }
    }
    let pod = o.deployments[0]
        .spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .clone();
    for c in pod.unwrap().containers {
        for p in c.ports.into_iter().flatten() {
            ports.push((
                format!("containerPort {:?}", p.name),
                p.container_port as u16,
            ));
            assert_eq!(p.host_port, None, "hostNetwork sets host ports itself");
        }
    }
    let svc = &o.services[0];
    for p in svc.spec.as_ref().unwrap().ports.iter().flatten() {
        ports.push(("Service port".into(), p.port as u16));
    }
    for (k, v) in svc.metadata.annotations.iter().flatten() {
        if k.ends_with("/port") {
            ports.push((k.clone(), v.parse().unwrap()));
        }
    }
    for (what, port) in &ports {
        assert!(
            !CILIUM_PORTS.contains(port),
            "{what} uses {port}, a Cilium default port"
        );
    }
}

/// One line of the README's RBAC table for a rule.
fn readme_row(r: &k8s_openapi::api::rbac::v1::PolicyRule) -> String {
    let group = r.api_groups.iter().flatten().map(|g| match g.as_str() {
        "" => "core".to_string(),
        g => format!("`{g}`"),
    });
    let mut resources: Vec<String> = r
        .resources
        .iter()
        .flatten()
        .map(|x| format!("`{x}`"))
        .collect();
    for name in r.resource_names.iter().flatten() {
        resources.push(format!("(only `{name}`)"));
    }
    let verbs: Vec<String> = r.verbs.iter().map(|v| format!("`{v}`")).collect();
    format!(
        "| {} | {} | {} |",
        group.collect::<Vec<_>>().join(", "),
        resources.join(" "),
        verbs.join(", ")
    )
}

#[test]
fn readme_lists_every_rbac_grant() {
    let readme = std::fs::read_to_string(root_dir().join("README.md")).unwrap();
    let o = objects();
    let rules = o
        .cluster_roles
        .iter()
        .flat_map(|r| r.rules.iter().flatten())
        .chain(o.roles.iter().flat_map(|r| r.rules.iter().flatten()));
    for rule in rules {
        let row = readme_row(rule);
        assert!(
            readme.lines().any(|l| l.starts_with(&row)),
            "README lacks the RBAC row {row}"
        );
    }
}

/// Every grant matches an API call in src/k8s/{source,sink,leader}.rs, and nothing more:
/// watches (list, watch) of CiliumNodes, Nodes and pending Pods; merge patches of CiliumNodes
/// and their status; a get of a CiliumNode after a conflict and of a Node before releasing its
/// ENIs; deletes of CiliumNodes whose Node is gone; events.k8s.io Events (kube-runtime's
/// Recorder creates, then patches repeats); the Lease: get, create, update (PUT).
#[test]
fn rbac_grants_exactly_what_the_operator_uses() {
    let o = objects();
    let rules = o.cluster_roles[0].rules.clone().unwrap();
    let verbs = |group: &str, resource: &str| -> BTreeSet<String> {
        rules
            .iter()
            .filter(|r| {
                r.api_groups.iter().flatten().any(|g| g == group)
                    && r.resources.iter().flatten().any(|x| x == resource)
            })
            .flat_map(|r| r.verbs.clone())
            .collect()
    };
    let set = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
    assert_eq!(
        verbs("cilium.io", "ciliumnodes"),
        set(&["get", "list", "watch", "patch", "delete"])
    );
    assert_eq!(verbs("cilium.io", "ciliumnodes/status"), set(&["patch"]));
    assert_eq!(verbs("", "nodes"), set(&["get", "list", "watch"]));
    assert_eq!(verbs("", "pods"), set(&["list", "watch"]));
    assert_eq!(
        verbs("", "events"),
        set(&[]),
        "core Events are never written"
    );
    assert_eq!(verbs("events.k8s.io", "events"), set(&["create", "patch"]));
    assert_eq!(rules.len(), 5, "no other cluster-wide rules");
    for r in &rules {
        assert!(r.resource_names.is_none() && r.non_resource_urls.is_none());
        assert!(!r.verbs.iter().any(|v| v == "*"));
    }

    // The Lease: create cannot be limited by name (the name is in the body); get and update
    // are limited to the operator's own Lease.
    let lease_rules = o.roles[0].rules.clone().unwrap();
    assert_eq!(lease_rules.len(), 2);
    for r in &lease_rules {
        assert_eq!(
            r.api_groups.as_deref(),
            Some(&["coordination.k8s.io".to_string()][..])
        );
        assert_eq!(r.resources.as_deref(), Some(&["leases".to_string()][..]));
    }
    let by_verbs = |v: &[&str]| {
        lease_rules
            .iter()
            .find(|r| r.verbs.iter().cloned().collect::<BTreeSet<_>>() == set(v))
            .unwrap_or_else(|| panic!("a Lease rule with exactly {v:?}"))
    };
    assert_eq!(by_verbs(&["create"]).resource_names, None);
    let lease_name =
        o.config_maps[0].data.as_ref().unwrap()["ENI_OPERATOR_LEADER_ELECTION_LEASE_NAME"].clone();
    assert_eq!(
        by_verbs(&["get", "update"]).resource_names,
        Some(vec![lease_name])
    );
}

/// The handover guard reads Cilium operator's leader Lease: `get` of that one Lease, in
/// Cilium's namespace, bound to our ServiceAccount; nothing else there.
#[test]
fn rbac_reads_only_cilium_operators_lease() {
    let o = objects();
    let role = o
        .roles
        .iter()
        .find(|r| r.metadata.name.as_deref() == Some("eni-operator-cilium-lease"))
        .expect("a Role for Cilium's Lease");
    assert_eq!(role.metadata.namespace.as_deref(), Some("kube-system"));
    let rules = role.rules.clone().unwrap();
    assert_eq!(rules.len(), 1);
    assert_eq!(rules[0].verbs, vec!["get".to_string()]);
    assert_eq!(
        rules[0].resource_names,
        Some(vec![
            eni_operator::ipam::handover::CILIUM_OPERATOR_LEASE.to_string()
        ])
    );
    let binding = o
        .role_bindings
        .iter()
        .find(|b| b.role_ref.name == "eni-operator-cilium-lease")
        .expect("bound");
    assert_eq!(binding.metadata.namespace.as_deref(), Some("kube-system"));
    let s = &binding.subjects.as_ref().unwrap()[0];
    assert_eq!(
        (s.kind.as_str(), s.name.as_str()),
        ("ServiceAccount", "eni-operator")
    );
    assert_eq!(s.namespace.as_deref(), Some(NAMESPACE));
}

/// The handover guard reads Cilium operator's release from the CiliumNode CRD's schema label:
/// `get` of that one CRD, a ClusterRole of its own bound to our ServiceAccount; nothing else.
#[test]
fn rbac_reads_only_the_ciliumnode_crd() {
    use eni_operator::ipam::cilium_version::CILIUM_NODE_CRD;
    let o = objects();
    assert_eq!(o.cluster_roles.len(), 2, "the operator's and the CRD read");
    let role = o
        .cluster_roles
        .iter()
        .find(|r| r.metadata.name.as_deref() == Some("eni-operator-cilium-crd"))
        .expect("a ClusterRole for the CRD");
    let rules = role.rules.clone().unwrap();
    assert_eq!(rules.len(), 1);
    assert_eq!(rules[0].verbs, vec!["get".to_string()]);
    assert_eq!(
        rules[0].api_groups,
        Some(vec!["apiextensions.k8s.io".to_string()])
    );
    assert_eq!(
        rules[0].resource_names,
        Some(vec![CILIUM_NODE_CRD.to_string()])
    );
    let binding = o
        .cluster_role_bindings
        .iter()
        .find(|b| b.role_ref.name == "eni-operator-cilium-crd")
        .expect("bound");
    let s = &binding.subjects.as_ref().unwrap()[0];
    assert_eq!(
        (s.kind.as_str(), s.name.as_str()),
        ("ServiceAccount", "eni-operator")
    );
}

#[test]
fn iam_policy_grants_the_ec2_actions_with_tag_conditions() {
    let text = std::fs::read_to_string(manifests_dir().join("aws/iam-policy.json")).unwrap();
    let policy: Value = serde_json::from_str(&text).expect("valid JSON");
    assert_eq!(policy["Version"], "2012-10-17");
    let statements = policy["Statement"].as_array().unwrap();
    let actions_of = |s: &Value| -> Vec<String> {
        match &s["Action"] {
            Value::String(a) => vec![a.clone()],
            Value::Array(a) => a.iter().map(|x| x.as_str().unwrap().to_string()).collect(),
            other => panic!("bad Action {other}"),
        }
    };
    let all: BTreeSet<String> = statements.iter().flat_map(actions_of).collect();
    let expected: BTreeSet<String> = [
        "DescribeInstanceTypes",
        "DescribeInstances",
        "DescribeNetworkInterfaces",
        "DescribeSubnets",
        "DescribeVpcs",
        "DescribeSecurityGroups",
        "DescribeRouteTables",
        "CreateNetworkInterface",
        "AttachNetworkInterface",
        "ModifyNetworkInterfaceAttribute",
        "AssignPrivateIpAddresses",
        "UnassignPrivateIpAddresses",
        "DetachNetworkInterface",
        "DeleteNetworkInterface",
        "CreateTags",
        // Static IPs: the user's Elastic IPs are associated and disassociated, never
        // allocated or released (no AllocateAddress / ReleaseAddress).
        "DescribeAddresses",
        "AssociateAddress",
        "DisassociateAddress",
    ]
    .iter()
    .map(|a| format!("ec2:{a}"))
    .collect();
    assert_eq!(all, expected);
    for s in statements {
        assert_eq!(s["Effect"], "Allow");
    }
    let grants = |action: &str, resource_part: &str| -> Vec<&Value> {
        statements
            .iter()
            .filter(|s| actions_of(s).iter().any(|a| a == action))
            .filter(|s| s["Resource"].to_string().contains(resource_part))
            .collect()
    };
    let conditions = |action: &str, resource_part: &str| -> Vec<&Value> {
        grants(action, resource_part)
            .into_iter()
            .map(|s| &s["Condition"])
            .collect()
    };
    // Only the describes (which support no resource-level permission) are granted on "*".
    for s in statements {
        if s["Resource"] == "*" {
            assert!(
                actions_of(s).iter().all(|a| a.starts_with("ec2:Describe")),
                "{s}"
            );
        }
    }
    // The cluster's name and VPC are placeholders the docs tell users to replace.
    let tag = |c: &Value, key: &str| c["StringEquals"][key].clone();
    let vpc = |c: &Value| c["ArnLike"]["ec2:Vpc"].clone();
    let our_vpc = Value::from("arn:aws:ec2:*:*:vpc/VPC_ID");
    let our_cluster = Value::from("CLUSTER_NAME");

    // A new ENI must carry this cluster's tag (an existence check would let it claim to be
    // another cluster's) and land in the cluster's VPC: its subnet and security groups must be
    // the VPC's (the subnet decides the ENI's VPC).
    let created = conditions("ec2:CreateNetworkInterface", "network-interface");
    assert_eq!(created.len(), 1);
    assert_eq!(
        tag(created[0], "aws:RequestTag/eni-operator.io/cluster-name"),
        our_cluster
    );
    for part in ["subnet", "security-group"] {
        let cs = conditions("ec2:CreateNetworkInterface", part);
        assert!(!cs.is_empty(), "{part}");
        for c in cs {
            assert_eq!(vpc(c), our_vpc, "{part}s of the cluster's VPC only");
        }
    }
    for c in conditions("ec2:CreateTags", "") {
        assert_eq!(tag(c, "ec2:CreateAction"), "CreateNetworkInterface", "{c}");
        assert_eq!(
            tag(c, "aws:RequestTag/eni-operator.io/cluster-name"),
            our_cluster
        );
    }
    // Destructive actions, and those the operator only sends for ENIs it created, touch only
    // ENIs carrying this cluster's tag (StringEquals, not Null) in the cluster's VPC: in a
    // shared account one cluster's operator cannot detach or delete another cluster's ENIs.
    for action in [
        "ec2:DeleteNetworkInterface",
        "ec2:DetachNetworkInterface",
        "ec2:AttachNetworkInterface",
        "ec2:ModifyNetworkInterfaceAttribute",
    ] {
        let cs = conditions(action, "network-interface");
        assert!(!cs.is_empty(), "{action}");
        for c in cs {
            assert_eq!(
                tag(c, "ec2:ResourceTag/eni-operator.io/cluster-name"),
                our_cluster,
                "{action}: {c}"
            );
            assert!(
                c.get("Null").is_none(),
                "{action}: an existence check only: {c}"
            );
            assert_eq!(vpc(c), our_vpc, "{action}: {c}");
        }
    }
    // Addresses: on any ENI of the cluster's VPC (the operator adopts ENIs it did not create,
    // e.g. Cilium's), never outside it.
    for action in [
        "ec2:AssignPrivateIpAddresses",
        "ec2:UnassignPrivateIpAddresses",
    ] {
        let cs = conditions(action, "network-interface");
        assert!(!cs.is_empty(), "{action}");
        for c in cs {
            assert_eq!(vpc(c), our_vpc, "{action}: {c}");
        }
    }
    // Static IPs: only the Elastic IPs tagged for this cluster (agents choose the address by
    // tags they write; the operator's allow-list is `--static-ip-required-tag`, whose default
    // is this tag).
    for action in ["ec2:AssociateAddress", "ec2:DisassociateAddress"] {
        let cs = conditions(action, "elastic-ip");
        assert_eq!(cs.len(), 1, "{action}");
        assert_eq!(
            cs[0]["StringEquals"]["aws:ResourceTag/eni-operator.io/cluster-name"], our_cluster,
            "{action}: any Elastic IP of the account: {}",
            cs[0]
        );
    }
    // Attach and detach also name the instance: only instances tagged as this cluster's
    // (EKS's tag, or the cloud provider's `kubernetes.io/cluster/<name>`; issue 29 item 1).
    for action in ["ec2:AttachNetworkInterface", "ec2:DetachNetworkInterface"] {
        let cs = conditions(action, "instance/");
        assert_eq!(cs.len(), 2, "{action}: one statement per tag");
        for c in &cs {
            let eks = tag(c, "ec2:ResourceTag/aws:eks:cluster-name");
            let k8s = tag(c, "ec2:ResourceTag/kubernetes.io/cluster/CLUSTER_NAME");
            assert!(
                eks == our_cluster || k8s == serde_json::json!(["owned", "shared"]),
                "{action}: an instance of any cluster: {c}"
            );
        }
    }
}

/// The image's dependency stage loads the whole workspace, so it needs every member's manifest
/// (and a placeholder source for it): a member missing there breaks `cargo build` in the image.
#[test]
fn the_image_build_copies_every_workspace_member() {
    let cargo = std::fs::read_to_string(root_dir().join("Cargo.toml")).unwrap();
    let line = cargo
        .lines()
        .find(|l| l.trim_start().starts_with("members"))
        .expect("a workspace members list");
    let members: Vec<&str> = line
        .split('"')
        .skip(1)
        .step_by(2)
        .filter(|m| *m != ".")
        .collect();
    assert!(members.contains(&"testkit"), "parsed {members:?}");
    let dockerfile = std::fs::read_to_string(root_dir().join("Dockerfile")).unwrap();
    let placeholders = dockerfile
        .lines()
        .find(|l| l.trim_start().starts_with("for member in"))
        .expect("the placeholder loop");
    for m in members {
        assert!(
            dockerfile.contains(&format!("COPY {m}/Cargo.toml {m}/Cargo.toml")),
            "Dockerfile does not copy {m}/Cargo.toml"
        );
        assert!(
            placeholders
                .split_whitespace()
                .any(|w| w.trim_end_matches(';') == m),
            "Dockerfile gives {m} no placeholder sources: {placeholders}"
        );
    }
}

/// `manifests/shadow/` (docs/shadow-mode.md): read verbs only, no Lease, shadow mode set, no
/// host networking; and `kubectl apply -f manifests/` does not pick it up.
#[test]
fn the_shadow_manifests_only_read() {
    let dir = manifests_dir().join("shadow");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert!(!files.is_empty());
    assert!(
        default_apply_path().iter().all(|p| !p.starts_with(&dir)),
        "not in the default apply path"
    );
    let docs = documents_in(files);
    let mut roles = 0;
    let mut mode = None;
    for (file, v) in &docs {
        match v["kind"].as_str().unwrap_or_default() {
            "ClusterRole" | "Role" => {
                roles += 1;
                for rule in v["rules"].as_array().unwrap() {
                    for verb in rule["verbs"].as_array().unwrap() {
                        let verb = verb.as_str().unwrap();
                        assert!(
                            ["get", "list", "watch"].contains(&verb),
                            "{file}: {verb} is not a read"
                        );
                    }
                    let res: Vec<&str> = rule["resources"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|r| r.as_str().unwrap())
                        .collect();
                    assert!(!res.contains(&"leases"), "{file}: a shadow takes no Lease");
                }
            }
            "Deployment" => {
                let pod = &v["spec"]["template"]["spec"];
                assert_ne!(pod["hostNetwork"], true, "{file}");
                // Its own network: the kubelet probes the pod's address, never 127.0.0.1.
                let c = &pod["containers"][0];
                for probe in ["livenessProbe", "readinessProbe"] {
                    assert!(c[probe]["httpGet"]["host"].is_null(), "{file}: {probe}");
                }
                for env in pod["containers"][0]["env"].as_array().unwrap() {
                    if env["name"] == "ENI_OPERATOR_MODE" {
                        mode = env["value"].as_str().map(str::to_string);
                    }
                }
            }
            _ => {}
        }
    }
    assert_eq!(roles, 1);
    assert_eq!(mode.as_deref(), Some("shadow"));
}
