//! `tessera up`: runs Tessera on this machine. Today that is one shard's store (embedded by
//! default), its compactor, metrics, and the API server's discovery over TLS with a kubeconfig;
//! serving objects, controllers, scheduler and the federation join it as their issues land.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Args;
use prometheus::Registry;
use tessera_apiserver::pki::Credentials;
use tessera_apiserver::{discovery, rest, serve};
use tessera_store::{StoreMetrics, compactor};

use crate::store_config::{self, StoreArgs};

/// Flags of `tessera up`.
#[derive(Args, Debug)]
pub struct UpArgs {
    /// Where state is kept.
    #[arg(long, default_value = "./data")]
    pub data_dir: PathBuf,
    /// Address of the metrics and health endpoint.
    #[arg(long, default_value = "127.0.0.1:9464")]
    pub metrics_addr: SocketAddr,
    /// Address of the gRPC endpoint (grpc.health.v1 today).
    #[arg(long, default_value = "127.0.0.1:9465")]
    pub grpc_addr: SocketAddr,
    /// Address of the Kubernetes API (HTTPS).
    #[arg(long, default_value = "127.0.0.1:6443")]
    pub api_addr: SocketAddr,
    #[command(flatten)]
    pub store: StoreArgs,
}

/// Opens the store and serves until Ctrl-C.
pub async fn run(args: UpArgs) -> anyhow::Result<()> {
    let registry = Registry::new();
    let metrics = StoreMetrics::register(&registry)?;
    std::fs::create_dir_all(&args.data_dir)?;
    let store = store_config::open(&args.store, &args.data_dir, metrics).await?;
    let revision = store.current_revision().await?;
    tokio::spawn(compactor::run(
        store.clone(),
        args.store.compaction_interval,
    ));
    let bound = crate::metrics_server::serve(args.metrics_addr, registry).await?;
    let grpc = crate::health::serve(args.grpc_addr, store.clone()).await?;
    let credentials = Credentials::load_or_create(&args.data_dir.join("pki"))?;
    let api_router = serve::authenticated(
        discovery::router()
            .merge(rest::router(store.clone()))
            .route("/healthz", axum::routing::get(|| async { "ok" })),
        credentials.admin_token.clone(),
    );
    let api = serve::serve_tls(args.api_addr, &credentials, api_router).await?;
    let kubeconfig = args.data_dir.join("kubeconfig");
    credentials.write_kubeconfig(&kubeconfig, &format!("https://{api}"))?;
    println!("Tessera is up.");
    println!("  store:    {} at revision {revision}", store.backend());
    if store.backend() == "embedded" {
        println!("  data:     {}", args.data_dir.join("store").display());
    }
    println!("  api:      https://{api} (discovery; create/get/list/replace/watch/delete)");
    println!("  metrics:  http://{bound}/metrics");
    println!("  grpc:     {grpc} (grpc.health.v1)");
    println!();
    println!("  export KUBECONFIG={}", kubeconfig.display());
    println!("  kubectl api-resources");
    println!();
    println!("This build runs the shard's store and the first API verbs; patch, apply, tables,");
    println!("openapi, tenants, the controllers, scheduler and federation are not there yet");
    println!("(see docs/architecture.md).");
    println!("Press Ctrl-C to stop.");
    tokio::signal::ctrl_c().await?;
    tracing::info!("shutting down");
    Ok(())
}
