//! Following one resource's objects in the store, for the few kinds the API server itself
//! acts on (CustomResourceDefinitions, admission webhook configurations): listed once, then
//! watched; a broken watch is resumed after listing again, and the follower stops when
//! its owner is dropped.

use std::future::Future;
use std::sync::{Arc, Weak};
use std::time::Duration;

use futures::StreamExt;
use serde_json::Value;
use tessera_store::{EventKind, Revision, Store};
use tokio::sync::oneshot;

use crate::status::ApiError;

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
