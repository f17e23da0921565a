//! Container probes of the process runtime, as the kubelet runs them: `exec` (the command
//! runs beside the container, with its env and working directory; exit 0 passes),
//! `tcpSocket` (a connection opens) and `httpGet` (an answer from 200 to 399), each with
//! `initialDelaySeconds`, `periodSeconds`, `timeoutSeconds`, `successThreshold` and
//! `failureThreshold` and Kubernetes' defaults. A startup probe holds the others back until
//! it passes; a failing startup or liveness probe has the container killed and restarted per
//! its policy; readiness decides the container's `ready`. `grpc` probes are not run.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::sandbox::{Identity, JoinSpec, Launcher};

/// Which probe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `startupProbe`.
    Startup,
    /// `livenessProbe`.
    Liveness,
    /// `readinessProbe`.
    Readiness,
}

impl Kind {
    /// As the kubelet names it in Events (`Liveness probe failed: ...`).
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Startup => "Startup",
            Kind::Liveness => "Liveness",
            Kind::Readiness => "Readiness",
        }
    }
}

/// The most of a probe's output kept in a message.
const MAX_OUTPUT: usize = 1024;

fn secs(v: Option<i32>, default: i32) -> Duration {
    Duration::from_secs(v.unwrap_or(default).max(0) as u64)
}

/// A probe's timing, with Kubernetes' defaults.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    /// `initialDelaySeconds` (0).
    pub initial_delay: Duration,
    /// `periodSeconds` (10, at least 1).
    pub period: Duration,
    /// `timeoutSeconds` (1, at least 1).
    pub timeout: Duration,
    /// `successThreshold` (1).
    pub success_threshold: u32,
    /// `failureThreshold` (3).
    pub failure_threshold: u32,
}

impl Timing {
    /// The timing of `p`.
    pub fn of(p: &Probe) -> Timing {
        Timing {
            initial_delay: secs(p.initial_delay_seconds, 0),
            period: secs(p.period_seconds, 10).max(Duration::from_secs(1)),
            timeout: secs(p.timeout_seconds, 1).max(Duration::from_secs(1)),
            success_threshold: p.success_threshold.unwrap_or(1).max(1) as u32,
            failure_threshold: p.failure_threshold.unwrap_or(3).max(1) as u32,
        }
    }
}

/// Where a container runs, so its probes run where it does.
#[derive(Clone, Debug, Default)]
pub enum Where {
    /// Beside the agent (no sandbox).
    #[default]
    Host,
    /// In a sandbox: exec probes join its namespaces as its identity; network probes connect
    /// from inside its network namespace.
    Sandbox {
        /// Starts the helper.
        launcher: Launcher,
        /// The host pid of the sandbox's supervisor (the agent's child).
        supervisor: u32,
        /// Who the container runs as.
        identity: Identity,
        /// The container's cgroups.
        cgroups: Vec<std::path::PathBuf>,
    },
}

impl Where {
    /// The command that runs `argv` where container `c` runs, with its environment `env`:
    /// beside the agent (its working directory), or joined into its sandbox as its identity
    /// (with `tty`, in a session of its own whose controlling terminal is its stdin).
    pub fn command(
        &self,
        c: &Container,
        env: &[(String, String)],
        argv: &[String],
        tty: bool,
    ) -> Result<tokio::process::Command, String> {
        let Some((cmd, args)) = argv.split_first() else {
            return Err("no command".into());
        };
        match self {
            Where::Host => Ok(crate::env::in_container(c, env, cmd, args)),
            Where::Sandbox {
                launcher,
                supervisor,
                identity,
                cgroups,
            } => {
                let spec = JoinSpec {
                    pid: init_of(*supervisor)?,
                    identity: identity.clone(),
                    cgroups: cgroups.clone(),
                    tty,
                };
                let mut command = launcher.join(&spec, argv);
                crate::env::with_env(&mut command, env);
                Ok(command)
            }
        }
    }
}

/// The host pid of the container's init: the supervisor's only child.
pub(crate) fn init_of(supervisor: u32) -> Result<u32, String> {
    std::fs::read_to_string(format!("/proc/{supervisor}/task/{supervisor}/children"))
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|p| p.parse().ok()))
        .ok_or_else(|| "the container is not running".to_owned())
}

/// Runs `f` on a thread of its own inside the network namespace of process `pid` (a thread
/// may change its network namespace; the agent's runtime threads never do).
async fn in_network_of<T, F>(pid: u32, timeout: Duration, f: F) -> Result<T, String>
where
    T: Send + 'static,
    F: std::future::Future<Output = Result<T, String>> + Send + 'static,
{
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("probe-netns".into())
        .spawn(move || {
            let run = || -> Result<T, String> {
                let ns = std::fs::File::open(format!("/proc/{pid}/ns/net"))
                    .map_err(|e| format!("the container's network: {e}"))?;
                rustix::thread::move_into_link_name_space(
                    std::os::fd::AsFd::as_fd(&ns),
                    Some(rustix::thread::LinkNameSpaceType::Network),
                )
                .map_err(|e| format!("entering the container's network: {e}"))?;
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| e.to_string())?;
                rt.block_on(async {
                    tokio::time::timeout(timeout, f)
                        .await
                        .unwrap_or_else(|_| Err(format!("timed out after {}s", timeout.as_secs())))
                })
            };
            let _ = tx.send(run());
        })
        .map_err(|e| format!("probe thread: {e}"))?;
    rx.await.map_err(|_| "the probe thread ended".to_owned())?
}

async fn tcp_probe(host: String, port: u16) -> Result<String, String> {
    tokio::net::TcpStream::connect((host.as_str(), port))
        .await
        .map(|_| String::new())
        .map_err(|e| format!("dial tcp {host}:{port}: {e}"))
}

/// Runs one probe attempt against container `c` (with environment `env`; its processes
/// listen on `host`, in the place `at`): `Ok` with its output if it passed, `Err` with why
/// not.
pub async fn attempt(
    p: &Probe,
    c: &Container,
    env: &[(String, String)],
    host: &str,
    timeout: Duration,
    at: &Where,
) -> Result<String, String> {
    let run = async {
        if let Some(exec) = &p.exec {
            let argv = exec.command.as_deref().unwrap_or_default();
            return exec_probe(argv, c, env, at).await;
        }
        let (port, host, path) = if let Some(tcp) = &p.tcp_socket {
            (
                port_of(&tcp.port, c)?,
                tcp.host.as_deref().unwrap_or(host),
                None,
            )
        } else if let Some(http) = &p.http_get {
            let path = http.path.clone().unwrap_or_else(|| "/".into());
            (
                port_of(&http.port, c)?,
                http.host.as_deref().unwrap_or(host),
                Some(path),
            )
        } else {
            return Err(
                "the probe has no handler the process runtime runs (exec, tcpSocket, httpGet)"
                    .into(),
            );
        };
        let host = host.to_owned();
        let probe = async move {
            match path {
                Some(path) => http_probe(&host, port, &path).await,
                None => tcp_probe(host, port).await,
            }
        };
        match at {
            Where::Host => probe.await,
            Where::Sandbox { supervisor, .. } => {
                in_network_of(init_of(*supervisor)?, timeout, probe).await
            }
        }
    };
    match tokio::time::timeout(timeout, run).await {
        Ok(r) => r,
        Err(_) => Err(format!("timed out after {}s", timeout.as_secs())),
    }
}

/// A probe's port: a number, or the name of one of the container's ports.
fn port_of(port: &IntOrString, c: &Container) -> Result<u16, String> {
    match port {
        IntOrString::Int(n) => u16::try_from(*n).map_err(|_| format!("port {n} is out of range")),
        IntOrString::String(name) => c
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some(name.as_str()))
            .and_then(|p| u16::try_from(p.container_port).ok())
            .ok_or_else(|| format!("the container has no port named {name:?}")),
    }
}

fn cut(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(&bytes[..bytes.len().min(MAX_OUTPUT)]);
    text.trim_end().to_owned()
}

async fn exec_probe(
    argv: &[String],
    c: &Container,
    env: &[(String, String)],
    at: &Where,
) -> Result<String, String> {
    let Some(cmd) = argv.first() else {
        return Err("the exec probe has no command".into());
    };
    let mut command = at.command(c, env, argv, false)?;
    let out = command
        .output()
        .await
        .map_err(|e| format!("cannot run {cmd:?}: {e}"))?;
    let mut text = out.stdout;
    text.extend_from_slice(&out.stderr);
    if out.status.success() {
        Ok(cut(&text))
    } else {
        let code = out
            .status
            .code()
            .map_or("a signal".to_owned(), |c| c.to_string());
        let said = cut(&text);
        Err(if said.is_empty() {
            format!("command {cmd:?} exited with {code}")
        } else {
            format!("command {cmd:?} exited with {code}: {said}")
        })
    }
}

async fn http_probe(host: &str, port: u16, path: &str) -> Result<String, String> {
    let url = format!("http://{host}:{port}{path}");
    let mut s = tokio::net::TcpStream::connect((host, port))
        .await
        .map_err(|e| format!("Get {url:?}: dial tcp {host}:{port}: {e}"))?;
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUser-Agent: kube-probe/1.32\r\nAccept: */*\r\nConnection: close\r\n\r\n"
    );
    s.write_all(req.as_bytes())
        .await
        .map_err(|e| format!("Get {url:?}: {e}"))?;
    let mut head = Vec::new();
    let mut buf = [0u8; 512];
    while !head.windows(2).any(|w| w == b"\r\n") && head.len() < 4096 {
        let n = s
            .read(&mut buf)
            .await
            .map_err(|e| format!("Get {url:?}: {e}"))?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    let line = String::from_utf8_lossy(&head);
    let code: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("Get {url:?}: the answer is not HTTP"))?;
    if (200..400).contains(&code) {
        Ok(String::new())
    } else {
        Err(format!("HTTP probe failed with statuscode: {code}"))
    }
}

/// Counts consecutive results against a probe's thresholds.
#[derive(Debug, Default)]
pub struct Tally {
    successes: u32,
    failures: u32,
}

impl Tally {
    /// Records a result: `Some(true)` when the successes reach the success threshold,
    /// `Some(false)` when the failures reach the failure threshold, else `None`.
    pub fn record(&mut self, passed: bool, t: &Timing) -> Option<bool> {
        if passed {
            self.failures = 0;
            self.successes += 1;
            (self.successes >= t.success_threshold).then_some(true)
        } else {
            self.successes = 0;
            self.failures += 1;
            (self.failures >= t.failure_threshold).then_some(false)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ContainerPort, ExecAction, HTTPGetAction, TCPSocketAction};

    fn exec(cmd: &[&str]) -> Probe {
        Probe {
            exec: Some(ExecAction {
                command: Some(cmd.iter().map(|s| s.to_string()).collect()),
            }),
            ..Probe::default()
        }
    }

    #[test]
    fn timing_has_kubernetes_defaults() {
        let t = Timing::of(&Probe::default());
        assert_eq!(t.period, Duration::from_secs(10));
        assert_eq!(t.timeout, Duration::from_secs(1));
        assert_eq!((t.success_threshold, t.failure_threshold), (1, 3));
        let t = Timing::of(&Probe {
            period_seconds: Some(0),
            failure_threshold: Some(0),
            ..Probe::default()
        });
        assert_eq!(t.period, Duration::from_secs(1));
        assert_eq!(t.failure_threshold, 1);
    }

    #[test]
    fn tallies_need_consecutive_results() {
        let t = Timing {
            success_threshold: 2,
            failure_threshold: 3,
            ..Timing::of(&Probe::default())
        };
        let mut tally = Tally::default();
        assert_eq!(tally.record(false, &t), None);
        assert_eq!(tally.record(false, &t), None);
        assert_eq!(
            tally.record(true, &t),
            None,
            "a success resets the failures"
        );
        assert_eq!(tally.record(true, &t), Some(true));
        assert_eq!(tally.record(false, &t), None);
        assert_eq!(tally.record(false, &t), None);
        assert_eq!(tally.record(false, &t), Some(false));
    }

    #[tokio::test]
    async fn handlers_pass_and_fail() {
        let c = Container {
            name: "c".into(),
            ports: Some(vec![ContainerPort {
                name: Some("web".into()),
                container_port: 1,
                ..ContainerPort::default()
            }]),
            ..Container::default()
        };
        let second = Duration::from_secs(1);
        assert!(
            attempt(&exec(&["true"]), &c, &[], "127.0.0.1", second, &Where::Host)
                .await
                .is_ok()
        );
        let e = attempt(
            &exec(&["sh", "-c", "echo sick; exit 2"]),
            &c,
            &[],
            "127.0.0.1",
            second,
            &Where::Host,
        )
        .await
        .expect_err("fails");
        assert!(e.contains("exited with 2: sick"), "{e}");
        let e = attempt(
            &exec(&["sleep", "5"]),
            &c,
            &[],
            "127.0.0.1",
            second,
            &Where::Host,
        )
        .await
        .expect_err("times out");
        assert!(e.contains("timed out"), "{e}");

        // A listener passes tcpSocket; an HTTP server's 200 passes httpGet, its 500 fails.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("addr").port();
        tokio::spawn(async move {
            let mut n = 0;
            while let Ok((mut s, _)) = listener.accept().await {
                let mut buf = [0u8; 1024];
                let _ = s.read(&mut buf).await;
                let code = if n % 2 == 0 {
                    "200 OK"
                } else {
                    "500 Internal Server Error"
                };
                n += 1;
                let _ = s
                    .write_all(format!("HTTP/1.1 {code}\r\nContent-Length: 0\r\n\r\n").as_bytes())
                    .await;
            }
        });
        let tcp = Probe {
            tcp_socket: Some(TCPSocketAction {
                port: IntOrString::Int(i32::from(port)),
                host: None,
            }),
            ..Probe::default()
        };
        assert!(
            attempt(&tcp, &c, &[], "127.0.0.1", second, &Where::Host)
                .await
                .is_ok()
        );
        let http = Probe {
            http_get: Some(HTTPGetAction {
                port: IntOrString::Int(i32::from(port)),
                path: Some("/healthz".into()),
                ..HTTPGetAction::default()
            }),
            ..Probe::default()
        };
        // The tcp probe's connection took the 200; this one gets the 500, the next a 200.
        let e = attempt(&http, &c, &[], "127.0.0.1", second, &Where::Host)
            .await
            .expect_err("500");
        assert!(e.contains("statuscode: 500"), "{e}");
        assert!(
            attempt(&http, &c, &[], "127.0.0.1", second, &Where::Host)
                .await
                .is_ok()
        );
        let named = Probe {
            tcp_socket: Some(TCPSocketAction {
                port: IntOrString::String("nope".into()),
                host: None,
            }),
            ..Probe::default()
        };
        let e = attempt(&named, &c, &[], "127.0.0.1", second, &Where::Host)
            .await
            .expect_err("no port");
        assert!(e.contains("no port named"), "{e}");
    }
}
