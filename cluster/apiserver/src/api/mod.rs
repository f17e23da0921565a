//! The request path, as a layer of its own: authorize → decode → admit → store → encode.
//! The HTTP server wraps it (`http.rs`); in-process components call [`Api::handle`] directly
//! through the [`crate::client`] trait.
//!
//! Objects are stored as JSON under Kubernetes' key layout. Every body is decoded into the
//! kind's real type (`k8s-openapi`), so that what is kept is exactly what clients expect;
//! fields the type does not have are dropped, warned about or refused (`fieldValidation`).

mod across;
pub mod admission;
mod agents;
mod allocator;
mod bindings;
mod conversion;
mod custom;
mod delete;
mod group;
mod logs;
pub mod pod_security;
mod policies;
mod priority;
mod rbac_writes;
mod read;
pub mod resource_metrics;
mod streams;
mod subresources;
mod tenant_quota;
mod views;
mod webhooks;
mod write;

use crate::quota::{qos_class, quantity_json, quantity_map};
pub use agents::NodeProxy;
pub(crate) use subresources::selects;
use subresources::{from_scale, to_scale, to_scale_plain};

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;
use serde_json::{Value, json};
use tessera_core::keys;
use tessera_core::quantity::Quantity;
use tessera_store::continuation::Cursor;
use tessera_store::{KeyValue, ListRequest, Op, Revision, Store, StoreError};

use crate::auth::{Authorizer, User};
use crate::catalog::Resource;
use crate::fairness::Fairness;
use crate::kinds;
use crate::metrics::ApiMetrics;
use crate::request::{ApiRequest, Decoded, FieldValidation, PatchType, Propagation, Verb};
use crate::status::{ApiError, Cause};
use crate::watchcache::WatchCache;
use crate::{apply, order, patch, table, validation};

pub use tessera_client::response::{ApiResponse, ByteStream, WatchEvent, WatchStream};
pub use tessera_core::time::{now_secs, rfc3339, rfc3339_micro_now};

/// A watch event as one JSON line (`{"type":…,"object":…}` and a newline), the object in
/// Kubernetes' field order.
pub fn watch_line(ev: WatchEvent) -> Bytes {
    match ev {
        WatchEvent::Encoded(b) => b,
        WatchEvent::Value(v) => {
            let mut line = Vec::with_capacity(256);
            line.extend_from_slice(br#"{"type":"#);
            line.extend_from_slice(v["type"].to_string().as_bytes());
            line.extend_from_slice(br#","object":"#);
            line.extend_from_slice(order::to_string(&v["object"]).as_bytes());
            line.extend_from_slice(b"}\n");
            Bytes::from(line)
        }
    }
}

/// The finalizer that holds an object while its dependents are deleted first.
pub const FOREGROUND_FINALIZER: &str = "foregroundDeletion";
/// The finalizer that makes the garbage collector orphan the dependents.
pub const ORPHAN_FINALIZER: &str = "orphan";
/// How often an idle watch that asked for bookmarks gets one.
const BOOKMARK_EVERY: Duration = Duration::from_secs(5);

/// The API: the store plus the policies around it.
#[derive(Clone)]
pub struct Api {
    store: Arc<dyn Store>,
    authorizer: Authorizer,
    fairness: Fairness,
    metrics: Option<ApiMetrics>,
    watch_cache: WatchCache,
    tenants: Arc<parking_lot::Mutex<tenant_quota::CachedList>>,
    priority_classes: Arc<parking_lot::Mutex<tenant_quota::CachedList>>,
    node_proxy: Option<NodeProxy>,
    /// Signs ServiceAccount tokens (`serviceaccounts/token`).
    token_issuer: Option<crate::auth::Tokens>,
    /// The process's metrics, served whole to the admin at `/metrics` on the API port.
    metrics_registry: Option<prometheus::Registry>,
    /// At the federation: the shards that pods, nodes and events are read across.
    shards: Option<Arc<dyn tessera_client::client::ShardSet>>,
    /// `pods/binding` requests waiting to be written together.
    binds: Arc<group::Group<bindings::Pending>>,
    /// Single conditional writes (creates, updates, deletes) waiting to be written together.
    writes: Arc<group::Group<group::PendingWrite>>,
    /// What a create needs of its namespace, by name, at the revision it was decoded from.
    namespaces: Arc<parking_lot::Mutex<std::collections::HashMap<String, NamespaceFacts>>>,
    /// The NoExecute tolerations every new pod gets unless it has its own.
    default_tolerations: admission::DefaultTolerations,
    /// The CustomResourceDefinitions served.
    crds: crate::crd::Crds,
    /// The admission webhooks called.
    webhooks: crate::webhooks::Webhooks,
    /// The APIServices served by extension API servers.
    aggregator: crate::aggregator::Aggregator,
    /// Set by a process that serves only while it leads (a standby federation): `/readyz`
    /// fails while it is false, so a Service sends nothing to a standby.
    ready_gate: Option<Arc<std::sync::atomic::AtomicBool>>,
}

/// What a create checks of its namespace: whether it is terminating, and its labels (for
/// pod security). Kept per namespace with the revision they were read at, so a create
/// decodes its namespace only after the namespace changed.
#[derive(Clone)]
pub(super) struct NamespaceFacts {
    revision: i64,
    terminating: bool,
    labels: Value,
}

/// Namespaces remembered at most (the map is emptied when it grows past this).
const NAMESPACES_REMEMBERED: usize = 16_384;

pub(crate) fn uid() -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let b: [u8; 16] = rand::random();
    let h: String = b
        .iter()
        .flat_map(|x| [HEX[usize::from(x >> 4)], HEX[usize::from(x & 15)]])
        .map(char::from)
        .collect();
    format!(
        "{}-{}-4{}-a{}-{}",
        &h[0..8],
        &h[8..12],
        &h[13..16],
        &h[17..20],
        &h[20..32]
    )
}

/// `apiVersion` of a resource (`v1`, `apps/v1`).
pub fn api_version(res: &Resource) -> String {
    if res.group.is_empty() {
        res.version.to_owned()
    } else {
        format!("{}/{}", res.group, res.version)
    }
}

/// The store key of an object.
pub fn object_key(res: &Resource, ns: Option<&str>, name: &str) -> String {
    keys::object_key(&keys::resource_segment(res.group, res.plural), ns, name)
}

fn prefix(res: &Resource, ns: Option<&str>) -> String {
    keys::resource_prefix(&keys::resource_segment(res.group, res.plural), ns)
}

pub(crate) fn store_error(e: StoreError) -> ApiError {
    match &e {
        StoreError::Compacted { .. } => ApiError::gone(format!(
            "the resourceVersion is too old ({e}): list again to get a current one"
        )),
        StoreError::FutureRevision { .. } => {
            ApiError::new(504, "Timeout", format!("Too large resource version: {e}"))
        }
        StoreError::Unavailable { .. } => {
            let mut err = ApiError::new(
                503,
                "ServiceUnavailable",
                format!("storage is unavailable: {e}"),
            );
            err.retry_after = Some(1);
            err
        }
        _ if e.is_invalid_input() => ApiError::bad_request(e.to_string()),
        _ => ApiError::internal(format!("storage: {e}")),
    }
}

/// Sets the object's resourceVersion from the store's mod revision.
fn with_rv(mut obj: Value, mod_revision: i64) -> Value {
    obj["metadata"]["resourceVersion"] = json!(mod_revision.to_string());
    obj
}

fn decode_stored(kv: &KeyValue) -> Result<Value, ApiError> {
    let obj: Value = serde_json::from_slice(&kv.value)
        .map_err(|e| ApiError::internal(format!("stored object is not JSON: {e}")))?;
    Ok(with_rv(obj, kv.mod_revision))
}

/// The stored form of an object: JSON in Kubernetes' field order, without nulls, with
/// `metadata.resourceVersion` empty — the revision is unknown until the write commits and is
/// spliced in when the object is read (so lists and watches copy stored bytes instead of
/// decoding and encoding objects).
fn encode(obj: &Value) -> Result<Bytes, ApiError> {
    if !obj["metadata"].is_object() {
        return Err(ApiError::internal("an object to store has no metadata"));
    }
    let mut out = Vec::with_capacity(512);
    order::write_stored(&mut out, obj).map_err(|e| ApiError::internal(e.to_string()))?;
    Ok(Bytes::from(out))
}

/// An object as a client sees it, from its stored bytes: the resourceVersion spliced in.
fn render(value: &[u8], rev: i64, out: &mut Vec<u8>) -> Result<(), ApiError> {
    if let Some(at) = order::stored_rv_offset(value) {
        out.extend_from_slice(&value[..at]);
        out.extend_from_slice(rev.to_string().as_bytes());
        out.extend_from_slice(&value[at..]);
        Ok(())
    } else {
        let obj: Value = serde_json::from_slice(value)
            .map_err(|e| ApiError::internal(format!("stored object is not JSON: {e}")))?;
        order::write(out, &with_rv(obj, rev)).map_err(|e| ApiError::internal(e.to_string()))
    }
}

/// A watch event line for a stored object: `{"type":"ADDED","object":{...}}` and a newline.
fn event_line(ty: &str, value: &[u8], rev: i64) -> Result<Bytes, ApiError> {
    let mut out = Vec::with_capacity(value.len() + 48);
    out.extend_from_slice(br#"{"type":""#);
    out.extend_from_slice(ty.as_bytes());
    out.extend_from_slice(br#"","object":"#);
    render(value, rev, &mut out)?;
    out.extend_from_slice(b"}\n");
    Ok(Bytes::from(out))
}

fn write_str(out: &mut Vec<u8>, s: &str) -> Result<(), ApiError> {
    serde_json::to_writer(&mut *out, s).map_err(|e| ApiError::internal(e.to_string()))
}

fn name_of(obj: &Value) -> &str {
    obj["metadata"]["name"].as_str().unwrap_or_default()
}

fn has_status(res: &Resource) -> bool {
    res.subresources.iter().any(|s| s.name == "status")
}

impl Api {
    /// An API over `store` with the default policies.
    pub fn new(store: Arc<dyn Store>, metrics: Option<ApiMetrics>) -> Api {
        Api {
            authorizer: Authorizer::new(store.clone(), metrics.clone()),
            fairness: Fairness::new(metrics.clone()),
            watch_cache: WatchCache::new(
                store.clone(),
                Arc::new(|ty: &str, value: &[u8], rev: i64| event_line(ty, value, rev).ok()),
            ),
            crds: crate::crd::Crds::new(store.clone(), metrics.clone()),
            webhooks: crate::webhooks::Webhooks::new(store.clone()),
            aggregator: crate::aggregator::Aggregator::new(store.clone()),
            store,
            metrics,
            tenants: Arc::default(),
            priority_classes: Arc::default(),
            binds: Arc::default(),
            writes: Arc::default(),
            namespaces: Arc::default(),
            node_proxy: None,
            token_issuer: None,
            metrics_registry: None,
            shards: None,
            default_tolerations: admission::DefaultTolerations::default(),
            ready_gate: None,
        }
    }

    /// The same API, giving each new pod that does not say otherwise these seconds of
    /// toleration of its node being not ready and unreachable (kube-apiserver's
    /// `--default-not-ready-toleration-seconds` and `--default-unreachable-toleration-seconds`;
    /// 300 each unless set).
    pub fn with_default_toleration_seconds(mut self, not_ready: i64, unreachable: i64) -> Api {
        self.default_tolerations = admission::DefaultTolerations {
            not_ready,
            unreachable,
        };
        self
    }

    /// The aggregation layer: the APIServices served by extension API servers.
    pub fn aggregator(&self) -> &crate::aggregator::Aggregator {
        &self.aggregator
    }

    /// Counts a request proxied to APIService `name`'s extension server.
    pub(crate) fn observe_aggregated(&self, name: &str, code: u16, started: std::time::Instant) {
        if let Some(m) = &self.metrics {
            m.aggregated_requests
                .with_label_values(&[name, &code.to_string()])
                .inc();
            m.aggregated_duration
                .with_label_values(&[name])
                .observe(started.elapsed().as_secs_f64());
        }
    }

    /// The tokens this API issues and checks (`TokenReview`), if it was given them.
    pub(crate) fn tokens(&self) -> Option<&crate::auth::Tokens> {
        self.token_issuer.as_ref()
    }

    /// This API's metrics, if they are served.
    pub(crate) fn metrics(&self) -> Option<&ApiMetrics> {
        self.metrics.as_ref()
    }

    /// The same API, reaching node agents (for `pods/log`) with credentials rooted in
    /// `tokens`, and issuing ServiceAccount tokens signed with their key.
    pub fn with_node_proxy(mut self, tokens: crate::auth::Tokens) -> Api {
        self.token_issuer = Some(tokens.clone());
        self.node_proxy = Some(NodeProxy::new(tokens));
        self
    }

    /// The same API, serving `registry` at `/metrics` to the admin token.
    pub fn with_metrics_registry(mut self, registry: prometheus::Registry) -> Api {
        self.metrics_registry = Some(registry);
        self
    }

    /// The CustomResourceDefinitions this API serves, as of now (read on first use).
    pub async fn served(&self) -> Result<Arc<crate::crd::Snapshot>, ApiError> {
        self.crds.snapshot().await
    }

    /// Every metric of the process (tenant labels included), if this API serves them.
    pub fn metrics_registry(&self) -> Option<&prometheus::Registry> {
        self.metrics_registry.as_ref()
    }

    /// The same API without a watch cache: each watch reads the store itself
    /// (`tessera apiserver --watch-cache=false`).
    pub fn without_watch_cache(mut self) -> Api {
        self.watch_cache = self.watch_cache.disabled();
        self
    }

    /// The authorizer (for access reviews).
    pub fn authorizer(&self) -> &Authorizer {
        &self.authorizer
    }

    /// The store behind the API.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// The same API, ready (`/readyz`) only while `gate` is true.
    pub fn with_ready_gate(mut self, gate: Arc<std::sync::atomic::AtomicBool>) -> Api {
        self.ready_gate = Some(gate);
        self
    }

    /// Why the API is not ready to take requests through a load balancer, if it is not:
    /// a standby that does not lead.
    pub fn not_ready_because(&self) -> Option<&'static str> {
        let gate = self.ready_gate.as_ref()?;
        (!gate.load(std::sync::atomic::Ordering::Acquire))
            .then_some("standby: another process leads")
    }

    /// Serves one request for `user`.
    pub async fn handle(&self, user: &User, req: ApiRequest) -> Result<ApiResponse, ApiError> {
        self.handle_seated(user, req, None).await
    }

    /// A seat of `user`'s, taken before anything of its request (its body) is read.
    pub async fn early_seat(&self, user: &User) -> Result<crate::fairness::Seat, ApiError> {
        let limit = self.authorizer.seats(user).await?;
        self.fairness.admit(user, limit)
    }

    /// [`Api::handle`] on a seat already taken ([`Api::early_seat`]).
    pub async fn handle_seated(
        &self,
        user: &User,
        req: ApiRequest,
        seat: Option<crate::fairness::Seat>,
    ) -> Result<ApiResponse, ApiError> {
        self.handle_holding(user, req, seat).await.0
    }

    /// [`Api::handle_seated`], giving back the seat the request held (none for a watch), for
    /// the caller to keep while it writes the answer: a client that reads slowly keeps its
    /// own seats busy, not the server's memory.
    pub async fn handle_holding(
        &self,
        user: &User,
        req: ApiRequest,
        seat: Option<crate::fairness::Seat>,
    ) -> (Result<ApiResponse, ApiError>, Option<crate::fairness::Seat>) {
        let started = Instant::now();
        let verb = req.verb;
        let resource = req.resource;
        let sub = req.subresource.clone();
        let mut seat = seat;
        let result = self.handle_inner(user, req, &mut seat).await;
        if let Some(m) = &self.metrics {
            let code = match &result {
                Ok(ApiResponse::Object { code, .. }) => *code,
                Ok(ApiResponse::Watch(_) | ApiResponse::Stream { .. }) => 200,
                Ok(ApiResponse::Encoded { code, .. }) => *code,
                Err(e) => e.code,
            };
            m.observe(verb, resource, sub.as_deref(), code, started.elapsed());
        }
        (result, seat)
    }

    async fn handle_inner(
        &self,
        user: &User,
        mut req: ApiRequest,
        seat: &mut Option<crate::fairness::Seat>,
    ) -> Result<ApiResponse, ApiError> {
        for (what, v) in [("name", &req.name), ("namespace", &req.namespace)] {
            if let Some(v) = v
                && let Some(why) = path_segment_problem(v)
            {
                return Err(ApiError::bad_request(format!(
                    "the {what} {v:?} in the request path {why}"
                )));
            }
        }
        if req.object.is_some() && !req.body.is_empty() {
            return Err(ApiError::bad_request(
                "a request carries its body once: as text or decoded, not both",
            ));
        }
        let scope = self.authorizer.authorize(user, &req).await?;
        let custom = self.custom_gate(&req).await?;
        // A view of an older version is served by converting to and from the stored one.
        let view = views::to_stored(&mut req)?;
        // Watches are long-running: they hold no request seat, as in Kubernetes, but one of
        // a bounded number of watch slots, for as long as they are open.
        let watch_slot = if req.verb == Verb::Watch {
            Some(self.fairness.admit_watch(user, scope.max_watches)?)
        } else {
            None
        };
        if seat.is_none() && req.verb != Verb::Watch {
            *seat = Some(self.fairness.admit(user, scope.max_inflight)?);
        }
        // A body handed over decoded goes to the writes that take one (creates, updates, a
        // pod's binding); any other request reads it as the text it stands for.
        let object = match (req.verb, req.subresource.as_deref()) {
            (Verb::Create, None) | (Verb::Update, _) => req.object.take(),
            (Verb::Create, Some("binding")) if req.resource.plural == "pods" => req.object.take(),
            _ => {
                if req.object.is_some() {
                    req.body = req.body_bytes();
                    req.object = None;
                }
                None
            }
        };
        let across = self.across(req.resource);
        let read_across = match across {
            Some(a) => self.across_shards(&req, a, &scope.namespaces).await,
            None => None,
        };
        let mut resp = match (req.verb, req.subresource.as_deref()) {
            _ if read_across.is_some() => read_across.expect("just checked"),
            (Verb::Get, None) => self.get(&req).await,
            (Verb::Get, Some("status")) => self.get(&req).await,
            (Verb::Get, Some("scale")) => self.get(&req).await,
            (Verb::Get, Some("log")) => self.logs(&req).await,
            (Verb::List, _) => self.list(&req, &scope.namespaces).await,
            (Verb::Watch, _) => self.watch(&req, scope.namespaces.clone()).await,
            (Verb::Create, None) => self.create(&req, user, object).await,
            (Verb::Create, Some("binding")) => self.bind(&req, user, object).await,
            (Verb::Create, Some("eviction")) => self.evict(&req).await,
            (Verb::Create, Some("token")) => self.create_token(&req).await,
            (Verb::Update, _) => {
                let obj = self.decode_body(&req, object)?;
                self.write_existing(&req, user, |_| Ok(obj.0.clone()), obj.1)
                    .await
            }
            (Verb::Patch(pt), _) => self.patch(&req, user, pt, view).await,
            (Verb::Delete, None) => self.delete(&req, Some(user)).await,
            (Verb::DeleteCollection, None) => {
                self.delete_collection(&req, user, &scope.namespaces).await
            }
            (v, Some(s)) => Err(ApiError::new(
                405,
                "MethodNotAllowed",
                format!("{} is not supported on the {s} subresource", v.as_str()),
            )),
        }?;
        // A CRD's objects in the version asked for (before a Scale is made of one: the
        // version's scale paths read it).
        if let Some(v) = &custom {
            resp = self.in_request_version(v, resp).await?;
        }
        if req.subresource.as_deref() == Some("scale") || req.table {
            // These answers are built from the object as a value.
            if let ApiResponse::Encoded { code, body } = resp {
                let value = serde_json::from_slice(&body)
                    .map_err(|e| ApiError::internal(format!("stored object is not JSON: {e}")))?;
                resp = ApiResponse::Object {
                    code,
                    body: value,
                    warnings: Vec::new(),
                };
            }
        }
        if req.subresource.as_deref() == Some("scale")
            && let ApiResponse::Object { body, .. } = &mut resp
            && body["kind"] != "Scale"
        {
            *body = to_scale(&req, custom.as_ref().and_then(|v| v.scale.as_ref()), body);
        }
        if req.table
            && let ApiResponse::Object { body, .. } = &mut resp
            && req.subresource.is_none()
        {
            let mut t = match &custom {
                Some(v) => {
                    table::to_custom_table(&v.columns, body, req.params.include_object.as_deref())
                }
                None => table::to_table(req.resource, body, req.params.include_object.as_deref()),
            };
            if across.is_some() {
                let objects: Vec<&Value> = match body["items"].as_array() {
                    Some(items) => items.iter().collect(),
                    None => vec![&*body],
                };
                across::add_shard_column(&mut t, &objects);
            }
            *body = t;
        }
        if let Some(v) = view {
            resp = views::answer(v, resp)?;
        }
        if let Some(slot) = watch_slot
            && let ApiResponse::Watch(stream) = resp
        {
            // The slot goes back when the watch's stream is dropped.
            resp = ApiResponse::Watch(Box::pin(stream.map(move |ev| {
                let _held = &slot;
                ev
            })));
        }
        if req.table
            && let ApiResponse::Watch(stream) = resp
        {
            let res = req.resource;
            let include = req.params.include_object.clone();
            let columns = custom.as_ref().map(|v| v.columns.clone());
            resp = ApiResponse::Watch(Box::pin(stream.map(move |ev| {
                let mut ev = ev.into_value();
                if ev["type"] != "ERROR" && ev["type"] != "BOOKMARK" {
                    let mut t = match &columns {
                        Some(c) => table::to_custom_table(c, &ev["object"], include.as_deref()),
                        None => table::to_table(res, &ev["object"], include.as_deref()),
                    };
                    if across.is_some() {
                        across::add_shard_column(&mut t, &[&ev["object"]]);
                    }
                    ev["object"] = t;
                }
                WatchEvent::Value(ev)
            })));
        }
        Ok(resp)
    }
}

/// Why `s` cannot be a name in a request path, if it cannot: names are printable ASCII
/// without `/`, `%` or spaces, and not `.` or `..` (what any valid object name satisfies).
fn path_segment_problem(s: &str) -> Option<&'static str> {
    if s.is_empty() {
        Some("is empty")
    } else if s == "." || s == ".." {
        Some("may not be '.' or '..'")
    } else if !s
        .bytes()
        .all(|b| b.is_ascii_graphic() && b != b'/' && b != b'%')
    {
        Some("may contain only printable ASCII characters other than '/' and '%'")
    } else if s.len() > 253 {
        Some("is longer than 253 characters")
    } else {
        None
    }
}

/// A pod with a deletionTimestamp on a node is removed by its agent, not by finalizers.
fn awaiting_kubelet(pod: &Value) -> bool {
    pod["spec"]["nodeName"].is_string()
        && pod["metadata"]["deletionGracePeriodSeconds"]
            .as_i64()
            .unwrap_or(0)
            > 0
}

fn namespace_finalized(ns: &Value) -> bool {
    ns["spec"]["finalizers"]
        .as_array()
        .is_none_or(|f| f.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_and_uids_look_like_kubernetes() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_795_000_000), "2026-11-18T11:06:40Z");
        let u = uid();
        assert_eq!(u.len(), 36);
        assert_eq!(u.matches('-').count(), 4);
        assert!(
            u.chars()
                .all(|c| c == '-' || c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
        );
        assert_eq!((&u[14..15], &u[19..20]), ("4", "a"), "{u}");
        assert_ne!(uid(), u);
    }
}
