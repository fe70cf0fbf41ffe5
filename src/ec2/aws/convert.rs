//! aws-sdk-ec2's types and errors to ours, and our filters to the SDK's.

use std::net::Ipv4Addr;

use aws_sdk_ec2::config::http::HttpResponse;
use aws_sdk_ec2::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use aws_sdk_ec2::types as sdk;
use ipnet::Ipv4Net;

use crate::ec2::Ec2Error;
use crate::ec2::model::*;

/// One SDK request sent: its answer, or its error as ours ([`map_err`]).
pub(super) async fn send<T, E>(
    op: Operation,
    request: impl Future<Output = Result<T, SdkError<E, HttpResponse>>>,
) -> crate::ec2::Result<T>
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
{
    request.await.map_err(|e| map_err(op, e))
}

/// SDK error -> typed error. Service answers are classified by code, message and HTTP status;
/// failures without an answer are transient.
pub(super) fn map_err<E>(op: Operation, err: SdkError<E, HttpResponse>) -> Ec2Error
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
{
    let status = err.raw_response().map(|r| r.status().as_u16());
    // Never the SDK error's Debug text: it holds the raw HTTP answer and request IDs, which
    // differ on every failure and would rewrite the node's operator-status (and send an Event)
    // on every failed pass. Ec2Error bounds and cleans what is left (error::stable_message).
    let context = || DisplayErrorContext(&err).to_string();
    match &err {
        SdkError::TimeoutError(_) => {
            Ec2Error::transient(op, "Timeout", "no answer within the timeout")
        }
        SdkError::DispatchFailure(_) => Ec2Error::transient(op, "Dispatch", context()),
        SdkError::ConstructionFailure(_) => Ec2Error::new(
            op,
            crate::ec2::ErrorKind::Other,
            "ConstructionFailure",
            context(),
        ),
        // An answer the SDK could not parse (moto answers unknown filters with HTML 500):
        // classified by its HTTP status, described by it alone.
        SdkError::ResponseError(_) => {
            let mut e = Ec2Error::from_aws(op, "ResponseError", &format!("{err:?}"), status);
            e.message = match status {
                Some(s) => format!("an answer the SDK could not read (HTTP {s})"),
                None => "an answer the SDK could not read".into(),
            };
            e
        }
        _ => Ec2Error::from_aws(
            op,
            err.code().unwrap_or("Unknown"),
            err.message().unwrap_or_default(),
            status,
        ),
    }
}

pub(super) fn filter(name: &str, values: impl IntoIterator<Item = String>) -> sdk::Filter {
    sdk::Filter::builder()
        .name(name)
        .set_values(Some(values.into_iter().collect()))
        .build()
}

/// `vpc-id` + one `tag:<key>` per tag.
pub(super) fn common_filters(vpc_id: &Option<String>, tags: &Tags) -> Vec<sdk::Filter> {
    let mut filters = Vec::new();
    if let Some(vpc) = vpc_id {
        filters.push(filter("vpc-id", [vpc.clone()]));
    }
    for (k, v) in tags {
        filters.push(filter(&format!("tag:{k}"), [v.clone()]));
    }
    filters
}

pub(super) fn non_empty<T>(v: Vec<T>) -> Option<Vec<T>> {
    (!v.is_empty()).then_some(v)
}

pub(super) fn tags(list: &[sdk::Tag]) -> Tags {
    list.iter()
        .filter_map(|t| {
            Some((
                t.key()?.to_string(),
                t.value().unwrap_or_default().to_string(),
            ))
        })
        .collect()
}

pub(super) fn s(v: Option<&str>) -> String {
    v.unwrap_or_default().to_string()
}

pub(super) fn ip(v: Option<&str>) -> Option<Ipv4Addr> {
    v?.parse().ok()
}

pub(super) fn net(v: Option<&str>) -> Option<Ipv4Net> {
    v?.parse().ok()
}

pub(super) fn u(v: Option<i32>) -> u32 {
    v.unwrap_or(0).max(0) as u32
}

pub(super) fn instance_type_limits(info: &sdk::InstanceTypeInfo) -> InstanceTypeLimits {
    let net_info = info.network_info();
    InstanceTypeLimits {
        instance_type: info
            .instance_type()
            .map(|t| t.as_str().to_string())
            .unwrap_or_default(),
        max_enis: u(net_info.and_then(|n| n.maximum_network_interfaces())),
        ipv4_per_eni: u(net_info.and_then(|n| n.ipv4_addresses_per_interface())),
        ipv6_per_eni: u(net_info.and_then(|n| n.ipv6_addresses_per_interface())),
        nitro: info.hypervisor() == Some(&sdk::InstanceTypeHypervisor::Nitro),
        bare_metal: info.bare_metal().unwrap_or(false),
        enis_per_card: enis_per_card(net_info.map(|n| n.network_cards()).unwrap_or_default()),
    }
}

/// `NetworkCards[].MaximumNetworkInterfaces` placed by `NetworkCardIndex` (a card EC2 does not
/// list takes none).
pub(super) fn enis_per_card(cards: &[sdk::NetworkCardInfo]) -> Vec<u32> {
    let mut out = Vec::new();
    for c in cards {
        let i = u(c.network_card_index()) as usize;
        if i >= out.len() {
            out.resize(i + 1, 0);
        }
        out[i] = u(c.maximum_network_interfaces());
    }
    out
}

pub(super) fn instance(i: &sdk::Instance) -> Instance {
    Instance {
        id: s(i.instance_id()),
        instance_type: i
            .instance_type()
            .map(|t| t.as_str().to_string())
            .unwrap_or_default(),
        state: i
            .state()
            .and_then(|st| st.name())
            .map(|n| InstanceState::parse(n.as_str()))
            .unwrap_or(InstanceState::Unknown),
        availability_zone: s(i.placement().and_then(|p| p.availability_zone())),
        vpc_id: s(i.vpc_id()),
        subnet_id: s(i.subnet_id()),
        tags: tags(i.tags()),
    }
}

pub(super) fn network_interface(n: &sdk::NetworkInterface) -> NetworkInterface {
    let addrs = n.private_ip_addresses();
    let primary_ip = addrs
        .iter()
        .find(|a| a.primary() == Some(true))
        .and_then(|a| ip(a.private_ip_address()))
        .or_else(|| ip(n.private_ip_address()))
        .unwrap_or(Ipv4Addr::UNSPECIFIED);
    // An ENI holds an address once. moto 5.2.5's CreateNetworkInterface draws
    // `SecondaryPrivateIpAddressCount` addresses at random without that check
    // (`moto/ec2/models/elastic_network_interfaces.py`: a list comprehension of
    // `random_private_ip`), so a listing can repeat one: counted twice, the node looked served
    // one address short of what its agent saw (e2e multi-pool-ips, once under Cilium's CRD).
    let mut seen = std::collections::BTreeSet::from([primary_ip]);
    let secondary_ips = addrs
        .iter()
        .filter(|a| a.primary() != Some(true))
        .filter_map(|a| ip(a.private_ip_address()))
        .filter(|a| seen.insert(*a))
        .collect();
    NetworkInterface {
        id: s(n.network_interface_id()),
        subnet_id: s(n.subnet_id()),
        vpc_id: s(n.vpc_id()),
        availability_zone: s(n.availability_zone()),
        mac: s(n.mac_address()),
        description: s(n.description()),
        primary_ip,
        secondary_ips,
        prefixes: n
            .ipv4_prefixes()
            .iter()
            .filter_map(|p| net(p.ipv4_prefix()))
            .collect(),
        ipv6_prefixes: n
            .ipv6_prefixes()
            .iter()
            .filter_map(|p| p.ipv6_prefix().map(str::to_string))
            .collect(),
        security_groups: n
            .groups()
            .iter()
            .filter_map(|g| g.group_id().map(str::to_string))
            .collect(),
        tags: tags(n.tag_set()),
        state: n
            .status()
            .map(|st| EniState::parse(st.as_str()))
            .unwrap_or(EniState::Unknown),
        attachment: n.attachment().and_then(|a| {
            Some(Attachment {
                id: a.attachment_id()?.to_string(),
                instance_id: s(a.instance_id()),
                device_index: u(a.device_index()),
                delete_on_termination: a.delete_on_termination().unwrap_or(false),
                network_card_index: u(a.network_card_index()),
            })
        }),
        interface_type: n
            .interface_type()
            .map(|t| InterfaceType::parse(t.as_str()))
            .unwrap_or_default(),
        public_ip: n
            .association()
            .and_then(|a| a.public_ip())
            .map(str::to_string),
    }
}

pub(super) fn subnet(sn: &sdk::Subnet) -> Option<Subnet> {
    Some(Subnet {
        id: s(sn.subnet_id()),
        vpc_id: s(sn.vpc_id()),
        availability_zone: s(sn.availability_zone()),
        cidr: net(sn.cidr_block())?,
        available_addresses: u(sn.available_ip_address_count()),
        tags: tags(sn.tags()),
    })
}

pub(super) fn vpc(v: &sdk::Vpc) -> Option<Vpc> {
    let primary_cidr = net(v.cidr_block())?;
    let secondary_cidrs = v
        .cidr_block_association_set()
        .iter()
        .filter(|a| {
            a.cidr_block_state().and_then(|st| st.state())
                == Some(&sdk::VpcCidrBlockStateCode::Associated)
        })
        .filter_map(|a| net(a.cidr_block()))
        .filter(|c| *c != primary_cidr)
        .collect();
    Some(Vpc {
        id: s(v.vpc_id()),
        primary_cidr,
        secondary_cidrs,
    })
}

pub(super) fn route_table(rt: &sdk::RouteTable) -> RouteTable {
    let assocs = rt.associations();
    RouteTable {
        id: s(rt.route_table_id()),
        vpc_id: s(rt.vpc_id()),
        main: assocs.iter().any(|a| a.main() == Some(true)),
        subnet_ids: assocs
            .iter()
            .filter_map(|a| a.subnet_id().map(str::to_string))
            .collect(),
    }
}

pub(super) fn page<T>(items: Vec<T>, next: Option<&str>) -> Page<T> {
    Page {
        items,
        next_token: next.filter(|t| !t.is_empty()).map(str::to_string),
    }
}

/// A VPC Elastic IP (one without an allocation ID or public IP is skipped).
pub(super) fn address(a: &sdk::Address) -> Option<Address> {
    Some(Address {
        allocation_id: a.allocation_id()?.to_string(),
        public_ip: ip(a.public_ip())?,
        association_id: a
            .association_id()
            .filter(|id| !id.is_empty())
            .map(str::to_string),
        network_interface_id: a
            .network_interface_id()
            .filter(|id| !id.is_empty())
            .map(str::to_string),
        private_ip: ip(a.private_ip_address()),
        tags: tags(a.tags()),
    })
}
