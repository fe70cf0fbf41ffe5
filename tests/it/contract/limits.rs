//! AWS's limits and capacity rules (moto enforces none of them: docs/emulators.md).

use std::net::Ipv4Addr;

use eni_operator::ec2::{AddressRequest, Ec2, ErrorKind, Resource};

use super::{all_ips, create_request, eni, expect_err, net, new_eni, subnet};
use testkit::world::World;

/// AWS's limits and capacity rules, which moto does not enforce.
pub async fn limits_and_exhaustion<E: Ec2>(ec2: &E, world: &World) {
    if !world.enforces_aws_rules {
        return;
    }
    eni_and_address_limits(ec2, world).await;
    attachment_rules(ec2, world).await;
    subnet_exhaustion(ec2, world).await;
    prefix_fragmentation(ec2, world).await;
}

/// Max ENIs per instance and IPv4 slots per ENI, where the primary and each /28 prefix take
/// one slot each. <https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/AvailableIpPerENI.html>,
/// <https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/ec2-prefix-eni.html>
async fn eni_and_address_limits<E: Ec2>(ec2: &E, world: &World) {
    // instances[1]: t3.medium in zone b, 3 ENIs with 6 IPv4 slots each.
    let node = &world.instances[1];
    let mut enis = Vec::new();
    for device in 1..=2 {
        let e = new_eni(ec2, world, 2, AddressRequest::Ips(0)).await;
        assert_eq!(e.availability_zone, world.zone_b);
        ec2.attach_network_interface(&e.id, &node.id, device)
            .await
            .unwrap();
        enis.push(e.id);
    }
    let extra = new_eni(ec2, world, 2, AddressRequest::Ips(0)).await;
    let r = ec2.attach_network_interface(&extra.id, &node.id, 3).await;
    let e = expect_err(
        r,
        ErrorKind::AttachmentLimitExceeded,
        "4th ENI on a t3.medium",
    );
    assert_eq!(e.code, "AttachmentLimitExceeded");

    // Single addresses: primary + 5 fill the 6 slots.
    ec2.assign_private_ip_addresses(&enis[0], AddressRequest::Ips(5))
        .await
        .unwrap();
    let r = ec2
        .assign_private_ip_addresses(&enis[0], AddressRequest::Ips(1))
        .await;
    let e = expect_err(r, ErrorKind::IpLimitExceeded, "7th address");
    assert_eq!(e.code, "PrivateIpAddressLimitExceeded");

    // Prefixes take one slot each: primary + 2 prefixes + 3 addresses = 6.
    let got = ec2
        .assign_private_ip_addresses(&enis[1], AddressRequest::Prefixes(2))
        .await
        .unwrap();
    assert_eq!(got.prefixes.len(), 2);
    ec2.assign_private_ip_addresses(&enis[1], AddressRequest::Ips(3))
        .await
        .unwrap();
    let r = ec2
        .assign_private_ip_addresses(&enis[1], AddressRequest::Prefixes(1))
        .await;
    expect_err(r, ErrorKind::IpLimitExceeded, "prefix beyond the slots");
    // All or nothing: asking for more than the free slots assigns none.
    ec2.unassign_private_ip_addresses(&enis[1], &[], &got.prefixes)
        .await
        .unwrap();
    let r = ec2
        .assign_private_ip_addresses(&enis[1], AddressRequest::Prefixes(3))
        .await;
    expect_err(r, ErrorKind::IpLimitExceeded, "3 prefixes in 2 slots");
    assert!(eni(ec2, &enis[1]).await.prefixes.is_empty());
}

/// Device index, attachment state, zones, primary ENI, deleting in-use ENIs.
/// <https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_AttachNetworkInterface.html>,
/// <https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_DeleteNetworkInterface.html>
async fn attachment_rules<E: Ec2>(ec2: &E, world: &World) {
    let node = &world.instances[0];
    let e = new_eni(ec2, world, 0, AddressRequest::Ips(1)).await;
    let r = ec2.attach_network_interface(&e.id, &node.id, 0).await;
    let err = expect_err(
        r,
        ErrorKind::DeviceIndexInUse,
        "device index 0 is the primary's",
    );
    assert_eq!(err.code, "InvalidParameterValue");

    let attachment = ec2
        .attach_network_interface(&e.id, &node.id, 1)
        .await
        .unwrap();
    let r = ec2.attach_network_interface(&e.id, &node.id, 2).await;
    expect_err(r, ErrorKind::Other, "attaching an attached ENI");
    let r = ec2.delete_network_interface(&e.id).await;
    let err = expect_err(r, ErrorKind::Other, "deleting an attached ENI");
    assert!(err.message.contains("currently in use"), "{err}");

    let primary = eni(ec2, &node.primary_eni_id).await;
    let r = ec2
        .detach_network_interface(&primary.attachment.unwrap().id, false)
        .await;
    let err = expect_err(r, ErrorKind::Other, "detaching the primary ENI");
    assert_eq!(err.code, "OperationNotPermitted");

    // An ENI lives in its subnet's zone: zone b cannot go on a zone a instance.
    let zone_b = new_eni(ec2, world, 2, AddressRequest::Ips(0)).await;
    let r = ec2.attach_network_interface(&zone_b.id, &node.id, 2).await;
    expect_err(r, ErrorKind::Other, "attach across zones");

    // The wrong attachment ID for the ENI is not found.
    let r = ec2
        .set_delete_on_termination(&zone_b.id, &attachment, true)
        .await;
    expect_err(
        r,
        ErrorKind::NotFound(Resource::Attachment),
        "foreign attachment",
    );

    // Unassigning an address the ENI does not hold is refused.
    let r = ec2
        .unassign_private_ip_addresses(&e.id, &[primary.primary_ip], &[])
        .await;
    expect_err(r, ErrorKind::Other, "unassign another ENI's address");
}

/// A subnet with no free address answers `InsufficientFreeAddressesInSubnet`; the 5 reserved
/// addresses are never handed out.
/// <https://docs.aws.amazon.com/vpc/latest/userguide/subnet-sizing.html>
async fn subnet_exhaustion<E: Ec2>(ec2: &E, world: &World) {
    let tiny = &world.subnets[3];
    let cidr = net(&tiny.cidr);
    let full = new_eni(ec2, world, 3, AddressRequest::Ips(10)).await;
    let ips = all_ips(&full);
    assert_eq!(ips.len(), 11);
    let reserved: Vec<Ipv4Addr> = [0u32, 1, 2, 3, 15]
        .iter()
        .map(|o| Ipv4Addr::from(u32::from(cidr.network()) + o))
        .collect();
    assert!(
        ips.iter()
            .all(|ip| cidr.contains(ip) && !reserved.contains(ip)),
        "{ips:?}"
    );
    assert_eq!(subnet(ec2, &tiny.id).await.available_addresses, 0);

    let r = ec2
        .create_network_interface(&create_request(world, 3, AddressRequest::Ips(0), ""))
        .await;
    let e = expect_err(r, ErrorKind::SubnetExhausted, "create in a full subnet");
    assert_eq!(e.code, "InsufficientFreeAddressesInSubnet");
    ec2.unassign_private_ip_addresses(&full.id, &full.secondary_ips[..1], &[])
        .await
        .unwrap();
    let r = ec2
        .assign_private_ip_addresses(&full.id, AddressRequest::Ips(2))
        .await;
    expect_err(r, ErrorKind::SubnetExhausted, "2 addresses, 1 free");
    ec2.assign_private_ip_addresses(&full.id, AddressRequest::Ips(1))
        .await
        .unwrap();
    // A /28 subnet can never hold a /28 prefix: its only block holds reserved addresses.
    ec2.unassign_private_ip_addresses(&full.id, &full.secondary_ips[1..], &[])
        .await
        .unwrap();
    let r = ec2
        .assign_private_ip_addresses(&full.id, AddressRequest::Prefixes(1))
        .await;
    expect_err(
        r,
        ErrorKind::InsufficientCidrBlocks,
        "prefix in a /28 subnet",
    );
}

/// Free addresses scattered over the subnet but no aligned free /28: prefixes fail with
/// `InsufficientCidrBlocks` while single addresses still succeed.
/// <https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/ec2-prefix-eni.html>
async fn prefix_fragmentation<E: Ec2>(ec2: &E, world: &World) {
    let node_subnet = &world.subnets[0].id;
    let mut enis = Vec::new();
    loop {
        let free = subnet(ec2, node_subnet).await.available_addresses;
        if free == 0 {
            break;
        }
        let e = new_eni(ec2, world, 0, AddressRequest::Ips(free.min(25) - 1)).await;
        enis.push(e);
        assert!(enis.len() <= 20, "the subnet never fills");
    }
    // Free one address on each of 5 ENIs: fewer than 16 free addresses can never form a /28.
    for e in &enis[..5] {
        ec2.unassign_private_ip_addresses(&e.id, &e.secondary_ips[..1], &[])
            .await
            .unwrap();
    }
    assert_eq!(subnet(ec2, node_subnet).await.available_addresses, 5);
    let r = ec2
        .assign_private_ip_addresses(&enis[5].id, AddressRequest::Prefixes(1))
        .await;
    let e = expect_err(
        r,
        ErrorKind::InsufficientCidrBlocks,
        "prefix in a fragmented subnet",
    );
    assert_eq!(e.code, "InsufficientCidrBlocks");
    let r = ec2
        .create_network_interface(&create_request(world, 0, AddressRequest::Prefixes(1), ""))
        .await;
    expect_err(r, ErrorKind::InsufficientCidrBlocks, "create with a prefix");
    // The single-address fallback fits.
    ec2.assign_private_ip_addresses(&enis[5].id, AddressRequest::Ips(4))
        .await
        .unwrap();
    assert_eq!(subnet(ec2, node_subnet).await.available_addresses, 1);
}
