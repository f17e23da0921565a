//! Serves `/metrics` (Prometheus text format), `/healthz` and `/readyz` for a process. The
//! port takes no token, so samples that identify a tenant (a `user` of `tenant:…`, any
//! `namespace`, `pod` or `tenant` label) are left out; the API port serves them all to the
//! admin token.

use std::net::SocketAddr;

use axum::Router;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus::Registry;

/// Binds `addr` and serves until the process ends. Returns the bound address.
pub async fn serve(addr: SocketAddr, registry: Registry) -> anyhow::Result<SocketAddr> {
    let app = Router::new()
        .route(
            "/metrics",
            get(move || {
                let registry = registry.clone();
                async move { render(&registry) }
            }),
        )
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(|| async { "ok" }))
        .route("/livez", get(|| async { "ok" }));
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "metrics server stopped");
        }
    });
    Ok(bound)
}

fn render(registry: &Registry) -> impl IntoResponse + use<> {
    let families = tessera_apiserver::metrics::without_tenants(registry.gather());
    match tessera_apiserver::metrics::render(&families) {
        Ok(buf) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
            buf,
        ),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            [(header::CONTENT_TYPE, "text/plain")],
            e.into_bytes(),
        ),
    }
}
