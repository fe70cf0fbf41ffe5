//! The chart's MutatingAdmissionPolicy (`ciliumIgnoreAtCreation`,
//! `templates/cilium-ignore-policy.yaml`) on a real kube-apiserver: a CiliumNode created
//! without `ipam.cilium.io/ignore` gets it, and the annotation is owned by no managedFields
//! entry, which is how the handover guard tells "annotated at creation"
//! (`handover::Writers::ignore_at_creation`). Needs `KUBEBUILDER_ASSETS` (kube-apiserver 1.36,
//! etcd, kubectl) and `HELM`; without them it says NOT RUN on stderr and returns.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use eni_operator::ipam::handover::Writers;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
use serde_json::Value;
use testkit::control_plane::{ControlPlane, Kubectl, assets_from_env};

const LABEL: &str = "eni-operator.cilium.io/handover";
const IGNORE: &str = "ipam.cilium.io/ignore";

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// What only this test asks of kubectl.
trait NodeKubectl {
    fn try_create_node(
        &self,
        name: &str,
        labels: Value,
        annotations: Value,
    ) -> Result<String, String>;
    fn create_node(&self, name: &str, labels: Value, annotations: Value);
    fn node(&self, name: &str) -> Value;
}

impl NodeKubectl for Kubectl {
    /// Creates a CiliumNode the way an agent does (an Update-style create under its manager).
    fn try_create_node(
        &self,
        name: &str,
        labels: Value,
        annotations: Value,
    ) -> Result<String, String> {
        let node = serde_json::json!({
            "apiVersion": "cilium.io/v2",
            "kind": "CiliumNode",
            "metadata": {"name": name, "labels": labels, "annotations": annotations},
            "spec": {"instance-id": format!("i-{name}")},
        });
        self.answer(
            &["create", "--field-manager=cilium-agent", "-f", "-"],
            Some(&node.to_string()),
        )
    }

    fn create_node(&self, name: &str, labels: Value, annotations: Value) {
        if let Err(e) = self.try_create_node(name, labels, annotations) {
            panic!("creating CiliumNode {name}: {e}");
        }
    }

    fn node(&self, name: &str) -> Value {
        let text = self.ok(
            &[
                "get",
                "ciliumnode",
                name,
                "-o",
                "json",
                "--show-managed-fields",
            ],
            None,
        );
        serde_json::from_str(&text).unwrap()
    }
}

fn annotation(node: &Value) -> Option<&str> {
    node["metadata"]["annotations"][IGNORE].as_str()
}

fn writers(node: &Value) -> Writers {
    let entries: Vec<ManagedFieldsEntry> =
        serde_json::from_value(node["metadata"]["managedFields"].clone()).unwrap();
    assert!(!entries.is_empty(), "no managedFields: {node}");
    Writers::from_managed_fields(&entries)
}

#[test]
fn the_policy_annotates_ciliumnodes_at_creation_and_nobody_owns_the_annotation() {
    let (Some(assets), Some(helm)) = (
        assets_from_env(),
        std::env::var_os("HELM").filter(|h| !h.is_empty()),
    ) else {
        eprintln!(
            "*** tests/it/cilium_ignore_policy.rs: NOT RUN: KUBEBUILDER_ASSETS and HELM must be set \
             (.ci/run sets them)"
        );
        return;
    };
    let cp = ControlPlane::start(&assets).expect("control plane");
    let k = Kubectl::admin(&assets, &cp);
    let crd = root().join("tests/fixtures/ciliumnodes.cilium.io.yaml");
    k.ok(&["apply", "-f", &crd.display().to_string()], None);
    k.ok(
        &[
            "wait",
            "--for=condition=Established",
            "crd/ciliumnodes.cilium.io",
            "--timeout=60s",
        ],
        None,
    );
    let out = Command::new(helm)
        .args(["template", "eni-operator"])
        .arg(root().join("charts/eni-operator"))
        .args([
            "--namespace",
            "eni-operator",
            "--set",
            "ciliumIgnoreAtCreation.enabled=true",
            "--set-string",
            &format!(
                "ciliumIgnoreAtCreation.matchLabels.{}=true",
                LABEL.replace('.', "\\.")
            ),
            "--show-only",
            "templates/cilium-ignore-policy.yaml",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let policy = String::from_utf8(out.stdout).unwrap();
    assert!(
        policy.contains("kind: MutatingAdmissionPolicyBinding"),
        "{policy}"
    );
    k.ok(&["apply", "-f", "-"], Some(&policy));

    // The API server loads a new policy within a few seconds: probe until it acts.
    let start = Instant::now();
    let labelled = serde_json::json!({ LABEL: "true" });
    for i in 0.. {
        let probe = format!("probe-{i}");
        // Right after Established the API server may still answer "kind not found" (503) for
        // a moment: that is a retry, within the same bound.
        let created = k.try_create_node(&probe, labelled.clone(), serde_json::json!({}));
        let annotated = created.is_ok() && annotation(&k.node(&probe)).is_some();
        if created.is_ok() {
            k.ok(&["delete", "ciliumnode", &probe], None);
        }
        if annotated {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the policy never acted (last create: {created:?})"
        );
        std::thread::sleep(Duration::from_millis(500));
    }

    // Created without the annotation, matching the selector: annotated, by nobody.
    k.create_node(
        "joined",
        labelled.clone(),
        serde_json::json!({"foo": "bar"}),
    );
    let node = k.node("joined");
    assert_eq!(annotation(&node), Some("true"), "{node}");
    assert_eq!(node["metadata"]["annotations"]["foo"], "bar");
    let w = writers(&node);
    assert!(w.ignore_at_creation(), "{node}");
    assert_eq!(w.ignore_set_at, None);
    // The creator's later spec and status updates (an agent's PUTs of the whole object) leave
    // the annotation unowned.
    let mut updated = node.clone();
    updated["spec"]["instance-id"] = "i-joined-2".into();
    updated["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("managedFields");
    k.ok(
        &["replace", "--field-manager=cilium-agent", "-f", "-"],
        Some(&updated.to_string()),
    );
    let mut status = k.node("joined");
    status["status"] = serde_json::json!({"ipam": {"used": {}}});
    status["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("managedFields");
    k.ok(
        &[
            "replace",
            "--subresource=status",
            "--field-manager=cilium-agent",
            "-f",
            "-",
        ],
        Some(&status.to_string()),
    );
    let node = k.node("joined");
    assert_eq!(node["spec"]["instance-id"], "i-joined-2");
    assert!(writers(&node).ignore_at_creation(), "{node}");

    // Outside the selector: not annotated; annotated later, the annotation has an owner and a
    // time.
    k.create_node("other", serde_json::json!({}), serde_json::json!({}));
    assert_eq!(annotation(&k.node("other")), None);
    k.ok(
        &[
            "annotate",
            "--field-manager=kubectl-annotate",
            "ciliumnode",
            "other",
            &format!("{IGNORE}=true"),
        ],
        None,
    );
    let w = writers(&k.node("other"));
    assert!(!w.ignore_at_creation());
    assert!(w.ignore_set_at.is_some());

    // Created with the annotation (an explicit "false"): kept as it is.
    k.create_node(
        "opted-out",
        labelled,
        serde_json::json!({ IGNORE: "false" }),
    );
    assert_eq!(annotation(&k.node("opted-out")), Some("false"));
}
