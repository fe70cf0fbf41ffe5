//! Fencing per call (docs/rules.md §14.2): right before each mutating EC2 call and each
//! CiliumNode write, the process checks on the monotonic clock that its lease is still valid,
//! with margin; otherwise the call is not made. The elector grants the fence at the *start* of
//! each successful renewal, for the renew deadline (10 s of a 15 s lease): another replica can
//! take the lease only a lease duration after it saw our last renewal, which it cannot have seen
//! before we sent it.
//!
//! Why per call: the elector drops the leader's work at its renew deadline, but after a freeze
//! longer than the lease (SIGSTOP, a cgroup freeze, a VM pause) every timer fires at once, and a
//! task may send a call it planned before the freeze before the elector has run. The checks sit
//! in wrappers every call passes ([`Fenced`] inside the gate, so each retry is checked too;
//! [`FencedSink`] around the sink), not in the steps that make the calls.

use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex};

use ipnet::Ipv4Net;
use tokio::time::Instant;

use crate::crd::CiliumNode;
use crate::ec2::{
    AddressRequest, Assigned, CreateEniRequest, Ec2, Ec2Error, EniFilter, ErrorKind, Instance,
    InstanceFilter, InstanceTypeLimits, NetworkInterface, Operation, Page, ResourceFilter, Result,
    RouteTable, SecurityGroup, Subnet, Vpc,
};
use crate::ipam::ChangeSet;

use super::sink::{NodeEvent, NodeRef, NodeSink, SinkError, SinkResult};

/// The error code of a call the fence stopped (never sent to EC2).
pub const LEASE_EXPIRED: &str = "LeaseExpired";

/// Until when this process may make mutating calls. Cheap to clone (a handle).
#[derive(Clone, Debug)]
pub struct Fence {
    /// `None` in `until`: closed. `open`: no election, always valid.
    until: Arc<Mutex<Option<Instant>>>,
    open: bool,
}

impl Fence {
    /// Always valid: a process that runs without leader election.
    pub fn open() -> Self {
        Self {
            until: Arc::default(),
            open: true,
        }
    }

    /// Closed until the elector grants it.
    pub fn closed() -> Self {
        Self {
            until: Arc::default(),
            open: false,
        }
    }

    /// Valid until `until` (a renewal that started at `until` - renew deadline succeeded).
    pub fn grant(&self, until: Instant) {
        let mut u = self.until.lock().expect("fence");
        *u = Some(u.map_or(until, |t| t.max(until)));
    }

    /// No longer valid (leadership lost or given up).
    pub fn revoke(&self) {
        *self.until.lock().expect("fence") = None;
    }

    /// Whether a mutating call may be made now.
    pub fn valid(&self) -> bool {
        if self.open || crate::mutants::active("no-fence") {
            return true;
        }
        self.until
            .lock()
            .expect("fence")
            .is_some_and(|until| Instant::now() < until)
    }

    fn check(&self, op: Operation) -> Result<()> {
        if self.valid() {
            return Ok(());
        }
        Err(Ec2Error::new(
            op,
            ErrorKind::Other,
            LEASE_EXPIRED,
            "not sent: this process's lease may have expired",
        ))
    }

    fn check_write(&self) -> SinkResult<()> {
        if self.valid() {
            return Ok(());
        }
        Err(SinkError::Other(format!(
            "{LEASE_EXPIRED}: not sent: this process's lease may have expired"
        )))
    }
}

/// An EC2 client whose mutating calls pass the [`Fence`] (describes do not need it).
pub struct Fenced<E> {
    inner: E,
    fence: Fence,
}

impl<E> Fenced<E> {
    pub fn new(inner: E, fence: Fence) -> Self {
        Self { inner, fence }
    }
}

impl<E: Ec2> Ec2 for Fenced<E> {
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
        self.fence.check(Operation::CreateNetworkInterface)?;
        self.inner.create_network_interface(request).await
    }
    async fn attach_network_interface(
        &self,
        eni_id: &str,
        instance_id: &str,
        device_index: u32,
    ) -> Result<String> {
        self.fence.check(Operation::AttachNetworkInterface)?;
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
        self.fence
            .check(Operation::ModifyNetworkInterfaceAttribute)?;
        self.inner
            .set_delete_on_termination(eni_id, attachment_id, delete_on_termination)
            .await
    }
    async fn assign_private_ip_addresses(
        &self,
        eni_id: &str,
        request: AddressRequest,
    ) -> Result<Assigned> {
        self.fence.check(Operation::AssignPrivateIpAddresses)?;
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
        self.fence.check(Operation::UnassignPrivateIpAddresses)?;
        self.inner
            .unassign_private_ip_addresses(eni_id, ips, prefixes)
            .await
    }
    async fn detach_network_interface(&self, attachment_id: &str, force: bool) -> Result<()> {
        self.fence.check(Operation::DetachNetworkInterface)?;
        self.inner
            .detach_network_interface(attachment_id, force)
            .await
    }
    async fn delete_network_interface(&self, eni_id: &str) -> Result<()> {
        self.fence.check(Operation::DeleteNetworkInterface)?;
        self.inner.delete_network_interface(eni_id).await
    }
    async fn describe_addresses(
        &self,
        tags: &crate::ec2::Tags,
    ) -> Result<Vec<crate::ec2::Address>> {
        self.inner.describe_addresses(tags).await
    }
    async fn associate_address(
        &self,
        allocation_id: &str,
        eni_id: &str,
        private_ip: Ipv4Addr,
    ) -> Result<String> {
        self.fence.check(Operation::AssociateAddress)?;
        self.inner
            .associate_address(allocation_id, eni_id, private_ip)
            .await
    }
    async fn disassociate_address(&self, association_id: &str) -> Result<()> {
        self.fence.check(Operation::DisassociateAddress)?;
        self.inner.disassociate_address(association_id).await
    }
}

/// A sink whose writes (patches, finalizer, annotation, delete, Events) pass the [`Fence`];
/// reads do not need it.
pub struct FencedSink<S> {
    inner: S,
    fence: Fence,
}

impl<S> FencedSink<S> {
    pub fn new(inner: S, fence: Fence) -> Self {
        Self { inner, fence }
    }

    pub fn inner(&self) -> &S {
        &self.inner
    }
}

impl<S: NodeSink> NodeSink for FencedSink<S> {
    async fn apply(&self, node: &NodeRef, changes: &ChangeSet) -> SinkResult<Option<CiliumNode>> {
        self.fence.check_write()?;
        self.inner.apply(node, changes).await
    }
    async fn event(&self, node: &NodeRef, event: NodeEvent) {
        if self.fence.valid() {
            self.inner.event(node, event).await
        }
    }
    async fn set_finalizer(&self, node: &NodeRef, present: bool) -> SinkResult<Option<CiliumNode>> {
        self.fence.check_write()?;
        self.inner.set_finalizer(node, present).await
    }
    async fn set_annotation(
        &self,
        node: &NodeRef,
        key: &str,
        value: Option<&str>,
    ) -> SinkResult<Option<CiliumNode>> {
        self.fence.check_write()?;
        self.inner.set_annotation(node, key, value).await
    }
    async fn delete(&self, name: &str) -> SinkResult<()> {
        self.fence.check_write()?;
        self.inner.delete(name).await
    }
    async fn node_exists(&self, name: &str) -> SinkResult<bool> {
        self.inner.node_exists(name).await
    }
    async fn fetch(&self, name: &str) -> SinkResult<Option<CiliumNode>> {
        self.inner.fetch(name).await
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_fence_is_valid_until_its_grant_and_never_after_a_revoke() {
        let fence = Fence::closed();
        assert!(!fence.valid(), "closed until granted");
        fence.grant(Instant::now() + Duration::from_secs(10));
        assert!(fence.valid());
        tokio::time::advance(Duration::from_secs(10)).await;
        assert!(!fence.valid(), "expired at its end");
        fence.grant(Instant::now() + Duration::from_secs(10));
        fence.revoke();
        assert!(!fence.valid(), "revoked");
        assert!(Fence::open().valid());
    }
}
