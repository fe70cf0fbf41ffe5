//! When a leadership's first full EC2 listing starts (§14). Pure: the loop reports what it
//! saw and asks [`FirstListing::due`].
//!
//! A full listing without a VPC lists every ENI, subnet and security group of the account's
//! Region: a failover would then take as long as the account is large, not the cluster. So the
//! first listing waits until the managed nodes' VPC is known: `--vpc-id`, or the first describe
//! of the instances the CiliumNodes name (their ENIs say the VPC; the refresher scopes by
//! [`crate::cache::Ec2Cache::managed_vpcs`] as every later listing does). It waits for nothing
//! else: with no node to describe it starts once the CiliumNodes are listed (an empty cluster
//! has no VPC to learn), and at [`FIRST_LISTING_WAIT`] at the latest (a driver that never says
//! its CiliumNodes are listed).

use std::time::{Duration, Instant};

/// The longest the first listing waits for the managed nodes' VPC.
pub const FIRST_LISTING_WAIT: Duration = Duration::from_secs(2);

#[derive(Debug)]
pub struct FirstListing {
    /// Started (or not to wait for anything).
    started: bool,
    /// The VPC is known (`--vpc-id`) or a describe of managed instances ended.
    scoped: bool,
    /// Every CiliumNode present at the start has been taken in.
    listed: bool,
    deadline: Instant,
}

impl FirstListing {
    /// At the start of a leadership; `vpc_given`: `--vpc-id` scopes every listing.
    pub fn new(now: Instant, vpc_given: bool) -> Self {
        Self {
            started: false,
            scoped: vpc_given,
            listed: false,
            deadline: now + FIRST_LISTING_WAIT,
        }
    }

    /// A per-instance describe ended (its instances' VPC is in the cache, or it failed and
    /// nothing better will come).
    pub fn described(&mut self) {
        self.scoped = true;
    }

    /// The CiliumNode watch's first listing is complete.
    pub fn cilium_nodes_listed(&mut self) {
        self.listed = true;
    }

    /// When to look again if not due now (`None`: started).
    pub fn deadline(&self) -> Option<Instant> {
        (!self.started).then_some(self.deadline)
    }

    /// Whether to start the first listing now (true once); `describing`: instances wait for
    /// their describe or one runs.
    pub fn due(&mut self, now: Instant, describing: bool) -> bool {
        if self.started {
            return false;
        }
        self.started = self.scoped || (self.listed && !describing) || now >= self.deadline;
        self.started
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn with_vpc_id_at_once() {
        let t = Instant::now();
        let mut f = FirstListing::new(t, true);
        assert!(f.due(t, true));
        assert!(!f.due(t, false), "once");
        assert_eq!(f.deadline(), None);
    }

    #[test]
    fn after_the_first_describe_of_the_nodes_instances() {
        let t = Instant::now();
        let mut f = FirstListing::new(t, false);
        assert!(!f.due(t, false), "nothing known yet");
        f.cilium_nodes_listed();
        assert!(!f.due(t, true), "the nodes' instances are being described");
        f.described();
        assert!(f.due(t, true));
    }

    #[test]
    fn an_empty_cluster_at_its_listing_else_at_the_deadline() {
        let t = Instant::now();
        let mut f = FirstListing::new(t, false);
        f.cilium_nodes_listed();
        assert!(f.due(t, false));
        let mut g = FirstListing::new(t, false);
        assert_eq!(g.deadline(), Some(t + FIRST_LISTING_WAIT));
        assert!(!g.due(t + FIRST_LISTING_WAIT / 2, false));
        assert!(g.due(t + FIRST_LISTING_WAIT, false));
    }
}
