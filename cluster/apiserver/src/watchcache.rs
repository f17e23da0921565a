//! The watch cache: one store watch per resource, however many clients watch it, and every
//! event encoded once for all of them (as kube-apiserver's watch cache does). Each event keeps
//! its JSON line (`{"type":...,"object":...}`), shared by reference with every watcher; a
//! watcher only filters (by namespace from the key, by selectors when it has some) and
//! writes.
//!
//! A cache keeps the most recent events so that a watch resuming from a recent
//! resourceVersion is served from memory — at most `WINDOW` events and `WINDOW_BYTES`, and
//! none older than `FRESH` once more than `KEPT` are held (kube-apiserver sizes its cache by
//! the same 75 s freshness); an older one gets its own store watch (and
//! its `410 Gone` if that revision was compacted). A watcher that falls more than the channel
//! behind is caught up from the window, or its stream ends, as Kubernetes ends slow watchers;
//! clients resume from their last resourceVersion.
//!
//! Caches run for stores with single-part revisions (embedded, one etcd). A sharded store's
//! composite revisions are served by per-watch store watches, which it merges itself.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use bytes::Bytes;
use futures::{Stream, StreamExt};
use parking_lot::{Mutex, RwLock};
use tessera_store::{EventKind, Revision, Store, StoreError, WatchBatch};
use tokio::sync::broadcast;

/// Events kept for resuming watches, at most.
pub const WINDOW: usize = 100_000;
/// Bytes of events (their lines and the stored bytes they hold on to) kept, at most.
pub const WINDOW_BYTES: usize = 128 << 20;
/// How long an event is worth keeping for a resuming watch (kube-apiserver's
/// `eventFreshDuration`).
pub const FRESH: std::time::Duration = std::time::Duration::from_secs(75);
/// Events kept however old they are (a quiet resource keeps its last changes).
pub const KEPT: usize = 100;
/// Batches a watcher may fall behind the live channel before it is caught up from the window.
const CHANNEL: usize = 4096;

/// Encodes an event's JSON line: (type, stored bytes, revision).
pub type LineEncoder = dyn Fn(&str, &[u8], i64) -> Option<Bytes> + Send + Sync;

/// One change, encoded once.
#[derive(Debug)]
pub struct CachedEvent {
    /// `ADDED`, `MODIFIED` or `DELETED`.
    pub ty: &'static str,
    /// The object's key (namespace filtering reads it).
    pub key: Bytes,
    /// The object's stored bytes (the previous ones for a deletion).
    pub value: Bytes,
    /// The bytes before a modification.
    pub prev: Option<Bytes>,
    /// The event's revision (the object's resourceVersion in it).
    pub rev: i64,
    /// The event's JSON line, or `None` if the stored bytes could not be rendered.
    pub line: Option<Bytes>,
}

/// Changes of one revision range, and the revision a watch resumes after.
#[derive(Debug)]
pub struct CachedBatch {
    /// The changes (empty for a progress notification).
    pub events: Vec<CachedEvent>,
    /// Resume after this revision to continue just after the batch.
    pub revision: Revision,
}

impl CachedBatch {
    /// The bytes the batch holds: its lines, and the stored bytes it keeps alive (which the
    /// store may already have let go of).
    pub fn retained_bytes(&self) -> usize {
        self.events
            .iter()
            .map(|e| {
                e.line.as_ref().map_or(0, Bytes::len)
                    + e.value.len()
                    + e.prev.as_ref().map_or(0, Bytes::len)
            })
            .sum()
    }
}

/// Builds the shared form of a store batch (lines encoded by `line`).
pub fn cached_batch(batch: &WatchBatch, line: &LineEncoder) -> CachedBatch {
    let events = batch
        .events
        .iter()
        .filter_map(|e| {
            let (ty, value, prev) = match (e.kind, &e.prev_kv) {
                (EventKind::Put, None) => ("ADDED", e.kv.value.clone(), None),
                (EventKind::Put, Some(p)) => {
                    ("MODIFIED", e.kv.value.clone(), Some(p.value.clone()))
                }
                (EventKind::Delete, Some(p)) => ("DELETED", p.value.clone(), None),
                (EventKind::Delete, None) => return None,
            };
            let rev = e.kv.mod_revision;
            Some(CachedEvent {
                ty,
                key: e.kv.key.clone(),
                line: line(ty, &value, rev),
                value,
                prev,
                rev,
            })
        })
        .collect();
    CachedBatch {
        events,
        revision: batch.revision.clone(),
    }
}

/// A stream of batches for one watcher.
pub type BatchStream =
    std::pin::Pin<Box<dyn Stream<Item = Result<Arc<CachedBatch>, StoreError>> + Send>>;

/// How much a resource's cache keeps for resuming watches.
#[derive(Clone, Copy, Debug)]
pub struct WindowLimits {
    /// Events, at most.
    pub events: usize,
    /// Bytes, at most (`CachedBatch::retained_bytes`).
    pub bytes: usize,
    /// Events older than this leave once more than `kept` are held.
    pub fresh: std::time::Duration,
    /// Events kept whatever their age.
    pub kept: usize,
}

impl Default for WindowLimits {
    fn default() -> Self {
        WindowLimits {
            events: WINDOW,
            bytes: WINDOW_BYTES,
            fresh: FRESH,
            kept: KEPT,
        }
    }
}

/// The batches a cache holds, oldest first, each with when it arrived and its
/// `retained_bytes`.
#[derive(Default)]
struct Window {
    batches: VecDeque<(std::time::Instant, usize, Arc<CachedBatch>)>,
    events: usize,
    bytes: usize,
}

impl Window {
    /// Adds `batch`; the batches pushed out by `limits`, the newest revision among them last.
    fn push(
        &mut self,
        batch: Arc<CachedBatch>,
        now: std::time::Instant,
        limits: &WindowLimits,
    ) -> Option<i64> {
        let bytes = batch.retained_bytes();
        self.events += batch.events.len();
        self.bytes += bytes;
        self.batches.push_back((now, bytes, batch));
        let mut floor = None;
        while let Some((at, bytes, oldest)) = self.batches.front() {
            let stale =
                now.saturating_duration_since(*at) > limits.fresh && self.events > limits.kept;
            if !(stale || self.events > limits.events || self.bytes > limits.bytes) {
                break;
            }
            floor = Some(single(&oldest.revision));
            self.events -= oldest.events.len();
            self.bytes -= bytes;
            self.batches.pop_front();
        }
        floor
    }
}

struct ResourceCache {
    /// Batches held, oldest first.
    window: RwLock<Window>,
    /// Every revision after `floor` is in the window (`floor` rises as batches leave it).
    floor: Mutex<i64>,
    live: broadcast::Sender<Arc<CachedBatch>>,
}

impl ResourceCache {
    /// The batches after `after`, if the window holds everything since then.
    fn since(&self, after: i64) -> Option<Vec<Arc<CachedBatch>>> {
        let floor = *self.floor.lock();
        if after < floor {
            return None;
        }
        let window = self.window.read();
        Some(
            window
                .batches
                .iter()
                .filter(|(_, _, b)| single(&b.revision) > after)
                .map(|(_, _, b)| b.clone())
                .collect(),
        )
    }
}

fn single(r: &Revision) -> i64 {
    r.parts().first().copied().unwrap_or(0)
}

/// The caches of one API server, one per watched resource prefix.
#[derive(Clone)]
pub struct WatchCache {
    store: Arc<dyn Store>,
    line: Arc<LineEncoder>,
    caches: Arc<Mutex<HashMap<String, Arc<ResourceCache>>>>,
    channel: usize,
    enabled: bool,
    limits: WindowLimits,
}

impl WatchCache {
    /// Caches over `store`, encoding event lines with `line`.
    pub fn new(store: Arc<dyn Store>, line: Arc<LineEncoder>) -> WatchCache {
        WatchCache {
            store,
            line,
            caches: Arc::default(),
            channel: CHANNEL,
            enabled: true,
            limits: WindowLimits::default(),
        }
    }

    /// The same, keeping what `limits` allow for resuming watches.
    pub fn with_window(mut self, limits: WindowLimits) -> WatchCache {
        self.limits = limits;
        self
    }

    /// The same, switched off: every watch gets a store watch of its own (kube-apiserver's
    /// `--watch-cache=false`; for measuring what the cache saves).
    pub fn disabled(mut self) -> WatchCache {
        self.enabled = false;
        self
    }

    /// The same with a live channel of `batches` (tests make watchers lag with a small one).
    pub fn with_channel(mut self, batches: usize) -> WatchCache {
        self.channel = batches.max(1);
        self
    }

    /// The resource's cache, started on first use at the store's current revision; `None`
    /// for stores with composite revisions.
    async fn cache(&self, prefix: &str) -> Result<Option<Arc<ResourceCache>>, StoreError> {
        if let Some(c) = self.caches.lock().get(prefix) {
            return Ok(Some(c.clone()));
        }
        let now = self.store.current_revision().await?;
        if now.parts().len() != 1 {
            return Ok(None);
        }
        let mut stream = self
            .store
            .watch(prefix.as_bytes(), Some(now.clone()))
            .await?;
        let (live, _) = broadcast::channel(self.channel);
        let cache = Arc::new(ResourceCache {
            window: RwLock::new(Window::default()),
            floor: Mutex::new(single(&now)),
            live,
        });
        {
            let mut caches = self.caches.lock();
            if let Some(existing) = caches.get(prefix) {
                // Another watcher started it meanwhile; this store watch is dropped.
                return Ok(Some(existing.clone()));
            }
            caches.insert(prefix.to_owned(), cache.clone());
        }
        let (line, caches, key, pumped, limits) = (
            self.line.clone(),
            self.caches.clone(),
            prefix.to_owned(),
            cache.clone(),
            self.limits,
        );
        tokio::spawn(async move {
            while let Some(item) = stream.next().await {
                let batch = match item {
                    Ok(b) => b,
                    Err(e) => {
                        tracing::warn!(prefix = %key, error = %e, "watch cache lost its store watch; watchers will resume");
                        break;
                    }
                };
                let cached = Arc::new(cached_batch(&batch, line.as_ref()));
                {
                    // The floor rises under the window's lock, as `since` reads them.
                    let mut w = pumped.window.write();
                    if let Some(floor) = w.push(cached.clone(), std::time::Instant::now(), &limits)
                    {
                        *pumped.floor.lock() = floor;
                    }
                }
                // No receivers is fine: nobody watches right now.
                let _ = pumped.live.send(cached);
            }
            caches.lock().remove(&key);
        });
        Ok(Some(cache))
    }

    /// Batches of `prefix` after revision `after`: from the cache when it can serve them, from
    /// a store watch of their own otherwise.
    /// `prefix` is the resource's (what the cache watches); `narrow`, within it, is what a
    /// watch of its own needs (one namespace).
    pub async fn watch(
        &self,
        prefix: &str,
        narrow: &str,
        after: Revision,
    ) -> Result<BatchStream, StoreError> {
        if self.enabled
            && after.parts().len() == 1
            && let Some(cache) = self.cache(prefix).await?
        {
            // Subscribe first, then read the window: nothing falls between the two.
            let rx = cache.live.subscribe();
            let from = single(&after);
            if let Some(backlog) = cache.since(from) {
                return Ok(Box::pin(follow(cache, rx, backlog, from)));
            }
        }
        let line = self.line.clone();
        let stream = self.store.watch(narrow.as_bytes(), Some(after)).await?;
        Ok(Box::pin(stream.map(move |item| {
            item.map(|b| Arc::new(cached_batch(&b, line.as_ref())))
        })))
    }
}

/// The backlog, then live batches after it; caught up from the window after a lag.
fn follow(
    cache: Arc<ResourceCache>,
    rx: broadcast::Receiver<Arc<CachedBatch>>,
    backlog: Vec<Arc<CachedBatch>>,
    from: i64,
) -> impl Stream<Item = Result<Arc<CachedBatch>, StoreError>> + Send {
    let last = backlog.last().map_or(from, |b| single(&b.revision));
    let state = (cache, rx, VecDeque::from(backlog), last);
    futures::stream::unfold(state, |(cache, mut rx, mut pending, mut last)| async move {
        loop {
            if let Some(b) = pending.pop_front() {
                last = last.max(single(&b.revision));
                return Some((Ok(b), (cache, rx, pending, last)));
            }
            match rx.recv().await {
                Ok(b) if single(&b.revision) <= last && !b.events.is_empty() => continue,
                Ok(b) => {
                    last = last.max(single(&b.revision));
                    return Some((Ok(b), (cache, rx, pending, last)));
                }
                Err(broadcast::error::RecvError::Lagged(_)) => match cache.since(last) {
                    Some(missed) => pending.extend(missed),
                    // Too far behind even for the window: end; the client resumes.
                    None => return None,
                },
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use tessera_store::{EmbeddedOptions, EmbeddedStore, StoreMetrics};

    use super::*;

    async fn store(dir: &std::path::Path) -> Arc<dyn Store> {
        let metrics = StoreMetrics::register(&prometheus::Registry::new()).expect("metrics");
        Arc::new(
            EmbeddedStore::open(dir, EmbeddedOptions::small(), metrics)
                .await
                .expect("store"),
        )
    }

    fn cache(store: Arc<dyn Store>) -> WatchCache {
        WatchCache::new(
            store,
            Arc::new(|ty: &str, v: &[u8], rev: i64| {
                Some(Bytes::from(format!(
                    "{ty} {rev} {}",
                    String::from_utf8_lossy(v)
                )))
            }),
        )
    }

    /// Collects `n` events' revisions from a stream.
    async fn take(stream: &mut BatchStream, n: usize) -> Vec<i64> {
        let mut revs = Vec::new();
        while revs.len() < n {
            let b = tokio::time::timeout(std::time::Duration::from_secs(20), stream.next())
                .await
                .expect("in time")
                .expect("open")
                .expect("batch");
            revs.extend(b.events.iter().map(|e| e.rev));
        }
        revs
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn many_watchers_share_one_store_watch_and_see_everything_in_order() {
        let dir = tempfile::tempdir().expect("tempdir");
        let s = store(dir.path()).await;
        let wc = cache(s.clone());
        let start = s.current_revision().await.expect("rev");
        let mut watchers = Vec::new();
        for _ in 0..50 {
            watchers.push(
                wc.watch("/registry/x/", "/registry/x/", start.clone())
                    .await
                    .expect("watch"),
            );
        }
        assert_eq!(wc.caches.lock().len(), 1, "one cache, one store watch");
        for i in 0..100 {
            s.create(
                Bytes::from(format!("/registry/x/k{i:03}")),
                Bytes::from("v"),
            )
            .await
            .expect("create");
        }
        let first = take(&mut watchers[0], 100).await;
        assert!(first.windows(2).all(|w| w[0] < w[1]), "in order, once");
        for w in &mut watchers[1..] {
            assert_eq!(take(w, 100).await, first);
        }
        // A late watcher resuming from the middle gets exactly the rest from the window. (A
        // batch that straddles the resume point also carries the events at or before it; the
        // API layer skips those, so they are skipped here too.)
        let mid = Revision::single(first[49]);
        let mut late = wc
            .watch("/registry/x/", "/registry/x/", mid)
            .await
            .expect("resume");
        let mut rest = Vec::new();
        while rest.len() < 50 {
            let b = tokio::time::timeout(std::time::Duration::from_secs(20), late.next())
                .await
                .expect("in time")
                .expect("open")
                .expect("batch");
            rest.extend(b.events.iter().map(|e| e.rev).filter(|r| *r > first[49]));
        }
        assert_eq!(rest, first[50..]);
    }

    fn batch(rev: i64, value: &str) -> Arc<CachedBatch> {
        Arc::new(CachedBatch {
            events: vec![CachedEvent {
                ty: "ADDED",
                key: Bytes::from_static(b"/registry/x/k"),
                value: Bytes::copy_from_slice(value.as_bytes()),
                prev: None,
                rev,
                line: Some(Bytes::copy_from_slice(value.as_bytes())),
            }],
            revision: Revision::single(rev),
        })
    }

    #[test]
    fn the_window_keeps_fresh_events_within_its_count_and_bytes() {
        use std::time::{Duration, Instant};
        let limits = WindowLimits {
            events: 5,
            bytes: 100,
            fresh: Duration::from_secs(75),
            kept: 2,
        };
        let t0 = Instant::now();
        let mut w = Window::default();
        // Within every limit: nothing leaves.
        for rev in 1..=5 {
            assert_eq!(w.push(batch(rev, "0123456789"), t0, &limits), None);
        }
        assert_eq!((w.events, w.bytes), (5, 100));
        // One more event than the count allows: the oldest leaves, the floor is its revision.
        assert_eq!(w.push(batch(6, "0123456789"), t0, &limits), Some(1));
        assert_eq!(w.events, 5);
        // A big event pushes out as many as its bytes need.
        assert_eq!(w.push(batch(7, &"x".repeat(30)), t0, &limits), Some(4));
        assert_eq!((w.events, w.bytes), (3, 100));
        // Past the freshness, old events leave, down to the ones kept whatever their age.
        let later = t0 + Duration::from_secs(76);
        assert_eq!(w.push(batch(8, "0123456789"), later, &limits), Some(6));
        let revs: Vec<i64> = w
            .batches
            .iter()
            .map(|(_, _, b)| single(&b.revision))
            .collect();
        assert_eq!(revs, [7, 8], "the stale ones went; the kept two stay");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lagging_watcher_is_caught_up_from_the_window() {
        let dir = tempfile::tempdir().expect("tempdir");
        let s = store(dir.path()).await;
        let wc = cache(s.clone()).with_channel(8);
        let start = s.current_revision().await.expect("rev");
        let mut slow = wc
            .watch("/registry/y/", "/registry/y/", start)
            .await
            .expect("watch");
        // More single-write batches than the channel holds, while it does not read.
        let n = 500;
        for i in 0..n {
            s.create(
                Bytes::from(format!("/registry/y/k{i:05}")),
                Bytes::from("v"),
            )
            .await
            .expect("create");
        }
        let revs = take(&mut slow, n).await;
        assert_eq!(revs.len(), n);
        assert!(revs.windows(2).all(|w| w[0] < w[1]), "no gap, no repeat");
    }
}
