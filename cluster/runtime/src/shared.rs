//! Shared informers: one list+watch cache per resource per process, handed to every
//! controller, the scheduler and the node agents of the process (client-go's
//! SharedInformerFactory). Each change is then read off the watch and decoded once, however
//! many parts of the process read that kind.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use tessera_client::catalog::Resource;
use tessera_client::client::Client;
use tokio::task::JoinHandle;

use crate::informer::{Informer, Object, Scope};
use crate::metrics::RuntimeMetrics;

/// An informer is shared by its resource and the type it decodes objects into (a typed
/// `Pod` and a metadata-only view of pods are two caches).
type Key = (&'static str, &'static str, &'static str, TypeId);

struct Running {
    informer: Arc<dyn Any + Send + Sync>,
    plural: &'static str,
    task: JoinHandle<()>,
}

/// The informers of one process (or of one shard, where a process runs several), each
/// started on first use and stopped when the last holder of this drops it.
pub struct Informers {
    client: Arc<dyn Client>,
    metrics: Option<RuntimeMetrics>,
    running: Mutex<HashMap<Key, Running>>,
}

impl Informers {
    /// Informers that list and watch through `client`.
    pub fn new(client: Arc<dyn Client>, metrics: Option<RuntimeMetrics>) -> Arc<Informers> {
        Arc::new(Informers {
            client,
            metrics,
            running: Mutex::new(HashMap::new()),
        })
    }

    /// The client the informers read through.
    pub fn client(&self) -> &Arc<dyn Client> {
        &self.client
    }

    /// The informer of every object of `resource`, decoded as `T`: the running one, or a new
    /// one started now (so this must be called inside a Tokio runtime). A handler added to it
    /// sees the objects already cached as additions first (see [`Informer::on_change`]).
    pub fn get<T: Object>(&self, resource: &'static Resource) -> Arc<Informer<T>> {
        let key = (
            resource.group,
            resource.version,
            resource.plural,
            TypeId::of::<T>(),
        );
        let mut running = self.running.lock();
        if let Some(r) = running.get(&key)
            && let Ok(informer) = r.informer.clone().downcast::<Informer<T>>()
        {
            return informer;
        }
        let informer = Informer::<T>::new(
            self.client.clone(),
            resource,
            Scope::default(),
            self.metrics.clone(),
        );
        let task = tokio::spawn(informer.clone().run());
        if let Some(m) = &self.metrics {
            m.informers.with_label_values(&[resource.plural]).inc();
        }
        running.insert(
            key,
            Running {
                informer: informer.clone(),
                plural: resource.plural,
                task,
            },
        );
        informer
    }

    /// How many informers run (one per resource and decoded type).
    pub fn len(&self) -> usize {
        self.running.lock().len()
    }

    /// True if none has been asked for yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Drop for Informers {
    fn drop(&mut self) {
        for (_, r) in self.running.get_mut().drain() {
            r.task.abort();
            if let Some(m) = &self.metrics {
                m.informers.with_label_values(&[r.plural]).dec();
            }
        }
    }
}

impl std::fmt::Debug for Informers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Informers")
            .field("running", &self.len())
            .finish()
    }
}
