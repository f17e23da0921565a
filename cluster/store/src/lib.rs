//! Tessera's key-value store: one trait with Kubernetes' storage semantics (revisions,
//! compare-and-swap transactions, watches from a revision, leases, compaction) and three
//! backends — embedded (durable, in-process), etcd, and sharded (routes keys over several).

pub mod compactor;
pub mod continuation;
pub mod embedded;
pub mod encrypted;
pub mod error;
pub mod etcd;
#[cfg(feature = "etcd-process")]
pub mod etcd_process;
pub mod instrumented;
pub mod metrics;
pub mod sharded;
#[cfg(feature = "testing")]
pub mod testing;
pub mod types;
pub mod validation;

use async_trait::async_trait;
use bytes::Bytes;

pub use embedded::{EmbeddedOptions, EmbeddedStore};
pub use encrypted::{Encrypted, EncryptionConfig};
pub use error::{PreconditionFailure, PreconditionKind, Result, StoreError};
pub use etcd::{EtcdOptions, EtcdStore, EtcdTls};
pub use instrumented::Instrumented;
pub use metrics::StoreMetrics;
pub use sharded::{ShardedStore, ShardingConfig};
pub use types::{
    EventKind, KeyValue, LeaseId, ListRequest, ListResponse, Op, OpResult, Revision, TxnResponse,
    WatchBatch, WatchEvent, WatchStream,
};

/// A key-value store with Kubernetes' storage semantics. Keys follow Kubernetes' layout
/// (`/registry/<resource>/<namespace>/<name>`); values are opaque bytes.
///
/// Every backend passes the same conformance suite (`testing::conformance`).
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// A short fixed name for logs and metric labels ("embedded", "etcd", "sharded").
    fn backend(&self) -> &'static str;

    /// Which transaction group `key` belongs to: keys of one group may be written in one
    /// transaction, keys of different groups may not (a sharded store's backends). Writers
    /// that batch unrelated writes (the API's group commit) split batches by it.
    fn txn_group(&self, key: &[u8]) -> usize {
        let _ = key;
        0
    }

    /// The key's current value.
    async fn get(&self, key: &[u8]) -> Result<Option<KeyValue>>;

    /// One page of the keys under a prefix, at the latest or a given revision.
    async fn list(&self, req: ListRequest) -> Result<ListResponse>;

    /// Commits all operations at one revision if every precondition holds, else nothing
    /// (`StoreError::PreconditionFailed` names the first that failed).
    async fn txn(&self, ops: Vec<Op>) -> Result<TxnResponse>;

    /// Every change under `prefix` after revision `after` (`None`: from now), in order,
    /// exactly once, with the previous values, plus periodic progress notifications.
    /// `StoreError::Compacted` if `after` is older than the last compaction.
    async fn watch(&self, prefix: &[u8], after: Option<Revision>) -> Result<WatchStream>;

    /// Grants a lease of `ttl` seconds.
    async fn lease_grant(&self, ttl: i64) -> Result<LeaseId>;

    /// Renews a lease; returns its TTL in seconds.
    async fn lease_keep_alive(&self, id: LeaseId) -> Result<i64>;

    /// Revokes a lease, deleting the keys attached to it.
    async fn lease_revoke(&self, id: LeaseId) -> Result<()>;

    /// Drops the history before `revision`: reads at older revisions and watches from them
    /// fail with `Compacted` afterwards.
    async fn compact(&self, revision: &Revision) -> Result<()>;

    /// The current revision.
    async fn current_revision(&self) -> Result<Revision>;

    /// Writes a consistent copy of the whole store, as of now, to the new file `out` (the
    /// embedded store's snapshot format). Backends that cannot say what to use instead.
    async fn backup(&self, _out: &std::path::Path) -> Result<embedded::BackupInfo> {
        Err(StoreError::Unsupported(format!(
            "the {} store takes no backups here; back its data up with its own tools (etcd: `etcdctl snapshot save`)",
            self.backend()
        )))
    }

    /// Creates a key that must not exist.
    async fn create(&self, key: Bytes, value: Bytes) -> Result<KeyValue> {
        written(
            self.txn(vec![Op::Create {
                key,
                value,
                lease: 0,
            }])
            .await?,
        )
    }

    /// Overwrites a key if its mod revision is still `expected`.
    async fn update(&self, key: Bytes, value: Bytes, expected: i64) -> Result<KeyValue> {
        written(
            self.txn(vec![Op::Update {
                key,
                value,
                expected,
                lease: 0,
            }])
            .await?,
        )
    }

    /// Writes a key whatever its state.
    async fn put(&self, key: Bytes, value: Bytes) -> Result<KeyValue> {
        written(
            self.txn(vec![Op::Put {
                key,
                value,
                lease: 0,
            }])
            .await?,
        )
    }

    /// Deletes a key (at `expected` mod revision, if given); returns its last value.
    async fn delete(&self, key: Bytes, expected: Option<i64>) -> Result<KeyValue> {
        let resp = self.txn(vec![Op::Delete { key, expected }]).await?;
        match resp.results.into_iter().next() {
            Some(OpResult::Deleted(kv)) => Ok(kv),
            other => Err(StoreError::Internal(format!(
                "backend answered a delete with {other:?}"
            ))),
        }
    }
}

fn written(resp: TxnResponse) -> Result<KeyValue> {
    match resp.results.into_iter().next() {
        Some(OpResult::Written(kv)) => Ok(kv),
        other => Err(StoreError::Internal(format!(
            "backend answered a write with {other:?}"
        ))),
    }
}
