//! RBAC (`rbac.authorization.k8s.io/v1`): who may do what, from Roles, ClusterRoles and
//! their bindings, evaluated after tenant isolation (`auth.rs`) for every caller that RBAC
//! governs — user tokens and ServiceAccounts. A tenant's own token holds the built-in
//! [`tenant_owner_rules`] in its namespaces; the admin token and the shard's components are in
//! `system:masters`, bound to `cluster-admin`.
//!
//! The evaluator reads an index kept in memory: each of the four kinds is listed once and then
//! watched, so a request costs a few hash lookups (its user's and groups' bindings in its
//! namespace and at the cluster scope), never a store read. A write of an RBAC object
//! through this server is applied to the index before it is answered, so the writer's next
//! request sees it; other API servers see it when their watch delivers it.

pub mod defaults;
pub mod rules;

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use futures::StreamExt;
use serde_json::Value;
use tessera_store::{EventKind, ListRequest, Store};
use tokio::sync::{OnceCell, oneshot};

use crate::auth::User;
use crate::catalog::{RBAC, RESOURCES};
use crate::status::ApiError;
pub use rules::{Attributes, Rule, uncovered};

/// The four kinds' key prefixes, in the order [`Kind`] numbers them.
const PREFIXES: [&str; 4] = [
    "/registry/roles/",
    "/registry/clusterroles/",
    "/registry/rolebindings/",
    "/registry/clusterrolebindings/",
];

/// How long a request waits for the index's first fill, or for a write to reach it.
const WAIT: Duration = Duration::from_secs(10);

/// Tombstones kept at most (deleted keys remembered so an older event cannot bring them back
/// before the watch delivers the deletion).
const TOMBSTONES: usize = 10_000;

#[derive(Clone)]
struct Binding {
    /// "" for a ClusterRoleBinding.
    namespace: String,
    /// `u:<user>` and `g:<group>` keys of its subjects.
    subjects: Vec<String>,
    /// The store key of the role it names.
    role_key: String,
    /// How the role is named in errors: `role.rbac.authorization.k8s.io "x"`.
    role_name: String,
}

/// The kinds, in [`PREFIXES`]' order, as the metric labels them.
const KINDS: [&str; 4] = ["Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding"];

fn kind_of(key: &str) -> Option<usize> {
    PREFIXES.iter().position(|p| key.starts_with(p))
}

#[derive(Default)]
struct Index {
    /// Objects held, per kind ([`KINDS`]).
    counts: [i64; 4],
    /// The revision each live key was applied at.
    revs: HashMap<String, i64>,
    /// Deleted keys, with the deletion's revision.
    tombstones: HashMap<String, i64>,
    /// Roles and ClusterRoles, by store key.
    roles: HashMap<String, Arc<[Rule]>>,
    /// RoleBindings and ClusterRoleBindings, by store key.
    bindings: HashMap<String, Binding>,
    /// Binding keys by (subject key, namespace or "").
    by_subject: HashMap<(String, String), Vec<String>>,
}

fn role_key(kind: &str, namespace: &str, name: &str) -> Option<String> {
    match kind {
        "Role" => Some(format!("{}{namespace}/{name}", PREFIXES[0])),
        "ClusterRole" => Some(format!("{}{name}", PREFIXES[1])),
        _ => None,
    }
}

/// The subject keys of a binding's `subjects` (`namespace`: the binding's, for a
/// ServiceAccount subject that names none).
fn subject_keys(subjects: &Value, namespace: &str) -> Vec<String> {
    subjects
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| {
            let name = s["name"].as_str()?;
            match s["kind"].as_str()? {
                "User" => Some(format!("u:{name}")),
                "Group" => Some(format!("g:{name}")),
                "ServiceAccount" => {
                    let ns = s["namespace"]
                        .as_str()
                        .filter(|n| !n.is_empty())
                        .unwrap_or(namespace);
                    Some(format!("u:system:serviceaccount:{ns}:{name}"))
                }
                _ => None,
            }
        })
        .collect()
}

impl Index {
    /// Applies one change of `key` at `rev` (`value` None: deleted), unless the index holds
    /// the key at a later revision already.
    fn apply(&mut self, key: &str, value: Option<&[u8]>, rev: i64) {
        let seen = self
            .revs
            .get(key)
            .or_else(|| self.tombstones.get(key))
            .copied();
        if seen.is_some_and(|s| s >= rev) {
            if value.is_none() && seen == Some(rev) {
                // The watch delivering a deletion already applied here: caught up.
                self.tombstones.remove(key);
            }
            return;
        }
        self.unindex(key);
        let Some(value) = value else {
            self.forget(key);
            if self.tombstones.len() >= TOMBSTONES {
                self.tombstones.clear();
            }
            self.tombstones.insert(key.to_owned(), rev);
            return;
        };
        self.tombstones.remove(key);
        if self.revs.insert(key.to_owned(), rev).is_none()
            && let Some(k) = kind_of(key)
        {
            self.counts[k] += 1;
        }
        let Ok(obj) = serde_json::from_slice::<Value>(value) else {
            return;
        };
        if key.starts_with(PREFIXES[0]) || key.starts_with(PREFIXES[1]) {
            let rules: Vec<Rule> = obj["rules"]
                .as_array()
                .into_iter()
                .flatten()
                .map(Rule::from_json)
                .collect();
            self.roles.insert(key.to_owned(), rules.into());
            return;
        }
        let namespace = obj["metadata"]["namespace"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let rr = &obj["roleRef"];
        let (kind, name) = (
            rr["kind"].as_str().unwrap_or_default(),
            rr["name"].as_str().unwrap_or_default(),
        );
        let Some(role_key) = role_key(kind, &namespace, name) else {
            return;
        };
        let binding = Binding {
            subjects: subject_keys(&obj["subjects"], &namespace),
            role_key,
            role_name: format!("{}.{RBAC} {name:?}", kind.to_lowercase()),
            namespace,
        };
        for s in &binding.subjects {
            self.by_subject
                .entry((s.clone(), binding.namespace.clone()))
                .or_default()
                .push(key.to_owned());
        }
        self.bindings.insert(key.to_owned(), binding);
    }

    /// Drops `key`'s revision (it is gone).
    fn forget(&mut self, key: &str) {
        if self.revs.remove(key).is_some()
            && let Some(k) = kind_of(key)
        {
            self.counts[k] -= 1;
        }
    }

    fn unindex(&mut self, key: &str) {
        self.roles.remove(key);
        if let Some(old) = self.bindings.remove(key) {
            for s in old.subjects {
                let slot = (s, old.namespace.clone());
                if let Some(keys) = self.by_subject.get_mut(&slot) {
                    keys.retain(|k| k != key);
                    if keys.is_empty() {
                        self.by_subject.remove(&slot);
                    }
                }
            }
        }
    }

    /// Every key of `prefix` the index holds.
    fn keys_of(&self, prefix: &str) -> Vec<String> {
        self.revs
            .keys()
            .filter(|k| k.starts_with(prefix))
            .cloned()
            .collect()
    }

    /// Calls `f` with the rules of every binding of `subjects` in `namespace` (and at the
    /// cluster scope) until it returns true; the names of roles that bindings name but that
    /// do not exist are pushed to `missing`.
    fn visit(
        &self,
        subjects: &[String],
        namespace: &str,
        missing: &mut Vec<String>,
        mut f: impl FnMut(&[Rule]) -> bool,
    ) -> bool {
        let scopes: &[&str] = if namespace.is_empty() {
            &[""]
        } else {
            &["", namespace]
        };
        for s in subjects {
            for scope in scopes {
                let Some(keys) = self.by_subject.get(&(s.clone(), (*scope).to_owned())) else {
                    continue;
                };
                for key in keys {
                    let Some(b) = self.bindings.get(key) else {
                        continue;
                    };
                    match self.roles.get(&b.role_key) {
                        Some(rules) => {
                            if f(rules) {
                                return true;
                            }
                        }
                        None => missing.push(format!("{} not found", b.role_name)),
                    }
                }
            }
        }
        false
    }
}

struct Inner {
    store: Arc<dyn Store>,
    metrics: Option<crate::metrics::ApiMetrics>,
    index: parking_lot::RwLock<Index>,
    started: OnceCell<()>,
    /// Dropped with the last handle: the watch task ends.
    _stop: oneshot::Sender<()>,
    stopped: parking_lot::Mutex<Option<oneshot::Receiver<()>>>,
}

impl Inner {
    /// After the index changed: its sizes to the metrics.
    fn changed(&self) {
        if let Some(m) = &self.metrics {
            let counts = self.index.read().counts;
            for (kind, n) in KINDS.iter().zip(counts) {
                m.rbac_objects.with_label_values(&[kind]).set(n);
            }
        }
    }
}

/// RBAC's evaluator and the index it reads (cheap to clone: one per API, shared).
#[derive(Clone)]
pub struct Rbac {
    inner: Arc<Inner>,
}

/// The subject keys of `user`: its name and each of its groups.
fn subjects_of(user: &User) -> Vec<String> {
    std::iter::once(format!("u:{}", user.name()))
        .chain(user.groups().into_iter().map(|g| format!("g:{g}")))
        .collect()
}

/// An RBAC decision.
#[derive(Debug, Default)]
pub struct Decision {
    /// Whether a rule grants the request.
    pub allowed: bool,
    /// Why RBAC could not tell more (roles named by bindings that do not exist), as
    /// Kubernetes reports it: `RBAC: role.rbac.authorization.k8s.io "x" not found`.
    pub reason: String,
}

impl Rbac {
    /// An evaluator over the RBAC objects in `store` (read on first use), counting its
    /// decisions and objects in `metrics`.
    pub fn new(store: Arc<dyn Store>, metrics: Option<crate::metrics::ApiMetrics>) -> Rbac {
        let (stop, stopped) = oneshot::channel();
        Rbac {
            inner: Arc::new(Inner {
                store,
                metrics,
                index: parking_lot::RwLock::new(Index::default()),
                started: OnceCell::new(),
                _stop: stop,
                stopped: parking_lot::Mutex::new(Some(stopped)),
            }),
        }
    }

    /// Lists the four kinds and starts watching them, once.
    async fn ready(&self) -> Result<(), ApiError> {
        // Every decision passes here: once filled, no timer and no cell to wait on.
        if self.inner.started.initialized() {
            return Ok(());
        }
        let init = async {
            let mut from = Vec::with_capacity(PREFIXES.len());
            for prefix in PREFIXES {
                from.push(relist(&self.inner, prefix).await?);
            }
            let weak = Arc::downgrade(&self.inner);
            let stopped = self.inner.stopped.lock().take();
            tokio::spawn(watch_all(weak, from, stopped));
            Ok::<(), ApiError>(())
        };
        match tokio::time::timeout(WAIT, self.inner.started.get_or_try_init(|| init)).await {
            Ok(r) => r.map(|_| ()),
            Err(_) => Err(ApiError::new(
                503,
                "ServiceUnavailable",
                "the RBAC authorizer has not read its roles and bindings yet; retry",
            )),
        }
    }

    /// Records a write of an RBAC object made through this server (`value` None: deleted),
    /// so the next request sees it before the watch delivers it.
    pub fn applied(&self, key: &[u8], value: Option<&[u8]>, rev: i64) {
        let Ok(key) = std::str::from_utf8(key) else {
            return;
        };
        if PREFIXES.iter().any(|p| key.starts_with(p)) && self.inner.started.initialized() {
            self.inner.index.write().apply(key, value, rev);
            self.inner.changed();
        }
    }

    /// Whether RBAC grants `a` to `user`.
    pub async fn decide(&self, user: &User, a: &Attributes<'_>) -> Result<Decision, ApiError> {
        self.ready().await?;
        let subjects = subjects_of(user);
        let mut missing = Vec::new();
        let allowed =
            self.inner
                .index
                .read()
                .visit(&subjects, a.namespace, &mut missing, |rules| {
                    rules.iter().any(|r| r.allows(a))
                });
        if let Some(m) = &self.inner.metrics {
            let decision = if allowed { "allow" } else { "deny" };
            m.decisions.with_label_values(&["rbac", decision]).inc();
        }
        let reason = if allowed || missing.is_empty() {
            String::new()
        } else {
            missing.sort();
            missing.dedup();
            format!("RBAC: [{}]", missing.join(", "))
        };
        Ok(Decision { allowed, reason })
    }

    /// Every rule RBAC grants `user` in `namespace` ("" for the cluster scope only), and the
    /// roles its bindings name that do not exist.
    pub async fn rules_for(
        &self,
        user: &User,
        namespace: &str,
    ) -> Result<(Vec<Rule>, Vec<String>), ApiError> {
        self.ready().await?;
        let subjects = subjects_of(user);
        let mut missing = Vec::new();
        let mut out: Vec<Rule> = Vec::new();
        self.inner
            .index
            .read()
            .visit(&subjects, namespace, &mut missing, |rules| {
                out.extend(rules.iter().cloned());
                false
            });
        out.dedup();
        Ok((out, missing))
    }

    /// The rules of the role a binding's `roleRef` names (in `namespace` for a Role), if it
    /// exists.
    pub async fn role_rules(
        &self,
        kind: &str,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Vec<Rule>>, ApiError> {
        self.ready().await?;
        Ok(role_key(kind, namespace, name)
            .and_then(|k| self.inner.index.read().roles.get(&k).map(|r| r.to_vec())))
    }
}

/// Reads every object of `prefix` into the index (dropping those gone since); returns the
/// revision to watch from.
async fn relist(inner: &Inner, prefix: &str) -> Result<tessera_store::Revision, ApiError> {
    let page = inner
        .store
        .list(ListRequest {
            prefix: prefix.as_bytes().to_vec().into(),
            ..Default::default()
        })
        .await
        .map_err(|e| ApiError::internal(format!("listing {prefix} for RBAC: {e}")))?;
    let mut index = inner.index.write();
    let listed: std::collections::HashSet<&[u8]> = page.kvs.iter().map(|kv| &kv.key[..]).collect();
    for key in index.keys_of(prefix) {
        if !listed.contains(key.as_bytes()) {
            index.unindex(&key);
            index.forget(&key);
        }
    }
    for kv in &page.kvs {
        if let Ok(key) = std::str::from_utf8(&kv.key) {
            index.apply(key, Some(&kv.value), kv.mod_revision);
        }
    }
    drop(index);
    inner.changed();
    Ok(page.revision)
}

/// Watches the four prefixes until the evaluator is dropped; a watch that ends (compaction,
/// a lost connection) is listed and watched again.
async fn watch_all(
    inner: Weak<Inner>,
    from: Vec<tessera_store::Revision>,
    stopped: Option<oneshot::Receiver<()>>,
) {
    let Some(mut stopped) = stopped else {
        return;
    };
    let watches = PREFIXES
        .iter()
        .zip(from)
        .map(|(prefix, rev)| watch_one(inner.clone(), prefix, rev));
    tokio::select! {
        _ = futures::future::join_all(watches) => {}
        _ = &mut stopped => {}
    }
}

async fn watch_one(inner: Weak<Inner>, prefix: &'static str, mut from: tessera_store::Revision) {
    loop {
        let Some(strong) = inner.upgrade() else {
            return;
        };
        let store = strong.store.clone();
        drop(strong);
        match store.watch(prefix.as_bytes(), Some(from.clone())).await {
            Ok(mut stream) => {
                while let Some(batch) = stream.next().await {
                    let Ok(batch) = batch else {
                        break;
                    };
                    let Some(strong) = inner.upgrade() else {
                        return;
                    };
                    {
                        let mut index = strong.index.write();
                        for ev in &batch.events {
                            let Ok(key) = std::str::from_utf8(&ev.kv.key) else {
                                continue;
                            };
                            let value = (ev.kind == EventKind::Put).then_some(&ev.kv.value[..]);
                            index.apply(key, value, ev.kv.mod_revision);
                        }
                    }
                    strong.changed();
                    from = batch.revision;
                }
            }
            Err(e) => tracing::warn!(prefix, error = %e, "watching RBAC objects"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        let Some(strong) = inner.upgrade() else {
            return;
        };
        match relist(&strong, prefix).await {
            Ok(rev) => from = rev,
            Err(e) => tracing::warn!(prefix, error = %e.message, "listing RBAC objects again"),
        }
    }
}

/// What a tenant's own token may do, as rules: everything in its namespaces but what only
/// an admin or the shard's components may write (quotas and limits, pods' status, bindings
/// to nodes), read nodes and priority classes, its own Tenant, and its namespaces
/// themselves. Tenant isolation bounds where these apply (its namespaces, the namespaces it
/// lists); these rules are what `kubectl auth can-i --list` shows it.
pub fn tenant_owner_rules(tenant: &str) -> Vec<Rule> {
    let mut by_group: Vec<(&str, Vec<String>, Vec<String>)> = Vec::new();
    for res in RESOURCES.iter().filter(|r| r.namespaced) {
        let slot = match by_group.iter().position(|(g, _, _)| *g == res.group) {
            Some(i) => i,
            None => {
                by_group.push((res.group, Vec::new(), Vec::new()));
                by_group.len() - 1
            }
        };
        let all = std::iter::once(None).chain(res.subresources.iter().map(|s| Some(s.name)));
        for sub in all {
            let name = match sub {
                Some(s) => format!("{}/{s}", res.plural),
                None => res.plural.to_owned(),
            };
            match crate::auth::tenant_may_not_write(res.group, res.plural, sub) {
                None => by_group[slot].1.push(name),
                Some(_) => by_group[slot].2.push(name),
            }
        }
    }
    let mut out = Vec::new();
    for (group, full, read) in by_group {
        let g = [group];
        if !full.is_empty() {
            let r: Vec<&str> = full.iter().map(String::as_str).collect();
            out.push(Rule::resource(&g, &r, &["*"]));
        }
        if !read.is_empty() {
            let r: Vec<&str> = read.iter().map(String::as_str).collect();
            out.push(Rule::resource(&g, &r, &["get", "list", "watch"]));
        }
    }
    out.push(Rule::resource(
        &[""],
        &["namespaces", "namespaces/status"],
        &["*"],
    ));
    out.push(Rule::resource(
        &[""],
        &["nodes", "nodes/status"],
        &["get", "list", "watch"],
    ));
    out.push(Rule::resource(
        &["scheduling.k8s.io"],
        &["priorityclasses"],
        &["get", "list", "watch"],
    ));
    out.push(
        Rule::resource(&["tessera.io"], &["tenants", "tenants/status"], &["get"]).named(&[tenant]),
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn put(index: &mut Index, key: &str, obj: &Value, rev: i64) {
        index.apply(key, Some(obj.to_string().as_bytes()), rev);
    }

    #[test]
    fn the_index_follows_changes_in_revision_order() {
        let mut index = Index::default();
        let role = json!({"rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]});
        put(&mut index, "/registry/roles/t1/r", &role, 5);
        let rb = json!({"metadata": {"namespace": "t1"},
            "roleRef": {"kind": "Role", "name": "r"},
            "subjects": [{"kind": "User", "name": "alice"}, {"kind": "ServiceAccount", "name": "sa"}]});
        put(&mut index, "/registry/rolebindings/t1/rb", &rb, 6);
        let mut missing = Vec::new();
        let granted = |index: &Index, subject: &str, ns: &str, missing: &mut Vec<String>| {
            index.visit(&[subject.to_owned()], ns, missing, |rules| {
                !rules.is_empty()
            })
        };
        assert!(granted(&index, "u:alice", "t1", &mut missing));
        assert!(granted(
            &index,
            "u:system:serviceaccount:t1:sa",
            "t1",
            &mut missing
        ));
        assert!(
            !granted(&index, "u:alice", "t2", &mut missing),
            "a RoleBinding stays in its namespace"
        );
        assert!(!granted(&index, "u:bob", "t1", &mut missing));
        // An older event does not undo a newer one; a deletion is not undone by an older put.
        put(
            &mut index,
            "/registry/rolebindings/t1/rb",
            &json!({"metadata": {"namespace": "t1"},
            "roleRef": {"kind": "Role", "name": "r"}, "subjects": []}),
            4,
        );
        assert!(granted(&index, "u:alice", "t1", &mut missing));
        index.apply("/registry/rolebindings/t1/rb", None, 9);
        assert!(!granted(&index, "u:alice", "t1", &mut missing));
        put(&mut index, "/registry/rolebindings/t1/rb", &rb, 6);
        assert!(
            !granted(&index, "u:alice", "t1", &mut missing),
            "resurrected by a late event"
        );
        put(&mut index, "/registry/rolebindings/t1/rb", &rb, 10);
        assert!(
            granted(&index, "u:alice", "t1", &mut missing),
            "re-created later"
        );
        assert!(missing.is_empty());
        index.apply("/registry/roles/t1/r", None, 11);
        assert!(!granted(&index, "u:alice", "t1", &mut missing));
        assert_eq!(
            missing,
            vec!["role.rbac.authorization.k8s.io \"r\" not found"]
        );
    }

    #[test]
    fn tenant_owner_rules_leave_out_what_only_admins_write() {
        let rules = tenant_owner_rules("acme");
        let can = |verb, group, resource, subresource, name| {
            let a = Attributes {
                verb,
                group,
                resource,
                subresource,
                name,
                namespace: "t1",
                ..Attributes::default()
            };
            rules.iter().any(|r| r.allows(&a))
        };
        assert!(can("delete", "apps", "deployments", "", ""));
        assert!(can("update", "apps", "deployments", "scale", ""));
        assert!(can("create", RBAC, "rolebindings", "", ""));
        assert!(can("create", "", "serviceaccounts", "token", "default"));
        assert!(can("get", "", "resourcequotas", "", ""));
        assert!(!can("update", "", "resourcequotas", "", ""));
        assert!(!can("update", "", "pods", "status", ""));
        assert!(can("get", "", "pods", "status", ""));
        assert!(!can("create", "", "pods", "binding", ""));
        assert!(!can("create", "tessera.io", "podgroups", "binding", ""));
        assert!(can("get", "tessera.io", "tenants", "", "acme"));
        assert!(!can("get", "tessera.io", "tenants", "", "other"));
        assert!(!can("create", RBAC, "clusterrolebindings", "", ""));
    }
}
