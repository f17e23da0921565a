//! The store's Prometheus metrics, registered into a registry the caller owns (and tests read).

use std::sync::Arc;

use prometheus::{
    Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGaugeVec, Opts, Registry,
};

/// Latency buckets for store requests: 50 µs to 10 s.
const LATENCY_BUCKETS: &[f64] = &[
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 5.0, 10.0,
];

/// Every store metric. Labels come from small fixed sets: backend name, operation, result.
#[derive(Clone)]
pub struct StoreMetrics {
    /// `tessera_store_request_duration_seconds{backend,op}`.
    pub request_duration: HistogramVec,
    /// `tessera_store_requests_total{backend,op,result}`.
    pub requests: IntCounterVec,
    /// `tessera_store_watchers{backend}`: open watches.
    pub watchers: IntGaugeVec,
    /// `tessera_store_watch_events_total{backend}`: events delivered to watches.
    pub watch_events: IntCounterVec,
    /// `tessera_store_revision{backend}`: the current revision.
    pub revision: IntGaugeVec,
    /// `tessera_store_compacted_revision{backend}`: the last compaction's revision.
    pub compacted_revision: IntGaugeVec,
    /// `tessera_store_keys{backend}`: keys that exist now (embedded only).
    pub keys: IntGaugeVec,
    /// `tessera_store_embedded_commit_batch_size`: transactions per group commit.
    pub commit_batch: Histogram,
    /// `tessera_store_embedded_fsync_duration_seconds`: one log flush.
    pub fsync_duration: Histogram,
    /// `tessera_store_embedded_wal_bytes_total`.
    pub wal_bytes: IntCounter,
    /// `tessera_store_embedded_snapshot_duration_seconds`.
    pub snapshot_duration: Histogram,
    /// `tessera_store_embedded_recovery_duration_seconds`: opening from disk.
    pub recovery_duration: Histogram,
    /// `tessera_store_retries_total{backend,op}`: requests retried after a transient failure.
    pub retries: IntCounterVec,
    /// `tessera_store_watch_reconnects_total{backend}`: watches resumed after a lost stream.
    pub watch_reconnects: IntCounterVec,
}

impl StoreMetrics {
    /// Creates the metrics and registers them in `registry`.
    pub fn register(registry: &Registry) -> prometheus::Result<Arc<StoreMetrics>> {
        let latency = |name: &str, help: &str| {
            Histogram::with_opts(HistogramOpts::new(name, help).buckets(LATENCY_BUCKETS.to_vec()))
        };
        let m = StoreMetrics {
            request_duration: HistogramVec::new(
                HistogramOpts::new(
                    "tessera_store_request_duration_seconds",
                    "Latency of store requests by backend and operation.",
                )
                .buckets(LATENCY_BUCKETS.to_vec()),
                &["backend", "op"],
            )?,
            requests: IntCounterVec::new(
                Opts::new(
                    "tessera_store_requests_total",
                    "Store requests by backend, operation and result.",
                ),
                &["backend", "op", "result"],
            )?,
            watchers: IntGaugeVec::new(
                Opts::new("tessera_store_watchers", "Open watches by backend."),
                &["backend"],
            )?,
            watch_events: IntCounterVec::new(
                Opts::new(
                    "tessera_store_watch_events_total",
                    "Events delivered to watches by backend.",
                ),
                &["backend"],
            )?,
            revision: IntGaugeVec::new(
                Opts::new("tessera_store_revision", "The store's current revision."),
                &["backend"],
            )?,
            compacted_revision: IntGaugeVec::new(
                Opts::new(
                    "tessera_store_compacted_revision",
                    "The revision of the last compaction.",
                ),
                &["backend"],
            )?,
            keys: IntGaugeVec::new(
                Opts::new("tessera_store_keys", "Keys that exist now."),
                &["backend"],
            )?,
            commit_batch: Histogram::with_opts(
                HistogramOpts::new(
                    "tessera_store_embedded_commit_batch_size",
                    "Transactions made durable by one log flush (group commit).",
                )
                .buckets(vec![
                    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0,
                ]),
            )?,
            fsync_duration: latency(
                "tessera_store_embedded_fsync_duration_seconds",
                "Duration of one write-and-fdatasync of the embedded store's log.",
            )?,
            wal_bytes: IntCounter::new(
                "tessera_store_embedded_wal_bytes_total",
                "Bytes appended to the embedded store's log.",
            )?,
            snapshot_duration: latency(
                "tessera_store_embedded_snapshot_duration_seconds",
                "Duration of writing one snapshot of the embedded store.",
            )?,
            recovery_duration: latency(
                "tessera_store_embedded_recovery_duration_seconds",
                "Duration of opening the embedded store from disk.",
            )?,
            retries: IntCounterVec::new(
                Opts::new(
                    "tessera_store_retries_total",
                    "Store requests retried after a transient backend failure.",
                ),
                &["backend", "op"],
            )?,
            watch_reconnects: IntCounterVec::new(
                Opts::new(
                    "tessera_store_watch_reconnects_total",
                    "Watches resumed after their stream to the backend was lost.",
                ),
                &["backend"],
            )?,
        };
        registry.register(Box::new(m.request_duration.clone()))?;
        registry.register(Box::new(m.requests.clone()))?;
        registry.register(Box::new(m.watchers.clone()))?;
        registry.register(Box::new(m.watch_events.clone()))?;
        registry.register(Box::new(m.revision.clone()))?;
        registry.register(Box::new(m.compacted_revision.clone()))?;
        registry.register(Box::new(m.keys.clone()))?;
        registry.register(Box::new(m.commit_batch.clone()))?;
        registry.register(Box::new(m.fsync_duration.clone()))?;
        registry.register(Box::new(m.wal_bytes.clone()))?;
        registry.register(Box::new(m.snapshot_duration.clone()))?;
        registry.register(Box::new(m.recovery_duration.clone()))?;
        registry.register(Box::new(m.retries.clone()))?;
        registry.register(Box::new(m.watch_reconnects.clone()))?;
        Ok(Arc::new(m))
    }

    /// Metrics in a registry of their own, for stores whose metrics nobody scrapes.
    pub fn detached() -> Arc<StoreMetrics> {
        // Registering into a fresh registry cannot collide.
        match StoreMetrics::register(&Registry::new()) {
            Ok(m) => m,
            Err(e) => panic!("registering store metrics into an empty registry failed: {e}"),
        }
    }
}
