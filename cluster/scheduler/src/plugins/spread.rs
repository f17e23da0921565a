//! PodTopologySpread: `topologySpreadConstraints` with Kubernetes' semantics. A
//! `DoNotSchedule` constraint filters: placing the pod on a node must not make its domain's
//! count of matching pods exceed the smallest domain's by more than `maxSkew` (the smallest
//! is 0 while fewer than `minDomains` domains exist); nodes without the topology key are out.
//! `ScheduleAnyway` constraints score: fewer matching pods in a node's domain score higher,
//! each constraint weighted by the log of its number of domains. Domains and counts come
//! from nodes the pod's node affinity admits (`nodeAffinityPolicy: Honor`, the default) and,
//! with `nodeTaintsPolicy: Honor`, whose taints it tolerates.
//!
//! Counts come from the topology's incremental counters ([`crate::topology`]); a cycle reads
//! them without walking pods. When no inclusion policy narrows the nodes and every node
//! carrying the constraint's key carries the pod's other constraint keys too, domain counts
//! are read as kept (nodes without the key are in no domain); otherwise they are summed over
//! the admitted nodes (what kube-scheduler does for every pod).

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Pod};
use parking_lot::RwLock;

use crate::framework::{
    ClusterEvent, CycleState, FilterPlugin, MAX_NODE_SCORE, Plugin, PreFilterPlugin,
    PreScorePlugin, ScorePlugin, Status,
};
use crate::resources::{NodeInfo, PodInfo};
use crate::topology::{Clause, Labels, Match, NO_DOMAIN, Topology, evicted_matching, selector_of};

/// Registered name.
pub const NAME: &str = "PodTopologySpread";

/// Why a node fails a hard constraint.
pub const SKEW: &str = "node(s) didn't match pod topology spread constraints";
/// Why a node without a constraint's topology key fails.
pub const MISSING_LABEL: &str =
    "node(s) didn't match pod topology spread constraints (missing required label)";

const HOSTNAME: &str = "kubernetes.io/hostname";
const ZONE: &str = "topology.kubernetes.io/zone";

/// How pods without constraints of their own are spread.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize)]
pub enum Defaulting {
    /// Kubernetes' system defaults: `ScheduleAnyway` over hostnames (maxSkew 3) and zones
    /// (maxSkew 5), counting the pods selected like this one by its Services and its
    /// ReplicaSet or StatefulSet.
    #[default]
    System,
    /// The `defaultConstraints` listed (none: no default spreading).
    List,
}

/// A default constraint (`pluginConfig` of PodTopologySpread), applied with the pod's
/// default selector.
#[derive(Clone, Debug, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DefaultConstraint {
    /// `maxSkew` (at least 1).
    pub max_skew: i32,
    /// `topologyKey`.
    pub topology_key: String,
    /// `DoNotSchedule` or `ScheduleAnyway`.
    pub when_unsatisfiable: String,
}

/// `pluginConfig` args of PodTopologySpread.
#[derive(Clone, Debug, Default, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SpreadArgs {
    /// `System` (default) or `List`.
    #[serde(default)]
    pub defaulting_type: Defaulting,
    /// With `List`: the default constraints.
    #[serde(default)]
    pub default_constraints: Vec<DefaultConstraint>,
}

/// Kubernetes' system default constraints: (key, maxSkew).
const SYSTEM_DEFAULTS: [(&str, i64); 2] = [(HOSTNAME, 3), (ZONE, 5)];

static NO_LABELS: Labels = Labels::new();

/// One constraint, parsed.
#[derive(Clone, Debug)]
pub struct Constraint {
    /// `maxSkew`.
    pub max_skew: i64,
    /// `topologyKey`.
    pub key: String,
    /// `DoNotSchedule` (a filter) rather than `ScheduleAnyway` (a score).
    pub hard: bool,
    /// `minDomains` (1 when unset).
    pub min_domains: usize,
    /// The pods it counts (its selector, in the pod's namespace).
    pub what: Match,
    /// Count only nodes the pod's node affinity admits.
    pub honor_affinity: bool,
    /// Count only nodes whose NoSchedule/NoExecute taints the pod tolerates.
    pub honor_taints: bool,
    /// The pod matches its own selector (it will count once placed).
    pub self_match: bool,
    /// A system default: a node without its key skips this constraint only (own and listed
    /// constraints need every key on the node).
    pub system_default: bool,
}

/// The pod's constraints: its own, or else the defaults `args` give, with its default
/// selector (none when nothing selects it).
pub fn constraints(pod: &Pod, topo: &Topology, args: &SpreadArgs) -> Vec<Constraint> {
    let Some(spec) = pod.spec.as_ref() else {
        return Vec::new();
    };
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    let labels = pod.metadata.labels.as_ref().unwrap_or(&NO_LABELS);
    let own = spec
        .topology_spread_constraints
        .as_deref()
        .unwrap_or_default();
    if own.is_empty() {
        let system = args.defaulting_type == Defaulting::System;
        let defaults: Vec<(String, i64, bool)> = if system {
            SYSTEM_DEFAULTS
                .iter()
                .map(|(k, s)| ((*k).to_owned(), *s, false))
                .collect()
        } else {
            args.default_constraints
                .iter()
                .map(|c| {
                    let hard = c.when_unsatisfiable == "DoNotSchedule";
                    (c.topology_key.clone(), i64::from(c.max_skew.max(1)), hard)
                })
                .collect()
        };
        if defaults.is_empty() {
            return Vec::new();
        }
        let Some(selector) = topo.default_selector(pod) else {
            return Vec::new();
        };
        let self_match = selector.matches(labels);
        return defaults
            .into_iter()
            .map(|(key, max_skew, hard)| Constraint {
                max_skew,
                key,
                hard,
                min_domains: 1,
                what: Match(vec![Clause {
                    namespaces: std::iter::once(ns.clone()).collect(),
                    selector: Some(selector.clone()),
                }]),
                honor_affinity: true,
                honor_taints: false,
                self_match,
                system_default: system,
            })
            .collect();
    }
    own.iter()
        .map(|c| {
            let selector = selector_of(
                c.label_selector.as_ref(),
                c.match_label_keys.as_deref().unwrap_or_default(),
                &[],
                labels,
            );
            let self_match = selector.as_ref().is_some_and(|s| s.matches(labels));
            Constraint {
                max_skew: i64::from(c.max_skew.max(1)),
                key: c.topology_key.clone(),
                hard: c.when_unsatisfiable == "DoNotSchedule",
                min_domains: c.min_domains.unwrap_or(1).max(1) as usize,
                what: Match(vec![Clause {
                    namespaces: std::iter::once(ns.clone()).collect(),
                    selector,
                }]),
                honor_affinity: c.node_affinity_policy.as_deref() != Some("Ignore"),
                honor_taints: c.node_taints_policy.as_deref() == Some("Honor"),
                self_match,
                system_default: false,
            }
        })
        .collect()
}

fn has_node_affinity(pod: &Pod) -> bool {
    let Some(spec) = pod.spec.as_ref() else {
        return false;
    };
    spec.node_selector.as_ref().is_some_and(|m| !m.is_empty())
        || spec
            .affinity
            .as_ref()
            .and_then(|a| a.node_affinity.as_ref())
            .is_some_and(|a| {
                a.required_during_scheduling_ignored_during_execution
                    .is_some()
            })
}

/// Whether the inclusion policies of constraint `c` count `node`, for `pod`.
fn included_by_policy(c: &Constraint, pod: &Pod, node: &Node) -> bool {
    let labels = node.metadata.labels.as_ref().unwrap_or(&NO_LABELS);
    let spec = pod.spec.as_ref();
    if c.honor_affinity
        && let Some(spec) = spec
        && !tessera_runtime::affinity::node_admits(
            spec,
            labels,
            node.metadata.name.as_deref().unwrap_or(""),
        )
    {
        return false;
    }
    if c.honor_taints {
        let tols = spec
            .and_then(|s| s.tolerations.as_deref())
            .unwrap_or_default();
        let taints = node
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_deref())
            .unwrap_or_default();
        if taints.iter().any(|t| {
            (t.effect == "NoSchedule" || t.effect == "NoExecute")
                && !tessera_runtime::taints::tolerates(tols, t)
        }) {
            return false;
        }
    }
    true
}

/// Where a constraint's per-domain counts are read.
enum Counts {
    /// The counter's own counts by domain id (every node counts), read in place.
    Kept { id: usize, slot: usize },
    /// Summed over the included nodes for this pod, by domain id.
    Local(Vec<i64>),
}

impl Counts {
    fn get(&self, topo: &Topology, d: u32) -> i64 {
        match self {
            Counts::Kept { id, slot } => topo.count(*id, *slot, d),
            Counts::Local(v) => v.get(d as usize).copied().unwrap_or(0),
        }
    }
}

/// The ids of `keys`, all registered (by the counters made before the cycle).
fn key_ids(topo: &Topology, keys: &[&str]) -> Option<Vec<usize>> {
    keys.iter().map(|k| topo.key_id(k)).collect()
}

/// Counts for constraint `c` (whose key is `k`; a counted node must carry every key in
/// `keys`), and the number of domains and smallest count among them.
fn counts_of(
    topo: &Topology,
    pod: &Pod,
    c: &Constraint,
    k: usize,
    keys: &[usize],
) -> Result<(Counts, usize, i64), Status> {
    let unprepared = || Status::error("the spread counters were not prepared for this pod");
    let id = topo.counter(&c.what).ok_or_else(unprepared)?;
    let slot = topo.slot(id, k).ok_or_else(unprepared)?;
    let live = topo.live_count();
    // The kept counts of key `k` count pods on every node carrying `k` (nodes without it are
    // in no domain). They are this constraint's counts when no other key leaves such a node
    // out: every other key is on every node.
    let others_everywhere = keys
        .iter()
        .all(|k2| *k2 == k || topo.nodes_with_key(*k2) == live);
    let narrowed = (c.honor_affinity && has_node_affinity(pod)) || c.honor_taints;
    if others_everywhere && !narrowed {
        let domains = topo.live_domains(k);
        let (counts, nonzero) = topo.counts(id, slot);
        let min = if nonzero < domains {
            0
        } else {
            (0..topo.domain_ids(k) as u32)
                .filter(|d| topo.domain_is_live(k, *d))
                .map(|d| counts.get(d as usize).copied().unwrap_or(0))
                .min()
                .unwrap_or(0)
        };
        return Ok((Counts::Kept { id, slot }, domains, min));
    }
    if keys.iter().any(|k| topo.nodes_with_key(*k) == 0) {
        // No node carries one of the keys (zones in a fleet without zone labels, under the
        // system default constraints): no node is counted, without walking them all.
        return Ok((Counts::Local(vec![0; topo.domain_ids(k)]), 0, 0));
    }
    let per_node = topo.per_node(id);
    let mut local = vec![0i64; topo.domain_ids(k)];
    let mut included = vec![false; local.len()];
    for node in topo.live_nodes() {
        let name = node.metadata.name.as_deref().unwrap_or("");
        let ids = topo.node_domain_ids(name);
        if keys
            .iter()
            .any(|k| ids.get(*k).is_none_or(|d| *d == NO_DOMAIN))
        {
            continue;
        }
        if !included_by_policy(c, pod, node) {
            continue;
        }
        let d = ids[k] as usize;
        included[d] = true;
        local[d] += per_node.get(name).copied().unwrap_or(0);
    }
    let domains = included.iter().filter(|i| **i).count();
    let min = (0..local.len())
        .filter(|d| included[*d])
        .map(|d| local[d])
        .min()
        .unwrap_or(0);
    Ok((Counts::Local(local), domains, min))
}

/// The pod's scoring (`ScheduleAnyway`) constraints, as PreFilter parsed them.
struct Scored(Vec<Constraint>);

/// Where PreFilter leaves [`Scored`] for PreScore.
const SCORED: &str = "PodTopologySpread/scored";

struct FilterItem {
    key: usize,
    max_skew: i64,
    self_match: i64,
    min: i64,
    counts: Counts,
    /// The constraint (what it counts, its inclusion policies), for preemption's
    /// simulated evictions.
    constraint: Constraint,
}

impl FilterItem {
    /// The count of domain `d` of `node` and the smallest domain's count, without the pods
    /// a preemption simulation evicted from `node` (those are in `d`; they counted only if
    /// the constraint counts the node).
    fn counts_at(&self, topo: &Topology, pod: &Pod, node: &NodeInfo, d: u32) -> (i64, i64) {
        let count = self.counts.get(topo, d);
        if node.evicted.is_empty() {
            return (count, self.min);
        }
        let counted = match &self.counts {
            Counts::Kept { .. } => true,
            Counts::Local(_) => node
                .node
                .as_ref()
                .is_some_and(|n| included_by_policy(&self.constraint, pod, n)),
        };
        if !counted {
            return (count, self.min);
        }
        let count = count - evicted_matching(&node.evicted, &self.constraint.what);
        (count, self.min.min(count))
    }
}

struct ScoreItem {
    key: usize,
    weight: f64,
    max_skew: i64,
    counts: Counts,
    system_default: bool,
}

/// PodTopologySpread.
pub struct PodTopologySpread {
    topology: Arc<RwLock<Topology>>,
    args: SpreadArgs,
}

impl PodTopologySpread {
    /// The plugin with system default spreading, reading `topology`.
    pub fn new(topology: Arc<RwLock<Topology>>) -> Self {
        PodTopologySpread {
            topology,
            args: SpreadArgs::default(),
        }
    }

    /// The plugin with its `pluginConfig` args (checked: listed defaults only with `List`,
    /// each with a positive maxSkew, a key and a known action).
    pub fn with_args(topology: Arc<RwLock<Topology>>, args: SpreadArgs) -> Result<Self, String> {
        if args.defaulting_type == Defaulting::System && !args.default_constraints.is_empty() {
            return Err("defaultConstraints must be empty when defaultingType is System".into());
        }
        for (i, c) in args.default_constraints.iter().enumerate() {
            if c.max_skew < 1 {
                return Err(format!(
                    "defaultConstraints[{i}].maxSkew must be greater than zero"
                ));
            }
            if c.topology_key.is_empty() {
                return Err(format!("defaultConstraints[{i}].topologyKey is required"));
            }
            if !matches!(
                c.when_unsatisfiable.as_str(),
                "DoNotSchedule" | "ScheduleAnyway"
            ) {
                return Err(format!(
                    "defaultConstraints[{i}].whenUnsatisfiable must be DoNotSchedule or ScheduleAnyway, not {:?}",
                    c.when_unsatisfiable
                ));
            }
        }
        Ok(PodTopologySpread { topology, args })
    }
}

impl Plugin for PodTopologySpread {
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
        constraints(&pod.pod, topo, &self.args)
            .into_iter()
            .map(|c| (c.what, c.key))
            .collect()
    }
}

impl PreFilterPlugin for PodTopologySpread {
    fn pre_filter(&self, state: &mut CycleState, pod: &PodInfo) -> Status {
        let topo = self.topology.read();
        let (hard, soft): (Vec<Constraint>, Vec<Constraint>) =
            constraints(&pod.pod, &topo, &self.args)
                .into_iter()
                .partition(|c| c.hard);
        // PreScore reads them from here rather than parsing the pod (and finding its default
        // selector) again.
        state.write(SCORED, Scored(soft));
        if hard.is_empty() {
            return Status::skip();
        }
        let names: Vec<&str> = hard.iter().map(|c| c.key.as_str()).collect();
        let Some(keys) = key_ids(&topo, &names) else {
            return Status::error("the spread counters were not prepared for this pod");
        };
        let mut items = Vec::with_capacity(hard.len());
        for (c, &k) in hard.into_iter().zip(&keys) {
            let (counts, domains, min) = match counts_of(&topo, &pod.pod, &c, k, &keys) {
                Ok(x) => x,
                Err(s) => return s,
            };
            items.push(FilterItem {
                key: k,
                max_skew: c.max_skew,
                self_match: i64::from(c.self_match),
                min: if domains < c.min_domains { 0 } else { min },
                counts,
                constraint: c,
            });
        }
        drop(topo);
        state.write(NAME, items);
        Status::success()
    }
}

impl FilterPlugin for PodTopologySpread {
    fn reads_other_nodes(&self) -> bool {
        true
    }
    fn filter(&self, state: &CycleState, pod: &PodInfo, node: &NodeInfo) -> Status {
        let Some(items) = state.read::<Vec<FilterItem>>(NAME) else {
            return Status::error("PodTopologySpread's PreFilter did not run");
        };
        let topo = self.topology.read();
        for it in items {
            let d = topo.domain_of(node, it.key);
            if d == NO_DOMAIN {
                return Status::unresolvable(MISSING_LABEL);
            }
            let (count, min) = it.counts_at(&topo, &pod.pod, node, d);
            let skew = count + it.self_match - min;
            if skew > it.max_skew {
                return Status::unschedulable(SKEW);
            }
        }
        Status::success()
    }
    fn events(&self) -> &'static [ClusterEvent] {
        &[
            ClusterEvent::NodeAdd,
            ClusterEvent::NodeLabel,
            ClusterEvent::NodeTaint,
            ClusterEvent::AssignedPodAdd,
            ClusterEvent::AssignedPodDelete,
        ]
    }
    /// A node without the key waits for a node (new or relabelled); too much skew also
    /// for a pod to go from the node's domain or to arrive in the smallest.
    fn events_for(&self, rejection: &Status) -> &'static [ClusterEvent] {
        if rejection.reasons.iter().any(|r| r == MISSING_LABEL) {
            &[ClusterEvent::NodeAdd, ClusterEvent::NodeLabel]
        } else {
            self.events()
        }
    }
}

impl PreScorePlugin for PodTopologySpread {
    fn pre_score(&self, state: &mut CycleState, pod: &PodInfo, nodes: &[&NodeInfo]) -> Status {
        let topo = self.topology.read();
        let soft: std::borrow::Cow<'_, [Constraint]> = match state.read::<Scored>(SCORED) {
            Some(s) => std::borrow::Cow::Borrowed(&s.0),
            // PreFilter is not enabled in this profile.
            None => constraints(&pod.pod, &topo, &self.args)
                .into_iter()
                .filter(|c| !c.hard)
                .collect(),
        };
        if soft.is_empty() {
            return Status::skip();
        }
        let names: Vec<&str> = soft.iter().map(|c| c.key.as_str()).collect();
        let ids: Vec<Option<usize>> = names.iter().map(|k| topo.key_id(k)).collect();
        let mut items = Vec::with_capacity(soft.len());
        for (c, k) in soft.iter().zip(&ids) {
            let Some(k) = *k else {
                if c.system_default {
                    continue;
                }
                return Status::error("the spread counters were not prepared for this pod");
            };
            // System defaults need only their own key on a node.
            let keys: Vec<usize> = if c.system_default {
                vec![k]
            } else {
                ids.iter().flatten().copied().collect()
            };
            let (counts, _, _) = match counts_of(&topo, &pod.pod, c, k, &keys) {
                Ok(x) => x,
                // The pod's Services or owner changed since its counters were made: its
                // default spreading sits this cycle out.
                Err(_) if c.system_default => continue,
                Err(s) => return s,
            };
            // Domains among the nodes being scored (each node is its own for hostname).
            let size = if c.key == HOSTNAME {
                nodes.len()
            } else {
                let mut seen = vec![false; topo.domain_ids(k)];
                for n in nodes {
                    let d = topo.domain_of(n, k);
                    if d != NO_DOMAIN {
                        seen[d as usize] = true;
                    }
                }
                seen.iter().filter(|s| **s).count()
            };
            items.push(ScoreItem {
                key: k,
                weight: ((size + 2) as f64).ln(),
                max_skew: c.max_skew,
                counts,
                system_default: c.system_default,
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

/// A node missing a scored constraint's key: scored 0 after normalizing.
const IGNORED: i64 = -1;

impl ScorePlugin for PodTopologySpread {
    fn score(&self, state: &CycleState, _: &PodInfo, node: &NodeInfo) -> Result<i64, Status> {
        let Some(items) = state.read::<Vec<ScoreItem>>(NAME) else {
            return Ok(0);
        };
        let topo = self.topology.read();
        let mut score = 0.0;
        for it in items {
            let d = topo.domain_of(node, it.key);
            if d == NO_DOMAIN {
                if it.system_default {
                    continue;
                }
                return Ok(IGNORED);
            }
            let count = it.counts.get(&topo, d);
            score += count as f64 * it.weight + (it.max_skew - 1) as f64;
        }
        Ok(score.round() as i64)
    }

    /// Fewer matching pods is better: `MAX * (max + min - s) / max`; ignored nodes get 0.
    fn normalize(&self, _: &CycleState, _: &PodInfo, scores: &mut [i64]) -> Status {
        let valid = scores.iter().copied().filter(|s| *s != IGNORED);
        let min = valid.clone().min().unwrap_or(0);
        let max = valid.max().unwrap_or(0);
        for s in scores.iter_mut() {
            *s = if *s == IGNORED {
                0
            } else if max == 0 {
                MAX_NODE_SCORE
            } else {
                MAX_NODE_SCORE * (max + min - *s) / max
            };
        }
        Status::success()
    }
}
