//! The store a benchmark runs against: a fresh embedded directory, a given etcd, or an etcd
//! process started on loopback for the run.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::ValueEnum;
use tessera_store::etcd_process::EtcdProcess;
use tessera_store::{
    EmbeddedOptions, EmbeddedStore, EtcdOptions, EtcdStore, Instrumented, Store, StoreMetrics,
};

/// Backends a benchmark can measure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum BenchBackend {
    /// The embedded store, in a fresh directory.
    Embedded,
    /// An etcd cluster (`--etcd-servers`), or a local etcd process started for the run.
    Etcd,
}

/// Where benchmark stores come from; keeps a local etcd alive for the whole run.
pub struct Target {
    backend: BenchBackend,
    data_dir: Option<PathBuf>,
    etcd_urls: Vec<String>,
    _local_etcd: Option<EtcdProcess>,
}

/// A store for one measurement; its embedded directory is removed when dropped.
pub struct BenchStore {
    /// The store, instrumented like a real process's.
    pub store: Arc<dyn Store>,
    _dir: Option<tempfile::TempDir>,
}

impl Target {
    /// Resolves the backend; starts etcd when it is asked for without `--etcd-servers`.
    pub async fn new(
        backend: BenchBackend,
        etcd_servers: Option<&str>,
        data_dir: Option<PathBuf>,
    ) -> anyhow::Result<Target> {
        let mut local = None;
        let etcd_urls = match (backend, etcd_servers) {
            (BenchBackend::Etcd, Some(urls)) => urls.split(',').map(str::to_owned).collect(),
            (BenchBackend::Etcd, None) => {
                eprintln!(
                    "starting a local etcd for the run (pass --etcd-servers to use your own)"
                );
                let p = EtcdProcess::start().await.context("starting etcd")?;
                let urls = vec![p.url()];
                local = Some(p);
                urls
            }
            (BenchBackend::Embedded, _) => Vec::new(),
        };
        Ok(Target {
            backend,
            data_dir,
            etcd_urls,
            _local_etcd: local,
        })
    }

    /// The etcd members, for plain-client comparisons.
    pub fn etcd_urls(&self) -> &[String] {
        &self.etcd_urls
    }

    /// A store: a fresh embedded directory each call, or a new connection to the etcd.
    pub async fn open(&self) -> anyhow::Result<BenchStore> {
        let metrics = StoreMetrics::detached();
        let (inner, dir): (Arc<dyn Store>, _) = match self.backend {
            BenchBackend::Embedded => {
                let parent = self.data_dir.clone().unwrap_or_else(std::env::temp_dir);
                std::fs::create_dir_all(&parent)?;
                let dir = tempfile::Builder::new()
                    .prefix("tessera-bench-")
                    .tempdir_in(&parent)?;
                let store =
                    EmbeddedStore::open(dir.path(), EmbeddedOptions::default(), metrics.clone())
                        .await?;
                (Arc::new(store), Some(dir))
            }
            BenchBackend::Etcd => (
                Arc::new(
                    EtcdStore::connect(EtcdOptions::new(self.etcd_urls.clone()), metrics.clone())
                        .await?,
                ),
                None,
            ),
        };
        Ok(BenchStore {
            store: Arc::new(Instrumented::new(inner, metrics)),
            _dir: dir,
        })
    }
}
