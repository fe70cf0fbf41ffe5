//! The buckets: rates, bursts, tokens per call and page, the metrics of each call.

use super::*;

#[test]
fn default_buckets_are_a_fraction_of_aws() {
    let config = GateConfig::aws_defaults();
    assert_eq!(config.bucket_limits(Bucket::DescribeSubnets), (80, 16.0));
    assert_eq!(
        config.bucket_limits(Bucket::AttachNetworkInterface),
        (40, 4.0)
    );
    assert_eq!(
        config.bucket_limits(Bucket::CreateNetworkInterface),
        (80, 4.0)
    );
    let tiny = GateConfig {
        rate_fraction: 0.001,
        ..GateConfig::aws_defaults()
    };
    assert_eq!(
        tiny.bucket_limits(Bucket::DescribeSubnets).0,
        1,
        "burst at least 1"
    );
    let mut overridden = GateConfig::aws_defaults();
    overridden.overrides.insert(Bucket::DescribeVpcs, (7, 2.5));
    assert_eq!(overridden.bucket_limits(Bucket::DescribeVpcs), (7, 2.5));
}

#[tokio::test(start_paused = true)]
async fn a_thousand_concurrent_calls_never_exceed_the_rate() {
    let g = gate(Fake::default(), GateConfig::aws_defaults());
    let (burst, rate) = g.config().bucket_limits(Bucket::DescribeSubnets);
    let start = Instant::now();
    let tasks: Vec<_> = (0..1000)
        .map(|_| {
            let g = g.clone();
            tokio::spawn(async move {
                g.describe_subnets(&ResourceFilter::default(), None)
                    .await
                    .map(|_| ())
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    let times = g.inner().times(None);
    assert_eq!(times.len(), 1000);
    assert_within_rate(times.clone(), burst, rate);
    // And the bucket was used, not starved: the last call comes when the rate allows it.
    let last = times
        .iter()
        .max()
        .unwrap()
        .duration_since(start)
        .as_secs_f64();
    let expected = (1000.0 - f64::from(burst)) / rate;
    assert!(
        (last - expected).abs() < 0.5,
        "last call at {last}s, expected ~{expected}s"
    );
    assert_eq!(g.stats().total_calls(), 1000);
}

#[tokio::test(start_paused = true)]
async fn buckets_are_independent_per_action() {
    let g = gate(Fake::default(), GateConfig::aws_defaults());
    let start = Instant::now();
    // 40 creates and 40 attaches: each within its own burst, so none waits.
    let creates = (0..40).map(|_| {
        let g = g.clone();
        tokio::spawn(async move {
            g.create_network_interface(&CreateEniRequest {
                subnet_id: "subnet-1".into(),
                security_groups: vec![],
                description: String::new(),
                tags: Tags::new(),
                addresses: AddressRequest::Ips(1),
                client_token: "t".into(),
            })
            .await
            .map(|_| ())
        })
    });
    let attaches = (0..40).map(|_| {
        let g = g.clone();
        tokio::spawn(async move {
            g.attach_network_interface("eni-1", "i-1", 1)
                .await
                .map(|_| ())
        })
    });
    let all: Vec<_> = creates.chain(attaches).collect();
    for t in all {
        t.await.unwrap().unwrap();
    }
    assert!(g.inner().times(None).iter().all(|t| *t == start));
}

#[tokio::test(start_paused = true)]
async fn single_bucket_mode_shares_one_bucket_across_operations() {
    let g = gate(Fake::default(), GateConfig::cilium_like());
    let start = Instant::now();
    let tasks: Vec<_> = (0..60)
        .map(|i| {
            let g = g.clone();
            tokio::spawn(async move {
                match i % 3 {
                    0 => g
                        .describe_subnets(&ResourceFilter::default(), None)
                        .await
                        .map(|_| ()),
                    1 => g
                        .attach_network_interface("eni-1", "i-1", 1)
                        .await
                        .map(|_| ()),
                    _ => g.delete_network_interface("eni-1").await,
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    let times = g.inner().times(None);
    assert_within_rate(times.clone(), 20, 4.0);
    let last = times.iter().max().unwrap().duration_since(start);
    assert!(
        last >= Duration::from_secs(10),
        "60 calls at 4/s after a burst of 20: {last:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn every_page_takes_a_token() {
    let fake = Fake {
        pages: 3,
        ..Fake::default()
    };
    let mut config = GateConfig::aws_defaults();
    config.overrides.insert(Bucket::DescribeSubnets, (1, 1.0));
    let g = gate(fake, config);
    let start = Instant::now();
    let all = ResourceFilter::default();
    let subnets = collect_pages(|t| g.describe_subnets(&all, t))
        .await
        .unwrap();
    assert_eq!(subnets.len(), 3);
    let times: Vec<_> = g
        .inner()
        .times(None)
        .iter()
        .map(|t| t.duration_since(start))
        .collect();
    assert_eq!(
        times,
        vec![
            Duration::ZERO,
            Duration::from_secs(1),
            Duration::from_secs(2)
        ]
    );
    assert_eq!(g.stats().calls[&Operation::DescribeSubnets], 3);
}

#[tokio::test(start_paused = true)]
async fn unassigning_ips_and_prefixes_takes_two_tokens() {
    let mut config = GateConfig::aws_defaults();
    config
        .overrides
        .insert(Bucket::UnassignPrivateIpAddresses, (1, 1.0));
    let g = gate(Fake::default(), config);
    let start = Instant::now();
    let ip = [Ipv4Addr::new(10, 0, 0, 9)];
    let prefix = ["10.0.1.0/28".parse().unwrap()];
    g.unassign_private_ip_addresses("eni-1", &ip, &prefix)
        .await
        .unwrap();
    // The second token came one period after the first.
    assert_eq!(start.elapsed(), Duration::from_secs(1));
    assert_eq!(g.stats().calls[&Operation::UnassignPrivateIpAddresses], 2);
    // Nothing to unassign: no call, no token.
    g.unassign_private_ip_addresses("eni-1", &[], &[])
        .await
        .unwrap();
    assert_eq!(g.inner().times(None).len(), 1);
    assert_eq!(start.elapsed(), Duration::from_secs(1));
}

/// A gate with its metrics registered, after one assign call throttled once and retried.
async fn assign_throttled_once() -> (Arc<Gate<Fake>>, Registry) {
    let fake = Fake::failing(
        Operation::AssignPrivateIpAddresses,
        "RequestLimitExceeded",
        1,
    );
    let g = gate(fake, GateConfig::aws_defaults());
    let mut registry = Registry::default();
    g.metrics().register(&mut registry);
    g.assign_private_ip_addresses("eni-1", AddressRequest::Ips(1))
        .await
        .unwrap();
    (g, registry)
}

fn encoded(registry: &Registry) -> String {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, registry).unwrap();
    text
}

#[tokio::test(start_paused = true)]
async fn metrics_count_calls_by_outcome_and_response_code() {
    let (_g, registry) = assign_throttled_once().await;
    let text = encoded(&registry);
    for line in [
        r#"ec2_api_calls_total{operation="AssignPrivateIpAddresses",outcome="throttled"} 1"#,
        r#"ec2_api_calls_total{operation="AssignPrivateIpAddresses",outcome="success"} 1"#,
        r#"ec2_api_retries_total{operation="AssignPrivateIpAddresses"} 1"#,
        r#"ec2_api_throttled_total{operation="AssignPrivateIpAddresses"} 1"#,
        r#"ec2_api_duration_seconds_count{operation="AssignPrivateIpAddresses",response_code="RequestLimitExceeded"} 1"#,
        r#"ec2_api_duration_seconds_count{operation="AssignPrivateIpAddresses",response_code="OK"} 1"#,
        r#"ec2_rate_limit_wait_seconds_count{operation="AssignPrivateIpAddresses"} 2"#,
        // Untouched buckets report their ceiling.
        r#"ec2_rate_limit_qps{bucket="delete-network-interface"} 4.0"#,
    ] {
        assert!(text.contains(line), "missing {line} in\n{text}");
    }
    // The throttled bucket reports its cut rate: 0.7 × the one call sent in the measuring
    // window, on its way back to the ceiling (the retry waited for the probe 2 s later).
    let line = text
        .lines()
        .find(|l| l.starts_with(r#"ec2_rate_limit_qps{bucket="assign-private-ip-addresses"}"#))
        .expect("the assign bucket's rate");
    let rate: f64 = line.rsplit(' ').next().unwrap().parse().unwrap();
    let cut = rate::BETA / rate::MEASURE.as_secs_f64();
    assert!(rate > cut && rate < 4.0 * rate::BETA, "{line}");
}

#[tokio::test(start_paused = true)]
async fn an_idle_buckets_gauge_follows_its_probe_back_to_the_ceiling() {
    let (g, registry) = assign_throttled_once().await;
    // No assign call after: the probe (2 s after the cut) ramps the rate to its ceiling in a
    // few seconds; a call of another bucket then publishes it.
    tokio::time::sleep(Duration::from_secs(30)).await;
    g.delete_network_interface("eni-1").await.unwrap();
    let text = encoded(&registry);
    let line = r#"ec2_rate_limit_qps{bucket="assign-private-ip-addresses"} 4.0"#;
    assert!(text.contains(line), "missing {line} in\n{text}");
    assert!(
        text.contains(r#"ec2_rate_limit_recoveries_total{bucket="assign-private-ip-addresses"} 1"#),
        "{text}"
    );
}
