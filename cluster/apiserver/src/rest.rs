//! The REST request path for objects: create, get, list and delete of every kind in the
//! catalog, stored as JSON under Kubernetes' key layout. (Update, patch, watch, selectors,
//! tables, admission and tenants come next.)

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Bytes;
use axum::extract::Path;
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use futures::StreamExt;
use serde_json::{Value, json};
use tessera_core::{keys, names};
use tessera_store::{EventKind, ListRequest, Revision, Store, StoreError};

use crate::catalog::{RESOURCES, Resource};
use crate::status::ApiError;

/// Largest request body accepted (etcd's own limit is 1.5 MiB).
pub const MAX_BODY_BYTES: usize = 3 << 20;

/// Shared state of the REST handlers.
#[derive(Clone)]
pub struct Rest {
    store: Arc<dyn Store>,
}

fn find(group: &str, version: &str, plural: &str) -> Result<&'static Resource, ApiError> {
    RESOURCES
        .iter()
        .find(|r| r.group == group && r.version == version && r.plural == plural)
        .ok_or_else(|| ApiError {
            code: StatusCode::NOT_FOUND,
            reason: "NotFound",
            message: format!(
                "the server could not find the requested resource ({plural} in {})",
                if group.is_empty() {
                    version.to_owned()
                } else {
                    format!("{group}/{version}")
                }
            ),
            details: None,
        })
}

fn api_version(res: &Resource) -> String {
    if res.group.is_empty() {
        res.version.to_owned()
    } else {
        format!("{}/{}", res.group, res.version)
    }
}

fn key(res: &Resource, ns: Option<&str>, name: &str) -> String {
    keys::object_key(&keys::resource_segment(res.group, res.plural), ns, name)
}

fn store_error(e: StoreError) -> ApiError {
    if e.is_invalid_input() {
        ApiError::bad_request(e.to_string())
    } else {
        ApiError::internal(format!("storage: {e}"))
    }
}

/// RFC 3339 in UTC, to the second, as Kubernetes writes timestamps.
fn now_rfc3339() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs()) as i64;
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

/// Decodes a request body into an object of `res`: size limit, JSON, kind and apiVersion
/// checked (filled in when missing).
fn parse_body(res: &Resource, body: &[u8]) -> Result<Value, ApiError> {
    if body.len() > MAX_BODY_BYTES {
        return Err(ApiError {
            code: StatusCode::PAYLOAD_TOO_LARGE,
            reason: "RequestEntityTooLarge",
            message: format!(
                "request body is {} bytes; the limit is {MAX_BODY_BYTES}",
                body.len()
            ),
            details: None,
        });
    }
    let mut obj: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("the request body is not valid JSON: {e}")))?;
    if !obj.is_object() {
        return Err(ApiError::bad_request(
            "the request body must be a JSON object",
        ));
    }
    let want_version = api_version(res);
    match obj.get("apiVersion").and_then(Value::as_str) {
        None => obj["apiVersion"] = json!(want_version),
        Some(v) if v == want_version => {}
        Some(v) => {
            return Err(ApiError::bad_request(format!(
                "the API version in the data ({v}) does not match the expected API version ({want_version})"
            )));
        }
    }
    match obj.get("kind").and_then(Value::as_str) {
        None => obj["kind"] = json!(res.kind),
        Some(k) if k == res.kind => {}
        Some(k) => {
            return Err(ApiError::bad_request(format!(
                "the kind in the data ({k}) does not match the expected kind ({})",
                res.kind
            )));
        }
    }
    Ok(obj)
}

/// Sets the object's resourceVersion from the store's mod revision.
fn with_resource_version(mut obj: Value, mod_revision: i64) -> Value {
    obj["metadata"]["resourceVersion"] = json!(mod_revision.to_string());
    obj
}

fn parse_stored(value: &[u8], mod_revision: i64) -> Result<Value, ApiError> {
    let obj: Value = serde_json::from_slice(value)
        .map_err(|e| ApiError::internal(format!("stored object is not JSON: {e}")))?;
    Ok(with_resource_version(obj, mod_revision))
}

fn json_ok(code: StatusCode, body: &Value) -> Response {
    (
        code,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

impl Rest {
    async fn create(
        &self,
        res: &'static Resource,
        ns: Option<&str>,
        body: &[u8],
    ) -> Result<Response, ApiError> {
        let mut obj = parse_body(res, body)?;
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
                    res.kind,
                    "",
                    "metadata.name",
                    "name or generateName is required",
                ));
            }
        };
        let name_check = if res.plural == "namespaces" {
            names::dns1123_label(&name)
        } else {
            names::dns1123_subdomain(&name)
        };
        if let Some(why) = name_check {
            return Err(ApiError::invalid(res.kind, &name, "metadata.name", why));
        }
        match (ns, meta.get("namespace").and_then(Value::as_str)) {
            (Some(path_ns), Some(body_ns)) if path_ns != body_ns => {
                return Err(ApiError::bad_request(format!(
                    "the namespace of the provided object ({body_ns}) does not match the namespace sent on the request ({path_ns})"
                )));
            }
            _ => {}
        }
        if let Some(n) = ns {
            meta["namespace"] = json!(n);
            let ns_key = keys::object_key("namespaces", None, n);
            if self
                .store
                .get(ns_key.as_bytes())
                .await
                .map_err(store_error)?
                .is_none()
            {
                return Err(ApiError::not_found("", "namespaces", n));
            }
        } else if let Some(m) = meta.as_object_mut() {
            m.remove("namespace");
        }
        meta["name"] = json!(name);
        meta["uid"] = json!(uid());
        meta["creationTimestamp"] = json!(now_rfc3339());
        meta["generation"] = json!(1);
        if let Some(m) = meta.as_object_mut() {
            m.remove("resourceVersion");
        }
        if res.plural == "namespaces" {
            obj["status"] = json!({"phase": "Active"});
        }
        let stored = serde_json::to_vec(&obj).map_err(|e| ApiError::internal(e.to_string()))?;
        let key = key(res, ns, &name);
        match self.store.create(key.into(), stored.into()).await {
            Ok(kv) => Ok(json_ok(
                StatusCode::CREATED,
                &with_resource_version(obj, kv.mod_revision),
            )),
            Err(e) if e.precondition().is_some() => {
                Err(ApiError::already_exists(res.group, res.plural, &name))
            }
            Err(e) => Err(store_error(e)),
        }
    }

    async fn get(
        &self,
        res: &'static Resource,
        ns: Option<&str>,
        name: &str,
    ) -> Result<Response, ApiError> {
        match self
            .store
            .get(key(res, ns, name).as_bytes())
            .await
            .map_err(store_error)?
        {
            Some(kv) => Ok(json_ok(
                StatusCode::OK,
                &parse_stored(&kv.value, kv.mod_revision)?,
            )),
            None => Err(ApiError::not_found(res.group, res.plural, name)),
        }
    }

    async fn list(&self, res: &'static Resource, ns: Option<&str>) -> Result<Response, ApiError> {
        let prefix = keys::resource_prefix(&keys::resource_segment(res.group, res.plural), ns);
        let mut items = Vec::new();
        let mut req = ListRequest {
            prefix: prefix.into(),
            limit: 1000,
            ..Default::default()
        };
        let revision = loop {
            let page = self.store.list(req.clone()).await.map_err(store_error)?;
            for kv in &page.kvs {
                items.push(parse_stored(&kv.value, kv.mod_revision)?);
            }
            match page.continue_token {
                Some(t) => req.continue_token = Some(t),
                None => break page.revision,
            }
        };
        Ok(json_ok(
            StatusCode::OK,
            &json!({
                "kind": format!("{}List", res.kind),
                "apiVersion": api_version(res),
                "metadata": {"resourceVersion": revision.to_string()},
                "items": items,
            }),
        ))
    }

    async fn update(
        &self,
        res: &'static Resource,
        ns: Option<&str>,
        name: &str,
        body: &[u8],
    ) -> Result<Response, ApiError> {
        let mut obj = parse_body(res, body)?;
        let key = key(res, ns, name);
        let current = self
            .store
            .get(key.as_bytes())
            .await
            .map_err(store_error)?
            .ok_or_else(|| ApiError::not_found(res.group, res.plural, name))?;
        let stored: Value = serde_json::from_slice(&current.value)
            .map_err(|e| ApiError::internal(format!("stored object is not JSON: {e}")))?;
        let meta = &mut obj["metadata"];
        if meta
            .get("name")
            .and_then(Value::as_str)
            .is_some_and(|n| n != name)
        {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({}) does not match the name on the URL ({name})",
                meta["name"].as_str().unwrap_or_default()
            )));
        }
        // Optimistic concurrency: a resourceVersion in the body must still be current.
        let expected = match meta.get("resourceVersion").and_then(Value::as_str) {
            Some(rv) if !rv.is_empty() => rv.parse::<i64>().map_err(|_| {
                ApiError::bad_request(format!(
                    "metadata.resourceVersion {rv:?} is not one this server issued"
                ))
            })?,
            _ => current.mod_revision,
        };
        if expected != current.mod_revision {
            return Err(ApiError::conflict(res.group, res.plural, name));
        }
        // What the server owns is kept from the stored object.
        for field in ["uid", "creationTimestamp", "namespace"] {
            meta[field] = stored["metadata"][field].clone();
        }
        meta["name"] = json!(name);
        let generation = stored["metadata"]["generation"].as_i64().unwrap_or(1);
        let spec_changed = obj.get("spec") != stored.get("spec");
        obj["metadata"]["generation"] = json!(if spec_changed {
            generation + 1
        } else {
            generation
        });
        if let Some(m) = obj["metadata"].as_object_mut() {
            m.remove("resourceVersion");
            m.retain(|_, v| !v.is_null());
        }
        let bytes = serde_json::to_vec(&obj).map_err(|e| ApiError::internal(e.to_string()))?;
        match self.store.update(key.into(), bytes.into(), expected).await {
            Ok(kv) => Ok(json_ok(
                StatusCode::OK,
                &with_resource_version(obj, kv.mod_revision),
            )),
            Err(e) if e.precondition().is_some() => {
                Err(ApiError::conflict(res.group, res.plural, name))
            }
            Err(e) => Err(store_error(e)),
        }
    }

    /// A watch: one JSON event per line (`ADDED`, `MODIFIED`, `DELETED`, or `ERROR` with a
    /// 410 `Status` when the requested resourceVersion is gone), until the client leaves.
    async fn watch(
        &self,
        res: &'static Resource,
        ns: Option<&str>,
        resource_version: Option<&str>,
    ) -> Result<Response, ApiError> {
        let prefix = keys::resource_prefix(&keys::resource_segment(res.group, res.plural), ns);
        let after = match resource_version {
            None | Some("") | Some("0") => None,
            Some(rv) => Some(rv.parse::<Revision>().map_err(|_| {
                ApiError::bad_request(format!(
                    "resourceVersion {rv:?} is not one this server issued"
                ))
            })?),
        };
        let gone = |e: &StoreError| {
            json!({"type": "ERROR", "object": ApiError {
                code: StatusCode::GONE,
                reason: "Expired",
                message: format!("too old resource version: {e}"),
                details: None,
            }.to_status()})
        };
        let stream: std::pin::Pin<
            Box<dyn futures::Stream<Item = Result<Bytes, std::convert::Infallible>> + Send>,
        > = match self.store.watch(prefix.as_bytes(), after).await {
            Ok(w) => Box::pin(w.flat_map(move |item| {
                let lines: Vec<Result<Bytes, std::convert::Infallible>> = match item {
                    Ok(batch) => batch
                        .events
                        .iter()
                        .filter_map(|e| {
                            let (kind, value, rev) = match (e.kind, &e.prev_kv) {
                                (EventKind::Put, None) => ("ADDED", &e.kv.value, e.kv.mod_revision),
                                (EventKind::Put, Some(_)) => {
                                    ("MODIFIED", &e.kv.value, e.kv.mod_revision)
                                }
                                (EventKind::Delete, Some(prev)) => {
                                    ("DELETED", &prev.value, e.kv.mod_revision)
                                }
                                (EventKind::Delete, None) => return None,
                            };
                            let obj = parse_stored(value, rev).ok()?;
                            let mut line = json!({"type": kind, "object": obj}).to_string();
                            line.push('\n');
                            Some(Ok(Bytes::from(line)))
                        })
                        .collect(),
                    Err(e) => {
                        let mut line = gone(&e).to_string();
                        line.push('\n');
                        vec![Ok(Bytes::from(line))]
                    }
                };
                futures::stream::iter(lines)
            })),
            Err(e @ StoreError::Compacted { .. }) => {
                let mut line = gone(&e).to_string();
                line.push('\n');
                Box::pin(futures::stream::iter(vec![Ok(Bytes::from(line))]))
            }
            Err(e) => return Err(store_error(e)),
        };
        Ok((
            StatusCode::OK,
            [
                (header::CONTENT_TYPE, "application/json"),
                (header::CACHE_CONTROL, "no-cache"),
            ],
            axum::body::Body::from_stream(stream),
        )
            .into_response())
    }

    async fn delete(
        &self,
        res: &'static Resource,
        ns: Option<&str>,
        name: &str,
    ) -> Result<Response, ApiError> {
        match self.store.delete(key(res, ns, name).into(), None).await {
            Ok(prev) => Ok(json_ok(
                StatusCode::OK,
                &parse_stored(&prev.value, prev.mod_revision)?,
            )),
            Err(e) if e.precondition().is_some() => {
                Err(ApiError::not_found(res.group, res.plural, name))
            }
            Err(e) => Err(store_error(e)),
        }
    }
}

/// The value of a query parameter (not percent-decoded: the values used here never need it).
fn query_value<'a>(query: &'a str, name: &str) -> Option<&'a str> {
    query
        .split('&')
        .filter_map(|kv| kv.split_once('=').or(Some((kv, ""))))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

/// True if a boolean query parameter is set (`watch=true`, `watch=1`, `watch`).
fn query_flag(query: &str, name: &str) -> bool {
    matches!(query_value(query, name), Some("" | "1" | "true"))
}

/// Which resource a path names: (group, version, namespace, plural, name).
type Target = (String, String, Option<String>, String, Option<String>);

/// Content types of request bodies the server decodes.
fn body_is_json(headers: &HeaderMap) -> Result<(), ApiError> {
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json");
    let base = ct.split(';').next().unwrap_or("").trim();
    if base == "application/json" || base == "application/yaml" || base.is_empty() {
        return Ok(());
    }
    Err(ApiError {
        code: StatusCode::UNSUPPORTED_MEDIA_TYPE,
        reason: "UnsupportedMediaType",
        message: format!(
            "the body of the request was in an unknown format - accepted media types include: application/json (got {ct:?})"
        ),
        details: None,
    })
}

async fn dispatch(
    rest: Rest,
    method: &str,
    t: Target,
    body: Bytes,
    headers: HeaderMap,
    query: String,
) -> Response {
    if (method == "POST" || method == "PUT")
        && let Err(e) = body_is_json(&headers)
    {
        return e.into_response();
    }
    let (group, version, ns, plural, name) = t;
    let result = async {
        let res = find(&group, &version, &plural)?;
        if res.namespaced != ns.is_some() && (name.is_some() || method == "POST" || !res.namespaced)
        {
            // A cluster-scoped kind under a namespace, or a namespaced kind without one on
            // a request that needs it.
            if !res.namespaced {
                return Err(ApiError::bad_request(format!(
                    "{plural} are cluster-scoped: use the path without /namespaces/<namespace>"
                )));
            }
            return Err(ApiError::bad_request(format!(
                "{plural} are namespaced: use /namespaces/<namespace>/{plural}"
            )));
        }
        match (method, name.as_deref()) {
            ("GET", None) if query_flag(&query, "watch") => {
                rest.watch(res, ns.as_deref(), query_value(&query, "resourceVersion"))
                    .await
            }
            ("GET", None) => rest.list(res, ns.as_deref()).await,
            ("PUT", Some(n)) => rest.update(res, ns.as_deref(), n, &body).await,
            ("POST", None) => rest.create(res, ns.as_deref(), &body).await,
            ("GET", Some(n)) => rest.get(res, ns.as_deref(), n).await,
            ("DELETE", Some(n)) => rest.delete(res, ns.as_deref(), n).await,
            (m, _) => Err(ApiError::method_not_allowed(format!(
                "{m} is not supported on this path yet"
            ))),
        }
    }
    .await;
    result.unwrap_or_else(IntoResponse::into_response)
}

/// The object routes, for the core group (`/api/v1/...`) and named groups (`/apis/g/v/...`).
pub fn router(store: Arc<dyn Store>) -> Router {
    let rest = Rest { store };
    macro_rules! handlers {
        ($extract:ty, $to_target:expr) => {{
            let rest = rest.clone();
            any(
                move |Path(p): Path<$extract>,
                      method: Method,
                      uri: Uri,
                      headers: HeaderMap,
                      body: Bytes| {
                    let rest = rest.clone();
                    async move {
                        let query = uri.query().unwrap_or("").to_owned();
                        dispatch(rest, method.as_str(), $to_target(p), body, headers, query).await
                    }
                },
            )
        }};
    }
    Router::new()
        .route(
            "/api/{version}/{plural}",
            handlers!((String, String), |(v, p): (String, String)| (
                String::new(),
                v,
                None,
                p,
                None
            )),
        )
        .route(
            "/api/{version}/{plural}/{name}",
            handlers!((String, String, String), |(v, p, n): (
                String,
                String,
                String
            )| (
                String::new(),
                v,
                None,
                p,
                Some(n)
            )),
        )
        .route(
            "/api/{version}/namespaces/{ns}/{plural}",
            handlers!((String, String, String), |(v, ns, p): (
                String,
                String,
                String
            )| (
                String::new(),
                v,
                Some(ns),
                p,
                None
            )),
        )
        .route(
            "/api/{version}/namespaces/{ns}/{plural}/{name}",
            handlers!((String, String, String, String), |(v, ns, p, n): (
                String,
                String,
                String,
                String
            )| (
                String::new(),
                v,
                Some(ns),
                p,
                Some(n)
            )),
        )
        .route(
            "/apis/{group}/{version}/{plural}",
            handlers!((String, String, String), |(g, v, p): (
                String,
                String,
                String
            )| (
                g, v, None, p, None
            )),
        )
        .route(
            "/apis/{group}/{version}/{plural}/{name}",
            handlers!((String, String, String, String), |(g, v, p, n): (
                String,
                String,
                String,
                String
            )| (
                g,
                v,
                None,
                p,
                Some(n)
            )),
        )
        .route(
            "/apis/{group}/{version}/namespaces/{ns}/{plural}",
            handlers!((String, String, String, String), |(g, v, ns, p): (
                String,
                String,
                String,
                String
            )| (
                g,
                v,
                Some(ns),
                p,
                None
            )),
        )
        .route(
            "/apis/{group}/{version}/namespaces/{ns}/{plural}/{name}",
            handlers!(
                (String, String, String, String, String),
                |(g, v, ns, p, n): (String, String, String, String, String)| (
                    g,
                    v,
                    Some(ns),
                    p,
                    Some(n)
                )
            ),
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_and_uids_look_like_kubernetes() {
        let t = now_rfc3339();
        assert_eq!(t.len(), 20, "{t}");
        assert!(t.ends_with('Z') && t.as_bytes()[10] == b'T');
        assert!(t.as_str() > "2020-01-01T00:00:00Z");
        let u = uid();
        assert_eq!(u.len(), 36);
        assert_eq!(u.matches('-').count(), 4);
    }
}
