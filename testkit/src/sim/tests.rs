//! The simulator's own mechanics: throttling through the API, latency, faults, counters,
//! asynchronous detach, termination and invariants. AWS's rules per operation are covered by
//! the contract suite (`tests/it/contract`).

use std::time::Duration;

use super::*;
use eni_operator::ec2::error::ErrorKind;

fn net(s: &str) -> Ipv4Net {
    s.parse().unwrap()
}

/// One VPC, one /24 subnet in zone a, one group, one m5.large.
fn small_world() -> (Simulator, String, String, Instance) {
    let sim = Simulator::new();
    let vpc = sim.add_vpc(net("10.0.0.0/16"), &[]);
    let subnet = sim.add_subnet(&vpc, "us-east-1a", net("10.0.0.0/24"), Tags::new());
    let sg = sim.add_security_group(&vpc, Tags::new());
    let inst = sim.run_instance("m5.large", &subnet, std::slice::from_ref(&sg));
    (sim, subnet, sg, inst)
}

fn create_req(subnet: &str, sg: &str, addresses: AddressRequest, token: &str) -> CreateEniRequest {
    CreateEniRequest {
        subnet_id: subnet.to_owned(),
        security_groups: vec![sg.to_owned()],
        description: "test".to_owned(),
        tags: Tags::new(),
        addresses,
        client_token: token.to_owned(),
    }
}

#[tokio::test(start_paused = true)]
async fn api_calls_are_throttled_per_bucket_and_refill_with_tokio_time() {
    let (sim, ..) = small_world();
    sim.set_bucket(Bucket::DescribeVpcs, 5, 2);
    let f = ResourceFilter::default();
    let mut answers = Vec::new();
    for _ in 0..8 {
        answers.push(sim.describe_vpcs(&f, None).await);
    }
    let throttled: Vec<_> = answers.iter().filter_map(|a| a.as_ref().err()).collect();
    assert_eq!(throttled.len(), 3);
    assert!(throttled.iter().all(|e| e.kind == ErrorKind::Throttled
        && e.code == "RequestLimitExceeded"
        && e.operation == Operation::DescribeVpcs));
    // Each action has its own bucket (AWS evaluates each API individually): another describe
    // and a mutation go through.
    assert!(sim.describe_subnets(&f, None).await.is_ok());
    let eni = sim
        .describe_network_interfaces(&EniFilter::default(), None)
        .await;
    assert!(eni.is_ok());
    let missing = sim.delete_network_interface("eni-0").await.unwrap_err();
    assert!(missing.is_not_found(), "{missing}");
    tokio::time::advance(Duration::from_millis(1000)).await;
    assert!(sim.describe_vpcs(&f, None).await.is_ok());
    assert!(sim.describe_vpcs(&f, None).await.is_ok());
    assert!(
        sim.describe_vpcs(&f, None)
            .await
            .unwrap_err()
            .is_throttled()
    );

    let stats = sim.stats();
    let vpcs = stats.get(Operation::DescribeVpcs);
    assert_eq!((vpcs.calls, vpcs.ok, vpcs.throttled), (11, 7, 4));
    assert_eq!(stats.get(Operation::DeleteNetworkInterface).rejected, 1);
    assert_eq!(stats.total().calls, 14);
}

#[tokio::test(start_paused = true)]
async fn default_buckets_are_aws_documented_ones() {
    let (sim, subnet, sg, inst) = small_world();
    // Attach's own bucket: 50 burst. Attach calls fail on the rules but still take tokens.
    let eni = sim
        .create_network_interface(&create_req(&subnet, &sg, AddressRequest::Ips(0), ""))
        .await
        .unwrap();
    let mut throttled = 0;
    for _ in 0..60 {
        if let Err(e) = sim.attach_network_interface(&eni.id, &inst.id, 0).await
            && e.is_throttled()
        {
            throttled += 1;
        }
    }
    assert_eq!(throttled, 10);
    sim.disable_throttling();
    assert!(
        sim.attach_network_interface(&eni.id, &inst.id, 1)
            .await
            .is_ok()
    );
}

#[tokio::test(start_paused = true)]
async fn latency_is_tokio_time() {
    let (sim, ..) = small_world();
    sim.set_latency(Operation::DescribeSubnets, Duration::from_secs(3));
    let start = Instant::now();
    sim.describe_subnets(&ResourceFilter::default(), None)
        .await
        .unwrap();
    assert_eq!(start.elapsed(), Duration::from_secs(3));
    let start = Instant::now();
    sim.describe_vpcs(&ResourceFilter::default(), None)
        .await
        .unwrap();
    assert_eq!(start.elapsed(), Duration::ZERO);
}

#[tokio::test]
async fn one_off_and_random_faults_are_counted() {
    let (sim, subnet, sg, _) = small_world();
    let op = Operation::CreateNetworkInterface;
    sim.inject_error(op, "InternalError", 2);
    let req = create_req(&subnet, &sg, AddressRequest::Ips(1), "");
    for _ in 0..2 {
        let e = sim.create_network_interface(&req).await.unwrap_err();
        assert_eq!(
            (e.kind, e.code.as_str()),
            (ErrorKind::Transient, "InternalError")
        );
    }
    assert!(sim.create_network_interface(&req).await.is_ok());

    sim.set_seed(42);
    sim.set_fault_rate(
        Operation::DescribeVpcs,
        0.5,
        Fault::new("Unavailable", "try later", 503),
    );
    sim.disable_throttling();
    let mut failed = 0;
    for _ in 0..400 {
        if sim
            .describe_vpcs(&ResourceFilter::default(), None)
            .await
            .is_err()
        {
            failed += 1;
        }
    }
    assert!((150..250).contains(&failed), "{failed} of 400 at 50%");
    let stats = sim.stats();
    assert_eq!(stats.get(op).faults, 2);
    assert_eq!(stats.get(op).ok, 1);
    let vpcs = stats.get(Operation::DescribeVpcs);
    assert_eq!(vpcs.faults, failed);
    assert_eq!(vpcs.ok + vpcs.faults, 400);
    // A fault leaves no trace in the state: only one ENI besides the primary was created.
    let enis = sim
        .describe_network_interfaces(&EniFilter::default(), None)
        .await
        .unwrap();
    assert_eq!(enis.items.len(), 2);
}

#[tokio::test]
async fn client_tokens_are_at_most_64_ascii_characters() {
    let (sim, subnet, sg, _) = small_world();
    let ok = "a".repeat(64);
    assert!(
        sim.create_network_interface(&create_req(&subnet, &sg, AddressRequest::Ips(0), &ok))
            .await
            .is_ok()
    );
    for bad in ["a".repeat(65), "é".to_owned()] {
        let e = sim
            .create_network_interface(&create_req(&subnet, &sg, AddressRequest::Ips(0), &bad))
            .await
            .unwrap_err();
        assert_eq!(
            (e.kind, e.code.as_str()),
            (ErrorKind::Other, "InvalidParameterValue")
        );
    }
}

#[tokio::test(start_paused = true)]
async fn detach_takes_the_configured_delay() {
    let (sim, subnet, sg, inst) = small_world();
    sim.set_detach_delay(Duration::from_secs(5));
    let eni = sim
        .create_network_interface(&create_req(&subnet, &sg, AddressRequest::Ips(2), ""))
        .await
        .unwrap();
    let att = sim
        .attach_network_interface(&eni.id, &inst.id, 1)
        .await
        .unwrap();
    sim.detach_network_interface(&att, false).await.unwrap();
    let now = sim.network_interface(&eni.id).unwrap();
    assert_eq!(now.state, EniState::Detaching);
    assert_eq!(now.device_index(), Some(1));
    // Still in use while detaching, and its device index is still taken.
    let e = sim.delete_network_interface(&eni.id).await.unwrap_err();
    assert!(e.message.contains("currently in use"), "{e}");
    let other = sim
        .create_network_interface(&create_req(&subnet, &sg, AddressRequest::Ips(0), ""))
        .await
        .unwrap();
    let e = sim
        .attach_network_interface(&other.id, &inst.id, 1)
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::DeviceIndexInUse);
    tokio::time::advance(Duration::from_secs(5)).await;
    let after = sim.network_interface(&eni.id).unwrap();
    assert_eq!((after.state, after.attachment), (EniState::Available, None));
    sim.delete_network_interface(&eni.id).await.unwrap();
    sim.check_invariants().unwrap();
}

#[tokio::test]
async fn termination_deletes_only_delete_on_termination_enis() {
    let (sim, subnet, sg, inst) = small_world();
    let free_before = sim.lock().state.subnets[&subnet].pool.available();
    let primary = sim.primary_eni_id(&inst.id).unwrap();
    let p = sim.network_interface(&primary).unwrap();
    assert!(p.attachment.as_ref().unwrap().delete_on_termination);
    let mut ids = Vec::new();
    for (i, dot) in [(1, true), (2, false)] {
        let eni = sim
            .create_network_interface(&create_req(&subnet, &sg, AddressRequest::Ips(3), ""))
            .await
            .unwrap();
        let att = sim
            .attach_network_interface(&eni.id, &inst.id, i)
            .await
            .unwrap();
        sim.set_delete_on_termination(&eni.id, &att, dot)
            .await
            .unwrap();
        ids.push(eni.id);
    }
    assert!(sim.terminate_instance(&inst.id));
    assert!(sim.network_interface(&primary).is_none());
    assert!(sim.network_interface(&ids[0]).is_none());
    let kept = sim.network_interface(&ids[1]).unwrap();
    assert_eq!((kept.state, kept.attachment), (EniState::Available, None));
    // Primary (1) and the deleted ENI (4) are back; the kept ENI still holds 4.
    assert_eq!(
        sim.lock().state.subnets[&subnet].pool.available(),
        free_before + 1 - 4
    );
    let i = sim
        .describe_instances(&InstanceFilter::default(), None)
        .await
        .unwrap();
    assert_eq!(i.items[0].state, InstanceState::Terminated);
    let e = sim
        .attach_network_interface(&ids[1], &inst.id, 1)
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::InstanceNotRunning);
    sim.check_invariants().unwrap();
}

#[tokio::test]
async fn prefixes_need_nitro_or_bare_metal() {
    let (sim, subnet, sg, _) = small_world();
    let xen = sim.run_instance("t2.medium", &subnet, std::slice::from_ref(&sg));
    let metal = sim.run_instance("m5.metal", &subnet, std::slice::from_ref(&sg));
    for (inst, ok) in [(&xen, false), (&metal, true)] {
        let eni = sim
            .create_network_interface(&create_req(&subnet, &sg, AddressRequest::Ips(0), ""))
            .await
            .unwrap();
        sim.attach_network_interface(&eni.id, &inst.id, 1)
            .await
            .unwrap();
        let r = sim
            .assign_private_ip_addresses(&eni.id, AddressRequest::Prefixes(1))
            .await;
        assert_eq!(r.is_ok(), ok, "{}: {r:?}", inst.instance_type);
        if let Err(e) = r {
            assert_eq!(
                (e.kind, e.code.as_str()),
                (ErrorKind::Other, "InvalidParameterValue")
            );
        }
    }
    // An unattached ENI with a prefix cannot go onto a Xen instance either.
    let eni = sim
        .create_network_interface(&create_req(&subnet, &sg, AddressRequest::Prefixes(1), ""))
        .await
        .unwrap();
    assert_eq!(eni.prefixes.len(), 1);
    let e = sim
        .attach_network_interface(&eni.id, &xen.id, 2)
        .await
        .unwrap_err();
    assert!(e.message.contains("Prefix delegation"), "{e}");
    sim.check_invariants().unwrap();
}

#[tokio::test]
async fn clones_share_state_and_invariants_hold_under_concurrency() {
    let (sim, subnet, sg, _) = small_world();
    sim.disable_throttling();
    let tasks: Vec<_> = (0..20)
        .map(|i| {
            let sim = sim.clone();
            let req = create_req(
                &subnet,
                &sg,
                AddressRequest::Ips(10),
                &format!("t{}", i % 10),
            );
            tokio::spawn(async move { sim.create_network_interface(&req).await })
        })
        .collect();
    let mut ids = std::collections::BTreeSet::new();
    for t in tasks {
        ids.insert(t.await.unwrap().unwrap().id);
    }
    // Ten distinct tokens: ten ENIs, whatever the interleaving.
    assert_eq!(ids.len(), 10);
    sim.check_invariants().unwrap();
    let s = sim
        .describe_subnets(&ResourceFilter::default(), None)
        .await
        .unwrap();
    assert_eq!(s.items[0].available_addresses, 251 - 1 - 10 * 11);
}

mod invariants {
    //! Random operation sequences never break AWS's invariants, and a rejected call changes
    //! nothing (EC2's calls are all or nothing).

    use proptest::prelude::*;

    use super::*;

    #[derive(Clone, Debug)]
    enum Op {
        Create {
            subnet: usize,
            prefixes: bool,
            n: u32,
        },
        Attach {
            eni: usize,
            instance: usize,
            device: u32,
        },
        Assign {
            eni: usize,
            prefixes: bool,
            n: u32,
        },
        Unassign {
            eni: usize,
            ips: usize,
            prefixes: usize,
        },
        Detach {
            eni: usize,
        },
        Delete {
            eni: usize,
        },
        Terminate {
            instance: usize,
        },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => (0..3usize, any::<bool>(), 0..20u32)
                .prop_map(|(subnet, prefixes, n)| Op::Create { subnet, prefixes, n }),
            6 => (0..64usize, 0..2usize, 1..5u32)
                .prop_map(|(eni, instance, device)| Op::Attach { eni, instance, device }),
            3 => (0..64usize, any::<bool>(), 1..12u32)
                .prop_map(|(eni, prefixes, n)| Op::Assign { eni, prefixes, n }),
            2 => (0..64usize, 0..4usize, 0..2usize)
                .prop_map(|(eni, ips, prefixes)| Op::Unassign { eni, ips, prefixes }),
            1 => (0..64usize).prop_map(|eni| Op::Detach { eni }),
            1 => (0..64usize).prop_map(|eni| Op::Delete { eni }),
            1 => (0..3usize).prop_map(|instance| Op::Terminate { instance }),
        ]
    }

    type Snapshot = (Vec<NetworkInterface>, Vec<u32>);

    fn snapshot(st: &State) -> Snapshot {
        (
            st.enis.values().map(|r| r.eni.clone()).collect(),
            st.subnets.values().map(|s| s.pool.available()).collect(),
        )
    }

    fn pick(st: &State, i: usize) -> Option<NetworkInterface> {
        let n = st.enis.len();
        (n > 0).then(|| st.enis.values().nth(i % n).unwrap().eni.clone())
    }

    fn apply(st: &mut State, subnets: &[String], instances: &[String], op: &Op) -> bool {
        let now = Instant::now();
        let req = |addresses| CreateEniRequest {
            subnet_id: String::new(),
            security_groups: Vec::new(),
            description: String::new(),
            tags: Tags::new(),
            addresses,
            client_token: String::new(),
        };
        match *op {
            Op::Create {
                subnet,
                prefixes,
                n,
            } => {
                let addresses = if prefixes {
                    AddressRequest::Prefixes(n % 4)
                } else {
                    AddressRequest::Ips(n)
                };
                let mut r = req(addresses);
                r.subnet_id = subnets[subnet].clone();
                st.create_network_interface(&r).is_ok()
            }
            Op::Attach {
                eni,
                instance,
                device,
            } => pick(st, eni).is_some_and(|e| {
                st.attach_network_interface(&e.id, &instances[instance], device)
                    .is_ok()
            }),
            Op::Assign { eni, prefixes, n } => pick(st, eni).is_some_and(|e| {
                let r = if prefixes {
                    AddressRequest::Prefixes(n % 3 + 1)
                } else {
                    AddressRequest::Ips(n)
                };
                st.assign_private_ip_addresses(&e.id, r).is_ok()
            }),
            Op::Unassign { eni, ips, prefixes } => pick(st, eni).is_some_and(|e| {
                let mut ips: Vec<_> = e.secondary_ips.iter().take(ips).copied().collect();
                // Sometimes ask for an address the ENI does not hold: all must be refused.
                if ips.len() == 3 {
                    ips.push(e.primary_ip);
                }
                let prefixes: Vec<_> = e.prefixes.iter().take(prefixes).copied().collect();
                st.unassign_private_ip_addresses(
                    Operation::UnassignPrivateIpAddresses,
                    &e.id,
                    &ips,
                    &prefixes,
                )
                .is_ok()
            }),
            Op::Detach { eni } => pick(st, eni)
                .and_then(|e| e.attachment)
                .is_some_and(|a| st.detach_network_interface(&a.id, now).is_ok()),
            Op::Delete { eni } => {
                pick(st, eni).is_some_and(|e| st.delete_network_interface(&e.id).is_ok())
            }
            Op::Terminate { instance } => {
                st.terminate_instance(&instances[instance]);
                true
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        #[test]
        fn invariants_hold_and_rejections_leave_no_trace(ops in prop::collection::vec(op(), 1..60)) {
            let sim = Simulator::new();
            let vpc = sim.add_vpc(net("10.0.0.0/16"), &[]);
            let subnets = vec![
                sim.add_subnet(&vpc, "a", net("10.0.0.0/24"), Tags::new()),
                sim.add_subnet(&vpc, "a", net("10.0.1.0/26"), Tags::new()),
                sim.add_subnet(&vpc, "b", net("10.0.2.0/27"), Tags::new()),
            ];
            let instances: Vec<String> = [("t3.medium", 0), ("t2.medium", 1), ("m5.large", 2)]
                .iter()
                .map(|(t, s)| sim.run_instance(t, &subnets[*s], &[]).id)
                .collect();
            let mut inner = sim.lock();
            let st = &mut inner.state;
            for op in &ops {
                let before = snapshot(st);
                let ok = apply(st, &subnets, &instances, op);
                if !ok && !matches!(op, Op::Terminate { .. }) {
                    prop_assert_eq!(&before, &snapshot(st), "{:?} was refused but changed state", op);
                }
                if let Err(e) = st.check_invariants() {
                    return Err(TestCaseError::fail(format!("after {op:?}: {e}")));
                }
            }
        }
    }
}

/// A harness skips re-checking an unchanged account by its generation (dst's view), and a
/// replay compares the call log: reads leave the generation alone, every change moves it, and
/// every answered call is logged with its instant and answer.
#[tokio::test(start_paused = true)]
async fn the_generation_moves_with_every_change_and_the_log_holds_every_answer() {
    let (sim, subnet, sg, inst) = small_world();
    sim.record_calls();
    let g0 = sim.generation();
    sim.describe_network_interfaces(&EniFilter::default(), None)
        .await
        .unwrap();
    let _ = sim.network_interfaces();
    sim.check_invariants().unwrap();
    assert_eq!(sim.generation(), g0, "reads change nothing");
    let eni = sim
        .create_network_interface(&create_req(&subnet, &sg, AddressRequest::Ips(1), "t"))
        .await
        .unwrap();
    let g1 = sim.generation();
    assert!(g1 > g0, "a mutating call");
    sim.inject_error(Operation::DeleteNetworkInterface, "InternalError", 1);
    assert!(sim.delete_network_interface(&eni.id).await.is_err());
    assert!(sim.terminate_instance(&inst.id));
    assert!(sim.generation() > g1, "a harness change");
    let log = sim.take_calls();
    let answers: Vec<(Operation, &str)> = log.iter().map(|c| (c.op, c.answer.as_str())).collect();
    assert_eq!(
        answers,
        vec![
            (Operation::DescribeNetworkInterfaces, "ok"),
            (Operation::CreateNetworkInterface, "ok"),
            (Operation::DeleteNetworkInterface, "InternalError"),
        ]
    );
    assert!(sim.take_calls().is_empty(), "taken");
}
