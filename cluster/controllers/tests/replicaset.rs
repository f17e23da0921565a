//! The ReplicaSet controller in a working shard: a real API on a real embedded store, the
//! real scheduler and hollow nodes. Pods are created, scheduled and started; scaling and
//! deleted pods are followed; orphans are adopted; status counts what runs.

mod support;

use std::sync::Arc;

use serde_json::{Value, json};
use support::{list, shard, wait_until, wait_until_else};
use tessera_apiserver::client::Client;
use tessera_apiserver::request::PatchType;
use tessera_controllers::context::res;

fn rs(name: &str, replicas: i64) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "ReplicaSet",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "c", "image": "nginx",
                    "resources": {"requests": {"cpu": "100m"}}}]}}}})
}

async fn running(c: &Arc<dyn Client>, app: &str) -> usize {
    list(c, "", "pods")
        .await
        .iter()
        .filter(|p| {
            p["metadata"]["labels"]["app"] == app
                && p["status"]["phase"] == "Running"
                && p["metadata"]["deletionTimestamp"].is_null()
        })
        .count()
}

async fn ready_replicas(c: &Arc<dyn Client>, name: &str) -> i64 {
    c.get(res("apps", "replicasets"), Some("default"), name)
        .await
        .map(|r| r["status"]["readyReplicas"].as_i64().unwrap_or(0))
        .unwrap_or(-1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_are_created_scaled_replaced_and_counted() {
    let s = shard(10).await;
    let c = &s.client;
    c.create(res("apps", "replicasets"), Some("default"), &rs("web", 30))
        .await
        .expect("rs");
    wait_until("30 running and ready", || async {
        running(c, "web").await == 30 && ready_replicas(c, "web").await == 30
    })
    .await;
    let pods = list(c, "", "pods").await;
    assert_eq!(
        pods.len(),
        30,
        "exactly 30 pods, no duplicates from the watch racing"
    );
    for p in &pods {
        assert_eq!(p["metadata"]["ownerReferences"][0]["kind"], "ReplicaSet");
        assert_eq!(p["metadata"]["ownerReferences"][0]["controller"], true);
        assert!(
            p["metadata"]["name"]
                .as_str()
                .is_some_and(|n| n.starts_with("web-"))
        );
    }
    // Scale down to 5: 25 are deleted.
    c.patch(
        res("apps", "replicasets"),
        Some("default"),
        "web",
        None,
        PatchType::Merge,
        &json!({"spec": {"replicas": 5}}),
    )
    .await
    .expect("scale");
    wait_until("5 pods", || async {
        list(c, "", "pods").await.len() == 5 && ready_replicas(c, "web").await == 5
    })
    .await;
    // A deleted pod is replaced.
    let victim = list(c, "", "pods").await[0]["metadata"]["name"]
        .as_str()
        .expect("name")
        .to_owned();
    c.delete(res("", "pods"), Some("default"), &victim, None)
        .await
        .expect("delete");
    wait_until_else(
        "replaced",
        || async {
            let pods = list(c, "", "pods").await;
            pods.len() == 5
                && !pods
                    .iter()
                    .any(|p| p["metadata"]["name"] == victim.as_str())
                && running(c, "web").await == 5
        },
        || async {
            let mut out = String::new();
            for p in list(c, "", "pods").await {
                out += &format!(
                    "pod {} node={} phase={} deletionTimestamp={} rv={}\n",
                    p["metadata"]["name"],
                    p["spec"]["nodeName"],
                    p["status"]["phase"],
                    p["metadata"]["deletionTimestamp"],
                    p["metadata"]["resourceVersion"]
                );
            }
            let rs = c
                .get(res("apps", "replicasets"), Some("default"), "web")
                .await;
            out += &format!("replicaset status: {:?}", rs.map(|r| r["status"].clone()));
            out
        },
    )
    .await;
    // An orphan with matching labels is adopted, and the set shrinks back to 5.
    c.create(
        res("", "pods"),
        Some("default"),
        &json!({"metadata": {"name": "stray", "namespace": "default", "labels": {"app": "web"}},
            "spec": {"containers": [{"name": "c", "image": "nginx"}]}}),
    )
    .await
    .expect("orphan");
    wait_until("adopted and back to 5", || async {
        let pods = list(c, "", "pods").await;
        let active = pods
            .iter()
            .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
            .count();
        let stray_adopted_or_gone = pods
            .iter()
            .find(|p| p["metadata"]["name"] == "stray")
            .is_none_or(|p| p["metadata"]["ownerReferences"][0]["kind"] == "ReplicaSet");
        active == 5 && stray_adopted_or_gone
    })
    .await;
    // The set's status follows its pods on the next reconcile: wait for it to count them.
    wait_until("the status counts 5", || async {
        c.get(res("apps", "replicasets"), Some("default"), "web")
            .await
            .is_ok_and(|rs| rs["status"]["replicas"] == 5)
    })
    .await;
    let status = c
        .get(res("apps", "replicasets"), Some("default"), "web")
        .await
        .expect("rs")["status"]
        .clone();
    assert_eq!(status["replicas"], 5);
    assert_eq!(status["fullyLabeledReplicas"], 5);
    assert_eq!(status["observedGeneration"], 2);
}

/// A ReplicationController (core/v1) runs through the same controller: its selector and
/// labels default to the template's, its pods are owned by it, its `scale` subresource
/// (with the map selector as a label selector) scales it, and its status counts them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replication_controllers_keep_their_pods_and_scale() {
    let s = shard(3).await;
    let c = &s.client;
    let rc = json!({"apiVersion": "v1", "kind": "ReplicationController",
        "metadata": {"name": "legacy", "namespace": "default"},
        "spec": {"replicas": 3,
            "template": {"metadata": {"labels": {"app": "legacy"}},
                "spec": {"containers": [{"name": "c", "image": "nginx",
                    "resources": {"requests": {"cpu": "100m"}}}]}}}});
    let created = c
        .create(res("", "replicationcontrollers"), Some("default"), &rc)
        .await
        .expect("rc");
    assert_eq!(created["spec"]["selector"], json!({"app": "legacy"}));
    assert_eq!(created["metadata"]["labels"], json!({"app": "legacy"}));
    wait_until("3 running", || async { running(c, "legacy").await == 3 }).await;
    let pods = list(c, "", "pods").await;
    let owned = pods
        .iter()
        .filter(|p| p["metadata"]["labels"]["app"] == "legacy")
        .all(|p| p["metadata"]["ownerReferences"][0]["kind"] == "ReplicationController");
    assert!(owned, "owned by the controller");

    let scale = c
        .call({
            let mut req = tessera_apiserver::request::ApiRequest::new(
                tessera_apiserver::request::Verb::Get,
                res("", "replicationcontrollers"),
            );
            req.namespace = Some("default".into());
            req.name = Some("legacy".into());
            req.subresource = Some("scale".into());
            req
        })
        .await
        .expect("scale")
        .into_value()
        .expect("a body");
    assert_eq!(scale["status"]["selector"], "app=legacy");
    c.patch(
        res("", "replicationcontrollers"),
        Some("default"),
        "legacy",
        Some("scale"),
        PatchType::Merge,
        &json!({"spec": {"replicas": 1}}),
    )
    .await
    .expect("scale down");
    wait_until_else(
        "1 running and counted",
        || async {
            let rc = c
                .get(res("", "replicationcontrollers"), Some("default"), "legacy")
                .await
                .expect("rc");
            running(c, "legacy").await == 1
                && rc["status"]["replicas"] == 1
                && rc["status"]["readyReplicas"] == 1
        },
        || async { format!("{:?}", running(c, "legacy").await) },
    )
    .await;

    // A selector that does not match the template's labels is refused.
    let mut bad = rc.clone();
    bad["metadata"]["name"] = json!("bad");
    bad["spec"]["selector"] = json!({"app": "other"});
    let e = c
        .create(res("", "replicationcontrollers"), Some("default"), &bad)
        .await
        .expect_err("refused");
    assert_eq!(e.code, 422, "{}", e.message);
    assert!(
        e.message.contains("spec.template.metadata.labels"),
        "{}",
        e.message
    );
}
