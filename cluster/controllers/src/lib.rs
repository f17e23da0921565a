//! The shard's controllers, each a small reconcile on the controller runtime with its own
//! watches and work queue, so a slow controller never stalls another.

pub mod context;
pub mod deployment;
pub mod pods;
pub mod replicaset;

pub use context::Context;
