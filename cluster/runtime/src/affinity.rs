//! Node selector terms by Kubernetes' rules — shared by the scheduler's NodeAffinity plugin
//! and the DaemonSet controller (which nodes a daemon pod belongs on).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{NodeSelectorRequirement, NodeSelectorTerm, PodSpec};

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

/// True if a pod of `spec` may run on a node with `labels` and `name` by its `nodeSelector`
/// and its required node affinity (terms ORed).
pub fn node_admits(spec: &PodSpec, labels: &BTreeMap<String, String>, name: &str) -> bool {
    if let Some(sel) = &spec.node_selector
        && !sel.iter().all(|(k, v)| labels.get(k) == Some(v))
    {
        return false;
    }
    let Some(required) = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| {
            n.required_during_scheduling_ignored_during_execution
                .as_ref()
        })
    else {
        return true;
    };
    required
        .node_selector_terms
        .iter()
        .any(|t| term_matches(t, labels, name))
}
