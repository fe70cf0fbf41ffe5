//! docs/flags.md lists every flag of Cilium operator's ENI IPAM against ours (issue 22,
//! part 2): no Cilium flag is missing from the table, no row names a Cilium flag that is not in
//! the list below, and every flag the table says we have exists on our command line.

use std::collections::BTreeSet;

use clap::CommandFactory;
use eni_operator::config::Settings;

/// Cilium operator's ENI IPAM flags, from github.com/cilium/cilium:
/// `operator/option/config.go` (commit 545b594ea4b57ea517d1b95f8cf1ca69614b2d83: the IPAM,
/// AWS, leader-election and metrics options), `operator/pkg/ipam/aws.go` (commit
/// 3e14df1206b97352397e90227872d979a8ad8e17: `AWSConfig.Flags`, adds
/// `--aws-max-results-per-call`), `pkg/ipam/option/option.go` (`--ipam`), and the pre-1.9
/// `--aws-client-qps` / `--aws-client-burst`.
const CILIUM_FLAGS: &[&str] = &[
    "ipam",
    "aws-release-excess-ips",
    "excess-ip-release-delay",
    "aws-enable-prefix-delegation",
    "aws-use-primary-address",
    "aws-instance-limit-mapping",
    "update-ec2-adapter-limit-via-api",
    "eni-tags",
    "eni-gc-tags",
    "eni-gc-interval",
    "ec2-api-endpoint",
    "aws-max-results-per-call",
    "subnet-ids-filter",
    "subnet-tags-filter",
    "instance-tags-filter",
    "parallel-alloc-workers",
    "limit-ipam-api-qps",
    "limit-ipam-api-burst",
    "cluster-name",
    "nodes-gc-interval",
    "leader-election-lease-duration",
    "leader-election-renew-deadline",
    "leader-election-retry-period",
    "enable-metrics",
    "operator-prometheus-serve-addr",
    "operator-api-serve-addr",
    "k8s-client-qps",
    "k8s-client-burst",
    "aws-client-qps",
    "aws-client-burst",
];

/// (Cilium flag, our flag or None, same semantics) of each row of the table.
fn rows() -> Vec<(String, Option<String>, String)> {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/flags.md"))
        .expect("docs/flags.md exists");
    let flag = |cell: &str| {
        let cell = cell.trim();
        cell.strip_prefix("`--")
            .and_then(|c| c.strip_suffix('`'))
            .map(str::to_string)
    };
    text.lines()
        .filter(|l| l.starts_with("| `--"))
        .map(|l| {
            let cells: Vec<&str> = l.split('|').collect();
            let cilium = flag(cells[1]).unwrap_or_else(|| panic!("bad row: {l}"));
            let ours = flag(cells[2]);
            assert!(
                ours.is_some() || cells[2].trim() == "—",
                "our column is a flag or —: {l}"
            );
            (cilium, ours, cells[3].trim().to_string())
        })
        .collect()
}

#[test]
fn every_cilium_eni_flag_is_listed_once() {
    let rows = rows();
    let listed: Vec<&str> = rows.iter().map(|(c, _, _)| c.as_str()).collect();
    let unique: BTreeSet<&str> = listed.iter().copied().collect();
    assert_eq!(unique.len(), listed.len(), "a flag listed twice");
    for f in CILIUM_FLAGS {
        assert!(unique.contains(f), "docs/flags.md lacks Cilium's --{f}");
    }
    for f in &unique {
        assert!(
            CILIUM_FLAGS.contains(f),
            "--{f} is not one of Cilium's flags (add its source to CILIUM_FLAGS)"
        );
    }
    for (c, _, same) in &rows {
        assert!(
            matches!(same.as_str(), "yes" | "no" | "n/a"),
            "--{c}: same semantics is yes, no or n/a, not {same:?}"
        );
    }
}

#[test]
fn every_flag_we_claim_exists() {
    let ours: BTreeSet<String> = Settings::command()
        .get_arguments()
        .filter_map(|a| a.get_long().map(str::to_string))
        .collect();
    for (cilium, flag, same) in rows() {
        if let Some(flag) = flag {
            assert!(
                ours.contains(&flag),
                "docs/flags.md says --{cilium} maps to --{flag}, which we do not have"
            );
        } else {
            assert_ne!(
                same, "yes",
                "--{cilium}: no flag of ours cannot mean the same"
            );
            // A row left at "—" after the flag was added (it happened to --eni-gc-tags).
            assert!(
                !ours.contains(&cilium),
                "docs/flags.md says we lack --{cilium}, but we have it"
            );
        }
    }
    // The flags issue 22 asked for by name.
    for f in [
        "aws-instance-limit-mapping",
        "update-ec2-adapter-limit-via-api",
        "aws-use-primary-address",
    ] {
        assert!(ours.contains(f), "--{f}");
    }
}
