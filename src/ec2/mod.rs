//! Everything the operator does to AWS, behind one trait.
//!
//! * [`Ec2`] speaks our own domain types ([`model`]) and errors ([`Ec2Error`]).
//! * `aws` implements it on aws-sdk-ec2 (real AWS, LocalStack, moto).
//! * `testkit::sim` (a crate of its own) implements it in memory, faithful to AWS's rules, for
//!   tests and the benchmark.
//! * `gate` wraps any implementation: per-action token buckets and the one retry policy. The
//!   operator only ever holds a gated client.
//!
//! Describes are paginated: each trait call returns one page, so the gate meters every page.
//! [`collect_pages`] walks them all.

pub mod aws;
pub mod error;
pub mod gate;
pub mod guarded;
pub mod limits;
pub mod model;
pub mod readonly;

use std::future::Future;
use std::net::Ipv4Addr;

use ipnet::Ipv4Net;

pub use error::{Ec2Error, ErrorKind, Resource};
pub use model::*;

pub type Result<T, E = Ec2Error> = std::result::Result<T, E>;

/// The EC2 operations the operator needs, and no others.
pub trait Ec2: Send + Sync + 'static {
    /// Limits of the given instance types (all types when `types` is empty).
    fn describe_instance_types(
        &self,
        types: &[String],
        next_token: Option<String>,
    ) -> impl Future<Output = Result<Page<InstanceTypeLimits>>> + Send;

    fn describe_instances(
        &self,
        filter: &InstanceFilter,
        next_token: Option<String>,
    ) -> impl Future<Output = Result<Page<Instance>>> + Send;

    fn describe_network_interfaces(
        &self,
        filter: &EniFilter,
        next_token: Option<String>,
    ) -> impl Future<Output = Result<Page<NetworkInterface>>> + Send;

    fn describe_subnets(
        &self,
        filter: &ResourceFilter,
        next_token: Option<String>,
    ) -> impl Future<Output = Result<Page<Subnet>>> + Send;

    fn describe_vpcs(
        &self,
        filter: &ResourceFilter,
        next_token: Option<String>,
    ) -> impl Future<Output = Result<Page<Vpc>>> + Send;

    fn describe_security_groups(
        &self,
        filter: &ResourceFilter,
        next_token: Option<String>,
    ) -> impl Future<Output = Result<Page<SecurityGroup>>> + Send;

    fn describe_route_tables(
        &self,
        filter: &ResourceFilter,
        next_token: Option<String>,
    ) -> impl Future<Output = Result<Page<RouteTable>>> + Send;

    /// Create an ENI with its tags, security groups and addresses (or prefixes) inline.
    fn create_network_interface(
        &self,
        request: &CreateEniRequest,
    ) -> impl Future<Output = Result<NetworkInterface>> + Send;

    /// Attach at `device_index` (network card 0). Returns the attachment ID.
    fn attach_network_interface(
        &self,
        eni_id: &str,
        instance_id: &str,
        device_index: u32,
    ) -> impl Future<Output = Result<String>> + Send;

    /// `ModifyNetworkInterfaceAttribute` with `Attachment.DeleteOnTermination`.
    fn set_delete_on_termination(
        &self,
        eni_id: &str,
        attachment_id: &str,
        delete_on_termination: bool,
    ) -> impl Future<Output = Result<()>> + Send;

    fn assign_private_ip_addresses(
        &self,
        eni_id: &str,
        request: AddressRequest,
    ) -> impl Future<Output = Result<Assigned>> + Send;

    /// Unassign single addresses and/or /28 prefixes (one AWS call per non-empty kind).
    fn unassign_private_ip_addresses(
        &self,
        eni_id: &str,
        ips: &[Ipv4Addr],
        prefixes: &[Ipv4Net],
    ) -> impl Future<Output = Result<()>> + Send;

    fn detach_network_interface(
        &self,
        attachment_id: &str,
        force: bool,
    ) -> impl Future<Output = Result<()>> + Send;

    fn delete_network_interface(&self, eni_id: &str) -> impl Future<Output = Result<()>> + Send;

    /// Elastic IPs carrying every one of `tags` (`DescribeAddresses` with `tag:` filters; AWS
    /// does not paginate it).
    fn describe_addresses(&self, tags: &Tags) -> impl Future<Output = Result<Vec<Address>>> + Send;

    /// `AssociateAddress` with `AllowReassociation` false: refused with
    /// `Resource.AlreadyAssociated` when the address is associated already. Returns the
    /// association ID.
    fn associate_address(
        &self,
        allocation_id: &str,
        eni_id: &str,
        private_ip: Ipv4Addr,
    ) -> impl Future<Output = Result<String>> + Send;

    fn disassociate_address(&self, association_id: &str)
    -> impl Future<Output = Result<()>> + Send;
}

/// Walk every page of a describe, one call (and one gate token) per page.
pub async fn collect_pages<T, F, Fut>(mut call: F) -> Result<Vec<T>>
where
    F: FnMut(Option<String>) -> Fut,
    Fut: Future<Output = Result<Page<T>>>,
{
    let mut items = Vec::new();
    let mut token = None;
    loop {
        let page = call(token.take()).await?;
        items.extend(page.items);
        match page.next_token {
            Some(next) if !next.is_empty() => token = Some(next),
            _ => return Ok(items),
        }
    }
}
