//! Ownership of the ENIs eni-operator creates: tags, description and idempotency token.
//!
//! Every ENI we create carries two tags set at creation (`TagSpecifications`), so ownership is
//! never missing even after a crash between create and attach: the cluster, and the instance
//! the ENI was created for. The garbage collector only ever touches ENIs carrying both, and the
//! keys differ from Cilium's `io.cilium/*`, so neither operator collects the other's ENIs.

use sha2::{Digest, Sha256};

use crate::ec2::{NetworkInterface, Tags};

use super::capacity::Kind;

/// The EKS tag on every instance of a managed node group: its value is the cluster's name.
pub const EKS_TAG: &str = "aws:eks:cluster-name";
/// The cloud provider's tag: `kubernetes.io/cluster/<name>` = `owned` | `shared`.
pub const K8S_TAG_PREFIX: &str = "kubernetes.io/cluster/";

/// Whether an instance's tags name `cluster` (either tag, as `cluster_name::derive` reads them): the
/// operator touches no instance that does not (docs/rules.md §15).
pub fn names_cluster(tags: &Tags, cluster: &str) -> bool {
    tags.get(EKS_TAG).is_some_and(|v| v == cluster)
        || tags.contains_key(&format!("{K8S_TAG_PREFIX}{cluster}"))
}

/// Tag key naming the cluster that owns the ENI.
pub const CLUSTER_TAG: &str = "eni-operator.io/cluster-name";
/// Tag key naming the instance the ENI was created for.
pub const INSTANCE_TAG: &str = "eni-operator.io/instance-id";

/// The two ownership tags.
pub fn ownership_tags(cluster: &str, instance_id: &str) -> Tags {
    Tags::from([
        (CLUSTER_TAG.to_string(), cluster.to_string()),
        (INSTANCE_TAG.to_string(), instance_id.to_string()),
    ])
}

/// Whether the ENI was created by eni-operator for this cluster.
pub fn is_owned_by(eni: &NetworkInterface, cluster: &str) -> bool {
    eni.tags.get(CLUSTER_TAG).map(String::as_str) == Some(cluster)
        && eni.tags.get(INSTANCE_TAG).is_some_and(|v| !v.is_empty())
}

/// Tags of a new ENI: `--eni-tags` merged with the ownership tags; ownership wins on a key
/// conflict, so a user tag can never disown an ENI.
pub fn eni_tags(extra: &Tags, cluster: &str, instance_id: &str) -> Tags {
    let mut tags = extra.clone();
    tags.extend(ownership_tags(cluster, instance_id));
    tags
}

/// Description of a new ENI (the same as Cilium's, which agents and humans recognise).
pub fn description(instance_id: &str) -> String {
    format!("Cilium-CNI ({instance_id})")
}

/// The `ClientToken` of a `CreateNetworkInterface` call: sha256 hex (64 chars, EC2's maximum).
///
/// A token must name exactly one intended request. EC2 answers a reused token with the ENI it
/// created first, for hours, even after that ENI was deleted (and answers a reused token with
/// other parameters with `IdempotentParameterMismatch`). So:
/// * a retry of the SAME intent repeats the token: after a timeout with a lost answer, a crash
///   or a leader change, the new attempt computes the same cluster, instance, device index,
///   subnet, kind, attached set and `generation`, hence no second ENI;
/// * a token is never reused for another intent: once the ENI is attached the attached set
///   changes, and the runtime moves the node's `generation` on whenever a token is spent (the
///   ENI was attached, deleted after a refused attach, or EC2 answered the token with an ENI
///   that no longer exists or with `IdempotentParameterMismatch`). The generation lives in the
///   node's memory and restarts at 0 with a new process, so each process adds its own random
///   `nonce`: a new process never replays a token an earlier one spent (after k refused
///   attaches it would replay k of them, each a not-ready wait and a failed pass). What a
///   crash leaves behind is not lost with the old token: an unattached ENI of ours is adopted
///   as a leftover of its instance and attached before anything is created.
///
/// The amount and the security groups are left out on purpose: an ENI left unattached by a
/// crash is attached by the next pass as it is (the runtime attaches our `available` ENIs of
/// the instance before creating one), and a changed request is answered with a mismatch, which
/// moves the generation on.
///
/// ```
/// use eni_operator::ipam::capacity::Kind;
/// use eni_operator::ipam::ownership::client_token;
/// let a = client_token("prod", "i-1", 1, "subnet-a", Kind::Prefixes, &["eni-0".into()], 0, 7);
/// let b = client_token("prod", "i-1", 1, "subnet-a", Kind::Prefixes, &["eni-0".into()], 0, 7);
/// assert_eq!(a, b);
/// assert_eq!(a.len(), 64);
/// let later = client_token("prod", "i-1", 2, "subnet-a", Kind::Prefixes,
///     &["eni-0".into(), "eni-1".into()], 0, 7);
/// assert_ne!(a, later);
/// let after_a_spent_token = client_token("prod", "i-1", 1, "subnet-a", Kind::Prefixes,
///     &["eni-0".into()], 1, 7);
/// assert_ne!(a, after_a_spent_token);
/// let another_process = client_token("prod", "i-1", 1, "subnet-a", Kind::Prefixes,
///     &["eni-0".into()], 0, 8);
/// assert_ne!(a, another_process);
/// ```
#[allow(clippy::too_many_arguments)]
pub fn client_token(
    cluster: &str,
    instance_id: &str,
    device_index: u32,
    subnet_id: &str,
    kind: Kind,
    attached_eni_ids: &[String],
    generation: u32,
    nonce: u64,
) -> String {
    let mut ids: Vec<&str> = attached_eni_ids.iter().map(String::as_str).collect();
    ids.sort_unstable();
    ids.dedup();
    let kind = match kind {
        Kind::Ips => "ips",
        Kind::Prefixes => "prefixes",
    };
    let mut hasher = Sha256::new();
    // Length-prefixed fields: no two different inputs hash the same concatenation.
    for field in [
        cluster,
        instance_id,
        &device_index.to_string(),
        subnet_id,
        kind,
        &generation.to_string(),
        &nonce.to_string(),
    ]
    .into_iter()
    .chain(ids)
    {
        hasher.update((field.len() as u64).to_be_bytes());
        hasher.update(field.as_bytes());
    }
    hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ipam::fixtures::*;

    #[test]
    fn ownership_wins_over_user_tags() {
        let user = tags(&[(CLUSTER_TAG, "evil"), ("team", "net")]);
        let t = eni_tags(&user, "prod", "i-1");
        assert_eq!(t.get(CLUSTER_TAG).unwrap(), "prod");
        assert_eq!(t.get(INSTANCE_TAG).unwrap(), "i-1");
        assert_eq!(t.get("team").unwrap(), "net");
    }

    #[test]
    fn owned_only_with_both_tags_of_this_cluster() {
        let mut e = eni("eni-1", 1, "subnet-a");
        assert!(!is_owned_by(&e, "prod"));
        e.tags = ownership_tags("prod", "i-1");
        assert!(is_owned_by(&e, "prod"));
        assert!(!is_owned_by(&e, "staging"));
        e.tags.remove(INSTANCE_TAG);
        assert!(!is_owned_by(&e, "prod"));
    }

    #[test]
    fn description_format() {
        assert_eq!(description("i-0abc"), "Cilium-CNI (i-0abc)");
    }

    #[test]
    fn token_is_stable_and_sensitive() {
        let ids = vec!["eni-b".to_string(), "eni-a".to_string()];
        let base = client_token("c", "i-1", 1, "s", Kind::Ips, &ids, 0, 0);
        let reordered = vec!["eni-a".to_string(), "eni-b".to_string()];
        assert_eq!(
            base,
            client_token("c", "i-1", 1, "s", Kind::Ips, &reordered, 0, 0)
        );
        assert!(base.len() <= 64 && base.chars().all(|c| c.is_ascii_hexdigit()));
        for other in [
            client_token("d", "i-1", 1, "s", Kind::Ips, &ids, 0, 0),
            client_token("c", "i-2", 1, "s", Kind::Ips, &ids, 0, 0),
            client_token("c", "i-1", 2, "s", Kind::Ips, &ids, 0, 0),
            client_token("c", "i-1", 1, "t", Kind::Ips, &ids, 0, 0),
            client_token("c", "i-1", 1, "s", Kind::Prefixes, &ids, 0, 0),
            client_token("c", "i-1", 1, "s", Kind::Ips, &ids[..1], 0, 0),
            client_token("c", "i-1", 1, "s", Kind::Ips, &ids, 1, 0),
            client_token("c", "i-1", 1, "s", Kind::Ips, &ids, 0, 1),
        ] {
            assert_ne!(base, other);
        }
    }
}
