//! Monitoring as an operator runs it: a real Prometheus (Debian's, installed by
//! `scripts/setup.sh`) scrapes `tessera up --shards 3` with the configuration `tessera up`
//! writes, evaluates the rules of `charts/tessera/monitoring/rules.yml`, and answers the
//! queries of the key series and of every panel of the Grafana dashboard. `promtool` checks
//! each endpoint's exposition, the configuration, the rules and the alerts' unit tests.

mod support;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use support::{Cluster, Running, free_addr, wait_for};

const MONITORING: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/charts/tessera/monitoring");

/// A program the set-up installs; a clear failure where it is missing.
fn tool(name: &str) -> Command {
    let found = std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(name).is_file()));
    assert!(found, "{name} is not installed: run scripts/setup.sh");
    Command::new(name)
}

fn run(cmd: &mut Command) -> (bool, String) {
    let out = cmd.output().expect("run");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
fn the_rules_pass_promtool_and_every_alert_its_unit_tests() {
    let (ok, out) = run(tool("promtool")
        .args(["check", "rules"])
        .arg(Path::new(MONITORING).join("rules.yml")));
    assert!(ok, "{out}");
    assert!(out.contains("SUCCESS: 17 rules found"), "{out}");
    let (ok, out) = run(tool("promtool")
        .args(["test", "rules", "rules_test.yml"])
        .current_dir(MONITORING));
    assert!(ok, "{out}");
    assert!(out.contains("SUCCESS"), "{out}");
    // Every alert of the rules has a unit test that expects it to fire.
    let rules = std::fs::read_to_string(Path::new(MONITORING).join("rules.yml")).expect("rules");
    let tests =
        std::fs::read_to_string(Path::new(MONITORING).join("rules_test.yml")).expect("tests");
    let alerts: Vec<&str> = rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert: "))
        .collect();
    assert_eq!(alerts.len(), 8, "{alerts:?}");
    for a in alerts {
        assert!(
            tests.contains(&format!("alertname: {a}\n        exp_alerts:")),
            "no test expects {a} to fire"
        );
    }
}

/// The dashboard's committed JSON is what its generator prints, and every query in it.
fn dashboard_queries() -> Vec<String> {
    let python = Path::new(env!("CARGO_MANIFEST_DIR")).join(".tools/venv/bin/python");
    assert!(
        python.is_file(),
        "{} is missing: run scripts/setup.sh",
        python.display()
    );
    let out = Command::new(&python)
        .arg(Path::new(MONITORING).join("dashboard.py"))
        .output()
        .expect("run the generator");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let committed =
        std::fs::read(Path::new(MONITORING).join("dashboard.json")).expect("dashboard.json");
    assert!(
        out.stdout == committed,
        "charts/tessera/monitoring/dashboard.json is not what dashboard.py prints: regenerate it"
    );
    let dash: serde_json::Value = serde_json::from_slice(&committed).expect("json");
    let panels = dash["panels"].as_array().expect("panels");
    let mut exprs = Vec::new();
    let mut rows = BTreeSet::new();
    for p in panels {
        if p["type"] == "row" {
            rows.insert(p["title"].as_str().unwrap_or_default().to_owned());
            continue;
        }
        assert_eq!(
            p["datasource"]["uid"], "${datasource}",
            "{}: every panel reads the chosen Prometheus",
            p["title"]
        );
        let targets = p["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{} has no query", p["title"]);
        for t in targets {
            exprs.push(t["expr"].as_str().expect("expr").to_owned());
        }
    }
    let want: BTreeSet<String> = [
        "Fleet",
        "Shard $shard",
        "Tenants",
        "Scheduler",
        "API",
        "Store",
    ]
    .map(str::to_owned)
    .into();
    assert_eq!(rows, want);
    let shard_row = panels
        .iter()
        .find(|p| p["title"] == "Shard $shard")
        .expect("row");
    assert_eq!(shard_row["repeat"], "shard", "one row per shard");
    exprs
}

#[test]
fn the_dashboard_is_what_its_generator_prints() {
    let exprs = dashboard_queries();
    assert!(exprs.len() >= 25, "{exprs:?}");
}

/// `promtool check metrics` of the exposition at `url`, read with `token`: what it said.
fn promtool_on(url: &str, token: &str) -> String {
    let body = Command::new("curl")
        .args(["-sSf", "-H", &format!("Authorization: Bearer {token}"), url])
        .output()
        .expect("curl");
    assert!(
        body.status.success(),
        "{url}: {}",
        String::from_utf8_lossy(&body.stderr)
    );
    assert!(
        String::from_utf8_lossy(&body.stdout).contains("# TYPE "),
        "{url} serves no metrics"
    );
    let mut check = tool("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool");
    use std::io::Write;
    check
        .stdin
        .take()
        .expect("stdin")
        .write_all(&body.stdout)
        .expect("write");
    let out = check.wait_with_output().expect("promtool");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{url}: {said}");
    said
}

/// Each component run as a process of its own — the API server, the scheduler, the
/// controller manager, a node agent — serves metrics that `promtool` accepts, to the metrics
/// token given with `--metrics-token-file`.
#[test]
fn every_component_process_serves_metrics_promtool_accepts() {
    let c = Cluster::start_with("apiserver", &[]);
    let token_file = c.dir.path().join("pki/metrics.token");
    let token = std::fs::read_to_string(&token_file).expect("the API server made its token");
    let mut processes = Vec::new();
    let mut urls = vec![format!("http://{}/metrics", c.metrics_addr)];
    for (what, extra) in [
        ("scheduler", vec!["--identity", "sched-0"]),
        ("controller-manager", vec!["--identity", "cm-0"]),
        ("agent", vec!["--sim-nodes", "2", "--prefix", "m"]),
    ] {
        let addr = free_addr();
        processes.push(Running(
            Command::new(env!("CARGO_BIN_EXE_tessera"))
                .arg(what)
                .args(&extra)
                .arg("--kubeconfig")
                .arg(&c.kubeconfig)
                .args(["--metrics-addr", &addr])
                .arg("--metrics-token-file")
                .arg(&token_file)
                .env("TESSERA_LOG", "warn")
                .stdout(Stdio::null())
                .spawn()
                .expect("start a component"),
        ));
        urls.push(format!("http://{addr}/metrics"));
    }
    // Work for them: a Deployment scheduled onto the agent's nodes.
    c.ok(&["create", "namespace", "m"]);
    c.deploy("m", "web", 3);
    for url in &urls {
        let said = wait_for(Duration::from_secs(30), || {
            let out = Command::new("curl").args(["-sf", url]).output().ok()?;
            out.status.success().then_some(())
        });
        assert!(said.is_some(), "{url} answers");
        let said = promtool_on(url, token.trim());
        assert!(said.trim().is_empty(), "{url}: {said}");
    }
    // Another token is refused by each of them.
    for url in &urls {
        let out = Command::new("curl")
            .args(["-s", "-o", "/dev/null", "-w", "%{http_code}"])
            .args(["-H", "Authorization: Bearer not-the-token", url])
            .output()
            .expect("curl");
        assert_eq!(String::from_utf8_lossy(&out.stdout), "401", "{url}");
    }
    drop(processes);
}

/// One PromQL query: its result's samples (label sets and values), or why not.
fn query(prometheus: &str, expr: &str) -> Result<Vec<(serde_json::Value, f64)>, String> {
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "10", "--get", "--data-urlencode"])
        .arg(format!("query={expr}"))
        .arg(format!("http://{prometheus}/api/v1/query"))
        .output()
        .map_err(|e| e.to_string())?;
    let body: serde_json::Value = serde_json::from_slice(&out.stdout)
        .map_err(|e| format!("{e}: {}", String::from_utf8_lossy(&out.stdout)))?;
    if body["status"] != "success" {
        return Err(body.to_string());
    }
    Ok(body["data"]["result"]
        .as_array()
        .map(|r| {
            r.iter()
                .map(|s| {
                    let v = s["value"][1]
                        .as_str()
                        .unwrap_or("NaN")
                        .parse()
                        .unwrap_or(f64::NAN);
                    (s["metric"].clone(), v)
                })
                .collect()
        })
        .unwrap_or_default())
}

/// Waits (bounded) for `expr` to return a sample that `good` accepts; its samples.
fn data(
    prometheus: &str,
    expr: &str,
    good: impl Fn(&serde_json::Value, f64) -> bool,
) -> Vec<(serde_json::Value, f64)> {
    let mut last = Err(String::from("not asked yet"));
    let found = wait_for(Duration::from_secs(60), || {
        last = query(prometheus, expr);
        last.as_ref()
            .ok()
            .filter(|s| s.iter().any(|(m, v)| good(m, *v)))
            .cloned()
    });
    found.unwrap_or_else(|| panic!("no data for {expr}: {last:?}"))
}

fn in_shard(c: &Cluster, shard: &str, yaml: &str) {
    let f = c.file(&format!("{shard}.yaml"), yaml);
    c.ok(&["--context", shard, "apply", "-f", &f]);
}

#[test]
fn a_real_prometheus_scrapes_the_fleet_and_every_key_series_and_panel_has_data() {
    let exprs = dashboard_queries();
    let c = Cluster::start_with("up", &["--shards=3", "--nodes-per-shard=4"]);
    c.wait_for_ready_shards(3);

    // The configuration `tessera up` wrote, scraping and evaluating every second here.
    let written = std::fs::read_to_string(c.dir.path().join("prometheus.yml")).expect("config");
    assert!(written.contains("rule_files:"), "{written}");
    let config = c.dir.path().join("prometheus-test.yml");
    std::fs::write(&config, written.replace(": 5s", ": 1s")).expect("write");
    let (ok, out) = run(tool("promtool").args(["check", "config"]).arg(&config));
    assert!(ok && out.contains("SUCCESS: 17 rules found"), "{out}");

    let dir = tempfile::tempdir().expect("tempdir");
    let addr = free_addr();
    let _prometheus = Running(
        tool("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", dir.path().display()))
            .arg(format!("--web.listen-address={addr}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start prometheus"),
    );

    // Every target up: the federation and the three shards.
    let targets = wait_for(Duration::from_secs(60), || {
        let out = Command::new("curl")
            .args(["-sS", "--max-time", "5"])
            .arg(format!("http://{addr}/api/v1/targets?state=active"))
            .output()
            .ok()?;
        let body: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
        let t = body["data"]["activeTargets"].as_array()?.clone();
        (t.len() == 4 && t.iter().all(|t| t["health"] == "up")).then_some(t)
    })
    .expect("every target up");
    let shards: BTreeSet<&str> = targets
        .iter()
        .filter_map(|t| t["labels"]["shard"].as_str())
        .collect();
    assert_eq!(shards, BTreeSet::from(["shard-0", "shard-1", "shard-2"]));

    // Work for every series, once Prometheus watches: a tenant with a placed Deployment,
    // and pods that fit nowhere.
    let tenant = c.file(
        "tenant.yaml",
        "apiVersion: tessera.io/v1alpha1\nkind: Tenant\nmetadata: {name: acme}\nspec: {namespaces: [acme]}\n",
    );
    c.ok(&["apply", "-f", &tenant]);
    c.ok(&["create", "namespace", "acme"]);
    // The Tenant in every shard first, so each shard's scheduler counts its pods as acme's.
    for shard in ["shard-0", "shard-1", "shard-2"] {
        let there = wait_for(Duration::from_secs(30), || {
            c.kubectl(&["--context", shard, "get", "tenant", "acme"])
                .status
                .success()
                .then_some(())
        });
        assert!(there.is_some(), "the Tenant reached {shard}");
    }
    c.deploy("acme", "web", 6);
    // Then more, once Prometheus has seen the first: rates need an increase to show.
    std::thread::sleep(Duration::from_secs(3));
    c.ok(&["scale", "deployment/web", "-n", "acme", "--replicas=9"]);
    c.rollout("acme", "web");
    in_shard(
        &c,
        "shard-0",
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: acme}\n---\n\
         apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: hungry, namespace: acme}\n\
         spec:\n  replicas: 2\n  selector: {matchLabels: {app: hungry}}\n  template:\n    \
         metadata: {labels: {app: hungry}}\n    spec:\n      containers:\n      - name: c\n        \
         image: nginx\n        resources: {requests: {cpu: \"64\"}}\n",
    );

    // Without the metrics token a port leaves out what names a tenant; another token is
    // refused, saying which one it wants.
    let shard0 = targets
        .iter()
        .find(|t| t["labels"]["shard"] == "shard-0")
        .and_then(|t| t["scrapeUrl"].as_str())
        .expect("shard-0's target")
        .to_owned();
    let scraped = data(&addr, "tessera_scheduler_tenant_pending_pods", |m, _| {
        m["tenant"] == "acme"
    });
    assert!(
        !scraped.is_empty(),
        "Prometheus reads tenants with the token"
    );
    let bare = Command::new("curl")
        .args(["-sS", &shard0])
        .output()
        .expect("curl");
    let bare = String::from_utf8_lossy(&bare.stdout);
    assert!(bare.contains("tessera_scheduler_pending_pods"), "{bare}");
    assert!(!bare.contains("tenant=\"acme\""), "{bare}");
    let forged = Command::new("curl")
        .args([
            "-sS",
            "-w",
            "%{http_code}",
            "-H",
            "Authorization: Bearer not-the-token",
            &shard0,
        ])
        .output()
        .expect("curl");
    let forged = String::from_utf8_lossy(&forged.stdout);
    assert!(
        forged.ends_with("401") && forged.contains("not this metrics port's metrics token"),
        "{forged}"
    );

    // Every endpoint's whole exposition (tenants' samples included) passes promtool: names,
    // units, `_total`, help.
    let token = std::fs::read_to_string(c.dir.path().join("pki/metrics.token")).expect("token");
    for t in &targets {
        let url = t["scrapeUrl"].as_str().expect("url");
        let said = promtool_on(url, token.trim());
        assert!(said.trim().is_empty(), "{url}: {said}");
    }

    // The key series, through the recording rules.
    let shard_of = |m: &serde_json::Value| m["shard"].as_str().unwrap_or_default().to_owned();
    let placed = data(
        &addr,
        "shard:tessera_scheduler_scheduled_pods:rate5m",
        |_, v| v > 0.0,
    );
    assert!(
        placed
            .iter()
            .all(|(m, _)| shard_of(m).starts_with("shard-")),
        "{placed:?}"
    );
    data(
        &addr,
        "shard_tenant:tessera_scheduler_pending_pods:sum",
        |m, v| m["tenant"] == "acme" && shard_of(m) == "shard-0" && v == 2.0,
    );
    let verbs = data(
        &addr,
        "shard_verb:tessera_apiserver_request_duration_seconds:p99_5m",
        |m, v| m["verb"] == "create" && v > 0.0,
    );
    assert!(verbs.iter().all(|(m, _)| m["verb"] != "watch"), "{verbs:?}");
    data(
        &addr,
        "shard_backend:tessera_store_txn_duration_seconds:p99_5m",
        |m, v| m["backend"] == "embedded" && v > 0.0,
    );
    data(
        &addr,
        "shard:tessera_store_embedded_fsync_duration_seconds:p99_5m",
        |_, v| v > 0.0,
    );
    data(
        &addr,
        "mode_outcome:tessera_federation_placements:rate5m",
        |m, v| m["outcome"] == "placed" && v > 0.0,
    );
    data(&addr, "shard_class:tessera_workqueue_depth:sum", |m, _| {
        m["class"] == "add"
    });
    // No server error: a ratio of 0 for each API server, not an empty result.
    let errors = data(
        &addr,
        "shard:tessera_apiserver_request_errors:ratio_rate5m",
        |_, v| v == 0.0,
    );
    assert_eq!(
        errors.len(),
        4,
        "the federation's and three shards': {errors:?}"
    );
    let age = data(
        &addr,
        "tessera_federation_shard_report_age_seconds",
        |_, v| v < 30.0,
    );
    assert_eq!(age.len(), 3, "{age:?}");
    let ready = data(&addr, "tessera_federation_shard_ready", |_, v| v == 1.0);
    assert!(ready.iter().all(|(_, v)| *v == 1.0), "{ready:?}");
    // A healthy fleet fires no alert.
    let firing = query(&addr, "ALERTS").expect("alerts");
    assert!(firing.is_empty(), "{firing:?}");

    // Every panel of the dashboard, as Grafana would ask with every shard chosen.
    for expr in exprs {
        let e = expr
            .replace("$__rate_interval", "1m")
            .replace("\"$shard\"", "\".+\"");
        data(&addr, &e, |_, v| !v.is_nan());
    }

    tessera_status_shows_the_fleet(&c);
}

/// `tessera status` against the fleet of the Prometheus test: three ready shards of four
/// nodes, tenant acme's nine pods placed, two pods of acme pending in shard-0.
fn tessera_status_shows_the_fleet(c: &Cluster) {
    let status = |kubeconfig: &Path, args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_tessera"))
            .arg("status")
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(args)
            .output()
            .expect("tessera status")
    };
    let out = status(&c.kubeconfig, &[]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains(": 3 shards (3 ready), 12 nodes,"), "{text}");
    for want in [
        "SHARD",
        "shard-0",
        "shard-2",
        "TENANT",
        "acme",
        "No failovers.",
    ] {
        assert!(text.lines().any(|l| l.starts_with(want)), "{want}: {text}");
    }

    let out = status(&c.kubeconfig, &["-o", "json"]);
    let fleet: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let shards = fleet["shards"].as_array().expect("shards");
    assert_eq!(shards.len(), 3, "{fleet}");
    assert!(
        shards.iter().all(|s| s["ready"] == true && s["nodes"] == 4),
        "{fleet}"
    );
    let shard0 = shards
        .iter()
        .find(|s| s["name"] == "shard-0")
        .expect("shard-0");
    assert_eq!(shard0["podsPending"], 2, "acme's hungry pods: {fleet}");
    let placed: f64 = shards
        .iter()
        .map(|s| s["podsPlacedPerSecond"].as_f64().unwrap_or(0.0))
        .sum();
    assert!(placed > 0.0, "nine pods placed within the minute: {fleet}");
    let acme = fleet["tenants"]
        .as_array()
        .and_then(|t| t.iter().find(|t| t["name"] == "acme"))
        .expect("acme");
    assert_eq!(
        (acme["pods"].as_u64(), acme["pending"].as_u64()),
        (Some(9), Some(0)),
        "{acme}"
    );
    assert_eq!(acme["fairShare"], 1.0, "the only tenant with work: {acme}");

    // --watch looks again and again; each look is one JSON line.
    let mut watch = Running(
        Command::new(env!("CARGO_BIN_EXE_tessera"))
            .args([
                "status",
                "--watch",
                "-o",
                "json",
                "--interval-seconds",
                "1",
                "--kubeconfig",
            ])
            .arg(&c.kubeconfig)
            .stdout(Stdio::piped())
            .spawn()
            .expect("watch"),
    );
    let lines = std::io::BufRead::lines(std::io::BufReader::new(
        watch.0.stdout.take().expect("stdout"),
    ));
    let looks: Vec<String> = lines.take(2).map(|l| l.expect("line")).collect();
    assert_eq!(looks.len(), 2);
    for l in &looks {
        let v: serde_json::Value = serde_json::from_str(l).expect("a JSON look");
        assert_eq!(v["shards"].as_array().map(Vec::len), Some(3));
    }
    drop(watch);

    // Pointed at a shard rather than the federation, it says what to fix.
    let at_shard = c.dir.path().join("shard-0.kubeconfig");
    std::fs::copy(&c.kubeconfig, &at_shard).expect("copy");
    let switched = Command::new("kubectl")
        .args(["config", "use-context", "shard-0", "--kubeconfig"])
        .arg(&at_shard)
        .output()
        .expect("kubectl");
    assert!(switched.status.success());
    let out = status(&at_shard, &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("serves no shards"),
        "{err}"
    );
    let out = status(&c.kubeconfig, &["--watch", "--interval-seconds", "0"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("--interval-seconds"),
        "{err}"
    );
}
