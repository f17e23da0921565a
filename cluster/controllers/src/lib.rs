//! The shard's controllers, each a small reconcile on the controller runtime with its own
//! watches and work queue, so a slow controller never stalls another.

pub mod context;
pub mod deployment;
pub mod endpoints;
pub mod gc;
pub mod namespace;
pub mod nodelifecycle;
pub mod pods;
pub mod replicaset;

pub use context::Context;

/// Every controller, each with its own watches, queue and workers, until dropped.
pub async fn run_all(ctx: Context) {
    tokio::join!(replicaset::run(ctx.clone()), deployment::run(ctx.clone()),);
}
