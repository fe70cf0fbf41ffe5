//! One maintenance decision for one node (docs/rules.md §1.3, §4, §5, §6).
//!
//! Order: refuse with an explicit [`Problem`] when the node cannot be served (no instance ID,
//! invalid spec, instance unknown or gone, limits unknown); track multi-pool drops; release
//! (a pass that releases does not allocate); else top up the first usable ENI (ascending device
//! index) whose subnet has room; else create an ENI if an interface slot is free; else report
//! the node at capacity. Bounds that always hold: the instance's interface and per-ENI slot
//! limits, subnet free counts, max-allocate, and needed + max-above-watermark + surge (rounded
//! up to whole /28s when prefixes are requested).

use std::time::Instant;

use crate::crd::CiliumNode;
use crate::ec2::{AddressRequest, CreateEniRequest, InstanceTypeLimits, NetworkInterface, Subnet};

use super::capacity::{Kind, Room, first_interface_index, free_slots};
use super::demand::{self, Demand, Generation, Watermarks};
use super::ownership::{client_token, description, eni_tags};
use super::release::{allocated_cidrs, attached_cidrs};
use super::selection::{
    next_device_index, prefix_eligible, select_security_groups, select_subnets,
};
use super::{
    Action, Assign, CreateEni, Ec2View, InstanceView, IpamConfig, NodeMemory, NodePlan, Problem,
    ProblemReason,
};

const PREFIX: u32 = crate::ec2::PREFIX_SIZE;

fn refuse(demand: Demand, reason: ProblemReason, message: String) -> NodePlan {
    NodePlan {
        demand,
        action: Action::None,
        problem: Some(Problem { reason, message }),
    }
}

/// Decide the next EC2 step for one node. Updates `memory` (release bookkeeping) as a side
/// effect; otherwise pure. `pending_pods` feeds surge allocation.
///
/// ```
/// # use std::collections::BTreeMap;
/// # use std::time::Instant;
/// # use eni_operator::crd::{CiliumNode, CiliumNodeSpec};
/// # use eni_operator::ec2::*;
/// # use eni_operator::ipam::*;
/// # let limits = InstanceTypeLimits { instance_type: "m5.large".into(), max_enis: 3,
/// #     ipv4_per_eni: 10, ipv6_per_eni: 10, nitro: true, bare_metal: false,
/// #     enis_per_card: vec![] };
/// # let subnet = Subnet { id: "subnet-a".into(), vpc_id: "vpc-1".into(),
/// #     availability_zone: "az-1".into(), cidr: "10.0.0.0/20".parse().unwrap(),
/// #     available_addresses: 100, tags: Tags::new() };
/// # let subnets = BTreeMap::from([(subnet.id.clone(), subnet)]);
/// # let vpcs = BTreeMap::from([("vpc-1".to_string(), Vpc { id: "vpc-1".into(),
/// #     primary_cidr: "10.0.0.0/16".parse().unwrap(), secondary_cidrs: vec![] })]);
/// # let primary = NetworkInterface { id: "eni-0".into(), subnet_id: "subnet-a".into(),
/// #     vpc_id: "vpc-1".into(), availability_zone: "az-1".into(),
/// #     mac: "02:00:00:00:00:01".into(), description: String::new(),
/// #     primary_ip: "10.0.0.10".parse().unwrap(), secondary_ips: vec![], prefixes: vec![],
/// #     ipv6_prefixes: vec![], security_groups: vec!["sg-1".into()], tags: Tags::new(),
/// #     state: EniState::InUse, attachment: Some(Attachment { id: "attach-0".into(),
/// #     instance_id: "i-1".into(), device_index: 0, delete_on_termination: true,
/// #     network_card_index: 0 }),
/// #     public_ip: None, interface_type: Default::default() };
/// # let mut enis = vec![primary];
/// # let (security_groups, cooldown) = (BTreeMap::new(), BTreeMap::new());
/// # let mut node = CiliumNode::new("node-1", CiliumNodeSpec::default());
/// # node.spec.instance_id = "i-1".into();
/// # let config = IpamConfig::default();
/// # let mut memory = NodeMemory::default();
/// let view = Ec2View {
///     instance: InstanceView::Known { instance: None, enis: &enis },
///     limits: Some(&limits),
///     subnets: &subnets,
///     vpcs: &vpcs,
///     security_groups: &security_groups,
///     route_tables: &[],
///     prefix_cooldown: &cooldown,
///     pod_subnets: None,
/// };
/// // One bare primary ENI and the default pre-allocation of 8: top it up with 8 addresses.
/// let plan = plan_node(&node, &view, &config, &mut memory, Instant::now(), 0);
/// assert_eq!(plan.demand.needed, 8);
/// match plan.action {
///     Action::Assign(assign) => assert_eq!(assign.request, AddressRequest::Ips(8)),
///     other => panic!("unexpected {other:?}"),
/// }
/// ```
pub fn plan_node(
    node: &CiliumNode,
    ec2: &Ec2View<'_>,
    config: &IpamConfig,
    memory: &mut NodeMemory,
    now: Instant,
    pending_pods: u32,
) -> NodePlan {
    let early = Demand {
        generation: demand::generation(node),
        ..Default::default()
    };
    let instance_id = node.spec.instance_id.as_str();
    if instance_id.is_empty() {
        return refuse(
            early,
            ProblemReason::MissingInstanceId,
            "spec.instance-id is empty: the agent has not reported its EC2 instance".into(),
        );
    }
    let marks = match demand::watermarks(node) {
        Ok(m) => m,
        Err(p) => return refuse(early, p.reason, p.message),
    };
    if let Some(f) = node.spec.eni.first_interface_index.filter(|f| *f < 0) {
        return refuse(
            early,
            ProblemReason::InvalidSpec,
            format!("spec.eni.first-interface-index is negative ({f})"),
        );
    }
    let enis = match ec2.instance {
        InstanceView::Unknown => {
            return refuse(
                early,
                ProblemReason::InstanceNotFound,
                format!("instance {instance_id} not found in EC2 (yet); refreshing"),
            );
        }
        InstanceView::Gone => {
            return refuse(
                early,
                ProblemReason::InstanceGone,
                format!("instance {instance_id} is shutting down or terminated"),
            );
        }
        InstanceView::Known { instance, enis } => {
            if let Some(i) = instance.filter(|i| i.state.is_gone()) {
                return refuse(
                    early,
                    ProblemReason::InstanceGone,
                    format!("instance {instance_id} is {:?}", i.state),
                );
            }
            if super::capacity::instance_enis(instance_id, enis).is_empty() {
                return refuse(
                    early,
                    ProblemReason::InstanceNotFound,
                    format!("instance {instance_id} has no ENI in EC2; refreshing"),
                );
            }
            enis
        }
    };
    let Some(limits) = ec2.limits else {
        return refuse(
            early,
            ProblemReason::UnknownInstanceType,
            format!(
                "limits of instance type {:?} unknown (DescribeInstanceTypes)",
                node.spec.eni.instance_type
            ),
        );
    };

    let room = Room::of(instance_id, &node.spec.eni, enis, limits, config);
    let demand = demand::compute(node, &marks, room.available(|_| true), room.instance_max);
    let Room {
        usable,
        with_primary,
        prefix_delegated: pd,
        instance_max,
    } = room;
    memory.observe_generation(demand.generation);

    let release = match demand.generation {
        Generation::MultiPool => {
            let allocated = allocated_cidrs(node);
            memory.track_multi_pool(&allocated, &attached_cidrs(&usable, with_primary), now);
            memory.multi_pool_withdraw(node, &usable, &allocated, demand.excess, config, now)
        }
        Generation::Classic => memory.classic_pass(node, &usable, demand.excess, config, now),
    };
    if let Some(release) = release {
        return NodePlan {
            demand,
            action: Action::Release(release),
            problem: None,
        };
    }
    if demand.needed <= 0 {
        return NodePlan {
            demand,
            action: Action::None,
            problem: None,
        };
    }

    let max = if marks.max_allocate > 0 {
        marks.max_allocate
    } else {
        instance_max
    };
    let alloc = Allocation::new(&demand, &marks, max, pending_pods, pd);
    let token_generation = memory.eni_token_generation();
    let (action, problem) = allocate(
        node,
        ec2,
        config,
        limits,
        enis,
        &usable,
        &alloc,
        now,
        token_generation,
    );
    NodePlan {
        demand,
        action,
        problem,
    }
}

/// The bounds of one allocation.
struct Allocation {
    /// MaxIPsToAllocate = needed + W + surge, capped by max-allocate.
    cap: u32,
    /// Room left under max-allocate; `None` when uncapped.
    under_max: Option<u32>,
    prefix_delegated: bool,
}

fn to_u32(n: i64) -> u32 {
    u32::try_from(n.max(0)).unwrap_or(u32::MAX)
}

impl Allocation {
    fn new(demand: &Demand, marks: &Watermarks, max: i64, pending: u32, pd: bool) -> Self {
        let surge = i64::from(pending).saturating_sub(demand.needed).max(0);
        let mut cap = demand
            .needed
            .saturating_add(marks.max_above_watermark)
            .saturating_add(surge);
        let under_max = (max > 0).then(|| to_u32(max.saturating_sub(demand.available)));
        if let Some(m) = under_max {
            cap = cap.min(i64::from(m));
        }
        Self {
            cap: to_u32(cap),
            under_max,
            prefix_delegated: pd,
        }
    }

    /// Prefixes for `amount` addresses: ⌈amount/16⌉, within `slots`, `subnet_blocks` /28s the
    /// subnet could hold, and max-allocate (whole prefixes only).
    fn prefixes(&self, amount: u32, slots: u32, subnet_blocks: u32) -> u32 {
        let mut n = amount.div_ceil(PREFIX).min(slots).min(subnet_blocks);
        if let Some(m) = self.under_max {
            n = n.min(m / PREFIX);
        }
        n
    }
}

#[allow(clippy::too_many_arguments)]
fn allocate(
    node: &CiliumNode,
    ec2: &Ec2View<'_>,
    config: &IpamConfig,
    limits: &InstanceTypeLimits,
    enis: &[NetworkInterface],
    usable: &[&NetworkInterface],
    alloc: &Allocation,
    now: Instant,
    token_generation: u32,
) -> (Action, Option<Problem>) {
    if alloc.cap == 0 {
        return (Action::None, None);
    }
    let mut ordered: Vec<&NetworkInterface> = usable.to_vec();
    ordered.sort_by_key(|e| (e.network_card(), e.device_index(), e.id.clone()));
    let mut any_room = false;
    for eni in ordered {
        let slots = free_slots(eni, limits);
        if slots == 0 {
            continue;
        }
        any_room = true;
        // Outside the operator's subnet filters: known, listed, but given no new addresses.
        let Some(subnet) = ec2
            .subnets
            .get(&eni.subnet_id)
            .filter(|s| ec2.is_pod_subnet(&s.id))
        else {
            continue;
        };
        if let Some(assign) = top_up(ec2, config, alloc, eni, subnet, slots, now) {
            return (Action::Assign(assign), None);
        }
    }

    let f = first_interface_index(&node.spec.eni);
    let instance_id = node.spec.instance_id.as_str();
    let Some(device_index) = next_device_index(
        &super::capacity::instance_enis(instance_id, enis)
            .into_iter()
            .cloned()
            .collect::<Vec<_>>(),
        f,
        limits.pod_max_enis(),
    ) else {
        let problem = if any_room {
            Problem {
                reason: ProblemReason::NoMatchingSubnet,
                message: "the subnets of the node's ENIs are full and no interface slot is free"
                    .into(),
            }
        } else {
            Problem {
                reason: ProblemReason::AtCapacity,
                message: format!(
                    "instance is at capacity: {} ENIs with no free address slot",
                    limits.pod_max_enis()
                ),
            }
        };
        return (Action::None, Some(problem));
    };
    match create(
        node,
        ec2,
        config,
        limits,
        enis,
        alloc,
        device_index,
        now,
        token_generation,
    ) {
        Ok(Some(create)) => (Action::CreateEni(create), None),
        Ok(None) => (
            Action::None,
            Some(Problem {
                reason: ProblemReason::AtCapacity,
                message: "a new ENI could hold no address (instance type has one address per ENI)"
                    .into(),
            }),
        ),
        Err(problem) => (Action::None, Some(problem)),
    }
}

/// Assign on an existing ENI: /28s on a prefix-delegated node when the subnet may fit one (with
/// single addresses as the fallback), else single addresses.
fn top_up(
    ec2: &Ec2View<'_>,
    config: &IpamConfig,
    alloc: &Allocation,
    eni: &NetworkInterface,
    subnet: &Subnet,
    slots: u32,
    now: Instant,
) -> Option<Assign> {
    let free = subnet.available_addresses;
    let singles = alloc.cap.min(slots).min(free);
    if alloc.prefix_delegated && prefix_eligible(ec2, config, subnet, now) {
        let amount = alloc.cap.min(free).min(slots * PREFIX);
        let n = alloc.prefixes(amount, slots, free / PREFIX);
        if n > 0 {
            return Some(Assign {
                eni_id: eni.id.clone(),
                subnet_id: subnet.id.clone(),
                request: AddressRequest::Prefixes(n),
                fallback_ips: (singles > 0).then_some(singles),
            });
        }
    }
    (singles > 0).then(|| Assign {
        eni_id: eni.id.clone(),
        subnet_id: subnet.id.clone(),
        request: AddressRequest::Ips(singles),
        fallback_ips: None,
    })
}

/// A new ENI with everything inline. Attempts: /28s in the chosen subnet, then /28s in the
/// other eligible subnets (not cooling down), then single addresses in the chosen subnet; on a
/// node without delegation, single addresses only. The new ENI's primary address takes one
/// free address of its subnet too.
#[allow(clippy::too_many_arguments)]
fn create(
    node: &CiliumNode,
    ec2: &Ec2View<'_>,
    config: &IpamConfig,
    limits: &InstanceTypeLimits,
    enis: &[NetworkInterface],
    alloc: &Allocation,
    device_index: u32,
    now: Instant,
    token_generation: u32,
) -> Result<Option<CreateEni>, Problem> {
    let subnets = select_subnets(node, ec2, limits.ipv4_per_eni)?;
    let security_groups = select_security_groups(node, ec2, enis)?;
    let instance_id = node.spec.instance_id.as_str();
    let attached: Vec<String> = super::capacity::instance_enis(instance_id, enis)
        .iter()
        .map(|e| e.id.clone())
        .collect();
    let tags = eni_tags(&config.eni_tags, &config.cluster_name, instance_id);
    let request = |subnet: &Subnet, addresses: AddressRequest| {
        let kind = match addresses {
            AddressRequest::Ips(_) => Kind::Ips,
            AddressRequest::Prefixes(_) => Kind::Prefixes,
        };
        CreateEniRequest {
            subnet_id: subnet.id.clone(),
            security_groups: security_groups.clone(),
            description: description(instance_id),
            tags: tags.clone(),
            addresses,
            client_token: client_token(
                &config.cluster_name,
                instance_id,
                device_index,
                &subnet.id,
                kind,
                &attached,
                token_generation,
                config.token_nonce,
            ),
        }
    };
    let slots = limits.ipv4_per_eni.saturating_sub(1);
    let mut attempts = Vec::new();
    if alloc.prefix_delegated {
        let amount = alloc.cap.min(slots * PREFIX);
        for subnet in subnets
            .iter()
            .filter(|s| prefix_eligible(ec2, config, s, now))
        {
            let blocks = subnet.available_addresses.saturating_sub(1) / PREFIX;
            let n = alloc.prefixes(amount, slots, blocks);
            if n > 0 {
                attempts.push(request(subnet, AddressRequest::Prefixes(n)));
            }
        }
    }
    let chosen = subnets[0];
    let singles = alloc
        .cap
        .min(slots)
        .min(chosen.available_addresses.saturating_sub(1));
    if singles > 0 {
        attempts.push(request(chosen, AddressRequest::Ips(singles)));
    }
    if attempts.is_empty() {
        return Ok(None);
    }
    Ok(Some(CreateEni {
        instance_id: instance_id.to_string(),
        device_index,
        attempts,
        delete_on_termination: node.spec.eni.delete_on_termination != Some(false),
    }))
}

#[cfg(test)]
mod tests;
