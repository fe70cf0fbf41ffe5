//! The EC2 client's flags and its gate's (client-side throttling), and what they build.

use std::time::Duration;

use clap::Args;

use crate::ec2::Bucket;
use crate::ec2::aws::AwsClientConfig;
use crate::ec2::gate::GateConfig;

use super::values::{BucketOverride, parse_duration};

/// The EC2 client.
#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "EC2 client")]
pub struct Ec2Settings {
    /// AWS Region (default: aws-config's chain: AWS_REGION, profile, IMDS).
    #[arg(long, env = "ENI_OPERATOR_AWS_REGION")]
    pub aws_region: Option<String>,
    /// EC2 endpoint override (host or URL; `https://` is prepended when no scheme is given),
    /// e.g. for LocalStack or moto. AWS_ENDPOINT_URL_EC2 works too.
    #[arg(long, env = "ENI_OPERATOR_EC2_API_ENDPOINT")]
    pub ec2_api_endpoint: Option<String>,
    /// MaxResults per Describe page (0: let AWS choose).
    #[arg(
        long,
        env = "ENI_OPERATOR_AWS_MAX_RESULTS_PER_CALL",
        default_value_t = 0,
        allow_negative_numbers = true
    )]
    pub aws_max_results_per_call: i32,
    /// TCP connect timeout to EC2.
    #[arg(long, env = "ENI_OPERATOR_EC2_CONNECT_TIMEOUT", default_value = "5s", value_parser = parse_duration)]
    pub ec2_connect_timeout: Duration,
    /// Timeout of one EC2 operation (one attempt of one call).
    #[arg(long, env = "ENI_OPERATOR_EC2_OPERATION_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    pub ec2_operation_timeout: Duration,
}

/// Client-side EC2 throttling (the gate).
#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "EC2 rate limits")]
pub struct GateSettings {
    /// Share of AWS's per-action token-bucket rates we use, leaving headroom for other callers in
    /// the account and Region. In (0, 1].
    #[arg(long, env = "ENI_OPERATOR_EC2_RATE_FRACTION", default_value_t = 0.8)]
    pub ec2_rate_fraction: f64,
    /// Override one bucket as NAME=BURST/RATE (rate per second), repeatable or comma-separated.
    /// Names: one per EC2 action, kebab-case (describe-instances, create-network-interface,
    /// attach-network-interface, ...); `describe` sets every describe action's bucket,
    /// `general-mutating` those of attach, detach, associate-address and disassociate-address.
    #[arg(long, env = "ENI_OPERATOR_EC2_BUCKET", value_delimiter = ',')]
    pub ec2_bucket: Vec<BucketOverride>,
    /// Attempts per EC2 call (throttling and transient errors), including the first.
    #[arg(long, env = "ENI_OPERATOR_EC2_MAX_ATTEMPTS", default_value_t = 5)]
    pub ec2_max_attempts: u32,
    /// Cilium-style single bucket for ALL EC2 calls, rate per second. Not recommended (one
    /// action's burst starves the others); kept for comparison. Needs --limit-ipam-api-burst.
    #[arg(long, env = "ENI_OPERATOR_LIMIT_IPAM_API_QPS")]
    pub limit_ipam_api_qps: Option<f64>,
    /// Burst of the single Cilium-style bucket. Needs --limit-ipam-api-qps.
    #[arg(long, env = "ENI_OPERATOR_LIMIT_IPAM_API_BURST")]
    pub limit_ipam_api_burst: Option<u32>,
}

impl Ec2Settings {
    /// The endpoint URL for the SDK: Cilium accepts a bare host, the SDK needs a scheme.
    pub fn endpoint_url(&self) -> Option<String> {
        self.ec2_api_endpoint.as_ref().map(|e| {
            if e.contains("://") {
                e.clone()
            } else {
                format!("https://{e}")
            }
        })
    }

    /// `MaxResults` for Describe calls, `None` when AWS should choose.
    pub fn max_results(&self) -> Option<i32> {
        (self.aws_max_results_per_call > 0).then_some(self.aws_max_results_per_call)
    }

    /// The EC2 client's Region, endpoint, timeouts and page size.
    pub fn aws_client_config(&self) -> AwsClientConfig {
        AwsClientConfig {
            region: self.aws_region.clone(),
            endpoint_url: self.endpoint_url(),
            connect_timeout: self.ec2_connect_timeout,
            operation_timeout: self.ec2_operation_timeout,
            max_results_per_call: self.max_results(),
        }
    }

    /// The SDK configuration: default credential chain and Region, with our overrides. SDK
    /// retries are disabled because the gate owns the one retry policy (and its metrics).
    pub async fn sdk_config(&self) -> aws_config::SdkConfig {
        use aws_config::{BehaviorVersion, Region, retry::RetryConfig, timeout::TimeoutConfig};
        let mut loader = aws_config::defaults(BehaviorVersion::latest())
            .retry_config(RetryConfig::disabled())
            .timeout_config(
                TimeoutConfig::builder()
                    .connect_timeout(self.ec2_connect_timeout)
                    .operation_attempt_timeout(self.ec2_operation_timeout)
                    .build(),
            );
        if let Some(region) = &self.aws_region {
            loader = loader.region(Region::new(region.clone()));
        }
        if let Some(url) = self.endpoint_url() {
            loader = loader.endpoint_url(url);
        }
        loader.load().await
    }
}

impl GateSettings {
    /// (burst, rate per second) for a bucket: an override, else AWS's default × the fraction.
    pub fn bucket_limits(&self, bucket: Bucket) -> (u32, f64) {
        if let Some(o) = self
            .ec2_bucket
            .iter()
            .rev()
            .find(|o| o.buckets.contains(&bucket))
        {
            return (o.burst, o.rate);
        }
        let (burst, rate) = bucket.aws_default();
        let burst = ((burst as f64 * self.ec2_rate_fraction).floor() as u32).max(1);
        (burst, rate as f64 * self.ec2_rate_fraction)
    }

    /// The gate's buckets (every one, overrides applied), single-bucket mode and attempts.
    pub fn gate_config(&self) -> GateConfig {
        GateConfig {
            rate_fraction: self.ec2_rate_fraction,
            overrides: Bucket::ALL
                .iter()
                .map(|b| (*b, self.bucket_limits(*b)))
                .collect(),
            single_bucket: self.limit_ipam_api_qps.zip(self.limit_ipam_api_burst),
            max_attempts: self.ec2_max_attempts,
            ..GateConfig::aws_defaults()
        }
    }
}
