//! The EC2 client of a shadow process (`--mode=shadow`, `eni-operator plan`): every describe
//! passes through to the wrapped (gated) client; every mutating call is refused before it leaves
//! the process, counted, and logged as an error. Shadow mode is this type, not a flag checked in
//! each step: code that reaches a mutating call with it cannot change anything in AWS.

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use ipnet::Ipv4Net;

use super::{
    AddressRequest, Assigned, CreateEniRequest, Ec2, Ec2Error, EniFilter, ErrorKind, Instance,
    InstanceFilter, InstanceTypeLimits, NetworkInterface, Operation, Page, ResourceFilter, Result,
    RouteTable, SecurityGroup, Subnet, Vpc,
};

/// The error code of a refused mutating call.
pub const REFUSED_CODE: &str = "ShadowModeReadOnly";

/// Describes only. Cheap to share: the refusal count is behind an `Arc`.
#[derive(Debug)]
pub struct ReadOnlyEc2<E> {
    inner: Arc<E>,
    refused: Arc<AtomicU64>,
}

impl<E: Ec2> ReadOnlyEc2<E> {
    pub fn new(inner: Arc<E>) -> Self {
        Self {
            inner,
            refused: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Mutating calls refused so far (a shadow that works as designed keeps this at 0).
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// A handle on the refusal count, for the metrics.
    pub fn refused_counter(&self) -> Arc<AtomicU64> {
        self.refused.clone()
    }

    pub fn inner(&self) -> &Arc<E> {
        &self.inner
    }

    fn refuse<T>(&self, operation: Operation) -> Result<T> {
        self.refused.fetch_add(1, Ordering::Relaxed);
        tracing::error!(%operation, "shadow mode: mutating EC2 call refused");
        Err(Ec2Error::new(
            operation,
            ErrorKind::Unauthorized,
            REFUSED_CODE,
            "a shadow process makes no mutating EC2 call",
        ))
    }
}

impl<E: Ec2> Ec2 for ReadOnlyEc2<E> {
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

    async fn create_network_interface(&self, _: &CreateEniRequest) -> Result<NetworkInterface> {
        self.refuse(Operation::CreateNetworkInterface)
    }

    async fn attach_network_interface(&self, _: &str, _: &str, _: u32) -> Result<String> {
        self.refuse(Operation::AttachNetworkInterface)
    }

    async fn set_delete_on_termination(&self, _: &str, _: &str, _: bool) -> Result<()> {
        self.refuse(Operation::ModifyNetworkInterfaceAttribute)
    }

    async fn assign_private_ip_addresses(&self, _: &str, _: AddressRequest) -> Result<Assigned> {
        self.refuse(Operation::AssignPrivateIpAddresses)
    }

    async fn unassign_private_ip_addresses(
        &self,
        _: &str,
        _: &[Ipv4Addr],
        _: &[Ipv4Net],
    ) -> Result<()> {
        self.refuse(Operation::UnassignPrivateIpAddresses)
    }

    async fn detach_network_interface(&self, _: &str, _: bool) -> Result<()> {
        self.refuse(Operation::DetachNetworkInterface)
    }

    async fn delete_network_interface(&self, _: &str) -> Result<()> {
        self.refuse(Operation::DeleteNetworkInterface)
    }

    async fn describe_addresses(
        &self,
        tags: &crate::ec2::Tags,
    ) -> Result<Vec<crate::ec2::Address>> {
        self.inner.describe_addresses(tags).await
    }

    async fn associate_address(&self, _: &str, _: &str, _: Ipv4Addr) -> Result<String> {
        self.refuse(Operation::AssociateAddress)
    }

    async fn disassociate_address(&self, _: &str) -> Result<()> {
        self.refuse(Operation::DisassociateAddress)
    }
}
