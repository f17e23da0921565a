//! The process runtime against a real API: containers run as real local processes, with
//! their output logged, exit codes reported, restarts with back-off, and SIGTERM then SIGKILL
//! on deletion; and `pods/log` through the API server to the agent's log endpoint.

mod support;

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use serde_json::{Value, json};
use support::{Fixture, get, logs, pod, res, until};
use tessera_apiserver::api::{Api, ApiResponse};
use tessera_apiserver::auth::{Tokens, User};
use tessera_apiserver::client::{Client, InProcess};
use tessera_apiserver::request::{ApiRequest, Verb, from_http};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn containers_run_as_processes() {
    let Fixture {
        dir,
        store,
        api,
        client: c,
        tokens: _,
        log_dir,
        agent,
    } = Fixture::start(|_| {}).await;
    let node = c.get(res("nodes"), None, "proc-0").await.expect("node");
    assert_eq!(node["metadata"]["labels"]["tessera.io/runtime"], "process");
    let port = node["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"]
        .as_u64()
        .expect("the node publishes its log endpoint");
    let registry = prometheus::Registry::new();
    agent.register_metrics(&registry).expect("metrics");
    let task = tokio::spawn(agent.run());
    let sh = |script: &str| json!(["sh", "-c", script]);

    // Output is logged; the exit code is reported; env and workingDir apply.
    c.create(
        res("pods"),
        Some("default"),
        &pod(
            "hello",
            sh("echo $GREETING; pwd; sleep 0.2; echo oops >&2"),
            "Never",
            json!({"env": [{"name": "GREETING", "value": "hi"}], "workingDir": "/tmp"}),
        ),
    )
    .await
    .expect("pod");
    until("hello succeeded", || async {
        get(&c, "hello")
            .await
            .is_some_and(|p| p["status"]["phase"] == "Succeeded")
    })
    .await;
    let p = get(&c, "hello").await.expect("pod");
    assert_eq!(
        p["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"],
        0
    );
    // stdout and stderr, in order, through the API and the agent.
    assert_eq!(
        logs(&c, "hello", "").await.expect("log"),
        "hi\n/tmp\noops\n"
    );
    assert_eq!(
        logs(&c, "hello", "container=main&tailLines=1")
            .await
            .expect("tail"),
        "oops\n"
    );
    assert_eq!(
        logs(&c, "hello", "limitBytes=4").await.expect("limit"),
        "hi\n/"
    );
    let stamped = logs(&c, "hello", "timestamps=true").await.expect("stamped");
    let first = stamped.lines().next().expect("a line");
    let (ts, text) = first.split_once(' ').expect("time, then text");
    assert!(ts.ends_with('Z') && ts.contains('T'), "{first}");
    assert_eq!(text, "hi");
    assert_eq!(
        logs(&c, "hello", "sinceTime=2099-01-01T00:00:00Z")
            .await
            .expect("since"),
        ""
    );
    // What cannot be answered says why, and what to fix.
    let e = logs(&c, "hello", "container=side")
        .await
        .expect_err("no such container");
    assert_eq!(e.code, 400);
    assert!(
        e.message.contains("container side is not valid"),
        "{}",
        e.message
    );
    let e = logs(&c, "hello", "previous=true")
        .await
        .expect_err("no previous run");
    assert_eq!(e.code, 400);
    assert!(
        e.message.contains("previous terminated container"),
        "{}",
        e.message
    );
    let e = logs(&c, "hello", "tailLines=-1")
        .await
        .expect_err("invalid");
    assert_eq!(e.code, 422);
    assert!(e.message.contains("tailLines"), "{}", e.message);
    assert_eq!(logs(&c, "missing", "").await.expect_err("no pod").code, 404);
    // An API server with another admin token is refused by the agent, and says so.
    let stranger: Arc<dyn Client> = Arc::new(InProcess::new(
        Api::new(store.clone(), None).with_node_proxy(Tokens::new("another-admin-token")),
        User::Admin,
    ));
    let e = logs(&stranger, "hello", "").await.expect_err("not trusted");
    assert_eq!(e.code, 500);
    assert!(
        e.message.contains("must share the admin token"),
        "{}",
        e.message
    );
    // The agent's endpoint speaks TLS only: a plain HTTP request gets no HTTP answer.
    let uid = p["metadata"]["uid"].as_str().expect("uid").to_owned();
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port as u16))
        .await
        .expect("connect");
    let req = format!(
        "GET /containerLogs/default/hello/main?podUID={uid} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    );
    tokio::io::AsyncWriteExt::write_all(&mut s, req.as_bytes())
        .await
        .expect("write");
    let mut answer = Vec::new();
    let _ = tokio::io::AsyncReadExt::read_to_end(&mut s, &mut answer).await;
    assert!(
        !answer.starts_with(b"HTTP/"),
        "{}",
        String::from_utf8_lossy(&answer)
    );
    // Over TLS, trusting the CA the node published (and nothing else), it refuses anyone
    // but its API server: no credential, or the admin token itself.
    let ca = node["metadata"]["annotations"]["tessera.io/agent-ca"]
        .as_str()
        .expect("the node publishes its endpoint's CA");
    assert!(ca.starts_with("-----BEGIN CERTIFICATE-----"), "{ca}");
    let ca_file = dir.path().join("agent-ca.pem");
    std::fs::write(&ca_file, ca).expect("write the CA");
    let url = format!("https://127.0.0.1:{port}/containerLogs/default/hello/main?podUID={uid}");
    for auth in [None, Some("Authorization: Bearer test-admin-token")] {
        let mut curl = std::process::Command::new("curl");
        curl.args(["-sS", "-w", "\n%{http_code}", "--cacert"])
            .arg(&ca_file)
            .arg(&url);
        if let Some(h) = auth {
            curl.args(["-H", h]);
        }
        let out = curl.output().expect("curl (installed by scripts/setup.sh)");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.ends_with("\n401"),
            "{text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // Without that CA (the system's roots alone), its certificate is not trusted.
    let out = std::process::Command::new("curl")
        .args(["-sS", &url])
        .output()
        .expect("curl");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("certificate"),
        "{err}"
    );

    // Probes. Readiness follows an exec probe; a failing liveness probe restarts the
    // container; a startup probe holds readiness back until it passes.
    let flags = dir.path().join("flags");
    std::fs::create_dir_all(&flags).expect("flags");
    // Probes run inside the container: the flags reach it through a hostPath volume.
    let flag = |name: &str| flags.join(name).display().to_string();
    let inside = |name: &str| format!("/flags/{name}");
    let probe = |cmd: String| {
        json!({"exec": {"command": ["sh", "-c", cmd]},
        "periodSeconds": 1, "failureThreshold": 1})
    };
    let mut probed = pod(
        "probed",
        sh("echo up; while true; do sleep 0.1; done"),
        "Always",
        json!({
            "readinessProbe": probe(format!("test -f {}", inside("ready"))),
            "livenessProbe": probe(format!("! test -f {}", inside("sick"))),
            "startupProbe": {"exec": {"command": ["sh", "-c", format!("test -f {}", inside("started"))]},
                "periodSeconds": 1, "failureThreshold": 60},
            "volumeMounts": [{"name": "flags", "mountPath": "/flags", "readOnly": true}],
        }),
    );
    probed["spec"]["volumes"] = json!([{"name": "flags", "hostPath": {"path": flag("")}}]);
    c.create(res("pods"), Some("default"), &probed)
        .await
        .expect("pod");
    let status = |p: &Value| p["status"]["containerStatuses"][0].clone();
    until("probed running, not started", || async {
        get(&c, "probed").await.is_some_and(|p| {
            p["status"]["phase"] == "Running"
                && status(&p)["started"] == false
                && status(&p)["ready"] == false
        })
    })
    .await;
    std::fs::write(flag("started"), "").expect("flag");
    until("started, not ready", || async {
        get(&c, "probed")
            .await
            .is_some_and(|p| status(&p)["started"] == true && status(&p)["ready"] == false)
    })
    .await;
    std::fs::write(flag("ready"), "").expect("flag");
    until("ready", || async {
        get(&c, "probed").await.is_some_and(|p| {
            status(&p)["ready"] == true
                && status(&p)["restartCount"] == 0
                && p["status"]["conditions"].as_array().is_some_and(|cs| {
                    cs.iter()
                        .any(|c| c["type"] == "Ready" && c["status"] == "True")
                })
        })
    })
    .await;
    // The container's processes show in the node's usage metrics.
    let families = registry.gather();
    let processes = families
        .iter()
        .find(|f| f.name() == "tessera_container_processes")
        .expect("usage family");
    let probed = processes
        .get_metric()
        .iter()
        .find(|m| m.get_label().iter().any(|l| l.value() == "probed"))
        .expect("probed's usage");
    assert!(probed.get_gauge().get_value() >= 1.0);
    assert!(families.iter().any(|f| {
        f.name() == "tessera_container_memory_rss_bytes"
            && f.get_metric()
                .iter()
                .any(|m| m.get_gauge().get_value() > 0.0)
    }));
    // ...and in metrics.k8s.io, as `kubectl top` reads it: the pod, and its node.
    let pod_metrics = || async {
        api.resource_metrics(&User::Admin, "namespaces/default/pods/probed", "")
            .await
            .unwrap_or(Value::Null)
    };
    until("pod metrics", || async {
        pod_metrics().await["containers"][0]["usage"]["memory"]
            .as_str()
            .is_some_and(|m| m != "0Ki" && m != "0")
    })
    .await;
    let top = pod_metrics().await;
    assert_eq!(top["kind"], "PodMetrics");
    assert_eq!(top["containers"][0]["name"], "main");
    assert!(top["containers"][0]["usage"]["cpu"].is_string(), "{top}");
    let nodes = api
        .resource_metrics(&User::Admin, "nodes", "")
        .await
        .expect("node metrics");
    assert_eq!(nodes["kind"], "NodeMetricsList");
    assert_eq!(nodes["items"][0]["metadata"]["name"], "proc-0");
    assert!(nodes["items"][0]["usage"]["memory"].is_string(), "{nodes}");
    let e = api
        .resource_metrics(&User::Admin, "namespaces/default/pods/nothing", "")
        .await
        .expect_err("no such pod");
    assert_eq!(e.code, 404);
    assert!(
        e.message
            .contains("podmetrics.metrics.k8s.io \"nothing\" not found")
    );
    let e = api
        .resource_metrics(&User::Tenant("acme".into()), "namespaces/default/pods", "")
        .await
        .expect_err("another tenant's namespace");
    assert_eq!(e.code, 403);
    std::fs::remove_file(flag("ready")).expect("unflag");
    until("not ready again", || async {
        get(&c, "probed")
            .await
            .is_some_and(|p| status(&p)["ready"] == false)
    })
    .await;
    std::fs::write(flag("sick"), "").expect("flag");
    until("restarted by the liveness probe", || async {
        get(&c, "probed")
            .await
            .is_some_and(|p| status(&p)["restartCount"].as_u64().unwrap_or(0) >= 1)
    })
    .await;
    std::fs::remove_file(flag("sick")).expect("unflag");
    let events = c
        .list(ApiRequest {
            namespace: Some("default".into()),
            ..ApiRequest::new(Verb::List, res("events"))
        })
        .await
        .expect("events");
    let said: Vec<String> = events["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter(|e| e["involvedObject"]["name"] == "probed")
        .map(|e| {
            format!(
                "{} {}",
                e["reason"].as_str().unwrap_or(""),
                e["message"].as_str().unwrap_or("")
            )
        })
        .collect();
    assert!(
        said.iter()
            .any(|m| m.starts_with("Unhealthy Liveness probe failed")),
        "{said:?}"
    );
    assert!(
        said.iter()
            .any(|m| m == "Killing Container main failed liveness probe, will be restarted"),
        "{said:?}"
    );
    c.delete(res("pods"), Some("default"), "probed", None)
        .await
        .expect("delete");

    // The environment as the kubelet builds it: the downward API, ConfigMap and Secret keys,
    // envFrom with a prefix, $(VAR) in values and args; a missing ConfigMap holds the
    // container back until it exists.
    c.create(
        res("pods"),
        Some("default"),
        &pod(
            "envy",
            json!(["sh", "-c", "echo $POD $KEY $PASS $CFG_color $GREETING $HOSTNAME", "$(POD)"]),
            "Never",
            json!({"env": [
                {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                {"name": "KEY", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "size"}}},
                {"name": "PASS", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "password"}}},
                {"name": "GREETING", "value": "hello-$(POD)"}],
                "envFrom": [{"prefix": "CFG_", "configMapRef": {"name": "settings"}}]}),
        ),
    )
    .await
    .expect("pod");
    until("held back by the missing ConfigMap", || async {
        get(&c, "envy").await.is_some_and(|p| {
            let waiting = &p["status"]["containerStatuses"][0]["state"]["waiting"];
            waiting["reason"] == "CreateContainerConfigError"
                && waiting["message"] == "configmap \"settings\" not found"
        })
    })
    .await;
    c.create(
        res("configmaps"),
        Some("default"),
        &json!({"metadata": {"name": "settings"}, "data": {"size": "large", "color": "blue"}}),
    )
    .await
    .expect("configmap");
    c.create(
        res("secrets"),
        Some("default"),
        &json!({"metadata": {"name": "creds"}, "data": {"password": "czNjcjN0"}}),
    )
    .await
    .expect("secret");
    until("envy succeeded", || async {
        get(&c, "envy")
            .await
            .is_some_and(|p| p["status"]["phase"] == "Succeeded")
    })
    .await;
    assert_eq!(
        logs(&c, "envy", "").await.expect("log"),
        "envy large s3cr3t blue hello-envy envy\n"
    );

    // A failing container restarts with back-off (OnFailure), counting restarts.
    c.create(
        res("pods"),
        Some("default"),
        &pod("crash", sh("echo try; exit 3"), "OnFailure", json!({})),
    )
    .await
    .expect("pod");
    until("two restarts", || async {
        get(&c, "crash").await.is_some_and(|p| {
            p["status"]["containerStatuses"][0]["restartCount"]
                .as_u64()
                .unwrap_or(0)
                >= 2
        })
    })
    .await;
    let p = get(&c, "crash").await.expect("pod");
    let cs = &p["status"]["containerStatuses"][0];
    assert_eq!(cs["lastState"]["terminated"]["exitCode"], 3);
    assert_eq!(
        logs(&c, "crash", "previous=true")
            .await
            .expect("previous run"),
        "try\n"
    );

    // A failing container under Never: the pod Failed with its exit code.
    c.create(
        res("pods"),
        Some("default"),
        &pod("fails", sh("exit 7"), "Never", json!({})),
    )
    .await
    .expect("pod");
    until("fails failed", || async {
        get(&c, "fails")
            .await
            .is_some_and(|p| p["status"]["phase"] == "Failed")
    })
    .await;
    assert_eq!(
        get(&c, "fails").await.expect("pod")["status"]["containerStatuses"][0]["state"]["terminated"]
            ["exitCode"],
        7
    );

    // Deletion: SIGTERM first (the process says goodbye and exits), then the pod goes.
    c.create(
        res("pods"),
        Some("default"),
        &pod(
            "polite",
            sh("trap 'echo bye; exit 0' TERM; echo up; while true; do sleep 0.05; done"),
            "Always",
            json!({}),
        ),
    )
    .await
    .expect("pod");
    until("polite running", || async {
        get(&c, "polite")
            .await
            .is_some_and(|p| p["status"]["phase"] == "Running")
    })
    .await;
    let polite = get(&c, "polite").await.expect("pod");
    let polite_dir = log_dir.join(format!(
        "default_polite_{}",
        polite["metadata"]["uid"].as_str().expect("uid")
    ));
    // A follower sees the output as it comes (its first chunk arrives while the container
    // runs), and its stream ends with the container.
    let path = "/api/v1/namespaces/default/pods/polite/log";
    let req = from_http("GET", path, "follow=true", None, None, Default::default())
        .expect("request")
        .expect("served");
    let ApiResponse::Stream { mut body, .. } = c.call(req).await.expect("follow") else {
        panic!("a log follow answers a stream");
    };
    let mut text = String::new();
    while !text.contains("up\n") {
        let chunk = body
            .next()
            .await
            .expect("the stream stays open while the container runs")
            .expect("chunk");
        text.push_str(std::str::from_utf8(&chunk).expect("utf-8"));
    }
    c.delete(res("pods"), Some("default"), "polite", None)
        .await
        .expect("delete");
    tokio::time::timeout(Duration::from_secs(15), async {
        while let Some(chunk) = body.next().await {
            text.push_str(std::str::from_utf8(&chunk.expect("chunk")).expect("utf-8"));
        }
    })
    .await
    .expect("the stream ended with the container");
    assert_eq!(text, "up\nbye\n", "SIGTERM reached the process");
    until("polite gone", || async {
        get(&c, "polite").await.is_none()
    })
    .await;
    until("its logs removed with it", || async {
        !polite_dir.exists()
    })
    .await;

    // One that ignores SIGTERM is killed after its grace period.
    c.create(
        res("pods"),
        Some("default"),
        &pod(
            "stubborn",
            sh("trap '' TERM; while true; do sleep 0.05; done"),
            "Always",
            json!({}),
        ),
    )
    .await
    .expect("pod");
    until("stubborn running", || async {
        get(&c, "stubborn")
            .await
            .is_some_and(|p| p["status"]["phase"] == "Running")
    })
    .await;
    let mut req = ApiRequest::new(Verb::Delete, res("pods"));
    req.namespace = Some("default".into());
    req.name = Some("stubborn".into());
    req.params.grace_period_seconds = Some(1);
    c.call(req).await.expect("delete");
    let started = std::time::Instant::now();
    until("stubborn gone", || async {
        get(&c, "stubborn").await.is_none()
    })
    .await;
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "waited for the grace period"
    );

    // No command: the runtime says why it cannot start it.
    c.create(res("pods"), Some("default"),
        &json!({"metadata": {"name": "image-only", "namespace": "default"},
            "spec": {"nodeName": "proc-0", "restartPolicy": "Never", "containers": [{"name": "main", "image": "nginx"}]}}))
        .await
        .expect("pod");
    until("a reason", || async {
        get(&c, "image-only")
            .await
            .is_some_and(|p| p.to_string().contains("CreateContainerConfigError"))
    })
    .await;
    // When the agent stops, nothing it started keeps running: a container with a child of
    // its own is running when the agent's task is dropped; both are gone after.
    c.create(
        res("pods"),
        Some("default"),
        &pod(
            "lingering",
            sh("sleep 300 & sleep 300"),
            "Always",
            json!({}),
        ),
    )
    .await
    .expect("pod");
    until("lingering running", || async {
        get(&c, "lingering")
            .await
            .is_some_and(|p| p["status"]["containerStatuses"][0]["state"]["running"].is_object())
    })
    .await;
    let p = get(&c, "lingering").await.expect("pod");
    let pgid: u32 = p["status"]["containerStatuses"][0]["containerID"]
        .as_str()
        .and_then(|id| id.strip_prefix("process://"))
        .and_then(|id| id.parse().ok())
        .expect("a process id");
    let in_group = || tessera_agent::usage::sample(&[pgid])[&pgid].processes;
    until("the container and its child", || async { in_group() >= 2 }).await;
    task.abort();
    let _ = task.await;
    until("no process left in the group", || async { in_group() == 0 }).await;
}
