//! What the process-runtime tests share: an API over an embedded store, one process node
//! sandboxing its containers through the helper built with the tests, and small helpers to
//! create pods and wait for them.

#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use serde_json::{Value, json};
use tessera_agent::isolation::Isolation;
use tessera_agent::process::{ProcessAgent, ProcessConfig};
use tessera_agent::sandbox::Launcher;
use tessera_apiserver::api::{Api, ApiResponse};
use tessera_apiserver::auth::{Tokens, User};
use tessera_apiserver::catalog::Resource;
use tessera_apiserver::client::{Client, InProcess};
use tessera_apiserver::request::{find_resource, from_http};
use tessera_apiserver::status::ApiError;
use tessera_store::{EmbeddedOptions, EmbeddedStore, StoreMetrics};

/// A core/v1 resource.
pub fn res(plural: &str) -> &'static Resource {
    find_resource("", "v1", plural).expect("resource")
}

/// Pod `name` of `default`, if it exists.
pub async fn get(c: &Arc<dyn Client>, name: &str) -> Option<Value> {
    c.get(res("pods"), Some("default"), name).await.ok()
}

/// Waits (15 s at most) until `f` holds.
pub async fn until<F: std::future::Future<Output = bool>>(what: &str, f: impl FnMut() -> F) {
    until_within(what, Duration::from_secs(15), f).await;
}

/// Waits (`limit` at most) until `f` holds.
pub async fn until_within<F: std::future::Future<Output = bool>>(
    what: &str,
    limit: Duration,
    mut f: impl FnMut() -> F,
) {
    let tries = limit.as_millis() / 25;
    for _ in 0..tries {
        if f().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("timed out waiting for {what}");
}

/// `GET pods/NAME/log?QUERY` through the API, read to its end.
pub async fn logs(c: &Arc<dyn Client>, name: &str, query: &str) -> Result<String, ApiError> {
    let path = format!("/api/v1/namespaces/default/pods/{name}/log");
    let req = from_http("GET", &path, query, None, None, Default::default())?.expect("served");
    match c.call(req).await? {
        ApiResponse::Stream { mut body, .. } => {
            let mut out = Vec::new();
            while let Some(chunk) = body.next().await {
                out.extend_from_slice(&chunk.expect("chunk"));
            }
            Ok(String::from_utf8(out).expect("utf-8"))
        }
        other => panic!("a log read answered {other:?}"),
    }
}

/// A pod for `proc-0` with one container `main` running `command`; `extra` goes into the
/// container.
pub fn pod(name: &str, command: Value, policy: &str, extra: Value) -> Value {
    let mut c = json!({"name": "main", "image": "busybox", "command": command});
    if let (Some(c), Some(extra)) = (c.as_object_mut(), extra.as_object()) {
        for (k, v) in extra {
            c.insert(k.clone(), v.clone());
        }
    }
    json!({"metadata": {"name": name, "namespace": "default"},
        "spec": {"nodeName": "proc-0", "restartPolicy": policy, "containers": [c]}})
}

/// Containers in the sandbox, through the helper binary built with these tests — or, with
/// `TESSERA_TEST_ISOLATION_OFF` set, without one: how the attacking-tenant tests are shown to
/// fail against a runtime that does not isolate (their probes only look, never change the
/// host).
pub fn sandboxed() -> Isolation {
    if std::env::var_os("TESSERA_TEST_ISOLATION_OFF").is_some() {
        return Isolation::Off;
    }
    Isolation::Sandbox(Launcher {
        exe: env!("CARGO_BIN_EXE_tessera-sandbox").into(),
        prefix: vec![],
    })
}

/// An API with a registered process node `proc-0` (not yet running).
pub struct Fixture {
    /// Holds the store, logs, sandboxes.
    pub dir: tempfile::TempDir,
    /// The store under the API.
    pub store: Arc<EmbeddedStore>,
    /// The API.
    pub api: Api,
    /// The admin token's node tokens.
    pub tokens: Tokens,
    /// An admin client.
    pub client: Arc<dyn Client>,
    /// Where the node keeps logs.
    pub log_dir: PathBuf,
    /// The node.
    pub agent: Arc<ProcessAgent>,
}

impl Fixture {
    /// The node, with its config adjusted by `tweak` (fast back-off, sandboxed).
    pub async fn start(tweak: impl FnOnce(&mut ProcessConfig)) -> Fixture {
        let dir = tempfile::tempdir().expect("tmp");
        let metrics = StoreMetrics::register(&prometheus::Registry::new()).expect("metrics");
        let store = Arc::new(
            EmbeddedStore::open(&dir.path().join("store"), EmbeddedOptions::small(), metrics)
                .await
                .expect("store"),
        );
        let tokens = Tokens::new("test-admin-token");
        let api = Api::new(store.clone(), None).with_node_proxy(tokens.clone());
        let client: Arc<dyn Client> = Arc::new(InProcess::new(api.clone(), User::Admin));
        client
            .create(
                res("namespaces"),
                None,
                &json!({"metadata": {"name": "default"}}),
            )
            .await
            .expect("ns");
        let log_dir = dir.path().join("logs");
        let mut config = ProcessConfig {
            backoff: Duration::from_millis(100),
            max_backoff: Duration::from_millis(400),
            tokens: Some(tokens.clone()),
            usage_window: Duration::from_millis(200),
            isolation: sandboxed(),
            state_dir: dir.path().join("pods"),
            ..ProcessConfig::new("proc-0", log_dir.clone())
        };
        tweak(&mut config);
        let agent = ProcessAgent::new(client.clone(), config);
        agent.register().await.expect("register");
        Fixture {
            dir,
            store,
            api,
            tokens,
            client,
            log_dir,
            agent,
        }
    }
}
