//! Fencing per call after a pause (docs/rules.md §14.2): the lease counts from the start of a
//! renewal, and no mutating EC2 call or CiliumNode write leaves a process whose lease may have
//! expired.

use std::sync::Arc;
use std::time::Duration;

use eni_operator::ec2::{AddressRequest, Ec2, Operation, Tags};
use eni_operator::ipam::ChangeSet;
use eni_operator::k8s::fence::{Fence, Fenced, FencedSink, LEASE_EXPIRED};
use eni_operator::k8s::leader::{
    Elector, LeaderConfig, LeadershipLost, LeaseError, LeaseLock, LeaseRecord,
};
use eni_operator::k8s::sink::{NodeRef, NodeSink, SinkError};
use testkit::lease::{MemoryLease, MemoryLeaseClient};
use testkit::sim::Simulator;
use testkit::sink::MemorySink;
use tokio::time::Instant;

/// A Lease whose renewals are answered `delay` after they were sent (committed at once: the
/// other replicas see the new record from the start).
struct SlowAnswers {
    inner: MemoryLeaseClient,
    delay: Duration,
    slow: std::sync::atomic::AtomicBool,
}

impl LeaseLock for SlowAnswers {
    async fn get(&self) -> Result<Option<(LeaseRecord, String)>, LeaseError> {
        self.inner.get().await
    }
    async fn create(&self, record: &LeaseRecord) -> Result<(), LeaseError> {
        self.inner.create(record).await
    }
    async fn update(&self, record: &LeaseRecord, version: &str) -> Result<(), LeaseError> {
        let r = self.inner.update(record, version).await;
        if self.slow.load(std::sync::atomic::Ordering::Relaxed) {
            tokio::time::sleep(self.delay).await;
        }
        r
    }
}

/// Renewals answered 5 s late: the lease runs from when each was sent. Counted from the answer
/// (as before), the leader went on believing it led while its last renewal the others saw was
/// older than it thought; counted from the start, it gives up at the renew deadline after the
/// start of its last renewal, and its fence closes then.
#[tokio::test(start_paused = true)]
async fn a_renewal_counts_from_when_it_was_sent_not_when_it_was_answered() {
    let lease = Arc::new(MemoryLease::new());
    let lock = SlowAnswers {
        inner: MemoryLeaseClient {
            lease: lease.clone(),
            identity: "a".into(),
        },
        delay: Duration::from_secs(5),
        slow: Default::default(),
    };
    let fence = Fence::closed();
    let mut elector = Elector::new(lock, LeaderConfig::new("a")).with_fence(fence.clone());
    let start = Instant::now();
    elector.acquire().await;
    assert!(fence.valid(), "granted on acquisition");
    elector
        .lock()
        .slow
        .store(true, std::sync::atomic::Ordering::Relaxed);
    let lost = tokio::time::timeout(Duration::from_secs(60), elector.hold()).await;
    assert_eq!(lost, Ok(LeadershipLost), "renewals answered 5 s late");
    // Renewals at 2 s (answered at 7 s) and 9 s: the second's deadline is 2 + 10 s.
    let at = Instant::now() - start;
    assert!(at <= Duration::from_secs(12), "gave up at {at:?}");
    assert!(!fence.valid(), "the fence closes with the lease");
}

/// The fence is granted from the start of the renewal, for the renew deadline.
#[tokio::test(start_paused = true)]
async fn the_fence_runs_for_the_renew_deadline_from_the_start_of_the_renewal() {
    let lease = Arc::new(MemoryLease::new());
    let lock = SlowAnswers {
        inner: MemoryLeaseClient {
            lease,
            identity: "a".into(),
        },
        delay: Duration::from_secs(4),
        slow: std::sync::atomic::AtomicBool::new(true),
    };
    let fence = Fence::closed();
    let mut elector = Elector::new(lock, LeaderConfig::new("a")).with_fence(fence.clone());
    let sent = Instant::now();
    assert!(elector.try_acquire_or_renew().await.unwrap()); // creates: answered at once
    assert!(elector.try_acquire_or_renew().await.unwrap()); // renews: answered 4 s later
    tokio::time::sleep_until(sent + Duration::from_secs(10) - Duration::from_millis(1)).await;
    assert!(fence.valid());
    tokio::time::sleep_until(sent + Duration::from_secs(10)).await;
    assert!(
        !fence.valid(),
        "10 s after the renewal was sent, not answered"
    );
}

/// A process whose fence has run out makes no mutating EC2 call (describes still go), and
/// writes nothing to the API server.
#[tokio::test(start_paused = true)]
async fn no_mutating_call_or_write_leaves_a_process_whose_fence_ran_out() {
    let sim = Simulator::new();
    let vpc = sim.add_vpc("10.0.0.0/16".parse().unwrap(), &[]);
    let subnet = sim.add_subnet(&vpc, "zone-a", "10.0.0.0/18".parse().unwrap(), Tags::new());
    let inst = sim.run_instance("m5.large", &subnet, &[]);
    let eni = sim.primary_eni_id(&inst.id).unwrap();
    let fence = Fence::closed();
    fence.grant(Instant::now() + Duration::from_secs(10));
    let ec2 = Fenced::new(sim.clone(), fence.clone());
    ec2.assign_private_ip_addresses(&eni, AddressRequest::Ips(1))
        .await
        .expect("within the fence");
    // A pause longer than the lease.
    tokio::time::advance(Duration::from_secs(30)).await;
    let before = sim.stats().get(Operation::AssignPrivateIpAddresses).calls;
    let err = ec2
        .assign_private_ip_addresses(&eni, AddressRequest::Ips(1))
        .await
        .unwrap_err();
    assert_eq!(err.code, LEASE_EXPIRED);
    assert_eq!(
        sim.stats().get(Operation::AssignPrivateIpAddresses).calls,
        before,
        "never sent"
    );
    let filter = eni_operator::ec2::EniFilter::default();
    assert!(ec2.describe_network_interfaces(&filter, None).await.is_ok());

    let memory = MemorySink::new();
    let node = memory.put(&eni_operator::crd::CiliumNode::new("n", Default::default()));
    let sink = FencedSink::new(memory, fence);
    let writes = sink.inner().generation();
    let r = sink.set_finalizer(&NodeRef::of(&node), true).await;
    assert!(
        matches!(&r, Err(SinkError::Other(m)) if m.contains(LEASE_EXPIRED)),
        "{r:?}"
    );
    let r = sink.apply(&NodeRef::of(&node), &ChangeSet::default()).await;
    assert!(r.is_err(), "{r:?}");
    assert_eq!(sink.inner().generation(), writes, "nothing written");
    assert!(sink.fetch("n").await.unwrap().is_some(), "reads still go");
}

/// A sub-second lease (2.5 s, renew deadline 2.4 s) is written rounded up: a competitor that
/// saw the record at the start waits at least the 2.5 s this leader's fence relies on. Written
/// as whole seconds truncated (2 s), the competitor took the lease at 2.1 s while the leader's
/// fence still let calls out until 2.4 s. Durations beyond an int32 of seconds saturate.
#[tokio::test(start_paused = true)]
async fn a_sub_second_lease_duration_is_written_rounded_up() {
    use eni_operator::k8s::leader::whole_seconds_up;
    let lease = Arc::new(MemoryLease::new());
    let config = |id: &str| LeaderConfig {
        lease_duration: Duration::from_millis(2500),
        renew_deadline: Duration::from_millis(2400),
        retry_period: Duration::from_millis(500),
        ..LeaderConfig::new(id)
    };
    let client = |id: &str| MemoryLeaseClient {
        lease: lease.clone(),
        identity: id.into(),
    };
    let fence = Fence::closed();
    let mut a = Elector::new(client("a"), config("a")).with_fence(fence.clone());
    let mut b = Elector::new(client("b"), config("b"));
    assert!(a.try_acquire_or_renew().await.unwrap());
    let (record, _) = a.lock().get().await.unwrap().unwrap();
    assert_eq!(record.lease_duration_seconds, 3);
    assert!(
        !b.try_acquire_or_renew().await.unwrap(),
        "b sees a's record"
    );
    // a stops renewing (a pause). Its fence is valid until 2.4 s after its renewal started.
    tokio::time::advance(Duration::from_millis(2100)).await;
    assert!(fence.valid());
    assert!(
        !b.try_acquire_or_renew().await.unwrap(),
        "b took the lease while a's fence still let calls out"
    );
    tokio::time::advance(Duration::from_millis(1000)).await;
    assert!(!fence.valid());
    assert!(b.try_acquire_or_renew().await.unwrap(), "expired for b now");

    assert_eq!(whole_seconds_up(Duration::from_secs(15)), 15);
    assert_eq!(whole_seconds_up(Duration::from_millis(1)), 1);
    assert_eq!(whole_seconds_up(Duration::from_secs(1 << 40)), i32::MAX);
}
