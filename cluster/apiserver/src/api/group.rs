//! Group commit: writes that arrive while a transaction is being written wait and go to
//! the store together in the next one (as etcd's raft batches proposals). There is no
//! timer: the first write starts a committer task, and the writes that arrive while it
//! writes form its next batch — under load batches grow by themselves, and a lone write
//! waits for nothing.
//!
//! Two queues use it: `pods/binding` ([`super::bindings`], with its stored-bytes charges)
//! and single conditional writes ([`Api::write_batched`]; today creates that no
//! ResourceQuota counts — a ReplicaSet's burst of pods, Events). Each request is checked alone, as it always was; only
//! the store write is shared, and each request still gets its own answer.

use tokio::sync::oneshot;

use super::*;

/// Writes in one transaction at most (the store's limit on operations in one).
pub(super) const MAX_BATCH: usize = tessera_store::validation::MAX_TXN_OPS;

/// Bytes of values in one transaction at most (etcd refuses requests over 1.5 MiB by
/// default; a batch over this is split, so it is never refused for its size).
pub(super) const MAX_BATCH_BYTES: usize = 1 << 20;

/// Splits a batch into the parts one transaction each can hold, in order within each: by
/// the store's transaction group (a sharded store's backend: a transaction may not span
/// two), and at most [`MAX_BATCH_BYTES`] of values per part.
pub(super) fn split<T>(store: &dyn Store, items: Vec<T>, op: impl Fn(&T) -> &Op) -> Vec<Vec<T>> {
    let mut parts: Vec<(usize, usize, Vec<T>)> = Vec::new();
    for item in items {
        let o = op(&item);
        let group = store.txn_group(o.key());
        let size = o.key().len() + o.value().map_or(0, |v| v.len());
        match parts
            .iter_mut()
            .rev()
            .find(|(g, bytes, _)| *g == group && *bytes + size <= MAX_BATCH_BYTES)
        {
            Some((_, bytes, part)) => {
                *bytes += size;
                part.push(item);
            }
            None => parts.push((group, size, vec![item])),
        }
    }
    parts.into_iter().map(|(_, _, part)| part).collect()
}

/// Writes waiting for a committer, and whether one is writing.
pub(super) struct Group<T> {
    queue: parking_lot::Mutex<(Vec<T>, bool)>,
}

impl<T> Default for Group<T> {
    fn default() -> Self {
        Group {
            queue: parking_lot::Mutex::new((Vec::new(), false)),
        }
    }
}

impl<T> Group<T> {
    /// Queues `item`; true if no committer is running and the caller must start one.
    pub(super) fn push(&self, item: T) -> bool {
        let mut q = self.queue.lock();
        q.0.push(item);
        !std::mem::replace(&mut q.1, true)
    }

    /// Runs `commit` on batches of at most [`MAX_BATCH`] until none is waiting. If it stops
    /// early (a panic, the runtime shutting down), the writes waiting are dropped — their
    /// requests see their channel closed and write alone — and the next push starts a
    /// committer again.
    pub(super) async fn drain<F, Fut>(&self, mut commit: F)
    where
        F: FnMut(Vec<T>) -> Fut,
        Fut: std::future::Future<Output = ()>,
    {
        struct Stopped<'a, T>(&'a parking_lot::Mutex<(Vec<T>, bool)>);
        impl<T> Drop for Stopped<'_, T> {
            fn drop(&mut self) {
                let mut q = self.0.lock();
                q.1 = false;
                q.0.clear();
            }
        }
        let stopped = Stopped(&self.queue);
        loop {
            let batch = {
                let mut q = self.queue.lock();
                if q.0.is_empty() {
                    q.1 = false;
                    drop(q);
                    // Stopped as it should: a write queued since starts the next committer.
                    std::mem::forget(stopped);
                    return;
                }
                let n = q.0.len().min(MAX_BATCH);
                q.0.drain(..n).collect::<Vec<_>>()
            };
            commit(batch).await;
        }
    }
}

/// What became of a write sent to [`Api::write_batched`].
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Written {
    /// Written, at this revision.
    At(i64),
    /// Its condition failed: the key exists (a create) or moved (an update, a delete). Not
    /// written; nothing else was lost.
    Precondition,
    /// Not written with others (its batch was refused whole, another write of its key was
    /// in the batch, or the committer stopped): write it alone.
    Alone,
}

/// A write checked and ready, and where its outcome goes.
pub(super) struct PendingWrite {
    op: Op,
    written: oneshot::Sender<Written>,
}

impl Api {
    /// Writes one conditional operation (a create, or an update or delete at an expected
    /// revision) together with the writes waiting at the same moment.
    pub(super) async fn write_batched(&self, op: Op) -> Written {
        let (written, outcome) = oneshot::channel();
        if self.writes.push(PendingWrite { op, written }) {
            // A task, not this request: a caller that goes away must not strand the others.
            let api = self.clone();
            tokio::spawn(async move { api.writes.drain(|batch| api.commit_writes(batch)).await });
        }
        outcome.await.unwrap_or(Written::Alone)
    }

    /// Writes a batch in one transaction. A write whose condition fails fails the
    /// transaction (nothing of it is written): that one is answered
    /// [`Written::Precondition`] and the rest are written again without it. A second write
    /// of one key in a batch is sent to write alone, and so is a batch the store refuses.
    async fn commit_writes(&self, batch: Vec<PendingWrite>) {
        let mut keys = std::collections::HashSet::with_capacity(batch.len());
        let (mut live, mut alone) = (Vec::with_capacity(batch.len()), Vec::new());
        for p in batch {
            if keys.insert(p.op.key().clone()) {
                live.push(p);
            } else {
                alone.push(p);
            }
        }
        drop(keys);
        for p in alone {
            let _ = p.written.send(Written::Alone);
        }
        let parts = split(&*self.store, live, |p| &p.op);
        futures::future::join_all(parts.into_iter().map(|part| self.commit_writes_part(part)))
            .await;
    }

    /// Writes one part of a batch (one transaction's worth) as [`Api::commit_writes`] says.
    async fn commit_writes_part(&self, mut live: Vec<PendingWrite>) {
        if let Some(m) = &self.metrics {
            m.write_batch.observe(live.len() as f64);
        }
        let mut alone = Vec::new();
        let mut result = "written";
        while !live.is_empty() {
            let ops = live.iter().map(|p| p.op.clone()).collect();
            match self.store.txn(ops).await {
                Ok(t) => {
                    for (p, r) in live.into_iter().zip(&t.results) {
                        let rev = match r {
                            tessera_store::OpResult::Written(kv)
                            | tessera_store::OpResult::Deleted(kv) => kv.mod_revision,
                            _ => t.revision,
                        };
                        let _ = p.written.send(Written::At(rev));
                    }
                    break;
                }
                Err(e) => match e.precondition() {
                    Some(p) if p.index < live.len() => {
                        result = "retried";
                        let _ = live.remove(p.index).written.send(Written::Precondition);
                    }
                    _ => {
                        tracing::debug!(writes = live.len(), error = %e, "a batch of writes was not written: each is written alone");
                        result = "alone";
                        alone.append(&mut live);
                    }
                },
            }
        }
        if let Some(m) = &self.metrics {
            m.write_batches.with_label_values(&[result]).inc();
        }
        for p in alone {
            let _ = p.written.send(Written::Alone);
        }
    }
}
