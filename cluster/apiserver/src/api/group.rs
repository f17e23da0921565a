//! Group commit: writes that arrive while a transaction is being written wait and go to
//! the store together in the next one (as etcd's raft batches proposals). There is no
//! timer: the first write starts a committer task, and the writes that arrive while it
//! writes form its next batch — under load batches grow by themselves, and a lone write
//! waits for nothing.
//!
//! Two kinds of request use it: `pods/binding` ([`super::bindings`]) and creates
//! ([`Api::create_batched`]). Each request is checked alone, as it always was; only the
//! store write is shared, and each request still gets its own answer.

use tokio::sync::oneshot;

use super::*;

/// Writes in one transaction at most (the store's limit on operations in one).
pub(super) const MAX_BATCH: usize = tessera_store::validation::MAX_TXN_OPS;

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

/// A create checked and ready to write, and where its revision goes (None: write it alone).
pub(super) struct PendingCreate {
    key: String,
    value: Bytes,
    written: oneshot::Sender<Option<i64>>,
}

impl Api {
    /// Writes a new object (key and encoded value) together with the creates waiting at the
    /// same moment: its revision if written, None if it must be written alone — its key
    /// was taken (the lone write then answers AlreadyExists), or its batch could not be
    /// written.
    pub(super) async fn create_batched(&self, key: String, value: Bytes) -> Option<i64> {
        let (written, outcome) = oneshot::channel();
        if self.creates.push(PendingCreate {
            key,
            value,
            written,
        }) {
            // A task, not this request: a caller that goes away must not strand the others.
            let api = self.clone();
            tokio::spawn(async move { api.creates.drain(|batch| api.commit_creates(batch)).await });
        }
        outcome.await.ok().flatten()
    }

    /// Writes a batch of creates in one transaction. A create whose key exists fails the
    /// transaction (nothing of it is written): that one is sent to write alone and the rest
    /// are written again without it; so is a second create of one key in a batch.
    async fn commit_creates(&self, batch: Vec<PendingCreate>) {
        let mut keys = std::collections::HashSet::with_capacity(batch.len());
        let (mut live, mut alone) = (Vec::with_capacity(batch.len()), Vec::new());
        for p in batch {
            if keys.insert(p.key.clone()) {
                live.push(p);
            } else {
                alone.push(p);
            }
        }
        drop(keys);
        if let Some(m) = &self.metrics {
            m.create_batch.observe(live.len() as f64);
        }
        let mut result = "written";
        while !live.is_empty() {
            let ops = live
                .iter()
                .map(|p| Op::Create {
                    key: p.key.clone().into(),
                    value: p.value.clone(),
                    lease: 0,
                })
                .collect();
            match self.store.txn(ops).await {
                Ok(t) => {
                    for (p, r) in live.into_iter().zip(&t.results) {
                        let rev = match r {
                            tessera_store::OpResult::Written(kv) => kv.mod_revision,
                            _ => t.revision,
                        };
                        let _ = p.written.send(Some(rev));
                    }
                    break;
                }
                Err(e) => match e.precondition() {
                    Some(p) if p.index < live.len() => {
                        result = "retried";
                        alone.push(live.remove(p.index));
                    }
                    _ => {
                        tracing::debug!(creates = live.len(), error = %e, "a batch of creates was not written: each is written alone");
                        result = "alone";
                        alone.append(&mut live);
                    }
                },
            }
        }
        if let Some(m) = &self.metrics {
            m.create_batches.with_label_values(&[result]).inc();
        }
        for p in alone {
            let _ = p.written.send(None);
        }
    }
}
