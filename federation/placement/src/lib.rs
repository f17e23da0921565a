//! Where the federation sends a tenant's work: the shard map (tenant → shards in order of
//! preference, by consistent hashing weighted by capacity), the shards' capacity summaries,
//! and placement built on both. Pure functions of a snapshot of the shards: no I/O, no clock,
//! the same answer for the same input on every federation replica.

pub mod failover;
pub mod map;
pub mod place;
pub mod summary;

pub use failover::{Failover, FailoverMode};
pub use map::{MapError, ShardMap, ShardWeight};
pub use place::{
    Decision, Mode, Policy, ShardState, Skip, Snapshot, Spread, Taint, Toleration, Workload,
};
pub use summary::{Group, Request, Slot, Summary, SummaryBuilder};
