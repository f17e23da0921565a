//! `portforward`: TCP connections to a pod's ports, carried by SPDY/3.1 streams as the
//! kubelet carries them (`portforward.k8s.io`).
//!
//! For each connection it forwards, the client opens two streams with the same `requestID`
//! and `port` headers: an `error` stream (it half-closes it at once and reads it to its end:
//! anything there is the reason the forward failed) and a `data` stream (the connection's
//! bytes, both ways). When both have arrived the node connects to `localhost:port` inside
//! the pod's network namespace and copies both ways until the pod's side of the connection
//! ends; then it ends the error stream (kubectl closes its local connection only after that). Pings are answered. kubectl 1.31+ sends the same SPDY bytes inside the
//! binary messages of a WebSocket (`SPDY/3.1+portforward.k8s.io`, see [`tunnel`]); older
//! clients upgrade to SPDY directly.

use std::collections::HashMap;

use axum::extract::ws::{CloseFrame, Message, WebSocket};
use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::Targets;
use super::spdy::{self, Frame, header};

/// The SPDY subprotocol (`X-Stream-Protocol-Version`).
pub const PROTOCOL: &str = "portforward.k8s.io";
/// The WebSocket subprotocol that tunnels it.
pub const TUNNEL_PROTOCOL: &str = "SPDY/3.1+portforward.k8s.io";
/// The WebSocket channel protocol of port-forward (the Python client's): the ports are in
/// the query, one connection each; port `i` has data channel `2i` and error channel
/// `2i + 1`, each opened by the node with the port number (2 bytes, little-endian).
pub const CHANNEL_PROTOCOL: &str = "v4.channel.k8s.io";

/// The largest piece of a connection's bytes sent in one DATA frame.
const CHUNK: usize = 32 * 1024;

/// Which pod the connection forwards to.
#[derive(Clone, Debug)]
pub struct PodRef {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its UID.
    pub uid: String,
}

/// One forwarded connection's streams, as they arrive.
#[derive(Default)]
struct Pair {
    error: Option<u32>,
    data: Option<u32>,
    port: u16,
    /// Bytes from the client for the connection (`None` after its FIN).
    to_conn: Option<mpsc::Sender<Bytes>>,
    task: Option<JoinHandle<()>>,
}

/// Serves one SPDY connection (raw, or the inside of a [`tunnel`]) until it ends.
pub async fn serve<IO>(io: IO, targets: Targets, pod: PodRef)
where
    IO: AsyncRead + AsyncWrite + Send + 'static,
{
    let (mut reader, mut writer) = tokio::io::split(io);
    let (out, mut out_rx) = mpsc::channel::<Bytes>(64);
    let write_task = tokio::spawn(async move {
        while let Some(frame) = out_rx.recv().await {
            if writer.write_all(&frame).await.is_err() || writer.flush().await.is_err() {
                break;
            }
        }
        let _ = writer.shutdown().await;
    });
    let mut inflater = spdy::Inflater::default();
    let mut deflater = spdy::Deflater::default();
    // By request id; and which request each stream id belongs to.
    let mut pairs: HashMap<String, Pair> = HashMap::new();
    let mut streams: HashMap<u32, String> = HashMap::new();
    let mut last_seen = 0u32;
    loop {
        let frame = match spdy::read_frame(&mut reader, &mut inflater).await {
            Ok(Some(f)) => f,
            Ok(None) => break,
            Err(e) => {
                tracing::debug!(error = %e, "port-forward connection ended");
                let _ = out.send(spdy::goaway(last_seen)).await;
                break;
            }
        };
        match frame {
            Frame::SynStream { id, headers, .. } => {
                last_seen = last_seen.max(id);
                let kind = header(&headers, "streamtype")
                    .unwrap_or_default()
                    .to_owned();
                let port = header(&headers, "port").and_then(|p| p.parse::<u16>().ok());
                let (Some(port), "error" | "data") = (port.filter(|p| *p > 0), kind.as_str())
                else {
                    tracing::debug!(
                        id,
                        ?headers,
                        "refusing a stream: it needs streamType error or data and a port"
                    );
                    let _ = out.send(spdy::rst_stream(id, spdy::PROTOCOL_ERROR)).await;
                    continue;
                };
                // Without a request id (an old client), a data stream follows its error
                // stream: both are named after the error stream.
                let request = match header(&headers, "requestid") {
                    Some(r) => r.to_owned(),
                    None if kind == "data" => id.saturating_sub(2).to_string(),
                    None => id.to_string(),
                };
                let _ = out.send(spdy::syn_reply(&mut deflater, id, &[])).await;
                streams.insert(id, request.clone());
                let pair = pairs.entry(request).or_default();
                pair.port = port;
                if kind == "error" {
                    pair.error = Some(id);
                } else {
                    pair.data = Some(id);
                }
                if let (Some(error), Some(data), None) = (pair.error, pair.data, &pair.task) {
                    let (tx, rx) = mpsc::channel(16);
                    pair.to_conn = Some(tx);
                    pair.task = Some(tokio::spawn(forward(
                        targets.clone(),
                        pod.clone(),
                        port,
                        error,
                        data,
                        rx,
                        out.clone(),
                    )));
                }
            }
            Frame::Data { id, fin, data } => {
                let Some(pair) = streams.get(&id).and_then(|r| pairs.get_mut(r)) else {
                    continue;
                };
                if pair.data != Some(id) {
                    continue;
                }
                if !data.is_empty()
                    && let Some(tx) = &pair.to_conn
                    && tx.send(data).await.is_err()
                {
                    pair.to_conn = None;
                }
                if fin {
                    pair.to_conn = None;
                }
            }
            Frame::Headers { id, fin: true } => {
                if let Some(pair) = streams.get(&id).and_then(|r| pairs.get_mut(r))
                    && pair.data == Some(id)
                {
                    pair.to_conn = None;
                }
            }
            Frame::RstStream { id } => {
                if let Some(request) = streams.remove(&id)
                    && let Some(pair) = pairs.get_mut(&request)
                {
                    if pair.data == Some(id) {
                        if let Some(t) = pair.task.take() {
                            t.abort();
                        }
                        pair.to_conn = None;
                    }
                    if pair.error.is_none_or(|e| !streams.contains_key(&e))
                        && pair.data.is_none_or(|d| !streams.contains_key(&d))
                    {
                        pairs.remove(&request);
                    }
                }
            }
            Frame::Ping(n) => {
                let _ = out.send(spdy::ping(n)).await;
            }
            Frame::GoAway => break,
            Frame::Headers { .. } | Frame::Ignored => {}
        }
        // Forget pairs whose forwarding has ended.
        pairs.retain(|_, p| p.task.as_ref().is_none_or(|t| !t.is_finished()));
        streams.retain(|_, r| pairs.contains_key(r));
    }
    for (_, p) in pairs {
        if let Some(t) = p.task {
            t.abort();
        }
    }
    drop(out);
    let _ = write_task.await;
}

/// Forwards one connection: connects, copies both ways until the pod's side ends, reports a
/// failure on the error stream and ends it.
async fn forward(
    targets: Targets,
    pod: PodRef,
    port: u16,
    error: u32,
    data: u32,
    mut from_client: mpsc::Receiver<Bytes>,
    out: mpsc::Sender<Bytes>,
) {
    let fail = |why: String| {
        let out = out.clone();
        let message = format!(
            "error forwarding port {port} to pod {}, uid {}: {why}",
            pod.name, pod.uid
        );
        async move {
            let _ = out.send(spdy::data(error, true, message.as_bytes())).await;
            let _ = out.send(spdy::data(data, true, &[])).await;
        }
    };
    let Some(target) = targets.for_port(&pod.uid, port) else {
        targets.metrics().forward(false);
        fail(format!(
            "pod {}/{} has no running container on this node",
            pod.namespace, pod.name
        ))
        .await;
        return;
    };
    let conn = match super::connect(&target.at, port).await {
        Ok(c) => c,
        Err(why) => {
            targets.metrics().forward(false);
            fail(why).await;
            return;
        }
    };
    targets.metrics().forward(true);
    let (mut conn_r, mut conn_w) = conn.into_split();
    let to_client = {
        let out = out.clone();
        async move {
            let mut buf = vec![0u8; CHUNK];
            loop {
                match conn_r.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if out.send(spdy::data(data, false, &buf[..n])).await.is_err() {
                            return;
                        }
                    }
                }
            }
            let _ = out.send(spdy::data(data, true, &[])).await;
        }
    };
    let to_conn = tokio::spawn(async move {
        while let Some(b) = from_client.recv().await {
            if conn_w.write_all(&b).await.is_err() {
                return;
            }
        }
        // The client half-closed: so does the connection; its answer still comes back.
        let _ = conn_w.shutdown().await;
    });
    // The forward ends when the pod's side does, as the kubelet's runtimes end it: the
    // client closes its local connection only once the error stream has ended.
    to_client.await;
    to_conn.abort();
    let _ = out.send(spdy::data(error, true, &[])).await;
}

/// Serves the channel protocol ([`CHANNEL_PROTOCOL`]) for `ports` until every connection
/// has ended on the pod's side or the client has gone.
pub async fn serve_channels(socket: WebSocket, targets: Targets, pod: PodRef, ports: Vec<u16>) {
    let (mut sink, mut incoming) = socket.split();
    let (out, mut out_rx) = mpsc::channel::<Message>(32);
    let writer = tokio::spawn(async move {
        while let Some(m) = out_rx.recv().await {
            if sink.send(m).await.is_err() {
                return;
            }
        }
        let close = Message::Close(Some(CloseFrame {
            code: 1000,
            reason: "".into(),
        }));
        let _ = sink.send(close).await;
    });
    let message = |channel: usize, data: &[u8]| {
        let mut b = Vec::with_capacity(1 + data.len());
        b.push(channel as u8);
        b.extend_from_slice(data);
        Message::Binary(Bytes::from(b))
    };
    let mut to_conns = Vec::with_capacity(ports.len());
    let mut pumps = Vec::with_capacity(ports.len());
    for (i, &port) in ports.iter().enumerate() {
        for channel in [2 * i, 2 * i + 1] {
            let _ = out.send(message(channel, &port.to_le_bytes())).await;
        }
        let (tx, mut rx) = mpsc::channel::<Bytes>(16);
        to_conns.push(tx);
        let (targets, pod, out) = (targets.clone(), pod.clone(), out.clone());
        pumps.push(tokio::spawn(async move {
            let target = targets.for_port(&pod.uid, port);
            let conn = match target {
                Some(t) => super::connect(&t.at, port).await,
                None => Err(format!(
                    "pod {}/{} has no running container on this node",
                    pod.namespace, pod.name
                )),
            };
            let conn = match conn {
                Ok(c) => c,
                Err(why) => {
                    targets.metrics().forward(false);
                    let said = format!(
                        "error forwarding port {port} to pod {}, uid {}: {why}",
                        pod.name, pod.uid
                    );
                    let _ = out.send(message(2 * i + 1, said.as_bytes())).await;
                    return;
                }
            };
            targets.metrics().forward(true);
            let (mut r, mut w) = conn.into_split();
            let to_conn = tokio::spawn(async move {
                while let Some(b) = rx.recv().await {
                    if w.write_all(&b).await.is_err() {
                        return;
                    }
                }
                let _ = w.shutdown().await;
            });
            let mut buf = vec![0u8; CHUNK];
            loop {
                match r.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if out.send(message(2 * i, &buf[..n])).await.is_err() {
                            break;
                        }
                    }
                }
            }
            to_conn.abort();
        }));
    }
    drop(out);
    let all_done = futures::future::join_all(pumps);
    tokio::pin!(all_done);
    loop {
        tokio::select! {
            _ = &mut all_done => break,
            m = incoming.next() => match m {
                Some(Ok(Message::Binary(b))) => {
                    let Some((&channel, data)) = b.split_first() else { continue };
                    let channel = usize::from(channel);
                    if channel % 2 == 0
                        && let Some(tx) = to_conns.get(channel / 2)
                        && !data.is_empty()
                    {
                        let _ = tx.send(b.slice(1..)).await;
                    }
                }
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break,
                Some(Ok(_)) => {}
            },
        }
    }
    drop(to_conns);
    let _ = writer.await;
}

/// The byte stream inside a WebSocket's binary messages (`SPDY/3.1+portforward.k8s.io`):
/// each write becomes one message, messages are read as one stream.
pub fn tunnel(socket: WebSocket) -> tokio::io::DuplexStream {
    let (ours, theirs) = tokio::io::duplex(256 * 1024);
    tokio::spawn(async move {
        let (mut sink, mut incoming) = socket.split();
        let (mut r, mut w) = tokio::io::split(theirs);
        let up = async {
            while let Some(Ok(m)) = incoming.next().await {
                match m {
                    Message::Binary(b) if w.write_all(&b).await.is_err() => break,
                    Message::Close(_) => break,
                    _ => {}
                }
            }
            let _ = w.shutdown().await;
        };
        let down = async {
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                match r.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        let m = Message::Binary(Bytes::copy_from_slice(&buf[..n]));
                        if sink.send(m).await.is_err() {
                            return;
                        }
                    }
                }
            }
            let _ = sink
                .send(Message::Close(Some(CloseFrame {
                    code: 1000,
                    reason: "".into(),
                })))
                .await;
        };
        tokio::select! {
            () = up => {}
            () = down => {}
        }
    });
    ours
}
