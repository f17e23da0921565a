//! `tessera up` as a real process: it opens the embedded store, says what it runs (the API,
//! the scheduler, the controllers, simulated nodes), and serves
//! Prometheus metrics and health on its metrics address and gRPC health on its gRPC address.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::Duration;

mod support;

use support::{Running, free_addr, up_command};

fn http_get(addr: &str, path: &str) -> String {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .expect("send");
    let mut body = String::new();
    s.read_to_string(&mut body).expect("read");
    body
}

/// Group and other permission bits of everything under `dir` that has any (symlinks aside).
fn readable_by_others(dir: &std::path::Path) -> Vec<String> {
    use std::os::unix::fs::PermissionsExt;
    let mut loose = Vec::new();
    let mut todo = vec![dir.to_owned()];
    while let Some(p) = todo.pop() {
        let meta = std::fs::symlink_metadata(&p).expect("meta");
        if meta.file_type().is_symlink() {
            continue;
        }
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            loose.push(format!("{} {mode:o}", p.display()));
        }
        if meta.is_dir() {
            todo.extend(
                std::fs::read_dir(&p)
                    .expect("dir")
                    .map(|e| e.expect("entry").path()),
            );
        }
    }
    loose
}

#[test]
fn up_serves_metrics_for_its_store() {
    let dir = tempfile::tempdir().expect("tempdir");
    // A data directory left world-readable (as earlier versions made them): taken back.
    {
        use std::os::unix::fs::PermissionsExt;
        let pki = dir.path().join("pki");
        std::fs::create_dir_all(&pki).expect("pki");
        std::fs::write(pki.join("notes"), "old").expect("file");
        for (p, m) in [
            (dir.path().to_owned(), 0o755),
            (pki.clone(), 0o755),
            (pki.join("notes"), 0o644),
        ] {
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(m)).expect("chmod");
        }
    }
    let addr = free_addr();
    let grpc_addr = free_addr();
    let mut child = up_command(&addr, &grpc_addr, dir.path())
        .env("TESSERA_LOG", "warn")
        .stdout(Stdio::piped())
        .spawn()
        .map(Running)
        .expect("start tessera up");
    let mut lines = BufReader::new(child.0.stdout.take().expect("stdout")).lines();
    let mut banner = Vec::new();
    for line in lines.by_ref() {
        let line = line.expect("line");
        let done = line.starts_with("Press Ctrl-C");
        banner.push(line);
        if done {
            break;
        }
    }
    let banner = banner.join("\n");
    // The store, the credentials, the kubeconfig and the logs: the owner's only.
    let loose = readable_by_others(dir.path());
    assert!(loose.is_empty(), "readable by others: {loose:?}");
    assert!(
        banner.contains("store:    embedded at revision"),
        "{banner}"
    );
    for part in [
        "scheduler:   running",
        "controllers: running",
        "nodes:       300 simulated",
    ] {
        assert!(
            banner.contains(part),
            "says what it runs ({part}): {banner}"
        );
    }
    let kubeconfig = dir.path().join("kubeconfig");
    assert!(
        banner.contains(&format!("export KUBECONFIG={}", kubeconfig.display())),
        "{banner}"
    );

    // The real kubectl, over TLS with the CA and token from the kubeconfig tessera wrote.
    let kubectl = |config: &std::path::Path, args: &[&str]| {
        Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(config)
            .arg("--cache-dir")
            .arg(dir.path().join("kubectl-cache"))
            .args(args)
            .output()
            .expect("run kubectl")
    };
    let out = kubectl(&kubeconfig, &["api-resources", "-o", "name"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let names = String::from_utf8_lossy(&out.stdout);
    assert!(names.lines().any(|l| l == "deployments.apps"), "{names}");
    // Objects: create, list, get, delete through kubectl, answered from the store.
    let ok = |args: &[&str]| {
        let out = kubectl(&kubeconfig, args);
        assert!(
            out.status.success(),
            "kubectl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    // `create -f` sends JSON through kubectl's dynamic client (tests/kubectl.rs drives the
    // rest of kubectl).
    let manifest = dir.path().join("objects.yaml");
    std::fs::write(
        &manifest,
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: demo\n---\n\
         apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\n  namespace: demo\n\
         data:\n  mode: fast\n",
    )
    .expect("manifest");
    let manifest = manifest.to_string_lossy().into_owned();
    let created = ok(&["create", "-f", &manifest]);
    assert_eq!(
        created.lines().collect::<Vec<_>>(),
        ["namespace/demo created", "configmap/settings created"]
    );
    let listed = ok(&["get", "namespaces"]);
    assert!(listed.lines().any(|l| l.starts_with("demo ")), "{listed}");
    let json = ok(&["get", "configmap", "settings", "-n", "demo", "-o", "json"]);
    assert!(json.contains("\"mode\": \"fast\""), "{json}");
    assert!(json.contains("\"uid\""), "{json}");
    // Listed with (or, if it is not published yet, without) the kube-root-ca.crt that every
    // namespace holds.
    let names = ok(&["get", "configmaps", "-n", "demo", "-o", "name"]);
    let mut names: Vec<&str> = names.lines().collect();
    names.retain(|n| *n != "configmap/kube-root-ca.crt");
    assert_eq!(names, ["configmap/settings"]);
    let out = kubectl(&kubeconfig, &["create", "-f", &manifest]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("configmaps \"settings\" already exists"),
        "{err}"
    );
    let more = dir.path().join("more.yaml");
    std::fs::write(
        &more,
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n  namespace: nowhere\n---\n\
         apiVersion: v1\nkind: Namespace\nmetadata:\n  name: Bad_Name\n",
    )
    .expect("manifest");
    let more = more.to_string_lossy().into_owned();
    let out = kubectl(&kubeconfig, &["create", "-f", &more]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("namespaces \"nowhere\" not found"), "{err}");
    assert!(err.contains("RFC 1123"), "{err}");

    // `get -w` sees a replace and a delete; a replace with a stale resourceVersion is refused.
    let watch_out = dir.path().join("watch.out");
    let watcher = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .arg("--cache-dir")
        .arg(dir.path().join("kubectl-cache"))
        .args(["get", "configmaps", "-n", "demo", "-w"])
        .stdout(std::fs::File::create(&watch_out).expect("watch output"))
        .stderr(Stdio::null())
        .spawn()
        .map(Running)
        .expect("start kubectl get -w");
    let replacement = dir.path().join("replace.yaml");
    let write_cm = |mode: &str, rv: Option<&str>| {
        let rv = rv.map_or(String::new(), |rv| format!("  resourceVersion: \"{rv}\"\n"));
        std::fs::write(
            &replacement,
            format!(
                "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\n  namespace: demo\n{rv}data:\n  mode: {mode}\n"
            ),
        )
        .expect("manifest");
        replacement.to_string_lossy().into_owned()
    };
    let rv_before = ok(&[
        "get",
        "configmap",
        "settings",
        "-n",
        "demo",
        "-o",
        "jsonpath={.metadata.resourceVersion}",
    ]);
    let path = write_cm("slow", None);
    assert_eq!(
        ok(&["replace", "-f", &path]).trim(),
        "configmap/settings replaced"
    );
    let mode = ok(&[
        "get",
        "configmap",
        "settings",
        "-n",
        "demo",
        "-o",
        "jsonpath={.data.mode}",
    ]);
    assert_eq!(mode, "slow");
    let stale = write_cm("stale", Some(rv_before.trim()));
    let out = kubectl(&kubeconfig, &["replace", "-f", &stale]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("the object has been modified"), "{err}");
    assert_eq!(
        ok(&["delete", "configmap", "settings", "-n", "demo"]).trim(),
        "configmap \"settings\" deleted"
    );
    // The initial row, the replace and the delete (bounded wait for delivery: 20 s).
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let rows = loop {
        let text = std::fs::read_to_string(&watch_out).unwrap_or_default();
        let rows = text.lines().filter(|l| l.starts_with("settings")).count();
        if rows >= 3 || std::time::Instant::now() > deadline {
            break rows;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    drop(watcher);
    assert_eq!(
        rows,
        3,
        "get -w output: {}",
        std::fs::read_to_string(&watch_out).unwrap_or_default()
    );
    let again = write_cm("fast", None);
    let created = ok(&["create", "-f", &again]);
    assert_eq!(created.trim(), "configmap/settings created");
    assert_eq!(
        ok(&["delete", "configmap", "settings", "-n", "demo"]).trim(),
        "configmap \"settings\" deleted"
    );
    let out = kubectl(&kubeconfig, &["get", "configmap", "settings", "-n", "demo"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("configmaps \"settings\" not found"), "{err}");

    // A wrong token is refused.
    let text = std::fs::read_to_string(&kubeconfig).expect("kubeconfig");
    let token_line = text
        .lines()
        .find(|l| l.trim_start().starts_with("token:"))
        .expect("a token line");
    let bad = dir.path().join("bad-kubeconfig");
    std::fs::write(&bad, text.replace(token_line, "    token: not-the-token")).expect("write");
    let out = kubectl(&bad, &["api-resources"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("You must be logged in to the server"), "{err}");

    let metrics = http_get(&addr, "/metrics");
    assert!(metrics.starts_with("HTTP/1.1 200"), "{metrics}");
    assert!(
        metrics
            .lines()
            .find_map(|l| l.strip_prefix("tessera_store_revision{backend=\"embedded\"} "))
            .and_then(|v| v.parse::<i64>().ok())
            .is_some_and(|rev| rev >= 3),
        "{metrics}"
    );
    assert!(metrics.contains("tessera_store_embedded_recovery_duration_seconds_count 1"));
    let health = http_get(&addr, "/healthz");
    assert!(
        health.starts_with("HTTP/1.1 200") && health.ends_with("ok"),
        "{health}"
    );

    // gRPC health, as Kubernetes' gRPC probes ask it.
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        use tessera_proto::health::v1::HealthCheckRequest;
        use tessera_proto::health::v1::health_check_response::ServingStatus;
        use tessera_proto::health::v1::health_client::HealthClient;
        let mut client = HealthClient::connect(format!("http://{grpc_addr}"))
            .await
            .expect("connect to gRPC");
        for service in ["", "tessera.store"] {
            let resp = client
                .check(HealthCheckRequest {
                    service: service.into(),
                })
                .await
                .expect("check");
            assert_eq!(
                resp.get_ref().status,
                ServingStatus::Serving as i32,
                "{service:?}"
            );
        }
        let err = client
            .check(HealthCheckRequest {
                service: "no.such.service".into(),
            })
            .await
            .expect_err("unknown service");
        assert_eq!(err.code(), tonic::Code::NotFound);
        let mut watch = client
            .watch(HealthCheckRequest {
                service: String::new(),
            })
            .await
            .expect("watch")
            .into_inner();
        let first = watch
            .message()
            .await
            .expect("stream")
            .expect("first status");
        assert_eq!(first.status, ServingStatus::Serving as i32);
    });

    // A second process on the same data directory is refused with a clear message.
    let second = up_command("127.0.0.1:0", "127.0.0.1:0", dir.path())
        .env("TESSERA_LOG", "error")
        .output()
        .expect("run a second tessera up");
    assert!(!second.status.success());
    let err = String::from_utf8_lossy(&second.stderr);
    assert!(err.contains("another tessera process"), "{err}");

    drop(child);
    assert!(dir.path().join("store").join("LOCK").exists());
}

/// The sharded layout as an operator configures it: default cluster, an events override and a
/// tenant shard, each a real etcd process.
#[test]
fn up_opens_a_sharded_etcd_layout_from_flags() {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let (a, b) = rt.block_on(async {
        let (a, b) = tokio::join!(
            tessera_store::testing::EtcdProcess::start(),
            tessera_store::testing::EtcdProcess::start()
        );
        (a.expect("etcd a"), b.expect("etcd b"))
    });
    let dir = tempfile::tempdir().expect("tempdir");
    let overrides = format!("/events#{}", b.url());
    let mut child = up_command("127.0.0.1:0", "127.0.0.1:0", dir.path())
        .args(["--store", "etcd", "--etcd-servers", &a.url()])
        .args(["--etcd-servers-overrides", &overrides])
        .args(["--tenant-shards", &b.url()])
        .env("TESSERA_LOG", "warn")
        .stdout(Stdio::piped())
        .spawn()
        .map(Running)
        .expect("start tessera up");
    let mut lines = BufReader::new(child.0.stdout.take().expect("stdout")).lines();
    let store_line = lines
        .by_ref()
        .map(|l| l.expect("line"))
        .find(|l| l.trim_start().starts_with("store:"))
        .expect("a store line");
    drop(child);
    // Three backends: a composite revision with three parts.
    assert!(
        store_line.contains("sharded at revision c."),
        "{store_line}"
    );
    assert_eq!(store_line.matches('.').count(), 3, "{store_line}");

    // A malformed layout is refused before anything starts, saying what to fix.
    let bad = up_command("127.0.0.1:0", "127.0.0.1:0", dir.path())
        .args(["--store", "etcd", "--etcd-servers", &a.url()])
        .args(["--tenant-shards", "c:2379"])
        .output()
        .expect("run");
    assert!(!bad.status.success());
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(
        err.contains("--tenant-shards") && err.contains("http://host:port"),
        "{err}"
    );
}

/// Every file's bytes under `dir`, concatenated.
fn all_bytes(dir: &std::path::Path) -> Vec<u8> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_owned()];
    while let Some(p) = todo.pop() {
        if p.is_dir() {
            todo.extend(
                std::fs::read_dir(&p)
                    .expect("dir")
                    .map(|e| e.expect("entry").path()),
            );
        } else if let Ok(b) = std::fs::read(&p) {
            out.extend_from_slice(&b);
        }
    }
    out
}

fn contains(hay: &[u8], needle: &str) -> bool {
    hay.windows(needle.len()).any(|w| w == needle.as_bytes())
}

/// `--encryption-provider-config`: a Secret's value never reaches the disk in the clear
/// (neither as written nor base64-encoded), survives a kill -9, and reads back through the
/// API; a ConfigMap, not listed, is stored as it is — which shows the scan reads the store.
#[test]
fn secrets_are_encrypted_at_rest() {
    let keys = tempfile::tempdir().expect("tmp");
    let config = keys.path().join("encryption.yaml");
    std::fs::write(
        &config,
        "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n- resources: [secrets]\n  providers:\n  - aesgcm:\n      keys:\n      - name: key1\n        secret: MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=\n  - identity: {}\n",
    )
    .expect("config");
    let config = config.display().to_string();
    let mut c = support::Cluster::start_with(
        "up",
        &[
            "--nodes-per-shard=0",
            "--encryption-provider-config",
            &config,
        ],
    );
    c.ok(&[
        "create",
        "secret",
        "generic",
        "db",
        "--from-literal=password=PLAINTEXT-S3CR3T",
    ]);
    c.ok(&[
        "create",
        "configmap",
        "cfg",
        "--from-literal=k=PLAIN-CONFIG-VALUE",
    ]);
    let read =
        |c: &support::Cluster| c.ok(&["get", "secret", "db", "-o", "jsonpath={.data.password}"]);
    // base64 of PLAINTEXT-S3CR3T, as the Secret's data holds it.
    let encoded = "UExBSU5URVhULVMzQ1IzVA==";
    assert_eq!(read(&c), encoded);
    let disk = all_bytes(&c.dir.path().join("store"));
    assert!(
        contains(&disk, "PLAIN-CONFIG-VALUE"),
        "the scan sees the store"
    );
    assert!(contains(&disk, "k8s:enc:aesgcm:v1:key1:"));
    assert!(
        !contains(&disk, encoded),
        "the Secret's value is not on disk"
    );
    assert!(!contains(&disk, "PLAINTEXT-S3CR3T"));
    c.kill_and_restart();
    assert_eq!(read(&c), encoded, "read back after a kill -9");
}

/// Runs `tessera bench ARGS --json` quietly; its one line of JSON (the run must succeed).
fn bench_json(args: &[&str]) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .arg("bench")
        .args(args)
        .arg("--json")
        .env("TESSERA_LOG", "warn")
        .output()
        .expect("tessera bench");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(String::from_utf8_lossy(&out.stdout).trim()).expect("one JSON line")
}

/// `tessera bench queue` runs and reports what events cost: none of the parked pods waits
/// for the node-label changes it sends, so none is woken.
#[test]
fn the_queue_benchmark_reports_its_figures() {
    let r = bench_json(&["queue", "--pending=2000", "--events=500"]);
    assert_eq!(r["pending"], 2000);
    assert_eq!(r["events"], 500);
    assert_eq!(r["woken"], 0, "{r}");
    assert!(r["events_per_sec"].as_f64().is_some_and(|v| v > 0.0), "{r}");
}

/// `tessera bench shard` runs a whole shard end to end — ReplicaSets of 100 through the
/// controller, the scheduler and simulated nodes sharing one set of informers — and counts
/// every pod bound and Running: with a startup delay, no pod is Running sooner after it was
/// created than the delay, and none is Running before it was bound.
#[test]
fn the_shard_benchmark_runs_every_pod_and_reports_its_figures() {
    let r = bench_json(&[
        "shard",
        "--nodes=20",
        "--pods=250",
        "--startup-delay-ms=200",
        "--timeout=120",
    ]);
    assert_eq!(r["pods"], 250, "{r}");
    assert_eq!(r["nodes"], 20, "{r}");
    assert!(r["pods_per_sec"].as_f64().is_some_and(|v| v > 0.0), "{r}");
    let ms = |k: &str| r[k].as_f64().unwrap_or_else(|| panic!("{k} in {r}"));
    assert!(ms("startup_p50_ms") >= 200.0, "{r}");
    assert!(ms("schedule_p50_ms") <= ms("startup_p50_ms"), "{r}");
    assert!(ms("schedule_p99_ms") <= ms("startup_p99_ms"), "{r}");
}

/// `tessera bench scheduler` runs its workloads against the real API and scheduler: every
/// measured pod is bound, the report has scheduler_perf's figures, and in `tenants` the
/// refilled shard is split by weight within 5% (weights 1 to 4 over 8 tenants, 1,000 pods).
#[test]
fn the_scheduler_benchmark_binds_every_pod_and_shares_by_weight() {
    let run = |args: &[&str]| -> serde_json::Value {
        bench_json(&[&["scheduler", "--timeout=300"], args].concat())
    };
    let r = run(&[
        "--workload=node-affinity",
        "--nodes=50",
        "--pods=300",
        "--init-pods=50",
        "--workers=3",
    ]);
    assert_eq!(r["workload"], "node-affinity", "{r}");
    assert_eq!(
        (r["pods"].as_u64(), r["workers"].as_u64()),
        (Some(300), Some(3))
    );
    assert!(r["conflicts"].as_u64().is_some(), "{r}");
    assert!(r["pods_per_sec"].as_f64().is_some_and(|v| v > 0.0), "{r}");
    assert!(
        r["schedule_p99_ms"].as_f64().is_some_and(|v| v >= 0.0),
        "{r}"
    );
    // Anti-affinity: every pod on a node of its own (init pods too), checked by the bench.
    let r = run(&[
        "--workload=anti-affinity",
        "--nodes=60",
        "--pods=40",
        "--init-pods=20",
    ]);
    assert_eq!(r["checked"], "60 pods on 60 distinct nodes", "{r}");
    // One pod too many for one per node: the bench does not finish.
    let out = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args([
            "bench",
            "scheduler",
            "--workload=anti-affinity",
            "--nodes=10",
        ])
        .args(["--pods=5", "--init-pods=6", "--timeout=5"])
        .env("TESSERA_LOG", "warn")
        .output()
        .expect("tessera bench scheduler");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("only 4 of 5 pods bound"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A quarter of the nodes without a zone: the spread pods stay off them (the bench
    // checks it) and within maxSkew over the zones.
    let r = run(&[
        "--workload=topology-spread",
        "--nodes=40",
        "--unzoned-nodes=10",
        "--pods=300",
        "--init-pods=30",
    ]);
    let checked = r["checked"].as_str().unwrap_or_default();
    assert!(
        checked.starts_with("init: zones [") && checked.contains("measured: zones ["),
        "{r}"
    );
    let r = run(&[
        "--workload=tenants",
        "--nodes=50",
        "--pods=500",
        "--tenants=8",
        "--rate=2",
        "--duration=2",
        "--share-nodes=25",
    ]);
    let t = &r["tenants"];
    assert_eq!(
        (t["others_pods"].as_u64(), t["capacity"].as_u64()),
        (Some(28), Some(1000))
    );
    assert!(
        t["share_error_max_pct"].as_f64().is_some_and(|e| e <= 5.0),
        "{r}"
    );
    // Gangs: every PodGroup bound whole at one revision, or the bench fails.
    let r = run(&[
        "--workload=gang",
        "--nodes=50",
        "--pods=80",
        "--init-pods=10",
    ]);
    assert_eq!(
        r["checked"], "10 gangs of 8: each bound whole, in one transaction",
        "{r}"
    );
    // Preemption: every node full of priority-1 pods; each priority-1000 pod evicts one.
    let r = run(&["--workload=preemption", "--nodes=20", "--pods=10"]);
    assert_eq!(r["init_pods"], 80, "{r}");
    assert_eq!(
        r["checked"],
        "10 high-priority pods placed, 10 low-priority victims (one each), no node over its 4 cpu",
        "{r}"
    );
    // Zone-less nodes mean nothing to other workloads: refused before anything starts.
    let out = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args([
            "bench",
            "scheduler",
            "--workload=basic",
            "--unzoned-nodes=3",
        ])
        .output()
        .expect("tessera bench scheduler");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("--unzoned-nodes applies to --workload topology-spread only"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A worker count out of range is refused before anything starts.
    let out = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["bench", "scheduler", "--workers=0"])
        .output()
        .expect("tessera bench scheduler");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--workers 0: must be between 1 and 256"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
