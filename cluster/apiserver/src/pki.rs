//! The API server's credentials: a CA generated once into the data directory, a serving
//! certificate for loopback signed by it, an admin bearer token, and the kubeconfig that
//! carries all three to kubectl.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use base64::Engine;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};

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
}

fn read(path: &Path) -> Result<String, PkiError> {
    fs::read_to_string(path).map_err(|source| PkiError::File {
        path: path.to_owned(),
        source,
    })
}

fn write_private(path: &Path, contents: &str) -> Result<(), PkiError> {
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

/// The root secret that tenant tokens are keyed from (`dir/token.key`, 32 random bytes in
/// hex, 0600), made on first use. Replacing the file revokes every tenant token; the admin
/// token is separate and rotates without touching them.
pub fn token_root(dir: &Path) -> Result<Vec<u8>, PkiError> {
    let path = dir.join("token.key");
    if path.exists() {
        return Ok(read(&path)?.trim().as_bytes().to_vec());
    }
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|source| PkiError::File {
            path: dir.to_owned(),
            source,
        })?;
    let mut bytes = [0u8; 32];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes).map_err(|_| {
        PkiError::File {
            path: path.clone(),
            source: std::io::Error::other("no randomness for the token key"),
        }
    })?;
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    write_private(&path, &hex)?;
    Ok(hex.into_bytes())
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
            });
        }
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|source| PkiError::File {
                path: dir.to_owned(),
                source,
            })?;
        let creds = Credentials::generate()?;
        write_private(&files[0], &creds.ca_pem)?;
        write_private(&files[1], &creds.cert_pem)?;
        write_private(&files[2], &creds.key_pem)?;
        write_private(&files[3], &creds.admin_token)?;
        Ok(creds)
    }

    /// Fresh credentials: a CA, a serving certificate for `localhost`, `127.0.0.1` and `::1`,
    /// and a random admin token.
    pub fn generate() -> Result<Credentials, PkiError> {
        let generate = |what| move |source| PkiError::Generate { what, source };
        let ca_key = KeyPair::generate().map_err(generate("the CA key"))?;
        let mut ca_params =
            CertificateParams::new(Vec::<String>::new()).map_err(generate("the CA certificate"))?;
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "tessera-ca");
        ca_params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_cert = ca_params
            .self_signed(&ca_key)
            .map_err(generate("the CA certificate"))?;
        let issuer = Issuer::new(ca_params, &ca_key);
        let key = KeyPair::generate().map_err(generate("the serving key"))?;
        let mut params = CertificateParams::new(vec![
            "localhost".to_owned(),
            "127.0.0.1".to_owned(),
            "::1".to_owned(),
        ])
        .map_err(generate("the serving certificate"))?;
        params
            .distinguished_name
            .push(DnType::CommonName, "tessera-apiserver");
        let cert = params
            .signed_by(&key, &issuer)
            .map_err(generate("the serving certificate"))?;
        let token: [u8; 32] = rand::random();
        Ok(Credentials {
            ca_pem: ca_cert.pem(),
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            admin_token: token.iter().map(|b| format!("{b:02x}")).collect(),
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
