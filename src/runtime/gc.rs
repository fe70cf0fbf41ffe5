//! ENI garbage collection: our ENIs left `available` (a crash between create and attach, a
//! failed clean-up) are deleted once they stayed unattached across two consecutive runs.
//!
//! Only ENIs carrying our ownership tags for this cluster are ever considered; untagged ENIs
//! and Cilium's are never touched. The decision ([`EniGc::round`]) is pure.
//!
//! The allocation core attaches such an ENI of a managed instance on the node's next pass
//! (seconds), long before a second sighting an interval later. Should the GC win anyway (the
//! node backed off for longer), the attach finds the ENI gone and the node creates another
//! with a fresh token; if the attach wins, the delete is refused ("in use") and only logged.

use std::collections::BTreeSet;

use tracing::{debug, info};

use crate::ec2::{Ec2, EniFilter, EniState, NetworkInterface, Result, Tags, collect_pages};
use crate::ipam::ownership::{CLUSTER_TAG, is_owned_by};

use super::metrics::{DELETED_GC, RuntimeMetrics};

/// Default per-run cap on deletions (and on marks), as Cilium's.
pub const DEFAULT_MAX_PER_RUN: usize = 25;

/// What one run did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GcReport {
    pub deleted: Vec<String>,
    pub marked: usize,
    pub failed: usize,
}

/// The collector's memory: ENIs seen unattached in the previous run.
#[derive(Clone, Debug)]
pub struct EniGc {
    cluster: String,
    max_per_run: usize,
    marked: BTreeSet<String>,
    metrics: RuntimeMetrics,
}

impl EniGc {
    pub fn new(cluster: impl Into<String>, max_per_run: usize) -> Self {
        Self {
            cluster: cluster.into(),
            max_per_run: max_per_run.max(1),
            marked: BTreeSet::new(),
            metrics: RuntimeMetrics::default(),
        }
    }

    /// Count runs and deletions into these metrics (default: unregistered ones).
    pub fn with_metrics(mut self, metrics: RuntimeMetrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// Eligible: ours, for this cluster, unattached and `available`.
    pub fn eligible(&self, eni: &NetworkInterface) -> bool {
        // Planted defect (dst-mutants): ownership not checked.
        (is_owned_by(eni, &self.cluster) || crate::mutants::active("touch-foreign-eni"))
            && eni.attachment.is_none()
            && eni.state == EniState::Available
    }

    /// Given this run's listing, return the ENIs to delete now (seen unattached in the previous
    /// run too), capped, and remember the rest for the next run.
    pub fn round(&mut self, listed: &[NetworkInterface]) -> Vec<String> {
        let now: BTreeSet<String> = listed
            .iter()
            .filter(|e| self.eligible(e))
            .map(|e| e.id.clone())
            .collect();
        let delete: Vec<String> = now
            .intersection(&self.marked)
            .take(self.max_per_run)
            .cloned()
            .collect();
        self.marked = now
            .into_iter()
            .filter(|id| !delete.contains(id))
            .take(self.max_per_run)
            .collect();
        delete
    }

    pub fn marked(&self) -> &BTreeSet<String> {
        &self.marked
    }

    /// One GC run: list (paginated, filtered by status and our cluster tag), decide, delete.
    pub async fn run_once<E: Ec2>(&mut self, ec2: &E, subnet_ids: &[String]) -> Result<GcReport> {
        let result = self.run_inner(ec2, subnet_ids).await;
        match &result {
            Ok(r) => {
                self.metrics.gc_run(true, r.marked);
                self.metrics.eni_deleted(DELETED_GC, r.deleted.len() as u64);
            }
            Err(_) => self.metrics.gc_run(false, 0),
        }
        result
    }

    async fn run_inner<E: Ec2>(&mut self, ec2: &E, subnet_ids: &[String]) -> Result<GcReport> {
        let filter = EniFilter {
            subnet_ids: subnet_ids.to_vec(),
            // Planted defect (dst-mutants): the listing no longer filters on our tag.
            tags: if crate::mutants::active("touch-foreign-eni") {
                Tags::new()
            } else {
                Tags::from([(CLUSTER_TAG.to_string(), self.cluster.clone())])
            },
            state: Some(EniState::Available),
            ..Default::default()
        };
        let listed = collect_pages(|t| ec2.describe_network_interfaces(&filter, t)).await?;
        let delete = self.round(&listed);
        let mut report = GcReport {
            marked: self.marked.len(),
            ..Default::default()
        };
        for id in delete {
            match ec2.delete_network_interface(&id).await {
                Ok(()) => {
                    info!(eni = %id, "deleted a leaked ENI");
                    report.deleted.push(id);
                }
                Err(e) if e.is_not_found() => report.deleted.push(id),
                Err(e) => {
                    // Attached meanwhile, or throttled: look again next run.
                    debug!(eni = %id, error = %e, "GC could not delete an ENI");
                    report.failed += 1;
                }
            }
        }
        Ok(report)
    }
}

/// Run the collector every `interval` until dropped.
pub async fn run_loop<E: Ec2>(
    ec2: std::sync::Arc<E>,
    cluster: String,
    subnet_ids: Vec<String>,
    interval: std::time::Duration,
    max_per_run: usize,
    metrics: RuntimeMetrics,
) {
    let mut gc = EniGc::new(cluster, max_per_run).with_metrics(metrics);
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        match gc.run_once(&*ec2, &subnet_ids).await {
            Ok(r) if !r.deleted.is_empty() || r.marked > 0 => {
                info!(deleted = r.deleted.len(), marked = r.marked, "ENI GC run");
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "ENI GC listing failed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ipam::ownership::ownership_tags;
    use crate::runtime::cache::tests::eni;

    fn ours(id: &str, attached: bool) -> NetworkInterface {
        let mut e = eni(id, attached.then_some(("i-1", 1)), "subnet-1");
        e.tags = ownership_tags("prod", "i-1");
        e
    }

    #[test]
    fn deletes_only_after_two_consecutive_sightings() {
        let mut gc = EniGc::new("prod", 25);
        assert!(gc.round(&[ours("eni-a", false)]).is_empty());
        // eni-b appears; eni-a seen twice.
        assert_eq!(
            gc.round(&[ours("eni-a", false), ours("eni-b", false)]),
            ["eni-a"]
        );
        // eni-b got attached meanwhile: not deleted, and forgotten.
        assert!(gc.round(&[ours("eni-b", true)]).is_empty());
        assert!(gc.marked().is_empty());
    }

    #[test]
    fn never_touches_untagged_or_foreign_enis() {
        let mut gc = EniGc::new("prod", 25);
        let untagged = eni("eni-u", None, "subnet-1");
        let mut other_cluster = ours("eni-o", false);
        other_cluster.tags = ownership_tags("staging", "i-1");
        let mut cilium = eni("eni-c", None, "subnet-1");
        cilium.tags = Tags::from([("io.cilium/cilium-managed".into(), "true".into())]);
        let listed = [untagged, other_cluster, cilium];
        gc.round(&listed);
        assert!(gc.round(&listed).is_empty());
        assert!(gc.marked().is_empty());
    }

    #[test]
    fn caps_deletions_per_run() {
        let mut gc = EniGc::new("prod", 2);
        let listed: Vec<_> = (0..5).map(|i| ours(&format!("eni-{i}"), false)).collect();
        gc.round(&listed);
        assert_eq!(gc.marked().len(), 2);
        assert_eq!(gc.round(&listed).len(), 2);
    }
}
