//! `tessera bench federation`: scale past one cluster, in one process.
//!
//! 1. Routing alone: the federation's placement over S shards' summaries (`placements_per_sec`).
//! 2. Utilization against one ideal global pool (see [`super::fill`]).
//! 3. The same work on one shard of all S × N nodes: T tenants (namespaces), one Deployment
//!    each, P pods in all, created in the shard's API; pods/s from the first create to the
//!    last pod Running (`single_shard_pods_per_sec`).
//! 4. The federation and S full shards (each its own embedded store, API, controllers,
//!    scheduler and N simulated nodes — what `tessera up --shards S` runs): the same
//!    namespaces and Deployments created at the federation, placed, propagated over the
//!    gRPC streams and run in the shards (`pods_per_sec`); `per_pod_cost_ratio` = single ÷
//!    sharded. Then, idle: the propagation latency of one Deployment at a time (federation
//!    write → object in its shard, p50/p99), and the process's idle cpu — measured once
//!    two seconds pass with no write but node Lease renewals and shard summaries.
//!
//! The single-shard run (3) is a child process of this one (`--single-only`): once it
//! exits, nothing of its 100,000-node shard — store, API, informers, memory — is left to
//! weigh on the federated run (4), which has the machine to itself.
//!
//! Everything shares the machine's cores: the numbers are for the whole fleet.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use clap::{Args, Parser};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use parking_lot::Mutex;
use serde::Serialize;
use serde_json::json;
use tessera_apiserver::client::Client;
use tessera_apiserver::request::find_resource;
use tessera_runtime::informer::{Change, Informer, Scope};

use super::fill;
use super::latency::Latencies;
use crate::up::{Shard, UpAllArgs};

/// Flags of `bench federation`.
#[derive(Args, Debug)]
pub struct FederationBenchArgs {
    /// Shards under the federation.
    #[arg(long, default_value_t = 3)]
    pub shards: usize,
    /// Simulated nodes per shard.
    #[arg(long, default_value_t = 300)]
    pub nodes_per_shard: usize,
    /// Pods in all (one Deployment per tenant).
    #[arg(long, default_value_t = 3_000)]
    pub pods: usize,
    /// Tenants (a namespace and a Deployment each).
    #[arg(long, default_value_t = 1_000)]
    pub tenants: usize,
    /// Placement decisions for the routing measurement.
    #[arg(long, default_value_t = 200_000)]
    pub decisions: usize,
    /// Deployments created one at a time, idle, for the propagation latency.
    #[arg(long, default_value_t = 50)]
    pub propagation_samples: usize,
    /// Leave out the single-shard run (and the ratio).
    #[arg(long)]
    pub skip_single: bool,
    /// Leave out the runs with shards (routing and utilization only).
    #[arg(long)]
    pub model_only: bool,
    /// Leave out the utilization measurement.
    #[arg(long)]
    pub skip_utilization: bool,
    /// The controllers' and the federation's status batch period, in milliseconds (what
    /// `tessera up --status-batch-period-ms` and `--federation-status-batch-period-ms` set).
    #[arg(long, default_value_t = 100)]
    pub status_batch_period_ms: u64,
    /// Give every simulated node a Lease of its own, renewed on its own (kubemark's cost at
    /// rest), instead of one Lease per agent.
    #[arg(long)]
    pub lease_per_node: bool,
    /// Give up on a run after this many seconds.
    #[arg(long, default_value_t = 900)]
    pub timeout: u64,
    /// Instead of the runs above: kill the shard running the most pods once half the pods
    /// run, and report how long until every Deployment runs whole on the other shards, and
    /// how many pods were lost or doubled there (both must be 0).
    #[arg(long)]
    pub fail_shard: bool,
    /// Instead of the runs above: a skewed workload — `--tenants` hot tenants (at most 20)
    /// whose Deployments are pinned to shard-0 and ask for twice its cpu, every other shard
    /// idle — run twice on a fresh fleet, without lending and with every shard lending and
    /// borrowing; reports the fleet's cpu utilization once each run settles.
    #[arg(long)]
    pub skew: bool,
    /// Instead of the runs above: create this many federation-scope gangs at once (each a
    /// PodGroup and a Job of `--gang-size` one-cpu pods, in a namespace of its own), and
    /// report how long until each is bound whole, how many were divided over shards, and
    /// attempts aborted. A gang that did not end bound with exactly its members fails it.
    #[arg(long, default_value_t = 0)]
    pub gangs: usize,
    /// Members of each gang (at most 128: a part is bound in one store transaction).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=128))]
    pub gang_size: u64,
    /// The shards' lease (what `tessera up --shard-lease-seconds` sets): a killed shard's
    /// work moves once it ends.
    #[arg(long, default_value_t = 15)]
    pub shard_lease_seconds: u64,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    /// Run only the single-shard measurement and print it as JSON (what the benchmark runs
    /// in a child process).
    #[arg(long, hide = true)]
    pub single_only: bool,
}

/// The single-shard run's figures, as its child process prints them.
#[derive(Serialize, serde::Deserialize)]
struct Single {
    pods_per_sec: f64,
    cpu_us_per_pod: f64,
    api_writes_per_pod: f64,
    api_writes_by_kind: BTreeMap<String, f64>,
    peak_rss_bytes: u64,
}

#[derive(Serialize, Default)]
struct Report {
    shards: usize,
    nodes: usize,
    pods: usize,
    tenants: usize,
    pods_per_sec: Option<f64>,
    single_shard_pods_per_sec: Option<f64>,
    per_pod_cost_ratio: Option<f64>,
    /// The process's CPU (user + system) from the first create to the last pod Running,
    /// per pod: through the federation, and on one shard.
    cpu_us_per_pod: Option<f64>,
    single_shard_cpu_us_per_pod: Option<f64>,
    /// API writes (create, update, patch, delete) per pod over every API server in the run
    /// (the federation's and its shards'), and on one shard; then each run's writes by
    /// `verb resource[/subresource]`, per pod.
    api_writes_per_pod: Option<f64>,
    single_shard_api_writes_per_pod: Option<f64>,
    api_writes_by_kind: BTreeMap<String, f64>,
    single_shard_api_writes_by_kind: BTreeMap<String, f64>,
    placements_per_sec: f64,
    utilization_vs_global: f64,
    utilization_memory_vs_global: f64,
    global_cpu_utilization: f64,
    propagation_p50_ms: Option<f64>,
    propagation_p99_ms: Option<f64>,
    idle_cpu_cores: Option<f64>,
    /// Seconds waited after the run for the fleet to be idle (only heartbeats written).
    idle_settle_secs: Option<f64>,
    /// Writes per second by `verb resource[/subresource]` while idle cpu was measured: what
    /// the fleet goes on doing at rest.
    idle_writes_per_sec: BTreeMap<String, f64>,
    /// This process's (the federated run's) peak resident set, and the single-shard
    /// child's.
    peak_rss_bytes: u64,
    single_shard_peak_rss_bytes: Option<u64>,
}

/// `clap` parses the same flags `tessera up` takes, so the shards here are what it runs.
#[derive(Parser)]
struct Up {
    #[command(flatten)]
    all: UpAllArgs,
}

fn up_args(
    dir: &std::path::Path,
    shards: usize,
    nodes: usize,
    status_batch_ms: u64,
    lease_per_node: bool,
    shard_lease_seconds: u64,
) -> anyhow::Result<UpAllArgs> {
    let mut args = vec![
        "up".to_owned(),
        format!("--shard-lease-seconds={shard_lease_seconds}"),
        format!("--data-dir={}", dir.display()),
        "--api-addr=127.0.0.1:0".into(),
        "--metrics-addr=127.0.0.1:0".into(),
        "--grpc-addr=127.0.0.1:0".into(),
        format!("--shards={shards}"),
        format!("--nodes-per-shard={nodes}"),
        "--startup-delay-ms=0".into(),
        format!("--status-batch-period-ms={status_batch_ms}"),
        format!("--federation-status-batch-period-ms={status_batch_ms}"),
    ];
    if lease_per_node {
        args.push("--lease-per-node".into());
    }
    Ok(Up::try_parse_from(args)?.all)
}

/// The peak resident memory of this process (VmHWM).
fn peak_rss() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

/// cpu seconds this process has used (user + system).
fn cpu_seconds() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    // Fields after the command (which may hold spaces) start after the last ')'.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // utime and stime are fields 14 and 15 of stat; here 11 and 12 (0-based after state).
    (ticks(11) + ticks(12)) / 100.0
}

/// API requests that write, by `[prefix]verb resource[/subresource]`, summed over
/// `registries` (each an API server's metrics, with the prefix its writes are listed under).
fn api_writes(registries: &[(&str, &prometheus::Registry)]) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for (prefix, r) in registries {
        for family in r.gather() {
            if family.name() != "tessera_apiserver_requests_total" {
                continue;
            }
            for m in family.get_metric() {
                let label = |n: &str| {
                    m.get_label()
                        .iter()
                        .find(|l| l.name() == n)
                        .map_or("", |l| l.value())
                };
                let verb = label("verb");
                // Writes that took effect (not those refused for fairness and retried).
                if !matches!(verb, "create" | "update" | "patch" | "delete")
                    || !label("code").starts_with('2')
                {
                    continue;
                }
                let sub = label("subresource");
                let key = if sub.is_empty() {
                    format!("{prefix}{verb} {}", label("resource"))
                } else {
                    format!("{prefix}{verb} {}/{sub}", label("resource"))
                };
                *out.entry(key).or_default() += m.get_counter().get_value() as u64;
            }
        }
    }
    out
}

/// What was written between two [`api_writes`] readings, per pod.
fn writes_since(
    before: &BTreeMap<String, u64>,
    after: &BTreeMap<String, u64>,
    pods: usize,
) -> (f64, BTreeMap<String, f64>) {
    let per_pod = |n: u64| n as f64 / pods.max(1) as f64;
    let by: BTreeMap<String, f64> = after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0)))
        .filter(|(_, n)| *n > 0)
        .map(|(k, n)| (k, per_pod(n)))
        .collect();
    (by.values().sum(), by)
}

/// Writes an idle fleet goes on making: node heartbeats and the shards' summaries.
fn heartbeat(kind: &str) -> bool {
    kind.ends_with(" leases") || kind.ends_with(" shards/status")
}

/// Waits (at most a minute) until two seconds pass with no write but heartbeats; the seconds
/// it waited.
async fn settle(registries: &[(&str, &prometheus::Registry)]) -> f64 {
    let started = Instant::now();
    let mut last = api_writes(registries);
    while started.elapsed() < Duration::from_secs(60) {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let now = api_writes(registries);
        let busy = now
            .iter()
            .any(|(k, v)| !heartbeat(k) && last.get(k) != Some(v));
        last = now;
        if !busy {
            break;
        }
    }
    started.elapsed().as_secs_f64()
}

/// Counts pods Running in a shard (each pod once) and when the last one started.
struct Running {
    seen: Mutex<HashSet<String>>,
    count: AtomicUsize,
    last: Mutex<Option<Instant>>,
}

impl Running {
    fn new() -> Arc<Running> {
        Arc::new(Running {
            seen: Mutex::default(),
            count: AtomicUsize::new(0),
            last: Mutex::new(None),
        })
    }
}

/// Counts the pods of `shard` seen Running, off the shard's own shared pod informer (the
/// cache its scheduler, controllers and agents read), so the bench decodes no change twice.
fn watch_running(shard: &Shard, running: Arc<Running>) -> anyhow::Result<Arc<Informer<Pod>>> {
    let pods = find_resource("", "v1", "pods").map_err(|e| anyhow::anyhow!("{}", e.message))?;
    let informer = shard.informers.get::<Pod>(pods);
    informer
        .on_change(move |c| {
            let p = match c {
                Change::Added(p) | Change::Updated { new: p, .. } => p,
                Change::Deleted(_) => return,
            };
            if p.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Running") {
                return;
            }
            let uid = p.metadata.uid.clone().unwrap_or_default();
            if running.seen.lock().insert(uid) {
                running.count.fetch_add(1, Ordering::Relaxed);
                *running.last.lock() = Some(Instant::now());
            }
        })
        .detach();
    Ok(informer)
}

/// Creates T namespaces and one Deployment each (P pods in all) through `client`; returns
/// when the creates were sent.
async fn create_work(client: &Arc<dyn Client>, tenants: usize, pods: usize) -> anyhow::Result<()> {
    let res =
        |g: &str, p: &str| find_resource(g, "v1", p).map_err(|e| anyhow::anyhow!("{}", e.message));
    let (ns_res, deploy_res) = (res("", "namespaces")?, res("apps", "deployments")?);
    let bar = super::progress_bar(tenants as u64 * 2, "namespaces, deployments".into());
    let creates = (0..tenants).map(|i| {
        let client = client.clone();
        let bar = bar.clone();
        async move {
            client
                .create(
                    ns_res,
                    None,
                    &json!({"metadata": {"name": format!("t-{i}")}}),
                )
                .await?;
            bar.inc(1);
            Ok::<_, tessera_apiserver::status::ApiError>(())
        }
    });
    for r in futures::future::join_all(creates).await {
        r.map_err(|e| anyhow::anyhow!("creating a namespace: {}", e.message))?;
    }
    let creates = (0..tenants).map(|i| {
        // P pods over T Deployments: the first P mod T get one more.
        let replicas = pods / tenants + usize::from(i < pods % tenants);
        let d = json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "app", "namespace": format!("t-{i}")},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "app"}},
                "template": {"metadata": {"labels": {"app": "app"}},
                    "spec": {"containers": [{"name": "c", "image": "pause",
                        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}}}]}}}});
        let client = client.clone();
        let bar = bar.clone();
        async move {
            let ns = format!("t-{i}");
            client.create(deploy_res, Some(&ns), &d).await?;
            bar.inc(1);
            Ok::<_, tessera_apiserver::status::ApiError>(())
        }
    });
    for r in futures::future::join_all(creates).await {
        r.map_err(|e| anyhow::anyhow!("creating a Deployment: {}", e.message))?;
    }
    bar.finish_and_clear();
    Ok(())
}

/// Waits for `pods` Running over `counters`; seconds from `started` to the last one.
async fn wait_running(
    counters: &[Arc<Running>],
    pods: usize,
    started: Instant,
    timeout: u64,
) -> anyhow::Result<f64> {
    let bar = super::progress_bar(pods as u64, "pods running".into());
    let deadline = started + Duration::from_secs(timeout);
    loop {
        let n: usize = counters
            .iter()
            .map(|c| c.count.load(Ordering::Relaxed))
            .sum();
        bar.set_position(n as u64);
        if n >= pods {
            break;
        }
        if Instant::now() > deadline {
            anyhow::bail!("only {n} of {pods} pods Running after {timeout} s");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    bar.finish_and_clear();
    let last = counters
        .iter()
        .filter_map(|c| *c.last.lock())
        .max()
        .unwrap_or(started);
    Ok((last - started).as_secs_f64())
}

fn admin(shard: &Shard) -> Arc<dyn Client> {
    shard.component_client("bench")
}

/// The same work on one shard of every node.
async fn single(args: &FederationBenchArgs) -> anyhow::Result<Single> {
    let dir = tempfile::tempdir()?;
    let all = up_args(
        dir.path(),
        0,
        args.shards * args.nodes_per_shard,
        args.status_batch_period_ms,
        args.lease_per_node,
        args.shard_lease_seconds,
    )?;
    let shard = crate::up::start(&all.base).await?;
    let tasks = crate::up::start_workers(&shard, &all.workers, dir.path(), "node", "").await?;
    let running = Running::new();
    let informer = watch_running(&shard, running.clone())?;
    informer.synced().await;
    let started = Instant::now();
    let cpu = cpu_seconds();
    let writes = api_writes(&[("", &shard.registry)]);
    create_work(&admin(&shard), args.tenants, args.pods).await?;
    let secs = wait_running(&[running], args.pods, started, args.timeout).await?;
    let cpu_us_per_pod = (cpu_seconds() - cpu) * 1e6 / args.pods.max(1) as f64;
    let (api_writes_per_pod, api_writes_by_kind) =
        writes_since(&writes, &api_writes(&[("", &shard.registry)]), args.pods);
    for t in tasks {
        t.abort();
    }
    Ok(Single {
        pods_per_sec: args.pods as f64 / secs.max(1e-9),
        cpu_us_per_pod,
        api_writes_per_pod,
        api_writes_by_kind,
        peak_rss_bytes: peak_rss(),
    })
}

/// [`single`] in a child process of this binary, which takes its shard with it when it
/// exits.
async fn single_in_child(args: &FederationBenchArgs) -> anyhow::Result<Single> {
    let exe = std::env::current_exe()?;
    let out = tokio::process::Command::new(exe)
        .args(["bench", "federation", "--single-only"])
        .arg(format!("--shards={}", args.shards))
        .arg(format!("--nodes-per-shard={}", args.nodes_per_shard))
        .arg(format!("--pods={}", args.pods))
        .arg(format!("--tenants={}", args.tenants))
        .arg(format!(
            "--status-batch-period-ms={}",
            args.status_batch_period_ms
        ))
        .arg(format!("--timeout={}", args.timeout))
        .args(args.lease_per_node.then_some("--lease-per-node"))
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::inherit())
        .kill_on_drop(true)
        .output()
        .await?;
    anyhow::ensure!(
        out.status.success(),
        "the single-shard run failed ({})",
        out.status
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().last().unwrap_or_default();
    serde_json::from_str(line)
        .map_err(|e| anyhow::anyhow!("the single-shard run printed {line:?}: {e}"))
}

/// Propagation latency, idle: Deployments created at the federation one at a time, each
/// timed until it is in a shard.
async fn propagation(
    fed: &Arc<dyn Client>,
    shards: &[Arc<dyn Client>],
    samples: usize,
    tasks: &mut Vec<tokio::task::JoinHandle<()>>,
) -> anyhow::Result<Latencies> {
    let res =
        |g: &str, p: &str| find_resource(g, "v1", p).map_err(|e| anyhow::anyhow!("{}", e.message));
    let deploys = res("apps", "deployments")?;
    let arrived: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    for c in shards {
        let informer = Informer::<Deployment>::new(c.clone(), deploys, Scope::default(), None);
        let arrived = arrived.clone();
        informer
            .on_change(move |ch| {
                if let Change::Added(d) = ch {
                    let name = d.metadata.name.clone().unwrap_or_default();
                    arrived.lock().entry(name).or_insert_with(Instant::now);
                }
            })
            .detach();
        tasks.push(tokio::spawn(informer.clone().run()));
        informer.synced().await;
    }
    fed.create(
        res("", "namespaces")?,
        None,
        &json!({"metadata": {"name": "propagation"}}),
    )
    .await
    .map_err(|e| anyhow::anyhow!("{}", e.message))?;
    let mut lat = Latencies::with_capacity(samples);
    let bar = super::progress_bar(samples as u64, "propagation samples".into());
    for i in 0..samples {
        let name = format!("p-{i}");
        let d = json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": "propagation"},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"p": name}},
                "template": {"metadata": {"labels": {"p": name}},
                    "spec": {"containers": [{"name": "c", "image": "pause"}]}}}});
        let sent = Instant::now();
        fed.create(deploys, Some("propagation"), &d)
            .await
            .map_err(|e| anyhow::anyhow!("{}", e.message))?;
        let deadline = sent + Duration::from_secs(30);
        loop {
            if let Some(at) = arrived.lock().get(&name) {
                lat.record(at.saturating_duration_since(sent));
                break;
            }
            if Instant::now() > deadline {
                anyhow::bail!("Deployment {name} reached no shard in 30 s");
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        bar.inc(1);
        // Idle between samples: the next one does not queue behind this one's work.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bar.finish_and_clear();
    Ok(lat)
}

/// Waits until every shard is connected, Ready and summarized with all its nodes.
async fn wait_ready(fed: &Arc<dyn Client>, args: &FederationBenchArgs) -> anyhow::Result<()> {
    // Every shard connected and summarized before work arrives.
    let shards_res = find_resource("tessera.io", "v1alpha1", "shards")
        .map_err(|e| anyhow::anyhow!("{}", e.message))?;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let list = fed
            .list(tessera_apiserver::request::ApiRequest::new(
                tessera_apiserver::request::Verb::List,
                shards_res,
            ))
            .await
            .map_err(|e| anyhow::anyhow!("{}", e.message))?;
        let ready = list["items"].as_array().map_or(0, |items| {
            items
                .iter()
                .filter(|s| {
                    s["status"]["nodes"].as_u64() == Some(args.nodes_per_shard as u64)
                        && s["status"]["conditions"].as_array().is_some_and(|c| {
                            c.iter()
                                .any(|c| c["type"] == "Ready" && c["status"] == "True")
                        })
                })
                .count()
        });
        if ready == args.shards {
            break;
        }
        if Instant::now() > deadline {
            anyhow::bail!(
                "only {ready} of {} shards Ready with their nodes after 120 s",
                args.shards
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// The federation and `args.shards` shards in this process, every shard Ready with its
/// nodes; the fleet's directory (to outlive its servers' use of it) and a client of the
/// federation.
async fn start_fleet(
    args: &FederationBenchArgs,
) -> anyhow::Result<(tempfile::TempDir, crate::up::Fleet, Arc<dyn Client>)> {
    let dir = tempfile::tempdir()?;
    let all = up_args(
        dir.path(),
        args.shards,
        args.nodes_per_shard,
        args.status_batch_period_ms,
        args.lease_per_node,
        args.shard_lease_seconds,
    )?;
    let fleet = crate::up::start_federated(&all).await?;
    let fed = fleet.federation.api.component_client("bench");
    wait_ready(&fed, args).await?;
    Ok((dir, fleet, fed))
}

/// The federation and its shards.
/// Returns the fleet's directory, to outlive its servers' use of it.
async fn sharded(args: &FederationBenchArgs, r: &mut Report) -> anyhow::Result<tempfile::TempDir> {
    let (dir, fleet, fed) = start_fleet(args).await?;
    let mut counters = Vec::new();
    let mut tasks = Vec::new();
    let shard_clients: Vec<Arc<dyn Client>> = fleet.shards.iter().map(|(_, s)| admin(s)).collect();
    for (_, shard) in &fleet.shards {
        let running = Running::new();
        let informer = watch_running(shard, running.clone())?;
        informer.synced().await;
        counters.push(running);
    }
    // The federation's own writes are listed apart; the shards' are summed.
    let registries: Vec<(&str, &prometheus::Registry)> =
        std::iter::once(("federation: ", &fleet.federation.api.registry))
            .chain(fleet.shards.iter().map(|(_, s)| ("", &s.registry)))
            .collect();
    let started = Instant::now();
    let cpu = cpu_seconds();
    let writes = api_writes(&registries);
    create_work(&fed, args.tenants, args.pods).await?;
    let secs = wait_running(&counters, args.pods, started, args.timeout).await?;
    r.cpu_us_per_pod = Some((cpu_seconds() - cpu) * 1e6 / args.pods.max(1) as f64);
    let (total, by) = writes_since(&writes, &api_writes(&registries), args.pods);
    r.api_writes_per_pod = Some(total);
    r.api_writes_by_kind = by;
    r.pods_per_sec = Some(args.pods as f64 / secs.max(1e-9));
    // Idle once the work is in — the last statuses and Events of the run written, only the
    // nodes' heartbeats and the shards' summaries going on: what the fleet costs doing
    // nothing, then propagation.
    r.idle_settle_secs = Some(settle(&registries).await);
    let before = cpu_seconds();
    let idle_writes = api_writes(&registries);
    tokio::time::sleep(Duration::from_secs(10)).await;
    r.idle_cpu_cores = Some((cpu_seconds() - before) / 10.0);
    // Per second: `writes_since` divides by its third argument.
    r.idle_writes_per_sec = writes_since(&idle_writes, &api_writes(&registries), 10).1;
    let mut lat = propagation(&fed, &shard_clients, args.propagation_samples, &mut tasks).await?;
    r.propagation_p50_ms = Some(lat.percentile_ms(50.0));
    r.propagation_p99_ms = Some(lat.percentile_ms(99.0));
    for t in tasks {
        t.abort();
    }
    // The fleet's controllers, schedulers and nodes stop as it drops.
    drop(fleet);
    Ok(dir)
}

/// One `--skew` run, once settled.
#[derive(Serialize, Default)]
struct SkewRun {
    /// Cpu requested by Running pods ÷ the fleet's cpu.
    cpu_utilization: f64,
    /// Hot pods Running, of those wanted.
    hot_pods_running: usize,
    /// Nodes borrowed by shard-0 at the end.
    nodes_borrowed: u64,
    /// From the creates to the last change in Running pods.
    settled_secs: f64,
}

/// What `--skew` reports.
#[derive(Serialize, Default)]
struct Skew {
    shards: usize,
    nodes_per_shard: usize,
    node_cpu: u64,
    hot_tenants: usize,
    hot_pods: usize,
    without_lending: SkewRun,
    with_lending: SkewRun,
}

/// Cpu of each simulated node in the bench's fleet (`tessera up`'s default).
const SKEW_NODE_CPU: u64 = 8;

/// One `--skew` run on a fresh fleet: the hot tenants' one-cpu pods pinned to shard-0,
/// `lend` deciding whether the shards lend and borrow.
async fn skew_run(
    args: &FederationBenchArgs,
    lend: bool,
    hot: usize,
    pods: usize,
) -> anyhow::Result<SkewRun> {
    let (_dir, fleet, fed) = start_fleet(args).await?;
    let res = |g: &str, v: &str, p: &str| {
        find_resource(g, v, p).map_err(|e| anyhow::anyhow!("{}", e.message))
    };
    if lend {
        let shards = res("tessera.io", "v1alpha1", "shards")?;
        let all = (args.shards * args.nodes_per_shard) as u64;
        for (name, _) in &fleet.shards {
            let patch = json!({"spec": {"lending": {"minNodes": 0,
                "maxLend": args.nodes_per_shard, "maxBorrow": all}}});
            fed.patch(
                shards,
                None,
                name,
                None,
                tessera_apiserver::request::PatchType::Merge,
                &patch,
            )
            .await
            .map_err(|e| anyhow::anyhow!("setting {name}'s lending: {}", e.message))?;
        }
    }
    let (ns_res, pl_res, deploy_res) = (
        res("", "v1", "namespaces")?,
        res("tessera.io", "v1alpha1", "placements")?,
        res("apps", "v1", "deployments")?,
    );
    let started = Instant::now();
    for i in 0..hot {
        let ns = format!("hot-{i}");
        let replicas = pods / hot + usize::from(i < pods % hot);
        fed.create(ns_res, None, &json!({"metadata": {"name": ns}}))
            .await
            .map_err(|e| anyhow::anyhow!("creating {ns}: {}", e.message))?;
        let pl = json!({"apiVersion": "tessera.io/v1alpha1", "kind": "Placement",
            "metadata": {"name": "pin", "namespace": ns},
            "spec": {"resourceSelectors": [{"kind": "Deployment"}],
                "shardAffinity": {"shardNames": ["shard-0"]}}});
        fed.create(pl_res, Some(&ns), &pl)
            .await
            .map_err(|e| anyhow::anyhow!("creating {ns}'s Placement: {}", e.message))?;
        let d = json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "app", "namespace": ns},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "app"}},
                "template": {"metadata": {"labels": {"app": "app"}},
                    "spec": {"containers": [{"name": "c", "image": "pause",
                        "resources": {"requests": {"cpu": "1"}}}]}}}});
        fed.create(deploy_res, Some(&ns), &d)
            .await
            .map_err(|e| anyhow::anyhow!("creating {ns}'s Deployment: {}", e.message))?;
    }
    // Settled: every hot pod Running, or no change for 20 s (long enough for a lending
    // round: demand lasting --borrow-after-seconds, nodes handed over and joined).
    let bar = super::progress_bar(
        pods as u64,
        format!(
            "hot pods running ({})",
            if lend { "lending" } else { "no lending" }
        ),
    );
    let deadline = started + Duration::from_secs(args.timeout);
    let mut last = (0usize, Instant::now());
    loop {
        let running: usize = fleet
            .shards
            .iter()
            .map(|(_, s)| running_by_namespace(s))
            .collect::<anyhow::Result<Vec<_>>>()?
            .iter()
            .flat_map(|m| m.iter())
            .filter(|(ns, _)| ns.starts_with("hot-"))
            .map(|(_, n)| *n)
            .sum();
        bar.set_position(running as u64);
        if running != last.0 {
            last = (running, Instant::now());
        }
        if running >= pods
            || last.1.elapsed() >= Duration::from_secs(20)
            || Instant::now() > deadline
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    bar.finish_and_clear();
    // Nodes of other shards registered with shard-0 now.
    let nodes = res("", "v1", "nodes")?;
    let borrowed = fleet.shards[0]
        .1
        .informers
        .get::<k8s_openapi::api::core::v1::Node>(nodes)
        .cache()
        .list()
        .iter()
        .filter(|n| {
            n.metadata
                .labels
                .as_ref()
                .is_some_and(|l| l.contains_key(tessera_apiserver::types::LENT_FROM_LABEL))
        })
        .count() as u64;
    let fleet_cpu = (args.shards * args.nodes_per_shard) as u64 * SKEW_NODE_CPU;
    Ok(SkewRun {
        cpu_utilization: last.0 as f64 / fleet_cpu as f64,
        hot_pods_running: last.0,
        nodes_borrowed: borrowed,
        settled_secs: (last.1 - started).as_secs_f64(),
    })
}

/// `--skew`: the skewed workload without lending, then with.
async fn skew(args: &FederationBenchArgs) -> anyhow::Result<Skew> {
    let hot = args.tenants.clamp(1, 20);
    let pods = 2 * args.nodes_per_shard * SKEW_NODE_CPU as usize;
    let without_lending = skew_run(args, false, hot, pods).await?;
    let with_lending = skew_run(args, true, hot, pods).await?;
    Ok(Skew {
        shards: args.shards,
        nodes_per_shard: args.nodes_per_shard,
        node_cpu: SKEW_NODE_CPU,
        hot_tenants: hot,
        hot_pods: pods,
        without_lending,
        with_lending,
    })
}

/// What `--fail-shard` reports.
#[derive(Serialize, Default)]
struct Failure {
    shards: usize,
    nodes: usize,
    pods: usize,
    tenants: usize,
    shard_lease_seconds: u64,
    /// The shard killed, and the pods it ran then.
    killed: String,
    pods_on_killed_shard: usize,
    /// Pods Running in all when it was killed.
    pods_running_at_kill: usize,
    /// From the kill to every Deployment running whole on the other shards.
    replaced_secs: Option<f64>,
    /// Pods missing, and pods beyond a Deployment's replicas, on the other shards at the end.
    pods_lost: usize,
    pods_duplicated: usize,
}

/// Pods Running (not being deleted) per namespace in `shard`, off its shared informer.
fn running_by_namespace(shard: &Shard) -> anyhow::Result<HashMap<String, usize>> {
    let pods = find_resource("", "v1", "pods").map_err(|e| anyhow::anyhow!("{}", e.message))?;
    let mut out: HashMap<String, usize> = HashMap::new();
    for p in shard.informers.get::<Pod>(pods).cache().list() {
        if p.metadata.deletion_timestamp.is_none()
            && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
        {
            *out.entry(p.metadata.namespace.clone().unwrap_or_default())
                .or_default() += 1;
        }
    }
    Ok(out)
}

/// `--fail-shard`: the federated run, with the shard running the most pods killed once
/// half the pods run.
async fn fail_shard(args: &FederationBenchArgs) -> anyhow::Result<Failure> {
    anyhow::ensure!(args.shards >= 2, "--fail-shard needs at least 2 shards");
    let (dir, fleet, fed) = start_fleet(args).await?;
    let mut f = Failure {
        shards: args.shards,
        nodes: args.shards * args.nodes_per_shard,
        pods: args.pods,
        tenants: args.tenants,
        shard_lease_seconds: args.shard_lease_seconds,
        ..Failure::default()
    };
    create_work(&fed, args.tenants, args.pods).await?;
    let want = |ns: &str| -> usize {
        let i: usize = ns
            .strip_prefix("t-")
            .and_then(|i| i.parse().ok())
            .unwrap_or(0);
        args.pods / args.tenants + usize::from(i < args.pods % args.tenants)
    };
    let deadline = Instant::now() + Duration::from_secs(args.timeout);
    let bar = super::progress_bar(
        args.pods as u64,
        "pods running (half, then the kill)".into(),
    );
    let (victim, at_kill) = loop {
        let counts: Vec<usize> = fleet
            .shards
            .iter()
            .map(|(_, s)| running_by_namespace(s).map(|m| m.values().sum()))
            .collect::<anyhow::Result<_>>()?;
        let total: usize = counts.iter().sum();
        bar.set_position(total as u64);
        if total * 2 >= args.pods {
            let victim = (0..counts.len()).max_by_key(|i| counts[*i]).unwrap_or(0);
            break (victim, (counts[victim], total));
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "only {total} pods Running before the kill"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    fleet.kill_shard(victim);
    let killed_at = Instant::now();
    f.killed = fleet.shards[victim].0.clone();
    (f.pods_on_killed_shard, f.pods_running_at_kill) = at_kill;
    bar.set_message(format!("pods running without {}", f.killed));
    let tenants: Vec<String> = (0..args.tenants).map(|i| format!("t-{i}")).collect();
    loop {
        let mut by_ns: HashMap<String, usize> = HashMap::new();
        for (i, (_, s)) in fleet.shards.iter().enumerate() {
            if i == victim {
                continue;
            }
            for (ns, n) in running_by_namespace(s)? {
                *by_ns.entry(ns).or_default() += n;
            }
        }
        let have = |ns: &str| by_ns.get(ns).copied().unwrap_or(0);
        f.pods_lost = tenants
            .iter()
            .map(|t| want(t).saturating_sub(have(t)))
            .sum();
        f.pods_duplicated = tenants
            .iter()
            .map(|t| have(t).saturating_sub(want(t)))
            .sum();
        bar.set_position((args.pods - f.pods_lost) as u64);
        if f.pods_lost == 0 {
            f.replaced_secs = Some(killed_at.elapsed().as_secs_f64());
            // Looked at once more, a moment later: nothing doubled after the fact.
            tokio::time::sleep(Duration::from_secs(2)).await;
            let mut later: HashMap<String, usize> = HashMap::new();
            for (i, (_, s)) in fleet.shards.iter().enumerate() {
                if i != victim {
                    for (ns, n) in running_by_namespace(s)? {
                        *later.entry(ns).or_default() += n;
                    }
                }
            }
            f.pods_duplicated = tenants
                .iter()
                .map(|t| later.get(t).copied().unwrap_or(0).saturating_sub(want(t)))
                .sum();
            break;
        }
        if Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bar.finish_and_clear();
    drop(fleet);
    drop(dir);
    Ok(f)
}

/// What `--gangs` reports.
#[derive(Serialize, Default)]
struct Gangs {
    shards: usize,
    nodes: usize,
    gangs: usize,
    gang_size: u64,
    /// From the creates to the last gang bound.
    all_bound_secs: f64,
    /// Per gang, from its create to its record saying Bound.
    bound_p50_ms: f64,
    bound_p99_ms: f64,
    /// Gangs divided over two shards or more.
    divided: usize,
    /// Attempts aborted (a gang's attempt number less one, summed).
    aborted: i64,
    /// Gangs whose bound members over the shards are not exactly `gang_size`.
    wrong: usize,
}

/// `--gangs`: federation-scope gangs created at once, followed until each is bound whole.
async fn gangs(args: &FederationBenchArgs) -> anyhow::Result<Gangs> {
    let (dir, fleet, fed) = start_fleet(args).await?;
    let res = |g: &str, v: &str, p: &str| {
        find_resource(g, v, p).map_err(|e| anyhow::anyhow!("{}", e.message))
    };
    let (ns_res, pg_res, job_res) = (
        res("", "v1", "namespaces")?,
        res("tessera.io", "v1alpha1", "podgroups")?,
        res("batch", "v1", "jobs")?,
    );
    let size = args.gang_size;
    let mut g = Gangs {
        shards: args.shards,
        nodes: args.shards * args.nodes_per_shard,
        gangs: args.gangs,
        gang_size: size,
        ..Gangs::default()
    };
    let started = Instant::now();
    let creates = (0..args.gangs).map(|i| {
        let fed = fed.clone();
        async move {
            let ns = format!("g-{i}");
            fed.create(ns_res, None, &json!({"metadata": {"name": ns}}))
                .await?;
            let pg = json!({"apiVersion": "tessera.io/v1alpha1", "kind": "PodGroup",
                "metadata": {"name": "gang", "namespace": ns},
                "spec": {"minMember": size, "scope": "Federation", "scheduleTimeoutSeconds": 30}});
            fed.create(pg_res, Some(&ns), &pg).await?;
            let job = json!({"apiVersion": "batch/v1", "kind": "Job",
                "metadata": {"name": "gang", "namespace": ns},
                "spec": {"parallelism": size, "completions": size,
                    "template": {"metadata": {
                            "labels": {"scheduling.x-k8s.io/pod-group": "gang"},
                            "annotations": {"tessera.io/sim-run-seconds": "3600"}},
                        "spec": {"restartPolicy": "Never", "containers": [{"name": "c",
                            "image": "pause", "resources": {"requests": {"cpu": "1"}}}]}}}});
            fed.create(job_res, Some(&ns), &job).await?;
            Ok::<_, tessera_apiserver::status::ApiError>(Instant::now())
        }
    });
    let mut created = Vec::new();
    for r in futures::future::join_all(creates).await {
        created.push(r.map_err(|e| anyhow::anyhow!("creating a gang: {}", e.message))?);
    }
    let bar = super::progress_bar(args.gangs as u64, "gangs bound whole".into());
    let deadline = started + Duration::from_secs(args.timeout);
    let mut bound: Vec<Option<(Instant, usize, i64)>> = vec![None; args.gangs];
    let mut lat = Latencies::with_capacity(args.gangs);
    while bound.iter().any(Option::is_none) {
        anyhow::ensure!(
            Instant::now() < deadline,
            "only {} of {} gangs bound after {} s",
            bound.iter().flatten().count(),
            args.gangs,
            args.timeout
        );
        for (i, b) in bound.iter_mut().enumerate().filter(|(_, b)| b.is_none()) {
            let job = fed.get(job_res, Some(&format!("g-{i}")), "gang").await;
            let Ok(job) = job else { continue };
            let record: serde_json::Value = job["metadata"]["annotations"]["tessera.io/placement"]
                .as_str()
                .and_then(|s| serde_json::from_str(s).ok())
                .unwrap_or_default();
            if record["gang"]["phase"] == "Bound" {
                let shards = record["shares"].as_object().map_or(0, |m| m.len());
                let attempt = record["gang"]["attempt"].as_i64().unwrap_or(1);
                *b = Some((Instant::now(), shards, attempt));
                lat.record(Instant::now() - created[i]);
                bar.inc(1);
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bar.finish_and_clear();
    g.all_bound_secs = started.elapsed().as_secs_f64();
    g.bound_p50_ms = lat.percentile_ms(50.0);
    g.bound_p99_ms = lat.percentile_ms(99.0);
    for (_, shards, attempt) in bound.iter().flatten() {
        g.divided += usize::from(*shards > 1);
        g.aborted += attempt - 1;
    }
    // Every gang bound with exactly its members, over all shards.
    let pods = find_resource("", "v1", "pods").map_err(|e| anyhow::anyhow!("{}", e.message))?;
    let mut members: HashMap<String, u64> = HashMap::new();
    for (_, s) in &fleet.shards {
        for p in s.informers.get::<Pod>(pods).cache().list() {
            let on_node = p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some();
            if on_node && p.metadata.deletion_timestamp.is_none() {
                *members
                    .entry(p.metadata.namespace.clone().unwrap_or_default())
                    .or_default() += 1;
            }
        }
    }
    g.wrong = (0..args.gangs)
        .filter(|i| members.get(&format!("g-{i}")).copied().unwrap_or(0) != size)
        .count();
    drop(fleet);
    drop(dir);
    Ok(g)
}

/// Runs the benchmark.
pub async fn run(args: FederationBenchArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.shards > 0, "--shards must be at least 1");
    anyhow::ensure!(args.tenants > 0, "--tenants must be at least 1");
    if args.single_only {
        println!("{}", serde_json::to_string(&single(&args).await?)?);
        return Ok(());
    }
    if args.gangs > 0 {
        let g = gangs(&args).await?;
        if args.json {
            println!("{}", serde_json::to_string(&g)?);
        } else {
            println!(
                "federation bench, gangs: {} shards × {} nodes, {} gangs of {} one-cpu pods",
                g.shards, args.nodes_per_shard, g.gangs, g.gang_size
            );
            println!(
                "  all bound whole after           {:.1} s",
                g.all_bound_secs
            );
            println!(
                "  create → bound, per gang        p50 {:.0} ms, p99 {:.0} ms",
                g.bound_p50_ms, g.bound_p99_ms
            );
            println!(
                "  divided over shards             {} of {}",
                g.divided, g.gangs
            );
            println!("  attempts aborted                {}", g.aborted);
        }
        anyhow::ensure!(
            g.wrong == 0,
            "{} gangs did not end with exactly {} members bound",
            g.wrong,
            g.gang_size
        );
        return Ok(());
    }
    if args.skew {
        anyhow::ensure!(
            args.shards >= 2,
            "--skew needs at least 2 shards (one to borrow, one to lend)"
        );
        let k = skew(&args).await?;
        if args.json {
            println!("{}", serde_json::to_string(&k)?);
        } else {
            println!(
                "federation bench, skewed: {} shards × {} nodes of {} cpu; {} hot tenants pinned to shard-0 want {} one-cpu pods (twice its cpu)",
                k.shards, k.nodes_per_shard, k.node_cpu, k.hot_tenants, k.hot_pods
            );
            for (what, r) in [
                ("without lending", &k.without_lending),
                ("with lending", &k.with_lending),
            ] {
                println!(
                    "  {what:<16} cpu utilization {:>5.1}%  hot pods running {:>5}  nodes borrowed {:>4}  settled after {:.1} s",
                    r.cpu_utilization * 100.0,
                    r.hot_pods_running,
                    r.nodes_borrowed,
                    r.settled_secs
                );
            }
        }
        return Ok(());
    }
    if args.fail_shard {
        let f = fail_shard(&args).await?;
        if args.json {
            println!("{}", serde_json::to_string(&f)?);
        } else {
            println!(
                "federation bench, a shard killed: {} shards × {} nodes, {} pods from {} tenants, lease {} s",
                f.shards, args.nodes_per_shard, f.pods, f.tenants, f.shard_lease_seconds
            );
            println!(
                "  killed {} at {} pods running ({} of them there)",
                f.killed, f.pods_running_at_kill, f.pods_on_killed_shard
            );
            println!(
                "  every Deployment whole on the others after {}",
                f.replaced_secs
                    .map_or("- (timed out)".to_owned(), |s| format!("{s:.1} s"))
            );
            println!(
                "  pods lost / duplicated          {} / {}",
                f.pods_lost, f.pods_duplicated
            );
        }
        anyhow::ensure!(
            f.pods_lost == 0 && f.pods_duplicated == 0,
            "{} pods lost and {} duplicated after the shard was killed",
            f.pods_lost,
            f.pods_duplicated
        );
        return Ok(());
    }
    let nodes = args.shards * args.nodes_per_shard;
    let mut r = Report {
        shards: args.shards,
        nodes,
        pods: args.pods,
        tenants: args.tenants,
        ..Report::default()
    };
    r.placements_per_sec = fill::placements_per_sec(
        args.shards,
        args.nodes_per_shard as u64,
        args.tenants,
        args.decisions,
    );
    let f = if args.skip_utilization {
        fill::Fill::default()
    } else {
        let items = fill::mix(args.tenants, nodes as u64, 1.3, 42);
        fill::utilization(args.shards, args.nodes_per_shard as u64, &items)
    };
    r.utilization_vs_global = f.sharded_cpu as f64 / f.global_cpu.max(1) as f64;
    r.utilization_memory_vs_global = f.sharded_memory as f64 / f.global_memory.max(1) as f64;
    r.global_cpu_utilization = f.global_cpu as f64 / f.capacity_cpu.max(1) as f64;
    if !args.model_only {
        if !args.skip_single {
            let one = single_in_child(&args).await?;
            r.single_shard_pods_per_sec = Some(one.pods_per_sec);
            r.single_shard_cpu_us_per_pod = Some(one.cpu_us_per_pod);
            r.single_shard_api_writes_per_pod = Some(one.api_writes_per_pod);
            r.single_shard_api_writes_by_kind = one.api_writes_by_kind;
            r.single_shard_peak_rss_bytes = Some(one.peak_rss_bytes);
        }
        let _fleet_dir = sharded(&args, &mut r).await?;
        if let (Some(single), Some(fed)) = (r.single_shard_pods_per_sec, r.pods_per_sec) {
            r.per_pod_cost_ratio = Some(single / fed.max(1e-9));
        }
    }
    r.peak_rss_bytes = peak_rss();
    if args.json {
        println!("{}", serde_json::to_string(&r)?);
        return Ok(());
    }
    let opt = |v: Option<f64>, unit: &str| v.map_or("-".to_owned(), |v| format!("{v:.1}{unit}"));
    println!(
        "federation bench: {} shards × {} nodes = {} nodes, {} pods from {} tenants",
        r.shards, args.nodes_per_shard, r.nodes, r.pods, r.tenants
    );
    println!(
        "  pods/s through the federation   {}",
        opt(r.pods_per_sec, "")
    );
    println!(
        "  pods/s on one shard (same work) {}",
        opt(r.single_shard_pods_per_sec, "")
    );
    println!(
        "  per-pod cost ratio              {}",
        opt(r.per_pod_cost_ratio, "")
    );
    println!(
        "  cpu per pod, federation / one   {} / {}",
        opt(r.cpu_us_per_pod, " µs"),
        opt(r.single_shard_cpu_us_per_pod, " µs")
    );
    println!(
        "  API writes per pod, fed. / one  {} / {}",
        opt(r.api_writes_per_pod, ""),
        opt(r.single_shard_api_writes_per_pod, "")
    );
    let kinds: std::collections::BTreeSet<&String> = r
        .api_writes_by_kind
        .keys()
        .chain(r.single_shard_api_writes_by_kind.keys())
        .collect();
    for k in kinds {
        let of = |m: &BTreeMap<String, f64>| m.get(k).map_or("-".to_owned(), |v| format!("{v:.2}"));
        println!(
            "    {k:<40} {} / {}",
            of(&r.api_writes_by_kind),
            of(&r.single_shard_api_writes_by_kind)
        );
    }
    println!(
        "  placements/s (routing alone)    {:.0}",
        r.placements_per_sec
    );
    println!(
        "  utilization vs global pool      cpu {:.4}, memory {:.4} (global pool filled to {:.1}% cpu; {} workloads)",
        r.utilization_vs_global,
        r.utilization_memory_vs_global,
        r.global_cpu_utilization * 100.0,
        f.workloads
    );
    println!(
        "  propagation, idle               p50 {} p99 {}",
        opt(r.propagation_p50_ms, " ms"),
        opt(r.propagation_p99_ms, " ms")
    );
    println!(
        "  idle cpu                        {} cores (settled after {} s)",
        r.idle_cpu_cores
            .map_or("-".to_owned(), |v| format!("{v:.3}")),
        r.idle_settle_secs
            .map_or("-".to_owned(), |v| format!("{v:.0}"))
    );
    for (k, v) in &r.idle_writes_per_sec {
        println!("    {k:<40} {v:.1}/s");
    }
    println!(
        "  peak rss, federation / one      {:.1} MiB / {}",
        r.peak_rss_bytes as f64 / (1 << 20) as f64,
        r.single_shard_peak_rss_bytes
            .map_or("-".to_owned(), |b| format!(
                "{:.1} MiB",
                b as f64 / (1 << 20) as f64
            ))
    );
    Ok(())
}
