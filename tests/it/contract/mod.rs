//! The EC2 contract: one suite, run against every backend of the `Ec2` trait (the simulator and
//! moto's EC2 server). Each check takes a freshly seeded [`World`].
//!
//! Checks of AWS's own rules (limits, subnet capacity, /28 prefixes, idempotency, pagination,
//! delete on termination) run only when `world.enforces_aws_rules`: moto does not model them
//! (see docs/emulators.md), and the simulator follows the AWS documentation linked at
//! each such assertion. Backends that enforce the rules are seeded with a describe page size of
//! 2, so every describe here walks several pages.

use std::collections::BTreeSet;
use std::fmt::Debug;
use std::net::Ipv4Addr;
use std::time::Duration;

use eni_operator::ec2::{
    AddressRequest, CreateEniRequest, Ec2, Ec2Error, EniFilter, EniState, ErrorKind,
    InstanceFilter, InstanceState, NetworkInterface, Resource, ResourceFilter, Result, Subnet,
    Tags,
};
use ipnet::Ipv4Net;

use testkit::every_page;
use testkit::world::World;

mod addresses;
mod limits;
pub use addresses::{EIP_TAG, addresses};
pub use limits::limits_and_exhaustion;

/// Tag the seeded world puts on the pod subnet and the pod security group.
const POD_TAG: (&str, &str) = ("eni-operator-test/pods", "true");
/// Tag on every ENI the contract creates.
const OWNER_TAG: (&str, &str) = ("eni-operator-test/owner", "contract");

fn tags(pairs: &[(&str, &str)]) -> Tags {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn net(s: &str) -> Ipv4Net {
    s.parse().expect("valid CIDR")
}

fn expect_err<T: Debug>(result: Result<T>, kind: ErrorKind, what: &str) -> Ec2Error {
    match result {
        Ok(v) => panic!("{what}: expected {kind:?}, got Ok({v:?})"),
        Err(e) => {
            assert_eq!(e.kind, kind, "{what}: {e}");
            e
        }
    }
}

fn create_request(
    world: &World,
    subnet: usize,
    addresses: AddressRequest,
    token: &str,
) -> CreateEniRequest {
    CreateEniRequest {
        subnet_id: world.subnets[subnet].id.clone(),
        security_groups: vec![world.security_groups[0].clone()],
        description: format!("contract ENI in subnet {subnet}"),
        tags: tags(&[OWNER_TAG]),
        addresses,
        client_token: token.to_owned(),
    }
}

/// An ENI of ours created in `world.subnets[subnet]` (no client token).
async fn new_eni<E: Ec2>(
    ec2: &E,
    world: &World,
    subnet: usize,
    addresses: AddressRequest,
) -> NetworkInterface {
    let request = create_request(world, subnet, addresses, "");
    ec2.create_network_interface(&request).await.unwrap()
}

async fn eni<E: Ec2>(ec2: &E, id: &str) -> NetworkInterface {
    let filter = EniFilter {
        ids: vec![id.to_owned()],
        ..EniFilter::default()
    };
    the_one(
        id,
        every_page(|t| ec2.describe_network_interfaces(&filter, t)).await,
    )
}

async fn subnet<E: Ec2>(ec2: &E, id: &str) -> Subnet {
    let filter = ResourceFilter {
        ids: vec![id.to_owned()],
        ..ResourceFilter::default()
    };
    the_one(id, every_page(|t| ec2.describe_subnets(&filter, t)).await)
}

/// The one thing a describe by `id` found.
fn the_one<T>(id: &str, mut found: Vec<T>) -> T {
    assert_eq!(found.len(), 1, "{id}");
    found.remove(0)
}

/// Detach is asynchronous on AWS (`detaching`, then `available`): poll, bounded.
async fn wait_available<E: Ec2>(ec2: &E, id: &str) -> NetworkInterface {
    for _ in 0..100 {
        let e = eni(ec2, id).await;
        if e.state == EniState::Available {
            return e;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{id} never became available");
}

fn all_ips(e: &NetworkInterface) -> Vec<Ipv4Addr> {
    std::iter::once(e.primary_ip)
        .chain(e.secondary_ips.iter().copied())
        .collect()
}

/// Every describe, with its filters, on the seeded world.
pub async fn describes<E: Ec2>(ec2: &E, world: &World) {
    let in_vpc = ResourceFilter {
        vpc_id: Some(world.vpc_id.clone()),
        ..ResourceFilter::default()
    };

    let vpcs = every_page(|t| ec2.describe_vpcs(&in_vpc, t)).await;
    assert_eq!(vpcs.len(), 1);
    assert_eq!(vpcs[0].id, world.vpc_id);
    assert_eq!(vpcs[0].primary_cidr, net(&world.vpc_cidr));
    assert!(
        vpcs[0]
            .secondary_cidrs
            .contains(&net(&world.vpc_secondary_cidr)),
        "{vpcs:?}"
    );

    let subnets = every_page(|t| ec2.describe_subnets(&in_vpc, t)).await;
    for seeded in &world.subnets {
        let s = subnets
            .iter()
            .find(|s| s.id == seeded.id)
            .unwrap_or_else(|| panic!("subnet {} not described", seeded.id));
        assert_eq!(s.cidr, net(&seeded.cidr));
        assert_eq!(s.availability_zone, seeded.availability_zone);
        assert_eq!(s.vpc_id, world.vpc_id);
        assert!(seeded.tags.iter().all(|(k, v)| s.tags.get(k) == Some(v)));
    }
    // The tiny /28 is untouched: 16 addresses minus AWS's 5 reserved ones.
    let tiny = subnets
        .iter()
        .find(|s| s.id == world.subnets[3].id)
        .unwrap();
    assert_eq!(tiny.available_addresses, 11);
    let node_subnet = subnets
        .iter()
        .find(|s| s.id == world.subnets[0].id)
        .unwrap();
    assert_eq!(
        node_subnet.available_addresses,
        256 - 5 - 1,
        "one primary address taken"
    );

    let tagged = ResourceFilter {
        tags: tags(&[POD_TAG]),
        ..in_vpc.clone()
    };
    let pod_subnets = every_page(|t| ec2.describe_subnets(&tagged, t)).await;
    let ids: Vec<_> = pod_subnets.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(ids, [world.subnets[1].id.as_str()]);

    let groups = every_page(|t| ec2.describe_security_groups(&in_vpc, t)).await;
    for g in &world.security_groups {
        assert!(
            groups
                .iter()
                .any(|x| &x.id == g && x.vpc_id == world.vpc_id),
            "{g}"
        );
    }
    let pod_groups = every_page(|t| ec2.describe_security_groups(&tagged, t)).await;
    let ids: Vec<_> = pod_groups.iter().map(|g| g.id.as_str()).collect();
    assert_eq!(ids, [world.security_groups[0].as_str()]);

    let tables = every_page(|t| ec2.describe_route_tables(&in_vpc, t)).await;
    assert!(
        tables.iter().any(|r| r.main && r.vpc_id == world.vpc_id),
        "every VPC has a main route table: {tables:?}"
    );

    let instance_ids: Vec<String> = world.instances.iter().map(|i| i.id.clone()).collect();
    let by_id = InstanceFilter {
        ids: instance_ids.clone(),
        ..InstanceFilter::default()
    };
    let instances = every_page(|t| ec2.describe_instances(&by_id, t)).await;
    assert_eq!(instances.len(), world.instances.len());
    for seeded in &world.instances {
        let i = instances.iter().find(|i| i.id == seeded.id).unwrap();
        assert_eq!(i.instance_type, seeded.instance_type);
        assert_eq!(i.availability_zone, seeded.availability_zone);
        assert_eq!(i.subnet_id, seeded.subnet_id);
        assert_eq!(i.vpc_id, world.vpc_id);
        assert_eq!(i.state, InstanceState::Running);
    }
    let by_vpc = InstanceFilter {
        vpc_id: Some(world.vpc_id.clone()),
        ..InstanceFilter::default()
    };
    let in_vpc_instances = every_page(|t| ec2.describe_instances(&by_vpc, t)).await;
    assert!(
        instance_ids
            .iter()
            .all(|id| in_vpc_instances.iter().any(|i| &i.id == id))
    );

    let types = ["m5.large".to_owned(), "t3.medium".to_owned()];
    let limits = every_page(|t| ec2.describe_instance_types(&types, t)).await;
    let m5 = limits
        .iter()
        .find(|l| l.instance_type == "m5.large")
        .unwrap();
    let t3 = limits
        .iter()
        .find(|l| l.instance_type == "t3.medium")
        .unwrap();
    assert_eq!((m5.max_enis, m5.ipv4_per_eni, m5.nitro), (3, 10, true));
    assert_eq!((t3.max_enis, t3.ipv4_per_eni, t3.nitro), (3, 6, true));
    assert!(m5.supports_prefix_delegation());
    let every_type = every_page(|t| ec2.describe_instance_types(&[], t)).await;
    assert!(every_type.iter().any(|l| l.instance_type == "m5.large"));

    // Each instance's primary ENI, found by `attachment.instance-id`.
    for seeded in &world.instances {
        let filter = EniFilter {
            instance_ids: vec![seeded.id.clone()],
            ..EniFilter::default()
        };
        let enis = every_page(|t| ec2.describe_network_interfaces(&filter, t)).await;
        assert_eq!(enis.len(), 1, "{}: {enis:?}", seeded.id);
        let p = &enis[0];
        assert_eq!(p.id, seeded.primary_eni_id);
        assert_eq!(p.state, EniState::InUse);
        assert_eq!(p.device_index(), Some(0));
        assert_eq!(p.subnet_id, seeded.subnet_id);
        let cidr = world
            .subnets
            .iter()
            .find(|s| s.id == seeded.subnet_id)
            .unwrap();
        assert!(net(&cidr.cidr).contains(&p.primary_ip));
        assert!(!p.mac.is_empty());
        if world.enforces_aws_rules {
            // EC2 sets DeleteOnTermination on the primary ENI that RunInstances creates; moto
            // reports false. https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/using-eni.html
            assert!(p.attachment.as_ref().unwrap().delete_on_termination);
        }
    }
}

/// The whole life of a secondary ENI, through every mutating operation.
pub async fn create_attach_assign_unassign_detach_delete<E: Ec2>(ec2: &E, world: &World) {
    let node = &world.instances[0];
    let pods = &world.subnets[1];
    let pod_cidr = net(&pods.cidr);
    let free_before = subnet(ec2, &pods.id).await.available_addresses;

    let created = ec2
        .create_network_interface(&create_request(
            world,
            1,
            AddressRequest::Ips(2),
            "contract-life",
        ))
        .await
        .unwrap();
    assert_eq!(created.subnet_id, pods.id);
    assert_eq!(created.vpc_id, world.vpc_id);
    assert_eq!(created.availability_zone, world.zone_a);
    assert_eq!(created.description, "contract ENI in subnet 1");
    assert_eq!(
        created.tags.get(OWNER_TAG.0).map(String::as_str),
        Some(OWNER_TAG.1)
    );
    assert_eq!(created.security_groups, [world.security_groups[0].clone()]);
    assert_eq!(created.state, EniState::Available);
    assert!(created.attachment.is_none());
    assert_eq!(created.secondary_ips.len(), 2);
    assert!(all_ips(&created).iter().all(|ip| pod_cidr.contains(ip)));

    // Filters: tag + state + subnet + VPC all select it; another subnet does not.
    let filter = EniFilter {
        vpc_id: Some(world.vpc_id.clone()),
        subnet_ids: vec![pods.id.clone()],
        tags: tags(&[OWNER_TAG]),
        state: Some(EniState::Available),
        ..EniFilter::default()
    };
    let found = every_page(|t| ec2.describe_network_interfaces(&filter, t)).await;
    assert_eq!(
        found.iter().map(|e| &e.id).collect::<Vec<_>>(),
        [&created.id]
    );
    let elsewhere = EniFilter {
        subnet_ids: vec![world.subnets[2].id.clone()],
        tags: tags(&[OWNER_TAG]),
        ..EniFilter::default()
    };
    let found = every_page(|t| ec2.describe_network_interfaces(&elsewhere, t)).await;
    assert!(found.is_empty(), "{found:?}");

    let attachment = ec2
        .attach_network_interface(&created.id, &node.id, 1)
        .await
        .unwrap();
    assert!(!attachment.is_empty());
    let attached = eni(ec2, &created.id).await;
    assert_eq!(attached.state, EniState::InUse);
    assert_eq!(attached.instance_id(), Some(node.id.as_str()));
    assert_eq!(attached.device_index(), Some(1));
    assert_eq!(attached.attachment.as_ref().unwrap().id, attachment);
    let on_node = EniFilter {
        instance_ids: vec![node.id.clone()],
        ..EniFilter::default()
    };
    let node_enis = every_page(|t| ec2.describe_network_interfaces(&on_node, t)).await;
    let ids: BTreeSet<_> = node_enis.iter().map(|e| e.id.as_str()).collect();
    assert_eq!(
        ids,
        BTreeSet::from([node.primary_eni_id.as_str(), created.id.as_str()])
    );

    ec2.set_delete_on_termination(&created.id, &attachment, true)
        .await
        .unwrap();
    if world.enforces_aws_rules {
        // moto ignores ModifyNetworkInterfaceAttribute's Attachment.DeleteOnTermination.
        // https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_ModifyNetworkInterfaceAttribute.html
        let e = eni(ec2, &created.id).await;
        assert!(e.attachment.unwrap().delete_on_termination);
    }

    // Callers merge the answer as a set (moto lists every address of the ENI).
    let assigned = ec2
        .assign_private_ip_addresses(&created.id, AddressRequest::Ips(3))
        .await
        .unwrap();
    let after = eni(ec2, &created.id).await;
    assert_eq!(after.secondary_ips.len(), 5);
    assert!(assigned.ips.iter().all(|ip| all_ips(&after).contains(ip)));
    let new: Vec<_> = after
        .secondary_ips
        .iter()
        .filter(|ip| !created.secondary_ips.contains(ip))
        .copied()
        .collect();
    assert_eq!(new.len(), 3);
    assert!(new.iter().all(|ip| assigned.ips.contains(ip)));
    if world.enforces_aws_rules {
        // EC2 answers with the new addresses only, never hands out an address twice (moto picks
        // at random without checking), and AvailableIpAddressCount follows exactly.
        // https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_AssignPrivateIpAddresses.html
        assert_eq!(assigned.ips.len(), 3);
        let distinct: BTreeSet<_> = all_ips(&after).into_iter().collect();
        assert_eq!(distinct.len(), 6, "{after:?}");
        let now = subnet(ec2, &pods.id).await.available_addresses;
        assert_eq!(now, free_before - 6);
    }

    // /28 prefixes: moto accepts `Ipv4PrefixCount` and assigns nothing.
    let prefixes = ec2
        .assign_private_ip_addresses(&created.id, AddressRequest::Prefixes(1))
        .await
        .unwrap();
    if world.enforces_aws_rules {
        // https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/ec2-prefix-eni.html
        assert_eq!(prefixes.prefixes.len(), 1);
        let p = prefixes.prefixes[0];
        assert_eq!(p.prefix_len(), 28);
        assert!(pod_cidr.contains(&p));
        assert_eq!(u32::from(p.network()) % 16, 0, "aligned");
        assert!(all_ips(&after).iter().all(|ip| !p.contains(ip)));
        assert_eq!(eni(ec2, &created.id).await.prefixes, [p]);
        assert_eq!(
            subnet(ec2, &pods.id).await.available_addresses,
            free_before - 22
        );
    }
    ec2.unassign_private_ip_addresses(&created.id, &[], &prefixes.prefixes)
        .await
        .unwrap();

    let released = &new[..2];
    ec2.unassign_private_ip_addresses(&created.id, released, &[])
        .await
        .unwrap();
    let after = eni(ec2, &created.id).await;
    assert_eq!(after.secondary_ips.len(), 3);
    assert!(released.iter().all(|ip| !after.secondary_ips.contains(ip)));
    assert!(after.prefixes.is_empty());
    if world.enforces_aws_rules {
        assert_eq!(
            subnet(ec2, &pods.id).await.available_addresses,
            free_before - 4
        );
    }

    ec2.detach_network_interface(&attachment, false)
        .await
        .unwrap();
    let detached = wait_available(ec2, &created.id).await;
    assert!(detached.attachment.is_none());

    ec2.delete_network_interface(&created.id).await.unwrap();
    let gone = ec2
        .describe_network_interfaces(
            &EniFilter {
                ids: vec![created.id.clone()],
                ..EniFilter::default()
            },
            None,
        )
        .await;
    expect_err(
        gone,
        ErrorKind::NotFound(Resource::NetworkInterface),
        "deleted ENI",
    );
    assert_eq!(subnet(ec2, &pods.id).await.available_addresses, free_before);
}

/// Unknown IDs answer AWS's not-found codes, classified by resource.
pub async fn not_found_errors<E: Ec2>(ec2: &E, world: &World) {
    const ENI: &str = "eni-0123456789abcdef0";
    const INSTANCE: &str = "i-0123456789abcdef0";
    const SUBNET: &str = "subnet-0123456789abcdef0";
    const ATTACHMENT: &str = "eni-attach-0123456789abcdef0";
    let eni_nf = ErrorKind::NotFound(Resource::NetworkInterface);

    let r = ec2
        .describe_instances(
            &InstanceFilter {
                ids: vec![INSTANCE.to_owned()],
                ..InstanceFilter::default()
            },
            None,
        )
        .await;
    let e = expect_err(
        r,
        ErrorKind::NotFound(Resource::Instance),
        "describe instance",
    );
    assert_eq!(e.code, "InvalidInstanceID.NotFound");

    let r = ec2
        .describe_network_interfaces(
            &EniFilter {
                ids: vec![ENI.to_owned()],
                ..EniFilter::default()
            },
            None,
        )
        .await;
    let e = expect_err(r, eni_nf, "describe ENI");
    assert_eq!(e.code, "InvalidNetworkInterfaceID.NotFound");

    let r = ec2
        .describe_subnets(
            &ResourceFilter {
                ids: vec![SUBNET.to_owned()],
                ..ResourceFilter::default()
            },
            None,
        )
        .await;
    let e = expect_err(r, ErrorKind::NotFound(Resource::Subnet), "describe subnet");
    assert_eq!(e.code, "InvalidSubnetID.NotFound");

    let r = ec2
        .describe_instance_types(&["m5.nonexistent".to_owned()], None)
        .await;
    let e = expect_err(
        r,
        ErrorKind::NotFound(Resource::InstanceType),
        "instance type",
    );
    assert_eq!(e.code, "InvalidInstanceType");

    let mut req = create_request(world, 0, AddressRequest::Ips(1), "");
    req.subnet_id = SUBNET.to_owned();
    let r = ec2.create_network_interface(&req).await;
    expect_err(
        r,
        ErrorKind::NotFound(Resource::Subnet),
        "create in unknown subnet",
    );

    let node = &world.instances[0];
    let r = ec2.attach_network_interface(ENI, &node.id, 1).await;
    expect_err(r, eni_nf, "attach unknown ENI");
    let real = new_eni(ec2, world, 0, AddressRequest::Ips(0)).await;
    let r = ec2.attach_network_interface(&real.id, INSTANCE, 1).await;
    expect_err(
        r,
        ErrorKind::NotFound(Resource::Instance),
        "attach to unknown instance",
    );

    let r = ec2
        .assign_private_ip_addresses(ENI, AddressRequest::Ips(1))
        .await;
    expect_err(r, eni_nf, "assign on unknown ENI");
    let r = ec2
        .unassign_private_ip_addresses(ENI, &["10.0.0.10".parse().unwrap()], &[])
        .await;
    expect_err(r, eni_nf, "unassign on unknown ENI");
    let r = ec2.set_delete_on_termination(ENI, ATTACHMENT, true).await;
    expect_err(r, eni_nf, "modify unknown ENI");
    let r = ec2.detach_network_interface(ATTACHMENT, false).await;
    expect_err(
        r,
        ErrorKind::NotFound(Resource::Attachment),
        "detach unknown attachment",
    );
    let r = ec2.delete_network_interface(ENI).await;
    expect_err(r, eni_nf, "delete unknown ENI");
    ec2.delete_network_interface(&real.id).await.unwrap();
}

/// Same client token, same request: one ENI. Same token, other parameters: an error.
/// moto ignores client tokens (every call creates an ENI).
/// <https://docs.aws.amazon.com/ec2/latest/devguide/ec2-api-idempotency.html>
pub async fn idempotent_create<E: Ec2>(ec2: &E, world: &World) {
    let req = create_request(world, 1, AddressRequest::Ips(2), "contract-idempotent-1");
    let first = ec2.create_network_interface(&req).await.unwrap();
    let second = ec2.create_network_interface(&req).await.unwrap();
    let mut changed = req.clone();
    changed.description = "another intent".to_owned();
    let mismatch = ec2.create_network_interface(&changed).await;
    if !world.enforces_aws_rules {
        return;
    }
    assert_eq!(first.id, second.id);
    assert_eq!(first.secondary_ips, second.secondary_ips);
    let e = expect_err(mismatch, ErrorKind::IdempotencyMismatch, "reused token");
    assert_eq!(e.code, "IdempotentParameterMismatch");
    let filter = EniFilter {
        tags: tags(&[OWNER_TAG]),
        ..EniFilter::default()
    };
    let owned = every_page(|t| ec2.describe_network_interfaces(&filter, t)).await;
    assert_eq!(owned.len(), 1, "{owned:?}");
    // The free count moved once (primary + 2), not twice.
    let s = subnet(ec2, &world.subnets[1].id).await;
    assert_eq!(s.available_addresses, 4096 - 5 - 3);
}

/// Every page of a describe, walked with its token, gives each item once. moto returns a
/// single page whatever the page size.
/// <https://docs.aws.amazon.com/ec2/latest/devguide/ec2-api-pagination.html>
pub async fn pagination<E: Ec2>(ec2: &E, world: &World) {
    let mut created = BTreeSet::new();
    for _ in 0..5 {
        let e = new_eni(ec2, world, 1, AddressRequest::Ips(0)).await;
        created.insert(e.id);
    }
    let filter = EniFilter {
        vpc_id: Some(world.vpc_id.clone()),
        tags: tags(&[OWNER_TAG]),
        ..EniFilter::default()
    };
    let mut pages = 0;
    let mut seen = Vec::new();
    let mut token = None;
    loop {
        let page = ec2
            .describe_network_interfaces(&filter, token.take())
            .await
            .unwrap();
        pages += 1;
        assert!(pages <= 10, "pagination does not end");
        seen.extend(page.items.into_iter().map(|e| e.id));
        match page.next_token {
            Some(t) => token = Some(t),
            None => break,
        }
    }
    let unique: BTreeSet<_> = seen.iter().cloned().collect();
    assert_eq!(unique.len(), seen.len(), "an item came twice: {seen:?}");
    assert_eq!(unique, created);

    let in_vpc = ResourceFilter {
        vpc_id: Some(world.vpc_id.clone()),
        ..ResourceFilter::default()
    };
    let subnets = every_page(|t| ec2.describe_subnets(&in_vpc, t)).await;
    assert_eq!(subnets.len(), world.subnets.len());

    if world.enforces_aws_rules {
        assert_eq!(pages, 3, "5 ENIs at 2 per page");
        let first = ec2.describe_subnets(&in_vpc, None).await.unwrap();
        assert_eq!(first.items.len(), 2);
        assert!(first.next_token.is_some());
        // ID lookups carry no MaxResults (AWS refuses the combination): one page.
        let by_id = EniFilter {
            ids: created.iter().cloned().collect(),
            ..EniFilter::default()
        };
        let page = ec2.describe_network_interfaces(&by_id, None).await.unwrap();
        assert_eq!((page.items.len(), page.next_token), (5, None));
        let r = ec2
            .describe_subnets(&in_vpc, Some("not-a-token".to_owned()))
            .await;
        expect_err(r, ErrorKind::Other, "garbage NextToken");
    }
}
