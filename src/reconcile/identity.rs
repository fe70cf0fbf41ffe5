//! Whose instance a CiliumNode names (docs/rules.md §15). Every Cilium agent's ServiceAccount
//! can create and write CiliumNodes, so `spec.instance-id` is a claim; the Node of the same
//! name is the fact: its `spec.providerID` (`aws:///<zone>/<instance-id>`), or, on clusters
//! whose Nodes carry none, its InternalIP, which must be the instance's primary private address
//! in EC2. Which instance that is comes from a describe filtered by the address (the Node's, not
//! the agent's claim, [`owners_of`]): the instance the agent names is never described or managed
//! before that answer names it. Pure: the Node watch and those answers feed [`Nodes`], a pass
//! asks [`Nodes::verdict`] and [`rivals`].

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use crate::ec2::NetworkInterface;
use crate::k8s::input::NodeFacts;
use crate::reconcile::nodes::Slots;

/// How soon an InternalIP whose owner refutes a CiliumNode's claim is asked about again (an
/// instance replaced under the same address and Node name).
pub const OWNER_RECHECK: Duration = Duration::from_secs(60);

/// The Nodes the watch has shown, by name.
#[derive(Debug, Default)]
pub struct Nodes {
    facts: BTreeMap<String, NodeFacts>,
    /// The watch's first listing is complete: a name it did not show has no Node.
    listed: bool,
    /// The instances whose primary address each InternalIP of a Node without providerID is,
    /// as EC2 answered, and when. Kept only for addresses some Node has.
    owners: BTreeMap<Ipv4Addr, (BTreeSet<String>, Instant)>,
}

/// What the owners of a Node's InternalIPs say.
#[derive(Clone, Debug, PartialEq, Eq)]
enum ByIp {
    /// An address not asked about yet.
    NotAsked,
    /// Exactly one instance has one of them as its primary address.
    Is(String),
    /// None, or several (why).
    NotOne(String),
}

/// For each address, the instances whose primary ENI (card 0, device 0) has it as its primary
/// private address, from a describe filtered by those addresses (an address nobody has maps to
/// no instance: that is an answer too).
pub fn owners_of(
    ips: &[Ipv4Addr],
    enis: &[NetworkInterface],
) -> BTreeMap<Ipv4Addr, BTreeSet<String>> {
    ips.iter()
        .map(|ip| {
            let owners = enis
                .iter()
                .filter(|e| e.primary_ip == *ip && e.is_primary())
                .filter_map(|e| e.instance_id().map(str::to_string))
                .collect();
            (*ip, owners)
        })
        .collect()
}

fn joined<T: ToString>(items: impl IntoIterator<Item = T>) -> String {
    items
        .into_iter()
        .map(|i| i.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Whether a CiliumNode may be served for the instance it names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    Confirmed,
    /// Not known yet (the Nodes not listed, the instance not described): look again shortly.
    Unknown,
    /// No Node of that name.
    NoNode,
    /// The Node names another instance (or its InternalIP is not the instance's address).
    Mismatch(String),
}

impl Nodes {
    /// A Node was added or changed (`Some`) or deleted (`None`); whether anything changed. An
    /// address no Node has any more loses what EC2 said of it (a Node registered again under
    /// it is asked about afresh).
    pub fn set(&mut self, name: &str, facts: Option<NodeFacts>) -> bool {
        let changed = match facts {
            Some(f) => self.facts.insert(name.to_string(), f.clone()) != Some(f),
            None => self.facts.remove(name).is_some(),
        };
        if changed {
            let held: BTreeSet<Ipv4Addr> = self
                .facts
                .values()
                .filter(|f| f.instance.is_none())
                .flat_map(|f| f.internal_ips.iter().copied())
                .collect();
            self.owners.retain(|ip, _| held.contains(ip));
        }
        changed
    }

    /// What EC2 answered (at `at`) for these addresses ([`owners_of`]).
    pub fn set_owners(&mut self, found: BTreeMap<Ipv4Addr, BTreeSet<String>>, at: Instant) {
        for (ip, owners) in found {
            self.owners.insert(ip, (owners, at));
        }
    }

    /// The InternalIPs of `name`'s Node to look up before the instance its CiliumNode names
    /// (`instance`) may be judged: those of a Node without providerID not asked about yet, or
    /// whose answer does not name `instance` and is [`OWNER_RECHECK`] old.
    pub fn lookups_due(&self, name: &str, instance: &str, now: Instant) -> Vec<Ipv4Addr> {
        let Some(f) = self.facts.get(name).filter(|f| f.instance.is_none()) else {
            return Vec::new();
        };
        if instance.is_empty() {
            return Vec::new();
        }
        f.internal_ips
            .iter()
            .filter(|ip| match self.owners.get(ip) {
                None => true,
                Some((owners, at)) => {
                    !owners.contains(instance)
                        && now.saturating_duration_since(*at) >= OWNER_RECHECK
                }
            })
            .copied()
            .collect()
    }

    fn by_ip(&self, f: &NodeFacts) -> ByIp {
        let mut instances = BTreeSet::new();
        for ip in &f.internal_ips {
            match self.owners.get(ip) {
                None => return ByIp::NotAsked,
                Some((owners, _)) => instances.extend(owners.iter().cloned()),
            }
        }
        let ips = joined(&f.internal_ips);
        match instances.len() {
            1 => ByIp::Is(instances.into_iter().next().unwrap_or_default()),
            0 => ByIp::NotOne(format!(
                "its Node's InternalIP ({ips}) is no instance's primary address in EC2"
            )),
            _ => ByIp::NotOne(format!(
                "its Node's InternalIP ({ips}) is the primary address of several instances \
                 ({}): set --vpc-id, or give the Node its providerID",
                joined(&instances)
            )),
        }
    }

    /// Whether the instance `name`'s CiliumNode names may be described and managed before a
    /// pass judges it: its Node names that instance, or has no providerID and EC2 answered
    /// that its InternalIP is that instance's primary address (and no other's).
    /// `required` as in [`Self::verdict`].
    pub fn may_describe(&self, name: &str, instance: &str, required: bool) -> bool {
        match self.facts.get(name) {
            // Planted defect (dst-mutants): an object no Node confirms is described anyway.
            None => !required || crate::mutants::active("manage-refused-instance"),
            Some(f) => match &f.instance {
                Some(id) => id == instance,
                None => matches!(self.by_ip(f), ByIp::Is(i) if i == instance),
            },
        }
    }

    /// A Node other than `except` whose providerID names `instance`, if any.
    pub fn named_by(&self, instance: &str, except: &str) -> Option<String> {
        self.facts
            .iter()
            .filter(|(name, _)| name.as_str() != except)
            .find(|(_, f)| f.instance.as_deref() == Some(instance))
            .map(|(name, _)| name.clone())
    }

    /// The watch's listing is complete.
    pub fn set_listed(&mut self) {
        self.listed = true;
    }

    /// `required`: a Node watch feeds the core (production). Without one (a core driven by
    /// tests or the benchmark), a name no Node input spoke of is taken on trust; one it did
    /// speak of is checked all the same. `primary_ip`: the instance's primary private address
    /// as the cache lists it (`None`: not described yet); a Node without providerID is judged
    /// by the owner EC2 named for its InternalIP ([`Self::set_owners`]), and a primary address
    /// the cache lists must agree.
    pub fn verdict(
        &self,
        name: &str,
        instance: &str,
        primary_ip: Option<Ipv4Addr>,
        required: bool,
    ) -> Verdict {
        let Some(facts) = self.facts.get(name) else {
            return match (required, self.listed) {
                (false, _) => Verdict::Confirmed,
                (true, false) => Verdict::Unknown,
                // Planted defect (dst-mutants): a CiliumNode without a Node taken on trust.
                (true, true) if crate::mutants::active("serve-without-node") => Verdict::Confirmed,
                (true, true) => Verdict::NoNode,
            };
        };
        match (&facts.instance, primary_ip) {
            (Some(id), _) if id == instance => Verdict::Confirmed,
            (Some(id), _) => {
                Verdict::Mismatch(format!("its Node's providerID names {id}, not {instance}"))
            }
            (None, _) if facts.internal_ips.is_empty() => Verdict::Mismatch(
                "its Node has neither a providerID nor an InternalIP to check it against".into(),
            ),
            (None, ip) => match self.by_ip(facts) {
                ByIp::NotAsked => Verdict::Unknown,
                ByIp::Is(i) if i == instance => match ip {
                    Some(ip) if !facts.internal_ips.contains(&ip) => Verdict::Mismatch(format!(
                        "its Node's InternalIP ({}) is not {instance}'s primary address {ip}",
                        joined(&facts.internal_ips)
                    )),
                    _ => Verdict::Confirmed,
                },
                ByIp::Is(i) => Verdict::Mismatch(format!(
                    "its Node's InternalIP ({}) is the primary address of {i}, not {instance}",
                    joined(&facts.internal_ips)
                )),
                ByIp::NotOne(why) => Verdict::Mismatch(why),
            },
        }
    }
}

/// The other CiliumNodes that name `instance` and are live: parsed, not being deleted, not
/// opted out, and not refuted by their own Node (`refuted`: a CiliumNode without its Node, or
/// whose Node names another instance, cannot starve the real one). Sorted by name.
pub fn rivals(
    slots: &Slots,
    name: &str,
    instance: &str,
    refuted: impl Fn(&str) -> bool,
) -> Vec<String> {
    if instance.is_empty() {
        return Vec::new();
    }
    slots
        .iter()
        .filter(|(other, _)| other.as_str() != name)
        .filter(|(_, s)| !s.ignored)
        .filter(|(_, s)| {
            s.node
                .as_ref()
                .is_some_and(|n| n.instance_id() == instance && !n.deleting())
        })
        .filter(|(other, _)| !refuted(other))
        .map(|(other, _)| other.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn by_id(id: &str) -> NodeFacts {
        NodeFacts {
            instance: Some(id.into()),
            internal_ips: Vec::new(),
        }
    }

    #[test]
    fn a_cilium_node_is_served_only_for_its_nodes_instance() {
        let mut n = Nodes::default();
        assert_eq!(n.verdict("a", "i-1", None, true), Verdict::Unknown);
        assert_eq!(n.verdict("a", "i-1", None, false), Verdict::Confirmed);
        n.set_listed();
        assert_eq!(n.verdict("a", "i-1", None, true), Verdict::NoNode);
        assert!(n.set("a", Some(by_id("i-1"))));
        assert!(!n.set("a", Some(by_id("i-1"))), "no change");
        assert_eq!(n.verdict("a", "i-1", None, true), Verdict::Confirmed);
        assert!(matches!(
            n.verdict("a", "i-2", None, false),
            Verdict::Mismatch(_)
        ));
        assert!(n.set("a", None));
        assert_eq!(n.verdict("a", "i-1", None, true), Verdict::NoNode);
    }

    #[test]
    fn only_an_instance_its_node_may_confirm_is_described() {
        let mut n = Nodes::default();
        assert!(!n.may_describe("a", "i-1", true), "no Node (yet)");
        assert!(n.may_describe("a", "i-1", false), "no Node watch: on trust");
        n.set("a", Some(by_id("i-1")));
        assert!(n.may_describe("a", "i-1", true));
        assert!(!n.may_describe("a", "i-2", true), "the Node names another");
        assert!(!n.may_describe("a", "i-2", false));
        let ip = "10.0.0.5".parse().unwrap();
        n.set("b", Some(by_ip(ip)));
        assert!(
            !n.may_describe("b", "i-1", true),
            "no providerID: nothing is described before EC2 names the InternalIP's owner"
        );
        n.set("c", Some(NodeFacts::default()));
        assert!(
            !n.may_describe("c", "i-1", true),
            "nothing to check it against"
        );
        assert_eq!(n.named_by("i-1", "x"), Some("a".into()));
        assert_eq!(n.named_by("i-1", "a"), None);
    }

    fn by_ip(ip: Ipv4Addr) -> NodeFacts {
        NodeFacts {
            instance: None,
            internal_ips: vec![ip],
        }
    }

    /// Node "a" known only by its InternalIP, and that address.
    fn a_without_provider_id() -> (Nodes, Ipv4Addr) {
        let mut n = Nodes::default();
        let ip: Ipv4Addr = "10.0.0.5".parse().unwrap();
        n.set("a", Some(by_ip(ip)));
        (n, ip)
    }

    fn owned(ip: Ipv4Addr, instances: &[&str]) -> BTreeMap<Ipv4Addr, BTreeSet<String>> {
        let owners = instances.iter().map(|i| i.to_string()).collect();
        BTreeMap::from([(ip, owners)])
    }

    #[test]
    fn without_a_provider_id_the_internal_ip_must_be_the_primary_address() {
        let (mut n, ip) = a_without_provider_id();
        let t = Instant::now();
        assert_eq!(n.verdict("a", "i-1", None, true), Verdict::Unknown);
        assert_eq!(
            n.verdict("a", "i-1", Some(ip), true),
            Verdict::Unknown,
            "the claimed instance's own address is not the fact: EC2's owner of the address is"
        );
        n.set_owners(owned(ip, &["i-1"]), t);
        assert_eq!(n.verdict("a", "i-1", None, true), Verdict::Confirmed);
        assert_eq!(n.verdict("a", "i-1", Some(ip), true), Verdict::Confirmed);
        let other = "10.0.0.6".parse().unwrap();
        assert!(matches!(
            n.verdict("a", "i-1", Some(other), true),
            Verdict::Mismatch(_)
        ));
        match n.verdict("a", "i-2", None, true) {
            Verdict::Mismatch(why) => assert!(why.contains("primary address of i-1"), "{why}"),
            v => panic!("{v:?}"),
        }
        n.set("b", Some(NodeFacts::default()));
        assert!(matches!(
            n.verdict("b", "i-1", Some(ip), true),
            Verdict::Mismatch(_)
        ));
    }

    #[test]
    fn a_node_without_provider_id_manages_only_the_instance_ec2_names_for_its_address() {
        let (mut n, ip) = a_without_provider_id();
        let t = Instant::now();
        assert_eq!(n.lookups_due("a", "i-1", t), [ip]);
        assert!(n.lookups_due("a", "", t).is_empty(), "no claim, no lookup");
        assert!(n.lookups_due("x", "i-1", t).is_empty(), "no Node");
        assert!(!n.may_describe("a", "i-1", true));
        n.set_owners(owned(ip, &["i-1"]), t);
        assert!(n.may_describe("a", "i-1", true));
        assert!(
            !n.may_describe("a", "i-2", true),
            "the agent names a stranger"
        );
        assert!(!n.may_describe("a", "i-2", false));
        assert!(n.lookups_due("a", "i-1", t + OWNER_RECHECK).is_empty());
        assert!(n.lookups_due("a", "i-2", t).is_empty(), "asked just now");
        assert_eq!(n.lookups_due("a", "i-2", t + OWNER_RECHECK), [ip]);
        // Two instances with that primary address (other VPCs): neither.
        n.set_owners(owned(ip, &["i-1", "i-9"]), t);
        assert!(!n.may_describe("a", "i-1", true));
        match n.verdict("a", "i-1", None, true) {
            Verdict::Mismatch(why) => assert!(why.contains("several"), "{why}"),
            v => panic!("{v:?}"),
        }
        n.set_owners(owned(ip, &[]), t);
        assert!(!n.may_describe("a", "i-1", true));
        assert!(matches!(
            n.verdict("a", "i-1", None, true),
            Verdict::Mismatch(_)
        ));
        // The Node goes and registers again: asked afresh.
        n.set("a", None);
        n.set("a", Some(by_ip(ip)));
        assert_eq!(n.lookups_due("a", "i-1", t), [ip]);
        assert_eq!(n.verdict("a", "i-1", None, true), Verdict::Unknown);
    }

    #[test]
    fn an_address_is_owned_by_the_instance_whose_primary_eni_has_it_as_primary() {
        use crate::ipam::fixtures;
        let ip: Ipv4Addr = "10.0.0.5".parse().unwrap();
        let on = |id: &str, instance: &str, device: u32| {
            let mut e = fixtures::eni(id, device, "subnet-1");
            e.attachment.as_mut().expect("attached").instance_id = instance.into();
            e.primary_ip = ip;
            e
        };
        let mut secondary = on("eni-3", "i-3", 0);
        secondary.primary_ip = "10.0.0.9".parse().unwrap();
        secondary.secondary_ips = vec![ip];
        let mut other_card = on("eni-4", "i-4", 0);
        other_card
            .attachment
            .as_mut()
            .expect("attached")
            .network_card_index = 1;
        let mut detached = on("eni-5", "", 0);
        detached.attachment = None;
        let enis = [
            on("eni-1", "i-1", 0),
            on("eni-2", "i-2", 1),
            secondary,
            other_card,
            detached,
        ];
        let other: Ipv4Addr = "10.0.0.7".parse().unwrap();
        let found = owners_of(&[ip, other], &enis);
        assert_eq!(found[&ip], BTreeSet::from(["i-1".to_string()]));
        assert!(found[&other].is_empty(), "no owner is an answer too");
    }

    #[test]
    fn rivals_are_other_live_unrefuted_cilium_nodes_of_the_instance() {
        use crate::ipam::fixtures;
        use crate::k8s::stored::StoredNode;
        use crate::reconcile::nodes::Slot;
        let slot = |instance: &str, deleting: bool| {
            let mut n = fixtures::node();
            n.spec.instance_id = instance.into();
            if deleting {
                n.metadata.deletion_timestamp =
                    Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                        k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
                    ));
            }
            Slot {
                node: Some(StoredNode::new(&n)),
                ..Slot::default()
            }
        };
        let mut slots = Slots::new();
        slots.insert("a".into(), slot("i-1", false));
        slots.insert("b".into(), slot("i-1", false));
        slots.insert("c".into(), slot("i-1", true));
        slots.insert("d".into(), slot("i-2", false));
        slots.insert("forged".into(), slot("i-1", false));
        let r = rivals(&slots, "a", "i-1", |n| n == "forged");
        assert_eq!(r, ["b"]);
        assert!(rivals(&slots, "a", "", |_| false).is_empty());
    }
}
