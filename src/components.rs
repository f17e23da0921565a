//! The shard's workers as processes of their own — `tessera controller-manager`,
//! `tessera scheduler`, `tessera agent` — against a remote API server, and the same parts
//! started inside `tessera up`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use prometheus::Registry;
use tessera_agent::metrics::AgentMetrics;
use tessera_agent::process::{ProcessAgent, ProcessConfig};
use tessera_agent::sim::{SimAgent, SimConfig};
use tessera_apiserver::auth::Tokens;
use tessera_apiserver::client::{Client, HttpClient};
use tessera_controllers::Context;
use tessera_runtime::Informers;
use tessera_runtime::leader::{LeaderConfig, LeaderElector, default_identity};
use tessera_runtime::metrics::{QueueMetrics, RuntimeMetrics};
use tessera_scheduler::config::{self, SchedulerConfig};
use tessera_scheduler::metrics::SchedulerMetrics;
use tessera_scheduler::{Scheduler, SchedulerOptions};

/// How a component reaches the API and serves its metrics.
#[derive(Args, Debug)]
pub struct RemoteArgs {
    /// The kubeconfig of the API server (`tessera up` writes one in its data dir).
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: PathBuf,
    /// Address of this process's `/metrics` and health endpoints.
    #[arg(long, default_value = "127.0.0.1:0")]
    pub metrics_addr: SocketAddr,
    /// The token that reads every sample of `/metrics`, tenants' included (without it they
    /// are left out).
    #[arg(long)]
    pub metrics_token_file: Option<PathBuf>,
}

/// Leader election flags (active/standby through a Lease in kube-system).
#[derive(Args, Debug)]
pub struct ElectionArgs {
    /// Run only while holding the leader Lease (run several processes for standbys).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub leader_elect: bool,
    #[command(flatten)]
    pub timing: ElectionTiming,
}

/// The leader Lease's timings and this candidate's identity.
#[derive(Args, Debug)]
pub struct ElectionTiming {
    /// Seconds a Lease stays held without renewal.
    #[arg(long, default_value_t = 15.0)]
    pub lease_duration: f64,
    /// Seconds a leader keeps trying to renew before it stops.
    #[arg(long, default_value_t = 10.0)]
    pub renew_deadline: f64,
    /// Seconds between attempts.
    #[arg(long, default_value_t = 2.0)]
    pub retry_period: f64,
    /// This candidate's identity (default: host name and process id).
    #[arg(long)]
    pub identity: Option<String>,
}

impl ElectionTiming {
    /// The elector's configuration for the Lease `lease`.
    pub fn config(&self, lease: &str) -> anyhow::Result<LeaderConfig> {
        let d = |s: f64, what: &str| {
            if s.is_finite() && s > 0.0 {
                Ok(Duration::from_secs_f64(s))
            } else {
                Err(anyhow::anyhow!(
                    "--{what} must be a positive number of seconds"
                ))
            }
        };
        let c = LeaderConfig {
            lease_duration: d(self.lease_duration, "lease-duration")?,
            renew_deadline: d(self.renew_deadline, "renew-deadline")?,
            retry_period: d(self.retry_period, "retry-period")?,
            ..LeaderConfig::new(
                lease,
                self.identity.clone().unwrap_or_else(default_identity),
            )
        };
        if c.renew_deadline >= c.lease_duration {
            anyhow::bail!(
                "--renew-deadline ({:?}) must be shorter than --lease-duration ({:?}): a leader must stop before a standby may take over",
                c.renew_deadline,
                c.lease_duration
            );
        }
        if c.retry_period >= c.renew_deadline {
            anyhow::bail!("--retry-period must be shorter than --renew-deadline");
        }
        Ok(c)
    }
}

async fn connect(args: &RemoteArgs, registry: &Registry) -> anyhow::Result<Arc<dyn Client>> {
    let client = HttpClient::from_kubeconfig(&args.kubeconfig)
        .map_err(|e| anyhow::anyhow!("{}", e.message))?;
    let token = args
        .metrics_token_file
        .as_deref()
        .map(crate::metrics_server::read_token)
        .transpose()?;
    let addr = crate::metrics_server::serve(args.metrics_addr, registry.clone(), token).await?;
    tracing::info!(metrics = %addr, "serving metrics");
    Ok(tessera_runtime::client::Retrying::wrap(Arc::new(client)))
}

/// Runs `work` while holding `lease` (or right away without election); exits with an error
/// when the Lease is lost — the process stops writing at once, as Kubernetes' do.
async fn elected<F: std::future::Future<Output = ()>>(
    client: Arc<dyn Client>,
    election: &ElectionArgs,
    lease: &str,
    metrics: RuntimeMetrics,
    work: F,
) -> anyhow::Result<()> {
    if !election.leader_elect {
        work.await;
        return Ok(());
    }
    let config = election.timing.config(lease)?;
    tracing::info!(lease, identity = %config.identity, "waiting for the leader lease");
    let elector = LeaderElector::new(client, config, Some(metrics));
    crate::signals::lead_until_stopped(elector, async {
        work.await;
        Ok(())
    })
    .await
}

/// Flags of `tessera controller-manager`.
#[derive(Args, Debug)]
pub struct ControllerManagerArgs {
    #[command(flatten)]
    remote: RemoteArgs,
    #[command(flatten)]
    election: ElectionArgs,
    /// Workers per controller.
    #[arg(long, default_value_t = 4)]
    workers: usize,
    /// Seconds without a Lease renewal before a node is unreachable and its pods evicted.
    #[arg(long, default_value_t = 40.0)]
    node_monitor_grace_period: f64,
    /// Milliseconds a workload's status writes that only follow its pods are batched over
    /// (a workload at rest is written at once; 0 writes every change).
    #[arg(long, default_value_t = 100)]
    status_batch_period_ms: u64,
    /// Seconds between recounts of every ResourceQuota's usage.
    #[arg(long, default_value_t = 300.0)]
    resource_quota_sync_period: f64,
    #[command(flatten)]
    hpa: HpaArgs,
    /// The CA certificate (PEM) that signs approved `kubernetes.io/kube-apiserver-client`
    /// requests: the one the API server verifies client certificates with (its `ca.crt`).
    /// With `--cluster-signing-key-file`; without both, no such request is signed here.
    #[arg(long, requires = "cluster_signing_key_file")]
    cluster_signing_cert_file: Option<PathBuf>,
    /// Its private key (PEM; the data directory's `pki/ca.key`).
    #[arg(long, requires = "cluster_signing_cert_file")]
    cluster_signing_key_file: Option<PathBuf>,
    /// The longest a signed client certificate is valid (`8760h`, `30d`); a request's
    /// `expirationSeconds` may ask for less.
    #[arg(long, default_value = "8760h", value_parser = crate::store_config::parse_duration)]
    cluster_signing_duration: Duration,
}

/// The API server's CA as the signer of `kubernetes.io/kube-apiserver-client` requests.
pub struct ClientCertSigner(pub tessera_apiserver::client_certs::ClientSigner);

impl tessera_controllers::csrsigning::CertificateSigner for ClientCertSigner {
    fn signer_name(&self) -> &str {
        tessera_apiserver::client_certs::CLIENT_SIGNER
    }

    fn sign(
        &self,
        request_pem: &str,
        usages: &[String],
        expiration_seconds: Option<u64>,
    ) -> Result<String, String> {
        self.0.sign(request_pem, usages, expiration_seconds)
    }
}

/// The client certificate signer of a CA (certificate and key, PEM), issuing certificates
/// valid for at most `max`.
pub fn client_signer(
    ca_pem: &str,
    ca_key_pem: &str,
    max: Duration,
) -> anyhow::Result<Arc<dyn tessera_controllers::csrsigning::CertificateSigner>> {
    let signer = tessera_apiserver::client_certs::ClientSigner::new(ca_pem, ca_key_pem, max)
        .map_err(|e| anyhow::anyhow!("the client certificate signer: {e}"))?;
    Ok(Arc::new(ClientCertSigner(signer)))
}

/// The HorizontalPodAutoscaler controller's flags, named as kube-controller-manager's.
#[derive(Args, Debug, Clone)]
pub struct HpaArgs {
    /// How often each HorizontalPodAutoscaler is synced (`15s`, `1m`).
    #[arg(long = "horizontal-pod-autoscaler-sync-period", default_value = "15s",
        value_parser = crate::store_config::parse_duration)]
    pub hpa_sync_period: Duration,
    /// The ratio of usage to target within which an HPA changes nothing.
    #[arg(long = "horizontal-pod-autoscaler-tolerance", default_value_t = 0.1)]
    pub hpa_tolerance: f64,
    /// How far back a scale-down looks for higher recommendations, for HPAs whose behavior
    /// does not say.
    #[arg(long = "horizontal-pod-autoscaler-downscale-stabilization", default_value = "5m",
        value_parser = crate::store_config::parse_duration)]
    pub hpa_downscale_stabilization: Duration,
    /// How long after a pod starts its CPU samples may be skipped while it is not ready.
    #[arg(long = "horizontal-pod-autoscaler-cpu-initialization-period", default_value = "5m",
        value_parser = crate::store_config::parse_duration)]
    pub hpa_cpu_initialization_period: Duration,
    /// How long after a pod starts a not-ready pod that was never ready is left out.
    #[arg(long = "horizontal-pod-autoscaler-initial-readiness-delay", default_value = "30s",
        value_parser = crate::store_config::parse_duration)]
    pub hpa_initial_readiness_delay: Duration,
}

impl HpaArgs {
    /// The controller's configuration, or what is wrong with the flags.
    pub fn config(&self) -> anyhow::Result<tessera_controllers::hpa::HpaConfig> {
        if self.hpa_sync_period.is_zero() {
            anyhow::bail!("--horizontal-pod-autoscaler-sync-period must be more than zero");
        }
        if !(self.hpa_tolerance.is_finite() && (0.0..1.0).contains(&self.hpa_tolerance)) {
            anyhow::bail!(
                "--horizontal-pod-autoscaler-tolerance must be at least 0 and less than 1 (0.1: ±10%)"
            );
        }
        Ok(tessera_controllers::hpa::HpaConfig {
            sync_period: self.hpa_sync_period,
            tolerance: self.hpa_tolerance,
            downscale_stabilization: self.hpa_downscale_stabilization,
            cpu_initialization_period: self.hpa_cpu_initialization_period,
            initial_readiness_delay: self.hpa_initial_readiness_delay,
        })
    }
}

/// The controllers' timings from a node grace period and a quota recount period, in seconds,
/// and the HPA flags; the HPA metrics go to `registry`.
pub fn controller_settings(
    grace: f64,
    quota_sync: f64,
    hpa: &HpaArgs,
    registry: &Registry,
) -> anyhow::Result<tessera_controllers::Settings> {
    if !(grace.is_finite() && grace > 0.0) {
        anyhow::bail!("--node-monitor-grace-period must be a positive number of seconds");
    }
    if !(quota_sync.is_finite() && quota_sync > 0.0) {
        anyhow::bail!("--resource-quota-sync-period must be a positive number of seconds");
    }
    let grace = Duration::from_secs_f64(grace);
    Ok(tessera_controllers::Settings {
        nodes: tessera_controllers::nodelifecycle::NodeLifecycleConfig {
            grace,
            period: (grace / 8).clamp(Duration::from_millis(100), Duration::from_secs(5)),
        },
        quota_resync: Duration::from_secs_f64(quota_sync),
        root_ca: None,
        hpa: hpa.config()?,
        hpa_metrics: Some(tessera_controllers::hpa::HpaMetrics::register(registry)?),
        csr_signer: None,
    })
}

/// Metrics of the controllers.
pub fn controller_context(
    client: Arc<dyn Client>,
    registry: &Registry,
    workers: usize,
    status_batch: Duration,
) -> anyhow::Result<Context> {
    let runtime = RuntimeMetrics::register(registry)?;
    Ok(Context {
        informers: Informers::new(client.clone(), Some(runtime.clone())),
        client,
        queue_metrics: Some(QueueMetrics::register(registry)?),
        runtime_metrics: Some(runtime),
        workers: workers.max(1),
        clock: Arc::new(tessera_controllers::clock::SystemClock),
        status_batch,
    })
}

/// `tessera controller-manager`.
pub async fn controller_manager(args: ControllerManagerArgs) -> anyhow::Result<()> {
    let registry = Registry::new();
    let client = connect(&args.remote, &registry).await?;
    let ctx = controller_context(
        client.clone(),
        &registry,
        args.workers,
        Duration::from_millis(args.status_batch_period_ms),
    )?;
    let metrics = ctx.runtime_metrics.clone().expect("registered above");
    let mut settings = controller_settings(
        args.node_monitor_grace_period,
        args.resource_quota_sync_period,
        &args.hpa,
        &registry,
    )?;
    // The CA the kubeconfig trusts is the one every namespace's kube-root-ca.crt publishes.
    settings.root_ca = Some(
        HttpClient::from_kubeconfig(&args.remote.kubeconfig)
            .map_err(|e| anyhow::anyhow!("{}", e.message))?
            .ca_pem()
            .to_owned(),
    );
    if let (Some(cert), Some(key)) = (
        &args.cluster_signing_cert_file,
        &args.cluster_signing_key_file,
    ) {
        let read = |p: &PathBuf| {
            std::fs::read_to_string(p).map_err(|e| anyhow::anyhow!("reading {}: {e}", p.display()))
        };
        settings.csr_signer = Some(client_signer(
            &read(cert)?,
            &read(key)?,
            args.cluster_signing_duration,
        )?);
    }
    elected(
        client,
        &args.election,
        "tessera-controller-manager",
        metrics,
        tessera_controllers::run_all_with(ctx, settings),
    )
    .await
}

/// Flags of `tessera scheduler`.
#[derive(Args, Debug)]
pub struct SchedulerArgs {
    #[command(flatten)]
    remote: RemoteArgs,
    #[command(flatten)]
    election: ElectionArgs,
    /// A KubeSchedulerConfiguration-shaped file (YAML or JSON): profiles and plugins.
    #[arg(long)]
    config: Option<PathBuf>,
}

/// Reads the scheduler configuration file (or the defaults).
pub fn scheduler_config(path: Option<&PathBuf>) -> anyhow::Result<SchedulerConfig> {
    match path {
        None => Ok(SchedulerConfig::default()),
        Some(p) => {
            let text = std::fs::read_to_string(p)
                .map_err(|e| anyhow::anyhow!("reading {}: {e}", p.display()))?;
            config::parse(&text).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))
        }
    }
}

/// Builds the scheduler with its metrics.
pub fn build_scheduler(
    client: Arc<dyn Client>,
    config: SchedulerConfig,
    registry: &Registry,
    runtime: Option<RuntimeMetrics>,
    informers: Option<Arc<Informers>>,
) -> anyhow::Result<Scheduler> {
    Scheduler::new(
        client,
        SchedulerOptions {
            config,
            metrics: Some(SchedulerMetrics::register(registry)?),
            runtime_metrics: runtime,
            informers,
        },
    )
    .map_err(|e| anyhow::anyhow!("the scheduler configuration is not valid: {e}"))
}

/// `tessera scheduler`.
pub async fn scheduler(args: SchedulerArgs) -> anyhow::Result<()> {
    let config = scheduler_config(args.config.as_ref())?;
    let registry = Registry::new();
    let client = connect(&args.remote, &registry).await?;
    let runtime = RuntimeMetrics::register(&registry)?;
    let s = build_scheduler(
        client.clone(),
        config,
        &registry,
        Some(runtime.clone()),
        None,
    )?;
    elected(
        client,
        &args.election,
        "tessera-scheduler",
        runtime,
        s.run(),
    )
    .await
}

/// The shape of simulated nodes.
#[derive(Args, Debug, Clone)]
pub struct SimArgs {
    /// Each simulated node's cpu.
    #[arg(long, default_value = "8")]
    pub node_cpu: String,
    /// Each simulated node's memory.
    #[arg(long, default_value = "32Gi")]
    pub node_memory: String,
    /// Each simulated node's pod slots.
    #[arg(long, default_value_t = 110)]
    pub node_pods: u32,
    /// Milliseconds from binding to Running on a simulated node.
    #[arg(long, default_value_t = 500)]
    pub startup_delay_ms: u64,
    /// Seconds between renewals of the simulated nodes' Lease.
    #[arg(long, default_value_t = 10)]
    pub node_lease_renew_seconds: u64,
    /// Give each simulated node a Lease of its own, renewed on its own, as a kubelet keeps
    /// (kubemark's cost at rest: one write per node per renewal interval). By default the
    /// nodes of one agent share one Lease, since they live and die with one process.
    #[arg(long)]
    pub lease_per_node: bool,
    /// Zones the simulated nodes are spread over (`topology.kubernetes.io/zone=zone-K`,
    /// round robin); 0 for none.
    #[arg(long, default_value_t = 3)]
    pub node_zones: usize,
}

impl SimArgs {
    /// The agent configuration for `nodes` nodes named `{prefix}-{i}`.
    pub fn config(&self, prefix: &str, nodes: usize) -> SimConfig {
        SimConfig {
            prefix: prefix.into(),
            nodes,
            cpu: self.node_cpu.clone(),
            memory: self.node_memory.clone(),
            pods: self.node_pods,
            startup_delay: Duration::from_millis(self.startup_delay_ms),
            renew_interval: Duration::from_secs(self.node_lease_renew_seconds.max(1)),
            shared_lease: !self.lease_per_node,
            zones: self.node_zones,
            ..SimConfig::default()
        }
    }
}

/// Flags of `tessera agent`.
#[derive(Args, Debug)]
pub struct AgentArgs {
    #[command(flatten)]
    remote: RemoteArgs,
    /// Simulated (hollow) nodes to run.
    #[arg(long, default_value_t = 100)]
    sim_nodes: usize,
    /// Node names are `{prefix}-{i}`.
    #[arg(long, default_value = "sim-node")]
    prefix: String,
    /// Nodes whose containers run as real local processes (`{prefix}-proc-{i}`).
    #[arg(long, default_value_t = 0)]
    process_nodes: usize,
    /// The address process nodes serve their endpoint (logs, usage) on and publish as the
    /// Node's `InternalIP`: where the API server reaches them (a host's address when the
    /// agent runs in a pod with the host's network).
    #[arg(long, default_value = "127.0.0.1")]
    node_address: std::net::IpAddr,
    /// The port of the first process node's endpoint (the next node takes the next port);
    /// 0 for any free port.
    #[arg(long, default_value_t = 0)]
    node_port: u16,
    /// Where process nodes keep container logs.
    #[arg(long, default_value = "./logs")]
    log_dir: PathBuf,
    /// Where process nodes keep pods' sandboxes and volumes (kept 0700).
    #[arg(long, default_value = "./pods")]
    state_dir: PathBuf,
    /// How process nodes isolate containers (see `tessera up --help`).
    #[arg(long, value_enum, default_value_t = ProcessIsolation::Sandbox)]
    process_isolation: ProcessIsolation,
    #[command(flatten)]
    sim: SimArgs,
}

/// How process nodes isolate containers.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProcessIsolation {
    /// Namespaces, a per-pod id range, cgroup limits (needs root).
    Sandbox,
    /// None: containers run with the agent's rights.
    Off,
}

impl ProcessIsolation {
    /// The agent's setting: the sandbox helper is this very binary (`tessera sandbox …`).
    pub fn isolation(self) -> tessera_agent::isolation::Isolation {
        match self {
            ProcessIsolation::Sandbox => {
                tessera_agent::isolation::Isolation::Sandbox(tessera_agent::sandbox::Launcher {
                    exe: std::env::current_exe().unwrap_or_else(|_| "tessera".into()),
                    prefix: vec!["sandbox".into()],
                })
            }
            ProcessIsolation::Off => tessera_agent::isolation::Isolation::Off,
        }
    }
}

/// Registers a sim agent's nodes with a progress bar.
pub async fn register_sim(agent: &SimAgent) -> anyhow::Result<()> {
    let bar = ProgressBar::new(agent.node_names().len() as u64).with_style(
        ProgressStyle::with_template("registering nodes {bar:30} {pos}/{len}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    agent
        .register(|| bar.inc(1))
        .await
        .map_err(|e| anyhow::anyhow!("registering nodes: {}", e.message))?;
    bar.finish_and_clear();
    Ok(())
}

use tessera_agent::loans::{Lendable, Loans};
use tessera_runtime::informer::Tasks;

/// `tessera agent`.
pub async fn agent(args: AgentArgs) -> anyhow::Result<()> {
    let registry = Registry::new();
    let client = connect(&args.remote, &registry).await?;
    // Process nodes serve logs to the API server that holds the same admin token.
    let token = HttpClient::from_kubeconfig(&args.remote.kubeconfig)
        .map_err(|e| anyhow::anyhow!("{}", e.message))?
        .token()
        .to_owned();
    let mut tasks = Vec::new();
    // Every node this agent runs may be lent to another shard (elastic shards).
    let mut lendable = std::collections::HashMap::new();
    for i in 0..args.process_nodes {
        let name = format!("{}-proc-{i}", args.prefix);
        let config = ProcessConfig {
            tokens: Some(Tokens::new(&token)),
            isolation: args.process_isolation.isolation(),
            state_dir: args.state_dir.clone(),
            serve_addr: SocketAddr::new(
                args.node_address,
                match args.node_port {
                    0 => 0,
                    p => p.checked_add(i as u16).ok_or_else(|| {
                        anyhow::anyhow!("--node-port {p} + {i} process nodes passes 65535")
                    })?,
                },
            ),
            ..ProcessConfig::new(&name, args.log_dir.clone())
        };
        lendable.insert(name.clone(), Lendable::Process(Box::new(config.clone())));
        let node = ProcessAgent::new(client.clone(), config);
        node.register()
            .await
            .map_err(|e| anyhow::anyhow!("registering process node {name}: {}", e.message))?;
        node.register_metrics(&registry)?;
        tasks.push(tokio::spawn(node.run()));
    }
    if args.process_nodes > 0 {
        println!(
            "{} process nodes registered ({}-proc-0 ...), logs in {}",
            args.process_nodes,
            args.prefix,
            args.log_dir.display()
        );
    }
    let sim_config = args.sim.config(&args.prefix, args.sim_nodes);
    let agent = SimAgent::new(
        client.clone(),
        sim_config.clone(),
        Some(AgentMetrics::register(&registry)?),
        Some(RuntimeMetrics::register(&registry)?),
    );
    register_sim(&agent).await?;
    for name in agent.node_names() {
        lendable.insert(name.clone(), Lendable::Sim(Box::new(sim_config.clone())));
    }
    let loans = tokio::spawn(Loans::new(client.clone(), lendable).run());
    println!(
        "{} simulated nodes registered ({}-0 ...)",
        args.sim_nodes, args.prefix
    );
    let sim = async {
        if args.sim_nodes > 0 {
            agent.run().await;
        } else {
            std::future::pending::<()>().await;
        }
    };
    let _loans = Tasks(vec![loans]);
    tokio::select! {
        () = sim => Ok(()),
        _ = tokio::signal::ctrl_c() => Ok(()),
    }
}
