//! Which EC2 refreshes the event loop starts next. Pure: the loop reports what happened (a
//! node waits for its instance, our change needs confirming, a tick, a refresh ended) and asks
//! [`RefreshSchedule::next_refresh`] what to start; the ticks themselves are the loop's timers.
//!
//! Per-instance refreshes of new instances go at once, batched; confirmations of our own
//! changes at most once per `instance_refresh_spacing` (a tick), in one batch, so describe
//! calls per minute do not grow with the number of nodes (§10). More changed
//! instances than one batch holds are left to the next full refresh, which lists them all
//! anyway. One per-instance refresh and one full refresh run at a time.

use std::collections::{BTreeMap, BTreeSet};

use crate::cache::refresher::INSTANCE_BATCH;

#[derive(Debug, Default)]
pub struct RefreshSchedule {
    /// Instance -> the nodes queued once it is described.
    waiting: BTreeMap<String, BTreeSet<String>>,
    /// Instances we changed, to describe again (confirmation).
    confirm: BTreeSet<String>,
    /// The confirmation spacing has passed.
    confirm_due: bool,
    refreshing: bool,
    full_running: bool,
}

/// A per-instance refresh to start.
#[derive(Debug, PartialEq, Eq)]
pub struct InstanceRefresh {
    /// Instances nodes wait for.
    pub new: Vec<String>,
    /// Instances we changed (a confirmation; their nodes are not waiting).
    pub confirm: Vec<String>,
}

impl RefreshSchedule {
    /// `node` is queued once `instance` has been described.
    pub fn wait(&mut self, instance: String, node: String) {
        self.waiting.entry(instance).or_default().insert(node);
    }

    /// A pass changed EC2 for this instance.
    pub fn changed(&mut self, instance: String) {
        self.confirm.insert(instance);
    }

    /// The confirmation spacing passed.
    pub fn confirm_tick(&mut self) {
        self.confirm_due = true;
    }

    /// The per-instance refresh to start now, if any (it counts as running from here).
    pub fn next_refresh(&mut self) -> Option<InstanceRefresh> {
        if self.confirm_due && self.confirm.len() > INSTANCE_BATCH {
            self.confirm_due = false;
        }
        let confirm_now = self.confirm_due && self.waiting.is_empty() && !self.confirm.is_empty();
        if self.refreshing || (self.waiting.is_empty() && !confirm_now) {
            return None;
        }
        let confirm = if confirm_now {
            std::mem::take(&mut self.confirm).into_iter().collect()
        } else {
            Vec::new()
        };
        self.confirm_due &= !confirm_now;
        self.refreshing = true;
        Some(InstanceRefresh {
            new: self.waiting.keys().cloned().collect(),
            confirm,
        })
    }

    /// Instances wait for their describe, or one runs.
    pub fn describing(&self) -> bool {
        self.refreshing || !self.waiting.is_empty()
    }

    /// The per-instance refresh of `new` ended (or failed): the nodes to queue now.
    pub fn refreshed(&mut self, new: Vec<String>) -> Vec<String> {
        self.refreshing = false;
        new.into_iter()
            .flat_map(|id| self.waiting.remove(&id).unwrap_or_default())
            .collect()
    }

    /// A full refresh is due: true if one should start (none runs). The full listing covers
    /// every change made before it starts, so pending confirmations are dropped.
    pub fn start_full(&mut self) -> bool {
        if self.full_running {
            return false;
        }
        self.full_running = true;
        self.confirm.clear();
        true
    }

    pub fn full_done(&mut self) {
        self.full_running = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn new_instances_are_refreshed_at_once_in_one_batch() {
        let mut s = RefreshSchedule::default();
        assert_eq!(s.next_refresh(), None);
        s.wait("i-1".into(), "a".into());
        s.wait("i-1".into(), "b".into());
        s.wait("i-2".into(), "c".into());
        let r = s.next_refresh().expect("refresh");
        assert_eq!(r.new, ids(&["i-1", "i-2"]));
        assert!(r.confirm.is_empty());
        // One at a time.
        s.wait("i-3".into(), "d".into());
        assert_eq!(s.next_refresh(), None);
        let mut queued = s.refreshed(r.new);
        queued.sort();
        assert_eq!(queued, ids(&["a", "b", "c"]));
        assert_eq!(s.next_refresh().expect("refresh").new, ids(&["i-3"]));
    }

    #[test]
    fn confirmations_wait_for_the_tick_and_for_no_new_instance() {
        let mut s = RefreshSchedule::default();
        s.changed("i-1".into());
        assert_eq!(s.next_refresh(), None, "not before the tick");
        s.confirm_tick();
        s.wait("i-9".into(), "n".into());
        let r = s.next_refresh().expect("refresh");
        assert!(r.confirm.is_empty(), "new instances go first");
        s.refreshed(r.new);
        let r = s.next_refresh().expect("confirmation");
        assert_eq!((r.new, r.confirm), (vec![], ids(&["i-1"])));
        s.refreshed(vec![]);
        s.changed("i-2".into());
        assert_eq!(s.next_refresh(), None, "the tick was used");
    }

    #[test]
    fn more_confirmations_than_a_batch_are_left_to_the_full_refresh() {
        let mut s = RefreshSchedule::default();
        for i in 0..=INSTANCE_BATCH {
            s.changed(format!("i-{i}"));
        }
        s.confirm_tick();
        assert_eq!(s.next_refresh(), None);
        assert!(s.start_full());
        assert!(!s.start_full(), "one full refresh at a time");
        s.full_done();
        s.confirm_tick();
        assert_eq!(s.next_refresh(), None, "the full refresh dropped them");
        assert!(s.start_full());
    }
}
