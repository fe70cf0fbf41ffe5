//! Reads Cilium operator's leader Lease for the handover guard (`docs/migrating-from-cilium.md`,
//! "The guard"): who holds it, since when, when it was last renewed. A get every few seconds
//! (one object; a watch would buy nothing at this rate).

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use tracing::warn;

use crate::ipam::handover::{CILIUM_OPERATOR_LEASE, LeaseView};

/// How often the Lease is read (Cilium's lease duration is 15 s by default).
pub const PERIOD: Duration = Duration::from_secs(5);

/// The guard's view of a Lease (`None`: nobody holds it, or a field is missing).
pub fn view(lease: &Lease) -> Option<LeaseView> {
    let spec = lease.spec.as_ref()?;
    let holder = spec.holder_identity.clone().filter(|h| !h.is_empty())?;
    let renewed = spec.renew_time.as_ref()?.0;
    let acquired = spec.acquire_time.as_ref().map_or(renewed, |t| t.0);
    let seconds = spec.lease_duration_seconds.unwrap_or(15).max(1);
    Some(LeaseView {
        holder,
        acquired,
        renewed,
        duration: Duration::from_secs(seconds.unsigned_abs().into()),
    })
}

/// Read the Lease every [`PERIOD`] and hand each view to `set`; never returns.
pub async fn watch(client: kube::Client, namespace: &str, set: impl Fn(Option<LeaseView>)) {
    let api: Api<Lease> = Api::namespaced(client, namespace);
    let mut said = false;
    loop {
        match api.get_opt(CILIUM_OPERATOR_LEASE).await {
            Ok(lease) => {
                said = false;
                set(lease.as_ref().and_then(view));
            }
            Err(e) => {
                // Keep the last view: a transient error must not look like a stopped operator.
                if !said {
                    warn!(error = %e, namespace, "cannot read {CILIUM_OPERATOR_LEASE}");
                    said = true;
                }
            }
        }
        tokio::time::sleep(PERIOD).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
    use k8s_openapi::jiff::Timestamp;

    #[test]
    fn a_held_lease_becomes_a_view_and_an_empty_one_none() {
        let t = |s| MicroTime(Timestamp::from_second(s).unwrap());
        let lease = Lease {
            spec: Some(LeaseSpec {
                holder_identity: Some("cilium-operator-1".into()),
                acquire_time: Some(t(100)),
                renew_time: Some(t(130)),
                lease_duration_seconds: Some(15),
                ..LeaseSpec::default()
            }),
            ..Lease::default()
        };
        let v = view(&lease).unwrap();
        assert_eq!(v.holder, "cilium-operator-1");
        assert_eq!(v.acquired, Timestamp::from_second(100).unwrap());
        assert_eq!(v.duration, Duration::from_secs(15));
        assert!(view(&Lease::default()).is_none());
    }
}
