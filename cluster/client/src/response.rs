//! What a request answers: an object, an encoded body, a watch, or a stream.

use std::pin::Pin;

use bytes::Bytes;
use futures::Stream;
use serde_json::Value;

/// One watch event.
#[derive(Clone, Debug)]
pub enum WatchEvent {
    /// An event encoded once as its JSON line (`{"type":...,"object":...}` and a newline),
    /// shared as it is by every consumer.
    Encoded(Bytes),
    /// An event as a value (`{"type": ..., "object": ...}`): errors, bookmarks, Tables.
    Value(Value),
}

impl WatchEvent {
    /// The event as a value.
    pub fn into_value(self) -> Value {
        match self {
            WatchEvent::Value(v) => v,
            WatchEvent::Encoded(b) => serde_json::from_slice(&b).unwrap_or(Value::Null),
        }
    }
}

/// A watch: events until the client leaves or the timeout.
pub type WatchStream = Pin<Box<dyn Stream<Item = WatchEvent> + Send>>;

/// What a request answers.
pub enum ApiResponse {
    /// An object (or list, or Table) with its HTTP code and warnings for the client.
    Object {
        /// 200 or 201.
        code: u16,
        /// The body.
        body: Value,
        /// `Warning` headers (unknown fields under `fieldValidation=Warn`).
        warnings: Vec<String>,
    },
    /// A JSON body already encoded (lists and reads, assembled from the stored bytes
    /// without decoding them).
    Encoded {
        /// 200.
        code: u16,
        /// The JSON text.
        body: Bytes,
    },
    /// A stream of watch events.
    Watch(WatchStream),
    /// Bytes as they come, of one content type (a container's log).
    Stream {
        /// `text/plain`.
        content_type: &'static str,
        /// The body.
        body: ByteStream,
    },
}

/// A body streamed as it comes.
pub type ByteStream = Pin<Box<dyn Stream<Item = Result<Bytes, std::io::Error>> + Send>>;

impl std::fmt::Debug for ApiResponse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ApiResponse::Object { code, body, .. } => write!(f, "{code} {body}"),
            ApiResponse::Encoded { code, body } => {
                write!(f, "{code} {}", String::from_utf8_lossy(body))
            }
            ApiResponse::Watch(_) => write!(f, "watch"),
            ApiResponse::Stream { content_type, .. } => write!(f, "stream of {content_type}"),
        }
    }
}

impl ApiResponse {
    /// The body as a value (decoding an encoded one); `None` for a watch.
    pub fn into_value(self) -> Option<Value> {
        match self {
            ApiResponse::Object { body, .. } => Some(body),
            ApiResponse::Encoded { body, .. } => serde_json::from_slice(&body).ok(),
            ApiResponse::Watch(_) | ApiResponse::Stream { .. } => None,
        }
    }

    /// A 200 answer with `body`.
    pub fn ok(body: Value) -> Self {
        ApiResponse::Object {
            code: 200,
            body,
            warnings: Vec::new(),
        }
    }
}
