//! `pods/exec`, `pods/attach` and `pods/portforward`: the API server authorizes the caller
//! (verb `create` on the subresource, as Kubernetes asks of WebSocket upgrades too), checks
//! the pod and its container, and proxies the upgrade to the agent of the pod's node with a
//! node credential ([`super::agents`]), as kube-apiserver proxies to the kubelet. Once both
//! hops have switched protocols the bytes are spliced through: the agent speaks the
//! streaming protocol (WebSocket `v5.channel.k8s.io`, SPDY/3.1 `portforward.k8s.io`) itself.

use hyper::header::{HeaderMap, HeaderName, HeaderValue};
use serde_json::Value;

use super::Api;
use crate::auth::User;
use crate::request::{ApiRequest, Verb};
use crate::status::ApiError;

/// The request headers an upgrade carries to the agent.
const UPGRADE_HEADERS: [&str; 6] = [
    "connection",
    "upgrade",
    "sec-websocket-key",
    "sec-websocket-version",
    "sec-websocket-protocol",
    "x-stream-protocol-version",
];

/// The answer headers an upgrade carries back to the client.
pub const SWITCHED_HEADERS: [&str; 5] = [
    "connection",
    "upgrade",
    "sec-websocket-accept",
    "sec-websocket-protocol",
    "x-stream-protocol-version",
];

fn pods() -> &'static crate::catalog::Resource {
    crate::request::find_resource("", "v1", "pods").expect("pods are served")
}

/// The query without the parameters the API server sets itself.
fn passed_on(query: &str) -> String {
    query
        .split('&')
        .filter(|p| !p.is_empty() && !p.starts_with("podUID="))
        .collect::<Vec<_>>()
        .join("&")
}

impl Api {
    /// Counts a `pods/{sub}` request in the request metrics (101 when it switched).
    pub fn observe_stream(&self, sub: &str, code: u16, started: std::time::Instant) {
        if let Some(m) = &self.metrics {
            m.observe(Verb::Create, pods(), Some(sub), code, started.elapsed());
        }
    }

    /// Opens `sub` (`exec`, `attach`, `portforward`) of pod `ns`/`name` for `user`: the
    /// agent's switching-protocols answer, whose connection the caller splices to the
    /// client's.
    pub async fn pod_stream(
        &self,
        user: &User,
        ns: &str,
        name: &str,
        sub: &str,
        query: &str,
        headers: &HeaderMap,
    ) -> Result<hyper::Response<hyper::body::Incoming>, ApiError> {
        let mut req = ApiRequest::new(Verb::Create, pods());
        req.namespace = Some(ns.to_owned());
        req.name = Some(name.to_owned());
        req.subresource = Some(sub.to_owned());
        self.authorizer.authorize(user, &req).await?;
        if self.across(req.resource).is_some() {
            return Err(ApiError::bad_request(format!(
                "pods/{sub} is served by the shard that runs the pod, not by the federation: run kubectl against that shard (`kubectl get pod {name} -n {ns}` here shows it in the SHARD column)"
            )));
        }
        let upgrade = headers
            .get("upgrade")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        if upgrade.is_empty() {
            return Err(ApiError::bad_request("Upgrade request required"));
        }
        let mut get = ApiRequest::new(Verb::Get, pods());
        get.namespace = Some(ns.to_owned());
        get.name = Some(name.to_owned());
        let pod = self.get(&get).await?.into_value().unwrap_or(Value::Null);
        let phase = pod["status"]["phase"].as_str().unwrap_or_default();
        if matches!(phase, "Succeeded" | "Failed") {
            let what = match sub {
                "exec" => "exec into a container in",
                "attach" => "attach to a container in",
                _ => "port-forward to",
            };
            return Err(ApiError::bad_request(format!(
                "cannot {what} a completed pod; current phase is {phase}"
            )));
        }
        let Some(node_name) = pod["spec"]["nodeName"].as_str() else {
            return Err(ApiError::bad_request(format!(
                "pod {name} does not have a host assigned: it has not been scheduled yet (kubectl describe pod {name} tells why)"
            )));
        };
        let uid = pod["metadata"]["uid"].as_str().unwrap_or_default();
        let path = match sub {
            "portforward" => format!("/portForward/{ns}/{name}?podUID={uid}&{}", passed_on(query)),
            _ => {
                let asked = query
                    .split('&')
                    .find_map(|p| p.strip_prefix("container="))
                    .map(crate::request::percent_decode)
                    .transpose()?;
                let container = super::logs::container_of(&pod, name, asked.as_deref())?;
                let rest = passed_on(query);
                let verb = if sub == "exec" { "exec" } else { "attach" };
                format!("/{verb}/{ns}/{name}/{container}?podUID={uid}&{rest}")
            }
        };
        let node = self.agent_node(node_name).await?;
        let forwarded: Vec<(HeaderName, HeaderValue)> = UPGRADE_HEADERS
            .iter()
            .flat_map(|h| {
                headers
                    .get_all(*h)
                    .iter()
                    .map(move |v| (HeaderName::from_static(h), v.clone()))
            })
            .collect();
        tracing::info!(namespace = %ns, pod = %name, %sub, node = %node_name, user = %user.name(), "streaming to a pod");
        self.agent_request(node_name, &node, &path, &forwarded)
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_servers_own_parameters_are_not_passed_on() {
        assert_eq!(
            passed_on("command=ls&podUID=evil&stdout=true"),
            "command=ls&stdout=true"
        );
    }
}
