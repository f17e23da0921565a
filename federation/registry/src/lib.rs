//! The federation's registry of shards: the gRPC endpoint their agents connect to (one
//! stream per shard), each shard's lease, capacity summary and assignments, and the `Shard`
//! and `ShardMap` objects that show it all through the federation's Kubernetes API.

pub mod lending;
pub mod metrics;
pub mod objects;
pub mod offers;
pub mod reads;
pub mod registry;
pub mod service;

pub use metrics::FederationMetrics;
pub use reads::{RegistryShards, ShardClient};
pub use registry::{
    Held, ObjectKey, RegisterError, Registry, RegistryConfig, RegistryEvent, Reported, Standing,
};
pub use service::FederationService;
