//! `pods/exec`, `pods/attach` and `pods/portforward`: the API server authorizes the caller
//! (verb `create` on the subresource, as Kubernetes asks of WebSocket upgrades too), checks
//! the pod and its container, and proxies the upgrade to the agent of the pod's node with a
//! node credential ([`super::agents`]), as kube-apiserver proxies to the kubelet. Once both
//! hops have switched protocols the bytes are spliced through: the agent speaks the
//! streaming protocol (WebSocket `v5.channel.k8s.io`, SPDY/3.1 `portforward.k8s.io`) itself.

use hyper::header::{HeaderName, HeaderValue};
use serde_json::Value;
use tessera_client::client::{PodStreamRequest, Switched, switched_headers};

use super::Api;
use crate::auth::User;
use crate::request::{ApiRequest, Verb};
use crate::status::ApiError;

fn pods() -> &'static crate::catalog::Resource {
    crate::request::find_resource("", "v1", "pods").expect("pods are served")
}

/// The kind of the options a connection to `req`'s subresource carries, as admission sees
/// them.
pub(super) fn options_kind(req: &ApiRequest) -> &'static str {
    match req.subresource.as_deref() {
        Some("attach") => "PodAttachOptions",
        Some("portforward") => "PodPortForwardOptions",
        _ => "PodExecOptions",
    }
}

/// The options of a connection as admission webhooks and policies see them (the object of
/// a CONNECT): `PodExecOptions` (command, container, streams, tty), `PodAttachOptions`,
/// `PodPortForwardOptions` (ports), read from the query.
fn connect_options(req: &ApiRequest, query: &str) -> Result<Value, ApiError> {
    let mut command = Vec::new();
    let mut ports = Vec::new();
    let mut opts = serde_json::Map::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let v = crate::request::percent_decode(v)?;
        match k {
            "command" => command.push(Value::String(v)),
            "ports" => {
                for p in v.split(',').filter(|p| !p.is_empty()) {
                    let port: u16 = p.parse().map_err(|_| {
                        ApiError::bad_request(format!("ports: {p:?} is not a port number"))
                    })?;
                    ports.push(Value::from(port));
                }
            }
            "container" => {
                opts.insert(k.to_owned(), Value::String(v));
            }
            "stdin" | "stdout" | "stderr" | "tty" => {
                opts.insert(
                    k.to_owned(),
                    Value::Bool(matches!(v.as_str(), "true" | "1")),
                );
            }
            _ => {}
        }
    }
    let kind = options_kind(req);
    let mut out = serde_json::Map::new();
    out.insert("kind".into(), Value::from(kind));
    out.insert("apiVersion".into(), Value::from("v1"));
    match kind {
        "PodPortForwardOptions" => {
            if !ports.is_empty() {
                out.insert("ports".into(), Value::Array(ports));
            }
        }
        _ => {
            out.extend(opts);
            if kind == "PodExecOptions" {
                out.insert("command".into(), Value::Array(command));
            }
        }
    }
    Ok(Value::Object(out))
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
    /// Admission of a connection (operation CONNECT, the options as the object): the
    /// validating admission policies and webhooks that select it may refuse it.
    /// (Mutating webhooks are not called for connections: the options they could change
    /// are the client's command line.)
    async fn admit_connect(
        &self,
        user: &User,
        req: &ApiRequest,
        query: &str,
    ) -> Result<(), ApiError> {
        let Some(mut a) = self
            .admission(req, user, crate::webhooks::Operation::Connect)
            .await?
        else {
            return Ok(());
        };
        let options = connect_options(req, query)?;
        let mut warnings = Vec::new();
        self.validate_by_webhooks(&mut a, Some(&options), None, &mut warnings)
            .await?;
        for w in warnings {
            tracing::info!(namespace = ?req.namespace, pod = ?req.name, warning = %w, "admission warning on a pod connection");
        }
        Ok(())
    }

    /// Counts a `pods/{sub}` request in the request metrics (101 when it switched).
    pub fn observe_stream(&self, sub: &str, code: u16, started: std::time::Instant) {
        if let Some(m) = &self.metrics {
            m.observe(Verb::Create, pods(), Some(sub), code, started.elapsed());
        }
    }

    /// Opens `stream` (a pod's `exec`, `attach` or `portforward`) for `user`: the agent's
    /// protocol switch, whose connection the caller splices to the client's. At the
    /// federation, the shard that holds the pod opens it and the bytes come through the
    /// shard's stream.
    pub async fn pod_stream(
        &self,
        user: &User,
        stream: &PodStreamRequest,
    ) -> Result<Switched, ApiError> {
        let (ns, name, sub) = (
            stream.namespace.as_str(),
            stream.name.as_str(),
            stream.subresource.as_str(),
        );
        let mut req = ApiRequest::new(Verb::Create, pods());
        req.namespace = Some(ns.to_owned());
        req.name = Some(name.to_owned());
        req.subresource = Some(sub.to_owned());
        self.authorizer.authorize(user, &req).await?;
        let upgrade = stream
            .headers
            .iter()
            .any(|(k, v)| k.eq_ignore_ascii_case("upgrade") && !v.is_empty());
        if !upgrade {
            return Err(ApiError::bad_request("Upgrade request required"));
        }
        // Admission only for a request that can go ahead: no webhook is called for one
        // refused anyway.
        self.admit_connect(user, &req, &stream.query).await?;
        if self.across(req.resource).is_some() {
            return self.pod_stream_across(&req, stream).await;
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
        let query = stream.query.as_str();
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
        let mut forwarded = Vec::with_capacity(stream.headers.len());
        for (k, v) in &stream.headers {
            let name = HeaderName::try_from(k.as_str())
                .map_err(|e| ApiError::bad_request(format!("header {k:?}: {e}")))?;
            let value = HeaderValue::try_from(v.as_str())
                .map_err(|e| ApiError::bad_request(format!("header {k}: {e}")))?;
            forwarded.push((name, value));
        }
        tracing::info!(namespace = %ns, pod = %name, %sub, node = %node_name, user = %user.name(), "streaming to a pod");
        let agent = self
            .agent_request(node_name, &node, &path, &forwarded)
            .await?;
        let headers = switched_headers(agent.headers());
        let io = hyper::upgrade::on(agent).await.map_err(|e| {
            let mut err = ApiError::new(
                503,
                "ServiceUnavailable",
                format!("the agent of node {node_name} switched protocols but its connection was lost: {e}"),
            );
            err.retry_after = Some(1);
            err
        })?;
        Ok(Switched {
            headers,
            io: Box::new(hyper_util::rt::TokioIo::new(io)),
        })
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
