//! AWS's invariants, checked over the whole state by tests.

use std::collections::{BTreeMap, HashMap};
use std::net::Ipv4Addr;

use super::{State, slots_used};
use eni_operator::ec2::model::*;

impl State {
    /// AWS's invariants: no address on two ENIs, subnet counts consistent with the ENIs, no
    /// instance or ENI above its type's limits.
    pub(crate) fn check_invariants(&self) -> std::result::Result<(), String> {
        let mut owner: HashMap<Ipv4Addr, &str> = HashMap::new();
        let mut per_subnet: BTreeMap<&str, u32> = BTreeMap::new();
        for rec in self.enis.values() {
            let e = &rec.eni;
            let addrs = std::iter::once(e.primary_ip)
                .chain(e.secondary_ips.iter().copied())
                .chain(e.prefixes.iter().flat_map(|p| prefix_addresses(*p)));
            for ip in addrs {
                if let Some(other) = owner.insert(ip, &e.id) {
                    return Err(format!("{ip} is on both {other} and {}", e.id));
                }
                let subnet = &self.subnets[&e.subnet_id].subnet;
                if !subnet.cidr.contains(&ip) {
                    return Err(format!("{ip} of {} is outside {}", e.id, subnet.cidr));
                }
                *per_subnet.entry(&e.subnet_id).or_default() += 1;
            }
            let (limit, prefixes_ok) = self.eni_limits(e);
            if slots_used(e) > limit {
                return Err(format!(
                    "{} uses {} slots, limit {limit}",
                    e.id,
                    slots_used(e)
                ));
            }
            if !prefixes_ok && !e.prefixes.is_empty() {
                return Err(format!(
                    "{} holds prefixes on a type without delegation",
                    e.id
                ));
            }
        }
        for (id, rec) in &self.subnets {
            let held = per_subnet.get(id.as_str()).copied().unwrap_or(0);
            if rec.pool.held() != held {
                return Err(format!(
                    "{id}: pool holds {} but ENIs hold {held}",
                    rec.pool.held()
                ));
            }
            let size = 1u32 << (32 - u32::from(rec.subnet.cidr.prefix_len()));
            if rec.pool.available() + held + 5 != size {
                return Err(format!("{id}: available count inconsistent"));
            }
        }
        for inst in self.instances.values() {
            let Some(l) = self.types.get(&inst.instance_type) else {
                continue;
            };
            let n = self
                .enis
                .values()
                .filter(|r| r.eni.instance_id() == Some(inst.id.as_str()))
                .count() as u32;
            if n > l.max_enis {
                return Err(format!("{} has {n} ENIs, limit {}", inst.id, l.max_enis));
            }
        }
        Ok(())
    }
}
