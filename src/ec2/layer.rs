//! The one forwarder of the [`Ec2`] trait. Everything that sits between the operator and AWS
//! (the gate's buckets and retries, the leader's fence, a shadow's refusal, the simulation's
//! observers) is a [`Layer`]: it is told which call is made and makes it (or not, or again).
//! Passing each method of the trait along is [`Layered`]'s job, written once here, as tower's
//! `Layer`/`Service` pair does for HTTP.

use std::future::Future;
use std::net::Ipv4Addr;
use std::pin::Pin;

use ipnet::Ipv4Net;

use super::{
    Address, AddressRequest, Assigned, CreateEniRequest, Ec2, EniFilter, Instance, InstanceFilter,
    InstanceTypeLimits, NetworkInterface, Operation, Page, ResourceFilter, Result, RouteTable,
    SecurityGroup, Subnet, Tags, Vpc,
};

/// One call of the [`Ec2`] trait, as a layer sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Call {
    pub operation: Operation,
    /// AWS calls it makes: 1, or 2 for an unassign of addresses and prefixes (one per kind).
    pub aws_calls: u32,
}

impl Call {
    const fn one(operation: Operation) -> Self {
        Self {
            operation,
            aws_calls: 1,
        }
    }
}

/// One attempt of a call, boxed: layers see every call of the trait as the same type.
pub type Attempt<'a, T> = Pin<Box<dyn Future<Output = Result<T>> + Send + 'a>>;

/// Makes one attempt of the call each time it is called.
pub type MakeCall<'a, T> = dyn Fn() -> Attempt<'a, T> + Send + Sync + 'a;

/// What runs around each call of a [`Layered`] client. A layer that refuses the call does not
/// call `send`; one that retries calls it again.
pub trait Layer: Send + Sync + 'static {
    fn around<'a, T: Send + 'a>(
        &'a self,
        call: Call,
        send: &'a MakeCall<'a, T>,
    ) -> impl Future<Output = Result<T>> + Send + 'a;
}

/// The common layer: describes pass untouched, each mutating call passes
/// [`MutationGuard::before`] first and is not made when it refuses.
pub trait MutationGuard: Send + Sync + 'static {
    fn before(&self, operation: Operation) -> impl Future<Output = Result<()>> + Send;
}

impl<G: MutationGuard> Layer for G {
    async fn around<'a, T: Send + 'a>(
        &'a self,
        call: Call,
        send: &'a MakeCall<'a, T>,
    ) -> Result<T> {
        if call.operation.is_mutating() {
            self.before(call.operation).await?;
        }
        send().await
    }
}

fn attempt<'a, T>(call: impl Future<Output = Result<T>> + Send + 'a) -> Attempt<'a, T> {
    Box::pin(call)
}

/// `inner` behind `layer`: an [`Ec2`] client again, so layers stack.
pub struct Layered<E, L> {
    inner: E,
    layer: L,
}

impl<E, L> Layered<E, L> {
    /// `layer` may be given as anything it is made from (the gate from its `GateConfig`).
    pub fn new(inner: E, layer: impl Into<L>) -> Self {
        Self {
            inner,
            layer: layer.into(),
        }
    }

    pub fn inner(&self) -> &E {
        &self.inner
    }

    pub fn layer(&self) -> &L {
        &self.layer
    }
}

impl<E: Ec2, L: Layer> Layered<E, L> {
    fn around<'a, T: Send + 'a>(
        &'a self,
        operation: Operation,
        send: &'a MakeCall<'a, T>,
    ) -> impl Future<Output = Result<T>> + Send + 'a {
        self.layer.around(Call::one(operation), send)
    }
}

impl<E: Ec2, L: Layer> Ec2 for Layered<E, L> {
    async fn describe_instance_types(
        &self,
        types: &[String],
        next_token: Option<String>,
    ) -> Result<Page<InstanceTypeLimits>> {
        self.around(Operation::DescribeInstanceTypes, &|| {
            attempt(
                self.inner
                    .describe_instance_types(types, next_token.clone()),
            )
        })
        .await
    }

    async fn describe_instances(
        &self,
        filter: &InstanceFilter,
        next_token: Option<String>,
    ) -> Result<Page<Instance>> {
        self.around(Operation::DescribeInstances, &|| {
            attempt(self.inner.describe_instances(filter, next_token.clone()))
        })
        .await
    }

    async fn describe_network_interfaces(
        &self,
        filter: &EniFilter,
        next_token: Option<String>,
    ) -> Result<Page<NetworkInterface>> {
        self.around(Operation::DescribeNetworkInterfaces, &|| {
            attempt(
                self.inner
                    .describe_network_interfaces(filter, next_token.clone()),
            )
        })
        .await
    }

    async fn describe_subnets(
        &self,
        filter: &ResourceFilter,
        next_token: Option<String>,
    ) -> Result<Page<Subnet>> {
        self.around(Operation::DescribeSubnets, &|| {
            attempt(self.inner.describe_subnets(filter, next_token.clone()))
        })
        .await
    }

    async fn describe_vpcs(
        &self,
        filter: &ResourceFilter,
        next_token: Option<String>,
    ) -> Result<Page<Vpc>> {
        self.around(Operation::DescribeVpcs, &|| {
            attempt(self.inner.describe_vpcs(filter, next_token.clone()))
        })
        .await
    }

    async fn describe_security_groups(
        &self,
        filter: &ResourceFilter,
        next_token: Option<String>,
    ) -> Result<Page<SecurityGroup>> {
        self.around(Operation::DescribeSecurityGroups, &|| {
            attempt(
                self.inner
                    .describe_security_groups(filter, next_token.clone()),
            )
        })
        .await
    }

    async fn describe_route_tables(
        &self,
        filter: &ResourceFilter,
        next_token: Option<String>,
    ) -> Result<Page<RouteTable>> {
        self.around(Operation::DescribeRouteTables, &|| {
            attempt(self.inner.describe_route_tables(filter, next_token.clone()))
        })
        .await
    }

    async fn create_network_interface(
        &self,
        request: &CreateEniRequest,
    ) -> Result<NetworkInterface> {
        self.around(Operation::CreateNetworkInterface, &|| {
            attempt(self.inner.create_network_interface(request))
        })
        .await
    }

    async fn attach_network_interface(
        &self,
        eni_id: &str,
        instance_id: &str,
        device_index: u32,
    ) -> Result<String> {
        self.around(Operation::AttachNetworkInterface, &|| {
            attempt(
                self.inner
                    .attach_network_interface(eni_id, instance_id, device_index),
            )
        })
        .await
    }

    async fn set_delete_on_termination(
        &self,
        eni_id: &str,
        attachment_id: &str,
        delete_on_termination: bool,
    ) -> Result<()> {
        self.around(Operation::ModifyNetworkInterfaceAttribute, &|| {
            attempt(self.inner.set_delete_on_termination(
                eni_id,
                attachment_id,
                delete_on_termination,
            ))
        })
        .await
    }

    async fn assign_private_ip_addresses(
        &self,
        eni_id: &str,
        request: AddressRequest,
    ) -> Result<Assigned> {
        self.around(Operation::AssignPrivateIpAddresses, &|| {
            attempt(self.inner.assign_private_ip_addresses(eni_id, request))
        })
        .await
    }

    async fn unassign_private_ip_addresses(
        &self,
        eni_id: &str,
        ips: &[Ipv4Addr],
        prefixes: &[Ipv4Net],
    ) -> Result<()> {
        // Nothing to unassign is no AWS call, at every layer.
        if ips.is_empty() && prefixes.is_empty() {
            return Ok(());
        }
        let call = Call {
            operation: Operation::UnassignPrivateIpAddresses,
            aws_calls: u32::from(!ips.is_empty()) + u32::from(!prefixes.is_empty()),
        };
        let send = || {
            attempt(
                self.inner
                    .unassign_private_ip_addresses(eni_id, ips, prefixes),
            )
        };
        self.layer.around(call, &send).await
    }

    async fn detach_network_interface(&self, attachment_id: &str, force: bool) -> Result<()> {
        self.around(Operation::DetachNetworkInterface, &|| {
            attempt(self.inner.detach_network_interface(attachment_id, force))
        })
        .await
    }

    async fn delete_network_interface(&self, eni_id: &str) -> Result<()> {
        self.around(Operation::DeleteNetworkInterface, &|| {
            attempt(self.inner.delete_network_interface(eni_id))
        })
        .await
    }

    async fn describe_addresses(&self, tags: &Tags) -> Result<Vec<Address>> {
        self.around(Operation::DescribeAddresses, &|| {
            attempt(self.inner.describe_addresses(tags))
        })
        .await
    }

    async fn associate_address(
        &self,
        allocation_id: &str,
        eni_id: &str,
        private_ip: Ipv4Addr,
    ) -> Result<String> {
        self.around(Operation::AssociateAddress, &|| {
            attempt(
                self.inner
                    .associate_address(allocation_id, eni_id, private_ip),
            )
        })
        .await
    }

    async fn disassociate_address(&self, association_id: &str) -> Result<()> {
        self.around(Operation::DisassociateAddress, &|| {
            attempt(self.inner.disassociate_address(association_id))
        })
        .await
    }
}
