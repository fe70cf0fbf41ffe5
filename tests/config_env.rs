//! The environment as a source of settings: each setting's variable overrides its default and a
//! flag overrides the variable. Here and not in the library's unit tests because writing the
//! process environment is `unsafe` (the library forbids unsafe code); this file's one test is
//! the only code of its process that reads or writes the environment.

use std::collections::BTreeMap;

use clap::CommandFactory;
use eni_operator::config::Settings;
use eni_operator::ec2::Bucket;

/// Every environment variable a setting reads.
fn setting_env_names() -> Vec<String> {
    Settings::command()
        .get_arguments()
        .filter_map(|a| a.get_env())
        .map(|e| e.to_string_lossy().into_owned())
        .collect()
}

#[test]
fn env_overrides_default_and_flag_overrides_env() {
    // SAFETY: the only test in this process; nothing else reads or writes the environment.
    unsafe {
        // A developer's shell may set some.
        for name in setting_env_names() {
            std::env::remove_var(name);
        }
        std::env::set_var("ENI_OPERATOR_CLUSTER_NAME", "prod");
        std::env::set_var("ENI_OPERATOR_AWS_RELEASE_EXCESS_IPS", "true");
        std::env::set_var("ENI_OPERATOR_ENI_GC_INTERVAL", "0");
        std::env::set_var("ENI_OPERATOR_ENI_TAGS", "team=net,env=prod");
        std::env::set_var("ENI_OPERATOR_LEADER_ELECTION", "false");
        std::env::set_var(
            "ENI_OPERATOR_EC2_BUCKET",
            "describe=10/2,delete-network-interface=4/1",
        );
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
    assert_eq!(s.gate.bucket_limits(Bucket::Describe), (10, 2.0));
    assert_eq!(
        s.gate.bucket_limits(Bucket::DeleteNetworkInterface),
        (4, 1.0)
    );
    // Not overridden: AWS default scaled by the fraction.
    assert_eq!(s.gate.bucket_limits(Bucket::GeneralMutating), (40, 4.0));
}
