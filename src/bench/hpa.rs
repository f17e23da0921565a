//! `tessera bench hpa`: what one HorizontalPodAutoscaler sync costs on a loaded shard. One
//! shard in this process (embedded store, API, scheduler, controllers, simulated nodes whose
//! pods use half their CPU requests), N Deployments of P pods, each in its own namespace
//! (as tenants' are) with an HPA at a 50% CPU target — at rest, so a sync reads and writes
//! nothing but what it must: the target's scale, the pods' metrics and the cache. Then every
//! HPA is synced `--rounds` times, `--concurrency` at a time (the controller's workers), and
//! the time of each sync is recorded.
//!
//! What it tells an operator: syncs/s is how many HPAs one shard's controller keeps at the
//! default 15 s period (syncs/s × 15); p99 shows whether a sync grows with the fleet.

use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use futures::StreamExt;
use serde::Serialize;
use serde_json::json;
use tessera_agent::sim::{SimAgent, SimConfig};
use tessera_apiserver::auth::User;
use tessera_apiserver::client::{Client, InProcess};
use tessera_apiserver::request::{ApiRequest, Verb};
use tessera_controllers::context::res;
use tessera_controllers::hpa::{Autoscaler, HpaConfig};
use tessera_runtime::Informers;
use tessera_scheduler::config::SchedulerConfig;
use tessera_scheduler::{Scheduler, SchedulerOptions};

use super::latency::Latencies;

/// Flags of `bench hpa`.
#[derive(Args, Debug)]
pub struct HpaBenchArgs {
    /// Deployments, each with an HPA, each in its own namespace.
    #[arg(long, default_value_t = 500)]
    pub targets: usize,
    /// Pods per Deployment.
    #[arg(long, default_value_t = 10)]
    pub pods_per_target: usize,
    /// Simulated nodes.
    #[arg(long, default_value_t = 500)]
    pub nodes: usize,
    /// Syncs at a time.
    #[arg(long, default_value_t = 4)]
    pub concurrency: usize,
    /// Times every HPA is synced.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Give up setting up after this many seconds.
    #[arg(long, default_value_t = 600)]
    pub timeout: u64,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize)]
struct Result {
    targets: usize,
    pods: usize,
    nodes: usize,
    concurrency: usize,
    syncs: usize,
    failed: usize,
    syncs_per_sec: f64,
    sync_p50_ms: f64,
    sync_p99_ms: f64,
}

fn err(e: tessera_apiserver::status::ApiError) -> anyhow::Error {
    anyhow::anyhow!("{}", e.message)
}

/// Runs the benchmark.
pub async fn run(args: HpaBenchArgs) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let api = super::in_process_api(dir.path()).await?;
    let client: Arc<dyn Client> = Arc::new(InProcess::new(api.clone(), User::Admin));
    let component = |name: &str| super::component_client(&api, name);
    let agent = SimAgent::new(
        component("node-agent"),
        SimConfig {
            nodes: args.nodes,
            ..SimConfig::default()
        },
        None,
        None,
    );
    let bar = super::progress_bar(args.nodes as u64, "registering nodes".into());
    agent.register(|| bar.inc(1)).await.map_err(err)?;
    bar.finish_and_clear();
    // Every pod uses half of its requests: at the HPAs' 50% target, nothing scales.
    let nodes = client
        .list(ApiRequest::new(Verb::List, res("", "nodes")))
        .await
        .map_err(err)?;
    for n in nodes["items"].as_array().into_iter().flatten() {
        let name = n["metadata"]["name"].as_str().unwrap_or_default();
        client
            .patch(
                res("", "nodes"),
                None,
                name,
                None,
                tessera_apiserver::request::PatchType::Merge,
                &json!({"metadata": {"annotations": {"tessera.io/simulated-usage-fraction": "0.5"}}}),
            )
            .await
            .map_err(err)?;
    }

    let informers = Informers::new(component("informers"), None);
    let mut tasks = vec![tokio::spawn(agent.run_with(Some(informers.clone())))];
    let scheduler = Scheduler::new(
        component("scheduler"),
        SchedulerOptions {
            config: SchedulerConfig::default(),
            metrics: None,
            runtime_metrics: None,
            informers: Some(informers.clone()),
        },
    )
    .map_err(|e| anyhow::anyhow!(e))?;
    tasks.push(tokio::spawn(scheduler.run()));
    let ctx = tessera_controllers::Context {
        informers,
        ..tessera_controllers::Context::new(component("controller-manager"))
    };
    // The shard's own HPA controller syncs each HPA once when it appears, then waits an
    // hour: the measured syncs below are the only ones running.
    let settings = tessera_controllers::Settings {
        hpa: HpaConfig {
            sync_period: Duration::from_secs(3600),
            ..HpaConfig::default()
        },
        ..tessera_controllers::Settings::default()
    };
    tasks.push(tokio::spawn(tessera_controllers::run_all_with(
        ctx.clone(),
        settings,
    )));

    let bar = super::progress_bar(args.targets as u64, "creating targets".into());
    let creates = futures::stream::iter(0..args.targets)
        .map(|i| {
            let client = client.clone();
            let bar = bar.clone();
            let pods = args.pods_per_target;
            async move {
                let ns = format!("team-{i}");
                client
                    .create(res("", "namespaces"), None, &json!({"metadata": {"name": ns}}))
                    .await?;
                let d = json!({"apiVersion": "apps/v1", "kind": "Deployment",
                    "metadata": {"name": "web", "namespace": ns},
                    "spec": {"replicas": pods, "selector": {"matchLabels": {"app": "web"}},
                        "template": {"metadata": {"labels": {"app": "web"}},
                            "spec": {"containers": [{"name": "c", "image": "pause",
                                "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}]}}}});
                client
                    .create(res("apps", "deployments"), Some(&ns), &d)
                    .await?;
                let h = json!({"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
                    "metadata": {"name": "web", "namespace": ns},
                    "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
                        "minReplicas": 1, "maxReplicas": pods * 2,
                        "metrics": [{"type": "Resource", "resource": {"name": "cpu",
                            "target": {"type": "Utilization", "averageUtilization": 50}}}]}});
                client
                    .create(res("autoscaling", "horizontalpodautoscalers"), Some(&ns), &h)
                    .await?;
                bar.inc(1);
                Ok::<(), tessera_apiserver::status::ApiError>(())
            }
        })
        .buffer_unordered(16);
    let results: Vec<_> = creates.collect().await;
    bar.finish_and_clear();
    for r in results {
        r.map_err(err)?;
    }

    let total = args.targets * args.pods_per_target;
    let bar = super::progress_bar(total as u64, "pods running".into());
    let deadline = Instant::now() + Duration::from_secs(args.timeout);
    let pods = ctx.informer::<k8s_openapi::api::core::v1::Pod>(res("", "pods"));
    loop {
        let running = pods
            .cache()
            .list()
            .iter()
            .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
            .count();
        bar.set_position(running as u64);
        if running >= total {
            break;
        }
        if Instant::now() > deadline {
            anyhow::bail!(
                "only {running} of {total} pods running after {} s",
                args.timeout
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    bar.finish_and_clear();

    let autoscaler = Arc::new(Autoscaler::new(&ctx, HpaConfig::default(), None));
    autoscaler.synced().await;
    let keys = autoscaler.keys();
    let syncs = keys.len() * args.rounds;
    let bar = super::progress_bar(syncs as u64, "HPA syncs".into());
    let started = Instant::now();
    let timed = futures::stream::iter((0..args.rounds).flat_map(|_| keys.clone()))
        .map(|key| {
            let a = autoscaler.clone();
            let bar = bar.clone();
            async move {
                let t = Instant::now();
                let ok = a.sync(&key).await.is_ok();
                bar.inc(1);
                (t.elapsed(), ok)
            }
        })
        .buffer_unordered(args.concurrency.max(1));
    let outcomes: Vec<(Duration, bool)> = timed.collect().await;
    let seconds = started.elapsed().as_secs_f64();
    bar.finish_and_clear();
    for t in tasks {
        t.abort();
    }
    let mut latencies = Latencies::with_capacity(outcomes.len());
    for (d, _) in &outcomes {
        latencies.record(*d);
    }
    let r = Result {
        targets: args.targets,
        pods: total,
        nodes: args.nodes,
        concurrency: args.concurrency,
        syncs,
        failed: outcomes.iter().filter(|(_, ok)| !ok).count(),
        syncs_per_sec: syncs as f64 / seconds.max(1e-9),
        sync_p50_ms: latencies.percentile_ms(50.0),
        sync_p99_ms: latencies.percentile_ms(99.0),
    };
    if args.json {
        println!("{}", serde_json::to_string(&r)?);
    } else {
        println!(
            "{} HPAs over {} pods on {} nodes, {} at a time: {} syncs ({} failed), {:.0} syncs/s; sync p50 {:.2} ms p99 {:.2} ms",
            r.targets,
            r.pods,
            r.nodes,
            r.concurrency,
            r.syncs,
            r.failed,
            r.syncs_per_sec,
            r.sync_p50_ms,
            r.sync_p99_ms
        );
    }
    Ok(())
}
