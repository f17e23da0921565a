//! The reconcile runner: N workers take keys from a controller's [`WorkQueue`] and call its
//! `reconcile(key)`, which says "done", "look again after d", or fails (the key comes back
//! after its per-key backoff).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use crate::metrics::RuntimeMetrics;
use crate::queue::{EventClass, WorkQueue};

/// What a reconcile asks for next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// The object is where it should be; wait for the next event.
    Done,
    /// Look at it again after this long (a deadline, a timer).
    RequeueAfter(Duration),
}

/// A reconcile failure: the key is retried after its backoff — or, for a write that lost a
/// race (`409 Conflict`: the cache was behind), soon and without growing its backoff, since
/// the next look will see the newer object.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct ReconcileError {
    /// What failed.
    pub message: String,
    /// A write lost a race with another writer.
    pub conflict: bool,
}

impl ReconcileError {
    /// A failure retried after the key's backoff.
    pub fn new(message: impl Into<String>) -> Self {
        ReconcileError {
            message: message.into(),
            conflict: false,
        }
    }
}

/// How soon a key whose write lost a race is looked at again.
pub const CONFLICT_RETRY: Duration = Duration::from_millis(50);

impl From<tessera_client::status::ApiError> for ReconcileError {
    fn from(e: tessera_client::status::ApiError) -> Self {
        ReconcileError {
            message: format!("{} ({})", e.message, e.reason),
            conflict: e.code == 409,
        }
    }
}

/// A controller's reconcile: bring the object at `key` to its desired state, reading from
/// caches and writing through the API.
#[async_trait]
pub trait Reconciler: Send + Sync + 'static {
    /// The controller's name (logs and metrics).
    fn name(&self) -> &'static str;
    /// Reconciles one key.
    async fn reconcile(&self, key: &str) -> Result<Action, ReconcileError>;
}

/// Runs `workers` workers over `queue` until it is shut down.
pub async fn run<R: Reconciler + ?Sized>(
    reconciler: Arc<R>,
    queue: WorkQueue<String>,
    workers: usize,
    metrics: Option<RuntimeMetrics>,
) {
    let mut tasks = Vec::with_capacity(workers);
    for _ in 0..workers.max(1) {
        let r = reconciler.clone();
        let q = queue.clone();
        let m = metrics.clone();
        tasks.push(tokio::spawn(async move {
            while let Some(item) = q.get().await {
                let started = Instant::now();
                let result = r.reconcile(&item.key).await;
                let outcome = match &result {
                    Ok(Action::Done) => {
                        q.forget(&item.key);
                        "done"
                    }
                    Ok(Action::RequeueAfter(d)) => {
                        q.forget(&item.key);
                        q.add_after(item.key.clone(), EventClass::Resync, *d);
                        "requeue"
                    }
                    Err(e) if e.conflict => {
                        tracing::debug!(controller = r.name(), key = %item.key, error = %e, "a write lost a race; looking again");
                        q.add_after(item.key.clone(), item.class, CONFLICT_RETRY);
                        "conflict"
                    }
                    Err(e) => {
                        tracing::debug!(controller = r.name(), key = %item.key, error = %e, "reconcile failed; retrying");
                        q.retry(item.key.clone(), item.class);
                        "error"
                    }
                };
                if let Some(m) = &m {
                    m.reconciles.with_label_values(&[r.name(), outcome]).inc();
                }
                q.done(&item, started.elapsed());
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
}
