//! Gate tests on a fake backend, under paused tokio time: the fake records the (tokio) instant of
//! every call, so rates are checked on simulated time, never on the wall clock.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use super::*;
use crate::ec2::collect_pages;

/// Counts calls with timestamps; can be told to fail the next calls of an operation.
#[derive(Default)]
struct Fake {
    log: Mutex<Vec<(Operation, Instant)>>,
    script: Mutex<HashMap<Operation, VecDeque<Ec2Error>>>,
    /// Pages a describe of subnets returns.
    pages: u32,
}

impl Fake {
    fn fail(&self, op: Operation, code: &str, times: usize) {
        let err = Ec2Error::from_aws(op, code, "scripted", Some(400));
        self.script
            .lock()
            .unwrap()
            .entry(op)
            .or_default()
            .extend(std::iter::repeat_n(err, times));
    }

    fn record(&self, op: Operation) -> Result<()> {
        self.log.lock().unwrap().push((op, Instant::now()));
        match self
            .script
            .lock()
            .unwrap()
            .get_mut(&op)
            .and_then(|q| q.pop_front())
        {
            Some(err) => Err(err),
            None => Ok(()),
        }
    }

    fn times(&self, op: Option<Operation>) -> Vec<Instant> {
        self.log
            .lock()
            .unwrap()
            .iter()
            .filter(|(o, _)| op.is_none_or(|op| *o == op))
            .map(|(_, t)| *t)
            .collect()
    }
}

fn eni() -> NetworkInterface {
    NetworkInterface {
        id: "eni-1".into(),
        subnet_id: "subnet-1".into(),
        vpc_id: "vpc-1".into(),
        availability_zone: "us-east-1a".into(),
        mac: String::new(),
        description: String::new(),
        primary_ip: Ipv4Addr::new(10, 0, 0, 5),
        secondary_ips: vec![],
        prefixes: vec![],
        ipv6_prefixes: vec![],
        security_groups: vec![],
        tags: Tags::new(),
        state: EniState::Available,
        attachment: None,
        public_ip: None,
        interface_type: InterfaceType::Interface,
    }
}

impl Ec2 for Fake {
    async fn describe_instance_types(
        &self,
        _: &[String],
        _: Option<String>,
    ) -> Result<Page<InstanceTypeLimits>> {
        self.record(Operation::DescribeInstanceTypes)?;
        Ok(Page::last(vec![]))
    }
    async fn describe_instances(
        &self,
        _: &InstanceFilter,
        _: Option<String>,
    ) -> Result<Page<Instance>> {
        self.record(Operation::DescribeInstances)?;
        Ok(Page::last(vec![]))
    }
    async fn describe_network_interfaces(
        &self,
        _: &EniFilter,
        _: Option<String>,
    ) -> Result<Page<NetworkInterface>> {
        self.record(Operation::DescribeNetworkInterfaces)?;
        Ok(Page::last(vec![eni()]))
    }
    async fn describe_subnets(
        &self,
        _: &ResourceFilter,
        next_token: Option<String>,
    ) -> Result<Page<Subnet>> {
        self.record(Operation::DescribeSubnets)?;
        let n: u32 = next_token.map_or(0, |t| t.parse().unwrap());
        let subnet = Subnet {
            id: format!("subnet-{n}"),
            vpc_id: "vpc-1".into(),
            availability_zone: "us-east-1a".into(),
            cidr: "10.0.0.0/24".parse().unwrap(),
            available_addresses: 251,
            tags: Tags::new(),
        };
        let next_token = (n + 1 < self.pages).then(|| (n + 1).to_string());
        Ok(Page {
            items: vec![subnet],
            next_token,
        })
    }
    async fn describe_vpcs(&self, _: &ResourceFilter, _: Option<String>) -> Result<Page<Vpc>> {
        self.record(Operation::DescribeVpcs)?;
        Ok(Page::last(vec![]))
    }
    async fn describe_security_groups(
        &self,
        _: &ResourceFilter,
        _: Option<String>,
    ) -> Result<Page<SecurityGroup>> {
        self.record(Operation::DescribeSecurityGroups)?;
        Ok(Page::last(vec![]))
    }
    async fn describe_route_tables(
        &self,
        _: &ResourceFilter,
        _: Option<String>,
    ) -> Result<Page<RouteTable>> {
        self.record(Operation::DescribeRouteTables)?;
        Ok(Page::last(vec![]))
    }
    async fn create_network_interface(&self, _: &CreateEniRequest) -> Result<NetworkInterface> {
        self.record(Operation::CreateNetworkInterface)?;
        Ok(eni())
    }
    async fn attach_network_interface(&self, _: &str, _: &str, _: u32) -> Result<String> {
        self.record(Operation::AttachNetworkInterface)?;
        Ok("eni-attach-1".into())
    }
    async fn set_delete_on_termination(&self, _: &str, _: &str, _: bool) -> Result<()> {
        self.record(Operation::ModifyNetworkInterfaceAttribute)
    }
    async fn assign_private_ip_addresses(&self, _: &str, _: AddressRequest) -> Result<Assigned> {
        self.record(Operation::AssignPrivateIpAddresses)?;
        Ok(Assigned::default())
    }
    async fn unassign_private_ip_addresses(
        &self,
        _: &str,
        _: &[Ipv4Addr],
        _: &[Ipv4Net],
    ) -> Result<()> {
        self.record(Operation::UnassignPrivateIpAddresses)
    }
    async fn detach_network_interface(&self, _: &str, _: bool) -> Result<()> {
        self.record(Operation::DetachNetworkInterface)
    }
    async fn delete_network_interface(&self, _: &str) -> Result<()> {
        self.record(Operation::DeleteNetworkInterface)
    }

    async fn describe_addresses(&self, _: &Tags) -> Result<Vec<Address>> {
        self.record(Operation::DescribeAddresses).map(|_| vec![])
    }

    async fn associate_address(&self, _: &str, _: &str, _: Ipv4Addr) -> Result<String> {
        self.record(Operation::AssociateAddress)
            .map(|_| "eipassoc-1".to_string())
    }

    async fn disassociate_address(&self, _: &str) -> Result<()> {
        self.record(Operation::DisassociateAddress)
    }
}

/// For every window [t_i, t_j] of the sorted call times: calls ≤ burst + rate × (t_j − t_i).
fn assert_within_rate(mut times: Vec<Instant>, burst: u32, per_sec: f64) {
    times.sort();
    for i in 0..times.len() {
        for j in i..times.len() {
            let calls = (j - i + 1) as f64;
            let window = (times[j] - times[i]).as_secs_f64();
            let allowed = f64::from(burst) + per_sec * window + 1e-6;
            assert!(
                calls <= allowed,
                "{calls} calls in {window}s exceed burst {burst} + {per_sec}/s"
            );
        }
    }
}

fn gate(fake: Fake, config: GateConfig) -> Arc<Gate<Fake>> {
    Arc::new(Gate::new(fake, config))
}

#[test]
fn default_buckets_are_a_fraction_of_aws() {
    let config = GateConfig::aws_defaults();
    assert_eq!(config.bucket_limits(Bucket::Describe), (80, 16.0));
    assert_eq!(config.bucket_limits(Bucket::GeneralMutating), (40, 4.0));
    assert_eq!(
        config.bucket_limits(Bucket::CreateNetworkInterface),
        (80, 4.0)
    );
    let tiny = GateConfig {
        rate_fraction: 0.001,
        ..GateConfig::aws_defaults()
    };
    assert_eq!(
        tiny.bucket_limits(Bucket::Describe).0,
        1,
        "burst at least 1"
    );
    let mut overridden = GateConfig::aws_defaults();
    overridden.overrides.insert(Bucket::Describe, (7, 2.5));
    assert_eq!(overridden.bucket_limits(Bucket::Describe), (7, 2.5));
}

#[tokio::test(start_paused = true)]
async fn a_thousand_concurrent_calls_never_exceed_the_rate() {
    let g = gate(Fake::default(), GateConfig::aws_defaults());
    let (burst, rate) = g.config().bucket_limits(Bucket::Describe);
    let start = Instant::now();
    let tasks: Vec<_> = (0..1000)
        .map(|i| {
            let g = g.clone();
            tokio::spawn(async move {
                // Mix the describes that share AWS's describe bucket.
                if i % 2 == 0 {
                    g.describe_subnets(&ResourceFilter::default(), None)
                        .await
                        .map(|_| ())
                } else {
                    g.describe_network_interfaces(&EniFilter::default(), None)
                        .await
                        .map(|_| ())
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    let times = g.inner().times(None);
    assert_eq!(times.len(), 1000);
    assert_within_rate(times.clone(), burst, rate);
    // And the bucket was used, not starved: the last call comes when the rate allows it.
    let last = times
        .iter()
        .max()
        .unwrap()
        .duration_since(start)
        .as_secs_f64();
    let expected = (1000.0 - f64::from(burst)) / rate;
    assert!(
        (last - expected).abs() < 0.5,
        "last call at {last}s, expected ~{expected}s"
    );
    assert_eq!(g.stats().total_calls(), 1000);
}

#[tokio::test(start_paused = true)]
async fn buckets_are_independent_per_action() {
    let g = gate(Fake::default(), GateConfig::aws_defaults());
    let start = Instant::now();
    // 40 creates and 40 attaches: each within its own burst, so none waits.
    let creates = (0..40).map(|_| {
        let g = g.clone();
        tokio::spawn(async move {
            g.create_network_interface(&CreateEniRequest {
                subnet_id: "subnet-1".into(),
                security_groups: vec![],
                description: String::new(),
                tags: Tags::new(),
                addresses: AddressRequest::Ips(1),
                client_token: "t".into(),
            })
            .await
            .map(|_| ())
        })
    });
    let attaches = (0..40).map(|_| {
        let g = g.clone();
        tokio::spawn(async move {
            g.attach_network_interface("eni-1", "i-1", 1)
                .await
                .map(|_| ())
        })
    });
    let all: Vec<_> = creates.chain(attaches).collect();
    for t in all {
        t.await.unwrap().unwrap();
    }
    assert!(g.inner().times(None).iter().all(|t| *t == start));
}

#[tokio::test(start_paused = true)]
async fn single_bucket_mode_shares_one_bucket_across_operations() {
    let g = gate(Fake::default(), GateConfig::cilium_like());
    let start = Instant::now();
    let tasks: Vec<_> = (0..60)
        .map(|i| {
            let g = g.clone();
            tokio::spawn(async move {
                match i % 3 {
                    0 => g
                        .describe_subnets(&ResourceFilter::default(), None)
                        .await
                        .map(|_| ()),
                    1 => g
                        .attach_network_interface("eni-1", "i-1", 1)
                        .await
                        .map(|_| ()),
                    _ => g.delete_network_interface("eni-1").await,
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    let times = g.inner().times(None);
    assert_within_rate(times.clone(), 20, 4.0);
    let last = times.iter().max().unwrap().duration_since(start);
    assert!(
        last >= Duration::from_secs(10),
        "60 calls at 4/s after a burst of 20: {last:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn throttling_is_retried_with_backoff() {
    let fake = Fake::default();
    fake.fail(
        Operation::AssignPrivateIpAddresses,
        "RequestLimitExceeded",
        2,
    );
    let g = gate(fake, GateConfig::aws_defaults());
    g.assign_private_ip_addresses("eni-1", AddressRequest::Ips(3))
        .await
        .expect("third attempt succeeds");
    let times = g.inner().times(Some(Operation::AssignPrivateIpAddresses));
    assert_eq!(times.len(), 3);
    // Each retry waits at least the base delay (backoff and bucket penalty).
    for pair in times.windows(2) {
        assert!(
            pair[1] - pair[0] >= Duration::from_millis(200),
            "{:?}",
            pair[1] - pair[0]
        );
    }
    let stats = g.stats();
    assert_eq!(stats.retries[&Operation::AssignPrivateIpAddresses], 2);
    assert_eq!(stats.throttled[&Operation::AssignPrivateIpAddresses], 2);
    assert_eq!(stats.calls[&Operation::AssignPrivateIpAddresses], 3);
}

#[tokio::test(start_paused = true)]
async fn transient_failures_are_retried() {
    let fake = Fake::default();
    fake.fail(Operation::DeleteNetworkInterface, "InternalError", 1);
    let g = gate(fake, GateConfig::aws_defaults());
    g.delete_network_interface("eni-1").await.unwrap();
    assert_eq!(g.inner().times(None).len(), 2);
    assert_eq!(g.stats().total_throttled(), 0);
}

/// The retry delays of a seeded gate (the simulation's) are the same in every run; with
/// `backon`'s own OS-seeded jitter they differ from run to run.
#[tokio::test(start_paused = true)]
async fn a_seeded_gate_retries_after_the_same_delays() {
    async fn delays(seed: u64) -> Vec<Duration> {
        let fake = Fake::default();
        fake.fail(Operation::DeleteNetworkInterface, "InternalError", 4);
        let config = GateConfig {
            jitter_seed: Some(seed),
            ..GateConfig::aws_defaults()
        };
        let g = gate(fake, config);
        g.delete_network_interface("eni-1").await.unwrap();
        let times = g.inner().times(None);
        times.windows(2).map(|w| w[1] - w[0]).collect()
    }
    let a = delays(11).await;
    assert_eq!(a.len(), 4, "four retries");
    assert_eq!(a, delays(11).await);
    assert_ne!(a, delays(12).await, "the seed chooses the jitter");
}

#[tokio::test(start_paused = true)]
async fn a_lost_answer_of_a_call_without_a_token_is_not_repeated() {
    // A 5xx or timeout may hide an assign or attach that took effect: repeating it would
    // assign the addresses twice. Throttled answers were not carried out and are repeated.
    let fake = Fake::default();
    fake.fail(Operation::AssignPrivateIpAddresses, "InternalError", 1);
    fake.fail(Operation::AttachNetworkInterface, "InternalError", 1);
    let g = gate(fake, GateConfig::aws_defaults());
    let err = g
        .assign_private_ip_addresses("eni-1", AddressRequest::Ips(3))
        .await
        .unwrap_err();
    assert_eq!(err.kind, ErrorKind::Transient);
    let err = g
        .attach_network_interface("eni-1", "i-1", 1)
        .await
        .unwrap_err();
    assert_eq!(err.kind, ErrorKind::Transient);
    assert_eq!(g.inner().times(None).len(), 2, "no repeat");
    g.inner().fail(
        Operation::AssignPrivateIpAddresses,
        "RequestLimitExceeded",
        1,
    );
    g.assign_private_ip_addresses("eni-1", AddressRequest::Ips(3))
        .await
        .unwrap();
    assert_eq!(
        g.inner().times(None).len(),
        4,
        "a throttled assign is repeated"
    );
}

#[tokio::test(start_paused = true)]
async fn client_errors_are_not_retried() {
    let fake = Fake::default();
    fake.fail(
        Operation::AssignPrivateIpAddresses,
        "PrivateIpAddressLimitExceeded",
        1,
    );
    let g = gate(fake, GateConfig::aws_defaults());
    let err = g
        .assign_private_ip_addresses("eni-1", AddressRequest::Ips(3))
        .await
        .unwrap_err();
    assert_eq!(err.kind, ErrorKind::IpLimitExceeded);
    assert_eq!(g.inner().times(None).len(), 1);
    assert_eq!(g.stats().total_retries(), 0);
}

fn create_request() -> CreateEniRequest {
    CreateEniRequest {
        subnet_id: "subnet-1".into(),
        security_groups: vec![],
        description: String::new(),
        tags: Tags::new(),
        addresses: AddressRequest::Ips(0),
        client_token: "t".into(),
    }
}

#[tokio::test(start_paused = true)]
async fn attempts_are_bounded() {
    let fake = Fake::default();
    fake.fail(Operation::CreateNetworkInterface, "InternalError", 10);
    let config = GateConfig {
        max_attempts: 3,
        ..GateConfig::aws_defaults()
    };
    let g = gate(fake, config);
    let err = g
        .create_network_interface(&create_request())
        .await
        .unwrap_err();
    assert_eq!(err.kind, ErrorKind::Transient);
    assert_eq!(g.inner().times(None).len(), 3);
    assert_eq!(g.stats().total_retries(), 2);
}

#[tokio::test(start_paused = true)]
async fn throttled_answers_are_retried_until_the_deadline_not_the_attempt_count() {
    let fake = Fake::default();
    fake.fail(
        Operation::CreateNetworkInterface,
        "RequestLimitExceeded",
        10,
    );
    let config = GateConfig {
        max_attempts: 3,
        ..GateConfig::aws_defaults()
    };
    let g = gate(fake, config);
    // Ten throttled answers in a row: scarcity, not failure. The call waits and succeeds.
    g.create_network_interface(&create_request())
        .await
        .expect("retried past max_attempts while throttled");
    assert_eq!(g.inner().times(None).len(), 11);
    assert_eq!(g.stats().total_throttled(), 10);

    // Past the deadline the throttled answer is returned (the caller reschedules the work).
    let fake = Fake::default();
    fake.fail(
        Operation::CreateNetworkInterface,
        "RequestLimitExceeded",
        1000,
    );
    let config = GateConfig {
        throttle_deadline: Duration::from_secs(60),
        ..GateConfig::aws_defaults()
    };
    let g = gate(fake, config);
    let start = Instant::now();
    let err = g
        .create_network_interface(&create_request())
        .await
        .unwrap_err();
    assert!(err.is_throttled());
    let took = start.elapsed();
    assert!(
        took >= Duration::from_secs(60) && took < Duration::from_secs(60 + 40),
        "gave up after {took:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn the_throttle_deadline_counts_retrying_not_waiting_for_a_token() {
    // One token a minute: each attempt waits its turn for about a minute, longer than the
    // deadline. Its throttled answers are scarcity like any other: only the attempts and their
    // backoff count against the deadline, not the waits in line.
    let config = GateConfig {
        overrides: [(Bucket::CreateNetworkInterface, (1, 1.0 / 60.0))].into(),
        throttle_deadline: Duration::from_secs(30),
        ..GateConfig::aws_defaults()
    };
    let g = gate(Fake::default(), config);
    g.create_network_interface(&create_request())
        .await
        .expect("the first takes the token");
    g.inner()
        .fail(Operation::CreateNetworkInterface, "RequestLimitExceeded", 2);
    let start = Instant::now();
    g.create_network_interface(&create_request())
        .await
        .expect("retried: waiting in line is not retrying");
    assert!(
        start.elapsed() >= Duration::from_secs(120),
        "it waited its turn three times: {:?}",
        start.elapsed()
    );
    assert_eq!(g.stats().total_failed(), 0);
    assert_eq!(g.stats().total_throttled(), 2);
}

fn rate_of(g: &Gate<Fake>, bucket: Bucket) -> f64 {
    g.rates()
        .into_iter()
        .find(|(name, _)| *name == bucket.name())
        .expect("bucket listed")
        .1
}

#[tokio::test(start_paused = true)]
async fn a_throttled_answer_cuts_the_rate_of_its_bucket_only() {
    let fake = Fake::default();
    fake.fail(Operation::AttachNetworkInterface, "RequestLimitExceeded", 1);
    let g = gate(fake, GateConfig::aws_defaults());
    let ceiling = |b| g.config().bucket_limits(b).1;
    g.attach_network_interface("eni-1", "i-1", 1).await.unwrap();
    // Cut by the SDK's beta from what was sent (one call in the measuring window), on its way
    // back (the retry waited for the restore probe 2 s later).
    let general = rate_of(&g, Bucket::GeneralMutating);
    let sent = 1.0 / rate::MEASURE.as_secs_f64();
    let cut = ceiling(Bucket::GeneralMutating).min(sent) * rate::BETA;
    assert!(
        general > cut && general < ceiling(Bucket::GeneralMutating) * rate::BETA,
        "{general} vs {cut}"
    );
    for b in Bucket::ALL {
        if b != Bucket::GeneralMutating {
            assert_eq!(rate_of(&g, b), ceiling(b), "{b:?} is independent");
        }
    }
}

/// A gate whose delete bucket (80 burst, 4/s) was cut three times just after ten calls went
/// out (so the cuts start from the ceiling), with no penalty: only the pacing spaces the calls.
async fn cut_three_times() -> Arc<Gate<Fake>> {
    let config = GateConfig {
        base_delay: Duration::from_millis(1),
        max_delay: Duration::from_millis(1),
        ..GateConfig::aws_defaults()
    };
    let g = gate(Fake::default(), config);
    for _ in 0..10 {
        g.delete_network_interface("eni-1").await.unwrap();
    }
    g.inner()
        .fail(Operation::DeleteNetworkInterface, "RequestLimitExceeded", 3);
    g.delete_network_interface("eni-1").await.unwrap();
    g
}

/// `n` deletes at once; the instants of the deletes sent after `after` (all of them).
async fn concurrent_deletes(g: &Arc<Gate<Fake>>, n: usize, after: Instant) -> Vec<Instant> {
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let g = g.clone();
            tokio::spawn(async move { g.delete_network_interface("eni-2").await })
        })
        .collect();
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    let times: Vec<Instant> = g
        .inner()
        .times(Some(Operation::DeleteNetworkInterface))
        .into_iter()
        .filter(|t| *t > after)
        .collect();
    assert_eq!(times.len(), n);
    times
}

#[tokio::test(start_paused = true)]
async fn below_the_ceiling_calls_are_paced_at_the_learned_rate() {
    let g = cut_three_times().await;
    let rate = rate_of(&g, Bucket::DeleteNetworkInterface);
    assert!(rate < 4.0 * 0.35, "three cuts from 4/s: {rate}");
    // Thirty concurrent deletes: one every 1/rate, not the burst of 80 the ceiling allows,
    // until the restore probe 2 s after the first cut takes the rate back to the ceiling.
    let start = Instant::now();
    let times = concurrent_deletes(&g, 30, start).await;
    let gap = 1.0 / rate;
    let first = [times[0] - start, times[1] - times[0]];
    for d in first {
        let d = d.as_secs_f64();
        assert!(d >= gap * 0.99 && d <= gap * 1.01, "{first:?} at {rate}/s");
    }
    let span = (*times.iter().max().unwrap() - start).as_secs_f64();
    assert!(
        span < 15.0,
        "30 calls over {span} s: the probe restored the ceiling (22 s at {rate}/s)"
    );
    assert_eq!(rate_of(&g, Bucket::DeleteNetworkInterface), 4.0);
}

#[tokio::test(start_paused = true)]
async fn new_work_yields_the_next_slot_to_half_done_work() {
    // One bucket for everything (Cilium's mode), throttled once: scarcity. Its floor (1/s) is
    // the rate after the cut, and the calls below are done before the probe's ramp gets back
    // to the ceiling (100/s).
    let fake = Fake::default();
    fake.fail(Operation::DescribeVpcs, "RequestLimitExceeded", 1);
    let config = GateConfig {
        single_bucket: Some((100.0, 1)),
        ..GateConfig::aws_defaults()
    };
    let g = gate(fake, config);
    // Throttled, then retried: the rate is cut. Then queue creates first and attaches after.
    g.describe_vpcs(&ResourceFilter::default(), None)
        .await
        .unwrap();
    assert!(g.rates()[0].1 < 100.0);
    let mut tasks = Vec::new();
    for i in 0..3 {
        let g = g.clone();
        tasks.push(tokio::spawn(async move {
            g.create_network_interface(&create_request())
                .await
                .map(|_| ())
        }));
        tokio::time::sleep(Duration::from_millis(1 + i)).await;
    }
    for _ in 0..3 {
        let g = g.clone();
        tasks.push(tokio::spawn(async move {
            g.attach_network_interface("eni-1", "i-1", 1)
                .await
                .map(|_| ())
        }));
    }
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    let log = g.inner().log.lock().unwrap().clone();
    let order: Vec<Operation> = log.iter().skip(2).map(|(op, _)| *op).collect();
    assert_eq!(
        order,
        [
            [Operation::AttachNetworkInterface; 3],
            [Operation::CreateNetworkInterface; 3]
        ]
        .concat(),
        "attaches that complete work go before new creates, although queued later"
    );
}

#[tokio::test(start_paused = true)]
async fn a_throttled_answer_slows_the_whole_bucket() {
    let fake = Fake::default();
    fake.fail(Operation::AttachNetworkInterface, "RequestLimitExceeded", 1);
    let g = gate(fake, GateConfig::aws_defaults());
    let start = Instant::now();
    let throttled = {
        let g = g.clone();
        tokio::spawn(async move { g.attach_network_interface("eni-1", "i-1", 1).await })
    };
    tokio::time::sleep(Duration::from_millis(10)).await;
    // Detach shares the general mutating bucket with attach: it waits out the penalty although
    // tokens are plentiful. Delete has a bucket of its own and goes at once.
    let (detach, delete) = tokio::join!(
        g.detach_network_interface("eni-attach-1", false),
        g.delete_network_interface("eni-2"),
    );
    detach.unwrap();
    delete.unwrap();
    throttled.await.unwrap().unwrap();
    let at = |op| g.inner().times(Some(op))[0].duration_since(start);
    assert!(at(Operation::DetachNetworkInterface) >= Duration::from_millis(200));
    assert_eq!(
        at(Operation::DeleteNetworkInterface),
        Duration::from_millis(10)
    );
}

/// A gate whose general mutating bucket is so large (1000/s, floor 10/s) that its pacing never
/// spaces calls more than the penalties and backoffs under test.
fn large_general_bucket(config: GateConfig) -> GateConfig {
    GateConfig {
        overrides: [(Bucket::GeneralMutating, (1000, 1000.0))].into(),
        ..config
    }
}

#[tokio::test(start_paused = true)]
async fn consecutive_throttles_grow_the_penalty_up_to_its_cap_and_success_resets_it() {
    let fake = Fake::default();
    fake.fail(Operation::DetachNetworkInterface, "RequestLimitExceeded", 6);
    let config = large_general_bucket(GateConfig {
        max_attempts: 1,
        // Throttled answers are returned at once, so each call below is one attempt.
        throttle_deadline: Duration::ZERO,
        ..GateConfig::aws_defaults()
    });
    let g = gate(fake, config);
    let mut starts = Vec::new();
    for _ in 0..7 {
        let _ = g.detach_network_interface("a", false).await;
        starts.push(*g.inner().times(None).last().unwrap());
    }
    let gaps: Vec<_> = starts.windows(2).map(|w| w[1] - w[0]).collect();
    // 200 ms doubling, capped at THROTTLED_MAX_DELAY (2 s), not at max_delay (20 s).
    let expected = [200, 400, 800, 1600, 2000, 2000].map(Duration::from_millis);
    // (tokio's timer rounds a wake-up to the next millisecond.)
    for (gap, want) in gaps.iter().zip(expected) {
        assert!(
            *gap >= want && *gap <= want + Duration::from_millis(2),
            "{gaps:?} vs {expected:?}"
        );
    }
    // After the success, the penalty is gone: only the pacing (at least the floor, 10/s)
    // remains.
    let before = *starts.last().unwrap();
    g.detach_network_interface("a", false).await.unwrap();
    let gap = *g.inner().times(None).last().unwrap() - before;
    assert!(gap <= Duration::from_millis(102), "{gap:?}");
}

#[tokio::test(start_paused = true)]
async fn a_throttled_call_never_sleeps_longer_than_the_cap_between_attempts() {
    let fake = Fake::default();
    fake.fail(Operation::AttachNetworkInterface, "RequestLimitExceeded", 8);
    let g = gate(fake, large_general_bucket(GateConfig::aws_defaults()));
    g.attach_network_interface("eni-1", "i-1", 1).await.unwrap();
    let times = g.inner().times(Some(Operation::AttachNetworkInterface));
    assert_eq!(times.len(), 9);
    let gaps: Vec<_> = times.windows(2).map(|w| w[1] - w[0]).collect();
    // The exponential backoff (200 ms doubling) would reach 25.6 s by the eighth retry.
    assert!(
        gaps.iter()
            .all(|g| *g <= THROTTLED_MAX_DELAY + Duration::from_millis(2)),
        "{gaps:?}"
    );
}

/// Every delete throttled from now until `until` (a spell of another tenant), then all
/// answered.
async fn spell(g: &Arc<Gate<Fake>>, until: Instant) {
    g.inner().fail(
        Operation::DeleteNetworkInterface,
        "RequestLimitExceeded",
        100_000,
    );
    tokio::time::sleep_until(until).await;
    g.inner().script.lock().unwrap().clear();
}

#[tokio::test(start_paused = true)]
async fn the_rate_is_back_at_the_ceiling_soon_after_a_spell_ends() {
    let g = gate(Fake::default(), GateConfig::aws_defaults());
    let start = Instant::now();
    let end = start + Duration::from_secs(20);
    // A backlog of deletes throughout; every answer throttled for 20 s.
    let spell_task = {
        let g = g.clone();
        tokio::spawn(async move { spell(&g, end).await })
    };
    tokio::task::yield_now().await;
    let tasks: Vec<_> = (0..400)
        .map(|_| {
            let g = g.clone();
            tokio::spawn(async move { g.delete_network_interface("eni-1").await })
        })
        .collect();
    spell_task.await.unwrap();
    let low = rate_of(&g, Bucket::DeleteNetworkInterface);
    assert!(low < 0.5, "the spell cut the rate: {low}");
    let mut back = None;
    while back.is_none() && Instant::now() < end + Duration::from_secs(120) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if rate_of(&g, Bucket::DeleteNetworkInterface) == 4.0 {
            back = Some(Instant::now() - end);
        }
    }
    // Growth by successes alone takes over a thousand calls from the floor.
    let back = back.expect("back at the ceiling within 120 s");
    assert!(
        back <= Duration::from_secs(20),
        "back at the ceiling {back:?} after the spell"
    );
    for t in tasks {
        t.await.unwrap().unwrap();
    }
}

#[tokio::test(start_paused = true)]
async fn tokens_saved_while_paced_do_not_go_out_at_once() {
    let g = gate(Fake::default(), GateConfig::aws_defaults());
    // Ten calls from the burst of 80, then one throttled answer: the account's bucket is empty.
    for _ in 0..10 {
        g.delete_network_interface("eni-1").await.unwrap();
    }
    g.inner()
        .fail(Operation::DeleteNetworkInterface, "RequestLimitExceeded", 1);
    g.delete_network_interface("eni-1").await.unwrap();
    let throttled = Instant::now();
    let times = concurrent_deletes(&g, 200, throttled).await;
    // Never more than the ceiling's 4 calls a second (and a token of rounding) from then on:
    // the 69 tokens left in the burst went with the throttled answer.
    assert_within_rate(times, 2, 4.0);
    assert_eq!(rate_of(&g, Bucket::DeleteNetworkInterface), 4.0);
}

#[tokio::test(start_paused = true)]
async fn every_page_takes_a_token() {
    let fake = Fake {
        pages: 3,
        ..Fake::default()
    };
    let mut config = GateConfig::aws_defaults();
    config.overrides.insert(Bucket::Describe, (1, 1.0));
    let g = gate(fake, config);
    let start = Instant::now();
    let all = ResourceFilter::default();
    let subnets = collect_pages(|t| g.describe_subnets(&all, t))
        .await
        .unwrap();
    assert_eq!(subnets.len(), 3);
    let times: Vec<_> = g
        .inner()
        .times(None)
        .iter()
        .map(|t| t.duration_since(start))
        .collect();
    assert_eq!(
        times,
        vec![
            Duration::ZERO,
            Duration::from_secs(1),
            Duration::from_secs(2)
        ]
    );
    assert_eq!(g.stats().calls[&Operation::DescribeSubnets], 3);
}

#[tokio::test(start_paused = true)]
async fn unassigning_ips_and_prefixes_takes_two_tokens() {
    let mut config = GateConfig::aws_defaults();
    config
        .overrides
        .insert(Bucket::UnassignPrivateIpAddresses, (1, 1.0));
    let g = gate(Fake::default(), config);
    let start = Instant::now();
    let ip = [Ipv4Addr::new(10, 0, 0, 9)];
    let prefix = ["10.0.1.0/28".parse().unwrap()];
    g.unassign_private_ip_addresses("eni-1", &ip, &prefix)
        .await
        .unwrap();
    // The second token came one period after the first.
    assert_eq!(start.elapsed(), Duration::from_secs(1));
    assert_eq!(g.stats().calls[&Operation::UnassignPrivateIpAddresses], 2);
    // Nothing to unassign: no call, no token.
    g.unassign_private_ip_addresses("eni-1", &[], &[])
        .await
        .unwrap();
    assert_eq!(g.inner().times(None).len(), 1);
    assert_eq!(start.elapsed(), Duration::from_secs(1));
}

#[tokio::test(start_paused = true)]
async fn metrics_count_calls_by_outcome_and_response_code() {
    let fake = Fake::default();
    fake.fail(
        Operation::AssignPrivateIpAddresses,
        "RequestLimitExceeded",
        1,
    );
    let g = gate(fake, GateConfig::aws_defaults());
    let mut registry = Registry::default();
    g.metrics().register(&mut registry);
    g.assign_private_ip_addresses("eni-1", AddressRequest::Ips(1))
        .await
        .unwrap();
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    for line in [
        r#"ec2_api_calls_total{operation="AssignPrivateIpAddresses",outcome="throttled"} 1"#,
        r#"ec2_api_calls_total{operation="AssignPrivateIpAddresses",outcome="success"} 1"#,
        r#"ec2_api_retries_total{operation="AssignPrivateIpAddresses"} 1"#,
        r#"ec2_api_throttled_total{operation="AssignPrivateIpAddresses"} 1"#,
        r#"ec2_api_duration_seconds_count{operation="AssignPrivateIpAddresses",response_code="RequestLimitExceeded"} 1"#,
        r#"ec2_api_duration_seconds_count{operation="AssignPrivateIpAddresses",response_code="OK"} 1"#,
        r#"ec2_rate_limit_wait_seconds_count{operation="AssignPrivateIpAddresses"} 2"#,
        // Untouched buckets report their ceiling.
        r#"ec2_rate_limit_qps{bucket="delete-network-interface"} 4.0"#,
    ] {
        assert!(text.contains(line), "missing {line} in\n{text}");
    }
    // The throttled bucket reports its cut rate: 0.7 × the one call sent in the measuring
    // window, on its way back to the ceiling (the retry waited for the probe 2 s later).
    let line = text
        .lines()
        .find(|l| l.starts_with(r#"ec2_rate_limit_qps{bucket="assign-private-ip-addresses"}"#))
        .expect("the assign bucket's rate");
    let rate: f64 = line.rsplit(' ').next().unwrap().parse().unwrap();
    let cut = rate::BETA / rate::MEASURE.as_secs_f64();
    assert!(rate > cut && rate < 4.0 * rate::BETA, "{line}");
}
