//! Frameworks through offers, end to end: `tessera up --offers-addr` serves a shard's nodes
//! as offers; the example framework (`tessera framework batch`, a real process) runs tasks
//! through them, two at once with DRF weights 1:3, beside an ordinary Deployment on the
//! same nodes. A watcher reads every pod throughout: no node ever holds more than it has.

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

#[path = "support/frameworks.rs"]
mod frameworks;
mod support;

use frameworks::{call, framework, next, offers_url, pods, task, text};
use support::{Cluster, tenant_token, wait_for};
use tessera_proto::offers::v1 as pb;

/// A tenant `team` owning namespace `team-a`, and a file with its token.
fn tenant(c: &Cluster) -> std::path::PathBuf {
    let t = c.file(
        "tenant.yaml",
        "apiVersion: tessera.io/v1alpha1\nkind: Tenant\nmetadata: {name: team}\nspec: {namespaces: [team-a]}\n",
    );
    c.ok(&["apply", "-f", &t]);
    c.ok(&["create", "namespace", "team-a"]);
    let path = c.dir.path().join("team.token");
    std::fs::write(&path, tenant_token(c, "team")).expect("token file");
    path
}

/// Tasks of the two frameworks of the DRF test.
const LIGHT_TASKS: usize = 30;
const HEAVY_TASKS: usize = 90;

#[derive(Debug, Default)]
struct Seen {
    looks: usize,
    /// The most cpu (milli) any node held at one look.
    most_on_a_node: i64,
    /// light / (light + heavy) running cpu, at each look at saturation: the frameworks ran
    /// at least 16 cpu between them and each still had tasks it had not launched.
    light_share: Vec<f64>,
    /// Task pods seen running on a node.
    tasks_running: usize,
}

#[test]
fn frameworks_share_a_shards_nodes_through_offers_by_drf_beside_its_pods() {
    // 8 nodes of 4 cpu.
    let c = Cluster::start_with(
        "up",
        &[
            "--shards=0",
            "--nodes-per-shard=8",
            "--node-cpu=4",
            "--offers-addr=127.0.0.1:0",
        ],
    );
    let token = tenant(&c);

    // Invalid input is refused with what to fix.
    let bad = c.file("bad.txt", "ok 1 256Mi 1\nworse lots 256Mi 1\n");
    let out = framework(&c, &token, &bad, &["--namespace", "team-a"])
        .output()
        .expect("framework");
    assert!(!out.status.success());
    assert!(
        text(&out).contains("line 2: cpu \"lots\""),
        "{}",
        text(&out)
    );
    frameworks::refuses_strangers(&c, &token, "this shard");

    // An ordinary Deployment takes a quarter of the nodes: 8 pods of 1 cpu.
    c.ok(&[
        "create",
        "deployment",
        "web",
        "-n",
        "team-a",
        "--image=nginx",
        "--replicas=8",
    ]);
    c.ok(&[
        "set",
        "resources",
        "deployment/web",
        "-n",
        "team-a",
        "--requests=cpu=1",
    ]);
    c.ok(&[
        "rollout",
        "status",
        "deployment/web",
        "-n",
        "team-a",
        "--timeout=60s",
    ]);

    // Two frameworks, weights 1 and 3, each with more work than the nodes hold — three
    // times as much for the heavy one, so that both stay saturated until near the end.
    // Tasks run 2, 3 or 4 s. Offers are a node's whole free room, packed first-fit: tasks
    // that all start and end together on a node would free it as one block, again and
    // again, and a framework's share could sit a block away from its DRF share for the
    // whole run (seen with 3 s for all: 0.21 and 0.29 for a 0.25 share on these 8 nodes).
    let tasks = |name: &str, n: usize| {
        let lines: String = (0..n)
            .map(|i| format!("{name}-{i} 1 256Mi {}\n", 2 + i % 3))
            .collect();
        c.file(&format!("{name}.txt"), &lines)
    };
    let (light_file, heavy_file) = (tasks("light", LIGHT_TASKS), tasks("heavy", HEAVY_TASKS));
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = {
        let stop = stop.clone();
        let kubeconfig = c.kubeconfig.clone();
        std::thread::spawn(move || {
            let mut seen = Seen::default();
            // Task pods seen so far, by framework: once one has launched all of its tasks
            // its share falls as they finish — no longer saturation.
            let mut launched: [std::collections::HashSet<String>; 2] = Default::default();
            while !stop.load(Ordering::Acquire) {
                let all = pods(&kubeconfig, None);
                let mut on_node: BTreeMap<&str, i64> = BTreeMap::new();
                let (mut light, mut heavy) = (0i64, 0i64);
                for frameworks::TaskPod {
                    framework: fw,
                    node,
                    phase,
                    cpu,
                    name,
                } in &all
                {
                    if fw.starts_with("light-") {
                        launched[0].insert(name.clone());
                    } else if fw.starts_with("heavy-") {
                        launched[1].insert(name.clone());
                    }
                    if node.is_empty() || phase == "Succeeded" || phase == "Failed" {
                        continue;
                    }
                    *on_node.entry(node).or_default() += cpu;
                    if phase == "Running" {
                        if fw.starts_with("light-") {
                            light += cpu;
                            seen.tasks_running += 1;
                        } else if fw.starts_with("heavy-") {
                            heavy += cpu;
                            seen.tasks_running += 1;
                        }
                    }
                }
                seen.most_on_a_node = seen
                    .most_on_a_node
                    .max(on_node.values().copied().max().unwrap_or(0));
                // The frameworks have 24 cpu between them, 20 once the Deployment grew; a
                // look with 16 or more running is at saturation.
                let pending = launched[0].len() < LIGHT_TASKS && launched[1].len() < HEAVY_TASKS;
                if light + heavy >= 16_000 && pending {
                    seen.light_share.push(light as f64 / (light + heavy) as f64);
                }
                seen.looks += 1;
                std::thread::sleep(Duration::from_millis(200));
            }
            seen
        })
    };
    let light = framework(
        &c,
        &token,
        &light_file,
        &["--namespace", "team-a", "--name", "light", "--weight", "1"],
    )
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped())
    .spawn()
    .expect("light");
    // The Deployment grows while they run: the scheduler is the one allocator of node
    // room, so its pods and the tasks never both get the same room.
    let grow = {
        let kubeconfig = c.kubeconfig.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_secs(4));
            Command::new("kubectl")
                .arg("--kubeconfig")
                .arg(&kubeconfig)
                .args(["scale", "deployment/web", "-n", "team-a", "--replicas=12"])
                .output()
                .expect("scale")
        })
    };
    let heavy = framework(
        &c,
        &token,
        &heavy_file,
        &["--namespace", "team-a", "--name", "heavy", "--weight", "3"],
    )
    .output()
    .expect("heavy");
    let light = light.wait_with_output().expect("light ends");
    assert!(grow.join().expect("scaled").status.success());
    stop.store(true, Ordering::Release);
    let seen = watcher.join().expect("watcher");
    assert!(heavy.status.success(), "{}", text(&heavy));
    assert!(light.status.success(), "{}", text(&light));
    assert!(
        text(&heavy).contains("90 finished, 0 failed"),
        "{}",
        text(&heavy)
    );
    assert!(
        text(&light).contains("30 finished, 0 failed"),
        "{}",
        text(&light)
    );
    // Offers never let a node hold more than it has, with the Deployment's pods beside.
    assert!(seen.looks >= 10, "{seen:?}");
    assert!(
        seen.tasks_running > 0,
        "task pods were seen running: {seen:?}"
    );
    assert!(seen.most_on_a_node <= 4_000, "{seen:?}");
    // DRF with weights 1:3: the light framework holds a quarter at saturation.
    assert!(seen.light_share.len() >= 3, "{seen:?}");
    let mean = seen.light_share.iter().sum::<f64>() / seen.light_share.len() as f64;
    eprintln!(
        "DRF 1:3 at saturation: light share {mean:.3} over {} looks",
        seen.light_share.len()
    );
    assert!((mean - 0.25).abs() <= 0.05, "light share {mean}: {seen:?}");
    // Finished tasks' pods are removed once reported; the Deployment's stay.
    let left = pods(&c.kubeconfig, None);
    assert_eq!(
        left.iter().filter(|p| !p.framework.is_empty()).count(),
        0,
        "{left:?}"
    );
    let web = wait_for(Duration::from_secs(60), || {
        (pods(&c.kubeconfig, None)
            .iter()
            .filter(|p| p.phase == "Running")
            .count()
            == 12)
            .then_some(())
    });
    assert!(
        web.is_some(),
        "the Deployment's 12 pods run: {:?}",
        pods(&c.kubeconfig, None)
    );
}

/// A raw framework on the wire: what the batch runner does not do (leave an offer
/// unanswered, over-ask, disconnect with tasks running).
#[test]
fn offers_are_rescinded_over_asks_refused_and_a_lost_framework_s_tasks_killed() {
    let c = Cluster::start_with(
        "up",
        &[
            "--shards=0",
            "--nodes-per-shard=2",
            "--node-cpu=4",
            "--offers-addr=127.0.0.1:0",
        ],
    );
    let token = std::fs::read_to_string(tenant(&c)).expect("token");
    let ca = std::fs::read_to_string(c.dir.path().join("pki/ca.crt")).expect("ca");
    let url = offers_url(&c);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let (tx, mut events) = frameworks::session(
            &url,
            &ca,
            &token,
            pb::FrameworkInfo {
                name: "raw".into(),
                namespace: "team-a".into(),
                weight: 1.0,
                failover_timeout_seconds: 3,
                ..Default::default()
            },
        )
        .await;
        let pb::event::Event::Subscribed(s) = next(&mut events).await else {
            panic!("subscribed first")
        };
        assert!(s.framework_id.starts_with("raw-"));
        let pb::event::Event::Offers(first) = next(&mut events).await else {
            panic!("offers next")
        };
        assert_eq!(first.offers.len(), 2, "both nodes: {first:?}");
        // Left unanswered, they are rescinded after 5 s.
        let mut rescinded = 0;
        let mut fresh = None;
        while rescinded < 2 || fresh.is_none() {
            match next(&mut events).await {
                pb::event::Event::Rescind(r) => {
                    assert!(r.reason.contains("not answered"), "{r:?}");
                    rescinded += 1;
                }
                pb::event::Event::Offers(o) if rescinded == 2 => fresh = Some(o),
                other => panic!("unexpected {other:?}"),
            }
        }
        let offer = fresh.expect("offered again").offers.remove(0);
        let free = offer.resources.expect("resources");
        // Asking for more than the offer holds launches nothing and says why.
        tx.send(call(pb::call::Call::Accept(pb::call::Accept {
            offer_id: offer.id.clone(),
            tasks: vec![task("greedy", free.cpu_milli + 1, "1")],
        })))
        .expect("send");
        loop {
            match next(&mut events).await {
                pb::event::Event::Update(u) => {
                    assert_eq!(u.task, "greedy");
                    assert_eq!(u.state, pb::TaskState::TaskFailed as i32);
                    assert!(u.message.contains("ask for"), "{u:?}");
                }
                pb::event::Event::Error(e) => {
                    assert!(e.message.contains("ask for"), "{e:?}");
                    break;
                }
                pb::event::Event::Offers(_) | pb::event::Event::Rescind(_) => {}
                other => panic!("unexpected {other:?}"),
            }
        }
        // A long task on the next offer; then the framework goes away.
        let offer = loop {
            if let pb::event::Event::Offers(mut o) = next(&mut events).await {
                break o.offers.remove(0);
            }
        };
        tx.send(call(pb::call::Call::Accept(pb::call::Accept {
            offer_id: offer.id.clone(),
            tasks: vec![task("long", 1000, "600")],
        })))
        .expect("send");
        loop {
            if let pb::event::Event::Update(u) = next(&mut events).await
                && u.state == pb::TaskState::TaskRunning as i32
            {
                assert_eq!(u.node, offer.node, "on the offered node");
                break;
            }
        }
        s.framework_id
    });
    drop(rt);
    // Disconnected (the runtime and its stream are gone): its task runs on until the
    // failover timeout (3 s), then is killed.
    let task_pods = || {
        c.ok(&[
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
        "the task outlives the disconnection at first"
    );
    let killed = wait_for(Duration::from_secs(60), || {
        task_pods().trim().is_empty().then_some(())
    });
    assert!(
        killed.is_some(),
        "the task was not killed after the failover timeout"
    );
}

#[test]
fn the_offers_benchmark_reports_every_figure() {
    let r = frameworks::bench_offers(0);
    // 32 cpu: a quarter and three quarters of it, three times over.
    assert_eq!(r["tasks"], 8 * 3 + 24 * 3);
}
