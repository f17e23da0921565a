//! What every controller is built with, and the plumbing they share: the process's shared
//! informers, a queue per controller, and its workers.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::Metadata;
use k8s_openapi::api::core::v1::Namespace;
use tessera_client::catalog::Resource;
use tessera_client::client::Client;
use tessera_runtime::controller::{Controller, Reconciler};
use tessera_runtime::events::Recorder;
use tessera_runtime::informer::{Cache, Change, Informer, Object, key_of};
use tessera_runtime::metrics::{QueueMetrics, RuntimeMetrics};
use tessera_runtime::{Informers, QueueConfig, WorkQueue};

use crate::clock::{Clock, SystemClock};

/// Shared by all controllers of a process.
#[derive(Clone)]
pub struct Context {
    /// The API.
    pub client: Arc<dyn Client>,
    /// Work queue metrics.
    pub queue_metrics: Option<QueueMetrics>,
    /// Informer, reconcile and event metrics.
    pub runtime_metrics: Option<RuntimeMetrics>,
    /// Workers per controller.
    pub workers: usize,
    /// The wall clock (schedules read it).
    pub clock: Arc<dyn Clock>,
    /// The informers every controller of the process reads (and the scheduler and node
    /// agents too, where they run in the same process on the same API).
    pub informers: Arc<Informers>,
    /// The least time between two status writes of one workload that only follow its pods'
    /// (or ReplicaSets') progress: changes within it are written together. A workload at
    /// rest is written at once. Zero: every change is written as it comes.
    pub status_batch: Duration,
}

pub use tessera_runtime::queue::DEFAULT_STATUS_BATCH;

impl Context {
    /// A context with 4 workers per controller, no metrics and informers of its own.
    pub fn new(client: Arc<dyn Client>) -> Context {
        Context {
            informers: Informers::new(client.clone(), None),
            client,
            queue_metrics: None,
            runtime_metrics: None,
            workers: 4,
            clock: Arc::new(SystemClock),
            status_batch: DEFAULT_STATUS_BATCH,
        }
    }

    /// The shared informer of `resource` in all namespaces.
    pub fn informer<T: Object>(&self, resource: &'static Resource) -> Arc<Informer<T>> {
        self.informers.get(resource)
    }

    /// A controller named `name`, with its queue and this context's workers.
    pub fn controller(&self, name: &str) -> Controller {
        Controller::new(self.queue(name), self.workers, self.runtime_metrics.clone())
    }

    /// A work queue named after the controller.
    pub fn queue(&self, name: &str) -> WorkQueue<String> {
        WorkQueue::new(
            QueueConfig::new(name).with_throttle(self.status_batch),
            None,
            self.queue_metrics.clone(),
        )
    }

    /// An Event recorder for `component`.
    pub fn recorder(&self, component: &str) -> Recorder {
        Recorder::new(self.client.clone(), component, self.runtime_metrics.clone())
    }
}

/// A served resource by group and plural, in its stored version (the catalog always has the
/// ones controllers use).
pub fn res(group: &str, plural: &str) -> &'static Resource {
    tessera_client::catalog::RESOURCES
        .iter()
        .find(|r| r.group == group && r.plural == plural)
        .expect("the catalog serves every controller's kinds")
}

/// Runs a controller that keeps one object (`name`, of kind `T`) in every namespace: a change
/// of a namespace, or of that object in a namespace, queues the namespace's name. `make`
/// builds the reconciler from the two caches.
pub(crate) async fn run_per_namespace<T, R>(
    ctx: Context,
    controller: &'static str,
    resource: &'static Resource,
    name: &'static str,
    make: impl FnOnce(Arc<Cache<Namespace>>, Arc<Cache<T>>) -> R,
) where
    T: Object,
    R: Reconciler + 'static,
{
    let namespaces = ctx.informer::<Namespace>(res("", "namespaces"));
    let objects = ctx.informer::<T>(resource);
    let r = Arc::new(make(namespaces.cache().clone(), objects.cache().clone()));
    ctx.controller(controller)
        .watches_with(&namespaces, |c, q| {
            if !matches!(c, Change::Deleted(_)) {
                q.add(key_of(c.object().metadata()), c.class());
            }
        })
        .watches_with(&objects, move |c, q| {
            let meta = c.object().metadata();
            if let (Some(ns), Some(n)) = (&meta.namespace, meta.name.as_deref())
                && n == name
            {
                q.add(ns.clone(), c.class());
            }
        })
        .run(r)
        .await;
}
