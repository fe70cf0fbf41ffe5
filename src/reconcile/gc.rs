//! ENI garbage collection: our ENIs left `available` (a crash between create and attach, a
//! failed clean-up) are deleted once they stayed unattached across two consecutive runs.
//!
//! Only ENIs carrying our ownership tags for this cluster are ever considered; untagged ENIs
//! and Cilium's are never touched. The decision ([`EniGc::round`]) is pure.
//!
//! Scope: the GC lists only the managed VPC(s) (`--vpc-id`, else the VPCs of the managed
//! nodes' ENIs; none known yet: no listing at all), never region-wide: two clusters in one
//! account given the same `--cluster-name` (or, before it was derived, both keeping the old
//! default `default`) would otherwise delete each other's
//! unattached ENIs (leftovers waiting for their attach, ENIs mid-finalizer).
//!
//! `--eni-gc-tags`, as Cilium's operator: the GC considers only unattached ENIs carrying all of
//! these tags, and (while the GC is enabled) every ENI we create carries them
//! (cilium/cilium `operator/pkg/ipam/allocator/aws/aws.go` lines 51-85 and 99-104 at commit
//! 09b89c6c9e25: user tags replace the default set, and are merged into the creation tags;
//! `pkg/aws/eni/eni_gc.go` lines 25-34 at 062e4cdb55da: an ENI is deleted one run interval
//! after it was first seen available). Unlike Cilium's, whose tags alone decide, ours narrow
//! what our ownership tags already select: an ENI we did not create is never deleted.
//!
//! The allocation core attaches such an ENI of a managed instance on the node's next pass
//! (seconds), long before a second sighting an interval later. Should the GC win anyway (the
//! node backed off for longer), the attach finds the ENI gone and the node creates another
//! with a fresh token; if the attach wins, the delete is refused ("in use") and only logged.

use std::collections::BTreeSet;
use std::time::Duration;

use tracing::{debug, info};

use crate::ec2::{Ec2, EniFilter, EniState, NetworkInterface, Result, Tags, collect_pages};
use crate::ipam::ownership::{CLUSTER_TAG, is_owned_by};

use crate::reconcile::metrics::{DELETED_GC, RuntimeMetrics};

/// Default per-run cap on deletions (and on marks), as Cilium's.
pub const DEFAULT_MAX_PER_RUN: usize = 25;

/// Lower bound of `--eni-gc-interval` (smaller values are raised to it, with a warning).
/// An ENI is deleted only when two runs at least an interval apart both saw it unattached, so
/// the interval must exceed the longest time between a create and its attach. Under
/// throttling that is the attach's own retries: a throttled call keeps retrying for up to the
/// gate's `throttle_deadline` (300 s) from its first attempt, and that first attempt waits at
/// most one throttle penalty (`max_delay`, 20 s) for its token: 320 s. Six minutes leaves 40 s
/// (the next pass adopts a leftover whose attach gave up; it is a second create-to-attach).
/// Cilium's default, 5 minutes, is below it (docs/migrating-from-cilium.md).
pub const MIN_INTERVAL: Duration = Duration::from_secs(360);

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
    /// `--eni-gc-tags`: an ENI must carry all of these too.
    tags: Tags,
    /// The managed VPC(s): each run lists these alone (none: no listing).
    vpcs: BTreeSet<String>,
}

impl EniGc {
    pub fn new(cluster: impl Into<String>, max_per_run: usize) -> Self {
        Self {
            cluster: cluster.into(),
            max_per_run: max_per_run.max(1),
            marked: BTreeSet::new(),
            metrics: RuntimeMetrics::default(),
            tags: Tags::new(),
            vpcs: BTreeSet::new(),
        }
    }

    /// `--eni-gc-tags`: consider only ENIs that carry all of these (besides our ownership).
    pub fn with_tags(mut self, tags: Tags) -> Self {
        self.tags = tags;
        self
    }

    /// The VPCs the next runs may list (the managed ones); empty: runs list nothing.
    pub fn set_vpcs(&mut self, vpcs: BTreeSet<String>) {
        self.vpcs = vpcs;
    }

    /// As [`Self::set_vpcs`], for building.
    pub fn with_vpcs(mut self, vpcs: impl IntoIterator<Item = String>) -> Self {
        self.vpcs = vpcs.into_iter().collect();
        self
    }

    /// Count runs and deletions into these metrics (default: unregistered ones).
    pub fn with_metrics(mut self, metrics: RuntimeMetrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// Eligible: ours, for this cluster, in a managed VPC, with the `--eni-gc-tags`,
    /// unattached and `available`.
    pub fn eligible(&self, eni: &NetworkInterface) -> bool {
        // Planted defect (dst-mutants): ownership not checked.
        (is_owned_by(eni, &self.cluster) || crate::mutants::active("touch-foreign-eni"))
            && self.vpcs.contains(&eni.vpc_id)
            && self.tags.iter().all(|(k, v)| eni.tags.get(k) == Some(v))
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
        let mut tags = self.tags.clone();
        tags.insert(CLUSTER_TAG.to_string(), self.cluster.clone());
        // Planted defect (dst-mutants): the listing no longer filters on our tag.
        if crate::mutants::active("touch-foreign-eni") {
            tags = Tags::new();
        }
        let mut listed = Vec::new();
        for vpc in &self.vpcs {
            let filter = EniFilter {
                subnet_ids: subnet_ids.to_vec(),
                vpc_id: Some(vpc.clone()),
                tags: tags.clone(),
                state: Some(EniState::Available),
                ..Default::default()
            };
            listed.extend(collect_pages(|t| ec2.describe_network_interfaces(&filter, t)).await?);
        }
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

/// Run the collector `gc` every `interval` until dropped; before each run `vpcs` says which
/// VPCs are managed now.
pub async fn run_loop<E: Ec2>(
    ec2: std::sync::Arc<E>,
    mut gc: EniGc,
    subnet_ids: Vec<String>,
    interval: Duration,
    vpcs: impl Fn() -> BTreeSet<String>,
) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        gc.set_vpcs(vpcs());
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
    use crate::cache::tests::eni;
    use crate::ipam::ownership::ownership_tags;

    fn ours(id: &str, attached: bool) -> NetworkInterface {
        let mut e = eni(id, attached.then_some(("i-1", 1)), "subnet-1");
        e.tags = ownership_tags("prod", "i-1");
        e
    }

    fn gc(cluster: &str, max: usize) -> EniGc {
        let vpc = ours("x", false).vpc_id;
        EniGc::new(cluster, max).with_vpcs([vpc])
    }

    #[test]
    fn only_the_managed_vpcs_and_the_gc_tags() {
        let mut in_vpc = ours("eni-a", false);
        let mut elsewhere = ours("eni-b", false);
        elsewhere.vpc_id = "vpc-other-cluster".into();
        let listed = [in_vpc.clone(), elsewhere];
        let mut g = gc("prod", 25);
        g.round(&listed);
        assert_eq!(g.round(&listed), ["eni-a"], "never outside the managed VPC");
        let mut none = EniGc::new("prod", 25);
        none.round(&listed);
        assert!(none.round(&listed).is_empty(), "no VPC known: nothing");
        // --eni-gc-tags narrows: only ENIs with all of them.
        let team = Tags::from([("team".to_string(), "blue".to_string())]);
        let mut tagged = gc("prod", 25).with_tags(team.clone());
        tagged.round(&[in_vpc.clone()]);
        assert!(tagged.round(&[in_vpc.clone()]).is_empty());
        in_vpc.tags.extend(team);
        tagged.round(&[in_vpc.clone()]);
        assert_eq!(tagged.round(&[in_vpc]), ["eni-a"]);
    }

    #[test]
    fn the_interval_bound_exceeds_the_worst_create_to_attach() {
        let gate = crate::ec2::gate::GateConfig::aws_defaults();
        assert!(MIN_INTERVAL > gate.throttle_deadline + gate.max_delay);
    }

    #[test]
    fn deletes_only_after_two_consecutive_sightings() {
        let mut gc = gc("prod", 25);
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
        let mut gc = gc("prod", 25);
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
        let mut gc = gc("prod", 2);
        let listed: Vec<_> = (0..5).map(|i| ours(&format!("eni-{i}"), false)).collect();
        gc.round(&listed);
        assert_eq!(gc.marked().len(), 2);
        assert_eq!(gc.round(&listed).len(), 2);
    }
}
