//! `tessera bench`: measurements with progress bars, printed as a table or as JSON.

mod latency;
mod reopen;
mod store;
mod target;
mod watch;

use clap::Subcommand;

/// What to measure.
#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// Write and read throughput and latency of a store backend.
    Store(store::StoreBenchArgs),
    /// How fast the embedded store reopens a directory of N keys.
    Reopen(reopen::ReopenBenchArgs),
    /// Watch fan-out: many watches on one prefix under a stream of writes.
    Watch(watch::WatchBenchArgs),
}

/// Runs a benchmark.
pub async fn run(cmd: BenchCommand) -> anyhow::Result<()> {
    match cmd {
        BenchCommand::Store(args) => store::run(args).await,
        BenchCommand::Reopen(args) => reopen::run(args).await,
        BenchCommand::Watch(args) => watch::run(args).await,
    }
}
