//! Crash test of the embedded store: a child process writes and reports every acknowledged
//! write; the test kills it with SIGKILL at random moments, reopens the store, and checks
//! that every acknowledged write is there — over many rounds on one data directory, so that
//! recovery of a recovered store, torn log tails and interrupted snapshots are all exercised.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use rand::Rng;
use tessera_store::{EmbeddedOptions, EmbeddedStore, ListRequest, Store, StoreMetrics};

const ROUNDS: u64 = 30;

/// When to kill the writer: some time after it reported ready, or during its recovery.
#[derive(Clone, Copy, Debug)]
enum Kill {
    AfterReady(Duration),
    DuringRecovery(Duration),
}

/// Kills the writer when dropped, so a failing assertion never leaves it running (and holding
/// the test's output pipes open).
struct Writer(std::process::Child);

impl Drop for Writer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn run_round(dir: &std::path::Path, round: u64, kill: Kill) -> HashMap<u64, i64> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args([
            "debug",
            "store-writer",
            "--concurrency",
            "32",
            "--snapshot-bytes",
            "262144",
        ])
        .arg("--start")
        .arg((round * 10_000_000).to_string())
        .arg("--data-dir")
        .arg(dir)
        .env("TESSERA_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map(Writer)
        .expect("start the writer");
    let stdout = child.0.stdout.take().expect("stdout");
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut acked = HashMap::new();
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if line == "ready" {
                let _ = ready_tx.send(());
                continue;
            }
            let mut parts = line.split(' ');
            if let (Some("ack"), Some(n), Some(rev)) = (parts.next(), parts.next(), parts.next())
                && let (Ok(n), Ok(rev)) = (n.parse::<u64>(), rev.parse::<i64>())
            {
                acked.insert(n, rev);
            }
        }
        acked
    });
    match kill {
        Kill::AfterReady(after) => {
            ready_rx
                .recv_timeout(Duration::from_secs(60))
                .expect("the writer opened the store");
            std::thread::sleep(after);
        }
        Kill::DuringRecovery(after) => std::thread::sleep(after),
    }
    child.0.kill().expect("SIGKILL the writer");
    child.0.wait().expect("reap the writer");
    reader.join().expect("reader thread")
}

#[test]
fn acknowledged_writes_survive_sigkill() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let mut rng = rand::rng();
    let mut all_acked: HashMap<u64, i64> = HashMap::new();
    for round in 0..ROUNDS {
        let kill = if round % 5 == 4 {
            Kill::DuringRecovery(Duration::from_millis(rng.random_range(0..60)))
        } else {
            Kill::AfterReady(Duration::from_millis(rng.random_range(20..400)))
        };
        let acked = run_round(dir.path(), round, kill);
        if let Kill::AfterReady(after) = kill {
            assert!(
                !acked.is_empty(),
                "round {round}: the writer acknowledged nothing in {after:?}"
            );
        }
        all_acked.extend(acked);
        rt.block_on(async {
            let store = EmbeddedStore::open(
                dir.path(),
                EmbeddedOptions::default(),
                StoreMetrics::detached(),
            )
            .await
            .unwrap_or_else(|e| panic!("round {round}: reopening failed: {e}"));
            let mut found = HashMap::new();
            let mut req = ListRequest {
                prefix: bytes::Bytes::from_static(b"/registry/crash/"),
                limit: 10_000,
                ..Default::default()
            };
            loop {
                let page = store.list(req.clone()).await.expect("list");
                for kv in page.kvs {
                    let key = std::str::from_utf8(&kv.key).expect("utf8");
                    let n: u64 = key
                        .rsplit("/k")
                        .next()
                        .and_then(|s| s.parse().ok())
                        .expect("key number");
                    let want = format!("value-{n}-{}", "x".repeat((n % 200) as usize));
                    assert_eq!(kv.value, want.as_bytes(), "key {n} has a damaged value");
                    found.insert(n, kv.mod_revision);
                }
                match page.continue_token {
                    Some(t) => req.continue_token = Some(t),
                    None => break,
                }
            }
            for (n, rev) in &all_acked {
                assert_eq!(
                    found.get(n),
                    Some(rev),
                    "round {round}: acknowledged write {n} (revision {rev}) was lost"
                );
            }
            store.close().await.expect("close");
        });
        eprintln!(
            "round {round}: killed ({kill:?}); {} acknowledged writes so far, all present",
            all_acked.len()
        );
    }
    let snapshots = std::fs::read_dir(dir.path())
        .expect("read dir")
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with("snap-"))
        .count();
    assert!(snapshots >= 1, "the rounds wrote enough to take snapshots");
}
