//! Frameworks through offers, as the tests drive them: the endpoint a `tessera up` banner
//! names, the example framework as a process, and each task pod as kubectl shows it.

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use tessera_proto::offers::v1 as pb;

use crate::support::Cluster;

/// The offers endpoint `c` printed in its banner (a shard's or the federation's).
pub fn offers_url(c: &Cluster) -> String {
    c.banner
        .iter()
        .find_map(|l| l.trim().strip_prefix("offers:"))
        .and_then(|rest| rest.split_whitespace().next())
        .expect("the banner names the offers endpoint")
        .to_owned()
}

/// `tessera framework batch` against `c`'s offers endpoint, running `file`'s tasks with the
/// token in `token`.
pub fn framework(c: &Cluster, token: &Path, file: &str, extra: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tessera"));
    cmd.args([
        "framework",
        "batch",
        "--offers",
        &offers_url(c),
        "--file",
        file,
    ])
    .arg("--ca")
    .arg(c.dir.path().join("pki/ca.crt"))
    .arg("--token-file")
    .arg(token)
    .args(extra);
    cmd
}

/// A process's stdout and stderr together.
pub fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A pod as the framework tests look at it.
#[derive(Clone, Debug)]
pub struct TaskPod {
    /// Its `tessera.io/framework` label (empty for other pods).
    pub framework: String,
    pub node: String,
    pub phase: String,
    /// Its first container's cpu request, milli.
    pub cpu: i64,
    pub name: String,
}

/// One look at every pod through `kubeconfig` (in `context`, if given).
pub fn pods(kubeconfig: &Path, context: Option<&str>) -> Vec<TaskPod> {
    let mut cmd = Command::new("kubectl");
    cmd.arg("--kubeconfig").arg(kubeconfig);
    if let Some(c) = context {
        cmd.args(["--context", c]);
    }
    let out = cmd
        .args([
        "get",
        "pods",
        "-A",
        "-o",
        "jsonpath={range .items[*]}{.metadata.labels.tessera\\.io/framework}|{.spec.nodeName}|{.status.phase}|{.spec.containers[0].resources.requests.cpu}|{.metadata.name}{\"\\n\"}{end}",
        ])
        .output()
        .expect("kubectl");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split('|').collect();
            let [fw, node, phase, cpu, name] = f.as_slice() else {
                return None;
            };
            let cpu = match cpu.strip_suffix('m') {
                Some(m) => m.parse().ok()?,
                None => (cpu.parse::<f64>().ok()? * 1000.0) as i64,
            };
            Some(TaskPod {
                framework: (*fw).to_owned(),
                node: (*node).to_owned(),
                phase: (*phase).to_owned(),
                cpu,
                name: (*name).to_owned(),
            })
        })
        .collect()
}

/// Runs a framework that must be refused; what it printed.
pub fn refused(c: &Cluster, token: &Path, file: &str, extra: &[&str]) -> String {
    let out = framework(c, token, file, extra)
        .output()
        .expect("framework");
    assert!(!out.status.success(), "not refused: {}", text(&out));
    text(&out)
}

/// The endpoint (`what`: "this shard", "the federation") refuses a tenant's framework
/// outside its namespaces, and a token it does not know.
pub fn refuses_strangers(c: &Cluster, token: &Path, what: &str) {
    let one = c.file("one.txt", "t1 500m 128Mi 1\n");
    let out = refused(c, token, &one, &["--namespace", "default"]);
    assert!(
        out.contains("may not use namespace default"),
        "a tenant's framework runs only in its namespaces: {out}"
    );
    let forged = c.dir.path().join("forged.token");
    std::fs::write(&forged, "not-a-token").expect("write");
    let out = refused(c, &forged, &one, &["--namespace", "team-a"]);
    assert!(
        out.contains(&format!("token is not valid for {what}")),
        "{out}"
    );
}

/// A raw framework's session: subscribes `info` at `url` (CA `ca`) with `token`; the call
/// sender and the event stream.
pub async fn session(
    url: &str,
    ca: &str,
    token: &str,
    info: pb::FrameworkInfo,
) -> (
    tokio::sync::mpsc::UnboundedSender<pb::Call>,
    tonic::Streaming<pb::Event>,
) {
    let channel = tonic::transport::Endpoint::from_shared(url.to_owned())
        .expect("url")
        .tls_config(
            tonic::transport::ClientTlsConfig::new()
                .ca_certificate(tonic::transport::Certificate::from_pem(ca)),
        )
        .expect("tls")
        .connect()
        .await
        .expect("connect");
    let mut client = pb::scheduler_client::SchedulerClient::new(channel);
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<pb::Call>();
    tx.send(call(pb::call::Call::Subscribe(pb::call::Subscribe {
        framework: Some(info),
    })))
    .expect("send");
    let mut req = tonic::Request::new(tokio_stream::wrappers::UnboundedReceiverStream::new(rx));
    req.metadata_mut().insert(
        "authorization",
        format!("Bearer {}", token.trim()).parse().expect("header"),
    );
    let events = client.session(req).await.expect("session").into_inner();
    (tx, events)
}

/// A call.
pub fn call(c: pb::call::Call) -> pb::Call {
    pb::Call { call: Some(c) }
}

/// The next event other than a heartbeat (within 30 s).
pub async fn next(events: &mut tonic::Streaming<pb::Event>) -> pb::event::Event {
    loop {
        let e = tokio::time::timeout(Duration::from_secs(30), events.message())
            .await
            .expect("an event in time")
            .expect("stream")
            .expect("open");
        if !matches!(e.event, Some(pb::event::Event::Heartbeat(_))) {
            return e.event.expect("an event");
        }
    }
}

/// A task of `cpu` milli-cpu and 64 MiB that runs `secs` seconds on a simulated node.
pub fn task(name: &str, cpu: i64, secs: &str) -> pb::TaskInfo {
    pb::TaskInfo {
        name: name.into(),
        resources: Some(pb::Resources {
            cpu_milli: cpu,
            memory_bytes: 64 << 20,
        }),
        image: "busybox".into(),
        annotations: [("tessera.io/sim-run-seconds".to_owned(), secs.to_owned())].into(),
        ..Default::default()
    }
}

/// `tessera bench offers --shards SHARDS --weights 1,3 --nodes 8 --waves 3`: its JSON, after
/// checking the figures every run must have — offers made, accept → bound timed, samples
/// at saturation, and DRF between the weights within the 5 %.
pub fn bench_offers(shards: usize) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["bench", "offers", "--shards", &shards.to_string()])
        .args(["--weights", "1,3", "--nodes", "8", "--waves", "3", "--json"])
        .env("TESSERA_LOG", "warn")
        .output()
        .expect("bench offers");
    assert!(out.status.success(), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().last().expect("a line");
    let r: serde_json::Value = serde_json::from_str(line).expect("JSON");
    assert_eq!(r["frameworks"], 2);
    assert!(r["offers"].as_u64().expect("offers") >= r["accepted"].as_u64().expect("accepted"));
    assert!(
        r["accept_to_bound_p99_ms"].as_f64().expect("p99") > 0.0,
        "{r}"
    );
    assert!(r["saturated_samples"].as_u64().expect("samples") > 0, "{r}");
    assert!(r["drf_error"].as_f64().expect("error") <= 0.05, "{r}");
    r
}
