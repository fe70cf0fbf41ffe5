//! Reads Cilium operator's leader Lease for the handover guard (`docs/migrating-from-cilium.md`,
//! "The guard"): who holds it, since when, when it was last renewed. A get every few seconds
//! (one object; a watch would buy nothing at this rate).

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use tracing::warn;

use crate::ipam::handover::{CILIUM_OPERATOR_LEASE, CiliumLease, LeaseView};

/// How often the Lease is read (Cilium's lease duration is 15 s by default).
pub const PERIOD: Duration = Duration::from_secs(5);

/// Cilium operator's default lease duration (`--leader-election-lease-duration`, 15 s).
const CILIUM_LEASE_DURATION: i32 = 15;

/// The guard's view of a Lease (`None`: never held, or no renew time). A released Lease (empty
/// holder) is a view too ([`LeaseView::released`]): client-go's release writes the release time
/// as both renew and acquire time and a duration of 1 s, which says nothing about how soon the
/// next leader comes, so it gets at least Cilium's default duration.
pub fn view(lease: &Lease) -> Option<LeaseView> {
    let spec = lease.spec.as_ref()?;
    let holder = spec.holder_identity.clone().unwrap_or_default();
    let renewed = spec.renew_time.as_ref()?.0;
    let acquired = spec.acquire_time.as_ref().map_or(renewed, |t| t.0);
    let seconds = spec.lease_duration_seconds.unwrap_or(CILIUM_LEASE_DURATION);
    let seconds = if holder.is_empty() {
        seconds.max(CILIUM_LEASE_DURATION)
    } else {
        seconds.max(1)
    };
    Some(LeaseView {
        holder,
        acquired,
        renewed,
        duration: Duration::from_secs(seconds.unsigned_abs().into()),
    })
}

/// The Lease's own progress, as client-go's leader election judges another holder's: by when
/// its record last changed on our clock, never by its `renewTime` against our clock (Cilium's
/// nodes' clocks and ours may disagree by more than the lease duration either way).
#[derive(Clone, Debug, Default)]
pub struct Progress {
    /// The record last read (holder, renewTime) and our time when it changed to that.
    last: Option<((String, Timestamp), Timestamp)>,
}

impl Progress {
    /// The view with `renewed` set to our time of the record's last change: a record read for
    /// the first time counts as renewed now (held for its duration, the safe side).
    pub fn observe(&mut self, v: LeaseView, now: Timestamp) -> LeaseView {
        let record = (v.holder.clone(), v.renewed);
        let changed_at = match &self.last {
            Some((last, at)) if *last == record => *at,
            _ => now,
        };
        self.last = Some((record, changed_at));
        LeaseView {
            renewed: changed_at,
            ..v
        }
    }
}

/// What one read tells the guard. `read`: the Lease, `Ok(None)` when the API server answers
/// 404, `Err` with the error. Fails closed (§16): unless the user said Cilium's operator is
/// absent (`--cilium-operator-absent`), a Lease that cannot be read, or is not found where
/// Cilium's operator should run, leaves every node not yet handed over alone. A 404 cannot
/// tell "never installed" from "installed in another namespace" (the case that once disabled
/// the guard silently); only the user can.
pub fn state(read: Result<Option<&Lease>, String>, namespace: &str, absent: bool) -> CiliumLease {
    let lease = format!("Lease {namespace}/{CILIUM_OPERATOR_LEASE}");
    match read {
        Ok(Some(l)) => view(l).map_or(CiliumLease::Absent, CiliumLease::Held),
        Ok(None) | Err(_) if absent => CiliumLease::Absent,
        Ok(None) => CiliumLease::Unreadable(format!(
            "{lease} not found: Cilium's operator runs in another namespace (set --cilium-namespace) or is not installed (set --cilium-operator-absent)"
        )),
        Err(e) => CiliumLease::Unreadable(format!(
            "cannot read {lease} ({e}): it tells whether Cilium's operator runs (RBAC: get on that Lease)"
        )),
    }
}

/// Read the Lease every [`PERIOD`] and hand each state to `set`, its renewal dated by `now`
/// (our clock, [`Progress`]); never returns.
pub async fn watch(
    client: kube::Client,
    namespace: &str,
    absent: bool,
    now: impl Fn() -> Timestamp,
    set: impl Fn(CiliumLease),
) {
    let api: Api<Lease> = Api::namespaced(client, namespace);
    let mut said: Option<String> = None;
    let mut progress = Progress::default();
    loop {
        let read = api.get_opt(CILIUM_OPERATOR_LEASE).await;
        let mut state = state(
            read.as_ref()
                .map(Option::as_ref)
                .map_err(ToString::to_string),
            namespace,
            absent,
        );
        if let CiliumLease::Held(v) = state {
            state = CiliumLease::Held(progress.observe(v, now()));
        }
        // Once per message: it repeats every few seconds.
        match &state {
            CiliumLease::Unreadable(why) if said.as_deref() != Some(why) => {
                warn!("{why}; nodes not handed over yet wait");
                said = Some(why.clone());
            }
            CiliumLease::Unreadable(_) => {}
            _ => said = None,
        }
        set(state);
        tokio::time::sleep(PERIOD).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

    #[test]
    fn a_held_lease_becomes_a_view_and_an_empty_one_none() {
        let t = |s| MicroTime(Timestamp::from_second(s).unwrap());
        let lease = Lease {
            spec: Some(LeaseSpec {
                holder_identity: Some("cilium-operator-1".into()),
                acquire_time: Some(t(100)),
                renew_time: Some(t(130)),
                lease_duration_seconds: Some(15),
                ..LeaseSpec::default()
            }),
            ..Lease::default()
        };
        let v = view(&lease).unwrap();
        assert_eq!(v.holder, "cilium-operator-1");
        assert_eq!(v.acquired, Timestamp::from_second(100).unwrap());
        assert_eq!(v.duration, Duration::from_secs(15));
        assert!(view(&Lease::default()).is_none());
    }

    /// What client-go's release writes when Cilium's operator stops (`ReleaseOnCancel`): no
    /// holder, renew = acquire = now, 1 s. It used to read as "nobody holds it", so a
    /// restarting Cilium operator blocked nothing for the restart.
    #[test]
    fn a_released_lease_is_a_view_that_blocks_for_its_expiry_plus_ciliums_duration() {
        use crate::ipam::handover::{Signals, Writers, other_allocator};
        let at = |s: i64| Timestamp::from_second(1_800_000_000 + s).unwrap();
        let released = Lease {
            spec: Some(LeaseSpec {
                holder_identity: None,
                acquire_time: Some(MicroTime(at(100))),
                renew_time: Some(MicroTime(at(100))),
                lease_duration_seconds: Some(1),
                ..LeaseSpec::default()
            }),
            ..Lease::default()
        };
        let v = state(Ok(Some(&released)), "kube-system", false)
            .view()
            .cloned()
            .expect("a released Lease is not 'no Cilium'");
        let w = Writers::default();
        let blocked = |now| {
            other_allocator(&Signals {
                writers: &w,
                cilium_ignore: false,
                will_annotate: false,
                lease: Some(&v),
                new_cilium_enis: &[],
                now: at(now),
                quiet: Duration::from_secs(180),
                ignore_unsupported: None,
            })
            .is_some()
        };
        assert!(blocked(101) && blocked(129), "within 15 s + 15 s");
        assert!(!blocked(131));
    }

    /// Cilium's renewTime is its node's clock: ahead of ours, a dead operator's last renewal
    /// used to block nodes until our clock caught up; behind ours by more than the duration, a
    /// running one counted as gone and the guard let nodes through. Only the record changing
    /// between our reads (every [`PERIOD`]) says it runs.
    #[test]
    fn the_lease_is_fresh_while_its_record_changes_whatever_its_clock_says() {
        let at = |s: i64| Timestamp::from_second(1_800_000_000 + s).unwrap();
        let view = |renewed: i64| LeaseView {
            holder: "cilium-operator-1".into(),
            acquired: at(-1000),
            renewed: at(renewed),
            duration: Duration::from_secs(15),
        };
        // Its clock an hour behind ours, renewing every 2 s: held at every read.
        let mut p = Progress::default();
        for read in 0..10 {
            let now = 5 * read;
            let v = p.observe(view(now - 3600), at(now));
            assert!(v.fresh(at(now)), "read {read}: a renewing holder");
        }
        // Its clock an hour ahead of ours, then it stops renewing: held for one duration
        // after the record last changed, not for the hour.
        let mut p = Progress::default();
        assert!(p.observe(view(3600), at(0)).fresh(at(0)));
        assert!(p.observe(view(3602), at(5)).fresh(at(5)));
        assert!(p.observe(view(3602), at(15)).fresh(at(15)));
        assert!(!p.observe(view(3602), at(25)).fresh(at(25)));
        // A new holder is a change, even with the same renewTime.
        let other = LeaseView {
            holder: "cilium-operator-2".into(),
            ..view(3602)
        };
        assert!(p.observe(other, at(30)).fresh(at(30)));
    }

    /// Issue 29 item 3: a Lease that could not be read (none at first, a 403, a 404 in the
    /// wrong namespace) used to block nothing.
    #[test]
    fn an_unreadable_or_missing_lease_fails_closed_unless_cilium_is_declared_absent() {
        let unreadable = |s: CiliumLease| matches!(s, CiliumLease::Unreadable(_));
        let err = || Err("forbidden".to_string());
        assert!(unreadable(state(Ok(None), "kube-system", false)));
        assert!(unreadable(state(err(), "kube-system", false)));
        assert_eq!(state(Ok(None), "kube-system", true), CiliumLease::Absent);
        assert_eq!(state(err(), "kube-system", true), CiliumLease::Absent);
        let CiliumLease::Unreadable(why) = state(Ok(None), "cilium", false) else {
            unreachable!()
        };
        assert!(
            why.contains("cilium/cilium-operator-resource-lock"),
            "{why}"
        );
        assert!(why.contains("--cilium-operator-absent"), "{why}");
        assert!(why.contains("(set --cilium-namespace)"), "{why}");
        let CiliumLease::Unreadable(why) = state(err(), "cilium", false) else {
            unreachable!()
        };
        assert!(why.contains("(RBAC: get on that Lease)"), "{why}");
        let free = Lease::default();
        assert_eq!(state(Ok(Some(&free)), "x", false), CiliumLease::Absent);
    }
}
