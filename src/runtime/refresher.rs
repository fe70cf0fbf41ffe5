//! Keeps the [`Ec2Cache`] current: full refreshes on an interval, batched per-instance
//! refreshes, and the limits of instance types (only the type asked for).
//!
//! Call counts do not grow with the number of nodes: a full refresh lists ENIs by VPC (and
//! subnet) filters, page by page; per-instance refreshes are batched into one
//! `attachment.instance-id` describe per [`INSTANCE_BATCH`] instances, and each instance is
//! refreshed at most once per `min_spacing` after our own changes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use crate::ec2::{Ec2, EniFilter, ResourceFilter, Result, Tags, collect_pages};

use super::cache::{Ec2Cache, FullSnapshot};

/// At most this many instance IDs in one `attachment.instance-id` filter (AWS allows 200
/// values per filter).
pub const INSTANCE_BATCH: usize = 200;

/// What the operator's cache covers.
#[derive(Clone, Debug, Default)]
pub struct Scope {
    /// The operator's VPC; `None` lists every VPC.
    pub vpc_id: Option<String>,
    /// `--subnet-ids-filter`.
    pub subnet_ids: Vec<String>,
    /// `--subnet-tags-filter`.
    pub subnet_tags: Tags,
}

impl Scope {
    fn filtered_subnets(&self) -> bool {
        !self.subnet_ids.is_empty() || !self.subnet_tags.is_empty()
    }
}

pub struct Refresher<E> {
    ec2: Arc<E>,
    cache: Arc<RwLock<Ec2Cache>>,
    scope: Scope,
    min_spacing: Duration,
    last_instance_refresh: Mutex<HashMap<String, Instant>>,
}

fn now() -> Instant {
    tokio::time::Instant::now().into_std()
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

    pub fn cache(&self) -> &Arc<RwLock<Ec2Cache>> {
        &self.cache
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

    async fn list_all(&self) -> Result<FullSnapshot> {
        let started = now();
        let ec2 = &*self.ec2;
        let by_vpc = ResourceFilter {
            vpc_id: self.scope.vpc_id.clone(),
            ..Default::default()
        };
        let vpcs = collect_pages(|t| ec2.describe_vpcs(&by_vpc, t)).await?;
        let subnet_filter = ResourceFilter {
            ids: self.scope.subnet_ids.clone(),
            vpc_id: self.scope.vpc_id.clone(),
            tags: self.scope.subnet_tags.clone(),
        };
        let subnets = collect_pages(|t| ec2.describe_subnets(&subnet_filter, t)).await?;
        let security_groups = collect_pages(|t| ec2.describe_security_groups(&by_vpc, t)).await?;
        let route_tables = collect_pages(|t| ec2.describe_route_tables(&by_vpc, t)).await?;
        let eni_filter = EniFilter {
            vpc_id: self.scope.vpc_id.clone(),
            subnet_ids: if self.scope.filtered_subnets() {
                subnets.iter().map(|s| s.id.clone()).collect()
            } else {
                Vec::new()
            },
            ..Default::default()
        };
        let enis = if self.scope.filtered_subnets() && eni_filter.subnet_ids.is_empty() {
            Vec::new()
        } else {
            collect_pages(|t| ec2.describe_network_interfaces(&eni_filter, t)).await?
        };
        Ok(FullSnapshot {
            started,
            subnets,
            vpcs,
            security_groups,
            route_tables,
            enis,
        })
    }

    /// Refresh these instances (batched). With `respect_spacing`, instances refreshed less than
    /// `min_spacing` ago are skipped. Returns the instances actually refreshed.
    pub async fn instances(&self, ids: &[String], respect_spacing: bool) -> Result<Vec<String>> {
        let started = now();
        let ids: Vec<String> = {
            let mut last = self.last_instance_refresh.lock().expect("spacing lock");
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
        for chunk in ids.chunks(INSTANCE_BATCH) {
            let filter = EniFilter {
                instance_ids: chunk.to_vec(),
                ..Default::default()
            };
            let enis = collect_pages(|t| self.ec2.describe_network_interfaces(&filter, t)).await?;
            self.cache
                .write()
                .expect("cache lock")
                .apply_instances(chunk, enis, started);
        }
        Ok(ids)
    }

    /// Load limits: every type (`types` empty) or just the ones given.
    pub async fn instance_types(&self, types: &[String]) -> Result<()> {
        let limits = collect_pages(|t| self.ec2.describe_instance_types(types, t)).await?;
        self.cache.write().expect("cache lock").set_limits(limits);
        Ok(())
    }

    /// Forget spacing state of an instance (node deleted).
    pub fn forget(&self, instance_id: &str) {
        self.last_instance_refresh
            .lock()
            .expect("spacing lock")
            .remove(instance_id);
    }
}
