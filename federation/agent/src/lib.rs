//! A shard's federation agent: the shard's end of the one gRPC stream to the federation.

pub mod agent;
pub mod metrics;
pub mod reads;
pub mod summary;

pub use agent::{AgentConfig, AgentError, run, run_with};
pub use metrics::AgentMetrics;
