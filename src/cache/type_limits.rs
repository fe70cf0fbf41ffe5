//! One `DescribeInstanceTypes` per instance type at a time, and passes that wait for it.
//!
//! A pass whose instance type has no known limits describes that type alone. A second pass of
//! the same type that finds the lookup in flight waits for its answer: it used to plan without
//! limits ("limits of instance type unknown"), write that error and wait for the 60 s rescan,
//! so after every start all but one node of each type waited a minute (issue 29 item 0; `plan`
//! and shadow mode showed the same error, item 5). A failed lookup is tried again after
//! [`RETRY_SPACING`], and the pass says when.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::ec2::Ec2Error;

use crate::clock::now;

/// At most one lookup of a type a minute while it fails (a type EC2 does not know answers
/// `InvalidInstanceType` every time).
pub const RETRY_SPACING: Duration = Duration::from_secs(60);

/// Why a type's limits are still unknown after [`TypeLookups::ensure`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unresolved {
    /// The next lookup may start then.
    pub retry_at: Instant,
    /// EC2 answered that the type does not exist (`InvalidInstanceType`): a fact about the
    /// node, not missing data of ours.
    pub invalid_type: bool,
    /// The last lookup's error.
    pub error: Option<String>,
}

/// The last attempt of one type's lookup.
#[derive(Clone, Debug, Default)]
struct Attempt {
    at: Option<Instant>,
    invalid_type: bool,
    error: Option<String>,
}

/// Per type, a lock held while its lookup is in flight, and its last attempt.
#[derive(Debug, Default)]
pub struct TypeLookups {
    types: Mutex<HashMap<String, Arc<tokio::sync::Mutex<Attempt>>>>,
}

impl TypeLookups {
    /// How many types it keeps an attempt for.
    pub fn tracked(&self) -> usize {
        self.types.lock().expect("type lookups").len()
    }

    /// Make sure the limits of `instance_type` are known (`known` reads the cache): wait for a
    /// lookup of the type in flight, else describe it (`describe`) unless one failed within
    /// [`RETRY_SPACING`]. `Err`: still unknown, and until when.
    pub async fn ensure<F, Fut>(
        &self,
        instance_type: &str,
        known: impl Fn() -> bool,
        describe: F,
    ) -> Result<(), Unresolved>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<(), Ec2Error>>,
    {
        if known() {
            return Ok(());
        }
        let lookup = self
            .types
            .lock()
            .expect("type lookups")
            .entry(instance_type.to_string())
            .or_default()
            .clone();
        if crate::mutants::active("limits-not-awaited") && lookup.try_lock().is_err() {
            // Planted defect: plan without the limits another pass is looking up.
            return Err(Unresolved {
                retry_at: now() + RETRY_SPACING,
                invalid_type: false,
                error: None,
            });
        }
        // One block, so that its early answers still prune below.
        let result = async {
            // Held across the describe: a second pass of the type waits here for the answer.
            let mut last = lookup.lock().await;
            if known() {
                return Ok(());
            }
            let t = now();
            let unresolved = |a: &Attempt, at: Instant| Unresolved {
                retry_at: at + RETRY_SPACING,
                invalid_type: a.invalid_type,
                error: a.error.clone(),
            };
            if let Some(at) = last.at
                && t < at + RETRY_SPACING
            {
                return Err(unresolved(&last, at));
            }
            let answer = describe().await;
            *last = Attempt {
                at: Some(t),
                invalid_type: answer
                    .as_ref()
                    .is_err_and(|e| e.code == "InvalidInstanceType"),
                error: answer.err().map(|e| e.to_string()),
            };
            if known() {
                Ok(())
            } else {
                Err(unresolved(&last, t))
            }
        }
        .await;
        drop(lookup);
        self.prune(instance_type, result.is_ok(), now());
        result
    }

    /// Keep a type's entry only while a pass holds it or its last attempt still spaces the
    /// next lookup, and none for a type just found: the types are the agents' to write, so
    /// the map must not keep every name ever seen.
    fn prune(&self, found: &str, known: bool, t: Instant) {
        let mut types = self.types.lock().expect("type lookups");
        if known && types.get(found).is_some_and(|l| Arc::strong_count(l) == 1) {
            types.remove(found);
        }
        types.retain(|_, lookup| {
            Arc::strong_count(lookup) > 1
                || lookup
                    .try_lock()
                    .map_or(true, |a| a.at.is_some_and(|at| t < at + RETRY_SPACING))
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    /// `spec.eni.instance-type` is the agent's to write: types that come and go (nodes
    /// replaced, a mistyped name fixed, an agent writing nonsense) leave no entry behind once
    /// their retry spacing has passed, and a known type keeps none.
    #[tokio::test(start_paused = true)]
    async fn lookups_of_types_no_pass_asks_for_any_more_are_dropped() {
        let lookups = TypeLookups::default();
        let failing = || async {
            Err(Ec2Error::from_aws(
                crate::ec2::Operation::DescribeInstanceTypes,
                "InvalidInstanceType",
                "no such type",
                Some(400),
            ))
        };
        for i in 0..200 {
            let r = lookups
                .ensure(&format!("x{i}.large"), || false, failing)
                .await;
            assert!(r.is_err_and(|u| u.invalid_type));
        }
        tokio::time::advance(RETRY_SPACING + Duration::from_secs(1)).await;
        let known = AtomicBool::new(false);
        let describe = || async {
            known.store(true, Ordering::SeqCst);
            Ok(())
        };
        let r = lookups
            .ensure("m5.large", || known.load(Ordering::SeqCst), describe)
            .await;
        assert_eq!(r, Ok(()));
        assert_eq!(
            lookups.tracked(),
            0,
            "nothing kept of old failures or a known type"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_second_pass_waits_for_the_lookup_in_flight_instead_of_planning_without_limits() {
        let lookups = TypeLookups::default();
        let known = AtomicBool::new(false);
        let calls = AtomicUsize::new(0);
        let describe = || async {
            calls.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(1500)).await;
            known.store(true, Ordering::SeqCst);
            Ok(())
        };
        let is_known = || known.load(Ordering::SeqCst);
        let (a, b) = tokio::join!(
            lookups.ensure("m5.large", is_known, describe),
            lookups.ensure("m5.large", is_known, describe),
        );
        assert_eq!((a, b), (Ok(()), Ok(())));
        assert_eq!(calls.load(Ordering::SeqCst), 1, "one lookup for the type");
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_lookup_is_retried_after_the_spacing_and_says_when() {
        let lookups = TypeLookups::default();
        let calls = AtomicUsize::new(0);
        let fail = || async {
            calls.fetch_add(1, Ordering::SeqCst);
            Err(Ec2Error::from_aws(
                crate::ec2::Operation::DescribeInstanceTypes,
                "InvalidInstanceType",
                "no such type",
                Some(400),
            ))
        };
        let start = now();
        let first = lookups.ensure("bogus", || false, fail).await.unwrap_err();
        assert!(first.invalid_type);
        assert_eq!(first.retry_at, start + RETRY_SPACING);
        let again = lookups.ensure("bogus", || false, fail).await.unwrap_err();
        assert_eq!(again.retry_at, first.retry_at, "not described again yet");
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        tokio::time::advance(RETRY_SPACING).await;
        lookups.ensure("bogus", || false, fail).await.unwrap_err();
        assert_eq!(
            calls.load(Ordering::SeqCst),
            2,
            "described again after the spacing"
        );
    }
}
