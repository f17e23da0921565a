//! NodeAffinity: `spec.nodeSelector` and required node affinity (terms ORed, expressions
//! ANDed, `matchFields` on `metadata.name`) filter nodes; preferred terms add their weights
//! to a node's score.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::PreferredSchedulingTerm;

use crate::framework::{
    ClusterEvent, CycleState, FilterPlugin, MAX_NODE_SCORE, Plugin, PreFilterPlugin,
    PreScorePlugin, ScorePlugin, Status,
};
use crate::resources::{NodeInfo, PodInfo};

/// Registered name.
pub const NAME: &str = "NodeAffinity";

pub use tessera_runtime::affinity::term_matches;

/// The node labels a pod's node must have, as `(key, values)` pairs each asking for one of
/// the values: every `nodeSelector` entry, and the `In` expressions of a required node
/// affinity of a single term (several terms are ORed and say no one label for certain).
/// Two constraints on one key keep the values both allow. Sorted by key. What the
/// federation needs to judge a shard by the nodes a replica may use.
pub fn required_node_labels(
    spec: Option<&k8s_openapi::api::core::v1::PodSpec>,
) -> Vec<(String, Vec<String>)> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut add = |k: &str, vs: Vec<String>| match out.get_mut(k) {
        Some(have) => have.retain(|v| vs.contains(v)),
        None => {
            let mut vs = vs;
            vs.sort();
            vs.dedup();
            out.insert(k.to_owned(), vs);
        }
    };
    let Some(spec) = spec else {
        return Vec::new();
    };
    for (k, v) in spec.node_selector.iter().flatten() {
        add(k, vec![v.clone()]);
    }
    let terms = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|a| {
            a.required_during_scheduling_ignored_during_execution
                .as_ref()
        })
        .map(|r| r.node_selector_terms.as_slice())
        .unwrap_or_default();
    if let [term] = terms {
        for e in term.match_expressions.iter().flatten() {
            if e.operator == "In" {
                add(&e.key, e.values.clone().unwrap_or_default());
            }
        }
    }
    out.into_iter().collect()
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
    tessera_runtime::affinity::node_admits(spec, labels, &node.name)
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

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::PodSpec;
    use serde_json::json;

    use super::required_node_labels;

    fn spec(v: serde_json::Value) -> PodSpec {
        serde_json::from_value(v).expect("a pod spec")
    }

    #[test]
    fn the_labels_a_pods_node_must_have() {
        let s = spec(json!({"containers": [],
            "nodeSelector": {"topology.kubernetes.io/zone": "a", "pool": "x"},
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a", "b"]},
                    {"key": "gpu", "operator": "Exists"},
                    {"key": "type", "operator": "In", "values": ["m5", "c5", "m5"]}]}]}}}}));
        assert_eq!(
            required_node_labels(Some(&s)),
            vec![
                ("pool".to_owned(), vec!["x".to_owned()]),
                (
                    "topology.kubernetes.io/zone".to_owned(),
                    vec!["a".to_owned()]
                ),
                ("type".to_owned(), vec!["c5".to_owned(), "m5".to_owned()]),
            ]
        );
        // Terms are ORed: two of them say nothing for certain.
        let two = spec(json!({"containers": [],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "z", "operator": "In", "values": ["a"]}]},
                    {"matchExpressions": [{"key": "z", "operator": "In", "values": ["b"]}]}]}}}}));
        assert!(required_node_labels(Some(&two)).is_empty());
        assert!(required_node_labels(None).is_empty());
    }
}
