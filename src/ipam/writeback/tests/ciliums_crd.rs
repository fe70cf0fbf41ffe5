//! What we write, stored under Cilium's own CRD (the API server prunes what it does not list).

use super::*;

fn stored_under_ciliums_crd(n: &CiliumNode) -> CiliumNode {
    let mut v = serde_json::to_value(n).unwrap();
    prune::StructuralSchema::cilium().prune_object(&mut v);
    serde_json::from_value(v).unwrap()
}

#[test]
fn a_summary_pruned_by_ciliums_crd_counts_as_unchanged() {
    let w = world_with_prefix();
    let d = desired(&node(), &w);
    let first = changes(&node(), &d);
    assert!(
        status_write(&first).unwrap().patch["status"]["eni-operator"].is_object(),
        "the summary rides along with the first status write"
    );
    let n1 = stored_under_ciliums_crd(&apply(&node(), &first));
    assert_eq!(n1.status.as_ref().unwrap().eni_operator, None, "pruned");
    let d1 = desired(&n1, &w);
    assert_eq!(
        changes(&n1, &d1).writes,
        [],
        "nothing to write on the next pass"
    );

    // A real change still carries the summary (our CRD would keep it).
    let mut w2 = w.clone();
    w2.enis[1].prefixes.clear();
    let d2 = desired(&n1, &w2);
    let ch2 = changes(&n1, &d2);
    assert!(status_write(&ch2).unwrap().patch["status"]["eni-operator"].is_object());
}

/// Under our CRD (which keeps the summary) a summary that went stale because the agent's
/// `used` moved is not written on its own (every agent write would be followed by one of
/// ours); the next real status change carries the fresh one.
#[test]
fn a_stale_summary_alone_is_not_written_but_rides_along_with_a_real_change() {
    let w = world_with_prefix();
    let d = desired(&node(), &w);
    let mut n1 = apply(&node(), &changes(&node(), &d));
    assert_eq!(
        n1.status.as_ref().unwrap().eni_operator.as_ref(),
        Some(&d.summary)
    );
    assert!(changes(&n1, &d).is_empty());
    n1.status
        .as_mut()
        .unwrap()
        .eni_operator
        .as_mut()
        .unwrap()
        .used = 99;
    assert_eq!(changes(&n1, &d).writes, [], "the summary alone is no write");

    let mut w2 = w.clone();
    w2.enis[1].prefixes.clear();
    let d2 = desired(&n1, &w2);
    let ch2 = changes(&n1, &d2);
    assert_eq!(
        status_write(&ch2).unwrap().patch["status"]["eni-operator"],
        serde_json::to_value(&d2.summary).unwrap(),
        "a real change carries the fresh summary"
    );
}

#[test]
fn every_field_we_write_survives_ciliums_crd_but_the_known_prunable_ones() {
    let mut w = world_with_prefix();
    w.enis[1].ipv6_prefixes = vec!["2001:db8::/80".into()];
    w.enis[1].public_ip = Some("54.0.0.1".into());
    w.enis[1].description = "eni-operator".into();
    let p = Problem {
        reason: ProblemReason::AtCapacity,
        message: "full".into(),
    };
    let mut d = desired_with(&node(), &w, Some(&p));
    d.release_ips
        .insert("10.0.99.1".into(), Some("marked-for-release".into()));
    let written = apply(&node(), &changes(&node(), &d));
    let stored = stored_under_ciliums_crd(&written);
    let dropped = prune::dropped_paths(
        &serde_json::to_value(&written).unwrap(),
        &serde_json::to_value(&stored).unwrap(),
    );
    let mut expected: BTreeSet<String> = ["/status/eni-operator".to_string()].into();
    for field in PRUNABLE_ENI_FIELDS {
        expected.insert(format!("/status/eni/enis/eni-1/{field}"));
    }
    assert_eq!(dropped, expected);
    let st = stored.status.as_ref().unwrap();
    assert_eq!(st.ipam.release_ips["10.0.99.1"], "marked-for-release");
    assert_eq!(
        st.ipam.operator_status.error.as_deref(),
        Some("AtCapacity: full")
    );
    assert_eq!(st.eni.enis["eni-1"].public_ip, "54.0.0.1");
    assert_eq!(stored.spec.ipam.pool.len(), 18);
    assert!(
        changes(&stored, &d).is_empty(),
        "settled under Cilium's CRD"
    );

    // Where the CRD keeps them (ours), a pruned-looking field that changes is written.
    w.enis[1].ipv6_prefixes.clear();
    let d2 = desired_with(&written, &w, Some(&p));
    let ch = changes(&written, &d2);
    assert_eq!(
        status_write(&ch).unwrap().patch["status"]["eni"]["enis"]["eni-1"]["ipv6-prefixes"],
        json!(null)
    );
}
