//! Everything the operator does to AWS, behind one trait.
//!
//! * [`Ec2`] speaks our own domain types ([`model`]) and errors ([`Ec2Error`]).
//! * `aws` implements it on aws-sdk-ec2 (real AWS, LocalStack, moto).
//! * `testkit::sim` (a crate of its own) implements it in memory, faithful to AWS's rules, for
//!   tests and the benchmark.
//! * `layer` forwards the trait once; whatever sits between the operator and AWS is a layer on
//!   it: `gate` (per-action token buckets and the one retry policy; the operator only ever holds
//!   a gated client), `readonly` (a shadow's refusal), the leader's fence.
//!
//! Describes are paginated: each trait call returns one page, so the gate meters every page.
//! [`collect_pages`] walks them all.

pub mod aws;
pub mod error;
pub mod gate;
pub mod layer;
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

/// Pages one listing may take: ten times the largest listing of a real account (1,000 items
/// a page), so an endpoint that never ends a listing cannot hold a pass or a refresh forever.
pub const MAX_PAGES: usize = 10_000;

/// What a paginated describe lists, to name the call in a listing's error.
pub trait Listed {
    const OPERATION: Operation;
}

macro_rules! listed {
    ($($t:ty => $op:ident),* $(,)?) => {
        $(impl Listed for $t {
            const OPERATION: Operation = Operation::$op;
        })*
    };
}

listed! {
    InstanceTypeLimits => DescribeInstanceTypes,
    Instance => DescribeInstances,
    NetworkInterface => DescribeNetworkInterfaces,
    Subnet => DescribeSubnets,
    Vpc => DescribeVpcs,
    SecurityGroup => DescribeSecurityGroups,
    RouteTable => DescribeRouteTables,
}

/// Walk every page of a describe, one call (and one gate token) per page. A `NextToken` seen
/// before (the endpoint would page in a circle) or more than [`MAX_PAGES`] pages end it with
/// an error: a partial listing is never taken for the whole.
pub async fn collect_pages<T, F, Fut>(mut call: F) -> Result<Vec<T>>
where
    T: Listed,
    F: FnMut(Option<String>) -> Fut,
    Fut: Future<Output = Result<Page<T>>>,
{
    let mut items = Vec::new();
    let mut token = None;
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..MAX_PAGES {
        let page = call(token.take()).await?;
        items.extend(page.items);
        match page.next_token {
            Some(next) if !next.is_empty() => {
                if !seen.insert(next.clone()) {
                    let why = format!("NextToken {next} came back: the listing pages in a circle");
                    return Err(Ec2Error::transient(T::OPERATION, "RepeatedNextToken", why));
                }
                token = Some(next);
            }
            _ => return Ok(items),
        }
    }
    let why = format!("more than {MAX_PAGES} pages: the listing does not end");
    Err(Ec2Error::transient(T::OPERATION, "TooManyPages", why))
}

#[cfg(test)]
mod pages_tests {
    use super::*;

    fn vpc(i: usize) -> Vpc {
        Vpc {
            id: format!("vpc-{i}"),
            primary_cidr: "10.0.0.0/16".parse().unwrap(),
            secondary_cidrs: Vec::new(),
        }
    }

    /// Pages that end, one token each: every item, in order.
    #[tokio::test]
    async fn every_page_is_walked() {
        let got = collect_pages(|t: Option<String>| async move {
            let n: usize = t.map_or(0, |t| t.parse().unwrap());
            Ok(Page {
                items: vec![vpc(n)],
                next_token: (n < 2).then(|| (n + 1).to_string()),
            })
        })
        .await
        .unwrap();
        let ids: Vec<_> = got.into_iter().map(|v| v.id).collect();
        assert_eq!(ids, ["vpc-0", "vpc-1", "vpc-2"]);
    }

    /// An endpoint that hands a token back again, or never stops: an error naming the call,
    /// not a pass or refresh that never ends (before: an endless loop).
    #[tokio::test]
    async fn a_repeated_token_or_an_endless_listing_is_an_error() {
        let circle = collect_pages(|t: Option<String>| async move {
            let next = if t.as_deref() == Some("a") { "b" } else { "a" };
            Ok(Page {
                items: vec![vpc(0)],
                next_token: Some(next.to_string()),
            })
        })
        .await
        .unwrap_err();
        assert_eq!(circle.operation, Operation::DescribeVpcs);
        assert_eq!(circle.code, "RepeatedNextToken");

        let mut calls = 0usize;
        let endless = collect_pages(|_| {
            calls += 1;
            let next = calls.to_string();
            async move {
                Ok(Page::<Vpc> {
                    items: Vec::new(),
                    next_token: Some(next),
                })
            }
        })
        .await
        .unwrap_err();
        assert_eq!(endless.code, "TooManyPages");
        assert_eq!(calls, MAX_PAGES);
    }
}
