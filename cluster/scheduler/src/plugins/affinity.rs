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
