//! What the cache learns outside a describe: instance-type limits and overrides, prefix
//! cool-downs, and the results of our own EC2 calls, applied at once (the executor's writes).

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::time::Instant;

use ipnet::Ipv4Net;

use crate::ec2::{
    Assigned, Attachment, EniState, InstanceTypeLimits, NetworkInterface, PREFIX_SIZE,
};

use super::{
    DESCRIBE_LAG, Ec2Cache, InstanceEntry, Unassigned, each_address_once, local_change_newer,
};

impl Ec2Cache {
    pub fn set_limits(&mut self, limits: impl IntoIterator<Item = InstanceTypeLimits>) {
        for l in limits {
            let l = match self.limit_overrides.get(&l.instance_type) {
                Some(o) => o.apply(Some(&l)),
                None => l,
            };
            self.limits.insert(l.instance_type.clone(), l);
        }
    }

    /// Pin `--aws-instance-limit-mapping` entries: applied now (on top of what is known, e.g.
    /// the built-in table) and to every later [`Self::set_limits`].
    pub fn set_limit_overrides(
        &mut self,
        overrides: impl IntoIterator<Item = crate::ec2::limits::LimitOverride>,
    ) {
        for o in overrides {
            let l = o.apply(self.limits.get(&o.instance_type));
            self.limits.insert(l.instance_type.clone(), l);
            self.limit_overrides.insert(o.instance_type.clone(), o);
        }
    }

    pub fn set_prefix_cooldown(&mut self, subnet_id: &str, now: Instant) {
        self.prefix_cooldown.insert(subnet_id.to_string(), now);
    }

    fn find_eni_mut(&mut self, eni_id: &str) -> Option<(&mut InstanceEntry, usize)> {
        self.instances.values_mut().find_map(|e| {
            let i = e.enis.iter().position(|n| n.id == eni_id)?;
            Some((e, i))
        })
    }

    fn adjust_subnet(&mut self, subnet_id: &str, delta: i64) {
        if let Some(s) = self.subnets.get_mut(subnet_id) {
            let v = i64::from(s.available_addresses) + delta;
            s.available_addresses = u32::try_from(v.max(0)).unwrap_or(u32::MAX);
        }
    }

    /// Our ENI was created and attached: add it to its instance.
    pub fn add_attached_eni(
        &mut self,
        mut eni: NetworkInterface,
        attachment: Attachment,
        now: Instant,
    ) {
        let instance = attachment.instance_id.clone();
        let was_leftover = self
            .instances
            .get(&instance)
            .is_some_and(|e| e.leftovers.iter().any(|l| l.id == eni.id));
        if !was_leftover {
            // A leftover's addresses were taken from the subnet when it was created.
            let taken = 1 + eni.secondary_ips.len() as i64 + eni.prefixes.len() as i64 * 16;
            self.adjust_subnet(&eni.subnet_id.clone(), -taken);
        }
        eni.state = EniState::InUse;
        eni.attachment = Some(attachment);
        let entry = self.instances.entry(instance).or_default();
        entry.leftovers.retain(|e| e.id != eni.id);
        entry.gone = false;
        entry.local_change = Some(now);
        entry.enis.retain(|e| e.id != eni.id);
        entry.enis.push(eni);
        entry.enis.sort_by(|a, b| a.id.cmp(&b.id));
        each_address_once(&mut entry.enis);
    }

    /// Our new ENI could not be attached yet (throttled, no answer): keep it as a leftover of
    /// the instance so the next pass attaches it instead of creating another.
    pub fn add_leftover(&mut self, instance_id: &str, eni: NetworkInterface, now: Instant) {
        let Some(entry) = self.instances.get_mut(instance_id) else {
            return;
        };
        if entry.leftovers.iter().any(|e| e.id == eni.id) {
            // Known already: not a change (and no reason to hold off refreshes).
            return;
        }
        entry.local_change = Some(now);
        let taken = 1 + eni.secondary_ips.len() as i64 + eni.prefixes.len() as i64 * 16;
        let subnet = eni.subnet_id.clone();
        entry.leftovers.push(eni);
        self.adjust_subnet(&subnet, -taken);
    }

    /// A leftover was deleted or turned out not to exist.
    pub fn remove_leftover(&mut self, eni_id: &str) {
        for e in self.instances.values_mut() {
            e.leftovers.retain(|l| l.id != eni_id);
        }
    }

    /// An attached ENI by ID.
    pub fn eni(&self, eni_id: &str) -> Option<&NetworkInterface> {
        self.instances
            .values()
            .find_map(|e| e.enis.iter().find(|n| n.id == eni_id))
    }

    /// Our unattached ENIs kept for an instance.
    pub fn leftovers(&self, instance_id: &str) -> &[NetworkInterface] {
        self.instances
            .get(instance_id)
            .map_or(&[], |e| e.leftovers.as_slice())
    }

    /// An assign succeeded: merge what EC2 reports as a set (emulators may list everything).
    /// Returns how many prefixes were new to the ENI (an emulator may grant none).
    pub fn merge_assigned(&mut self, eni_id: &str, assigned: &Assigned, now: Instant) -> usize {
        let Some((entry, i)) = self.find_eni_mut(eni_id) else {
            return 0;
        };
        entry.local_change = Some(now);
        // EC2's answer names them: ours, not the lagging describe's.
        for ip in &assigned.ips {
            entry.unconfirmed_ips.remove(ip);
        }
        for p in &assigned.prefixes {
            entry.unconfirmed_prefixes.remove(p);
        }
        let eni = &mut entry.enis[i];
        let mut ips: BTreeSet<Ipv4Addr> = eni.secondary_ips.iter().copied().collect();
        let mut prefixes: BTreeSet<Ipv4Net> = eni.prefixes.iter().copied().collect();
        let before = ips.len() as i64 + prefixes.len() as i64 * i64::from(PREFIX_SIZE);
        ips.extend(
            assigned
                .ips
                .iter()
                .copied()
                .filter(|ip| *ip != eni.primary_ip),
        );
        let prefixes_before = prefixes.len();
        prefixes.extend(assigned.prefixes.iter().copied());
        let new_prefixes = prefixes.len() - prefixes_before;
        let after = ips.len() as i64 + prefixes.len() as i64 * i64::from(PREFIX_SIZE);
        eni.secondary_ips = ips.into_iter().collect();
        eni.prefixes = prefixes.into_iter().collect();
        let subnet = eni.subnet_id.clone();
        self.adjust_subnet(&subnet, before - after);
        self.drop_elsewhere(eni_id, assigned);
        new_prefixes
    }

    /// EC2 holds an address on one ENI only: what an assign's answer names is no longer on any
    /// other ENI of the instance, whatever a lagging listing showed (`make dst` seed 350: an
    /// address unassigned from one ENI right before a crash was assigned to another ENI of the
    /// node; the listing still showed it on the first, and the pool named that ENI). Another
    /// instance's lagging copy needs no pass here: it was unassigned only after that node's
    /// agent gave it up, so §14.1 holds it back (and a scan of every instance per assign would
    /// cost thousands of ENIs at scale).
    fn drop_elsewhere(&mut self, eni_id: &str, assigned: &Assigned) {
        let Some((entry, _)) = self.find_eni_mut(eni_id) else {
            return;
        };
        for eni in entry.enis.iter_mut().filter(|e| e.id != eni_id) {
            eni.secondary_ips.retain(|ip| !assigned.ips.contains(ip));
            eni.prefixes.retain(|p| !assigned.prefixes.contains(p));
        }
    }

    /// An unassign succeeded: drop those addresses and prefixes.
    pub fn remove_addresses(
        &mut self,
        eni_id: &str,
        ips: &[Ipv4Addr],
        prefixes: &[Ipv4Net],
        now: Instant,
    ) {
        let Some((entry, i)) = self.find_eni_mut(eni_id) else {
            return;
        };
        entry.local_change = Some(now);
        entry.unassigned.retain(|u| u.at + DESCRIBE_LAG > now);
        entry.unassigned.push(Unassigned {
            eni_id: eni_id.to_string(),
            at: now,
            ips: ips.to_vec(),
            prefixes: prefixes.to_vec(),
        });
        let eni = &mut entry.enis[i];
        let before = eni.secondary_ips.len() as i64 + eni.prefixes.len() as i64 * 16;
        eni.secondary_ips.retain(|ip| !ips.contains(ip));
        eni.prefixes.retain(|p| !prefixes.contains(p));
        let after = eni.secondary_ips.len() as i64 + eni.prefixes.len() as i64 * 16;
        let subnet = eni.subnet_id.clone();
        self.adjust_subnet(&subnet, before - after);
    }

    /// The addresses and prefixes we unassigned from `eni_id` that a describe started at
    /// `started` may still show (less than [`DESCRIBE_LAG`] before it). Such a describe is no
    /// proof that EC2 (still or again) has them on the ENI. Found by `make dst` (seeds 115,
    /// 269, 344).
    pub fn recently_unassigned(
        &self,
        eni_id: &str,
        started: Instant,
    ) -> (BTreeSet<Ipv4Addr>, BTreeSet<Ipv4Net>) {
        let mut ips = BTreeSet::new();
        let mut prefixes = BTreeSet::new();
        let recent = self
            .instances
            .values()
            .flat_map(|e| &e.unassigned)
            .filter(|u| u.eni_id == eni_id && local_change_newer(Some(u.at), started));
        for u in recent {
            ips.extend(u.ips.iter().copied());
            prefixes.extend(u.prefixes.iter().copied());
        }
        (ips, prefixes)
    }

    /// Delete-on-termination is now set (or has to be retried).
    pub fn set_delete_on_termination(&mut self, eni_id: &str, attachment_id: &str, done: bool) {
        let Some((entry, i)) = self.find_eni_mut(eni_id) else {
            return;
        };
        if done {
            entry.pending_delete_on_termination.remove(eni_id);
            if let Some(a) = entry.enis[i].attachment.as_mut() {
                a.delete_on_termination = true;
            }
        } else {
            entry
                .pending_delete_on_termination
                .insert(eni_id.to_string(), attachment_id.to_string());
        }
    }

    /// Device indices in use on an instance.
    pub fn used_device_indices(&self, instance_id: &str) -> BTreeSet<u32> {
        self.instances
            .get(instance_id)
            .map(|e| {
                // Only network card 0's: where new ENIs are attached (§5.4).
                e.enis
                    .iter()
                    .filter(|n| n.network_card() == Some(0))
                    .filter_map(|n| n.device_index())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Totals over all instances: (ENIs, addresses) for metrics.
    pub fn totals(&self) -> (usize, usize) {
        let mut enis = 0;
        let mut addrs = 0;
        for e in self.instances.values() {
            enis += e.enis.len();
            addrs += e
                .enis
                .iter()
                .map(|n| n.secondary_ips.len() + n.prefixes.len() * 16)
                .sum::<usize>();
        }
        (enis, addrs)
    }
}
