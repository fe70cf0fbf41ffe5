//! The retry policy: what is retried, how long, and how far apart.

use super::*;

#[tokio::test(start_paused = true)]
async fn throttling_is_retried_with_backoff() {
    let fake = Fake::failing(
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

/// Records what the gate tells its throttle observer.
#[derive(Clone, Default)]
struct Seen(Arc<Mutex<Vec<(Operation, Duration)>>>);

impl ThrottleObserver for Seen {
    fn throttled(&self, operation: Operation, retry_in: Duration) {
        self.0.lock().unwrap().push((operation, retry_in));
    }
}

/// Each throttled answer the gate retries is told to the observer it was given, with the delay
/// before the retry (the operator shows it as the wait of the node whose pass made the call);
/// other retried failures are not.
#[tokio::test(start_paused = true)]
async fn throttled_retries_are_told_to_the_gates_observer() {
    let fake = Fake::failing(
        Operation::AssignPrivateIpAddresses,
        "RequestLimitExceeded",
        2,
    );
    fake.fail(Operation::DeleteNetworkInterface, "InternalError", 1);
    let seen = Seen::default();
    let layer = GateLayer::new(GateConfig::aws_defaults()).reporting_throttles_to(seen.clone());
    let g = Gate::new(fake, layer);
    g.assign_private_ip_addresses("eni-1", AddressRequest::Ips(3))
        .await
        .unwrap();
    g.delete_network_interface("eni-1").await.unwrap();
    let seen = seen.0.lock().unwrap().clone();
    let ops: Vec<_> = seen.iter().map(|(op, _)| *op).collect();
    assert_eq!(ops, [Operation::AssignPrivateIpAddresses; 2]);
    for (_, delay) in seen {
        assert!(
            delay > Duration::ZERO && delay <= THROTTLED_MAX_DELAY,
            "{delay:?}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn transient_failures_are_retried() {
    let fake = Fake::failing(Operation::DeleteNetworkInterface, "InternalError", 1);
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
        let fake = Fake::failing(Operation::DeleteNetworkInterface, "InternalError", 4);
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
    let fake = Fake::failing(Operation::AssignPrivateIpAddresses, "InternalError", 1);
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
    let fake = Fake::failing(
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

#[tokio::test(start_paused = true)]
async fn attempts_are_bounded() {
    let fake = Fake::failing(Operation::CreateNetworkInterface, "InternalError", 10);
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
    let fake = Fake::failing(
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
    let fake = Fake::failing(
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
    // The deadline counts the attempts and their backoff, not the waits in line for tokens
    // (the cut bucket paces the retries), so the call gives up later than 60 s of wall time,
    // but it does give up.
    let took = start.elapsed();
    assert!(
        took >= Duration::from_secs(60) && took < Duration::from_secs(600),
        "gave up after {took:?}"
    );
    assert!(g.inner().times(None).len() < 1000, "it stopped retrying");
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

#[tokio::test(start_paused = true)]
async fn consecutive_throttles_grow_the_penalty_up_to_its_cap_and_success_resets_it() {
    let fake = Fake::failing(Operation::DetachNetworkInterface, "RequestLimitExceeded", 6);
    let config = large_attach_buckets(GateConfig {
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
    let fake = Fake::failing(Operation::AttachNetworkInterface, "RequestLimitExceeded", 8);
    let g = gate(fake, large_attach_buckets(GateConfig::aws_defaults()));
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
