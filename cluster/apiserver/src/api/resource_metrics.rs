//! `metrics.k8s.io/v1beta1` — what `kubectl top` reads — served by the API server itself
//! (where Kubernetes needs metrics-server): `PodMetrics` and `NodeMetrics` from the usage
//! reports of node agents (`/stats/usage`: CPU as a rate over the agent's window, resident
//! memory), for the pods and nodes the caller may see. A node's usage is the sum of its
//! containers'. Simulated nodes report none, and are left out, as metrics-server leaves out
//! what it cannot scrape.

use std::collections::HashMap;

use futures::future::join_all;
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tessera_core::quantity::Quantity;

use super::Api;
use crate::auth::User;
use crate::request::{ApiRequest, Verb, find_resource, parse_params};
use crate::status::ApiError;

/// The group-version served here.
pub const GROUP_VERSION: &str = "metrics.k8s.io/v1beta1";

/// One agent's report of one pod: its time, window and containers.
type PodReport = (Value, Value, Value);

fn not_found(plural: &str, name: &str) -> ApiError {
    let kind = if plural == "pods" {
        "podmetrics"
    } else {
        "nodemetrics"
    };
    ApiError::new(
        404,
        "NotFound",
        format!("{kind}.metrics.k8s.io \"{name}\" not found"),
    )
}

impl Api {
    /// `GET /apis/metrics.k8s.io/v1beta1/<rest>?<query>` for `user`.
    pub async fn resource_metrics(
        &self,
        user: &User,
        rest: &str,
        query: &str,
    ) -> Result<Value, ApiError> {
        let parts: Vec<&str> = rest.trim_matches('/').split('/').collect();
        let (ns, plural, name) = match parts.as_slice() {
            ["nodes"] => (None, "nodes", None),
            ["nodes", n] => (None, "nodes", Some(*n)),
            ["pods"] => (None, "pods", None),
            ["namespaces", ns, "pods"] => (Some(*ns), "pods", None),
            ["namespaces", ns, "pods", n] => (Some(*ns), "pods", Some(*n)),
            _ => {
                return Err(ApiError::new(
                    404,
                    "NotFound",
                    format!(
                        "the server could not find the requested resource: {GROUP_VERSION}/{rest} (served: nodes, pods)"
                    ),
                ));
            }
        };
        // What the caller may see of the objects themselves decides what it sees of their
        // usage: the same authorization, selectors and tenant scopes.
        let mut req = ApiRequest::new(
            if name.is_some() {
                Verb::Get
            } else {
                Verb::List
            },
            find_resource("", "v1", plural)?,
        );
        req.namespace = ns.map(str::to_owned);
        req.name = name.map(str::to_owned);
        req.params = parse_params(query)?.0;
        let objects = match self.handle(user, req).await {
            Err(e) if e.code == 404 && name.is_some() => {
                return Err(not_found(plural, name.unwrap_or_default()));
            }
            other => other?.into_value().unwrap_or(Value::Null),
        };
        let objects: Vec<Value> = match name {
            Some(_) => vec![objects],
            None => objects["items"].as_array().cloned().unwrap_or_default(),
        };
        let nodes: Vec<String> = {
            let mut n: Vec<String> = objects
                .iter()
                .filter_map(|o| {
                    if plural == "nodes" {
                        o["metadata"]["name"].as_str()
                    } else {
                        o["spec"]["nodeName"].as_str()
                    }
                })
                .map(str::to_owned)
                .collect();
            n.sort();
            n.dedup();
            n
        };
        // The Node objects, to ask only the nodes that have an agent endpoint.
        let node_objects: Vec<Value> = if plural == "nodes" {
            objects.clone()
        } else {
            let gets = nodes.iter().map(|n| async move {
                let mut req = ApiRequest::new(Verb::Get, super::agents::nodes());
                req.name = Some(n.clone());
                self.get(&req).await.ok()?.into_value()
            });
            join_all(gets).await.into_iter().flatten().collect()
        };
        let reports = self.usage_reports(&node_objects).await;
        let mut items = Vec::new();
        for o in &objects {
            let meta = &o["metadata"];
            let metadata = json!({"name": meta["name"], "namespace": meta["namespace"],
                "creationTimestamp": meta["creationTimestamp"], "labels": meta["labels"]});
            if plural == "pods" {
                let key = (
                    meta["namespace"].as_str().unwrap_or_default().to_owned(),
                    meta["name"].as_str().unwrap_or_default().to_owned(),
                );
                let Some((ts, window, containers)) = o["spec"]["nodeName"]
                    .as_str()
                    .and_then(|n| reports.get(n))
                    .and_then(|r| r.1.get(&key))
                else {
                    continue;
                };
                items.push(
                    json!({"metadata": metadata, "timestamp": ts, "window": window,
                    "containers": containers}),
                );
            } else {
                let node = meta["name"].as_str().unwrap_or_default();
                let Some((ts, pods)) = reports.get(node) else {
                    continue;
                };
                let (mut cpu, mut memory) = (Quantity::from_units(0), Quantity::from_units(0));
                let mut window = json!("0s");
                for (_, w, containers) in pods.values() {
                    window = w.clone();
                    for c in containers.as_array().into_iter().flatten() {
                        let q = |k: &str| {
                            c["usage"][k]
                                .as_str()
                                .and_then(|s| s.parse::<Quantity>().ok())
                        };
                        cpu = cpu.saturating_add(q("cpu").unwrap_or(Quantity::from_units(0)));
                        memory =
                            memory.saturating_add(q("memory").unwrap_or(Quantity::from_units(0)));
                    }
                }
                items.push(
                    json!({"metadata": metadata, "timestamp": ts, "window": window,
                    "usage": {"cpu": cpu.to_string(), "memory": memory.to_string()}}),
                );
            }
        }
        let kind = if plural == "pods" {
            "PodMetrics"
        } else {
            "NodeMetrics"
        };
        match name {
            Some(n) => {
                let mut one = items.pop().ok_or_else(|| not_found(plural, n))?;
                one["kind"] = json!(kind);
                one["apiVersion"] = json!(GROUP_VERSION);
                Ok(one)
            }
            None => Ok(
                json!({"kind": format!("{kind}List"), "apiVersion": GROUP_VERSION,
                "metadata": {}, "items": items}),
            ),
        }
    }

    /// The newest usage report of each node's agent that answers (of `nodes`, Node objects):
    /// its time and, per pod (namespace, name), the pod's time, window and containers.
    async fn usage_reports(
        &self,
        nodes: &[Value],
    ) -> HashMap<String, (Value, HashMap<(String, String), PodReport>)> {
        let asks = nodes
            .iter()
            .filter(|n| super::agents::agent_address(n).is_some())
            .map(|node| async move {
                let n = node["metadata"]["name"].as_str()?.to_owned();
                let resp = self.agent_get_at(&n, node, "/stats/usage").await.ok()?;
                let body = resp.into_body().collect().await.ok()?.to_bytes();
                let report: Value = serde_json::from_slice(&body).ok()?;
                // No report yet (the agent has not sampled a whole window).
                report["timestamp"].as_str()?;
                let mut pods = HashMap::new();
                for p in report["pods"].as_array().into_iter().flatten() {
                    pods.insert(
                        (
                            p["namespace"].as_str().unwrap_or_default().to_owned(),
                            p["name"].as_str().unwrap_or_default().to_owned(),
                        ),
                        (
                            report["timestamp"].clone(),
                            report["window"].clone(),
                            p["containers"].clone(),
                        ),
                    );
                }
                Some((n, (report["timestamp"].clone(), pods)))
            });
        join_all(asks).await.into_iter().flatten().collect()
    }
}
