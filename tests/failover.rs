//! Failover under faults: a federation and two shards, each in its own process, inside a
//! network namespace this test makes for itself (its own loopback, its own iptables). First
//! one shard's agent is cut off from the federation with DROP rules on its address (packets
//! lost, not refused, as in a real partition); then the other shard's agent is stopped with
//! SIGSTOP while its control plane runs on; then a shard's control plane is killed (-9);
//! then the federation itself is killed (-9) and started again; last, the federation is
//! frozen (SIGSTOP) past the shards' leases and continued.

mod support;

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use parking_lot::Mutex;
use std::time::{Duration, Instant};

use support::{Cluster, Running, free_addr, join_command, sample, wait_for};

/// Set in the re-executed test process that runs inside the namespace.
const INSIDE: &str = "TESSERA_TEST_IN_NETNS";

/// Runs test `name` of this binary again inside a new network namespace (loopback up);
/// true if this process is that inner run.
fn in_own_network_namespace(name: &str) -> bool {
    if std::env::var_os(INSIDE).is_some() {
        return true;
    }
    let exe = std::env::current_exe().expect("the test binary");
    let status = Command::new("unshare")
        .args(["--net", "--", "sh", "-c"])
        .arg(r#"ip link set lo up && exec "$0" --exact "$1" --nocapture --test-threads=1"#)
        .arg(&exe)
        .arg(name)
        .env(INSIDE, "1")
        .status()
        .expect("unshare --net (the test needs root or user namespaces)");
    assert!(
        status.success(),
        "the test inside its network namespace failed"
    );
    false
}

fn iptables(args: &[&str]) {
    let out = Command::new("iptables")
        .args(args)
        .output()
        .expect("iptables (scripts/setup.sh installs it)");
    assert!(
        out.status.success(),
        "iptables {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Cuts (or heals, with `-D`) the traffic between `addr` and the federation's `port`.
fn partition(op: &str, addr: &str, port: &str) {
    iptables(&[
        op, "INPUT", "-s", addr, "-p", "tcp", "--dport", port, "-j", "DROP",
    ]);
    iptables(&[
        op, "OUTPUT", "-d", addr, "-p", "tcp", "--sport", port, "-j", "DROP",
    ]);
}

/// Starts shard `shard`'s agent; it and the address of its `/metrics`.
fn join(fed: &Cluster, shard: &Cluster, grpc: &str, name: &str, bind: &str) -> (Running, String) {
    let metrics = free_addr();
    let agent = Running(
        join_command(fed, shard, grpc, name)
            .args(["--bind-address", bind, "--metrics-addr", &metrics])
            .spawn()
            .expect("tessera join"),
    );
    (agent, metrics)
}

/// Pods of Job `etl` Running in `shard`.
fn running_job_pods(shard: &Cluster) -> usize {
    let out = shard.kubectl(&[
        "get",
        "pods",
        "-n",
        "batch",
        "-l",
        "job-name=etl",
        "--no-headers",
    ]);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains(" Running "))
        .count()
}

/// The invariant of the Job `etl` in namespace `batch`: its pod never Running in two shards
/// at once, checked at every event of a kubectl watch per shard (started again if its stream
/// ends: a watch's first events list what is there) for the whole run.
struct JobWatch {
    stop: Arc<AtomicBool>,
    twice: Arc<AtomicBool>,
    looks: Arc<AtomicUsize>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl JobWatch {
    fn start(kubeconfigs: [std::path::PathBuf; 2]) -> JobWatch {
        let stop = Arc::new(AtomicBool::new(false));
        let twice = Arc::new(AtomicBool::new(false));
        let pods_by_shard: Arc<Mutex<[BTreeMap<String, String>; 2]>> = Arc::default();
        let looks = Arc::new(AtomicUsize::new(0));
        let threads = kubeconfigs
            .into_iter()
            .enumerate()
            .map(|(i, kubeconfig)| {
                let (stop, twice) = (stop.clone(), twice.clone());
                let (pods_by_shard, looks) = (pods_by_shard.clone(), looks.clone());
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Acquire) {
                        let child = Command::new("kubectl")
                            .arg("--kubeconfig")
                            .arg(&kubeconfig)
                            .args(["get", "pods", "-n", "batch", "-l", "job-name=etl"])
                            .args(["--watch", "--output-watch-events", "-o"])
                            .arg("jsonpath={.type} {.object.metadata.name} {.object.status.phase}{\"\\n\"}")
                            .stdout(std::process::Stdio::piped())
                            .stderr(std::process::Stdio::null())
                            .spawn();
                        let Ok(mut child) = child else { break };
                        // A new stream lists the shard's pods afresh; a dead shard runs nothing.
                        pods_by_shard.lock()[i].clear();
                        let out = child.stdout.take().expect("stdout");
                        for line in std::io::BufRead::lines(std::io::BufReader::new(out))
                            .map_while(Result::ok)
                        {
                            let mut f = line.split_whitespace();
                            let (Some(kind), Some(name)) = (f.next(), f.next()) else {
                                continue;
                            };
                            let phase = f.next().unwrap_or_default().to_owned();
                            let mut all = pods_by_shard.lock();
                            if kind == "DELETED" {
                                all[i].remove(name);
                            } else {
                                all[i].insert(name.to_owned(), phase);
                            }
                            let running =
                                |m: &BTreeMap<String, String>| m.values().any(|p| p == "Running");
                            if running(&all[0]) && running(&all[1]) {
                                twice.store(true, Ordering::Release);
                            }
                            looks.fetch_add(1, Ordering::Relaxed);
                            if stop.load(Ordering::Acquire) {
                                break;
                            }
                        }
                        let _ = child.kill();
                        let _ = child.wait();
                        pods_by_shard.lock()[i].clear();
                        std::thread::sleep(Duration::from_millis(200));
                    }
                })
            })
            .collect();
        JobWatch {
            stop,
            twice,
            looks,
            threads,
        }
    }

    /// Stops watching; asserts the watches saw at least `min_looks` pod events (they
    /// watched the run) and never the pod Running in both shards.
    fn finish(self, min_looks: usize) {
        self.stop.store(true, Ordering::Release);
        // The watches end with their kubectl (killed by the clusters' drop if still open).
        let looks = self.looks.load(Ordering::Relaxed);
        drop(self.threads);
        assert!(
            looks >= min_looks,
            "the watches saw {looks} pod events: every move is several"
        );
        assert!(
            !self.twice.load(Ordering::Acquire),
            "the Job's pod was Running in both shards at once"
        );
    }
}

/// `field` of every `FederationLeaseLost` Event in the shard's `batch` namespace.
fn lease_lost_events(shard: &Cluster, field: &str) -> String {
    shard.ok(&[
        "get",
        "events",
        "-n",
        "batch",
        "--field-selector",
        "reason=FederationLeaseLost",
        "-o",
        &format!("jsonpath={{.items[*].{field}}}"),
    ])
}

fn has(shard: &Cluster, kind: &str, name: &str) -> bool {
    shard
        .kubectl(&["get", kind, name, "-n", "batch", "-o", "name"])
        .status
        .success()
}

/// Replicas of Deployment `web` ready in `shard`.
fn ready_web(shard: &Cluster) -> u64 {
    shard
        .ok(&[
            "get",
            "deploy",
            "web",
            "-n",
            "batch",
            "--ignore-not-found",
            "-o",
            "jsonpath={.status.readyReplicas}",
        ])
        .trim()
        .parse()
        .unwrap_or(0)
}

/// Waits for the Deployment (Fast: moved at the lease's end) and then the Job (AtMostOnce:
/// after its grace period and the margin) to run in `target`; prints the times since the
/// fault (`since`), the figures docs/benchmarks.md records — measured, not asserted.
fn fails_over(
    fault: &str,
    stopped_where: &str,
    since: std::time::Instant,
    stopped_after: Duration,
    target: &Cluster,
) -> Option<()> {
    let fast = wait_for(Duration::from_secs(60), || {
        (ready_web(target) == 2).then(|| since.elapsed())
    });
    let moved = wait_for(Duration::from_secs(60), || {
        (running_job_pods(target) == 1 && ready_web(target) == 2).then_some(())
    });
    eprintln!(
        "failover after {fault}: Job stopped {stopped_where} {:.1}s; Deployment (Fast) ready in the other {:.1}s; Job (AtMostOnce) running there {:.1}s",
        stopped_after.as_secs_f64(),
        fast.unwrap_or_default().as_secs_f64(),
        since.elapsed().as_secs_f64()
    );
    moved
}

#[test]
fn a_cut_off_shard_stops_its_at_most_once_job_before_the_federation_starts_it_elsewhere() {
    if !in_own_network_namespace(
        "a_cut_off_shard_stops_its_at_most_once_job_before_the_federation_starts_it_elsewhere",
    ) {
        return;
    }
    let grpc = free_addr();
    let port = grpc.rsplit(':').next().expect("a port").to_owned();
    let mut fed = support::quick_federation(&grpc, &[]);
    let east = Cluster::start_with("up", &["--shards=0", "--nodes-per-shard=4"]);
    let west = Cluster::start_with("up", &["--shards=0", "--nodes-per-shard=4"]);
    let shards = [("east", "127.0.0.2"), ("west", "127.0.0.3")];
    let agents = [
        join(&fed, &east, &grpc, shards[0].0, shards[0].1),
        join(&fed, &west, &grpc, shards[1].0, shards[1].1),
    ];
    fed.wait_for_ready_shards(2);

    // A Job of one completion that runs for ten minutes (AtMostOnce by its kind; its pods
    // stop at once) and a Deployment of two (Fast by its kind).
    fed.ok(&["create", "namespace", "batch"]);
    let manifest = fed.file(
        "work.yaml",
        &[ETL_JOB, "---\napiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web, namespace: batch}\nspec:\n  replicas: 2\n  selector: {matchLabels: {app: web}}\n  template:\n    metadata: {labels: {app: web}}\n    spec:\n      terminationGracePeriodSeconds: 0\n      containers: [{name: c, image: nginx}]\n"].concat(),
    );
    fed.ok(&["apply", "-f", &manifest]);
    let clusters = [&east, &west];
    let home = wait_for(Duration::from_secs(60), || {
        clusters
            .iter()
            .position(|c| running_job_pods(c) == 1 && ready_web(c) == 2)
    })
    .expect("the Job and the Deployment run in one shard");
    let (cut, other) = (clusters[home], clusters[1 - home]);
    let (cut_name, cut_addr) = shards[home];

    // Watch the invariant for the whole run: the Job's pod never Running in both shards.
    let watch = JobWatch::start([cut.kubeconfig.clone(), other.kubeconfig.clone()]);

    // Cut the home shard's agent off from the federation.
    partition("-A", cut_addr, &port);
    let cut_at = std::time::Instant::now();
    // The cut-off shard stops the Job itself (its lease lapses by its own clock) ...
    let stopped = wait_for(Duration::from_secs(30), || {
        (running_job_pods(cut) == 0).then_some(())
    });
    assert!(
        stopped.is_some(),
        "the cut-off shard still runs the Job: {}",
        cut.ok(&["get", "jobs,pods", "-n", "batch"])
    );
    // ... and the federation starts it in the other shard, and the Deployment there too.
    let moved = fails_over(
        "a partition",
        "in the cut-off shard",
        cut_at,
        cut_at.elapsed(),
        other,
    );
    assert!(
        moved.is_some(),
        "not failed over: {}\n{}",
        other.ok(&["get", "jobs,deploy,pods", "-n", "batch"]),
        fed.ok(&["get", "shards"])
    );
    let shard_state = fed.ok(&["get", "shards", cut_name, "--no-headers"]);
    assert!(
        !shard_state.contains(" True "),
        "the cut-off shard shows not ready: {shard_state}"
    );
    // ... and is tainted: no new work goes there.
    let taints = || {
        fed.ok(&[
            "get",
            "shard",
            cut_name,
            "-o",
            "jsonpath={.spec.taints[*].key}",
        ])
    };
    let tainted = wait_for(Duration::from_secs(10), || {
        taints().contains("tessera.io/unreachable").then_some(())
    });
    assert!(tainted.is_some(), "taints: {}", taints());
    // Its agent counts what it did.
    let cut_metrics = &agents[home].1;
    assert!(sample(cut_metrics, "tessera_federation_agent_lease_lapses_total ") >= 1.0);
    assert!(
        sample(
            cut_metrics,
            "tessera_federation_agent_stopped_total{kind=\"Job\"} "
        ) >= 1.0
    );
    // The cut-off shard still has its stopped copies: nothing there is resumed while cut.
    assert!(has(cut, "job", "etl"));
    assert_eq!(running_job_pods(cut), 0);

    // Healed: the shard joins again, and its stale copies are removed, never resumed.
    partition("-D", cut_addr, &port);
    let removed = wait_for(Duration::from_secs(60), || {
        (!has(cut, "job", "etl") && !has(cut, "deploy", "web")).then_some(())
    });
    assert!(
        removed.is_some(),
        "stale copies left in the healed shard: {}",
        cut.ok(&["get", "jobs,deploy,pods", "-n", "batch"])
    );
    let back = wait_for(Duration::from_secs(30), || {
        let out = fed.ok(&["get", "shards", "--no-headers"]);
        (out.lines().filter(|l| l.contains(" True ")).count() == 2).then_some(())
    });
    assert!(back.is_some(), "{}", fed.ok(&["get", "shards"]));
    let untainted = wait_for(Duration::from_secs(10), || {
        (!taints().contains("tessera.io/unreachable")).then_some(())
    });
    assert!(untainted.is_some(), "taints: {}", taints());
    assert_eq!(running_job_pods(other), 1, "the moved Job runs on");
    // Nothing lost at the federation: both objects are there, placed on the other shard.
    fed.ok(&["get", "job", "etl", "-n", "batch"]);
    fed.ok(&["get", "deploy", "web", "-n", "batch"]);
    // Now the agent of the shard that runs them is stopped (SIGSTOP), its control plane
    // running on: it cannot stop anything, so the shard's own fence must, when the Lease the
    // agent renewed there ends; then the federation moves them back.
    let agent_pid = agents[1 - home].0.0.id();
    let signal = |sig: &str| support::signal(agent_pid, sig);
    signal("-STOP");
    let stopped_at = std::time::Instant::now();
    let fenced = wait_for(Duration::from_secs(30), || {
        (running_job_pods(other) == 0).then_some(())
    });
    assert!(
        fenced.is_some(),
        "the shard whose agent is stopped still runs the Job: {}",
        other.ok(&["get", "jobs,pods", "-n", "batch"])
    );
    let fence_event = lease_lost_events(other, "message");
    assert!(
        fence_event.contains("its agent did not stop this"),
        "the shard's fence stopped it: {fence_event}"
    );
    let back_home = fails_over(
        "an agent's SIGSTOP",
        "by the shard's fence",
        stopped_at,
        stopped_at.elapsed(),
        cut,
    );
    assert!(
        back_home.is_some(),
        "not failed over back: {}",
        cut.ok(&["get", "jobs,deploy,pods", "-n", "batch"])
    );
    // The agent resumes: it registers again and removes its stale copies.
    signal("-CONT");
    let cleaned = wait_for(Duration::from_secs(60), || {
        (!has(other, "job", "etl") && !has(other, "deploy", "web")).then_some(())
    });
    assert!(
        cleaned.is_some(),
        "stale copies left after the agent resumed: {}",
        other.ok(&["get", "jobs,deploy,pods", "-n", "batch"])
    );
    assert_eq!(running_job_pods(cut), 1, "the Job runs on where it moved");

    // Last, the shard that runs them dies (kill -9 of its control plane, its agent left
    // running): the agent stops renewing a lease for a shard whose API does not answer, so
    // the federation moves them once more.
    support::signal(cut.pid(), "-KILL");
    let dead_at = std::time::Instant::now();
    let moved_again = fails_over(
        "kill -9 of a shard",
        "(dead with its shard)",
        dead_at,
        Duration::ZERO,
        other,
    );
    assert!(
        sample(
            &agents[home].1,
            "tessera_federation_agent_renewals_withheld_total "
        ) >= 1.0,
        "the dead shard's agent withheld its renewals"
    );
    assert!(
        moved_again.is_some(),
        "not failed over from the dead shard: {}\n{}",
        other.ok(&["get", "jobs,deploy,pods", "-n", "batch"]),
        fed.ok(&["get", "shards"])
    );

    let metrics = Command::new("curl")
        .args(["-s", &format!("http://{}/metrics", fed.metrics_addr)])
        .output()
        .expect("curl");
    let metrics = String::from_utf8_lossy(&metrics.stdout);
    for mode in ["AtMostOnce", "Fast"] {
        assert!(
            metrics.lines().any(|l| l.starts_with(&format!(
                "tessera_federation_failovers_total{{mode=\"{mode}\"}} "
            ))),
            "no {mode} failover counted: {}",
            metrics
                .lines()
                .filter(|l| l.contains("failover"))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }

    // And the federation itself killed (-9) and started again: the surviving shard joins it
    // again and keeps (or resumes) what it runs; nothing placed is lost or doubled.
    fed.kill_and_restart();
    let rejoined = wait_for(Duration::from_secs(60), || {
        let out = fed.ok(&["get", "shards", "--no-headers"]);
        out.lines()
            .any(|l| l.contains(shards[1 - home].0) && l.contains(" True "))
            .then_some(())
    });
    assert!(rejoined.is_some(), "{}", fed.ok(&["get", "shards"]));
    let whole = wait_for(Duration::from_secs(60), || {
        (running_job_pods(other) == 1 && ready_web(other) == 2).then_some(())
    });
    assert!(
        whole.is_some(),
        "after the federation's restart: {}",
        other.ok(&["get", "jobs,deploy,pods", "-n", "batch"])
    );
    fed.ok(&["get", "job", "etl", "-n", "batch"]);
    fed.ok(&["get", "deploy", "web", "-n", "batch"]);

    // Last, the federation frozen (SIGSTOP) past the shards' leases: the shard cannot tell
    // that from a partition, so it stops its Job itself while its Deployment runs on
    // untouched; continued, the federation takes the shard back and the Job resumes — once.
    let fed_pid = fed.pid();
    let fed_signal = |sig: &str| support::signal(fed_pid, sig);
    fed_signal("-STOP");
    let frozen_at = std::time::Instant::now();
    let mut web_dipped = false;
    let fenced = wait_for(Duration::from_secs(30), || {
        web_dipped |= ready_web(other) < 2;
        (running_job_pods(other) == 0).then(|| frozen_at.elapsed())
    });
    fed_signal("-CONT");
    let thawed_at = std::time::Instant::now();
    assert!(
        fenced.is_some(),
        "the Job ran on while the federation was frozen: {}",
        other.ok(&["get", "jobs,deploy,pods", "-n", "batch"])
    );
    assert!(
        !web_dipped,
        "the Fast Deployment was touched while the federation was frozen"
    );
    let resumed = wait_for(Duration::from_secs(60), || {
        (running_job_pods(other) == 1 && ready_web(other) == 2).then(|| thawed_at.elapsed())
    });
    eprintln!(
        "federation SIGSTOP: Job stopped by the shard {:.1}s after the freeze; running again {:.1}s after SIGCONT",
        fenced.unwrap_or_default().as_secs_f64(),
        resumed.unwrap_or_default().as_secs_f64()
    );
    assert!(
        resumed.is_some(),
        "after the federation was continued: {}\n{}",
        other.ok(&["get", "jobs,deploy,pods", "-n", "batch"]),
        fed.ok(&["get", "shards"])
    );
    fed.ok(&["get", "job", "etl", "-n", "batch"]);

    watch.finish(6);
}

/// A Job of one completion that runs for ten minutes, its pods stopping at once.
const ETL_JOB: &str = "apiVersion: batch/v1\nkind: Job\nmetadata: {name: etl, namespace: batch}\nspec:\n  completions: 1\n  template:\n    metadata:\n      annotations: {tessera.io/sim-run-seconds: \"600\"}\n    spec:\n      restartPolicy: Never\n      terminationGracePeriodSeconds: 0\n      containers: [{name: c, image: busybox}]\n";

/// The last fault of the matrix: a shard's federation agent killed (kill -9) while the shard
/// runs on. Nothing renews the shard's federation Lease, so the shard's own `federation-fence`
/// controller suspends the Job when it ends; the federation starts it elsewhere only after
/// lease + grace + margin, and the agent, started again, removes the stale copy.
#[test]
fn a_killed_agent_leaves_the_shard_to_fence_itself_and_the_job_runs_once() {
    let grpc = free_addr();
    let fed = support::quick_federation(&grpc, &[]);
    let shards = [
        Cluster::start_with("up", &["--shards=0", "--nodes-per-shard=2"]),
        Cluster::start_with("up", &["--shards=0", "--nodes-per-shard=2"]),
    ];
    let names = ["east", "west"];
    let mut agents: Vec<Option<Running>> = names
        .iter()
        .zip(&shards)
        .map(|(n, s)| Some(support::join_agent(&fed, s, &grpc, n)))
        .collect();
    fed.wait_for_ready_shards(2);
    fed.ok(&["create", "namespace", "batch"]);
    let job = fed.file("job.yaml", ETL_JOB);
    fed.ok(&["apply", "-f", &job]);
    let home = wait_for(Duration::from_secs(60), || {
        shards.iter().position(|s| running_job_pods(s) == 1)
    })
    .expect("the Job runs in one shard");
    let other = 1 - home;
    let watch = JobWatch::start([
        shards[home].kubeconfig.clone(),
        shards[other].kubeconfig.clone(),
    ]);
    // kill -9: the agent renews nothing more and stops nothing.
    agents[home] = None;
    let killed = Instant::now();
    let mut most = 0;
    let moved = wait_for(Duration::from_secs(60), || {
        let (h, o) = (
            running_job_pods(&shards[home]),
            running_job_pods(&shards[other]),
        );
        most = most.max(h + o);
        (o == 1).then(|| (killed.elapsed(), h))
    });
    let (after, still_home) = moved.expect("the Job runs in the other shard");
    println!(
        "agent killed: the Job ran in the other shard {:.1}s after",
        after.as_secs_f64()
    );
    assert_eq!(
        (most, still_home),
        (1, 0),
        "the Job's pod ran in both shards"
    );
    assert_eq!(
        shards[home].ok(&[
            "get",
            "job",
            "etl",
            "-n",
            "batch",
            "-o",
            "jsonpath={.spec.suspend}"
        ]),
        "true",
        "the shard suspended its copy itself"
    );
    let events = lease_lost_events(&shards[home], "source.component");
    assert!(events.contains("federation-fence"), "{events}");
    // The agent back: the federation no longer assigns the Job there; its copy goes.
    agents[home] = Some(support::join_agent(&fed, &shards[home], &grpc, names[home]));
    let gone = wait_for(Duration::from_secs(60), || {
        (!has(&shards[home], "job", "etl")).then_some(())
    });
    assert!(gone.is_some(), "the stale copy is removed, never resumed");
    assert_eq!(running_job_pods(&shards[other]), 1);
    // From the watches, over the whole run: never Running in both at once (the polls above
    // look every 100 ms; the watches see every change).
    watch.finish(3);
}
