//! Node lifecycle and Endpoints in a working shard: a failed node goes NotReady and tainted,
//! its pods are evicted and replaced elsewhere; a Service's Endpoints list its ready pods.

mod support;

use std::collections::HashSet;

use serde_json::json;
use support::{list, shard, wait_until};
use tessera_client::types::NODE_LEASE_ANNOTATION;
use tessera_controllers::context::res;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_leave_a_failed_node_and_are_replaced_elsewhere() {
    let s = shard(3).await;
    let c = &s.client;
    c.create(
        res("apps", "replicasets"),
        Some("default"),
        &json!({"apiVersion": "apps/v1", "kind": "ReplicaSet",
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {"replicas": 6, "selector": {"matchLabels": {"app": "web"}},
                "template": {"metadata": {"labels": {"app": "web"}},
                    // Without this the API gives each pod 300 s of it.
                    "spec": {"tolerations": [{"key": "node.kubernetes.io/unreachable",
                        "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 1}],
                        "containers": [{"name": "c", "image": "x"}]}}}}),
    )
    .await
    .expect("rs");
    let running_on = |pods: &[serde_json::Value], node: &str| {
        pods.iter()
            .filter(|p| {
                p["spec"]["nodeName"] == node && p["metadata"]["deletionTimestamp"].is_null()
            })
            .count()
    };
    wait_until("6 running", || async {
        list(c, "", "pods")
            .await
            .iter()
            .filter(|p| p["status"]["phase"] == "Running")
            .count()
            == 6
    })
    .await;
    let pods = list(c, "", "pods").await;
    // The API gave each pod the not-ready toleration it lacked; its own unreachable one stands.
    let tolerations = pods[0]["spec"]["tolerations"].to_string();
    assert!(
        tolerations.contains(
            r#""key":"node.kubernetes.io/not-ready","operator":"Exists","tolerationSeconds":300"#
        ) || (tolerations.contains("node.kubernetes.io/not-ready") && tolerations.contains("300")),
        "{tolerations}"
    );
    assert!(
        tolerations.contains(r#""tolerationSeconds":1"#),
        "{tolerations}"
    );
    let victim = ["sim-node-0", "sim-node-1", "sim-node-2"]
        .into_iter()
        .max_by_key(|n| running_on(&pods, n))
        .expect("a node");
    assert!(running_on(&pods, victim) > 0);
    assert!(s.agent.fail_node(victim).await.expect("fail the node"));
    wait_until("node NotReady and tainted", || async {
        let n = c.get(res("", "nodes"), None, victim).await.expect("node");
        let unknown = n["status"]["conditions"].as_array().is_some_and(|cs| {
            cs.iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "Unknown")
        });
        let tainted = n["spec"]["taints"]
            .to_string()
            .contains("node.kubernetes.io/unreachable");
        unknown && tainted
    })
    .await;
    wait_until("replaced on healthy nodes", || async {
        let pods = list(c, "", "pods").await;
        let healthy: Vec<_> = pods
            .iter()
            .filter(|p| {
                p["metadata"]["deletionTimestamp"].is_null()
                    && p["status"]["phase"] == "Running"
                    && p["spec"]["nodeName"] != victim
            })
            .collect();
        healthy.len() == 6
    })
    .await;
    // Nothing new went to the dead node.
    let pods = list(c, "", "pods").await;
    assert_eq!(
        running_on(&pods, victim),
        0,
        "evicted pods are terminating, none new placed there"
    );
    // The victim left the Lease its mates share for one of its own; they stay Ready.
    let shared = s.agent.shared_lease().expect("hollow nodes share a Lease");
    for n in ["sim-node-0", "sim-node-1", "sim-node-2"] {
        let node = c.get(res("", "nodes"), None, n).await.expect("node");
        let annotation = &node["metadata"]["annotations"][NODE_LEASE_ANNOTATION];
        if n == victim {
            assert!(annotation.is_null(), "{node}");
            assert_eq!(ready(&node), "Unknown");
        } else {
            assert_eq!(annotation, shared, "{node}");
            assert_eq!(ready(&node), "True", "{node}");
            assert!(node["spec"]["taints"].is_null(), "{node}");
        }
    }
    let own = c
        .get(
            res("coordination.k8s.io", "leases"),
            Some("kube-node-lease"),
            victim,
        )
        .await
        .expect("the failed node's own Lease");
    assert_eq!(own["spec"]["holderIdentity"], victim);
}

fn ready(node: &serde_json::Value) -> String {
    node["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == "Ready")
        .and_then(|c| c["status"].as_str())
        .unwrap_or_default()
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_agent_takes_its_nodes_down_together_and_its_restart_brings_them_back() {
    let s = shard(3).await;
    let c = &s.client;
    let names = ["sim-node-0", "sim-node-1", "sim-node-2"];
    let leases = res("coordination.k8s.io", "leases");
    // One Lease stands for all three; none of them has one of its own.
    let shared = s.agent.shared_lease().expect("shared").to_owned();
    let held = c
        .get(leases, Some("kube-node-lease"), &shared)
        .await
        .expect("the shared Lease");
    assert_eq!(held["spec"]["holderIdentity"], shared.as_str());
    for n in names {
        assert_eq!(
            c.get(leases, Some("kube-node-lease"), n)
                .await
                .expect_err("no Lease per node")
                .code,
            404
        );
    }
    let states = || async {
        let mut out = Vec::new();
        for n in names {
            let node = c.get(res("", "nodes"), None, n).await.expect("node");
            let tainted = node["spec"]["taints"]
                .to_string()
                .contains("node.kubernetes.io/unreachable");
            out.push((ready(&node), tainted));
        }
        out
    };
    // The shared Lease is renewed (1 s here, grace 2 s): the nodes stay Ready past the grace.
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    assert!(
        states().await.iter().all(|(r, t)| r == "True" && !t),
        "{:?}",
        states().await
    );
    s.kill_agent();
    wait_until(
        "every node of the dead agent NotReady and tainted",
        || async { states().await.iter().all(|(r, t)| r == "Unknown" && *t) },
    )
    .await;
    // The agent comes back (a new process): it takes the Lease over, reports Ready, and the
    // controller lifts the taints.
    let again = tessera_agent::sim::SimAgent::new(
        c.clone(),
        tessera_agent::sim::SimConfig {
            nodes: 3,
            cpu: "2".into(),
            renew_interval: std::time::Duration::from_secs(1),
            ..Default::default()
        },
        None,
        None,
    );
    again.register(|| {}).await.expect("register again");
    let run = tokio::spawn(again.clone().run());
    wait_until("every node Ready and untainted again", || async {
        states().await.iter().all(|(r, t)| r == "True" && !t)
    })
    .await;
    run.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoints_list_ready_pods() {
    let s = shard(2).await;
    let c = &s.client;
    c.create(
        res("", "services"),
        Some("default"),
        &json!({"metadata": {"name": "web", "namespace": "default"},
            "spec": {"selector": {"app": "web"}, "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}}),
    )
    .await
    .expect("svc");
    c.create(
        res("apps", "replicasets"),
        Some("default"),
        &json!({"apiVersion": "apps/v1", "kind": "ReplicaSet",
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}},
                "template": {"metadata": {"labels": {"app": "web"}},
                    "spec": {"containers": [{"name": "c", "image": "x", "ports": [{"name": "http", "containerPort": 8080}]}]}}}}),
    )
    .await
    .expect("rs");
    wait_until("3 ready endpoints", || async {
        c.get(res("", "endpoints"), Some("default"), "web")
            .await
            .is_ok_and(|e| {
                e["subsets"][0]["addresses"]
                    .as_array()
                    .is_some_and(|a| a.len() == 3)
            })
    })
    .await;
    let e = c
        .get(res("", "endpoints"), Some("default"), "web")
        .await
        .expect("eps");
    assert_eq!(
        e["subsets"][0]["ports"][0]["port"], 8080,
        "named target port resolved"
    );
    let ips: HashSet<String> = list(c, "", "pods")
        .await
        .iter()
        .filter_map(|p| p["status"]["podIP"].as_str().map(str::to_owned))
        .collect();
    let listed: HashSet<String> = e["subsets"][0]["addresses"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|a| a["ip"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(ips, listed);
    // Scale to 1: the Endpoints follow.
    c.patch(
        res("apps", "replicasets"),
        Some("default"),
        "web",
        None,
        tessera_apiserver::request::PatchType::Merge,
        &json!({"spec": {"replicas": 1}}),
    )
    .await
    .expect("scale");
    wait_until("1 endpoint", || async {
        c.get(res("", "endpoints"), Some("default"), "web")
            .await
            .is_ok_and(|e| {
                e["subsets"][0]["addresses"]
                    .as_array()
                    .is_some_and(|a| a.len() == 1)
            })
    })
    .await;
    // The Service goes: so do its Endpoints.
    c.delete(res("", "services"), Some("default"), "web", None)
        .await
        .expect("delete");
    wait_until("endpoints gone", || async {
        c.get(res("", "endpoints"), Some("default"), "web")
            .await
            .is_err()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_no_execute_taint_on_a_ready_node_evicts_the_pods_that_do_not_tolerate_it() {
    let s = shard(2).await;
    let c = &s.client;
    // Two pods pinned to sim-node-0: one tolerates `drain`, one does not.
    for (name, tolerations) in [
        (
            "stays",
            json!([{"key": "drain", "operator": "Exists", "effect": "NoExecute"}]),
        ),
        ("goes", json!([])),
    ] {
        c.create(
            res("", "pods"),
            Some("default"),
            &json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": "default"},
                "spec": {"nodeName": "sim-node-0", "tolerations": tolerations,
                    "containers": [{"name": "c", "image": "x"}]}}),
        )
        .await
        .expect("pod");
    }
    wait_until("both running", || async {
        list(c, "", "pods")
            .await
            .iter()
            .filter(|p| p["status"]["phase"] == "Running")
            .count()
            == 2
    })
    .await;
    // An admin's taint on a node that stays Ready (no lease lapses).
    c.patch(
        res("", "nodes"),
        None,
        "sim-node-0",
        None,
        tessera_client::request::PatchType::Merge,
        &json!({"spec": {"taints": [{"key": "drain", "value": "now", "effect": "NoExecute",
            "timeAdded": tessera_core::time::rfc3339(tessera_core::time::now_secs())}]}}),
    )
    .await
    .expect("taint");
    wait_until("the pod that does not tolerate it evicted", || async {
        let pods = list(c, "", "pods").await;
        pods.iter().all(|p| {
            p["metadata"]["name"] != "goes" || !p["metadata"]["deletionTimestamp"].is_null()
        })
    })
    .await;
    let stays = c
        .get(res("", "pods"), Some("default"), "stays")
        .await
        .expect("the tolerating pod");
    assert!(stays["metadata"]["deletionTimestamp"].is_null(), "{stays}");
    // The node kept its Ready condition and the admin's taint: nothing took it off.
    let node = c
        .get(res("", "nodes"), None, "sim-node-0")
        .await
        .expect("node");
    assert_eq!(ready(&node), "True");
    assert!(
        node["spec"]["taints"].to_string().contains("drain"),
        "{node}"
    );
}
