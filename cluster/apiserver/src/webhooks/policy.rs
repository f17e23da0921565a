//! ValidatingAdmissionPolicies and their bindings (`admissionregistration.k8s.io/v1`),
//! compiled: which requests a policy and a binding select, the CEL of its match
//! conditions, variables, validations and audit annotations, and the parameters a binding
//! points at. Evaluating them per request is `api/webhooks.rs`'s.
//!
//! A policy does nothing until a binding names it; a binding names one policy, may narrow
//! what it selects (`matchResources`), gives its parameters (`paramRef`) and decides what a
//! failed validation does (`validationActions`: Deny, Warn, Audit).

use std::sync::Arc;

use serde_json::Value;

use super::{Attributes, Condition, Lookup, Rule, Selectors, conditions, listed, rules_select};
use crate::cel::Expression;

/// The variables a policy's expressions may read (`authorizer` is refused when it is
/// written).
pub const VARIABLES: [&str; 7] = [
    "object",
    "oldObject",
    "request",
    "params",
    "namespaceObject",
    "variables",
    "authorizer",
];

/// The reasons a validation may give, with their HTTP codes.
pub const REASONS: [(&str, u16); 4] = [
    ("Unauthorized", 401),
    ("Forbidden", 403),
    ("Invalid", 422),
    ("RequestEntityTooLarge", 413),
];

/// A rule of `resourceRules`/`excludeResourceRules`, with its `resourceNames`.
#[derive(Debug)]
struct NamedRule {
    rule: Rule,
    names: Vec<String>,
}

impl NamedRule {
    fn of(v: &Value) -> NamedRule {
        NamedRule {
            rule: Rule::of(v),
            names: v["resourceNames"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|n| n.as_str().map(str::to_owned))
                .collect(),
        }
    }

    fn names(&self, name: &str) -> bool {
        self.names.is_empty() || self.names.iter().any(|n| n == name)
    }
}

/// `matchConstraints` of a policy or `matchResources` of a binding.
#[derive(Debug)]
pub struct Matcher {
    rules: Vec<NamedRule>,
    exclude: Vec<NamedRule>,
    /// Its namespace and object selectors.
    pub selectors: Selectors,
    equivalent: bool,
}

impl Matcher {
    fn of(v: &Value) -> Matcher {
        let rules = |key: &str| -> Vec<NamedRule> {
            v[key]
                .as_array()
                .into_iter()
                .flatten()
                .map(NamedRule::of)
                .collect()
        };
        Matcher {
            rules: rules("resourceRules"),
            exclude: rules("excludeResourceRules"),
            selectors: Selectors::of(v),
            equivalent: v["matchPolicy"] != "Exact",
        }
    }

    /// The version the request is seen in if the rules select it (and no exclusion does);
    /// `name`: the object's name, for `resourceNames`.
    pub fn selects(&self, a: &Attributes<'_>, name: &str, served: &dyn Lookup) -> Option<String> {
        let excluded = self.exclude.iter().any(|x| {
            x.names(name) && x.rule.selects_but_version(a) && listed(&x.rule.versions, a.version)
        });
        if excluded {
            return None;
        }
        rules_select(
            self.rules.iter().filter(|r| r.names(name)).map(|r| &r.rule),
            self.equivalent,
            a,
            served,
        )
    }
}

/// One of a policy's `validations`.
#[derive(Debug)]
pub struct Validation {
    /// Must be true.
    pub expression: Expression,
    /// `message`, if any.
    pub message: Option<String>,
    /// `messageExpression`, if any.
    pub message_expression: Option<Expression>,
    /// `reason` and its HTTP code.
    pub reason: (&'static str, u16),
}

/// A compiled ValidatingAdmissionPolicy.
#[derive(Debug)]
pub struct Policy {
    /// Its name.
    pub name: String,
    /// `failurePolicy: Ignore`: an expression that fails to evaluate, or a binding that
    /// cannot be honoured, lets the request through instead of refusing it.
    pub fail_open: bool,
    /// `paramKind` as (apiVersion, kind).
    pub param_kind: Option<(String, String)>,
    /// `matchConstraints`.
    pub constraints: Matcher,
    /// `matchConditions`.
    pub conditions: Vec<Condition>,
    /// `variables`, in order (each may read those before it).
    pub variables: Vec<(String, Expression)>,
    /// `validations`.
    pub validations: Vec<Validation>,
    /// `auditAnnotations` as (key, valueExpression).
    pub audit_annotations: Vec<(String, Expression)>,
    /// Whether an expression reads `namespaceObject` (else the namespace is not read).
    pub reads_namespace: bool,
}

fn compiled(src: Option<&str>) -> Option<Expression> {
    crate::cel::compile(src?, &VARIABLES).ok()
}

impl Policy {
    /// Compiles a stored policy (validated when written: parts that do not compile now are
    /// left out).
    pub fn compile(name: &str, obj: &Value) -> Arc<Policy> {
        let spec = &obj["spec"];
        let list = |key: &str| spec[key].as_array().cloned().unwrap_or_default();
        let validations: Vec<Validation> = list("validations")
            .iter()
            .filter_map(|v| {
                let reason = v["reason"].as_str().unwrap_or("Invalid");
                Some(Validation {
                    expression: compiled(v["expression"].as_str())?,
                    message: v["message"]
                        .as_str()
                        .filter(|m| !m.is_empty())
                        .map(str::to_owned),
                    message_expression: compiled(v["messageExpression"].as_str()),
                    reason: REASONS
                        .iter()
                        .find(|(r, _)| *r == reason)
                        .copied()
                        .unwrap_or(("Invalid", 422)),
                })
            })
            .collect();
        let variables: Vec<(String, Expression)> = list("variables")
            .iter()
            .filter_map(|v| {
                Some((
                    v["name"].as_str()?.to_owned(),
                    compiled(v["expression"].as_str())?,
                ))
            })
            .collect();
        let audit_annotations: Vec<(String, Expression)> = list("auditAnnotations")
            .iter()
            .filter_map(|v| {
                Some((
                    v["key"].as_str()?.to_owned(),
                    compiled(v["valueExpression"].as_str())?,
                ))
            })
            .collect();
        let conditions = conditions(&spec["matchConditions"], &VARIABLES);
        let reads_namespace = validations
            .iter()
            .flat_map(|v| std::iter::once(&v.expression).chain(&v.message_expression))
            .chain(variables.iter().map(|(_, e)| e))
            .chain(audit_annotations.iter().map(|(_, e)| e))
            .chain(conditions.iter().map(|c| &c.expression))
            .any(|e| e.uses("namespaceObject"));
        let param_kind = match (
            spec["paramKind"]["apiVersion"].as_str(),
            spec["paramKind"]["kind"].as_str(),
        ) {
            (Some(v), Some(k)) => Some((v.to_owned(), k.to_owned())),
            _ => None,
        };
        Arc::new(Policy {
            name: name.to_owned(),
            fail_open: spec["failurePolicy"] == "Ignore",
            param_kind,
            constraints: Matcher::of(&spec["matchConstraints"]),
            conditions,
            variables,
            validations,
            audit_annotations,
            reads_namespace,
        })
    }
}

/// A binding's `paramRef`.
#[derive(Debug)]
pub struct ParamRef {
    /// One object by name.
    pub name: Option<String>,
    /// Its namespace (else the request's, for a namespaced parameter kind).
    pub namespace: Option<String>,
    /// Every object a label selector selects (one evaluation each).
    pub selector: Option<Value>,
    /// `parameterNotFoundAction: Deny`: no parameter refuses the request (else the
    /// binding is skipped).
    pub deny_if_missing: bool,
}

/// A compiled ValidatingAdmissionPolicyBinding.
#[derive(Debug)]
pub struct Binding {
    /// Its name.
    pub name: String,
    /// The policy it binds.
    pub policy: String,
    /// Its parameters.
    pub param_ref: Option<ParamRef>,
    /// `matchResources`, narrowing what the policy selects.
    pub resources: Option<Matcher>,
    /// `validationActions` holds Deny.
    pub deny: bool,
    /// … Warn.
    pub warn: bool,
    /// … Audit.
    pub audit: bool,
}

impl Binding {
    /// Compiles a stored binding.
    pub fn compile(name: &str, obj: &Value) -> Arc<Binding> {
        let spec = &obj["spec"];
        let actions: Vec<&str> = spec["validationActions"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        let p = &spec["paramRef"];
        let param_ref = p.is_object().then(|| ParamRef {
            name: p["name"].as_str().map(str::to_owned),
            namespace: p["namespace"].as_str().map(str::to_owned),
            selector: p.get("selector").filter(|s| s.is_object()).cloned(),
            deny_if_missing: p["parameterNotFoundAction"] != "Allow",
        });
        Arc::new(Binding {
            name: name.to_owned(),
            policy: spec["policyName"].as_str().unwrap_or_default().to_owned(),
            param_ref,
            resources: spec
                .get("matchResources")
                .filter(|m| m.is_object())
                .map(Matcher::of),
            deny: actions.contains(&"Deny"),
            warn: actions.contains(&"Warn"),
            audit: actions.contains(&"Audit"),
        })
    }
}

/// A policy with one of its bindings: one unit of evaluation.
#[derive(Debug, Clone)]
pub struct Bound {
    /// The policy.
    pub policy: Arc<Policy>,
    /// The binding.
    pub binding: Arc<Binding>,
}

impl Bound {
    /// The version the request is seen in, if both the policy's constraints and the
    /// binding's resources (if any) select it by rules.
    pub fn selects(&self, a: &Attributes<'_>, name: &str, served: &dyn Lookup) -> Option<String> {
        let version = self.policy.constraints.selects(a, name, served)?;
        match &self.binding.resources {
            Some(m) if !m.rules.is_empty() => m.selects(a, name, served).map(|_| version),
            _ => Some(version),
        }
    }

    /// The selectors both must pass.
    pub fn selectors(&self) -> impl Iterator<Item = &Selectors> {
        std::iter::once(&self.policy.constraints.selectors)
            .chain(self.binding.resources.as_ref().map(|m| &m.selectors))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::webhooks::Operation;
    use serde_json::json;

    fn attrs(op: Operation, resource: &str) -> Attributes<'_> {
        Attributes {
            operation: op,
            group: "apps",
            version: "v1",
            resource,
            subresource: None,
            namespaced: true,
        }
    }

    #[test]
    fn constraints_and_binding_resources_both_select() {
        let policy = Policy::compile(
            "p",
            &json!({"spec": {"matchConstraints": {"resourceRules": [
                {"apiGroups": ["apps"], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
                 "resources": ["deployments", "statefulsets"]}],
                "excludeResourceRules": [{"apiGroups": ["apps"], "apiVersions": ["v1"],
                 "operations": ["*"], "resources": ["deployments"], "resourceNames": ["exempt"]}]},
                "validations": [{"expression": "object.spec.replicas <= 5"}]}}),
        );
        let bind = |spec: Value| Bound {
            policy: policy.clone(),
            binding: Binding::compile("b", &json!({"spec": spec})),
        };
        let served = crate::catalog::Builtin;
        let all = bind(json!({"policyName": "p", "validationActions": ["Deny"]}));
        assert!(all.binding.deny && !all.binding.warn);
        assert_eq!(
            all.selects(&attrs(Operation::Create, "deployments"), "web", &served),
            Some("v1".into())
        );
        assert_eq!(
            all.selects(&attrs(Operation::Create, "deployments"), "exempt", &served),
            None
        );
        assert_eq!(
            all.selects(&attrs(Operation::Delete, "deployments"), "web", &served),
            None
        );
        let narrowed = bind(json!({"policyName": "p", "validationActions": ["Warn"],
            "matchResources": {"resourceRules": [{"apiGroups": ["apps"], "apiVersions": ["v1"],
                "operations": ["CREATE"], "resources": ["statefulsets"]}]}}));
        assert_eq!(
            narrowed.selects(&attrs(Operation::Create, "deployments"), "web", &served),
            None
        );
        assert_eq!(
            narrowed.selects(&attrs(Operation::Create, "statefulsets"), "db", &served),
            Some("v1".into())
        );
        assert_eq!(policy.validations.len(), 1);
        assert_eq!(policy.validations[0].reason, ("Invalid", 422));
    }
}
