//! Garbage collection by ownerReferences (background, foreground, orphan) and namespace
//! deletion, in a working shard.

mod support;

use std::sync::Arc;

use serde_json::{Value, json};
use support::{list, list_in, shard, wait_until};
use tessera_apiserver::client::Client;
use tessera_apiserver::request::{ApiRequest, Propagation, Verb};
use tessera_controllers::context::res;

fn deployment(ns: &str, name: &str, replicas: i64) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "c", "image": "x"}]}}}})
}

async fn delete(
    c: &Arc<dyn Client>,
    group: &str,
    plural: &str,
    ns: &str,
    name: &str,
    p: Option<Propagation>,
) -> Value {
    let mut req = ApiRequest::new(Verb::Delete, res(group, plural));
    req.namespace = Some(ns.into());
    req.name = Some(name.into());
    req.params.propagation = p;
    c.call(req)
        .await
        .expect("delete")
        .into_value()
        .unwrap_or_default()
}

async fn count(c: &Arc<dyn Client>, group: &str, plural: &str) -> usize {
    list(c, group, plural).await.len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn background_foreground_and_orphan_deletion() {
    let s = shard(3).await;
    let c = &s.client;
    c.create(
        res("apps", "deployments"),
        Some("default"),
        &deployment("default", "bg", 3),
    )
    .await
    .expect("create");
    wait_until("3 pods", || async { count(c, "", "pods").await == 3 }).await;
    // Background: the Deployment goes at once, then its ReplicaSet, then the pods.
    delete(c, "apps", "deployments", "default", "bg", None).await;
    wait_until("all collected", || async {
        count(c, "apps", "replicasets").await == 0 && count(c, "", "pods").await == 0
    })
    .await;

    // Foreground: the Deployment stays (with its finalizer) until its dependents are gone.
    c.create(
        res("apps", "deployments"),
        Some("default"),
        &deployment("default", "fg", 3),
    )
    .await
    .expect("create");
    wait_until("3 pods", || async { count(c, "", "pods").await == 3 }).await;
    // The answer to the delete is the Deployment as it stays while its dependents go.
    let d = delete(
        c,
        "apps",
        "deployments",
        "default",
        "fg",
        Some(Propagation::Foreground),
    )
    .await;
    assert!(d["metadata"]["deletionTimestamp"].is_string());
    assert!(
        d["metadata"]["finalizers"]
            .to_string()
            .contains("foregroundDeletion")
    );
    wait_until("owner deleted last", || async {
        c.get(res("apps", "deployments"), Some("default"), "fg")
            .await
            .is_err()
    })
    .await;
    assert_eq!(count(c, "apps", "replicasets").await, 0);
    wait_until("pods gone", || async { count(c, "", "pods").await == 0 }).await;

    // Orphan: the ReplicaSet goes, its pods stay, without the reference.
    c.create(
        res("apps", "replicasets"),
        Some("default"),
        &json!({"apiVersion": "apps/v1", "kind": "ReplicaSet",
            "metadata": {"name": "or", "namespace": "default"},
            "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "or"}},
                "template": {"metadata": {"labels": {"app": "or"}},
                    "spec": {"containers": [{"name": "c", "image": "x"}]}}}}),
    )
    .await
    .expect("rs");
    wait_until("2 pods", || async { count(c, "", "pods").await == 2 }).await;
    let before = list(c, "", "pods").await;
    delete(
        c,
        "apps",
        "replicasets",
        "default",
        "or",
        Some(Propagation::Orphan),
    )
    .await;
    wait_until("set gone", || async {
        count(c, "apps", "replicasets").await == 0
    })
    .await;
    // The orphan finalizer released the pods before the set went.
    let pods = list(c, "", "pods").await;
    assert_eq!(pods.len(), 2, "orphans are kept");
    assert!(pods.iter().all(|p| {
        p["metadata"]["ownerReferences"]
            .as_array()
            .is_none_or(|r| r.is_empty())
    }));
    // Not a sleep: a barrier through the collector. Another set deleted in the background is
    // collected with its pods; by then the collector has had its chance at the orphans, and
    // they are untouched: the same pods, still without owners, not being deleted (their
    // resourceVersions may move: the scheduler and the agent write them).
    let orphans: Vec<(Value, Value)> = pods
        .iter()
        .map(|p| {
            (
                p["metadata"]["uid"].clone(),
                json!([
                    p["metadata"]["ownerReferences"],
                    p["metadata"]["deletionTimestamp"]
                ]),
            )
        })
        .collect();
    assert!(
        before
            .iter()
            .all(|b| orphans.iter().any(|(u, _)| *u == b["metadata"]["uid"]))
    );
    let barrier = json!({"apiVersion": "apps/v1", "kind": "ReplicaSet",
        "metadata": {"name": "barrier", "namespace": "default"},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "barrier"}},
            "template": {"metadata": {"labels": {"app": "barrier"}},
                "spec": {"containers": [{"name": "c", "image": "x"}]}}}});
    c.create(res("apps", "replicasets"), Some("default"), &barrier)
        .await
        .expect("barrier set");
    wait_until("3 pods", || async { count(c, "", "pods").await == 3 }).await;
    delete(c, "apps", "replicasets", "default", "barrier", None).await;
    wait_until("the barrier collected", || async {
        count(c, "apps", "replicasets").await == 0 && count(c, "", "pods").await == 2
    })
    .await;
    let after: Vec<(Value, Value)> = list(c, "", "pods")
        .await
        .iter()
        .map(|p| {
            (
                p["metadata"]["uid"].clone(),
                json!([
                    p["metadata"]["ownerReferences"],
                    p["metadata"]["deletionTimestamp"]
                ]),
            )
        })
        .collect();
    assert_eq!(after, orphans, "the orphans were left alone");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_namespace_removes_everything_in_it() {
    let s = shard(2).await;
    let c = &s.client;
    c.create(
        res("", "namespaces"),
        None,
        &json!({"metadata": {"name": "tmp"}}),
    )
    .await
    .expect("ns");
    c.create(
        res("apps", "deployments"),
        Some("tmp"),
        &deployment("tmp", "web", 4),
    )
    .await
    .expect("deployment");
    c.create(
        res("", "configmaps"),
        Some("tmp"),
        &json!({"metadata": {"name": "cfg", "namespace": "tmp"}, "data": {"a": "1"}}),
    )
    .await
    .expect("cm");
    wait_until("4 pods", || async {
        list_in(c, "", "pods", "tmp").await.len() == 4
    })
    .await;
    c.delete(res("", "namespaces"), None, "tmp", None)
        .await
        .expect("delete ns");
    wait_until("namespace gone", || async {
        c.get(res("", "namespaces"), None, "tmp").await.is_err()
    })
    .await;
    for (g, p) in [
        ("", "pods"),
        ("apps", "replicasets"),
        ("apps", "deployments"),
        ("", "configmaps"),
    ] {
        assert!(list_in(c, g, p, "tmp").await.is_empty(), "{p} left behind");
    }
}
