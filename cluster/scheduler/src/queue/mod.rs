//! The scheduling queue: pods waiting to be scheduled are *active* (ordered by the profile's
//! QueueSort plugin: priority, then time), *backing off* after a failed attempt (1 s
//! doubling to 10 s by default), or *unschedulable* — parked until a cluster event that
//! could undo the rejection happens (the plugins that rejected the pod say which events can),
//! or at the latest after five minutes.
//!
//! Parked pods are indexed by the events that wake them, and by when they were parked, so an
//! event touches only the pods it could help (Kubernetes' QueueingHints idea) and the
//! five-minute flush only the pods that are due: no scan of every pending pod per event.
//!
//! Active pods wait in their tenant's own queue; [`fair`] picks the tenant each next pod
//! comes from by weighted dominant resource fairness, so one tenant's flood does not delay
//! another tenant's pods.
//!
//! A gang (the members of one PodGroup) moves as one: its members share the sort place of
//! the first queued, a member's failure backs off its ready mates with it, a member handed
//! out brings its mates backing off along, and one waiting at Permit its parked mates too.

mod fair;

pub use fair::{FairView, NO_TENANT, Standing, TenantSpec, Usage};

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
    /// Backing off after an event woke it from unschedulable (may be tried early in its
    /// tenant's turn).
    woken: bool,
    /// Handed out early, ahead of its backoff, in its tenant's turn.
    early: bool,
    /// The gang (PodGroup, `namespace/name`) it is a member of.
    gang: Option<String>,
}

/// The queued members of one gang (PodGroup).
struct Gang {
    /// The QueueSort place they share ([`QueuedPod::order`]): the `enqueued` of the first
    /// of them queued.
    order: u64,
    members: HashSet<String>,
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
    /// Active pods, one heap per tenant (indexed like `fair`'s tenants).
    heaps: Vec<BinaryHeap<Active>>,
    /// Per tenant: its woken pods still backing off, by when their backoff ends.
    woken: Vec<BTreeMap<(Instant, u64), String>>,
    /// Per tenant: whether its woken pods may be tried ahead of their backoff (until one
    /// of them fails again; the next event that wakes its pods allows it again).
    early: Vec<bool>,
    fair: fair::Fair,
    pods: HashMap<String, Waiting>,
    backoff: BTreeMap<(Instant, u64), String>,
    /// Unschedulable pods by each event that wakes them.
    parked: HashMap<ClusterEvent, HashSet<String>>,
    /// Unschedulable pods by when they were parked (entries of pods that moved on since are
    /// skipped when reached).
    parked_since: BTreeMap<(Instant, u64), String>,
    /// Gangs with members in the queue, by PodGroup.
    gangs: HashMap<String, Gang>,
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
            heaps: vec![BinaryHeap::new()],
            woken: vec![BTreeMap::new()],
            early: vec![true],
            fair: fair::Fair::new(),
            pods: HashMap::new(),
            backoff: BTreeMap::new(),
            parked: HashMap::new(),
            parked_since: BTreeMap::new(),
            gangs: HashMap::new(),
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

    /// The tenant of a pod by its key (`namespace/name`).
    fn tenant_of_key(&self, key: &str) -> u32 {
        self.fair
            .tenant_of(key.split_once('/').map_or("", |(ns, _)| ns))
    }

    fn count(&mut self, key: &str, place: &Place, add: bool) {
        let t = self.tenant_of_key(key);
        for sizes in [&mut self.sizes, self.fair.sizes_mut(t)] {
            let n = match place {
                Place::Active(_) => &mut sizes.active,
                Place::Backoff(_) => &mut sizes.backoff,
                Place::Unschedulable { .. } => &mut sizes.unschedulable,
                Place::InFlight => return,
            };
            if add {
                *n += 1;
            } else {
                *n = n.saturating_sub(1);
            }
        }
    }

    /// Takes `key` out of the indexes of the place it leaves.
    fn unindex(&mut self, key: &str, place: &Place) {
        self.count(key, place, false);
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
        self.count(key, place, true);
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
        self.leave_gang(key, w.gang.as_deref());
        Some(w)
    }

    /// Counts `key`, queued at `seq`, among the queued members of `gang`; returns its
    /// QueueSort place (the gang's, or `seq` for a pod of no gang).
    fn join_gang(&mut self, key: &str, gang: Option<&str>, seq: u64) -> u64 {
        let Some(gang) = gang else { return seq };
        let g = self.gangs.entry(gang.to_owned()).or_insert_with(|| Gang {
            order: seq,
            members: HashSet::new(),
        });
        g.members.insert(key.to_owned());
        g.order
    }

    fn leave_gang(&mut self, key: &str, gang: Option<&str>) {
        if let Some(gang) = gang
            && let Some(g) = self.gangs.get_mut(gang)
        {
            g.members.remove(key);
            if g.members.is_empty() {
                self.gangs.remove(gang);
            }
        }
    }

    /// A new entry for a pod entering the queue, in flight until placed.
    fn enter(&mut self, info: Arc<PodInfo>, attempts: u32) {
        let key = info.key.clone();
        let seq = self.next_seq();
        let gang = crate::plugins::gang::gang_of(&info.pod);
        let order = self.join_gang(&key, gang.as_deref(), seq);
        self.pods.insert(
            key,
            Waiting {
                pod: QueuedPod {
                    info,
                    enqueued: seq,
                    order,
                    attempts,
                },
                place: Place::InFlight,
                backoff_until: None,
                woken: false,
                early: false,
                gang,
            },
        );
    }

    /// Makes the mates of `key` in `gang` active: those backing off (a member handed out
    /// brings them: their backoff is the gang's), and with `parked` those parked as
    /// unschedulable too.
    fn activate_mates(&mut self, key: &str, gang: &str, parked: bool) {
        let Some(g) = self.gangs.get(gang) else {
            return;
        };
        let mates: Vec<String> = g
            .members
            .iter()
            .filter(|m| *m != key)
            .filter(|m| {
                self.pods.get(*m).is_some_and(|w| match w.place {
                    Place::Backoff(_) => true,
                    Place::Unschedulable { .. } => parked,
                    Place::Active(_) | Place::InFlight => false,
                })
            })
            .cloned()
            .collect();
        for m in mates {
            self.activate(&m);
        }
    }

    /// A member of a gang was placed and waits at Permit for the rest: its mates backing
    /// off or parked are tried now (scheduler-plugins' Coscheduling activates a waiting
    /// member's siblings likewise), so the quorum forms instead of the member holding its
    /// node until the deadline while mates wait for an event that may not come.
    pub fn activate_gang_of(&mut self, pod: &PodInfo) {
        if let Some(g) = crate::plugins::gang::gang_of(&pod.pod) {
            self.activate_mates(&pod.key, &g, true);
        }
    }

    /// A member of a gang failed: its gang mates that are ready or backing off for less
    /// long wait out its backoff with it (counting its attempts as theirs), so the gang is
    /// tried again as a whole — not member by member, each reserving a node to wait at
    /// Permit for mates still backing off (scheduler-plugins backs off a PodGroup the same
    /// way). Mates parked as unschedulable wait for their events; those in flight are left.
    /// Returns the mates it moved (the scheduler tells them why).
    fn back_off_gang(&mut self, key: &str) -> Vec<Arc<PodInfo>> {
        let mut moved = Vec::new();
        let Some(w) = self.pods.get(key) else {
            return moved;
        };
        let (Some(gang), Some(until)) = (w.gang.clone(), w.backoff_until) else {
            return moved;
        };
        let attempts = w.pod.attempts;
        let Some(g) = self.gangs.get(&gang) else {
            return moved;
        };
        let mates: Vec<String> = g.members.iter().filter(|m| *m != key).cloned().collect();
        for m in mates {
            let Some(w) = self.pods.get_mut(&m) else {
                continue;
            };
            let sooner = match w.place {
                Place::Active(_) => true,
                Place::Backoff(at) => at < until,
                Place::Unschedulable { .. } | Place::InFlight => false,
            };
            if !sooner {
                continue;
            }
            w.pod.attempts = w.pod.attempts.max(attempts);
            w.backoff_until = Some(until);
            w.woken = false;
            w.early = false;
            moved.push(w.pod.info.clone());
            self.set_place(&m, Place::Backoff(until));
            let seq = self.next_seq();
            self.backoff.insert((until, seq), m);
        }
        moved
    }

    fn activate(&mut self, key: &str) {
        let seq = self.next_seq();
        let Some(w) = self.pods.get_mut(key) else {
            return;
        };
        w.woken = false;
        w.early = false;
        let pod = w.pod.clone();
        self.set_place(key, Place::Active(seq));
        let t = self.tenant_of_key(key);
        self.push_active(t, seq, pod);
    }

    /// Makes room for every tenant in the per-tenant vectors.
    fn tenant_slots(&mut self) {
        let n = self.fair.len();
        if self.heaps.len() < n {
            self.heaps.resize_with(n, BinaryHeap::new);
        }
        if self.woken.len() < n {
            self.woken.resize_with(n, BTreeMap::new);
        }
        if self.early.len() < n {
            self.early.resize(n, true);
        }
    }

    fn push_active(&mut self, t: u32, seq: u64, pod: QueuedPod) {
        self.tenant_slots();
        self.heaps[t as usize].push(Active {
            seq,
            pod,
            sort: self.sort.clone(),
        });
        self.fair.mark_ready(t);
    }

    /// A pending pod appeared or changed. A new pod becomes active; a known one gets the new
    /// version, and if it was parked as unschedulable and its spec, labels or annotations
    /// changed, it is tried again after its backoff (the change may have changed what
    /// fits). A pod being scheduled right now is left alone.
    pub fn add_or_update(&mut self, info: Arc<PodInfo>) {
        let key = info.key.clone();
        // A pod relabelled into another gang (or out of one) moves with its label.
        let gang = crate::plugins::gang::gang_of(&info.pod);
        if let Some(w) = self.pods.get(&key)
            && w.gang != gang
        {
            let (old, enqueued) = (w.gang.clone(), w.pod.enqueued);
            self.leave_gang(&key, old.as_deref());
            let order = self.join_gang(&key, gang.as_deref(), enqueued);
            if let Some(w) = self.pods.get_mut(&key) {
                w.gang = gang;
                w.pod.order = order;
            }
        }
        match self.pods.get_mut(&key) {
            None => {
                self.enter(info, 0);
                self.activate(&key);
            }
            Some(w) => {
                // Only a change the pod's fit could depend on is worth a retry; a status-only
                // update (the scheduler's own PodScheduled=False) is not (kube-scheduler
                // skips those too).
                let (old, new) = (&w.pod.info.pod, &info.pod);
                let changed = old.spec != new.spec
                    || old.metadata.labels != new.metadata.labels
                    || old.metadata.annotations != new.metadata.annotations;
                w.pod.info = info;
                match w.place.clone() {
                    Place::Active(_) => self.activate(&key),
                    // Back off as after any failure: no early try for the pod's own update.
                    Place::Unschedulable { .. } if changed => {
                        self.park_in_backoff(&key, Instant::now(), false)
                    }
                    Place::Unschedulable { .. } | Place::Backoff(_) | Place::InFlight => {}
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
            let (at, seq) = *e.key();
            let key = e.remove();
            let t = self.tenant_of_key(&key) as usize;
            if let Some(w) = self.woken.get_mut(t) {
                w.remove(&(at, seq));
            }
            if self.pods.get(&key).map(|w| &w.place) == Some(&Place::Backoff(at)) {
                self.activate(&key);
            }
        }
        // The tenant with the lowest weighted dominant share first; within it, the
        // QueueSort order. Stale entries (pods that moved on) are dropped on the way.
        while let Some(t) = self.fair.next() {
            let Some(a) = self.heaps[t as usize].pop() else {
                if !self.promote_early(t) {
                    self.fair.unready(t);
                }
                continue;
            };
            let Some(w) = self.pods.get_mut(&a.pod.info.key) else {
                continue;
            };
            if w.place != Place::Active(a.seq) {
                continue;
            }
            let pod = w.pod.clone();
            let gang = w.gang.clone();
            self.set_place(&a.pod.info.key, Place::InFlight);
            if let Some(g) = gang {
                self.activate_mates(&a.pod.info.key, &g, false);
            }
            let ti = t as usize;
            let more_early = self.early[ti] && !self.woken[ti].is_empty();
            if self.heaps[ti].is_empty() && !more_early {
                self.fair.unready(t);
            }
            self.fair.served(t);
            return Some(pod);
        }
        None
    }

    /// Tenant `t` is the one to serve but has no active pod: if it may, its woken pod whose
    /// backoff ends first becomes active now. Backoff after a wake exists so a storm of
    /// events does not retry every parked pod at once; left alone it would also decide which
    /// tenant gets room freed by a completion (whoever's backoff ended first). So each
    /// tenant, in fair-share order, may try its woken pods early until one fails: at most
    /// one failed early try per tenant per waking event.
    fn promote_early(&mut self, t: u32) -> bool {
        let ti = t as usize;
        if !self.early.get(ti).copied().unwrap_or(false) {
            return false;
        }
        while let Some(((at, seq), key)) = self.woken[ti].pop_first() {
            if self.pods.get(&key).map(|w| &w.place) != Some(&Place::Backoff(at)) {
                continue;
            }
            self.backoff.remove(&(at, seq));
            self.activate(&key);
            if let Some(w) = self.pods.get_mut(&key) {
                w.early = true;
            }
            return true;
        }
        false
    }

    /// A pod handed out early failed: its tenant waits out backoffs until the next event.
    fn early_failed(&mut self, key: &str) {
        if let Some(w) = self.pods.get_mut(key)
            && std::mem::take(&mut w.early)
        {
            let t = self.tenant_of_key(key) as usize;
            if let Some(e) = self.early.get_mut(t) {
                *e = false;
            }
        }
    }

    /// A pod started (`sign` 1) or stopped (-1) counting on a node: its tenant's usage.
    pub fn charge(&mut self, pod: &PodInfo, sign: i64) {
        let ns = pod.pod.metadata.namespace.as_deref().unwrap_or("");
        self.fair.charge(ns, Usage::of(&pod.requests), sign);
    }

    /// The shard's allocatable (what dominant shares are fractions of).
    pub fn set_capacity(&mut self, c: Usage) {
        self.fair.set_capacity(c);
    }

    /// The Tenants now. When namespaces change owner, the active pods move to their new
    /// tenant's queue and the per-tenant counts are redone.
    pub fn set_tenants(&mut self, tenants: &[TenantSpec]) {
        if !self.fair.set_tenants(tenants) {
            return;
        }
        let old = std::mem::take(&mut self.heaps);
        for t in 0..self.fair.len() {
            self.fair.unready(t as u32);
        }
        self.heaps = Vec::new();
        for a in old.into_iter().flat_map(BinaryHeap::into_vec) {
            let still = self
                .pods
                .get(&a.pod.info.key)
                .is_some_and(|w| w.place == Place::Active(a.seq));
            if still {
                let t = self.tenant_of_key(&a.pod.info.key);
                self.push_active(t, a.seq, a.pod);
            }
        }
        let backoff: Vec<((Instant, u64), String)> = self
            .backoff
            .iter()
            .filter(|(_, k)| self.pods.get(*k).is_some_and(|w| w.woken))
            .map(|(at, k)| (*at, k.clone()))
            .collect();
        self.woken.iter_mut().for_each(BTreeMap::clear);
        self.tenant_slots();
        for (at, k) in backoff {
            let t = self.tenant_of_key(&k);
            self.woken[t as usize].insert(at, k);
            self.fair.mark_ready(t);
        }
        self.fair.clear_sizes();
        let places: Vec<(String, Place)> = self
            .pods
            .iter()
            .map(|(k, w)| (k.clone(), w.place.clone()))
            .collect();
        for (k, p) in places {
            let t = self.tenant_of_key(&k);
            let sizes = self.fair.sizes_mut(t);
            match p {
                Place::Active(_) => sizes.active += 1,
                Place::Backoff(_) => sizes.backoff += 1,
                Place::Unschedulable { .. } => sizes.unschedulable += 1,
                Place::InFlight => {}
            }
        }
    }

    /// The name of the tenant owning namespace `ns` ([`NO_TENANT`] if none does).
    pub fn tenant_name(&self, ns: &str) -> &str {
        self.fair.name(self.fair.tenant_of(ns))
    }

    /// Who owns which namespace and each tenant's weighted dominant share, now.
    pub fn fair_view(&self) -> FairView {
        self.fair.view()
    }

    /// Each tenant's weight, usage, share and queued pods.
    pub fn standings(&self) -> Vec<Standing> {
        self.fair.standings()
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

    /// The attempt found no node; park the pod until one of `events` happens. Returns its
    /// gang mates backed off with it.
    #[must_use = "the gang mates backed off are told why"]
    pub fn unschedulable(
        &mut self,
        key: &str,
        events: Vec<ClusterEvent>,
        now: Instant,
    ) -> Vec<Arc<PodInfo>> {
        self.early_failed(key);
        if self.record_failure(key, now).is_none() {
            return Vec::new();
        }
        self.set_place(key, Place::Unschedulable { events, since: now });
        self.back_off_gang(key)
    }

    /// The attempt failed for another reason (an error, a lost binding): back off. Returns
    /// its gang mates backed off with it.
    #[must_use = "the gang mates backed off are told why"]
    pub fn failed(&mut self, key: &str, now: Instant) -> Vec<Arc<PodInfo>> {
        self.early_failed(key);
        if self.record_failure(key, now).is_none() {
            return Vec::new();
        }
        self.park_in_backoff(key, now, false);
        self.back_off_gang(key)
    }

    /// A pod that was handed out and scheduled, but whose binding failed, comes back.
    /// Returns its gang mates backed off with it.
    #[must_use = "the gang mates backed off are told why"]
    pub fn requeue_after_bind_failure(
        &mut self,
        info: Arc<PodInfo>,
        attempts: u32,
        now: Instant,
    ) -> Vec<Arc<PodInfo>> {
        let key = info.key.clone();
        self.take(&key);
        self.enter(info, attempts);
        self.failed(&key, now)
    }

    /// Active if its backoff is over, else backing off. A pod an event `woken` from
    /// unschedulable may then be tried early, in its tenant's turn ([`Self::promote_early`]).
    fn park_in_backoff(&mut self, key: &str, now: Instant, woken: bool) {
        let seq = self.next_seq();
        let Some(w) = self.pods.get_mut(key) else {
            return;
        };
        let Some(until) = w.backoff_until.filter(|t| *t > now) else {
            self.activate(key);
            return;
        };
        w.woken = woken;
        self.set_place(key, Place::Backoff(until));
        self.backoff.insert((until, seq), key.to_owned());
        if woken {
            let t = self.tenant_of_key(key);
            self.tenant_slots();
            self.woken[t as usize].insert((until, seq), key.to_owned());
            self.early[t as usize] = true;
            self.fair.mark_ready(t);
        }
    }

    /// An event (or the five-minute flush) woke a parked pod.
    fn wake(&mut self, key: &str, now: Instant) {
        self.park_in_backoff(key, now, true);
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

    /// A member of PodGroup `gang`.
    fn member(name: &str, priority: i32, gang: &str) -> Arc<PodInfo> {
        Arc::new(PodInfo::new(Arc::new(
            serde_json::from_value(json!({"metadata": {"name": name, "namespace": "ns",
                    "labels": {tessera_client::types::POD_GROUP_LABEL: gang}},
                "spec": {"priority": priority, "containers": [{"name": "c", "image": "x"}]}}))
            .expect("pod"),
        )))
    }

    fn drain(q: &mut SchedulingQueue, now: Instant) -> Vec<String> {
        std::iter::from_fn(|| q.pop(now))
            .map(|p| p.info.name().to_owned())
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn a_gangs_members_are_handed_out_together() {
        // Two gangs' members arrive interleaved, with a lone pod among them: each gang is
        // handed out whole at the place of its first member, so neither gang holds half
        // the room while the other holds the rest.
        let mut q = queue();
        for p in [
            member("a1", 0, "a"),
            member("b1", 0, "b"),
            pod("solo", 0),
            member("a2", 0, "a"),
            member("b2", 0, "b"),
            member("a3", 0, "a"),
            member("b3", 0, "b"),
        ] {
            q.add_or_update(p);
        }
        q.add_or_update(pod("vip", 10));
        assert_eq!(
            drain(&mut q, Instant::now()),
            ["vip", "a1", "a2", "a3", "b1", "b2", "b3", "solo"]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_member_backs_its_whole_gang_off() {
        let mut q = queue();
        for p in [
            member("a1", 0, "a"),
            member("a2", 0, "a"),
            member("a3", 0, "a"),
            pod("solo", 0),
        ] {
            q.add_or_update(p);
        }
        let now = Instant::now();
        let a1 = q.pop(now).expect("a1");
        assert_eq!(a1.info.name(), "a1");
        // a1 fails: a2 and a3, ready, wait out its backoff (1 s) with it; the lone pod does
        // not.
        let mut mates: Vec<String> = q
            .failed(&a1.info.key, now)
            .iter()
            .map(|p| p.name().to_owned())
            .collect();
        mates.sort();
        assert_eq!(mates, ["a2", "a3"], "told why they wait");
        assert_eq!(drain(&mut q, now), ["solo"]);
        assert_eq!(q.sizes().backoff, 3);
        assert!(q.pop(now + Duration::from_millis(999)).is_none());
        let later = now + Duration::from_secs(1);
        let back: Vec<QueuedPod> = std::iter::from_fn(|| q.pop(later)).collect();
        let names: Vec<&str> = back.iter().map(|p| p.info.name()).collect();
        assert_eq!(names, ["a1", "a2", "a3"], "together, in queueing order");
        assert!(back.iter().all(|p| p.attempts == 1), "the gang's attempt");
        // A member parked as unschedulable backs off its ready mates too, and stays parked
        // for its events.
        let mut q = queue();
        q.add_or_update(member("b1", 0, "b"));
        q.add_or_update(member("b2", 0, "b"));
        let b1 = q.pop(now).expect("b1");
        let mates = q.unschedulable(&b1.info.key, vec![ClusterEvent::NodeAdd], now);
        assert_eq!(mates.len(), 1);
        assert!(q.pop(now).is_none());
        assert_eq!((q.sizes().unschedulable, q.sizes().backoff), (1, 1));
        let b2 = q
            .pop(now + Duration::from_secs(1))
            .expect("b2 after the backoff");
        assert_eq!(b2.info.name(), "b2");
        // b1 stays parked for its event while b2 is merely tried; once b2 is placed and
        // waits at Permit for its mate, b1 is tried at once.
        let later = now + Duration::from_secs(1);
        assert!(q.pop(later).is_none(), "b1 waits for its event");
        q.done(&b2.info.key);
        q.activate_gang_of(&b2.info);
        let b1 = q.pop(later).expect("b1 with its waiting mate");
        assert_eq!(b1.info.name(), "b1");
    }

    #[tokio::test(start_paused = true)]
    async fn unschedulable_pods_wait_for_an_event_their_plugins_named() {
        let mut q = queue();
        q.add_or_update(pod("p", 0));
        let now = Instant::now();
        let p = q.pop(now).expect("pod");
        let _ = q.unschedulable(&p.info.key, vec![ClusterEvent::NodeAdd], now);
        assert_eq!(q.sizes().unschedulable, 1);
        assert_eq!(
            q.on_event(ClusterEvent::NodeTaint, now),
            0,
            "not an event that helps"
        );
        assert!(q.pop(now).is_none());
        assert_eq!(q.on_event(ClusterEvent::NodeAdd, now), 1);
        // Nothing else waits, so it is its tenant's turn: tried at once rather than after
        // its backoff (1 s).
        let again = q.pop(now).expect("tried early");
        assert_eq!(again.attempts, 1);
        // A failed early try waits out its backoff, doubled by the second failure.
        let _ = q.failed(&again.info.key, now);
        assert!(q.pop(now + Duration::from_millis(1_999)).is_none());
        assert!(q.pop(now + Duration::from_secs(2)).is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn parked_pods_are_retried_after_five_minutes_without_events() {
        let mut q = queue();
        q.add_or_update(pod("p", 0));
        let now = Instant::now();
        let p = q.pop(now).expect("pod");
        let _ = q.unschedulable(&p.info.key, vec![ClusterEvent::NodeAdd], now);
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

    fn pod_in(ns: &str, name: &str, milli: i64, mem_mi: i64) -> Arc<PodInfo> {
        Arc::new(PodInfo::new(Arc::new(
            serde_json::from_value(json!({"metadata": {"name": name, "namespace": ns},
                "spec": {"containers": [{"name": "c", "image": "x", "resources": {"requests":
                    {"cpu": format!("{milli}m"), "memory": format!("{mem_mi}Mi")}}}]}}))
            .expect("pod"),
        )))
    }

    fn tenant(name: &str, weight: u32, namespaces: &[&str]) -> TenantSpec {
        TenantSpec {
            name: name.into(),
            weight,
            namespaces: namespaces.iter().map(|s| s.to_string()).collect(),
        }
    }

    /// 100 nodes of 4 cpu / 32 Gi / 110 pods.
    const SHARD: Usage = Usage {
        milli_cpu: 400_000,
        memory: 100 * 32 * 1024 * 1024 * 1024,
        pods: 11_000,
    };

    /// A tenant that queued 10,000 pods does not hold up another's one pod: once the flood
    /// has anything running, the other tenant's pod is next.
    #[tokio::test(start_paused = true)]
    async fn a_flood_from_one_tenant_does_not_delay_another() {
        let mut q = queue();
        q.set_capacity(SHARD);
        q.set_tenants(&[tenant("flood", 1, &["f"]), tenant("calm", 1, &["c"])]);
        for i in 0..10_000 {
            q.add_or_update(pod_in("f", &format!("p{i}"), 100, 500));
        }
        let now = Instant::now();
        let first = q.pop(now).expect("a flood pod");
        q.done(&first.info.key);
        q.charge(&first.info, 1);
        q.add_or_update(pod_in("c", "mine", 100, 500));
        assert_eq!(q.pop(now).expect("next").info.key, "c/mine");
        let s = q.standings();
        let flood = s.iter().find(|t| t.name == "flood").expect("flood");
        assert_eq!(flood.sizes.active, 9_999);
        assert!(flood.share > 0.0);
    }

    /// Equal shares are served round robin, and a namespace no Tenant owns queues under
    /// `<none>` like a tenant of weight 1.
    #[tokio::test(start_paused = true)]
    async fn equal_shares_take_turns() {
        let mut q = queue();
        q.set_capacity(SHARD);
        q.set_tenants(&[tenant("a", 1, &["a"]), tenant("b", 1, &["b"])]);
        for i in 0..3 {
            for ns in ["a", "b", "free"] {
                q.add_or_update(pod_in(ns, &format!("p{i}"), 0, 0));
            }
        }
        let now = Instant::now();
        let order: Vec<String> = std::iter::from_fn(|| q.pop(now))
            .map(|p| p.info.key.split('/').next().unwrap_or("").to_owned())
            .collect();
        assert_eq!(order.len(), 9);
        for round in order.chunks(3) {
            let mut r = round.to_vec();
            r.sort();
            assert_eq!(
                r,
                vec!["a", "b", "free"],
                "each serves once a round: {order:?}"
            );
        }
        assert_eq!(q.tenant_name("free"), NO_TENANT);
    }

    /// A namespace given to another tenant takes its waiting pods along.
    #[tokio::test(start_paused = true)]
    async fn pods_follow_their_namespace_to_a_new_tenant() {
        let mut q = queue();
        q.set_capacity(SHARD);
        q.set_tenants(&[tenant("a", 1, &["x", "y"])]);
        q.add_or_update(pod_in("x", "p", 100, 1));
        q.add_or_update(pod_in("y", "p", 100, 1));
        let busy = pod_in("x", "running", 4_000, 1);
        q.charge(&busy, 1);
        q.set_tenants(&[tenant("a", 1, &["x"]), tenant("b", 3, &["y"])]);
        let s = q.standings();
        let b = s.iter().find(|t| t.name == "b").expect("b");
        assert_eq!((b.weight, b.sizes.active), (3, 1));
        assert_eq!(b.usage, Usage::default(), "the running pod stays a's");
        let now = Instant::now();
        assert_eq!(q.pop(now).expect("b first").info.key, "y/p");
        assert_eq!(q.pop(now).expect("then a").info.key, "x/p");
        assert!(q.pop(now).is_none());
    }

    /// Room freed by a completion goes by fair share, not by whose backoff ends first: a
    /// tenant with the lower share gets its woken pod tried ahead of its backoff; once such
    /// an early try fails, that tenant waits out its backoffs until the next event.
    #[tokio::test(start_paused = true)]
    async fn woken_pods_are_tried_in_fair_share_order_not_backoff_order() {
        let mut q = queue();
        q.set_capacity(SHARD);
        q.set_tenants(&[tenant("big", 1, &["big"]), tenant("small", 1, &["small"])]);
        q.charge(&pod_in("big", "running", 100_000, 1), 1);
        let t0 = Instant::now();
        // big's pod is parked first, small's 900 ms later: big's backoff ends first.
        q.add_or_update(pod_in("big", "p", 100, 1));
        let p = q.pop(t0).expect("big");
        let _ = q.unschedulable(&p.info.key, vec![ClusterEvent::AssignedPodDelete], t0);
        let t1 = t0 + Duration::from_millis(900);
        for i in 0..3 {
            q.add_or_update(pod_in("small", &format!("p{i}"), 100, 1));
            let p = q.pop(t1).expect("small");
            let _ = q.unschedulable(&p.info.key, vec![ClusterEvent::AssignedPodDelete], t1);
        }
        // A pod completes at 1 s: big's pod is active again, small's still back off.
        let t2 = t0 + Duration::from_secs(1);
        assert_eq!(q.on_event(ClusterEvent::AssignedPodDelete, t2), 4);
        let first = q.pop(t2).expect("a pod");
        assert_eq!(
            first.info.key.split('/').next(),
            Some("small"),
            "lower share first"
        );
        q.done(&first.info.key);
        q.charge(&first.info, 1);
        // Still the lower share: its next woken pod, early too.
        let second = q.pop(t2).expect("a pod");
        assert_eq!(
            second.info.key.split('/').next(),
            Some("small"),
            "and again"
        );
        // It does not fit: small waits out its backoff now; big goes on.
        let _ = q.unschedulable(&second.info.key, vec![ClusterEvent::AssignedPodDelete], t2);
        assert_eq!(q.pop(t2).expect("big").info.key, "big/p");
        assert!(
            q.pop(t2).is_none(),
            "no second early try without a new event"
        );
        // The next event allows it again.
        q.on_event(ClusterEvent::AssignedPodDelete, t2);
        assert_eq!(
            q.pop(t2).expect("small").info.key.split('/').next(),
            Some("small")
        );
        check_indexes(&q);
    }

    /// A parked pod's own status update (the scheduler's PodScheduled=False) does not wake
    /// it; a change of its spec does, after its backoff, with no early try.
    #[tokio::test(start_paused = true)]
    async fn only_a_change_that_can_matter_wakes_a_parked_pod() {
        let mut q = queue();
        q.add_or_update(pod("p", 0));
        let now = Instant::now();
        let p = q.pop(now).expect("pod");
        let _ = q.unschedulable(&p.info.key, vec![ClusterEvent::NodeAdd], now);
        let mut status_only = (*p.info.pod).clone();
        status_only.status = Some(k8s_openapi::api::core::v1::PodStatus {
            phase: Some("Pending".into()),
            ..Default::default()
        });
        q.add_or_update(Arc::new(PodInfo::new(Arc::new(status_only))));
        assert_eq!(q.sizes().unschedulable, 1, "still parked");
        q.add_or_update(pod("p", 7));
        assert_eq!(
            q.sizes().backoff,
            1,
            "woken by the spec change, backing off"
        );
        assert!(q.pop(now).is_none(), "no early try for its own update");
        assert_eq!(
            q.pop(now + Duration::from_secs(1))
                .expect("after its backoff")
                .info
                .priority,
            7
        );
    }

    /// Within a tenant and a priority, a pod not tried yet goes before a retry.
    #[tokio::test(start_paused = true)]
    async fn a_new_pod_goes_before_a_retry() {
        let mut q = queue();
        q.add_or_update(pod("old", 0));
        let now = Instant::now();
        let old = q.pop(now).expect("old");
        let _ = q.failed(&old.info.key, now);
        q.add_or_update(pod("new", 0));
        let later = now + Duration::from_secs(1);
        assert_eq!(q.pop(later).expect("new").info.key, "ns/new");
        assert_eq!(q.pop(later).expect("retry").info.key, "ns/old");
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
        /// Weighted DRF's pick rule, with the real queue: tenants of any weights and pod
        /// shapes are served until the shard is full or their pods run out; every pod placed
        /// goes to a tenant whose weighted dominant share was the lowest among the tenants
        /// with pods queued that still fit, and every tenant is served until its pods run
        /// out or no longer fit.
        #[test]
        fn each_pod_goes_to_the_lowest_weighted_dominant_share(
            shapes in proptest::collection::vec((1u32..6, 50i64..2_000, 64i64..8_192), 2..7)
        ) {
            let rt = paused_runtime();
            rt.block_on(async {
                let mut q = queue();
                q.set_capacity(SHARD);
                let specs: Vec<TenantSpec> = shapes
                    .iter()
                    .enumerate()
                    .map(|(i, (w, _, _))| tenant(&format!("t{i}"), *w, &[&format!("ns{i}")]))
                    .collect();
                q.set_tenants(&specs);
                for (i, (_, cpu, mem)) in shapes.iter().enumerate() {
                    for j in 0..400 {
                        q.add_or_update(pod_in(&format!("ns{i}"), &format!("p{j}"), *cpu, *mem));
                    }
                }
                let mut free = SHARD;
                let mut blocked = vec![false; shapes.len()];
                let now = Instant::now();
                while let Some(p) = q.pop(now) {
                    let t: usize = p.info.key[2..p.info.key.find('/').expect("ns")]
                        .parse()
                        .expect("index");
                    let u = Usage::of(&p.info.requests);
                    let fits = u.milli_cpu <= free.milli_cpu && u.memory <= free.memory && u.pods <= free.pods;
                    if fits {
                        let st = q.standings();
                        let share: Vec<f64> = st[1..].iter().map(|s| s.share).collect();
                        // The tenants that could have been served instead: pods still
                        // queued and none found not to fit yet.
                        let waiting = |j: &usize| !blocked[*j] && st[1 + *j].sizes.active > 0;
                        for j in (0..shapes.len()).filter(waiting) {
                            assert!(
                                share[t] <= share[j] + 1e-12,
                                "tenant {t} (share {}) served before tenant {j} (share {})",
                                share[t], share[j]
                            );
                        }
                        free.add(u, -1);
                        q.done(&p.info.key);
                        q.charge(&p.info, 1);
                    } else {
                        blocked[t] = true;
                        let _ = q.unschedulable(&p.info.key, vec![ClusterEvent::AssignedPodDelete], now);
                    }
                }
                for (j, st) in q.standings()[1..].iter().enumerate() {
                    assert!(
                        blocked[j] || st.usage.pods == 400,
                        "tenant {j} stopped with pods that fit"
                    );
                }
            });
        }
    }

    /// Identical pods from tenants of weights 1 to 4, each wanting the whole shard: the
    /// shard ends split 1:2:3:4, each within 5% of its weight's part.
    #[tokio::test(start_paused = true)]
    async fn identical_pods_split_a_full_shard_by_weight() {
        let mut q = queue();
        q.set_capacity(SHARD);
        let specs: Vec<TenantSpec> = (1..=4)
            .map(|w| tenant(&format!("w{w}"), w, &[&format!("ns{w}")]))
            .collect();
        q.set_tenants(&specs);
        for w in 1..=4 {
            for j in 0..4_000 {
                q.add_or_update(pod_in(&format!("ns{w}"), &format!("p{j}"), 100, 500));
            }
        }
        // 400 cpu / 0.1 = 4,000 pods fit.
        let mut placed = 0;
        let now = Instant::now();
        while placed < 4_000 {
            let p = q.pop(now).expect("pods wait");
            q.done(&p.info.key);
            q.charge(&p.info, 1);
            placed += 1;
        }
        for s in &q.standings()[1..] {
            let w = f64::from(s.weight);
            let want = 4_000.0 * w / 10.0;
            let got = s.usage.pods as f64;
            assert!(
                (got - want).abs() <= 0.05 * want,
                "{} placed {got}, its weight's part is {want}",
                s.name
            );
        }
    }
    /// A runtime with tokio's clock paused, for property tests that move time.
    fn paused_runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .expect("runtime")
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
        // Each gang lists exactly its queued members, and they share its place.
        let mut gangs: HashMap<String, HashSet<String>> = HashMap::new();
        for (k, w) in &q.pods {
            assert_eq!(
                w.gang,
                crate::plugins::gang::gang_of(&w.pod.info.pod),
                "{k}"
            );
            if let Some(g) = &w.gang {
                gangs.entry(g.clone()).or_default().insert(k.clone());
                assert_eq!(w.pod.order, q.gangs[g].order, "{k}");
            } else {
                assert_eq!(w.pod.order, w.pod.enqueued, "{k}");
            }
        }
        let kept: HashMap<String, HashSet<String>> = q
            .gangs
            .iter()
            .map(|(g, e)| (g.clone(), e.members.clone()))
            .collect();
        assert_eq!(kept, gangs);
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
            let rt = paused_runtime();
            rt.block_on(async {
                let mut q = queue();
                let mut now = Instant::now();
                for (op, p, e, secs) in ops {
                    let key = format!("ns/p{p}");
                    match op {
                        0 => q.add_or_update(pod(&format!("p{p}"), p as i32)),
                        // Into gang g{e}, or relabelled there from another or none.
                        1 => q.add_or_update(member(&format!("p{p}"), p as i32, &format!("g{e}"))),
                        2 => {
                            let _ = q.pop(now);
                        }
                        3 => {
                            let _ = q.unschedulable(&key, vec![EVENTS[e], EVENTS[(e + 1) % 3]], now);
                        }
                        4 => {
                            let _ = q.failed(&key, now);
                        }
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
