//! The issue's kubectl scenarios against `tessera up` (a real process, the real kubectl):
//! pods are placed on simulated nodes and run; Deployments scale, roll and roll back;
//! DaemonSets, StatefulSets, Jobs, CronJobs and Services work; a pod that fits nowhere says
//! why; deleting a namespace removes everything in it.

mod support;

use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::Value;
use support::{Cluster, Running, free_addr, wait_for};

fn json(c: &Cluster, args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.extend(["-o", "json"]);
    serde_json::from_str(&c.ok(&all)).expect("kubectl -o json prints JSON")
}

fn items(c: &Cluster, args: &[&str]) -> Vec<Value> {
    json(c, args)["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

fn ready(p: &Value) -> bool {
    p["metadata"]["deletionTimestamp"].is_null()
        && p["status"]["conditions"].as_array().is_some_and(|cs| {
            cs.iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        })
}

const DEPLOYMENT: &str = "apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  namespace: work
spec:
  replicas: 50
  selector:
    matchLabels: {app: web}
  strategy:
    rollingUpdate: {maxSurge: 25%, maxUnavailable: 25%}
  template:
    metadata:
      labels: {app: web}
    spec:
      containers:
      - name: web
        image: nginx:1.27
        resources:
          requests: {cpu: 100m, memory: 64Mi}
";

#[test]
fn workloads_run_on_a_shard_through_kubectl() {
    let c = Cluster::start_with(
        "up",
        &[
            "--nodes-per-shard=6",
            "--startup-delay-ms=100",
            "--node-pods=110",
        ],
    );
    c.ok(&["create", "namespace", "work"]);
    let nodes = items(&c, &["get", "nodes"]);
    assert_eq!(nodes.len(), 6);

    // A Deployment of 50 reaches Available.
    let d = c.file("deploy.yaml", DEPLOYMENT);
    c.ok(&["apply", "-f", &d]);
    c.ok(&[
        "rollout",
        "status",
        "deployment/web",
        "-n",
        "work",
        "--timeout=120s",
    ]);
    let dep = json(&c, &["get", "deployment", "web", "-n", "work"]);
    assert_eq!(dep["status"]["availableReplicas"], 50);

    // Scale to 5 and to 80.
    for n in ["5", "80"] {
        c.ok(&[
            "scale",
            "deployment/web",
            "-n",
            "work",
            &format!("--replicas={n}"),
        ]);
        c.ok(&[
            "rollout",
            "status",
            "deployment/web",
            "-n",
            "work",
            "--timeout=120s",
        ]);
        let pods = items(&c, &["get", "pods", "-n", "work", "-l", "app=web"]);
        let live = pods
            .iter()
            .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
            .count();
        assert_eq!(live.to_string(), n);
    }

    // A rolling update never drops below replicas - maxUnavailable (80 - 20) ready.
    c.ok(&[
        "set",
        "image",
        "deployment/web",
        "-n",
        "work",
        "web=nginx:1.28",
    ]);
    let mut min_ready = usize::MAX;
    let mut samples = 0;
    let done = wait_for(Duration::from_secs(180), || {
        let pods = items(&c, &["get", "pods", "-n", "work", "-l", "app=web"]);
        min_ready = min_ready.min(pods.iter().filter(|p| ready(p)).count());
        samples += 1;
        let all_new = pods
            .iter()
            .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
            .all(|p| p["spec"]["containers"][0]["image"] == "nginx:1.28");
        let d = json(&c, &["get", "deployment", "web", "-n", "work"]);
        (all_new
            && d["status"]["updatedReplicas"] == 80
            && d["status"]["availableReplicas"] == 80
            && d["status"]["replicas"] == 80)
            .then_some(())
    });
    if done.is_none() {
        let d = c.ok(&["get", "deployment", "web", "-n", "work", "-o", "yaml"]);
        let rs = c.ok(&["get", "replicasets", "-n", "work", "-o", "wide"]);
        let ev = c.ok(&["get", "events", "-n", "work"]);
        panic!(
            "the rolling update did not finish:\n{d}\n{rs}\n{}",
            ev.lines().rev().take(40).collect::<Vec<_>>().join("\n")
        );
    }
    assert!(
        min_ready >= 60,
        "ready pods fell to {min_ready} during the rollout ({samples} samples)"
    );
    let history = c.ok(&["rollout", "history", "deployment/web", "-n", "work"]);
    assert!(history.contains('1') && history.contains('2'), "{history}");

    // Roll back.
    c.ok(&["rollout", "undo", "deployment/web", "-n", "work"]);
    c.ok(&[
        "rollout",
        "status",
        "deployment/web",
        "-n",
        "work",
        "--timeout=120s",
    ]);
    let dep = json(&c, &["get", "deployment", "web", "-n", "work"]);
    assert_eq!(
        dep["spec"]["template"]["spec"]["containers"][0]["image"],
        "nginx:1.27"
    );

    // A Service's Endpoints list its ready pods.
    c.ok(&["expose", "deployment/web", "-n", "work", "--port=80"]);
    let eps = wait_for(Duration::from_secs(30), || {
        let e = json(&c, &["get", "endpoints", "web", "-n", "work"]);
        let n = e["subsets"][0]["addresses"].as_array().map_or(0, Vec::len);
        (n == 80).then_some(e)
    });
    assert!(eps.is_some(), "80 endpoints");

    // A DaemonSet covers every node, and follows a new one.
    let ds = c.file("ds.yaml", "apiVersion: apps/v1\nkind: DaemonSet\nmetadata: {name: logs, namespace: work}\nspec:\n  selector: {matchLabels: {app: logs}}\n  template:\n    metadata: {labels: {app: logs}}\n    spec: {containers: [{name: c, image: fluentbit}]}\n");
    c.ok(&["apply", "-f", &ds]);
    c.ok(&[
        "rollout",
        "status",
        "daemonset/logs",
        "-n",
        "work",
        "--timeout=60s",
    ]);
    let covered = |c: &Cluster| {
        let mut n: Vec<String> = items(c, &["get", "pods", "-n", "work", "-l", "app=logs"])
            .iter()
            .filter(|p| p["status"]["phase"] == "Running")
            .filter_map(|p| p["spec"]["nodeName"].as_str().map(str::to_owned))
            .collect();
        n.sort();
        n.dedup();
        n.len()
    };
    assert_eq!(covered(&c), 6);
    let _extra = Running(
        std::process::Command::new(env!("CARGO_BIN_EXE_tessera"))
            .args([
                "agent",
                "--sim-nodes",
                "1",
                "--prefix",
                "extra",
                "--metrics-addr",
                &free_addr(),
            ])
            .arg("--kubeconfig")
            .arg(&c.kubeconfig)
            .env("TESSERA_LOG", "warn")
            .stdout(Stdio::null())
            .spawn()
            .expect("tessera agent"),
    );
    assert!(
        wait_for(Duration::from_secs(60), || (covered(&c) == 7).then_some(())).is_some(),
        "the daemon set followed the new node"
    );

    // A StatefulSet comes up in order.
    let sts = c.file("sts.yaml", "apiVersion: apps/v1\nkind: StatefulSet\nmetadata: {name: db, namespace: work}\nspec:\n  replicas: 3\n  serviceName: db\n  selector: {matchLabels: {app: db}}\n  template:\n    metadata: {labels: {app: db}}\n    spec: {containers: [{name: c, image: postgres}]}\n");
    c.ok(&["apply", "-f", &sts]);
    c.ok(&[
        "rollout",
        "status",
        "statefulset/db",
        "-n",
        "work",
        "--timeout=60s",
    ]);
    let mut started: Vec<(String, String)> =
        items(&c, &["get", "pods", "-n", "work", "-l", "app=db"])
            .iter()
            .map(|p| {
                (
                    p["status"]["startTime"].as_str().unwrap_or("").to_owned(),
                    p["metadata"]["name"].as_str().unwrap_or("").to_owned(),
                )
            })
            .collect();
    started.sort();
    let order: Vec<&str> = started.iter().map(|(_, n)| n.as_str()).collect();
    assert_eq!(order, vec!["db-0", "db-1", "db-2"]);

    // A Job of 20 completions, 5 at a time, completes.
    let job = c.file("job.yaml", "apiVersion: batch/v1\nkind: Job\nmetadata: {name: batch, namespace: work}\nspec:\n  completions: 20\n  parallelism: 5\n  template:\n    metadata:\n      annotations: {tessera.io/sim-run-seconds: \"1\"}\n    spec:\n      restartPolicy: Never\n      containers: [{name: c, image: busybox}]\n");
    c.ok(&["apply", "-f", &job]);
    c.ok(&[
        "wait",
        "--for=condition=complete",
        "job/batch",
        "-n",
        "work",
        "--timeout=120s",
    ]);
    assert_eq!(
        json(&c, &["get", "job", "batch", "-n", "work"])["status"]["succeeded"],
        20
    );

    // A CronJob fires (the next minute boundary).
    let cj = c.file("cj.yaml", "apiVersion: batch/v1\nkind: CronJob\nmetadata: {name: tick, namespace: work}\nspec:\n  schedule: \"* * * * *\"\n  jobTemplate:\n    spec:\n      template:\n        metadata:\n          annotations: {tessera.io/sim-run-seconds: \"0\"}\n        spec:\n          restartPolicy: Never\n          containers: [{name: c, image: busybox}]\n");
    c.ok(&["apply", "-f", &cj]);
    let fired = wait_for(Duration::from_secs(75), || {
        items(&c, &["get", "jobs", "-n", "work"])
            .iter()
            .any(|j| j["metadata"]["ownerReferences"][0]["kind"] == "CronJob")
            .then_some(())
    });
    assert!(fired.is_some(), "the CronJob created a Job");

    // A pod asking for more than any node has stays Pending, and describe says why.
    c.ok(&["run", "huge", "-n", "work", "--image=busybox", "--overrides",
        r#"{"spec":{"containers":[{"name":"huge","image":"busybox","resources":{"requests":{"cpu":"64"}}}]}}"#]);
    let why = wait_for(Duration::from_secs(30), || {
        let d = c.ok(&["describe", "pod", "huge", "-n", "work"]);
        d.contains("FailedScheduling").then_some(d)
    })
    .expect("a FailedScheduling event");
    assert!(
        why.contains("0/7 nodes are available: 7 Insufficient cpu."),
        "{why}"
    );
    assert_eq!(
        json(&c, &["get", "pod", "huge", "-n", "work"])["status"]["phase"],
        "Pending"
    );

    // Deleting the namespace removes everything in it.
    let started = Instant::now();
    c.ok(&["delete", "namespace", "work", "--timeout=120s"]);
    assert!(started.elapsed() < Duration::from_secs(120));
    let gone = c.kubectl(&["get", "namespace", "work"]);
    assert!(!gone.status.success(), "the namespace is gone");
    for kind in [
        "pods",
        "deployments",
        "replicasets",
        "daemonsets",
        "statefulsets",
        "jobs",
        "cronjobs",
        "services",
    ] {
        assert!(
            items(&c, &["get", kind, "-n", "work"]).is_empty(),
            "{kind} left behind"
        );
    }
}
