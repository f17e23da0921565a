//! `tessera store backup|restore`: backups of the embedded store, as `etcdctl snapshot save`
//! and `etcdutl snapshot restore` are for etcd.
//!
//! - `backup` takes a consistent copy of a **running** API server's store through its API
//!   (`GET /tessera/v1/store/backup`, admin token only), or of a **stopped** one's data
//!   directory with `--data-dir`; the file is checked (format, checksum) before it is kept.
//! - `restore` makes the store of a **new** data directory of a backup; `tessera up` (or
//!   `tessera apiserver`) then opens it as the store was at the backup's revision.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use clap::{Args, Subcommand};
use futures::StreamExt;
use indicatif::{ProgressBar, ProgressStyle};
use tessera_apiserver::client::HttpClient;
use tessera_store::embedded::{BackupInfo, restore_backup, verify_backup};

/// `tessera store ...`.
#[derive(Subcommand)]
pub enum StoreCommand {
    /// Take a backup of the store: of a running API server (by its admin kubeconfig), or of
    /// a stopped one's data directory (`--data-dir`).
    Backup(BackupArgs),
    /// Make the store of a new data directory of a backup.
    Restore(RestoreArgs),
}

/// Flags of `tessera store backup`.
#[derive(Args)]
pub struct BackupArgs {
    /// The API server's kubeconfig (an admin's).
    #[arg(long, env = "KUBECONFIG", default_value = "./data/kubeconfig")]
    pub kubeconfig: PathBuf,
    /// The kubeconfig's context to back up (a shard's, with `tessera up --shards N`);
    /// its current context when not given.
    #[arg(long)]
    pub context: Option<String>,
    /// Back up the store of this data directory instead, while no process uses it.
    #[arg(long, conflicts_with = "context")]
    pub data_dir: Option<PathBuf>,
    /// The backup file to write (it must not exist).
    #[arg(long)]
    pub out: PathBuf,
}

/// Flags of `tessera store restore`.
#[derive(Args)]
pub struct RestoreArgs {
    /// The backup file.
    #[arg(long)]
    pub from: PathBuf,
    /// The data directory to restore into; its `store/` must not exist yet. Copy the old
    /// data directory's `pki/` there too, to keep its CA and tokens.
    #[arg(long)]
    pub data_dir: PathBuf,
}

/// Runs `tessera store ...`.
pub async fn run(cmd: StoreCommand) -> anyhow::Result<()> {
    match cmd {
        StoreCommand::Backup(args) => {
            if args.out.exists() {
                anyhow::bail!(
                    "--out {} exists already; name a new file",
                    args.out.display()
                );
            }
            let (info, from) = match &args.data_dir {
                Some(dir) => (offline(dir, &args.out).await?, dir.display().to_string()),
                None => online(&args).await?,
            };
            println!(
                "Backed up {from}: revision {}, {} keys, {} bytes, in {}",
                info.revision,
                info.keys,
                info.bytes,
                args.out.display()
            );
            Ok(())
        }
        StoreCommand::Restore(args) => {
            let store = args.data_dir.join("store");
            let info = restore_backup(&args.from, &store)
                .map_err(|e| anyhow::anyhow!("restoring {}: {e}", args.from.display()))?;
            println!(
                "Restored revision {} ({} keys) into {}. Start it with `tessera up --data-dir {}` (with the old data directory's pki/ copied beside it, its CA and tokens stay valid).",
                info.revision,
                info.keys,
                store.display(),
                args.data_dir.display()
            );
            Ok(())
        }
    }
}

/// The stopped store of `data_dir`, opened (its lock taken: a running process refuses it)
/// and written to `out`.
async fn offline(data_dir: &Path, out: &Path) -> anyhow::Result<BackupInfo> {
    let dir = data_dir.join("store");
    if !dir.is_dir() {
        anyhow::bail!(
            "{} holds no store (no store/ directory)",
            data_dir.display()
        );
    }
    let store = tessera_store::EmbeddedStore::open(
        &dir,
        tessera_store::EmbeddedOptions::default(),
        tessera_store::metrics::StoreMetrics::detached(),
    )
    .await
    .map_err(|e| anyhow::anyhow!("opening {}: {e}", dir.display()))?;
    let info = store
        .backup(out)
        .await
        .map_err(|e| anyhow::anyhow!("backing up {}: {e}", dir.display()))?;
    store.close().await?;
    Ok(info)
}

/// Streams the running API server's backup to `args.out` (written beside it, checked, then
/// renamed), with a progress bar.
async fn online(args: &BackupArgs) -> anyhow::Result<(BackupInfo, String)> {
    let client = HttpClient::from_kubeconfig_context(&args.kubeconfig, args.context.as_deref())
        .map_err(|e| anyhow::anyhow!("{}", e.message))?;
    let server = client.server().to_owned();
    let (headers, mut body) = client
        .get_raw(tessera_apiserver::http::BACKUP_PATH)
        .await
        .map_err(|e| anyhow::anyhow!("backing up {server}: {}", e.message))?;
    let total = headers
        .get("content-length")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let bar = match total {
        Some(n) => ProgressBar::new(n),
        None => ProgressBar::no_length(),
    }
    .with_style(
        ProgressStyle::with_template("backup [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec}")
            .expect("a valid template")
            .progress_chars("=> "),
    );
    let partial = args.out.with_extension("partial");
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&partial)
        .map_err(|e| anyhow::anyhow!("creating {}: {e}", partial.display()))?;
    let written = async {
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(|e| anyhow::anyhow!("reading the backup: {e}"))?;
            file.write_all(&chunk)?;
            bar.inc(chunk.len() as u64);
        }
        file.sync_all()?;
        anyhow::Ok(())
    }
    .await;
    bar.finish_and_clear();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&partial);
        return Err(e);
    }
    // Whole and intact, or not kept.
    let info = match verify_backup(&partial) {
        Ok(info) => info,
        Err(e) => {
            let _ = std::fs::remove_file(&partial);
            anyhow::bail!("the backup from {server} is damaged: {e}");
        }
    };
    std::fs::rename(&partial, &args.out)?;
    Ok((info, server))
}
