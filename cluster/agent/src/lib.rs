//! Node agents. [`sim`] runs hollow nodes: thousands of simulated nodes in one process, each
//! with its own Node, Lease and pods, as kubemark and KWOK do — what a shard's control plane
//! sees is exactly what real agents would show it.

pub mod metrics;
pub mod process;
pub mod sim;
