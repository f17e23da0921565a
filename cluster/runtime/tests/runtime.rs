//! The runtime against a real API on a real embedded store: informers list, watch and
//! relist into their caches; the reconcile runner retries with backoff. (Leader election,
//! which is about time, is tested with paused time in `leader.rs`.)

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Pod;
use parking_lot::Mutex;
use serde_json::json;
use tessera_apiserver::api::Api;
use tessera_apiserver::auth::User;
use tessera_apiserver::catalog::Resource;
use tessera_apiserver::client::{Client, InProcess};
use tessera_apiserver::request::find_resource;
use tessera_runtime::controller::{self, Action, ReconcileError, Reconciler};
use tessera_runtime::metrics::RuntimeMetrics;
use tessera_runtime::{Change, Informer, Informers, QueueConfig, Scope, WorkQueue};
use tessera_store::{EmbeddedOptions, EmbeddedStore, Store, StoreMetrics};

struct Setup {
    store: Arc<dyn Store>,
    client: Arc<dyn Client>,
    _dir: tempfile::TempDir,
}

async fn setup() -> Setup {
    let dir = tempfile::tempdir().expect("tempdir");
    let metrics = StoreMetrics::register(&prometheus::Registry::new()).expect("metrics");
    let store: Arc<dyn Store> = Arc::new(
        EmbeddedStore::open(dir.path(), EmbeddedOptions::small(), metrics)
            .await
            .expect("store"),
    );
    let client: Arc<dyn Client> =
        Arc::new(InProcess::new(Api::new(store.clone(), None), User::Admin));
    for ns in ["default", "kube-system"] {
        client
            .create(res("namespaces"), None, &json!({"metadata": {"name": ns}}))
            .await
            .expect("namespace");
    }
    Setup {
        store,
        client,
        _dir: dir,
    }
}

fn res(plural: &str) -> &'static Resource {
    let (g, v) = if plural == "leases" {
        ("coordination.k8s.io", "v1")
    } else {
        ("", "v1")
    };
    find_resource(g, v, plural).expect("resource")
}

fn pod(name: &str, app: &str) -> serde_json::Value {
    json!({"metadata": {"name": name, "namespace": "default", "labels": {"app": app}},
           "spec": {"containers": [{"name": "c", "image": "busybox"}]}})
}

async fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    for _ in 0..500 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting for {what}");
}

#[tokio::test]
async fn informer_lists_in_pages_watches_and_indexes() {
    let s = setup().await;
    for i in 0..1_203 {
        let app = if i % 3 == 0 { "web" } else { "db" };
        s.client
            .create(res("pods"), Some("default"), &pod(&format!("p{i}"), app))
            .await
            .expect("create");
    }
    let informer = Informer::<Pod>::new(s.client.clone(), res("pods"), Scope::default(), None);
    let log = Arc::new(Mutex::new(Vec::<String>::new()));
    let l = log.clone();
    let _subscription = informer.on_change(move |c| {
        let name = c.object().metadata.name.clone().unwrap_or_default();
        l.lock().push(match c {
            Change::Added(_) => format!("add {name}"),
            Change::Updated { .. } => format!("update {name}"),
            Change::Deleted(_) => format!("delete {name}"),
        });
    });
    let task = tokio::spawn(informer.clone().run());
    informer.synced().await;
    assert_eq!(
        informer.cache().len(),
        1_203,
        "three pages of 500 and a rest"
    );
    assert_eq!(log.lock().len(), 1_203);
    let sel = "app=web".parse().expect("selector");
    assert_eq!(informer.cache().select(Some("default"), &sel).len(), 401);
    assert_eq!(informer.cache().select(Some("other"), &sel).len(), 0);
    let notweb = "app!=web".parse().expect("selector");
    assert_eq!(informer.cache().select(None, &notweb).len(), 802);
    assert_eq!(informer.cache().in_namespace("default").len(), 1_203);

    log.lock().clear();
    s.client
        .create(res("pods"), Some("default"), &pod("late", "web"))
        .await
        .expect("create");
    let mut p = s
        .client
        .get(res("pods"), Some("default"), "p0")
        .await
        .expect("get");
    p["metadata"]["labels"]["app"] = json!("db");
    s.client
        .update(res("pods"), Some("default"), &p)
        .await
        .expect("update");
    s.client
        .delete(res("pods"), Some("default"), "p1", None)
        .await
        .expect("delete");
    eventually("three watch events", || log.lock().len() >= 3).await;
    assert_eq!(
        *log.lock(),
        vec!["add late", "update p0", "delete p1"],
        "in the order they were written"
    );
    assert_eq!(
        informer.cache().select(Some("default"), &sel).len(),
        401,
        "p0 left the app=web index, late joined it"
    );
    assert!(informer.cache().get("default/p1").is_none());
    task.abort();

    // While no one watches, objects change and history is compacted; the informer's next
    // run relists and reports exactly the difference.
    let _ = task.await;
    log.lock().clear();
    s.client
        .delete(res("pods"), Some("default"), "p2", None)
        .await
        .expect("delete");
    s.client
        .create(res("pods"), Some("default"), &pod("new", "web"))
        .await
        .expect("create");
    let rev = s.store.current_revision().await.expect("rev");
    s.store.compact(&rev).await.expect("compact");
    let task = tokio::spawn(informer.clone().run());
    eventually("relist diff", || log.lock().len() >= 2).await;
    let mut seen = log.lock().clone();
    seen.sort();
    assert_eq!(seen, vec!["add new", "delete p2"]);
    task.abort();
}

struct Flaky {
    calls: AtomicUsize,
    seen: Mutex<Vec<String>>,
}

#[async_trait]
impl Reconciler for Flaky {
    fn name(&self) -> &'static str {
        "flaky"
    }
    async fn reconcile(&self, key: &str) -> Result<Action, ReconcileError> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst);
        self.seen.lock().push(key.to_owned());
        if n < 2 {
            return Err(ReconcileError::new("not yet"));
        }
        Ok(Action::Done)
    }
}

#[tokio::test(start_paused = true)]
async fn failed_reconciles_come_back_after_backoff() {
    let q = WorkQueue::new(QueueConfig::new("flaky"), None, None);
    let r = Arc::new(Flaky {
        calls: AtomicUsize::new(0),
        seen: Mutex::new(Vec::new()),
    });
    q.add("ns/a".to_owned(), tessera_runtime::EventClass::Add);
    let runner = tokio::spawn(controller::run(r.clone(), q.clone(), 2, None));
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        r.calls.load(Ordering::SeqCst),
        3,
        "two failures, then success"
    );
    assert_eq!(
        q.failures(&"ns/a".to_owned()),
        0,
        "success clears the backoff"
    );
    q.shut_down();
    runner.await.expect("runner");
}

/// The handler's log of what it saw, by pod name.
fn recorder(log: &Arc<Mutex<Vec<String>>>) -> impl Fn(&Change<Pod>) + Send + Sync + 'static {
    let l = log.clone();
    move |c| {
        let name = c.object().metadata.name.clone().unwrap_or_default();
        l.lock().push(match c {
            Change::Added(_) => format!("add {name}"),
            Change::Updated { .. } => format!("update {name}"),
            Change::Deleted(_) => format!("delete {name}"),
        });
    }
}

#[tokio::test]
async fn shared_informers_decode_each_change_once_for_every_reader() {
    let s = setup().await;
    let registry = prometheus::Registry::new();
    let metrics = RuntimeMetrics::register(&registry).expect("metrics");
    let informers = Informers::new(s.client.clone(), Some(metrics));
    let first = informers.get::<Pod>(res("pods"));
    let again = informers.get::<Pod>(res("pods"));
    assert!(
        Arc::ptr_eq(&first, &again),
        "one informer per resource and type"
    );
    assert_eq!(informers.len(), 1);

    let early = Arc::new(Mutex::new(Vec::new()));
    let early_sub = first.on_change(recorder(&early));
    for name in ["a", "b"] {
        s.client
            .create(res("pods"), Some("default"), &pod(name, "web"))
            .await
            .expect("create");
    }
    eventually("both pods cached", || first.cache().len() == 2).await;

    // A reader that comes later sees what is cached as additions, once each, then changes.
    let late = Arc::new(Mutex::new(Vec::new()));
    let late_sub = again.on_change(recorder(&late));
    {
        let mut seen = late.lock().clone();
        seen.sort();
        assert_eq!(seen, ["add a", "add b"]);
    }
    s.client
        .create(res("pods"), Some("default"), &pod("c", "web"))
        .await
        .expect("create");
    eventually("c seen by both", || {
        early.lock().contains(&"add c".to_owned()) && late.lock().contains(&"add c".to_owned())
    })
    .await;
    assert_eq!(early.lock().as_slice(), ["add a", "add b", "add c"]);
    assert_eq!(late.lock().len(), 3, "{:?}", late.lock());
    // Decoded once: three watch events applied for two readers.
    let added = counter(&registry, "tessera_informer_events_total", "added");
    assert_eq!(added, 3.0);
    assert_eq!(first.handler_count(), 2);

    // A reader that goes leaves nothing behind in the shared informer.
    drop(late_sub);
    assert_eq!(first.handler_count(), 1);
    s.client
        .delete(res("pods"), Some("default"), "a", None)
        .await
        .expect("delete");
    eventually("a's deletion seen", || {
        early.lock().contains(&"delete a".to_owned())
    })
    .await;
    assert!(
        !late.lock().iter().any(|e| e == "delete a"),
        "a dropped subscription gets nothing"
    );
    drop(early_sub);
    assert_eq!(first.handler_count(), 0);
    drop(informers);
    assert_eq!(
        gauge(&registry, "tessera_informers"),
        0.0,
        "stopped with the factory"
    );
}

fn counter(registry: &prometheus::Registry, name: &str, ty: &str) -> f64 {
    registry
        .gather()
        .iter()
        .filter(|f| f.name() == name)
        .flat_map(|f| f.get_metric().iter())
        .filter(|m| {
            m.get_label()
                .iter()
                .any(|l| l.name() == "type" && l.value() == ty)
                && m.get_label()
                    .iter()
                    .any(|l| l.name() == "resource" && l.value() == "pods")
        })
        .map(|m| m.get_counter().get_value())
        .sum()
}

fn gauge(registry: &prometheus::Registry, name: &str) -> f64 {
    registry
        .gather()
        .iter()
        .filter(|f| f.name() == name)
        .flat_map(|f| f.get_metric().iter())
        .map(|m| m.get_gauge().get_value())
        .sum()
}

struct Ticking(Arc<AtomicUsize>);

#[async_trait]
impl Reconciler for Ticking {
    fn name(&self) -> &'static str {
        "ticking"
    }
    async fn reconcile(&self, _key: &str) -> Result<Action, ReconcileError> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Ok(Action::RequeueAfter(Duration::from_millis(5)))
    }
}

#[tokio::test]
async fn a_dropped_controller_stops_its_workers() {
    let calls = Arc::new(AtomicUsize::new(0));
    let queue: WorkQueue<String> = WorkQueue::new(QueueConfig::new("ticking"), None, None);
    queue.add("k".into(), tessera_runtime::EventClass::Add);
    let task = tokio::spawn(controller::run(
        Arc::new(Ticking(calls.clone())),
        queue.clone(),
        2,
        None,
    ));
    eventually("a few reconciles", || calls.load(Ordering::SeqCst) >= 3).await;
    task.abort();
    let _ = task.await;
    // A worker in flight may finish its reconcile; nothing starts after that.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let stopped_at = calls.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        calls.load(Ordering::SeqCst),
        stopped_at,
        "workers went on reconciling after their controller was dropped"
    );
}
