//! The shard's end of reads across shards: the federation sends an `ApiCall` (the path and
//! query of a read it has authorized), the agent makes it in the shard's API and streams the
//! answer back as `ApiReply` pieces — a JSON body in pieces of at most [`PIECE`] bytes, a
//! watch one event per piece, a log as its bytes come. A `CancelCall` (the federation's
//! reader left) stops it. Anything but a read of an object path is refused.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use futures::StreamExt;
use parking_lot::Mutex;
use tessera_client::client::{Client, PodStreamRequest, UPGRADE_HEADERS};
use tessera_client::request::{Verb, from_http, percent_decode};
use tessera_client::response::{ApiResponse, WatchEvent};
use tessera_client::status::ApiError;
use tessera_proto::federation::v1 as pb;
use tessera_runtime::tunnel::{self, Piece};
use tokio::sync::mpsc;

/// The largest piece of a body in one reply (well under gRPC's message limits).
pub const PIECE: usize = 1 << 20;

type Outbox = mpsc::UnboundedSender<pb::ShardMessage>;

/// The calls one session is serving.
#[derive(Default)]
pub struct Calls {
    running: Arc<Mutex<HashMap<u64, tokio::task::AbortHandle>>>,
    /// Where the federation's side of each open tunnel goes.
    tunnels: Arc<Mutex<HashMap<u64, mpsc::UnboundedSender<Piece>>>>,
}

impl Calls {
    /// Starts serving `call` (a read, or a tunnel when it carries upgrade headers); its
    /// replies go to `out`.
    pub fn start(&self, client: Arc<dyn Client>, call: pb::ApiCall, out: Outbox) {
        let id = call.id;
        let running = self.running.clone();
        let tunnels = self.tunnels.clone();
        let task = if call.upgrade.is_empty() {
            tokio::spawn(async move {
                serve(client.as_ref(), call, &out).await;
                running.lock().remove(&id);
            })
        } else {
            let (tx, rx) = mpsc::unbounded_channel();
            self.tunnels.lock().insert(id, tx);
            tokio::spawn(async move {
                serve_tunnel(client.as_ref(), call, rx, &out).await;
                running.lock().remove(&id);
                tunnels.lock().remove(&id);
            })
        };
        let mut running = self.running.lock();
        if !task.is_finished() {
            running.insert(id, task.abort_handle());
        }
    }

    /// Takes the federation's side of a tunnel (the client's bytes, credit, its end); a
    /// message for a tunnel no longer open is dropped.
    pub fn tunnel_data(&self, t: pb::TunnelData) {
        let tunnels = self.tunnels.lock();
        let Some(tx) = tunnels.get(&t.id) else {
            return;
        };
        if !t.data.is_empty() {
            let _ = tx.send(Piece::Data(t.data));
        }
        if t.ack > 0 {
            let _ = tx.send(Piece::Ack(t.ack));
        }
        if t.end {
            let _ = tx.send(Piece::End);
        }
    }

    /// Stops call `id`, if it still runs.
    pub fn cancel(&self, id: u64) {
        self.tunnels.lock().remove(&id);
        if let Some(t) = self.running.lock().remove(&id) {
            t.abort();
        }
    }

    /// Calls still running.
    pub fn len(&self) -> usize {
        self.running.lock().len()
    }

    /// No call is running.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Drop for Calls {
    fn drop(&mut self) {
        for (_, t) in self.running.lock().drain() {
            t.abort();
        }
    }
}

/// The pod stream a tunnel's path names: `/api/v1/namespaces/NS/pods/NAME/SUB?QUERY` with
/// SUB one of `exec`, `attach`, `portforward`.
fn pod_stream_of(call: &pb::ApiCall) -> Result<PodStreamRequest, ApiError> {
    let refuse = || {
        ApiError::bad_request(format!(
            "{} is not a pod's exec, attach or portforward: the federation tunnels only those to a shard",
            call.path
        ))
    };
    let (path, query) = call.path.split_once('?').unwrap_or((&call.path, ""));
    let rest = path
        .strip_prefix("/api/v1/namespaces/")
        .ok_or_else(refuse)?;
    let parts: Vec<&str> = rest.split('/').collect();
    let [ns, "pods", name, sub] = parts.as_slice() else {
        return Err(refuse());
    };
    if !matches!(*sub, "exec" | "attach" | "portforward") || ns.is_empty() || name.is_empty() {
        return Err(refuse());
    }
    Ok(PodStreamRequest {
        namespace: percent_decode(ns)?,
        name: percent_decode(name)?,
        subresource: (*sub).to_owned(),
        query: query.to_owned(),
        headers: call
            .upgrade
            .iter()
            .filter(|h| {
                UPGRADE_HEADERS
                    .iter()
                    .any(|u| u.eq_ignore_ascii_case(&h.name))
            })
            .map(|h| (h.name.to_ascii_lowercase(), h.value.clone()))
            .collect(),
    })
}

/// Opens the pod stream `call` names in the shard's API and carries its bytes over the
/// stream until both sides end, the federation cancels, or the session ends.
pub async fn serve_tunnel(
    client: &dyn Client,
    call: pb::ApiCall,
    inbound: mpsc::UnboundedReceiver<Piece>,
    out: &Outbox,
) {
    let id = call.id;
    let switched = match pod_stream_of(&call) {
        Ok(req) => client.pod_stream(&req).await,
        Err(e) => Err(e),
    };
    let switched = match switched {
        Ok(s) => s,
        Err(e) => return send_error(out, id, &e),
    };
    let kind = pb::api_reply::Kind::Tunnel;
    let mut first = reply(id, 101, kind, Vec::new(), false);
    if let Some(pb::shard_message::Message::Reply(r)) = &mut first.message {
        r.headers = switched
            .headers
            .into_iter()
            .map(|(name, value)| pb::Header { name, value })
            .collect();
    }
    if out.send(first).is_err() {
        return;
    }
    let mut inbound = inbound;
    let inbound = futures::stream::poll_fn(move |cx| inbound.poll_recv(cx));
    let ended = tunnel::pump(switched.io, inbound, |p| {
        let mut r = reply(id, 101, kind, Vec::new(), false);
        if let Some(pb::shard_message::Message::Reply(r)) = &mut r.message {
            match p {
                Piece::Data(d) => r.data = d,
                Piece::Ack(n) => r.ack = n,
                Piece::End => r.end = true,
            }
        }
        out.send(r).is_ok()
    })
    .await;
    tracing::debug!(call = id, ?ended, "a pod stream for the federation ended");
}

fn reply(
    id: u64,
    code: u16,
    kind: pb::api_reply::Kind,
    data: Vec<u8>,
    end: bool,
) -> pb::ShardMessage {
    pb::ShardMessage {
        message: Some(pb::shard_message::Message::Reply(pb::ApiReply {
            id,
            code: u32::from(code),
            kind: kind as i32,
            data,
            end,
            ..Default::default()
        })),
    }
}

/// Sends a JSON body in pieces; false once the stream is gone.
fn send_body(out: &Outbox, id: u64, code: u16, body: &[u8]) -> bool {
    let mut pieces = body.chunks(PIECE).peekable();
    if pieces.peek().is_none() {
        return out
            .send(reply(
                id,
                code,
                pb::api_reply::Kind::Object,
                Vec::new(),
                true,
            ))
            .is_ok();
    }
    while let Some(p) = pieces.next() {
        let last = pieces.peek().is_none();
        if out
            .send(reply(
                id,
                code,
                pb::api_reply::Kind::Object,
                p.to_vec(),
                last,
            ))
            .is_err()
        {
            return false;
        }
    }
    true
}

fn send_error(out: &Outbox, id: u64, e: &ApiError) {
    let body = serde_json::to_vec(&e.to_status()).unwrap_or_default();
    send_body(out, id, e.code, &body);
}

/// Makes one call and streams its answer.
pub async fn serve(client: &dyn Client, call: pb::ApiCall, out: &Outbox) {
    let id = call.id;
    let (path, query) = call.path.split_once('?').unwrap_or((&call.path, ""));
    let req = match from_http("GET", path, query, None, None, Bytes::new()) {
        Ok(Some(r)) if matches!(r.verb, Verb::Get | Verb::List | Verb::Watch) => r,
        Ok(_) => {
            let e = ApiError::bad_request(format!(
                "{path} is not a read of an object or collection: the federation reads only those in a shard"
            ));
            return send_error(out, id, &e);
        }
        Err(e) => return send_error(out, id, &e),
    };
    match client.call(req).await {
        Err(e) => send_error(out, id, &e),
        Ok(ApiResponse::Encoded { code, body }) => {
            send_body(out, id, code, &body);
        }
        Ok(ApiResponse::Object { code, body, .. }) => {
            let bytes = serde_json::to_vec(&body).unwrap_or_default();
            send_body(out, id, code, &bytes);
        }
        Ok(ApiResponse::Watch(mut events)) => {
            let kind = pb::api_reply::Kind::Watch;
            if out.send(reply(id, 200, kind, Vec::new(), false)).is_err() {
                return;
            }
            while let Some(ev) = events.next().await {
                let line = match ev {
                    WatchEvent::Encoded(b) => b.to_vec(),
                    WatchEvent::Value(v) => {
                        let mut l = serde_json::to_vec(&v).unwrap_or_default();
                        l.push(b'\n');
                        l
                    }
                };
                if out.send(reply(id, 200, kind, line, false)).is_err() {
                    return;
                }
            }
            let _ = out.send(reply(id, 200, kind, Vec::new(), true));
        }
        Ok(ApiResponse::Stream { mut body, .. }) => {
            let kind = pb::api_reply::Kind::Stream;
            if out.send(reply(id, 200, kind, Vec::new(), false)).is_err() {
                return;
            }
            while let Some(piece) = body.next().await {
                let Ok(piece) = piece else { break };
                for p in piece.chunks(PIECE) {
                    if out.send(reply(id, 200, kind, p.to_vec(), false)).is_err() {
                        return;
                    }
                }
            }
            let _ = out.send(reply(id, 200, kind, Vec::new(), true));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use async_trait::async_trait;
    use serde_json::json;
    use tessera_client::request::ApiRequest;

    /// Answers lists with a body of `size` bytes, and records what it was asked.
    struct Fixed {
        size: usize,
        asked: Mutex<Vec<String>>,
    }

    #[async_trait]
    impl Client for Fixed {
        async fn call(&self, req: ApiRequest) -> Result<ApiResponse, ApiError> {
            self.asked.lock().push(tessera_client::client::url_of(&req));
            if req.namespace.as_deref() == Some("missing") {
                return Err(ApiError::not_found("", "pods", "x"));
            }
            let pad = "x".repeat(self.size);
            Ok(ApiResponse::ok(json!({"kind": "PodList", "pad": pad})))
        }
    }

    /// Opens pod streams as an echo: what the tunnel sends comes back upper-cased.
    struct Echo {
        asked: Mutex<Vec<PodStreamRequest>>,
    }

    #[async_trait]
    impl Client for Echo {
        async fn call(&self, _: ApiRequest) -> Result<ApiResponse, ApiError> {
            Err(ApiError::internal("no reads here"))
        }

        async fn pod_stream(
            &self,
            req: &PodStreamRequest,
        ) -> Result<tessera_client::client::Switched, ApiError> {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            self.asked.lock().push(req.clone());
            if req.name == "done" {
                return Err(ApiError::bad_request(
                    "cannot exec into a container in a completed pod; current phase is Succeeded",
                ));
            }
            let (ours, mut theirs) = tokio::io::duplex(1024);
            tokio::spawn(async move {
                let mut buf = [0u8; 64];
                loop {
                    match theirs.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            let up = buf[..n].to_ascii_uppercase();
                            if theirs.write_all(&up).await.is_err() {
                                break;
                            }
                        }
                    }
                }
                let _ = theirs.shutdown().await;
            });
            Ok(tessera_client::client::Switched {
                headers: vec![("upgrade".into(), "websocket".into())],
                io: Box::new(ours),
            })
        }
    }

    fn tunnel_call(id: u64, path: &str) -> pb::ApiCall {
        pb::ApiCall {
            id,
            path: path.into(),
            upgrade: vec![
                pb::Header {
                    name: "Upgrade".into(),
                    value: "websocket".into(),
                },
                pb::Header {
                    name: "Authorization".into(),
                    value: "Bearer not-carried".into(),
                },
            ],
        }
    }

    #[tokio::test]
    async fn a_tunnel_opens_the_pods_stream_and_carries_its_bytes() {
        let client = Arc::new(Echo {
            asked: Mutex::default(),
        });
        let (tx, mut rx) = mpsc::unbounded_channel();
        let calls = Calls::default();
        calls.start(
            client.clone(),
            tunnel_call(
                4,
                "/api/v1/namespaces/t1/pods/api-0/exec?command=sh&stdin=true",
            ),
            tx,
        );
        let next = |rx: &mut mpsc::UnboundedReceiver<pb::ShardMessage>| {
            let m = rx.try_recv().ok()?;
            match m.message {
                Some(pb::shard_message::Message::Reply(r)) => Some(r),
                _ => None,
            }
        };
        let mut got = Vec::new();
        let mut first = None;
        for _ in 0..200 {
            tokio::task::yield_now().await;
            if let Some(r) = next(&mut rx) {
                first = Some(r);
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        let first = first.expect("the switch");
        assert_eq!((first.id, first.code), (4, 101));
        assert_eq!(first.kind(), pb::api_reply::Kind::Tunnel);
        assert_eq!(first.headers[0].value, "websocket");
        {
            let asked = client.asked.lock();
            assert_eq!(asked[0].namespace, "t1");
            assert_eq!(asked[0].name, "api-0");
            assert_eq!(asked[0].subresource, "exec");
            assert_eq!(asked[0].query, "command=sh&stdin=true");
            // Only the upgrade's own headers are carried on (lower-cased).
            assert_eq!(
                asked[0].headers,
                [("upgrade".to_owned(), "websocket".to_owned())]
            );
        }
        calls.tunnel_data(pb::TunnelData {
            id: 4,
            data: b"hello".to_vec(),
            ..Default::default()
        });
        let mut ended = false;
        let mut acked = 0;
        let mut client_ended = false;
        for _ in 0..800 {
            while let Some(r) = next(&mut rx) {
                got.extend_from_slice(&r.data);
                acked += r.ack;
                ended |= r.end;
            }
            if ended {
                break;
            }
            if !client_ended && got.len() == 5 && acked > 0 {
                // Echoed and credited: now the client's side ends.
                assert_eq!(
                    acked,
                    tunnel::cost(5),
                    "the client's bytes were credited back"
                );
                calls.tunnel_data(pb::TunnelData {
                    id: 4,
                    end: true,
                    ..Default::default()
                });
                client_ended = true;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        assert_eq!(got, b"HELLO");
        assert!(
            client_ended && ended,
            "the pod's side ended after the client's did"
        );
    }

    #[tokio::test]
    async fn a_tunnel_to_anything_but_a_pods_stream_is_refused() {
        let client = Echo {
            asked: Mutex::default(),
        };
        let (tx, mut rx) = mpsc::unbounded_channel();
        for path in [
            "/api/v1/namespaces/t1/secrets/s/exec",
            "/api/v1/namespaces/t1/pods/p/log",
            "/api/v1/namespaces/t1/pods/p/exec/extra",
            "/api/v1/nodes/n/proxy",
            "/apis/apps/v1/namespaces/t1/pods/p/exec",
            "/api/v1/namespaces//pods/p/exec",
        ] {
            let (_, inbound) = mpsc::unbounded_channel();
            serve_tunnel(&client, tunnel_call(1, path), inbound, &tx).await;
            let got = replies(&mut rx);
            assert_eq!(got.len(), 1, "{path}");
            assert_eq!((got[0].code, got[0].end), (400, true), "{path}");
            let status: serde_json::Value = serde_json::from_slice(&got[0].data).expect("Status");
            assert!(
                status["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("not a pod's exec")),
                "{path}: {status}"
            );
        }
        assert!(client.asked.lock().is_empty(), "nothing reached the API");
        // The API's refusal comes back as its Status.
        let (_, inbound) = mpsc::unbounded_channel();
        serve_tunnel(
            &client,
            tunnel_call(2, "/api/v1/namespaces/t1/pods/done/exec"),
            inbound,
            &tx,
        )
        .await;
        let got = replies(&mut rx);
        assert_eq!(got[0].code, 400);
        assert_eq!(got[0].kind(), pb::api_reply::Kind::Object);
    }

    fn replies(rx: &mut mpsc::UnboundedReceiver<pb::ShardMessage>) -> Vec<pb::ApiReply> {
        let mut out = Vec::new();
        while let Ok(m) = rx.try_recv() {
            if let Some(pb::shard_message::Message::Reply(r)) = m.message {
                out.push(r);
            }
        }
        out
    }

    #[tokio::test]
    async fn a_big_list_comes_back_in_pieces_that_join_into_the_body() {
        let client = Fixed {
            size: 3 * PIECE,
            asked: Mutex::default(),
        };
        let (tx, mut rx) = mpsc::unbounded_channel();
        let call = pb::ApiCall {
            id: 7,
            path: "/api/v1/namespaces/t1/pods?labelSelector=app%3Dweb".into(),
            ..Default::default()
        };
        serve(&client, call, &tx).await;
        let got = replies(&mut rx);
        assert!(got.len() >= 4, "{} pieces", got.len());
        assert!(got.iter().all(|r| r.id == 7 && r.code == 200));
        assert_eq!(got.iter().filter(|r| r.end).count(), 1);
        assert!(got.last().is_some_and(|r| r.end));
        let body: Vec<u8> = got.into_iter().flat_map(|r| r.data).collect();
        let v: serde_json::Value =
            serde_json::from_slice(&body).expect("the pieces join into JSON");
        assert_eq!(v["pad"].as_str().map(str::len), Some(3 * PIECE));
        assert_eq!(
            client.asked.lock().as_slice(),
            ["/api/v1/namespaces/t1/pods?labelSelector=app%3Dweb"]
        );
    }

    #[tokio::test]
    async fn writes_and_other_paths_are_refused_without_reaching_the_api() {
        let client = Fixed {
            size: 1,
            asked: Mutex::default(),
        };
        let (tx, mut rx) = mpsc::unbounded_channel();
        for path in ["/version", "/healthz", "/apis"] {
            serve(
                &client,
                pb::ApiCall {
                    id: 1,
                    path: path.into(),
                    ..Default::default()
                },
                &tx,
            )
            .await;
            let got = replies(&mut rx);
            assert_eq!(got.len(), 1, "{path}");
            assert_eq!(got[0].code, 400, "{path}");
            let status: serde_json::Value = serde_json::from_slice(&got[0].data).expect("Status");
            assert_eq!(status["kind"], "Status");
        }
        assert!(client.asked.lock().is_empty());
        // An error of the API comes back as its Status with its code.
        serve(
            &client,
            pb::ApiCall {
                id: 2,
                path: "/api/v1/namespaces/missing/pods/x".into(),
                ..Default::default()
            },
            &tx,
        )
        .await;
        let got = replies(&mut rx);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].code, 404);
        assert!(got[0].end);
    }
}
