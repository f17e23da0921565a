//! Faults, with the shard's invariants checked at every revision of the run from a watch
//! (no node over its cpu, memory or pod count; no pod's node ever changed; no acknowledged
//! write lost across a restart: `support/invariants.rs`) and, at the end, every ReplicaSet at
//! its count. The processes are real and killed with SIGKILL.

#[path = "support/invariants.rs"]
mod invariants;
mod support;

use std::collections::HashMap;
use std::time::Duration;

use invariants::Invariants;
use serde_json::Value;
use support::{Cluster, Running, wait_for};

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

fn deployment(name: &str, replicas: usize, image: &str) -> String {
    format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  replicas: {replicas}\n  selector: {{matchLabels: {{app: {name}}}}}\n  template:\n    metadata: {{labels: {{app: {name}}}}}\n    spec:\n      containers:\n      - {{name: c, image: {image}, resources: {{requests: {{cpu: 100m}}}}}}\n"
    )
}

/// At the end: the watch saw no invariant broken (and saw at least `min_bindings` pods
/// bound and followed at least `min_resumes` restarts, so it watched the run), and every
/// ReplicaSet has exactly its count of live pods.
fn check_invariants(c: &Cluster, watch: Invariants, min_bindings: usize, min_resumes: usize) {
    let (events, bindings, resumes) = watch.finish();
    eprintln!(
        "invariants held over {events} pod events, {bindings} bindings and {resumes} resumed watches"
    );
    assert!(
        resumes >= min_resumes,
        "the watch resumed {resumes} times, across fewer restarts than the run made"
    );
    assert!(
        bindings >= min_bindings,
        "the watch saw {bindings} bindings, fewer than the run made ({min_bindings})"
    );
    let pods = items(c, &["get", "pods", "-A"]);
    for rs in items(c, &["get", "replicasets", "-A"]) {
        let uid = rs["metadata"]["uid"].as_str().unwrap_or("");
        let live = pods
            .iter()
            .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
            .filter(|p| {
                p["metadata"]["ownerReferences"]
                    .as_array()
                    .is_some_and(|r| r.iter().any(|r| r["uid"] == uid))
            })
            .count();
        assert_eq!(
            rs["spec"]["replicas"].as_u64().unwrap_or(0) as usize,
            live,
            "ReplicaSet {} is not at its count",
            rs["metadata"]["name"]
        );
    }
}

fn holder(c: &Cluster, lease: &str) -> Option<String> {
    let out = c.kubectl(&[
        "get",
        "lease",
        lease,
        "-n",
        "kube-system",
        "-o",
        "jsonpath={.spec.holderIdentity}",
    ]);
    let s = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    (out.status.success() && !s.is_empty()).then_some(s)
}

const ELECTION: [&str; 6] = [
    "--lease-duration",
    "3",
    "--renew-deadline",
    "2",
    "--retry-period",
    "0.5",
];

#[test]
fn standbys_take_over_a_500_replica_rollout_after_kill_9() {
    let c = Cluster::start_with(
        "up",
        &[
            "--scheduler=false",
            "--controllers=false",
            "--nodes-per-shard=20",
            // 60 cpu for 500 pods of 100m: the rollout's surge (625 pods) does not fit, so
            // new pods wait for old ones to go, and a scheduler that overcommitted would show.
            "--node-cpu=3",
            "--startup-delay-ms=50",
        ],
    );
    let watch = Invariants::watch(c.kubeconfig.clone());
    let start = |kind: &str, id: &str| -> Running {
        let mut args = vec![kind, "--identity", id];
        args.extend(ELECTION);
        c.component(&args)
    };
    let mut procs: HashMap<String, Running> = HashMap::new();
    for (kind, id) in [
        ("scheduler", "sched-a"),
        ("scheduler", "sched-b"),
        ("controller-manager", "cm-a"),
        ("controller-manager", "cm-b"),
    ] {
        procs.insert(id.to_owned(), start(kind, id));
    }
    let d = c.file("d.yaml", &deployment("big", 500, "app:1"));
    c.ok(&["apply", "-f", &d]);
    c.ok(&["rollout", "status", "deployment/big", "--timeout=240s"]);
    c.ok(&["set", "image", "deployment/big", "c=app:2"]);
    // Mid-rollout, kill both leaders.
    let mid = wait_for(Duration::from_secs(120), || {
        let d = json(&c, &["get", "deployment", "big"]);
        // The status of the new template, not the last one's.
        (d["status"]["observedGeneration"] == d["metadata"]["generation"]
            && d["status"]["updatedReplicas"].as_u64().unwrap_or(0) >= 50)
            .then_some(d)
    })
    .expect("the rollout started");
    let updated = mid["status"]["updatedReplicas"].as_u64().unwrap_or(0);
    eprintln!("killing the leaders with {updated} of 500 updated");
    assert!(
        updated < 500 || mid["status"]["replicas"].as_u64().unwrap_or(0) > 500,
        "the leaders die mid-rollout"
    );
    for lease in ["tessera-scheduler", "tessera-controller-manager"] {
        let leader = holder(&c, lease).expect("a leader");
        let mut p = procs.remove(&leader).expect("the leader is one of ours");
        p.0.kill().expect("kill -9");
        let _ = p.0.wait();
    }
    c.ok(&["rollout", "status", "deployment/big", "--timeout=300s"]);
    let d = json(&c, &["get", "deployment", "big"]);
    assert_eq!(d["status"]["availableReplicas"], 500);
    assert_eq!(d["status"]["updatedReplicas"], 500);
    for lease in ["tessera-scheduler", "tessera-controller-manager"] {
        let h = holder(&c, lease).expect("a leader");
        assert!(
            procs.contains_key(&h),
            "{lease} is held by a standby that took over ({h})"
        );
    }
    check_invariants(&c, watch, 1000, 0);
}

#[test]
fn a_stopped_agent_s_pods_are_replaced_elsewhere() {
    let c = Cluster::start_with(
        "up",
        &[
            "--nodes-per-shard=0",
            "--node-monitor-grace-period=3",
            "--default-unreachable-toleration-seconds=1",
        ],
    );
    let watch = Invariants::watch(c.kubeconfig.clone());
    let agent = |prefix: &str| {
        c.component(&[
            "agent",
            "--sim-nodes",
            "2",
            "--prefix",
            prefix,
            "--node-lease-renew-seconds",
            "1",
            "--startup-delay-ms",
            "50",
        ])
    };
    let mut a = agent("a");
    let _b = agent("b");
    assert!(
        wait_for(Duration::from_secs(30), || (items(&c, &["get", "nodes"])
            .len()
            == 4)
            .then_some(()))
        .is_some()
    );
    let d = c.file("d.yaml", &deployment("svc", 8, "app:1"));
    c.ok(&["apply", "-f", &d]);
    c.ok(&["rollout", "status", "deployment/svc", "--timeout=60s"]);
    let on_a = items(&c, &["get", "pods"])
        .iter()
        .filter(|p| {
            p["spec"]["nodeName"]
                .as_str()
                .is_some_and(|n| n.starts_with("a-"))
        })
        .count();
    assert!(on_a > 0, "some pods run on agent a's nodes");
    a.0.kill().expect("kill -9 the agent");
    let _ = a.0.wait();
    let notready = wait_for(Duration::from_secs(60), || {
        let n = json(&c, &["get", "node", "a-0"]);
        n["status"]["conditions"]
            .as_array()
            .is_some_and(|cs| {
                cs.iter()
                    .any(|c| c["type"] == "Ready" && c["status"] == "Unknown")
            })
            .then_some(())
    });
    assert!(notready.is_some(), "the node went NotReady");
    let replaced = wait_for(Duration::from_secs(90), || {
        let pods = items(&c, &["get", "pods"]);
        let live_on_b = pods
            .iter()
            .filter(|p| {
                p["metadata"]["deletionTimestamp"].is_null() && p["status"]["phase"] == "Running"
            })
            .filter(|p| {
                p["spec"]["nodeName"]
                    .as_str()
                    .is_some_and(|n| n.starts_with("b-"))
            })
            .count();
        (live_on_b == 8).then_some(())
    });
    assert!(replaced.is_some(), "every pod runs on agent b's nodes");
    let described = c.ok(&["describe", "node", "a-0"]);
    assert!(
        described.contains("node.kubernetes.io/unreachable"),
        "{described}"
    );
    check_invariants(&c, watch, 8 + on_a, 0);
}

/// Live host processes whose command line is `sleep ARG`.
fn sleepers(arg: &str) -> Vec<u32> {
    let want = format!("sleep\0{arg}\0");
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let cmd = std::fs::read(e.path().join("cmdline")).ok()?;
            let status = std::fs::read_to_string(e.path().join("status")).ok()?;
            let zombie = status
                .lines()
                .any(|l| l.starts_with("State:") && l.contains("Z ("));
            (cmd == want.as_bytes() && !zombie).then_some(pid)
        })
        .collect()
}

#[test]
fn a_process_node_killed_outright_leaves_no_container_behind() {
    let c = Cluster::start_with("up", &["--nodes-per-shard=0"]);
    let dir = c.dir.path();
    let (logs, state) = (
        dir.join("k-logs").display().to_string(),
        dir.join("k-pods").display().to_string(),
    );
    let agent = || {
        c.component(&[
            "agent",
            "--sim-nodes=0",
            "--process-nodes=1",
            "--prefix=k",
            "--log-dir",
            &logs,
            "--state-dir",
            &state,
        ])
    };
    let mut first = agent();
    let ready = wait_for(Duration::from_secs(60), || {
        c.ok(&["get", "node", "k-proc-0", "-o", "name"])
            .contains("k-proc-0")
            .then_some(())
    });
    assert!(ready.is_some(), "{}", c.ok(&["get", "nodes"]));
    // Sleeps no other test runs: this process's id in their arguments.
    let arg = (3_000_000 + std::process::id()).to_string();
    let once_arg = (4_000_000 + std::process::id()).to_string();
    let pods = c.file(
        "pods.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: napper}}\nspec:\n  nodeName: k-proc-0\n  containers:\n  - {{name: main, image: busybox, command: [sleep, \"{arg}\"]}}\n---\n\
             apiVersion: v1\nkind: Pod\nmetadata: {{name: once}}\nspec:\n  nodeName: k-proc-0\n  restartPolicy: Never\n  containers:\n  - {{name: main, image: busybox, command: [sleep, \"{once_arg}\"]}}\n"
        ),
    );
    c.ok(&["apply", "-f", &pods]);
    let old = wait_for(Duration::from_secs(60), || {
        let found = sleepers(&arg);
        (found.len() == 1 && sleepers(&once_arg).len() == 1).then(|| found[0])
    })
    .expect("the containers run");
    // Both reported Running before the kill: a pod still Pending in the API is simply
    // started afresh by the next run, which is not the case this test is about.
    let reported = wait_for(Duration::from_secs(30), || {
        ["napper", "once"]
            .iter()
            .all(|p| c.ok(&["get", "pod", p, "-o", "jsonpath={.status.phase}"]) == "Running")
            .then_some(())
    });
    assert!(reported.is_some(), "{}", c.ok(&["get", "pods"]));
    // kill -9 of the agent: nothing of it stops the container, which runs on under the
    // pod's id range.
    first.0.kill().expect("kill -9 the agent");
    let _ = first.0.wait();
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        sleepers(&arg).contains(&old),
        "the container outlived its agent (the case this test is about)"
    );
    // The agent again: it kills what its last run left before it hands out id ranges, then
    // runs the pod afresh — one copy, never two.
    let _second = agent();
    let settled = wait_for(Duration::from_secs(60), || {
        let found = sleepers(&arg);
        (found.len() == 1 && found[0] != old).then_some(found)
    });
    assert!(
        settled.is_some(),
        "the old container is gone and one new one runs: {:?} (old {old})",
        sleepers(&arg)
    );
    assert!(!sleepers(&arg).contains(&old));
    let field =
        |pod: &str, path: &str| c.ok(&["get", "pod", pod, "-o", &format!("jsonpath={path}")]);
    let restarted = wait_for(Duration::from_secs(30), || {
        (field("napper", "{.status.phase}") == "Running"
            && field("napper", "{.status.containerStatuses[0].restartCount}") == "1")
            .then_some(())
    });
    assert!(
        restarted.is_some(),
        "counted as a restart: {}",
        field("napper", "{.status}")
    );
    // restartPolicy Never: not run again; the pod fails, saying why, and nothing of it runs.
    let failed = wait_for(Duration::from_secs(30), || {
        (field("once", "{.status.phase}") == "Failed").then_some(())
    });
    assert!(failed.is_some(), "{}", field("once", "{.status}"));
    assert_eq!(
        field(
            "once",
            "{.status.containerStatuses[0].state.terminated.reason}"
        ),
        "ContainerStatusUnknown"
    );
    assert!(sleepers(&once_arg).is_empty());
}

#[test]
fn kill_9_of_the_whole_shard_resumes_without_duplicates() {
    let mut c = Cluster::start_with("up", &["--nodes-per-shard=10", "--startup-delay-ms=50"]);
    let watch = Invariants::watch(c.kubeconfig.clone());
    let d = c.file("d.yaml", &deployment("web", 300, "app:1"));
    c.ok(&["apply", "-f", &d]);
    // Kill it while pods are being created and bound.
    let some = wait_for(Duration::from_secs(60), || {
        (items(&c, &["get", "pods"]).len() >= 30).then_some(())
    });
    assert!(some.is_some(), "creation started");
    c.kill_and_restart();
    c.ok(&["rollout", "status", "deployment/web", "--timeout=180s"]);
    let pods = items(&c, &["get", "pods"]);
    let live: Vec<&Value> = pods
        .iter()
        .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
        .collect();
    assert_eq!(live.len(), 300, "exactly the replicas, nothing duplicated");
    assert!(live.iter().all(|p| p["status"]["phase"] == "Running"));
    assert_eq!(
        items(&c, &["get", "replicasets"]).len(),
        1,
        "one ReplicaSet, not a second from a replayed create"
    );
    check_invariants(&c, watch, 300, 1);
}

/// `count` PodGroups `gang-<first>`… of `size` members (200m each), as one manifest.
fn gangs(first: usize, count: usize, size: usize) -> String {
    (first..first + count)
        .map(|g| support::pod_group_manifest("default", &format!("gang-{g}"), size, "200m", 3))
        .collect()
}

/// Gang scheduling under a scheduler's kill -9: the leader dies while gangs are forming
/// (members held at Permit, group bindings in flight) and its standby takes over. At no
/// revision of the run is a gang partly bound, and in the end every gang that fits is bound
/// whole: 300 slots of 200m hold 37 gangs of 8, and the 3 applied after them have nothing
/// bound.
#[test]
fn a_scheduler_killed_mid_gang_leaves_no_partial_gang() {
    const GANGS: usize = 40;
    const SIZE: usize = 8;
    const FIT: usize = 37;
    let c = Cluster::start_with(
        "up",
        &[
            "--scheduler=false",
            "--nodes-per-shard=20",
            "--node-cpu=3",
            "--startup-delay-ms=50",
        ],
    );
    let watch = Invariants::watch(c.kubeconfig.clone());
    for g in 0..GANGS {
        watch.gang(&format!("default/gang-{g}"), SIZE);
    }
    let mut procs: HashMap<String, Running> = HashMap::new();
    for id in ["sched-a", "sched-b"] {
        let mut args = vec!["scheduler", "--identity", id];
        args.extend(ELECTION);
        procs.insert(id.to_owned(), c.component(&args));
    }
    let whole = |watch: &Invariants| {
        watch
            .gangs_bound()
            .iter()
            .filter(|(_, n)| *n >= SIZE)
            .count()
    };
    // Ten gangs, then ten more with the leader killed as they arrive, then the rest that fit.
    let first = c.file("g0.yaml", &gangs(0, 10, SIZE));
    c.ok(&["apply", "-f", &first]);
    wait_for(Duration::from_secs(60), || {
        (whole(&watch) >= 5).then_some(())
    })
    .expect("a scheduler leads and binds gangs");
    let second = c.file("g1.yaml", &gangs(10, 10, SIZE));
    let applying = c
        .command(&["apply", "-f", &second])
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("kubectl");
    // Once the second batch's gangs start to bind: the rest are forming.
    wait_for(Duration::from_secs(60), || {
        (whole(&watch) >= 12).then_some(())
    })
    .expect("the second batch binds");
    let leader = holder(&c, "tessera-scheduler").expect("a leader");
    let mut p = procs.remove(&leader).expect("the leader is one of ours");
    eprintln!(
        "killing scheduler {leader} with {} gangs bound",
        whole(&watch)
    );
    p.0.kill().expect("kill -9");
    let _ = p.0.wait();
    let status = applying.wait_with_output().expect("kubectl apply");
    assert!(status.status.success(), "{status:?}");
    let rest = c.file("g2.yaml", &gangs(20, FIT - 20, SIZE));
    c.ok(&["apply", "-f", &rest]);
    wait_for(Duration::from_secs(180), || {
        (whole(&watch) >= FIT).then_some(())
    })
    .unwrap_or_else(|| panic!("only {} of {FIT} gangs bound whole", whole(&watch)));
    // The shard is full (296 of 300 slots): the last gangs cannot fit and bind nothing.
    // (They come last because gangs that each fit but not together contend until one wins,
    // and there is no gang-aware queue order yet to settle that quickly.)
    let last = c.file("g3.yaml", &gangs(FIT, GANGS - FIT, SIZE));
    c.ok(&["apply", "-f", &last]);
    wait_for(Duration::from_secs(60), || {
        let pods = items(
            &c,
            &["get", "pods", "-l", "scheduling.x-k8s.io/pod-group=gang-39"],
        );
        pods.iter()
            .any(|p| {
                p["status"]["conditions"].as_array().is_some_and(|cs| {
                    cs.iter().any(|c| {
                        c["message"].as_str().is_some_and(|m| {
                            m.contains("PodGroup default/gang-39 needs 8 more member(s) placed")
                        })
                    })
                })
            })
            .then_some(())
    })
    .expect("the last gang is kept back for want of room");
    let h = holder(&c, "tessera-scheduler").expect("a leader");
    assert!(procs.contains_key(&h), "the standby took over ({h})");
    let bound = watch.gangs_bound();
    assert_eq!(
        bound.len(),
        FIT,
        "gangs with anything bound (the 3 that do not fit have nothing): {bound:?}"
    );
    check_invariants(&c, watch, FIT * SIZE, 0);
}
