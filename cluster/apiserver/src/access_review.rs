//! The reviews a caller makes of itself, answered by the same authorizer that guards every
//! request:
//! - `SelfSubjectAccessReview` (`kubectl auth can-i VERB RESOURCE`): may I do this?
//! - `SelfSubjectRulesReview` (`kubectl auth can-i --list`): what may I do in a namespace?
//! - `SelfSubjectReview` (`kubectl auth whoami`): who am I?
//!
//! Every authenticated caller may make them (Kubernetes grants them through
//! `system:basic-user`, bound to `system:authenticated`).
//!
//! And the reviews a caller makes of others, for what delegates its authorization here
//! (kube-rbac-proxy, extension API servers, operators' own checks) — a caller needs RBAC's
//! `create` on them (`system:auth-delegator` grants it):
//! - `SubjectAccessReview`: may this user (and these groups) do this? Answered by the same
//!   authorizer, tenant isolation included, for the user the names make: `tenant:NAME` is
//!   that tenant's own token, `system:serviceaccount:NS:NAME` that account, anyone else a
//!   user in the groups given (in a tenant if `tessera:tenant:NAME` is among them).
//! - `LocalSubjectAccessReview`: the same within one namespace (a tenant's callers ask
//!   only in their tenant's namespaces).
//! - `TokenReview` ([`crate::token_review`]): who does this token name?
//!
//! A tenant's callers make no cluster-wide reviews of others: a SubjectAccessReview would
//! tell them what anyone may do anywhere, and a TokenReview is a cluster's authenticator.

use serde_json::{Value, json};

use crate::api::{Api, ApiResponse};
use crate::auth::{User, tenant_may_not_write};
use crate::catalog::RESOURCES;
use crate::rbac::{Attributes, Rule, tenant_owner_rules};
use crate::request::{ApiRequest, PatchType, Verb};
use crate::status::{ApiError, Cause};

/// The paths of the three reviews.
pub const ACCESS_REVIEWS: &str = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews";
/// `kubectl auth can-i --list`.
pub const RULES_REVIEWS: &str = "/apis/authorization.k8s.io/v1/selfsubjectrulesreviews";
/// `kubectl auth whoami`.
pub const SELF_REVIEWS: &str = "/apis/authentication.k8s.io/v1/selfsubjectreviews";

/// `SubjectAccessReview`.
pub const SUBJECT_ACCESS_REVIEWS: &str = "/apis/authorization.k8s.io/v1/subjectaccessreviews";
/// `TokenReview`.
pub const TOKEN_REVIEWS: &str = "/apis/authentication.k8s.io/v1/tokenreviews";

/// The namespace of a `LocalSubjectAccessReview` path.
fn local_namespace(path: &str) -> Option<&str> {
    path.strip_prefix("/apis/authorization.k8s.io/v1/namespaces/")?
        .strip_suffix("/localsubjectaccessreviews")
        .filter(|ns| !ns.is_empty() && !ns.contains('/'))
}

/// Whether `path` is one of the reviews.
pub fn is_review(path: &str) -> bool {
    [
        ACCESS_REVIEWS,
        RULES_REVIEWS,
        SELF_REVIEWS,
        SUBJECT_ACCESS_REVIEWS,
        TOKEN_REVIEWS,
    ]
    .contains(&path)
        || local_namespace(path).is_some()
}

fn verb(v: &str) -> Option<Verb> {
    Some(match v {
        "get" => Verb::Get,
        "list" => Verb::List,
        "watch" => Verb::Watch,
        "create" => Verb::Create,
        "update" => Verb::Update,
        "patch" => Verb::Patch(PatchType::Merge),
        "delete" => Verb::Delete,
        "deletecollection" => Verb::DeleteCollection,
        _ => return None,
    })
}

/// Paths anyone authenticated may read (discovery, OpenAPI, health).
fn public_path(path: &str) -> bool {
    [
        "/api", "/apis", "/version", "/openapi", "/healthz", "/livez", "/readyz",
    ]
    .iter()
    .any(|p| path == *p || path.starts_with(&format!("{p}/")))
}

fn governed_by_rbac(user: &User) -> bool {
    matches!(user, User::Named { .. } | User::ServiceAccount(_))
}

/// Answers a review at `path` for `user`.
pub async fn review(
    api: &Api,
    user: &User,
    path: &str,
    method: &str,
    body: &[u8],
) -> Result<ApiResponse, ApiError> {
    if method != "POST" {
        return Err(ApiError::new(
            405,
            "MethodNotAllowed",
            format!("{path} is only created (POST)"),
        ));
    }
    let review: Value = if body.is_empty() {
        json!({})
    } else {
        serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("the review is not valid JSON: {e}")))?
    };
    let answer = match path {
        RULES_REVIEWS => rules_review(api, user, &review).await?,
        SELF_REVIEWS => self_review(user),
        TOKEN_REVIEWS => crate::token_review::token_review(api, user, &review).await?,
        SUBJECT_ACCESS_REVIEWS => subject_access_review(api, user, &review, None).await?,
        ACCESS_REVIEWS => access_review(api, user, &review, "SelfSubjectAccessReview").await?,
        _ => subject_access_review(api, user, &review, local_namespace(path)).await?,
    };
    Ok(ApiResponse::Object {
        code: 201,
        body: answer,
        warnings: Vec::new(),
    })
}

/// Whether `caller` may create review `resource` of `group` (in `namespace`, for a local
/// one): RBAC's `create` on it, within a tenant's namespaces for a tenant's callers.
pub(crate) async fn may_create(
    api: &Api,
    caller: &User,
    group: &str,
    resource: &str,
    namespace: Option<&str>,
) -> Result<(), ApiError> {
    let scope = match namespace {
        Some(ns) => format!("in the namespace {ns:?}"),
        None => "at the cluster scope".to_owned(),
    };
    let refused = |why: String| {
        ApiError::forbidden(format!(
            "{resource}.{group} is forbidden: User {:?} cannot create resource {resource:?} in API group {group:?} {scope}{why}",
            caller.name()
        ))
    };
    let tenant = match caller {
        User::Admin | User::System(_) => return Ok(()),
        User::LentNode { .. } => return Err(refused(String::new())),
        User::Tenant(t) => Some(t.clone()),
        User::Named { .. } | User::ServiceAccount(_) => {
            api.authorizer().tenant_of_user(caller).await?
        }
    };
    if let Some(t) = &tenant {
        let owned = match namespace {
            Some(ns) => owned_namespace(api, t, ns).await?,
            None => false,
        };
        if !owned {
            return Err(refused(format!(
                ": tenant {t}'s callers review others only in the tenant's namespaces"
            )));
        }
        if matches!(caller, User::Tenant(_)) {
            return Ok(());
        }
    }
    let a = Attributes {
        verb: "create",
        group,
        resource,
        namespace: namespace.unwrap_or_default(),
        ..Attributes::default()
    };
    if api.authorizer().rbac().decide(caller, &a).await?.allowed {
        Ok(())
    } else {
        Err(refused(String::new()))
    }
}

/// The caller a SubjectAccessReview's `user` and `groups` name (see the module's notes).
fn subject_of(name: &str, groups: &[String], uid: &str) -> User {
    if let Some((ns, account)) = name
        .strip_prefix(crate::auth::SERVICE_ACCOUNT_PREFIX)
        .and_then(|rest| rest.split_once(':'))
    {
        return User::ServiceAccount(Box::new(crate::auth::ServiceAccountClaims {
            namespace: ns.to_owned(),
            name: account.to_owned(),
            uid: uid.to_owned(),
            bound: None,
            audiences: Vec::new(),
            issued: 0,
            expires: i64::MAX,
            id: String::new(),
        }));
    }
    if let Some(t) = name.strip_prefix("tenant:") {
        return User::Tenant(t.to_owned());
    }
    let tenant_prefix = crate::auth::tenant_group("");
    User::Named {
        name: name.to_owned(),
        groups: groups
            .iter()
            .filter(|g| {
                g.as_str() != crate::auth::AUTHENTICATED_GROUP && !g.starts_with(&tenant_prefix)
            })
            .cloned()
            .collect(),
        tenant: groups
            .iter()
            .find_map(|g| g.strip_prefix(&tenant_prefix))
            .map(str::to_owned),
    }
}

/// A SubjectAccessReview (or, with `local`, a LocalSubjectAccessReview in that namespace):
/// what the user it names may do, asked by `caller`.
async fn subject_access_review(
    api: &Api,
    caller: &User,
    review: &Value,
    local: Option<&str>,
) -> Result<Value, ApiError> {
    let (group, resource, kind) = match local {
        Some(_) => (
            "authorization.k8s.io",
            "localsubjectaccessreviews",
            "LocalSubjectAccessReview",
        ),
        None => (
            "authorization.k8s.io",
            "subjectaccessreviews",
            "SubjectAccessReview",
        ),
    };
    may_create(api, caller, group, resource, local).await?;
    let mut review = review.clone();
    let spec = &mut review["spec"];
    let name = spec["user"].as_str().unwrap_or_default().to_owned();
    let groups: Vec<String> = spec["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|g| g.as_str().map(str::to_owned))
        .collect();
    let invalid = |field: &str, message: &str| {
        ApiError::invalid(
            group,
            kind,
            "",
            vec![Cause {
                reason: "FieldValueInvalid",
                field: field.into(),
                message: message.into(),
            }],
        )
    };
    if name.is_empty() && groups.is_empty() {
        return Err(invalid(
            "spec.user",
            "Invalid value: \"\": at least one of user or group must be specified",
        ));
    }
    if let Some(ns) = local {
        if spec["nonResourceAttributes"].is_object() {
            return Err(invalid(
                "spec.nonResourceAttributes",
                "Invalid value: disallowed on this kind of request",
            ));
        }
        let asked = spec["resourceAttributes"]["namespace"].as_str();
        if asked.is_some_and(|a| !a.is_empty() && a != ns) {
            return Err(invalid(
                "spec.resourceAttributes.namespace",
                &format!("Invalid value: {asked:?}: must match metadata.namespace ({ns:?})"),
            ));
        }
        if spec["resourceAttributes"].is_object() {
            spec["resourceAttributes"]["namespace"] = json!(ns);
        }
    }
    let uid = spec["uid"].as_str().unwrap_or_default().to_owned();
    let subject = subject_of(&name, &groups, &uid);
    let mut answer = access_review(api, &subject, &review, kind).await?;
    if let Some(ns) = local {
        answer["metadata"]["namespace"] = json!(ns);
    }
    Ok(answer)
}

async fn access_review(
    api: &Api,
    user: &User,
    review: &Value,
    kind: &str,
) -> Result<Value, ApiError> {
    let spec = &review["spec"];
    let (allowed, reason) = if let Some(attrs) = spec["resourceAttributes"].as_object() {
        resource_decision(api, user, attrs).await?
    } else if let Some(path) = spec["nonResourceAttributes"]["path"].as_str() {
        let verb = spec["nonResourceAttributes"]["verb"]
            .as_str()
            .unwrap_or("get");
        match user {
            User::Admin | User::System(_) => (true, String::new()),
            _ if public_path(path) => (true, String::new()),
            u if governed_by_rbac(u) => {
                let a = Attributes {
                    verb,
                    path,
                    ..Attributes::default()
                };
                let d = api.authorizer().rbac().decide(user, &a).await?;
                (d.allowed, d.reason)
            }
            User::LentNode { .. } => (false, format!("lent nodes may not access {path}")),
            _ => (false, format!("tenants may not access {path}")),
        }
    } else {
        return Err(ApiError::invalid(
            "authorization.k8s.io",
            kind,
            "",
            vec![Cause {
                reason: "FieldValueRequired",
                field: "spec.resourceAttributes".into(),
                message:
                    "Required value: exactly one of resourceAttributes or nonResourceAttributes"
                        .into(),
            }],
        ));
    };
    let mut status = json!({"allowed": allowed});
    if !reason.is_empty() {
        status["reason"] = json!(reason);
    }
    Ok(json!({
        "apiVersion": "authorization.k8s.io/v1",
        "kind": kind,
        "metadata": {},
        "spec": spec,
        "status": status,
    }))
}

/// May `user` do what `s` (the resourceAttributes' fields) says?
async fn resource_decision(
    api: &Api,
    user: &User,
    attrs: &serde_json::Map<String, Value>,
) -> Result<(bool, String), ApiError> {
    let s = |k: &str| attrs.get(k).and_then(Value::as_str).unwrap_or_default();
    let (group, plural) = (s("group"), s("resource"));
    let served = RESOURCES
        .iter()
        .find(|r| r.group == group && r.plural == plural);
    let Some((res, v)) = served.zip(verb(s("verb"))) else {
        // A wildcard, a special verb (`bind`, `escalate`, `impersonate`), a resource an
        // extension API server serves, or one nothing serves.
        let a = Attributes {
            verb: s("verb"),
            group,
            resource: plural,
            subresource: s("subresource"),
            name: s("name"),
            namespace: s("namespace"),
            path: "",
        };
        let aggregated = served.is_none() && api.aggregator().current_routes().serves_group(group);
        return unserved_decision(api, user, &a, served.is_some() || aggregated, aggregated).await;
    };
    let mut req = ApiRequest::new(v, res);
    req.namespace = Some(s("namespace").to_owned()).filter(|n| !n.is_empty() && res.namespaced);
    req.name = Some(s("name").to_owned()).filter(|n| !n.is_empty());
    req.subresource = Some(s("subresource").to_owned()).filter(|n| !n.is_empty());
    if v == Verb::Create && res.plural == "namespaces" && req.name.is_some() {
        req.body = serde_json::to_vec(&json!({"metadata": {"name": s("name")}}))
            .unwrap_or_default()
            .into();
        req.name = None;
    }
    api.authorizer().review(user, &req).await
}

async fn owned_namespace(api: &Api, tenant: &str, ns: &str) -> Result<bool, ApiError> {
    Ok(!ns.is_empty() && api.authorizer().tenant_owning(ns).await?.as_deref() == Some(tenant))
}

/// May `user` do what `a` says on a resource an extension API server serves (a request the
/// aggregator proxies, or an extension's SubjectAccessReview about one)? As on the
/// resources stored here: the admin and components may; a tenant's own token may within
/// its namespaces; its users and ServiceAccounts as RBAC grants, within its namespaces;
/// callers outside any tenant as RBAC grants.
pub(crate) async fn extension_decision(
    api: &Api,
    user: &User,
    a: &Attributes<'_>,
) -> Result<(bool, String), ApiError> {
    unserved_decision(api, user, a, true, true).await
}

/// [`extension_decision`] for what the catalog's request path cannot judge: a wildcard, a
/// special verb (on a resource stored here, `served`), an extension's resource
/// (`aggregated`, and `served`), or a resource nothing serves, which RBAC alone can grant,
/// and only to a caller outside any tenant.
async fn unserved_decision(
    api: &Api,
    user: &User,
    a: &Attributes<'_>,
    served: bool,
    aggregated: bool,
) -> Result<(bool, String), ApiError> {
    let owned = |t: String| async move {
        Ok::<bool, ApiError>(
            !a.namespace.is_empty() && owned_namespace(api, &t, a.namespace).await?,
        )
    };
    Ok(match user {
        User::Admin | User::System(_) => (true, String::new()),
        User::Named { .. } | User::ServiceAccount(_) => {
            match api.authorizer().tenant_of_user(user).await? {
                Some(t) if !served || !owned(t.clone()).await? => (
                    false,
                    format!("tenant {t}'s callers act only on served resources in its namespaces"),
                ),
                _ => {
                    let d = api.authorizer().rbac().decide(user, a).await?;
                    (d.allowed, d.reason)
                }
            }
        }
        User::Tenant(_) if !served => (
            false,
            format!(
                "the server does not serve resource {:?} in group {:?}",
                a.resource, a.group
            ),
        ),
        User::Tenant(t) if aggregated && owned(t.clone()).await? => (true, String::new()),
        User::Tenant(t) => (
            false,
            format!("tenant {t} may act only on resources in its own namespaces"),
        ),
        User::LentNode { node, .. } => (
            false,
            format!("lent node {node} may act only on its own Node, Lease and pods"),
        ),
    })
}

/// The rules as a review reports them: (resourceRules, nonResourceRules).
fn split(rules: &[Rule]) -> (Vec<Value>, Vec<Value>) {
    let (paths, resources): (Vec<&Rule>, Vec<&Rule>) =
        rules.iter().partition(|r| !r.non_resource_urls.is_empty());
    (
        resources.iter().map(|r| r.to_json()).collect(),
        paths.iter().map(|r| r.to_json()).collect(),
    )
}

/// Within a tenant's isolation: what of `rules` still holds in a namespace the tenant owns
/// (`owned`) or not. Writes of what only admins write are taken out; a wildcard that
/// isolation narrows is kept and reported as incomplete.
fn within_isolation(rules: Vec<Rule>, owned: bool) -> (Vec<Rule>, bool) {
    const CLUSTER_READ: &[&str] = &["nodes", "nodes/status", "priorityclasses", "tenants"];
    let mut narrowed = false;
    let mut out = Vec::new();
    for mut rule in rules {
        if !rule.non_resource_urls.is_empty() {
            out.push(rule);
            continue;
        }
        let writes = rule
            .verbs
            .iter()
            .any(|v| !matches!(v.as_str(), "get" | "list" | "watch"));
        narrowed |=
            rule.resources.iter().any(|r| r == "*") || rule.api_groups.iter().any(|g| g == "*");
        rule.resources.retain(|r| {
            let (plural, sub) = r
                .split_once('/')
                .map_or((r.as_str(), None), |(p, s)| (p, Some(s)));
            let namespaced = RESOURCES.iter().any(|x| x.plural == plural && x.namespaced);
            let reachable = plural == "*"
                || plural == "namespaces"
                || plural.starts_with("selfsubject")
                || (namespaced && owned)
                || (!writes && CLUSTER_READ.contains(&r.as_str()));
            let admin_only = writes
                && rule
                    .api_groups
                    .iter()
                    .any(|g| tenant_may_not_write(g, plural, sub).is_some());
            reachable && !admin_only
        });
        if !rule.resources.is_empty() {
            out.push(rule);
        }
    }
    (out, narrowed)
}

async fn rules_review(api: &Api, user: &User, review: &Value) -> Result<Value, ApiError> {
    let ns = review["spec"]["namespace"].as_str().unwrap_or_default();
    let rbac = api.authorizer().rbac();
    let (rules, missing) = rbac.rules_for(user, ns).await?;
    let mut errors = missing;
    let (rules, incomplete) = match user {
        User::Admin | User::System(_) => {
            let mut all = vec![
                Rule::resource(&["*"], &["*"], &["*"]),
                Rule::paths(&["*"], &["*"]),
            ];
            all.extend(rules);
            (all, false)
        }
        User::Tenant(t) => {
            let owned = owned_namespace(api, t, ns).await?;
            let mut own: Vec<Rule> = tenant_owner_rules(t);
            if !owned {
                // Outside its namespaces only the cluster-scoped part holds.
                let namespaced: Vec<Rule> = own
                    .iter()
                    .filter(|r| {
                        r.resources.iter().all(|x| {
                            let plural = x.split('/').next().unwrap_or_default();
                            RESOURCES
                                .iter()
                                .any(|res| res.plural == plural && res.namespaced)
                        })
                    })
                    .cloned()
                    .collect();
                own.retain(|r| !namespaced.contains(r));
            }
            own.extend(
                rules
                    .into_iter()
                    .filter(|r| !r.non_resource_urls.is_empty()),
            );
            (own, false)
        }
        User::LentNode { node, .. } => {
            errors.push(format!(
                "lent node {node} may write only its own Node and Lease, the status of pods bound to it, and events"
            ));
            (Vec::new(), true)
        }
        User::Named { .. } | User::ServiceAccount(_) => {
            match api.authorizer().tenant_of_user(user).await? {
                Some(t) => {
                    let owned = owned_namespace(api, &t, ns).await?;
                    let (kept, narrowed) = within_isolation(rules, owned);
                    if narrowed {
                        errors.push(format!(
                            "tenant {t}'s isolation narrows wildcard rules: only its namespaces, and never writes of quotas, limit ranges, pods' status or bindings"
                        ));
                    }
                    (kept, narrowed)
                }
                None => (rules, false),
            }
        }
    };
    let (resource_rules, non_resource_rules) = split(&rules);
    let mut status = json!({
        "resourceRules": resource_rules,
        "nonResourceRules": non_resource_rules,
        "incomplete": incomplete,
    });
    if !errors.is_empty() {
        status["evaluationError"] = json!(errors.join("; "));
    }
    Ok(json!({
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectRulesReview",
        "metadata": {},
        "spec": review["spec"],
        "status": status,
    }))
}

fn self_review(user: &User) -> Value {
    let mut info = json!({"username": user.name(), "groups": user.groups()});
    if let User::ServiceAccount(sa) = user {
        info["uid"] = json!(sa.uid);
        let mut extra =
            json!({"authentication.kubernetes.io/credential-id": [format!("JTI={}", sa.id)]});
        if let Some((kind, name, uid)) = &sa.bound
            && kind == "Pod"
        {
            extra["authentication.kubernetes.io/pod-name"] = json!([name]);
            extra["authentication.kubernetes.io/pod-uid"] = json!([uid]);
        }
        info["extra"] = extra;
    }
    json!({
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "SelfSubjectReview",
        "metadata": {"creationTimestamp": null},
        "status": {"userInfo": info},
    })
}
