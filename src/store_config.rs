//! The store flags shared by every command that opens a store, and building the store they
//! describe.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, ValueEnum};
use tessera_store::{
    EmbeddedOptions, EmbeddedStore, EtcdOptions, EtcdStore, EtcdTls, Instrumented, ShardedStore,
    ShardingConfig, Store, StoreMetrics,
};

/// Which backend holds the shard's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Backend {
    /// In-process and durable in the data directory (one machine).
    Embedded,
    /// A real etcd v3 cluster (or several, with overrides and tenant shards).
    Etcd,
}

/// Store flags, named as kube-apiserver names them where it has the same thing.
#[derive(Args, Clone, Debug)]
pub struct StoreArgs {
    /// Storage backend.
    #[arg(long, value_enum, default_value = "embedded")]
    pub store: Backend,
    /// etcd members of the default cluster, comma-separated.
    #[arg(
        long,
        env = "TESSERA_ETCD_SERVERS",
        default_value = "http://127.0.0.1:2379"
    )]
    pub etcd_servers: String,
    /// The CA (PEM) that signs the etcd members' serving certificates; needed for
    /// `https://` members (every etcd cluster given here shares it).
    #[arg(long, env = "TESSERA_ETCD_CAFILE")]
    pub etcd_cafile: Option<PathBuf>,
    /// A client certificate (PEM) for etcd members run with `--client-cert-auth`.
    #[arg(long, requires_all = ["etcd_keyfile", "etcd_cafile"])]
    pub etcd_certfile: Option<PathBuf>,
    /// The client certificate's key (PEM).
    #[arg(long, requires = "etcd_certfile")]
    pub etcd_keyfile: Option<PathBuf>,
    /// Per-resource etcd clusters: `group/resource#url;url`, comma-separated
    /// (e.g. `/events#http://127.0.0.1:2381`).
    #[arg(long)]
    pub etcd_servers_overrides: Option<String>,
    /// Tenant shards: etcd clusters that namespaced objects are hashed over by namespace;
    /// clusters separated by `;`, members of one cluster by `,`.
    #[arg(long)]
    pub tenant_shards: Option<String>,
    /// How often old revisions are compacted (history kept: at least this long).
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    pub compaction_interval: Duration,
    /// Encryption at rest: a Kubernetes `EncryptionConfiguration` file (YAML or JSON) naming
    /// the resources whose stored values are encrypted (`aesgcm`) or kept as they are
    /// (`identity`), as kube-apiserver's flag of the same name.
    #[arg(long)]
    pub encryption_provider_config: Option<PathBuf>,
    /// Size of each embedded-store log segment, in MiB, written out (zero-filled) ahead so
    /// that a commit never waits for the file to grow; etcd uses 64. Smaller segments cost
    /// less disk for small or short-lived shards (tests, laptops).
    #[arg(long, env = "TESSERA_WAL_SEGMENT_MIB", default_value_t = 64,
        value_parser = clap::value_parser!(u64).range(1..=1024))]
    pub wal_segment_mib: u64,
}

/// Parses `300ms`, `10s`, `5m`, `1h`, `90d`, and sums of them as Go writes durations
/// (`5m0s`, `1h30m`).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    if s.is_empty() {
        return Err("an empty duration: write a number followed by ms, s, m, h or d".into());
    }
    let mut total = Duration::ZERO;
    let mut rest = s;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .ok_or_else(|| format!("{s:?}: add a unit (ms, s, m, h or d)"))?;
        let (num, after) = rest.split_at(digits);
        let n: u64 = num
            .parse()
            .map_err(|_| format!("{s:?}: expected a number followed by ms, s, m, h or d"))?;
        let unit_len = after
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(after.len());
        let (unit, next) = after.split_at(unit_len);
        total += match unit {
            "ms" => Duration::from_millis(n),
            "s" => Duration::from_secs(n),
            "m" => Duration::from_secs(n * 60),
            "h" => Duration::from_secs(n * 3600),
            "d" => Duration::from_secs(n * 86400),
            _ => {
                return Err(format!(
                    "{s:?}: unknown unit {unit:?} (use ms, s, m, h or d)"
                ));
            }
        };
        rest = next;
    }
    Ok(total)
}

/// The embedded store's options the flags describe.
pub fn embedded_options(args: &StoreArgs) -> EmbeddedOptions {
    EmbeddedOptions {
        segment_bytes: args.wal_segment_mib << 20,
        ..EmbeddedOptions::default()
    }
}

/// Opens the store the flags describe, instrumented with `metrics`.
pub async fn open(
    args: &StoreArgs,
    data_dir: &std::path::Path,
    metrics: Arc<StoreMetrics>,
) -> anyhow::Result<Arc<dyn Store>> {
    let inner: Arc<dyn Store> = match args.store {
        Backend::Embedded => {
            if args.etcd_servers_overrides.is_some()
                || args.tenant_shards.is_some()
                || args.etcd_cafile.is_some()
            {
                anyhow::bail!(
                    "--etcd-servers-overrides, --tenant-shards and --etcd-cafile need --store etcd"
                );
            }
            let dir: PathBuf = data_dir.join("store");
            Arc::new(
                EmbeddedStore::open(&dir, embedded_options(args), metrics.clone())
                    .await
                    .with_context(|| format!("opening the embedded store in {}", dir.display()))?,
            )
        }
        Backend::Etcd => {
            let config = ShardingConfig::parse(
                &args.etcd_servers,
                args.etcd_servers_overrides.as_deref(),
                args.tenant_shards.as_deref(),
            )?;
            let tls = etcd_tls(args)?;
            let mut all = config
                .default
                .iter()
                .chain(config.overrides.iter().flat_map(|(_, urls)| urls))
                .chain(config.tenant_shards.iter().flatten());
            if let Some(url) = all.find(|u| u.starts_with("https://"))
                && tls.is_none()
            {
                anyhow::bail!(
                    "{url}: an https:// etcd member needs --etcd-cafile (the CA of the members' certificates)"
                );
            }
            let connect = |urls: Vec<String>| {
                let metrics = metrics.clone();
                let mut options = EtcdOptions::new(urls);
                options.tls = tls.clone();
                async move {
                    EtcdStore::connect(options, metrics)
                        .await
                        .map(|s| Arc::new(s) as Arc<dyn Store>)
                }
            };
            let default = connect(config.default.clone()).await?;
            if config.is_sharded() {
                let mut overrides = Vec::new();
                for (segment, urls) in &config.overrides {
                    overrides.push((segment.clone(), connect(urls.clone()).await?));
                }
                let mut tenants = Vec::new();
                for urls in &config.tenant_shards {
                    tenants.push(connect(urls.clone()).await?);
                }
                Arc::new(ShardedStore::new(
                    tessera_core::keys::ROOT,
                    default,
                    overrides,
                    tenants,
                ))
            } else {
                default
            }
        }
    };
    let store: Arc<dyn Store> = Arc::new(Instrumented::new(inner, metrics));
    match &args.encryption_provider_config {
        None => Ok(store),
        Some(path) => {
            let config = encryption_config(path)?;
            tracing::info!(resources = ?config.resources, file = %path.display(), "encryption at rest");
            Ok(Arc::new(tessera_store::Encrypted::new(store, config)))
        }
    }
}

/// The etcd client TLS the flags describe, read from its files.
fn etcd_tls(args: &StoreArgs) -> anyhow::Result<Option<EtcdTls>> {
    let read = |p: &PathBuf, what: &str| {
        std::fs::read_to_string(p).with_context(|| format!("reading {what} {}", p.display()))
    };
    let Some(ca) = &args.etcd_cafile else {
        return Ok(None);
    };
    let identity = match (&args.etcd_certfile, &args.etcd_keyfile) {
        (Some(cert), Some(key)) => {
            Some((read(cert, "--etcd-certfile")?, read(key, "--etcd-keyfile")?))
        }
        _ => None,
    };
    Ok(Some(EtcdTls {
        ca_pem: read(ca, "--etcd-cafile")?,
        identity,
    }))
}

/// Reads an `EncryptionConfiguration` file.
pub fn encryption_config(
    path: &std::path::Path,
) -> anyhow::Result<tessera_store::EncryptionConfig> {
    let text = std::fs::read(path)
        .with_context(|| format!("reading the encryption config {}", path.display()))?;
    let value = tessera_apiserver::yaml::to_json(&text)
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    tessera_store::EncryptionConfig::from_json(&value)
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_units_only() {
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert!(parse_duration("5").is_err());
        assert_eq!(parse_duration("2d"), Ok(Duration::from_secs(172_800)));
        assert!(parse_duration("5w").is_err());
        assert!(parse_duration("m").is_err());
        assert_eq!(parse_duration("5m0s"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert!(parse_duration("").is_err());
        assert!(parse_duration("5m3").is_err());
    }

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        store: StoreArgs,
    }

    #[test]
    fn log_segments_are_sized_in_mib_within_bounds() {
        use clap::Parser;
        let args = Cli::try_parse_from(["t", "--wal-segment-mib", "4"]).expect("parses");
        assert_eq!(embedded_options(&args.store).segment_bytes, 4 << 20);
        let default = Cli::try_parse_from(["t"]).expect("parses");
        // The variable may be set by the test run itself; the flag's default is etcd's.
        if std::env::var_os("TESSERA_WAL_SEGMENT_MIB").is_none() {
            assert_eq!(embedded_options(&default.store).segment_bytes, 64 << 20);
        }
        for bad in ["0", "2048", "-1", "big"] {
            let err = Cli::try_parse_from(["t".to_owned(), format!("--wal-segment-mib={bad}")])
                .err()
                .expect("refused");
            assert!(err.to_string().contains("--wal-segment-mib"), "{err}");
        }
    }

    #[test]
    fn etcd_tls_and_urls_must_agree() {
        use clap::Parser;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let dir = tempfile::tempdir().expect("tmp");
        let ca = dir.path().join("ca.crt");
        let pki = tessera_apiserver::pki::etcd_pki(&["localhost".into()]).expect("pki");
        std::fs::write(&ca, pki.ca_pem).expect("write");
        let open_with = |flags: &[&str]| {
            let args = Cli::try_parse_from(
                ["t", "--store", "etcd"]
                    .iter()
                    .copied()
                    .chain(flags.iter().copied()),
            )
            .expect("parses");
            rt.block_on(open(&args.store, dir.path(), StoreMetrics::detached()))
                .err()
                .map(|e| e.to_string())
        };
        let no_ca = open_with(&["--etcd-servers", "https://127.0.0.1:1"]).expect("refused");
        assert!(no_ca.contains("needs --etcd-cafile"), "{no_ca}");
        let ca_flag = format!("--etcd-cafile={}", ca.display());
        let plain =
            open_with(&["--etcd-servers", "http://127.0.0.1:1", &ca_flag]).expect("refused");
        assert!(plain.contains("must be an https:// URL"), "{plain}");
        let missing = open_with(&[
            "--etcd-servers",
            "https://127.0.0.1:1",
            "--etcd-cafile=/nonexistent/ca.crt",
        ])
        .expect("refused");
        assert!(missing.contains("--etcd-cafile"), "{missing}");
        // A client certificate needs its key.
        assert!(
            Cli::try_parse_from(["t", "--etcd-certfile", "c.crt", "--etcd-cafile", "ca.crt"])
                .is_err()
        );
    }
}
