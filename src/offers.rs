//! The offers endpoint of a shard (`tessera up --offers-addr`) and the example framework
//! (`tessera framework batch`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use clap::{Args, Subcommand};
use tessera_apiserver::client::{Client, InProcess};
use tessera_offers::batch::{self, BatchConfig, Progress};
use tessera_offers::{OfferMetrics, Offers, OffersConfig};
use tonic::transport::{Identity, Server, ServerTlsConfig};

use crate::up::Shard;

/// Authenticates frameworks' bearer tokens against `api`'s tokens (a tenant token only
/// while its Tenant is as it was when the token was made): a client acting as the token's
/// user.
pub fn authenticator(api: &Shard) -> tessera_offers::Authenticate {
    let (api, tokens) = (api.api.clone(), api.tokens.clone());
    Arc::new(move |token: String| {
        let (api, tokens) = (api.clone(), tokens.clone());
        Box::pin(async move {
            let (user, claims) =
                tokens.authenticate(token.trim(), tessera_core::time::now_secs())?;
            if let Some(c) = claims
                && !api.tenant_token_current(&c).await
            {
                return None;
            }
            let client: Arc<dyn Client> =
                tessera_runtime::client::Retrying::wrap(Arc::new(InProcess::new(api, user)));
            Some(client)
        })
    })
}

/// Serves `routes` (an offers endpoint) on `addr` with TLS, the certificate of the API in
/// `pki` (its `--pki-dir`); returns the bound address.
async fn serve_tls(
    addr: SocketAddr,
    pki: &std::path::Path,
    routes: tonic::service::Routes,
) -> anyhow::Result<SocketAddr> {
    let credentials = tessera_apiserver::pki::Credentials::load_or_create(pki)?;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("binding the offers endpoint {addr}: {e}"))?;
    let bound = listener.local_addr()?;
    let server = Server::builder()
        .tls_config(ServerTlsConfig::new().identity(Identity::from_pem(
            &credentials.cert_pem,
            &credentials.key_pem,
        )))?
        .add_routes(routes)
        .serve_with_incoming(crate::health::incoming(listener));
    tokio::spawn(async move {
        if let Err(e) = server.await {
            tracing::error!(error = %e, "the offers endpoint stopped");
        }
    });
    Ok(bound)
}

/// Serves the offers service over `shard`'s nodes on `addr` (TLS with the API's
/// certificate; frameworks present API tokens); returns the bound address.
pub async fn serve(
    shard: &Shard,
    addr: SocketAddr,
    pki: &std::path::Path,
) -> anyhow::Result<SocketAddr> {
    let metrics = OfferMetrics::register(&shard.registry, "shard")?;
    let offers = Offers::new(
        OffersConfig::default(),
        shard.informers.clone(),
        authenticator(shard),
        Some(metrics),
    );
    let bound = serve_tls(addr, pki, tonic::service::Routes::new(offers.server())).await?;
    tokio::spawn(offers.run());
    Ok(bound)
}

/// Serves the federation's offers endpoint on `addr`: frameworks subscribe with tokens of
/// the federation's API and are offered the nodes of every shard, by DRF over the fleet.
pub async fn serve_federation(
    federation: &Shard,
    registry: Arc<tessera_registry::Registry>,
    addr: SocketAddr,
    pki: &std::path::Path,
) -> anyhow::Result<SocketAddr> {
    let metrics = OfferMetrics::register(&federation.registry, "federation")?;
    // A framework's token must reach its namespace's ConfigMaps: the federation keeps
    // those itself (its pods are read across the shards).
    let probe = tessera_apiserver::request::find_resource("", "v1", "configmaps").expect("served");
    let offers = tessera_registry::offers::FleetOffers::new(
        registry,
        authenticator(federation),
        probe,
        Some(metrics),
    );
    let bound = serve_tls(addr, pki, tonic::service::Routes::new(offers.server())).await?;
    tokio::spawn(offers.run());
    Ok(bound)
}

/// `tessera framework …`.
#[derive(Subcommand)]
pub enum FrameworkCommand {
    /// The example framework: run the tasks of a file once each, through offers.
    Batch(BatchArgs),
}

/// Flags of `tessera framework batch`.
#[derive(Args)]
pub struct BatchArgs {
    /// The task file: one `name cpu memory seconds` per line.
    #[arg(long)]
    pub file: PathBuf,
    /// The offers endpoint: a shard's or the federation's (`https://127.0.0.1:9466`).
    #[arg(long)]
    pub offers: String,
    /// The CA of the endpoint's certificate (its data dir's `pki/ca.crt`).
    #[arg(long)]
    pub ca: PathBuf,
    /// A file holding a token allowed to run pods in `--namespace`.
    #[arg(long)]
    pub token_file: PathBuf,
    /// The namespace the tasks run in.
    #[arg(long)]
    pub namespace: String,
    /// The framework's name.
    #[arg(long, default_value = "batch")]
    pub name: String,
    /// Its role (frameworks of one role share one DRF share; default: its own).
    #[arg(long, default_value = "")]
    pub role: String,
    /// Its DRF weight.
    #[arg(long, default_value_t = 1.0)]
    pub weight: f64,
    /// The image the tasks run.
    #[arg(long, default_value = "busybox")]
    pub image: String,
    /// Seconds its tasks outlive a disconnection.
    #[arg(long, default_value_t = 0)]
    pub failover_timeout_seconds: i64,
    /// Only nodes with these labels (`k=v,k2=v2`); offers of others are declined. Offers
    /// from the federation carry `tessera.io/shard=<shard>`.
    #[arg(long, default_value = "")]
    pub node_selector: String,
}

/// Runs `tessera framework …`.
pub async fn run(cmd: FrameworkCommand) -> anyhow::Result<()> {
    let FrameworkCommand::Batch(a) = cmd;
    let read = |p: &PathBuf, what: &str| {
        std::fs::read_to_string(p)
            .map_err(|e| anyhow::anyhow!("reading {what} {}: {e}", p.display()))
    };
    let tasks = batch::parse_tasks(&read(&a.file, "--file")?)
        .map_err(|e| anyhow::anyhow!("{}: {e}", a.file.display()))?;
    if tasks.is_empty() {
        anyhow::bail!("{} lists no task", a.file.display());
    }
    let cfg = BatchConfig {
        endpoint: a.offers.clone(),
        ca_pem: read(&a.ca, "--ca")?,
        token: read(&a.token_file, "--token-file")?.trim().to_owned(),
        name: a.name.clone(),
        role: a.role.clone(),
        weight: a.weight,
        namespace: a.namespace.clone(),
        image: a.image.clone(),
        failover_timeout_seconds: a.failover_timeout_seconds,
        node_selector: crate::federation::parse_labels(&a.node_selector)
            .map_err(|e| anyhow::anyhow!("--node-selector: {e}"))?,
    };
    let bar = indicatif::ProgressBar::new(tasks.len() as u64).with_style(
        indicatif::ProgressStyle::with_template("{msg} {bar:30} {pos}/{len} tasks done")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let report = batch::run(&cfg, tasks, |p| match p {
        Progress::Subscribed(id) => bar.set_message(format!("framework {id}")),
        Progress::Task(u) => {
            if u.state >= tessera_proto::offers::v1::TaskState::TaskFinished as i32 {
                bar.inc(1);
            }
        }
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}"))?;
    bar.finish_and_clear();
    println!(
        "framework {}: {} finished, {} failed, {} retried; {} offers ({} accepted, {} declined, {} rescinded)",
        report.framework_id,
        report.finished,
        report.failed.len(),
        report.retried,
        report.offers,
        report.accepted,
        report.declined,
        report.rescinded
    );
    for (task, why) in &report.failed {
        println!("  failed: {task}: {why}");
    }
    if !report.failed.is_empty() {
        anyhow::bail!("{} task(s) failed", report.failed.len());
    }
    Ok(())
}
