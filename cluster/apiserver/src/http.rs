//! The HTTP face of the API: authenticates bearer tokens, turns URLs into [`ApiRequest`]s for
//! the request layer ([`Api`]), and encodes what it answers — objects, Tables, watch streams
//! (one JSON event per line, chunked) and `Status` errors — plus `/openapi/v3`, discovery and
//! the health endpoints.

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use futures::StreamExt;
use serde_json::Value;

use crate::api::{Api, ApiResponse};
use crate::auth::{Tokens, User};
use crate::fairness::{self, Seat};
use crate::status::ApiError;
use crate::{discovery, openapi, protobuf, request};

/// Paths anyone may read, as Kubernetes lets `system:anonymous` read them.
const PUBLIC: &[&str] = &["/version", "/healthz", "/livez", "/readyz"];

/// An error as an HTTP response.
pub fn error_response(e: &ApiError) -> Response {
    let mut resp = (
        StatusCode::from_u16(e.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        [(header::CONTENT_TYPE, "application/json")],
        crate::order::to_string(&e.to_status()),
    )
        .into_response();
    if let Some(s) = e.retry_after
        && let Ok(v) = HeaderValue::from_str(&s.to_string())
    {
        resp.headers_mut().insert(header::RETRY_AFTER, v);
    }
    resp
}

fn json_response(code: u16, body: &Value, warnings: &[String]) -> Response {
    json_bytes(
        code,
        Bytes::from(crate::order::to_string(body)),
        warnings,
        None,
    )
}

/// Bytes of a large answer handed to the connection at a time.
const WRITE_CHUNK: usize = 64 << 10;

/// A JSON answer. With `seat`, one of [`fairness::SEAT_BYTES`] or more is written in chunks
/// and the seat — grown to one per `SEAT_BYTES` — is held until the last chunk is taken, so a
/// client that does not read keeps its own seats busy (and its connection closes after the
/// write timeout) instead of pinning the server's memory unaccounted.
fn json_bytes(code: u16, body: Bytes, warnings: &[String], seat: Option<Seat>) -> Response {
    let status = StatusCode::from_u16(code).unwrap_or(StatusCode::OK);
    let mut resp = match seat {
        Some(mut seat) if body.len() >= fairness::SEAT_BYTES => {
            if let Err(e) = seat.grow_to(body.len().div_ceil(fairness::SEAT_BYTES)) {
                return error_response(&e);
            }
            let len = body.len();
            let chunks = futures::stream::unfold((body, seat), |(mut rest, seat)| async move {
                if rest.is_empty() {
                    return None;
                }
                let chunk = rest.split_to(rest.len().min(WRITE_CHUNK));
                Some((Ok::<_, std::convert::Infallible>(chunk), (rest, seat)))
            });
            let mut r = (
                status,
                [(header::CONTENT_TYPE, "application/json")],
                Body::from_stream(chunks),
            )
                .into_response();
            r.headers_mut()
                .insert(header::CONTENT_LENGTH, HeaderValue::from(len));
            r
        }
        _ => (status, [(header::CONTENT_TYPE, "application/json")], body).into_response(),
    };
    for w in warnings {
        let text = format!("299 - \"{}\"", w.replace('\\', "\\\\").replace('"', "\\\""));
        if let Ok(v) = HeaderValue::from_str(&text) {
            resp.headers_mut().append(header::WARNING, v);
        }
    }
    resp
}

/// Encodes an answer of the request layer.
pub fn encode(result: Result<ApiResponse, ApiError>) -> Response {
    encode_held(result, None)
}

/// [`encode`], holding the request's seat while a large answer is written.
fn encode_held(result: Result<ApiResponse, ApiError>, seat: Option<Seat>) -> Response {
    match result {
        Ok(ApiResponse::Object {
            code,
            body,
            warnings,
        }) => json_bytes(
            code,
            Bytes::from(crate::order::to_string(&body)),
            &warnings,
            seat,
        ),
        Ok(ApiResponse::Encoded { code, body }) => json_bytes(code, body, &[], seat),
        Ok(ApiResponse::Watch(stream)) => {
            let lines =
                stream.map(|ev| Ok::<_, std::convert::Infallible>(crate::api::watch_line(ev)));
            (
                StatusCode::OK,
                [
                    (header::CONTENT_TYPE, "application/json"),
                    (header::CACHE_CONTROL, "no-cache, private"),
                ],
                Body::from_stream(lines),
            )
                .into_response()
        }
        Ok(ApiResponse::Stream { content_type, body }) => (
            StatusCode::OK,
            [
                (header::CONTENT_TYPE, content_type),
                (header::CACHE_CONTROL, "no-cache, private"),
            ],
            Body::from_stream(body),
        )
            .into_response(),
        Err(e) => error_response(&e),
    }
}

fn unauthorized(message: &str) -> Response {
    error_response(&ApiError::new(401, "Unauthorized", message))
}

/// The field manager Kubernetes assumes when a client names none: its User-Agent up to the
/// first `/` (`kubectl`).
fn manager_from_agent(headers: &HeaderMap) -> Option<String> {
    let ua = headers.get(header::USER_AGENT)?.to_str().ok()?;
    let name: String = ua
        .split('/')
        .next()?
        .chars()
        .filter(|c| !c.is_control())
        .take(128)
        .collect();
    (!name.is_empty()).then_some(name)
}

/// `/metrics` on the API port: every metric, tenant labels included, for the admin token only
/// (the plain metrics port leaves tenant-identifying samples out).
async fn metrics(State(api): State<Api>, request: Request) -> Response {
    match request.extensions().get::<User>() {
        Some(User::Admin) => {}
        _ => {
            return error_response(&ApiError::forbidden(
                "/metrics is for the admin token (tenants' metrics name other tenants)",
            ));
        }
    }
    let Some(registry) = api.metrics_registry() else {
        return error_response(&ApiError::new(
            404,
            "NotFound",
            "this API server serves no metrics here",
        ));
    };
    match crate::metrics::render(&registry.gather()) {
        Ok(body) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
            body,
        )
            .into_response(),
        Err(e) => error_response(&ApiError::internal(e)),
    }
}

/// Where the admin takes a backup of the API server's store (`tessera store backup`).
pub const BACKUP_PATH: &str = "/tessera/v1/store/backup";

/// A consistent copy of the whole store as of now, in the embedded store's snapshot format
/// (`tessera store restore` makes a data directory of it): for the admin token only. It is
/// written to a private file in the temporary directory, which is unlinked once open and
/// streamed, so memory does not grow with the store and nothing is left behind.
async fn store_backup(State(api): State<Api>, request: Request) -> Response {
    if !matches!(request.extensions().get::<User>(), Some(User::Admin)) {
        return error_response(&ApiError::forbidden(
            "a backup holds every tenant's objects: it is for the admin token",
        ));
    }
    let path = std::env::temp_dir().join(format!(
        "tessera-backup-{}-{}.snap",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    ));
    let info = match api.store().backup(&path).await {
        Ok(info) => info,
        Err(tessera_store::StoreError::Unsupported(why)) => {
            return error_response(&ApiError::new(501, "NotImplemented", &why));
        }
        Err(e) => {
            let _ = std::fs::remove_file(&path);
            return error_response(&ApiError::internal(format!("taking the backup: {e}")));
        }
    };
    let file = match tokio::fs::File::open(&path).await {
        Ok(f) => f,
        Err(e) => return error_response(&ApiError::internal(format!("reading the backup: {e}"))),
    };
    let _ = std::fs::remove_file(&path);
    let chunks = futures::stream::unfold(file, |mut file| async move {
        use tokio::io::AsyncReadExt;
        let mut buf = vec![0u8; 1 << 20];
        match file.read(&mut buf).await {
            Ok(0) => None,
            Ok(n) => {
                buf.truncate(n);
                Some((Ok::<_, std::io::Error>(Bytes::from(buf)), file))
            }
            Err(e) => Some((Err(e), file)),
        }
    });
    let mut response = Body::from_stream(chunks).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(info.bytes));
    headers.insert("x-tessera-revision", HeaderValue::from(info.revision));
    headers.insert("x-tessera-keys", HeaderValue::from(info.keys as u64));
    response
}

/// The longest a request body may take to arrive.
const BODY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

async fn objects(
    State(api): State<Api>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    request: Request,
) -> Response {
    let Some(user) = request.extensions().get::<User>().cloned() else {
        return unauthorized("authentication required");
    };
    // A body is read only on one of the caller's seats, and only for so long: a flood of
    // slowly trickled bodies fills its own seats, not the server's memory.
    let seat = if matches!(method, Method::POST | Method::PUT | Method::PATCH) {
        match api.early_seat(&user).await {
            Ok(s) => Some(s),
            Err(e) => return error_response(&e),
        }
    } else {
        None
    };
    let read = axum::body::to_bytes(request.into_body(), request::MAX_BODY_BYTES + 1);
    let body = match tokio::time::timeout(BODY_TIMEOUT, read).await {
        Ok(Ok(b)) => b,
        Ok(Err(_)) => {
            return error_response(&ApiError::new(
                413,
                "RequestEntityTooLarge",
                format!(
                    "the request body is larger than the limit of {} bytes",
                    request::MAX_BODY_BYTES
                ),
            ));
        }
        Err(_) => {
            return error_response(&ApiError::new(
                408,
                "Timeout",
                format!(
                    "the request body did not arrive within {} s",
                    BODY_TIMEOUT.as_secs()
                ),
            ));
        }
    };
    let header_str = |h| headers.get(h).and_then(|v: &HeaderValue| v.to_str().ok());
    let content_type = header_str(header::CONTENT_TYPE);
    // Kubernetes' protobuf bodies (kubectl's typed commands) become the JSON they carry.
    // Only for what is served: anything else answers its 404 below, whatever the body.
    let crds = match api.served().await {
        Ok(c) => c,
        Err(e) => return error_response(&e),
    };
    let served = crate::access_review::is_review(uri.path())
        || matches!(
            request::from_http_in(&*crds, "GET", uri.path(), "", None, None, Bytes::new()),
            Ok(Some(_))
        );
    let (body, content_type) =
        if served && content_type.is_some_and(|ct| ct.starts_with(protobuf::CONTENT_TYPE)) {
            match protobuf::decode_body(&body) {
                Ok(obj) => (Bytes::from(obj.to_string()), Some("application/json")),
                Err(e) => {
                    return error_response(&ApiError::bad_request(format!(
                        "the protobuf body could not be decoded: {e}"
                    )));
                }
            }
        } else if served
            && content_type.is_some_and(|ct| {
                ct.starts_with("application/yaml")
                    || (ct.starts_with("application/apply-patch+yaml")
                        && serde_json::from_slice::<serde::de::IgnoredAny>(&body).is_err())
            })
        {
            // YAML bodies become the JSON they carry (apply keeps its patch type).
            match crate::yaml::to_json(&body) {
                Ok(obj) => {
                    let ct = if content_type.is_some_and(|ct| ct.starts_with("application/yaml")) {
                        Some("application/json")
                    } else {
                        content_type
                    };
                    (Bytes::from(obj.to_string()), ct)
                }
                Err(e) => {
                    return error_response(&ApiError::bad_request(format!(
                        "the YAML body could not be read: {e}"
                    )));
                }
            }
        } else {
            (body, content_type)
        };
    if crate::access_review::is_review(uri.path()) {
        return encode(
            crate::access_review::review(&api, &user, uri.path(), method.as_str(), &body).await,
        );
    }
    let parsed = request::from_http_in(
        &*crds,
        method.as_str(),
        uri.path(),
        uri.query().unwrap_or(""),
        content_type,
        header_str(header::ACCEPT),
        body,
    );
    match parsed {
        Ok(Some(mut req)) => {
            if req.params.field_manager.is_none() {
                req.params.field_manager = manager_from_agent(&headers);
            }
            let (result, seat) = api.handle_holding(&user, req, seat).await;
            encode_held(result, seat)
        }
        Ok(None) => error_response(&ApiError::new(
            404,
            "NotFound",
            format!(
                "the server could not find the requested resource: {}",
                uri.path()
            ),
        )),
        Err(e) => error_response(&e),
    }
}

async fn pod_exec(s: State<Api>, p: axum::extract::Path<(String, String)>, r: Request) -> Response {
    pod_stream(s, p, r, "exec").await
}

async fn pod_attach(
    s: State<Api>,
    p: axum::extract::Path<(String, String)>,
    r: Request,
) -> Response {
    pod_stream(s, p, r, "attach").await
}

async fn pod_portforward(
    s: State<Api>,
    p: axum::extract::Path<(String, String)>,
    r: Request,
) -> Response {
    pod_stream(s, p, r, "portforward").await
}

/// `pods/exec`, `pods/attach`, `pods/portforward` (GET or POST with an upgrade): the
/// agent's 101 is passed back and the two upgraded connections are spliced.
async fn pod_stream(
    State(api): State<Api>,
    axum::extract::Path((ns, name)): axum::extract::Path<(String, String)>,
    mut request: Request,
    sub: &'static str,
) -> Response {
    let Some(user) = request.extensions().get::<User>().cloned() else {
        return unauthorized("authentication required");
    };
    if !matches!(*request.method(), Method::GET | Method::POST) {
        return error_response(&ApiError::new(
            405,
            "MethodNotAllowed",
            format!("pods/{sub} takes GET (a WebSocket) or POST (SPDY)"),
        ));
    }
    let stream = tessera_client::client::PodStreamRequest {
        namespace: ns,
        name,
        subresource: sub.to_owned(),
        query: request.uri().query().unwrap_or_default().to_owned(),
        headers: tessera_client::client::UPGRADE_HEADERS
            .iter()
            .flat_map(|h| {
                request
                    .headers()
                    .get_all(*h)
                    .iter()
                    .filter_map(|v| Some(((*h).to_owned(), v.to_str().ok()?.to_owned())))
            })
            .collect(),
    };
    let started = std::time::Instant::now();
    let answer = api.pod_stream(&user, &stream).await;
    api.observe_stream(
        sub,
        answer.as_ref().map_or_else(|e| e.code, |_| 101),
        started,
    );
    let upstream = match answer {
        Ok(a) => a,
        Err(e) => return error_response(&e),
    };
    let Some(client_side) = request
        .extensions_mut()
        .remove::<hyper::upgrade::OnUpgrade>()
    else {
        return error_response(&ApiError::bad_request(
            "this connection cannot switch protocols: use HTTP/1.1 for exec, attach and port-forward",
        ));
    };
    let mut resp = Response::builder().status(StatusCode::SWITCHING_PROTOCOLS);
    for (k, v) in &upstream.headers {
        resp = resp.header(k.as_str(), v.as_str());
    }
    tokio::spawn(async move {
        let client = match client_side.await {
            Ok(c) => c,
            Err(e) => {
                tracing::debug!(error = %e, "a pod stream's upgrade failed");
                return;
            }
        };
        let mut client = hyper_util::rt::TokioIo::new(client);
        let mut upstream = upstream.io;
        if let Err(e) = tokio::io::copy_bidirectional(&mut client, &mut upstream).await {
            tracing::debug!(error = %e, "a pod stream ended with an error");
        }
    });
    resp.body(axum::body::Body::empty())
        .unwrap_or_else(|_| error_response(&ApiError::internal("building the 101")))
}

async fn openapi_doc(State(api): State<Api>, uri: Uri) -> Response {
    let path = uri
        .path()
        .trim_start_matches("/openapi/v3")
        .trim_matches('/');
    let crds = match api.served().await {
        Ok(c) => c,
        Err(e) => return error_response(&e),
    };
    if path.is_empty() {
        let mut index = openapi::index(&crds);
        // The extension servers' documents, fetched from them when asked for.
        for remote in api.aggregator().current_routes().in_order() {
            let path = format!("apis/{}/{}", remote.group, remote.version);
            index["paths"][&path] =
                serde_json::json!({"serverRelativeURL": format!("/openapi/v3/{path}")});
        }
        return json_response(200, &index, &[]);
    }
    match openapi::document_at(&crds, path) {
        Some(doc) => (
            StatusCode::OK,
            [
                (header::CONTENT_TYPE, "application/json"),
                (header::CACHE_CONTROL, "public, immutable"),
            ],
            doc.body.clone(),
        )
            .into_response(),
        None => error_response(&ApiError::new(
            404,
            "NotFound",
            format!("no OpenAPI document for {path}: /openapi/v3 lists them"),
        )),
    }
}

/// `metrics.k8s.io/v1beta1` (`kubectl top`).
async fn resource_metrics(
    State(api): State<Api>,
    axum::extract::Path(rest): axum::extract::Path<String>,
    uri: Uri,
    request: Request,
) -> Response {
    let Some(user) = request.extensions().get::<User>().cloned() else {
        return unauthorized("authentication required");
    };
    let answer = api
        .resource_metrics(&user, &rest, uri.query().unwrap_or(""))
        .await;
    match answer {
        Ok(body) => json_response(200, &body, &[]),
        Err(e) => error_response(&e),
    }
}

/// Requests under `/apis/<group>/<version>` (and `/openapi/v3/apis/<group>/<version>`) of an
/// APIService served by an extension API server go to that server; all else on. Built-in
/// group-versions are never proxied.
async fn aggregate(State(api): State<Api>, request: Request, next: Next) -> Response {
    let path = request.uri().path();
    let (rest, openapi) = match path.strip_prefix("/apis/") {
        Some(rest) => (rest, false),
        None => match path.strip_prefix("/openapi/v3/apis/") {
            Some(rest) => (rest, true),
            None => return next.run(request).await,
        },
    };
    let mut parts = rest.splitn(3, '/');
    let (Some(group), Some(version)) = (parts.next(), parts.next()) else {
        return next.run(request).await;
    };
    // Only the group-version's own document is an OpenAPI path to proxy.
    if openapi && parts.next().is_some() {
        return next.run(request).await;
    }
    let routes = match api.aggregator().routes().await {
        Ok(r) => r,
        Err(e) => return error_response(&e),
    };
    match routes.get(group, version) {
        Some(remote) if !crate::catalog::find_group_version(group, version) => {
            if let Some(why) = crate::aggregator::proxy::uncanonical(path) {
                return error_response(&ApiError::bad_request(why));
            }
            let remote = remote.clone();
            crate::aggregator::proxy::forward(&api, &remote, request).await
        }
        _ => next.run(request).await,
    }
}

async fn ready(State(api): State<Api>) -> Response {
    if let Some(why) = api.not_ready_because() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("[-]leader: {why}\nreadyz check failed"),
        )
            .into_response();
    }
    match api.store().current_revision().await {
        Ok(_) => "ok".into_response(),
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("[-]store failed: {e}\nreadyz check failed"),
        )
            .into_response(),
    }
}

/// The caller a request acts as: `user`, or whom its `Impersonate-User` and
/// `Impersonate-Group` headers name, if `user` may impersonate them.
async fn impersonated(api: &Api, user: User, headers: &HeaderMap) -> Result<User, ApiError> {
    let target = headers
        .get("impersonate-user")
        .map(|v| v.to_str().unwrap_or_default().to_owned());
    let groups: Vec<String> = headers
        .get_all("impersonate-group")
        .iter()
        .filter_map(|v| v.to_str().ok().map(str::to_owned))
        .collect();
    let Some(target) = target else {
        if groups.is_empty() {
            return Ok(user);
        }
        return Err(ApiError::bad_request(
            "requested impersonation of groups without a user: send Impersonate-User too (kubectl --as)",
        ));
    };
    if target.is_empty() {
        return Err(ApiError::bad_request("Impersonate-User is empty"));
    }
    api.authorizer().impersonate(&user, &target, &groups).await
}

/// Everything the API server serves over HTTP, with authentication.
pub fn router(api: Api, tokens: Tokens) -> Router {
    let checker = api.clone();
    let stateful = Router::new()
        .route("/readyz", get(ready))
        .route("/metrics", get(metrics))
        .route(BACKUP_PATH, get(store_backup))
        .route(
            "/apis/metrics.k8s.io/v1beta1/{*rest}",
            get(resource_metrics),
        )
        .route("/api/v1/namespaces/{ns}/pods/{name}/exec", any(pod_exec))
        .route(
            "/api/v1/namespaces/{ns}/pods/{name}/attach",
            any(pod_attach),
        )
        .route(
            "/api/v1/namespaces/{ns}/pods/{name}/portforward",
            any(pod_portforward),
        )
        .route("/openapi/v3", get(openapi_doc))
        .route("/openapi/v3/{*path}", get(openapi_doc))
        .merge(discovery::router())
        .fallback(objects)
        .layer(middleware::from_fn_with_state(api.clone(), aggregate))
        .with_state(api);
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/livez", get(|| async { "ok" }))
        .merge(stateful)
        .layer(middleware::from_fn(move |mut req: Request, next: Next| {
            let tokens = tokens.clone();
            let checker = checker.clone();
            async move {
                if PUBLIC.contains(&req.uri().path()) {
                    return next.run(req).await;
                }
                let given = req
                    .headers()
                    .get(header::AUTHORIZATION)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.strip_prefix("Bearer "))
                    .map(str::trim);
                // Without a bearer token, a verified client certificate names the caller
                // (a token, when sent, is what counts, as in Kubernetes' union of
                // authenticators where the token is asked first).
                let client_cert = match given {
                    Some(_) => None,
                    None => req.extensions().get::<crate::serve::ClientCert>().cloned(),
                };
                let user = if let Some(crate::serve::ClientCert(found)) = client_cert {
                    match found {
                        Ok(id) => User::Named {
                            name: id.name,
                            groups: id.groups,
                            tenant: None,
                        },
                        Err(why) => return unauthorized(&why),
                    }
                } else {
                    match given.map(|t| tokens.authenticate(t, crate::api::now_secs())) {
                        Some(Some((user, claims))) => {
                            // A tenant token is good while its Tenant is the one it was
                            // minted for: not re-created, its tokens not revoked.
                            if let Some(c) = claims
                                && !checker.tenant_token_current(&c).await
                            {
                                return unauthorized(
                                    "the token was revoked: its Tenant was re-created or its spec.tokenGeneration bumped; ask an admin for a new one (`tessera token create`)",
                                );
                            }
                            // A ServiceAccount token is good while its account (and the pod
                            // or secret it is bound to) is the one it was issued for.
                            if let User::ServiceAccount(sa) = &user
                                && !checker.service_account_current(sa).await
                            {
                                return unauthorized(
                                    "the ServiceAccount token is no longer valid: its ServiceAccount, or the pod or secret it was bound to, was deleted or re-created; request a new one (`kubectl create token`)",
                                );
                            }
                            user
                        }
                        Some(None) => {
                            return unauthorized(
                                "the bearer token is not valid (or has expired): use the kubeconfig that tessera wrote, or a token from `tessera token create`",
                            );
                        }
                        None => {
                            return unauthorized(
                                "authentication required: send a bearer token or a client certificate the cluster's CA signed (use the kubeconfig that tessera wrote)",
                            );
                        }
                    }
                };
                // `kubectl --as`: the caller acts as another, if it may.
                let user = match impersonated(&checker, user, req.headers()).await {
                    Ok(u) => u,
                    Err(e) => return error_response(&e),
                };
                req.extensions_mut().insert(user);
                next.run(req).await
            }
        }))
}
