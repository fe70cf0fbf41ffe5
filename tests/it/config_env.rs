//! The environment as a source of settings: each setting's variable overrides its default and a
//! flag overrides the variable. Here and not in the library's unit tests because the test needs an
//! environment of its own: it runs in a child process given the variables (`support::child`).

use std::collections::BTreeMap;

use eni_operator::config::Settings;
use eni_operator::ec2::Bucket;

use crate::support::{child, settings};

#[test]
fn env_overrides_default_and_flag_overrides_env() {
    if !child::in_child() {
        child::run_alone(
            module_path!(),
            "env_overrides_default_and_flag_overrides_env",
            |cmd| {
                // A developer's shell may set some.
                for name in settings::env_names() {
                    cmd.env_remove(name);
                }
                cmd.env("ENI_OPERATOR_CLUSTER_NAME", "prod")
                    .env("ENI_OPERATOR_AWS_RELEASE_EXCESS_IPS", "true")
                    .env("ENI_OPERATOR_ENI_GC_INTERVAL", "0")
                    .env("ENI_OPERATOR_ENI_TAGS", "team=net,env=prod")
                    .env("ENI_OPERATOR_LEADER_ELECTION", "false")
                    .env(
                        "ENI_OPERATOR_EC2_BUCKET",
                        "describe=10/2,delete-network-interface=4/1",
                    );
            },
        );
        return;
    }
    let s = Settings::load_from(["eni-operator", "--cluster-name", "flag-wins"]).unwrap();
    assert_eq!(s.ipam.cluster_name.as_deref(), Some("flag-wins"));
    assert!(s.ipam.aws_release_excess_ips);
    assert_eq!(s.runtime.eni_gc_interval(), None);
    assert!(!s.kube.leader_election);
    assert_eq!(
        s.ipam.eni_tags(),
        BTreeMap::from([("team".into(), "net".into()), ("env".into(), "prod".into())])
    );
    assert_eq!(s.gate.bucket_limits(Bucket::DescribeInstances), (10, 2.0));
    assert_eq!(
        s.gate.bucket_limits(Bucket::DeleteNetworkInterface),
        (4, 1.0)
    );
    // Not overridden: AWS default scaled by the fraction.
    assert_eq!(
        s.gate.bucket_limits(Bucket::AttachNetworkInterface),
        (40, 4.0)
    );
}
