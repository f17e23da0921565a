//! Streaming into running containers, as the kubelet's streaming server does for the API
//! server's `pods/exec`, `pods/attach` and `pods/portforward`:
//!
//! - `GET /exec/{namespace}/{pod}/{container}?podUID=…&command=…&stdin=…&stdout=…&stderr=…&tty=…`
//!   upgrades to a WebSocket speaking `v5.channel.k8s.io` (or `v4`): channel 0 stdin, 1
//!   stdout, 2 stderr, 3 the final `Status` (exit code), 4 terminal resizes, and in v5 the
//!   close signal `[255, channel]` (the client's stdin ended) — or to SPDY/3.1 with
//!   `v4.channel.k8s.io` (a stream per channel) for clients that fall back to it. The
//!   command runs inside the container's sandbox ([`crate::sandbox`]'s `join`) as its
//!   identity, with its environment.
//! - `GET /attach/{namespace}/{pod}/{container}?…` joins the container's own output (and its
//!   stdin when it has one) over the same transports: see [`attach`].
//! - `GET /portForward/{namespace}/{pod}?podUID=…` upgrades to SPDY/3.1 (`portforward.k8s.io`),
//!   directly or tunnelled through a WebSocket as kubectl 1.31+ does
//!   (`SPDY/3.1+portforward.k8s.io`): see [`portforward`].
//!
//! Only the API server reaches these (a node credential it signed for the very request), and
//! it has already decided the caller may.

pub mod attach;
pub mod exec;
pub mod portforward;
pub mod spdy;

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::ws::WebSocketUpgrade;
use axum::extract::{FromRequestParts, Path as UrlPath, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use k8s_openapi::api::core::v1::Container;
use parking_lot::Mutex;
use prometheus::{IntCounterVec, IntGaugeVec, Opts};
use tessera_client::status::ApiError;

use crate::logs::{AgentServer, error_response, refuse_stranger};
use crate::probe::Where;

/// A running container: where it runs and what its processes get.
#[derive(Clone, Debug)]
pub struct Target {
    /// Where it runs (its sandbox, or beside the agent).
    pub at: Where,
    /// Its environment (resolved).
    pub env: Vec<(String, String)>,
    /// Its spec (working directory, ports).
    pub container: Container,
    /// Its output as it is written (`kubectl attach`).
    pub output: crate::logs::LiveOutput,
    /// Its stdin, if its spec asked for one (`stdin: true`): bytes, or `None` to close it.
    pub stdin: Option<tokio::sync::mpsc::Sender<Option<bytes::Bytes>>>,
}

/// Streaming sessions of a node (`tessera_agent_stream_*`, labelled with the node).
#[derive(Clone, Debug)]
pub struct StreamMetrics {
    sessions: IntCounterVec,
    active: IntGaugeVec,
    forwards: IntCounterVec,
}

impl StreamMetrics {
    fn new(node: &str) -> StreamMetrics {
        let opts = |name: &str, help: &str| Opts::new(name, help).const_label("node", node);
        StreamMetrics {
            sessions: IntCounterVec::new(
                opts(
                    "tessera_agent_stream_sessions_total",
                    "Exec, attach and port-forward sessions started on this node, by kind and transport (websocket, spdy).",
                ),
                &["kind", "transport"],
            )
            .expect("a valid metric"),
            active: IntGaugeVec::new(
                opts(
                    "tessera_agent_stream_sessions_active",
                    "Exec, attach and port-forward sessions open on this node now, by kind.",
                ),
                &["kind"],
            )
            .expect("a valid metric"),
            forwards: IntCounterVec::new(
                opts(
                    "tessera_agent_portforward_connections_total",
                    "Connections port-forwarded into this node's pods, by result (forwarded, failed).",
                ),
                &["result"],
            )
            .expect("a valid metric"),
        }
    }

    /// Registers them in `registry`.
    pub fn register(&self, registry: &prometheus::Registry) -> prometheus::Result<()> {
        registry.register(Box::new(self.sessions.clone()))?;
        registry.register(Box::new(self.active.clone()))?;
        registry.register(Box::new(self.forwards.clone()))
    }

    /// A session of `kind` over `transport` starts: counted, and open until the guard goes.
    pub(crate) fn session(&self, kind: &str, transport: &str) -> SessionGuard {
        self.sessions.with_label_values(&[kind, transport]).inc();
        let active = self.active.with_label_values(&[kind]);
        active.inc();
        SessionGuard(active)
    }

    /// A forwarded connection's outcome.
    pub(crate) fn forward(&self, ok: bool) {
        let result = if ok { "forwarded" } else { "failed" };
        self.forwards.with_label_values(&[result]).inc();
    }
}

/// An open session ([`StreamMetrics::session`]).
pub struct SessionGuard(prometheus::IntGauge);

impl Drop for SessionGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// The running containers of a node, by pod UID and container name.
#[derive(Clone, Debug)]
pub struct Targets {
    inner: Arc<Mutex<BTreeMap<(String, String), Target>>>,
    metrics: StreamMetrics,
}

impl Targets {
    /// No containers yet, on node `node`.
    pub fn new(node: &str) -> Targets {
        Targets {
            inner: Arc::default(),
            metrics: StreamMetrics::new(node),
        }
    }

    /// The node's streaming metrics.
    pub fn metrics(&self) -> &StreamMetrics {
        &self.metrics
    }

    /// Container `name` of pod `uid` runs now.
    pub fn insert(&self, uid: &str, name: &str, target: Target) {
        self.inner
            .lock()
            .insert((uid.to_owned(), name.to_owned()), target);
    }

    /// Registers `target` of pod `uid` until the guard returned is dropped.
    pub fn running(&self, uid: &str, target: Target) -> Running {
        let name = target.container.name.clone();
        self.insert(uid, &name, target);
        Running {
            targets: self.clone(),
            uid: uid.to_owned(),
            name,
        }
    }

    /// Container `name` of pod `uid` has stopped.
    pub fn remove(&self, uid: &str, name: &str) {
        self.inner.lock().remove(&(uid.to_owned(), name.to_owned()));
    }

    /// Container `name` of pod `uid`, if it runs.
    pub fn get(&self, uid: &str, name: &str) -> Option<Target> {
        self.inner
            .lock()
            .get(&(uid.to_owned(), name.to_owned()))
            .cloned()
    }

    /// The container of pod `uid` that declares `port`, else its first running one (each
    /// container has its own network namespace on a process node).
    pub fn for_port(&self, uid: &str, port: u16) -> Option<Target> {
        let map = self.inner.lock();
        let mut of_pod = map
            .range((uid.to_owned(), String::new())..)
            .take_while(|((u, _), _)| u == uid)
            .map(|(_, t)| t);
        let first = of_pod.next()?;
        let declares = |t: &Target| {
            t.container
                .ports
                .iter()
                .flatten()
                .any(|p| p.container_port == i32::from(port))
        };
        if declares(first) {
            return Some(first.clone());
        }
        Some(of_pod.find(|t| declares(t)).unwrap_or(first).clone())
    }
}

/// A container registered while it runs ([`Targets::running`]).
pub struct Running {
    targets: Targets,
    uid: String,
    name: String,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.targets.remove(&self.uid, &self.name);
    }
}

/// Connects to `port` on the loopback of the network the container at `at` sees: inside its
/// network namespace (entered by a thread of its own: the runtime's threads never change
/// theirs), or the host's.
pub async fn connect(at: &Where, port: u16) -> Result<tokio::net::TcpStream, String> {
    let pid = match at {
        Where::Host => None,
        Where::Sandbox { supervisor, .. } => Some(crate::probe::init_of(*supervisor)?),
    };
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("portforward-netns".into())
        .spawn(move || {
            let run = || -> Result<std::net::TcpStream, String> {
                if let Some(pid) = pid {
                    let ns = std::fs::File::open(format!("/proc/{pid}/ns/net"))
                        .map_err(|e| format!("the container's network: {e}"))?;
                    rustix::thread::move_into_link_name_space(
                        std::os::fd::AsFd::as_fd(&ns),
                        Some(rustix::thread::LinkNameSpaceType::Network),
                    )
                    .map_err(|e| format!("entering the container's network: {e}"))?;
                }
                let timeout = std::time::Duration::from_secs(5);
                let v4 = std::net::SocketAddr::from(([127, 0, 0, 1], port));
                let v6 = std::net::SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, port));
                let s = std::net::TcpStream::connect_timeout(&v4, timeout)
                    .or_else(|e4| {
                        std::net::TcpStream::connect_timeout(&v6, timeout).map_err(|_| e4)
                    })
                    .map_err(|e| format!("failed to connect to localhost:{port}: {e}"))?;
                s.set_nonblocking(true).map_err(|e| e.to_string())?;
                Ok(s)
            };
            let _ = tx.send(run());
        })
        .map_err(|e| format!("port-forward thread: {e}"))?;
    let std = rx
        .await
        .map_err(|_| "the port-forward thread ended".to_owned())??;
    tokio::net::TcpStream::from_std(std).map_err(|e| e.to_string())
}

/// `GET /exec/{namespace}/{pod}/{container}`: exec ([`exec`]) over a WebSocket, or over
/// SPDY/3.1 for clients that ask for it.
pub(crate) async fn exec_route(
    State(server): State<AgentServer>,
    UrlPath((ns, pod, container)): UrlPath<(String, String, String)>,
    request: Request,
) -> Response {
    let (mut parts, _body) = request.into_parts();
    let found = session_target(&server, &parts, &ns, &pod, &container, |q| {
        exec::ExecOptions::from_query(q)
    });
    let (opts, target) = match found {
        Ok(found) => found,
        Err(refused) => return refused,
    };
    tracing::info!(namespace = %ns, %pod, %container, command = ?opts.command, tty = opts.tty, "exec");
    let wanted = opts.wanted();
    let metrics = server.targets().metrics().clone();
    switch_session(&mut parts, metrics, "exec", wanted, move |i, o| {
        exec::run(target, opts, i, o)
    })
    .await
}

/// `GET /attach/{namespace}/{pod}/{container}`: attach ([`attach`]), over the transports of
/// exec.
pub(crate) async fn attach_route(
    State(server): State<AgentServer>,
    UrlPath((ns, pod, container)): UrlPath<(String, String, String)>,
    request: Request,
) -> Response {
    let (mut parts, _body) = request.into_parts();
    let (wanted, target) =
        match session_target(&server, &parts, &ns, &pod, &container, attach::options) {
            Ok(found) => found,
            Err(refused) => return refused,
        };
    tracing::info!(namespace = %ns, %pod, %container, stdin = wanted.stdin, "attach");
    let metrics = server.targets().metrics().clone();
    switch_session(&mut parts, metrics, "attach", wanted, move |i, o| {
        attach::run(target, wanted, i, o)
    })
    .await
}

/// What exec and attach check first, in order: the API server's credential, the options
/// the query carries (`options`), the pod's UID, and that the container named runs.
#[allow(clippy::result_large_err)]
fn session_target<T>(
    server: &AgentServer,
    parts: &axum::http::request::Parts,
    ns: &str,
    pod: &str,
    container: &str,
    options: impl FnOnce(&str) -> Result<T, ApiError>,
) -> Result<(T, Target), Response> {
    if let Some(refused) = refuse_stranger(server, &parts.headers, &parts.uri) {
        return Err(refused);
    }
    let query = parts.uri.query().unwrap_or_default();
    let opts = options(query).map_err(|e| error_response(&e))?;
    let uid = pod_uid(query).map_err(|e| error_response(&e))?;
    match server.targets().get(&uid, container) {
        Some(target) => Ok((opts, target)),
        None => Err(error_response(&not_running(
            server,
            ns,
            pod,
            Some(container),
        ))),
    }
}

/// Switches an exec or attach request to the WebSocket or SPDY transport it asks for and
/// runs `session` over it.
async fn switch_session<F, Fut>(
    parts: &mut axum::http::request::Parts,
    metrics: StreamMetrics,
    what: &'static str,
    wanted: exec::Wanted,
    session: F,
) -> Response
where
    F: FnOnce(
            tokio::sync::mpsc::Receiver<exec::Input>,
            tokio::sync::mpsc::Sender<exec::Output>,
        ) -> Fut
        + Send
        + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    match upgrade_of(&parts.headers).as_str() {
        "websocket" => {
            let ws = match WebSocketUpgrade::from_request_parts(parts, &()).await {
                Ok(ws) => ws.protocols(exec::PROTOCOLS),
                Err(e) => return e.into_response(),
            };
            let Some(protocol) = ws.selected_protocol().and_then(|p| p.to_str().ok()) else {
                return error_response(&ApiError::bad_request(format!(
                    "none of the WebSocket subprotocols asked for is served; {what} speaks {}",
                    exec::PROTOCOLS.join(", ")
                )));
            };
            let v5 = protocol == exec::PROTOCOLS[0];
            ws.on_upgrade(move |socket| async move {
                let _open = metrics.session(what, "websocket");
                exec::serve_ws(socket, v5, session).await;
            })
        }
        u if u.starts_with("spdy/3.1") => {
            switch_to_spdy(parts, exec::SPDY_PROTOCOL, move |io| async move {
                let _open = metrics.session(what, "spdy");
                exec::serve_spdy(io, wanted, session).await;
            })
        }
        _ => error_response(&ApiError::bad_request(format!(
            "{what} needs an upgrade: to a WebSocket ({}) or to SPDY/3.1 ({})",
            exec::PROTOCOLS.join(", "),
            exec::SPDY_PROTOCOL
        ))),
    }
}

/// The protocol a request asks to upgrade to, lowercase.
fn upgrade_of(headers: &HeaderMap) -> String {
    headers
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_ascii_lowercase()
}

/// Answers a SPDY/3.1 upgrade that offers `protocol` (`X-Stream-Protocol-Version`) and
/// serves the switched connection with `serve`.
fn switch_to_spdy<F, Fut>(
    parts: &mut axum::http::request::Parts,
    protocol: &str,
    serve: F,
) -> Response
where
    F: FnOnce(hyper_util::rt::TokioIo<hyper::upgrade::Upgraded>) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let offered: Vec<&str> = parts
        .headers
        .get_all("x-stream-protocol-version")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .collect();
    if !offered.contains(&protocol) {
        return error_response(&ApiError::bad_request(format!(
            "unable to negotiate a streaming protocol: the client offers [{}], this node serves {protocol} over SPDY",
            offered.join(", ")
        )));
    }
    let Some(on_upgrade) = parts.extensions.remove::<hyper::upgrade::OnUpgrade>() else {
        return error_response(&ApiError::bad_request(
            "this connection cannot be upgraded (HTTP/1.1 is needed)",
        ));
    };
    tokio::spawn(async move {
        match on_upgrade.await {
            Ok(upgraded) => serve(hyper_util::rt::TokioIo::new(upgraded)).await,
            Err(e) => tracing::debug!(error = %e, "a SPDY upgrade failed"),
        }
    });
    Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header(header::CONNECTION, "Upgrade")
        .header(header::UPGRADE, "SPDY/3.1")
        .header("X-Stream-Protocol-Version", protocol)
        .body(axum::body::Body::empty())
        .unwrap_or_default()
}

/// `GET /portForward/{namespace}/{pod}`: SPDY port-forward, directly or in a WebSocket
/// ([`portforward`]).
pub(crate) async fn port_forward_route(
    State(server): State<AgentServer>,
    UrlPath((ns, pod)): UrlPath<(String, String)>,
    request: Request,
) -> Response {
    let (mut parts, _body) = request.into_parts();
    if let Some(refused) = refuse_stranger(&server, &parts.headers, &parts.uri) {
        return refused;
    }
    let uid = match pod_uid(parts.uri.query().unwrap_or_default()) {
        Ok(u) => u,
        Err(e) => return error_response(&e),
    };
    if server.targets().for_port(&uid, 0).is_none() {
        return error_response(&not_running(&server, &ns, &pod, None));
    }
    let to = portforward::PodRef {
        namespace: ns,
        name: pod,
        uid,
    };
    let targets = server.targets().clone();
    let upgrade = upgrade_of(&parts.headers);
    if upgrade == "websocket" {
        let ws = match WebSocketUpgrade::from_request_parts(&mut parts, &()).await {
            Ok(ws) => ws.protocols([portforward::TUNNEL_PROTOCOL, portforward::CHANNEL_PROTOCOL]),
            Err(e) => return e.into_response(),
        };
        let tunnel = match ws.selected_protocol().and_then(|p| p.to_str().ok()) {
            Some(p) => p == portforward::TUNNEL_PROTOCOL,
            None => {
                return error_response(&ApiError::bad_request(format!(
                    "port-forward over a WebSocket is served as {} (kubectl 1.31 and later) or {} (ports in the query)",
                    portforward::TUNNEL_PROTOCOL,
                    portforward::CHANNEL_PROTOCOL
                )));
            }
        };
        if tunnel {
            return ws.on_upgrade(move |socket| async move {
                let _open = targets.metrics().session("portforward", "websocket");
                portforward::serve(portforward::tunnel(socket), targets, to).await;
            });
        }
        let ports = match ports_of(parts.uri.query().unwrap_or_default()) {
            Ok(p) => p,
            Err(e) => return error_response(&e),
        };
        return ws.on_upgrade(move |socket| async move {
            let _open = targets.metrics().session("portforward", "websocket");
            portforward::serve_channels(socket, targets, to, ports).await;
        });
    }
    if !upgrade.starts_with("spdy/3.1") {
        return error_response(&ApiError::bad_request(format!(
            "port-forward needs an upgrade: to SPDY/3.1 ({}) or to a WebSocket ({})",
            portforward::PROTOCOL,
            portforward::TUNNEL_PROTOCOL
        )));
    }
    switch_to_spdy(&mut parts, portforward::PROTOCOL, move |io| async move {
        let _open = targets.metrics().session("portforward", "spdy");
        portforward::serve(io, targets, to).await;
    })
}

/// The `ports` of a port-forward query (each a number in 1..=65535; at least one).
fn ports_of(query: &str) -> Result<Vec<u16>, ApiError> {
    let mut ports = Vec::new();
    for v in query_values(query, "ports")? {
        for p in v.split(',').filter(|p| !p.is_empty()) {
            match p.trim().parse::<u16>() {
                Ok(n) if n > 0 => ports.push(n),
                _ => {
                    return Err(ApiError::bad_request(format!(
                        "ports: {p:?} is not a port number (1-65535)"
                    )));
                }
            }
        }
    }
    if ports.is_empty() {
        return Err(ApiError::bad_request(
            "at least one port is required (?ports=N) for port-forward over v4.channel.k8s.io",
        ));
    }
    Ok(ports)
}

fn pod_uid(query: &str) -> Result<String, ApiError> {
    query_values(query, "podUID")?
        .into_iter()
        .next()
        .filter(|u| !u.is_empty())
        .ok_or_else(|| ApiError::bad_request("podUID is required"))
}

fn not_running(server: &AgentServer, ns: &str, pod: &str, container: Option<&str>) -> ApiError {
    let what = match container {
        Some(c) => format!("container {c:?} of pod {ns}/{pod}"),
        None => format!("pod {ns}/{pod}"),
    };
    ApiError::new(
        404,
        "NotFound",
        format!(
            "{what} is not running on node {} (it has not started, has ended, or is waiting to restart)",
            server.node()
        ),
    )
}

/// The values of `name` in a query string, percent-decoded, in order.
pub fn query_values(query: &str, name: &str) -> Result<Vec<String>, ApiError> {
    let mut out = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        if tessera_client::request::percent_decode(k)? == name {
            out.push(tessera_client::request::percent_decode(
                &v.replace('+', " "),
            )?);
        }
    }
    Ok(out)
}

/// A boolean query option (`true`/`1` are true; absent is `default`).
pub fn query_flag(query: &str, name: &str, default: bool) -> Result<bool, ApiError> {
    match query_values(query, name)?.last().map(String::as_str) {
        None => Ok(default),
        Some("true" | "1" | "True") => Ok(true),
        Some("false" | "0" | "False" | "") => Ok(false),
        Some(other) => Err(ApiError::bad_request(format!(
            "{name}={other:?} is not a boolean (true or false)"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ContainerPort;

    fn target(name: &str, ports: &[i32]) -> Target {
        Target {
            at: Where::Host,
            env: Vec::new(),
            output: tokio::sync::broadcast::channel(1).0,
            stdin: None,
            container: Container {
                name: name.into(),
                ports: Some(
                    ports
                        .iter()
                        .map(|p| ContainerPort {
                            container_port: *p,
                            ..ContainerPort::default()
                        })
                        .collect(),
                ),
                ..Container::default()
            },
        }
    }

    #[test]
    fn a_port_goes_to_the_container_that_declares_it() {
        let t = Targets::new("n");
        t.insert("u1", "a", target("a", &[80]));
        t.insert("u1", "b", target("b", &[9090]));
        t.insert("u2", "c", target("c", &[9090]));
        let name = |x: Option<Target>| x.map(|t| t.container.name);
        assert_eq!(name(t.for_port("u1", 9090)), Some("b".into()));
        assert_eq!(name(t.for_port("u1", 80)), Some("a".into()));
        // Undeclared: the first container.
        assert_eq!(name(t.for_port("u1", 7000)), Some("a".into()));
        assert_eq!(name(t.for_port("u0", 80)), None);
        t.remove("u1", "a");
        assert_eq!(name(t.for_port("u1", 80)), Some("b".into()));
        assert!(t.get("u2", "c").is_some());
    }

    #[test]
    fn query_options_decode() {
        let q = "command=sh&command=-c&command=echo+hi%21&stdin=true&tty=0";
        assert_eq!(
            query_values(q, "command").expect("ok"),
            ["sh", "-c", "echo hi!"]
        );
        assert!(query_flag(q, "stdin", false).expect("ok"));
        assert!(!query_flag(q, "tty", true).expect("ok"));
        assert!(query_flag(q, "stdout", true).expect("ok"));
        assert!(query_flag("tty=maybe", "tty", false).is_err());
        assert_eq!(
            ports_of("ports=80&ports=9090,7000").expect("ok"),
            [80, 9090, 7000]
        );
        assert!(ports_of("ports=0").is_err() && ports_of("").is_err());
    }
}
