//! Who is asking, and what they may do.
//!
//! Two kinds of bearer token: the admin token that `tessera up` generates (in the data
//! directory's `pki/`, and in the kubeconfig), and tenant tokens,
//! `tenant.<name>.<HMAC-SHA256 of the name keyed by the admin token>`, minted by
//! `tessera token create --tenant NAME`. Tenant tokens need no state on the server; rotating
//! the admin token revokes them all.
//!
//! A tenant's token may touch only the namespaces its `Tenant` object lists (and read nodes,
//! priority classes and its own Tenant). Lists of namespaces are filtered to its own. Every
//! refusal is a 403 that says which rule refused it, and never whether another tenant's
//! object exists.

use std::sync::Arc;

use ring::hmac;
use serde_json::Value;
use tessera_store::Store;

use crate::request::{ApiRequest, Verb};
use crate::status::ApiError;

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
}

impl User {
    /// The name used in messages and as the default field manager.
    pub fn name(&self) -> String {
        match self {
            User::Admin => "admin".into(),
            User::Tenant(t) => format!("tenant:{t}"),
            User::System(c) => format!("system:{c}"),
        }
    }

    /// The default field manager of this user's writes.
    pub fn manager(&self) -> String {
        match self {
            User::Admin => "tessera-admin".into(),
            User::Tenant(t) => format!("tenant-{t}"),
            User::System(c) => c.clone(),
        }
    }

    /// The fairness key: requests of one key share its seats.
    pub fn fairness_key(&self) -> String {
        self.name()
    }
}

/// Checks bearer tokens.
#[derive(Clone)]
pub struct Tokens {
    admin: String,
    key: hmac::Key,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tokens(<redacted>)")
    }
}

impl Tokens {
    /// Tokens rooted in the admin token.
    pub fn new(admin_token: &str) -> Tokens {
        Tokens {
            admin: admin_token.to_owned(),
            key: hmac::Key::new(hmac::HMAC_SHA256, admin_token.as_bytes()),
        }
    }

    /// A token for tenant `name`.
    pub fn mint(&self, tenant: &str) -> String {
        let tag = hmac::sign(&self.key, tenant.as_bytes());
        format!("tenant.{tenant}.{}", hex(tag.as_ref()))
    }

    /// A credential the API server presents to node `node`'s agent when it proxies a request
    /// to it (`pods/log`), good until `expires` (seconds since the epoch):
    /// `node.<node>.<expires>.<HMAC-SHA256 of "node/<node>/<expires>">`. It names one node and
    /// lapses soon, so one seen on the wire opens no other node and no API request
    /// ([`Tokens::authenticate`] refuses it).
    pub fn node_token(&self, node: &str, expires: i64) -> String {
        let tag = hmac::sign(&self.key, format!("node/{node}/{expires}").as_bytes());
        format!("node.{node}.{expires}.{}", hex(tag.as_ref()))
    }

    /// Whether `token` is a [`Tokens::node_token`] for `node` that has not lapsed at `now`.
    pub fn check_node_token(&self, token: &str, node: &str, now: i64) -> bool {
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
            && hmac::verify(&self.key, format!("node/{name}/{expires}").as_bytes(), &tag).is_ok()
    }

    /// Who a bearer token belongs to.
    pub fn authenticate(&self, token: &str) -> Option<User> {
        if constant_time_eq(token.as_bytes(), self.admin.as_bytes()) {
            return Some(User::Admin);
        }
        let rest = token.strip_prefix("tenant.")?;
        let (name, hex) = rest.rsplit_once('.')?;
        let tag = unhex(hex)?;
        hmac::verify(&self.key, name.as_bytes(), &tag).ok()?;
        Some(User::Tenant(name.to_owned()))
    }
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

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// What an authorized request may see.
#[derive(Clone, Debug)]
pub struct Scope {
    /// For a tenant listing or watching namespaces: the names it may see.
    pub namespaces: Option<Vec<String>>,
    /// Seats for the caller's requests.
    pub max_inflight: usize,
}

/// Decides what tenants may do, from their `Tenant` objects.
#[derive(Clone)]
pub struct Authorizer {
    store: Arc<dyn Store>,
}

fn forbidden(user: &User, req: &ApiRequest, why: &str) -> ApiError {
    let res = req.resource;
    let what = match &req.subresource {
        Some(s) => format!("{}/{s}", res.plural),
        None => res.plural.to_owned(),
    };
    let place = match (&req.namespace, res.namespaced) {
        (Some(ns), _) => format!(" in the namespace \"{ns}\""),
        (None, true) => " at the cluster scope".to_owned(),
        (None, false) => " at the cluster scope".to_owned(),
    };
    let mut e = ApiError::forbidden(format!(
        "{what}{} is forbidden: User \"{}\" cannot {} resource \"{what}\" in API group \"{}\"{place}: {why}",
        req.name
            .as_deref()
            .map(|n| format!(" \"{n}\""))
            .unwrap_or_default(),
        user.name(),
        req.verb.as_str(),
        res.group,
    ));
    e.details = Some(serde_json::json!({"group": res.group, "kind": res.plural}));
    e
}

impl Authorizer {
    /// An authorizer reading Tenants from `store`.
    pub fn new(store: Arc<dyn Store>) -> Authorizer {
        Authorizer { store }
    }

    async fn tenant(&self, name: &str) -> Result<Option<Value>, ApiError> {
        let key = tessera_core::keys::object_key(
            &tessera_core::keys::resource_segment("tessera.io", "tenants"),
            None,
            name,
        );
        let kv = self
            .store
            .get(key.as_bytes())
            .await
            .map_err(|e| ApiError::internal(format!("reading tenant {name}: {e}")))?;
        Ok(kv.and_then(|kv| serde_json::from_slice(&kv.value).ok()))
    }

    /// Allows or refuses `req` for `user`.
    pub async fn authorize(&self, user: &User, req: &ApiRequest) -> Result<Scope, ApiError> {
        let tenant = match user {
            User::Admin | User::System(_) => {
                return Ok(Scope {
                    namespaces: None,
                    max_inflight: ADMIN_INFLIGHT,
                });
            }
            User::Tenant(t) => t,
        };
        let Some(obj) = self.tenant(tenant).await? else {
            return Err(forbidden(
                user,
                req,
                &format!("tenant {tenant:?} does not exist: ask an admin to create it"),
            ));
        };
        let owned: Vec<String> = obj["spec"]["namespaces"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|n| n.as_str().map(str::to_owned))
            .collect();
        let max_inflight = obj["spec"]["maxInflightRequests"]
            .as_u64()
            .map_or(DEFAULT_TENANT_INFLIGHT, |n| n.max(1) as usize);
        let scope = |namespaces| Scope {
            namespaces,
            max_inflight,
        };
        let res = req.resource;
        let read = matches!(req.verb, Verb::Get | Verb::List | Verb::Watch);
        let not_theirs = |ns: &str| {
            forbidden(
                user,
                req,
                &format!("\"{ns}\" is not one of tenant {tenant}'s namespaces"),
            )
        };
        if res.namespaced {
            // What the shard's components and admins own inside a tenant's namespace: quotas
            // and limits an admin set (deleting them would lift the limit), and pods' status
            // (a pod reported finished gives its quota back while it still runs).
            let admins_only = match (res.group, res.plural, req.subresource.as_deref()) {
                ("", "resourcequotas" | "limitranges", _) => Some("only an admin may change it"),
                ("", "pods", Some("status")) => {
                    Some("only node agents and the shard's components write a pod's status")
                }
                _ => None,
            };
            if let (Some(why), false) = (admins_only, read) {
                return Err(forbidden(user, req, why));
            }
            return match req.namespace.as_deref() {
                Some(ns) if owned.iter().any(|o| o == ns) => Ok(scope(None)),
                Some(ns) => Err(not_theirs(ns)),
                None => Err(forbidden(
                    user,
                    req,
                    &format!(
                        "tenant tokens work within the tenant's namespaces: pass -n <namespace> (tenant {tenant} owns: {})",
                        if owned.is_empty() {
                            "none".to_owned()
                        } else {
                            owned.join(", ")
                        }
                    ),
                )),
            };
        }
        match (res.group, res.plural) {
            ("", "namespaces") => {
                let name = match (&req.name, req.verb) {
                    (Some(n), _) => Some(n.clone()),
                    (None, Verb::Create) => serde_json::from_slice::<Value>(&req.body)
                        .ok()
                        .and_then(|b| b["metadata"]["name"].as_str().map(str::to_owned)),
                    _ => None,
                };
                match (name, req.verb) {
                    (Some(n), _) if owned.contains(&n) => Ok(scope(None)),
                    (Some(n), _) => Err(not_theirs(&n)),
                    (None, Verb::List | Verb::Watch) => Ok(scope(Some(owned))),
                    (None, _) => Err(forbidden(
                        user,
                        req,
                        "tenants may not act on every namespace at once",
                    )),
                }
            }
            ("", "nodes") | ("scheduling.k8s.io", "priorityclasses") if read => Ok(scope(None)),
            ("tessera.io", "tenants") if read && req.name.as_deref() == Some(tenant) => {
                Ok(scope(None))
            }
            _ => Err(forbidden(
                user,
                req,
                if read {
                    "tenants may read only nodes, priority classes and their own Tenant at the cluster scope"
                } else {
                    "tenants may not change cluster-scoped objects other than their own namespaces"
                },
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenant_tokens_are_bound_to_the_name_and_the_admin_token() {
        let t = Tokens::new("secret-admin");
        let token = t.mint("acme");
        assert_eq!(t.authenticate(&token), Some(User::Tenant("acme".into())));
        assert_eq!(t.authenticate("secret-admin"), Some(User::Admin));
        // Another name with acme's signature, a flipped bit, another server: refused.
        let forged = token.replace("tenant.acme.", "tenant.other.");
        assert_eq!(t.authenticate(&forged), None);
        let mut flipped = token.clone().into_bytes();
        let last = flipped.len() - 1;
        flipped[last] = if flipped[last] == b'0' { b'1' } else { b'0' };
        assert_eq!(
            t.authenticate(&String::from_utf8(flipped).expect("ascii")),
            None
        );
        assert_eq!(Tokens::new("another-admin").authenticate(&token), None);
        for junk in ["", "tenant.", "tenant.a.zz", "tenant.a.", "secret-admi"] {
            assert_eq!(t.authenticate(junk), None, "{junk}");
        }
    }

    #[test]
    fn node_tokens_name_one_node_and_lapse() {
        let t = Tokens::new("secret-admin");
        let token = t.node_token("proc-0", 1_000);
        assert!(t.check_node_token(&token, "proc-0", 999));
        assert!(t.check_node_token(&token, "proc-0", 1_000));
        // Lapsed, another node, another server, a longer life claimed: refused.
        assert!(!t.check_node_token(&token, "proc-0", 1_001));
        assert!(!t.check_node_token(&token, "proc-1", 999));
        assert!(!Tokens::new("another-admin").check_node_token(&token, "proc-0", 999));
        let extended = token.replace(".1000.", ".9000.");
        assert!(!t.check_node_token(&extended, "proc-0", 999));
        // Not an API credential, and no API credential opens a node.
        assert_eq!(t.authenticate(&token), None);
        assert!(!t.check_node_token("secret-admin", "proc-0", 0));
        assert!(!t.check_node_token(&t.mint("proc-0"), "proc-0", 0));
    }
}
