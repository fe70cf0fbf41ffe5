//! The elector against an in-memory Lease (moved from `src/runtime/leader.rs`: the Lease double
//! lives in testkit).

use std::sync::Arc;
use std::time::Duration;

use eni_operator::k8s::leader::{Elector, LeaderConfig};
use testkit::lease::{MemoryLease, MemoryLeaseClient};
use tokio::time::Instant;

fn elector(lease: &Arc<MemoryLease>, id: &str) -> Elector<MemoryLeaseClient> {
    Elector::new(
        MemoryLeaseClient {
            lease: lease.clone(),
            identity: id.into(),
        },
        LeaderConfig::new(id),
    )
}

#[tokio::test(start_paused = true)]
async fn a_standby_waits_for_expiry_and_the_old_leader_stops_first() {
    let lease = Arc::new(MemoryLease::new());
    let mut a = elector(&lease, "a");
    let mut b = elector(&lease, "b");
    assert!(a.try_acquire_or_renew().await.unwrap());
    assert!(!b.try_acquire_or_renew().await.unwrap());
    let start = Instant::now();
    lease.partition("a", true);
    let lost = tokio::spawn(async move {
        a.hold().await;
        Instant::now()
    });
    b.acquire().await;
    let taken = Instant::now();
    let a_stopped = lost.await.unwrap();
    assert!(
        a_stopped < taken,
        "old leader must stop before the takeover"
    );
    assert!(a_stopped - start <= Duration::from_secs(10) + Duration::from_secs(2));
    assert!(taken - start >= Duration::from_secs(15));
    assert_eq!(lease.holder().as_deref(), Some("b"));
}

#[tokio::test(start_paused = true)]
async fn a_released_lease_is_taken_at_once() {
    let lease = Arc::new(MemoryLease::new());
    let mut a = elector(&lease, "a");
    let mut b = elector(&lease, "b");
    assert_eq!(a.run(async { 7 }).await, Ok(7));
    assert_eq!(lease.holder(), None);
    assert!(b.try_acquire_or_renew().await.unwrap());
}
