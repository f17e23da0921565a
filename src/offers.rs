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

/// Serves the offers service over `shard`'s nodes on `addr` (TLS with the API's
/// certificate; frameworks present API tokens); returns the bound address.
pub async fn serve(
    shard: &Shard,
    addr: SocketAddr,
    data_dir: &std::path::Path,
) -> anyhow::Result<SocketAddr> {
    let metrics = OfferMetrics::register(&shard.registry)?;
    let (api, tokens) = (shard.api.clone(), shard.tokens.clone());
    let authenticate: tessera_offers::Authenticate = Arc::new(move |token: String| {
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
    });
    let offers = Offers::new(
        OffersConfig::default(),
        shard.informers.clone(),
        authenticate,
        Some(metrics),
    );
    let credentials = tessera_apiserver::pki::Credentials::load_or_create(&data_dir.join("pki"))?;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("binding the offers endpoint {addr}: {e}"))?;
    let bound = listener.local_addr()?;
    let server = Server::builder()
        .tls_config(ServerTlsConfig::new().identity(Identity::from_pem(
            &credentials.cert_pem,
            &credentials.key_pem,
        )))?
        .add_service(offers.server())
        .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener));
    tokio::spawn(async move {
        if let Err(e) = server.await {
            tracing::error!(error = %e, "the offers endpoint stopped");
        }
    });
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
    /// The shard's offers endpoint (`https://127.0.0.1:9466`).
    #[arg(long)]
    pub offers: String,
    /// The CA of the shard's certificate (its `pki/ca.crt`).
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
