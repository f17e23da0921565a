//! Proxying a request to an extension API server: authorized here first (tenant isolation,
//! then RBAC, on the resource the URL names), sent over a pooled TLS connection that
//! presents the front proxy's client certificate, the caller named in `X-Remote-*`
//! headers; the answer streamed back as it arrives (lists, watches). A request that
//! upgrades its connection (WebSocket, SPDY: KubeVirt's consoles) gets a connection of its
//! own, spliced to the caller's after the extension's `101`.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use parking_lot::Mutex;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

use super::{EXTRA_HEADER_PREFIX, GROUP_HEADER, Remote, USER_HEADER};
use crate::api::Api;
use crate::auth::User;
use crate::rbac::rules::Attributes;
use crate::status::ApiError;
use crate::webhooks::call::{Sender, keep, send_kept, trust_store};

/// Longest wait for an extension server's answer to start, but for watches (kube-apiserver's
/// request timeout).
const ANSWER_TIMEOUT: Duration = Duration::from_secs(60);

/// Longest a TCP connection and TLS handshake to an extension server may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Idle connections kept per extension server.
const IDLE_PER_SERVER: usize = 32;

/// Extension servers with idle connections kept, at most (past it the pool is emptied).
const MAX_SERVERS: usize = 256;

/// Where a connection goes: address, certificate name, trusted CA (None: not checked).
type Key = (SocketAddr, String, Option<Arc<str>>);

/// TLS to extension servers with the front proxy's client certificate; connections kept
/// for the next request.
pub struct Transport {
    certs: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    configs: Mutex<HashMap<Option<Arc<str>>, Arc<rustls::ClientConfig>>>,
    idle: Mutex<HashMap<Key, Vec<Sender>>>,
}

/// Accepts any server certificate (an APIService's `insecureSkipTLSVerify`, as
/// metrics-server's own manifest sets it) while still checking the handshake's signatures.
#[derive(Debug)]
struct AnyServer(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyServer {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

impl Transport {
    /// A transport presenting `front_proxy`'s client certificate.
    pub fn new(front_proxy: &crate::pki::FrontProxy) -> Result<Transport, String> {
        let certs = CertificateDer::pem_slice_iter(front_proxy.cert_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("the front-proxy certificate: {e}"))?;
        let key = PrivateKeyDer::from_pem_slice(front_proxy.key_pem.as_bytes())
            .map_err(|e| format!("the front-proxy key: {e}"))?;
        Ok(Transport {
            certs,
            key,
            configs: Mutex::default(),
            idle: Mutex::default(),
        })
    }

    fn config(&self, ca: Option<&Arc<str>>) -> Result<Arc<rustls::ClientConfig>, String> {
        if let Some(c) = self.configs.lock().get(&ca.cloned()) {
            return Ok(c.clone());
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?;
        let builder = match ca {
            Some(pem) => builder.with_root_certificates(trust_store(pem.as_bytes(), true)?),
            None => builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AnyServer(provider))),
        };
        let config = Arc::new(
            builder
                .with_client_auth_cert(self.certs.clone(), self.key.clone_key())
                .map_err(|e| format!("the front-proxy certificate: {e}"))?,
        );
        let mut configs = self.configs.lock();
        if configs.len() >= MAX_SERVERS {
            configs.clear();
        }
        configs.insert(ca.cloned(), config.clone());
        Ok(config)
    }

    async fn tls(
        &self,
        key: &Key,
    ) -> Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>, String> {
        let config = self.config(key.2.as_ref())?;
        let name = ServerName::try_from(key.1.clone())
            .map_err(|e| format!("{:?} is not a valid server name: {e}", key.1))?;
        let connect = async {
            let tcp = tokio::net::TcpStream::connect(key.0)
                .await
                .map_err(|e| format!("dial tcp {}: {e}", key.0))?;
            let _ = tcp.set_nodelay(true);
            tokio_rustls::TlsConnector::from(config)
                .connect(name, tcp)
                .await
                .map_err(|e| format!("tls: {e}"))
        };
        tokio::time::timeout(CONNECT_TIMEOUT, connect)
            .await
            .map_err(|_| format!("dial tcp {}: timed out", key.0))?
    }

    /// A new HTTP/1.1 connection to the server at `key`.
    async fn connect(&self, key: &Key, upgrades: bool) -> Result<Sender, String> {
        let tls = self.tls(key).await?;
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(async move {
            let _ = if upgrades {
                conn.with_upgrades().await
            } else {
                conn.await
            };
        });
        Ok(sender)
    }

    /// Sends `request` to the server at `key`: its answer, whose body hands the connection
    /// back to the pool once read to the end.
    pub(crate) async fn send(
        self: &Arc<Self>,
        key: Key,
        request: hyper::Request<Full<Bytes>>,
    ) -> Result<(hyper::http::response::Parts, Body), String> {
        let (sender, answer) =
            send_kept(&self.idle, &key, request, || self.connect(&key, false)).await?;
        let (parts, body) = answer.into_parts();
        // The connection goes back to the pool as soon as the body has been read to its end
        // (known by its length: a caller relaying it stops polling after the last byte),
        // not when a caller drops a watch midway: that connection still carries the rest.
        let back = Some((sender, key, Arc::downgrade(self)));
        let stream = futures::stream::unfold((body, back), |(mut body, mut back)| async move {
            loop {
                if hyper::body::Body::is_end_stream(&body) {
                    give_back(back.take());
                    return None;
                }
                match body.frame().await {
                    None => {
                        give_back(back.take());
                        return None;
                    }
                    Some(Err(e)) => return Some((Err(e), (body, back))),
                    Some(Ok(frame)) => {
                        if let Ok(data) = frame.into_data() {
                            if hyper::body::Body::is_end_stream(&body) {
                                give_back(back.take());
                            }
                            return Some((Ok(data), (body, back)));
                        }
                    }
                }
            }
        });
        Ok((parts, Body::from_stream(stream)))
    }

    /// Sends an upgrading `request` on a connection of its own: the answer, and the
    /// upgraded connection if the server switched protocols.
    async fn send_upgrade(
        &self,
        key: &Key,
        request: hyper::Request<Full<Bytes>>,
    ) -> Result<hyper::Response<hyper::body::Incoming>, String> {
        let mut sender = self.connect(key, true).await?;
        sender
            .send_request(request)
            .await
            .map_err(|e| e.to_string())
    }
}

/// Puts a connection whose answer was read whole back in its transport's pool, once it is
/// ready for the next request.
fn give_back(back: Option<(Sender, Key, std::sync::Weak<Transport>)>) {
    let Some((mut sender, key, pool)) = back else {
        return;
    };
    tokio::spawn(async move {
        let ready = tokio::time::timeout(Duration::from_millis(100), sender.ready());
        if matches!(ready.await, Ok(Ok(())))
            && let Some(pool) = pool.upgrade()
        {
            keep(&pool.idle, key, sender, MAX_SERVERS, IDLE_PER_SERVER);
        }
    });
}

/// What a request under `/apis/<group>/<version>/` asks, as RBAC sees it (kube-apiserver's
/// RequestInfo): `None` for the group-version's own discovery document.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct RequestInfo {
    /// The verb (`get`, `list`, `watch`, `create`, `update`, `patch`, `delete`,
    /// `deletecollection`).
    pub verb: String,
    /// The group.
    pub group: String,
    /// The plural resource.
    pub resource: String,
    /// The subresource, or "".
    pub subresource: String,
    /// The object's name, or "".
    pub name: String,
    /// The namespace, or "".
    pub namespace: String,
}

impl RequestInfo {
    /// Parses `path` (below `/apis/<group>/<version>/`, given as `rest`) and `query`.
    pub fn parse(method: &Method, group: &str, rest: &str, query: &str) -> Option<RequestInfo> {
        let mut parts: Vec<&str> = rest.split('/').filter(|s| !s.is_empty()).collect();
        if parts.is_empty() {
            return None;
        }
        let mut watch = query
            .split('&')
            .any(|kv| kv == "watch=true" || kv == "watch=1");
        if parts[0] == "watch" {
            watch = true;
            parts.remove(0);
        }
        let mut info = RequestInfo {
            group: group.to_owned(),
            ..RequestInfo::default()
        };
        if parts.first() == Some(&"namespaces") && parts.len() >= 2 {
            info.namespace = parts[1].to_owned();
            if parts.len() == 2 {
                // `/namespaces/NAME` names the namespace itself.
                info.resource = "namespaces".to_owned();
                info.name = parts[1].to_owned();
                parts.clear();
            } else {
                parts.drain(..2);
            }
        }
        if let Some(r) = parts.first() {
            info.resource = (*r).to_owned();
        }
        if let Some(n) = parts.get(1) {
            info.name = (*n).to_owned();
        }
        if let Some(s) = parts.get(2) {
            info.subresource = (*s).to_owned();
        }
        info.verb = match *method {
            Method::POST => "create",
            Method::PUT => "update",
            Method::PATCH => "patch",
            Method::DELETE if info.name.is_empty() => "deletecollection",
            Method::DELETE => "delete",
            _ if watch => "watch",
            _ if info.name.is_empty() => "list",
            _ => "get",
        }
        .to_owned();
        Some(info)
    }

    /// As RBAC's attributes.
    pub fn attributes(&self) -> Attributes<'_> {
        Attributes {
            verb: &self.verb,
            group: &self.group,
            resource: &self.resource,
            subresource: &self.subresource,
            name: &self.name,
            namespace: &self.namespace,
            path: "",
        }
    }

    /// Kubernetes' refusal: `flunders.wardle.example.com "x" is forbidden: User "jane"
    /// cannot get resource "flunders" in API group "wardle.example.com" in the namespace
    /// "shop": <why>`.
    pub fn forbidden(&self, user: &User, why: &str) -> ApiError {
        let what = if self.subresource.is_empty() {
            self.resource.clone()
        } else {
            format!("{}/{}", self.resource, self.subresource)
        };
        let name = if self.name.is_empty() {
            String::new()
        } else {
            format!(" {:?}", self.name)
        };
        let place = if self.namespace.is_empty() {
            " at the cluster scope".to_owned()
        } else {
            format!(" in the namespace {:?}", self.namespace)
        };
        let why = if why.is_empty() {
            String::new()
        } else {
            format!(": {why}")
        };
        let mut e = ApiError::forbidden(format!(
            "{what}.{}{name} is forbidden: User {:?} cannot {} resource {:?} in API group {:?}{place}{why}",
            self.group,
            user.name(),
            self.verb,
            what,
            self.group,
        ));
        e.details = Some(serde_json::json!({"group": self.group, "kind": self.resource}));
        e
    }
}

/// Why `path` may not be proxied, if it may not: a dot segment, an empty segment, or an
/// escaped slash, dot or backslash — what an extension server would resolve to another
/// path than the one authorized here.
pub fn uncanonical(path: &str) -> Option<String> {
    let lower = path.to_ascii_lowercase();
    let trimmed = path.strip_suffix('/').unwrap_or(path);
    let bad_segment = trimmed
        .split('/')
        .skip(1)
        .any(|seg| seg.is_empty() || seg == "." || seg == "..");
    let escaped = ["%2f", "%2e", "%5c"].iter().any(|e| lower.contains(e)) || path.contains('\\');
    (bad_segment || escaped).then(|| {
        format!(
            "the path {path:?} is not canonical (empty or dot segments, escaped slashes, dots or backslashes): send the path it stands for"
        )
    })
}

/// Headers never passed on: hop-by-hop ones, the caller's credentials, and what would
/// name another caller to the extension server.
fn dropped(name: &HeaderName) -> bool {
    let n = name.as_str();
    matches!(
        n,
        "connection"
            | "keep-alive"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "proxy-connection"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
            | "authorization"
            | "host"
    ) || n.starts_with("impersonate-")
        || n.starts_with("x-remote-")
}

/// A request's headers as sent on: the caller's own minus [`dropped`], the caller named in
/// `X-Remote-*`, and the upgrade headers when `upgrade`.
fn forwarded_headers(from: &HeaderMap, user: &User, upgrade: bool) -> HeaderMap {
    let mut out = HeaderMap::with_capacity(from.len() + 4);
    for (k, v) in from {
        if !dropped(k) {
            out.append(k.clone(), v.clone());
        }
    }
    if upgrade {
        for h in [header::CONNECTION, header::UPGRADE] {
            for v in from.get_all(&h) {
                out.append(h.clone(), v.clone());
            }
        }
    }
    if let Ok(v) = HeaderValue::from_str(&user.name()) {
        out.insert(USER_HEADER, v);
    }
    for g in user.groups() {
        if let Ok(v) = HeaderValue::from_str(&g) {
            out.append(GROUP_HEADER, v);
        }
    }
    for (key, values) in extra_of(user) {
        let name = format!("{EXTRA_HEADER_PREFIX}{}", escape_extra_key(&key));
        let Ok(name) = HeaderName::from_bytes(name.as_bytes()) else {
            continue;
        };
        for v in values {
            if let Ok(v) = HeaderValue::from_str(&v) {
                out.append(name.clone(), v);
            }
        }
    }
    out
}

/// The caller's extra fields, as Kubernetes gives a ServiceAccount's (`kubectl auth
/// whoami` shows the same).
fn extra_of(user: &User) -> Vec<(String, Vec<String>)> {
    let User::ServiceAccount(sa) = user else {
        return Vec::new();
    };
    let mut out = vec![(
        "authentication.kubernetes.io/credential-id".to_owned(),
        vec![format!("JTI={}", sa.id)],
    )];
    if let Some((kind, name, uid)) = &sa.bound
        && kind == "Pod"
    {
        out.push((
            "authentication.kubernetes.io/pod-name".to_owned(),
            vec![name.clone()],
        ));
        out.push((
            "authentication.kubernetes.io/pod-uid".to_owned(),
            vec![uid.clone()],
        ));
    }
    out
}

/// An extra key in a header name: characters a header name cannot carry (and `%`)
/// percent-encoded, as Kubernetes escapes them.
fn escape_extra_key(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    for b in key.bytes() {
        if b.is_ascii_alphanumeric() || b"-!#$&'*+.^_`|~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn unavailable(message: String) -> Response {
    crate::http::error_response(&ApiError::new(503, "ServiceUnavailable", message))
}

/// Proxies `request` (authenticated as the [`User`] in its extensions) to `remote`'s
/// extension server at `path` (its own path, or the OpenAPI document's).
pub async fn forward(api: &Api, remote: &Remote, request: Request) -> Response {
    let Some(user) = request.extensions().get::<User>().cloned() else {
        return crate::http::error_response(&ApiError::new(
            401,
            "Unauthorized",
            "authentication required",
        ));
    };
    let started = Instant::now();
    let answer = forward_as(api, remote, &user, request).await;
    api.observe_aggregated(&remote.name, answer.status().as_u16(), started);
    answer
}

async fn forward_as(api: &Api, remote: &Remote, user: &User, mut request: Request) -> Response {
    let prefix = format!("/apis/{}/{}", remote.group, remote.version);
    let path = request.uri().path().to_owned();
    let query = request.uri().query().unwrap_or_default().to_owned();
    let rest = path.strip_prefix(&prefix).unwrap_or_default();
    let info = RequestInfo::parse(request.method(), &remote.group, rest, &query);
    // Discovery documents (the group-version's, its OpenAPI) are anyone's, as
    // `system:discovery` grants them; a resource is authorized as here.
    if let Some(info) = &info {
        match crate::access_review::extension_decision(api, user, &info.attributes()).await {
            Ok((true, _)) => {}
            Ok((false, why)) => return crate::http::error_response(&info.forbidden(user, &why)),
            Err(e) => return crate::http::error_response(&e),
        }
    }
    let Some(transport) = api.aggregator().transport() else {
        return unavailable(format!(
            "{}/{} is served by service {}/{}, but this API server has no front-proxy certificate to reach it with: put {} and {} in its pki directory (`tessera certs init` writes them)",
            remote.group,
            remote.version,
            remote.namespace,
            remote.service,
            crate::pki::FRONT_PROXY_CA[0],
            crate::pki::FRONT_PROXY_CA[1],
        ));
    };
    let addr = match api.aggregator().address(api, remote).await {
        Ok(a) => a,
        Err(why) => {
            return unavailable(format!(
                "the server is currently unable to handle the request: {why}"
            ));
        }
    };
    // One of the caller's seats while the body arrives and until the answer starts: a
    // caller flooding an extension server waits in its own line.
    let seat = match api.early_seat(user).await {
        Ok(s) => s,
        Err(e) => return crate::http::error_response(&e),
    };
    let upgrade = request.headers().contains_key(header::UPGRADE);
    let headers = forwarded_headers(request.headers(), user, upgrade);
    let on_upgrade = upgrade
        .then(|| {
            request
                .extensions_mut()
                .remove::<hyper::upgrade::OnUpgrade>()
        })
        .flatten();
    let method = request.method().clone();
    let read = axum::body::to_bytes(request.into_body(), crate::request::MAX_BODY_BYTES);
    let body = match tokio::time::timeout(ANSWER_TIMEOUT, read).await {
        Ok(Ok(b)) => b,
        Ok(Err(_)) => {
            return crate::http::error_response(&ApiError::new(
                413,
                "RequestEntityTooLarge",
                format!(
                    "the request body is larger than the limit of {} bytes",
                    crate::request::MAX_BODY_BYTES
                ),
            ));
        }
        Err(_) => {
            return crate::http::error_response(&ApiError::new(
                408,
                "Timeout",
                "the request body did not arrive in time",
            ));
        }
    };
    let server_name = remote.server_name();
    let path_and_query = if query.is_empty() {
        path
    } else {
        format!("{path}?{query}")
    };
    let mut upstream = hyper::Request::builder()
        .method(method)
        .uri(path_and_query.as_str())
        .header(header::HOST, format!("{server_name}:{}", remote.port));
    if let Some(h) = upstream.headers_mut() {
        h.extend(headers);
    }
    let upstream = match upstream.body(Full::new(body)) {
        Ok(u) => u,
        Err(e) => return crate::http::error_response(&ApiError::bad_request(e.to_string())),
    };
    let key: Key = (addr, server_name, remote.ca_pem.clone());
    let reach = |e: String| {
        api.aggregator().forget_address(&remote.name);
        unavailable(format!("error trying to reach service: {e}"))
    };
    if let Some(client_side) = on_upgrade {
        let answer = match transport.send_upgrade(&key, upstream).await {
            Ok(a) => a,
            Err(e) => return reach(e),
        };
        drop(seat);
        return spliced(answer, client_side);
    }
    let watch = info.as_ref().is_some_and(|i| i.verb == "watch");
    let sent = transport.send(key, upstream);
    let answer = if watch {
        sent.await
    } else {
        match tokio::time::timeout(ANSWER_TIMEOUT, sent).await {
            Ok(a) => a,
            Err(_) => {
                return crate::http::error_response(&ApiError::new(
                    504,
                    "Timeout",
                    format!(
                        "the extension server of {}/{} did not answer within {} s",
                        remote.group,
                        remote.version,
                        ANSWER_TIMEOUT.as_secs()
                    ),
                ));
            }
        }
    };
    drop(seat);
    let (parts, body) = match answer {
        Ok(a) => a,
        Err(e) => return reach(e),
    };
    let mut response = Response::new(body);
    *response.status_mut() = parts.status;
    for (k, v) in &parts.headers {
        if !matches!(
            k.as_str(),
            "connection" | "keep-alive" | "transfer-encoding" | "trailer" | "upgrade"
        ) {
            response.headers_mut().append(k.clone(), v.clone());
        }
    }
    response
}

/// The extension's answer to an upgrading request: its `101` passed back and the two
/// upgraded connections spliced, or its refusal as it is.
fn spliced(
    answer: hyper::Response<hyper::body::Incoming>,
    client_side: hyper::upgrade::OnUpgrade,
) -> Response {
    if answer.status() != StatusCode::SWITCHING_PROTOCOLS {
        let (parts, body) = answer.into_parts();
        let mut r = Response::new(Body::new(body));
        *r.status_mut() = parts.status;
        *r.headers_mut() = parts.headers;
        return r;
    }
    let mut r = Response::builder().status(StatusCode::SWITCHING_PROTOCOLS);
    for (k, v) in answer.headers() {
        r = r.header(k, v);
    }
    tokio::spawn(async move {
        let (client, server) = match tokio::try_join!(client_side, hyper::upgrade::on(answer)) {
            Ok(both) => both,
            Err(e) => {
                tracing::debug!(error = %e, "an upgrade through the aggregator failed");
                return;
            }
        };
        let (mut client, mut server) = (TokioIo::new(client), TokioIo::new(server));
        if let Err(e) = tokio::io::copy_bidirectional(&mut client, &mut server).await {
            tracing::debug!(error = %e, "an upgraded connection through the aggregator ended");
        }
    });
    r.body(Body::empty())
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_info_reads_kubernetes_paths() {
        let parse = |m: Method, rest: &str, q: &str| RequestInfo::parse(&m, "g", rest, q);
        assert_eq!(parse(Method::GET, "", ""), None);
        assert_eq!(parse(Method::GET, "/", ""), None);
        let i = parse(Method::GET, "/namespaces/shop/flunders", "").expect("info");
        assert_eq!(
            (i.verb.as_str(), i.namespace.as_str(), i.resource.as_str()),
            ("list", "shop", "flunders")
        );
        let i = parse(Method::GET, "/namespaces/shop/flunders", "watch=true").expect("info");
        assert_eq!(i.verb, "watch");
        let i = parse(Method::GET, "/watch/namespaces/shop/flunders/a", "").expect("info");
        assert_eq!((i.verb.as_str(), i.name.as_str()), ("watch", "a"));
        let i = parse(Method::PUT, "/namespaces/shop/flunders/a/status", "").expect("info");
        assert_eq!(
            (i.verb.as_str(), i.name.as_str(), i.subresource.as_str()),
            ("update", "a", "status")
        );
        let i = parse(Method::DELETE, "/fischers", "").expect("info");
        assert_eq!(
            (i.verb.as_str(), i.namespace.as_str()),
            ("deletecollection", "")
        );
        let i = parse(Method::GET, "/namespaces/shop", "").expect("info");
        assert_eq!(
            (i.resource.as_str(), i.name.as_str(), i.namespace.as_str()),
            ("namespaces", "shop", "shop")
        );
        let e = parse(Method::POST, "/namespaces/shop/flunders", "")
            .expect("info")
            .forbidden(&User::Tenant("acme".into()), "not yours");
        assert_eq!(
            e.message,
            "flunders.g is forbidden: User \"tenant:acme\" cannot create resource \"flunders\" in API group \"g\" in the namespace \"shop\": not yours"
        );
    }

    #[test]
    fn the_caller_cannot_name_itself_to_the_extension() {
        let mut h = HeaderMap::new();
        h.insert("authorization", HeaderValue::from_static("Bearer secret"));
        h.insert("x-remote-user", HeaderValue::from_static("admin"));
        h.append("X-Remote-Group", HeaderValue::from_static("system:masters"));
        h.insert(
            "x-remote-extra-scopes",
            HeaderValue::from_static("everything"),
        );
        h.insert("impersonate-user", HeaderValue::from_static("admin"));
        h.insert("accept", HeaderValue::from_static("application/json"));
        let out = forwarded_headers(&h, &User::Tenant("acme".into()), false);
        assert!(out.get("authorization").is_none());
        assert!(out.get("impersonate-user").is_none());
        assert!(out.get("x-remote-extra-scopes").is_none());
        assert_eq!(out.get("x-remote-user").expect("user"), "tenant:acme");
        let groups: Vec<&str> = out
            .get_all("x-remote-group")
            .iter()
            .map(|v| v.to_str().expect("ascii"))
            .collect();
        assert_eq!(
            groups,
            [
                "tessera:tenants",
                "tessera:tenant:acme",
                "system:authenticated"
            ]
        );
        assert_eq!(out.get("accept").expect("kept"), "application/json");
    }

    #[test]
    fn only_canonical_paths_are_proxied() {
        assert!(uncanonical("/apis/g/v/namespaces/a/flunders").is_none());
        assert!(uncanonical("/apis/g/v").is_none());
        assert!(uncanonical("/apis/g/v/").is_none());
        for bad in [
            "/apis/g/v/namespaces/a/../b/flunders",
            "/apis/g/v/namespaces/a/./flunders",
            "/apis/g/v/namespaces/a%2F..%2Fb/flunders",
            "/apis/g/v/namespaces/a/%2e%2e/flunders",
            "/apis/g/v//flunders",
            "/apis/g/v/namespaces\\b",
        ] {
            assert!(uncanonical(bad).is_some(), "{bad}");
        }
    }

    #[test]
    fn extra_keys_are_escaped() {
        assert_eq!(
            escape_extra_key("authentication.kubernetes.io/pod-name"),
            "authentication.kubernetes.io%2Fpod-name"
        );
        assert_eq!(escape_extra_key("a%b"), "a%25b");
    }
}
