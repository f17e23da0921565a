//! The scheduling loop: one task owns the queue and the cache, applies informer events
//! between cycles, and runs one scheduling cycle at a time (filter, score, reserve, permit);
//! binding cycles run concurrently off the loop and report back.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use serde_json::json;
use tessera_client::client::Client;
use tessera_client::request::{PatchType, find_resource};
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
use crate::queue::SchedulingQueue;
use crate::resources::PodInfo;

/// Fewest nodes to find feasible before scoring (kube-scheduler's minimum).
const MIN_FEASIBLE_NODES: usize = 100;
/// Bindings in flight at once.
const MAX_BINDS_IN_FLIGHT: usize = 512;

/// How many feasible nodes to look for among `all` (kube-scheduler's rule: all below 100
/// nodes; otherwise `percentage`% of them, adaptive when 0: 50% minus 1% per 125 nodes, at
/// least 5%; never fewer than 100).
pub fn feasible_nodes_to_find(all: usize, percentage: u32) -> usize {
    if all < MIN_FEASIBLE_NODES || percentage >= 100 {
        return all;
    }
    let pct = if percentage == 0 {
        (50i64 - (all as i64) / 125).max(5) as usize
    } else {
        percentage as usize
    };
    (all * pct / 100).max(MIN_FEASIBLE_NODES)
}

enum Msg {
    Node(Arc<Node>),
    NodeGone(String),
    Pod(Arc<Pod>),
    PodGone(Arc<Pod>),
}

struct BindOutcome {
    profile: usize,
    info: Arc<PodInfo>,
    node: String,
    state: Arc<CycleState>,
    status: Status,
    attempts: u32,
    started: Instant,
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
    informers: Option<Arc<Informers>>,
    enqueued_at: HashMap<String, Instant>,
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
        let handle = Handle {
            waiting: waiting.clone(),
            client: client.clone(),
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
            cache: Cache::new(),
            percentage: opts.config.percentage_of_nodes_to_score.unwrap_or(0),
            next_start: 0,
            metrics: opts.metrics,
            runtime_metrics: opts.runtime_metrics,
            binds: Arc::new(Semaphore::new(MAX_BINDS_IN_FLIGHT)),
            outcome_tx,
            outcome_rx: Some(outcome_rx),
            pods: None,
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

    fn tick(&mut self) {
        let now = Instant::now();
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
            m.cache_nodes.set(self.cache.node_count() as i64);
            m.cache_pods.set(self.cache.pod_count() as i64);
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
            Msg::PodGone(p) => {
                let key = crate::key_of(&p.metadata);
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
                        if !self.cache.confirm_existing(&key, &node) {
                            self.cache.confirm_pod(Arc::new(PodInfo::new(p)), &node);
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
        let result = self.cycle(pi, &qp);
        let outcome = match result {
            Ok((node, state, wait)) => {
                self.queue.done(&qp.info.key);
                self.spawn_binding(pi, qp.clone(), node, state, wait).await;
                "scheduled"
            }
            Err(Failure::Unschedulable {
                message,
                events,
                status,
            }) => {
                tracing::debug!(pod = %qp.info.key, plugin = status.plugin, %message, "unschedulable");
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

    /// One scheduling cycle: the chosen node, the cycle's state and a Permit wait, if any.
    #[allow(clippy::type_complexity)]
    fn cycle(
        &mut self,
        pi: usize,
        qp: &QueuedPod,
    ) -> Result<
        (
            String,
            CycleState,
            Option<(oneshot::Receiver<Status>, Duration)>,
        ),
        Failure,
    > {
        let profile = &self.profiles[pi];
        let pod = &qp.info;
        let mut state = CycleState::new();
        for (p, _) in profile.at(Point::PreFilter) {
            let Some(pf) = p.pre_filter() else { continue };
            let s = pf.pre_filter(&mut state, pod).by(p.name());
            match s.code {
                Code::Success => {}
                Code::Skip => state.skip_filter(p.name()),
                Code::Unschedulable | Code::UnschedulableAndUnresolvable => {
                    let message = format!(
                        "0/{} nodes are available: {}.",
                        self.cache.node_count(),
                        s.message()
                    );
                    let events = filter_events(profile, &[p.name()]);
                    return Err(Failure::Unschedulable {
                        message,
                        events,
                        status: s,
                    });
                }
                _ => return Err(Failure::Error(s)),
            }
        }
        // Filter, from where the previous pod stopped, until enough feasible nodes are found.
        let nodes = self.cache.nodes();
        let n = nodes.len();
        let want = feasible_nodes_to_find(self.cache.node_count(), self.percentage);
        let filters = profile.at(Point::Filter);
        let mut feasible: Vec<usize> = Vec::with_capacity(want.min(n));
        let mut reasons: HashMap<Cow<'static, str>, usize> = HashMap::new();
        let mut rejecting: Vec<&'static str> = Vec::new();
        let mut looked = 0;
        for i in 0..n {
            looked = i + 1;
            let idx = (self.next_start + i) % n;
            let node = &nodes[idx];
            if node.node.is_none() {
                continue;
            }
            let mut fits = true;
            for (p, _) in filters {
                if state.skips_filter(p.name()) {
                    continue;
                }
                let Some(f) = p.filter() else { continue };
                let s = f.filter(&state, pod, node);
                if s.is_success() {
                    continue;
                }
                if s.code == Code::Error {
                    return Err(Failure::Error(s.by(p.name())));
                }
                fits = false;
                for r in s.reasons {
                    *reasons.entry(r).or_insert(0) += 1;
                }
                if !rejecting.contains(&p.name()) {
                    rejecting.push(p.name());
                }
                break;
            }
            if fits {
                feasible.push(idx);
                if feasible.len() >= want {
                    break;
                }
            }
        }
        if n > 0 {
            self.next_start = (self.next_start + looked) % n;
        }
        if feasible.is_empty() {
            let mut rs: Vec<(Cow<'static, str>, usize)> = reasons.into_iter().collect();
            rs.sort_by(|a, b| a.0.cmp(&b.0));
            let detail: Vec<String> = rs.iter().map(|(r, c)| format!("{c} {r}")).collect();
            let mut message = format!("0/{} nodes are available", self.cache.node_count());
            if !detail.is_empty() {
                message.push_str(": ");
                message.push_str(&detail.join(", "));
            }
            message.push('.');
            // PostFilter (preemption) gets its chance.
            for (p, _) in profile.at(Point::PostFilter) {
                let Some(pf) = p.post_filter() else { continue };
                let (nominated, s) = pf.post_filter(&state, pod, &HashMap::new());
                if let Some(node) = nominated.filter(|_| s.is_success()) {
                    message.push_str(&format!(" {} nominated node {node}.", p.name()));
                    break;
                }
            }
            let events = filter_events(profile, &rejecting);
            return Err(Failure::Unschedulable {
                message,
                events,
                status: Status::unschedulable("no node fits"),
            });
        }
        let chosen = if feasible.len() == 1 {
            feasible[0]
        } else {
            self.prioritize(pi, &mut state, pod, &feasible)?
        };
        let node_name = self.cache.nodes()[chosen].name.clone();
        // Reserve: the cache first (so the next cycle sees the pod there), then plugins.
        self.cache.assume(pod.clone(), &node_name);
        let profile = &self.profiles[pi];
        let reserve = profile.at(Point::Reserve);
        for (i, (p, _)) in reserve.iter().enumerate() {
            let Some(r) = p.reserve() else { continue };
            let s = r.reserve(&mut state, pod, &node_name);
            if !s.is_success() {
                for (q, _) in reserve[..=i].iter().rev() {
                    if let Some(r) = q.reserve() {
                        r.unreserve(&state, pod, &node_name);
                    }
                }
                self.cache.forget(&pod.key);
                return Err(Failure::Error(s.by(p.name())));
            }
        }
        // Permit.
        let mut wait: Option<Duration> = None;
        let permits: Vec<_> = profile
            .at(Point::Permit)
            .iter()
            .map(|(p, _)| p.clone())
            .collect();
        for p in &permits {
            let Some(pm) = p.permit() else { continue };
            let (s, d) = pm.permit(&state, pod, &node_name);
            match s.code {
                Code::Success => {}
                Code::Wait => wait = Some(wait.map_or(d, |w| w.max(d))),
                _ => {
                    self.unreserve(pi, &state, pod, &node_name);
                    let s = s.by(p.name());
                    return Err(if s.is_rejection() {
                        Failure::Unschedulable {
                            message: format!("rejected at permit by {}: {}", p.name(), s.message()),
                            events: vec![ClusterEvent::NodeAdd, ClusterEvent::AssignedPodDelete],
                            status: s,
                        }
                    } else {
                        Failure::Error(s)
                    });
                }
            }
        }
        let wait = wait.map(|d| (self.waiting.add(pod.uid()), d));
        Ok((node_name, state, wait))
    }

    fn prioritize(
        &self,
        pi: usize,
        state: &mut CycleState,
        pod: &PodInfo,
        feasible: &[usize],
    ) -> Result<usize, Failure> {
        let profile = &self.profiles[pi];
        let all = self.cache.nodes();
        let nodes: Vec<&crate::resources::NodeInfo> = feasible.iter().map(|i| &all[*i]).collect();
        for (p, _) in profile.at(Point::PreScore) {
            let Some(ps) = p.pre_score() else { continue };
            let s = ps.pre_score(state, pod, &nodes);
            match s.code {
                Code::Success => {}
                Code::Skip => state.skip_score(p.name()),
                _ => return Err(Failure::Error(s.by(p.name()))),
            }
        }
        let mut total = vec![0i64; nodes.len()];
        let mut scores = vec![0i64; nodes.len()];
        for (p, weight) in profile.at(Point::Score) {
            if state.skips_score(p.name()) {
                continue;
            }
            let Some(sc) = p.score() else { continue };
            for (j, node) in nodes.iter().enumerate() {
                scores[j] = sc
                    .score(state, pod, node)
                    .map_err(|s| Failure::Error(s.by(p.name())))?;
            }
            let s = sc.normalize(state, pod, &mut scores);
            if !s.is_success() {
                return Err(Failure::Error(s.by(p.name())));
            }
            for (t, s) in total.iter_mut().zip(&scores) {
                *t += s * weight;
            }
        }
        // The best score; ties broken at random (reservoir sampling) so equal nodes share load.
        let mut best = 0;
        let mut ties = 0u32;
        for (j, t) in total.iter().enumerate() {
            if *t > total[best] {
                best = j;
                ties = 1;
            } else if *t == total[best] {
                ties += 1;
                if rand::random_range(0..ties) == 0 {
                    best = j;
                }
            }
        }
        Ok(feasible[best])
    }

    fn unreserve(&mut self, pi: usize, state: &CycleState, pod: &PodInfo, node: &str) {
        for (p, _) in self.profiles[pi].at(Point::Reserve).iter().rev() {
            if let Some(r) = p.reserve() {
                r.unreserve(state, pod, node);
            }
        }
        self.cache.forget(&pod.key);
    }

    async fn spawn_binding(
        &mut self,
        pi: usize,
        qp: QueuedPod,
        node: String,
        state: CycleState,
        wait: Option<(oneshot::Receiver<Status>, Duration)>,
    ) {
        let Ok(permit) = self.binds.clone().acquire_owned().await else {
            return;
        };
        let profile = &self.profiles[pi];
        let pre_bind: Vec<_> = profile
            .at(Point::PreBind)
            .iter()
            .map(|(p, _)| p.clone())
            .collect();
        let bind: Vec<_> = profile
            .at(Point::Bind)
            .iter()
            .map(|(p, _)| p.clone())
            .collect();
        let tx = self.outcome_tx.clone();
        let waiting = self.waiting.clone();
        let state = Arc::new(state);
        tokio::spawn(async move {
            let started = Instant::now();
            let pod = &qp.info;
            let mut status = Status::success();
            if let Some((rx, timeout)) = wait {
                status = match tokio::time::timeout(timeout, rx).await {
                    Ok(Ok(s)) => s,
                    Ok(Err(_)) => Status::error("the permit wait was cancelled"),
                    Err(_) => {
                        waiting.remove(pod.uid());
                        Status::unschedulable("rejected due to timeout after waiting at permit")
                    }
                };
            }
            if status.is_success() {
                for p in &pre_bind {
                    let Some(pb) = p.pre_bind() else { continue };
                    let s = pb.pre_bind(&state, pod, &node).await;
                    if !s.is_success() {
                        status = s.by(p.name());
                        break;
                    }
                }
            }
            if status.is_success() {
                status = Status::error("no bind plugin bound the pod");
                for p in &bind {
                    let Some(b) = p.bind() else { continue };
                    let s = b.bind(&state, pod, &node).await;
                    if s.code != Code::Skip {
                        status = s.by(p.name());
                        break;
                    }
                }
            }
            drop(permit);
            let _ = tx.send(BindOutcome {
                profile: pi,
                info: qp.info.clone(),
                node,
                state,
                status,
                attempts: qp.attempts,
                started,
            });
        });
    }

    fn finish_binding(&mut self, o: BindOutcome) {
        let result = if o.status.is_success() {
            "bound"
        } else {
            "error"
        };
        if let Some(m) = &self.metrics {
            m.binding_duration
                .with_label_values(&[result])
                .observe(o.started.elapsed().as_secs_f64());
        }
        let pod = &o.info;
        if o.status.is_success() {
            if let Some(at) = self.enqueued_at.remove(&pod.key)
                && let Some(m) = &self.metrics
            {
                let attempts = (o.attempts + 1).min(16).to_string();
                m.e2e
                    .with_label_values(&[&attempts])
                    .observe(at.elapsed().as_secs_f64());
            }
            self.recorder.event(
                &ObjectRef::new("v1", "Pod", &pod.pod.metadata),
                EventType::Normal,
                "Scheduled",
                &format!("Successfully assigned {} to {}", pod.key, o.node),
            );
            return;
        }
        tracing::debug!(pod = %pod.key, node = %o.node, error = %o.status.message(), "binding failed");
        self.unreserve(o.profile, &o.state, pod, &o.node);
        // Requeue only a pod that still waits for a node.
        let still_pending = self
            .pods
            .as_ref()
            .and_then(|c| c.get(&pod.key))
            .is_some_and(|p| {
                p.spec
                    .as_ref()
                    .and_then(|s| s.node_name.as_deref())
                    .is_none_or(str::is_empty)
                    && p.metadata.deletion_timestamp.is_none()
            });
        if still_pending {
            self.queue
                .requeue_after_bind_failure(pod.clone(), o.attempts + 1, Instant::now());
            if o.status.is_rejection() {
                self.report_unschedulable(pod, &o.status.message());
            }
        }
    }

    /// Sets `PodScheduled=False` with the reason (if it changed) and writes an Event.
    fn report_unschedulable(&self, pod: &PodInfo, message: &str) {
        self.recorder.event(
            &ObjectRef::new("v1", "Pod", &pod.pod.metadata),
            EventType::Warning,
            "FailedScheduling",
            message,
        );
        let conditions = pod
            .pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.clone())
            .unwrap_or_default();
        let same = conditions.iter().any(|c| {
            c.type_ == "PodScheduled"
                && c.status == "False"
                && c.message.as_deref() == Some(message)
        });
        if same {
            return;
        }
        let mut list: Vec<serde_json::Value> = conditions
            .iter()
            .filter(|c| c.type_ != "PodScheduled")
            .filter_map(|c| serde_json::to_value(c).ok())
            .collect();
        list.push(
            json!({"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
            "message": message, "lastTransitionTime": rfc3339(now_secs())}),
        );
        let patch = json!({"status": {"conditions": list}});
        let client = self.client.clone();
        let ns = pod.pod.metadata.namespace.clone();
        let name = pod.name().to_owned();
        tokio::spawn(async move {
            let r = client
                .patch(
                    res("pods"),
                    ns.as_deref(),
                    &name,
                    Some("status"),
                    PatchType::Merge,
                    &patch,
                )
                .await;
            if let Err(e) = r {
                tracing::debug!(pod = %name, error = %e.message, "could not record PodScheduled=False");
            }
        });
    }
}

enum Failure {
    Unschedulable {
        message: String,
        events: Vec<ClusterEvent>,
        status: Status,
    },
    Error(Status),
}

/// The events that can undo the rejections of `plugins`.
fn filter_events(profile: &Profile, plugins: &[&'static str]) -> Vec<ClusterEvent> {
    let mut out = Vec::new();
    for (p, _) in profile.at(Point::Filter) {
        if !plugins.contains(&p.name()) {
            continue;
        }
        if let Some(f) = p.filter() {
            for e in f.events() {
                if !out.contains(e) {
                    out.push(*e);
                }
            }
        }
    }
    if out.is_empty() {
        // A PreFilter rejection (or a plugin without hints): any node or pod change.
        out = vec![
            ClusterEvent::NodeAdd,
            ClusterEvent::NodeAllocatable,
            ClusterEvent::NodeLabel,
            ClusterEvent::NodeTaint,
            ClusterEvent::NodeUnschedulable,
            ClusterEvent::AssignedPodDelete,
        ];
    }
    out
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
                assert_eq!(message, "0/3 nodes are available: 3 Insufficient cpu.")
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
