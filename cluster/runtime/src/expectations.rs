//! Creations and deletions a controller has asked for but not yet seen in its cache. Until
//! they are seen (or time out), counting the cache would count too few or too many, so the
//! controller waits instead of creating or deleting a second time — as Kubernetes'
//! ReplicaSet, Job and DaemonSet controllers do.

use std::collections::HashMap;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

/// After this long, expectations are given up on (a watch event was lost). Kubernetes waits
/// 5 minutes; a minute is far beyond any informer lag seen here (milliseconds, seconds under
/// a 10,000-pod burst), and a workload stalled on a lost event heals four minutes sooner.
pub const EXPECTATIONS_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, Copy)]
struct Expected {
    adds: i64,
    deletes: i64,
    at: Instant,
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

    /// Records that `adds` creations and `deletes` deletions were asked for under `key`.
    pub fn expect(&self, key: &str, adds: i64, deletes: i64) {
        let mut m = self.map.lock();
        let e = m.entry(key.to_owned()).or_insert(Expected {
            adds: 0,
            deletes: 0,
            at: Instant::now(),
        });
        e.adds = e.adds.max(0) + adds;
        e.deletes = e.deletes.max(0) + deletes;
        e.at = Instant::now();
    }

    /// One creation under `key` was seen (or will never happen: it failed).
    pub fn observed_add(&self, key: &str) {
        if let Some(e) = self.map.lock().get_mut(key) {
            e.adds -= 1;
        }
    }

    /// One deletion under `key` was seen (or will never happen).
    pub fn observed_delete(&self, key: &str) {
        if let Some(e) = self.map.lock().get_mut(key) {
            e.deletes -= 1;
        }
    }

    /// True if nothing asked for under `key` is still unseen (or it all timed out).
    pub fn satisfied(&self, key: &str) -> bool {
        match self.map.lock().get(key) {
            None => true,
            Some(e) => (e.adds <= 0 && e.deletes <= 0) || e.at.elapsed() > EXPECTATIONS_TIMEOUT,
        }
    }

    /// If `key` waits on something unseen: how long until it is given up on (the controller
    /// looks again then, even if no event comes).
    pub fn pending_for(&self, key: &str) -> Option<Duration> {
        let m = self.map.lock();
        let e = m.get(key)?;
        if e.adds <= 0 && e.deletes <= 0 {
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
        e.expect("ns/rs", 2, 0);
        assert!(!e.satisfied("ns/rs"));
        e.observed_add("ns/rs");
        assert!(!e.satisfied("ns/rs"));
        e.observed_add("ns/rs");
        assert!(e.satisfied("ns/rs"));
        e.expect("ns/rs", 0, 1);
        assert!(!e.satisfied("ns/rs"));
        let wait = e.pending_for("ns/rs").expect("waiting");
        assert!(
            wait > EXPECTATIONS_TIMEOUT - Duration::from_secs(1)
                && wait <= EXPECTATIONS_TIMEOUT + Duration::from_millis(10)
        );
        tokio::time::advance(EXPECTATIONS_TIMEOUT + Duration::from_secs(1)).await;
        assert!(e.satisfied("ns/rs"), "a lost event does not block forever");
        e.forget("ns/rs");
        assert!(e.satisfied("ns/rs"));
    }
}
