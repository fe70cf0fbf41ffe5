//! What a CiliumNode's own metadata proves we served it as (pure). Every agent may write every
//! CiliumNode, so a finalizer or an instance on the object is a claim, not a fact: the
//! finalizer releases ENIs only for the instance we confirmed (its Node's providerID said so)
//! and recorded on that very object, in our annotation, and only when our field manager put both
//! the annotation and the finalizer there (`metadata.managedFields`, which the API server keeps:
//! a client's Update owns the fields it changed). Kept on the object, a restart cannot lose it;
//! bound to the object, a new object under the name starts unconfirmed.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::Value;

use crate::crd::FINALIZER;
use crate::ipam::handover::OWN_FIELD_MANAGER;

/// The instance we confirmed for the object, written when we first serve it.
pub const CONFIRMED_INSTANCE_ANNOTATION: &str = "eni-operator.cilium.io/confirmed-instance";

/// What the object's metadata proves.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Confirmed {
    /// Our annotation's value, when our field manager alone owns it.
    pub instance: Option<String>,
    /// Our finalizer is there and our field manager alone owns it.
    pub finalizer_ours: bool,
}

impl Confirmed {
    pub fn of(meta: &ObjectMeta) -> Self {
        let entries = meta.managed_fields.as_deref().unwrap_or_default();
        let owners = |path: &[&str]| -> (bool, bool) {
            entries
                .iter()
                .filter(|e| e.subresource.is_none())
                .filter(|e| {
                    let fields = e.fields_v1.as_ref().map(|f| &f.0);
                    fields.is_some_and(|f| owns(f, path))
                })
                .fold((false, false), |(ours, other), e| {
                    let own = e.manager.as_deref() == Some(OWN_FIELD_MANAGER);
                    (ours || own, other || !own)
                })
        };
        // Planted defect (dst-mutants): the record and the finalizer read without their owner.
        let only_ours = |path: &[&str]| {
            owners(path) == (true, false) || crate::mutants::active("trust-forged-finalizer")
        };
        let annotation = format!("f:{CONFIRMED_INSTANCE_ANNOTATION}");
        let instance = meta
            .annotations
            .as_ref()
            .and_then(|a| a.get(CONFIRMED_INSTANCE_ANNOTATION))
            .filter(|v| !v.is_empty())
            .filter(|_| only_ours(&["f:metadata", "f:annotations", &annotation]))
            .cloned();
        let listed = meta
            .finalizers
            .as_ref()
            .is_some_and(|f| f.iter().any(|x| x == FINALIZER));
        let element = format!("v:{}", Value::String(FINALIZER.into()));
        let finalizer_ours = listed && only_ours(&["f:metadata", "f:finalizers", &element]);
        Self {
            instance,
            finalizer_ours,
        }
    }

    /// The instance whose ENIs the finalizer may give back: ours to release only when both
    /// the record and the finalizer are ours.
    pub fn releasable(&self) -> Option<&str> {
        self.instance.as_deref().filter(|_| self.finalizer_ours)
    }
}

fn owns(fields: &Value, path: &[&str]) -> bool {
    path.iter().try_fold(fields, |v, k| v.get(*k)).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry};

    /// The fieldsV1 the API server records for an Update that set `annotations` and our
    /// finalizer.
    fn fields_of(annotations: &[&str], finalizer: bool) -> Value {
        let mut meta = serde_json::Map::new();
        if !annotations.is_empty() {
            let keys: serde_json::Map<String, Value> = annotations
                .iter()
                .map(|k| (format!("f:{k}"), Value::Object(Default::default())))
                .collect();
            meta.insert("f:annotations".into(), Value::Object(keys));
        }
        if finalizer {
            let element = format!("v:{}", Value::String(FINALIZER.into()));
            meta.insert(
                "f:finalizers".into(),
                serde_json::json!({ ".": {}, element: {} }),
            );
        }
        serde_json::json!({ "f:metadata": meta })
    }

    fn entry(manager: &str, fields: Value) -> ManagedFieldsEntry {
        ManagedFieldsEntry {
            manager: Some(manager.into()),
            operation: Some("Update".into()),
            fields_type: Some("FieldsV1".into()),
            fields_v1: Some(FieldsV1(fields)),
            ..Default::default()
        }
    }

    fn meta(entries: Vec<ManagedFieldsEntry>) -> ObjectMeta {
        ObjectMeta {
            annotations: Some(
                [(CONFIRMED_INSTANCE_ANNOTATION.to_string(), "i-1".to_string())].into(),
            ),
            finalizers: Some(vec!["other".into(), FINALIZER.into()]),
            managed_fields: Some(entries),
            ..Default::default()
        }
    }

    #[test]
    fn ours_when_our_manager_alone_set_the_record_and_the_finalizer() {
        let a = CONFIRMED_INSTANCE_ANNOTATION;
        let ours = meta(vec![
            entry("cilium-agent", serde_json::json!({"f:spec": {}})),
            entry(OWN_FIELD_MANAGER, fields_of(&[a], true)),
        ]);
        assert_eq!(Confirmed::of(&ours).releasable(), Some("i-1"));

        // Set by another manager (an agent, or forged in one write with the object).
        let agent = meta(vec![entry("cilium-agent", fields_of(&[a], true))]);
        assert_eq!(Confirmed::of(&agent), Confirmed::default());
        // Ours, but an agent wrote it too (took it over).
        let shared = meta(vec![
            entry(OWN_FIELD_MANAGER, fields_of(&[a], true)),
            entry("cilium-agent", fields_of(&[], true)),
        ]);
        let c = Confirmed::of(&shared);
        assert_eq!(c.instance.as_deref(), Some("i-1"));
        assert!(!c.finalizer_ours);
        assert_eq!(c.releasable(), None);
        // The record without our finalizer, the finalizer without the record.
        let split = meta(vec![
            entry(OWN_FIELD_MANAGER, fields_of(&[a], false)),
            entry("cilium-agent", fields_of(&[], true)),
        ]);
        assert_eq!(Confirmed::of(&split).releasable(), None);
        let unrecorded = meta(vec![entry(OWN_FIELD_MANAGER, fields_of(&[], true))]);
        let c = Confirmed::of(&unrecorded);
        assert!(c.finalizer_ours);
        assert_eq!(c.releasable(), None);
        // No managedFields at all: nothing proven.
        assert_eq!(Confirmed::of(&meta(Vec::new())), Confirmed::default());
        // A status write does not own metadata.
        let mut status = entry(OWN_FIELD_MANAGER, fields_of(&[a], true));
        status.subresource = Some("status".into());
        assert_eq!(Confirmed::of(&meta(vec![status])), Confirmed::default());
        // The finalizer's entry left behind after the finalizer went.
        let mut gone = meta(vec![entry(OWN_FIELD_MANAGER, fields_of(&[a], true))]);
        gone.finalizers = Some(vec!["other".into()]);
        assert!(!Confirmed::of(&gone).finalizer_ours);
    }
}
