//! A `Store` wrapper that records request latency and results in Prometheus, so every
//! backend is measured the same way.

use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use futures::StreamExt;
use prometheus::IntGauge;

use crate::Store;
use crate::error::Result;
use crate::metrics::StoreMetrics;
use crate::types::{
    KeyValue, LeaseId, ListRequest, ListResponse, Op, Revision, TxnResponse, WatchStream,
};

/// Wraps a store and records `tessera_store_request_duration_seconds{backend,op}` and
/// `tessera_store_requests_total{backend,op,result}` for every call.
pub struct Instrumented {
    inner: Arc<dyn Store>,
    metrics: Arc<StoreMetrics>,
}

impl Instrumented {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn Store>, metrics: Arc<StoreMetrics>) -> Self {
        Instrumented { inner, metrics }
    }

    fn record<T>(&self, op: &'static str, started: Instant, result: &Result<T>) {
        let backend = self.inner.backend();
        self.metrics
            .request_duration
            .with_label_values(&[backend, op])
            .observe(started.elapsed().as_secs_f64());
        let label = match result {
            Ok(_) => "ok",
            Err(e) => e.label(),
        };
        self.metrics
            .requests
            .with_label_values(&[backend, op, label])
            .inc();
    }
}

/// Counts an open watch in `tessera_store_watchers` for as long as it lives.
struct OpenWatch(IntGauge);

impl OpenWatch {
    fn new(gauge: IntGauge) -> Self {
        gauge.inc();
        OpenWatch(gauge)
    }
}

impl Drop for OpenWatch {
    fn drop(&mut self) {
        self.0.dec();
    }
}

#[async_trait]
impl Store for Instrumented {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }

    fn txn_group(&self, key: &[u8]) -> usize {
        self.inner.txn_group(key)
    }

    async fn get(&self, key: &[u8]) -> Result<Option<KeyValue>> {
        let t = Instant::now();
        let r = self.inner.get(key).await;
        self.record("get", t, &r);
        r
    }

    async fn list(&self, req: ListRequest) -> Result<ListResponse> {
        let t = Instant::now();
        let r = self.inner.list(req).await;
        self.record("list", t, &r);
        r
    }

    async fn txn(&self, ops: Vec<Op>) -> Result<TxnResponse> {
        let t = Instant::now();
        let r = self.inner.txn(ops).await;
        self.record("txn", t, &r);
        r
    }

    async fn watch(&self, prefix: &[u8], after: Option<Revision>) -> Result<WatchStream> {
        let t = Instant::now();
        let r = self.inner.watch(prefix, after).await;
        self.record("watch", t, &r);
        let stream = r?;
        let backend = self.inner.backend();
        let events = self.metrics.watch_events.with_label_values(&[backend]);
        let open = OpenWatch::new(self.metrics.watchers.with_label_values(&[backend]));
        Ok(Box::pin(stream.inspect(move |item| {
            // Moved in so that the gauge drops when the stream does.
            let _open = &open;
            if let Ok(batch) = item {
                events.inc_by(batch.events.len() as u64);
            }
        })))
    }

    async fn lease_grant(&self, ttl: i64) -> Result<LeaseId> {
        let t = Instant::now();
        let r = self.inner.lease_grant(ttl).await;
        self.record("lease_grant", t, &r);
        r
    }

    async fn lease_keep_alive(&self, id: LeaseId) -> Result<i64> {
        let t = Instant::now();
        let r = self.inner.lease_keep_alive(id).await;
        self.record("lease_keep_alive", t, &r);
        r
    }

    async fn lease_revoke(&self, id: LeaseId) -> Result<()> {
        let t = Instant::now();
        let r = self.inner.lease_revoke(id).await;
        self.record("lease_revoke", t, &r);
        r
    }

    async fn backup(&self, out: &std::path::Path) -> Result<crate::embedded::BackupInfo> {
        let t = Instant::now();
        let r = self.inner.backup(out).await;
        self.record("backup", t, &r);
        r
    }

    async fn compact(&self, revision: &Revision) -> Result<()> {
        let t = Instant::now();
        let r = self.inner.compact(revision).await;
        self.record("compact", t, &r);
        r
    }

    async fn current_revision(&self) -> Result<Revision> {
        let t = Instant::now();
        let r = self.inner.current_revision().await;
        self.record("current_revision", t, &r);
        r
    }
}
