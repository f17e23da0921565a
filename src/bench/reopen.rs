//! `tessera bench reopen`: how long the embedded store takes to open a directory holding N
//! keys (newest snapshot plus the log after it), stated as seconds per million keys.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use bytes::Bytes;
use clap::Args;
use serde::Serialize;
use tessera_store::{EmbeddedOptions, EmbeddedStore, Op, Store, StoreMetrics};

/// Flags of `bench reopen`.
#[derive(Args, Debug)]
pub struct ReopenBenchArgs {
    /// Keys to write before reopening.
    #[arg(long, default_value_t = 1_000_000)]
    pub keys: usize,
    /// Value size in bytes.
    #[arg(long, default_value_t = 256)]
    pub value_size: usize,
    /// Where the store's directory is made.
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize)]
struct ReopenResult {
    keys: usize,
    value_bytes: usize,
    disk_bytes: u64,
    reopen_seconds: f64,
    seconds_per_million_keys: f64,
}

fn dir_size(dir: &std::path::Path) -> std::io::Result<u64> {
    let mut total = 0;
    for e in std::fs::read_dir(dir)? {
        total += e?.metadata()?.len();
    }
    Ok(total)
}

/// Writes the keys, closes the store, and times opening it again.
pub async fn run(args: ReopenBenchArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.keys > 0, "--keys must be positive");
    let parent = args.data_dir.clone().unwrap_or_else(std::env::temp_dir);
    std::fs::create_dir_all(&parent)?;
    let dir = tempfile::Builder::new()
        .prefix("tessera-reopen-")
        .tempdir_in(&parent)?;
    let store = EmbeddedStore::open(
        dir.path(),
        EmbeddedOptions::default(),
        StoreMetrics::detached(),
    )
    .await?;
    let bar = super::progress_bar(args.keys as u64, "writing".into());
    let value = Bytes::from(vec![b'v'; args.value_size]);
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let store = store.clone();
        let next = next.clone();
        let value = value.clone();
        let bar = bar.clone();
        let keys = args.keys;
        tasks.push(tokio::spawn(async move {
            loop {
                let start = next.fetch_add(128, Ordering::Relaxed);
                if start >= keys {
                    return Ok::<_, anyhow::Error>(());
                }
                let ops = (start..(start + 128).min(keys))
                    .map(|i| Op::Put {
                        key: Bytes::from(format!("/registry/pods/ns{}/pod-{i:09}", i % 1000)),
                        value: value.clone(),
                        lease: 0,
                    })
                    .collect();
                store.txn(ops).await?;
                bar.inc(128);
            }
        }));
    }
    for t in tasks {
        t.await??;
    }
    bar.finish_and_clear();
    store.close().await?;
    drop(store);
    let disk_bytes = dir_size(dir.path())?;

    let started = Instant::now();
    let reopened = EmbeddedStore::open(
        dir.path(),
        EmbeddedOptions::default(),
        StoreMetrics::detached(),
    )
    .await?;
    let secs = started.elapsed().as_secs_f64();
    anyhow::ensure!(
        reopened.len() == args.keys,
        "reopened store has {} keys, expected {}",
        reopened.len(),
        args.keys
    );
    let result = ReopenResult {
        keys: args.keys,
        value_bytes: args.value_size,
        disk_bytes,
        reopen_seconds: (secs * 1000.0).round() / 1000.0,
        seconds_per_million_keys: (secs / args.keys as f64 * 1e6 * 1000.0).round() / 1000.0,
    };
    if args.json {
        println!("{}", serde_json::to_string(&result)?);
    } else {
        println!(
            "reopened {} keys ({:.0} MiB on disk) in {:.3} s: {:.3} s per million keys",
            result.keys,
            disk_bytes as f64 / (1 << 20) as f64,
            result.reopen_seconds,
            result.seconds_per_million_keys
        );
    }
    reopened.close().await?;
    Ok(())
}
