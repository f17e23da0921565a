//! Following one resource's objects in the store, for the few kinds the API server itself
//! acts on (CustomResourceDefinitions, admission webhook configurations): listed once, then
//! watched; a broken watch is resumed after listing again, and the follower stops when
//! its owner is dropped.

use std::future::Future;
use std::sync::{Arc, Weak};
use std::time::Duration;

use futures::StreamExt;
use serde_json::Value;
use tessera_store::{EventKind, ListRequest, Revision, Store};
use tokio::sync::{OnceCell, oneshot};

use crate::catalog;
use crate::status::ApiError;

/// The longest the first list of a followed kind may take before requests are refused.
const WAIT: Duration = Duration::from_secs(10);

/// What a follower keeps up to date.
pub(crate) trait Follower: Send + Sync + 'static {
    /// The store followed.
    fn store(&self) -> Arc<dyn Store>;
    /// The key prefix of the objects.
    fn prefix(&self) -> String;
    /// What is followed, for logs ("CustomResourceDefinitions").
    fn what(&self) -> &'static str;
    /// Lists every object again (after a broken watch), forgetting those gone: the revision
    /// to watch from.
    fn relist(self: &Arc<Self>) -> impl Future<Output = Result<Revision, ApiError>> + Send;
    /// One change: `obj` None when the object was deleted.
    fn apply(self: &Arc<Self>, key: &[u8], obj: Option<&Value>, rev: i64);
}

/// Follows `inner`'s objects from revision `from` until `inner` is dropped or `stopped`
/// fires.
pub(crate) async fn follow<F: Follower>(
    inner: Weak<F>,
    mut from: Revision,
    stopped: Option<oneshot::Receiver<()>>,
) {
    let Some(mut stopped) = stopped else {
        return;
    };
    let follow = async move {
        loop {
            let Some(strong) = inner.upgrade() else {
                return;
            };
            let (store, prefix, what) = (strong.store(), strong.prefix(), strong.what());
            drop(strong);
            match store.watch(prefix.as_bytes(), Some(from.clone())).await {
                Ok(mut stream) => {
                    while let Some(Ok(batch)) = stream.next().await {
                        let Some(strong) = inner.upgrade() else {
                            return;
                        };
                        for ev in &batch.events {
                            let obj = (ev.kind == EventKind::Put)
                                .then(|| serde_json::from_slice::<Value>(&ev.kv.value).ok())
                                .flatten();
                            if ev.kind == EventKind::Put && obj.is_none() {
                                continue;
                            }
                            strong.apply(&ev.kv.key, obj.as_ref(), ev.kv.mod_revision);
                        }
                        from = batch.revision;
                    }
                }
                Err(e) => tracing::warn!(error = %e, "watching {what}"),
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
            let Some(strong) = inner.upgrade() else {
                return;
            };
            match strong.relist().await {
                Ok(rev) => from = rev,
                Err(e) => tracing::warn!(error = %e.message, "listing {what} again"),
            }
        }
    };
    tokio::select! {
        _ = follow => {}
        _ = &mut stopped => {}
    }
}

/// One followed kind's objects, compiled: by name, the revision each was applied at and
/// what it compiled to (None: deleted at that revision, so an older event cannot bring it
/// back).
type Applied<T> = std::collections::BTreeMap<String, (i64, Option<T>)>;

/// The objects of one kind the API server acts on (webhook configurations, policies,
/// bindings, APIServices), followed and compiled.
pub(crate) struct Followed<T> {
    store: Arc<dyn Store>,
    group: &'static str,
    plural: &'static str,
    what: &'static str,
    compile: fn(&str, &Value) -> T,
    objects: parking_lot::Mutex<Applied<T>>,
    started: OnceCell<()>,
    _stop: oneshot::Sender<()>,
    stopped: parking_lot::Mutex<Option<oneshot::Receiver<()>>>,
    /// Called after every change (rebuilds the combined snapshot).
    changed: Arc<dyn Fn() + Send + Sync>,
}

impl<T: Clone + Send + Sync + 'static> Followed<T> {
    /// Follows `group`'s `plural` (called `what` in logs) in `store`, compiling each object
    /// with `compile` and calling `changed` after every change.
    pub(crate) fn new(
        store: Arc<dyn Store>,
        group: &'static str,
        plural: &'static str,
        what: &'static str,
        compile: fn(&str, &Value) -> T,
        changed: Arc<dyn Fn() + Send + Sync>,
    ) -> Arc<Followed<T>> {
        let (stop, stopped) = oneshot::channel();
        Arc::new(Followed {
            store,
            group,
            plural,
            what,
            compile,
            objects: Default::default(),
            started: OnceCell::new(),
            _stop: stop,
            stopped: parking_lot::Mutex::new(Some(stopped)),
            changed,
        })
    }

    fn resource(&self) -> &'static catalog::Resource {
        catalog::find(self.group, "v1", self.plural).expect("followed kinds are in the catalog")
    }

    fn name_of_key<'k>(&self, key: &'k [u8]) -> Option<&'k str> {
        let key = std::str::from_utf8(key).ok()?;
        key.strip_prefix(self.key_prefix().as_str())
    }

    fn key_prefix(&self) -> String {
        let res = self.resource();
        tessera_core::keys::resource_prefix(
            &tessera_core::keys::resource_segment(res.group, res.plural),
            None,
        )
    }

    /// Records a write through this server (`obj` None: deleted) once following has
    /// started, so the next request sees it before the watch delivers it.
    pub(crate) fn applied(self: &Arc<Self>, key: &[u8], obj: Option<&Value>, rev: i64) {
        if self.started.initialized() {
            self.apply(key, obj, rev);
        }
    }

    /// What the objects compiled to, in name order.
    pub(crate) fn current(&self) -> Vec<(String, T)> {
        self.objects
            .lock()
            .iter()
            .filter_map(|(name, (_, t))| Some((name.clone(), t.clone()?)))
            .collect()
    }

    /// Lists and starts following on first use.
    pub(crate) async fn start(self: &Arc<Self>) -> Result<(), ApiError> {
        if self.started.initialized() {
            return Ok(());
        }
        let init = async {
            let from = self.relist().await?;
            let stopped = self.stopped.lock().take();
            tokio::spawn(follow(Arc::downgrade(self), from, stopped));
            Ok::<(), ApiError>(())
        };
        match tokio::time::timeout(WAIT, self.started.get_or_try_init(|| init)).await {
            Ok(r) => r.map(|_| ()),
            Err(_) => Err(ApiError::new(
                503,
                "ServiceUnavailable",
                format!(
                    "the API server has not read its {} yet: the store did not answer within 10 s; retry",
                    self.what
                ),
            )),
        }
    }
}

impl<T: Clone + Send + Sync + 'static> Follower for Followed<T> {
    fn store(&self) -> Arc<dyn Store> {
        self.store.clone()
    }

    fn prefix(&self) -> String {
        self.key_prefix()
    }

    fn what(&self) -> &'static str {
        self.what
    }

    async fn relist(self: &Arc<Self>) -> Result<tessera_store::Revision, ApiError> {
        let page = self
            .store
            .list(ListRequest {
                prefix: self.key_prefix().into_bytes().into(),
                ..Default::default()
            })
            .await
            .map_err(|e| ApiError::internal(format!("listing {}: {e}", self.what)))?;
        let mut fresh = std::collections::BTreeMap::new();
        for kv in &page.kvs {
            let (Some(name), Ok(obj)) = (
                self.name_of_key(&kv.key),
                serde_json::from_slice::<Value>(&kv.value),
            ) else {
                continue;
            };
            fresh.insert(
                name.to_owned(),
                (kv.mod_revision, Some((self.compile)(name, &obj))),
            );
        }
        // What is gone is forgotten without a tombstone (a composite store's list revision
        // is not comparable with one key's).
        *self.objects.lock() = fresh;
        (self.changed)();
        Ok(page.revision)
    }

    fn apply(self: &Arc<Self>, key: &[u8], obj: Option<&Value>, rev: i64) {
        let Some(name) = self.name_of_key(key) else {
            return;
        };
        {
            let mut objects = self.objects.lock();
            if objects.get(name).is_some_and(|(at, _)| *at > rev) {
                return;
            }
            let compiled = obj.map(|o| (self.compile)(name, o));
            objects.insert(name.to_owned(), (rev, compiled));
        }
        (self.changed)();
    }
}
