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
use tessera_client::client::Client;
use tessera_client::request::{Verb, from_http};
use tessera_client::response::{ApiResponse, WatchEvent};
use tessera_client::status::ApiError;
use tessera_proto::federation::v1 as pb;
use tokio::sync::mpsc;

/// The largest piece of a body in one reply (well under gRPC's message limits).
pub const PIECE: usize = 1 << 20;

type Outbox = mpsc::UnboundedSender<pb::ShardMessage>;

/// The calls one session is serving.
#[derive(Default)]
pub struct Calls {
    running: Arc<Mutex<HashMap<u64, tokio::task::AbortHandle>>>,
}

impl Calls {
    /// Starts serving `call`; its replies go to `out`.
    pub fn start(&self, client: Arc<dyn Client>, call: pb::ApiCall, out: Outbox) {
        let id = call.id;
        let running = self.running.clone();
        let task = tokio::spawn(async move {
            serve(client.as_ref(), call, &out).await;
            running.lock().remove(&id);
        });
        let mut running = self.running.lock();
        if !task.is_finished() {
            running.insert(id, task.abort_handle());
        }
    }

    /// Stops call `id`, if it still runs.
    pub fn cancel(&self, id: u64) {
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
