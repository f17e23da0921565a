//! `metrics.k8s.io/v1beta1` — what `kubectl top` reads — served by the API server itself
//! (where Kubernetes needs metrics-server): `PodMetrics` and `NodeMetrics` from the usage
//! reports of node agents (`/stats/usage`: CPU as a rate over the agent's window, resident
//! memory), for the pods and nodes the caller may see. A node's usage is the sum of its
//! containers'.
//!
//! Simulated nodes (no agent endpoint) get a simulated usage, as KWOK's metrics simulation
//! gives them: each running container uses its requests times the node's
//! [`USAGE_FRACTION_ANNOTATION`] (1 when absent), and a pod may say what it uses instead
//! ([`USAGE_CPU_ANNOTATION`], [`USAGE_MEMORY_ANNOTATION`], the whole pod's, on its first
//! container) — so `kubectl top` and autoscaling can be tried on a simulated fleet.

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
/// On a simulated Node: the fraction of their requests its pods use (`0.5`).
pub const USAGE_FRACTION_ANNOTATION: &str = "tessera.io/simulated-usage-fraction";
/// On a pod of a simulated node: the CPU it uses (`250m`), instead of its requests.
pub const USAGE_CPU_ANNOTATION: &str = "tessera.io/simulated-cpu-usage";
/// On a pod of a simulated node: the memory it uses (`64Mi`), instead of its requests.
pub const USAGE_MEMORY_ANNOTATION: &str = "tessera.io/simulated-memory-usage";
/// The window a simulated usage is reported over.
const SIMULATED_WINDOW: &str = "30s";

/// The simulated usage of each container of `pod` on a node using `fraction` of requests.
fn simulated_containers(pod: &Value, fraction: f64) -> Value {
    let annotated = |k: &str| {
        pod["metadata"]["annotations"][k]
            .as_str()
            .and_then(|s| s.parse::<Quantity>().ok())
    };
    let (cpu_override, memory_override) = (
        annotated(USAGE_CPU_ANNOTATION),
        annotated(USAGE_MEMORY_ANNOTATION),
    );
    let scaled = |q: Option<Quantity>, milli: bool| -> Quantity {
        let q = q.unwrap_or(Quantity::from_units(0));
        if milli {
            Quantity::from_milli((q.milli_ceil() as f64 * fraction).round() as i64)
        } else {
            Quantity::from_bytes((q.units_ceil() as f64 * fraction).round() as i64)
        }
    };
    let containers: Vec<Value> = pod["spec"]["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
        .map(|(i, c)| {
            let request = |k: &str| {
                c["resources"]["requests"][k]
                    .as_str()
                    .and_then(|s| s.parse::<Quantity>().ok())
            };
            let pick = |o: Option<Quantity>, k: &str, milli: bool| match o {
                Some(q) if i == 0 => q,
                Some(_) => Quantity::from_units(0),
                None => scaled(request(k), milli),
            };
            json!({"name": c["name"], "usage": {
                "cpu": pick(cpu_override, "cpu", true).to_string(),
                "memory": pick(memory_override, "memory", false).to_string()}})
        })
        .collect();
    Value::Array(containers)
}

/// One agent's report of one pod: its time, window and containers.
type PodReport = (Value, Value, Value);

/// Each node's report: its time and, per pod (namespace, name), the pod's report.
type NodeReports = HashMap<String, (Value, HashMap<(String, String), PodReport>)>;

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
        let mut reports = self.usage_reports(&node_objects).await;
        self.simulated_reports(&node_objects, &objects, plural, &mut reports)
            .await?;
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

    /// Reports for the simulated nodes among `nodes` (those without an agent endpoint): the
    /// running pods on them (those of `objects` when pods were asked for, else one list of
    /// every pod) with their simulated usage.
    async fn simulated_reports(
        &self,
        nodes: &[Value],
        objects: &[Value],
        plural: &str,
        reports: &mut NodeReports,
    ) -> Result<(), ApiError> {
        let fractions: HashMap<&str, f64> = nodes
            .iter()
            .filter(|n| super::agents::agent_address(n).is_none())
            .filter_map(|n| {
                let fraction = n["metadata"]["annotations"][USAGE_FRACTION_ANNOTATION]
                    .as_str()
                    .and_then(|f| f.parse::<f64>().ok())
                    .filter(|f| f.is_finite() && *f >= 0.0)
                    .unwrap_or(1.0);
                Some((n["metadata"]["name"].as_str()?, fraction))
            })
            .collect();
        if fractions.is_empty() {
            return Ok(());
        }
        let listed;
        let pods: &[Value] = if plural == "pods" {
            objects
        } else {
            let req = ApiRequest::new(Verb::List, find_resource("", "v1", "pods")?);
            listed = self
                .handle(&User::Admin, req)
                .await?
                .into_value()
                .unwrap_or(Value::Null);
            listed["items"].as_array().map_or(&[][..], Vec::as_slice)
        };
        let now = json!(tessera_core::time::rfc3339(tessera_core::time::now_secs()));
        for node in fractions.keys() {
            reports
                .entry((*node).to_owned())
                .or_insert_with(|| (now.clone(), HashMap::new()));
        }
        for pod in pods {
            let Some(node) = pod["spec"]["nodeName"].as_str() else {
                continue;
            };
            let Some(fraction) = fractions.get(node) else {
                continue;
            };
            if pod["status"]["phase"] != "Running" {
                continue;
            }
            let key = (
                pod["metadata"]["namespace"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                pod["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            );
            let report = (
                now.clone(),
                json!(SIMULATED_WINDOW),
                simulated_containers(pod, *fraction),
            );
            if let Some(r) = reports.get_mut(node) {
                r.1.insert(key, report);
            }
        }
        Ok(())
    }

    /// The newest usage report of each node's agent that answers (of `nodes`, Node objects):
    /// its time and, per pod (namespace, name), the pod's time, window and containers.
    async fn usage_reports(&self, nodes: &[Value]) -> NodeReports {
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
