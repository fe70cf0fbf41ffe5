//! The EC2 contract suite (`tests/it/contract`), run twice: against the in-memory simulator
//! (which enforces AWS's rules) and against moto's EC2 server (the real SDK client on the wire,
//! through the gate). A missing moto is a failure, never a skip: see `support::moto`.

use crate::{contract, support};

use eni_operator::ec2::Tags;
use testkit::sim::Simulator;
use testkit::world::{SeededInstance, SeededSubnet, World};

/// The seeded world of `testkit::world`, in a fresh simulator with a describe page size of 2
/// so every describe in the suite walks several pages.
fn simulator_world() -> (Simulator, World) {
    let sim = Simulator::new();
    sim.set_page_size(2);
    let (zone_a, zone_b) = ("us-east-1a", "us-east-1b");
    let (vpc_cidr, secondary) = ("10.0.0.0/16", "100.64.0.0/16");
    let vpc_id = sim.add_vpc(vpc_cidr.parse().unwrap(), &[secondary.parse().unwrap()]);
    let pod_tag = || vec![("eni-operator-test/pods".to_owned(), "true".to_owned())];
    let subnets: Vec<SeededSubnet> = [
        (zone_a, "10.0.0.0/24", vec![]),
        (zone_a, "100.64.0.0/20", pod_tag()),
        (zone_b, "10.0.16.0/24", vec![]),
        (zone_a, "10.0.32.0/28", vec![]),
    ]
    .into_iter()
    .map(|(zone, cidr, tags)| SeededSubnet {
        id: sim.add_subnet(
            &vpc_id,
            zone,
            cidr.parse().unwrap(),
            tags.iter().cloned().collect(),
        ),
        availability_zone: zone.to_owned(),
        cidr: cidr.to_owned(),
        tags,
    })
    .collect();
    sim.add_route_table(&vpc_id, true, &[]);
    let security_groups = vec![
        sim.add_security_group(&vpc_id, pod_tag().into_iter().collect()),
        sim.add_security_group(&vpc_id, Tags::new()),
    ];
    let instances = [("m5.large", 0), ("t3.medium", 2)]
        .into_iter()
        .map(|(instance_type, subnet)| {
            let subnet = &subnets[subnet];
            let i = sim.run_instance(instance_type, &subnet.id, &security_groups[1..]);
            SeededInstance {
                primary_eni_id: sim.primary_eni_id(&i.id).expect("primary ENI"),
                id: i.id,
                instance_type: instance_type.to_owned(),
                availability_zone: subnet.availability_zone.clone(),
                subnet_id: subnet.id.clone(),
            }
        })
        .collect();
    let world = World {
        region: "us-east-1".to_owned(),
        zone_a: zone_a.to_owned(),
        zone_b: zone_b.to_owned(),
        vpc_id,
        vpc_cidr: vpc_cidr.to_owned(),
        vpc_secondary_cidr: secondary.to_owned(),
        subnets,
        security_groups,
        instances,
        enforces_aws_rules: true,
    };
    (sim, world)
}

/// Run one contract check, then the simulator's own invariants over what it left behind.
macro_rules! sim_contract {
    ($($check:ident),* $(,)?) => {$(
        #[tokio::test]
        async fn $check() {
            let (sim, world) = simulator_world();
            assert_eq!(world.region, "us-east-1");
            contract::$check(&sim, &world).await;
            sim.check_invariants().unwrap();
            assert_eq!(sim.stats().total().throttled, 0, "the suite stays within AWS's buckets");
        }
    )*};
}

/// The contract's checks, named once for every backend.
macro_rules! each_check {
    ($backend:ident) => {
        $backend!(
            describes,
            create_attach_assign_unassign_detach_delete,
            not_found_errors,
            idempotent_create,
            pagination,
            limits_and_exhaustion,
        );
    };
}

each_check!(sim_contract);

/// The same checks against moto: `AwsEc2` behind the gate, on a moto server of its own per test
/// (moto's state is global to a server; separate servers keep parallel tests apart).
macro_rules! moto_contract {
    ($($check:ident),* $(,)?) => {
        mod moto_backend {
            use super::*;
            $(
                #[tokio::test]
                async fn $check() {
                    let server = support::moto::MotoServer::start();
                    let world = support::moto::seed(server.endpoint()).await;
                    assert!(!world.enforces_aws_rules);
                    let ec2 = eni_operator::ec2::gate::Gate::new(
                        support::moto::aws_ec2(server.endpoint()).await,
                        eni_operator::ec2::gate::GateConfig::aws_defaults(),
                    );
                    contract::$check(&ec2, &world).await;
                }
            )*
        }
    };
}

each_check!(moto_contract);

/// The same checks against `ec2-sim`: the simulator served as the EC2 Query API on a free
/// loopback port in this test's runtime, `AwsEc2` (the real aws-sdk-ec2) behind the gate as its
/// client. The simulator underneath still enforces AWS's rules and is checked as above.
macro_rules! wire_contract {
    ($($check:ident),* $(,)?) => {
        mod ec2_sim_backend {
            use super::*;
            $(
                #[tokio::test]
                async fn $check() {
                    let (sim, world) = simulator_world();
                    let zones = vec![world.zone_a.clone(), world.zone_b.clone()];
                    let (addr, _server) = testkit::wire::Server::new(sim.clone(), zones)
                        .spawn("127.0.0.1:0")
                        .await
                        .expect("serve ec2-sim");
                    let ec2 = eni_operator::ec2::gate::Gate::new(
                        support::moto::aws_ec2(&format!("http://{addr}")).await,
                        eni_operator::ec2::gate::GateConfig::aws_defaults(),
                    );
                    contract::$check(&ec2, &world).await;
                    sim.check_invariants().unwrap();
                    assert_eq!(sim.stats().total().throttled, 0, "the suite stays within AWS's buckets");
                    assert!(sim.stats().total().calls > 0, "the calls went through ec2-sim");
                }
            )*
        }
    };
}

each_check!(wire_contract);

/// Elastic IPs (static IPs) on the simulator: two tagged addresses and an untagged one.
#[tokio::test]
async fn addresses() {
    use std::net::Ipv4Addr;
    let (sim, world) = simulator_world();
    let tag = || {
        Tags::from([(
            contract::EIP_TAG.0.to_owned(),
            contract::EIP_TAG.1.to_owned(),
        )])
    };
    let tagged = vec![
        sim.add_address(Ipv4Addr::new(198, 51, 100, 1), tag()),
        sim.add_address(Ipv4Addr::new(198, 51, 100, 2), tag()),
    ];
    let untagged = sim.add_address(Ipv4Addr::new(198, 51, 100, 3), Tags::new());
    contract::addresses(&sim, &world, &tagged, &untagged).await;
    sim.check_invariants().unwrap();
}

/// The same on moto (AllocateAddress through the SDK: the operator never allocates).
#[tokio::test]
async fn addresses_on_moto() {
    let server = support::moto::MotoServer::start();
    let world = support::moto::seed(server.endpoint()).await;
    let sdk = support::moto::sdk_client(server.endpoint());
    let allocate = |tagged: bool| {
        let sdk = sdk.clone();
        async move {
            let mut req = sdk
                .allocate_address()
                .domain(aws_sdk_ec2::types::DomainType::Vpc);
            if tagged {
                req = req.tag_specifications(
                    aws_sdk_ec2::types::TagSpecification::builder()
                        .resource_type(aws_sdk_ec2::types::ResourceType::ElasticIp)
                        .tags(
                            aws_sdk_ec2::types::Tag::builder()
                                .key(contract::EIP_TAG.0)
                                .value(contract::EIP_TAG.1)
                                .build(),
                        )
                        .build(),
                );
            }
            req.send().await.unwrap().allocation_id.unwrap()
        }
    };
    let tagged = vec![allocate(true).await, allocate(true).await];
    let untagged = allocate(false).await;
    let ec2 = eni_operator::ec2::gate::Gate::new(
        support::moto::aws_ec2(server.endpoint()).await,
        eni_operator::ec2::gate::GateConfig::aws_defaults(),
    );
    contract::addresses(&ec2, &world, &tagged, &untagged).await;
}
