//! The control endpoints of `ec2-sim` (`testkit::wire`, `/_sim/...`), for scenarios that need
//! what only the simulator offers: a throttled account and a count of its throttled answers.
//! Against moto or LocalStack, [`SimControl::connect`] says the endpoint is not ec2-sim.

use anyhow::{Context, Result, bail, ensure};
use axum::body::Bytes;
use axum::http::{Method, Request, Uri};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

pub struct SimControl {
    base: String,
    client: Client<HttpConnector, Full<Bytes>>,
}

impl SimControl {
    /// The control plane of the ec2-sim at `endpoint`; an error when it is not one.
    pub async fn connect(endpoint: &str) -> Result<Self> {
        let ctl = Self {
            base: endpoint.trim_end_matches('/').to_owned(),
            client: Client::builder(TokioExecutor::new()).build_http(),
        };
        ctl.stats()
            .await
            .with_context(|| format!("{endpoint} is not ec2-sim (run with E2E_EC2=sim)"))?;
        Ok(ctl)
    }

    async fn call(&self, method: Method, path_and_query: &str) -> Result<(u16, Bytes)> {
        let uri: Uri = format!("{}{path_and_query}", self.base).parse()?;
        let req = Request::builder()
            .method(method)
            .uri(uri)
            .body(Full::new(Bytes::new()))?;
        let resp = self.client.request(req).await?;
        let status = resp.status().as_u16();
        let body = resp.into_body().collect().await?.to_bytes();
        Ok((status, body))
    }

    /// Per-action counters: `{"total": {"calls", "throttled", ...}, "ops": {ACTION: {...}}}`.
    pub async fn stats(&self) -> Result<serde_json::Value> {
        let (status, body) = self.call(Method::GET, "/_sim/stats").await?;
        ensure!(status == 200, "GET /_sim/stats answered {status}");
        Ok(serde_json::from_slice(&body)?)
    }

    /// `RequestLimitExceeded` answers so far, over every action.
    pub async fn throttled(&self) -> Result<u64> {
        let stats = self.stats().await?;
        stats["total"]["throttled"]
            .as_u64()
            .context("stats without total.throttled")
    }

    /// Override one of the account's buckets (it starts full).
    pub async fn set_bucket(&self, bucket: &str, burst: u32, per_second: u32) -> Result<()> {
        let q = format!("/_sim/bucket?bucket={bucket}&burst={burst}&per_second={per_second}");
        let (status, body) = self.call(Method::POST, &q).await?;
        if status != 204 {
            bail!("{q}: {status} {}", String::from_utf8_lossy(&body));
        }
        Ok(())
    }

    /// Another tenant's spell, `after` from now: it takes every token left in every bucket,
    /// then `share` of every refill for `length` (`POST /_sim/tenant-spell`).
    pub async fn tenant_spell(
        &self,
        after: std::time::Duration,
        length: std::time::Duration,
        share: f64,
    ) -> Result<()> {
        let q = format!(
            "/_sim/tenant-spell?after_ms={}&length_ms={}&share={share}",
            after.as_millis(),
            length.as_millis()
        );
        let (status, body) = self.call(Method::POST, &q).await?;
        if status != 204 {
            bail!("{q}: {status} {}", String::from_utf8_lossy(&body));
        }
        Ok(())
    }

    /// Back to AWS's documented buckets.
    pub async fn reset_throttling(&self) -> Result<()> {
        let (status, _) = self.call(Method::POST, "/_sim/reset-throttling").await?;
        ensure!(status == 204, "reset-throttling answered {status}");
        Ok(())
    }

    /// Calls per client (access key ID) and every mutating call with its instance
    /// (`GET /_sim/clients`, see `testkit::wire::clients`).
    pub async fn clients(&self) -> Result<testkit::wire::clients::Record> {
        let (status, body) = self.call(Method::GET, "/_sim/clients").await?;
        ensure!(status == 200, "GET /_sim/clients answered {status}");
        Ok(serde_json::from_slice(&body)?)
    }

    /// The instance the metadata endpoint describes.
    pub async fn set_metadata_instance(&self, instance_id: &str) -> Result<()> {
        let q = format!("/_sim/metadata?instance-id={instance_id}");
        let (status, body) = self.call(Method::POST, &q).await?;
        if status != 204 {
            bail!("{q}: {status} {}", String::from_utf8_lossy(&body));
        }
        Ok(())
    }
}
