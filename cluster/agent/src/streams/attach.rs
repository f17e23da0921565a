//! `attach`: the client joins a running container's own streams — its output from now on,
//! and, when its spec has `stdin: true`, its input — over the same transports as exec
//! ([`super::exec::serve_ws`], [`super::exec::serve_spdy`]). The session ends with the
//! container (a `Success` status) or when the client leaves. With `stdinOnce: true` the
//! container's stdin is closed when the first attached client's input ends, as the
//! kubelet does (`kubectl run -i` relies on it).
//!
//! The process runtime gives containers pipes, not terminals: a client asking for a TTY
//! gets the container's output as it is, without terminal handling.

use bytes::Bytes;
use serde_json::json;
use tessera_client::status::ApiError;
use tokio::io::AsyncWriteExt;
use tokio::sync::{broadcast, mpsc};

use super::Target;
use super::exec::{Input, Output, STDERR, STDOUT, Wanted};
use super::query_flag;

/// The streams a query asks for (`PodAttachOptions`), checked as Kubernetes checks them.
pub fn options(query: &str) -> Result<Wanted, ApiError> {
    let w = Wanted {
        stdin: query_flag(query, "stdin", false)?,
        stdout: query_flag(query, "stdout", true)?,
        stderr: query_flag(query, "stderr", true)?,
        tty: query_flag(query, "tty", false)?,
    };
    if !(w.stdin || w.stdout || w.stderr) {
        return Err(ApiError::bad_request(
            "you must specify at least 1 of stdin, stdout, stderr",
        ));
    }
    Ok(w)
}

/// The writer of a container's stdin: bytes to write, `None` to close it.
pub fn stdin_writer(mut stdin: tokio::process::ChildStdin) -> mpsc::Sender<Option<Bytes>> {
    let (tx, mut rx) = mpsc::channel::<Option<Bytes>>(16);
    tokio::spawn(async move {
        while let Some(Some(b)) = rx.recv().await {
            if stdin.write_all(&b).await.is_err() || stdin.flush().await.is_err() {
                break;
            }
        }
    });
    tx
}

/// Runs one attach session until the container ends or the client leaves.
pub async fn run(
    target: Target,
    wanted: Wanted,
    mut input: mpsc::Receiver<Input>,
    out: mpsc::Sender<Output>,
) {
    let mut output = target.output.subscribe();
    let stdin = target.stdin.clone().filter(|_| wanted.stdin);
    let once = target.container.stdin_once == Some(true);
    // Only the running container holds the output's sender now: it closes when it ends.
    drop(target);
    let close_once = |stdin: &Option<mpsc::Sender<Option<Bytes>>>| {
        let stdin = stdin.clone();
        async move {
            if once && let Some(s) = stdin {
                let _ = s.send(None).await;
            }
        }
    };
    loop {
        tokio::select! {
            got = output.recv() => match got {
                Ok((channel, b)) => {
                    let want = (channel == STDOUT && wanted.stdout)
                        || (channel == STDERR && (wanted.stderr || wanted.tty));
                    // With a terminal asked for, both are its output (channel 1).
                    let channel = if wanted.tty { STDOUT } else { channel };
                    if want && out.send(Output::Data(channel, b)).await.is_err() {
                        return;
                    }
                }
                Err(broadcast::error::RecvError::Lagged(n)) => {
                    tracing::debug!(skipped = n, "an attached client fell behind the container's output");
                }
                Err(broadcast::error::RecvError::Closed) => {
                    let _ = out
                        .send(Output::Status(json!({"metadata": {}, "status": "Success"})))
                        .await;
                    return;
                }
            },
            got = input.recv() => match got {
                Some(Input::Stdin(b)) => {
                    if let Some(s) = &stdin {
                        let _ = s.send(Some(b)).await;
                    }
                }
                Some(Input::StdinEnd) => close_once(&stdin).await,
                Some(Input::Resize(_)) => {}
                None => {
                    close_once(&stdin).await;
                    return;
                }
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attach_needs_a_stream() {
        let w = options("stdin=true&stdout=true&stderr=false").expect("ok");
        assert!(w.stdin && w.stdout && !w.stderr && !w.tty);
        let e = options("stdout=false&stderr=false").expect_err("none");
        assert!(e.message.contains("at least 1 of stdin"), "{}", e.message);
    }

    #[tokio::test]
    async fn output_flows_until_the_container_ends_and_stdin_once_closes_input() {
        let (live, _) = broadcast::channel(16);
        let (stdin_tx, mut stdin_rx) = mpsc::channel(4);
        let target = Target {
            at: crate::probe::Where::Host,
            env: Vec::new(),
            container: k8s_openapi::api::core::v1::Container {
                name: "main".into(),
                stdin_once: Some(true),
                ..Default::default()
            },
            output: live.clone(),
            stdin: Some(stdin_tx),
        };
        let wanted = options("stdin=true&stdout=true&stderr=false").expect("ok");
        let (in_tx, in_rx) = mpsc::channel(4);
        let (out_tx, mut out_rx) = mpsc::channel(4);
        let session = tokio::spawn(run(target, wanted, in_rx, out_tx));
        // Subscribed once the session has started.
        while live.receiver_count() == 0 {
            tokio::task::yield_now().await;
        }
        live.send((STDERR, Bytes::from_static(b"hidden")))
            .expect("send");
        live.send((STDOUT, Bytes::from_static(b"shown")))
            .expect("send");
        match out_rx.recv().await {
            Some(Output::Data(STDOUT, b)) => assert_eq!(&b[..], b"shown"),
            other => panic!("{other:?}"),
        }
        in_tx
            .send(Input::Stdin(Bytes::from_static(b"typed")))
            .await
            .expect("in");
        assert_eq!(
            stdin_rx.recv().await,
            Some(Some(Bytes::from_static(b"typed")))
        );
        in_tx.send(Input::StdinEnd).await.expect("end");
        assert_eq!(stdin_rx.recv().await, Some(None), "stdinOnce closes it");
        drop(live);
        match out_rx.recv().await {
            Some(Output::Status(s)) => assert_eq!(s["status"], "Success"),
            other => panic!("{other:?}"),
        }
        session.await.expect("session");
    }
}
