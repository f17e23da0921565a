//! Pod helpers shared by the workload controllers: which pods count, which are ready and
//! available, pods from a template, and creating them in slow-start batches.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::future::join_all;
use k8s_openapi::api::core::v1::{Pod, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use serde_json::json;
use tessera_client::client::Client;
use tessera_client::request::{ApiRequest, Decoded, Verb};
use tessera_client::status::ApiError;
use tessera_runtime::expectations::Expectations;

use crate::context::res;

/// Not finished and not being deleted.
pub fn is_active(p: &Pod) -> bool {
    p.metadata.deletion_timestamp.is_none() && !is_terminal(p)
}

/// The pod's UID ("" if it has none yet).
pub fn uid_of(p: &Pod) -> &str {
    p.metadata.uid.as_deref().unwrap_or("")
}

/// Succeeded or Failed.
pub fn is_terminal(p: &Pod) -> bool {
    matches!(phase(p), "Succeeded" | "Failed")
}

/// The pod's phase.
pub fn phase(p: &Pod) -> &str {
    p.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("Pending")
}

fn ready_since(p: &Pod) -> Option<i64> {
    let c = p
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready" && c.status == "True")?;
    Some(
        c.last_transition_time
            .as_ref()
            .map_or(0, |t| t.0.as_second()),
    )
}

/// The Ready condition is True.
pub fn is_ready(p: &Pod) -> bool {
    ready_since(p).is_some()
}

/// Ready for at least `min_ready` seconds at `now`.
pub fn is_available(p: &Pod, min_ready: i64, now: i64) -> bool {
    ready_since(p).is_some_and(|t| min_ready <= 0 || t + min_ready <= now)
}

/// Seconds until a ready pod becomes available (None if it is not ready or already is).
pub fn until_available(p: &Pod, min_ready: i64, now: i64) -> Option<i64> {
    let t = ready_since(p)?;
    let left = t + min_ready - now;
    (min_ready > 0 && left > 0).then_some(left)
}

/// A controller owner reference to an object.
pub fn owner_ref(api_version: &str, kind: &str, name: &str, uid: &str) -> OwnerReference {
    OwnerReference {
        api_version: api_version.into(),
        kind: kind.into(),
        name: name.into(),
        uid: uid.into(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// A pod from `template`, owned by `owner`, named `{prefix}{random}` by the API (or `name`).
pub fn from_template(
    template: &PodTemplateSpec,
    owner: &OwnerReference,
    prefix: &str,
    name: Option<&str>,
    extra_labels: &BTreeMap<String, String>,
) -> Pod {
    let meta = template.metadata.clone().unwrap_or_default();
    let mut labels = meta.labels.unwrap_or_default();
    labels.extend(extra_labels.clone());
    Pod {
        metadata: ObjectMeta {
            labels: Some(labels),
            owner_references: Some(vec![owner.clone()]),
            annotations: meta.annotations.filter(|a| !a.is_empty()),
            finalizers: meta.finalizers.filter(|f| !f.is_empty()),
            name: name.map(str::to_owned),
            generate_name: name.is_none().then(|| prefix.to_owned()),
            ..ObjectMeta::default()
        },
        spec: template.spec.clone(),
        status: None,
    }
}

/// Deletes this very pod (its UID as precondition: a newer pod of the same name is left
/// alone).
pub async fn delete_pod(client: &Arc<dyn Client>, p: &Pod) -> Result<(), ApiError> {
    let mut req = ApiRequest::new(Verb::Delete, res("", "pods"));
    req.namespace = p.metadata.namespace.clone();
    req.name = p.metadata.name.clone();
    req.body = json!({"kind": "DeleteOptions", "apiVersion": "v1",
        "preconditions": {"uid": p.metadata.uid}})
    .to_string()
    .into();
    client.call(req).await.map(|_| ())
}

/// [`delete_pod`], where a pod already gone is fine.
pub async fn delete_pod_if_present(client: &Arc<dyn Client>, p: &Pod) -> Result<(), ApiError> {
    match delete_pod(client, p).await {
        Err(e) if e.code == 404 => Ok(()),
        other => other,
    }
}

/// Largest number of pods created at once by one reconcile (Kubernetes' burst).
pub const BURST: usize = 500;

/// The pods of a controller, handed to the API decoded (serialized from the Pod type, so an
/// in-process API neither parses nor re-types them).
pub fn typed_pods(pods: impl IntoIterator<Item = Pod>) -> Result<Vec<Decoded>, ApiError> {
    pods.into_iter().map(|p| Decoded::typed(&p)).collect()
}

/// Creates `pods` in `ns` in slow-start batches (1, 2, 4, ...), stopping at the first batch
/// with a failure — a quota or an invalid template fails once instead of `n` times. Each
/// creation is expected under `key` first; ones not attempted or failed are un-expected.
/// Returns how many were created and the first error.
pub async fn create_slow_start(
    client: &Arc<dyn Client>,
    ns: &str,
    pods: Vec<Decoded>,
    expectations: &Expectations,
    key: &str,
) -> (usize, Option<ApiError>) {
    let total = pods.len();
    expectations.expect_creations(key, total as i64);
    let mut created = 0;
    let mut batch = 1;
    let mut it = pods.into_iter();
    let mut attempted = 0;
    while attempted < total {
        let chunk: Vec<Decoded> = it.by_ref().take(batch).collect();
        attempted += chunk.len();
        let results = join_all(
            chunk
                .into_iter()
                .map(|p| client.create_decoded(res("", "pods"), Some(ns), p)),
        )
        .await;
        let mut error = None;
        for r in results {
            match r {
                Ok(_) => created += 1,
                Err(e) => {
                    expectations.observed_add(key);
                    error.get_or_insert(e);
                }
            }
        }
        if let Some(e) = error {
            for _ in attempted..total {
                expectations.observed_add(key);
            }
            return (created, Some(e));
        }
        batch *= 2;
    }
    (created, None)
}

/// Which pods to delete first when scaling down: unassigned before assigned, pending before
/// running, not ready before ready, fewer restarts last, newest first (Kubernetes' order,
/// simplified).
pub fn deletion_rank(p: &Pod) -> (u8, u8, u8, std::cmp::Reverse<i64>) {
    let assigned = p
        .spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .is_some_and(|n| !n.is_empty());
    let phase_rank = match phase(p) {
        "Pending" => 0,
        "Unknown" => 1,
        _ => 2,
    };
    let created = p
        .metadata
        .creation_timestamp
        .as_ref()
        .map_or(0, |t| t.0.as_second());
    (
        u8::from(assigned),
        phase_rank,
        u8::from(is_ready(p)),
        std::cmp::Reverse(created),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn pod(v: Value) -> Pod {
        serde_json::from_value(v).expect("pod")
    }

    fn ready_at(t: &str) -> Value {
        json!({"conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": t}],
            "phase": "Running"})
    }

    #[test]
    fn availability_counts_min_ready_seconds() {
        let t0 = "2026-11-30T00:00:00Z"
            .parse::<jiff::Timestamp>()
            .expect("time")
            .as_second();
        let p = pod(json!({"metadata": {"name": "p"}, "status": ready_at("2026-11-30T00:00:00Z")}));
        let not_ready = pod(json!({"metadata": {"name": "q"}, "status": {"phase": "Running"}}));
        // (pod, min_ready, now, available, until_available)
        let cases = [
            (&p, 0, t0, true, None),
            (&p, 10, t0 + 5, false, Some(5)),
            (&p, 10, t0 + 10, true, None),
            (&p, 10, t0 + 60, true, None),
            (&not_ready, 0, t0, false, None),
            (&not_ready, 10, t0 + 60, false, None),
        ];
        for (p, min_ready, now, available, until) in cases {
            let name = p.metadata.name.as_deref().unwrap_or("");
            assert_eq!(
                is_available(p, min_ready, now),
                available,
                "{name} {min_ready} {now}"
            );
            assert_eq!(
                until_available(p, min_ready, now),
                until,
                "{name} {min_ready} {now}"
            );
        }
    }

    #[test]
    fn scale_down_deletes_the_least_valuable_pods_first() {
        let mk = |name: &str, node: Option<&str>, status: Value, created: &str| {
            pod(
                json!({"metadata": {"name": name, "creationTimestamp": created},
                "spec": {"nodeName": node, "containers": []}, "status": status}),
            )
        };
        let mut pods = [
            mk(
                "ready-old",
                Some("n"),
                ready_at("2026-11-30T00:00:00Z"),
                "2026-11-29T00:00:00Z",
            ),
            mk(
                "unassigned",
                None,
                json!({"phase": "Pending"}),
                "2026-11-29T00:00:00Z",
            ),
            mk(
                "pending",
                Some("n"),
                json!({"phase": "Pending"}),
                "2026-11-29T00:00:00Z",
            ),
            mk(
                "not-ready",
                Some("n"),
                json!({"phase": "Running"}),
                "2026-11-29T00:00:00Z",
            ),
            mk(
                "ready-new",
                Some("n"),
                ready_at("2026-11-30T00:00:00Z"),
                "2026-11-30T00:00:00Z",
            ),
        ];
        pods.sort_by_key(deletion_rank);
        let order: Vec<&str> = pods
            .iter()
            .map(|p| p.metadata.name.as_deref().unwrap_or(""))
            .collect();
        assert_eq!(
            order,
            [
                "unassigned",
                "pending",
                "not-ready",
                "ready-new",
                "ready-old"
            ]
        );
    }
}
