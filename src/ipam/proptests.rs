//! Property tests of the engine over random nodes: both generations, prefix and /32 modes,
//! random ENIs, limits, subnets and watermarks.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use ipnet::Ipv4Net;
use proptest::prelude::*;

use crate::crd::{AllocationIp, CiliumNode, IpamPoolAllocation, IpamPoolRequest, ReleaseState};
use crate::ec2::{AddressRequest, NetworkInterface, PREFIX_SIZE, prefix_addresses};

use super::capacity::{free_slots, usable_addresses, usable_enis};
use super::fixtures::*;
use super::{Action, IpamConfig, NodeMemory, NodePlan, desired_state, plan_node};

/// One random node and its EC2 world.
#[derive(Clone, Debug)]
struct Case {
    world: World,
    node: CiliumNode,
    config: IpamConfig,
    pending: u32,
}

/// Per ENI: (singles, prefixes, subnet index).
type EniShape = (u32, u32, usize);

fn build(
    (max_enis, per_eni, nitro): (u32, u32, bool),
    shapes: Vec<EniShape>,
    frees: Vec<u32>,
    (pd, use_primary, multi_pool): (bool, bool, bool),
    (pre, min, max, above, first): (i64, i64, i64, i64, i64),
    (requested, pending, pick): (i64, u32, Vec<u8>),
) -> Case {
    let mut world = World::new();
    world.limits = Some(limits(max_enis, per_eni, nitro));
    world.subnets.clear();
    for (i, free) in frees.iter().enumerate() {
        world.add_subnet(subnet(
            &format!("subnet-{i}"),
            &format!("10.{i}.0.0/16"),
            *free,
        ));
    }
    world.enis.clear();
    for (i, (singles, prefixes, s)) in shapes.iter().take(max_enis as usize).enumerate() {
        let index = i as u32;
        let mut e = eni(&format!("eni-{i}"), index, &format!("subnet-{s}"));
        let slots = per_eni - 1;
        let prefixes = (*prefixes).min(slots);
        let singles = (*singles).min(slots - prefixes);
        e.secondary_ips = (0..singles)
            .map(|k| Ipv4Addr::new(10, 50 + i as u8, 0, k as u8 + 1))
            .collect();
        e.prefixes = (0..prefixes)
            .map(|k| Ipv4Net::new(Ipv4Addr::new(10, 50 + i as u8, 1, (k * 16) as u8), 28).unwrap())
            .collect();
        world.enis.push(e);
    }
    let mut node = node();
    node.spec.eni.node_subnet_id = "subnet-0".into();
    node.spec.eni.first_interface_index = Some(first);
    node.spec.ipam.pre_allocate = pre;
    node.spec.ipam.min_allocate = min;
    node.spec.ipam.max_allocate = max;
    node.spec.ipam.max_above_watermark = above;
    let config = IpamConfig {
        prefix_delegation: pd,
        use_primary_address: use_primary,
        release_excess_ips: true,
        release_delay: Duration::from_secs(10),
        cluster_name: "prop".into(),
        ..Default::default()
    };
    // Everything the node holds, to pick `used`, `allocated` and agent answers from.
    let held: Vec<Ipv4Addr> = world
        .enis
        .iter()
        .flat_map(|e| usable_addresses(e, use_primary))
        .collect();
    let status = node.status.get_or_insert_default();
    for (k, addr) in held.iter().enumerate() {
        let p = pick.get(k % pick.len().max(1)).copied().unwrap_or(0);
        if !multi_pool && p % 3 == 0 {
            status
                .ipam
                .used
                .insert(addr.to_string(), AllocationIp::default());
        }
        // Agent answers, some of them (wrongly) on used addresses: never trusted alone.
        let answer = match p % 4 {
            0 | 1 => Some(ReleaseState::ReadyForRelease),
            2 => Some(ReleaseState::DoNotRelease),
            _ => None,
        };
        if let Some(a) = answer {
            status
                .ipam
                .release_ips
                .insert(addr.to_string(), a.as_str().into());
        }
    }
    if multi_pool {
        let mut req = IpamPoolRequest {
            pool: "default".into(),
            ..Default::default()
        };
        req.needed.ipv4_addrs = requested;
        node.spec.ipam.pools.requested.push(req);
        let usable: Vec<&NetworkInterface> = world.enis.iter().collect();
        let cidrs = super::release::attached_cidrs(&usable, use_primary);
        node.spec.ipam.pools.allocated.push(IpamPoolAllocation {
            pool: "default".into(),
            cidrs: cidrs
                .keys()
                .enumerate()
                .filter(|(k, _)| pick.get(k % pick.len().max(1)).copied().unwrap_or(0) % 2 == 0)
                .map(|(_, c)| c.to_string())
                .collect(),
            ..Default::default()
        });
        status.ipam.used.clear();
    }
    Case {
        world,
        node,
        config,
        pending,
    }
}

fn case() -> impl Strategy<Value = Case> {
    (
        (1u32..=5, 2u32..=16, any::<bool>()),
        prop::collection::vec((0u32..16, 0u32..4, 0usize..3), 1..5),
        prop::collection::vec(0u32..400, 3),
        (any::<bool>(), any::<bool>(), any::<bool>()),
        (
            0i64..20,
            0i64..80,
            prop_oneof![Just(0i64), 1i64..300],
            0i64..20,
            0i64..2,
        ),
        (
            0i64..200,
            0u32..40,
            prop::collection::vec(any::<u8>(), 1..20),
        ),
    )
        .prop_map(|(l, shapes, frees, flags, marks, rest)| {
            build(l, shapes, frees, flags, marks, rest)
        })
}

fn plan(c: &Case, memory: &mut NodeMemory, now: Instant) -> NodePlan {
    plan_node(&c.node, &c.world.view(), &c.config, memory, now, c.pending)
}

/// needed + W + surge.
fn allocation_cap(p: &NodePlan, c: &Case) -> u32 {
    let surge = (i64::from(c.pending) - p.demand.needed).max(0);
    (p.demand.needed + c.node.spec.ipam.max_above_watermark + surge) as u32
}

fn check_bounds(c: &Case, p: &NodePlan) -> Result<(), TestCaseError> {
    let limits = c.world.limits.as_ref().unwrap();
    let cap = allocation_cap(p, c);
    let max = c.node.spec.ipam.max_allocate;
    let a = p.demand.available;
    let within_max = |n: u32| max == 0 || a + i64::from(n) <= max;
    let check_request = |req: AddressRequest, slots: u32, free: u32| -> Result<(), TestCaseError> {
        match req {
            AddressRequest::Ips(n) => {
                prop_assert!(n >= 1 && n <= slots && n <= free && n <= cap);
                prop_assert!(within_max(n));
            }
            AddressRequest::Prefixes(n) => {
                prop_assert!(n >= 1 && n <= slots && n * PREFIX_SIZE <= free);
                prop_assert!(n <= cap.div_ceil(PREFIX_SIZE), "prefixes {n} for cap {cap}");
                prop_assert!(within_max(n * PREFIX_SIZE));
            }
        }
        Ok(())
    };
    match &p.action {
        Action::Assign(asg) => {
            let eni = c.world.enis.iter().find(|e| e.id == asg.eni_id).unwrap();
            let usable = usable_enis(&c.node.spec.instance_id, &c.node.spec.eni, &c.world.enis);
            prop_assert!(usable.iter().any(|e| e.id == eni.id), "excluded ENI used");
            let slots = free_slots(eni, limits);
            let free = c.world.subnets[&eni.subnet_id].available_addresses;
            check_request(asg.request, slots, free)?;
            if let Some(f) = asg.fallback_ips {
                check_request(AddressRequest::Ips(f), slots, free)?;
            }
        }
        Action::CreateEni(create) => {
            prop_assert!(c.world.enis.len() < limits.max_enis as usize);
            prop_assert!(create.device_index < limits.max_enis);
            prop_assert!(
                !c.world
                    .enis
                    .iter()
                    .any(|e| e.device_index() == Some(create.device_index))
            );
            prop_assert!(!create.attempts.is_empty());
            for attempt in &create.attempts {
                let free = c.world.subnets[&attempt.subnet_id].available_addresses;
                // The new ENI's primary address takes one free address too.
                check_request(
                    attempt.addresses,
                    limits.ipv4_per_eni - 1,
                    free.saturating_sub(1),
                )?;
            }
        }
        Action::None | Action::Release(_) => {}
    }
    Ok(())
}

fn check_release(c: &Case, p: &NodePlan) -> Result<(), TestCaseError> {
    let Action::Release(r) = &p.action else {
        return Ok(());
    };
    let eni = c.world.enis.iter().find(|e| e.id == r.eni_id).unwrap();
    let status = c.node.status.as_ref().unwrap();
    let allocated = super::release::allocated_cidrs(&c.node);
    let addresses: Vec<Ipv4Addr> = r
        .ips
        .iter()
        .copied()
        .chain(r.prefixes.iter().flat_map(|n| prefix_addresses(*n)))
        .collect();
    for ip in &addresses {
        prop_assert!(*ip != eni.primary_ip, "primary released");
        prop_assert!(
            !status.ipam.used.contains_key(&ip.to_string()),
            "used released"
        );
    }
    for ip in &r.ips {
        prop_assert!(eni.secondary_ips.contains(ip));
        prop_assert!(
            !allocated.contains(&Ipv4Net::from(*ip)),
            "allocated /32 released"
        );
    }
    for n in &r.prefixes {
        prop_assert!(eni.prefixes.contains(n));
        prop_assert!(!allocated.contains(n), "allocated /28 released");
    }
    Ok(())
}

/// Applies an allocation to the world as EC2 would, granting the first attempt in full.
fn apply(world: &mut World, action: &Action, next: &mut u32) {
    let mut fresh_prefix = || {
        *next = (*next).div_ceil(16) * 16 + 16;
        Ipv4Net::new(Ipv4Addr::from(*next), 28).unwrap()
    };
    match action {
        Action::Assign(a) => {
            let subnet_id = a.subnet_id.clone();
            let eni = world.enis.iter_mut().find(|e| e.id == a.eni_id).unwrap();
            match a.request {
                AddressRequest::Ips(n) => {
                    for _ in 0..n {
                        eni.secondary_ips
                            .push(Ipv4Addr::from(0xAC10_0000 + (next_single())));
                    }
                }
                AddressRequest::Prefixes(n) => {
                    for _ in 0..n {
                        eni.prefixes.push(fresh_prefix());
                    }
                }
            }
            world
                .subnets
                .get_mut(&subnet_id)
                .unwrap()
                .available_addresses -= a.request.addresses();
        }
        Action::CreateEni(c) => {
            let req = &c.attempts[0];
            let index = world.enis.len();
            let mut e = eni(&format!("eni-new-{index}"), c.device_index, &req.subnet_id);
            e.primary_ip = Ipv4Addr::from(0xAC20_0000 + next_single());
            match req.addresses {
                AddressRequest::Ips(n) => {
                    e.secondary_ips = (0..n)
                        .map(|_| Ipv4Addr::from(0xAC10_0000 + next_single()))
                        .collect()
                }
                AddressRequest::Prefixes(n) => {
                    e.prefixes = (0..n).map(|_| fresh_prefix()).collect()
                }
            }
            world.enis.push(e);
            world
                .subnets
                .get_mut(&req.subnet_id)
                .unwrap()
                .available_addresses -= 1 + req.addresses.addresses();
        }
        Action::None | Action::Release(_) => {}
    }
}

fn next_single() -> u32 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed) % 0x8_0000
}

fn allocates(p: &NodePlan) -> bool {
    matches!(p.action, Action::Assign(_) | Action::CreateEni(_))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Instance limits, subnet free counts, max-allocate and needed + W + surge hold.
    #[test]
    fn plans_stay_within_bounds(c in case()) {
        let p = plan(&c, &mut NodeMemory::new(), Instant::now());
        check_bounds(&c, &p)?;
    }

    /// Whatever the agent answers, no release touches a used, allocated or primary address.
    #[test]
    fn releases_never_touch_used_or_primary(c in case()) {
        let mut memory = NodeMemory::new();
        let t0 = Instant::now();
        for step in 0..3u64 {
            let p = plan(&c, &mut memory, t0 + Duration::from_secs(10 * step));
            check_release(&c, &p)?;
            prop_assert!(!(allocates(&p) && matches!(p.action, Action::Release(_))));
        }
    }

    /// Applying the plan's effects and re-planning converges: once an allocation covered the
    /// deficit, the next plan allocates nothing; a bounded one is continued until the node is
    /// served or reports why not.
    #[test]
    fn replanning_after_applying_is_idempotent(mut c in case()) {
        c.config.release_excess_ips = false;
        let now = Instant::now();
        let mut memory = NodeMemory::new();
        let mut next = 0xAC80_0000u32;
        let mut last = plan(&c, &mut memory, now);
        for _ in 0..12 {
            if !allocates(&last) {
                break;
            }
            check_bounds(&c, &last)?;
            let needed = last.demand.needed;
            let granted = match &last.action {
                Action::Assign(a) => a.request.addresses(),
                Action::CreateEni(e) => e.attempts[0].addresses.addresses(),
                _ => 0,
            };
            apply(&mut c.world, &last.action, &mut next);
            last = plan(&c, &mut memory, now);
            if i64::from(granted) >= needed {
                prop_assert!(!allocates(&last), "covered deficit re-planned: {:?}", last.action);
            }
        }
        prop_assert!(!allocates(&last), "did not converge");
        prop_assert!(last.demand.needed == 0 || last.problem.is_some(),
            "deficit {} left without a reason", last.demand.needed);
        let again = plan(&c, &mut memory, now);
        prop_assert_eq!(again.action, Action::None);
    }

    /// The write-back satisfies C2 (every pool address in its ENI's addresses), C3 (prefixes
    /// flattened), C4 (CIDRs filled) and C5 (every ENI of the instance listed).
    #[test]
    fn desired_state_is_consistent(c in case()) {
        let mut memory = NodeMemory::new();
        let p = plan(&c, &mut memory, Instant::now());
        let d = desired_state(&c.node, &c.world.view(), &c.config, &memory, p.problem.as_ref());
        let enis = d.enis.as_ref().unwrap();
        let pool = d.pool.as_ref().unwrap();
        prop_assert_eq!(enis.len(), c.world.enis.len());
        for (ip, entry) in pool {
            let eni = enis.get(&entry.resource);
            prop_assert!(eni.is_some_and(|e| e.addresses.contains(ip)), "C2 {}", ip);
        }
        for eni in enis.values() {
            prop_assert!(!eni.vpc.primary_cidr.is_empty() && !eni.subnet.cidr.is_empty());
            for prefix in &eni.prefixes {
                let prefix: Ipv4Net = prefix.parse().unwrap();
                for a in prefix_addresses(prefix) {
                    prop_assert!(eni.addresses.contains(&a.to_string()), "C3");
                }
            }
        }
        let set: BTreeSet<&String> = pool.keys().collect();
        prop_assert_eq!(set.len() as i64, p.demand.available);
        // Writing the change set leaves nothing more to write.
        let applied = super::writeback::apply(&c.node, &super::changes(&c.node, &d));
        prop_assert!(super::changes(&applied, &d).is_empty());
    }
}
