//! `TokenReview` (`authentication.k8s.io/v1`): who does this bearer token name? What
//! authenticates with the cluster's tokens without holding its keys asks here — Vault's
//! Kubernetes auth, a mesh's certificate authority, kube-rbac-proxy, an extension API
//! server. The token is checked exactly as a request carrying it would be (signature,
//! expiry, a tenant token's generation, a ServiceAccount token's account and bound object
//! still being there), and the answer names the user, its uid and groups.
//!
//! Audiences, as Kubernetes checks them: with `spec.audiences`, a ServiceAccount token is
//! good if it was issued for one of them (`kubectl create token robot --audience vault`),
//! and the answer lists those it shares; the server's other tokens are for this API alone,
//! so they are good only when the audiences include it. Without audiences, a token must be
//! good for this API.
//!
//! The caller needs RBAC's `create` on `tokenreviews` (`system:auth-delegator` grants it);
//! a tenant's callers review no tokens (see [`crate::access_review`]).

use serde_json::{Value, json};

use crate::api::Api;
use crate::auth::{SERVICE_ACCOUNT_ISSUER, User};
use crate::status::ApiError;

/// What the review found: the user and the audiences the token is good for, or why the
/// token names nobody.
async fn authenticate(
    api: &Api,
    token: &str,
    wanted: &[String],
) -> Result<(User, Vec<String>), String> {
    let Some(tokens) = api.tokens() else {
        return Err("this API server checks no tokens (it was started without a token key)".into());
    };
    if token.is_empty() {
        return Err("the token is empty".into());
    }
    let now = crate::api::now_secs();
    let for_api = [SERVICE_ACCOUNT_ISSUER.to_owned()];
    let audiences = if wanted.is_empty() {
        &for_api[..]
    } else {
        wanted
    };
    // A ServiceAccount token (a JWT) carries its audiences.
    if let Some(claims) = tokens.check_service_account_for(token, now, audiences) {
        if !api.service_account_current(&claims).await {
            return Err(
                "the ServiceAccount token is no longer valid: its ServiceAccount, or the pod or secret it was bound to, was deleted or re-created"
                    .into(),
            );
        }
        let shared: Vec<String> = claims
            .audiences
            .iter()
            .filter(|a| audiences.contains(a))
            .cloned()
            .collect();
        return Ok((User::ServiceAccount(Box::new(claims)), shared));
    }
    if !audiences.iter().any(|a| a == SERVICE_ACCOUNT_ISSUER) {
        return Err(format!(
            "the token is not valid for the audiences asked ({}): only ServiceAccount tokens issued for one of them are",
            wanted.join(", ")
        ));
    }
    match tokens.authenticate(token, now) {
        Some((User::ServiceAccount(_), _)) | None => {
            Err("the token is not valid (or has expired)".into())
        }
        Some((user, claims)) => {
            if let Some(c) = claims
                && !api.tenant_token_current(&c).await
            {
                return Err(
                    "the token was revoked: its Tenant was re-created or its spec.tokenGeneration bumped"
                        .into(),
                );
            }
            Ok((user, for_api.to_vec()))
        }
    }
}

/// Answers a TokenReview asked by `caller`.
pub(crate) async fn token_review(
    api: &Api,
    caller: &User,
    review: &Value,
) -> Result<Value, ApiError> {
    crate::access_review::may_create(api, caller, "authentication.k8s.io", "tokenreviews", None)
        .await?;
    let spec = &review["spec"];
    let token = spec["token"].as_str().unwrap_or_default();
    let wanted: Vec<String> = spec["audiences"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|a| a.as_str().map(str::to_owned))
        .collect();
    let (result, status) = match authenticate(api, token, &wanted).await {
        Ok((user, audiences)) => {
            let uid = match &user {
                User::ServiceAccount(sa) => sa.uid.clone(),
                _ => String::new(),
            };
            let status = json!({
                "authenticated": true,
                "user": {"username": user.name(), "uid": uid, "groups": user.groups()},
                "audiences": audiences,
            });
            ("authenticated", status)
        }
        Err(why) => (
            "unauthenticated",
            json!({"authenticated": false, "error": why}),
        ),
    };
    if let Some(m) = api.metrics() {
        m.token_reviews.with_label_values(&[result]).inc();
    }
    Ok(json!({
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenReview",
        "metadata": {},
        "spec": spec,
        "status": status,
    }))
}
