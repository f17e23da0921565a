//! The process runtime against a real API: containers run as real local processes, with
//! their output logged, exit codes reported, restarts with back-off, and SIGTERM then SIGKILL
//! on deletion.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tessera_agent::process::{ProcessAgent, ProcessConfig};
use tessera_apiserver::api::Api;
use tessera_apiserver::auth::User;
use tessera_apiserver::catalog::Resource;
use tessera_apiserver::client::{Client, InProcess};
use tessera_apiserver::request::{ApiRequest, Verb, find_resource};
use tessera_store::{EmbeddedOptions, EmbeddedStore, StoreMetrics};

fn res(plural: &str) -> &'static Resource {
    find_resource("", "v1", plural).expect("resource")
}

async fn get(c: &Arc<dyn Client>, name: &str) -> Option<Value> {
    c.get(res("pods"), Some("default"), name).await.ok()
}

async fn until<F: std::future::Future<Output = bool>>(what: &str, mut f: impl FnMut() -> F) {
    for _ in 0..600 {
        if f().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("timed out waiting for {what}");
}

fn pod(name: &str, command: Value, policy: &str, extra: Value) -> Value {
    let mut c = json!({"name": "main", "image": "busybox", "command": command});
    if let (Some(c), Some(extra)) = (c.as_object_mut(), extra.as_object()) {
        for (k, v) in extra {
            c.insert(k.clone(), v.clone());
        }
    }
    json!({"metadata": {"name": name, "namespace": "default"},
        "spec": {"nodeName": "proc-0", "restartPolicy": policy, "containers": [c]}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn containers_run_as_processes() {
    let dir = tempfile::tempdir().expect("tmp");
    let metrics = StoreMetrics::register(&prometheus::Registry::new()).expect("metrics");
    let store = Arc::new(
        EmbeddedStore::open(
            &dir.path().join("store"),
            EmbeddedOptions::default(),
            metrics,
        )
        .await
        .expect("store"),
    );
    let c: Arc<dyn Client> = Arc::new(InProcess::new(Api::new(store, None), User::Admin));
    c.create(
        res("namespaces"),
        None,
        &json!({"metadata": {"name": "default"}}),
    )
    .await
    .expect("ns");
    let logs = dir.path().join("logs");
    let agent = ProcessAgent::new(
        c.clone(),
        ProcessConfig {
            backoff: Duration::from_millis(100),
            max_backoff: Duration::from_millis(400),
            ..ProcessConfig::new("proc-0", logs.clone())
        },
    );
    agent.register().await.expect("register");
    let node = c.get(res("nodes"), None, "proc-0").await.expect("node");
    assert_eq!(node["metadata"]["labels"]["tessera.io/runtime"], "process");
    let task = tokio::spawn(agent.run());
    let sh = |script: &str| json!(["sh", "-c", script]);

    // Output is logged; the exit code is reported; env and workingDir apply.
    c.create(
        res("pods"),
        Some("default"),
        &pod(
            "hello",
            sh("echo $GREETING; pwd; echo oops >&2"),
            "Never",
            json!({"env": [{"name": "GREETING", "value": "hi"}], "workingDir": "/tmp"}),
        ),
    )
    .await
    .expect("pod");
    until("hello succeeded", || async {
        get(&c, "hello")
            .await
            .is_some_and(|p| p["status"]["phase"] == "Succeeded")
    })
    .await;
    let p = get(&c, "hello").await.expect("pod");
    assert_eq!(
        p["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"],
        0
    );
    let text = std::fs::read_to_string(tessera_agent::process::log_path(
        &logs,
        &serde_json::from_value(p).expect("pod"),
        "main",
        0,
    ))
    .expect("log");
    assert_eq!(text, "hi\n/tmp\noops\n");

    // A failing container restarts with back-off (OnFailure), counting restarts.
    c.create(
        res("pods"),
        Some("default"),
        &pod("crash", sh("echo try; exit 3"), "OnFailure", json!({})),
    )
    .await
    .expect("pod");
    until("two restarts", || async {
        get(&c, "crash").await.is_some_and(|p| {
            p["status"]["containerStatuses"][0]["restartCount"]
                .as_u64()
                .unwrap_or(0)
                >= 2
        })
    })
    .await;
    let p = get(&c, "crash").await.expect("pod");
    let cs = &p["status"]["containerStatuses"][0];
    assert_eq!(cs["lastState"]["terminated"]["exitCode"], 3);

    // A failing container under Never: the pod Failed with its exit code.
    c.create(
        res("pods"),
        Some("default"),
        &pod("fails", sh("exit 7"), "Never", json!({})),
    )
    .await
    .expect("pod");
    until("fails failed", || async {
        get(&c, "fails")
            .await
            .is_some_and(|p| p["status"]["phase"] == "Failed")
    })
    .await;
    assert_eq!(
        get(&c, "fails").await.expect("pod")["status"]["containerStatuses"][0]["state"]["terminated"]
            ["exitCode"],
        7
    );

    // Deletion: SIGTERM first (the process says goodbye and exits), then the pod goes.
    c.create(
        res("pods"),
        Some("default"),
        &pod(
            "polite",
            sh("trap 'echo bye; exit 0' TERM; echo up; while true; do sleep 0.05; done"),
            "Always",
            json!({}),
        ),
    )
    .await
    .expect("pod");
    until("polite running", || async {
        get(&c, "polite")
            .await
            .is_some_and(|p| p["status"]["phase"] == "Running")
    })
    .await;
    let polite: k8s_openapi::api::core::v1::Pod =
        serde_json::from_value(get(&c, "polite").await.expect("pod")).expect("pod");
    tokio::time::sleep(Duration::from_millis(200)).await;
    c.delete(res("pods"), Some("default"), "polite", None)
        .await
        .expect("delete");
    until("polite gone", || async {
        get(&c, "polite").await.is_none()
    })
    .await;
    let text = std::fs::read_to_string(tessera_agent::process::log_path(&logs, &polite, "main", 0))
        .expect("log");
    assert_eq!(text, "up\nbye\n", "SIGTERM reached the process");

    // One that ignores SIGTERM is killed after its grace period.
    c.create(
        res("pods"),
        Some("default"),
        &pod(
            "stubborn",
            sh("trap '' TERM; while true; do sleep 0.05; done"),
            "Always",
            json!({}),
        ),
    )
    .await
    .expect("pod");
    until("stubborn running", || async {
        get(&c, "stubborn")
            .await
            .is_some_and(|p| p["status"]["phase"] == "Running")
    })
    .await;
    let mut req = ApiRequest::new(Verb::Delete, res("pods"));
    req.namespace = Some("default".into());
    req.name = Some("stubborn".into());
    req.params.grace_period_seconds = Some(1);
    c.call(req).await.expect("delete");
    let started = std::time::Instant::now();
    until("stubborn gone", || async {
        get(&c, "stubborn").await.is_none()
    })
    .await;
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "waited for the grace period"
    );

    // No command: the runtime says why it cannot start it.
    c.create(res("pods"), Some("default"),
        &json!({"metadata": {"name": "image-only", "namespace": "default"},
            "spec": {"nodeName": "proc-0", "restartPolicy": "Never", "containers": [{"name": "main", "image": "nginx"}]}}))
        .await
        .expect("pod");
    until("a reason", || async {
        get(&c, "image-only")
            .await
            .is_some_and(|p| p.to_string().contains("CreateContainerConfigError"))
    })
    .await;
    task.abort();
}
