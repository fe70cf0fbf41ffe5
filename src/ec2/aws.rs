//! [`Ec2`] on aws-sdk-ec2: real AWS, or an emulator behind an endpoint override.
//!
//! The SDK's own retry is disabled: the [`gate`](super::gate) is the one retry policy, so a
//! throttled answer is seen (and slows its bucket) instead of being retried blindly inside the SDK.

use std::net::Ipv4Addr;

use aws_config::ConfigLoader;
use aws_sdk_ec2::Client;
use aws_sdk_ec2::types as sdk;
use ipnet::Ipv4Net;

use super::model::*;
use super::{Ec2, Ec2Error, Result};

mod client_config;
pub use client_config::AwsClientConfig;

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

/// One page of a describe call, in the shape all of them share: the IDs, the filters, the page
/// size (none when IDs are named) and the token; `|out| items` turns the answer into the page's items.
macro_rules! describe_page {
    ($self:ident, $op:ident, $call:ident.$set_ids:ident($ids:expr) $(.filters($filters:expr))?,
     $token:expr, |$out:ident| $items:expr) => {{
        let ids = $ids;
        let page_size = $self.page_size(!ids.is_empty());
        let $out = send(
            Operation::$op,
            $self
                .client
                .$call()
                .$set_ids(non_empty(ids))
                $(.set_filters(non_empty($filters)))?
                .set_max_results(page_size)
                .set_next_token($token)
                .send(),
        )
        .await?;
        Ok(page($items, $out.next_token()))
    }};
}

impl Ec2 for AwsEc2 {
    async fn describe_instance_types(
        &self,
        types: &[String],
        next_token: Option<String>,
    ) -> Result<Page<InstanceTypeLimits>> {
        let types = types.iter().map(|t| sdk::InstanceType::from(t.as_str()));
        describe_page!(
            self,
            DescribeInstanceTypes,
            describe_instance_types.set_instance_types(types.collect::<Vec<_>>()),
            next_token,
            |out| out
                .instance_types()
                .iter()
                .map(instance_type_limits)
                .collect()
        )
    }

    async fn describe_instances(
        &self,
        f: &InstanceFilter,
        next_token: Option<String>,
    ) -> Result<Page<Instance>> {
        describe_page!(
            self,
            DescribeInstances,
            describe_instances
                .set_instance_ids(f.ids.clone())
                .filters(common_filters(&f.vpc_id, &f.tags)),
            next_token,
            |out| out
                .reservations()
                .iter()
                .flat_map(|r| r.instances())
                .map(instance)
                .collect()
        )
    }

    async fn describe_network_interfaces(
        &self,
        f: &EniFilter,
        next_token: Option<String>,
    ) -> Result<Page<NetworkInterface>> {
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
        if !f.private_ips.is_empty() {
            let ips = f.private_ips.iter().map(ToString::to_string);
            filters.push(filter("addresses.private-ip-address", ips));
        }
        describe_page!(
            self,
            DescribeNetworkInterfaces,
            describe_network_interfaces
                .set_network_interface_ids(f.ids.clone())
                .filters(filters),
            next_token,
            |out| out
                .network_interfaces()
                .iter()
                .map(network_interface)
                .collect()
        )
    }

    async fn describe_subnets(
        &self,
        f: &ResourceFilter,
        next_token: Option<String>,
    ) -> Result<Page<Subnet>> {
        describe_page!(
            self,
            DescribeSubnets,
            describe_subnets
                .set_subnet_ids(f.ids.clone())
                .filters(common_filters(&f.vpc_id, &f.tags)),
            next_token,
            |out| out.subnets().iter().filter_map(subnet).collect()
        )
    }

    async fn describe_vpcs(
        &self,
        f: &ResourceFilter,
        next_token: Option<String>,
    ) -> Result<Page<Vpc>> {
        // The VPC's own ID is an ID filter here, not a `vpc-id` filter.
        let mut ids = f.ids.clone();
        ids.extend(f.vpc_id.iter().filter(|v| !f.ids.contains(v)).cloned());
        describe_page!(
            self,
            DescribeVpcs,
            describe_vpcs
                .set_vpc_ids(ids)
                .filters(common_filters(&None, &f.tags)),
            next_token,
            |out| out.vpcs().iter().filter_map(vpc).collect()
        )
    }

    async fn describe_security_groups(
        &self,
        f: &ResourceFilter,
        next_token: Option<String>,
    ) -> Result<Page<SecurityGroup>> {
        describe_page!(
            self,
            DescribeSecurityGroups,
            describe_security_groups
                .set_group_ids(f.ids.clone())
                .filters(common_filters(&f.vpc_id, &f.tags)),
            next_token,
            |out| out
                .security_groups()
                .iter()
                .map(|g| SecurityGroup {
                    id: s(g.group_id()),
                    vpc_id: s(g.vpc_id()),
                    tags: tags(g.tags()),
                })
                .collect()
        )
    }

    async fn describe_route_tables(
        &self,
        f: &ResourceFilter,
        next_token: Option<String>,
    ) -> Result<Page<RouteTable>> {
        describe_page!(
            self,
            DescribeRouteTables,
            describe_route_tables
                .set_route_table_ids(f.ids.clone())
                .filters(common_filters(&f.vpc_id, &f.tags)),
            next_token,
            |out| out.route_tables().iter().map(route_table).collect()
        )
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
        let out = send(op, req.send()).await?;
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
        let out = send(
            op,
            self.client
                .attach_network_interface()
                .network_interface_id(eni_id)
                .instance_id(instance_id)
                .device_index(device_index as i32)
                .network_card_index(0)
                .send(),
        )
        .await?;
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
        send(
            op,
            self.client
                .modify_network_interface_attribute()
                .network_interface_id(eni_id)
                .attachment(
                    sdk::NetworkInterfaceAttachmentChanges::builder()
                        .attachment_id(attachment_id)
                        .delete_on_termination(delete_on_termination)
                        .build(),
                )
                .send(),
        )
        .await?;
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
        let out = send(op, req.send()).await?;
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
        let listed = |all: Vec<String>| (!all.is_empty()).then_some(all);
        for (ips, prefixes) in unassign_calls(ips, prefixes) {
            send(
                op,
                self.client
                    .unassign_private_ip_addresses()
                    .network_interface_id(eni_id)
                    .set_private_ip_addresses(listed(ips.iter().map(|a| a.to_string()).collect()))
                    .set_ipv4_prefixes(listed(prefixes.iter().map(|p| p.to_string()).collect()))
                    .send(),
            )
            .await?;
        }
        Ok(())
    }

    async fn detach_network_interface(&self, attachment_id: &str, force: bool) -> Result<()> {
        let op = Operation::DetachNetworkInterface;
        send(
            op,
            self.client
                .detach_network_interface()
                .attachment_id(attachment_id)
                .force(force)
                .send(),
        )
        .await?;
        Ok(())
    }

    async fn delete_network_interface(&self, eni_id: &str) -> Result<()> {
        let op = Operation::DeleteNetworkInterface;
        send(
            op,
            self.client
                .delete_network_interface()
                .network_interface_id(eni_id)
                .send(),
        )
        .await?;
        tracing::debug!(eni = eni_id, "deleted ENI");
        Ok(())
    }

    // Static IPs follow Cilium's pkg/aws/ec2/ec2.go `AssociateEIP`: DescribeAddresses with one
    // `tag:` filter per tag, then AssociateAddress with AllowReassociation false.
    async fn describe_addresses(&self, want: &Tags) -> Result<Vec<Address>> {
        let op = Operation::DescribeAddresses;
        let out = send(
            op,
            self.client
                .describe_addresses()
                .set_filters(non_empty(common_filters(&None, want)))
                .send(),
        )
        .await?;
        Ok(out.addresses().iter().filter_map(address).collect())
    }

    async fn associate_address(
        &self,
        allocation_id: &str,
        eni_id: &str,
        private_ip: Ipv4Addr,
    ) -> Result<String> {
        let op = Operation::AssociateAddress;
        let out = send(
            op,
            self.client
                .associate_address()
                .allocation_id(allocation_id)
                .network_interface_id(eni_id)
                .private_ip_address(private_ip.to_string())
                .allow_reassociation(false)
                .send(),
        )
        .await?;
        Ok(s(out.association_id()))
    }

    async fn disassociate_address(&self, association_id: &str) -> Result<()> {
        let op = Operation::DisassociateAddress;
        send(
            op,
            self.client
                .disassociate_address()
                .association_id(association_id)
                .send(),
        )
        .await?;
        Ok(())
    }
}

mod convert;
use convert::*;

#[cfg(test)]
mod tests;
