//! Gate tests on a fake backend, under paused tokio time: the fake records the (tokio) instant of
//! every call, so rates are checked on simulated time, never on the wall clock.

use std::collections::{HashMap, VecDeque};
use std::net::Ipv4Addr;

use ipnet::Ipv4Net;
use prometheus_client::registry::Registry;
use std::sync::{Arc, Mutex};

use super::*;
use crate::ec2::{Ec2, ErrorKind, collect_pages};

/// Counts calls with timestamps; can be told to fail the next calls of an operation.
#[derive(Default)]
struct Fake {
    log: Mutex<Vec<(Operation, Instant)>>,
    script: Mutex<HashMap<Operation, VecDeque<Ec2Error>>>,
    /// Pages a describe of subnets returns.
    pages: u32,
}

impl Fake {
    /// A fake whose next `times` calls of `op` fail with `code`.
    fn failing(op: Operation, code: &str, times: usize) -> Self {
        let fake = Self::default();
        fake.fail(op, code, times);
        fake
    }

    fn fail(&self, op: Operation, code: &str, times: usize) {
        let err = Ec2Error::from_aws(op, code, "scripted", Some(400));
        self.script
            .lock()
            .unwrap()
            .entry(op)
            .or_default()
            .extend(std::iter::repeat_n(err, times));
    }

    fn record(&self, op: Operation) -> Result<()> {
        self.log.lock().unwrap().push((op, Instant::now()));
        match self
            .script
            .lock()
            .unwrap()
            .get_mut(&op)
            .and_then(|q| q.pop_front())
        {
            Some(err) => Err(err),
            None => Ok(()),
        }
    }

    fn times(&self, op: Option<Operation>) -> Vec<Instant> {
        self.log
            .lock()
            .unwrap()
            .iter()
            .filter(|(o, _)| op.is_none_or(|op| *o == op))
            .map(|(_, t)| *t)
            .collect()
    }
}

fn eni() -> NetworkInterface {
    NetworkInterface {
        id: "eni-1".into(),
        subnet_id: "subnet-1".into(),
        vpc_id: "vpc-1".into(),
        availability_zone: "us-east-1a".into(),
        mac: String::new(),
        description: String::new(),
        primary_ip: Ipv4Addr::new(10, 0, 0, 5),
        secondary_ips: vec![],
        prefixes: vec![],
        ipv6_prefixes: vec![],
        security_groups: vec![],
        tags: Tags::new(),
        state: EniState::Available,
        attachment: None,
        public_ip: None,
        interface_type: InterfaceType::Interface,
    }
}

impl Ec2 for Fake {
    async fn describe_instance_types(
        &self,
        _: &[String],
        _: Option<String>,
    ) -> Result<Page<InstanceTypeLimits>> {
        self.record(Operation::DescribeInstanceTypes)?;
        Ok(Page::last(vec![]))
    }
    async fn describe_instances(
        &self,
        _: &InstanceFilter,
        _: Option<String>,
    ) -> Result<Page<Instance>> {
        self.record(Operation::DescribeInstances)?;
        Ok(Page::last(vec![]))
    }
    async fn describe_network_interfaces(
        &self,
        _: &EniFilter,
        _: Option<String>,
    ) -> Result<Page<NetworkInterface>> {
        self.record(Operation::DescribeNetworkInterfaces)?;
        Ok(Page::last(vec![eni()]))
    }
    async fn describe_subnets(
        &self,
        _: &ResourceFilter,
        next_token: Option<String>,
    ) -> Result<Page<Subnet>> {
        self.record(Operation::DescribeSubnets)?;
        let n: u32 = next_token.map_or(0, |t| t.parse().unwrap());
        let subnet = Subnet {
            id: format!("subnet-{n}"),
            vpc_id: "vpc-1".into(),
            availability_zone: "us-east-1a".into(),
            cidr: "10.0.0.0/24".parse().unwrap(),
            available_addresses: 251,
            tags: Tags::new(),
        };
        let next_token = (n + 1 < self.pages).then(|| (n + 1).to_string());
        Ok(Page {
            items: vec![subnet],
            next_token,
        })
    }
    async fn describe_vpcs(&self, _: &ResourceFilter, _: Option<String>) -> Result<Page<Vpc>> {
        self.record(Operation::DescribeVpcs)?;
        Ok(Page::last(vec![]))
    }
    async fn describe_security_groups(
        &self,
        _: &ResourceFilter,
        _: Option<String>,
    ) -> Result<Page<SecurityGroup>> {
        self.record(Operation::DescribeSecurityGroups)?;
        Ok(Page::last(vec![]))
    }
    async fn describe_route_tables(
        &self,
        _: &ResourceFilter,
        _: Option<String>,
    ) -> Result<Page<RouteTable>> {
        self.record(Operation::DescribeRouteTables)?;
        Ok(Page::last(vec![]))
    }
    async fn create_network_interface(&self, _: &CreateEniRequest) -> Result<NetworkInterface> {
        self.record(Operation::CreateNetworkInterface)?;
        Ok(eni())
    }
    async fn attach_network_interface(&self, _: &str, _: &str, _: u32) -> Result<String> {
        self.record(Operation::AttachNetworkInterface)?;
        Ok("eni-attach-1".into())
    }
    async fn set_delete_on_termination(&self, _: &str, _: &str, _: bool) -> Result<()> {
        self.record(Operation::ModifyNetworkInterfaceAttribute)
    }
    async fn assign_private_ip_addresses(&self, _: &str, _: AddressRequest) -> Result<Assigned> {
        self.record(Operation::AssignPrivateIpAddresses)?;
        Ok(Assigned::default())
    }
    async fn unassign_private_ip_addresses(
        &self,
        _: &str,
        _: &[Ipv4Addr],
        _: &[Ipv4Net],
    ) -> Result<()> {
        self.record(Operation::UnassignPrivateIpAddresses)
    }
    async fn detach_network_interface(&self, _: &str, _: bool) -> Result<()> {
        self.record(Operation::DetachNetworkInterface)
    }
    async fn delete_network_interface(&self, _: &str) -> Result<()> {
        self.record(Operation::DeleteNetworkInterface)
    }

    async fn describe_addresses(&self, _: &Tags) -> Result<Vec<Address>> {
        self.record(Operation::DescribeAddresses).map(|_| vec![])
    }

    async fn associate_address(&self, _: &str, _: &str, _: Ipv4Addr) -> Result<String> {
        self.record(Operation::AssociateAddress)
            .map(|_| "eipassoc-1".to_string())
    }

    async fn disassociate_address(&self, _: &str) -> Result<()> {
        self.record(Operation::DisassociateAddress)
    }
}

/// For every window [t_i, t_j] of the sorted call times: calls ≤ burst + rate × (t_j − t_i).
fn assert_within_rate(mut times: Vec<Instant>, burst: u32, per_sec: f64) {
    times.sort();
    for i in 0..times.len() {
        for j in i..times.len() {
            let calls = (j - i + 1) as f64;
            let window = (times[j] - times[i]).as_secs_f64();
            let allowed = f64::from(burst) + per_sec * window + 1e-6;
            assert!(
                calls <= allowed,
                "{calls} calls in {window}s exceed burst {burst} + {per_sec}/s"
            );
        }
    }
}

fn gate(fake: Fake, config: GateConfig) -> Arc<Gate<Fake>> {
    Arc::new(Gate::new(fake, config))
}

fn create_request() -> CreateEniRequest {
    CreateEniRequest {
        subnet_id: "subnet-1".into(),
        security_groups: vec![],
        description: String::new(),
        tags: Tags::new(),
        addresses: AddressRequest::Ips(0),
        client_token: "t".into(),
    }
}

fn rate_of(g: &Gate<Fake>, bucket: Bucket) -> f64 {
    g.rates()
        .into_iter()
        .find(|(name, _)| *name == bucket.name())
        .expect("bucket listed")
        .1
}

/// A gate whose attach and detach buckets are so large (1000/s, floor 10/s) that their pacing
/// never spaces calls more than the penalties and backoffs under test.
fn large_attach_buckets(config: GateConfig) -> GateConfig {
    GateConfig {
        overrides: [
            (Bucket::AttachNetworkInterface, (1000, 1000.0)),
            (Bucket::DetachNetworkInterface, (1000, 1000.0)),
        ]
        .into(),
        ..config
    }
}

mod buckets;
mod pacing;
mod retries;
