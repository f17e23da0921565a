//! `tessera bench store`: durable write and read throughput of a store backend at several
//! concurrencies, and — for etcd — a plain `etcd-client` put loop against the same etcd in
//! the same run, so the ratio shows the backend's own overhead.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use bytes::Bytes;
use clap::Args;
use etcd_client::{Compare, CompareOp, Txn, TxnOp};
use serde::Serialize;
use tessera_store::{EtcdOptions, EtcdStore, StoreMetrics};

use super::latency::Latencies;
use super::target::{BenchBackend, Target};

/// Flags of `bench store`.
#[derive(Args, Debug)]
pub struct StoreBenchArgs {
    /// Backend to measure.
    #[arg(long, value_enum, default_value = "embedded")]
    pub backend: BenchBackend,
    /// etcd to measure; without it an etcd process is started on loopback for the run.
    #[arg(long)]
    pub etcd_servers: Option<String>,
    /// Writes (and as many reads) per concurrency level.
    #[arg(long, default_value_t = 100_000)]
    pub ops: usize,
    /// Concurrent clients; a comma-separated list runs each level in turn.
    #[arg(long, default_value = "1,16,256", value_delimiter = ',')]
    pub concurrency: Vec<usize>,
    /// Value size in bytes.
    #[arg(long, default_value_t = 256)]
    pub value_size: usize,
    /// Where the embedded store's directory is made (a fresh one per level).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Skip the plain etcd-client loop.
    #[arg(long)]
    pub no_plain: bool,
    /// Print one JSON object per level instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// The result of one concurrency level.
#[derive(Serialize, Debug)]
pub struct StoreBenchResult {
    backend: &'static str,
    concurrency: usize,
    ops: usize,
    value_bytes: usize,
    write_ops_per_sec: f64,
    write_p50_ms: f64,
    write_p99_ms: f64,
    write_max_ms: f64,
    read_ops_per_sec: f64,
    read_p50_ms: f64,
    read_p99_ms: f64,
    /// A plain etcd-client put loop against the same etcd (etcd only).
    plain_put_ops_per_sec: Option<f64>,
    plain_put_p99_ms: Option<f64>,
    /// write_ops_per_sec / plain_put_ops_per_sec.
    ratio_to_plain: Option<f64>,
    /// A plain etcd-client loop of put-if-absent transactions (what a create is in etcd).
    plain_txn_ops_per_sec: Option<f64>,
    /// write_ops_per_sec / plain_txn_ops_per_sec: the backend's own overhead.
    ratio_to_plain_txn: Option<f64>,
}

/// A plain etcd-client loop against the same etcd: blind puts, or put-if-absent transactions.
async fn plain_loop(
    urls: &[String],
    level: usize,
    args: &StoreBenchArgs,
    concurrency: usize,
    value: &Bytes,
    txn: bool,
) -> anyhow::Result<(f64, f64)> {
    let client = EtcdStore::connect(EtcdOptions::new(urls.to_vec()), StoreMetrics::detached())
        .await?
        .client();
    let value = value.clone();
    let what = if txn { "txn" } else { "put" };
    let (rate, mut lat) = drive(
        &format!("plain etcd-client {what} c={concurrency}"),
        args.ops,
        concurrency,
        move |i| {
            let mut kv = client.kv_client();
            let value = value.clone();
            async move {
                let k = format!("/plain-{what}/{level}/{i:012}");
                if txn {
                    // What a Kubernetes create is in etcd: put if absent.
                    let txn = Txn::new()
                        .when([Compare::create_revision(k.clone(), CompareOp::Equal, 0)])
                        .and_then([TxnOp::put(k.clone(), value.to_vec(), None)])
                        .or_else([TxnOp::get(k, None)]);
                    kv.txn(txn).await?;
                } else {
                    kv.put(k, value.to_vec(), None).await?;
                }
                Ok(())
            }
        },
    )
    .await?;
    Ok((rate, lat.percentile_ms(99.0)))
}

/// Runs `ops` calls of `op(i)` from `concurrency` tasks; returns ops/s and latencies.
async fn drive<F, Fut>(
    label: &str,
    ops: usize,
    concurrency: usize,
    op: F,
) -> anyhow::Result<(f64, Latencies)>
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = anyhow::Result<()>> + Send,
{
    let bar = super::progress_bar(ops as u64, label.to_owned());
    let next = Arc::new(AtomicUsize::new(0));
    let op = Arc::new(op);
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(concurrency);
    for _ in 0..concurrency {
        let next = next.clone();
        let op = op.clone();
        let bar = bar.clone();
        tasks.push(tokio::spawn(async move {
            let mut lat = Latencies::with_capacity(ops / concurrency + 1);
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= ops {
                    return Ok::<_, anyhow::Error>(lat);
                }
                let t = Instant::now();
                op(i).await?;
                lat.record(t.elapsed());
                if i.is_multiple_of(256) {
                    bar.set_position(i as u64);
                }
            }
        }));
    }
    let mut all = Latencies::with_capacity(ops);
    for t in tasks {
        all.extend(t.await??);
    }
    let secs = started.elapsed().as_secs_f64();
    bar.finish_and_clear();
    Ok((ops as f64 / secs, all))
}

fn key(i: usize) -> Bytes {
    Bytes::from(format!("/registry/bench/ns{}/obj-{i:012}", i % 64))
}

/// Runs the benchmark and prints its results.
pub async fn run(args: StoreBenchArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.ops > 0, "--ops must be positive");
    anyhow::ensure!(
        args.concurrency.iter().all(|c| *c > 0),
        "--concurrency levels must be positive"
    );
    let target = Target::new(
        args.backend,
        args.etcd_servers.as_deref(),
        args.data_dir.clone(),
    )
    .await?;
    let value = Bytes::from(vec![b'v'; args.value_size]);
    let mut results = Vec::new();
    for (level, &concurrency) in args.concurrency.iter().enumerate() {
        let bench = target.open().await?;
        let store = bench.store.clone();
        // Each level writes its own keys, so levels do not collide on one etcd.
        let base = level * args.ops;
        let (write_rate, mut wlat) = {
            let store = store.clone();
            let value = value.clone();
            drive(
                &format!("{} write c={concurrency}", store.backend()),
                args.ops,
                concurrency,
                move |i| {
                    let store = store.clone();
                    let value = value.clone();
                    async move {
                        store.create(key(base + i), value).await?;
                        Ok(())
                    }
                },
            )
            .await?
        };
        let (read_rate, mut rlat) = {
            let store = store.clone();
            let n = args.ops;
            drive(
                &format!("{} read c={concurrency}", store.backend()),
                args.ops,
                concurrency,
                move |i| {
                    let store = store.clone();
                    async move {
                        // A spread of keys written above.
                        let k = key(base + (i.wrapping_mul(7919) % n));
                        store
                            .get(&k)
                            .await?
                            .context("a key written by this run is missing")?;
                        Ok(())
                    }
                },
            )
            .await?
        };
        let mut plain = None;
        let mut plain_txn = None;
        if args.backend == BenchBackend::Etcd && !args.no_plain {
            plain = Some(
                plain_loop(target.etcd_urls(), level, &args, concurrency, &value, false).await?,
            );
            plain_txn = Some(
                plain_loop(target.etcd_urls(), level, &args, concurrency, &value, true).await?,
            );
        }
        let r = StoreBenchResult {
            backend: store.backend(),
            concurrency,
            ops: args.ops,
            value_bytes: args.value_size,
            write_ops_per_sec: write_rate.round(),
            write_p50_ms: wlat.percentile_ms(50.0),
            write_p99_ms: wlat.percentile_ms(99.0),
            write_max_ms: wlat.percentile_ms(100.0),
            read_ops_per_sec: read_rate.round(),
            read_p50_ms: rlat.percentile_ms(50.0),
            read_p99_ms: rlat.percentile_ms(99.0),
            plain_put_ops_per_sec: plain.map(|p| p.0.round()),
            plain_put_p99_ms: plain.map(|p| p.1),
            ratio_to_plain: plain.map(|p| (write_rate / p.0 * 100.0).round() / 100.0),
            plain_txn_ops_per_sec: plain_txn.map(|p| p.0.round()),
            ratio_to_plain_txn: plain_txn.map(|p| (write_rate / p.0 * 100.0).round() / 100.0),
        };
        if args.json {
            println!("{}", serde_json::to_string(&r)?);
        }
        results.push(r);
        // Let the next level start from a quiet store.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    if !args.json {
        print_table(&results);
    }
    Ok(())
}

fn print_table(results: &[StoreBenchResult]) {
    println!(
        "{:<9} {:>5} {:>10} {:>9} {:>9} {:>10} {:>9} {:>9} {:>11} {:>6} {:>11} {:>6}",
        "backend",
        "conc",
        "writes/s",
        "w p50 ms",
        "w p99 ms",
        "reads/s",
        "r p50 ms",
        "r p99 ms",
        "plain put/s",
        "ratio",
        "plain txn/s",
        "ratio"
    );
    for r in results {
        println!(
            "{:<9} {:>5} {:>10.0} {:>9.3} {:>9.3} {:>9.3} {:>10.0} {:>9.3} {:>9.3} {:>11} {:>6} {:>11} {:>6}",
            r.backend,
            r.concurrency,
            r.write_ops_per_sec,
            r.write_p50_ms,
            r.write_p99_ms,
            r.write_max_ms,
            r.read_ops_per_sec,
            r.read_p50_ms,
            r.read_p99_ms,
            r.plain_put_ops_per_sec
                .map_or("-".to_owned(), |v| format!("{v:.0}")),
            r.ratio_to_plain
                .map_or("-".to_owned(), |v| format!("{v:.2}")),
            r.plain_txn_ops_per_sec
                .map_or("-".to_owned(), |v| format!("{v:.0}")),
            r.ratio_to_plain_txn
                .map_or("-".to_owned(), |v| format!("{v:.2}")),
        );
    }
}
