//! Cross-shard gangs end to end: a federation and three shards as separate processes, each
//! shard with 4 cpu, and a gang of 6 one-cpu pods that no single shard can hold. It is
//! divided over two shards and must be bound in all of them or none — first with the
//! federation killed (kill -9) between the reserve and commit phases, then with a shard cut
//! off (its agent frozen) mid-commit, then with one of its shards drained. A watcher reads
//! every shard's gang pods through the faults and the invariants are asserted on everything
//! it saw.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

mod support;

use support::{Cluster, Running, free_addr, join_agent, signal, wait_for};

/// A gang of `size` one-cpu pods of PodGroup `group`, `Federation` scope, with a
/// reservation TTL of 10 s (longer than the commit delay below), run by Job `job` in namespace `gangs`.
fn gang_manifest(group: &str, job: &str, size: usize) -> String {
    format!(
        "apiVersion: tessera.io/v1alpha1\nkind: PodGroup\nmetadata: {{name: {group}, namespace: gangs}}\nspec: {{minMember: {size}, scope: Federation, scheduleTimeoutSeconds: 10}}\n---\napiVersion: batch/v1\nkind: Job\nmetadata: {{name: {job}, namespace: gangs}}\nspec:\n  parallelism: {size}\n  completions: {size}\n  template:\n    metadata:\n      labels: {{scheduling.x-k8s.io/pod-group: {group}}}\n      annotations: {{tessera.io/sim-run-seconds: \"600\"}}\n    spec:\n      restartPolicy: Never\n      terminationGracePeriodSeconds: 0\n      containers:\n      - name: c\n        image: busybox\n        resources: {{requests: {{cpu: \"1\"}}}}\n"
    )
}

/// The gang pods of Job `job` in a shard: (bound to a node, all), or `None` if the shard did
/// not answer.
fn gang_pods(shard: &Cluster, job: &str) -> Option<(usize, usize)> {
    let out = shard.kubectl(&[
        "get",
        "pods",
        "-n",
        "gangs",
        "-l",
        &format!("job-name={job}"),
        "-o",
        "jsonpath={range .items[*]}{.metadata.name} {.spec.nodeName}{\"\\n\"}{end}",
    ]);
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let all = text.lines().filter(|l| !l.trim().is_empty()).count();
    let bound = text
        .lines()
        .filter(|l| l.split(' ').nth(1).is_some_and(|n| !n.is_empty()))
        .count();
    Some((bound, all))
}

/// A shard's PodGroup `group`: `status.reserved`, if the shard holds it.
fn reserved(shard: &Cluster, group: &str) -> Option<i64> {
    let out = shard.kubectl(&[
        "get",
        "podgroup",
        group,
        "-n",
        "gangs",
        "-o",
        "jsonpath={.status.reserved}",
    ]);
    out.status.success().then(|| {
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .unwrap_or(0)
    })
}

/// The federation's record of Job `job`: its shares by shard and its gang record.
fn record(fed: &Cluster, job: &str) -> Option<(BTreeMap<String, u64>, serde_json::Value)> {
    let out = fed.kubectl(&[
        "get",
        "job",
        job,
        "-n",
        "gangs",
        "-o",
        "jsonpath={.metadata.annotations.tessera\\.io/placement}",
    ]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    let shares = serde_json::from_value(v["shares"].clone()).ok()?;
    Some((shares, v["gang"].clone()))
}

/// Per shard, every count of a Job's bound gang pods the watcher saw, with when.
type Seen = Arc<Mutex<BTreeMap<String, Vec<(std::time::Instant, usize)>>>>;

/// Reads every shard's pods of `job` until stopped.
fn watch(
    shards: Vec<(String, std::path::PathBuf)>,
    job: &'static str,
    stop: Arc<AtomicBool>,
) -> (std::thread::JoinHandle<()>, Seen) {
    let seen: Seen = Arc::default();
    let s = seen.clone();
    let h = std::thread::spawn(move || {
        while !stop.load(Ordering::Acquire) {
            for (name, kubeconfig) in &shards {
                let out = std::process::Command::new("kubectl")
                    .arg("--kubeconfig")
                    .arg(kubeconfig)
                    .args(["get", "pods", "-n", "gangs", "-l"])
                    .arg(format!("job-name={job}"))
                    .args([
                        "-o",
                        "jsonpath={range .items[*]}{.spec.nodeName}{\"\\n\"}{end}",
                    ])
                    .output();
                let Ok(out) = out else { continue };
                if !out.status.success() {
                    continue;
                }
                let bound = String::from_utf8_lossy(&out.stdout)
                    .lines()
                    .filter(|l| !l.trim().is_empty())
                    .count();
                s.lock()
                    .expect("seen")
                    .entry(name.clone())
                    .or_default()
                    .push((std::time::Instant::now(), bound));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    });
    (h, seen)
}

/// The Events of namespace `gangs` at the federation, one `REASON message` per line.
fn gang_events(fed: &Cluster) -> String {
    fed.ok(&[
        "get",
        "events",
        "-n",
        "gangs",
        "-o",
        "jsonpath={range .items[*]}{.reason} {.message}{\"\\n\"}{end}",
    ])
}

#[test]
fn a_gang_divided_over_shards_is_bound_whole_or_not_at_all_under_faults() {
    let grpc = free_addr();
    // The commit is held to 6 s after each attempt began: it widens the window between the
    // phases, for the faults to land in it.
    let mut fed = support::quick_federation(&grpc, &["--gang-commit-delay-ms=6000"]);
    let names = ["a", "b", "c"];
    let shards: Vec<Cluster> = names
        .iter()
        .map(|_| Cluster::start_with("up", &["--shards=0", "--nodes-per-shard=2", "--node-cpu=2"]))
        .collect();
    let mut agents: Vec<Running> = names
        .iter()
        .zip(&shards)
        .map(|(n, s)| join_agent(&fed, s, &grpc, n))
        .collect();
    fed.wait_for_ready_shards(3);
    let shard = |n: &str| &shards[names.iter().position(|x| *x == n).expect("a shard")];
    fed.ok(&["create", "namespace", "gangs"]);

    // An invalid gang is refused at the API, naming the field.
    let bad = fed.file(
        "bad.yaml",
        "apiVersion: tessera.io/v1alpha1\nkind: PodGroup\nmetadata: {name: bad, namespace: gangs}\nspec: {minMember: 2, scope: Everywhere}\n",
    );
    let err = fed.fails(&["apply", "-f", &bad]);
    assert!(err.contains("spec.scope"), "{err}");

    // 1. The federation killed between the phases: every part is reserved, none bound.
    let stop = Arc::new(AtomicBool::new(false));
    let targets: Vec<(String, std::path::PathBuf)> = names
        .iter()
        .zip(&shards)
        .map(|(n, s)| (n.to_string(), s.kubeconfig.clone()))
        .collect();
    let (watcher, seen) = watch(targets.clone(), "first", stop.clone());
    let applied = std::time::Instant::now();
    fed.ok(&[
        "apply",
        "-f",
        &fed.file("first.yaml", &gang_manifest("g1", "first", 6)),
    ]);
    let parts = wait_for(Duration::from_secs(60), || {
        let (shares, gang) = record(&fed, "first")?;
        let all = shares.len() == 2
            && shares
                .iter()
                .all(|(s, n)| reserved(shard(s), "g1") == Some(*n as i64));
        (all && gang["phase"] == "Reserving").then_some(shares)
    })
    .expect("the gang is divided over two shards and every part reserved");
    println!(
        "gang of 6 divided {parts:?}: every part reserved {:.1}s after kubectl apply",
        applied.elapsed().as_secs_f64()
    );
    assert_eq!(parts.values().sum::<u64>(), 6, "{parts:?}");
    for s in parts.keys() {
        assert_eq!(
            gang_pods(shard(s), "first").map(|p| p.0),
            Some(0),
            "{s}: reserved, not bound"
        );
    }
    fed.kill();
    // Its parts hold their reservations for their TTL (10 s), then let them go; nothing is
    // bound while the federation is away.
    let mut released = false;
    let until = std::time::Instant::now() + Duration::from_secs(13);
    while std::time::Instant::now() < until {
        for s in parts.keys() {
            released |= reserved(shard(s), "g1").is_some_and(|r| r == 0);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        released,
        "a reservation outlived its TTL with the federation gone"
    );
    fed.restart();
    let whole = wait_for(Duration::from_secs(60), || {
        let bound: usize = names
            .iter()
            .filter_map(|n| gang_pods(shard(n), "first"))
            .map(|p| p.0)
            .sum();
        (bound == 6).then_some(())
    });
    assert!(whole.is_some(), "the restarted federation commits the gang");
    let (_, gang) = wait_for(Duration::from_secs(20), || {
        record(&fed, "first").filter(|(_, g)| g["phase"] == "Bound")
    })
    .expect("recorded bound");
    // Attempt 1 committed, or — if the shards' leases ran out while the federation was
    // away and their fences stopped the parts before it saw them again — a later attempt
    // placed whole: either way whole, never partial.
    assert!(gang["attempt"].as_i64().is_some_and(|a| a >= 1), "{gang}");
    stop.store(true, Ordering::Release);
    watcher.join().expect("watcher");
    for (s, counts) in seen.lock().expect("seen").iter() {
        let share = parts.get(s).copied().unwrap_or(0) as usize;
        assert!(
            counts.iter().all(|(_, n)| *n == 0 || *n == share),
            "shard {s} had part of its part bound: {counts:?} (share {share})"
        );
    }
    let events = gang_events(&fed);
    assert!(events.contains("GangCommitted"), "{events}");
    fed.ok(&["delete", "job", "first", "-n", "gangs", "--wait=false"]);
    let freed = wait_for(Duration::from_secs(60), || {
        names
            .iter()
            .all(|n| gang_pods(shard(n), "first").is_some_and(|p| p.1 == 0))
            .then_some(())
    });
    assert!(freed.is_some(), "the first gang's pods are gone");

    // 2. A shard cut off mid-commit: its agent frozen half a second before the federation
    // commits (the commit is held to 6 s after the attempt began), so the commit reaches the
    // other part and not it. The federation loses the shard (lease 3 s), aborts the attempt
    // — the part committed alone is removed — and places the gang again, whole, on the live
    // shards.
    let stop = Arc::new(AtomicBool::new(false));
    let (watcher, seen) = watch(targets, "second", stop.clone());
    fed.ok(&[
        "apply",
        "-f",
        &fed.file("second.yaml", &gang_manifest("g2", "second", 6)),
    ]);
    let (parts, since) = wait_for(Duration::from_secs(60), || {
        let (shares, gang) = record(&fed, "second")?;
        let all = shares.len() == 2
            && shares
                .iter()
                .all(|(s, n)| reserved(shard(s), "g2") == Some(*n as i64));
        (all && gang["phase"] == "Reserving").then(|| (shares, gang["since"].as_u64()))
    })
    .expect("every part of the second gang reserved");
    let since = since.expect("the attempt's start");
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as u64;
    let freeze_at = since + 5_500;
    assert!(
        now_ms < freeze_at,
        "reserved too late for the fault: {now_ms} vs {since}"
    );
    std::thread::sleep(Duration::from_millis(freeze_at - now_ms));
    let cut = parts
        .iter()
        .min_by_key(|(_, n)| **n)
        .map(|(s, _)| s.clone())
        .expect("a part");
    let cut_at = names.iter().position(|n| *n == cut).expect("a shard");
    signal(agents[cut_at].0.id(), "-STOP");
    let frozen = std::time::Instant::now();
    let whole = wait_for(Duration::from_secs(90), || {
        let (shares, gang) = record(&fed, "second")?;
        let bound: usize = names
            .iter()
            .filter(|n| **n != cut)
            .filter_map(|n| gang_pods(shard(n), "second"))
            .map(|p| p.0)
            .sum();
        (gang["phase"] == "Bound" && bound == 6 && !shares.contains_key(&cut)).then_some(gang)
    });
    let gang = whole.expect("the gang is placed again whole on the live shards");
    println!(
        "shard {cut} cut off mid-commit: the gang bound whole on the live shards {:.1}s later",
        frozen.elapsed().as_secs_f64()
    );
    let attempt = gang["attempt"].as_i64().unwrap_or(0);
    assert!(attempt >= 2, "the cut attempt was aborted: {gang}");
    let events = gang_events(&fed);
    assert!(
        events.lines().any(|l| l.starts_with("GangAborted")
            && l.contains(&format!(
                "shard {cut} was lost before its part of the gang was bound"
            ))),
        "{events}"
    );
    // Back: its stale part is removed, never bound.
    signal(agents[cut_at].0.id(), "-CONT");
    let cleaned = wait_for(Duration::from_secs(60), || {
        gang_pods(shard(&cut), "second")
            .is_some_and(|p| p.1 == 0)
            .then_some(())
    });
    assert!(
        cleaned.is_some(),
        "the cut-off shard's stale part is removed"
    );
    stop.store(true, Ordering::Release);
    watcher.join().expect("watcher");
    let seen = seen.lock().expect("seen");
    assert!(
        seen.get(&cut)
            .is_some_and(|c| !c.is_empty() && c.iter().all(|(_, n)| *n == 0)),
        "the cut-off shard never bound a member: {:?}",
        seen.get(&cut)
    );
    // The part committed alone was bound, then torn down by the abort: how long it stood,
    // from the watcher's looks (about 100 ms apart per shard).
    let (alone, share) = parts
        .iter()
        .find(|(s, _)| **s != cut)
        .map(|(s, n)| (s.clone(), *n as usize))
        .expect("the other part");
    let looks = &seen[&alone];
    let bound_at = looks.iter().find(|(_, n)| *n == share).map(|(t, _)| *t);
    let bound_at = bound_at.expect("the committed part was bound");
    let gone_at = looks
        .iter()
        .find(|(t, n)| *t > bound_at && *n == 0)
        .map(|(t, _)| *t)
        .expect("and torn down");
    println!(
        "the part committed alone on shard {alone} stood {:.1}s before the abort removed it",
        (gone_at - bound_at).as_secs_f64()
    );
    for (s, counts) in seen.iter() {
        assert!(counts.iter().all(|(_, n)| *n <= 4), "shard {s}: {counts:?}");
    }

    // 3. A shard of the running gang drained: the gang cannot move piecemeal, so it is
    // stopped and placed again whole on the other shards, and the drain completes.
    let (shares, _) = record(&fed, "second").expect("a record");
    let drained = shares.keys().next().expect("a part").clone();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args([
            "shard",
            "drain",
            &drained,
            "--timeout-seconds=120",
            "--kubeconfig",
        ])
        .arg(&fed.kubeconfig)
        .output()
        .expect("tessera shard drain");
    assert!(
        out.status.success(),
        "drain: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let moved = wait_for(Duration::from_secs(90), || {
        let (shares, gang) = record(&fed, "second")?;
        let bound: usize = names
            .iter()
            .filter_map(|n| gang_pods(shard(n), "second"))
            .map(|p| p.0)
            .sum();
        (gang["phase"] == "Bound" && bound == 6 && !shares.contains_key(&drained)).then_some(gang)
    });
    let gang = moved.expect("the gang runs whole without the drained shard");
    assert!(
        gang["attempt"].as_i64().is_some_and(|a| a > attempt),
        "the drained attempt was aborted: {gang}"
    );
    assert_eq!(gang_pods(shard(&drained), "second"), Some((0, 0)));
    assert!(
        gang_events(&fed)
            .lines()
            .any(|l| l.starts_with("GangAborted") && l.contains("tessera.io/drain:NoExecute")),
        "{}",
        gang_events(&fed)
    );
    drop(agents.drain(..));
}
