//! Node deletion: give back the ENIs we created for an instance whose Kubernetes Node is gone.
//!
//! Only ENIs with our ownership tags for this cluster and this instance; never device index 0;
//! detach, wait until `available` (polling through the gate with backoff), then delete.
//! Not-found answers count as success, so an instance that is already gone finishes cleanly.

use std::time::Duration;

use tracing::{info, warn};

use crate::ec2::{
    Ec2, EniFilter, EniState, ErrorKind, InstanceFilter, InstanceState, NetworkInterface, Result,
    collect_pages,
};
use crate::ipam::ownership::{INSTANCE_TAG, is_owned_by, ownership_tags};

/// Polls for a detach to finish: 1 s doubling, this many times (about a minute in all).
pub const DETACH_POLLS: u32 = 6;

/// Default of `--node-gone-grace-period`: how long the ENIs of a running instance whose Node
/// object is gone are kept (a kubelet re-registers its Node; remediation tools and people
/// delete Node objects of instances that keep running).
pub const NODE_GONE_GRACE: Duration = Duration::from_secs(600);

/// First and longest wait between two looks at the instance of a gone Node.
const GONE_RECHECK_MIN: Duration = Duration::from_secs(5);
const GONE_RECHECK_MAX: Duration = Duration::from_secs(60);

/// What the finalizer does with the ENIs of a node whose Kubernetes Node is gone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GoneNode {
    /// EC2 shows the instance shutting down, terminated, stopped, or does not know it.
    Release,
    /// The instance still runs: keep its ENIs and look again after this long.
    Keep(Duration),
    /// The instance still runs, but the Node has been gone for the grace period.
    ReleaseAfterGrace,
}

/// The rule (docs/rules.md): release only when the instance is gone or stopped (`state`
/// `None`: EC2 does not know it); while it runs (or is pending or stopping), keep its ENIs,
/// looking again with backoff (the wait doubles with the time gone, 5 s to 60 s, never past the
/// deadline), until the Node has been gone for `grace`.
pub fn gone_node(state: Option<InstanceState>, gone_for: Duration, grace: Duration) -> GoneNode {
    let stopped = matches!(
        state,
        None | Some(
            InstanceState::ShuttingDown | InstanceState::Terminated | InstanceState::Stopped
        )
    );
    if stopped {
        return GoneNode::Release;
    }
    if gone_for >= grace {
        return GoneNode::ReleaseAfterGrace;
    }
    let wait = gone_for.clamp(GONE_RECHECK_MIN, GONE_RECHECK_MAX);
    GoneNode::Keep(wait.min(grace - gone_for))
}

/// The instance's state as EC2 tells it; `None` when EC2 does not know the instance.
pub async fn instance_state<E: Ec2>(ec2: &E, instance_id: &str) -> Result<Option<InstanceState>> {
    let filter = InstanceFilter {
        ids: vec![instance_id.to_string()],
        ..Default::default()
    };
    match collect_pages(|t| ec2.describe_instances(&filter, t)).await {
        Ok(found) => Ok(found
            .into_iter()
            .find(|i| i.id == instance_id)
            .map(|i| i.state)),
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(e),
    }
}

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
    use crate::cache::tests::eni;

    #[test]
    fn a_gone_node_keeps_the_enis_of_a_running_instance_until_the_grace_period() {
        let grace = NODE_GONE_GRACE;
        let s = Duration::from_secs;
        for gone in [
            None,
            Some(InstanceState::ShuttingDown),
            Some(InstanceState::Terminated),
            Some(InstanceState::Stopped),
        ] {
            assert_eq!(gone_node(gone, s(0), grace), GoneNode::Release, "{gone:?}");
        }
        for running in [
            InstanceState::Pending,
            InstanceState::Running,
            InstanceState::Stopping,
            InstanceState::Unknown,
        ] {
            assert_eq!(
                gone_node(Some(running), s(0), grace),
                GoneNode::Keep(s(5)),
                "{running:?}"
            );
        }
        let running = Some(InstanceState::Running);
        assert_eq!(gone_node(running, s(20), grace), GoneNode::Keep(s(20)));
        assert_eq!(gone_node(running, s(300), grace), GoneNode::Keep(s(60)));
        assert_eq!(gone_node(running, s(590), grace), GoneNode::Keep(s(10)));
        assert_eq!(
            gone_node(running, grace, grace),
            GoneNode::ReleaseAfterGrace
        );
    }

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
