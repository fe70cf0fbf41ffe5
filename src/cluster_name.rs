//! `--cluster-name` when it is not given: derived from the nodes' instance tags, or refused.
//!
//! The name scopes the ENI garbage collector (it deletes unattached ENIs carrying our ownership
//! tag with this name), so a silent default (`default`) let two clusters of one account collect
//! each other's ENIs. EKS tags every instance it launches with `aws:eks:cluster-name`
//! (managed node groups, Fargate excluded); Karpenter, eksctl's self-managed groups and the
//! cloud provider's convention tag `kubernetes.io/cluster/<name>` (value `owned` or `shared`).
//!
//! [`derive`] is the pure decision over the tags seen; [`resolve`] does the I/O (list the
//! Nodes, describe their instances through the caller's gated, possibly read-only client).

use std::collections::BTreeMap;

use crate::ec2::{Ec2, Ec2Error, InstanceFilter, Tags, collect_pages};
use crate::ipam::ownership::{EKS_TAG, K8S_TAG_PREFIX};

/// Instance IDs per DescribeInstances call (AWS accepts up to 1,000 IDs; smaller pages keep
/// one answer small).
const IDS_PER_CALL: usize = 200;

/// Why no name could be derived: each says what was seen, and [`Refusal::line`] names the flag.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error(
        "no node with an EC2 instance (aws:///<zone>/<instance-id> provider ID) to read it from"
    )]
    NoInstances,
    #[error(
        "no instance names a cluster: instance {0} carries neither {EKS_TAG} nor a {K8S_TAG_PREFIX}<name> tag"
    )]
    Untagged(String),
    #[error("instance {instance} names several clusters ({names})")]
    Ambiguous { instance: String, names: String },
    #[error("the nodes' instances disagree: {0}")]
    Disagree(String),
}

impl Refusal {
    /// The one-line start-up error.
    pub fn line(&self) -> String {
        format!(
            "--cluster-name is not set and cannot be derived: {self}; set --cluster-name (ENI_OPERATOR_CLUSTER_NAME)"
        )
    }
}

/// The cluster one instance names: `aws:eks:cluster-name` wins; else the one
/// `kubernetes.io/cluster/<name>` tag. `Ok(None)` when it names none.
fn named_by(instance: &str, tags: &Tags) -> Result<Option<String>, Refusal> {
    if let Some(name) = tags.get(EKS_TAG).filter(|v| !v.is_empty()) {
        return Ok(Some(name.clone()));
    }
    let names: Vec<&str> = tags
        .keys()
        .filter_map(|k| k.strip_prefix(K8S_TAG_PREFIX))
        .filter(|n| !n.is_empty())
        .collect();
    match names.as_slice() {
        [] => Ok(None),
        [one] => Ok(Some(one.to_string())),
        many => Err(Refusal::Ambiguous {
            instance: instance.into(),
            names: many.join(", "),
        }),
    }
}

/// The name the tagged instances agree on, and the instances that name no cluster (skipped:
/// one untagged instance, a self-managed node, must not keep every leader from starting).
/// `instances`: (instance ID, its tags) of the nodes' instances; those outside `scope`
/// (`--instance-tags-filter`: another operator's nodes) are not asked. Refused only when no
/// instance names a cluster, one names several, or two name different ones.
pub fn derive<'a>(
    instances: impl IntoIterator<Item = (&'a str, &'a Tags)>,
    scope: &Tags,
) -> Result<(String, Vec<String>), Refusal> {
    // name -> the first instance naming it (for the error).
    let mut seen: BTreeMap<String, &str> = BTreeMap::new();
    let mut untagged = Vec::new();
    for (id, tags) in instances {
        if !scope.iter().all(|(k, v)| tags.get(k) == Some(v)) {
            continue;
        }
        match named_by(id, tags)? {
            Some(name) => {
                seen.entry(name).or_insert(id);
            }
            None => untagged.push(id.to_string()),
        }
    }
    if seen.len() > 1 {
        let list: Vec<String> = seen.iter().map(|(n, i)| format!("{n} ({i})")).collect();
        return Err(Refusal::Disagree(list.join(", ")));
    }
    match seen.into_keys().next() {
        Some(name) => Ok((name, untagged)),
        None => Err(untagged
            .into_iter()
            .next()
            .map_or(Refusal::NoInstances, Refusal::Untagged)),
    }
}

/// Where the name comes from, for the start-up log line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    Flag,
    Derived { instances: usize },
}

/// The flag's value, else [`derive`] over the instances of every Node with an AWS provider ID.
/// `Err` is the one-line start-up error.
pub async fn resolve<E: Ec2>(
    flag: Option<&str>,
    client: &kube::Client,
    ec2: &E,
    scope: &Tags,
) -> Result<(String, Source), String> {
    if let Some(name) = flag {
        return Ok((name.to_string(), Source::Flag));
    }
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(client.clone());
    let list = nodes.list(&Default::default()).await.map_err(|e| {
        format!(
            "--cluster-name is not set and the Nodes cannot be listed to derive it: {e}; set --cluster-name"
        )
    })?;
    let ids: Vec<String> = list
        .items
        .iter()
        .filter_map(|n| n.spec.as_ref()?.provider_id.as_deref())
        .filter_map(crate::k8s::source::instance_from_provider_id)
        .collect();
    let instances = describe(ec2, &ids).await.map_err(|e| {
        format!("--cluster-name is not set and the nodes' instances cannot be described to derive it: {e}; set --cluster-name")
    })?;
    let (name, untagged) = derive(
        instances.iter().map(|(id, tags)| (id.as_str(), tags)),
        scope,
    )
    .map_err(|r| r.line())?;
    if !untagged.is_empty() {
        tracing::warn!(
            cluster_name = %name,
            instances = %untagged.join(", "),
            "instances that name no cluster ({EKS_TAG}, {K8S_TAG_PREFIX}<name>) were skipped \
             deriving --cluster-name; the operator touches none of them (docs/rules.md §15)"
        );
    }
    Ok((
        name,
        Source::Derived {
            instances: instances.len(),
        },
    ))
}

/// [`resolve`] into the settings, with one log line saying where the name comes from.
pub async fn settle<E: Ec2>(
    settings: &mut crate::config::Settings,
    client: &kube::Client,
    ec2: &E,
) -> Result<(), String> {
    let (name, source) = resolve(
        settings.ipam.cluster_name.as_deref(),
        client,
        ec2,
        &settings.ipam.instance_tags(),
    )
    .await?;
    if let Source::Derived { instances } = source {
        tracing::info!(
            cluster_name = %name,
            instances,
            "--cluster-name derived from the nodes' instance tags"
        );
    }
    settings.ipam.cluster_name = Some(name);
    Ok(())
}

/// (ID, tags) of the given instances, in batches. A batch naming an instance EC2 no longer
/// knows fails whole (`InvalidInstanceID.NotFound`): that batch is asked again one by one,
/// skipping the gone ones (their Node may linger after the instance).
async fn describe<E: Ec2>(ec2: &E, ids: &[String]) -> Result<Vec<(String, Tags)>, Ec2Error> {
    let mut out = Vec::new();
    for batch in ids.chunks(IDS_PER_CALL) {
        match describe_ids(ec2, batch.to_vec()).await {
            Ok(found) => out.extend(found),
            Err(e) if e.is_not_found() => {
                for id in batch {
                    match describe_ids(ec2, vec![id.clone()]).await {
                        Ok(found) => out.extend(found),
                        Err(e) if e.is_not_found() => {}
                        Err(e) => return Err(e),
                    }
                }
            }
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

async fn describe_ids<E: Ec2>(ec2: &E, ids: Vec<String>) -> Result<Vec<(String, Tags)>, Ec2Error> {
    let filter = InstanceFilter {
        ids,
        ..InstanceFilter::default()
    };
    let found = collect_pages(|token| ec2.describe_instances(&filter, token)).await?;
    Ok(found.into_iter().map(|i| (i.id, i.tags)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tags(pairs: &[(&str, &str)]) -> Tags {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn run(instances: &[(&str, Tags)], scope: &Tags) -> Result<String, Refusal> {
        derive(instances.iter().map(|(i, t)| (*i, t)), scope).map(|(name, _)| name)
    }

    #[test]
    fn the_eks_tag_names_the_cluster() {
        let a = tags(&[(EKS_TAG, "prod"), ("Name", "x")]);
        let b = tags(&[(EKS_TAG, "prod")]);
        assert_eq!(
            run(&[("i-1", a), ("i-2", b)], &Tags::new()).as_deref(),
            Ok("prod")
        );
    }

    #[test]
    fn the_cloud_provider_tag_names_it_when_the_eks_tag_is_absent() {
        let karpenter = tags(&[("kubernetes.io/cluster/prod", "owned")]);
        let eks = tags(&[(EKS_TAG, "prod"), ("kubernetes.io/cluster/prod", "owned")]);
        assert_eq!(
            run(&[("i-1", karpenter), ("i-2", eks)], &Tags::new()).as_deref(),
            Ok("prod")
        );
    }

    #[test]
    fn the_eks_tag_wins_over_the_cloud_provider_tag() {
        let t = tags(&[(EKS_TAG, "prod"), ("kubernetes.io/cluster/old", "shared")]);
        assert_eq!(run(&[("i-1", t)], &Tags::new()).as_deref(), Ok("prod"));
    }

    #[test]
    fn instances_that_disagree_are_refused_naming_both() {
        let a = tags(&[(EKS_TAG, "prod")]);
        let b = tags(&[(EKS_TAG, "staging")]);
        let err = run(&[("i-1", a), ("i-2", b)], &Tags::new()).unwrap_err();
        assert_eq!(err, Refusal::Disagree("prod (i-1), staging (i-2)".into()));
        assert!(err.line().contains("set --cluster-name"), "{}", err.line());
    }

    /// One untagged instance (a self-managed node) among tagged ones is skipped and reported,
    /// not a reason to refuse the start (before: every new leader refused to start).
    #[test]
    fn an_untagged_instance_is_skipped_and_reported() {
        let a = tags(&[(EKS_TAG, "prod")]);
        let b = tags(&[("Name", "bare")]);
        let list = [("i-1", a), ("i-2", b.clone())];
        let got = derive(list.iter().map(|(i, t)| (*i, t)), &Tags::new());
        assert_eq!(got, Ok(("prod".to_string(), vec!["i-2".to_string()])));
        // Only untagged ones: nothing to derive from.
        assert_eq!(
            run(&[("i-2", b)], &Tags::new()),
            Err(Refusal::Untagged("i-2".into()))
        );
    }

    #[test]
    fn several_cloud_provider_tags_on_one_instance_are_ambiguous() {
        let t = tags(&[
            ("kubernetes.io/cluster/a", "shared"),
            ("kubernetes.io/cluster/b", "shared"),
        ]);
        assert_eq!(
            run(&[("i-1", t)], &Tags::new()),
            Err(Refusal::Ambiguous {
                instance: "i-1".into(),
                names: "a, b".into()
            })
        );
    }

    #[test]
    fn no_instance_at_all_is_refused_with_a_line_naming_the_flag() {
        let err = run(&[], &Tags::new()).unwrap_err();
        assert_eq!(err, Refusal::NoInstances);
        let line = err.line();
        assert!(line.starts_with("--cluster-name is not set"), "{line}");
        assert!(!line.contains('\n'));
    }

    #[test]
    fn instances_outside_the_instance_tags_filter_are_not_asked() {
        let ours = tags(&[(EKS_TAG, "prod"), ("pool", "eni")]);
        let theirs = tags(&[(EKS_TAG, "other"), ("pool", "vpc-cni")]);
        let untagged_theirs = tags(&[("pool", "vpc-cni")]);
        let scope = tags(&[("pool", "eni")]);
        assert_eq!(
            run(
                &[("i-1", ours), ("i-2", theirs), ("i-3", untagged_theirs)],
                &scope
            )
            .as_deref(),
            Ok("prod")
        );
        assert_eq!(
            run(&[("i-2", tags(&[("pool", "x")]))], &scope),
            Err(Refusal::NoInstances)
        );
    }

    #[test]
    fn empty_tag_values_name_nothing() {
        let t = tags(&[(EKS_TAG, ""), ("kubernetes.io/cluster/", "owned")]);
        assert_eq!(
            run(&[("i-1", t)], &Tags::new()),
            Err(Refusal::Untagged("i-1".into()))
        );
    }
}
