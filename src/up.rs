//! `tessera up` and `tessera apiserver`: a shard's store (embedded by default), its compactor,
//! metrics, and the Kubernetes API over TLS with a kubeconfig. `up` also runs the controllers,
//! the scheduler and a simulated node agent in the same process (each can be turned off and
//! run as its own process instead); `apiserver` stays the API server alone.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;
use prometheus::Registry;
use tessera_apiserver::api::Api;
use tessera_apiserver::auth::{Tokens, User};
use tessera_apiserver::client::{Client, InProcess};
use tessera_apiserver::metrics::ApiMetrics;
use tessera_apiserver::pki::Credentials;
use tessera_apiserver::{http, serve};
use tessera_runtime::Informers;
use tessera_runtime::metrics::RuntimeMetrics;
use tessera_store::{Store, StoreMetrics, compactor};

use crate::store_config::{self, StoreArgs};

/// Flags of `tessera up` and `tessera apiserver`.
#[derive(Args, Debug)]
pub struct UpArgs {
    /// Where state is kept.
    #[arg(long, default_value = "./data")]
    pub data_dir: PathBuf,
    /// Where the CA, serving certificate and tokens are (default: DATA/pki, made on first
    /// use). A directory made by `tessera certs init` (e.g. a mounted Secret) is only read.
    #[arg(long)]
    pub pki_dir: Option<PathBuf>,
    /// Address of the metrics and health endpoint.
    #[arg(long, default_value = "127.0.0.1:9464")]
    pub metrics_addr: SocketAddr,
    /// The token that reads every sample of the metrics endpoint, tenants' included (without
    /// a token they are left out). Default: DATA/pki/metrics.token, made on first use.
    #[arg(long)]
    pub metrics_token_file: Option<PathBuf>,
    /// Address of the gRPC endpoint (grpc.health.v1 today).
    #[arg(long, default_value = "127.0.0.1:9465")]
    pub grpc_addr: SocketAddr,
    /// Address of the Kubernetes API (HTTPS).
    #[arg(long, default_value = "127.0.0.1:6443")]
    pub api_addr: SocketAddr,
    /// Serve watches from one store watch per resource (`false`: each watch reads the store).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub watch_cache: bool,
    /// Seconds a new pod tolerates its node being not ready before it is evicted, unless
    /// the pod has its own toleration of `node.kubernetes.io/not-ready:NoExecute`
    /// (kube-apiserver's DefaultTolerationSeconds admission).
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(i64).range(0..))]
    pub default_not_ready_toleration_seconds: i64,
    /// The same for `node.kubernetes.io/unreachable:NoExecute` (a node whose Lease lapsed).
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(i64).range(0..))]
    pub default_unreachable_toleration_seconds: i64,
    #[command(flatten)]
    pub store: StoreArgs,
}

impl UpArgs {
    /// The metrics token's file: `--metrics-token-file`, or PKI/metrics.token.
    pub fn metrics_token_path(&self) -> PathBuf {
        self.metrics_token_file
            .clone()
            .unwrap_or_else(|| self.pki_dir().join("metrics.token"))
    }

    /// The credentials' directory: `--pki-dir`, or DATA/pki.
    pub fn pki_dir(&self) -> PathBuf {
        self.pki_dir
            .clone()
            .unwrap_or_else(|| self.data_dir.join("pki"))
    }
}

/// What `tessera up` runs besides the API server.
#[derive(Args, Debug)]
pub struct WorkerArgs {
    /// Simulated nodes to run in this process (0 for none).
    #[arg(long, default_value_t = 300)]
    pub nodes_per_shard: usize,
    /// Nodes whose containers run as real local processes (`proc-0`, ...; logs in DIR/logs).
    #[arg(long, default_value_t = 0)]
    pub process_nodes: usize,
    /// What one shard's node names begin with: simulated nodes `PREFIX-0`, ...; process nodes
    /// `PREFIX-proc-0`, ... (`proc-0` with the default). Shards that lend each other nodes need
    /// names unique across the federation.
    #[arg(long, default_value = "sim-node")]
    pub node_prefix: String,
    /// How process nodes isolate containers: `sandbox` (user, mount, PID, IPC, UTS and
    /// network namespaces, a per-pod id range, cgroup limits; needs root) or `off` (plain
    /// child processes with the agent's rights — trusted code on a developer machine only).
    #[arg(long, value_enum, default_value_t = crate::components::ProcessIsolation::Sandbox)]
    pub process_isolation: crate::components::ProcessIsolation,
    /// Run the controllers in this process (false: run `tessera controller-manager`).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub controllers: bool,
    /// Run the scheduler in this process (false: run `tessera scheduler`).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub scheduler: bool,
    /// The scheduler's configuration file (profiles and plugins).
    #[arg(long)]
    pub scheduler_config: Option<PathBuf>,
    /// Seconds without a Lease renewal before a node is unreachable (tainted; its pods are
    /// evicted once their toleration of that runs out: `--default-unreachable-toleration-seconds`).
    #[arg(long, default_value_t = 40.0)]
    pub node_monitor_grace_period: f64,
    /// Milliseconds a workload's status writes that only follow its pods are batched over
    /// (a workload at rest is written at once; 0 writes every change).
    #[arg(long, default_value_t = 100)]
    pub status_batch_period_ms: u64,
    /// Seconds between recounts of every ResourceQuota's usage.
    #[arg(long, default_value_t = 300.0)]
    pub resource_quota_sync_period: f64,
    #[command(flatten)]
    pub hpa: crate::components::HpaArgs,
    #[command(flatten)]
    pub sim: crate::components::SimArgs,
}

/// Flags of `tessera up`.
#[derive(Args, Debug)]
pub struct UpAllArgs {
    #[command(flatten)]
    pub base: UpArgs,
    #[command(flatten)]
    pub workers: WorkerArgs,
    /// Shards under a federation in this process (each its own embedded store, API,
    /// controllers, scheduler and `--nodes-per-shard` simulated nodes); 0 for one shard alone.
    #[arg(long, default_value_t = 3)]
    pub shards: usize,
    #[command(flatten)]
    pub lease: crate::federation::FederationTuning,
    /// Join this one shard to the federation at this gRPC URL instead of running one
    /// (with `--federation-ca`, `--join-token-file`, `--shard-name`).
    #[arg(long)]
    pub federation: Option<String>,
    /// With `--federation`: the federation's CA (its `pki/ca.crt`).
    #[arg(long, requires = "federation")]
    pub federation_ca: Option<PathBuf>,
    /// With `--federation`: a file holding its join token (its `pki/join.token`).
    #[arg(long, requires = "federation")]
    pub join_token_file: Option<PathBuf>,
    /// This shard's name in the federation.
    #[arg(long, default_value = "shard")]
    pub shard_name: String,
    /// Serve resource offers to frameworks (`tessera.offers.v1`, TLS) on this address: with
    /// `--shards 0` the shard's nodes; with `--shards N` the federation's endpoint, offering
    /// every shard's nodes by DRF over the whole fleet.
    #[arg(long)]
    pub offers_addr: Option<SocketAddr>,
    /// Labels of the shards, `region=eu,zone=a` for all, or one set per shard separated by
    /// `;` (`region=eu;region=eu;region=us`).
    #[arg(long, default_value = "")]
    pub shard_labels: String,
}

/// What a running shard serves.
pub struct Shard {
    /// The store.
    pub store: Arc<dyn Store>,
    /// Where the API listens.
    pub api_addr: SocketAddr,
    /// Where metrics are served.
    pub metrics_addr: SocketAddr,
    /// The kubeconfig written for it.
    pub kubeconfig: PathBuf,
    /// The process's metrics.
    pub registry: Registry,
    /// The API (for in-process components, each with its own identity).
    pub api: Api,
    /// The credentials rooted in the admin token (node agents check the API server's).
    pub tokens: Tokens,
    /// The CA (PEM) that signs the API server's certificate.
    pub ca_pem: String,
    /// The signer of `kubernetes.io/kube-apiserver-client` requests, with that CA (None for
    /// a data directory that does not keep the CA's key).
    pub csr_signer: Option<Arc<dyn tessera_controllers::csrsigning::CertificateSigner>>,
    /// Informer, reconcile and event metrics of the in-process components.
    pub runtime: RuntimeMetrics,
    /// The informers the shard's in-process controllers, scheduler and agents share: each
    /// change is decoded once for all of them.
    pub informers: Arc<Informers>,
}

impl Shard {
    /// An in-process client acting as control-plane component `name` (its own fairness
    /// seats), retrying when the API sheds load.
    pub fn component_client(&self, name: &str) -> Arc<dyn Client> {
        tessera_runtime::client::Retrying::wrap(Arc::new(InProcess::new(
            self.api.clone(),
            User::System(name.into()),
        )))
    }
}

/// The default StorageClass `standard`: claims that name no class get a hostPath volume
/// under `DATA/volumes` on the node that runs their pod (made once; an admin may change or
/// replace it).
async fn default_storage_class(
    client: &dyn tessera_apiserver::client::Client,
    data_dir: &std::path::Path,
) -> anyhow::Result<()> {
    let classes =
        tessera_apiserver::request::find_resource("storage.k8s.io", "v1", "storageclasses")
            .map_err(|e| anyhow::anyhow!("{}", e.message))?;
    let root = std::path::absolute(data_dir.join("volumes"))?;
    let sc = serde_json::json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
        "metadata": {"name": "standard", "annotations": {
            "storageclass.kubernetes.io/is-default-class": "true"}},
        "provisioner": "tessera.io/hostpath",
        "parameters": {"root": root.to_string_lossy()},
        "reclaimPolicy": "Delete", "volumeBindingMode": "Immediate"});
    match client.create(classes, None, &sc).await {
        Ok(_) => Ok(()),
        Err(e) if e.code == 409 => Ok(()),
        Err(e) => anyhow::bail!("creating the default StorageClass: {}", e.message),
    }
}

/// Namespaces every cluster has.
const SYSTEM_NAMESPACES: [&str; 4] = ["default", "kube-system", "kube-public", "kube-node-lease"];

use tessera_agent::loans::{Lendable, Loans};

/// Opens the store and serves the API and metrics.
pub async fn start(args: &UpArgs) -> anyhow::Result<Shard> {
    start_with(args, None, None).await
}

/// [`start`], the API reading pods, nodes and events across `shards` (the federation's).
pub async fn start_with(
    args: &UpArgs,
    shards: Option<Arc<dyn tessera_apiserver::client::ShardSet>>,
    ready_gate: Option<Arc<std::sync::atomic::AtomicBool>>,
) -> anyhow::Result<Shard> {
    let registry = Registry::new();
    let metrics = StoreMetrics::register(&registry)?;
    let api_metrics = ApiMetrics::register(&registry)?;
    crate::data_dir::secure(&args.data_dir)?;
    let store = store_config::open(&args.store, &args.data_dir, metrics).await?;
    tokio::spawn(compactor::run(
        store.clone(),
        args.store.compaction_interval,
    ));
    let metrics_token = match &args.metrics_token_file {
        Some(f) => crate::metrics_server::read_token(f)?,
        None => tessera_apiserver::pki::metrics_token(&args.pki_dir())?,
    };
    let metrics_addr =
        crate::metrics_server::serve(args.metrics_addr, registry.clone(), Some(metrics_token))
            .await?;
    let credentials = Credentials::load_or_create(&args.pki_dir())?;
    let root = tessera_apiserver::pki::token_root(&args.pki_dir())?;
    let tokens = Tokens::with_root(&credentials.admin_token, &root);
    let mut api = Api::new(store.clone(), Some(api_metrics))
        .with_node_proxy(tokens.clone())
        .with_metrics_registry(registry.clone());
    if !args.watch_cache {
        api = api.without_watch_cache();
    }
    api = api.with_default_toleration_seconds(
        args.default_not_ready_toleration_seconds,
        args.default_unreachable_toleration_seconds,
    );
    if let Some(shards) = shards {
        api = api.with_shards(shards);
    }
    if let Some(gate) = ready_gate {
        api = api.with_ready_gate(gate);
    }
    let client: Arc<dyn Client> = Arc::new(InProcess::new(api.clone(), User::Admin));
    let namespaces = tessera_apiserver::request::find_resource("", "v1", "namespaces")
        .map_err(|e| anyhow::anyhow!("{}", e.message))?;
    for ns in SYSTEM_NAMESPACES {
        let obj = serde_json::json!({"metadata": {"name": ns}});
        if let Err(e) = client.create_if_absent(namespaces, None, &obj).await {
            anyhow::bail!("creating namespace {ns}: {}", e.message);
        }
    }
    tessera_apiserver::rbac::defaults::ensure(&*client)
        .await
        .map_err(|e| anyhow::anyhow!("putting the default RBAC roles in place: {}", e.message))?;
    tessera_apiserver::apiservices::ensure(&*client)
        .await
        .map_err(|e| anyhow::anyhow!("registering the local APIServices: {}", e.message))?;
    // API aggregation: the front proxy's certificate, the ConfigMap extension servers read
    // it from, and the availability checker of APIServices naming a Service.
    match tessera_apiserver::pki::FrontProxy::load_or_create(&args.pki_dir())? {
        Some(front_proxy) => {
            api.aggregator()
                .set_front_proxy(&front_proxy)
                .map_err(|e| anyhow::anyhow!("the front-proxy certificate: {e}"))?;
            tessera_apiserver::aggregator::ensure_authentication_config_map(
                &*client,
                &credentials.ca_pem,
                &front_proxy.ca_pem,
            )
            .await
            .map_err(|e| {
                anyhow::anyhow!(
                    "writing kube-system/{}: {}",
                    tessera_apiserver::aggregator::AUTHENTICATION_CONFIG_MAP,
                    e.message
                )
            })?;
        }
        None => tracing::warn!(
            pki_dir = %args.pki_dir().display(),
            "the pki directory has no front-proxy CA and cannot take one: APIServices naming a Service will not be reached (`tessera certs init` writes front-proxy-ca.crt and .key)"
        ),
    }
    tokio::spawn(tessera_apiserver::aggregator::available::run(
        api.clone(),
        Arc::new(InProcess::new(
            api.clone(),
            User::System("kube-aggregator".into()),
        )),
    ));
    default_storage_class(&*client, &args.data_dir).await?;
    let router = http::router(api.clone(), tokens.clone());
    let api_addr = serve::serve_tls(args.api_addr, &credentials, router).await?;
    let kubeconfig = args.data_dir.join("kubeconfig");
    credentials.write_kubeconfig(&kubeconfig, &format!("https://{api_addr}"))?;
    let runtime = RuntimeMetrics::register(&registry)?;
    let informers = Informers::new(
        tessera_runtime::client::Retrying::wrap(Arc::new(InProcess::new(
            api.clone(),
            User::System("informers".into()),
        ))),
        Some(runtime.clone()),
    );
    Ok(Shard {
        runtime,
        informers,
        store,
        api_addr,
        metrics_addr,
        kubeconfig,
        registry,
        api,
        tokens,
        ca_pem: credentials.ca_pem.clone(),
        csr_signer: match &credentials.ca_key_pem {
            Some(key) => Some(crate::components::client_signer(
                &credentials.ca_pem,
                key,
                tessera_apiserver::client_certs::DEFAULT_MAX_VALIDITY,
            )?),
            None => None,
        },
    })
}

async fn banner(shard: &Shard, args: &UpArgs, what: &str) -> anyhow::Result<()> {
    println!("Tessera {what}is up.");
    let revision = shard.store.current_revision().await?;
    println!(
        "  store:    {} at revision {revision}",
        shard.store.backend()
    );
    if shard.store.backend() == "embedded" {
        println!("  data:     {}", args.data_dir.join("store").display());
    }
    println!(
        "  api:      https://{} (Kubernetes 1.32 API: CRUD, patch, server-side apply, watch, tables, openapi)",
        shard.api_addr
    );
    println!("  metrics:  http://{}/metrics", shard.metrics_addr);
    Ok(())
}

fn usage(shard: &Shard, args: &UpArgs) {
    println!();
    println!("  export KUBECONFIG={}", shard.kubeconfig.display());
    println!("  kubectl api-resources");
    println!(
        "  tessera token create --tenant NAME --ttl 24h --data-dir {}   # a tenant's token",
        args.data_dir.display()
    );
    println!();
}

/// Starts the controllers, scheduler and simulated nodes `workers` asks for, in process:
/// simulated nodes `{node_prefix}-{i}`, process nodes `{process_prefix}proc-{i}` (node names
/// are unique in a federation: a node lent to another shard keeps its name there).
pub async fn start_workers(
    shard: &Shard,
    workers: &WorkerArgs,
    data_dir: &std::path::Path,
    node_prefix: &str,
    process_prefix: &str,
) -> anyhow::Result<Vec<tokio::task::JoinHandle<()>>> {
    use crate::components;
    let mut tasks = Vec::new();
    let runtime = shard.runtime.clone();
    if workers.scheduler {
        let config = components::scheduler_config(workers.scheduler_config.as_ref())?;
        let s = components::build_scheduler(
            shard.component_client("scheduler"),
            config,
            &shard.registry,
            Some(runtime.clone()),
            Some(shard.informers.clone()),
        )?;
        tasks.push(tokio::spawn(s.run()));
    }
    if workers.controllers {
        let ctx = tessera_controllers::Context {
            client: shard.component_client("controller-manager"),
            queue_metrics: Some(tessera_runtime::metrics::QueueMetrics::register(
                &shard.registry,
            )?),
            runtime_metrics: Some(runtime.clone()),
            workers: 4,
            clock: Arc::new(tessera_controllers::clock::SystemClock),
            informers: shard.informers.clone(),
            status_batch: std::time::Duration::from_millis(workers.status_batch_period_ms),
        };
        let mut settings = crate::components::controller_settings(
            workers.node_monitor_grace_period,
            workers.resource_quota_sync_period,
            &workers.hpa,
            &shard.registry,
        )?;
        settings.root_ca = Some(shard.ca_pem.clone());
        settings.csr_signer = shard.csr_signer.clone();
        tasks.push(tokio::spawn(tessera_controllers::run_all_with(
            ctx, settings,
        )));
    }
    // Every node this process runs may be lent to another shard (elastic shards).
    let mut lendable = std::collections::HashMap::new();
    if workers.nodes_per_shard > 0 {
        let config = workers.sim.config(node_prefix, workers.nodes_per_shard);
        let agent = tessera_agent::sim::SimAgent::new(
            shard.component_client("node-agent"),
            config.clone(),
            Some(tessera_agent::metrics::AgentMetrics::register(
                &shard.registry,
            )?),
            Some(runtime),
        );
        components::register_sim(&agent).await?;
        for name in agent.node_names() {
            lendable.insert(name.clone(), Lendable::Sim(Box::new(config.clone())));
        }
        tasks.push(tokio::spawn(agent.run_with(Some(shard.informers.clone()))));
    }
    for i in 0..workers.process_nodes {
        let name = format!("{process_prefix}proc-{i}");
        let config = tessera_agent::process::ProcessConfig {
            tokens: Some(shard.tokens.clone()),
            isolation: workers.process_isolation.isolation(),
            state_dir: data_dir.join("pods"),
            ..tessera_agent::process::ProcessConfig::new(&name, data_dir.join("logs"))
        };
        lendable.insert(name.clone(), Lendable::Process(Box::new(config.clone())));
        let agent =
            tessera_agent::process::ProcessAgent::new(shard.component_client("node-agent"), config);
        agent
            .register()
            .await
            .map_err(|e| anyhow::anyhow!("registering process node {name}: {}", e.message))?;
        agent.register_metrics(&shard.registry)?;
        tasks.push(tokio::spawn(agent.run()));
    }
    if !lendable.is_empty() {
        let loans = Loans::new(shard.component_client("node-agent"), lendable);
        tasks.push(tokio::spawn(loans.run()));
    }
    Ok(tasks)
}

/// `addr` with its port moved up by `k` (port 0 stays 0: any free port), or why it cannot.
fn offset(addr: SocketAddr, k: usize) -> anyhow::Result<SocketAddr> {
    let mut a = addr;
    if a.port() != 0 {
        let port = u16::try_from(a.port() as usize + k).map_err(|_| {
            anyhow::anyhow!(
                "{addr} leaves no room for {k} more ports: shard ports follow the federation's; pick a lower port or fewer --shards"
            )
        })?;
        a.set_port(port);
    }
    Ok(a)
}

/// `tessera up`: serves until Ctrl-C.
pub async fn run(all: UpAllArgs) -> anyhow::Result<()> {
    if all.shards == 0 || all.federation.is_some() {
        return run_single(all).await;
    }
    run_federated(all).await
}

/// `--shard-labels` for N shards: one set for all (`region=eu`), or one per shard separated
/// by `;` (`region=eu;region=eu;region=us`).
fn shard_label_sets(
    s: &str,
    shards: usize,
) -> anyhow::Result<Vec<std::collections::BTreeMap<String, String>>> {
    let sets: Vec<&str> = s.split(';').collect();
    if sets.len() == 1 {
        let one = crate::federation::parse_labels(s)
            .map_err(|e| anyhow::anyhow!("--shard-labels: {e}"))?;
        return Ok(vec![one; shards]);
    }
    if sets.len() != shards {
        anyhow::bail!(
            "--shard-labels has {} sets separated by ';' for {shards} shards: give one set for all, or one per shard",
            sets.len()
        );
    }
    sets.iter()
        .map(|set| {
            crate::federation::parse_labels(set).map_err(|e| anyhow::anyhow!("--shard-labels: {e}"))
        })
        .collect()
}

/// A federation and its shards running in this process.
pub struct Fleet {
    /// The federation.
    pub federation: crate::federation::Federation,
    /// The shards, by name.
    pub shards: Vec<(String, Shard)>,
    /// Their controllers, schedulers, nodes and agents (aborted when the fleet is dropped).
    pub tasks: Vec<tokio::task::JoinHandle<()>>,
    /// Which of `tasks` are each shard's (by the shards' order).
    pub shard_tasks: Vec<std::ops::Range<usize>>,
}

impl Fleet {
    /// Stops shard `i` as a crash would, as far as a process can within itself: its
    /// federation agent, scheduler, controllers and nodes stop at once (its API server
    /// answers on, with nobody acting; nothing is shut down in order).
    pub fn kill_shard(&self, i: usize) {
        for t in &self.tasks[self.shard_tasks[i].clone()] {
            t.abort();
        }
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Starts the federation and `all.shards` shards (see [`run_federated`]) and writes the
/// kubeconfig with a context for each.
pub async fn start_federated(all: &UpAllArgs) -> anyhow::Result<Fleet> {
    use indicatif::{ProgressBar, ProgressStyle};
    let args = &all.base;
    let labels = shard_label_sets(&all.shard_labels, all.shards)?;
    // Every shard's ports are checked before anything starts.
    offset(args.api_addr, all.shards)?;
    offset(args.metrics_addr, all.shards + 1)?;
    let bar = ProgressBar::new(all.shards as u64 + 1).with_style(
        ProgressStyle::with_template("{msg:>12} [{bar:30}] {pos}/{len} {elapsed}")
            .expect("a valid template")
            .progress_chars("=> "),
    );
    bar.set_message("federation");
    let fed = crate::federation::start(args, &all.lease, all.offers_addr).await?;
    bar.inc(1);
    let mut contexts = vec![(
        "federation".to_owned(),
        format!("https://{}", fed.api.api_addr),
        fed.api.ca_pem.clone(),
        std::fs::read_to_string(args.data_dir.join("pki/admin.token"))?
            .trim()
            .to_owned(),
    )];
    let mut shards = Vec::new();
    let mut tasks = Vec::new();
    let mut shard_tasks = Vec::new();
    for (i, shard_labels) in labels.iter().enumerate() {
        let first_task = tasks.len();
        let name = format!("shard-{i}");
        bar.set_message(name.clone());
        let data_dir = args.data_dir.join("shards").join(&name);
        let shard_args = UpArgs {
            data_dir: data_dir.clone(),
            pki_dir: None,
            metrics_addr: offset(args.metrics_addr, 2 + i)?,
            // One token reads every endpoint of the fleet: one `credentials_file` scrapes all.
            metrics_token_file: Some(args.metrics_token_path()),
            grpc_addr: offset(args.grpc_addr, 0)?,
            api_addr: offset(args.api_addr, 1 + i)?,
            watch_cache: args.watch_cache,
            default_not_ready_toleration_seconds: args.default_not_ready_toleration_seconds,
            default_unreachable_toleration_seconds: args.default_unreachable_toleration_seconds,
            store: crate::store_config::StoreArgs {
                store: crate::store_config::Backend::Embedded,
                etcd_cafile: None,
                etcd_certfile: None,
                etcd_keyfile: None,
                ..args.store.clone()
            },
        };
        let shard = start(&shard_args).await?;
        tasks.extend(
            start_workers(
                &shard,
                &all.workers,
                &data_dir,
                &format!("{name}-node"),
                &format!("{name}-"),
            )
            .await?,
        );
        tasks.push(crate::federation::start_agent(
            &shard,
            &name,
            &fed.grpc_url,
            &fed.api.ca_pem,
            &fed.join_token,
            shard_labels.clone(),
        )?);
        contexts.push((
            name.clone(),
            format!("https://{}", shard.api_addr),
            shard.ca_pem.clone(),
            std::fs::read_to_string(data_dir.join("pki/admin.token"))?
                .trim()
                .to_owned(),
        ));
        shards.push((name, shard));
        shard_tasks.push(first_task..tasks.len());
        bar.inc(1);
    }
    bar.finish_and_clear();
    let kubeconfig = args.data_dir.join("kubeconfig");
    tessera_apiserver::pki::write_private(&kubeconfig, &crate::federation::kubeconfig(&contexts))?;
    Ok(Fleet {
        federation: fed,
        shards,
        tasks,
        shard_tasks,
    })
}

/// `tessera up --shards N`: a federation on the base flags' addresses and data dir, shard
/// `i` in `DATA/shards/shard-i` with its API on the API port + 1 + i and its metrics on the
/// metrics port + 2 + i; one kubeconfig with a context each.
async fn run_federated(all: UpAllArgs) -> anyhow::Result<()> {
    let args = &all.base;
    let fleet = start_federated(&all).await?;
    let (fed, shards) = (&fleet.federation, &fleet.shards);
    let kubeconfig = args.data_dir.join("kubeconfig");
    let mut targets = vec![crate::monitoring::Target {
        job: "tessera-federation",
        addr: fed.api.metrics_addr,
        shard: None,
    }];
    targets.extend(shards.iter().map(|(name, s)| crate::monitoring::Target {
        job: "tessera-shard",
        addr: s.metrics_addr,
        shard: Some(name.clone()),
    }));
    let prometheus =
        crate::monitoring::write(&args.data_dir, &targets, &args.metrics_token_path())?;
    println!("Tessera is up: a federation and {} shards.", all.shards);
    println!(
        "  federation: https://{} (Kubernetes 1.32 API; store {} in {})",
        fed.api.api_addr,
        fed.api.store.backend(),
        args.data_dir.join("store").display()
    );
    println!(
        "              grpc {} (shards' agents), metrics http://{}/metrics",
        fed.grpc_url, fed.api.metrics_addr
    );
    if let Some(o) = fed.offers {
        println!(
            "  offers:     https://{o} (tessera.offers.v1: frameworks subscribe with a federation token and are offered every shard's nodes)"
        );
    }
    let w = &all.workers;
    for (name, s) in shards {
        println!(
            "  {name}:    https://{} with {} simulated nodes ({} cpu, {} memory each), metrics http://{}/metrics",
            s.api_addr, w.nodes_per_shard, w.sim.node_cpu, w.sim.node_memory, s.metrics_addr
        );
    }
    println!();
    println!("  export KUBECONFIG={}", kubeconfig.display());
    println!(
        "  kubectl get shards                                   # the shards, their nodes and free capacity"
    );
    println!(
        "  kubectl create namespace demo && kubectl create deployment web -n demo --image=nginx --replicas=20"
    );
    println!(
        "  kubectl rollout status deployment/web -n demo        # placed on the tenant's home shard"
    );
    println!("  kubectl get shardmap default -o yaml                 # the tenant -> shard map");
    println!("  kubectl --context shard-0 get pods -A                # one shard's own view");
    println!(
        "  prometheus --config.file={} --web.listen-address=127.0.0.1:9090   # every endpoint, with Tessera's rules and alerts",
        prometheus.display()
    );
    println!(
        "  tessera token create --tenant NAME --data-dir {}      # a tenant's token at the federation",
        args.data_dir.display()
    );
    println!();
    println!("Press Ctrl-C to stop.");
    let _keep = fleet;
    tokio::signal::ctrl_c().await?;
    tracing::info!("shutting down");
    Ok(())
}

/// `tessera up --shards 0` (or `--federation URL`): one shard in this process.
async fn run_single(all: UpAllArgs) -> anyhow::Result<()> {
    let args = &all.base;
    let shard = start(args).await?;
    let grpc = crate::health::serve(args.grpc_addr, shard.store.clone()).await?;
    let w = &all.workers;
    let process_prefix = if w.node_prefix == "sim-node" {
        String::new()
    } else {
        format!("{}-", w.node_prefix)
    };
    let mut _tasks =
        start_workers(&shard, w, &args.data_dir, &w.node_prefix, &process_prefix).await?;
    if let Some(url) = &all.federation {
        let (Some(ca), Some(token)) = (&all.federation_ca, &all.join_token_file) else {
            anyhow::bail!("--federation needs --federation-ca and --join-token-file");
        };
        let ca = std::fs::read_to_string(ca)
            .map_err(|e| anyhow::anyhow!("reading --federation-ca {}: {e}", ca.display()))?;
        let token = std::fs::read_to_string(token)
            .map_err(|e| anyhow::anyhow!("reading --join-token-file {}: {e}", token.display()))?;
        _tasks.push(crate::federation::start_agent(
            &shard,
            &all.shard_name,
            url,
            &ca,
            token.trim(),
            crate::federation::parse_labels(&all.shard_labels)
                .map_err(|e| anyhow::anyhow!("--shard-labels: {e}"))?,
        )?);
    }
    let offers = match all.offers_addr {
        Some(addr) => Some(crate::offers::serve(&shard, addr, &args.pki_dir()).await?),
        None => None,
    };
    banner(&shard, args, "").await?;
    let prometheus = crate::monitoring::write(
        &args.data_dir,
        &[crate::monitoring::Target {
            job: "tessera-shard",
            addr: shard.metrics_addr,
            shard: Some(all.shard_name.clone()),
        }],
        &args.metrics_token_path(),
    )?;
    println!("  grpc:     {grpc} (grpc.health.v1)");
    println!(
        "  prometheus: prometheus --config.file={} (scrape configuration and Tessera's rules)",
        prometheus.display()
    );
    if let Some(o) = offers {
        println!(
            "  offers:   https://{o} (tessera.offers.v1: frameworks subscribe with an API token)"
        );
    }
    let w = &all.workers;
    let on = |b: bool| {
        if b {
            "running"
        } else {
            "off (run it as its own process)"
        }
    };
    println!("  scheduler:   {}", on(w.scheduler));
    if w.controllers {
        let settings = tessera_controllers::Settings {
            root_ca: Some(shard.ca_pem.clone()),
            csr_signer: shard.csr_signer.clone(),
            ..Default::default()
        };
        println!(
            "  controllers: running ({})",
            tessera_controllers::names(&settings).join(", ")
        );
    } else {
        println!("  controllers: {}", on(false));
    }
    println!(
        "  nodes:       {} simulated ({} cpu, {} memory, {} pods each), {} running real processes",
        w.nodes_per_shard, w.sim.node_cpu, w.sim.node_memory, w.sim.node_pods, w.process_nodes
    );
    usage(&shard, args);
    println!("Press Ctrl-C to stop.");
    tokio::signal::ctrl_c().await?;
    tracing::info!("shutting down");
    Ok(())
}

/// `tessera apiserver`: the API server alone, until Ctrl-C.
pub async fn run_apiserver(args: UpArgs) -> anyhow::Result<()> {
    let shard = start(&args).await?;
    banner(&shard, &args, "API server ").await?;
    usage(&shard, &args);
    println!("Press Ctrl-C to stop.");
    tokio::signal::ctrl_c().await?;
    tracing::info!("shutting down");
    Ok(())
}

/// Flags of `tessera token create`.
#[derive(Args, Debug)]
pub struct TokenArgs {
    /// The tenant the token acts for: it may touch only the namespaces its Tenant lists.
    /// Alone, the token is the tenant's own (everything within its namespaces); with
    /// `--user`, it names a user within the tenant, who may do what RBAC grants it there.
    #[arg(long, required_unless_present = "user")]
    pub tenant: Option<String>,
    /// A user token for this user name: RBAC decides what it may do (bind it with a
    /// RoleBinding or ClusterRoleBinding whose subject is `kind: User`).
    #[arg(long)]
    pub user: Option<String>,
    /// Groups the user is in (RBAC subjects of `kind: Group`); repeat for more.
    #[arg(long = "group", requires = "user")]
    pub groups: Vec<String>,
    /// How long the token is good for (`30m`, `24h`, `90d`; at most a year).
    #[arg(long, default_value = "24h", value_parser = crate::store_config::parse_duration)]
    pub ttl: std::time::Duration,
    /// The data directory of the API server: its `pki/token.key` signs the token and its
    /// `kubeconfig` reaches the API, where the Tenant is read (the token names its uid).
    #[arg(long, default_value = "./data")]
    pub data_dir: PathBuf,
}

/// `tessera token create`: prints a tenant's bearer token, bound to the Tenant as it is now
/// (its uid and `spec.tokenGeneration`) and to an expiry.
pub async fn token_create(args: TokenArgs) -> anyhow::Result<()> {
    if let Some(tenant) = &args.tenant
        && let Some(why) = tessera_core::names::dns1123_subdomain(tenant)
    {
        anyhow::bail!("--tenant {tenant:?} is not a valid tenant name: {why}");
    }
    for (flag, name) in args
        .user
        .iter()
        .map(|u| ("--user", u))
        .chain(args.groups.iter().map(|g| ("--group", g)))
    {
        if let Some(why) = tessera_apiserver::auth::reserved_name_problem(name) {
            anyhow::bail!("{flag} {name:?} cannot be used: it {why}");
        }
    }
    let ttl = args.ttl.as_secs() as i64;
    if !(60..=tessera_apiserver::auth::TENANT_TOKEN_MAX_SECONDS).contains(&ttl) {
        anyhow::bail!("--ttl must be between 1m and 366d");
    }
    let pki = args.data_dir.join("pki");
    let admin = std::fs::read_to_string(pki.join("admin.token")).map_err(|e| {
        anyhow::anyhow!(
            "reading {}: {e} (run `tessera up --data-dir {}` once first)",
            pki.join("admin.token").display(),
            args.data_dir.display()
        )
    })?;
    let root = tessera_apiserver::pki::token_root(&pki)?;
    let tokens = Tokens::with_root(admin.trim(), &root);
    let expires = tessera_apiserver::api::now_secs() + ttl;
    let Some(tenant_name) = &args.tenant else {
        let user = args.user.clone().unwrap_or_default();
        let claims = tessera_apiserver::auth::UserClaims {
            name: user,
            groups: args.groups.clone(),
            tenant: None,
            expires,
        };
        println!("{}", tokens.mint_user(&claims));
        return Ok(());
    };
    let kubeconfig = args.data_dir.join("kubeconfig");
    let client = tessera_apiserver::client::HttpClient::from_kubeconfig(&kubeconfig)
        .map_err(|e| anyhow::anyhow!("{} ({})", e.message, kubeconfig.display()))?;
    let tenants = tessera_apiserver::request::find_resource("tessera.io", "v1alpha1", "tenants")
        .map_err(|e| anyhow::anyhow!("{}", e.message))?;
    let tenant = tessera_apiserver::client::Client::get(&client, tenants, None, tenant_name)
        .await
        .map_err(|e| {
            anyhow::anyhow!(
                "reading Tenant {tenant_name:?} through the API (is `tessera up` running?): {}",
                e.message
            )
        })?;
    let claims = tessera_apiserver::auth::TenantClaims::of(&tenant, expires);
    match &args.user {
        None => println!("{}", tokens.mint(&claims)),
        Some(user) => {
            let claims = tessera_apiserver::auth::UserClaims {
                name: user.clone(),
                groups: args.groups.clone(),
                tenant: Some(tessera_apiserver::auth::UserTenant {
                    name: claims.name,
                    uid: claims.uid,
                    generation: claims.generation,
                }),
                expires,
            };
            println!("{}", tokens.mint_user(&claims));
        }
    }
    Ok(())
}
