//! ResourceQuota usage in a working shard: finished pods give their charge back, new limits
//! are counted at once, and a count that went wrong is repaired by the recount.

mod support;

use serde_json::{Value, json};
use support::{shard, wait_until};
use tessera_apiserver::request::PatchType;
use tessera_controllers::context::res;

fn pod(name: &str, cpu: &str, run_seconds: Option<&str>) -> Value {
    let mut annotations = json!({});
    if let Some(s) = run_seconds {
        annotations["tessera.io/sim-run-seconds"] = json!(s);
    }
    json!({"metadata": {"name": name, "namespace": "default", "annotations": annotations},
        "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "x",
            "resources": {"requests": {"cpu": cpu}}}]}})
}

fn used(q: &Value, k: &str) -> String {
    q["status"]["used"][k].as_str().unwrap_or("").to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quota_usage_follows_the_pods() {
    let s = shard(2).await;
    let c = &s.client;
    // Every namespace holds kube-root-ca.crt (it counts, as in Kubernetes); two more here.
    support::wait_until("the root CA published", || async {
        c.get(res("", "configmaps"), Some("default"), "kube-root-ca.crt")
            .await
            .is_ok()
    })
    .await;
    for i in 0..2 {
        c.create(
            res("", "configmaps"),
            Some("default"),
            &json!({"metadata": {"name": format!("cm{i}")}}),
        )
        .await
        .expect("configmap");
    }
    c.create(
        res("", "resourcequotas"),
        Some("default"),
        &json!({"metadata": {"name": "rq"},
            "spec": {"hard": {"pods": "10", "requests.cpu": "2", "count/configmaps": "5"}}}),
    )
    .await
    .expect("quota");
    let quota = || async {
        c.get(res("", "resourcequotas"), Some("default"), "rq")
            .await
            .expect("quota")
    };
    assert_eq!(used(&quota().await, "count/configmaps"), "3");

    // Three pods that run for good and two that finish: the finished ones stop counting.
    for i in 0..3 {
        c.create(
            res("", "pods"),
            Some("default"),
            &pod(&format!("svc{i}"), "200m", None),
        )
        .await
        .expect("pod");
    }
    for i in 0..2 {
        c.create(
            res("", "pods"),
            Some("default"),
            &pod(&format!("job{i}"), "300m", Some("0")),
        )
        .await
        .expect("pod");
    }
    assert_eq!(used(&quota().await, "pods"), "5");
    assert_eq!(used(&quota().await, "requests.cpu"), "1200m");
    wait_until(
        "the two short pods finished and gave their charge back",
        || async {
            let q = quota().await;
            used(&q, "pods") == "3" && used(&q, "requests.cpu") == "600m"
        },
    )
    .await;

    // A count gone wrong (here: written by hand) is repaired by the recount.
    c.patch(
        res("", "resourcequotas"),
        Some("default"),
        "rq",
        Some("status"),
        PatchType::Merge,
        &json!({"status": {"used": {"pods": "9", "requests.cpu": "0"}}}),
    )
    .await
    .expect("corrupt");
    wait_until("the recount repaired it", || async {
        let q = quota().await;
        used(&q, "pods") == "3" && used(&q, "requests.cpu") == "600m"
    })
    .await;

    // A new limit is counted from what is used now, and then holds.
    c.patch(
        res("", "resourcequotas"),
        Some("default"),
        "rq",
        None,
        PatchType::Merge,
        &json!({"spec": {"hard": {"count/configmaps": "2"}}}),
    )
    .await
    .expect("limit");
    wait_until("status.hard follows spec.hard", || async {
        quota().await["status"]["hard"]["count/configmaps"] == "2"
    })
    .await;
    let err = c
        .create(
            res("", "configmaps"),
            Some("default"),
            &json!({"metadata": {"name": "cm-over"}}),
        )
        .await
        .expect_err("over the new limit");
    assert_eq!(err.code, 403, "{}", err.message);
    assert!(
        err.message.contains("exceeded quota: rq"),
        "{}",
        err.message
    );
}
