//! InterPodAffinity: `podAffinity` and `podAntiAffinity` with Kubernetes' semantics, both
//! ways round.
//!
//! Filter, in kube-scheduler's order (which decides the reason reported): a node passes if
//! (1) every required affinity term has a pod it selects in the node's domain (all terms'
//! keys must be on the node) — unless no pod anywhere matches all the terms and the pod
//! matches them itself (the first pod of a group that wants to be together); (2) no pod a
//! required anti-affinity term selects is in the node's domain; (3) no existing pod whose
//! required anti-affinity selects the incoming pod is in the node's domain of that term's key.
//!
//! Score: the incoming pod's preferred terms add (affinity) or take (anti-affinity) their
//! weight per selected pod in the node's domain; existing pods' preferred terms that select
//! the incoming pod do the same from their side, and their required affinity terms count with
//! weight 1 (kube-scheduler's `hardPodAffinityWeight`). Scores are then scaled to 0..100.
//!
//! Counts come from [`crate::topology`]: a counter per incoming term, a group per distinct
//! existing term; no pod is walked in a cycle.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use parking_lot::RwLock;

use crate::framework::{
    ClusterEvent, CycleState, FilterPlugin, MAX_NODE_SCORE, Plugin, PreFilterPlugin,
    PreScorePlugin, ScorePlugin, Status,
};
use crate::resources::{NodeInfo, PodInfo};
use crate::topology::{Labels, Match, NO_DOMAIN, Term, TermKind, Topology, evicted_matching};

/// Registered name.
pub const NAME: &str = "InterPodAffinity";

/// A node without pods the required affinity asks for.
pub const AFFINITY: &str = "node(s) didn't match pod affinity rules";
/// A node with pods the required anti-affinity forbids.
pub const ANTI: &str = "node(s) didn't match pod anti-affinity rules";
/// A node in the domain of an existing pod whose anti-affinity forbids the pod.
pub const EXISTING_ANTI: &str = "node(s) didn't satisfy existing pods anti-affinity rules";

/// kube-scheduler's `hardPodAffinityWeight`: what an existing pod's required affinity term
/// adds to the score of the nodes in its domain when it selects the incoming pod.
pub const HARD_POD_AFFINITY_WEIGHT: i64 = 1;

static NO_LABELS: Labels = Labels::new();

fn labels(pod: &Pod) -> &Labels {
    pod.metadata.labels.as_ref().unwrap_or(&NO_LABELS)
}

fn ns(pod: &Pod) -> &str {
    pod.metadata.namespace.as_deref().unwrap_or("")
}

fn of_kind(terms: &[Term], kind: TermKind) -> impl Iterator<Item = &Term> {
    terms.iter().filter(move |t| t.kind == kind)
}

/// The counters the pod's own terms read: `(what, topology key)`. Required affinity terms
/// share one counter (a pod counts only if it matches all of them, as in Kubernetes).
pub fn counters(pod: &Pod, topo: &Topology) -> Vec<(Match, String)> {
    let terms = topo.pod_terms(pod);
    let mut out = Vec::new();
    let all = required_affinity(&terms);
    for t in of_kind(&terms, TermKind::RequiredAffinity) {
        out.push((all.clone(), t.topology_key.clone()));
    }
    for t in terms
        .iter()
        .filter(|t| t.kind != TermKind::RequiredAffinity)
    {
        out.push((Match(vec![t.clause.clone()]), t.topology_key.clone()));
    }
    out
}

fn required_affinity(terms: &[Term]) -> Match {
    Match(
        of_kind(terms, TermKind::RequiredAffinity)
            .map(|t| t.clause.clone())
            .collect(),
    )
}

/// The pod's required affinity: its counter, its terms' (key id, counter slot), and whether
/// the first-pod rule applies (no pod matches yet, and the pod matches its own terms).
struct Required {
    id: usize,
    what: Match,
    keys: Vec<(usize, usize)>,
    self_match: bool,
}

struct FilterState {
    /// Existing pods' anti-affinity groups that select this pod: (group, key id).
    existing: Vec<(usize, usize)>,
    /// The pod's required affinity, if any.
    affinity: Option<Required>,
    /// Required anti-affinity counters: (counter, key id, slot) and what each counts.
    anti: Vec<((usize, usize, usize), Match)>,
}

enum Source {
    Counter { id: usize, slot: usize },
    Group(usize),
}

struct ScoreItem {
    weight: i64,
    key: usize,
    source: Source,
}

/// The counter of `what` and its slot for `key`, made before the cycle.
fn counter_slot(topo: &Topology, what: &Match, key: &str) -> Option<(usize, usize, usize)> {
    let id = topo.counter(what)?;
    let k = topo.key_id(key)?;
    Some((id, k, topo.slot(id, k)?))
}

/// InterPodAffinity.
pub struct InterPodAffinity {
    topology: Arc<RwLock<Topology>>,
}

impl InterPodAffinity {
    /// The plugin, reading `topology`.
    pub fn new(topology: Arc<RwLock<Topology>>) -> Self {
        InterPodAffinity { topology }
    }
}

impl Plugin for InterPodAffinity {
    fn name(&self) -> &'static str {
        NAME
    }
    fn pre_filter(&self) -> Option<&dyn PreFilterPlugin> {
        Some(self)
    }
    fn filter(&self) -> Option<&dyn FilterPlugin> {
        Some(self)
    }
    fn pre_score(&self) -> Option<&dyn PreScorePlugin> {
        Some(self)
    }
    fn score(&self) -> Option<&dyn ScorePlugin> {
        Some(self)
    }
    fn counters(&self, pod: &PodInfo, topo: &Topology) -> Vec<(Match, String)> {
        if pod
            .pod
            .spec
            .as_ref()
            .and_then(|s| s.affinity.as_ref())
            .is_none()
        {
            return Vec::new();
        }
        counters(&pod.pod, topo)
    }
}

fn unprepared() -> Status {
    Status::error("the affinity counters were not prepared for this pod")
}

impl PreFilterPlugin for InterPodAffinity {
    fn pre_filter(&self, state: &mut CycleState, pod: &PodInfo) -> Status {
        let topo = self.topology.read();
        let (ns, labels) = (ns(&pod.pod), labels(&pod.pod));
        let existing: Vec<(usize, usize)> = topo
            .groups_matching(ns, labels)
            .filter(|(_, t)| t.kind == TermKind::RequiredAnti)
            .map(|(id, _)| (id, topo.group_key(id)))
            .collect();
        let terms = if pod
            .pod
            .spec
            .as_ref()
            .and_then(|s| s.affinity.as_ref())
            .is_some()
        {
            topo.pod_terms(&pod.pod)
        } else {
            Vec::new()
        };
        let all = required_affinity(&terms);
        let affinity = if all.0.is_empty() {
            None
        } else {
            let Some(id) = topo.counter(&all) else {
                return unprepared();
            };
            let mut keys = Vec::new();
            for t in of_kind(&terms, TermKind::RequiredAffinity) {
                let Some((_, k, slot)) = counter_slot(&topo, &all, &t.topology_key) else {
                    return unprepared();
                };
                keys.push((k, slot));
            }
            Some(Required {
                id,
                self_match: all.matches(ns, labels),
                what: all,
                keys,
            })
        };
        let mut anti = Vec::new();
        for t in of_kind(&terms, TermKind::RequiredAnti) {
            let what = Match(vec![t.clause.clone()]);
            let Some(found) = counter_slot(&topo, &what, &t.topology_key) else {
                return unprepared();
            };
            anti.push((found, what));
        }
        if existing.is_empty() && affinity.is_none() && anti.is_empty() {
            return Status::skip();
        }
        drop(topo);
        state.write(
            NAME,
            FilterState {
                existing,
                affinity,
                anti,
            },
        );
        Status::success()
    }
}

impl FilterPlugin for InterPodAffinity {
    fn reads_other_nodes(&self) -> bool {
        true
    }
    /// Pods a preemption simulation evicted from `node` are in every domain of the node:
    /// each count of the node's domain leaves out those it counted (kube-scheduler's
    /// `RemovePod` extension).
    fn filter(&self, state: &CycleState, _: &PodInfo, node: &NodeInfo) -> Status {
        let Some(s) = state.read::<FilterState>(NAME) else {
            return Status::error("InterPodAffinity's PreFilter did not run");
        };
        let topo = self.topology.read();
        let gone = |what: &Match| {
            if node.evicted.is_empty() {
                0
            } else {
                evicted_matching(&node.evicted, what)
            }
        };
        if let Some(r) = &s.affinity {
            let gone = gone(&r.what);
            let mut found = true;
            for (k, slot) in &r.keys {
                let d = topo.domain_of(node, *k);
                if d == NO_DOMAIN {
                    return Status::unresolvable(AFFINITY);
                }
                found &= topo.count(r.id, *slot, d) - gone > 0;
            }
            // The first pod of a group that wants to be together: no pod anywhere matches.
            let first_pod = r.self_match && topo.total(r.id) - gone == 0;
            if !found && !first_pod {
                return Status::unresolvable(AFFINITY);
            }
        }
        for ((id, k, slot), what) in &s.anti {
            let d = topo.domain_of(node, *k);
            if d != NO_DOMAIN && topo.count(*id, *slot, d) - gone(what) > 0 {
                return Status::unschedulable(ANTI);
            }
        }
        for (g, k) in &s.existing {
            let d = topo.domain_of(node, *k);
            if d == NO_DOMAIN {
                continue;
            }
            let gone = node
                .evicted
                .iter()
                .filter(|v| topo.pod_in_group(&v.key, *g))
                .count() as i64;
            if topo.group_count(*g, d) - gone > 0 {
                return Status::unschedulable(EXISTING_ANTI);
            }
        }
        Status::success()
    }
    fn events(&self) -> &'static [ClusterEvent] {
        &[
            ClusterEvent::NodeAdd,
            ClusterEvent::NodeLabel,
            ClusterEvent::AssignedPodAdd,
            ClusterEvent::AssignedPodDelete,
        ]
    }
    /// A pod waiting for affinity waits for a pod to arrive; one kept off by anti-affinity,
    /// for one to go (or for a node: new, or relabelled into another domain).
    fn events_for(&self, rejection: &Status) -> &'static [ClusterEvent] {
        if rejection.reasons.iter().any(|r| r == AFFINITY) {
            &[
                ClusterEvent::NodeAdd,
                ClusterEvent::NodeLabel,
                ClusterEvent::AssignedPodAdd,
            ]
        } else {
            &[
                ClusterEvent::NodeAdd,
                ClusterEvent::NodeLabel,
                ClusterEvent::AssignedPodDelete,
            ]
        }
    }
}

impl PreScorePlugin for InterPodAffinity {
    fn pre_score(&self, state: &mut CycleState, pod: &PodInfo, _: &[&NodeInfo]) -> Status {
        let topo = self.topology.read();
        let (ns, labels) = (ns(&pod.pod), labels(&pod.pod));
        let mut items = Vec::new();
        if pod
            .pod
            .spec
            .as_ref()
            .and_then(|s| s.affinity.as_ref())
            .is_some()
        {
            for t in topo.pod_terms(&pod.pod) {
                let sign = match t.kind {
                    TermKind::PreferredAffinity => 1,
                    TermKind::PreferredAnti => -1,
                    _ => continue,
                };
                let what = Match(vec![t.clause.clone()]);
                let Some((id, key, slot)) = counter_slot(&topo, &what, &t.topology_key) else {
                    return unprepared();
                };
                items.push(ScoreItem {
                    weight: sign * i64::from(t.weight),
                    key,
                    source: Source::Counter { id, slot },
                });
            }
        }
        for (g, t) in topo.groups_matching(ns, labels) {
            let weight = match t.kind {
                TermKind::PreferredAffinity => i64::from(t.weight),
                TermKind::PreferredAnti => -i64::from(t.weight),
                TermKind::RequiredAffinity => HARD_POD_AFFINITY_WEIGHT,
                TermKind::RequiredAnti => continue,
            };
            items.push(ScoreItem {
                weight,
                key: topo.group_key(g),
                source: Source::Group(g),
            });
        }
        drop(topo);
        if items.is_empty() {
            return Status::skip();
        }
        state.write(NAME, items);
        Status::success()
    }
}

impl ScorePlugin for InterPodAffinity {
    fn score(&self, state: &CycleState, _: &PodInfo, node: &NodeInfo) -> Result<i64, Status> {
        let Some(items) = state.read::<Vec<ScoreItem>>(NAME) else {
            return Ok(0);
        };
        let topo = self.topology.read();
        let mut score = 0;
        for it in items {
            let d = topo.domain_of(node, it.key);
            if d == NO_DOMAIN {
                continue;
            }
            let n = match it.source {
                Source::Counter { id, slot } => topo.count(id, slot, d),
                Source::Group(g) => topo.group_count(g, d),
            };
            score += it.weight * n;
        }
        Ok(score)
    }

    /// Scaled so the lowest raw score is 0 and the highest 100 (all 0 when they are equal).
    fn normalize(&self, _: &CycleState, _: &PodInfo, scores: &mut [i64]) -> Status {
        let min = scores.iter().copied().min().unwrap_or(0);
        let max = scores.iter().copied().max().unwrap_or(0);
        for s in scores.iter_mut() {
            *s = if max > min {
                MAX_NODE_SCORE * (*s - min) / (max - min)
            } else {
                0
            };
        }
        Status::success()
    }
}
