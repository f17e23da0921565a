//! Reads in a shard's API over the shard's own stream: the federation sends an `ApiCall`
//! (the path and query of a get, list, watch or pod log), the shard's agent makes it in its
//! API and streams the answer back in `ApiReply` pieces. The federation never connects to a
//! shard, so a shard behind NAT is read like any other, and the federation holds one
//! connection per shard for everything.
//!
//! The federation authorizes the user first (a tenant reads only its namespaces, exactly as
//! on a shard); the shard's agent makes the read with its own credentials.
//!
//! Flow control: each call buffers at most [`CALL_BUFFER`] replies. A watch whose client does
//! not keep up is cancelled (the client lists again, as after any interrupted watch) rather
//! than buffered without end.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::{Stream, StreamExt};
use tessera_client::client::{Client, PodStreamRequest, ShardSet, Switched, status_error, url_of};
use tessera_client::request::{ApiRequest, Verb};
use tessera_client::response::{ApiResponse, WatchEvent};
use tessera_client::status::ApiError;
use tessera_proto::federation::v1 as pb;
use tessera_runtime::tunnel::{self, Piece};
use tokio::sync::mpsc;

use crate::registry::Registry;

/// Replies buffered per call before it is cancelled.
pub const CALL_BUFFER: usize = 4096;
/// How long a get or list waits for its shard's first reply.
const FIRST_REPLY: Duration = Duration::from_secs(30);

/// One call in flight: who must answer it and where the replies go.
pub(crate) struct Open {
    shard: String,
    session: u64,
    tx: mpsc::Sender<pb::ApiReply>,
}

/// The calls in flight, over every shard.
#[derive(Default)]
pub(crate) struct Calls {
    next: u64,
    open: HashMap<u64, Open>,
}

impl Calls {
    /// Forgets the calls of `session` of `shard` (its stream ended): their readers see the
    /// answer end without its last piece.
    pub(crate) fn drop_session(&mut self, shard: &str, session: u64) {
        self.open
            .retain(|_, o| !(o.shard == shard && o.session == session));
    }
}

fn unavailable(shard: &str, what: &str) -> ApiError {
    let mut e = ApiError::new(
        503,
        "ServiceUnavailable",
        format!("shard {shard} {what}: try again once it is connected (kubectl get shards)"),
    );
    e.retry_after = Some(1);
    e
}

impl Registry {
    /// Sends `path` (a read) to shard `shard`'s agent; the replies come on the receiver.
    fn open_call(
        &self,
        shard: &str,
        path: String,
        upgrade: Vec<pb::Header>,
    ) -> Result<(u64, mpsc::Receiver<pb::ApiReply>), ApiError> {
        let (session, out) = self
            .session_sender(shard)
            .ok_or_else(|| unavailable(shard, "is not connected"))?;
        let tunnel = !upgrade.is_empty();
        let (tx, rx) = mpsc::channel(CALL_BUFFER);
        let id = {
            let mut calls = self.calls.lock();
            calls.next += 1;
            let id = calls.next;
            calls.open.insert(
                id,
                Open {
                    shard: shard.to_owned(),
                    session,
                    tx,
                },
            );
            id
        };
        let msg = pb::FederationMessage {
            message: Some(pb::federation_message::Message::Call(pb::ApiCall {
                id,
                path,
                upgrade,
            })),
        };
        if out.send(msg).is_err() {
            self.calls.lock().open.remove(&id);
            return Err(unavailable(shard, "disconnected"));
        }
        if let Some(m) = self.metrics()
            && !tunnel
        {
            m.shard_reads.inc();
        }
        Ok((id, rx))
    }

    /// Sends a piece of tunnel `id`'s client side to shard `shard`; false once the shard's
    /// stream is gone.
    fn send_tunnel(&self, shard: &str, id: u64, piece: Piece) -> bool {
        let Some((_, out)) = self.session_sender(shard) else {
            return false;
        };
        let mut data = pb::TunnelData {
            id,
            ..Default::default()
        };
        match piece {
            Piece::Data(d) => data.data = d,
            Piece::Ack(n) => data.ack = n,
            Piece::End => data.end = true,
        }
        out.send(pb::FederationMessage {
            message: Some(pb::federation_message::Message::Tunnel(data)),
        })
        .is_ok()
    }

    /// Tells shard `shard` to stop call `id` and forgets it.
    fn cancel_call(&self, shard: &str, id: u64) {
        let was_open = self.calls.lock().open.remove(&id).is_some();
        if was_open && let Some((_, out)) = self.session_sender(shard) {
            let _ = out.send(pb::FederationMessage {
                message: Some(pb::federation_message::Message::Cancel(pb::CancelCall {
                    id,
                })),
            });
        }
    }

    /// Takes a reply from `session` of `name`, or says why it is refused (the caller ends
    /// the session). A reply to a call already cancelled is dropped.
    pub fn reply(&self, name: &str, session: u64, r: pb::ApiReply) -> Result<(), String> {
        let mut calls = self.calls.lock();
        let Some(open) = calls.open.get(&r.id) else {
            return Ok(());
        };
        if open.shard != name || open.session != session {
            return Err(format!(
                "a reply to call {} that was not sent to this shard",
                r.id
            ));
        }
        let id = r.id;
        // A tunnel's `end` ends only the shard's side: the call lasts until the federation's
        // side is done too (its guard forgets it).
        let end = r.end && r.kind() != pb::api_reply::Kind::Tunnel;
        match open.tx.try_send(r) {
            Ok(()) if end => {
                calls.open.remove(&id);
            }
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(_)) => {
                tracing::info!(shard = %name, call = id, "a read's reader does not keep up; cancelling it");
                calls.open.remove(&id);
                drop(calls);
                if let Some((_, out)) = self.session_sender(name) {
                    let _ = out.send(pb::FederationMessage {
                        message: Some(pb::federation_message::Message::Cancel(pb::CancelCall {
                            id,
                        })),
                    });
                }
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {
                // The reader left; its guard cancels the call.
                calls.open.remove(&id);
            }
        }
        Ok(())
    }

    /// Calls in flight (for tests and metrics).
    pub fn calls_in_flight(&self) -> usize {
        self.calls.lock().open.len()
    }
}

/// A client for reads in one shard's API, over its agent's stream.
pub struct ShardClient {
    registry: Arc<Registry>,
    shard: String,
}

impl ShardClient {
    /// Reads in `shard` through `registry`.
    pub fn new(registry: Arc<Registry>, shard: &str) -> ShardClient {
        ShardClient {
            registry,
            shard: shard.to_owned(),
        }
    }
}

/// Cancels its call when dropped (the reader left before the end).
struct CallGuard {
    registry: Arc<Registry>,
    shard: String,
    id: u64,
}

impl Drop for CallGuard {
    fn drop(&mut self) {
        self.registry.cancel_call(&self.shard, self.id);
    }
}

/// The pieces of one answer after the first, as a stream; ends at the last piece or when
/// the shard's stream ends; cancels the call if dropped first.
struct Pieces {
    rx: mpsc::Receiver<pb::ApiReply>,
    done: bool,
    _guard: CallGuard,
}

impl Stream for Pieces {
    type Item = Result<Bytes, std::io::Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.done {
            return Poll::Ready(None);
        }
        match self.rx.poll_recv(cx) {
            Poll::Ready(Some(r)) => {
                if r.end {
                    self.done = true;
                }
                Poll::Ready(Some(Ok(Bytes::from(r.data))))
            }
            Poll::Ready(None) => {
                self.done = true;
                Poll::Ready(Some(Err(std::io::Error::new(
                    std::io::ErrorKind::ConnectionAborted,
                    "the shard's stream ended before the answer did",
                ))))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

#[async_trait]
impl Client for ShardClient {
    async fn pod_stream(&self, req: &PodStreamRequest) -> Result<Switched, ApiError> {
        self.tunnel(req).await
    }

    async fn call(&self, req: ApiRequest) -> Result<ApiResponse, ApiError> {
        if !matches!(req.verb, Verb::Get | Verb::List | Verb::Watch) {
            return Err(ApiError::new(
                405,
                "MethodNotAllowed",
                format!(
                    "only reads go to shard {} through the federation; make a {} in the shard's own API (kubectl --context {})",
                    self.shard,
                    req.verb.as_str(),
                    self.shard
                ),
            ));
        }
        let (id, mut rx) = self
            .registry
            .open_call(&self.shard, url_of(&req), Vec::new())?;
        let guard = CallGuard {
            registry: self.registry.clone(),
            shard: self.shard.clone(),
            id,
        };
        let first = self.first_reply(&mut rx, "answer").await?;
        let code = u16::try_from(first.code).unwrap_or(500);
        let kind = first.kind();
        let end = first.end;
        let head = Bytes::from(first.data);
        let rest = Pieces {
            rx,
            done: end,
            _guard: guard,
        };
        match kind {
            pb::api_reply::Kind::Object => {
                let mut body = head.to_vec();
                let mut rest = rest;
                while let Some(piece) = rest.next().await {
                    let piece = piece.map_err(|e| unavailable(&self.shard, &e.to_string()))?;
                    body.extend_from_slice(&piece);
                }
                if code >= 400 {
                    return Err(status_error(code, &body));
                }
                Ok(ApiResponse::Encoded {
                    code,
                    body: Bytes::from(body),
                })
            }
            pb::api_reply::Kind::Watch => {
                // One event line per piece; the first piece carries none.
                let lines = rest.filter_map(|p| async move {
                    match p {
                        Ok(b) if !b.is_empty() => Some(WatchEvent::Encoded(b)),
                        _ => None,
                    }
                });
                Ok(ApiResponse::Watch(Box::pin(lines)))
            }
            pb::api_reply::Kind::Tunnel => Err(ApiError::internal(format!(
                "shard {} answered a read with a tunnel",
                self.shard
            ))),
            pb::api_reply::Kind::Stream => {
                let head = futures::stream::iter((!head.is_empty()).then_some(Ok(head)));
                Ok(ApiResponse::Stream {
                    content_type: "text/plain",
                    body: Box::pin(head.chain(rest)),
                })
            }
        }
    }
}

impl ShardClient {
    /// The first reply to a call, within [`FIRST_REPLY`] (`what`: what the shard did not do
    /// in time).
    async fn first_reply(
        &self,
        rx: &mut mpsc::Receiver<pb::ApiReply>,
        what: &str,
    ) -> Result<pb::ApiReply, ApiError> {
        match tokio::time::timeout(FIRST_REPLY, rx.recv()).await {
            Ok(Some(r)) => Ok(r),
            Ok(None) => Err(unavailable(&self.shard, "disconnected during the call")),
            Err(_) => Err(ApiError::new(
                504,
                "Timeout",
                format!(
                    "shard {} did not {what} within {} s",
                    self.shard,
                    FIRST_REPLY.as_secs()
                ),
            )),
        }
    }

    /// Opens a pod stream in the shard (its agent makes the request in the shard's API) and
    /// tunnels it over the shard's stream: the first reply says whether it switched; then
    /// [`tunnel::pump`] carries the bytes between the returned connection and the stream.
    async fn tunnel(&self, req: &PodStreamRequest) -> Result<Switched, ApiError> {
        let upgrade = req
            .headers
            .iter()
            .map(|(name, value)| pb::Header {
                name: name.clone(),
                value: value.clone(),
            })
            .collect();
        let (id, mut rx) = self.registry.open_call(&self.shard, req.path(), upgrade)?;
        let guard = CallGuard {
            registry: self.registry.clone(),
            shard: self.shard.clone(),
            id,
        };
        let first = self.first_reply(&mut rx, "open the pod's stream").await?;
        if first.kind() != pb::api_reply::Kind::Tunnel || first.code != 101 {
            // The shard's refusal, a Status in pieces.
            let code = u16::try_from(first.code).unwrap_or(500);
            let mut body = first.data;
            let mut rest = Pieces {
                rx,
                done: first.end,
                _guard: guard,
            };
            while let Some(piece) = rest.next().await {
                let piece = piece.map_err(|e| unavailable(&self.shard, &e.to_string()))?;
                body.extend_from_slice(&piece);
            }
            return Err(status_error(code.max(400), &body));
        }
        let headers = first
            .headers
            .into_iter()
            .map(|h| (h.name, h.value))
            .collect();
        let (ours, theirs) = tokio::io::duplex(tunnel::PIECE * 2);
        let registry = self.registry.clone();
        let shard = self.shard.clone();
        if let Some(m) = registry.metrics() {
            m.shard_tunnels.inc();
        }
        tokio::spawn(async move {
            let _guard = guard;
            let inbound = futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
                .flat_map(|r| futures::stream::iter(pieces_of(r)));
            let ended =
                tunnel::pump(theirs, inbound, |p| registry.send_tunnel(&shard, id, p)).await;
            tracing::debug!(%shard, call = id, ?ended, "a pod stream through the federation ended");
        });
        Ok(Switched {
            headers,
            io: Box::new(ours),
        })
    }
}

/// The tunnel pieces one reply of the shard carries.
fn pieces_of(r: pb::ApiReply) -> Vec<Piece> {
    let mut out = Vec::with_capacity(1);
    if !r.data.is_empty() {
        out.push(Piece::Data(r.data));
    }
    if r.ack > 0 {
        out.push(Piece::Ack(r.ack));
    }
    if r.end {
        out.push(Piece::End);
    }
    out
}

/// The registry's connected shards as clients of their APIs.
pub struct RegistryShards(pub Arc<Registry>);

impl ShardSet for RegistryShards {
    fn shards(&self) -> Vec<(String, Arc<dyn Client>)> {
        self.0
            .connected_shards()
            .into_iter()
            .map(|name| {
                let c: Arc<dyn Client> = Arc::new(ShardClient::new(self.0.clone(), &name));
                (name, c)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::RegistryConfig;
    use pb::api_reply::Kind;
    use pb::federation_message::Message;
    use tessera_client::request::find_resource;

    /// A registry with shard `east` connected, and what it sends to `east`.
    struct Shard {
        r: Arc<Registry>,
        session: u64,
        rx: mpsc::UnboundedReceiver<pb::FederationMessage>,
    }

    impl Shard {
        fn connect() -> Shard {
            let r = Registry::new(RegistryConfig::new("t"), None);
            let (session, rx) = r
                .register(&pb::Register {
                    name: "east".into(),
                    token: "t".into(),
                    ..Default::default()
                })
                .expect("registered");
            Shard { r, session, rx }
        }

        fn client(&self) -> ShardClient {
            ShardClient::new(self.r.clone(), "east")
        }

        /// The next call or cancel sent to the shard (registration traffic skipped).
        async fn next_sent(&mut self) -> Message {
            loop {
                let m = self
                    .rx
                    .recv()
                    .await
                    .expect("open")
                    .message
                    .expect("a message");
                if matches!(
                    m,
                    Message::Call(_) | Message::Cancel(_) | Message::Tunnel(_)
                ) {
                    return m;
                }
            }
        }

        async fn next_call(&mut self) -> pb::ApiCall {
            match self.next_sent().await {
                Message::Call(c) => c,
                m => panic!("a call, not {m:?}"),
            }
        }

        async fn next_cancel(&mut self) -> u64 {
            match self.next_sent().await {
                Message::Cancel(c) => c.id,
                m => panic!("a cancel, not {m:?}"),
            }
        }

        fn answer(&self, id: u64, code: u32, kind: Kind, data: &str, end: bool) {
            let piece = pb::ApiReply {
                id,
                code,
                kind: kind as i32,
                data: data.as_bytes().to_vec(),
                end,
                ..Default::default()
            };
            self.r.reply("east", self.session, piece).expect("taken");
        }
    }

    fn pods_list() -> ApiRequest {
        let mut req = ApiRequest::new(Verb::List, find_resource("", "v1", "pods").expect("served"));
        req.namespace = Some("t1".into());
        req
    }

    #[tokio::test]
    async fn a_list_is_asked_over_the_stream_and_its_pieces_joined() {
        let mut s = Shard::connect();
        let client = s.client();
        let answer = tokio::spawn(async move { client.list(pods_list()).await });
        let call = s.next_call().await;
        assert_eq!(call.path, "/api/v1/namespaces/t1/pods");
        // Another shard may not answer it.
        let (west, _rx) =
            s.r.register(&pb::Register {
                name: "west".into(),
                token: "t".into(),
                ..Default::default()
            })
            .expect("west");
        let forged = pb::ApiReply {
            id: call.id,
            code: 200,
            end: true,
            ..Default::default()
        };
        assert!(s.r.reply("west", west, forged).is_err());
        s.answer(call.id, 200, Kind::Object, r#"{"kind":"PodList","#, false);
        s.answer(call.id, 200, Kind::Object, r#""items":[]}"#, true);
        let list = answer.await.expect("joined").expect("a list");
        assert_eq!(list["kind"], "PodList");
        assert_eq!(s.r.calls_in_flight(), 0, "a finished call is forgotten");
    }

    fn exec() -> PodStreamRequest {
        PodStreamRequest {
            namespace: "t1".into(),
            name: "api-0".into(),
            subresource: "exec".into(),
            query: "command=ls&stdout=true".into(),
            headers: vec![
                ("upgrade".into(), "websocket".into()),
                ("sec-websocket-protocol".into(), "v5.channel.k8s.io".into()),
            ],
        }
    }

    #[tokio::test]
    async fn a_pod_stream_is_tunnelled_both_ways_with_credit_and_ends_with_a_cancel() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = Shard::connect();
        let client = s.client();
        let opening = tokio::spawn(async move { client.pod_stream(&exec()).await });
        let call = s.next_call().await;
        assert_eq!(
            call.path,
            "/api/v1/namespaces/t1/pods/api-0/exec?command=ls&stdout=true"
        );
        assert_eq!(call.upgrade.len(), 2);
        assert_eq!(call.upgrade[1].value, "v5.channel.k8s.io");
        let switched = pb::ApiReply {
            id: call.id,
            code: 101,
            kind: Kind::Tunnel as i32,
            headers: vec![pb::Header {
                name: "sec-websocket-protocol".into(),
                value: "v5.channel.k8s.io".into(),
            }],
            ..Default::default()
        };
        s.r.reply("east", s.session, switched).expect("taken");
        let mut io = opening.await.expect("joined").expect("switched").io;
        // The client's bytes go to the shard as TunnelData.
        io.write_all(b"stdin bytes").await.expect("write");
        match s.next_sent().await {
            Message::Tunnel(t) => {
                assert_eq!(t.id, call.id);
                assert_eq!(t.data, b"stdin bytes");
            }
            m => panic!("tunnel data, not {m:?}"),
        }
        // The shard's bytes come out, and their credit goes back.
        let out = pb::ApiReply {
            id: call.id,
            code: 101,
            kind: Kind::Tunnel as i32,
            data: b"output".to_vec(),
            ..Default::default()
        };
        s.r.reply("east", s.session, out).expect("taken");
        let mut buf = [0u8; 6];
        io.read_exact(&mut buf).await.expect("read");
        assert_eq!(&buf, b"output");
        match s.next_sent().await {
            Message::Tunnel(t) => assert_eq!(t.ack, tunnel::cost(6)),
            m => panic!("credit, not {m:?}"),
        }
        // The shard's side ends: the client reads the end; the call stays open for the
        // client's side.
        let end = pb::ApiReply {
            id: call.id,
            code: 101,
            kind: Kind::Tunnel as i32,
            end: true,
            ..Default::default()
        };
        s.r.reply("east", s.session, end).expect("taken");
        let mut rest = Vec::new();
        io.read_to_end(&mut rest).await.expect("eof");
        assert!(rest.is_empty());
        assert_eq!(s.r.calls_in_flight(), 1);
        // The client's side ends: the shard hears it, then the call is cancelled there.
        io.shutdown().await.expect("shutdown");
        match s.next_sent().await {
            Message::Tunnel(t) => assert!(t.end),
            m => panic!("the client's end, not {m:?}"),
        }
        assert_eq!(s.next_cancel().await, call.id);
        assert_eq!(s.r.calls_in_flight(), 0);
    }

    #[tokio::test]
    async fn a_pod_stream_the_shard_refuses_comes_back_as_its_status() {
        let mut s = Shard::connect();
        let client = s.client();
        let opening = tokio::spawn(async move { client.pod_stream(&exec()).await });
        let call = s.next_call().await;
        s.answer(
            call.id,
            400,
            Kind::Object,
            r#"{"kind":"Status","status":"Failure","reason":"BadRequest","message":"cannot exec into a container in a completed pod; current phase is Succeeded","code":400}"#,
            true,
        );
        let Err(e) = opening.await.expect("joined") else {
            panic!("a refusal");
        };
        assert_eq!(e.code, 400);
        assert!(e.message.contains("completed pod"), "{}", e.message);
        assert_eq!(s.r.calls_in_flight(), 0);
    }

    #[tokio::test]
    async fn an_error_comes_back_as_the_shards_status() {
        let mut s = Shard::connect();
        let client = s.client();
        let answer = tokio::spawn(async move { client.list(pods_list()).await });
        let call = s.next_call().await;
        let status = ApiError::forbidden("no").to_status().to_string();
        s.answer(call.id, 403, Kind::Object, &status, true);
        let e = answer.await.expect("joined").expect_err("refused");
        assert_eq!(e.code, 403);
    }

    #[tokio::test]
    async fn a_watch_left_by_its_reader_is_cancelled_in_the_shard() {
        let mut s = Shard::connect();
        let client = s.client();
        let watching = tokio::spawn(async move { client.watch(pods_list()).await });
        let call = s.next_call().await;
        s.answer(call.id, 200, Kind::Watch, "", false);
        s.answer(
            call.id,
            200,
            Kind::Watch,
            "{\"type\":\"ADDED\",\"object\":{}}\n",
            false,
        );
        let mut events = watching.await.expect("joined").expect("a watch");
        let first = events.next().await.expect("an event").into_value();
        assert_eq!(first["type"], "ADDED");
        drop(events);
        assert_eq!(s.next_cancel().await, call.id);
        assert_eq!(s.r.calls_in_flight(), 0);
        // What the shard still sends for it is dropped.
        s.answer(call.id, 200, Kind::Watch, "late", false);
    }

    #[tokio::test]
    async fn a_shard_that_leaves_mid_read_fails_the_read_and_one_not_connected_is_unavailable() {
        let mut s = Shard::connect();
        let client = s.client();
        let answer = tokio::spawn(async move { client.list(pods_list()).await });
        let call = s.next_call().await;
        s.answer(call.id, 200, Kind::Object, "{", false);
        s.r.disconnect("east", s.session);
        let e = answer.await.expect("joined").expect_err("cut off");
        assert_eq!(e.code, 503, "{}", e.message);
        let e = s
            .client()
            .list(pods_list())
            .await
            .expect_err("not connected");
        assert_eq!(e.code, 503);
        assert!(e.message.contains("not connected"), "{}", e.message);
        assert!(RegistryShards(s.r.clone()).shards().is_empty());
    }

    #[tokio::test]
    async fn a_reader_that_does_not_keep_up_is_cancelled_not_buffered() {
        let mut s = Shard::connect();
        let client = s.client();
        let watching = tokio::spawn(async move { client.watch(pods_list()).await });
        let call = s.next_call().await;
        s.answer(call.id, 200, Kind::Watch, "", false);
        let _events = watching.await.expect("joined").expect("a watch");
        for _ in 0..=CALL_BUFFER {
            s.answer(call.id, 200, Kind::Watch, "{}\n", false);
        }
        assert_eq!(s.next_cancel().await, call.id);
        assert_eq!(s.r.calls_in_flight(), 0);
    }
}
