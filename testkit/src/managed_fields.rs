//! `metadata.managedFields` as the API server keeps them, for the part the operator reads back
//! ([`eni_operator::ipam::confirmed`]): who set each annotation and our finalizer. A client's
//! Update (a PUT or a merge patch) owns the fields it changed, taken from whoever owned them;
//! a field written with the value it had changes no owner; a removed field is owned by nobody
//! (Kubernetes, "Server-Side Apply", "Field management": managers of Update operations).
//! Entries carry no `time` unless the sink has a clock ([`record_at`]; the simulation's), as the
//! API server stamps each entry it changes.

use std::collections::{BTreeMap, BTreeSet};

use eni_operator::crd::FINALIZER;
use serde_json::{Map, Value, json};

/// The field manager of an agent's writes (client-go names it after the binary).
pub const AGENT_MANAGER: &str = "cilium-agent";

/// The metadata whose owners this model keeps.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Owned {
    annotations: BTreeMap<String, Value>,
    finalizer: bool,
}

impl Owned {
    pub fn of(obj: &Value) -> Self {
        let annotations = obj
            .pointer("/metadata/annotations")
            .and_then(Value::as_object)
            .map(|a| a.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
            .unwrap_or_default();
        let finalizer = obj
            .pointer("/metadata/finalizers")
            .and_then(Value::as_array)
            .is_some_and(|f| f.iter().any(|x| x == FINALIZER));
        Self {
            annotations,
            finalizer,
        }
    }
}

/// Record in `obj` that `manager(field)` changed what differs between `before` and `obj`.
pub fn record(obj: &mut Value, before: &Owned, manager: impl Fn(Option<&str>) -> &'static str) {
    record_at(obj, before, manager, None);
}

/// [`record`], stamping the entries that gain a field with `time` (RFC 3339, seconds).
pub fn record_at(
    obj: &mut Value,
    before: &Owned,
    manager: impl Fn(Option<&str>) -> &'static str,
    time: Option<&str>,
) {
    let after = Owned::of(obj);
    let keys: BTreeSet<&String> = before
        .annotations
        .keys()
        .chain(after.annotations.keys())
        .collect();
    let mut changes = Vec::new();
    for key in keys {
        let now = after.annotations.get(key);
        if before.annotations.get(key) != now {
            let path = vec![
                "f:metadata".into(),
                "f:annotations".into(),
                format!("f:{key}"),
            ];
            changes.push((path, now.is_some().then(|| manager(Some(key)))));
        }
    }
    if before.finalizer != after.finalizer {
        let element = format!("v:{}", Value::String(FINALIZER.into()));
        let path = vec!["f:metadata".into(), "f:finalizers".into(), element];
        changes.push((path, after.finalizer.then(|| manager(None))));
    }
    for (path, owner) in changes {
        set_owner(obj, &path, owner, time);
    }
}

/// The creator's entry as the API server records it for every create: it owns the spec it
/// sent (here `spec.instance-id`, what the guard reads of it), whatever metadata it set.
pub fn record_creator(obj: &mut Value, manager: &'static str, time: Option<&str>) {
    let path = ["f:spec".to_string(), "f:instance-id".to_string()];
    set_owner(obj, &path, Some(manager), time);
}

fn set_owner(obj: &mut Value, path: &[String], owner: Option<&str>, time: Option<&str>) {
    let meta = obj["metadata"].as_object_mut().expect("metadata");
    let entries = meta
        .entry("managedFields")
        .or_insert_with(|| json!([]))
        .as_array_mut()
        .expect("managedFields is a list");
    for e in entries.iter_mut() {
        let (last, parents) = path.split_last().expect("a path");
        let parent = parents
            .iter()
            .try_fold(&mut e["fieldsV1"], |v, k| v.get_mut(k.as_str()));
        if let Some(p) = parent.and_then(Value::as_object_mut) {
            p.remove(last.as_str());
        }
    }
    let Some(owner) = owner else { return };
    let at = match entries
        .iter()
        .position(|e| e["manager"] == owner && e.get("subresource").is_none())
    {
        Some(i) => i,
        None => {
            entries.push(json!({
                "manager": owner, "operation": "Update", "apiVersion": "cilium.io/v2",
                "fieldsType": "FieldsV1", "fieldsV1": {},
            }));
            entries.len() - 1
        }
    };
    if let Some(time) = time {
        entries[at]["time"] = json!(time);
    }
    path.iter().fold(&mut entries[at]["fieldsV1"], |v, k| {
        let m = v.as_object_mut().expect("fieldsV1 objects");
        m.entry(k.clone())
            .or_insert_with(|| Value::Object(Map::new()))
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use eni_operator::ipam::confirmed::{CONFIRMED_INSTANCE_ANNOTATION, Confirmed};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn meta(obj: &Value) -> ObjectMeta {
        serde_json::from_value(obj["metadata"].clone()).unwrap()
    }

    #[test]
    fn the_manager_that_changed_a_field_owns_it() {
        let ours = |_: Option<&str>| "eni-operator";
        let agent = |_: Option<&str>| AGENT_MANAGER;
        let mut obj = json!({"metadata": {"name": "n"}});
        let before = Owned::of(&obj);
        obj["metadata"]["annotations"] = json!({CONFIRMED_INSTANCE_ANNOTATION: "i-1"});
        obj["metadata"]["finalizers"] = json!([FINALIZER]);
        record(&mut obj, &before, ours);
        assert_eq!(Confirmed::of(&meta(&obj)).releasable(), Some("i-1"));

        // The same values written again by an agent: no owner changes.
        let before = Owned::of(&obj);
        record(&mut obj, &before, agent);
        assert_eq!(Confirmed::of(&meta(&obj)).releasable(), Some("i-1"));

        // An agent changes the record: it owns it now, we do not.
        let before = Owned::of(&obj);
        obj["metadata"]["annotations"][CONFIRMED_INSTANCE_ANNOTATION] = json!("i-2");
        record(&mut obj, &before, agent);
        let c = Confirmed::of(&meta(&obj));
        assert_eq!((c.instance, c.finalizer_ours), (None, true));

        // The finalizer removed: owned by nobody.
        let before = Owned::of(&obj);
        obj["metadata"]["finalizers"] = json!([]);
        record(&mut obj, &before, ours);
        let fields = obj.pointer("/metadata/managedFields").unwrap().to_string();
        assert!(!fields.contains("release-enis"), "{fields}");
    }
}
