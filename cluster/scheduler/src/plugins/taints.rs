//! TaintToleration: a node's NoSchedule/NoExecute taints keep off pods that do not tolerate
//! them; PreferNoSchedule taints only lower the node's score.

use k8s_openapi::api::core::v1::{Taint, Toleration};

use crate::framework::{
    ClusterEvent, CycleState, FilterPlugin, MAX_NODE_SCORE, Plugin, PreScorePlugin, ScorePlugin,
    Status,
};
use crate::resources::{NodeInfo, PodInfo};

/// Registered name.
pub const NAME: &str = "TaintToleration";

pub use tessera_runtime::taints::{tolerates, toleration_matches};

fn taints(node: &NodeInfo) -> &[Taint] {
    &node.taints
}

fn tolerations(pod: &PodInfo) -> &[Toleration] {
    pod.pod
        .spec
        .as_ref()
        .and_then(|s| s.tolerations.as_deref())
        .unwrap_or_default()
}

/// TaintToleration.
pub struct TaintToleration;

impl Plugin for TaintToleration {
    fn name(&self) -> &'static str {
        NAME
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

impl FilterPlugin for TaintToleration {
    fn filter(&self, _: &CycleState, pod: &PodInfo, node: &NodeInfo) -> Status {
        if node.taints.is_empty() {
            return Status::success();
        }
        let tol = tolerations(pod);
        let bad = taints(node)
            .iter()
            .find(|t| (t.effect == "NoSchedule" || t.effect == "NoExecute") && !tolerates(tol, t));
        match bad {
            None => Status::success(),
            Some(t) => Status::unresolvable(format!(
                "node(s) had untolerated taint {{{}: {}}}",
                t.key,
                t.value.as_deref().unwrap_or("")
            ))
            .by(NAME),
        }
    }
    fn events(&self) -> &'static [ClusterEvent] {
        &[ClusterEvent::NodeAdd, ClusterEvent::NodeTaint]
    }
}

impl PreScorePlugin for TaintToleration {
    fn pre_score(&self, _: &mut CycleState, _: &PodInfo, nodes: &[&NodeInfo]) -> Status {
        let any = nodes
            .iter()
            .any(|n| taints(n).iter().any(|t| t.effect == "PreferNoSchedule"));
        if any {
            Status::success()
        } else {
            Status::skip()
        }
    }
}

impl ScorePlugin for TaintToleration {
    fn score(&self, _: &CycleState, pod: &PodInfo, node: &NodeInfo) -> Result<i64, Status> {
        let tol = tolerations(pod);
        Ok(taints(node)
            .iter()
            .filter(|t| t.effect == "PreferNoSchedule" && !tolerates(tol, t))
            .count() as i64)
    }
    fn normalize(&self, _: &CycleState, _: &PodInfo, scores: &mut [i64]) -> Status {
        // Fewer intolerable taints is better: reverse onto 0..=100.
        let max = scores.iter().copied().max().unwrap_or(0);
        for s in scores.iter_mut() {
            *s = if max == 0 {
                MAX_NODE_SCORE
            } else {
                MAX_NODE_SCORE - *s * MAX_NODE_SCORE / max
            };
        }
        Status::success()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn taint(k: &str, v: &str, e: &str) -> Taint {
        Taint {
            key: k.into(),
            value: Some(v.into()),
            effect: e.into(),
            ..Default::default()
        }
    }

    fn tol(k: Option<&str>, op: Option<&str>, v: Option<&str>, e: Option<&str>) -> Toleration {
        Toleration {
            key: k.map(Into::into),
            operator: op.map(Into::into),
            value: v.map(Into::into),
            effect: e.map(Into::into),
            ..Default::default()
        }
    }

    #[test]
    fn toleration_rules() {
        let t = taint("gpu", "yes", "NoSchedule");
        let cases = [
            (tol(Some("gpu"), None, Some("yes"), None), true),
            (tol(Some("gpu"), Some("Equal"), Some("no"), None), false),
            (
                tol(Some("gpu"), Some("Exists"), None, Some("NoSchedule")),
                true,
            ),
            (
                tol(Some("gpu"), Some("Exists"), None, Some("NoExecute")),
                false,
            ),
            (tol(None, Some("Exists"), None, None), true),
            (tol(Some("other"), Some("Exists"), None, None), false),
        ];
        for (i, (tol, want)) in cases.iter().enumerate() {
            assert_eq!(toleration_matches(tol, &t), *want, "case {i}");
        }
    }
}
