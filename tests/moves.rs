//! Moving workloads between live shards, end to end with the real kubectl: `tessera shard
//! drain` empties a shard (Deployments make-before-break, a Job stop-then-start, at most
//! `--max-moving` at once), and a shard that joins takes over its tenants' Deployments
//! without a gap. A watcher reads the shards throughout and the invariants are asserted on
//! everything it saw.

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

mod support;

use support::{Cluster, Running, free_addr, join_command, sample, wait_for};

/// A shard as kubectl reaches it: its kubeconfig and context.
#[derive(Clone)]
struct Target {
    kubeconfig: std::path::PathBuf,
    context: Option<String>,
    name: String,
}

impl Target {
    fn kubectl(&self, args: &[&str]) -> Option<String> {
        let mut cmd = Command::new("kubectl");
        cmd.arg("--kubeconfig").arg(&self.kubeconfig);
        if let Some(c) = &self.context {
            cmd.args(["--context", c]);
        }
        let out = cmd.args(args).output().ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// One look at the shard: `namespace/name` → available replicas of every Deployment,
    /// and the phase of every pod of a Job (by `namespace/job`), from one request.
    fn look(&self) -> Option<Look> {
        let out = self.kubectl(&[
            "get",
            "deploy,pods",
            "-A",
            "-o",
            "jsonpath={range .items[*]}{.kind} {.metadata.namespace} {.metadata.name} {.status.availableReplicas}{.status.phase} {.metadata.labels.job-name}{\"\\n\"}{end}",
        ])?;
        let mut look = Look::default();
        for l in out.lines() {
            let f: Vec<&str> = l.split(' ').collect();
            match f.as_slice() {
                ["Deployment", ns, name, n, ..] => {
                    look.available
                        .insert(format!("{ns}/{name}"), n.parse().unwrap_or(0));
                }
                ["Pod", ns, _, "Running" | "Pending", job] if !job.is_empty() => {
                    *look.job_pods.entry(format!("{ns}/{job}")).or_default() += 1;
                }
                _ => {}
            }
        }
        Some(look)
    }

    /// `namespace/name` → available replicas, of every Deployment in the shard.
    fn available(&self) -> Option<BTreeMap<String, u64>> {
        self.look().map(|l| l.available)
    }

    /// Pods of Job `ns/job` not finished (Running or Pending, terminating ones included).
    fn job_pods(&self, ns: &str, job: &str) -> Option<usize> {
        self.look()
            .map(|l| l.job_pods.get(&format!("{ns}/{job}")).copied().unwrap_or(0))
    }
}

/// What one shard runs, at one look.
#[derive(Debug, Default)]
struct Look {
    available: BTreeMap<String, u64>,
    job_pods: BTreeMap<String, usize>,
}

/// What the watcher saw: per Deployment the least sum of available replicas over the
/// shards, the most Job pods alive at once over the shards, and how many looks it took.
#[derive(Debug, Default)]
struct Seen {
    least_available: BTreeMap<String, u64>,
    most_job_pods: usize,
    looks: usize,
}

/// Reads the shards until stopped, checking the invariants on every look.
///
/// Work moves out of `source` into the `others`. Two reads of different shards are never
/// one snapshot, so each invariant is read in the order that makes its check sound:
/// - make-before-break (the new copy is available before the old one goes): the source
///   is read *before* the others; if that read finds the old copy gone, the new one was
///   available already when the others are read;
/// - stop-then-start (the Job's pod stops before it starts elsewhere): the source is read
///   *after* the others; if they find the new pod, the old one had stopped already.
///
/// A look is therefore source, others (at once), source again.
fn watch(
    source: Target,
    others: Vec<Target>,
    job: Option<&'static str>,
    stop: Arc<AtomicBool>,
) -> JoinHandle<Seen> {
    std::thread::spawn(move || {
        let mut seen = Seen::default();
        while !stop.load(Ordering::Acquire) {
            let before = source.look();
            let elsewhere: Vec<Option<Look>> = std::thread::scope(|scope| {
                let handles: Vec<_> = others.iter().map(|s| scope.spawn(|| s.look())).collect();
                handles
                    .into_iter()
                    .map(|h| h.join().ok().flatten())
                    .collect()
            });
            let after = source.look();
            let job_pods = |l: &Look| job.and_then(|j| l.job_pods.get(j)).copied().unwrap_or(0);
            let pods: usize = elsewhere
                .iter()
                .chain(std::iter::once(&after))
                .flatten()
                .map(job_pods)
                .sum();
            seen.most_job_pods = seen.most_job_pods.max(pods);
            if before.is_some() && elsewhere.iter().all(Option::is_some) {
                let mut sum: BTreeMap<String, u64> = BTreeMap::new();
                for l in std::iter::once(before).chain(elsewhere).flatten() {
                    for (k, n) in l.available {
                        *sum.entry(k).or_default() += n;
                    }
                }
                for (k, n) in sum {
                    let least = seen.least_available.entry(k).or_insert(n);
                    *least = (*least).min(n);
                }
                seen.looks += 1;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        seen
    })
}

fn tessera(args: &[&str], kubeconfig: &std::path::Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(args)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .output()
        .expect("tessera")
}

#[test]
fn a_drained_shard_hands_its_workloads_over_without_a_gap_or_a_second_run() {
    // New pods take 2 s to run, so each move has a window in which only the old copy is
    // available; one move at a time.
    let c = Cluster::start_with(
        "up",
        &[
            "--shards=3",
            "--nodes-per-shard=8",
            "--node-cpu=8",
            "--startup-delay-ms=2000",
            "--max-moving=1",
        ],
    );
    c.wait_for_ready_shards(3);
    c.ok(&["create", "namespace", "mv"]);
    for (name, n) in [("web", "4"), ("api", "2")] {
        c.ok(&[
            "create",
            "deployment",
            name,
            "-n",
            "mv",
            "--image=nginx",
            &format!("--replicas={n}"),
        ]);
    }
    let job = c.file(
        "job.yaml",
        "apiVersion: batch/v1\nkind: Job\nmetadata: {name: once, namespace: mv}\nspec:\n  completions: 1\n  template:\n    metadata:\n      annotations: {tessera.io/sim-run-seconds: \"600\", tessera.io/sim-stop-seconds: \"2\"}\n    spec:\n      restartPolicy: Never\n      terminationGracePeriodSeconds: 3\n      containers: [{name: c, image: busybox}]\n",
    );
    c.ok(&["apply", "-f", &job]);
    for d in ["web", "api"] {
        c.ok(&[
            "rollout",
            "status",
            &format!("deployment/{d}"),
            "-n",
            "mv",
            "--timeout=90s",
        ]);
    }
    let shards: Vec<Target> = (0..3)
        .map(|i| Target {
            kubeconfig: c.kubeconfig.clone(),
            context: Some(format!("shard-{i}")),
            name: format!("shard-{i}"),
        })
        .collect();
    let running = wait_for(Duration::from_secs(60), || {
        shards
            .iter()
            .find(|s| s.job_pods("mv", "once") == Some(1))
            .map(|s| s.name.clone())
    });
    let home = running.expect("the Job runs one pod");
    // Every workload of the tenant is in its home shard.
    for s in &shards {
        let have = s.available().unwrap_or_default();
        assert_eq!(
            have.contains_key("mv/web"),
            s.name == home,
            "{}: {have:?}",
            s.name
        );
    }

    let stop = Arc::new(AtomicBool::new(false));
    let (source, others): (Vec<Target>, Vec<Target>) =
        shards.iter().cloned().partition(|s| s.name == home);
    let source = source.into_iter().next().expect("home");
    let watcher = watch(source, others, Some("mv/once"), stop.clone());
    std::thread::sleep(Duration::from_millis(500));
    let out = tessera(
        &["shard", "drain", &home, "--timeout-seconds=120"],
        &c.kubeconfig,
    );
    // Watched until everything runs again elsewhere.
    let moved_to = wait_for(Duration::from_secs(60), || {
        let web = c.ok(&[
            "get",
            "deploy",
            "web",
            "-n",
            "mv",
            "-o",
            "jsonpath={.status.availableReplicas}",
        ]);
        shards
            .iter()
            .find(|s| s.name != home && s.job_pods("mv", "once") == Some(1))
            .filter(|_| web == "4")
            .map(|s| s.name.clone())
    });
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Release);
    let seen = watcher.join().expect("watcher");
    assert!(seen.looks >= 5, "the watcher looked {} times", seen.looks);
    // Make-before-break: never fewer available than wanted, over the shards.
    assert_eq!(seen.least_available.get("mv/web"), Some(&4), "{seen:?}");
    assert_eq!(seen.least_available.get("mv/api"), Some(&2), "{seen:?}");
    // Stop-then-start: the Job's pod never alive in two shards at once.
    assert_eq!(seen.most_job_pods, 1, "{seen:?}");
    assert!(
        out.status.success(),
        "drain: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("drained"));
    assert!(moved_to.is_some(), "the Job runs again in another shard");

    // Everything left the drained shard.
    let drained = shards.iter().find(|s| s.name == home).expect("home");
    assert_eq!(drained.available(), Some(BTreeMap::new()));
    assert_eq!(drained.job_pods("mv", "once"), Some(0));
    // The Shard shows it: cordoned, nothing held; its Events name each move.
    let row = c.ok(&["get", "shard", &home, "--no-headers"]);
    assert!(row.contains("SchedulingDisabled"), "{row}");
    assert_eq!(
        c.ok(&["get", "shard", &home, "-o", "jsonpath={.status.workloads}"]),
        "0"
    );
    let events = c.ok(&[
        "get",
        "events",
        "-A",
        "--field-selector",
        &format!("involvedObject.kind=Shard,involvedObject.name={home}"),
        "-o",
        "jsonpath={range .items[*]}{.reason} {.message}{\"\\n\"}{end}",
    ]);
    for w in ["Deployment mv/web", "Deployment mv/api", "Job mv/once"] {
        assert!(
            events
                .lines()
                .any(|l| l.starts_with("MovingOut") && l.contains(w)),
            "no MovingOut event for {w}: {events}"
        );
    }
    let moved = c.ok(&[
        "get",
        "events",
        "-n",
        "mv",
        "--field-selector",
        "involvedObject.name=web,reason=Moved",
        "-o",
        "jsonpath={.items[*].message}",
    ]);
    assert!(moved.contains("moved to"), "{moved}");
    // Three moves, one at a time: the others waited for the slot.
    let m = &c.metrics_addr;
    assert_eq!(
        sample(m, "tessera_federation_moves_total{reason=\"drain\"}"),
        3.0
    );
    assert!(sample(m, "tessera_federation_moves_deferred_total") >= 1.0);
    assert_eq!(sample(m, "tessera_federation_moves_in_progress"), 0.0);

    // Nothing new lands on the drained shard; uncordoned, it takes work again.
    c.ok(&["create", "namespace", "later"]);
    c.ok(&[
        "create",
        "deployment",
        "x",
        "-n",
        "later",
        "--image=nginx",
        "--replicas=1",
    ]);
    c.ok(&[
        "rollout",
        "status",
        "deployment/x",
        "-n",
        "later",
        "--timeout=60s",
    ]);
    assert!(
        !drained
            .available()
            .unwrap_or_default()
            .contains_key("later/x")
    );
    let out = tessera(&["shard", "uncordon", &home], &c.kubeconfig);
    assert!(out.status.success());
    let spec = c.ok(&["get", "shard", &home, "-o", "jsonpath={.spec}"]);
    assert!(!spec.contains("tessera.io/drain"), "{spec}");

    // Invalid input: an unknown shard is named, nothing changes.
    let out = tessera(&["shard", "drain", "nosuch"], &c.kubeconfig);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no shard \"nosuch\""), "{err}");
}

#[test]
fn a_shard_that_joins_takes_over_its_tenants_without_a_gap() {
    let grpc = free_addr();
    let fed = Cluster::start_with(
        "federation",
        &[&format!("--grpc-addr={grpc}"), "--max-moving=2"],
    );
    let shard_args = [
        "--shards=0",
        "--nodes-per-shard=6",
        "--node-cpu=8",
        "--startup-delay-ms=1500",
    ];
    let a = Cluster::start_with("up", &shard_args);
    let _agent_a = Running(join_command(&fed, &a, &grpc, "a").spawn().expect("join a"));
    let ready = wait_for(Duration::from_secs(60), || {
        let out = fed.ok(&["get", "shards", "--no-headers"]);
        out.contains(" True ").then_some(())
    });
    assert!(ready.is_some(), "{}", fed.ok(&["get", "shards"]));
    let tenants: Vec<String> = (0..12).map(|i| format!("t{i}")).collect();
    for t in &tenants {
        fed.ok(&["create", "namespace", t]);
        fed.ok(&[
            "create",
            "deployment",
            "app",
            "-n",
            t,
            "--image=nginx",
            "--replicas=2",
        ]);
    }
    for t in &tenants {
        fed.ok(&[
            "rollout",
            "status",
            "deployment/app",
            "-n",
            t,
            "--timeout=90s",
        ]);
    }
    let b = Cluster::start_with("up", &shard_args);
    let targets = [
        Target {
            kubeconfig: a.kubeconfig.clone(),
            context: None,
            name: "a".into(),
        },
        Target {
            kubeconfig: b.kubeconfig.clone(),
            context: None,
            name: "b".into(),
        },
    ];
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = watch(
        targets[0].clone(),
        vec![targets[1].clone()],
        None,
        stop.clone(),
    );
    std::thread::sleep(Duration::from_millis(300));
    let _agent_b = Running(join_command(&fed, &b, &grpc, "b").spawn().expect("join b"));
    // The tenants the new map homes on b move there, and only those.
    let settled = wait_for(Duration::from_secs(120), || {
        let (on_a, on_b) = (targets[0].available()?, targets[1].available()?);
        let moved = on_b.len();
        let whole = tenants.iter().all(|t| {
            let k = format!("{t}/app");
            on_a.contains_key(&k) != on_b.contains_key(&k)
                && on_a.get(&k).or(on_b.get(&k)) == Some(&2)
        });
        (moved > 0
            && whole
            && sample(&fed.metrics_addr, "tessera_federation_moves_in_progress") == 0.0)
            .then_some((on_a, on_b))
    });
    stop.store(true, Ordering::Release);
    let seen = watcher.join().expect("watcher");
    let (on_a, on_b) = settled.unwrap_or_else(|| {
        panic!(
            "tenants did not settle: a {:?}, b {:?}",
            targets[0].available(),
            targets[1].available()
        )
    });
    // Consistent hashing: about half move to the second shard, never all.
    assert!(
        (1..tenants.len()).contains(&on_b.len()),
        "{} of {} tenants moved: a {on_a:?} b {on_b:?}",
        on_b.len(),
        tenants.len()
    );
    // Not one look found a Deployment with fewer than its 2 replicas available.
    assert!(seen.looks >= 5, "{seen:?}");
    for t in &tenants {
        assert_eq!(
            seen.least_available.get(&format!("{t}/app")),
            Some(&2),
            "{t}: {seen:?}"
        );
    }
    let moved = sample(
        &fed.metrics_addr,
        "tessera_federation_moves_total{reason=\"rebalance\"}",
    );
    assert_eq!(moved as usize, on_b.len(), "one move per tenant moved");
}

#[test]
fn a_move_that_cannot_finish_gives_its_slot_up_after_the_move_timeout() {
    let c = Cluster::start_with(
        "up",
        &[
            "--shards=2",
            "--nodes-per-shard=4",
            "--max-moving=1",
            "--move-timeout-seconds=2",
        ],
    );
    c.wait_for_ready_shards(2);
    c.ok(&["create", "namespace", "st"]);
    // Two Deployments that never become available (a pod counts only after an hour Ready)
    // and one that does: with one move slot, a stuck move must not hold up the others.
    let stuck = |name: &str| {
        format!(
            "apiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: {name}, namespace: st}}\nspec:\n  replicas: 1\n  minReadySeconds: 3600\n  selector: {{matchLabels: {{app: {name}}}}}\n  template:\n    metadata: {{labels: {{app: {name}}}}}\n    spec: {{containers: [{{name: c, image: nginx}}]}}\n"
        )
    };
    for name in ["slow-1", "slow-2"] {
        c.ok(&[
            "apply",
            "-f",
            &c.file(&format!("{name}.yaml"), &stuck(name)),
        ]);
    }
    c.ok(&[
        "create",
        "deployment",
        "web",
        "-n",
        "st",
        "--image=nginx",
        "--replicas=2",
    ]);
    c.ok(&[
        "rollout",
        "status",
        "deployment/web",
        "-n",
        "st",
        "--timeout=90s",
    ]);
    let shards: Vec<Target> = (0..2)
        .map(|i| Target {
            kubeconfig: c.kubeconfig.clone(),
            context: Some(format!("shard-{i}")),
            name: format!("shard-{i}"),
        })
        .collect();
    let home = shards
        .iter()
        .find(|s| s.available().is_some_and(|a| a.get("st/web") == Some(&2)))
        .map(|s| s.name.clone())
        .expect("web runs in one shard");
    let other = shards
        .iter()
        .find(|s| s.name != home)
        .expect("another shard");
    let out = tessera(&["shard", "drain", &home, "--no-wait"], &c.kubeconfig);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stalled = wait_for(Duration::from_secs(60), || {
        let events = c.ok(&[
            "get",
            "events",
            "-n",
            "st",
            "--field-selector",
            "reason=MoveStalled",
            "-o",
            "jsonpath={range .items[*]}{.involvedObject.name} {.message}{\"\\n\"}{end}",
        ]);
        let web_moved = other
            .available()
            .is_some_and(|a| a.get("st/web") == Some(&2));
        (web_moved && events.contains("slow-1 ") && events.contains("slow-2 ")).then_some(events)
    });
    let events = stalled.expect("both stuck moves stalled and gave their slot up; web moved");
    assert!(
        events.contains("the new copies (1 on ") && events.contains("are not available yet"),
        "{events}"
    );
    assert!(sample(&c.metrics_addr, "tessera_federation_moves_stalled_total") >= 2.0);
    // Make-before-break holds for a stalled move: the old copies stay in the drained shard.
    // web's old copy goes once its new one is available — a moment after that was seen.
    let left_in_home = || {
        shards
            .iter()
            .find(|s| s.name == home)
            .and_then(|s| s.kubectl(&["get", "deploy", "-n", "st", "-o", "name"]))
            .unwrap_or_default()
    };
    let left = wait_for(Duration::from_secs(30), || {
        let left = left_in_home();
        (!left.contains("/web")).then_some(left)
    })
    .unwrap_or_else(left_in_home);
    assert!(
        left.contains("slow-1") && left.contains("slow-2") && !left.contains("/web"),
        "{left}"
    );
}
