//! Event publishing into MemorySink (moved from `src/runtime/events.rs`).

use eni_operator::ipam::ProblemReason;
use eni_operator::k8s::sink::{NodeEvent, NodeRef};
use eni_operator::reconcile::events::{EventReason, PROBLEMS_DOC, publish};
use eni_operator::reconcile::metrics::RuntimeMetrics;
use testkit::sink::MemorySink;

fn errors(m: &RuntimeMetrics, label: &str) -> u64 {
    m.errors
        .get_or_create(&vec![("reason", label.to_string())])
        .get()
}

#[tokio::test]
async fn a_problem_is_a_warning_and_an_error_under_its_reason() {
    let (sink, m) = (MemorySink::new(), RuntimeMetrics::default());
    let r = NodeRef {
        name: "n1".into(),
        ..NodeRef::default()
    };
    let reason = EventReason::Problem(ProblemReason::AtCapacity);
    publish(&sink, &m, &r, reason, "full").await;
    publish(&sink, &m, &r, EventReason::IpsAllocated, "2").await;
    publish(&sink, &m, &r, EventReason::EC2_ERROR, "throttled").await;
    assert_eq!(
        sink.events("n1"),
        [
            // A problem's Event points at the runbook's table of reasons.
            NodeEvent::warning("AtCapacity", format!("full (what to do: {PROBLEMS_DOC})")),
            NodeEvent::normal("IpsAllocated", "2"),
            NodeEvent::warning(
                "Ec2Error",
                format!("throttled (what to do: {PROBLEMS_DOC})")
            ),
        ]
    );
    assert_eq!(errors(&m, "AtCapacity"), 1);
    assert_eq!(errors(&m, "Ec2Error"), 0, "counted under its code instead");
}
