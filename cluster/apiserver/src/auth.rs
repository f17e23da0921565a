//! What a caller may do (the token formats and [`User`] are in `tessera_client::auth`, re-exported here).
//!
//! Two kinds of bearer token: the admin token that `tessera up` generates (in the data
//! directory's `pki/`, and in the kubeconfig), and tenant tokens,
//! `tenant.<name>.<uid>.<generation>.<expires>.<HMAC-SHA256>`, minted by
//! `tessera token create --tenant NAME --ttl 24h` with a key derived from `pki/token.key`.
//! Tenant tokens need no state on the server: one expires by itself, and all of a tenant's
//! are revoked by bumping its `spec.tokenGeneration` or re-creating it (its uid changes);
//! replacing `token.key` revokes every tenant's. The admin token rotates on its own.
//!
//! A tenant's token may touch only the namespaces its `Tenant` object lists (and read nodes,
//! priority classes and its own Tenant). Lists of namespaces are filtered to its own. Every
//! refusal is a 403 that says which rule refused it, and never whether another tenant's
//! object exists.

use std::sync::Arc;

use serde_json::Value;
use tessera_store::Store;

pub use tessera_client::auth::*;

use tessera_client::types::{BORROWED_TAINT_KEY, LOAN_LABEL, LOANS_CONFIGMAP};

use crate::metrics::ApiMetrics;
use crate::rbac::{Attributes, Rbac};
use crate::request::{ApiRequest, Verb};
use crate::status::ApiError;

/// What an authorized request may see.
#[derive(Clone, Debug)]
pub struct Scope {
    /// For a tenant listing or watching namespaces: the names it may see.
    pub namespaces: Option<Vec<String>>,
    /// Seats for the caller's requests.
    pub max_inflight: usize,
    /// Watches the caller may hold open at once.
    pub max_watches: usize,
}

/// Watches a tenant may hold open at once when its Tenant does not say (`spec.maxWatches`):
/// four per request seat, at least this many.
pub const MIN_TENANT_WATCHES: usize = 16;

/// Watches the admin and the shard's components may hold (each informer holds one).
pub const ADMIN_WATCHES: usize = 100_000;

/// Request seats of a node lent by another shard (one agent's worth of calls).
pub const LENT_NODE_INFLIGHT: usize = 50;

/// The name of the object `req` acts on: the one in its path, or a create's body's.
fn target_name(req: &ApiRequest) -> Option<String> {
    match (&req.name, req.verb) {
        (Some(n), _) => Some(n.clone()),
        (None, Verb::Create) => req
            .body_value()
            .ok()
            .and_then(|b| b["metadata"]["name"].as_str().map(str::to_owned)),
        _ => None,
    }
}

/// Whether a Node a lent node registers is marked as lent: labelled with its loan and
/// tainted `tessera.io/borrowed:NoSchedule`.
fn lent_node_marked(node: &Value, loan: &str) -> bool {
    node["metadata"]["labels"][LOAN_LABEL].as_str() == Some(loan)
        && node["spec"]["taints"].as_array().is_some_and(|ts| {
            ts.iter()
                .any(|t| t["key"] == BORROWED_TAINT_KEY && t["effect"] == "NoSchedule")
        })
}

/// What only an admin or the shard's components may write in a tenant's namespace, and
/// why, whatever RBAC says: quotas and limits an admin set (deleting them would lift the
/// limit), pods' status (a pod reported finished gives its quota back while it still runs),
/// and bindings to nodes (a binding names any node: a tenant could put its pod where
/// admission would not let it go, a process node).
pub fn tenant_may_not_write(group: &str, plural: &str, sub: Option<&str>) -> Option<&'static str> {
    match (group, plural, sub) {
        ("", "resourcequotas" | "limitranges", _) => Some("only an admin may change it"),
        ("", "pods", Some("status")) => {
            Some("only node agents and the shard's components write a pod's status")
        }
        ("", "pods", Some("binding")) | ("tessera.io", "podgroups", Some("binding")) => {
            Some("only the shard's scheduler binds pods to nodes")
        }
        _ => None,
    }
}

/// Decides what a caller may do: tenant isolation from the `Tenant` objects first (a
/// tenant's callers never leave its namespaces), then RBAC for the callers it governs.
#[derive(Clone)]
pub struct Authorizer {
    store: Arc<dyn Store>,
    rbac: Rbac,
    /// Which tenant owns a namespace, for ServiceAccounts (read at most every second).
    owners: Arc<parking_lot::Mutex<Option<(std::time::Instant, Owners)>>>,
    metrics: Option<ApiMetrics>,
}

/// Each Tenant's name and the namespaces it lists.
type Owners = Vec<(String, Vec<String>)>;

/// Requests in flight, and watches, a caller outside any tenant that RBAC governs may hold.
const RBAC_USER_INFLIGHT: usize = DEFAULT_TENANT_INFLIGHT;

/// The RBAC attributes of a request.
pub fn attributes(req: &ApiRequest) -> Attributes<'_> {
    let name = req.name.as_deref().unwrap_or_default();
    let res = req.resource;
    // As Kubernetes: a Namespace's own requests are made in that namespace, so a RoleBinding
    // there may grant reading it.
    let namespace = if (res.group, res.plural) == ("", "namespaces") {
        name
    } else {
        req.namespace.as_deref().unwrap_or_default()
    };
    Attributes {
        verb: req.verb.as_str(),
        group: res.group,
        resource: res.plural,
        subresource: req.subresource.as_deref().unwrap_or_default(),
        name,
        namespace,
        path: "",
    }
}

/// Kubernetes' refusal of a request RBAC does not grant:
/// `pods "p" is forbidden: User "alice" cannot delete resource "pods" in API group "" in the
/// namespace "t1"`, and the reason RBAC gave, if any.
pub fn rbac_forbidden(user: &User, req: &ApiRequest, reason: &str) -> ApiError {
    let mut e = forbidden(user, req, reason);
    if reason.is_empty() {
        e.message = e.message.trim_end_matches(": ").to_owned();
    }
    e
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
    /// An authorizer reading Tenants and RBAC objects from `store`, counting its decisions
    /// in `metrics`.
    pub fn new(store: Arc<dyn Store>, metrics: Option<ApiMetrics>) -> Authorizer {
        Authorizer {
            rbac: Rbac::new(store.clone(), metrics.clone()),
            store,
            owners: Arc::default(),
            metrics,
        }
    }

    fn count(&self, authorizer: &str, allowed: bool) {
        if let Some(m) = &self.metrics {
            let decision = if allowed { "allow" } else { "deny" };
            m.decisions.with_label_values(&[authorizer, decision]).inc();
        }
    }

    /// The RBAC evaluator.
    pub fn rbac(&self) -> &Rbac {
        &self.rbac
    }

    /// Forgets which tenant owns which namespace (a Tenant was written).
    pub fn tenants_changed(&self) {
        *self.owners.lock() = None;
    }

    /// The tenant that owns namespace `ns`, if any.
    pub async fn tenant_owning(&self, ns: &str) -> Result<Option<String>, ApiError> {
        let find = |list: &[(String, Vec<String>)]| {
            list.iter()
                .find(|(_, owned)| owned.iter().any(|o| o == ns))
                .map(|(t, _)| t.clone())
        };
        if let Some((at, list)) = self.owners.lock().as_ref()
            && at.elapsed() < std::time::Duration::from_secs(1)
        {
            return Ok(find(list));
        }
        let prefix = tessera_core::keys::resource_prefix(
            &tessera_core::keys::resource_segment("tessera.io", "tenants"),
            None,
        );
        let page = self
            .store
            .list(tessera_store::ListRequest {
                prefix: prefix.into_bytes().into(),
                ..Default::default()
            })
            .await
            .map_err(|e| ApiError::internal(format!("reading Tenants: {e}")))?;
        let list: Vec<(String, Vec<String>)> = page
            .kvs
            .iter()
            .filter_map(|kv| serde_json::from_slice::<Value>(&kv.value).ok())
            .map(|t| {
                let owned = t["spec"]["namespaces"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|n| n.as_str().map(str::to_owned))
                    .collect();
                (
                    t["metadata"]["name"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned(),
                    owned,
                )
            })
            .collect();
        let out = find(&list);
        *self.owners.lock() = Some((std::time::Instant::now(), list));
        Ok(out)
    }

    /// The tenant whose namespaces bound `user`, if any: a tenant's own token, a user token
    /// minted for a tenant, a ServiceAccount in a tenant's namespace.
    pub async fn tenant_of_user(&self, user: &User) -> Result<Option<String>, ApiError> {
        Ok(match user {
            User::Tenant(t) => Some(t.clone()),
            User::Named { tenant, .. } => tenant.clone(),
            User::ServiceAccount(sa) => self.tenant_owning(&sa.namespace).await?,
            User::Admin | User::System(_) | User::LentNode { .. } => None,
        })
    }

    async fn get(&self, key: String, what: &str) -> Result<Option<Value>, ApiError> {
        let kv = self
            .store
            .get(key.as_bytes())
            .await
            .map_err(|e| ApiError::internal(format!("reading {what}: {e}")))?;
        Ok(kv.and_then(|kv| serde_json::from_slice(&kv.value).ok()))
    }

    /// What a node lent by another shard may do: what a kubelet does for itself, and no
    /// more — read what it runs, write its own Node and Lease, the status of pods bound to
    /// it (and delete them once stopped), and events. Nothing at all once the loan is over.
    async fn lent_node(
        &self,
        user: &User,
        req: &ApiRequest,
        node: &str,
        loan: &str,
    ) -> Result<Scope, ApiError> {
        let (ns, name) = LOANS_CONFIGMAP;
        let key = tessera_core::keys::object_key("configmaps", Some(ns), name);
        let ledger = self.get(key, "the loan ledger").await?;
        if ledger.as_ref().and_then(|l| l["data"][node].as_str()) != Some(loan) {
            return Err(forbidden(
                user,
                req,
                &format!(
                    "loan {loan} of node {node} is not (or no longer) admitted by this shard: the node went back to its own shard"
                ),
            ));
        }
        let scope = Scope {
            namespaces: None,
            max_inflight: LENT_NODE_INFLIGHT,
            max_watches: MIN_TENANT_WATCHES * 4,
        };
        let res = req.resource;
        let read = matches!(req.verb, Verb::Get | Verb::List | Verb::Watch);
        if read {
            // Secrets are read one at a time, by name (those its pods reference), never listed.
            if (res.group, res.plural) == ("", "secrets") && req.verb != Verb::Get {
                return Err(forbidden(
                    user,
                    req,
                    "a lent node may read a secret its pods name, not list or watch secrets",
                ));
            }
            return Ok(scope);
        }
        let named = || target_name(req);
        let allowed = match (res.group, res.plural, req.subresource.as_deref()) {
            ("", "nodes", Some("status")) => named().as_deref() == Some(node),
            // Its Node's spec and labels are the borrower's to say: created carrying the
            // borrowed taint and its loan, never changed after (it cannot untaint itself
            // to take pods the borrower's tenants did not allow onto it).
            ("", "nodes", None) if req.verb == Verb::Create => req.body_value().is_ok_and(|b| {
                b["metadata"]["name"].as_str() == Some(node) && lent_node_marked(&b, loan)
            }),
            ("", "nodes", None) => req.verb == Verb::Delete && named().as_deref() == Some(node),
            ("coordination.k8s.io", "leases", None) => {
                req.namespace.as_deref() == Some("kube-node-lease")
                    && named().as_deref() == Some(node)
            }
            ("", "events", None) | ("events.k8s.io", "events", None) => true,
            ("", "pods", Some("status")) => self.bound_to(req, node).await?,
            ("", "pods", None) if req.verb == Verb::Delete => self.bound_to(req, node).await?,
            _ => false,
        };
        if allowed {
            Ok(scope)
        } else {
            Err(forbidden(
                user,
                req,
                "a lent node may write only its own Node and Lease, the status of pods bound to it (and delete them), and events",
            ))
        }
    }

    /// Whether the pod `req` names is bound to `node`.
    async fn bound_to(&self, req: &ApiRequest, node: &str) -> Result<bool, ApiError> {
        let (Some(ns), Some(n)) = (&req.namespace, &req.name) else {
            return Ok(false);
        };
        let key = tessera_core::keys::object_key("pods", Some(ns), n);
        let pod = self.get(key, "the pod").await?;
        Ok(pod.is_some_and(|p| p["spec"]["nodeName"].as_str() == Some(node)))
    }

    async fn tenant(&self, name: &str) -> Result<Option<Value>, ApiError> {
        let key = tessera_core::keys::object_key(
            &tessera_core::keys::resource_segment("tessera.io", "tenants"),
            None,
            name,
        );
        self.get(key, &format!("tenant {name}")).await
    }

    /// How many request seats `user` has (read before its request body is, so that a body
    /// is only read into memory on a seat).
    pub async fn seats(&self, user: &User) -> Result<usize, ApiError> {
        match user {
            User::Admin | User::System(_) => Ok(ADMIN_INFLIGHT),
            User::LentNode { .. } => Ok(LENT_NODE_INFLIGHT),
            User::Tenant(_) | User::Named { .. } | User::ServiceAccount(_) => {
                let Some(t) = self.tenant_of_user(user).await? else {
                    return Ok(RBAC_USER_INFLIGHT);
                };
                Ok(self
                    .tenant(&t)
                    .await?
                    .map_or(DEFAULT_TENANT_INFLIGHT, |obj| {
                        obj["spec"]["maxInflightRequests"]
                            .as_u64()
                            .map_or(DEFAULT_TENANT_INFLIGHT, |n| n.max(1) as usize)
                    }))
            }
        }
    }

    /// Impersonation (`kubectl --as=U --as-group=G`): whether `user` may act as user
    /// `target` with `groups`, and that caller if so. Kubernetes' rules: RBAC must grant
    /// `impersonate` on `users` (or on the ServiceAccount, for a
    /// `system:serviceaccount:NS:NAME` name) and on each of `groups`. The admin and the
    /// shard's components may impersonate anyone. A tenant's callers may impersonate only
    /// ServiceAccounts in the tenant's namespaces, whatever a binding says — any other name
    /// would take them out of the tenant. Impersonating the group `tessera:tenant:X` puts
    /// the user within tenant X's isolation (so `auth can-i --as` answers as for X's user).
    pub async fn impersonate(
        &self,
        user: &User,
        target: &str,
        groups: &[String],
    ) -> Result<User, ApiError> {
        let refuse = |resource: &str, name: &str, scope: &str, why: &str| {
            let mut e = ApiError::forbidden(format!(
                "{resource} \"{name}\" is forbidden: User \"{}\" cannot impersonate resource \"{resource}\" in API group \"\" {scope}{why}",
                user.name()
            ));
            e.details = Some(serde_json::json!({"name": name, "kind": resource}));
            e
        };
        let account = target
            .strip_prefix(SERVICE_ACCOUNT_PREFIX)
            .and_then(|rest| rest.split_once(':'));
        let masters = matches!(user, User::Admin | User::System(_));
        let tenant = if masters {
            None
        } else {
            self.tenant_of_user(user).await?
        };
        let may = |resource: &'static str, name: String, namespace: String| async move {
            if masters {
                return Ok::<bool, ApiError>(true);
            }
            if !matches!(user, User::Named { .. } | User::ServiceAccount(_)) {
                return Ok(false);
            }
            let a = Attributes {
                verb: "impersonate",
                group: "",
                resource,
                name: &name,
                namespace: &namespace,
                ..Attributes::default()
            };
            Ok(self.rbac.decide(user, &a).await?.allowed)
        };
        match account {
            Some((ns, name)) => {
                let scope = format!("in the namespace \"{ns}\"");
                if let Some(t) = &tenant
                    && self.tenant_owning(ns).await?.as_deref() != Some(t.as_str())
                {
                    return Err(refuse(
                        "serviceaccounts",
                        name,
                        &scope,
                        &format!(": \"{ns}\" is not one of tenant {t}'s namespaces"),
                    ));
                }
                if !may("serviceaccounts", name.to_owned(), ns.to_owned()).await? {
                    return Err(refuse("serviceaccounts", name, &scope, ""));
                }
            }
            None => {
                let scope = "at the cluster scope";
                if let Some(t) = &tenant {
                    return Err(refuse(
                        "users",
                        target,
                        scope,
                        &format!(
                            ": tenant {t}'s callers may impersonate only ServiceAccounts in its namespaces"
                        ),
                    ));
                }
                if !may("users", target.to_owned(), String::new()).await? {
                    return Err(refuse("users", target, scope, ""));
                }
            }
        }
        for g in groups {
            if tenant.is_some() || !may("groups", g.clone(), String::new()).await? {
                return Err(refuse("groups", g, "at the cluster scope", ""));
            }
        }
        Ok(match account {
            Some((ns, name)) => {
                let key = tessera_core::keys::object_key("serviceaccounts", Some(ns), name);
                let uid = self
                    .get(key, "the ServiceAccount")
                    .await?
                    .and_then(|sa| sa["metadata"]["uid"].as_str().map(str::to_owned))
                    .ok_or_else(|| ApiError::not_found("", "serviceaccounts", name))?;
                let now = crate::api::now_secs();
                User::ServiceAccount(Box::new(ServiceAccountClaims {
                    namespace: ns.to_owned(),
                    name: name.to_owned(),
                    uid,
                    bound: None,
                    audiences: vec![SERVICE_ACCOUNT_ISSUER.to_owned()],
                    issued: now,
                    expires: now,
                    id: String::new(),
                }))
            }
            None => {
                let tenant = groups
                    .iter()
                    .find_map(|g| g.strip_prefix("tessera:tenant:").map(str::to_owned));
                let groups = groups
                    .iter()
                    .filter(|g| {
                        !g.starts_with("tessera:tenant:") && g.as_str() != AUTHENTICATED_GROUP
                    })
                    .cloned()
                    .collect();
                User::Named {
                    name: target.to_owned(),
                    groups,
                    tenant,
                }
            }
        })
    }

    /// What a SelfSubjectAccessReview answers for `req`: allowed, and why not — the rule of
    /// tenant isolation that refused it, or RBAC's reason (none when no rule grants it, as
    /// Kubernetes answers).
    pub async fn review(&self, user: &User, req: &ApiRequest) -> Result<(bool, String), ApiError> {
        let isolated = match user {
            User::Named { .. } | User::ServiceAccount(_) => {
                match self.tenant_of_user(user).await? {
                    Some(t) => Some(self.within_tenant(user, &t, req).await),
                    None => None,
                }
            }
            _ => {
                return Ok(match self.authorize(user, req).await {
                    Ok(_) => (true, String::new()),
                    Err(e) if e.code == 403 => (false, e.message),
                    Err(e) => return Err(e),
                });
            }
        };
        match isolated {
            Some(Err(e)) if e.code == 403 => return Ok((false, e.message)),
            Some(Err(e)) => return Err(e),
            _ => {}
        }
        let d = self.rbac.decide(user, &attributes(req)).await?;
        Ok((d.allowed, d.reason))
    }

    /// Allows or refuses `req` for `user`: tenant isolation, then RBAC for the callers it
    /// governs (a tenant's own token holds [`crate::rbac::tenant_owner_rules`], which are
    /// exactly what isolation lets it do).
    pub async fn authorize(&self, user: &User, req: &ApiRequest) -> Result<Scope, ApiError> {
        let scope = match user {
            User::Admin | User::System(_) => {
                return Ok(Scope {
                    namespaces: None,
                    max_inflight: ADMIN_INFLIGHT,
                    max_watches: ADMIN_WATCHES,
                });
            }
            User::LentNode { node, loan } => return self.lent_node(user, req, node, loan).await,
            User::Tenant(t) => {
                let within = self.within_tenant(user, t, req).await;
                self.count("isolation", within.is_ok());
                return within;
            }
            User::Named { .. } | User::ServiceAccount(_) => {
                match self.tenant_of_user(user).await? {
                    Some(t) => {
                        let within = self.within_tenant(user, &t, req).await;
                        self.count("isolation", within.is_ok());
                        within?
                    }
                    None => Scope {
                        namespaces: None,
                        max_inflight: RBAC_USER_INFLIGHT,
                        max_watches: MIN_TENANT_WATCHES * 4,
                    },
                }
            }
        };
        let decision = self.rbac.decide(user, &attributes(req)).await?;
        if decision.allowed {
            Ok(scope)
        } else {
            Err(rbac_forbidden(user, req, &decision.reason))
        }
    }

    /// Tenant isolation: whether `req` stays within tenant `tenant`'s reach — its
    /// namespaces (and not what only admins write there), reading nodes, priority classes
    /// and its own Tenant, its namespaces themselves. What a tenant's own token may do.
    async fn within_tenant(
        &self,
        user: &User,
        tenant: &str,
        req: &ApiRequest,
    ) -> Result<Scope, ApiError> {
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
        let max_watches = obj["spec"]["maxWatches"]
            .as_u64()
            .map_or((max_inflight * 4).max(MIN_TENANT_WATCHES), |n| {
                n.max(1) as usize
            });
        let scope = |namespaces| Scope {
            namespaces,
            max_inflight,
            max_watches,
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
            let admins_only =
                tenant_may_not_write(res.group, res.plural, req.subresource.as_deref());
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
                let name = target_name(req);
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
