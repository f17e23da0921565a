//! The issue's kubectl scenarios against `tessera up` (a real process, the real kubectl):
//! pods are placed on simulated nodes and run; Deployments scale, roll and roll back;
//! DaemonSets, StatefulSets, Jobs, CronJobs and Services work; a pod that fits nowhere says
//! why; deleting a namespace removes everything in it.

mod support;

use std::process::Stdio;
use std::time::Duration;

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
    // A CronJob, made first so that its minute passes while the rest runs.
    let cj = c.file("cj.yaml", "apiVersion: batch/v1\nkind: CronJob\nmetadata: {name: tick, namespace: work}\nspec:\n  schedule: \"* * * * *\"\n  jobTemplate:\n    spec:\n      template:\n        metadata:\n          annotations: {tessera.io/sim-run-seconds: \"0\"}\n        spec:\n          restartPolicy: Never\n          containers: [{name: c, image: busybox}]\n");
    c.ok(&["apply", "-f", &cj]);
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
    let ds_rolled = |c: &Cluster| {
        c.ok(&[
            "rollout",
            "status",
            "daemonset/logs",
            "-n",
            "work",
            "--timeout=60s",
        ]);
    };
    ds_rolled(&c);
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
    // Its history: a new template is revision 2; undo brings back the first template as
    // revision 3.
    let ds_history = |c: &Cluster| -> Vec<String> {
        c.ok(&["rollout", "history", "daemonset/logs", "-n", "work"])
            .lines()
            .filter_map(|l| l.split_whitespace().next())
            .filter(|w| w.chars().all(|ch| ch.is_ascii_digit()))
            .map(str::to_owned)
            .collect()
    };
    assert_eq!(ds_history(&c), ["1"]);
    c.ok(&[
        "set",
        "image",
        "daemonset/logs",
        "c=fluentbit:2",
        "-n",
        "work",
    ]);
    ds_rolled(&c);
    assert_eq!(ds_history(&c), ["1", "2"]);
    let shown = c.ok(&[
        "rollout",
        "history",
        "daemonset/logs",
        "-n",
        "work",
        "--revision=1",
    ]);
    // `--revision=1` shows that revision's template.
    assert!(
        shown
            .lines()
            .any(|l| l.split_whitespace().eq(["Image:", "fluentbit"])),
        "{shown}"
    );
    c.ok(&["rollout", "undo", "daemonset/logs", "-n", "work"]);
    ds_rolled(&c);
    assert_eq!(ds_history(&c), ["2", "3"]);
    let image = c.ok(&[
        "get",
        "daemonset",
        "logs",
        "-n",
        "work",
        "-o",
        "jsonpath={.spec.template.spec.containers[0].image}",
    ]);
    assert_eq!(image, "fluentbit");

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
    let sts_history = c.ok(&["rollout", "history", "statefulset/db", "-n", "work"]);
    assert!(
        sts_history
            .lines()
            .any(|l| l.split_whitespace().next() == Some("1")),
        "{sts_history}"
    );

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

    // The CronJob made at the start has fired by now (the first minute boundary after it,
    // which the steps above mostly spent).
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

    // Deleting the namespace removes everything in it: it is Terminating at once, and gone
    // (NotFound, not just any failure) once emptied.
    c.ok(&["delete", "namespace", "work", "--wait=false"]);
    let phase = c.kubectl(&["get", "namespace", "work", "-o", "jsonpath={.status.phase}"]);
    assert!(
        !phase.status.success() || String::from_utf8_lossy(&phase.stdout) == "Terminating",
        "a namespace being deleted is Terminating: {phase:?}"
    );
    let gone = wait_for(Duration::from_secs(120), || {
        let out = c.kubectl(&["get", "namespace", "work"]);
        (!out.status.success()).then(|| String::from_utf8_lossy(&out.stderr).into_owned())
    })
    .expect("the namespace went away");
    assert!(gone.contains("NotFound"), "{gone}");
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

/// `kubectl run NAME` of a `sh -c SCRIPT` pod on `node`.
fn run_on(c: &Cluster, name: &str, node: &str, restart: &str, script: &str) {
    let overrides = format!("{{\"spec\":{{\"nodeName\":\"{node}\"}}}}");
    c.ok(&[
        "run",
        name,
        "--image=busybox",
        &format!("--restart={restart}"),
        &format!("--overrides={overrides}"),
        "--command",
        "--",
        "sh",
        "-c",
        script,
    ]);
}

/// `kubectl logs` and `kubectl top` of pods on process nodes: one inside `tessera up`, one
/// in a separate `tessera agent` — the API server reaches each through its Node's endpoint.
#[test]
fn kubectl_logs_and_top_read_process_pods() {
    let c = Cluster::start_with("up", &["--nodes-per-shard=0", "--process-nodes=1"]);
    let _remote = c.component(&[
        "agent",
        "--sim-nodes=0",
        "--process-nodes=1",
        "--prefix=remote",
        "--log-dir",
        &c.dir.path().join("remote-logs").display().to_string(),
        "--state-dir",
        &c.dir.path().join("remote-pods").display().to_string(),
    ]);
    assert!(
        wait_for(Duration::from_secs(60), || {
            (items(&c, &["get", "nodes"]).len() == 2).then_some(())
        })
        .is_some(),
        "both process nodes registered"
    );
    let phase =
        |name: &str| -> String { c.ok(&["get", "pod", name, "-o", "jsonpath={.status.phase}"]) };
    let wait_phase = |name: &str, want: &str| {
        assert!(
            wait_for(Duration::from_secs(60), || (phase(name) == want)
                .then_some(()))
            .is_some(),
            "{name} reached {want}: {}",
            c.ok(&["get", "pod", name, "-o", "yaml"])
        );
    };

    // A finished pod's output, whole and its tail.
    run_on(
        &c,
        "hello",
        "proc-0",
        "Never",
        "echo hello from tessera; echo second line",
    );
    wait_phase("hello", "Succeeded");
    assert_eq!(
        c.ok(&["logs", "hello"]),
        "hello from tessera\nsecond line\n"
    );
    assert_eq!(c.ok(&["logs", "hello", "--tail=1"]), "second line\n");
    let stamped = c.ok(&["logs", "hello", "--timestamps"]);
    assert!(
        stamped
            .lines()
            .all(|l| l.split_once(' ').is_some_and(|(ts, _)| ts.ends_with('Z'))),
        "{stamped}"
    );

    // The same from the agent running as its own process.
    run_on(
        &c,
        "far",
        "remote-proc-0",
        "Never",
        "echo from the remote agent",
    );
    wait_phase("far", "Succeeded");
    assert_eq!(c.ok(&["logs", "far"]), "from the remote agent\n");

    // -f streams while the container runs.
    run_on(
        &c,
        "ticker",
        "proc-0",
        "Always",
        "i=0; while true; do echo tick $i; i=$((i+1)); sleep 0.2; done",
    );
    wait_phase("ticker", "Running");
    let mut follow = c
        .command(&["logs", "-f", "ticker"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("kubectl logs -f");
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(
        follow.stdout.take().expect("stdout"),
    ));
    // Lines written after the follow began arrive on the open stream.
    let seen: Vec<String> = (0..15)
        .map(|_| lines.next().expect("a line").expect("text"))
        .collect();
    let _ = follow.kill();
    let _ = follow.wait();
    for (i, l) in seen.iter().enumerate() {
        assert_eq!(l, &format!("tick {i}"));
    }

    // `kubectl top` reads the agents' usage through metrics.k8s.io.
    let top = wait_for(Duration::from_secs(60), || {
        let out = c.kubectl(&["top", "pod", "ticker", "--no-headers"]);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        (out.status.success() && text.starts_with("ticker")).then_some(text)
    })
    .expect("kubectl top pod shows the ticker");
    let cols: Vec<&str> = top.split_whitespace().collect();
    assert_eq!(cols.len(), 3, "{top}");
    assert!(cols[1].ends_with('m') && cols[2].ends_with("Mi"), "{top}");
    let nodes = c.ok(&["top", "node", "--no-headers"]);
    assert!(nodes.lines().any(|l| l.starts_with("proc-0 ")), "{nodes}");

    // --previous: the run before a restart.
    run_on(
        &c,
        "crash",
        "proc-0",
        "Always",
        "echo run at $(date +%s%N); exit 1",
    );
    assert!(
        wait_for(Duration::from_secs(60), || {
            let n = c.ok(&[
                "get",
                "pod",
                "crash",
                "-o",
                "jsonpath={.status.containerStatuses[0].restartCount}",
            ]);
            (n.parse::<u32>().unwrap_or(0) >= 1).then_some(())
        })
        .is_some(),
        "crash restarted"
    );
    let previous = c.ok(&["logs", "crash", "--previous"]);
    assert!(previous.starts_with("run at "), "{previous}");

    // What cannot be shown says why.
    let err = c.fails(&["logs", "nosuchpod"]);
    assert!(
        err.contains("NotFound") || err.contains("not found"),
        "{err}"
    );
    let err = c.fails(&["logs", "hello", "--previous"]);
    assert!(err.contains("previous terminated container"), "{err}");
    let err = c.fails(&["logs", "hello", "-c", "sidecar"]);
    assert!(err.contains("container sidecar is not valid"), "{err}");

    // Nothing keeps running after the test: the pods are deleted and their processes stop.
    c.ok(&["delete", "pod", "--all", "--grace-period=1", "--wait=true"]);
}

const SPREAD: &str = "apiVersion: apps/v1
kind: Deployment
metadata: {name: spread, namespace: zoned}
spec:
  replicas: 9
  selector: {matchLabels: {app: spread}}
  template:
    metadata: {labels: {app: spread}}
    spec:
      topologySpreadConstraints:
      - {maxSkew: 1, topologyKey: topology.kubernetes.io/zone, whenUnsatisfiable: DoNotSchedule,
         labelSelector: {matchLabels: {app: spread}}}
      containers: [{name: c, image: nginx, resources: {requests: {cpu: 100m}}}]
";

const SOLO: &str = "apiVersion: apps/v1
kind: Deployment
metadata: {name: solo, namespace: zoned}
spec:
  replicas: 8
  selector: {matchLabels: {app: solo}}
  template:
    metadata: {labels: {app: solo}}
    spec:
      affinity:
        podAntiAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
          - {topologyKey: kubernetes.io/hostname, labelSelector: {matchLabels: {app: solo}}}
      containers: [{name: c, image: nginx, resources: {requests: {cpu: 100m}}}]
";

/// kubectl against `tessera up` (6 simulated nodes over 3 zones): a Deployment spread over
/// zones with maxSkew 1 runs 3 per zone; one whose pods must not share a host runs 6 on 6
/// nodes, and `kubectl describe` of a pending one says why in Kubernetes' words; an invalid
/// constraint is refused with the field to fix.
#[test]
fn spread_and_anti_affinity_through_kubectl() {
    let c = Cluster::start_with(
        "up",
        &[
            "--nodes-per-shard=6",
            "--startup-delay-ms=100",
            "--node-zones=3",
        ],
    );
    c.ok(&["create", "namespace", "zoned"]);
    let zone_of: std::collections::HashMap<String, String> = items(&c, &["get", "nodes"])
        .iter()
        .map(|n| {
            (
                n["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                n["metadata"]["labels"]["topology.kubernetes.io/zone"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            )
        })
        .collect();
    let mut zones: Vec<&String> = zone_of.values().collect();
    zones.sort();
    zones.dedup();
    assert_eq!(zones.len(), 3, "nodes over three zones: {zone_of:?}");

    let spread = c.file("spread.yaml", SPREAD);
    c.ok(&["apply", "-f", &spread]);
    c.ok(&[
        "rollout",
        "status",
        "deployment/spread",
        "-n",
        "zoned",
        "--timeout=120s",
    ]);
    let mut per_zone: std::collections::BTreeMap<String, usize> = Default::default();
    for p in items(&c, &["get", "pods", "-n", "zoned", "-l", "app=spread"]) {
        let node = p["spec"]["nodeName"].as_str().expect("bound");
        *per_zone.entry(zone_of[node].clone()).or_insert(0) += 1;
    }
    assert_eq!(
        per_zone.values().copied().collect::<Vec<_>>(),
        [3, 3, 3],
        "{per_zone:?}"
    );

    let solo = c.file("solo.yaml", SOLO);
    c.ok(&["apply", "-f", &solo]);
    let reason = "0/6 nodes are available: 6 node(s) didn't match pod anti-affinity rules. preemption: 0/6 nodes are available: 6 No preemption victims found for incoming pod.";
    let pending = wait_for(Duration::from_secs(120), || {
        let pods = items(&c, &["get", "pods", "-n", "zoned", "-l", "app=solo"]);
        let bound: Vec<&str> = pods
            .iter()
            .filter_map(|p| p["spec"]["nodeName"].as_str())
            .collect();
        let waiting: Vec<String> = pods
            .iter()
            .filter(|p| p["spec"]["nodeName"].is_null())
            .filter(|p| {
                p["status"]["conditions"]
                    .as_array()
                    .is_some_and(|cs| cs.iter().any(|c| c["message"] == reason))
            })
            .filter_map(|p| p["metadata"]["name"].as_str().map(str::to_owned))
            .collect();
        let mut distinct = bound.clone();
        distinct.sort();
        distinct.dedup();
        (bound.len() == 6 && distinct.len() == 6 && waiting.len() == 2).then_some(waiting)
    })
    .expect("6 solo pods on 6 nodes, 2 waiting with the reason");
    let described = c.ok(&["describe", "pod", "-n", "zoned", &pending[0]]);
    assert!(
        described.contains("FailedScheduling") && described.contains(reason),
        "{described}"
    );

    let bad = c.file(
        "bad.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: bad, namespace: zoned}\nspec:\n  topologySpreadConstraints:\n  - {maxSkew: 0, topologyKey: topology.kubernetes.io/zone, whenUnsatisfiable: Sometimes}\n  containers: [{name: c, image: nginx}]\n",
    );
    let err = c.fails(&["apply", "-f", &bad]);
    assert!(
        err.contains(
            "spec.topologySpreadConstraints[0].maxSkew: Invalid value: 0: must be greater than zero"
        ) && err.contains(
            "spec.topologySpreadConstraints[0].whenUnsatisfiable: Unsupported value: \"Sometimes\""
        ),
        "{err}"
    );
}

/// Gangs through kubectl on `tessera up`: a PodGroup of 8 that fits binds all together and
/// runs; one that cannot fit binds nothing, and `kubectl describe` of a member says why.
#[test]
fn a_pod_group_of_eight_binds_together_or_not_at_all() {
    // 2 nodes of 2 cpu: 4 cpu in all.
    let c = Cluster::start_with(
        "up",
        &[
            "--nodes-per-shard=2",
            "--node-cpu=2",
            "--startup-delay-ms=100",
        ],
    );
    c.ok(&["create", "namespace", "gangs"]);
    let too_big = c.file(
        "too-big.yaml",
        &support::pod_group_manifest("gangs", "too-big", 8, "600m", 5),
    );
    c.ok(&["apply", "-f", &too_big]);
    let train = c.file(
        "train.yaml",
        &support::pod_group_manifest("gangs", "train", 8, "400m", 5),
    );
    c.ok(&["apply", "-f", &train]);
    let members = |gang: &str| {
        items(
            &c,
            &[
                "get",
                "pods",
                "-n",
                "gangs",
                "-l",
                &format!("scheduling.x-k8s.io/pod-group={gang}"),
            ],
        )
    };
    wait_for(Duration::from_secs(120), || {
        let pods = members("train");
        (pods.len() == 8
            && pods
                .iter()
                .all(|p| p["status"]["phase"] == "Running" && p["spec"]["nodeName"].is_string()))
        .then_some(())
    })
    .expect("the gang that fits is bound whole and runs");
    let group = wait_for(Duration::from_secs(60), || {
        let g: Value =
            serde_json::from_str(&c.ok(&["get", "podgroup", "train", "-n", "gangs", "-o", "json"]))
                .expect("json");
        (g["status"]["phase"] == "Running").then_some(g)
    })
    .expect("the PodGroup reports Running");
    assert_eq!(group["status"]["scheduled"], 8, "{group}");
    let reason = "PodGroup gangs/too-big needs 8 more member(s) placed (cpu 4800m)";
    let described = wait_for(Duration::from_secs(60), || {
        let d = c.ok(&["describe", "pod", "-n", "gangs", "too-big-3"]);
        d.contains(reason).then_some(d)
    })
    .expect("the gang that cannot fit says why");
    assert!(described.contains("FailedScheduling"), "{described}");
    for p in members("too-big") {
        assert!(
            p["spec"]["nodeName"].is_null(),
            "nothing of a gang that cannot fit is bound: {p}"
        );
    }
    // A gang binding that names a pod of another gang is refused, and binds nothing.
    let err = c.fails(&[
        "create",
        "--raw",
        "/apis/tessera.io/v1alpha1/namespaces/gangs/podgroups/too-big/binding",
        "-f",
        &c.file(
            "bind.json",
            r#"{"apiVersion":"tessera.io/v1alpha1","kind":"PodGroupBinding","metadata":{"name":"too-big"},"members":[{"pod":"too-big-0","node":"node-0"},{"pod":"train-0","node":"node-0"}]}"#,
        ),
    ]);
    assert!(err.contains("not a member of PodGroup too-big"), "{err}");
    assert!(members("too-big")[0]["spec"]["nodeName"].is_null());
}

/// Preemption through kubectl on `tessera up`: a Deployment of low-priority pods fills the
/// shard; a high-priority pod preempts one of them and runs; the victim's replacement waits,
/// and `kubectl describe` of it says why in Kubernetes' words.
#[test]
fn a_high_priority_pod_preempts_and_describe_shows_why() {
    // 2 nodes of 2 cpu: 4 pods of 1 cpu fill the shard.
    let c = Cluster::start_with(
        "up",
        &[
            "--nodes-per-shard=2",
            "--node-cpu=2",
            "--startup-delay-ms=100",
        ],
    );
    let manifest = c.file(
        "prio.yaml",
        "apiVersion: scheduling.k8s.io/v1\nkind: PriorityClass\nmetadata: {name: low}\nvalue: 10\n---\napiVersion: scheduling.k8s.io/v1\nkind: PriorityClass\nmetadata: {name: high}\nvalue: 1000\n---\napiVersion: apps/v1\nkind: Deployment\nmetadata: {name: filler, namespace: default}\nspec:\n  replicas: 4\n  selector: {matchLabels: {app: filler}}\n  template:\n    metadata: {labels: {app: filler}}\n    spec:\n      priorityClassName: low\n      terminationGracePeriodSeconds: 1\n      containers:\n      - {name: c, image: app:1, resources: {requests: {cpu: '1'}}}\n",
    );
    c.ok(&["apply", "-f", &manifest]);
    c.ok(&["rollout", "status", "deployment/filler", "--timeout=120s"]);
    let vip = c.file(
        "vip.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: vip, namespace: default}\nspec:\n  priorityClassName: high\n  containers:\n  - {name: c, image: app:1, resources: {requests: {cpu: '1'}}}\n",
    );
    c.ok(&["apply", "-f", &vip]);
    let running = wait_for(Duration::from_secs(120), || {
        let p = json(&c, &["get", "pod", "vip"]);
        (p["status"]["phase"] == "Running").then_some(p)
    })
    .expect("the high-priority pod runs");
    assert_eq!(running["spec"]["priority"], 1000);
    assert_eq!(
        running["status"]["nominatedNodeName"],
        running["spec"]["nodeName"]
    );
    let events = c.ok(&[
        "get",
        "events",
        "--field-selector",
        "reason=Preempted",
        "-o",
        "jsonpath={.items[*].message}",
    ]);
    assert!(
        events.contains("Preempted by default/vip on node"),
        "{events}"
    );
    // The ReplicaSet replaces its pod: at priority 10 it preempts nothing.
    let reason = "0/2 nodes are available: 2 Insufficient cpu. preemption: 0/2 nodes are available: 2 No preemption victims found for incoming pod.";
    let pending = wait_for(Duration::from_secs(60), || {
        items(&c, &["get", "pods", "-l", "app=filler"])
            .into_iter()
            .find(|p| {
                p["status"]["conditions"]
                    .as_array()
                    .is_some_and(|cs| cs.iter().any(|c| c["message"] == reason))
            })
    })
    .expect("the replacement waits, saying why");
    let name = pending["metadata"]["name"].as_str().expect("name");
    let described = c.ok(&["describe", "pod", name]);
    assert!(
        described.contains("FailedScheduling") && described.contains(reason),
        "{described}"
    );
}

/// `kubectl top` on simulated nodes: each running pod uses its requests times its node's
/// `tessera.io/simulated-usage-fraction`, or what its own annotations say; a node's usage is
/// the sum of its pods'.
#[test]
fn kubectl_top_reads_simulated_usage() {
    let c = Cluster::start_with("up", &["--nodes-per-shard=1", "--startup-delay-ms=0"]);
    let node = items(&c, &["get", "nodes"])[0]["metadata"]["name"]
        .as_str()
        .expect("a node")
        .to_owned();
    let pods = c.file(
        "pods.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: steady}}\nspec:\n  nodeName: {node}\n  containers:\n\
             \x20 - {{name: a, image: busybox, resources: {{requests: {{cpu: 200m, memory: 64Mi}}}}}}\n\
             \x20 - {{name: b, image: busybox, resources: {{requests: {{cpu: 100m, memory: 32Mi}}}}}}\n---\n\
             apiVersion: v1\nkind: Pod\nmetadata:\n  name: busy\n  annotations: {{tessera.io/simulated-cpu-usage: 750m}}\n\
             spec:\n  nodeName: {node}\n  containers: [{{name: a, image: busybox, resources: {{requests: {{cpu: 100m}}}}}}]\n"
        ),
    );
    c.ok(&["create", "-f", &pods]);
    let top = |args: &[&str]| -> Option<Vec<String>> {
        let out = c.kubectl(args);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        out.status
            .success()
            .then(|| text.split_whitespace().map(str::to_owned).collect())
    };
    let steady = wait_for(Duration::from_secs(60), || {
        top(&["top", "pod", "steady", "--no-headers"]).filter(|c| c.len() == 3)
    })
    .expect("kubectl top pod shows a running pod of a simulated node");
    assert_eq!(steady[1..], ["300m", "96Mi"], "its requests: {steady:?}");
    let containers = top(&["top", "pod", "steady", "--containers", "--no-headers"]).expect("top");
    assert!(
        containers.windows(3).any(|w| w == ["a", "200m", "64Mi"]),
        "{containers:?}"
    );
    let busy = top(&["top", "pod", "busy", "--no-headers"]).expect("top");
    assert_eq!(busy[1], "750m", "what it says it uses: {busy:?}");
    let node_top = top(&["top", "node", &node, "--no-headers"]).expect("top node");
    assert_eq!(node_top[1], "1050m", "the sum of its pods: {node_top:?}");
    // Half of the requests, once the node says so.
    c.ok(&[
        "annotate",
        "node",
        &node,
        "tessera.io/simulated-usage-fraction=0.5",
    ]);
    let steady = top(&["top", "pod", "steady", "--no-headers"]).expect("top");
    assert_eq!(steady[1..], ["150m", "48Mi"], "{steady:?}");
}

/// `kubectl autoscale` (kubectl 1.32 writes an `autoscaling/v1` HPA) on a Deployment whose
/// pods run on a process node and burn CPU for a while: the HPA reads their real usage from
/// the agent, scales up to `--max`, and once the burn ends scales back to `--min` after the
/// (shortened) downscale stabilization window.
#[test]
fn kubectl_autoscale_follows_real_load_up_and_back_down() {
    let c = Cluster::start_with(
        "up",
        &[
            "--nodes-per-shard=0",
            "--process-nodes=1",
            "--horizontal-pod-autoscaler-sync-period=1s",
            "--horizontal-pod-autoscaler-downscale-stabilization=5s",
        ],
    );
    // Each pod burns one CPU for 15 s after it starts (a date check every 100k loops),
    // then idles; it tolerates the process nodes' taint.
    let manifest = c.file(
        "burn.yaml",
        r#"apiVersion: apps/v1
kind: Deployment
metadata:
  name: burn
spec:
  replicas: 1
  selector:
    matchLabels: {app: burn}
  template:
    metadata:
      labels: {app: burn}
    spec:
      tolerations:
      - {key: tessera.io/runtime, operator: Exists}
      containers:
      - name: burn
        image: busybox
        resources:
          requests: {cpu: 100m}
        command:
        - sh
        - -c
        - 'end=$(( $(date +%s) + 15 )); while :; do i=0; while [ $i -lt 100000 ]; do i=$((i+1)); done; [ $(date +%s) -ge $end ] && break; done; exec sleep 3600'
"#,
    );
    c.ok(&["apply", "-f", &manifest]);
    c.ok(&[
        "autoscale",
        "deployment",
        "burn",
        "--min=1",
        "--max=3",
        "--cpu-percent=50",
    ]);
    // The v1 object kubectl wrote reads back in both versions.
    assert_eq!(
        c.ok(&[
            "get",
            "horizontalpodautoscalers.v1.autoscaling",
            "burn",
            "-o",
            "jsonpath={.spec.targetCPUUtilizationPercentage}"
        ]),
        "50"
    );
    assert_eq!(
        c.ok(&[
            "get",
            "horizontalpodautoscalers.v2.autoscaling",
            "burn",
            "-o",
            "jsonpath={.spec.metrics[0].resource.target.averageUtilization}"
        ]),
        "50"
    );
    let replicas = || {
        c.ok(&[
            "get",
            "deployment",
            "burn",
            "-o",
            "jsonpath={.spec.replicas}",
        ])
    };
    let up = wait_for(Duration::from_secs(120), || {
        (replicas() == "3").then(|| c.ok(&["get", "hpa", "burn", "--no-headers"]))
    });
    assert!(
        up.is_some(),
        "scaled up to --max: {}",
        c.ok(&["get", "hpa", "burn", "-o", "yaml"])
    );
    // NAME REFERENCE TARGETS MINPODS MAXPODS REPLICAS AGE, the target a percentage.
    let row = up.unwrap_or_default();
    let cols: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(cols.len(), 7, "{row}");
    assert_eq!(cols[1], "Deployment/burn", "{row}");
    assert!(cols[2].ends_with("%/50%"), "{row}");
    assert_eq!(&cols[3..5], &["1", "3"], "{row}");

    let down = wait_for(Duration::from_secs(120), || {
        (replicas() == "1").then_some(())
    });
    assert!(
        down.is_some(),
        "back to --min once the burn ended: {}",
        c.ok(&["get", "hpa", "burn", "-o", "yaml"])
    );
    let events = c.ok(&[
        "get",
        "events",
        "--field-selector",
        "reason=SuccessfulRescale",
        "-o",
        "jsonpath={.items[*].message}",
    ]);
    assert!(events.contains("New size: 3"), "{events}");
    assert!(
        events.contains("New size: 1; reason: All metrics below target"),
        "{events}"
    );
}

/// A ReplicationController (core/v1) as old manifests write it: selector and labels from the
/// template, pods kept by the controller, `kubectl scale rc` through its scale subresource,
/// `kubectl get rc` columns.
#[test]
fn kubectl_runs_and_scales_a_replication_controller() {
    let c = Cluster::start_with("up", &["--nodes-per-shard=3"]);
    c.ok(&["create", "namespace", "legacy"]);
    let rc = c.file(
        "rc.yaml",
        "apiVersion: v1\nkind: ReplicationController\nmetadata:\n  name: old\n  namespace: legacy\nspec:\n  replicas: 2\n  template:\n    metadata:\n      labels: {app: old}\n    spec:\n      containers:\n      - name: c\n        image: nginx\n",
    );
    c.ok(&["apply", "-f", &rc]);
    let ready = |want: &str| {
        wait_for(Duration::from_secs(60), || {
            let r = c.ok(&[
                "get",
                "rc",
                "old",
                "-n",
                "legacy",
                "-o",
                "jsonpath={.status.replicas}/{.status.readyReplicas}",
            ]);
            (r == format!("{want}/{want}")).then_some(())
        })
        .is_some()
    };
    assert!(
        ready("2"),
        "two pods of the ReplicationController ready: {}",
        c.ok(&["get", "rc,pods", "-n", "legacy", "-o", "wide"])
    );
    c.ok(&["scale", "rc", "old", "-n", "legacy", "--replicas=1"]);
    assert!(ready("1"), "scaled to one");
    let row = c.ok(&["get", "rc", "old", "-n", "legacy", "--no-headers"]);
    let cols: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(&cols[..4], &["old", "1", "1", "1"], "{row}");
    assert_eq!(
        c.ok(&[
            "get",
            "rc",
            "old",
            "-n",
            "legacy",
            "-o",
            "jsonpath={.spec.selector.app}"
        ]),
        "old"
    );
}
