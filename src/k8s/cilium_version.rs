//! Reads the release of Cilium's operator for the handover guard: the schema label on the
//! CiliumNode CRD (`ipam::cilium_version` says why that label and what it means). A metadata-only
//! get of one CRD every [`PERIOD`]: Cilium's operator rewrites the label when a newer release
//! starts, so an upgrade is seen within one period.

use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use tracing::{info, warn};

use crate::ipam::cilium_version::{CILIUM_NODE_CRD, CiliumVersion, SCHEMA_LABEL};

/// How often the label is read.
pub const PERIOD: Duration = Duration::from_secs(10);

/// What one read tells: the label, or why there is none (`read`: the CRD's labels, `Ok(None)`
/// when the API server answers 404).
pub fn state(
    read: Result<Option<&std::collections::BTreeMap<String, String>>, String>,
) -> CiliumVersion {
    match read {
        Ok(Some(labels)) => CiliumVersion::from_label(labels.get(SCHEMA_LABEL).map(String::as_str)),
        Ok(None) => CiliumVersion::Unknown(format!("CRD {CILIUM_NODE_CRD} not found")),
        Err(e) => CiliumVersion::Unknown(format!(
            "cannot read CRD {CILIUM_NODE_CRD} ({e}; RBAC: get on that CRD)"
        )),
    }
}

/// Read the label every [`PERIOD`] and hand each state to `set`; never returns.
pub async fn watch(client: kube::Client, set: impl Fn(CiliumVersion)) {
    let api: Api<CustomResourceDefinition> = Api::all(client);
    let mut said: Option<CiliumVersion> = None;
    loop {
        let labels = api
            .get_metadata_opt(CILIUM_NODE_CRD)
            .await
            .map(|m| m.map(|m| m.metadata.labels.unwrap_or_default()));
        let version = state(
            labels
                .as_ref()
                .map(Option::as_ref)
                .map_err(ToString::to_string),
        );
        // Once per change: it is read every few seconds.
        if said.as_ref() != Some(&version) {
            match version.ignore_unsupported() {
                Some(why) => warn!("{why}; while it runs, no node is taken over"),
                None => info!(
                    ?version,
                    "Cilium's operator honours {}",
                    crate::crd::CILIUM_IGNORE_ANNOTATION
                ),
            }
            said = Some(version.clone());
        }
        set(version);
        tokio::time::sleep(PERIOD).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ipam::cilium_version::Schema;

    #[test]
    fn the_label_or_why_there_is_none() {
        let labels: std::collections::BTreeMap<String, String> =
            [(SCHEMA_LABEL.to_string(), "1.29.4".to_string())].into();
        assert_eq!(
            state(Ok(Some(&labels))),
            CiliumVersion::Schema(Schema(1, 29, 4))
        );
        let none = std::collections::BTreeMap::new();
        assert!(matches!(state(Ok(Some(&none))), CiliumVersion::Unknown(_)));
        let CiliumVersion::Unknown(why) = state(Err("forbidden".into())) else {
            unreachable!()
        };
        assert!(why.contains("RBAC"), "{why}");
        assert!(matches!(state(Ok(None)), CiliumVersion::Unknown(_)));
    }
}
