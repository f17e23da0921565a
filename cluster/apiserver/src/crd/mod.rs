//! CustomResourceDefinitions (`apiextensions.k8s.io/v1`): a CRD written to this server is
//! served at once — its kinds join request routing, discovery and `/openapi/v3`, and every
//! custom object is pruned, defaulted and validated with the version's structural schema.
//!
//! Each API server keeps the served CRDs in memory, as an immutable [`Snapshot`] replaced
//! whenever one changes: the CRDs are listed once and then watched (so a CRD written through
//! another API server on the same store is served here when the watch delivers it), and a
//! CRD written through this server is applied before the write is answered. A request holds
//! the snapshot it started with; looking a resource up is a hash lookup, with schemas
//! compiled once per CRD change ([`schema::Schema`]).
//!
//! Deleting a CRD deletes its objects: the CRD carries the
//! `customresourcecleanup.apiextensions.k8s.io` finalizer, and once it is terminating this
//! server stops accepting creates of its kinds, deletes every stored object of it and then
//! removes the finalizer (which deletes the CRD).

pub mod schema;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tessera_store::{ListRequest, Op, Store};
use tokio::sync::{OnceCell, oneshot};

use crate::catalog::{self, APIEXTENSIONS, Lookup, Resource};
use crate::status::{ApiError, Cause};
pub use schema::Schema;

/// The finalizer that holds a CRD until its objects are deleted.
pub const CLEANUP_FINALIZER: &str = "customresourcecleanup.apiextensions.k8s.io";

/// Where CRDs are stored.
fn prefix() -> String {
    let res = catalog::find(APIEXTENSIONS, "v1", "customresourcedefinitions")
        .expect("CRDs are in the catalog");
    tessera_core::keys::resource_prefix(
        &tessera_core::keys::resource_segment(res.group, res.plural),
        None,
    )
}

/// How long a request waits for the first list of CRDs.
const WAIT: Duration = Duration::from_secs(10);

/// A printer column (`additionalPrinterColumns`).
#[derive(Debug, Clone)]
pub struct Column {
    /// Header.
    pub name: String,
    /// `integer`, `number`, `string`, `boolean` or `date`.
    pub ty: String,
    /// Shown only with `-o wide` when above 0.
    pub priority: i64,
    /// What it shows.
    pub description: String,
    /// A simple JSONPath (`.spec.replicas`, `.status.conditions[0].type`).
    pub path: String,
}

/// Where the scale subresource reads and writes.
#[derive(Debug, Clone)]
pub struct ScalePaths {
    /// `.spec.replicas`.
    pub spec_replicas: String,
    /// `.status.replicas`.
    pub status_replicas: String,
    /// `.status.selector`, if set.
    pub label_selector: Option<String>,
}

/// One served version of a CRD.
#[derive(Debug)]
pub struct Version {
    /// The resource requests route to.
    pub resource: &'static Resource,
    /// The compiled schema.
    pub schema: Schema,
    /// The schema as written, for `/openapi/v3`.
    pub raw_schema: Value,
    /// Printer columns (the default `Age` when the CRD names none).
    pub columns: Vec<Column>,
    /// The scale subresource, if enabled.
    pub scale: Option<ScalePaths>,
    /// `deprecationWarning` (or the default one) when the version is deprecated.
    pub deprecation: Option<String>,
    /// The CRD's `spec.names.listKind`.
    pub list_kind: String,
    /// Whether the CRD is being deleted (creates are refused).
    pub terminating: bool,
    /// How many versions the CRD serves (reads of more than one rewrite `apiVersion`).
    pub served_versions: usize,
    /// The CRD's conversion webhook (`spec.conversion.strategy: Webhook`); None: versions
    /// differ only in `apiVersion`.
    pub conversion: Option<Arc<Conversion>>,
}

/// A CRD's conversion webhook: objects are stored in the storage version and converted by
/// the webhook, with a ConversionReview, to the version a request is for (and a request's
/// object to the storage version before it is stored).
#[derive(Debug)]
pub struct Conversion {
    /// The CRD's name (`crontabs.stable.example.com`), for metrics and logs.
    pub crd: String,
    /// The kind converted.
    pub kind: String,
    /// The storage version's `apiVersion` (`stable.example.com/v2`).
    pub storage: String,
    /// Where the webhook is served.
    pub endpoint: crate::webhooks::Endpoint,
    /// The PEM of its `caBundle` (None: the host's trusted CAs).
    pub ca_pem: Option<Arc<str>>,
    /// The ConversionReview version sent: the first of `conversionReviewVersions` this
    /// server speaks.
    pub review_version: &'static str,
}

/// The ConversionReview versions this server speaks, in its order of preference.
pub const CONVERSION_REVIEW_VERSIONS: [&str; 2] = ["v1", "v1beta1"];

/// A CRD's conversion webhook, if `spec.conversion.strategy` is `Webhook` (and valid).
fn conversion_of(crd: &Value) -> Option<Arc<Conversion>> {
    let spec = &crd["spec"];
    let conversion = &spec["conversion"];
    if str_of(conversion, "strategy") != "Webhook" {
        return None;
    }
    let webhook = &conversion["webhook"];
    let (endpoint, ca_pem) = crate::webhooks::Endpoint::of(&webhook["clientConfig"])?;
    let asked = strings(&webhook["conversionReviewVersions"]);
    let review_version = asked
        .iter()
        .find_map(|a| CONVERSION_REVIEW_VERSIONS.into_iter().find(|v| v == a))?;
    let storage = spec["versions"]
        .as_array()?
        .iter()
        .find(|v| v["storage"] == json!(true))?;
    Some(Arc::new(Conversion {
        crd: str_of(&crd["metadata"], "name").to_owned(),
        kind: str_of(&spec["names"], "kind").to_owned(),
        storage: format!("{}/{}", str_of(spec, "group"), str_of(storage, "name")),
        endpoint,
        ca_pem,
        review_version,
    }))
}

/// The CRDs one server serves.
#[derive(Default)]
pub struct Snapshot {
    // Keyed by the interned resources' own strings: a lookup borrows, never allocates.
    by_plural: HashMap<(&'static str, &'static str, &'static str), Arc<Version>>,
    by_kind: HashMap<(&'static str, &'static str, &'static str), Arc<Version>>,
    namespaced: HashSet<(&'static str, &'static str)>,
    /// Every served version, each group's versions in Kubernetes' priority order.
    pub versions: Vec<Arc<Version>>,
    /// The `/openapi/v3` documents of the custom group-versions, made on first use.
    documents: std::sync::OnceLock<std::collections::BTreeMap<String, crate::openapi::Document>>,
}

impl Snapshot {
    /// The served version of a custom resource.
    pub fn version(&self, res: &Resource) -> Option<&Arc<Version>> {
        self.by_plural.get(&(res.group, res.version, res.plural))
    }

    /// The served version of `kind` in `api_version`.
    pub fn kind(&self, api_version: &str, kind: &str) -> Option<Arc<Version>> {
        let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
        self.by_kind.get(&(group, version, kind)).cloned()
    }

    /// The `/openapi/v3` documents of the custom group-versions, by index path.
    pub fn documents(&self) -> &std::collections::BTreeMap<String, crate::openapi::Document> {
        self.documents
            .get_or_init(|| crate::openapi::custom_documents(&self.versions))
    }

    /// Every resource served, built-in first.
    pub fn resources(&self) -> Vec<&'static Resource> {
        catalog::served()
            .chain(self.versions.iter().map(|v| v.resource))
            .collect()
    }
}

impl Lookup for Snapshot {
    fn find(&self, group: &str, version: &str, plural: &str) -> Option<&'static Resource> {
        catalog::find(group, version, plural).or_else(|| {
            self.by_plural
                .get(&(group, version, plural))
                .map(|v| v.resource)
        })
    }
    fn namespaced(&self, group: &str, plural: &str) -> bool {
        catalog::Builtin.namespaced(group, plural) || self.namespaced.contains(&(group, plural))
    }
}

/// Kubernetes' order of versions: GA before beta before alpha, higher numbers first, and
/// versions that do not look like Kubernetes' after all of them, by name.
pub fn version_priority(v: &str) -> (u8, std::cmp::Reverse<u64>, std::cmp::Reverse<u64>, String) {
    use std::cmp::Reverse;
    let parse = || -> Option<(u8, u64, u64)> {
        let rest = v.strip_prefix('v')?;
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        let major: u64 = digits.parse().ok()?;
        let tail = &rest[digits.len()..];
        if tail.is_empty() {
            return Some((0, major, 0));
        }
        for (class, word) in [(1, "beta"), (2, "alpha")] {
            if let Some(n) = tail.strip_prefix(word) {
                return Some((class, major, n.parse().ok()?));
            }
        }
        None
    };
    match parse() {
        Some((class, major, minor)) => (class, Reverse(major), Reverse(minor), String::new()),
        None => (3, Reverse(0), Reverse(0), v.to_owned()),
    }
}

fn str_of<'a>(v: &'a Value, key: &str) -> &'a str {
    v[key].as_str().unwrap_or_default()
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

/// The served versions of a stored CRD (its schemas compiled); none for one that does not
/// compile (validation refuses those, so only a CRD written around the API lands here).
fn versions_of(crd: &Value) -> Vec<Arc<Version>> {
    let spec = &crd["spec"];
    let group = str_of(spec, "group");
    let names = &spec["names"];
    let terminating = crd["metadata"]["deletionTimestamp"].is_string();
    let all = spec["versions"].as_array().cloned().unwrap_or_default();
    let served_versions = all.iter().filter(|v| v["served"] == json!(true)).count();
    let conversion = conversion_of(crd);
    let mut out = Vec::new();
    for v in all.iter().filter(|v| v["served"] == json!(true)) {
        let name = str_of(v, "name");
        let raw_schema = v["schema"]["openAPIV3Schema"].clone();
        let Ok(schema) = Schema::compile(&raw_schema, "schema") else {
            tracing::warn!(crd = %str_of(&crd["metadata"], "name"), version = name, "a stored CRD's schema does not compile; its version is not served");
            continue;
        };
        let subresources = &v["subresources"];
        let scale = subresources["scale"].as_object().map(|s| ScalePaths {
            spec_replicas: s
                .get("specReplicasPath")
                .and_then(Value::as_str)
                .unwrap_or(".spec.replicas")
                .to_owned(),
            status_replicas: s
                .get("statusReplicasPath")
                .and_then(Value::as_str)
                .unwrap_or(".status.replicas")
                .to_owned(),
            label_selector: s
                .get("labelSelectorPath")
                .and_then(Value::as_str)
                .map(str::to_owned),
        });
        let Some(resource) = catalog::custom_resource(crd, name) else {
            continue;
        };
        let mut columns: Vec<Column> = v["additionalPrinterColumns"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| Column {
                name: str_of(c, "name").to_owned(),
                ty: str_of(c, "type").to_owned(),
                priority: c["priority"].as_i64().unwrap_or(0),
                description: str_of(c, "description").to_owned(),
                path: str_of(c, "jsonPath").to_owned(),
            })
            .collect();
        if columns.is_empty() {
            columns.push(Column {
                name: "Age".into(),
                ty: "date".into(),
                priority: 0,
                description: String::new(),
                path: ".metadata.creationTimestamp".into(),
            });
        }
        let deprecation =
            (v["deprecated"] == json!(true)).then(|| match v["deprecationWarning"].as_str() {
                Some(w) => w.to_owned(),
                None => format!("{group}/{name} {} is deprecated", str_of(names, "kind")),
            });
        out.push(Arc::new(Version {
            resource,
            schema,
            raw_schema,
            columns,
            scale,
            deprecation,
            list_kind: match str_of(names, "listKind") {
                "" => format!("{}List", str_of(names, "kind")),
                l => l.to_owned(),
            },
            terminating,
            served_versions,
            conversion: conversion.clone(),
        }));
    }
    out.sort_by_key(|v| version_priority(v.resource.version));
    out
}

/// A CRD as applied: the revision, and its served versions.
type Applied = (i64, Vec<Arc<Version>>);

/// The CRDs of one API server.
#[derive(Clone)]
pub struct Crds {
    inner: Arc<Inner>,
}

struct Inner {
    store: Arc<dyn Store>,
    metrics: Option<crate::metrics::ApiMetrics>,
    /// Each CRD by name: the revision it was applied at and its served versions.
    definitions: parking_lot::Mutex<HashMap<String, Applied>>,
    /// Deleted CRD names with the deletion's revision (an older event cannot bring one back).
    deleted: parking_lot::Mutex<HashMap<String, i64>>,
    snapshot: parking_lot::RwLock<Arc<Snapshot>>,
    started: OnceCell<()>,
    /// Cleanups running, by CRD name.
    cleaning: parking_lot::Mutex<HashSet<String>>,
    _stop: oneshot::Sender<()>,
    stopped: parking_lot::Mutex<Option<oneshot::Receiver<()>>>,
}

impl Crds {
    /// The CRDs in `store`, read on first use, counted in `metrics`.
    pub fn new(store: Arc<dyn Store>, metrics: Option<crate::metrics::ApiMetrics>) -> Crds {
        let (stop, stopped) = oneshot::channel();
        Crds {
            inner: Arc::new(Inner {
                store,
                metrics,
                definitions: Default::default(),
                deleted: Default::default(),
                snapshot: Default::default(),
                started: OnceCell::new(),
                cleaning: Default::default(),
                _stop: stop,
                stopped: parking_lot::Mutex::new(Some(stopped)),
            }),
        }
    }

    /// What is served now: the CRDs listed (on first use) and followed since.
    pub async fn snapshot(&self) -> Result<Arc<Snapshot>, ApiError> {
        if !self.inner.started.initialized() {
            let init = async {
                let from = relist(&self.inner).await?;
                let weak = Arc::downgrade(&self.inner);
                let stopped = self.inner.stopped.lock().take();
                tokio::spawn(crate::follow::follow(weak, from, stopped));
                Ok::<(), ApiError>(())
            };
            match tokio::time::timeout(WAIT, self.inner.started.get_or_try_init(|| init)).await {
                Ok(r) => r.map(|_| ())?,
                Err(_) => {
                    return Err(ApiError::new(
                        503,
                        "ServiceUnavailable",
                        "the API server has not read its CustomResourceDefinitions yet; retry",
                    ));
                }
            }
        }
        Ok(self.inner.snapshot.read().clone())
    }

    /// The snapshot as it is, without waiting for the first list (empty before it).
    pub fn current(&self) -> Arc<Snapshot> {
        self.inner.snapshot.read().clone()
    }

    /// Records a write of a CRD through this server (`crd` None: deleted), so the next
    /// request is routed by it before the watch delivers it.
    pub fn applied(&self, key: &[u8], crd: Option<&Value>, rev: i64) {
        if self.inner.started.initialized() {
            apply(&self.inner, key, crd, rev);
        }
    }
}

fn name_of_key(key: &[u8]) -> Option<String> {
    let key = std::str::from_utf8(key).ok()?;
    key.strip_prefix(&prefix()).map(str::to_owned)
}

/// Applies one change, rebuilds the snapshot, and starts the cleanup of a terminating CRD.
fn apply(inner: &Arc<Inner>, key: &[u8], crd: Option<&Value>, rev: i64) {
    let Some(name) = name_of_key(key) else {
        return;
    };
    {
        let mut defs = inner.definitions.lock();
        let mut deleted = inner.deleted.lock();
        let seen = defs
            .get(&name)
            .map(|d| d.0)
            .or_else(|| deleted.get(&name).copied());
        if rev != i64::MIN && seen.is_some_and(|s| s >= rev) {
            return;
        }
        match crd {
            Some(crd) => {
                deleted.remove(&name);
                defs.insert(name.clone(), (rev, versions_of(crd)));
            }
            None => {
                defs.remove(&name);
                if deleted.len() > 10_000 {
                    deleted.clear();
                }
                if rev != i64::MIN {
                    deleted.insert(name.clone(), rev);
                }
            }
        }
        let mut snap = Snapshot::default();
        let mut names: Vec<&String> = defs.keys().collect();
        names.sort();
        for n in names {
            for v in &defs[n].1 {
                let r = v.resource;
                snap.by_plural
                    .insert((r.group, r.version, r.plural), v.clone());
                snap.by_kind.insert((r.group, r.version, r.kind), v.clone());
                if r.namespaced {
                    snap.namespaced.insert((r.group, r.plural));
                }
                snap.versions.push(v.clone());
            }
        }
        if let Some(m) = &inner.metrics {
            m.custom_resources.set(snap.versions.len() as i64);
        }
        *inner.snapshot.write() = Arc::new(snap);
    }
    if let Some(crd) = crd
        && crd["metadata"]["deletionTimestamp"].is_string()
        && strings(&crd["metadata"]["finalizers"])
            .iter()
            .any(|f| f == CLEANUP_FINALIZER)
        && inner.cleaning.lock().insert(name.clone())
    {
        let weak = Arc::downgrade(inner);
        let crd = crd.clone();
        tokio::spawn(async move {
            if let Some(inner) = weak.upgrade() {
                if let Err(e) = cleanup(&inner, &crd).await {
                    tracing::warn!(crd = %name, error = %e.message, "deleting a CRD's objects");
                }
                inner.cleaning.lock().remove(&name);
            }
        });
    }
}

/// Deletes every object of a terminating CRD, then its cleanup finalizer (which deletes the
/// CRD itself once no other finalizer is left). Objects are deleted from the store directly:
/// their own finalizers are not waited for.
async fn cleanup(inner: &Inner, crd: &Value) -> Result<(), ApiError> {
    let spec = &crd["spec"];
    let segment = tessera_core::keys::resource_segment(
        str_of(spec, "group"),
        str_of(&spec["names"], "plural"),
    );
    let objects = tessera_core::keys::resource_prefix(&segment, None);
    loop {
        let page = inner
            .store
            .list(ListRequest {
                prefix: objects.as_bytes().to_vec().into(),
                limit: 500,
                ..Default::default()
            })
            .await
            .map_err(crate::api::store_error)?;
        if page.kvs.is_empty() {
            break;
        }
        let mut deleted = 0;
        for kv in &page.kvs {
            let op = Op::Delete {
                key: kv.key.clone(),
                expected: Some(kv.mod_revision),
            };
            // A conflict is another server (or a client) deleting or changing the same
            // object: the next page lists it again.
            if inner.store.txn(vec![op]).await.is_ok() {
                deleted += 1;
                if let Some(m) = &inner.metrics {
                    m.crd_cleanup_deleted.inc();
                }
            }
        }
        if deleted == 0 {
            // Nothing went (the store refuses writes): wait rather than spin; the CRD
            // stays Terminating until its objects are gone.
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
    let name = str_of(&crd["metadata"], "name");
    let key = format!("{}{name}", prefix());
    for _ in 0..16 {
        let Some(kv) = inner
            .store
            .get(key.as_bytes())
            .await
            .map_err(crate::api::store_error)?
        else {
            return Ok(());
        };
        let mut current: Value = serde_json::from_slice(&kv.value)
            .map_err(|e| ApiError::internal(format!("a stored CRD is not JSON: {e}")))?;
        let left: Vec<String> = strings(&current["metadata"]["finalizers"])
            .into_iter()
            .filter(|f| f != CLEANUP_FINALIZER)
            .collect();
        let op = if left.is_empty() {
            Op::Delete {
                key: kv.key.clone(),
                expected: Some(kv.mod_revision),
            }
        } else {
            current["metadata"]["finalizers"] = json!(left);
            Op::Update {
                key: kv.key.clone(),
                value: serde_json::to_vec(&current)
                    .map_err(|e| ApiError::internal(e.to_string()))?
                    .into(),
                expected: kv.mod_revision,
                lease: 0,
            }
        };
        if inner.store.txn(vec![op]).await.is_ok() {
            return Ok(());
        }
    }
    Err(ApiError::internal(format!(
        "the finalizer of CRD {name} could not be removed: it kept changing"
    )))
}

async fn relist(inner: &Arc<Inner>) -> Result<tessera_store::Revision, ApiError> {
    let page = inner
        .store
        .list(ListRequest {
            prefix: prefix().into_bytes().into(),
            ..Default::default()
        })
        .await
        .map_err(|e| ApiError::internal(format!("listing CustomResourceDefinitions: {e}")))?;
    let listed: HashSet<String> = page
        .kvs
        .iter()
        .filter_map(|kv| name_of_key(&kv.key))
        .collect();
    let gone: Vec<String> = inner
        .definitions
        .lock()
        .keys()
        .filter(|n| !listed.contains(*n))
        .cloned()
        .collect();
    for n in gone {
        // Gone while the watch was down: forgotten without a tombstone (a revision of a
        // composite store's list is not comparable with one key's).
        inner.definitions.lock().remove(&n);
        let key = format!("{}{n}", prefix());
        apply(inner, key.as_bytes(), None, i64::MIN);
    }
    for kv in &page.kvs {
        if let Ok(crd) = serde_json::from_slice::<Value>(&kv.value) {
            apply(inner, &kv.key, Some(&crd), kv.mod_revision);
        }
    }
    Ok(page.revision)
}

impl crate::follow::Follower for Inner {
    fn store(&self) -> Arc<dyn Store> {
        self.store.clone()
    }

    fn prefix(&self) -> String {
        prefix()
    }

    fn what(&self) -> &'static str {
        "CustomResourceDefinitions"
    }

    fn relist(
        self: &Arc<Self>,
    ) -> impl std::future::Future<Output = Result<tessera_store::Revision, ApiError>> + Send {
        relist(self)
    }

    fn apply(self: &Arc<Self>, key: &[u8], crd: Option<&Value>, rev: i64) {
        apply(self, key, crd, rev);
    }
}

/// What the server owns on a CRD it stores: the cleanup finalizer on a new one, and the
/// status — names accepted, established, the storage versions ever used.
pub fn prepare(crd: &mut Value, current: Option<&Value>) {
    if current.is_none() && crd["metadata"]["deletionTimestamp"].is_null() {
        let mut f = strings(&crd["metadata"]["finalizers"]);
        if !f.iter().any(|x| x == CLEANUP_FINALIZER) {
            f.push(CLEANUP_FINALIZER.to_owned());
        }
        crd["metadata"]["finalizers"] = json!(f);
    }
    let mut stored: Vec<String> = current
        .map(|c| strings(&c["status"]["storedVersions"]))
        .unwrap_or_default();
    for v in crd["spec"]["versions"].as_array().into_iter().flatten() {
        let name = str_of(v, "name");
        if v["storage"] == json!(true) && !stored.iter().any(|s| s == name) {
            stored.push(name.to_owned());
        }
    }
    let now = tessera_core::time::rfc3339(tessera_core::time::now_secs());
    let since = |ty: &str, status: &str| -> Value {
        current
            .and_then(|c| c["status"]["conditions"].as_array())
            .and_then(|cs| cs.iter().find(|c| c["type"] == ty && c["status"] == status))
            .map_or_else(|| json!(now), |c| c["lastTransitionTime"].clone())
    };
    let terminating = crd["metadata"]["deletionTimestamp"].is_string();
    let mut conditions = vec![
        json!({"type": "NamesAccepted", "status": "True", "lastTransitionTime": since("NamesAccepted", "True"),
            "reason": "NoConflicts", "message": "no conflicts found"}),
        json!({"type": "Established", "status": "True", "lastTransitionTime": since("Established", "True"),
            "reason": "InitialNamesAccepted", "message": "the initial names have been accepted"}),
    ];
    if terminating {
        conditions.push(json!({"type": "Terminating", "status": "True",
            "lastTransitionTime": since("Terminating", "True"), "reason": "InstanceDeletionInProgress",
            "message": "CustomResource deletion is in progress"}));
    }
    let mut accepted = crd["spec"]["names"].clone();
    if accepted["singular"].as_str().is_none_or(str::is_empty) {
        accepted["singular"] = json!(str_of(&crd["spec"]["names"], "kind").to_lowercase());
    }
    if accepted["listKind"].as_str().is_none_or(str::is_empty) {
        accepted["listKind"] = json!(format!("{}List", str_of(&crd["spec"]["names"], "kind")));
    }
    crd["spec"]["names"]["singular"] = accepted["singular"].clone();
    crd["spec"]["names"]["listKind"] = accepted["listKind"].clone();
    crd["status"] = json!({
        "conditions": conditions,
        "acceptedNames": accepted,
        "storedVersions": stored,
    });
}

/// Checks a CRD as Kubernetes' validation does, pushing each problem to `out`.
pub fn validate_definition(crd: &Value, current: Option<&Value>, out: &mut Vec<Cause>) {
    let spec = &crd["spec"];
    let names = &spec["names"];
    let group = str_of(spec, "group");
    let plural = str_of(names, "plural");
    let name = str_of(&crd["metadata"], "name");
    if name != format!("{plural}.{group}") {
        invalid(
            out,
            "metadata.name",
            name,
            "must be spec.names.plural+\".\"+spec.group",
        );
    }
    if group.is_empty() {
        out.push(required("spec.group"));
    } else if !group.contains('.') {
        invalid(
            out,
            "spec.group",
            group,
            "should be a domain with at least one dot",
        );
    } else if let Some(why) = tessera_core::names::dns1123_subdomain(group) {
        invalid(out, "spec.group", group, &why);
    } else if catalog::RESOURCES.iter().any(|r| r.group == group)
        || group == "metrics.k8s.io"
        || group.ends_with(".k8s.io")
        || group.ends_with(".kubernetes.io")
    {
        invalid(
            out,
            "spec.group",
            group,
            "is served by the API server itself (or is a protected Kubernetes group): choose a group of your own domain",
        );
    }
    for (field, value) in [("plural", plural), ("singular", str_of(names, "singular"))] {
        if field == "plural" && value.is_empty() {
            out.push(required("spec.names.plural"));
        } else if !value.is_empty()
            && let Some(why) = tessera_core::names::dns1123_label(value)
        {
            invalid(out, &format!("spec.names.{field}"), value, &why);
        }
    }
    for short in strings(&names["shortNames"]) {
        if let Some(why) = tessera_core::names::dns1123_label(&short) {
            invalid(out, "spec.names.shortNames", &short, &why);
        }
    }
    let kind = str_of(names, "kind");
    if kind.is_empty() {
        out.push(required("spec.names.kind"));
    } else if !kind.chars().all(|c| c.is_ascii_alphanumeric())
        || !kind.starts_with(|c: char| c.is_ascii_alphabetic())
    {
        invalid(
            out,
            "spec.names.kind",
            kind,
            "must be a valid kind: letters and digits, starting with a letter",
        );
    }
    let scope = str_of(spec, "scope");
    if !["Namespaced", "Cluster"].contains(&scope) {
        out.push(Cause {
            reason: if scope.is_empty() {
                "FieldValueRequired"
            } else {
                "FieldValueNotSupported"
            },
            field: "spec.scope".into(),
            message: if scope.is_empty() {
                "Required value".into()
            } else {
                format!(
                    "Unsupported value: {scope:?}: supported values: \"Cluster\", \"Namespaced\""
                )
            },
        });
    }
    if let Some(c) = current {
        for (field, was, now) in [
            ("spec.scope", str_of(&c["spec"], "scope"), scope),
            ("spec.group", str_of(&c["spec"], "group"), group),
            (
                "spec.names.plural",
                str_of(&c["spec"]["names"], "plural"),
                plural,
            ),
        ] {
            if was != now {
                invalid(out, field, now, "field is immutable");
            }
        }
    }
    validate_conversion(&spec["conversion"], out);
    let versions = spec["versions"].as_array().map_or(&[][..], Vec::as_slice);
    if versions.is_empty() {
        out.push(required("spec.versions"));
    }
    let mut seen = HashSet::new();
    let storage = versions
        .iter()
        .filter(|v| v["storage"] == json!(true))
        .count();
    if !versions.is_empty() && storage != 1 {
        invalid(
            out,
            "spec.versions",
            &storage.to_string(),
            "must have exactly one version marked as storage version",
        );
    }
    if !versions.is_empty() && !versions.iter().any(|v| v["served"] == json!(true)) {
        invalid(
            out,
            "spec.versions",
            "",
            "must have at least one version marked as served",
        );
    }
    for (i, v) in versions.iter().enumerate() {
        let at = format!("spec.versions[{i}]");
        let vname = str_of(v, "name");
        if vname.is_empty() {
            out.push(required(&format!("{at}.name")));
        } else if let Some(why) = tessera_core::names::dns1123_label(vname) {
            invalid(out, &format!("{at}.name"), vname, &why);
        }
        if !seen.insert(vname) {
            out.push(Cause {
                reason: "FieldValueDuplicate",
                field: format!("{at}.name"),
                message: format!("Duplicate value: {vname:?}"),
            });
        }
        let raw = &v["schema"]["openAPIV3Schema"];
        let schema_at = format!("{at}.schema.openAPIV3Schema");
        let compiled = if raw.is_null() {
            out.push(required(&schema_at));
            None
        } else {
            match Schema::compile(raw, &schema_at) {
                Ok(s) => Some(s),
                Err(causes) => {
                    out.extend(causes);
                    None
                }
            }
        };
        if let Some(scale) = v["subresources"]["scale"].as_object() {
            let sat = format!("{at}.subresources.scale");
            for (key, under, needed) in [
                ("specReplicasPath", &[".spec."][..], true),
                ("statusReplicasPath", &[".status."][..], true),
                ("labelSelectorPath", &[".spec.", ".status."][..], false),
            ] {
                match scale.get(key).and_then(Value::as_str) {
                    None if needed => out.push(required(&format!("{sat}.{key}"))),
                    None => {}
                    Some(p) if !under.iter().any(|u| p.starts_with(u)) || p.contains('[') => {
                        invalid(
                            out,
                            &format!("{sat}.{key}"),
                            p,
                            &format!(
                                "should be a JSON path without array notation under {}",
                                under.join(" or ")
                            ),
                        );
                    }
                    Some(p) => {
                        if key == "specReplicasPath"
                            && let Some(s) = &compiled
                            && !s.has_path(p)
                        {
                            invalid(
                                out,
                                &format!("{sat}.{key}"),
                                p,
                                "should be a valid path in the schema",
                            );
                        }
                    }
                }
            }
        }
        for (j, c) in v["additionalPrinterColumns"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
        {
            let cat = format!("{at}.additionalPrinterColumns[{j}]");
            if str_of(c, "name").is_empty() {
                out.push(required(&format!("{cat}.name")));
            }
            let ty = str_of(c, "type");
            if !["integer", "number", "string", "boolean", "date"].contains(&ty) {
                out.push(Cause {
                    reason: "FieldValueNotSupported",
                    field: format!("{cat}.type"),
                    message: format!(
                        "Unsupported value: {ty:?}: supported values: \"boolean\", \"date\", \"integer\", \"number\", \"string\""
                    ),
                });
            }
            let path = str_of(c, "jsonPath");
            if path.is_empty() {
                out.push(required(&format!("{cat}.jsonPath")));
            } else if jsonpath_parts(path).is_none() {
                invalid(
                    out,
                    &format!("{cat}.jsonPath"),
                    path,
                    "must be a simple JSON path (.a.b[0].c)",
                );
            }
        }
    }
}

/// `spec.conversion`, as Kubernetes checks it: `None` (the default) or `Webhook` with a
/// client configuration and the ConversionReview versions the webhook speaks, one of them
/// a version this server sends.
fn validate_conversion(conversion: &Value, out: &mut Vec<Cause>) {
    let strategy = str_of(conversion, "strategy");
    let webhook = &conversion["webhook"];
    match strategy {
        "" | "None" => {
            if !webhook.is_null() {
                out.push(Cause {
                    reason: "FieldValueForbidden",
                    field: "spec.conversion.webhook".into(),
                    message: "Forbidden: should not be set when strategy is not set to Webhook"
                        .into(),
                });
            }
        }
        "Webhook" => {
            if webhook["clientConfig"].is_null() {
                out.push(Cause {
                    reason: "FieldValueRequired",
                    field: "spec.conversion.webhook.clientConfig".into(),
                    message: "Required value: required when strategy is set to Webhook".into(),
                });
            } else {
                let mut errors = crate::validation::Errors(Vec::new());
                crate::validation::webhooks::client_config(
                    &webhook["clientConfig"],
                    "spec.conversion.webhook.clientConfig",
                    &mut errors,
                );
                out.extend(errors.0);
            }
            let asked = strings(&webhook["conversionReviewVersions"]);
            let at = "spec.conversion.webhook.conversionReviewVersions";
            let mut seen = HashSet::new();
            for (i, v) in asked.iter().enumerate() {
                if !seen.insert(v.as_str()) {
                    invalid(out, &format!("{at}[{i}]"), v, "duplicate version");
                }
            }
            if !asked
                .iter()
                .any(|a| CONVERSION_REVIEW_VERSIONS.contains(&a.as_str()))
            {
                out.push(Cause {
                    reason: "FieldValueRequired",
                    field: at.into(),
                    message: format!(
                        "Required value: must include at least one of {}",
                        CONVERSION_REVIEW_VERSIONS.join(", ")
                    ),
                });
            }
        }
        other => out.push(Cause {
            reason: "FieldValueNotSupported",
            field: "spec.conversion.strategy".into(),
            message: format!(
                "Unsupported value: {other:?}: supported values: \"None\", \"Webhook\""
            ),
        }),
    }
}

fn invalid(out: &mut Vec<Cause>, field: &str, value: &str, why: &str) {
    out.push(Cause {
        reason: "FieldValueInvalid",
        field: field.to_owned(),
        message: format!("Invalid value: {value:?}: {why}"),
    });
}

fn required(field: &str) -> Cause {
    Cause {
        reason: "FieldValueRequired",
        field: field.to_owned(),
        message: "Required value".into(),
    }
}

/// A step of a simple JSONPath.
enum Step<'a> {
    Key(&'a str),
    Index(usize),
}

/// The steps of `.a.b[0].c` (also `{.a.b}`), or None if it is not that simple.
fn jsonpath_parts(path: &str) -> Option<Vec<Step<'_>>> {
    let p = path.trim();
    let p = p
        .strip_prefix('{')
        .and_then(|s| s.strip_suffix('}'))
        .unwrap_or(p);
    let p = p.strip_prefix('.')?;
    let mut steps = Vec::new();
    for part in p.split('.') {
        let (key, mut rest) = match part.find('[') {
            Some(i) => (&part[..i], &part[i..]),
            None => (part, ""),
        };
        if key.is_empty() && rest.is_empty() {
            return None;
        }
        if !key.is_empty() {
            steps.push(Step::Key(key));
        }
        while let Some(r) = rest.strip_prefix('[') {
            let end = r.find(']')?;
            steps.push(Step::Index(r[..end].parse().ok()?));
            rest = &r[end + 1..];
        }
        if !rest.is_empty() {
            return None;
        }
    }
    Some(steps)
}

/// The value at a simple JSONPath, if there is one.
pub fn at_path<'a>(obj: &'a Value, path: &str) -> Option<&'a Value> {
    let mut v = obj;
    for step in jsonpath_parts(path)? {
        v = match step {
            Step::Key(k) => v.get(k)?,
            Step::Index(i) => v.get(i)?,
        };
    }
    (!v.is_null()).then_some(v)
}

/// Sets the value at a simple dotted path (no indices), creating objects on the way.
pub fn set_path(obj: &mut Value, path: &str, value: Value) {
    let mut v = obj;
    let parts: Vec<&str> = path.trim_start_matches('.').split('.').collect();
    for (i, part) in parts.iter().enumerate() {
        if !v.is_object() {
            *v = json!({});
        }
        if i + 1 == parts.len() {
            v[*part] = value;
            return;
        }
        v = &mut v[*part];
    }
}

/// A printer column's cell for `obj`, as Kubernetes renders it: dates as they are (kubectl
/// shows their age), other values as JSON scalars, and nothing when the path is absent.
pub fn cell(column: &Column, obj: &Value) -> Value {
    let Some(v) = at_path(obj, &column.path) else {
        return Value::Null;
    };
    match (column.ty.as_str(), v) {
        ("integer", Value::Number(n)) if n.is_i64() || n.is_u64() => v.clone(),
        ("number", Value::Number(_)) | ("boolean", Value::Bool(_)) => v.clone(),
        ("string" | "date", Value::String(_)) => v.clone(),
        (_, Value::String(s)) => json!(s),
        (_, other) => json!(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn crd() -> Value {
        json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": "widgets.example.com"},
            "spec": {
                "group": "example.com",
                "scope": "Namespaced",
                "names": {"plural": "widgets", "kind": "Widget", "shortNames": ["wd"]},
                "versions": [
                    {"name": "v1beta1", "served": true, "storage": false,
                     "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}},
                    {"name": "v1", "served": true, "storage": true,
                     "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                        "spec": {"type": "object", "properties": {"replicas": {"type": "integer"}}},
                        "status": {"type": "object", "properties": {"replicas": {"type": "integer"}}}}}},
                     "subresources": {"status": {}, "scale": {"specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas"}},
                     "additionalPrinterColumns": [{"name": "Replicas", "type": "integer", "jsonPath": ".spec.replicas"}]}
                ]
            }
        })
    }

    #[test]
    fn a_valid_definition_passes_and_its_versions_are_served_in_priority_order() {
        let mut out = Vec::new();
        validate_definition(&crd(), None, &mut out);
        assert!(out.is_empty(), "{out:?}");
        let versions = versions_of(&crd());
        let names: Vec<&str> = versions.iter().map(|v| v.resource.version).collect();
        assert_eq!(names, vec!["v1", "v1beta1"]);
        let v1 = &versions[0];
        assert!(v1.resource.custom && v1.resource.namespaced);
        assert_eq!(v1.resource.singular, "widget");
        assert_eq!(v1.list_kind, "WidgetList");
        assert!(v1.resource.subresources.iter().any(|s| s.name == "scale"));
        assert_eq!(v1.columns[0].name, "Replicas");
        assert_eq!(versions[1].columns[0].name, "Age", "the default column");
        assert!(
            std::ptr::eq(versions_of(&crd())[0].resource, v1.resource),
            "interned once"
        );
    }

    #[test]
    fn definitions_are_refused_naming_the_field() {
        let fields = |crd: Value| -> Vec<String> {
            let mut out = Vec::new();
            validate_definition(&crd, None, &mut out);
            out.into_iter().map(|c| c.field).collect()
        };
        let mut bad = crd();
        bad["metadata"]["name"] = json!("gadgets.example.com");
        assert_eq!(fields(bad), vec!["metadata.name"]);
        let mut bad = crd();
        bad["spec"]["versions"][0]["storage"] = json!(true);
        assert_eq!(fields(bad), vec!["spec.versions"]);
        let mut bad = crd();
        bad["spec"]["group"] = json!("apps");
        bad["metadata"]["name"] = json!("widgets.apps");
        assert_eq!(fields(bad), vec!["spec.group"]);
        let mut bad = crd();
        bad["spec"]["versions"][1]["subresources"]["scale"]["specReplicasPath"] =
            json!(".spec.nope");
        assert_eq!(
            fields(bad),
            vec!["spec.versions[1].subresources.scale.specReplicasPath"]
        );
        let mut bad = crd();
        bad["spec"]["versions"][1]["additionalPrinterColumns"][0]["type"] = json!("float");
        assert_eq!(
            fields(bad),
            vec!["spec.versions[1].additionalPrinterColumns[0].type"]
        );
        let mut bad = crd();
        bad["spec"]["versions"][1]["schema"]["openAPIV3Schema"]["properties"]["spec"] =
            json!({"properties": {}});
        assert_eq!(
            fields(bad),
            vec!["spec.versions[1].schema.openAPIV3Schema.properties[spec].type"]
        );
        let mut changed = crd();
        changed["spec"]["scope"] = json!("Cluster");
        let mut out = Vec::new();
        validate_definition(&changed, Some(&crd()), &mut out);
        assert_eq!(out[0].field, "spec.scope");
    }

    #[test]
    fn the_status_says_established_and_keeps_stored_versions() {
        let mut c = crd();
        prepare(&mut c, None);
        assert_eq!(c["metadata"]["finalizers"], json!([CLEANUP_FINALIZER]));
        assert_eq!(c["status"]["conditions"][1]["type"], "Established");
        assert_eq!(c["status"]["storedVersions"], json!(["v1"]));
        assert_eq!(c["status"]["acceptedNames"]["listKind"], "WidgetList");
        let mut next = crd();
        next["spec"]["versions"][0]["storage"] = json!(true);
        next["spec"]["versions"][1]["storage"] = json!(false);
        prepare(&mut next, Some(&c));
        assert_eq!(next["status"]["storedVersions"], json!(["v1", "v1beta1"]));
    }

    #[test]
    fn versions_sort_as_kubernetes_sorts_them() {
        let mut v = vec![
            "v1alpha1", "foo", "v2", "v1", "v1beta2", "v1beta1", "v10", "v2alpha3",
        ];
        v.sort_by_key(|x| version_priority(x));
        assert_eq!(
            v,
            vec![
                "v10", "v2", "v1", "v1beta2", "v1beta1", "v2alpha3", "v1alpha1", "foo"
            ]
        );
    }

    #[test]
    fn columns_read_simple_json_paths() {
        let obj =
            json!({"spec": {"replicas": 3, "ports": [{"name": "a"}]}, "status": {"ok": true}});
        let col = |path: &str, ty: &str| Column {
            name: "c".into(),
            ty: ty.into(),
            priority: 0,
            description: String::new(),
            path: path.into(),
        };
        assert_eq!(cell(&col(".spec.replicas", "integer"), &obj), json!(3));
        assert_eq!(
            cell(&col(".spec.ports[0].name", "string"), &obj),
            json!("a")
        );
        assert_eq!(cell(&col("{.status.ok}", "boolean"), &obj), json!(true));
        assert_eq!(cell(&col(".spec.nope", "string"), &obj), Value::Null);
        assert!(jsonpath_parts("spec.x").is_none());
        let mut o = json!({});
        set_path(&mut o, ".spec.size", json!(2));
        assert_eq!(o, json!({"spec": {"size": 2}}));
    }
}
