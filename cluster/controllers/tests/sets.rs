//! DaemonSets and StatefulSets in a working shard.

mod support;

use std::time::Duration;

use serde_json::{Value, json};
use support::{Events, list, shard, wait_until};
use tessera_agent::sim::{SimAgent, SimConfig};
use tessera_apiserver::request::PatchType;
use tessera_controllers::context::res;

fn running_on(pods: &[Value]) -> Vec<String> {
    let mut v: Vec<String> = pods
        .iter()
        .filter(|p| {
            p["status"]["phase"] == "Running" && p["metadata"]["deletionTimestamp"].is_null()
        })
        .filter_map(|p| p["spec"]["nodeName"].as_str().map(str::to_owned))
        .collect();
    v.sort();
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemonset_covers_every_node_and_follows_a_new_one() {
    let s = shard(3).await;
    let c = &s.client;
    c.create(
        res("apps", "daemonsets"),
        Some("default"),
        &json!({"apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": "agent", "namespace": "default"},
            "spec": {"selector": {"matchLabels": {"app": "agent"}},
                "template": {"metadata": {"labels": {"app": "agent"}},
                    "spec": {"containers": [{"name": "c", "image": "x"}]}}}}),
    )
    .await
    .expect("ds");
    wait_until("one per node", || async {
        running_on(&list(c, "", "pods").await) == vec!["sim-node-0", "sim-node-1", "sim-node-2"]
    })
    .await;
    // A node joins.
    let late = SimAgent::new(
        c.clone(),
        SimConfig {
            prefix: "late".into(),
            nodes: 1,
            startup_delay: Duration::from_millis(50),
            renew_interval: Duration::from_secs(1),
            ..SimConfig::default()
        },
        None,
        None,
    );
    late.register(|| {}).await.expect("register");
    let task = tokio::spawn(late.run());
    wait_until("the new node covered", || async {
        running_on(&list(c, "", "pods").await)
            == vec!["late-0", "sim-node-0", "sim-node-1", "sim-node-2"]
    })
    .await;
    let ds = c
        .get(res("apps", "daemonsets"), Some("default"), "agent")
        .await
        .expect("ds");
    wait_until("status counts 4", || async {
        let ds = c
            .get(res("apps", "daemonsets"), Some("default"), "agent")
            .await
            .expect("ds");
        ds["status"]["desiredNumberScheduled"] == 4 && ds["status"]["numberReady"] == 4
    })
    .await;
    assert!(ds["metadata"]["name"] == "agent");
    // A template change rolls through every node.
    c.patch(
        res("apps", "daemonsets"),
        Some("default"),
        "agent",
        None,
        PatchType::Merge,
        &json!({"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "y"}]}}}}),
    )
    .await
    .expect("update");
    wait_until("rolled", || async {
        let pods = list(c, "", "pods").await;
        let live: Vec<&Value> = pods
            .iter()
            .filter(|p| {
                p["metadata"]["deletionTimestamp"].is_null() && p["status"]["phase"] == "Running"
            })
            .collect();
        live.len() == 4
            && live
                .iter()
                .all(|p| p["spec"]["containers"][0]["image"] == "y")
    })
    .await;
    task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statefulset_comes_up_in_order_and_scales_down_in_reverse() {
    let s = shard(3).await;
    let c = &s.client;
    c.create(
        res("apps", "statefulsets"),
        Some("default"),
        &json!({"apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": {"name": "db", "namespace": "default"},
            "spec": {"replicas": 4, "serviceName": "db", "selector": {"matchLabels": {"app": "db"}},
                "template": {"metadata": {"labels": {"app": "db"}},
                    "spec": {"containers": [{"name": "c", "image": "x"}]}}}}),
    )
    .await
    .expect("sts");
    let names = |pods: &[Value]| -> Vec<String> {
        let mut v: Vec<String> = pods
            .iter()
            .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
            .filter_map(|p| p["metadata"]["name"].as_str().map(str::to_owned))
            .collect();
        v.sort();
        v
    };
    // While it comes up, a pod exists only if every lower ordinal runs.
    for i in 0.. {
        let pods = list(c, "", "pods").await;
        for p in &pods {
            let n: usize = p["metadata"]["name"]
                .as_str()
                .and_then(|n| n.strip_prefix("db-"))
                .and_then(|n| n.parse().ok())
                .expect("ordinal");
            for lower in 0..n {
                let ok = pods.iter().any(|q| {
                    q["metadata"]["name"] == format!("db-{lower}")
                        && q["status"]["phase"] == "Running"
                });
                assert!(ok, "db-{n} exists before db-{lower} runs");
            }
        }
        if names(&pods) == vec!["db-0", "db-1", "db-2", "db-3"]
            && pods.iter().all(|p| p["status"]["phase"] == "Running")
        {
            break;
        }
        assert!(i < 2_000, "the set did not come up");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let p = c
        .get(res("", "pods"), Some("default"), "db-2")
        .await
        .expect("pod");
    assert_eq!(p["spec"]["hostname"], "db-2");
    assert_eq!(p["spec"]["subdomain"], "db");
    // Scale down to 1: db-3 goes before db-2, which goes before db-1 (in the order of the
    // watch's DELETED events: one poll could see two go at once).
    let pods = Events::start(c, "", "pods", "default").await;
    c.patch(
        res("apps", "statefulsets"),
        Some("default"),
        "db",
        None,
        PatchType::Merge,
        &json!({"spec": {"replicas": 1}}),
    )
    .await
    .expect("scale");
    wait_until("scaled down to db-0", || async {
        names(&list(c, "", "pods").await) == vec!["db-0"]
    })
    .await;
    assert_eq!(
        pods.deleted(),
        vec!["db-3", "db-2", "db-1"],
        "reverse order"
    );
    // Each went only after the one above it was gone: no two were terminating at once.
    let mut terminating = std::collections::BTreeSet::new();
    for (ty, p) in pods.seen() {
        let name = p["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        match ty.as_str() {
            "DELETED" => {
                terminating.remove(&name);
            }
            _ if p["metadata"]["deletionTimestamp"].is_string() => {
                terminating.insert(name);
            }
            _ => {}
        }
        assert!(
            terminating.len() <= 1,
            "ordered scale-down, one at a time: {terminating:?}"
        );
    }
}
