//! From a `metav1.LabelSelector` (matchLabels and matchExpressions) to a selector that
//! matches label maps.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector as Metav1Selector;
use tessera_core::LabelSelector;
use tessera_core::selector::label::{Operator, Requirement};

/// The selector `s` describes; an error names an operator Kubernetes does not know.
pub fn from_metav1(s: &Metav1Selector) -> Result<LabelSelector, String> {
    let mut reqs = Vec::new();
    for (k, v) in s.match_labels.iter().flatten() {
        reqs.push(Requirement {
            key: k.clone(),
            operator: Operator::Equals,
            values: vec![v.clone()],
        });
    }
    for e in s.match_expressions.iter().flatten() {
        let operator = match e.operator.as_str() {
            "In" => Operator::In,
            "NotIn" => Operator::NotIn,
            "Exists" => Operator::Exists,
            "DoesNotExist" => Operator::DoesNotExist,
            other => return Err(format!("unknown label selector operator {other:?}")),
        };
        reqs.push(Requirement {
            key: e.key.clone(),
            operator,
            values: e.values.clone().unwrap_or_default(),
        });
    }
    Ok(LabelSelector::from_requirements(reqs))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;
    use std::collections::BTreeMap;

    #[test]
    fn match_labels_and_expressions_all_apply() {
        let s = Metav1Selector {
            match_labels: Some(BTreeMap::from([("app".into(), "web".into())])),
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "tier".into(),
                operator: "NotIn".into(),
                values: Some(vec!["db".into()]),
            }]),
        };
        let sel = from_metav1(&s).expect("valid");
        let labels = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        assert!(sel.matches(&labels(&[("app", "web")])));
        assert!(sel.matches(&labels(&[("app", "web"), ("tier", "front")])));
        assert!(!sel.matches(&labels(&[("app", "web"), ("tier", "db")])));
        assert!(!sel.matches(&labels(&[("app", "api")])));
        let bad = Metav1Selector {
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "x".into(),
                operator: "Near".into(),
                values: None,
            }]),
            ..Default::default()
        };
        assert!(from_metav1(&bad).is_err_and(|e| e.contains("Near")));
    }
}
