//! `tessera bench scheduler`: the scheduler against the real API, shaped like Kubernetes'
//! scheduler_perf. A shard's API on a fresh embedded store and its scheduler run in this
//! process; nodes (4 cpu / 32 Gi / 110 pods) are registered through the API with no agent
//! behind them, init pods are created and scheduled first, then the measured pods are
//! created through the API and bound by the scheduler through the API. Measured from a watch
//! of pods: pods/s from the first measured create to the last binding, and each pod's time
//! from appearing to being bound.
//!
//! Workloads: `basic`, `node-affinity` (every pod requires the nodes' zone), `anti-affinity`,
//! `topology-spread`, `unschedulable` (init pods that fit nowhere stay queued while the
//! measured pods are placed), `gang` (PodGroups of `--gang-size`, each bound whole),
//! `preemption` (low-priority init pods fill every node; each measured high-priority pod
//! preempts one) and `tenants` (fair sharing; see [`run_tenants`]). Nothing runs the pods;
//! the benchmark deletes terminating pods at once, as a node agent would.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use parking_lot::Mutex;
use serde::Serialize;
use serde_json::{Value, json};
use tessera_agent::sim::{SimAgent, SimConfig};
use tessera_apiserver::api::Api;
use tessera_apiserver::auth::User;
use tessera_apiserver::client::{Client, InProcess};
use tessera_apiserver::request::{ApiRequest, Verb, find_resource};
use tessera_apiserver::types::POD_GROUP_LABEL;
use tessera_runtime::Informers;
use tessera_runtime::informer::Change;
use tessera_scheduler::config::SchedulerConfig;
use tessera_scheduler::metrics::SchedulerMetrics;
use tessera_scheduler::{Scheduler, SchedulerOptions};
use tessera_store::{EmbeddedOptions, EmbeddedStore, StoreMetrics};

use super::latency::Latencies;

/// What the measured pods ask of the scheduler.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Workload {
    /// Plain pods (100m / 500 Mi).
    Basic,
    /// Pods that require the nodes' zone by node affinity.
    NodeAffinity,
    /// Pods with required anti-affinity to each other by hostname (init pods too): one per
    /// node.
    AntiAffinity,
    /// Pods spread over 3 zones with maxSkew 5 (`DoNotSchedule`).
    TopologySpread,
    /// Init pods of priority 1 (1 cpu each, 4 per node: every node full); measured pods of
    /// priority 1000 (1 cpu) each preempt one of them.
    Preemption,
    /// Init pods that fit nowhere stay queued while the measured pods are placed.
    Unschedulable,
    /// The measured pods in PodGroups of `--gang-size` (minMember = size), each placed and
    /// bound all together.
    Gang,
    /// One tenant floods while the others submit at a steady rate; then a full shard is
    /// refilled from every tenant's backlog and split by weight.
    Tenants,
}

/// Flags of `tessera bench scheduler`.
#[derive(Args, Debug)]
pub struct SchedulerBenchArgs {
    /// What the pods ask for.
    #[arg(long, value_enum, default_value = "basic")]
    pub workload: Workload,
    /// Nodes (4 cpu, 32 Gi, 110 pods each).
    #[arg(long, default_value_t = 5000)]
    pub nodes: usize,
    /// Measured pods (`tenants`: the flooding tenant's pods).
    #[arg(long, default_value_t = 10_000)]
    pub pods: usize,
    /// Pods created and scheduled before the measurement (default: 1,000; for
    /// `unschedulable`, 1,000 pods that fit nowhere).
    #[arg(long)]
    pub init_pods: Option<usize>,
    /// Scheduling workers: pods decided at once against one snapshot (the scheduler
    /// configuration's `parallelism`; default: the machine's cores).
    #[arg(long)]
    pub workers: Option<u32>,
    /// `tenants`: how many tenants (tenant-0 floods; weights cycle 1, 2, 3, 4).
    #[arg(long, default_value_t = 100)]
    pub tenants: usize,
    /// `tenants`: pods per second each other tenant submits during the flood.
    #[arg(long, default_value_t = 1.0)]
    pub rate: f64,
    /// `tenants`: seconds the other tenants submit for.
    #[arg(long, default_value_t = 10)]
    pub duration: u64,
    /// `tenants`: nodes of the shard that is filled and refilled from every tenant's
    /// backlog (phase 2; 40 pods each).
    #[arg(long, default_value_t = 500)]
    pub share_nodes: usize,
    /// `topology-spread`: this many of the nodes carry no zone label (a fleet only partly in
    /// zones; the spread pods cannot go there).
    #[arg(long, default_value_t = 0)]
    pub unzoned_nodes: usize,
    /// `gang`: members per PodGroup (its minMember).
    #[arg(long, default_value_t = 8)]
    pub gang_size: usize,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 600)]
    pub timeout: u64,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize, Default)]
struct Report {
    workload: String,
    nodes: usize,
    init_pods: usize,
    pods: usize,
    workers: usize,
    seconds: f64,
    pods_per_sec: f64,
    schedule_p50_ms: f64,
    schedule_p99_ms: f64,
    /// Bindings the API refused (the pod changed or was bound meanwhile).
    conflicts: u64,
    /// Of the nodes the filter walks judged, the percentage whose local filters' result was
    /// reused from an alike pod's (same template) instead of running the filters again.
    memo_reuse_pct: f64,
    /// CPU time of the scheduler's cycles per placed pod, in microseconds: what one worker
    /// costs per pod, apart from the API and the waits.
    cycle_cpu_us: f64,
    /// Mean wall time of a scheduling attempt that placed a pod, in microseconds: the
    /// cycle (prepare counters, filter, score, reserve, permit) and any wait for a binding
    /// slot — on 2 cores it also includes time the loop's thread lost to the API's work.
    attempt_mean_us: f64,
    /// What was checked of every placement (anti-affinity, spread).
    #[serde(skip_serializing_if = "Option::is_none")]
    checked: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tenants: Option<TenantsReport>,
}

#[derive(Serialize, Default)]
struct TenantsReport {
    tenants: usize,
    /// Pods the other tenants submitted during the flood.
    others_pods: usize,
    others_wait_p50_ms: f64,
    others_wait_p99_ms: f64,
    /// Pods the phase-2 shard holds (by cpu: 40 per node).
    capacity: usize,
    /// After refilling the full shard from every tenant's backlog: the largest difference
    /// between a tenant's part of the shard and its weight's part, in % of the latter.
    share_error_max_pct: f64,
    share_error_mean_pct: f64,
}

#[derive(Default, Clone)]
struct Seen {
    ns: String,
    added: Option<Instant>,
    bound: Option<Instant>,
    node: Option<String>,
    gone: bool,
    /// Its PodGroup, and the resourceVersion it was first seen bound at (members bound in
    /// one transaction share it).
    group: Option<String>,
    bound_rv: Option<String>,
}

type SeenMap = Arc<Mutex<HashMap<String, Seen>>>;

struct Bench {
    client: Arc<dyn Client>,
    seen: SeenMap,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    metrics: SchedulerMetrics,
}

impl Drop for Bench {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

fn err(e: tessera_apiserver::status::ApiError) -> anyhow::Error {
    anyhow::anyhow!("{}", e.message)
}

fn pods_res() -> &'static tessera_apiserver::catalog::Resource {
    find_resource("", "v1", "pods").expect("pods are served")
}

const ZONE: &str = "topology.kubernetes.io/zone";
/// `topology-spread`: zones of the nodes, and the constraint's maxSkew.
const SPREAD_ZONES: usize = 3;
const SPREAD_MAX_SKEW: usize = 5;

/// A pod of `ns` named `name`, labelled `phase`, asking `cpu`, shaped by `workload`.
fn pod(ns: &str, name: &str, phase: &str, cpu: &str, workload: Workload) -> Value {
    let mut p = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": {"phase": phase}},
        "spec": {"containers": [{"name": "c", "image": "pause",
            "resources": {"requests": {"cpu": cpu, "memory": "500Mi"}}}]}});
    if workload == Workload::AntiAffinity {
        p["metadata"]["labels"]["color"] = json!("green");
        p["spec"]["affinity"] = json!({"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
            [{"labelSelector": {"matchLabels": {"color": "green"}}, "namespaces": ["init", "measured"],
              "topologyKey": "kubernetes.io/hostname"}]}});
    }
    if workload == Workload::TopologySpread {
        p["metadata"]["labels"]["color"] = json!("blue");
        p["spec"]["topologySpreadConstraints"] = json!([{"maxSkew": SPREAD_MAX_SKEW,
            "topologyKey": ZONE, "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchLabels": {"color": "blue"}}}]);
    }
    if workload == Workload::Preemption {
        p["spec"]["priorityClassName"] = json!(if phase == "init" { "low" } else { "high" });
        p["spec"]["containers"][0]["resources"]["requests"]["cpu"] = json!("1");
    }
    if workload == Workload::NodeAffinity {
        p["spec"]["affinity"] = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
            {"nodeSelectorTerms": [{"matchExpressions": [{"key": "topology.kubernetes.io/zone",
                "operator": "In", "values": ["zone1", "zone2"]}]}]}}});
    }
    p
}

impl Bench {
    /// A shard of `nodes` nodes: all in zone1, or spread over `zones` zones (`zone-K`) but
    /// for the first `unzoned`, which carry no zone.
    async fn start(
        nodes: usize,
        (zones, unzoned): (usize, usize),
        dir: &std::path::Path,
        workers: Option<u32>,
    ) -> anyhow::Result<Bench> {
        std::fs::create_dir_all(dir)?;
        let store = Arc::new(
            EmbeddedStore::open(
                dir,
                EmbeddedOptions::default(),
                StoreMetrics::register(&prometheus::Registry::new())?,
            )
            .await?,
        );
        let api = Api::new(store, None);
        let client: Arc<dyn Client> = Arc::new(InProcess::new(api.clone(), User::Admin));
        let mut labels = std::collections::BTreeMap::new();
        if zones == 0 {
            labels.insert(ZONE.to_owned(), "zone1".to_owned());
        }
        let agent = SimAgent::new(
            client.clone(),
            SimConfig {
                prefix: "node".into(),
                nodes,
                cpu: "4".into(),
                memory: "32Gi".into(),
                pods: 110,
                labels,
                zones,
                unzoned,
                ..SimConfig::default()
            },
            None,
            None,
        );
        let bar = super::progress_bar(nodes as u64, "registering nodes".into());
        agent.register(|| bar.inc(1)).await.map_err(err)?;
        bar.finish_and_clear();

        let seen: SeenMap = Arc::new(Mutex::new(HashMap::new()));
        let component = |name: &str| -> Arc<dyn Client> {
            tessera_runtime::client::Retrying::wrap(Arc::new(InProcess::new(
                api.clone(),
                User::System(name.into()),
            )))
        };
        // One informer per resource for the whole process, as kube-scheduler's scheduler_perf
        // shares its informer factory with the scheduler it measures: the bench reads pods off
        // the scheduler's own cache instead of decoding every change a second time.
        let informers = Informers::new(component("informers"), None);
        let informer = informers.get::<Pod>(pods_res());
        // What a node agent does for a pod being deleted: it stops, and goes.
        let (stopping, mut stopped) = tokio::sync::mpsc::unbounded_channel::<(String, String)>();
        {
            let seen = seen.clone();
            informer
                .on_change(move |c| {
                    if let Change::Updated { new: p, .. } = c
                        && p.metadata.deletion_timestamp.is_some()
                    {
                        let _ = stopping.send((
                            p.metadata.namespace.clone().unwrap_or_default(),
                            p.metadata.name.clone().unwrap_or_default(),
                        ));
                    }
                    let now = Instant::now();
                    let (p, gone) = match c {
                        Change::Added(p) | Change::Updated { new: p, .. } => (p, false),
                        Change::Deleted(p) => (p, true),
                    };
                    let uid = p.metadata.uid.clone().unwrap_or_default();
                    let mut s = seen.lock();
                    let e = s.entry(uid).or_insert_with(|| Seen {
                        ns: p.metadata.namespace.clone().unwrap_or_default(),
                        ..Seen::default()
                    });
                    e.added.get_or_insert(now);
                    let node = p.spec.as_ref().and_then(|s| s.node_name.as_ref());
                    if let Some(n) = node
                        && e.bound.is_none()
                    {
                        e.bound = Some(now);
                        e.node = Some(n.clone());
                        e.bound_rv = p.metadata.resource_version.clone();
                        e.group = p
                            .metadata
                            .labels
                            .as_ref()
                            .and_then(|l| l.get(POD_GROUP_LABEL))
                            .cloned();
                    }
                    e.gone |= gone;
                })
                .detach();
        }
        let mut tasks = Vec::new();
        let agent_client = client.clone();
        tasks.push(tokio::spawn(async move {
            while let Some((ns, name)) = stopped.recv().await {
                let mut req = ApiRequest::new(Verb::Delete, pods_res());
                req.namespace = Some(ns);
                req.name = Some(name);
                req.body = json!({"gracePeriodSeconds": 0}).to_string().into();
                let _ = agent_client.call(req).await;
            }
        }));
        informer.synced().await;
        let metrics = SchedulerMetrics::unregistered()?;
        let scheduler = Scheduler::new(
            component("scheduler"),
            SchedulerOptions {
                config: SchedulerConfig {
                    parallelism: workers,
                    ..SchedulerConfig::default()
                },
                metrics: Some(metrics.clone()),
                runtime_metrics: None,
                informers: Some(informers),
            },
        )
        .map_err(|e| anyhow::anyhow!(e))?;
        tasks.push(tokio::spawn(scheduler.run()));
        Ok(Bench {
            client,
            seen,
            tasks,
            metrics,
        })
    }

    async fn namespace(&self, name: &str) -> anyhow::Result<()> {
        let ns = find_resource("", "v1", "namespaces").map_err(err)?;
        self.client
            .create(ns, None, &json!({"metadata": {"name": name}}))
            .await
            .map_err(err)?;
        Ok(())
    }

    /// PriorityClasses `low` (1) and `high` (1000).
    async fn priority_classes(&self) -> anyhow::Result<()> {
        let classes = find_resource("scheduling.k8s.io", "v1", "priorityclasses").map_err(err)?;
        for (name, value) in [("low", 1), ("high", 1000)] {
            self.client
                .create(
                    classes,
                    None,
                    &json!({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                        "metadata": {"name": name}, "value": value}),
                )
                .await
                .map_err(err)?;
        }
        Ok(())
    }

    /// Creates PodGroups `g-0` … in `measured`, each of minMember `size`.
    async fn pod_groups(&self, n: usize, size: usize) -> anyhow::Result<()> {
        let groups = find_resource("tessera.io", "v1alpha1", "podgroups").map_err(err)?;
        let bar = super::progress_bar(n as u64, "creating PodGroups".into());
        for i in 0..n {
            self.client
                .create(
                    groups,
                    Some("measured"),
                    &json!({"apiVersion": "tessera.io/v1alpha1", "kind": "PodGroup",
                        "metadata": {"name": format!("g-{i}")}, "spec": {"minMember": size}}),
                )
                .await
                .map_err(err)?;
            bar.inc(1);
        }
        bar.finish_and_clear();
        Ok(())
    }

    /// Creates `pods` through the API, 64 at a time, with a progress bar.
    async fn create(&self, pods: Vec<Value>, label: &str) -> anyhow::Result<()> {
        let bar = super::progress_bar(pods.len() as u64, label.into());
        let res = pods_res();
        let mut results = futures::stream::iter(pods)
            .map(|p| {
                let client = self.client.clone();
                async move {
                    let ns = p["metadata"]["namespace"].as_str().unwrap_or("").to_owned();
                    client.create(res, Some(&ns), &p).await
                }
            })
            .buffer_unordered(64);
        while let Some(r) = results.next().await {
            r.map_err(|e| anyhow::anyhow!("creating a pod: {}", e.message))?;
            bar.inc(1);
        }
        bar.finish_and_clear();
        Ok(())
    }

    fn bound_in(&self, pred: impl Fn(&str) -> bool) -> usize {
        self.seen
            .lock()
            .values()
            .filter(|e| !e.gone && e.bound.is_some() && pred(&e.ns))
            .count()
    }

    /// Waits until `want` pods of namespaces `pred` picks are bound (and not deleted).
    async fn wait_bound(
        &self,
        want: usize,
        pred: impl Fn(&str) -> bool,
        deadline: Instant,
        label: &str,
    ) -> anyhow::Result<()> {
        let bar = super::progress_bar(want as u64, label.into());
        loop {
            let n = self.bound_in(&pred);
            bar.set_position(n as u64);
            if n >= want {
                break;
            }
            if Instant::now() > deadline {
                anyhow::bail!("only {n} of {want} pods bound ({label}) before the timeout");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        bar.finish_and_clear();
        Ok(())
    }

    /// Waits until no pod has been bound for `quiet`.
    async fn wait_quiet(&self, quiet: Duration, deadline: Instant) {
        let mut last = self.bound_in(|_| true);
        let mut since = Instant::now();
        while Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let n = self.bound_in(|_| true);
            if n != last {
                last = n;
                since = Instant::now();
            } else if since.elapsed() >= quiet {
                return;
            }
        }
    }

    /// Nodes judged so far by a remembered filter result, and by running the filters.
    fn memo(&self) -> (u64, u64) {
        (
            self.metrics.memo_nodes("reused"),
            self.metrics.memo_nodes("judged"),
        )
    }

    /// Placements decided again because their snapshot moved (Omega's conflicts).
    fn conflicts(&self) -> u64 {
        self.metrics.conflicts("placement")
    }

    fn cycle_cpu_us(&self) -> f64 {
        let (n, _) = self.metrics.scheduled_attempts();
        self.metrics.cycle_cpu_seconds() * 1e6 / n.max(1) as f64
    }

    fn attempt_mean_us(&self) -> f64 {
        let (n, secs) = self.metrics.scheduled_attempts();
        secs * 1e6 / n.max(1) as f64
    }
}

/// Runs the benchmark.
pub async fn run(args: SchedulerBenchArgs) -> anyhow::Result<()> {
    match args.workload {
        Workload::Gang if args.gang_size == 0 || !args.pods.is_multiple_of(args.gang_size) => {
            anyhow::bail!(
                "--pods {} is not a whole number of gangs of --gang-size {}",
                args.pods,
                args.gang_size
            )
        }
        _ if args.unzoned_nodes > 0 && args.workload != Workload::TopologySpread => {
            anyhow::bail!("--unzoned-nodes applies to --workload topology-spread only")
        }
        _ if args.unzoned_nodes + SPREAD_ZONES > args.nodes => anyhow::bail!(
            "--unzoned-nodes {} leaves fewer than {SPREAD_ZONES} of the {} nodes in zones",
            args.unzoned_nodes,
            args.nodes
        ),
        _ => {}
    }
    workers_of(&args)?;
    let dir = tempfile::tempdir()?;
    let zones = if args.workload == Workload::TopologySpread {
        SPREAD_ZONES
    } else {
        0
    };
    let bench = Bench::start(
        args.nodes,
        (zones, args.unzoned_nodes),
        &dir.path().join("shard"),
        args.workers,
    )
    .await?;
    let report = if args.workload == Workload::Tenants {
        run_tenants(&bench, &args, dir.path()).await?
    } else {
        run_plain(&bench, &args).await?
    };
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        println!(
            "{} ({} nodes, {} init pods): {} pods in {:.2} s: {:.0} pods/s; created→bound p50 {:.1} ms p99 {:.1} ms; {} worker(s), {} conflicts; {:.0}% of filter results reused; scheduling attempt {:.0} µs per pod, of it {:.0} µs of the scheduler's CPU",
            report.workload,
            report.nodes,
            report.init_pods,
            report.pods,
            report.seconds,
            report.pods_per_sec,
            report.schedule_p50_ms,
            report.schedule_p99_ms,
            report.workers,
            report.conflicts,
            report.memo_reuse_pct,
            report.attempt_mean_us,
            report.cycle_cpu_us
        );
        if let Some(c) = &report.checked {
            println!("checked: {c}");
        }
        if let Some(t) = &report.tenants {
            println!(
                "tenants: {} tenants; the others' {} pods during the flood waited p50 {:.1} ms p99 {:.1} ms; refilling a full shard of {} pods: parts within {:.2}% of weight (mean {:.2}%)",
                t.tenants,
                t.others_pods,
                t.others_wait_p50_ms,
                t.others_wait_p99_ms,
                t.capacity,
                t.share_error_max_pct,
                t.share_error_mean_pct
            );
        }
    }
    Ok(())
}

/// `basic`, `node-affinity`, `unschedulable`: init pods, then the measured pods.
async fn run_plain(bench: &Bench, args: &SchedulerBenchArgs) -> anyhow::Result<Report> {
    let deadline = Instant::now() + Duration::from_secs(args.timeout);
    bench.namespace("init").await?;
    bench.namespace("measured").await?;
    let preemption = args.workload == Workload::Preemption;
    let init = args
        .init_pods
        .unwrap_or(if preemption { 4 * args.nodes } else { 1_000 });
    if preemption {
        bench.priority_classes().await?;
    }
    let (init_cpu, init_fit) = if args.workload == Workload::Unschedulable {
        ("9", false)
    } else {
        ("100m", true)
    };
    let pods = (0..init)
        .map(|i| {
            pod(
                "init",
                &format!("init-{i}"),
                "init",
                init_cpu,
                args.workload,
            )
        })
        .collect();
    bench.create(pods, "creating init pods").await?;
    if init_fit {
        bench
            .wait_bound(init, |ns| ns == "init", deadline, "init pods bound")
            .await?;
    }
    let conflicts_before = bench.conflicts();
    let memo_before = bench.memo();
    let gang = (args.workload == Workload::Gang).then_some(args.gang_size);
    if let Some(size) = gang {
        bench.pod_groups(args.pods / size, size).await?;
    }
    let pods = (0..args.pods)
        .map(|i| {
            let mut p = pod(
                "measured",
                &format!("p-{i}"),
                "measured",
                "100m",
                args.workload,
            );
            if let Some(size) = gang {
                p["metadata"]["labels"][POD_GROUP_LABEL] = json!(format!("g-{}", i / size));
            }
            p
        })
        .collect();
    let started = Instant::now();
    let create = bench.create(pods, "creating measured pods");
    let wait = bench.wait_bound(
        args.pods,
        |ns| ns == "measured",
        deadline,
        "measured pods bound",
    );
    let (c, w) = tokio::join!(create, wait);
    c?;
    w?;
    let s = bench.seen.lock();
    let checked = match gang {
        Some(size) => Some(check_gangs(&s, size)?),
        None if preemption => Some(check_preemption(&s, args.pods)?),
        None => check_placement(&s, args.workload, args.unzoned_nodes)?,
    };
    let measured = s.values().filter(|e| e.ns == "measured");
    let last = measured
        .clone()
        .filter_map(|e| e.bound)
        .max()
        .unwrap_or(started);
    let mut lat = Latencies::with_capacity(args.pods);
    for e in measured {
        if let (Some(a), Some(b)) = (e.added, e.bound) {
            lat.record(b - a);
        }
    }
    let seconds = (last - started).as_secs_f64();
    Ok(Report {
        workload: args
            .workload
            .to_possible_value()
            .map_or_else(String::new, |v| v.get_name().to_owned()),
        nodes: args.nodes,
        init_pods: init,
        pods: args.pods,
        workers: workers_of(args)?,
        seconds,
        pods_per_sec: args.pods as f64 / seconds.max(1e-9),
        schedule_p50_ms: lat.percentile_ms(50.0),
        schedule_p99_ms: lat.percentile_ms(99.0),
        conflicts: bench.conflicts() - conflicts_before,
        memo_reuse_pct: reuse_pct(memo_before, bench.memo()),
        attempt_mean_us: bench.attempt_mean_us(),
        cycle_cpu_us: bench.cycle_cpu_us(),
        checked,
        tenants: None,
    })
}

/// Checks what the workload promises of every placement: `anti-affinity`, each pod on a
/// node of its own; `topology-spread`, each namespace's pods within maxSkew over the zones
/// and none on the first `unzoned` nodes (they carry no zone). Says what was checked; an
/// error if a placement broke it.
fn check_placement(
    seen: &HashMap<String, Seen>,
    workload: Workload,
    unzoned: usize,
) -> anyhow::Result<Option<String>> {
    let placed = || {
        seen.values()
            .filter(|e| !e.gone)
            .filter_map(|e| Some((e, e.node.as_deref()?)))
    };
    match workload {
        Workload::AntiAffinity => {
            let mut nodes: Vec<&str> = placed().map(|(_, n)| n).collect();
            let all = nodes.len();
            nodes.sort_unstable();
            nodes.dedup();
            if nodes.len() != all {
                anyhow::bail!(
                    "anti-affinity broken: {all} pods on only {} nodes",
                    nodes.len()
                );
            }
            Ok(Some(format!("{all} pods on {all} distinct nodes")))
        }
        Workload::TopologySpread => {
            let mut out = Vec::new();
            for ns in ["init", "measured"] {
                let mut per_zone = [0usize; SPREAD_ZONES];
                for (_, node) in placed().filter(|(e, _)| e.ns == ns) {
                    let i: usize = node
                        .rsplit('-')
                        .next()
                        .and_then(|i| i.parse().ok())
                        .ok_or_else(|| anyhow::anyhow!("node {node} has no index"))?;
                    if i < unzoned {
                        anyhow::bail!("spread broken in {ns}: a pod on {node}, which has no zone");
                    }
                    per_zone[i % SPREAD_ZONES] += 1;
                }
                let (min, max) = (
                    per_zone.iter().min().copied().unwrap_or(0),
                    per_zone.iter().max().copied().unwrap_or(0),
                );
                if max - min > SPREAD_MAX_SKEW {
                    anyhow::bail!(
                        "spread broken in {ns}: zones hold {per_zone:?}, skew {} > {SPREAD_MAX_SKEW}",
                        max - min
                    );
                }
                out.push(format!("{ns}: zones {per_zone:?}, skew {}", max - min));
            }
            Ok(Some(format!(
                "{} (maxSkew {SPREAD_MAX_SKEW})",
                out.join("; ")
            )))
        }
        _ => Ok(None),
    }
}

/// `preemption`: every measured pod bound; exactly one init pod evicted for each (the
/// fewest victims); no node holds more than 4 live pods of 1 cpu.
fn check_preemption(seen: &HashMap<String, Seen>, measured: usize) -> anyhow::Result<String> {
    let victims = seen.values().filter(|e| e.ns == "init" && e.gone).count();
    if victims != measured {
        anyhow::bail!("{measured} high-priority pods evicted {victims} pods, not one each");
    }
    let mut per_node: HashMap<&str, usize> = HashMap::new();
    for e in seen.values().filter(|e| !e.gone) {
        if let Some(n) = e.node.as_deref() {
            *per_node.entry(n).or_insert(0) += 1;
        }
    }
    if let Some((n, c)) = per_node.iter().find(|(_, c)| **c > 4) {
        anyhow::bail!("node {n} holds {c} pods of 1 cpu in 4 cpu");
    }
    Ok(format!(
        "{measured} high-priority pods placed, {victims} low-priority victims (one each), no node over its 4 cpu"
    ))
}

/// `gang`: every PodGroup has all its `size` members bound, at one resourceVersion (one
/// transaction: never part of a gang).
fn check_gangs(seen: &HashMap<String, Seen>, size: usize) -> anyhow::Result<String> {
    let mut groups: HashMap<&str, Vec<&str>> = HashMap::new();
    for e in seen.values().filter(|e| e.ns == "measured" && !e.gone) {
        let Some(g) = e.group.as_deref() else {
            continue;
        };
        groups
            .entry(g)
            .or_default()
            .push(e.bound_rv.as_deref().unwrap_or(""));
    }
    for (g, revs) in &groups {
        let mut distinct = revs.clone();
        distinct.sort_unstable();
        distinct.dedup();
        if revs.len() != size || distinct.len() != 1 {
            anyhow::bail!(
                "gang {g}: {} of {size} members bound, at {} different revisions",
                revs.len(),
                distinct.len()
            );
        }
    }
    Ok(format!(
        "{} gangs of {size}: each bound whole, in one transaction",
        groups.len()
    ))
}

fn weight(i: usize) -> usize {
    1 + i % 4
}

/// Creates `t` tenants (`tenant-i` owning namespace `tenant-i`, weight 1 + i % 4) and waits
/// until the scheduler has placed a pod of each (so it knows them all).
async fn make_tenants(bench: &Bench, t: usize, deadline: Instant) -> anyhow::Result<()> {
    let tenants_res = find_resource("tessera.io", "v1alpha1", "tenants").map_err(err)?;
    for i in 0..t {
        let ns = format!("tenant-{i}");
        bench.namespace(&ns).await?;
        bench
            .client
            .create(
                tenants_res,
                None,
                &json!({"apiVersion": "tessera.io/v1alpha1", "kind": "Tenant",
                    "metadata": {"name": ns}, "spec": {"namespaces": [ns], "weight": weight(i)}}),
            )
            .await
            .map_err(err)?;
    }
    let pods = (0..t)
        .map(|i| {
            pod(
                &format!("tenant-{i}"),
                "probe",
                "probe",
                "100m",
                Workload::Basic,
            )
        })
        .collect();
    bench.create(pods, "one pod per tenant").await?;
    bench
        .wait_bound(t, |_| true, deadline, "first pods bound")
        .await
}

/// `tenants`, in two phases.
///
/// 1. *Flood* (on `--nodes`): tenant-0 creates `--pods` pods at once while every other
///    tenant submits `--rate` pods per second for `--duration` seconds; measured: how long
///    the others' pods wait (created → bound) and the throughput. Size the flood to fit
///    (`--nodes` × 40 pods): a full shard is phase 2's subject.
/// 2. *Saturation* (on a fresh shard of `--share-nodes`): the shard is filled with pods of a
///    namespace no tenant owns, every tenant queues twice its weight's part of the shard,
///    then the filling pods complete (are deleted). The scheduler refills the shard from the
///    backlogs; measured: each tenant's part of the full shard against its weight's part.
async fn run_tenants(
    bench: &Bench,
    args: &SchedulerBenchArgs,
    dir: &std::path::Path,
) -> anyhow::Result<Report> {
    let deadline = Instant::now() + Duration::from_secs(args.timeout);
    let t = args.tenants.max(2);
    make_tenants(bench, t, deadline).await?;
    let conflicts_before = bench.conflicts();
    let memo_before = bench.memo();

    // Phase 1: the flood and the steady others.
    let flood: Vec<Value> = (0..args.pods)
        .map(|i| {
            pod(
                "tenant-0",
                &format!("f-{i}"),
                "flood",
                "100m",
                Workload::Basic,
            )
        })
        .collect();
    let others_total = ((t - 1) as f64 * args.rate * args.duration as f64).round() as usize;
    let started = Instant::now();
    let steady = async {
        let every = Duration::from_secs_f64(1.0 / (args.rate * (t - 1) as f64).max(1e-3));
        let mut tick = tokio::time::interval(every);
        let mut creates = futures::stream::FuturesUnordered::new();
        for k in 0..others_total {
            tick.tick().await;
            let i = 1 + k % (t - 1);
            let p = pod(
                &format!("tenant-{i}"),
                &format!("s-{k}"),
                "steady",
                "100m",
                Workload::Basic,
            );
            let client = bench.client.clone();
            creates.push(async move {
                let ns = p["metadata"]["namespace"].as_str().unwrap_or("").to_owned();
                client.create(pods_res(), Some(&ns), &p).await
            });
            while let Some(r) = futures::FutureExt::now_or_never(creates.next()).flatten() {
                r.map_err(|e| anyhow::anyhow!("creating a pod: {}", e.message))?;
            }
        }
        while let Some(r) = creates.next().await {
            r.map_err(|e| anyhow::anyhow!("creating a pod: {}", e.message))?;
        }
        anyhow::Ok(())
    };
    let (f, s) = tokio::join!(bench.create(flood, "creating the flood"), steady);
    f?;
    s?;
    bench
        .wait_bound(
            args.pods + others_total + t,
            |_| true,
            deadline,
            "flood and steady pods bound",
        )
        .await?;
    let (seconds, placed, mut others_wait) = {
        let s = bench.seen.lock();
        let mut lat = Latencies::with_capacity(others_total);
        let mut placed = 0;
        let mut last = started;
        for e in s.values() {
            let (Some(a), Some(b)) = (e.added, e.bound) else {
                continue;
            };
            if a < started {
                continue;
            }
            last = last.max(b);
            placed += 1;
            if e.ns != "tenant-0" {
                lat.record(b - a);
            }
        }
        ((last - started).as_secs_f64(), placed, lat)
    };
    let conflicts = bench.conflicts() - conflicts_before;
    let memo_reuse_pct = reuse_pct(memo_before, bench.memo());

    // Phase 2, on a fresh shard: full, backlogs by weight, completions, refill.
    let share = Bench::start(args.share_nodes, (0, 0), &dir.join("share"), args.workers).await?;
    make_tenants(&share, t, deadline).await?;
    let capacity = args.share_nodes * 40;
    share.namespace("filler").await?;
    let fill = (0..capacity - t)
        .map(|i| {
            pod(
                "filler",
                &format!("x-{i}"),
                "filler",
                "100m",
                Workload::Basic,
            )
        })
        .collect();
    share.create(fill, "filling the shard").await?;
    share
        .wait_bound(capacity, |_| true, deadline, "shard full")
        .await?;
    let total_weight: usize = (0..t).map(weight).sum();
    let mut backlog = Vec::new();
    for i in 0..t {
        let part = capacity * weight(i) / total_weight;
        for j in 0..2 * part + 1 {
            backlog.push(pod(
                &format!("tenant-{i}"),
                &format!("b-{j}"),
                "backlog",
                "100m",
                Workload::Basic,
            ));
        }
    }
    share.create(backlog, "queueing the backlogs").await?;
    let mut req = ApiRequest::new(Verb::DeleteCollection, pods_res());
    req.namespace = Some("filler".into());
    req.params.grace_period_seconds = Some(0);
    share.client.call(req).await.map_err(err)?;
    share
        .wait_bound(capacity, |ns| ns != "filler", deadline, "shard refilled")
        .await?;
    share.wait_quiet(Duration::from_secs(2), deadline).await;
    let mut errors = Vec::with_capacity(t);
    for i in 0..t {
        let ns = format!("tenant-{i}");
        let got = share.bound_in(|n| n == ns) as f64;
        let want = capacity as f64 * weight(i) as f64 / total_weight as f64;
        tracing::debug!(tenant = %ns, weight = weight(i), got, want, "part of the full shard");
        errors.push((got - want).abs() / want * 100.0);
    }
    let max = errors.iter().copied().fold(0.0, f64::max);
    let mean = errors.iter().sum::<f64>() / errors.len() as f64;
    Ok(Report {
        workload: "tenants".into(),
        nodes: args.nodes,
        init_pods: t,
        pods: args.pods + others_total,
        workers: workers_of(args)?,
        seconds,
        pods_per_sec: placed as f64 / seconds.max(1e-9),
        schedule_p50_ms: others_wait.percentile_ms(50.0),
        schedule_p99_ms: others_wait.percentile_ms(99.0),
        conflicts,
        memo_reuse_pct,
        attempt_mean_us: bench.attempt_mean_us(),
        cycle_cpu_us: bench.cycle_cpu_us(),
        checked: None,
        tenants: Some(TenantsReport {
            tenants: t,
            others_pods: others_total,
            others_wait_p50_ms: others_wait.percentile_ms(50.0),
            others_wait_p99_ms: others_wait.percentile_ms(99.0),
            capacity,
            share_error_max_pct: max,
            share_error_mean_pct: mean,
        }),
    })
}

/// The scheduling workers `--workers` asks for (checked before anything starts).
fn workers_of(args: &SchedulerBenchArgs) -> anyhow::Result<usize> {
    if let Some(w) = args.workers
        && !(1..=tessera_scheduler::config::MAX_PARALLELISM).contains(&w)
    {
        anyhow::bail!(
            "--workers {w}: must be between 1 and {}",
            tessera_scheduler::config::MAX_PARALLELISM
        );
    }
    Ok(SchedulerConfig {
        parallelism: args.workers,
        ..SchedulerConfig::default()
    }
    .workers())
}

/// The percentage of filter walks' nodes judged by a remembered result between two
/// readings of `(reused, judged)`.
fn reuse_pct(before: (u64, u64), after: (u64, u64)) -> f64 {
    let reused = after.0 - before.0;
    let judged = after.1 - before.1;
    if reused + judged == 0 {
        return 0.0;
    }
    reused as f64 * 100.0 / (reused + judged) as f64
}
