//! Keeps the [`Ec2Cache`] current: full refreshes on an interval, batched per-instance
//! refreshes, and the limits of instance types (only the type asked for).
//!
//! Call counts do not grow with the number of nodes: a full refresh lists ENIs by VPC (and
//! subnet) filters, page by page; per-instance refreshes are batched into one
//! `attachment.instance-id` describe per [`INSTANCE_BATCH`] instances, and each instance is
//! refreshed at most once per `min_spacing` after our own changes.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use crate::ec2::{
    Ec2, EniFilter, InstanceFilter, ResourceFilter, Result, Subnet, Tags, collect_pages,
};

use crate::cache::{Ec2Cache, FullSnapshot};
use crate::clock::now;

/// At most this many instance IDs in one `attachment.instance-id` filter (AWS allows 200
/// values per filter).
pub const INSTANCE_BATCH: usize = 200;

/// What the operator's cache covers.
#[derive(Clone, Debug, Default)]
pub struct Scope {
    /// `--vpc-id`; `None`: learned from the managed nodes (see [`Refresher::full`]).
    pub vpc_id: Option<String>,
    /// `--subnet-ids-filter`.
    pub subnet_ids: Vec<String>,
    /// `--subnet-tags-filter`.
    pub subnet_tags: Tags,
    /// `--instance-tags-filter`: only instances carrying all these tags are managed.
    pub instance_tags: Tags,
}

impl Scope {
    fn filtered_subnets(&self) -> bool {
        !self.subnet_ids.is_empty() || !self.subnet_tags.is_empty()
    }

    /// The subnets matching the subnet filters (both must match when both are set); `None`
    /// without filters.
    fn pod_subnets(&self, subnets: &[Subnet]) -> Option<BTreeSet<String>> {
        self.filtered_subnets().then(|| {
            subnets
                .iter()
                .filter(|s| self.subnet_ids.is_empty() || self.subnet_ids.contains(&s.id))
                .filter(|s| {
                    self.subnet_tags
                        .iter()
                        .all(|(k, v)| s.tags.get(k) == Some(v))
                })
                .map(|s| s.id.clone())
                .collect()
        })
    }
}

pub struct Refresher<E> {
    ec2: Arc<E>,
    cache: Arc<RwLock<Ec2Cache>>,
    scope: Scope,
    min_spacing: Duration,
    last_instance_refresh: Mutex<HashMap<String, Instant>>,
}

impl<E: Ec2> Refresher<E> {
    pub fn new(
        ec2: Arc<E>,
        cache: Arc<RwLock<Ec2Cache>>,
        scope: Scope,
        min_spacing: Duration,
    ) -> Self {
        Self {
            ec2,
            cache,
            scope,
            min_spacing,
            last_instance_refresh: Mutex::new(HashMap::new()),
        }
    }

    /// One full refresh. On failure the cache is marked unhealthy (mutations blocked).
    pub async fn full(&self) -> Result<()> {
        match self.list_all().await {
            Ok(snap) => {
                self.cache.write().expect("cache lock").apply_full(snap);
                Ok(())
            }
            Err(e) => {
                self.cache.write().expect("cache lock").mark_unhealthy();
                Err(e)
            }
        }
    }

    /// The VPC the full listing is scoped to: `--vpc-id`, else the one VPC of the managed
    /// nodes' ENIs. Without it every ENI of the Region is listed each minute (Cilium #41392,
    /// where the operator reads its VPC from IMDS and lists everything when that fails). The
    /// managed nodes' VPC is known after their first per-instance refresh; nodes in several
    /// VPCs leave the listing unscoped.
    pub fn vpc_scope(&self) -> Option<String> {
        if let Some(v) = &self.scope.vpc_id {
            return Some(v.clone());
        }
        let vpcs = self.cache.read().expect("cache lock").managed_vpcs();
        if vpcs.len() == 1 {
            vpcs.into_iter().next()
        } else {
            None
        }
    }

    async fn list_all(&self) -> Result<FullSnapshot> {
        let started = now();
        let ec2 = &*self.ec2;
        let known_vpc = self.vpc_scope();
        // Every subnet of the VPC, not just the filtered ones: a node's other ENIs (its
        // primary ENI in the node subnet) must stay complete in status (C4, C5).
        let subnet_filter = ResourceFilter {
            vpc_id: known_vpc.clone(),
            ..Default::default()
        };
        let mut subnets = collect_pages(|t| ec2.describe_subnets(&subnet_filter, t)).await?;
        let pod_subnets = self.scope.pod_subnets(&subnets);
        // Not learned yet: the filtered subnets name the VPC when they share one.
        let vpc_id = known_vpc.or_else(|| {
            let vpcs: BTreeSet<&str> = subnets
                .iter()
                .filter(|s| pod_subnets.as_ref().is_some_and(|p| p.contains(&s.id)))
                .map(|s| s.vpc_id.as_str())
                .collect();
            (vpcs.len() == 1).then(|| vpcs.into_iter().next().unwrap_or_default().to_string())
        });
        if let Some(v) = &vpc_id {
            subnets.retain(|s| &s.vpc_id == v);
        }
        let by_vpc = ResourceFilter {
            vpc_id: vpc_id.clone(),
            ..Default::default()
        };
        let vpcs = collect_pages(|t| ec2.describe_vpcs(&by_vpc, t)).await?;
        let security_groups = collect_pages(|t| ec2.describe_security_groups(&by_vpc, t)).await?;
        let route_tables = collect_pages(|t| ec2.describe_route_tables(&by_vpc, t)).await?;
        let tagged_instances = if self.scope.instance_tags.is_empty() {
            None
        } else {
            let filter = InstanceFilter {
                vpc_id: vpc_id.clone(),
                tags: self.scope.instance_tags.clone(),
                ..Default::default()
            };
            let instances = collect_pages(|t| ec2.describe_instances(&filter, t)).await?;
            Some(instances.into_iter().map(|i| i.id).collect())
        };
        // Not narrowed by the subnet filters: they say where new ENIs go, not which of a
        // node's ENIs exist.
        let eni_filter = EniFilter {
            vpc_id,
            ..Default::default()
        };
        let enis = collect_pages(|t| ec2.describe_network_interfaces(&eni_filter, t)).await?;
        Ok(FullSnapshot {
            started,
            subnets,
            vpcs,
            security_groups,
            route_tables,
            enis,
            pod_subnets,
            tagged_instances,
        })
    }

    /// Refresh these instances (batched). With `respect_spacing`, instances refreshed less than
    /// `min_spacing` ago are skipped. Returns the instances actually refreshed.
    pub async fn instances(&self, ids: &[String], respect_spacing: bool) -> Result<Vec<String>> {
        let started = now();
        let ids: Vec<String> = {
            let mut last = self.last_instance_refresh.lock().expect("spacing lock");
            // An entry older than the spacing no longer holds anything back: drop it, so the
            // map only holds recently refreshed instances (never every instance ever seen).
            last.retain(|_, t| started.duration_since(*t) < self.min_spacing);
            let mut chosen = Vec::new();
            for id in ids {
                let due = !respect_spacing
                    || last
                        .get(id)
                        .is_none_or(|t| started.duration_since(*t) >= self.min_spacing);
                if due {
                    last.insert(id.clone(), started);
                    chosen.push(id.clone());
                }
            }
            chosen
        };
        let check_tags = !self.scope.instance_tags.is_empty();
        for chunk in ids.chunks(INSTANCE_BATCH) {
            let filter = EniFilter {
                instance_ids: chunk.to_vec(),
                ..Default::default()
            };
            let enis = collect_pages(|t| self.ec2.describe_network_interfaces(&filter, t)).await?;
            let tagged = if check_tags {
                self.tagged(&enis).await
            } else {
                None
            };
            let mut cache = self.cache.write().expect("cache lock");
            if let Some((checked, tagged)) = tagged {
                cache.set_instance_tags(&checked, &tagged);
            }
            cache.apply_instances(chunk, enis, started);
        }
        Ok(ids)
    }

    /// Which instances with these ENIs carry the `--instance-tags-filter` tags: (checked,
    /// tagged). Only instances with ENIs are asked about (a long-gone ID fails the whole
    /// `DescribeInstances`); on an error they stay unknown until the next full refresh.
    async fn tagged(
        &self,
        enis: &[crate::ec2::NetworkInterface],
    ) -> Option<(Vec<String>, BTreeSet<String>)> {
        let checked: Vec<String> = enis
            .iter()
            .filter_map(|e| e.instance_id())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .map(str::to_string)
            .collect();
        if checked.is_empty() {
            return None;
        }
        let filter = InstanceFilter {
            ids: checked.clone(),
            tags: self.scope.instance_tags.clone(),
            ..Default::default()
        };
        match collect_pages(|t| self.ec2.describe_instances(&filter, t)).await {
            Ok(found) => Some((checked, found.into_iter().map(|i| i.id).collect())),
            Err(e) => {
                tracing::debug!(error = %e, "instance tag check failed");
                None
            }
        }
    }

    /// Load limits: every type (`types` empty) or just the ones given.
    pub async fn instance_types(&self, types: &[String]) -> Result<()> {
        let limits = collect_pages(|t| self.ec2.describe_instance_types(types, t)).await?;
        self.cache.write().expect("cache lock").set_limits(limits);
        Ok(())
    }

    /// How many instances it keeps a refresh time for.
    pub fn spaced(&self) -> usize {
        self.last_instance_refresh
            .lock()
            .expect("spacing lock")
            .len()
    }

    /// Forget spacing state of an instance (node deleted).
    pub fn forget(&self, instance_id: &str) {
        self.last_instance_refresh
            .lock()
            .expect("spacing lock")
            .remove(instance_id);
    }
}
