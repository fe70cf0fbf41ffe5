//! Node deletion: give back the ENIs we created for an instance whose Kubernetes Node is gone.
//!
//! Only ENIs with our ownership tags for this cluster and this instance; never device index 0;
//! detach, wait until `available` (polling through the gate with backoff), then delete.
//! Not-found answers count as success, so an instance that is already gone finishes cleanly.

use std::time::Duration;

use tracing::{info, warn};

use crate::ec2::{Ec2, EniFilter, EniState, ErrorKind, NetworkInterface, Result, collect_pages};
use crate::ipam::ownership::{INSTANCE_TAG, is_owned_by, ownership_tags};

/// Polls for a detach to finish: 1 s doubling, this many times (about a minute in all).
pub const DETACH_POLLS: u32 = 6;

/// Whether the finalizer may remove this ENI from `instance_id`.
pub fn releasable(eni: &NetworkInterface, cluster: &str, instance_id: &str) -> bool {
    is_owned_by(eni, cluster)
        && eni.tags.get(INSTANCE_TAG).map(String::as_str) == Some(instance_id)
        && eni.device_index() != Some(0)
        && eni
            .attachment
            .as_ref()
            .is_none_or(|a| a.instance_id == instance_id)
}

/// Detach and delete every ENI we created for `instance_id`. Returns how many were deleted.
pub async fn release_instance_enis<E: Ec2>(
    ec2: &E,
    cluster: &str,
    instance_id: &str,
) -> Result<usize> {
    let filter = EniFilter {
        tags: ownership_tags(cluster, instance_id),
        ..Default::default()
    };
    let enis = collect_pages(|t| ec2.describe_network_interfaces(&filter, t)).await?;
    let mut deleted = 0;
    for eni in enis.iter().filter(|e| releasable(e, cluster, instance_id)) {
        if let Some(att) = &eni.attachment {
            match ec2.detach_network_interface(&att.id, false).await {
                Ok(()) => {}
                Err(e) if e.is_not_found() || e.kind == ErrorKind::InstanceNotRunning => {}
                Err(e) => return Err(e),
            }
            if !wait_available(ec2, &eni.id).await? {
                warn!(eni = %eni.id, "ENI still attached after waiting; will retry");
                return Err(crate::ec2::Ec2Error::transient(
                    crate::ec2::Operation::DetachNetworkInterface,
                    "DetachTimeout",
                    format!("{} did not become available", eni.id),
                ));
            }
        }
        match ec2.delete_network_interface(&eni.id).await {
            Ok(()) => deleted += 1,
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e),
        }
        info!(eni = %eni.id, instance = %instance_id, "released an ENI of a deleted node");
    }
    Ok(deleted)
}

/// Poll until the ENI is `available` (true) or gone (true); false after [`DETACH_POLLS`].
async fn wait_available<E: Ec2>(ec2: &E, eni_id: &str) -> Result<bool> {
    let filter = EniFilter {
        ids: vec![eni_id.to_string()],
        ..Default::default()
    };
    let mut delay = Duration::from_secs(1);
    for _ in 0..DETACH_POLLS {
        match collect_pages(|t| ec2.describe_network_interfaces(&filter, t)).await {
            Ok(list) => match list.first() {
                None => return Ok(true),
                Some(e) if e.state == EniState::Available && e.attachment.is_none() => {
                    return Ok(true);
                }
                Some(_) => {}
            },
            Err(e) if e.is_not_found() => return Ok(true),
            Err(e) => return Err(e),
        }
        tokio::time::sleep(delay).await;
        delay *= 2;
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::cache::tests::eni;

    #[test]
    fn only_our_non_primary_enis_of_this_instance() {
        let mut ok = eni("eni-1", Some(("i-1", 1)), "s");
        ok.tags = ownership_tags("prod", "i-1");
        assert!(releasable(&ok, "prod", "i-1"));
        let mut primary = ok.clone();
        primary.attachment.as_mut().unwrap().device_index = 0;
        assert!(!releasable(&primary, "prod", "i-1"));
        let untagged = eni("eni-2", Some(("i-1", 1)), "s");
        assert!(!releasable(&untagged, "prod", "i-1"));
        assert!(!releasable(&ok, "staging", "i-1"));
        assert!(!releasable(&ok, "prod", "i-2"));
        let mut moved = ok.clone();
        moved.attachment.as_mut().unwrap().instance_id = "i-9".into();
        assert!(!releasable(&moved, "prod", "i-1"), "attached elsewhere now");
    }
}
