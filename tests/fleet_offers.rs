//! Offers across the fleet: frameworks subscribe once, at the federation's offers endpoint
//! (`tessera up --shards 2 --offers-addr`), and are offered the nodes of both shards. The
//! shares are Dominant Resource Fairness over the whole fleet — a framework that can use
//! only one shard gets that shard, where DRF per shard would split it — and accepts, kills,
//! re-subscriptions and failover timeouts reach the shard that holds the task.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

#[path = "support/frameworks.rs"]
mod frameworks;
mod support;

use frameworks::{call, framework, next, offers_url, pods, task, text};
use support::{Cluster, tenant_token, wait_for};
use tessera_proto::offers::v1 as pb;

const SHARDS: [&str; 2] = ["shard-0", "shard-1"];

/// A federation of two shards of `nodes` nodes of 4 cpu, serving offers.
fn fleet(nodes: usize) -> Cluster {
    Cluster::start_with(
        "up",
        &[
            "--shards=2",
            &format!("--nodes-per-shard={nodes}"),
            "--node-cpu=4",
            "--offers-addr=127.0.0.1:0",
        ],
    )
}

/// A tenant `team` owning namespace `team-a` at the federation, known to both shards; a
/// file with its federation token.
fn tenant(c: &Cluster) -> std::path::PathBuf {
    let t = c.file(
        "tenant.yaml",
        "apiVersion: tessera.io/v1alpha1\nkind: Tenant\nmetadata: {name: team}\nspec: {namespaces: [team-a]}\n",
    );
    c.ok(&["apply", "-f", &t]);
    c.ok(&["create", "namespace", "team-a"]);
    for s in SHARDS {
        let there = wait_for(Duration::from_secs(30), || {
            c.kubectl(&["--context", s, "get", "tenant", "team"])
                .status
                .success()
                .then_some(())
        });
        assert!(there.is_some(), "Tenant team not in {s}");
    }
    let path = c.dir.path().join("team.token");
    std::fs::write(&path, tenant_token(c, "team")).expect("token file");
    path
}

/// Tasks of each framework of the DRF test: more than the fleet holds at once.
const TASKS: usize = 96;

/// Seconds a task runs, on average: 3, 4 or 5 (tasks that all end together would free
/// whole shards at once, in waves no real workload makes).
const TASK_SECONDS: u64 = 4;

#[derive(Debug, Default)]
struct Seen {
    looks: usize,
    /// The most cpu (milli) any node held at one look.
    most_on_a_node: i64,
    /// pinned / (pinned + free) running cpu, at each look at saturation, with the seconds
    /// since a task was first seen running.
    pinned_share: Vec<(f64, f64)>,
    /// Shards a task of the free framework was seen running in.
    free_in: HashSet<String>,
    /// Shards a task of the pinned framework was seen running in.
    pinned_in: HashSet<String>,
}

#[test]
fn frameworks_subscribe_at_the_federation_and_share_the_whole_fleet_by_drf() {
    // 2 shards × 4 nodes × 4 cpu: 32 cpu.
    let c = fleet(4);
    let token = tenant(&c);

    // Invalid input is refused with what to fix, at the federation.
    frameworks::refuses_strangers(&c, &token, "the federation");
    let one = c.file("one.txt", "t1 500m 128Mi 1\n");
    let out = framework(
        &c,
        &token,
        &one,
        &["--namespace", "team-a", "--node-selector", "no equals"],
    )
    .output()
    .expect("framework");
    assert!(!out.status.success());
    assert!(text(&out).contains("--node-selector"), "{}", text(&out));

    // Two frameworks of equal weight. "pinned" takes only shard-0's nodes (its offers
    // carry the node's shard as a label); "free" takes any. By DRF over the fleet each
    // holds half of it: pinned all of shard-0, free all of shard-1. By DRF in each shard
    // alone, pinned would hold half of shard-0 — a quarter of the fleet.
    let tasks = |name: &str| {
        let lines: String = (0..TASKS)
            .map(|i| format!("{name}-{i} 1 256Mi {}\n", TASK_SECONDS - 1 + i as u64 % 3))
            .collect();
        c.file(&format!("{name}.txt"), &lines)
    };
    let (pinned_file, free_file) = (tasks("pinned"), tasks("free"));
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = {
        let stop = stop.clone();
        let kubeconfig = c.kubeconfig.clone();
        std::thread::spawn(move || {
            let mut seen = Seen::default();
            let mut launched: [HashSet<String>; 2] = Default::default();
            let mut first_running: Option<std::time::Instant> = None;
            while !stop.load(Ordering::Acquire) {
                let (mut pinned, mut free) = (0i64, 0i64);
                for shard in SHARDS {
                    let mut on_node: BTreeMap<String, i64> = BTreeMap::new();
                    for frameworks::TaskPod {
                        framework: fw,
                        node,
                        phase,
                        cpu,
                        name,
                    } in pods(&kubeconfig, Some(shard))
                    {
                        let which = if fw.starts_with("pinned-") {
                            0
                        } else if fw.starts_with("free-") {
                            1
                        } else {
                            continue;
                        };
                        launched[which].insert(name);
                        if node.is_empty() || phase == "Succeeded" || phase == "Failed" {
                            continue;
                        }
                        *on_node.entry(node).or_default() += cpu;
                        if phase == "Running" {
                            if which == 0 {
                                pinned += cpu;
                                seen.pinned_in.insert(shard.to_owned());
                            } else {
                                free += cpu;
                                seen.free_in.insert(shard.to_owned());
                            }
                        }
                    }
                    seen.most_on_a_node = seen
                        .most_on_a_node
                        .max(on_node.values().copied().max().unwrap_or(0));
                }
                // At saturation: most of the fleet's 32 cpu running, and each framework
                // with tasks it has not launched yet.
                let pending = launched[0].len() < TASKS && launched[1].len() < TASKS;
                if pinned + free > 0 && first_running.is_none() {
                    first_running = Some(std::time::Instant::now());
                }
                if pinned + free >= 24_000 && pending {
                    let since = first_running.map_or(0.0, |t| t.elapsed().as_secs_f64());
                    seen.pinned_share
                        .push((since, pinned as f64 / (pinned + free) as f64));
                }
                seen.looks += 1;
                std::thread::sleep(Duration::from_millis(200));
            }
            seen
        })
    };
    let pinned = framework(
        &c,
        &token,
        &pinned_file,
        &[
            "--namespace",
            "team-a",
            "--name",
            "pinned",
            "--node-selector",
            "tessera.io/shard=shard-0",
        ],
    )
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped())
    .spawn()
    .expect("pinned");
    let free = framework(
        &c,
        &token,
        &free_file,
        &["--namespace", "team-a", "--name", "free"],
    )
    .output()
    .expect("free");
    let pinned = pinned.wait_with_output().expect("pinned ends");
    stop.store(true, Ordering::Release);
    let seen = watcher.join().expect("watcher");
    assert!(free.status.success(), "{}", text(&free));
    assert!(pinned.status.success(), "{}", text(&pinned));
    assert!(
        text(&free).contains(&format!("{TASKS} finished, 0 failed")),
        "{}",
        text(&free)
    );
    assert!(
        text(&pinned).contains(&format!("{TASKS} finished, 0 failed")),
        "{}",
        text(&pinned)
    );
    // Offers from both shards reached the frameworks through the one endpoint; the
    // pinned one ran only where it asked to.
    assert_eq!(
        seen.pinned_in,
        HashSet::from(["shard-0".to_owned()]),
        "{seen:?}"
    );
    assert!(seen.free_in.contains("shard-1"), "{seen:?}");
    assert!(seen.most_on_a_node <= 4_000, "{seen:?}");
    // DRF over the fleet: the pinned framework holds half of it at saturation (a shard
    // ranking by its own share alone would leave it a quarter). Both start with nothing
    // anywhere, so shard-0's first nodes are split between them, as one allocator for the
    // whole fleet would split them too (it cannot know yet that "free" will get shard-1);
    // DRF does not preempt, so the shares settle as those first tasks end. Counted after
    // two task lifetimes.
    let settled: Vec<f64> = seen
        .pinned_share
        .iter()
        .filter(|(since, _)| *since >= 2.0 * TASK_SECONDS as f64)
        .map(|(_, share)| *share)
        .collect();
    assert!(settled.len() >= 5, "{seen:?}");
    let mean = settled.iter().sum::<f64>() / settled.len() as f64;
    eprintln!(
        "fleet DRF 1:1, one framework pinned to one of two shards: its share {mean:.3} over {} settled looks (all looks: {:?})",
        settled.len(),
        seen.pinned_share
    );
    // DRF does not preempt, and whole nodes' free room is offered to one framework at a
    // time, so the share moves in steps around 0.5 as tasks end; and the churn of the free
    // framework's tasks in shard-1 (a finished task's room is offered again at that shard's
    // next round, and shard-0 hears of it a report later) shows it a little poorer than it
    // is. Measured 0.43–0.50; DRF per shard would give 0.25. (DRF's 1:3 precision across
    // shards is the benchmark's, below.)
    assert!(
        (0.40..=0.60).contains(&mean),
        "pinned share {mean}: {seen:?}"
    );
    // Finished tasks' pods are removed once reported, in both shards.
    for s in SHARDS {
        let left = pods(&c.kubeconfig, Some(s));
        assert!(left.iter().all(|p| p.framework.is_empty()), "{s}: {left:?}");
    }
    // The federation counts what it relayed.
    let made = support::sample(
        &c.metrics_addr,
        "tessera_offers_made_total{subscribed=\"federation\"}",
    );
    assert!(made >= 16.0, "offers relayed: {made}");
}

/// A raw framework on the wire at the federation: offers of both shards under one
/// subscription, a duplicate task refused across shards, a kill routed to the task's
/// shard, a re-subscription that keeps its tasks, and a failover timeout that ends them.
#[test]
fn the_federation_routes_a_frameworks_calls_to_the_shard_of_each_offer_and_task() {
    let c = fleet(1);
    let token = std::fs::read_to_string(tenant(&c)).expect("token");
    let ca = std::fs::read_to_string(c.dir.path().join("pki/ca.crt")).expect("ca");
    let url = offers_url(&c);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let info = |id: &str| pb::FrameworkInfo {
        name: "raw".into(),
        namespace: "team-a".into(),
        weight: 1.0,
        failover_timeout_seconds: 4,
        id: id.to_owned(),
        ..Default::default()
    };
    let id = rt.block_on(async {
        let (tx, mut events) = frameworks::session(&url, &ca, &token, info("")).await;
        let pb::event::Event::Subscribed(s) = next(&mut events).await else {
            panic!("subscribed first")
        };
        assert!(s.framework_id.starts_with("raw-"));
        // One offer from each shard's one node, each id naming its shard, each node
        // labelled with it.
        let mut offers: BTreeMap<String, pb::Offer> = BTreeMap::new();
        while offers.len() < 2 {
            if let pb::event::Event::Offers(o) = next(&mut events).await {
                for o in o.offers {
                    let shard = o.node_labels["tessera.io/shard"].clone();
                    assert!(o.id.starts_with(&format!("{shard}/")), "{o:?}");
                    assert!(o.node.starts_with(&shard), "{o:?}");
                    offers.insert(shard, o);
                }
            }
        }
        // A task in shard-1.
        tx.send(call(pb::call::Call::Accept(pb::call::Accept {
            offer_id: offers["shard-1"].id.clone(),
            tasks: vec![task("long", 1000, "600")],
        })))
        .expect("send");
        loop {
            if let pb::event::Event::Update(u) = next(&mut events).await
                && u.task == "long"
                && u.state == pb::TaskState::TaskRunning as i32
            {
                assert_eq!(u.node, offers["shard-1"].node, "on the offered node");
                break;
            }
        }
        // The same task name in shard-0 is refused: task names are the framework's
        // across the fleet.
        tx.send(call(pb::call::Call::Accept(pb::call::Accept {
            offer_id: offers["shard-0"].id.clone(),
            tasks: vec![task("long", 1000, "1"), task("short", 1000, "600")],
        })))
        .expect("send");
        loop {
            match next(&mut events).await {
                pb::event::Event::Error(e) => {
                    assert!(
                        e.message
                            .contains("\"long\" exists already (in shard shard-1)"),
                        "{e:?}"
                    );
                    break;
                }
                pb::event::Event::Update(u) => {
                    assert_eq!(u.state, pb::TaskState::TaskFailed as i32, "{u:?}");
                }
                _ => {}
            }
        }
        // A fresh offer of shard-0 (its room came back), taken by a second long task.
        let offer = loop {
            if let pb::event::Event::Offers(mut o) = next(&mut events).await
                && let Some(i) = o
                    .offers
                    .iter()
                    .position(|o| o.node_labels["tessera.io/shard"] == "shard-0")
            {
                break o.offers.remove(i);
            }
        };
        tx.send(call(pb::call::Call::Accept(pb::call::Accept {
            offer_id: offer.id.clone(),
            tasks: vec![task("other", 1000, "600")],
        })))
        .expect("send");
        loop {
            if let pb::event::Event::Update(u) = next(&mut events).await
                && u.task == "other"
                && u.state == pb::TaskState::TaskRunning as i32
            {
                break;
            }
        }
        // Killed by name: the federation sends the kill to shard-0, which holds it.
        tx.send(call(pb::call::Call::Kill(pb::call::Kill {
            task: "other".into(),
        })))
        .expect("send");
        loop {
            if let pb::event::Event::Update(u) = next(&mut events).await
                && u.task == "other"
                && u.state == pb::TaskState::TaskKilled as i32
            {
                break;
            }
        }
        tx.send(call(pb::call::Call::Kill(pb::call::Kill {
            task: "nothing".into(),
        })))
        .expect("send");
        loop {
            if let pb::event::Event::Error(e) = next(&mut events).await {
                assert!(e.message.contains("no task \"nothing\""), "{e:?}");
                break;
            }
        }
        s.framework_id
    });
    drop(rt);
    let task_pods = || {
        c.ok(&[
            "--context",
            "shard-1",
            "get",
            "pods",
            "-n",
            "team-a",
            "-l",
            "tessera.io/task=long",
            "-o",
            "name",
        ])
    };
    assert!(
        !task_pods().trim().is_empty(),
        "the task outlives the disconnection"
    );
    // Back within its failover timeout (4 s), by its id: its task is still its own, and
    // the shard says where it stands.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let (_tx, mut events) = frameworks::session(&url, &ca, &token, info(&id)).await;
        let pb::event::Event::Subscribed(s) = next(&mut events).await else {
            panic!("subscribed first")
        };
        assert_eq!(s.framework_id, id);
        loop {
            if let pb::event::Event::Update(u) = next(&mut events).await
                && u.task == "long"
            {
                assert_eq!(u.state, pb::TaskState::TaskRunning as i32, "{u:?}");
                assert!(u.message.contains("reconciled"), "{u:?}");
                break;
            }
        }
    });
    drop(rt);
    // Gone for good: killed in its shard once the failover timeout passes.
    let killed = wait_for(Duration::from_secs(60), || {
        task_pods().trim().is_empty().then_some(())
    });
    assert!(
        killed.is_some(),
        "the task was not killed after the failover timeout"
    );
}

#[test]
fn the_offers_benchmark_across_shards_keeps_drf_over_the_fleet() {
    // The bound (DRF between weights 1:3 within 5 % at saturation, checked by
    // `bench_offers`), here across two shards' nodes ranked by one ledger.
    let r = frameworks::bench_offers(2);
    // Two shards of 8 nodes of 4 cpu: a quarter and three quarters of 64 cpu, three times.
    assert_eq!(r["shards"], 2);
    assert_eq!(r["tasks"], 16 * 3 + 48 * 3);
}
