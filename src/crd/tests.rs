use super::*;
use serde_json::json;

const MULTIPOOL: &str = include_str!("../../tests/fixtures/ciliumnode-multipool-prefix.json");
const SEED: &str = include_str!("../../tests/fixtures/ciliumnode-seed-pr45154.json");

fn is_empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.values().all(is_empty),
    }
}

/// `back` keeps every non-empty value of `orig` and adds nothing.
fn assert_preserved(orig: &Value, back: &Value, path: &str) {
    match (orig, back) {
        (Value::Object(o), Value::Object(b)) => {
            for (k, ov) in o {
                let p = format!("{path}.{k}");
                match b.get(k) {
                    Some(bv) => assert_preserved(ov, bv, &p),
                    None => assert!(is_empty(ov), "{p} was lost: {ov}"),
                }
            }
            for k in b.keys() {
                assert!(o.contains_key(k), "{path}.{k} was added");
            }
        }
        (Value::Array(o), Value::Array(b)) => {
            assert_eq!(o.len(), b.len(), "{path}: length changed");
            for (i, (ov, bv)) in o.iter().zip(b).enumerate() {
                assert_preserved(ov, bv, &format!("{path}[{i}]"));
            }
        }
        _ => assert_eq!(orig, back, "{path} changed"),
    }
}

fn round_trip(orig: &Value) -> CiliumNode {
    let node: CiliumNode = serde_json::from_value(orig.clone()).expect("deserializes");
    let back = serde_json::to_value(&node).unwrap();
    assert_preserved(orig, &back, "");
    // And a second pass is a fixed point.
    let again: CiliumNode = serde_json::from_value(back.clone()).unwrap();
    assert_eq!(serde_json::to_value(&again).unwrap(), back);
    node
}

#[test]
fn spec_example_round_trips() {
    let orig: Value = serde_json::from_str(MULTIPOOL).unwrap();
    let node = round_trip(&orig);
    let eni = &node.spec.eni;
    assert_eq!(node.spec.instance_id, "i-0b2f5c6d7e8f90123");
    assert_eq!(eni.first_interface_index, Some(1));
    assert_eq!(eni.delete_on_termination, Some(true));
    assert_eq!(eni.use_primary_address, Some(false));
    assert_eq!(eni.disable_prefix_delegation, Some(false));
    assert_eq!(node.spec.ipam.pool.len(), 32);
    assert_eq!(node.spec.ipam.pools.requested[0].needed.ipv4_addrs, 20);
    assert_eq!(node.spec.ipam.min_allocate, 16);
    // Agent fields we do not model are kept verbatim.
    assert_eq!(node.spec.extra["health"], json!({"ipv4": "100.120.26.177"}));
    let status = node.status.unwrap();
    let secondary = &status.eni.enis["eni-024ee4a1e521cda8c"];
    assert_eq!(secondary.number, 1);
    assert_eq!(secondary.addresses.len(), 32);
    assert_eq!(secondary.vpc.primary_cidr, "10.0.0.0/19");
    assert_eq!(status.eni.enis["eni-0c9d8e7f6a5b43210"].number, 0);
    assert_eq!(status.ipam.operator_status.error, None);
}

#[test]
fn seed_from_cilium_pr_45154_round_trips() {
    let orig: Value = serde_json::from_str(SEED).unwrap();
    let node = round_trip(&orig);
    assert_eq!(node.spec.ipam.pre_allocate, 1);
    assert_eq!(node.spec.ipam.min_allocate, 3);
    assert_eq!(
        node.spec.ipam.pools.allocated[0].cidrs,
        ["100.120.116.112/28", "100.120.26.176/28"]
    );
    let eni = &node.status.unwrap().eni.enis["eni-024ee4a1e521cda8c"];
    assert_eq!(eni.prefixes.len(), 2);
    assert_eq!(eni.tags["io.cilium/cilium-managed"], "true");
}

#[test]
fn classic_agent_node_round_trips() {
    let orig = json!({
        "apiVersion": "cilium.io/v2",
        "kind": "CiliumNode",
        "metadata": {"name": "classic", "finalizers": [FINALIZER],
                     "annotations": {IGNORE_ANNOTATION: "false"}},
        "spec": {
            "instance-id": "i-1",
            "eni": {"delete-on-termination": false, "first-interface-index": 0,
                    "exclude-interface-tags": {"no-pods": "true"},
                    "instance-id": "i-1", "pre-allocate": 8},
            "ipam": {"pool": {"10.0.0.5": {"resource": "eni-1"}}, "podCIDRs": ["10.1.0.0/24"],
                     "max-above-watermark": 4, "static-ip-tags": {"eip": "yes"}}
        },
        "status": {
            "ipam": {
                "used": {"10.0.0.5": {"owner": "default/pod-a", "resource": "eni-1"}},
                "release-ips": {"10.0.0.6": "marked-for-release", "10.0.0.7": "ready-for-release"},
                "operator-status": {"error": "no subnet"},
                "pod-cidrs": {"10.1.0.0/24": {"status": "in-use"}}
            }
        }
    });
    let node = round_trip(&orig);
    // Explicit false / 0 in the optional pointers is meaningful and must survive.
    assert_eq!(node.spec.eni.delete_on_termination, Some(false));
    assert_eq!(node.spec.eni.first_interface_index, Some(0));
    let back = serde_json::to_value(&node).unwrap();
    assert_eq!(back["spec"]["eni"]["delete-on-termination"], json!(false));
    assert_eq!(back["spec"]["eni"]["first-interface-index"], json!(0));
    let ipam = &node.status.unwrap().ipam;
    assert_eq!(
        ReleaseState::parse(&ipam.release_ips["10.0.0.6"]),
        Some(ReleaseState::MarkedForRelease)
    );
    assert_eq!(ipam.operator_status.error.as_deref(), Some("no subnet"));
}

/// Paths (dot-joined object keys, `*` for a map entry) whose objects are maps, not structs.
const MAPS: [&str; 9] = [
    "spec.ipam.pool",
    "spec.ipam.static-ip-tags",
    "spec.eni.subnet-tags",
    "spec.eni.security-group-tags",
    "spec.eni.exclude-interface-tags",
    "status.eni.enis",
    "status.eni.enis.*.tags",
    "status.ipam.used",
    "status.ipam.release-ips",
];

/// Add an unknown field to every struct-shaped object below `path`. `metadata` is
/// k8s-openapi's `ObjectMeta`, whose schema the API server owns: not ours to preserve.
fn inject_unknown(v: &mut Value, path: &str) {
    if path == "metadata" {
        return;
    }
    match v {
        Value::Object(o) => {
            let is_map = MAPS.contains(&path);
            for (k, child) in o.iter_mut() {
                let key = if is_map { "*" } else { k.as_str() };
                let p = if path.is_empty() {
                    key.to_string()
                } else {
                    format!("{path}.{key}")
                };
                inject_unknown(child, &p);
            }
            if !is_map && !path.is_empty() {
                o.insert(
                    "x-future-field".into(),
                    json!({"from": path, "list": [1, "two", {"three": true}]}),
                );
            }
        }
        Value::Array(a) => a.iter_mut().for_each(|c| inject_unknown(c, path)),
        _ => {}
    }
}

#[test]
fn unknown_fields_at_every_level_survive() {
    let mut orig: Value = serde_json::from_str(MULTIPOOL).unwrap();
    orig["spec"]["ipam"]["pools"]["allocated"][0]["allow-first-last-ips"] = json!(true);
    orig["status"]["ipam"]["operator-status"] = json!({"error": "x"});
    inject_unknown(&mut orig, "");
    // Sanity: the injection reached the deepest structs.
    assert!(
        orig["status"]["eni"]["enis"]["eni-024ee4a1e521cda8c"]["vpc"]["x-future-field"].is_object()
    );
    assert!(orig["spec"]["ipam"]["pools"]["requested"][0]["needed"]["x-future-field"].is_object());
    assert!(orig["spec"]["ipam"]["pool"]["100.120.26.176"]["x-future-field"].is_object());
    let node = round_trip(&orig);
    let back = serde_json::to_value(&node).unwrap();
    assert_eq!(
        back["status"]["eni"]["enis"]["eni-024ee4a1e521cda8c"]["subnet"]["x-future-field"]["from"],
        json!("status.eni.enis.*.subnet")
    );
    assert_eq!(
        back["spec"]["ipam"]["pools"]["allocated"][0]["allow-first-last-ips"],
        json!(true)
    );
}

#[test]
fn missing_fields_read_as_zero_values() {
    let node: CiliumNode = serde_json::from_value(json!({
        "apiVersion": "cilium.io/v2", "kind": "CiliumNode",
        "metadata": {"name": "bare"}, "spec": {}
    }))
    .unwrap();
    assert_eq!(node.spec, CiliumNodeSpec::default());
    assert!(node.status.is_none());
    let back = serde_json::to_value(&node).unwrap();
    assert_eq!(back["spec"], json!({}));
}

#[test]
fn crd_yaml_has_header_and_parses() {
    let yaml = crd_yaml();
    assert!(yaml.starts_with("# generated by crd-gen, do not edit"));
    let crd: Value = serde_saphyr::from_str(&yaml).unwrap();
    assert_eq!(crd["metadata"]["name"], json!("ciliumnodes.cilium.io"));
}
