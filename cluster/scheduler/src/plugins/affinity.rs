//! NodeAffinity: `spec.nodeSelector` and required node affinity (terms ORed, expressions
//! ANDed, `matchFields` on `metadata.name`) filter nodes; preferred terms add their weights
//! to a node's score.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    NodeSelectorRequirement, NodeSelectorTerm, PreferredSchedulingTerm,
};

use crate::framework::{
    ClusterEvent, CycleState, FilterPlugin, MAX_NODE_SCORE, Plugin, PreFilterPlugin,
    PreScorePlugin, ScorePlugin, Status,
};
use crate::resources::{NodeInfo, PodInfo};

/// Registered name.
pub const NAME: &str = "NodeAffinity";

fn requirement_matches(r: &NodeSelectorRequirement, value: Option<&str>) -> bool {
    let values = r.values.as_deref().unwrap_or_default();
    let int = |s: &str| s.parse::<i64>().ok();
    match (r.operator.as_str(), value) {
        ("In", Some(v)) => values.iter().any(|x| x == v),
        ("NotIn", v) => v.is_none_or(|v| !values.iter().any(|x| x == v)),
        ("Exists", v) => v.is_some(),
        ("DoesNotExist", v) => v.is_none(),
        ("Gt", Some(v)) => {
            matches!((int(v), values.first().and_then(|x| int(x))), (Some(a), Some(b)) if a > b)
        }
        ("Lt", Some(v)) => {
            matches!((int(v), values.first().and_then(|x| int(x))), (Some(a), Some(b)) if a < b)
        }
        _ => false,
    }
}

/// True if `term` matches a node with `labels` and `name` (an empty term matches nothing).
pub fn term_matches(
    term: &NodeSelectorTerm,
    labels: &BTreeMap<String, String>,
    name: &str,
) -> bool {
    let exprs = term.match_expressions.as_deref().unwrap_or_default();
    let fields = term.match_fields.as_deref().unwrap_or_default();
    if exprs.is_empty() && fields.is_empty() {
        return false;
    }
    exprs
        .iter()
        .all(|r| requirement_matches(r, labels.get(&r.key).map(String::as_str)))
        && fields.iter().all(|r| {
            let v = (r.key == "metadata.name").then_some(name);
            requirement_matches(r, v)
        })
}

fn preferred(pod: &PodInfo) -> &[PreferredSchedulingTerm] {
    pod.pod
        .spec
        .as_ref()
        .and_then(|s| s.affinity.as_ref())
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|a| {
            a.preferred_during_scheduling_ignored_during_execution
                .as_deref()
        })
        .unwrap_or_default()
}

/// True if the pod's nodeSelector and required node affinity admit the node.
pub fn admits(pod: &PodInfo, node: &NodeInfo) -> bool {
    static EMPTY: BTreeMap<String, String> = BTreeMap::new();
    let labels = node.labels().unwrap_or(&EMPTY);
    let Some(spec) = pod.pod.spec.as_ref() else {
        return true;
    };
    if let Some(sel) = &spec.node_selector
        && !sel.iter().all(|(k, v)| labels.get(k) == Some(v))
    {
        return false;
    }
    let required = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|a| {
            a.required_during_scheduling_ignored_during_execution
                .as_ref()
        });
    match required {
        None => true,
        Some(r) => r
            .node_selector_terms
            .iter()
            .any(|t| term_matches(t, labels, &node.name)),
    }
}

/// NodeAffinity.
pub struct NodeAffinity;

impl Plugin for NodeAffinity {
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
}

impl PreFilterPlugin for NodeAffinity {
    fn pre_filter(&self, _: &mut CycleState, pod: &PodInfo) -> Status {
        let spec = pod.pod.spec.as_ref();
        let has_selector = spec
            .and_then(|s| s.node_selector.as_ref())
            .is_some_and(|m| !m.is_empty());
        let has_required = spec
            .and_then(|s| s.affinity.as_ref())
            .and_then(|a| a.node_affinity.as_ref())
            .and_then(|a| {
                a.required_during_scheduling_ignored_during_execution
                    .as_ref()
            })
            .is_some();
        if has_selector || has_required {
            Status::success()
        } else {
            Status::skip()
        }
    }
}

impl FilterPlugin for NodeAffinity {
    fn filter(&self, _: &CycleState, pod: &PodInfo, node: &NodeInfo) -> Status {
        if admits(pod, node) {
            Status::success()
        } else {
            Status::unresolvable("node(s) didn't match Pod's node affinity/selector").by(NAME)
        }
    }
    fn events(&self) -> &'static [ClusterEvent] {
        &[ClusterEvent::NodeAdd, ClusterEvent::NodeLabel]
    }
}

impl PreScorePlugin for NodeAffinity {
    fn pre_score(&self, _: &mut CycleState, pod: &PodInfo, _: &[&NodeInfo]) -> Status {
        if preferred(pod).is_empty() {
            Status::skip()
        } else {
            Status::success()
        }
    }
}

impl ScorePlugin for NodeAffinity {
    fn score(&self, _: &CycleState, pod: &PodInfo, node: &NodeInfo) -> Result<i64, Status> {
        static EMPTY: BTreeMap<String, String> = BTreeMap::new();
        let labels = node.labels().unwrap_or(&EMPTY);
        Ok(preferred(pod)
            .iter()
            .filter(|t| term_matches(&t.preference, labels, &node.name))
            .map(|t| i64::from(t.weight))
            .sum())
    }
    fn normalize(&self, _: &CycleState, _: &PodInfo, scores: &mut [i64]) -> Status {
        let max = scores.iter().copied().max().unwrap_or(0);
        if max > 0 {
            for s in scores.iter_mut() {
                *s = *s * MAX_NODE_SCORE / max;
            }
        }
        Status::success()
    }
}
