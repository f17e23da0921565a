//! The process runtime as an isolation boundary, tried as an attacking tenant would: a pod
//! looks for the host (the agent's data directory and token, its processes, services on the
//! host's loopback, root-owned files, writable system paths) and finds none of it — every
//! probe only looks (`test -w`, reads), so the script harms nothing even where the sandbox
//! is missing (as with `--process-isolation=off`, where it fails); it runs as an
//! unprivileged host id whatever its uid inside; volumes, identity, limits and probes work
//! inside the sandbox.

mod support;

use std::io::Read;
use std::time::Duration;

use serde_json::{Value, json};
use support::{Fixture, get, logs, pod, res, until, until_within};
use tessera_agent::cgroups::Cgroups;

/// Host ids handed to pods start here.
const FIRST_POD_ID: u64 = 1 << 30;

/// The host pids of a container's processes: the supervisor (its containerID) and every
/// descendant.
fn tree(root: u32) -> Vec<u32> {
    let mut out = vec![root];
    let mut i = 0;
    while i < out.len() {
        let p = out[i];
        if let Ok(kids) = std::fs::read_to_string(format!("/proc/{p}/task/{p}/children")) {
            out.extend(
                kids.split_whitespace()
                    .filter_map(|k| k.parse::<u32>().ok()),
            );
        }
        i += 1;
    }
    out
}

/// A process's real uid on the host.
fn host_uid(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|u| u.parse().ok())
}

fn container_pid(p: &Value) -> u32 {
    reported_pid(p).expect("a process id")
}

fn reported_pid(p: &Value) -> Option<u32> {
    p["status"]["containerStatuses"][0]["containerID"]
        .as_str()
        .and_then(|id| id.strip_prefix("process://"))
        .and_then(|id| id.parse().ok())
}

/// Pod `name` once its agent has reported its container's process (its output can reach
/// the logs before the status reaches the API).
async fn with_pid(f: &Fixture, name: &str) -> Value {
    until(&format!("{name}'s container id"), || async {
        get(&f.client, name)
            .await
            .is_some_and(|p| reported_pid(&p).is_some())
    })
    .await;
    get(&f.client, name).await.expect("pod")
}

/// Waits until pod `name` (`name?container=c` for one of several) printed `marker`; its
/// whole log.
async fn log_until(f: &Fixture, name: &str, marker: &str) -> String {
    let (name, query) = name.split_once('?').unwrap_or((name, ""));
    for _ in 0..600 {
        let text = logs(&f.client, name, query).await.unwrap_or_default();
        if text.contains(marker) {
            return text;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let pod = get(&f.client, name).await;
    panic!("{name} never printed {marker:?}; pod: {pod:?}");
}

/// What an attacker tries from inside; each line says what happened.
fn escape_script(data_dir: &str, host_port: u16) -> String {
    format!(
        r#"
echo "uid=$(id -u)"
echo "token=$(cat {data_dir}/pki/admin.token 2>&1)"
echo "datadir=$(ls {data_dir} 2>&1 | head -3 | tr '\n' ' ')"
echo "procs=$(ls /proc | grep -c '^[0-9]')"
echo "ps=$(ps -eo comm= 2>/dev/null | tr '\n' ' ')"
(exec 3<>/dev/tcp/127.0.0.1/{host_port}) 2>/dev/null && echo "loopback=reached" || echo "loopback=refused"
echo "shadow=$(head -c 20 /etc/shadow 2>&1)"
test -w /usr/bin && echo "usr=writable" || echo "usr=read-only"
test -w /proc/sys/vm/swappiness && echo "sysctl=writable" || echo "sysctl=read-only"
echo "caps=$(grep CapEff /proc/self/status | tr -d '\t')"
echo "nnp=$(grep NoNewPrivs /proc/self/status | tr -d '\t')"
echo "seccomp=$(grep '^Seccomp:' /proc/self/status | tr -d '\t')"
unshare --user true 2>/dev/null && echo "userns=created" || echo "userns=refused"
echo "host=$(hostname)"
echo done
sleep 60
"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_finds_nothing_of_the_host() {
    let f = Fixture::start(|_| {}).await;
    let task = tokio::spawn(f.agent.clone().run());
    // What the attacker is after: the admin token in the data directory, a service on the
    // host's loopback.
    let data = f.dir.path();
    std::fs::create_dir_all(data.join("pki")).expect("pki");
    std::fs::write(data.join("pki/admin.token"), "SECRET-ADMIN-TOKEN").expect("token");
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("listen");
    let port = listener.local_addr().expect("addr").port();
    let script = escape_script(&data.display().to_string(), port);
    for (name, extra) in [
        ("as-root", json!({})),
        // What the reporter's pod asked for: a uid of its choosing.
        (
            "as-nobody",
            json!({"securityContext": {"runAsUser": 65534}}),
        ),
    ] {
        let mut p = pod(name, json!(["bash", "-c", script]), "Never", extra);
        p["spec"]["hostname"] = json!(name);
        f.client
            .create(res("pods"), Some("default"), &p)
            .await
            .expect("pod");
    }
    for (name, uid_inside) in [("as-root", 0u64), ("as-nobody", 65534)] {
        let out = log_until(&f, name, "done").await;
        let line = |key: &str| {
            out.lines()
                .find_map(|l| l.strip_prefix(&format!("{key}=")))
                .unwrap_or_else(|| panic!("{key} in {out}"))
                .to_owned()
        };
        assert_eq!(line("uid"), uid_inside.to_string(), "{out}");
        assert!(!out.contains("SECRET-ADMIN-TOKEN"), "{out}");
        assert!(line("token").contains("No such file"), "{out}");
        assert!(line("datadir").contains("No such file"), "{out}");
        // Its own init, its shell and what the shell runs: not the agent, not the host.
        let procs: usize = line("procs").parse().expect("a count");
        assert!(procs <= 6, "sees {procs} processes: {out}");
        assert_eq!(line("loopback"), "refused", "{out}");
        assert!(line("shadow").contains("Permission denied"), "{out}");
        assert_eq!(line("usr"), "read-only");
        assert_eq!(line("sysctl"), "read-only");
        assert_eq!(line("caps"), "CapEff:0000000000000000");
        assert_eq!(line("nnp"), "NoNewPrivs:1");
        // The default seccomp filter: a nested user namespace (which would hand the pod
        // mount and network-device rights inside it) is refused.
        assert_eq!(line("seccomp"), "Seccomp:2", "{out}");
        assert_eq!(line("userns"), "refused", "{out}");
        assert_eq!(line("host"), name);
        // On the host, every process of the container runs as an id of the pod's range.
        let p = with_pid(&f, name).await;
        let pids = tree(container_pid(&p));
        assert!(pids.len() >= 3, "supervisor, init, command: {pids:?}");
        let uids: Vec<u64> = pids.iter().filter_map(|p| host_uid(*p)).collect();
        let range = uids[0] / 65536;
        assert!(
            uids.iter()
                .all(|u| *u >= FIRST_POD_ID && u / 65536 == range),
            "every process in the pod's range: {uids:?}"
        );
        assert!(
            uids.iter().any(|u| u % 65536 == uid_inside),
            "the command as uid {uid_inside} of the range: {uids:?}"
        );
    }
    // The two pods hold different ranges.
    let range = |name: &'static str| {
        let f = &f;
        async move {
            let p = with_pid(f, name).await;
            host_uid(container_pid(&p)).expect("uid") / 65536
        }
    };
    assert_ne!(range("as-root").await, range("as-nobody").await);
    // Unconfined (Pod Security allows it only at privileged, as this namespace is): no
    // filter, and the same attempt succeeds — the refusal above was the filter's.
    let mut p = pod(
        "unconfined",
        json!([
            "bash",
            "-c",
            "echo \"seccomp=$(grep '^Seccomp:' /proc/self/status | tr -d '\\t')\"; unshare --user true && echo userns=created || echo userns=refused; echo done; sleep 60"
        ]),
        "Never",
        json!({"securityContext": {"seccompProfile": {"type": "Unconfined"}}}),
    );
    p["spec"]["hostname"] = json!("unconfined");
    f.client
        .create(res("pods"), Some("default"), &p)
        .await
        .expect("pod");
    let out = log_until(&f, "unconfined", "done").await;
    assert!(out.contains("seccomp=Seccomp:0"), "{out}");
    assert!(out.contains("userns=created"), "{out}");
    drop(listener);
    task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn volumes_identity_and_probes_work_inside() {
    let f = Fixture::start(|_| {}).await;
    let task = tokio::spawn(f.agent.clone().run());
    let c = &f.client;
    c.create(
        res("configmaps"),
        Some("default"),
        &json!({"metadata": {"name": "conf"}, "data": {"app.conf": "size=large\n"}}),
    )
    .await
    .expect("cm");
    c.create(
        res("secrets"),
        Some("default"),
        &json!({"metadata": {"name": "creds"}, "data": {"password": "czNjcjN0"}}),
    )
    .await
    .expect("secret");
    // A web server on the pod's own loopback, probed over HTTP and TCP from inside its
    // network namespace; an exec probe that checks who and where it is.
    let server = "use IO::Socket::INET; my $s = IO::Socket::INET->new(LocalAddr => '127.0.0.1:18080', \
        Listen => 5, ReuseAddr => 1) or die \"listen: $!\"; print \"serving\\n\"; $| = 1; \
        while (my $c = $s->accept) { print $c \"HTTP/1.0 200 OK\\r\\n\\r\\nok\"; close $c }";
    let writer = "id; cat /conf/app.conf; cat /secret/password; echo; stat -c '%a' /secret/password; \
        echo shared > /cache/note; { echo x > /conf/new; } 2>/dev/null || echo conf-read-only; \
        echo written; sleep 60";
    let p = json!({"metadata": {"name": "vols", "namespace": "default"}, "spec": {
        "nodeName": "proc-0", "restartPolicy": "Never", "hostname": "box",
        "securityContext": {"runAsUser": 1000, "runAsGroup": 3000, "fsGroup": 2000},
        "volumes": [
            {"name": "conf", "configMap": {"name": "conf"}},
            {"name": "secret", "secret": {"secretName": "creds", "defaultMode": 0o400}},
            {"name": "cache", "emptyDir": {}}],
        "containers": [
            {"name": "writer", "image": "x", "command": ["sh", "-c", writer],
             "volumeMounts": [{"name": "conf", "mountPath": "/conf", "readOnly": true},
                              {"name": "secret", "mountPath": "/secret"},
                              {"name": "cache", "mountPath": "/cache"}]},
            {"name": "web", "image": "x", "command": ["perl", "-e", server],
             "volumeMounts": [{"name": "cache", "mountPath": "/data"}],
             "readinessProbe": {"httpGet": {"path": "/", "port": 18080}, "periodSeconds": 1},
             "livenessProbe": {"tcpSocket": {"port": 18080}, "periodSeconds": 1},
             "startupProbe": {"exec": {"command": ["sh", "-c",
                 "test \"$(hostname)\" = box && test \"$(id -u)\" = 1000 && test -f /data/note"]},
                 "periodSeconds": 1, "failureThreshold": 30}}]}});
    c.create(res("pods"), Some("default"), &p)
        .await
        .expect("pod");
    let out = log_until(&f, "vols?container=writer", "written").await;
    // stdout and stderr are read apart: find the line, not the first one.
    let id = out
        .lines()
        .find(|l| l.starts_with("uid="))
        .unwrap_or_default();
    assert!(
        id.starts_with("uid=1000") && id.contains(" gid=3000") && id.ends_with("groups=3000,2000"),
        "identity from the security context: {out}"
    );
    assert!(out.contains("size=large"), "{out}");
    assert!(out.contains("s3cr3t"), "{out}");
    assert!(
        out.contains("\n440\n"),
        "the Secret's defaultMode, group-readable for the fsGroup: {out}"
    );
    assert!(out.contains("conf-read-only"), "{out}");
    until("web ready through its probes", || async {
        get(c, "vols").await.is_some_and(|p| {
            p["status"]["containerStatuses"]
                .as_array()
                .is_some_and(|cs| cs.iter().any(|s| s["name"] == "web" && s["ready"] == true))
        })
    })
    .await;
    // The server listens on the pod's loopback, not the host's.
    assert!(
        std::net::TcpStream::connect_timeout(
            &"127.0.0.1:18080".parse().expect("addr"),
            Duration::from_millis(500)
        )
        .is_err(),
        "the pod's port is not on the host's loopback"
    );
    let web = get(c, "vols").await.expect("pod");
    let restarts = web["status"]["containerStatuses"]
        .as_array()
        .expect("statuses")
        .iter()
        .map(|s| s["restartCount"].as_u64().unwrap_or(0))
        .sum::<u64>();
    assert_eq!(restarts, 0, "liveness held: {web}");
    // Deleted: its sandbox leaves nothing on the host.
    let uid = web["metadata"]["uid"].as_str().expect("uid").to_owned();
    c.delete(res("pods"), Some("default"), "vols", None)
        .await
        .expect("delete");
    until("vols gone", || async { get(c, "vols").await.is_none() }).await;
    until("its sandbox removed", || async {
        !f.dir.path().join("pods").join(&uid).exists()
    })
    .await;
    task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_are_enforced_by_the_kernel() {
    let cgroups = Cgroups::detect(std::path::Path::new("/sys/fs/cgroup"));
    assert!(
        cgroups.unavailable().is_none(),
        "this test needs cgroups (v1 or v2) as the CI machine has them: {cgroups:?}"
    );
    let f = Fixture::start(|c| c.pids_limit = Some(40)).await;
    let task = tokio::spawn(f.agent.clone().run());
    let c = &f.client;
    let limited = |name: &str, script: &str, limits: Value| {
        pod(
            name,
            json!(["bash", "-c", script]),
            "Never",
            json!({"resources": {"limits": limits}}),
        )
    };
    // Memory: past its limit, the kernel's OOM killer ends it, and the status says so.
    c.create(
        res("pods"),
        Some("default"),
        &limited(
            "hog",
            "a=$(head -c 400000000 /dev/zero | tr '\\0' x); echo ${#a}",
            json!({"memory": "64Mi"}),
        ),
    )
    .await
    .expect("pod");
    // Processes: the 41st fork fails.
    c.create(
        res("pods"),
        Some("default"),
        &limited(
            "forker",
            "for i in $(seq 1 80); do sleep 30 & done 2>&1 | head -1; echo forked",
            json!({}),
        ),
    )
    .await
    .expect("pod");
    // CPU: a quarter of a CPU is a 25 ms quota per 100 ms period.
    c.create(
        res("pods"),
        Some("default"),
        &limited(
            "spinner",
            "echo spinning; while :; do :; done",
            json!({"cpu": "250m"}),
        ),
    )
    .await
    .expect("pod");
    until("hog killed", || async {
        get(c, "hog")
            .await
            .is_some_and(|p| p["status"]["phase"] == "Failed")
    })
    .await;
    let hog = get(c, "hog").await.expect("pod");
    let term = &hog["status"]["containerStatuses"][0]["state"]["terminated"];
    assert_eq!(term["reason"], "OOMKilled", "{hog}");
    assert_eq!(term["exitCode"], 137, "{hog}");
    let out = log_until(&f, "forker", "forked").await;
    assert!(
        out.contains("Resource temporarily unavailable") || out.contains("retry"),
        "{out}"
    );
    log_until(&f, "spinner", "spinning").await;
    let spinner = with_pid(&f, "spinner").await;
    let uid = spinner["metadata"]["uid"].as_str().expect("uid");
    let quota = match &cgroups {
        Cgroups::V2(root) => root.join(format!("proc-0/pod-{uid}/main/cpu.max")),
        Cgroups::V1 { cpu, .. } => cpu.join(format!("proc-0/pod-{uid}/main/cpu.cfs_quota_us")),
        Cgroups::Unavailable(_) => unreachable!("checked above"),
    };
    let mut text = String::new();
    std::fs::File::open(&quota)
        .and_then(|mut f| f.read_to_string(&mut text))
        .expect("the container's cgroup");
    assert!(
        text.trim() == "25000" || text.trim() == "25000 100000",
        "{text}"
    );
    // The spinner's processes are in that cgroup.
    let procs = std::fs::read_to_string(quota.with_file_name("cgroup.procs")).expect("procs");
    let pid = container_pid(&spinner);
    assert!(
        procs.lines().any(|l| l == pid.to_string()),
        "{pid} in {procs}"
    );
    for name in ["forker", "spinner"] {
        c.delete(res("pods"), Some("default"), name, None)
            .await
            .expect("delete");
    }
    // The forker's background sleeps (30 s) and a container that outlives SIGTERM may hold
    // a pod until its 30 s grace period ends: the bound is past both.
    until_within("pods gone", Duration::from_secs(60), || async {
        get(c, "forker").await.is_none() && get(c, "spinner").await.is_none()
    })
    .await;
    until("the spinner's cgroup removed", || async {
        !quota.parent().is_some_and(|d| d.exists())
    })
    .await;
    task.abort();
}

/// The root is staged on a tmpfs over `/tmp` in the container's mount namespace; an agent
/// binary installed under `/tmp` (a checkout there) still starts its containers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_helper_that_lives_under_the_staging_directory_starts_containers() {
    use tessera_agent::isolation::Isolation;
    use tessera_agent::sandbox::{Launcher, STAGING};
    if std::env::var_os("TESSERA_TEST_ISOLATION_OFF").is_some() {
        return;
    }
    let bin = tempfile::Builder::new()
        .prefix("helper")
        .tempdir_in(STAGING)
        .expect("a directory under the staging path");
    let exe = bin.path().join("tessera-sandbox");
    std::fs::copy(env!("CARGO_BIN_EXE_tessera-sandbox"), &exe).expect("copy the helper");
    let f = Fixture::start(|c| {
        c.isolation = Isolation::Sandbox(Launcher {
            exe: exe.clone(),
            prefix: vec![],
        })
    })
    .await;
    let task = tokio::spawn(f.agent.clone().run());
    f.client
        .create(
            res("pods"),
            Some("default"),
            &pod(
                "staged",
                json!(["sh", "-c", "echo started-as-$(id -u)"]),
                "Never",
                json!({}),
            ),
        )
        .await
        .expect("pod");
    let log = log_until(&f, "staged", "started-as-").await;
    assert!(log.contains("started-as-0"), "{log}");
    until("the pod succeeded", || async {
        get(&f.client, "staged")
            .await
            .is_some_and(|p| p["status"]["phase"] == "Succeeded")
    })
    .await;
    task.abort();
}
