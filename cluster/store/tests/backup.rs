//! Backups of the embedded store: taken while it serves, verified, and restored into a new
//! directory that opens as the store was at the backup's revision.

use bytes::Bytes;
use tessera_store::embedded::{restore_backup, verify_backup};
use tessera_store::metrics::StoreMetrics;
use tessera_store::testing::test_embedded_options;
use tessera_store::{EmbeddedStore, Store};

async fn open(dir: &std::path::Path) -> EmbeddedStore {
    EmbeddedStore::open(dir, test_embedded_options(), StoreMetrics::detached())
        .await
        .expect("open")
}

fn key(i: usize) -> Bytes {
    Bytes::from(format!("/registry/configmaps/ns/k{i:03}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_restores_the_store_as_of_its_revision() {
    let live = tempfile::tempdir().expect("tempdir");
    let store = open(live.path()).await;
    for i in 0..50 {
        store
            .create(key(i), Bytes::from(format!("v{i}")))
            .await
            .expect("create");
    }
    store.delete(key(7), None).await.expect("delete");
    let out = tempfile::tempdir().expect("tempdir");
    let file = out.path().join("shard.backup");
    let taken = store.backup(&file).await.expect("backup");
    assert_eq!(taken.keys, 49);
    assert_eq!(
        taken.revision, 52,
        "revision 1 (a new store, as etcd) + 50 creates + a delete"
    );
    // Written after the backup: not in it.
    store
        .create(key(99), Bytes::from_static(b"late"))
        .await
        .expect("create");
    assert_eq!(verify_backup(&file).expect("verify"), taken);

    let restored = tempfile::tempdir().expect("tempdir");
    let dir = restored.path().join("store");
    assert_eq!(restore_backup(&file, &dir).expect("restore"), taken);
    let back = open(&dir).await;
    assert_eq!(back.len(), 49);
    let kv = back.get(&key(3)).await.expect("get").expect("k003");
    assert_eq!(kv.value, Bytes::from_static(b"v3"));
    assert!(
        back.get(&key(7)).await.expect("get").is_none(),
        "deleted before"
    );
    assert!(
        back.get(&key(99)).await.expect("get").is_none(),
        "written after"
    );
    // It goes on from there: new writes get the revisions after the backup's.
    let next = back
        .create(key(100), Bytes::from_static(b"new"))
        .await
        .expect("create");
    assert_eq!(next.mod_revision, 53);
    back.close().await.expect("close");
    let again = open(&dir).await;
    assert_eq!(
        again.len(),
        50,
        "the restored store and its new write survive a restart"
    );

    // A store directory is never overwritten.
    let err = restore_backup(&file, &dir)
        .expect_err("a store is there")
        .to_string();
    assert!(err.contains("holds a store already"), "{err}");
    // A damaged file is refused, naming it.
    let mut bytes = std::fs::read(&file).expect("read");
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    let bad = out.path().join("bad.backup");
    std::fs::write(&bad, &bytes).expect("write");
    let err = verify_backup(&bad).expect_err("damaged").to_string();
    assert!(
        err.contains("checksum mismatch") && err.contains("bad.backup"),
        "{err}"
    );
    let err = restore_backup(&bad, &restored.path().join("other"))
        .expect_err("damaged")
        .to_string();
    assert!(err.contains("checksum mismatch"), "{err}");
}
