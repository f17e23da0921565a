//! The scheduling framework: kube-scheduler's extension points as narrow traits, the
//! outcome of each call as a [`Status`], and the per-cycle scratch space plugins share.
//!
//! A scheduling cycle runs QueueSort (ordering), PreFilter, Filter (per node), PostFilter
//! (only when no node fits), PreScore, Score (per feasible node) with NormalizeScore, Reserve
//! and Permit; the binding cycle, off the scheduling loop, runs PreBind and Bind. A plugin
//! implements [`Plugin`] and answers the `as_*` methods of the points it extends.

use std::any::Any;
use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use parking_lot::Mutex;
use tokio::sync::oneshot;

use crate::resources::{NodeInfo, PodInfo};

/// The highest score a Score plugin gives after normalization.
pub const MAX_NODE_SCORE: i64 = 100;

/// The kind of outcome.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Code {
    /// Go on.
    Success,
    /// The pod does not fit now; something changing in the cluster may make it fit.
    Unschedulable,
    /// The pod cannot fit this node whatever else changes (preemption would not help).
    UnschedulableAndUnresolvable,
    /// Permit: hold the pod until a plugin allows or rejects it, or the timeout passes.
    Wait,
    /// PreFilter/PreScore: the plugin has nothing to do for this pod (its Filter/Score is
    /// skipped); Bind: let the next binder bind.
    Skip,
    /// Something failed (not the pod's fault): retried after backoff.
    Error,
}

/// An outcome with its reasons and the plugin that gave it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Status {
    /// What kind.
    pub code: Code,
    /// Why, in words users see (`Insufficient cpu`).
    pub reasons: Vec<Cow<'static, str>>,
    /// The plugin that said it (empty for Success).
    pub plugin: &'static str,
}

impl Status {
    /// Success.
    pub const fn success() -> Status {
        Status {
            code: Code::Success,
            reasons: Vec::new(),
            plugin: "",
        }
    }

    /// Skip.
    pub const fn skip() -> Status {
        Status {
            code: Code::Skip,
            reasons: Vec::new(),
            plugin: "",
        }
    }

    /// An outcome with one reason.
    pub fn new(code: Code, reason: impl Into<Cow<'static, str>>) -> Status {
        Status {
            code,
            reasons: vec![reason.into()],
            plugin: "",
        }
    }

    /// Unschedulable with a reason.
    pub fn unschedulable(reason: impl Into<Cow<'static, str>>) -> Status {
        Status::new(Code::Unschedulable, reason)
    }

    /// UnschedulableAndUnresolvable with a reason.
    pub fn unresolvable(reason: impl Into<Cow<'static, str>>) -> Status {
        Status::new(Code::UnschedulableAndUnresolvable, reason)
    }

    /// Error with a reason.
    pub fn error(reason: impl Into<Cow<'static, str>>) -> Status {
        Status::new(Code::Error, reason)
    }

    /// True for Success.
    pub fn is_success(&self) -> bool {
        self.code == Code::Success
    }

    /// True for both unschedulable codes.
    pub fn is_rejection(&self) -> bool {
        matches!(
            self.code,
            Code::Unschedulable | Code::UnschedulableAndUnresolvable
        )
    }

    /// Records which plugin said it.
    pub fn by(mut self, plugin: &'static str) -> Status {
        self.plugin = plugin;
        self
    }

    /// The reasons joined for a message.
    pub fn message(&self) -> String {
        self.reasons.join(", ")
    }
}

/// Scratch space of one scheduling cycle: what PreFilter/PreScore compute once for
/// Filter/Score to read per node.
#[derive(Default)]
pub struct CycleState {
    data: HashMap<&'static str, Box<dyn Any + Send + Sync>>,
    skip_filter: Vec<&'static str>,
    skip_score: Vec<&'static str>,
}

impl CycleState {
    /// Empty state.
    pub fn new() -> Self {
        Self::default()
    }

    /// Stores `v` under `key` (a plugin's name).
    pub fn write<T: Any + Send + Sync>(&mut self, key: &'static str, v: T) {
        self.data.insert(key, Box::new(v));
    }

    /// Reads what was stored under `key`.
    pub fn read<T: Any + Send + Sync>(&self, key: &'static str) -> Option<&T> {
        self.data.get(key)?.downcast_ref()
    }

    pub(crate) fn skip_filter(&mut self, plugin: &'static str) {
        self.skip_filter.push(plugin);
    }

    pub(crate) fn skips_filter(&self, plugin: &'static str) -> bool {
        self.skip_filter.contains(&plugin)
    }

    pub(crate) fn skip_score(&mut self, plugin: &'static str) {
        self.skip_score.push(plugin);
    }

    pub(crate) fn skips_score(&self, plugin: &'static str) -> bool {
        self.skip_score.contains(&plugin)
    }
}

/// A change in the cluster that may make an unschedulable pod fit. Filter plugins name the
/// ones that can undo their rejections; a pod one of them rejected is retried only then.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ClusterEvent {
    /// A node joined.
    NodeAdd,
    /// A node's allocatable resources changed.
    NodeAllocatable,
    /// A node's labels changed.
    NodeLabel,
    /// A node's taints changed.
    NodeTaint,
    /// A node's `spec.unschedulable` changed.
    NodeUnschedulable,
    /// A pod that was on a node went away (or finished), freeing what it took.
    AssignedPodDelete,
    /// A pod started counting on a node (placed, or seen bound): what pod affinity and
    /// spreading wait for.
    AssignedPodAdd,
    /// A PodGroup was created or changed, or a gang gained a member: what a gang member
    /// kept back at PreFilter waits for.
    PodGroupChange,
}

/// Pods held at Permit, waiting for a plugin to allow or reject them.
#[derive(Default)]
pub struct WaitingPods {
    map: Mutex<HashMap<String, oneshot::Sender<Status>>>,
}

impl WaitingPods {
    /// Registers a waiting pod (by UID); the receiver gets the verdict.
    pub(crate) fn add(&self, uid: &str) -> oneshot::Receiver<Status> {
        let (tx, rx) = oneshot::channel();
        self.map.lock().insert(uid.to_owned(), tx);
        rx
    }

    /// Lets a waiting pod go on to binding.
    pub fn allow(&self, uid: &str) -> bool {
        self.verdict(uid, Status::success())
    }

    /// Rejects a waiting pod: it is unreserved and goes back to the queue.
    pub fn reject(&self, uid: &str, plugin: &'static str, why: &str) -> bool {
        self.verdict(uid, Status::unschedulable(why.to_owned()).by(plugin))
    }

    fn verdict(&self, uid: &str, s: Status) -> bool {
        match self.map.lock().remove(uid) {
            Some(tx) => tx.send(s).is_ok(),
            None => false,
        }
    }

    /// UIDs of the pods waiting now.
    pub fn uids(&self) -> Vec<String> {
        self.map.lock().keys().cloned().collect()
    }

    pub(crate) fn remove(&self, uid: &str) {
        self.map.lock().remove(uid);
    }
}

/// What plugins get when they are built: their arguments and the framework's handles.
pub struct Handle {
    /// Pods waiting at Permit.
    pub waiting: Arc<WaitingPods>,
    /// The API (for binders).
    pub client: Arc<dyn tessera_client::client::Client>,
    /// Pods counted by selector and topology domain (for spreading and pod affinity).
    pub topology: Arc<parking_lot::RwLock<crate::topology::Topology>>,
    /// PodGroups and their members (for gang scheduling).
    pub gangs: Arc<crate::plugins::gang::Gangs>,
    /// PodDisruptionBudgets (for preemption).
    pub budgets: Arc<crate::plugins::preemption::Budgets>,
    /// The scheduler's metrics, for plugins that report outcomes.
    pub metrics: Option<crate::metrics::SchedulerMetrics>,
}

/// Orders the active queue.
pub trait QueueSortPlugin: Send + Sync {
    /// True if `a` should be scheduled before `b`.
    fn less(&self, a: &QueuedPod, b: &QueuedPod) -> bool;
}

/// A pod in the scheduling queue.
#[derive(Clone, Debug)]
pub struct QueuedPod {
    /// The pod.
    pub info: Arc<PodInfo>,
    /// When it first entered the queue (this time round), as a sequence number.
    pub enqueued: u64,
    /// Its place among pods of equal priority: `enqueued`, or for a member of a gang
    /// (PodGroup) the `enqueued` of the first member queued, so that a gang's members are
    /// handed out one after another rather than interleaved with another gang's
    /// (scheduler-plugins' Coscheduling QueueSort orders by the PodGroup the same way).
    pub order: u64,
    /// Failed attempts so far.
    pub attempts: u32,
}

/// Checks or precomputes once per pod, before any node is looked at.
pub trait PreFilterPlugin: Send + Sync {
    /// Success, Skip (its Filter is not needed for this pod), or a rejection for all nodes.
    fn pre_filter(&self, state: &mut CycleState, pod: &PodInfo) -> Status;
    /// The cluster events that can undo its rejections (empty: those of its Filter, or
    /// any event if it has none).
    fn pre_filter_events(&self) -> &'static [ClusterEvent] {
        &[]
    }
}

/// Says whether a pod can go on one node.
pub trait FilterPlugin: Send + Sync {
    /// Success or a rejection with a reason.
    fn filter(&self, state: &CycleState, pod: &PodInfo, node: &NodeInfo) -> Status;
    /// The cluster events that can undo this plugin's rejections.
    fn events(&self) -> &'static [ClusterEvent];
    /// The cluster events that can undo this rejection (by default [`events`](Self::events);
    /// a plugin narrows it by reason, as kube-scheduler's queueing hints do: a new pod
    /// never helps a pod kept off by anti-affinity).
    fn events_for(&self, _rejection: &Status) -> &'static [ClusterEvent] {
        self.events()
    }
    /// True if its answer for one node depends on pods placed on other nodes (spreading,
    /// pod affinity): a placement it passed is stale once any other pod was placed since
    /// the decision, not only one on the same node.
    fn reads_other_nodes(&self) -> bool {
        false
    }
}

/// What PostFilter sees of a cycle in which no node fit.
pub struct PostFilterInput<'a> {
    /// Every node of the cache, by index.
    pub nodes: &'a [NodeInfo],
    /// Each node's outcome in Filter, by the same index: `Unschedulable` (something on the
    /// node keeps the pod off), `UnschedulableAndUnresolvable` (removing pods would not
    /// help).
    pub codes: &'a [Code],
    /// Runs the profile's Filter plugins for the pod on a node (a copy with pods removed,
    /// to see whether preempting them would make room).
    pub filter: &'a dyn Fn(&NodeInfo) -> Status,
}

/// A node preemption chose for a pod, and the pods to evict from it.
#[derive(Clone, Debug)]
pub struct Nomination {
    /// The node.
    pub node: String,
    /// The victims.
    pub victims: Vec<Arc<PodInfo>>,
}

/// Runs when no node fits (preemption is such a plugin).
pub trait PostFilterPlugin: Send + Sync {
    /// Success with a node nominated (and victims to evict), or why not.
    fn post_filter(
        &self,
        state: &CycleState,
        pod: &PodInfo,
        input: &PostFilterInput<'_>,
    ) -> (Option<Nomination>, Status);
}

/// Precomputes once per pod before scoring.
pub trait PreScorePlugin: Send + Sync {
    /// Success, or Skip (its Score is not needed for this pod).
    fn pre_score(&self, state: &mut CycleState, pod: &PodInfo, nodes: &[&NodeInfo]) -> Status;
}

/// Ranks feasible nodes.
pub trait ScorePlugin: Send + Sync {
    /// The node's raw score.
    fn score(&self, state: &CycleState, pod: &PodInfo, node: &NodeInfo) -> Result<i64, Status>;
    /// Brings raw scores to 0..=[`MAX_NODE_SCORE`] (default: they already are).
    fn normalize(&self, _state: &CycleState, _pod: &PodInfo, _scores: &mut [i64]) -> Status {
        Status::success()
    }
}

/// Claims or releases what a pod takes on its chosen node before binding.
pub trait ReservePlugin: Send + Sync {
    /// Reserves; a failure unreserves every Reserve plugin.
    fn reserve(&self, state: &mut CycleState, pod: &PodInfo, node: &str) -> Status;
    /// Undoes `reserve` (must not fail).
    fn unreserve(&self, state: &CycleState, pod: &PodInfo, node: &str);
}

/// Lets a pod go to binding, holds it, or turns it away.
pub trait PermitPlugin: Send + Sync {
    /// Success, Wait (with the longest wait), or a rejection.
    fn permit(&self, state: &CycleState, pod: &PodInfo, node: &str) -> (Status, Duration);
}

/// Work before binding (volumes, network), off the scheduling loop.
#[async_trait]
pub trait PreBindPlugin: Send + Sync {
    /// Success, or a failure that unreserves and requeues the pod.
    async fn pre_bind(&self, state: &CycleState, pod: &PodInfo, node: &str) -> Status;
}

/// Binds a pod to a node.
#[async_trait]
pub trait BindPlugin: Send + Sync {
    /// Success, Skip (not this binder's pod), or a failure.
    async fn bind(&self, state: &CycleState, pod: &PodInfo, node: &str) -> Status;
}

/// A plugin: a name and the extension points it implements.
pub trait Plugin: Send + Sync + 'static {
    /// Its registered name.
    fn name(&self) -> &'static str;
    /// As a QueueSort plugin.
    fn queue_sort(&self) -> Option<&dyn QueueSortPlugin> {
        None
    }
    /// As a PreFilter plugin.
    fn pre_filter(&self) -> Option<&dyn PreFilterPlugin> {
        None
    }
    /// As a Filter plugin.
    fn filter(&self) -> Option<&dyn FilterPlugin> {
        None
    }
    /// As a PostFilter plugin.
    fn post_filter(&self) -> Option<&dyn PostFilterPlugin> {
        None
    }
    /// As a PreScore plugin.
    fn pre_score(&self) -> Option<&dyn PreScorePlugin> {
        None
    }
    /// As a Score plugin.
    fn score(&self) -> Option<&dyn ScorePlugin> {
        None
    }
    /// As a Reserve plugin.
    fn reserve(&self) -> Option<&dyn ReservePlugin> {
        None
    }
    /// As a Permit plugin.
    fn permit(&self) -> Option<&dyn PermitPlugin> {
        None
    }
    /// As a PreBind plugin.
    fn pre_bind(&self) -> Option<&dyn PreBindPlugin> {
        None
    }
    /// As a Bind plugin.
    fn bind(&self) -> Option<&dyn BindPlugin> {
        None
    }
    /// The topology counters it reads for `pod`, each with the topology key it needs domain
    /// counts for: the scheduler makes them before the pod's cycle (a cycle only reads).
    fn counters(
        &self,
        _pod: &PodInfo,
        _topo: &crate::topology::Topology,
    ) -> Vec<(crate::topology::Match, String)> {
        Vec::new()
    }
}
