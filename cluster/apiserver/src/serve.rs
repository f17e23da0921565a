//! Serving the API over TLS.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use parking_lot::Mutex;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::pki::Credentials;

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The certificate or key could not be used.
    #[error("TLS setup: {0}")]
    Tls(String),
    /// The address could not be bound.
    #[error("binding {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// How long and how many: what keeps slow or piled-up connections from exhausting the server.
#[derive(Clone, Copy, Debug)]
pub struct ConnectionLimits {
    /// A TLS handshake not finished in this long is dropped.
    pub handshake_timeout: Duration,
    /// HTTP/1 request headers not complete in this long: the connection is closed (hyper's
    /// `header_read_timeout`; kube-apiserver's Go server uses 32 s).
    pub header_timeout: Duration,
    /// HTTP/2: a PING every this long; a peer that does not answer within it is dropped.
    pub keep_alive: Duration,
    /// Connections open at once, from everyone.
    pub max_connections: usize,
    /// Connections open at once from one client address.
    pub max_per_client: usize,
    /// A write to the client that makes no progress for this long closes the connection (a
    /// client that stopped reading: its answer and watch buffers are freed; Go's
    /// `WriteTimeout` plays this part in kube-apiserver). A watch that waits for events
    /// writes nothing and is not affected.
    pub write_timeout: Duration,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            handshake_timeout: Duration::from_secs(10),
            header_timeout: Duration::from_secs(32),
            keep_alive: Duration::from_secs(30),
            max_connections: 16_384,
            max_per_client: 4_096,
            write_timeout: Duration::from_secs(60),
        }
    }
}

/// Open connections per client address; a slot is given back when its guard drops.
#[derive(Default)]
struct Slots {
    total: usize,
    by_client: HashMap<IpAddr, usize>,
}

struct Slot {
    slots: Arc<Mutex<Slots>>,
    client: IpAddr,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut s = self.slots.lock();
        s.total -= 1;
        if let Some(n) = s.by_client.get_mut(&self.client) {
            *n -= 1;
            if *n == 0 {
                s.by_client.remove(&self.client);
            }
        }
    }
}

fn take_slot(slots: &Arc<Mutex<Slots>>, client: IpAddr, limits: &ConnectionLimits) -> Option<Slot> {
    let mut s = slots.lock();
    let mine = s.by_client.get(&client).copied().unwrap_or(0);
    if s.total >= limits.max_connections || mine >= limits.max_per_client {
        return None;
    }
    s.total += 1;
    *s.by_client.entry(client).or_insert(0) += 1;
    Some(Slot {
        slots: slots.clone(),
        client,
    })
}

/// Binds `addr` and serves `router` over TLS until the process ends, with the default
/// [`ConnectionLimits`]; returns the bound address.
pub async fn serve_tls(
    addr: SocketAddr,
    credentials: &Credentials,
    router: Router,
) -> Result<SocketAddr, ServeError> {
    serve_tls_with(addr, credentials, router, ConnectionLimits::default()).await
}

/// [`serve_tls`] with explicit limits.
pub async fn serve_tls_with(
    addr: SocketAddr,
    credentials: &Credentials,
    router: Router,
    limits: ConnectionLimits,
) -> Result<SocketAddr, ServeError> {
    serve_tls_inner(
        addr,
        &credentials.cert_pem,
        &credentials.key_pem,
        Some(&credentials.ca_pem),
        router,
        limits,
    )
    .await
}

/// What the TLS connection a request came on says of its client certificate: none was
/// sent (`None` in the request's extensions), or one verified against the CA names a
/// caller, or names none (why).
#[derive(Clone, Debug)]
pub struct ClientCert(pub Result<crate::client_certs::ClientIdentity, String>);

/// Binds `addr` and serves `router` over TLS with the certificate and key given as PEM (a
/// node agent's endpoint); returns the bound address.
pub async fn serve_tls_pem(
    addr: SocketAddr,
    cert_pem: &str,
    key_pem: &str,
    router: Router,
    limits: ConnectionLimits,
) -> Result<SocketAddr, ServeError> {
    serve_tls_inner(addr, cert_pem, key_pem, None, router, limits).await
}

/// [`serve_tls_pem`], verifying client certificates against `client_ca` (PEM) as the API
/// server does (an extension API server checking the front proxy's certificate).
pub async fn serve_tls_pem_verifying(
    addr: SocketAddr,
    cert_pem: &str,
    key_pem: &str,
    client_ca: &str,
    router: Router,
    limits: ConnectionLimits,
) -> Result<SocketAddr, ServeError> {
    serve_tls_inner(addr, cert_pem, key_pem, Some(client_ca), router, limits).await
}

/// [`serve_tls_pem`], also verifying the client certificates clients send against
/// `client_ca` (PEM) when given: a verified one is handed to each request on the
/// connection as a [`ClientCert`]; a connection without one is served as well (its requests
/// authenticate with bearer tokens); one with a certificate the CA did not sign fails its
/// handshake.
async fn serve_tls_inner(
    addr: SocketAddr,
    cert_pem: &str,
    key_pem: &str,
    client_ca: Option<&str>,
    router: Router,
    limits: ConnectionLimits,
) -> Result<SocketAddr, ServeError> {
    let certs = vec![
        CertificateDer::from_pem_slice(cert_pem.as_bytes())
            .map_err(|e| ServeError::Tls(format!("serving certificate: {e}")))?,
    ];
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes())
        .map_err(|e| ServeError::Tls(format!("serving key: {e}")))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| ServeError::Tls(e.to_string()))?;
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(pem) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in CertificateDer::pem_slice_iter(pem.as_bytes()) {
                let cert = cert.map_err(|e| ServeError::Tls(format!("client CA: {e}")))?;
                roots
                    .add(cert)
                    .map_err(|e| ServeError::Tls(format!("client CA: {e}")))?;
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .allow_unauthenticated()
            .build()
            .map_err(|e| ServeError::Tls(format!("client CA: {e}")))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder
        .with_single_cert(certs, key)
        .map_err(|e| ServeError::Tls(e.to_string()))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| ServeError::Bind { addr, source })?;
    let bound = listener
        .local_addr()
        .map_err(|source| ServeError::Bind { addr, source })?;
    let slots = Arc::new(Mutex::new(Slots::default()));
    tokio::spawn(async move {
        // Accept errors (out of file descriptors, most often) back off, as Go's net/http
        // does, instead of spinning.
        let mut backoff = Duration::from_millis(5);
        loop {
            let (tcp, peer) = match listener.accept().await {
                Ok(c) => {
                    backoff = Duration::from_millis(5);
                    c
                }
                Err(e) => {
                    tracing::warn!(error = %e, retry_in = ?backoff, "accepting a connection failed");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                    continue;
                }
            };
            let Some(slot) = take_slot(&slots, peer.ip(), &limits) else {
                tracing::debug!(%peer, "too many connections; closing this one");
                drop(tcp);
                continue;
            };
            let acceptor = acceptor.clone();
            let service = TowerToHyperService::new(router.clone());
            tokio::spawn(async move {
                let _slot = slot;
                // As Go's net/http does: a response written in more than one piece (TLS
                // records, a streamed body) is not held back waiting for the peer's ACK.
                let _ = tcp.set_nodelay(true);
                let tcp = WriteTimeout::new(tcp, limits.write_timeout);
                let tls = match tokio::time::timeout(limits.handshake_timeout, acceptor.accept(tcp))
                    .await
                {
                    Ok(Ok(t)) => t,
                    Ok(Err(e)) => {
                        tracing::debug!(%peer, error = %e, "TLS handshake failed");
                        return;
                    }
                    Err(_) => {
                        tracing::debug!(%peer, "TLS handshake timed out");
                        return;
                    }
                };
                // A verified client certificate is read once per connection, and every
                // request on it carries what it says.
                let client_cert = tls
                    .get_ref()
                    .1
                    .peer_certificates()
                    .and_then(|c| c.first())
                    .map(|c| ClientCert(crate::client_certs::identity_of(c)));
                let service = hyper::service::service_fn(
                    move |mut req: hyper::Request<hyper::body::Incoming>| {
                        if let Some(c) = &client_cert {
                            req.extensions_mut().insert(c.clone());
                        }
                        hyper::service::Service::call(&service, req)
                    },
                );
                let mut builder =
                    hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                builder
                    .http1()
                    .timer(TokioTimer::new())
                    .header_read_timeout(limits.header_timeout);
                builder
                    .http2()
                    .timer(TokioTimer::new())
                    .keep_alive_interval(Some(limits.keep_alive))
                    .keep_alive_timeout(limits.keep_alive);
                if let Err(e) = builder
                    .serve_connection_with_upgrades(TokioIo::new(tls), service)
                    .await
                {
                    tracing::debug!(%peer, error = %e, "connection ended with an error");
                }
            });
        }
    });
    Ok(bound)
}

/// A connection whose writes fail with `TimedOut` once one has waited `limit` without the
/// peer taking a byte. The clock runs only while a write is blocked: idle connections and
/// quiet watches are not timed.
struct WriteTimeout<S> {
    inner: S,
    limit: Duration,
    blocked: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<S> WriteTimeout<S> {
    fn new(inner: S, limit: Duration) -> Self {
        WriteTimeout {
            inner,
            limit,
            blocked: None,
        }
    }

    /// After a write call: progress stops the clock; a blocked write starts it (once) and
    /// fails when it runs out.
    fn watch<T>(
        &mut self,
        cx: &mut Context<'_>,
        poll: Poll<std::io::Result<T>>,
    ) -> Poll<std::io::Result<T>> {
        match poll {
            Poll::Ready(r) => {
                self.blocked = None;
                Poll::Ready(r)
            }
            Poll::Pending => {
                let limit = self.limit;
                let timer = self
                    .blocked
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
                ready!(timer.as_mut().poll(cx));
                Poll::Ready(Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("the client read nothing for {} s", limit.as_secs()),
                )))
            }
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for WriteTimeout<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for WriteTimeout<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let poll = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.watch(cx, poll)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let poll = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.watch(cx, poll)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let poll = Pin::new(&mut self.inner).poll_flush(cx);
        self.watch(cx, poll)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let poll = Pin::new(&mut self.inner).poll_shutdown(cx);
        self.watch(cx, poll)
    }
}
