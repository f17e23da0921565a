//! `tessera bench offers`: one shard in this process serving offers (`tessera up
//! --offers-addr`), and F example frameworks (the batch runner, in-process, over real gRPC
//! with TLS) with DRF weights 1, 2, 3, … each given work in proportion to its weight and more
//! than the nodes hold. Reported: offers made per second, accept → task pod bound (p50/p99,
//! from the service's histogram as Prometheus' `histogram_quantile` reads it), and how far
//! each framework's share of the running tasks' cpu strays from its weight's share while all
//! of them still have work (the DRF error).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Args, Parser};
use k8s_openapi::api::core::v1::Pod;
use parking_lot::Mutex;
use serde::Serialize;
use tessera_apiserver::request::find_resource;
use tessera_offers::batch::{self, BatchConfig, BatchTask};

use crate::up::UpAllArgs;

/// Flags of `bench offers`.
#[derive(Args, Debug)]
pub struct OffersBenchArgs {
    /// Frameworks, with weights 1, 2, … F (unless `--weights`).
    #[arg(long, default_value_t = 2)]
    pub frameworks: usize,
    /// The frameworks' weights, comma separated (`1,3`); overrides `--frameworks`.
    #[arg(long, value_delimiter = ',')]
    pub weights: Vec<f64>,
    /// Simulated nodes (4 cpu, 16 GiB each), per shard.
    #[arg(long, default_value_t = 50)]
    pub nodes: usize,
    /// 0: one shard serves the offers. N: a federation of N shards serves them, offering
    /// every shard's nodes by DRF over the whole fleet.
    #[arg(long, default_value_t = 0)]
    pub shards: usize,
    /// Seconds each task runs.
    #[arg(long, default_value_t = 2)]
    pub task_seconds: u64,
    /// Waves of tasks: each framework gets enough tasks to fill its share of the nodes this
    /// many times.
    #[arg(long, default_value_t = 6)]
    pub waves: usize,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Parser)]
struct Up {
    #[command(flatten)]
    all: UpAllArgs,
}

#[derive(Serialize)]
struct Result {
    frameworks: usize,
    shards: usize,
    nodes: usize,
    tasks: usize,
    seconds: f64,
    offers: u64,
    offers_per_sec: f64,
    accepted: u64,
    tasks_per_sec: f64,
    accept_to_bound_p50_ms: f64,
    accept_to_bound_p99_ms: f64,
    /// Per framework (by weight): its mean share of the frameworks' running cpu at
    /// saturation, and the share its weight gives.
    shares: Vec<(f64, f64, f64)>,
    /// The largest |share − weight's share|, in share points.
    drf_error: f64,
    saturated_samples: usize,
}

/// The `q` quantile of a Prometheus histogram (cumulative buckets), interpolated within
/// its bucket as `histogram_quantile` does.
fn quantile(h: &prometheus::proto::Histogram, q: f64) -> f64 {
    let total = h.get_sample_count() as f64;
    if total == 0.0 {
        return 0.0;
    }
    let rank = q * total;
    let (mut lower, mut below) = (0.0, 0.0);
    for b in h.get_bucket() {
        let (upper, count) = (b.upper_bound(), b.cumulative_count() as f64);
        if count >= rank {
            let inside = count - below;
            return if inside == 0.0 {
                upper
            } else {
                lower + (upper - lower) * (rank - below) / inside
            };
        }
        (lower, below) = (upper, count);
    }
    lower
}

/// What serves the offers: one shard (and its nodes' tasks), or a federation of shards.
enum Served {
    One {
        shard: crate::up::Shard,
        _workers: Vec<tokio::task::JoinHandle<()>>,
    },
    Fleet(crate::up::Fleet),
}

/// Histograms of the same buckets added up.
fn merged(hs: &[prometheus::proto::Histogram]) -> prometheus::proto::Histogram {
    let mut out = hs.first().cloned().unwrap_or_default();
    for h in hs.iter().skip(1) {
        out.set_sample_count(out.get_sample_count() + h.get_sample_count());
        out.set_sample_sum(out.get_sample_sum() + h.get_sample_sum());
        let mut buckets = out.get_bucket().to_vec();
        for (b, add) in buckets.iter_mut().zip(h.get_bucket()) {
            b.set_cumulative_count(b.cumulative_count() + add.cumulative_count());
        }
        out.set_bucket(buckets);
    }
    out
}

/// Runs the benchmark.
pub async fn run(args: OffersBenchArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.frameworks >= 1, "--frameworks must be at least 1");
    anyhow::ensure!(
        args.weights.iter().all(|w| w.is_finite() && *w > 0.0),
        "--weights must all be positive numbers"
    );
    anyhow::ensure!(args.nodes >= 1, "--nodes must be at least 1");
    let dir = tempfile::tempdir()?;
    let all = Up::try_parse_from([
        "up".to_owned(),
        format!("--data-dir={}", dir.path().display()),
        "--api-addr=127.0.0.1:0".into(),
        "--metrics-addr=127.0.0.1:0".into(),
        "--grpc-addr=127.0.0.1:0".into(),
        format!("--shards={}", args.shards),
        format!("--nodes-per-shard={}", args.nodes),
        "--node-cpu=4".into(),
        "--node-memory=16Gi".into(),
        "--startup-delay-ms=0".into(),
        "--offers-addr=127.0.0.1:0".into(),
    ])?
    .all;
    // Where frameworks subscribe, the API their namespace is made in, the shards whose
    // pods and histograms are read, and the registry the offers made are counted in.
    let (served, addr) = if args.shards == 0 {
        let shard = crate::up::start(&all.base).await?;
        let workers =
            crate::up::start_workers(&shard, &all.workers, dir.path(), "node", "").await?;
        let addr =
            crate::offers::serve(&shard, "127.0.0.1:0".parse()?, &all.base.pki_dir()).await?;
        let served = Served::One {
            shard,
            _workers: workers,
        };
        (served, addr)
    } else {
        let fleet = crate::up::start_federated(&all).await?;
        let addr = fleet
            .federation
            .offers
            .ok_or_else(|| anyhow::anyhow!("the federation serves no offers"))?;
        (Served::Fleet(fleet), addr)
    };
    let (api, shards): (&crate::up::Shard, Vec<&crate::up::Shard>) = match &served {
        Served::One { shard, .. } => (shard, vec![shard]),
        Served::Fleet(f) => (&f.federation.api, f.shards.iter().map(|(_, s)| s).collect()),
    };
    let counted = &api.registry;
    let client = api.component_client("bench");
    let namespaces =
        find_resource("", "v1", "namespaces").map_err(|e| anyhow::anyhow!("{}", e.message))?;
    client
        .create(
            namespaces,
            None,
            &serde_json::json!({"metadata": {"name": "bench"}}),
        )
        .await
        .map_err(|e| anyhow::anyhow!("{}", e.message))?;
    // Frameworks run as the admin here (tenancy is what tests/offers.rs checks).
    let token =
        tessera_apiserver::pki::Credentials::load_or_create(&dir.path().join("pki"))?.admin_token;
    let ca_pem = api.ca_pem.clone();
    let weights: Vec<f64> = if args.weights.is_empty() {
        (1..=args.frameworks).map(|w| w as f64).collect()
    } else {
        args.weights.clone()
    };
    let frameworks = weights.len();
    let sum_w: f64 = weights.iter().sum();
    let total_cpu = 4 * args.nodes * args.shards.max(1);
    // Tasks of 1 cpu: each framework's share of the nodes, `waves` times over.
    let mut total_tasks = 0;
    let mut runs = Vec::new();
    let done_first: Arc<Mutex<Option<Instant>>> = Arc::new(Mutex::new(None));
    let bar = super::progress_bar(0, "tasks done".into());
    let started = Instant::now();
    for (i, w) in weights.iter().enumerate() {
        let n = ((total_cpu as f64 * w / sum_w).ceil() as usize * args.waves).max(1);
        total_tasks += n;
        let tasks: Vec<BatchTask> = (0..n)
            .map(|j| BatchTask {
                name: format!("t{j}"),
                cpu_milli: 1000,
                memory: 256 << 20,
                seconds: args.task_seconds,
            })
            .collect();
        let cfg = BatchConfig {
            endpoint: format!("https://{addr}"),
            ca_pem: ca_pem.clone(),
            token: token.clone(),
            name: format!("fw{i}"),
            role: String::new(),
            weight: *w,
            namespace: "bench".into(),
            image: "busybox".into(),
            failover_timeout_seconds: 0,
            node_selector: Default::default(),
        };
        let (bar, done_first) = (bar.clone(), done_first.clone());
        runs.push(tokio::spawn(async move {
            let r = batch::run(&cfg, tasks, |p| {
                if let batch::Progress::Task(u) = p
                    && u.state >= tessera_proto::offers::v1::TaskState::TaskFinished as i32
                {
                    bar.inc(1);
                }
            })
            .await;
            done_first.lock().get_or_insert_with(Instant::now);
            r
        }));
    }
    bar.set_length(total_tasks as u64);
    // Shares at saturation: sampled from the shards' pods until the first framework is done.
    let pods_res = find_resource("", "v1", "pods").map_err(|e| anyhow::anyhow!("{}", e.message))?;
    let pods: Vec<_> = shards
        .iter()
        .map(|s| s.informers.get::<Pod>(pods_res))
        .collect();
    let mut samples: Vec<Vec<f64>> = Vec::new();
    while done_first.lock().is_none() {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let mut by_fw: BTreeMap<usize, f64> = BTreeMap::new();
        for p in pods.iter().flat_map(|i| i.cache().list()) {
            let running = p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
            let fw = p
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(tessera_offers::service::FRAMEWORK_LABEL))
                .and_then(|id| id.strip_prefix("fw"))
                .and_then(|rest| rest.split('-').next())
                .and_then(|i| i.parse::<usize>().ok());
            if let (true, Some(i)) = (running, fw) {
                *by_fw.entry(i).or_default() += 1.0;
            }
        }
        let running: f64 = by_fw.values().sum();
        // Saturated: the frameworks run at least 80% of the nodes' cpu.
        if running >= 0.8 * total_cpu as f64 {
            samples.push(
                (0..frameworks)
                    .map(|i| by_fw.get(&i).copied().unwrap_or(0.0) / running)
                    .collect(),
            );
        }
    }
    for r in runs {
        let report = r.await?.map_err(|e| anyhow::anyhow!("{e}"))?;
        anyhow::ensure!(
            report.failed.is_empty(),
            "framework {}: {} task(s) failed: {:?}",
            report.framework_id,
            report.failed.len(),
            report.failed.first()
        );
    }
    let seconds = started.elapsed().as_secs_f64();
    bar.finish_and_clear();
    let families = counted.gather();
    let counter = |name: &str| {
        families
            .iter()
            .find(|f| f.name() == name)
            .and_then(|f| f.get_metric().first().map(|m| m.get_counter().get_value()))
            .unwrap_or(0.0) as u64
    };
    // Accept → bound is timed in each shard: their histograms, added up bucket by bucket.
    let hists: Vec<prometheus::proto::Histogram> = shards
        .iter()
        .filter_map(|s| {
            s.registry
                .gather()
                .into_iter()
                .find(|f| f.name() == "tessera_offers_accept_to_bound_seconds")
                .and_then(|f| f.get_metric().first().map(|m| m.get_histogram().clone()))
        })
        .collect();
    let hist = merged(&hists);
    let shares: Vec<(f64, f64, f64)> = weights
        .iter()
        .enumerate()
        .map(|(i, w)| {
            let mean = if samples.is_empty() {
                0.0
            } else {
                samples.iter().map(|s| s[i]).sum::<f64>() / samples.len() as f64
            };
            (*w, mean, w / sum_w)
        })
        .collect();
    let drf_error = shares
        .iter()
        .map(|(_, got, want)| (got - want).abs())
        .fold(0.0, f64::max);
    let offers = counter("tessera_offers_made_total");
    let accepted = counter("tessera_offers_accepted_total");
    let result = Result {
        frameworks,
        shards: args.shards,
        nodes: args.nodes,
        tasks: total_tasks,
        seconds,
        offers,
        offers_per_sec: offers as f64 / seconds,
        accepted,
        tasks_per_sec: total_tasks as f64 / seconds,
        accept_to_bound_p50_ms: quantile(&hist, 0.5) * 1000.0,
        accept_to_bound_p99_ms: quantile(&hist, 0.99) * 1000.0,
        shares,
        drf_error,
        saturated_samples: samples.len(),
    };
    if args.json {
        println!("{}", serde_json::to_string(&result)?);
    } else {
        println!(
            "{} frameworks, {} shard(s) of {} nodes, {} tasks in {:.1}s: {:.0} offers/s ({} offers, {} accepted), {:.0} tasks/s",
            result.frameworks,
            result.shards.max(1),
            result.nodes,
            result.tasks,
            result.seconds,
            result.offers_per_sec,
            result.offers,
            result.accepted,
            result.tasks_per_sec
        );
        println!(
            "accept → bound: p50 {:.1} ms, p99 {:.1} ms",
            result.accept_to_bound_p50_ms, result.accept_to_bound_p99_ms
        );
        for (w, got, want) in &result.shares {
            println!("weight {w}: share {got:.3} (DRF: {want:.3})");
        }
        println!(
            "DRF error: {:.3} share points over {} saturated samples",
            result.drf_error, result.saturated_samples
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_read_from_buckets_as_prometheus_does() {
        let h = prometheus::Histogram::with_opts(
            prometheus::HistogramOpts::new("h", "h").buckets(vec![0.1, 0.2, 0.4]),
        )
        .expect("histogram");
        for v in [0.05, 0.15, 0.15, 0.3] {
            h.observe(v);
        }
        let m = prometheus::core::Collector::collect(&h)[0].get_metric()[0]
            .get_histogram()
            .clone();
        // Rank 2 of 4 falls in (0.1, 0.2] holding 2: halfway.
        assert!((quantile(&m, 0.5) - 0.15).abs() < 1e-9);
        // Rank 3.96 falls in (0.2, 0.4] holding 1.
        assert!((quantile(&m, 0.99) - (0.2 + 0.2 * 0.96)).abs() < 1e-9);
        assert_eq!(quantile(&prometheus::proto::Histogram::default(), 0.5), 0.0);
    }
}
