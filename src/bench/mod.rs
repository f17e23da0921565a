//! `tessera bench`: measurements with progress bars, printed as a table or as JSON.

mod latency;
mod reopen;
mod store;

use clap::Subcommand;

/// What to measure.
#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// Write and read throughput and latency of a store backend.
    Store(store::StoreBenchArgs),
    /// How fast the embedded store reopens a directory of N keys.
    Reopen(reopen::ReopenBenchArgs),
}

/// Runs a benchmark.
pub async fn run(cmd: BenchCommand) -> anyhow::Result<()> {
    match cmd {
        BenchCommand::Store(args) => store::run(args).await,
        BenchCommand::Reopen(args) => reopen::run(args).await,
    }
}
