//! The scheduling loop: one task owns the queue and the cache, applies informer events
//! between cycles, and runs one scheduling cycle at a time ([`cycle`]: filter, score,
//! reserve, permit); binding cycles ([`binding`]) run concurrently off the loop and report
//! back.

mod binding;
mod cycle;
mod preempt;

use binding::{BindOutcome, MAX_BINDS_IN_FLIGHT};
pub use cycle::feasible_nodes_to_find;
use cycle::{Attempt, DecideInput, Decision, Failure, Verdict, decide, random_tie};

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{ReplicaSet, StatefulSet};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Service};
use parking_lot::RwLock;
use serde_json::json;
use tessera_client::client::Client;
use tessera_client::request::{PatchType, find_resource};
use tessera_client::types::{PodGroup, Tenant};
use tessera_core::LabelSelector;
use tessera_core::selector::label::{Operator, Requirement};
use tessera_core::time::{now_secs, rfc3339};
use tessera_runtime::Informers;
use tessera_runtime::events::{EventType, ObjectRef, Recorder};
use tessera_runtime::informer::{Cache as PodCache, Change};
use tessera_runtime::metrics::RuntimeMetrics;
use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio::time::Instant;

use crate::cache::Cache;
use crate::config::{Point, Profile, SchedulerConfig};
use crate::framework::{ClusterEvent, Code, CycleState, Handle, QueuedPod, Status, WaitingPods};
use crate::metrics::SchedulerMetrics;
use crate::plugins::gang::{GangSpec, Gangs, gang_of};
use crate::plugins::preemption::{Budget, Budgets};
use crate::queue::{SchedulingQueue, TenantSpec, Usage};
use crate::resources::PodInfo;
use crate::topology::Topology;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;

enum Msg {
    Node(Arc<Node>),
    NodeGone(String),
    Pod(Arc<Pod>),
    PodGone(Arc<Pod>),
    Tenants,
    Namespaces,
    PodGroup(String, Option<GangSpec>),
    Budgets,
}

/// What the scheduler needs to run.
pub struct SchedulerOptions {
    /// The configuration (profiles, plugins, percentage of nodes to score, backoffs).
    pub config: SchedulerConfig,
    /// Its metrics.
    pub metrics: Option<SchedulerMetrics>,
    /// Runtime metrics (informers, events).
    pub runtime_metrics: Option<RuntimeMetrics>,
    /// The process's shared informers, when the scheduler runs beside controllers or agents
    /// on the same API (`tessera up`); `None` starts its own.
    pub informers: Option<Arc<Informers>>,
}

/// A scheduler: build it with [`Scheduler::new`] (checks the configuration), then
/// [`Scheduler::run`].
pub struct Scheduler {
    client: Arc<dyn Client>,
    profiles: Vec<Profile>,
    waiting: Arc<WaitingPods>,
    queue: SchedulingQueue,
    cache: Cache,
    percentage: u32,
    next_start: usize,
    /// Pods decided at once (`parallelism`).
    workers: usize,
    /// Threads for the decisions beyond the loop's own (none with one worker).
    pool: Option<rayon::ThreadPool>,
    metrics: Option<SchedulerMetrics>,
    runtime_metrics: Option<RuntimeMetrics>,
    recorder: Recorder,
    binds: Arc<Semaphore>,
    outcome_tx: mpsc::UnboundedSender<BindOutcome>,
    outcome_rx: Option<mpsc::UnboundedReceiver<BindOutcome>>,
    pods: Option<Arc<PodCache<Pod>>>,
    tenants: Option<Arc<PodCache<Tenant>>>,
    namespaces: Option<Arc<PodCache<Namespace>>>,
    informers: Option<Arc<Informers>>,
    enqueued_at: HashMap<String, Instant>,
    gangs: Arc<Gangs>,
    budgets: Arc<Budgets>,
    pdbs: Option<Arc<PodCache<PodDisruptionBudget>>>,
    /// What the pods counted on nodes request, and the allocatable last handed on: the
    /// shard's free capacity (for gangs) is their difference.
    used: Usage,
    capacity_seen: Usage,
}

fn phase(p: &Pod) -> &str {
    p.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("")
}

impl Scheduler {
    /// A scheduler of the profiles in `opts.config`, writing through `client`.
    pub fn new(client: Arc<dyn Client>, opts: SchedulerOptions) -> Result<Scheduler, String> {
        let waiting = Arc::new(WaitingPods::default());
        let topology = Arc::new(RwLock::new(Topology::new()));
        let gangs = Arc::new(Gangs::default());
        let budgets = Arc::new(Budgets::default());
        let handle = Handle {
            budgets: budgets.clone(),
            waiting: waiting.clone(),
            client: client.clone(),
            topology: topology.clone(),
            gangs: gangs.clone(),
            metrics: opts.metrics.clone(),
        };
        let profiles = opts.config.build(&handle)?;
        let sort = profiles[0].at(Point::QueueSort)[0].0.clone();
        for p in &profiles[1..] {
            if p.at(Point::QueueSort)[0].0.name() != sort.name() {
                return Err(
                    "every profile must use the same queueSort plugin (the queue is shared)".into(),
                );
            }
        }
        let initial = Duration::from_secs(opts.config.pod_initial_backoff_seconds.unwrap_or(1));
        let max = Duration::from_secs(opts.config.pod_max_backoff_seconds.unwrap_or(10));
        if initial > max {
            return Err(format!(
                "podInitialBackoffSeconds ({}) is larger than podMaxBackoffSeconds ({})",
                initial.as_secs(),
                max.as_secs()
            ));
        }
        let (outcome_tx, outcome_rx) = mpsc::unbounded_channel();
        let workers = opts.config.workers();
        let pool = if workers > 1 {
            Some(
                rayon::ThreadPoolBuilder::new()
                    .num_threads(workers - 1)
                    .thread_name(|i| format!("scheduler-worker-{i}"))
                    .build()
                    .map_err(|e| {
                        format!("could not start {} scheduling workers: {e}", workers - 1)
                    })?,
            )
        } else {
            None
        };
        if let Some(m) = &opts.metrics {
            m.workers.set(workers as i64);
            // Every profile's attempt counters exist from the start, at 0, so the first pods
            // scheduled count in `rate()` (a series first seen at 6 shows no increase).
            for p in &profiles {
                for outcome in ["scheduled", "unschedulable", "error"] {
                    m.attempts.with_label_values(&[outcome, &p.scheduler_name]);
                }
            }
        }
        Ok(Scheduler {
            workers,
            pool,
            recorder: Recorder::new(
                client.clone(),
                "default-scheduler",
                opts.runtime_metrics.clone(),
            ),
            client,
            profiles,
            waiting,
            queue: SchedulingQueue::new(sort, initial, max),
            cache: Cache::with_topology(topology),
            percentage: opts.config.percentage_of_nodes_to_score.unwrap_or(0),
            next_start: 0,
            metrics: opts.metrics,
            gangs,
            budgets,
            pdbs: None,
            used: Usage::default(),
            capacity_seen: Usage::default(),
            runtime_metrics: opts.runtime_metrics,
            binds: Arc::new(Semaphore::new(MAX_BINDS_IN_FLIGHT)),
            outcome_tx,
            outcome_rx: Some(outcome_rx),
            pods: None,
            tenants: None,
            namespaces: None,
            enqueued_at: HashMap::new(),
            informers: opts.informers,
        })
    }

    /// Pods held at Permit (for Permit plugins that allow or reject them later).
    pub fn waiting_pods(&self) -> Arc<WaitingPods> {
        self.waiting.clone()
    }

    /// Watches nodes and pods and schedules until the task is dropped.
    pub async fn run(mut self) {
        let (tx, mut rx) = mpsc::unbounded_channel::<Msg>();
        let informers = self
            .informers
            .take()
            .unwrap_or_else(|| Informers::new(self.client.clone(), self.runtime_metrics.clone()));
        let nodes = informers.get::<Node>(res("nodes"));
        let t = tx.clone();
        let _nodes_sub = nodes.on_change(move |c| {
            let _ = t.send(match c {
                Change::Added(n) | Change::Updated { new: n, .. } => Msg::Node(n.clone()),
                Change::Deleted(n) => Msg::NodeGone(n.metadata.name.clone().unwrap_or_default()),
            });
        });
        let tenants = informers.get::<Tenant>(
            find_resource("tessera.io", "v1alpha1", "tenants").expect("tenants are served"),
        );
        let t = tx.clone();
        // Only what the queue uses (namespaces, weight) matters: a Tenant's status (its quota
        // usage, written as its pods come and go) changes nothing here.
        let _tenants_sub = tenants.on_change(move |c| {
            let relevant = match c {
                Change::Updated { old, new } => {
                    fn view(t: &Tenant) -> Option<(&Option<Vec<String>>, Option<i32>)> {
                        t.spec.as_ref().map(|s| (&s.namespaces, s.weight))
                    }
                    view(old) != view(new)
                }
                Change::Added(_) | Change::Deleted(_) => true,
            };
            if relevant {
                let _ = t.send(Msg::Tenants);
            }
        });
        self.tenants = Some(tenants.cache().clone());
        // Namespace labels matter to pod affinity terms' namespaceSelector.
        let namespaces = informers.get::<Namespace>(res("namespaces"));
        let t = tx.clone();
        let _namespaces_sub = namespaces.on_change(move |c| {
            let relevant = match c {
                Change::Updated { old, new } => old.metadata.labels != new.metadata.labels,
                Change::Added(_) | Change::Deleted(_) => true,
            };
            if relevant {
                let _ = t.send(Msg::Namespaces);
            }
        });
        self.namespaces = Some(namespaces.cache().clone());
        // What selects a pod, for system default spreading.
        let services = informers.get::<Service>(res("services"));
        let replicasets = informers.get::<ReplicaSet>(
            find_resource("apps", "v1", "replicasets").expect("replicasets are served"),
        );
        let statefulsets = informers.get::<StatefulSet>(
            find_resource("apps", "v1", "statefulsets").expect("statefulsets are served"),
        );
        let (svc, rs, ss) = (
            services.cache().clone(),
            replicasets.cache().clone(),
            statefulsets.cache().clone(),
        );
        self.cache
            .topology()
            .write()
            .set_default_selector(Arc::new(move |pod| default_selector(pod, &svc, &rs, &ss)));
        // PodGroups, for gang scheduling.
        let groups = informers.get::<PodGroup>(
            find_resource("tessera.io", "v1alpha1", "podgroups").expect("podgroups are served"),
        );
        let t = tx.clone();
        let _groups_sub = groups.on_change(move |c| {
            let key = crate::key_of(&c.object().metadata);
            let _ = t.send(match c {
                Change::Added(g) | Change::Updated { new: g, .. } => {
                    Msg::PodGroup(key, Some(GangSpec::of(g)))
                }
                Change::Deleted(_) => Msg::PodGroup(key, None),
            });
        });
        // PodDisruptionBudgets, for preemption.
        let pdbs = informers.get::<PodDisruptionBudget>(
            find_resource("policy", "v1", "poddisruptionbudgets").expect("PDBs are served"),
        );
        let t = tx.clone();
        let _pdbs_sub = pdbs.on_change(move |_| {
            let _ = t.send(Msg::Budgets);
        });
        self.pdbs = Some(pdbs.cache().clone());
        let pods = informers.get::<Pod>(res("pods"));
        let t = tx;
        let _pods_sub = pods.on_change(move |c| {
            let _ = t.send(match c {
                Change::Added(p) | Change::Updated { new: p, .. } => Msg::Pod(p.clone()),
                Change::Deleted(p) => Msg::PodGone(p.clone()),
            });
        });
        self.pods = Some(pods.cache().clone());
        // Every bound pod must be counted before anything is placed.
        nodes.synced().await;
        pods.synced().await;
        tenants.synced().await;
        namespaces.synced().await;
        services.synced().await;
        replicasets.synced().await;
        statefulsets.synced().await;
        groups.synced().await;
        pdbs.synced().await;
        self.budgets_changed();
        self.rescope();
        tracing::info!("scheduler caches synced; scheduling");
        let mut outcomes = self.outcome_rx.take().expect("run is called once");
        let mut last_tick = Instant::now();
        loop {
            loop {
                match rx.try_recv() {
                    Ok(m) => self.handle(m),
                    Err(mpsc::error::TryRecvError::Empty) => break,
                    Err(mpsc::error::TryRecvError::Disconnected) => return,
                }
            }
            while let Ok(o) = outcomes.try_recv() {
                self.finish_binding(o);
            }
            if last_tick.elapsed() >= Duration::from_secs(1) {
                last_tick = Instant::now();
                self.tick();
            }
            self.sync_fair_share();
            let now = Instant::now();
            if let Some(qp) = self.queue.pop(now) {
                let mut batch = vec![qp];
                while batch.len() < self.workers
                    && let Some(qp) = self.queue.pop(now)
                {
                    batch.push(qp);
                }
                self.schedule_round(batch).await;
                continue;
            }
            let wake = self
                .queue
                .next_backoff()
                .unwrap_or_else(|| Instant::now() + Duration::from_secs(1));
            tokio::select! {
                m = rx.recv() => match m {
                    Some(m) => self.handle(m),
                    None => return,
                },
                Some(o) = outcomes.recv() => self.finish_binding(o),
                _ = tokio::time::sleep_until(wake) => {}
            }
        }
    }

    /// Hands the queue what changed in tenants' usage and the shard's allocatable since the
    /// last pick, so the next pick sees every reservation made before it.
    fn sync_fair_share(&mut self) {
        let charges = self.cache.take_charges();
        if charges.is_empty() && self.capacity_seen == self.cache.capacity() {
            return;
        }
        for (pod, sign) in charges {
            self.used.add(Usage::of(&pod.requests), sign);
            self.queue.charge(&pod, sign);
        }
        let capacity = self.cache.capacity();
        self.capacity_seen = capacity;
        self.queue.set_capacity(capacity);
        let mut free = capacity;
        free.add(self.used, -1);
        self.gangs.set_free(free);
    }

    fn tenants_changed(&mut self) {
        let Some(cache) = &self.tenants else { return };
        let specs: Vec<TenantSpec> = cache
            .list()
            .iter()
            .filter_map(|t| {
                let spec = t.spec.as_ref();
                Some(TenantSpec {
                    name: t.metadata.name.clone()?,
                    weight: spec
                        .and_then(|s| s.weight)
                        .unwrap_or(1)
                        .max(1)
                        .try_into()
                        .unwrap_or(1),
                    namespaces: spec.and_then(|s| s.namespaces.clone()).unwrap_or_default(),
                })
            })
            .collect();
        tracing::debug!(tenants = specs.len(), "tenants changed");
        self.queue.set_tenants(&specs);
        self.rescope();
    }

    /// Hands preemption the PodDisruptionBudgets as they are now (they are few).
    fn budgets_changed(&mut self) {
        let Some(cache) = &self.pdbs else { return };
        let list = cache
            .list()
            .iter()
            .filter_map(|b| {
                let spec = b.spec.as_ref()?;
                let selector =
                    tessera_runtime::selector::from_metav1(spec.selector.as_ref()?).ok()?;
                Some(Budget {
                    namespace: b.metadata.namespace.clone()?,
                    selector,
                    allowed: b.status.as_ref().map_or(0, |s| s.disruptions_allowed),
                })
            })
            .collect();
        self.budgets.set(list);
    }

    /// Makes the topology counters the profile's plugins read for `pod` (a cycle only reads).
    fn prepare_counters(&mut self, pi: usize, pod: &PodInfo) {
        let needs = {
            let topo = self.cache.topology().read();
            let mut seen: Vec<&'static str> = Vec::new();
            let mut needs = Vec::new();
            for point in [Point::PreFilter, Point::PreScore] {
                for (p, _) in self.profiles[pi].at(point) {
                    if !seen.contains(&p.name()) {
                        seen.push(p.name());
                        needs.extend(p.counters(pod, &topo));
                    }
                }
            }
            needs
        };
        self.cache.ensure_counters(&needs);
    }

    /// Hands the topology counters the namespaces' labels and owners (pod affinity terms
    /// select only within the pod's tenant).
    fn rescope(&mut self) {
        let mut owners = HashMap::new();
        for t in self.tenants.iter().flat_map(|c| c.list()) {
            let Some(name) = t.metadata.name.clone() else {
                continue;
            };
            for ns in t.spec.iter().flat_map(|s| s.namespaces.iter().flatten()) {
                owners.insert(ns.clone(), name.clone());
            }
        }
        let namespaces = self
            .namespaces
            .iter()
            .flat_map(|c| c.list())
            .filter_map(|n| {
                Some((
                    n.metadata.name.clone()?,
                    n.metadata.labels.clone().unwrap_or_default(),
                ))
            })
            .collect();
        self.cache.set_namespaces(namespaces, owners);
    }

    fn tick(&mut self) {
        let now = Instant::now();
        self.cache.topology().write().tick();
        self.queue.flush_stale(now);
        if let Some(m) = &self.metrics {
            let s = self.queue.sizes();
            m.pending
                .with_label_values(&["active"])
                .set(s.active as i64);
            m.pending
                .with_label_values(&["backoff"])
                .set(s.backoff as i64);
            m.pending
                .with_label_values(&["unschedulable"])
                .set(s.unschedulable as i64);
            for t in self.queue.standings() {
                for (queue, n) in [
                    ("active", t.sizes.active),
                    ("backoff", t.sizes.backoff),
                    ("unschedulable", t.sizes.unschedulable),
                ] {
                    m.tenant_pending
                        .with_label_values(&[&t.name, queue])
                        .set(n as i64);
                }
                m.tenant_share.with_label_values(&[&t.name]).set(t.share);
            }
            m.cache_nodes.set(self.cache.node_count() as i64);
            m.cache_pods.set(self.cache.pod_count() as i64);
            let (counters, groups) = self.cache.topology().read().sizes();
            m.topology_entries
                .with_label_values(&["counter"])
                .set(counters as i64);
            m.topology_entries
                .with_label_values(&["group"])
                .set(groups as i64);
        }
    }

    fn profile_of(&self, pod: &Pod) -> Option<usize> {
        let name = pod
            .spec
            .as_ref()
            .and_then(|s| s.scheduler_name.as_deref())
            .unwrap_or("default-scheduler");
        self.profiles.iter().position(|p| p.scheduler_name == name)
    }

    fn event(&mut self, e: ClusterEvent) {
        self.queue.on_event(e, Instant::now());
    }

    fn handle(&mut self, m: Msg) {
        match m {
            Msg::Node(n) => {
                for e in self.cache.upsert_node(n) {
                    self.event(e);
                }
            }
            Msg::NodeGone(name) => self.cache.remove_node(&name),
            Msg::Tenants => self.tenants_changed(),
            Msg::Namespaces => self.rescope(),
            Msg::Budgets => self.budgets_changed(),
            Msg::PodGroup(key, spec) => {
                if self.gangs.spec(&key) != spec {
                    self.gangs.set_spec(&key, spec);
                    self.event(ClusterEvent::PodGroupChange);
                }
            }
            Msg::PodGone(p) => {
                let key = crate::key_of(&p.metadata);
                self.gangs.set_member(&key, None, false);
                self.cache.clear_nomination(&key);
                self.queue.remove(&key);
                self.enqueued_at.remove(&key);
                if let Some(uid) = p.metadata.uid.as_deref() {
                    self.waiting.reject(uid, "", "the pod was deleted");
                }
                if self.cache.remove_pod(&key) {
                    self.event(ClusterEvent::AssignedPodDelete);
                }
            }
            Msg::Pod(p) => {
                let key = crate::key_of(&p.metadata);
                let node = p
                    .spec
                    .as_ref()
                    .and_then(|s| s.node_name.clone())
                    .filter(|n| !n.is_empty());
                let terminal = matches!(phase(&p), "Succeeded" | "Failed");
                let gang =
                    gang_of(&p).filter(|_| !terminal && p.metadata.deletion_timestamp.is_none());
                if (gang.is_some() || self.gangs.is_member(&key))
                    && self.gangs.set_member(&key, gang.as_deref(), node.is_some())
                {
                    self.event(ClusterEvent::PodGroupChange);
                }
                match node {
                    Some(_) if terminal => {
                        self.queue.remove(&key);
                        if self.cache.remove_pod(&key) {
                            self.event(ClusterEvent::AssignedPodDelete);
                        }
                    }
                    Some(node) => {
                        self.queue.remove(&key);
                        // `enqueued_at` stays: the pod's binding (ours, still in flight when
                        // the API's event comes first) observes its wait when its outcome
                        // arrives; a pod bound by someone else leaves it with PodGone.
                        self.cache.clear_nomination(&key);
                        let cached = self.cache.pod(&key);
                        let terminating = p.metadata.deletion_timestamp.is_some()
                            && cached.is_some_and(|c| c.pod.metadata.deletion_timestamp.is_none());
                        let relabelled =
                            cached.is_some_and(|c| c.pod.metadata.labels != p.metadata.labels);
                        if terminating || relabelled {
                            // Counted again as it is now: a terminating pod still holds its
                            // resources but is no longer spread or matched; a relabelled one
                            // is matched by other selectors.
                            self.cache.remove_pod(&key);
                            self.cache.confirm_pod(Arc::new(PodInfo::new(p)), &node);
                            self.event(ClusterEvent::AssignedPodDelete);
                            if relabelled && !terminating {
                                self.event(ClusterEvent::AssignedPodAdd);
                            }
                        } else if !self.cache.confirm_existing(&key, &node) {
                            self.cache.confirm_pod(Arc::new(PodInfo::new(p)), &node);
                            self.event(ClusterEvent::AssignedPodAdd);
                        }
                    }
                    None => {
                        if p.metadata.deletion_timestamp.is_some() || terminal {
                            self.queue.remove(&key);
                        } else if self.profile_of(&p).is_some() && !self.cache.is_assumed(&key) {
                            self.enqueued_at.entry(key).or_insert_with(Instant::now);
                            self.queue.add_or_update(Arc::new(PodInfo::new(p)));
                        }
                    }
                }
            }
        }
    }

    /// Places up to `workers` pods at once (Omega's optimistic concurrency on one shared
    /// state). Each decision is made in parallel against the cache as it is — nothing writes
    /// it meanwhile. Then, in queue order, each is committed if what it read has not moved
    /// since: its node took no other pod (the node's generation), and for a pod whose
    /// filters count pods on other nodes (spreading, pod affinity) no pod was placed at all.
    /// A stale decision is a conflict: it is made again against the cache as it now is,
    /// alone, so it cannot conflict twice. Nothing is ever committed that Filter did not
    /// pass against the state it is committed into.
    async fn schedule_round(&mut self, batch: Vec<QueuedPod>) {
        let started = Instant::now();
        let cpu = thread_cpu();
        let mut jobs = Vec::with_capacity(batch.len());
        for qp in batch {
            match self.profile_of(&qp.info.pod) {
                Some(pi) => {
                    self.prepare_counters(pi, &qp.info);
                    jobs.push((pi, qp));
                }
                None => self.queue.done(&qp.info.key),
            }
        }
        if jobs.is_empty() {
            return;
        }
        // Each decision measures its own thread's CPU (the loop's thread makes one too).
        let mut spent = thread_cpu().saturating_sub(cpu);
        let decisions = self.decide_all(&jobs);
        spent += decisions.iter().map(|d| d.cpu).sum::<Duration>();
        if let Some(m) = &self.metrics {
            let reused = decisions.iter().map(|d| d.reused).sum();
            m.count_memo(reused, decisions.iter().map(|d| d.judged).sum());
        }
        let cpu = thread_cpu();
        let results = self.commit_round(jobs, decisions);
        spent += thread_cpu().saturating_sub(cpu);
        if let Some(m) = &self.metrics {
            m.cycle_cpu.inc_by(spent.as_secs_f64());
        }
        for (pi, qp, result) in results {
            self.after_attempt(pi, qp, result, started).await;
        }
    }

    /// Commits a round's decisions in the order given: each that is still current, and
    /// each stale one made again first (see [`schedule_round`](Self::schedule_round));
    /// preemption's nominations are made here too, so the next commit sees them.
    fn commit_round(
        &mut self,
        jobs: Vec<(usize, QueuedPod)>,
        decisions: Vec<Decision>,
    ) -> Vec<(usize, QueuedPod, Attempt)> {
        let mut out = Vec::with_capacity(jobs.len());
        // Set once a pod with required anti-affinity is placed: its terms now keep other pods
        // out of its domain, so every later decision of the round is stale.
        let mut repels = false;
        for ((pi, qp), mut d) in jobs.into_iter().zip(decisions) {
            if let Some(kind) = self.stale(pi, &qp.info, &mut d, repels) {
                if let Some(m) = &self.metrics {
                    m.conflicts.with_label_values(&[kind]).inc();
                }
                d = self.decide_afresh(pi, &qp.info);
            }
            let placing = matches!(d.verdict, Verdict::Place(_));
            let mut result = self.conclude(pi, &qp, d.state, d.verdict);
            repels |= placing && result.is_ok() && has_required_anti_affinity(&qp.info);
            if let Err(Failure::Unschedulable { nomination, .. }) = &mut result
                && let Some(n) = nomination.take()
            {
                self.preempt(&qp.info, *n);
            }
            out.push((pi, qp, result));
        }
        out
    }

    /// Every job's decision, made at once against the cache as it is: on the worker pool
    /// (the loop's thread takes the first), each starting its filter walk at a different
    /// part of the node list so that they seldom choose the same node.
    fn decide_all(&mut self, jobs: &[(usize, QueuedPod)]) -> Vec<Decision> {
        let n = self.cache.nodes().len().max(1);
        let k = jobs.len();
        // Finding the pods' classes is the loop thread's work: counted with its decision.
        let prepare_cpu = thread_cpu();
        let memo = self.cache.memo_mut();
        memo.next_round();
        let slots: Vec<_> = jobs
            .iter()
            .map(|(pi, qp)| memo.prepare(*pi, &qp.info, n))
            .collect();
        let prepare_cpu = thread_cpu().saturating_sub(prepare_cpu);
        let inputs: Vec<DecideInput<'_>> = (0..k)
            .map(|i| DecideInput {
                profile: &self.profiles[jobs[i].0],
                cache: &self.cache,
                percentage: self.percentage,
                start: (self.next_start + i * n / k) % n,
                memo: slots[i].map(|s| self.cache.memo().at(s)),
            })
            .collect();
        let mut decisions = match &self.pool {
            Some(pool) if k > 1 => {
                let mut out: Vec<Option<Decision>> = (0..k).map(|_| None).collect();
                pool.in_place_scope(|s| {
                    let (first, rest) = out.split_first_mut().expect("k > 1");
                    for ((slot, input), (_, qp)) in
                        rest.iter_mut().zip(&inputs[1..]).zip(&jobs[1..])
                    {
                        s.spawn(move |_| *slot = Some(decide(input, &qp.info, &mut random_tie)));
                    }
                    *first = Some(decide(&inputs[0], &jobs[0].1.info, &mut random_tie));
                });
                out.into_iter()
                    .map(|d| d.expect("every spawned decision is made before the scope ends"))
                    .collect()
            }
            _ => inputs
                .iter()
                .zip(jobs)
                .map(|(input, (_, qp))| decide(input, &qp.info, &mut random_tie))
                .collect::<Vec<_>>(),
        };
        drop(inputs);
        if let Some(first) = decisions.first_mut() {
            first.cpu += prepare_cpu;
        }
        let looked = decisions.iter().map(|d| d.looked).max().unwrap_or(0);
        self.advance(looked * k);
        decisions
    }

    /// Why decision `d` may no longer be committed as it was made (the conflict's kind),
    /// if it may not. A placement whose node took another pod is a conflict. One whose node
    /// did not move but that read other nodes (spreading, pod affinity), or that a placed
    /// pod's anti-affinity may now repel, is checked again on its node against the cache as
    /// it now is ([`cycle::revalidate`]): if it still passes it is committed with the fresh
    /// state (`d.state` is replaced), and only otherwise is it a conflict.
    fn stale(
        &self,
        pi: usize,
        pod: &PodInfo,
        d: &mut Decision,
        repels: bool,
    ) -> Option<&'static str> {
        if d.generation == self.cache.generation() {
            return None;
        }
        match &d.verdict {
            Verdict::Place(p) => {
                let moved = self
                    .cache
                    .node(&p.name)
                    .is_none_or(|n| n.generation > d.generation);
                if moved {
                    return Some("placement");
                }
                if !(p.wide || repels) {
                    return None;
                }
                match cycle::revalidate(&self.profiles[pi], &self.cache, pod, &p.name) {
                    Some(state) => {
                        d.state = state;
                        None
                    }
                    None => Some("placement"),
                }
            }
            // Pods placed since may be what it waited for (pod affinity, a spread domain
            // catching up).
            Verdict::Rejected { .. } | Verdict::NoFit { .. } => Some("rejection"),
            Verdict::Error(_) => None,
        }
    }

    /// What follows an attempt: the binding cycle for a placed pod; for one that could not
    /// be placed, its preemption (if PostFilter chose victims), its queue and its reason.
    async fn after_attempt(&mut self, pi: usize, qp: QueuedPod, result: Attempt, started: Instant) {
        let outcome = match result {
            Ok((node, state, wait)) => {
                self.queue.done(&qp.info.key);
                self.event(ClusterEvent::AssignedPodAdd);
                self.spawn_binding(pi, qp.clone(), node, state, wait).await;
                "scheduled"
            }
            Err(Failure::Unschedulable {
                message,
                events,
                status,
                ..
            }) => {
                tracing::debug!(pod = %qp.info.key, plugin = status.plugin, %message, "unschedulable");
                let mates = self
                    .queue
                    .unschedulable(&qp.info.key, events, Instant::now());
                self.report_unschedulable(&qp.info, &message);
                self.report_gang_backoff(&qp.info, &mates, &message);
                "unschedulable"
            }
            Err(Failure::Error(status)) => {
                tracing::warn!(pod = %qp.info.key, plugin = status.plugin, error = %status.message(), "scheduling failed");
                let mates = self.queue.failed(&qp.info.key, Instant::now());
                self.report_unschedulable(&qp.info, &status.message());
                self.report_gang_backoff(&qp.info, &mates, &status.message());
                "error"
            }
        };
        if let Some(m) = &self.metrics {
            let name = &self.profiles[pi].scheduler_name;
            m.attempts.with_label_values(&[outcome, name]).inc();
            m.attempt_duration
                .with_label_values(&[outcome])
                .observe(started.elapsed().as_secs_f64());
        }
    }
}

/// True if `pod` has required pod anti-affinity terms (which keep other pods away from it).
fn has_required_anti_affinity(pod: &PodInfo) -> bool {
    pod.pod
        .spec
        .as_ref()
        .and_then(|s| s.affinity.as_ref())
        .and_then(|a| a.pod_anti_affinity.as_ref())
        .and_then(|a| {
            a.required_during_scheduling_ignored_during_execution
                .as_ref()
        })
        .is_some_and(|t| !t.is_empty())
}

/// kube-scheduler's `DefaultSelector`: the selectors of the Services that select the pod,
/// and of its controlling ReplicaSet or StatefulSet, all together (`None` if none).
fn default_selector(
    pod: &Pod,
    services: &PodCache<Service>,
    replicasets: &PodCache<ReplicaSet>,
    statefulsets: &PodCache<StatefulSet>,
) -> Option<LabelSelector> {
    let ns = pod.metadata.namespace.as_deref().unwrap_or("");
    let labels = tessera_runtime::informer::labels_of(&pod.metadata);
    let mut merged = std::collections::BTreeMap::new();
    for s in services.in_namespace(ns) {
        if let Some(sel) = s.spec.as_ref().and_then(|s| s.selector.as_ref())
            && !sel.is_empty()
            && sel.iter().all(|(k, v)| labels.get(k) == Some(v))
        {
            merged.extend(sel.iter().map(|(k, v)| (k.clone(), v.clone())));
        }
    }
    let mut reqs: Vec<Requirement> = merged
        .into_iter()
        .map(|(key, v)| Requirement {
            key,
            operator: Operator::Equals,
            values: vec![v],
        })
        .collect();
    if let Some(owner) = tessera_runtime::informer::controller_of(&pod.metadata) {
        let key = format!("{ns}/{}", owner.name);
        let sel = match owner.kind.as_str() {
            "ReplicaSet" => replicasets
                .get(&key)
                .and_then(|r| r.spec.as_ref().map(|s| s.selector.clone())),
            "StatefulSet" => statefulsets
                .get(&key)
                .and_then(|s| s.spec.as_ref().map(|s| s.selector.clone())),
            _ => None,
        };
        if let Some(s) = sel.and_then(|s| tessera_runtime::selector::from_metav1(&s).ok()) {
            reqs.extend(s.requirements().iter().cloned());
        }
    }
    (!reqs.is_empty()).then(|| LabelSelector::from_requirements(reqs))
}

/// CPU time this thread has used (what a cycle costs, whatever else runs on the machine).
fn thread_cpu() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    Duration::new(
        t.tv_sec.max(0) as u64,
        t.tv_nsec.clamp(0, 999_999_999) as u32,
    )
}

fn res(plural: &str) -> &'static tessera_client::catalog::Resource {
    find_resource("", "v1", plural).expect("core resources are served")
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use tessera_client::request::ApiRequest;
    use tessera_client::response::ApiResponse;
    use tessera_client::status::ApiError;

    use super::*;
    use crate::config::SchedulerConfig;

    /// The cycle is pure over the cache: nothing may reach the API.
    struct NoApi;

    #[async_trait::async_trait]
    impl Client for NoApi {
        async fn call(&self, _: ApiRequest) -> Result<ApiResponse, ApiError> {
            panic!("a scheduling cycle called the API")
        }
    }

    fn scheduler(percentage: Option<u32>, nodes: usize, cpu: &str) -> Scheduler {
        let config = SchedulerConfig {
            percentage_of_nodes_to_score: percentage,
            ..SchedulerConfig::default()
        };
        let mut s = Scheduler::new(
            Arc::new(NoApi),
            SchedulerOptions {
                config,
                metrics: None,
                runtime_metrics: None,
                informers: None,
            },
        )
        .expect("scheduler");
        for i in 0..nodes {
            s.handle(Msg::Node(node(&format!("n{i}"), cpu)));
        }
        s
    }

    fn node(name: &str, cpu: &str) -> Arc<Node> {
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": name},
                "status": {"allocatable": {"cpu": cpu, "memory": "4Gi", "pods": "110"},
                    "conditions": [{"type": "Ready", "status": "True"}]}}))
            .expect("node"),
        )
    }

    /// `pod` in the queue, never tried.
    fn fresh(pod: Arc<Pod>) -> QueuedPod {
        QueuedPod {
            info: Arc::new(PodInfo::new(pod)),
            enqueued: 0,
            order: 0,
            attempts: 0,
        }
    }

    fn queued(name: &str, cpu: &str) -> QueuedPod {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "t", "uid": format!("uid-{name}")},
            "spec": {"containers": [{"name": "c", "image": "x",
                "resources": {"requests": {"cpu": cpu}}}]}}))
        .expect("pod");
        fresh(Arc::new(pod))
    }

    fn labelled_pod(
        name: &str,
        node: Option<&str>,
        labels: serde_json::Value,
        spec: serde_json::Value,
    ) -> Arc<Pod> {
        let mut spec = spec;
        spec["containers"] = json!([{"name": "c", "image": "x"}]);
        if let Some(n) = node {
            spec["nodeName"] = json!(n);
        }
        Arc::new(
            serde_json::from_value(json!({"metadata": {"name": name, "namespace": "t",
                "uid": format!("uid-{name}"), "labels": labels}, "spec": spec}))
            .expect("pod"),
        )
    }

    /// A bound pod whose labels change is counted by what it now matches: the pod its old
    /// labels kept off the node by anti-affinity fits once they change. Such a rejection
    /// waits for a pod to go (or a node), not for one to arrive.
    #[tokio::test]
    async fn relabelled_pods_are_counted_again_and_anti_affinity_waits_for_deletes() {
        let mut s = scheduler(None, 0, "4");
        s.handle(Msg::Node(Arc::new(
            serde_json::from_value(json!({"metadata": {"name": "n0",
                "labels": {"kubernetes.io/hostname": "n0"}},
                "status": {"allocatable": {"cpu": "4", "memory": "4Gi", "pods": "110"}}}))
            .expect("node"),
        )));
        s.handle(Msg::Pod(labelled_pod(
            "web",
            Some("n0"),
            json!({"app": "web"}),
            json!({}),
        )));
        let anti = json!({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
            [{"labelSelector": {"matchLabels": {"app": "web"}}, "topologyKey": "kubernetes.io/hostname"}]}}});
        let incoming = fresh(labelled_pod("solo", None, json!({}), anti));
        s.prepare_counters(0, &incoming.info);
        match s.cycle(0, &incoming) {
            Err(Failure::Unschedulable {
                message, events, ..
            }) => {
                assert_eq!(
                    message,
                    "0/1 nodes are available: 1 node(s) didn't match pod anti-affinity rules. preemption: 0/1 nodes are available: 1 No preemption victims found for incoming pod."
                );
                assert!(
                    events.contains(&ClusterEvent::AssignedPodDelete),
                    "{events:?}"
                );
                assert!(
                    !events.contains(&ClusterEvent::AssignedPodAdd),
                    "{events:?}"
                );
            }
            _ => panic!("the web pod keeps the solo pod off n0"),
        }
        s.handle(Msg::Pod(labelled_pod(
            "web",
            Some("n0"),
            json!({"app": "api"}),
            json!({}),
        )));
        s.prepare_counters(0, &incoming.info);
        let (node, _, _) = s.cycle(0, &incoming).ok().expect("fits once relabelled");
        assert_eq!(node, "n0");
    }

    /// kube-scheduler's numFeasibleNodesToFind, in its numbers.
    #[test]
    fn feasible_nodes_to_find_follows_kube_scheduler() {
        for (all, pct, want) in [
            (0, 0, 0),
            (50, 0, 50),
            (99, 10, 99),
            (100, 0, 100),
            (1_000, 0, 420),     // 50% - 1000/125 = 42%
            (5_000, 0, 500),     // 50% - 40 = 10%
            (6_000, 0, 300),     // 50% - 48 = 2%, raised to the 5% floor
            (100_000, 0, 5_000), // 5% floor
            (1_000, 5, 100),     // 50 nodes, raised to the 100 minimum
            (5_000, 30, 1_500),
            (5_000, 100, 5_000),
            (5_000, 150, 5_000),
        ] {
            assert_eq!(
                feasible_nodes_to_find(all, pct),
                want,
                "{all} nodes at {pct}%"
            );
        }
    }

    /// Each cycle assumes its pod into the cache, so the next one sees the node as used: no
    /// node is ever given more than it has, and the pod that fits nowhere is told why.
    #[tokio::test]
    async fn cycles_see_each_others_reservations_and_explain_a_misfit() {
        let mut s = scheduler(None, 3, "1");
        let mut placed = HashMap::new();
        for i in 0..3 {
            let (node, _, wait) = s
                .cycle(0, &queued(&format!("p{i}"), "600m"))
                .ok()
                .expect("fits");
            assert!(wait.is_none());
            *placed.entry(node).or_insert(0) += 1;
        }
        assert_eq!(placed.len(), 3, "one 600m pod per 1-cpu node: {placed:?}");
        match s.cycle(0, &queued("big", "600m")) {
            Err(Failure::Unschedulable { message, .. }) => {
                assert_eq!(
                    message,
                    "0/3 nodes are available: 3 Insufficient cpu. preemption: 0/3 nodes are available: 3 No preemption victims found for incoming pod."
                )
            }
            _ => panic!("a fourth 600m pod fits nowhere"),
        }
        // A small one still fits in what is left.
        assert!(s.cycle(0, &queued("small", "400m")).is_ok());
    }

    /// On a large shard a cycle stops once it found the nodes it samples, and the next cycle
    /// starts where it stopped (kube-scheduler's round robin), so all nodes get looked at.
    #[tokio::test]
    async fn sampling_stops_at_the_wanted_count_and_rotates() {
        let mut s = scheduler(Some(10), 1_000, "8");
        assert_eq!(feasible_nodes_to_find(1_000, 10), 100);
        s.cycle(0, &queued("a", "1")).ok().expect("fits");
        assert_eq!(s.next_start, 100, "looked at exactly the 100 it wanted");
        s.cycle(0, &queued("b", "1")).ok().expect("fits");
        assert_eq!(s.next_start, 200, "and went on from there");
        // Nodes that do not fit are passed over without counting towards the sample.
        let mut small_first = scheduler(Some(10), 1_000, "8");
        for i in 0..100 {
            small_first.handle(Msg::Node(node(&format!("n{i}"), "500m")));
        }
        small_first
            .cycle(0, &queued("late", "1"))
            .ok()
            .expect("fits");
        assert_eq!(
            small_first.next_start, 200,
            "100 small nodes skipped, 100 feasible found"
        );
    }

    /// The API's event for a pod bound by this scheduler may come before the binding's own
    /// outcome: the pod's time in the queue is still there for the outcome to observe (it
    /// was dropped, and the per-tenant and end-to-end wait histograms missed such pods).
    #[test]
    fn a_bound_pods_event_before_its_binding_outcome_keeps_its_queue_time() {
        let mut s = parallel(1, None);
        s.handle(Msg::Node(host("n0", "4")));
        s.handle(Msg::Pod(labelled_pod("p", None, json!({}), json!({}))));
        assert!(s.enqueued_at.contains_key("t/p"), "queued: its wait starts");
        s.handle(Msg::Pod(labelled_pod(
            "p",
            Some("n0"),
            json!({}),
            json!({}),
        )));
        assert!(
            s.enqueued_at.contains_key("t/p"),
            "bound, its outcome not yet in: the wait is kept for it"
        );
        s.handle(Msg::PodGone(labelled_pod(
            "p",
            Some("n0"),
            json!({}),
            json!({}),
        )));
        assert!(
            s.enqueued_at.is_empty(),
            "a deleted pod leaves nothing behind"
        );
    }

    fn parallel(workers: u32, metrics: Option<SchedulerMetrics>) -> Scheduler {
        let config = SchedulerConfig {
            parallelism: Some(workers),
            ..SchedulerConfig::default()
        };
        Scheduler::new(
            Arc::new(NoApi),
            SchedulerOptions {
                config,
                metrics,
                runtime_metrics: None,
                informers: None,
            },
        )
        .expect("scheduler")
    }

    fn host(name: &str, cpu: &str) -> Arc<Node> {
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
                "status": {"allocatable": {"cpu": cpu, "memory": "4Gi", "pods": "110"}}}))
            .expect("node"),
        )
    }

    /// A decision reads the snapshot and nothing else: the same snapshot and pod give the
    /// same answer, the tie-breaker alone chooses among equal nodes, and the cache is not
    /// touched (NoApi fails the test if the API is called).
    #[test]
    fn a_decision_is_a_function_of_profile_snapshot_and_pod() {
        let s = scheduler(None, 4, "4");
        let pod = queued("p", "1");
        let input = DecideInput {
            profile: &s.profiles[0],
            cache: &s.cache,
            percentage: 0,
            start: 0,
            memo: None,
        };
        let name = |d: Decision| match d.verdict {
            Verdict::Place(p) => p.name,
            other => panic!("no placement: {other:?}"),
        };
        let generation = s.cache.generation();
        // Four empty, equal nodes: keeping the first tie, or always the latest.
        let first = name(decide(&input, &pod.info, &mut |n| n - 1));
        let last = name(decide(&input, &pod.info, &mut |_| 0));
        assert_eq!(first, "n0");
        assert_eq!(last, "n3");
        assert_eq!(name(decide(&input, &pod.info, &mut |n| n - 1)), first);
        assert_eq!(s.cache.generation(), generation, "deciding wrote nothing");
        assert_eq!(s.cache.pod_count(), 0);
        // Where it starts looking is part of the input, not of hidden state.
        let d = decide(&DecideInput { start: 2, ..input }, &pod.info, &mut |n| {
            n - 1
        });
        assert_eq!(d.looked, 4, "fewer than 100 nodes: all are looked at");
    }

    /// Two workers decide against one snapshot with room for one pod: both choose the only
    /// node; the first commits, the second's node moved, so it is decided again (a conflict)
    /// and fits nowhere — never both on the node.
    #[tokio::test]
    async fn a_conflicting_placement_is_decided_again_not_committed() {
        let metrics = SchedulerMetrics::unregistered().expect("metrics");
        let mut s = parallel(2, Some(metrics.clone()));
        s.handle(Msg::Node(host("only", "1")));
        let jobs = vec![(0, queued("a", "800m")), (0, queued("b", "800m"))];
        let decisions = s.decide_all(&jobs);
        for d in &decisions {
            assert!(matches!(&d.verdict, Verdict::Place(p) if p.name == "only"));
        }
        let results = s.commit_round(jobs, decisions);
        assert!(results[0].2.is_ok(), "the first commits");
        match &results[1].2 {
            Err(Failure::Unschedulable { message, .. }) => {
                assert!(message.contains("1 Insufficient cpu"), "{message}")
            }
            other => panic!("the second must not be placed: {:?}", other.is_ok()),
        }
        assert_eq!(metrics.conflicts("placement"), 1);
        assert_eq!(s.cache.nodes()[0].requested.milli_cpu, 800);
    }

    /// Four nodes, n0 and n1 in zone a, n2 in b, n3 in c; two workers.
    fn zoned() -> (Scheduler, SchedulerMetrics) {
        let metrics = SchedulerMetrics::unregistered().expect("metrics");
        let mut s = parallel(2, Some(metrics.clone()));
        for (name, zone) in [("n0", "a"), ("n1", "a"), ("n2", "b"), ("n3", "c")] {
            s.handle(Msg::Node(Arc::new(
                serde_json::from_value(json!({"metadata": {"name": name,
                    "labels": {"kubernetes.io/hostname": name, "topology.kubernetes.io/zone": zone}},
                    "status": {"allocatable": {"cpu": "4", "memory": "4Gi", "pods": "110"}}}))
                .expect("node"),
            )));
        }
        (s, metrics)
    }

    /// A pod labelled app=web that repels app=web pods over `key`.
    fn repelling_web(name: &str, key: &str) -> QueuedPod {
        fresh(labelled_pod(
            name,
            None,
            json!({"app": "web"}),
            json!({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                [{"labelSelector": {"matchLabels": {"app": "web"}}, "topologyKey": key}]}}}),
        ))
    }

    /// Decides `pods` at once against one snapshot, each starting at its node of `starts`
    /// and keeping the first tie (so each picks that node), then commits them in order.
    fn round_from(s: &mut Scheduler, pods: Vec<QueuedPod>, starts: &[usize]) -> Vec<String> {
        let jobs: Vec<(usize, QueuedPod)> = pods.into_iter().map(|p| (0, p)).collect();
        for (pi, qp) in &jobs {
            s.prepare_counters(*pi, &qp.info);
        }
        let decisions: Vec<Decision> = jobs
            .iter()
            .zip(starts)
            .map(|((pi, qp), &start)| {
                let input = DecideInput {
                    profile: &s.profiles[*pi],
                    cache: &s.cache,
                    percentage: 0,
                    start,
                    memo: None,
                };
                let d = decide(&input, &qp.info, &mut |n| n - 1);
                assert!(
                    matches!(&d.verdict, Verdict::Place(p) if p.name == format!("n{start}")),
                    "{:?}",
                    d.verdict
                );
                d
            })
            .collect();
        s.commit_round(jobs, decisions)
            .into_iter()
            .map(|(_, _, r)| r.ok().expect("placed").0)
            .collect()
    }

    /// A placement whose filters count pods on other nodes (required anti-affinity here) is
    /// checked again on its node once another pod was placed in its round: still valid, it
    /// commits; repelled by the pod placed meanwhile, it is a conflict and is decided again.
    #[tokio::test]
    async fn placements_that_read_other_nodes_are_checked_again_after_any_commit() {
        // Hostname anti-affinity on different nodes: the second still passes on n1.
        let (mut s, metrics) = zoned();
        let host = "kubernetes.io/hostname";
        let placed = round_from(
            &mut s,
            vec![repelling_web("h1", host), repelling_web("h2", host)],
            &[0, 1],
        );
        assert_eq!(placed, ["n0", "n1"]);
        assert_eq!(metrics.conflicts("placement"), 0);
        // Zone anti-affinity: z1 commits on n0 (zone a); z2, decided on n1 (zone a too, its
        // node untouched), is repelled once checked again and decided afresh: zone b or c.
        let (mut s, metrics) = zoned();
        let zone = "topology.kubernetes.io/zone";
        let placed = round_from(
            &mut s,
            vec![repelling_web("z1", zone), repelling_web("z2", zone)],
            &[0, 1],
        );
        assert_eq!(placed[0], "n0");
        assert!(placed[1] == "n2" || placed[1] == "n3", "{placed:?}");
        assert_eq!(metrics.conflicts("placement"), 1);
    }

    /// A verdict in a form that compares (reasons sorted; events as a set).
    fn outcome(v: &Verdict) -> String {
        match v {
            Verdict::Place(p) => format!("place {} wide={}", p.name, p.wide),
            Verdict::Rejected { status, .. } => format!("rejected {:?}", status.reasons),
            Verdict::NoFit {
                reasons,
                failed,
                wake_on,
            } => {
                let mut r: Vec<_> = reasons.iter().collect();
                r.sort();
                let mut w: Vec<String> = wake_on.iter().map(|e| format!("{e:?}")).collect();
                w.sort();
                format!("nofit {r:?} {failed:?} {w:?}")
            }
            Verdict::Error(s) => format!("error {:?}", s.reasons),
        }
    }

    /// A node of `milli` cpu in `zone`, maybe tainted, maybe cordoned.
    fn varied_node(name: &str, milli: u16, zone: u8, tainted: bool, cordoned: bool) -> Arc<Node> {
        let taints = if tainted {
            json!([{"key": "gpu", "value": "true", "effect": "NoSchedule"}])
        } else {
            json!([])
        };
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name,
                    "topology.kubernetes.io/zone": format!("z{zone}")}},
                "spec": {"taints": taints, "unschedulable": cordoned},
                "status": {"allocatable": {"cpu": format!("{milli}m"), "memory": "4Gi", "pods": "6"}}}))
            .expect("node"),
        )
    }

    /// Replicas of five templates: plain; pinned to zone z0; tolerating the taint; spread
    /// over zones; repelling each other per host.
    fn replica(template: u8, i: usize) -> QueuedPod {
        let (labels, mut spec) = match template {
            0 => (json!({"app": "plain"}), json!({})),
            1 => (
                json!({"app": "pinned"}),
                json!({"nodeSelector": {"topology.kubernetes.io/zone": "z0"}}),
            ),
            2 => (
                json!({"app": "gpu"}),
                json!({"tolerations": [{"key": "gpu", "operator": "Exists"}]}),
            ),
            3 => (
                json!({"app": "spread"}),
                json!({"topologySpreadConstraints": [{"maxSkew": 1,
                "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "DoNotSchedule",
                "labelSelector": {"matchLabels": {"app": "spread"}}}]}),
            ),
            _ => (
                json!({"app": "db"}),
                json!({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                [{"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": "kubernetes.io/hostname"}]}}}),
            ),
        };
        spec["containers"] = json!([{"name": "c", "image": "x",
            "resources": {"requests": {"cpu": "300m"}}}]);
        let pod: Pod = serde_json::from_value(json!({"metadata": {"name": format!("r{template}-{i}"),
            "namespace": "t", "uid": format!("uid-{template}-{i}"), "labels": labels}, "spec": spec}))
            .expect("pod");
        fresh(Arc::new(pod))
    }

    #[derive(Debug, Clone)]
    enum Step {
        /// A replica of a template, decided from a node index.
        Pod(u8, usize),
        /// A node changes: cpu, zone, taint, cordon.
        Node(usize, u16, u8, bool, bool),
        /// A replica of a template is nominated to a node (room held there).
        Nominate(u8, usize),
    }

    /// A node's cpu (milli), zone, taint and cordon.
    type NodeShape = (u16, u8, bool, bool);

    fn steps() -> impl proptest::strategy::Strategy<Value = (Vec<NodeShape>, Vec<Step>)> {
        use proptest::prelude::*;
        let node = (
            300u16..2000,
            0u8..3,
            any::<bool>(),
            proptest::bool::weighted(0.1),
        );
        let step = prop_oneof![
            8 => (0u8..5, 0usize..64).prop_map(|(t, s)| Step::Pod(t, s)),
            2 => (0usize..64, 300u16..2000, 0u8..3, any::<bool>(), proptest::bool::weighted(0.1))
                .prop_map(|(i, m, z, t, c)| Step::Node(i, m, z, t, c)),
            1 => (0u8..5, 0usize..64).prop_map(|(t, n)| Step::Nominate(t, n)),
        ];
        (
            proptest::collection::vec(node, 1..12),
            proptest::collection::vec(step, 1..60),
        )
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(96))]
        /// Remembering the local filters' results for alike pods never changes a decision:
        /// whatever the nodes did meanwhile (took pods, changed resources, labels, taints,
        /// cordons, held room for a nominated pod), a replica decided with its class's memo
        /// gets exactly the verdict it gets without — the same node, or the same reasons.
        #[test]
        fn remembered_filter_results_never_change_a_decision((nodes, steps) in steps()) {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
            rt.block_on(async {
                let mut s = parallel(1, None);
                for (i, &(m, z, t, c)) in nodes.iter().enumerate() {
                    s.handle(Msg::Node(varied_node(&format!("n{i}"), m, z, t, c)));
                }
                // Decides `qp` from `start` with its class's memo and without: the same verdict.
                type Checked = Result<Decision, proptest::test_runner::TestCaseError>;
                let check = |s: &mut Scheduler, qp: &QueuedPod, start: usize| -> Checked {
                    s.prepare_counters(0, &qp.info);
                    let n = s.cache.nodes().len();
                    let memo = s.cache.memo_mut();
                    memo.next_round();
                    let slot = memo.prepare(0, &qp.info, n).expect("a class");
                    let input = DecideInput {
                        profile: &s.profiles[0],
                        cache: &s.cache,
                        percentage: 0,
                        start: start % n,
                        memo: None,
                    };
                    let plain = decide(&input, &qp.info, &mut |n| n - 1);
                    let with = decide(&DecideInput { memo: Some(s.cache.memo().at(slot)), ..input },
                        &qp.info, &mut |n| n - 1);
                    proptest::prop_assert_eq!(outcome(&plain.verdict), outcome(&with.verdict));
                    proptest::prop_assert_eq!(plain.looked, with.looked);
                    Ok(with)
                };
                for (i, step) in steps.iter().enumerate() {
                    match *step {
                        Step::Node(n, m, z, t, c) => {
                            s.handle(Msg::Node(varied_node(&format!("n{}", n % nodes.len()), m, z, t, c)));
                        }
                        Step::Nominate(t, n) => {
                            // The nominated pod, for which the room held is its own, and a
                            // sibling, for which it is taken: in either order.
                            let qp = replica(t, i);
                            s.cache.nominate(qp.info.clone(), &format!("n{}", n % nodes.len()), vec![]);
                            let sibling = replica(t, 10_000 + i);
                            let (a, b) = if i % 2 == 0 { (&qp, &sibling) } else { (&sibling, &qp) };
                            check(&mut s, a, n)?;
                            check(&mut s, b, n)?;
                        }
                        Step::Pod(t, start) => {
                            let qp = replica(t, i);
                            let d = check(&mut s, &qp, start)?;
                            // Placed pods change their nodes for the next replicas.
                            let _ = s.conclude(0, &qp, d.state, d.verdict);
                        }
                    }
                }
                Ok::<(), proptest::test_runner::TestCaseError>(())
            })?;
        }
    }

    /// Replicas of one template judge each node once and reuse the answer until the node
    /// changes: the second replica's walk over unchanged nodes is all reuse.
    #[test]
    fn a_second_replica_reuses_the_first_ones_filter_results() {
        let mut s = parallel(1, None);
        for i in 0..6 {
            s.handle(Msg::Node(varied_node(
                &format!("n{i}"),
                1000,
                (i % 3) as u8,
                i == 5,
                false,
            )));
        }
        let first = s.decide_afresh(0, &replica(1, 0).info);
        assert_eq!(
            (first.judged, first.reused),
            (6, 0),
            "every node judged once"
        );
        // The same template, another replica: nothing changed, nothing judged again.
        let second = s.decide_afresh(0, &replica(1, 1).info);
        assert_eq!((second.judged, second.reused), (0, 6));
        for d in [&first, &second] {
            assert!(
                matches!(&d.verdict, Verdict::Place(p) if p.name == "n0" || p.name == "n3"),
                "only zone z0 nodes: {}",
                outcome(&d.verdict)
            );
        }
        // A node that changes is judged again; another template has its own class.
        s.handle(Msg::Node(varied_node("n3", 1000, 0, false, false)));
        let third = s.decide_afresh(0, &replica(1, 2).info);
        assert_eq!((third.judged, third.reused), (1, 5));
        assert!(
            matches!(&third.verdict, Verdict::Place(p) if p.name == "n0" || p.name == "n3"),
            "only zone z0 nodes: {}",
            outcome(&third.verdict)
        );
        let other = s.decide_afresh(0, &replica(0, 3).info);
        assert_eq!((other.judged, other.reused), (6, 0));
    }

    #[derive(Debug, Clone)]
    struct Case {
        workers: u32,
        nodes: Vec<u16>,
        pods: Vec<(u16, bool, bool)>,
        seed: u64,
    }

    fn case() -> impl proptest::strategy::Strategy<Value = Case> {
        use proptest::prelude::*;
        (
            1u32..=8,
            proptest::collection::vec(500u16..4000, 1..6),
            proptest::collection::vec((100u16..1500, any::<bool>(), any::<bool>()), 1..40),
            any::<u64>(),
        )
            .prop_map(|(workers, nodes, pods, seed)| Case {
                workers,
                nodes,
                pods,
                seed,
            })
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
        /// K workers decide against one snapshot and their decisions commit in any order:
        /// no node ever holds more than its allocatable, no pod is placed twice, and no two
        /// pods that repel each other (required anti-affinity on the hostname) share a node.
        #[test]
        fn no_node_over_allocatable_and_no_pod_placed_twice_under_any_commit_order(c in case()) {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
            rt.block_on(async {
                let mut s = parallel(c.workers, None);
                for (i, milli) in c.nodes.iter().enumerate() {
                    s.handle(Msg::Node(host(&format!("n{i}"), &format!("{milli}m"))));
                }
                let anti = json!({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                    [{"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": "kubernetes.io/hostname"}]}}});
                let mut pending: Vec<QueuedPod> = c.pods.iter().enumerate().map(|(i, &(milli, db, repels))| {
                    let mut spec = if repels { anti.clone() } else { json!({}) };
                    spec["containers"] = json!([{"name": "c", "image": "x",
                        "resources": {"requests": {"cpu": format!("{milli}m")}}}]);
                    let labels = if db { json!({"app": "db"}) } else { json!({}) };
                    let pod: Pod = serde_json::from_value(json!({"metadata": {"name": format!("p{i}"),
                        "namespace": "t", "uid": format!("uid-{i}"), "labels": labels}, "spec": spec}))
                        .expect("pod");
                    fresh(Arc::new(pod))
                }).collect();
                let mut placed: HashMap<String, String> = HashMap::new();
                let mut rng = c.seed | 1;
                // Each pod gets a few rounds; the unplaced ones go round again.
                for _ in 0..3 {
                    let mut next = Vec::new();
                    for chunk in pending.chunks(c.workers as usize) {
                        let mut jobs: Vec<(usize, QueuedPod)> = chunk.iter().map(|q| (0, q.clone())).collect();
                        for (pi, qp) in &jobs {
                            s.prepare_counters(*pi, &qp.info);
                        }
                        let decisions = s.decide_all(&jobs);
                        // Commit in an order of the case's choosing.
                        let mut pairs: Vec<_> = jobs.drain(..).zip(decisions).collect();
                        for i in (1..pairs.len()).rev() {
                            rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
                            pairs.swap(i, (rng % (i as u64 + 1)) as usize);
                        }
                        let (jobs, decisions): (Vec<_>, Vec<_>) = pairs.into_iter().unzip();
                        for (_, qp, result) in s.commit_round(jobs, decisions) {
                            match result {
                                Ok((node, _, _)) => {
                                    proptest::prop_assert!(
                                        placed.insert(qp.info.key.clone(), node).is_none(),
                                        "{} placed twice", qp.info.key
                                    );
                                }
                                Err(_) => next.push(qp),
                            }
                        }
                        for n in s.cache.nodes() {
                            proptest::prop_assert!(
                                n.requested.milli_cpu <= n.allocatable.milli_cpu,
                                "{} holds {}m of {}m", n.name, n.requested.milli_cpu, n.allocatable.milli_cpu
                            );
                            let labelled = |p: &PodInfo| p.pod.metadata.labels.as_ref()
                                .and_then(|l| l.get("app")).is_some_and(|a| a == "db");
                            let repelling = n.pods.iter().any(|p| has_required_anti_affinity(p));
                            let dbs = n.pods.iter().filter(|p| labelled(p)).count();
                            let repelled = n.pods.iter().filter(|p| has_required_anti_affinity(p)
                                && n.pods.iter().any(|q| q.key != p.key && labelled(q))).count();
                            proptest::prop_assert!(repelled == 0,
                                "{}: a pod with anti-affinity shares the node with app=db ({} db, repelling {})",
                                n.name, dbs, repelling);
                        }
                    }
                    pending = next;
                }
                proptest::prop_assert_eq!(s.cache.pod_count(), placed.len());
                Ok(())
            })?;
        }
    }
}
