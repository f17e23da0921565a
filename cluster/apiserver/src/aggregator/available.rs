//! The availability of APIServices served by extension servers, checked as
//! kube-aggregator's availability controller does: the Service exists and has the port,
//! its Endpoints have an address for it, and the extension server answers
//! `GET /apis/<group>/<version>` with a resource list — asked as `system:kube-aggregator`
//! in `system:masters` through the front proxy. The answer is what discovery serves for
//! the group-version; the outcome is the APIService's `Available` condition
//! (`Passed`, `ServiceNotFound`, `ServicePortError`, `MissingEndpoints`,
//! `FailedDiscoveryCheck`), written only when it changes.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use http_body_util::Full;
use serde_json::{Value, json};

use super::{GROUP_HEADER, Remote, USER_HEADER};
use crate::api::Api;
use crate::catalog::APIREGISTRATION;
use crate::client::Client;
use crate::request::PatchType;

/// How often every APIService is checked (besides on every change of one).
pub const PERIOD: Duration = Duration::from_secs(10);

/// Longest one check may take.
const CHECK_TIMEOUT: Duration = Duration::from_secs(5);

/// Largest discovery document read from an extension server.
const MAX_DISCOVERY: usize = 4 << 20;

/// The user the checks are made as (kube-aggregator's).
pub const CHECK_USER: &str = "system:kube-aggregator";

/// One check's outcome: the condition's status, reason and message, and the resource list
/// if the extension server gave one.
#[derive(Debug, PartialEq)]
pub struct Outcome {
    /// `True` or `False`.
    pub status: &'static str,
    /// The reason.
    pub reason: &'static str,
    /// The message.
    pub message: String,
    /// The extension's `APIResourceList`.
    pub resources: Option<Value>,
}

fn failed(reason: &'static str, message: String) -> Outcome {
    Outcome {
        status: "False",
        reason,
        message,
        resources: None,
    }
}

/// Checks `remote` once.
pub async fn check(api: &Api, remote: &Remote) -> Outcome {
    let Some(transport) = api.aggregator().transport() else {
        return failed(
            "FailedDiscoveryCheck",
            format!(
                "this API server has no front-proxy certificate ({} is missing from its pki directory)",
                crate::pki::FRONT_PROXY_CA[0]
            ),
        );
    };
    let addr = match api
        .service_address(&remote.namespace, &remote.service, remote.port)
        .await
    {
        Ok(a) => a,
        Err(t) => return failed(t.reason, t.message),
    };
    let path = format!("/apis/{}/{}", remote.group, remote.version);
    let url = format!("https://{addr}{path}");
    let request = hyper::Request::get(path.as_str())
        .header(
            hyper::header::HOST,
            format!("{}:{}", remote.server_name(), remote.port),
        )
        .header(hyper::header::ACCEPT, "application/json")
        .header(USER_HEADER, CHECK_USER)
        .header(GROUP_HEADER, crate::auth::MASTERS_GROUP)
        .header(GROUP_HEADER, crate::auth::AUTHENTICATED_GROUP)
        .body(Full::new(Bytes::new()));
    let request = match request {
        Ok(r) => r,
        Err(e) => return failed("FailedDiscoveryCheck", e.to_string()),
    };
    let key = (addr, remote.server_name(), remote.ca_pem.clone());
    let fetch = async {
        let (parts, body) = transport.send(key, request).await?;
        let mut bytes = Vec::new();
        let mut body = body.into_data_stream();
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(|e| e.to_string())?;
            if bytes.len() + chunk.len() > MAX_DISCOVERY {
                return Err(format!("the answer is larger than {MAX_DISCOVERY} bytes"));
            }
            bytes.extend_from_slice(&chunk);
        }
        if parts.status != hyper::StatusCode::OK {
            let text = String::from_utf8_lossy(&bytes[..bytes.len().min(256)]).into_owned();
            return Err(format!("bad status from {url}: {} {text}", parts.status));
        }
        let list: Value = serde_json::from_slice(&bytes)
            .map_err(|e| format!("the answer is not an APIResourceList: {e}"))?;
        if !list["resources"].is_array() {
            return Err("the answer is not an APIResourceList (no resources)".to_owned());
        }
        Ok::<Value, String>(list)
    };
    match tokio::time::timeout(CHECK_TIMEOUT, fetch).await {
        Ok(Ok(list)) => Outcome {
            status: "True",
            reason: "Passed",
            message: "all checks passed".to_owned(),
            resources: Some(list),
        },
        Ok(Err(e)) => failed(
            "FailedDiscoveryCheck",
            format!("failing or missing response from {url}: {e}"),
        ),
        Err(_) => failed(
            "FailedDiscoveryCheck",
            format!(
                "failing or missing response from {url}: no answer within {} s",
                CHECK_TIMEOUT.as_secs()
            ),
        ),
    }
}

/// Writes `outcome` as `remote`'s `Available` condition unless it already says so.
async fn record(client: &dyn Client, remote: &Remote, outcome: &Outcome) -> Result<(), String> {
    let res = crate::request::find_resource(APIREGISTRATION, "v1", "apiservices")
        .map_err(|e| e.message)?;
    let current = client
        .get(res, None, &remote.name)
        .await
        .map_err(|e| e.message)?;
    let same = current["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| {
            c["type"] == "Available"
                && c["status"] == outcome.status
                && c["reason"] == outcome.reason
                && c["message"] == json!(outcome.message)
        });
    if same {
        return Ok(());
    }
    let patch = json!({"status": {"conditions": [{"type": "Available", "status": outcome.status,
        "reason": outcome.reason, "message": outcome.message}]}});
    client
        .patch(
            res,
            None,
            &remote.name,
            Some("status"),
            PatchType::Merge,
            &patch,
        )
        .await
        .map(|_| ())
        .map_err(|e| e.message)
}

/// Checks every APIService served by an extension server now, after every change, and every
/// [`PERIOD`], recording each outcome through `client`; runs until the process ends.
pub async fn run(api: Api, client: Arc<dyn Client>) {
    let aggregator = api.aggregator().clone();
    loop {
        let changed = aggregator.changed.clone();
        let woken = changed.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        match aggregator.routes().await {
            Ok(routes) => {
                let remotes = routes.in_order();
                aggregator.forget_others(&remotes);
                let checks = remotes.iter().map(|r| {
                    let api = &api;
                    let client = &client;
                    let aggregator = &aggregator;
                    async move {
                        let outcome = check(api, r).await;
                        if let Some(m) = api.metrics() {
                            m.unavailable_apiservices
                                .with_label_values(&[r.name.as_str()])
                                .set(i64::from(outcome.status != "True"));
                        }
                        if outcome.status != "True" {
                            tracing::debug!(apiservice = %r.name, reason = outcome.reason,
                                message = %outcome.message, "an APIService is not available");
                        }
                        aggregator.set_discovered(&r.name, outcome.resources.clone());
                        if let Err(e) = record(client.as_ref(), r, &outcome).await {
                            tracing::warn!(apiservice = %r.name, error = %e,
                                "recording an APIService's availability");
                        }
                    }
                });
                futures::future::join_all(checks).await;
            }
            Err(e) => tracing::warn!(error = %e.message, "reading APIServices"),
        }
        tokio::select! {
            _ = tokio::time::sleep(PERIOD) => {}
            _ = woken => {}
        }
    }
}
