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
use tessera_client::client::{Client, ShardSet, status_error, url_of};
use tessera_client::request::{ApiRequest, Verb};
use tessera_client::response::{ApiResponse, WatchEvent};
use tessera_client::status::ApiError;
use tessera_proto::federation::v1 as pb;
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
    ) -> Result<(u64, mpsc::Receiver<pb::ApiReply>), ApiError> {
        let (session, out) = self
            .session_sender(shard)
            .ok_or_else(|| unavailable(shard, "is not connected"))?;
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
            })),
        };
        if out.send(msg).is_err() {
            self.calls.lock().open.remove(&id);
            return Err(unavailable(shard, "disconnected"));
        }
        if let Some(m) = self.metrics() {
            m.shard_reads.inc();
        }
        Ok((id, rx))
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
        let end = r.end;
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
        let (id, mut rx) = self.registry.open_call(&self.shard, url_of(&req))?;
        let guard = CallGuard {
            registry: self.registry.clone(),
            shard: self.shard.clone(),
            id,
        };
        let first = match tokio::time::timeout(FIRST_REPLY, rx.recv()).await {
            Ok(Some(r)) => r,
            Ok(None) => return Err(unavailable(&self.shard, "disconnected during the read")),
            Err(_) => {
                return Err(ApiError::new(
                    504,
                    "Timeout",
                    format!(
                        "shard {} did not answer within {} s",
                        self.shard,
                        FIRST_REPLY.as_secs()
                    ),
                ));
            }
        };
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
                if matches!(m, Message::Call(_) | Message::Cancel(_)) {
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
