//! Validation of admission webhook configurations (admissionregistration.k8s.io/v1), with
//! Kubernetes' rules: unique qualified webhook names, rules that name operations, groups,
//! versions and resources, exactly one of `url` (https, no query or fragment) and `service`,
//! side effects a dry run may trigger, `v1` among the AdmissionReview versions, timeouts of
//! 1-30 s; `matchConditions` named uniquely, whose CEL expressions compile.

use std::collections::HashSet;

use base64::Engine;
use serde_json::Value;
use tessera_core::names;

use super::{Errors, label_selector, one_of, str_at};

const OPERATIONS: &[&str] = &["*", "CONNECT", "CREATE", "DELETE", "UPDATE"];

/// Checks every webhook of a Mutating (`mutating`) or Validating WebhookConfiguration.
pub(super) fn configuration(obj: &Value, mutating: bool, e: &mut Errors) {
    let mut seen = HashSet::new();
    for (i, hook) in obj["webhooks"].as_array().into_iter().flatten().enumerate() {
        let at = format!("webhooks[{i}]");
        match str_at(hook, "name") {
            None | Some("") => e.required(&format!("{at}.name")),
            Some(name) => {
                if let Some(why) = names::dns1123_subdomain(name) {
                    e.invalid(&format!("{at}.name"), &hook["name"], why);
                } else if name.split('.').count() < 3 {
                    e.invalid(
                        &format!("{at}.name"),
                        &hook["name"],
                        "should be a domain with at least three segments separated by dots",
                    );
                }
                if !seen.insert(name) {
                    e.duplicate(&format!("{at}.name"), &hook["name"]);
                }
            }
        }
        for (j, rule) in hook["rules"].as_array().into_iter().flatten().enumerate() {
            self::rule(rule, &format!("{at}.rules[{j}]"), e);
        }
        one_of(hook, "failurePolicy", &["Fail", "Ignore"], &at, e);
        one_of(hook, "matchPolicy", &["Equivalent", "Exact"], &at, e);
        if mutating {
            one_of(hook, "reinvocationPolicy", &["IfNeeded", "Never"], &at, e);
        }
        match str_at(hook, "sideEffects") {
            None => e.required(&format!("{at}.sideEffects")),
            Some("None" | "NoneOnDryRun") => {}
            Some(_) => e.not_supported(
                &format!("{at}.sideEffects"),
                &hook["sideEffects"],
                &["None", "NoneOnDryRun"],
            ),
        }
        if let Some(t) = hook.get("timeoutSeconds").filter(|t| !t.is_null())
            && !t.as_i64().is_some_and(|t| (1..=30).contains(&t))
        {
            e.invalid(
                &format!("{at}.timeoutSeconds"),
                t,
                "the timeout value must be between 1 and 30 seconds",
            );
        }
        let versions: Vec<&str> = hook["admissionReviewVersions"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        if versions.is_empty() {
            e.required(&format!("{at}.admissionReviewVersions"));
        } else if !versions.contains(&"v1") {
            e.invalid(
                &format!("{at}.admissionReviewVersions"),
                &hook["admissionReviewVersions"],
                "must include v1: this server sends AdmissionReview v1 only",
            );
        }
        match_conditions(
            &hook["matchConditions"],
            &format!("{at}.matchConditions"),
            &crate::webhooks::CONDITION_VARIABLES,
            e,
        );
        for sel in ["namespaceSelector", "objectSelector"] {
            if hook[sel].is_object() {
                label_selector(&hook[sel], &format!("{at}.{sel}"), e);
            }
        }
        client_config(&hook["clientConfig"], &format!("{at}.clientConfig"), e);
    }
}

/// The most match conditions a webhook or policy may have.
const MAX_MATCH_CONDITIONS: usize = 64;

/// Checks `matchConditions` (of a webhook or a ValidatingAdmissionPolicy): at most 64,
/// each with a unique qualified name and an expression that compiles with `variables`.
pub(super) fn match_conditions(list: &Value, at: &str, variables: &[&str], e: &mut Errors) {
    let Some(list) = list.as_array() else {
        return;
    };
    if list.len() > MAX_MATCH_CONDITIONS {
        e.invalid(
            at,
            &Value::from(list.len()),
            format!("must have at most {MAX_MATCH_CONDITIONS} items"),
        );
    }
    let mut seen = HashSet::new();
    for (i, c) in list.iter().enumerate() {
        let at = format!("{at}[{i}]");
        match str_at(c, "name") {
            None | Some("") => e.required(&format!("{at}.name")),
            Some(name) => {
                if let Some(why) = names::qualified_name(name) {
                    e.invalid(&format!("{at}.name"), &c["name"], why);
                }
                if !seen.insert(name) {
                    e.duplicate(&format!("{at}.name"), &c["name"]);
                }
            }
        }
        expression(&c["expression"], &format!("{at}.expression"), variables, e);
    }
}

/// Checks the CEL expression `src` (reported at `at`) compiles with `variables`;
/// `authorizer` checks are refused as not supported.
pub(super) fn expression(src: &Value, at: &str, variables: &[&str], e: &mut Errors) {
    match src.as_str() {
        None | Some("") => e.required(at),
        Some(text) => match crate::cel::compile(text, variables) {
            Err(why) => e.invalid(at, src, why),
            Ok(x) if x.uses("authorizer") => e.invalid(
                at,
                src,
                "authorizer checks are not supported by this server; match with the request's userInfo instead",
            ),
            Ok(_) => {}
        },
    }
}

fn rule(rule: &Value, at: &str, e: &mut Errors) {
    let list = |key: &str| -> Vec<&str> {
        rule[key]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect()
    };
    let operations = list("operations");
    if operations.is_empty() {
        e.required(&format!("{at}.operations"));
    }
    for (k, op) in operations.iter().enumerate() {
        if !OPERATIONS.contains(op) {
            e.not_supported(
                &format!("{at}.operations[{k}]"),
                &Value::String((*op).to_owned()),
                OPERATIONS,
            );
        }
    }
    if operations.len() > 1 && operations.contains(&"*") {
        e.invalid(
            &format!("{at}.operations"),
            &rule["operations"],
            "if '*' is present, must not specify other operations",
        );
    }
    for key in ["apiGroups", "apiVersions", "resources"] {
        let values = list(key);
        if values.is_empty() {
            e.required(&format!("{at}.{key}"));
        } else if values.len() > 1 && values.contains(&"*") {
            e.invalid(
                &format!("{at}.{key}"),
                &rule[key],
                "if '*' is present, must not specify other values",
            );
        }
        if key == "apiVersions" && values.contains(&"") {
            e.required(&format!("{at}.apiVersions"));
        }
    }
    let mut resources = HashSet::new();
    for (k, r) in list("resources").into_iter().enumerate() {
        let field = format!("{at}.resources[{k}]");
        let (main, sub) = r.split_once('/').map_or((r, None), |(m, s)| (m, Some(s)));
        if main.is_empty() || sub.is_some_and(str::is_empty) || sub.is_some_and(|s| s.contains('/'))
        {
            e.invalid(
                &field,
                &Value::String(r.to_owned()),
                "must be a resource (`pods`), a resource and subresource (`pods/status`), or wildcards (`*`, `*/*`, `pods/*`, `*/status`)",
            );
        }
        if !resources.insert(r) {
            e.duplicate(&field, &Value::String(r.to_owned()));
        }
    }
    if resources.contains("*/*") && resources.len() > 1 {
        e.invalid(
            &format!("{at}.resources"),
            &rule["resources"],
            "if '*/*' is present, must not specify other resources",
        );
    }
    if let Some(scope) = rule.get("scope").filter(|s| !s.is_null())
        && !scope
            .as_str()
            .is_some_and(|s| ["*", "Cluster", "Namespaced"].contains(&s))
    {
        e.not_supported(
            &format!("{at}.scope"),
            scope,
            &["*", "Cluster", "Namespaced"],
        );
    }
}

/// `matchConstraints` (`required`: of a policy) or `matchResources` (of a binding) at
/// `at`.
fn match_resources(m: &Value, at: &str, required: bool, e: &mut Errors) {
    if !m.is_object() {
        if required {
            e.required(at);
        }
        return;
    }
    let rules = m["resourceRules"].as_array().map_or(&[][..], Vec::as_slice);
    if required && rules.is_empty() {
        e.required(&format!("{at}.resourceRules"));
    }
    for key in ["resourceRules", "excludeResourceRules"] {
        for (j, r) in m[key].as_array().into_iter().flatten().enumerate() {
            let at = format!("{at}.{key}[{j}]");
            rule(r, &at, e);
            for (k, n) in r["resourceNames"]
                .as_array()
                .into_iter()
                .flatten()
                .enumerate()
            {
                if n.as_str().is_none_or(str::is_empty) {
                    e.required(&format!("{at}.resourceNames[{k}]"));
                }
            }
        }
    }
    one_of(m, "matchPolicy", &["Equivalent", "Exact"], at, e);
    for sel in ["namespaceSelector", "objectSelector"] {
        if m[sel].is_object() {
            label_selector(&m[sel], &format!("{at}.{sel}"), e);
        }
    }
}

/// Whether `name` may be a CEL variable name.
fn cel_identifier(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// A ValidatingAdmissionPolicy's spec: what it matches, its parameter kind, and CEL that
/// compiles (validations, variables, match conditions, audit annotations).
pub(super) fn policy(spec: &Value, e: &mut Errors) {
    use crate::webhooks::policy::{REASONS, VARIABLES};
    one_of(spec, "failurePolicy", &["Fail", "Ignore"], "spec", e);
    match_resources(&spec["matchConstraints"], "spec.matchConstraints", true, e);
    let pk = &spec["paramKind"];
    if pk.is_object() {
        for key in ["apiVersion", "kind"] {
            if str_at(pk, key).is_none_or(str::is_empty) {
                e.required(&format!("spec.paramKind.{key}"));
            }
        }
    }
    let validations = spec["validations"]
        .as_array()
        .map_or(&[][..], Vec::as_slice);
    let audits = spec["auditAnnotations"]
        .as_array()
        .map_or(&[][..], Vec::as_slice);
    if validations.is_empty() && audits.is_empty() {
        e.required("spec.validations: validations or auditAnnotations");
    }
    for (i, v) in validations.iter().enumerate() {
        let at = format!("spec.validations[{i}]");
        expression(&v["expression"], &format!("{at}.expression"), &VARIABLES, e);
        if let Some(m) = str_at(v, "message")
            && m.contains('\n')
        {
            e.invalid(
                &format!("{at}.message"),
                &v["message"],
                "must not contain line breaks",
            );
        }
        if v.get("messageExpression").is_some_and(|m| !m.is_null()) {
            expression(
                &v["messageExpression"],
                &format!("{at}.messageExpression"),
                &VARIABLES,
                e,
            );
        }
        if let Some(r) = v.get("reason").filter(|r| !r.is_null())
            && !REASONS.iter().any(|(x, _)| r == x)
        {
            e.not_supported(&format!("{at}.reason"), r, &REASONS.map(|(x, _)| x));
        }
    }
    let mut names = HashSet::new();
    for (i, v) in spec["variables"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let at = format!("spec.variables[{i}]");
        match str_at(v, "name") {
            None | Some("") => e.required(&format!("{at}.name")),
            Some(n) if !cel_identifier(n) => e.invalid(
                &format!("{at}.name"),
                &v["name"],
                "must be a CEL identifier: a letter or _ then letters, digits or _",
            ),
            Some(n) => {
                if !names.insert(n) {
                    e.duplicate(&format!("{at}.name"), &v["name"]);
                }
            }
        }
        expression(&v["expression"], &format!("{at}.expression"), &VARIABLES, e);
    }
    let mut keys = HashSet::new();
    for (i, a) in audits.iter().enumerate() {
        let at = format!("spec.auditAnnotations[{i}]");
        match str_at(a, "key") {
            None | Some("") => e.required(&format!("{at}.key")),
            Some(k) => {
                if let Some(why) = names::qualified_name(k) {
                    e.invalid(&format!("{at}.key"), &a["key"], why);
                }
                if !keys.insert(k) {
                    e.duplicate(&format!("{at}.key"), &a["key"]);
                }
            }
        }
        expression(
            &a["valueExpression"],
            &format!("{at}.valueExpression"),
            &VARIABLES,
            e,
        );
    }
    match_conditions(
        &spec["matchConditions"],
        "spec.matchConditions",
        &VARIABLES,
        e,
    );
}

/// A ValidatingAdmissionPolicyBinding's spec: the policy it binds, its actions (Deny and
/// Warn not both), its parameter reference and narrowing.
pub(super) fn binding(spec: &Value, e: &mut Errors) {
    if str_at(spec, "policyName").is_none_or(str::is_empty) {
        e.required("spec.policyName");
    }
    const ACTIONS: [&str; 3] = ["Audit", "Deny", "Warn"];
    let actions: Vec<&Value> = spec["validationActions"]
        .as_array()
        .into_iter()
        .flatten()
        .collect();
    if actions.is_empty() {
        e.required("spec.validationActions");
    }
    let mut seen = HashSet::new();
    for (i, a) in actions.iter().enumerate() {
        let at = format!("spec.validationActions[{i}]");
        match a.as_str() {
            Some(x) if ACTIONS.contains(&x) => {
                if !seen.insert(x) {
                    e.duplicate(&at, a);
                }
            }
            _ => e.not_supported(&at, a, &ACTIONS),
        }
    }
    if seen.contains("Deny") && seen.contains("Warn") {
        e.invalid(
            "spec.validationActions",
            &spec["validationActions"],
            "must not contain both Deny and Warn (repeating the same validation failure information in the API response and headers serves no purpose)",
        );
    }
    let p = &spec["paramRef"];
    if p.is_object() {
        let (name, selector) = (
            str_at(p, "name").filter(|n| !n.is_empty()),
            p.get("selector").filter(|s| s.is_object()),
        );
        match (name, selector) {
            (Some(_), Some(_)) => e.invalid(
                "spec.paramRef",
                &Value::Null,
                "name and selector are mutually exclusive",
            ),
            (None, None) => e.required("spec.paramRef: one of name or selector"),
            (Some(n), None) => {
                if let Some(why) = names::dns1123_subdomain(n) {
                    e.invalid("spec.paramRef.name", &p["name"], why);
                }
            }
            (None, Some(sel)) => {
                label_selector(sel, "spec.paramRef.selector", e);
            }
        }
        if let Some(ns) = str_at(p, "namespace")
            && let Some(why) = names::dns1123_label(ns)
        {
            e.invalid("spec.paramRef.namespace", &p["namespace"], why);
        }
        one_of(
            p,
            "parameterNotFoundAction",
            &["Allow", "Deny"],
            "spec.paramRef",
            e,
        );
    }
    match_resources(&spec["matchResources"], "spec.matchResources", false, e);
}

pub(crate) fn client_config(config: &Value, at: &str, e: &mut Errors) {
    let url = config.get("url").filter(|u| !u.is_null());
    let service = config.get("service").filter(|s| !s.is_null());
    match (url, service) {
        (None, None) => e.required(&format!("{at}: exactly one of url or service")),
        (Some(_), Some(_)) => e.invalid(
            at,
            &Value::Null,
            "exactly one of url or service is required, not both",
        ),
        (Some(url), None) => {
            if let Some(why) = url.as_str().and_then(url_problem) {
                e.invalid(&format!("{at}.url"), url, why);
            }
        }
        (None, Some(svc)) => {
            for key in ["namespace", "name"] {
                match str_at(svc, key) {
                    None | Some("") => e.required(&format!("{at}.service.{key}")),
                    Some(v) => {
                        if let Some(why) = names::dns1123_label(v) {
                            e.invalid(&format!("{at}.service.{key}"), &svc[key], why);
                        }
                    }
                }
            }
            if let Some(path) = str_at(svc, "path")
                && (!path.starts_with('/') || path.contains(['?', '#']))
            {
                e.invalid(
                    &format!("{at}.service.path"),
                    &svc["path"],
                    "must be an absolute path (starting with '/'), without a query or fragment",
                );
            }
            if let Some(port) = svc.get("port").filter(|p| !p.is_null())
                && !port.as_i64().is_some_and(|p| (1..=65535).contains(&p))
            {
                e.invalid(
                    &format!("{at}.service.port"),
                    port,
                    "port is not valid: must be between 1 and 65535, inclusive",
                );
            }
        }
    }
    if let Some(bundle) = config.get("caBundle").and_then(Value::as_str)
        && !bundle.is_empty()
        && let Some(why) = ca_bundle_problem(bundle)
    {
        e.invalid(&format!("{at}.caBundle"), &Value::Null, why);
    }
}

/// Why a webhook URL cannot be used, if it cannot: it must be `https://host[:port][/path]`.
fn url_problem(url: &str) -> Option<String> {
    let uri: hyper::Uri = match url.parse() {
        Ok(u) => u,
        Err(e) => return Some(format!("not a URL: {e}")),
    };
    if uri.scheme_str() != Some("https") {
        return Some("'https' is the only allowed URL scheme".into());
    }
    let Some(authority) = uri.authority() else {
        return Some("host must be specified".into());
    };
    if authority.as_str().contains('@') {
        return Some("user information is not permitted in the URL".into());
    }
    if authority.host().is_empty() {
        return Some("host must be specified".into());
    }
    if uri.query().is_some() || url.contains('#') {
        return Some("query and fragment parameters are not permitted".into());
    }
    None
}

/// Why a caBundle (base64 of PEM) cannot be trusted, if it cannot.
fn ca_bundle_problem(bundle: &str) -> Option<String> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let pem = match base64::engine::general_purpose::STANDARD.decode(bundle) {
        Ok(p) => p,
        Err(e) => return Some(format!("must be base64 (of PEM certificates): {e}")),
    };
    let mut count = 0;
    for cert in CertificateDer::pem_slice_iter(&pem) {
        if let Err(e) = cert {
            return Some(format!("must hold PEM certificates: {e}"));
        }
        count += 1;
    }
    (count == 0).then(|| "holds no PEM certificate".to_owned())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn causes(obj: &Value) -> Vec<String> {
        let mut e = Errors::default();
        configuration(obj, true, &mut e);
        e.0.into_iter()
            .map(|c| format!("{}: {}", c.field, c.message))
            .collect()
    }

    fn hook() -> Value {
        json!({
            "name": "labels.example.com",
            "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["configmaps"]}],
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
            "clientConfig": {"url": "https://127.0.0.1:9443/mutate"},
        })
    }

    #[test]
    fn a_valid_webhook_passes() {
        assert_eq!(causes(&json!({"webhooks": [hook()]})), Vec::<String>::new());
    }

    #[test]
    fn webhooks_are_refused_naming_the_field() {
        type Change = fn(&mut Value);
        let cases: Vec<(Change, &str)> = vec![
            (|h| h["name"] = json!("short.name"), "webhooks[0].name"),
            (
                |h| h["sideEffects"] = json!("Some"),
                "webhooks[0].sideEffects",
            ),
            (
                |h| h["admissionReviewVersions"] = json!(["v1beta1"]),
                "webhooks[0].admissionReviewVersions",
            ),
            (
                |h| h["timeoutSeconds"] = json!(31),
                "webhooks[0].timeoutSeconds",
            ),
            (
                |h| h["clientConfig"]["url"] = json!("http://127.0.0.1/x"),
                "webhooks[0].clientConfig.url",
            ),
            (
                |h| h["clientConfig"]["url"] = json!("https://127.0.0.1/x?a=b"),
                "webhooks[0].clientConfig.url",
            ),
            (
                |h| h["clientConfig"]["service"] = json!({"namespace": "a", "name": "b"}),
                "webhooks[0].clientConfig",
            ),
            (
                |h| h["clientConfig"]["caBundle"] = json!("bm90IGEgY2VydA=="),
                "webhooks[0].clientConfig.caBundle",
            ),
            (
                |h| h["rules"][0]["operations"] = json!(["CREATE", "*"]),
                "webhooks[0].rules[0].operations",
            ),
            (
                |h| h["rules"][0]["operations"] = json!(["PATCH"]),
                "webhooks[0].rules[0].operations[0]",
            ),
            (
                |h| h["rules"][0]["resources"] = json!(["pods/"]),
                "webhooks[0].rules[0].resources[0]",
            ),
            (
                |h| h["rules"][0]["scope"] = json!("Everywhere"),
                "webhooks[0].rules[0].scope",
            ),
            (
                |h| h["matchConditions"] = json!([{"name": "a", "expression": "object."}]),
                "webhooks[0].matchConditions[0].expression",
            ),
            (
                |h| h["matchConditions"] = json!([{"name": "a", "expression": "self.x"}]),
                "webhooks[0].matchConditions[0].expression",
            ),
            (
                |h| {
                    h["matchConditions"] = json!([{"name": "a", "expression": "true"},
                        {"name": "a", "expression": "true"}])
                },
                "webhooks[0].matchConditions[1].name",
            ),
            (
                |h| h["matchConditions"] = json!([{"name": "a", "expression": "authorizer.requestResource.check('get').allowed()"}]),
                "webhooks[0].matchConditions[0].expression",
            ),
            (
                |h| {
                    h["objectSelector"] =
                        json!({"matchExpressions": [{"key": "a", "operator": "Is"}]})
                },
                "webhooks[0].objectSelector.matchExpressions[0].operator",
            ),
            (
                |h| h["reinvocationPolicy"] = json!("Always"),
                "webhooks[0].reinvocationPolicy",
            ),
        ];
        for (change, field) in cases {
            let mut h = hook();
            change(&mut h);
            let found = causes(&json!({"webhooks": [h]}));
            assert!(
                found.iter().any(|c| c.starts_with(field)),
                "{field} not named in {found:?}"
            );
        }
        let dup = causes(&json!({"webhooks": [hook(), hook()]}));
        assert!(
            dup.iter()
                .any(|c| c.starts_with("webhooks[1].name: Duplicate")),
            "{dup:?}"
        );
    }
}
