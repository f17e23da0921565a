//! The client every component uses: one trait, two ways to reach the API — in the same
//! process (the API server's `InProcess`: a function call into its request layer, no HTTP, no
//! JSON text) or over HTTPS to a remote API server ([`HttpClient`]), with the same requests,
//! answers and `Status` errors either way.

use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use serde_json::Value;

use crate::catalog::Resource;
use crate::request::{ApiRequest, Decoded, FieldValidation, PatchType, Propagation, Verb};
use crate::response::{ApiResponse, WatchEvent, WatchStream};
use crate::status::ApiError;

/// The request headers that ask for a protocol switch, carried on from hop to hop of a
/// pod stream (API server → node agent; federation → shard).
pub const UPGRADE_HEADERS: [&str; 6] = [
    "connection",
    "upgrade",
    "sec-websocket-key",
    "sec-websocket-version",
    "sec-websocket-protocol",
    "x-stream-protocol-version",
];

/// The answer headers of a protocol switch, carried back to the client.
pub const SWITCHED_HEADERS: [&str; 5] = [
    "connection",
    "upgrade",
    "sec-websocket-accept",
    "sec-websocket-protocol",
    "x-stream-protocol-version",
];

/// A pod's `exec`, `attach` or `portforward` to open.
#[derive(Clone, Debug, Default)]
pub struct PodStreamRequest {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub name: String,
    /// `exec`, `attach` or `portforward`.
    pub subresource: String,
    /// The request's query as the client sent it (command, container, ports, ...).
    pub query: String,
    /// The request's [`UPGRADE_HEADERS`], in order.
    pub headers: Vec<(String, String)>,
}

impl PodStreamRequest {
    /// The request's path and query in a Kubernetes API.
    pub fn path(&self) -> String {
        let mut p = format!(
            "/api/v1/namespaces/{}/pods/{}/{}",
            percent_encode(&self.namespace),
            percent_encode(&self.name),
            self.subresource
        );
        if !self.query.is_empty() {
            p.push('?');
            p.push_str(&self.query);
        }
        p
    }
}

/// Bytes both ways: an upgraded connection, or a tunnel that stands for one.
pub trait Duplex: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin> Duplex for T {}

/// A pod stream that switched protocols: the answer's [`SWITCHED_HEADERS`] and the
/// connection, which now speaks the streaming protocol (WebSocket channels, SPDY).
pub struct Switched {
    /// The answer's protocol headers.
    pub headers: Vec<(String, String)>,
    /// The switched connection.
    pub io: Box<dyn Duplex>,
}

/// A way to send requests to the API.
#[async_trait]
pub trait Client: Send + Sync {
    /// Sends one request.
    async fn call(&self, req: ApiRequest) -> Result<ApiResponse, ApiError>;

    /// Opens a pod's exec, attach or port-forward: authorized as this client's user, the
    /// protocol switch made, the connection handed over.
    async fn pod_stream(&self, req: &PodStreamRequest) -> Result<Switched, ApiError> {
        Err(ApiError::bad_request(format!(
            "pods/{} cannot be opened through this client",
            req.subresource
        )))
    }

    /// The `metrics.k8s.io/v1beta1` PodMetricsList of the pods in `namespace` that
    /// `label_selector` (in its text form, empty for all) selects: what an autoscaler reads.
    /// A client that cannot reach the resource metrics API answers 404.
    async fn pod_metrics(&self, namespace: &str, label_selector: &str) -> Result<Value, ApiError> {
        let _ = (namespace, label_selector);
        Err(ApiError::new(
            404,
            "NotFound",
            "the server could not find the requested resource (pods.metrics.k8s.io): this client does not reach the resource metrics API",
        ))
    }

    /// Reads one object.
    async fn get(
        &self,
        res: &'static Resource,
        ns: Option<&str>,
        name: &str,
    ) -> Result<Value, ApiError> {
        let mut req = ApiRequest::new(Verb::Get, res);
        req.namespace = ns.map(str::to_owned);
        req.name = Some(name.to_owned());
        object(self.call(req).await?)
    }

    /// Lists a collection (`req.params` carries selectors and paging).
    async fn list(&self, req: ApiRequest) -> Result<Value, ApiError> {
        object(self.call(req).await?)
    }

    /// Lists a collection page by page (`req.params.limit` items each), calling `each` on
    /// every item: the first page as `req` asks (at its resourceVersion, if any), the next
    /// ones by their continue token. Returns the list's resourceVersion.
    async fn list_each(
        &self,
        req: ApiRequest,
        each: &mut (dyn FnMut(Value) + Send),
    ) -> Result<String, ApiError> {
        let mut page_req = req.clone();
        loop {
            let mut page = self.list(page_req).await?;
            if let Some(items) = page["items"].as_array_mut() {
                for item in items.drain(..) {
                    each(item);
                }
            }
            match page["metadata"]["continue"].as_str() {
                Some(c) if !c.is_empty() => {
                    page_req = req.clone();
                    page_req.params.continue_token = Some(c.to_owned());
                    page_req.params.resource_version = None;
                    page_req.params.resource_version_match = None;
                }
                _ => {
                    return Ok(page["metadata"]["resourceVersion"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned());
                }
            }
        }
    }

    /// Creates an object.
    async fn create(
        &self,
        res: &'static Resource,
        ns: Option<&str>,
        obj: &Value,
    ) -> Result<Value, ApiError> {
        self.create_decoded(res, ns, Decoded::value(obj.clone()))
            .await
    }

    /// Creates an object unless one of its name exists; true if it was created.
    async fn create_if_absent(
        &self,
        res: &'static Resource,
        ns: Option<&str>,
        obj: &Value,
    ) -> Result<bool, ApiError> {
        match self.create(res, ns, obj).await {
            Ok(_) => Ok(true),
            Err(e) if e.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Creates an object handed over decoded (see [`Decoded`]): in-process, no JSON text
    /// is written or parsed on the way.
    async fn create_decoded(
        &self,
        res: &'static Resource,
        ns: Option<&str>,
        obj: Decoded,
    ) -> Result<Value, ApiError> {
        let mut req = ApiRequest::new(Verb::Create, res);
        req.namespace = ns.map(str::to_owned);
        req.object = Some(obj);
        object(self.call(req).await?)
    }

    /// Replaces an object (409 if its resourceVersion is stale).
    async fn update(
        &self,
        res: &'static Resource,
        ns: Option<&str>,
        obj: &Value,
    ) -> Result<Value, ApiError> {
        let mut req = ApiRequest::new(Verb::Update, res);
        req.namespace = ns.map(str::to_owned);
        req.name = obj["metadata"]["name"].as_str().map(str::to_owned);
        req.object = Some(Decoded::value(obj.clone()));
        object(self.call(req).await?)
    }

    /// Replaces object `name` with one handed over decoded ([`Decoded::typed`]: in-process,
    /// neither parsed nor typed again); the answer as the API gave it (see
    /// [`resource_version_of`]).
    async fn update_decoded(
        &self,
        res: &'static Resource,
        ns: Option<&str>,
        name: &str,
        obj: Decoded,
    ) -> Result<ApiResponse, ApiError> {
        let mut req = ApiRequest::new(Verb::Update, res);
        req.namespace = ns.map(str::to_owned);
        req.name = Some(name.to_owned());
        req.object = Some(obj);
        self.call(req).await
    }

    /// Patches an object (or its `status`/`scale` subresource).
    async fn patch(
        &self,
        res: &'static Resource,
        ns: Option<&str>,
        name: &str,
        subresource: Option<&str>,
        kind: PatchType,
        patch: &Value,
    ) -> Result<Value, ApiError> {
        let mut req = ApiRequest::new(Verb::Patch(kind), res);
        req.namespace = ns.map(str::to_owned);
        req.name = Some(name.to_owned());
        req.subresource = subresource.map(str::to_owned);
        req.body = Bytes::from(patch.to_string());
        object(self.call(req).await?)
    }

    /// Server-side applies `obj` as field manager `manager`, taking over fields other
    /// managers own (`force`), as a controller that is the object's source of truth does.
    async fn apply(
        &self,
        res: &'static Resource,
        ns: Option<&str>,
        name: &str,
        manager: &str,
        obj: &Value,
    ) -> Result<Value, ApiError> {
        let mut req = ApiRequest::new(Verb::Patch(PatchType::Apply), res);
        req.namespace = ns.map(str::to_owned);
        req.name = Some(name.to_owned());
        req.params.field_manager = Some(manager.to_owned());
        req.params.force = true;
        req.body = Bytes::from(obj.to_string());
        object(self.call(req).await?)
    }

    /// Deletes an object.
    async fn delete(
        &self,
        res: &'static Resource,
        ns: Option<&str>,
        name: &str,
        propagation: Option<Propagation>,
    ) -> Result<Value, ApiError> {
        let mut req = ApiRequest::new(Verb::Delete, res);
        req.namespace = ns.map(str::to_owned);
        req.name = Some(name.to_owned());
        req.params.propagation = propagation;
        object(self.call(req).await?)
    }

    /// Watches a collection from `req.params.resource_version`.
    async fn watch(&self, mut req: ApiRequest) -> Result<WatchStream, ApiError> {
        req.verb = Verb::Watch;
        match self.call(req).await? {
            ApiResponse::Watch(s) => Ok(s),
            _ => Err(ApiError::internal("a watch answered an object")),
        }
    }
}

/// Creates `obj` through `client`, handed over typed ([`Decoded::typed`]): in-process, the
/// API neither parses it nor decodes it into its type again.
pub async fn create_typed<T: k8s_openapi::Resource + serde::Serialize>(
    client: &(impl Client + ?Sized),
    res: &'static Resource,
    ns: Option<&str>,
    obj: &T,
) -> Result<Value, ApiError> {
    client.create_decoded(res, ns, Decoded::typed(obj)?).await
}

/// The `metadata.resourceVersion` of the object a write answered with, read without
/// decoding the rest of it.
pub fn resource_version_of(resp: &ApiResponse) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Meta {
        #[serde(rename = "resourceVersion")]
        resource_version: Option<String>,
    }
    #[derive(serde::Deserialize)]
    struct Head {
        metadata: Meta,
    }
    match resp {
        ApiResponse::Object { body, .. } => body["metadata"]["resourceVersion"]
            .as_str()
            .map(str::to_owned),
        ApiResponse::Encoded { body, .. } => serde_json::from_slice::<Head>(body)
            .ok()
            .and_then(|h| h.metadata.resource_version),
        _ => None,
    }
}

/// The shards of a federation as clients of their Kubernetes APIs: what the federation's API
/// reads pods, nodes and events from (`kubectl get pods -A` at the federation).
pub trait ShardSet: Send + Sync {
    /// The shards that can be read now, in name order, each with a client for reads (get,
    /// list, watch, pod logs) in its API.
    fn shards(&self) -> Vec<(String, Arc<dyn Client>)>;
}

fn object(resp: ApiResponse) -> Result<Value, ApiError> {
    resp.into_value()
        .ok_or_else(|| ApiError::internal("a request answered a watch, or text that is not JSON"))
}

type Https = hyper_rustls::HttpsConnector<HttpConnector>;

/// Calls a remote API server over HTTPS with a bearer token.
#[derive(Clone)]
pub struct HttpClient {
    ca_pem: String,
    base: String,
    token: String,
    client: HyperClient<Https, Full<Bytes>>,
}

impl HttpClient {
    /// The API server it sends to (`https://127.0.0.1:6443`).
    pub fn server(&self) -> &str {
        &self.base
    }

    /// The bearer token it sends (a node agent roots its log endpoint's credentials in it).
    pub fn token(&self) -> &str {
        &self.token
    }

    /// Sends a GET of `path` with the token and `headers`: the answer as it starts.
    async fn get_with(
        &self,
        path: &str,
        headers: &[(String, String)],
    ) -> Result<hyper::Response<hyper::body::Incoming>, ApiError> {
        let mut builder = hyper::Request::builder()
            .method("GET")
            .uri(format!("{}{path}", self.base))
            .header("authorization", format!("Bearer {}", self.token))
            .header("user-agent", "tessera/0.1");
        for (k, v) in headers {
            builder = builder.header(k.as_str(), v.as_str());
        }
        let request = builder
            .body(Full::new(Bytes::new()))
            .map_err(|e| ApiError::bad_request(format!("building the request: {e}")))?;
        self.client.request(request).await.map_err(|e| {
            ApiError::new(
                503,
                "ServiceUnavailable",
                format!("cannot reach the API server at {}: {e}", self.base),
            )
        })
    }

    /// GETs `path`, a path outside the resource API (`/metrics`, a backup), with the token:
    /// the answer's headers and its body as it arrives, or the error its `Status` says.
    pub async fn get_raw(
        &self,
        path: &str,
    ) -> Result<
        (
            hyper::HeaderMap,
            futures::stream::BoxStream<'static, std::io::Result<Bytes>>,
        ),
        ApiError,
    > {
        let resp = self.get_with(path, &[]).await?;
        let code = resp.status().as_u16();
        if code >= 400 {
            return Err(error_of(resp).await);
        }
        let (parts, body) = resp.into_parts();
        let stream = body
            .into_data_stream()
            .map(|r| r.map_err(std::io::Error::other))
            .boxed();
        Ok((parts.headers, stream))
    }
}

/// The error an answer that is not the one asked for stands for (its `Status`, read).
async fn error_of(resp: hyper::Response<hyper::body::Incoming>) -> ApiError {
    let code = resp.status().as_u16();
    match resp.into_body().collect().await {
        Ok(body) => status_error(code, &body.to_bytes()),
        Err(e) => ApiError::internal(format!("reading the answer: {e}")),
    }
}

/// The [`SWITCHED_HEADERS`] of a protocol switch's answer.
pub fn switched_headers(headers: &hyper::HeaderMap) -> Vec<(String, String)> {
    SWITCHED_HEADERS
        .iter()
        .flat_map(|h| {
            headers
                .get_all(*h)
                .iter()
                .filter_map(move |v| Some(((*h).to_owned(), v.to_str().ok()?.to_owned())))
        })
        .collect()
}

/// Well-known reasons, so that a `Status` read off the wire becomes the same `ApiError`.
const REASONS: &[&str] = &[
    "BadRequest",
    "Unauthorized",
    "Forbidden",
    "NotFound",
    "AlreadyExists",
    "Conflict",
    "Gone",
    "Expired",
    "Invalid",
    "Timeout",
    "TooManyRequests",
    "InternalError",
    "ServiceUnavailable",
    "MethodNotAllowed",
    "UnsupportedMediaType",
    "RequestEntityTooLarge",
    "NotAcceptable",
];

/// The `ApiError` a `Status` body (or any other body) of an HTTP answer stands for.
pub fn status_error(code: u16, body: &[u8]) -> ApiError {
    let status: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let reason = status["reason"]
        .as_str()
        .and_then(|r| REASONS.iter().find(|x| **x == r).copied())
        .unwrap_or("Unknown");
    let mut e = ApiError::new(
        code,
        reason,
        status["message"]
            .as_str()
            .map_or_else(|| String::from_utf8_lossy(body).into_owned(), str::to_owned),
    );
    if !status["details"].is_null() {
        e.details = Some(status["details"].clone());
    }
    e
}

/// The URL path and query of a request.
pub fn url_of(req: &ApiRequest) -> String {
    let res = req.resource;
    let mut path = if res.group.is_empty() {
        format!("/api/{}", res.version)
    } else {
        format!("/apis/{}/{}", res.group, res.version)
    };
    if let Some(ns) = &req.namespace {
        path.push_str(&format!("/namespaces/{ns}"));
    }
    path.push('/');
    path.push_str(res.plural);
    if let Some(n) = &req.name {
        path.push('/');
        path.push_str(n);
    }
    if let Some(s) = &req.subresource {
        path.push('/');
        path.push_str(s);
    }
    let p = &req.params;
    let mut q: Vec<(String, String)> = Vec::new();
    if req.verb == Verb::Watch {
        q.push(("watch".into(), "true".into()));
    }
    if let Some(l) = &p.label_selector {
        q.push(("labelSelector".into(), l.to_string()));
    }
    if let Some(f) = &p.field_selector {
        q.push(("fieldSelector".into(), f.to_string()));
    }
    if p.limit > 0 {
        q.push(("limit".into(), p.limit.to_string()));
    }
    for (k, v) in [
        ("continue", &p.continue_token),
        ("resourceVersion", &p.resource_version),
        ("resourceVersionMatch", &p.resource_version_match),
        ("fieldManager", &p.field_manager),
        ("includeObject", &p.include_object),
    ] {
        if let Some(v) = v {
            q.push((k.into(), v.clone()));
        }
    }
    if p.allow_bookmarks {
        q.push(("allowWatchBookmarks".into(), "true".into()));
    }
    if let Some(t) = p.timeout_seconds {
        q.push(("timeoutSeconds".into(), t.to_string()));
    }
    if p.dry_run {
        q.push(("dryRun".into(), "All".into()));
    }
    match p.field_validation {
        FieldValidation::Strict => q.push(("fieldValidation".into(), "Strict".into())),
        FieldValidation::Ignore => q.push(("fieldValidation".into(), "Ignore".into())),
        FieldValidation::Warn => {}
    }
    if p.force {
        q.push(("force".into(), "true".into()));
    }
    if let Some(pp) = p.propagation {
        q.push(("propagationPolicy".into(), format!("{pp:?}")));
    }
    if let Some(g) = p.grace_period_seconds {
        q.push(("gracePeriodSeconds".into(), g.to_string()));
    }
    if req.subresource.as_deref() == Some("log") {
        let l = &p.log;
        if let Some(c) = &l.container {
            q.push(("container".into(), c.clone()));
        }
        for (k, on) in [
            ("follow", l.follow),
            ("previous", l.previous),
            ("timestamps", l.timestamps),
        ] {
            if on {
                q.push((k.into(), "true".into()));
            }
        }
        for (k, n) in [
            ("tailLines", l.tail_lines),
            ("sinceSeconds", l.since_seconds),
            ("limitBytes", l.limit_bytes),
        ] {
            if let Some(n) = n {
                q.push((k.into(), n.to_string()));
            }
        }
        if let Some(t) = &l.since_time {
            q.push(("sinceTime".into(), t.clone()));
        }
    }
    if !q.is_empty() {
        let enc: Vec<String> = q
            .into_iter()
            .map(|(k, v)| format!("{k}={}", percent_encode(&v)))
            .collect();
        path.push('?');
        path.push_str(&enc.join("&"));
    }
    path
}

/// `s` with every byte but unreserved ones (RFC 3986) as `%XX`: a path segment or a query
/// value.
pub fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

impl HttpClient {
    /// A client from a kubeconfig file: its current context's server, CA and bearer token.
    pub fn from_kubeconfig(path: &std::path::Path) -> Result<HttpClient, ApiError> {
        HttpClient::from_kubeconfig_context(path, None)
    }

    /// A client of `context` of the kubeconfig at `path` (its current context if `None`).
    pub fn from_kubeconfig_context(
        path: &std::path::Path,
        context: Option<&str>,
    ) -> Result<HttpClient, ApiError> {
        use base64::Engine;
        let text = std::fs::read(path).map_err(|e| {
            ApiError::bad_request(format!("cannot read kubeconfig {}: {e}", path.display()))
        })?;
        let kc = crate::yaml::to_json(&text).map_err(|e| {
            ApiError::bad_request(format!("kubeconfig {} is not YAML: {e}", path.display()))
        })?;
        let bad =
            |what: &str| ApiError::bad_request(format!("kubeconfig {}: {what}", path.display()));
        let current = match context {
            Some(c) => c,
            None => kc["current-context"]
                .as_str()
                .ok_or_else(|| bad("no current-context"))?,
        };
        let named = |list: &str, name: &str| {
            kc[list]
                .as_array()
                .into_iter()
                .flatten()
                .find(|e| e["name"].as_str() == Some(name))
                .cloned()
        };
        let ctx = named("contexts", current)
            .ok_or_else(|| bad(&format!("the context {current:?} is not listed")))?;
        let cluster_name = ctx["context"]["cluster"].as_str().unwrap_or_default();
        let user_name = ctx["context"]["user"].as_str().unwrap_or_default();
        let cluster =
            named("clusters", cluster_name).ok_or_else(|| bad("its cluster is not listed"))?;
        let user = named("users", user_name).ok_or_else(|| bad("its user is not listed"))?;
        let server = cluster["cluster"]["server"]
            .as_str()
            .ok_or_else(|| bad("the cluster has no server"))?;
        let ca = cluster["cluster"]["certificate-authority-data"]
            .as_str()
            .ok_or_else(|| bad("the cluster has no certificate-authority-data"))?;
        let ca = base64::engine::general_purpose::STANDARD
            .decode(ca.trim())
            .map_err(|e| bad(&format!("certificate-authority-data is not base64: {e}")))?;
        let token = user["user"]["token"]
            .as_str()
            .ok_or_else(|| bad("the user has no token"))?;
        HttpClient::new(server, &String::from_utf8_lossy(&ca), token)
    }

    /// The CA bundle (PEM) this client trusts.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// A client of `server` (`https://127.0.0.1:6443`) trusting `ca_pem`, sending `token`.
    pub fn new(server: &str, ca_pem: &str, token: &str) -> Result<HttpClient, ApiError> {
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
            let cert = cert.map_err(|e| ApiError::bad_request(format!("CA certificate: {e}")))?;
            roots
                .add(cert)
                .map_err(|e| ApiError::bad_request(format!("CA certificate: {e}")))?;
        }
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| ApiError::internal(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(config)
            .https_only()
            .enable_http1()
            .build();
        Ok(HttpClient {
            ca_pem: ca_pem.to_owned(),
            base: server.trim_end_matches('/').to_owned(),
            token: token.to_owned(),
            client: HyperClient::builder(TokioExecutor::new()).build(https),
        })
    }
}

#[async_trait]
impl Client for HttpClient {
    async fn pod_stream(&self, req: &PodStreamRequest) -> Result<Switched, ApiError> {
        let resp = self.get_with(&req.path(), &req.headers).await?;
        if resp.status().as_u16() != 101 {
            return Err(error_of(resp).await);
        }
        let headers = switched_headers(resp.headers());
        let io = hyper::upgrade::on(resp).await.map_err(|e| {
            ApiError::new(
                503,
                "ServiceUnavailable",
                format!(
                    "the API server at {} switched protocols but the connection was lost: {e}",
                    self.base
                ),
            )
        })?;
        Ok(Switched {
            headers,
            io: Box::new(hyper_util::rt::TokioIo::new(io)),
        })
    }

    async fn pod_metrics(&self, namespace: &str, label_selector: &str) -> Result<Value, ApiError> {
        let mut path = format!(
            "/apis/metrics.k8s.io/v1beta1/namespaces/{}/pods",
            percent_encode(namespace)
        );
        if !label_selector.is_empty() {
            path.push_str(&format!(
                "?labelSelector={}",
                percent_encode(label_selector)
            ));
        }
        let (_, mut body) = self.get_raw(&path).await?;
        let mut bytes = Vec::new();
        while let Some(chunk) = body.next().await {
            let chunk =
                chunk.map_err(|e| ApiError::internal(format!("reading pod metrics: {e}")))?;
            bytes.extend_from_slice(&chunk);
        }
        serde_json::from_slice(&bytes)
            .map_err(|e| ApiError::internal(format!("pod metrics are not JSON: {e}")))
    }

    async fn call(&self, req: ApiRequest) -> Result<ApiResponse, ApiError> {
        let method = match req.verb {
            Verb::Get | Verb::List | Verb::Watch => "GET",
            Verb::Create => "POST",
            Verb::Update => "PUT",
            Verb::Patch(_) => "PATCH",
            Verb::Delete | Verb::DeleteCollection => "DELETE",
        };
        let content_type = match req.verb {
            Verb::Patch(PatchType::Json) => "application/json-patch+json",
            Verb::Patch(PatchType::Merge) => "application/merge-patch+json",
            Verb::Patch(PatchType::StrategicMerge) => "application/strategic-merge-patch+json",
            Verb::Patch(PatchType::Apply) => "application/apply-patch+yaml",
            _ => "application/json",
        };
        let accept = if req.table {
            "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
        } else {
            "application/json"
        };
        let request = hyper::Request::builder()
            .method(method)
            .uri(format!("{}{}", self.base, url_of(&req)))
            .header("authorization", format!("Bearer {}", self.token))
            .header("content-type", content_type)
            .header("accept", accept)
            .header("user-agent", "tessera/0.1")
            .body(Full::new(req.body_bytes()))
            .map_err(|e| ApiError::bad_request(format!("building the request: {e}")))?;
        let resp = self.client.request(request).await.map_err(|e| {
            let mut err = ApiError::new(
                503,
                "ServiceUnavailable",
                format!("cannot reach the API server at {}: {e}", self.base),
            );
            err.retry_after = Some(1);
            err
        })?;
        let code = resp.status().as_u16();
        let warnings: Vec<String> = resp
            .headers()
            .get_all("warning")
            .iter()
            .filter_map(|v| v.to_str().ok().map(str::to_owned))
            .collect();
        if req.verb == Verb::Watch && code == 200 {
            let mut body = resp.into_body().into_data_stream();
            let stream = async_stream_lines(move |tx| async move {
                let mut buf = Vec::new();
                while let Some(Ok(chunk)) = body.next().await {
                    buf.extend_from_slice(&chunk);
                    while let Some(pos) = buf.iter().position(|b| *b == b'\n') {
                        let line: Vec<u8> = buf.drain(..=pos).collect();
                        if let Ok(v) = serde_json::from_slice::<Value>(&line)
                            && tx.send(v).await.is_err()
                        {
                            return;
                        }
                    }
                }
            });
            return Ok(ApiResponse::Watch(stream));
        }
        if req.subresource.as_deref() == Some("log") && code == 200 {
            // A log is text as it comes (and, with `follow`, for as long as the container runs).
            let body = resp
                .into_body()
                .into_data_stream()
                .map(|r| r.map_err(std::io::Error::other));
            return Ok(ApiResponse::Stream {
                content_type: "text/plain",
                body: Box::pin(body),
            });
        }
        let bytes = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| ApiError::internal(format!("reading the answer: {e}")))?
            .to_bytes();
        if code >= 400 {
            return Err(status_error(code, &bytes));
        }
        let body: Value = serde_json::from_slice(&bytes)
            .map_err(|e| ApiError::internal(format!("the answer is not JSON: {e}")))?;
        Ok(ApiResponse::Object {
            code,
            body,
            warnings,
        })
    }
}

/// A stream fed by a task through a channel; the task ends when the stream is dropped.
fn async_stream_lines<F, Fut>(f: F) -> WatchStream
where
    F: FnOnce(tokio::sync::mpsc::Sender<Value>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel(256);
    let task = tokio::spawn(f(tx));
    struct Abort(tokio::task::JoinHandle<()>);
    impl Drop for Abort {
        fn drop(&mut self) {
            self.0.abort();
        }
    }
    let guard = Abort(task);
    Box::pin(
        tokio_stream::wrappers::ReceiverStream::new(rx).map(move |v| {
            let _ = &guard;
            WatchEvent::Value(v)
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::{find_resource, from_http};

    #[test]
    fn urls_round_trip_through_the_parser() {
        let res = find_resource("apps", "v1", "deployments").expect("served");
        let mut req = ApiRequest::new(Verb::List, res);
        req.namespace = Some("team-a".into());
        req.params.label_selector = Some("app in (web,api),tier!=db".parse().expect("sel"));
        req.params.limit = 10;
        req.params.field_manager = Some("my tool".into());
        let url = url_of(&req);
        let (path, query) = url.split_once('?').expect("query");
        let back = from_http("GET", path, query, None, None, Bytes::new())
            .expect("parses")
            .expect("object path");
        assert_eq!(back.namespace.as_deref(), Some("team-a"));
        assert_eq!(back.params.limit, 10);
        assert_eq!(
            back.params.label_selector.map(|s| s.to_string()),
            req.params.label_selector.map(|s| s.to_string())
        );
        assert_eq!(back.params.field_manager.as_deref(), Some("my tool"));
    }

    #[test]
    fn log_options_round_trip_through_the_parser() {
        let res = find_resource("", "v1", "pods").expect("served");
        let mut req = ApiRequest::new(Verb::Get, res);
        req.namespace = Some("t1".into());
        req.name = Some("web-1".into());
        req.subresource = Some("log".into());
        req.params.log = crate::request::LogOptions {
            container: Some("main".into()),
            follow: true,
            previous: false,
            tail_lines: Some(20),
            since_seconds: None,
            since_time: Some("2026-12-01T10:00:00+01:00".into()),
            timestamps: true,
            limit_bytes: Some(4096),
        };
        let url = url_of(&req);
        let (path, query) = url.split_once('?').expect("query");
        let back = from_http("GET", path, query, None, None, Bytes::new())
            .expect("parses")
            .expect("object path");
        assert_eq!(back.subresource.as_deref(), Some("log"));
        assert_eq!(back.params.log, req.params.log);
    }
}
