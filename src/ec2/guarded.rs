//! One wrapper for EC2 clients that let describes through and hold each mutating call to a
//! check first: the fence of a leader (`k8s::fence`), the refusal of a shadow
//! (`ec2::readonly`), the simulation's observers. The check is the guard's job; passing every
//! call of the [`Ec2`] trait along is this type's, written once.

use std::net::Ipv4Addr;

use ipnet::Ipv4Net;

use super::{
    Address, AddressRequest, Assigned, CreateEniRequest, Ec2, EniFilter, Instance, InstanceFilter,
    InstanceTypeLimits, NetworkInterface, Operation, Page, ResourceFilter, Result, RouteTable,
    SecurityGroup, Subnet, Tags, Vpc,
};

/// What runs (and may refuse) before each mutating call of a [`Guarded`] client.
pub trait MutationGuard: Send + Sync + 'static {
    fn before(&self, operation: Operation) -> impl Future<Output = Result<()>> + Send;
}

/// `inner` behind `guard`: describes pass untouched, each mutating call passes
/// [`MutationGuard::before`] first and is not made when it refuses.
pub struct Guarded<E, G> {
    inner: E,
    guard: G,
}

impl<E, G> Guarded<E, G> {
    pub fn new(inner: E, guard: G) -> Self {
        Self { inner, guard }
    }

    pub fn inner(&self) -> &E {
        &self.inner
    }

    pub fn guard(&self) -> &G {
        &self.guard
    }
}

impl<E: Ec2, G: MutationGuard> Ec2 for Guarded<E, G> {
    async fn describe_instance_types(
        &self,
        types: &[String],
        next_token: Option<String>,
    ) -> Result<Page<InstanceTypeLimits>> {
        self.inner.describe_instance_types(types, next_token).await
    }
    async fn describe_instances(
        &self,
        filter: &InstanceFilter,
        next_token: Option<String>,
    ) -> Result<Page<Instance>> {
        self.inner.describe_instances(filter, next_token).await
    }
    async fn describe_network_interfaces(
        &self,
        filter: &EniFilter,
        next_token: Option<String>,
    ) -> Result<Page<NetworkInterface>> {
        self.inner
            .describe_network_interfaces(filter, next_token)
            .await
    }
    async fn describe_subnets(
        &self,
        filter: &ResourceFilter,
        next_token: Option<String>,
    ) -> Result<Page<Subnet>> {
        self.inner.describe_subnets(filter, next_token).await
    }
    async fn describe_vpcs(
        &self,
        filter: &ResourceFilter,
        next_token: Option<String>,
    ) -> Result<Page<Vpc>> {
        self.inner.describe_vpcs(filter, next_token).await
    }
    async fn describe_security_groups(
        &self,
        filter: &ResourceFilter,
        next_token: Option<String>,
    ) -> Result<Page<SecurityGroup>> {
        self.inner
            .describe_security_groups(filter, next_token)
            .await
    }
    async fn describe_route_tables(
        &self,
        filter: &ResourceFilter,
        next_token: Option<String>,
    ) -> Result<Page<RouteTable>> {
        self.inner.describe_route_tables(filter, next_token).await
    }
    async fn create_network_interface(
        &self,
        request: &CreateEniRequest,
    ) -> Result<NetworkInterface> {
        self.guard.before(Operation::CreateNetworkInterface).await?;
        self.inner.create_network_interface(request).await
    }
    async fn attach_network_interface(
        &self,
        eni_id: &str,
        instance_id: &str,
        device_index: u32,
    ) -> Result<String> {
        self.guard.before(Operation::AttachNetworkInterface).await?;
        self.inner
            .attach_network_interface(eni_id, instance_id, device_index)
            .await
    }
    async fn set_delete_on_termination(
        &self,
        eni_id: &str,
        attachment_id: &str,
        delete_on_termination: bool,
    ) -> Result<()> {
        self.guard
            .before(Operation::ModifyNetworkInterfaceAttribute)
            .await?;
        self.inner
            .set_delete_on_termination(eni_id, attachment_id, delete_on_termination)
            .await
    }
    async fn assign_private_ip_addresses(
        &self,
        eni_id: &str,
        request: AddressRequest,
    ) -> Result<Assigned> {
        self.guard
            .before(Operation::AssignPrivateIpAddresses)
            .await?;
        self.inner
            .assign_private_ip_addresses(eni_id, request)
            .await
    }
    async fn unassign_private_ip_addresses(
        &self,
        eni_id: &str,
        ips: &[Ipv4Addr],
        prefixes: &[Ipv4Net],
    ) -> Result<()> {
        self.guard
            .before(Operation::UnassignPrivateIpAddresses)
            .await?;
        self.inner
            .unassign_private_ip_addresses(eni_id, ips, prefixes)
            .await
    }
    async fn detach_network_interface(&self, attachment_id: &str, force: bool) -> Result<()> {
        self.guard.before(Operation::DetachNetworkInterface).await?;
        self.inner
            .detach_network_interface(attachment_id, force)
            .await
    }
    async fn delete_network_interface(&self, eni_id: &str) -> Result<()> {
        self.guard.before(Operation::DeleteNetworkInterface).await?;
        self.inner.delete_network_interface(eni_id).await
    }
    async fn describe_addresses(&self, tags: &Tags) -> Result<Vec<Address>> {
        self.inner.describe_addresses(tags).await
    }
    async fn associate_address(
        &self,
        allocation_id: &str,
        eni_id: &str,
        private_ip: Ipv4Addr,
    ) -> Result<String> {
        self.guard.before(Operation::AssociateAddress).await?;
        self.inner
            .associate_address(allocation_id, eni_id, private_ip)
            .await
    }
    async fn disassociate_address(&self, association_id: &str) -> Result<()> {
        self.guard.before(Operation::DisassociateAddress).await?;
        self.inner.disassociate_address(association_id).await
    }
}
