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
    SecurityGroup, Subnet, Tags, Vpc, unassign_calls,
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

/// Each method of [`Ec2`] passed through the layer as one [`Call`] of its operation. A describe
/// clones its page token for each attempt; every other argument is `Copy`.
macro_rules! forward {
    (
        describes { $($describe:ident($filter:ty) -> $page:ty => $dop:ident;)* }
        calls { $($name:ident($($arg:ident: $ty:ty),*) -> $out:ty => $op:ident;)* }
        $($rest:item)*
    ) => {
        impl<E: Ec2, L: Layer> Ec2 for Layered<E, L> {
            $(
                async fn $describe(
                    &self,
                    filter: $filter,
                    next_token: Option<String>,
                ) -> Result<$page> {
                    self.around(Operation::$dop, &|| {
                        attempt(self.inner.$describe(filter, next_token.clone()))
                    })
                    .await
                }
            )*
            $(
                async fn $name(&self, $($arg: $ty),*) -> Result<$out> {
                    self.around(Operation::$op, &|| attempt(self.inner.$name($($arg),*)))
                        .await
                }
            )*
            $($rest)*
        }
    };
}

forward! {
    describes {
        describe_instance_types(&[String]) -> Page<InstanceTypeLimits> => DescribeInstanceTypes;
        describe_instances(&InstanceFilter) -> Page<Instance> => DescribeInstances;
        describe_network_interfaces(&EniFilter) -> Page<NetworkInterface>
            => DescribeNetworkInterfaces;
        describe_subnets(&ResourceFilter) -> Page<Subnet> => DescribeSubnets;
        describe_vpcs(&ResourceFilter) -> Page<Vpc> => DescribeVpcs;
        describe_security_groups(&ResourceFilter) -> Page<SecurityGroup>
            => DescribeSecurityGroups;
        describe_route_tables(&ResourceFilter) -> Page<RouteTable> => DescribeRouteTables;
    }
    calls {
        create_network_interface(request: &CreateEniRequest) -> NetworkInterface
            => CreateNetworkInterface;
        attach_network_interface(eni_id: &str, instance_id: &str, device_index: u32) -> String
            => AttachNetworkInterface;
        set_delete_on_termination(
            eni_id: &str,
            attachment_id: &str,
            delete_on_termination: bool
        ) -> () => ModifyNetworkInterfaceAttribute;
        assign_private_ip_addresses(eni_id: &str, request: AddressRequest) -> Assigned
            => AssignPrivateIpAddresses;
        detach_network_interface(attachment_id: &str, force: bool) -> () => DetachNetworkInterface;
        delete_network_interface(eni_id: &str) -> () => DeleteNetworkInterface;
        describe_addresses(tags: &Tags) -> Vec<Address> => DescribeAddresses;
        associate_address(allocation_id: &str, eni_id: &str, private_ip: Ipv4Addr) -> String
            => AssociateAddress;
        disassociate_address(association_id: &str) -> () => DisassociateAddress;
    }

    async fn unassign_private_ip_addresses(
        &self,
        eni_id: &str,
        ips: &[Ipv4Addr],
        prefixes: &[Ipv4Net],
    ) -> Result<()> {
        let aws_calls = unassign_calls(ips, prefixes).count() as u32;
        // Nothing to unassign is no AWS call, at every layer.
        if aws_calls == 0 {
            return Ok(());
        }
        let call = Call {
            operation: Operation::UnassignPrivateIpAddresses,
            aws_calls,
        };
        let send = || {
            attempt(
                self.inner
                    .unassign_private_ip_addresses(eni_id, ips, prefixes),
            )
        };
        self.layer.around(call, &send).await
    }
}
