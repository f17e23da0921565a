//! Serving the API over TLS with bearer-token authentication.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::Request;
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::json;

use crate::pki::Credentials;

/// Paths anyone may read, as Kubernetes lets `system:anonymous` read them.
const PUBLIC: &[&str] = &["/version", "/healthz", "/livez", "/readyz"];

fn unauthorized(message: &str) -> Response {
    let status = json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": "Unauthorized",
        "code": 401,
    });
    (
        StatusCode::UNAUTHORIZED,
        [(header::CONTENT_TYPE, "application/json")],
        status.to_string(),
    )
        .into_response()
}

/// Requires `Authorization: Bearer <token>` on every path but the public ones.
pub fn authenticated(router: Router, admin_token: String) -> Router {
    let token = Arc::new(admin_token);
    router.layer(middleware::from_fn(move |req: Request, next: Next| {
        let token = token.clone();
        async move {
            if PUBLIC.contains(&req.uri().path()) {
                return next.run(req).await;
            }
            let given = req
                .headers()
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "));
            match given {
                Some(t) if t == token.as_str() => next.run(req).await,
                Some(_) => unauthorized("the bearer token is not valid: use the token from the kubeconfig that tessera wrote"),
                None => unauthorized("authentication required: send a bearer token (use the kubeconfig that tessera wrote)"),
            }
        }
    }))
}

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

/// Binds `addr` and serves `router` over TLS until the process ends; returns the bound address.
pub async fn serve_tls(
    addr: SocketAddr,
    credentials: &Credentials,
    router: Router,
) -> Result<SocketAddr, ServeError> {
    let certs = vec![
        CertificateDer::from_pem_slice(credentials.cert_pem.as_bytes())
            .map_err(|e| ServeError::Tls(format!("serving certificate: {e}")))?,
    ];
    let key = PrivateKeyDer::from_pem_slice(credentials.key_pem.as_bytes())
        .map_err(|e| ServeError::Tls(format!("serving key: {e}")))?;
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| ServeError::Tls(e.to_string()))?
    .with_no_client_auth()
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
    tokio::spawn(async move {
        loop {
            let (tcp, peer) = match listener.accept().await {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(error = %e, "accepting a connection failed");
                    continue;
                }
            };
            let acceptor = acceptor.clone();
            let service = TowerToHyperService::new(router.clone());
            tokio::spawn(async move {
                let tls = match acceptor.accept(tcp).await {
                    Ok(t) => t,
                    Err(e) => {
                        tracing::debug!(%peer, error = %e, "TLS handshake failed");
                        return;
                    }
                };
                if let Err(e) = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
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
