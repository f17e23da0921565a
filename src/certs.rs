//! `tessera certs init`: the credentials of one API server made ahead of time, for a
//! deployment where several processes share them (a shard's API server replicas, its
//! scheduler and controller manager, its etcd members): a CA, a serving certificate for the
//! Service names the API is reached by, the admin, metrics and (for a federation) join
//! tokens, the tenant token key, a kubeconfig, and optionally an etcd CA with member and
//! client certificates. Written to a directory, or stored as a Kubernetes Secret (the Helm
//! chart's pre-install Job does this in-cluster); a Secret that already exists is kept, so
//! the Job may run again on every upgrade without changing a credential.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use base64::Engine;
use clap::Args;
use tessera_apiserver::client::{Client, HttpClient};
use tessera_apiserver::pki;

/// Flags of `tessera certs init`.
#[derive(Args, Debug)]
pub struct InitArgs {
    /// Write the credentials into this directory (new, or empty).
    #[arg(long, required_unless_present = "secret")]
    pub pki_dir: Option<PathBuf>,
    /// A name the API is reached by, for its serving certificate besides loopback (DNS
    /// name, wildcard or IP address); repeat it or separate names by commas.
    #[arg(long = "san", value_delimiter = ',')]
    pub sans: Vec<String>,
    /// Also make an etcd CA, a member certificate for these names (server and peer use) and
    /// a client certificate for the API server; repeat it or separate names by commas.
    #[arg(long = "etcd-san", value_delimiter = ',')]
    pub etcd_sans: Vec<String>,
    /// Write a kubeconfig (`kubeconfig`) for this API URL with the admin token.
    #[arg(long)]
    pub server: Option<String>,
    /// Also make the join token shards' agents present (`join.token`): for a federation.
    #[arg(long)]
    pub federation: bool,
    /// Store the credentials as this Secret (one key per file) instead of a directory. A
    /// Secret of that name that exists already is kept as it is.
    #[arg(long)]
    pub secret: Option<String>,
    /// The Secret's namespace.
    #[arg(long, default_value = "default", requires = "secret")]
    pub namespace: String,
    /// Labels for the Secret: `key=value,key=value`.
    #[arg(long, default_value = "", requires = "secret")]
    pub secret_labels: String,
    /// The kubeconfig of the cluster the Secret goes to (default: the pod's service account,
    /// as a Job in the cluster has it).
    #[arg(long, requires = "secret")]
    pub kubeconfig: Option<PathBuf>,
}

/// The credentials `args` ask for, as (file name, contents).
pub fn issue(args: &InitArgs) -> anyhow::Result<Vec<(&'static str, String)>> {
    for name in args.sans.iter().chain(&args.etcd_sans) {
        check_name(name)?;
    }
    if let Some(server) = &args.server
        && !server.starts_with("https://")
    {
        anyhow::bail!("--server {server:?}: the API is served over TLS; give an https:// URL");
    }
    let creds = pki::Credentials::generate_for(&args.sans)?;
    let mut files = vec![
        ("ca.crt", creds.ca_pem.clone()),
        ("ca.key", creds.ca_key_pem.clone().unwrap_or_default()),
        ("server.crt", creds.cert_pem.clone()),
        ("server.key", creds.key_pem.clone()),
        (pki::SERVER_NAMES_FILE, lines(&args.sans)),
        ("admin.token", creds.admin_token.clone()),
        ("token.key", pki::random_hex()),
        ("metrics.token", pki::random_hex()),
    ];
    let (front_proxy_ca, front_proxy_key) = pki::front_proxy_ca()?;
    files.extend([
        (pki::FRONT_PROXY_CA[0], front_proxy_ca),
        (pki::FRONT_PROXY_CA[1], front_proxy_key),
    ]);
    if args.federation {
        files.push(("join.token", pki::random_hex()));
    }
    if let Some(server) = &args.server {
        files.push(("kubeconfig", creds.kubeconfig(server)));
    }
    if !args.etcd_sans.is_empty() {
        let etcd = pki::etcd_pki(&args.etcd_sans)?;
        files.extend([
            ("etcd-ca.crt", etcd.ca_pem),
            ("etcd-ca.key", etcd.ca_key_pem),
            ("etcd-member.crt", etcd.member_pem),
            ("etcd-member.key", etcd.member_key_pem),
            ("etcd-client.crt", etcd.client_pem),
            ("etcd-client.key", etcd.client_key_pem),
        ]);
    }
    Ok(files)
}

fn lines(names: &[String]) -> String {
    names.iter().map(|n| format!("{n}\n")).collect()
}

/// Refuses what cannot go into a certificate's subject alternative names.
fn check_name(name: &str) -> anyhow::Result<()> {
    if name.parse::<std::net::IpAddr>().is_ok() {
        return Ok(());
    }
    let host = name.strip_prefix("*.").unwrap_or(name);
    if let Some(why) = tessera_core::names::dns1123_subdomain(host) {
        anyhow::bail!("{name:?} is neither an IP address nor a DNS name: {why}");
    }
    Ok(())
}

/// `tessera certs init`.
pub async fn init(args: InitArgs) -> anyhow::Result<()> {
    let files = issue(&args)?;
    if let Some(dir) = &args.pki_dir
        && args.secret.is_none()
    {
        write_dir(dir, &files)?;
        println!(
            "credentials written to {} ({} files)",
            dir.display(),
            files.len()
        );
        return Ok(());
    }
    let name = args.secret.as_deref().unwrap_or_default();
    let client = match &args.kubeconfig {
        Some(k) => HttpClient::from_kubeconfig(k)
            .map_err(|e| anyhow::anyhow!("{} ({})", e.message, k.display()))?,
        None => in_cluster()?,
    };
    let labels = crate::federation::parse_labels(&args.secret_labels)?;
    let data: serde_json::Map<String, serde_json::Value> = files
        .iter()
        .map(|(k, v)| {
            let b64 = base64::engine::general_purpose::STANDARD.encode(v);
            ((*k).to_owned(), serde_json::Value::String(b64))
        })
        .collect();
    let secret = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": args.namespace, "labels": labels},
        "type": "Opaque",
        "data": data,
    });
    let secrets = tessera_apiserver::request::find_resource("", "v1", "secrets")
        .map_err(|e| anyhow::anyhow!("{}", e.message))?;
    let client: Arc<dyn Client> = Arc::new(client);
    match client.create(secrets, Some(&args.namespace), &secret).await {
        Ok(_) => println!(
            "Secret {}/{name} created ({} keys)",
            args.namespace,
            files.len()
        ),
        Err(e) if e.code == 409 => {
            println!(
                "Secret {}/{name} exists; kept as it is (delete it to make new credentials)",
                args.namespace
            );
        }
        Err(e) => anyhow::bail!(
            "creating Secret {}/{name}: {} (HTTP {})",
            args.namespace,
            e.message,
            e.code
        ),
    }
    Ok(())
}

/// Writes `files` into `dir` (0700, each file 0600); refuses a directory that holds files.
fn write_dir(dir: &Path, files: &[(&'static str, String)]) -> anyhow::Result<()> {
    if let Ok(mut entries) = std::fs::read_dir(dir)
        && entries.next().is_some()
    {
        anyhow::bail!(
            "{} is not empty: nothing written (credentials are made once; remove it, or `tessera certs rotate` a serving certificate)",
            dir.display()
        );
    }
    std::os::unix::fs::DirBuilderExt::mode(std::fs::DirBuilder::new().recursive(true), 0o700)
        .create(dir)
        .with_context(|| format!("creating {}", dir.display()))?;
    for (name, contents) in files {
        pki::write_private(&dir.join(name), contents)?;
    }
    Ok(())
}

/// Where a pod's service account credentials are mounted.
const SERVICE_ACCOUNT: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// A client of the cluster this process runs in, as its service account.
fn in_cluster() -> anyhow::Result<HttpClient> {
    let (Ok(host), Ok(port)) = (
        std::env::var("KUBERNETES_SERVICE_HOST"),
        std::env::var("KUBERNETES_SERVICE_PORT"),
    ) else {
        anyhow::bail!(
            "not in a Kubernetes pod (KUBERNETES_SERVICE_HOST and _PORT are unset): give --kubeconfig"
        );
    };
    let read = |f: &str| {
        let p = Path::new(SERVICE_ACCOUNT).join(f);
        std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))
    };
    let host = if host.contains(':') {
        format!("[{host}]")
    } else {
        host
    };
    HttpClient::new(
        &format!("https://{host}:{port}"),
        &read("ca.crt")?,
        read("token")?.trim(),
    )
    .map_err(|e| anyhow::anyhow!("{}", e.message))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        init: InitArgs,
    }

    fn args(extra: &[&str]) -> InitArgs {
        Cli::try_parse_from(std::iter::once("t").chain(extra.iter().copied()))
            .expect("parses")
            .init
    }

    #[test]
    fn a_directory_gets_every_file_once() {
        let dir = tempfile::tempdir().expect("tmp");
        let pki_dir = dir.path().join("pki");
        let a = args(&[
            "--pki-dir",
            pki_dir.to_str().expect("utf-8"),
            "--san",
            "api.tessera.svc,10.0.0.1",
            "--etcd-san",
            "*.etcd.tessera.svc",
            "--server",
            "https://api.tessera.svc:6443",
            "--federation",
        ]);
        let files = issue(&a).expect("issued");
        let names: Vec<&str> = files.iter().map(|(n, _)| *n).collect();
        for want in [
            "ca.crt",
            "server.key",
            "admin.token",
            "token.key",
            "metrics.token",
            "join.token",
            "kubeconfig",
            "etcd-member.crt",
            "etcd-client.key",
            "front-proxy-ca.crt",
            "front-proxy-ca.key",
        ] {
            assert!(names.contains(&want), "{want} missing from {names:?}");
        }
        write_dir(&pki_dir, &files).expect("written");
        // What an API server loads is what was written.
        let creds = pki::Credentials::load_or_create(&pki_dir).expect("loads");
        let admin = files.iter().find(|(n, _)| *n == "admin.token").expect("a");
        assert_eq!(creds.admin_token, admin.1);
        let err = write_dir(&pki_dir, &files).expect_err("not twice");
        assert!(err.to_string().contains("not empty"), "{err}");
    }

    #[test]
    fn names_that_no_certificate_can_carry_are_refused() {
        for bad in ["under_score.svc", "-x", "a..b"] {
            let err = issue(&args(&[
                "--pki-dir",
                "/nonexistent",
                &format!("--san={bad}"),
            ]))
            .expect_err(bad);
            assert!(err.to_string().contains(bad), "{err}");
        }
        let err = issue(&args(&["--pki-dir", "/x", "--server", "http://a:6443"]))
            .expect_err("plain http");
        assert!(err.to_string().contains("https://"), "{err}");
        assert!(Cli::try_parse_from(["t"]).is_err(), "needs a place to go");
    }
}
