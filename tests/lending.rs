//! Elastic shards end to end: a federation and two shards as separate processes. Shard a has
//! three idle 2-cpu nodes and lends up to two; shard b has one and borrows. A Deployment
//! pinned to b wants more than b has: the federation lends one of a's idle nodes, whose
//! agent registers it with b through a credential good for that node and loan only, and the
//! pod held back runs there. The credential is then used as an attacker holding it would;
//! and when a's own work needs the node, b drains it, the node goes home, a's pod runs on it,
//! and the credential is dead. The federation is killed (kill -9) mid-loan on the way: the
//! loan lives in the shards and goes on. A watch of both shards' pods checks throughout that no
//! node — the lent one counted in both shards at once — ever holds more than its allocatable,
//! and that no pod is bound twice.

use std::process::Command;
use std::time::Duration;

#[allow(dead_code)]
#[path = "support/invariants.rs"]
mod invariants;
mod support;

use support::{Cluster, free_addr, join_agent, process_node, processes, sample, wait_for};

/// Pods of namespace `ns` in shard `c`: (name, node, phase) per pod.
fn pods(c: &Cluster, ns: &str) -> Vec<(String, String, String)> {
    c.ok(&[
        "get",
        "pods",
        "-n",
        ns,
        "-o",
        "jsonpath={range .items[*]}{.metadata.name} {.spec.nodeName} {.status.phase}{\"\\n\"}{end}",
    ])
    .lines()
    .filter_map(|l| {
        let mut f = l.split(' ');
        Some((
            f.next()?.to_owned(),
            f.next()?.to_owned(),
            f.next()?.to_owned(),
        ))
    })
    .collect()
}

/// A Tenant owning `ns`, a Placement pinning its Deployment `name` to `shard`, and the
/// Deployment: `replicas` pods of one cpu each that run until deleted.
fn pinned(ns: &str, name: &str, shard: &str, replicas: u32) -> String {
    format!(
        "apiVersion: tessera.io/v1alpha1\nkind: Tenant\nmetadata: {{name: {ns}}}\nspec: {{namespaces: [{ns}]}}\n---\napiVersion: v1\nkind: Namespace\nmetadata: {{name: {ns}}}\n---\napiVersion: tessera.io/v1alpha1\nkind: Placement\nmetadata: {{name: {name}, namespace: {ns}}}\nspec:\n  resourceSelectors: [{{kind: Deployment, name: {name}}}]\n  shardAffinity: {{shardNames: [{shard}]}}\n---\napiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: {name}, namespace: {ns}}}\nspec:\n  replicas: {replicas}\n  selector: {{matchLabels: {{app: {name}}}}}\n  template:\n    metadata: {{labels: {{app: {name}}}}}\n    spec:\n      terminationGracePeriodSeconds: 0\n      containers: [{{name: c, image: nginx, resources: {{requests: {{cpu: \"1\"}}}}}}]\n"
    )
}

/// kubectl against shard `c`'s API with bearer token `token` (and nothing else of the admin's).
fn as_token(c: &Cluster, token: &str, args: &[&str]) -> std::process::Output {
    let server = c.server();
    Command::new("kubectl")
        .arg("--kubeconfig=/dev/null")
        .arg(format!("--server={server}"))
        .arg(format!("--token={token}"))
        .arg("--certificate-authority")
        .arg(c.dir.path().join("pki/ca.crt"))
        .arg("--cache-dir")
        .arg(c.dir.path().join("attacker-cache"))
        .args(args)
        .output()
        .expect("kubectl")
}

fn refused(c: &Cluster, token: &str, args: &[&str]) -> String {
    let out = as_token(c, token, args);
    assert!(
        !out.status.success(),
        "{args:?} should be refused to the lent node's credential: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Shard `prefix` of the test fleet: `nodes` simulated 2-cpu nodes named `{prefix}-{i}`.
fn shard(prefix: &str, nodes: usize) -> Cluster {
    Cluster::start_with(
        "up",
        &[
            "--shards=0",
            &format!("--nodes-per-shard={nodes}"),
            "--node-cpu=2",
            &format!("--node-prefix={prefix}"),
        ],
    )
}

/// Sets Shard `name`'s `spec.lending` at the federation.
fn lending(fed: &Cluster, name: &str, policy: &str) {
    fed.ok(&[
        "patch",
        "shard",
        name,
        "--type=merge",
        "-p",
        &format!(r#"{{"spec":{{"lending":{policy}}}}}"#),
    ]);
}

#[test]
fn an_idle_node_is_lent_to_a_full_shard_and_goes_home_when_its_lender_needs_it() {
    let grpc = free_addr();
    let mut fed = support::quick_federation(&grpc, &[]);
    let a = shard("a", 3);
    let b = shard("b", 1);
    let watch = invariants::Invariants::watch_all(vec![a.kubeconfig.clone(), b.kubeconfig.clone()]);
    let _agents = [
        join_agent(&fed, &a, &grpc, "a"),
        join_agent(&fed, &b, &grpc, "b"),
    ];
    fed.wait_for_ready_shards(2);
    // Invalid policies are refused, naming the field.
    let err = fed.fails(&[
        "patch",
        "shard",
        "a",
        "--type=merge",
        "-p",
        r#"{"spec":{"lending":{"maxLend":-1}}}"#,
    ]);
    assert!(err.contains("spec.lending.maxLend"), "{err}");
    lending(&fed, "a", r#"{"maxLend":2,"minNodes":1}"#);
    lending(&fed, "b", r#"{"maxBorrow":2}"#);

    // Three one-cpu pods pinned to b, which has room for two.
    let started = std::time::Instant::now();
    fed.ok(&[
        "apply",
        "-f",
        &fed.file("hot.yaml", &pinned("hot", "web", "b", 3)),
    ]);
    let lent = wait_for(Duration::from_secs(90), || {
        let ps = pods(&b, "hot");
        let running = ps.iter().filter(|(_, _, p)| p == "Running").count();
        let on_a: Vec<String> = ps
            .iter()
            .filter(|(_, n, p)| n.starts_with("a-") && p == "Running")
            .map(|(_, n, _)| n.clone())
            .collect();
        (running == 3 && on_a.len() == 1).then(|| on_a[0].clone())
    });
    let Some(node) = lent else {
        panic!(
            "b never ran all three: b {:?}\nshards:\n{}\nevents:\n{}",
            pods(&b, "hot"),
            fed.ok(&["get", "shards", "-o", "yaml"]),
            fed.ok(&["get", "events", "-A"])
        );
    };
    eprintln!(
        "node {node} of a lent to b: the third pod ran {:.1}s after kubectl apply",
        started.elapsed().as_secs_f64()
    );
    // In b: labelled with its lender, tainted so only pods that tolerate borrowed nodes go.
    let in_b = b.ok(&[
        "get",
        "node",
        &node,
        "-o",
        "jsonpath={.metadata.labels.tessera\\.io/lent-from} {.spec.taints[*].key}",
    ]);
    assert!(
        in_b.starts_with("a ") && in_b.contains("tessera.io/borrowed"),
        "{in_b}"
    );
    // At home: kept off limits while away.
    let at_home = a.ok(&[
        "get",
        "node",
        &node,
        "-o",
        "jsonpath={.metadata.annotations.tessera\\.io/lent-to} {.spec.taints[*].key}",
    ]);
    assert!(
        at_home.starts_with("b ") && at_home.contains("tessera.io/lent"),
        "{at_home}"
    );
    // The Shard's status says so (written once a second).
    let counted = wait_for(Duration::from_secs(10), || {
        let n = fed.ok(&[
            "get",
            "shard",
            "b",
            "-o",
            "jsonpath={.status.borrowedNodes}",
        ]);
        (n == "1").then_some(())
    });
    assert!(
        counted.is_some(),
        "{}",
        fed.ok(&["get", "shard", "b", "-o", "yaml"])
    );

    // The node's credential, as an attacker who stole it from a's kube-system would use it.
    let token = a.ok(&[
        "get",
        "secret",
        "-n",
        "kube-system",
        &format!("tessera-loan.{node}"),
        "-o",
        "jsonpath={.data.token}",
    ]);
    let token = String::from_utf8(
        Command::new("base64")
            .arg("-d")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .and_then(|mut c| {
                use std::io::Write;
                c.stdin.take().expect("stdin").write_all(token.as_bytes())?;
                c.wait_with_output()
            })
            .expect("base64")
            .stdout,
    )
    .expect("text");
    assert!(token.starts_with(&format!("loan.{node}.")), "{token}");
    // It reads what a node reads...
    let out = as_token(&b, &token, &["get", "pods", "-n", "hot"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // ...and writes nothing else: another node, its own taints, secrets, the loan ledger,
    // a pod that is not bound to it.
    let b_pod = pods(&b, "hot")
        .into_iter()
        .find(|(_, n, _)| n == "b-0")
        .expect("a pod on b-0")
        .0;
    for (args, why) in [
        (vec!["delete", "node", "b-0"], "only its own Node"),
        (
            vec!["taint", "node", &node, "tessera.io/borrowed-"],
            "only its own Node",
        ),
        (vec!["get", "secrets", "-A"], "not list or watch secrets"),
        (
            vec!["create", "configmap", "x", "-n", "kube-system"],
            "only its own Node",
        ),
        (
            vec![
                "patch",
                "configmap",
                "tessera-loans",
                "-n",
                "kube-system",
                "-p",
                r#"{"data":{"b-0":"mine"}}"#,
            ],
            "only its own Node",
        ),
        (vec!["delete", "pod", &b_pod, "-n", "hot"], "bound to it"),
    ] {
        let err = refused(&b, &token, &args);
        assert!(
            err.to_lowercase().contains("forbidden") && err.contains(why),
            "{args:?}: {err}"
        );
    }
    assert!(b.ok(&["get", "nodes"]).contains("b-0"));
    assert!(
        b.ok(&["get", "pod", &b_pod, "-n", "hot"])
            .contains("Running")
    );
    let taints = b.ok(&["get", "node", &node, "-o", "jsonpath={.spec.taints[*].key}"]);
    assert!(taints.contains("tessera.io/borrowed"), "{taints}");

    // The federation dies mid-loan and comes back: the loan is in the shards (a's node
    // labels, b's ledger), and the restarted federation takes it back as it is.
    fed.kill_and_restart();
    fed.wait_for_ready_shards(2);
    std::thread::sleep(Duration::from_secs(3));
    let still = pods(&b, "hot");
    assert!(
        still.iter().filter(|(_, _, p)| p == "Running").count() == 3
            && still.iter().any(|(_, n, _)| n == &node),
        "the loan did not survive the federation's restart: {still:?}\nb:\n{}\nfederation:\n{}",
        b.ok(&["get", "events", "-A"]),
        fed.ok(&["get", "events", "-A"])
    );
    assert!(b.ok(&["get", "nodes"]).contains(&node));

    // a's own work now wants five cpu of its six: the lender comes first.
    let asked = std::time::Instant::now();
    fed.ok(&[
        "apply",
        "-f",
        &fed.file("own.yaml", &pinned("own", "batch", "a", 5)),
    ]);
    let home = wait_for(Duration::from_secs(90), || {
        let ps = pods(&a, "own");
        (ps.len() == 5 && ps.iter().all(|(_, _, p)| p == "Running")).then_some(ps)
    });
    let Some(home) = home else {
        panic!(
            "a's pods never all ran: {:?}\nevents:\n{}",
            pods(&a, "own"),
            fed.ok(&["get", "events", "-A"])
        );
    };
    eprintln!(
        "node {node} back home and a's fifth pod running {:.1}s after a asked for it",
        asked.elapsed().as_secs_f64()
    );
    assert!(
        home.iter().any(|(_, n, _)| n == &node),
        "a's pods use the node that came back: {home:?}"
    );
    // Gone from b, its pod there evicted (pending again: a has no idle node now), and the
    // credential dead.
    assert!(!b.ok(&["get", "nodes"]).contains(&node));
    let hot = pods(&b, "hot");
    assert!(hot.iter().all(|(_, n, _)| n != &node), "{hot:?}");
    let err = refused(&b, &token, &["get", "pods", "-n", "hot"]);
    assert!(err.contains("no longer"), "{err}");
    let at_home = a.ok(&["get", "node", &node, "-o", "jsonpath={.spec.taints[*].key}"]);
    assert!(!at_home.contains("tessera.io/lent"), "{at_home}");
    // Seen at the federation: events on the Shards, and the counters (the loan is over once
    // a's next summary no longer reports the node lent).
    let events = || {
        fed.ok(&[
            "get",
            "events",
            "-A",
            "-o",
            "jsonpath={range .items[*]}{.reason} {.message}{\"\\n\"}{end}",
        ])
    };
    let over = wait_for(Duration::from_secs(20), || {
        let e = events();
        e.contains("NodeReturned").then_some(e)
    });
    let Some(events) = over else {
        panic!("the loan was never over:\n{}", events());
    };
    for reason in ["NodeLent", "NodeBorrowed", "NodeReturning", "NodeReclaimed"] {
        assert!(events.contains(reason), "{reason} missing:\n{events}");
    }
    assert!(events.contains("a lender comes first"), "{events}");
    assert_eq!(
        sample(
            &fed.metrics_addr,
            "tessera_federation_loans_total{outcome=\"returned\"}"
        ),
        1.0
    );
    let (events, bindings, _) = watch.finish();
    eprintln!("invariants held over {events} pod events and {bindings} bindings in both shards");
    assert!(
        bindings >= 8,
        "the watch saw {bindings} bindings, fewer than the run made"
    );
}

#[test]
fn a_process_node_is_lent_runs_the_borrowers_process_and_goes_home_once_idle() {
    let grpc = free_addr();
    let fed = support::quick_federation(&grpc, &["--lend-idle-seconds=3"]);
    // a: one simulated node, and a process node run by an agent of its own (`pa-proc-0`).
    let a = shard("a", 1);
    let _node = process_node(&a, &free_addr(), "pa");
    let b = shard("b", 1);
    let _agents = [
        join_agent(&fed, &a, &grpc, "a"),
        join_agent(&fed, &b, &grpc, "b"),
    ];
    fed.wait_for_ready_shards(2);
    lending(&fed, "a", r#"{"maxLend":1,"minNodes":1}"#);
    lending(&fed, "b", r#"{"maxBorrow":1}"#);
    // A real process that must run on a process node, pinned to b, which has none.
    let manifest = "apiVersion: tessera.io/v1alpha1\nkind: Tenant\nmetadata: {name: hot}\nspec: {namespaces: [hot], processNodes: true}\n---\napiVersion: v1\nkind: Namespace\nmetadata: {name: hot}\n---\napiVersion: tessera.io/v1alpha1\nkind: Placement\nmetadata: {name: runner, namespace: hot}\nspec:\n  resourceSelectors: [{kind: Deployment, name: runner}]\n  shardAffinity: {shardNames: [b]}\n---\napiVersion: apps/v1\nkind: Deployment\nmetadata: {name: runner, namespace: hot}\nspec:\n  replicas: 1\n  selector: {matchLabels: {app: runner}}\n  template:\n    metadata: {labels: {app: runner}}\n    spec:\n      terminationGracePeriodSeconds: 1\n      nodeSelector: {tessera.io/runtime: process}\n      tolerations: [{key: tessera.io/runtime, operator: Exists}]\n      containers: [{name: c, image: busybox, command: [sleep, \"619\"], resources: {requests: {cpu: 100m}}}]\n";
    let started = std::time::Instant::now();
    fed.ok(&["apply", "-f", &fed.file("runner.yaml", manifest)]);
    let ran = wait_for(Duration::from_secs(90), || {
        let ps = pods(&b, "hot");
        let on = ps
            .iter()
            .any(|(_, n, p)| n == "pa-proc-0" && p == "Running");
        (on && !processes(&["sleep", "619"]).is_empty()).then_some(())
    });
    assert!(
        ran.is_some(),
        "b never ran the process on a's node: {:?}\n{}",
        pods(&b, "hot"),
        fed.ok(&["get", "events", "-A"])
    );
    eprintln!(
        "process node pa-proc-0 of a ran b's process {:.1}s after kubectl apply",
        started.elapsed().as_secs_f64()
    );
    let labels = b.ok(&[
        "get",
        "node",
        "pa-proc-0",
        "-o",
        "jsonpath={.metadata.labels.tessera\\.io/runtime} {.metadata.labels.tessera\\.io/lent-from}",
    ]);
    assert_eq!(labels, "process a");
    // Scaled to nothing: the process stops, and once idle the node goes home.
    fed.ok(&["scale", "deployment", "runner", "-n", "hot", "--replicas=0"]);
    let home = wait_for(Duration::from_secs(60), || {
        let gone = !b.ok(&["get", "nodes"]).contains("pa-proc-0");
        let taints = a.ok(&[
            "get",
            "node",
            "pa-proc-0",
            "-o",
            "jsonpath={.spec.taints[*].key}",
        ]);
        (gone && !taints.contains("tessera.io/lent")).then_some(())
    });
    assert!(
        home.is_some(),
        "the node never went home: b {}\na {}",
        b.ok(&["get", "nodes"]),
        a.ok(&["get", "node", "pa-proc-0", "-o", "yaml"])
    );
    assert!(processes(&["sleep", "619"]).is_empty());
    let events = fed.ok(&["get", "events", "-A"]);
    assert!(events.contains("idle for 3s"), "{events}");
}
