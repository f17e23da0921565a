//! `tessera bench watch`: watch fan-out. W watches on one prefix while writers create E keys;
//! measures how fast every watch receives every event and the delay from a write's
//! acknowledgement to its delivery.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Args;
use futures::StreamExt;
use serde::Serialize;

use super::latency::Latencies;
use super::target::{BenchBackend, Target};

/// Flags of `bench watch`.
#[derive(Args, Debug)]
pub struct WatchBenchArgs {
    /// Backend to measure.
    #[arg(long, value_enum, default_value = "embedded")]
    pub backend: BenchBackend,
    /// etcd to measure; without it an etcd process is started on loopback for the run.
    #[arg(long)]
    pub etcd_servers: Option<String>,
    /// Watches on the prefix; a comma-separated list runs each level in turn.
    #[arg(long, default_value = "1,100,1000", value_delimiter = ',')]
    pub watchers: Vec<usize>,
    /// Keys created while the watches run.
    #[arg(long, default_value_t = 20_000)]
    pub events: usize,
    /// Concurrent writers.
    #[arg(long, default_value_t = 16)]
    pub writers: usize,
    /// Print one JSON object per level instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize)]
struct WatchBenchResult {
    backend: &'static str,
    watchers: usize,
    events: usize,
    writes_per_sec: f64,
    deliveries_per_sec: f64,
    delivery_p50_ms: f64,
    delivery_p99_ms: f64,
}

/// Runs the benchmark.
pub async fn run(args: WatchBenchArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.events > 0 && args.writers > 0,
        "--events and --writers must be positive"
    );
    let target = Target::new(args.backend, args.etcd_servers.as_deref(), None).await?;
    for (level, &watchers) in args.watchers.iter().enumerate() {
        anyhow::ensure!(watchers > 0, "--watchers levels must be positive");
        let bench = target.open().await?;
        let store = bench.store.clone();
        let prefix = Bytes::from(format!("/registry/watchbench{level}/"));
        let clock = Instant::now();
        let bar = super::progress_bar(
            (watchers * args.events) as u64,
            format!("deliveries w={watchers}"),
        );
        let mut readers = Vec::with_capacity(watchers);
        for _ in 0..watchers {
            let mut stream = store.watch(&prefix, None).await?;
            let events = args.events;
            let bar = bar.clone();
            readers.push(tokio::spawn(async move {
                let mut lat = Latencies::with_capacity(events);
                let mut seen = 0;
                while seen < events {
                    let batch = tokio::time::timeout(Duration::from_secs(120), stream.next())
                        .await
                        .map_err(|_| anyhow::anyhow!("no event for 120 s"))?
                        .ok_or_else(|| anyhow::anyhow!("watch ended"))??;
                    let now = clock.elapsed();
                    for e in &batch.events {
                        // The value is the write's acknowledgement time, in µs since start.
                        let at: u64 = std::str::from_utf8(&e.kv.value)?.parse()?;
                        lat.record(now.saturating_sub(Duration::from_micros(at)));
                    }
                    seen += batch.events.len();
                    bar.inc(batch.events.len() as u64);
                }
                Ok::<_, anyhow::Error>(lat)
            }));
        }
        let started = Instant::now();
        let next = Arc::new(AtomicUsize::new(0));
        let mut writers = Vec::new();
        for _ in 0..args.writers {
            let store = store.clone();
            let next = next.clone();
            let prefix = prefix.clone();
            let events = args.events;
            writers.push(tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= events {
                        return Ok::<_, anyhow::Error>(());
                    }
                    let key = Bytes::from(format!(
                        "{}ns{}/k{i:09}",
                        String::from_utf8_lossy(&prefix),
                        i % 32
                    ));
                    // Written before the write is sent: delivery delay includes the write.
                    let at = clock.elapsed().as_micros().to_string();
                    store.create(key, Bytes::from(at)).await?;
                }
            }));
        }
        for w in writers {
            w.await??;
        }
        let write_secs = started.elapsed().as_secs_f64();
        let mut all = Latencies::with_capacity(watchers * args.events);
        for r in readers {
            all.extend(r.await??);
        }
        let secs = started.elapsed().as_secs_f64();
        bar.finish_and_clear();
        let r = WatchBenchResult {
            backend: store.backend(),
            watchers,
            events: args.events,
            writes_per_sec: (args.events as f64 / write_secs).round(),
            deliveries_per_sec: ((watchers * args.events) as f64 / secs).round(),
            delivery_p50_ms: all.percentile_ms(50.0),
            delivery_p99_ms: all.percentile_ms(99.0),
        };
        if args.json {
            println!("{}", serde_json::to_string(&r)?);
        } else {
            println!(
                "{:<9} watchers {:>5}: {:>9.0} writes/s, {:>10.0} deliveries/s, delivery p50 {:.3} ms p99 {:.3} ms",
                r.backend,
                r.watchers,
                r.writes_per_sec,
                r.deliveries_per_sec,
                r.delivery_p50_ms,
                r.delivery_p99_ms
            );
        }
    }
    Ok(())
}
