//! The chart's ValidatingAdmissionPolicy (`templates/08-agent-admission-policy.yaml`, rendered in
//! `manifests/08-agent-admission-policy.yaml`) on a real kube-apiserver: a write with a Cilium
//! agent's token bound to a Pod on node-a may create and update only CiliumNode node-a, may not
//! change its `spec.instance-id` once set nor add or remove our finalizer; the operator's own
//! ServiceAccount (the chart's RBAC) is not affected. Against our CRD and Cilium's.
//!
//! Needs `KUBEBUILDER_ASSETS` (etcd, kube-apiserver, kube-controller-manager, kubectl; `.ci/run`
//! sets it); without it: NOT RUN on stderr.

use std::path::Path;
use std::time::{Duration, Instant};

use testkit::control_plane::{ControlPlane, Kubectl, assets_from_env};

const FINALIZER: &str = "eni-operator.cilium.io/release-enis";

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// What only this test asks of kubectl.
trait AgentKubectl {
    fn refused(&self, args: &[&str], stdin: Option<&str>) -> String;
    fn with_token(&self, cp: &ControlPlane, name: &str, token: &str) -> Kubectl;
    fn as_service_account(
        &self,
        cp: &ControlPlane,
        name: &str,
        account: (&str, &str),
        pod: Option<&str>,
    ) -> Kubectl;
}

impl AgentKubectl for Kubectl {
    /// Must be refused; the refusal.
    fn refused(&self, args: &[&str], stdin: Option<&str>) -> String {
        let out = self.run(args, stdin);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(!out.status.success(), "kubectl {args:?} was allowed");
        err
    }

    /// Another identity: the same server and CA, this bearer token.
    fn with_token(&self, cp: &ControlPlane, name: &str, token: &str) -> Kubectl {
        let kubeconfig = cp.dir().join(format!("{name}.kubeconfig"));
        let ca = cp.dir().join("ca.crt");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {}\n    \
                 certificate-authority: {}\nusers:\n- name: u\n  user:\n    token: {token}\n\
                 contexts:\n- name: x\n  context:\n    cluster: c\n    user: u\n\
                 current-context: x\n",
                cp.server(),
                ca.display()
            ),
        )
        .unwrap();
        Kubectl {
            bin: self.bin.clone(),
            kubeconfig,
        }
    }

    /// A token of ServiceAccount `account` (namespace, name), bound to `pod` in its namespace
    /// if given (such a token names the Pod's node), as another identity.
    fn as_service_account(
        &self,
        cp: &ControlPlane,
        name: &str,
        (namespace, account): (&str, &str),
        pod: Option<&str>,
    ) -> Kubectl {
        let mut args = vec!["create", "token", account, "-n", namespace];
        if let Some(pod) = pod {
            args.extend(["--bound-object-kind", "Pod", "--bound-object-name", pod]);
        }
        let token = self.ok(&args, None);
        self.with_token(cp, name, token.trim())
    }
}

fn cilium_node(name: &str, instance: &str) -> String {
    format!(
        r#"{{"apiVersion": "cilium.io/v2", "kind": "CiliumNode",
            "metadata": {{"name": "{name}"}},
            "spec": {{"instance-id": "{instance}", "eni": {{"first-interface-index": 1}}}}}}"#
    )
}

fn merge(name: &str, patch: &str) -> Vec<String> {
    ["patch", "ciliumnode", name, "--type", "merge", "-p", patch]
        .map(String::from)
        .to_vec()
}

fn args(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// What Cilium's agent ClusterRole lets it do to CiliumNodes (and more: delete), for the
/// agent's ServiceAccount, plus the Pod on node-a its token is bound to.
const AGENT: &str = r#"
apiVersion: v1
kind: ServiceAccount
metadata: {name: cilium, namespace: kube-system}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: cilium}
rules:
  - apiGroups: ["cilium.io"]
    resources: ["ciliumnodes", "ciliumnodes/status"]
    verbs: ["get", "list", "watch", "create", "update", "patch", "delete"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: cilium}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: cilium}
subjects: [{kind: ServiceAccount, name: cilium, namespace: kube-system}]
---
apiVersion: v1
kind: Node
metadata: {name: node-a}
spec: {providerID: "aws:///us-east-1a/i-a"}
---
apiVersion: v1
kind: Node
metadata: {name: node-b}
spec: {providerID: "aws:///us-east-1a/i-b"}
---
apiVersion: v1
kind: Pod
metadata: {name: cilium-a, namespace: kube-system}
spec:
  nodeName: node-a
  serviceAccountName: cilium
  automountServiceAccountToken: false
  containers: [{name: agent, image: quay.io/cilium/cilium:v1.18.0}]
"#;

/// The policy takes effect once the API server has loaded it: wait until the agent's create of
/// another node's CiliumNode is refused (deleting any that got through meanwhile).
fn wait_for_the_policy(admin: &Kubectl, agent: &Kubectl) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let out = agent.run(&["create", "-f", "-"], Some(&cilium_node("probe", "i-p")));
        let err = String::from_utf8_lossy(&out.stderr);
        if !out.status.success() && err.contains("ValidatingAdmissionPolicy") {
            return;
        }
        // Created (the policy is not loaded yet), or refused for another reason: right after
        // Established the API server may still answer "kind not found" (503) for a moment.
        if out.status.success() {
            admin.ok(&["delete", "ciliumnode", "probe"], None);
        }
        assert!(
            Instant::now() < deadline,
            "the policy never took effect (last answer: {err})"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn check_the_policy(cp: &ControlPlane, admin: &Kubectl, crd: &Path) {
    let crd = crd.to_str().unwrap();
    if admin
        .run(&["get", "crd", "ciliumnodes.cilium.io"], None)
        .status
        .success()
    {
        admin.ok(
            &["delete", "ciliumnodes", "--all", "--wait", "--timeout=60s"],
            None,
        );
        admin.ok(&["replace", "-f", crd], None);
    } else {
        admin.ok(&["create", "-f", crd], None);
    }
    admin.ok(
        &[
            "wait",
            "--for=condition=Established",
            "crd/ciliumnodes.cilium.io",
        ],
        None,
    );
    let agent =
        admin.as_service_account(cp, "agent-a", ("kube-system", "cilium"), Some("cilium-a"));
    wait_for_the_policy(admin, &agent);

    // Its own CiliumNode: created, updated (spec, status, metadata).
    agent.ok(&["create", "-f", "-"], Some(&cilium_node("node-a", "i-a")));
    agent.ok(
        &args(&merge(
            "node-a",
            r#"{"metadata": {"labels": {"x": "y"}}, "spec": {"ipam": {"pre-allocate": 4}}}"#,
        )),
        None,
    );
    let mut status = merge(
        "node-a",
        r#"{"status": {"ipam": {"used": {"10.0.0.9": {"owner": "default/p"}}}}}"#,
    );
    status.push("--subresource=status".into());
    agent.ok(&args(&status), None);

    // Another node's: neither created nor updated (spec or status).
    let err = agent.refused(&["create", "-f", "-"], Some(&cilium_node("node-b", "i-b")));
    assert!(
        err.contains("may write only the CiliumNode of its own node (node-a), not node-b"),
        "{err}"
    );
    admin.ok(&["create", "-f", "-"], Some(&cilium_node("node-b", "i-b")));
    let err = agent.refused(
        &args(&merge("node-b", r#"{"metadata": {"labels": {"x": "y"}}}"#)),
        None,
    );
    assert!(err.contains("(node-a), not node-b"), "{err}");
    let mut status_b = status.clone();
    status_b[2] = "node-b".into();
    let err = agent.refused(&args(&status_b), None);
    assert!(err.contains("(node-a), not node-b"), "{err}");

    // Its instance-id, once set, stays.
    let err = agent.refused(
        &args(&merge("node-a", r#"{"spec": {"instance-id": "i-b"}}"#)),
        None,
    );
    assert!(
        err.contains("may not change spec.instance-id of CiliumNode node-a once set (i-a)"),
        "{err}"
    );

    // Our finalizer: the agent neither adds it nor removes it; the operator does both.
    let add = format!(r#"{{"metadata": {{"finalizers": ["{FINALIZER}"]}}}}"#);
    let err = agent.refused(&args(&merge("node-a", &add)), None);
    assert!(
        err.contains(&format!(
            "may not add or remove the finalizer {FINALIZER} of CiliumNode node-a"
        )),
        "{err}"
    );
    let mut created =
        serde_json::from_str::<serde_json::Value>(&cilium_node("node-a2", "i")).unwrap();
    created["metadata"]["finalizers"] = serde_json::json!([FINALIZER]);
    let err = agent.refused(&["create", "-f", "-"], Some(&created.to_string()));
    assert!(err.contains("ValidatingAdmissionPolicy"), "{err}");

    // Nor our record of the confirmed instance.
    let record =
        r#"{"metadata": {"annotations": {"eni-operator.cilium.io/confirmed-instance": "i-b"}}}"#;
    let err = agent.refused(&args(&merge("node-a", record)), None);
    assert!(
        err.contains("may not write the annotation eni-operator.cilium.io/confirmed-instance"),
        "{err}"
    );

    let operator = admin.as_service_account(cp, "operator", ("eni-operator", "eni-operator"), None);
    for node in ["node-a", "node-b"] {
        operator.ok(&args(&merge(node, &add)), None);
        operator.ok(
            &args(&merge(
                node,
                r#"{"spec": {"ipam": {"pool": {"10.0.0.9": {"resource": "eni-1"}}}}}"#,
            )),
            None,
        );
    }
    // With the finalizer on: the agent's other writes still pass, the removal does not.
    agent.ok(
        &args(&merge("node-a", r#"{"metadata": {"labels": {"x": "z"}}}"#)),
        None,
    );
    let err = agent.refused(
        &args(&merge("node-a", r#"{"metadata": {"finalizers": null}}"#)),
        None,
    );
    assert!(err.contains("may not add or remove the finalizer"), "{err}");
    let err = agent.refused(
        &args(&merge(
            "node-a",
            r#"{"metadata": {"finalizers": ["other"]}}"#,
        )),
        None,
    );
    assert!(err.contains("may not add or remove the finalizer"), "{err}");
    operator.ok(&args(&merge("node-a", record)), None);
    let err = agent.refused(
        &args(&merge(
            "node-a",
            r#"{"metadata": {"annotations": {"eni-operator.cilium.io/confirmed-instance": null}}}"#,
        )),
        None,
    );
    assert!(err.contains("may not write the annotation"), "{err}");
    let got = admin.ok(
        &[
            "get",
            "ciliumnode",
            "node-a",
            "-o",
            "jsonpath={.metadata.finalizers} {.spec.instance-id}",
        ],
        None,
    );
    assert_eq!(got, format!(r#"["{FINALIZER}"] i-a"#));
    for node in ["node-a", "node-b"] {
        operator.ok(
            &args(&merge(node, r#"{"metadata": {"finalizers": null}}"#)),
            None,
        );
    }

    // The same ServiceAccount with a token bound to no Pod names no node: refused.
    let unbound = admin.as_service_account(cp, "agent-unbound", ("kube-system", "cilium"), None);
    let err = unbound.refused(
        &args(&merge("node-a", r#"{"metadata": {"labels": {"x": "w"}}}"#)),
        None,
    );
    assert!(err.contains("its token names no node"), "{err}");
}

#[test]
fn an_agent_writes_only_its_own_cilium_node_and_never_its_instance_or_our_finalizer() {
    let Some(assets) = assets_from_env() else {
        eprintln!(
            "*** tests/it/agent_admission.rs: NOT RUN: KUBEBUILDER_ASSETS is not set (a directory \
             with etcd, kube-apiserver, kube-controller-manager and kubectl; .ci/run sets it)"
        );
        return;
    };
    let cp = ControlPlane::start(&assets).expect("control plane");
    let admin = Kubectl::admin(&assets, &cp);
    let manifests = root().join("manifests");
    for f in [
        "01-namespace.yaml",
        "02-serviceaccount.yaml",
        "03-rbac.yaml",
        "08-agent-admission-policy.yaml",
    ] {
        admin.ok(&["apply", "-f", manifests.join(f).to_str().unwrap()], None);
    }
    admin.ok(&["apply", "-f", "-"], Some(AGENT));
    for crd in [
        manifests.join("crd/ciliumnodes.cilium.io.yaml"),
        root().join("tests/fixtures/ciliumnodes.cilium.io.yaml"),
    ] {
        check_the_policy(&cp, &admin, &crd);
    }
}

/// Cilium's agent RBAC on Nodes with `annotateK8sNode: true` (its chart's
/// `templates/cilium-agent/clusterrole.yaml`: Nodes read, `nodes/status` patched to annotate its
/// Node), bound to the agents' ServiceAccount and, so that only the policy tells them apart, to
/// our operator's. Two Nodes without providerID: their InternalIPs say which instance they are
/// (docs/rules.md §15), and a Pod on node-a for the agent's token.
const AGENT_ON_NODES: &str = r#"
apiVersion: v1
kind: ServiceAccount
metadata: {name: cilium, namespace: kube-system}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: cilium-nodes}
rules:
  - apiGroups: [""]
    resources: ["nodes"]
    verbs: ["get", "list", "watch"]
  - apiGroups: [""]
    resources: ["nodes/status"]
    # Cilium's agent (client-go) patches without reading; kubectl patch reads first.
    verbs: ["patch", "get"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: cilium-nodes}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: cilium-nodes}
subjects:
  - {kind: ServiceAccount, name: cilium, namespace: kube-system}
  - {kind: ServiceAccount, name: eni-operator, namespace: eni-operator}
---
apiVersion: v1
kind: Node
metadata: {name: node-a}
---
apiVersion: v1
kind: Node
metadata: {name: node-b}
---
apiVersion: v1
kind: Pod
metadata: {name: cilium-a, namespace: kube-system}
spec:
  nodeName: node-a
  serviceAccountName: cilium
  automountServiceAccountToken: false
  containers: [{name: agent, image: quay.io/cilium/cilium:v1.18.0}]
"#;

/// More than Cilium grants (a user's extra rule): the Node itself written, created, deleted.
const AGENT_MORE_ON_NODES: &str = r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: cilium-nodes-more}
rules:
  - apiGroups: [""]
    resources: ["nodes"]
    verbs: ["create", "update", "patch", "delete"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: cilium-nodes-more}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: cilium-nodes-more}
subjects: [{kind: ServiceAccount, name: cilium, namespace: kube-system}]
"#;

fn node_status(name: &str, patch: &str) -> Vec<String> {
    let mut v = ["patch", "node", name, "--subresource=status", "-p", patch]
        .map(String::from)
        .to_vec();
    // Cilium annotates with a strategic merge patch (kubectl's default); addresses are set whole.
    if patch.contains("addresses") {
        v.extend(["--type", "merge"].map(String::from));
    }
    v
}

fn internal_ip(address: &str) -> String {
    format!(r#"{{"status": {{"addresses": [{{"type": "InternalIP", "address": "{address}"}}]}}}}"#)
}

/// Retried for up to 60 s (the API server loads a policy, and RBAC, a moment after the write)
/// until `done` holds for kubectl's answer.
fn eventually(
    kubectl: &Kubectl,
    args: &[&str],
    what: &str,
    done: impl Fn(&Result<String, String>) -> bool,
) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let answer = kubectl.answer(args, None);
        if done(&answer) {
            return;
        }
        assert!(Instant::now() < deadline, "{what} never came: {answer:?}");
        std::thread::sleep(Duration::from_millis(500));
    }
}

#[test]
fn an_agent_writes_only_its_own_node_and_never_its_addresses_or_provider_id() {
    let Some(assets) = assets_from_env() else {
        eprintln!(
            "*** tests/it/agent_admission.rs: NOT RUN: KUBEBUILDER_ASSETS is not set (a directory \
             with etcd, kube-apiserver, kube-controller-manager and kubectl; .ci/run sets it)"
        );
        return;
    };
    let cp = ControlPlane::start(&assets).expect("control plane");
    let admin = Kubectl {
        bin: assets.join("kubectl"),
        kubeconfig: cp.kubeconfig(),
    };
    let manifests = root().join("manifests");
    for f in [
        "01-namespace.yaml",
        "02-serviceaccount.yaml",
        "03-rbac.yaml",
        "08-agent-admission-policy.yaml",
    ] {
        admin.ok(&["apply", "-f", manifests.join(f).to_str().unwrap()], None);
    }
    admin.ok(&["apply", "-f", "-"], Some(AGENT_ON_NODES));
    // The kubelet's write (here the admin's): not matched.
    for (node, ip) in [("node-a", "10.0.1.10"), ("node-b", "10.0.2.20")] {
        admin.ok(&args(&node_status(node, &internal_ip(ip))), None);
    }
    let agent =
        admin.as_service_account(&cp, "agent-a", ("kube-system", "cilium"), Some("cilium-a"));
    let annotate = |n: &str| node_status(n, r#"{"metadata": {"annotations": {"c": "1"}}}"#);
    eventually(
        &agent,
        &args(&annotate("node-b")),
        "the policy's refusal of another Node",
        |a| matches!(a, Err(e) if e.contains("ValidatingAdmissionPolicy")),
    );
    // The API server type-checks a policy against the Node's schema after storing it and only
    // warns: a field misnamed would read as an error at each request (refused: failurePolicy).
    let checked = [
        "get",
        "validatingadmissionpolicy",
        "eni-operator-agent-node",
        "-o",
        "jsonpath={.status.observedGeneration}|{.status.typeChecking}",
    ];
    eventually(
        &admin,
        &checked,
        "the policy's type check",
        |a| matches!(a, Ok(s) if s.starts_with('1')),
    );
    assert_eq!(admin.ok(&checked, None), "1|{}");

    // Its own Node's annotations and labels (what annotateK8sNode writes): allowed.
    agent.ok(
        &args(&node_status(
            "node-a",
            r#"{"metadata": {"annotations": {"network.cilium.io/ipv4-cilium-host": "10.0.1.5"},
                "labels": {"x": "y"}}}"#,
        )),
        None,
    );
    let got = admin.ok(
        &[
            "get",
            "node",
            "node-a",
            "-o",
            r#"jsonpath={.metadata.annotations.network\.cilium\.io/ipv4-cilium-host} {.metadata.labels.x}"#,
        ],
        None,
    );
    assert_eq!(got, "10.0.1.5 y");

    // Its own Node's addresses: neither pointed at another instance's nor dropped.
    let err = agent.refused(
        &args(&node_status("node-a", &internal_ip("10.0.2.20"))),
        None,
    );
    assert!(
        err.contains("may not change status.addresses of Node node-a"),
        "{err}"
    );
    let err = agent.refused(
        &args(&node_status("node-a", r#"{"status": {"addresses": null}}"#)),
        None,
    );
    assert!(err.contains("may not change status.addresses"), "{err}");

    // Another Node: nothing.
    let err = agent.refused(&args(&annotate("node-b")), None);
    assert!(
        err.contains("may write only the Node of its own node (node-a), not node-b"),
        "{err}"
    );
    let err = agent.refused(
        &args(&node_status("node-b", &internal_ip("10.0.1.10"))),
        None,
    );
    assert!(err.contains("(node-a), not node-b"), "{err}");
    let addresses = |n: &str| {
        admin.ok(
            &[
                "get",
                "node",
                n,
                "-o",
                "jsonpath={.status.addresses[*].address}",
            ],
            None,
        )
    };
    assert_eq!(addresses("node-a"), "10.0.1.10");
    assert_eq!(addresses("node-b"), "10.0.2.20");

    // Our operator's ServiceAccount, with the same RBAC, and the kubelet: not matched.
    let operator =
        admin.as_service_account(&cp, "operator", ("eni-operator", "eni-operator"), None);
    operator.ok(
        &args(&node_status("node-b", &internal_ip("10.0.2.21"))),
        None,
    );
    admin.ok(
        &args(&node_status("node-a", &internal_ip("10.0.1.11"))),
        None,
    );
    assert_eq!(addresses("node-b"), "10.0.2.21");
    assert_eq!(addresses("node-a"), "10.0.1.11");

    // With more RBAC than Cilium's: its own Node's labels still, never a providerID (an empty
    // one may be set once, and would then name the instance), no other Node, no Node created
    // or deleted.
    admin.ok(&["apply", "-f", "-"], Some(AGENT_MORE_ON_NODES));
    let label = [
        "patch",
        "node",
        "node-a",
        "-p",
        r#"{"metadata": {"labels": {"x": "z"}}}"#,
    ];
    eventually(&agent, &label, "the extra RBAC", Result::is_ok);
    let err = agent.refused(
        &[
            "patch",
            "node",
            "node-a",
            "-p",
            r#"{"spec": {"providerID": "aws:///us-east-1a/i-b"}}"#,
        ],
        None,
    );
    assert!(
        err.contains("may not change spec.providerID of Node node-a"),
        "{err}"
    );
    let err = agent.refused(
        &[
            "patch",
            "node",
            "node-b",
            "-p",
            r#"{"metadata": {"labels": {"x": "z"}}}"#,
        ],
        None,
    );
    assert!(err.contains("(node-a), not node-b"), "{err}");
    let err = agent.refused(
        &["create", "-f", "-"],
        Some(r#"{"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-x"}}"#),
    );
    assert!(err.contains("may not create or delete Nodes"), "{err}");
    let err = agent.refused(&["delete", "node", "node-b"], None);
    assert!(err.contains("may not create or delete Nodes"), "{err}");
    let got = admin.ok(
        &[
            "get",
            "node",
            "node-a",
            "-o",
            "jsonpath={.spec.providerID}|{.metadata.labels.x}",
        ],
        None,
    );
    assert_eq!(got, "|z");

    // The same ServiceAccount with a token bound to no Pod names no node: refused.
    let unbound = admin.as_service_account(&cp, "agent-unbound", ("kube-system", "cilium"), None);
    let err = unbound.refused(&args(&annotate("node-a")), None);
    assert!(err.contains("its token names no node"), "{err}");
}
