//! A real etcd process for tests and benchmarks: started on free loopback ports with a
//! temporary data directory, restartable, and killed when dropped.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use crate::metrics::StoreMetrics;
use crate::{EtcdOptions, EtcdStore, Store};

/// One single-member etcd cluster on 127.0.0.1.
pub struct EtcdProcess {
    child: Option<Child>,
    dir: tempfile::TempDir,
    client_port: u16,
    peer_port: u16,
    name: String,
}

fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// The etcd binary: `$ETCD_BIN`, else `etcd` on the PATH.
pub fn etcd_binary() -> PathBuf {
    std::env::var_os("ETCD_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("etcd"))
}

impl EtcdProcess {
    /// Starts etcd and waits until it answers. A free port can be taken by another process
    /// between our probe and etcd's bind, so a start that fails is tried again on new ports.
    pub async fn start() -> std::io::Result<EtcdProcess> {
        let mut last = None;
        for _ in 0..3 {
            let mut p = EtcdProcess {
                child: None,
                dir: tempfile::Builder::new().prefix("tessera-etcd-").tempdir()?,
                client_port: free_port()?,
                peer_port: free_port()?,
                name: "tessera-test".into(),
            };
            p.spawn()?;
            match p.wait_ready().await {
                Ok(()) => return Ok(p),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| std::io::Error::other("etcd did not start")))
    }

    fn spawn(&mut self) -> std::io::Result<()> {
        let client = self.url();
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let log = std::fs::File::create(self.dir.path().join("etcd.log"))?;
        let child = Command::new(etcd_binary())
            .arg("--name")
            .arg(&self.name)
            .arg("--data-dir")
            .arg(self.dir.path().join("data"))
            .arg("--listen-client-urls")
            .arg(&client)
            .arg("--advertise-client-urls")
            .arg(&client)
            .arg("--listen-peer-urls")
            .arg(&peer)
            .arg("--initial-advertise-peer-urls")
            .arg(&peer)
            .arg("--initial-cluster")
            .arg(format!("{}={peer}", self.name))
            .arg("--experimental-watch-progress-notify-interval")
            .arg("1s")
            .arg("--logger")
            .arg("zap")
            .arg("--log-level")
            .arg("warn")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .map_err(|e| {
                std::io::Error::new(
                    e.kind(),
                    format!(
                        "starting {:?} failed: {e} (install etcd: apt-get install -y etcd-server)",
                        etcd_binary()
                    ),
                )
            })?;
        self.child = Some(child);
        Ok(())
    }

    async fn wait_ready(&mut self) -> std::io::Result<()> {
        let store = EtcdStore::connect(self.options(), StoreMetrics::detached())
            .await
            .map_err(std::io::Error::other)?;
        for _ in 0..200 {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                let log =
                    std::fs::read_to_string(self.dir.path().join("etcd.log")).unwrap_or_default();
                return Err(std::io::Error::other(format!(
                    "etcd exited with {status}: {log}"
                )));
            }
            if store.current_revision().await.is_ok() {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(std::io::Error::other("etcd did not become ready in 20 s"))
    }

    /// The client URL.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }

    /// Backend options for this process, with short retry and progress intervals for tests.
    pub fn options(&self) -> EtcdOptions {
        let mut o = EtcdOptions::new(vec![self.url()]);
        o.retry_for = Duration::from_secs(20);
        o.progress_interval = Duration::from_secs(1);
        o
    }

    /// A store connected to this process.
    pub async fn store(&self) -> Arc<dyn Store> {
        match EtcdStore::connect(self.options(), StoreMetrics::detached()).await {
            Ok(s) => Arc::new(s),
            Err(e) => panic!("connecting to the test etcd failed: {e}"),
        }
    }

    /// Kills etcd (SIGKILL) and waits for it to exit.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same ports and data directory.
    pub async fn start_again(&mut self) -> std::io::Result<()> {
        self.spawn()?;
        self.wait_ready().await
    }
}

impl Drop for EtcdProcess {
    fn drop(&mut self) {
        self.kill();
    }
}
