//! An extension API server for the tests, built as Kubernetes' sample-apiserver is used:
//! it serves `wardle.example.com/v1alpha1` Flunders (namespaced, kept in memory), trusts
//! the caller named in `X-Remote-User`/`X-Remote-Group` only on a connection whose client
//! certificate the front-proxy CA signed for an allowed name — both read from
//! `kube-system/extension-apiserver-authentication` — and asks the cluster what that caller
//! may do with a SubjectAccessReview, sent with its own ServiceAccount's token by kubectl.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Path, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use futures::StreamExt;
use serde_json::{Value, json};

use super::{Cluster, wait_for};

/// The group-version served.
pub const GROUP: &str = "wardle.example.com";
/// See [`GROUP`].
pub const VERSION: &str = "v1alpha1";

/// What the extension server saw of one request.
#[derive(Clone, Debug)]
pub struct Seen {
    /// Method and path.
    pub request: String,
    /// The client certificate's name, if one was verified.
    pub proxy: Option<String>,
    /// `X-Remote-User`.
    pub user: String,
    /// Every `X-Remote-Group`.
    pub groups: Vec<String>,
    /// `X-Remote-Extra-*` headers, as (name, value).
    pub extra: Vec<(String, String)>,
}

/// The server's state.
#[derive(Clone)]
pub struct Wardle {
    /// Flunders by (namespace, name).
    pub flunders: Arc<Mutex<BTreeMap<(String, String), Value>>>,
    /// Every request seen, in order.
    pub seen: Arc<Mutex<Vec<Seen>>>,
    allowed_names: Arc<Vec<String>>,
    /// kubectl's arguments to reach the cluster as the extension's ServiceAccount.
    kubectl: Arc<Vec<String>>,
}

fn status(code: u16, reason: &str, message: &str) -> Response {
    (
        StatusCode::from_u16(code).expect("code"),
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code})
        .to_string(),
    )
        .into_response()
}

fn unauthorized() -> Response {
    status(
        401,
        "Unauthorized",
        "not a front-proxied request: no allowed client certificate or no X-Remote-User",
    )
}

fn object(code: StatusCode, body: &Value) -> Response {
    (
        code,
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

impl Wardle {
    /// Who the request is from, as a front-proxied request says: refused unless it came
    /// with the front proxy's certificate.
    fn caller(&self, req: &Request) -> Option<Seen> {
        let cert = req
            .extensions()
            .get::<tessera_apiserver::serve::ClientCert>()
            .cloned();
        let headers = req.headers();
        let all = |h: &str| -> Vec<String> {
            headers
                .get_all(h)
                .iter()
                .filter_map(|v| v.to_str().ok().map(str::to_owned))
                .collect()
        };
        let seen = Seen {
            request: format!("{} {}", req.method(), req.uri().path()),
            proxy: cert
                .as_ref()
                .and_then(|c| c.0.as_ref().ok())
                .map(|id| id.name.clone()),
            user: all("x-remote-user").into_iter().next().unwrap_or_default(),
            groups: all("x-remote-group"),
            extra: headers
                .iter()
                .filter(|(k, _)| k.as_str().starts_with("x-remote-extra-"))
                .filter_map(|(k, v)| Some((k.as_str().to_owned(), v.to_str().ok()?.to_owned())))
                .collect(),
        };
        self.seen.lock().expect("lock").push(seen.clone());
        match &seen.proxy {
            Some(name) if self.allowed_names.contains(name) && !seen.user.is_empty() => Some(seen),
            _ => None,
        }
    }

    /// Asks the cluster whether `who` may `verb` flunders in `ns` (delegated authorization).
    async fn allowed(&self, who: &Seen, verb: &str, ns: &str, name: &str) -> Result<(), String> {
        let review = json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "spec": {"user": who.user, "groups": who.groups,
                "resourceAttributes": {"group": GROUP, "version": VERSION, "resource": "flunders",
                    "verb": verb, "namespace": ns, "name": name}}});
        let args = self.kubectl.clone();
        let answer = tokio::task::spawn_blocking(move || {
            let mut child = std::process::Command::new("kubectl")
                .args(args.iter())
                .args([
                    "create",
                    "--raw",
                    "/apis/authorization.k8s.io/v1/subjectaccessreviews",
                    "-f",
                    "-",
                ])
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("kubectl");
            use std::io::Write;
            child
                .stdin
                .take()
                .expect("stdin")
                .write_all(review.to_string().as_bytes())
                .expect("write");
            child.wait_with_output().expect("kubectl")
        })
        .await
        .expect("join");
        let text = String::from_utf8_lossy(&answer.stdout);
        let review: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        if review["status"]["allowed"] == json!(true) {
            return Ok(());
        }
        Err(format!(
            "flunders.{GROUP} is forbidden: User {:?} cannot {verb} flunders in {ns:?} (the cluster said: {} {})",
            who.user,
            review["status"]["reason"].as_str().unwrap_or_default(),
            String::from_utf8_lossy(&answer.stderr).trim()
        ))
    }
}

async fn discovery(State(w): State<Wardle>, req: Request) -> Response {
    if w.caller(&req).is_none() {
        return unauthorized();
    }
    object(
        StatusCode::OK,
        &json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": format!("{GROUP}/{VERSION}"),
            "resources": [
                {"name": "flunders", "singularName": "flunder", "namespaced": true, "kind": "Flunder",
                    "verbs": ["create", "delete", "get", "list"], "shortNames": ["fl"]},
                {"name": "flunders/status", "singularName": "", "namespaced": true, "kind": "Flunder",
                    "verbs": ["get"]}]}),
    )
}

async fn openapi(State(w): State<Wardle>, req: Request) -> Response {
    if w.caller(&req).is_none() {
        return unauthorized();
    }
    let schema = json!({"type": "object",
        "description": "A Flunder is a sample object of the wardle extension server.",
        "x-kubernetes-group-version-kind": [{"group": GROUP, "version": VERSION, "kind": "Flunder"}],
        "properties": {
            "apiVersion": {"type": "string"}, "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": {"type": "object", "description": "What the flunder refers to.",
                "properties": {"reference": {"type": "string",
                    "description": "The name of another flunder."}}}}});
    // kubectl explain finds the kind through the operation on its path, as kube-openapi
    // writes them.
    // A PATCH taking `fieldValidation` tells kubectl to leave validation to the server.
    let gvk = json!({"group": GROUP, "version": VERSION, "kind": "Flunder"});
    let ok = json!({"200": {"description": "OK", "content": {"application/json": {"schema":
        {"$ref": "#/components/schemas/com.example.wardle.v1alpha1.Flunder"}}}}});
    let get = json!({
        "get": {"operationId": "readFlunder", "x-kubernetes-action": "get",
            "x-kubernetes-group-version-kind": gvk, "responses": ok},
        "patch": {"operationId": "patchFlunder", "x-kubernetes-action": "patch",
            "x-kubernetes-group-version-kind": gvk, "responses": ok,
            "parameters": [{"name": "fieldValidation", "in": "query",
                "schema": {"type": "string", "uniqueItems": true}}]}});
    let path = format!("/apis/{GROUP}/{VERSION}/namespaces/{{namespace}}/flunders/{{name}}");
    object(
        StatusCode::OK,
        &json!({"openapi": "3.0.0", "info": {"title": "wardle", "version": VERSION},
            "paths": {path: get},
            "components": {"schemas": {"com.example.wardle.v1alpha1.Flunder": schema}}}),
    )
}

async fn collection(State(w): State<Wardle>, Path(ns): Path<String>, req: Request) -> Response {
    let Some(who) = w.caller(&req) else {
        return unauthorized();
    };
    let create = req.method() == axum::http::Method::POST;
    if let Err(r) = w
        .allowed(&who, if create { "create" } else { "list" }, &ns, "")
        .await
    {
        return status(403, "Forbidden", &r);
    }
    if !create && req.uri().query().is_some_and(|q| q.contains("watch=true")) {
        // A watch: an ADDED event per flunder, then an open stream that never ends (what
        // reaches the caller before the end proves the proxy streams).
        let events: Vec<Result<String, std::convert::Infallible>> = w
            .flunders
            .lock()
            .expect("lock")
            .iter()
            .filter(|((n, _), _)| *n == ns)
            .map(|(_, v)| Ok(format!("{}\n", json!({"type": "ADDED", "object": v}))))
            .collect();
        let stream = futures::stream::iter(events).chain(futures::stream::pending());
        return (
            [(axum::http::header::CONTENT_TYPE, "application/json")],
            axum::body::Body::from_stream(stream),
        )
            .into_response();
    }
    if !create {
        let items: Vec<Value> = w
            .flunders
            .lock()
            .expect("lock")
            .iter()
            .filter(|((n, _), _)| *n == ns)
            .map(|(_, v)| v.clone())
            .collect();
        return object(
            StatusCode::OK,
            &json!({"kind": "FlunderList", "apiVersion": format!("{GROUP}/{VERSION}"),
                "metadata": {"resourceVersion": "1"}, "items": items}),
        );
    }
    let body = axum::body::to_bytes(req.into_body(), 1 << 20)
        .await
        .unwrap_or_default();
    let mut obj: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return status(400, "BadRequest", &e.to_string()),
    };
    let Some(name) = obj["metadata"]["name"].as_str().map(str::to_owned) else {
        return status(422, "Invalid", "metadata.name: Required value");
    };
    obj["metadata"]["namespace"] = json!(ns);
    obj["metadata"]["uid"] = json!(format!("wardle-{ns}-{name}"));
    obj["metadata"]["resourceVersion"] = json!("1");
    obj["metadata"]["creationTimestamp"] = json!("2026-12-06T00:00:00Z");
    obj["metadata"]["annotations"] = json!({"wardle.example.com/created-by": who.user});
    let mut flunders = w.flunders.lock().expect("lock");
    if flunders.contains_key(&(ns.clone(), name.clone())) {
        return status(
            409,
            "AlreadyExists",
            &format!("flunders {name:?} already exists"),
        );
    }
    flunders.insert((ns, name), obj.clone());
    object(StatusCode::CREATED, &obj)
}

async fn one(
    State(w): State<Wardle>,
    Path((ns, name)): Path<(String, String)>,
    req: Request,
) -> Response {
    let Some(who) = w.caller(&req) else {
        return unauthorized();
    };
    let delete = req.method() == axum::http::Method::DELETE;
    if let Err(r) = w
        .allowed(&who, if delete { "delete" } else { "get" }, &ns, &name)
        .await
    {
        return status(403, "Forbidden", &r);
    }
    let mut flunders = w.flunders.lock().expect("lock");
    let key = (ns, name.clone());
    let found = if delete {
        flunders.remove(&key)
    } else {
        flunders.get(&key).cloned()
    };
    match found {
        Some(o) => object(StatusCode::OK, &o),
        None => status(
            404,
            "NotFound",
            &format!("flunders.{GROUP} {name:?} not found"),
        ),
    }
}

/// `flunders/NAME/echo`: switches the connection to `tessera-echo` (as a console
/// subresource switches to a WebSocket) and sends back every byte it receives.
async fn echo(State(w): State<Wardle>, mut req: Request) -> Response {
    if w.caller(&req).is_none() {
        return unauthorized();
    }
    if req.headers().get("upgrade").and_then(|v| v.to_str().ok()) != Some("tessera-echo") {
        return status(400, "BadRequest", "upgrade to tessera-echo");
    }
    let on_upgrade = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        let Ok(upgraded) = on_upgrade.await else {
            return;
        };
        let mut io = hyper_util::rt::TokioIo::new(upgraded);
        let (mut r, mut w) = tokio::io::split(&mut io);
        let _ = tokio::io::copy(&mut r, &mut w).await;
    });
    Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header("connection", "Upgrade")
        .header("upgrade", "tessera-echo")
        .body(axum::body::Body::empty())
        .expect("101")
}

/// Opens `path` at `server` (`https://host:port`, trusting `ca_pem`) as the bearer of
/// `token`, asking to switch to `tessera-echo`: the answer's status line, and what came back
/// for `ping` once switched.
pub async fn echo_through(server: &str, ca_pem: &str, token: &str, path: &str) -> (String, String) {
    use rustls::pki_types::pem::PemObject;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let authority = server.trim_start_matches("https://");
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls::pki_types::CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert.expect("pem")).expect("ca");
    }
    let config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("tls")
    .with_root_certificates(roots)
    .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(authority)
        .await
        .expect("connect");
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").expect("name");
    let mut tls = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
        .connect(name, tcp)
        .await
        .expect("tls");
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: {authority}\r\nAuthorization: Bearer {token}\r\n\
         Connection: Upgrade\r\nUpgrade: tessera-echo\r\n\r\n"
    );
    tls.write_all(request.as_bytes()).await.expect("write");
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if tls.read(&mut byte).await.expect("read") == 0 {
            break;
        }
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    let status = head.lines().next().unwrap_or_default().to_owned();
    if !status.contains(" 101 ") {
        return (status, head);
    }
    tls.write_all(b"ping\n").await.expect("write");
    let mut back = [0u8; 5];
    let read = tokio::time::timeout(Duration::from_secs(10), tls.read_exact(&mut back)).await;
    let echoed = match read {
        Ok(Ok(_)) => String::from_utf8_lossy(&back).into_owned(),
        other => format!("{other:?}"),
    };
    (status, echoed)
}

/// Starts the server on a free loopback port with a certificate for
/// `wardle.wardle-system.svc`, trusting client certificates from `front_proxy_ca` named in
/// `allowed_names`, and reaching the cluster with `kubectl_args` (server, CA, token): its
/// address, its CA (the APIService's `caBundle`), its state and the runtime serving it.
pub fn start(
    front_proxy_ca: &str,
    allowed_names: Vec<String>,
    kubectl_args: Vec<String>,
) -> (
    std::net::SocketAddr,
    String,
    Wardle,
    tokio::runtime::Runtime,
) {
    let state = Wardle {
        flunders: Arc::default(),
        seen: Arc::default(),
        allowed_names: Arc::new(allowed_names),
        kubectl: Arc::new(kubectl_args),
    };
    let base = format!("/apis/{GROUP}/{VERSION}");
    let router = axum::Router::new()
        .route(&base, get(discovery))
        .route(&format!("/openapi/v3{base}"), get(openapi))
        .route(
            &format!("{base}/namespaces/{{ns}}/flunders"),
            get(collection).post(collection),
        )
        .route(
            &format!("{base}/namespaces/{{ns}}/flunders/{{name}}"),
            get(one).delete(one),
        )
        .route(
            &format!("{base}/namespaces/{{ns}}/flunders/{{name}}/echo"),
            get(echo),
        )
        .with_state(state.clone());
    let tls =
        tessera_apiserver::pki::agent_tls("127.0.0.1", "wardle.wardle-system.svc").expect("tls");
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let addr = rt
        .block_on(tessera_apiserver::serve::serve_tls_pem_verifying(
            "127.0.0.1:0".parse().expect("addr"),
            &tls.cert_pem,
            &tls.key_pem,
            front_proxy_ca,
            router,
            tessera_apiserver::serve::ConnectionLimits::default(),
        ))
        .expect("serve");
    (addr, tls.ca_pem, state, rt)
}

/// `kubectl get apiservice NAME`'s AVAILABLE column once it reads `want` (or the last seen).
pub fn apiservice_available(c: &Cluster, name: &str, want: &str) -> String {
    let mut last = String::new();
    wait_for(Duration::from_secs(60), || {
        last = c.ok(&["get", "apiservice", name, "--no-headers"]);
        last.contains(want).then_some(())
    });
    last
}

/// The wardle server installed in a cluster as an extension server is: what it found.
pub struct Installed {
    /// The APIService's name.
    pub name: String,
    /// The server's state.
    pub wardle: Wardle,
    /// A token of its ServiceAccount (`wardle-system/wardle`).
    pub sa_token: String,
    /// The manifest of its Service, Endpoints and APIService.
    pub service: String,
    /// Its CA, base64 (the APIService's `caBundle`).
    pub bundle: String,
    /// The runtime serving it.
    pub rt: tokio::runtime::Runtime,
}

/// Installs the wardle server in `c` as an extension server is installed — checking the
/// authentication ConfigMap it reads, binding its ServiceAccount to
/// `system:auth-delegator` and to the ConfigMap's reader Role, registering its
/// APIService over a Service and Endpoints — and waits until the APIService is Available.
pub fn install(c: &Cluster) -> Installed {
    use base64::Engine;
    let name = format!("{VERSION}.{GROUP}");
    // What an extension server reads to authenticate the front proxy.
    let cm: Value = serde_json::from_str(&c.ok(&[
        "get",
        "configmap",
        "-n",
        "kube-system",
        "extension-apiserver-authentication",
        "-o",
        "json",
    ]))
    .expect("JSON");
    let data = &cm["data"];
    let cluster_ca = std::fs::read_to_string(c.dir.path().join("pki/ca.crt")).expect("ca");
    assert_eq!(data["client-ca-file"], json!(cluster_ca));
    let front_proxy_ca = data["requestheader-client-ca-file"]
        .as_str()
        .expect("front-proxy CA")
        .to_owned();
    assert_ne!(
        front_proxy_ca, cluster_ca,
        "the front proxy needs a CA of its own"
    );
    let allowed: Vec<String> =
        serde_json::from_str(data["requestheader-allowed-names"].as_str().expect("names"))
            .expect("a JSON list");
    assert_eq!(allowed, ["front-proxy-client"]);
    assert_eq!(
        data["requestheader-username-headers"],
        "[\"X-Remote-User\"]"
    );
    assert_eq!(data["requestheader-group-headers"], "[\"X-Remote-Group\"]");
    assert_eq!(
        data["requestheader-extra-headers-prefix"],
        "[\"X-Remote-Extra-\"]"
    );

    // The extension's ServiceAccount, with the roles a delegating server is bound to.
    let setup = c.file(
        "wardle.yaml",
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: wardle-system}\n---\n\
         apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: wardle, namespace: wardle-system}\n---\n\
         apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata: {name: wardle:auth-delegator}\n\
         roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: system:auth-delegator}\n\
         subjects: [{kind: ServiceAccount, name: wardle, namespace: wardle-system}]\n---\n\
         apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\n\
         metadata: {name: wardle:auth-reader, namespace: kube-system}\n\
         roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: extension-apiserver-authentication-reader}\n\
         subjects: [{kind: ServiceAccount, name: wardle, namespace: wardle-system}]\n",
    );
    c.ok(&["apply", "-f", &setup]);
    let sa_token = c
        .ok(&["create", "token", "wardle", "-n", "wardle-system"])
        .trim()
        .to_owned();
    // The reader Role lets it read that ConfigMap and no other.
    let read = |cm: &str| {
        c.kubectl_as(&sa_token, &["get", "configmap", "-n", "kube-system", cm])
            .status
            .success()
    };
    assert!(read("extension-apiserver-authentication"));
    assert!(!read("kube-root-ca.crt"));
    let kubeconfig = c.file("empty-kubeconfig", "apiVersion: v1\nkind: Config\n");
    let ca_file = c.dir.path().join("pki/ca.crt");
    let (addr, wardle_ca, wardle, rt) = start(
        &front_proxy_ca,
        allowed,
        vec![
            format!("--kubeconfig={kubeconfig}"),
            format!("--server={}", c.server()),
            format!("--certificate-authority={}", ca_file.display()),
            format!("--token={sa_token}"),
        ],
    );
    let port = addr.port();
    let bundle = base64::engine::general_purpose::STANDARD.encode(&wardle_ca);
    let service = c.file(
        "service.yaml",
        &format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: wardle, namespace: wardle-system}}\n\
             spec: {{ports: [{{name: https, port: 443, targetPort: {port}}}]}}\n---\n\
             apiVersion: v1\nkind: Endpoints\nmetadata: {{name: wardle, namespace: wardle-system}}\n\
             subsets: [{{addresses: [{{ip: 127.0.0.1}}], ports: [{{name: https, port: {port}}}]}}]\n---\n\
             apiVersion: apiregistration.k8s.io/v1\nkind: APIService\nmetadata: {{name: {name}}}\n\
             spec: {{group: {GROUP}, version: {VERSION}, groupPriorityMinimum: 1000, versionPriority: 15,\n\
             \x20 caBundle: {bundle}, service: {{namespace: wardle-system, name: wardle, port: 443}}}}\n"
        ),
    );
    c.ok(&["apply", "-f", &service]);
    let row = apiservice_available(c, &name, "True");
    assert!(
        row.contains("wardle-system/wardle") && row.contains("True"),
        "{row}"
    );
    // The check came through the front proxy as kube-aggregator.
    {
        let seen = wardle.seen.lock().expect("lock");
        let check = seen.first().expect("a check");
        assert_eq!(check.proxy.as_deref(), Some("front-proxy-client"));
        assert_eq!(check.user, "system:kube-aggregator");
    }
    Installed {
        name,
        wardle,
        sa_token,
        service,
        bundle,
        rt,
    }
}
