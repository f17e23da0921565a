//! The conformance suite: one set of behaviours every backend must show, written once against
//! the `Store` trait and run against embedded, etcd and sharded stores.
//!
//! Keys are namespaced (`/registry/pods/<ns>/<name>`) so that a sharded store spreads them
//! over its tenant shards, and `/registry/events/...` reaches an override backend.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;

use super::Harness;
use crate::Store;
use crate::error::{PreconditionKind, StoreError};
use crate::types::{EventKind, ListRequest, Op, OpResult, Revision, WatchBatch, WatchStream};
use crate::validation::MAX_TXN_OPS;

fn b(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

fn pod(ns: &str, name: &str) -> Bytes {
    b(&format!("/registry/pods/{ns}/{name}"))
}

fn kind_of(e: &StoreError) -> Option<&PreconditionKind> {
    e.precondition().map(|p| &p.kind)
}

/// Lists everything under `prefix`, page by page (`limit` per page), at one revision.
pub async fn list_all(
    store: &dyn Store,
    prefix: &str,
    limit: usize,
) -> (Vec<crate::KeyValue>, Revision, usize) {
    let mut req = ListRequest {
        prefix: b(prefix),
        limit,
        ..Default::default()
    };
    let mut out = Vec::new();
    let mut pages = 0;
    let mut revision: Option<Revision> = None;
    loop {
        let page = store.list(req.clone()).await.expect("list page");
        pages += 1;
        if let Some(r) = &revision {
            assert_eq!(
                &page.revision, r,
                "every page is read at the first page's revision"
            );
        }
        revision = Some(page.revision.clone());
        out.extend(page.kvs);
        match page.continue_token {
            Some(t) => req.continue_token = Some(t),
            None => break,
        }
        assert!(pages < 100_000, "pagination does not end");
    }
    (out, revision.expect("at least one page"), pages)
}

/// Create, read, compare-and-swap update and delete of single keys, with the bookkeeping
/// (create revision, mod revision, version) etcd keeps.
pub async fn crud(store: Arc<dyn Store>) {
    let k = pod("ns1", "a");
    let created = store.create(k.clone(), b("v1")).await.expect("create");
    assert_eq!(created.version, 1);
    assert_eq!(created.create_revision, created.mod_revision);
    let got = store.get(&k).await.expect("get").expect("exists");
    assert_eq!(got, created);

    let err = store
        .create(k.clone(), b("again"))
        .await
        .expect_err("create twice");
    assert_eq!(kind_of(&err), Some(&PreconditionKind::AlreadyExists));
    assert_eq!(
        err.precondition().and_then(|p| p.current.clone()),
        Some(created.clone()),
        "a failed precondition carries the current value"
    );

    let updated = store
        .update(k.clone(), b("v2"), created.mod_revision)
        .await
        .expect("update");
    assert_eq!(updated.version, 2);
    assert_eq!(updated.create_revision, created.create_revision);
    assert!(updated.mod_revision > created.mod_revision);

    let stale = store
        .update(k.clone(), b("v3"), created.mod_revision)
        .await
        .expect_err("stale update");
    assert_eq!(
        kind_of(&stale),
        Some(&PreconditionKind::RevisionMismatch {
            expected: created.mod_revision,
            actual: updated.mod_revision
        })
    );
    assert_eq!(
        store.get(&k).await.expect("get").expect("exists").value,
        b("v2")
    );

    let err = store
        .delete(k.clone(), Some(created.mod_revision))
        .await
        .expect_err("stale delete");
    assert!(matches!(
        kind_of(&err),
        Some(PreconditionKind::RevisionMismatch { .. })
    ));
    let prev = store
        .delete(k.clone(), Some(updated.mod_revision))
        .await
        .expect("delete");
    assert_eq!(prev.value, b("v2"));
    assert_eq!(store.get(&k).await.expect("get"), None);
    let err = store
        .delete(k.clone(), None)
        .await
        .expect_err("delete missing");
    assert_eq!(kind_of(&err), Some(&PreconditionKind::NotFound));
    let err = store
        .update(k.clone(), b("x"), updated.mod_revision)
        .await
        .expect_err("update missing");
    assert_eq!(kind_of(&err), Some(&PreconditionKind::NotFound));

    // Re-created: a new life with version 1 and a new create revision.
    let again = store.create(k.clone(), b("v4")).await.expect("re-create");
    assert_eq!(again.version, 1);
    assert!(again.create_revision > created.create_revision);
    let put = store.put(k.clone(), b("v5")).await.expect("put");
    assert_eq!(put.version, 2);
}

/// A transaction commits all of its operations at one revision, or none of them.
pub async fn transactions(store: Arc<dyn Store>) {
    let a = pod("gang", "a");
    let c = pod("gang", "c");
    let existing = store.create(c.clone(), b("c0")).await.expect("create c");
    let before = list_all(&*store, "/registry/pods/gang/", 0).await.0;

    // The last op fails: nothing of the first two may be written.
    let err = store
        .txn(vec![
            Op::Create {
                key: a.clone(),
                value: b("a"),
                lease: 0,
            },
            Op::Put {
                key: pod("gang", "b"),
                value: b("b"),
                lease: 0,
            },
            Op::Update {
                key: c.clone(),
                value: b("c1"),
                expected: existing.mod_revision + 1000,
                lease: 0,
            },
        ])
        .await
        .expect_err("precondition fails");
    let p = err.precondition().expect("a precondition failure");
    assert_eq!(p.index, 2);
    assert_eq!(p.key, c);
    assert_eq!(list_all(&*store, "/registry/pods/gang/", 0).await.0, before);

    // All hold: one revision for all.
    let resp = store
        .txn(vec![
            Op::Create {
                key: a.clone(),
                value: b("a"),
                lease: 0,
            },
            Op::Update {
                key: c.clone(),
                value: b("c1"),
                expected: existing.mod_revision,
                lease: 0,
            },
            Op::Check {
                key: pod("gang", "absent"),
                expected: 0,
            },
        ])
        .await
        .expect("txn");
    assert_eq!(resp.results.len(), 3);
    for r in &resp.results[..2] {
        match r {
            OpResult::Written(kv) => assert_eq!(kv.mod_revision, resp.revision),
            other => panic!("expected a write, got {other:?}"),
        }
    }
    assert_eq!(resp.results[2], OpResult::Checked);

    // A check on a key that changed fails the whole transaction.
    let err = store
        .txn(vec![
            Op::Check {
                key: c.clone(),
                expected: existing.mod_revision,
            },
            Op::Delete {
                key: a.clone(),
                expected: None,
            },
        ])
        .await
        .expect_err("check fails");
    assert_eq!(err.precondition().map(|p| p.index), Some(0));
    assert!(store.get(&a).await.expect("get").is_some());

    // A transaction of checks only writes nothing.
    let rev = store.current_revision().await.expect("rev");
    let resp = store
        .txn(vec![Op::Check {
            key: a.clone(),
            expected: match &resp.results[0] {
                OpResult::Written(kv) => kv.mod_revision,
                _ => 0,
            },
        }])
        .await
        .expect("check only");
    assert_eq!(resp.results, vec![OpResult::Checked]);
    assert_eq!(store.current_revision().await.expect("rev"), rev);
}

/// Bad input gets a clear error and changes nothing.
pub async fn invalid_input(store: Arc<dyn Store>) {
    let rev = store.current_revision().await.expect("rev");
    for bad in ["", "no-slash", "/a//b", "/a/../b", "/a b", "/trailing/"] {
        let e = store.get(bad.as_bytes()).await.expect_err(bad);
        assert!(matches!(e, StoreError::InvalidKey { .. }), "{bad}: {e}");
        let e = store.put(b(bad), b("v")).await.expect_err(bad);
        assert!(e.is_invalid_input(), "{bad}: {e}");
    }
    let e = store
        .put(pod("ns", "big"), Bytes::from(vec![b'x'; 2 << 20]))
        .await
        .expect_err("oversized");
    assert!(matches!(e, StoreError::ValueTooLarge { .. }), "{e}");
    let ops: Vec<Op> = (0..=MAX_TXN_OPS)
        .map(|i| Op::Put {
            key: pod("ns", &format!("k{i}")),
            value: b("v"),
            lease: 0,
        })
        .collect();
    let e = store.txn(ops).await.expect_err("too many ops");
    assert!(matches!(e, StoreError::TooManyOps { .. }), "{e}");
    let e = store.txn(vec![]).await.expect_err("empty");
    assert!(e.is_invalid_input());
    let dup = Op::Put {
        key: pod("ns", "d"),
        value: b("v"),
        lease: 0,
    };
    let e = store
        .txn(vec![dup.clone(), dup])
        .await
        .expect_err("duplicate key");
    assert!(matches!(e, StoreError::InvalidTxn(_)), "{e}");
    let e = store
        .update(pod("ns", "u"), b("v"), 0)
        .await
        .expect_err("update at revision 0");
    assert!(matches!(e, StoreError::InvalidTxn(_)), "{e}");
    let e = store
        .list(ListRequest {
            prefix: b("/registry/pods/"),
            continue_token: Some("not-a-token".into()),
            ..Default::default()
        })
        .await
        .expect_err("bad token");
    assert!(matches!(e, StoreError::InvalidToken { .. }), "{e}");
    assert!("12x".parse::<Revision>().is_err());
    assert!("-1".parse::<Revision>().is_err());
    let e = store.lease_grant(0).await.expect_err("ttl 0");
    assert!(matches!(e, StoreError::InvalidTtl(0)));
    assert_eq!(
        store.current_revision().await.expect("rev"),
        rev,
        "no rejected request changed anything"
    );
}

/// Paged lists: every key once, in order, all pages at one revision, unaffected by writes
/// made between pages; lists at an older revision show the older state.
pub async fn pagination_under_writes(store: Arc<dyn Store>) {
    for ns in 0..5 {
        for i in 0..12 {
            store
                .create(pod(&format!("ns{ns}"), &format!("p{i:02}")), b("0"))
                .await
                .expect("create");
        }
    }
    let first = store
        .list(ListRequest {
            prefix: b("/registry/pods/"),
            limit: 7,
            ..Default::default()
        })
        .await
        .expect("first page");
    assert_eq!(first.kvs.len(), 7);
    let rev = first.revision.clone();
    // Writers change, add and delete keys while the rest of the pages are read.
    let writer = {
        let store = store.clone();
        tokio::spawn(async move {
            for i in 0..40 {
                let ns = format!("ns{}", i % 5);
                store
                    .put(pod(&ns, &format!("p{:02}", i % 12)), b(&format!("w{i}")))
                    .await
                    .expect("put");
                store
                    .create(pod(&ns, &format!("new{i:02}")), b("n"))
                    .await
                    .expect("create");
                if i % 3 == 0 {
                    let _ = store
                        .delete(pod(&ns, &format!("p{:02}", (i + 5) % 12)), None)
                        .await;
                }
            }
        })
    };
    let mut all = first.kvs.clone();
    let mut token = first.continue_token.clone();
    while let Some(t) = token {
        tokio::task::yield_now().await;
        let page = store
            .list(ListRequest {
                prefix: b("/registry/pods/"),
                limit: 7,
                continue_token: Some(t),
                ..Default::default()
            })
            .await
            .expect("page");
        assert_eq!(page.revision, rev);
        all.extend(page.kvs);
        token = page.continue_token;
    }
    writer.await.expect("writer");
    assert_eq!(
        all.len(),
        60,
        "exactly the keys that existed at the first page"
    );
    assert!(
        all.windows(2).all(|w| w[0].key < w[1].key),
        "sorted, no duplicates"
    );
    assert!(
        all.iter().all(|kv| kv.value == b("0")),
        "values as of the first page"
    );
    // The same revision read again, unpaged, agrees.
    let at_rev = store
        .list(ListRequest {
            prefix: b("/registry/pods/"),
            revision: Some(rev),
            ..Default::default()
        })
        .await
        .expect("list at revision");
    assert_eq!(at_rev.kvs, all);
    // And the latest shows the writers' work.
    let (now, _, _) = list_all(&*store, "/registry/pods/", 0).await;
    let new = now
        .iter()
        .filter(|kv| kv.key.windows(4).any(|w| w == b"/new"))
        .count();
    assert_eq!(new, 40);
    assert_ne!(now, all);
}

/// Concurrent compare-and-swap increments of one counter: no update is lost.
pub async fn concurrent_cas_increments(store: Arc<dyn Store>) {
    const TASKS: usize = 8;
    const EACH: usize = 25;
    let key = pod("counters", "c");
    store.create(key.clone(), b("0")).await.expect("create");
    let mut tasks = Vec::new();
    for _ in 0..TASKS {
        let store = store.clone();
        let key = key.clone();
        tasks.push(tokio::spawn(async move {
            let mut conflicts = 0;
            let mut current = store.get(&key).await.expect("get").expect("exists");
            for _ in 0..EACH {
                loop {
                    let n: u64 = std::str::from_utf8(&current.value)
                        .expect("utf8")
                        .parse()
                        .expect("number");
                    match store
                        .update(key.clone(), b(&(n + 1).to_string()), current.mod_revision)
                        .await
                    {
                        Ok(kv) => {
                            current = kv;
                            break;
                        }
                        Err(e) => {
                            let p = e.precondition().expect("only conflicts may fail");
                            conflicts += 1;
                            current = p.current.clone().expect("the counter exists");
                        }
                    }
                }
            }
            conflicts
        }));
    }
    let mut conflicts = 0;
    for t in tasks {
        conflicts += t.await.expect("task");
    }
    let end = store.get(&key).await.expect("get").expect("exists");
    assert_eq!(
        end.value,
        b(&(TASKS * EACH).to_string()),
        "{conflicts} conflicts"
    );
    assert_eq!(end.version as usize, TASKS * EACH + 1);
}

/// Reads a watch until `done` says so (bounded by a generous deadline).
async fn collect(
    stream: &mut WatchStream,
    mut done: impl FnMut(&[WatchBatch]) -> bool,
) -> Vec<WatchBatch> {
    let mut batches = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !done(&batches) {
        let item = tokio::time::timeout_at(deadline, stream.next())
            .await
            .expect("watch delivered everything within 60 s")
            .expect("watch stream ended early")
            .expect("watch error");
        batches.push(item);
    }
    batches
}

fn values_by_key(batches: &[WatchBatch]) -> BTreeMap<Bytes, Vec<(EventKind, Bytes, i64)>> {
    let mut m: BTreeMap<Bytes, Vec<(EventKind, Bytes, i64)>> = BTreeMap::new();
    for batch in batches {
        for e in &batch.events {
            m.entry(e.kv.key.clone()).or_default().push((
                e.kind,
                e.kv.value.clone(),
                e.kv.mod_revision,
            ));
        }
    }
    m
}

/// Watches see every change after their start, in order, exactly once, with previous values,
/// from any revision a watch or list handed out — while writers run concurrently.
pub async fn watch_completeness(store: Arc<dyn Store>) {
    const WRITERS: usize = 4;
    const EACH: usize = 40;
    let start = store.current_revision().await.expect("rev");
    let mut full = store
        .watch(b"/registry/pods/", Some(start.clone()))
        .await
        .expect("watch");
    let mut tasks = Vec::new();
    for w in 0..WRITERS {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let mut written = Vec::new();
            for i in 0..EACH {
                let key = pod(&format!("team{}", (w + i) % 3), &format!("k{}", i % 5));
                let kv = if i % 7 == 6 {
                    match store.delete(key.clone(), None).await {
                        Ok(prev) => {
                            // The deletion's revision is the next write's concern; record it
                            // by reading the revision the delete left behind.
                            (EventKind::Delete, prev)
                        }
                        Err(_) => continue,
                    }
                } else {
                    let kv = store
                        .put(key.clone(), b(&format!("w{w}-{i}")))
                        .await
                        .expect("put");
                    (EventKind::Put, kv)
                };
                written.push(kv);
            }
            written
        }));
    }
    // Noise outside the prefix must not show up.
    store
        .put(b("/registry/nodes/n1"), b("node"))
        .await
        .expect("put node");
    let mut puts: HashMap<Bytes, Vec<(Bytes, i64)>> = HashMap::new();
    let mut deletes = 0usize;
    for t in tasks {
        for (kind, kv) in t.await.expect("writer") {
            match kind {
                EventKind::Put => puts
                    .entry(kv.key.clone())
                    .or_default()
                    .push((kv.value.clone(), kv.mod_revision)),
                EventKind::Delete => deletes += 1,
            }
        }
    }
    let total_puts: usize = puts.values().map(Vec::len).sum();
    let expected_events = total_puts + deletes;
    let batches = collect(&mut full, |bs| {
        bs.iter().map(|b| b.events.len()).sum::<usize>() >= expected_events
    })
    .await;
    let seen = values_by_key(&batches);
    assert_eq!(
        seen.values().map(Vec::len).sum::<usize>(),
        expected_events,
        "exactly once"
    );
    for (key, events) in &seen {
        assert!(key.starts_with(b"/registry/pods/"));
        assert!(
            events.windows(2).all(|w| w[0].2 < w[1].2),
            "per-key order for {key:?}"
        );
        let seen_puts: Vec<(Bytes, i64)> = events
            .iter()
            .filter(|e| e.0 == EventKind::Put)
            .map(|e| (e.1.clone(), e.2))
            .collect();
        let mut want = puts.get(key).cloned().unwrap_or_default();
        want.sort_by_key(|p| p.1);
        assert_eq!(seen_puts, want, "puts of {key:?}");
    }
    // prev_kv: every event but a key's first put carries the value before it.
    for batch in &batches {
        for e in &batch.events {
            if e.kind == EventKind::Delete {
                assert!(e.prev_kv.is_some(), "a delete carries the deleted value");
            }
            if let Some(prev) = &e.prev_kv {
                assert!(prev.mod_revision < e.kv.mod_revision);
                assert_eq!(prev.key, e.kv.key);
            }
        }
    }

    // Resuming from any batch's revision yields exactly what followed that batch.
    let event_batches: Vec<&WatchBatch> = batches.iter().filter(|b| !b.is_progress()).collect();
    for cut in [
        0,
        event_batches.len() / 3,
        event_batches.len() / 2,
        event_batches.len() - 1,
    ] {
        let from = event_batches[cut].revision.clone();
        let rest: Vec<WatchBatch> = event_batches[cut + 1..]
            .iter()
            .map(|b| (*b).clone())
            .collect();
        let want = values_by_key(&rest);
        let want_n: usize = want.values().map(Vec::len).sum();
        let mut resumed = store
            .watch(b"/registry/pods/", Some(from))
            .await
            .expect("resume");
        let got = if want_n == 0 {
            Vec::new()
        } else {
            collect(&mut resumed, |bs| {
                bs.iter().map(|b| b.events.len()).sum::<usize>() >= want_n
            })
            .await
        };
        assert_eq!(values_by_key(&got), want, "resumed after batch {cut}");
    }

    // On a single-backend store every revision is a valid starting point.
    if start.parts().len() == 1 {
        let all: Vec<(Bytes, i64)> = batches
            .iter()
            .flat_map(|b| {
                b.events
                    .iter()
                    .map(|e| (e.kv.key.clone(), e.kv.mod_revision))
            })
            .collect();
        for probe in [all[all.len() / 4].1, all[all.len() / 2].1 - 1] {
            let want: Vec<(Bytes, i64)> = all.iter().filter(|e| e.1 > probe).cloned().collect();
            let mut w = store
                .watch(b"/registry/pods/", Some(Revision::single(probe)))
                .await
                .expect("watch from a revision");
            let got = collect(&mut w, |bs| {
                bs.iter().map(|b| b.events.len()).sum::<usize>() >= want.len()
            })
            .await;
            let got: Vec<(Bytes, i64)> = got
                .iter()
                .flat_map(|b| {
                    b.events
                        .iter()
                        .map(|e| (e.kv.key.clone(), e.kv.mod_revision))
                })
                .collect();
            assert_eq!(got, want, "watch from revision {probe}");
        }
    }
}

/// A quiet watch still learns the current revision through progress notifications, and
/// resuming from one works.
pub async fn progress_notifications(store: Arc<dyn Store>) {
    let mut w = store
        .watch(b"/registry/configmaps/", None)
        .await
        .expect("watch");
    for i in 0..5 {
        store
            .put(pod("busy", &format!("k{i}")), b("v"))
            .await
            .expect("put");
    }
    let after_writes = store.current_revision().await.expect("rev");
    let batches = collect(&mut w, |bs| {
        bs.last().is_some_and(|b| {
            b.is_progress()
                && b.revision
                    .parts()
                    .iter()
                    .zip(after_writes.parts())
                    // A part of 0 is a backend the prefix never touches (sharded stores).
                    .all(|(got, want)| *got == 0 || got >= want)
        })
    })
    .await;
    assert!(
        batches.iter().all(|b| b.events.is_empty()),
        "nothing under the prefix changed"
    );
    let progress = batches.last().expect("a progress batch").revision.clone();
    let mut resumed = store
        .watch(b"/registry/configmaps/", Some(progress))
        .await
        .expect("resume from a progress revision");
    store
        .put(b("/registry/configmaps/ns/cm"), b("v"))
        .await
        .expect("put");
    let got = collect(&mut resumed, |bs| bs.iter().any(|b| !b.events.is_empty())).await;
    let events: Vec<_> = got.iter().flat_map(|b| b.events.iter()).collect();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].kv.key, b("/registry/configmaps/ns/cm"));
}

/// Compaction drops history: reads and watches before it fail with `Compacted`; after it they
/// work; a revision in the future is refused.
pub async fn compaction(store: Arc<dyn Store>) {
    let k = pod("ns", "k");
    store.put(k.clone(), b("1")).await.expect("put");
    let old = store.current_revision().await.expect("rev");
    store.put(k.clone(), b("2")).await.expect("put");
    store.put(pod("ns", "other"), b("x")).await.expect("put");
    let mid = store.current_revision().await.expect("rev");
    store.put(k.clone(), b("3")).await.expect("put");
    store.compact(&mid).await.expect("compact");

    let e = store
        .list(ListRequest {
            prefix: b("/registry/pods/"),
            revision: Some(old.clone()),
            ..Default::default()
        })
        .await
        .expect_err("list before compaction");
    assert!(matches!(e, StoreError::Compacted { .. }), "{e}");
    match store.watch(b"/registry/pods/", Some(old.clone())).await {
        Err(e) => assert!(matches!(e, StoreError::Compacted { .. }), "{e}"),
        Ok(mut w) => {
            let first = tokio::time::timeout(Duration::from_secs(30), w.next())
                .await
                .expect("an answer");
            assert!(
                matches!(first, Some(Err(StoreError::Compacted { .. }))),
                "{first:?}"
            );
        }
    }
    let at_mid = store
        .list(ListRequest {
            prefix: b("/registry/pods/"),
            revision: Some(mid.clone()),
            ..Default::default()
        })
        .await
        .expect("list at the compaction revision");
    let values: Vec<Bytes> = at_mid.kvs.iter().map(|kv| kv.value.clone()).collect();
    assert_eq!(values, vec![b("2"), b("x")]);
    let mut w = store
        .watch(b"/registry/pods/", Some(mid.clone()))
        .await
        .expect("watch from the compaction revision");
    let got = collect(&mut w, |bs| bs.iter().any(|b| !b.events.is_empty())).await;
    let first = got
        .iter()
        .flat_map(|b| b.events.iter())
        .next()
        .expect("event");
    assert_eq!(first.kv.value, b("3"));
    // Compacting again to the same point is refused as already done.
    let e = store.compact(&mid).await.expect_err("compact twice");
    assert!(matches!(e, StoreError::Compacted { .. }), "{e}");
    let future = Revision::composite(
        store
            .current_revision()
            .await
            .expect("rev")
            .parts()
            .iter()
            .map(|r| r + 1000)
            .collect(),
    );
    let e = store
        .list(ListRequest {
            prefix: b("/registry/pods/"),
            revision: Some(future.clone()),
            ..Default::default()
        })
        .await
        .expect_err("future revision");
    assert!(matches!(e, StoreError::FutureRevision { .. }), "{e}");
    let e = store
        .watch(b"/registry/pods/", Some(future))
        .await
        .err()
        .expect("watch from a future revision");
    assert!(matches!(e, StoreError::FutureRevision { .. }), "{e}");
}

/// Leases: keys attached to a lease vanish when it is revoked or expires; keep-alive holds it.
pub async fn leases(store: Arc<dyn Store>) {
    let kept = store.lease_grant(2).await.expect("grant");
    let lapsing = store.lease_grant(2).await.expect("grant");
    let revoked = store.lease_grant(60).await.expect("grant");
    let put = |key: Bytes, lease| Op::Put {
        key,
        value: b("v"),
        lease,
    };
    let r = store
        .txn(vec![put(pod("leases", "kept"), kept)])
        .await
        .expect("put");
    match &r.results[0] {
        OpResult::Written(kv) => assert_eq!(kv.lease, kept),
        other => panic!("{other:?}"),
    }
    store
        .txn(vec![put(pod("leases", "lapsing"), lapsing)])
        .await
        .expect("put");
    store
        .txn(vec![put(b("/registry/events/leases/ev"), lapsing)])
        .await
        .expect("put on another backend");
    store
        .txn(vec![put(pod("leases", "revoked"), revoked)])
        .await
        .expect("put");
    let e = store
        .txn(vec![put(pod("leases", "nolease"), 987_654_321)])
        .await
        .expect_err("unknown lease");
    assert!(matches!(e, StoreError::LeaseNotFound(_)), "{e}");
    assert_eq!(
        store.get(&pod("leases", "nolease")).await.expect("get"),
        None
    );

    let mut w = store
        .watch(b"/registry/pods/leases/", None)
        .await
        .expect("watch");
    store.lease_revoke(revoked).await.expect("revoke");
    assert_eq!(
        store.get(&pod("leases", "revoked")).await.expect("get"),
        None
    );
    let e = store.lease_revoke(revoked).await.expect_err("revoke twice");
    assert!(matches!(e, StoreError::LeaseNotFound(_)), "{e}");

    // Keep one lease alive while the other lapses (bounded: 20 s).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let ttl = store.lease_keep_alive(kept).await.expect("keep alive");
        assert!(ttl > 0);
        let lapsed = store
            .get(&pod("leases", "lapsing"))
            .await
            .expect("get")
            .is_none();
        if lapsed {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "lease did not expire"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert!(
        store
            .get(&pod("leases", "kept"))
            .await
            .expect("get")
            .is_some()
    );
    // The override backend's key went with its lease too (eventually: each backend expires
    // on its own clock).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while store
        .get(b"/registry/events/leases/ev")
        .await
        .expect("get")
        .is_some()
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "event key outlived its lease"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let e = store.lease_keep_alive(lapsing).await.expect_err("expired");
    assert!(matches!(e, StoreError::LeaseNotFound(_)), "{e}");

    let batches = collect(&mut w, |bs| {
        bs.iter()
            .flat_map(|b| b.events.iter())
            .filter(|e| e.kind == EventKind::Delete)
            .count()
            >= 2
    })
    .await;
    let deleted: Vec<Bytes> = batches
        .iter()
        .flat_map(|b| b.events.iter())
        .filter(|e| e.kind == EventKind::Delete)
        .map(|e| e.kv.key.clone())
        .collect();
    assert_eq!(
        deleted,
        vec![pod("leases", "revoked"), pod("leases", "lapsing")]
    );
    store.lease_revoke(kept).await.expect("revoke");
}

/// A restart (process kill for etcd, reopen for embedded) loses no acknowledged write, and
/// revisions keep growing.
pub async fn restart_loses_nothing(harness: &mut dyn Harness) {
    let store = harness.store();
    let mut written = Vec::new();
    for i in 0..200 {
        let kv = store
            .put(
                pod(&format!("r{}", i % 7), &format!("k{i}")),
                b(&format!("v{i}")),
            )
            .await
            .expect("put");
        written.push(kv);
    }
    for kv in written.iter().step_by(3) {
        store
            .delete(kv.key.clone(), Some(kv.mod_revision))
            .await
            .expect("delete");
    }
    let before = list_all(&*store, "/registry/pods/", 50).await;
    let rev_before = store.current_revision().await.expect("rev");
    drop(store);
    harness.restart().await;
    let store = harness.store();
    let after = list_all(&*store, "/registry/pods/", 50).await;
    assert_eq!(after.0, before.0, "every acknowledged write survived");
    assert_eq!(after.0.len(), 200 - 67);
    let rev_after = store.current_revision().await.expect("rev");
    assert_eq!(rev_after, rev_before);
    let kv = store
        .put(pod("r0", "new"), b("n"))
        .await
        .expect("write after restart");
    assert!(kv.mod_revision > 0);
    // History from before the restart is still there for watches.
    let mut w = store
        .watch(b"/registry/pods/", Some(before.1.clone()))
        .await
        .expect("watch from before the restart");
    let got = collect(&mut w, |bs| bs.iter().any(|b| !b.events.is_empty())).await;
    let ev = got
        .iter()
        .flat_map(|b| b.events.iter())
        .next()
        .expect("event");
    assert_eq!(ev.kv.key, pod("r0", "new"));
}

/// Random operation sequences give the same results as a simple in-memory model.
pub async fn matches_model(store: Arc<dyn Store>, cases: u32) {
    super::model::check(store, cases).await;
}
