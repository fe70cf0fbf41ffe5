//! Write-back: the operator-owned fields a CiliumNode should carry, and the minimal, ordered
//! JSON merge patches that get it there (`docs/ciliumnode.md`, rules C1-C9).
//!
//! * `status.eni.enis`: every ENI of the instance, excluded ones included (C5), prefixes
//!   flattened into `addresses` (C3), subnet and VPC CIDRs filled (C4). If any of that data is
//!   missing from the cache, nothing is published (never a partial ENI) and the node reports
//!   [`ProblemReason::IncompleteEc2Data`].
//! * `spec.ipam.pool`: every address of every non-excluded ENI, `resource` = the ENI (C2, C9).
//! * `status.ipam.release-ips`: only the operator's transitions; an agent's answer is never
//!   overwritten by a proposal; stale entries are aborted; multi-pool nodes get none.
//! * `status.ipam.operator-status` and `status.eni-operator`.
//!
//! [`changes`] compares order-insensitively and emits: pool removals (spec), then status, then
//! pool additions (spec) (C1: a pool address is always in status first and last).
//!
//! Fields that Cilium's own CRD does not list ([`PRUNABLE_ENI_FIELDS`] and the summary in
//! `status.eni-operator`) never survive a write on real clusters: the API server prunes them.
//! They are written along with a real change, and compared only when the object carries them
//! (a pruned field is "unchanged", not "missing"), so steady state costs zero writes under
//! either CRD.

use std::collections::{BTreeMap, BTreeSet};

use crate::crd::{
    AllocationIp, CiliumNode, EniEntry, EniSubnet, EniVpc, OperatorSummary, ReleaseState,
};
use crate::ec2::NetworkInterface;

use super::capacity::{
    instance_enis, is_excluded, is_prefix_delegated, max_allocatable, offers_primary,
    usable_addresses,
};
use super::demand::{self, Generation};
use super::{DesiredState, Ec2View, InstanceView, IpamConfig, NodeMemory, Problem, ProblemReason};

/// What the node's operator-owned fields should say, given the (updated) EC2 view.
/// `problem` is the plan's (or the executor's) problem, published as operator-status.
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
/// enis[0].secondary_ips = vec!["10.0.0.11".parse().unwrap(), "10.0.0.12".parse().unwrap()];
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
/// let desired = desired_state(&node, &view, &config, &memory, None);
/// let eni = &desired.enis.as_ref().unwrap()["eni-0"];
/// assert_eq!(eni.addresses, ["10.0.0.11", "10.0.0.12"]);
/// assert_eq!(eni.vpc.primary_cidr, "10.0.0.0/16");
/// assert_eq!(desired.pool.as_ref().unwrap()["10.0.0.11"].resource, "eni-0");
/// assert_eq!(desired.operator_error, None);
/// ```
pub fn desired_state(
    node: &CiliumNode,
    ec2: &Ec2View<'_>,
    config: &IpamConfig,
    memory: &NodeMemory,
    problem: Option<&Problem>,
) -> DesiredState {
    let instance_id = node.spec.instance_id.as_str();
    let spec = &node.spec.eni;
    let with_primary = offers_primary(config, spec);
    let mut problem = problem.cloned();

    let attached: Vec<&NetworkInterface> = match ec2.instance {
        InstanceView::Known { enis, .. } if !instance_id.is_empty() => {
            instance_enis(instance_id, enis)
        }
        _ => Vec::new(),
    };
    // No ENI known (not yet listed, or a cache gap): keep what is published.
    let (enis, pool) = if attached.is_empty() {
        (None, None)
    } else {
        match eni_map(&attached, ec2, with_primary) {
            Ok(mut map) => {
                let mut pool = attached
                    .iter()
                    .filter(|e| !is_excluded(e, spec))
                    .flat_map(|e| {
                        usable_addresses(e, with_primary).into_iter().map(|ip| {
                            (
                                ip.to_string(),
                                AllocationIp {
                                    resource: e.id.clone(),
                                    ..Default::default()
                                },
                            )
                        })
                    })
                    .collect();
                // Multi-pool CIDRs on their way out leave before their unassign (§7.4).
                super::withdrawal::strip(&mut map, &mut pool, &memory.withdrawn_cidrs());
                (Some(map), Some(pool))
            }
            Err(missing) => {
                problem.get_or_insert(Problem {
                    reason: ProblemReason::IncompleteEc2Data,
                    message: format!("EC2 data missing from the cache: {missing}; refreshing"),
                });
                (None, None)
            }
        }
    };

    let generation = demand::generation(node);
    let release_ips = release_transitions(node, memory, generation, pool.as_ref());

    let usable: Vec<&&NetworkInterface> =
        attached.iter().filter(|e| !is_excluded(e, spec)).collect();
    let available: i64 = usable
        .iter()
        .map(|e| usable_addresses(e, with_primary).len() as i64)
        .sum();
    let after = demand::watermarks(node).ok().map(|marks| {
        let pd = is_prefix_delegated(config, ec2.limits, spec);
        let max = max_allocatable(ec2.limits, spec.first_interface_index, pd);
        demand::compute(node, &marks, available, max)
    });
    let (used, needed) = after.as_ref().map_or((0, 0), |d| (d.used, d.needed));
    DesiredState {
        summary: OperatorSummary {
            enis: attached.len() as i64,
            available: pool
                .as_ref()
                .map_or(available, |p: &BTreeMap<_, _>| p.len() as i64),
            used,
            needed,
        },
        enis,
        pool,
        release_ips,
        operator_error: problem.map(|p| format!("{}: {}", p.reason.as_str(), p.message)),
        demand: after,
    }
}

/// `status.eni.enis` for the attached ENIs, or the IDs whose subnet or VPC is not cached.
fn eni_map(
    attached: &[&NetworkInterface],
    ec2: &Ec2View<'_>,
    with_primary: bool,
) -> Result<BTreeMap<String, EniEntry>, String> {
    let mut missing = BTreeSet::new();
    let mut map = BTreeMap::new();
    for eni in attached {
        let subnet = ec2.subnets.get(&eni.subnet_id);
        let vpc = ec2.vpcs.get(&eni.vpc_id);
        let (Some(subnet), Some(vpc)) = (subnet, vpc) else {
            if subnet.is_none() {
                missing.insert(format!("subnet {}", eni.subnet_id));
            }
            if vpc.is_none() {
                missing.insert(format!("VPC {}", eni.vpc_id));
            }
            continue;
        };
        let entry = EniEntry {
            id: eni.id.clone(),
            ip: eni.primary_ip.to_string(),
            mac: eni.mac.clone(),
            availability_zone: eni.availability_zone.clone(),
            description: eni.description.clone(),
            number: i64::from(eni.device_index().unwrap_or(0)),
            subnet: EniSubnet {
                id: subnet.id.clone(),
                cidr: subnet.cidr.to_string(),
                ..Default::default()
            },
            vpc: EniVpc {
                id: vpc.id.clone(),
                primary_cidr: vpc.primary_cidr.to_string(),
                cidrs: vpc
                    .secondary_cidrs
                    .iter()
                    .filter(|c| **c != vpc.primary_cidr)
                    .map(ToString::to_string)
                    .collect(),
                ..Default::default()
            },
            addresses: usable_addresses(eni, with_primary)
                .iter()
                .map(ToString::to_string)
                .collect(),
            prefixes: eni.prefixes.iter().map(|p| p.trunc().to_string()).collect(),
            ipv6_prefixes: eni.ipv6_prefixes.clone(),
            security_groups: eni.security_groups.clone(),
            tags: eni.tags.clone(),
            public_ip: eni.public_ip.clone().unwrap_or_default(),
            ..Default::default()
        };
        map.insert(eni.id.clone(), entry);
    }
    if missing.is_empty() {
        Ok(map)
    } else {
        Err(missing.into_iter().collect::<Vec<_>>().join(", "))
    }
}

/// The operator's transitions of `status.ipam.release-ips` (§7.3 steps 3 and 5).
fn release_transitions(
    node: &CiliumNode,
    memory: &NodeMemory,
    generation: Generation,
    pool: Option<&BTreeMap<String, AllocationIp>>,
) -> BTreeMap<String, Option<String>> {
    let empty = BTreeMap::new();
    let current = node.status.as_ref().map_or(&empty, |s| &s.ipam.release_ips);
    let mut out = BTreeMap::new();
    if generation == Generation::MultiPool {
        // Multi-pool agents do not use the handshake: withdraw everything (as Cilium does).
        for key in current.keys() {
            out.insert(key.clone(), None);
        }
        return out;
    }
    let in_pool = |ip: &str| pool.is_some_and(|p| p.contains_key(ip));
    let proposed: BTreeSet<String> = memory.proposed().map(|ip| ip.to_string()).collect();
    let unpublished: BTreeSet<String> = memory
        .released_unpublished()
        .map(|ip| ip.to_string())
        .collect();
    let marked = ReleaseState::MarkedForRelease.as_str().to_string();
    for ip in &proposed {
        match current.get(ip).and_then(|s| ReleaseState::parse(s)) {
            // No answer yet: propose (a no-op when already proposed).
            None | Some(ReleaseState::MarkedForRelease) => {
                out.insert(ip.clone(), Some(marked.clone()));
            }
            // The agent's answer (or an earlier release) stands.
            Some(_) => {}
        }
    }
    for ip in &unpublished {
        if in_pool(ip) {
            out.insert(ip.clone(), None);
        } else {
            out.insert(
                ip.clone(),
                Some(ReleaseState::Released.as_str().to_string()),
            );
        }
    }
    for (ip, state) in current {
        if proposed.contains(ip) || unpublished.contains(ip) {
            continue;
        }
        let keep = state == ReleaseState::Released.as_str() && !in_pool(ip);
        if !keep {
            // Aborted proposal (no longer a candidate), or a released address back in use.
            out.insert(ip.clone(), None);
        }
    }
    out
}

/// The API server's structural pruning, for the tests below: testkit's model (the one MemorySink
/// uses), compiled in by path. It is pure and holds none of this crate's types; a dev-dependency
/// on testkit would bring a second copy of them into the lib's unit tests.
#[cfg(test)]
#[allow(dead_code)]
#[path = "../../testkit/src/prune.rs"]
mod prune;

#[cfg(test)]
mod tests;

mod changes;

pub use changes::{PRUNABLE_ENI_FIELDS, apply, c2_violations, changes, merge_diff};
