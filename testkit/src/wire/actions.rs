//! One function per EC2 action: parameters in (see `query`), the simulator's call, the answer's
//! XML out. Shapes follow the EC2 API reference (2016-11-15) for the fields the SDK reads.

use std::net::Ipv4Addr;

use eni_operator::ec2::Ec2;
use eni_operator::ec2::model::*;
use ipnet::Ipv4Net;

use super::query::Params;
use super::xml::Xml;
use super::{Answer, Body, WireError};
use crate::sim::{Simulator, resume_token};

/// The account ID every resource is owned by.
pub(super) const OWNER: &str = "000000000000";

fn body(f: impl FnOnce(&mut Xml) + Send + 'static) -> Answer {
    Ok(Box::new(f) as Body)
}

fn invalid(what: &str, value: &str) -> WireError {
    WireError::client(
        "InvalidParameterValue",
        format!("Invalid value '{value}' for {what}"),
    )
}

fn cidr(p: &Params, key: &str) -> Result<Ipv4Net, WireError> {
    let v = p.require(key)?;
    v.parse().map_err(|_| invalid(key, v))
}

fn return_true() -> Answer {
    body(|x| {
        x.leaf("return", "true");
    })
}

// ---- describes ----

/// The filters every describe takes (`vpc-id`, `tag:<key>`), and the action's own through
/// `other` (which answers false for a name it does not know). AWS answers an unknown filter
/// with `InvalidParameterValue`. The simulator matches one value per filter.
struct Filters {
    vpc_id: Option<String>,
    tags: Tags,
}

fn filters(
    p: &Params,
    mut other: impl FnMut(&str, &[String]) -> Result<bool, WireError>,
) -> Result<Filters, WireError> {
    let mut f = Filters {
        vpc_id: None,
        tags: Tags::new(),
    };
    for (name, values) in p.filters() {
        if other(&name, &values)? {
            continue;
        }
        let single = || match values.as_slice() {
            [v] => Ok(v.clone()),
            _ => Err(WireError::client(
                "InvalidParameterValue",
                format!("ec2-sim matches exactly one value of the filter '{name}'"),
            )),
        };
        if name == "vpc-id" {
            f.vpc_id = Some(single()?);
        } else if let Some(key) = name.strip_prefix("tag:") {
            f.tags.insert(key.to_owned(), single()?);
        } else {
            return Err(WireError::client(
                "InvalidParameterValue",
                format!("The filter '{name}' is invalid"),
            ));
        }
    }
    Ok(f)
}

/// `MaxResults`: AWS refuses it together with IDs, and outside 5..=1000.
fn max_results(p: &Params, has_ids: bool) -> Result<Option<usize>, WireError> {
    let Some(n) = p.int("MaxResults")? else {
        return Ok(None);
    };
    if has_ids {
        return Err(WireError::client(
            "InvalidParameterCombination",
            "The parameter MaxResults cannot be used with the parameter of IDs",
        ));
    }
    if !(5..=1000).contains(&n) {
        return Err(WireError::client(
            "InvalidParameterValue",
            format!(
                "Value ( {n} ) for parameter maxResults is invalid. Expecting a value between 5 and 1000."
            ),
        ));
    }
    Ok(Some(n as usize))
}

/// The simulator's page, cut to `MaxResults` when that is smaller (with a token resuming
/// after the last item kept: the simulator's tokens are keyed by ID).
fn cut<T>(mut page: Page<T>, max: Option<usize>, key: impl Fn(&T) -> &str) -> Page<T> {
    if let Some(max) = max
        && page.items.len() > max
    {
        page.items.truncate(max);
        page.next_token = page.items.last().map(|i| resume_token(key(i)));
    }
    page
}

fn token(p: &Params) -> Option<String> {
    p.get("NextToken")
        .filter(|t| !t.is_empty())
        .map(str::to_owned)
}

fn next_token(x: &mut Xml, token: Option<String>) {
    x.opt("nextToken", token);
}

/// A describe's answer: the page's items under `set`, each written by `item`, and the token.
fn page_body<T: Send + 'static>(
    set: &'static str,
    page: Page<T>,
    item: impl FnMut(&mut Xml, &T) + Send + 'static,
) -> Answer {
    body(move |x| {
        x.list(set, &page.items, item);
        next_token(x, page.next_token);
    })
}

pub async fn describe_instance_types(sim: &Simulator, p: &Params) -> Answer {
    let types = p.list("InstanceType");
    let max = max_results(p, !types.is_empty())?;
    let page = sim.describe_instance_types(&types, token(p)).await?;
    let page = cut(page, max, |t| &t.instance_type);
    page_body("instanceTypeSet", page, |x, t| {
        x.leaf("instanceType", &t.instance_type)
            .leaf("hypervisor", if t.nitro { "nitro" } else { "xen" })
            .leaf("bareMetal", t.bare_metal)
            .node("networkInfo", |x| {
                x.leaf("maximumNetworkInterfaces", t.max_enis)
                    .leaf("ipv4AddressesPerInterface", t.ipv4_per_eni)
                    .leaf("ipv6AddressesPerInterface", t.ipv6_per_eni)
                    .leaf("maximumNetworkCards", t.enis_per_card.len().max(1));
                // EC2 lists every card, a single-card type too.
                let cards: Vec<(usize, u32)> = if t.enis_per_card.is_empty() {
                    vec![(0, t.max_enis)]
                } else {
                    t.enis_per_card.iter().copied().enumerate().collect()
                };
                x.list("networkCards", &cards, |x, &(i, n)| {
                    x.leaf("networkCardIndex", i)
                        .leaf("maximumNetworkInterfaces", n);
                });
            });
    })
}

fn state_code(s: InstanceState) -> (u32, &'static str) {
    match s {
        InstanceState::Pending => (0, "pending"),
        InstanceState::Running => (16, "running"),
        InstanceState::ShuttingDown => (32, "shutting-down"),
        InstanceState::Terminated => (48, "terminated"),
        InstanceState::Stopping => (64, "stopping"),
        InstanceState::Stopped => (80, "stopped"),
        InstanceState::Unknown => (0, "pending"),
    }
}

fn instance_state(x: &mut Xml, name: &str, s: InstanceState) {
    let (code, text) = state_code(s);
    x.node(name, |x| {
        x.leaf("code", code).leaf("name", text);
    });
}

fn instance_xml(x: &mut Xml, i: &Instance) {
    x.leaf("instanceId", &i.id)
        .leaf("imageId", "ami-ec2sim")
        .leaf("instanceType", &i.instance_type);
    instance_state(x, "instanceState", i.state);
    x.node("placement", |x| {
        x.leaf("availabilityZone", &i.availability_zone)
            .leaf("tenancy", "default");
    })
    .leaf("subnetId", &i.subnet_id)
    .leaf("vpcId", &i.vpc_id)
    .tags(&i.tags);
}

/// One reservation per instance, as separate `RunInstances` calls make them.
fn reservations(x: &mut Xml, instances: &[Instance]) {
    x.list("reservationSet", instances, |x, i| {
        x.leaf("reservationId", i.id.replacen("i-", "r-", 1))
            .leaf("ownerId", OWNER)
            .list("instancesSet", [i], instance_xml);
    });
}

pub async fn describe_instances(sim: &Simulator, p: &Params) -> Answer {
    let ids = p.list("InstanceId");
    let max = max_results(p, !ids.is_empty())?;
    let f = filters(p, |_, _| Ok(false))?;
    let filter = InstanceFilter {
        ids,
        vpc_id: f.vpc_id,
        tags: f.tags,
    };
    let page = cut(sim.describe_instances(&filter, token(p)).await?, max, |i| {
        &i.id
    });
    body(move |x| {
        reservations(x, &page.items);
        next_token(x, page.next_token);
    })
}

fn eni_xml(x: &mut Xml, e: &NetworkInterface) {
    x.leaf("networkInterfaceId", &e.id)
        .leaf("subnetId", &e.subnet_id)
        .leaf("vpcId", &e.vpc_id)
        .leaf("availabilityZone", &e.availability_zone)
        .leaf("description", &e.description)
        .leaf("ownerId", OWNER)
        .leaf("requesterManaged", false)
        .leaf("status", e.state.as_str())
        .leaf("macAddress", &e.mac)
        .leaf("sourceDestCheck", true)
        .leaf("interfaceType", e.interface_type.as_str())
        .list("groupSet", &e.security_groups, |x, g| {
            x.leaf("groupId", g).leaf("groupName", g);
        });
    if let Some(a) = &e.attachment {
        let status = match e.state {
            EniState::Attaching => "attaching",
            EniState::Detaching => "detaching",
            _ => "attached",
        };
        x.node("attachment", |x| {
            x.leaf("attachmentId", &a.id)
                .leaf("instanceId", &a.instance_id)
                .leaf("instanceOwnerId", OWNER)
                .leaf("deviceIndex", a.device_index)
                .leaf("networkCardIndex", a.network_card_index)
                .leaf("status", status)
                .leaf("deleteOnTermination", a.delete_on_termination);
        });
    }
    if let Some(ip) = &e.public_ip {
        x.node("association", |x| {
            x.leaf("publicIp", ip).leaf("ipOwnerId", OWNER);
        });
    }
    x.tags(&e.tags);
    // An `efa-only` interface has no IPv4 address at all.
    let primary = (!e.primary_ip.is_unspecified()).then_some((e.primary_ip, true));
    if primary.is_some() {
        x.leaf("privateIpAddress", e.primary_ip);
    }
    let addresses = primary
        .into_iter()
        .chain(e.secondary_ips.iter().map(|ip| (*ip, false)));
    x.list("privateIpAddressesSet", addresses, |x, (ip, primary)| {
        x.leaf("privateIpAddress", ip).leaf("primary", primary);
    })
    .list("ipv4PrefixSet", &e.prefixes, |x, p| {
        x.leaf("ipv4Prefix", p);
    })
    .list("ipv6PrefixSet", &e.ipv6_prefixes, |x, p| {
        x.leaf("ipv6Prefix", p);
    });
}

/// AWS's filter values: `*` matches any run of characters, `?` one; otherwise equality.
pub(super) fn glob(pattern: &str, text: &str) -> bool {
    fn go(p: &[char], t: &[char]) -> bool {
        match p.split_first() {
            None => t.is_empty(),
            Some(('*', rest)) => (0..=t.len()).any(|i| go(rest, &t[i..])),
            Some(('?', rest)) => !t.is_empty() && go(rest, &t[1..]),
            Some((c, rest)) => t.first() == Some(c) && go(rest, &t[1..]),
        }
    }
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = text.chars().collect();
    go(&p, &t)
}

fn is_glob(v: &str) -> bool {
    v.contains(['*', '?'])
}

/// The fields an ENI filter names (EC2 API reference, DescribeNetworkInterfaces, "Filter"),
/// or `None` for a filter name AWS does not know.
fn eni_field(e: &NetworkInterface, name: &str) -> Option<Vec<String>> {
    let att = e.attachment.as_ref();
    let ips = || {
        std::iter::once(e.primary_ip)
            .chain(e.secondary_ips.iter().copied())
            .map(|ip| ip.to_string())
            .collect()
    };
    Some(match name {
        "network-interface-id" => vec![e.id.clone()],
        "vpc-id" => vec![e.vpc_id.clone()],
        "subnet-id" => vec![e.subnet_id.clone()],
        "availability-zone" => vec![e.availability_zone.clone()],
        "description" => vec![e.description.clone()],
        "mac-address" => vec![e.mac.clone()],
        "owner-id" => vec![OWNER.to_owned()],
        "status" => vec![e.state.as_str().to_owned()],
        "interface-type" => vec!["interface".to_owned()],
        "requester-managed" => vec!["false".to_owned()],
        "source-dest-check" => vec!["true".to_owned()],
        "group-id" | "group-name" => e.security_groups.clone(),
        "private-ip-address" | "addresses.private-ip-address" => ips(),
        "addresses.primary" => vec!["true".to_owned(), "false".to_owned()],
        "ipv4-prefix" => e.prefixes.iter().map(|p| p.to_string()).collect(),
        "tag-key" => e.tags.keys().cloned().collect(),
        "tag-value" => e.tags.values().cloned().collect(),
        "attachment.instance-id" => att.map(|a| a.instance_id.clone()).into_iter().collect(),
        "attachment.attachment-id" => att.map(|a| a.id.clone()).into_iter().collect(),
        "attachment.device-index" => att
            .map(|a| a.device_index.to_string())
            .into_iter()
            .collect(),
        "attachment.network-card-index" => att.map(|_| "0".to_owned()).into_iter().collect(),
        "attachment.instance-owner-id" => att.map(|_| OWNER.to_owned()).into_iter().collect(),
        "attachment.delete-on-termination" => att
            .map(|a| a.delete_on_termination.to_string())
            .into_iter()
            .collect(),
        "attachment.status" => att
            .map(|_| {
                match e.state {
                    EniState::Attaching => "attaching",
                    EniState::Detaching => "detaching",
                    _ => "attached",
                }
                .to_owned()
            })
            .into_iter()
            .collect(),
        n => match n.strip_prefix("tag:") {
            Some(k) => e.tags.get(k).cloned().into_iter().collect(),
            None => return None,
        },
    })
}

/// `DescribeNetworkInterfaces` with every filter AWS documents for the fields ec2-sim holds,
/// several values per filter (any matches) and `*`/`?` wildcards. Filters the simulator's own
/// path takes (one exact value) narrow the listing there; every filter is then applied to the
/// page, as AWS applies filters after paging (a page may come back short, even empty, with a
/// `nextToken`).
pub async fn describe_network_interfaces(sim: &Simulator, p: &Params) -> Answer {
    let ids = p.list("NetworkInterfaceId");
    let max = max_results(p, !ids.is_empty())?;
    let all = p.filters();
    let probe = NetworkInterface {
        id: String::new(),
        subnet_id: String::new(),
        vpc_id: String::new(),
        availability_zone: String::new(),
        mac: String::new(),
        description: String::new(),
        primary_ip: std::net::Ipv4Addr::UNSPECIFIED,
        secondary_ips: vec![],
        prefixes: vec![],
        ipv6_prefixes: vec![],
        security_groups: vec![],
        tags: Tags::new(),
        state: EniState::Available,
        attachment: None,
        public_ip: None,
        interface_type: Default::default(),
    };
    let mut filter = EniFilter {
        ids,
        ..EniFilter::default()
    };
    for (name, values) in &all {
        if eni_field(&probe, name).is_none() {
            return Err(WireError::client(
                "InvalidParameterValue",
                format!("The filter '{name}' is invalid"),
            ));
        }
        let exact = match values.as_slice() {
            [v] if !is_glob(v) => Some(v.clone()),
            _ => None,
        };
        match (name.as_str(), exact) {
            ("attachment.instance-id", _) if !values.iter().any(|v| is_glob(v)) => {
                filter.instance_ids.extend(values.iter().cloned())
            }
            ("subnet-id", _) if !values.iter().any(|v| is_glob(v)) => {
                filter.subnet_ids.extend(values.iter().cloned())
            }
            ("vpc-id", Some(v)) => filter.vpc_id = Some(v),
            ("status", Some(v)) => {
                let s = EniState::parse(&v);
                if s == EniState::Unknown {
                    return Err(invalid("status", &v));
                }
                filter.state = Some(s);
            }
            (n, Some(v)) if n.starts_with("tag:") => {
                filter.tags.insert(n["tag:".len()..].to_owned(), v);
            }
            _ => {}
        }
    }
    let mut page = cut(
        sim.describe_network_interfaces(&filter, token(p)).await?,
        max,
        |e| &e.id,
    );
    page.items.retain(|e| {
        all.iter().all(|(name, values)| {
            let have = eni_field(e, name).unwrap_or_default();
            values.iter().any(|v| have.iter().any(|h| glob(v, h)))
        })
    });
    page_body("networkInterfaceSet", page, eni_xml)
}

fn resource_filter(
    p: &Params,
    ids_key: &str,
) -> Result<(ResourceFilter, Option<usize>), WireError> {
    let ids = p.list(ids_key);
    let max = max_results(p, !ids.is_empty())?;
    let f = filters(p, |_, _| Ok(false))?;
    Ok((
        ResourceFilter {
            ids,
            vpc_id: f.vpc_id,
            tags: f.tags,
        },
        max,
    ))
}

fn subnet_xml(x: &mut Xml, s: &Subnet) {
    x.leaf("subnetId", &s.id)
        .leaf(
            "subnetArn",
            format!("arn:aws:ec2:us-east-1:{OWNER}:subnet/{}", s.id),
        )
        .leaf("state", "available")
        .leaf("vpcId", &s.vpc_id)
        .leaf("ownerId", OWNER)
        .leaf("cidrBlock", s.cidr)
        .leaf("availableIpAddressCount", s.available_addresses)
        .leaf("availabilityZone", &s.availability_zone)
        .leaf("defaultForAz", false)
        .leaf("mapPublicIpOnLaunch", false)
        .tags(&s.tags);
}

pub async fn describe_subnets(sim: &Simulator, p: &Params) -> Answer {
    let (filter, max) = resource_filter(p, "SubnetId")?;
    let page = cut(sim.describe_subnets(&filter, token(p)).await?, max, |s| {
        &s.id
    });
    page_body("subnetSet", page, subnet_xml)
}

fn vpc_xml(x: &mut Xml, v: &Vpc) {
    x.leaf("vpcId", &v.id)
        .leaf("ownerId", OWNER)
        .leaf("state", "available")
        .leaf("cidrBlock", v.primary_cidr)
        .leaf("isDefault", false)
        .leaf("instanceTenancy", "default");
    let blocks = std::iter::once(&v.primary_cidr).chain(&v.secondary_cidrs);
    x.list(
        "cidrBlockAssociationSet",
        blocks.enumerate(),
        |x, (n, c)| {
            x.leaf("associationId", format!("{}-cidr-assoc-{n}", v.id))
                .leaf("cidrBlock", c)
                .node("cidrBlockState", |x| {
                    x.leaf("state", "associated");
                });
        },
    )
    .tags(&Tags::new());
}

pub async fn describe_vpcs(sim: &Simulator, p: &Params) -> Answer {
    // `vpc-id` is the VPC's own ID here.
    let (mut filter, max) = resource_filter(p, "VpcId")?;
    if let Some(v) = filter.vpc_id.take()
        && !filter.ids.contains(&v)
    {
        filter.ids.push(v);
    }
    let page = cut(sim.describe_vpcs(&filter, token(p)).await?, max, |v| &v.id);
    page_body("vpcSet", page, vpc_xml)
}

pub async fn describe_security_groups(sim: &Simulator, p: &Params) -> Answer {
    let (filter, max) = resource_filter(p, "GroupId")?;
    let page = cut(
        sim.describe_security_groups(&filter, token(p)).await?,
        max,
        |g| &g.id,
    );
    page_body("securityGroupInfo", page, |x, g| {
        x.leaf("ownerId", OWNER)
            .leaf("groupId", &g.id)
            .leaf("groupName", &g.id)
            .leaf("groupDescription", "ec2-sim")
            .leaf("vpcId", &g.vpc_id)
            .tags(&g.tags);
    })
}

pub async fn describe_route_tables(sim: &Simulator, p: &Params) -> Answer {
    let (filter, max) = resource_filter(p, "RouteTableId")?;
    let page = cut(
        sim.describe_route_tables(&filter, token(p)).await?,
        max,
        |r| &r.id,
    );
    page_body("routeTableSet", page, |x, r| {
        x.leaf("routeTableId", &r.id)
            .leaf("vpcId", &r.vpc_id)
            .leaf("ownerId", OWNER);
        let mains = r.main.then_some(None);
        let assocs = mains
            .into_iter()
            .chain(r.subnet_ids.iter().map(Some))
            .enumerate();
        x.list("associationSet", assocs, |x, (n, subnet)| {
            x.leaf("routeTableAssociationId", format!("{}-assoc-{n}", r.id))
                .leaf("routeTableId", &r.id)
                .leaf("main", subnet.is_none())
                .opt("subnetId", subnet);
        })
        .tags(&Tags::new());
    })
}

// ---- the operator's mutating calls ----

fn count(p: &Params, key: &str) -> Result<Option<u32>, WireError> {
    match p.int(key)? {
        Some(n) if n < 0 => Err(invalid(key, &n.to_string())),
        other => Ok(other.map(|n| n as u32)),
    }
}

/// `SecondaryPrivateIpAddressCount` or `Ipv4PrefixCount` (AWS refuses both at once).
fn address_request(p: &Params) -> Result<AddressRequest, WireError> {
    let ips = count(p, "SecondaryPrivateIpAddressCount")?;
    let prefixes = count(p, "Ipv4PrefixCount")?;
    let explicit = !p.list("PrivateIpAddress").is_empty() || !p.list("Ipv4Prefix").is_empty();
    if explicit {
        return Err(WireError::client(
            "InvalidParameterValue",
            "ec2-sim assigns by count only (SecondaryPrivateIpAddressCount or Ipv4PrefixCount)",
        ));
    }
    match (ips, prefixes) {
        (Some(_), Some(_)) => Err(WireError::client(
            "InvalidParameterCombination",
            "SecondaryPrivateIpAddressCount and Ipv4PrefixCount cannot be combined",
        )),
        (_, Some(n)) => Ok(AddressRequest::Prefixes(n)),
        (n, None) => Ok(AddressRequest::Ips(n.unwrap_or(0))),
    }
}

pub async fn create_network_interface(sim: &Simulator, p: &Params) -> Answer {
    let request = CreateEniRequest {
        subnet_id: p.require("SubnetId")?.to_owned(),
        security_groups: p.list("SecurityGroupId"),
        description: p.get("Description").unwrap_or_default().to_owned(),
        tags: p.tag_specification("network-interface"),
        addresses: address_request(p)?,
        client_token: p.get("ClientToken").unwrap_or_default().to_owned(),
    };
    let eni = sim.create_network_interface(&request).await?;
    let token = request.client_token;
    body(move |x| {
        x.node("networkInterface", |x| eni_xml(x, &eni));
        if !token.is_empty() {
            x.leaf("clientToken", token);
        }
    })
}

pub async fn attach_network_interface(sim: &Simulator, p: &Params) -> Answer {
    let eni = p.require("NetworkInterfaceId")?;
    let instance = p.require("InstanceId")?;
    let index = count(p, "DeviceIndex")?.ok_or_else(|| {
        WireError::client(
            "MissingParameter",
            "The request must contain the parameter DeviceIndex",
        )
    })?;
    if count(p, "NetworkCardIndex")?.unwrap_or(0) != 0 {
        return Err(WireError::client(
            "InvalidParameterValue",
            "ec2-sim models network card 0 only",
        ));
    }
    let attachment = sim.attach_network_interface(eni, instance, index).await?;
    body(move |x| {
        x.leaf("attachmentId", attachment)
            .leaf("networkCardIndex", 0);
    })
}

pub async fn modify_network_interface_attribute(sim: &Simulator, p: &Params) -> Answer {
    let eni = p.require("NetworkInterfaceId")?;
    let attachment = p.require("Attachment.AttachmentId")?;
    let Some(delete) = p.bool("Attachment.DeleteOnTermination") else {
        return Err(WireError::client(
            "InvalidParameterValue",
            "ec2-sim modifies Attachment.DeleteOnTermination only",
        ));
    };
    sim.set_delete_on_termination(eni, attachment, delete)
        .await?;
    return_true()
}

pub async fn assign_private_ip_addresses(sim: &Simulator, p: &Params) -> Answer {
    let eni = p.require("NetworkInterfaceId")?.to_owned();
    let request = address_request(p)?;
    let got = sim.assign_private_ip_addresses(&eni, request).await?;
    body(move |x| {
        x.leaf("networkInterfaceId", &eni)
            .list("assignedPrivateIpAddressesSet", &got.ips, |x, ip| {
                x.leaf("privateIpAddress", ip);
            })
            .list("assignedIpv4PrefixSet", &got.prefixes, |x, p| {
                x.leaf("ipv4Prefix", p);
            });
        x.leaf("return", "true");
    })
}

pub async fn unassign_private_ip_addresses(sim: &Simulator, p: &Params) -> Answer {
    let eni = p.require("NetworkInterfaceId")?;
    let ips = p
        .list("PrivateIpAddress")
        .iter()
        .map(|a| {
            a.parse::<Ipv4Addr>()
                .map_err(|_| invalid("PrivateIpAddress", a))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let prefixes = p
        .list("Ipv4Prefix")
        .iter()
        .map(|a| a.parse::<Ipv4Net>().map_err(|_| invalid("Ipv4Prefix", a)))
        .collect::<Result<Vec<_>, _>>()?;
    // One call is one kind on AWS; the trait's call meters each non-empty kind once.
    match (ips.is_empty(), prefixes.is_empty()) {
        (true, true) => {
            return Err(WireError::client(
                "MissingParameter",
                "The request must contain the parameter PrivateIpAddress or Ipv4Prefix",
            ));
        }
        (false, false) => {
            return Err(WireError::client(
                "InvalidParameterCombination",
                "PrivateIpAddress and Ipv4Prefix cannot be combined",
            ));
        }
        _ => {}
    }
    sim.unassign_private_ip_addresses(eni, &ips, &prefixes)
        .await?;
    return_true()
}

pub async fn detach_network_interface(sim: &Simulator, p: &Params) -> Answer {
    let attachment = p.require("AttachmentId")?;
    let force = p.bool("Force").unwrap_or(false);
    sim.detach_network_interface(attachment, force).await?;
    return_true()
}

pub async fn delete_network_interface(sim: &Simulator, p: &Params) -> Answer {
    sim.delete_network_interface(p.require("NetworkInterfaceId")?)
        .await?;
    return_true()
}

// ---- Elastic IPs (static IPs: Cilium's `spec.ipam.static-ip-tags`, ours) ----

/// `DescribeAddresses` with `tag:KEY` filters (AWS: every other filter too; ec2-sim: tags).
pub async fn describe_addresses(sim: &Simulator, p: &Params) -> Answer {
    let f = filters(p, |_, _| Ok(false))?;
    if f.vpc_id.is_some() {
        return Err(WireError::client(
            "InvalidParameterValue",
            "The filter 'vpc-id' is invalid",
        ));
    }
    let ids = p.list("AllocationId");
    let addresses: Vec<Address> = sim
        .describe_addresses(&f.tags)
        .await?
        .into_iter()
        .filter(|a| ids.is_empty() || ids.contains(&a.allocation_id))
        .collect();
    body(move |x| {
        x.list("addressesSet", &addresses, |x, a| {
            x.leaf("publicIp", a.public_ip)
                .leaf("allocationId", &a.allocation_id)
                .leaf("domain", "vpc")
                .opt("associationId", a.association_id.as_ref())
                .opt("networkInterfaceId", a.network_interface_id.as_ref())
                .opt("privateIpAddress", a.private_ip)
                .leaf("networkInterfaceOwnerId", OWNER)
                .tags(&a.tags);
        });
    })
}

/// `AssociateAddress` of an allocation with an ENI's private address (the ENI's primary when
/// none is named, as AWS).
pub async fn associate_address(sim: &Simulator, p: &Params) -> Answer {
    let allocation = p.require("AllocationId")?;
    let eni = p.require("NetworkInterfaceId")?;
    let private = match p.get("PrivateIpAddress") {
        Some(a) => a
            .parse::<Ipv4Addr>()
            .map_err(|_| invalid("PrivateIpAddress", a))?,
        None => {
            sim.network_interface(eni)
                .ok_or_else(|| {
                    WireError::client(
                        "InvalidNetworkInterfaceID.NotFound",
                        format!("The networkInterface ID '{eni}' does not exist"),
                    )
                })?
                .primary_ip
        }
    };
    let association = sim.associate_address(allocation, eni, private).await?;
    body(move |x| {
        x.leaf("return", "true").leaf("associationId", association);
    })
}

// ---- seeding (not throttled, not counted) ----

pub fn describe_availability_zones(zones: &[String], _p: &Params) -> Answer {
    let zones = zones.to_vec();
    body(move |x| {
        x.list(
            "availabilityZoneInfo",
            zones.iter().enumerate(),
            |x, (n, z)| {
                let region = z.trim_end_matches(|c: char| c.is_ascii_alphabetic());
                x.leaf("zoneName", z)
                    .leaf("zoneState", "available")
                    .leaf("regionName", region)
                    .leaf("zoneId", format!("use1-az{}", n + 1))
                    .leaf("zoneType", "availability-zone");
            },
        );
    })
}

/// No images: launches take any image ID.
pub fn describe_images(_p: &Params) -> Answer {
    body(|x| {
        x.list("imagesSet", std::iter::empty::<()>(), |_, _| {});
    })
}

pub fn create_vpc(sim: &Simulator, p: &Params) -> Answer {
    let block = cidr(p, "CidrBlock")?;
    let id = sim.add_vpc(block, &[]);
    // AWS gives every new VPC its main route table (VPC User Guide, "Route tables": "Your VPC
    // has an implicit router, and you use route tables... When you create a VPC, it
    // automatically has a main route table"); subnets without an explicit association use it.
    // Cilium's operator compares the route tables of the node's and the pod subnets.
    sim.add_route_table(&id, true, &[]);
    let vpc = Vpc {
        id,
        primary_cidr: block,
        secondary_cidrs: vec![],
    };
    body(move |x| {
        x.node("vpc", |x| vpc_xml(x, &vpc));
    })
}

pub fn associate_vpc_cidr_block(sim: &Simulator, p: &Params) -> Answer {
    let vpc = p.require("VpcId")?.to_owned();
    let block = cidr(p, "CidrBlock")?;
    sim.associate_vpc_cidr(&vpc, block)?;
    body(move |x| {
        x.leaf("vpcId", &vpc).node("cidrBlockAssociation", |x| {
            x.leaf("associationId", format!("{vpc}-cidr-assoc-{block}"))
                .leaf("cidrBlock", block)
                .node("cidrBlockState", |x| {
                    x.leaf("state", "associated");
                });
        });
    })
}

pub fn create_subnet(sim: &Simulator, p: &Params) -> Answer {
    let vpc = p.require("VpcId")?;
    let block = cidr(p, "CidrBlock")?;
    let zone = p.require("AvailabilityZone")?;
    let tags = p.tag_specification("subnet");
    let id = sim.try_add_subnet(vpc, zone, block, tags)?;
    let subnet = sim.subnet(&id).expect("just created");
    body(move |x| {
        x.node("subnet", |x| subnet_xml(x, &subnet));
    })
}

pub fn create_security_group(sim: &Simulator, p: &Params) -> Answer {
    let vpc = p.require("VpcId")?;
    p.require("GroupName")?;
    let id = sim.try_add_security_group(vpc, p.tag_specification("security-group"))?;
    body(move |x| {
        x.leaf("return", "true").leaf("groupId", id);
    })
}

/// `MaxCount` instances (at least `MinCount`, all or none in the simulator) of one type.
pub fn run_instances(sim: &Simulator, p: &Params) -> Answer {
    let instance_type = p.require("InstanceType")?;
    let subnet = p.require("SubnetId")?;
    let groups = p.list("SecurityGroupId");
    let tags = p.tag_specification("instance");
    let efas = efa_interfaces(p)?;
    let n = count(p, "MaxCount")?.unwrap_or(1).max(1);
    let mut launched = Vec::new();
    for _ in 0..n {
        match sim.try_run_instance_with_efas(instance_type, subnet, &groups, tags.clone(), &efas) {
            Ok(i) => launched.push(i),
            Err(e) => {
                for i in &launched {
                    sim.terminate_instance(&i.id);
                }
                return Err(e.into());
            }
        }
    }
    body(move |x| {
        x.leaf("reservationId", launched[0].id.replacen("i-", "r-", 1))
            .leaf("ownerId", OWNER)
            .list("groupSet", std::iter::empty::<()>(), |_, _| {})
            .list("instancesSet", &launched, instance_xml);
    })
}

/// `NetworkInterface.N.{NetworkCardIndex,DeviceIndex,InterfaceType,SecurityGroupId.M}` of
/// `RunInstances`: the EFA interfaces (`efa`, `efa-only`) launched beside the primary, as AWS's
/// EFA guide launches a p5 (one per network card). An `interface` entry is the primary itself
/// (the `SubnetId` and `SecurityGroupId.N` of the call).
fn efa_interfaces(p: &Params) -> Result<Vec<crate::sim::Efa>, WireError> {
    let mut out = Vec::new();
    for n in p.indexes("NetworkInterface") {
        let key = |k: &str| format!("NetworkInterface.{n}.{k}");
        let efa_only = match p.get(&key("InterfaceType")).unwrap_or("interface") {
            "interface" => continue,
            "efa" => false,
            "efa-only" => true,
            other => {
                return Err(WireError::client(
                    "InvalidParameterValue",
                    format!("Value ({other}) for parameter InterfaceType is invalid."),
                ));
            }
        };
        let index =
            |k: &str| -> Result<u32, WireError> { Ok(p.int(&key(k))?.unwrap_or(0).max(0) as u32) };
        out.push(crate::sim::Efa {
            card: index("NetworkCardIndex")?,
            device_index: index("DeviceIndex")?,
            efa_only,
            groups: p.list(&key("SecurityGroupId")),
        });
    }
    Ok(out)
}

/// Delete-on-termination ENIs go with the instance; the others become `available`.
pub fn terminate_instances(sim: &Simulator, p: &Params) -> Answer {
    let ids = p.list("InstanceId");
    if let Some(unknown) = ids.iter().find(|i| sim.instance(i).is_none()) {
        return Err(WireError::client(
            "InvalidInstanceID.NotFound",
            format!("The instance ID '{unknown}' does not exist"),
        ));
    }
    let changes: Vec<(String, InstanceState)> = ids
        .into_iter()
        .map(|id| {
            let before = sim
                .instance(&id)
                .map_or(InstanceState::Unknown, |i| i.state);
            sim.terminate_instance(&id);
            (id, before)
        })
        .collect();
    body(move |x| {
        x.list("instancesSet", &changes, |x, (id, before)| {
            x.leaf("instanceId", id);
            instance_state(x, "currentState", InstanceState::Terminated);
            instance_state(x, "previousState", *before);
        });
    })
}
