//! `tessera bench reopen`: how long the embedded store takes to open a directory holding N
//! keys (newest snapshot plus the log after it), stated as seconds per million keys; then
//! how long a backup of it takes while a writer goes on (and the longest that writer's
//! writes waited meanwhile: the capture holds the writer), and how long a store restored
//! from that backup takes to open.

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
    backup_seconds: f64,
    backup_bytes: u64,
    backup_mib_per_second: f64,
    /// The slowest write of a writer running during the backup, in milliseconds.
    slowest_write_during_backup_ms: f64,
    /// Restoring the backup into a new directory and opening it.
    restore_and_open_seconds: f64,
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
    // A backup while a writer goes on (its keys are outside the backed-up set's count).
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (store, stop, value) = (reopened.clone(), stop.clone(), value.clone());
        tokio::spawn(async move {
            let mut slowest = std::time::Duration::ZERO;
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let t = Instant::now();
                store
                    .put(
                        Bytes::from(format!("/registry/events/bench/e-{i}")),
                        value.clone(),
                    )
                    .await?;
                slowest = slowest.max(t.elapsed());
                i += 1;
            }
            anyhow::Ok(slowest)
        })
    };
    let backup_file = dir.path().join("bench.backup");
    let started = Instant::now();
    let info = reopened.backup(&backup_file).await?;
    let backup_secs = started.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let slowest = writer.await??;
    let restored = dir.path().join("restored");
    let started = Instant::now();
    tessera_store::embedded::restore_backup(&backup_file, &restored)?;
    let back = EmbeddedStore::open(
        &restored,
        EmbeddedOptions::default(),
        StoreMetrics::detached(),
    )
    .await?;
    let restore_secs = started.elapsed().as_secs_f64();
    anyhow::ensure!(
        back.len() == info.keys && info.keys >= args.keys,
        "the restored store has {} keys, the backup {} (of {} written before it)",
        back.len(),
        info.keys,
        args.keys
    );
    back.close().await?;
    let r3 = |x: f64| (x * 1000.0).round() / 1000.0;
    let result = ReopenResult {
        keys: args.keys,
        value_bytes: args.value_size,
        disk_bytes,
        reopen_seconds: r3(secs),
        seconds_per_million_keys: r3(secs / args.keys as f64 * 1e6),
        backup_seconds: r3(backup_secs),
        backup_bytes: info.bytes,
        backup_mib_per_second: r3(info.bytes as f64 / (1 << 20) as f64 / backup_secs),
        slowest_write_during_backup_ms: r3(slowest.as_secs_f64() * 1000.0),
        restore_and_open_seconds: r3(restore_secs),
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
        println!(
            "backup: {:.0} MiB in {:.3} s ({:.0} MiB/s), a concurrent writer's slowest write {:.1} ms; restore + open: {:.3} s",
            result.backup_bytes as f64 / (1 << 20) as f64,
            result.backup_seconds,
            result.backup_mib_per_second,
            result.slowest_write_during_backup_ms,
            result.restore_and_open_seconds
        );
    }
    reopened.close().await?;
    Ok(())
}
