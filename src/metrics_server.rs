//! Serves `/metrics` (Prometheus text format), `/healthz` and `/readyz` for a process.
//! Without a token, samples that identify a tenant (a `user` of `tenant:…`, any
//! `namespace`, `pod` or `tenant` label) are left out; a request bearing the metrics token
//! (`--metrics-token-file`, Prometheus' `credentials_file`) gets them all, and one bearing
//! another token is refused (401), so a misconfigured scrape shows as a failing target
//! rather than as missing series. The API port serves them all to the admin token too.

use std::net::SocketAddr;

use axum::Router;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus::Registry;

/// Binds `addr` and serves until the process ends; `token` reads every sample. Returns the
/// bound address.
pub async fn serve(
    addr: SocketAddr,
    registry: Registry,
    token: Option<String>,
) -> anyhow::Result<SocketAddr> {
    let token = std::sync::Arc::new(token);
    let app = Router::new()
        .route(
            "/metrics",
            get(move |headers: axum::http::HeaderMap| {
                let registry = registry.clone();
                let token = token.clone();
                async move {
                    match reader(&headers, token.as_deref()) {
                        Ok(all) => render(&registry, all).into_response(),
                        Err(why) => (StatusCode::UNAUTHORIZED, why).into_response(),
                    }
                }
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

/// Reads a metrics token file (`--metrics-token-file`).
pub fn read_token(path: &std::path::Path) -> anyhow::Result<String> {
    let t = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("reading --metrics-token-file {}: {e}", path.display()))?;
    let t = t.trim();
    if t.len() < 16 {
        anyhow::bail!(
            "--metrics-token-file {}: the token is {} characters; use at least 16 random ones",
            path.display(),
            t.len()
        );
    }
    Ok(t.to_owned())
}

/// Whether the request may read every sample: `Ok(false)` without a token, `Ok(true)` with
/// the metrics token, an error with any other.
fn reader(headers: &axum::http::HeaderMap, token: Option<&str>) -> Result<bool, &'static str> {
    let Some(given) = headers.get(header::AUTHORIZATION) else {
        return Ok(false);
    };
    let given = given
        .to_str()
        .ok()
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    match (given, token) {
        (Some(g), Some(t))
            if tessera_apiserver::auth::constant_time_eq(g.as_bytes(), t.as_bytes()) =>
        {
            Ok(true)
        }
        (_, None) => Err(
            "this metrics port has no metrics token (--metrics-token-file); scrape it without one\n",
        ),
        _ => Err(
            "the bearer token is not this metrics port's metrics token (--metrics-token-file)\n",
        ),
    }
}

fn render(registry: &Registry, all: bool) -> impl IntoResponse + use<> {
    let mut families = registry.gather();
    if !all {
        families = tessera_apiserver::metrics::without_tenants(families);
    }
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
