//! An in-memory EC2 that follows AWS's documented rules, for the engine's tests and for
//! benchmarks: subnet capacity (5 reserved addresses, aligned /28 prefixes, fragmentation),
//! per-instance-type limits, device-index conflicts, asynchronous detach, delete on termination,
//! client-token idempotency, pagination, AWS's per-action throttling buckets, and injectable
//! latency and faults with per-operation counters.
//!
//! [`Simulator`] is a cheap `Clone` handle; the state sits behind one mutex that is never held
//! across an await. All time is tokio time, so tests can run under `tokio::time::pause()`.

mod addressing;
mod calls;
mod eip;
mod faults;
mod seeding;
mod state;
#[cfg(test)]
mod tests;
mod throttle;

use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use ipnet::Ipv4Net;
use tokio::time::Instant;

pub use calls::Call;
pub use faults::{Fault, OpStats, SimStats};
pub use seeding::{Efa, SeedError, resume_token};

use self::calls::CallLog;
use self::faults::Faults;
use self::state::{EniRec, State};
use self::throttle::Throttle;
use eni_operator::ec2::model::*;
use eni_operator::ec2::{Ec2, Ec2Error, Result};

/// Describe page size when none is configured (EC2's usual maximum).
pub const DEFAULT_PAGE_SIZE: usize = 1000;

/// A realistic subset of `DescribeInstanceTypes` (ENIs, IPv4 per ENI, hypervisor).
pub fn default_instance_types() -> Vec<InstanceTypeLimits> {
    let t = |name: &str, enis, ips, nitro, metal| InstanceTypeLimits {
        instance_type: name.to_owned(),
        max_enis: enis,
        ipv4_per_eni: ips,
        ipv6_per_eni: ips,
        nitro,
        bare_metal: metal,
        enis_per_card: Vec::new(),
    };
    vec![
        t("m5.large", 3, 10, true, false),
        t("m5.xlarge", 4, 15, true, false),
        t("m5.2xlarge", 4, 15, true, false),
        t("m5.24xlarge", 15, 50, true, false),
        t("m5.metal", 15, 50, false, true),
        t("c5.large", 3, 10, true, false),
        t("t3.medium", 3, 6, true, false),
        t("t3.large", 3, 12, true, false),
        t("t2.medium", 3, 6, false, false),
        // 32 network cards of 2 interfaces each (DescribeInstanceTypes, us-east-1): pod ENIs
        // fit on card 0 only, beside the primary.
        InstanceTypeLimits {
            enis_per_card: vec![2; 32],
            ..t("p5.48xlarge", 64, 50, true, false)
        },
    ]
}

struct Inner {
    state: State,
    throttle: Throttle,
    faults: Faults,
    calls: CallLog,
    /// Bumped by every lock that may change the state (see [`Simulator::generation`]).
    generation: u64,
}

/// The simulated EC2 account and Region. Clones share the same state.
#[derive(Clone)]
pub struct Simulator {
    inner: Arc<Mutex<Inner>>,
}

impl Default for Simulator {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for Simulator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Simulator").finish_non_exhaustive()
    }
}

impl Simulator {
    /// An empty account with the default instance types, AWS's throttling buckets, page size
    /// [`DEFAULT_PAGE_SIZE`], immediate detach and no injected trouble.
    pub fn new() -> Self {
        let mut state = State::new(DEFAULT_PAGE_SIZE);
        for t in default_instance_types() {
            state.types.insert(t.instance_type.clone(), t);
        }
        Self {
            inner: Arc::new(Mutex::new(Inner {
                state,
                throttle: Throttle::aws_default(Instant::now()),
                faults: Faults::new(0),
                calls: CallLog::default(),
                generation: 0,
            })),
        }
    }

    /// The state, for a change: counts as one (new knobs and seeding functions are safe by
    /// default). Paths known to read only use [`Self::peek`].
    fn lock(&self) -> MutexGuard<'_, Inner> {
        let mut inner = self.peek();
        inner.generation += 1;
        inner
    }

    fn peek(&self) -> MutexGuard<'_, Inner> {
        // A panic elsewhere cannot leave the state half-updated in a way tests rely on.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A number that changes whenever the account's state may have changed (a mutating call,
    /// a harness change, a detach completing); equal numbers mean an unchanged state, so a
    /// harness can skip re-checking it.
    pub fn generation(&self) -> u64 {
        let mut inner = self.peek();
        inner.state.settle(Instant::now());
        inner.generation + inner.state.transitions
    }

    /// Record every call answered from now on ([`Self::take_calls`]).
    pub fn record_calls(&self) {
        self.peek().calls.on = true;
    }

    /// The calls answered since the last take, oldest first.
    pub fn take_calls(&self) -> Vec<Call> {
        std::mem::take(&mut self.peek().calls.calls)
    }

    /// How many calls have named `instance` so far (DescribeInstances and
    /// DescribeNetworkInterfaces filters, AttachNetworkInterface), answered or not.
    pub fn times_named(&self, instance: &str) -> u64 {
        self.peek().calls.named.get(instance).copied().unwrap_or(0)
    }

    fn named<'a>(&self, ids: impl IntoIterator<Item = &'a String>) {
        let mut inner = self.peek();
        for id in ids {
            *inner.calls.named.entry(id.clone()).or_default() += 1;
        }
    }

    // ---- knobs ----

    /// Items per describe page.
    pub fn set_page_size(&self, page_size: usize) {
        self.lock().state.page_size = page_size.max(1);
    }

    /// How long a detached ENI stays `detaching` before it becomes `available`.
    pub fn set_detach_delay(&self, delay: Duration) {
        self.lock().state.detach_delay = delay;
    }

    /// Turn request throttling off.
    pub fn disable_throttling(&self) {
        self.lock().throttle = Throttle::disabled();
    }

    /// Back to AWS's documented buckets, all full.
    pub fn reset_throttling(&self) {
        self.lock().throttle = Throttle::aws_default(Instant::now());
    }

    /// Override one bucket (it starts full); throttling is enabled if it was off.
    pub fn set_bucket(&self, bucket: Bucket, burst: u32, per_second: u32) {
        self.lock()
            .throttle
            .set(bucket, burst, per_second, Instant::now());
    }

    /// Another tenant of the account uses `share` (0 to 1) of every throttling bucket's refill
    /// from now on (AWS's buckets are per account and region; see `throttle`).
    pub fn set_other_tenant_share(&self, share: f64) {
        self.lock().throttle.set_other_tenant(share, Instant::now());
    }

    /// Another tenant's spell, `after` from now: it takes every token left in every throttling
    /// bucket, then `share` (0 to 1) of every refill for `length`; then the steady share
    /// (`set_other_tenant_share`) is back. Replaces a spell not over yet.
    pub fn tenant_spell(&self, after: Duration, length: Duration, share: f64) {
        let now = Instant::now();
        let spell = throttle::Spell {
            start: now + after,
            length,
            share,
        };
        self.lock().throttle.set_spell(spell, now);
    }

    /// Another caller's burst takes every token left in every throttling bucket now (they
    /// refill from empty, at the share `set_other_tenant_share` leaves).
    pub fn empty_buckets(&self) {
        self.lock().throttle.empty(Instant::now());
    }

    /// Eventual consistency (see `state/lag.rs`): each change to an ENI stays invisible to
    /// `DescribeNetworkInterfaces` for a random time up to `max` (seeded); with `refuse_unseen`,
    /// calls naming an ENI whose create is not visible yet answer
    /// `InvalidNetworkInterfaceID.NotFound`, as AWS documents. `Duration::ZERO` turns it off
    /// (the default).
    pub fn set_eventual_consistency(&self, max: Duration, refuse_unseen: bool, seed: u64) {
        self.lock().state.set_lag(max, refuse_unseen, seed);
    }

    /// Every call of `op` takes this long (tokio time) before it is answered.
    pub fn set_latency(&self, op: Operation, latency: Duration) {
        self.lock().faults.set_latency(op, latency);
    }

    /// Answer a fraction `rate` of the calls of `op` with `fault` (seeded RNG).
    pub fn set_fault_rate(&self, op: Operation, rate: f64, fault: Fault) {
        self.lock().faults.set_rate(op, rate, fault);
    }

    /// Reseed the fault RNG (configured latency, rates and queued faults stay).
    pub fn set_seed(&self, seed: u64) {
        self.lock().faults.reseed(seed);
    }

    /// Answer the next `times` calls of `op` with `fault`.
    pub fn inject(&self, op: Operation, fault: Fault, times: usize) {
        self.lock().faults.queue(op, fault, times);
    }

    /// Answer the next `times` calls of `op` with the AWS error `code` (HTTP 500 for
    /// `InternalError`, 503 for `RequestLimitExceeded`, else 400).
    pub fn inject_error(&self, op: Operation, code: &str, times: usize) {
        let status = match code {
            "InternalError" | "InternalFailure" => 500,
            "RequestLimitExceeded" | "Unavailable" | "ServiceUnavailable" => 503,
            _ => 400,
        };
        self.inject(
            op,
            Fault::new(code, "injected by the simulator", status),
            times,
        );
    }

    /// Carry out the next `times` calls of `op`, then answer each with a timeout, as when the
    /// answer is lost on the way back: AWS documents that a request that timed out may have
    /// succeeded ("Ensuring idempotency in Amazon EC2 API requests"), which is why creates
    /// carry a client token and callers of the other calls must look before repeating them.
    pub fn inject_lost_answer(&self, op: Operation, times: usize) {
        self.lock().faults.lose_answers(op, times);
    }

    /// Forget the one-off faults and lost answers not met yet (the rates stay): a fault injected
    /// for "now" must not wait, however long, for the next call of its operation.
    pub fn drop_queued_faults(&self) {
        self.lock().faults.drop_queued();
    }

    /// Per-operation counters so far.
    pub fn stats(&self) -> SimStats {
        self.peek().faults.stats.clone()
    }

    // ---- seeding ----

    pub fn add_instance_type(&self, limits: InstanceTypeLimits) {
        self.lock()
            .state
            .types
            .insert(limits.instance_type.clone(), limits);
    }

    pub fn add_vpc(&self, primary: Ipv4Net, secondary: &[Ipv4Net]) -> String {
        let secondary_cidrs = secondary.to_vec();
        let vpc = |id| Vpc {
            id,
            primary_cidr: primary,
            secondary_cidrs,
        };
        self.lock().state.insert_new("vpc", |s| &mut s.vpcs, vpc)
    }

    /// # Panics
    /// If the VPC is unknown, the CIDR is outside the VPC's blocks, overlaps another subnet,
    /// or is smaller than a /28 (EC2's minimum): see [`Simulator::try_add_subnet`].
    pub fn add_subnet(&self, vpc_id: &str, zone: &str, cidr: Ipv4Net, tags: Tags) -> String {
        self.try_add_subnet(vpc_id, zone, cidr, tags)
            .unwrap_or_else(|e| panic!("add_subnet: {}", e.message))
    }

    /// # Panics
    /// If the VPC is unknown: see [`Simulator::try_add_security_group`].
    pub fn add_security_group(&self, vpc_id: &str, tags: Tags) -> String {
        self.try_add_security_group(vpc_id, tags)
            .unwrap_or_else(|e| panic!("add_security_group: {}", e.message))
    }

    pub fn add_route_table(&self, vpc_id: &str, main: bool, subnet_ids: &[String]) -> String {
        let table = |id| RouteTable {
            id,
            vpc_id: vpc_id.to_owned(),
            main,
            subnet_ids: subnet_ids.to_vec(),
        };
        self.lock()
            .state
            .insert_new("rtb", |s| &mut s.route_tables, table)
    }

    /// Launch a running instance with its primary ENI at device index 0 (delete on
    /// termination, primary address from the subnet, the given groups).
    ///
    /// # Panics
    /// On an unknown type, subnet or group, or a full subnet: see
    /// [`Simulator::try_run_instance`].
    pub fn run_instance(
        &self,
        instance_type: &str,
        subnet_id: &str,
        groups: &[String],
    ) -> Instance {
        self.try_run_instance(instance_type, subnet_id, groups, Tags::new())
            .unwrap_or_else(|e| panic!("run_instance: {}", e.message))
    }

    /// The ENI at device index 0 of network card 0 of an instance.
    pub fn primary_eni_id(&self, instance_id: &str) -> Option<String> {
        self.lock()
            .state
            .enis
            .values()
            .find(|r| r.eni.instance_id() == Some(instance_id) && r.eni.is_primary())
            .map(|r| r.eni.id.clone())
    }

    pub fn set_instance_tags(&self, instance_id: &str, tags: Tags) {
        if let Some(i) = self.lock().state.instances.get_mut(instance_id) {
            i.tags = tags;
        }
    }

    /// Force an instance state (e.g. `Stopping` to test "is not 'running'").
    pub fn set_instance_state(&self, instance_id: &str, state: InstanceState) {
        if let Some(i) = self.lock().state.instances.get_mut(instance_id) {
            i.state = state;
        }
    }

    /// Terminate: delete-on-termination ENIs are deleted, the others detached (`available`).
    /// False if the instance is unknown.
    pub fn terminate_instance(&self, instance_id: &str) -> bool {
        self.lock().state.terminate_instance(instance_id)
    }

    /// A snapshot of an ENI without going through the API (no throttling, no counters).
    pub fn network_interface(&self, eni_id: &str) -> Option<NetworkInterface> {
        let mut inner = self.peek();
        inner.state.settle(Instant::now());
        inner.state.enis.get(eni_id).map(|r: &EniRec| r.eni.clone())
    }

    /// Every ENI of the account without going through the API (no throttling, no counters):
    /// what a test harness checks its invariants against.
    pub fn network_interfaces(&self) -> Vec<NetworkInterface> {
        let mut inner = self.peek();
        inner.state.settle(Instant::now());
        inner.state.enis.values().map(|r| r.eni.clone()).collect()
    }

    /// The ENIs attached to `instance` beside its primary one, by device index (no throttling,
    /// no counters).
    pub fn secondary_enis(&self, instance: &str) -> Vec<NetworkInterface> {
        let mut enis: Vec<NetworkInterface> = self
            .network_interfaces()
            .into_iter()
            .filter(|e| {
                e.attachment
                    .as_ref()
                    .is_some_and(|a| a.instance_id == instance && a.device_index > 0)
            })
            .collect();
        enis.sort_by_key(|e| e.attachment.as_ref().map(|a| a.device_index));
        enis
    }

    /// Check AWS's invariants over the whole state (see `State::check_invariants`).
    pub fn check_invariants(&self) -> std::result::Result<(), String> {
        let mut inner = self.peek();
        inner.state.settle(Instant::now());
        inner.state.check_invariants()
    }

    // ---- the API path ----

    /// One API call: latency, then (under the lock) counters, throttling, injected faults and
    /// finally the operation itself.
    async fn call<T>(
        &self,
        op: Operation,
        f: impl FnOnce(&mut State, Instant) -> Result<T>,
    ) -> Result<T> {
        let latency = self.peek().faults.latency(op);
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        let mut inner = self.peek();
        let now = Instant::now();
        if op.is_mutating() {
            inner.generation += 1;
        }
        let result = inner.answer(op, now, f);
        inner.calls.record(now, op, &result);
        result
    }
}

impl Inner {
    /// Counters, throttling, injected faults and finally the operation itself.
    fn answer<T>(
        &mut self,
        op: Operation,
        now: Instant,
        f: impl FnOnce(&mut State, Instant) -> Result<T>,
    ) -> Result<T> {
        let inner = self;
        inner.faults.count(op).calls += 1;
        if !inner.throttle.try_take(op.bucket(), now) {
            inner.faults.count(op).throttled += 1;
            return Err(Ec2Error::from_aws(
                op,
                "RequestLimitExceeded",
                "Request limit exceeded.",
                Some(503),
            ));
        }
        if let Some(e) = inner.faults.next(op) {
            inner.faults.count(op).faults += 1;
            return Err(e);
        }
        inner.state.settle(now);
        let result = f(&mut inner.state, now);
        let stats = inner.faults.count(op);
        if result.is_ok() {
            stats.ok += 1;
        } else {
            stats.rejected += 1;
        }
        if result.is_ok() && inner.faults.answer_lost(op) {
            inner.faults.count(op).faults += 1;
            return Err(Ec2Error::transient(
                op,
                "Timeout",
                "the call was carried out but its answer was lost (injected)",
            ));
        }
        result
    }
}

impl Ec2 for Simulator {
    async fn describe_instance_types(
        &self,
        types: &[String],
        next_token: Option<String>,
    ) -> Result<Page<InstanceTypeLimits>> {
        self.call(Operation::DescribeInstanceTypes, |s, _| {
            s.describe_instance_types(types, next_token)
        })
        .await
    }

    async fn describe_instances(
        &self,
        filter: &InstanceFilter,
        next_token: Option<String>,
    ) -> Result<Page<Instance>> {
        self.named(&filter.ids);
        self.call(Operation::DescribeInstances, |s, _| {
            s.describe_instances(filter, next_token)
        })
        .await
    }

    async fn describe_network_interfaces(
        &self,
        filter: &EniFilter,
        next_token: Option<String>,
    ) -> Result<Page<NetworkInterface>> {
        self.named(&filter.instance_ids);
        self.call(Operation::DescribeNetworkInterfaces, |s, now| {
            s.describe_network_interfaces_at(filter, next_token, now)
        })
        .await
    }

    async fn describe_subnets(
        &self,
        filter: &ResourceFilter,
        next_token: Option<String>,
    ) -> Result<Page<Subnet>> {
        self.call(Operation::DescribeSubnets, |s, _| {
            s.describe_subnets(filter, next_token)
        })
        .await
    }

    async fn describe_vpcs(
        &self,
        filter: &ResourceFilter,
        next_token: Option<String>,
    ) -> Result<Page<Vpc>> {
        self.call(Operation::DescribeVpcs, |s, _| {
            s.describe_vpcs(filter, next_token)
        })
        .await
    }

    async fn describe_security_groups(
        &self,
        filter: &ResourceFilter,
        next_token: Option<String>,
    ) -> Result<Page<SecurityGroup>> {
        self.call(Operation::DescribeSecurityGroups, |s, _| {
            s.describe_security_groups(filter, next_token)
        })
        .await
    }

    async fn describe_route_tables(
        &self,
        filter: &ResourceFilter,
        next_token: Option<String>,
    ) -> Result<Page<RouteTable>> {
        self.call(Operation::DescribeRouteTables, |s, _| {
            s.describe_route_tables(filter, next_token)
        })
        .await
    }

    async fn create_network_interface(
        &self,
        request: &CreateEniRequest,
    ) -> Result<NetworkInterface> {
        self.call(Operation::CreateNetworkInterface, |s, now| {
            s.lagged_create(now, |s| s.create_network_interface(request))
        })
        .await
    }

    async fn attach_network_interface(
        &self,
        eni_id: &str,
        instance_id: &str,
        device_index: u32,
    ) -> Result<String> {
        let op = Operation::AttachNetworkInterface;
        self.named([&instance_id.to_string()]);
        self.call(op, |s, now| {
            s.lagged(op, eni_id, now, |s| {
                s.attach_network_interface(eni_id, instance_id, device_index)
            })
        })
        .await
    }

    async fn set_delete_on_termination(
        &self,
        eni_id: &str,
        attachment_id: &str,
        delete_on_termination: bool,
    ) -> Result<()> {
        let op = Operation::ModifyNetworkInterfaceAttribute;
        self.call(op, |s, now| {
            s.lagged(op, eni_id, now, |s| {
                s.set_delete_on_termination(eni_id, attachment_id, delete_on_termination)
            })
        })
        .await
    }

    async fn assign_private_ip_addresses(
        &self,
        eni_id: &str,
        request: AddressRequest,
    ) -> Result<Assigned> {
        let op = Operation::AssignPrivateIpAddresses;
        self.call(op, |s, now| {
            s.lagged(op, eni_id, now, |s| {
                s.assign_private_ip_addresses(eni_id, request)
            })
        })
        .await
    }

    async fn unassign_private_ip_addresses(
        &self,
        eni_id: &str,
        ips: &[Ipv4Addr],
        prefixes: &[Ipv4Net],
    ) -> Result<()> {
        let op = Operation::UnassignPrivateIpAddresses;
        // Each of AWS's calls is metered.
        for (ips, prefixes) in unassign_calls(ips, prefixes) {
            self.call(op, |s, now| {
                s.lagged(op, eni_id, now, |s| {
                    s.unassign_private_ip_addresses(op, eni_id, ips, prefixes)
                })
            })
            .await?;
        }
        Ok(())
    }

    async fn detach_network_interface(&self, attachment_id: &str, _force: bool) -> Result<()> {
        self.call(Operation::DetachNetworkInterface, |s, now| {
            s.lagged_detach(attachment_id, now, |s| {
                s.detach_network_interface(attachment_id, now)
            })
        })
        .await
    }

    async fn delete_network_interface(&self, eni_id: &str) -> Result<()> {
        let op = Operation::DeleteNetworkInterface;
        self.call(op, |s, now| {
            s.lagged(op, eni_id, now, |s| s.delete_network_interface(eni_id))
        })
        .await
    }

    async fn describe_addresses(&self, tags: &Tags) -> Result<Vec<Address>> {
        self.describe_addresses_call(tags).await
    }

    async fn associate_address(
        &self,
        allocation_id: &str,
        eni_id: &str,
        private_ip: Ipv4Addr,
    ) -> Result<String> {
        self.associate_address_call(allocation_id, eni_id, private_ip)
            .await
    }

    async fn disassociate_address(&self, association_id: &str) -> Result<()> {
        self.disassociate_address_call(association_id).await
    }
}
