//! `tessera bench shard`: one whole shard in this process — the API on a fresh embedded
//! store, the scheduler, the ReplicaSet controller and simulated nodes — and pods created as
//! ReplicaSets of 100 through the in-process API. Measured from a watch of pods, as
//! Kubernetes' density tests do: pods/s from the first pod seen to the last one bound, the
//! time from a pod appearing to its binding (p50/p99), and pod startup latency (appearing to
//! Running; Kubernetes' SLO is p99 ≤ 5 s).
//!
//! Everything shares the machine's cores: the numbers are for the whole control plane.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use k8s_openapi::api::core::v1::Pod;
use parking_lot::Mutex;
use serde::Serialize;
use serde_json::json;
use tessera_agent::sim::{SimAgent, SimConfig};
use tessera_apiserver::auth::User;
use tessera_apiserver::client::{Client, InProcess};
use tessera_apiserver::request::find_resource;
use tessera_runtime::Informers;
use tessera_runtime::informer::Change;
use tessera_scheduler::config::SchedulerConfig;
use tessera_scheduler::{Scheduler, SchedulerOptions};

use super::latency::Latencies;

/// Flags of `bench shard`.
#[derive(Args, Debug)]
pub struct ShardBenchArgs {
    /// Simulated nodes.
    #[arg(long, default_value_t = 5000)]
    pub nodes: usize,
    /// Pods (created as ReplicaSets of 100).
    #[arg(long, default_value_t = 10_000)]
    pub pods: usize,
    /// Milliseconds from binding to Running on a simulated node.
    #[arg(long, default_value_t = 0)]
    pub startup_delay_ms: u64,
    /// Workers of the ReplicaSet controller.
    #[arg(long, default_value_t = 4)]
    pub workers: usize,
    /// The scheduler's workers (its `parallelism`; default: the machine's cores).
    #[arg(long)]
    pub scheduler_workers: Option<u32>,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 600)]
    pub timeout: u64,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize)]
struct Result {
    pods: usize,
    nodes: usize,
    seconds: f64,
    pods_per_sec: f64,
    schedule_p50_ms: f64,
    schedule_p99_ms: f64,
    startup_p50_ms: f64,
    startup_p99_ms: f64,
    startup_delay_ms: u64,
}

#[derive(Default, Clone, Copy)]
struct Seen {
    added: Option<Instant>,
    bound: Option<Instant>,
    running: Option<Instant>,
}

/// Runs the benchmark.
pub async fn run(args: ShardBenchArgs) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let api = super::in_process_api(dir.path()).await?;
    let client: Arc<dyn Client> = Arc::new(InProcess::new(api.clone(), User::Admin));
    let component = |name: &str| super::component_client(&api, name);
    let res =
        |g: &str, p: &str| find_resource(g, "v1", p).map_err(|e| anyhow::anyhow!("{}", e.message));
    client
        .create(
            res("", "namespaces")?,
            None,
            &json!({"metadata": {"name": "bench"}}),
        )
        .await
        .map_err(|e| anyhow::anyhow!("{}", e.message))?;

    let agent = SimAgent::new(
        component("node-agent"),
        SimConfig {
            nodes: args.nodes,
            startup_delay: Duration::from_millis(args.startup_delay_ms),
            ..SimConfig::default()
        },
        None,
        None,
    );
    let bar = super::progress_bar(args.nodes as u64, "registering nodes".into());
    agent
        .register(|| bar.inc(1))
        .await
        .map_err(|e| anyhow::anyhow!("{}", e.message))?;
    bar.finish_and_clear();

    // Watch pods the way a density test does.
    let seen: Arc<Mutex<HashMap<String, Seen>>> =
        Arc::new(Mutex::new(HashMap::with_capacity(args.pods)));
    // The shard's components share their informers, as in `tessera up`; the bench reads pods
    // off the same cache (as a density test's informer shares the process's factory), so each
    // change is decoded once.
    let informers = Informers::new(component("informers"), None);
    let informer = informers.get::<Pod>(res("", "pods")?);
    let bound_bar = super::progress_bar(args.pods as u64, "pods bound".into());
    {
        let seen = seen.clone();
        let bar = bound_bar.clone();
        informer
            .on_change(move |c| {
                let p = match c {
                    Change::Added(p) | Change::Updated { new: p, .. } => p,
                    Change::Deleted(_) => return,
                };
                let now = Instant::now();
                let uid = p.metadata.uid.clone().unwrap_or_default();
                let mut s = seen.lock();
                let e = s.entry(uid).or_default();
                e.added.get_or_insert(now);
                let bound = p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some();
                if bound && e.bound.is_none() {
                    e.bound = Some(now);
                    bar.inc(1);
                }
                let running = p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
                if running {
                    e.running.get_or_insert(now);
                }
            })
            .detach();
    }
    informer.synced().await;
    let mut tasks = vec![tokio::spawn(agent.run_with(Some(informers.clone())))];
    let scheduler = Scheduler::new(
        component("scheduler"),
        SchedulerOptions {
            config: SchedulerConfig {
                parallelism: args.scheduler_workers,
                ..SchedulerConfig::default()
            },
            metrics: None,
            runtime_metrics: None,
            informers: Some(informers.clone()),
        },
    )
    .map_err(|e| anyhow::anyhow!(e))?;
    tasks.push(tokio::spawn(scheduler.run()));
    let ctx = tessera_controllers::Context {
        workers: args.workers,
        informers,
        ..tessera_controllers::Context::new(component("controller-manager"))
    };
    tasks.push(tokio::spawn(tessera_controllers::replicaset::run(ctx)));

    let sets = args.pods.div_ceil(100);
    let rs_res = res("apps", "replicasets")?;
    let started = Instant::now();
    let creates = (0..sets).map(|i| {
        let replicas = (args.pods - i * 100).min(100);
        let rs = json!({"apiVersion": "apps/v1", "kind": "ReplicaSet",
            "metadata": {"name": format!("rs-{i}"), "namespace": "bench"},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"rs": format!("rs-{i}")}},
                "template": {"metadata": {"labels": {"rs": format!("rs-{i}")}},
                    "spec": {"containers": [{"name": "c", "image": "pause",
                        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}}}]}}}});
        let client = client.clone();
        async move { client.create(rs_res, Some("bench"), &rs).await }
    });
    for r in futures::future::join_all(creates).await {
        r.map_err(|e| anyhow::anyhow!("creating a ReplicaSet: {}", e.message))?;
    }
    let deadline = started + Duration::from_secs(args.timeout);
    loop {
        let (bound, running) = {
            let s = seen.lock();
            (
                s.values().filter(|e| e.bound.is_some()).count(),
                s.values().filter(|e| e.running.is_some()).count(),
            )
        };
        if bound >= args.pods && running >= args.pods {
            break;
        }
        if Instant::now() > deadline {
            anyhow::bail!(
                "only {bound} of {} pods bound and {running} running after {} s",
                args.pods,
                args.timeout
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    bound_bar.finish_and_clear();
    for t in tasks {
        t.abort();
    }
    let s = seen.lock();
    let first = s.values().filter_map(|e| e.added).min().unwrap_or(started);
    let last = s.values().filter_map(|e| e.bound).max().unwrap_or(started);
    let mut schedule = Latencies::with_capacity(s.len());
    let mut startup = Latencies::with_capacity(s.len());
    for e in s.values() {
        if let (Some(a), Some(b)) = (e.added, e.bound) {
            schedule.record(b - a);
        }
        if let (Some(a), Some(r)) = (e.added, e.running) {
            startup.record(r - a);
        }
    }
    let seconds = (last - first).as_secs_f64();
    let last_added = s.values().filter_map(|e| e.added).max().unwrap_or(started);
    tracing::info!(
        create_seconds = (last_added - first).as_secs_f64(),
        "all pods were created (seen) by then"
    );
    let r = Result {
        pods: args.pods,
        nodes: args.nodes,
        seconds,
        pods_per_sec: args.pods as f64 / seconds.max(1e-9),
        schedule_p50_ms: schedule.percentile_ms(50.0),
        schedule_p99_ms: schedule.percentile_ms(99.0),
        startup_p50_ms: startup.percentile_ms(50.0),
        startup_p99_ms: startup.percentile_ms(99.0),
        startup_delay_ms: args.startup_delay_ms,
    };
    if args.json {
        println!("{}", serde_json::to_string(&r)?);
    } else {
        println!(
            "{} pods on {} nodes in {:.2} s: {:.0} pods/s; created→bound p50 {:.1} ms p99 {:.1} ms; created→Running p50 {:.1} ms p99 {:.1} ms (startup delay {} ms)",
            r.pods,
            r.nodes,
            r.seconds,
            r.pods_per_sec,
            r.schedule_p50_ms,
            r.schedule_p99_ms,
            r.startup_p50_ms,
            r.startup_p99_ms,
            r.startup_delay_ms
        );
    }
    Ok(())
}
