//! How to reach EC2: region, endpoint, timeouts, page size.

use std::time::Duration;

use aws_config::retry::RetryConfig;
use aws_config::timeout::TimeoutConfig;
use aws_config::{BehaviorVersion, ConfigLoader, Region};

#[cfg(doc)]
use super::AwsEc2;

/// How to reach EC2.
#[derive(Clone, Debug)]
pub struct AwsClientConfig {
    /// Region override; otherwise the default chain (env, profile, IMDS).
    pub region: Option<String>,
    /// Endpoint override (LocalStack, moto). Without it the SDK also honours
    /// `AWS_ENDPOINT_URL_EC2` and `AWS_ENDPOINT_URL` (aws-config's service-specific endpoints).
    pub endpoint_url: Option<String>,
    pub connect_timeout: Duration,
    /// Bound on one call (and its single attempt: the SDK does not retry).
    pub operation_timeout: Duration,
    /// `MaxResults` of describes; `None` lets AWS choose. Never sent together with IDs.
    pub max_results_per_call: Option<i32>,
}

impl Default for AwsClientConfig {
    fn default() -> Self {
        Self {
            region: None,
            endpoint_url: None,
            connect_timeout: Duration::from_secs(5),
            operation_timeout: Duration::from_secs(30),
            max_results_per_call: None,
        }
    }
}

impl AwsClientConfig {
    /// The SDK config loader with region, endpoint, timeouts and retry set; callers may add to
    /// it (tests give static credentials) before [`AwsEc2::from_loader`].
    pub fn loader(&self) -> ConfigLoader {
        let timeouts = TimeoutConfig::builder()
            .connect_timeout(self.connect_timeout)
            .operation_timeout(self.operation_timeout)
            .operation_attempt_timeout(self.operation_timeout)
            .build();
        let mut loader = aws_config::defaults(BehaviorVersion::latest())
            .timeout_config(timeouts)
            .retry_config(RetryConfig::disabled());
        if let Some(region) = &self.region {
            loader = loader.region(Region::new(region.clone()));
        }
        if let Some(url) = &self.endpoint_url {
            loader = loader.endpoint_url(url.clone());
        }
        loader
    }
}
