//! One start-up warning when the AWS credentials come from the instance role (IMDS).
//!
//! The operator runs with host networking, so the default chain falls through to the node's
//! instance profile when no IRSA / Pod Identity / environment / profile credentials are set. The
//! node role usually holds ENI rights for every pod on the node: the least privilege that
//! `manifests/aws/iam-policy.json` promises is then void. aws-config marks the credentials each
//! provider returns with an [`AwsCredentialFeature`] (the IMDS provider pushes
//! `CredentialsImds`: aws-config `src/imds/credentials.rs`), which tells which one answered.

use std::time::Duration;

use aws_credential_types::credential_feature::AwsCredentialFeature;
use aws_credential_types::provider::ProvideCredentials;

/// How long the start-up check waits for the chain (IMDS answers in milliseconds on EC2).
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(10);

/// The warning's text.
pub const INSTANCE_ROLE_WARNING: &str = "AWS credentials come from the node's instance role \
(IMDS), not from IRSA, EKS Pod Identity, the environment or a profile: every host-network pod \
on the node shares these rights, so the least privilege of manifests/aws/iam-policy.json does not \
hold; give the operator's service account its own role (docs/iam.md)";

/// Pure decision: warn when the credentials that answered came from IMDS.
pub fn instance_role_warning(features: &[AwsCredentialFeature]) -> Option<&'static str> {
    features
        .contains(&AwsCredentialFeature::CredentialsImds)
        .then_some(INSTANCE_ROLE_WARNING)
}

/// Resolve the client's credentials once and log [`INSTANCE_ROLE_WARNING`] if IMDS answered.
/// Failing to resolve is left to the first EC2 call, which reports it as its error.
pub async fn warn_if_instance_role(
    provider: Option<aws_credential_types::provider::SharedCredentialsProvider>,
) {
    let Some(provider) = provider else {
        return;
    };
    match tokio::time::timeout(RESOLVE_TIMEOUT, provider.provide_credentials()).await {
        Ok(Ok(creds)) => {
            let features = creds
                .get_property::<Vec<AwsCredentialFeature>>()
                .map(Vec::as_slice)
                .unwrap_or_default();
            if let Some(warning) = instance_role_warning(features) {
                tracing::warn!("{warning}");
            }
        }
        Ok(Err(e)) => tracing::debug!(error = %e, "no AWS credentials resolved at start-up"),
        Err(_) => tracing::debug!("the AWS credential chain did not answer at start-up"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use AwsCredentialFeature as F;

    #[test]
    fn credentials_from_imds_warn() {
        assert_eq!(
            instance_role_warning(&[F::CredentialsImds]),
            Some(INSTANCE_ROLE_WARNING)
        );
        // IMDS beside other features (e.g. an account ID resolved) still warns.
        assert!(instance_role_warning(&[F::ResolvedAccountId, F::CredentialsImds]).is_some());
    }

    #[test]
    fn irsa_pod_identity_env_and_profile_do_not_warn() {
        for f in [
            F::CredentialsStsAssumeRoleWebId,   // IRSA
            F::CredentialsEnvVarsStsWebIdToken, // IRSA through the env variables
            F::CredentialsHttp,                 // EKS Pod Identity (container endpoint)
            F::CredentialsEnvVars,
            F::CredentialsProfile,
            F::CredentialsSso,
        ] {
            assert_eq!(
                instance_role_warning(std::slice::from_ref(&f)),
                None,
                "{f:?}"
            );
        }
        assert_eq!(instance_role_warning(&[]), None);
    }

    /// The chain's IMDS provider, asked through a fake metadata endpoint, marks what it returns
    /// so: the property the decision reads is the one aws-config sets.
    #[tokio::test]
    async fn the_imds_provider_marks_its_credentials() {
        use aws_config::imds::credentials::ImdsCredentialsProvider;
        let endpoint = fake_imds().await;
        let imds = aws_config::imds::Client::builder()
            .endpoint(endpoint)
            .expect("endpoint")
            .build();
        let provider = ImdsCredentialsProvider::builder().imds_client(imds).build();
        let creds = provider.provide_credentials().await.expect("credentials");
        let features = creds
            .get_property::<Vec<AwsCredentialFeature>>()
            .expect("features");
        assert_eq!(instance_role_warning(features), Some(INSTANCE_ROLE_WARNING));
    }

    /// A metadata service with a token, one role and its credentials (IMDSv2's three paths).
    async fn fake_imds() -> String {
        use axum::Router;
        use axum::routing::{get, put};
        let app = Router::new()
            .route(
                "/latest/api/token",
                put(|| async { ([("x-aws-ec2-metadata-token-ttl-seconds", "21600")], "token") }),
            )
            .route(
                "/latest/meta-data/iam/security-credentials/",
                get(|| async { "node-role" }),
            )
            .route(
                "/latest/meta-data/iam/security-credentials/node-role",
                get(|| async {
                    r#"{"Code":"Success","Type":"AWS-HMAC","AccessKeyId":"ASIA","SecretAccessKey":"s","Token":"t","Expiration":"2099-01-01T00:00:00Z","LastUpdated":"2026-01-01T00:00:00Z"}"#
                }),
            );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        format!("http://{addr}")
    }
}
