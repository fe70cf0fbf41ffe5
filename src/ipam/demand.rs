//! Demand: the node's agent generation and its available/used/needed/excess figures.
//!
//! The two formulas ([`needed`], [`excess`]) are Cilium's, reproduced exactly (docs/rules.md §2,
//! with upstream's test rows as unit tests). They take the pre-allocation P as given; the
//! substitution of 0 by 8 is [`pre_allocate`]'s job, as upstream. Multi-pool agents do not
//! report use; it is recovered from their demand (C7) by [`multi_pool_used`].

use std::collections::BTreeSet;
use std::net::Ipv4Addr;

use crate::crd::{CiliumNode, DEFAULT_POOL};

use super::{Problem, ProblemReason};

/// Pre-allocation applied when `spec.ipam.pre-allocate` is 0.
pub const DEFAULT_PRE_ALLOCATE: i64 = 8;

/// Which Cilium agent generation serves the node (C6).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Generation {
    #[default]
    Classic,
    MultiPool,
}

/// The node's demand figures.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Demand {
    pub generation: Generation,
    pub available: i64,
    pub used: i64,
    pub needed: i64,
    pub excess: i64,
}

/// The agent- or user-set watermarks of `spec.ipam`, validated.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Watermarks {
    /// P, already substituted (0 -> 8).
    pub pre_allocate: i64,
    pub min_allocate: i64,
    /// As written; 0 = "use the instance maximum".
    pub max_allocate: i64,
    pub max_above_watermark: i64,
}

/// C6: multi-pool iff `pools.requested` has a `default` entry and `status.ipam.used` is empty.
///
/// ```
/// use eni_operator::crd::{CiliumNode, CiliumNodeSpec, IpamPoolRequest};
/// use eni_operator::ipam::demand::{generation, Generation};
/// let mut node = CiliumNode::new("n1", CiliumNodeSpec::default());
/// assert_eq!(generation(&node), Generation::Classic);
/// node.spec.ipam.pools.requested.push(IpamPoolRequest { pool: "default".into(), ..Default::default() });
/// assert_eq!(generation(&node), Generation::MultiPool);
/// ```
pub fn generation(node: &CiliumNode) -> Generation {
    let requests_default = node
        .spec
        .ipam
        .pools
        .requested
        .iter()
        .any(|r| r.pool == DEFAULT_POOL);
    let used_empty = node.status.as_ref().is_none_or(|s| s.ipam.used.is_empty());
    if requests_default && used_empty {
        Generation::MultiPool
    } else {
        Generation::Classic
    }
}

/// P: `spec.ipam.pre-allocate` if > 0, else 8.
///
/// ```
/// use eni_operator::ipam::demand::pre_allocate;
/// assert_eq!(pre_allocate(0), 8);
/// assert_eq!(pre_allocate(3), 3);
/// ```
pub fn pre_allocate(spec_value: i64) -> i64 {
    if spec_value > 0 {
        spec_value
    } else {
        DEFAULT_PRE_ALLOCATE
    }
}

/// needed(A, U, P, m, M), docs/rules.md §2.
///
/// ```
/// use eni_operator::ipam::demand::needed;
/// // 8 available, 4 used, keep 8 spare: 4 more.
/// assert_eq!(needed(8, 4, 8, 0, 0), 4);
/// // ...unless max-allocate caps the node at 8.
/// assert_eq!(needed(8, 4, 8, 0, 8), 0);
/// ```
pub fn needed(available: i64, used: i64, pre: i64, min: i64, max: i64) -> i64 {
    // Saturating: release builds do not check overflow, and the inputs are an agent's numbers.
    let n0 = pre.saturating_sub(available.saturating_sub(used));
    let n1 = if min > 0 {
        n0.max(min.saturating_sub(available))
    } else {
        n0
    };
    let n2 = if max > 0 && available.saturating_add(n1) > max {
        max.saturating_sub(available)
    } else {
        n1
    };
    n2.max(0)
}

/// excess(A, U, P, m, W), docs/rules.md §2 (last branch subtracts P, not m).
///
/// ```
/// use eni_operator::ipam::demand::excess;
/// // 21 available, none used, P = 8, W = 4: 9 in excess.
/// assert_eq!(excess(21, 0, 8, 0, 4), 9);
/// ```
pub fn excess(available: i64, used: i64, pre: i64, min: i64, above: i64) -> i64 {
    let t = min.saturating_add(above);
    if used <= t && available <= t {
        0
    } else if used <= t && used.saturating_add(pre) <= t {
        available.saturating_sub(t)
    } else {
        available
            .saturating_sub(used)
            .saturating_sub(pre)
            .saturating_sub(above)
            .max(0)
    }
}

/// Above this a watermark or a request is no node's: the largest instance holds about 50,000
/// addresses (64 interfaces of 50, in /28s). Rejected with `InvalidSpec`, never planned with.
pub const ABSURD: i64 = 1 << 20;

/// C7: a multi-pool agent's use, recovered from its demand: max(0, requested - P). Clamping at
/// 0 errs towards over-allocation when the agent's own pre-allocation is unknown.
///
/// ```
/// use eni_operator::ipam::demand::multi_pool_used;
/// assert_eq!(multi_pool_used(20, 8), 12);
/// assert_eq!(multi_pool_used(5, 8), 0);
/// ```
pub fn multi_pool_used(requested: i64, pre: i64) -> i64 {
    (requested - pre).max(0)
}

/// `requested[default].needed.ipv4-addrs` (0 when absent).
pub fn requested(node: &CiliumNode) -> i64 {
    node.spec
        .ipam
        .pools
        .requested
        .iter()
        .find(|r| r.pool == DEFAULT_POOL)
        .map_or(0, |r| r.needed.ipv4_addrs)
}

/// Reads and validates `spec.ipam`'s numbers; a negative one is [`ProblemReason::InvalidSpec`].
pub fn watermarks(node: &CiliumNode) -> Result<Watermarks, Problem> {
    let ipam = &node.spec.ipam;
    let fields = [
        ("pre-allocate", ipam.pre_allocate),
        ("min-allocate", ipam.min_allocate),
        ("max-allocate", ipam.max_allocate),
        ("max-above-watermark", ipam.max_above_watermark),
    ];
    if let Some((name, value)) = fields.iter().find(|(_, v)| *v < 0) {
        return Err(Problem {
            reason: ProblemReason::InvalidSpec,
            message: format!("spec.ipam.{name} is negative ({value})"),
        });
    }
    if let Some((name, value)) = fields.iter().find(|(_, v)| *v > ABSURD) {
        return Err(Problem {
            reason: ProblemReason::InvalidSpec,
            message: format!("spec.ipam.{name} is absurdly large ({value}; at most {ABSURD})"),
        });
    }
    if let Some(requested) = node
        .spec
        .ipam
        .pools
        .requested
        .iter()
        .find(|r| r.pool == DEFAULT_POOL && !(0..=ABSURD).contains(&r.needed.ipv4_addrs))
    {
        return Err(Problem {
            reason: ProblemReason::InvalidSpec,
            message: format!(
                "spec.ipam.pools.requested[default].needed.ipv4-addrs is negative or absurd ({})",
                requested.needed.ipv4_addrs
            ),
        });
    }
    Ok(Watermarks {
        pre_allocate: pre_allocate(ipam.pre_allocate),
        min_allocate: ipam.min_allocate,
        max_allocate: ipam.max_allocate,
        max_above_watermark: ipam.max_above_watermark,
    })
}

/// Addresses in `status.ipam.used` (classic agents), unparsable keys skipped.
pub fn used_addresses(node: &CiliumNode) -> BTreeSet<Ipv4Addr> {
    node.status
        .as_ref()
        .map(|s| s.ipam.used.keys().filter_map(|k| k.parse().ok()).collect())
        .unwrap_or_default()
}

/// All demand figures of a node. `available` is A (§1.1); `instance_max` is the default for M
/// (0 = no cap, limits unknown).
pub fn compute(node: &CiliumNode, marks: &Watermarks, available: i64, instance_max: i64) -> Demand {
    let generation = generation(node);
    let used = match generation {
        Generation::Classic => node.status.as_ref().map_or(0, |s| s.ipam.used.len() as i64),
        Generation::MultiPool => multi_pool_used(requested(node), marks.pre_allocate),
    };
    let max = if marks.max_allocate > 0 {
        marks.max_allocate
    } else {
        instance_max
    };
    Demand {
        generation,
        available,
        used,
        needed: needed(available, used, marks.pre_allocate, marks.min_allocate, max),
        excess: excess(
            available,
            used,
            marks.pre_allocate,
            marks.min_allocate,
            marks.max_above_watermark,
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::{AllocationIp, CiliumNodeSpec, CiliumNodeStatus, IpamPoolRequest};
    use proptest::prelude::*;

    // docs/rules.md §2.1, upstream TestCalculateNeededIPs, in order: (A, U, P, m, M, needed).
    // Source: cilium/cilium operator/pkg/ipam/nodemanager/node_test.go, `neededDef`, commit
    // 35b06d5aefdf4846a2684a331871938ccbd41e8c (same rows since pkg/ipam/node_test.go).
    const NEEDED_ROWS: [(i64, i64, i64, i64, i64, i64); 10] = [
        (0, 0, 0, 16, 0, 16),
        (0, 0, 8, 16, 0, 16),
        (0, 0, 16, 8, 0, 16),
        (0, 0, 16, 0, 0, 16),
        (8, 0, 0, 16, 0, 8),
        (8, 4, 8, 0, 0, 4),
        (8, 4, 8, 8, 0, 4),
        (8, 4, 8, 8, 6, 0),
        (8, 4, 8, 0, 8, 0),
        (4, 4, 8, 0, 8, 4),
    ];

    // Upstream TestCalculateExcessIPs, in order: (A, U, P, m, W, excess). Same file and commit,
    // `excessDef`. Row 3 reads 9 in the older pkg/ipam/node_test.go (commit
    // e0cc421a538bca20fe30f4e1fc8f04951a536993, formula without the middle branch); we follow
    // the newer 1 (docs/rules.md §2.3).
    const EXCESS_ROWS: [(i64, i64, i64, i64, i64, i64); 10] = [
        (0, 0, 0, 16, 0, 0),
        (15, 0, 8, 16, 8, 0),
        (17, 0, 8, 16, 0, 1),
        (20, 0, 8, 16, 4, 0),
        (21, 0, 8, 0, 4, 9),
        (20, 0, 8, 20, 8, 0),
        (16, 1, 8, 16, 8, 0),
        (20, 4, 8, 17, 8, 0),
        (20, 4, 8, 0, 0, 8),
        (20, 4, 8, 0, 8, 0),
    ];

    #[test]
    fn needed_vectors() {
        for (i, (a, u, p, m, max, want)) in NEEDED_ROWS.iter().enumerate() {
            assert_eq!(needed(*a, *u, *p, *m, *max), *want, "needed row {}", i + 1);
        }
    }

    #[test]
    fn excess_vectors() {
        for (i, (a, u, p, m, w, want)) in EXCESS_ROWS.iter().enumerate() {
            assert_eq!(excess(*a, *u, *p, *m, *w), *want, "excess row {}", i + 1);
        }
    }

    #[test]
    fn excess_is_not_the_min_allocate_variant() {
        // The wrong variant max(A - U - m - W, 0) gives 17 and 16 on rows 5 and 9.
        assert_eq!(excess(21, 0, 8, 0, 4), 9);
        assert_eq!(excess(20, 4, 8, 0, 0), 8);
    }

    #[test]
    fn pre_allocate_substitution() {
        assert_eq!(pre_allocate(0), 8);
        assert_eq!(pre_allocate(-1), 8);
        assert_eq!(pre_allocate(1), 1);
        assert_eq!(pre_allocate(16), 16);
    }

    fn node_with(requested: Option<i64>, used: usize) -> CiliumNode {
        let mut node = CiliumNode::new("n", CiliumNodeSpec::default());
        if let Some(r) = requested {
            let mut req = IpamPoolRequest {
                pool: DEFAULT_POOL.into(),
                ..Default::default()
            };
            req.needed.ipv4_addrs = r;
            node.spec.ipam.pools.requested.push(req);
        }
        let mut status = CiliumNodeStatus::default();
        for i in 0..used {
            status
                .ipam
                .used
                .insert(format!("10.0.0.{i}"), AllocationIp::default());
        }
        node.status = Some(status);
        node
    }

    #[test]
    fn generation_detection() {
        assert_eq!(generation(&node_with(None, 0)), Generation::Classic);
        assert_eq!(generation(&node_with(Some(0), 0)), Generation::MultiPool);
        assert_eq!(generation(&node_with(Some(20), 0)), Generation::MultiPool);
        // A downgraded classic agent writes `used`: the stale request is ignored.
        assert_eq!(generation(&node_with(Some(20), 2)), Generation::Classic);
        let mut other_pool = node_with(None, 0);
        other_pool.spec.ipam.pools.requested.push(IpamPoolRequest {
            pool: "blue".into(),
            ..Default::default()
        });
        assert_eq!(generation(&other_pool), Generation::Classic);
    }

    #[test]
    fn multi_pool_use_from_requested() {
        let node = node_with(Some(20), 0);
        let marks = watermarks(&node).unwrap();
        let d = compute(&node, &marks, 32, 0);
        assert_eq!(d.generation, Generation::MultiPool);
        assert_eq!(d.used, 12);
        assert_eq!(d.needed, 0);
        assert_eq!(d.excess, 12);
        let classic = node_with(None, 3);
        let d = compute(&classic, &watermarks(&classic).unwrap(), 4, 0);
        assert_eq!((d.used, d.needed), (3, 7));
    }

    #[test]
    fn negative_numbers_are_invalid() {
        let mut node = node_with(None, 0);
        node.spec.ipam.max_above_watermark = -1;
        let p = watermarks(&node).unwrap_err();
        assert_eq!(p.reason, ProblemReason::InvalidSpec);
        assert!(p.message.contains("max-above-watermark"));
        let node = node_with(Some(-3), 0);
        assert_eq!(
            watermarks(&node).unwrap_err().reason,
            ProblemReason::InvalidSpec
        );
    }

    /// Issue 29: absurd numbers are rejected, and the formulas never wrap (release builds do
    /// not check overflow; debug builds panicked here).
    #[test]
    fn absurd_numbers_are_invalid_and_the_formulas_saturate() {
        let mut node = node_with(None, 0);
        node.spec.ipam.max_above_watermark = i64::MAX;
        let p = watermarks(&node).unwrap_err();
        assert_eq!(p.reason, ProblemReason::InvalidSpec);
        assert!(p.message.contains("absurd"), "{}", p.message);
        let node = node_with(Some(i64::MAX), 0);
        assert_eq!(
            watermarks(&node).unwrap_err().reason,
            ProblemReason::InvalidSpec
        );
        assert_eq!(needed(0, i64::MIN, i64::MAX, i64::MAX, 0), i64::MAX);
        assert_eq!(needed(i64::MAX, 0, 8, 0, i64::MAX), 0);
        assert_eq!(excess(i64::MAX, i64::MIN, i64::MAX, i64::MAX, i64::MAX), 0);
        assert!(excess(i64::MAX, 0, 0, i64::MIN, 0) >= 0);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        /// §2.2 / C7: with requested >= P, P cancels out of both formulas.
        #[test]
        fn multi_pool_results_do_not_depend_on_p(
            a in 0i64..500, extra in 0i64..300, p1 in 1i64..40, p2 in 1i64..40,
            m in 0i64..64, max in 0i64..600, w in 0i64..32,
        ) {
            let requested = p1.max(p2) + extra;
            let u1 = multi_pool_used(requested, p1);
            let u2 = multi_pool_used(requested, p2);
            prop_assert_eq!(needed(a, u1, p1, m, max), needed(a, u2, p2, m, max));
            prop_assert_eq!(excess(a, u1, p1, m, w), excess(a, u2, p2, m, w));
        }
    }
}
