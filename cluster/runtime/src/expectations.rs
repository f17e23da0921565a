//! Creations and deletions a controller has asked for but not yet seen in its cache. Until
//! they are seen (or time out), counting the cache would count too few or too many, so the
//! controller waits instead of creating or deleting a second time — as Kubernetes'
//! ReplicaSet, Job and DaemonSet controllers do.
//!
//! Creations are counted (their names are the API's to pick). Deletions are tracked by the
//! pod's UID, as Kubernetes' `UIDTrackingControllerExpectations` does: a pod deleted by
//! someone else at the same time (a node's eviction, a user) is seen once, however many asked
//! for it, and a controller can also settle a deletion from its cache
//! ([`Expectations::retain_deletions`]) when the event that showed it came before the
//! deletion was expected.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

/// After this long, expectations are given up on (a watch event was lost). Kubernetes waits
/// 5 minutes; a minute is far beyond any informer lag seen here (milliseconds, seconds under
/// a 10,000-pod burst), and a workload stalled on a lost event heals four minutes sooner.
pub const EXPECTATIONS_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Debug)]
struct Expected {
    adds: i64,
    /// UIDs of the pods asked to be deleted and not yet seen going.
    deletes: HashSet<String>,
    at: Instant,
}

impl Expected {
    fn met(&self) -> bool {
        self.adds <= 0 && self.deletes.is_empty()
    }
}

/// Pending creations and deletions per controller key.
#[derive(Default)]
pub struct Expectations {
    map: Mutex<HashMap<String, Expected>>,
}

impl Expectations {
    /// No expectations.
    pub fn new() -> Self {
        Self::default()
    }

    fn entry<'a>(m: &'a mut HashMap<String, Expected>, key: &str) -> &'a mut Expected {
        let e = m.entry(key.to_owned()).or_insert_with(|| Expected {
            adds: 0,
            deletes: HashSet::new(),
            at: Instant::now(),
        });
        e.at = Instant::now();
        e
    }

    /// Records that `adds` creations were asked for under `key`.
    pub fn expect_creations(&self, key: &str, adds: i64) {
        let mut m = self.map.lock();
        let e = Self::entry(&mut m, key);
        e.adds = e.adds.max(0) + adds;
    }

    /// Records that the pods with these UIDs were asked to be deleted under `key`.
    pub fn expect_deletions<'a>(&self, key: &str, uids: impl IntoIterator<Item = &'a str>) {
        let mut m = self.map.lock();
        let e = Self::entry(&mut m, key);
        e.deletes.extend(uids.into_iter().map(str::to_owned));
    }

    /// One creation under `key` was seen (or will never happen: it failed).
    pub fn observed_add(&self, key: &str) {
        if let Some(e) = self.map.lock().get_mut(key) {
            e.adds -= 1;
        }
    }

    /// The deletion of the pod `uid` under `key` was seen (or will never happen). A pod not
    /// expected to go changes nothing, nor does seeing one twice (graceful, then gone).
    pub fn observed_delete(&self, key: &str, uid: &str) {
        if let Some(e) = self.map.lock().get_mut(key) {
            e.deletes.remove(uid);
        }
    }

    /// Whether deletions under `key` are still unseen (a controller builds what
    /// [`Expectations::retain_deletions`] needs only then).
    pub fn awaits_deletions(&self, key: &str) -> bool {
        self.map
            .lock()
            .get(key)
            .is_some_and(|e| !e.deletes.is_empty())
    }

    /// Keeps only the expected deletions `pending` says the cache has not shown yet: a
    /// controller calls this with what its cache holds now, which settles a deletion whose
    /// event came before it was expected (the pod was being deleted by someone else already).
    pub fn retain_deletions(&self, key: &str, pending: impl Fn(&str) -> bool) {
        if let Some(e) = self.map.lock().get_mut(key) {
            e.deletes.retain(|uid| pending(uid));
        }
    }

    /// True if nothing asked for under `key` is still unseen (or it all timed out).
    pub fn satisfied(&self, key: &str) -> bool {
        let mut m = self.map.lock();
        let Some(e) = m.get_mut(key) else {
            return true;
        };
        if e.met() {
            return true;
        }
        if e.at.elapsed() <= EXPECTATIONS_TIMEOUT {
            return false;
        }
        // Said once per timeout: the controller acts on its cache from here on, and what it
        // asks for next is not held up by what was never seen.
        tracing::warn!(
            key,
            adds = e.adds,
            deletes = e.deletes.len(),
            "creations or deletions asked for were never seen; given up on after {}s",
            EXPECTATIONS_TIMEOUT.as_secs()
        );
        e.adds = 0;
        e.deletes.clear();
        true
    }

    /// If `key` waits on something unseen: how long until it is given up on (the controller
    /// looks again then, even if no event comes).
    pub fn pending_for(&self, key: &str) -> Option<Duration> {
        let m = self.map.lock();
        let e = m.get(key)?;
        if e.met() {
            return None;
        }
        Some(EXPECTATIONS_TIMEOUT.saturating_sub(e.at.elapsed()) + Duration::from_millis(10))
    }

    /// Drops the expectations of `key` (its object is gone).
    pub fn forget(&self, key: &str) {
        self.map.lock().remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn waits_for_every_creation_then_times_out() {
        let e = Expectations::new();
        assert!(e.satisfied("ns/rs"));
        e.expect_creations("ns/rs", 2);
        assert!(!e.satisfied("ns/rs"));
        e.observed_add("ns/rs");
        assert!(!e.satisfied("ns/rs"));
        e.observed_add("ns/rs");
        assert!(e.satisfied("ns/rs"));
        e.expect_deletions("ns/rs", ["uid-1"]);
        assert!(!e.satisfied("ns/rs"));
        let wait = e.pending_for("ns/rs").expect("waiting");
        assert!(
            wait > EXPECTATIONS_TIMEOUT - Duration::from_secs(1)
                && wait <= EXPECTATIONS_TIMEOUT + Duration::from_millis(10)
        );
        tokio::time::advance(EXPECTATIONS_TIMEOUT + Duration::from_secs(1)).await;
        assert!(e.satisfied("ns/rs"), "a lost event does not block forever");
        assert_eq!(
            e.pending_for("ns/rs"),
            None,
            "nor does it keep waking the set"
        );
        // What was never seen does not hold up what is asked for next.
        e.expect_deletions("ns/rs", ["uid-2"]);
        e.observed_delete("ns/rs", "uid-2");
        assert!(e.satisfied("ns/rs"));
        e.forget("ns/rs");
        assert!(e.satisfied("ns/rs"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_deletion_is_seen_once_whoever_else_asked_for_it() {
        let e = Expectations::new();
        e.expect_deletions("ns/rs", ["a", "b"]);
        // Graceful then gone: the same pod seen twice counts once; a pod nobody here
        // deleted counts for nothing.
        e.observed_delete("ns/rs", "a");
        e.observed_delete("ns/rs", "a");
        e.observed_delete("ns/rs", "c");
        assert!(!e.satisfied("ns/rs"), "b is still expected to go");
        e.observed_delete("ns/rs", "b");
        assert!(e.satisfied("ns/rs"));

        // The race a count cannot survive: `x` was being evicted already, its event came
        // (and went) before this controller, reading an older cache, asked to delete it
        // too. No event will come again; the cache settles it.
        e.observed_delete("ns/rs", "x");
        e.expect_deletions("ns/rs", ["x", "y"]);
        assert!(!e.satisfied("ns/rs"));
        assert!(e.awaits_deletions("ns/rs"));
        let active = ["y"];
        e.retain_deletions("ns/rs", |uid| active.contains(&uid));
        assert!(!e.satisfied("ns/rs"), "y is still active in the cache");
        e.retain_deletions("ns/rs", |_| false);
        assert!(e.satisfied("ns/rs"));
        assert!(!e.awaits_deletions("ns/rs"));
    }
}
