//! `tessera bench`: measurements with progress bars, printed as a table or as JSON.

mod api;
mod crd;
mod federation;
mod fill;
mod hpa;
mod latency;
mod offers;
mod queue;
mod reopen;
mod scheduler;
mod shard;
mod store;
mod target;
mod watch;

use clap::Subcommand;
use indicatif::{ProgressBar, ProgressStyle};

/// A progress bar of `len` steps labelled `label`, in the style every benchmark uses.
pub fn progress_bar(len: u64, label: String) -> ProgressBar {
    let bar = ProgressBar::new(len).with_style(
        ProgressStyle::with_template("{msg:>28} [{bar:30}] {pos}/{len} {per_sec} eta {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar.set_message(label);
    bar
}

/// A fresh API on an embedded store in `dir` (the benchmarks that run a shard in-process).
pub async fn in_process_api(dir: &std::path::Path) -> anyhow::Result<tessera_apiserver::api::Api> {
    let store = std::sync::Arc::new(
        tessera_store::EmbeddedStore::open(
            dir,
            tessera_store::EmbeddedOptions::default(),
            tessera_store::StoreMetrics::register(&prometheus::Registry::new())?,
        )
        .await?,
    );
    Ok(tessera_apiserver::api::Api::new(store, None))
}

/// A client of `api` acting as the system component `name`, retrying when it sheds load.
pub fn component_client(
    api: &tessera_apiserver::api::Api,
    name: &str,
) -> std::sync::Arc<dyn tessera_apiserver::client::Client> {
    tessera_runtime::client::Retrying::wrap(std::sync::Arc::new(
        tessera_apiserver::client::InProcess::new(
            api.clone(),
            tessera_apiserver::auth::User::System(name.into()),
        ),
    ))
}

/// What to measure.
#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// The API server over HTTPS: creates, gets, lists, a paced mix and watch fan-out.
    Api(api::ApiBenchArgs),
    /// Write and read throughput and latency of a store backend.
    Store(store::StoreBenchArgs),
    /// How fast the embedded store reopens a directory of N keys.
    Reopen(reopen::ReopenBenchArgs),
    /// Watch fan-out: many watches on one prefix under a stream of writes.
    Watch(watch::WatchBenchArgs),
    /// A whole shard: pods from ReplicaSets scheduled onto simulated nodes and started.
    Shard(shard::ShardBenchArgs),
    /// The scheduler against the real API, shaped like Kubernetes' scheduler_perf.
    Scheduler(scheduler::SchedulerBenchArgs),
    /// The scheduling queue alone: what cluster events cost while many pods wait.
    Queue(queue::QueueBenchArgs),
    /// A federation of whole shards: routing, utilization against one global pool, and the
    /// same work on one shard and through the federation.
    Federation(federation::FederationBenchArgs),
    /// Offers for frameworks: offers/s, accept to bound latency, DRF share error.
    Offers(offers::OffersBenchArgs),
    /// HorizontalPodAutoscaler syncs on a loaded shard: syncs/s and the time of one.
    Hpa(hpa::HpaBenchArgs),
    /// Custom objects through a CRD's conversion webhook: each version's creates, gets and
    /// lists, the storage version's as the baseline.
    Crd(crd::CrdBenchArgs),
}

/// Runs a benchmark.
pub async fn run(cmd: BenchCommand) -> anyhow::Result<()> {
    match cmd {
        BenchCommand::Api(args) => api::run(args).await,
        BenchCommand::Store(args) => store::run(args).await,
        BenchCommand::Reopen(args) => reopen::run(args).await,
        BenchCommand::Watch(args) => watch::run(args).await,
        BenchCommand::Shard(args) => shard::run(args).await,
        BenchCommand::Federation(args) => federation::run(args).await,
        BenchCommand::Offers(args) => offers::run(args).await,
        BenchCommand::Hpa(args) => hpa::run(args).await,
        BenchCommand::Crd(args) => crd::run(args).await,
        BenchCommand::Queue(args) => queue::run(args).await,
        BenchCommand::Scheduler(args) => scheduler::run(args).await,
    }
}
