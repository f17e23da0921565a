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

use std::collections::HashMap;
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
    // The agent's own children cannot take a controlling terminal without `setsid`.
    let argv = if opts.tty && matches!(target.at, Where::Host) {
        let mut wrapped = vec![
            "setsid".to_owned(),
            "--ctty".to_owned(),
            "--wait".to_owned(),
        ];
        wrapped.extend(opts.command.iter().cloned());
        wrapped
    } else {
        opts.command.clone()
    };
    let mut command = target
        .at
        .command(&target.container, &target.env, &argv, opts.tty)?;
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
async fn pump(mut from: impl AsyncRead + Unpin, channel: u8, to: mpsc::Sender<Output>) {
    let mut buf = vec![0u8; CHUNK];
    loop {
        match from.read(&mut buf).await {
            // A terminal whose last holder closed it reads EIO: that is its end.
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if to
                    .send(Output::Data(channel, Bytes::copy_from_slice(&buf[..n])))
                    .await
                    .is_err()
                {
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

/// What the client sends, whatever the transport.
#[derive(Debug)]
pub enum Input {
    /// Bytes for the command's stdin.
    Stdin(Bytes),
    /// The client's stdin ended.
    StdinEnd,
    /// The client's terminal changed size.
    Resize(rustix::termios::Winsize),
}

/// What the node sends.
#[derive(Debug)]
pub enum Output {
    /// Output on a channel ([`STDOUT`], [`STDERR`]).
    Data(u8, Bytes),
    /// The final status; nothing follows.
    Status(Value),
}

/// Runs the command for a client whose input arrives on `input` (closed: the client left)
/// and whose output goes to `out`, until it has exited and its output is drained.
pub async fn run(
    target: Target,
    opts: ExecOptions,
    mut input: mpsc::Receiver<Input>,
    out: mpsc::Sender<Output>,
) {
    let (mut child, stdin, controller, outputs) = match start(&target, &opts) {
        Ok(s) => s,
        Err(why) => {
            let _ = out.send(Output::Status(failure(&why))).await;
            return;
        }
    };
    let pid = child.id().unwrap_or(0);
    let mut pumps = Vec::new();
    for (channel, from) in outputs {
        pumps.push(tokio::spawn(pump(from, channel, out.clone())));
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
            got = input.recv() => match got {
                Some(Input::Stdin(b)) => {
                    if let Some(s) = &stdin_tx
                        && s.send(b).await.is_err()
                    {
                        stdin_tx = None;
                    }
                }
                Some(Input::Resize(size)) => {
                    if let Some(fd) = &resize_fd {
                        let _ = rustix::termios::tcsetwinsize(fd, size);
                    }
                }
                // With a terminal, the end of input is the terminal's EOF character.
                Some(Input::StdinEnd) if controller.is_some() => {
                    if let Some(s) = &stdin_tx {
                        let _ = s.send(Bytes::from_static(b"\x04")).await;
                    }
                }
                Some(Input::StdinEnd) => stdin_tx = None,
                None => break None,
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
            let _ = out
                .send(Output::Status(exit_status(&opts.command, code)))
                .await;
        }
        None => {
            tracing::debug!(pid, "exec client left; ending the command");
            hang_up(pid).await;
        }
    }
}

/// The standard streams a client asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Wanted {
    /// stdin.
    pub stdin: bool,
    /// stdout.
    pub stdout: bool,
    /// stderr.
    pub stderr: bool,
    /// A terminal.
    pub tty: bool,
}

impl ExecOptions {
    /// The streams asked for.
    pub fn wanted(&self) -> Wanted {
        Wanted {
            stdin: self.stdin,
            stdout: self.stdout,
            stderr: self.stderr,
            tty: self.tty,
        }
    }
}

/// Runs `session` (exec or attach) over a WebSocket (`v5`: the close signal is spoken) to
/// its end.
pub async fn serve_ws<F, Fut>(socket: WebSocket, v5: bool, session: F)
where
    F: FnOnce(mpsc::Receiver<Input>, mpsc::Sender<Output>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (mut sink, mut incoming) = socket.split();
    let (in_tx, in_rx) = mpsc::channel::<Input>(8);
    let (out_tx, mut out_rx) = mpsc::channel::<Output>(16);
    let core = tokio::spawn(session(in_rx, out_tx));
    let reader = tokio::spawn(async move {
        while let Some(Ok(m)) = incoming.next().await {
            // Some clients (the Python one, for text) send text messages: the same bytes.
            let bytes = match m {
                Message::Binary(b) => Some(b),
                Message::Text(t) => Some(Bytes::from(t.as_str().as_bytes().to_vec())),
                Message::Close(_) => break,
                _ => None,
            };
            let got = match bytes {
                Some(b) => match b.first() {
                    Some(&STDIN) => Input::Stdin(b.slice(1..)),
                    Some(&RESIZE) => match winsize(&b[1..]) {
                        Some(size) => Input::Resize(size),
                        None => continue,
                    },
                    Some(&CLOSE) if v5 && b.get(1) == Some(&STDIN) => Input::StdinEnd,
                    _ => continue,
                },
                None => continue,
            };
            if in_tx.send(got).await.is_err() {
                break;
            }
        }
    });
    while let Some(o) = out_rx.recv().await {
        let (m, last) = match o {
            Output::Data(channel, b) => (message(channel, &b), false),
            Output::Status(v) => (message(ERROR, v.to_string().as_bytes()), true),
        };
        if sink.send(m).await.is_err() {
            break;
        }
        if last {
            let close = Message::Close(Some(CloseFrame {
                code: 1000,
                reason: "".into(),
            }));
            let _ = sink.send(close).await;
            break;
        }
    }
    reader.abort();
    let _ = core.await;
    let _ = sink.close().await;
}

/// The SPDY protocol served for exec (`X-Stream-Protocol-Version`): v4, whose error stream
/// carries a `Status` as the WebSocket protocols' error channel does.
pub const SPDY_PROTOCOL: &str = "v4.channel.k8s.io";

/// Runs `session` (exec or attach) over a SPDY/3.1 connection (v4): the client opens an
/// `error` stream and one per standard stream it asked for (`stdin`, `stdout`, `stderr`,
/// `resize` with a terminal); the session starts once they are all open. Output goes on
/// the matching streams; at the end they are finished and the `Status` is written on
/// `error`.
pub async fn serve_spdy<IO, F, Fut>(io: IO, wanted: Wanted, session: F)
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + 'static,
    F: FnOnce(mpsc::Receiver<Input>, mpsc::Sender<Output>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    use super::spdy::{self, Frame, header};
    let (mut reader, mut writer) = tokio::io::split(io);
    let (frames_tx, mut frames) = mpsc::channel::<Frame>(16);
    let read_task = tokio::spawn(async move {
        let mut inflater = spdy::Inflater::default();
        while let Ok(Some(f)) = spdy::read_frame(&mut reader, &mut inflater).await {
            if frames_tx.send(f).await.is_err() {
                break;
            }
        }
    });
    let (wire, mut wire_rx) = mpsc::channel::<Bytes>(32);
    let write_task = tokio::spawn(async move {
        while let Some(b) = wire_rx.recv().await {
            if writer.write_all(&b).await.is_err() || writer.flush().await.is_err() {
                break;
            }
        }
        let _ = writer.shutdown().await;
    });
    let mut deflater = spdy::Deflater::default();
    let expected = |kind: &str| match kind {
        "error" => true,
        "stdin" => wanted.stdin,
        "stdout" => wanted.stdout,
        "stderr" => wanted.stderr && !wanted.tty,
        "resize" => wanted.tty,
        _ => false,
    };
    let mut ids: HashMap<String, u32> = HashMap::new();
    let (in_tx, in_rx) = mpsc::channel::<Input>(8);
    let (out_tx, mut out_rx) = mpsc::channel::<Output>(16);
    let mut core_parts = Some((session, in_rx, out_tx));
    let mut core = None;
    let mut in_tx = Some(in_tx);
    let mut resize_buf: Vec<u8> = Vec::new();
    let wanted = ["error", "stdin", "stdout", "stderr", "resize"]
        .into_iter()
        .filter(|k| expected(k))
        .count();
    loop {
        tokio::select! {
            f = frames.recv() => match f {
                Some(Frame::SynStream { id, headers, .. }) => {
                    let kind = header(&headers, "streamtype").unwrap_or_default().to_owned();
                    if !expected(&kind) || ids.contains_key(&kind) {
                        let _ = wire.send(spdy::rst_stream(id, spdy::PROTOCOL_ERROR)).await;
                        continue;
                    }
                    let _ = wire.send(spdy::syn_reply(&mut deflater, id, &[])).await;
                    ids.insert(kind, id);
                    if ids.len() == wanted
                        && let Some((session, i, out)) = core_parts.take()
                    {
                        core = Some(tokio::spawn(session(i, out)));
                    }
                }
                Some(Frame::Data { id, fin, data }) => {
                    let Some(tx) = &in_tx else { continue };
                    if Some(&id) == ids.get("stdin") {
                        if !data.is_empty() && tx.send(Input::Stdin(data)).await.is_err() {
                            in_tx = None;
                            continue;
                        }
                        if fin {
                            let _ = tx.send(Input::StdinEnd).await;
                        }
                    } else if Some(&id) == ids.get("resize") {
                        resize_buf.extend_from_slice(&data);
                        // One JSON object per line, as Go's encoder writes them.
                        while let Some(end) = resize_buf.iter().position(|&b| b == b'\n') {
                            let line: Vec<u8> = resize_buf.drain(..=end).collect();
                            if let Some(size) = winsize(&line) {
                                let _ = tx.send(Input::Resize(size)).await;
                            }
                        }
                    }
                }
                Some(Frame::Ping(n)) => {
                    let _ = wire.send(spdy::ping(n)).await;
                }
                // A stream reset, the connection going away or ending: the client left.
                Some(Frame::RstStream { .. } | Frame::GoAway) | None => break,
                Some(_) => {}
            },
            o = out_rx.recv(), if core.is_some() => match o {
                Some(Output::Data(channel, b)) => {
                    let kind = if channel == STDERR { "stderr" } else { "stdout" };
                    if let Some(&id) = ids.get(kind) {
                        for piece in b.chunks(CHUNK) {
                            let _ = wire.send(spdy::data(id, false, piece)).await;
                        }
                    }
                }
                Some(Output::Status(v)) => {
                    for kind in ["stdout", "stderr"] {
                        if let Some(&id) = ids.get(kind) {
                            let _ = wire.send(spdy::data(id, true, &[])).await;
                        }
                    }
                    if let Some(&id) = ids.get("error") {
                        let _ = wire.send(spdy::data(id, true, v.to_string().as_bytes())).await;
                    }
                    // The client closes the connection once it has read everything.
                    let _ = tokio::time::timeout(std::time::Duration::from_secs(10), async {
                        while let Some(f) = frames.recv().await {
                            if let Frame::Ping(n) = f {
                                let _ = wire.send(spdy::ping(n)).await;
                            }
                        }
                    })
                    .await;
                    break;
                }
                None => break,
            },
        }
    }
    drop(in_tx);
    if let Some(c) = core {
        let _ = c.await;
    }
    read_task.abort();
    drop(wire);
    let _ = write_task.await;
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
