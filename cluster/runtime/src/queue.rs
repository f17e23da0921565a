//! The priority work queue between a controller's watches and its workers.
//!
//! Keys are ordered by the class of event that queued them — by default an add before an
//! update before a delete before a resync — then by an optional per-controller priority
//! function, then first come first served. A key waiting in the queue is held once, at its
//! most urgent class. A key being worked on is not handed to a second worker: added again
//! meanwhile, it waits until the first worker is done (as client-go's work queue does). Failed
//! keys come back after a per-key exponential backoff, capped.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BinaryHeap, HashMap, HashSet};
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::metrics::QueueMetrics;

/// The kind of change that queued a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventClass {
    /// An object appeared.
    Add,
    /// An object changed.
    Update,
    /// An object went away.
    Delete,
    /// A periodic resync or a retry with no new event.
    Resync,
}

impl EventClass {
    /// Every class, in the default order.
    pub const ALL: [EventClass; 4] = [
        EventClass::Add,
        EventClass::Update,
        EventClass::Delete,
        EventClass::Resync,
    ];

    /// Its name in metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            EventClass::Add => "add",
            EventClass::Update => "update",
            EventClass::Delete => "delete",
            EventClass::Resync => "resync",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// How a queue orders and retries.
#[derive(Clone, Debug)]
pub struct QueueConfig {
    /// The controller's name (the `controller` label of the metrics).
    pub name: String,
    /// The rank of each class, by `EventClass` index: lower ranks are served first.
    pub class_rank: [u8; 4],
    /// First retry delay after a failure.
    pub base_backoff: Duration,
    /// Longest retry delay.
    pub max_backoff: Duration,
    /// The least time between two reconciles of a key queued with
    /// [`WorkQueue::add_throttled`] (zero: none). Like kube-controller-manager's
    /// `--endpoint-updates-batch-period`, for changes that only move a status: a key that
    /// rests is reconciled at once, one that changes often once per period with its changes
    /// joined.
    pub throttle: Duration,
}

impl QueueConfig {
    /// Kubernetes-like defaults: add, update, delete, resync; retries from 5 ms, doubling,
    /// up to 5 minutes.
    pub fn new(name: impl Into<String>) -> QueueConfig {
        QueueConfig {
            name: name.into(),
            class_rank: [0, 1, 2, 3],
            base_backoff: Duration::from_millis(5),
            max_backoff: Duration::from_secs(300),
            throttle: Duration::ZERO,
        }
    }

    /// This config with [`QueueConfig::throttle`] set.
    pub fn with_throttle(mut self, throttle: Duration) -> QueueConfig {
        self.throttle = throttle;
        self
    }

    fn rank(&self, c: EventClass) -> u8 {
        self.class_rank[c.index()]
    }
}

/// The throttle of controllers' status-only changes unless configured: a tenth of a second
/// joins the changes of a workload whose pods start together, and delays a rollout's step
/// by no more than that.
pub const DEFAULT_STATUS_BATCH: Duration = Duration::from_millis(100);

/// `last_done` is pruned no sooner than at this size.
const PRUNE_MIN: usize = 1024;

/// A controller's own ordering within a class: higher values are served first.
pub type PriorityFn<K> = Arc<dyn Fn(&K) -> i32 + Send + Sync>;

struct Entry<K> {
    rank: u8,
    priority: i32,
    seq: u64,
    key: K,
    class: EventClass,
}

impl<K> PartialEq for Entry<K> {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl<K> Eq for Entry<K> {}
impl<K> PartialOrd for Entry<K> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl<K> Ord for Entry<K> {
    /// Greater is more urgent (the heap pops the greatest).
    fn cmp(&self, other: &Self) -> Ordering {
        other
            .rank
            .cmp(&self.rank)
            .then(self.priority.cmp(&other.priority))
            .then(other.seq.cmp(&self.seq))
    }
}

struct Waiting {
    class: EventClass,
    seq: u64,
    since: Instant,
}

struct State<K> {
    heap: BinaryHeap<Entry<K>>,
    waiting: HashMap<K, Waiting>,
    processing: HashSet<K>,
    /// Keys added while being worked on, at their most urgent class.
    dirty: HashMap<K, EventClass>,
    delayed: BTreeMap<(Instant, u64), (K, EventClass)>,
    /// When each delayed key is due: a key is delayed once, at its earliest time (a reconcile
    /// that requeues itself while events also queue it never multiplies its timers).
    delayed_at: HashMap<K, (Instant, u64)>,
    failures: HashMap<K, u32>,
    /// When each key was last finished, for throttled adds (kept one period, pruned in
    /// batches).
    last_done: HashMap<K, Instant>,
    /// `last_done`'s size that starts the next pruning.
    prune_at: usize,
    seq: u64,
    shut: bool,
}

struct Inner<K> {
    state: Mutex<State<K>>,
    notify: Notify,
    config: QueueConfig,
    priority: Option<PriorityFn<K>>,
    metrics: Option<QueueMetrics>,
}

/// A priority work queue; clones share it.
pub struct WorkQueue<K> {
    inner: Arc<Inner<K>>,
}

impl<K> Clone for WorkQueue<K> {
    fn clone(&self) -> Self {
        WorkQueue {
            inner: self.inner.clone(),
        }
    }
}

/// A key handed to a worker: call [`WorkQueue::done`] with it when finished.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Item<K> {
    /// The key.
    pub key: K,
    /// The most urgent class it was queued with.
    pub class: EventClass,
}

impl<K: Clone + Eq + Hash + Send + 'static> WorkQueue<K> {
    /// An empty queue.
    pub fn new(
        config: QueueConfig,
        priority: Option<PriorityFn<K>>,
        metrics: Option<QueueMetrics>,
    ) -> WorkQueue<K> {
        WorkQueue {
            inner: Arc::new(Inner {
                state: Mutex::new(State {
                    heap: BinaryHeap::new(),
                    waiting: HashMap::new(),
                    processing: HashSet::new(),
                    dirty: HashMap::new(),
                    delayed: BTreeMap::new(),
                    delayed_at: HashMap::new(),
                    failures: HashMap::new(),
                    last_done: HashMap::new(),
                    prune_at: PRUNE_MIN,
                    seq: 0,
                    shut: false,
                }),
                notify: Notify::new(),
                config,
                priority,
                metrics,
            }),
        }
    }

    fn more_urgent(&self, a: EventClass, b: EventClass) -> bool {
        self.inner.config.rank(a) < self.inner.config.rank(b)
    }

    fn depth(&self, class: EventClass, delta: i64) {
        if let Some(m) = &self.inner.metrics {
            m.depth
                .with_label_values(&[&self.inner.config.name, class.as_str()])
                .add(delta);
        }
    }

    fn count_add(&self, class: EventClass) {
        if let Some(m) = &self.inner.metrics {
            m.adds
                .with_label_values(&[&self.inner.config.name, class.as_str()])
                .inc();
        }
    }

    /// Queues `key` for an event of `class`.
    pub fn add(&self, key: K, class: EventClass) {
        self.count_add(class);
        let mut s = self.inner.state.lock();
        if s.shut {
            return;
        }
        self.add_locked(&mut s, key, class);
        drop(s);
        self.inner.notify.notify_one();
    }

    fn add_locked(&self, s: &mut State<K>, key: K, class: EventClass) {
        if s.processing.contains(&key) {
            let e = s.dirty.entry(key).or_insert(class);
            if self.more_urgent(class, *e) {
                *e = class;
            }
            return;
        }
        let previous = s.waiting.get(&key).map(|w| (w.class, w.since));
        let since = match previous {
            Some((held, _)) if !self.more_urgent(class, held) => return,
            Some((held, since)) => {
                // Held once, at the more urgent class: the old heap entry goes stale.
                self.depth(held, -1);
                since
            }
            None => Instant::now(),
        };
        s.seq += 1;
        let seq = s.seq;
        let priority = self.inner.priority.as_ref().map_or(0, |f| f(&key));
        s.heap.push(Entry {
            rank: self.inner.config.rank(class),
            priority,
            seq,
            key: key.clone(),
            class,
        });
        s.waiting.insert(key, Waiting { class, seq, since });
        self.depth(class, 1);
    }

    /// Queues `key` for a change that only moves a status: at once if it was last
    /// reconciled at least the queue's [`QueueConfig::throttle`] ago, else when that period
    /// is up (with whatever else changed meanwhile). A key already waiting takes the change
    /// as it is; one being reconciled is queued again a period later.
    pub fn add_throttled(&self, key: K, class: EventClass) {
        let period = self.inner.config.throttle;
        if period.is_zero() {
            return self.add(key, class);
        }
        let mut s = self.inner.state.lock();
        if s.shut || s.waiting.contains_key(&key) {
            return;
        }
        let now = Instant::now();
        let due = if s.processing.contains(&key) {
            Some(now + period)
        } else {
            s.last_done
                .get(&key)
                .map(|at| *at + period)
                .filter(|due| *due > now)
        };
        match due {
            None => {
                self.count_add(class);
                self.add_locked(&mut s, key, class);
            }
            Some(at) => self.delay_locked(&mut s, key, class, at),
        }
        drop(s);
        self.inner.notify.notify_one();
    }

    /// Queues `key` after `delay`.
    pub fn add_after(&self, key: K, class: EventClass, delay: Duration) {
        let mut s = self.inner.state.lock();
        if s.shut {
            return;
        }
        let at = Instant::now() + delay;
        self.delay_locked(&mut s, key, class, at);
        drop(s);
        // A waiting worker recomputes when to wake up.
        self.inner.notify.notify_one();
    }

    /// Queues `key` at `at`, unless it is due earlier already.
    fn delay_locked(&self, s: &mut State<K>, key: K, class: EventClass, at: Instant) {
        if let Some(&(due, seq)) = s.delayed_at.get(&key) {
            if due <= at {
                return;
            }
            s.delayed.remove(&(due, seq));
        }
        s.seq += 1;
        let seq = s.seq;
        s.delayed_at.insert(key.clone(), (at, seq));
        s.delayed.insert((at, seq), (key, class));
    }

    /// Queues `key` again after its next backoff (doubling per consecutive failure, capped).
    pub fn retry(&self, key: K, class: EventClass) {
        let n = {
            let mut s = self.inner.state.lock();
            let n = s.failures.entry(key.clone()).or_insert(0);
            *n += 1;
            *n
        };
        if let Some(m) = &self.inner.metrics {
            m.retries
                .with_label_values(&[&self.inner.config.name])
                .inc();
        }
        let c = &self.inner.config;
        let factor = 2u32.saturating_pow(n.saturating_sub(1).min(31));
        let delay = c.base_backoff.saturating_mul(factor).min(c.max_backoff);
        self.add_after(key, class, delay);
    }

    /// Clears the failure count of `key` (after it succeeded).
    pub fn forget(&self, key: &K) {
        self.inner.state.lock().failures.remove(key);
    }

    /// The number of consecutive failures of `key`.
    pub fn failures(&self, key: &K) -> u32 {
        self.inner
            .state
            .lock()
            .failures
            .get(key)
            .copied()
            .unwrap_or(0)
    }

    /// Keys waiting (not counting delayed or in-progress ones).
    pub fn len(&self) -> usize {
        self.inner.state.lock().waiting.len()
    }

    /// True if nothing waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The most urgent key, waiting until there is one; `None` once shut down.
    pub async fn get(&self) -> Option<Item<K>> {
        loop {
            let notified = self.inner.notify.notified();
            let next_due = {
                let mut s = self.inner.state.lock();
                let now = Instant::now();
                while let Some(entry) = s.delayed.first_entry() {
                    if entry.key().0 > now {
                        break;
                    }
                    let (key, class) = entry.remove();
                    s.delayed_at.remove(&key);
                    self.add_locked(&mut s, key, class);
                }
                while let Some(e) = s.heap.pop() {
                    let live = s.waiting.get(&e.key).is_some_and(|w| w.seq == e.seq);
                    if !live {
                        continue;
                    }
                    let w = s.waiting.remove(&e.key).expect("checked above");
                    s.processing.insert(e.key.clone());
                    self.depth(e.class, -1);
                    if let Some(m) = &self.inner.metrics {
                        m.latency
                            .with_label_values(&[&self.inner.config.name, e.class.as_str()])
                            .observe(w.since.elapsed().as_secs_f64());
                    }
                    // More may be waiting: let another worker look.
                    if !s.heap.is_empty() {
                        self.inner.notify.notify_one();
                    }
                    return Some(Item {
                        key: e.key,
                        class: e.class,
                    });
                }
                if s.shut {
                    return None;
                }
                s.delayed.keys().next().map(|(at, _)| *at)
            };
            match next_due {
                Some(at) => {
                    tokio::select! {
                        _ = notified => {}
                        _ = tokio::time::sleep_until(at) => {}
                    }
                }
                None => notified.await,
            }
        }
    }

    /// Marks `item` finished (after `worked` of work); if it was added again meanwhile, it is
    /// queued now.
    pub fn done(&self, item: &Item<K>, worked: Duration) {
        if let Some(m) = &self.inner.metrics {
            m.work
                .with_label_values(&[&self.inner.config.name])
                .observe(worked.as_secs_f64());
        }
        let mut s = self.inner.state.lock();
        s.processing.remove(&item.key);
        let period = self.inner.config.throttle;
        if !period.is_zero() {
            let now = Instant::now();
            s.last_done.insert(item.key.clone(), now);
            if s.last_done.len() >= s.prune_at {
                s.last_done
                    .retain(|_, at| now.saturating_duration_since(*at) < period);
                s.prune_at = (s.last_done.len() * 2).max(PRUNE_MIN);
            }
        }
        if let Some(class) = s.dirty.remove(&item.key)
            && !s.shut
        {
            self.add_locked(&mut s, item.key.clone(), class);
            drop(s);
            self.inner.notify.notify_one();
        }
    }

    /// Stops handing out keys: workers' `get` returns `None` once the queue is empty.
    pub fn shut_down(&self) {
        self.inner.state.lock().shut = true;
        self.inner.notify.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue() -> WorkQueue<String> {
        WorkQueue::new(QueueConfig::new("test"), None, None)
    }

    async fn take(q: &WorkQueue<String>) -> Item<String> {
        let item = q.get().await.expect("an item");
        q.done(&item, Duration::ZERO);
        item
    }

    #[tokio::test(start_paused = true)]
    async fn new_adds_are_served_before_a_flood_of_deletes() {
        let q = queue();
        for i in 0..10_000 {
            q.add(format!("old-{i}"), EventClass::Delete);
        }
        for i in 0..10 {
            q.add(format!("new-{i}"), EventClass::Add);
        }
        q.add("changed".into(), EventClass::Update);
        let first: Vec<String> = futures_take(&q, 11).await;
        assert_eq!(
            &first[..10],
            (0..10).map(|i| format!("new-{i}")).collect::<Vec<_>>()
        );
        assert_eq!(first[10], "changed");
        assert_eq!(take(&q).await.key, "old-0", "deletes keep their order");
    }

    async fn futures_take(q: &WorkQueue<String>, n: usize) -> Vec<String> {
        let mut out = Vec::new();
        for _ in 0..n {
            out.push(take(q).await.key);
        }
        out
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_is_held_once_at_its_most_urgent_class() {
        let q = queue();
        q.add("a".into(), EventClass::Delete);
        q.add("b".into(), EventClass::Update);
        q.add("a".into(), EventClass::Add);
        q.add("a".into(), EventClass::Update);
        assert_eq!(q.len(), 2);
        let first = take(&q).await;
        assert_eq!((first.key.as_str(), first.class), ("a", EventClass::Add));
        assert_eq!(take(&q).await.key, "b");
        assert!(q.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_delayed_key_waits_once_at_its_earliest_time() {
        let q = queue();
        let start = tokio::time::Instant::now();
        // A reconcile asking to look again in 10 s while an event asks for 1 s: one look,
        // at 1 s; a later request for 5 s does not add a second timer.
        q.add_after("a".into(), EventClass::Resync, Duration::from_secs(10));
        q.add_after("a".into(), EventClass::Resync, Duration::from_secs(1));
        q.add_after("a".into(), EventClass::Resync, Duration::from_secs(5));
        q.add_after("b".into(), EventClass::Resync, Duration::from_secs(3));
        let first = take(&q).await;
        assert_eq!(first.key, "a");
        assert_eq!(start.elapsed(), Duration::from_secs(1));
        assert_eq!(take(&q).await.key, "b");
        assert_eq!(start.elapsed(), Duration::from_secs(3));
        let nothing = tokio::time::timeout(Duration::from_secs(60), q.get()).await;
        assert!(nothing.is_err(), "no timer of a was left behind");
        // Once due and handed out, the key may wait again.
        q.add_after("a".into(), EventClass::Resync, Duration::from_secs(2));
        assert_eq!(take(&q).await.key, "a");
    }

    #[tokio::test(start_paused = true)]
    async fn throttled_changes_of_a_busy_key_join_and_a_resting_key_goes_at_once() {
        let period = Duration::from_millis(100);
        let q = WorkQueue::new(QueueConfig::new("test").with_throttle(period), None, None);
        let start = Instant::now();
        // Resting: at once.
        q.add_throttled("a".into(), EventClass::Update);
        assert_eq!(take(&q).await.key, "a");
        assert_eq!(start.elapsed(), Duration::ZERO);
        // Just reconciled: five changes in 50 ms are one reconcile, when the period is up.
        for _ in 0..5 {
            q.add_throttled("a".into(), EventClass::Update);
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(q.is_empty(), "held back");
        assert_eq!(take(&q).await.key, "a");
        assert_eq!(start.elapsed(), period);
        let nothing = tokio::time::timeout(Duration::from_secs(1), q.get()).await;
        assert!(nothing.is_err(), "the five were one");
        // A plain add (a change that needs action) is never held back.
        let at = Instant::now();
        q.add("a".into(), EventClass::Update);
        let working = q.get().await.expect("a");
        assert_eq!(at.elapsed(), Duration::ZERO);
        // A change while it is reconciled comes a period later, once.
        q.add_throttled("a".into(), EventClass::Update);
        q.add_throttled("a".into(), EventClass::Update);
        q.done(&working, Duration::ZERO);
        assert_eq!(take(&q).await.key, "a");
        assert_eq!(at.elapsed(), period);
        // Other keys are not held back by a's period.
        q.add_throttled("b".into(), EventClass::Update);
        let b_at = Instant::now();
        assert_eq!(take(&q).await.key, "b");
        assert_eq!(b_at.elapsed(), Duration::ZERO);
        // Without a period, a throttled add is an add.
        let plain = queue();
        plain.add("c".into(), EventClass::Update);
        take(&plain).await;
        plain.add_throttled("c".into(), EventClass::Update);
        assert!(!plain.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_in_progress_is_not_handed_out_twice() {
        let q = queue();
        q.add("a".into(), EventClass::Update);
        let working = q.get().await.expect("a");
        q.add("a".into(), EventClass::Delete);
        q.add("a".into(), EventClass::Update);
        assert!(q.is_empty(), "waits for the worker");
        q.add("b".into(), EventClass::Add);
        assert_eq!(take(&q).await.key, "b");
        q.done(&working, Duration::ZERO);
        let again = take(&q).await;
        assert_eq!((again.key.as_str(), again.class), ("a", EventClass::Update));
    }

    #[tokio::test(start_paused = true)]
    async fn a_priority_function_orders_within_a_class_and_classes_are_configurable() {
        let mut config = QueueConfig::new("test");
        config.class_rank = [2, 1, 0, 3]; // deletes first
        let prio: PriorityFn<String> = Arc::new(|k: &String| i32::from(k.starts_with("vip")));
        let q = WorkQueue::new(config, Some(prio), None);
        q.add("x".into(), EventClass::Update);
        q.add("vip-y".into(), EventClass::Update);
        q.add("gone".into(), EventClass::Delete);
        assert_eq!(futures_take(&q, 3).await, ["gone", "vip-y", "x"]);
    }

    #[tokio::test(start_paused = true)]
    async fn failures_back_off_exponentially_up_to_a_cap() {
        let mut config = QueueConfig::new("test");
        config.base_backoff = Duration::from_millis(10);
        config.max_backoff = Duration::from_millis(50);
        let q = WorkQueue::new(config, None, None);
        let start = Instant::now();
        let mut waited = Vec::new();
        for _ in 0..5 {
            q.retry("k".to_owned(), EventClass::Resync);
            let before = Instant::now();
            take(&q).await;
            waited.push(before.elapsed().as_millis());
        }
        assert_eq!(waited, [10, 20, 40, 50, 50]);
        assert_eq!(q.failures(&"k".to_owned()), 5);
        q.forget(&"k".to_owned());
        assert_eq!(q.failures(&"k".to_owned()), 0);
        assert!(start.elapsed() >= Duration::from_millis(170));
    }

    #[tokio::test(start_paused = true)]
    async fn workers_wait_for_keys_and_stop_at_shutdown() {
        let q = queue();
        let worker = {
            let q = q.clone();
            tokio::spawn(async move {
                let mut seen = Vec::new();
                while let Some(item) = q.get().await {
                    seen.push(item.key.clone());
                    q.done(&item, Duration::ZERO);
                }
                seen
            })
        };
        tokio::time::sleep(Duration::from_millis(5)).await;
        q.add("a".into(), EventClass::Add);
        q.add_after("b".into(), EventClass::Add, Duration::from_millis(100));
        tokio::time::sleep(Duration::from_millis(200)).await;
        q.shut_down();
        assert_eq!(worker.await.expect("worker"), ["a", "b"]);
    }

    #[tokio::test(start_paused = true)]
    async fn depth_is_counted_per_class() {
        let metrics = QueueMetrics::unregistered().expect("metrics");
        let q: WorkQueue<String> =
            WorkQueue::new(QueueConfig::new("deploy"), None, Some(metrics.clone()));
        q.add("a".into(), EventClass::Delete);
        q.add("b".into(), EventClass::Delete);
        q.add("a".into(), EventClass::Add);
        let depth = |c: EventClass| {
            metrics
                .depth
                .with_label_values(&["deploy", c.as_str()])
                .get()
        };
        assert_eq!((depth(EventClass::Add), depth(EventClass::Delete)), (1, 1));
        take(&q).await;
        assert_eq!(depth(EventClass::Add), 0);
    }

    fn class_of(i: u8) -> EventClass {
        EventClass::ALL[usize::from(i % 4)]
    }

    proptest::proptest! {
        /// Whatever is added, draining hands out each key once, at the most urgent class it
        /// was added with, most urgent classes first, first come first served within one.
        #[test]
        fn draining_respects_classes_and_holds_keys_once(
            adds in proptest::collection::vec((0u8..20, 0u8..4), 1..200)
        ) {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
                .expect("runtime");
            let q = queue();
            let mut best: HashMap<String, EventClass> = HashMap::new();
            for (k, c) in &adds {
                let key = format!("k{k}");
                let class = class_of(*c);
                q.add(key.clone(), class);
                let e = best.entry(key).or_insert(class);
                if class.index() < e.index() {
                    *e = class;
                }
            }
            let drained: Vec<Item<String>> = rt.block_on(async {
                let mut out = Vec::new();
                while !q.is_empty() {
                    out.push(take(&q).await);
                }
                out
            });
            proptest::prop_assert_eq!(drained.len(), best.len());
            for w in drained.windows(2) {
                proptest::prop_assert!(w[0].class.index() <= w[1].class.index());
            }
            for item in &drained {
                proptest::prop_assert_eq!(Some(&item.class), best.get(&item.key));
            }
        }
    }
}
