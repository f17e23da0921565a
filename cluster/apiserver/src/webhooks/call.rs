//! Calling a webhook: one HTTPS POST of an AdmissionReview, trusting the webhook's
//! `caBundle` (or the host's CA certificates when it has none), checking the certificate
//! for the URL's host or for `<service>.<namespace>.svc`, within the webhook's timeout.
//!
//! Connections are kept for the next call (HTTP/1.1 keep-alive, as Go's transport keeps
//! them for kube-apiserver): a TLS handshake costs more than a small webhook's whole answer.
//! A kept connection the webhook closed meanwhile is noticed before the request is sent on
//! it, and the request goes on a new one. TLS client configurations are made once per CA
//! bundle.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::rt::TokioIo;
use parking_lot::Mutex;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};

/// Largest AdmissionReview answer read (kube-apiserver's webhook client limit is 3 MiB).
const MAX_ANSWER: usize = 3 << 20;

/// TLS configurations kept, at most (one per distinct CA bundle).
const MAX_CONFIGS: usize = 256;

/// Where one call goes.
#[derive(Clone, Debug)]
pub struct Target {
    /// The address connected to.
    pub addr: SocketAddr,
    /// The name the certificate must be for (a DNS name or an IP address).
    pub server_name: String,
    /// The `Host` header.
    pub host: String,
    /// Path (and query) of the request.
    pub path: String,
}

/// TLS client configurations by CA bundle (None: the host's CAs).
type Configs = HashMap<Option<Arc<str>>, Arc<rustls::ClientConfig>>;

/// Idle connections kept per (address, server name, CA bundle).
type Pool = HashMap<(SocketAddr, String, Option<Arc<str>>), Vec<Sender>>;

pub(crate) type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

/// Idle connections kept per webhook endpoint, at most.
const IDLE_PER_ENDPOINT: usize = 32;

/// Endpoints with idle connections kept, at most (past it the pool is emptied).
const MAX_ENDPOINTS: usize = 1024;

/// Makes webhook calls; cheap to clone.
#[derive(Clone, Default)]
pub struct Caller {
    configs: Arc<Mutex<Configs>>,
    idle: Arc<Mutex<Pool>>,
}

impl std::fmt::Debug for Caller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Caller").finish_non_exhaustive()
    }
}

/// The host's trusted CA certificates (`SSL_CERT_FILE`, else Debian's bundle).
fn system_roots() -> Result<Vec<u8>, String> {
    let path = std::env::var_os("SSL_CERT_FILE")
        .unwrap_or_else(|| "/etc/ssl/certs/ca-certificates.crt".into());
    std::fs::read(&path).map_err(|e| {
        format!(
            "the webhook has no caBundle and the host's CA certificates ({}) cannot be read: {e}",
            std::path::Path::new(&path).display()
        )
    })
}

impl Caller {
    fn config(&self, ca: Option<&Arc<str>>) -> Result<Arc<rustls::ClientConfig>, String> {
        if let Some(c) = self.configs.lock().get(&ca.cloned()) {
            return Ok(c.clone());
        }
        let pem = match ca {
            Some(pem) => pem.as_bytes().to_vec(),
            None => system_roots()?,
        };
        // The host bundle may hold certificates rustls does not take; those are skipped.
        let roots = trust_store(&pem, ca.is_some())?;
        let config = Arc::new(
            rustls::ClientConfig::builder_with_provider(Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_root_certificates(roots)
            .with_no_client_auth(),
        );
        let mut configs = self.configs.lock();
        if configs.len() >= MAX_CONFIGS {
            configs.clear();
        }
        configs.insert(ca.cloned(), config.clone());
        Ok(config)
    }

    /// A new connection to `target`, trusting `ca`.
    async fn connect(&self, target: &Target, ca: Option<&Arc<str>>) -> Result<Sender, String> {
        let config = self.config(ca)?;
        let name = ServerName::try_from(target.server_name.clone())
            .map_err(|e| format!("{:?} is not a valid server name: {e}", target.server_name))?;
        let tcp = tokio::net::TcpStream::connect(target.addr)
            .await
            .map_err(|e| e.to_string())?;
        let _ = tcp.set_nodelay(true);
        let tls = tokio_rustls::TlsConnector::from(config)
            .connect(name, tcp)
            .await
            .map_err(|e| format!("tls: {e}"))?;
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(sender)
    }

    /// POSTs `body` to `target` over TLS trusting `ca` (None: the host's CAs): the answer's
    /// body if it is a 200.
    pub async fn post(
        &self,
        target: &Target,
        ca: Option<&Arc<str>>,
        body: Vec<u8>,
    ) -> Result<Bytes, String> {
        self.post_limited(target, ca, body, MAX_ANSWER).await
    }

    /// [`Self::post`] reading an answer of up to `max_answer` bytes.
    pub async fn post_limited(
        &self,
        target: &Target,
        ca: Option<&Arc<str>>,
        body: Vec<u8>,
        max_answer: usize,
    ) -> Result<Bytes, String> {
        let url = format!("https://{}{}", target.host, target.path);
        let post = |e: &dyn std::fmt::Display| format!("Post {url:?}: {e}");
        let key = (target.addr, target.server_name.clone(), ca.cloned());
        let request = hyper::Request::post(target.path.as_str())
            .header(hyper::header::HOST, target.host.as_str())
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .header(hyper::header::ACCEPT, "application/json")
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| post(&e))?;
        let (mut sender, answer) = send_kept(&self.idle, &key, request, || async {
            self.connect(target, ca).await
        })
        .await
        .map_err(|e| post(&e))?;
        let status = answer.status();
        let bytes = Limited::new(answer.into_body(), max_answer)
            .collect()
            .await
            .map_err(|e| post(&format!("reading the answer: {e}")))?
            .to_bytes();
        // Ready again once the answer was read whole (an error: the webhook closed it).
        let ready = tokio::time::timeout(std::time::Duration::from_millis(100), sender.ready());
        if matches!(ready.await, Ok(Ok(()))) {
            keep(&self.idle, key, sender, MAX_ENDPOINTS, IDLE_PER_ENDPOINT);
        }
        if status != hyper::StatusCode::OK {
            let text = String::from_utf8_lossy(&bytes[..bytes.len().min(512)]).into_owned();
            return Err(format!("the server answered {status}: {text}"));
        }
        Ok(bytes)
    }
}

/// The certificates of a CA bundle (PEM) as a trust store. With `strict`, one rustls does
/// not take is an error; without (the host's bundle), it is skipped. An empty store is an
/// error either way.
pub(crate) fn trust_store(pem: &[u8], strict: bool) -> Result<rustls::RootCertStore, String> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(pem) {
        let cert = cert.map_err(|e| format!("the CA bundle is not PEM: {e}"))?;
        if let Err(e) = roots.add(cert)
            && strict
        {
            return Err(format!("the CA bundle holds a bad certificate: {e}"));
        }
    }
    if roots.is_empty() {
        return Err("the CA bundle holds no certificate".into());
    }
    Ok(roots)
}

/// Sends `request` on a connection kept in `idle` under `key`, or on a new one from
/// `connect`: the connection and the answer's head. A kept connection found closed before
/// the request went out gives the request back, and the next is tried.
pub(crate) async fn send_kept<K, C, F>(
    idle: &Mutex<HashMap<K, Vec<Sender>>>,
    key: &K,
    mut request: hyper::Request<Full<Bytes>>,
    connect: C,
) -> Result<(Sender, hyper::Response<hyper::body::Incoming>), String>
where
    K: Eq + std::hash::Hash,
    C: FnOnce() -> F,
    F: std::future::Future<Output = Result<Sender, String>>,
{
    loop {
        let kept = idle.lock().get_mut(key).and_then(Vec::pop);
        let Some(mut sender) = kept else {
            let mut sender = connect().await?;
            let answer = sender
                .send_request(request)
                .await
                .map_err(|e| e.to_string())?;
            return Ok((sender, answer));
        };
        if sender.is_closed() {
            continue;
        }
        match sender.try_send_request(request).await {
            Ok(answer) => return Ok((sender, answer)),
            Err(mut e) => match e.take_message() {
                Some(r) => request = r,
                None => return Err(e.error().to_string()),
            },
        }
    }
}

/// Keeps `sender` (ready for another request) in `idle` under `key`: at most `per_key` per
/// key, and the whole pool emptied past `max_keys` keys.
pub(crate) fn keep<K: Eq + std::hash::Hash>(
    idle: &Mutex<HashMap<K, Vec<Sender>>>,
    key: K,
    sender: Sender,
    max_keys: usize,
    per_key: usize,
) {
    let mut idle = idle.lock();
    if idle.len() >= max_keys && !idle.contains_key(&key) {
        idle.clear();
    }
    let kept = idle.entry(key).or_default();
    if kept.len() < per_key {
        kept.push(sender);
    }
}

/// The target of a URL webhook: its host resolved (IP literals as they are).
pub async fn url_target(uri: &hyper::Uri, timeout: std::time::Duration) -> Result<Target, String> {
    let host = uri.host().ok_or("the webhook URL has no host")?;
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let port = uri.port_u16().unwrap_or(443);
    let addr = match bare.parse::<std::net::IpAddr>() {
        Ok(ip) => SocketAddr::new(ip, port),
        Err(_) => tokio::net::lookup_host((bare, port))
            .await
            .map_err(|e| format!("resolving {bare}: {e}"))?
            .next()
            .ok_or_else(|| format!("{bare} has no address"))?,
    };
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    Ok(Target {
        addr,
        server_name: bare.to_owned(),
        host: uri
            .authority()
            .map_or_else(|| bare.to_owned(), |a| a.as_str().to_owned()),
        path: with_timeout(path, timeout),
    })
}

/// `path?timeout=10s`, as kube-apiserver tells webhooks their deadline.
pub fn with_timeout(path: &str, timeout: std::time::Duration) -> String {
    let sep = if path.contains('?') { '&' } else { '?' };
    format!("{path}{sep}timeout={}s", timeout.as_secs())
}
