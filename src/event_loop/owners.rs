//! Which instance a Node without providerID runs on (docs/rules.md §15): its InternalIP, a fact
//! from the Node, is looked up in EC2 (`DescribeNetworkInterfaces` filtered by
//! `addresses.private-ip-address`, through the gate like every call) before the instance its
//! CiliumNode names may be described or managed. [`Lookups`] (pure) batches the addresses
//! nodes wait for, one lookup at a time; [`look_up`] asks EC2 and reads the answer with
//! [`crate::reconcile::identity::owners_of`].

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;

use crate::cache::refresher::INSTANCE_BATCH;
use crate::ec2::{Ec2, EniFilter, Result, collect_pages};

/// The addresses nodes wait for, and whether a lookup runs.
#[derive(Debug, Default)]
pub struct Lookups {
    waiting: BTreeMap<Ipv4Addr, BTreeSet<String>>,
    running: bool,
}

impl Lookups {
    /// `node` is looked at again once `ip` has been looked up.
    pub fn wait(&mut self, ip: Ipv4Addr, node: String) {
        self.waiting.entry(ip).or_default().insert(node);
    }

    /// The addresses to look up now, at most one filter's worth (it counts as running from
    /// here).
    pub fn next(&mut self) -> Option<Vec<Ipv4Addr>> {
        if self.running || self.waiting.is_empty() {
            return None;
        }
        self.running = true;
        Some(self.waiting.keys().take(INSTANCE_BATCH).copied().collect())
    }

    /// Addresses wait or a lookup runs.
    pub fn busy(&self) -> bool {
        self.running || !self.waiting.is_empty()
    }

    /// The lookup of `ips` ended (or failed): the nodes to look at again.
    pub fn done(&mut self, ips: &[Ipv4Addr]) -> BTreeSet<String> {
        self.running = false;
        ips.iter()
            .flat_map(|ip| self.waiting.remove(ip).unwrap_or_default())
            .collect()
    }
}

/// The instances whose primary address each of `ips` is, in `vpc` when the cluster's VPC is
/// known (the same private address may be in use in another VPC of the account).
pub async fn look_up<E: Ec2>(
    ec2: &E,
    ips: &[Ipv4Addr],
    vpc: Option<String>,
) -> Result<BTreeMap<Ipv4Addr, BTreeSet<String>>> {
    let filter = EniFilter {
        private_ips: ips.to_vec(),
        vpc_id: vpc,
        ..EniFilter::default()
    };
    let enis = collect_pages(|t| ec2.describe_network_interfaces(&filter, t)).await?;
    Ok(crate::reconcile::identity::owners_of(ips, &enis))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_looked_up_in_one_batch_one_lookup_at_a_time() {
        let ip = |s: &str| -> Ipv4Addr { s.parse().unwrap() };
        let mut l = Lookups::default();
        assert_eq!(l.next(), None);
        assert!(!l.busy());
        l.wait(ip("10.0.0.1"), "a".into());
        l.wait(ip("10.0.0.1"), "b".into());
        l.wait(ip("10.0.0.2"), "c".into());
        let first = l.next().expect("lookup");
        assert_eq!(first, [ip("10.0.0.1"), ip("10.0.0.2")]);
        l.wait(ip("10.0.0.3"), "d".into());
        assert_eq!(l.next(), None, "one at a time");
        assert!(l.busy());
        let nodes: Vec<String> = l.done(&first).into_iter().collect();
        assert_eq!(nodes, ["a", "b", "c"]);
        assert_eq!(l.next(), Some(vec![ip("10.0.0.3")]));
        assert_eq!(l.done(&[ip("10.0.0.3")]).len(), 1);
        assert!(!l.busy());
    }
}
