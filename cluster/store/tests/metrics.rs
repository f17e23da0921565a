//! Store metrics are recorded for every backend through `Instrumented`, into a registry the
//! caller reads; the compactor keeps history bounded.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use prometheus::Registry;
use tessera_store::testing::test_embedded_options;
use tessera_store::{
    EmbeddedStore, Instrumented, ListRequest, Revision, Store, StoreError, StoreMetrics, compactor,
};

fn sample_count(registry: &Registry, name: &str, labels: &[(&str, &str)]) -> u64 {
    registry
        .gather()
        .iter()
        .filter(|f| f.name() == name)
        .flat_map(|f| f.get_metric().iter())
        .filter(|m| {
            labels.iter().all(|(k, v)| {
                m.get_label()
                    .iter()
                    .any(|l| l.name() == *k && l.value() == *v)
            })
        })
        .map(|m| {
            if m.get_histogram().get_sample_count() > 0 {
                m.get_histogram().get_sample_count()
            } else {
                m.get_counter().get_value() as u64
            }
        })
        .sum()
}

async fn instrumented() -> (tempfile::TempDir, Registry, Arc<dyn Store>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let registry = Registry::new();
    let metrics = StoreMetrics::register(&registry).expect("register");
    let inner = EmbeddedStore::open(dir.path(), test_embedded_options(), metrics.clone())
        .await
        .expect("open");
    let store: Arc<dyn Store> = Arc::new(Instrumented::new(Arc::new(inner), metrics));
    (dir, registry, store)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_are_counted_by_backend_op_and_result() {
    let (_dir, registry, store) = instrumented().await;
    let key = Bytes::from_static(b"/registry/pods/ns/a");
    store
        .create(key.clone(), Bytes::from_static(b"1"))
        .await
        .expect("create");
    let err = store
        .create(key.clone(), Bytes::from_static(b"2"))
        .await
        .expect_err("exists");
    assert!(err.precondition().is_some());
    store.get(&key).await.expect("get");
    let watch = store.watch(b"/registry/pods/", None).await.expect("watch");
    let gauge = |registry: &Registry| -> i64 {
        registry
            .gather()
            .iter()
            .filter(|f| f.name() == "tessera_store_watchers")
            .flat_map(|f| {
                f.get_metric()
                    .iter()
                    .map(|m| m.get_gauge().get_value() as i64)
            })
            .sum()
    };
    assert_eq!(gauge(&registry), 1, "an open watch is counted");
    drop(watch);
    assert_eq!(gauge(&registry), 0, "and uncounted when dropped");
    let _ = store.get(b"bad key").await.expect_err("invalid");
    store
        .list(ListRequest {
            prefix: Bytes::from_static(b"/registry/pods/"),
            ..Default::default()
        })
        .await
        .expect("list");

    let duration = "tessera_store_request_duration_seconds";
    assert_eq!(
        sample_count(
            &registry,
            duration,
            &[("backend", "embedded"), ("op", "txn")]
        ),
        2
    );
    assert_eq!(sample_count(&registry, duration, &[("op", "get")]), 2);
    assert_eq!(sample_count(&registry, duration, &[("op", "list")]), 1);
    let total = "tessera_store_requests_total";
    assert_eq!(
        sample_count(&registry, total, &[("op", "txn"), ("result", "ok")]),
        1
    );
    assert_eq!(
        sample_count(
            &registry,
            total,
            &[("op", "txn"), ("result", "precondition_failed")]
        ),
        1
    );
    assert_eq!(
        sample_count(&registry, total, &[("op", "get"), ("result", "invalid")]),
        1
    );
    // The embedded backend's own metrics: one flush per group commit.
    assert!(
        sample_count(
            &registry,
            "tessera_store_embedded_fsync_duration_seconds",
            &[]
        ) >= 1
    );
    assert!(sample_count(&registry, "tessera_store_embedded_commit_batch_size", &[]) >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_compactor_drops_history_older_than_one_interval() {
    let (_dir, _registry, store) = instrumented().await;
    let key = Bytes::from_static(b"/registry/pods/ns/c");
    store
        .put(key.clone(), Bytes::from_static(b"0"))
        .await
        .expect("put");
    let old: Revision = store.current_revision().await.expect("rev");
    tokio::spawn(compactor::run(store.clone(), Duration::from_millis(200)));
    // Keep writing; within a few intervals the old revision must be gone (bounded: 20 s).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let mut i = 0u32;
    loop {
        i += 1;
        store
            .put(key.clone(), Bytes::from(i.to_string()))
            .await
            .expect("put");
        let at_old = store
            .list(ListRequest {
                prefix: Bytes::from_static(b"/registry/pods/"),
                revision: Some(old.clone()),
                ..Default::default()
            })
            .await;
        if matches!(at_old, Err(StoreError::Compacted { .. })) {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "never compacted");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The latest state is untouched.
    let now = store.get(&key).await.expect("get").expect("exists");
    assert_eq!(now.value, Bytes::from(i.to_string()));
}
