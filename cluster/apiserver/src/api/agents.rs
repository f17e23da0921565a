//! Reaching node agents, as kube-apiserver reaches kubelets: the agent's address is the
//! Node's `InternalIP` and `status.daemonEndpoints.kubeletEndpoint.Port`, over TLS trusting
//! only the CA the agent published on its Node ([`AGENT_CA_ANNOTATION`]), and each request
//! carries a short-lived credential for that one node ([`Tokens::node_token`]). Used by
//! `pods/log`, `metrics.k8s.io`, and `pods/exec`/`attach`/`portforward` ([`super::streams`]).

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::client::legacy::connect::HttpConnector;
use parking_lot::Mutex;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use serde_json::Value;

use super::{Api, now_secs};
use crate::auth::Tokens;
use crate::pki::AGENT_CA_ANNOTATION;
use crate::request::ApiRequest;
use crate::status::ApiError;

/// How long a node credential minted for one proxied request stays good.
const NODE_TOKEN_SECONDS: i64 = 60;

type AgentClient = HyperClient<hyper_rustls::HttpsConnector<HttpConnector>, Empty<Bytes>>;

/// Clients kept, one per agent CA; past this many (agents restarted often) they are all
/// dropped and made again as needed.
const MAX_AGENT_CLIENTS: usize = 4096;

/// What the API server needs to reach node agents.
#[derive(Clone)]
pub struct NodeProxy {
    tokens: Tokens,
    /// A client per agent CA (the PEM an agent published).
    clients: Arc<Mutex<HashMap<String, AgentClient>>>,
}

impl NodeProxy {
    /// Node agents reached with credentials rooted in `tokens`.
    pub fn new(tokens: Tokens) -> NodeProxy {
        NodeProxy {
            tokens,
            clients: Arc::default(),
        }
    }

    /// A client that trusts `ca_pem` alone.
    fn client(&self, ca_pem: &str) -> Result<AgentClient, String> {
        if let Some(c) = self.clients.lock().get(ca_pem) {
            return Ok(c.clone());
        }
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
            let cert = cert.map_err(|e| format!("its CA is not PEM: {e}"))?;
            roots
                .add(cert)
                .map_err(|e| format!("its CA is not a certificate: {e}"))?;
        }
        if roots.is_empty() {
            return Err("its CA holds no certificate".into());
        }
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
        let mut http = HttpConnector::new();
        http.set_connect_timeout(Some(std::time::Duration::from_secs(5)));
        http.enforce_http(false);
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(config)
            .https_only()
            .enable_http1()
            .wrap_connector(http);
        let client = HyperClient::builder(hyper_util::rt::TokioExecutor::new()).build(https);
        let mut clients = self.clients.lock();
        if clients.len() >= MAX_AGENT_CLIENTS {
            clients.clear();
        }
        clients.insert(ca_pem.to_owned(), client.clone());
        Ok(client)
    }
}

/// The agent address of a Node object: `ip:port`, if it serves one.
pub(crate) fn agent_address(node: &Value) -> Option<String> {
    let port = node["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"].as_u64()?;
    if port == 0 || port > u64::from(u16::MAX) {
        return None;
    }
    let ip = node["status"]["addresses"]
        .as_array()?
        .iter()
        .find(|a| a["type"] == "InternalIP")?["address"]
        .as_str()?
        .parse::<std::net::IpAddr>()
        .ok()?;
    Some(std::net::SocketAddr::new(ip, port as u16).to_string())
}

impl Api {
    /// `GET path` on node `node_name`'s agent, with a credential for that node: the answer
    /// if it is a 200, else the agent's `Status` as an error.
    pub(crate) async fn agent_get(
        &self,
        node_name: &str,
        path: &str,
    ) -> Result<hyper::Response<hyper::body::Incoming>, ApiError> {
        let node = self.agent_node(node_name).await?;
        self.agent_get_at(node_name, &node, path).await
    }

    /// The Node object a pod's agent is reached through (a 400 if it is gone).
    pub(crate) async fn agent_node(&self, node_name: &str) -> Result<Value, ApiError> {
        let mut node_req = ApiRequest::new(crate::request::Verb::Get, nodes());
        node_req.name = Some(node_name.to_owned());
        match self.get(&node_req).await {
            Ok(n) => Ok(n.into_value().unwrap_or(Value::Null)),
            Err(e) if e.code == 404 => Err(ApiError::bad_request(format!(
                "node {node_name} no longer exists"
            ))),
            Err(e) => Err(e),
        }
    }

    /// [`Api::agent_get`] for a Node object already read.
    pub(crate) async fn agent_get_at(
        &self,
        node_name: &str,
        node: &Value,
        path: &str,
    ) -> Result<hyper::Response<hyper::body::Incoming>, ApiError> {
        self.agent_request(node_name, node, path, &[]).await
    }

    /// `GET path` with `headers` on the agent of `node` (read already): the answer if it
    /// is a 200 or, for an upgrade the headers ask for, a 101; else the agent's `Status` as
    /// an error.
    pub(crate) async fn agent_request(
        &self,
        node_name: &str,
        node: &Value,
        path: &str,
        headers: &[(hyper::header::HeaderName, hyper::header::HeaderValue)],
    ) -> Result<hyper::Response<hyper::body::Incoming>, ApiError> {
        let Some(proxy) = &self.node_proxy else {
            return Err(ApiError::new(
                503,
                "ServiceUnavailable",
                "this API server has no credential for node agents, so it cannot reach them",
            ));
        };
        let Some(addr) = agent_address(node) else {
            return Err(ApiError::bad_request(format!(
                "node {node_name} has no agent endpoint (simulated nodes run no processes: their pods have no output or usage, and cannot be exec'd into or port-forwarded to)"
            )));
        };
        let Some(ca) = node["metadata"]["annotations"][AGENT_CA_ANNOTATION].as_str() else {
            return Err(ApiError::new(
                503,
                "ServiceUnavailable",
                format!(
                    "node {node_name} publishes no CA for its agent's endpoint ({AGENT_CA_ANNOTATION}): its agent predates TLS on that endpoint; upgrade it"
                ),
            ));
        };
        let http = proxy.client(ca).map_err(|why| {
            ApiError::internal(format!(
                "node {node_name}'s {AGENT_CA_ANNOTATION} cannot be used: {why}"
            ))
        })?;
        let token =
            proxy
                .tokens
                .node_token(node_name, now_secs() + NODE_TOKEN_SECONDS, "GET", path);
        let mut builder = hyper::Request::get(format!("https://{addr}{path}"))
            .header("authorization", format!("Bearer {token}"));
        for (name, value) in headers {
            builder = builder.header(name, value);
        }
        let request = builder
            .body(Empty::new())
            .map_err(|e| ApiError::internal(format!("building the agent request: {e}")))?;
        let unreachable = |e: &dyn std::fmt::Display| {
            let mut err = ApiError::new(
                503,
                "ServiceUnavailable",
                format!("the agent of node {node_name} at {addr} cannot be reached: {e}"),
            );
            err.retry_after = Some(1);
            err
        };
        let resp = http.request(request).await.map_err(|e| unreachable(&e))?;
        let code = resp.status().as_u16();
        if code == 200 || (code == 101 && !headers.is_empty()) {
            return Ok(resp);
        }
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| unreachable(&e))?
            .to_bytes();
        if code == 401 {
            // Not the caller's fault: the agent does not trust this server's credentials.
            return Err(ApiError::internal(format!(
                "the agent of node {node_name} refused this API server's node credential: the agent and the API server must share the admin token"
            )));
        }
        // The agent answers a Kubernetes Status; it is passed on as it is.
        Err(crate::client::status_error(code, &body))
    }
}

/// The core `nodes` resource.
pub(super) fn nodes() -> &'static crate::catalog::Resource {
    crate::request::find_resource("", "v1", "nodes").expect("nodes are served")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_agent_address_comes_from_the_node_status() {
        let node = json!({"status": {"addresses": [{"type": "Hostname", "address": "n"},
            {"type": "InternalIP", "address": "127.0.0.1"}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}}}});
        assert_eq!(agent_address(&node).as_deref(), Some("127.0.0.1:10250"));
        let mut no_port = node.clone();
        no_port["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"] = json!(0);
        assert_eq!(agent_address(&no_port), None);
        let mut bad_ip = node;
        bad_ip["status"]["addresses"][1]["address"] = json!("not-an-ip");
        assert_eq!(agent_address(&bad_ip), None);
    }
}
