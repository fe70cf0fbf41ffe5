//! Step 2b (between lifecycle and plan): the node's static IP (`spec.ipam.static-ip-tags`),
//! before anything is allocated, as Cilium does (`ipam::static_ip` says what is decided and
//! where it follows Cilium). Calls go through the gate like every other EC2 call.
//!
//! Idempotence: every attempt starts with `DescribeAddresses` and adopts an address already
//! associated with the node's primary ENI, so a lost answer, a lost status write or a restart
//! never associates a second address. `AssociateAddress` is never repeated blindly (the gate
//! does not repeat it after a lost answer): the next pass describes first.

use std::net::Ipv4Addr;

use serde_json::json;
use tracing::info;

use crate::crd::CiliumNode;
use crate::ec2::{Ec2, Ec2Error};
use crate::ipam::admission::AdmittedNode;
use crate::ipam::static_ip::{self, Decision};
use crate::ipam::{Action, ChangeSet, Problem, ProblemReason, Subresource, Write, writeback};
use crate::k8s::sink::{NodeRef, NodeSink, SinkError};
use crate::reconcile::events;
use crate::reconcile::queue::Outcome;
use crate::reconcile::shared::Shared;

use super::plan::Planned;
use super::said::Said;
use super::{FAILED, Step, Verdict};

/// What the step leaves for the rest of the pass.
#[derive(Debug, Default)]
pub(super) struct StaticIp {
    /// No static IP yet: nothing is allocated this pass, the node reports this problem and
    /// retries with backoff.
    pub blocked: Option<Problem>,
}

impl StaticIp {
    /// Cilium allocates nothing before the static IP is assigned: the pass plans no EC2 action
    /// and reports why.
    pub(super) fn hold(&self, planned: &mut Planned) {
        if let Some(p) = &self.blocked {
            planned.action = Action::None;
            planned.plan.problem = Some(p.clone());
        }
    }

    /// A blocked node is retried with the queue's backoff.
    pub(super) fn verdict(&self, verdict: Verdict) -> Verdict {
        match self.blocked {
            Some(_) => (Outcome::Failed, verdict.1),
            None => verdict,
        }
    }
}

/// Make sure the node has its static IP when it asks for one; returns the node (with the
/// address published when this step published it).
pub(super) async fn ensure<E: Ec2, S: NodeSink>(
    inner: &Shared<E, S>,
    name: &str,
    mut node: AdmittedNode,
) -> Step<(AdmittedNode, StaticIp)> {
    let Some(tags) = static_ip::wanted(&node).cloned() else {
        return Ok((node, StaticIp::default()));
    };
    let primary = {
        let cache = inner.cache.read().expect("cache");
        let instance = node.spec.instance_id.as_str();
        cache
            .instance(instance)
            .and_then(|e| static_ip::primary_eni(instance, &e.enis))
            .map(|e| (e.id.clone(), e.primary_ip, e.interface_type.clone()))
    };
    // The instance is not known yet: the plan step asks for it; the static IP comes next pass.
    let Some((eni_id, private_ip, kind)) = primary else {
        return Ok((node, StaticIp::default()));
    };
    // Never on an EFA interface (§5.4): a node whose primary ENI is one says so.
    if kind != crate::ec2::InterfaceType::Interface {
        let message = format!(
            "the primary ENI {eni_id} is an `{}` interface; a static IP goes on an ENA \
             `interface` only",
            kind.as_str()
        );
        return Ok((node, blocked(ProblemReason::NoStaticIp, message)));
    }
    let (key, value) = inner.config.ipam.static_ip_required_tag();
    let required = (key.as_str(), value.as_str());
    match assign(inner, &tags, &eni_id, private_ip, required).await {
        Ok(Assigned::Ip(ip)) => {
            info!(node = name, %ip, eni = %eni_id, "static IP assigned");
            let published = publish(inner, name, &node, ip).await?;
            node.replace(published);
            Ok((node, StaticIp::default()))
        }
        Ok(Assigned::NoneFree) => Ok((
            node,
            blocked(
                ProblemReason::NoStaticIp,
                static_ip::none_free_message(&tags),
            ),
        )),
        Ok(Assigned::NotAllowed(refused)) => Ok((
            node,
            blocked(
                ProblemReason::StaticIpNotAllowed,
                static_ip::not_allowed_message(&tags, required, &refused),
            ),
        )),
        Err(e) => {
            events::count_ec2_error(&inner.metrics, &e);
            Ok((node, blocked(ProblemReason::Ec2Error, e.to_string())))
        }
    }
}

fn blocked(reason: ProblemReason, message: String) -> StaticIp {
    StaticIp {
        blocked: Some(Problem { reason, message }),
    }
}

/// What an attempt ended with.
enum Assigned {
    Ip(Ipv4Addr),
    /// No free address carries the tags.
    NoneFree,
    /// The only free ones lack the required tag (their allocation IDs).
    NotAllowed(Vec<String>),
}

/// Describe (the fact), decide, then associate (the executor's action).
async fn assign<E: Ec2, S: NodeSink>(
    inner: &Shared<E, S>,
    tags: &crate::ec2::Tags,
    eni_id: &str,
    private_ip: Ipv4Addr,
    required: static_ip::RequiredTag<'_>,
) -> Result<Assigned, Ec2Error> {
    let addresses = inner.ec2.describe_addresses(tags).await?;
    let candidates = match static_ip::decide(&addresses, eni_id, required) {
        Decision::Adopt(ip) => return Ok(Assigned::Ip(ip)),
        Decision::NoneFree => return Ok(Assigned::NoneFree),
        Decision::NotAllowed(refused) => return Ok(Assigned::NotAllowed(refused)),
        Decision::Try(c) => c,
    };
    let associated = inner
        .executor
        .associate_static(&candidates, eni_id, private_ip)
        .await?;
    Ok(associated.map_or(Assigned::NoneFree, Assigned::Ip))
}

/// Write `status.ipam.assigned-static-ip` (the agent waits for it).
async fn publish<E: Ec2, S: NodeSink>(
    inner: &Shared<E, S>,
    name: &str,
    node: &CiliumNode,
    ip: Ipv4Addr,
) -> Step<CiliumNode> {
    let changes = ChangeSet {
        writes: vec![Write {
            subresource: Subresource::Status,
            patch: json!({"status": {"ipam": {"assigned-static-ip": ip.to_string()}}}),
            needs_resource_version: false,
        }],
    };
    let ticket = inner.ticket(name);
    match inner.sink.apply(&NodeRef::of(node), &changes).await {
        Ok(Some(written)) => {
            inner.store(name, &written, ticket);
            Ok(written)
        }
        Ok(None) => Ok(writeback::apply(node, &changes)),
        Err(SinkError::NotFound) => Err(super::DONE),
        Err(SinkError::Conflict(fresh)) => Err(inner.conflict(name, fresh, ticket)),
        // The next pass describes and adopts the address: nothing is associated twice.
        Err(_) => Err(FAILED),
    }
}

/// The node is gone: take its static IP off its ENIs (disassociate, never release: the
/// address is the user's, for the next node that carries the tags). The node's tags come from
/// its last stored version, its ENIs from the cache (the instance is forgotten after this).
/// Only addresses carrying the required tag: we associated no other, and the IAM policy
/// refuses the others.
pub(super) async fn disassociate<E: Ec2, S: NodeSink>(
    inner: &Shared<E, S>,
    name: &str,
    instance: &str,
    said: &mut Said,
) -> Result<(), Ec2Error> {
    let tags = inner
        .with_slot(name, |s| {
            s.node
                .as_ref()
                .map(|n| n.node().spec.ipam.static_ip_tags.clone())
        })
        .flatten()
        .unwrap_or_default();
    if tags.is_empty() {
        return Ok(());
    }
    let enis: Vec<String> = {
        let cache = inner.cache.read().expect("cache");
        cache
            .instance(instance)
            .map(|e| e.enis.iter().map(|e| e.id.clone()).collect())
            .unwrap_or_default()
    };
    let (key, value) = inner.config.ipam.static_ip_required_tag();
    let result = async {
        let addresses = inner.ec2.describe_addresses(&tags).await?;
        let on_node = associated_with(&addresses, &enis, (&key, &value));
        inner.executor.disassociate_static(&on_node).await
    };
    match result.await {
        Ok(0) => Ok(()),
        Ok(n) => {
            let message = format!("disassociated {n} static IP(s) of {instance}");
            info!(node = name, "{message}");
            said.event(events::EventReason::StaticIpReleased, message);
            Ok(())
        }
        Err(e) => Err(e),
    }
}

/// The associations of addresses carrying the required tag on one of `enis`.
fn associated_with(
    addresses: &[crate::ec2::Address],
    enis: &[String],
    required: static_ip::RequiredTag<'_>,
) -> Vec<String> {
    addresses
        .iter()
        .filter(|a| static_ip::allowed(a, required))
        .filter(|a| {
            a.network_interface_id
                .as_ref()
                .is_some_and(|eni| enis.contains(eni))
        })
        .filter_map(|a| a.association_id.clone())
        .collect()
}
