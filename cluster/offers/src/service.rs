//! The offers service (`tessera.offers.v1.Scheduler`) over one shard's nodes.
//!
//! - **Offers** are made every `interval` from what the shard's informers show: each
//!   schedulable, ready, untainted node's allocatable less the requests of the pods bound to
//!   it, the tasks being launched on it and its outstanding offer. [`crate::allocator`]
//!   decides which framework each free node goes to (DRF by role and weight). An offer not
//!   answered within `offer_timeout` (5 s, as k8s-on-Mesos cached them) is rescinded, and so
//!   is one whose node goes away.
//! - **Accepting** launches each task as a pod in the framework's namespace, required (by
//!   node affinity on `metadata.name`) onto the offered node, created with the framework's
//!   own credentials — so the tenant's admission and quota apply, and kubectl sees it. The
//!   shard's scheduler binds it like any pod: it is the one allocator of node resources, so a
//!   Kubernetes pod and a task never both get the same room. A task whose node filled up
//!   meanwhile (offers are optimistic towards ordinary pods) fails with the reason.
//! - **Task status** follows its pod; a framework that disconnects keeps its tasks for its
//!   `failover_timeout_seconds`, then they are killed.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::Stream;
use k8s_openapi::api::core::v1::{Node, Pod};
use parking_lot::Mutex;
use serde_json::{Value, json};
use tessera_client::client::Client;
use tessera_client::request::{ApiRequest, Verb, find_resource};
use tessera_proto::offers::v1 as pb;
use tessera_proto::offers::v1::scheduler_server::{Scheduler, SchedulerServer};
use tessera_runtime::Informers;
use tessera_runtime::informer::{Change, Subscription};
use tokio::sync::mpsc;
use tonic::{Request, Response, Status, Streaming};

use crate::allocator::{self, Amounts, Candidate, FreeNode};
use crate::metrics::OfferMetrics;

/// The label naming a task pod's framework.
pub const FRAMEWORK_LABEL: &str = "tessera.io/framework";
/// The label naming a task pod's task.
pub const TASK_LABEL: &str = "tessera.io/task";
/// What a task's failure says when its offered room went to a pod first.
pub const NO_ROOM: &str = "no longer has room for it";

/// Authenticates a framework's bearer token: a client acting as that user (the API decides
/// what it may do), or `None` for a token the shard does not accept (unknown, expired,
/// revoked).
pub type Authenticate = Arc<
    dyn Fn(String) -> Pin<Box<dyn std::future::Future<Output = Option<Arc<dyn Client>>> + Send>>
        + Send
        + Sync,
>;

/// How the service runs.
#[derive(Clone, Debug)]
pub struct OffersConfig {
    /// Between two rounds of offers.
    pub interval: Duration,
    /// An offer not answered within this is rescinded.
    pub offer_timeout: Duration,
    /// Least free cpu (milli) and memory (bytes) worth offering.
    pub min: Amounts,
    /// Declined nodes are not offered to the framework again for this long, unless the
    /// decline says otherwise.
    pub default_refuse: Duration,
    /// Between heartbeats on each stream.
    pub heartbeat: Duration,
}

impl Default for OffersConfig {
    fn default() -> Self {
        OffersConfig {
            interval: Duration::from_millis(500),
            offer_timeout: Duration::from_secs(5),
            min: [100, 32 << 20],
            default_refuse: Duration::from_secs(5),
            heartbeat: Duration::from_secs(10),
        }
    }
}

/// Where a framework's events go.
pub type EventTx = mpsc::UnboundedSender<Result<pb::Event, Status>>;

/// A shard's part of the fleet's ledger ([`Offers::ledger`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ledger {
    /// What the shard offered in all at its last round.
    pub total: Amounts,
    /// Each framework of the fleet attached here: its id, what it holds here, and what it
    /// could be offered here.
    pub frameworks: Vec<(String, Amounts, Amounts)>,
}

/// What the federation says of the fleet, for the frameworks it attaches.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FleetView {
    /// What the fleet's shards offer in all.
    pub total: Amounts,
    /// What each framework holds in the other shards.
    pub elsewhere: HashMap<String, Amounts>,
    /// What each framework may be offered in the whole fleet (the nodes it does not refuse).
    pub usable: HashMap<String, Amounts>,
}

struct Task {
    node: String,
    resources: Amounts,
    state: pb::TaskState,
    accepted_at: Instant,
    bound: bool,
    killing: bool,
}

struct Framework {
    info: pb::FrameworkInfo,
    client: Arc<dyn Client>,
    tx: Option<EventTx>,
    gone_since: Option<Instant>,
    refused: HashMap<String, Instant>,
    tasks: HashMap<String, Task>,
    /// Attached by the federation: ranked by its share of the fleet.
    fleet: bool,
}

fn send_to(tx: &Option<EventTx>, e: pb::event::Event) {
    if let Some(tx) = tx {
        let _ = tx.send(Ok(pb::Event { event: Some(e) }));
    }
}

fn update_of(task: &str, t: &Task, message: &str) -> pb::event::Event {
    pb::event::Event::Update(pb::TaskStatus {
        task: task.to_owned(),
        state: t.state as i32,
        node: t.node.clone(),
        message: message.to_owned(),
    })
}

impl Framework {
    fn send(&self, e: pb::event::Event) {
        send_to(&self.tx, e);
    }

    fn update(&self, task: &str, t: &Task, message: &str) {
        send_to(&self.tx, update_of(task, t, message));
    }
}

struct OfferRec {
    framework: String,
    node: String,
    resources: Amounts,
    expires: Instant,
}

#[derive(Default)]
struct State {
    frameworks: HashMap<String, Framework>,
    offers: HashMap<String, OfferRec>,
    next: u64,
    /// Requests of the pods bound to each node that have not finished.
    usage: HashMap<String, Amounts>,
    /// Tasks launched and not yet bound: (framework, task) → (node, requests).
    launching: HashMap<(String, String), (String, Amounts)>,
    /// The fleet as the federation last described it.
    fleet: FleetView,
    /// What this shard offered in all at the last round.
    total: Amounts,
    /// What each framework of the fleet could be offered here at the last round (the nodes
    /// it did not refuse).
    usable: HashMap<String, Amounts>,
}

impl State {
    /// What framework `id` holds here: its live tasks' requests and its outstanding offers.
    fn holding(&self, id: &str) -> Amounts {
        let mut holds: Amounts = [0, 0];
        if let Some(f) = self.frameworks.get(id) {
            for t in f.tasks.values() {
                if matches!(
                    t.state,
                    pb::TaskState::TaskStaging | pb::TaskState::TaskRunning
                ) {
                    add(&mut holds, &t.resources, 1);
                }
            }
        }
        for o in self.offers.values().filter(|o| o.framework == id) {
            add(&mut holds, &o.resources, 1);
        }
        holds
    }
}

/// The offers service of one shard.
#[derive(Clone)]
pub struct Offers {
    shared: Arc<Shared>,
}

struct Shared {
    config: OffersConfig,
    state: Mutex<State>,
    informers: Arc<Informers>,
    authenticate: Authenticate,
    metrics: Option<OfferMetrics>,
    /// The pod and node handlers, for as long as the service runs.
    _subscriptions: Mutex<Vec<Subscription>>,
}

fn pods() -> &'static tessera_client::catalog::Resource {
    find_resource("", "v1", "pods").expect("served")
}

fn nodes() -> &'static tessera_client::catalog::Resource {
    find_resource("", "v1", "nodes").expect("served")
}

/// A pod's cpu (milli) and memory requests.
fn requests(p: &Pod) -> Amounts {
    let r = tessera_scheduler::resources::pod_spec_requests(p.spec.as_ref());
    [r.milli_cpu as i64, r.memory as i64]
}

/// What a pod holds of its node: its requests while bound and not finished.
fn holding(p: &Pod) -> Option<(String, Amounts)> {
    let node = p.spec.as_ref()?.node_name.clone()?;
    let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
    if matches!(phase, Some("Succeeded" | "Failed")) {
        return None;
    }
    Some((node, requests(p)))
}

fn add(a: &mut Amounts, b: &Amounts, sign: i64) {
    a[0] += sign * b[0];
    a[1] += sign * b[1];
}

/// Checks a subscription: the bearer `token` must be one `authenticate` takes (`what` names
/// the endpoint in the refusal), the framework's fields valid, and the token allowed to
/// list `probe` in the framework's namespace (asked of the API itself). Returns the client
/// acting as the token's user, and the info with its weight defaulted.
pub async fn admit(
    authenticate: &Authenticate,
    mut info: pb::FrameworkInfo,
    token: Option<String>,
    what: &str,
    probe: &'static tessera_client::catalog::Resource,
) -> Result<(Arc<dyn Client>, pb::FrameworkInfo), Status> {
    let token = token.ok_or_else(|| {
        Status::unauthenticated("send the framework's bearer token in `authorization: Bearer …`")
    })?;
    let client = authenticate(token)
        .await
        .ok_or_else(|| Status::unauthenticated(format!("the token is not valid for {what}")))?;
    if info.name.is_empty() {
        return Err(Status::invalid_argument("framework.name: required"));
    }
    if info.namespace.is_empty() {
        return Err(Status::invalid_argument(
            "framework.namespace: required (the namespace its tasks run in)",
        ));
    }
    if !(info.weight >= 0.0 && info.weight.is_finite()) {
        return Err(Status::invalid_argument(format!(
            "framework.weight: {} is not a positive number",
            info.weight
        )));
    }
    if info.failover_timeout_seconds < 0 {
        return Err(Status::invalid_argument(
            "framework.failover_timeout_seconds: must be 0 or more",
        ));
    }
    let mut req = ApiRequest::new(Verb::List, probe);
    req.namespace = Some(info.namespace.clone());
    req.params.limit = 1;
    if let Err(e) = client.list(req).await {
        return Err(match e.code {
            403 => Status::permission_denied(format!(
                "the token may not use namespace {}: {}",
                info.namespace, e.message
            )),
            404 => Status::not_found(format!("namespace {}: {}", info.namespace, e.message)),
            _ => Status::unavailable(e.message),
        });
    }
    if info.weight == 0.0 {
        info.weight = 1.0;
    }
    Ok((client, info))
}

/// Whether framework `id` may subscribe again now: not while `connected` on another
/// stream, and only in the namespace it ran in.
pub fn may_resubscribe(id: &str, connected: bool, was: &str, now: &str) -> Result<(), Status> {
    if connected {
        return Err(Status::already_exists(format!(
            "framework {id} is connected on another stream"
        )));
    }
    if was != now {
        return Err(Status::invalid_argument(format!(
            "framework {id} runs in namespace {was}, not {now}"
        )));
    }
    Ok(())
}

/// A new framework's id: its name made fit for a pod name, a sequence number and a stamp.
pub fn framework_id(name: &str, seq: u64, stamp: u32) -> String {
    format!("{}-{:x}{:x}", dns_part(name, 24), seq, stamp % 4096)
}

/// A name fit for a pod name's first part: lower-case letters, digits and dashes.
fn dns_part(s: &str, max: usize) -> String {
    let cleaned: String = s
        .chars()
        .map(|c| {
            let c = c.to_ascii_lowercase();
            if c.is_ascii_alphanumeric() { c } else { '-' }
        })
        .take(max)
        .collect();
    let t = cleaned.trim_matches('-');
    if t.is_empty() {
        "fw".to_owned()
    } else {
        t.to_owned()
    }
}

impl Offers {
    /// The service over the shard whose informers are `informers`; call [`Offers::run`]
    /// to make offers.
    pub fn new(
        config: OffersConfig,
        informers: Arc<Informers>,
        authenticate: Authenticate,
        metrics: Option<OfferMetrics>,
    ) -> Offers {
        let shared = Arc::new(Shared {
            config,
            state: Mutex::new(State::default()),
            informers,
            authenticate,
            metrics,
            _subscriptions: Mutex::new(Vec::new()),
        });
        let weak = Arc::downgrade(&shared);
        let pod_informer = shared.informers.get::<Pod>(pods());
        let sub = pod_informer.on_change(move |c| {
            if let Some(s) = weak.upgrade() {
                s.pod_changed(c);
            }
        });
        shared._subscriptions.lock().push(sub);
        Offers { shared }
    }

    /// The gRPC server of this service.
    pub fn server(&self) -> SchedulerServer<Offers> {
        SchedulerServer::new(self.clone())
    }

    /// Attaches a framework the federation relays, under the id the federation gave it
    /// (`info.id`), its tasks created through `client` and its events sent to `tx`. The
    /// federation has authenticated it and checked its namespace; it is ranked by its share
    /// of the fleet ([`Offers::set_fleet`]). Attached again (the federation's stream came
    /// back, or the framework subscribed there again), it keeps its tasks and is told where
    /// they stand.
    pub fn attach(&self, info: pb::FrameworkInfo, client: Arc<dyn Client>, tx: EventTx) {
        let mut st = self.shared.state.lock();
        let id = info.id.clone();
        if let Some(f) = st.frameworks.get_mut(&id) {
            if !f.fleet {
                tracing::warn!(framework = %id, "the federation attached a framework whose id a local one has; ignored");
                return;
            }
            // A restarted federation takes frameworks back by the id they present: the
            // namespace they ran in here is the one they may have back.
            if f.info.namespace != info.namespace {
                let e = pb::event::Event::Error(pb::event::Error {
                    message: format!(
                        "framework {id} runs in namespace {} here, not {}: not attached",
                        f.info.namespace, info.namespace
                    ),
                });
                let _ = tx.send(Ok(pb::Event { event: Some(e) }));
                return;
            }
            f.tx = Some(tx);
            f.gone_since = None;
            f.client = client;
            f.info = info;
            for (name, t) in &f.tasks {
                f.update(name, t, "reconciled on attachment");
            }
            return;
        }
        st.frameworks.insert(
            id.clone(),
            Framework {
                info,
                client,
                tx: Some(tx),
                gone_since: None,
                refused: HashMap::new(),
                tasks: HashMap::new(),
                fleet: true,
            },
        );
        if let Some(m) = &self.shared.metrics {
            m.frameworks.inc();
        }
        tracing::info!(framework = %id, "framework of the fleet attached");
    }

    /// The framework disconnected from the federation (or the federation from this shard):
    /// its offers here come back, and its tasks are killed after its failover timeout unless
    /// it is attached again.
    pub fn detach(&self, id: &str) {
        if self.of_fleet(id, true) {
            self.shared.disconnected(id);
        }
    }

    /// Whether `id` is a framework the federation attached (and, if `connected`, is
    /// attached now).
    fn of_fleet(&self, id: &str, connected: bool) -> bool {
        self.shared
            .state
            .lock()
            .frameworks
            .get(id)
            .is_some_and(|f| f.fleet && (!connected || f.tx.is_some()))
    }

    /// Every framework the federation attached is detached (the shard lost the federation).
    pub fn detach_fleet(&self) {
        let ids: Vec<String> = {
            let st = self.shared.state.lock();
            st.frameworks
                .iter()
                .filter(|(_, f)| f.fleet && f.tx.is_some())
                .map(|(id, _)| id.clone())
                .collect()
        };
        for id in ids {
            self.shared.disconnected(&id);
        }
    }

    /// A call of framework `id` relayed by the federation (offer ids are this shard's).
    pub async fn call(&self, id: &str, call: pb::call::Call) {
        if !self.of_fleet(id, false) {
            return;
        }
        match call {
            pb::call::Call::Accept(a) => self.shared.accept(id, a).await,
            pb::call::Call::Decline(d) => self.shared.decline(id, d),
            pb::call::Call::Kill(k) => self.shared.kill(id, &k.task).await,
            pb::call::Call::Subscribe(_) => {}
        }
    }

    /// What the federation says of the fleet now.
    pub fn set_fleet(&self, fleet: FleetView) {
        self.shared.state.lock().fleet = fleet;
    }

    /// This shard's part of the fleet's ledger: what it offered in all at the last round,
    /// and for each framework of the fleet attached here what it holds here (its running
    /// tasks and outstanding offers) and what it could be offered here (the nodes it does not
    /// refuse); `None` when no framework of the fleet is attached.
    pub fn ledger(&self) -> Option<Ledger> {
        let st = self.shared.state.lock();
        let mut frameworks: Vec<(String, Amounts, Amounts)> = st
            .frameworks
            .iter()
            .filter(|(_, f)| f.fleet)
            .map(|(id, _)| {
                let usable = st.usable.get(id).copied().unwrap_or(st.total);
                (id.clone(), st.holding(id), usable)
            })
            .collect();
        if frameworks.is_empty() {
            return None;
        }
        frameworks.sort();
        Some(Ledger {
            total: st.total,
            frameworks,
        })
    }

    /// Makes offers, rescinds expired ones and kills the tasks of frameworks gone past their
    /// failover timeout, every `interval`, until dropped.
    pub async fn run(self) {
        let nodes = self.shared.informers.get::<Node>(nodes());
        nodes.synced().await;
        let mut tick = tokio::time::interval(self.shared.config.interval);
        let mut beat = Instant::now();
        loop {
            tick.tick().await;
            let now = Instant::now();
            let node_list = nodes.cache().list();
            self.shared.expire(now, &node_list);
            self.shared.failover(now).await;
            self.shared.offer(now, &node_list);
            if now.duration_since(beat) >= self.shared.config.heartbeat {
                beat = now;
                for f in self.shared.state.lock().frameworks.values() {
                    f.send(pb::event::Event::Heartbeat(pb::event::Heartbeat {}));
                }
            }
        }
    }
}

/// Whether tasks may be offered a node: schedulable, Ready, without a NoSchedule or
/// NoExecute taint; its allocatable cpu and memory.
fn offerable(n: &Node) -> Option<Amounts> {
    let spec = n.spec.as_ref();
    if spec.and_then(|s| s.unschedulable).unwrap_or(false) {
        return None;
    }
    if spec
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| ts.iter().any(|t| t.effect != "PreferNoSchedule"))
    {
        return None;
    }
    let status = n.status.as_ref()?;
    let ready = status
        .conditions
        .as_ref()?
        .iter()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    if !ready {
        return None;
    }
    let alloc = status.allocatable.as_ref()?;
    let cpu: tessera_core::quantity::Quantity = alloc.get("cpu")?.0.parse().ok()?;
    let mem: tessera_core::quantity::Quantity = alloc.get("memory")?.0.parse().ok()?;
    Some([cpu.milli_ceil(), mem.units_ceil()])
}

impl Shared {
    /// Keeps node usage and task states in step with the shard's pods.
    fn pod_changed(&self, c: &Change<Pod>) {
        let (old, new) = match c {
            Change::Added(p) => (None, Some(p)),
            Change::Updated { old, new } => (Some(old), Some(new)),
            Change::Deleted(p) => (Some(p), None),
        };
        let mut st = self.state.lock();
        if let Some((node, r)) = old.and_then(|p| holding(p)) {
            add(st.usage.entry(node).or_default(), &r, -1);
        }
        if let Some((node, r)) = new.and_then(|p| holding(p)) {
            add(st.usage.entry(node).or_default(), &r, 1);
        }
        let p = new.or(old).expect("one of them");
        let labels = p.metadata.labels.as_ref();
        let (Some(fw), Some(task)) = (
            labels.and_then(|l| l.get(FRAMEWORK_LABEL)).cloned(),
            labels.and_then(|l| l.get(TASK_LABEL)).cloned(),
        ) else {
            return;
        };
        self.task_changed(&mut st, &fw, &task, new.map(|p| p.as_ref()));
    }

    fn task_changed(&self, st: &mut State, fw_id: &str, task: &str, pod: Option<&Pod>) {
        let key = (fw_id.to_owned(), task.to_owned());
        let bound_now = pod.is_some_and(|p| p.spec.as_ref().is_some_and(|s| s.node_name.is_some()));
        if bound_now || pod.is_none() {
            st.launching.remove(&key);
        }
        let Some(f) = st.frameworks.get_mut(fw_id) else {
            return;
        };
        let Framework {
            tx,
            tasks,
            client,
            info,
            ..
        } = f;
        let Some(t) = tasks.get_mut(task) else {
            return;
        };
        if bound_now && !t.bound {
            t.bound = true;
            if let Some(m) = &self.metrics {
                m.accept_to_bound
                    .observe(t.accepted_at.elapsed().as_secs_f64());
            }
        }
        let mut message = String::new();
        let (state, delete) = match pod {
            // Gone after it finished (its pod removed once reported): nothing new.
            None if matches!(
                t.state,
                pb::TaskState::TaskFinished | pb::TaskState::TaskFailed
            ) =>
            {
                (t.state, false)
            }
            None if t.killing => (pb::TaskState::TaskKilled, false),
            None => {
                message = "its pod was deleted".into();
                (pb::TaskState::TaskLost, false)
            }
            Some(p) => {
                let status = p.status.as_ref();
                let unschedulable = status
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|cs| {
                        cs.iter().any(|c| {
                            c.type_ == "PodScheduled"
                                && c.status == "False"
                                && c.reason.as_deref() == Some("Unschedulable")
                        })
                    });
                match status.and_then(|s| s.phase.as_deref()) {
                    _ if unschedulable && !bound_now => {
                        message = format!(
                            "node {} {NO_ROOM} (a pod took the offered room first)",
                            t.node
                        );
                        (pb::TaskState::TaskFailed, true)
                    }
                    Some("Running") => (pb::TaskState::TaskRunning, false),
                    Some("Succeeded") => (pb::TaskState::TaskFinished, true),
                    Some("Failed") => {
                        message = status.and_then(|s| s.message.clone()).unwrap_or_default();
                        (pb::TaskState::TaskFailed, true)
                    }
                    _ => (pb::TaskState::TaskStaging, false),
                }
            }
        };
        if state != t.state {
            t.state = state;
            send_to(tx, update_of(task, t, &message));
            if let Some(m) = &self.metrics {
                m.task_updates
                    .with_label_values(&[state.as_str_name()])
                    .inc();
            }
        }
        let finished = !matches!(
            state,
            pb::TaskState::TaskStaging | pb::TaskState::TaskRunning
        );
        if pod.is_none() {
            tasks.remove(task);
        } else if finished && delete && !t.killing {
            // Reported: the pod goes (its record was the status just sent).
            t.killing = true;
            let (client, ns) = (client.clone(), info.namespace.clone());
            let name = format!("{fw_id}-{task}");
            tokio::spawn(async move {
                let _ = client.delete(pods(), Some(&ns), &name, None).await;
            });
        }
    }

    /// Rescinds offers past their time or on nodes no longer offerable.
    fn expire(&self, now: Instant, node_list: &[Arc<Node>]) {
        let mut st = self.state.lock();
        if st.offers.is_empty() {
            return;
        }
        let live: std::collections::HashSet<&str> = node_list
            .iter()
            .filter(|n| offerable(n).is_some())
            .filter_map(|n| n.metadata.name.as_deref())
            .collect();
        let gone: Vec<(String, &'static str)> = st
            .offers
            .iter()
            .filter_map(|(id, o)| {
                if !live.contains(o.node.as_str()) {
                    Some((id.clone(), "node"))
                } else if o.expires <= now {
                    Some((id.clone(), "timeout"))
                } else {
                    None
                }
            })
            .collect();
        for (id, why) in gone {
            let Some(o) = st.offers.remove(&id) else {
                continue;
            };
            if let Some(m) = &self.metrics {
                m.rescinded.with_label_values(&[why]).inc();
            }
            if let Some(f) = st.frameworks.get(&o.framework) {
                f.send(pb::event::Event::Rescind(pb::event::Rescind {
                    offer_id: id,
                    reason: match why {
                        "node" => format!("node {} went away or stopped taking pods", o.node),
                        _ => format!(
                            "not answered within {}s",
                            self.config.offer_timeout.as_secs_f64()
                        ),
                    },
                }));
            }
        }
    }

    /// Kills the tasks of frameworks gone longer than their failover timeout.
    async fn failover(&self, now: Instant) {
        let doomed: Vec<(String, Framework)> = {
            let mut st = self.state.lock();
            let ids: Vec<String> = st
                .frameworks
                .iter()
                .filter(|(_, f)| {
                    f.gone_since.is_some_and(|t| {
                        now.duration_since(t)
                            >= Duration::from_secs(f.info.failover_timeout_seconds.max(0) as u64)
                    })
                })
                .map(|(id, _)| id.clone())
                .collect();
            ids.into_iter()
                .filter_map(|id| st.frameworks.remove(&id).map(|f| (id, f)))
                .collect()
        };
        for (id, f) in doomed {
            tracing::info!(framework = %id, tasks = f.tasks.len(), "framework did not come back within its failover timeout; killing its tasks");
            for task in f.tasks.keys() {
                let _ = f
                    .client
                    .delete(
                        pods(),
                        Some(&f.info.namespace),
                        &format!("{id}-{task}"),
                        None,
                    )
                    .await;
            }
            if let Some(m) = &self.metrics {
                m.frameworks.dec();
            }
        }
    }

    /// One round of offers.
    fn offer(&self, now: Instant, node_list: &[Arc<Node>]) {
        let mut st = self.state.lock();
        if st.frameworks.values().all(|f| f.tx.is_none()) {
            return;
        }
        let mut total: Amounts = [0, 0];
        let mut offered: HashMap<&str, Amounts> = HashMap::new();
        for o in st.offers.values() {
            add(offered.entry(o.node.as_str()).or_default(), &o.resources, 1);
        }
        let mut launching: HashMap<&str, Amounts> = HashMap::new();
        for (node, r) in st.launching.values() {
            add(launching.entry(node.as_str()).or_default(), r, 1);
        }
        let mut free = Vec::new();
        // Each free node's place in `node_list` (for its labels, when offered).
        let mut free_at = Vec::new();
        let mut allocatable: HashMap<&str, Amounts> = HashMap::new();
        for (at, n) in node_list.iter().enumerate() {
            let (Some(name), Some(alloc)) = (n.metadata.name.as_deref(), offerable(n)) else {
                continue;
            };
            add(&mut total, &alloc, 1);
            allocatable.insert(name, alloc);
            if offered.contains_key(name) {
                continue;
            }
            let mut f = alloc;
            if let Some(u) = st.usage.get(name) {
                add(&mut f, u, -1);
            }
            if let Some(l) = launching.get(name) {
                add(&mut f, l, -1);
            }
            free.push(FreeNode {
                name: name.to_owned(),
                free: f,
            });
            free_at.push(at);
        }
        st.total = total;
        // Candidates: connected frameworks with what they hold.
        let mut ids: Vec<String> = st
            .frameworks
            .iter()
            .filter(|(_, f)| f.tx.is_some())
            .map(|(id, _)| id.clone())
            .collect();
        ids.sort();
        if ids.is_empty() || free.is_empty() {
            return;
        }
        // What each framework of the fleet may be offered here: the nodes it does not
        // refuse now (reported in the ledger; see the scale below).
        let usable: HashMap<String, Amounts> = ids
            .iter()
            .filter(|id| st.frameworks[id.as_str()].fleet)
            .map(|id| {
                let mut u = total;
                for (node, until) in &st.frameworks[id.as_str()].refused {
                    if *until > now
                        && let Some(a) = allocatable.get(node.as_str())
                    {
                        add(&mut u, a, -1);
                    }
                }
                (id.clone(), u)
            })
            .collect();
        let candidates: Vec<Candidate> = ids
            .iter()
            .map(|id| {
                let f = &st.frameworks[id];
                let mut holds = st.holding(id);
                let role = if f.info.role.is_empty() {
                    id.clone()
                } else {
                    f.info.role.clone()
                };
                // A framework of the fleet is ranked among the fleet's: by what it holds
                // everywhere, out of what the fleet offers (never less than this shard).
                let (role, total, scale) = if f.fleet {
                    if let Some(e) = st.fleet.elsewhere.get(id) {
                        add(&mut holds, e, 1);
                    }
                    let fleet = st.fleet.total;
                    let fleet = [fleet[0].max(total[0]), fleet[1].max(total[1])];
                    // Every shard the framework takes offers from offers its free nodes in
                    // this same round, each ranking by the same ledger: a node offered here
                    // counts as much as this shard's part of what the framework may use in
                    // the fleet — here, 1; in one of N like shards, N — so the shards
                    // together correct an imbalance once, not N times.
                    let here = usable.get(id).copied().unwrap_or(total);
                    let there = st.fleet.usable.get(id).copied().unwrap_or(here);
                    let ratio = |k: usize| {
                        if here[k] > 0 && there[k] > here[k] {
                            there[k] as f64 / here[k] as f64
                        } else {
                            1.0
                        }
                    };
                    (format!("fleet/{role}"), fleet, [ratio(0), ratio(1)])
                } else {
                    (role, total, [1.0, 1.0])
                };
                Candidate {
                    id: id.clone(),
                    role,
                    weight: f.info.weight,
                    holds,
                    total,
                    scale,
                    refuses: f
                        .refused
                        .iter()
                        .filter(|(_, until)| **until > now)
                        .map(|(n, _)| n.clone())
                        .collect(),
                }
            })
            .collect();
        st.usable = usable;
        let decided = allocator::allocate(&free, &candidates, &self.config.min);
        let mut batches: HashMap<usize, Vec<pb::Offer>> = HashMap::new();
        for (ci, ni) in decided {
            st.next += 1;
            let id = format!("offer-{}", st.next);
            let node = &free[ni];
            st.offers.insert(
                id.clone(),
                OfferRec {
                    framework: candidates[ci].id.clone(),
                    node: node.name.clone(),
                    resources: node.free,
                    expires: now + self.config.offer_timeout,
                },
            );
            let labels = node_list[free_at[ni]]
                .metadata
                .labels
                .clone()
                .unwrap_or_default();
            batches.entry(ci).or_default().push(pb::Offer {
                id,
                node: node.name.clone(),
                resources: Some(pb::Resources {
                    cpu_milli: node.free[0],
                    memory_bytes: node.free[1],
                }),
                node_labels: labels.into_iter().collect(),
            });
        }
        for (ci, offers) in batches {
            if let Some(m) = &self.metrics {
                m.offers.inc_by(offers.len() as u64);
            }
            st.frameworks[&candidates[ci].id]
                .send(pb::event::Event::Offers(pb::event::Offers { offers }));
        }
        // Prune refusals that ran out.
        for f in st.frameworks.values_mut() {
            f.refused.retain(|_, until| *until > now);
        }
    }

    /// A subscription: a new framework, or one coming back by its id.
    async fn subscribe(
        &self,
        info: pb::FrameworkInfo,
        token: Option<String>,
        tx: &EventTx,
    ) -> Result<String, Status> {
        let (client, info) = admit(&self.authenticate, info, token, "this shard", pods()).await?;
        let mut st = self.state.lock();
        if !info.id.is_empty() {
            let id = info.id.clone();
            let Some(f) = st.frameworks.get_mut(&id) else {
                return Err(Status::not_found(format!(
                    "no framework {id}: its failover timeout passed (its tasks were killed), or it never was; subscribe without an id"
                )));
            };
            if f.fleet {
                return Err(Status::failed_precondition(format!(
                    "framework {id} is subscribed at the federation: subscribe there again"
                )));
            }
            may_resubscribe(&id, f.tx.is_some(), &f.info.namespace, &info.namespace)?;
            f.tx = Some(tx.clone());
            f.gone_since = None;
            f.client = client;
            f.info = info;
            f.send(pb::event::Event::Subscribed(pb::event::Subscribed {
                framework_id: id.clone(),
                heartbeat_seconds: self.config.heartbeat.as_secs_f64(),
            }));
            // Where its tasks stand now (it may have missed updates).
            for (name, t) in &f.tasks {
                f.update(name, t, "reconciled on resubscription");
            }
            tracing::info!(framework = %id, "framework subscribed again");
            return Ok(id);
        }
        st.next += 1;
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let id = framework_id(&info.name, st.next, stamp);
        let mut info = info;
        info.id = id.clone();
        let f = Framework {
            info,
            client,
            tx: Some(tx.clone()),
            gone_since: None,
            refused: HashMap::new(),
            tasks: HashMap::new(),
            fleet: false,
        };
        f.send(pb::event::Event::Subscribed(pb::event::Subscribed {
            framework_id: id.clone(),
            heartbeat_seconds: self.config.heartbeat.as_secs_f64(),
        }));
        st.frameworks.insert(id.clone(), f);
        if let Some(m) = &self.metrics {
            m.frameworks.inc();
        }
        tracing::info!(framework = %id, "framework subscribed");
        Ok(id)
    }

    /// The stream ended: its offers come back; its tasks wait for its failover timeout.
    fn disconnected(&self, id: &str) {
        let mut st = self.state.lock();
        st.offers.retain(|_, o| o.framework != id);
        if let Some(f) = st.frameworks.get_mut(id) {
            f.tx = None;
            f.gone_since = Some(Instant::now());
        }
        tracing::info!(framework = %id, "framework disconnected");
    }

    async fn accept(&self, id: &str, a: pb::call::Accept) {
        let launched = {
            let mut st = self.state.lock();
            let State {
                frameworks,
                offers,
                launching,
                ..
            } = &mut *st;
            let Some(f) = frameworks.get_mut(id) else {
                return;
            };
            let Some(o) = offers.get(&a.offer_id).filter(|o| o.framework == id) else {
                f.send(pb::event::Event::Error(pb::event::Error {
                    message: format!(
                        "no offer {} for this framework: it was rescinded or answered already",
                        a.offer_id
                    ),
                }));
                return;
            };
            let mut asked: Amounts = [0, 0];
            let mut why = None;
            let mut seen = std::collections::HashSet::new();
            for t in &a.tasks {
                let r = t.resources.unwrap_or_default();
                add(&mut asked, &[r.cpu_milli, r.memory_bytes], 1);
                if r.cpu_milli <= 0 || r.memory_bytes <= 0 {
                    why = Some(format!(
                        "task {:?}: resources must ask for cpu and memory",
                        t.name
                    ));
                } else if t.image.is_empty() {
                    why = Some(format!("task {:?}: image is required", t.name));
                } else if t.name.is_empty()
                    || t.name.len() > 40
                    || !t
                        .name
                        .chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                    || t.name.starts_with('-')
                    || t.name.ends_with('-')
                {
                    why = Some(format!(
                        "task name {:?}: lower-case letters, digits and '-', at most 40",
                        t.name
                    ));
                } else if f.tasks.contains_key(&t.name) || !seen.insert(t.name.clone()) {
                    why = Some(format!("task {:?} exists already", t.name));
                }
            }
            if why.is_none() && (asked[0] > o.resources[0] || asked[1] > o.resources[1]) {
                why = Some(format!(
                    "the tasks ask for {}m cpu and {} bytes of memory; offer {} has {}m and {}",
                    asked[0], asked[1], a.offer_id, o.resources[0], o.resources[1]
                ));
            }
            let o = offers.remove(&a.offer_id).expect("looked up");
            if let Some(why) = why {
                // Nothing is launched; the offer's room is offered again.
                for t in &a.tasks {
                    f.send(pb::event::Event::Update(pb::TaskStatus {
                        task: t.name.clone(),
                        state: pb::TaskState::TaskFailed as i32,
                        node: o.node.clone(),
                        message: why.clone(),
                    }));
                }
                f.send(pb::event::Event::Error(pb::event::Error { message: why }));
                return;
            }
            let now = Instant::now();
            for t in &a.tasks {
                let r = t.resources.unwrap_or_default();
                let res = [r.cpu_milli, r.memory_bytes];
                launching.insert((id.to_owned(), t.name.clone()), (o.node.clone(), res));
                f.tasks.insert(
                    t.name.clone(),
                    Task {
                        node: o.node.clone(),
                        resources: res,
                        state: pb::TaskState::TaskStaging,
                        accepted_at: now,
                        bound: false,
                        killing: false,
                    },
                );
            }
            if let Some(m) = &self.metrics {
                m.accepted.inc();
                m.tasks_launched.inc_by(a.tasks.len() as u64);
            }
            (f.client.clone(), f.info.namespace.clone(), o.node)
        };
        let (client, ns, node) = launched;
        for t in a.tasks {
            let pod = task_pod(id, &ns, &node, &t);
            if let Err(e) = client.create(pods(), Some(&ns), &pod).await {
                let mut st = self.state.lock();
                st.launching.remove(&(id.to_owned(), t.name.clone()));
                if let Some(f) = st.frameworks.get_mut(id)
                    && let Some(mut task) = f.tasks.remove(&t.name)
                {
                    task.state = pb::TaskState::TaskFailed;
                    f.update(
                        &t.name,
                        &task,
                        &format!("the API refused its pod: {}", e.message),
                    );
                }
            }
        }
    }

    fn decline(&self, id: &str, d: pb::call::Decline) {
        let mut st = self.state.lock();
        let Some(o) = st.offers.get(&d.offer_id).filter(|o| o.framework == id) else {
            return;
        };
        let node = o.node.clone();
        st.offers.remove(&d.offer_id);
        let refuse = if d.refuse_seconds > 0.0 && d.refuse_seconds.is_finite() {
            Duration::from_secs_f64(d.refuse_seconds.min(3600.0))
        } else {
            self.config.default_refuse
        };
        if let Some(f) = st.frameworks.get_mut(id) {
            f.refused.insert(node, Instant::now() + refuse);
        }
        if let Some(m) = &self.metrics {
            m.declined.inc();
        }
    }

    async fn kill(&self, id: &str, task: &str) {
        let target = {
            let mut st = self.state.lock();
            let Some(f) = st.frameworks.get_mut(id) else {
                return;
            };
            match f.tasks.get_mut(task) {
                Some(t) => {
                    t.killing = true;
                    Some((f.client.clone(), f.info.namespace.clone()))
                }
                None => {
                    f.send(pb::event::Event::Error(pb::event::Error {
                        message: format!("no task {task:?} to kill"),
                    }));
                    None
                }
            }
        };
        if let Some((client, ns)) = target {
            let _ = client
                .delete(pods(), Some(&ns), &format!("{id}-{task}"), None)
                .await;
        }
    }
}

/// The pod of task `t` of framework `fw` in `ns`, required onto `node`.
fn task_pod(fw: &str, ns: &str, node: &str, t: &pb::TaskInfo) -> Value {
    let r = t.resources.unwrap_or_default();
    let mut labels: serde_json::Map<String, Value> = t
        .labels
        .iter()
        .map(|(k, v)| (k.clone(), json!(v)))
        .collect();
    labels.insert(FRAMEWORK_LABEL.into(), json!(fw));
    labels.insert(TASK_LABEL.into(), json!(t.name));
    let amounts = json!({"cpu": format!("{}m", r.cpu_milli), "memory": r.memory_bytes.to_string()});
    let mut container = json!({
        "name": "task",
        "image": t.image,
        "resources": {"requests": amounts, "limits": amounts},
    });
    if !t.command.is_empty() {
        container["command"] = json!(t.command);
    }
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": format!("{fw}-{}", t.name),
            "namespace": ns,
            "labels": labels,
            "annotations": t.annotations,
        },
        "spec": {
            "restartPolicy": "Never",
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": [node]}
                ]}]
            }}},
            "containers": [container],
        },
    })
}

/// The bearer token in a call's `authorization` metadata.
pub fn bearer(metadata: &tonic::metadata::MetadataMap) -> Option<String> {
    metadata
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::to_owned)
}

/// The framework of a session's first call, which must be `subscribe`.
pub async fn first_subscribe(calls: &mut Streaming<pb::Call>) -> Result<pb::FrameworkInfo, Status> {
    let first = calls
        .message()
        .await?
        .ok_or_else(|| Status::invalid_argument("the stream ended before subscribe"))?;
    let Some(pb::call::Call::Subscribe(sub)) = first.call else {
        return Err(Status::invalid_argument("the first call must be subscribe"));
    };
    sub.framework
        .ok_or_else(|| Status::invalid_argument("subscribe.framework: required"))
}

type EventStream = Pin<Box<dyn Stream<Item = Result<pb::Event, Status>> + Send>>;

#[tonic::async_trait]
impl Scheduler for Offers {
    type SessionStream = EventStream;

    async fn session(
        &self,
        request: Request<Streaming<pb::Call>>,
    ) -> Result<Response<EventStream>, Status> {
        let token = bearer(request.metadata());
        let mut calls = request.into_inner();
        let info = first_subscribe(&mut calls).await?;
        let (tx, rx) = mpsc::unbounded_channel();
        let id = self.shared.subscribe(info, token, &tx).await?;
        let shared = self.shared.clone();
        tokio::spawn(async move {
            while let Ok(Some(call)) = calls.message().await {
                match call.call {
                    Some(pb::call::Call::Accept(a)) => shared.accept(&id, a).await,
                    Some(pb::call::Call::Decline(d)) => shared.decline(&id, d),
                    Some(pb::call::Call::Kill(k)) => shared.kill(&id, &k.task).await,
                    Some(pb::call::Call::Subscribe(_)) => {
                        let _ = tx.send(Ok(pb::Event {
                            event: Some(pb::event::Event::Error(pb::event::Error {
                                message: "subscribed already on this stream".into(),
                            })),
                        }));
                    }
                    None => {}
                }
            }
            shared.disconnected(&id);
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::UnboundedReceiverStream::new(rx),
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_task_pod_is_pinned_to_its_node_and_labelled_with_its_framework() {
        let t = pb::TaskInfo {
            name: "t1".into(),
            resources: Some(pb::Resources {
                cpu_milli: 500,
                memory_bytes: 1 << 20,
            }),
            image: "busybox".into(),
            command: vec!["sleep".into(), "1".into()],
            ..Default::default()
        };
        let p = task_pod("etl-1", "team", "node-3", &t);
        assert_eq!(p["metadata"]["name"], "etl-1-t1");
        assert_eq!(p["metadata"]["labels"][FRAMEWORK_LABEL], "etl-1");
        assert_eq!(p["metadata"]["labels"][TASK_LABEL], "t1");
        assert_eq!(
            p["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
                ["nodeSelectorTerms"][0]["matchFields"][0]["values"][0],
            "node-3"
        );
        assert_eq!(
            p["spec"]["containers"][0]["resources"]["requests"]["cpu"],
            "500m"
        );
        let pod: Pod = serde_json::from_value(p).expect("a Pod");
        assert_eq!(requests(&pod), [500, 1 << 20]);
    }

    #[test]
    fn framework_names_become_dns_parts() {
        assert_eq!(dns_part("Spark ETL", 24), "spark-etl");
        assert_eq!(dns_part("--", 24), "fw");
        assert_eq!(dns_part("a".repeat(40).as_str(), 24).len(), 24);
    }
}
