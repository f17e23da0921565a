//! The agent's own series: its lease with the federation as it counts it, and what it did
//! when that lease lapsed.

use prometheus::{Gauge, IntCounter, IntCounterVec, Opts, Registry};

/// The agent's metrics.
#[derive(Clone, Debug)]
pub struct AgentMetrics {
    /// Seconds until the agent's lease with the federation ends (negative once it has).
    pub lease_remaining: Gauge,
    /// Times the lease lapsed (the at-most-once work was stopped each time).
    pub lease_lapses: IntCounter,
    /// Federated copies stopped because the lease lapsed, by kind.
    pub stopped: IntCounterVec,
    /// Renewals not sent because the shard's API did not answer.
    pub renewals_withheld: IntCounter,
}

impl AgentMetrics {
    /// Creates the metrics and registers them in `registry`.
    pub fn register(registry: &Registry) -> prometheus::Result<AgentMetrics> {
        let m = AgentMetrics {
            lease_remaining: Gauge::new(
                "tessera_federation_agent_lease_remaining_seconds",
                "Seconds until the shard's lease with the federation ends by the agent's clock (negative once it has).",
            )?,
            lease_lapses: IntCounter::new(
                "tessera_federation_agent_lease_lapses_total",
                "Times the shard's federation lease lapsed and its at-most-once work was stopped.",
            )?,
            stopped: IntCounterVec::new(
                Opts::new(
                    "tessera_federation_agent_stopped_total",
                    "Federated at-most-once copies the agent stopped because the shard's lease lapsed, by kind.",
                ),
                &["kind"],
            )?,
            renewals_withheld: IntCounter::new(
                "tessera_federation_agent_renewals_withheld_total",
                "Lease renewals not sent because the shard's API did not answer.",
            )?,
        };
        registry.register(Box::new(m.lease_remaining.clone()))?;
        registry.register(Box::new(m.lease_lapses.clone()))?;
        registry.register(Box::new(m.stopped.clone()))?;
        registry.register(Box::new(m.renewals_withheld.clone()))?;
        Ok(m)
    }
}
