use std::collections::BTreeMap;

use clap::{CommandFactory, FromArgMatches};

use super::values::{BucketOverride, Tag};
use super::*;
use crate::ec2::Bucket;

/// The settings' command line without their environment variables, so a developer's shell
/// cannot change what a test parses. How the environment overrides defaults and yields to
/// flags is tested in `tests/config_env.rs` (writing the environment is unsafe).
fn command() -> clap::Command {
    Settings::command().mut_args(|a| a.env(None))
}

fn try_parse(args: &[&str]) -> Result<Settings, clap::Error> {
    let args = std::iter::once("eni-operator").chain(args.iter().copied());
    Settings::from_arg_matches_mut(&mut command().try_get_matches_from(args)?)
}

fn parse(args: &[&str]) -> Result<Settings, clap::Error> {
    Settings::load_with(
        command(),
        std::iter::once("eni-operator").chain(args.iter().copied()),
    )
}

#[test]
fn eni_gc_tags_go_on_created_enis_and_the_interval_has_a_floor() {
    let s = parse(&[
        "--cluster-name=c",
        "--eni-gc-tags=team=blue,env=prod",
        "--eni-gc-interval=1m",
    ])
    .unwrap();
    let gc = BTreeMap::from([
        ("team".to_string(), "blue".to_string()),
        ("env".to_string(), "prod".to_string()),
    ]);
    assert_eq!(s.runtime.eni_gc_tags(), gc);
    assert_eq!(s.core_config().ipam.eni_tags, gc, "created ENIs carry them");
    assert_eq!(
        s.runtime.eni_gc_interval(),
        Some(crate::reconcile::gc::MIN_INTERVAL)
    );
    let off = parse(&[
        "--cluster-name=c",
        "--eni-gc-tags=team=blue",
        "--eni-gc-interval=0",
    ])
    .unwrap();
    assert_eq!(off.runtime.eni_gc_interval(), None);
    assert!(
        off.core_config().ipam.eni_tags.is_empty(),
        "GC off: not added"
    );
}

#[test]
fn defaults() {
    let s = parse(&["--namespace", "ns", "--identity", "me"]).unwrap();
    assert_eq!(s.server.metrics_addr, "0.0.0.0:9751".parse().unwrap());
    assert_eq!(s.server.health_addr, "0.0.0.0:9752".parse().unwrap());
    assert_eq!(s.server.log_format, LogFormat::Text);
    assert!(s.kube.leader_election);
    assert_eq!(s.kube.leader_election_lease_name, "eni-operator");
    assert_eq!(
        s.kube.leader_election_lease_duration,
        Duration::from_secs(15)
    );
    assert_eq!(
        s.kube.leader_election_renew_deadline,
        Duration::from_secs(10)
    );
    assert_eq!(s.kube.leader_election_retry_period, Duration::from_secs(2));
    assert_eq!(
        (s.kube.k8s_client_qps, s.kube.k8s_client_burst),
        (50.0, 100)
    );
    assert_eq!(s.ec2.aws_region, None);
    assert_eq!(s.ec2.endpoint_url(), None);
    assert_eq!(s.ec2.max_results(), None);
    assert_eq!(s.ec2.ec2_connect_timeout, Duration::from_secs(5));
    assert_eq!(s.ec2.ec2_operation_timeout, Duration::from_secs(30));
    assert_eq!(s.gate.ec2_rate_fraction, 0.8);
    assert!(s.gate.ec2_bucket.is_empty());
    assert_eq!(s.gate.ec2_max_attempts, 5);
    assert_eq!(s.gate.limit_ipam_api_qps, None);
    assert!(!s.ipam.aws_enable_prefix_delegation);
    assert!(!s.ipam.aws_release_excess_ips);
    assert_eq!(s.ipam.excess_ip_release_delay(), Duration::from_secs(180));
    assert!(!s.ipam.aws_use_primary_address);
    assert!(s.ipam.eni_tags().is_empty());
    // No silent `default` (the GC deletes by it): unset until derived at start-up.
    assert_eq!(s.ipam.cluster_name, None);
    assert_eq!(s.ipam.vpc_id, None);
    assert!(!s.ipam.annotate_cilium_ignore);
    assert_eq!(s.runtime.parallel_alloc_workers, 50);
    assert_eq!(s.runtime.ec2_resync_interval, Duration::from_secs(60));
    assert_eq!(s.runtime.ec2_refresh_min_spacing, Duration::from_secs(15));
    assert_eq!(s.runtime.node_resync_interval, Duration::from_secs(60));
    assert_eq!(s.runtime.eni_gc_interval(), Some(Duration::from_secs(360)));
    assert_eq!(s.runtime.eni_gc_max_per_run, 25);
    assert_eq!(s.kube.namespace(), "ns");
    assert_eq!(s.kube.identity(), "me");
}

#[test]
fn downward_api_fallbacks() {
    let mut s = try_parse(&[]).unwrap();
    s.apply_fallbacks(|n| match n {
        "POD_NAMESPACE" => Some("kube-system".into()),
        "POD_NAME" => Some("eni-operator-abc".into()),
        _ => None,
    });
    assert_eq!(s.kube.namespace(), "kube-system");
    assert_eq!(s.kube.identity(), "eni-operator-abc");

    let mut s = try_parse(&[]).unwrap();
    s.apply_fallbacks(|n| (n == "HOSTNAME").then(|| "laptop".to_string()));
    assert_eq!(s.kube.namespace(), DEFAULT_NAMESPACE);
    let id = s.kube.identity();
    assert!(
        id.starts_with("laptop-") && id.len() == "laptop-".len() + 8,
        "{id}"
    );

    // An explicit flag beats the downward API.
    let mut s = try_parse(&["--namespace", "mine"]).unwrap();
    s.apply_fallbacks(|_| Some("other".into()));
    assert_eq!(s.kube.namespace(), "mine");
}

#[test]
fn bool_flags_take_optional_values() {
    let s = parse(&["--aws-enable-prefix-delegation", "--leader-election=false"]).unwrap();
    assert!(s.ipam.aws_enable_prefix_delegation);
    assert!(!s.kube.leader_election);
}

/// An optional value is given with `=` only: the word after the flag is the next argument
/// (`eni-operator --cilium-operator-absent plan` runs `plan`).
#[test]
fn an_optional_value_flag_leaves_the_next_word_alone() {
    let s = try_parse(&["--cilium-operator-absent", "plan"]).unwrap();
    assert!(s.handover.cilium_operator_absent);
    assert_eq!(s.mode.command, Some(Command::Plan));
    let s = try_parse(&["--cilium-operator-absent=false", "uninstall"]).unwrap();
    assert!(!s.handover.cilium_operator_absent);
    assert_eq!(s.mode.command, Some(Command::Uninstall));
    for arg in Settings::command().get_arguments() {
        let optional = arg.get_num_args().is_some_and(|n| n.min_values() == 0);
        if optional && !arg.is_positional() {
            assert!(arg.is_require_equals_set(), "--{} takes `=`", arg.get_id());
        }
    }
}

#[test]
fn durations() {
    let d = |s| parse_duration(s);
    // Go's grammar: fractions, compounds in any order, ns/us, a bare 0.
    for (text, want) in [
        ("15s", Duration::from_secs(15)),
        ("5m", Duration::from_secs(300)),
        ("500ms", Duration::from_millis(500)),
        ("2h", Duration::from_secs(7200)),
        ("1m30s", Duration::from_secs(90)),
        ("0", Duration::ZERO),
        ("1.5m", Duration::from_secs(90)),
        ("1h30m", Duration::from_secs(5400)),
        (".5s", Duration::from_millis(500)),
        ("2.s", Duration::from_secs(2)),
        ("1s1m", Duration::from_secs(61)),
        ("+3s", Duration::from_secs(3)),
        ("250us", Duration::from_micros(250)),
    ] {
        assert_eq!(d(text), Ok(want), "{text}");
    }
    for bad in [
        "",
        "s",
        "10x",
        "45",
        "-1s",
        "-0s",
        "m5",
        " 1s",
        "1s ",
        "1 s",
        "1d",
        ".s",
        "1µ",
        "99999999999h",
    ] {
        assert!(d(bad).is_err(), "{bad:?} should be rejected");
    }
}

#[test]
fn tags_and_bucket_overrides() {
    assert_eq!(
        "a=b".parse::<Tag>(),
        Ok(Tag {
            key: "a".into(),
            value: "b".into()
        })
    );
    assert_eq!("a=".parse::<Tag>().unwrap().value, "");
    assert!("=b".parse::<Tag>().is_err());
    assert!("ab".parse::<Tag>().is_err());

    let o: BucketOverride = "create-network-interface=20/2.5".parse().unwrap();
    assert_eq!(o.buckets, vec![Bucket::CreateNetworkInterface]);
    assert_eq!((o.burst, o.rate), (20, 2.5));
    // The shared buckets of earlier versions set each bucket they were split into.
    let o: BucketOverride = "general-mutating=10/1".parse().unwrap();
    assert_eq!(
        o.buckets,
        vec![
            Bucket::AttachNetworkInterface,
            Bucket::DetachNetworkInterface,
            Bucket::AssociateAddress,
            Bucket::DisassociateAddress,
        ]
    );
    let o: BucketOverride = "describe=10/1".parse().unwrap();
    assert_eq!(o.buckets.len(), 8);
    assert!(o.buckets.contains(&Bucket::DescribeInstances));
    for bad in [
        "nope=1/1",
        "describe",
        "describe=10",
        "describe=0/1",
        "describe=1/0",
        "describe=x/1",
    ] {
        assert!(bad.parse::<BucketOverride>().is_err(), "{bad:?}");
    }
}

#[test]
fn endpoint_gets_a_scheme() {
    let s = parse(&["--ec2-api-endpoint", "ec2.eu-west-1.amazonaws.com"]).unwrap();
    assert_eq!(
        s.ec2.endpoint_url().as_deref(),
        Some("https://ec2.eu-west-1.amazonaws.com")
    );
    let s = parse(&["--ec2-api-endpoint", "http://127.0.0.1:5000"]).unwrap();
    assert_eq!(
        s.ec2.endpoint_url().as_deref(),
        Some("http://127.0.0.1:5000")
    );
}

#[test]
fn validation_errors() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["--leader-election-renew-deadline", "15s"],
            "--leader-election-renew-deadline",
        ),
        (
            &["--leader-election-retry-period", "10s"],
            "--leader-election-retry-period",
        ),
        (&["--ec2-rate-fraction", "0"], "--ec2-rate-fraction"),
        (&["--ec2-rate-fraction", "1.5"], "--ec2-rate-fraction"),
        (&["--ec2-max-attempts", "0"], "--ec2-max-attempts"),
        (&["--limit-ipam-api-qps", "4"], "set together"),
        (
            &["--limit-ipam-api-qps", "0", "--limit-ipam-api-burst", "2"],
            "positive",
        ),
        (&["--cluster-name", ""], "--cluster-name"),
        (
            &["--static-ip-required-tag", "team="],
            "--static-ip-required-tag",
        ),
        (
            &["--parallel-alloc-workers", "0"],
            "--parallel-alloc-workers",
        ),
        (
            &["--ec2-refresh-min-spacing", "2m"],
            "--ec2-refresh-min-spacing",
        ),
        (&["--eni-gc-max-per-run", "0"], "--eni-gc-max-per-run"),
        (
            &["--aws-max-results-per-call", "-1"],
            "--aws-max-results-per-call",
        ),
        (&["--node-resync-interval", "0"], "--node-resync-interval"),
    ];
    for (args, needle) in cases {
        let e = parse(args).expect_err(&format!("{args:?} should be rejected"));
        assert!(e.to_string().contains(needle), "{args:?}: {e}");
    }
    // Every duration flag (issue 29): zero where that breaks the loop or the grace, and
    // past a year (tokio's Instant arithmetic, the Lease's int32 seconds).
    for flag in [
        "--leader-election-lease-duration",
        "--ec2-connect-timeout",
        "--ec2-resync-interval",
        "--ec2-refresh-min-spacing",
        "--node-resync-interval",
        "--node-gone-grace-period",
    ] {
        let e = parse(&[flag, "0"]).expect_err(flag);
        assert!(e.to_string().contains(flag), "{flag}: {e}");
    }
    for flag in [
        "--ec2-resync-interval",
        "--eni-gc-interval",
        "--node-gone-grace-period",
    ] {
        let e = parse(&[flag, "9000h"]).expect_err(flag);
        assert!(e.to_string().contains(flag), "{flag}: {e}");
    }
    // A zero quiet time would let any foreign pool write pass unseen: two allocators on a node.
    let e = parse(&["--handover-quiet", "0"]).unwrap_err();
    assert!(
        e.to_string().contains("--handover-quiet must be positive"),
        "{e}"
    );
    assert!(parse(&["--handover-quiet", "1s"]).is_ok());
    let e = parse(&["--node-gone-grace-period", "30s"]).unwrap_err();
    assert!(e.to_string().contains("at least"), "{e}");
    assert!(parse(&["--node-gone-grace-period", "1m"]).is_ok());
    // GC disabled: max-per-run is irrelevant.
    assert!(parse(&["--eni-gc-interval", "0", "--eni-gc-max-per-run", "0"]).is_ok());
    // Parser errors name the flag too.
    let e = parse(&["--ec2-resync-interval", "soon"]).unwrap_err();
    assert!(e.to_string().contains("--ec2-resync-interval"), "{e}");
    let e = parse(&["--ec2-bucket", "nope=1/1"]).unwrap_err();
    assert!(e.to_string().contains("unknown EC2 bucket"), "{e}");
}

/// The README's configuration reference (generated from `--help`) lists every setting.
#[test]
fn readme_documents_every_setting() {
    let readme = include_str!("../../README.md");
    for arg in Settings::command().get_arguments() {
        let (Some(flag), Some(env)) = (arg.get_long(), arg.get_env()) else {
            continue;
        };
        let row = format!("| `--{flag}` | `{}` |", env.to_string_lossy());
        assert!(
            readme.contains(&row),
            "README lacks {row}: regenerate with scripts/config-table.py"
        );
    }
}

#[test]
fn every_flag_has_an_env_var_and_help() {
    for arg in Settings::command().get_arguments() {
        let id = arg.get_id().as_str();
        // The `plan` subcommand is a positional word, not a setting.
        if matches!(id, "help" | "version") || arg.is_positional() {
            continue;
        }
        let env = arg
            .get_env()
            .unwrap_or_else(|| panic!("{id} has no env var"));
        let expected = format!("ENI_OPERATOR_{}", id.to_uppercase());
        assert_eq!(env.to_string_lossy(), expected, "env name of --{id}");
        assert!(arg.get_help().is_some(), "--{id} has no help");
    }
    Settings::command().debug_assert();
}

mod reach;
