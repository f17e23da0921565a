//! Test support shared by the conformance suite, the crash test and the benchmarks: harnesses
//! that build each backend (and restart it), a real etcd process, and the suite itself.

pub mod conformance;
pub mod model;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

pub use crate::etcd_process::EtcdProcess;
use crate::metrics::StoreMetrics;
use crate::{EmbeddedOptions, EmbeddedStore, ShardedStore, Store};

/// A backend under test that can be restarted with its data kept.
#[async_trait]
pub trait Harness: Send + Sync {
    /// The store as it is now (a new handle after each restart).
    fn store(&self) -> Arc<dyn Store>;
    /// Stops the backend abruptly where possible (SIGKILL for etcd) and starts it again on
    /// the same data; returns once it answers.
    async fn restart(&mut self);
}

/// Embedded options for tests: small snapshots so that snapshotting runs, quick progress.
pub fn test_embedded_options() -> EmbeddedOptions {
    EmbeddedOptions {
        segment_bytes: 256 << 10,
        snapshot_threshold_bytes: 64 << 10,
        progress_interval: Duration::from_secs(1),
        lease_check_interval: Duration::from_millis(100),
        watch_batch: 64,
    }
}

/// The embedded store in a temporary directory.
pub struct EmbeddedHarness {
    dir: tempfile::TempDir,
    store: EmbeddedStore,
}

impl EmbeddedHarness {
    /// Opens a fresh store.
    pub async fn new() -> EmbeddedHarness {
        let dir = tempfile::Builder::new()
            .prefix("tessera-embedded-")
            .tempdir()
            .unwrap_or_else(|e| panic!("tempdir: {e}"));
        let store = open_embedded(dir.path()).await;
        EmbeddedHarness { dir, store }
    }
}

async fn open_embedded(dir: &std::path::Path) -> EmbeddedStore {
    EmbeddedStore::open(dir, test_embedded_options(), StoreMetrics::detached())
        .await
        .unwrap_or_else(|e| panic!("opening the embedded store: {e}"))
}

#[async_trait]
impl Harness for EmbeddedHarness {
    fn store(&self) -> Arc<dyn Store> {
        Arc::new(self.store.clone())
    }

    async fn restart(&mut self) {
        let _ = self.store.close().await;
        self.store = open_embedded(self.dir.path()).await;
    }
}

/// The embedded store with every value encrypted (`*.*`, AES-GCM): the conformance suite
/// run through [`crate::Encrypted`] shows the wrapper changes nothing a client can see.
pub struct EncryptedEmbeddedHarness {
    inner: EmbeddedHarness,
}

impl EncryptedEmbeddedHarness {
    /// Opens a fresh store.
    pub async fn new() -> EncryptedEmbeddedHarness {
        EncryptedEmbeddedHarness {
            inner: EmbeddedHarness::new().await,
        }
    }
}

fn encrypt_everything() -> crate::EncryptionConfig {
    crate::EncryptionConfig::from_json(&serde_json::json!({
        "kind": "EncryptionConfiguration",
        "resources": [{"resources": ["*.*"], "providers": [
            {"aesgcm": {"keys": [{"name": "k1", "secret": "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="}]}}]}]}))
    .unwrap_or_else(|e| panic!("{e}"))
}

#[async_trait]
impl Harness for EncryptedEmbeddedHarness {
    fn store(&self) -> Arc<dyn Store> {
        Arc::new(crate::Encrypted::new(
            self.inner.store(),
            encrypt_everything(),
        ))
    }

    async fn restart(&mut self) {
        self.inner.restart().await;
    }
}

/// One real etcd process.
pub struct EtcdHarness {
    etcd: EtcdProcess,
    store: Arc<dyn Store>,
}

impl EtcdHarness {
    /// Starts etcd.
    pub async fn new() -> EtcdHarness {
        let etcd = EtcdProcess::start()
            .await
            .unwrap_or_else(|e| panic!("starting etcd: {e}"));
        let store = etcd.store().await;
        EtcdHarness { etcd, store }
    }
}

#[async_trait]
impl Harness for EtcdHarness {
    fn store(&self) -> Arc<dyn Store> {
        self.store.clone()
    }

    async fn restart(&mut self) {
        self.etcd.kill();
        self.etcd
            .start_again()
            .await
            .unwrap_or_else(|e| panic!("restarting etcd: {e}"));
    }
}

/// The sharded store over embedded stores: a default backend, `events` on a backend of its
/// own, and two tenant shards.
pub struct ShardedEmbeddedHarness {
    dirs: Vec<tempfile::TempDir>,
    stores: Vec<EmbeddedStore>,
    store: Arc<dyn Store>,
}

fn sharded(parts: Vec<Arc<dyn Store>>, events_override: bool) -> Arc<dyn Store> {
    let mut parts = parts.into_iter();
    let default = parts.next().unwrap_or_else(|| panic!("no parts"));
    let overrides = if events_override {
        vec![(
            "events".to_owned(),
            parts.next().unwrap_or_else(|| panic!("no events part")),
        )]
    } else {
        Vec::new()
    };
    Arc::new(ShardedStore::new(
        tessera_core::keys::ROOT,
        default,
        overrides,
        parts.collect(),
    ))
}

impl ShardedEmbeddedHarness {
    /// Opens four embedded stores and shards over them.
    pub async fn new() -> ShardedEmbeddedHarness {
        let mut dirs = Vec::new();
        let mut stores = Vec::new();
        for _ in 0..4 {
            let dir = tempfile::Builder::new()
                .prefix("tessera-sharded-")
                .tempdir()
                .unwrap_or_else(|e| panic!("tempdir: {e}"));
            stores.push(open_embedded(dir.path()).await);
            dirs.push(dir);
        }
        let store = sharded(
            stores
                .iter()
                .map(|s| Arc::new(s.clone()) as Arc<dyn Store>)
                .collect(),
            true,
        );
        ShardedEmbeddedHarness {
            dirs,
            stores,
            store,
        }
    }
}

#[async_trait]
impl Harness for ShardedEmbeddedHarness {
    fn store(&self) -> Arc<dyn Store> {
        self.store.clone()
    }

    async fn restart(&mut self) {
        for s in &self.stores {
            let _ = s.close().await;
        }
        self.stores.clear();
        for d in &self.dirs {
            self.stores.push(open_embedded(d.path()).await);
        }
        self.store = sharded(
            self.stores
                .iter()
                .map(|s| Arc::new(s.clone()) as Arc<dyn Store>)
                .collect(),
            true,
        );
    }
}

/// The sharded store over two real etcd processes: cluster-scoped keys on the first,
/// namespaced keys on the second (a tenant shard).
pub struct ShardedEtcdHarness {
    etcds: Vec<EtcdProcess>,
    store: Arc<dyn Store>,
}

impl ShardedEtcdHarness {
    /// Starts two etcd processes.
    pub async fn new() -> ShardedEtcdHarness {
        let (a, b) = tokio::join!(EtcdProcess::start(), EtcdProcess::start());
        let etcds = vec![
            a.unwrap_or_else(|e| panic!("starting etcd: {e}")),
            b.unwrap_or_else(|e| panic!("starting etcd: {e}")),
        ];
        let store = sharded(vec![etcds[0].store().await, etcds[1].store().await], false);
        ShardedEtcdHarness { etcds, store }
    }
}

#[async_trait]
impl Harness for ShardedEtcdHarness {
    fn store(&self) -> Arc<dyn Store> {
        self.store.clone()
    }

    async fn restart(&mut self) {
        for e in &mut self.etcds {
            e.kill();
        }
        for e in &mut self.etcds {
            e.start_again()
                .await
                .unwrap_or_else(|e| panic!("restarting etcd: {e}"));
        }
        self.store = sharded(
            vec![self.etcds[0].store().await, self.etcds[1].store().await],
            false,
        );
    }
}
