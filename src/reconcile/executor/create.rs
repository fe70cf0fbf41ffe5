//! A new ENI: create it (or attach a fitting leftover), attach it at a free device index, set
//! delete-on-termination; each result into the cache at once. See the parent module for why a
//! throttled or unanswered attach keeps the ENI.

use std::time::Duration;

use tracing::{info, warn};

use crate::ec2::{
    AddressRequest, Attachment, Ec2, Ec2Error, EniFilter, ErrorKind, NetworkInterface, Resource,
    collect_pages,
};
use crate::ipam::CreateEni;

use crate::cache::next_free_index;
use crate::clock::now;
use crate::reconcile::metrics;

use super::{ExecOutcome, Executor, Success};

/// Device-index conflicts are retried this many times in all.
pub const ATTACH_ATTEMPTS: usize = 5;

/// Waits before attaching again an ENI EC2 just created but answers "does not exist" for: AWS
/// documents that a command naming a resource just created may answer that it does not exist
/// until its ID has propagated, and advises backing off from a couple of seconds ("Eventual
/// consistency in the Amazon EC2 API"). Giving up at once deleted nothing and created another
/// ENI on the next pass, which met the same answer. Found by `make dst`.
pub const NOT_READY_WAITS: [Duration; 4] = [
    Duration::from_secs(1),
    Duration::from_secs(2),
    Duration::from_secs(4),
    Duration::from_secs(8),
];

/// How an attach ended.
enum Attach {
    Done(String),
    /// Throttled or unanswered: the ENI stays, as a leftover of the instance.
    Kept(Ec2Error),
    /// The ENI does not exist.
    Gone(Ec2Error),
    /// EC2 refused it for good: the ENI was deleted (or, failing that, kept as a leftover).
    Refused(Ec2Error),
}

/// A leftover fits the planned ENI: the subnet and security groups of one of its attempts.
fn fits(eni: &NetworkInterface, c: &CreateEni) -> bool {
    let sorted = |g: &[String]| {
        let mut g = g.to_vec();
        g.sort();
        g
    };
    let groups = sorted(&eni.security_groups);
    c.attempts
        .iter()
        .any(|a| a.subnet_id == eni.subnet_id && sorted(&a.security_groups) == groups)
}

impl<E: Ec2> Executor<E> {
    pub(super) async fn create(&self, c: &CreateEni) -> ExecOutcome {
        // An ENI of ours left unattached for this instance is attached instead of a new one.
        if let Some(outcome) = self.attach_leftover(c).await {
            return outcome;
        }
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
                Err(e) => {
                    // The token belongs to an earlier, different request: the next pass must use
                    // a fresh one, or the node would be refused for hours.
                    let retire_token = e.kind == ErrorKind::IdempotencyMismatch;
                    return ExecOutcome {
                        retire_token,
                        ..ExecOutcome::failed(e)
                    };
                }
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
        let addresses = if warning.is_some() {
            0
        } else {
            requested.addresses()
        };
        self.metrics.eni_created(&eni.subnet_id, addresses);
        let eni_id = eni.id.clone();
        match self.attach(c, eni, true).await {
            Attach::Done(attachment_id) => {
                let outcome = ExecOutcome {
                    warning,
                    retire_token: true,
                    ..ExecOutcome::succeeded(Success::EniCreated {
                        eni_id: eni_id.clone(),
                        addresses,
                    })
                };
                self.finish_attach(c, &eni_id, &attachment_id, outcome)
                    .await
            }
            Attach::Kept(e) => ExecOutcome::failed(e),
            // The token answered with an ENI that no longer exists (deleted after an earlier
            // failed attach, or by the GC): a fresh token next pass.
            Attach::Gone(e) => ExecOutcome {
                retire_token: true,
                ..ExecOutcome::failed(e)
            },
            Attach::Refused(e) => Self::refused(e),
        }
    }

    /// Attach a leftover of this instance that fits the planned ENI (a subnet and the security
    /// groups of one of the attempts). Leftovers that do not fit (the groups changed meanwhile)
    /// are deleted: they are ours, unattached, and a fitting ENI is about to be created.
    /// `None`: no leftover was attached; go on and create one.
    async fn attach_leftover(&self, c: &CreateEni) -> Option<ExecOutcome> {
        let leftovers = self
            .cache
            .read()
            .expect("cache lock")
            .leftovers(&c.instance_id)
            .to_vec();
        for eni in leftovers {
            if !fits(&eni, c) {
                info!(eni = %eni.id, instance = %c.instance_id, "deleting our unattached ENI that no longer fits the node");
                self.delete_unattached(&c.instance_id, &eni).await;
                continue;
            }
            let eni_id = eni.id.clone();
            let addresses = eni.secondary_ips.len() as u32
                + eni.prefixes.len() as u32 * crate::ec2::PREFIX_SIZE;
            info!(eni = %eni_id, instance = %c.instance_id, "attaching our ENI left unattached earlier");
            return match self.attach(c, eni, false).await {
                Attach::Done(attachment_id) => {
                    let outcome = ExecOutcome {
                        retire_token: true,
                        ..ExecOutcome::succeeded(Success::EniAttached {
                            eni_id: eni_id.clone(),
                            addresses,
                        })
                    };
                    Some(
                        self.finish_attach(c, &eni_id, &attachment_id, outcome)
                            .await,
                    )
                }
                Attach::Kept(e) => Some(ExecOutcome::failed(e)),
                // Deleted meanwhile (e.g. by the GC): create one instead.
                Attach::Gone(_) => continue,
                // It may have been created with the current token, which now names a deleted ENI.
                Attach::Refused(e) => Some(ExecOutcome {
                    retire_token: true,
                    ..Self::refused(e)
                }),
            };
        }
        None
    }

    fn refused(e: Ec2Error) -> ExecOutcome {
        if e.kind == ErrorKind::InstanceNotRunning {
            return ExecOutcome {
                not_running: true,
                retire_token: true,
                ..ExecOutcome::default()
            };
        }
        ExecOutcome {
            retire_token: true,
            ..ExecOutcome::failed(e)
        }
    }

    /// Attach `eni` to the planned instance, moving on to the next free device index on a
    /// conflict. A throttled or unanswered attach keeps the ENI (a leftover the next pass
    /// attaches); only an attach EC2 refused deletes it. An ENI `just_created` that EC2 says does
    /// not exist is waited for ([`NOT_READY_WAITS`]).
    async fn attach(&self, c: &CreateEni, eni: NetworkInterface, just_created: bool) -> Attach {
        let mut index = c.device_index;
        let mut refused = None;
        let mut waits = NOT_READY_WAITS.iter().filter(|_| just_created);
        let mut conflicts = 0;
        while conflicts < ATTACH_ATTEMPTS {
            match self
                .ec2
                .attach_network_interface(&eni.id, &c.instance_id, index)
                .await
            {
                Ok(id) => {
                    self.attached(eni, &c.instance_id, &id, index);
                    return Attach::Done(id);
                }
                Err(e) if e.kind == ErrorKind::DeviceIndexInUse => {
                    let mut used = self
                        .cache
                        .read()
                        .expect("cache lock")
                        .used_device_indices(&c.instance_id);
                    used.insert(index);
                    index = next_free_index(&used, index);
                    refused = Some(e);
                    conflicts += 1;
                }
                Err(e) if e.is_retryable() => {
                    // No answer may still mean it was attached: look before deciding.
                    if e.kind == ErrorKind::Transient
                        && let Some(a) = self.attachment_in_ec2(&eni.id, &c.instance_id).await
                    {
                        let id = a.id.clone();
                        self.attached(eni, &c.instance_id, &id, a.device_index);
                        return Attach::Done(id);
                    }
                    warn!(eni = %eni.id, error = %e, "attach not done; keeping the ENI for the next pass");
                    self.cache().add_leftover(&c.instance_id, eni, now());
                    return Attach::Kept(e);
                }
                Err(e) if e.kind == ErrorKind::NotFound(Resource::NetworkInterface) => {
                    if let Some(wait) = waits.next() {
                        info!(eni = %eni.id, "EC2 does not show the ENI it just created yet; waiting");
                        tokio::time::sleep(*wait).await;
                        continue;
                    }
                    self.cache().remove_leftover(&eni.id);
                    return Attach::Gone(e);
                }
                Err(e) => {
                    refused = Some(e);
                    break;
                }
            }
        }
        self.delete_unattached(&c.instance_id, &eni).await;
        Attach::Refused(refused.expect("at least one attach attempt"))
    }

    /// Put a newly attached ENI into the cache.
    fn attached(&self, eni: NetworkInterface, instance_id: &str, attachment_id: &str, index: u32) {
        let attachment = Attachment {
            id: attachment_id.to_string(),
            instance_id: instance_id.to_string(),
            device_index: index,
            delete_on_termination: false,
            network_card_index: 0,
        };
        self.cache().add_attached_eni(eni, attachment, now());
        self.metrics.enis_attached.inc();
    }

    /// After an attach without an answer: the attachment EC2 shows for this ENI and instance.
    async fn attachment_in_ec2(&self, eni_id: &str, instance_id: &str) -> Option<Attachment> {
        let eni = self.describe_eni(eni_id).await?;
        eni.attachment.filter(|a| a.instance_id == instance_id)
    }

    pub(super) async fn describe_eni(&self, eni_id: &str) -> Option<NetworkInterface> {
        let filter = EniFilter {
            ids: vec![eni_id.to_string()],
            ..Default::default()
        };
        match collect_pages(|t| self.ec2.describe_network_interfaces(&filter, t)).await {
            Ok(list) => list.into_iter().find(|e| e.id == eni_id),
            Err(e) => {
                warn!(eni = %eni_id, error = %e, "could not describe the ENI after an unanswered call");
                None
            }
        }
    }

    /// Delete our unattached ENI; if that fails it stays a leftover (attached by a later pass
    /// or collected by the GC).
    async fn delete_unattached(&self, instance_id: &str, eni: &NetworkInterface) {
        match self.ec2.delete_network_interface(&eni.id).await {
            Ok(()) => {
                self.cache().remove_leftover(&eni.id);
                self.metrics.eni_deleted(metrics::DELETED_ATTACH_FAILED, 1);
            }
            Err(e) if e.is_not_found() => self.cache().remove_leftover(&eni.id),
            Err(e) => {
                warn!(eni = %eni.id, error = %e, "could not delete our unattached ENI; keeping it for a later pass or the GC");
                self.cache().add_leftover(instance_id, eni.clone(), now());
            }
        }
    }

    /// Delete-on-termination for an ENI just attached, when the node asks for it.
    async fn finish_attach(
        &self,
        c: &CreateEni,
        eni_id: &str,
        attachment_id: &str,
        outcome: ExecOutcome,
    ) -> ExecOutcome {
        if c.delete_on_termination {
            return self
                .mark_delete_on_termination(eni_id, attachment_id, outcome)
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
}
