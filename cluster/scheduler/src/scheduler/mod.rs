//! The scheduling loop: one task owns the queue and the cache, applies informer events
//! between cycles, and runs one scheduling cycle at a time ([`cycle`]: filter, score,
//! reserve, permit); binding cycles ([`binding`]) run concurrently off the loop and report
//! back.

mod binding;
mod cycle;
mod preempt;

use binding::{BindOutcome, MAX_BINDS_IN_FLIGHT};
use cycle::Failure;
pub use cycle::feasible_nodes_to_find;

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
        Ok(Scheduler {
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
            if let Some(qp) = self.queue.pop(Instant::now()) {
                self.schedule_one(qp).await;
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
                        self.enqueued_at.remove(&key);
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

    async fn schedule_one(&mut self, qp: QueuedPod) {
        let started = Instant::now();
        let Some(pi) = self.profile_of(&qp.info.pod) else {
            self.queue.done(&qp.info.key);
            return;
        };
        let cpu = thread_cpu();
        self.prepare_counters(pi, &qp.info);
        let result = self.cycle(pi, &qp);
        if let Some(m) = &self.metrics {
            m.cycle_cpu
                .inc_by(thread_cpu().saturating_sub(cpu).as_secs_f64());
        }
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
                nomination,
            }) => {
                tracing::debug!(pod = %qp.info.key, plugin = status.plugin, %message, "unschedulable");
                if let Some(n) = nomination {
                    self.preempt(&qp.info, *n);
                }
                self.queue
                    .unschedulable(&qp.info.key, events, Instant::now());
                self.report_unschedulable(&qp.info, &message);
                "unschedulable"
            }
            Err(Failure::Error(status)) => {
                tracing::warn!(pod = %qp.info.key, plugin = status.plugin, error = %status.message(), "scheduling failed");
                self.queue.failed(&qp.info.key, Instant::now());
                self.report_unschedulable(&qp.info, &status.message());
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

    fn queued(name: &str, cpu: &str) -> QueuedPod {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "t", "uid": format!("uid-{name}")},
            "spec": {"containers": [{"name": "c", "image": "x",
                "resources": {"requests": {"cpu": cpu}}}]}}))
        .expect("pod");
        QueuedPod {
            info: Arc::new(PodInfo::new(Arc::new(pod))),
            enqueued: 0,
            attempts: 0,
        }
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
        let incoming = QueuedPod {
            info: Arc::new(PodInfo::new(labelled_pod("solo", None, json!({}), anti))),
            enqueued: 0,
            attempts: 0,
        };
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
}
