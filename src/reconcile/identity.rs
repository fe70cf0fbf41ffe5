//! Whose instance a CiliumNode names (docs/rules.md §15). Every Cilium agent's ServiceAccount
//! can create and write CiliumNodes, so `spec.instance-id` is a claim; the Node of the same
//! name is the fact: its `spec.providerID` (`aws:///<zone>/<instance-id>`), or, on clusters
//! whose Nodes carry none, its InternalIP, which must be the instance's primary private address
//! in EC2. Pure: the Node watch feeds [`Nodes`], a pass asks [`Nodes::verdict`] and
//! [`rivals`].

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use crate::k8s::input::NodeFacts;
use crate::reconcile::nodes::Slots;

/// The Nodes the watch has shown, by name.
#[derive(Debug, Default)]
pub struct Nodes {
    facts: BTreeMap<String, NodeFacts>,
    /// The watch's first listing is complete: a name it did not show has no Node.
    listed: bool,
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
    /// A Node was added or changed (`Some`) or deleted (`None`); whether anything changed.
    pub fn set(&mut self, name: &str, facts: Option<NodeFacts>) -> bool {
        match facts {
            Some(f) => self.facts.insert(name.to_string(), f.clone()) != Some(f),
            None => self.facts.remove(name).is_some(),
        }
    }

    /// Whether the instance `name`'s CiliumNode names may be described and managed before a
    /// pass judges it: its Node names that instance, or has no providerID (then the instance's
    /// primary address, from the describe, is what decides). `required` as in [`Self::verdict`].
    pub fn may_describe(&self, name: &str, instance: &str, required: bool) -> bool {
        match self.facts.get(name) {
            // Planted defect (dst-mutants): an object no Node confirms is described anyway.
            None => !required || crate::mutants::active("manage-refused-instance"),
            Some(f) => match &f.instance {
                Some(id) => id == instance,
                None => !f.internal_ips.is_empty(),
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
    /// as EC2 lists it (`None`: not described yet).
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
            (None, None) if facts.internal_ips.is_empty() => Verdict::Mismatch(
                "its Node has neither a providerID nor an InternalIP to check it against".into(),
            ),
            (None, None) => Verdict::Unknown,
            (None, Some(ip)) if facts.internal_ips.contains(&ip) => Verdict::Confirmed,
            (None, Some(ip)) => Verdict::Mismatch(format!(
                "its Node's InternalIP ({}) is not {instance}'s primary address {ip}",
                facts
                    .internal_ips
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
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
        n.set(
            "b",
            Some(NodeFacts {
                instance: None,
                internal_ips: vec![ip],
            }),
        );
        assert!(
            n.may_describe("b", "i-1", true),
            "only the describe can tell"
        );
        n.set("c", Some(NodeFacts::default()));
        assert!(
            !n.may_describe("c", "i-1", true),
            "nothing to check it against"
        );
        assert_eq!(n.named_by("i-1", "x"), Some("a".into()));
        assert_eq!(n.named_by("i-1", "a"), None);
    }

    #[test]
    fn without_a_provider_id_the_internal_ip_must_be_the_primary_address() {
        let mut n = Nodes::default();
        let ip: Ipv4Addr = "10.0.0.5".parse().unwrap();
        n.set(
            "a",
            Some(NodeFacts {
                instance: None,
                internal_ips: vec![ip],
            }),
        );
        assert_eq!(n.verdict("a", "i-1", None, true), Verdict::Unknown);
        assert_eq!(n.verdict("a", "i-1", Some(ip), true), Verdict::Confirmed);
        let other = "10.0.0.6".parse().unwrap();
        assert!(matches!(
            n.verdict("a", "i-1", Some(other), true),
            Verdict::Mismatch(_)
        ));
        n.set("b", Some(NodeFacts::default()));
        assert!(matches!(
            n.verdict("b", "i-1", Some(ip), true),
            Verdict::Mismatch(_)
        ));
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
