//! Faults of a real etcd: a killed and restarted etcd, an unreachable one. Reads and watches
//! ride through with retries; writes whose outcome is unknown are reported, not repeated.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use prometheus::Registry;
use tessera_store::testing::EtcdProcess;
use tessera_store::{EtcdOptions, EtcdStore, EventKind, Store, StoreError, StoreMetrics};

fn pod(i: usize) -> Bytes {
    Bytes::from(format!("/registry/pods/ns{}/p{i:03}", i % 3))
}

fn counter(registry: &Registry, name: &str) -> f64 {
    registry
        .gather()
        .iter()
        .filter(|f| f.name() == name)
        .flat_map(|f| f.get_metric().iter().map(|m| m.get_counter().get_value()))
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_and_reads_ride_through_an_etcd_restart() {
    let mut etcd = EtcdProcess::start().await.expect("start etcd");
    let registry = Registry::new();
    let metrics = StoreMetrics::register(&registry).expect("metrics");
    let store: Arc<dyn Store> = Arc::new(
        EtcdStore::connect(etcd.options(), metrics)
            .await
            .expect("connect"),
    );
    let start = store.current_revision().await.expect("rev");
    let mut watch = store
        .watch(b"/registry/pods/", Some(start))
        .await
        .expect("watch");
    let mut written = Vec::new();
    for i in 0..20 {
        written.push(
            store
                .put(pod(i), Bytes::from(format!("v{i}")))
                .await
                .expect("put"),
        );
    }

    etcd.kill();
    // A write while etcd is down is reported (its outcome would be unknown), not retried.
    let err = store
        .put(pod(999), Bytes::from_static(b"lost"))
        .await
        .expect_err("etcd is down");
    assert!(matches!(err, StoreError::Unavailable { .. }), "{err}");
    // A read started while etcd is down is retried until it comes back.
    let pending_read = {
        let store = store.clone();
        tokio::spawn(async move { store.get(&pod(0)).await })
    };
    tokio::time::sleep(Duration::from_millis(800)).await;
    etcd.start_again().await.expect("restart etcd");
    let read = pending_read
        .await
        .expect("task")
        .expect("read after restart");
    assert_eq!(read.map(|kv| kv.value), Some(Bytes::from_static(b"v0")));

    for i in 20..40 {
        written.push(
            store
                .put(pod(i), Bytes::from(format!("v{i}")))
                .await
                .expect("put"),
        );
    }
    // The watch delivers all 40 writes exactly once, in order, across the restart.
    let mut seen = Vec::new();
    while seen.len() < written.len() {
        let batch = tokio::time::timeout(Duration::from_secs(60), watch.next())
            .await
            .expect("events within 60 s")
            .expect("stream open")
            .expect("no error");
        for e in batch.events {
            assert_eq!(e.kind, EventKind::Put);
            seen.push(e.kv);
        }
    }
    assert_eq!(seen, written);
    // Nothing more (a repeat would show up here).
    let extra = tokio::time::timeout(Duration::from_secs(2), watch.next()).await;
    if let Ok(Some(Ok(batch))) = extra {
        assert!(
            batch.events.is_empty(),
            "repeated events: {:?}",
            batch.events
        );
    }
    assert!(counter(&registry, "tessera_store_retries_total") >= 1.0);
    assert!(counter(&registry, "tessera_store_watch_reconnects_total") >= 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_etcd_is_reported_after_retrying() {
    // A port nothing listens on: on 127.0.0.2, where no test's etcd ever binds.
    let port = std::net::TcpListener::bind("127.0.0.2:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let mut options = EtcdOptions::new(vec![format!("http://127.0.0.2:{port}")]);
    options.retry_for = Duration::from_secs(1);
    let store = EtcdStore::connect(options, StoreMetrics::detached())
        .await
        .expect("connecting is lazy");
    let err = store
        .get(b"/registry/pods/a/b")
        .await
        .expect_err("unreachable");
    assert!(matches!(err, StoreError::Unavailable { .. }), "{err}");
    assert!(
        err.to_string().contains(&port.to_string()),
        "names the endpoint: {err}"
    );
    let err = store
        .watch(b"/registry/pods/", None)
        .await
        .err()
        .expect("unreachable");
    assert!(matches!(err, StoreError::Unavailable { .. }), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_that_could_not_be_sent_go_to_a_member_that_answers() {
    // One member of the two the client knows refuses connections (down, or not started
    // yet): a write the client tried to send there never left, so it is sent again, and
    // every write lands exactly once.
    let etcd = EtcdProcess::start().await.expect("etcd");
    let port = std::net::TcpListener::bind("127.0.0.2:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let registry = Registry::new();
    let metrics = StoreMetrics::register(&registry).expect("metrics");
    let options = EtcdOptions::new(vec![format!("http://127.0.0.2:{port}"), etcd.url()]);
    let store = EtcdStore::connect(options, metrics).await.expect("lazy");
    for i in 0..40 {
        store
            .create(pod(i), Bytes::from_static(b"{}"))
            .await
            .unwrap_or_else(|e| panic!("create {i}: {e}"));
    }
    for i in 40..60 {
        store
            .txn(vec![tessera_store::Op::Put {
                key: pod(i),
                value: Bytes::from_static(b"{}"),
                lease: 0,
            }])
            .await
            .unwrap_or_else(|e| panic!("put {i}: {e}"));
    }
    let listed = store
        .list(tessera_store::ListRequest {
            prefix: Bytes::from_static(b"/registry/pods/"),
            revision: None,
            limit: 0,
            continue_token: None,
        })
        .await
        .expect("list");
    assert_eq!(listed.kvs.len(), 60, "each write once");
    eprintln!(
        "writes sent again after a refused connection: {}",
        counter(&registry, "tessera_store_retries_total")
    );
}
