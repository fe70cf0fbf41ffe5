//! The demo's script: when nodes join (in waves, classic and multi-pool agents), how many pods
//! each runs over time (demand rising, then falling far enough to release), when the account
//! is throttled; and the rate-limit bound of nodes served that the plot draws against.

use std::time::Duration;

use eni_operator::ec2::Operation;
use eni_operator::ec2::gate::GateConfig;
use testkit::agent::{Generation, endpoints};

/// One wave of nodes joining at once.
#[derive(Clone, Debug, PartialEq)]
pub struct Wave {
    pub at: Duration,
    pub nodes: usize,
}

/// The whole run.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    pub waves: Vec<Wave>,
    /// Every `multi_pool_every`-th node runs the multi-pool agent (0: none).
    pub multi_pool_every: usize,
    /// Pods per node from its join, after `rise_at`, after `fall_at`.
    pub pods: [usize; 3],
    pub rise_at: Duration,
    pub fall_at: Duration,
    /// In this window another caller in the account empties every bucket (a burst of its own),
    /// then takes `throttle_share` of their refill.
    pub throttle: (Duration, Duration),
    pub throttle_share: f64,
    /// The operator releases excess addresses this long after proposing them.
    pub release_delay: Duration,
    /// The operator re-plans every node this often (a release starts on a re-plan).
    pub rescan: Duration,
    /// Give up (and fail) after this long.
    pub limit: Duration,
    pub instance_type: &'static str,
    /// Addresses a new ENI of the instance type carries (its limit minus its own primary).
    pub per_eni: usize,
    pub first_interface_index: i64,
}

impl Plan {
    /// `make demo`: 240 nodes in four waves, every third one multi-pool.
    pub fn full() -> Self {
        Self {
            waves: (0..4)
                .map(|i| Wave {
                    at: Duration::from_secs(20 * i),
                    nodes: 60,
                })
                .collect(),
            multi_pool_every: 3,
            pods: [6, 16, 2],
            rise_at: Duration::from_secs(110),
            fall_at: Duration::from_secs(200),
            throttle: (Duration::from_secs(30), Duration::from_secs(50)),
            throttle_share: 0.9,
            release_delay: Duration::from_secs(20),
            rescan: Duration::from_secs(15),
            limit: Duration::from_secs(900),
            instance_type: "m5.xlarge",
            per_eni: 14,
            first_interface_index: 1,
        }
    }

    /// The real processes run in real time: 120 nodes in three waves, one new ENI each at
    /// first, a second one when the demand rises, shorter waits.
    pub fn real() -> Self {
        Self {
            waves: (0..3)
                .map(|i| Wave {
                    at: Duration::from_secs(6 * i),
                    nodes: 40,
                })
                .collect(),
            pods: [2, 10, 1],
            rise_at: Duration::from_secs(25),
            fall_at: Duration::from_secs(50),
            throttle: (Duration::from_secs(8), Duration::from_secs(16)),
            release_delay: Duration::from_secs(5),
            rescan: Duration::from_secs(5),
            limit: Duration::from_secs(600),
            ..Self::full()
        }
    }

    /// The test's run: the same story at 30 nodes and shorter spans.
    pub fn quick() -> Self {
        Self {
            waves: (0..3)
                .map(|i| Wave {
                    at: Duration::from_secs(5 * i),
                    nodes: 10,
                })
                .collect(),
            rise_at: Duration::from_secs(40),
            fall_at: Duration::from_secs(80),
            throttle: (Duration::from_secs(5), Duration::from_secs(15)),
            release_delay: Duration::from_secs(10),
            rescan: Duration::from_secs(10),
            limit: Duration::from_secs(600),
            ..Self::full()
        }
    }

    pub fn nodes(&self) -> usize {
        self.waves.iter().map(|w| w.nodes).sum()
    }

    /// Node `i`'s name and agent generation, in join order.
    pub fn node(&self, i: usize) -> (String, Generation) {
        let multi =
            self.multi_pool_every > 0 && i % self.multi_pool_every == self.multi_pool_every - 1;
        let g = if multi {
            Generation::MultiPool
        } else {
            Generation::Classic
        };
        (format!("node-{i:03}"), g)
    }

    /// Nodes that have joined by `t`.
    pub fn joined_by(&self, t: Duration) -> usize {
        self.waves
            .iter()
            .filter(|w| w.at <= t)
            .map(|w| w.nodes)
            .sum()
    }

    /// Pods every node runs at `t`.
    pub fn pods_at(&self, t: Duration) -> usize {
        if t >= self.fall_at {
            self.pods[2]
        } else if t >= self.rise_at {
            self.pods[1]
        } else {
            self.pods[0]
        }
    }

    pub fn throttled_at(&self, t: Duration) -> bool {
        self.throttle.0 <= t && t < self.throttle.1
    }

    /// A short name of what happens at `t`.
    pub fn phase_at(&self, t: Duration) -> String {
        if self.throttled_at(t) {
            return format!(
                "throttled: another caller emptied the buckets, takes {:.0} % of refill",
                self.throttle_share * 100.0
            );
        }
        if t >= self.fall_at {
            return format!("demand falls to {} pods: release handshake", self.pods[2]);
        }
        if t >= self.rise_at {
            return format!("demand rises to {} pods per node", self.pods[1]);
        }
        let waves = self.waves.iter().filter(|w| w.at <= t).count();
        format!("wave {waves} of {} joined", self.waves.len())
    }

    /// New ENIs a node needs before every endpoint of `pods` pods has an address (the
    /// pre-allocation beyond them is not needed to be served).
    pub fn enis_to_serve(&self, pods: usize) -> usize {
        endpoints(pods).div_ceil(self.per_eni.max(1))
    }

    /// The rate-limit bound of nodes served at `t`: nodes whose ENIs the account's buckets
    /// (AWS's published rates, as `scenario::burst_bound`: one create, attach and modify per
    /// new ENI) could have provided, one chain of latencies (`chain`) earlier. After the demand
    /// rises, the extra ENIs every node needs come from what the buckets hold at the rise (at
    /// most their burst) and their refill since. Ignores the throttled window (the bound is
    /// the account's own capacity).
    pub fn bound_served(&self, t: Duration, chain: Duration) -> usize {
        let Some(at) = t.checked_sub(chain) else {
            return 0;
        };
        let aws = GateConfig {
            rate_fraction: 1.0,
            ..GateConfig::aws_defaults()
        };
        // New ENIs the strictest of the buckets allows in `secs` from full.
        let capacity = |secs: f64| {
            [
                Operation::CreateNetworkInterface,
                Operation::AttachNetworkInterface,
                Operation::ModifyNetworkInterfaceAttribute,
            ]
            .iter()
            .map(|op| {
                let (burst, rate) = aws.bucket_limits(op.bucket());
                f64::from(burst) + rate * secs
            })
            .fold(f64::INFINITY, f64::min)
        };
        let nodes_with = |enis: f64, each: usize| {
            if each == 0 {
                usize::MAX
            } else {
                (enis / each as f64).floor() as usize
            }
        };
        let each = self.enis_to_serve(self.pods_at(at));
        let mut bound = self
            .joined_by(at)
            .min(nodes_with(capacity(at.as_secs_f64()), each));
        if at >= self.rise_at && at < self.fall_at {
            let extra = each.saturating_sub(self.enis_to_serve(self.pods[0]));
            let since = (at - self.rise_at).as_secs_f64();
            bound = bound.min(nodes_with(capacity(since), extra));
        }
        bound
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waves_pods_and_generations_follow_the_script() {
        let p = Plan::full();
        assert_eq!(p.nodes(), 240);
        assert_eq!(p.joined_by(Duration::from_secs(0)), 60);
        assert_eq!(p.joined_by(Duration::from_secs(59)), 180);
        assert_eq!(p.pods_at(Duration::ZERO), 6);
        assert_eq!(p.pods_at(p.rise_at), 16);
        assert_eq!(p.pods_at(p.fall_at), 2);
        let multi = (0..p.nodes())
            .filter(|i| p.node(*i).1 == Generation::MultiPool)
            .count();
        assert_eq!(multi, 80);
        assert_eq!(p.node(2), ("node-002".into(), Generation::MultiPool));
        assert!(p.throttled_at(Duration::from_secs(30)));
        assert!(!p.throttled_at(Duration::from_secs(50)));
        assert!(p.phase_at(Duration::from_secs(35)).starts_with("throttled"));
        assert_eq!(p.phase_at(Duration::from_secs(21)), "wave 2 of 4 joined");
    }

    #[test]
    fn enis_to_serve_cover_the_endpoints() {
        let p = Plan::full();
        // 6 pods + router + health: one ENI of 14; 16 pods: two.
        assert_eq!(p.enis_to_serve(6), 1);
        assert_eq!(p.enis_to_serve(12), 1);
        assert_eq!(p.enis_to_serve(16), 2);
    }

    #[test]
    fn the_bound_follows_the_waves_then_the_buckets_after_the_rise() {
        let p = Plan::full();
        let chain = Duration::from_secs(1);
        let s = Duration::from_secs;
        assert_eq!(
            p.bound_served(Duration::ZERO, chain),
            0,
            "nothing before one chain"
        );
        // One ENI each: the first wave's 60 attaches exceed the general bucket's burst of 50,
        // which refills at 5/s.
        assert_eq!(p.bound_served(s(1), chain), 50);
        assert_eq!(p.bound_served(s(3), chain), 60);
        assert_eq!(p.bound_served(s(61), chain), 240);
        // The rise: every node needs a second ENI; the bucket holds at most 50 then.
        let rise = p.rise_at + chain;
        assert_eq!(p.bound_served(rise, chain), 50);
        assert_eq!(p.bound_served(rise + s(10), chain), 100);
        assert_eq!(p.bound_served(rise + s(60), chain), 240);
        // The fall: one ENI serves every node again.
        assert_eq!(p.bound_served(p.fall_at + chain, chain), 240);
    }
}
