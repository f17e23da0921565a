//! The embedded backend: an in-process multi-version store, durable through a write-ahead log
//! with group commit and snapshots. The default on one machine; same semantics as etcd.
//!
//! Layout of the data directory: `wal-<first index>.log` segments, at most one live
//! `snap-<index>.snap`, and a `LOCK` file held while the store is open.

mod codec;
mod committer;
mod mvcc;
mod snapshot;
pub use snapshot::{BackupInfo, restore_backup, verify_backup};
mod wal;

use std::collections::HashMap;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak, mpsc};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use parking_lot::{Mutex, RwLock};
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

use self::committer::{Committer, Request};
use self::mvcc::Mvcc;
use crate::Store;
use crate::continuation::Cursor;
use crate::error::{Result, StoreError, io};
use crate::metrics::StoreMetrics;
use crate::types::{
    KeyValue, LeaseId, ListRequest, ListResponse, Op, Revision, TxnResponse, WatchBatch,
    WatchStream,
};
use crate::validation::{check_key, check_prefix, check_ttl, check_txn};

/// How an embedded store is opened.
#[derive(Clone, Debug)]
pub struct EmbeddedOptions {
    /// Size log segments are preallocated to (0: no preallocation).
    pub segment_bytes: u64,
    /// Log bytes written after which a snapshot is taken and older segments dropped.
    pub snapshot_threshold_bytes: u64,
    /// How often an idle watch gets a progress notification.
    pub progress_interval: Duration,
    /// How often expired leases are looked for.
    pub lease_check_interval: Duration,
    /// Most events handed to a watch in one batch (whole revisions are never split).
    pub watch_batch: usize,
}

impl EmbeddedOptions {
    /// The defaults with 4 MiB log segments: for a small or short-lived store (tests, a
    /// laptop), where writing out 128 MiB of segments ahead costs more than it saves.
    pub fn small() -> EmbeddedOptions {
        EmbeddedOptions {
            segment_bytes: 4 << 20,
            ..EmbeddedOptions::default()
        }
    }
}

impl Default for EmbeddedOptions {
    fn default() -> Self {
        EmbeddedOptions {
            segment_bytes: 64 << 20,
            snapshot_threshold_bytes: 64 << 20,
            progress_interval: Duration::from_secs(5),
            lease_check_interval: Duration::from_millis(250),
            watch_batch: 1000,
        }
    }
}

struct Shared {
    state: Arc<RwLock<Mvcc>>,
    tx: mpsc::Sender<Request>,
    revision_rx: watch::Receiver<i64>,
    /// When each lease expires, unless renewed. Kept in memory only, as etcd does: after a
    /// restart every lease gets its full TTL again.
    deadlines: Mutex<HashMap<LeaseId, Instant>>,
    options: EmbeddedOptions,
    dir: PathBuf,
}

/// A handle to an open embedded store; clones share it.
#[derive(Clone)]
pub struct EmbeddedStore {
    shared: Arc<Shared>,
}

impl EmbeddedStore {
    /// Opens (or creates) the store in `dir`: loads the newest snapshot, replays the log
    /// after it, and starts the writer thread and the lease timer. Must run inside a Tokio
    /// runtime.
    pub async fn open(
        dir: impl AsRef<Path>,
        options: EmbeddedOptions,
        metrics: Arc<StoreMetrics>,
    ) -> Result<EmbeddedStore> {
        let dir = dir.as_ref().to_owned();
        let started = std::time::Instant::now();
        let dir2 = dir.clone();
        let segment_bytes = options.segment_bytes;
        let (committer_parts, mvcc) =
            tokio::task::spawn_blocking(move || recover(&dir2, segment_bytes))
                .await
                .map_err(|e| StoreError::Internal(format!("recovery task failed: {e}")))??;
        let (lock_file, wal, next_lease_id, last_snapshot_bytes) = committer_parts;
        let recovered = started.elapsed();
        metrics.recovery_duration.observe(recovered.as_secs_f64());
        tracing::info!(
            dir = %dir.display(),
            keys = mvcc.live_keys(),
            revision = mvcc.revision(),
            seconds = recovered.as_secs_f64(),
            "embedded store opened"
        );
        let now = Instant::now();
        let deadlines = mvcc
            .leases
            .iter()
            .map(|(id, l)| (*id, now + Duration::from_secs(l.ttl as u64)))
            .collect();
        let revision = mvcc.revision();
        metrics
            .revision
            .with_label_values(&["embedded"])
            .set(revision);
        metrics
            .keys
            .with_label_values(&["embedded"])
            .set(mvcc.live_keys() as i64);
        let state = Arc::new(RwLock::new(mvcc));
        let (revision_tx, revision_rx) = watch::channel(revision);
        let (tx, rx) = mpsc::channel();
        let committer = Committer {
            dir: dir.clone(),
            wal,
            state: state.clone(),
            revision_tx,
            next_lease_id,
            snapshot_threshold: options.snapshot_threshold_bytes,
            last_snapshot_bytes,
            snapshotting: None,
            metrics: metrics.clone(),
            lock_file,
            failed: None,
        };
        std::thread::Builder::new()
            .name("tessera-store-committer".into())
            .spawn(move || committer.run(rx))
            .map_err(io("starting the writer thread"))?;
        let shared = Arc::new(Shared {
            state,
            tx,
            revision_rx,
            deadlines: Mutex::new(deadlines),
            options,
            dir,
        });
        tokio::spawn(expire_leases(Arc::downgrade(&shared)));
        Ok(EmbeddedStore { shared })
    }

    /// The data directory.
    pub fn dir(&self) -> &Path {
        &self.shared.dir
    }

    /// Stops the writer after the requests already queued and releases the directory, so it
    /// can be opened again. Later requests on any handle fail with `Closed`.
    pub async fn close(&self) -> Result<()> {
        let (reply, rx) = oneshot::channel();
        if self.shared.tx.send(Request::Shutdown { reply }).is_err() {
            return Ok(());
        }
        let _ = rx.await;
        Ok(())
    }

    /// Writes a consistent copy of the whole store as of now to `out` (whole or absent: it
    /// is written beside and renamed), in the snapshot format: [`restore_backup`] makes a
    /// store directory of it. Writes wait only while the key map is copied.
    pub async fn backup(&self, out: &Path) -> Result<BackupInfo> {
        let image = self.call(|reply| Request::Capture { reply }).await?;
        let out = out.to_owned();
        tokio::task::spawn_blocking(move || snapshot::backup(&image, &out))
            .await
            .map_err(|e| StoreError::Closed(format!("the backup writer stopped: {e}")))?
    }

    /// Keys that exist now.
    pub fn len(&self) -> usize {
        self.shared.state.read().live_keys()
    }

    /// True if no key exists.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    async fn call<T>(&self, make: impl FnOnce(oneshot::Sender<Result<T>>) -> Request) -> Result<T> {
        let (reply, rx) = oneshot::channel();
        self.shared
            .tx
            .send(make(reply))
            .map_err(|_| StoreError::Closed("the embedded store was closed".into()))?;
        rx.await
            .map_err(|_| StoreError::Closed("the embedded store's writer stopped".into()))?
    }
}

type Recovered = ((std::fs::File, wal::Wal, i64, u64), Mvcc);

fn recover(dir: &Path, segment_bytes: u64) -> Result<Recovered> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(io("creating the data directory"))?;
    let lock_file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(dir.join("LOCK"))
        .map_err(io("opening the LOCK file"))?;
    lock_file.try_lock().map_err(|e| StoreError::Io {
        step: "locking the data directory (is another tessera process using it?)",
        source: match e {
            std::fs::TryLockError::Error(e) => e,
            std::fs::TryLockError::WouldBlock => std::io::Error::new(
                std::io::ErrorKind::WouldBlock,
                format!("{} is locked by another process", dir.display()),
            ),
        },
    })?;
    let _ = std::fs::remove_file(dir.join("snap.tmp"));
    wal::remove_preallocated(dir)?;
    let (mut mvcc, snap_index, mut next_lease_id, snap_bytes) = match snapshot::load_latest(dir)? {
        Some(s) => (s.mvcc, s.index, s.next_lease_id, s.bytes),
        None => (Mvcc::new(), 0, 1, 0),
    };
    let next_index = wal::replay(dir, snap_index, |_, record| {
        if let mvcc::Record::LeaseGrant { id, .. } = &record {
            next_lease_id = next_lease_id.max(id + 1);
        }
        mvcc.apply(&record);
    })?;
    let wal = wal::Wal::create(dir, next_index, segment_bytes)?;
    Ok(((lock_file, wal, next_lease_id, snap_bytes), mvcc))
}

async fn expire_leases(shared: Weak<Shared>) {
    let interval = match shared.upgrade() {
        Some(s) => s.options.lease_check_interval,
        None => return,
    };
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let now = Instant::now();
        let expired: Vec<LeaseId> = {
            let mut d = shared.deadlines.lock();
            let ids: Vec<LeaseId> = d
                .iter()
                .filter(|(_, at)| **at <= now)
                .map(|(id, _)| *id)
                .collect();
            for id in &ids {
                d.remove(id);
            }
            ids
        };
        for id in expired {
            let (reply, rx) = oneshot::channel();
            if shared.tx.send(Request::LeaseRevoke { id, reply }).is_err() {
                return;
            }
            match rx.await {
                Ok(Ok(())) => tracing::debug!(lease = id, "lease expired"),
                Ok(Err(StoreError::LeaseNotFound(_))) => {}
                Ok(Err(e)) => {
                    tracing::warn!(lease = id, error = %e, "revoking an expired lease failed")
                }
                Err(_) => return,
            }
        }
    }
}

#[async_trait]
impl Store for EmbeddedStore {
    async fn backup(&self, out: &Path) -> Result<BackupInfo> {
        EmbeddedStore::backup(self, out).await
    }

    fn backend(&self) -> &'static str {
        "embedded"
    }

    async fn get(&self, key: &[u8]) -> Result<Option<KeyValue>> {
        check_key(key)?;
        Ok(self.shared.state.read().latest(key).cloned())
    }

    async fn list(&self, req: ListRequest) -> Result<ListResponse> {
        let cursor = Cursor::from_request(&req)?;
        check_prefix(&cursor.prefix)?;
        let state = self.shared.state.read();
        let revision = match &cursor.revision {
            Some(r) => r.expect_single()?,
            None => state.revision(),
        };
        state.check_read_revision(revision)?;
        let (kvs, more) = state.list(&cursor.prefix, &cursor.start, revision, req.limit);
        drop(state);
        Ok(cursor.page(kvs, Revision::single(revision), more))
    }

    async fn txn(&self, ops: Vec<Op>) -> Result<TxnResponse> {
        check_txn(&ops)?;
        self.call(|reply| Request::Txn { ops, reply }).await
    }

    async fn watch(&self, prefix: &[u8], after: Option<Revision>) -> Result<WatchStream> {
        check_prefix(prefix)?;
        let after = match after {
            Some(r) => r.expect_single()?,
            None => self.shared.state.read().revision(),
        };
        {
            let state = self.shared.state.read();
            if after < state.compacted() {
                return Err(StoreError::Compacted {
                    requested: after,
                    compacted: state.compacted(),
                });
            }
            if after > state.revision() {
                return Err(StoreError::FutureRevision {
                    requested: after,
                    current: state.revision(),
                });
            }
        }
        Ok(Box::pin(watch_stream(
            self.shared.clone(),
            Bytes::copy_from_slice(prefix),
            after,
        )))
    }

    async fn lease_grant(&self, ttl: i64) -> Result<LeaseId> {
        check_ttl(ttl)?;
        let id = self
            .call(|reply| Request::LeaseGrant { ttl, reply })
            .await?;
        self.shared
            .deadlines
            .lock()
            .insert(id, Instant::now() + Duration::from_secs(ttl as u64));
        Ok(id)
    }

    async fn lease_keep_alive(&self, id: LeaseId) -> Result<i64> {
        let ttl = match self.shared.state.read().leases.get(&id) {
            Some(l) => l.ttl,
            None => return Err(StoreError::LeaseNotFound(id)),
        };
        let mut deadlines = self.shared.deadlines.lock();
        // A lease whose deadline is gone is being revoked by the timer: too late to renew.
        match deadlines.get_mut(&id) {
            Some(at) => {
                *at = Instant::now() + Duration::from_secs(ttl as u64);
                Ok(ttl)
            }
            None => Err(StoreError::LeaseNotFound(id)),
        }
    }

    async fn lease_revoke(&self, id: LeaseId) -> Result<()> {
        self.call(|reply| Request::LeaseRevoke { id, reply })
            .await?;
        self.shared.deadlines.lock().remove(&id);
        Ok(())
    }

    async fn compact(&self, revision: &Revision) -> Result<()> {
        let revision = revision.expect_single()?;
        self.call(|reply| Request::Compact { revision, reply })
            .await
    }

    async fn current_revision(&self) -> Result<Revision> {
        Ok(Revision::single(self.shared.state.read().revision()))
    }
}

/// A watch reads the shared event log from its own position: no per-watch buffers that can
/// overflow, and a slow reader costs nothing until it reads (it fails with `Compacted` only
/// if it falls behind compaction, as in etcd).
fn watch_stream(
    shared: Arc<Shared>,
    prefix: Bytes,
    after: i64,
) -> impl futures::Stream<Item = Result<WatchBatch>> + Send {
    struct State {
        shared: Arc<Shared>,
        prefix: Bytes,
        position: i64,
        revision_rx: watch::Receiver<i64>,
        last_sent: Instant,
        done: bool,
    }
    let state = State {
        revision_rx: shared.revision_rx.clone(),
        shared,
        prefix,
        position: after,
        last_sent: Instant::now(),
        done: false,
    };
    futures::stream::unfold(state, |mut st| async move {
        if st.done {
            return None;
        }
        loop {
            st.revision_rx.borrow_and_update();
            let read = {
                let state = st.shared.state.read();
                state.events_after(&st.prefix, st.position, st.shared.options.watch_batch)
            };
            match read {
                Err(e) => {
                    st.done = true;
                    return Some((Err(e), st));
                }
                Ok((events, position)) => {
                    st.position = position;
                    if !events.is_empty() {
                        st.last_sent = Instant::now();
                        let batch = WatchBatch {
                            events,
                            revision: Revision::single(position),
                        };
                        return Some((Ok(batch), st));
                    }
                }
            }
            let progress_at = st.last_sent + st.shared.options.progress_interval;
            tokio::select! {
                changed = st.revision_rx.changed() => {
                    if changed.is_err() {
                        st.done = true;
                        return Some((Err(StoreError::Closed("the embedded store was closed".into())), st));
                    }
                }
                _ = tokio::time::sleep_until(progress_at) => {
                    st.last_sent = Instant::now();
                    let batch = WatchBatch { events: Vec::new(), revision: Revision::single(st.position) };
                    return Some((Ok(batch), st));
                }
            }
        }
    })
}
