//! Capacity from instance-type limits: exclusion, per-ENI room, node maximum/minimum,
//! prefix-delegation eligibility (docs/rules.md §3, §6).
//!
//! Room is counted from free address SLOTS rather than from Cilium's per-ENI limit formula: EC2
//! gives an ENI L slots, one for the primary address and one per secondary address or /28
//! prefix. Counting slots is exact for ENIs holding both kinds, which eni-operator allows, and
//! agrees with Cilium on pure ENIs.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;

use crate::crd::EniSpec;
use crate::ec2::{InstanceTypeLimits, NetworkInterface, PREFIX_SIZE, prefix_addresses};

use super::IpamConfig;

/// `spec.eni.first-interface-index`, 0 when unset (negative values are clamped: the planner
/// reports them as invalid before using this).
pub fn first_interface_index(spec: &EniSpec) -> u32 {
    spec.first_interface_index
        .map_or(0, |f| u32::try_from(f.max(0)).unwrap_or(u32::MAX))
}

/// An ENI is excluded from pod use when its device index is below `first-interface-index`, or
/// when its tags contain every pair of `exclude-interface-tags`, or when it is not an ENA
/// `interface` (an `efa` or `efa-only` interface of a p4d/p5/trn instance, §5.4). Excluded ENIs
/// are published but never used, counted, modified or released.
///
pub fn is_excluded(eni: &NetworkInterface, spec: &EniSpec) -> bool {
    // An ENI without an attachment is not on the instance: treat it as unusable.
    let below_first = eni
        .device_index()
        .is_none_or(|index| index < first_interface_index(spec));
    below_first || !eni.serves_pods() || eni.has_all_tags(&spec.exclude_interface_tags)
}

/// The ENIs attached to the node's instance (C5: an ENI of another instance never counts).
pub fn instance_enis<'a>(
    instance_id: &str,
    enis: &'a [NetworkInterface],
) -> Vec<&'a NetworkInterface> {
    enis.iter()
        .filter(|e| e.instance_id() == Some(instance_id))
        .collect()
}

/// The ENIs usable for pods: attached to the instance and not excluded.
pub fn usable_enis<'a>(
    instance_id: &str,
    spec: &EniSpec,
    enis: &'a [NetworkInterface],
) -> Vec<&'a NetworkInterface> {
    instance_enis(instance_id, enis)
        .into_iter()
        .filter(|e| !is_excluded(e, spec))
        .collect()
}

/// What a node's instance offers pods now: its usable ENIs, whether their primaries are
/// offered, whether it takes /28 prefixes, and the most addresses it may hold (M's default).
pub struct Room<'a> {
    pub usable: Vec<&'a NetworkInterface>,
    pub with_primary: bool,
    pub prefix_delegated: bool,
    pub instance_max: i64,
}

impl<'a> Room<'a> {
    pub fn of(
        instance_id: &str,
        spec: &EniSpec,
        enis: &'a [NetworkInterface],
        limits: &InstanceTypeLimits,
        config: &IpamConfig,
    ) -> Self {
        let prefix_delegated = is_prefix_delegated(config, Some(limits), spec);
        Self {
            usable: usable_enis(instance_id, spec, enis),
            with_primary: offers_primary(config, spec),
            prefix_delegated,
            instance_max: max_allocatable(
                Some(limits),
                spec.first_interface_index,
                prefix_delegated,
            ),
        }
    }

    /// The addresses its usable ENIs offer (A, §1.1) that `counts` keeps.
    pub fn available(&self, counts: impl Fn(&Ipv4Addr) -> bool) -> i64 {
        self.usable
            .iter()
            .map(|e| {
                usable_addresses(e, self.with_primary)
                    .iter()
                    .filter(|ip| counts(ip))
                    .count() as i64
            })
            .sum()
    }
}

/// Whether the primary address is offered to pods. Either knob turns it on (the node's
/// `spec.eni.use-primary-address` or the operator's `--aws-use-primary-address`): counting it in
/// capacity without listing it (or the reverse) miscounts room by one per ENI (§3), so the two
/// are treated as one.
pub fn offers_primary(config: &IpamConfig, spec: &EniSpec) -> bool {
    config.use_primary_address || spec.use_primary_address == Some(true)
}

/// The ENI's `addresses` as published (C3): secondary addresses plus all 16 of every /28, plus
/// the primary when offered. Sorted, without duplicates.
pub fn usable_addresses(eni: &NetworkInterface, with_primary: bool) -> BTreeSet<Ipv4Addr> {
    let mut set: BTreeSet<Ipv4Addr> = eni.secondary_ips.iter().copied().collect();
    set.extend(eni.prefixes.iter().flat_map(|p| prefix_addresses(*p)));
    // An `efa-only` interface has no IPv4 address: its "primary" (0.0.0.0) is nobody's.
    if with_primary && !eni.primary_ip.is_unspecified() {
        set.insert(eni.primary_ip);
    } else {
        set.remove(&eni.primary_ip);
    }
    set
}

/// Secondary addresses not covered by one of the ENI's prefixes, primary excluded: each takes
/// one slot.
pub fn single_addresses(eni: &NetworkInterface) -> Vec<Ipv4Addr> {
    eni.secondary_ips
        .iter()
        .copied()
        .filter(|ip| *ip != eni.primary_ip && !eni.prefixes.iter().any(|p| p.contains(ip)))
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect()
}

/// Free slots s = (L - 1) - single addresses - prefixes (never below 0).
///
/// ```
/// # use eni_operator::ipam::capacity::free_slots_for;
/// // L = 10: 9 secondary slots; 2 prefixes and 3 single addresses leave 4.
/// assert_eq!(free_slots_for(10, 3, 2), 4);
/// ```
pub fn free_slots_for(ipv4_per_eni: u32, singles: u32, prefixes: u32) -> u32 {
    ipv4_per_eni
        .saturating_sub(1)
        .saturating_sub(singles)
        .saturating_sub(prefixes)
}

/// Free slots of one ENI under the instance type's limits.
pub fn free_slots(eni: &NetworkInterface, limits: &InstanceTypeLimits) -> u32 {
    free_slots_for(
        limits.ipv4_per_eni,
        single_addresses(eni).len() as u32,
        eni.prefixes.len() as u32,
    )
}

/// Cilium's two interface figures of one node (cilium/cilium `pkg/aws/eni/node.go`,
/// `PrepareIPAllocation`, at 0007e35d0a5de7b570e4750cb12a7965b3301949; summed over nodes in
/// `pkg/ipam/node_manager.go` `Resync` into `ipam_interface_candidates` and
/// `ipam_empty_interface_slots`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InterfaceStats {
    /// ENIs usable for pods (attached, not excluded) with room for another address.
    pub candidates: u32,
    /// Interfaces the instance can still attach: its limit minus every attached ENI (excluded
    /// ones and the primary included).
    pub empty_slots: u32,
}

pub fn interface_stats(
    instance_id: &str,
    spec: &EniSpec,
    enis: &[NetworkInterface],
    limits: &InstanceTypeLimits,
) -> InterfaceStats {
    let attached = instance_enis(instance_id, enis);
    let candidates = attached
        .iter()
        .filter(|e| !is_excluded(e, spec) && free_slots(e, limits) > 0)
        .count();
    // New ENIs go on network card 0 (§5.4): its free interfaces are the empty slots.
    let on_card0 = attached
        .iter()
        .filter(|e| e.network_card() == Some(0))
        .count();
    InterfaceStats {
        candidates: candidates as u32,
        empty_slots: limits.pod_max_enis().saturating_sub(on_card0 as u32),
    }
}

/// The address kind a request uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Single secondary addresses: one per slot.
    Ips,
    /// /28 prefixes: 16 addresses per slot.
    Prefixes,
}

/// Addresses that can still be added to an ENI with the given kind: 16·s for prefixes, s for
/// single addresses. (The "+1 for the primary" of §3 is capacity the ENI already holds: when
/// offered, the primary is already in `addresses`, so it never adds room for new addresses.)
pub fn room(eni: &NetworkInterface, limits: &InstanceTypeLimits, kind: Kind) -> u32 {
    let s = free_slots(eni, limits);
    match kind {
        Kind::Ips => s,
        Kind::Prefixes => s * PREFIX_SIZE,
    }
}

/// Maximum allocatable addresses, the default for max-allocate: (N - f) · max(L - 1, 0) · (16
/// if prefix-delegated). 0 ("no cap") when limits are unknown, f is unset, or N < f.
///
/// ```
/// # use eni_operator::ipam::capacity::max_allocatable;
/// # use eni_operator::ec2::InstanceTypeLimits;
/// let m5_large = InstanceTypeLimits { instance_type: "m5.large".into(), max_enis: 3,
///     ipv4_per_eni: 10, ipv6_per_eni: 10, nitro: true, bare_metal: false,
///     enis_per_card: vec![] };
/// assert_eq!(max_allocatable(Some(&m5_large), Some(0), false), 27);
/// assert_eq!(max_allocatable(Some(&m5_large), Some(1), false), 18);
/// assert_eq!(max_allocatable(Some(&m5_large), Some(4), false), 0);
/// assert_eq!(max_allocatable(None, Some(0), false), 0);
/// ```
pub fn max_allocatable(
    limits: Option<&InstanceTypeLimits>,
    first_interface_index: Option<i64>,
    prefix_delegated: bool,
) -> i64 {
    let (Some(limits), Some(f)) = (limits, first_interface_index) else {
        return 0;
    };
    // Agent-written and unbounded under our CRD: a negative index is clamped as everywhere
    // else (the planner reports it), never subtracted (`i64::MIN` overflowed).
    let f = f.max(0);
    let n = i64::from(limits.pod_max_enis());
    if n < f {
        return 0;
    }
    let per_eni = (i64::from(limits.ipv4_per_eni) - 1).max(0);
    let factor = if prefix_delegated {
        i64::from(PREFIX_SIZE)
    } else {
        1
    };
    (n - f) * per_eni * factor
}

/// The node's address capacity (Cilium's `NodeCapacity`, published per node): every usable ENI's
/// present addresses plus its room, plus a fresh ENI's worth for each free interface slot.
/// Counted from slots, so an ENI holding both kinds is exact, and a prefix-delegated ENI that
/// offers its primary holds 16 (L - 1) + 1, not Cilium's 16 L (docs/rules.md §2.3).
///
/// ```
/// # use eni_operator::ipam::capacity::node_capacity;
/// # use eni_operator::ec2::InstanceTypeLimits;
/// let m5_large = InstanceTypeLimits { instance_type: "m5.large".into(), max_enis: 3,
///     ipv4_per_eni: 10, ipv6_per_eni: 10, nitro: true, bare_metal: false,
///     enis_per_card: vec![] };
/// assert_eq!(node_capacity(&m5_large, &[], 0, false, false), 27);
/// assert_eq!(node_capacity(&m5_large, &[], 0, true, false), 432);
/// ```
pub fn node_capacity(
    limits: &InstanceTypeLimits,
    usable: &[&NetworkInterface],
    occupied_slots: u32,
    prefix_delegated: bool,
    with_primary: bool,
) -> i64 {
    let kind = if prefix_delegated {
        Kind::Prefixes
    } else {
        Kind::Ips
    };
    let per_slot = if prefix_delegated { PREFIX_SIZE } else { 1 };
    let fresh =
        i64::from(limits.ipv4_per_eni.saturating_sub(1) * per_slot) + i64::from(with_primary);
    let present: i64 = usable
        .iter()
        .map(|e| usable_addresses(e, with_primary).len() as i64 + i64::from(room(e, limits, kind)))
        .sum();
    let free_slots = i64::from(limits.pod_max_enis().saturating_sub(occupied_slots));
    present + free_slots * fresh
}

/// Minimum allocatable: min(8, (N - f) · max(L - 1, 0)); 8 when limits or f are unknown, 0
/// when f >= N. (Cilium writes it into `pre-allocate`; eni-operator only reports it.)
///
/// ```
/// # use eni_operator::ipam::capacity::min_allocatable;
/// assert_eq!(min_allocatable(None, Some(0)), 8);
/// ```
pub fn min_allocatable(
    limits: Option<&InstanceTypeLimits>,
    first_interface_index: Option<i64>,
) -> i64 {
    let (Some(limits), Some(f)) = (limits, first_interface_index) else {
        return 8;
    };
    let n = i64::from(limits.pod_max_enis());
    if f >= n {
        return 0;
    }
    let per_eni = (i64::from(limits.ipv4_per_eni) - 1).max(0);
    ((n - f) * per_eni).min(8)
}

/// Whether the node requests /28 prefixes: the global switch, known Nitro or bare-metal
/// limits, and no per-node opt-out. Unlike Cilium, single addresses already on the node do not
/// disable it: a node may hold both kinds, counted per slot.
pub fn is_prefix_delegated(
    config: &IpamConfig,
    limits: Option<&InstanceTypeLimits>,
    spec: &EniSpec,
) -> bool {
    config.prefix_delegation
        && limits.is_some_and(InstanceTypeLimits::supports_prefix_delegation)
        && spec.disable_prefix_delegation != Some(true)
}

#[cfg(test)]
mod interface_stats_tests {
    use super::*;
    use crate::ipam::fixtures::{INSTANCE, eni_with_ips, limits};

    #[test]
    fn candidates_have_room_and_are_not_excluded_slots_count_every_attached_eni() {
        let l = limits(4, 10, true);
        let spec = EniSpec {
            first_interface_index: Some(1),
            ..EniSpec::default()
        };
        let mut enis = vec![
            eni_with_ips("eni-p", 0, "subnet-1", 0), // excluded: below first-interface-index
            eni_with_ips("eni-a", 1, "subnet-1", 9), // full: 9 secondary slots
            eni_with_ips("eni-b", 2, "subnet-1", 3), // room
        ];
        let want = InterfaceStats {
            candidates: 1,
            empty_slots: 1,
        };
        assert_eq!(interface_stats(INSTANCE, &spec, &enis, &l), want);
        // Without the exclusion the primary ENI has room too.
        let all = interface_stats(INSTANCE, &EniSpec::default(), &enis, &l);
        assert_eq!(all.candidates, 2);
        // Another instance's ENI counts for neither figure.
        let mut other = eni_with_ips("eni-x", 3, "subnet-1", 0);
        other.attachment.as_mut().expect("attached").instance_id = "i-other".into();
        enis.push(other);
        assert_eq!(interface_stats(INSTANCE, &spec, &enis, &l), want);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ipam::fixtures::*;

    fn m5_large() -> InstanceTypeLimits {
        limits(3, 10, true)
    }

    // cilium/cilium pkg/aws/ipam/node_test.go `TestGetMaximumAllocatableIPv4`, commit
    // 0aa2ad8e105e46f1c84e75cedca7243f16930eda: m5.large 27 (f = 0), 18 (f = 1), 0 (f = 4),
    // 0 for an unknown type.
    #[test]
    fn max_allocatable_upstream_vectors() {
        let l = m5_large();
        assert_eq!(max_allocatable(Some(&l), Some(0), false), 27);
        assert_eq!(max_allocatable(Some(&l), Some(1), false), 18);
        assert_eq!(max_allocatable(Some(&l), Some(4), false), 0);
        assert_eq!(max_allocatable(None, Some(0), false), 0);
        assert_eq!(max_allocatable(Some(&l), None, false), 0);
        assert_eq!(max_allocatable(Some(&l), Some(1), true), 18 * 16);
        assert_eq!(max_allocatable(Some(&l), Some(-1), false), 27);
        assert_eq!(max_allocatable(Some(&l), Some(i64::MIN), true), 27 * 16);
        // §3: m5.xlarge (4 ENIs x 15 addresses), f = 1, prefixes: (4 - 1) x 14 x 16 = 672.
        assert_eq!(
            max_allocatable(Some(&limits(4, 15, true)), Some(1), true),
            672
        );
    }

    #[test]
    fn min_allocatable_vectors() {
        let l = m5_large();
        assert_eq!(min_allocatable(Some(&l), Some(0)), 8);
        assert_eq!(min_allocatable(Some(&limits(2, 3, false)), Some(1)), 2);
        assert_eq!(min_allocatable(Some(&l), Some(3)), 0);
        assert_eq!(min_allocatable(None, Some(0)), 8);
    }

    #[test]
    fn exclusion_by_index_and_tags() {
        let mut spec = EniSpec {
            first_interface_index: Some(1),
            ..Default::default()
        };
        let primary = eni("eni-0", 0, "subnet-a");
        let mut second = eni("eni-1", 1, "subnet-a");
        assert!(is_excluded(&primary, &spec));
        assert!(!is_excluded(&second, &spec));
        spec.exclude_interface_tags = tags(&[("k", "v"), ("x", "y")]);
        second.tags = tags(&[("k", "v")]);
        assert!(!is_excluded(&second, &spec), "only some tags present");
        second.tags = tags(&[("k", "v"), ("x", "y"), ("z", "1")]);
        assert!(is_excluded(&second, &spec), "all tags present");
    }

    #[test]
    fn room_counts_slots_for_mixed_enis() {
        let l = m5_large(); // 9 secondary slots
        let mut e = eni("eni-1", 1, "subnet-a");
        e.secondary_ips = vec![ip("10.0.0.5"), ip("10.0.0.6")];
        e.prefixes = vec![net("10.0.1.0/28")];
        // A secondary listed inside a prefix is not a separate slot.
        e.secondary_ips.push(ip("10.0.1.3"));
        assert_eq!(free_slots(&e, &l), 6);
        assert_eq!(room(&e, &l, Kind::Ips), 6);
        assert_eq!(room(&e, &l, Kind::Prefixes), 96);
        assert_eq!(usable_addresses(&e, false).len(), 18);
        assert_eq!(usable_addresses(&e, true).len(), 19);
        let full = eni_with_ips("eni-2", 2, "subnet-a", 9);
        assert_eq!(room(&full, &l, Kind::Prefixes), 0);
    }

    #[test]
    fn prefix_delegation_eligibility() {
        let on = IpamConfig {
            prefix_delegation: true,
            ..Default::default()
        };
        let spec = EniSpec::default();
        assert!(is_prefix_delegated(&on, Some(&m5_large()), &spec));
        assert!(!is_prefix_delegated(
            &IpamConfig::default(),
            Some(&m5_large()),
            &spec
        ));
        assert!(!is_prefix_delegated(&on, None, &spec));
        assert!(!is_prefix_delegated(
            &on,
            Some(&limits(3, 10, false)),
            &spec
        ));
        let mut metal = limits(3, 10, false);
        metal.bare_metal = true;
        assert!(is_prefix_delegated(&on, Some(&metal), &spec));
        let opt_out = EniSpec {
            disable_prefix_delegation: Some(true),
            ..Default::default()
        };
        assert!(!is_prefix_delegated(&on, Some(&m5_large()), &opt_out));
    }
}
