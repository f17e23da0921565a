//! Hidden helper commands for tests: a store writer that reports every acknowledged write,
//! for the crash test that kills it.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use clap::{Args, Subcommand};
use tessera_store::{EmbeddedOptions, EmbeddedStore, Store, StoreMetrics};

/// Debug commands.
#[derive(Subcommand, Debug)]
pub enum DebugCommand {
    /// Open an embedded store, print `ready`, then write keys forever, printing
    /// `ack <n> <mod_revision>` after each acknowledged write.
    StoreWriter(WriterArgs),
}

/// Flags of `debug store-writer`.
#[derive(Args, Debug)]
pub struct WriterArgs {
    /// The embedded store's directory.
    #[arg(long)]
    pub data_dir: PathBuf,
    /// Concurrent writers.
    #[arg(long, default_value_t = 16)]
    pub concurrency: usize,
    /// First key number (so rounds do not overwrite each other).
    #[arg(long, default_value_t = 0)]
    pub start: u64,
    /// Log bytes between snapshots (small, so crashes land during snapshots too).
    #[arg(long, default_value_t = 256 << 10)]
    pub snapshot_bytes: u64,
}

/// Runs a debug command.
pub async fn run(cmd: DebugCommand) -> anyhow::Result<()> {
    match cmd {
        DebugCommand::StoreWriter(args) => store_writer(args).await,
    }
}

async fn store_writer(args: WriterArgs) -> anyhow::Result<()> {
    let options = EmbeddedOptions {
        snapshot_threshold_bytes: args.snapshot_bytes,
        // Small segments, so kills land during roll-overs too.
        segment_bytes: 1 << 20,
        ..EmbeddedOptions::default()
    };
    let store = EmbeddedStore::open(&args.data_dir, options, StoreMetrics::detached()).await?;
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "ready")?;
        out.flush()?;
    }
    let next = Arc::new(AtomicU64::new(args.start));
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(u64, i64)>();
    for _ in 0..args.concurrency {
        let store = store.clone();
        let next = next.clone();
        let tx = tx.clone();
        tokio::spawn(async move {
            loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                let key = Bytes::from(format!("/registry/crash/ns{}/k{n:010}", n % 8));
                let value = Bytes::from(format!("value-{n}-{}", "x".repeat((n % 200) as usize)));
                match store.create(key, value).await {
                    Ok(kv) => {
                        if tx.send((n, kv.mod_revision)).is_err() {
                            return;
                        }
                    }
                    Err(e) => {
                        eprintln!("write {n} failed: {e}");
                        return;
                    }
                }
            }
        });
    }
    drop(tx);
    let stdout = std::io::stdout();
    while let Some((n, rev)) = rx.recv().await {
        let mut out = stdout.lock();
        writeln!(out, "ack {n} {rev}")?;
        out.flush()?;
    }
    Ok(())
}
