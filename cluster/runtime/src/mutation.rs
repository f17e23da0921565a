//! A controller's own writes laid over its informer's cache until the cache shows them (the
//! idea of client-go's `MutationCache`).
//!
//! A controller that writes an object and is woken by another object's event may run before
//! its cache has seen its own write: each kind has its own watch stream, so the event of a
//! Deployment's resize can arrive before the event of the ReplicaSet the controller scaled a
//! moment earlier. Deciding on the older copy gives wrong answers (a mid-rollout resize that
//! sees one active set instead of two puts the whole change on that set). Writes carry
//! resourceVersion preconditions, so a stale *write* fails; this covers the decisions that
//! read one object and write another.
//!
//! Entries are keyed like the cache (`namespace/name`); one is dropped as soon as the cache
//! holds that version or a newer one, or after `ttl` (an object deleted meanwhile).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::informer::{Cache, Object, key_of};

struct Entry<T> {
    obj: Arc<T>,
    rv: u64,
    at: Instant,
}

/// Objects this process wrote, newer than its cache's copies.
pub struct MutationCache<T> {
    entries: Mutex<HashMap<String, Entry<T>>>,
    ttl: Duration,
}

fn rv_of<T: Object>(o: &T) -> Option<u64> {
    o.metadata().resource_version.as_deref()?.parse().ok()
}

impl<T: Object> MutationCache<T> {
    /// Keeps entries at most `ttl`.
    pub fn new(ttl: Duration) -> Self {
        MutationCache {
            entries: Mutex::new(HashMap::new()),
            ttl,
        }
    }

    /// Records an object as the API answered a write of it; returns it shared.
    pub fn record(&self, obj: T) -> Arc<T> {
        let obj = Arc::new(obj);
        if let Some(rv) = rv_of(&*obj) {
            let key = key_of(obj.metadata());
            let mut entries = self.entries.lock();
            let newer = entries.get(&key).is_none_or(|e| e.rv < rv);
            if newer {
                entries.insert(
                    key,
                    Entry {
                        obj: obj.clone(),
                        rv,
                        at: Instant::now(),
                    },
                );
            }
        }
        obj
    }

    /// `cached` (objects from `cache` that a caller selected) with this process's newer
    /// writes in place of older copies, plus objects it created that the cache does not hold
    /// yet and that `keep` selects.
    pub fn merge(
        &self,
        cache: &Cache<T>,
        cached: Vec<Arc<T>>,
        keep: impl Fn(&T) -> bool,
    ) -> Vec<Arc<T>> {
        let mut entries = self.entries.lock();
        if entries.is_empty() {
            return cached;
        }
        let now = Instant::now();
        entries.retain(|key, e| {
            let seen = cache.get(key).is_some_and(|c| {
                c.metadata().uid == e.obj.metadata().uid && rv_of(&*c) >= Some(e.rv)
            });
            !seen && now.duration_since(e.at) < self.ttl
        });
        let mut out: Vec<Arc<T>> = Vec::with_capacity(cached.len());
        let mut used = std::collections::HashSet::new();
        for c in cached {
            let key = key_of(c.metadata());
            match entries.get(&key) {
                Some(e) if e.obj.metadata().uid == c.metadata().uid && Some(e.rv) > rv_of(&*c) => {
                    used.insert(key);
                    out.push(e.obj.clone());
                }
                _ => out.push(c),
            }
        }
        for (key, e) in entries.iter() {
            if !used.contains(key) && cache.get(key).is_none() && keep(&e.obj) {
                out.push(e.obj.clone());
            }
        }
        out
    }

    /// How many writes the cache has not shown yet.
    pub fn len(&self) -> usize {
        self.entries.lock().len()
    }

    /// True when the cache has shown every write.
    pub fn is_empty(&self) -> bool {
        self.entries.lock().is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn cm(name: &str, uid: &str, rv: u64) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                uid: Some(uid.into()),
                resource_version: Some(rv.to_string()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn rvs(v: &[Arc<ConfigMap>]) -> Vec<(String, String)> {
        let mut out: Vec<_> = v
            .iter()
            .map(|o| {
                (
                    o.metadata.name.clone().unwrap_or_default(),
                    o.metadata.resource_version.clone().unwrap_or_default(),
                )
            })
            .collect();
        out.sort();
        out
    }

    #[test]
    fn newer_writes_win_until_the_cache_has_them() {
        let cache: Cache<ConfigMap> = Cache::new();
        cache.insert(cm("a", "u1", 5));
        let m = MutationCache::new(Duration::from_secs(60));
        m.record(cm("a", "u1", 9));
        let got = m.merge(&cache, cache.list(), |_| true);
        assert_eq!(rvs(&got), vec![("a".into(), "9".into())]);
        // The cache catches up: the entry goes, the cache's copy is used.
        cache.insert(cm("a", "u1", 9));
        let got = m.merge(&cache, cache.list(), |_| true);
        assert_eq!(rvs(&got), vec![("a".into(), "9".into())]);
        assert!(m.is_empty());
    }

    #[test]
    fn an_older_write_or_another_objects_write_never_wins() {
        let cache: Cache<ConfigMap> = Cache::new();
        cache.insert(cm("a", "u1", 12));
        let m = MutationCache::new(Duration::from_secs(60));
        m.record(cm("a", "u1", 9));
        assert_eq!(
            rvs(&m.merge(&cache, cache.list(), |_| true)),
            vec![("a".into(), "12".into())]
        );
        // Re-created under the same name: a write of the old object is not laid over it.
        let cache: Cache<ConfigMap> = Cache::new();
        cache.insert(cm("a", "u2", 3));
        m.record(cm("a", "u1", 20));
        assert_eq!(
            rvs(&m.merge(&cache, cache.list(), |_| true)),
            vec![("a".into(), "3".into())]
        );
    }

    #[test]
    fn created_objects_appear_before_the_cache_has_them_and_expire() {
        let cache: Cache<ConfigMap> = Cache::new();
        let m = MutationCache::new(Duration::from_millis(50));
        m.record(cm("new", "u9", 4));
        assert_eq!(
            rvs(&m.merge(&cache, cache.list(), |_| true)),
            vec![("new".into(), "4".into())]
        );
        assert!(m.merge(&cache, cache.list(), |_| false).is_empty());
        std::thread::sleep(Duration::from_millis(80));
        assert!(m.merge(&cache, cache.list(), |_| true).is_empty());
        assert!(m.is_empty());
    }
}
