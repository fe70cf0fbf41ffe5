//! Eventual consistency of the EC2 API, off by default.
//!
//! AWS, "Eventual consistency in the Amazon EC2 API"
//! (docs.aws.amazon.com/ec2/latest/devguide/eventual-consistency.html): "the result of an API
//! command you run that affects your Amazon EC2 resources might not be immediately visible to all
//! subsequent commands", and "if you run a command to modify or describe the resource that you
//! just created, its ID might not have propagated throughout the system, and you will get an
//! error responding that the resource does not exist" (for an ENI:
//! `InvalidNetworkInterfaceID.NotFound`; the page lists the `*.NotFound` codes as the errors to
//! expect).
//!
//! The model: after each successful call that changes an ENI (create, attach, assign, unassign,
//! modify, detach, delete), `DescribeNetworkInterfaces` may go on showing the ENI as it was
//! before (not at all after a create, still there after a delete) for a random time up to the
//! configured maximum. A second change within that time keeps the older picture (it was true
//! once) and its deadline. With `refuse_unseen`, calls naming an ENI whose create is not visible
//! yet are answered `InvalidNetworkInterfaceID.NotFound` (an attach right after the create).

use std::collections::BTreeMap;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

use super::{State, eni_not_found, require_ids};
use eni_operator::ec2::Result;
use eni_operator::ec2::model::*;

/// What describes show of one ENI until `until`: `None` for an ENI whose create is not visible.
#[derive(Clone, Debug)]
struct Shown {
    until: Instant,
    eni: Option<NetworkInterface>,
}

#[derive(Debug)]
pub(crate) struct Lag {
    /// Longest time a change stays invisible; zero: off.
    max: Duration,
    refuse_unseen: bool,
    rng: StdRng,
    stale: BTreeMap<String, Shown>,
}

impl Default for Lag {
    fn default() -> Self {
        Self {
            max: Duration::ZERO,
            refuse_unseen: false,
            rng: StdRng::seed_from_u64(0),
            stale: BTreeMap::new(),
        }
    }
}

impl Lag {
    fn live(&self, id: &str, now: Instant) -> Option<&Shown> {
        self.stale.get(id).filter(|s| s.until > now)
    }

    /// `id` changed at `now`; `before` is what describes showed until then.
    fn changed(&mut self, id: &str, before: Option<NetworkInterface>, now: Instant) {
        self.stale.retain(|_, s| s.until > now);
        if self.stale.contains_key(id) {
            return;
        }
        let ms = self.rng.random_range(0..=self.max.as_millis() as u64);
        if ms > 0 {
            self.stale.insert(
                id.to_owned(),
                Shown {
                    until: now + Duration::from_millis(ms),
                    eni: before,
                },
            );
        }
    }
}

impl State {
    /// Turn eventual consistency on (`max` > 0) or off.
    pub(crate) fn set_lag(&mut self, max: Duration, refuse_unseen: bool, seed: u64) {
        self.lag = Lag {
            max,
            refuse_unseen,
            rng: StdRng::seed_from_u64(seed),
            stale: BTreeMap::new(),
        };
    }

    /// Run a call that changes the ENI `eni_id`, with eventual consistency: refused while the
    /// ENI's create is not visible, and its change shown late to describes.
    pub(crate) fn lagged<T>(
        &mut self,
        op: Operation,
        eni_id: &str,
        now: Instant,
        f: impl FnOnce(&mut Self) -> Result<T>,
    ) -> Result<T> {
        if self.lag.max.is_zero() {
            return f(self);
        }
        if self.lag.refuse_unseen && self.lag.live(eni_id, now).is_some_and(|s| s.eni.is_none()) {
            return Err(eni_not_found(op, eni_id));
        }
        let before = self.enis.get(eni_id).map(|r| r.eni.clone());
        let result = f(self);
        if result.is_ok() {
            self.lag.changed(eni_id, before, now);
        }
        result
    }

    /// A detach names the attachment, not the ENI.
    pub(crate) fn lagged_detach(
        &mut self,
        attachment_id: &str,
        now: Instant,
        f: impl FnOnce(&mut Self) -> Result<()>,
    ) -> Result<()> {
        let eni_id = self.eni_by_attachment(attachment_id);
        match eni_id {
            Some(id) => self.lagged(Operation::DetachNetworkInterface, &id, now, f),
            None => f(self),
        }
    }

    /// A create: a new ENI stays invisible for a while (a replayed client token creates nothing).
    pub(crate) fn lagged_create(
        &mut self,
        now: Instant,
        f: impl FnOnce(&mut Self) -> Result<NetworkInterface>,
    ) -> Result<NetworkInterface> {
        let count = self.enis.len();
        let result = f(self);
        if let Ok(eni) = &result
            && !self.lag.max.is_zero()
            && self.enis.len() > count
        {
            self.lag.changed(&eni.id, None, now);
        }
        result
    }

    /// `DescribeNetworkInterfaces` as eventual consistency shows it at `now`.
    pub(crate) fn describe_network_interfaces_at(
        &self,
        f: &EniFilter,
        token: Option<String>,
        now: Instant,
    ) -> Result<Page<NetworkInterface>> {
        if self.lag.max.is_zero() {
            return self.describe_network_interfaces(f, token);
        }
        let op = Operation::DescribeNetworkInterfaces;
        let mut view: BTreeMap<&str, &NetworkInterface> = self
            .enis
            .values()
            .map(|r| (r.eni.id.as_str(), &r.eni))
            .collect();
        for (id, shown) in &self.lag.stale {
            if shown.until <= now {
                continue;
            }
            match &shown.eni {
                Some(e) => view.insert(id.as_str(), e),
                None => view.remove(id.as_str()),
            };
        }
        require_ids(
            op,
            &f.ids,
            |id| view.contains_key(id),
            "InvalidNetworkInterfaceID.NotFound",
            "networkInterface",
        )?;
        let enis = view.into_values().filter(|e| {
            f.instance_ids.is_empty()
                || e.instance_id()
                    .is_some_and(|i| f.instance_ids.iter().any(|x| x == i))
        });
        self.eni_page(f, enis, token)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::every_page;
    use crate::sim::Simulator;
    use eni_operator::ec2::Ec2;
    use eni_operator::ec2::error::{ErrorKind, Resource};
    use eni_operator::ec2::model::*;

    /// One /24 subnet, one m5.large, eventual consistency of up to 5 s (seeded).
    fn world(refuse_unseen: bool) -> (Simulator, CreateEniRequest, Instance) {
        let sim = Simulator::new();
        let vpc = sim.add_vpc("10.0.0.0/16".parse().unwrap(), &[]);
        let subnet = sim.add_subnet(&vpc, "a", "10.0.0.0/24".parse().unwrap(), Tags::new());
        let sg = sim.add_security_group(&vpc, Tags::new());
        let inst = sim.run_instance("m5.large", &subnet, std::slice::from_ref(&sg));
        sim.set_eventual_consistency(Duration::from_secs(5), refuse_unseen, 3);
        let req = CreateEniRequest {
            subnet_id: subnet,
            security_groups: vec![sg],
            description: "test".into(),
            tags: Tags::new(),
            addresses: AddressRequest::Ips(2),
            client_token: "t".into(),
        };
        (sim, req, inst)
    }

    async fn described(sim: &Simulator, id: &str) -> Option<NetworkInterface> {
        let f = EniFilter::default();
        let all = every_page(|t| sim.describe_network_interfaces(&f, t)).await;
        all.into_iter().find(|e| e.id == id)
    }

    #[tokio::test(start_paused = true)]
    async fn a_new_eni_is_unknown_to_describes_and_attach_for_a_moment() {
        let (sim, req, inst) = world(true);
        let eni = sim.create_network_interface(&req).await.unwrap();
        assert!(described(&sim, &eni.id).await.is_none());
        let by_id = EniFilter {
            ids: vec![eni.id.clone()],
            ..EniFilter::default()
        };
        let e = sim
            .describe_network_interfaces(&by_id, None)
            .await
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::NotFound(Resource::NetworkInterface));
        let e = sim
            .attach_network_interface(&eni.id, &inst.id, 1)
            .await
            .unwrap_err();
        assert_eq!(e.code, "InvalidNetworkInterfaceID.NotFound");
        // The truth is there all along.
        assert!(sim.network_interface(&eni.id).is_some());
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(described(&sim, &eni.id).await, Some(eni.clone()));
        sim.attach_network_interface(&eni.id, &inst.id, 1)
            .await
            .unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn changes_show_late_and_then_for_good() {
        let (sim, req, inst) = world(false);
        let eni = sim.create_network_interface(&req).await.unwrap();
        // Without `refuse_unseen` the attach goes through while describes lag.
        sim.attach_network_interface(&eni.id, &inst.id, 1)
            .await
            .unwrap();
        tokio::time::advance(Duration::from_secs(5)).await;
        let attached = described(&sim, &eni.id).await.unwrap();
        assert!(attached.attachment.is_some());
        // An unassigned address is still shown for a moment, then gone.
        let ip = attached.secondary_ips[0];
        sim.unassign_private_ip_addresses(&eni.id, &[ip], &[])
            .await
            .unwrap();
        assert!(
            described(&sim, &eni.id)
                .await
                .unwrap()
                .secondary_ips
                .contains(&ip)
        );
        assert!(
            !sim.network_interface(&eni.id)
                .unwrap()
                .secondary_ips
                .contains(&ip)
        );
        tokio::time::advance(Duration::from_secs(5)).await;
        assert!(
            !described(&sim, &eni.id)
                .await
                .unwrap()
                .secondary_ips
                .contains(&ip)
        );
        // A deleted ENI is still listed for a moment.
        let other = sim
            .create_network_interface(&CreateEniRequest {
                client_token: "u".into(),
                ..req
            })
            .await
            .unwrap();
        tokio::time::advance(Duration::from_secs(5)).await;
        sim.delete_network_interface(&other.id).await.unwrap();
        assert!(described(&sim, &other.id).await.is_some());
        tokio::time::advance(Duration::from_secs(5)).await;
        assert!(described(&sim, &other.id).await.is_none());
    }
}
