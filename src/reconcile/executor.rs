//! Executes the engine's [`Action`] through the (gated) EC2 client and applies each result to
//! the cache at once, so the next plan never acts on a state we just changed.
//!
//! Cost: one mutating call per top-up; at most three per new ENI (create with addresses inline,
//! attach, delete-on-termination). Extra calls happen only on the failure paths (fallbacks,
//! device-index conflicts, clean-up, a describe after a call that got no answer).
//!
//! A new ENI that could not be attached because of throttling or a missing answer is kept (the
//! cache holds it as a leftover of its instance) and attached by the next pass; only an attach
//! EC2 refused deletes it. Deleting on throttling burned the ClientToken: EC2 answers a reused
//! token with the deleted ENI, so the node was stuck for good.

use std::sync::{Arc, RwLock};

use tracing::{info, warn};

use crate::ec2::{AddressRequest, Assigned, Ec2, Ec2Error, ErrorKind};
use crate::ipam::{Action, Assign, Release};

use crate::cache::Ec2Cache;
use crate::clock::now;
use crate::reconcile::metrics::RuntimeMetrics;

mod create;
mod gone;

/// A success worth an Event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Success {
    EniCreated {
        eni_id: String,
        addresses: u32,
    },
    /// An ENI of ours left unattached earlier (throttled attach, crash) was attached.
    EniAttached {
        eni_id: String,
        addresses: u32,
    },
    IpsAllocated {
        eni_id: String,
        addresses: u32,
    },
    IpsReleased {
        eni_id: String,
        addresses: u32,
    },
}

/// What one action did.
#[derive(Clone, Debug, Default)]
pub struct ExecOutcome {
    /// EC2 changed (the cache was updated accordingly).
    pub changed: bool,
    pub success: Option<Success>,
    pub error: Option<Ec2Error>,
    /// EC2 said the instance is not running: hold the node for a minute.
    pub not_running: bool,
    /// The release that was carried out (for the node's release bookkeeping).
    pub released: Option<Release>,
    /// The node's current `ClientToken` is spent: the next create must use a fresh one
    /// (`NodeMemory::retire_eni_token`).
    pub retire_token: bool,
    /// Worth a Warning Event although the action went through (e.g. a /28 fallback).
    pub warning: Option<String>,
}

impl ExecOutcome {
    fn failed(e: Ec2Error) -> Self {
        Self {
            error: Some(e),
            ..Self::default()
        }
    }

    /// EC2 changed for the node: `success` was done.
    fn succeeded(success: Success) -> Self {
        Self {
            changed: true,
            success: Some(success),
            ..Self::default()
        }
    }
}

/// An unassign that failed although its addresses may be gone: the gate retried a call whose
/// answer was lost and EC2 now says they are not assigned, or the last attempt failed without a
/// clear answer (a timeout or a 5xx can hide a call that took effect, and so can any earlier
/// attempt the gate retried: a lost answer, then a 5xx, in `make dst` seed 434). The agent
/// already gave these addresses up, so counting them released is safe (a later refresh brings
/// back any EC2 still has); keeping them would hand addresses EC2 may no longer have back to
/// the agent. Found by `make dst` (seed 1).
fn released_anyway(e: &Ec2Error) -> bool {
    (e.code == "InvalidParameterValue" && e.message.contains("not assigned"))
        || e.kind == ErrorKind::Transient
}

pub struct Executor<E> {
    ec2: Arc<E>,
    cache: Arc<RwLock<Ec2Cache>>,
    metrics: RuntimeMetrics,
}

impl<E: Ec2> Executor<E> {
    pub fn new(ec2: Arc<E>, cache: Arc<RwLock<Ec2Cache>>) -> Self {
        Self {
            ec2,
            cache,
            metrics: RuntimeMetrics::default(),
        }
    }

    /// Count ENIs and addresses into these metrics (default: unregistered ones).
    pub fn with_metrics(mut self, metrics: RuntimeMetrics) -> Self {
        self.metrics = metrics;
        self
    }

    fn cache(&self) -> std::sync::RwLockWriteGuard<'_, Ec2Cache> {
        self.cache.write().expect("cache lock")
    }

    pub async fn execute(&self, action: &Action) -> ExecOutcome {
        use crate::reconcile::metrics_cilium::{ALLOCATE_IP, CREATE_INTERFACE, RELEASE_IP};
        let start = now();
        let (kind, out) = match action {
            Action::None => return ExecOutcome::default(),
            Action::Assign(a) => (ALLOCATE_IP, self.assign(a).await),
            Action::CreateEni(c) => (CREATE_INTERFACE, self.create(c).await),
            Action::Release(r) => (RELEASE_IP, self.release(r).await),
        };
        // Cilium's allocation/release latency (`pkg/ipam/node.go`: AllocationAttempt and
        // ReleaseAttempt around each EC2 action), labelled with the ENI's subnet.
        let eni = match (action, &out.success) {
            (Action::Assign(a), _) => Some(a.eni_id.as_str()),
            (Action::Release(r), _) => Some(r.eni_id.as_str()),
            (_, Some(Success::EniCreated { eni_id, .. } | Success::EniAttached { eni_id, .. })) => {
                Some(eni_id.as_str())
            }
            _ => None,
        };
        let subnet = match (action, eni) {
            (Action::Assign(a), _) => a.subnet_id.clone(),
            (_, Some(id)) => self.subnet_of(id),
            _ => String::new(),
        };
        let seconds = now().saturating_duration_since(start).as_secs_f64();
        let ok = out.error.is_none();
        self.metrics.cilium.action(kind, ok, &subnet, seconds);
        out
    }

    /// The subnet of an ENI the cache knows ("" otherwise).
    fn subnet_of(&self, eni_id: &str) -> String {
        self.cache
            .read()
            .expect("cache lock")
            .instances
            .values()
            .flat_map(|e| &e.enis)
            .find(|n| n.id == eni_id)
            .map(|n| n.subnet_id.clone())
            .unwrap_or_default()
    }

    async fn assign(&self, a: &Assign) -> ExecOutcome {
        let mut request = a.request;
        let mut warning = None;
        let mut result = self.assign_checked(&a.eni_id, request).await;
        let no_prefix_granted = match &result {
            Err(e) => e.kind == ErrorKind::InsufficientCidrBlocks,
            // EC2 accepted a /28 request but granted none (emulators ignore prefixes): treat it
            // like a subnet without a free /28 instead of asking again on every pass.
            Ok(assigned) => {
                let new = self.cache().merge_assigned(&a.eni_id, assigned, now());
                matches!(request, AddressRequest::Prefixes(n) if n > 0) && new == 0
            }
        };
        if no_prefix_granted {
            self.cache().set_prefix_cooldown(&a.subnet_id, now());
            warn!(eni = %a.eni_id, subnet = %a.subnet_id, "no /28 prefix granted, falling back to single addresses");
            warning = Some(format!(
                "no /28 prefix could be assigned on {} in subnet {}; using single addresses there for a while",
                a.eni_id, a.subnet_id
            ));
            if let Some(n) = a.fallback_ips {
                request = AddressRequest::Ips(n);
                result = self.assign_checked(&a.eni_id, request).await;
                if let Ok(assigned) = &result {
                    self.cache().merge_assigned(&a.eni_id, assigned, now());
                }
            } else if result.is_ok() {
                return ExecOutcome {
                    changed: true,
                    warning,
                    ..ExecOutcome::default()
                };
            }
        }
        match result {
            Ok(_) => {
                self.metrics.allocated(&a.subnet_id, request.addresses());
                ExecOutcome {
                    warning,
                    ..ExecOutcome::succeeded(Success::IpsAllocated {
                        eni_id: a.eni_id.clone(),
                        addresses: request.addresses(),
                    })
                }
            }
            Err(e) => ExecOutcome::failed(e),
        }
    }

    /// Assign; after a failure without an answer (timeout, 5xx) decide from what EC2 shows:
    /// the call carries no token, so it may have taken effect and is not repeated blindly (the
    /// gate does not retry it either). Addresses on the ENI the cache does not know yet are the
    /// call's. (Describes may lag behind the call; then the next pass asks again.) Not those we
    /// unassigned within the describe lag: a lagging describe still shows them, and taking them
    /// back put addresses EC2 no longer had into the pool, where pods got them (`make dst`
    /// seeds 115, 269, 344). Should EC2 have handed one out again, the next refresh finds it.
    async fn assign_checked(
        &self,
        eni_id: &str,
        request: AddressRequest,
    ) -> Result<Assigned, Ec2Error> {
        let e = match self.ec2.assign_private_ip_addresses(eni_id, request).await {
            Err(e) if e.kind == ErrorKind::Transient => e,
            other => return other,
        };
        let started = now();
        let Some(seen) = self.describe_eni(eni_id).await else {
            return Err(e);
        };
        let (known, (gone_ips, gone_prefixes)) = {
            let cache = self.cache.read().expect("cache lock");
            let known = cache.eni(eni_id).cloned();
            (known, cache.recently_unassigned(eni_id, started))
        };
        let (known_ips, known_prefixes) = known
            .map(|k| (k.secondary_ips, k.prefixes))
            .unwrap_or_default();
        let new = Assigned {
            ips: seen
                .secondary_ips
                .into_iter()
                .filter(|ip| !known_ips.contains(ip) && !gone_ips.contains(ip))
                .collect(),
            prefixes: seen
                .prefixes
                .into_iter()
                .filter(|p| !known_prefixes.contains(p) && !gone_prefixes.contains(p))
                .collect(),
        };
        if new.ips.is_empty() && new.prefixes.is_empty() {
            return Err(e);
        }
        info!(eni = %eni_id, error = %e, "the assign got no answer but took effect");
        Ok(new)
    }

    /// Retry delete-on-termination flags that failed earlier for this instance.
    pub async fn retry_pending(&self, instance_id: &str) -> Option<Ec2Error> {
        let pending: Vec<(String, String)> = self
            .cache
            .read()
            .expect("cache lock")
            .instance(instance_id)
            .map(|e| {
                e.pending_delete_on_termination
                    .iter()
                    .map(|(a, b)| (a.clone(), b.clone()))
                    .collect()
            })
            .unwrap_or_default();
        for (eni, attachment) in pending {
            match self
                .ec2
                .set_delete_on_termination(&eni, &attachment, true)
                .await
            {
                Ok(()) => self
                    .cache()
                    .set_delete_on_termination(&eni, &attachment, true),
                Err(e) if e.is_not_found() => {
                    self.cache()
                        .set_delete_on_termination(&eni, &attachment, true)
                }
                Err(e) => return Some(e),
            }
        }
        None
    }

    async fn release(&self, r: &Release) -> ExecOutcome {
        // For the per-subnet counters; releases are rare (EC2-rate-limited), so a scan is fine.
        let subnet_id = self
            .cache
            .read()
            .expect("cache lock")
            .instances
            .values()
            .flat_map(|e| &e.enis)
            .find(|n| n.id == r.eni_id)
            .map(|n| n.subnet_id.clone())
            .unwrap_or_default();
        if !r.prefixes.is_empty() {
            if let Err(e) = self
                .ec2
                .unassign_private_ip_addresses(&r.eni_id, &[], &r.prefixes)
                .await
                && !released_anyway(&e)
            {
                return ExecOutcome::failed(e);
            }
            self.cache()
                .remove_addresses(&r.eni_id, &[], &r.prefixes, now());
            self.metrics
                .released(&subnet_id, r.prefixes.len() as u32 * 16);
        }
        let ips: Vec<_> = r
            .ips
            .iter()
            .copied()
            .filter(|ip| !r.prefixes.iter().any(|p| p.contains(ip)))
            .collect();
        let mut done = Release {
            eni_id: r.eni_id.clone(),
            ips: Vec::new(),
            prefixes: r.prefixes.clone(),
        };
        if !ips.is_empty() {
            if let Err(e) = self
                .ec2
                .unassign_private_ip_addresses(&r.eni_id, &ips, &[])
                .await
                && !released_anyway(&e)
            {
                let changed = !done.prefixes.is_empty();
                return ExecOutcome {
                    changed,
                    error: Some(e),
                    released: changed.then_some(done),
                    ..ExecOutcome::default()
                };
            }
            self.cache().remove_addresses(&r.eni_id, &ips, &[], now());
            self.metrics.released(&subnet_id, ips.len() as u32);
        }
        // Addresses covered by the released prefixes are released with them.
        done.ips = r.ips.clone();
        let addresses = (ips.len() + r.prefixes.len() * 16) as u32;
        ExecOutcome {
            released: Some(done),
            ..ExecOutcome::succeeded(Success::IpsReleased {
                eni_id: r.eni_id.clone(),
                addresses,
            })
        }
    }
}
