//! A new leadership's hold-back (§14.1): listings from its first [`DESCRIBE_LAG`] may still
//! show addresses the previous leader unassigned, so a pass plans without them.

use std::net::Ipv4Addr;
use std::time::Instant;

use ipnet::Ipv4Net;

use crate::ec2::NetworkInterface;
use crate::ipam::{Ec2View, InstanceView};

use super::{DESCRIBE_LAG, Ec2Cache};

impl Ec2Cache {
    /// This leadership began at `now`: listings that start less than [`DESCRIBE_LAG`] after it
    /// may still show addresses the previous leader unassigned (found by `make dst`, seed 25).
    pub fn begin_leadership(&mut self, now: Instant) {
        self.trust_listings_from = Some(now + DESCRIBE_LAG);
    }

    /// Whether any listed address or prefix still waits for confirmation (§14.1).
    pub fn holds_back(&self) -> bool {
        self.instances
            .values()
            .any(|e| !e.unconfirmed_ips.is_empty() || !e.unconfirmed_prefixes.is_empty())
    }

    /// When listings become trustworthy for this leadership (`None`: always were).
    pub fn trust_listings_from(&self) -> Option<Instant> {
        self.trust_listings_from
    }

    /// The ENIs of `instance_id` without the addresses held back (§14.1): those only a listing
    /// from the first [`DESCRIBE_LAG`] of this leadership shows, that the node's pool (`in_pool`)
    /// does not have. `None`: nothing is held back (use [`Ec2Cache::view`] as it is).
    pub fn held_back_enis(
        &self,
        instance_id: &str,
        in_pool: impl Fn(&Ipv4Addr) -> bool,
    ) -> Option<Vec<NetworkInterface>> {
        let entry = self.instances.get(instance_id)?;
        if entry.unconfirmed_ips.is_empty() && entry.unconfirmed_prefixes.is_empty() {
            return None;
        }
        let held_ip = |ip: &Ipv4Addr| entry.unconfirmed_ips.contains(ip) && !in_pool(ip);
        let held_prefix =
            |p: &Ipv4Net| entry.unconfirmed_prefixes.contains(p) && !p.hosts().any(|a| in_pool(&a));
        let any = entry
            .enis
            .iter()
            .any(|e| e.secondary_ips.iter().any(held_ip) || e.prefixes.iter().any(held_prefix));
        if !any {
            return None;
        }
        let mut enis = entry.enis.clone();
        for e in &mut enis {
            e.secondary_ips.retain(|ip| !held_ip(ip));
            e.prefixes.retain(|p| !held_prefix(p));
        }
        Some(enis)
    }

    /// [`Ec2Cache::view`] with the instance's ENIs replaced by `enis` (see
    /// [`Ec2Cache::held_back_enis`]).
    pub fn view_with<'a>(
        &'a self,
        instance_id: &str,
        instance_type: &str,
        enis: Option<&'a [NetworkInterface]>,
    ) -> Ec2View<'a> {
        let mut view = self.view(instance_id, instance_type);
        if let (Some(enis), InstanceView::Known { enis: e, .. }) = (enis, &mut view.instance) {
            *e = enis;
        }
        view
    }
}
