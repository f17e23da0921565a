//! Controllers: a [`Controller`] declares what it watches and how each change maps to keys of
//! its [`WorkQueue`]; N workers take keys and call its `reconcile(key)`, which says "done",
//! "look again after d", or fails (the key comes back after its per-key backoff).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::future::BoxFuture;
use tokio::time::Instant;
use tracing::Instrument;

use crate::informer::{Change, Informer, Object, Subscription, Tasks, key_of, owner_key};
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
pub enum ReconcileError {
    /// A request to the API failed; its `Status` is the cause.
    #[error("{} ({})", .0.message, .0.reason)]
    Api(#[source] tessera_client::status::ApiError),
    /// A write lost a race with another writer that the API did not report as a conflict
    /// (an object appeared meanwhile): look again soon.
    #[error("{0}")]
    Raced(String),
    /// Anything else: an object that did not decode, a precondition not met yet.
    #[error("{0}")]
    Failed(String),
}

impl ReconcileError {
    /// A failure retried after the key's backoff.
    pub fn new(message: impl Into<String>) -> Self {
        ReconcileError::Failed(message.into())
    }

    /// A lost race, retried soon without growing the key's backoff.
    pub fn raced(message: impl Into<String>) -> Self {
        ReconcileError::Raced(message.into())
    }

    /// True for a write that lost a race (`409`, or [`ReconcileError::Raced`]).
    pub fn is_conflict(&self) -> bool {
        match self {
            ReconcileError::Api(e) => e.code == 409,
            ReconcileError::Raced(_) => true,
            ReconcileError::Failed(_) => false,
        }
    }
}

/// How soon a key whose write lost a race is looked at again.
pub const CONFLICT_RETRY: Duration = Duration::from_millis(50);

impl From<tessera_client::status::ApiError> for ReconcileError {
    fn from(e: tessera_client::status::ApiError) -> Self {
        ReconcileError::Api(e)
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

/// Runs `workers` workers over `queue` until it is shut down, or until this future is
/// dropped: the workers stop with it (a worker left running would go on reconciling for a
/// controller that was stopped — after a lost leadership, say).
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
                let span = tracing::debug_span!("reconcile", controller = r.name(), key = %item.key);
                let result = r.reconcile(&item.key).instrument(span).await;
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
                    Err(e) if e.is_conflict() => {
                        tracing::debug!(controller = r.name(), key = %item.key, error = %e, "a write lost a race; looking again");
                        q.add_after(item.key.clone(), item.class, CONFLICT_RETRY);
                        "conflict"
                    }
                    Err(e) => {
                        tracing::warn!(controller = r.name(), key = %item.key, error = %e, "reconcile failed; retrying after backoff");
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
    let mut workers = Tasks(tasks);
    for t in &mut workers.0 {
        let _ = t.await;
    }
}

/// A controller put together from what it watches (kube-rs' `Controller::new(..).owns(..)`):
/// each watched informer maps its changes to keys of the controller's queue, and
/// [`Controller::run`] waits for every informer's first list, then reconciles keys until the
/// future is dropped — which also removes the controller's handlers from the (shared)
/// informers.
#[must_use = "a controller does nothing until it is run"]
pub struct Controller {
    queue: WorkQueue<String>,
    workers: usize,
    metrics: Option<RuntimeMetrics>,
    subscriptions: Vec<Subscription>,
    synced: Vec<BoxFuture<'static, ()>>,
}

impl Controller {
    /// A controller working `queue` with `workers` workers.
    pub fn new(queue: WorkQueue<String>, workers: usize, metrics: Option<RuntimeMetrics>) -> Self {
        Controller {
            queue,
            workers,
            metrics,
            subscriptions: Vec::new(),
            synced: Vec::new(),
        }
    }

    /// Its queue (for reconcilers and handlers that queue keys themselves).
    pub fn queue(&self) -> &WorkQueue<String> {
        &self.queue
    }

    /// Queues the key of every object of `informer` that changes, with the change's class:
    /// the kind the controller reconciles.
    pub fn watches<T: Object>(self, informer: &Arc<Informer<T>>) -> Self {
        self.watches_with(informer, |c, q| {
            q.add(key_of(c.object().metadata()), c.class());
        })
    }

    /// Queues the key of the controller owner of every object of `informer` that changes,
    /// when that owner is a `kind` (a CronJob's Jobs, a Deployment's ReplicaSets), as an
    /// update of the owner.
    pub fn owns<T: Object>(self, informer: &Arc<Informer<T>>, kind: &'static str) -> Self {
        self.watches_with(informer, move |c, q| {
            if let Some(k) = owner_key(c.object().metadata(), kind) {
                q.add(k, EventClass::Update);
            }
        })
    }

    /// Calls `map` with every change of `informer` and the queue: for mappings of its own
    /// (expectations, orphans, every set a node may concern). `map` must be quick.
    pub fn watches_with<T: Object>(
        mut self,
        informer: &Arc<Informer<T>>,
        map: impl Fn(&Change<T>, &WorkQueue<String>) + Send + Sync + 'static,
    ) -> Self {
        let q = self.queue.clone();
        self.subscriptions
            .push(informer.on_change(move |c| map(c, &q)));
        self.reads(informer)
    }

    /// Waits for `informer`'s first list before the first reconcile, without queueing
    /// anything on its changes (a cache the reconcile only reads).
    pub fn reads<T: Object>(mut self, informer: &Arc<Informer<T>>) -> Self {
        let inf = informer.clone();
        self.synced
            .push(Box::pin(async move { inf.synced().await }));
        self
    }

    /// Waits for every informer's first list, then runs `reconciler` until dropped.
    pub async fn run<R: Reconciler + ?Sized>(self, reconciler: Arc<R>) {
        let Controller {
            queue,
            workers,
            metrics,
            subscriptions,
            synced,
        } = self;
        for s in synced {
            s.await;
        }
        tracing::info!(controller = reconciler.name(), "caches synced; reconciling");
        run(reconciler, queue, workers, metrics).await;
        drop(subscriptions);
    }
}
