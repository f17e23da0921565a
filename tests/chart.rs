//! The Helm chart (`charts/tessera`), checked without a Kubernetes cluster:
//!
//! - rendered and linted (`--strict`) by Helm's own engine for the defaults and each CI
//!   values file, linted as YAML, and every object validated against Kubernetes 1.32's
//!   schemas (`scripts/chart_check.py`); values that break the schema are refused, naming
//!   the field;
//! - the rendered PrometheusRule's groups pass `promtool check rules`;
//! - every rendered object is sent to a running `tessera up` with
//!   `kubectl apply --dry-run=server`: each kind Tessera serves is accepted as it is, and
//!   the kinds it does not serve are exactly the ones this test names (RBAC, the Prometheus
//!   operator's);
//! - the chart's layout run as processes on loopback, with the flags the chart renders: a
//!   federation on its own credentials, a shard of two API servers on a 3-member etcd with
//!   peer and client TLS, its scheduler and controller manager each active/standby, its
//!   federation agent and a node agent; kubectl at the federation rolls a Deployment out on
//!   the shard, and the shard's API keeps serving when one API server and the active
//!   scheduler are killed.

mod support;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use support::{Cluster, Running, free_addr, wait_for};

const CHART: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/charts/tessera");

/// The rendered layouts: the chart's defaults and each values file of `charts/tessera/ci`.
const LAYOUTS: [&str; 4] = [
    "default",
    "minimal-values",
    "production-values",
    "external-etcd-values",
];

fn python() -> PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join(".tools/venv/bin/python");
    assert!(
        p.is_file(),
        "{} is missing: run scripts/setup.sh",
        p.display()
    );
    p
}

/// The CI values files, and the invalid values the chart must refuse.
fn values_files() -> (Vec<String>, Vec<String>) {
    let list = |dir: &str, prefix: &str| {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .expect("read dir")
            .map(|e| e.expect("entry").path())
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(prefix) && n.ends_with(".yaml"))
            })
            .map(|p| p.to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    (
        list(&format!("{CHART}/ci"), ""),
        list(
            concat!(env!("CARGO_MANIFEST_DIR"), "/tests/chart"),
            "invalid-",
        ),
    )
}

/// Runs the chart check on the defaults and every values file; its report.
fn check_chart(out: &Path) -> Value {
    let (valid, invalid) = values_files();
    assert!(valid.len() >= 3, "{valid:?}");
    let mut cmd = Command::new(python());
    cmd.arg(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/scripts/chart_check.py"
    ))
    .arg(CHART)
    .arg("--out")
    .arg(out)
    .args(["--values", "-"]);
    for v in &valid {
        cmd.args(["--values", v]);
    }
    for v in &invalid {
        cmd.args(["--invalid", v]);
    }
    let o = cmd.output().expect("run chart_check.py");
    assert!(
        o.status.success(),
        "the chart check failed:\n{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).expect("a JSON report")
}

#[test]
fn the_chart_renders_lints_validates_and_applies_to_tessera() {
    let out = tempfile::tempdir().expect("tmp");
    let report = check_chart(out.path());

    // Each values file's layout is what it asks for.
    let kinds = |name: &str| report[name]["kinds"].clone();
    for (layout, kind, count, why) in [
        (
            "default",
            "StatefulSet",
            2,
            "the shard's etcd and the federation's",
        ),
        ("default", "DaemonSet", 1, "one shard's node agents"),
        (
            "minimal-values",
            "PersistentVolumeClaim",
            1,
            "the federation's embedded store",
        ),
        (
            "production-values",
            "StatefulSet",
            4,
            "3 shards and the federation on etcd",
        ),
        (
            "production-values",
            "ServiceMonitor",
            4,
            "the federation and 3 API servers",
        ),
        ("production-values", "PrometheusRule", 1, "the rules"),
    ] {
        assert_eq!(
            kinds(layout)[kind],
            count,
            "{layout} {kind}: {why}: {report:#}"
        );
    }
    assert!(
        kinds("minimal-values").get("PodDisruptionBudget").is_none(),
        "{report:#}"
    );
    assert!(
        kinds("external-etcd-values").get("StatefulSet").is_none(),
        "no etcd of the chart's own: {report:#}"
    );
    // Only the Prometheus operator's kinds have no Kubernetes schema.
    for (name, r) in report.as_object().expect("object") {
        if name == "invalid" {
            continue;
        }
        for k in r["no_schema"].as_array().expect("list") {
            assert!(
                k.as_str()
                    .is_some_and(|k| k.starts_with("monitoring.coreos.com/v1/")),
                "{name}: {k} was not validated"
            );
        }
    }
    // Values that break the schema are refused, naming what to fix.
    let invalid = &report["invalid"];
    let said = |file: &str| {
        invalid
            .as_object()
            .expect("object")
            .iter()
            .find(|(k, _)| k.ends_with(file))
            .map(|(_, v)| v.as_str().unwrap_or_default().to_owned())
            .unwrap_or_else(|| panic!("{file} not checked: {invalid:#}"))
    };
    assert!(
        said("invalid-shard-name.yaml").contains("/shards/0/name"),
        "{invalid:#}"
    );
    assert!(
        said("invalid-typo.yaml").contains("'replica' not allowed"),
        "{invalid:#}"
    );
    assert!(
        said("invalid-external-without-endpoints.yaml").contains("/shards/0"),
        "{invalid:#}"
    );
    assert!(
        said("invalid-federation-replicas.yaml").contains("/federation/replicas"),
        "{invalid:#}"
    );

    // The PrometheusRule the chart ships holds rules promtool accepts.
    let production = out.path().join("production-values.yaml");
    let docs = documents(&production);
    let rule = docs
        .iter()
        .find(|d| d["kind"] == "PrometheusRule")
        .expect("a PrometheusRule");
    let rules_file = out.path().join("rules.json");
    std::fs::write(&rules_file, rule["spec"].to_string()).expect("write");
    let o = Command::new("promtool")
        .args(["check", "rules"])
        .arg(&rules_file)
        .output()
        .expect("promtool (scripts/setup.sh installs it)");
    assert!(
        o.status.success(),
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );

    // Every command the chart gives the tessera image parses (the values the kubelet fills
    // in, such as $(POD_NAME), stand in as plain values).
    for name in LAYOUTS {
        for d in documents(&out.path().join(format!("{name}.yaml"))) {
            let containers = d["spec"]["template"]["spec"]["containers"]
                .as_array()
                .cloned();
            for c in containers.unwrap_or_default() {
                if !c["image"]
                    .as_str()
                    .unwrap_or_default()
                    .starts_with("tessera:")
                {
                    continue;
                }
                let args: Vec<String> = c["args"]
                    .as_array()
                    .expect("args")
                    .iter()
                    .map(|a| {
                        a.as_str()
                            .expect("string")
                            .replace("$(HOST_IP)", "127.0.0.1")
                            .replace("$(POD_NAME)", "pod")
                            .replace("$(NODE_NAME)", "node")
                    })
                    .collect();
                let o = Command::new(env!("CARGO_BIN_EXE_tessera"))
                    .args(&args)
                    .arg("--help")
                    .output()
                    .expect("tessera");
                assert!(
                    o.status.success(),
                    "{name}: {} {}: tessera {args:?}: {}",
                    d["kind"],
                    d["metadata"]["name"],
                    String::from_utf8_lossy(&o.stderr)
                );
            }
        }
    }

    // Every rendered object, sent to Tessera's API with a server-side dry run.
    let c = Cluster::start_with("up", &["--nodes-per-shard=0"]);
    c.ok(&["create", "namespace", "tessera"]);
    // The Prometheus operator's kinds are CRDs Tessera does not serve.
    let unserved_allowed: BTreeSet<&str> =
        ["ServiceMonitor", "PodMonitor", "PrometheusRule"].into();
    for name in LAYOUTS {
        let file = out.path().join(format!("{name}.yaml"));
        let (accepted, unserved, errors) = dry_run(&c, &file);
        assert!(errors.is_empty(), "{name}: refused by Tessera: {errors:#?}");
        let unserved_kinds: BTreeSet<&str> = unserved.iter().map(String::as_str).collect();
        assert!(
            unserved_kinds.is_subset(&unserved_allowed),
            "{name}: kinds Tessera does not serve: {unserved_kinds:?}"
        );
        let expected = documents(&file)
            .iter()
            .filter(|d| !unserved_allowed.contains(d["kind"].as_str().unwrap_or_default()))
            .count();
        assert_eq!(
            accepted, expected,
            "{name}: every object of a served kind is accepted"
        );
        eprintln!(
            "{name}: {accepted} objects accepted by a server dry run; not served: {unserved_kinds:?}"
        );
    }
    // The pre-install Job's command: the credentials become a Secret once; a second run
    // (an upgrade) keeps it as it is.
    let job = |extra: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_tessera"))
            .args([
                "certs",
                "init",
                "--secret=tessera-shard-0-pki",
                "--namespace=tessera",
            ])
            .args(["--server=https://tessera-shard-0-apiserver.tessera.svc:6443"])
            .args([
                "--san=tessera-shard-0-apiserver.tessera.svc",
                "--etcd-san=*.e.tessera.svc",
            ])
            .args(["--secret-labels=app.kubernetes.io/part-of=tessera"])
            .args(extra)
            .env_remove("KUBERNETES_SERVICE_HOST")
            .output()
            .expect("run")
    };
    let kubeconfig = c.kubeconfig.to_str().expect("utf-8").to_owned();
    let first = job(&["--kubeconfig", &kubeconfig]);
    assert!(
        first.status.success(),
        "{}",
        String::from_utf8_lossy(&first.stderr)
    );
    let secret = |c: &Cluster| -> Value {
        serde_json::from_str(&c.ok(&[
            "get",
            "secret",
            "tessera-shard-0-pki",
            "-n",
            "tessera",
            "-o",
            "json",
        ]))
        .expect("json")
    };
    let made = secret(&c);
    let keys: BTreeSet<&str> = made["data"]
        .as_object()
        .expect("data")
        .keys()
        .map(String::as_str)
        .collect();
    for k in [
        "ca.crt",
        "server.key",
        "admin.token",
        "metrics.token",
        "kubeconfig",
        "etcd-member.crt",
        "etcd-client.key",
    ] {
        assert!(keys.contains(k), "{k} not in {keys:?}");
    }
    assert!(
        !keys.contains("join.token"),
        "a shard has no join token: {keys:?}"
    );
    assert_eq!(
        made["metadata"]["labels"]["app.kubernetes.io/part-of"],
        "tessera"
    );
    let second = job(&["--kubeconfig", &kubeconfig]);
    assert!(second.status.success());
    assert!(String::from_utf8_lossy(&second.stdout).contains("kept as it is"));
    assert_eq!(
        secret(&c)["data"],
        made["data"],
        "an upgrade changes no credential"
    );
    // Outside a pod, with no kubeconfig, it says what to give.
    let outside = job(&[]);
    assert!(!outside.status.success());
    assert!(
        String::from_utf8_lossy(&outside.stderr).contains("give --kubeconfig"),
        "{}",
        String::from_utf8_lossy(&outside.stderr)
    );

    // A dry run created nothing.
    let left = c.ok(&[
        "get",
        "deployments,statefulsets,services",
        "-n",
        "tessera",
        "-o",
        "name",
    ]);
    assert!(left.trim().is_empty(), "{left}");
}

/// The YAML documents of a rendered chart, as JSON.
fn documents(file: &Path) -> Vec<Value> {
    let text = std::fs::read(file).expect("rendered chart");
    let mut out = Vec::new();
    for doc in text
        .split(|b| *b == b'\n')
        .collect::<Vec<_>>()
        .split(|l| *l == b"---")
    {
        let joined = doc.join(&b'\n');
        if let Ok(v) = tessera_apiserver::yaml::to_json(&joined)
            && v.is_object()
        {
            out.push(v);
        }
    }
    out
}

/// The (apiVersion, kind) pairs the cluster serves, from `kubectl api-resources`.
fn served_kinds(c: &Cluster) -> BTreeSet<(String, String)> {
    c.ok(&["api-resources", "--no-headers"])
        .lines()
        .filter_map(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            let n = cols.len();
            (n >= 4).then(|| (cols[n - 3].to_owned(), cols[n - 1].to_owned()))
        })
        .collect()
}

/// Sends the objects of `file` whose kinds the cluster serves to
/// `kubectl apply --dry-run=server` (kubectl stops at the first object whose kind it cannot
/// find a schema for, so those are left out and listed): how many were accepted, the kinds
/// left out, and every line kubectl printed on standard error.
fn dry_run(c: &Cluster, file: &Path) -> (usize, Vec<String>, Vec<String>) {
    let served = served_kinds(c);
    let mut unserved = Vec::new();
    let mut keep = Vec::new();
    for d in documents(file) {
        let key = (
            d["apiVersion"].as_str().unwrap_or_default().to_owned(),
            d["kind"].as_str().unwrap_or_default().to_owned(),
        );
        if served.contains(&key) {
            keep.push(d);
        } else {
            unserved.push(key.1);
        }
    }
    // A stream of JSON objects (a `List` would send kubectl to /openapi/v2 for its schema).
    let served_file = file.with_extension("served.json");
    let text: Vec<String> = keep.iter().map(Value::to_string).collect();
    std::fs::write(&served_file, text.join("\n")).expect("write");
    let o = c.kubectl(&[
        "apply",
        "--dry-run=server",
        "-n",
        "tessera",
        "-f",
        served_file.to_str().expect("utf-8"),
    ]);
    let stdout = String::from_utf8_lossy(&o.stdout);
    let accepted = stdout
        .lines()
        .filter(|l| l.ends_with("(server dry run)"))
        .count();
    let errors = String::from_utf8_lossy(&o.stderr)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(str::to_owned)
        .collect();
    (accepted, unserved, errors)
}

/// Runs `tessera ARGS` until it prints `marker` (its banner), keeping it running.
fn tessera_until(args: &[&str], marker: &str) -> Running {
    use std::io::{BufRead, BufReader};
    let mut child = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(args)
        .env("TESSERA_LOG", "error")
        .env("RUST_BACKTRACE", "0")
        .stdout(Stdio::piped())
        .spawn()
        .map(Running)
        .expect("start tessera");
    let out = child.0.stdout.take().expect("stdout");
    let mut lines = BufReader::new(out).lines();
    let mut seen = Vec::new();
    let found = lines.by_ref().map_while(Result::ok).any(|l| {
        seen.push(l.clone());
        l.contains(marker)
    });
    assert!(found, "tessera {args:?} did not say {marker:?}: {seen:#?}");
    std::thread::spawn(move || for _ in lines.map_while(Result::ok) {});
    child
}

/// `tessera ARGS`, which must succeed.
fn tessera_ok(args: &[&str]) -> String {
    let o = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(args)
        .output()
        .expect("run tessera");
    assert!(
        o.status.success(),
        "tessera {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The args the chart renders for the container `container` of `kind` `name`.
fn rendered_args(docs: &[Value], kind: &str, name: &str, container: &str) -> Vec<String> {
    let obj = docs
        .iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("{kind} {name} is not rendered"));
    obj["spec"]["template"]["spec"]["containers"]
        .as_array()
        .expect("containers")
        .iter()
        .find(|c| c["name"] == container)
        .unwrap_or_else(|| panic!("{kind} {name} has no container {container}"))["args"]
        .as_array()
        .expect("args")
        .iter()
        .map(|a| a.as_str().expect("string").to_owned())
        .collect()
}

/// A 3-member etcd cluster on loopback with the chart's TLS flags, its certificates from
/// `pki` (made by `tessera certs init --etcd-san`); its client URLs.
struct Etcd {
    members: Vec<Running>,
    urls: Vec<String>,
    _dir: tempfile::TempDir,
}

fn etcd_cluster(pki: &Path, chart_args: &[String]) -> Etcd {
    let dir = tempfile::tempdir().expect("tmp");
    let ports: Vec<(String, String)> = (0..3).map(|_| (free_addr(), free_addr())).collect();
    let peers: Vec<String> = ports
        .iter()
        .enumerate()
        .map(|(i, (_, peer))| format!("m{i}=https://{peer}"))
        .collect();
    // The chart's flags, with loopback addresses for the members' DNS names and this
    // directory for the mounted Secret.
    let tls: Vec<String> = chart_args
        .iter()
        .filter(|a| {
            a.starts_with("--client-cert-auth")
                || a.starts_with("--peer-client-cert-auth")
                || a.contains("-file=")
        })
        .map(|a| a.replace("/etc/etcd/pki", pki.to_str().expect("utf-8")))
        .collect();
    assert_eq!(tls.len(), 8, "the chart's TLS flags: {chart_args:?}");
    let mut members = Vec::new();
    for (i, (client, peer)) in ports.iter().enumerate() {
        let log = std::fs::File::create(dir.path().join(format!("m{i}.log"))).expect("log");
        members.push(Running(
            Command::new(std::env::var_os("ETCD_BIN").unwrap_or_else(|| "etcd".into()))
                .arg(format!("--name=m{i}"))
                .arg(format!(
                    "--data-dir={}",
                    dir.path().join(format!("m{i}")).display()
                ))
                .arg(format!("--listen-client-urls=https://{client}"))
                .arg(format!("--advertise-client-urls=https://{client}"))
                .arg(format!("--listen-peer-urls=https://{peer}"))
                .arg(format!("--initial-advertise-peer-urls=https://{peer}"))
                .arg(format!("--initial-cluster={}", peers.join(",")))
                .arg("--initial-cluster-state=new")
                .args(&tls)
                .args(["--log-level=warn", "--logger=zap"])
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .expect("etcd (scripts/setup.sh installs it)"),
        ));
    }
    Etcd {
        members,
        urls: ports.iter().map(|(c, _)| format!("https://{c}")).collect(),
        _dir: dir,
    }
}

#[test]
fn the_charts_layout_runs_as_processes_with_its_flags() {
    let out = tempfile::tempdir().expect("tmp");
    let o = Command::new(python())
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/scripts/chart_check.py"
        ))
        .arg(CHART)
        .arg("--out")
        .arg(out.path())
        .args(["--values", "-"])
        .output()
        .expect("chart_check.py");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let docs = documents(&out.path().join("default.yaml"));
    let work = tempfile::tempdir().expect("tmp");
    let path = |p: &str| work.path().join(p).to_string_lossy().into_owned();

    // The credentials, as the pre-install Job makes them (into directories here).
    let fed_pki = path("federation-pki");
    let shard_pki = path("shard-pki");
    tessera_ok(&["certs", "init", "--pki-dir", &fed_pki, "--federation"]);
    tessera_ok(&[
        "certs",
        "init",
        "--pki-dir",
        &shard_pki,
        "--etcd-san=localhost,127.0.0.1",
    ]);
    // The same command a second time changes nothing.
    let again = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["certs", "init", "--pki-dir", &shard_pki])
        .output()
        .expect("run");
    assert!(!again.status.success());
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("not empty"),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );

    // The shard's etcd: 3 members, peer and client TLS, client certificates required.
    let etcd_args = rendered_args(&docs, "StatefulSet", "tessera-shard-0-etcd", "etcd");
    let etcd = etcd_cluster(Path::new(&shard_pki), &etcd_args);
    let servers = etcd.urls.join(",");

    // Two API servers of the shard on that etcd, with the chart's store flags.
    let api_args = rendered_args(
        &docs,
        "Deployment",
        "tessera-shard-0-apiserver",
        "apiserver",
    );
    let store_flags: Vec<String> = api_args
        .iter()
        .filter(|a| a.starts_with("--etcd-") && !a.starts_with("--etcd-servers"))
        .map(|a| a.replace("/etc/tessera/pki", &shard_pki))
        .collect();
    assert_eq!(store_flags.len(), 3, "{api_args:?}");
    assert!(
        api_args.contains(&"--pki-dir=/etc/tessera/pki".to_owned()),
        "{api_args:?}"
    );
    let apiserver = |i: usize| {
        let data = path(&format!("api-{i}"));
        let mut args: Vec<String> = [
            "apiserver",
            "--data-dir",
            &data,
            "--pki-dir",
            &shard_pki,
            "--api-addr=127.0.0.1:0",
            "--grpc-addr=127.0.0.1:0",
            "--metrics-addr=127.0.0.1:0",
            "--store=etcd",
        ]
        .map(str::to_owned)
        .to_vec();
        args.push(format!("--etcd-servers={servers}"));
        args.extend(store_flags.iter().cloned());
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        let running = tessera_until(&argv, "Press Ctrl-C");
        (running, PathBuf::from(data).join("kubeconfig"))
    };
    let (api0, kubeconfig0) = apiserver(0);
    let (_api1, kubeconfig1) = apiserver(1);
    let shard0 = Kubectl(kubeconfig0.clone());
    let shard1 = Kubectl(kubeconfig1.clone());
    // Both serve the one store: a write at one is read at the other.
    shard0.ok(&["create", "namespace", "written-at-0"]);
    assert!(
        shard1
            .ok(&["get", "namespace", "written-at-0", "-o", "name"])
            .contains("written-at-0")
    );

    // An API server without the etcd client certificate is refused by etcd, and says so.
    let mut no_cert = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args([
            "apiserver",
            "--data-dir",
            &path("no-cert"),
            "--pki-dir",
            &shard_pki,
        ])
        .args([
            "--api-addr=127.0.0.1:0",
            "--grpc-addr=127.0.0.1:0",
            "--metrics-addr=127.0.0.1:0",
        ])
        .args(["--store=etcd", &format!("--etcd-servers={servers}")])
        .arg(format!("--etcd-cafile={shard_pki}/etcd-ca.crt"))
        .env("TESSERA_LOG", "error")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map(Running)
        .expect("spawn");
    let exited = wait_for(Duration::from_secs(60), || {
        no_cert.0.try_wait().expect("wait")
    });
    let status = exited.expect("an API server etcd refuses stops");
    assert!(!status.success());
    let mut said = String::new();
    std::io::Read::read_to_string(&mut no_cert.0.stderr.take().expect("stderr"), &mut said)
        .expect("read");
    assert!(said.contains("etcd") || said.contains("store"), "{said}");
    eprintln!(
        "without a client certificate: {}",
        said.lines().last().unwrap_or_default()
    );

    // Scheduler and controller manager: two of each, one active (the chart's flags).
    let comp = |part: &str, name: &str, kubeconfig: &Path| {
        let args = rendered_args(
            &docs,
            "Deployment",
            &format!("tessera-shard-0-{part}"),
            part,
        );
        assert!(args.contains(&"--leader-elect=true".to_owned()), "{args:?}");
        // The controller manager signs client certificates with the shard's CA, mounted
        // from its Secret as the API server's.
        let signing: Vec<String> = if part == "controller-manager" {
            for f in ["cert", "key"] {
                let ext = if f == "cert" { "crt" } else { "key" };
                let flag = format!("--cluster-signing-{f}-file=/etc/tessera/pki/ca.{ext}");
                assert!(args.contains(&flag), "{args:?}");
            }
            vec![
                format!("--cluster-signing-cert-file={shard_pki}/ca.crt"),
                format!("--cluster-signing-key-file={shard_pki}/ca.key"),
            ]
        } else {
            Vec::new()
        };
        Running(
            Command::new(env!("CARGO_BIN_EXE_tessera"))
                .args([part, "--leader-elect=true", "--identity", name])
                .args(&signing)
                .args([
                    "--lease-duration=4",
                    "--renew-deadline=3",
                    "--retry-period=1",
                ])
                .arg("--kubeconfig")
                .arg(kubeconfig)
                .arg(format!("--metrics-token-file={shard_pki}/metrics.token"))
                .args(["--metrics-addr", "127.0.0.1:0"])
                .env("TESSERA_LOG", "error")
                .env("RUST_BACKTRACE", "0")
                .stdout(Stdio::null())
                .spawn()
                .expect("start"),
        )
    };
    let sched_a = comp("scheduler", "sched-a", &kubeconfig0);
    let _sched_b = comp("scheduler", "sched-b", &kubeconfig1);
    let _cm_a = comp("controller-manager", "cm-a", &kubeconfig0);
    let _cm_b = comp("controller-manager", "cm-b", &kubeconfig1);
    let _agent = Running(
        Command::new(env!("CARGO_BIN_EXE_tessera"))
            .args([
                "agent",
                "--sim-nodes=3",
                "--prefix=shard-0-node",
                "--node-zones=0",
            ])
            .arg("--kubeconfig")
            .arg(&kubeconfig1)
            .args(["--metrics-addr", "127.0.0.1:0"])
            .env("TESSERA_LOG", "error")
            .stdout(Stdio::null())
            .spawn()
            .expect("agent"),
    );

    // The federation on its own credentials, and the shard's agent joining it with the
    // chart's join flags.
    let fed_data = path("federation");
    let grpc = free_addr();
    let _fed = tessera_until(
        &[
            "federation",
            "--data-dir",
            &fed_data,
            "--pki-dir",
            &fed_pki,
            "--api-addr=127.0.0.1:0",
            "--metrics-addr=127.0.0.1:0",
            &format!("--grpc-addr={grpc}"),
            "--shard-lease-seconds=6",
        ],
        "Press Ctrl-C",
    );
    let join_args = rendered_args(&docs, "Deployment", "tessera-shard-0-join", "join");
    let from_chart = |flag: &str| {
        join_args
            .iter()
            .find_map(|a| a.strip_prefix(flag))
            .unwrap_or_else(|| panic!("{flag} not in {join_args:?}"))
            .replace("/etc/tessera/federation", &fed_pki)
            .replace("/etc/tessera/pki", &shard_pki)
    };
    let _join = Running(
        Command::new(env!("CARGO_BIN_EXE_tessera"))
            .args(["join", &format!("--federation=https://{grpc}")])
            .arg(format!(
                "--federation-ca={}",
                from_chart("--federation-ca=")
            ))
            .arg(format!("--token-file={}", from_chart("--token-file=")))
            .arg(format!("--name={}", from_chart("--name=")))
            .arg("--kubeconfig")
            .arg(&kubeconfig1)
            .arg(format!(
                "--metrics-token-file={}",
                from_chart("--metrics-token-file=")
            ))
            .args(["--metrics-addr", "127.0.0.1:0"])
            .env("TESSERA_LOG", "error")
            .stdout(Stdio::null())
            .spawn()
            .expect("join"),
    );
    let fed = Kubectl(PathBuf::from(&fed_data).join("kubeconfig"));
    let ready = wait_for(Duration::from_secs(60), || {
        let s = fed.ok(&["get", "shards", "--no-headers"]);
        (s.contains("shard-0") && s.contains(" True ")).then_some(())
    });
    assert!(ready.is_some(), "{}", fed.ok(&["get", "shards"]));

    // A workload at the federation runs on the shard.
    fed.ok(&["create", "namespace", "demo"]);
    fed.ok(&[
        "create",
        "deployment",
        "web",
        "-n",
        "demo",
        "--image=nginx",
        "--replicas=3",
    ]);
    fed.ok(&[
        "rollout",
        "status",
        "deployment/web",
        "-n",
        "demo",
        "--timeout=90s",
    ]);
    let nodes = shard1.ok(&[
        "get",
        "pods",
        "-n",
        "demo",
        "-o",
        "jsonpath={.items[*].spec.nodeName}",
    ]);
    assert_eq!(nodes.split_whitespace().count(), 3, "{nodes}");

    // One API server and the active scheduler go; the other API server and the standby
    // carry on: a scale-up at the federation is placed.
    drop(api0);
    drop(sched_a);
    assert_eq!(etcd.members.len(), 3);
    fed.ok(&["scale", "deployment/web", "-n", "demo", "--replicas=5"]);
    let placed = wait_for(Duration::from_secs(90), || {
        let out = shard1.ok(&["get", "pods", "-n", "demo", "--no-headers"]);
        (out.lines().filter(|l| l.contains("Running")).count() == 5).then_some(())
    });
    assert!(
        placed.is_some(),
        "{}",
        shard1.ok(&["get", "pods", "-n", "demo", "-o", "wide"])
    );
}

/// kubectl with one kubeconfig.
struct Kubectl(PathBuf);

impl Kubectl {
    fn ok(&self, args: &[&str]) -> String {
        let o = Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&self.0)
            .args(args)
            .output()
            .expect("kubectl");
        assert!(
            o.status.success(),
            "kubectl {args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    }
}

/// Whether the API behind `kubeconfig` says it is ready.
fn ready(kubeconfig: &Path) -> bool {
    Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["get", "--raw", "/readyz"])
        .output()
        .is_ok_and(|o| o.status.success())
}

#[test]
fn two_federation_processes_on_one_etcd_lead_one_at_a_time() {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let etcd = rt
        .block_on(tessera_store::testing::EtcdProcess::start())
        .expect("etcd");
    let work = tempfile::tempdir().expect("tmp");
    let path = |p: &str| work.path().join(p).to_string_lossy().into_owned();
    // The chart's federation Deployment: replicas share the credentials Secret.
    let pki = path("federation-pki");
    tessera_ok(&["certs", "init", "--pki-dir", &pki, "--federation"]);
    let grpc = [free_addr(), free_addr()];
    let start = |i: usize| {
        let data = path(&format!("fed-{i}"));
        let args: Vec<String> = vec![
            "federation".into(),
            format!("--data-dir={data}"),
            format!("--pki-dir={pki}"),
            "--api-addr=127.0.0.1:0".into(),
            "--metrics-addr=127.0.0.1:0".into(),
            format!("--grpc-addr={}", grpc[i]),
            "--store=etcd".into(),
            format!("--etcd-servers={}", etcd.url()),
            "--leader-elect=true".into(),
            format!("--identity=fed-{i}"),
            "--lease-duration=3".into(),
            "--renew-deadline=2".into(),
            "--retry-period=0.5".into(),
            "--shard-lease-seconds=6".into(),
        ];
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        let running = tessera_until(&argv, "Press Ctrl-C");
        (running, PathBuf::from(data).join("kubeconfig"))
    };
    let (fed0, kc0) = start(0);
    let (fed1, kc1) = start(1);
    let leader = wait_for(Duration::from_secs(30), || {
        match (ready(&kc0), ready(&kc1)) {
            (true, false) => Some(0),
            (false, true) => Some(1),
            _ => None,
        }
    })
    .expect("exactly one federation process is ready");
    // The standby's /readyz says why.
    let standby_kc = if leader == 0 { &kc1 } else { &kc0 };
    let o = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(standby_kc)
        .args(["get", "--raw", "/readyz"])
        .output()
        .expect("kubectl");
    assert!(!o.status.success());
    let lease = Kubectl(standby_kc.clone()).ok(&[
        "get",
        "lease",
        "tessera-federation",
        "-n",
        "kube-system",
        "-o",
        "jsonpath={.spec.holderIdentity}",
    ]);
    assert_eq!(lease, format!("fed-{leader}"));

    // A shard joins with both processes' addresses; the leader takes it.
    let shard = Cluster::start_with("up", &["--nodes-per-shard=4", "--node-zones=0"]);
    let urls = format!("https://{},https://{}", grpc[0], grpc[1]);
    let _join = Running(
        Command::new(env!("CARGO_BIN_EXE_tessera"))
            .args(["join", &format!("--federation={urls}")])
            .arg(format!("--federation-ca={pki}/ca.crt"))
            .arg(format!("--token-file={pki}/join.token"))
            .args(["--name=shard-a", "--metrics-addr=127.0.0.1:0"])
            .arg("--kubeconfig")
            .arg(&shard.kubeconfig)
            .env("TESSERA_LOG", "error")
            .stdout(Stdio::null())
            .spawn()
            .expect("join"),
    );
    let (leader_kc, other_kc, leader_proc, _other_proc) = if leader == 0 {
        (kc0, kc1, fed0, fed1)
    } else {
        (kc1, kc0, fed1, fed0)
    };
    let fed = Kubectl(leader_kc);
    let joined = |fed: &Kubectl| {
        wait_for(Duration::from_secs(60), || {
            let s = fed.ok(&["get", "shards", "--no-headers"]);
            (s.contains("shard-a") && s.contains(" True ")).then_some(())
        })
    };
    assert!(joined(&fed).is_some(), "{}", fed.ok(&["get", "shards"]));
    fed.ok(&["create", "namespace", "demo"]);
    fed.ok(&[
        "create",
        "deployment",
        "web",
        "-n",
        "demo",
        "--image=nginx",
        "--replicas=2",
    ]);
    fed.ok(&[
        "rollout",
        "status",
        "deployment/web",
        "-n",
        "demo",
        "--timeout=90s",
    ]);

    // The leader dies without a word; the standby takes the Lease, the shard joins it, and
    // the federation carries on from the store: the Deployment is there and scales.
    drop(leader_proc);
    let next = Kubectl(other_kc.clone());
    let took_over = wait_for(Duration::from_secs(30), || ready(&other_kc).then_some(()));
    assert!(took_over.is_some(), "the standby did not take over");
    assert!(joined(&next).is_some(), "{}", next.ok(&["get", "shards"]));
    next.ok(&["scale", "deployment/web", "-n", "demo", "--replicas=4"]);
    let scaled = wait_for(Duration::from_secs(90), || {
        let out = shard.ok(&["get", "pods", "-n", "demo", "--no-headers"]);
        (out.lines().filter(|l| l.contains("Running")).count() == 4).then_some(())
    });
    assert!(
        scaled.is_some(),
        "{}",
        shard.ok(&["get", "pods", "-n", "demo", "-o", "wide"])
    );
    // One copy of the workload on the shard, not one per leader.
    let copies = shard.ok(&["get", "deployments", "-n", "demo", "--no-headers"]);
    assert_eq!(copies.lines().count(), 1, "{copies}");
    next.ok(&[
        "rollout",
        "status",
        "deployment/web",
        "-n",
        "demo",
        "--timeout=60s",
    ]);
}

/// Sends SIGTERM (what Kubernetes sends when it deletes a pod) to `child`.
fn terminate(child: &std::process::Child) {
    let ok = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(ok.success());
}

#[test]
fn a_leader_stopped_by_sigterm_hands_its_lease_over_before_it_lapses() {
    // A shard without its own scheduler; two schedulers with a Lease of 60 s, so a standby
    // that waited for it to lapse would take a minute.
    let c = Cluster::start_with("up", &["--scheduler=false", "--nodes-per-shard=2"]);
    let scheduler = |name: &str| {
        Running(
            Command::new(env!("CARGO_BIN_EXE_tessera"))
                .args(["scheduler", "--leader-elect=true", "--identity", name])
                .args([
                    "--lease-duration=60",
                    "--renew-deadline=40",
                    "--retry-period=1",
                ])
                .arg("--kubeconfig")
                .arg(&c.kubeconfig)
                .args(["--metrics-addr", "127.0.0.1:0"])
                .env("TESSERA_LOG", "error")
                .stdout(Stdio::null())
                .spawn()
                .expect("scheduler"),
        )
    };
    let a = scheduler("sched-a");
    let holder = || {
        c.ok(&[
            "get",
            "lease",
            "tessera-scheduler",
            "-n",
            "kube-system",
            "-o",
            "jsonpath={.spec.holderIdentity}",
        ])
    };
    let first = wait_for(Duration::from_secs(30), || {
        (holder() == "sched-a").then_some(())
    });
    assert!(first.is_some(), "sched-a never led: {:?}", holder());
    let _b = scheduler("sched-b");
    terminate(&a.0);
    let next = wait_for(Duration::from_secs(30), || {
        (holder() == "sched-b").then_some(())
    });
    assert!(
        next.is_some(),
        "the Lease was not handed over within 30 s of a 60 s Lease (holder {:?})",
        holder()
    );
    // The new leader schedules.
    c.ok(&["create", "namespace", "demo"]);
    c.deploy("demo", "web", 2);
}
