use super::*;

fn t0() -> Instant {
    Instant::now()
}

/// Every ready node in the order handed out, each pass ending before the next starts.
fn drain(q: &mut DeficitQueue<&'static str>, now: Instant) -> Vec<&'static str> {
    std::iter::from_fn(|| {
        let n = q.pop(now)?;
        q.finish(&n, Outcome::Done, now, 0.0);
        Some(n)
    })
    .collect()
}

#[test]
fn most_severe_first_then_fifo() {
    let now = t0();
    let mut q = DeficitQueue::new();
    q.push("routine", Priority::Routine);
    q.push("excess", Priority::Excess(40));
    q.push("small", Priority::Deficit(2));
    q.push("big", Priority::Deficit(30));
    q.push("starved", Priority::NoFreeIp);
    q.push("pods", Priority::PodsWaiting(1));
    q.push("small2", Priority::Deficit(2));
    let order = drain(&mut q, now);
    assert_eq!(
        order,
        [
            "starved", "pods", "big", "small", "small2", "excess", "routine"
        ]
    );
}

#[test]
fn push_deduplicates_and_raises_priority() {
    let now = t0();
    let mut q = DeficitQueue::new();
    q.push("a", Priority::Routine);
    q.push("b", Priority::Deficit(5));
    q.push("a", Priority::Routine);
    q.push("a", Priority::NoFreeIp);
    assert_eq!(q.depth(), 2);
    assert_eq!(drain(&mut q, now), ["a", "b"]);
}

#[test]
fn a_wake_during_a_pass_that_ends_in_a_wait_runs_the_node_again_at_once() {
    let now = t0();
    let mut q = DeficitQueue::new();
    q.push("a", Priority::Deleting);
    assert_eq!(q.pop(now), Some("a"));
    // What the pass waits for (its Node) arrives while it runs: a plain push is folded
    // into the wait the pass then asks for.
    q.push("a", Priority::Routine);
    q.finish(&"a", Outcome::RetryAfter(Duration::from_secs(30)), now, 0.0);
    assert_eq!(q.pop(now), None, "a push keeps the delay");
    // A wake is not.
    q.wake("a", Priority::Routine);
    assert_eq!(q.pop(now), Some("a"));
    q.wake("a", Priority::Routine);
    q.finish(&"a", Outcome::RetryAfter(Duration::from_secs(30)), now, 0.0);
    assert_eq!(q.pop(now), Some("a"), "woken while running: again at once");
    q.wake("a", Priority::Routine);
    q.finish(&"a", Outcome::Failed, now, 0.0);
    assert_eq!(
        q.pop(now),
        Some("a"),
        "a failure still counts, without its backoff"
    );
    q.finish(&"a", Outcome::Failed, now, 0.0);
    assert_eq!(q.pop(now), None, "the next failure backs off as before");
}

#[test]
fn never_hands_out_a_running_node_and_requeues_after() {
    let now = t0();
    let mut q = DeficitQueue::new();
    q.push("a", Priority::Deficit(1));
    assert_eq!(q.pop(now), Some("a"));
    q.push("a", Priority::Deficit(9));
    assert_eq!(q.pop(now), None, "a is running");
    assert!(q.is_running(&"a"));
    q.finish(&"a", Outcome::Done, now, 0.0);
    assert_eq!(q.pop(now), Some("a"), "the push during the run is kept");
    q.finish(&"a", Outcome::Done, now, 0.0);
    assert_eq!(q.pop(now), None);
}

#[test]
fn failures_back_off_exponentially_and_reset_on_success() {
    let now = t0();
    let mut q = DeficitQueue::new();
    q.push("a", Priority::Deficit(1));
    let mut expected = Duration::from_secs(1);
    for _ in 0..4 {
        let at = q.next_due().unwrap_or(now).max(now);
        assert_eq!(q.pop(at), Some("a"));
        q.finish(&"a", Outcome::Failed, at, 0.999_999);
        let due = q.next_due().expect("delayed");
        let delay = due - at;
        assert!(
            delay <= expected && delay >= expected.mul_f64(0.99),
            "{delay:?} vs {expected:?}"
        );
        assert_eq!(q.pop(due - Duration::from_millis(1)), None, "not before");
        expected *= 2;
    }
    let due = q.next_due().unwrap();
    assert_eq!(q.pop(due), Some("a"));
    q.finish(&"a", Outcome::Done, due, 0.0);
    assert_eq!(q.failures(&"a"), 0);
}

#[test]
fn backoff_is_capped_at_five_minutes_with_jitter_at_least_half() {
    assert_eq!(backoff_delay(1, 0.0), Duration::from_millis(500));
    assert_eq!(backoff_delay(1, 1.0), Duration::from_secs(1));
    assert_eq!(backoff_delay(30, 1.0), BACKOFF_MAX);
    assert_eq!(backoff_delay(30, 0.0), BACKOFF_MAX / 2);
}

#[test]
fn a_delayed_node_keeps_its_delay_when_pushed() {
    let now = t0();
    let mut q = DeficitQueue::new();
    q.push("a", Priority::Routine);
    q.pop(now);
    q.finish(&"a", Outcome::RetryAfter(Duration::from_secs(60)), now, 0.0);
    q.push("a", Priority::NoFreeIp);
    assert_eq!(q.pop(now + Duration::from_secs(59)), None);
    q.push("b", Priority::Deficit(1));
    let later = now + Duration::from_secs(60);
    assert_eq!(drain(&mut q, later), ["a", "b"], "kept the raised priority");
}

#[test]
fn every_push_is_counted_once() {
    let mut q = DeficitQueue::new();
    q.push("a", Priority::Routine);
    q.push("a", Priority::Routine);
    q.push("b", Priority::Routine);
    assert_eq!(q.take_pushes(), 3);
    assert_eq!(q.take_pushes(), 0);
}

#[test]
fn removed_nodes_are_forgotten() {
    let now = t0();
    let mut q = DeficitQueue::new();
    q.push("a", Priority::Deficit(1));
    q.push("b", Priority::Deficit(1));
    q.remove(&"a");
    assert_eq!(q.pop(now), Some("b"));
    assert_eq!(q.pop(now), None);
    assert_eq!(q.depth(), 0);
}

#[test]
fn priority_from_demand() {
    assert_eq!(Priority::from_demand(0, 0, 8, 0, 0), Priority::NoFreeIp);
    assert_eq!(Priority::from_demand(10, 10, 4, 0, 3), Priority::NoFreeIp);
    assert_eq!(
        Priority::from_demand(10, 2, 4, 0, 3),
        Priority::PodsWaiting(3)
    );
    assert_eq!(Priority::from_demand(10, 2, 4, 0, 0), Priority::Deficit(4));
    assert_eq!(Priority::from_demand(30, 2, 0, 12, 0), Priority::Excess(12));
    assert_eq!(Priority::from_demand(10, 2, 0, 0, 5), Priority::Routine);
}

#[test]
fn a_node_without_addresses_is_served_before_reserves_whatever_the_counts() {
    let now = t0();
    let mut q = DeficitQueue::new();
    // A node that got its first ENI still needs more than a new node needs in all.
    q.push("topping-up", Priority::Deficit(16));
    q.push("new", Priority::NoFreeIp);
    q.push("pods", Priority::PodsWaiting(2));
    q.push("new2", Priority::NoFreeIp);
    let order = drain(&mut q, now);
    assert_eq!(order, ["new", "new2", "pods", "topping-up"]);
}

#[test]
fn a_failed_or_waiting_pass_keeps_the_nodes_urgency() {
    let now = t0();
    let mut q = DeficitQueue::new();
    q.push("a", Priority::NoFreeIp);
    q.push("w", Priority::NoFreeIp);
    assert_eq!(q.pop(now), Some("a"));
    assert_eq!(q.pop(now), Some("w"));
    // Its create was throttled; the other waits for its instance's describe.
    q.finish(&"a", Outcome::Failed, now, 0.0);
    q.finish(&"w", Outcome::RetryAfter(Duration::from_secs(1)), now, 0.0);
    for name in ["reserve-1", "reserve-2", "reserve-3"] {
        q.push(name, Priority::Deficit(16));
    }
    let later = now + Duration::from_secs(1);
    assert_eq!(q.pop(later), Some("a"), "still without addresses");
    assert_eq!(q.pop(later), Some("w"));
    // A done pass asks for nothing more: the node leaves the queue's urgent part.
    q.finish(&"a", Outcome::Done, later, 0.0);
    assert_eq!(q.due(&"a", later), None);
}

#[test]
fn a_reserve_starts_beside_a_pass_for_first_addresses() {
    let now = t0();
    let mut q = DeficitQueue::new();
    q.push("new1", Priority::NoFreeIp);
    q.push("reserve", Priority::Deficit(16));
    q.push("release", Priority::Excess(4));
    q.push("rescan", Priority::Routine);
    // Workers go by urgency; the gate, not the queue, keeps the reserve's calls from taking
    // new1's tokens, so the reserve uses what new1 leaves of the account.
    assert_eq!(q.pop(now), Some("new1"));
    assert_eq!(q.pop(now), Some("reserve"));
    assert_eq!(q.pop(now), Some("release"));
    assert_eq!(q.pop(now), Some("rescan"));
    assert_eq!(q.pop(now), None);
}
