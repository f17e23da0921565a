//! Periodic compaction for any backend, the way kube-apiserver does it: at every tick,
//! compact to the revision seen at the previous tick, so at least one interval of history
//! always remains for watches to resume from, and memory (or etcd's database) stays bounded.

use std::sync::Arc;
use std::time::Duration;

use crate::Store;
use crate::error::StoreError;
use crate::types::Revision;

/// Runs until the store closes. Compaction errors are logged and retried next tick.
pub async fn run(store: Arc<dyn Store>, interval: Duration) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    let mut previous: Option<Revision> = None;
    loop {
        tick.tick().await;
        let current = match store.current_revision().await {
            Ok(r) => r,
            Err(StoreError::Closed(_)) => return,
            Err(e) => {
                tracing::warn!(error = %e, "compactor: reading the current revision failed");
                continue;
            }
        };
        if let Some(target) = previous.take() {
            match store.compact(&target).await {
                Ok(()) => tracing::info!(revision = %target, "compacted"),
                // Already compacted to there (another compactor, or nothing written).
                Err(StoreError::Compacted { .. }) => {}
                Err(StoreError::Closed(_)) => return,
                Err(e) => tracing::warn!(error = %e, revision = %target, "compaction failed"),
            }
        }
        previous = Some(current);
    }
}
