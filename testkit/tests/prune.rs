//! The structural pruning of `testkit::prune` (the lib's write-back tests compile that module
//! in by path, so its tests live here and run once).

use serde_json::{Value, json};
use testkit::prune::{StructuralSchema, dropped_paths, prune};

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "spec": {
                "type": "object",
                "properties": {
                    "known": {"type": "string"},
                    "list": {"type": "array", "items": {
                        "type": "object", "properties": {"a": {"type": "string"}}
                    }},
                    "map": {"type": "object", "additionalProperties": {
                        "type": "object", "properties": {"x": {"type": "integer"}}
                    }},
                    "open": {
                        "type": "object",
                        "x-kubernetes-preserve-unknown-fields": true,
                        "properties": {"inner": {
                            "type": "object", "properties": {"y": {"type": "string"}}
                        }}
                    }
                }
            }
        }
    })
}

#[test]
fn prune_keeps_listed_fields_and_drops_the_rest() {
    let s = StructuralSchema::new(schema());
    let mut obj = json!({
        "apiVersion": "v1", "kind": "K",
        "metadata": {"name": "n", "labels": {"a": "b"}},
        "spec": {
            "known": "k", "unknown": 1,
            "list": [{"a": "1", "b": 2}, {"c": 3}],
            "map": {"k1": {"x": 1, "z": 2}, "k2": {}},
            "open": {"free": {"any": 1}, "inner": {"y": "y", "z": "z"}}
        },
        "status": {"anything": true}
    });
    s.prune_object(&mut obj);
    assert_eq!(
        obj,
        json!({
            "apiVersion": "v1", "kind": "K",
            "metadata": {"name": "n", "labels": {"a": "b"}},
            "spec": {
                "known": "k",
                "list": [{"a": "1"}, {}],
                "map": {"k1": {"x": 1}, "k2": {}},
                "open": {"free": {"any": 1}, "inner": {"y": "y"}}
            }
        })
    );
}

#[test]
fn additional_properties_true_keeps_map_values_whole() {
    let mut v = json!({"m": {"a": {"deep": 1}}, "gone": 1});
    prune(
        &mut v,
        &json!({"type": "object", "properties": {
            "m": {"type": "object", "additionalProperties": true}
        }}),
    );
    assert_eq!(v, json!({"m": {"a": {"deep": 1}}}));
}

#[test]
fn a_preserving_root_keeps_everything() {
    let s = StructuralSchema::new(json!({
        "type": "object", "x-kubernetes-preserve-unknown-fields": true
    }));
    let mut obj = json!({"spec": {"a": {"b": 1}}, "extra": [1]});
    let before = obj.clone();
    s.prune_object(&mut obj);
    assert_eq!(obj, before);
}

#[test]
fn dropped_paths_name_what_pruning_removed() {
    let before = json!({"a": {"b": 1, "c": [1, {"d": 2}]}, "e": 1});
    let after = json!({"a": {"c": [1, {}]}, "e": 1});
    let got: Vec<String> = dropped_paths(&before, &after).into_iter().collect();
    assert_eq!(got, ["/a/b", "/a/c/1/d"]);
}

#[test]
fn ciliums_crd_prunes_our_summary_and_keeps_its_own_fields() {
    let s = StructuralSchema::cilium();
    let mut obj = json!({
        "apiVersion": "cilium.io/v2", "kind": "CiliumNode",
        "metadata": {"name": "n", "finalizers": ["f"]},
        "spec": {"instance-id": "i-1", "ipam": {"pool": {"10.0.0.1": {"resource": "eni-1"}}},
                 "future-field": 1},
        "status": {
            "eni-operator": {"enis": 1, "available": 1, "used": 0, "needed": 0},
            "eni": {"enis": {"eni-1": {"id": "eni-1", "description": "d",
                                        "ipv6-prefixes": ["2001:db8::/80"],
                                        "subnet": {"id": "s", "cidr": "c", "x": 1}}}},
            "ipam": {"operator-status": {"error": "e"},
                     "release-ips": {"10.0.0.2": "released"}}
        }
    });
    let before = obj.clone();
    s.prune_object(&mut obj);
    let got: Vec<String> = dropped_paths(&before, &obj).into_iter().collect();
    assert_eq!(
        got,
        [
            "/spec/future-field",
            "/status/eni-operator",
            "/status/eni/enis/eni-1/ipv6-prefixes",
            "/status/eni/enis/eni-1/subnet/x",
        ]
    );
}

#[test]
fn our_crd_prunes_nothing_we_write() {
    let s = StructuralSchema::ours();
    let mut obj = json!({
        "apiVersion": "cilium.io/v2", "kind": "CiliumNode",
        "metadata": {"name": "n"},
        "spec": {"instance-id": "i-1", "future-field": {"a": 1}},
        "status": {
            "eni-operator": {"enis": 1, "available": 1, "used": 0, "needed": 0},
            "eni": {"enis": {"eni-1": {"id": "eni-1", "ipv6-prefixes": ["2001:db8::/80"],
                                        "subnet": {"id": "s", "x": 1}}}},
            "future-status": true
        }
    });
    let before = obj.clone();
    s.prune_object(&mut obj);
    assert_eq!(obj, before);
}
