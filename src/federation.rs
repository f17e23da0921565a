//! The federation as processes: `tessera federation` (its own store and Kubernetes API, the
//! gRPC endpoint shards' agents connect to, the propagation controller, `/metrics`),
//! `tessera join` (a shard's federation agent against the shard's API), and the federation
//! with N shards in one process that `tessera up --shards N` runs.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use tessera_apiserver::client::{Client, HttpClient};
use tessera_federation_agent::AgentConfig;
use tessera_registry::{FederationMetrics, FederationService, Registry, RegistryConfig};
use tonic::transport::{Identity, Server, ServerTlsConfig};

use crate::up::{Shard, UpArgs};

/// Flags of the federation's control loops: its shards' leases and status aggregation.
#[derive(Args, Debug, Clone)]
pub struct FederationTuning {
    /// Seconds a shard's lease runs from each renewal by its agent.
    #[arg(long, default_value_t = 15)]
    pub shard_lease_seconds: u64,
    /// Seconds an `AtMostOnce` workload (Jobs, StatefulSets) waits, on top of its lost
    /// shard's lease and its pods' termination grace period, before the federation starts
    /// it elsewhere: covers clock drift and the shard's agent noticing and stopping it.
    #[arg(long, default_value_t = 5)]
    pub failover_margin_seconds: u64,
    /// Milliseconds a federated workload's status writes that only follow its shards'
    /// reports are batched over (a workload at rest is written at once; 0 writes every
    /// report).
    #[arg(long, default_value_t = 100)]
    pub federation_status_batch_period_ms: u64,
    /// Workloads that may move between live shards at once (rebalancing after a shard
    /// joins, `tessera shard drain`); the others wait their turn.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_moving: u64,
    /// Seconds a move between live shards may hold one of the `--max-moving` slots: a move
    /// not finished by then (its new copy never becomes available) is reported
    /// (`MoveStalled`) and goes on without its slot, so it holds up no other move.
    #[arg(long, default_value_t = 600, value_parser = clap::value_parser!(u64).range(1..))]
    pub move_timeout_seconds: u64,
    /// Fault-injection seam for tests: a federation-scope gang is committed no sooner than
    /// this many milliseconds after its attempt began, even when every part is reserved
    /// before (0: at once). Widens the window between the two phases.
    #[arg(long, default_value_t = 0, hide = true)]
    pub gang_commit_delay_ms: u64,
    /// Seconds a shard's work must wait for room before the federation lends it idle nodes
    /// of other shards (elastic shards; a Shard's `spec.lending` says whether it lends or
    /// borrows at all).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..))]
    pub borrow_after_seconds: u64,
    /// Seconds a borrowed node may sit idle, its borrower with nothing waiting, before it
    /// goes back to its shard.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    pub lend_idle_seconds: u64,
}

/// A running federation control plane.
pub struct Federation {
    /// Its API server, store and metrics (the same parts a shard's API runs on).
    pub api: Shard,
    /// Where shards' agents connect (`https://…`).
    pub grpc_url: String,
    /// The token they present.
    pub join_token: String,
    /// Where frameworks subscribe for offers across the fleet, if served.
    pub offers: Option<SocketAddr>,
}

/// The join token of the federation whose credentials are in `pki` (made once, kept in
/// `join.token`).
pub fn join_token(pki: &Path) -> anyhow::Result<String> {
    let path = pki.join("join.token");
    if let Ok(t) = std::fs::read_to_string(&path) {
        return Ok(t.trim().to_owned());
    }
    let mut bytes = [0u8; 32];
    rand::fill(&mut bytes);
    let token: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    std::fs::create_dir_all(pki)?;
    {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)?;
        f.write_all(token.as_bytes())?;
    }
    Ok(token)
}

/// The federation's shards as its API reads pods, nodes and events across them: none until
/// this process leads (a standby has no registry; it is not ready, so nothing is sent to it).
#[derive(Default)]
struct LateShards(std::sync::OnceLock<Arc<dyn tessera_apiserver::client::ShardSet>>);

impl tessera_apiserver::client::ShardSet for LateShards {
    fn shards(&self) -> Vec<(String, Arc<dyn Client>)> {
        self.0.get().map(|s| s.shards()).unwrap_or_default()
    }
}

/// The federation's API, before it leads: its store, API and metrics.
struct Standby {
    api: Shard,
    metrics: FederationMetrics,
    queues: tessera_runtime::metrics::QueueMetrics,
    shards: Arc<LateShards>,
}

/// Starts the federation's API on `args` (store, TLS, kubeconfig in its data dir), ready
/// only while `gate` is true if one is given.
async fn start_api(
    args: &UpArgs,
    gate: Option<Arc<std::sync::atomic::AtomicBool>>,
) -> anyhow::Result<Standby> {
    let metrics = FederationMetrics::unregistered()?;
    let shards = Arc::new(LateShards::default());
    let api = crate::up::start_with(args, Some(shards.clone()), gate).await?;
    metrics.register_into(&api.registry)?;
    let queues = tessera_runtime::metrics::QueueMetrics::register(&api.registry)?;
    Ok(Standby {
        api,
        metrics,
        queues,
        shards,
    })
}

/// What a leading federation serves besides its API.
struct Leading {
    grpc_url: String,
    join_token: String,
    offers: Option<SocketAddr>,
}

/// Makes the federation lead: a registry of shards (rebuilt from what they report and
/// what is stored, as after a restart), the gRPC endpoint on `args.grpc_addr` (TLS with
/// the API's certificate), the offers endpoint, the Shard objects' writer and the
/// propagation controller.
async fn lead(
    args: &UpArgs,
    tuning: &FederationTuning,
    offers_addr: Option<SocketAddr>,
    standby: &Standby,
) -> anyhow::Result<Leading> {
    let api = &standby.api;
    let token = join_token(&args.pki_dir())?;
    let mut config = RegistryConfig::new(token.clone());
    config.failover_margin = Duration::from_secs(tuning.failover_margin_seconds);
    if tuning.shard_lease_seconds < 3 {
        anyhow::bail!("--shard-lease-seconds must be at least 3");
    }
    config.lease = Duration::from_secs(tuning.shard_lease_seconds);
    config.renew = Duration::from_secs((tuning.shard_lease_seconds / 3).max(1));
    config.lending.borrow_after = Duration::from_secs(tuning.borrow_after_seconds);
    config.lending.idle_return = Duration::from_secs(tuning.lend_idle_seconds);
    let registry = Registry::new(config, Some(standby.metrics.clone()));
    // Pods, nodes and events are read across the shards, over their agents' streams.
    let _ = standby
        .shards
        .0
        .set(Arc::new(tessera_registry::RegistryShards(registry.clone())));
    let credentials = tessera_apiserver::pki::Credentials::load_or_create(&args.pki_dir())?;
    let listener = tokio::net::TcpListener::bind(args.grpc_addr)
        .await
        .map_err(|e| {
            anyhow::anyhow!(
                "binding the federation's gRPC endpoint {}: {e}",
                args.grpc_addr
            )
        })?;
    let grpc_addr = listener.local_addr()?;
    let health = crate::health::service(api.store.clone());
    let server = Server::builder()
        .tls_config(ServerTlsConfig::new().identity(Identity::from_pem(
            &credentials.cert_pem,
            &credentials.key_pem,
        )))?
        .http2_keepalive_interval(Some(Duration::from_secs(10)))
        .http2_keepalive_timeout(Some(Duration::from_secs(20)))
        .add_service(FederationService::server(registry.clone()))
        .add_service(health)
        .serve_with_incoming(crate::health::incoming(listener));
    tokio::spawn(async move {
        if let Err(e) = server.await {
            tracing::error!(error = %e, "the federation's gRPC endpoint stopped");
        }
    });
    let offers = match offers_addr {
        Some(addr) => Some(
            crate::offers::serve_federation(api, registry.clone(), addr, &args.pki_dir()).await?,
        ),
        None => None,
    };
    // Client certificates for the federation's API: its own CA signs approved
    // `kubernetes.io/kube-apiserver-client` requests made here.
    if let Some(signer) = api.csr_signer.clone() {
        let ctx = tessera_controllers::Context::new(api.component_client("csr-signer"));
        tokio::spawn(tessera_controllers::csrsigning::run(ctx, signer));
    }
    let client = api.component_client("federation");
    tokio::spawn(tessera_registry::objects::run(
        registry.clone(),
        client.clone(),
    ));
    tokio::spawn(tessera_propagation::run(tessera_propagation::Options {
        client,
        registry,
        workers: 4,
        max_moving: tuning.max_moving as usize,
        gang_commit_delay: std::time::Duration::from_millis(tuning.gang_commit_delay_ms),
        move_timeout: std::time::Duration::from_secs(tuning.move_timeout_seconds),
        queue_metrics: Some(standby.queues.clone()),
        runtime_metrics: Some(api.runtime.clone()),
        status_batch: std::time::Duration::from_millis(tuning.federation_status_batch_period_ms),
    }));
    Ok(Leading {
        grpc_url: format!("https://{grpc_addr}"),
        join_token: token,
        offers,
    })
}

/// Starts the federation, leading at once (one federation process, or `tessera up`).
pub async fn start(
    args: &UpArgs,
    tuning: &FederationTuning,
    offers_addr: Option<SocketAddr>,
) -> anyhow::Result<Federation> {
    let standby = start_api(args, None).await?;
    let leading = lead(args, tuning, offers_addr, &standby).await?;
    Ok(Federation {
        api: standby.api,
        grpc_url: leading.grpc_url,
        join_token: leading.join_token,
        offers: leading.offers,
    })
}

/// Flags of `tessera federation`.
#[derive(Args, Debug)]
pub struct FederationArgs {
    #[command(flatten)]
    pub base: UpArgs,
    #[command(flatten)]
    pub lease: FederationTuning,
    /// Serve resource offers to frameworks (`tessera.offers.v1`, TLS) on this address:
    /// frameworks subscribe with a token of the federation's API and are offered the nodes
    /// of every shard, by DRF over the whole fleet.
    #[arg(long)]
    pub offers_addr: Option<SocketAddr>,
    /// Run as one of several federation processes on one etcd store: each serves its API,
    /// but only the holder of the Lease `kube-system/tessera-federation` leads (registry,
    /// gRPC endpoint, propagation) and is ready (`/readyz`); a standby takes over when the
    /// leader's Lease lapses, as a restarted federation. A leader that cannot renew stops.
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set)]
    pub leader_elect: bool,
    #[command(flatten)]
    pub election: crate::components::ElectionTiming,
}

/// `tessera federation`: the federation control plane alone, until Ctrl-C.
pub async fn run(args: FederationArgs) -> anyhow::Result<()> {
    if args.leader_elect {
        return run_elected(args).await;
    }
    let f = start(&args.base, &args.lease, args.offers_addr).await?;
    println!("Tessera federation is up.");
    println!(
        "  api:      https://{} (kubectl: {})",
        f.api.api_addr,
        f.api.kubeconfig.display()
    );
    print_leading(&args, &f.grpc_url, f.offers);
    println!("  metrics:  http://{}/metrics", f.api.metrics_addr);
    println!("Press Ctrl-C to stop.");
    tokio::signal::ctrl_c().await?;
    Ok(())
}

fn print_leading(args: &FederationArgs, grpc_url: &str, offers: Option<SocketAddr>) {
    println!("  grpc:     {grpc_url} (shards' agents join here)");
    if let Some(o) = offers {
        println!(
            "  offers:   https://{o} (tessera.offers.v1: frameworks subscribe with a federation token)"
        );
    }
    println!(
        "  join:     tessera join --federation {grpc_url} --federation-ca {} --token-file {} --name NAME --kubeconfig SHARD_KUBECONFIG",
        args.base.pki_dir().join("ca.crt").display(),
        args.base.pki_dir().join("join.token").display()
    );
}

/// The federation's leader Lease (in `kube-system` of its own API).
pub const LEADER_LEASE: &str = "tessera-federation";

/// `tessera federation --leader-elect`: the API at once (not ready), the rest while this
/// process holds the leader Lease. Losing it ends the process (its supervisor restarts it
/// as a standby), so two processes never lead at once for longer than the renew deadline.
async fn run_elected(args: FederationArgs) -> anyhow::Result<()> {
    let config = args.election.config(LEADER_LEASE)?;
    let gate = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let standby = start_api(&args.base, Some(gate.clone())).await?;
    println!(
        "Tessera federation is up (standby until it holds the Lease kube-system/{LEADER_LEASE})."
    );
    println!(
        "  api:      https://{} (kubectl: {})",
        standby.api.api_addr,
        standby.api.kubeconfig.display()
    );
    println!("  metrics:  http://{}/metrics", standby.api.metrics_addr);
    println!("  identity: {}", config.identity);
    println!("Press Ctrl-C to stop.");
    let elector = tessera_runtime::leader::LeaderElector::new(
        standby.api.component_client("federation-leader-election"),
        config,
        Some(standby.api.runtime.clone()),
    );
    let work = async {
        let leading = lead(&args.base, &args.lease, args.offers_addr, &standby).await?;
        gate.store(true, std::sync::atomic::Ordering::Release);
        tracing::info!(grpc = %leading.grpc_url, "leading the federation");
        println!("Leading.");
        print_leading(&args, &leading.grpc_url, leading.offers);
        std::future::pending::<anyhow::Result<()>>().await
    };
    crate::signals::lead_until_stopped(elector, work).await
}

/// Flags of `tessera join`.
#[derive(Args, Debug)]
pub struct JoinArgs {
    /// The federation's gRPC endpoint (`https://127.0.0.1:9465`); several, comma separated,
    /// for the processes of a leader-elected federation without a Service in front (the
    /// agent tries them in turn until the leader answers).
    #[arg(long)]
    pub federation: String,
    /// The federation's join token.
    #[arg(
        long,
        env = "TESSERA_JOIN_TOKEN",
        required_unless_present = "token_file"
    )]
    pub token: Option<String>,
    /// A file holding the join token (the federation's `pki/join.token`).
    #[arg(long)]
    pub token_file: Option<PathBuf>,
    /// The CA (PEM) that signs the federation's certificate (the federation's `pki/ca.crt`).
    #[arg(long)]
    pub federation_ca: PathBuf,
    /// This shard's name in the federation (a DNS label).
    #[arg(long)]
    pub name: String,
    /// This shard's labels: `region=eu,zone=a`.
    #[arg(long, default_value = "")]
    pub labels: String,
    /// The node label keys the shard's capacity summaries group nodes by, comma separated
    /// (at most 4; empty for none): a workload whose pods must run on nodes with one of
    /// these labels is placed by the room of those nodes alone.
    #[arg(
        long,
        default_value = "topology.kubernetes.io/zone,node.kubernetes.io/instance-type"
    )]
    pub summary_label_keys: String,
    /// The shard's kubeconfig (what the agent applies with).
    #[arg(long)]
    pub kubeconfig: PathBuf,
    /// The local address the agent connects to the federation from (on a host with
    /// several; default: the kernel's choice).
    #[arg(long)]
    pub bind_address: Option<std::net::IpAddr>,
    /// Address of this process's `/metrics`.
    #[arg(long, default_value = "127.0.0.1:0")]
    pub metrics_addr: SocketAddr,
    /// The token that reads every sample of `/metrics`, tenants' included (without it they
    /// are left out).
    #[arg(long)]
    pub metrics_token_file: Option<std::path::PathBuf>,
}

/// `key=value,key=value` as a map.
pub fn parse_labels(s: &str) -> anyhow::Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let Some((k, v)) = part.split_once('=') else {
            anyhow::bail!("{part:?} is not key=value");
        };
        if let Some(why) = tessera_core::names::qualified_name(k) {
            anyhow::bail!("key {k:?}: {why}");
        }
        if let Some(why) = tessera_core::names::label_value(v) {
            anyhow::bail!("value {v:?} of {k}: {why}");
        }
        out.insert(k.to_owned(), v.to_owned());
    }
    Ok(out)
}

/// Most label keys a summary groups nodes by (the groups are their values' combinations).
const MAX_GROUP_KEYS: usize = 4;

/// `a,b` as label keys, each a qualified name.
pub fn parse_label_keys(s: &str) -> anyhow::Result<Vec<String>> {
    let keys: Vec<String> = s
        .split(',')
        .map(str::trim)
        .filter(|k| !k.is_empty())
        .map(str::to_owned)
        .collect();
    for k in &keys {
        if let Some(why) = tessera_core::names::qualified_name(k) {
            anyhow::bail!("--summary-label-keys: {k:?}: {why}");
        }
    }
    if keys.len() > MAX_GROUP_KEYS {
        anyhow::bail!(
            "--summary-label-keys: {} keys, at most {MAX_GROUP_KEYS}",
            keys.len()
        );
    }
    Ok(keys)
}

/// `tessera join`: the shard's federation agent, until Ctrl-C or a refusal.
pub async fn join(args: JoinArgs) -> anyhow::Result<()> {
    let token = match (&args.token, &args.token_file) {
        (Some(t), _) => t.clone(),
        (None, Some(f)) => std::fs::read_to_string(f)
            .map_err(|e| anyhow::anyhow!("reading --token-file {}: {e}", f.display()))?
            .trim()
            .to_owned(),
        (None, None) => anyhow::bail!("--token or --token-file is required"),
    };
    let ca = std::fs::read_to_string(&args.federation_ca).map_err(|e| {
        anyhow::anyhow!(
            "reading --federation-ca {}: {e}",
            args.federation_ca.display()
        )
    })?;
    let http = HttpClient::from_kubeconfig(&args.kubeconfig)
        .map_err(|e| anyhow::anyhow!("{}", e.message))?;
    let api_url = http.server().to_owned();
    let api_ca = http.ca_pem().to_owned();
    // The shard checks lent nodes' credentials with a key derived from its admin token.
    let loan_key = tessera_apiserver::auth::Tokens::new(http.token()).loan_key_hex();
    let client: Arc<dyn Client> = tessera_runtime::client::Retrying::wrap(Arc::new(http));
    let registry = prometheus::Registry::new();
    let runtime = tessera_runtime::metrics::RuntimeMetrics::register(&registry)?;
    let agent_metrics = tessera_federation_agent::AgentMetrics::register(&registry)?;
    let offer_metrics = tessera_offers::OfferMetrics::register(&registry, "federation")?;
    let metrics_token = args
        .metrics_token_file
        .as_deref()
        .map(crate::metrics_server::read_token)
        .transpose()?;
    let addr = crate::metrics_server::serve(args.metrics_addr, registry, metrics_token).await?;
    tracing::info!(metrics = %addr, "serving metrics");
    let mut config = AgentConfig::new(&args.federation, &ca, &token, &args.name);
    config.labels = parse_labels(&args.labels).map_err(|e| anyhow::anyhow!("--labels: {e}"))?;
    config.group_keys = parse_label_keys(&args.summary_label_keys)?;
    config.bind_address = args.bind_address;
    config.metrics = Some(agent_metrics);
    config.offer_metrics = Some(offer_metrics);
    config.api_url = api_url;
    config.api_ca = api_ca;
    config.loan_key = loan_key;
    tokio::select! {
        r = tessera_federation_agent::run(config, client, Some(runtime)) => r.map_err(|e| anyhow::anyhow!("{e}")),
        _ = tokio::signal::ctrl_c() => Ok(()),
    }
}

/// Starts shard `shard`'s federation agent in this process, against its in-process API.
pub fn start_agent(
    shard: &Shard,
    name: &str,
    federation_url: &str,
    federation_ca: &str,
    token: &str,
    labels: BTreeMap<String, String>,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let client = shard.component_client("federation-agent");
    let mut config = AgentConfig::new(federation_url, federation_ca, token, name);
    config.labels = labels;
    config.api_url = format!("https://{}", shard.api_addr);
    config.api_ca = shard.ca_pem.clone();
    config.loan_key = shard.tokens.loan_key_hex();
    config.metrics = Some(tessera_federation_agent::AgentMetrics::register(
        &shard.registry,
    )?);
    config.offer_metrics = Some(tessera_offers::OfferMetrics::register(
        &shard.registry,
        "federation",
    )?);
    let runtime = shard.runtime.clone();
    let informers = shard.informers.clone();
    let name = name.to_owned();
    Ok(tokio::spawn(async move {
        if let Err(e) =
            tessera_federation_agent::run_with(config, client, Some(runtime), informers).await
        {
            tracing::error!(shard = %name, error = %e, "the shard's federation agent stopped");
        }
    }))
}

/// A kubeconfig with a context per control plane (`federation`, `shard-0`, …), the first
/// current.
pub fn kubeconfig(contexts: &[(String, String, String, String)]) -> String {
    use base64::Engine;
    let mut clusters = String::new();
    let mut ctxs = String::new();
    let mut users = String::new();
    for (name, server, ca, token) in contexts {
        let ca = base64::engine::general_purpose::STANDARD.encode(ca);
        clusters.push_str(&format!(
            "- name: {name}\n  cluster:\n    server: {server}\n    certificate-authority-data: {ca}\n"
        ));
        ctxs.push_str(&format!(
            "- name: {name}\n  context:\n    cluster: {name}\n    user: {name}-admin\n"
        ));
        users.push_str(&format!(
            "- name: {name}-admin\n  user:\n    token: {token}\n"
        ));
    }
    let current = contexts.first().map_or("", |c| c.0.as_str());
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n{clusters}contexts:\n{ctxs}current-context: {current}\nusers:\n{users}"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_label_keys_are_checked() {
        assert_eq!(
            parse_label_keys(" topology.kubernetes.io/zone , pool ").expect("valid"),
            ["topology.kubernetes.io/zone", "pool"]
        );
        assert!(parse_label_keys("").expect("none").is_empty());
        let bad = parse_label_keys("not a key").expect_err("refused");
        assert!(bad.to_string().contains("\"not a key\""), "{bad}");
        assert!(parse_label_keys("a,b,c,d,e").is_err());
    }
}
