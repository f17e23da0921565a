//! The scheduling cycle: filter (from where the previous pod stopped, until enough nodes are
//! feasible), score, pick, reserve — over the scheduler's cache, with no I/O; and what a
//! rejection is retried on.

use super::*;
use crate::framework::{FilterPlugin, Nomination, PostFilterInput};
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

/// A pod held at Permit: its verdict, how long it may wait, and why it waits.
pub(super) struct PermitWait {
    pub(super) verdict: oneshot::Receiver<Status>,
    pub(super) timeout: Duration,
    pub(super) why: String,
}

impl Scheduler {
    /// One scheduling cycle: the chosen node, the cycle's state and a Permit wait, if any.
    #[allow(clippy::type_complexity)]
    pub(super) fn cycle(
        &mut self,
        pi: usize,
        qp: &QueuedPod,
    ) -> Result<(String, CycleState, Option<PermitWait>), Failure> {
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
                    let events = if pf.pre_filter_events().is_empty() {
                        filter_events(profile, &[p.name()])
                    } else {
                        pf.pre_filter_events().to_vec()
                    };
                    return Err(Failure::Unschedulable {
                        message,
                        events,
                        status: s,
                        nomination: None,
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
        // The events that could undo the rejections seen (each plugin says, per reason).
        let mut wake_on: Vec<ClusterEvent> = Vec::new();
        // Nodes that failed, with how (for PostFilter): few when the pod fits.
        let mut failed: Vec<(usize, Code)> = Vec::new();
        let mut looked = 0;
        for i in 0..n {
            looked = i + 1;
            let idx = (self.next_start + i) % n;
            let node = &nodes[idx];
            if node.node.is_none() {
                continue;
            }
            if let Some((p, f, s)) = first_rejection(filters, &state, pod, node) {
                if s.code == Code::Error {
                    return Err(Failure::Error(s.by(p.name())));
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
        if n > 0 {
            self.next_start = (self.next_start + looked) % n;
        }
        if feasible.is_empty() {
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
            return Err(Failure::Unschedulable {
                message,
                events,
                status: Status::unschedulable("no node fits"),
                nomination,
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

    pub(super) fn prioritize(
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
