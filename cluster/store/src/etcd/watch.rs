//! Watches over etcd that survive a lost connection: the stream remembers the last revision
//! it delivered and, when etcd's stream breaks, opens a new one from the next revision.

use std::time::Duration;

use bytes::Bytes;
use etcd_client::{EventType, WatchOptions, WatchResponse};
use tokio::time::Instant;

use super::{EtcdStore, convert_kv, is_transient, map_error};
use crate::error::{Result, StoreError};
use crate::types::{EventKind, Revision, WatchBatch, WatchEvent, WatchStream};
use crate::validation::prefix_end;

struct State {
    store: EtcdStore,
    prefix: Bytes,
    /// The last revision delivered (or known to hold nothing for this prefix).
    position: i64,
    stream: Option<etcd_client::WatchStream>,
    /// A first response read while opening, not yet delivered.
    pending: Option<WatchResponse>,
    last_sent: Instant,
    done: bool,
}

/// Opens a watch after revision `after`. Fails at once with `Compacted` if etcd no longer has
/// that history.
pub(crate) async fn open(store: EtcdStore, prefix: Bytes, after: i64) -> Result<WatchStream> {
    let mut st = State {
        store,
        prefix,
        position: after,
        stream: None,
        pending: None,
        last_sent: Instant::now(),
        done: false,
    };
    st.connect().await?;
    let stream = futures::stream::unfold(st, |mut st| async move {
        if st.done {
            return None;
        }
        let item = st.next().await;
        if item.is_err() {
            st.done = true;
        }
        Some((item, st))
    });
    Ok(Box::pin(stream))
}

impl State {
    /// Opens etcd's stream from the revision after `position` and waits for its first answer,
    /// retrying while etcd is unreachable.
    async fn connect(&mut self) -> Result<()> {
        let deadline = Instant::now() + self.store.options.retry_for;
        let mut backoff = Duration::from_millis(50);
        loop {
            match self.try_connect().await {
                Ok(()) => return Ok(()),
                Err(Attempt::Fatal(e)) => return Err(e),
                Err(Attempt::Transient(e)) if Instant::now() < deadline => {
                    tracing::warn!(error = %e, "etcd watch: stream lost; reconnecting");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                }
                Err(Attempt::Transient(e)) => {
                    return Err(map_error(&self.store.name, "watch", e));
                }
            }
        }
    }

    async fn try_connect(&mut self) -> std::result::Result<(), Attempt> {
        let mut opts = WatchOptions::new()
            .with_start_revision(self.position + 1)
            .with_prev_key()
            .with_progress_notify();
        if let Some(end) = prefix_end(&self.prefix) {
            opts = opts.with_range(end);
        } else {
            opts = opts.with_all_keys();
        }
        let mut stream = self
            .store
            .client
            .watch_client()
            .watch(self.prefix.to_vec(), Some(opts))
            .await
            .map_err(Attempt::classify)?;
        // The first answer says whether the watch was created or refused (compacted).
        match stream.message().await.map_err(Attempt::classify)? {
            None => {
                return Err(Attempt::Transient(etcd_client::Error::WatchError(
                    "stream closed before the watch was created".into(),
                )));
            }
            Some(resp) if resp.canceled() => {
                return Err(Attempt::Fatal(self.cancelled(&resp)));
            }
            Some(resp) if resp.created() && resp.events().is_empty() => {}
            Some(resp) => self.pending = Some(resp),
        }
        self.stream = Some(stream);
        Ok(())
    }

    fn cancelled(&self, resp: &WatchResponse) -> StoreError {
        if resp.compact_revision() > 0 {
            StoreError::Compacted {
                requested: self.position,
                compacted: resp.compact_revision(),
            }
        } else {
            StoreError::Unavailable {
                backend: self.store.name.to_string(),
                op: "watch",
                source: format!("etcd cancelled the watch: {}", resp.cancel_reason()).into(),
            }
        }
    }

    async fn next(&mut self) -> Result<WatchBatch> {
        loop {
            if let Some(resp) = self.pending.take()
                && let Some(batch) = self.absorb(resp)?
            {
                return Ok(batch);
            }
            let Some(stream) = self.stream.as_mut() else {
                self.store
                    .metrics
                    .watch_reconnects
                    .with_label_values(&["etcd"])
                    .inc();
                self.connect().await?;
                continue;
            };
            let progress_at = self.last_sent + self.store.options.progress_interval;
            tokio::select! {
                msg = stream.message() => match msg {
                    Ok(Some(resp)) => self.pending = Some(resp),
                    Ok(None) => self.stream = None,
                    Err(e) if is_transient(&e) || matches!(e, etcd_client::Error::GRpcStatus(_)) => {
                        tracing::warn!(error = %e, position = self.position, "etcd watch: stream broke; resuming");
                        self.stream = None;
                    }
                    Err(e) => return Err(map_error(&self.store.name, "watch", e)),
                },
                _ = tokio::time::sleep_until(progress_at) => {
                    // Ask etcd where the watch stands; the answer arrives as a progress
                    // notification. If the request fails the stream is broken: reconnect.
                    self.last_sent = Instant::now();
                    if stream.request_progress().await.is_err() {
                        self.stream = None;
                    }
                }
            }
        }
    }

    /// Turns one etcd response into a batch, or `None` when it carries nothing new.
    fn absorb(&mut self, resp: WatchResponse) -> Result<Option<WatchBatch>> {
        if resp.canceled() {
            return Err(self.cancelled(&resp));
        }
        if resp.events().is_empty() {
            // A progress notification: nothing for this watch up to the header revision.
            let rev = resp.header().map_or(0, |h| h.revision());
            if rev > self.position {
                self.position = rev;
            }
            if resp.created() {
                return Ok(None);
            }
            self.last_sent = Instant::now();
            return Ok(Some(WatchBatch {
                events: Vec::new(),
                revision: Revision::single(self.position),
            }));
        }
        let mut events = Vec::with_capacity(resp.events().len());
        for e in resp.events() {
            let Some(kv) = e.kv() else { continue };
            let kv = convert_kv(kv);
            // After a reconnect etcd starts at position + 1; never hand out an event twice.
            if kv.mod_revision <= self.position {
                continue;
            }
            events.push(WatchEvent {
                kind: match e.event_type() {
                    EventType::Put => EventKind::Put,
                    EventType::Delete => EventKind::Delete,
                },
                kv,
                prev_kv: e.prev_kv().map(convert_kv),
            });
        }
        let Some(last) = events.last() else {
            return Ok(None);
        };
        self.position = last.kv.mod_revision;
        self.last_sent = Instant::now();
        Ok(Some(WatchBatch {
            events,
            revision: Revision::single(self.position),
        }))
    }
}

enum Attempt {
    Transient(etcd_client::Error),
    Fatal(StoreError),
}

impl Attempt {
    fn classify(e: etcd_client::Error) -> Attempt {
        if is_transient(&e) {
            Attempt::Transient(e)
        } else {
            Attempt::Fatal(map_error("etcd", "watch", e))
        }
    }
}
