//! `tessera bench`: measurements with progress bars, printed as a table or as JSON.

mod latency;
mod store;

use clap::Subcommand;

/// What to measure.
#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// Write and read throughput and latency of a store backend.
    Store(store::StoreBenchArgs),
}

/// Runs a benchmark.
pub async fn run(cmd: BenchCommand) -> anyhow::Result<()> {
    match cmd {
        BenchCommand::Store(args) => store::run(args).await,
    }
}
