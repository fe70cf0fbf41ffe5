use super::*;

#[test]
fn modify_is_named_as_cilium_names_it_per_family() {
    let ours = [
        "eni_operator_ec2_api_duration_seconds_count{operation=\"ModifyNetworkInterfaceAttribute\",response_code=\"OK\"} 2",
        "eni_operator_ec2_rate_limit_wait_seconds_count{operation=\"ModifyNetworkInterfaceAttribute\"} 2",
    ];
    let samples: Vec<Sample> = ours.iter().filter_map(|l| parse_sample(l)).collect();
    let text = cilium_families(&samples);
    for line in [
        "cilium_operator_ec2_api_duration_seconds_count{operation=\"ModifyNetworkInterface\",response_code=\"OK\"} 2",
        "cilium_operator_ec2_api_rate_limit_duration_seconds_count{operation=\"ModifyNetworkInterfaceAttribute\"} 2",
    ] {
        assert!(text.contains(line), "{line} not in {text}");
    }
}

#[test]
fn parses_labels_with_escapes() {
    let s = parse_sample(r#"x_bucket{a="1",b="q\"uote",le="+Inf"} 3"#).unwrap();
    assert_eq!(s.name, "x_bucket");
    assert_eq!(
        s.labels,
        vec![
            ("a".into(), "1".into()),
            ("b".into(), "q\"uote".into()),
            ("le".into(), "+Inf".into())
        ]
    );
    assert_eq!(s.value, "3");
    assert_eq!(parse_sample("y 2.5").unwrap().labels, vec![]);
    assert_eq!(parse_sample("# HELP y z"), None);
}

#[test]
fn openmetrics_becomes_text_0_0_4() {
    let om = "# HELP a_b Build.\n# TYPE a_b info\na_b_info{version=\"1\"} 1\n\
                  # HELP c Calls.\n# TYPE c counter\nc_total 4\n# EOF\n";
    let text = openmetrics_to_text(om);
    assert_eq!(
        text,
        "# HELP a_b_info Build.\n# TYPE a_b_info gauge\na_b_info{version=\"1\"} 1\n\
             # HELP c_total Calls.\n# TYPE c_total counter\nc_total 4\n"
    );
}

#[test]
fn histograms_merge_failures_and_keep_buckets_ordered() {
    let om = "\
x_sum{operation=\"A\",response_code=\"OK\"} 1.5
x_count{operation=\"A\",response_code=\"OK\"} 2
x_bucket{le=\"1.0\",operation=\"A\",response_code=\"OK\"} 1
x_bucket{le=\"+Inf\",operation=\"A\",response_code=\"OK\"} 2
x_sum{operation=\"A\",response_code=\"Throttling\"} 1
x_count{operation=\"A\",response_code=\"Throttling\"} 1
x_bucket{le=\"1.0\",operation=\"A\",response_code=\"Throttling\"} 1
x_bucket{le=\"+Inf\",operation=\"A\",response_code=\"Throttling\"} 1
x_sum{operation=\"A\",response_code=\"Timeout\"} 9
x_count{operation=\"A\",response_code=\"Timeout\"} 1
x_bucket{le=\"1.0\",operation=\"A\",response_code=\"Timeout\"} 0
x_bucket{le=\"+Inf\",operation=\"A\",response_code=\"Timeout\"} 1
";
    let samples: Vec<Sample> = om.lines().filter_map(parse_sample).collect();
    let mut out = String::new();
    histogram(&mut out, "y", "x", &samples);
    assert!(out.contains("y_bucket{operation=\"A\",response_code=\"Failed\",le=\"1\"} 1\n"));
    assert!(out.contains("y_bucket{operation=\"A\",response_code=\"Failed\",le=\"+Inf\"} 2\n"));
    assert!(out.contains("y_count{operation=\"A\",response_code=\"Failed\"} 2\n"));
    assert!(out.contains("y_sum{operation=\"A\",response_code=\"OK\"} 1.5\n"));
}
