//! `exec`: a command run inside a running container, its standard streams carried over a
//! WebSocket in Kubernetes' channel protocol (`v5.channel.k8s.io`, `v4.channel.k8s.io`).
//!
//! Every binary message starts with its channel: 0 stdin (client → node), 1 stdout, 2
//! stderr, 3 the error channel, 4 terminal size (`{"Width":…,"Height":…}`); v5 adds 255, the
//! close signal (`[255, 0]`: the client's stdin ended). When the command has exited and its
//! output is drained, the node writes a `Status` on channel 3 — `Success`, or `Failure` with
//! reason `NonZeroExitCode` and the code as an `ExitCode` cause, which kubectl exits with —
//! and closes the WebSocket normally.
//!
//! With `tty=true` the command gets a pseudo-terminal (stdout and stderr are both its
//! output), made the controlling terminal of a session of its own; the client's resizes set
//! its window size.

use std::os::fd::OwnedFd;
use std::process::Stdio;

use axum::extract::ws::{CloseFrame, Message, WebSocket};
use bytes::{BufMut, Bytes, BytesMut};
use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tessera_client::status::ApiError;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

use super::{Target, query_flag, query_values};
use crate::probe::Where;
use crate::sandbox::JoinSpec;

/// Channel numbers.
pub const STDIN: u8 = 0;
/// Standard output.
pub const STDOUT: u8 = 1;
/// Standard error.
pub const STDERR: u8 = 2;
/// The final status.
pub const ERROR: u8 = 3;
/// Terminal resizes.
pub const RESIZE: u8 = 4;
/// v5's close signal.
pub const CLOSE: u8 = 255;

/// The protocols served, most preferred first.
pub const PROTOCOLS: [&str; 2] = ["v5.channel.k8s.io", "v4.channel.k8s.io"];

/// The largest piece of output sent in one message.
const CHUNK: usize = 32 * 1024;

/// What the client asked for (`PodExecOptions`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExecOptions {
    /// The command and its arguments.
    pub command: Vec<String>,
    /// The client sends stdin.
    pub stdin: bool,
    /// The client wants stdout.
    pub stdout: bool,
    /// The client wants stderr (ignored with a TTY: both are its output).
    pub stderr: bool,
    /// A pseudo-terminal.
    pub tty: bool,
}

impl ExecOptions {
    /// The options in a query string, checked as kube-apiserver checks `PodExecOptions`.
    pub fn from_query(query: &str) -> Result<ExecOptions, ApiError> {
        let opts = ExecOptions {
            command: query_values(query, "command")?,
            stdin: query_flag(query, "stdin", false)?,
            stdout: query_flag(query, "stdout", true)?,
            stderr: query_flag(query, "stderr", true)?,
            tty: query_flag(query, "tty", false)?,
        };
        if opts.command.is_empty() || opts.command[0].is_empty() {
            return Err(ApiError::bad_request(
                "you must specify at least one command for the container",
            ));
        }
        if !(opts.stdin || opts.stdout || opts.stderr) {
            return Err(ApiError::bad_request(
                "you must specify at least 1 of stdin, stdout, stderr",
            ));
        }
        Ok(opts)
    }
}

/// The command that runs `opts.command` where `target` runs, as its identity and with its
/// environment (standard streams not yet set).
fn command(target: &Target, opts: &ExecOptions) -> Result<tokio::process::Command, String> {
    let argv = &opts.command;
    let mut command = match &target.at {
        Where::Host => {
            // The agent's own children cannot take a controlling terminal without `setsid`.
            if opts.tty {
                let mut args = vec!["--ctty".to_owned(), "--wait".to_owned()];
                args.extend(argv.iter().cloned());
                crate::env::in_container(&target.container, &target.env, "setsid", &args)
            } else {
                crate::env::in_container(&target.container, &target.env, &argv[0], &argv[1..])
            }
        }
        Where::Sandbox {
            launcher,
            supervisor,
            identity,
            cgroups,
        } => {
            let spec = JoinSpec {
                pid: crate::probe::init_of(*supervisor)?,
                identity: identity.clone(),
                cgroups: cgroups.clone(),
                tty: opts.tty,
            };
            let mut command = launcher.join(&spec, argv);
            crate::env::with_env(&mut command, &target.env);
            command
        }
    };
    if opts.tty {
        command.env("TERM", "xterm");
    }
    Ok(command)
}

/// A pseudo-terminal: its controller (kept by the agent) and the terminal (the command's).
fn open_pty() -> std::io::Result<(OwnedFd, OwnedFd)> {
    use rustix::fs::{Mode, OFlags};
    use rustix::pty::OpenptFlags;
    let controller =
        rustix::pty::openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC)?;
    rustix::pty::grantpt(&controller)?;
    rustix::pty::unlockpt(&controller)?;
    let name = rustix::pty::ptsname(&controller, Vec::new())?;
    let terminal = rustix::fs::open(
        name.as_c_str(),
        OFlags::RDWR | OFlags::NOCTTY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    Ok((controller, terminal))
}

fn message(channel: u8, data: &[u8]) -> Message {
    let mut b = BytesMut::with_capacity(1 + data.len());
    b.put_u8(channel);
    b.put_slice(data);
    Message::Binary(b.freeze())
}

/// The `Status` written on the error channel for an exit code.
pub fn exit_status(argv: &[String], code: i32) -> Value {
    if code == 0 {
        return json!({"metadata": {}, "status": "Success"});
    }
    json!({"metadata": {}, "status": "Failure",
        "message": format!("command terminated with non-zero exit code: error executing command [{}], exit code {code}", argv.join(" ")),
        "reason": "NonZeroExitCode",
        "details": {"causes": [{"reason": "ExitCode", "message": code.to_string()}]}})
}

fn failure(why: &str) -> Value {
    json!({"metadata": {}, "status": "Failure", "message": why, "reason": "InternalError", "code": 500})
}

/// Copies `from` to the client on `channel` until it ends.
async fn pump(mut from: impl AsyncRead + Unpin, channel: u8, to: mpsc::Sender<Message>) {
    let mut buf = vec![0u8; CHUNK];
    loop {
        match from.read(&mut buf).await {
            // A terminal whose last holder closed it reads EIO: that is its end.
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if to.send(message(channel, &buf[..n])).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// The terminal size in a resize message.
fn winsize(raw: &[u8]) -> Option<rustix::termios::Winsize> {
    let v: Value = serde_json::from_slice(raw).ok()?;
    let dim = |k: &str| v[k].as_u64().and_then(|n| u16::try_from(n).ok());
    Some(rustix::termios::Winsize {
        ws_row: dim("Height")?,
        ws_col: dim("Width")?,
        ws_xpixel: 0,
        ws_ypixel: 0,
    })
}

/// Ends an exec whose client left: a hangup to the command (the helper passes it on), then
/// a kill of the helper and what it started.
async fn hang_up(pid: u32) {
    use rustix::process::{Pid, Signal, kill_process};
    let Some(helper) = Pid::from_raw(pid as i32) else {
        return;
    };
    let _ = kill_process(helper, Signal::HUP);
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let children =
        std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
    for child in children
        .split_whitespace()
        .filter_map(|c| c.parse::<i32>().ok())
    {
        if let Some(c) = Pid::from_raw(child) {
            let _ = kill_process(c, Signal::KILL);
        }
    }
    let _ = kill_process(helper, Signal::KILL);
}

/// Runs the exec over `socket` (`v5`: the close signal is spoken) to its end.
pub async fn serve(socket: WebSocket, v5: bool, target: Target, opts: ExecOptions) {
    let (mut sink, mut incoming) = socket.split();
    let (tx, mut rx) = mpsc::channel::<Message>(16);
    let writer = tokio::spawn(async move {
        while let Some(m) = rx.recv().await {
            let close = matches!(m, Message::Close(_));
            if sink.send(m).await.is_err() || close {
                break;
            }
        }
        let _ = sink.close().await;
    });
    let finish = |tx: mpsc::Sender<Message>, status: Value| async move {
        let _ = tx.send(message(ERROR, status.to_string().as_bytes())).await;
        let _ = tx
            .send(Message::Close(Some(CloseFrame {
                code: 1000,
                reason: "".into(),
            })))
            .await;
    };
    let started = start(&target, &opts);
    let (mut child, stdin, controller, outputs) = match started {
        Ok(s) => s,
        Err(why) => {
            finish(tx, failure(&why)).await;
            let _ = writer.await;
            return;
        }
    };
    let pid = child.id().unwrap_or(0);
    let mut pumps = Vec::new();
    for (channel, out) in outputs {
        pumps.push(tokio::spawn(pump(out, channel, tx.clone())));
    }
    // Stdin is written by a task of its own, so a command that does not read it never stops
    // this side from seeing it exit.
    let (stdin_tx, mut stdin_rx) = mpsc::channel::<Bytes>(8);
    let resize_fd = controller
        .as_ref()
        .and_then(|c| c.try_clone().ok())
        .map(OwnedFd::from);
    let stdin_task = stdin.map(|mut w| {
        tokio::spawn(async move {
            while let Some(b) = stdin_rx.recv().await {
                if w.write_all(&b).await.is_err() || w.flush().await.is_err() {
                    break;
                }
            }
        })
    });
    let mut stdin_tx = Some(stdin_tx);
    let done = async {
        let status = child.wait().await;
        for p in pumps {
            let _ = p.await;
        }
        status
    };
    tokio::pin!(done);
    let ended = loop {
        tokio::select! {
            status = &mut done => break Some(status),
            msg = incoming.next() => match msg {
                Some(Ok(Message::Binary(b))) => match b.first() {
                    Some(&STDIN) => {
                        if let Some(s) = &stdin_tx
                            && s.send(b.slice(1..)).await.is_err()
                        {
                            stdin_tx = None;
                        }
                    }
                    Some(&RESIZE) => {
                        if let (Some(fd), Some(size)) = (&resize_fd, winsize(&b[1..])) {
                            let _ = rustix::termios::tcsetwinsize(fd, size);
                        }
                    }
                    Some(&CLOSE) if v5 && b.get(1) == Some(&STDIN) => {
                        // With a terminal, the end of input is the terminal's EOF character.
                        if controller.is_some() {
                            if let Some(s) = &stdin_tx {
                                let _ = s.send(Bytes::from_static(b"\x04")).await;
                            }
                        } else {
                            stdin_tx = None;
                        }
                    }
                    _ => {}
                },
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break None,
                Some(Ok(_)) => {}
            },
        }
    };
    drop(stdin_tx);
    if let Some(t) = stdin_task {
        t.abort();
    }
    match ended {
        Some(status) => {
            let code = match status {
                Ok(s) => {
                    use std::os::unix::process::ExitStatusExt;
                    s.code().unwrap_or_else(|| 128 + s.signal().unwrap_or(9))
                }
                Err(_) => 137,
            };
            finish(tx, exit_status(&opts.command, code)).await;
        }
        None => {
            tracing::debug!(pid, "exec client left; ending the command");
            hang_up(pid).await;
        }
    }
    let _ = writer.await;
}

type Started = (
    tokio::process::Child,
    Option<Box<dyn tokio::io::AsyncWrite + Send + Unpin>>,
    Option<std::fs::File>,
    Vec<(u8, Box<dyn AsyncRead + Send + Unpin>)>,
);

/// Starts the command with the streams asked for.
fn start(target: &Target, opts: &ExecOptions) -> Result<Started, String> {
    let mut cmd = command(target, opts)?;
    if opts.tty {
        let (controller, terminal) =
            open_pty().map_err(|e| format!("allocating a terminal: {e}"))?;
        let dup = |fd: &OwnedFd| fd.try_clone().map_err(|e| format!("terminal: {e}"));
        cmd.stdin(Stdio::from(dup(&terminal)?))
            .stdout(Stdio::from(dup(&terminal)?))
            .stderr(Stdio::from(terminal));
        let child = cmd
            .spawn()
            .map_err(|e| format!("cannot start {:?}: {e}", opts.command[0]))?;
        // The command's copies of the terminal must be its only ones: the controller reads
        // EIO once they are all closed.
        drop(cmd);
        let controller = std::fs::File::from(controller);
        let reader = controller
            .try_clone()
            .map_err(|e| format!("terminal: {e}"))?;
        let writer = controller
            .try_clone()
            .map_err(|e| format!("terminal: {e}"))?;
        let stdin: Option<Box<dyn tokio::io::AsyncWrite + Send + Unpin>> = if opts.stdin {
            Some(Box::new(tokio::fs::File::from_std(writer)))
        } else {
            None
        };
        let outputs: Vec<(u8, Box<dyn AsyncRead + Send + Unpin>)> = if opts.stdout {
            vec![(STDOUT, Box::new(tokio::fs::File::from_std(reader)))]
        } else {
            Vec::new()
        };
        return Ok((child, stdin, Some(controller), outputs));
    }
    let pipe = |on: bool| if on { Stdio::piped() } else { Stdio::null() };
    cmd.stdin(pipe(opts.stdin))
        .stdout(pipe(opts.stdout))
        .stderr(pipe(opts.stderr));
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot start {:?}: {e}", opts.command[0]))?;
    let stdin: Option<Box<dyn tokio::io::AsyncWrite + Send + Unpin>> = child
        .stdin
        .take()
        .map(|s| Box::new(s) as Box<dyn tokio::io::AsyncWrite + Send + Unpin>);
    let mut outputs: Vec<(u8, Box<dyn AsyncRead + Send + Unpin>)> = Vec::new();
    if let Some(o) = child.stdout.take() {
        outputs.push((STDOUT, Box::new(o)));
    }
    if let Some(e) = child.stderr.take() {
        outputs.push((STDERR, Box::new(e)));
    }
    Ok((child, stdin, None, outputs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_are_checked_as_kubernetes_checks_them() {
        let o = ExecOptions::from_query("command=ls&command=-l&stdin=true&tty=true").expect("ok");
        assert_eq!(o.command, ["ls", "-l"]);
        assert!(o.stdin && o.stdout && o.stderr && o.tty);
        let e = ExecOptions::from_query("stdout=true").expect_err("no command");
        assert!(e.message.contains("at least one command"), "{}", e.message);
        let e =
            ExecOptions::from_query("command=ls&stdout=false&stderr=false").expect_err("no stream");
        assert!(e.message.contains("at least 1 of stdin"), "{}", e.message);
    }

    #[test]
    fn exit_codes_become_kubectl_statuses() {
        let argv = vec!["sh".to_owned(), "-c".to_owned(), "exit 3".to_owned()];
        assert_eq!(exit_status(&argv, 0)["status"], "Success");
        let s = exit_status(&argv, 3);
        assert_eq!(s["reason"], "NonZeroExitCode");
        assert_eq!(s["details"]["causes"][0]["message"], "3");
        assert!(
            s["message"]
                .as_str()
                .expect("msg")
                .contains("[sh -c exit 3]")
        );
    }

    #[test]
    fn resizes_read_kubectls_json() {
        let w = winsize(br#"{"Width":120,"Height":40}"#).expect("size");
        assert_eq!((w.ws_col, w.ws_row), (120, 40));
        assert!(winsize(b"{}").is_none());
        assert!(winsize(br#"{"Width":70000,"Height":1}"#).is_none());
    }
}
