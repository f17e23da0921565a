//! The Deployment controller in a working shard: rollouts keep enough pods ready while they
//! run, revisions are numbered, rollbacks reuse the old set, Recreate never overlaps, pause
//! holds a rollout, scaling follows, old sets are pruned to the history limit.

mod support;

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use support::{list, shard, wait_until, wait_until_else};
use tessera_apiserver::client::Client;
use tessera_apiserver::request::PatchType;
use tessera_controllers::context::res;

fn deployment(name: &str, replicas: i64, image: &str, strategy: Value) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
            "strategy": strategy,
            "template": {"metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "c", "image": image,
                    "resources": {"requests": {"cpu": "10m"}}}]}}}})
}

async fn get(c: &Arc<dyn Client>, name: &str) -> Value {
    c.get(res("apps", "deployments"), Some("default"), name)
        .await
        .expect("deployment")
}

async fn patch(c: &Arc<dyn Client>, name: &str, p: Value) {
    c.patch(
        res("apps", "deployments"),
        Some("default"),
        name,
        None,
        PatchType::Merge,
        &p,
    )
    .await
    .expect("patch");
}

fn set_image(image: &str) -> Value {
    json!({"spec": {"template": {"spec": {"containers": [{"name": "c", "image": image,
        "resources": {"requests": {"cpu": "10m"}}}]}}}})
}

/// `kubectl rollout status`'s test: observed, all updated, no old replicas, all available.
async fn rolled_out(c: &Arc<dyn Client>, name: &str) -> bool {
    let d = get(c, name).await;
    let want = d["spec"]["replicas"].as_i64().unwrap_or(1);
    let s = &d["status"];
    d["metadata"]["generation"].as_i64() <= s["observedGeneration"].as_i64()
        && s["updatedReplicas"].as_i64() == Some(want)
        && s["replicas"].as_i64() == Some(want)
        && s["availableReplicas"].as_i64() == Some(want)
}

fn ready(p: &Value) -> bool {
    p["metadata"]["deletionTimestamp"].is_null()
        && p["status"]["conditions"].as_array().is_some_and(|cs| {
            cs.iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        })
}

async fn pods_of(c: &Arc<dyn Client>, app: &str) -> Vec<Value> {
    list(c, "", "pods")
        .await
        .into_iter()
        .filter(|p| p["metadata"]["labels"]["app"] == app)
        .collect()
}

async fn sets_of(c: &Arc<dyn Client>, app: &str) -> Vec<Value> {
    list(c, "apps", "replicasets")
        .await
        .into_iter()
        .filter(|p| p["metadata"]["labels"]["app"] == app)
        .collect()
}

fn revision(o: &Value) -> &str {
    o["metadata"]["annotations"]["deployment.kubernetes.io/revision"]
        .as_str()
        .unwrap_or("")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolling_update_keeps_enough_ready_and_rolls_back() {
    let s = shard(8).await;
    let c = &s.client;
    let strategy =
        json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 3, "maxUnavailable": 2}});
    c.create(
        res("apps", "deployments"),
        Some("default"),
        &deployment("web", 20, "nginx:1", strategy),
    )
    .await
    .expect("create");
    wait_until("20 available", || rolled_out(c, "web")).await;
    let d = get(c, "web").await;
    let progressing = d["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == "Progressing").cloned())
        .expect("Progressing");
    assert_eq!(progressing["reason"], "NewReplicaSetAvailable");
    assert_eq!(revision(&d), "1");

    // Roll to a new image, checking readiness and the surge all along. maxSurge bounds the
    // sets' replicas together, as in Kubernetes: pods an old set is scaling down may live a
    // moment longer, until its controller has deleted them.
    patch(c, "web", set_image("nginx:2")).await;
    let mut min_ready = usize::MAX;
    let mut max_wanted = 0;
    let mut polls = 0;
    loop {
        let pods = pods_of(c, "web").await;
        let wanted: i64 = sets_of(c, "web")
            .await
            .iter()
            .map(|s| s["spec"]["replicas"].as_i64().unwrap_or(0))
            .sum();
        min_ready = min_ready.min(pods.iter().filter(|p| ready(p)).count());
        max_wanted = max_wanted.max(wanted);
        polls += 1;
        let done = rolled_out(c, "web").await
            && pods
                .iter()
                .all(|p| p["spec"]["containers"][0]["image"] == "nginx:2");
        if done {
            break;
        }
        if polls >= 5_000 {
            panic!("the rollout did not finish:\n{}", explain(c, "web").await);
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    eprintln!("rollout: {polls} polls, min ready {min_ready}, most replicas wanted {max_wanted}");
    assert!(
        min_ready >= 18,
        "never below replicas - maxUnavailable ready: saw {min_ready}"
    );
    assert!(
        max_wanted <= 23,
        "the sets never want more than replicas + maxSurge: saw {max_wanted}"
    );
    assert!(
        polls > 3,
        "the rollout was observed while it ran ({polls} polls)"
    );
    let sets = sets_of(c, "web").await;
    assert_eq!(sets.len(), 2);
    let old = sets
        .iter()
        .find(|s| revision(s) == "1")
        .expect("revision 1");
    assert_eq!(old["spec"]["replicas"], 0);
    assert_eq!(revision(&get(c, "web").await), "2");

    // Roll back (what `kubectl rollout undo` writes): the old set comes back as revision 3.
    let old_name = old["metadata"]["name"].as_str().expect("name").to_owned();
    patch(c, "web", set_image("nginx:1")).await;
    wait_until_else(
        "rolled back",
        || async {
            rolled_out(c, "web").await
                && pods_of(c, "web")
                    .await
                    .iter()
                    .all(|p| p["spec"]["containers"][0]["image"] == "nginx:1")
        },
        || explain(c, "web"),
    )
    .await;
    let sets = sets_of(c, "web").await;
    assert_eq!(sets.len(), 2, "no third set: the old one was reused");
    let back = sets
        .iter()
        .find(|s| s["metadata"]["name"] == old_name.as_str())
        .expect("old set");
    assert_eq!(revision(back), "3");
    assert_eq!(back["spec"]["replicas"], 20);

    // Scale down and up.
    patch(c, "web", json!({"spec": {"replicas": 5}})).await;
    wait_until("5", || async {
        rolled_out(c, "web").await
            && pods_of(c, "web")
                .await
                .iter()
                .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
                .count()
                == 5
    })
    .await;
    patch(c, "web", json!({"spec": {"replicas": 30}})).await;
    wait_until("30", || async { rolled_out(c, "web").await }).await;
    assert_eq!(
        pods_of(c, "web").await.iter().filter(|p| ready(p)).count(),
        30
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recreate_never_overlaps_and_pause_holds_a_rollout() {
    let s = shard(4).await;
    let c = &s.client;
    c.create(
        res("apps", "deployments"),
        Some("default"),
        &deployment("db", 6, "pg:1", json!({"type": "Recreate"})),
    )
    .await
    .expect("create");
    wait_until("6 available", || rolled_out(c, "db")).await;
    patch(c, "db", set_image("pg:2")).await;
    let mut polls = 0;
    loop {
        let pods = pods_of(c, "db").await;
        let images: std::collections::HashSet<&str> = pods
            .iter()
            .filter_map(|p| p["spec"]["containers"][0]["image"].as_str())
            .collect();
        assert!(images.len() <= 1, "old and new pods at once: {images:?}");
        if rolled_out(c, "db").await && images == std::collections::HashSet::from(["pg:2"]) {
            break;
        }
        polls += 1;
        assert!(polls < 5_000, "the recreate did not finish");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }

    // Paused: a template change makes no new set until resumed.
    patch(c, "db", json!({"spec": {"paused": true}})).await;
    patch(c, "db", set_image("pg:3")).await;
    // Not a sleep: once the controller has observed this generation it has decided.
    wait_until("the paused change observed", || async {
        let d = get(c, "db").await;
        d["status"]["observedGeneration"] == d["metadata"]["generation"]
    })
    .await;
    assert_eq!(sets_of(c, "db").await.len(), 2, "no new set while paused");
    let d = get(c, "db").await;
    assert!(
        d["status"]["conditions"]
            .as_array()
            .is_some_and(|cs| cs.iter().any(|c| c["reason"] == "DeploymentPaused")),
        "{d}"
    );
    patch(c, "db", json!({"spec": {"paused": false}})).await;
    wait_until("resumed rollout", || async {
        rolled_out(c, "db").await
            && pods_of(c, "db")
                .await
                .iter()
                .all(|p| p["spec"]["containers"][0]["image"] == "pg:3")
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn old_sets_are_pruned_to_the_history_limit() {
    let s = shard(2).await;
    let c = &s.client;
    let mut d = deployment("api", 2, "api:0", json!({}));
    d["spec"]["revisionHistoryLimit"] = json!(1);
    c.create(res("apps", "deployments"), Some("default"), &d)
        .await
        .expect("create");
    for i in 1..=3 {
        wait_until("rolled out", || rolled_out(c, "api")).await;
        patch(c, "api", set_image(&format!("api:{i}"))).await;
    }
    wait_until("last rollout and pruning", || async {
        rolled_out(c, "api").await && sets_of(c, "api").await.len() == 2
    })
    .await;
    let mut revs: Vec<String> = sets_of(c, "api")
        .await
        .iter()
        .map(|s| revision(s).to_owned())
        .collect();
    revs.sort();
    assert_eq!(
        revs,
        vec!["3", "4"],
        "the newest old set and the current one"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scaling_mid_rollout_is_proportional() {
    let s = shard(3).await;
    let c = &s.client;
    let strategy = json!({"type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 3, "maxUnavailable": 0}});
    c.create(
        res("apps", "deployments"),
        Some("default"),
        &deployment("prop", 10, "v1", strategy),
    )
    .await
    .expect("create");
    wait_until("v1 rolled out", || async { rolled_out(c, "prop").await }).await;
    // A template whose pods fit nowhere: the rollout stops at 10 old + 3 new.
    patch(
        c,
        "prop",
        json!({"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "v2",
            "resources": {"requests": {"cpu": "100"}}}]}}}}),
    )
    .await;
    let sizes = || async {
        let mut v: Vec<(String, i64)> = sets_of(c, "prop")
            .await
            .iter()
            .map(|rs| {
                (
                    rs["spec"]["template"]["spec"]["containers"][0]["image"]
                        .as_str()
                        .unwrap_or("")
                        .to_owned(),
                    rs["spec"]["replicas"].as_i64().unwrap_or(0),
                )
            })
            .collect();
        v.sort();
        v
    };
    let stuck = vec![("v1".to_owned(), 10), ("v2".to_owned(), 3)];
    wait_until("stuck at 10 old + 3 new", || async {
        sizes().await == stuck
    })
    .await;
    // Scaled to 20 (23 with the surge): the 10 and the 3 sized for 13 grow in proportion,
    // to 18 and 5 (Kubernetes' numbers), rather than all 10 going to one set.
    patch(c, "prop", json!({"spec": {"replicas": 20}})).await;
    let grown = vec![("v1".to_owned(), 18), ("v2".to_owned(), 5)];
    wait_until("grown in proportion", || async { sizes().await == grown }).await;
    for rs in sets_of(c, "prop").await {
        let a = &rs["metadata"]["annotations"];
        assert_eq!(a["deployment.kubernetes.io/desired-replicas"], "20");
        assert_eq!(a["deployment.kubernetes.io/max-replicas"], "23");
    }
    // It stays there (the new pods still fit nowhere): once the controller has observed the
    // new size and written its status for these sets (23 pods), the sizes are still the ones
    // above. Then it finishes once they fit.
    wait_until("the resize observed", || async {
        let d = get(c, "prop").await;
        d["status"]["observedGeneration"] == d["metadata"]["generation"]
            && d["status"]["replicas"] == 23
    })
    .await;
    assert_eq!(sizes().await, grown);
    patch(c, "prop", set_image("v2")).await;
    wait_until_else(
        "v2 rolled out at 20",
        || rolled_out(c, "prop"),
        || explain(c, "prop"),
    )
    .await;
    assert_eq!(
        pods_of(c, "prop").await.iter().filter(|p| ready(p)).count(),
        20
    );
}

/// The sets, pods and events of a Deployment, for a failure message.
async fn explain(c: &Arc<dyn Client>, name: &str) -> String {
    let mut out = String::new();
    for r in sets_of(c, name).await {
        out += &format!(
            "set {} {} spec.replicas={} status={}\n",
            r["metadata"]["name"], r["metadata"]["annotations"], r["spec"]["replicas"], r["status"]
        );
    }
    for p in pods_of(c, name).await {
        out += &format!(
            "pod {} {} {} deleting={} owner={}\n",
            p["metadata"]["name"],
            p["spec"]["containers"][0]["image"],
            p["status"]["phase"],
            p["metadata"]["deletionTimestamp"],
            p["metadata"]["ownerReferences"][0]["name"]
        );
    }
    out += &format!("deployment status {}\n", get(c, name).await["status"]);
    for e in list(c, "", "events").await {
        out += &format!(
            "event {} {} {}\n",
            e["metadata"]["creationTimestamp"], e["involvedObject"]["name"], e["message"]
        );
    }
    out
}
