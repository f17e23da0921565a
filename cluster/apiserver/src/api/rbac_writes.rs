//! What the request path does for RBAC and ServiceAccount tokens: the escalation check on
//! writes of roles and bindings, keeping the RBAC index current with this server's own
//! writes, `serviceaccounts/token` (TokenRequest), and whether a ServiceAccount token still
//! stands for a live account.

use serde_json::{Value, json};

use super::{Api, ApiResponse, decode_stored, object_key, store_error};
use crate::auth::{ServiceAccountClaims, User};
use crate::catalog::{RBAC, Resource};
use crate::rbac::{Attributes, Rule, tenant_owner_rules, uncovered};
use crate::request::{ApiRequest, find_resource};
use crate::status::{ApiError, Cause};

/// The default life of a ServiceAccount token (`kubectl create token` without `--duration`).
pub const TOKEN_DEFAULT_SECONDS: i64 = 3600;
/// The shortest life a TokenRequest may ask for (Kubernetes' ten minutes).
pub const TOKEN_MIN_SECONDS: i64 = 600;
/// The longest life a token is given; a longer request is shortened to it (as Kubernetes
/// does with `--service-account-max-token-expiration`).
pub const TOKEN_MAX_SECONDS: i64 = 48 * 3600;

fn rules_text(rules: &[Rule]) -> String {
    rules
        .iter()
        .map(|r| {
            if r.non_resource_urls.is_empty() {
                let names = if r.resource_names.is_empty() {
                    String::new()
                } else {
                    format!(", ResourceNames:{:?}", r.resource_names)
                };
                format!(
                    "{{APIGroups:{:?}, Resources:{:?}{names}, Verbs:{:?}}}",
                    r.api_groups, r.resources, r.verbs
                )
            } else {
                format!(
                    "{{NonResourceURLs:{:?}, Verbs:{:?}}}",
                    r.non_resource_urls, r.verbs
                )
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

impl Api {
    /// The rules `user` holds in `namespace` for the escalation check: what RBAC grants it,
    /// and for a tenant's own token the rules of its isolation and of `admin` (a tenant is
    /// the admin of its namespaces, so it may bind `admin`, `edit` and `view` there).
    async fn rules_held(&self, user: &User, namespace: &str) -> Result<Vec<Rule>, ApiError> {
        let rbac = self.authorizer.rbac();
        let (mut held, _) = rbac.rules_for(user, namespace).await?;
        if let User::Tenant(t) = user {
            held.extend(tenant_owner_rules(t));
            held.extend(
                rbac.role_rules("ClusterRole", "", "admin")
                    .await?
                    .unwrap_or_default(),
            );
        }
        Ok(held)
    }

    /// Whether RBAC grants `user` the special `verb` (`escalate`, `bind`) on role `name`.
    async fn may_specially(
        &self,
        user: &User,
        verb: &str,
        resource: &str,
        name: &str,
        namespace: &str,
    ) -> Result<bool, ApiError> {
        if !matches!(user, User::Named { .. } | User::ServiceAccount(_)) {
            return Ok(false);
        }
        let a = Attributes {
            verb,
            group: RBAC,
            resource,
            name,
            namespace,
            ..Attributes::default()
        };
        Ok(self.authorizer.rbac().decide(user, &a).await?.allowed)
    }

    /// Who may approve or deny a CertificateSigningRequest: besides `update` on its
    /// `approval` subresource, RBAC must grant `approve` on the signer (`signers` in
    /// `certificates.k8s.io`, named by the request's `signerName` or `<domain>/*`), as
    /// Kubernetes' CertificateApproval admission asks. The admin and the shard's components
    /// may; a tenant never (requests are cluster-scoped).
    pub(super) async fn check_csr_approval(
        &self,
        req: &ApiRequest,
        user: &User,
        next: &Value,
        current: &Value,
    ) -> Result<(), ApiError> {
        if !crate::csr::is_csr(req.resource)
            || req.subresource.as_deref() != Some("approval")
            || !crate::csr::decides(current, next)
            || matches!(user, User::Admin | User::System(_))
        {
            return Ok(());
        }
        let signer = current["spec"]["signerName"].as_str().unwrap_or_default();
        let name = super::name_of(current);
        if matches!(user, User::Named { .. } | User::ServiceAccount(_)) {
            for granted in [signer.to_owned(), crate::csr::signer_wildcard(signer)] {
                let a = Attributes {
                    verb: "approve",
                    group: crate::csr::GROUP,
                    resource: "signers",
                    name: &granted,
                    ..Attributes::default()
                };
                if self.authorizer.rbac().decide(user, &a).await?.allowed {
                    return Ok(());
                }
            }
        }
        Err(crate::csr::may_not_approve(name, user, signer))
    }

    /// RBAC's write rules: a binding's `roleRef` never changes, and nobody grants what it
    /// does not hold — a Role's rules, or the role a binding names, must be covered by the
    /// writer's own rules in that namespace, unless RBAC grants it `escalate` (roles) or
    /// `bind` (bindings) on that role. The admin and the shard's components hold everything.
    pub(super) async fn check_rbac_write(
        &self,
        res: &Resource,
        user: &User,
        obj: &Value,
        old: Option<&Value>,
    ) -> Result<(), ApiError> {
        if res.group != RBAC {
            return Ok(());
        }
        let name = super::name_of(obj);
        let binding = res.kind.ends_with("Binding");
        if binding
            && let Some(old) = old
            && old["roleRef"] != obj["roleRef"]
        {
            return Err(ApiError::invalid(
                res.group,
                res.kind,
                name,
                vec![Cause {
                    reason: "FieldValueInvalid",
                    field: "roleRef".into(),
                    message: format!("Invalid value: {}: cannot change roleRef", obj["roleRef"]),
                }],
            ));
        }
        if matches!(user, User::Admin | User::System(_)) {
            return Ok(());
        }
        let namespace = obj["metadata"]["namespace"].as_str().unwrap_or_default();
        let (granted, special, role_kind, role_name) = if binding {
            let rr = &obj["roleRef"];
            let (kind, role) = (
                rr["kind"].as_str().unwrap_or_default(),
                rr["name"].as_str().unwrap_or_default(),
            );
            let rules = self
                .authorizer
                .rbac()
                .role_rules(kind, namespace, role)
                .await?;
            let Some(rules) = rules else {
                return Err(ApiError::forbidden(format!(
                    "{}.{RBAC} {name:?} is forbidden: {} {role:?} not found: only a caller that may bind it can bind a role that does not exist",
                    res.plural,
                    kind.to_lowercase()
                )));
            };
            (rules, "bind", kind, role)
        } else {
            let mut rules: Vec<Rule> = obj["rules"]
                .as_array()
                .into_iter()
                .flatten()
                .map(Rule::from_json)
                .collect();
            if obj["aggregationRule"].is_object() {
                // What it aggregates is not known when it is written: it could be anything.
                rules.push(Rule::resource(&["*"], &["*"], &["*"]));
                rules.push(Rule::paths(&["*"], &["*"]));
            }
            (rules, "escalate", res.kind, name)
        };
        let held = self.rules_held(user, namespace).await?;
        let missing = uncovered(&held, &granted);
        if missing.is_empty() {
            return Ok(());
        }
        let role_resource = if role_kind == "Role" {
            "roles"
        } else {
            "clusterroles"
        };
        if self
            .may_specially(user, special, role_resource, role_name, namespace)
            .await?
        {
            return Ok(());
        }
        Err(ApiError::forbidden(format!(
            "{}.{RBAC} {name:?} is forbidden: user {:?} (groups={:?}) is attempting to grant RBAC permissions not currently held:\n{}",
            res.plural,
            user.name(),
            user.groups(),
            rules_text(&missing)
        )))
    }

    /// After a write of `res` at `key` committed at `rev` (`obj` None: deleted): an RBAC
    /// object goes into the index now, a Tenant makes namespace ownership be read again.
    pub(super) fn committed(&self, res: &Resource, key: &[u8], obj: Option<&Value>, rev: i64) {
        if res.group == RBAC {
            let bytes = obj.map(|o| o.to_string().into_bytes());
            self.authorizer.rbac().applied(key, bytes.as_deref(), rev);
        }
        if res.kind == "Tenant" {
            self.authorizer.tenants_changed();
        }
        if super::custom::is_crd(res) {
            self.crds.applied(key, obj, rev);
        }
        self.webhooks.applied(res, key, obj, rev);
        self.aggregator.applied(res, key, obj, rev);
        self.aggregator.service_written(res, key);
    }

    /// `POST .../serviceaccounts/NAME/token` (`kubectl create token`): a token for the
    /// account, for the audiences asked (this API's by default), bound to a Pod or Secret if
    /// asked, good for `spec.expirationSeconds` (an hour by default, ten minutes at least).
    pub(super) async fn create_token(&self, req: &ApiRequest) -> Result<ApiResponse, ApiError> {
        let Some(tokens) = &self.token_issuer else {
            return Err(ApiError::new(
                503,
                "ServiceUnavailable",
                "this API server issues no ServiceAccount tokens (it was started without a token key)",
            ));
        };
        let (ns, name) = (
            req.namespace.as_deref().unwrap_or_default(),
            req.name.as_deref().unwrap_or_default(),
        );
        let kv = self
            .store
            .get(object_key(req.resource, Some(ns), name).as_bytes())
            .await
            .map_err(store_error)?
            .ok_or_else(|| ApiError::not_found("", "serviceaccounts", name))?;
        let account = decode_stored(&kv)?;
        let body: Value = if req.body.is_empty() {
            json!({})
        } else {
            serde_json::from_slice(&req.body).map_err(|e| {
                ApiError::bad_request(format!("the TokenRequest is not valid JSON: {e}"))
            })?
        };
        let spec = &body["spec"];
        let invalid = |field: &str, value: &Value, why: &str| {
            ApiError::invalid(
                "authentication.k8s.io",
                "TokenRequest",
                name,
                vec![Cause {
                    reason: "FieldValueInvalid",
                    field: field.into(),
                    message: format!("Invalid value: {value}: {why}"),
                }],
            )
        };
        let asked = match &spec["expirationSeconds"] {
            Value::Null => TOKEN_DEFAULT_SECONDS,
            v => v
                .as_i64()
                .ok_or_else(|| invalid("spec.expirationSeconds", v, "must be an integer"))?,
        };
        if asked < TOKEN_MIN_SECONDS {
            return Err(invalid(
                "spec.expirationSeconds",
                &spec["expirationSeconds"],
                "may not specify a duration less than 10 minutes",
            ));
        }
        if asked > 1 << 32 {
            return Err(invalid(
                "spec.expirationSeconds",
                &spec["expirationSeconds"],
                "may not specify a duration larger than 2^32 seconds",
            ));
        }
        let seconds = asked.min(TOKEN_MAX_SECONDS);
        let mut audiences: Vec<String> = spec["audiences"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|a| a.as_str().map(str::to_owned))
            .collect();
        if audiences.is_empty() {
            audiences.push(crate::auth::SERVICE_ACCOUNT_ISSUER.to_owned());
        }
        let bound = match spec["boundObjectRef"].as_object() {
            None => None,
            Some(r) => Some(self.bound_object(ns, r).await?),
        };
        let now = super::now_secs();
        let claims = ServiceAccountClaims {
            namespace: ns.to_owned(),
            name: name.to_owned(),
            uid: account["metadata"]["uid"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            bound: bound.clone(),
            audiences: audiences.clone(),
            issued: now,
            expires: now + seconds,
            id: super::uid(),
        };
        let mut out_spec = json!({"audiences": audiences, "expirationSeconds": seconds});
        if let Some((kind, bname, buid)) = &bound {
            out_spec["boundObjectRef"] =
                json!({"kind": kind, "apiVersion": "v1", "name": bname, "uid": buid});
        }
        Ok(ApiResponse::Object {
            code: 201,
            body: json!({
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "metadata": {"name": name, "namespace": ns,
                    "creationTimestamp": super::rfc3339(now)},
                "spec": out_spec,
                "status": {
                    "token": tokens.mint_service_account(&claims),
                    "expirationTimestamp": super::rfc3339(claims.expires),
                },
            }),
            warnings: Vec::new(),
        })
    }

    /// The Pod or Secret a TokenRequest binds its token to: it must exist in the account's
    /// namespace (with the uid given, if one is).
    async fn bound_object(
        &self,
        ns: &str,
        r: &serde_json::Map<String, Value>,
    ) -> Result<(String, String, String), ApiError> {
        let s = |k: &str| r.get(k).and_then(Value::as_str).unwrap_or_default();
        let plural = match s("kind") {
            "Pod" => "pods",
            "Secret" => "secrets",
            other => {
                return Err(ApiError::invalid(
                    "authentication.k8s.io",
                    "TokenRequest",
                    "",
                    vec![Cause {
                        reason: "FieldValueNotSupported",
                        field: "spec.boundObjectRef.kind".into(),
                        message: format!(
                            "Unsupported value: {other:?}: supported values: \"Pod\", \"Secret\""
                        ),
                    }],
                ));
            }
        };
        let res = find_resource("", "v1", plural)?;
        let obj = self
            .store
            .get(object_key(res, Some(ns), s("name")).as_bytes())
            .await
            .map_err(store_error)?
            .map(|kv| decode_stored(&kv))
            .transpose()?
            .ok_or_else(|| ApiError::not_found("", plural, s("name")))?;
        let uid = obj["metadata"]["uid"].as_str().unwrap_or_default();
        if !s("uid").is_empty() && s("uid") != uid {
            return Err(ApiError::conflict_because(
                "",
                plural,
                s("name"),
                &format!("the uid {:?} is not the object's ({uid})", s("uid")),
            ));
        }
        Ok((s("kind").to_owned(), s("name").to_owned(), uid.to_owned()))
    }

    /// Whether a ServiceAccount token still stands for a live account: the account exists
    /// with the uid the token names, and so does the Pod or Secret it is bound to (a pod
    /// being deleted ends its tokens).
    pub async fn service_account_current(&self, c: &ServiceAccountClaims) -> bool {
        let live = |plural: &'static str, name: String, uid: String| async move {
            let Ok(res) = find_resource("", "v1", plural) else {
                return false;
            };
            let key = object_key(res, Some(&c.namespace), &name);
            match self.store.get(key.as_bytes()).await {
                Ok(Some(kv)) => decode_stored(&kv).is_ok_and(|o| {
                    o["metadata"]["uid"] == uid.as_str()
                        && o["metadata"]["deletionTimestamp"].is_null()
                }),
                _ => false,
            }
        };
        if !live("serviceaccounts", c.name.clone(), c.uid.clone()).await {
            return false;
        }
        match &c.bound {
            Some((kind, name, uid)) => {
                let plural = if kind == "Pod" { "pods" } else { "secrets" };
                live(plural, name.clone(), uid.clone()).await
            }
            None => true,
        }
    }
}
