//! Helpers shared by the tests that run `tessera` and kubectl as real processes.
#![allow(dead_code)]

pub mod certs;
pub mod conversion;
pub mod extension;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Kills the child when dropped, so that a failing assertion does not leave a process
/// running (holding the test's output pipes open).
pub struct Running(pub std::process::Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A loopback address nothing listens on right now.
pub fn free_addr() -> String {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    format!("127.0.0.1:{port}")
}

/// `tessera up` with its three listeners on the given addresses and its data in `dir`.
pub fn up_command(metrics: &str, grpc: &str, dir: &Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tessera"));
    cmd.args([
        "up",
        "--shards=0",
        "--metrics-addr",
        metrics,
        "--grpc-addr",
        grpc,
    ])
    .args(["--api-addr", "127.0.0.1:0", "--data-dir"])
    .arg(dir);
    cmd
}

/// A federation process (`tessera federation`) on `grpc` with a 3 s shard lease and a 2 s
/// failover margin — faults play out in seconds — and `extra` flags.
pub fn quick_federation(grpc: &str, extra: &[&str]) -> Cluster {
    let addr = format!("--grpc-addr={grpc}");
    let mut args = vec![
        addr.as_str(),
        "--shard-lease-seconds=3",
        "--failover-margin-seconds=2",
    ];
    args.extend_from_slice(extra);
    Cluster::start_with("federation", &args)
}

/// Starts shard `shard`'s federation agent `name` (`tessera join`), serving its metrics on a
/// port of its own; killed when dropped.
pub fn join_agent(fed: &Cluster, shard: &Cluster, grpc: &str, name: &str) -> Running {
    Running(
        join_command(fed, shard, grpc, name)
            .args(["--metrics-addr", &free_addr()])
            .spawn()
            .expect("tessera join"),
    )
}

/// `tessera join`: shard `shard`'s federation agent named `name`, joining federation `fed`
/// at its gRPC address `grpc`.
pub fn join_command(fed: &Cluster, shard: &Cluster, grpc: &str, name: &str) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tessera"));
    cmd.args(["join", "--federation", &format!("https://{grpc}")])
        .args(["--name", name])
        .arg("--token-file")
        .arg(fed.dir.path().join("pki/join.token"))
        .arg("--federation-ca")
        .arg(fed.dir.path().join("pki/ca.crt"))
        .arg("--kubeconfig")
        .arg(&shard.kubeconfig)
        .env("TESSERA_LOG", "warn")
        .stdout(Stdio::null());
    cmd
}

/// A `tessera up` on loopback with its kubeconfig, for kubectl.
pub struct Cluster {
    child: Running,
    command: String,
    extra: Vec<String>,
    /// The data directory (and scratch space).
    pub dir: tempfile::TempDir,
    /// The kubeconfig tessera wrote.
    pub kubeconfig: PathBuf,
    /// Where metrics are served.
    pub metrics_addr: String,
    /// What it printed up to "Press Ctrl-C" (the addresses it serves).
    pub banner: Vec<String>,
}

impl Cluster {
    /// Starts `tessera up` and waits until it says it is up.
    pub fn start() -> Cluster {
        Cluster::start_with("up", &[])
    }

    /// Starts `tessera <command>` (`up` or `apiserver`) with extra flags (a store layout).
    pub fn start_with(command: &str, extra: &[&str]) -> Cluster {
        let dir = tempfile::tempdir().expect("tempdir");
        let (child, metrics_addr, banner) = Self::spawn(command, extra, dir.path());
        let kubeconfig = dir.path().join("kubeconfig");
        Cluster {
            banner,
            child,
            command: command.to_owned(),
            extra: extra.iter().map(|s| (*s).to_owned()).collect(),
            dir,
            kubeconfig,
            metrics_addr,
        }
    }

    /// Starts the process; it and the address its (first) metrics server listens on, read
    /// from its banner. Every port is the kernel's pick: a port chosen here and released
    /// could be handed to another test's process before this one binds it.
    fn spawn(command: &str, extra: &[&str], dir: &Path) -> (Running, String, Vec<String>) {
        let metrics_addr = "127.0.0.1:0";
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_tessera"));
        cmd.args([command, "--metrics-addr", metrics_addr])
            .args(["--api-addr", "127.0.0.1:0", "--data-dir"])
            .arg(dir)
            .args(extra);
        let has = |flag: &str| extra.iter().any(|e| e.starts_with(flag));
        if (command == "up" || command == "federation") && !has("--grpc-addr") {
            cmd.args(["--grpc-addr", "127.0.0.1:0"]);
        }
        // The shard tests run one shard alone; the federation's say how many.
        if command == "up" && !has("--shards") {
            cmd.arg("--shards=0");
        }
        let mut child = cmd
            .env("TESSERA_LOG", "warn")
            .stdout(Stdio::piped())
            .spawn()
            .map(Running)
            .expect("start tessera up");
        let out = child.0.stdout.take().expect("stdout");
        let mut lines = BufReader::new(out).lines();
        let mut metrics = None;
        let mut banner = Vec::new();
        assert!(
            lines.by_ref().map_while(Result::ok).any(|l| {
                banner.push(l.clone());
                if metrics.is_none() && l.contains("/metrics") {
                    metrics = l
                        .split("http://")
                        .nth(1)
                        .and_then(|rest| rest.split('/').next())
                        .map(str::to_owned);
                }
                l.starts_with("Press Ctrl-C")
            }),
            "tessera up did not come up"
        );
        // Keep reading so the process never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines.map_while(Result::ok) {});
        (
            child,
            metrics.expect("the banner names the metrics address"),
            banner,
        )
    }

    /// Kills the process with SIGKILL (no shutdown of any kind) and starts it again on the
    /// same data directory.
    pub fn kill_and_restart(&mut self) {
        self.kill();
        self.restart();
    }

    /// Waits (up to a minute) until `n` shards of this federation are ready; panics with the
    /// shard list if they are not.
    pub fn wait_for_ready_shards(&self, n: usize) {
        let ready = wait_for(Duration::from_secs(60), || {
            let out = self.ok(&["get", "shards", "--no-headers"]);
            (out.lines().filter(|l| l.contains(" True ")).count() == n).then_some(())
        });
        assert!(ready.is_some(), "{}", self.ok(&["get", "shards"]));
    }

    /// Starts the (killed) process again on the same data directory.
    pub fn restart(&mut self) {
        let extra: Vec<&str> = self.extra.iter().map(String::as_str).collect();
        (self.child, self.metrics_addr, self.banner) =
            Self::spawn(&self.command, &extra, self.dir.path());
    }

    /// The process id of the `tessera` process.
    pub fn pid(&self) -> u32 {
        self.child.0.id()
    }

    /// Kills the process with SIGKILL and leaves it dead.
    pub fn kill(&mut self) {
        let _ = self.child.0.kill();
        let _ = self.child.0.wait();
    }

    /// Starts another tessera process (`scheduler`, `controller-manager`, `agent`) against
    /// this cluster; killed when dropped.
    pub fn component(&self, args: &[&str]) -> Running {
        Running(
            Command::new(env!("CARGO_BIN_EXE_tessera"))
                .args(args)
                .arg("--kubeconfig")
                .arg(&self.kubeconfig)
                .args(["--metrics-addr", "127.0.0.1:0"])
                .env("TESSERA_LOG", "warn")
                .stdout(Stdio::null())
                .spawn()
                .expect("start a tessera component"),
        )
    }

    /// kubectl with this cluster's kubeconfig and its own cache.
    pub fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new("kubectl");
        cmd.arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg("--cache-dir")
            .arg(self.dir.path().join("kubectl-cache"))
            .args(args);
        cmd
    }

    /// Runs kubectl.
    pub fn kubectl(&self, args: &[&str]) -> Output {
        self.command(args).output().expect("run kubectl")
    }

    /// Whether something listens on `port` of pod `ns`/`pod`'s loopback within `limit`
    /// (a connection tried from inside the pod with `kubectl exec … python3`).
    pub fn listens(&self, ns: &str, pod: &str, port: u16, limit: Duration) -> bool {
        let probe = format!("import socket; socket.create_connection(('127.0.0.1', {port}))");
        wait_for(limit, || {
            self.kubectl(&["exec", "-n", ns, pod, "--", "python3", "-c", &probe])
                .status
                .success()
                .then_some(())
        })
        .is_some()
    }

    /// Runs kubectl with `--token=TOKEN`.
    pub fn kubectl_as(&self, token: &str, args: &[&str]) -> Output {
        let flag = format!("--token={token}");
        let mut all = vec![flag.as_str()];
        all.extend_from_slice(args);
        self.kubectl(&all)
    }

    /// Asserts kubectl with `--token=TOKEN` fails with `words` in its error.
    pub fn refused_as(&self, token: &str, args: &[&str], words: &str) {
        let out = self.kubectl_as(token, args);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(
            !out.status.success() && err.contains(words),
            "{args:?}: {err}"
        );
    }

    /// Creates Deployment `ns/name` of nginx with `replicas` and waits until it rolled out.
    pub fn deploy(&self, ns: &str, name: &str, replicas: u32) {
        let replicas = format!("--replicas={replicas}");
        self.ok(&[
            "create",
            "deployment",
            name,
            "-n",
            ns,
            "--image=nginx",
            &replicas,
        ]);
        self.rollout(ns, name);
    }

    /// Waits (90 s at most) until Deployment `ns/name` rolled out.
    pub fn rollout(&self, ns: &str, name: &str) {
        let what = format!("deployment/{name}");
        self.ok(&["rollout", "status", &what, "-n", ns, "--timeout=90s"]);
    }

    /// Runs kubectl, which must succeed; its standard output.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.kubectl(args);
        assert!(
            out.status.success(),
            "kubectl {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Runs kubectl, which must fail; its standard error.
    pub fn fails(&self, args: &[&str]) -> String {
        let out = self.kubectl(args);
        assert!(
            !out.status.success(),
            "kubectl {args:?} should have failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        String::from_utf8_lossy(&out.stderr).into_owned()
    }

    /// Writes `yaml` to a file in the scratch space; its path.
    pub fn file(&self, name: &str, yaml: &str) -> String {
        let path = self.dir.path().join(name);
        std::fs::write(&path, yaml).expect("write manifest");
        path.to_string_lossy().into_owned()
    }

    /// The API's URL, from the kubeconfig.
    pub fn server(&self) -> String {
        let kubeconfig = std::fs::read_to_string(&self.kubeconfig).expect("kubeconfig");
        kubeconfig
            .lines()
            .find_map(|l| l.trim().strip_prefix("server: "))
            .expect("server")
            .to_owned()
    }

    /// The admin token from the kubeconfig.
    pub fn admin_token(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("pki/admin.token"))
            .expect("admin token")
            .trim()
            .to_owned()
    }
}

/// Polls `f` every 100 ms until it returns `Some`, for at most `limit`.
pub fn wait_for<T>(limit: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A PodGroup `name` in `ns` of minMember `size` with `timeout` seconds to gather, and its
/// `size` member pods (`<name>-<i>`, asking `cpu` each), as YAML documents.
pub fn pod_group_manifest(ns: &str, name: &str, size: usize, cpu: &str, timeout: u32) -> String {
    let mut out = format!(
        "---\napiVersion: tessera.io/v1alpha1\nkind: PodGroup\nmetadata: {{name: {name}, namespace: {ns}}}\nspec: {{minMember: {size}, scheduleTimeoutSeconds: {timeout}}}\n"
    );
    for m in 0..size {
        out.push_str(&format!(
            "---\napiVersion: v1\nkind: Pod\nmetadata: {{name: {name}-{m}, namespace: {ns}, labels: {{scheduling.x-k8s.io/pod-group: {name}}}}}\nspec:\n  containers:\n  - {{name: c, image: app:1, resources: {{requests: {{cpu: {cpu}}}}}}}\n"
        ));
    }
    out
}

/// Runs kubectl `cmd` with `input` on its stdin (written while its output is read), to
/// its end.
pub fn fed(cmd: &mut Command, input: &[u8], what: &str) -> std::process::Output {
    use std::io::Write;
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect(what);
    let mut stdin = child.stdin.take().expect("stdin");
    let input = input.to_vec();
    let writer = std::thread::spawn(move || stdin.write_all(&input));
    let out = child.wait_with_output().expect(what);
    writer.join().expect("writer").expect("write");
    out
}

/// A finished command's exit code, standard output and standard error.
pub fn said(out: &std::process::Output) -> (Option<i32>, String, String) {
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Reads one HTTP/1.0 answer (head and body) from `addr`.
pub fn http_get(addr: &str, path: &str) -> Result<String, String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").map_err(|e| e.to_string())?;
    let mut body = String::new();
    s.read_to_string(&mut body).map_err(|e| e.to_string())?;
    Ok(body)
}

/// The value of the sample `series` (name and labels, as exposed) at `addr`'s `/metrics`.
pub fn sample(addr: &str, series: &str) -> f64 {
    let out = Command::new("curl")
        .args(["-s", &format!("http://{addr}/metrics")])
        .output()
        .expect("curl");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// A token of tenant `name` made with `tessera token create` in `c`'s data directory.
pub fn tenant_token(c: &Cluster, name: &str) -> String {
    token(c, &["--tenant", name])
}

/// Runs `tests/python/SCRIPT KUBECONFIG ARGS...` with the set-up's virtualenv (the official
/// Python client) against cluster `c`; asserts it succeeded and printed `ok` last.
pub fn python_scenario(c: &Cluster, script: &str, args: &[&str]) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let python = root.join(".tools/venv/bin/python");
    assert!(
        python.is_file(),
        "{} is missing: run scripts/setup.sh",
        python.display()
    );
    let out = Command::new(&python)
        .arg(root.join("tests/python").join(script))
        .arg(&c.kubeconfig)
        .args(args)
        .output()
        .expect("run python");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{said}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(said.lines().last(), Some("ok"), "{said}");
}

/// A token from `tessera token create ARGS` for cluster `c`.
pub fn token(c: &Cluster, args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["token", "create"])
        .args(args)
        .arg("--data-dir")
        .arg(c.dir.path())
        .output()
        .expect("token create");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Sends signal `sig` (`-STOP`, `-CONT`, …) to process `pid`, which must take it.
pub fn signal(pid: u32, sig: &str) {
    let ok = Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .expect("kill");
    assert!(ok.success(), "kill {sig} {pid}");
}

impl Drop for Cluster {
    /// Stops the cluster and its sandboxed process pods: a killed agent leaves its pods
    /// running (a restarted one would resume or stop them, and nothing restarts a test's
    /// cluster), so they are found by their pods' uids and killed with it.
    fn drop(&mut self) {
        if sandboxed_processes().is_empty() {
            return;
        }
        let uids = Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args([
                "--request-timeout=5s",
                "get",
                "pods",
                "-A",
                "-o",
                "jsonpath={.items[*].metadata.uid}",
            ])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        let marks: Vec<String> = uids
            .split_whitespace()
            .map(|u| format!("/pod-{u}/"))
            .collect();
        if marks.is_empty() {
            return;
        }
        // The agents first, so that nothing starts the pods again.
        self.kill();
        for (pid, cmdline) in sandboxed_processes() {
            let text = String::from_utf8_lossy(&cmdline);
            if marks.iter().any(|m| text.contains(m.as_str())) {
                let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            }
        }
    }
}

/// Live sandboxed processes (`tessera sandbox exec ...`: process pods) and their command
/// lines.
fn sandboxed_processes() -> Vec<(u32, Vec<u8>)> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            cmdline
                .windows(14)
                .any(|w| w == b"\0sandbox\0exec\0")
                .then_some((pid, cmdline))
        })
        .collect()
}

/// Pids of live processes whose command line is exactly `args` (read from /proc).
pub fn processes(args: &[&str]) -> Vec<u32> {
    let want: Vec<u8> = args
        .iter()
        .flat_map(|a| [a.as_bytes(), b"\0"].concat())
        .collect();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c == want)
                && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
                    .is_ok_and(|s| s.split(") ").nth(1).is_some_and(|r| r.starts_with('Z')))
        })
        .collect()
}

/// A process node of its own (`tessera agent --process-nodes=1`, no isolation) for `shard`,
/// its metrics on `metrics`; killed when dropped.
pub fn process_node(shard: &Cluster, metrics: &str, prefix: &str) -> Running {
    let dir = shard.dir.path();
    Running(
        Command::new(env!("CARGO_BIN_EXE_tessera"))
            .args(["agent", "--sim-nodes=0", "--process-nodes=1"])
            .arg("--process-isolation=off")
            .arg(format!("--prefix={prefix}"))
            .arg("--kubeconfig")
            .arg(&shard.kubeconfig)
            .arg("--log-dir")
            .arg(dir.join(format!("{prefix}-logs")))
            .arg("--state-dir")
            .arg(dir.join(format!("{prefix}-pods")))
            .args(["--metrics-addr", metrics])
            .env("TESSERA_LOG", "warn")
            .stdout(Stdio::null())
            .spawn()
            .expect("tessera agent"),
    )
}

/// Serves `router` over HTTPS on a free loopback port, with a certificate for 127.0.0.1
/// and `dns` (a webhook's `<service>.<namespace>.svc`): its address, the CA (PEM) that
/// signed the certificate (a webhook's `caBundle`), and the runtime serving it.
pub fn https_server(
    router: axum::Router,
    dns: &str,
) -> (std::net::SocketAddr, String, tokio::runtime::Runtime) {
    let tls = tessera_apiserver::pki::agent_tls("127.0.0.1", dns).expect("tls");
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let addr = rt
        .block_on(tessera_apiserver::serve::serve_tls_pem(
            "127.0.0.1:0".parse().expect("addr"),
            &tls.cert_pem,
            &tls.key_pem,
            router,
            tessera_apiserver::serve::ConnectionLimits::default(),
        ))
        .expect("serve");
    (addr, tls.ca_pem, rt)
}
