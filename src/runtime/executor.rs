//! Executes the engine's [`Action`] through the (gated) EC2 client and applies each result to
//! the cache at once, so the next plan never acts on a state we just changed.
//!
//! Cost: one mutating call per top-up; at most three per new ENI (create with addresses inline,
//! attach, delete-on-termination). Extra calls happen only on the failure paths (fallbacks,
//! device-index conflicts, clean-up).

use std::sync::{Arc, RwLock};
use std::time::Instant;

use tracing::{info, warn};

use crate::ec2::{AddressRequest, Attachment, Ec2, Ec2Error, ErrorKind, NetworkInterface};
use crate::ipam::{Action, Assign, CreateEni, Release};

use super::cache::{Ec2Cache, next_free_index};
use super::metrics::{self, RuntimeMetrics};

/// Device-index conflicts are retried this many times in all.
pub const ATTACH_ATTEMPTS: usize = 5;

/// A success worth an Event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Success {
    EniCreated { eni_id: String, addresses: u32 },
    IpsAllocated { eni_id: String, addresses: u32 },
    IpsReleased { eni_id: String, addresses: u32 },
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
}

pub struct Executor<E> {
    ec2: Arc<E>,
    cache: Arc<RwLock<Ec2Cache>>,
    metrics: RuntimeMetrics,
}

fn now() -> Instant {
    tokio::time::Instant::now().into_std()
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
        match action {
            Action::None => ExecOutcome::default(),
            Action::Assign(a) => self.assign(a).await,
            Action::CreateEni(c) => self.create(c).await,
            Action::Release(r) => self.release(r).await,
        }
    }

    async fn assign(&self, a: &Assign) -> ExecOutcome {
        let mut request = a.request;
        let mut warning = None;
        let mut result = self
            .ec2
            .assign_private_ip_addresses(&a.eni_id, request)
            .await;
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
                result = self
                    .ec2
                    .assign_private_ip_addresses(&a.eni_id, request)
                    .await;
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
                    changed: true,
                    success: Some(Success::IpsAllocated {
                        eni_id: a.eni_id.clone(),
                        addresses: request.addresses(),
                    }),
                    warning,
                    ..ExecOutcome::default()
                }
            }
            Err(e) => ExecOutcome::failed(e),
        }
    }

    async fn create(&self, c: &CreateEni) -> ExecOutcome {
        let mut created: Option<(NetworkInterface, AddressRequest)> = None;
        let mut last_err = None;
        for attempt in &c.attempts {
            match self.ec2.create_network_interface(attempt).await {
                Ok(eni) => {
                    created = Some((eni, attempt.addresses));
                    break;
                }
                Err(e) if e.kind == ErrorKind::InsufficientCidrBlocks => {
                    self.cache().set_prefix_cooldown(&attempt.subnet_id, now());
                    info!(subnet = %attempt.subnet_id, "no free /28 for a new ENI, trying the next option");
                    last_err = Some(e);
                }
                Err(e) => return ExecOutcome::failed(e),
            }
        }
        let Some((eni, requested)) = created else {
            return last_err.map(ExecOutcome::failed).unwrap_or_default();
        };
        // Created, but without the /28s asked for (emulators ignore prefixes): cool the subnet
        // down so the next passes top the ENI up with single addresses instead of looping.
        let warning = (matches!(requested, AddressRequest::Prefixes(n) if n > 0)
            && eni.prefixes.is_empty())
        .then(|| {
            self.cache().set_prefix_cooldown(&eni.subnet_id, now());
            format!(
                "{} was created without the /28 prefixes requested in subnet {}; using single addresses there for a while",
                eni.id, eni.subnet_id
            )
        });
        let inline = if warning.is_some() {
            0
        } else {
            requested.addresses()
        };
        self.metrics.eni_created(&eni.subnet_id, inline);

        let mut index = c.device_index;
        let mut attach_result = Err(None);
        for _ in 0..ATTACH_ATTEMPTS {
            match self
                .ec2
                .attach_network_interface(&eni.id, &c.instance_id, index)
                .await
            {
                Ok(id) => {
                    self.metrics.enis_attached.inc();
                    attach_result = Ok(id);
                    break;
                }
                Err(e) if e.kind == ErrorKind::DeviceIndexInUse => {
                    let mut used = self
                        .cache
                        .read()
                        .expect("cache lock")
                        .used_device_indices(&c.instance_id);
                    used.insert(index);
                    index = next_free_index(&used, index);
                    attach_result = Err(Some(e));
                }
                Err(e) => {
                    attach_result = Err(Some(e));
                    break;
                }
            }
        }
        let attachment_id = match attach_result {
            Ok(id) => id,
            Err(e) => {
                // Never leave an unattached ENI behind; the GC catches it if this fails too.
                match self.ec2.delete_network_interface(&eni.id).await {
                    Ok(()) => self.metrics.eni_deleted(metrics::DELETED_ATTACH_FAILED, 1),
                    Err(del) => {
                        warn!(eni = %eni.id, error = %del, "could not delete the ENI after a failed attach")
                    }
                }
                let e = e.expect("at least one attach attempt");
                if e.kind == ErrorKind::InstanceNotRunning {
                    return ExecOutcome {
                        not_running: true,
                        ..ExecOutcome::default()
                    };
                }
                return ExecOutcome::failed(e);
            }
        };

        let eni_id = eni.id.clone();
        let attachment = Attachment {
            id: attachment_id.clone(),
            instance_id: c.instance_id.clone(),
            device_index: index,
            delete_on_termination: false,
        };
        self.cache().add_attached_eni(eni, attachment, now());
        let mut outcome = ExecOutcome {
            changed: true,
            success: Some(Success::EniCreated {
                eni_id: eni_id.clone(),
                addresses: inline,
            }),
            warning,
            ..ExecOutcome::default()
        };
        if c.delete_on_termination {
            outcome = self
                .mark_delete_on_termination(&eni_id, &attachment_id, outcome)
                .await;
        }
        outcome
    }

    /// Set delete-on-termination; on failure keep the ENI attached and retry later (an
    /// attached ENI cannot be deleted, and detaching it would take addresses from the node).
    async fn mark_delete_on_termination(
        &self,
        eni_id: &str,
        attachment_id: &str,
        mut outcome: ExecOutcome,
    ) -> ExecOutcome {
        match self
            .ec2
            .set_delete_on_termination(eni_id, attachment_id, true)
            .await
        {
            Ok(()) => self
                .cache()
                .set_delete_on_termination(eni_id, attachment_id, true),
            Err(e) => {
                warn!(eni = %eni_id, error = %e, "delete-on-termination not set; will retry");
                self.cache()
                    .set_delete_on_termination(eni_id, attachment_id, false);
                outcome.not_running = e.kind == ErrorKind::InstanceNotRunning;
            }
        }
        outcome
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
            changed: true,
            success: Some(Success::IpsReleased {
                eni_id: r.eni_id.clone(),
                addresses,
            }),
            released: Some(done),
            ..ExecOutcome::default()
        }
    }
}
