//! The API server's credentials: a CA generated once into the data directory (certificate
//! and key, valid ten years), a serving certificate for loopback signed by it (valid one
//! year; `tessera certs rotate` issues the next one from the kept CA key), an admin bearer
//! token, and the kubeconfig that carries CA and token to kubectl.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use base64::Engine;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

/// Why credentials could not be made or read.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    /// Generating a key or certificate failed.
    #[error("generating {what}: {source}")]
    Generate {
        /// What was being generated.
        what: &'static str,
        /// The cause.
        #[source]
        source: rcgen::Error,
    },
    /// Reading or writing a file failed.
    #[error("{path}: {source}")]
    File {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// PEM-encoded credentials of one API server.
#[derive(Clone, Debug)]
pub struct Credentials {
    /// The CA certificate (what clients trust).
    pub ca_pem: String,
    /// The serving certificate, signed by the CA.
    pub cert_pem: String,
    /// The serving key.
    pub key_pem: String,
    /// The admin bearer token.
    pub admin_token: String,
    /// The CA's private key (kept 0600 in `ca.key`, to issue the next serving certificate);
    /// `None` for a data directory made before it was kept.
    pub ca_key_pem: Option<String>,
}

/// How long a serving certificate is valid.
pub const SERVING_YEARS: i32 = 1;
/// How long the CA is valid.
pub const CA_YEARS: i32 = 10;

/// Today's date (UTC) and the same date `years` later, for certificate validity. Starts a
/// day back so a clock slightly behind still accepts a certificate issued now.
fn validity(years: i32) -> ((i32, u8, u8), (i32, u8, u8)) {
    let today = crate::api::rfc3339(crate::api::now_secs() - 86_400);
    let y: i32 = today[0..4].parse().unwrap_or(2026);
    let m: u8 = today[5..7].parse().unwrap_or(1);
    let d: u8 = today[8..10].parse().unwrap_or(1);
    // (Day 29-31 may not exist in the target month.)
    ((y, m, d), (y + years, m, d.min(28)))
}

/// The CA's certificate parameters (the same each time: a serving certificate issued later
/// by the kept key names the same issuer).
fn ca_params() -> Result<CertificateParams, PkiError> {
    ca_params_named("tessera-ca")
}

/// [`ca_params`] with the common name `name`.
fn ca_params_named(name: &str) -> Result<CertificateParams, PkiError> {
    let mut ca_params =
        CertificateParams::new(Vec::<String>::new()).map_err(|source| PkiError::Generate {
            what: "the CA certificate",
            source,
        })?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.distinguished_name.push(DnType::CommonName, name);
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let (from, to) = validity(CA_YEARS);
    ca_params.not_before = rcgen::date_time_ymd(from.0, from.1, from.2);
    ca_params.not_after = rcgen::date_time_ymd(to.0, to.1, to.2);
    Ok(ca_params)
}

/// The names an API server's serving certificate always carries.
const LOOPBACK: [&str; 3] = ["localhost", "127.0.0.1", "::1"];

/// The file beside `server.crt` that lists the names it was issued for besides loopback
/// (one per line), so that `tessera certs rotate` issues the next one for the same names.
pub const SERVER_NAMES_FILE: &str = "server.names";

/// A serving certificate for loopback and `extra` names signed by `issuer`: its PEM, its
/// key's PEM and the last date it is valid (`YYYY-MM-DD`).
fn serving(
    issuer: &Issuer<'_, KeyPair>,
    extra: &[String],
) -> Result<(String, String, String), PkiError> {
    let mut names: Vec<String> = LOOPBACK.map(str::to_owned).to_vec();
    names.extend(
        extra
            .iter()
            .filter(|n| !LOOPBACK.contains(&n.as_str()))
            .cloned(),
    );
    serving_for(issuer, &names, "tessera-apiserver", SERVING_YEARS)
}

/// A serving certificate for `names` (DNS names or IP addresses) signed by `issuer`, valid
/// for `years`: its PEM, its key's PEM and its last day (`YYYY-MM-DD`).
fn serving_for(
    issuer: &Issuer<'_, KeyPair>,
    names: &[String],
    common_name: &str,
    years: i32,
) -> Result<(String, String, String), PkiError> {
    let generate = |what| move |source| PkiError::Generate { what, source };
    let key = KeyPair::generate().map_err(generate("the serving key"))?;
    let mut params =
        CertificateParams::new(names.to_vec()).map_err(generate("the serving certificate"))?;
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    let (from, to) = validity(years);
    params.not_before = rcgen::date_time_ymd(from.0, from.1, from.2);
    params.not_after = rcgen::date_time_ymd(to.0, to.1, to.2);
    let cert = params
        .signed_by(&key, issuer)
        .map_err(generate("the serving certificate"))?;
    Ok((
        cert.pem(),
        key.serialize_pem(),
        format!("{:04}-{:02}-{:02}", to.0, to.1, to.2),
    ))
}

/// What a node agent serves its endpoint (logs, usage) with: a CA of its own, made at each
/// start (its key never leaves memory and is dropped once the certificate is signed), and a
/// serving certificate for the node's address and name signed by it. The agent publishes
/// the CA on its Node ([`AGENT_CA_ANNOTATION`]); the API server trusts that CA alone when
/// it reaches that node, as it trusts the Node's address and port.
pub struct AgentTls {
    /// The agent's CA (PEM), to publish.
    pub ca_pem: String,
    /// The serving certificate (PEM).
    pub cert_pem: String,
    /// Its key (PEM).
    pub key_pem: String,
}

/// The Node annotation where a process agent publishes the CA of its endpoint.
pub const AGENT_CA_ANNOTATION: &str = "tessera.io/agent-ca";

/// Fresh [`AgentTls`] for the node `node` reached at `address`.
pub fn agent_tls(address: &str, node: &str) -> Result<AgentTls, PkiError> {
    let ca_key = KeyPair::generate().map_err(|source| PkiError::Generate {
        what: "the agent's CA key",
        source,
    })?;
    let ca_cert = ca_params()?
        .self_signed(&ca_key)
        .map_err(|source| PkiError::Generate {
            what: "the agent's CA certificate",
            source,
        })?;
    let issuer = Issuer::new(ca_params()?, ca_key);
    let (cert_pem, key_pem, _) = serving_for(
        &issuer,
        &[address.to_owned(), node.to_owned()],
        "tessera-agent",
        SERVING_YEARS,
    )?;
    Ok(AgentTls {
        ca_pem: ca_cert.pem(),
        cert_pem,
        key_pem,
    })
}

/// Issues a new serving certificate and key into `dir` from its kept CA key (the CA, and so
/// every kubeconfig, stays the same); returns the last date it is valid. The running API
/// server serves it after a restart.
pub fn rotate_serving(dir: &Path) -> Result<String, PkiError> {
    let key_path = dir.join("ca.key");
    let ca_key = fs::read_to_string(&key_path).map_err(|source| PkiError::File {
        path: key_path.clone(),
        source: std::io::Error::new(
            source.kind(),
            format!(
                "{source} (a data directory made before the CA key was kept cannot rotate; remove pki/ to make new credentials, then hand out the new kubeconfig)"
            ),
        ),
    })?;
    let ca_key = KeyPair::from_pem(&ca_key).map_err(|source| PkiError::Generate {
        what: "reading the CA key",
        source,
    })?;
    let issuer = Issuer::new(ca_params()?, ca_key);
    let names: Vec<String> = fs::read_to_string(dir.join(SERVER_NAMES_FILE))
        .unwrap_or_default()
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect();
    let (cert, key, until) = serving(&issuer, &names)?;
    write_private(&dir.join("server.key"), &key)?;
    write_private(&dir.join("server.crt"), &cert)?;
    Ok(until)
}

/// The credentials of one etcd cluster run with TLS between its members and towards its
/// clients: a CA of its own, one certificate every member serves and peers with, and the
/// client certificate the API server presents (etcd's `--client-cert-auth`). All PEM.
#[derive(Clone, Debug)]
pub struct EtcdPki {
    /// The etcd CA (`--trusted-ca-file`, `--peer-trusted-ca-file`, `--etcd-cafile`).
    pub ca_pem: String,
    /// Its key (kept to issue the next certificates).
    pub ca_key_pem: String,
    /// The members' certificate, for server and client use (`--cert-file`, `--peer-cert-file`).
    pub member_pem: String,
    /// Its key.
    pub member_key_pem: String,
    /// The API server's client certificate (`--etcd-certfile`).
    pub client_pem: String,
    /// Its key (`--etcd-keyfile`).
    pub client_key_pem: String,
}

/// Fresh [`EtcdPki`], the members' certificate naming `names` (wildcards such as
/// `*.shard-0-etcd.tessera.svc` cover every member of a StatefulSet).
pub fn etcd_pki(names: &[String]) -> Result<EtcdPki, PkiError> {
    let generate = |what| move |source| PkiError::Generate { what, source };
    let ca_key = KeyPair::generate().map_err(generate("the etcd CA key"))?;
    let ca_key_pem = ca_key.serialize_pem();
    let ca_pem = ca_params_named("tessera-etcd-ca")?
        .self_signed(&ca_key)
        .map_err(generate("the etcd CA certificate"))?
        .pem();
    let issuer = Issuer::new(ca_params_named("tessera-etcd-ca")?, ca_key);
    let issue = |names: Vec<String>, cn: &str, usages: Vec<ExtendedKeyUsagePurpose>| {
        leaf(&issuer, names, cn, usages, "an etcd certificate")
    };
    let (member_pem, member_key_pem) = issue(
        names.to_vec(),
        "tessera-etcd",
        vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ],
    )?;
    let (client_pem, client_key_pem) = issue(
        Vec::new(),
        "tessera-apiserver",
        vec![ExtendedKeyUsagePurpose::ClientAuth],
    )?;
    Ok(EtcdPki {
        ca_pem,
        ca_key_pem,
        member_pem,
        member_key_pem,
        client_pem,
        client_key_pem,
    })
}

/// A certificate for `names` (may be none) with common name `cn` and extended key usages
/// `usages`, valid [`SERVING_YEARS`], signed by `issuer`: its PEM and its key's PEM.
fn leaf(
    issuer: &Issuer<'_, KeyPair>,
    names: Vec<String>,
    cn: &str,
    usages: Vec<ExtendedKeyUsagePurpose>,
    what: &'static str,
) -> Result<(String, String), PkiError> {
    let generate = |source| PkiError::Generate { what, source };
    let key = KeyPair::generate().map_err(generate)?;
    let mut params = CertificateParams::new(names).map_err(generate)?;
    params.distinguished_name.push(DnType::CommonName, cn);
    params.extended_key_usages = usages;
    let (from, to) = validity(SERVING_YEARS);
    params.not_before = rcgen::date_time_ymd(from.0, from.1, from.2);
    params.not_after = rcgen::date_time_ymd(to.0, to.1, to.2);
    let cert = params.signed_by(&key, issuer).map_err(generate)?;
    Ok((cert.pem(), key.serialize_pem()))
}

fn read(path: &Path) -> Result<String, PkiError> {
    fs::read_to_string(path).map_err(|source| PkiError::File {
        path: path.to_owned(),
        source,
    })
}

/// Writes `contents` to `path`, readable by the owner only.
pub fn write_private(path: &Path, contents: &str) -> Result<(), PkiError> {
    let err = |source| PkiError::File {
        path: path.to_owned(),
        source,
    };
    let mut f = fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(0o600)
        .open(path)
        .map_err(err)?;
    f.write_all(contents.as_bytes()).map_err(err)?;
    f.sync_all().map_err(err)
}

/// Makes `dir` (0700) if it is missing.
fn private_dir(dir: &Path) -> Result<(), PkiError> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|source| PkiError::File {
            path: dir.to_owned(),
            source,
        })
}

/// The root secret that tenant tokens are keyed from (`dir/token.key`, 32 random bytes in
/// hex, 0600), made on first use. Replacing the file revokes every tenant token; the admin
/// token is separate and rotates without touching them.
pub fn token_root(dir: &Path) -> Result<Vec<u8>, PkiError> {
    Ok(secret(dir, "token.key", "the token key")?.into_bytes())
}

/// The bearer token that reads every sample of a metrics port (`dir/metrics.token`, 32
/// random bytes in hex, 0600), made on first use. Without it a metrics port leaves out the
/// samples that identify a tenant; with it (Prometheus' `credentials_file`) it serves all.
/// It grants nothing else.
pub fn metrics_token(dir: &Path) -> Result<String, PkiError> {
    secret(dir, "metrics.token", "the metrics token")
}

/// 32 random bytes in hex: a token or token key.
pub fn random_hex() -> String {
    let bytes: [u8; 32] = rand::random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `dir/name`: 32 random bytes in hex, written 0600 on first use.
fn secret(dir: &Path, name: &str, what: &str) -> Result<String, PkiError> {
    let path = dir.join(name);
    if path.exists() {
        return Ok(read(&path)?.trim().to_owned());
    }
    private_dir(dir)?;
    let mut bytes = [0u8; 32];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes).map_err(|_| {
        PkiError::File {
            path: path.clone(),
            source: std::io::Error::other(format!("no randomness for {what}")),
        }
    })?;
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    write_private(&path, &hex)?;
    Ok(hex)
}

/// The front proxy's CA files in a pki directory (kube-apiserver's
/// `--requestheader-client-ca-file`): a CA of its own, so that no certificate the cluster's
/// CA signs for a user — the CSR signer issues those — can pose as the proxy.
pub const FRONT_PROXY_CA: [&str; 2] = ["front-proxy-ca.crt", "front-proxy-ca.key"];

/// The name the front proxy's client certificate carries (Kubernetes' default
/// `--requestheader-allowed-names` entry).
pub const FRONT_PROXY_CLIENT: &str = "front-proxy-client";

/// What the API server presents to extension API servers when it proxies a request to
/// them: a client certificate for [`FRONT_PROXY_CLIENT`] signed by the front-proxy CA,
/// whose PEM extension servers trust for the `X-Remote-*` headers.
#[derive(Clone, Debug)]
pub struct FrontProxy {
    /// The front-proxy CA (PEM).
    pub ca_pem: String,
    /// The client certificate (PEM), issued at each start and never written.
    pub cert_pem: String,
    /// Its key (PEM).
    pub key_pem: String,
}

impl FrontProxy {
    /// The front-proxy CA in `dir` (made there on first use, when the directory is
    /// writable), and a fresh client certificate from it valid [`SERVING_YEARS`]. `Ok(None)`
    /// when `dir` lacks the CA and cannot take it (a read-only Secret made before the
    /// front proxy existed): the server then proxies nothing, saying why.
    pub fn load_or_create(dir: &Path) -> Result<Option<FrontProxy>, PkiError> {
        let [crt, key] = FRONT_PROXY_CA.map(|f| dir.join(f));
        let (ca_pem, ca_key_pem) = if crt.exists() && key.exists() {
            (read(&crt)?, read(&key)?)
        } else {
            let (ca_pem, ca_key_pem) = front_proxy_ca()?;
            if private_dir(dir).is_err()
                || write_private(&key, &ca_key_pem).is_err()
                || write_private(&crt, &ca_pem).is_err()
            {
                return Ok(None);
            }
            (ca_pem, ca_key_pem)
        };
        let generate = |what| move |source| PkiError::Generate { what, source };
        let ca_key = KeyPair::from_pem(&ca_key_pem).map_err(generate("the front-proxy CA key"))?;
        let issuer = Issuer::new(ca_params_named("tessera-front-proxy-ca")?, ca_key);
        let (cert_pem, key_pem) = leaf(
            &issuer,
            Vec::new(),
            FRONT_PROXY_CLIENT,
            vec![ExtendedKeyUsagePurpose::ClientAuth],
            "the front-proxy client certificate",
        )?;
        Ok(Some(FrontProxy {
            ca_pem,
            cert_pem,
            key_pem,
        }))
    }
}

/// A new front-proxy CA: its certificate and key (PEM).
pub fn front_proxy_ca() -> Result<(String, String), PkiError> {
    let key = KeyPair::generate().map_err(|source| PkiError::Generate {
        what: "the front-proxy CA key",
        source,
    })?;
    let cert = ca_params_named("tessera-front-proxy-ca")?
        .self_signed(&key)
        .map_err(|source| PkiError::Generate {
            what: "the front-proxy CA certificate",
            source,
        })?;
    Ok((cert.pem(), key.serialize_pem()))
}

impl Credentials {
    /// Loads the credentials in `dir`, or generates and saves them on first use.
    pub fn load_or_create(dir: &Path) -> Result<Credentials, PkiError> {
        let files = ["ca.crt", "server.crt", "server.key", "admin.token"].map(|f| dir.join(f));
        if files.iter().all(|f| f.exists()) {
            return Ok(Credentials {
                ca_pem: read(&files[0])?,
                cert_pem: read(&files[1])?,
                key_pem: read(&files[2])?,
                admin_token: read(&files[3])?.trim().to_owned(),
                ca_key_pem: fs::read_to_string(dir.join("ca.key")).ok(),
            });
        }
        private_dir(dir)?;
        let creds = Credentials::generate()?;
        write_private(&files[0], &creds.ca_pem)?;
        write_private(&files[1], &creds.cert_pem)?;
        write_private(&files[2], &creds.key_pem)?;
        write_private(&files[3], &creds.admin_token)?;
        if let Some(k) = &creds.ca_key_pem {
            write_private(&dir.join("ca.key"), k)?;
        }
        Ok(creds)
    }

    /// Fresh credentials: a CA, a serving certificate for `localhost`, `127.0.0.1` and `::1`,
    /// and a random admin token.
    pub fn generate() -> Result<Credentials, PkiError> {
        Credentials::generate_for(&[])
    }

    /// [`Credentials::generate`], the serving certificate also naming `extra` (DNS names,
    /// wildcards or IP addresses: a Service's names, a load balancer's address).
    pub fn generate_for(extra: &[String]) -> Result<Credentials, PkiError> {
        let ca_key = KeyPair::generate().map_err(|source| PkiError::Generate {
            what: "the CA key",
            source,
        })?;
        let ca_key_pem = ca_key.serialize_pem();
        let ca_cert = ca_params()?
            .self_signed(&ca_key)
            .map_err(|source| PkiError::Generate {
                what: "the CA certificate",
                source,
            })?;
        let issuer = Issuer::new(ca_params()?, ca_key);
        let (cert_pem, key_pem, _) = serving(&issuer, extra)?;
        let token: [u8; 32] = rand::random();
        Ok(Credentials {
            ca_pem: ca_cert.pem(),
            cert_pem,
            key_pem,
            admin_token: token.iter().map(|b| format!("{b:02x}")).collect(),
            ca_key_pem: Some(ca_key_pem),
        })
    }

    /// A kubeconfig for `server` with the CA and the admin token.
    pub fn kubeconfig(&self, server: &str) -> String {
        let ca = base64::engine::general_purpose::STANDARD.encode(&self.ca_pem);
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: tessera\n  cluster:\n    server: {server}\n    certificate-authority-data: {ca}\ncontexts:\n- name: tessera-admin\n  context:\n    cluster: tessera\n    user: tessera-admin\ncurrent-context: tessera-admin\nusers:\n- name: tessera-admin\n  user:\n    token: {}\n",
            self.admin_token
        )
    }

    /// Writes the kubeconfig for `server` to `path` (readable by the owner only).
    pub fn write_kubeconfig(&self, path: &Path, server: &str) -> Result<(), PkiError> {
        write_private(path, &self.kubeconfig(server))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_front_proxy_keeps_its_ca_and_names_itself() {
        use rustls::pki_types::pem::PemObject;
        let dir = tempfile::tempdir().expect("tmp");
        let a = FrontProxy::load_or_create(dir.path())
            .expect("made")
            .expect("writable");
        let b = FrontProxy::load_or_create(dir.path())
            .expect("loaded")
            .expect("present");
        assert_eq!(a.ca_pem, b.ca_pem, "the CA is kept");
        assert_ne!(
            a.cert_pem, b.cert_pem,
            "the client certificate is issued at each start"
        );
        let der =
            rustls::pki_types::CertificateDer::from_pem_slice(b.cert_pem.as_bytes()).expect("pem");
        let id = crate::client_certs::identity_of(&der).expect("a client certificate");
        assert_eq!(id.name, FRONT_PROXY_CLIENT);
        // A directory that cannot take the CA (here: below a file, which even root cannot
        // write into, as a read-only Secret mount): no front proxy, and no error.
        let file = dir.path().join("not-a-dir");
        std::fs::write(&file, "x").expect("file");
        let none = FrontProxy::load_or_create(&file.join("pki")).expect("no error");
        assert!(none.is_none());
    }

    #[test]
    fn credentials_are_made_once_and_reused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let a = Credentials::load_or_create(dir.path()).expect("create");
        let b = Credentials::load_or_create(dir.path()).expect("load");
        assert_eq!(a.ca_pem, b.ca_pem);
        assert_eq!(a.admin_token, b.admin_token);
        assert_eq!(a.admin_token.len(), 64);
        assert!(a.cert_pem.starts_with("-----BEGIN CERTIFICATE-----"));
        let mode = fs::metadata(dir.path().join("server.key"))
            .expect("meta")
            .permissions();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
            0o600
        );
        let kc = a.kubeconfig("https://127.0.0.1:6443");
        assert!(kc.contains("server: https://127.0.0.1:6443"));
        assert!(kc.contains(&format!("token: {}", a.admin_token)));
    }
}
