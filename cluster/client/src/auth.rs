//! Who is asking: the callers an API knows ([`User`]) and the bearer tokens that name them.
//!
//! Two kinds of bearer token: the admin token that `tessera up` generates (in the data
//! directory's `pki/`, and in the kubeconfig), and tenant tokens,
//! `tenant.<name>.<uid>.<generation>.<expires>.<HMAC-SHA256>`, minted by
//! `tessera token create --tenant NAME --ttl 24h` with a key derived from `pki/token.key`.
//! Tenant tokens need no state on the server: one expires by itself, and all of a tenant's
//! are revoked by bumping its `spec.tokenGeneration` or re-creating it (its uid changes);
//! replacing `token.key` revokes every tenant's. The admin token rotates on its own. Node
//! credentials (the API server asking a node agent for one request) are keyed apart.
//!
//! Here beside the client because node agents check node credentials and tools mint tenant
//! tokens; what a caller may do is the API server's `auth::Authorizer`.

use base64::Engine;
use ring::hmac;
use serde_json::Value;

/// Unpadded URL-safe base64, as JWTs use.
const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::URL_SAFE_NO_PAD;

/// Default of `Tenant.spec.maxInflightRequests`.
pub const DEFAULT_TENANT_INFLIGHT: usize = 64;
/// Requests the admin may have in flight at once (Kubernetes' default max-requests-inflight
/// plus its mutating share).
pub const ADMIN_INFLIGHT: usize = 600;

/// An authenticated caller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum User {
    /// The admin token: everything.
    Admin,
    /// A tenant's token.
    Tenant(String),
    /// A control-plane component in the API server's process (scheduler, controllers, node
    /// agents): the admin's rights, with seats of its own so that one component's burst
    /// never takes another's (or the admin's) seats.
    System(String),
    /// A node lent by another shard, acting through the credential the federation brokered
    /// for its loan ([`mint_loan_token`]): good while this shard's loan ledger
    /// (`kube-system/tessera-loans`) still names this loan for this node.
    LentNode {
        /// The node's name.
        node: String,
        /// The loan's id.
        loan: String,
    },
    /// A person or tool named by a user token (`tessera token create --user`): RBAC decides
    /// what it may do; one minted for a tenant never leaves the tenant's namespaces.
    Named {
        /// The user name RBAC subjects of kind `User` name.
        name: String,
        /// The groups the token names (RBAC subjects of kind `Group`), without the implied
        /// ones ([`User::groups`] adds them).
        groups: Vec<String>,
        /// The tenant whose namespaces bound the user, if any.
        tenant: Option<String>,
    },
    /// A ServiceAccount, by a token this API server issued (`serviceaccounts/token`, what
    /// `kubectl create token` asks for). Good while the account (and the object the token is
    /// bound to, if any) exists with the uid the token names.
    ServiceAccount(Box<ServiceAccountClaims>),
}

/// The group every authenticated caller is in.
pub const AUTHENTICATED_GROUP: &str = "system:authenticated";
/// The group of the admin token and of the shard's own components.
pub const MASTERS_GROUP: &str = "system:masters";
/// The group every tenant's own token is in.
pub const TENANTS_GROUP: &str = "tessera:tenants";
/// The prefix of a ServiceAccount's user name.
pub const SERVICE_ACCOUNT_PREFIX: &str = "system:serviceaccount:";

/// The group of tenant `t`'s callers: its own token and the user tokens minted for it (a
/// RoleBinding naming it grants every one of them).
pub fn tenant_group(t: &str) -> String {
    format!("tessera:tenant:{t}")
}

/// Why a user name or group may not go into a user token, if it may not: names the server
/// gives its own callers (`system:`, `tessera:`, `tenant:`) are reserved.
pub fn reserved_name_problem(name: &str) -> Option<String> {
    if name.is_empty() {
        return Some("is empty".into());
    }
    if name.len() > 253 || name.chars().any(|c| c.is_control()) {
        return Some("must be at most 253 characters, without control characters".into());
    }
    ["system:", "tessera:", "tenant:"]
        .iter()
        .find(|p| name.starts_with(**p))
        .map(|p| format!("starts with {p:?}, which the server reserves for its own callers"))
}

impl User {
    /// The user name: in messages, RBAC subjects and `kubectl auth whoami`.
    pub fn name(&self) -> String {
        match self {
            User::Admin => "admin".into(),
            User::Tenant(t) => format!("tenant:{t}"),
            User::System(c) => format!("system:{c}"),
            User::LentNode { node, .. } => format!("system:node:{node}"),
            User::Named { name, .. } => name.clone(),
            User::ServiceAccount(sa) => sa.user_name(),
        }
    }

    /// Whether the user is one a tenant's limits may apply to (not the admin, a component
    /// or a node): a tenant's token, a user token, a ServiceAccount.
    pub fn is_tenant_side(&self) -> bool {
        matches!(
            self,
            User::Tenant(_) | User::Named { .. } | User::ServiceAccount(_)
        )
    }

    /// Every group the user is in, the implied ones included.
    pub fn groups(&self) -> Vec<String> {
        let mut out = match self {
            User::Admin | User::System(_) => vec![MASTERS_GROUP.to_owned()],
            User::Tenant(t) => vec![TENANTS_GROUP.to_owned(), tenant_group(t)],
            User::LentNode { .. } => vec!["system:nodes".to_owned()],
            User::Named { groups, tenant, .. } => {
                let mut g = groups.clone();
                g.extend(tenant.as_deref().map(tenant_group));
                g
            }
            User::ServiceAccount(sa) => vec![
                "system:serviceaccounts".to_owned(),
                format!("system:serviceaccounts:{}", sa.namespace),
            ],
        };
        out.push(AUTHENTICATED_GROUP.to_owned());
        out
    }

    /// The default field manager of this user's writes.
    pub fn manager(&self) -> String {
        match self {
            User::Admin => "tessera-admin".into(),
            User::Tenant(t) => format!("tenant-{t}"),
            User::System(c) => c.clone(),
            User::LentNode { .. } => "tessera-node-agent".into(),
            User::Named { name, .. } => name.clone(),
            User::ServiceAccount(sa) => sa.user_name(),
        }
    }

    /// The fairness key: requests of one key share its seats. A tenant's users share the
    /// tenant's; a namespace's ServiceAccounts share one key.
    pub fn fairness_key(&self) -> String {
        match self {
            User::Named {
                tenant: Some(t), ..
            } => format!("tenant:{t}"),
            User::ServiceAccount(sa) => format!("serviceaccounts:{}", sa.namespace),
            _ => self.name(),
        }
    }
}

/// What a ServiceAccount token says: the account, what the token is bound to, its audiences
/// and its life. Signed by the API server's service-account key; see
/// [`Tokens::mint_service_account`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceAccountClaims {
    /// The account's namespace.
    pub namespace: String,
    /// The account's name.
    pub name: String,
    /// The account's uid when the token was issued.
    pub uid: String,
    /// The object the token is bound to (`Pod` or `Secret`): kind, name, uid.
    pub bound: Option<(String, String, String)>,
    /// Who the token is for (`aud`).
    pub audiences: Vec<String>,
    /// Seconds since the epoch: issued at, and expires at.
    pub issued: i64,
    /// Seconds since the epoch after which the token is refused.
    pub expires: i64,
    /// The token's id (`jti`).
    pub id: String,
}

impl ServiceAccountClaims {
    /// `system:serviceaccount:<namespace>:<name>`.
    pub fn user_name(&self) -> String {
        format!("{SERVICE_ACCOUNT_PREFIX}{}:{}", self.namespace, self.name)
    }
}

/// The issuer of this API's ServiceAccount tokens, and the audience the API server accepts
/// (kubeadm's default `--service-account-issuer`).
pub const SERVICE_ACCOUNT_ISSUER: &str = "https://kubernetes.default.svc.cluster.local";

/// What a user token says: who, in which groups, within which tenant, until when.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct UserClaims {
    /// The user name.
    #[serde(rename = "sub")]
    pub name: String,
    /// The groups (none reserved: see [`reserved_name_problem`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<String>,
    /// The tenant that bounds the user, as it was when the token was minted (a re-created
    /// Tenant or a bumped `spec.tokenGeneration` revokes the token, as it does the tenant's
    /// own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<UserTenant>,
    /// Seconds since the epoch after which the token is refused.
    #[serde(rename = "exp")]
    pub expires: i64,
}

/// The tenant part of [`UserClaims`].
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct UserTenant {
    /// The Tenant's name.
    pub name: String,
    /// Its uid.
    pub uid: String,
    /// Its `spec.tokenGeneration`.
    pub generation: i64,
}

/// The longest a node credential may live: the agent refuses one that claims more.
pub const NODE_CREDENTIAL_MAX_SECONDS: i64 = 120;

/// The longest a tenant token may live (`tessera token create --ttl`).
pub const TENANT_TOKEN_MAX_SECONDS: i64 = 366 * 24 * 3600;

/// What a tenant token says about its Tenant, checked against the Tenant object on every
/// request ([`crate::api::Api::tenant_token_current`]): a re-created Tenant (another uid) or
/// a bumped `spec.tokenGeneration` revokes every token minted before.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TenantClaims {
    /// The Tenant's name.
    pub name: String,
    /// Its `metadata.uid` when the token was minted.
    pub uid: String,
    /// Its `spec.tokenGeneration` then.
    pub generation: i64,
    /// Seconds since the epoch after which the token is refused.
    pub expires: i64,
}

impl TenantClaims {
    /// The claims of a token for Tenant object `tenant`, good until `expires`.
    pub fn of(tenant: &Value, expires: i64) -> TenantClaims {
        TenantClaims {
            name: tenant["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            uid: tenant["metadata"]["uid"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            generation: tenant["spec"]["tokenGeneration"].as_i64().unwrap_or(0),
            expires,
        }
    }

    /// Whether Tenant object `tenant` is still the one these claims were minted for (same
    /// uid, same `spec.tokenGeneration`).
    pub fn still_hold(&self, tenant: &Value) -> bool {
        let now = TenantClaims::of(tenant, self.expires);
        now.uid == self.uid && now.generation == self.generation && now.name == self.name
    }
}

/// Checks bearer tokens. Three keys, each for one purpose: the admin token (a bearer
/// credential, never a signing key), the tenant-token key (derived from the root key in
/// `pki/token.key`, so rotating the admin token leaves tenant tokens valid) and the
/// node-credential key (derived from the admin token, which every node agent holds).
#[derive(Clone)]
pub struct Tokens {
    admin: String,
    tenant_key: hmac::Key,
    user_key: hmac::Key,
    service_account_key: hmac::Key,
    node_key: hmac::Key,
    loan_key: hmac::Key,
    loan_secret: [u8; 32],
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tokens(<redacted>)")
    }
}

/// A key for one purpose, derived from `secret`: HMAC-SHA256(secret, purpose).
fn derive(secret: &[u8], purpose: &str) -> hmac::Key {
    let tag = hmac::sign(
        &hmac::Key::new(hmac::HMAC_SHA256, secret),
        purpose.as_bytes(),
    );
    hmac::Key::new(hmac::HMAC_SHA256, tag.as_ref())
}

impl Tokens {
    /// Tokens for a server whose tenant tokens are keyed by the admin token itself (node
    /// agents, which check node credentials only; tests).
    pub fn new(admin_token: &str) -> Tokens {
        Tokens::with_root(admin_token, admin_token.as_bytes())
    }

    /// Tokens with tenant tokens keyed from `root` (the API server's `pki/token.key`).
    pub fn with_root(admin_token: &str, root: &[u8]) -> Tokens {
        let loan_secret = loan_secret(admin_token);
        Tokens {
            admin: admin_token.to_owned(),
            tenant_key: derive(root, "tessera/tenant-tokens/v1"),
            user_key: derive(root, "tessera/user-tokens/v1"),
            service_account_key: derive(root, "tessera/service-account-tokens/v1"),
            node_key: derive(admin_token.as_bytes(), "tessera/node-credentials/v1"),
            loan_key: hmac::Key::new(hmac::HMAC_SHA256, &loan_secret),
            loan_secret,
        }
    }

    /// The key this shard's lent-node credentials are signed with, hex-encoded: its
    /// federation agent hands it to the federation, which brokers loans
    /// ([`mint_loan_token`]). It opens nothing by itself: a credential is only good for a
    /// loan this shard's own ledger admits.
    pub fn loan_key_hex(&self) -> String {
        hex(&self.loan_secret)
    }

    fn tenant_message(c: &TenantClaims) -> String {
        format!("tenant/{}/{}/{}/{}", c.name, c.uid, c.generation, c.expires)
    }

    /// A token for the Tenant `claims` describe:
    /// `tenant.<name>.<uid>.<generation>.<expires>.<HMAC-SHA256>`.
    pub fn mint(&self, claims: &TenantClaims) -> String {
        let tag = hmac::sign(&self.tenant_key, Self::tenant_message(claims).as_bytes());
        format!(
            "tenant.{}.{}.{}.{}.{}",
            claims.name,
            claims.uid,
            claims.generation,
            claims.expires,
            hex(tag.as_ref())
        )
    }

    fn node_message(node: &str, expires: i64, method: &str, path: &str) -> String {
        format!("node/{node}/{expires}/{method} {path}")
    }

    /// A credential the API server presents to node `node`'s agent for one request
    /// (`method` and `path` with its query: the pod and container it asks for), good until
    /// `expires` (seconds since the epoch, at most [`NODE_CREDENTIAL_MAX_SECONDS`] ahead):
    /// `node.<node>.<expires>.<HMAC-SHA256>`. One seen on the wire opens no other request,
    /// node or API call ([`Tokens::authenticate`] refuses it).
    pub fn node_token(&self, node: &str, expires: i64, method: &str, path: &str) -> String {
        let tag = hmac::sign(
            &self.node_key,
            Self::node_message(node, expires, method, path).as_bytes(),
        );
        format!("node.{node}.{expires}.{}", hex(tag.as_ref()))
    }

    /// Whether `token` is a [`Tokens::node_token`] for this very request to `node` that has
    /// not lapsed at `now` and claims no longer life than the cap.
    pub fn check_node_token(
        &self,
        token: &str,
        node: &str,
        now: i64,
        method: &str,
        path: &str,
    ) -> bool {
        let Some(rest) = token.strip_prefix("node.") else {
            return false;
        };
        let Some((signed, hex)) = rest.rsplit_once('.') else {
            return false;
        };
        let Some((name, expires)) = signed.rsplit_once('.') else {
            return false;
        };
        let Ok(expires) = expires.parse::<i64>() else {
            return false;
        };
        let Some(tag) = unhex(hex) else {
            return false;
        };
        name == node
            && expires >= now
            && expires - now <= NODE_CREDENTIAL_MAX_SECONDS
            && hmac::verify(
                &self.node_key,
                Self::node_message(name, expires, method, path).as_bytes(),
                &tag,
            )
            .is_ok()
    }

    /// Who a bearer token belongs to at `now`: the admin, or a tenant (with what its token
    /// claims, for the caller to check against the Tenant). A tenant token past its expiry,
    /// or signed with another key, is nobody's.
    pub fn authenticate(&self, token: &str, now: i64) -> Option<(User, Option<TenantClaims>)> {
        if constant_time_eq(token.as_bytes(), self.admin.as_bytes()) {
            return Some((User::Admin, None));
        }
        if let Some(rest) = token.strip_prefix("loan.") {
            return self.authenticate_loan(rest, now).map(|u| (u, None));
        }
        if let Some(rest) = token.strip_prefix("user.") {
            return self.authenticate_user(rest, now);
        }
        if token.starts_with("eyJ") {
            return self
                .check_service_account(token, now)
                .map(|c| (User::ServiceAccount(Box::new(c)), None));
        }
        let rest = token.strip_prefix("tenant.")?;
        // Names may hold dots; the other fields may not: read from the right.
        let (rest, hex) = rest.rsplit_once('.')?;
        let (rest, expires) = rest.rsplit_once('.')?;
        let (rest, generation) = rest.rsplit_once('.')?;
        let (name, uid) = rest.rsplit_once('.')?;
        let claims = TenantClaims {
            name: name.to_owned(),
            uid: uid.to_owned(),
            generation: generation.parse().ok()?,
            expires: expires.parse().ok()?,
        };
        let tag = unhex(hex)?;
        hmac::verify(
            &self.tenant_key,
            Self::tenant_message(&claims).as_bytes(),
            &tag,
        )
        .ok()?;
        if claims.expires < now {
            return None;
        }
        Some((User::Tenant(claims.name.clone()), Some(claims)))
    }
}

impl Tokens {
    /// A user token: `user.<base64url of the claims' JSON>.<HMAC-SHA256 hex>`.
    pub fn mint_user(&self, claims: &UserClaims) -> String {
        let body = B64.encode(serde_json::to_vec(claims).unwrap_or_default());
        let tag = hmac::sign(&self.user_key, body.as_bytes());
        format!("user.{body}.{}", hex(tag.as_ref()))
    }

    fn authenticate_user(&self, rest: &str, now: i64) -> Option<(User, Option<TenantClaims>)> {
        let (body, tag) = rest.rsplit_once('.')?;
        hmac::verify(&self.user_key, body.as_bytes(), &unhex(tag)?).ok()?;
        let claims: UserClaims = serde_json::from_slice(&B64.decode(body).ok()?).ok()?;
        if claims.expires < now
            || reserved_name_problem(&claims.name).is_some()
            || claims
                .groups
                .iter()
                .any(|g| reserved_name_problem(g).is_some())
        {
            return None;
        }
        let tenant = claims.tenant.as_ref().map(|t| TenantClaims {
            name: t.name.clone(),
            uid: t.uid.clone(),
            generation: t.generation,
            expires: claims.expires,
        });
        Some((
            User::Named {
                name: claims.name,
                groups: claims.groups,
                tenant: tenant.as_ref().map(|t| t.name.clone()),
            },
            tenant,
        ))
    }

    /// A ServiceAccount token: a JWT (HS256, signed with a key derived from the root key)
    /// with Kubernetes' claims (`iss`, `sub`, `aud`, `exp`, `iat`, `nbf`, `jti` and
    /// `kubernetes.io` naming the account and the object it is bound to).
    pub fn mint_service_account(&self, c: &ServiceAccountClaims) -> String {
        let header = serde_json::json!({"alg": "HS256", "typ": "JWT", "kid": "tessera-sa-v1"});
        let mut k8s = serde_json::json!({
            "namespace": c.namespace,
            "serviceaccount": {"name": c.name, "uid": c.uid},
        });
        if let Some((kind, name, uid)) = &c.bound {
            k8s[kind.to_lowercase()] = serde_json::json!({"name": name, "uid": uid});
        }
        let claims = serde_json::json!({
            "iss": SERVICE_ACCOUNT_ISSUER,
            "sub": c.user_name(),
            "aud": c.audiences,
            "iat": c.issued,
            "nbf": c.issued,
            "exp": c.expires,
            "jti": c.id,
            "kubernetes.io": k8s,
        });
        let signed = format!(
            "{}.{}",
            B64.encode(header.to_string()),
            B64.encode(claims.to_string())
        );
        let tag = hmac::sign(&self.service_account_key, signed.as_bytes());
        format!("{signed}.{}", B64.encode(tag.as_ref()))
    }

    /// The claims of a ServiceAccount token this server signed, if it is for this API
    /// ([`SERVICE_ACCOUNT_ISSUER`] among its audiences) and good at `now`.
    pub fn check_service_account(&self, token: &str, now: i64) -> Option<ServiceAccountClaims> {
        self.check_service_account_for(token, now, &[SERVICE_ACCOUNT_ISSUER])
    }

    /// [`Self::check_service_account`] for a token that must have been issued for one of
    /// `wanted` (a TokenReview's audiences), not necessarily for this API.
    pub fn check_service_account_for(
        &self,
        token: &str,
        now: i64,
        wanted: &[impl AsRef<str>],
    ) -> Option<ServiceAccountClaims> {
        let (signed, tag) = token.rsplit_once('.')?;
        hmac::verify(
            &self.service_account_key,
            signed.as_bytes(),
            &B64.decode(tag).ok()?,
        )
        .ok()?;
        let (_, body) = signed.split_once('.')?;
        let v: Value = serde_json::from_slice(&B64.decode(body).ok()?).ok()?;
        let k8s = &v["kubernetes.io"];
        let s = |x: &Value| x.as_str().map(str::to_owned);
        let audiences: Vec<String> = v["aud"]
            .as_array()?
            .iter()
            .filter_map(|a| a.as_str().map(str::to_owned))
            .collect();
        let c = ServiceAccountClaims {
            namespace: s(&k8s["namespace"])?,
            name: s(&k8s["serviceaccount"]["name"])?,
            uid: s(&k8s["serviceaccount"]["uid"])?,
            bound: ["Pod", "Secret"].iter().find_map(|kind| {
                let o = &k8s[kind.to_lowercase()];
                Some(((*kind).to_owned(), s(&o["name"])?, s(&o["uid"])?))
            }),
            audiences,
            issued: v["iat"].as_i64()?,
            expires: v["exp"].as_i64()?,
            id: s(&v["jti"]).unwrap_or_default(),
        };
        let for_us = c
            .audiences
            .iter()
            .any(|a| wanted.iter().any(|w| AsRef::<str>::as_ref(w) == a.as_str()));
        (v["iss"] == SERVICE_ACCOUNT_ISSUER
            && for_us
            && c.expires >= now
            && v["nbf"].as_i64()? <= now + 60)
            .then_some(c)
    }

    fn authenticate_loan(&self, rest: &str, now: i64) -> Option<User> {
        let (node, loan, expires, tag) = parse_loan(rest)?;
        hmac::verify(
            &self.loan_key,
            loan_message(node, loan, expires).as_bytes(),
            &tag,
        )
        .ok()?;
        (expires >= now).then(|| User::LentNode {
            node: node.to_owned(),
            loan: loan.to_owned(),
        })
    }
}

/// The longest a lent node's credential may live; the federation brokers a new one before.
pub const LOAN_TOKEN_MAX_SECONDS: i64 = 7 * 24 * 3600;

fn loan_secret(admin_token: &str) -> [u8; 32] {
    let tag = hmac::sign(
        &hmac::Key::new(hmac::HMAC_SHA256, admin_token.as_bytes()),
        b"tessera/loan-credentials/v1",
    );
    let mut out = [0u8; 32];
    out.copy_from_slice(tag.as_ref());
    out
}

fn loan_message(node: &str, loan: &str, expires: i64) -> String {
    format!("loan/{node}/{loan}/{expires}")
}

/// `node.loan.expires.hex` read from the right (node names may hold dots, the rest may not).
fn parse_loan(rest: &str) -> Option<(&str, &str, i64, Vec<u8>)> {
    let (rest, hex) = rest.rsplit_once('.')?;
    let (rest, expires) = rest.rsplit_once('.')?;
    let (node, loan) = rest.rsplit_once('.')?;
    if node.is_empty() || loan.is_empty() {
        return None;
    }
    Some((node, loan, expires.parse().ok()?, unhex(hex)?))
}

/// A credential for node `node` to act in the borrowing shard for loan `loan` until
/// `expires`: `loan.<node>.<loan>.<expires>.<HMAC-SHA256>`, signed with the borrower's
/// [`Tokens::loan_key_hex`]. `None` if the key is not 64 hex digits or the loan id holds a
/// dot.
pub fn mint_loan_token(key_hex: &str, node: &str, loan: &str, expires: i64) -> Option<String> {
    let key = unhex(key_hex)?;
    if loan.contains('.') || loan.is_empty() || node.is_empty() {
        return None;
    }
    let tag = hmac::sign(
        &hmac::Key::new(hmac::HMAC_SHA256, &key),
        loan_message(node, loan, expires).as_bytes(),
    );
    Some(format!(
        "loan.{node}.{loan}.{expires}.{}",
        hex(tag.as_ref())
    ))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A 32-byte HMAC tag from its 64 hex digits.
fn unhex(hex: &str) -> Option<Vec<u8>> {
    if hex.len() != 64 {
        return None;
    }
    (0..32)
        .map(|i| u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok())
        .collect()
}

/// Whether `a == b`, in a time that depends on their lengths only (for secrets).
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claims(name: &str, expires: i64) -> TenantClaims {
        TenantClaims {
            name: name.into(),
            uid: "5d1c-9f".into(),
            generation: 0,
            expires,
        }
    }

    #[test]
    fn loan_tokens_are_bound_to_their_node_loan_expiry_and_shard() {
        let t = Tokens::new("borrower-admin");
        let key = t.loan_key_hex();
        let token = mint_loan_token(&key, "a-node-3.zone", "l7f3", 2_000).expect("minted");
        assert_eq!(
            t.authenticate(&token, 1_000),
            Some((
                User::LentNode {
                    node: "a-node-3.zone".into(),
                    loan: "l7f3".into()
                },
                None
            ))
        );
        assert_eq!(t.authenticate(&token, 2_001), None, "expired");
        for forged in [
            token.replace("a-node-3.zone.", "a-node-4.zone."),
            token.replace(".l7f3.", ".l7f4."),
            token.replace(".2000.", ".9999."),
        ] {
            assert_ne!(forged, token);
            assert_eq!(t.authenticate(&forged, 1_000), None, "{forged}");
        }
        // Another shard's key, or the admin token's other keys, do not sign it.
        assert_eq!(
            Tokens::new("lender-admin").authenticate(&token, 1_000),
            None
        );
        assert_ne!(key, Tokens::new("lender-admin").loan_key_hex());
        assert_eq!(mint_loan_token("zz", "n", "l", 1), None);
        assert_eq!(mint_loan_token(&key, "n", "l.1", 1), None);
        for junk in ["loan.", "loan.n.l.5", "loan..l.5.00", "loan.n..5.00"] {
            assert_eq!(t.authenticate(junk, 0), None, "{junk}");
        }
    }

    #[test]
    fn tenant_tokens_are_bound_to_their_claims_and_key() {
        let t = Tokens::with_root("secret-admin", b"root-key");
        let c = claims("acme.example", 2_000);
        let token = t.mint(&c);
        assert_eq!(
            t.authenticate(&token, 1_000),
            Some((User::Tenant("acme.example".into()), Some(c.clone())))
        );
        assert_eq!(t.authenticate("secret-admin", 0), Some((User::Admin, None)));
        // Expired; another name, uid, generation or expiry under the same signature; a
        // flipped bit; another root key: refused.
        assert_eq!(t.authenticate(&token, 2_001), None);
        for forged in [
            token.replace("tenant.acme.example.", "tenant.other."),
            token.replace(".5d1c-9f.", ".0000-00."),
            token.replace(".0.2000.", ".1.2000."),
            token.replace(".2000.", ".9999."),
        ] {
            assert_ne!(forged, token);
            assert_eq!(t.authenticate(&forged, 1_000), None, "{forged}");
        }
        let mut flipped = token.clone().into_bytes();
        let last = flipped.len() - 1;
        flipped[last] = if flipped[last] == b'0' { b'1' } else { b'0' };
        assert_eq!(
            t.authenticate(&String::from_utf8(flipped).expect("ascii"), 1_000),
            None
        );
        assert_eq!(
            Tokens::with_root("secret-admin", b"other-root").authenticate(&token, 1_000),
            None
        );
        // A new admin token leaves tenant tokens valid (they hang on the root key).
        assert!(
            Tokens::with_root("rotated-admin", b"root-key")
                .authenticate(&token, 1_000)
                .is_some()
        );
        for junk in [
            "",
            "tenant.",
            "tenant.a.zz",
            "tenant.a.b.c.d.",
            "secret-admi",
        ] {
            assert_eq!(t.authenticate(junk, 0), None, "{junk}");
        }
    }

    #[test]
    fn node_tokens_name_one_request_and_lapse() {
        let t = Tokens::with_root("secret-admin", b"root-key");
        let path = "/containerLogs/ns/p/c?podUID=u";
        let token = t.node_token("proc-0", 1_000, "GET", path);
        let ok = |tok: &str, node: &str, now: i64, method: &str, p: &str| {
            t.check_node_token(tok, node, now, method, p)
        };
        assert!(ok(&token, "proc-0", 999, "GET", path));
        assert!(ok(&token, "proc-0", 1_000, "GET", path));
        // Lapsed, another node, request, pod or server, a longer life claimed: refused.
        assert!(!ok(&token, "proc-0", 1_001, "GET", path));
        assert!(!ok(&token, "proc-1", 999, "GET", path));
        assert!(!ok(&token, "proc-0", 999, "POST", path));
        assert!(!ok(
            &token,
            "proc-0",
            999,
            "GET",
            "/containerLogs/ns/q/c?podUID=u"
        ));
        assert!(!Tokens::new("another-admin").check_node_token(&token, "proc-0", 999, "GET", path));
        let extended = token.replace(".1000.", ".9000.");
        assert!(!ok(&extended, "proc-0", 999, "GET", path));
        // Validly signed but claiming more than the cap (a long-lived forgery by a server
        // that holds the key is still refused).
        let long = t.node_token(
            "proc-0",
            1_000 + NODE_CREDENTIAL_MAX_SECONDS + 1,
            "GET",
            path,
        );
        assert!(!ok(&long, "proc-0", 1_000, "GET", path));
        // Not an API credential, and no API credential opens a node.
        assert_eq!(t.authenticate(&token, 0), None);
        assert!(!ok("secret-admin", "proc-0", 0, "GET", path));
        assert!(!ok(&t.mint(&claims("proc-0", 5)), "proc-0", 0, "GET", path));
        // The tenant and node keys differ: the same message signs differently.
        let n = Tokens::new("k");
        assert_ne!(
            n.mint(&claims("x", 1)).rsplit('.').next(),
            n.node_token("x", 1, "GET", "/").rsplit('.').next()
        );
    }
}
