//! The simulated account: resources and the EC2 rules every operation enforces. Pure and
//! synchronous; the [`super::Simulator`] handle adds locking, throttling and injected faults.

mod addresses;
mod describe;
mod invariants;
mod lag;
mod mutate;

pub(crate) use describe::encode_token;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use tokio::time::Instant;

use super::addressing::AddressPool;
use eni_operator::ec2::Result;
use eni_operator::ec2::error::Ec2Error;
use eni_operator::ec2::model::*;

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
    /// ENI IDs ever attached to each instance, so per-instance lookups do not scan every ENI.
    /// Entries may be stale (detached, deleted, moved): readers check the ENI itself.
    pub(crate) attached_to: HashMap<String, BTreeSet<String>>,
    tokens: HashMap<String, TokenRec>,
    next_id: u64,
    /// Upper bound on the ENIs in `detaching` (exact after each `settle`).
    detaching: usize,
    /// Detaches completed by [`Self::settle`] (state changes no call made).
    pub(crate) transitions: u64,
    pub(crate) page_size: usize,
    pub(crate) detach_delay: Duration,
    /// Eventual consistency of describes (off unless `set_lag`).
    lag: lag::Lag,
    /// Elastic IPs by allocation ID (`addresses.rs`).
    pub(crate) addresses: BTreeMap<String, Address>,
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

    /// The ENIs attached to an instance now (the index, checked against each ENI).
    pub(crate) fn enis_of_instance<'a>(
        &'a self,
        instance_id: &'a str,
    ) -> impl Iterator<Item = &'a EniRec> + 'a {
        self.attached_to
            .get(instance_id)
            .into_iter()
            .flatten()
            .filter_map(|id| self.enis.get(id))
            .filter(move |r| r.eni.instance_id() == Some(instance_id))
    }

    /// A new resource: a new ID with `prefix`, and `make(id)` stored under it in `table`.
    pub(crate) fn insert_new<T>(
        &mut self,
        prefix: &str,
        table: impl FnOnce(&mut Self) -> &mut BTreeMap<String, T>,
        make: impl FnOnce(String) -> T,
    ) -> String {
        let id = self.new_id(prefix);
        let value = make(id.clone());
        table(self).insert(id.clone(), value);
        id
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
        // Most calls find nothing detaching: skip the walk over every ENI.
        if self.detaching == 0 {
            return;
        }
        let mut still = 0;
        for rec in self.enis.values_mut() {
            match rec.detach_at {
                Some(at) if at <= now => {
                    rec.detach_at = None;
                    rec.eni.attachment = None;
                    rec.eni.state = EniState::Available;
                    self.transitions += 1;
                }
                Some(_) => still += 1,
                None => {}
            }
        }
        self.detaching = still;
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
    not_found(op, "InvalidNetworkInterfaceID", "networkInterface", id)
}

fn instance_not_found(op: Operation, id: &str) -> Ec2Error {
    not_found(op, "InvalidInstanceID", "instance", id)
}

fn attachment_not_found(op: Operation, id: &str) -> Ec2Error {
    not_found(op, "InvalidAttachmentID", "attachment", id)
}

/// AWS's answer naming an ID of `what` that does not exist (`<code>.NotFound`).
fn not_found(op: Operation, code: &str, what: &str, id: &str) -> Ec2Error {
    let message = format!("The {what} ID '{id}' does not exist");
    aws_err(op, &format!("{code}.NotFound"), message)
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
