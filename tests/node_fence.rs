//! The node's own federation fence: a shard's control plane frozen (SIGSTOP) cannot stop the
//! real processes its process node runs, and the federation, past the shard's lease, starts
//! the work on another shard. The process node (a `tessera agent` of its own, as on another
//! machine) stops its `AtMostOnce` pod itself when the shard's federation lease ends, so the
//! Job's process is gone before the other shard starts it.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod support;

use support::{Cluster, Running, free_addr, join_agent, sample, signal, wait_for};

/// Pids of live processes whose command line is exactly `args` (read from /proc).
fn processes(args: &[&str]) -> Vec<u32> {
    let want: Vec<u8> = args
        .iter()
        .flat_map(|a| [a.as_bytes(), b"\0"].concat())
        .collect();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c == want)
                && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
                    .is_ok_and(|s| s.split(") ").nth(1).is_some_and(|r| r.starts_with('Z')))
        })
        .collect()
}

#[test]
fn a_process_node_stops_its_at_most_once_pod_when_its_frozen_shard_loses_the_federation() {
    let grpc = free_addr();
    let fed = Cluster::start_with(
        "federation",
        &[
            &format!("--grpc-addr={grpc}"),
            "--shard-lease-seconds=3",
            "--failover-margin-seconds=2",
        ],
    );
    // The shard's control plane, and its process node as a process of its own.
    // One simulated node as well: the federation counts untainted nodes' room only (the
    // process node is tainted), and the pod prefers the process node within the shard.
    let frozen = Cluster::start_with("up", &["--shards=0", "--nodes-per-shard=1"]);
    let node_metrics = free_addr();
    let dir = frozen.dir.path();
    let _node = Running(
        Command::new(env!("CARGO_BIN_EXE_tessera"))
            .args(["agent", "--sim-nodes=0", "--process-nodes=1"])
            .args(["--process-isolation=off", "--prefix=box"])
            .arg("--kubeconfig")
            .arg(&frozen.kubeconfig)
            .arg("--log-dir")
            .arg(dir.join("node-logs"))
            .arg("--state-dir")
            .arg(dir.join("node-pods"))
            .args(["--metrics-addr", &node_metrics])
            .env("TESSERA_LOG", "warn")
            .stdout(Stdio::null())
            .spawn()
            .expect("tessera agent"),
    );
    let _a = join_agent(&fed, &frozen, &grpc, "a");
    fed.wait_for_ready_shards(1);
    fed.ok(&["create", "namespace", "batch"]);
    let job = fed.file(
        "job.yaml",
        "apiVersion: batch/v1\nkind: Job\nmetadata: {name: etl, namespace: batch}\nspec:\n  completions: 1\n  template:\n    spec:\n      restartPolicy: Never\n      terminationGracePeriodSeconds: 1\n      tolerations: [{key: tessera.io/runtime, operator: Exists}]\n      affinity: {nodeAffinity: {preferredDuringSchedulingIgnoredDuringExecution: [{weight: 100, preference: {matchExpressions: [{key: tessera.io/runtime, operator: In, values: [process]}]}}]}}\n      containers: [{name: c, image: busybox, command: [sleep, \"617\"]}]\n",
    );
    fed.ok(&["apply", "-f", &job]);
    let running = wait_for(Duration::from_secs(60), || {
        let p = processes(&["sleep", "617"]);
        (!p.is_empty()).then_some(p)
    });
    assert!(
        running.is_some(),
        "the Job's process runs on the process node: {}\n{}",
        frozen.ok(&["get", "pods,nodes", "-A", "-o", "wide"]),
        fed.ok(&["get", "job", "etl", "-n", "batch", "-o", "yaml"])
    );
    // A second shard to fail over to (a Job does not move when the map changes).
    let other = Cluster::start_with("up", &["--shards=0", "--nodes-per-shard=2"]);
    let _b = join_agent(&fed, &other, &grpc, "b");
    fed.wait_for_ready_shards(2);

    // Freeze the shard's control plane: its federation agent cannot reach it and stops
    // renewing; the federation re-places the Job after lease + grace + margin.
    signal(frozen.pid(), "-STOP");
    let froze = Instant::now();
    let mut alive_until = froze;
    // Each look asks the other shard first, then the node: a process seen after the other
    // shard's pod was seen Running ran in both at once.
    let elsewhere = wait_for(Duration::from_secs(60), || {
        let out = other.kubectl(&[
            "get",
            "pods",
            "-n",
            "batch",
            "-l",
            "job-name=etl",
            "-o",
            "jsonpath={.items[*].status.phase}",
        ]);
        let there = String::from_utf8_lossy(&out.stdout).contains("Running");
        let alive = !processes(&["sleep", "617"]).is_empty();
        if alive {
            alive_until = Instant::now();
        }
        there.then(|| (Instant::now(), alive))
    });
    signal(frozen.pid(), "-CONT");
    let (started, alive) = elsewhere.expect("the Job runs on the other shard");
    println!(
        "control plane frozen: the node stopped the Job's process {:.1}s after, the other shard ran it {:.1}s after",
        (alive_until - froze).as_secs_f64(),
        (started - froze).as_secs_f64()
    );
    assert!(
        !alive,
        "the Job's process still ran when the other shard ran the Job"
    );
    assert!(processes(&["sleep", "617"]).is_empty());
    assert!(sample(&node_metrics, "tessera_agent_fenced_pods_total") >= 1.0);
}
