//! The shards the federation knows, in memory: each one's session and lease, its last
//! capacity summary (with the federation's own reservations laid over it until the shard
//! reports them), the assignments it holds and the status of what it runs. Placement reads
//! one [`Snapshot`] of all of it, kept up to date in place rather than rebuilt per decision.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tessera_placement::{Decision, Policy, ShardMap, ShardWeight, Snapshot, Workload};
use tessera_placement::{Request, Summary};
use tessera_proto::federation::v1 as pb;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::metrics::FederationMetrics;

/// How the registry times leases and summaries.
#[derive(Clone, Debug)]
pub struct RegistryConfig {
    /// How long a shard's lease runs from each renewal.
    pub lease: Duration,
    /// How often agents renew (a third of the lease by default).
    pub renew: Duration,
    /// A summary older than this is discounted: its shard gets no new work.
    pub summary_stale: Duration,
    /// The token shards' agents present to join.
    pub join_token: String,
    /// What an `AtMostOnce` workload waits on top of its lost shard's lease and its pods'
    /// grace period before it is started elsewhere: clock drift between the shard and the
    /// federation, and the agent's time to notice and stop it.
    pub failover_margin: Duration,
    /// How nodes are lent between shards.
    pub lending: crate::lending::LendingConfig,
}

impl RegistryConfig {
    /// A 15 s lease renewed every 5 s; summaries stale after 60 s.
    pub fn new(join_token: impl Into<String>) -> Self {
        RegistryConfig {
            lease: Duration::from_secs(15),
            renew: Duration::from_secs(5),
            summary_stale: Duration::from_secs(60),
            join_token: join_token.into(),
            failover_margin: Duration::from_secs(5),
            lending: crate::lending::LendingConfig::default(),
        }
    }
}

/// Names a federated object: group, version, resource (plural), namespace and name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectKey {
    /// API group.
    pub group: String,
    /// Version.
    pub version: String,
    /// Plural resource name.
    pub resource: String,
    /// Namespace ("" for cluster-scoped).
    pub namespace: String,
    /// Name.
    pub name: String,
}

impl ObjectKey {
    /// The key of the wire form.
    pub fn from_pb(k: &pb::ObjectKey) -> ObjectKey {
        ObjectKey {
            group: k.group.clone(),
            version: k.version.clone(),
            resource: k.resource.clone(),
            namespace: k.namespace.clone(),
            name: k.name.clone(),
        }
    }

    /// The wire form.
    pub fn to_pb(&self) -> pb::ObjectKey {
        pb::ObjectKey {
            group: self.group.clone(),
            version: self.version.clone(),
            resource: self.resource.clone(),
            namespace: self.namespace.clone(),
            name: self.name.clone(),
        }
    }

    /// `namespace/name` (or `name`), as controllers' work queues key objects.
    pub fn object_key(&self) -> String {
        if self.namespace.is_empty() {
            self.name.clone()
        } else {
            format!("{}/{}", self.namespace, self.name)
        }
    }
}

impl std::fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}/{}", self.resource, self.group, self.object_key())
    }
}

/// One object a shard should hold, as the federation last decided it.
#[derive(Clone, Debug, PartialEq)]
pub struct Held {
    /// The object to apply (JSON), scaled to the shard's share.
    pub object: Arc<[u8]>,
    /// The federation object's generation it was made from.
    pub generation: i64,
    /// The shard's share of the replicas.
    pub replicas: i64,
    /// What each replica asks for (empty for objects without replicas): new replicas reserve
    /// it on the shard until the shard's summary counts them.
    pub request: Request,
    /// Objects to apply first (namespace, ...).
    pub dependencies: Vec<Arc<[u8]>>,
    /// How it fails over (workloads only): the agent stops an `AtMostOnce` one itself when
    /// its lease lapses.
    pub failover: Option<tessera_placement::FailoverMode>,
    /// Kept only until the workload's move off this shard finishes (shown on the Shard).
    pub leaving: bool,
}

/// What a shard reports of one federated object it runs.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Reported {
    /// It exists in the shard.
    pub present: bool,
    /// The federation generation its copy was applied from.
    pub federation_generation: i64,
    /// The shard's controller has observed the copy's latest spec.
    pub observed: bool,
    /// Its status.
    pub status: serde_json::Value,
    /// Its `spec.replicas`.
    pub replicas: i64,
    /// A gang part's standing: (members reserved, the attempt they are reserved for,
    /// members bound).
    pub gang: Option<(i64, i64, i64)>,
}

/// Something that happened in the registry, for the controllers that act on it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RegistryEvent {
    /// A shard (re)connected: it is to hold everything held everywhere.
    Joined(String),
    /// A shard left, became (not) ready, or reported new capacity.
    Shard(String),
    /// An admin changed a shard's spec (cordon, taints, weight).
    Spec(String),
    /// A shard reported the status of a federated object.
    Status(ObjectKey),
}

struct Session {
    id: u64,
    tx: mpsc::UnboundedSender<pb::FederationMessage>,
}

/// Room taken for a decision since the shard's summary: the seq of the assignment it rides
/// on, the per-replica request, and the replicas.
type Reservation = (u64, Request, u64);

/// A function called on every registry event.
type Listener = Box<dyn Fn(&RegistryEvent) + Send + Sync>;

/// The window a shard's placement rate is counted over.
const PLACED_WINDOW: Duration = Duration::from_secs(60);

/// Records a shard's placement counter `total` at `now` (a counter lower than the last
/// one, from an agent that started again, begins the window anew) and drops the samples
/// the window no longer needs: one at or before its start is kept, so it is whole.
fn record_bound(
    samples: &mut std::collections::VecDeque<(Instant, u64)>,
    now: Instant,
    total: u64,
) {
    if samples.back().is_some_and(|(_, t)| *t > total) {
        samples.clear();
    }
    samples.push_back((now, total));
    while samples.len() > 1 && samples[1].0 + PLACED_WINDOW <= now {
        samples.pop_front();
    }
}

/// Pods placed between the window's first sample and its last.
fn placed_in_window(samples: &std::collections::VecDeque<(Instant, u64)>) -> u64 {
    match (samples.front(), samples.back()) {
        (Some(first), Some(last)) => last.1.saturating_sub(first.1),
        _ => 0,
    }
}

/// Everything but the placement view of one shard.
struct Entry {
    labels: BTreeMap<String, String>,
    api_url: String,
    session: Option<Session>,
    lease_until: Option<Instant>,
    /// The summary as the shard sent it, and when.
    reported: Option<(Summary, Instant)>,
    pods: (u64, u64),
    /// Its placement counter as its summaries reported it, over the last minute or so.
    bound: std::collections::VecDeque<(Instant, u64)>,
    seq: u64,
    /// Reservations made since the shard's summary: (the seq they ride on, request, count).
    reservations: Vec<Reservation>,
    held: BTreeMap<ObjectKey, Held>,
    statuses: BTreeMap<ObjectKey, Reported>,
    /// When each (object, generation) was sent, for the propagation latency.
    sent: HashMap<(ObjectKey, i64), Instant>,
    spec_weight: Option<u64>,
    /// Its API's CA and its loan key (empty: it takes no part in lending).
    api_ca: String,
    loan_key: String,
    /// Its last lending report, and the resources its summary counts.
    lending: Option<pb::Lending>,
    resources: Vec<String>,
}

impl Entry {
    /// Connected and holding its lease at `now`: ready, in placement's terms.
    fn holds_lease(&self, now: Instant) -> bool {
        self.session.is_some() && self.lease_until.is_some_and(|t| t > now)
    }

    fn new() -> Entry {
        Entry {
            labels: BTreeMap::new(),
            api_url: String::new(),
            session: None,
            lease_until: None,
            reported: None,
            pods: (0, 0),
            bound: std::collections::VecDeque::new(),
            seq: 0,
            reservations: Vec::new(),
            held: BTreeMap::new(),
            statuses: BTreeMap::new(),
            sent: HashMap::new(),
            spec_weight: None,
            api_ca: String::new(),
            loan_key: String::new(),
            lending: None,
            resources: Vec::new(),
        }
    }
}

/// A shard as the Shard object's status shows it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ShardView {
    /// The shard's name.
    pub name: String,
    /// Lease held.
    pub ready: bool,
    /// Its labels as registered.
    pub labels: BTreeMap<String, String>,
    /// Its API.
    pub api_url: String,
    /// The session holding the lease.
    pub session: Option<u64>,
    /// Its last summary as reported (without reservations).
    pub summary: Option<Summary>,
    /// Seconds since that summary.
    pub summary_age: Option<Duration>,
    /// Pods running and pending.
    pub pods: (u64, u64),
    /// Pods its scheduler placed in about the last minute.
    pub placed_last_minute: u64,
    /// Its virtual nodes on the map.
    pub weight: u64,
    /// Seconds of lease left.
    pub lease_left: Option<Duration>,
    /// Federated workloads it holds that still run (Tenants, which every shard holds, and
    /// finished Jobs, which are not moved, not counted).
    pub held: u64,
    /// Of those, the ones held only until their move off it finishes.
    pub leaving: u64,
    /// Its nodes lent out now.
    pub lent: u64,
    /// Other shards' nodes it borrows.
    pub borrowed: u64,
    /// Pending pods no node of it has room for.
    pub unmet_pods: u64,
}

struct Inner {
    entries: BTreeMap<String, Entry>,
    /// Tenants the federation has placed workloads of (for `tenants_moved` on map changes).
    tenants: std::collections::HashSet<String>,
    snapshot: Snapshot,
    next_session: u64,
    synced: bool,
    /// The version of the map stored before this process started: maps built here are
    /// numbered after it, so versions only grow across restarts.
    map_floor: u64,
}

/// Why a registration is refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RegisterError {
    /// The token is not the federation's.
    #[error(
        "the join token is not this federation's: ask its admin for the token in its data directory (pki/join.token)"
    )]
    BadToken,
    /// The name is not a DNS label.
    #[error("shard name {name:?} is invalid: {why}")]
    BadName {
        /// The name.
        name: String,
        /// Why.
        why: String,
    },
    /// A label is invalid.
    #[error("label {key:?}: {why}")]
    BadLabel {
        /// The label key.
        key: String,
        /// Why.
        why: String,
    },
    /// Another agent holds this name's lease.
    #[error(
        "shard {0:?} is already connected (its lease is held by another agent): give each shard its own name, or stop the other agent and wait for its lease to lapse"
    )]
    Duplicate(String),
}

/// How a shard stands, for failing work over from it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Standing {
    /// Connected and holding its lease.
    Ready,
    /// Not ready: disconnected, or its lease lapsed. `since_lease_end` is how long ago its
    /// lease ended (`None`: not yet — the agent still holds it and runs everything).
    Lost {
        /// Time since the lease ended.
        since_lease_end: Option<Duration>,
        /// Time until it ends (zero once it has).
        until_lease_end: Duration,
    },
}

/// The registry of shards.
pub struct Registry {
    config: RegistryConfig,
    /// When this registry began: a shard that has not registered since held its lease, at
    /// most, until one lease after this (its renewals went to the federation that ran then).
    started: Instant,
    inner: Mutex<Inner>,
    listeners: Mutex<Vec<Listener>>,
    metrics: Option<FederationMetrics>,
    pub(crate) calls: Mutex<crate::reads::Calls>,
    planner: Mutex<crate::lending::Planner>,
    /// Replicas the federation could not place for want of room, by workload: the shard
    /// they would go to first, and what they ask for (demand the shard may borrow for).
    waiting: Mutex<BTreeMap<String, crate::lending::Waiting>>,
    /// Each Shard's `spec.lending`, by name.
    lending_policies: Mutex<HashMap<String, crate::lending::LendingPolicy>>,
    /// Where shards' messages about frameworks of the fleet go (the offers endpoint).
    offers_relay: Mutex<Option<OffersRelay>>,
}

/// Takes a shard's message about frameworks of the fleet (`OffersUp`, `OffersLedger`).
pub(crate) type OffersRelay = Arc<dyn Fn(&str, pb::shard_message::Message) + Send + Sync>;

/// The virtual nodes a shard of `cpu_milli` allocatable cpu gets: a quarter of the standard
/// weight per 64 cores (at least one quarter), so a shard's weight moves only when its
/// capacity changes by tens of cores, not with every node.
pub fn weight_for_capacity(cpu_milli: u64) -> u64 {
    let quarters = (cpu_milli / 64_000).max(1);
    (quarters * tessera_placement::map::VNODES / 4).min(tessera_placement::map::MAX_VNODES)
}

/// A constant-time comparison of two tokens (a wrong guess learns nothing from the time).
fn same_token(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl Registry {
    /// An empty registry.
    pub fn new(config: RegistryConfig, metrics: Option<FederationMetrics>) -> Arc<Registry> {
        let map = ShardMap::new(0, &[]).expect("an empty map is valid");
        Arc::new(Registry {
            config,
            started: Instant::now(),
            inner: Mutex::new(Inner {
                entries: BTreeMap::new(),
                tenants: Default::default(),
                snapshot: Snapshot {
                    map,
                    shards: BTreeMap::new(),
                },
                next_session: 1,
                synced: false,
                map_floor: 0,
            }),
            listeners: Mutex::new(Vec::new()),
            offers_relay: Mutex::new(None),
            metrics,
            calls: Mutex::new(crate::reads::Calls::default()),
            planner: Mutex::new(crate::lending::Planner::default()),
            waiting: Mutex::new(BTreeMap::new()),
            lending_policies: Mutex::new(HashMap::new()),
        })
    }

    /// Its timings.
    pub fn config(&self) -> &RegistryConfig {
        &self.config
    }

    /// Its metrics.
    pub fn metrics(&self) -> Option<&FederationMetrics> {
        self.metrics.as_ref()
    }

    /// Calls `f` on every event (from the task that caused it: `f` must be quick).
    pub fn on_event(&self, f: impl Fn(&RegistryEvent) + Send + Sync + 'static) {
        self.listeners.lock().push(Box::new(f));
    }

    fn emit(&self, e: RegistryEvent) {
        for f in self.listeners.lock().iter() {
            f(&e);
        }
    }

    /// Registers shard `name`'s agent: a new session that holds the shard's lease, and the
    /// channel its assignments go out on. Refused if the token is wrong, the name or a label
    /// invalid, or another agent holds the name's lease.
    pub fn register(
        &self,
        reg: &pb::Register,
    ) -> Result<(u64, mpsc::UnboundedReceiver<pb::FederationMessage>), RegisterError> {
        if !same_token(&reg.token, &self.config.join_token) {
            return Err(RegisterError::BadToken);
        }
        if let Some(why) = tessera_core::names::dns1123_label(&reg.name) {
            return Err(RegisterError::BadName {
                name: reg.name.clone(),
                why,
            });
        }
        for (k, v) in &reg.labels {
            if let Some(why) = tessera_core::names::qualified_name(k)
                .or_else(|| tessera_core::names::label_value(v))
            {
                return Err(RegisterError::BadLabel {
                    key: k.clone(),
                    why,
                });
            }
        }
        let now = Instant::now();
        let (tx, rx) = mpsc::unbounded_channel();
        let id = {
            let mut inner = self.inner.lock();
            let id = inner.next_session;
            let entry = inner
                .entries
                .entry(reg.name.clone())
                .or_insert_with(Entry::new);
            let held_by_other = entry.session.as_ref().is_some_and(|s| !s.tx.is_closed())
                && entry.lease_until.is_some_and(|t| t > now);
            if held_by_other {
                return Err(RegisterError::Duplicate(reg.name.clone()));
            }
            entry.labels = reg.labels.clone().into_iter().collect();
            entry.api_url = reg.api_url.clone();
            entry.api_ca = reg.api_ca.clone();
            entry.loan_key = reg.loan_key.clone();
            entry.session = Some(Session { id, tx: tx.clone() });
            entry.lease_until = Some(now + self.config.lease);
            // The agent re-applies from scratch: every held object goes out again.
            let _ = tx.send(pb::FederationMessage {
                message: Some(pb::federation_message::Message::Registered(
                    pb::Registered {
                        lease_seconds: self.config.lease.as_secs() as u32,
                        renew_seconds: self.config.renew.as_secs().max(1) as u32,
                    },
                )),
            });
            let synced = inner.synced;
            let entry = inner.entries.get_mut(&reg.name).expect("inserted above");
            let held: Vec<(ObjectKey, Held)> = entry
                .held
                .iter()
                .map(|(k, h)| (k.clone(), h.clone()))
                .collect();
            for (k, h) in held {
                entry.seq += 1;
                let msg = apply_message(entry.seq, &k, &h);
                entry.sent.insert((k.clone(), h.generation), now);
                let _ = tx.send(msg);
            }
            if synced {
                entry.seq += 1;
                let _ = tx.send(synced_message(entry.seq));
            }
            inner.next_session += 1;
            inner
                .snapshot
                .shards
                .entry(reg.name.clone())
                .or_default()
                .labels = reg.labels.clone().into_iter().collect();
            self.refresh(&mut inner, &reg.name, now);
            self.rebuild_map(&mut inner);
            id
        };
        tracing::info!(shard = %reg.name, session = id, "shard registered");
        self.count_states();
        self.emit(RegistryEvent::Joined(reg.name.clone()));
        Ok((id, rx))
    }

    /// Renews `name`'s lease if `session` still holds it, and tells the agent (`Renewed`,
    /// with the renewal's `seq`): the agent's own lease clock runs from that renewal.
    pub fn renew(&self, name: &str, session: u64, seq: u64) -> bool {
        let now = Instant::now();
        let became_ready = {
            let mut inner = self.inner.lock();
            let Some(e) = inner.entries.get_mut(name) else {
                return false;
            };
            let Some(s) = e.session.as_ref().filter(|s| s.id == session) else {
                return false;
            };
            let was = e.lease_until.is_some_and(|t| t > now);
            if !was && e.lease_until.is_some() {
                // A lease that lapsed is not renewed: the agent has stopped its at-most-once
                // work, and the federation may be moving it. The agent registers again.
                return false;
            }
            e.lease_until = Some(now + self.config.lease);
            let _ = s.tx.send(pb::FederationMessage {
                message: Some(pb::federation_message::Message::Renewed(pb::Renewed {
                    seq,
                })),
            });
            if !was {
                self.refresh(&mut inner, name, now);
            }
            !was
        };
        if became_ready {
            self.count_states();
            self.emit(RegistryEvent::Shard(name.to_owned()));
        }
        true
    }

    /// Ends `session` of `name` (its stream closed): the shard takes no new work until its
    /// agent connects again. Its lease runs out on its own.
    pub fn disconnect(&self, name: &str, session: u64) {
        let now = Instant::now();
        {
            let mut inner = self.inner.lock();
            let Some(e) = inner.entries.get_mut(name) else {
                return;
            };
            if e.session.as_ref().map(|s| s.id) != Some(session) {
                return;
            }
            e.session = None;
            self.refresh(&mut inner, name, now);
        }
        self.calls.lock().drop_session(name, session);
        tracing::warn!(shard = %name, session, "shard disconnected");
        self.count_states();
        self.emit(RegistryEvent::Shard(name.to_owned()));
    }

    /// Takes a capacity summary from `session` of `name`, or says why it is refused (the
    /// session is then ended by the caller).
    pub fn summary(&self, name: &str, session: u64, s: &pb::CapacitySummary) -> Result<(), String> {
        let summary = summary_of(s);
        summary.validate()?;
        let now = Instant::now();
        {
            let mut inner = self.inner.lock();
            let Some(e) = inner.entries.get_mut(name) else {
                return Err("not registered".into());
            };
            if e.session.as_ref().map(|x| x.id) != Some(session) {
                return Ok(());
            }
            if let Some((old, _)) = &e.reported
                && old.version >= summary.version
                && old.version != 0
            {
                // Repeated or out of order: the newer one stands.
                return Ok(());
            }
            e.reservations
                .retain(|(seq, _, _)| *seq > s.assignments_seen);
            e.resources = summary.resources.clone();
            e.reported = Some((summary, now));
            e.pods = (s.pods_running, s.pods_pending);
            record_bound(&mut e.bound, now, s.pods_bound);
            e.lending = s.lending.clone();
            self.refresh(&mut inner, name, now);
            self.rebuild_map(&mut inner);
        }
        self.emit(RegistryEvent::Shard(name.to_owned()));
        Ok(())
    }

    /// Takes a federated object's status from `name`.
    pub fn status(&self, name: &str, session: u64, st: &pb::ObjectStatus) -> Result<(), String> {
        let Some(k) = st.key.as_ref() else {
            return Err("an object status without a key".into());
        };
        let key = ObjectKey::from_pb(k);
        let status: serde_json::Value = if st.status_json.is_empty() {
            serde_json::Value::Null
        } else {
            serde_json::from_slice(&st.status_json)
                .map_err(|e| format!("the status of {key} is not JSON: {e}"))?
        };
        {
            let mut inner = self.inner.lock();
            let Some(e) = inner.entries.get_mut(name) else {
                return Err("not registered".into());
            };
            if e.session.as_ref().map(|x| x.id) != Some(session) {
                return Ok(());
            }
            // A shard reports only what it was given: a report of anything else is not
            // stored (it could neither swell the federation's memory nor hold up a deletion).
            if st.present && !e.held.contains_key(&key) && !e.statuses.contains_key(&key) {
                tracing::debug!(shard = %name, object = %key, "a status of an object not assigned here");
                return Ok(());
            }
            if st.present
                && let Some(at) = e.sent.remove(&(key.clone(), st.federation_generation))
                && let Some(m) = &self.metrics
            {
                m.propagation.observe(at.elapsed().as_secs_f64());
            }
            let r = Reported {
                present: st.present,
                federation_generation: st.federation_generation,
                observed: st.observed,
                status,
                replicas: st.replicas,
                gang: st.gang.map(|g| (g.reserved, g.reserved_for, g.scheduled)),
            };
            if st.present {
                e.statuses.insert(key.clone(), r);
            } else {
                e.statuses.remove(&key);
            }
        }
        self.emit(RegistryEvent::Status(key));
        Ok(())
    }

    /// Marks that every federated object has been assigned once since the federation
    /// started: from now on agents are told `Synced` and may remove leftovers.
    pub fn mark_synced(&self) {
        let mut inner = self.inner.lock();
        if inner.synced {
            return;
        }
        inner.synced = true;
        for e in inner.entries.values_mut() {
            if let Some(s) = &e.session {
                e.seq += 1;
                let _ = s.tx.send(synced_message(e.seq));
            }
        }
    }

    /// Makes `shard` hold `key` as `held`; sends it if it changed and the shard is connected.
    /// Returns whether it changed.
    pub fn assign(&self, shard: &str, key: &ObjectKey, held: Held) -> bool {
        let mut inner = self.inner.lock();
        let e = inner
            .entries
            .entry(shard.to_owned())
            .or_insert_with(Entry::new);
        let old = e.held.get(key);
        if old == Some(&held) {
            return false;
        }
        e.seq += 1;
        // The replicas this assignment adds take room until a summary has seen it: only an
        // assignment that is sent reserves, so a decision repeated on a stale view (one that
        // changes nothing here) reserves nothing twice.
        let before = old
            .filter(|o| o.request == held.request)
            .map_or(0, |o| o.replicas);
        let extra = held.replicas.saturating_sub(before);
        if extra > 0 && !held.request.amounts.is_empty() {
            e.reservations
                .push((e.seq, held.request.clone(), extra as u64));
        }
        if let Some(s) = &e.session {
            let _ = s.tx.send(apply_message(e.seq, key, &held));
            e.sent
                .insert((key.clone(), held.generation), Instant::now());
            if let Some(m) = &self.metrics {
                m.assignments.with_label_values(&["apply"]).inc();
            }
        }
        e.held.insert(key.clone(), held);
        true
    }

    /// Makes `shard` drop `key`.
    pub fn unassign(&self, shard: &str, key: &ObjectKey) {
        let mut inner = self.inner.lock();
        self.unassign_in(&mut inner, shard, key);
    }

    fn unassign_in(&self, inner: &mut Inner, shard: &str, key: &ObjectKey) {
        let Some(e) = inner.entries.get_mut(shard) else {
            return;
        };
        let had = e.held.remove(key).is_some();
        let reported = e.statuses.contains_key(key);
        if !had && !reported {
            return;
        }
        e.seq += 1;
        if let Some(s) = &e.session {
            let _ = s.tx.send(pb::FederationMessage {
                message: Some(pb::federation_message::Message::Assignment(
                    pb::Assignment {
                        seq: e.seq,
                        op: pb::assignment::Op::Delete as i32,
                        key: Some(key.to_pb()),
                        ..Default::default()
                    },
                )),
            });
            if let Some(m) = &self.metrics {
                m.assignments.with_label_values(&["delete"]).inc();
            }
        }
    }

    /// How shard `name` stands for failover (see [`Standing`]). A shard not registered since
    /// this registry began counts as lost with a lease that ends one lease after the start.
    pub fn standing(&self, name: &str) -> Standing {
        let now = Instant::now();
        let inner = self.inner.lock();
        let lease_end = match inner.entries.get(name) {
            Some(e) => {
                if e.holds_lease(now) {
                    return Standing::Ready;
                }
                e.lease_until.unwrap_or(self.started + self.config.lease)
            }
            None => self.started + self.config.lease,
        };
        Standing::Lost {
            since_lease_end: now.checked_duration_since(lease_end),
            until_lease_end: lease_end.saturating_duration_since(now),
        }
    }

    /// Takes `key` from lost shard `shard` so that it can be placed elsewhere: only if the
    /// shard is still not ready (checked under the same lock a registration takes, so a
    /// shard that comes back meanwhile is sent it again instead, and nothing is moved). A
    /// shard that registers after this is not sent it: its agent removes its copy as a
    /// leftover, never resuming it.
    pub fn release_lost(&self, shard: &str, key: &ObjectKey) -> bool {
        let now = Instant::now();
        let mut inner = self.inner.lock();
        if inner.entries.get(shard).is_some_and(|e| e.holds_lease(now)) {
            return false;
        }
        self.unassign_in(&mut inner, shard, key);
        true
    }

    /// The objects held on `shard` (for re-deciding them when it is lost).
    pub fn held_on(&self, shard: &str) -> Vec<ObjectKey> {
        self.inner
            .lock()
            .entries
            .get(shard)
            .map(|e| e.held.keys().cloned().collect())
            .unwrap_or_default()
    }

    /// Where `key` is held, and what each of those shards (and any other that still runs a
    /// copy) reports of it.
    pub fn reports(&self, key: &ObjectKey) -> BTreeMap<String, Option<Reported>> {
        let inner = self.inner.lock();
        let mut out = BTreeMap::new();
        for (name, e) in &inner.entries {
            let status = e.statuses.get(key).cloned();
            if e.held.contains_key(key) || status.is_some() {
                out.insert(name.clone(), status);
            }
        }
        out
    }

    /// What placing `w` under `policy` on the current snapshot would decide, committing
    /// nothing (to learn how many copies a Duplicated placement makes before its quota is
    /// checked).
    pub fn preview(&self, w: &Workload<'_>, policy: &Policy) -> Decision {
        self.inner.lock().snapshot.place(w, policy)
    }

    /// Places `w` under `policy` on the current snapshot, commits the decision into it and
    /// reserves the new replicas on each chosen shard; returns it with the number of shards
    /// considered.
    pub fn place(&self, w: &Workload<'_>, policy: &Policy) -> (Decision, usize) {
        let mut inner = self.inner.lock();
        if !inner.tenants.contains(w.tenant) {
            inner.tenants.insert(w.tenant.to_owned());
        }
        let d = inner.snapshot.place(w, policy);
        // Taken out of the snapshot now, for the next decision; [`Registry::assign`] keeps the
        // room reserved across summaries until one has seen the assignment.
        inner.snapshot.commit(w, &d);
        let total = inner.snapshot.shards.len();
        (d, total)
    }

    /// Places `w` all together or not at all (a gang divided over shards): as
    /// [`Registry::place`] when every replica fits, otherwise nothing is committed and the
    /// decision holds no share.
    pub fn place_whole(&self, w: &Workload<'_>, policy: &Policy) -> (Decision, usize) {
        let mut inner = self.inner.lock();
        if !inner.tenants.contains(w.tenant) {
            inner.tenants.insert(w.tenant.to_owned());
        }
        let mut d = inner.snapshot.place(w, policy);
        if d.unplaced == 0 {
            inner.snapshot.commit(w, &d);
        } else {
            d.shares.clear();
            d.unplaced = w.replicas;
        }
        (d, inner.snapshot.shards.len())
    }

    /// What each shard holds of `key` with replicas asking `request`: the credit a new
    /// decision for it starts from (its replicas there are counted in the shard's summary
    /// or reserved already). `None` when no shard holds it (after a restart, before the
    /// first decision re-assigns it).
    pub fn credit(&self, key: &ObjectKey, request: &Request) -> Option<BTreeMap<String, u64>> {
        let inner = self.inner.lock();
        let mut any = false;
        let mut out = BTreeMap::new();
        for (name, e) in &inner.entries {
            let Some(h) = e.held.get(key) else {
                continue;
            };
            any = true;
            if &h.request == request && h.replicas > 0 {
                out.insert(name.clone(), h.replicas as u64);
            }
        }
        any.then_some(out)
    }

    /// The shards in `tenant`'s order of preference.
    pub fn preference(&self, tenant: &str) -> Vec<String> {
        let inner = self.inner.lock();
        inner
            .snapshot
            .map
            .preference(tenant)
            .into_iter()
            .map(str::to_owned)
            .collect()
    }

    /// The session of shard `name`'s agent and the channel to it, while it is connected.
    pub(crate) fn session_sender(
        &self,
        name: &str,
    ) -> Option<(u64, mpsc::UnboundedSender<pb::FederationMessage>)> {
        let inner = self.inner.lock();
        let s = inner.entries.get(name)?.session.as_ref()?;
        (!s.tx.is_closed()).then(|| (s.id, s.tx.clone()))
    }

    /// Sends `m` to shard `name`'s agent; false if it is not connected.
    pub(crate) fn send_to(&self, name: &str, m: pb::federation_message::Message) -> bool {
        self.session_sender(name)
            .is_some_and(|(_, tx)| tx.send(pb::FederationMessage { message: Some(m) }).is_ok())
    }

    /// Whether shard `name`'s agent is connected now.
    pub fn is_connected(&self, name: &str) -> bool {
        self.session_sender(name).is_some()
    }

    /// Where shards' messages about frameworks of the fleet go from now on.
    pub(crate) fn set_offers_relay(&self, relay: OffersRelay) {
        *self.offers_relay.lock() = Some(relay);
    }

    /// A message about frameworks of the fleet from `session` of shard `name`: handed to
    /// the offers endpoint if the session still holds the shard (and there is one).
    pub(crate) fn offers_message(&self, name: &str, session: u64, m: pb::shard_message::Message) {
        if self.session_sender(name).map(|(id, _)| id) != Some(session) {
            return;
        }
        let relay = self.offers_relay.lock().clone();
        if let Some(relay) = relay {
            relay(name, m);
        }
    }

    /// The shards whose agents are connected now, in name order.
    pub fn connected_shards(&self) -> Vec<String> {
        let inner = self.inner.lock();
        inner
            .entries
            .iter()
            .filter(|(_, e)| e.session.as_ref().is_some_and(|s| !s.tx.is_closed()))
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// The names of the shards known.
    pub fn shard_names(&self) -> Vec<String> {
        self.inner.lock().entries.keys().cloned().collect()
    }

    /// Whether `name` can take work now: ready, with a current summary.
    pub fn is_usable(&self, name: &str) -> bool {
        self.inner
            .lock()
            .snapshot
            .shards
            .get(name)
            .is_some_and(|s| s.ready && !s.stale && s.summary.is_some())
    }

    /// Whether `name` is known and ready.
    pub fn is_ready(&self, name: &str) -> bool {
        self.inner
            .lock()
            .snapshot
            .shards
            .get(name)
            .is_some_and(|s| s.ready)
    }

    /// Every shard as its Shard object shows it.
    pub fn views(&self) -> Vec<ShardView> {
        let inner = self.inner.lock();
        let now = Instant::now();
        inner
            .entries
            .iter()
            .map(|(name, e)| ShardView {
                name: name.clone(),
                ready: inner.snapshot.shards.get(name).is_some_and(|s| s.ready),
                labels: e.labels.clone(),
                api_url: e.api_url.clone(),
                session: e.session.as_ref().map(|s| s.id),
                summary: e.reported.as_ref().map(|(s, _)| s.clone()),
                summary_age: e
                    .reported
                    .as_ref()
                    .map(|(_, at)| now.saturating_duration_since(*at)),
                pods: e.pods,
                placed_last_minute: placed_in_window(&e.bound),
                weight: inner
                    .snapshot
                    .map
                    .shards()
                    .iter()
                    .find(|w| &w.name == name)
                    .map_or(0, |w| w.weight),
                lease_left: e.lease_until.map(|t| t.saturating_duration_since(now)),
                held: e
                    .held
                    .keys()
                    .filter(|k| k.resource != "tenants" && !finished(k, e.statuses.get(*k)))
                    .count() as u64,
                leaving: e.held.values().filter(|h| h.leaving).count() as u64,
                lent: e.lending.as_ref().map_or(0, |l| l.lent.len() as u64),
                borrowed: e
                    .lending
                    .as_ref()
                    .map_or(0, |l| l.borrowed.iter().filter(|b| b.ready).count() as u64),
                unmet_pods: e.lending.as_ref().map_or(0, |l| l.own_unmet_pods),
            })
            .collect()
    }

    /// Continues the map versions after `stored`, the version of the map the federation's
    /// store holds from before this process: a map built here already is renumbered after it
    /// (the same shards and weights), and the next ones follow.
    pub fn resume_map_version(&self, stored: u64) {
        let mut inner = self.inner.lock();
        inner.map_floor = inner.map_floor.max(stored);
        let current = inner.snapshot.map.version();
        if current == 0 || current > stored {
            return;
        }
        let weights = inner.snapshot.map.shards().to_vec();
        match ShardMap::new(stored + 1, &weights) {
            Ok(map) => inner.snapshot.map = map,
            Err(e) => tracing::error!(error = %e, "renumbering the shard map"),
        }
    }

    /// The current map's version.
    pub fn map_version(&self) -> u64 {
        self.inner.lock().snapshot.map.version()
    }

    /// Why what `policy` places may no longer run on `shard` (it left, or a `NoExecute`
    /// taint the policy does not tolerate: a drain), if so.
    pub fn evicts(&self, shard: &str, policy: &Policy) -> Option<String> {
        self.inner.lock().snapshot.evicts(shard, policy)
    }

    /// As [`Registry::evicts`], but only for a taint of a shard the registry knows: a shard
    /// it does not know yet (a restarted federation, before the shard registers again) is
    /// left to its lease.
    pub fn taint_evicts(&self, shard: &str, policy: &Policy) -> Option<String> {
        let inner = self.inner.lock();
        inner.snapshot.shards.contains_key(shard).then_some(())?;
        inner.snapshot.evicts(shard, policy)
    }

    /// The current map's version and its shards' weights.
    pub fn map(&self) -> (u64, Vec<ShardWeight>) {
        let inner = self.inner.lock();
        (
            inner.snapshot.map.version(),
            inner.snapshot.map.shards().to_vec(),
        )
    }

    /// Sets what the Shard object's spec says: cordon, taints, weight.
    pub fn set_spec(
        &self,
        name: &str,
        unschedulable: bool,
        taints: Vec<tessera_placement::Taint>,
        weight: Option<u64>,
    ) {
        let changed = {
            let mut inner = self.inner.lock();
            let Some(e) = inner.entries.get_mut(name) else {
                return;
            };
            e.spec_weight = weight;
            let state = inner.snapshot.shards.entry(name.to_owned()).or_default();
            let changed = state.unschedulable != unschedulable || state.taints != taints;
            state.unschedulable = unschedulable;
            state.taints = taints;
            self.rebuild_map(&mut inner);
            changed
        };
        if changed {
            self.emit(RegistryEvent::Spec(name.to_owned()));
        }
    }

    /// Records (or, `None`, forgets) the replicas of workload `key` the federation holds
    /// back for want of room.
    pub fn set_waiting(&self, key: &str, waiting: Option<crate::lending::Waiting>) {
        let mut w = self.waiting.lock();
        match waiting {
            Some(x) => {
                w.insert(key.to_owned(), x);
            }
            None => {
                w.remove(key);
            }
        }
    }

    /// Sets what the Shard object's `spec.lending` says.
    pub fn set_lending(&self, name: &str, policy: crate::lending::LendingPolicy) {
        // Kept by name: the Shard objects are read before their shards register again
        // (a restarted federation), and a loan must not be judged on a policy of zeros.
        self.lending_policies.lock().insert(name.to_owned(), policy);
    }

    /// One round of lending (every second or so): moves loans on and decides new ones from
    /// the shards' last reports, and sends the steps due. Returns what happened, for events.
    pub fn lending_tick(&self) -> Vec<crate::lending::Outcome> {
        use crate::lending::{ShardLending, Step};
        let now = Instant::now();
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let held_back = self.waiting.lock().clone();
        let mut waiting: BTreeMap<&str, Vec<&crate::lending::Waiting>> = BTreeMap::new();
        for w in held_back.values() {
            waiting.entry(w.shard.as_str()).or_default().push(w);
        }
        let policies = self.lending_policies.lock().clone();
        let shards: Vec<ShardLending> = {
            let inner = self.inner.lock();
            inner
                .entries
                .iter()
                .map(|(name, e)| ShardLending {
                    name: name.clone(),
                    ready: e.holds_lease(now),
                    capable: !e.loan_key.is_empty()
                        && !e.api_ca.is_empty()
                        && !e.api_url.is_empty(),
                    policy: policies.get(name).copied().unwrap_or_default(),
                    resources: e.resources.clone(),
                    report: e.lending.clone().map(|r| {
                        let w = waiting.get(name.as_str()).map_or(&[][..], Vec::as_slice);
                        crate::lending::with_waiting(r, &e.resources, w)
                    }),
                })
                .collect()
        };
        if shards.iter().all(|s| s.report.is_none()) && self.planner.lock().loans().next().is_none()
        {
            return Vec::new();
        }
        let (steps, outcomes) =
            self.planner
                .lock()
                .plan(&shards, &self.config.lending, now, now_ms);
        let expires = (now_ms / 1000) as i64 + tessera_client::auth::LOAN_TOKEN_MAX_SECONDS;
        for Step {
            to,
            op,
            loan,
            node,
            peer,
        } in steps
        {
            let mut msg = pb::Loan {
                op: op as i32,
                loan,
                node,
                peer,
                ..Default::default()
            };
            if op == pb::loan::Op::Lend {
                // The borrower's address and a credential for this node and loan only.
                let inner = self.inner.lock();
                let Some(b) = inner.entries.get(&msg.peer) else {
                    continue;
                };
                let Some(token) = tessera_client::auth::mint_loan_token(
                    &b.loan_key,
                    &msg.node,
                    &msg.loan,
                    expires,
                ) else {
                    tracing::warn!(shard = %msg.peer, "the shard's loan key is malformed: nothing is lent to it");
                    continue;
                };
                msg.server = b.api_url.clone();
                msg.ca_pem = b.api_ca.clone();
                msg.token = token;
            }
            if let Some((_, tx)) = self.session_sender(&to) {
                let _ = tx.send(pb::FederationMessage {
                    message: Some(pb::federation_message::Message::Loan(msg)),
                });
            }
        }
        if let Some(m) = &self.metrics {
            let planner = self.planner.lock();
            for phase in ["lending", "active", "returning"] {
                let n = planner.loans().filter(|l| l.phase.name() == phase).count();
                m.loans.with_label_values(&[phase]).set(n as i64);
            }
            for o in &outcomes {
                match o {
                    crate::lending::Outcome::Lent { .. } => {
                        m.loan_outcomes.with_label_values(&["lent"]).inc();
                    }
                    crate::lending::Outcome::Returning { .. } => {
                        m.loan_outcomes.with_label_values(&["returning"]).inc();
                    }
                    crate::lending::Outcome::Returned { away, .. } => {
                        m.loan_outcomes.with_label_values(&["returned"]).inc();
                        m.loan_duration.observe(away.as_secs_f64());
                    }
                }
            }
        }
        for o in &outcomes {
            tracing::info!(outcome = ?o, "lending");
        }
        outcomes
    }

    /// Looks at every lease and summary age: shards whose lease lapsed or whose summary went
    /// stale stop taking new work. Run every second or so.
    pub fn tick(&self) {
        let now = Instant::now();
        let mut changed = Vec::new();
        {
            let mut inner = self.inner.lock();
            let names: Vec<String> = inner.entries.keys().cloned().collect();
            for name in names {
                let before = inner.snapshot.shards.get(&name).map(|s| (s.ready, s.stale));
                self.refresh(&mut inner, &name, now);
                let after = inner.snapshot.shards.get(&name).map(|s| (s.ready, s.stale));
                if before != after {
                    changed.push(name.clone());
                }
                if let Some(m) = &self.metrics
                    && let Some((_, at)) = &inner.entries[&name].reported
                {
                    m.summary_age
                        .with_label_values(&[&name])
                        .set(now.saturating_duration_since(*at).as_secs() as i64);
                }
            }
        }
        if !changed.is_empty() {
            self.count_states();
        }
        for name in changed {
            tracing::info!(shard = %name, ready = self.is_ready(&name), "shard state changed");
            self.emit(RegistryEvent::Shard(name));
        }
    }

    fn count_states(&self) {
        let Some(m) = &self.metrics else { return };
        let inner = self.inner.lock();
        let ready = inner.snapshot.shards.values().filter(|s| s.ready).count();
        m.shards.with_label_values(&["ready"]).set(ready as i64);
        for (name, s) in &inner.snapshot.shards {
            m.shard_ready
                .with_label_values(&[name])
                .set(i64::from(s.ready));
        }
        m.shards
            .with_label_values(&["not_ready"])
            .set((inner.snapshot.shards.len() - ready) as i64);
    }

    /// Brings the placement view of `name` up to date with its entry.
    fn refresh(&self, inner: &mut Inner, name: &str, now: Instant) {
        let Some(e) = inner.entries.get(name) else {
            return;
        };
        let state = inner.snapshot.shards.entry(name.to_owned()).or_default();
        state.ready = e.holds_lease(now);
        state.stale = e
            .reported
            .as_ref()
            .is_none_or(|(_, at)| now.saturating_duration_since(*at) > self.config.summary_stale);
        // A new summary gets the reservations it does not count yet laid over it; between
        // summaries the snapshot's own commits keep it current.
        let reported = e.reported.as_ref().map(|(s, _)| s);
        if state.summary.is_none()
            || state.summary.as_ref().map(|s| s.version) != reported.map(|s| s.version)
        {
            state.summary = reported.map(|s| {
                let mut s = s.clone();
                for (_, req, n) in &e.reservations {
                    if let Ok(v) = req.vector_for(&s) {
                        s.reserve_on(&v, *n, &req.on);
                    }
                }
                s
            });
        }
    }

    /// Rebuilds the map if the shards or their weights changed; counts tenants... moved.
    fn rebuild_map(&self, inner: &mut Inner) {
        let weights: Vec<ShardWeight> = inner
            .entries
            .iter()
            .map(|(name, e)| {
                // Its own nodes' cpu (a loan moves no tenant), else what its summary counts.
                let cpu = e
                    .lending
                    .as_ref()
                    .and_then(|l| l.own_cpu_milli)
                    .unwrap_or_else(|| {
                        e.reported
                            .as_ref()
                            .map_or(0, |(s, _)| s.allocatable.first().copied().unwrap_or(0))
                    });
                ShardWeight::new(
                    name.clone(),
                    e.spec_weight.unwrap_or_else(|| weight_for_capacity(cpu)),
                )
            })
            .collect();
        if weights.as_slice() == inner.snapshot.map.shards() {
            return;
        }
        let version = inner.snapshot.map.version().max(inner.map_floor) + 1;
        match ShardMap::new(version, &weights) {
            Ok(map) => {
                // Tenants whose home shard the new map changes (one ring lookup each; maps
                // change only when shards join, leave or are re-weighted).
                let old = &inner.snapshot.map;
                let moved = inner
                    .tenants
                    .iter()
                    .filter(|t| old.home(t).is_some_and(|h| map.home(t) != Some(h)))
                    .count();
                tracing::info!(
                    version,
                    shards = weights.len(),
                    tenants_moved = moved,
                    "new shard map"
                );
                inner.snapshot.map = map;
                if let Some(m) = &self.metrics {
                    m.map_changes.inc();
                    m.tenants_moved.inc_by(moved as u64);
                }
            }
            Err(e) => tracing::error!(error = %e, "the shard map cannot be built"),
        }
    }
}

/// A Job's copy that has completed or failed: it runs nothing and is never moved.
fn finished(key: &ObjectKey, r: Option<&Reported>) -> bool {
    use tessera_client::workloads::WorkloadKind;
    WorkloadKind::from_plural(&key.resource) == Some(WorkloadKind::Job)
        && r.is_some_and(|r| WorkloadKind::Job.needs_no_room(&r.status))
}

fn apply_message(seq: u64, key: &ObjectKey, h: &Held) -> pb::FederationMessage {
    pb::FederationMessage {
        message: Some(pb::federation_message::Message::Assignment(
            pb::Assignment {
                seq,
                op: pb::assignment::Op::Apply as i32,
                key: Some(key.to_pb()),
                object_json: h.object.to_vec(),
                generation: h.generation,
                replicas: h.replicas,
                dependencies_json: h.dependencies.iter().map(|d| d.to_vec()).collect(),
                failover: h
                    .failover
                    .map(|m| m.as_str().to_owned())
                    .unwrap_or_default(),
            },
        )),
    }
}

fn synced_message(seq: u64) -> pb::FederationMessage {
    pb::FederationMessage {
        message: Some(pb::federation_message::Message::Synced(pb::Synced { seq })),
    }
}

/// A shard's summary as the stream carries it, read into the placement's form (validated
/// by the caller: a shard is not trusted).
pub fn summary_of(s: &pb::CapacitySummary) -> Summary {
    let process = s.process.as_deref().map(|p| Box::new(summary_of(p)));
    let slots = |slots: &[pb::Slot]| {
        slots
            .iter()
            .map(|x| tessera_placement::Slot {
                free: x.free.clone(),
                count: x.count,
            })
            .collect()
    };
    Summary {
        resources: s.resources.clone(),
        allocatable: s.allocatable.clone(),
        free: s.free.clone(),
        slots: slots(&s.slots),
        nodes: s.nodes,
        version: s.version,
        group_keys: s.group_keys.clone(),
        groups: s
            .groups
            .iter()
            .map(|g| tessera_placement::Group {
                values: g.values.clone(),
                summary: Summary {
                    resources: s.resources.clone(),
                    allocatable: g.allocatable.clone(),
                    free: g.free.clone(),
                    slots: slots(&g.slots),
                    nodes: g.nodes,
                    version: s.version,
                    ..Default::default()
                },
            })
            .collect(),
        process,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use tessera_placement::{Mode, SummaryBuilder};

    use super::*;

    fn registry() -> Arc<Registry> {
        Registry::new(RegistryConfig::new("sekret"), None)
    }

    #[test]
    fn the_placement_rate_counts_the_last_minute_and_starts_again_with_a_new_agent() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut w = std::collections::VecDeque::new();
        assert_eq!(placed_in_window(&w), 0);
        record_bound(&mut w, at(0), 100);
        assert_eq!(placed_in_window(&w), 0, "one sample: no rate yet");
        record_bound(&mut w, at(30), 130);
        record_bound(&mut w, at(60), 190);
        assert_eq!(placed_in_window(&w), 90);
        // At 90 s the sample at 30 s opens the window; the one at 0 s is gone.
        record_bound(&mut w, at(90), 200);
        assert_eq!(w.len(), 3);
        assert_eq!(placed_in_window(&w), 70);
        // The agent started again: its counter is back near 0.
        record_bound(&mut w, at(91), 4);
        assert_eq!(w.len(), 1);
        assert_eq!(placed_in_window(&w), 0);
        record_bound(&mut w, at(92), 10);
        assert_eq!(placed_in_window(&w), 6);
    }

    #[test]
    fn a_shard_not_registered_yet_is_not_taken_for_a_drained_one() {
        let r = registry();
        let p = Policy::default();
        assert!(
            r.evicts("a", &p)
                .is_some_and(|w| w.contains("left the federation")),
            "a workload moves off a shard that left"
        );
        assert_eq!(
            r.taint_evicts("a", &p),
            None,
            "only a known shard's taint counts"
        );
    }

    fn reg(name: &str, token: &str) -> pb::Register {
        pb::Register {
            name: name.into(),
            token: token.into(),
            ..Default::default()
        }
    }

    /// `nodes` nodes of 4 cpu, all free, as version `version`, having seen `seen`.
    fn summary(nodes: u64, version: u64, seen: u64) -> pb::CapacitySummary {
        summary_used(nodes, version, seen, 0)
    }

    /// `nodes` of 4 cpu with `used` cpu taken, the first nodes filled first.
    fn summary_used(nodes: u64, version: u64, seen: u64, used: u64) -> pb::CapacitySummary {
        let mut b = SummaryBuilder::new(&[]);
        let mut left = used * 1000;
        for _ in 0..nodes {
            let taken = left.min(4000);
            left -= taken;
            b.node(&[4000, 16 << 30, 110], &[4000 - taken, 16 << 30, 110]);
        }
        let s = b.build(version);
        pb::CapacitySummary {
            version,
            resources: s.resources,
            allocatable: s.allocatable,
            free: s.free,
            slots: s
                .slots
                .into_iter()
                .map(|x| pb::Slot {
                    free: x.free,
                    count: x.count,
                })
                .collect(),
            nodes: s.nodes,
            assignments_seen: seen,
            ..Default::default()
        }
    }

    fn kinds(rx: &mut mpsc::UnboundedReceiver<pb::FederationMessage>) -> Vec<&'static str> {
        let mut out = Vec::new();
        while let Ok(m) = rx.try_recv() {
            out.push(match m.message {
                Some(pb::federation_message::Message::Registered(_)) => "registered",
                Some(pb::federation_message::Message::Assignment(a)) if a.op == 0 => "apply",
                Some(pb::federation_message::Message::Assignment(_)) => "delete",
                Some(pb::federation_message::Message::Synced(_)) => "synced",
                Some(pb::federation_message::Message::Call(_)) => "call",
                Some(pb::federation_message::Message::Cancel(_)) => "cancel",
                Some(pb::federation_message::Message::Tunnel(_)) => "tunnel",
                Some(pb::federation_message::Message::Renewed(_)) => "renewed",
                Some(pb::federation_message::Message::Loan(_)) => "loan",
                Some(pb::federation_message::Message::Offers(_)) => "offers",
                Some(pb::federation_message::Message::Fleet(_)) => "fleet",
                None => "empty",
            });
        }
        out
    }

    #[tokio::test(start_paused = true)]
    async fn a_lost_shard_stands_by_its_lease_and_gives_up_work_only_while_lost() {
        let r = registry();
        let lease = r.config().lease;
        // Never registered since the start: lost, its lease ending one lease after it.
        assert_eq!(
            r.standing("a"),
            Standing::Lost {
                since_lease_end: None,
                until_lease_end: lease
            }
        );
        let (s1, mut rx) = r.register(&reg("a", "sekret")).expect("register");
        assert_eq!(r.standing("a"), Standing::Ready);
        r.assign("a", &key(), held());
        // Renewals are acknowledged with their seq.
        tokio::time::advance(Duration::from_secs(5)).await;
        assert!(r.renew("a", s1, 1));
        let acks: Vec<u64> = std::iter::from_fn(|| rx.try_recv().ok())
            .filter_map(|m| match m.message {
                Some(pb::federation_message::Message::Renewed(r)) => Some(r.seq),
                _ => None,
            })
            .collect();
        assert_eq!(acks, [1]);
        // A ready shard keeps its work.
        assert!(!r.release_lost("a", &key()));
        assert_eq!(r.held_on("a"), [key()]);
        // Disconnected: lost at once, but its lease still runs (the agent still runs
        // everything until then).
        r.disconnect("a", s1);
        assert_eq!(
            r.standing("a"),
            Standing::Lost {
                since_lease_end: None,
                until_lease_end: lease
            }
        );
        tokio::time::advance(lease + Duration::from_secs(2)).await;
        assert_eq!(
            r.standing("a"),
            Standing::Lost {
                since_lease_end: Some(Duration::from_secs(2)),
                until_lease_end: Duration::ZERO
            }
        );
        // A renewal on a lapsed lease is refused: the agent must register again.
        assert!(!r.renew("a", s1, 2));
        // Released while lost; a registration after it is not sent the object.
        assert!(r.release_lost("a", &key()));
        assert!(r.held_on("a").is_empty());
        let (_s2, mut rx2) = r.register(&reg("a", "sekret")).expect("back");
        assert_eq!(kinds(&mut rx2), ["registered"]);
    }

    fn key() -> ObjectKey {
        ObjectKey {
            group: "apps".into(),
            version: "v1".into(),
            resource: "deployments".into(),
            namespace: "t".into(),
            name: "web".into(),
        }
    }

    fn held() -> Held {
        Held {
            object: Arc::from(&b"{}"[..]),
            generation: 1,
            replicas: 2,
            request: Request::default(),
            dependencies: Vec::new(),
            failover: None,
            leaving: false,
        }
    }

    /// `replicas` of `req` held: what the controller assigns after a decision.
    fn held_of(req: &Request, replicas: u64) -> Held {
        Held {
            replicas: replicas as i64,
            request: req.clone(),
            ..held()
        }
    }

    #[test]
    fn registrations_are_refused_with_the_reason_and_a_held_name_once() {
        let r = registry();
        assert_eq!(
            r.register(&reg("a", "guess")).err(),
            Some(RegisterError::BadToken)
        );
        assert!(matches!(
            r.register(&reg("Not_A_Label", "sekret")).err(),
            Some(RegisterError::BadName { .. })
        ));
        let mut bad = reg("a", "sekret");
        bad.labels
            .insert("region".into(), "no spaces allowed".into());
        assert!(matches!(
            r.register(&bad).err(),
            Some(RegisterError::BadLabel { .. })
        ));
        assert!(r.shard_names().is_empty(), "refusals register nothing");

        let (first, _rx) = r.register(&reg("a", "sekret")).expect("first");
        assert!(r.is_ready("a"));
        assert_eq!(
            r.register(&reg("a", "sekret")).err(),
            Some(RegisterError::Duplicate("a".into()))
        );
        r.disconnect("a", first);
        assert!(!r.is_ready("a"), "a disconnected shard takes no new work");
        let (second, _rx) = r
            .register(&reg("a", "sekret"))
            .expect("after the first left");
        assert_ne!(first, second);
        assert!(
            !r.renew("a", first, 1),
            "the old session no longer renews the lease"
        );
        assert!(r.renew("a", second, 1));
    }

    #[test]
    fn a_shard_that_comes_back_gets_what_it_holds_and_synced_only_after_the_first_pass() {
        let r = registry();
        let (s1, mut rx) = r.register(&reg("a", "sekret")).expect("register");
        assert_eq!(kinds(&mut rx), ["registered"]);
        r.assign("a", &key(), held());
        r.assign("a", &key(), held());
        assert_eq!(
            kinds(&mut rx),
            ["apply"],
            "an unchanged assignment is not sent again"
        );
        r.disconnect("a", s1);
        let (_, mut rx) = r.register(&reg("a", "sekret")).expect("again");
        assert_eq!(
            kinds(&mut rx),
            ["registered", "apply"],
            "no Synced before the first pass"
        );
        r.mark_synced();
        assert_eq!(kinds(&mut rx), ["synced"]);
        r.unassign("a", &key());
        assert_eq!(kinds(&mut rx), ["delete"]);
    }

    #[test]
    fn a_join_moves_about_a_third_of_the_tenants_placed_and_counts_them() {
        let metrics = FederationMetrics::unregistered().expect("metrics");
        let r = Registry::new(RegistryConfig::new("sekret"), Some(metrics.clone()));
        let mut keep = Vec::new();
        for name in ["a", "b"] {
            let (s, rx) = r.register(&reg(name, "sekret")).expect("register");
            r.summary(name, s, &summary(100, 1, 0)).expect("valid");
            keep.push(rx);
        }
        let req = Request::cpu_memory(1, 0);
        let none = BTreeMap::new();
        let tenants: Vec<String> = (0..600).map(|i| format!("tenant-{i}")).collect();
        for t in &tenants {
            let w = Workload {
                tenant: t,
                replicas: 1,
                request: &req,
                current: &none,
            };
            r.place(&w, &Policy::default());
        }
        let homes = |r: &Registry| -> Vec<String> {
            tenants.iter().map(|t| r.preference(t)[0].clone()).collect()
        };
        let before = homes(&r);
        assert_eq!(metrics.tenants_moved.get(), 0);
        let (s, _rx) = r.register(&reg("c", "sekret")).expect("register");
        r.summary("c", s, &summary(100, 1, 0)).expect("valid");
        let after = homes(&r);
        let moved = before.iter().zip(&after).filter(|(x, y)| x != y).count() as u64;
        assert_eq!(
            metrics.tenants_moved.get(),
            moved,
            "the metric counts what moved"
        );
        assert!(
            after.iter().zip(&before).all(|(a, b)| a == b || a == "c"),
            "only to the new shard"
        );
        // About a third moves to the new shard (1/N), never most of them.
        assert!((120..=300).contains(&moved), "{moved} of 600 moved");
    }

    #[test]
    fn map_versions_go_on_after_the_stored_one() {
        // Stored 7 read before any shard joined: the first map here is 8.
        let r = registry();
        r.resume_map_version(7);
        let (s, _rx) = r.register(&reg("a", "sekret")).expect("register");
        r.summary("a", s, &summary(2, 1, 0)).expect("valid");
        assert_eq!(r.map().0, 8);
        // A map built before the stored version was read is renumbered after it.
        let r = registry();
        let (s, _rx) = r.register(&reg("a", "sekret")).expect("register");
        r.summary("a", s, &summary(2, 1, 0)).expect("valid");
        let (v, weights) = r.map();
        assert!(v >= 1);
        r.resume_map_version(12);
        assert_eq!(r.map(), (13, weights));
        let (s, _rx) = r.register(&reg("b", "sekret")).expect("register");
        r.summary("b", s, &summary(2, 1, 0)).expect("valid");
        assert_eq!(r.map().0, 14);
        // An older stored version changes nothing.
        r.resume_map_version(3);
        assert_eq!(r.map().0, 14);
    }

    #[test]
    fn reservations_hold_until_a_summary_has_seen_them() {
        let r = registry();
        let (s, _rx) = r.register(&reg("a", "sekret")).expect("register");
        r.summary("a", s, &summary(2, 1, 0)).expect("valid");
        let req = Request::cpu_memory(1000, 0);
        let none = BTreeMap::new();
        let w = Workload {
            tenant: "t",
            replicas: 6,
            request: &req,
            current: &none,
        };
        let policy = Policy {
            mode: Mode::Home,
            ..Default::default()
        };
        let (d, _) = r.place(&w, &policy);
        assert_eq!(d.shares.get("a"), Some(&6));
        r.assign("a", &key(), held_of(&req, 6)); // seq 1 reserves 6
        let (d, _) = r.place(&w, &policy);
        assert_eq!(d.shares.get("a"), Some(&2), "8 cpu, 6 taken");
        let other = ObjectKey {
            name: "other".into(),
            ..key()
        };
        r.assign("a", &other, held_of(&req, 2)); // seq 2 reserves 2
        // A newer summary that has seen neither assignment still counts both as taken...
        r.summary("a", s, &summary(2, 2, 0)).expect("valid");
        let (d, _) = r.place(
            &Workload {
                replicas: 8,
                ..w.clone()
            },
            &policy,
        );
        assert_eq!(d.unplaced, 8, "6 + 2 reserved: {d:?}");
        // ...one that has seen the first reports its room itself.
        r.summary("a", s, &summary(2, 3, 1)).expect("valid");
        let (d, _) = r.place(&Workload { replicas: 8, ..w }, &policy);
        assert_eq!(
            d.shares.get("a"),
            Some(&6),
            "the second decision's 2 still ride on seq 2"
        );
    }

    #[test]
    fn a_decision_repeated_on_a_stale_record_reserves_nothing_twice() {
        let r = registry();
        let (s, _rx) = r.register(&reg("a", "sekret")).expect("register");
        r.summary("a", s, &summary(2, 1, 0)).expect("valid");
        let req = Request::cpu_memory(1000, 0);
        let policy = Policy {
            mode: Mode::Home,
            ..Default::default()
        };
        assert_eq!(r.credit(&key(), &req), None, "held nowhere yet");
        let none = BTreeMap::new();
        let w = Workload {
            tenant: "t",
            replicas: 4,
            request: &req,
            current: &none,
        };
        let (d, _) = r.place(&w, &policy);
        r.assign("a", &key(), held_of(&req, d.shares["a"]));
        // The shard runs the 4 and says so: 8 cpu, 4 free.
        r.summary("a", s, &summary_used(2, 2, 1, 4)).expect("valid");
        // The controller decides again from what the registry holds, not from a record its
        // cache may not show yet: the 4 are credited, nothing new is reserved, and the same
        // assignment is not sent again.
        let credit = r.credit(&key(), &req).expect("held");
        assert_eq!(credit, BTreeMap::from([("a".to_owned(), 4)]));
        let w = Workload {
            current: &credit,
            ..w
        };
        let (d, _) = r.place(&w, &policy);
        assert_eq!(d.shares["a"], 4);
        r.assign("a", &key(), held_of(&req, 4));
        // Even a decision made with no credit at all (a stale caller) changes no assignment,
        // so it leaves no reservation behind once the next summary comes.
        let (_, _) = r.place(
            &Workload {
                current: &none,
                ..w.clone()
            },
            &policy,
        );
        r.assign("a", &key(), held_of(&req, 4));
        r.summary("a", s, &summary_used(2, 3, 1, 4)).expect("valid");
        // Scaling to 8 finds the 4 free cpu and its own 4: all 8 fit.
        let (d, _) = r.place(
            &Workload {
                replicas: 8,
                ..w.clone()
            },
            &policy,
        );
        assert_eq!(d.shares.get("a"), Some(&8), "{d:?}");
        assert_eq!(d.unplaced, 0);
        // A changed request is not credited with the old replicas.
        let bigger = Request::cpu_memory(2000, 0);
        assert_eq!(r.credit(&key(), &bigger), Some(BTreeMap::new()));
    }

    #[test]
    fn malformed_summaries_and_reports_of_what_was_not_assigned_are_refused() {
        let r = registry();
        let (s, _rx) = r.register(&reg("a", "sekret")).expect("register");
        let mut bad = summary(1, 1, 0);
        bad.free[0] = 999_999;
        let why = r.summary("a", s, &bad).expect_err("refused");
        assert!(why.contains("exceeds allocatable"), "{why}");
        assert!(
            r.views()[0].summary.is_none(),
            "nothing taken from a refused summary"
        );
        let status = pb::ObjectStatus {
            key: Some(key().to_pb()),
            present: true,
            ..Default::default()
        };
        r.status("a", s, &status).expect("ignored, not an error");
        assert!(r.reports(&key()).is_empty(), "not stored");
        r.assign("a", &key(), held());
        r.status("a", s, &status).expect("stored");
        assert_eq!(r.reports(&key()).len(), 1);
        let junk = pb::ObjectStatus {
            status_json: b"not json".to_vec(),
            ..status
        };
        assert!(
            r.status("a", s, &junk)
                .expect_err("refused")
                .contains("not JSON")
        );
    }
}
