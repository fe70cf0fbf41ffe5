//! Each group of flags reaches the config of the part that reads it.

use super::*;

#[test]
fn ipam_flags_reach_the_ipam_config() {
    let s = parse(&[
        "--aws-enable-prefix-delegation",
        "--aws-release-excess-ips",
        "--excess-ip-release-delay=30",
        "--aws-use-primary-address",
        "--eni-tags=team=blue",
        "--cluster-name=prod",
    ])
    .unwrap();
    let c = s.ipam.ipam_config();
    assert!(c.prefix_delegation && c.release_excess_ips && c.use_primary_address);
    assert_eq!(c.release_delay, Duration::from_secs(30));
    assert_eq!(c.eni_tags, BTreeMap::from([("team".into(), "blue".into())]));
    assert_eq!(c.cluster_name, "prod");
    // By default the cluster's own tag allow-lists the Elastic IPs; the flag replaces it.
    let tag = |c: &crate::ipam::IpamConfig| c.static_ip_required_tag();
    assert_eq!(
        tag(&c),
        ("eni-operator.io/cluster-name".into(), "prod".into())
    );
    let s = parse(&["--cluster-name=prod", "--static-ip-required-tag=egress=ok"]).unwrap();
    assert_eq!(tag(&s.ipam.ipam_config()), ("egress".into(), "ok".into()));
}

#[test]
fn runtime_and_ipam_flags_reach_the_core_config() {
    let s = parse(&[
        "--parallel-alloc-workers=7",
        "--ec2-resync-interval=2m",
        "--node-resync-interval=3m",
        "--ec2-refresh-min-spacing=20s",
        "--annotate-cilium-ignore",
        "--vpc-id=vpc-9",
        "--cluster-name=prod",
    ])
    .unwrap();
    let c = s.core_config();
    assert_eq!(c.workers, 7);
    assert_eq!(c.resync_interval, Duration::from_secs(120));
    assert_eq!(c.node_rescan_interval, Duration::from_secs(180));
    assert_eq!(c.instance_refresh_spacing, Duration::from_secs(20));
    assert!(c.annotate_cilium_ignore);
    assert_eq!(c.scope.vpc_id.as_deref(), Some("vpc-9"));
    assert_eq!(c.ipam.cluster_name, "prod");
    assert!(
        c.require_node,
        "the binary always checks CiliumNodes against their Nodes"
    );
    assert!(
        c.require_cluster_tag,
        "and their instances' cluster tag, unless told not to"
    );
}

#[test]
fn election_flags_reach_the_leader_config() {
    let s = parse(&[
        "--identity=replica-1",
        "--leader-election-lease-duration=20s",
        "--leader-election-renew-deadline=12s",
        "--leader-election-retry-period=3s",
    ])
    .unwrap();
    let c = s.kube.leader_config();
    assert_eq!(c.identity, "replica-1");
    assert_eq!(c.lease_duration, Duration::from_secs(20));
    assert_eq!(c.renew_deadline, Duration::from_secs(12));
    assert_eq!(c.retry_period, Duration::from_secs(3));
}

#[test]
fn ec2_flags_reach_the_aws_client_config() {
    let s = parse(&[
        "--aws-region=eu-west-1",
        "--ec2-api-endpoint=localhost:5000",
        "--ec2-connect-timeout=2s",
        "--ec2-operation-timeout=9s",
        "--aws-max-results-per-call=50",
    ])
    .unwrap();
    let c = s.ec2.aws_client_config();
    assert_eq!(c.region.as_deref(), Some("eu-west-1"));
    assert_eq!(c.endpoint_url.as_deref(), Some("https://localhost:5000"));
    assert_eq!(c.connect_timeout, Duration::from_secs(2));
    assert_eq!(c.operation_timeout, Duration::from_secs(9));
    assert_eq!(c.max_results_per_call, Some(50));
}

#[test]
fn gate_flags_reach_the_gate_config() {
    let s = parse(&[
        "--ec2-rate-fraction=0.5",
        "--ec2-bucket=describe=7/3",
        "--ec2-max-attempts=2",
        "--limit-ipam-api-qps=4",
        "--limit-ipam-api-burst=9",
    ])
    .unwrap();
    let c = s.gate.gate_config();
    assert_eq!(c.rate_fraction, 0.5);
    assert_eq!(c.overrides[&Bucket::DescribeSubnets], (7, 3.0));
    assert_eq!(c.overrides[&Bucket::DescribeNetworkInterfaces], (7, 3.0));
    // Every bucket gets its limits, the others at half of AWS's defaults.
    assert_eq!(c.overrides.len(), Bucket::ALL.len());
    let (burst, rate) = Bucket::DeleteNetworkInterface.aws_default();
    assert_eq!(
        c.overrides[&Bucket::DeleteNetworkInterface],
        (burst / 2, rate as f64 / 2.0)
    );
    assert_eq!(c.single_bucket, Some((4.0, 9)));
    assert_eq!(c.max_attempts, 2);
}

#[test]
fn every_scope_flag_reaches_the_scope() {
    let s = Settings::try_parse_from([
        "eni-operator",
        "--vpc-id=vpc-1",
        "--subnet-ids-filter=subnet-1,subnet-2",
        "--subnet-tags-filter=role=pods",
        "--instance-tags-filter=team=blue,env=prod",
    ])
    .unwrap();
    let scope = s.ipam.scope();
    assert_eq!(scope.vpc_id.as_deref(), Some("vpc-1"));
    assert_eq!(scope.subnet_ids, ["subnet-1", "subnet-2"]);
    assert_eq!(
        scope.subnet_tags,
        BTreeMap::from([("role".into(), "pods".into())])
    );
    assert_eq!(
        scope.instance_tags,
        BTreeMap::from([
            ("team".into(), "blue".into()),
            ("env".into(), "prod".into())
        ])
    );
}
