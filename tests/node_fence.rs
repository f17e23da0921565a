//! The node's own federation fence: a shard's control plane frozen (SIGSTOP) cannot stop the
//! real processes its process node runs, and the federation, past the shard's lease, starts
//! the work on another shard. The process node (a `tessera agent` of its own, as on another
//! machine) stops its `AtMostOnce` pod itself when the shard's federation lease ends, so the
//! Job's process is gone before the other shard starts it.

use std::time::{Duration, Instant};

mod support;

use support::{Cluster, free_addr, join_agent, process_node, processes, sample, signal, wait_for};

#[test]
fn a_process_node_stops_its_at_most_once_pod_when_its_frozen_shard_loses_the_federation() {
    let grpc = free_addr();
    let fed = support::quick_federation(&grpc, &[]);
    // The shard's control plane, and its process node as a process of its own.
    // One simulated node as well: the federation counts untainted nodes' room only (the
    // process node is tainted), and the pod prefers the process node within the shard.
    let frozen = Cluster::start_with("up", &["--shards=0", "--nodes-per-shard=1"]);
    let node_metrics = free_addr();
    let _node = process_node(&frozen, &node_metrics, "box");
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
    assert!(
        sample(
            &node_metrics,
            "tessera_agent_fenced_pods_total{node=\"box-proc-0\"}"
        ) >= 1.0
    );
}

#[test]
fn a_federated_job_that_must_run_on_process_nodes_goes_to_the_shard_that_has_them() {
    let grpc = free_addr();
    let fed = Cluster::start_with("federation", &[&format!("--grpc-addr={grpc}")]);
    // Shard a: simulated nodes only. Shard b: one process node (tainted) and nothing else.
    let a = Cluster::start_with("up", &["--shards=0", "--nodes-per-shard=2"]);
    let b = Cluster::start_with("up", &["--shards=0", "--nodes-per-shard=0"]);
    let _node = process_node(&b, &free_addr(), "box");
    let _agents = [
        join_agent(&fed, &a, &grpc, "a"),
        join_agent(&fed, &b, &grpc, "b"),
    ];
    fed.wait_for_ready_shards(2);
    fed.ok(&["create", "namespace", "tools"]);
    let job = fed.file(
        "job.yaml",
        "apiVersion: batch/v1\nkind: Job\nmetadata: {name: probe, namespace: tools}\nspec:\n  template:\n    spec:\n      restartPolicy: Never\n      terminationGracePeriodSeconds: 0\n      nodeSelector: {tessera.io/runtime: process}\n      tolerations: [{key: tessera.io/runtime, operator: Exists}]\n      containers: [{name: c, image: busybox, command: [sleep, \"618\"], resources: {requests: {cpu: 100m}}}]\n",
    );
    fed.ok(&["apply", "-f", &job]);
    let running = wait_for(Duration::from_secs(60), || {
        let p = processes(&["sleep", "618"]);
        (!p.is_empty()).then_some(p)
    });
    let placement = fed.ok(&[
        "get",
        "job",
        "probe",
        "-n",
        "tools",
        "-o",
        "jsonpath={.metadata.annotations.tessera\\.io/placement}",
    ]);
    assert!(
        running.is_some(),
        "the Job runs on the process node: {placement}"
    );
    assert!(placement.contains(r#""shares":{"b":1}"#), "{placement}");
    // More than the process node holds waits, saying so.
    let big = fed.file(
        "big.yaml",
        "apiVersion: batch/v1\nkind: Job\nmetadata: {name: big, namespace: tools}\nspec:\n  template:\n    spec:\n      restartPolicy: Never\n      nodeSelector: {tessera.io/runtime: process}\n      tolerations: [{key: tessera.io/runtime, operator: Exists}]\n      containers: [{name: c, image: busybox, command: [sleep, \"1\"], resources: {requests: {cpu: \"1000\"}}}]\n",
    );
    fed.ok(&["apply", "-f", &big]);
    let why = wait_for(Duration::from_secs(30), || {
        let s = fed.ok(&[
            "get",
            "job",
            "big",
            "-n",
            "tools",
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"Placed\")].message}",
        ]);
        s.contains("lack room").then_some(s)
    });
    assert!(why.is_some(), "the oversized Job waits for room");
    fed.ok(&["delete", "job", "probe", "-n", "tools", "--wait=false"]);
    let gone = wait_for(Duration::from_secs(60), || {
        processes(&["sleep", "618"]).is_empty().then_some(())
    });
    assert!(gone.is_some(), "deleting the Job stops its process");
}
