//! Elastic IPs (static IPs): DescribeAddresses by tags, AssociateAddress with
//! AllowReassociation false (a second association of one address is refused with
//! `Resource.AlreadyAssociated`), DisassociateAddress (an unknown association is not found).
//! `allocated`: two addresses the caller allocated (AllocateAddress) with [`EIP_TAG`], and one
//! without it.

use std::net::Ipv4Addr;

use eni_operator::ec2::{Ec2, Tags};

use super::tags;
use testkit::world::World;

pub const EIP_TAG: (&str, &str) = ("eni-operator-test/eip", "static");

pub async fn addresses<E: Ec2>(ec2: &E, world: &World, tagged: &[String], untagged: &str) {
    let want = tags(&[EIP_TAG]);
    let found = ec2.describe_addresses(&want).await.expect("describe");
    let ids: Vec<&str> = found.iter().map(|a| a.allocation_id.as_str()).collect();
    for id in tagged {
        assert!(ids.contains(&id.as_str()), "{id} in {ids:?}");
    }
    assert!(!ids.contains(&untagged), "the tag filter holds");
    assert!(found.iter().all(|a| a.association_id.is_none()));
    assert!(
        found
            .iter()
            .all(|a| a.tags.get(EIP_TAG.0).map(String::as_str) == Some(EIP_TAG.1))
    );
    let all = ec2
        .describe_addresses(&Tags::new())
        .await
        .expect("describe all");
    assert!(all.iter().any(|a| a.allocation_id == untagged));

    // Two instances' primary ENIs and their primary addresses.
    let primary = |i: usize| world.instances[i].primary_eni_id.clone();
    let primary_ip = |eni: &str| {
        let eni = eni.to_owned();
        async move { super::eni(ec2, &eni).await.primary_ip }
    };
    let (eni_a, eni_b) = (primary(0), primary(1));
    let (ip_a, ip_b): (Ipv4Addr, Ipv4Addr) = (primary_ip(&eni_a).await, primary_ip(&eni_b).await);

    let assoc = ec2
        .associate_address(&tagged[0], &eni_a, ip_a)
        .await
        .expect("associate");
    assert!(!assoc.is_empty());
    let now = ec2.describe_addresses(&want).await.unwrap();
    let a = now.iter().find(|a| a.allocation_id == tagged[0]).unwrap();
    assert_eq!(a.association_id.as_deref(), Some(assoc.as_str()));
    assert_eq!(a.network_interface_id.as_deref(), Some(eni_a.as_str()));
    assert_eq!(a.private_ip, Some(ip_a));

    // The race's loser: the same address for another ENI is refused, the first stays.
    let lost = ec2
        .associate_address(&tagged[0], &eni_b, ip_b)
        .await
        .expect_err("AllowReassociation false");
    assert!(lost.is_already_associated(), "{lost}");
    let now = ec2.describe_addresses(&want).await.unwrap();
    let a = now.iter().find(|a| a.allocation_id == tagged[0]).unwrap();
    assert_eq!(a.network_interface_id.as_deref(), Some(eni_a.as_str()));

    ec2.disassociate_address(&assoc)
        .await
        .expect("disassociate");
    let now = ec2.describe_addresses(&want).await.unwrap();
    let a = now.iter().find(|a| a.allocation_id == tagged[0]).unwrap();
    assert_eq!(a.association_id, None, "free again, still allocated");
    let again = ec2
        .disassociate_address(&assoc)
        .await
        .expect_err("gone association");
    assert!(again.is_not_found(), "{again}");
}
