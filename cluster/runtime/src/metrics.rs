//! Work queue metrics: depth per event class, adds, retries, time waiting in the queue and
//! time spent working, per controller.

use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry};

/// The metrics of every work queue of a process (labelled by controller).
#[derive(Clone)]
pub struct QueueMetrics {
    pub(crate) depth: IntGaugeVec,
    pub(crate) adds: IntCounterVec,
    pub(crate) retries: IntCounterVec,
    pub(crate) latency: HistogramVec,
    pub(crate) work: HistogramVec,
}

fn buckets() -> Vec<f64> {
    vec![
        0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 60.0,
    ]
}

impl QueueMetrics {
    /// Creates and registers the metrics in `registry`.
    pub fn register(registry: &Registry) -> prometheus::Result<QueueMetrics> {
        let m = QueueMetrics::unregistered()?;
        registry.register(Box::new(m.depth.clone()))?;
        registry.register(Box::new(m.adds.clone()))?;
        registry.register(Box::new(m.retries.clone()))?;
        registry.register(Box::new(m.latency.clone()))?;
        registry.register(Box::new(m.work.clone()))?;
        Ok(m)
    }

    /// Metrics no registry reads (tests, benchmarks).
    pub fn unregistered() -> prometheus::Result<QueueMetrics> {
        Ok(QueueMetrics {
            depth: IntGaugeVec::new(
                Opts::new(
                    "tessera_workqueue_depth",
                    "Keys waiting, by the class of event that queued them.",
                ),
                &["controller", "class"],
            )?,
            adds: IntCounterVec::new(
                Opts::new(
                    "tessera_workqueue_adds_total",
                    "Keys added (including ones already waiting, merged into one).",
                ),
                &["controller", "class"],
            )?,
            retries: IntCounterVec::new(
                Opts::new(
                    "tessera_workqueue_retries_total",
                    "Keys queued again after a failed reconcile.",
                ),
                &["controller"],
            )?,
            latency: HistogramVec::new(
                HistogramOpts::new(
                    "tessera_workqueue_queue_duration_seconds",
                    "Time a key waited in the queue before a worker took it.",
                )
                .buckets(buckets()),
                &["controller", "class"],
            )?,
            work: HistogramVec::new(
                HistogramOpts::new(
                    "tessera_workqueue_work_duration_seconds",
                    "Time a worker spent on a key.",
                )
                .buckets(buckets()),
                &["controller"],
            )?,
        })
    }
}

/// Informer and reconcile metrics of a process (labelled by resource or controller).
#[derive(Clone)]
pub struct RuntimeMetrics {
    pub(crate) informer_events: IntCounterVec,
    pub(crate) informer_handlers: IntGaugeVec,
    pub(crate) informers: IntGaugeVec,
    pub(crate) relists: IntCounterVec,
    pub(crate) reconciles: IntCounterVec,
    pub(crate) leader: IntGaugeVec,
    pub(crate) events_written: IntCounterVec,
}

impl RuntimeMetrics {
    /// Creates and registers the metrics in `registry`.
    pub fn register(registry: &Registry) -> prometheus::Result<RuntimeMetrics> {
        let m = RuntimeMetrics::unregistered()?;
        registry.register(Box::new(m.informer_events.clone()))?;
        registry.register(Box::new(m.informer_handlers.clone()))?;
        registry.register(Box::new(m.informers.clone()))?;
        registry.register(Box::new(m.relists.clone()))?;
        registry.register(Box::new(m.reconciles.clone()))?;
        registry.register(Box::new(m.leader.clone()))?;
        registry.register(Box::new(m.events_written.clone()))?;
        Ok(m)
    }

    /// Metrics no registry reads (tests, benchmarks).
    pub fn unregistered() -> prometheus::Result<RuntimeMetrics> {
        Ok(RuntimeMetrics {
            informer_events: IntCounterVec::new(
                Opts::new(
                    "tessera_informer_events_total",
                    "Watch events an informer applied to its cache, by resource and type.",
                ),
                &["resource", "type"],
            )?,
            informer_handlers: IntGaugeVec::new(
                Opts::new(
                    "tessera_informer_handlers",
                    "Handlers registered with the informer of a resource (its readers in this process).",
                ),
                &["resource"],
            )?,
            informers: IntGaugeVec::new(
                Opts::new(
                    "tessera_informers",
                    "Shared informers running in this process, by resource (1 when shared as meant).",
                ),
                &["resource"],
            )?,
            relists: IntCounterVec::new(
                Opts::new(
                    "tessera_informer_relists_total",
                    "Full lists after a watch's revision was compacted (410 Gone).",
                ),
                &["resource"],
            )?,
            reconciles: IntCounterVec::new(
                Opts::new(
                    "tessera_reconcile_total",
                    "Reconciles by controller and outcome (done, requeue, error).",
                ),
                &["controller", "outcome"],
            )?,
            leader: IntGaugeVec::new(
                Opts::new(
                    "tessera_leader_is_leader",
                    "1 while this process holds the named leader Lease.",
                ),
                &["lease"],
            )?,
            events_written: IntCounterVec::new(
                Opts::new(
                    "tessera_events_written_total",
                    "Kubernetes Events written (created or counted again), by component.",
                ),
                &["component"],
            )?,
        })
    }
}
