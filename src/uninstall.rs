//! `eni-operator uninstall`: what removing the operator's objects (`helm uninstall`, `kubectl
//! delete -f manifests/`) leaves behind. Every CiliumNode the operator served carries its
//! finalizer ([`FINALIZER`]); with no operator left to remove it, deleting such a node hangs.
//! This removes it from every CiliumNode and deletes the leader Lease, once no operator holds the
//! Lease (one still running would put the finalizer back on its next pass).
//!
//! ENIs and addresses stay as they are: the agents keep using them, and a later install adopts
//! them by their tags.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::core::PartialObjectMeta;

use crate::crd::{CILIUM_IGNORE_ANNOTATION, CiliumNode, FINALIZER};

/// How often the Lease is read while waiting for it to lapse.
const POLL: Duration = Duration::from_secs(1);

/// What `uninstall` did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// CiliumNodes whose finalizer was removed.
    pub released: Vec<String>,
    /// The leader Lease existed and was deleted.
    pub lease_deleted: bool,
    /// CiliumNodes still annotated `ipam.cilium.io/ignore` (Cilium's operator skips them).
    pub cilium_ignored: Vec<String>,
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "removed the finalizer {FINALIZER} from {} CiliumNodes",
            self.released.len()
        )?;
        if self.lease_deleted {
            writeln!(f, "deleted the leader Lease")?;
        }
        if !self.cilium_ignored.is_empty() {
            writeln!(
                f,
                "{} CiliumNodes keep {CILIUM_IGNORE_ANNOTATION}=true, so Cilium's operator does \
                 not serve them; to hand them back: kubectl annotate ciliumnode --all \
                 {CILIUM_IGNORE_ANNOTATION}- (docs/migrating-from-cilium.md, rollback)",
                self.cilium_ignored.len()
            )?;
        }
        Ok(())
    }
}

/// Waits up to `wait` for the Lease `namespace/lease_name` to lapse (nobody renews it), then
/// removes [`FINALIZER`] from every CiliumNode and deletes the Lease. Fails, changing nothing,
/// when an operator still holds the Lease after `wait`.
pub async fn run(
    client: kube::Client,
    namespace: &str,
    lease_name: &str,
    wait: Duration,
) -> anyhow::Result<Report> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), namespace);
    let lease = wait_for_lapse(&leases, lease_name, wait).await?;

    let resource = ApiResource::erase::<CiliumNode>(&());
    let nodes: Api<DynamicObject> = Api::all_with(client, &resource);
    let mut report = Report::default();
    for node in nodes.list_metadata(&ListParams::default()).await?.items {
        let name = node.metadata.name.clone().unwrap_or_default();
        if remove_finalizer(&nodes, &name, node).await? {
            report.released.push(name.clone());
        }
    }
    for node in nodes.list_metadata(&ListParams::default()).await?.items {
        let ignored = node
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(CILIUM_IGNORE_ANNOTATION))
            .is_some_and(|v| v == "true");
        if ignored {
            report
                .cilium_ignored
                .push(node.metadata.name.unwrap_or_default());
        }
    }
    if lease.is_some() {
        match leases.delete(lease_name, &DeleteParams::default()).await {
            Ok(_) => report.lease_deleted = true,
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(report)
}

/// The Lease once nobody holds it (`None`: there is none); an error if it is still renewed
/// after `wait`.
async fn wait_for_lapse(
    leases: &Api<Lease>,
    name: &str,
    wait: Duration,
) -> anyhow::Result<Option<Lease>> {
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let Some(lease) = leases.get_opt(name).await? else {
            return Ok(None);
        };
        let Some(holder) = held_by(&lease, Timestamp::now()) else {
            return Ok(Some(lease));
        };
        if tokio::time::Instant::now() >= deadline {
            anyhow::bail!(
                "eni-operator is still running: {holder} holds the Lease {}/{name}. Stop it \
                 first (helm uninstall, or scale its Deployment to 0), then run this again",
                leases.namespace().unwrap_or_default()
            );
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Who holds the Lease at `now`: its holder, unless it was not renewed within its duration.
pub fn held_by(lease: &Lease, now: Timestamp) -> Option<String> {
    let spec = lease.spec.as_ref()?;
    let holder = spec.holder_identity.clone().filter(|h| !h.is_empty())?;
    let renewed = spec.renew_time.as_ref().or(spec.acquire_time.as_ref())?.0;
    let duration = i64::from(spec.lease_duration_seconds.unwrap_or(15).max(1));
    (now.as_second() < renewed.as_second() + duration).then_some(holder)
}

/// Removes [`FINALIZER`] from one CiliumNode: a JSON patch that tests the entry at its index
/// first, so a concurrent change of the list fails the patch instead of removing another
/// finalizer; then it is read again and retried. `false`: the node had none (or is gone).
async fn remove_finalizer(
    nodes: &Api<DynamicObject>,
    name: &str,
    mut node: PartialObjectMeta<DynamicObject>,
) -> anyhow::Result<bool> {
    for _ in 0..5 {
        let Some(index) = node
            .metadata
            .finalizers
            .iter()
            .flatten()
            .position(|f| f == FINALIZER)
        else {
            return Ok(false);
        };
        let patch: json_patch::Patch = serde_json::from_value(serde_json::json!([
            {"op": "test", "path": format!("/metadata/finalizers/{index}"), "value": FINALIZER},
            {"op": "remove", "path": format!("/metadata/finalizers/{index}")},
        ]))?;
        match nodes
            .patch(name, &PatchParams::default(), &Patch::<()>::Json(patch))
            .await
        {
            Ok(_) => return Ok(true),
            Err(kube::Error::Api(e)) if e.code == 404 => return Ok(false),
            // The test failed: the list changed under us; read it again.
            Err(kube::Error::Api(e)) if e.code == 422 || e.code == 409 => {
                match nodes.get_metadata_opt(name).await? {
                    Some(fresh) => node = fresh,
                    None => return Ok(false),
                }
            }
            Err(e) => return Err(e.into()),
        }
    }
    anyhow::bail!("CiliumNode {name}: its finalizers kept changing; run this again")
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

    fn lease(holder: &str, renewed: i64, duration: i32) -> Lease {
        Lease {
            spec: Some(LeaseSpec {
                holder_identity: Some(holder.into()),
                renew_time: Some(MicroTime(Timestamp::from_second(renewed).unwrap())),
                lease_duration_seconds: Some(duration),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_lease_is_held_until_its_duration_after_the_last_renewal() {
        let at = |s| Timestamp::from_second(s).unwrap();
        let l = lease("pod-a", 1_000, 15);
        assert_eq!(held_by(&l, at(1_000)).as_deref(), Some("pod-a"));
        assert_eq!(held_by(&l, at(1_014)).as_deref(), Some("pod-a"));
        assert_eq!(held_by(&l, at(1_015)), None);
        // Released by its holder (client-go empties the holder on a clean stop).
        assert_eq!(held_by(&lease("", 1_000, 15), at(1_001)), None);
        assert_eq!(held_by(&Lease::default(), at(1_001)), None);
    }
}
