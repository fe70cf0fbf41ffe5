//! The demo's figures: a pure model fed by events (a node joined, what its agent saw, the EC2
//! counters, the phase), read by the view, the summary and the plot. No I/O, no clock: every
//! event carries its time in seconds from the start.

use std::collections::BTreeMap;

use testkit::agent::Generation;

/// Something the driver observed.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// A node's CiliumNode was created (its agent starts).
    Joined {
        node: String,
        generation: Generation,
    },
    /// The agent's pods changed target (demand rises or falls): its endpoints wait again.
    Demand { node: String },
    /// One look of a node's agent at its CiliumNode.
    Looked {
        node: String,
        /// Endpoints that found no address.
        unsatisfied: usize,
        /// Addresses on the node's ENIs (`status.eni.enis`), and its ENIs.
        addresses: usize,
        enis: usize,
        /// `ready-for-release` answers the agent sent in this look (the handshake).
        ready_answers: u64,
    },
    /// The account's EC2 counters so far, per action: (calls, throttled answers).
    Ec2(BTreeMap<String, (u64, u64)>),
    /// What the script does now.
    Phase(String),
}

/// One node as the figures see it.
#[derive(Clone, Debug, PartialEq)]
struct Node {
    generation: Generation,
    /// Since when its endpoints wait for addresses (`None`: served).
    waiting_since: Option<f64>,
    addresses: usize,
    enis: usize,
}

/// Everything the view shows.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Figures {
    /// Seconds since the start, of the latest event.
    pub now: f64,
    nodes: BTreeMap<String, Node>,
    pub ec2: BTreeMap<String, (u64, u64)>,
    pub ready_answers: u64,
    pub phase: String,
    /// The longest any node waited until served: (node, seconds).
    pub slowest: Option<(String, f64)>,
    /// (seconds, nodes served) at each `sample`.
    pub served_curve: Vec<(f64, f64)>,
}

impl Figures {
    pub fn apply(&mut self, at: f64, ev: Event) {
        self.now = self.now.max(at);
        match ev {
            Event::Joined { node, generation } => {
                self.nodes.insert(
                    node,
                    Node {
                        generation,
                        waiting_since: Some(at),
                        addresses: 0,
                        enis: 0,
                    },
                );
            }
            Event::Demand { node } => {
                if let Some(n) = self.nodes.get_mut(&node) {
                    n.waiting_since.get_or_insert(at);
                }
            }
            Event::Looked {
                node,
                unsatisfied,
                addresses,
                enis,
                ready_answers,
            } => {
                self.ready_answers += ready_answers;
                let Some(n) = self.nodes.get_mut(&node) else {
                    return;
                };
                n.addresses = addresses;
                n.enis = enis;
                if unsatisfied > 0 {
                    n.waiting_since.get_or_insert(at);
                } else if let Some(since) = n.waiting_since.take() {
                    let waited = at - since;
                    if self.slowest.as_ref().is_none_or(|(_, s)| waited > *s) {
                        self.slowest = Some((node, waited));
                    }
                }
            }
            Event::Ec2(calls) => self.ec2 = calls,
            Event::Phase(p) => self.phase = p,
        }
    }

    /// Record a point of the served curve at the current time.
    pub fn sample(&mut self) {
        let served = self.served() as f64;
        self.served_curve.push((self.now, served));
    }

    pub fn joined(&self) -> usize {
        self.nodes.len()
    }

    pub fn joined_of(&self, g: Generation) -> usize {
        self.nodes.values().filter(|n| n.generation == g).count()
    }

    pub fn served(&self) -> usize {
        self.nodes
            .values()
            .filter(|n| n.waiting_since.is_none())
            .count()
    }

    pub fn waiting(&self) -> usize {
        self.joined() - self.served()
    }

    pub fn addresses(&self) -> usize {
        self.nodes.values().map(|n| n.addresses).sum()
    }

    pub fn enis(&self) -> usize {
        self.nodes.values().map(|n| n.enis).sum()
    }

    pub fn calls(&self) -> u64 {
        self.ec2.values().map(|c| c.0).sum()
    }

    pub fn calls_of(&self, action: &str) -> u64 {
        self.ec2.get(action).map_or(0, |c| c.0)
    }

    pub fn throttled(&self) -> u64 {
        self.ec2.values().map(|c| c.1).sum()
    }

    /// The node waiting longest right now: (node, seconds).
    pub fn longest_waiting(&self) -> Option<(&str, f64)> {
        self.nodes
            .iter()
            .filter_map(|(k, n)| Some((k.as_str(), self.now - n.waiting_since?)))
            .max_by(|a, b| a.1.total_cmp(&b.1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn looked(node: &str, unsatisfied: usize, addresses: usize, ready: u64) -> Event {
        Event::Looked {
            node: node.into(),
            unsatisfied,
            addresses,
            enis: 2,
            ready_answers: ready,
        }
    }

    #[test]
    fn nodes_wait_from_their_join_or_demand_until_their_agent_is_satisfied() {
        let mut f = Figures::default();
        for n in ["a", "b"] {
            f.apply(
                0.0,
                Event::Joined {
                    node: n.into(),
                    generation: Generation::Classic,
                },
            );
        }
        f.apply(
            1.0,
            Event::Joined {
                node: "m".into(),
                generation: Generation::MultiPool,
            },
        );
        assert_eq!((f.joined(), f.served(), f.waiting()), (3, 0, 3));
        assert_eq!(f.joined_of(Generation::MultiPool), 1);
        f.apply(4.0, looked("a", 0, 16, 0));
        f.apply(5.0, looked("b", 3, 8, 0));
        f.apply(9.0, looked("m", 0, 16, 0));
        assert_eq!(
            (f.served(), f.waiting(), f.addresses(), f.enis()),
            (2, 1, 40, 6)
        );
        assert_eq!(f.slowest, Some(("m".into(), 8.0)));
        assert_eq!(f.longest_waiting(), Some(("b", 9.0)));
        f.sample();
        // Demand rises on a: it waits again until its agent is satisfied.
        f.apply(10.0, Event::Demand { node: "a".into() });
        f.apply(12.0, looked("b", 0, 16, 0));
        assert_eq!(f.slowest, Some(("b".into(), 12.0)));
        f.sample();
        assert_eq!(f.served_curve, vec![(9.0, 2.0), (12.0, 2.0)]);
        f.apply(13.0, looked("a", 0, 30, 4));
        assert_eq!((f.served(), f.ready_answers), (3, 4));
        assert_eq!(f.longest_waiting(), None);
    }

    #[test]
    fn ec2_counters_are_the_latest_reading() {
        let mut f = Figures::default();
        f.apply(
            1.0,
            Event::Ec2(BTreeMap::from([
                ("CreateNetworkInterface".into(), (10, 2)),
                ("DescribeNetworkInterfaces".into(), (3, 0)),
            ])),
        );
        f.apply(
            2.0,
            Event::Ec2(BTreeMap::from([("CreateNetworkInterface".into(), (12, 3))])),
        );
        assert_eq!((f.calls(), f.throttled()), (12, 3));
        assert_eq!(f.calls_of("CreateNetworkInterface"), 12);
        assert_eq!(f.calls_of("AttachNetworkInterface"), 0);
        f.apply(2.0, Event::Phase("wave 1".into()));
        assert_eq!(f.phase, "wave 1");
    }
}
