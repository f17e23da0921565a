//! `pods/log`: the API server finds the pod's node and asks that node's agent for the
//! container's output, as kube-apiserver asks the kubelet. The agent's address is the Node's
//! `InternalIP` and `status.daemonEndpoints.kubeletEndpoint.Port`; the request carries a
//! short-lived credential for that one node ([`Tokens::node_token`]) and the pod's UID, so a
//! pod deleted and created again under the same name never shows the old one's output.
//! The answer streams through as it comes (`follow`).

use bytes::Bytes;
use futures::StreamExt;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::client::legacy::connect::HttpConnector;
use serde_json::Value;

use super::{Api, ApiResponse, now_secs};
use crate::auth::Tokens;
use crate::request::ApiRequest;
use crate::status::ApiError;

/// How long a node credential minted for one proxied request stays good.
const NODE_TOKEN_SECONDS: i64 = 60;

/// What the API server needs to reach node agents.
#[derive(Clone)]
pub struct NodeProxy {
    tokens: Tokens,
    http: HyperClient<HttpConnector, Empty<Bytes>>,
}

impl NodeProxy {
    /// Node agents reached with credentials rooted in `tokens`.
    pub fn new(tokens: Tokens) -> NodeProxy {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(std::time::Duration::from_secs(5)));
        NodeProxy {
            tokens,
            http: HyperClient::builder(hyper_util::rt::TokioExecutor::new()).build(connector),
        }
    }
}

fn bad(message: String) -> ApiError {
    ApiError::bad_request(message)
}

/// The container a log read is for: the one named, or the pod's only one.
fn container_of(pod: &Value, name: &str, asked: Option<&str>) -> Result<String, ApiError> {
    let names = |field: &str| -> Vec<String> {
        pod["spec"][field]
            .as_array()
            .map(|cs| {
                cs.iter()
                    .filter_map(|c| c["name"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    };
    let containers = names("containers");
    let init = names("initContainers");
    match asked {
        Some(c) if containers.iter().chain(&init).any(|n| n == c) => Ok(c.to_owned()),
        Some(c) => Err(bad(format!(
            "container {c} is not valid for pod {name}: its containers are [{}]",
            containers.join(" ")
        ))),
        None if containers.len() == 1 => Ok(containers[0].clone()),
        None => Err(bad(format!(
            "a container name must be specified for pod {name}, choose one of: [{}]",
            containers.join(" ")
        ))),
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
    /// `GET .../pods/NAME/log`.
    pub(super) async fn logs(&self, req: &ApiRequest) -> Result<ApiResponse, ApiError> {
        let opts = &req.params.log;
        let name = req.name.as_deref().unwrap_or_default();
        if let Some(why) = opts.problems() {
            return Err(ApiError::new(
                422,
                "Invalid",
                format!("PodLogOptions \"{name}\" is invalid: {why}"),
            ));
        }
        let pod = self.get(req).await?.into_value().unwrap_or(Value::Null);
        let container = container_of(&pod, name, opts.container.as_deref())?;
        let Some(node_name) = pod["spec"]["nodeName"].as_str() else {
            return Err(bad(format!(
                "pod {name} does not have a host assigned: it has not been scheduled yet (kubectl describe pod {name} tells why)"
            )));
        };
        let ns = req.namespace.as_deref().unwrap_or_default();
        let uid = pod["metadata"]["uid"].as_str().unwrap_or_default();
        let mut query = format!("podUID={uid}");
        let rest = opts.to_query();
        if !rest.is_empty() {
            query.push('&');
            query.push_str(&rest);
        }
        let resp = self
            .agent_get(
                node_name,
                &format!("/containerLogs/{ns}/{name}/{container}?{query}"),
            )
            .await?;
        let stream = resp
            .into_body()
            .into_data_stream()
            .map(|chunk| chunk.map_err(std::io::Error::other));
        Ok(ApiResponse::Stream {
            content_type: "text/plain",
            body: Box::pin(stream),
        })
    }
}

impl Api {
    /// `GET path` on node `node_name`'s agent, with a credential for that node: the answer
    /// if it is a 200, else the agent's `Status` as an error.
    pub(crate) async fn agent_get(
        &self,
        node_name: &str,
        path: &str,
    ) -> Result<hyper::Response<hyper::body::Incoming>, ApiError> {
        let mut node_req = ApiRequest::new(crate::request::Verb::Get, nodes());
        node_req.name = Some(node_name.to_owned());
        let node = match self.get(&node_req).await {
            Ok(n) => n.into_value().unwrap_or(Value::Null),
            Err(e) if e.code == 404 => {
                return Err(bad(format!("node {node_name} no longer exists")));
            }
            Err(e) => return Err(e),
        };
        self.agent_get_at(node_name, &node, path).await
    }

    /// [`Api::agent_get`] for a Node object already read.
    pub(crate) async fn agent_get_at(
        &self,
        node_name: &str,
        node: &Value,
        path: &str,
    ) -> Result<hyper::Response<hyper::body::Incoming>, ApiError> {
        let Some(proxy) = &self.node_proxy else {
            return Err(ApiError::new(
                503,
                "ServiceUnavailable",
                "this API server has no credential for node agents, so it cannot reach them",
            ));
        };
        let Some(addr) = agent_address(node) else {
            return Err(bad(format!(
                "node {node_name} has no agent endpoint (simulated nodes run no processes: their pods have no output or usage)"
            )));
        };
        let token = proxy
            .tokens
            .node_token(node_name, now_secs() + NODE_TOKEN_SECONDS);
        let request = hyper::Request::get(format!("http://{addr}{path}"))
            .header("authorization", format!("Bearer {token}"))
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
        let resp = proxy
            .http
            .request(request)
            .await
            .map_err(|e| unreachable(&e))?;
        let code = resp.status().as_u16();
        if code == 200 {
            return Ok(resp);
        }
        // The agent answers a Kubernetes Status; it is passed on as it is.
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| unreachable(&e))?
            .to_bytes();
        let status: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        if code == 401 {
            // Not the caller's fault: the agent does not trust this server's credentials.
            return Err(ApiError::internal(format!(
                "the agent of node {node_name} refused this API server's node credential: the agent and the API server must share the admin token"
            )));
        }
        Err(ApiError::new(
            code,
            match status["reason"].as_str() {
                Some("BadRequest") => "BadRequest",
                Some("NotFound") => "NotFound",
                Some("Forbidden") => "Forbidden",
                Some("ServiceUnavailable") => "ServiceUnavailable",
                _ => "InternalError",
            },
            status["message"].as_str().map_or_else(
                || String::from_utf8_lossy(&body).into_owned(),
                str::to_owned,
            ),
        ))
    }
}

fn nodes() -> &'static crate::catalog::Resource {
    crate::request::find_resource("", "v1", "nodes").expect("nodes are served")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_container_is_named_or_the_only_one() {
        let one = json!({"spec": {"containers": [{"name": "main"}]}});
        assert_eq!(container_of(&one, "p", None).expect("only"), "main");
        assert_eq!(
            container_of(&one, "p", Some("main")).expect("named"),
            "main"
        );
        let e = container_of(&one, "p", Some("side")).expect_err("unknown");
        assert!(e.message.contains("container side is not valid for pod p"));
        let two = json!({"spec": {"containers": [{"name": "a"}, {"name": "b"}],
            "initContainers": [{"name": "init"}]}});
        let e = container_of(&two, "p", None).expect_err("ambiguous");
        assert_eq!(e.code, 400);
        assert!(e.message.contains("choose one of: [a b]"), "{}", e.message);
        assert_eq!(container_of(&two, "p", Some("init")).expect("init"), "init");
    }

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
