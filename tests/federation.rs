//! The federation end to end with the real kubectl: `tessera up --shards 3` (a federation
//! and three shards in one process, each shard with its own store, API, controllers,
//! scheduler and simulated nodes), and the federation and a shard as separate processes
//! joined by `tessera join`.

use std::process::{Command, Stdio};
use std::time::Duration;

mod support;

use serde_json::Value;
use support::{Cluster, Running, free_addr, join_command, said, tenant_token, wait_for};

const SHARDS: [&str; 3] = ["shard-0", "shard-1", "shard-2"];

/// `spec.replicas` of `ns/name` in shard `ctx` (none if it is not there).
fn replicas_in(c: &Cluster, ctx: &str, ns: &str, name: &str) -> Option<u64> {
    let out = c.kubectl(&[
        "--context",
        ctx,
        "get",
        "deploy",
        name,
        "-n",
        ns,
        "-o",
        "jsonpath={.spec.replicas}",
    ]);
    if !out.status.success() {
        return None;
    }
    String::from_utf8_lossy(&out.stdout).trim().parse().ok()
}

fn spread(c: &Cluster, ns: &str, name: &str) -> Vec<Option<u64>> {
    SHARDS.iter().map(|s| replicas_in(c, s, ns, name)).collect()
}

fn wait_spread(c: &Cluster, ns: &str, name: &str, want: &[Option<u64>]) {
    let got = wait_for(Duration::from_secs(60), || {
        let s = spread(c, ns, name);
        (s == want).then_some(s)
    });
    assert!(
        got.is_some(),
        "{ns}/{name}: want {want:?} over the shards, have {:?}",
        spread(c, ns, name)
    );
}

/// Waits until shard `name` reports `cores` of cpu free: its capacity summary has caught up
/// with what runs there, so a placement decided now sees it (a decision made on an older
/// summary is right for that summary, but not the one a test means).
fn wait_free_cpu(c: &Cluster, name: &str, cores: f64) {
    let read = || {
        let q = c.ok(&["get", "shards", name, "-o", "jsonpath={.status.free.cpu}"]);
        let q = q.trim();
        match q.strip_suffix('m') {
            Some(milli) => milli.parse::<f64>().ok().map(|m| m / 1000.0),
            None => q.parse::<f64>().ok(),
        }
    };
    let got = wait_for(Duration::from_secs(30), || {
        read().filter(|free| (free - cores).abs() < 1e-6)
    });
    assert!(
        got.is_some(),
        "{name} should report {cores} cpu free, reports {:?}: {}",
        read(),
        c.ok(&["get", "shards"])
    );
}

/// A field (`reason`, `message`) of the `Placed` condition of `kind ns/name` at the federation.
fn placed_field(c: &Cluster, kind: &str, ns: &str, name: &str, field: &str) -> String {
    let path = format!("jsonpath={{.status.conditions[?(@.type==\"Placed\")].{field}}}");
    c.ok(&["get", kind, name, "-n", ns, "-o", &path])
}

fn start() -> (Cluster, String) {
    start_with(&[])
}

/// `tessera up --shards=3` with 10 nodes of 8 cpu per shard and `extra` flags, once every
/// shard is Ready with its nodes.
fn start_with(extra: &[&str]) -> (Cluster, String) {
    let grpc = free_addr();
    let grpc_flag = format!("--grpc-addr={grpc}");
    let mut flags = vec![
        "--shards=3",
        "--nodes-per-shard=10",
        "--node-cpu=8",
        &grpc_flag,
    ];
    flags.extend_from_slice(extra);
    let c = Cluster::start_with("up", &flags);
    let ready = wait_for(Duration::from_secs(60), || {
        let out = c.ok(&["get", "shards", "--no-headers"]);
        let rows: Vec<&str> = out.lines().filter(|l| l.contains(" True ")).collect();
        (rows.len() == 3 && rows.iter().all(|r| r.contains(" 10 "))).then_some(out)
    });
    assert!(
        ready.is_some(),
        "three shards with 10 nodes each should be Ready: {}",
        c.ok(&["get", "shards"])
    );
    (c, format!("https://{grpc}"))
}

#[test]
fn a_federation_of_three_shards_places_scales_reverts_and_deletes() {
    let (c, grpc) = start();
    let table = c.ok(&["get", "shards"]);
    for col in ["READY", "REGION", "NODES", "CPU", "MEMORY", "PODS", "AGE"] {
        assert!(table.contains(col), "no {col} column: {table}");
    }
    assert!(
        table.contains("80/80"),
        "10 nodes of 8 cpu, all free: {table}"
    );
    let map = c.ok(&[
        "get",
        "shardmap",
        "default",
        "-o",
        "jsonpath={.spec.shards[*].name}",
    ]);
    assert_eq!(map.split_whitespace().collect::<Vec<_>>(), SHARDS);

    // A Deployment made without a namespace (`default`) is placed like any other.
    c.ok(&[
        "create",
        "deployment",
        "plain",
        "--image=nginx",
        "--replicas=2",
    ]);
    c.ok(&["rollout", "status", "deployment/plain", "--timeout=60s"]);
    assert_eq!(
        spread(&c, "default", "plain").iter().flatten().sum::<u64>(),
        2,
        "the default namespace's Deployment runs in the shards"
    );

    // A Deployment divided 1:2:1 by weight.
    c.ok(&["create", "namespace", "demo"]);
    let placement = c.file(
        "split.yaml",
        "apiVersion: tessera.io/v1alpha1\nkind: Placement\nmetadata: {name: split, namespace: demo}\nspec:\n  resourceSelectors: [{kind: Deployment, name: api}]\n  replicas:\n    scheduling: Divided\n    division: Weighted\n    weights: [{shard: shard-0, weight: 1}, {shard: shard-1, weight: 2}, {shard: shard-2, weight: 1}]\n",
    );
    c.ok(&["apply", "-f", &placement]);
    c.ok(&[
        "create",
        "deployment",
        "api",
        "-n",
        "demo",
        "--image=nginx",
        "--replicas=100",
    ]);
    wait_spread(&c, "demo", "api", &[Some(25), Some(50), Some(25)]);
    c.ok(&[
        "rollout",
        "status",
        "deployment/api",
        "-n",
        "demo",
        "--timeout=90s",
    ]);
    let ready = c.ok(&[
        "get",
        "deploy",
        "api",
        "-n",
        "demo",
        "-o",
        "jsonpath={.status.availableReplicas}",
    ]);
    assert_eq!(ready, "100", "the federation's status sums the shards'");

    // Scale at the federation: every share follows.
    c.ok(&["scale", "deployment/api", "-n", "demo", "--replicas=40"]);
    wait_spread(&c, "demo", "api", &[Some(10), Some(20), Some(10)]);
    c.ok(&[
        "rollout",
        "status",
        "deployment/api",
        "-n",
        "demo",
        "--timeout=90s",
    ]);

    // A change behind the federation's back is reverted, with an Event in the shard.
    c.ok(&[
        "--context",
        "shard-0",
        "scale",
        "deployment/api",
        "-n",
        "demo",
        "--replicas=3",
    ]);
    wait_spread(&c, "demo", "api", &[Some(10), Some(20), Some(10)]);
    let events = wait_for(Duration::from_secs(30), || {
        let e = c.ok(&["--context", "shard-0", "get", "events", "-n", "demo"]);
        e.contains("FederationReverted").then_some(e)
    });
    assert!(events.is_some(), "no FederationReverted event in shard-0");

    // Delete at the federation: gone from every shard, then from the federation.
    c.ok(&["delete", "deployment", "api", "-n", "demo", "--timeout=60s"]);
    wait_spread(&c, "demo", "api", &[None, None, None]);
    let gone = c.kubectl(&["get", "deploy", "api", "-n", "demo"]);
    assert!(
        !gone.status.success(),
        "the federation's object is gone too"
    );

    // An invalid Placement is refused with what to fix.
    let bad = c.file(
        "bad.yaml",
        "apiVersion: tessera.io/v1alpha1\nkind: Placement\nmetadata: {name: bad, namespace: demo}\nspec:\n  resourceSelectors: [{kind: Pod}]\n  replicas: {scheduling: Divided, division: Weighted, weights: [{shard: shard-0, weight: 0}]}\n",
    );
    let err = c.fails(&["apply", "-f", &bad]);
    assert!(err.contains("the federation places Deployment"), "{err}");
    assert!(
        err.contains("at least one shard of positive weight"),
        "{err}"
    );

    // A shard agent with a wrong token is refused and says why; the federation keeps going.
    let shard0 = c.dir.path().join("shards/shard-0/kubeconfig");
    let out = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args([
            "join",
            "--federation",
            &grpc,
            "--token",
            "not-the-token",
            "--name",
            "intruder",
        ])
        .arg("--federation-ca")
        .arg(c.dir.path().join("pki/ca.crt"))
        .arg("--kubeconfig")
        .arg(&shard0)
        .env("TESSERA_LOG", "error")
        .output()
        .expect("tessera join");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("join token is not this federation's"), "{err}");
    let shards = c.ok(&["get", "shards", "--no-headers"]);
    assert_eq!(shards.lines().count(), 3, "{shards}");
    assert!(!shards.contains("intruder"));
}

#[test]
fn a_tenant_stays_home_spills_over_when_full_and_waits_with_a_reason() {
    let (c, _) = start();
    c.ok(&["create", "namespace", "spill"]);
    // 10 nodes × 8 cpu per shard: 20 replicas of 4 cpu fill one shard.
    c.ok(&[
        "create",
        "deployment",
        "small",
        "-n",
        "spill",
        "--image=nginx",
        "--replicas=4",
    ]);
    c.ok(&[
        "set",
        "resources",
        "deployment/small",
        "-n",
        "spill",
        "--requests=cpu=4",
    ]);
    c.ok(&[
        "rollout",
        "status",
        "deployment/small",
        "-n",
        "spill",
        "--timeout=90s",
    ]);
    let home: Vec<usize> = spread(&c, "spill", "small")
        .iter()
        .enumerate()
        .filter_map(|(i, r)| r.map(|_| i))
        .collect();
    assert_eq!(
        home.len(),
        1,
        "a small workload stays on its tenant's home shard"
    );
    let home = home[0];
    // 4 replicas of 4 cpu on 10 nodes of 8: 64 of 80 cpu free.
    wait_free_cpu(&c, SHARDS[home], 64.0);
    c.ok(&["scale", "deployment/small", "-n", "spill", "--replicas=30"]);
    c.ok(&[
        "rollout",
        "status",
        "deployment/small",
        "-n",
        "spill",
        "--timeout=90s",
    ]);
    let s = spread(&c, "spill", "small");
    assert_eq!(s[home], Some(20), "home keeps what fits: {s:?}");
    assert_eq!(
        s.iter().flatten().sum::<u64>(),
        30,
        "the rest spilled to the next shard: {s:?}"
    );
    assert_eq!(
        s.iter().flatten().count(),
        2,
        "on one more shard only: {s:?}"
    );

    // Fill the fleet; a new workload waits, with a condition and an Event saying why.
    wait_free_cpu(&c, SHARDS[home], 0.0);
    if let Some(spilled) = (0..SHARDS.len()).find(|&i| i != home && s[i].is_some()) {
        wait_free_cpu(&c, SHARDS[spilled], 40.0);
    }
    c.ok(&["scale", "deployment/small", "-n", "spill", "--replicas=60"]);
    c.ok(&[
        "rollout",
        "status",
        "deployment/small",
        "-n",
        "spill",
        "--timeout=90s",
    ]);
    c.ok(&[
        "create",
        "deployment",
        "late",
        "-n",
        "spill",
        "--image=nginx",
        "--replicas=2",
    ]);
    c.ok(&[
        "set",
        "resources",
        "deployment/late",
        "-n",
        "spill",
        "--requests=cpu=4",
    ]);
    let why = wait_for(Duration::from_secs(30), || {
        let m = placed_field(&c, "deploy", "spill", "late", "message");
        m.contains("0/3 shards fit").then_some(m)
    });
    assert!(
        why.as_deref()
            .is_some_and(|m| m.contains("lack room for a replica of cpu 4")),
        "{why:?}"
    );
    let events = c.ok(&["get", "events", "-n", "spill"]);
    assert!(events.contains("FailedPlacement"), "{events}");
    // Room frees: it is placed at once, without a fixed hold.
    c.ok(&["scale", "deployment/small", "-n", "spill", "--replicas=50"]);
    c.ok(&[
        "rollout",
        "status",
        "deployment/late",
        "-n",
        "spill",
        "--timeout=90s",
    ]);

    // Tenants are held by every shard; a tenant's token sees only its own at the federation.
    let tenant = c.file(
        "tenant.yaml",
        "apiVersion: tessera.io/v1alpha1\nkind: Tenant\nmetadata: {name: acme}\nspec: {namespaces: [acme-dev]}\n",
    );
    c.ok(&["apply", "-f", &tenant]);
    for s in SHARDS {
        let t = wait_for(Duration::from_secs(30), || {
            c.kubectl(&["--context", s, "get", "tenant", "acme"])
                .status
                .success()
                .then_some(())
        });
        assert!(t.is_some(), "Tenant acme not in {s}");
    }
    let token = tenant_token(&c, "acme");
    let denied = c.fails(&["--token", &token, "get", "deploy", "-n", "spill"]);
    assert!(
        denied.contains("Forbidden") || denied.contains("forbidden"),
        "{denied}"
    );
}

#[test]
fn a_shard_in_its_own_process_joins_a_federation_in_its_own() {
    let fed_grpc = free_addr();
    let fed = Cluster::start_with("federation", &[&format!("--grpc-addr={fed_grpc}")]);
    let shard = Cluster::start_with("up", &["--shards=0", "--nodes-per-shard=5"]);
    let _agent = Running(
        join_command(&fed, &shard, &fed_grpc, "east")
            .args(["--labels", "region=east"])
            .spawn()
            .expect("tessera join"),
    );
    let ready = wait_for(Duration::from_secs(60), || {
        let out = fed.ok(&["get", "shards", "--no-headers"]);
        (out.contains("east") && out.contains(" True ") && out.contains(" east ")).then_some(out)
    });
    assert!(ready.is_some(), "{}", fed.ok(&["get", "shards"]));
    fed.ok(&["create", "namespace", "web"]);
    fed.ok(&[
        "create",
        "deployment",
        "site",
        "-n",
        "web",
        "--image=nginx",
        "--replicas=3",
    ]);
    fed.ok(&[
        "rollout",
        "status",
        "deployment/site",
        "-n",
        "web",
        "--timeout=90s",
    ]);
    let pods = shard.ok(&["get", "pods", "-n", "web", "--no-headers"]);
    assert_eq!(
        pods.lines().filter(|l| l.contains("Running")).count(),
        3,
        "{pods}"
    );

    // The federation killed and started again: the shard's copy is kept, not removed and
    // made anew, and the federation goes on managing it.
    let uid = |c: &Cluster| {
        c.ok(&[
            "get",
            "deploy",
            "site",
            "-n",
            "web",
            "-o",
            "jsonpath={.metadata.uid}",
        ])
    };
    let before = uid(&shard);
    let map_version = |c: &Cluster| -> u64 {
        c.ok(&[
            "get",
            "shardmap",
            "default",
            "-o",
            "jsonpath={.spec.version}",
        ])
        .parse()
        .unwrap_or(0)
    };
    let version_before = map_version(&fed);
    assert!(version_before >= 1);
    let mut fed = fed;
    fed.kill_and_restart();
    let back = wait_for(Duration::from_secs(60), || {
        let out = fed.ok(&["get", "shards", "--no-headers"]);
        out.contains(" True ").then_some(out)
    });
    assert!(back.is_some(), "the shard joins the restarted federation");
    // The map the restarted federation builds is numbered after the stored one.
    let renumbered = wait_for(Duration::from_secs(30), || {
        (map_version(&fed) > version_before).then_some(())
    });
    assert!(
        renumbered.is_some(),
        "map version {} after the restart, {version_before} before",
        map_version(&fed)
    );
    fed.ok(&["scale", "deployment/site", "-n", "web", "--replicas=4"]);
    fed.ok(&[
        "rollout",
        "status",
        "deployment/site",
        "-n",
        "web",
        "--timeout=90s",
    ]);
    assert_eq!(
        shard.ok(&[
            "get",
            "deploy",
            "site",
            "-n",
            "web",
            "-o",
            "jsonpath={.spec.replicas}"
        ]),
        "4"
    );
    assert_eq!(
        uid(&shard),
        before,
        "the copy survived the federation's restart"
    );

    // A process pod's log in the shard, read through the federation (over the shard's own
    // stream: the federation never connects to the shard).
    let _procs = shard.component(&[
        "agent",
        "--sim-nodes=0",
        "--process-nodes=1",
        "--prefix=east",
        "--log-dir",
        &shard.dir.path().join("east-logs").display().to_string(),
        "--state-dir",
        &shard.dir.path().join("east-pods").display().to_string(),
    ]);
    let registered = wait_for(Duration::from_secs(60), || {
        fed.ok(&["get", "nodes", "--no-headers"])
            .lines()
            .any(|l| l.starts_with("east-proc-0 ") && l.contains(" Ready ") && l.ends_with("east"))
            .then_some(())
    });
    assert!(registered.is_some(), "{}", fed.ok(&["get", "nodes"]));
    shard.ok(&[
        "run",
        "hello",
        "-n",
        "web",
        "--image=busybox",
        "--restart=Never",
        "--overrides={\"spec\":{\"nodeName\":\"east-proc-0\"}}",
        "--command",
        "--",
        "sh",
        "-c",
        "echo hello through the federation; echo second line",
    ]);
    let done = wait_for(Duration::from_secs(60), || {
        (fed.ok(&[
            "get",
            "pod",
            "hello",
            "-n",
            "web",
            "-o",
            "jsonpath={.status.phase}",
        ]) == "Succeeded")
            .then_some(())
    });
    assert!(
        done.is_some(),
        "{}\nits log (a sandbox that cannot start says why here):\n{}",
        fed.ok(&["get", "pod", "hello", "-n", "web", "-o", "yaml"]),
        String::from_utf8_lossy(&fed.kubectl(&["logs", "hello", "-n", "web"]).stdout)
    );
    assert_eq!(
        fed.ok(&["logs", "hello", "-n", "web"]),
        "hello through the federation\nsecond line\n"
    );
    assert_eq!(
        fed.ok(&["logs", "hello", "-n", "web", "--tail=1"]),
        "second line\n"
    );
    let missing = fed.fails(&["logs", "nosuchpod", "-n", "web"]);
    assert!(
        missing.contains("NotFound") || missing.contains("not found"),
        "{missing}"
    );

    // exec and port-forward at the federation: opened in the shard by its agent and
    // tunnelled over the shard's stream, with every protocol kubectl speaks.
    shard.ok(&[
        "run",
        "site",
        "-n",
        "web",
        "--image=busybox",
        "--overrides={\"spec\":{\"nodeName\":\"east-proc-0\"}}",
        "--command",
        "--",
        "sh",
        "-c",
        "mkdir -p /tmp/www && echo served-through-the-federation > /tmp/www/index.html && cd /tmp/www && exec python3 -m http.server 8080 --bind 127.0.0.1",
    ]);
    assert!(
        fed.listens("web", "site", 8080, Duration::from_secs(60)),
        "{}",
        fed.ok(&["get", "pod", "site", "-n", "web", "-o", "yaml"])
    );
    let (code, stdout, stderr) = said(&fed.kubectl(&[
        "exec",
        "-n",
        "web",
        "site",
        "--",
        "sh",
        "-c",
        "echo out; echo err >&2; exit 3",
    ]));
    assert_eq!(code, Some(3), "{stderr}");
    assert_eq!(stdout, "out\n");
    assert!(stderr.starts_with("err\n"), "{stderr}");
    // More than a window each way (flow control carries it, in order): 3 MiB of stdin
    // counted in the pod, 2 MiB of output counted here; and the same over SPDY.
    let input: Vec<u8> = (0..3 << 20).map(|i: u32| b'a' + (i % 26) as u8).collect();
    for spdy in [false, true] {
        let mut cmd = fed.command(&[
            "exec",
            "-i",
            "-n",
            "web",
            "site",
            "--",
            "sh",
            "-c",
            "md5sum; head -c 2097152 /dev/zero",
        ]);
        if spdy {
            cmd.env("KUBECTL_REMOTE_COMMAND_WEBSOCKETS", "false");
        }
        let out = support::fed(&mut cmd, &input, "kubectl exec -i through the federation");
        assert_eq!(out.status.code(), Some(0), "spdy={spdy}: {}", said(&out).2);
        let want = md5_of(&input);
        let (head, zeros) = out.stdout.split_at(
            out.stdout
                .iter()
                .position(|b| *b == b'\n')
                .map_or(0, |i| i + 1),
        );
        assert!(
            String::from_utf8_lossy(head).starts_with(&want),
            "spdy={spdy}: the pod saw the client's bytes, all and in order: {}",
            String::from_utf8_lossy(head)
        );
        assert_eq!(zeros.len(), 2 << 20, "spdy={spdy}");
    }
    let local = free_addr();
    let port = local.rsplit(':').next().expect("port").to_owned();
    let mut forward = fed
        .command(&[
            "port-forward",
            "-n",
            "web",
            "pod/site",
            &format!("{port}:8080"),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map(Running)
        .expect("kubectl port-forward");
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(
        forward.0.stdout.take().expect("stdout"),
    ));
    let first = lines.next().and_then(Result::ok).unwrap_or_default();
    assert!(first.starts_with("Forwarding from 127.0.0.1:"), "{first}");
    for _ in 0..3 {
        let body = support::http_get(&local, "/").expect("through the forward");
        assert!(body.contains("served-through-the-federation"), "{body}");
    }
    drop(forward);
    assert!(support::sample(&fed.metrics_addr, "tessera_federation_pod_streams_total") >= 5.0);
    // A pod the shards do not have, and a tenant outside its namespaces: refused at the
    // federation, nothing reaches a shard.
    let e = fed.fails(&["exec", "-n", "web", "ghost", "--", "true"]);
    assert!(e.contains("NotFound") || e.contains("not found"), "{e}");
    let tenant = fed.file(
        "acme.yaml",
        "apiVersion: tessera.io/v1alpha1\nkind: Tenant\nmetadata: {name: acme}\nspec: {namespaces: [acme-dev]}\n",
    );
    fed.ok(&["apply", "-f", &tenant]);
    let acme = tenant_token(&fed, "acme");
    for args in [
        vec![
            "exec",
            "-n",
            "web",
            "site",
            "--",
            "cat",
            "/tmp/www/index.html",
        ],
        vec!["port-forward", "-n", "web", "pod/site", "18998:8080"],
    ] {
        let mut all = vec!["--token", acme.as_str()];
        all.extend(args.iter());
        let (code, stdout, stderr) = said(&fed.kubectl(&all));
        assert_ne!(code, Some(0), "{args:?}: {stdout}");
        assert!(
            stderr.to_lowercase().contains("forbidden"),
            "{args:?}: {stderr}"
        );
        assert!(!stdout.contains("served-through"), "{stdout}");
    }
}

/// The MD5 digest of `bytes` in hex, as `md5sum` prints it.
fn md5_of(bytes: &[u8]) -> String {
    let out = support::fed(&mut Command::new("md5sum"), bytes, "md5sum");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_owned()
}

/// Lines a long-running kubectl (a watch) has printed so far; it is killed when dropped.
struct Watching {
    child: std::process::Child,
    out: std::sync::Arc<std::sync::Mutex<String>>,
}

impl Watching {
    fn start(c: &Cluster, args: &[&str]) -> Watching {
        use std::io::BufRead;
        let mut child = c
            .command(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("kubectl watch");
        let stdout = child.stdout.take().expect("piped");
        let out = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let sink = out.clone();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
            {
                let mut s = sink.lock().expect("not poisoned");
                s.push_str(&line);
                s.push('\n');
            }
        });
        Watching { child, out }
    }

    fn seen(&self) -> String {
        self.out.lock().expect("not poisoned").clone()
    }
}

impl Drop for Watching {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The values of the last column (SHARD) of a table without headers.
fn last_column(table: &str) -> Vec<String> {
    table
        .lines()
        .filter_map(|l| l.split_whitespace().last().map(str::to_owned))
        .collect()
}

#[test]
fn pods_nodes_and_events_are_read_across_shards() {
    let (c, _) = start();
    // Every shard's nodes, each with its shard.
    let nodes = c.ok(&["get", "nodes", "--no-headers"]);
    let shards = last_column(&nodes);
    assert_eq!(shards.len(), 30, "{nodes}");
    for s in SHARDS {
        assert_eq!(shards.iter().filter(|x| *x == s).count(), 10, "{nodes}");
    }
    assert!(
        c.ok(&["get", "nodes"])
            .lines()
            .next()
            .is_some_and(|h| h.contains("SHARD"))
    );
    // Paged across shards (7 per page: pages end inside and at the end of shards): the same
    // 30 nodes, each once.
    let mut paged: Vec<String> = c
        .ok(&["get", "nodes", "-o", "name", "--chunk-size=7"])
        .lines()
        .map(str::to_owned)
        .collect();
    paged.sort();
    let before = paged.len();
    paged.dedup();
    assert_eq!((before, paged.len()), (30, 30), "{paged:?}");

    // A workload divided over the three shards: its pods are listed with their shards.
    c.ok(&["create", "namespace", "reads"]);
    let placement = c.file(
        "thirds.yaml",
        "apiVersion: tessera.io/v1alpha1\nkind: Placement\nmetadata: {name: thirds, namespace: reads}\nspec:\n  resourceSelectors: [{kind: Deployment, name: web}]\n  replicas:\n    scheduling: Divided\n    division: Weighted\n    weights: [{shard: shard-0, weight: 1}, {shard: shard-1, weight: 1}, {shard: shard-2, weight: 1}]\n",
    );
    c.ok(&["apply", "-f", &placement]);
    // A policy no shard can satisfy is refused, with the shards there are.
    let nowhere = c.file(
        "nowhere.yaml",
        "apiVersion: tessera.io/v1alpha1\nkind: Placement\nmetadata: {name: nowhere, namespace: reads}\nspec:\n  resourceSelectors: [{kind: Deployment, name: x}]\n  shardAffinity: {shardNames: [shard-9], matchLabels: {region: mars}}\n",
    );
    let refused = c.fails(&["apply", "-f", &nowhere]);
    assert!(
        refused.contains("spec.shardAffinity.shardNames[0]")
            && refused.contains("shard-0, shard-1, shard-2")
            && refused.contains("region=mars"),
        "{refused}"
    );
    c.deploy("reads", "web", 6);
    let all = c.ok(&["get", "pods", "-A", "--no-headers"]);
    let ours: Vec<&str> = all.lines().filter(|l| l.starts_with("reads ")).collect();
    assert_eq!(ours.len(), 6, "{all}");
    for s in SHARDS {
        assert_eq!(
            ours.iter().filter(|l| l.ends_with(s)).count(),
            2,
            "two pods in {s}: {all}"
        );
    }
    // A selector on the shard label picks the shard; the rest of it goes to the shards.
    let one = c.ok(&[
        "get",
        "pods",
        "-n",
        "reads",
        "-l",
        "tessera.io/shard=shard-1,app=web",
        "-o",
        "name",
    ]);
    assert_eq!(one.lines().count(), 2, "{one}");
    let none = c.ok(&[
        "get",
        "pods",
        "-n",
        "reads",
        "-l",
        "app=other",
        "-o",
        "name",
    ]);
    assert!(none.trim().is_empty(), "{none}");
    // Field selectors apply in every shard.
    let running = c.ok(&[
        "get",
        "pods",
        "-n",
        "reads",
        "--field-selector=status.phase=Running",
        "-o",
        "name",
    ]);
    assert_eq!(running.lines().count(), 6, "{running}");
    // Pods paged one at a time: the same six.
    let mut a: Vec<String> = c
        .ok(&["get", "pods", "-n", "reads", "-o", "name", "--chunk-size=1"])
        .lines()
        .map(str::to_owned)
        .collect();
    let mut b: Vec<String> = c
        .ok(&["get", "pods", "-n", "reads", "-o", "name"])
        .lines()
        .map(str::to_owned)
        .collect();
    a.sort();
    b.sort();
    assert_eq!(a, b);
    // One pod by name, from whichever shard holds it.
    let name = b[0].trim_start_matches("pod/").to_owned();
    let shard = c.ok(&[
        "get",
        "pod",
        &name,
        "-n",
        "reads",
        "-o",
        "jsonpath={.metadata.labels.tessera\\.io/shard}",
    ]);
    assert!(SHARDS.contains(&shard.as_str()), "{shard:?}");
    assert!(
        c.ok(&[
            "--context",
            &shard,
            "get",
            "pod",
            &name,
            "-n",
            "reads",
            "-o",
            "name"
        ])
        .contains(&name)
    );
    assert!(
        c.fails(&["get", "pod", "no-such-pod", "-n", "reads"])
            .contains("NotFound")
    );

    // A watch at the federation sees a change made in any shard.
    let watch = Watching::start(
        &c,
        &["get", "pods", "-n", "reads", "-w", "--output-watch-events"],
    );
    let listed = wait_for(Duration::from_secs(30), || {
        (watch.seen().lines().filter(|l| l.contains("web-")).count() >= 6).then_some(())
    });
    assert!(listed.is_some(), "{}", watch.seen());
    c.ok(&[
        "--context",
        "shard-2",
        "run",
        "direct",
        "-n",
        "reads",
        "--image=nginx",
    ]);
    let seen = wait_for(Duration::from_secs(30), || {
        let s = watch.seen();
        s.lines()
            .any(|l| l.contains("direct") && l.contains("Running") && l.ends_with("shard-2"))
            .then_some(s)
    });
    assert!(seen.is_some(), "{}", watch.seen());
    // Events come from the shards (the scheduler's) and the federation (its own).
    let events = c.ok(&["get", "events", "-n", "reads"]);
    assert!(
        events.lines().next().is_some_and(|h| h.contains("SHARD")),
        "{events}"
    );
    assert!(
        events
            .lines()
            .any(|l| l.contains("Scheduled") && l.contains("pod/direct") && l.ends_with("shard-2")),
        "{events}"
    );

    // Pods are written in their shard, not at the federation.
    let refused = c.fails(&["delete", "pod", "direct", "-n", "reads"]);
    assert!(refused.contains("live in the shards"), "{refused}");
    // An exec at the federation is made by the pod's shard (here its in-process agent),
    // which says why a pod on a simulated node cannot be exec'd into.
    let refused = c.fails(&["exec", "-n", "reads", "direct", "--", "true"]);
    assert!(
        refused.contains("simulated nodes run no processes"),
        "{refused}"
    );

    // A tenant reads only its own namespaces, at the federation as on a shard.
    let tenant = c.file(
        "tenant.yaml",
        "apiVersion: tessera.io/v1alpha1\nkind: Tenant\nmetadata: {name: other}\nspec: {namespaces: [other-dev]}\n",
    );
    c.ok(&["apply", "-f", &tenant]);
    c.ok(&["create", "namespace", "other-dev"]);
    let token = tenant_token(&c, "other");
    for args in [
        &["get", "pods", "-A"][..],
        &["get", "pods", "-n", "reads"],
        &["get", "pod", &name, "-n", "reads"],
        &["get", "events", "-n", "reads"],
        &["get", "pods", "-n", "reads", "-w", "--request-timeout=5s"],
        &["logs", &name, "-n", "reads"],
        &["exec", &name, "-n", "reads", "--", "true"],
    ] {
        let mut with_token = vec!["--token", &token];
        with_token.extend_from_slice(args);
        let denied = c.fails(&with_token);
        assert!(
            denied.to_lowercase().contains("forbidden"),
            "{args:?}: {denied}"
        );
    }
    let own = c.ok(&[
        "--token",
        &token,
        "get",
        "pods",
        "-n",
        "other-dev",
        "-o",
        "name",
    ]);
    assert!(own.trim().is_empty(), "{own}");
}

#[test]
fn a_workload_takes_what_it_references_along_to_its_shards() {
    let (c, _) = start();
    c.ok(&["create", "namespace", "deps"]);
    c.ok(&[
        "create",
        "configmap",
        "settings",
        "-n",
        "deps",
        "--from-literal=level=1",
    ]);
    c.ok(&[
        "create",
        "secret",
        "generic",
        "password",
        "-n",
        "deps",
        "--from-literal=p=s3cret",
    ]);
    c.ok(&[
        "create",
        "configmap",
        "unrelated",
        "-n",
        "deps",
        "--from-literal=x=1",
    ]);
    c.ok(&["create", "serviceaccount", "builder", "-n", "deps"]);
    c.ok(&[
        "create",
        "service",
        "clusterip",
        "web",
        "-n",
        "deps",
        "--tcp=80:8080",
    ]);
    let deploy = c.file(
        "web.yaml",
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web, namespace: deps}\nspec:\n  replicas: 2\n  selector: {matchLabels: {app: web}}\n  template:\n    metadata: {labels: {app: web}}\n    spec:\n      serviceAccountName: builder\n      containers:\n      - name: c\n        image: nginx\n        envFrom: [{configMapRef: {name: settings}}]\n        env: [{name: P, valueFrom: {secretKeyRef: {name: password, key: p}}}]\n",
    );
    c.ok(&["apply", "-f", &deploy]);
    c.ok(&[
        "rollout",
        "status",
        "deployment/web",
        "-n",
        "deps",
        "--timeout=90s",
    ]);
    let homes: Vec<&str> = SHARDS
        .iter()
        .zip(spread(&c, "deps", "web"))
        .filter_map(|(s, r)| r.map(|_| *s))
        .collect();
    assert_eq!(homes.len(), 1, "one home shard: {homes:?}");
    let home = homes[0];
    let get = |what: &[&str]| {
        let mut args = vec!["--context", home, "get", "-n", "deps"];
        args.extend_from_slice(what);
        c.kubectl(&args)
    };
    let value = |what: &[&str]| String::from_utf8_lossy(&get(what).stdout).into_owned();
    assert_eq!(
        value(&["configmap", "settings", "-o", "jsonpath={.data.level}"]),
        "1"
    );
    assert_eq!(
        value(&["secret", "password", "-o", "jsonpath={.data.p}"]),
        "czNjcmV0",
        "the secret's data, base64 as stored"
    );
    assert!(get(&["serviceaccount", "builder"]).status.success());
    let ip = value(&["service", "web", "-o", "jsonpath={.spec.clusterIP}"]);
    assert!(
        !ip.is_empty(),
        "the shard gives the Service its own address"
    );
    assert!(
        !get(&["configmap", "unrelated"]).status.success(),
        "what the workload does not reference stays at the federation"
    );
    for other in SHARDS.iter().filter(|s| **s != home) {
        let out = c.kubectl(&[
            "--context",
            other,
            "get",
            "configmap",
            "settings",
            "-n",
            "deps",
        ]);
        assert!(
            !out.status.success(),
            "{other} runs none of it and holds none of it"
        );
    }
    // A change at the federation reaches the shard.
    c.ok(&[
        "patch",
        "configmap",
        "settings",
        "-n",
        "deps",
        "--type=merge",
        "-p",
        "{\"data\":{\"level\":\"2\"}}",
    ]);
    let followed = wait_for(Duration::from_secs(30), || {
        (value(&["configmap", "settings", "-o", "jsonpath={.data.level}"]) == "2").then_some(())
    });
    assert!(
        followed.is_some(),
        "the shard's copy follows the federation's"
    );
}

/// Roles and bindings made at the federation are held by every shard (so what a tenant
/// grants there holds when its users reach a shard), follow changes, and go when deleted;
/// Kubernetes' default roles stay each shard's own.
#[test]
fn rbac_objects_are_held_in_every_shard() {
    let (c, _) = start();
    c.ok(&["create", "namespace", "team"]);
    c.ok(&[
        "create",
        "role",
        "reader",
        "-n",
        "team",
        "--verb=get",
        "--resource=pods",
    ]);
    c.ok(&[
        "create",
        "rolebinding",
        "alice-reads",
        "-n",
        "team",
        "--role=reader",
        "--user=alice",
    ]);
    c.ok(&[
        "create",
        "clusterrole",
        "node-reader",
        "--verb=get,list",
        "--resource=nodes",
    ]);
    c.ok(&[
        "create",
        "clusterrolebinding",
        "auditors",
        "--clusterrole=node-reader",
        "--group=auditors",
    ]);
    let shard_has = |shard: &str, args: &[&str]| {
        let mut all = vec!["--context", shard, "get"];
        all.extend_from_slice(args);
        c.kubectl(&all).status.success()
    };
    for shard in SHARDS {
        let held = wait_for(Duration::from_secs(30), || {
            (shard_has(shard, &["rolebinding", "alice-reads", "-n", "team"])
                && shard_has(shard, &["role", "reader", "-n", "team"])
                && shard_has(shard, &["clusterrole", "node-reader"])
                && shard_has(shard, &["clusterrolebinding", "auditors"]))
            .then_some(())
        });
        assert!(
            held.is_some(),
            "{shard} holds the federation's RBAC objects"
        );
        let view = c.ok(&[
            "--context",
            shard,
            "get",
            "clusterrole",
            "view",
            "-o",
            "jsonpath={.metadata.labels}",
        ]);
        assert!(
            !view.contains("tessera.io/federated"),
            "{shard}'s own view: {view}"
        );
    }
    // A change follows; a deletion removes every copy.
    c.ok(&[
        "patch",
        "role",
        "reader",
        "-n",
        "team",
        "--type=json",
        "-p",
        "[{\"op\":\"add\",\"path\":\"/rules/0/verbs/-\",\"value\":\"list\"}]",
    ]);
    for shard in SHARDS {
        let followed = wait_for(Duration::from_secs(30), || {
            let verbs = c.ok(&[
                "--context",
                shard,
                "get",
                "role",
                "reader",
                "-n",
                "team",
                "-o",
                "jsonpath={.rules[0].verbs}",
            ]);
            verbs.contains("list").then_some(())
        });
        assert!(followed.is_some(), "{shard} follows the change");
    }
    c.ok(&["delete", "rolebinding", "alice-reads", "-n", "team"]);
    c.ok(&["delete", "clusterrolebinding", "auditors"]);
    for shard in SHARDS {
        let gone = wait_for(Duration::from_secs(30), || {
            (!shard_has(shard, &["rolebinding", "alice-reads", "-n", "team"])
                && !shard_has(shard, &["clusterrolebinding", "auditors"]))
            .then_some(())
        });
        assert!(gone.is_some(), "{shard} removed its copies");
    }
}

/// A CRD with a conversion webhook applied at the federation: an object written at the
/// federation in one version is stored there and in its home shard in the storage version,
/// and read in either version at both.
#[test]
fn a_conversion_webhook_serves_the_federation_and_its_shards() {
    let (c, _) = start();
    let (addr, ca, seen, _rt) = support::conversion::start();
    let crd = c.file(
        "routes.yaml",
        &support::conversion::route_crd(&support::conversion::client_config(addr, &ca, "/convert")),
    );
    c.ok(&["apply", "-f", &crd]);
    c.ok(&["create", "namespace", "shop"]);
    let r1 = c.file(
        "r1.yaml",
        "apiVersion: example.com/v1\nkind: Route\nmetadata: {name: r1, namespace: shop}\nspec: {host: a.example, port: 8080}\n",
    );
    let created = wait_for(Duration::from_secs(30), || {
        c.kubectl(&["apply", "-f", &r1])
            .status
            .success()
            .then_some(())
    });
    assert!(created.is_some(), "the federation serves routes");
    let spec_in = |context: Option<&str>, version: &str| -> Option<Value> {
        let resource = format!("routes.{version}.example.com");
        let mut args = vec!["get", &resource, "r1", "-n", "shop", "-o", "json"];
        if let Some(ctx) = context {
            args.splice(0..0, ["--context", ctx]);
        }
        let out = c.kubectl(&args);
        out.status.success().then(|| {
            let v: Value = serde_json::from_slice(&out.stdout).expect("kubectl printed JSON");
            v["spec"].clone()
        })
    };
    // The federation stored it in v2 and reads it in either version.
    assert_eq!(
        spec_in(None, "v2"),
        Some(serde_json::json!({"address": "a.example:8080"}))
    );
    assert_eq!(
        spec_in(None, "v1"),
        Some(serde_json::json!({"host": "a.example", "port": 8080}))
    );
    // Its home shard holds it in v2, and converts for reads in v1.
    let home = wait_for(Duration::from_secs(30), || {
        SHARDS
            .iter()
            .find(|s| spec_in(Some(s), "v2").is_some())
            .copied()
    })
    .expect("a shard holds the route");
    assert_eq!(
        spec_in(Some(home), "v2"),
        Some(serde_json::json!({"address": "a.example:8080"}))
    );
    let calls_before = seen.lock().expect("lock").len();
    assert_eq!(
        spec_in(Some(home), "v1"),
        Some(serde_json::json!({"host": "a.example", "port": 8080}))
    );
    assert!(
        seen.lock().expect("lock").len() > calls_before,
        "{home} called the webhook for the v1 read"
    );
    // A change through v1 at the federation reaches the shard.
    support::conversion::set_port(&c, "r1", 9090);
    let followed = wait_for(Duration::from_secs(30), || {
        (spec_in(Some(home), "v2") == Some(serde_json::json!({"address": "a.example:9090"})))
            .then_some(())
    });
    assert!(followed.is_some(), "{home} follows the change");
}

/// `kubernetes.io/kube-apiserver-client` requests made at the federation are signed with
/// the federation's CA, and the federation's API authenticates the certificate.
#[test]
fn client_certificates_are_issued_and_accepted_at_the_federation() {
    let (c, _) = start();
    let (pem, key, _) = support::certs::request("ops-bot", &["operators"]);
    let file = c.file(
        "bot.yaml",
        &support::certs::client_csr("ops-bot", &pem, "client auth"),
    );
    c.ok(&["create", "-f", &file]);
    c.ok(&["certificate", "approve", "ops-bot"]);
    let cert = c.file("bot.crt", &support::certs::issued(&c, "ops-bot"));
    let key = c.file("bot.key", &key.serialize_pem());
    let ca = c.dir.path().join("pki").join("ca.crt");
    let (ok, who, err) = support::certs::kubectl_with_cert(
        &c.server(),
        &ca,
        &cert,
        &key,
        &[
            "auth",
            "whoami",
            "-o",
            "jsonpath={.status.userInfo.username}",
        ],
    );
    assert!(ok, "{err}");
    assert_eq!(who, "ops-bot");
}

/// A CustomResourceDefinition applied at the federation is held by every shard, each of
/// which serves the kind; a custom object applied at the federation is held by its tenant's
/// home shard alone; deleting either at the federation removes the copies.
#[test]
fn crds_and_custom_objects_reach_the_shards() {
    let (c, _) = start();
    let crd = c.file(
        "crd.yaml",
        "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\n\
         metadata: {name: widgets.example.com}\n\
         spec:\n  group: example.com\n  scope: Namespaced\n\
         \x20 names: {plural: widgets, kind: Widget}\n\
         \x20 versions:\n  - name: v1\n    served: true\n    storage: true\n\
         \x20   schema: {openAPIV3Schema: {type: object, properties: {spec: {type: object,\n\
         \x20     properties: {size: {type: integer, maximum: 10}}}}}}\n",
    );
    c.ok(&["apply", "-f", &crd]);
    c.ok(&["create", "namespace", "shop"]);
    for shard in SHARDS {
        let served = wait_for(Duration::from_secs(30), || {
            c.kubectl(&["--context", shard, "get", "widgets", "-n", "shop"])
                .status
                .success()
                .then_some(())
        });
        assert!(served.is_some(), "{shard} serves the federation's CRD");
        let conditions = c.ok(&[
            "--context",
            shard,
            "get",
            "crd",
            "widgets.example.com",
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"Established\")].status}",
        ]);
        assert_eq!(conditions.trim(), "True", "{shard}");
        // The shard validates with the schema it was given.
        let bad = c.file(
            "bad.yaml",
            "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w, namespace: shop}\nspec: {size: 11}\n",
        );
        let out = c.kubectl(&["--context", shard, "create", "-f", &bad]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains("spec.size"),
            "{shard}: {err}"
        );
    }
    // A custom object at the federation is held by its tenant's home shard, and only there.
    let w = c.file(
        "w.yaml",
        "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w1, namespace: shop}\nspec: {size: 3}\n",
    );
    c.ok(&["apply", "-f", &w]);
    let size_in = |shard: &str| -> Option<String> {
        let out = c.kubectl(&[
            "--context",
            shard,
            "get",
            "widget",
            "w1",
            "-n",
            "shop",
            "-o",
            "jsonpath={.spec.size}",
        ]);
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    };
    let home = wait_for(Duration::from_secs(30), || {
        SHARDS.iter().find(|s| size_in(s).is_some()).copied()
    })
    .expect("a shard holds the federation's custom object");
    assert_eq!(size_in(home).as_deref(), Some("3"));
    for shard in SHARDS.iter().filter(|s| **s != home) {
        assert!(
            size_in(shard).is_none(),
            "{shard} does not hold it, {home} does"
        );
    }
    // A change follows; a deletion removes the copy.
    let resize = |size: u32| {
        let patch = format!("{{\"spec\":{{\"size\":{size}}}}}");
        c.ok(&[
            "patch",
            "widget",
            "w1",
            "-n",
            "shop",
            "--type=merge",
            "-p",
            &patch,
        ]);
        let want = size.to_string();
        wait_for(Duration::from_secs(30), || {
            (size_in(home).as_deref() == Some(want.as_str())).then_some(())
        })
        .is_some()
    };
    assert!(resize(4), "{home} follows the change");
    // A new storage version (operators' upgrades move it) keeps the copy: the same object,
    // not a deleted and recreated one.
    let uid_in = |shard: &str| {
        c.ok(&[
            "--context",
            shard,
            "get",
            "widget",
            "w1",
            "-n",
            "shop",
            "-o",
            "jsonpath={.metadata.uid}",
        ])
    };
    let before = uid_in(home);
    let schema = "schema: {openAPIV3Schema: {type: object, properties: {spec: {type: object,\n\
                  \x20     properties: {size: {type: integer, maximum: 10}}}}}}";
    let upgraded = c.file(
        "crd2.yaml",
        &format!(
            "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\n\
             metadata: {{name: widgets.example.com}}\n\
             spec:\n  group: example.com\n  scope: Namespaced\n\
             \x20 names: {{plural: widgets, kind: Widget}}\n\
             \x20 versions:\n  - name: v1\n    served: true\n    storage: false\n    {schema}\n\
             \x20 - name: v2\n    served: true\n    storage: true\n    {schema}\n"
        ),
    );
    c.ok(&["apply", "-f", &upgraded]);
    let upgraded_everywhere = wait_for(Duration::from_secs(30), || {
        SHARDS
            .iter()
            .all(|s| {
                c.kubectl(&[
                    "--context",
                    s,
                    "get",
                    "widgets.v2.example.com",
                    "-n",
                    "shop",
                ])
                .status
                .success()
            })
            .then_some(())
    });
    assert!(upgraded_everywhere.is_some(), "every shard serves v2");
    assert!(resize(5), "{home} follows changes after the upgrade");
    assert_eq!(uid_in(home), before, "the copy was kept, not made again");
    c.ok(&["delete", "widget", "w1", "-n", "shop", "--timeout=60s"]);
    let removed = wait_for(Duration::from_secs(30), || {
        size_in(home).is_none().then_some(())
    });
    assert!(removed.is_some(), "{home} removed its copy");

    c.ok(&["delete", "crd", "widgets.example.com"]);
    for shard in SHARDS {
        let gone = wait_for(Duration::from_secs(30), || {
            (!c.kubectl(&["--context", shard, "get", "crd", "widgets.example.com"])
                .status
                .success())
            .then_some(())
        });
        assert!(gone.is_some(), "{shard} removed its copy");
    }
}

/// `tessera bench federation` runs end to end on a tiny fleet and reports every figure.
#[test]
fn the_federation_benchmark_kills_a_shard_and_loses_nothing() {
    let out = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args([
            "bench",
            "federation",
            "--fail-shard",
            "--shards=3",
            "--nodes-per-shard=10",
            "--pods=120",
            "--tenants=24",
            "--shard-lease-seconds=3",
            "--timeout=120",
            "--json",
        ])
        .env("TESSERA_LOG", "warn")
        .output()
        .expect("tessera bench federation --fail-shard");
    // It fails itself if a pod is lost or doubled.
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let line = String::from_utf8_lossy(&out.stdout);
    let r: serde_json::Value = serde_json::from_str(line.trim()).expect("one JSON line");
    assert_eq!(r["pods_lost"], 0, "{r}");
    assert_eq!(r["pods_duplicated"], 0, "{r}");
    assert!(
        r["pods_on_killed_shard"].as_u64().expect("count") > 0,
        "{r}"
    );
    assert!(r["replaced_secs"].as_f64().is_some(), "{r}");
    assert!(r["killed"].as_str().expect("a name").starts_with("shard-"));
}

/// `--gangs`: gangs larger than one shard are divided and each ends bound whole.
#[test]
fn the_federation_benchmark_binds_every_gang_whole() {
    let out = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["bench", "federation", "--gangs=2", "--gang-size=30"])
        .args([
            "--shards=3",
            "--nodes-per-shard=3",
            "--timeout=120",
            "--json",
        ])
        .env("TESSERA_LOG", "warn")
        .output()
        .expect("tessera bench federation --gangs");
    // It fails itself unless every gang ends with exactly its members bound.
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let r: serde_json::Value =
        serde_json::from_str(String::from_utf8_lossy(&out.stdout).trim()).expect("one JSON line");
    assert_eq!(
        (r["gangs"].as_u64(), r["wrong"].as_u64()),
        (Some(2), Some(0)),
        "{r}"
    );
    // 24 cpu per shard and 30 per gang: every gang is divided.
    assert_eq!(r["divided"], 2, "{r}");
    assert!(r["bound_p99_ms"].as_f64().is_some_and(|v| v > 0.0), "{r}");
}

#[test]
fn the_federation_benchmark_reports_every_figure() {
    let out = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args([
            "bench",
            "federation",
            "--shards=2",
            "--nodes-per-shard=5",
            "--pods=40",
            "--tenants=8",
            "--decisions=2000",
            "--propagation-samples=3",
            "--json",
        ])
        .env("TESSERA_LOG", "warn")
        .output()
        .expect("tessera bench federation");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = String::from_utf8_lossy(&out.stdout);
    let r: serde_json::Value = serde_json::from_str(line.trim()).expect("one JSON line");
    assert_eq!(r["nodes"], 10);
    assert_eq!(r["pods"], 40);
    for f in [
        "pods_per_sec",
        "single_shard_pods_per_sec",
        "per_pod_cost_ratio",
        "cpu_us_per_pod",
        "single_shard_cpu_us_per_pod",
        "placements_per_sec",
        "propagation_p99_ms",
    ] {
        assert!(r[f].as_f64().is_some_and(|v| v > 0.0), "{f}: {r}");
    }
    let u = r["utilization_vs_global"].as_f64().expect("utilization");
    assert!(u > 0.5 && u <= 1.2, "{r}");
    // Both runs' memory: the single shard ran in a child process of its own.
    for f in ["peak_rss_bytes", "single_shard_peak_rss_bytes"] {
        assert!(r[f].as_u64().is_some_and(|b| b > 1 << 20), "{f}: {r}");
    }
    assert!(
        r["single_shard_api_writes_per_pod"]
            .as_f64()
            .is_some_and(|w| w >= 3.0),
        "at least a pod's create, binding and status per pod: {r}"
    );
    assert!(
        r["idle_cpu_cores"].as_f64().is_some_and(|c| c >= 0.0),
        "{r}"
    );
    // Idle was measured once only heartbeats were written, within the minute it may wait.
    assert!(
        r["idle_settle_secs"]
            .as_f64()
            .is_some_and(|s| (2.0..=62.0).contains(&s)),
        "{r}"
    );
    // At rest each shard's hollow nodes renew one shared Lease per 10 s: at most 0.3 writes
    // a second for two shards over the 10 s window (with a Lease per node, ten nodes would
    // make 1.0).
    assert!(
        r["idle_writes_per_sec"]["update leases"]
            .as_f64()
            .unwrap_or(0.0)
            <= 0.3,
        "{r}"
    );
}

#[test]
fn replicas_spread_over_regions_within_min_and_max_groups() {
    let (c, _) = start_with(&["--shard-labels=region=eu;region=eu;region=us"]);
    let regions = c.ok(&["get", "shards", "--no-headers"]);
    assert_eq!(
        regions.lines().filter(|l| l.contains(" eu ")).count(),
        2,
        "{regions}"
    );
    assert_eq!(
        regions.lines().filter(|l| l.contains(" us ")).count(),
        1,
        "{regions}"
    );
    c.ok(&["create", "namespace", "geo"]);
    let placement = |name: &str, workload: &str, spread: &str| {
        c.file(
            &format!("{name}.yaml"),
            &format!(
                "apiVersion: tessera.io/v1alpha1\nkind: Placement\nmetadata: {{name: {name}, namespace: geo}}\nspec:\n  resourceSelectors: [{{kind: Deployment, name: {workload}}}]\n  replicas: {{scheduling: Divided, division: Capacity}}\n  spreadConstraints: [{spread}]\n"
            ),
        )
    };
    // At least two regions: both get replicas.
    c.ok(&[
        "apply",
        "-f",
        &placement("both", "both", "{spreadByLabel: region, minGroups: 2}"),
    ]);
    c.ok(&[
        "create",
        "deployment",
        "both",
        "-n",
        "geo",
        "--image=nginx",
        "--replicas=6",
    ]);
    // (The Placement may reach the controller just after the Deployment: it is placed again
    // then, so the spread is waited for.)
    let both = wait_for(Duration::from_secs(60), || {
        let s = spread(&c, "geo", "both");
        let (eu, us) = (s[0].unwrap_or(0) + s[1].unwrap_or(0), s[2].unwrap_or(0));
        (eu > 0 && us > 0 && eu + us == 6).then_some(s)
    });
    assert!(
        both.is_some(),
        "both regions: {:?}",
        spread(&c, "geo", "both")
    );
    c.ok(&[
        "rollout",
        "status",
        "deployment/both",
        "-n",
        "geo",
        "--timeout=90s",
    ]);
    // At most one region: all in one.
    c.ok(&[
        "apply",
        "-f",
        &placement("one", "one", "{spreadByLabel: region, maxGroups: 1}"),
    ]);
    c.ok(&[
        "create",
        "deployment",
        "one",
        "-n",
        "geo",
        "--image=nginx",
        "--replicas=6",
    ]);
    let one = wait_for(Duration::from_secs(60), || {
        let s = spread(&c, "geo", "one");
        let (eu, us) = (s[0].unwrap_or(0) + s[1].unwrap_or(0), s[2].unwrap_or(0));
        (eu == 6 && us == 0 || eu == 0 && us == 6).then_some(s)
    });
    assert!(
        one.is_some(),
        "one region only: {:?}",
        spread(&c, "geo", "one")
    );
    c.ok(&[
        "rollout",
        "status",
        "deployment/one",
        "-n",
        "geo",
        "--timeout=90s",
    ]);
    // Three regions cannot be had: refused, naming the regions there are.
    let refused = c.fails(&[
        "apply",
        "-f",
        &placement("three", "x", "{spreadByLabel: region, minGroups: 3}"),
    ]);
    assert!(
        refused.contains("spec.spreadConstraints[0].minGroups") && refused.contains("(eu, us)"),
        "{refused}"
    );
    // A spread with Home is refused: it spreads nothing.
    let home = c.file(
        "home.yaml",
        "apiVersion: tessera.io/v1alpha1\nkind: Placement\nmetadata: {name: home, namespace: geo}\nspec:\n  resourceSelectors: [{kind: Deployment, name: other}]\n  spreadConstraints: [{spreadByLabel: region, minGroups: 2}]\n",
    );
    let refused = c.fails(&["apply", "-f", &home]);
    assert!(refused.contains("Duplicated or Divided"), "{refused}");
}

/// In which shards `kind ns/name` has a copy.
fn copies_of(c: &Cluster, kind: &str, ns: &str, name: &str) -> Vec<&'static str> {
    SHARDS
        .into_iter()
        .filter(|s| {
            c.kubectl(&["--context", s, "get", kind, name, "-n", ns])
                .status
                .success()
        })
        .collect()
}

#[test]
fn statefulsets_jobs_and_cronjobs_run_whole_in_one_shard() {
    let (c, _) = start();
    c.ok(&["create", "namespace", "batch"]);
    // A StatefulSet of 3: all its ordinals in one shard, rolled out as seen at the federation.
    let sts = c.file(
        "sts.yaml",
        "apiVersion: apps/v1\nkind: StatefulSet\nmetadata: {name: db, namespace: batch}\nspec:\n  replicas: 3\n  serviceName: db\n  selector: {matchLabels: {app: db}}\n  template:\n    metadata: {labels: {app: db}}\n    spec: {containers: [{name: c, image: postgres}]}\n",
    );
    c.ok(&["apply", "-f", &sts]);
    c.ok(&[
        "rollout",
        "status",
        "statefulset/db",
        "-n",
        "batch",
        "--timeout=90s",
    ]);
    let holders = copies_of(&c, "statefulset", "batch", "db");
    assert_eq!(
        holders.len(),
        1,
        "one shard runs every ordinal: {holders:?}"
    );
    let ready = c.ok(&[
        "get",
        "sts",
        "db",
        "-n",
        "batch",
        "-o",
        "jsonpath={.status.readyReplicas}",
    ]);
    assert_eq!(ready, "3", "the federation's status is the shard's");
    let pods = c.ok(&["get", "pods", "-n", "batch", "-l", "app=db", "--no-headers"]);
    for ordinal in ["db-0", "db-1", "db-2"] {
        assert!(pods.contains(ordinal), "{ordinal} missing: {pods}");
    }
    assert!(pods.lines().all(|l| l.contains(holders[0])), "{pods}");

    // A Job of 4 completions, 2 at a time: in one shard, Complete at the federation.
    let job = c.file(
        "job.yaml",
        "apiVersion: batch/v1\nkind: Job\nmetadata: {name: etl, namespace: batch}\nspec:\n  completions: 4\n  parallelism: 2\n  template:\n    metadata:\n      annotations: {tessera.io/sim-run-seconds: \"1\"}\n    spec:\n      restartPolicy: Never\n      containers: [{name: c, image: busybox}]\n",
    );
    c.ok(&["apply", "-f", &job]);
    c.ok(&[
        "wait",
        "--for=condition=Complete",
        "job/etl",
        "-n",
        "batch",
        "--timeout=90s",
    ]);
    assert_eq!(copies_of(&c, "job", "batch", "etl").len(), 1);
    let succeeded = c.ok(&[
        "get",
        "job",
        "etl",
        "-n",
        "batch",
        "-o",
        "jsonpath={.status.succeeded}",
    ]);
    assert_eq!(succeeded, "4");

    // A CronJob lands whole in one shard.
    let cron = c.file(
        "cron.yaml",
        "apiVersion: batch/v1\nkind: CronJob\nmetadata: {name: tick, namespace: batch}\nspec:\n  schedule: \"0 3 * * *\"\n  jobTemplate:\n    spec:\n      template:\n        spec:\n          restartPolicy: Never\n          containers: [{name: c, image: busybox}]\n",
    );
    c.ok(&["apply", "-f", &cron]);
    let placed = wait_for(Duration::from_secs(30), || {
        let h = copies_of(&c, "cronjob", "batch", "tick");
        (h.len() == 1).then_some(h)
    });
    assert!(placed.is_some(), "the CronJob is in exactly one shard");

    // Dividing a kind that runs whole is refused where it is named, and a Placement that
    // divides every kind leaves a new Job waiting with the reason (nothing runs).
    let bad = c.file(
        "divide-job.yaml",
        "apiVersion: tessera.io/v1alpha1\nkind: Placement\nmetadata: {name: bad, namespace: batch}\nspec:\n  resourceSelectors: [{kind: Job}]\n  replicas: {scheduling: Divided, division: Capacity}\n",
    );
    let err = c.fails(&["apply", "-f", &bad]);
    assert!(err.contains("a Job runs whole"), "{err}");
    let divide_all = c.file(
        "divide-all.yaml",
        "apiVersion: tessera.io/v1alpha1\nkind: Placement\nmetadata: {name: split, namespace: batch}\nspec:\n  resourceSelectors: [{labelSelector: {matchLabels: {split: \"yes\"}}}]\n  replicas: {scheduling: Divided, division: Capacity}\n",
    );
    c.ok(&["apply", "-f", &divide_all]);
    let job2 = c.file(
        "job2.yaml",
        "apiVersion: batch/v1\nkind: Job\nmetadata: {name: split-job, namespace: batch, labels: {split: \"yes\"}}\nspec:\n  template:\n    spec:\n      restartPolicy: Never\n      containers: [{name: c, image: busybox}]\n",
    );
    c.ok(&["apply", "-f", &job2]);
    let reason = wait_for(Duration::from_secs(30), || {
        let r = placed_field(&c, "job", "batch", "split-job", "reason");
        (r == "PolicyNotApplicable").then_some(r)
    });
    assert!(
        reason.is_some(),
        "{}",
        c.ok(&["get", "job", "split-job", "-n", "batch", "-o", "yaml"])
    );
    assert!(copies_of(&c, "job", "batch", "split-job").is_empty());

    // Delete propagates for each kind.
    c.ok(&[
        "delete",
        "sts/db",
        "job/etl",
        "cronjob/tick",
        "-n",
        "batch",
        "--timeout=60s",
    ]);
    for (kind, name) in [("statefulset", "db"), ("job", "etl"), ("cronjob", "tick")] {
        let gone = wait_for(Duration::from_secs(30), || {
            copies_of(&c, kind, "batch", name).is_empty().then_some(())
        });
        assert!(gone.is_some(), "{kind}/{name} still in a shard");
    }
}

#[test]
fn a_tenants_quota_holds_over_the_whole_fleet() {
    let (c, _) = start();
    let tenant = c.file(
        "acme.yaml",
        "apiVersion: tessera.io/v1alpha1\nkind: Tenant\nmetadata: {name: acme}\nspec:\n  namespaces: [acme-a]\n  quota: {cpu: \"12\"}\n",
    );
    c.ok(&["apply", "-f", &tenant]);
    c.ok(&["create", "namespace", "acme-a"]);
    // Two Deployments pinned to two different shards, 4 cpu a replica: each shard alone
    // would let either run (12 cpu is the tenant's quota in each shard too), the fleet not.
    let deploy = |name: &str, shard: &str, replicas: u32| {
        let yaml = format!(
            "apiVersion: tessera.io/v1alpha1\nkind: Placement\nmetadata: {{name: {name}, namespace: acme-a}}\nspec:\n  resourceSelectors: [{{kind: Deployment, name: {name}}}]\n  shardAffinity: {{shardNames: [{shard}]}}\n---\napiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: {name}, namespace: acme-a}}\nspec:\n  replicas: {replicas}\n  selector: {{matchLabels: {{app: {name}}}}}\n  template:\n    metadata: {{labels: {{app: {name}}}}}\n    spec: {{containers: [{{name: c, image: nginx, resources: {{requests: {{cpu: \"4\"}}}}}}]}}\n"
        );
        let f = c.file(&format!("{name}.yaml"), &yaml);
        c.ok(&["apply", "-f", &f]);
    };
    deploy("first", "shard-0", 2);
    c.ok(&[
        "rollout",
        "status",
        "deployment/first",
        "-n",
        "acme-a",
        "--timeout=90s",
    ]);
    deploy("second", "shard-1", 3);
    let why = wait_for(Duration::from_secs(30), || {
        let m = placed_field(&c, "deploy", "acme-a", "second", "message");
        m.contains("quota").then_some(m)
    });
    let why = why.unwrap_or_default();
    assert!(
        why.contains("tenant \"acme\" quota: 2 more replica(s) of cpu 4 would exceed cpu (placed 8 of 12 fleet-wide)"),
        "{why}"
    );
    // The shard runs the one replica that fits, not three.
    assert_eq!(replicas_in(&c, "shard-1", "acme-a", "second"), Some(1));
    let used = wait_for(Duration::from_secs(30), || {
        let u = c.ok(&["get", "tenant", "acme", "-o", "jsonpath={.status.used.cpu}"]);
        (u == "12").then_some(u)
    });
    assert!(
        used.is_some(),
        "the federation's Tenant shows the fleet's usage: {}",
        c.ok(&["get", "tenant", "acme", "-o", "yaml"])
    );
    let events = c.ok(&["get", "events", "-n", "acme-a"]);
    assert!(events.contains("FailedPlacement"), "{events}");

    // Room in the quota frees: the held replicas are placed without any other change.
    c.ok(&["scale", "deployment/first", "-n", "acme-a", "--replicas=0"]);
    let placed = wait_for(Duration::from_secs(60), || {
        (replicas_in(&c, "shard-1", "acme-a", "second") == Some(3)).then_some(())
    });
    assert!(placed.is_some(), "second should get all 3 replicas");
    c.ok(&[
        "rollout",
        "status",
        "deployment/second",
        "-n",
        "acme-a",
        "--timeout=90s",
    ]);
    // A raised quota lets more in: scaled past it, then raised.
    c.ok(&["scale", "deployment/second", "-n", "acme-a", "--replicas=4"]);
    let held = wait_for(Duration::from_secs(30), || {
        let m = placed_field(&c, "deploy", "acme-a", "second", "reason");
        (m == "QuotaExceeded").then_some(m)
    });
    assert!(held.is_some(), "the fourth replica is held by the quota");
    assert_eq!(replicas_in(&c, "shard-1", "acme-a", "second"), Some(3));
    c.ok(&[
        "patch",
        "tenant",
        "acme",
        "--type=merge",
        "-p",
        "{\"spec\":{\"quota\":{\"cpu\":\"16\"}}}",
    ]);
    let placed = wait_for(Duration::from_secs(60), || {
        (replicas_in(&c, "shard-1", "acme-a", "second") == Some(4)).then_some(())
    });
    assert!(placed.is_some(), "a raised quota places the held replica");
}

#[test]
fn a_replica_pinned_to_a_zone_is_placed_by_that_zones_room() {
    let (c, _) = start();
    // Zones in the shards: shard-0 and shard-1 have 3 nodes each in zone a, the rest in b;
    // shard-2 has no zone a. Summaries group nodes by topology.kubernetes.io/zone.
    for (shard, zoned) in [("shard-0", 3), ("shard-1", 3), ("shard-2", 0)] {
        let names = c.ok(&["--context", shard, "get", "nodes", "-o", "name"]);
        for (i, node) in names.lines().enumerate() {
            let zone = if i < zoned { "a" } else { "b" };
            c.ok(&[
                "--context",
                shard,
                "label",
                "--overwrite",
                node,
                &format!("topology.kubernetes.io/zone={zone}"),
            ]);
        }
    }
    c.ok(&["create", "namespace", "zoned"]);
    // 8 replicas of 4 cpu in zone a: 6 fit in the zone-a nodes of two shards (3 × 8 cpu
    // = 6 replicas each), so the home shard takes 6 and the next one 2 — never shard-2,
    // and never more than a shard's zone holds, though each shard has room for 20.
    let yaml = "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: pinned, namespace: zoned}\nspec:\n  replicas: 8\n  selector: {matchLabels: {app: pinned}}\n  template:\n    metadata: {labels: {app: pinned}}\n    spec:\n      nodeSelector: {topology.kubernetes.io/zone: a}\n      containers: [{name: c, image: nginx, resources: {requests: {cpu: \"4\"}}}]\n";
    let f = c.file("pinned.yaml", yaml);
    // Wait for summaries that carry the zones (labels are seen within a summary period).
    let grouped = wait_for(Duration::from_secs(30), || {
        let d = c.ok(&["describe", "shard", "shard-2"]);
        d.contains("topology.kubernetes.io/zone").then_some(d)
    });
    assert!(grouped.is_some(), "summaries should group nodes by zone");
    c.ok(&["apply", "-f", &f]);
    c.ok(&[
        "rollout",
        "status",
        "deployment/pinned",
        "-n",
        "zoned",
        "--timeout=90s",
    ]);
    let s = spread(&c, "zoned", "pinned");
    assert_eq!(s[2], None, "shard-2 has no zone a: {s:?}");
    let mut shares: Vec<u64> = s.iter().flatten().copied().collect();
    shares.sort();
    assert_eq!(shares, [2, 6], "the home shard's zone a holds 6: {s:?}");
    // Scaled past every zone a: the rest waits at the federation, not Pending in a shard.
    c.ok(&["scale", "deployment/pinned", "-n", "zoned", "--replicas=14"]);
    let why = wait_for(Duration::from_secs(30), || {
        let m = placed_field(&c, "deploy", "zoned", "pinned", "message");
        m.contains("2/3 shards fit 2 more").then_some(m)
    });
    assert!(
        why.as_deref()
            .is_some_and(|m| m.contains("on topology.kubernetes.io/zone=a")),
        "{why:?}"
    );
    let s = spread(&c, "zoned", "pinned");
    assert_eq!(s.iter().flatten().sum::<u64>(), 12, "{s:?}");
    let available = wait_for(Duration::from_secs(60), || {
        let a = c.ok(&[
            "get",
            "deploy",
            "pinned",
            "-n",
            "zoned",
            "-o",
            "jsonpath={.status.availableReplicas}",
        ]);
        (a == "12").then_some(a)
    });
    assert!(available.is_some(), "the 12 placed replicas run");
    let pending = c.ok(&[
        "get",
        "pods",
        "-n",
        "zoned",
        "--field-selector=status.phase=Pending",
        "--no-headers",
    ]);
    assert!(
        pending.trim().is_empty(),
        "no pod waits in a shard: {pending}"
    );
}

#[test]
fn an_extension_api_server_serves_through_the_federation() {
    use support::extension::{self, GROUP, VERSION};
    let (c, _) = start();
    c.ok(&["create", "namespace", "shop"]);
    // Installed at the federation as at a shard: the federation's own front proxy, its
    // ConfigMap, its Service and Endpoints.
    let installed = extension::install(&c);
    let flunder = c.file(
        "flunder.yaml",
        &format!("apiVersion: {GROUP}/{VERSION}\nkind: Flunder\nmetadata: {{name: first}}\n"),
    );
    c.ok(&["create", "-f", &flunder, "-n", "shop"]);
    let got: Value =
        serde_json::from_str(&c.ok(&["get", "flunder", "first", "-n", "shop", "-o", "json"]))
            .expect("JSON");
    assert_eq!(
        got["metadata"]["annotations"]["wardle.example.com/created-by"],
        "admin"
    );
    assert!(
        c.ok(&["api-resources", "--api-group", GROUP])
            .contains("flunders")
    );
    // APIServices are the federation's own: a shard does not serve the group.
    let err = c.fails(&["--context", SHARDS[0], "get", "flunders", "-n", "shop"]);
    assert!(
        err.contains("the server doesn't have a resource type"),
        "{err}"
    );
    drop(installed);
}
