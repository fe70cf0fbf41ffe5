//! The simulated account: resources and the EC2 rules every operation enforces. Pure and
//! synchronous; the [`super::Simulator`] handle adds locking, throttling and injected faults.

use std::collections::{BTreeMap, HashMap};
use std::net::Ipv4Addr;
use std::time::Duration;

use ipnet::Ipv4Net;
use tokio::time::Instant;

use super::addressing::AddressPool;
use crate::ec2::Result;
use crate::ec2::error::Ec2Error;
use crate::ec2::model::*;

/// Build an EC2 client error (HTTP 400) so classification is shared with the SDK backend.
pub(crate) fn aws_err(op: Operation, code: &str, message: impl AsRef<str>) -> Ec2Error {
    Ec2Error::from_aws(op, code, message.as_ref(), Some(400))
}

#[derive(Clone, Debug)]
pub(crate) struct SubnetRec {
    pub(crate) subnet: Subnet,
    pub(crate) pool: AddressPool,
}

#[derive(Clone, Debug)]
pub(crate) struct EniRec {
    pub(crate) eni: NetworkInterface,
    /// When a pending detach completes (state `detaching` until then).
    pub(crate) detach_at: Option<Instant>,
}

#[derive(Clone, Debug)]
struct TokenRec {
    request: CreateEniRequest,
    eni_id: String,
    created: NetworkInterface,
}

#[derive(Debug, Default)]
pub(crate) struct State {
    pub(crate) vpcs: BTreeMap<String, Vpc>,
    pub(crate) subnets: BTreeMap<String, SubnetRec>,
    pub(crate) security_groups: BTreeMap<String, SecurityGroup>,
    pub(crate) route_tables: BTreeMap<String, RouteTable>,
    pub(crate) types: BTreeMap<String, InstanceTypeLimits>,
    pub(crate) instances: BTreeMap<String, Instance>,
    pub(crate) enis: BTreeMap<String, EniRec>,
    tokens: HashMap<String, TokenRec>,
    next_id: u64,
    pub(crate) page_size: usize,
    pub(crate) detach_delay: Duration,
}

/// One page of `items` (sorted by `key`) after the opaque `token`.
fn paginate<T>(
    op: Operation,
    mut items: Vec<T>,
    key: impl Fn(&T) -> &str,
    token: Option<String>,
    page_size: usize,
) -> Result<Page<T>> {
    items.sort_by(|a, b| key(a).cmp(key(b)));
    let start = match token.filter(|t| !t.is_empty()) {
        None => 0,
        Some(t) => {
            let after = decode_token(&t).ok_or_else(|| {
                aws_err(
                    op,
                    "InvalidParameterValue",
                    format!("Invalid value '{t}' for NextToken"),
                )
            })?;
            items.partition_point(|i| key(i) <= after.as_str())
        }
    };
    let mut rest = items.split_off(start.min(items.len()));
    let next_token = (rest.len() > page_size.max(1)).then(|| {
        rest.truncate(page_size.max(1));
        encode_token(key(rest.last().expect("page is not empty")))
    });
    Ok(Page {
        items: rest,
        next_token,
    })
}

/// Tokens are opaque to callers: the hex of the last key returned.
fn encode_token(last_key: &str) -> String {
    last_key.bytes().map(|b| format!("{b:02x}")).collect()
}

fn decode_token(token: &str) -> Option<String> {
    if !token.len().is_multiple_of(2) {
        return None;
    }
    let bytes = (0..token.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(token.get(i..i + 2)?, 16).ok())
        .collect::<Option<Vec<u8>>>()?;
    String::from_utf8(bytes).ok()
}

fn tags_match(have: &Tags, want: &Tags) -> bool {
    want.iter().all(|(k, v)| have.get(k) == Some(v))
}

/// IDs asked for explicitly must all exist (EC2 fails the whole call otherwise).
fn require_ids(
    op: Operation,
    ids: &[String],
    exists: impl Fn(&str) -> bool,
    code: &str,
    what: &str,
) -> Result<()> {
    match ids.iter().find(|id| !exists(id)) {
        Some(id) => Err(aws_err(
            op,
            code,
            format!("The {what} ID '{id}' does not exist"),
        )),
        None => Ok(()),
    }
}

impl State {
    pub(crate) fn new(page_size: usize) -> Self {
        Self {
            page_size,
            ..Self::default()
        }
    }

    pub(crate) fn new_id(&mut self, prefix: &str) -> String {
        self.next_id += 1;
        format!("{prefix}-{:017x}", self.next_id)
    }

    fn new_mac(&mut self) -> String {
        self.next_id += 1;
        let n = self.next_id;
        format!(
            "02:00:{:02x}:{:02x}:{:02x}:{:02x}",
            (n >> 24) & 0xff,
            (n >> 16) & 0xff,
            (n >> 8) & 0xff,
            n & 0xff
        )
    }

    /// Complete the detaches whose delay has passed.
    pub(crate) fn settle(&mut self, now: Instant) {
        for rec in self.enis.values_mut() {
            if rec.detach_at.is_some_and(|at| at <= now) {
                rec.detach_at = None;
                rec.eni.attachment = None;
                rec.eni.state = EniState::Available;
            }
        }
    }

    /// The most IPv4 slots any ENI can have before an instance type applies (unattached ENI):
    /// the largest `Ipv4AddressesPerInterface` of the known types.
    fn unattached_slot_limit(&self) -> u32 {
        self.types
            .values()
            .map(|t| t.ipv4_per_eni)
            .max()
            .unwrap_or(50)
    }

    fn limits_of_instance(&self, instance_id: &str) -> Option<&InstanceTypeLimits> {
        let inst = self.instances.get(instance_id)?;
        self.types.get(&inst.instance_type)
    }

    /// Slot limit and prefix support that apply to `eni` where it is now.
    fn eni_limits(&self, eni: &NetworkInterface) -> (u32, bool) {
        match eni.instance_id().and_then(|i| self.limits_of_instance(i)) {
            Some(l) => (l.ipv4_per_eni, l.supports_prefix_delegation()),
            None => (self.unattached_slot_limit(), true),
        }
    }

    fn eni(&self, op: Operation, id: &str) -> Result<&EniRec> {
        self.enis.get(id).ok_or_else(|| eni_not_found(op, id))
    }

    // ---- describes ----

    pub(crate) fn describe_instance_types(
        &self,
        types: &[String],
        token: Option<String>,
    ) -> Result<Page<InstanceTypeLimits>> {
        let op = Operation::DescribeInstanceTypes;
        let unknown: Vec<&str> = types
            .iter()
            .filter(|t| !self.types.contains_key(*t))
            .map(String::as_str)
            .collect();
        if !unknown.is_empty() {
            return Err(aws_err(
                op,
                "InvalidInstanceType",
                format!(
                    "The following supplied instance types do not exist: [{}]",
                    unknown.join(", ")
                ),
            ));
        }
        let items = self
            .types
            .values()
            .filter(|t| types.is_empty() || types.contains(&t.instance_type))
            .cloned()
            .collect();
        paginate(op, items, |t| &t.instance_type, token, self.page_size)
    }

    pub(crate) fn describe_instances(
        &self,
        f: &InstanceFilter,
        token: Option<String>,
    ) -> Result<Page<Instance>> {
        let op = Operation::DescribeInstances;
        require_ids(
            op,
            &f.ids,
            |id| self.instances.contains_key(id),
            "InvalidInstanceID.NotFound",
            "instance",
        )?;
        let items = self
            .instances
            .values()
            .filter(|i| f.ids.is_empty() || f.ids.contains(&i.id))
            .filter(|i| f.vpc_id.as_ref().is_none_or(|v| &i.vpc_id == v))
            .filter(|i| tags_match(&i.tags, &f.tags))
            .cloned()
            .collect();
        paginate(op, items, |i| &i.id, token, self.page_size)
    }

    pub(crate) fn describe_network_interfaces(
        &self,
        f: &EniFilter,
        token: Option<String>,
    ) -> Result<Page<NetworkInterface>> {
        let op = Operation::DescribeNetworkInterfaces;
        require_ids(
            op,
            &f.ids,
            |id| self.enis.contains_key(id),
            "InvalidNetworkInterfaceID.NotFound",
            "networkInterface",
        )?;
        let items: Vec<NetworkInterface> = self
            .enis
            .values()
            .map(|r| &r.eni)
            .filter(|e| f.ids.is_empty() || f.ids.contains(&e.id))
            .filter(|e| f.vpc_id.as_ref().is_none_or(|v| &e.vpc_id == v))
            .filter(|e| {
                f.instance_ids.is_empty()
                    || e.instance_id()
                        .is_some_and(|i| f.instance_ids.iter().any(|x| x == i))
            })
            .filter(|e| f.subnet_ids.is_empty() || f.subnet_ids.contains(&e.subnet_id))
            .filter(|e| tags_match(&e.tags, &f.tags))
            .filter(|e| f.state.is_none_or(|s| e.state == s))
            .cloned()
            .collect();
        // AWS refuses MaxResults together with NetworkInterfaceIds, so ID lookups are one page.
        let page_size = if f.ids.is_empty() {
            self.page_size
        } else {
            usize::MAX
        };
        paginate(op, items, |e| &e.id, token, page_size)
    }

    pub(crate) fn describe_subnets(
        &self,
        f: &ResourceFilter,
        token: Option<String>,
    ) -> Result<Page<Subnet>> {
        let op = Operation::DescribeSubnets;
        require_ids(
            op,
            &f.ids,
            |id| self.subnets.contains_key(id),
            "InvalidSubnetID.NotFound",
            "subnet",
        )?;
        let items = self
            .subnets
            .values()
            .map(|r| Subnet {
                available_addresses: r.pool.available(),
                ..r.subnet.clone()
            })
            .filter(|s| resource_match(f, &s.id, &s.vpc_id, &s.tags))
            .collect();
        paginate(op, items, |s| &s.id, token, self.page_size)
    }

    pub(crate) fn describe_vpcs(
        &self,
        f: &ResourceFilter,
        token: Option<String>,
    ) -> Result<Page<Vpc>> {
        let op = Operation::DescribeVpcs;
        require_ids(
            op,
            &f.ids,
            |id| self.vpcs.contains_key(id),
            "InvalidVpcID.NotFound",
            "vpc",
        )?;
        // The simulator's VPCs carry no tags: a tag filter matches none of them.
        let items = self
            .vpcs
            .values()
            .filter(|v| resource_match(f, &v.id, &v.id, &Tags::new()))
            .cloned()
            .collect();
        paginate(op, items, |v| &v.id, token, self.page_size)
    }

    pub(crate) fn describe_security_groups(
        &self,
        f: &ResourceFilter,
        token: Option<String>,
    ) -> Result<Page<SecurityGroup>> {
        let op = Operation::DescribeSecurityGroups;
        require_ids(
            op,
            &f.ids,
            |id| self.security_groups.contains_key(id),
            "InvalidGroup.NotFound",
            "security group",
        )?;
        let items = self
            .security_groups
            .values()
            .filter(|g| resource_match(f, &g.id, &g.vpc_id, &g.tags))
            .cloned()
            .collect();
        paginate(op, items, |g| &g.id, token, self.page_size)
    }

    pub(crate) fn describe_route_tables(
        &self,
        f: &ResourceFilter,
        token: Option<String>,
    ) -> Result<Page<RouteTable>> {
        let op = Operation::DescribeRouteTables;
        require_ids(
            op,
            &f.ids,
            |id| self.route_tables.contains_key(id),
            "InvalidRouteTableID.NotFound",
            "route table",
        )?;
        let items = self
            .route_tables
            .values()
            .filter(|r| resource_match(f, &r.id, &r.vpc_id, &Tags::new()))
            .cloned()
            .collect();
        paginate(op, items, |r| &r.id, token, self.page_size)
    }

    // ---- mutations ----

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
        let attached: Vec<u32> = self
            .enis
            .values()
            .filter(|r| r.eni.instance_id() == Some(instance_id))
            .filter_map(|r| r.eni.device_index())
            .collect();
        if attached.contains(&device_index) {
            return Err(aws_err(
                op,
                "InvalidParameterValue",
                format!(
                    "Instance '{instance_id}' already has an interface attached at device index '{device_index}'."
                ),
            ));
        }
        if attached.len() as u32 >= limits.max_enis {
            return Err(aws_err(
                op,
                "AttachmentLimitExceeded",
                format!(
                    "Interface count {} exceeds the limit for {}",
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
        let rec = self.enis.get_mut(eni_id).expect("checked above");
        rec.eni.attachment = Some(Attachment {
            id: attachment_id.clone(),
            instance_id: instance_id.to_owned(),
            device_index,
            delete_on_termination: false,
        });
        rec.eni.state = EniState::InUse;
        Ok(attachment_id)
    }

    fn eni_by_attachment(&self, attachment_id: &str) -> Option<String> {
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
        if rec.eni.device_index() == Some(0) {
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

    /// AWS's invariants: no address on two ENIs, subnet counts consistent with the ENIs, no
    /// instance or ENI above its type's limits.
    pub(crate) fn check_invariants(&self) -> std::result::Result<(), String> {
        let mut owner: HashMap<Ipv4Addr, &str> = HashMap::new();
        let mut per_subnet: BTreeMap<&str, u32> = BTreeMap::new();
        for rec in self.enis.values() {
            let e = &rec.eni;
            let addrs = std::iter::once(e.primary_ip)
                .chain(e.secondary_ips.iter().copied())
                .chain(e.prefixes.iter().flat_map(|p| prefix_addresses(*p)));
            for ip in addrs {
                if let Some(other) = owner.insert(ip, &e.id) {
                    return Err(format!("{ip} is on both {other} and {}", e.id));
                }
                let subnet = &self.subnets[&e.subnet_id].subnet;
                if !subnet.cidr.contains(&ip) {
                    return Err(format!("{ip} of {} is outside {}", e.id, subnet.cidr));
                }
                *per_subnet.entry(&e.subnet_id).or_default() += 1;
            }
            let (limit, prefixes_ok) = self.eni_limits(e);
            if slots_used(e) > limit {
                return Err(format!(
                    "{} uses {} slots, limit {limit}",
                    e.id,
                    slots_used(e)
                ));
            }
            if !prefixes_ok && !e.prefixes.is_empty() {
                return Err(format!(
                    "{} holds prefixes on a type without delegation",
                    e.id
                ));
            }
        }
        for (id, rec) in &self.subnets {
            let held = per_subnet.get(id.as_str()).copied().unwrap_or(0);
            if rec.pool.held() != held {
                return Err(format!(
                    "{id}: pool holds {} but ENIs hold {held}",
                    rec.pool.held()
                ));
            }
            let size = 1u32 << (32 - u32::from(rec.subnet.cidr.prefix_len()));
            if rec.pool.available() + held + 5 != size {
                return Err(format!("{id}: available count inconsistent"));
            }
        }
        for inst in self.instances.values() {
            let Some(l) = self.types.get(&inst.instance_type) else {
                continue;
            };
            let n = self
                .enis
                .values()
                .filter(|r| r.eni.instance_id() == Some(inst.id.as_str()))
                .count() as u32;
            if n > l.max_enis {
                return Err(format!("{} has {n} ENIs, limit {}", inst.id, l.max_enis));
            }
        }
        Ok(())
    }
}

/// Address slots an ENI uses: the primary, each secondary address, each /28 prefix.
pub(crate) fn slots_used(eni: &NetworkInterface) -> u32 {
    1 + eni.secondary_ips.len() as u32 + eni.prefixes.len() as u32
}

fn resource_match(f: &ResourceFilter, id: &str, vpc_id: &str, tags: &Tags) -> bool {
    (f.ids.is_empty() || f.ids.iter().any(|i| i == id))
        && f.vpc_id.as_deref().is_none_or(|v| v == vpc_id)
        && tags_match(tags, &f.tags)
}

fn eni_not_found(op: Operation, id: &str) -> Ec2Error {
    aws_err(
        op,
        "InvalidNetworkInterfaceID.NotFound",
        format!("The networkInterface ID '{id}' does not exist"),
    )
}

fn instance_not_found(op: Operation, id: &str) -> Ec2Error {
    aws_err(
        op,
        "InvalidInstanceID.NotFound",
        format!("The instance ID '{id}' does not exist"),
    )
}

fn attachment_not_found(op: Operation, id: &str) -> Ec2Error {
    aws_err(
        op,
        "InvalidAttachmentID.NotFound",
        format!("The attachment ID '{id}' does not exist"),
    )
}

fn prefix_unsupported(op: Operation, instance_type: &str) -> Ec2Error {
    aws_err(
        op,
        "InvalidParameterValue",
        format!(
            "Prefix delegation is not supported for instance type '{instance_type}': it needs a Nitro or bare-metal type."
        ),
    )
}
