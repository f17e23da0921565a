//! The ReplicaSet controller in a working shard: a real API on a real embedded store, the
//! real scheduler and hollow nodes. Pods are created, scheduled and started; scaling and
//! deleted pods are followed; orphans are adopted; status counts what runs.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tessera_agent::sim::{SimAgent, SimConfig};
use tessera_apiserver::api::Api;
use tessera_apiserver::auth::User;
use tessera_apiserver::client::{Client, InProcess};
use tessera_apiserver::request::{ApiRequest, PatchType, Verb};
use tessera_controllers::Context;
use tessera_controllers::context::res;
use tessera_scheduler::config::SchedulerConfig;
use tessera_scheduler::{Scheduler, SchedulerOptions};
use tessera_store::{EmbeddedOptions, EmbeddedStore, StoreMetrics};

struct Shard {
    client: Arc<dyn Client>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

impl Drop for Shard {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

async fn shard(nodes: usize) -> Shard {
    let dir = tempfile::tempdir().expect("tmp");
    let metrics = StoreMetrics::register(&prometheus::Registry::new()).expect("metrics");
    let store = Arc::new(
        EmbeddedStore::open(dir.path(), EmbeddedOptions::default(), metrics)
            .await
            .expect("store"),
    );
    let client: Arc<dyn Client> = Arc::new(InProcess::new(Api::new(store, None), User::Admin));
    client
        .create(
            res("", "namespaces"),
            None,
            &json!({"metadata": {"name": "default"}}),
        )
        .await
        .expect("ns");
    let agent = SimAgent::new(
        client.clone(),
        SimConfig {
            nodes,
            cpu: "2".into(),
            startup_delay: Duration::from_millis(50),
            ..SimConfig::default()
        },
        None,
        None,
    );
    agent.register(|| {}).await.expect("register");
    let sched = Scheduler::new(
        client.clone(),
        SchedulerOptions {
            config: SchedulerConfig::default(),
            metrics: None,
            runtime_metrics: None,
        },
    )
    .expect("scheduler");
    let ctx = Context::new(client.clone());
    Shard {
        tasks: vec![
            tokio::spawn(agent.run()),
            tokio::spawn(sched.run()),
            tokio::spawn(tessera_controllers::replicaset::run(ctx)),
        ],
        client,
        _dir: dir,
    }
}

async fn list(c: &Arc<dyn Client>, group: &str, plural: &str) -> Vec<Value> {
    let mut req = ApiRequest::new(Verb::List, res(group, plural));
    req.namespace = Some("default".into());
    c.list(req).await.expect("list")["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

async fn wait_until<F: std::future::Future<Output = bool>>(what: &str, mut f: impl FnMut() -> F) {
    for _ in 0..1_000 {
        if f().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("timed out waiting for {what}");
}

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
    wait_until("replaced", || async {
        let pods = list(c, "", "pods").await;
        pods.len() == 5
            && !pods
                .iter()
                .any(|p| p["metadata"]["name"] == victim.as_str())
            && running(c, "web").await == 5
    })
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
    let status = c
        .get(res("apps", "replicasets"), Some("default"), "web")
        .await
        .expect("rs")["status"]
        .clone();
    assert_eq!(status["replicas"], 5);
    assert_eq!(status["fullyLabeledReplicas"], 5);
    assert_eq!(status["observedGeneration"], 2);
}
