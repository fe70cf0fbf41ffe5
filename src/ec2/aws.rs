//! [`Ec2`] on aws-sdk-ec2: real AWS, or an emulator behind an endpoint override.
//!
//! The SDK's own retry is disabled: the [`gate`](super::gate) is the one retry policy, so a
//! throttled answer is seen (and slows its bucket) instead of being retried blindly inside the SDK.

use std::net::Ipv4Addr;
use std::time::Duration;

use aws_config::retry::RetryConfig;
use aws_config::timeout::TimeoutConfig;
use aws_config::{BehaviorVersion, ConfigLoader, Region};
use aws_sdk_ec2::Client;
use aws_sdk_ec2::config::http::HttpResponse;
use aws_sdk_ec2::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use aws_sdk_ec2::types as sdk;
use ipnet::Ipv4Net;

use super::model::*;
use super::{Ec2, Ec2Error, Result};

/// How to reach EC2.
#[derive(Clone, Debug)]
pub struct AwsClientConfig {
    /// Region override; otherwise the default chain (env, profile, IMDS).
    pub region: Option<String>,
    /// Endpoint override (LocalStack, moto). Without it the SDK also honours
    /// `AWS_ENDPOINT_URL_EC2` and `AWS_ENDPOINT_URL` (aws-config's service-specific endpoints).
    pub endpoint_url: Option<String>,
    pub connect_timeout: Duration,
    /// Bound on one call (and its single attempt: the SDK does not retry).
    pub operation_timeout: Duration,
    /// `MaxResults` of describes; `None` lets AWS choose. Never sent together with IDs.
    pub max_results_per_call: Option<i32>,
}

impl Default for AwsClientConfig {
    fn default() -> Self {
        Self {
            region: None,
            endpoint_url: None,
            connect_timeout: Duration::from_secs(5),
            operation_timeout: Duration::from_secs(30),
            max_results_per_call: None,
        }
    }
}

impl AwsClientConfig {
    /// The SDK config loader with region, endpoint, timeouts and retry set; callers may add to
    /// it (tests give static credentials) before [`AwsEc2::from_loader`].
    pub fn loader(&self) -> ConfigLoader {
        let timeouts = TimeoutConfig::builder()
            .connect_timeout(self.connect_timeout)
            .operation_timeout(self.operation_timeout)
            .operation_attempt_timeout(self.operation_timeout)
            .build();
        let mut loader = aws_config::defaults(BehaviorVersion::latest())
            .timeout_config(timeouts)
            .retry_config(RetryConfig::disabled());
        if let Some(region) = &self.region {
            loader = loader.region(Region::new(region.clone()));
        }
        if let Some(url) = &self.endpoint_url {
            loader = loader.endpoint_url(url.clone());
        }
        loader
    }
}

/// The SDK-backed client.
#[derive(Clone, Debug)]
pub struct AwsEc2 {
    client: Client,
    max_results: Option<i32>,
    /// The chain the client signs with (`crate::credentials` asks which provider answered).
    credentials: Option<aws_credential_types::provider::SharedCredentialsProvider>,
}

impl AwsEc2 {
    /// Default credential chain: env, web identity (IRSA), pod identity, profile, IMDS.
    pub async fn new(config: &AwsClientConfig) -> Self {
        Self::from_loader(config.loader(), config.max_results_per_call).await
    }

    pub async fn from_loader(loader: ConfigLoader, max_results_per_call: Option<i32>) -> Self {
        let sdk = loader.load().await;
        Self {
            client: Client::new(&sdk),
            max_results: max_results_per_call,
            credentials: sdk.credentials_provider(),
        }
    }

    pub fn credentials_provider(
        &self,
    ) -> Option<aws_credential_types::provider::SharedCredentialsProvider> {
        self.credentials.clone()
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    /// AWS refuses `MaxResults` together with explicit IDs (Cilium #39106).
    fn page_size(&self, has_ids: bool) -> Option<i32> {
        if has_ids { None } else { self.max_results }
    }
}

/// SDK error -> typed error. Service answers are classified by code, message and HTTP status;
/// failures without an answer are transient.
fn map_err<E>(op: Operation, err: SdkError<E, HttpResponse>) -> Ec2Error
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
            super::ErrorKind::Other,
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

fn filter(name: &str, values: impl IntoIterator<Item = String>) -> sdk::Filter {
    sdk::Filter::builder()
        .name(name)
        .set_values(Some(values.into_iter().collect()))
        .build()
}

/// `vpc-id` + one `tag:<key>` per tag.
fn common_filters(vpc_id: &Option<String>, tags: &Tags) -> Vec<sdk::Filter> {
    let mut filters = Vec::new();
    if let Some(vpc) = vpc_id {
        filters.push(filter("vpc-id", [vpc.clone()]));
    }
    for (k, v) in tags {
        filters.push(filter(&format!("tag:{k}"), [v.clone()]));
    }
    filters
}

fn non_empty<T>(v: Vec<T>) -> Option<Vec<T>> {
    (!v.is_empty()).then_some(v)
}

fn tags(list: &[sdk::Tag]) -> Tags {
    list.iter()
        .filter_map(|t| {
            Some((
                t.key()?.to_string(),
                t.value().unwrap_or_default().to_string(),
            ))
        })
        .collect()
}

fn s(v: Option<&str>) -> String {
    v.unwrap_or_default().to_string()
}

fn ip(v: Option<&str>) -> Option<Ipv4Addr> {
    v?.parse().ok()
}

fn net(v: Option<&str>) -> Option<Ipv4Net> {
    v?.parse().ok()
}

fn u(v: Option<i32>) -> u32 {
    v.unwrap_or(0).max(0) as u32
}

fn instance_type_limits(info: &sdk::InstanceTypeInfo) -> InstanceTypeLimits {
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
fn enis_per_card(cards: &[sdk::NetworkCardInfo]) -> Vec<u32> {
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

fn instance(i: &sdk::Instance) -> Instance {
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

fn network_interface(n: &sdk::NetworkInterface) -> NetworkInterface {
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

fn subnet(sn: &sdk::Subnet) -> Option<Subnet> {
    Some(Subnet {
        id: s(sn.subnet_id()),
        vpc_id: s(sn.vpc_id()),
        availability_zone: s(sn.availability_zone()),
        cidr: net(sn.cidr_block())?,
        available_addresses: u(sn.available_ip_address_count()),
        tags: tags(sn.tags()),
    })
}

fn vpc(v: &sdk::Vpc) -> Option<Vpc> {
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

fn route_table(rt: &sdk::RouteTable) -> RouteTable {
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

fn page<T>(items: Vec<T>, next: Option<&str>) -> Page<T> {
    Page {
        items,
        next_token: next.filter(|t| !t.is_empty()).map(str::to_string),
    }
}

impl Ec2 for AwsEc2 {
    async fn describe_instance_types(
        &self,
        types: &[String],
        next_token: Option<String>,
    ) -> Result<Page<InstanceTypeLimits>> {
        let op = Operation::DescribeInstanceTypes;
        let out = self
            .client
            .describe_instance_types()
            .set_instance_types(non_empty(
                types
                    .iter()
                    .map(|t| sdk::InstanceType::from(t.as_str()))
                    .collect(),
            ))
            .set_max_results(self.page_size(!types.is_empty()))
            .set_next_token(next_token)
            .send()
            .await
            .map_err(|e| map_err(op, e))?;
        let items = out
            .instance_types()
            .iter()
            .map(instance_type_limits)
            .collect();
        Ok(page(items, out.next_token()))
    }

    async fn describe_instances(
        &self,
        f: &InstanceFilter,
        next_token: Option<String>,
    ) -> Result<Page<Instance>> {
        let op = Operation::DescribeInstances;
        let out = self
            .client
            .describe_instances()
            .set_instance_ids(non_empty(f.ids.clone()))
            .set_filters(non_empty(common_filters(&f.vpc_id, &f.tags)))
            .set_max_results(self.page_size(!f.ids.is_empty()))
            .set_next_token(next_token)
            .send()
            .await
            .map_err(|e| map_err(op, e))?;
        let items = out
            .reservations()
            .iter()
            .flat_map(|r| r.instances())
            .map(instance)
            .collect();
        Ok(page(items, out.next_token()))
    }

    async fn describe_network_interfaces(
        &self,
        f: &EniFilter,
        next_token: Option<String>,
    ) -> Result<Page<NetworkInterface>> {
        let op = Operation::DescribeNetworkInterfaces;
        let mut filters = common_filters(&f.vpc_id, &f.tags);
        if !f.instance_ids.is_empty() {
            filters.push(filter("attachment.instance-id", f.instance_ids.clone()));
        }
        if !f.subnet_ids.is_empty() {
            filters.push(filter("subnet-id", f.subnet_ids.clone()));
        }
        if let Some(state) = f.state {
            filters.push(filter("status", [state.as_str().to_string()]));
        }
        let out = self
            .client
            .describe_network_interfaces()
            .set_network_interface_ids(non_empty(f.ids.clone()))
            .set_filters(non_empty(filters))
            .set_max_results(self.page_size(!f.ids.is_empty()))
            .set_next_token(next_token)
            .send()
            .await
            .map_err(|e| map_err(op, e))?;
        let items = out
            .network_interfaces()
            .iter()
            .map(network_interface)
            .collect();
        Ok(page(items, out.next_token()))
    }

    async fn describe_subnets(
        &self,
        f: &ResourceFilter,
        next_token: Option<String>,
    ) -> Result<Page<Subnet>> {
        let op = Operation::DescribeSubnets;
        let out = self
            .client
            .describe_subnets()
            .set_subnet_ids(non_empty(f.ids.clone()))
            .set_filters(non_empty(common_filters(&f.vpc_id, &f.tags)))
            .set_max_results(self.page_size(!f.ids.is_empty()))
            .set_next_token(next_token)
            .send()
            .await
            .map_err(|e| map_err(op, e))?;
        let items = out.subnets().iter().filter_map(subnet).collect();
        Ok(page(items, out.next_token()))
    }

    async fn describe_vpcs(
        &self,
        f: &ResourceFilter,
        next_token: Option<String>,
    ) -> Result<Page<Vpc>> {
        let op = Operation::DescribeVpcs;
        // The VPC's own ID is an ID filter here, not a `vpc-id` filter.
        let mut ids = f.ids.clone();
        ids.extend(f.vpc_id.iter().filter(|v| !f.ids.contains(v)).cloned());
        let out = self
            .client
            .describe_vpcs()
            .set_vpc_ids(non_empty(ids.clone()))
            .set_filters(non_empty(common_filters(&None, &f.tags)))
            .set_max_results(self.page_size(!ids.is_empty()))
            .set_next_token(next_token)
            .send()
            .await
            .map_err(|e| map_err(op, e))?;
        let items = out.vpcs().iter().filter_map(vpc).collect();
        Ok(page(items, out.next_token()))
    }

    async fn describe_security_groups(
        &self,
        f: &ResourceFilter,
        next_token: Option<String>,
    ) -> Result<Page<SecurityGroup>> {
        let op = Operation::DescribeSecurityGroups;
        let out = self
            .client
            .describe_security_groups()
            .set_group_ids(non_empty(f.ids.clone()))
            .set_filters(non_empty(common_filters(&f.vpc_id, &f.tags)))
            .set_max_results(self.page_size(!f.ids.is_empty()))
            .set_next_token(next_token)
            .send()
            .await
            .map_err(|e| map_err(op, e))?;
        let items = out
            .security_groups()
            .iter()
            .map(|g| SecurityGroup {
                id: s(g.group_id()),
                vpc_id: s(g.vpc_id()),
                tags: tags(g.tags()),
            })
            .collect();
        Ok(page(items, out.next_token()))
    }

    async fn describe_route_tables(
        &self,
        f: &ResourceFilter,
        next_token: Option<String>,
    ) -> Result<Page<RouteTable>> {
        let op = Operation::DescribeRouteTables;
        let out = self
            .client
            .describe_route_tables()
            .set_route_table_ids(non_empty(f.ids.clone()))
            .set_filters(non_empty(common_filters(&f.vpc_id, &f.tags)))
            .set_max_results(self.page_size(!f.ids.is_empty()))
            .set_next_token(next_token)
            .send()
            .await
            .map_err(|e| map_err(op, e))?;
        let items = out.route_tables().iter().map(route_table).collect();
        Ok(page(items, out.next_token()))
    }

    async fn create_network_interface(&self, r: &CreateEniRequest) -> Result<NetworkInterface> {
        let op = Operation::CreateNetworkInterface;
        let tag_list: Vec<sdk::Tag> = r
            .tags
            .iter()
            .map(|(k, v)| sdk::Tag::builder().key(k).value(v).build())
            .collect();
        let mut req = self
            .client
            .create_network_interface()
            .subnet_id(&r.subnet_id)
            .description(&r.description)
            .set_groups(non_empty(r.security_groups.clone()))
            .client_token(&r.client_token);
        if !tag_list.is_empty() {
            req = req.tag_specifications(
                sdk::TagSpecification::builder()
                    .resource_type(sdk::ResourceType::NetworkInterface)
                    .set_tags(Some(tag_list))
                    .build(),
            );
        }
        req = match r.addresses {
            AddressRequest::Ips(0) | AddressRequest::Prefixes(0) => req,
            AddressRequest::Ips(n) => req.secondary_private_ip_address_count(n as i32),
            AddressRequest::Prefixes(n) => req.ipv4_prefix_count(n as i32),
        };
        let out = req.send().await.map_err(|e| map_err(op, e))?;
        let eni = out.network_interface().ok_or_else(|| {
            Ec2Error::from_aws(
                op,
                "EmptyAnswer",
                "no network interface in the answer",
                None,
            )
        })?;
        tracing::debug!(eni = ?eni.network_interface_id(), subnet = %r.subnet_id, "created ENI");
        Ok(network_interface(eni))
    }

    async fn attach_network_interface(
        &self,
        eni_id: &str,
        instance_id: &str,
        device_index: u32,
    ) -> Result<String> {
        let op = Operation::AttachNetworkInterface;
        let out = self
            .client
            .attach_network_interface()
            .network_interface_id(eni_id)
            .instance_id(instance_id)
            .device_index(device_index as i32)
            .network_card_index(0)
            .send()
            .await
            .map_err(|e| map_err(op, e))?;
        out.attachment_id().map(str::to_string).ok_or_else(|| {
            Ec2Error::from_aws(op, "EmptyAnswer", "no attachment ID in the answer", None)
        })
    }

    async fn set_delete_on_termination(
        &self,
        eni_id: &str,
        attachment_id: &str,
        delete_on_termination: bool,
    ) -> Result<()> {
        let op = Operation::ModifyNetworkInterfaceAttribute;
        self.client
            .modify_network_interface_attribute()
            .network_interface_id(eni_id)
            .attachment(
                sdk::NetworkInterfaceAttachmentChanges::builder()
                    .attachment_id(attachment_id)
                    .delete_on_termination(delete_on_termination)
                    .build(),
            )
            .send()
            .await
            .map_err(|e| map_err(op, e))?;
        Ok(())
    }

    async fn assign_private_ip_addresses(
        &self,
        eni_id: &str,
        request: AddressRequest,
    ) -> Result<Assigned> {
        let op = Operation::AssignPrivateIpAddresses;
        let req = self
            .client
            .assign_private_ip_addresses()
            .network_interface_id(eni_id);
        let req = match request {
            AddressRequest::Ips(n) => req.secondary_private_ip_address_count(n as i32),
            AddressRequest::Prefixes(n) => req.ipv4_prefix_count(n as i32),
        };
        let out = req.send().await.map_err(|e| map_err(op, e))?;
        Ok(Assigned {
            ips: out
                .assigned_private_ip_addresses()
                .iter()
                .filter_map(|a| ip(a.private_ip_address()))
                .collect(),
            prefixes: out
                .assigned_ipv4_prefixes()
                .iter()
                .filter_map(|p| net(p.ipv4_prefix()))
                .collect(),
        })
    }

    async fn unassign_private_ip_addresses(
        &self,
        eni_id: &str,
        ips: &[Ipv4Addr],
        prefixes: &[Ipv4Net],
    ) -> Result<()> {
        let op = Operation::UnassignPrivateIpAddresses;
        // AWS takes addresses or prefixes in one call, not both: one call per non-empty kind.
        if !ips.is_empty() {
            self.client
                .unassign_private_ip_addresses()
                .network_interface_id(eni_id)
                .set_private_ip_addresses(Some(ips.iter().map(|a| a.to_string()).collect()))
                .send()
                .await
                .map_err(|e| map_err(op, e))?;
        }
        if !prefixes.is_empty() {
            self.client
                .unassign_private_ip_addresses()
                .network_interface_id(eni_id)
                .set_ipv4_prefixes(Some(prefixes.iter().map(|p| p.to_string()).collect()))
                .send()
                .await
                .map_err(|e| map_err(op, e))?;
        }
        Ok(())
    }

    async fn detach_network_interface(&self, attachment_id: &str, force: bool) -> Result<()> {
        let op = Operation::DetachNetworkInterface;
        self.client
            .detach_network_interface()
            .attachment_id(attachment_id)
            .force(force)
            .send()
            .await
            .map_err(|e| map_err(op, e))?;
        Ok(())
    }

    async fn delete_network_interface(&self, eni_id: &str) -> Result<()> {
        let op = Operation::DeleteNetworkInterface;
        self.client
            .delete_network_interface()
            .network_interface_id(eni_id)
            .send()
            .await
            .map_err(|e| map_err(op, e))?;
        tracing::debug!(eni = eni_id, "deleted ENI");
        Ok(())
    }

    // Static IPs follow Cilium's pkg/aws/ec2/ec2.go `AssociateEIP`: DescribeAddresses with one
    // `tag:` filter per tag, then AssociateAddress with AllowReassociation false.
    async fn describe_addresses(&self, want: &Tags) -> Result<Vec<Address>> {
        let op = Operation::DescribeAddresses;
        let out = self
            .client
            .describe_addresses()
            .set_filters(non_empty(common_filters(&None, want)))
            .send()
            .await
            .map_err(|e| map_err(op, e))?;
        Ok(out.addresses().iter().filter_map(address).collect())
    }

    async fn associate_address(
        &self,
        allocation_id: &str,
        eni_id: &str,
        private_ip: Ipv4Addr,
    ) -> Result<String> {
        let op = Operation::AssociateAddress;
        let out = self
            .client
            .associate_address()
            .allocation_id(allocation_id)
            .network_interface_id(eni_id)
            .private_ip_address(private_ip.to_string())
            .allow_reassociation(false)
            .send()
            .await
            .map_err(|e| map_err(op, e))?;
        Ok(s(out.association_id()))
    }

    async fn disassociate_address(&self, association_id: &str) -> Result<()> {
        let op = Operation::DisassociateAddress;
        self.client
            .disassociate_address()
            .association_id(association_id)
            .send()
            .await
            .map_err(|e| map_err(op, e))?;
        Ok(())
    }
}

/// A VPC Elastic IP (one without an allocation ID or public IP is skipped).
fn address(a: &sdk::Address) -> Option<Address> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vpc_secondary_cidrs_are_associated_ones_without_the_primary() {
        let assoc = |cidr: &str, state: sdk::VpcCidrBlockStateCode| {
            sdk::VpcCidrBlockAssociation::builder()
                .cidr_block(cidr)
                .cidr_block_state(sdk::VpcCidrBlockState::builder().state(state).build())
                .build()
        };
        let v = sdk::Vpc::builder()
            .vpc_id("vpc-1")
            .cidr_block("10.0.0.0/16")
            .cidr_block_association_set(assoc(
                "10.0.0.0/16",
                sdk::VpcCidrBlockStateCode::Associated,
            ))
            .cidr_block_association_set(assoc(
                "100.64.0.0/16",
                sdk::VpcCidrBlockStateCode::Associated,
            ))
            .cidr_block_association_set(assoc(
                "100.65.0.0/16",
                sdk::VpcCidrBlockStateCode::Disassociated,
            ))
            .build();
        let v = vpc(&v).expect("valid VPC");
        assert_eq!(v.primary_cidr, "10.0.0.0/16".parse::<Ipv4Net>().unwrap());
        assert_eq!(
            v.secondary_cidrs,
            vec!["100.64.0.0/16".parse::<Ipv4Net>().unwrap()]
        );
    }

    /// One address of an ENI as EC2 lists it.
    fn addr(a: &str, primary: bool) -> sdk::NetworkInterfacePrivateIpAddress {
        sdk::NetworkInterfacePrivateIpAddress::builder()
            .private_ip_address(a)
            .primary(primary)
            .build()
    }

    #[test]
    fn eni_conversion_lists_each_address_once() {
        // moto's CreateNetworkInterface can draw one address twice, or the primary again.
        let n = sdk::NetworkInterface::builder()
            .network_interface_id("eni-1")
            .private_ip_addresses(addr("10.0.0.5", true))
            .private_ip_addresses(addr("10.0.0.9", false))
            .private_ip_addresses(addr("10.0.0.5", false))
            .private_ip_addresses(addr("10.0.0.7", false))
            .private_ip_addresses(addr("10.0.0.9", false))
            .build();
        let eni = network_interface(&n);
        assert_eq!(eni.primary_ip, Ipv4Addr::new(10, 0, 0, 5));
        assert_eq!(
            eni.secondary_ips,
            vec![Ipv4Addr::new(10, 0, 0, 9), Ipv4Addr::new(10, 0, 0, 7)]
        );
    }

    #[test]
    fn eni_conversion_splits_primary_from_secondaries() {
        let n = sdk::NetworkInterface::builder()
            .network_interface_id("eni-1")
            .private_ip_address("10.0.0.5")
            .private_ip_addresses(addr("10.0.0.9", false))
            .private_ip_addresses(addr("10.0.0.5", true))
            .ipv4_prefixes(
                sdk::Ipv4PrefixSpecification::builder()
                    .ipv4_prefix("10.0.1.16/28")
                    .build(),
            )
            .groups(sdk::GroupIdentifier::builder().group_id("sg-1").build())
            .tag_set(sdk::Tag::builder().key("k").value("v").build())
            .status(sdk::NetworkInterfaceStatus::InUse)
            .attachment(
                sdk::NetworkInterfaceAttachment::builder()
                    .attachment_id("attach-1")
                    .instance_id("i-1")
                    .device_index(2)
                    .delete_on_termination(true)
                    .build(),
            )
            .association(
                sdk::NetworkInterfaceAssociation::builder()
                    .public_ip("1.2.3.4")
                    .build(),
            )
            .build();
        let eni = network_interface(&n);
        assert_eq!(eni.primary_ip, Ipv4Addr::new(10, 0, 0, 5));
        assert_eq!(eni.secondary_ips, vec![Ipv4Addr::new(10, 0, 0, 9)]);
        assert_eq!(
            eni.prefixes,
            vec!["10.0.1.16/28".parse::<Ipv4Net>().unwrap()]
        );
        assert_eq!(eni.security_groups, vec!["sg-1".to_string()]);
        assert_eq!(eni.tags.get("k").map(String::as_str), Some("v"));
        assert_eq!(eni.state, EniState::InUse);
        assert_eq!(eni.device_index(), Some(2));
        assert!(eni.attachment.as_ref().unwrap().delete_on_termination);
        assert_eq!(eni.public_ip.as_deref(), Some("1.2.3.4"));
    }

    /// Records every request body the SDK would send, then stops it before the network.
    #[derive(Clone, Debug, Default)]
    struct Recorder(std::sync::Arc<std::sync::Mutex<Vec<String>>>);

    impl aws_sdk_ec2::config::Intercept for Recorder {
        fn name(&self) -> &'static str {
            "recorder"
        }

        fn read_before_transmit(
            &self,
            context: &aws_sdk_ec2::config::interceptors::BeforeTransmitInterceptorContextRef<'_>,
            _: &aws_sdk_ec2::config::RuntimeComponents,
            _: &mut aws_sdk_ec2::config::ConfigBag,
        ) -> std::result::Result<(), aws_sdk_ec2::error::BoxError> {
            let body = context.request().body().bytes().unwrap_or_default();
            self.0
                .lock()
                .unwrap()
                .push(String::from_utf8_lossy(body).into_owned());
            Err("recorded, not sent".into())
        }
    }

    fn recording_client(max_results: Option<i32>) -> (AwsEc2, Recorder) {
        let recorder = Recorder::default();
        let config = aws_sdk_ec2::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .region(Region::new("us-east-1"))
            .credentials_provider(aws_sdk_ec2::config::Credentials::new(
                "a", "b", None, None, "test",
            ))
            .interceptor(recorder.clone())
            .build();
        let aws = AwsEc2 {
            client: Client::from_conf(config),
            max_results,
            credentials: None,
        };
        (aws, recorder)
    }

    impl Recorder {
        fn take(&self) -> Vec<String> {
            std::mem::take(&mut *self.0.lock().unwrap())
        }
    }

    #[tokio::test]
    async fn page_size_is_never_sent_with_ids() {
        let (aws, sent) = recording_client(Some(50));
        let by_vpc = EniFilter {
            vpc_id: Some("vpc-1".into()),
            ..Default::default()
        };
        let _ = aws.describe_network_interfaces(&by_vpc, None).await;
        let by_id = EniFilter {
            ids: vec!["eni-1".into()],
            ..Default::default()
        };
        let _ = aws.describe_network_interfaces(&by_id, None).await;
        let bodies = sent.take();
        assert!(bodies[0].contains("MaxResults=50"), "{}", bodies[0]);
        assert!(bodies[0].contains("Filter.1.Name=vpc-id"), "{}", bodies[0]);
        assert!(
            bodies[1].contains("NetworkInterfaceId.1=eni-1"),
            "{}",
            bodies[1]
        );
        assert!(!bodies[1].contains("MaxResults"), "{}", bodies[1]);
    }

    #[tokio::test]
    async fn create_sends_everything_inline() {
        let (aws, sent) = recording_client(None);
        let mut request = CreateEniRequest {
            subnet_id: "subnet-1".into(),
            security_groups: vec!["sg-1".into()],
            description: "d".into(),
            tags: Tags::from([("k".to_string(), "v".to_string())]),
            addresses: AddressRequest::Ips(3),
            client_token: "tok".into(),
        };
        let _ = aws.create_network_interface(&request).await;
        request.addresses = AddressRequest::Prefixes(2);
        let _ = aws.create_network_interface(&request).await;
        request.addresses = AddressRequest::Ips(0);
        let _ = aws.create_network_interface(&request).await;
        let bodies = sent.take();
        for expected in [
            "SubnetId=subnet-1",
            "SecurityGroupId.1=sg-1",
            "Description=d",
            "ClientToken=tok",
            "TagSpecification.1.ResourceType=network-interface",
            "TagSpecification.1.Tag.1.Key=k",
            "TagSpecification.1.Tag.1.Value=v",
            "SecondaryPrivateIpAddressCount=3",
        ] {
            assert!(bodies[0].contains(expected), "{expected} in {}", bodies[0]);
        }
        assert!(!bodies[0].contains("Ipv4PrefixCount"));
        assert!(bodies[1].contains("Ipv4PrefixCount=2"), "{}", bodies[1]);
        assert!(!bodies[1].contains("SecondaryPrivateIpAddressCount"));
        assert!(
            !bodies[2].contains("SecondaryPrivateIpAddressCount"),
            "{}",
            bodies[2]
        );
        assert!(!bodies[2].contains("Ipv4PrefixCount"), "{}", bodies[2]);
    }

    #[tokio::test]
    async fn attach_modify_and_unassign_requests() {
        let (aws, sent) = recording_client(None);
        let _ = aws.attach_network_interface("eni-1", "i-1", 2).await;
        let _ = aws
            .set_delete_on_termination("eni-1", "attach-1", true)
            .await;
        // Unassign stops at the first failed call; the recorder fails each, so send kinds apart.
        let ip = [Ipv4Addr::new(10, 0, 0, 9)];
        let prefix = ["10.0.1.16/28".parse::<Ipv4Net>().unwrap()];
        let _ = aws.unassign_private_ip_addresses("eni-1", &ip, &[]).await;
        let _ = aws
            .unassign_private_ip_addresses("eni-1", &[], &prefix)
            .await;
        let _ = aws.unassign_private_ip_addresses("eni-1", &[], &[]).await;
        let bodies = sent.take();
        assert_eq!(bodies.len(), 4, "no call for an empty unassign: {bodies:?}");
        for expected in ["DeviceIndex=2", "NetworkCardIndex=0", "InstanceId=i-1"] {
            assert!(bodies[0].contains(expected), "{expected} in {}", bodies[0]);
        }
        for expected in [
            "Attachment.AttachmentId=attach-1",
            "Attachment.DeleteOnTermination=true",
        ] {
            assert!(bodies[1].contains(expected), "{expected} in {}", bodies[1]);
        }
        assert!(
            bodies[2].contains("PrivateIpAddress.1=10.0.0.9"),
            "{}",
            bodies[2]
        );
        assert!(!bodies[2].contains("Ipv4Prefix.1"));
        assert!(
            bodies[3].contains("Ipv4Prefix.1=10.0.1.16%2F28"),
            "{}",
            bodies[3]
        );
        assert!(!bodies[3].contains("PrivateIpAddress.1"));
    }
}
