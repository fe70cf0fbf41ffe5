//! What a pass has to say, as values: the Events, the `operator-status` error and the status
//! page's wait and error a step found. The steps gather them and decide whether a message is new
//! (the slot remembers the last one); only [`super::report`] says them (publishes, writes,
//! records), so every step's outcome is a value and the report step is the one writer.

use std::time::{Duration, Instant};

use crate::ipam::ProblemReason;
use crate::ipam::admission::{self, Refusal};
use crate::k8s::sink::NodeRef;
use crate::reconcile::events::EventReason;
use crate::reconcile::status::WaitReason;

use super::Verdict;

/// One thing to say.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Note {
    /// An Event on the object.
    Event(EventReason, String),
    /// `status.ipam.operator-status.error` on the object (a failed write is logged).
    Status(String),
    /// The error of an object that does not parse, on the object and in one Event; the slot
    /// remembers it once written, and a failed write fails the pass (it is said again).
    Invalid { error: String },
    /// The status page: why the node waits, and until when (the pass's last wait wins).
    Wait(WaitReason, String, Option<Instant>),
    /// The status page: the node's last error.
    Error(String),
}

/// What a step has to say, about one object.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Said {
    /// The object the Events and the status write are about.
    pub on: Option<NodeRef>,
    pub notes: Vec<Note>,
}

impl Said {
    pub fn on(r: NodeRef) -> Self {
        Self {
            on: Some(r),
            notes: Vec::new(),
        }
    }

    pub fn add(&mut self, note: Note) {
        self.notes.push(note);
    }

    pub fn event(&mut self, reason: EventReason, message: impl Into<String>) {
        self.add(Note::Event(reason, message.into()));
    }

    pub fn wait(&mut self, reason: WaitReason, why: impl Into<String>, until: Option<Instant>) {
        self.add(Note::Wait(reason, why.into(), until));
    }

    /// A problem new on the node: `operator-status` and one Warning Event.
    pub fn problem(&mut self, reason: ProblemReason, message: &str) {
        self.add(Note::Status(message.to_string()));
        self.event(EventReason::Problem(reason), message);
    }

    /// Another step's notes after these (the object of the later one wins).
    pub fn extend(&mut self, later: Said) {
        if later.on.is_some() {
            self.on = later.on;
        }
        self.notes.extend(later.notes);
    }
}

/// A pass that ended before the report: how, and what it has to say.
#[derive(Debug)]
pub(super) struct End {
    pub verdict: Verdict,
    pub said: Said,
}

impl End {
    pub fn with(verdict: Verdict, said: Said) -> Self {
        Self { verdict, said }
    }
}

impl From<Verdict> for End {
    fn from(verdict: Verdict) -> Self {
        Self::with(verdict, Said::default())
    }
}

/// The status page's reason for a wait the admission gives.
pub(super) fn wait_reason(reason: admission::WaitReason) -> WaitReason {
    match reason {
        admission::WaitReason::NodeNotSeen => WaitReason::NodeNotSeen,
        admission::WaitReason::OtherAllocator => WaitReason::OtherAllocator,
        admission::WaitReason::InstanceUnknown => WaitReason::InstanceNotListed,
    }
}

/// The operator-status message of a refusal.
pub(super) fn refusal_message(refusal: &Refusal) -> String {
    format!("{}: {}", refusal.reason.as_str(), refusal.message)
}

/// What a refusal says: its wait on the status page, then, when its message is `new` on the
/// node, `operator-status` and one Warning Event.
pub(super) fn refused(r: NodeRef, refusal: &Refusal, new: bool, now: Instant) -> Said {
    let mut said = Said::on(r);
    if let Some(reason) = refusal.wait {
        let until = now + refusal.retry;
        said.wait(wait_reason(reason), refusal.message.clone(), Some(until));
    }
    if new {
        said.problem(refusal.reason, &refusal_message(refusal));
    }
    said
}

/// What an admission's wait says on the status page.
pub(super) fn waiting(
    wait: Option<(admission::WaitReason, String)>,
    retry: Duration,
    now: Instant,
) -> Said {
    let mut said = Said::default();
    if let Some((reason, why)) = wait {
        said.wait(wait_reason(reason), why, Some(now + retry));
    }
    said
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(wait: Option<admission::WaitReason>) -> Refusal {
        Refusal {
            reason: ProblemReason::NoNode,
            message: "no Node named a".into(),
            retry: Duration::from_secs(30),
            wait,
            guard_blocked: false,
            annotate: false,
        }
    }

    fn node() -> NodeRef {
        NodeRef {
            name: "a".into(),
            ..NodeRef::default()
        }
    }

    #[test]
    fn a_new_refusal_says_status_and_one_warning_event() {
        let now = crate::clock::now();
        let said = refused(node(), &refusal(None), true, now);
        assert_eq!(said.on, Some(node()));
        let message = "NoNode: no Node named a".to_string();
        assert_eq!(
            said.notes,
            [
                Note::Status(message.clone()),
                Note::Event(EventReason::Problem(ProblemReason::NoNode), message),
            ]
        );
    }

    #[test]
    fn a_repeated_refusal_says_only_its_wait() {
        let now = crate::clock::now();
        let r = refusal(Some(admission::WaitReason::OtherAllocator));
        let said = refused(node(), &r, false, now);
        assert_eq!(
            said.notes,
            [Note::Wait(
                WaitReason::OtherAllocator,
                "no Node named a".into(),
                Some(now + Duration::from_secs(30))
            )]
        );
    }

    #[test]
    fn a_silent_wait_says_nothing() {
        let now = crate::clock::now();
        assert_eq!(waiting(None, Duration::from_secs(5), now), Said::default());
        let why = (admission::WaitReason::NodeNotSeen, "not seen".to_string());
        let said = waiting(Some(why), Duration::from_secs(5), now);
        assert_eq!(
            said.notes,
            [Note::Wait(
                WaitReason::NodeNotSeen,
                "not seen".into(),
                Some(now + Duration::from_secs(5))
            )]
        );
    }

    #[test]
    fn later_notes_follow_and_their_object_wins() {
        let mut first = Said::default();
        first.add(Note::Error("bad".into()));
        let mut later = Said::on(node());
        later.event(EventReason::EnisReleased, "detached");
        first.extend(later);
        assert_eq!(first.on, Some(node()));
        assert_eq!(first.notes.len(), 2);
        assert_eq!(first.notes[0], Note::Error("bad".into()));
    }
}
