//! ValidatingAdmissionPolicies on the write path ([`crate::webhooks::policy`]): in the
//! validating phase, before validating webhooks, as in kube-apiserver. For each binding
//! whose policy and own `matchResources` select the request: its parameters are read, the
//! match conditions decide, the variables are computed in order, and every validation is
//! evaluated; a failed one is acted on as the binding says (Deny refuses the request, Warn
//! adds a warning, Audit logs it). An expression that cannot be evaluated, or a binding
//! whose parameters cannot be found, follows the policy's `failurePolicy`.

use cel::objects::{Key, Map};

use super::webhooks::{Admission, view};
use super::*;
use crate::cel::{Binding, Converted};
use crate::webhooks::policy::{Bound, ParamRef};

/// What one policy check concluded.
enum Outcome {
    /// Every validation held, or a condition did not (nothing to do).
    Allowed,
    Skipped,
    /// Validations failed: their messages and the first one's reason and code.
    Failed(Vec<String>, (&'static str, u16)),
    /// An expression or the parameters failed.
    Error(String),
}

impl Api {
    /// Runs the ValidatingAdmissionPolicies bound to the request (`obj`: the object written,
    /// `old`: the stored one of an update or delete).
    pub(super) async fn validate_by_policies(
        &self,
        a: &mut Admission<'_>,
        obj: Option<&Value>,
        old: Option<&Value>,
        warnings: &mut Vec<String>,
    ) -> Result<(), ApiError> {
        if a.snapshot.policies.is_empty() {
            return Ok(());
        }
        let attrs = Api::attributes(a.req, a.operation);
        let served = self.crds.current();
        let name = a
            .req
            .name
            .clone()
            .or_else(|| {
                obj.or(old)
                    .and_then(|o| o["metadata"]["name"].as_str())
                    .map(str::to_owned)
            })
            .unwrap_or_default();
        let snapshot = a.snapshot.clone();
        // Converted for CEL once, when the first policy selects the request.
        let values: std::cell::OnceCell<[Value; 3]> = std::cell::OnceCell::new();
        let converted: std::cell::OnceCell<[Converted<'_>; 3]> = std::cell::OnceCell::new();
        for bound in &snapshot.policies {
            let Some(version) = bound.selects(&attrs, &name, served.as_ref()) else {
                continue;
            };
            if !bound.selectors().all(|s| s.object_matches(obj, old)) {
                continue;
            }
            let mut in_namespace = true;
            for s in bound.selectors() {
                if !self.namespace_selected(a, s, obj, old).await? {
                    in_namespace = false;
                    break;
                }
            }
            if !in_namespace {
                continue;
            }
            let [object, old_object, request] = converted.get_or_init(|| {
                let [o, old_o, r] = values.get_or_init(|| {
                    let review = Api::review(a, obj);
                    [
                        obj.map(|o| view(a.req, self, o)).unwrap_or(Value::Null),
                        old.map(|o| view(a.req, self, o)).unwrap_or(Value::Null),
                        review.body(&version, None, None)["request"].take(),
                    ]
                });
                [Converted::of(o), Converted::of(old_o), Converted::of(r)]
            });
            let inputs = Inputs {
                object,
                old_object,
                request,
            };
            self.check_policy(a, bound, &name, &inputs, warnings)
                .await?;
        }
        Ok(())
    }

    /// One policy with one binding: each parameter checked.
    async fn check_policy(
        &self,
        a: &Admission<'_>,
        bound: &Bound,
        name: &str,
        inputs: &Inputs<'_>,
        warnings: &mut Vec<String>,
    ) -> Result<(), ApiError> {
        let (policy, binding) = (&bound.policy, &bound.binding);
        let namespace = match a.req.namespace.as_deref() {
            Some(ns) if policy.reads_namespace && a.req.resource.namespaced => {
                let res = crate::request::find_resource("", "v1", "namespaces")?;
                self.read(res, None, ns).await?.map(|(v, _)| v)
            }
            _ => None,
        };
        let namespace = Converted::of(namespace.as_ref().unwrap_or(&Value::Null));
        let params: Vec<Option<Value>> = match (&policy.param_kind, &binding.param_ref) {
            (None, _) => vec![None],
            (Some(_), None) => {
                return self.policy_outcome(
                    a,
                    bound,
                    name,
                    Outcome::Error(format!(
                        "the policy has paramKind but binding '{}' has no paramRef",
                        binding.name
                    )),
                    warnings,
                );
            }
            (Some((api_version, kind)), Some(pr)) => {
                match self.policy_params(a, api_version, kind, pr).await {
                    Ok(found) if found.is_empty() && pr.deny_if_missing => {
                        return self.policy_outcome(
                            a,
                            bound,
                            name,
                            Outcome::Error(
                                "no params found for policy binding with `Deny` parameterNotFoundAction"
                                    .into(),
                            ),
                            warnings,
                        );
                    }
                    Ok(found) => found.into_iter().map(Some).collect(),
                    Err(why) => {
                        return self.policy_outcome(a, bound, name, Outcome::Error(why), warnings);
                    }
                }
            }
        };
        for param in params {
            let param = Converted::of(param.as_ref().unwrap_or(&Value::Null));
            let outcome = evaluate(bound, inputs, &param, &namespace);
            self.policy_outcome(a, bound, name, outcome, warnings)?;
        }
        Ok(())
    }

    /// Acts on one check's outcome as the binding and the policy say.
    fn policy_outcome(
        &self,
        a: &Admission<'_>,
        bound: &Bound,
        name: &str,
        outcome: Outcome,
        warnings: &mut Vec<String>,
    ) -> Result<(), ApiError> {
        let (policy, binding) = (&bound.policy, &bound.binding);
        let count = |result: &str| {
            if let Some(m) = &self.metrics {
                m.policy_checks
                    .with_label_values(&[policy.name.as_str(), binding.name.as_str(), result])
                    .inc();
            }
        };
        let who = format!(
            "ValidatingAdmissionPolicy '{}' with binding '{}'",
            policy.name, binding.name
        );
        match outcome {
            Outcome::Allowed => count("allowed"),
            Outcome::Skipped => count("skipped"),
            Outcome::Error(why) if policy.fail_open => {
                count("ignored");
                tracing::warn!(policy = %policy.name, binding = %binding.name, error = %why, "admission policy failed; ignored (failurePolicy Ignore)");
            }
            Outcome::Error(why) => {
                count("error");
                return Err(ApiError::forbidden(format!("{who} denied request: {why}")));
            }
            Outcome::Failed(messages, reason) => {
                if binding.audit {
                    count("audited");
                    for m in &messages {
                        tracing::info!(policy = %policy.name, binding = %binding.name, user = %a.user.name(), message = %m, "admission policy validation failed (Audit)");
                    }
                }
                if binding.warn {
                    count("warned");
                    warnings.extend(
                        messages
                            .iter()
                            .map(|m| format!("Validation failed for {who}: {m}")),
                    );
                }
                if binding.deny {
                    count("denied");
                    return Err(denial(a, name, &who, &messages[0], reason));
                }
            }
        }
        Ok(())
    }

    /// The parameters a binding points at: one object by name, or every object its
    /// selector selects, of the policy's `paramKind`.
    async fn policy_params(
        &self,
        a: &Admission<'_>,
        api_version: &str,
        kind: &str,
        pr: &ParamRef,
    ) -> Result<Vec<Value>, String> {
        let res = crate::catalog::find_kind(api_version, kind)
            .or_else(|| {
                self.crds
                    .current()
                    .kind(api_version, kind)
                    .map(|v| v.resource)
            })
            .ok_or_else(|| format!("paramKind {api_version}/{kind} is not served"))?;
        let namespace = if res.namespaced {
            let ns = pr.namespace.as_deref().or(a
                .req
                .namespace
                .as_deref()
                .filter(|_| a.req.resource.namespaced));
            Some(ns.ok_or_else(|| {
                "paramRef has no namespace and the request is not namespaced".to_owned()
            })?)
        } else {
            None
        };
        if let Some(name) = &pr.name {
            return Ok(self
                .read(res, namespace, name)
                .await
                .map_err(|e| e.message)?
                .map(|(v, _)| v)
                .into_iter()
                .collect());
        }
        let selector = pr.selector.clone().unwrap_or_default();
        Ok(self
            .list_in(res, namespace)
            .await
            .map_err(|e| e.message)?
            .into_iter()
            .filter(|o| super::selects(&selector, &o["metadata"]["labels"]))
            .collect())
    }
}

/// The request's values, converted for CEL once.
struct Inputs<'a> {
    object: &'a Converted<'a>,
    old_object: &'a Converted<'a>,
    request: &'a Converted<'a>,
}

/// Evaluates a policy's conditions, variables and validations for one parameter.
fn evaluate(
    bound: &Bound,
    inputs: &Inputs<'_>,
    params: &Converted<'_>,
    namespace: &Converted<'_>,
) -> Outcome {
    let policy = &bound.policy;
    let mut variables: std::collections::HashMap<Key, cel::Value> = Default::default();
    let bindings = |variables: &std::collections::HashMap<Key, cel::Value>| {
        [
            ("object", Binding::Converted(inputs.object)),
            ("oldObject", Binding::Converted(inputs.old_object)),
            ("request", Binding::Converted(inputs.request)),
            ("params", Binding::Converted(params)),
            ("namespaceObject", Binding::Converted(namespace)),
            (
                "variables",
                Binding::Cel(cel::Value::Map(Map {
                    map: Arc::new(variables.clone()),
                })),
            ),
        ]
    };
    match crate::webhooks::conditions_hold(&policy.conditions, &bindings(&variables)) {
        Ok(true) => {}
        Ok(false) => return Outcome::Skipped,
        Err(why) => return Outcome::Error(why),
    }
    for (name, expression) in &policy.variables {
        match expression.eval(&bindings(&variables)) {
            Ok(v) => {
                variables.insert(Key::String(Arc::new(name.clone())), v);
            }
            Err(e) => {
                return Outcome::Error(format!(
                    "variable '{name}' ({}) resulted in error: {e}",
                    expression.source()
                ));
            }
        }
    }
    let bound_values = bindings(&variables);
    let mut failed = Vec::new();
    let mut reason = ("Invalid", 422);
    for v in &policy.validations {
        match v.expression.eval_bool(&bound_values) {
            Ok(true) => {}
            Ok(false) => {
                let message = v
                    .message_expression
                    .as_ref()
                    .and_then(|m| m.eval_string(&bound_values).ok())
                    .filter(|m| !m.trim().is_empty() && !m.contains('\n'))
                    .or_else(|| v.message.clone())
                    .unwrap_or_else(|| format!("failed expression: {}", v.expression.source()));
                if failed.is_empty() {
                    reason = v.reason;
                }
                failed.push(message);
            }
            Err(e) => {
                return Outcome::Error(format!(
                    "expression '{}' resulted in error: {e}",
                    v.expression.source()
                ));
            }
        }
    }
    for (key, expression) in &policy.audit_annotations {
        match expression.eval(&bound_values) {
            Ok(cel::Value::Null) => {}
            Ok(v) => {
                let value = crate::cel::to_json(&v).unwrap_or(Value::Null);
                tracing::info!(policy = %policy.name, binding = %bound.binding.name, key = %key, value = %value, "admission policy audit annotation");
            }
            Err(e) => {
                return Outcome::Error(format!("auditAnnotation '{key}' resulted in error: {e}"));
            }
        }
    }
    if failed.is_empty() {
        Outcome::Allowed
    } else {
        Outcome::Failed(failed, reason)
    }
}

/// The refusal of a failed validation, with its reason's code.
fn denial(
    a: &Admission<'_>,
    name: &str,
    who: &str,
    message: &str,
    reason: (&'static str, u16),
) -> ApiError {
    let res = a.req.resource;
    let text = format!("{who} denied request: {message}");
    match reason {
        ("Invalid", _) => ApiError::invalid(
            res.group,
            res.kind,
            name,
            vec![Cause {
                reason: "FieldValueInvalid",
                field: String::new(),
                message: text,
            }],
        ),
        ("Forbidden", _) => {
            let what = if res.group.is_empty() {
                res.plural.to_owned()
            } else {
                format!("{}.{}", res.plural, res.group)
            };
            ApiError::forbidden(format!("{what} {name:?} is forbidden: {text}"))
        }
        (r, code) => ApiError::new(code, r, text),
    }
}
