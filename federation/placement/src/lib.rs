//! Where the federation sends a tenant's work: the shard map (tenant → shards in order of
//! preference, by consistent hashing weighted by capacity) and, built on it, placement. Pure
//! functions of a snapshot of the shards: no I/O, no clock, the same answer for the same input
//! on every federation replica.

pub mod map;

pub use map::{MapError, ShardMap, ShardWeight};
