//! The offers service's metrics (`tessera_offers_*`).

use prometheus::{Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, Opts, Registry};

/// Every offers metric of a process.
#[derive(Clone, Debug)]
pub struct OfferMetrics {
    /// Frameworks subscribed (connected or within their failover timeout).
    pub frameworks: IntGauge,
    /// Offers made.
    pub offers: IntCounter,
    /// Offers accepted.
    pub accepted: IntCounter,
    /// Offers declined.
    pub declined: IntCounter,
    /// Offers rescinded, by why (timeout, node).
    pub rescinded: IntCounterVec,
    /// Tasks launched.
    pub tasks_launched: IntCounter,
    /// Task status updates sent, by state.
    pub task_updates: IntCounterVec,
    /// From an accept to its task's pod bound to the node.
    pub accept_to_bound: Histogram,
}

impl OfferMetrics {
    /// Creates and registers the metrics in `registry`, labelled `subscribed="<where>"`:
    /// `shard` for the frameworks that subscribe at a shard's own endpoint, `federation` for
    /// those of the fleet (at the federation, and in each shard for its part of them).
    pub fn register(registry: &Registry, subscribed: &str) -> prometheus::Result<OfferMetrics> {
        let opts =
            |name: &str, help: &str| Opts::new(name, help).const_label("subscribed", subscribed);
        let m = OfferMetrics {
            frameworks: IntGauge::with_opts(opts(
                "tessera_offers_frameworks",
                "Frameworks subscribed (connected, or disconnected within their failover timeout).",
            ))?,
            offers: IntCounter::with_opts(opts(
                "tessera_offers_made_total",
                "Offers made to frameworks.",
            ))?,
            accepted: IntCounter::with_opts(opts(
                "tessera_offers_accepted_total",
                "Offers accepted.",
            ))?,
            declined: IntCounter::with_opts(opts(
                "tessera_offers_declined_total",
                "Offers declined.",
            ))?,
            rescinded: IntCounterVec::new(
                opts(
                    "tessera_offers_rescinded_total",
                    "Offers rescinded, by why: timeout (not answered in time), node (gone or no longer taking pods) or shard (its shard lost the federation).",
                ),
                &["reason"],
            )?,
            tasks_launched: IntCounter::with_opts(opts(
                "tessera_offers_tasks_launched_total",
                "Tasks launched through accepted offers.",
            ))?,
            task_updates: IntCounterVec::new(
                opts(
                    "tessera_offers_task_updates_total",
                    "Task status updates sent to frameworks, by state.",
                ),
                &["state"],
            )?,
            accept_to_bound: Histogram::with_opts(
                HistogramOpts::new(
                    "tessera_offers_accept_to_bound_seconds",
                    "From an accepted offer to its task's pod bound to the offered node.",
                )
                .const_label("subscribed", subscribed)
                .buckets(vec![
                    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                ]),
            )?,
        };
        registry.register(Box::new(m.frameworks.clone()))?;
        registry.register(Box::new(m.offers.clone()))?;
        registry.register(Box::new(m.accepted.clone()))?;
        registry.register(Box::new(m.declined.clone()))?;
        registry.register(Box::new(m.rescinded.clone()))?;
        registry.register(Box::new(m.tasks_launched.clone()))?;
        registry.register(Box::new(m.task_updates.clone()))?;
        registry.register(Box::new(m.accept_to_bound.clone()))?;
        Ok(m)
    }
}
