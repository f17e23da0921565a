//! Coscheduling: gang scheduling of PodGroups (`tessera.io/v1alpha1`), after Kubernetes'
//! scheduler-plugins. A pod labelled `scheduling.x-k8s.io/pod-group: <name>` is a member of
//! that PodGroup in its namespace.
//!
//! - PreFilter: the PodGroup must exist and have at least `minMember` member pods, and the
//!   members still to place must fit in the shard's free capacity as a whole.
//! - Each member has a standing in the gang registry: pending, reserved (Reserve), committed
//!   (in a batch that reached the quorum, or bound alone after it) or bound (seen by the
//!   scheduling loop); Unreserve sets it back to pending. Counting walks no pods.
//! - Permit: a reserved member joins its gang's gathering and waits; the member that brings
//!   committed + gathering to `minMember` lets every gathering member go, and together they
//!   form one *batch*. Only committed and bound members count towards a quorum: members
//!   reserved earlier and being let go (a timeout, a failed member) never do. A member
//!   binds alone only once `minMember` are bound; one placed while a batch is on its way
//!   waits for it, and is let go when the batch is bound.
//! - Bind: a batch is bound through `podgroups/{name}/binding` — one store transaction, so the
//!   gang is bound whole or not at all, even if the scheduler dies mid-way. Members placed
//!   after the quorum bind one by one (DefaultBinder).
//! - Timeout (`scheduleTimeoutSeconds`, default 60): every waiting member of the gang shares
//!   one deadline; at it they are all rejected and their reservations released.
//! - PostFilter and Unreserve: when a member cannot be placed or leaves, the waiting members
//!   are let go at once instead of holding their nodes until the deadline.
//! - Hold (a shard's part of a federation-scope gang, `tessera.io/gang-phase: Reserve`): a
//!   quorum that forms is not let go. Its members stay reserved at Permit, the PodGroup's
//!   `status.reserved` says so (with the attempt it is for), and they bind only when the
//!   federation turns the phase to `Commit`. Until then the shared deadline is the
//!   reservation's TTL: at it the members are let go, `status.reserved` falls to 0, and they
//!   gather again. A restarted scheduler holds nothing: its members gather anew.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Pod;
use parking_lot::{Mutex, RwLock};
use tessera_client::client::Client;
use tessera_client::request::{ApiRequest, Verb, find_resource};
use tessera_client::types::{
    GANG_ATTEMPT_ANNOTATION, GANG_PHASE_ANNOTATION, MemberBinding, POD_GROUP_LABEL, PodGroup,
    PodGroupBinding,
};

use crate::framework::{
    BindPlugin, ClusterEvent, Code, CycleState, Nomination, PermitPlugin, Plugin, PostFilterInput,
    PostFilterPlugin, PreFilterPlugin, ReservePlugin, Status,
};
use crate::metrics::SchedulerMetrics;
use crate::queue::Usage;
use crate::resources::PodInfo;

/// The plugin's name.
pub const NAME: &str = "Coscheduling";

/// How long a gang waits for its quorum when its PodGroup does not say
/// (scheduler-plugins' `permitWaitingTimeSeconds` default).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// What the scheduler knows of one PodGroup.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GangSpec {
    /// Members that must be placed together before any is bound.
    pub min_member: u32,
    /// How long placed members wait for the rest.
    pub timeout: Duration,
    /// Held for a commit: the federation's attempt this part's reservation is for (its
    /// phase is `Reserve`); `None` binds a quorum at once.
    pub hold: Option<i64>,
}

impl GangSpec {
    /// The spec of a PodGroup object.
    pub fn of(g: &PodGroup) -> GangSpec {
        let spec = g.spec.clone().unwrap_or_default();
        GangSpec {
            min_member: spec.min_member.max(0) as u32,
            timeout: spec
                .schedule_timeout_seconds
                .filter(|s| *s > 0)
                .map_or(DEFAULT_TIMEOUT, |s| Duration::from_secs(s as u64)),
            hold: g.metadata.annotations.as_ref().and_then(|a| {
                (a.get(GANG_PHASE_ANNOTATION).map(String::as_str) == Some("Reserve")).then(|| {
                    a.get(GANG_ATTEMPT_ANNOTATION)
                        .and_then(|n| n.parse().ok())
                        .unwrap_or(0)
                })
            }),
        }
    }
}

/// Called with a gang's key when its PodGroup turns from held to committed.
type CommitHook = Box<dyn Fn(&str) + Send + Sync>;

/// The PodGroups and their member pods as the scheduler's informers see them (written by the
/// scheduling loop, read by the plugin).
#[derive(Default)]
pub struct Gangs {
    inner: RwLock<GangsInner>,
    on_commit: std::sync::OnceLock<CommitHook>,
}

#[derive(Default)]
struct GangsInner {
    /// The shard's allocatable less what counted pods request (none known: unlimited).
    free: Option<Usage>,
    specs: HashMap<String, GangSpec>,
    members: HashMap<String, Members>,
    member_of: HashMap<String, String>,
}

/// Where a member of a gang stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemberState {
    /// Waiting to be placed (or let go).
    Pending,
    /// Reserved on a node by this scheduler, not yet bound (it may wait at Permit).
    Reserved,
    /// Reserved and on its way to binding: in a batch that reached the quorum, or bound alone
    /// after it.
    Committed,
    /// Seen bound.
    Bound,
}

/// The live (not finished, not deleting) member pods of one gang and where each stands.
#[derive(Default)]
struct Members {
    pods: HashMap<String, MemberState>,
}

impl Members {
    fn count(&self, f: impl Fn(MemberState) -> bool) -> usize {
        self.pods.values().filter(|s| f(**s)).count()
    }
}

/// The gang of `pod` (`namespace/name`), if it names one.
pub fn gang_of(pod: &Pod) -> Option<String> {
    let name = pod.metadata.labels.as_ref()?.get(POD_GROUP_LABEL)?;
    Some(format!(
        "{}/{name}",
        pod.metadata.namespace.as_deref().unwrap_or("")
    ))
}

impl GangsInner {
    fn forget(&mut self, pod: &str) {
        let Some(old) = self.member_of.remove(pod) else {
            return;
        };
        if let Some(m) = self.members.get_mut(&old) {
            m.pods.remove(pod);
            if m.pods.is_empty() {
                self.members.remove(&old);
            }
        }
    }
}

impl Gangs {
    /// Sets (or with `None` removes) the spec of the PodGroup `key`.
    pub fn set_spec(&self, key: &str, spec: Option<GangSpec>) {
        let old = {
            let mut g = self.inner.write();
            match spec {
                Some(s) => g.specs.insert(key.to_owned(), s),
                None => g.specs.remove(key),
            }
        };
        let committed =
            old.is_some_and(|o| o.hold.is_some()) && spec.is_some_and(|s| s.hold.is_none());
        if committed && let Some(hook) = self.on_commit.get() {
            hook(key);
        }
    }

    /// The spec of the PodGroup `key`.
    pub fn spec(&self, key: &str) -> Option<GangSpec> {
        self.inner.read().specs.get(key).copied()
    }

    /// Records, from the API, that the pod `pod` is (`Some(gang)`) or is no longer (`None`) a
    /// live member, and whether it is bound (an unbound member keeps the standing this
    /// scheduler gave it); true if it joined a gang it was not counted in.
    pub fn set_member(&self, pod: &str, gang: Option<&str>, bound: bool) -> bool {
        let mut g = self.inner.write();
        if g.member_of.get(pod).map(String::as_str) != gang {
            g.forget(pod);
        }
        let Some(gang) = gang else { return false };
        let joined = !g.member_of.contains_key(pod);
        if joined {
            g.member_of.insert(pod.to_owned(), gang.to_owned());
        }
        let m = g.members.entry(gang.to_owned()).or_default();
        let s = m.pods.entry(pod.to_owned()).or_insert(MemberState::Pending);
        if bound {
            *s = MemberState::Bound;
        }
        joined
    }

    /// Sets where a member stands (this scheduler's reservations); a bound member stays
    /// bound, and a pod of no gang is ignored.
    pub fn set_standing(&self, pod: &str, standing: MemberState) {
        let mut g = self.inner.write();
        let Some(gang) = g.member_of.get(pod).cloned() else {
            return;
        };
        if let Some(m) = g.members.get_mut(&gang)
            && let Some(s) = m.pods.get_mut(pod)
            && *s != MemberState::Bound
        {
            *s = standing;
        }
    }

    /// True if `pod` is counted as a member of some gang.
    pub fn is_member(&self, pod: &str) -> bool {
        self.inner.read().member_of.contains_key(pod)
    }

    /// The shard's free capacity now: allocatable less what placed pods request.
    pub fn set_free(&self, free: Usage) {
        self.inner.write().free = Some(free);
    }

    fn free(&self) -> Option<Usage> {
        self.inner.read().free
    }

    /// Live member pods of `gang`.
    pub fn members(&self, gang: &str) -> usize {
        self.inner
            .read()
            .members
            .get(gang)
            .map_or(0, |m| m.pods.len())
    }

    /// Members of `gang` placed: reserved, committed or bound.
    pub fn placed(&self, gang: &str) -> usize {
        self.inner
            .read()
            .members
            .get(gang)
            .map_or(0, |m| m.count(|s| s != MemberState::Pending))
    }

    /// Members of `gang` seen bound (or bound by a batch this scheduler sent).
    pub fn bound(&self, gang: &str) -> usize {
        self.inner
            .read()
            .members
            .get(gang)
            .map_or(0, |m| m.count(|s| s == MemberState::Bound))
    }

    /// Members of `gang` committed or bound: what a quorum already reached consists of.
    pub fn committed(&self, gang: &str) -> usize {
        self.inner.read().members.get(gang).map_or(0, |m| {
            m.count(|s| matches!(s, MemberState::Committed | MemberState::Bound))
        })
    }
}

/// A member placed and waiting at Permit, or in a batch.
#[derive(Clone, Debug)]
struct Member {
    uid: String,
    pod: String,
    node: String,
}

/// Members of one gang waiting for the quorum.
struct Gathering {
    deadline: Instant,
    members: Vec<Member>,
}

/// Members let go together: bound by the first of them to reach Bind, in one request.
struct Batch {
    gang: String,
    members: Vec<Member>,
    result: tokio::sync::OnceCell<Status>,
}

#[derive(Default)]
struct State {
    gathering: HashMap<String, Gathering>,
    batches: HashMap<String, Arc<Batch>>,
    /// Gangs whose quorum is reserved and held for a commit, with the attempt it is for.
    held: HashMap<String, i64>,
}

impl State {
    /// Turns the members gathering for `gang` into a batch on its way to binding.
    fn form_batch(&mut self, gang: &str) -> Arc<Batch> {
        self.held.remove(gang);
        let members = self
            .gathering
            .remove(gang)
            .map(|g| g.members)
            .unwrap_or_default();
        let batch = Arc::new(Batch {
            gang: gang.to_owned(),
            members,
            result: tokio::sync::OnceCell::new(),
        });
        for m in &batch.members {
            self.batches.insert(m.uid.clone(), batch.clone());
        }
        batch
    }
}

/// A write of a held gang's `status.reserved` (and the attempt it is for).
type Reservation = (String, i32, Option<i64>);

/// The Coscheduling plugin.
pub struct Coscheduling {
    gangs: Arc<Gangs>,
    waiting: Arc<crate::framework::WaitingPods>,
    client: Arc<dyn Client>,
    metrics: Option<SchedulerMetrics>,
    state: Arc<Mutex<State>>,
    /// To the task that writes `status.reserved`, in order.
    reservations: Option<tokio::sync::mpsc::UnboundedSender<Reservation>>,
}

impl Coscheduling {
    /// The plugin over the framework's handles.
    pub fn new(h: &crate::framework::Handle) -> Self {
        let state: Arc<Mutex<State>> = Arc::default();
        // A held gang the federation commits is let go as one batch.
        let (gangs, waiting) = (Arc::downgrade(&h.gangs), h.waiting.clone());
        let st = state.clone();
        let _ = h.gangs.on_commit.set(Box::new(move |gang| {
            if let Some(gangs) = gangs.upgrade() {
                commit(&st, &gangs, &waiting, gang);
            }
        }));
        let reservations = tokio::runtime::Handle::try_current().ok().map(|rt| {
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            rt.spawn(write_reservations(h.client.clone(), rx));
            tx
        });
        Coscheduling {
            gangs: h.gangs.clone(),
            waiting: h.waiting.clone(),
            client: h.client.clone(),
            metrics: h.metrics.clone(),
            state,
            reservations,
        }
    }

    fn report(&self, gang: &str, reserved: i32, attempt: Option<i64>) {
        if let Some(tx) = &self.reservations {
            let _ = tx.send((gang.to_owned(), reserved, attempt));
        }
    }

    fn outcome(&self, result: &str) {
        if let Some(m) = &self.metrics {
            m.gangs.with_label_values(&[result]).inc();
        }
    }

    /// Lets every waiting member of `gang` go back to the queue, except `except`.
    fn release(&self, gang: &str, except: &str, why: &str, outcome: &str) {
        let (g, was_held) = {
            let mut st = self.state.lock();
            (st.gathering.remove(gang), st.held.remove(gang).is_some())
        };
        if was_held {
            self.report(gang, 0, None);
        }
        let Some(g) = g else {
            return;
        };
        let mut rejected = 0;
        for m in g.members.iter().filter(|m| m.uid != except) {
            if self.waiting.reject(&m.uid, NAME, why) {
                rejected += 1;
            }
        }
        if rejected > 0 || g.members.iter().any(|m| m.uid == except) {
            self.outcome(outcome);
        }
    }

    /// A batch was bound: its members are bound, and members that gathered meanwhile (they
    /// waited for the batch) bind alone now.
    fn bound_whole(&self, batch: &Batch) {
        let ns = batch.gang.split_once('/').map_or("", |(ns, _)| ns);
        for m in &batch.members {
            self.gangs
                .set_standing(&format!("{ns}/{}", m.pod), MemberState::Bound);
        }
        let Some(spec) = self.gangs.spec(&batch.gang) else {
            return;
        };
        if self.gangs.bound(&batch.gang) < spec.min_member as usize {
            return;
        }
        let Some(g) = self.state.lock().gathering.remove(&batch.gang) else {
            return;
        };
        for m in g.members {
            self.gangs
                .set_standing(&format!("{ns}/{}", m.pod), MemberState::Committed);
            self.waiting.allow(&m.uid);
        }
    }

    async fn bind_batch(&self, batch: &Batch) -> Status {
        let Ok(groups) = find_resource("tessera.io", "v1alpha1", "podgroups") else {
            return Status::error("the API serves no podgroups");
        };
        let (ns, name) = batch.gang.split_once('/').unwrap_or(("", &batch.gang));
        let body = PodGroupBinding {
            api_version: Some("tessera.io/v1alpha1".into()),
            kind: Some("PodGroupBinding".into()),
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some(name.to_owned()),
                namespace: Some(ns.to_owned()),
                ..Default::default()
            },
            members: batch
                .members
                .iter()
                .map(|m| MemberBinding {
                    pod: m.pod.clone(),
                    uid: Some(m.uid.clone()),
                    node: m.node.clone(),
                })
                .collect(),
        };
        let mut req = ApiRequest::new(Verb::Create, groups);
        req.namespace = Some(ns.to_owned());
        req.name = Some(name.to_owned());
        req.subresource = Some("binding".into());
        req.body = match serde_json::to_vec(&body) {
            Ok(b) => b.into(),
            Err(e) => return Status::error(format!("encoding the gang binding: {e}")),
        };
        match self.client.call(req).await {
            Ok(_) => {
                self.outcome("bound");
                self.bound_whole(batch);
                Status::success()
            }
            Err(e) => {
                self.outcome("failed");
                Status::error(format!(
                    "the binding of gang {} ({} members) was rejected: {} ({})",
                    batch.gang,
                    batch.members.len(),
                    e.message,
                    e.reason
                ))
            }
        }
    }
}

impl Plugin for Coscheduling {
    fn name(&self) -> &'static str {
        NAME
    }
    fn pre_filter(&self) -> Option<&dyn PreFilterPlugin> {
        Some(self)
    }
    fn post_filter(&self) -> Option<&dyn PostFilterPlugin> {
        Some(self)
    }
    fn reserve(&self) -> Option<&dyn ReservePlugin> {
        Some(self)
    }
    fn permit(&self) -> Option<&dyn PermitPlugin> {
        Some(self)
    }
    fn bind(&self) -> Option<&dyn BindPlugin> {
        Some(self)
    }
}

impl PreFilterPlugin for Coscheduling {
    fn pre_filter(&self, _state: &mut CycleState, pod: &PodInfo) -> Status {
        let Some(gang) = gang_of(&pod.pod) else {
            return Status::skip();
        };
        let Some(spec) = self.gangs.spec(&gang) else {
            return Status::unschedulable(format!("PodGroup {gang} not found"));
        };
        let members = self.gangs.members(&gang);
        if (members as u32) < spec.min_member {
            return Status::unschedulable(format!(
                "PodGroup {gang} has {members} of its minMember {} pods",
                spec.min_member
            ));
        }
        // The members still to place (each asking what this one asks, as gangs' members
        // do) must fit in the shard's free capacity as a whole: a gang that cannot is kept
        // back here, before it reserves nodes other pods could use.
        let missing = i64::from(spec.min_member) - self.gangs.placed(&gang) as i64;
        if missing > 0
            && let Some(free) = self.gangs.free()
        {
            let mut need = Usage::of(&pod.requests);
            need.milli_cpu *= missing;
            need.memory *= missing;
            need.pods *= missing;
            let short = [
                ("cpu", need.milli_cpu, free.milli_cpu),
                ("memory", need.memory, free.memory),
                ("pods", need.pods, free.pods),
            ]
            .into_iter()
            .find(|(_, n, f)| n > f);
            if let Some((what, n, f)) = short {
                let (n, f) = if what == "cpu" {
                    (format!("{n}m"), format!("{}m", f.max(0)))
                } else {
                    (n.to_string(), f.max(0).to_string())
                };
                return Status::unschedulable(format!(
                    "PodGroup {gang} needs {missing} more member(s) placed ({what} {n}); the shard has {what} {f} free"
                ));
            }
        }
        Status::success()
    }
    fn pre_filter_events(&self) -> &'static [ClusterEvent] {
        &[
            ClusterEvent::PodGroupChange,
            ClusterEvent::AssignedPodDelete,
            ClusterEvent::NodeAdd,
            ClusterEvent::NodeAllocatable,
        ]
    }
}

impl PostFilterPlugin for Coscheduling {
    fn post_filter(
        &self,
        _state: &CycleState,
        pod: &PodInfo,
        _input: &PostFilterInput<'_>,
    ) -> (Option<Nomination>, Status) {
        let Some(gang) = gang_of(&pod.pod) else {
            return (None, Status::skip());
        };
        let why = format!(
            "member {} of gang {gang} cannot be placed; the gang's reservations are released",
            pod.name()
        );
        self.release(&gang, pod.uid(), &why, "released");
        (None, Status::unschedulable(why))
    }
}

impl ReservePlugin for Coscheduling {
    fn reserve(&self, _state: &mut CycleState, pod: &PodInfo, _node: &str) -> Status {
        self.gangs.set_standing(&pod.key, MemberState::Reserved);
        Status::success()
    }

    fn unreserve(&self, _state: &CycleState, pod: &PodInfo, _node: &str) {
        self.gangs.set_standing(&pod.key, MemberState::Pending);
        let Some(gang) = gang_of(&pod.pod) else {
            return;
        };
        let expired = {
            let mut st = self.state.lock();
            st.batches.remove(pod.uid());
            match st.gathering.get(&gang) {
                Some(g) if g.members.iter().any(|m| m.uid == pod.uid()) => {
                    Some(g.deadline <= Instant::now())
                }
                _ => None,
            }
        };
        if let Some(expired) = expired {
            let (why, outcome) = if expired {
                (
                    format!("gang {gang} did not reach its minMember before its timeout"),
                    "timeout",
                )
            } else {
                (
                    format!(
                        "member {} of gang {gang} left; the gang's reservations are released",
                        pod.name()
                    ),
                    "released",
                )
            };
            self.release(&gang, pod.uid(), &why, outcome);
        }
    }
}

impl PermitPlugin for Coscheduling {
    fn permit(&self, _state: &CycleState, pod: &PodInfo, node: &str) -> (Status, Duration) {
        let Some(gang) = gang_of(&pod.pod) else {
            return (Status::success(), Duration::ZERO);
        };
        let Some(spec) = self.gangs.spec(&gang) else {
            return (Status::success(), Duration::ZERO);
        };
        let min = spec.min_member as usize;
        let me = Member {
            uid: pod.uid().to_owned(),
            pod: pod.name().to_owned(),
            node: node.to_owned(),
        };
        let now = Instant::now();
        let mut st = self.state.lock();
        // A quorum already bound: this one binds alone.
        let bound = self.gangs.bound(&gang);
        if bound >= min {
            drop(st);
            self.gangs.set_standing(&pod.key, MemberState::Committed);
            return (Status::success(), Duration::ZERO);
        }
        // The members gathering now (not ones reserved earlier and being let go).
        let g = st
            .gathering
            .entry(gang.clone())
            .or_insert_with(|| Gathering {
                deadline: now + spec.timeout,
                members: Vec::new(),
            });
        if g.deadline <= now {
            // The last gathering timed out (its members are being let go): start anew.
            *g = Gathering {
                deadline: now + spec.timeout,
                members: Vec::new(),
            };
        }
        g.members.retain(|m| m.uid != me.uid);
        g.members.push(me);
        let committed = self.gangs.committed(&gang);
        // A batch on its way (committed, not yet bound): wait for it. If it binds, the
        // gathering members are let go to bind alone; if it fails, they wait on.
        let in_flight = committed > bound;
        let have = committed + g.members.len();
        let left = g.deadline.saturating_duration_since(now);
        // A held part: the quorum stays reserved here until the federation commits.
        if let Some(attempt) = spec.hold
            && !in_flight
            && have >= min
        {
            let first = st.held.insert(gang.clone(), attempt) != Some(attempt);
            drop(st);
            if first {
                self.outcome("reserved");
                self.report(&gang, min as i32, Some(attempt));
            }
            return (
                Status::new(
                    Code::Wait,
                    format!("gang {gang} is reserved; waiting for the federation to commit it"),
                ),
                left.max(Duration::from_millis(1)),
            );
        }
        if !in_flight && have >= min {
            let batch = st.form_batch(&gang);
            drop(st);
            let ns = pod.pod.metadata.namespace.as_deref().unwrap_or("");
            for m in &batch.members {
                self.gangs
                    .set_standing(&format!("{ns}/{}", m.pod), MemberState::Committed);
                if m.uid != pod.uid() {
                    self.waiting.allow(&m.uid);
                }
            }
            return (Status::success(), Duration::ZERO);
        }
        let why = if in_flight {
            format!("waiting for the binding of gang {gang}")
        } else {
            format!("waiting for {} more member(s) of gang {gang}", min - have)
        };
        (
            Status::new(Code::Wait, why),
            left.max(Duration::from_millis(1)),
        )
    }
}

/// A held gang was committed: the members gathered for it bind as one batch now (if they
/// are a quorum still; otherwise they gather on and bind when they are).
fn commit(
    state: &Mutex<State>,
    gangs: &Gangs,
    waiting: &crate::framework::WaitingPods,
    gang: &str,
) {
    let Some(spec) = gangs.spec(gang) else {
        return;
    };
    let mut st = state.lock();
    let Some(g) = st.gathering.get(gang) else {
        return;
    };
    let committed = gangs.committed(gang);
    if committed > gangs.bound(gang) || committed + g.members.len() < spec.min_member as usize {
        return;
    }
    let batch = st.form_batch(gang);
    drop(st);
    let ns = gang.split_once('/').map_or("", |(ns, _)| ns);
    for m in &batch.members {
        gangs.set_standing(&format!("{ns}/{}", m.pod), MemberState::Committed);
        waiting.allow(&m.uid);
    }
}

/// Writes held gangs' `status.reserved`, in the order the plugin decided them.
async fn write_reservations(
    client: Arc<dyn Client>,
    mut rx: tokio::sync::mpsc::UnboundedReceiver<Reservation>,
) {
    let Ok(groups) = find_resource("tessera.io", "v1alpha1", "podgroups") else {
        return;
    };
    while let Some((gang, reserved, attempt)) = rx.recv().await {
        let (ns, name) = gang.split_once('/').unwrap_or(("", &gang));
        let patch = serde_json::json!({"status": {"reserved": reserved, "reservedFor": attempt}});
        if let Err(e) = client
            .patch(
                groups,
                Some(ns),
                name,
                Some("status"),
                tessera_client::request::PatchType::Merge,
                &patch,
            )
            .await
            && e.code != 404
        {
            tracing::warn!(gang, error = %e.message, "writing a held gang's reservation");
        }
    }
}

#[async_trait]
impl BindPlugin for Coscheduling {
    async fn bind(&self, _state: &CycleState, pod: &PodInfo, _node: &str) -> Status {
        let batch = self.state.lock().batches.get(pod.uid()).cloned();
        let Some(batch) = batch else {
            return Status::skip();
        };
        let status = batch
            .result
            .get_or_init(|| self.bind_batch(&batch))
            .await
            .clone();
        self.state.lock().batches.remove(pod.uid());
        status
    }
}

#[cfg(test)]
mod tests;
