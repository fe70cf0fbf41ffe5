use super::*;
use crate::ec2::Operation;
use crate::ec2::gate::ThrottleObserver;
use std::sync::Arc;
use std::time::Duration;

fn book() -> StatusBook {
    StatusBook::new(Family::default(), (Timestamp::UNIX_EPOCH, Instant::now()))
}

fn gauge(b: &StatusBook, r: WaitReason) -> i64 {
    b.waiting.get_or_create(&label(r)).get()
}

#[test]
fn a_wait_is_published_at_the_end_of_its_pass_with_its_retry_time() {
    let b = book();
    let t0 = b.epoch.1;
    b.begin("n1", t0);
    b.wait(
        "n1",
        WaitReason::LimitsUnknown,
        "m5.large being described",
        Some(t0 + Duration::from_secs(2)),
    );
    assert_eq!(
        gauge(&b, WaitReason::LimitsUnknown),
        0,
        "not before the end"
    );
    b.end("n1", false, Some(t0 + Duration::from_secs(60)), t0);
    assert_eq!(gauge(&b, WaitReason::LimitsUnknown), 1);
    let s = b.node("n1", t0).unwrap();
    let w = s.waiting.unwrap();
    assert_eq!(w.reason, WaitReason::LimitsUnknown);
    assert_eq!(w.retry_in_seconds, Some(2.0), "the pass's own time wins");
    assert_eq!(w.retry_at.as_deref(), Some("1970-01-01T00:00:02Z"));
    // The next pass waits no more.
    b.begin("n1", t0 + Duration::from_secs(2));
    b.end("n1", false, None, t0 + Duration::from_secs(2));
    assert_eq!(gauge(&b, WaitReason::LimitsUnknown), 0);
    assert!(b.node("n1", t0).unwrap().waiting.is_none());
}

#[test]
fn a_failed_pass_waits_on_its_error_until_the_queue_retries() {
    let b = book();
    let t0 = b.epoch.1;
    b.begin("n1", t0);
    b.error("n1", "UnauthorizedOperation", t0);
    b.end("n1", true, Some(t0 + Duration::from_secs(4)), t0);
    let page = b.page(t0);
    assert_eq!(page.totals.nodes_waiting, 1);
    assert_eq!(page.totals.waiting[&WaitReason::Error], 1);
    let w = page.nodes["n1"].waiting.clone().unwrap();
    assert_eq!(w.detail, "UnauthorizedOperation");
    assert_eq!(w.retry_in_seconds, Some(4.0));
    assert_eq!(
        page.nodes["n1"].last_error.as_ref().unwrap().what.message,
        "UnauthorizedOperation"
    );
}

#[test]
fn a_wait_without_a_time_is_retried_at_the_rescan() {
    let t0 = Instant::now();
    let rescan = t0 + Duration::from_secs(30);
    let pending = Waiting {
        reason: WaitReason::ReleaseAnswer,
        detail: "2 addresses".into(),
        retry_at: None,
    };
    let w = settle(Some(pending.clone()), false, None, None, Some(rescan)).unwrap();
    assert_eq!(w.retry_at, Some(rescan));
    let w = settle(Some(pending), true, None, Some(t0), Some(rescan)).unwrap();
    assert_eq!(
        w.reason,
        WaitReason::ReleaseAnswer,
        "the pass's reason wins"
    );
    assert_eq!(w.retry_at, Some(t0));
    assert_eq!(settle(None, false, None, Some(t0), Some(rescan)), None);
}

#[test]
fn forgetting_a_waiting_node_lowers_the_gauge_and_the_page_round_trips() {
    let b = book();
    let t0 = b.epoch.1;
    b.observed(
        "n1",
        Figures {
            instance: "i-1".into(),
            mode: "classic".into(),
            available: 0,
            used: 0,
            needed: 8,
        },
        Would::CreateEni {
            subnet: "subnet-a".into(),
            security_groups: vec![],
            addresses: 8,
        },
    );
    b.waits_now("n1", WaitReason::OtherAllocator, "cilium-operator wrote it");
    assert_eq!(gauge(&b, WaitReason::OtherAllocator), 1);
    let json = serde_json::to_value(b.page(t0)).unwrap();
    assert_eq!(json["nodes"]["n1"]["waiting"]["reason"], "other-allocator");
    assert_eq!(json["nodes"]["n1"]["needed"], 8);
    assert_eq!(json["nodes"]["n1"]["next"]["action"], "create-eni");
    let back: Page = serde_json::from_value(json).unwrap();
    assert_eq!(back, b.page(t0));
    b.forget("n1");
    assert_eq!(gauge(&b, WaitReason::OtherAllocator), 0);
}

#[tokio::test]
async fn a_throttled_call_inside_a_pass_marks_its_node() {
    let b = Arc::new(book());
    let gate = ThrottledPasses;
    gate.throttled(Operation::AssignPrivateIpAddresses, Duration::from_secs(1));
    assert_eq!(
        b.page(Instant::now()).totals.nodes,
        0,
        "outside a pass: nothing"
    );
    scope(b.clone(), "n1", crate::clock::now(), async {
        gate.throttled(Operation::AttachNetworkInterface, Duration::from_secs(3));
    })
    .await;
    assert_eq!(
        gauge(&b, WaitReason::Throttled),
        1,
        "shown while the pass runs"
    );
    b.end("n1", false, None, crate::clock::now());
    let w = b.node("n1", Instant::now()).unwrap().waiting.unwrap();
    assert_eq!(w.reason, WaitReason::Throttled);
    assert!(w.detail.contains("AttachNetworkInterface"), "{}", w.detail);
    // Throttled, then served in the same pass: it waits no more.
    scope(b.clone(), "n1", crate::clock::now(), async {
        gate.throttled(Operation::AttachNetworkInterface, Duration::from_secs(3));
    })
    .await;
    b.acted("n1", Would::Nothing, crate::clock::now());
    b.end("n1", false, None, crate::clock::now());
    assert!(b.node("n1", Instant::now()).unwrap().waiting.is_none());
    assert_eq!(gauge(&b, WaitReason::Throttled), 0);
}
