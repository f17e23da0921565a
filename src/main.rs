//! `tessera`: one binary for every shape of a Tessera deployment. This file is the command
//! line and its wiring only; the parts live in the workspace crates.

mod bench;
mod certs;
mod components;
mod data_dir;
mod debug;
mod federation;
mod health;
mod metrics_server;
mod monitoring;
mod offers;
mod shard;
mod signals;
mod status;
mod store_cmd;
mod store_config;
mod up;

use std::io::IsTerminal;

use clap::{Parser, Subcommand};

/// mimalloc instead of the system allocator: the control plane allocates many small,
/// short-lived objects from many threads (decoded watch events, request bodies), where
/// glibc's malloc spent a third of the CPU of `tessera bench shard` (see docs/dependencies.md).
///
/// The `system-alloc` feature keeps the system allocator, for heap profilers that
/// interpose malloc (heaptrack, valgrind's massif): `docs/operations.md` shows how.
#[cfg(not(feature = "system-alloc"))]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
use tracing_subscriber::EnvFilter;

/// Tessera: a federated, sharded cluster scheduler.
#[derive(Parser)]
#[command(name = "tessera", version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run Tessera on this machine: a federation and N shards (each its store, Kubernetes
    /// API, controllers, scheduler and simulated nodes), or one shard with `--shards 0`.
    Up(Box<up::UpAllArgs>),
    /// Run the federation control plane alone: its store, its Kubernetes API, the gRPC
    /// endpoint shards' agents join, and the propagation controller.
    Federation(federation::FederationArgs),
    /// Run a shard's federation agent: join the shard (by its kubeconfig) to a federation.
    Join(federation::JoinArgs),
    /// Run a shard's API server alone (against its store).
    Apiserver(up::UpArgs),
    /// Run the controllers against an API server (active/standby through a Lease).
    ControllerManager(components::ControllerManagerArgs),
    /// Run the scheduler against an API server (active/standby through a Lease).
    Scheduler(components::SchedulerArgs),
    /// Run a node agent (simulated nodes) against an API server.
    Agent(components::AgentArgs),
    /// Frameworks that run tasks through a shard's offers (`tessera up --offers-addr`).
    #[command(subcommand)]
    Framework(offers::FrameworkCommand),
    /// The fleet at a glance: shards, tenants and the latest failovers (`--watch`, `-o json`).
    Status(status::StatusArgs),
    /// Cordon, uncordon or drain a shard of a federation.
    #[command(subcommand)]
    Shard(shard::ShardCommand),
    /// Backups of the embedded store: `backup` (online, or of a stopped data directory)
    /// and `restore` (into a new data directory).
    #[command(subcommand)]
    Store(store_cmd::StoreCommand),
    /// Bearer tokens.
    #[command(subcommand)]
    Token(TokenCommand),
    /// The API server's certificates.
    #[command(subcommand)]
    Certs(CertsCommand),
    /// Measure a part of Tessera.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// Tools for tests and troubleshooting.
    #[command(subcommand, hide = true)]
    Debug(debug::DebugCommand),
}

#[derive(Subcommand)]
enum TokenCommand {
    /// Print a token for a tenant.
    Create(up::TokenArgs),
}

#[derive(Subcommand)]
enum CertsCommand {
    /// Make the credentials of an API server ahead of time, for processes that share them
    /// (a shard's API server replicas, scheduler, controller manager and etcd members):
    /// into a directory, or as a Kubernetes Secret (the Helm chart's pre-install Job).
    Init(certs::InitArgs),
    /// Issue a new serving certificate (one year) from the kept CA key; the CA and every
    /// kubeconfig stay valid. Restart the API server to serve it.
    Rotate {
        /// The data directory whose `pki/` holds the CA.
        #[arg(long, default_value = "./data")]
        data_dir: std::path::PathBuf,
        /// The credentials' directory, if not DATA/pki (`--pki-dir` of the API server).
        #[arg(long)]
        pki_dir: Option<std::path::PathBuf>,
    },
}

fn main() -> anyhow::Result<()> {
    // The process runtime's sandbox helper (`tessera sandbox exec|init|map|join …`): started
    // by a process node for each container; single-threaded, before anything else starts.
    let mut args = std::env::args_os();
    if args.nth(1).is_some_and(|a| a == "sandbox") {
        tessera_agent::sandbox::main(args.collect());
    }
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_env("TESSERA_LOG").unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let cli = Cli::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        match cli.command {
            Command::Up(args) => up::run(*args).await,
            Command::Apiserver(args) => up::run_apiserver(args).await,
            Command::Federation(args) => federation::run(args).await,
            Command::Join(args) => federation::join(args).await,
            Command::ControllerManager(args) => components::controller_manager(args).await,
            Command::Scheduler(args) => components::scheduler(args).await,
            Command::Agent(args) => components::agent(args).await,
            Command::Shard(cmd) => shard::run(cmd).await,
            Command::Status(args) => status::run(args).await,
            Command::Store(cmd) => store_cmd::run(cmd).await,
            Command::Framework(cmd) => offers::run(cmd).await,
            Command::Token(TokenCommand::Create(args)) => up::token_create(args).await,
            Command::Certs(CertsCommand::Init(args)) => certs::init(args).await,
            Command::Certs(CertsCommand::Rotate { data_dir, pki_dir }) => {
                let pki = pki_dir.unwrap_or_else(|| data_dir.join("pki"));
                let until = tessera_apiserver::pki::rotate_serving(&pki)?;
                println!(
                    "new serving certificate in {}, valid until {until}; restart tessera to serve it",
                    pki.join("server.crt").display()
                );
                Ok(())
            }
            Command::Bench(cmd) => bench::run(cmd).await,
            Command::Debug(cmd) => debug::run(cmd).await,
        }
    })
}
