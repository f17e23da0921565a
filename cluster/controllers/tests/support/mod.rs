//! A working shard in one process for controller tests: a real API on a real embedded store,
//! the real scheduler, hollow nodes, and the controllers under test.

#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tessera_agent::sim::{SimAgent, SimConfig};
use tessera_apiserver::api::Api;
use tessera_apiserver::auth::User;
use tessera_apiserver::client::{Client, InProcess};
use tessera_apiserver::request::{ApiRequest, Verb};
use tessera_controllers::Context;
use tessera_controllers::clock::OffsetClock;
use tessera_controllers::context::res;
use tessera_scheduler::config::SchedulerConfig;
use tessera_scheduler::{Scheduler, SchedulerOptions};
use tessera_store::{EmbeddedOptions, EmbeddedStore, StoreMetrics};

pub struct Shard {
    pub agent: Arc<SimAgent>,
    /// The controllers' wall clock, which a test may move.
    pub clock: Arc<OffsetClock>,
    pub client: Arc<dyn Client>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

impl Shard {
    /// Stops the simulated agent as a killed process stops: no more renewals, nothing more
    /// written for its pods.
    #[allow(dead_code)] // not every test binary stops its agent
    pub fn kill_agent(&self) {
        self.tasks[0].abort();
    }
}

impl Drop for Shard {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Logs of the shard's components, shown with a failing test's output (warnings unless
/// `TESSERA_LOG` says otherwise).
fn log_to_test_output() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("TESSERA_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_test_writer()
        .try_init();
}

pub async fn shard(nodes: usize) -> Shard {
    log_to_test_output();
    let dir = tempfile::tempdir().expect("tmp");
    let metrics = StoreMetrics::register(&prometheus::Registry::new()).expect("metrics");
    let store = Arc::new(
        EmbeddedStore::open(dir.path(), EmbeddedOptions::small(), metrics)
            .await
            .expect("store"),
    );
    let client: Arc<dyn Client> = Arc::new(InProcess::new(Api::new(store, None), User::Admin));
    client
        .create(
            res("", "namespaces"),
            None,
            &json!({"metadata": {"name": "default"}}),
        )
        .await
        .expect("ns");
    let agent = SimAgent::new(
        client.clone(),
        SimConfig {
            nodes,
            cpu: "2".into(),
            startup_delay: Duration::from_millis(50),
            renew_interval: Duration::from_secs(1),
            ..SimConfig::default()
        },
        None,
        None,
    );
    agent.register(|| {}).await.expect("register");
    let sched = Scheduler::new(
        client.clone(),
        SchedulerOptions {
            config: SchedulerConfig::default(),
            metrics: None,
            runtime_metrics: None,
            informers: None,
        },
    )
    .expect("scheduler");
    let clock = Arc::new(OffsetClock::default());
    let ctx = Context {
        clock: clock.clone(),
        ..Context::new(client.clone())
    };
    Shard {
        clock,
        tasks: vec![
            tokio::spawn(agent.clone().run()),
            tokio::spawn(sched.run()),
            tokio::spawn(tessera_controllers::run_all_with(
                ctx,
                tessera_controllers::Settings {
                    nodes: tessera_controllers::nodelifecycle::NodeLifecycleConfig {
                        grace: Duration::from_secs(2),
                        period: Duration::from_millis(200),
                    },
                    quota_resync: Duration::from_millis(500),
                    root_ca: Some(TEST_CA.into()),
                    hpa: tessera_controllers::hpa::HpaConfig {
                        sync_period: Duration::from_millis(200),
                        ..Default::default()
                    },
                    hpa_metrics: None,
                    csr_signer: None,
                },
            )),
        ],
        client,
        agent,
        _dir: dir,
    }
}

/// The bundle the test shard's root CA publisher publishes.
pub const TEST_CA: &str = "-----BEGIN CERTIFICATE-----\ntest\n-----END CERTIFICATE-----\n";

pub async fn list(c: &Arc<dyn Client>, group: &str, plural: &str) -> Vec<Value> {
    list_in(c, group, plural, "default").await
}

pub async fn list_in(c: &Arc<dyn Client>, group: &str, plural: &str, ns: &str) -> Vec<Value> {
    let mut req = ApiRequest::new(Verb::List, res(group, plural));
    req.namespace = Some(ns.into());
    c.list(req).await.expect("list")["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

pub async fn wait_until<F: std::future::Future<Output = bool>>(
    what: &str,
    mut f: impl FnMut() -> F,
) {
    for _ in 0..1_000 {
        if f().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("timed out waiting for {what}");
}

/// [`wait_until`], and on a timeout the panic carries what `dump` says about the state then
/// (for failures seen only on a loaded CI machine).
pub async fn wait_until_else<F, D>(what: &str, mut f: impl FnMut() -> F, dump: impl FnOnce() -> D)
where
    F: std::future::Future<Output = bool>,
    D: std::future::Future<Output = String>,
{
    for _ in 0..1_000 {
        if f().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!(
        "timed out waiting for {what}; state then:\n{}",
        dump().await
    );
}

/// Every event of one resource's watch in a namespace, recorded as it arrives (from the
/// objects there when it starts): for asserting on what happened, not on what a poll
/// happened to see.
pub struct Events {
    seen: Arc<parking_lot::Mutex<Vec<(String, Value)>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Events {
    /// Starts watching `group`/`plural` in `ns`; returns once the watch is open.
    pub async fn start(c: &Arc<dyn Client>, group: &str, plural: &str, ns: &str) -> Events {
        use futures::StreamExt;
        let mut req = ApiRequest::new(Verb::Watch, res(group, plural));
        req.namespace = Some(ns.into());
        let mut stream = c.watch(req).await.expect("watch");
        let seen = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let sink = seen.clone();
        let task = tokio::spawn(async move {
            while let Some(ev) = stream.next().await {
                let v = ev.into_value();
                let ty = v["type"].as_str().unwrap_or_default().to_owned();
                sink.lock().push((ty, v["object"].clone()));
            }
        });
        Events { seen, task }
    }

    /// What was seen so far: (type, object) in order.
    pub fn seen(&self) -> Vec<(String, Value)> {
        self.seen.lock().clone()
    }

    /// Names of the objects deleted so far, in the order of their DELETED events.
    pub fn deleted(&self) -> Vec<String> {
        self.seen
            .lock()
            .iter()
            .filter(|(ty, _)| ty == "DELETED")
            .filter_map(|(_, o)| o["metadata"]["name"].as_str().map(str::to_owned))
            .collect()
    }
}

impl Drop for Events {
    fn drop(&mut self) {
        self.task.abort();
    }
}
