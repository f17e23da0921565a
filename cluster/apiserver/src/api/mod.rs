//! The request path, as a layer of its own: authorize → decode → admit → store → encode.
//! The HTTP server wraps it (`http.rs`); in-process components call [`Api::handle`] directly
//! through the [`crate::client`] trait.
//!
//! Objects are stored as JSON under Kubernetes' key layout. Every body is decoded into the
//! kind's real type (`k8s-openapi`), so that what is kept is exactly what clients expect;
//! fields the type does not have are dropped, warned about or refused (`fieldValidation`).

mod tenant_quota;

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use futures::{Stream, StreamExt};
use serde_json::{Value, json};
use tessera_core::keys;
use tessera_core::quantity::Quantity;
use tessera_store::continuation::Cursor;
use tessera_store::{KeyValue, ListRequest, Op, Revision, Store, StoreError};

use crate::auth::{Authorizer, User};
use crate::catalog::Resource;
use crate::fairness::Fairness;
use crate::kinds::{self, unknown_fields};
use crate::metrics::ApiMetrics;
use crate::request::{ApiRequest, FieldValidation, PatchType, Propagation, Verb};
use crate::status::{ApiError, Cause};
use crate::watchcache::WatchCache;
use crate::{apply, patch, table, validation};

/// One watch event.
#[derive(Clone, Debug)]
pub enum WatchEvent {
    /// An event encoded once as its JSON line (`{"type":...,"object":...}` and a newline),
    /// shared as it is by every consumer.
    Encoded(Bytes),
    /// An event as a value (`{"type": ..., "object": ...}`): errors, bookmarks, Tables.
    Value(Value),
}

impl WatchEvent {
    /// The event as a value.
    pub fn into_value(self) -> Value {
        match self {
            WatchEvent::Value(v) => v,
            WatchEvent::Encoded(b) => serde_json::from_slice(&b).unwrap_or(Value::Null),
        }
    }

    /// The event as one JSON line.
    pub fn into_line(self) -> Bytes {
        match self {
            WatchEvent::Encoded(b) => b,
            WatchEvent::Value(v) => {
                let mut line = v.to_string().into_bytes();
                line.push(b'\n');
                Bytes::from(line)
            }
        }
    }
}

/// A watch: events until the client leaves or the timeout.
pub type WatchStream = Pin<Box<dyn Stream<Item = WatchEvent> + Send>>;

/// What a request answers.
pub enum ApiResponse {
    /// An object (or list, or Table) with its HTTP code and warnings for the client.
    Object {
        /// 200 or 201.
        code: u16,
        /// The body.
        body: Value,
        /// `Warning` headers (unknown fields under `fieldValidation=Warn`).
        warnings: Vec<String>,
    },
    /// A JSON body already encoded (lists and reads, assembled from the stored bytes
    /// without decoding them).
    Encoded {
        /// 200.
        code: u16,
        /// The JSON text.
        body: Bytes,
    },
    /// A stream of watch events.
    Watch(WatchStream),
}

impl std::fmt::Debug for ApiResponse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ApiResponse::Object { code, body, .. } => write!(f, "{code} {body}"),
            ApiResponse::Encoded { code, body } => {
                write!(f, "{code} {}", String::from_utf8_lossy(body))
            }
            ApiResponse::Watch(_) => write!(f, "watch"),
        }
    }
}

impl ApiResponse {
    /// The body as a value (decoding an encoded one); `None` for a watch.
    pub fn into_value(self) -> Option<Value> {
        match self {
            ApiResponse::Object { body, .. } => Some(body),
            ApiResponse::Encoded { body, .. } => serde_json::from_slice(&body).ok(),
            ApiResponse::Watch(_) => None,
        }
    }

    fn ok(body: Value) -> Self {
        ApiResponse::Object {
            code: 200,
            body,
            warnings: Vec::new(),
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
    tenants: Arc<parking_lot::Mutex<tenant_quota::TenantList>>,
}

/// RFC 3339 in UTC, to the second, as Kubernetes writes timestamps.
pub fn rfc3339(secs: i64) -> String {
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Seconds since the epoch.
pub fn now_secs() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

fn uid() -> String {
    let b: [u8; 16] = rand::random();
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
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

/// Every stored object starts with these bytes, then `"` and the rest: its resourceVersion
/// (the store's revision, unknown until the write commits) is spliced in when it is read,
/// so that lists and watches copy stored bytes instead of decoding and encoding objects.
const STORED_PREFIX: &[u8] = br#"{"metadata":{"resourceVersion":""#;

fn write_pair(out: &mut Vec<u8>, k: &str, v: &Value) -> Result<(), ApiError> {
    serde_json::to_writer(&mut *out, k).map_err(|e| ApiError::internal(e.to_string()))?;
    out.push(b':');
    serde_json::to_writer(&mut *out, v).map_err(|e| ApiError::internal(e.to_string()))
}

/// The stored form of an object: JSON with `metadata.resourceVersion` first and empty.
fn encode(obj: &Value) -> Result<Bytes, ApiError> {
    let (Some(top), Some(meta)) = (obj.as_object(), obj["metadata"].as_object()) else {
        return Err(ApiError::internal("an object to store has no metadata"));
    };
    let mut out = Vec::with_capacity(512);
    out.extend_from_slice(STORED_PREFIX);
    out.push(b'"');
    for (k, v) in meta {
        if k != "resourceVersion" {
            out.push(b',');
            write_pair(&mut out, k, v)?;
        }
    }
    out.push(b'}');
    for (k, v) in top {
        if k != "metadata" {
            out.push(b',');
            write_pair(&mut out, k, v)?;
        }
    }
    out.push(b'}');
    Ok(Bytes::from(out))
}

/// An object as a client sees it, from its stored bytes: the resourceVersion spliced in.
fn render(value: &[u8], rev: i64, out: &mut Vec<u8>) -> Result<(), ApiError> {
    if value.starts_with(STORED_PREFIX) {
        out.extend_from_slice(STORED_PREFIX);
        out.extend_from_slice(rev.to_string().as_bytes());
        out.extend_from_slice(&value[STORED_PREFIX.len()..]);
        Ok(())
    } else {
        let obj: Value = serde_json::from_slice(value)
            .map_err(|e| ApiError::internal(format!("stored object is not JSON: {e}")))?;
        serde_json::to_writer(&mut *out, &with_rv(obj, rev))
            .map_err(|e| ApiError::internal(e.to_string()))
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

/// The items of a list, as stored bytes with their revisions, and where it stopped.
struct Items {
    items: Vec<(Bytes, i64)>,
    revision: Revision,
    next: Option<String>,
}

fn name_of(obj: &Value) -> &str {
    obj["metadata"]["name"].as_str().unwrap_or_default()
}

fn has_status(res: &Resource) -> bool {
    res.subresources.iter().any(|s| s.name == "status")
}

/// The value of a field selector's field in an object (`metadata.name`, `spec.nodeName`).
fn field_value<'a>(res: &Resource, obj: &'a Value, field: &str) -> Option<&'a str> {
    let mut v = obj;
    for part in field.split('.') {
        v = v.get(part)?;
    }
    // Absent string fields compare as "", as in Kubernetes (`spec.nodeName=` selects
    // unscheduled pods).
    let _ = res;
    v.as_str()
}

/// The fields each kind can be selected by, besides `metadata.name` and `metadata.namespace`.
fn selectable_fields(res: &Resource) -> &'static [&'static str] {
    match (res.group, res.kind) {
        ("", "Pod") => &[
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        ],
        ("", "Node") => &["spec.unschedulable"],
        ("", "Event") => &[
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
        ],
        ("", "Secret") => &["type"],
        ("", "Namespace") => &["status.phase"],
        ("apps", "ReplicaSet") => &["status.replicas"],
        ("batch", "Job") => &["status.successful"],
        _ => &[],
    }
}

/// A matcher for list and watch: labels and fields.
struct Filter {
    labels: Option<tessera_core::selector::label::LabelSelector>,
    fields: Option<tessera_core::selector::field::FieldSelector>,
    res: &'static Resource,
}

impl Filter {
    fn new(req: &ApiRequest) -> Result<Filter, ApiError> {
        if let Some(fs) = &req.params.field_selector {
            let allowed = selectable_fields(req.resource);
            for r in fs.requirements() {
                if r.field != "metadata.name"
                    && r.field != "metadata.namespace"
                    && !allowed.contains(&r.field.as_str())
                {
                    return Err(ApiError::bad_request(format!(
                        "field label not supported: {} (the fields of {} that can be selected are metadata.name, metadata.namespace{})",
                        r.field,
                        req.resource.plural,
                        allowed.iter().map(|f| format!(", {f}")).collect::<String>()
                    )));
                }
            }
        }
        Ok(Filter {
            labels: req.params.label_selector.clone(),
            fields: req.params.field_selector.clone(),
            res: req.resource,
        })
    }

    /// True if it matches everything (no selectors): objects need not be decoded.
    fn is_trivial(&self) -> bool {
        self.labels.as_ref().is_none_or(|l| l.is_empty())
            && self.fields.as_ref().is_none_or(|f| f.is_empty())
    }

    fn matches(&self, obj: &Value) -> bool {
        if let Some(ls) = &self.labels {
            let labels = &obj["metadata"]["labels"];
            if !ls.matches_with(|k| labels.get(k).and_then(Value::as_str)) {
                return false;
            }
        }
        if let Some(fs) = &self.fields {
            let owned: BTreeMap<String, String> = fs
                .requirements()
                .iter()
                .map(|r| {
                    let v = match r.field.as_str() {
                        "spec.unschedulable" | "spec.hostNetwork" => obj["spec"]
                            [r.field.trim_start_matches("spec.")]
                        .as_bool()
                        .unwrap_or(false)
                        .to_string(),
                        "status.replicas" | "status.successful" => obj["status"]
                            [r.field.trim_start_matches("status.")]
                        .as_i64()
                        .unwrap_or(0)
                        .to_string(),
                        "source" => obj["source"]["component"]
                            .as_str()
                            .unwrap_or_default()
                            .to_owned(),
                        f => field_value(self.res, obj, f).unwrap_or_default().to_owned(),
                    };
                    (r.field.clone(), v)
                })
                .collect();
            if !fs.matches_with(|f| owned.get(f).map(String::as_str)) {
                return false;
            }
        }
        true
    }
}

/// The object's pod-level resource requests and limits summed over containers, for quota.
fn pod_usage(pod: &Value) -> BTreeMap<String, Quantity> {
    let mut out: BTreeMap<String, Quantity> = BTreeMap::new();
    out.insert("pods".into(), Quantity::from_units(1));
    for c in pod["spec"]["containers"].as_array().into_iter().flatten() {
        for (section, prefix) in [("requests", "requests."), ("limits", "limits.")] {
            for (k, v) in c["resources"][section].as_object().into_iter().flatten() {
                let Some(q) = v.as_str().and_then(|s| s.parse::<Quantity>().ok()) else {
                    continue;
                };
                let mut names = vec![format!("{prefix}{k}")];
                if section == "requests" {
                    names.push(k.clone());
                }
                for n in names {
                    let e = out.entry(n).or_insert_with(|| Quantity::from_units(0));
                    *e = (*e).saturating_add(q);
                }
            }
        }
    }
    out
}

fn quantity_map(v: &Value) -> BTreeMap<String, Quantity> {
    v.as_object()
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.parse().ok()?)))
        .collect()
}

fn quantity_json(m: &BTreeMap<String, Quantity>) -> Value {
    Value::Object(
        m.iter()
            .map(|(k, v)| (k.clone(), Value::String(v.to_string())))
            .collect(),
    )
}

impl Api {
    /// An API over `store` with the default policies.
    pub fn new(store: Arc<dyn Store>, metrics: Option<ApiMetrics>) -> Api {
        Api {
            authorizer: Authorizer::new(store.clone()),
            fairness: Fairness::new(metrics.clone()),
            watch_cache: WatchCache::new(
                store.clone(),
                Arc::new(|ty: &str, value: &[u8], rev: i64| event_line(ty, value, rev).ok()),
            ),
            store,
            metrics,
            tenants: Arc::default(),
        }
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

    /// Serves one request for `user`.
    pub async fn handle(&self, user: &User, req: ApiRequest) -> Result<ApiResponse, ApiError> {
        let started = Instant::now();
        let verb = req.verb;
        let resource = req.resource;
        let sub = req.subresource.clone();
        let result = self.handle_inner(user, req).await;
        if verb.is_write() && resource.plural == "tenants" && resource.group == "tessera.io" {
            // Tenant quotas are looked up from a short-lived list: a Tenant written here is
            // seen at once by this server (other API servers within a second).
            *self.tenants.lock() = None;
        }
        if let Some(m) = &self.metrics {
            let code = match &result {
                Ok(ApiResponse::Object { code, .. }) => *code,
                Ok(ApiResponse::Watch(_)) => 200,
                Ok(ApiResponse::Encoded { code, .. }) => *code,
                Err(e) => e.code,
            };
            m.observe(verb, resource, sub.as_deref(), code, started.elapsed());
        }
        result
    }

    async fn handle_inner(&self, user: &User, req: ApiRequest) -> Result<ApiResponse, ApiError> {
        for (what, v) in [("name", &req.name), ("namespace", &req.namespace)] {
            if let Some(v) = v
                && let Some(why) = path_segment_problem(v)
            {
                return Err(ApiError::bad_request(format!(
                    "the {what} {v:?} in the request path {why}"
                )));
            }
        }
        let scope = self.authorizer.authorize(user, &req).await?;
        // Watches are long-running: they do not hold a seat, as in Kubernetes.
        let _seat = if req.verb == Verb::Watch {
            None
        } else {
            Some(self.fairness.admit(user, scope.max_inflight)?)
        };
        let mut resp = match (req.verb, req.subresource.as_deref()) {
            (Verb::Get, None) => self.get(&req).await,
            (Verb::Get, Some("status")) => self.get(&req).await,
            (Verb::Get, Some("scale")) => self.get(&req).await,
            (Verb::Get, Some("log")) => Err(ApiError::bad_request(format!(
                "no logs for pod {:?}: no node agent runs it yet",
                req.name.as_deref().unwrap_or_default()
            ))),
            (Verb::List, _) => self.list(&req, &scope.namespaces).await,
            (Verb::Watch, _) => self.watch(&req, scope.namespaces.clone()).await,
            (Verb::Create, None) => self.create(&req, user).await,
            (Verb::Create, Some("binding")) => self.bind(&req, user).await,
            (Verb::Update, _) => {
                let obj = self.decode_body(&req)?;
                self.write_existing(&req, user, |_| Ok(obj.0.clone()), obj.1)
                    .await
            }
            (Verb::Patch(pt), _) => self.patch(&req, user, pt).await,
            (Verb::Delete, None) => self.delete(&req).await,
            (Verb::DeleteCollection, None) => self.delete_collection(&req, &scope.namespaces).await,
            (v, Some(s)) => Err(ApiError::new(
                405,
                "MethodNotAllowed",
                format!("{} is not supported on the {s} subresource", v.as_str()),
            )),
        }?;
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
            *body = to_scale(&req, body);
        }
        if req.table
            && let ApiResponse::Object { body, .. } = &mut resp
            && req.subresource.is_none()
        {
            *body = table::to_table(req.resource, body, req.params.include_object.as_deref());
        }
        if req.table
            && let ApiResponse::Watch(stream) = resp
        {
            let res = req.resource;
            let include = req.params.include_object.clone();
            resp = ApiResponse::Watch(Box::pin(stream.map(move |ev| {
                let mut ev = ev.into_value();
                if ev["type"] != "ERROR" && ev["type"] != "BOOKMARK" {
                    ev["object"] = table::to_table(res, &ev["object"], include.as_deref());
                }
                WatchEvent::Value(ev)
            })));
        }
        Ok(resp)
    }

    /// Decodes a create/update body: JSON object of the resource's kind, typed, with unknown
    /// fields handled per `fieldValidation`. Returns the object and warnings.
    fn decode_body(&self, req: &ApiRequest) -> Result<(Value, Vec<String>), ApiError> {
        let obj: Value = serde_json::from_slice(&req.body).map_err(|e| {
            ApiError::bad_request(format!(
                "the request body is not valid JSON: {e}; send one {} object",
                req.resource.kind
            ))
        })?;
        self.typed(req, obj)
    }

    /// Checks apiVersion/kind (filling them in), decodes into the kind's type and applies
    /// `fieldValidation`.
    fn typed(&self, req: &ApiRequest, mut obj: Value) -> Result<(Value, Vec<String>), ApiError> {
        let res = target_kind(req);
        if !obj.is_object() {
            return Err(ApiError::bad_request(format!(
                "the request body must be a JSON object (a {})",
                res.2
            )));
        }
        let want_version = if res.0.is_empty() {
            res.1.to_owned()
        } else {
            format!("{}/{}", res.0, res.1)
        };
        match obj.get("apiVersion") {
            None | Some(Value::Null) => obj["apiVersion"] = json!(want_version),
            Some(Value::String(v)) if *v == want_version => {}
            Some(v) => {
                return Err(ApiError::bad_request(format!(
                    "the API version in the data ({}) does not match the expected API version ({want_version})",
                    v.as_str().map_or_else(|| v.to_string(), str::to_owned)
                )));
            }
        }
        match obj.get("kind") {
            None | Some(Value::Null) => obj["kind"] = json!(res.2),
            Some(Value::String(k)) if k == res.2 => {}
            Some(k) => {
                return Err(ApiError::bad_request(format!(
                    "the kind in the data ({}) does not match the expected kind ({})",
                    k.as_str().map_or_else(|| k.to_string(), str::to_owned),
                    res.2
                )));
            }
        }
        let typed = kinds::of_kind(res.0, res.2)
            .ok_or_else(|| ApiError::internal(format!("no type for {}", res.2)))?;
        let normalized = (typed.normalize)(&obj).map_err(|e| {
            ApiError::bad_request(format!(
                "{kind} in version \"{v}\" cannot be handled as a {kind}: {path}{msg}",
                kind = res.2,
                v = res.1,
                path = if e.path.is_empty() {
                    String::new()
                } else {
                    format!("{}: ", e.path)
                },
                msg = e.message
            ))
        })?;
        let unknown = unknown_fields(&obj, &normalized);
        let mut normalized = normalized;
        if res.2 == req.resource.kind {
            crate::defaults::apply(req.resource, &mut normalized);
            if normalized["spec"].is_null()
                && let Some(o) = normalized.as_object_mut()
            {
                o.remove("spec");
            }
        }
        let mut warnings = Vec::new();
        if !unknown.is_empty() {
            match req.params.field_validation {
                FieldValidation::Strict => {
                    let list: Vec<String> = unknown
                        .iter()
                        .map(|f| format!("unknown field \"{f}\""))
                        .collect();
                    return Err(ApiError::bad_request(format!(
                        "strict decoding error: {}",
                        list.join(", ")
                    )));
                }
                FieldValidation::Warn => {
                    warnings.extend(unknown.iter().map(|f| format!("unknown field \"{f}\"")));
                }
                FieldValidation::Ignore => {}
            }
        }
        Ok((normalized, warnings))
    }

    async fn read(
        &self,
        res: &'static Resource,
        ns: Option<&str>,
        name: &str,
    ) -> Result<Option<(Value, KeyValue)>, ApiError> {
        match self
            .store
            .get(object_key(res, ns, name).as_bytes())
            .await
            .map_err(store_error)?
        {
            Some(kv) => Ok(Some((decode_stored(&kv)?, kv))),
            None => Ok(None),
        }
    }

    async fn get(&self, req: &ApiRequest) -> Result<ApiResponse, ApiError> {
        let res = req.resource;
        let name = req.name.as_deref().unwrap_or_default();
        let kv = self
            .store
            .get(object_key(res, req.namespace.as_deref(), name).as_bytes())
            .await
            .map_err(store_error)?
            .ok_or_else(|| ApiError::not_found(res.group, res.plural, name))?;
        let mut out = Vec::with_capacity(kv.value.len() + 16);
        render(&kv.value, kv.mod_revision, &mut out)?;
        Ok(ApiResponse::Encoded {
            code: 200,
            body: Bytes::from(out),
        })
    }

    /// A list: label/field selectors, `limit`/`continue`, and resourceVersion semantics
    /// (unset: latest; `0`: any; with `resourceVersionMatch=Exact`: that revision;
    /// otherwise not older than it). The body is assembled from the stored bytes.
    async fn list(
        &self,
        req: &ApiRequest,
        allowed_namespaces: &Option<Vec<String>>,
    ) -> Result<ApiResponse, ApiError> {
        let res = req.resource;
        let found = self.list_items(req, allowed_namespaces).await?;
        let mut out =
            Vec::with_capacity(128 + found.items.iter().map(|(b, _)| b.len() + 24).sum::<usize>());
        out.extend_from_slice(br#"{"kind":"#);
        write_str(&mut out, &format!("{}List", res.kind))?;
        out.extend_from_slice(br#","apiVersion":"#);
        write_str(&mut out, &api_version(res))?;
        out.extend_from_slice(br#","metadata":{"resourceVersion":"#);
        write_str(&mut out, &found.revision.to_string())?;
        if let Some(t) = &found.next {
            out.extend_from_slice(br#","continue":"#);
            write_str(&mut out, t)?;
        }
        out.extend_from_slice(br#"},"items":["#);
        for (i, (value, rev)) in found.items.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            render(value, *rev, &mut out)?;
        }
        out.extend_from_slice(b"]}");
        Ok(ApiResponse::Encoded {
            code: 200,
            body: Bytes::from(out),
        })
    }

    async fn list_items(
        &self,
        req: &ApiRequest,
        allowed_namespaces: &Option<Vec<String>>,
    ) -> Result<Items, ApiError> {
        let res = req.resource;
        let filter = Filter::new(req)?;
        let p = &req.params;
        let mut revision: Option<Revision> = None;
        if p.continue_token.is_none()
            && let Some(rv) = p.resource_version.as_deref().filter(|rv| *rv != "0")
        {
            let asked: Revision = rv.parse().map_err(|_| {
                ApiError::bad_request(format!(
                    "resourceVersion {rv:?} is not one this server issued"
                ))
            })?;
            if p.resource_version_match.as_deref() == Some("Exact") {
                revision = Some(asked);
            } else {
                let current = self.store.current_revision().await.map_err(store_error)?;
                if !revision_at_least(&current, &asked) {
                    return Err(ApiError::new(
                        504,
                        "Timeout",
                        format!(
                            "Too large resource version: {rv}, current resource version: {current}"
                        ),
                    ));
                }
            }
        } else if p.resource_version_match.is_some() && p.resource_version.is_none() {
            return Err(ApiError::bad_request(
                "resourceVersionMatch is forbidden unless resourceVersion is provided",
            ));
        }
        let list_prefix = prefix(res, req.namespace.as_deref());
        let limit = p.limit;
        let decode = !filter.is_trivial() || allowed_namespaces.is_some();
        let mut items = Vec::new();
        let mut store_req = ListRequest {
            prefix: list_prefix.clone().into(),
            revision,
            limit: if limit == 0 {
                1000
            } else {
                limit.clamp(1, 1000)
            },
            continue_token: p.continue_token.clone(),
        };
        let mut next = None;
        let rev = loop {
            let page = self
                .store
                .list(store_req.clone())
                .await
                .map_err(|e| match e {
                    StoreError::InvalidToken { .. } => ApiError::bad_request(format!(
                        "the continue token is not valid ({e}); start the list again without it"
                    )),
                    e => store_error(e),
                })?;
            let page_rev = page.revision.clone();
            let n = page.kvs.len();
            for (i, kv) in page.kvs.iter().enumerate() {
                if decode {
                    let obj = decode_stored(kv)?;
                    if let Some(allowed) = allowed_namespaces
                        && !allowed.iter().any(|a| a == name_of(&obj))
                    {
                        continue;
                    }
                    if !filter.matches(&obj) {
                        continue;
                    }
                }
                items.push((kv.value.clone(), kv.mod_revision));
                if limit > 0 && items.len() == limit {
                    // More may follow: the next page starts after this key.
                    let more = i + 1 < n || page.continue_token.is_some();
                    if more {
                        let cursor = Cursor {
                            prefix: list_prefix.clone().into(),
                            revision: None,
                            start: Bytes::new(),
                        };
                        next = Some(cursor.next_token(&page_rev, &kv.key));
                    }
                    break;
                }
            }
            if (limit > 0 && items.len() == limit) || page.continue_token.is_none() {
                break page_rev;
            }
            store_req.continue_token = page.continue_token;
            store_req.revision = None;
        };
        Ok(Items {
            items,
            revision: rev,
            next,
        })
    }

    /// A watch. Without a resourceVersion (or with `0`) it starts with an `ADDED` event for
    /// every existing object, as Kubernetes does; with one, it resumes just after it, or
    /// answers a `410 Gone` event when that was compacted away.
    async fn watch(
        &self,
        req: &ApiRequest,
        allowed_namespaces: Option<Vec<String>>,
    ) -> Result<ApiResponse, ApiError> {
        let res = req.resource;
        let filter = Arc::new(Filter::new(req)?);
        let watch_prefix = prefix(res, req.namespace.as_deref());
        let mut initial = Vec::new();
        let after = match req.params.resource_version.as_deref() {
            None | Some("0") => {
                let mut lr = req.clone();
                lr.params.limit = 0;
                lr.params.continue_token = None;
                lr.params.resource_version = None;
                lr.params.resource_version_match = None;
                lr.table = false;
                let found = self.list_items(&lr, &allowed_namespaces).await?;
                for (value, rev) in &found.items {
                    initial.push(WatchEvent::Encoded(event_line("ADDED", value, *rev)?));
                }
                Some(found.revision)
            }
            Some(rv) => Some(rv.parse::<Revision>().map_err(|_| {
                ApiError::bad_request(format!(
                    "resourceVersion {rv:?} is not one this server issued"
                ))
            })?),
        };
        let gone = |e: &StoreError| json!({"type": "ERROR", "object": ApiError::gone(format!("too old resource version: {e}")).to_status()});
        let bookmarks = req.params.allow_bookmarks;
        let kind = res.kind;
        let version = api_version(res);
        let allowed = Arc::new(allowed_namespaces);
        let after = after.ok_or_else(|| ApiError::internal("a watch without a revision"))?;
        // Events at or before `after` that share a batch with later ones are skipped.
        let floor = match after.parts() {
            [one] => *one,
            _ => i64::MIN,
        };
        let resource_prefix = prefix(res, None);
        let ns_prefix = Bytes::from(watch_prefix.clone());
        let events: WatchStream = match self
            .watch_cache
            .watch(&resource_prefix, &watch_prefix, after)
            .await
        {
            Ok(w) => {
                let mut last_bookmark = Instant::now();
                let decode = !filter.is_trivial() || allowed.is_some();
                Box::pin(w.flat_map(move |item| {
                    let out: Vec<WatchEvent> = match item {
                        Ok(batch) => {
                            let mut out = Vec::with_capacity(batch.events.len() + 1);
                            for e in &batch.events {
                                if e.rev <= floor || !e.key.starts_with(&ns_prefix) {
                                    continue;
                                }
                                let Some(line) = &e.line else { continue };
                                if !decode {
                                    out.push(WatchEvent::Encoded(line.clone()));
                                    continue;
                                }
                                let Ok(obj) = serde_json::from_slice::<Value>(&e.value) else {
                                    continue;
                                };
                                if let Some(a) = allowed.as_ref()
                                    && !a.iter().any(|n| n == name_of(&obj))
                                {
                                    continue;
                                }
                                // An object that stops matching leaves the watch as DELETED;
                                // one that starts matching joins it as ADDED.
                                let now = filter.matches(&obj);
                                let before = e.ty == "MODIFIED"
                                    && e.prev
                                        .as_ref()
                                        .and_then(|p| serde_json::from_slice::<Value>(p).ok())
                                        .is_some_and(|p| filter.matches(&p));
                                let ty = match (e.ty, before, now) {
                                    ("MODIFIED", false, true) => "ADDED",
                                    ("MODIFIED", true, false) => "DELETED",
                                    (_, _, false) => continue,
                                    (t, _, _) => t,
                                };
                                if ty == e.ty {
                                    out.push(WatchEvent::Encoded(line.clone()));
                                } else if let Ok(l) = event_line(ty, &e.value, e.rev) {
                                    out.push(WatchEvent::Encoded(l));
                                }
                            }
                            if bookmarks
                                && (batch.events.is_empty()
                                    || last_bookmark.elapsed() > BOOKMARK_EVERY)
                            {
                                last_bookmark = Instant::now();
                                out.push(WatchEvent::Value(
                                        json!({"type": "BOOKMARK", "object": {
                                    "kind": kind, "apiVersion": version,
                                    "metadata": {"resourceVersion": batch.revision.to_string()}}}),
                                    ));
                            }
                            out
                        }
                        Err(e) => vec![WatchEvent::Value(gone(&e))],
                    };
                    futures::stream::iter(out)
                }))
            }
            Err(e @ StoreError::Compacted { .. }) => {
                Box::pin(futures::stream::iter(vec![WatchEvent::Value(gone(&e))]))
            }
            Err(e) => return Err(store_error(e)),
        };
        let mut stream: WatchStream = Box::pin(futures::stream::iter(initial).chain(events));
        if let Some(t) = req.params.timeout_seconds {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(t);
            stream = Box::pin(stream.take_until(tokio::time::sleep_until(deadline)));
        }
        if let Some(m) = &self.metrics {
            stream = Box::pin(m.count_watch(res, stream));
        }
        Ok(ApiResponse::Watch(stream))
    }

    /// Fills in what the server owns on a new object and validates it.
    async fn prepare_new(
        &self,
        req: &ApiRequest,
        user: &User,
        mut obj: Value,
        applied: Option<Value>,
    ) -> Result<Value, ApiError> {
        let res = req.resource;
        if !obj["metadata"].is_object() {
            obj["metadata"] = json!({});
        }
        let meta = &mut obj["metadata"];
        let name = match (
            meta.get("name").and_then(Value::as_str),
            meta.get("generateName").and_then(Value::as_str),
        ) {
            (Some(n), _) if !n.is_empty() => n.to_owned(),
            (_, Some(prefix)) if !prefix.is_empty() => {
                let suffix: String = (0..5)
                    .map(|_| {
                        let alphabet = b"bcdfghjklmnpqrstvwxz2456789";
                        alphabet[rand::random_range(0..alphabet.len())] as char
                    })
                    .collect();
                format!("{prefix}{suffix}")
            }
            _ => {
                return Err(ApiError::invalid(
                    res.group,
                    res.kind,
                    "",
                    vec![Cause {
                        reason: "FieldValueRequired",
                        field: "metadata.name".into(),
                        message: "Required value: name or generateName is required".into(),
                    }],
                ));
            }
        };
        if let (Some(path_ns), Some(body_ns)) = (
            req.namespace.as_deref(),
            meta.get("namespace").and_then(Value::as_str),
        ) && path_ns != body_ns
            && !body_ns.is_empty()
        {
            return Err(ApiError::bad_request(format!(
                "the namespace of the provided object ({body_ns}) does not match the namespace sent on the request ({path_ns})"
            )));
        }
        let m = meta
            .as_object_mut()
            .ok_or_else(|| ApiError::internal("metadata"))?;
        match req.namespace.as_deref() {
            Some(n) => {
                m.insert("namespace".into(), json!(n));
            }
            None => {
                m.remove("namespace");
            }
        }
        m.insert("name".into(), json!(name));
        m.insert("uid".into(), json!(uid()));
        m.insert("creationTimestamp".into(), json!(rfc3339(now_secs())));
        m.insert("generation".into(), json!(1));
        for server_owned in [
            "resourceVersion",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "selfLink",
        ] {
            m.remove(server_owned);
        }
        if res.plural == "namespaces" {
            obj["status"] = json!({"phase": "Active"});
            if obj["spec"]["finalizers"].is_null() {
                obj["spec"]["finalizers"] = json!(["kubernetes"]);
            }
        }
        if res.plural == "pods" && obj["status"]["phase"].is_null() {
            obj["status"] = json!({"phase": "Pending", "qosClass": qos_class(&obj)});
        }
        if res.plural == "pods" && obj["spec"]["schedulerName"].is_null() {
            obj["spec"]["schedulerName"] = json!("default-scheduler");
        }
        let manager = req
            .params
            .field_manager
            .clone()
            .unwrap_or_else(|| user.manager());
        match applied {
            Some(managed) => obj["metadata"]["managedFields"] = managed,
            None => apply::record_update(&mut obj, None, &manager, &api_version(res), "Update"),
        }
        let errors = validation::validate(res, &obj);
        if !errors.is_empty() {
            return Err(ApiError::invalid(res.group, res.kind, &name, errors.0));
        }
        Ok(obj)
    }

    /// Checks the namespace of a new object exists and is not being deleted.
    async fn check_namespace(&self, ns: &str) -> Result<(), ApiError> {
        let ns_res = crate::request::find_resource("", "v1", "namespaces")?;
        match self.read(ns_res, None, ns).await? {
            None => Err(ApiError::not_found("", "namespaces", ns)),
            Some((n, _)) if n["metadata"]["deletionTimestamp"].is_string() => {
                Err(ApiError::forbidden(format!(
                    "unable to create new content in namespace {ns} because it is being terminated"
                )))
            }
            Some(_) => Ok(()),
        }
    }

    async fn create(&self, req: &ApiRequest, user: &User) -> Result<ApiResponse, ApiError> {
        let (obj, warnings) = self.decode_body(req)?;
        self.create_object(req, user, obj, warnings, None).await
    }

    /// Creates for server-side apply, when the object does not exist yet: `obj` is the
    /// configuration, `managed` its managedFields (all the applier's).
    pub(crate) async fn create_applied(
        &self,
        req: &ApiRequest,
        user: &User,
        obj: Value,
        managed: Value,
    ) -> Result<ApiResponse, ApiError> {
        let (obj, warnings) = self.typed(req, obj)?;
        self.create_object(req, user, obj, warnings, Some(managed))
            .await
    }

    async fn create_object(
        &self,
        req: &ApiRequest,
        user: &User,
        obj: Value,
        warnings: Vec<String>,
        applied: Option<Value>,
    ) -> Result<ApiResponse, ApiError> {
        let mut obj = self.prepare_new(req, user, obj, applied).await?;
        let res = req.resource;
        if let Some(ns) = req.namespace.as_deref() {
            self.check_namespace(ns).await?;
        }
        if res.plural == "pods" {
            self.apply_limit_ranges(req, &mut obj).await?;
        }
        if res.plural == "resourcequotas"
            && let Some(ns) = req.namespace.as_deref()
        {
            let used = self
                .usage_in(ns, &quantity_map(&obj["spec"]["hard"]))
                .await?;
            obj["status"] = json!({"hard": obj["spec"]["hard"], "used": quantity_json(&used)});
        }
        let name = name_of(&obj).to_owned();
        // A pod is charged to its tenant's quota first, and refunded if the create fails.
        let tenant_charged = match (res.plural, req.namespace.as_deref()) {
            ("pods", Some(ns)) => {
                self.tenant_quota(ns, &obj, true, req.params.dry_run)
                    .await?
            }
            _ => false,
        };
        if req.params.dry_run {
            return Ok(ApiResponse::Object {
                code: 201,
                body: obj,
                warnings,
            });
        }
        let result = self.commit_create(req, &obj, &name, warnings).await;
        if result.is_err()
            && tenant_charged
            && let Some(ns) = req.namespace.as_deref()
            && let Err(e) = self.tenant_quota(ns, &obj, false, false).await
        {
            tracing::warn!(error = %e, pod = %name, "could not refund a tenant quota reservation; the quota controller will");
        }
        result
    }

    /// Writes a new object, with its ResourceQuota charges in the same transaction.
    async fn commit_create(
        &self,
        req: &ApiRequest,
        obj: &Value,
        name: &str,
        warnings: Vec<String>,
    ) -> Result<ApiResponse, ApiError> {
        let res = req.resource;
        let key = object_key(res, req.namespace.as_deref(), name);
        let value = encode(obj)?;
        // Pods count against ResourceQuotas in the same transaction that creates them, so
        // that concurrent creates can never overshoot a quota.
        for _attempt in 0..16 {
            let mut ops = vec![Op::Create {
                key: key.clone().into(),
                value: value.clone(),
                lease: 0,
            }];
            ops.extend(self.quota_ops(req, obj, true).await?);
            match self.store.txn(ops).await {
                Ok(t) => {
                    let rev = match t.results.first() {
                        Some(tessera_store::OpResult::Written(kv)) => kv.mod_revision,
                        _ => t.revision,
                    };
                    return Ok(ApiResponse::Object {
                        code: 201,
                        body: with_rv(obj.clone(), rev),
                        warnings,
                    });
                }
                Err(e) => match e.precondition() {
                    Some(p) if p.index == 0 => {
                        return Err(ApiError::already_exists(res.group, res.plural, name));
                    }
                    // A quota changed under us: read it again.
                    Some(_) => continue,
                    None => return Err(store_error(e)),
                },
            }
        }
        Err(ApiError::conflict_because(
            res.group,
            res.plural,
            name,
            "the namespace's resource quotas kept changing; try again",
        ))
    }

    /// Every object of core/v1 `plural` in namespace `ns` (a namespace's few quotas or
    /// limit ranges).
    async fn all_in(&self, plural: &str, ns: &str) -> Result<Vec<KeyValue>, ApiError> {
        let res = crate::request::find_resource("", "v1", plural)?;
        Ok(self
            .store
            .list(ListRequest {
                prefix: prefix(res, Some(ns)).into(),
                ..Default::default()
            })
            .await
            .map_err(store_error)?
            .kvs)
    }

    /// What the objects in `ns` use of the resources a quota limits (`hard`): a quota
    /// starts from the namespace's current usage; from then on every create and delete
    /// charges it in the same transaction.
    async fn usage_in(
        &self,
        ns: &str,
        hard: &BTreeMap<String, Quantity>,
    ) -> Result<BTreeMap<String, Quantity>, ApiError> {
        let mut used: BTreeMap<String, Quantity> = hard
            .keys()
            .map(|k| (k.clone(), Quantity::from_units(0)))
            .collect();
        let mut add = |usage: BTreeMap<String, Quantity>| {
            for (k, v) in usage {
                if let Some(u) = used.get_mut(&k) {
                    *u = u.saturating_add(v);
                }
            }
        };
        for res in crate::catalog::RESOURCES.iter().filter(|r| r.namespaced) {
            let counted = format!("count/{}", crate::status::qualified(res.group, res.plural));
            let by_name = res.group.is_empty()
                && ["services", "secrets", "configmaps", "resourcequotas"].contains(&res.plural);
            let tracked = hard.contains_key(&counted)
                || (by_name && hard.contains_key(res.plural))
                || (res.plural == "pods" && !hard.is_empty());
            if !tracked {
                continue;
            }
            let page = self
                .store
                .list(ListRequest {
                    prefix: prefix(res, Some(ns)).into(),
                    ..Default::default()
                })
                .await
                .map_err(store_error)?;
            for kv in &page.kvs {
                let obj = decode_stored(kv)?;
                if res.plural == "pods" {
                    add(pod_usage(&obj));
                } else {
                    let mut m = BTreeMap::new();
                    m.insert(counted.clone(), Quantity::from_units(1));
                    if by_name {
                        m.insert(res.plural.to_owned(), Quantity::from_units(1));
                    }
                    add(m);
                }
            }
        }
        Ok(used)
    }

    /// LimitRange admission: container defaults filled in, min/max checked.
    async fn apply_limit_ranges(&self, req: &ApiRequest, pod: &mut Value) -> Result<(), ApiError> {
        let Some(ns) = req.namespace.as_deref() else {
            return Ok(());
        };
        let ranges = self.all_in("limitranges", ns).await?;
        let mut causes = Vec::new();
        for kv in &ranges {
            let range = decode_stored(kv)?;
            for limit in range["spec"]["limits"].as_array().into_iter().flatten() {
                if limit["type"] != "Container" {
                    continue;
                }
                let containers = pod["spec"]["containers"]
                    .as_array_mut()
                    .map(std::mem::take)
                    .unwrap_or_default();
                let mut out = Vec::with_capacity(containers.len());
                for (i, mut c) in containers.into_iter().enumerate() {
                    // Requests set from limits first (Kubernetes' defaulting, before
                    // admission), then the range's defaults for what is still unset.
                    for (k, v) in c["resources"]["limits"]
                        .as_object()
                        .cloned()
                        .unwrap_or_default()
                    {
                        if c["resources"]["requests"][&k].is_null() {
                            c["resources"]["requests"][&k] = v;
                        }
                    }
                    for (from, to) in [("default", "limits"), ("defaultRequest", "requests")] {
                        for (k, v) in limit[from].as_object().into_iter().flatten() {
                            if c["resources"][to][k].is_null() {
                                c["resources"][to][k] = v.clone();
                            }
                        }
                    }
                    // Kubernetes defaults a missing request to the limit.
                    for (k, v) in c["resources"]["limits"]
                        .as_object()
                        .cloned()
                        .unwrap_or_default()
                    {
                        if c["resources"]["requests"][&k].is_null() {
                            c["resources"]["requests"][&k] = v;
                        }
                    }
                    for (bound, section, cmp) in [
                        ("max", "limits", std::cmp::Ordering::Greater),
                        ("min", "requests", std::cmp::Ordering::Less),
                    ] {
                        for (k, b) in quantity_map(&limit[bound]) {
                            let v = c["resources"][section][&k]
                                .as_str()
                                .and_then(|s| s.parse::<Quantity>().ok());
                            match v {
                                Some(v) if v.cmp(&b) == cmp => causes.push(Cause {
                                    reason: "FieldValueForbidden",
                                    field: format!("spec.containers[{i}].resources.{section}"),
                                    message: format!(
                                        "Forbidden: {bound} {k} usage per Container is {b}, but {section} is {v} (LimitRange {})",
                                        name_of(&range)
                                    ),
                                }),
                                None if bound == "max" => causes.push(Cause {
                                    reason: "FieldValueRequired",
                                    field: format!("spec.containers[{i}].resources.limits[{k}]"),
                                    message: format!(
                                        "Required value: LimitRange {} sets a maximum {k}, so every container must set a {k} limit",
                                        name_of(&range)
                                    ),
                                }),
                                _ => {}
                            }
                        }
                    }
                    out.push(c);
                }
                pod["spec"]["containers"] = Value::Array(out);
            }
        }
        if !causes.is_empty() {
            return Err(ApiError::invalid("", "Pod", name_of(pod), causes).forbidden_reason());
        }
        Ok(())
    }

    /// Store operations that charge (or refund) `obj` to its namespace's ResourceQuotas,
    /// conditional on each quota's revision. Fails with 403 when a quota would be exceeded.
    async fn quota_ops(
        &self,
        req: &ApiRequest,
        obj: &Value,
        charge: bool,
    ) -> Result<Vec<Op>, ApiError> {
        let Some(ns) = req.namespace.as_deref() else {
            return Ok(Vec::new());
        };
        let res = req.resource;
        let usage: BTreeMap<String, Quantity> = if res.plural == "pods" {
            pod_usage(obj)
        } else {
            let mut m = BTreeMap::new();
            m.insert(
                format!("count/{}", crate::status::qualified(res.group, res.plural)),
                Quantity::from_units(1),
            );
            if res.group.is_empty()
                && ["services", "secrets", "configmaps", "resourcequotas"].contains(&res.plural)
            {
                m.insert(res.plural.to_owned(), Quantity::from_units(1));
            }
            m
        };
        let quotas = self.all_in("resourcequotas", ns).await?;
        let mut ops = Vec::new();
        for kv in &quotas {
            let mut quota = decode_stored(kv)?;
            let hard = quantity_map(&quota["spec"]["hard"]);
            if !hard.keys().any(|k| usage.contains_key(k)) {
                continue;
            }
            let mut used = quantity_map(&quota["status"]["used"]);
            for (k, limit) in &hard {
                let Some(add) = usage.get(k) else { continue };
                let cur = used
                    .get(k)
                    .cloned()
                    .unwrap_or_else(|| Quantity::from_units(0));
                let next = if charge {
                    cur.saturating_add(*add)
                } else {
                    cur.saturating_sub(*add)
                };
                if charge && next > *limit {
                    return Err(ApiError::forbidden(format!(
                        "{} \"{}\" is forbidden: exceeded quota: {}, requested: {k}={add}, used: {k}={}, limited: {k}={limit}",
                        crate::status::qualified(res.group, res.plural),
                        name_of(obj),
                        name_of(&quota),
                        used.get(k)
                            .cloned()
                            .unwrap_or_else(|| Quantity::from_units(0)),
                    )));
                }
                used.insert(k.clone(), next);
            }
            quota["status"]["hard"] = quantity_json(&hard);
            quota["status"]["used"] = quantity_json(&used);
            ops.push(Op::Update {
                key: kv.key.clone(),
                value: encode(&quota)?,
                expected: kv.mod_revision,
                lease: 0,
            });
        }
        Ok(ops)
    }

    /// `pods/binding`: assigns an unassigned pod to a node, once.
    async fn bind(&self, req: &ApiRequest, user: &User) -> Result<ApiResponse, ApiError> {
        let binding: Value = serde_json::from_slice(&req.body)
            .map_err(|e| ApiError::bad_request(format!("the Binding is not valid JSON: {e}")))?;
        if let Some(t) = kinds::of_kind("", "Binding") {
            (t.normalize)(&binding).map_err(|e| {
                ApiError::bad_request(format!(
                    "the Binding is not valid: {}: {}",
                    e.path, e.message
                ))
            })?;
        }
        let node = binding["target"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        if node.is_empty() {
            return Err(ApiError::invalid(
                "",
                "Binding",
                req.name.as_deref().unwrap_or_default(),
                vec![Cause {
                    reason: "FieldValueRequired",
                    field: "target.name".into(),
                    message: "Required value".into(),
                }],
            ));
        }
        let res = req.resource;
        let name = req.name.clone().unwrap_or_default();
        self.write_existing(
            req,
            user,
            move |mut pod| {
                if let Some(current) = pod["spec"]["nodeName"].as_str().filter(|n| !n.is_empty()) {
                    return Err(ApiError::conflict_because(
                        res.group,
                        res.plural,
                        &name,
                        &format!("pod {name} is already assigned to node \"{current}\""),
                    ));
                }
                if pod["metadata"]["deletionTimestamp"].is_string() {
                    return Err(ApiError::conflict_because(
                        res.group,
                        res.plural,
                        &name,
                        "the pod is being deleted",
                    ));
                }
                pod["spec"]["nodeName"] = json!(node);
                let cond = json!({"type": "PodScheduled", "status": "True",
                    "lastTransitionTime": rfc3339(now_secs())});
                let conds = pod["status"]["conditions"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
                    .into_iter()
                    .filter(|c| c["type"] != "PodScheduled")
                    .chain(std::iter::once(cond))
                    .collect::<Vec<_>>();
                pod["status"]["conditions"] = json!(conds);
                Ok(pod)
            },
            Vec::new(),
        )
        .await
        .map(|r| match r {
            ApiResponse::Object { warnings, .. } => ApiResponse::Object {
                code: 201,
                body: json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}),
                warnings,
            },
            other => other,
        })
    }

    async fn patch(
        &self,
        req: &ApiRequest,
        user: &User,
        pt: PatchType,
    ) -> Result<ApiResponse, ApiError> {
        let res = req.resource;
        if pt == PatchType::StrategicMerge && res.group == "tessera.io" {
            return Err(ApiError::new(
                415,
                "UnsupportedMediaType",
                "strategic merge patch is not supported for tessera.io kinds (as for custom resources): use a JSON merge patch (--type=merge) or a JSON patch (--type=json)",
            ));
        }
        if pt == PatchType::Apply {
            return apply::apply(self, req, user).await;
        }
        let body = req.body.clone();
        let sub = req.subresource.clone();
        let schema = target_schema(req);
        let warnings = Vec::new();
        self.write_existing(
            req,
            user,
            move |current| {
                let mut doc = match sub.as_deref() {
                    Some("scale") => to_scale_plain(res, &current),
                    _ => current.clone(),
                };
                let result = match pt {
                    PatchType::Json => patch::json_patch(&mut doc, &body),
                    PatchType::Merge => patch::merge_patch(&mut doc, &body),
                    PatchType::StrategicMerge => patch::strategic_merge(&mut doc, &body, &schema),
                    PatchType::Apply => Ok(()),
                };
                result.map_err(|e| {
                    ApiError::new(
                        422,
                        "Invalid",
                        format!("the patch could not be applied: {}", e.0),
                    )
                })?;
                Ok(doc)
            },
            warnings,
        )
        .await
    }

    /// Reads the object, computes the new one with `change` (which sees the current object,
    /// or its Scale for the scale subresource), and writes it if nothing changed in between;
    /// retried on a concurrent change unless the new object pins a resourceVersion.
    pub(crate) async fn write_existing<F>(
        &self,
        req: &ApiRequest,
        user: &User,
        change: F,
        mut warnings: Vec<String>,
    ) -> Result<ApiResponse, ApiError>
    where
        F: Fn(Value) -> Result<Value, ApiError>,
    {
        let res = req.resource;
        let name = req.name.clone().unwrap_or_default();
        let ns = req.namespace.as_deref();
        for _attempt in 0..16 {
            let (current, kv) = self
                .read(res, ns, &name)
                .await?
                .ok_or_else(|| ApiError::not_found(res.group, res.plural, &name))?;
            let proposed = change(current.clone())?;
            // Patched and replaced objects go through the same decoding as new ones.
            let (mut proposed, w) = if req.verb == Verb::Update {
                (proposed, Vec::new())
            } else {
                self.typed(req, proposed)?
            };
            warnings.extend(w);
            if req.subresource.as_deref() == Some("scale") {
                proposed = from_scale(res, &current, &proposed)?;
            }
            let pinned = proposed["metadata"]["resourceVersion"]
                .as_str()
                .filter(|rv| !rv.is_empty())
                .map(str::to_owned);
            if let Some(rv) = &pinned {
                let want: i64 = rv.parse().map_err(|_| {
                    ApiError::bad_request(format!(
                        "metadata.resourceVersion {rv:?} is not one this server issued"
                    ))
                })?;
                if want != kv.mod_revision {
                    return Err(ApiError::conflict(res.group, res.plural, &name));
                }
            }
            let next = self.merge_update(req, user, &current, proposed)?;
            if next == current {
                // Nothing changed: no write, the same resourceVersion (as Kubernetes).
                return Ok(ApiResponse::Object {
                    code: 200,
                    body: current,
                    warnings,
                });
            }
            let errors = validation::validate(res, &next);
            if !errors.is_empty() {
                return Err(ApiError::invalid(res.group, res.kind, &name, errors.0));
            }
            if req.params.dry_run {
                return Ok(ApiResponse::Object {
                    code: 200,
                    body: next,
                    warnings,
                });
            }
            // Removing the last finalizer of an object being deleted deletes it.
            let finalized = next["metadata"]["deletionTimestamp"].is_string()
                && next["metadata"]["finalizers"]
                    .as_array()
                    .is_none_or(|f| f.is_empty())
                && !(res.plural == "pods" && awaiting_kubelet(&next))
                && (res.plural != "namespaces" || namespace_finalized(&next));
            let result = if finalized {
                self.store
                    .delete(kv.key.clone(), Some(kv.mod_revision))
                    .await
                    .map(|d| d.mod_revision)
            } else {
                self.store
                    .update(kv.key.clone(), encode(&next)?, kv.mod_revision)
                    .await
                    .map(|w| w.mod_revision)
            };
            match result {
                Ok(rev) => {
                    return Ok(ApiResponse::Object {
                        code: 200,
                        body: with_rv(next, rev),
                        warnings,
                    });
                }
                // Changed in between: read again. A client-pinned resourceVersion now
                // differs from the stored one, and the check above answers 409.
                Err(e) if e.precondition().is_some() => continue,
                Err(e) => return Err(store_error(e)),
            }
        }
        Err(ApiError::conflict(res.group, res.plural, &name))
    }

    /// The stored object after an update: what the client may not change is kept from
    /// `current`; the main resource does not change status and the status subresource
    /// changes nothing else; generation counts spec changes; managedFields are updated.
    fn merge_update(
        &self,
        req: &ApiRequest,
        user: &User,
        current: &Value,
        proposed: Value,
    ) -> Result<Value, ApiError> {
        let res = req.resource;
        let name = req.name.as_deref().unwrap_or_default();
        let mut next = match req.subresource.as_deref() {
            // A binding sets the node and the PodScheduled condition together.
            Some("binding") => proposed,
            Some("status") => {
                let mut n = current.clone();
                n["status"] = proposed["status"].clone();
                n
            }
            _ => {
                let mut n = proposed;
                if has_status(res) && res.plural != "namespaces" {
                    n["status"] = current["status"].clone();
                }
                if res.plural == "namespaces" {
                    n["status"] = current["status"].clone();
                }
                n
            }
        };
        if next["status"].is_null()
            && let Some(o) = next.as_object_mut()
        {
            o.remove("status");
        }
        let body_name = next["metadata"]["name"].as_str().unwrap_or(name).to_owned();
        if body_name != name {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({body_name}) does not match the name on the URL ({name})"
            )));
        }
        if let Some(body_ns) = next["metadata"]["namespace"].as_str()
            && Some(body_ns) != req.namespace.as_deref()
            && !body_ns.is_empty()
        {
            return Err(ApiError::bad_request(format!(
                "the namespace of the object ({body_ns}) does not match the namespace on the URL ({})",
                req.namespace.as_deref().unwrap_or("none")
            )));
        }
        if !next["metadata"].is_object() {
            next["metadata"] = json!({});
        }
        if let Some(uid) = next["metadata"]["uid"].as_str()
            && Some(uid) != current["metadata"]["uid"].as_str()
        {
            return Err(ApiError::conflict_because(
                res.group,
                res.plural,
                name,
                &format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                    current["metadata"]["uid"].as_str().unwrap_or_default()
                ),
            ));
        }
        for field in [
            "uid",
            "creationTimestamp",
            "namespace",
            "name",
            "generation",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "resourceVersion",
        ] {
            match current["metadata"].get(field) {
                Some(v) => next["metadata"][field] = v.clone(),
                None => {
                    if let Some(m) = next["metadata"].as_object_mut() {
                        m.remove(field);
                    }
                }
            }
        }
        // Immutable fields.
        if res.plural == "pods"
            && req.subresource.is_none()
            && let (Some(a), Some(b)) = (
                current["spec"]["nodeName"].as_str(),
                next["spec"]["nodeName"].as_str(),
            )
            && a != b
        {
            return Err(ApiError::invalid(
                res.group,
                res.kind,
                name,
                vec![Cause {
                    reason: "FieldValueForbidden",
                    field: "spec.nodeName".into(),
                    message:
                        "Forbidden: pod updates may not change the node; delete the pod instead"
                            .into(),
                }],
            ));
        }
        if res.plural == "pods"
            && current["spec"]["nodeName"].is_string()
            && next["spec"]["nodeName"].is_null()
        {
            next["spec"]["nodeName"] = current["spec"]["nodeName"].clone();
        }
        let spec_changed = next.get("spec") != current.get("spec")
            || (current.get("spec").is_none()
                && strip_meta_status(&next) != strip_meta_status(current));
        if spec_changed && req.subresource.as_deref() != Some("status") {
            let g = current["metadata"]["generation"].as_i64().unwrap_or(1);
            next["metadata"]["generation"] = json!(g + 1);
        }
        if let Some(m) = next["metadata"].as_object_mut() {
            m.retain(|_, v| !v.is_null());
        }
        let manager = req
            .params
            .field_manager
            .clone()
            .unwrap_or_else(|| user.manager());
        let op = if matches!(req.verb, Verb::Patch(PatchType::Apply)) {
            "Apply"
        } else {
            "Update"
        };
        if op == "Update" {
            apply::record_update(&mut next, Some(current), &manager, &api_version(res), op);
        }
        Ok(next)
    }

    async fn delete(&self, req: &ApiRequest) -> Result<ApiResponse, ApiError> {
        let res = req.resource;
        let name = req.name.clone().unwrap_or_default();
        let opts = delete_options(req)?;
        for _attempt in 0..16 {
            let (current, kv) = self
                .read(res, req.namespace.as_deref(), &name)
                .await?
                .ok_or_else(|| ApiError::not_found(res.group, res.plural, &name))?;
            match self.delete_one(req, &opts, current, kv).await {
                Err(e) if e.reason == "Conflict" && opts.precondition_rv.is_none() => continue,
                other => return other,
            }
        }
        Err(ApiError::conflict(res.group, res.plural, &name))
    }

    async fn delete_one(
        &self,
        req: &ApiRequest,
        opts: &DeleteOpts,
        current: Value,
        kv: KeyValue,
    ) -> Result<ApiResponse, ApiError> {
        let res = req.resource;
        let name = name_of(&current).to_owned();
        if let Some(uid) = &opts.precondition_uid
            && current["metadata"]["uid"].as_str() != Some(uid)
        {
            return Err(ApiError::conflict_because(
                res.group,
                res.plural,
                &name,
                &format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                    current["metadata"]["uid"].as_str().unwrap_or_default()
                ),
            ));
        }
        if let Some(rv) = &opts.precondition_rv
            && current["metadata"]["resourceVersion"].as_str() != Some(rv)
        {
            return Err(ApiError::conflict_because(
                res.group,
                res.plural,
                &name,
                &format!(
                    "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                    current["metadata"]["resourceVersion"]
                        .as_str()
                        .unwrap_or_default()
                ),
            ));
        }
        let mut next = current.clone();
        let finalizers: Vec<String> = next["metadata"]["finalizers"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|f| f.as_str().map(str::to_owned))
            .collect();
        let add = |f: &str, next: &mut Value| {
            if !finalizers.iter().any(|x| x == f) {
                let mut list = next["metadata"]["finalizers"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default();
                list.push(json!(f));
                next["metadata"]["finalizers"] = json!(list);
            }
        };
        match opts.propagation {
            Some(Propagation::Foreground) => add(FOREGROUND_FINALIZER, &mut next),
            Some(Propagation::Orphan) => add(ORPHAN_FINALIZER, &mut next),
            _ => {}
        }
        let grace = match (res.plural, opts.grace) {
            ("pods", Some(g)) => g.max(0),
            ("pods", None) => next["spec"]["terminationGracePeriodSeconds"]
                .as_i64()
                .unwrap_or(30),
            _ => 0,
        };
        // A pod on a node waits for its agent to stop it, within the grace period.
        let graceful = res.plural == "pods"
            && next["spec"]["nodeName"].is_string()
            && grace > 0
            && !matches!(
                next["status"]["phase"].as_str(),
                Some("Succeeded" | "Failed")
            );
        let pending_finalizers = next["metadata"]["finalizers"]
            .as_array()
            .is_some_and(|f| !f.is_empty());
        let namespace_with_content =
            res.plural == "namespaces" && !self.namespace_is_empty(&name).await?;
        if pending_finalizers || graceful || namespace_with_content {
            if next["metadata"]["deletionTimestamp"].is_null() {
                next["metadata"]["deletionTimestamp"] = json!(rfc3339(now_secs() + grace));
                next["metadata"]["deletionGracePeriodSeconds"] = json!(grace);
                let g = next["metadata"]["generation"].as_i64().unwrap_or(1);
                next["metadata"]["generation"] = json!(g + 1);
            } else if graceful {
                // A shorter grace period may be asked for later, never a longer one.
                let had = next["metadata"]["deletionGracePeriodSeconds"]
                    .as_i64()
                    .unwrap_or(grace);
                if grace < had {
                    next["metadata"]["deletionTimestamp"] = json!(rfc3339(now_secs() + grace));
                    next["metadata"]["deletionGracePeriodSeconds"] = json!(grace);
                }
            }
            if res.plural == "namespaces" {
                next["status"]["phase"] = json!("Terminating");
            }
            if next == current || req.params.dry_run {
                return Ok(ApiResponse::ok(next));
            }
            return match self
                .store
                .update(kv.key.clone(), encode(&next)?, kv.mod_revision)
                .await
            {
                Ok(w) => Ok(ApiResponse::Object {
                    code: 200,
                    body: with_rv(next, w.mod_revision),
                    warnings: Vec::new(),
                }),
                Err(e) if e.precondition().is_some() => {
                    Err(ApiError::conflict(res.group, res.plural, &name))
                }
                Err(e) => Err(store_error(e)),
            };
        }
        if req.params.dry_run {
            return Ok(ApiResponse::ok(current));
        }
        let mut ops = vec![Op::Delete {
            key: kv.key.clone(),
            expected: Some(kv.mod_revision),
        }];
        let mut quota_req = req.clone();
        quota_req.namespace = current["metadata"]["namespace"].as_str().map(str::to_owned);
        if res.namespaced {
            ops.extend(self.quota_ops(&quota_req, &current, false).await?);
        }
        match self.store.txn(ops).await {
            Ok(_) => {
                if res.plural == "pods"
                    && let Some(ns) = current["metadata"]["namespace"].as_str()
                    && let Err(e) = self.tenant_quota(ns, &current, false, false).await
                {
                    tracing::warn!(error = %e, pod = %name, "could not refund a tenant quota; the quota controller will");
                }
                Ok(ApiResponse::ok(current))
            }
            Err(e) if e.precondition().is_some() => {
                Err(ApiError::conflict(res.group, res.plural, &name))
            }
            Err(e) => Err(store_error(e)),
        }
    }

    async fn namespace_is_empty(&self, ns: &str) -> Result<bool, ApiError> {
        for res in crate::catalog::RESOURCES.iter().filter(|r| r.namespaced) {
            let page = self
                .store
                .list(ListRequest {
                    prefix: prefix(res, Some(ns)).into(),
                    limit: 1,
                    ..Default::default()
                })
                .await
                .map_err(store_error)?;
            if !page.kvs.is_empty() {
                return Ok(false);
            }
        }
        Ok(true)
    }

    async fn delete_collection(
        &self,
        req: &ApiRequest,
        allowed: &Option<Vec<String>>,
    ) -> Result<ApiResponse, ApiError> {
        let found = self.list_items(req, allowed).await?;
        let opts = delete_options(req)?;
        let mut deleted = Vec::new();
        for (value, _) in &found.items {
            let item: Value = serde_json::from_slice(value)
                .map_err(|e| ApiError::internal(format!("stored object is not JSON: {e}")))?;
            let item = &item;
            let mut one = req.clone();
            one.name = Some(name_of(item).to_owned());
            one.namespace = item["metadata"]["namespace"].as_str().map(str::to_owned);
            let Some((current, kv)) = self
                .read(req.resource, one.namespace.as_deref(), name_of(item))
                .await?
            else {
                continue;
            };
            match self.delete_one(&one, &opts, current, kv).await {
                Ok(ApiResponse::Object { body, .. }) => deleted.push(body),
                Ok(_) => {}
                Err(e) if e.code == 404 || e.code == 409 => {}
                Err(e) => return Err(e),
            }
        }
        Ok(ApiResponse::ok(json!({
            "kind": format!("{}List", req.resource.kind),
            "apiVersion": api_version(req.resource),
            "metadata": {"resourceVersion": found.revision.to_string()},
            "items": deleted,
        })))
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

fn strip_meta_status(v: &Value) -> Value {
    let mut v = v.clone();
    if let Some(o) = v.as_object_mut() {
        o.remove("metadata");
        o.remove("status");
    }
    v
}

/// True if revision `a` is at or after `b` (every part, for composite revisions).
fn revision_at_least(a: &Revision, b: &Revision) -> bool {
    let parts = |r: &Revision| -> Vec<i64> {
        r.to_string()
            .trim_start_matches("c.")
            .split('.')
            .filter_map(|p| p.parse().ok())
            .collect()
    };
    let (pa, pb) = (parts(a), parts(b));
    if pa.len() != pb.len() {
        return pa.iter().sum::<i64>() >= pb.iter().sum::<i64>();
    }
    pa.iter().zip(&pb).all(|(x, y)| x >= y)
}

/// The (group, version, kind) a request body must be: the resource's kind, or the
/// subresource's (`Scale`, `Binding`).
fn target_kind(req: &ApiRequest) -> (&'static str, &'static str, &'static str) {
    match req.subresource.as_deref() {
        Some("scale") => ("autoscaling", "v1", "Scale"),
        _ => (req.resource.group, req.resource.version, req.resource.kind),
    }
}

fn target_schema(req: &ApiRequest) -> String {
    let (g, _, k) = target_kind(req);
    kinds::of_kind(g, k).map_or_else(String::new, |t| (t.schema_name)())
}

fn qos_class(pod: &Value) -> &'static str {
    let containers = pod["spec"]["containers"].as_array();
    let mut any = false;
    let mut guaranteed = true;
    for c in containers.into_iter().flatten() {
        let r = &c["resources"];
        for k in ["cpu", "memory"] {
            let req = r["requests"][k].as_str().or(r["limits"][k].as_str());
            let lim = r["limits"][k].as_str();
            if req.is_some() || lim.is_some() {
                any = true;
            }
            if lim.is_none() || req != lim {
                guaranteed = false;
            }
        }
    }
    match (any, guaranteed) {
        (false, _) => "BestEffort",
        (true, true) => "Guaranteed",
        (true, false) => "Burstable",
    }
}

fn to_scale_plain(res: &Resource, obj: &Value) -> Value {
    let selector = obj["spec"]["selector"]["matchLabels"]
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                .collect::<Vec<_>>()
                .join(",")
        })
        .unwrap_or_default();
    let _ = res;
    json!({
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {
            "name": obj["metadata"]["name"],
            "namespace": obj["metadata"]["namespace"],
            "uid": obj["metadata"]["uid"],
            "resourceVersion": obj["metadata"]["resourceVersion"],
            "creationTimestamp": obj["metadata"]["creationTimestamp"],
        },
        "spec": {"replicas": obj["spec"]["replicas"].as_i64().unwrap_or(1)},
        "status": {"replicas": obj["status"]["replicas"].as_i64().unwrap_or(0), "selector": selector},
    })
}

fn to_scale(req: &ApiRequest, obj: &Value) -> Value {
    to_scale_plain(req.resource, obj)
}

/// The object after a write to its Scale: only `spec.replicas` changes.
fn from_scale(res: &Resource, current: &Value, scale: &Value) -> Result<Value, ApiError> {
    let replicas = scale["spec"]["replicas"].as_i64().unwrap_or(0);
    if replicas < 0 {
        return Err(ApiError::invalid(
            "autoscaling",
            "Scale",
            name_of(current),
            vec![Cause {
                reason: "FieldValueInvalid",
                field: "spec.replicas".into(),
                message: format!("Invalid value: {replicas}: must be greater than or equal to 0"),
            }],
        ));
    }
    let _ = res;
    let mut next = current.clone();
    next["spec"]["replicas"] = json!(replicas);
    if let Some(rv) = scale["metadata"]["resourceVersion"].as_str() {
        next["metadata"]["resourceVersion"] = json!(rv);
    }
    Ok(next)
}

struct DeleteOpts {
    propagation: Option<Propagation>,
    grace: Option<i64>,
    precondition_uid: Option<String>,
    precondition_rv: Option<String>,
}

/// DeleteOptions from the body (if any) and the query.
fn delete_options(req: &ApiRequest) -> Result<DeleteOpts, ApiError> {
    let mut o = DeleteOpts {
        propagation: req.params.propagation,
        grace: req.params.grace_period_seconds,
        precondition_uid: None,
        precondition_rv: None,
    };
    if req.body.iter().all(u8::is_ascii_whitespace) {
        return Ok(o);
    }
    let body: Value = serde_json::from_slice(&req.body)
        .map_err(|e| ApiError::bad_request(format!("the DeleteOptions are not valid JSON: {e}")))?;
    let typed: k8s_openapi::apimachinery::pkg::apis::meta::v1::DeleteOptions =
        serde_path_to_error::deserialize(&body).map_err(|e| {
            ApiError::bad_request(format!(
                "the DeleteOptions are not valid: {}: {}",
                e.path(),
                e.inner()
            ))
        })?;
    if let Some(p) = typed.propagation_policy.as_deref() {
        o.propagation = Some(crate::request::propagation(p)?);
    }
    if typed.orphan_dependents == Some(true) {
        o.propagation = Some(Propagation::Orphan);
    }
    if let Some(g) = typed.grace_period_seconds {
        o.grace = Some(g);
    }
    if let Some(p) = typed.preconditions {
        o.precondition_uid = p.uid;
        o.precondition_rv = p.resource_version;
    }
    if typed.dry_run.is_some_and(|d| d.iter().any(|x| x == "All")) {
        // Handled through the request's dryRun below; a body-only dryRun is honoured too.
    }
    Ok(o)
}

impl ApiError {
    /// The same error with reason Forbidden (403), as LimitRange admission answers.
    fn forbidden_reason(mut self) -> Self {
        self.code = 403;
        self.reason = "Forbidden";
        self
    }
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
    }

    #[test]
    fn revisions_compare_part_by_part() {
        let r = |s: &str| s.parse::<Revision>().expect("revision");
        assert!(revision_at_least(&r("10"), &r("9")));
        assert!(!revision_at_least(&r("9"), &r("10")));
        assert!(revision_at_least(&r("c.5.7"), &r("c.5.6")));
        assert!(!revision_at_least(&r("c.5.7"), &r("c.6.1")));
    }

    #[test]
    fn qos_follows_requests_and_limits() {
        let pod = |r: Value| json!({"spec": {"containers": [{"resources": r}]}});
        assert_eq!(qos_class(&pod(json!({}))), "BestEffort");
        assert_eq!(
            qos_class(&pod(json!({"limits": {"cpu": "1", "memory": "1Gi"}}))),
            "Guaranteed"
        );
        assert_eq!(
            qos_class(&pod(json!({"requests": {"cpu": "1"}}))),
            "Burstable"
        );
    }
}
