//! The EC2 cache: what the operator knows of the VPC, kept current by the refresher and by the
//! results of its own calls. Pure state; I/O lives in `refresher` and `executor`.
//!
//! Rules (docs/rules.md §10):
//! * a full refresh merges ENIs per instance and never drops an instance it did not return
//!   (#46513); an instance goes only when a per-instance describe finds no ENI for it, or its
//!   CiliumNode is deleted;
//! * a refresh that started before our own last change to an instance, or less than
//!   [`DESCRIBE_LAG`] after it, does not overwrite that instance (it would resurrect a state we
//!   just changed: describes lag behind mutations);
//! * our own results apply at once: created ENIs, assigned addresses merged as sets, unassigned
//!   ones removed, subnet free counts adjusted;
//! * our own `available` ENIs tagged for a managed instance (left by a throttled attach or a
//!   crash between create and attach) are kept with that instance as leftovers, so the next
//!   pass attaches one instead of creating another.
//!
//! Filters restrict where new ENIs and addresses go, never what is known about a managed
//! node's attached ENIs: with `--subnet-*-filter` every subnet of the VPC and every ENI of a
//! listed instance is still cached (the node's primary ENI must be in `status.eni.enis`, C5,
//! and its security groups are the fallback for new ENIs, Cilium #18239); the filters only
//! become [`Ec2Cache::pod_subnets`]. Memory is bounded by the managed instances (those of
//! CiliumNodes, see [`Ec2Cache::manage`]) plus the latest full listing: an instance that is
//! neither is forgotten at the next full refresh.

mod hold_back;
mod own;
pub mod refresher;
pub mod type_limits;

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use ipnet::Ipv4Net;

use crate::ec2::{
    EniState, InstanceTypeLimits, NetworkInterface, RouteTable, SecurityGroup, Subnet, Vpc,
};
use crate::ipam::ownership::{INSTANCE_TAG, is_owned_by};
use crate::ipam::{Ec2View, InstanceView};

/// How long after our own change to an instance a describe may still show the instance as it
/// was: AWS's API is eventually consistent ("Eventual consistency in the Amazon EC2 API": a
/// change "might not be immediately visible to all subsequent commands"; seconds in practice).
/// A refresh that started within this time of our change does not overwrite the instance: it
/// could bring back addresses we unassigned (the agent would be handed addresses EC2 has given
/// to another node) or drop ones we assigned. Found by `make dst` (seeds 1, 3, 4, 7, 8).
pub const DESCRIBE_LAG: Duration = Duration::from_secs(30);

/// Our own change at `local` is newer than what a listing started at `started` can be trusted
/// to show.
fn local_change_newer(local: Option<Instant>, started: Instant) -> bool {
    local.is_some_and(|t| t + DESCRIBE_LAG > started)
}

/// EC2 holds an address on one ENI: where a listing or an answer shows one on several ENIs of
/// an instance, it stays on the first (by ENI id) and leaves the others, so it counts once, as
/// the node's agent counts it. moto 5.2.5 draws addresses at random with no subnet-wide check,
/// so two ENIs of one node can share one (3 of 500 pairs of 15-address ENIs in a /17, measured):
/// counted twice, the node looked served one address short (e2e `demand-drop`, once in CI).
fn each_address_once(enis: &mut [NetworkInterface]) {
    let mut seen: BTreeSet<Ipv4Addr> = enis.iter().map(|e| e.primary_ip).collect();
    for e in enis.iter_mut() {
        e.secondary_ips.retain(|ip| seen.insert(*ip));
    }
}

/// What the cache holds for one instance.
#[derive(Clone, Debug, Default)]
pub struct InstanceEntry {
    pub enis: Vec<NetworkInterface>,
    /// A per-instance describe found no ENI: the instance is gone.
    pub gone: bool,
    /// When we last changed this instance ourselves (a refresh started earlier is stale).
    pub local_change: Option<Instant>,
    /// Attachments whose delete-on-termination flag still has to be set (eni -> attachment).
    pub pending_delete_on_termination: BTreeMap<String, String>,
    /// Our ENIs created for this instance and left `available` (not in `enis`).
    pub leftovers: Vec<NetworkInterface>,
    /// What we unassigned from this instance's ENIs less than [`DESCRIBE_LAG`] ago: a describe
    /// may still show it (see [`Ec2Cache::recently_unassigned`]).
    pub unassigned: Vec<Unassigned>,
    /// Addresses and prefixes on `enis` that only a listing started in the first
    /// [`DESCRIBE_LAG`] of this leadership has shown (and we did not assign ourselves): the
    /// previous leader may have unassigned them just before it stopped (§14.1).
    pub unconfirmed_ips: BTreeSet<Ipv4Addr>,
    pub unconfirmed_prefixes: BTreeSet<Ipv4Net>,
    /// When the listing that gave `enis` started (what it can show is older than that by up to
    /// [`DESCRIBE_LAG`]).
    pub listed_at: Option<Instant>,
}

/// Addresses and prefixes we unassigned from one ENI, and when.
#[derive(Clone, Debug)]
pub struct Unassigned {
    pub eni_id: String,
    pub at: Instant,
    pub ips: Vec<Ipv4Addr>,
    pub prefixes: Vec<Ipv4Net>,
}

/// Everything a full refresh lists, taken at `started`.
#[derive(Clone, Debug)]
pub struct FullSnapshot {
    pub started: Instant,
    pub subnets: Vec<Subnet>,
    pub vpcs: Vec<Vpc>,
    pub security_groups: Vec<SecurityGroup>,
    pub route_tables: Vec<RouteTable>,
    pub enis: Vec<NetworkInterface>,
    /// Subnets matching `--subnet-ids-filter`/`--subnet-tags-filter`; `None`: no filter.
    pub pod_subnets: Option<BTreeSet<String>>,
    /// Instances carrying the `--instance-tags-filter` tags; `None`: no filter.
    pub tagged_instances: Option<BTreeSet<String>>,
}

#[derive(Clone, Debug, Default)]
pub struct Ec2Cache {
    pub subnets: BTreeMap<String, Subnet>,
    pub vpcs: BTreeMap<String, Vpc>,
    pub security_groups: BTreeMap<String, SecurityGroup>,
    pub route_tables: Vec<RouteTable>,
    pub limits: BTreeMap<String, InstanceTypeLimits>,
    pub instances: BTreeMap<String, InstanceEntry>,
    pub prefix_cooldown: BTreeMap<String, Instant>,
    /// The last full refresh succeeded. False blocks every mutation (§1.2).
    pub healthy: bool,
    pub last_full_refresh: Option<Instant>,
    /// `--cluster-name`: which unattached ENIs are ours to keep as leftovers.
    pub cluster: String,
    /// Subnets new ENIs and addresses may use (the operator's subnet filters); `None`: any.
    pub pod_subnets: Option<BTreeSet<String>>,
    /// Instances of the CiliumNodes the core holds: kept even when a listing misses them.
    managed: BTreeSet<String>,
    /// `--instance-tags-filter`: which instances carry the tags, as far as known.
    instance_tags: Option<InstanceTags>,
    /// `--aws-instance-limit-mapping`: these types' counts win over EC2 and the built-in table.
    limit_overrides: BTreeMap<String, crate::ec2::limits::LimitOverride>,
    /// Listings that started before this may not show the previous leader's last calls yet
    /// (the start of this leadership plus [`DESCRIBE_LAG`], §14.1).
    trust_listings_from: Option<Instant>,
    /// Instances we changed less than [`DESCRIBE_LAG`] ago whose CiliumNode went, as we knew
    /// them then. A listing started within the lag of our change must not bring them back as
    /// EC2 showed them before it (`make dst` seed 171: the finalizer detached an ENI, the Node
    /// came back, and a lagging describe had the new CiliumNode pooled the detached ENI's
    /// addresses); a new CiliumNode naming one gets it back as it was, so it is served at once
    /// with the ENIs it had, not after the lag (issue 29 item 6, the e2e `node-reregister`).
    forgotten: BTreeMap<String, InstanceEntry>,
}

/// What is known of the instances' tags under `--instance-tags-filter`.
#[derive(Clone, Debug, Default)]
struct InstanceTags {
    tagged: BTreeSet<String>,
    /// Managed instances known to lack the tags.
    untagged: BTreeSet<String>,
}

/// `items` keyed by their id.
fn by_id<T>(items: Vec<T>, id: fn(&T) -> &String) -> BTreeMap<String, T> {
    items.into_iter().map(|t| (id(&t).clone(), t)).collect()
}

impl Ec2Cache {
    pub fn new() -> Self {
        Self::default()
    }

    /// A cache that keeps this cluster's unattached ENIs as leftovers of their instance.
    pub fn for_cluster(cluster: impl Into<String>) -> Self {
        Self {
            cluster: cluster.into(),
            ..Self::default()
        }
    }

    /// Apply a successful full refresh.
    pub fn apply_full(&mut self, snap: FullSnapshot) {
        self.subnets = by_id(snap.subnets, |s| &s.id);
        self.pod_subnets = snap.pod_subnets;
        self.vpcs = by_id(snap.vpcs, |v| &v.id);
        self.security_groups = by_id(snap.security_groups, |g| &g.id);
        self.route_tables = snap.route_tables;
        let mut by_instance: BTreeMap<String, Vec<NetworkInterface>> = BTreeMap::new();
        let mut leftovers: BTreeMap<String, Vec<NetworkInterface>> = BTreeMap::new();
        for eni in snap.enis {
            if let Some(id) = eni.instance_id() {
                by_instance.entry(id.to_string()).or_default().push(eni);
            } else if let Some(id) = self.leftover_of(&eni) {
                leftovers.entry(id).or_default().push(eni);
            }
        }
        if let Some(tagged) = snap.tagged_instances {
            // Instances without the tags are not ours to manage: not cached unless a
            // CiliumNode names them (then the core needs to know they are out of scope).
            by_instance.retain(|id, _| tagged.contains(id) || self.managed.contains(id));
            let untagged = self
                .managed
                .iter()
                .filter(|id| !tagged.contains(*id))
                .cloned()
                .collect();
            self.instance_tags = Some(InstanceTags { tagged, untagged });
        } else {
            self.instance_tags = None;
        }
        // Neither managed nor in this listing: forget (the cache must not keep every instance
        // it ever saw).
        self.forgotten
            .retain(|_, e| local_change_newer(e.local_change, snap.started));
        self.instances
            .retain(|id, _| self.managed.contains(id) || by_instance.contains_key(id));
        for (id, enis) in by_instance {
            self.replace_instance(&id, enis, snap.started);
        }
        // Only for managed instances; other unattached ENIs are the GC's business.
        for (id, entry) in &mut self.instances {
            if !local_change_newer(entry.local_change, snap.started) {
                entry.leftovers = leftovers.remove(id).unwrap_or_default();
            }
        }
        self.healthy = true;
        self.last_full_refresh = Some(snap.started);
    }

    /// The instance an unattached ENI of ours was created for, if it is a leftover.
    fn leftover_of(&self, eni: &NetworkInterface) -> Option<String> {
        (eni.attachment.is_none()
            && eni.state == EniState::Available
            && is_owned_by(eni, &self.cluster))
        .then(|| eni.tags.get(INSTANCE_TAG).cloned())
        .flatten()
    }

    /// A CiliumNode names this instance: keep it across listings that miss it (#46513).
    pub fn manage(&mut self, id: &str) {
        if !id.is_empty() && !self.managed.contains(id) {
            self.managed.insert(id.to_string());
            if !self.instances.contains_key(id)
                && let Some(entry) = self.forgotten.remove(id)
            {
                self.instances.insert(id.to_string(), entry);
            }
        }
    }

    /// How many instances CiliumNodes name.
    pub fn managed_count(&self) -> usize {
        self.managed.len()
    }

    /// A CiliumNode we admitted names this instance.
    pub fn manages(&self, id: &str) -> bool {
        self.managed.contains(id)
    }

    /// The VPCs of the managed instances' ENIs (to scope the full listing when `--vpc-id` is
    /// not given, Cilium #41392).
    pub fn managed_vpcs(&self) -> BTreeSet<String> {
        self.managed
            .iter()
            .filter_map(|id| self.instances.get(id))
            .flat_map(|e| e.enis.iter().map(|n| n.vpc_id.clone()))
            .filter(|v| !v.is_empty())
            .collect()
    }

    /// Record which of `checked` carry the `--instance-tags-filter` tags (`tagged`).
    pub fn set_instance_tags(&mut self, checked: &[String], tagged: &BTreeSet<String>) {
        let Some(t) = self.instance_tags.as_mut() else {
            return;
        };
        for id in checked {
            if tagged.contains(id) {
                t.untagged.remove(id);
                t.tagged.insert(id.clone());
            } else {
                t.tagged.remove(id);
                t.untagged.insert(id.clone());
            }
        }
    }

    /// Whether the operator manages this instance under `--instance-tags-filter`: `None` while
    /// its tags are not known yet. Always `Some(true)` without the filter.
    pub fn in_scope(&self, id: &str) -> Option<bool> {
        let Some(t) = &self.instance_tags else {
            return Some(true);
        };
        if id.is_empty() || t.tagged.contains(id) {
            Some(true)
        } else if t.untagged.contains(id) {
            Some(false)
        } else {
            None
        }
    }

    /// A full refresh failed: block mutations until the next one succeeds.
    pub fn mark_unhealthy(&mut self) {
        self.healthy = false;
    }

    /// Apply a per-instance describe of `requested` instances, started at `started`. Requested
    /// instances without ENIs are marked gone.
    pub fn apply_instances(
        &mut self,
        requested: &[String],
        enis: Vec<NetworkInterface>,
        started: Instant,
    ) {
        let mut by_instance: BTreeMap<String, Vec<NetworkInterface>> = requested
            .iter()
            .map(|id| (id.clone(), Vec::new()))
            .collect();
        for eni in enis {
            if let Some(id) = eni.instance_id()
                && let Some(list) = by_instance.get_mut(id)
            {
                list.push(eni);
            }
        }
        for (id, enis) in by_instance {
            self.replace_instance(&id, enis, started);
        }
    }

    fn replace_instance(&mut self, id: &str, mut enis: Vec<NetworkInterface>, started: Instant) {
        let early = self.trust_listings_from.is_some_and(|t| started < t)
            && !crate::mutants::active("trust-lagging-describe");
        let forgotten = self.forgotten.remove(id);
        let known = self.instances.contains_key(id);
        let entry = self.instances.entry(id.to_string()).or_default();
        match forgotten {
            Some(f) if !known => *entry = f,
            Some(f) => entry.local_change = entry.local_change.max(f.local_change),
            None => {}
        }
        if local_change_newer(entry.local_change, started) {
            // Our own change is newer than this listing (or too recent for it to show).
            return;
        }
        enis.sort_by(|a, b| a.id.cmp(&b.id));
        each_address_once(&mut enis);
        entry.listed_at = Some(started);
        // Early in a leadership, what the listing shows is not confirmed yet (§14.1); a later
        // listing replaces the ENIs and confirms (or drops) all of it.
        entry.unconfirmed_ips.clear();
        entry.unconfirmed_prefixes.clear();
        if early {
            for e in &enis {
                entry
                    .unconfirmed_ips
                    .extend(e.secondary_ips.iter().copied());
                entry
                    .unconfirmed_prefixes
                    .extend(e.prefixes.iter().copied());
            }
        }
        entry.gone = enis.is_empty();
        // A pending flag whose ENI is gone or already flagged needs no retry.
        entry.pending_delete_on_termination.retain(|eni, _| {
            enis.iter().any(|e| {
                &e.id == eni
                    && e.attachment
                        .as_ref()
                        .is_some_and(|a| !a.delete_on_termination)
            })
        });
        // A per-instance describe cannot see unattached ENIs: keep those not attached now.
        entry
            .leftovers
            .retain(|l| enis.iter().all(|e| e.id != l.id));
        entry.enis = enis;
    }

    /// The finalizer is releasing (detaching and deleting) these ENIs of the instance: they
    /// are not the node's from now on, whatever a listing started before `now + DESCRIBE_LAG`
    /// shows (a timeout can hide a detach that took effect).
    pub fn releasing(
        &mut self,
        id: &str,
        now: Instant,
        released: impl Fn(&NetworkInterface) -> bool,
    ) {
        let entry = self.instances.entry(id.to_string()).or_default();
        entry.local_change = entry.local_change.max(Some(now));
        entry.enis.retain(|e| !released(e));
        entry.leftovers.retain(|e| !released(e));
    }

    /// Forget an instance (its CiliumNode was deleted), but not while our last change to it
    /// may still be hidden by the describe lag (see `forgotten`).
    pub fn drop_instance(&mut self, id: &str) {
        if let Some(e) = self.instances.remove(id)
            && e.local_change.is_some()
        {
            self.forgotten.insert(id.to_string(), e);
        }
        self.managed.remove(id);
        if let Some(t) = self.instance_tags.as_mut() {
            t.tagged.remove(id);
            t.untagged.remove(id);
        }
    }

    pub fn instance(&self, id: &str) -> Option<&InstanceEntry> {
        self.instances.get(id)
    }

    /// Whether a node on this instance should get a targeted refresh before planning.
    pub fn needs_instance_refresh(&self, id: &str) -> bool {
        match self.instances.get(id) {
            None => true,
            Some(e) if e.gone => false,
            // Under --instance-tags-filter the per-instance refresh also checks the tags.
            Some(e) => e.enis.is_empty() || self.in_scope(id).is_none(),
        }
    }

    /// The view the engine plans against.
    pub fn view<'a>(&'a self, instance_id: &str, instance_type: &str) -> Ec2View<'a> {
        let instance = match self.instances.get(instance_id) {
            None => InstanceView::Unknown,
            Some(e) if e.gone => InstanceView::Gone,
            Some(e) if e.enis.is_empty() => InstanceView::Unknown,
            Some(e) => InstanceView::Known {
                instance: None,
                enis: &e.enis,
            },
        };
        Ec2View {
            instance,
            limits: self.limits.get(instance_type),
            subnets: &self.subnets,
            vpcs: &self.vpcs,
            security_groups: &self.security_groups,
            route_tables: &self.route_tables,
            prefix_cooldown: &self.prefix_cooldown,
            pod_subnets: self.pod_subnets.as_ref(),
        }
    }
}

/// The lowest free device index above `after` on an instance with `used` indices.
pub fn next_free_index(used: &BTreeSet<u32>, after: u32) -> u32 {
    let mut i = after + 1;
    while used.contains(&i) {
        i += 1;
    }
    i
}

#[cfg(test)]
pub(crate) mod tests;
