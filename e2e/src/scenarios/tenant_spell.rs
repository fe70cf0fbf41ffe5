//! `tenant-spell` (ec2-sim only, issue 41): another tenant of the account takes every token
//! left and 90 % of every refill for 20 s while 20 nodes join. Within 20 s of the spell's end
//! the real binary is back at full speed: the adaptive rate (`ec2_rate_limit_qps`) of every
//! bucket the burst uses is at its ceiling again, or nothing is left to do; every node is
//! served, with no extra ENI.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use eni_operator::ec2::Bucket;
use eni_operator::ec2::gate::GateConfig;
use testkit::agent::Generation;

use super::adopt::http_get;
use super::{Suite, eventually};
use crate::checks::NodeVariant;
use crate::operator::OperatorOptions;
use crate::simctl::SimControl;

const NODES: usize = 20;
/// Pods per node: two ENIs' worth on an m5.large (9 addresses each besides the primary, and
/// the agent's own endpoints), so the burst outlasts the spell; 20 would need a third pod ENI,
/// which an m5.large (3 interfaces, the first the host's) does not have.
const PODS: usize = 14;
const SPELL: Duration = Duration::from_secs(20);
/// The spell starts this long after it is scheduled (the nodes join meanwhile).
const SPELL_AFTER: Duration = Duration::from_secs(3);
/// Back at full speed within this long after the spell's end (the target).
const RECOVERY: Duration = Duration::from_secs(20);
/// The buckets a burst of new ENIs uses (create, attach, delete-on-termination).
const BURST_BUCKETS: [Bucket; 3] = [
    Bucket::CreateNetworkInterface,
    Bucket::AttachNetworkInterface,
    Bucket::ModifyNetworkInterfaceAttribute,
];

/// `eni_operator_ec2_rate_limit_qps{bucket="NAME"}` from a scrape (the registry's prefix
/// included: without it no line matches and every bucket would read as recovered).
pub(super) fn rate_gauge(metrics: &str, bucket: &str) -> Option<f64> {
    let prefix = format!("eni_operator_ec2_rate_limit_qps{{bucket=\"{bucket}\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.trim().parse().ok())
}

impl Suite {
    pub(super) async fn tenant_spell(&mut self) -> Result<()> {
        let sim = SimControl::connect(&self.ops.settings.ec2_endpoint).await?;
        self.start_ops(OperatorOptions::default(), 1).await?;
        let addr = self
            .ops
            .metrics_addrs()
            .into_iter()
            .next()
            .context("tenant-spell needs a local operator (its metrics listener)")?;
        let before = sim.throttled().await?;
        let scheduled = Instant::now();
        sim.tenant_spell(SPELL_AFTER, SPELL, 0.9).await?;
        let end = scheduled + SPELL_AFTER + SPELL;
        let mut idxs = Vec::new();
        for i in 0..NODES {
            let variant = NodeVariant::default();
            idxs.push(
                self.add_node("m5.large", i % 2, Some(Generation::Classic), PODS, variant)
                    .await?,
            );
        }
        tokio::time::sleep_until(end.into()).await;
        let throttled = sim.throttled().await? - before;
        let ceilings = GateConfig::aws_defaults();
        let recovered = eventually(
            RECOVERY,
            "the adaptive rates back at their ceiling",
            async || {
                let metrics = http_get(&addr, "/metrics").await?;
                let below: Vec<String> = BURST_BUCKETS
                    .iter()
                    .filter_map(|b| match rate_gauge(&metrics, b.name()) {
                        Some(rate) if rate >= ceilings.bucket_limits(*b).1 => None,
                        Some(rate) => Some(format!("{} {rate:.2}/s", b.name())),
                        None => Some(format!("{}: no rate gauge", b.name())),
                    })
                    .collect();
                if below.is_empty() || self.served_notes(&idxs).await?.is_ok() {
                    return Ok(Ok(end.elapsed()));
                }
                Ok(Err(format!("below the ceiling: {}", below.join(", "))))
            },
        )
        .await?;
        self.wait_served(&idxs, self.cfg.timeout).await?;
        let served = end.elapsed();
        ensure!(
            throttled > 0,
            "ec2-sim answered no call RequestLimitExceeded during the spell: it did not bite"
        );
        println!(
            "     tenant-spell: {throttled} throttled answers during the spell; back at full \
             speed {:.1} s after its end; all {NODES} nodes served {:.1} s after it",
            recovered.as_secs_f64(),
            served.as_secs_f64()
        );
        for i in idxs {
            self.assert_eni_count_at_most(i, PODS).await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_rate_gauge_of_one_bucket() {
        let text = "# TYPE eni_operator_ec2_rate_limit_qps gauge\n\
                    eni_operator_ec2_rate_limit_qps{bucket=\"describe-subnets\"} 16.0\n\
                    eni_operator_ec2_rate_limit_qps{bucket=\"create-network-interface\"} 0.35\n\
                    eni_operator_ec2_rate_limit_qps_other{bucket=\"attach-network-interface\"} 1\n";
        assert_eq!(rate_gauge(text, "create-network-interface"), Some(0.35));
        assert_eq!(rate_gauge(text, "describe-subnets"), Some(16.0));
        assert_eq!(rate_gauge(text, "attach-network-interface"), None);
    }
}
