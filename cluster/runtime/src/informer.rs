//! List+watch into a local cache: one informer per resource (and optional selector), shared
//! by every part of a process that reads it (see [`crate::shared`]). It lists in pages,
//! watches from the list's revision, resumes the watch after errors and closed streams, and
//! relists when the revision it resumes from is gone (`410`), turning the difference between
//! what it had and what it found into changes, so its handlers see every object appear,
//! change and go away exactly as if they had watched.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::Metadata;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use parking_lot::RwLock;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::value::RawValue;
use tessera_client::catalog::Resource;
use tessera_client::client::Client;
use tessera_client::request::{ApiRequest, Verb};
use tessera_client::response::WatchEvent;
use tessera_client::status::ApiError;
use tessera_core::selector::label::Operator;
use tessera_core::{FieldSelector, LabelSelector};
use tokio::sync::watch;

use crate::metrics::RuntimeMetrics;

/// A kind an informer can cache: a Kubernetes object with metadata.
pub trait Object: Metadata<Ty = ObjectMeta> + DeserializeOwned + Send + Sync + 'static {}
impl<T: Metadata<Ty = ObjectMeta> + DeserializeOwned + Send + Sync + 'static> Object for T {}

/// The cache key of an object: `namespace/name`, or `name` for cluster-scoped kinds.
pub fn key_of(meta: &ObjectMeta) -> String {
    match meta.namespace.as_deref() {
        Some(ns) if !ns.is_empty() => format!("{ns}/{}", meta.name.as_deref().unwrap_or("")),
        _ => meta.name.clone().unwrap_or_default(),
    }
}

/// Splits a cache key into namespace and name.
pub fn split_key(key: &str) -> (Option<&str>, &str) {
    match key.split_once('/') {
        Some((ns, name)) => (Some(ns), name),
        None => (None, key),
    }
}

/// What happened to an object.
#[derive(Debug)]
pub enum Change<T> {
    /// It appeared (or was found by the first list).
    Added(Arc<T>),
    /// It changed.
    Updated {
        /// Before.
        old: Arc<T>,
        /// After.
        new: Arc<T>,
    },
    /// It went away (its last known state).
    Deleted(Arc<T>),
}

impl<T> Change<T> {
    /// The work-queue class of this change.
    pub fn class(&self) -> crate::queue::EventClass {
        match self {
            Change::Added(_) => crate::queue::EventClass::Add,
            Change::Updated { .. } => crate::queue::EventClass::Update,
            Change::Deleted(_) => crate::queue::EventClass::Delete,
        }
    }

    /// The object's newest known state.
    pub fn object(&self) -> &Arc<T> {
        match self {
            Change::Added(o) | Change::Deleted(o) => o,
            Change::Updated { new, .. } => new,
        }
    }
}

type Handler<T> = Box<dyn Fn(&Change<T>) + Send + Sync>;

/// The handlers of an informer. Its lock is held from a change's write into the cache until
/// every handler has seen it, so a handler added meanwhile sees each object exactly once:
/// either in the replay of the cache or as the change itself.
struct Handlers<T> {
    next_id: u64,
    list: Vec<(u64, Handler<T>)>,
}

/// A handler's registration: the handler is removed when this is dropped (a controller that
/// stops leaves nothing behind in an informer it shared). [`Subscription::detach`] keeps it
/// for the informer's life.
#[must_use = "the handler is removed as soon as its Subscription is dropped"]
pub struct Subscription {
    remove: Option<Box<dyn FnOnce() + Send + Sync>>,
}

impl Subscription {
    /// Keeps the handler for as long as the informer runs.
    pub fn detach(mut self) {
        self.remove = None;
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        if let Some(remove) = self.remove.take() {
            remove();
        }
    }
}

impl std::fmt::Debug for Subscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscription")
            .field("attached", &self.remove.is_some())
            .finish()
    }
}

struct Indexed<T> {
    objects: HashMap<String, Arc<T>>,
    by_namespace: HashMap<String, HashSet<String>>,
    by_owner: HashMap<String, HashSet<String>>,
    by_label: HashMap<(String, String), HashSet<String>>,
}

impl<T: Object> Indexed<T> {
    fn new() -> Self {
        Indexed {
            objects: HashMap::new(),
            by_namespace: HashMap::new(),
            by_owner: HashMap::new(),
            by_label: HashMap::new(),
        }
    }

    fn index(&mut self, key: &str, o: &T, add: bool) {
        let m = o.metadata();
        fn touch<K: std::hash::Hash + Eq>(
            map: &mut HashMap<K, HashSet<String>>,
            k: K,
            key: &str,
            add: bool,
        ) {
            if add {
                map.entry(k).or_default().insert(key.to_owned());
            } else if let Some(set) = map.get_mut(&k) {
                set.remove(key);
                if set.is_empty() {
                    map.remove(&k);
                }
            }
        }
        if let Some(ns) = m.namespace.as_deref() {
            touch(&mut self.by_namespace, ns.to_owned(), key, add);
        }
        for r in m.owner_references.iter().flatten() {
            touch(&mut self.by_owner, r.uid.clone(), key, add);
        }
        for (k, v) in m.labels.iter().flatten() {
            touch(&mut self.by_label, (k.clone(), v.clone()), key, add);
        }
    }

    fn put(&mut self, key: String, o: Arc<T>) -> Option<Arc<T>> {
        let old = self.objects.insert(key.clone(), o.clone());
        if let Some(old) = &old {
            self.index(&key, old, false);
        }
        self.index(&key, &o, true);
        old
    }

    fn remove(&mut self, key: &str) -> Option<Arc<T>> {
        let old = self.objects.remove(key)?;
        self.index(key, &old, false);
        Some(old)
    }
}

/// The local copy of a resource, with indexes by namespace, owner and label. Reads never wait
/// on the API.
pub struct Cache<T> {
    inner: RwLock<Indexed<T>>,
}

impl<T: Object> Default for Cache<T> {
    /// An empty cache no informer fills (for code that reads one, where there is none).
    fn default() -> Self {
        Cache::new()
    }
}

impl<T: Object> Cache<T> {
    pub(crate) fn new() -> Self {
        Cache {
            inner: RwLock::new(Indexed::new()),
        }
    }

    /// Puts an object as an event would (tests of code that reads caches).
    #[cfg(test)]
    pub(crate) fn insert(&self, o: T) {
        let key = key_of(o.metadata());
        self.inner.write().put(key, Arc::new(o));
    }

    /// The object at `key` (`namespace/name` or `name`).
    pub fn get(&self, key: &str) -> Option<Arc<T>> {
        self.inner.read().objects.get(key).cloned()
    }

    /// Every cached object.
    pub fn list(&self) -> Vec<Arc<T>> {
        self.inner.read().objects.values().cloned().collect()
    }

    /// The number of cached objects.
    pub fn len(&self) -> usize {
        self.inner.read().objects.len()
    }

    /// True if nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The objects of one namespace.
    pub fn in_namespace(&self, ns: &str) -> Vec<Arc<T>> {
        let s = self.inner.read();
        s.by_namespace
            .get(ns)
            .into_iter()
            .flatten()
            .filter_map(|k| s.objects.get(k).cloned())
            .collect()
    }

    /// The objects with an owner reference to `uid`.
    pub fn owned_by(&self, uid: &str) -> Vec<Arc<T>> {
        let s = self.inner.read();
        s.by_owner
            .get(uid)
            .into_iter()
            .flatten()
            .filter_map(|k| s.objects.get(k).cloned())
            .collect()
    }

    /// The objects of `ns` (or all namespaces) that `selector` matches. The search walks
    /// the smallest of the indexes that hold every match: the namespace's, or that of one
    /// of the selector's equality requirements (a label every tenant's workloads carry is a
    /// poor narrowing; their namespace a good one).
    pub fn select(&self, ns: Option<&str>, selector: &LabelSelector) -> Vec<Arc<T>> {
        let s = self.inner.read();
        let matches = |o: &T| {
            let m = o.metadata();
            ns.is_none_or(|ns| m.namespace.as_deref() == Some(ns))
                && selector.matches_with(|k| m.labels.as_ref()?.get(k).map(String::as_str))
        };
        let narrowest = selector
            .requirements()
            .iter()
            .filter(|r| {
                matches!(r.operator, Operator::Equals | Operator::In) && r.values.len() == 1
            })
            .filter_map(|r| {
                let v = r.values.first()?;
                Some(
                    s.by_label
                        .get(&(r.key.clone(), v.clone()))
                        .map_or(0, HashSet::len),
                )
                .map(|n| (n, r))
            })
            .min_by_key(|(n, _)| *n);
        let in_ns = ns.map(|ns| s.by_namespace.get(ns).map_or(0, HashSet::len));
        let narrowest = narrowest.filter(|(n, _)| in_ns.is_none_or(|in_ns| *n < in_ns));
        let candidates: Box<dyn Iterator<Item = &String>> = match (narrowest, ns) {
            (Some((_, r)), _) => {
                let v = r.values.first().cloned().unwrap_or_default();
                Box::new(s.by_label.get(&(r.key.clone(), v)).into_iter().flatten())
            }
            (None, Some(ns)) => Box::new(s.by_namespace.get(ns).into_iter().flatten()),
            (None, None) => Box::new(s.objects.keys()),
        };
        candidates
            .filter_map(|k| s.objects.get(k))
            .filter(|o| matches(o))
            .cloned()
            .collect()
    }
}

/// What an informer watches.
#[derive(Clone, Default)]
pub struct Scope {
    /// One namespace, or all.
    pub namespace: Option<String>,
    /// Only objects with these labels.
    pub label_selector: Option<LabelSelector>,
    /// Only objects with these fields.
    pub field_selector: Option<FieldSelector>,
}

/// Lists and watches one resource into a [`Cache`], calling its handlers on every change.
pub struct Informer<T> {
    client: Arc<dyn Client>,
    resource: &'static Resource,
    scope: Scope,
    cache: Arc<Cache<T>>,
    handlers: Arc<parking_lot::Mutex<Handlers<T>>>,
    synced: watch::Sender<bool>,
    metrics: Option<RuntimeMetrics>,
    page: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server that lists nothing at revision 4, then cuts its first watch after the first
    /// of two objects written at revision 5 (one transaction); a resumed watch gets what
    /// comes after the revision it names, as the API's does.
    struct CutServer {
        watches: parking_lot::Mutex<Vec<String>>,
    }

    fn event(name: &str, rv: &str) -> WatchEvent {
        WatchEvent::Value(
            serde_json::json!({"type": "ADDED", "object": {"apiVersion": "v1",
            "kind": "ConfigMap", "metadata": {"name": name, "namespace": "ns", "resourceVersion": rv}}}),
        )
    }

    #[async_trait::async_trait]
    impl Client for CutServer {
        async fn call(
            &self,
            req: ApiRequest,
        ) -> Result<tessera_client::response::ApiResponse, ApiError> {
            use tessera_client::response::ApiResponse;
            if req.verb == Verb::List {
                return Ok(ApiResponse::Object {
                    code: 200,
                    body: serde_json::json!({"metadata": {"resourceVersion": "4"}, "items": []}),
                    warnings: Vec::new(),
                });
            }
            let from = req.params.resource_version.clone().unwrap_or_default();
            let first = {
                let mut w = self.watches.lock();
                w.push(from.clone());
                w.len() == 1
            };
            let all = [("a", "5"), ("b", "5"), ("c", "6")];
            let events: Vec<WatchEvent> = if first {
                vec![event("a", "5")]
            } else {
                let from: i64 = from.parse().unwrap_or(0);
                all.iter()
                    .filter(|(_, rv)| rv.parse::<i64>().unwrap_or(0) > from)
                    .map(|(n, rv)| event(n, rv))
                    .collect()
            };
            let stream = futures::stream::iter(events);
            Ok(ApiResponse::Watch(if first {
                Box::pin(stream)
            } else {
                Box::pin(stream.chain(futures::stream::pending()))
            }))
        }
    }

    /// A watch cut between two objects of one revision resumes before that revision: the
    /// second object is not lost, and the first, seen twice, is added once.
    #[tokio::test]
    async fn a_watch_cut_inside_a_revision_loses_nothing() {
        use k8s_openapi::api::core::v1::ConfigMap;
        let server = Arc::new(CutServer {
            watches: parking_lot::Mutex::new(Vec::new()),
        });
        let configmaps = tessera_client::catalog::RESOURCES
            .iter()
            .find(|r| r.plural == "configmaps")
            .expect("configmaps");
        let informer: Arc<Informer<ConfigMap>> =
            Informer::new(server.clone(), configmaps, Scope::default(), None);
        let added = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let seen = added.clone();
        let _sub = informer.on_change(move |c| {
            if let Change::Added(o) = c {
                seen.lock()
                    .push(o.metadata.name.clone().unwrap_or_default());
            }
        });
        let run = tokio::spawn(informer.clone().run());
        for _ in 0..200 {
            if informer.cache().get("ns/c").is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        run.abort();
        assert!(informer.cache().get("ns/c").is_some(), "the watch resumed");
        assert!(
            informer.cache().get("ns/b").is_some(),
            "b, written with a at revision 5, was lost: resumed from {:?}",
            server.watches.lock()
        );
        assert_eq!(*added.lock(), ["a", "b", "c"], "each added once");
        assert_eq!(server.watches.lock()[1], "4", "resumed before revision 5");
    }

    /// `select` finds exactly what a scan of every object finds, whichever index it walks:
    /// namespaces small or large against labels common or rare.
    #[test]
    fn selecting_through_any_index_finds_what_a_scan_finds() {
        use k8s_openapi::api::core::v1::ConfigMap;
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
        let cache: Cache<ConfigMap> = Cache::new();
        let mut all = Vec::new();
        for i in 0..400u32 {
            // 40 namespaces of 10; every object `app=bench`; `tier` splits them 1:3:
            // `rare` on one object in 20.
            let mut labels = BTreeMap::from([
                ("app".to_owned(), "bench".to_owned()),
                (
                    "tier".to_owned(),
                    if i % 4 == 0 { "db" } else { "web" }.to_owned(),
                ),
            ]);
            if i % 20 == 0 {
                labels.insert("rare".into(), "yes".into());
            }
            let o = ConfigMap {
                metadata: ObjectMeta {
                    name: Some(format!("o{i}")),
                    namespace: Some(format!("ns{}", i % 40)),
                    labels: Some(labels),
                    ..ObjectMeta::default()
                },
                ..ConfigMap::default()
            };
            all.push(o.clone());
            cache.insert(o);
        }
        let selectors = [
            "app=bench",
            "app=bench,tier=db",
            "tier=web",
            "rare=yes",
            "app=bench,rare=yes",
            "tier in (db)",
            "tier!=db",
            "app=none",
            "",
        ];
        for text in selectors {
            let selector: LabelSelector = text.parse().expect("selector");
            for ns in [None, Some("ns0"), Some("ns7"), Some("nowhere")] {
                let mut got: Vec<String> = cache
                    .select(ns, &selector)
                    .iter()
                    .filter_map(|o| o.metadata.name.clone())
                    .collect();
                let mut want: Vec<String> = all
                    .iter()
                    .filter(|o| ns.is_none_or(|ns| o.metadata.namespace.as_deref() == Some(ns)))
                    .filter(|o| {
                        selector.matches_with(|k| {
                            o.metadata.labels.as_ref()?.get(k).map(String::as_str)
                        })
                    })
                    .filter_map(|o| o.metadata.name.clone())
                    .collect();
                got.sort();
                want.sort();
                assert_eq!(got, want, "{text:?} in {ns:?}");
            }
        }
    }

    #[test]
    fn managed_fields_are_cut_and_nothing_else() {
        let cases = [
            (
                r#"{"metadata":{"name":"a","managedFields":[{"f":{"x":"]"}}],"uid":"u"}}"#,
                r#"{"metadata":{"name":"a","uid":"u"}}"#,
            ),
            (
                r#"{"metadata":{"managedFields":[{"a":"\"]"}],"name":"a"}}"#,
                r#"{"metadata":{"name":"a"}}"#,
            ),
            (
                r#"{"metadata":{"name":"a","managedFields":[]}}"#,
                r#"{"metadata":{"name":"a"}}"#,
            ),
            (
                r#"{"metadata":{"annotations":{"x":"{\"managedFields\":[1]}"}}}"#,
                r#"{"metadata":{"annotations":{"x":"{\"managedFields\":[1]}"}}}"#,
            ),
            (r#"{"a":1}"#, r#"{"a":1}"#),
        ];
        for (input, want) in cases {
            let got = strip_managed_fields(input);
            assert_eq!(got, want, "{input}");
            let _: serde_json::Value = serde_json::from_str(&got).expect("still JSON");
        }
    }
}

#[derive(Deserialize)]
struct RawEvent<'a> {
    #[serde(rename = "type")]
    kind: &'a str,
    #[serde(borrow)]
    object: &'a RawValue,
}

#[derive(Deserialize)]
struct ListMeta {
    #[serde(default, rename = "resourceVersion")]
    resource_version: String,
    #[serde(default, rename = "continue")]
    continue_token: Option<String>,
}

#[derive(Deserialize)]
struct List<T> {
    metadata: ListMeta,
    #[serde(default = "Vec::new")]
    items: Vec<T>,
}

#[derive(Deserialize)]
struct Bookmark {
    metadata: BookmarkMeta,
}

#[derive(Deserialize)]
struct BookmarkMeta {
    #[serde(rename = "resourceVersion")]
    resource_version: String,
}

/// Why a watch stopped.
enum Stop {
    /// The revision to resume from is compacted: list again.
    Gone,
    /// The stream ended or failed: watch again from the last revision seen.
    Resume,
}

impl<T: Object> Informer<T> {
    /// An informer of `resource` within `scope`.
    pub fn new(
        client: Arc<dyn Client>,
        resource: &'static Resource,
        scope: Scope,
        metrics: Option<RuntimeMetrics>,
    ) -> Arc<Self> {
        Arc::new(Informer {
            client,
            resource,
            scope,
            cache: Arc::new(Cache::new()),
            handlers: Arc::new(parking_lot::Mutex::new(Handlers {
                next_id: 0,
                list: Vec::new(),
            })),
            synced: watch::channel(false).0,
            metrics,
            page: 500,
        })
    }

    /// Its cache.
    pub fn cache(&self) -> &Arc<Cache<T>> {
        &self.cache
    }

    /// The resource it watches.
    pub fn resource(&self) -> &'static Resource {
        self.resource
    }

    /// Calls `f` on every change, in order, from the watch task, until the returned
    /// [`Subscription`] is dropped: `f` must be quick (queue a key, send on a channel), never
    /// wait, and never add or drop a handler itself. Objects already cached reach `f` first,
    /// as additions — so a handler added to a running, shared informer sees what one added
    /// before its first list would have seen.
    pub fn on_change(&self, f: impl Fn(&Change<T>) + Send + Sync + 'static) -> Subscription {
        let mut handlers = self.handlers.lock();
        for o in self.cache.list() {
            f(&Change::Added(o));
        }
        let id = handlers.next_id;
        handlers.next_id += 1;
        handlers.list.push((id, Box::new(f)));
        let count = handlers.list.len();
        drop(handlers);
        self.count_handlers(count);
        let weak = Arc::downgrade(&self.handlers);
        let metrics = self.metrics.clone();
        let plural = self.resource.plural;
        Subscription {
            remove: Some(Box::new(move || {
                if let Some(handlers) = weak.upgrade() {
                    let mut h = handlers.lock();
                    h.list.retain(|(i, _)| *i != id);
                    if let Some(m) = &metrics {
                        m.informer_handlers
                            .with_label_values(&[plural])
                            .set(h.list.len() as i64);
                    }
                }
            })),
        }
    }

    fn count_handlers(&self, n: usize) {
        if let Some(m) = &self.metrics {
            m.informer_handlers
                .with_label_values(&[self.resource.plural])
                .set(n as i64);
        }
    }

    /// The number of handlers now registered.
    pub fn handler_count(&self) -> usize {
        self.handlers.lock().list.len()
    }

    /// Waits until the first list is in the cache.
    pub async fn synced(&self) {
        let mut rx = self.synced.subscribe();
        let _ = rx.wait_for(|s| *s).await;
    }

    /// True once the first list is in the cache.
    pub fn has_synced(&self) -> bool {
        *self.synced.borrow()
    }

    fn request(&self, verb: Verb) -> ApiRequest {
        let mut req = ApiRequest::new(verb, self.resource);
        req.namespace = self.scope.namespace.clone();
        req.params.label_selector = self.scope.label_selector.clone();
        req.params.field_selector = self.scope.field_selector.clone();
        req
    }

    fn emit(handlers: &Handlers<T>, change: &Change<T>) {
        for (_, h) in &handlers.list {
            h(change);
        }
    }

    fn count(&self, what: &str) {
        if let Some(m) = &self.metrics {
            m.informer_events
                .with_label_values(&[self.resource.plural, what])
                .inc();
        }
    }

    /// Runs until the task is dropped: list, watch, resume, relist.
    pub async fn run(self: Arc<Self>) {
        let mut backoff = Duration::from_millis(100);
        loop {
            let rv = match self.relist().await {
                Ok(rv) => rv,
                Err(e) => {
                    tracing::warn!(resource = self.resource.plural, error = %e.message, "list failed; retrying");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(10));
                    continue;
                }
            };
            backoff = Duration::from_millis(100);
            let mut rv = rv;
            loop {
                match self.watch_from(&mut rv).await {
                    Ok(Stop::Resume) => {}
                    Ok(Stop::Gone) => break,
                    Err(e) if e.code == 410 => break,
                    Err(e) => {
                        tracing::warn!(resource = self.resource.plural, error = %e.message, "watch failed; resuming");
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(Duration::from_secs(10));
                    }
                }
            }
            if let Some(m) = &self.metrics {
                m.relists.with_label_values(&[self.resource.plural]).inc();
            }
            tracing::info!(
                resource = self.resource.plural,
                "watch revision compacted; listing again"
            );
        }
    }

    /// Lists everything in pages, replaces the cache with it, and emits the difference.
    async fn relist(&self) -> Result<String, ApiError> {
        let mut found: HashMap<String, Arc<T>> = HashMap::new();
        let mut token: Option<String> = None;
        let rv = loop {
            let mut req = self.request(Verb::List);
            req.params.limit = self.page;
            req.params.continue_token = token.take();
            let mut v = self.client.list(req).await?;
            for item in v["items"].as_array_mut().into_iter().flatten() {
                if let Some(m) = item["metadata"].as_object_mut() {
                    m.remove("managedFields");
                }
            }
            let list: List<T> = serde_json::from_value(v).map_err(|e| {
                ApiError::internal(format!("a {} list did not decode: {e}", self.resource.kind))
            })?;
            for o in list.items {
                found.insert(key_of(o.metadata()), Arc::new(o));
            }
            match list.metadata.continue_token.filter(|t| !t.is_empty()) {
                Some(t) => token = Some(t),
                None => break list.metadata.resource_version,
            }
        };
        let handlers = self.handlers.lock();
        let mut changes = Vec::new();
        {
            let mut s = self.cache.inner.write();
            let gone: Vec<String> = s
                .objects
                .keys()
                .filter(|k| !found.contains_key(*k))
                .cloned()
                .collect();
            for k in gone {
                if let Some(old) = s.remove(&k) {
                    changes.push(Change::Deleted(old));
                }
            }
            for (k, o) in found {
                let changed = match s.objects.get(&k) {
                    Some(old) => old.metadata().resource_version != o.metadata().resource_version,
                    None => true,
                };
                if changed {
                    match s.put(k, o.clone()) {
                        Some(old) => changes.push(Change::Updated { old, new: o }),
                        None => changes.push(Change::Added(o)),
                    }
                }
            }
        }
        for c in &changes {
            Self::emit(&handlers, c);
        }
        drop(handlers);
        self.synced.send_replace(true);
        Ok(rv)
    }

    async fn watch_from(&self, rv: &mut String) -> Result<Stop, ApiError> {
        let mut req = self.request(Verb::Watch);
        req.params.resource_version = Some(rv.clone());
        req.params.allow_bookmarks = true;
        req.params.timeout_seconds = Some(300 + rand::random::<u64>() % 300);
        let mut stream = self.client.watch(req).await?;
        // The revision of the last event, not yet known complete: the objects written in one
        // transaction share a revision (batched creates and bindings), so a watch cut between
        // two of them must resume before it, not after. `rv` moves to a revision once a later
        // one (or a bookmark) shows that all of its events arrived; events seen twice after
        // such a resume are dropped by `apply`.
        let mut open: Option<String> = None;
        while let Some(ev) = stream.next().await {
            let line = match ev {
                WatchEvent::Encoded(b) => b,
                WatchEvent::Value(v) => bytes::Bytes::from(v.to_string()),
            };
            let raw: RawEvent = serde_json::from_slice(&line)
                .map_err(|e| ApiError::internal(format!("a watch event did not decode: {e}")))?;
            match raw.kind {
                "ADDED" | "MODIFIED" | "DELETED" => {
                    let text = strip_managed_fields(raw.object.get());
                    let o: T = serde_json::from_str(&text).map_err(|e| {
                        ApiError::internal(format!(
                            "a watched {} did not decode: {e}",
                            self.resource.kind
                        ))
                    })?;
                    if let Some(v) = o.metadata().resource_version.as_deref()
                        && open.as_deref() != Some(v)
                        && let Some(done) = open.replace(v.to_owned())
                    {
                        *rv = done;
                    }
                    self.apply(raw.kind, o);
                }
                "BOOKMARK" => {
                    if let Ok(b) = serde_json::from_str::<Bookmark>(raw.object.get()) {
                        *rv = b.metadata.resource_version;
                        open = None;
                    }
                    self.count("bookmark");
                }
                _ => {
                    let status: serde_json::Value =
                        serde_json::from_str(raw.object.get()).unwrap_or_default();
                    if status["code"].as_u64() == Some(410) {
                        return Ok(Stop::Gone);
                    }
                    return Err(ApiError::internal(format!(
                        "the watch answered an error: {}",
                        status["message"].as_str().unwrap_or("(no message)")
                    )));
                }
            }
        }
        Ok(Stop::Resume)
    }

    fn apply(&self, kind: &str, o: T) {
        let key = key_of(o.metadata());
        let o = Arc::new(o);
        let handlers = self.handlers.lock();
        let change = {
            let mut s = self.cache.inner.write();
            if kind == "DELETED" {
                s.remove(&key).map(|_| Change::Deleted(o))
            } else if s.objects.get(&key).is_some_and(|old| {
                old.metadata().resource_version.is_some()
                    && old.metadata().resource_version == o.metadata().resource_version
            }) {
                // The same write again (a watch resumed before a revision it had partly seen).
                None
            } else {
                Some(match s.put(key, o.clone()) {
                    Some(old) => Change::Updated { old, new: o },
                    None => Change::Added(o),
                })
            }
        };
        self.count(match kind {
            "ADDED" => "added",
            "MODIFIED" => "modified",
            _ => "deleted",
        });
        if let Some(c) = change {
            Self::emit(&handlers, &c);
        }
    }
}

/// `json` without its `"managedFields":[...]` members: what an informer caches never needs
/// them (client-go's informers drop them too), and they are most of a small object's bytes.
/// Only a member key can match — inside string values quotes are escaped.
pub fn strip_managed_fields(json: &str) -> std::borrow::Cow<'_, str> {
    const KEY: &str = "\"managedFields\":";
    if !json.contains(KEY) {
        return std::borrow::Cow::Borrowed(json);
    }
    let b = json.as_bytes();
    let mut out = String::with_capacity(json.len());
    let mut from = 0;
    let mut search = 0;
    while let Some(rel) = json[search..].find(KEY) {
        let start = search + rel;
        let value = start + KEY.len();
        let prev = json[..start].trim_end().as_bytes().last().copied();
        if !matches!(prev, Some(b'{' | b',')) || b.get(value) != Some(&b'[') {
            search = value;
            continue;
        }
        // Find the end of the array, skipping strings.
        let (mut depth, mut i, mut in_str, mut esc) = (0i32, value, false, false);
        while i < b.len() {
            let c = b[i];
            if in_str {
                if esc {
                    esc = false;
                } else if c == b'\\' {
                    esc = true;
                } else if c == b'"' {
                    in_str = false;
                }
            } else if c == b'"' {
                in_str = true;
            } else if c == b'[' || c == b'{' {
                depth += 1;
            } else if c == b']' || c == b'}' {
                depth -= 1;
                if depth == 0 {
                    break;
                }
            }
            i += 1;
        }
        let mut end = i + 1;
        let mut cut = start;
        if prev == Some(b',') {
            cut = json[..start].trim_end().len() - 1;
        } else if b.get(end) == Some(&b',') {
            end += 1;
        }
        out.push_str(&json[from..cut]);
        from = end.min(json.len());
        search = from;
    }
    out.push_str(&json[from..]);
    std::borrow::Cow::Owned(out)
}

/// Labels as a map, for code that reads them often.
pub fn labels_of(meta: &ObjectMeta) -> &BTreeMap<String, String> {
    static EMPTY: BTreeMap<String, String> = BTreeMap::new();
    meta.labels.as_ref().unwrap_or(&EMPTY)
}

/// The cache key (`namespace/name`) of the object's controller owner, if it is a `kind`.
pub fn owner_key(meta: &ObjectMeta, kind: &str) -> Option<String> {
    controller_of(meta)
        .filter(|o| o.kind == kind)
        .map(|o| format!("{}/{}", meta.namespace.as_deref().unwrap_or(""), o.name))
}

/// Tasks that stop when this is dropped (a component's informers).
pub struct Tasks(pub Vec<tokio::task::JoinHandle<()>>);

impl Drop for Tasks {
    fn drop(&mut self) {
        for t in &self.0 {
            t.abort();
        }
    }
}

/// The controller owner of an object (the owner reference with `controller: true`).
pub fn controller_of(
    meta: &ObjectMeta,
) -> Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference> {
    meta.owner_references
        .iter()
        .flatten()
        .find(|r| r.controller == Some(true))
}

/// Implements what an informer needs for a type that stands for objects of any kind (read
/// by the resource an informer is given, not by constants of the type).
macro_rules! any_kind {
    ($name:ident) => {
        impl k8s_openapi::Resource for $name {
            const API_VERSION: &'static str = "";
            const GROUP: &'static str = "";
            const KIND: &'static str = "";
            const VERSION: &'static str = "";
            const URL_PATH_SEGMENT: &'static str = "";
            type Scope = k8s_openapi::SubResourceScope;
        }

        impl Metadata for $name {
            type Ty = ObjectMeta;
            fn metadata(&self) -> &ObjectMeta {
                &self.metadata
            }
            fn metadata_mut(&mut self) -> &mut ObjectMeta {
                &mut self.metadata
            }
        }
    };
}

/// Any object, with only its metadata decoded (what the garbage collector and the namespace
/// controller need of every kind).
#[derive(Debug, Clone, Default, serde::Deserialize)]
pub struct PartialObject {
    /// The object's metadata.
    #[serde(default)]
    pub metadata: ObjectMeta,
}

any_kind!(PartialObject);

/// Any object of a kind that has a spec and a status, with its metadata decoded and the rest
/// kept as JSON: what the federation's controller and agent need of the several workload
/// kinds they handle alike.
#[derive(Debug, Clone, Default, serde::Deserialize, serde::Serialize)]
pub struct SpecObject {
    /// The object's metadata.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// Its spec.
    #[serde(default)]
    pub spec: serde_json::Value,
    /// Its status.
    #[serde(default)]
    pub status: serde_json::Value,
}

any_kind!(SpecObject);

/// An object of any kind, whole: its metadata decoded and every other top-level field kept
/// as JSON (custom objects, whose fields only their CRD's schema knows).
#[derive(Debug, Clone, Default, serde::Deserialize, serde::Serialize)]
pub struct WholeObject {
    /// The object's metadata.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// Every other top-level field (`apiVersion`, `kind`, `spec`, `status`, ...).
    #[serde(flatten)]
    pub fields: serde_json::Map<String, serde_json::Value>,
}

any_kind!(WholeObject);
