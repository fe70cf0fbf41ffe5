//! Structural-schema pruning as the Kubernetes API server does it for custom resources, so the
//! in-memory API server ([`crate::sink::MemorySink`]) stores what a real one would.
//!
//! The rules follow the Kubernetes documentation of CustomResourceDefinitions, "Specifying a
//! structural schema" and "Field pruning"
//! (<https://kubernetes.io/docs/tasks/extend-kubernetes/custom-resources/custom-resource-definitions/#specifying-a-structural-schema>,
//! `#field-pruning` on the same page), and the algorithm of
//! `k8s.io/apiextensions-apiserver/pkg/apiserver/schema/pruning`:
//! * an object keeps only the keys its `properties` list, each pruned by its own schema;
//! * keys not listed are pruned by `additionalProperties` when it is a schema (every value
//!   of a map), else dropped;
//! * an array prunes every element by `items`;
//! * `x-kubernetes-preserve-unknown-fields: true` keeps unlisted keys (listed ones are still
//!   pruned by their schemas);
//! * at the root, `apiVersion`, `kind` and `metadata` are kept whatever the schema says; the
//!   server keeps the standard ObjectMeta fields there (we store nothing else in metadata).
//!
//! `x-kubernetes-embedded-resource` (no CiliumNode CRD uses it) is not modelled.
//!
//! Written here rather than taken from a crate: no maintained Rust crate implements it, and the
//! algorithm is a 40-line recursion.

use serde_json::{Map, Value};

/// The `openAPIV3Schema` of one version of a CRD.
#[derive(Clone, Debug, PartialEq)]
pub struct StructuralSchema {
    root: Value,
}

/// Cilium's own CiliumNode CRD (what real clusters run; it prunes unlisted fields).
pub const CILIUM_CRD_YAML: &str = include_str!("../../tests/fixtures/ciliumnodes.cilium.io.yaml");

/// eni-operator's CiliumNode CRD (preserves unknown fields everywhere).
pub const OUR_CRD_YAML: &str = include_str!("../../manifests/crd/ciliumnodes.cilium.io.yaml");

impl StructuralSchema {
    pub fn new(open_api_v3_schema: Value) -> Self {
        Self {
            root: open_api_v3_schema,
        }
    }

    /// The schema of `version` in the first CustomResourceDefinition of a YAML stream.
    pub fn from_crd_yaml(yaml: &str, version: &str) -> Result<Self, String> {
        let docs: Vec<Value> = serde_saphyr::from_multiple(yaml).map_err(|e| e.to_string())?;
        for v in docs {
            if v.get("kind").and_then(Value::as_str) == Some("CustomResourceDefinition") {
                return Self::from_crd(&v, version);
            }
        }
        Err("no CustomResourceDefinition in the YAML".into())
    }

    /// The schema of `version` of a CustomResourceDefinition (as JSON, e.g. read from a
    /// cluster).
    pub fn from_crd(crd: &Value, version: &str) -> Result<Self, String> {
        let versions = crd
            .pointer("/spec/versions")
            .and_then(Value::as_array)
            .ok_or("CRD without spec.versions")?;
        let schema = versions
            .iter()
            .find(|x| x.get("name").and_then(Value::as_str) == Some(version))
            .and_then(|x| x.pointer("/schema/openAPIV3Schema"))
            .ok_or_else(|| format!("CRD has no schema for version {version}"))?;
        Ok(Self::new(schema.clone()))
    }

    /// Cilium's CRD, `cilium.io/v2`.
    pub fn cilium() -> Self {
        Self::from_crd_yaml(CILIUM_CRD_YAML, "v2").expect("the Cilium CRD fixture parses")
    }

    /// Our CRD, `cilium.io/v2`.
    pub fn ours() -> Self {
        Self::from_crd_yaml(OUR_CRD_YAML, "v2")
            .expect("manifests/crd/ciliumnodes.cilium.io.yaml parses")
    }

    /// Prune a whole object (the resource root) in place.
    pub fn prune_object(&self, object: &mut Value) {
        let Value::Object(map) = object else {
            return;
        };
        // The root is an embedded resource: these three are the server's, not the schema's.
        let kept: Vec<(String, Value)> = ["apiVersion", "kind", "metadata"]
            .iter()
            .filter_map(|k| map.remove(*k).map(|v| ((*k).to_string(), v)))
            .collect();
        prune(object, &self.root);
        if let Value::Object(map) = object {
            map.extend(kept);
        }
    }
}

fn properties(schema: &Value) -> Option<&Map<String, Value>> {
    schema.get("properties").and_then(Value::as_object)
}

fn preserves(schema: &Value) -> bool {
    schema
        .get("x-kubernetes-preserve-unknown-fields")
        .and_then(Value::as_bool)
        == Some(true)
}

/// `additionalProperties` as a pruning rule: `Some(None)` keeps values as they are
/// (`additionalProperties: true`), `Some(Some(schema))` prunes them by `schema`.
fn additional(schema: &Value) -> Option<Option<&Value>> {
    match schema.get("additionalProperties")? {
        Value::Bool(true) => Some(None),
        Value::Object(_) => Some(schema.get("additionalProperties")),
        _ => None,
    }
}

fn prune_with(value: &mut Value, rule: Option<&Value>) {
    if let Some(s) = rule {
        prune(value, s);
    }
}

/// Prune `value` by `schema` (one node of a structural schema).
pub fn prune(value: &mut Value, schema: &Value) {
    match value {
        Value::Object(map) => {
            let props = properties(schema);
            let add = additional(schema);
            let keep_unknown = preserves(schema);
            map.retain(|key, _| {
                keep_unknown || add.is_some() || props.is_some_and(|p| p.contains_key(key))
            });
            for (key, v) in map.iter_mut() {
                match props.and_then(|p| p.get(key)) {
                    Some(s) => prune(v, s),
                    None => {
                        if let Some(rule) = add {
                            prune_with(v, rule);
                        }
                        // Otherwise kept verbatim under preserve-unknown-fields.
                    }
                }
            }
        }
        Value::Array(items) => {
            if let Some(s) = schema.get("items") {
                for v in items {
                    prune(v, s);
                }
            }
        }
        _ => {}
    }
}

/// The JSON pointers of everything in `before` that `after` lacks (what pruning dropped).
pub fn dropped_paths(before: &Value, after: &Value) -> std::collections::BTreeSet<String> {
    let mut out = std::collections::BTreeSet::new();
    walk_dropped(before, Some(after), String::new(), &mut out);
    out
}

fn walk_dropped(
    before: &Value,
    after: Option<&Value>,
    path: String,
    out: &mut std::collections::BTreeSet<String>,
) {
    let Some(after) = after else {
        out.insert(path);
        return;
    };
    match (before, after) {
        (Value::Object(b), Value::Object(a)) => {
            for (k, v) in b {
                walk_dropped(v, a.get(k), format!("{path}/{k}"), out);
            }
        }
        (Value::Array(b), Value::Array(a)) => {
            for (i, v) in b.iter().enumerate() {
                walk_dropped(v, a.get(i), format!("{path}/{i}"), out);
            }
        }
        _ => {}
    }
}
