//! Where a new ENI goes: subnet, security groups, device index (docs/rules.md §5.1).
//!
//! eni-operator's rule on explicit selectors: when `spec.eni.subnet-ids` or `subnet-tags` is
//! set, the user asked for specific pod subnets (custom networking). No eligible match is an
//! error naming the selectors, VPC and AZ, never a silent fall-through to the node's subnet,
//! whose routes and security rules differ. The same holds for `security-group-tags`.

use std::collections::BTreeSet;
use std::time::Instant;

use crate::crd::CiliumNode;
use crate::ec2::{NetworkInterface, PREFIX_SIZE, Subnet};

use super::{Ec2View, InstanceView, IpamConfig, Problem, ProblemReason};

/// The VPC, AZ and subnet of the node (from `spec.eni`, else from the instance).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement<'a> {
    pub vpc_id: &'a str,
    pub availability_zone: &'a str,
    pub node_subnet_id: &'a str,
}

/// The node's placement: the agent's IMDS facts, completed from the cached instance.
pub fn placement<'a>(node: &'a CiliumNode, ec2: &Ec2View<'a>) -> Placement<'a> {
    let instance = match ec2.instance {
        InstanceView::Known { instance, .. } => instance,
        _ => None,
    };
    let pick = |own: &'a str, fallback: Option<&'a str>| {
        if own.is_empty() {
            fallback.unwrap_or("")
        } else {
            own
        }
    };
    let eni = &node.spec.eni;
    Placement {
        vpc_id: pick(&eni.vpc_id, instance.map(|i| i.vpc_id.as_str())),
        availability_zone: pick(
            &eni.availability_zone,
            instance.map(|i| i.availability_zone.as_str()),
        ),
        node_subnet_id: pick(&eni.node_subnet_id, instance.map(|i| i.subnet_id.as_str())),
    }
}

/// Most free addresses first, then by ID (deterministic).
fn best_first(subnets: &mut [&Subnet]) {
    subnets.sort_by(|a, b| {
        b.available_addresses
            .cmp(&a.available_addresses)
            .then_with(|| a.id.cmp(&b.id))
    });
}

/// The route table serving a subnet: its explicit association, else the VPC's main table.
fn route_table_of<'a>(ec2: &Ec2View<'a>, vpc_id: &str, subnet_id: &str) -> Option<&'a str> {
    ec2.route_tables
        .iter()
        .find(|t| t.subnet_ids.iter().any(|s| s == subnet_id))
        .or_else(|| {
            ec2.route_tables
                .iter()
                .find(|t| t.main && t.vpc_id == vpc_id)
        })
        .map(|t| t.id.as_str())
}

/// Candidate subnets for a new ENI, the chosen one first, followed by the other subnets of the
/// same selection step (best first): the planner tries those for /28s before falling back to
/// single addresses in the chosen one. Each candidate is in the node's VPC and AZ and has free
/// addresses.
///
/// Steps: explicit `subnet-ids` (error if none eligible); else `subnet-tags` (error if none);
/// else the node's subnet if it has room for a full ENI (L free; others: its route-table
/// mates); else the best subnet sharing the node subnet's route table; else the best of the
/// VPC and AZ; else [`ProblemReason::NoMatchingSubnet`].
pub fn select_subnets<'a>(
    node: &CiliumNode,
    ec2: &Ec2View<'a>,
    ipv4_per_eni: u32,
) -> Result<Vec<&'a Subnet>, Problem> {
    let place = placement(node, ec2);
    let spec = &node.spec.eni;
    let in_scope: Vec<&'a Subnet> = ec2
        .subnets
        .values()
        .filter(|s| s.vpc_id == place.vpc_id && s.availability_zone == place.availability_zone)
        .filter(|s| s.available_addresses > 0 && ec2.is_pod_subnet(&s.id))
        .collect();
    let no_match = |what: String| Problem {
        reason: ProblemReason::NoMatchingSubnet,
        message: format!(
            "no matching subnet with free addresses for a new ENI ({what} VPC={} AZ={})",
            place.vpc_id, place.availability_zone
        ),
    };

    if !spec.subnet_ids.is_empty() {
        let mut found: Vec<_> = in_scope
            .into_iter()
            .filter(|s| spec.subnet_ids.contains(&s.id))
            .collect();
        if found.is_empty() {
            return Err(no_match(format!("SubnetIDs={:?}", spec.subnet_ids)));
        }
        best_first(&mut found);
        return Ok(found);
    }
    if !spec.subnet_tags.is_empty() {
        let mut found: Vec<_> = in_scope
            .into_iter()
            .filter(|s| {
                spec.subnet_tags
                    .iter()
                    .all(|(k, v)| s.tags.get(k) == Some(v))
            })
            .collect();
        if found.is_empty() {
            return Err(no_match(format!("SubnetTags={:?}", spec.subnet_tags)));
        }
        best_first(&mut found);
        return Ok(found);
    }

    let node_table = route_table_of(ec2, place.vpc_id, place.node_subnet_id);
    let mut mates: Vec<&'a Subnet> = in_scope
        .iter()
        .copied()
        .filter(|s| node_table.is_some() && route_table_of(ec2, place.vpc_id, &s.id) == node_table)
        .collect();
    best_first(&mut mates);
    if let Some(own) = in_scope
        .iter()
        .find(|s| s.id == place.node_subnet_id && s.available_addresses >= ipv4_per_eni)
    {
        let mut list = vec![*own];
        list.extend(mates.into_iter().filter(|s| s.id != own.id));
        return Ok(list);
    }
    if !mates.is_empty() {
        return Ok(mates);
    }
    let mut all = in_scope;
    if all.is_empty() {
        return Err(no_match("no selectors,".into()));
    }
    best_first(&mut all);
    Ok(all)
}

/// Whether a subnet recently failed a /28 and is still cooling down.
pub fn in_prefix_cooldown(
    ec2: &Ec2View<'_>,
    config: &IpamConfig,
    subnet_id: &str,
    now: Instant,
) -> bool {
    ec2.prefix_cooldown
        .get(subnet_id)
        .is_some_and(|seen| now.saturating_duration_since(*seen) < config.prefix_cooldown)
}

/// Whether a /28 may be requested in this subnet now: not cooling down, and at least 16 free
/// addresses (a necessary, not sufficient, condition: EC2 reports no free-block count).
pub fn prefix_eligible(
    ec2: &Ec2View<'_>,
    config: &IpamConfig,
    subnet: &Subnet,
    now: Instant,
) -> bool {
    subnet.available_addresses >= PREFIX_SIZE && !in_prefix_cooldown(ec2, config, &subnet.id, now)
}

/// Security groups for a new ENI: `security-groups` as given; else the VPC's groups carrying
/// all `security-group-tags`, sorted (none: error); else the groups of the device-index-0 ENI,
/// sorted (none: error).
pub fn select_security_groups(
    node: &CiliumNode,
    ec2: &Ec2View<'_>,
    enis: &[NetworkInterface],
) -> Result<Vec<String>, Problem> {
    let spec = &node.spec.eni;
    if !spec.security_groups.is_empty() {
        return Ok(spec.security_groups.clone());
    }
    let place = placement(node, ec2);
    if !spec.security_group_tags.is_empty() {
        let found: BTreeSet<String> = ec2
            .security_groups
            .values()
            .filter(|g| g.vpc_id == place.vpc_id)
            .filter(|g| {
                spec.security_group_tags
                    .iter()
                    .all(|(k, v)| g.tags.get(k) == Some(v))
            })
            .map(|g| g.id.clone())
            .collect();
        if found.is_empty() {
            return Err(Problem {
                reason: ProblemReason::NoSecurityGroups,
                message: format!(
                    "no security group in VPC {} carries the tags {:?}",
                    place.vpc_id, spec.security_group_tags
                ),
            });
        }
        return Ok(found.into_iter().collect());
    }
    // The primary ENI is card 0's device 0: on a multi-card instance every card has a device
    // 0, often an EFA interface whose groups are the EFA's (all traffic to itself), §5.4.
    // An EFA primary's groups are the EFA's (all traffic to and from itself): never inherited.
    let primary: BTreeSet<String> = enis
        .iter()
        .find(|e| e.is_primary() && e.serves_pods())
        .map(|e| e.security_groups.iter().cloned().collect())
        .unwrap_or_default();
    if primary.is_empty() {
        return Err(Problem {
            reason: ProblemReason::NoSecurityGroups,
            message: "failed to get security group ids: no security-groups, no \
                      security-group-tags, and the primary ENI (network card 0, device 0, \
                      an ENA interface) has none"
                .into(),
        });
    }
    Ok(primary.into_iter().collect())
}

/// The lowest device index >= `first` on network card 0 (where new ENIs are attached, §5.4)
/// used by no ENI of the instance and below card 0's interface limit `max_enis`; `None` when
/// no slot is free. ENIs on other cards (EFA interfaces) neither block nor count.
pub fn next_device_index(enis: &[NetworkInterface], first: u32, max_enis: u32) -> Option<u32> {
    let card0: Vec<&NetworkInterface> = enis
        .iter()
        .filter(|e| e.network_card().unwrap_or(0) == 0)
        .collect();
    if card0.len() >= max_enis as usize {
        return None;
    }
    let used: BTreeSet<u32> = card0.iter().filter_map(|e| e.device_index()).collect();
    (first..max_enis).find(|i| !used.contains(i))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ec2::RouteTable;
    use crate::ipam::fixtures::*;
    use std::time::Duration;

    fn ids(list: &[&Subnet]) -> Vec<String> {
        list.iter().map(|s| s.id.clone()).collect()
    }

    #[test]
    fn explicit_ids_pick_most_free_and_never_fall_through() {
        let mut w = World::new();
        w.add_subnet(subnet("subnet-c", "10.0.32.0/20", 50));
        w.add_subnet(subnet("subnet-d", "10.0.48.0/20", 70));
        let mut n = node();
        n.spec.eni.subnet_ids = vec!["subnet-c".into(), "subnet-d".into()];
        assert_eq!(
            ids(&select_subnets(&n, &w.view(), 10).unwrap()),
            ["subnet-d", "subnet-c"]
        );
        // Listed subnets full or in another AZ: an error, even though subnet-a has room.
        w.subnets.get_mut("subnet-c").unwrap().available_addresses = 0;
        w.subnets.get_mut("subnet-d").unwrap().availability_zone = "az-2".into();
        let err = select_subnets(&n, &w.view(), 10).unwrap_err();
        assert_eq!(err.reason, ProblemReason::NoMatchingSubnet);
        assert!(err.message.contains("subnet-c") && err.message.contains(VPC));
        assert!(err.message.contains(AZ));
    }

    /// The default world and `subnet-p`, tagged `role=pods`, with `free` addresses.
    fn with_pods_subnet(free: u32) -> World {
        let mut w = World::new();
        let mut pods = subnet("subnet-p", "100.64.0.0/17", free);
        pods.tags = tags(&[("role", "pods")]);
        w.add_subnet(pods);
        w
    }

    #[test]
    fn explicit_tags_select_and_never_fall_through() {
        let w = with_pods_subnet(40);
        let mut n = node();
        n.spec.eni.subnet_tags = tags(&[("role", "pods")]);
        assert_eq!(
            ids(&select_subnets(&n, &w.view(), 10).unwrap()),
            ["subnet-p"]
        );
        n.spec.eni.subnet_tags = tags(&[("role", "other")]);
        let err = select_subnets(&n, &w.view(), 10).unwrap_err();
        assert_eq!(err.reason, ProblemReason::NoMatchingSubnet);
        assert!(err.message.contains("role"));
    }

    #[test]
    fn new_enis_stay_in_the_operators_filtered_subnets() {
        // The node's subnet (subnet-a, the primary ENI's) is known but outside the operator's
        // subnet filter: never a candidate, even with room; subnet-b is.
        let mut w = World::new();
        w.subnets.get_mut("subnet-a").unwrap().available_addresses = 1000;
        w.pod_subnets = Some(["subnet-b".to_string()].into());
        assert_eq!(
            ids(&select_subnets(&node(), &w.view(), 10).unwrap()),
            ["subnet-b"]
        );
        w.pod_subnets = Some(Default::default());
        let err = select_subnets(&node(), &w.view(), 10).unwrap_err();
        assert_eq!(err.reason, ProblemReason::NoMatchingSubnet);
    }

    #[test]
    fn ids_win_over_tags() {
        let w = with_pods_subnet(400);
        let mut n = node();
        n.spec.eni.subnet_ids = vec!["subnet-b".into()];
        n.spec.eni.subnet_tags = tags(&[("role", "pods")]);
        assert_eq!(
            ids(&select_subnets(&n, &w.view(), 10).unwrap()),
            ["subnet-b"]
        );
    }

    #[test]
    fn node_subnet_when_it_fits_a_full_eni() {
        let w = World::new(); // subnet-a 100 free, subnet-b 200 free, same main table
        let n = node();
        assert_eq!(
            ids(&select_subnets(&n, &w.view(), 10).unwrap()),
            ["subnet-a", "subnet-b"]
        );
    }

    #[test]
    fn same_route_table_before_most_free() {
        let mut w = World::new();
        w.subnets.get_mut("subnet-a").unwrap().available_addresses = 5; // < L
        let mut public = subnet("subnet-pub", "10.0.64.0/20", 4000);
        public.id = "subnet-pub".into();
        w.add_subnet(public);
        w.route_tables.push(RouteTable {
            id: "rtb-public".into(),
            vpc_id: VPC.into(),
            main: false,
            subnet_ids: vec!["subnet-pub".into()],
        });
        // subnet-pub has the most free addresses but another route table.
        assert_eq!(
            ids(&select_subnets(&node(), &w.view(), 10).unwrap()),
            ["subnet-b", "subnet-a"]
        );
    }

    #[test]
    fn most_free_in_vpc_and_az_last() {
        let mut w = World::new();
        w.route_tables.clear(); // route tables unknown
        w.subnets.get_mut("subnet-a").unwrap().available_addresses = 5;
        let mut other_az = subnet("subnet-z", "10.0.80.0/20", 9000);
        other_az.availability_zone = "az-2".into();
        w.add_subnet(other_az);
        assert_eq!(
            ids(&select_subnets(&node(), &w.view(), 10).unwrap()),
            ["subnet-b", "subnet-a"]
        );
        for s in w.subnets.values_mut() {
            s.available_addresses = 0;
        }
        assert_eq!(
            select_subnets(&node(), &w.view(), 10).unwrap_err().reason,
            ProblemReason::NoMatchingSubnet
        );
    }

    #[test]
    fn cooldown_expires() {
        let mut w = World::new();
        let t0 = Instant::now();
        w.cooldown.insert("subnet-a".into(), t0);
        let config = IpamConfig {
            prefix_cooldown: Duration::from_secs(60),
            ..Default::default()
        };
        let v = w.view();
        assert!(in_prefix_cooldown(
            &v,
            &config,
            "subnet-a",
            t0 + Duration::from_secs(59)
        ));
        assert!(!in_prefix_cooldown(
            &v,
            &config,
            "subnet-a",
            t0 + Duration::from_secs(60)
        ));
        assert!(!in_prefix_cooldown(&v, &config, "subnet-b", t0));
        let small = subnet("subnet-s", "10.0.99.0/24", 15);
        assert!(!prefix_eligible(&v, &config, &small, t0));
    }

    #[test]
    fn security_groups_explicit() {
        let w = World::new();
        let mut n = node();
        n.spec.eni.security_groups = vec!["sg-z".into(), "sg-a".into()];
        let got = select_security_groups(&n, &w.view(), &w.enis).unwrap();
        assert_eq!(got, ["sg-z", "sg-a"], "explicit list kept as given");
    }

    #[test]
    fn security_groups_by_tags_sorted_or_error() {
        let mut w = World::new();
        for g in [
            sg("sg-b", &[("k", "v")]),
            sg("sg-a", &[("k", "v")]),
            sg("sg-c", &[]),
        ] {
            w.security_groups.insert(g.id.clone(), g);
        }
        let mut n = node();
        n.spec.eni.security_group_tags = tags(&[("k", "v")]);
        assert_eq!(
            select_security_groups(&n, &w.view(), &w.enis).unwrap(),
            ["sg-a", "sg-b"]
        );
        n.spec.eni.security_group_tags = tags(&[("k", "nope")]);
        let err = select_security_groups(&n, &w.view(), &w.enis).unwrap_err();
        assert_eq!(err.reason, ProblemReason::NoSecurityGroups);
    }

    #[test]
    fn security_groups_from_primary_eni_or_error() {
        let mut w = World::new();
        w.enis[0].security_groups = vec!["sg-2".into(), "sg-1".into()];
        assert_eq!(
            select_security_groups(&node(), &w.view(), &w.enis).unwrap(),
            ["sg-1", "sg-2"]
        );
        w.enis[0].security_groups.clear();
        assert_eq!(
            select_security_groups(&node(), &w.view(), &w.enis)
                .unwrap_err()
                .reason,
            ProblemReason::NoSecurityGroups
        );
    }

    #[test]
    fn device_index_lowest_free_from_first() {
        let enis = vec![eni("eni-0", 0, "s"), eni("eni-2", 2, "s")];
        assert_eq!(next_device_index(&enis, 0, 4), Some(1));
        assert_eq!(next_device_index(&enis, 2, 4), Some(3));
        assert_eq!(next_device_index(&enis, 0, 2), None);
        assert_eq!(next_device_index(&enis, 3, 3), None);
    }
}
