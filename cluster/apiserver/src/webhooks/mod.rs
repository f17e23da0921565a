//! Admission webhooks (`admissionregistration.k8s.io/v1`): the Mutating and Validating
//! WebhookConfigurations this API server calls, over HTTPS with AdmissionReview v1, on the
//! writes their rules select.
//!
//! The configurations are followed in memory as kube-apiserver does ([`crate::follow`]):
//! listed on first use, then watched, and a configuration written through this server is
//! applied before the write is answered, so the next request is already judged by it. Each
//! configuration change compiles the webhooks once into an immutable [`Snapshot`]; a
//! request holds the snapshot it started with. With no configuration the whole cost on a
//! write is one atomic load and a length check.
//!
//! Order, as in Kubernetes: configurations sorted by name, webhooks in their order within
//! one. Mutating webhooks run one after the other (and those with `reinvocationPolicy:
//! IfNeeded` once more if a later one changed the object); validating webhooks run in
//! parallel and any denial refuses the request. Requests on webhook configurations
//! themselves never go to webhooks, so a broken webhook cannot lock its own fix out.

pub(crate) mod call;
pub mod policy;

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use serde_json::{Value, json};
use tessera_store::Store;

use crate::catalog::{self, ADMISSIONREGISTRATION, Lookup};
use crate::follow::Followed;
use crate::status::ApiError;

pub use call::{Caller, Target, url_target, with_timeout};

/// The variables a webhook's `matchConditions` may read (`authorizer` is refused when the
/// configuration is written).
pub const CONDITION_VARIABLES: [&str; 4] = ["object", "oldObject", "request", "authorizer"];

/// One of a webhook's or policy's `matchConditions`.
#[derive(Debug)]
pub struct Condition {
    /// Its name.
    pub name: String,
    /// Its expression.
    pub expression: crate::cel::Expression,
}

/// Compiles `matchConditions` (validated when written: one that does not compile now is
/// left out).
pub fn conditions(list: &Value, variables: &[&str]) -> Vec<Condition> {
    list.as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| {
            Some(Condition {
                name: c["name"].as_str()?.to_owned(),
                expression: crate::cel::compile(c["expression"].as_str()?, variables).ok()?,
            })
        })
        .collect()
}

/// Evaluates match conditions in order: Ok(true) if all hold, Ok(false) at the first that
/// does not, Err naming the condition whose evaluation failed.
pub fn conditions_hold(
    conditions: &[Condition],
    bindings: &[(&str, crate::cel::Binding<'_>)],
) -> Result<bool, String> {
    for c in conditions {
        match c.expression.eval_bool(bindings) {
            Ok(true) => {}
            Ok(false) => return Ok(false),
            Err(e) => return Err(format!("match condition {:?} failed: {e}", c.name)),
        }
    }
    Ok(true)
}

/// The operation a request is admitted for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operation {
    /// A new object.
    Create,
    /// A replaced or patched object (a subresource's too).
    Update,
    /// A deletion.
    Delete,
    /// A connection to a pod (`pods/exec`, `attach`, `portforward`): the object is its
    /// options (`PodExecOptions`, ...).
    Connect,
}

impl Operation {
    /// As rules and AdmissionReviews spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Create => "CREATE",
            Operation::Update => "UPDATE",
            Operation::Delete => "DELETE",
            Operation::Connect => "CONNECT",
        }
    }

    /// The kind of the request's options (none for a connection: its options are the
    /// object).
    fn options_kind(self) -> Option<&'static str> {
        match self {
            Operation::Create => Some("CreateOptions"),
            Operation::Update => Some("UpdateOptions"),
            Operation::Delete => Some("DeleteOptions"),
            Operation::Connect => None,
        }
    }
}

/// What a request is, for matching rules.
#[derive(Clone, Copy, Debug)]
pub struct Attributes<'a> {
    /// The operation.
    pub operation: Operation,
    /// API group of the resource.
    pub group: &'a str,
    /// Version the request addressed.
    pub version: &'a str,
    /// Plural resource name.
    pub resource: &'a str,
    /// Subresource (`status`, `scale`), if any.
    pub subresource: Option<&'a str>,
    /// Whether the resource is namespaced (Namespaces themselves are cluster-scoped).
    pub namespaced: bool,
}

/// One rule of a webhook.
#[derive(Debug)]
struct Rule {
    operations: Vec<String>,
    groups: Vec<String>,
    versions: Vec<String>,
    resources: Vec<String>,
    scope: String,
}

fn listed(list: &[String], value: &str) -> bool {
    list.iter().any(|v| v == "*" || v == value)
}

impl Rule {
    fn of(v: &Value) -> Rule {
        let strings = |key: &str| -> Vec<String> {
            v[key]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|s| s.as_str().map(str::to_owned))
                .collect()
        };
        Rule {
            operations: strings("operations"),
            groups: strings("apiGroups"),
            versions: strings("apiVersions"),
            resources: strings("resources"),
            scope: v["scope"].as_str().unwrap_or("*").to_owned(),
        }
    }

    /// Whether the rule selects the request, its version aside.
    fn selects_but_version(&self, a: &Attributes<'_>) -> bool {
        let scope = match self.scope.as_str() {
            "Cluster" => !a.namespaced,
            "Namespaced" => a.namespaced,
            _ => true,
        };
        scope
            && listed(&self.operations, a.operation.as_str())
            && listed(&self.groups, a.group)
            && self.resources.iter().any(|r| {
                if r == "*/*" {
                    return true;
                }
                match (r.split_once('/'), a.subresource) {
                    (None, None) => r == "*" || r == a.resource,
                    (Some((res, sub)), Some(s)) => {
                        (res == "*" || res == a.resource) && (sub == "*" || sub == s)
                    }
                    _ => false,
                }
            })
    }
}

/// Where a webhook is served.
#[derive(Clone, Debug)]
pub enum Endpoint {
    /// An https URL.
    Url(hyper::Uri),
    /// A Service: reached at one of its ready endpoints, its certificate checked for
    /// `<name>.<namespace>.svc`.
    Service {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
        /// The Service port.
        port: u16,
        /// The request path.
        path: String,
    },
}

impl Endpoint {
    /// A `clientConfig` (of an admission webhook or a CRD's conversion webhook) compiled:
    /// where it is served, and the PEM of its `caBundle` if it has one (else the host's
    /// trusted CAs are used). None for one validation would have refused.
    pub fn of(client: &Value) -> Option<(Endpoint, Option<Arc<str>>)> {
        let endpoint = if let Some(url) = client["url"].as_str() {
            Endpoint::Url(url.parse().ok()?)
        } else {
            let svc = &client["service"];
            Endpoint::Service {
                namespace: svc["namespace"].as_str()?.to_owned(),
                name: svc["name"].as_str()?.to_owned(),
                port: svc["port"]
                    .as_u64()
                    .and_then(|p| u16::try_from(p).ok())
                    .unwrap_or(443),
                path: svc["path"].as_str().unwrap_or("/").to_owned(),
            }
        };
        Some((endpoint, ca_bundle(&client["caBundle"])))
    }
}

/// The PEM a `caBundle` field (base64) carries, if it carries one (webhooks, conversion
/// webhooks, APIServices).
pub fn ca_bundle(field: &Value) -> Option<Arc<str>> {
    field
        .as_str()
        .filter(|b| !b.is_empty())
        .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
        .and_then(|pem| String::from_utf8(pem).ok())
        .map(Arc::from)
}

/// One compiled webhook.
#[derive(Debug)]
pub struct Hook {
    /// The configuration it belongs to.
    pub config: String,
    /// Its name (`labels.example.com`).
    pub name: String,
    /// Mutating or validating.
    pub mutating: bool,
    rules: Vec<Rule>,
    /// Its namespace and object selectors.
    pub selectors: Selectors,
    /// `failurePolicy: Ignore`: a webhook that cannot be reached or answers nonsense is
    /// skipped instead of failing the request.
    pub fail_open: bool,
    equivalent: bool,
    /// How long a call may take.
    pub timeout: Duration,
    /// `reinvocationPolicy: IfNeeded`.
    pub reinvoke: bool,
    /// Where it is served.
    pub endpoint: Endpoint,
    /// The PEM of `caBundle`, if any (else the host's trusted CAs).
    pub ca_pem: Option<Arc<str>>,
    /// `matchConditions`: all must hold for the webhook to be called.
    pub conditions: Vec<Condition>,
}

impl Hook {
    fn compile(config: &str, mutating: bool, v: &Value) -> Option<Hook> {
        let (endpoint, ca_pem) = Endpoint::of(&v["clientConfig"])?;
        Some(Hook {
            config: config.to_owned(),
            name: v["name"].as_str()?.to_owned(),
            mutating,
            rules: v["rules"]
                .as_array()
                .into_iter()
                .flatten()
                .map(Rule::of)
                .collect(),
            selectors: Selectors::of(v),
            fail_open: v["failurePolicy"] == "Ignore",
            equivalent: v["matchPolicy"] != "Exact",
            timeout: Duration::from_secs(v["timeoutSeconds"].as_u64().unwrap_or(10).clamp(1, 30)),
            reinvoke: v["reinvocationPolicy"] == "IfNeeded",
            endpoint,
            ca_pem,
            conditions: conditions(&v["matchConditions"], &CONDITION_VARIABLES),
        })
    }

    /// The version the webhook sees the request in, if its rules select it: the request's
    /// own, or with `matchPolicy: Equivalent` another served version of the same resource
    /// that a rule lists (custom resources served in several versions).
    pub fn selects(&self, a: &Attributes<'_>, served: &dyn Lookup) -> Option<String> {
        rules_select(self.rules.iter(), self.equivalent, a, served)
    }
}

/// The version a request is seen in if one of `rules` selects it: its own, or with
/// `equivalent` (`matchPolicy: Equivalent`) another served version a rule lists.
fn rules_select<'r>(
    rules: impl Iterator<Item = &'r Rule>,
    equivalent: bool,
    a: &Attributes<'_>,
    served: &dyn Lookup,
) -> Option<String> {
    let mut found = None;
    for rule in rules {
        if !rule.selects_but_version(a) {
            continue;
        }
        if listed(&rule.versions, a.version) {
            return Some(a.version.to_owned());
        }
        if equivalent && found.is_none() {
            found = rule
                .versions
                .iter()
                .find(|v| served.find(a.group, v, a.resource).is_some())
                .cloned();
        }
    }
    found
}

/// A webhook's or policy's `namespaceSelector` and `objectSelector`.
#[derive(Debug, Default)]
pub struct Selectors {
    namespace_selector: Value,
    object_selector: Value,
}

impl Selectors {
    /// The selectors of a webhook or of `matchConstraints`/`matchResources`.
    pub fn of(v: &Value) -> Selectors {
        Selectors {
            namespace_selector: v["namespaceSelector"].clone(),
            object_selector: v["objectSelector"].clone(),
        }
    }

    /// Whether the namespace selector needs the namespace's labels (it is not empty).
    pub fn needs_namespace(&self) -> bool {
        !is_everything(&self.namespace_selector)
    }

    /// Whether the namespace labels `labels` (None: cluster-scoped, every one matches) pass
    /// the namespace selector.
    pub fn namespace_matches(&self, labels: Option<&Value>) -> bool {
        match labels {
            _ if is_everything(&self.namespace_selector) => true,
            None => true,
            Some(l) => selects(&self.namespace_selector, l),
        }
    }

    /// The label keys the namespace selector reads.
    pub fn namespace_label_keys(&self) -> impl Iterator<Item = &str> {
        let sel = &self.namespace_selector;
        let matched = sel["matchLabels"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(k, _)| k.as_str());
        let expressions = sel["matchExpressions"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|x| x["key"].as_str());
        matched.chain(expressions)
    }

    /// Whether the object selector matches the new or the old object.
    pub fn object_matches(&self, new: Option<&Value>, old: Option<&Value>) -> bool {
        if is_everything(&self.object_selector) {
            return true;
        }
        [new, old]
            .into_iter()
            .flatten()
            .any(|o| selects(&self.object_selector, &o["metadata"]["labels"]))
    }
}

fn is_everything(selector: &Value) -> bool {
    selector.as_object().is_none_or(|s| {
        s.values().all(|v| {
            v.is_null()
                || v.as_object().is_some_and(|m| m.is_empty())
                || v.as_array().is_some_and(|a| a.is_empty())
        })
    })
}

/// Whether a (valid) label selector selects `labels`.
fn selects(selector: &Value, labels: &Value) -> bool {
    crate::api::selects(selector, labels)
}

/// The webhooks and policies in force.
#[derive(Debug, Default)]
pub struct Snapshot {
    /// Mutating webhooks, in calling order.
    pub mutating: Vec<Arc<Hook>>,
    /// Validating webhooks, in calling order.
    pub validating: Vec<Arc<Hook>>,
    /// ValidatingAdmissionPolicies with each of their bindings, in binding-name order.
    pub policies: Vec<policy::Bound>,
}

impl Snapshot {
    /// Whether there is no webhook and no bound policy at all.
    pub fn is_empty(&self) -> bool {
        self.mutating.is_empty() && self.validating.is_empty() && self.policies.is_empty()
    }
}

fn compile_mutating(name: &str, config: &Value) -> Arc<Vec<Arc<Hook>>> {
    Arc::new(compile(name, true, config))
}

fn compile_validating(name: &str, config: &Value) -> Arc<Vec<Arc<Hook>>> {
    Arc::new(compile(name, false, config))
}

fn compile(name: &str, mutating: bool, config: &Value) -> Vec<Arc<Hook>> {
    config["webhooks"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|h| Hook::compile(name, mutating, h))
        .map(Arc::new)
        .collect()
}

type Hooks = Arc<Vec<Arc<Hook>>>;

/// Every followed kind, held weakly by the callback that combines them.
#[derive(Default)]
struct Sides {
    mutating: std::sync::Weak<Followed<Hooks>>,
    validating: std::sync::Weak<Followed<Hooks>>,
    policies: std::sync::Weak<Followed<Arc<policy::Policy>>>,
    bindings: std::sync::Weak<Followed<Arc<policy::Binding>>>,
}

impl Sides {
    fn snapshot(&self) -> Snapshot {
        fn items<T: Clone + Send + Sync + 'static>(
            side: &std::sync::Weak<Followed<T>>,
        ) -> Vec<(String, T)> {
            side.upgrade().map(|s| s.current()).unwrap_or_default()
        }
        let hooks = |side: &std::sync::Weak<Followed<Hooks>>| -> Vec<Arc<Hook>> {
            items(side)
                .into_iter()
                .flat_map(|(_, h)| h.as_ref().clone())
                .collect()
        };
        let policies: std::collections::HashMap<String, Arc<policy::Policy>> =
            items(&self.policies).into_iter().collect();
        let bound = items(&self.bindings)
            .into_iter()
            .filter_map(|(_, b)| {
                let p = policies.get(&b.policy)?.clone();
                Some(policy::Bound {
                    policy: p,
                    binding: b,
                })
            })
            .collect();
        Snapshot {
            mutating: hooks(&self.mutating),
            validating: hooks(&self.validating),
            policies: bound,
        }
    }
}

/// The webhook configurations and admission policies in force on this API server, and the
/// client that calls webhooks.
#[derive(Clone)]
pub struct Webhooks {
    mutating: Arc<Followed<Hooks>>,
    validating: Arc<Followed<Hooks>>,
    policies: Arc<Followed<Arc<policy::Policy>>>,
    bindings: Arc<Followed<Arc<policy::Binding>>>,
    snapshot: Arc<parking_lot::RwLock<Arc<Snapshot>>>,
    /// Calls webhooks.
    pub caller: Caller,
}

impl Webhooks {
    /// The configurations in `store`, read on first use.
    pub fn new(store: Arc<dyn Store>) -> Webhooks {
        let snapshot: Arc<parking_lot::RwLock<Arc<Snapshot>>> = Arc::default();
        let sides: Arc<parking_lot::Mutex<Sides>> = Arc::default();
        let changed: Arc<dyn Fn() + Send + Sync> = {
            let snapshot = snapshot.clone();
            let sides = sides.clone();
            Arc::new(move || {
                let fresh = sides.lock().snapshot();
                *snapshot.write() = Arc::new(fresh);
            })
        };
        let mutating = Followed::new(
            store.clone(),
            ADMISSIONREGISTRATION,
            "mutatingwebhookconfigurations",
            "MutatingWebhookConfigurations",
            compile_mutating,
            changed.clone(),
        );
        let validating = Followed::new(
            store.clone(),
            ADMISSIONREGISTRATION,
            "validatingwebhookconfigurations",
            "ValidatingWebhookConfigurations",
            compile_validating,
            changed.clone(),
        );
        let policies = Followed::new(
            store.clone(),
            ADMISSIONREGISTRATION,
            "validatingadmissionpolicies",
            "ValidatingAdmissionPolicies",
            policy::Policy::compile,
            changed.clone(),
        );
        let bindings = Followed::new(
            store,
            ADMISSIONREGISTRATION,
            "validatingadmissionpolicybindings",
            "ValidatingAdmissionPolicyBindings",
            policy::Binding::compile,
            changed,
        );
        *sides.lock() = Sides {
            mutating: Arc::downgrade(&mutating),
            validating: Arc::downgrade(&validating),
            policies: Arc::downgrade(&policies),
            bindings: Arc::downgrade(&bindings),
        };
        Webhooks {
            mutating,
            validating,
            policies,
            bindings,
            snapshot,
            caller: Caller::default(),
        }
    }

    /// The webhooks and policies in force: the objects listed (on first use) and followed
    /// since.
    pub async fn snapshot(&self) -> Result<Arc<Snapshot>, ApiError> {
        self.mutating.start().await?;
        self.validating.start().await?;
        self.policies.start().await?;
        self.bindings.start().await?;
        Ok(self.snapshot.read().clone())
    }

    /// Records a write of a configuration, policy or binding through this server (`obj`
    /// None: deleted), so the next request is judged by it before the watch delivers it.
    pub fn applied(&self, res: &catalog::Resource, key: &[u8], obj: Option<&Value>, rev: i64) {
        if res.group != ADMISSIONREGISTRATION {
            return;
        }
        match res.plural {
            "mutatingwebhookconfigurations" => self.mutating.applied(key, obj, rev),
            "validatingwebhookconfigurations" => self.validating.applied(key, obj, rev),
            "validatingadmissionpolicies" => self.policies.applied(key, obj, rev),
            "validatingadmissionpolicybindings" => self.bindings.applied(key, obj, rev),
            _ => {}
        }
    }
}

/// Whether requests on `res` go to webhooks: not those on webhook configurations.
pub fn admits(res: &catalog::Resource) -> bool {
    res.group != ADMISSIONREGISTRATION
}

/// The request half of an AdmissionReview.
pub struct Review<'a> {
    /// Its uid (answers must echo it).
    pub uid: String,
    /// What is asked.
    pub attributes: Attributes<'a>,
    /// The kind of the objects, as (group, version, kind).
    pub kind: (&'a str, &'a str, &'a str),
    /// The object's name.
    pub name: &'a str,
    /// Its namespace.
    pub namespace: Option<&'a str>,
    /// The caller.
    pub user: (String, Vec<String>),
    /// A dry run.
    pub dry_run: bool,
    /// The field manager asked for.
    pub field_manager: Option<&'a str>,
}

impl Review<'_> {
    /// The AdmissionReview v1 JSON for `hook` (seeing the objects in `version`).
    pub fn body(&self, version: &str, object: Option<&Value>, old: Option<&Value>) -> Value {
        let a = &self.attributes;
        let (kg, _, kk) = self.kind;
        let in_version = |o: Option<&Value>| match o {
            Some(o) if version != a.version => {
                let mut o = o.clone();
                o["apiVersion"] = json!(if kg.is_empty() {
                    version.to_owned()
                } else {
                    format!("{kg}/{version}")
                });
                o
            }
            Some(o) => o.clone(),
            None => Value::Null,
        };
        let mut options = match a.operation.options_kind() {
            Some(kind) => json!({"apiVersion": "meta.k8s.io/v1", "kind": kind}),
            None => Value::Null,
        };
        if let Some(m) = self.field_manager
            && options.is_object()
            && a.operation != Operation::Delete
        {
            options["fieldManager"] = json!(m);
        }
        if self.dry_run && options.is_object() {
            options["dryRun"] = json!(["All"]);
        }
        let kind_version = if version != a.version {
            version
        } else {
            self.kind.1
        };
        let mut request = json!({
            "uid": self.uid,
            "kind": {"group": kg, "version": kind_version, "kind": kk},
            "resource": {"group": a.group, "version": version, "resource": a.resource},
            "requestKind": {"group": kg, "version": self.kind.1, "kind": kk},
            "requestResource": {"group": a.group, "version": a.version, "resource": a.resource},
            "name": self.name,
            "operation": a.operation.as_str(),
            "userInfo": {"username": self.user.0, "groups": self.user.1},
            "object": in_version(object),
            "oldObject": in_version(old),
            "dryRun": self.dry_run,
            "options": options,
        });
        if let Some(sub) = a.subresource {
            request["subResource"] = json!(sub);
            request["requestSubResource"] = json!(sub);
        }
        if let Some(ns) = self.namespace {
            request["namespace"] = json!(ns);
        }
        json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": request,
        })
    }
}

/// A webhook's verdict.
#[derive(Debug, Default)]
pub struct Verdict {
    /// Allowed.
    pub allowed: bool,
    /// The JSON patch a mutating webhook returned (its bytes).
    pub patch: Option<Vec<u8>>,
    /// Warnings for the client.
    pub warnings: Vec<String>,
    /// The denial's status (`code`, `reason`, `message`).
    pub status: Value,
}

/// Reads an AdmissionReview answer for the request `uid`.
pub fn verdict(body: &[u8], uid: &str, mutating: bool) -> Result<Verdict, String> {
    let review: Value =
        serde_json::from_slice(body).map_err(|e| format!("the answer is not JSON: {e}"))?;
    if review["apiVersion"] != "admission.k8s.io/v1" || review["kind"] != "AdmissionReview" {
        return Err(format!(
            "expected webhook response of admission.k8s.io/v1, Kind=AdmissionReview, got {}, Kind={}",
            review["apiVersion"].as_str().unwrap_or_default(),
            review["kind"].as_str().unwrap_or_default()
        ));
    }
    let response = &review["response"];
    if !response.is_object() {
        return Err("webhook response was absent".into());
    }
    if response["uid"].as_str() != Some(uid) {
        return Err(format!(
            "expected response.uid={uid:?}, got {:?}",
            response["uid"].as_str().unwrap_or_default()
        ));
    }
    let allowed = response["allowed"]
        .as_bool()
        .ok_or("webhook response has no response.allowed")?;
    let patch = match response["patch"].as_str() {
        Some(p) if mutating && !p.is_empty() => {
            if response["patchType"] != "JSONPatch" {
                return Err(format!(
                    "webhook returned a patch of type {} (only JSONPatch is supported)",
                    response["patchType"]
                ));
            }
            Some(
                base64::engine::general_purpose::STANDARD
                    .decode(p)
                    .map_err(|e| format!("the patch is not base64: {e}"))?,
            )
        }
        _ => None,
    };
    let warnings = response["warnings"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|w| w.as_str().map(str::to_owned))
        .collect();
    Ok(Verdict {
        allowed,
        patch,
        warnings,
        status: response["status"].clone(),
    })
}

/// The error a denial answers with: the webhook's code (403 if it gave none) and its
/// message, after Kubernetes' `admission webhook "<name>" denied the request`.
pub fn denial(hook: &str, status: &Value) -> ApiError {
    let denied = format!("admission webhook {hook:?} denied the request");
    let message = match (status["message"].as_str(), status["reason"].as_str()) {
        (Some(m), _) if !m.is_empty() => format!("{denied}: {m}"),
        (_, Some(r)) if !r.is_empty() => format!("{denied}: {r}"),
        _ => format!("{denied} without explanation"),
    };
    let code = status["code"]
        .as_u64()
        .and_then(|c| u16::try_from(c).ok())
        .filter(|c| (400..600).contains(c))
        .unwrap_or(403);
    let reason = match code {
        400 => "BadRequest",
        401 => "Unauthorized",
        404 => "NotFound",
        405 => "MethodNotAllowed",
        409 => "Conflict",
        410 => "Gone",
        422 => "Invalid",
        429 => "TooManyRequests",
        500 => "InternalError",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        _ => "Forbidden",
    };
    ApiError::new(code, reason, message)
}

/// The error for a webhook that could not be called (under `failurePolicy: Fail`).
pub fn failed(hook: &str, why: &str) -> ApiError {
    ApiError::new(
        500,
        "InternalError",
        format!("Internal error occurred: failed calling webhook {hook:?}: {why}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hook(rules: Value) -> Hook {
        Hook::compile(
            "c",
            true,
            &json!({"name": "a.b.c", "rules": rules, "clientConfig": {"url": "https://127.0.0.1:1/"},
                    "namespaceSelector": {}, "objectSelector": {"matchLabels": {"hooked": "yes"}}}),
        )
        .expect("hook")
    }

    fn attrs<'a>(op: Operation, resource: &'a str, sub: Option<&'a str>) -> Attributes<'a> {
        Attributes {
            operation: op,
            group: "",
            version: "v1",
            resource,
            subresource: sub,
            namespaced: true,
        }
    }

    #[test]
    fn rules_select_resources_subresources_and_operations_as_kubernetes_does() {
        let served = crate::catalog::Builtin;
        let h = hook(
            json!([{"operations": ["CREATE", "UPDATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods", "configmaps/*"]}]),
        );
        assert!(
            h.selects(&attrs(Operation::Create, "pods", None), &served)
                .is_some()
        );
        assert!(
            h.selects(&attrs(Operation::Delete, "pods", None), &served)
                .is_none()
        );
        assert!(
            h.selects(&attrs(Operation::Update, "pods", Some("status")), &served)
                .is_none()
        );
        assert!(
            h.selects(&attrs(Operation::Update, "configmaps", Some("x")), &served)
                .is_some()
        );
        assert!(
            h.selects(&attrs(Operation::Update, "configmaps", None), &served)
                .is_none()
        );
        let all = hook(
            json!([{"operations": ["*"], "apiGroups": ["*"], "apiVersions": ["*"], "resources": ["*/*"], "scope": "Cluster"}]),
        );
        assert!(
            all.selects(&attrs(Operation::Delete, "pods", None), &served)
                .is_none()
        );
        let mut ns = attrs(Operation::Delete, "namespaces", None);
        ns.namespaced = false;
        assert!(all.selects(&ns, &served).is_some());
        let status = hook(
            json!([{"operations": ["*"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["*/status"]}]),
        );
        assert!(
            status
                .selects(&attrs(Operation::Update, "pods", Some("status")), &served)
                .is_some()
        );
        assert!(
            status
                .selects(&attrs(Operation::Update, "pods", None), &served)
                .is_none()
        );
    }

    #[test]
    fn object_selectors_match_the_new_or_the_old_object() {
        let h = hook(json!([]));
        let on = json!({"metadata": {"labels": {"hooked": "yes"}}});
        let off = json!({"metadata": {"labels": {"hooked": "no"}}});
        assert!(h.selectors.object_matches(Some(&on), None));
        assert!(h.selectors.object_matches(Some(&off), Some(&on)));
        assert!(!h.selectors.object_matches(Some(&off), None));
        assert!(!h.selectors.needs_namespace());
        assert!(h.selectors.namespace_matches(Some(&json!({}))));
    }

    #[test]
    fn answers_are_read_strictly() {
        let ok = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "response": {"uid": "u1", "allowed": true, "patchType": "JSONPatch",
                "patch": base64::engine::general_purpose::STANDARD.encode(r#"[{"op":"add","path":"/metadata/labels","value":{"a":"b"}}]"#),
                "warnings": ["careful"]}});
        let v = verdict(ok.to_string().as_bytes(), "u1", true).expect("verdict");
        assert!(v.allowed);
        let patch: Value = serde_json::from_slice(&v.patch.expect("patch")).expect("json");
        assert_eq!(patch[0]["op"], "add");
        assert_eq!(v.warnings, vec!["careful".to_owned()]);
        let wrong_uid = verdict(ok.to_string().as_bytes(), "u2", true).expect_err("uid");
        assert!(wrong_uid.contains("expected response.uid"), "{wrong_uid}");
        let v1beta1 = json!({"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview", "response": {"uid": "u1", "allowed": true}});
        assert!(verdict(v1beta1.to_string().as_bytes(), "u1", false).is_err());
        let d = denial(
            "deny.example.com",
            &json!({"code": 422, "message": "no bad names"}),
        );
        assert_eq!(d.code, 422);
        assert_eq!(
            d.message,
            "admission webhook \"deny.example.com\" denied the request: no bad names"
        );
        assert_eq!(denial("d.e.f", &Value::Null).code, 403);
    }
}
