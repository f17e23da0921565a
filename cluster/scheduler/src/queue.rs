//! The scheduling queue: pods waiting to be scheduled are *active* (ordered by the profile's
//! QueueSort plugin: priority, then time), *backing off* after a failed attempt (1 s
//! doubling to 10 s by default), or *unschedulable* — parked until a cluster event that
//! could undo the rejection happens (the plugins that rejected the pod say which events can),
//! or at the latest after five minutes.
//!
//! Parked pods are indexed by the events that wake them, and by when they were parked, so an
//! event touches only the pods it could help (Kubernetes' QueueingHints idea) and the
//! five-minute flush only the pods that are due: no scan of every pending pod per event.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BinaryHeap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::framework::{ClusterEvent, Plugin, QueuedPod};
use crate::resources::PodInfo;

/// Longest time a pod stays parked as unschedulable without any event.
pub const MAX_UNSCHEDULABLE: Duration = Duration::from_secs(300);

#[derive(Debug, Clone, PartialEq)]
enum Place {
    Active(u64),
    Backoff(Instant),
    Unschedulable {
        events: Vec<ClusterEvent>,
        since: Instant,
    },
    InFlight,
}

struct Waiting {
    pod: QueuedPod,
    place: Place,
    /// When its current backoff ends.
    backoff_until: Option<Instant>,
}

struct Active {
    seq: u64,
    pod: QueuedPod,
    sort: Arc<dyn Plugin>,
}

impl PartialEq for Active {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for Active {}
impl PartialOrd for Active {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Active {
    fn cmp(&self, o: &Self) -> Ordering {
        let Some(sort) = self.sort.queue_sort() else {
            return o.seq.cmp(&self.seq);
        };
        if sort.less(&self.pod, &o.pod) {
            Ordering::Greater
        } else if sort.less(&o.pod, &self.pod) {
            Ordering::Less
        } else {
            o.seq.cmp(&self.seq)
        }
    }
}

/// Queue sizes, for metrics.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Sizes {
    /// Ready to be scheduled.
    pub active: usize,
    /// Waiting out a backoff.
    pub backoff: usize,
    /// Parked until an event.
    pub unschedulable: usize,
}

/// The scheduling queue of one scheduler (all its profiles).
pub struct SchedulingQueue {
    sort: Arc<dyn Plugin>,
    heap: BinaryHeap<Active>,
    pods: HashMap<String, Waiting>,
    backoff: BTreeMap<(Instant, u64), String>,
    /// Unschedulable pods by each event that wakes them.
    parked: HashMap<ClusterEvent, HashSet<String>>,
    /// Unschedulable pods by when they were parked (entries of pods that moved on since are
    /// skipped when reached).
    parked_since: BTreeMap<(Instant, u64), String>,
    sizes: Sizes,
    seq: u64,
    initial_backoff: Duration,
    max_backoff: Duration,
}

impl SchedulingQueue {
    /// An empty queue ordered by `sort` (a QueueSort plugin).
    pub fn new(sort: Arc<dyn Plugin>, initial_backoff: Duration, max_backoff: Duration) -> Self {
        SchedulingQueue {
            sort,
            heap: BinaryHeap::new(),
            pods: HashMap::new(),
            backoff: BTreeMap::new(),
            parked: HashMap::new(),
            parked_since: BTreeMap::new(),
            sizes: Sizes::default(),
            seq: 0,
            initial_backoff,
            max_backoff,
        }
    }

    fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    fn count(&mut self, place: &Place, add: bool) {
        let n = match place {
            Place::Active(_) => &mut self.sizes.active,
            Place::Backoff(_) => &mut self.sizes.backoff,
            Place::Unschedulable { .. } => &mut self.sizes.unschedulable,
            Place::InFlight => return,
        };
        if add {
            *n += 1;
        } else {
            *n = n.saturating_sub(1);
        }
    }

    /// Takes `key` out of the indexes of the place it leaves.
    fn unindex(&mut self, key: &str, place: &Place) {
        self.count(place, false);
        if let Place::Unschedulable { events, .. } = place {
            for e in events {
                if let Some(set) = self.parked.get_mut(e) {
                    set.remove(key);
                    if set.is_empty() {
                        self.parked.remove(e);
                    }
                }
            }
        }
    }

    /// Puts `key` into the indexes of the place it takes.
    fn index(&mut self, key: &str, place: &Place) {
        self.count(place, true);
        if let Place::Unschedulable { events, since } = place {
            for e in events {
                self.parked.entry(*e).or_default().insert(key.to_owned());
            }
            let seq = self.next_seq();
            self.parked_since.insert((*since, seq), key.to_owned());
        }
    }

    /// Moves `key` to `place`, keeping the indexes and counts.
    fn set_place(&mut self, key: &str, place: Place) {
        let Some(w) = self.pods.get_mut(key) else {
            return;
        };
        let old = std::mem::replace(&mut w.place, place.clone());
        self.unindex(key, &old);
        self.index(key, &place);
    }

    /// Removes `key` from the queue and its indexes.
    fn take(&mut self, key: &str) -> Option<Waiting> {
        let w = self.pods.remove(key)?;
        self.unindex(key, &w.place);
        Some(w)
    }

    fn activate(&mut self, key: &str) {
        let seq = self.next_seq();
        let Some(pod) = self.pods.get(key).map(|w| w.pod.clone()) else {
            return;
        };
        self.set_place(key, Place::Active(seq));
        self.heap.push(Active {
            seq,
            pod,
            sort: self.sort.clone(),
        });
    }

    /// A pending pod appeared or changed. A new pod becomes active; a known one gets the new
    /// version, and if it was parked as unschedulable it is tried again (its spec may have
    /// changed what fits). A pod being scheduled right now is left alone.
    pub fn add_or_update(&mut self, info: Arc<PodInfo>) {
        let key = info.key.clone();
        match self.pods.get_mut(&key) {
            None => {
                let seq = self.next_seq();
                self.pods.insert(
                    key.clone(),
                    Waiting {
                        pod: QueuedPod {
                            info,
                            enqueued: seq,
                            attempts: 0,
                        },
                        place: Place::InFlight,
                        backoff_until: None,
                    },
                );
                self.activate(&key);
            }
            Some(w) => {
                w.pod.info = info;
                match w.place.clone() {
                    Place::Active(_) => self.activate(&key),
                    Place::Unschedulable { .. } => self.wake(&key, Instant::now()),
                    Place::Backoff(_) | Place::InFlight => {}
                }
            }
        }
    }

    /// A pod went away or was bound: it leaves the queue.
    pub fn remove(&mut self, key: &str) {
        // Its heap or backoff entry goes stale and is skipped when reached.
        self.take(key);
    }

    /// True if the queue holds `key` in any state.
    pub fn contains(&self, key: &str) -> bool {
        self.pods.contains_key(key)
    }

    /// The next pod to schedule (after moving finished backoffs to active); it is in flight
    /// until [`done`](Self::done), [`unschedulable`](Self::unschedulable) or
    /// [`failed`](Self::failed).
    pub fn pop(&mut self, now: Instant) -> Option<QueuedPod> {
        while let Some(e) = self.backoff.first_entry() {
            if e.key().0 > now {
                break;
            }
            let at = e.key().0;
            let key = e.remove();
            if self.pods.get(&key).map(|w| &w.place) == Some(&Place::Backoff(at)) {
                self.activate(&key);
            }
        }
        while let Some(a) = self.heap.pop() {
            let Some(w) = self.pods.get_mut(&a.pod.info.key) else {
                continue;
            };
            if w.place != Place::Active(a.seq) {
                continue;
            }
            let pod = w.pod.clone();
            self.set_place(&a.pod.info.key, Place::InFlight);
            return Some(pod);
        }
        None
    }

    /// When the earliest backoff ends.
    pub fn next_backoff(&self) -> Option<Instant> {
        self.backoff.keys().next().map(|(at, _)| *at)
    }

    /// The pod was scheduled (assumed onto a node): it leaves the queue.
    pub fn done(&mut self, key: &str) {
        self.take(key);
    }

    fn backoff_for(&self, attempts: u32) -> Duration {
        let factor = 2u32.saturating_pow(attempts.saturating_sub(1).min(20));
        self.initial_backoff
            .saturating_mul(factor)
            .min(self.max_backoff)
    }

    fn record_failure(&mut self, key: &str, now: Instant) -> Option<&mut Waiting> {
        let backoff = {
            let w = self.pods.get(key)?;
            self.backoff_for(w.pod.attempts + 1)
        };
        let w = self.pods.get_mut(key)?;
        w.pod.attempts += 1;
        w.backoff_until = Some(now + backoff);
        Some(w)
    }

    /// The attempt found no node; park the pod until one of `events` happens.
    pub fn unschedulable(&mut self, key: &str, events: Vec<ClusterEvent>, now: Instant) {
        if self.record_failure(key, now).is_some() {
            self.set_place(key, Place::Unschedulable { events, since: now });
        }
    }

    /// The attempt failed for another reason (an error, a lost binding): back off.
    pub fn failed(&mut self, key: &str, now: Instant) {
        if self.record_failure(key, now).is_some() {
            self.park_in_backoff(key, now);
        }
    }

    /// A pod that was handed out and scheduled, but whose binding failed, comes back.
    pub fn requeue_after_bind_failure(&mut self, info: Arc<PodInfo>, attempts: u32, now: Instant) {
        let key = info.key.clone();
        let seq = self.next_seq();
        self.take(&key);
        self.pods.insert(
            key.clone(),
            Waiting {
                pod: QueuedPod {
                    info,
                    enqueued: seq,
                    attempts,
                },
                place: Place::InFlight,
                backoff_until: None,
            },
        );
        self.failed(&key, now);
    }

    fn park_in_backoff(&mut self, key: &str, now: Instant) {
        let seq = self.next_seq();
        let Some(w) = self.pods.get_mut(key) else {
            return;
        };
        match w.backoff_until.filter(|t| *t > now) {
            Some(until) => {
                self.set_place(key, Place::Backoff(until));
                self.backoff.insert((until, seq), key.to_owned());
            }
            None => self.activate(key),
        }
    }

    fn wake(&mut self, key: &str, now: Instant) {
        self.park_in_backoff(key, now);
    }

    /// A cluster event: pods parked by plugins that named it are tried again (after what is
    /// left of their backoff). Returns how many moved.
    pub fn on_event(&mut self, event: ClusterEvent, now: Instant) -> usize {
        let Some(keys) = self.parked.remove(&event) else {
            return 0;
        };
        for k in &keys {
            self.wake(k, now);
        }
        keys.len()
    }

    /// Tries again every pod parked longer than [`MAX_UNSCHEDULABLE`].
    pub fn flush_stale(&mut self, now: Instant) -> usize {
        let mut woken = 0;
        while let Some(e) = self.parked_since.first_entry() {
            let since = e.key().0;
            if now.duration_since(since) < MAX_UNSCHEDULABLE {
                break;
            }
            let key = e.remove();
            let still_parked = matches!(
                self.pods.get(&key).map(|w| &w.place),
                Some(Place::Unschedulable { since: s, .. }) if *s == since
            );
            if still_parked {
                self.wake(&key, now);
                woken += 1;
            }
        }
        woken
    }

    /// How many pods are where.
    pub fn sizes(&self) -> Sizes {
        self.sizes
    }

    /// The sizes counted from every pod (what [`sizes`](Self::sizes) keeps up to date).
    #[cfg(test)]
    fn recount(&self) -> Sizes {
        let mut s = Sizes::default();
        for w in self.pods.values() {
            match w.place {
                Place::Active(_) => s.active += 1,
                Place::Backoff(_) => s.backoff += 1,
                Place::Unschedulable { .. } => s.unschedulable += 1,
                Place::InFlight => {}
            }
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugins::basic::PrioritySort;
    use serde_json::json;

    fn pod(name: &str, priority: i32) -> Arc<PodInfo> {
        Arc::new(PodInfo::new(Arc::new(
            serde_json::from_value(json!({"metadata": {"name": name, "namespace": "ns"},
                "spec": {"priority": priority, "containers": [{"name": "c", "image": "x"}]}}))
            .expect("pod"),
        )))
    }

    fn queue() -> SchedulingQueue {
        SchedulingQueue::new(
            Arc::new(PrioritySort),
            Duration::from_secs(1),
            Duration::from_secs(10),
        )
    }

    #[tokio::test(start_paused = true)]
    async fn priority_then_arrival_order() {
        let mut q = queue();
        q.add_or_update(pod("low-1", 0));
        q.add_or_update(pod("high", 100));
        q.add_or_update(pod("low-2", 0));
        let now = Instant::now();
        let order: Vec<String> = std::iter::from_fn(|| q.pop(now))
            .map(|p| p.info.key.clone())
            .collect();
        assert_eq!(order, vec!["ns/high", "ns/low-1", "ns/low-2"]);
    }

    #[tokio::test(start_paused = true)]
    async fn unschedulable_pods_wait_for_an_event_their_plugins_named() {
        let mut q = queue();
        q.add_or_update(pod("p", 0));
        let now = Instant::now();
        let p = q.pop(now).expect("pod");
        q.unschedulable(&p.info.key, vec![ClusterEvent::NodeAdd], now);
        assert_eq!(q.sizes().unschedulable, 1);
        assert_eq!(
            q.on_event(ClusterEvent::NodeTaint, now),
            0,
            "not an event that helps"
        );
        assert!(q.pop(now).is_none());
        assert_eq!(q.on_event(ClusterEvent::NodeAdd, now), 1);
        assert!(q.pop(now).is_none(), "still backing off (1 s)");
        let later = now + Duration::from_secs(1);
        let again = q.pop(later).expect("retried after its backoff");
        assert_eq!(again.attempts, 1);
        // A second failure doubles the backoff.
        q.failed(&again.info.key, later);
        assert!(q.pop(later + Duration::from_millis(1_999)).is_none());
        assert!(q.pop(later + Duration::from_secs(2)).is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn parked_pods_are_retried_after_five_minutes_without_events() {
        let mut q = queue();
        q.add_or_update(pod("p", 0));
        let now = Instant::now();
        let p = q.pop(now).expect("pod");
        q.unschedulable(&p.info.key, vec![ClusterEvent::NodeAdd], now);
        assert_eq!(q.flush_stale(now + Duration::from_secs(299)), 0);
        assert_eq!(q.flush_stale(now + MAX_UNSCHEDULABLE), 1);
        assert!(q.pop(now + MAX_UNSCHEDULABLE).is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn removed_and_updated_pods() {
        let mut q = queue();
        q.add_or_update(pod("gone", 0));
        q.add_or_update(pod("kept", 0));
        q.remove("ns/gone");
        q.add_or_update(pod("kept", 5));
        let now = Instant::now();
        let p = q.pop(now).expect("kept");
        assert_eq!(p.info.key, "ns/kept");
        assert_eq!(p.info.priority, 5, "the newest version");
        assert!(q.pop(now).is_none(), "held once");
    }

    /// Every pod's place agrees with the counts and the event index.
    fn check_indexes(q: &SchedulingQueue) {
        assert_eq!(q.sizes(), q.recount());
        let mut expected: HashMap<ClusterEvent, HashSet<String>> = HashMap::new();
        for (k, w) in &q.pods {
            if let Place::Unschedulable { events, .. } = &w.place {
                for e in events {
                    expected.entry(*e).or_default().insert(k.clone());
                }
            }
        }
        assert_eq!(q.parked, expected);
    }

    const EVENTS: [ClusterEvent; 3] = [
        ClusterEvent::NodeAdd,
        ClusterEvent::NodeTaint,
        ClusterEvent::AssignedPodDelete,
    ];

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(128))]
        /// Whatever happens to pods in whatever order, the kept counts and the index of parked
        /// pods by event match the pods' places, and an event wakes exactly the pods parked
        /// for it.
        #[test]
        fn counts_and_event_index_follow_every_move(
            ops in proptest::collection::vec((0u8..9, 0usize..6, 0usize..3, 0u64..400), 1..120)
        ) {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .start_paused(true)
                .build()
                .expect("runtime");
            rt.block_on(async {
                let mut q = queue();
                let mut now = Instant::now();
                for (op, p, e, secs) in ops {
                    let key = format!("ns/p{p}");
                    match op {
                        0 | 1 => q.add_or_update(pod(&format!("p{p}"), p as i32)),
                        2 => {
                            let _ = q.pop(now);
                        }
                        3 => q.unschedulable(&key, vec![EVENTS[e], EVENTS[(e + 1) % 3]], now),
                        4 => q.failed(&key, now),
                        5 => q.remove(&key),
                        6 => {
                            let parked_for: HashSet<String> =
                                q.parked.get(&EVENTS[e]).cloned().unwrap_or_default();
                            let woken = q.on_event(EVENTS[e], now);
                            assert_eq!(woken, parked_for.len());
                            for k in &parked_for {
                                let place = &q.pods[k].place;
                                assert!(
                                    !matches!(place, Place::Unschedulable { .. }),
                                    "{k} still parked after its event"
                                );
                            }
                        }
                        7 => {
                            now += Duration::from_secs(secs);
                            q.flush_stale(now);
                            for w in q.pods.values() {
                                if let Place::Unschedulable { since, .. } = w.place {
                                    assert!(now.duration_since(since) < MAX_UNSCHEDULABLE);
                                }
                            }
                        }
                        _ => q.done(&key),
                    }
                    check_indexes(&q);
                }
            });
        }
    }
}
