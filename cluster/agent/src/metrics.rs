//! Agent metrics (`tessera_agent_*`).

use prometheus::{IntCounterVec, IntGauge, Opts, Registry};

/// The agent's metrics.
#[derive(Clone)]
pub struct AgentMetrics {
    pub(crate) nodes: IntGauge,
    pub(crate) pods: IntGauge,
    pub(crate) writes: IntCounterVec,
}

impl AgentMetrics {
    /// Creates and registers the metrics.
    pub fn register(registry: &Registry) -> prometheus::Result<AgentMetrics> {
        let m = AgentMetrics::unregistered()?;
        registry.register(Box::new(m.nodes.clone()))?;
        registry.register(Box::new(m.pods.clone()))?;
        registry.register(Box::new(m.writes.clone()))?;
        Ok(m)
    }

    /// Metrics no registry reads.
    pub fn unregistered() -> prometheus::Result<AgentMetrics> {
        Ok(AgentMetrics {
            nodes: IntGauge::new("tessera_agent_nodes", "Nodes this agent runs (healthy).")?,
            pods: IntGauge::new("tessera_agent_pods", "Pods running on this agent's nodes.")?,
            writes: IntCounterVec::new(
                Opts::new(
                    "tessera_agent_writes_total",
                    "Writes to the API by kind (node, lease, pod_status, pod_delete) and result.",
                ),
                &["kind", "result"],
            )?,
        })
    }
}
