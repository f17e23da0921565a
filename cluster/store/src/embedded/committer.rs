//! The single writer of an embedded store. Requests queue on a channel; the committer takes
//! all that are waiting, checks their preconditions against the state plus the batch's own
//! earlier writes, appends the resulting records to the log, flushes once (group commit),
//! applies them to the in-memory state, and only then answers. So a write is visible and
//! acknowledged only after it is durable, and concurrent writers share one `fdatasync`.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::mpsc::Receiver;
use std::time::Instant;

use bytes::Bytes;
use parking_lot::RwLock;
use tokio::sync::{oneshot, watch};

use super::mvcc::{Mutation, Mvcc, Record};
use super::snapshot;
use super::wal::Wal;
use crate::error::{PreconditionFailure, Result, StoreError};
use crate::metrics::StoreMetrics;
use crate::types::{KeyValue, LeaseId, Op, OpResult, TxnResponse};

/// Most transactions taken into one group commit.
const MAX_BATCH: usize = 4096;

/// A request to the committer.
pub(crate) enum Request {
    Txn {
        ops: Vec<Op>,
        reply: oneshot::Sender<Result<TxnResponse>>,
    },
    LeaseGrant {
        ttl: i64,
        reply: oneshot::Sender<Result<LeaseId>>,
    },
    LeaseRevoke {
        id: LeaseId,
        reply: oneshot::Sender<Result<()>>,
    },
    Compact {
        revision: i64,
        reply: oneshot::Sender<Result<()>>,
    },
    /// A copy of the whole state as of the last durable record (for a backup).
    Capture {
        reply: oneshot::Sender<Result<snapshot::Image>>,
    },
    Shutdown {
        reply: oneshot::Sender<()>,
    },
}

/// The writer's state; runs on a thread of its own.
pub(crate) struct Committer {
    pub dir: PathBuf,
    pub wal: Wal,
    pub state: Arc<RwLock<Mvcc>>,
    pub revision_tx: watch::Sender<i64>,
    pub next_lease_id: i64,
    pub snapshot_threshold: u64,
    /// Size of the last snapshot written (0 before the first).
    pub last_snapshot_bytes: u64,
    /// A snapshot being written in the background, and when it started.
    pub snapshotting: Option<(std::thread::JoinHandle<Result<u64>>, Instant)>,
    pub metrics: Arc<StoreMetrics>,
    /// Held for the store's lifetime so no second process opens the same directory.
    pub lock_file: std::fs::File,
    /// Set after a failed log write: the log's tail is unknown, so no further write is taken.
    pub failed: Option<String>,
}

struct PendingTxn {
    reply: oneshot::Sender<Result<TxnResponse>>,
    outcome: Result<TxnResponse>,
}

impl Committer {
    /// Serves requests until shutdown or until every sender is gone.
    pub fn run(mut self, rx: Receiver<Request>) {
        let mut batch = Vec::with_capacity(256);
        while let Ok(first) = rx.recv() {
            batch.push(first);
            while batch.len() < MAX_BATCH {
                match rx.try_recv() {
                    Ok(r) => batch.push(r),
                    Err(_) => break,
                }
            }
            if let Some(reply) = self.process(&mut batch) {
                // No background writer may touch the directory once it is released.
                self.finish_snapshot(true);
                let _ = self.lock_file.unlock();
                let _ = reply.send(());
                return;
            }
            self.maybe_snapshot();
        }
        self.finish_snapshot(true);
    }

    /// Handles one batch; returns the shutdown reply if a shutdown was asked for.
    fn process(&mut self, batch: &mut Vec<Request>) -> Option<oneshot::Sender<()>> {
        let mut txns: Vec<(Vec<Op>, oneshot::Sender<Result<TxnResponse>>)> = Vec::new();
        let mut shutdown = None;
        for req in batch.drain(..) {
            match req {
                Request::Txn { ops, reply } => txns.push((ops, reply)),
                other => {
                    // Lease and compaction requests change what later transactions see in
                    // ways the batch overlay does not model, so they commit on their own.
                    self.commit_txns(&mut txns);
                    match other {
                        Request::LeaseGrant { ttl, reply } => {
                            let _ = reply.send(self.grant(ttl));
                        }
                        Request::LeaseRevoke { id, reply } => {
                            let _ = reply.send(self.revoke(id));
                        }
                        Request::Compact { revision, reply } => {
                            let _ = reply.send(self.compact(revision));
                        }
                        Request::Capture { reply } => {
                            let index = self.wal.next_index() - 1;
                            let _ = reply.send(Ok(snapshot::Image::capture(
                                index,
                                self.next_lease_id,
                                &self.state.read(),
                            )));
                        }
                        Request::Shutdown { reply } => shutdown = Some(reply),
                        Request::Txn { .. } => {}
                    }
                }
            }
        }
        self.commit_txns(&mut txns);
        shutdown
    }

    fn commit_txns(&mut self, txns: &mut Vec<(Vec<Op>, oneshot::Sender<Result<TxnResponse>>)>) {
        if txns.is_empty() {
            return;
        }
        if let Some(why) = &self.failed {
            for (_, reply) in txns.drain(..) {
                let _ = reply.send(Err(StoreError::Closed(why.clone())));
            }
            return;
        }
        self.metrics.commit_batch.observe(txns.len() as f64);
        let mut records = Vec::new();
        let mut pending = Vec::with_capacity(txns.len());
        {
            let state = self.state.read();
            let mut overlay: HashMap<Bytes, Option<KeyValue>> = HashMap::new();
            let mut revision = state.revision();
            for (ops, reply) in txns.drain(..) {
                let outcome = evaluate(&state, &mut overlay, &mut revision, ops, &mut records);
                pending.push(PendingTxn { reply, outcome });
            }
        }
        if let Err(e) = self.persist(&records) {
            for p in pending {
                let _ = p.reply.send(Err(StoreError::Closed(e.to_string())));
            }
            return;
        }
        self.apply(&records);
        for p in pending {
            let _ = p.reply.send(p.outcome);
        }
    }

    /// Appends and flushes records; on failure the store stops taking writes.
    fn persist(&mut self, records: &[Record]) -> Result<()> {
        if records.is_empty() {
            return Ok(());
        }
        if let Some(why) = &self.failed {
            return Err(StoreError::Closed(why.clone()));
        }
        for r in records {
            self.wal.append(r);
        }
        let started = Instant::now();
        match self.wal.sync() {
            Ok(n) => {
                self.metrics
                    .fsync_duration
                    .observe(started.elapsed().as_secs_f64());
                self.metrics.wal_bytes.inc_by(n as u64);
                Ok(())
            }
            Err(e) => {
                tracing::error!(error = %e, dir = %self.dir.display(), "log write failed; the embedded store takes no more writes");
                self.failed = Some(format!("log write failed: {e}"));
                Err(e)
            }
        }
    }

    fn apply(&mut self, records: &[Record]) {
        if records.is_empty() {
            return;
        }
        let (revision, compacted, keys) = {
            let mut state = self.state.write();
            for r in records {
                state.apply(r);
            }
            (state.revision(), state.compacted(), state.live_keys())
        };
        self.revision_tx.send_replace(revision);
        self.metrics
            .revision
            .with_label_values(&["embedded"])
            .set(revision);
        self.metrics
            .compacted_revision
            .with_label_values(&["embedded"])
            .set(compacted);
        self.metrics
            .keys
            .with_label_values(&["embedded"])
            .set(keys as i64);
    }

    fn grant(&mut self, ttl: i64) -> Result<LeaseId> {
        let id = self.next_lease_id;
        let record = Record::LeaseGrant { id, ttl };
        self.persist(std::slice::from_ref(&record))?;
        self.next_lease_id += 1;
        self.apply(&[record]);
        Ok(id)
    }

    fn revoke(&mut self, id: LeaseId) -> Result<()> {
        if !self.state.read().leases.contains_key(&id) {
            return Err(StoreError::LeaseNotFound(id));
        }
        let record = Record::LeaseRevoke { id };
        self.persist(std::slice::from_ref(&record))?;
        self.apply(&[record]);
        Ok(())
    }

    fn compact(&mut self, revision: i64) -> Result<()> {
        {
            let state = self.state.read();
            if revision > state.revision() {
                return Err(StoreError::FutureRevision {
                    requested: revision,
                    current: state.revision(),
                });
            }
            if revision <= state.compacted() {
                return Err(StoreError::Compacted {
                    requested: revision,
                    compacted: state.compacted(),
                });
            }
        }
        let record = Record::Compact { revision };
        self.persist(std::slice::from_ref(&record))?;
        self.apply(&[record]);
        Ok(())
    }

    /// Once the log has grown past the threshold — and past twice the last snapshot, so that
    /// snapshots never cost more than the log writes they save — start a new segment, capture
    /// the state (writes wait only for this copy of the key map; values are shared), and write
    /// it on a thread of its own, which then drops the segments it covers.
    fn maybe_snapshot(&mut self) {
        self.finish_snapshot(false);
        let due = self
            .snapshot_threshold
            .max(self.last_snapshot_bytes.saturating_mul(2));
        if self.failed.is_some()
            || self.snapshotting.is_some()
            || self.wal.bytes_since_snapshot < due
        {
            return;
        }
        let started = Instant::now();
        let index = self.wal.next_index() - 1;
        if let Err(e) = self.wal.rotate() {
            tracing::warn!(error = %e, "starting a log segment for a snapshot failed");
            return;
        }
        let image = snapshot::Image::capture(index, self.next_lease_id, &self.state.read());
        tracing::debug!(
            index = image.index(),
            capture_seconds = started.elapsed().as_secs_f64(),
            "captured state for a snapshot"
        );
        self.wal.bytes_since_snapshot = 0;
        let dir = self.dir.clone();
        match std::thread::Builder::new()
            .name("tessera-snapshot".into())
            .spawn(move || snapshot::write(&dir, &image))
        {
            Ok(handle) => self.snapshotting = Some((handle, started)),
            Err(e) => tracing::warn!(error = %e, "could not start the snapshot writer"),
        }
    }

    /// Collects a finished background snapshot (or, with `wait`, waits for it).
    fn finish_snapshot(&mut self, wait: bool) {
        let done = matches!(&self.snapshotting, Some((h, _)) if wait || h.is_finished());
        if !done {
            return;
        }
        let Some((handle, started)) = self.snapshotting.take() else {
            return;
        };
        match handle.join() {
            Ok(Ok(bytes)) => {
                self.last_snapshot_bytes = bytes;
                let secs = started.elapsed().as_secs_f64();
                self.metrics.snapshot_duration.observe(secs);
                tracing::info!(bytes, seconds = secs, "wrote snapshot");
            }
            Ok(Err(e)) => tracing::warn!(error = %e, "snapshot failed; the log keeps growing"),
            Err(_) => tracing::error!("the snapshot writer panicked; the log keeps growing"),
        }
    }
}

/// Checks one transaction against the state plus the batch's earlier writes; on success it
/// adds its record and updates the overlay and revision.
fn evaluate(
    state: &Mvcc,
    overlay: &mut HashMap<Bytes, Option<KeyValue>>,
    revision: &mut i64,
    ops: Vec<Op>,
    records: &mut Vec<Record>,
) -> Result<TxnResponse> {
    let current = |overlay: &HashMap<Bytes, Option<KeyValue>>, key: &Bytes| match overlay.get(key) {
        Some(v) => v.clone(),
        None => state.latest(key).cloned(),
    };
    let fail = |index: usize, key: &Bytes, kind, current| {
        Err(StoreError::PreconditionFailed(Box::new(
            PreconditionFailure {
                index,
                key: key.clone(),
                kind,
                current,
            },
        )))
    };
    // Check every precondition first: nothing is written unless all hold.
    let mut olds = Vec::with_capacity(ops.len());
    for (index, op) in ops.iter().enumerate() {
        let key = op.key();
        let old = current(overlay, key);
        if let Some(kind) = op.precondition_failure(old.as_ref()) {
            return fail(index, key, kind, old);
        }
        let lease = op.lease();
        if lease != 0 && !state.leases.contains_key(&lease) {
            return Err(StoreError::LeaseNotFound(lease));
        }
        olds.push(old);
    }
    let writes = ops.iter().any(|op| !matches!(op, Op::Check { .. }));
    if !writes {
        return Ok(TxnResponse {
            revision: *revision,
            results: vec![OpResult::Checked; ops.len()],
        });
    }
    *revision += 1;
    let rev = *revision;
    let mut mutations = Vec::with_capacity(ops.len());
    let mut results = Vec::with_capacity(ops.len());
    for (op, old) in ops.into_iter().zip(olds) {
        match op {
            Op::Create { key, value, lease }
            | Op::Update {
                key, value, lease, ..
            }
            | Op::Put { key, value, lease } => {
                let kv = KeyValue {
                    key: key.clone(),
                    value: value.clone(),
                    create_revision: old.as_ref().map_or(rev, |o| o.create_revision),
                    mod_revision: rev,
                    version: old.as_ref().map_or(1, |o| o.version + 1),
                    lease,
                };
                overlay.insert(key.clone(), Some(kv.clone()));
                mutations.push(Mutation::Put { key, value, lease });
                results.push(OpResult::Written(kv));
            }
            Op::Delete { key, .. } => {
                overlay.insert(key.clone(), None);
                mutations.push(Mutation::Delete { key });
                // Preconditions above guarantee the key existed.
                results.push(match old {
                    Some(prev) => OpResult::Deleted(prev),
                    None => OpResult::Checked,
                });
            }
            Op::Check { .. } => results.push(OpResult::Checked),
        }
    }
    records.push(Record::Txn {
        revision: rev,
        mutations,
    });
    Ok(TxnResponse {
        revision: rev,
        results,
    })
}
