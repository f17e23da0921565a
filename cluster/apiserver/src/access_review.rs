//! `SelfSubjectAccessReview` (`POST /apis/authorization.k8s.io/v1/selfsubjectaccessreviews`):
//! "may I do this?", answered by the same authorizer that guards every request. This is what
//! `kubectl auth can-i` asks.

use serde_json::{Value, json};

use crate::api::{Api, ApiResponse};
use crate::auth::User;
use crate::catalog::RESOURCES;
use crate::request::{ApiRequest, PatchType, Verb};
use crate::status::ApiError;

fn verb(v: &str) -> Option<Verb> {
    Some(match v {
        "get" => Verb::Get,
        "list" => Verb::List,
        "watch" => Verb::Watch,
        "create" | "*" => Verb::Create,
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

/// Answers a review for `user`.
pub async fn review(
    api: &Api,
    user: &User,
    method: &str,
    body: &[u8],
) -> Result<ApiResponse, ApiError> {
    if method != "POST" {
        return Err(ApiError::new(
            405,
            "MethodNotAllowed",
            "selfsubjectaccessreviews are only created (POST)",
        ));
    }
    let review: Value = serde_json::from_slice(body).map_err(|e| {
        ApiError::bad_request(format!(
            "the SelfSubjectAccessReview is not valid JSON: {e}"
        ))
    })?;
    let spec = &review["spec"];
    let (allowed, reason) = if let Some(attrs) = spec["resourceAttributes"].as_object() {
        let s = |k: &str| attrs.get(k).and_then(Value::as_str).unwrap_or_default();
        let group = s("group");
        let plural = s("resource");
        if plural == "*" || group == "*" {
            match user {
                User::Admin | User::System(_) => (true, String::new()),
                User::Tenant(t) => (
                    false,
                    format!("tenant {t} may act only on resources in its own namespaces"),
                ),
                User::LentNode { node, .. } => (
                    false,
                    format!("lent node {node} may act only on its own Node, Lease and pods"),
                ),
            }
        } else {
            match (
                RESOURCES
                    .iter()
                    .find(|r| r.group == group && r.plural == plural),
                verb(s("verb")),
            ) {
                (None, _) => (
                    false,
                    format!("the server does not serve resource {plural:?} in group {group:?}"),
                ),
                (_, None) => (false, format!("unknown verb {:?}", s("verb"))),
                (Some(res), Some(v)) => {
                    let mut req = ApiRequest::new(v, res);
                    req.namespace =
                        Some(s("namespace").to_owned()).filter(|n| !n.is_empty() && res.namespaced);
                    req.name = Some(s("name").to_owned()).filter(|n| !n.is_empty());
                    req.subresource = Some(s("subresource").to_owned()).filter(|n| !n.is_empty());
                    if v == Verb::Create && res.plural == "namespaces" {
                        req.body = serde_json::to_vec(&json!({"metadata": {"name": s("name")}}))
                            .unwrap_or_default()
                            .into();
                        req.name = None;
                    }
                    match api.authorizer().authorize(user, &req).await {
                        Ok(_) => (true, String::new()),
                        Err(e) => (false, e.message),
                    }
                }
            }
        }
    } else if let Some(path) = spec["nonResourceAttributes"]["path"].as_str() {
        match user {
            User::Admin | User::System(_) => (true, String::new()),
            User::Tenant(_) | User::LentNode { .. } if public_path(path) => (true, String::new()),
            User::Tenant(_) => (false, format!("tenants may not access {path}")),
            User::LentNode { .. } => (false, format!("lent nodes may not access {path}")),
        }
    } else {
        return Err(ApiError::invalid(
            "authorization.k8s.io",
            "SelfSubjectAccessReview",
            "",
            vec![crate::status::Cause {
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
    Ok(ApiResponse::Object {
        code: 201,
        body: json!({
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "metadata": {},
            "spec": spec,
            "status": status,
        }),
        warnings: Vec::new(),
    })
}
