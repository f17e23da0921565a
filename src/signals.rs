//! The signals that stop a process — Ctrl-C (SIGINT) and SIGTERM, what Kubernetes sends a
//! pod's containers when it deletes the pod — and leading until one comes.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tessera_runtime::leader::LeaderElector;

/// Completes when the process is asked to stop.
pub async fn stopped() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, "SIGTERM cannot be watched; only Ctrl-C stops this process cleanly");
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// Runs `work` while `elector` holds its Lease, until the work ends, the Lease is lost (an
/// error: the process must stop writing) or the process is asked to stop. Asked to stop
/// while leading, the work is ended and the Lease released, so a standby takes it at its
/// next retry instead of waiting for it to lapse; asked while waiting, it just returns.
pub async fn lead_until_stopped<F>(elector: LeaderElector, work: F) -> anyhow::Result<()>
where
    F: Future<Output = anyhow::Result<()>>,
{
    let (tx, rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        stopped().await;
        let _ = tx.send(true);
    });
    let requested = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|stop| *stop).await;
    };
    let leading = Arc::new(AtomicBool::new(false));
    let work = {
        let leading = leading.clone();
        let stop = requested(rx.clone());
        async move {
            leading.store(true, Ordering::SeqCst);
            tokio::select! {
                r = work => r,
                _ = stop => Ok(()),
            }
        }
    };
    let waiting_stopped = {
        let stop = requested(rx);
        async move {
            stop.await;
            if leading.load(Ordering::SeqCst) {
                // The work sees the same request and ends; `lead` then releases the Lease.
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        r = elector.lead(work) => match r {
            Ok(result) => result,
            Err(lost) => Err(anyhow::anyhow!("{lost}")),
        },
        _ = waiting_stopped => Ok(()),
    }
}
