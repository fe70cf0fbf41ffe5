//! Compares two `/metrics` scrapes in the Prometheus text format family by family: Cilium's
//! real operator's and ours with `--metrics-compat=cilium` (issue 32 item 5). Types, label
//! names and label values, never counts; the gauges that must agree are read with [`value`].

use std::collections::{BTreeMap, BTreeSet};

use eni_operator::metrics_compat::{Sample, parse_sample};

/// One scrape: `# TYPE` per family and the samples.
pub struct Scrape {
    pub types: BTreeMap<String, String>,
    pub samples: Vec<Sample>,
}

pub fn parse(text: &str) -> Scrape {
    let types = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_once(' '))
        .map(|(n, t)| (n.to_string(), t.trim().to_string()))
        .collect();
    let samples = text.lines().filter_map(parse_sample).collect();
    Scrape { types, samples }
}

/// What a family looks like: its type, label names, and values per label.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FamilyView {
    pub kind: String,
    pub labels: BTreeSet<String>,
    pub values: BTreeMap<String, BTreeSet<String>>,
}

/// The family a sample belongs to: its own name, or without a histogram's or summary's suffix.
fn family_of<'a>(types: &BTreeMap<String, String>, name: &'a str) -> &'a str {
    for suffix in ["_bucket", "_sum", "_count", "_total"] {
        if let Some(base) = name.strip_suffix(suffix)
            && types.contains_key(base)
        {
            return base;
        }
    }
    name
}

/// The families whose names start with one of `prefixes`, declared ones without samples too.
pub fn families(s: &Scrape, prefixes: &[&str]) -> BTreeMap<String, FamilyView> {
    let wanted = |n: &str| prefixes.iter().any(|p| n.starts_with(p));
    let mut out: BTreeMap<String, FamilyView> = s
        .types
        .iter()
        .filter(|(n, _)| wanted(n))
        .map(|(n, t)| {
            let view = FamilyView {
                kind: t.clone(),
                ..Default::default()
            };
            (n.clone(), view)
        })
        .collect();
    for x in &s.samples {
        let family = family_of(&s.types, &x.name);
        if !wanted(family) {
            continue;
        }
        let f = out.entry(family.to_string()).or_default();
        for (k, v) in x
            .labels
            .iter()
            .filter(|(k, _)| k != "le" && k != "quantile")
        {
            f.labels.insert(k.clone());
            f.values.entry(k.clone()).or_default().insert(v.clone());
        }
    }
    out
}

/// Where the two disagree.
#[derive(Debug, Default)]
pub struct Differences {
    pub only_cilium: Vec<String>,
    pub only_ours: Vec<String>,
    /// family: Cilium's type vs ours.
    pub kinds: Vec<String>,
    /// family: label names seen on one side only (both sides with samples).
    pub label_names: Vec<String>,
    /// family/label: values seen on one side only (both sides with samples).
    pub label_values: Vec<String>,
}

pub fn compare(
    cilium: &BTreeMap<String, FamilyView>,
    ours: &BTreeMap<String, FamilyView>,
) -> Differences {
    let mut d = Differences::default();
    for (name, c) in cilium {
        let Some(o) = ours.get(name) else {
            d.only_cilium.push(name.clone());
            continue;
        };
        if c.kind != o.kind {
            d.kinds
                .push(format!("{name}: {} vs ours {}", c.kind, o.kind));
        }
        // Label names and values are only known from samples: compare when both have some.
        if c.values.is_empty() || o.values.is_empty() {
            continue;
        }
        if c.labels != o.labels {
            d.label_names
                .push(format!("{name}: {:?} vs ours {:?}", c.labels, o.labels));
        }
        for (label, cv) in &c.values {
            let Some(ov) = o.values.get(label) else {
                continue;
            };
            let theirs: Vec<&String> = cv.difference(ov).collect();
            let mine: Vec<&String> = ov.difference(cv).collect();
            if !theirs.is_empty() || !mine.is_empty() {
                d.label_values.push(format!(
                    "{name}{{{label}}}: only Cilium's {theirs:?}, only ours {mine:?}"
                ));
            }
        }
    }
    d.only_ours = ours
        .keys()
        .filter(|n| !cilium.contains_key(*n))
        .cloned()
        .collect();
    d
}

/// The value of the sample `name` with exactly these labels (in any order).
pub fn value(s: &Scrape, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    s.samples
        .iter()
        .find(|x| {
            x.name == name
                && x.labels.len() == labels.len()
                && labels
                    .iter()
                    .all(|(k, v)| x.labels.iter().any(|(a, b)| a == k && b == v))
        })
        .and_then(|x| x.value.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    const CILIUM: &str = r#"# HELP cilium_operator_ipam_nodes Number of nodes by category
# TYPE cilium_operator_ipam_nodes gauge
cilium_operator_ipam_nodes{category="total"} 3
cilium_operator_ipam_nodes{category="in-deficit"} 0
# TYPE cilium_operator_ec2_api_duration_seconds histogram
cilium_operator_ec2_api_duration_seconds_bucket{operation="DescribeSubnets",response_code="OK",le="0.005"} 1
cilium_operator_ec2_api_duration_seconds_sum{operation="DescribeSubnets",response_code="OK"} 0.001
cilium_operator_ec2_api_duration_seconds_count{operation="DescribeSubnets",response_code="OK"} 1
# TYPE cilium_operator_ipam_resync_total counter
cilium_operator_ipam_resync_total 2
# TYPE cilium_operator_ipam_interface_creation_ops counter
go_goroutines 12
"#;

    #[test]
    fn families_types_labels_and_values_compare() {
        let c = families(
            &parse(CILIUM),
            &["cilium_operator_ipam_", "cilium_operator_ec2_"],
        );
        assert_eq!(c.len(), 4, "{c:?}");
        assert_eq!(
            c["cilium_operator_ec2_api_duration_seconds"].kind,
            "histogram"
        );
        assert_eq!(
            c["cilium_operator_ec2_api_duration_seconds"].labels,
            BTreeSet::from(["operation".to_string(), "response_code".to_string()]),
            "le is not a label name of the family"
        );
        let ours_text = CILIUM
            .replace("response_code=\"OK\"", "response_code=\"200\"")
            .replace(
                "TYPE cilium_operator_ipam_resync_total counter",
                "TYPE cilium_operator_ipam_resync_total gauge",
            )
            .replace(
                "# TYPE cilium_operator_ipam_interface_creation_ops counter\n",
                "",
            );
        let o = families(&parse(&ours_text), &["cilium_operator_"]);
        let d = compare(&c, &o);
        assert_eq!(
            d.only_cilium,
            ["cilium_operator_ipam_interface_creation_ops"]
        );
        assert!(d.only_ours.is_empty());
        assert_eq!(d.kinds.len(), 1, "{:?}", d.kinds);
        assert!(d.label_names.is_empty());
        assert_eq!(d.label_values.len(), 1, "{:?}", d.label_values);
        assert!(d.label_values[0].contains("response_code"));
        let s = parse(CILIUM);
        assert_eq!(
            value(&s, "cilium_operator_ipam_nodes", &[("category", "total")]),
            Some(3.0)
        );
        assert_eq!(value(&s, "cilium_operator_ipam_nodes", &[]), None);
    }
}
