//! Static IPs (Elastic IPs) for nodes that ask for one with `spec.ipam.static-ip-tags`: which
//! address the node gets, decided from a fresh `DescribeAddresses` (pure; the runtime's
//! `pass/static_ip.rs` makes the calls).
//!
//! Cilium's behaviour, followed here: the operator looks for a static IP before allocating
//! while tags are set and `status.ipam.assigned-static-ip` is empty (cilium/cilium
//! `pkg/ipam/node.go`, `maintainIPPool`: the `StaticIPTags` check ahead of the allocation), via
//! `AllocateStaticIP` (`pkg/aws/eni/node.go`) -> `AssociateEIP` (`pkg/aws/ec2/ec2.go`):
//! `DescribeAddresses` filtered by the tags, skip every address with an association, associate
//! the first free one with the node's primary ENI, `AllowReassociation` false, and publish its
//! public IP. Where we differ, on purpose:
//! * an address already associated with the node's primary ENI is adopted (a restart, or an
//!   answer or a status write that was lost), never a second one associated;
//! * a lost race (`Resource.AlreadyAssociated`) moves on to the next free address instead of
//!   failing the node's pass (Cilium returns the error);
//! * the address goes to the primary ENI's primary private address, named explicitly;
//! * only addresses carrying `--static-ip-required-tag` (by default this cluster's
//!   `eni-operator.io/cluster-name` tag) are ever associated: the agent writes
//!   `static-ip-tags`, and without an operator-side allow-list any agent could claim any free
//!   Elastic IP of the Region (the IAM policy carries the same condition).

use std::net::Ipv4Addr;

use crate::crd::CiliumNode;
use crate::ec2::{Address, NetworkInterface, Tags};

/// The tags to look for, when the node wants a static IP and has none yet.
pub fn wanted(node: &CiliumNode) -> Option<&Tags> {
    let tags = &node.spec.ipam.static_ip_tags;
    let assigned = node
        .status
        .as_ref()
        .is_some_and(|s| !s.ipam.assigned_static_ip.is_empty());
    (!tags.is_empty() && !assigned).then_some(tags)
}

/// The instance's primary ENI (network card 0, device index 0; every card of a multi-card
/// instance has a device 0, often an EFA interface, §5.4): the static IP goes to its primary
/// address.
pub fn primary_eni<'a>(
    instance_id: &str,
    enis: &'a [NetworkInterface],
) -> Option<&'a NetworkInterface> {
    enis.iter().find(|e| {
        e.attachment
            .as_ref()
            .is_some_and(|a| a.instance_id == instance_id && a.device_index == 0)
            && e.is_primary()
    })
}

/// What to do with the addresses a describe returned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// An address is associated with the node's primary ENI already: publish it, associate
    /// nothing.
    Adopt(Ipv4Addr),
    /// Try these free addresses in order (allocation IDs); the first that associates wins.
    Try(Vec<(String, Ipv4Addr)>),
    /// No free address carries the tags.
    NoneFree,
    /// Free addresses carry the node's tags but not the required tag (their allocation IDs):
    /// never associated.
    NotAllowed(Vec<String>),
}

/// The tag an address must carry to be associated by us (`--static-ip-required-tag`).
pub type RequiredTag<'a> = (&'a str, &'a str);

/// Whether the address carries the required tag.
pub fn allowed(address: &Address, (key, value): RequiredTag) -> bool {
    // Planted defect (dst-mutants): any address the agent's tags match.
    crate::mutants::active("static-ip-any-tag") || address.tags.get(key).is_some_and(|v| v == value)
}

/// An address already on the node's primary ENI is adopted whatever its tags (it is the
/// node's: nothing is associated); a free one must carry the required tag.
pub fn decide(addresses: &[Address], primary_eni_id: &str, required: RequiredTag) -> Decision {
    let mut ours: Vec<&Address> = addresses
        .iter()
        .filter(|a| a.association_id.is_some())
        .filter(|a| a.network_interface_id.as_deref() == Some(primary_eni_id))
        .collect();
    ours.sort_by(|a, b| a.allocation_id.cmp(&b.allocation_id));
    if let Some(a) = ours.first() {
        return Decision::Adopt(a.public_ip);
    }
    let (mut free, mut refused): (Vec<&Address>, Vec<&Address>) = addresses
        .iter()
        .filter(|a| a.association_id.is_none())
        .partition(|a| allowed(a, required));
    if free.is_empty() && !refused.is_empty() {
        refused.sort_by(|a, b| a.allocation_id.cmp(&b.allocation_id));
        return Decision::NotAllowed(refused.iter().map(|a| a.allocation_id.clone()).collect());
    }
    if free.is_empty() {
        return Decision::NoneFree;
    }
    free.sort_by(|a, b| a.allocation_id.cmp(&b.allocation_id));
    Decision::Try(
        free.iter()
            .map(|a| (a.allocation_id.clone(), a.public_ip))
            .collect(),
    )
}

/// The operator-status text when the only free matches lack the required tag.
pub fn not_allowed_message(tags: &Tags, required: RequiredTag, refused: &[String]) -> String {
    let (key, value) = required;
    format!(
        "the Elastic IP(s) {} carry the static-ip-tags {} but not the tag {key}={value} \
         (--static-ip-required-tag) that every address this operator associates must carry; \
         tag the address for this cluster; retrying",
        refused.join(","),
        tag_list(tags)
    )
}

fn tag_list(tags: &Tags) -> String {
    let tags: Vec<String> = tags.iter().map(|(k, v)| format!("{k}={v}")).collect();
    tags.join(",")
}

/// The operator-status text when no free address matches.
pub fn none_free_message(tags: &Tags) -> String {
    format!(
        "no unassociated Elastic IP carries the static-ip-tags {}; retrying",
        tag_list(tags)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::CiliumNodeStatus;
    use crate::ec2::Attachment;

    const REQUIRED: RequiredTag = ("eni-operator.io/cluster-name", "prod");

    fn addr(id: &str, ip: [u8; 4], eni: Option<&str>) -> Address {
        Address {
            allocation_id: id.into(),
            public_ip: Ipv4Addr::from(ip),
            association_id: eni.map(|_| format!("assoc-{id}")),
            network_interface_id: eni.map(str::to_string),
            private_ip: eni.map(|_| Ipv4Addr::new(10, 0, 0, 5)),
            tags: Tags::from([(REQUIRED.0.to_string(), REQUIRED.1.to_string())]),
        }
    }

    fn untagged(mut a: Address) -> Address {
        a.tags.clear();
        a
    }

    #[test]
    fn adopts_the_address_already_on_the_primary_eni() {
        let a = [
            addr("eipalloc-1", [1, 1, 1, 1], None),
            addr("eipalloc-2", [2, 2, 2, 2], Some("eni-0")),
        ];
        assert_eq!(
            decide(&a, "eni-0", REQUIRED),
            Decision::Adopt(Ipv4Addr::new(2, 2, 2, 2))
        );
    }

    #[test]
    fn tries_free_addresses_in_order_and_skips_other_nodes_addresses() {
        let a = [
            addr("eipalloc-3", [3, 3, 3, 3], None),
            addr("eipalloc-2", [2, 2, 2, 2], Some("eni-other")),
            addr("eipalloc-1", [1, 1, 1, 1], None),
        ];
        assert_eq!(
            decide(&a, "eni-0", REQUIRED),
            Decision::Try(vec![
                ("eipalloc-1".into(), Ipv4Addr::new(1, 1, 1, 1)),
                ("eipalloc-3".into(), Ipv4Addr::new(3, 3, 3, 3)),
            ])
        );
        assert_eq!(decide(&a[1..2], "eni-0", REQUIRED), Decision::NoneFree);
        assert_eq!(decide(&[], "eni-0", REQUIRED), Decision::NoneFree);
    }

    #[test]
    fn free_addresses_without_the_required_tag_are_never_tried() {
        let other_cluster = |a: Address| {
            let mut a = untagged(a);
            a.tags.insert(REQUIRED.0.into(), "other".into());
            a
        };
        let a = [
            untagged(addr("eipalloc-2", [2, 2, 2, 2], None)),
            other_cluster(addr("eipalloc-1", [1, 1, 1, 1], None)),
        ];
        assert_eq!(
            decide(&a, "eni-0", REQUIRED),
            Decision::NotAllowed(vec!["eipalloc-1".into(), "eipalloc-2".into()])
        );
        // An allowed one among them is the only one tried.
        let mut b = a.to_vec();
        b.push(addr("eipalloc-9", [9, 9, 9, 9], None));
        assert_eq!(
            decide(&b, "eni-0", REQUIRED),
            Decision::Try(vec![("eipalloc-9".into(), Ipv4Addr::new(9, 9, 9, 9))])
        );
        // Already on the node's primary ENI: adopted whatever its tags (nothing associated).
        let c = [untagged(addr("eipalloc-3", [3, 3, 3, 3], Some("eni-0")))];
        assert_eq!(
            decide(&c, "eni-0", REQUIRED),
            Decision::Adopt(Ipv4Addr::new(3, 3, 3, 3))
        );
        let msg = not_allowed_message(
            &Tags::from([("pool".into(), "egress".into())]),
            REQUIRED,
            &["eipalloc-1".into()],
        );
        assert!(msg.contains("eipalloc-1") && msg.contains("eni-operator.io/cluster-name=prod"));
    }

    #[test]
    fn wanted_only_with_tags_and_nothing_assigned() {
        let mut node = CiliumNode::new("n", Default::default());
        assert_eq!(wanted(&node), None);
        node.spec.ipam.static_ip_tags = Tags::from([("eip".into(), "yes".into())]);
        assert!(wanted(&node).is_some());
        let mut status = CiliumNodeStatus::default();
        status.ipam.assigned_static_ip = "1.2.3.4".into();
        node.status = Some(status);
        assert_eq!(wanted(&node), None);
    }

    #[test]
    fn the_primary_eni_is_device_index_zero_of_this_instance() {
        let mut e0 = crate::ipam::fixtures::eni_with_ips("eni-0", 0, "subnet-a", 0);
        let e1 = crate::ipam::fixtures::eni_with_ips("eni-1", 1, "subnet-a", 0);
        assert_eq!(
            primary_eni("i-1", &[e1.clone(), e0.clone()]).unwrap().id,
            "eni-0"
        );
        e0.attachment = Some(Attachment {
            id: "a".into(),
            instance_id: "i-other".into(),
            device_index: 0,
            delete_on_termination: true,
            network_card_index: 0,
        });
        assert!(primary_eni("i-1", &[e1, e0]).is_none());
    }
}
