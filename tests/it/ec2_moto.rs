//! `AwsEc2` behind the `Gate`, on the wire against moto's EC2 server: every trait operation
//! round-trips and errors are classified. moto's deviations from AWS are listed in
//! `docs/emulators.md`; where a test depends on one, it says so.
//!
//! Every call is bounded by the client's operation timeout (10 s): moto can hang.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::time::Duration;

use crate::support::child;
use crate::support::moto::{self, MotoServer, POD_TAG};
use eni_operator::ec2::aws::{AwsClientConfig, AwsEc2};
use eni_operator::ec2::gate::{Gate, GateConfig};
use eni_operator::ec2::*;
use testkit::every_page;
use testkit::world::World;

type Client = Gate<AwsEc2>;

/// A fresh moto with the world seeded, and our gated client on it.
async fn setup() -> (MotoServer, World, Client) {
    let server = MotoServer::start();
    server.reset();
    let world = moto::seed(server.endpoint()).await;
    let config = GateConfig {
        max_attempts: 2,
        base_delay: Duration::from_millis(20),
        ..GateConfig::aws_defaults()
    };
    let client = Gate::new(moto::aws_ec2(server.endpoint()).await, config);
    (server, world, client)
}

fn pod_tags() -> Tags {
    Tags::from([(POD_TAG.0.to_string(), POD_TAG.1.to_string())])
}

fn vpc_filter(world: &World) -> ResourceFilter {
    ResourceFilter {
        vpc_id: Some(world.vpc_id.clone()),
        ..Default::default()
    }
}

async fn enis(c: &Client, filter: &EniFilter) -> Vec<NetworkInterface> {
    every_page(|t| c.describe_network_interfaces(filter, t)).await
}

async fn eni(c: &Client, id: &str) -> NetworkInterface {
    let filter = EniFilter {
        ids: vec![id.to_string()],
        ..Default::default()
    };
    let mut found = enis(c, &filter).await;
    assert_eq!(found.len(), 1, "{id}");
    found.remove(0)
}

fn kind<T: std::fmt::Debug>(r: Result<T>) -> ErrorKind {
    r.unwrap_err().kind
}

fn ids<T>(items: &[T], id: impl Fn(&T) -> &str) -> BTreeSet<String> {
    items.iter().map(|i| id(i).to_string()).collect()
}

#[tokio::test]
async fn describes_round_trip() {
    let (_server, world, c) = setup().await;
    let in_vpc = vpc_filter(&world);

    // Instance types: moto has the real limits.
    let types = [
        "m5.large".to_string(),
        "t3.medium".to_string(),
        "t2.micro".to_string(),
    ];
    let limits = every_page(|t| c.describe_instance_types(&types, t)).await;
    let get = |name: &str| limits.iter().find(|l| l.instance_type == name).unwrap();
    let m5 = get("m5.large");
    assert_eq!((m5.max_enis, m5.ipv4_per_eni, m5.ipv6_per_eni), (3, 10, 10));
    assert!(m5.nitro && m5.supports_prefix_delegation());
    assert_eq!(
        (get("t3.medium").max_enis, get("t3.medium").ipv4_per_eni),
        (3, 6)
    );
    assert!(!get("t2.micro").nitro, "t2 runs on Xen");
    let err = c
        .describe_instance_types(&["m5.nonexistent".to_string()], None)
        .await
        .unwrap_err();
    assert_eq!(
        err.kind,
        ErrorKind::NotFound(Resource::InstanceType),
        "{err}"
    );

    // Instances, by VPC and by ID.
    let all = InstanceFilter {
        vpc_id: Some(world.vpc_id.clone()),
        ..Default::default()
    };
    let instances = every_page(|t| c.describe_instances(&all, t)).await;
    assert_eq!(ids(&instances, |i| &i.id), ids(&world.instances, |i| &i.id));
    // The seeded facts, as moto reports them.
    for seeded in &world.instances {
        let i = instances.iter().find(|i| i.id == seeded.id).unwrap();
        assert_eq!(i.instance_type, seeded.instance_type);
        assert_eq!(i.availability_zone, seeded.availability_zone);
        assert_eq!(i.subnet_id, seeded.subnet_id);
    }
    assert_eq!(world.region, moto::REGION);
    // moto enforces none of AWS's limits (docs/emulators.md): the contract suite skips those checks.
    assert!(!world.enforces_aws_rules);
    let one = InstanceFilter {
        ids: vec![world.instances[1].id.clone()],
        ..Default::default()
    };
    let page = c.describe_instances(&one, None).await.unwrap();
    let i = &page.items[0];
    assert_eq!(page.items.len(), 1);
    assert_eq!(i.instance_type, "t3.medium");
    assert_eq!(i.state, InstanceState::Running);
    assert_eq!(i.availability_zone, world.zone_b);
    assert_eq!(
        (i.vpc_id.as_str(), i.subnet_id.as_str()),
        (world.vpc_id.as_str(), world.subnets[2].id.as_str())
    );

    // Subnets: by VPC (moto's default VPC excluded), by tag, by ID; free counts.
    let subnets = every_page(|t| c.describe_subnets(&in_vpc, t)).await;
    assert_eq!(ids(&subnets, |s| &s.id), ids(&world.subnets, |s| &s.id));
    for seeded in &world.subnets {
        let subnet = subnets.iter().find(|s| s.id == seeded.id).unwrap();
        assert_eq!(subnet.cidr.to_string(), seeded.cidr);
        assert_eq!(subnet.availability_zone, seeded.availability_zone);
        assert_eq!(subnet.tags, seeded.tags.iter().cloned().collect::<Tags>());
    }
    let tagged = ResourceFilter {
        tags: pod_tags(),
        ..vpc_filter(&world)
    };
    let pods = c.describe_subnets(&tagged, None).await.unwrap().items;
    assert_eq!(
        ids(&pods, |s| &s.id),
        BTreeSet::from([world.subnets[1].id.clone()])
    );
    assert_eq!(pods[0].cidr.to_string(), "100.64.0.0/20");
    assert_eq!(pods[0].tags, pod_tags());
    assert_eq!(pods[0].available_addresses, 4096 - 5);
    let tiny = ResourceFilter {
        ids: vec![world.subnets[3].id.clone()],
        ..Default::default()
    };
    let tiny = c.describe_subnets(&tiny, None).await.unwrap().items;
    assert_eq!(tiny[0].available_addresses, 11);
    assert_eq!(tiny[0].availability_zone, world.zone_a);

    // VPC: primary and the associated secondary CIDR.
    let vpcs = c
        .describe_vpcs(&vpc_filter(&world), None)
        .await
        .unwrap()
        .items;
    assert_eq!(vpcs.len(), 1);
    assert_eq!(vpcs[0].primary_cidr.to_string(), world.vpc_cidr);
    let secondary: Vec<String> = vpcs[0]
        .secondary_cidrs
        .iter()
        .map(|c| c.to_string())
        .collect();
    assert_eq!(secondary, vec![world.vpc_secondary_cidr.clone()]);

    // Security groups: by VPC (the VPC's default group too), by tag.
    let groups = every_page(|t| c.describe_security_groups(&in_vpc, t)).await;
    let group_ids = ids(&groups, |g| &g.id);
    assert!(world.security_groups.iter().all(|g| group_ids.contains(g)));
    assert!(groups.iter().all(|g| g.vpc_id == world.vpc_id));
    let tagged = ResourceFilter {
        tags: pod_tags(),
        ..vpc_filter(&world)
    };
    let pods = c
        .describe_security_groups(&tagged, None)
        .await
        .unwrap()
        .items;
    assert_eq!(
        ids(&pods, |g| &g.id),
        BTreeSet::from([world.security_groups[0].clone()])
    );

    // Route tables: the VPC's main table.
    let tables = every_page(|t| c.describe_route_tables(&in_vpc, t)).await;
    assert!(tables.iter().any(|t| t.main), "{tables:?}");
    assert!(tables.iter().all(|t| t.vpc_id == world.vpc_id));

    // Every page took a token.
    assert!(c.stats().calls[&Operation::DescribeSubnets] >= 3);
}

#[tokio::test]
async fn eni_lifecycle_round_trips() {
    let (_server, world, c) = setup().await;
    let node = &world.instances[0];
    let tags = Tags::from([
        ("eni-operator/cluster".to_string(), "test".to_string()),
        ("eni-operator/node".to_string(), node.id.clone()),
    ]);
    let request = CreateEniRequest {
        subnet_id: world.subnets[1].id.clone(),
        security_groups: vec![world.security_groups[0].clone()],
        description: "eni-operator test".into(),
        tags: tags.clone(),
        addresses: AddressRequest::Ips(3),
        client_token: "eni-operator-test-token-1".into(),
    };
    let created = c.create_network_interface(&request).await.unwrap();
    assert!(created.id.starts_with("eni-"));
    assert_eq!(created.subnet_id, world.subnets[1].id);
    assert_eq!(created.vpc_id, world.vpc_id);
    assert_eq!(created.availability_zone, world.zone_a);
    assert_eq!(created.description, "eni-operator test");
    assert_eq!(created.tags, tags, "tags at creation");
    assert_eq!(
        created.security_groups,
        vec![world.security_groups[0].clone()]
    );
    assert_eq!(created.secondary_ips.len(), 3, "addresses inline");
    assert_eq!(created.state, EniState::Available);
    assert!(created.attachment.is_none());
    let subnet: ipnet::Ipv4Net = world.subnets[1].cidr.parse().unwrap();
    assert!(subnet.contains(&created.primary_ip));
    assert!(created.secondary_ips.iter().all(|ip| subnet.contains(ip)));

    // Filters: tag, subnet, VPC, status.
    let by_tag = EniFilter {
        tags: tags.clone(),
        ..Default::default()
    };
    assert_eq!(
        ids(&enis(&c, &by_tag).await, |e| &e.id),
        BTreeSet::from([created.id.clone()])
    );
    let by_subnet = EniFilter {
        subnet_ids: vec![world.subnets[1].id.clone()],
        ..Default::default()
    };
    assert_eq!(
        ids(&enis(&c, &by_subnet).await, |e| &e.id),
        BTreeSet::from([created.id.clone()])
    );
    let by_vpc = EniFilter {
        vpc_id: Some(world.vpc_id.clone()),
        ..Default::default()
    };
    let in_vpc = ids(&enis(&c, &by_vpc).await, |e| &e.id);
    assert!(in_vpc.contains(&created.id) && in_vpc.contains(&node.primary_eni_id));
    let available = EniFilter {
        vpc_id: Some(world.vpc_id.clone()),
        state: Some(EniState::Available),
        ..Default::default()
    };
    assert_eq!(
        ids(&enis(&c, &available).await, |e| &e.id),
        BTreeSet::from([created.id.clone()])
    );

    // Attach at device index 1; then the attachment filter finds both of the node's ENIs.
    let attachment_id = c
        .attach_network_interface(&created.id, &node.id, 1)
        .await
        .unwrap();
    let attached = eni(&c, &created.id).await;
    assert_eq!(attached.state, EniState::InUse);
    let a = attached.attachment.as_ref().unwrap();
    assert_eq!(
        (a.id.as_str(), a.instance_id.as_str(), a.device_index),
        (attachment_id.as_str(), node.id.as_str(), 1)
    );
    let on_node = EniFilter {
        instance_ids: vec![node.id.clone()],
        ..Default::default()
    };
    let node_enis = enis(&c, &on_node).await;
    assert_eq!(
        ids(&node_enis, |e| &e.id),
        BTreeSet::from([created.id.clone(), node.primary_eni_id.clone()])
    );
    let primary = node_enis
        .iter()
        .find(|e| e.id == node.primary_eni_id)
        .unwrap();
    assert_eq!(primary.device_index(), Some(0));

    // moto accepts and ignores Attachment.DeleteOnTermination (AWS applies it:
    // https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_ModifyNetworkInterfaceAttribute.html),
    // so only the call's acceptance is checked here; the simulator checks the effect.
    c.set_delete_on_termination(&created.id, &attachment_id, true)
        .await
        .unwrap();

    // Assign: moto's answer lists every address of the ENI, AWS's only the new ones
    // (https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_AssignPrivateIpAddresses.html):
    // merge as a set and count from the ENI's state.
    let assigned = c
        .assign_private_ip_addresses(&created.id, AddressRequest::Ips(2))
        .await
        .unwrap();
    let after = eni(&c, &created.id).await;
    let now: BTreeSet<Ipv4Addr> = after.secondary_ips.iter().copied().collect();
    assert_eq!(now.len(), 5);
    assert!(created.secondary_ips.iter().all(|ip| now.contains(ip)));
    assert!(
        assigned
            .ips
            .iter()
            .all(|ip| now.contains(ip) || *ip == after.primary_ip)
    );
    assert!(assigned.ips.len() >= 2);

    // Unassign two; an empty prefix list makes no call.
    let release: Vec<Ipv4Addr> = after.secondary_ips[..2].to_vec();
    c.unassign_private_ip_addresses(&created.id, &release, &[])
        .await
        .unwrap();
    let left: BTreeSet<Ipv4Addr> = eni(&c, &created.id)
        .await
        .secondary_ips
        .into_iter()
        .collect();
    assert_eq!(left.len(), 3);
    assert!(release.iter().all(|ip| !left.contains(ip)));

    // Detach, then delete; the deleted ENI is not found any more.
    c.detach_network_interface(&attachment_id, false)
        .await
        .unwrap();
    let detached = eni(&c, &created.id).await;
    assert_eq!(detached.state, EniState::Available);
    assert!(detached.attachment.is_none());
    c.delete_network_interface(&created.id).await.unwrap();
    let gone = EniFilter {
        ids: vec![created.id.clone()],
        ..Default::default()
    };
    let err = c
        .describe_network_interfaces(&gone, None)
        .await
        .unwrap_err();
    assert_eq!(
        err.kind,
        ErrorKind::NotFound(Resource::NetworkInterface),
        "{err}"
    );
}

#[tokio::test]
async fn prefix_requests_are_accepted_on_the_wire() {
    let (_server, world, c) = setup().await;
    // moto accepts Ipv4PrefixCount and delegates no prefix; AWS delegates the /28s
    // (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/ec2-prefix-eni.html). Only the wire
    // path is checked here; the simulator checks the semantics.
    let created = c
        .create_network_interface(&CreateEniRequest {
            subnet_id: world.subnets[1].id.clone(),
            security_groups: vec![world.security_groups[0].clone()],
            description: String::new(),
            tags: pod_tags(),
            addresses: AddressRequest::Prefixes(1),
            client_token: "eni-operator-test-prefix".into(),
        })
        .await
        .unwrap();
    c.assign_private_ip_addresses(&created.id, AddressRequest::Prefixes(1))
        .await
        .unwrap();
    let prefix: ipnet::Ipv4Net = "100.64.1.0/28".parse().unwrap();
    c.unassign_private_ip_addresses(&created.id, &[], &[prefix])
        .await
        .unwrap();
    assert_eq!(c.stats().calls[&Operation::UnassignPrivateIpAddresses], 1);
    c.delete_network_interface(&created.id).await.unwrap();
}

#[tokio::test]
async fn not_found_errors_are_classified() {
    let (_server, world, c) = setup().await;
    let node = &world.instances[0];

    let missing_subnet = CreateEniRequest {
        subnet_id: "subnet-0123456789abcdef0".into(),
        security_groups: vec![],
        description: String::new(),
        tags: Tags::new(),
        addresses: AddressRequest::Ips(0),
        client_token: "eni-operator-test-missing".into(),
    };
    assert_eq!(
        kind(c.create_network_interface(&missing_subnet).await),
        ErrorKind::NotFound(Resource::Subnet)
    );
    let missing_eni = "eni-0123456789abcdef0";
    assert_eq!(
        kind(
            c.attach_network_interface(&node.primary_eni_id, "i-0123456789abcdef0", 1)
                .await
        ),
        ErrorKind::NotFound(Resource::Instance)
    );
    assert_eq!(
        kind(c.attach_network_interface(missing_eni, &node.id, 1).await),
        ErrorKind::NotFound(Resource::NetworkInterface)
    );
    assert_eq!(
        kind(
            c.assign_private_ip_addresses(missing_eni, AddressRequest::Ips(1))
                .await
        ),
        ErrorKind::NotFound(Resource::NetworkInterface)
    );
    assert_eq!(
        kind(c.delete_network_interface(missing_eni).await),
        ErrorKind::NotFound(Resource::NetworkInterface)
    );
    assert_eq!(
        kind(
            c.detach_network_interface("eni-attach-0123456789abcdef0", false)
                .await
        ),
        ErrorKind::NotFound(Resource::Attachment)
    );
    let missing_instance = InstanceFilter {
        ids: vec!["i-0123456789abcdef0".into()],
        ..Default::default()
    };
    assert_eq!(
        kind(c.describe_instances(&missing_instance, None).await),
        ErrorKind::NotFound(Resource::Instance)
    );
    // Client errors are never retried: one call each.
    assert_eq!(c.stats().total_retries(), 0);
}

#[tokio::test]
async fn an_unreachable_endpoint_is_transient_and_retried() {
    // A port nothing listens on: connection refused, classified as transient.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let config = AwsClientConfig {
        region: Some(moto::REGION.into()),
        endpoint_url: Some(format!("http://127.0.0.1:{port}")),
        connect_timeout: Duration::from_secs(1),
        operation_timeout: Duration::from_secs(2),
        max_results_per_call: Some(5),
    };
    let aws = AwsEc2::from_loader(
        config
            .loader()
            .credentials_provider(aws_sdk_ec2::config::Credentials::new(
                "a", "b", None, None, "test",
            )),
        config.max_results_per_call,
    )
    .await;
    let gate = Gate::new(
        aws,
        GateConfig {
            max_attempts: 2,
            base_delay: Duration::from_millis(10),
            ..GateConfig::aws_defaults()
        },
    );
    let err = gate
        .describe_subnets(&ResourceFilter::default(), None)
        .await
        .unwrap_err();
    assert_eq!(err.kind, ErrorKind::Transient, "{err}");
    assert_eq!(gate.stats().calls[&Operation::DescribeSubnets], 2);
}

/// `AwsEc2::new` as in production, with region, credentials and endpoint only from the
/// environment: `AWS_ENDPOINT_URL_EC2` (which wins over `AWS_ENDPOINT_URL`) and
/// `AWS_ENDPOINT_URL` alone, each in a child process given only these variables.
#[tokio::test]
async fn production_config_reads_the_environment() {
    if child::in_child() {
        let client = AwsEc2::new(&AwsClientConfig::default()).await;
        let vpcs = client
            .describe_vpcs(&ResourceFilter::default(), None)
            .await
            .expect("describe VPCs through the endpoint from the environment");
        // moto's default VPC.
        assert!(!vpcs.items.is_empty());
        return;
    }
    let server = MotoServer::start();
    let dead = format!(
        "http://127.0.0.1:{}",
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    );
    let service_specific = [
        ("AWS_ENDPOINT_URL_EC2", server.endpoint()),
        ("AWS_ENDPOINT_URL", dead.as_str()),
    ];
    let generic = [("AWS_ENDPOINT_URL", server.endpoint())];
    for envs in [&service_specific[..], &generic[..]] {
        child::run_alone(
            module_path!(),
            "production_config_reads_the_environment",
            |cmd| {
                cmd.env_clear()
                    .env("AWS_REGION", moto::REGION)
                    .env("AWS_ACCESS_KEY_ID", "testing")
                    .env("AWS_SECRET_ACCESS_KEY", "testing")
                    .env("AWS_EC2_METADATA_DISABLED", "true")
                    .envs(envs.iter().copied());
            },
        );
    }
}
