//! EC2 refusing an attach: `AttachmentLimitExceeded` for a share of the
//! `AttachNetworkInterface` calls while the faults last, as when another tool's ENI held the
//! instance's last slot for a moment (attached and detached again between two of our
//! describes). The executor deletes the ENI it could not attach, so the client token of that
//! create is spent: the next create for the same slot must use a new one, or EC2 answers with
//! the deleted ENI for hours (EC2's idempotency, docs/rules.md).
//!
//! A rate rather than queued one-off faults: a queued refusal would wait for the next attach,
//! however late, and land after the faults stop. The simulator draws each call's fate from its
//! seeded fault stream.

use eni_operator::ec2::Operation;
use testkit::sim::Fault;

use crate::world::World;

/// Share of the attaches refused while the faults last.
const REFUSED: f64 = 0.1;

fn set(w: &World, rate: f64) {
    w.sim.set_fault_rate(
        Operation::AttachNetworkInterface,
        rate,
        Fault::new(
            "AttachmentLimitExceeded",
            "Interface count exceeds the limit for this instance type (injected).",
            400,
        ),
    );
}

/// The faults begin.
pub fn begin(w: &mut World) {
    set(w, REFUSED);
    w.log(
        0,
        format!("ec2 refuses {REFUSED} of the attaches (AttachmentLimitExceeded)"),
    );
}

/// The faults stop.
pub fn end(w: &mut World, t: u64) {
    set(w, 0.0);
    w.log(t, "ec2 refuses no more attaches".into());
}
