//! The scheduling cycle: filter (from where the previous pod stopped, until enough nodes are
//! feasible), score, pick, reserve — over the scheduler's cache, with no I/O; and what a
//! rejection is retried on.

use super::*;
use crate::framework::{FilterPlugin, Nomination, PostFilterInput};
use crate::memo::{Local, NodeMemo};
use crate::plugins::preemption;
use crate::resources::NodeInfo;

/// Fewest nodes to find feasible before scoring (kube-scheduler's minimum).
pub(super) const MIN_FEASIBLE_NODES: usize = 100;

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

/// What a scheduling attempt came to: the node, the cycle's state and a Permit wait, or
/// why the pod was not placed.
pub(super) type Attempt = Result<(String, CycleState, Option<PermitWait>), Failure>;

/// A pod held at Permit: its verdict, how long it may wait, and why it waits.
pub(super) struct PermitWait {
    pub(super) verdict: oneshot::Receiver<Status>,
    pub(super) timeout: Duration,
    pub(super) why: String,
}

/// What a decision reads: the profile, the cache as it is (a snapshot: nothing writes it
/// while decisions are made), and where to start looking.
pub struct DecideInput<'a> {
    /// The pod's profile.
    pub profile: &'a Profile,
    /// The nodes and the pods counted on them.
    pub cache: &'a Cache,
    /// `percentageOfNodesToScore` (0: adaptive).
    pub percentage: u32,
    /// The node index to start filtering at.
    pub start: usize,
    /// The local filters' results remembered for the pod's class of alike pods, if any.
    pub memo: Option<&'a NodeMemo>,
}

/// Chooses among equally scored nodes: given how many ties have been seen so far (`n`,
/// at least 1), the index in `0..n` to keep (0 takes the latest). Random in the scheduler,
/// fixed in tests.
pub type TieBreaker<'a> = &'a mut dyn FnMut(u32) -> u32;

/// Random tie-breaking (reservoir sampling: each of `n` equal nodes is kept with
/// probability 1/n), so equal nodes share load.
pub fn random_tie(n: u32) -> u32 {
    rand::random_range(0..n)
}

/// A node found for the pod.
#[derive(Debug)]
pub struct Placement {
    /// Its name (indexes may move once other pods are placed).
    pub name: String,
    /// True if a Filter that reads other nodes' pods (spreading, pod affinity) passed it:
    /// any placement since makes it stale, not only one on this node.
    pub wide: bool,
}

/// What a decision came to.
#[derive(Debug)]
pub enum Verdict {
    /// Go to this node.
    Place(Placement),
    /// A PreFilter plugin kept the pod off every node.
    Rejected {
        /// Its answer.
        status: Status,
        /// The events that could undo it.
        events: Vec<ClusterEvent>,
    },
    /// No node passed Filter.
    NoFit {
        /// Nodes rejected, per reason.
        reasons: HashMap<Cow<'static, str>, usize>,
        /// Nodes rejected, by index, with how (for PostFilter).
        failed: Vec<(usize, Code)>,
        /// The events that could undo the rejections seen.
        wake_on: Vec<ClusterEvent>,
    },
    /// A plugin failed.
    Error(Status),
}

/// One decision: `(profile, snapshot, pod) -> node`, made with no I/O and no writes, so
/// that several can be made at once against one snapshot (optimistic placement).
pub struct Decision {
    /// The cycle's state (what PreFilter computed), for Reserve, Permit and binding.
    pub state: CycleState,
    /// Its outcome.
    pub verdict: Verdict,
    /// Nodes looked at (the next decision starts after them).
    pub looked: usize,
    /// The cache's generation it was made at.
    pub generation: u64,
    /// The CPU time it took on its thread.
    pub cpu: Duration,
    /// Nodes whose local filters' result was taken from the memo.
    pub reused: usize,
    /// Nodes whose local filters ran and whose result was remembered.
    pub judged: usize,
}

/// Decides where `pod` goes: PreFilter; Filter from `input.start` until enough feasible
/// nodes are found; PreScore and Score of those; the best, ties broken by `tie`.
pub fn decide(input: &DecideInput<'_>, pod: &PodInfo, tie: TieBreaker<'_>) -> Decision {
    let cpu = thread_cpu();
    let mut state = CycleState::new();
    let mut walk = Walk::default();
    let verdict = decide_in(input, pod, tie, &mut state, &mut walk);
    Decision {
        state,
        verdict,
        looked: walk.looked,
        generation: input.cache.generation(),
        cpu: thread_cpu().saturating_sub(cpu),
        reused: walk.reused,
        judged: walk.judged,
    }
}

/// What a filter walk counted.
#[derive(Default)]
struct Walk {
    looked: usize,
    reused: usize,
    judged: usize,
}

fn decide_in(
    input: &DecideInput<'_>,
    pod: &PodInfo,
    tie: TieBreaker<'_>,
    state: &mut CycleState,
    walk: &mut Walk,
) -> Verdict {
    let profile = input.profile;
    if let Err(v) = pre_filter(profile, state, pod) {
        return v;
    }
    // Filter, from where the previous pod stopped, until enough feasible nodes are found.
    let nodes = input.cache.nodes();
    let n = nodes.len();
    let want = feasible_nodes_to_find(input.cache.node_count(), input.percentage);
    let filters = profile.at(Point::Filter);
    // Which filters read other nodes (never remembered).
    let wide: Vec<bool> = filters
        .iter()
        .map(|(p, _)| p.filter().is_some_and(|f| f.reads_other_nodes()))
        .collect();
    let mut feasible: Vec<usize> = Vec::with_capacity(want.min(n));
    let mut reasons: HashMap<Cow<'static, str>, usize> = HashMap::new();
    // The events that could undo the rejections seen (each plugin says, per reason).
    let mut wake_on: Vec<ClusterEvent> = Vec::new();
    // Nodes that failed, with how (for PostFilter): few when the pod fits.
    let mut failed: Vec<(usize, Code)> = Vec::new();
    for i in 0..n {
        walk.looked = i + 1;
        let idx = (input.start + i) % n;
        let node = &nodes[idx];
        if node.node.is_none() {
            continue;
        }
        let rejection = match input.memo {
            // Room held for nominated pods depends on who asks: not shared by a class.
            Some(memo) if node.nominated.is_empty() => {
                first_rejection_remembered(filters, &wide, state, pod, node, (memo, idx), walk)
            }
            _ => first_rejection(filters, state, pod, node),
        };
        if let Some((p, f, s)) = rejection {
            if s.code == Code::Error {
                return Verdict::Error(s.by(p.name()));
            }
            failed.push((idx, s.code));
            for e in f.events_for(&s) {
                if !wake_on.contains(e) {
                    wake_on.push(*e);
                }
            }
            for r in s.reasons {
                *reasons.entry(r).or_insert(0) += 1;
            }
        } else {
            feasible.push(idx);
            if feasible.len() >= want {
                break;
            }
        }
    }
    if feasible.is_empty() {
        return Verdict::NoFit {
            reasons,
            failed,
            wake_on,
        };
    }
    let chosen = if feasible.len() == 1 {
        feasible[0]
    } else {
        match prioritize(profile, input.cache, state, pod, &feasible, tie) {
            Ok(c) => c,
            Err(s) => return Verdict::Error(s),
        }
    };
    let wide = filters.iter().any(|(p, _)| {
        p.filter().is_some_and(|f| f.reads_other_nodes()) && !state.skips_filter(p.name())
    });
    Verdict::Place(Placement {
        name: nodes[chosen].name.clone(),
        wide,
    })
}

/// The PreFilter plugins, in order: a rejection or error as the decision's verdict.
fn pre_filter(profile: &Profile, state: &mut CycleState, pod: &PodInfo) -> Result<(), Verdict> {
    for (p, _) in profile.at(Point::PreFilter) {
        let Some(pf) = p.pre_filter() else { continue };
        let s = pf.pre_filter(state, pod).by(p.name());
        match s.code {
            Code::Success => {}
            Code::Skip => state.skip_filter(p.name()),
            Code::Unschedulable | Code::UnschedulableAndUnresolvable => {
                let events = if pf.pre_filter_events().is_empty() {
                    filter_events(profile, &[p.name()])
                } else {
                    pf.pre_filter_events().to_vec()
                };
                return Err(Verdict::Rejected { status: s, events });
            }
            _ => return Err(Verdict::Error(s)),
        }
    }
    Ok(())
}

/// Checks a placement again against the cache as it is now, on its node only: PreFilter
/// afresh (spreading's and pod affinity's counts as they now are), then every Filter on
/// that node. The fresh state if the pod still passes (Omega's fine-grained conflict
/// check: far cheaper than deciding again over every node).
pub fn revalidate(
    profile: &Profile,
    cache: &Cache,
    pod: &PodInfo,
    node: &str,
) -> Option<CycleState> {
    let mut state = CycleState::new();
    pre_filter(profile, &mut state, pod).ok()?;
    let node = cache.node(node).filter(|n| n.node.is_some())?;
    first_rejection(profile.at(Point::Filter), &state, pod, node)
        .is_none()
        .then_some(state)
}

/// PreScore and Score over the feasible nodes; the index of the best.
fn prioritize(
    profile: &Profile,
    cache: &Cache,
    state: &mut CycleState,
    pod: &PodInfo,
    feasible: &[usize],
    tie: TieBreaker<'_>,
) -> Result<usize, Status> {
    let all = cache.nodes();
    let nodes: Vec<&NodeInfo> = feasible.iter().map(|i| &all[*i]).collect();
    for (p, _) in profile.at(Point::PreScore) {
        let Some(ps) = p.pre_score() else { continue };
        let s = ps.pre_score(state, pod, &nodes);
        match s.code {
            Code::Success => {}
            Code::Skip => state.skip_score(p.name()),
            _ => return Err(s.by(p.name())),
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
            scores[j] = sc.score(state, pod, node).map_err(|s| s.by(p.name()))?;
        }
        let s = sc.normalize(state, pod, &mut scores);
        if !s.is_success() {
            return Err(s.by(p.name()));
        }
        for (t, s) in total.iter_mut().zip(&scores) {
            *t += s * weight;
        }
    }
    // The best score; ties broken by `tie` (reservoir sampling).
    let mut best = 0;
    let mut ties = 0u32;
    for (j, t) in total.iter().enumerate() {
        if *t > total[best] {
            best = j;
            ties = 1;
        } else if *t == total[best] {
            ties += 1;
            if tie(ties) == 0 {
                best = j;
            }
        }
    }
    Ok(feasible[best])
}

impl Scheduler {
    /// One scheduling cycle, alone: decide, then [`conclude`](Self::conclude).
    #[cfg(test)]
    pub(super) fn cycle(&mut self, pi: usize, qp: &QueuedPod) -> Attempt {
        let d = self.decide_afresh(pi, &qp.info);
        self.conclude(pi, qp, d.state, d.verdict)
    }

    /// A decision against the cache as it is now, from where the last one stopped (a pod
    /// alone, or one whose decision in a round went stale).
    pub(super) fn decide_afresh(&mut self, pi: usize, pod: &Arc<PodInfo>) -> Decision {
        let nodes = self.cache.nodes().len();
        let memo = self.cache.memo_mut();
        memo.next_round();
        let slot = memo.prepare(pi, pod, nodes);
        let memo = slot.map(|s| self.cache.memo().at(s));
        let d = decide(
            &DecideInput {
                profile: &self.profiles[pi],
                cache: &self.cache,
                percentage: self.percentage,
                start: self.next_start,
                memo,
            },
            pod,
            &mut random_tie,
        );
        self.advance(d.looked);
        if let Some(m) = &self.metrics {
            m.count_memo(d.reused, d.judged);
        }
        d
    }

    /// Moves where the next decision starts past the `looked` nodes.
    pub(super) fn advance(&mut self, looked: usize) {
        let n = self.cache.nodes().len();
        if n > 0 {
            self.next_start = (self.next_start + looked) % n;
        }
    }

    /// Acts on a decision that is still current: a placement is reserved (the cache first,
    /// so the next decision sees it, then Reserve plugins) and passed through Permit; a pod
    /// that fits nowhere gets PostFilter's (preemption's) chance and its reasons.
    pub(super) fn conclude(
        &mut self,
        pi: usize,
        qp: &QueuedPod,
        mut state: CycleState,
        verdict: Verdict,
    ) -> Attempt {
        let pod = &qp.info;
        let (reasons, failed, wake_on) = match verdict {
            Verdict::Place(p) => return self.reserve_and_permit(pi, pod, state, p.name),
            Verdict::Error(s) => return Err(Failure::Error(s)),
            Verdict::Rejected { status, events } => {
                let message = format!(
                    "0/{} nodes are available: {}.",
                    self.cache.node_count(),
                    status.message()
                );
                return Err(Failure::Unschedulable {
                    message,
                    events,
                    status,
                    nomination: None,
                });
            }
            Verdict::NoFit {
                reasons,
                failed,
                wake_on,
            } => (reasons, failed, wake_on),
        };
        let profile = &self.profiles[pi];
        let filters = profile.at(Point::Filter);
        let nodes = self.cache.nodes();
        let n = nodes.len();
        // "<count> <reason>", sorted as strings (kube-scheduler's FitError does the same).
        let mut detail: Vec<String> = reasons.iter().map(|(r, c)| format!("{c} {r}")).collect();
        detail.sort_unstable();
        let mut message = format!("0/{} nodes are available", self.cache.node_count());
        if !detail.is_empty() {
            message.push_str(": ");
            message.push_str(&detail.join(", "));
        }
        message.push('.');
        // PostFilter (preemption) gets its chance.
        let post = profile.at(Point::PostFilter);
        let mut nomination = None;
        if !post.is_empty() {
            let mut codes = vec![Code::UnschedulableAndUnresolvable; n];
            for (i, c) in &failed {
                codes[*i] = *c;
            }
            state.write(preemption::FAIR_VIEW, self.queue.fair_view());
            state.write(
                preemption::NOMINATED,
                self.cache.nominated_node(&pod.key).map(|n| n.name.clone()),
            );
            state.write(
                preemption::UNDERWAY,
                self.cache.preemption_underway(&pod.key),
            );
            let state = &state;
            let filter = |node: &NodeInfo| -> Status {
                first_rejection(filters, state, pod, node)
                    .map_or_else(Status::success, |(_, _, s)| s)
            };
            let input = PostFilterInput {
                nodes,
                codes: &codes,
                filter: &filter,
            };
            let mut said = Vec::new();
            for (p, _) in post {
                let Some(pf) = p.post_filter() else { continue };
                let (nominated, s) = pf.post_filter(state, pod, &input);
                if let Some(nm) = nominated.filter(|_| s.is_success()) {
                    nomination = Some(Box::new(nm));
                    break;
                }
                if s.is_rejection() && !s.reasons.is_empty() {
                    said.push(s.message());
                }
            }
            if nomination.is_none() {
                for m in said {
                    message.push(' ');
                    message.push_str(&m);
                }
            }
        }
        let events = if wake_on.is_empty() {
            all_events()
        } else {
            wake_on
        };
        Err(Failure::Unschedulable {
            message,
            events,
            status: Status::unschedulable("no node fits"),
            nomination,
        })
    }

    /// Reserve (the cache first, so the next decision sees the pod there, then plugins)
    /// and Permit.
    fn reserve_and_permit(
        &mut self,
        pi: usize,
        pod: &Arc<PodInfo>,
        mut state: CycleState,
        node_name: String,
    ) -> Attempt {
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
        let mut wait: Option<(Duration, String)> = None;
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
                Code::Wait => {
                    let why = format!("{} ({})", s.message(), p.name());
                    wait = Some(match wait {
                        Some((w, _)) if w >= d => (w, why),
                        _ => (d, why),
                    });
                }
                _ => {
                    self.unreserve(pi, &state, pod, &node_name);
                    let s = s.by(p.name());
                    return Err(if s.is_rejection() {
                        Failure::Unschedulable {
                            message: format!("rejected at permit by {}: {}", p.name(), s.message()),
                            events: vec![ClusterEvent::NodeAdd, ClusterEvent::AssignedPodDelete],
                            status: s,
                            nomination: None,
                        }
                    } else {
                        Failure::Error(s)
                    });
                }
            }
        }
        let wait = wait.map(|(timeout, why)| PermitWait {
            verdict: self.waiting.add(pod.uid()),
            timeout,
            why,
        });
        Ok((node_name, state, wait))
    }

    pub(super) fn unreserve(&mut self, pi: usize, state: &CycleState, pod: &PodInfo, node: &str) {
        for (p, _) in self.profiles[pi].at(Point::Reserve).iter().rev() {
            if let Some(r) = p.reserve() {
                r.unreserve(state, pod, node);
            }
        }
        self.cache.forget(&pod.key);
    }
}

pub(super) enum Failure {
    Unschedulable {
        message: String,
        events: Vec<ClusterEvent>,
        status: Status,
        /// Where preemption makes room, and whom it evicts.
        nomination: Option<Box<Nomination>>,
    },
    Error(Status),
}

/// The first Filter plugin of `filters` that rejects `pod` on `node` (skipping those
/// PreFilter skipped), with its answer; `None` if every one lets it pass.
fn first_rejection<'a>(
    filters: &'a [(Arc<dyn crate::framework::Plugin>, i64)],
    state: &CycleState,
    pod: &PodInfo,
    node: &NodeInfo,
) -> Option<(
    &'a Arc<dyn crate::framework::Plugin>,
    &'a dyn FilterPlugin,
    Status,
)> {
    for (p, _) in filters {
        if state.skips_filter(p.name()) {
            continue;
        }
        let Some(f) = p.filter() else { continue };
        let s = f.filter(state, pod, node);
        if !s.is_success() {
            return Some((p, f, s));
        }
    }
    None
}

/// What [`first_rejection`] answers, with the local filters' outcome on `node` (see
/// [`crate::memo`]) taken from `memo` when it is known for the node's generation, and
/// remembered there when not. Only the filters that read other nodes run every time; the
/// rejection reported is the same as `first_rejection`'s (the first in profile order).
fn first_rejection_remembered<'a>(
    filters: &'a [(Arc<dyn crate::framework::Plugin>, i64)],
    wide: &[bool],
    state: &CycleState,
    pod: &PodInfo,
    node: &NodeInfo,
    (memo, idx): (&NodeMemo, usize),
    walk: &mut Walk,
) -> Option<(
    &'a Arc<dyn crate::framework::Plugin>,
    &'a dyn FilterPlugin,
    Status,
)> {
    let run = |j: usize| {
        let (p, _) = &filters[j];
        if state.skips_filter(p.name()) {
            return None;
        }
        let f = p.filter()?;
        let s = f.filter(state, pod, node);
        (!s.is_success()).then_some((p, f, s))
    };
    let mut local_rejection = None;
    let local = match memo.get(idx, node.generation) {
        Some(l) => {
            walk.reused += 1;
            l
        }
        None => {
            let mut outcome = Local::Pass;
            for j in (0..filters.len()).filter(|j| !wide[*j]) {
                if let Some(r) = run(j) {
                    if r.2.code == Code::Error {
                        // Not remembered: an error is not the node's answer.
                        return Some(r);
                    }
                    outcome = Local::Fail(j);
                    local_rejection = Some(r);
                    break;
                }
            }
            walk.judged += 1;
            memo.put(idx, node.generation, outcome);
            outcome
        }
    };
    let before = match local {
        Local::Pass => filters.len(),
        Local::Fail(j) => j.min(filters.len()),
    };
    // A filter that reads other nodes and comes first in the profile reports first.
    for j in (0..before).filter(|j| wide[*j]) {
        if let Some(r) = run(j) {
            return Some(r);
        }
    }
    match local {
        Local::Pass => None,
        // Filters are functions of the pod and the node: the remembered one rejects again
        // (run again for its status; should it not, the whole chain decides).
        Local::Fail(j) => local_rejection
            .or_else(|| run(j))
            .or_else(|| first_rejection(filters, state, pod, node)),
    }
}

/// The events that can undo the rejections of `plugins`.
pub(super) fn filter_events(profile: &Profile, plugins: &[&'static str]) -> Vec<ClusterEvent> {
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
        out = all_events();
    }
    out
}

/// Every cluster event: what wakes a pod rejected for a reason no plugin qualified.
pub(super) fn all_events() -> Vec<ClusterEvent> {
    vec![
        ClusterEvent::NodeAdd,
        ClusterEvent::NodeAllocatable,
        ClusterEvent::NodeLabel,
        ClusterEvent::NodeTaint,
        ClusterEvent::NodeUnschedulable,
        ClusterEvent::AssignedPodDelete,
        ClusterEvent::AssignedPodAdd,
        ClusterEvent::PodGroupChange,
    ]
}
