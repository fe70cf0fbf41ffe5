//! The mutating operations, each all-or-nothing under EC2's rules.

use std::net::Ipv4Addr;

use ipnet::Ipv4Net;
use tokio::time::Instant;

use super::*;

/// EC2's limit on a client token's length.
const MAX_CLIENT_TOKEN: usize = 64;

impl State {
    /// Take `request` from the subnet, within `slots_left` ENI slots; all or nothing.
    fn take_addresses(
        &mut self,
        op: Operation,
        eni_id: &str,
        subnet_id: &str,
        request: AddressRequest,
        slots_left: u32,
        prefixes_supported: Option<&str>,
    ) -> Result<Assigned> {
        let wanted = match request {
            AddressRequest::Ips(n) | AddressRequest::Prefixes(n) => n,
        };
        if wanted > slots_left {
            return Err(aws_err(
                op,
                "PrivateIpAddressLimitExceeded",
                format!(
                    "Number of private addresses will exceed limit: {wanted} requested, {slots_left} free on {eni_id}."
                ),
            ));
        }
        let rec = self
            .subnets
            .get_mut(subnet_id)
            .expect("an ENI's subnet exists");
        match request {
            AddressRequest::Ips(n) => match rec.pool.take_ips(n) {
                Some(ips) => Ok(Assigned {
                    ips,
                    prefixes: Vec::new(),
                }),
                None => Err(aws_err(
                    op,
                    "InsufficientFreeAddressesInSubnet",
                    format!(
                        "The specified subnet {subnet_id} does not have enough free addresses to satisfy the request."
                    ),
                )),
            },
            AddressRequest::Prefixes(n) => {
                if let Some(instance_type) = prefixes_supported {
                    return Err(prefix_unsupported(op, instance_type));
                }
                match rec.pool.take_prefixes(n) {
                    Some(prefixes) => Ok(Assigned {
                        ips: Vec::new(),
                        prefixes,
                    }),
                    None => Err(aws_err(
                        op,
                        "InsufficientCidrBlocks",
                        format!(
                            "The specified subnet {subnet_id} does not have enough contiguous free space for {n} /28 prefixes."
                        ),
                    )),
                }
            }
        }
    }

    pub(crate) fn create_network_interface(
        &mut self,
        req: &CreateEniRequest,
    ) -> Result<NetworkInterface> {
        let op = Operation::CreateNetworkInterface;
        // https://docs.aws.amazon.com/ec2/latest/devguide/ec2-api-idempotency.html
        if req.client_token.len() > MAX_CLIENT_TOKEN || !req.client_token.is_ascii() {
            return Err(aws_err(
                op,
                "InvalidParameterValue",
                format!(
                    "Value ({}) for parameter clientToken is invalid: at most {MAX_CLIENT_TOKEN} ASCII characters.",
                    req.client_token
                ),
            ));
        }
        if !req.client_token.is_empty()
            && let Some(t) = self.tokens.get(&req.client_token)
        {
            if &t.request != req {
                return Err(aws_err(
                    op,
                    "IdempotentParameterMismatch",
                    "The client token you have provided is associated with a resource that was created with different parameters.",
                ));
            }
            // Same request: EC2 answers with the original ENI instead of creating another.
            return Ok(self
                .enis
                .get(&t.eni_id)
                .map_or_else(|| t.created.clone(), |r| r.eni.clone()));
        }
        let subnet = self
            .subnets
            .get(&req.subnet_id)
            .ok_or_else(|| {
                aws_err(
                    op,
                    "InvalidSubnetID.NotFound",
                    format!("The subnet ID '{}' does not exist", req.subnet_id),
                )
            })?
            .subnet
            .clone();
        for g in &req.security_groups {
            match self.security_groups.get(g) {
                Some(sg) if sg.vpc_id == subnet.vpc_id => {}
                Some(_) => {
                    return Err(aws_err(
                        op,
                        "InvalidParameterValue",
                        format!(
                            "Security group {g} and subnet {} belong to different networks.",
                            subnet.id
                        ),
                    ));
                }
                None => {
                    return Err(aws_err(
                        op,
                        "InvalidGroup.NotFound",
                        format!("The security group '{g}' does not exist"),
                    ));
                }
            }
        }
        let id = self.new_id("eni");
        let primary = self
            .subnets
            .get_mut(&subnet.id)
            .expect("checked above")
            .pool
            .take_ips(1)
            .ok_or_else(|| {
                aws_err(
                    op,
                    "InsufficientFreeAddressesInSubnet",
                    format!(
                        "The specified subnet {} does not have enough free addresses to satisfy the request.",
                        subnet.id
                    ),
                )
            })?[0];
        let slots_left = self.unattached_slot_limit() - 1;
        let extra = match req.addresses {
            AddressRequest::Ips(0) | AddressRequest::Prefixes(0) => Ok(Assigned::default()),
            r => self.take_addresses(op, &id, &subnet.id, r, slots_left, None),
        };
        let extra = match extra {
            Ok(a) => a,
            Err(e) => {
                self.subnets
                    .get_mut(&subnet.id)
                    .expect("checked above")
                    .pool
                    .release_ip(primary);
                return Err(e);
            }
        };
        let eni = NetworkInterface {
            id: id.clone(),
            subnet_id: subnet.id.clone(),
            vpc_id: subnet.vpc_id.clone(),
            availability_zone: subnet.availability_zone.clone(),
            mac: self.new_mac(),
            description: req.description.clone(),
            primary_ip: primary,
            secondary_ips: extra.ips,
            prefixes: extra.prefixes,
            ipv6_prefixes: Vec::new(),
            security_groups: req.security_groups.clone(),
            tags: req.tags.clone(),
            state: EniState::Available,
            attachment: None,
            public_ip: None,
            interface_type: InterfaceType::Interface,
        };
        self.enis.insert(
            id.clone(),
            EniRec {
                eni: eni.clone(),
                detach_at: None,
            },
        );
        if !req.client_token.is_empty() {
            self.tokens.insert(
                req.client_token.clone(),
                TokenRec {
                    request: req.clone(),
                    eni_id: id,
                    created: eni.clone(),
                },
            );
        }
        Ok(eni)
    }

    pub(crate) fn attach_network_interface(
        &mut self,
        eni_id: &str,
        instance_id: &str,
        device_index: u32,
    ) -> Result<String> {
        // `NetworkCardIndex` left out, as the operator (and Cilium) send it: EC2 takes card 0.
        self.attach_on_card(eni_id, instance_id, device_index, 0)
    }

    /// Attach at `device_index` of network card `card`. EC2 counts device indexes per card and
    /// limits each card to its `NetworkCards[].MaximumNetworkInterfaces` (and the instance to
    /// its `MaximumNetworkInterfaces`).
    pub(crate) fn attach_on_card(
        &mut self,
        eni_id: &str,
        instance_id: &str,
        device_index: u32,
        card: u32,
    ) -> Result<String> {
        let op = Operation::AttachNetworkInterface;
        let eni = self.eni(op, eni_id)?.eni.clone();
        let inst = self
            .instances
            .get(instance_id)
            .ok_or_else(|| instance_not_found(op, instance_id))?
            .clone();
        if inst.state != InstanceState::Running && inst.state != InstanceState::Stopped {
            return Err(aws_err(
                op,
                "IncorrectInstanceState",
                format!("The instance '{instance_id}' is not 'running'."),
            ));
        }
        if eni.attachment.is_some() {
            return Err(aws_err(
                op,
                "InvalidParameterValue",
                format!("Interface: [{eni_id}] in use."),
            ));
        }
        if eni.availability_zone != inst.availability_zone || eni.vpc_id != inst.vpc_id {
            return Err(aws_err(
                op,
                "InvalidParameterCombination",
                format!(
                    "You may not attach a network interface to an instance if they are not in the same availability zone ({} vs {}).",
                    eni.availability_zone, inst.availability_zone
                ),
            ));
        }
        let limits = self
            .types
            .get(&inst.instance_type)
            .cloned()
            .unwrap_or_else(|| panic!("instance type {} is seeded", inst.instance_type));
        if card >= limits.enis_per_card.len().max(1) as u32 {
            return Err(aws_err(
                op,
                "InvalidParameterValue",
                format!(
                    "Network card index '{card}' is not valid for instance type {}.",
                    limits.instance_type
                ),
            ));
        }
        let all = self.enis_of_instance(instance_id).count() as u32;
        let attached: Vec<u32> = self
            .enis_of_instance(instance_id)
            .filter(|r| r.eni.network_card() == Some(card))
            .filter_map(|r| r.eni.device_index())
            .collect();
        if all >= limits.max_enis {
            return Err(aws_err(
                op,
                "AttachmentLimitExceeded",
                format!(
                    "Interface count {} exceeds the limit for {}",
                    all + 1,
                    limits.instance_type
                ),
            ));
        }
        if attached.contains(&device_index) {
            return Err(aws_err(
                op,
                "InvalidParameterValue",
                format!(
                    "Instance '{instance_id}' already has an interface attached at device index '{device_index}'."
                ),
            ));
        }
        if attached.len() as u32 >= limits.card_max_enis(card) {
            return Err(aws_err(
                op,
                "AttachmentLimitExceeded",
                format!(
                    "Interface count {} on network card {card} exceeds the limit for {}",
                    attached.len() + 1,
                    limits.instance_type
                ),
            ));
        }
        if slots_used(&eni) > limits.ipv4_per_eni {
            return Err(aws_err(
                op,
                "PrivateIpAddressLimitExceeded",
                format!(
                    "Number of private addresses on {eni_id} exceeds the limit of {} for {}.",
                    limits.ipv4_per_eni, limits.instance_type
                ),
            ));
        }
        if !eni.prefixes.is_empty() && !limits.supports_prefix_delegation() {
            return Err(prefix_unsupported(op, &limits.instance_type));
        }
        let attachment_id = self.new_id("eni-attach");
        self.attached_to
            .entry(instance_id.to_owned())
            .or_default()
            .insert(eni_id.to_owned());
        let rec = self.enis.get_mut(eni_id).expect("checked above");
        rec.eni.attachment = Some(Attachment {
            id: attachment_id.clone(),
            instance_id: instance_id.to_owned(),
            device_index,
            delete_on_termination: false,
            network_card_index: card,
        });
        rec.eni.state = EniState::InUse;
        Ok(attachment_id)
    }

    pub(super) fn eni_by_attachment(&self, attachment_id: &str) -> Option<String> {
        self.enis
            .values()
            .find(|r| {
                r.eni
                    .attachment
                    .as_ref()
                    .is_some_and(|a| a.id == attachment_id)
            })
            .map(|r| r.eni.id.clone())
    }

    pub(crate) fn set_delete_on_termination(
        &mut self,
        eni_id: &str,
        attachment_id: &str,
        delete_on_termination: bool,
    ) -> Result<()> {
        let op = Operation::ModifyNetworkInterfaceAttribute;
        self.eni(op, eni_id)?;
        let rec = self.enis.get_mut(eni_id).expect("checked above");
        match rec.eni.attachment.as_mut() {
            Some(a) if a.id == attachment_id => {
                a.delete_on_termination = delete_on_termination;
                Ok(())
            }
            _ => Err(attachment_not_found(op, attachment_id)),
        }
    }

    pub(crate) fn assign_private_ip_addresses(
        &mut self,
        eni_id: &str,
        request: AddressRequest,
    ) -> Result<Assigned> {
        let op = Operation::AssignPrivateIpAddresses;
        let eni = self.eni(op, eni_id)?.eni.clone();
        if request.addresses() == 0 {
            return Err(aws_err(
                op,
                "InvalidParameterValue",
                "The request must assign at least one address or prefix.",
            ));
        }
        // An efa-only interface has no IPv4 address and takes none (EC2 User Guide,
        // "EFA-only interfaces": no IP addresses).
        if eni.interface_type == InterfaceType::EfaOnly {
            return Err(aws_err(
                op,
                "InvalidParameterValue",
                format!(
                    "The network interface {eni_id} is an EFA-only interface and has no IP addresses."
                ),
            ));
        }
        let (limit, prefixes_ok) = self.eni_limits(&eni);
        let instance_type = eni
            .instance_id()
            .and_then(|i| self.instances.get(i))
            .map(|i| i.instance_type.clone());
        let unsupported = (!prefixes_ok).then_some(instance_type.as_deref().unwrap_or("unknown"));
        let slots_left = limit.saturating_sub(slots_used(&eni));
        let got =
            self.take_addresses(op, eni_id, &eni.subnet_id, request, slots_left, unsupported)?;
        let rec = self.enis.get_mut(eni_id).expect("checked above");
        rec.eni.secondary_ips.extend(&got.ips);
        rec.eni.prefixes.extend(&got.prefixes);
        Ok(got)
    }

    pub(crate) fn unassign_private_ip_addresses(
        &mut self,
        op: Operation,
        eni_id: &str,
        ips: &[Ipv4Addr],
        prefixes: &[Ipv4Net],
    ) -> Result<()> {
        let eni = &self.eni(op, eni_id)?.eni;
        let missing_ip = ips.iter().find(|ip| !eni.secondary_ips.contains(ip));
        let missing_prefix = prefixes.iter().find(|p| !eni.prefixes.contains(p));
        if let Some(ip) = missing_ip {
            return Err(aws_err(
                op,
                "InvalidParameterValue",
                format!(
                    "Some of the specified addresses are not assigned to interface {eni_id}: {ip}"
                ),
            ));
        }
        if let Some(p) = missing_prefix {
            return Err(aws_err(
                op,
                "InvalidParameterValue",
                format!(
                    "Some of the specified prefixes are not assigned to interface {eni_id}: {p}"
                ),
            ));
        }
        let subnet_id = eni.subnet_id.clone();
        let rec = self.enis.get_mut(eni_id).expect("checked above");
        rec.eni.secondary_ips.retain(|ip| !ips.contains(ip));
        rec.eni.prefixes.retain(|p| !prefixes.contains(p));
        let pool = &mut self
            .subnets
            .get_mut(&subnet_id)
            .expect("subnet exists")
            .pool;
        for ip in ips {
            pool.release_ip(*ip);
        }
        for p in prefixes {
            pool.release_prefix(*p);
        }
        Ok(())
    }

    pub(crate) fn detach_network_interface(
        &mut self,
        attachment_id: &str,
        now: Instant,
    ) -> Result<()> {
        let op = Operation::DetachNetworkInterface;
        let eni_id = self
            .eni_by_attachment(attachment_id)
            .ok_or_else(|| attachment_not_found(op, attachment_id))?;
        let delay = self.detach_delay;
        let rec = self.enis.get_mut(&eni_id).expect("found above");
        if rec.eni.is_primary() {
            return Err(aws_err(
                op,
                "OperationNotPermitted",
                format!("The network interface at device index 0 cannot be detached ({eni_id})."),
            ));
        }
        if rec.detach_at.is_some() {
            // Already detaching: EC2 accepts the repeat.
            return Ok(());
        }
        rec.eni.state = EniState::Detaching;
        rec.detach_at = Some(now + delay);
        self.detaching += 1;
        self.settle(now);
        Ok(())
    }

    pub(crate) fn delete_network_interface(&mut self, eni_id: &str) -> Result<()> {
        let op = Operation::DeleteNetworkInterface;
        let eni = &self.eni(op, eni_id)?.eni;
        if eni.attachment.is_some() {
            return Err(aws_err(
                op,
                "InvalidParameterValue",
                format!("Network interface '{eni_id}' is currently in use."),
            ));
        }
        self.remove_eni(eni_id);
        Ok(())
    }

    /// Drop an ENI and return its addresses to the subnet.
    fn remove_eni(&mut self, eni_id: &str) {
        let Some(rec) = self.enis.remove(eni_id) else {
            return;
        };
        let pool = &mut self
            .subnets
            .get_mut(&rec.eni.subnet_id)
            .expect("subnet exists")
            .pool;
        pool.release_ip(rec.eni.primary_ip);
        for ip in &rec.eni.secondary_ips {
            pool.release_ip(*ip);
        }
        for p in &rec.eni.prefixes {
            pool.release_prefix(*p);
        }
    }

    /// Terminate: delete-on-termination ENIs are deleted, the others become `available`.
    pub(crate) fn terminate_instance(&mut self, instance_id: &str) -> bool {
        let Some(inst) = self.instances.get_mut(instance_id) else {
            return false;
        };
        inst.state = InstanceState::Terminated;
        let attached: Vec<(String, bool)> = self
            .enis
            .values()
            .filter_map(|r| {
                let a = r.eni.attachment.as_ref()?;
                (a.instance_id == instance_id).then(|| (r.eni.id.clone(), a.delete_on_termination))
            })
            .collect();
        for (id, delete) in attached {
            if delete {
                self.remove_eni(&id);
            } else if let Some(rec) = self.enis.get_mut(&id) {
                rec.eni.attachment = None;
                rec.eni.state = EniState::Available;
                rec.detach_at = None;
            }
        }
        true
    }
}
