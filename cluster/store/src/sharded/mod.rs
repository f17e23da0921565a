//! The sharded backend: one logical store over several backends, so that no single etcd
//! carries a whole shard. Keys are routed by resource and by tenant (`routing`); a list or
//! watch that spans backends merges them, and its revision is a composite with one part per
//! backend that resumes every part.
//!
//! A transaction must stay within one backend (the keys of one namespace always do). Leases
//! are granted in every backend at once, so that any key can use one; their mapping lives in
//! memory, so after a restart callers grant new leases (etcd's lease-reuse pattern does).

mod config;
mod routing;

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use futures::StreamExt;
use parking_lot::Mutex;

pub use config::ShardingConfig;
pub use routing::resource_segment;
use routing::{Parts, Router};

use crate::Store;
use crate::continuation::Cursor;
use crate::error::{Result, StoreError};
use crate::types::{
    KeyValue, LeaseId, ListRequest, ListResponse, Op, Revision, TxnResponse, WatchBatch,
    WatchStream,
};
use crate::validation::{check_key, check_prefix, check_ttl, check_txn};

/// A store over several backends.
pub struct ShardedStore {
    parts: Vec<Arc<dyn Store>>,
    router: Router,
    leases: Mutex<HashMap<LeaseId, Vec<LeaseId>>>,
}

impl ShardedStore {
    /// Builds the store. Keys live under `root` (Kubernetes' `/registry/`); `overrides` pairs
    /// a resource key segment with its backend; `tenants` are the tenant shards.
    pub fn new(
        root: &str,
        default: Arc<dyn Store>,
        overrides: Vec<(String, Arc<dyn Store>)>,
        tenants: Vec<Arc<dyn Store>>,
    ) -> ShardedStore {
        let names: Vec<String> = overrides.iter().map(|(n, _)| n.clone()).collect();
        let router = Router::new(root, &names, tenants.len());
        let mut parts = vec![default];
        parts.extend(overrides.into_iter().map(|(_, s)| s));
        parts.extend(tenants);
        ShardedStore {
            parts,
            router,
            leases: Mutex::new(HashMap::new()),
        }
    }

    /// Number of backends (the number of parts of its revisions).
    pub fn part_count(&self) -> usize {
        self.parts.len()
    }

    /// The backend index a key is routed to.
    pub fn part_of(&self, key: &[u8]) -> usize {
        self.router.route_key(key)
    }

    fn composite(&self, rev: &Revision) -> Result<Vec<i64>> {
        let parts = rev.parts();
        if parts.len() != self.parts.len() {
            return Err(StoreError::InvalidToken {
                what: "revision",
                reason: format!(
                    "{rev} has {} parts but this store has {} backends",
                    parts.len(),
                    self.parts.len()
                ),
            });
        }
        Ok(parts.to_vec())
    }

    fn part_lease(&self, lease: LeaseId, part: usize) -> Result<LeaseId> {
        if lease == 0 {
            return Ok(0);
        }
        self.leases
            .lock()
            .get(&lease)
            .map(|ids| ids[part])
            .ok_or(StoreError::LeaseNotFound(lease))
    }
}

fn rewrite_lease(op: Op, lease: LeaseId) -> Op {
    match op {
        Op::Create { key, value, .. } => Op::Create { key, value, lease },
        Op::Update {
            key,
            value,
            expected,
            ..
        } => Op::Update {
            key,
            value,
            expected,
            lease,
        },
        Op::Put { key, value, .. } => Op::Put { key, value, lease },
        other => other,
    }
}

#[async_trait]
impl Store for ShardedStore {
    fn backend(&self) -> &'static str {
        "sharded"
    }

    fn txn_group(&self, key: &[u8]) -> usize {
        self.router.route_key(key)
    }

    async fn get(&self, key: &[u8]) -> Result<Option<KeyValue>> {
        check_key(key)?;
        self.parts[self.router.route_key(key)].get(key).await
    }

    async fn list(&self, req: ListRequest) -> Result<ListResponse> {
        let cursor = Cursor::from_request(&req)?;
        check_prefix(&cursor.prefix)?;
        let involved = self.router.route_prefix(&cursor.prefix).indexes();
        let mut revs = match &cursor.revision {
            Some(r) => self.composite(r)?,
            None => vec![0; self.parts.len()],
        };
        if cursor.revision.is_some()
            && let Some(&i) = involved.iter().find(|&&i| revs[i] == 0)
        {
            return Err(StoreError::InvalidToken {
                what: "revision",
                reason: format!(
                    "{} does not cover backend {i}; list at a revision returned by a list of the same prefix",
                    Revision::composite(revs.clone())
                ),
            });
        }
        let pages = futures::future::try_join_all(involved.iter().map(|&i| {
            // A first page without a revision reads each part's latest state; later pages
            // (and lists at a revision) continue each part at its own revision.
            let continue_token =
                (revs[i] != 0).then(|| cursor.token_at(&Revision::single(revs[i]), &cursor.start));
            let part_req = ListRequest {
                prefix: cursor.prefix.clone(),
                revision: None,
                limit: req.limit,
                continue_token,
            };
            let store = self.parts[i].clone();
            async move { store.list(part_req).await.map(|page| (i, page)) }
        }))
        .await?;
        let mut more = false;
        let mut kvs = Vec::new();
        for (i, page) in pages {
            revs[i] = page.revision.expect_single()?;
            more |= page.continue_token.is_some();
            kvs.extend(page.kvs);
        }
        kvs.sort_unstable_by(|a, b| a.key.cmp(&b.key));
        if req.limit > 0 && kvs.len() > req.limit {
            kvs.truncate(req.limit);
            more = true;
        }
        Ok(cursor.page(kvs, Revision::composite(revs), more))
    }

    async fn txn(&self, ops: Vec<Op>) -> Result<TxnResponse> {
        check_txn(&ops)?;
        let part = self.router.route_key(ops[0].key());
        if let Some(other) = ops
            .iter()
            .find(|op| self.router.route_key(op.key()) != part)
        {
            return Err(StoreError::CrossShardTxn(format!(
                "{:?} and {:?}",
                String::from_utf8_lossy(ops[0].key()),
                String::from_utf8_lossy(other.key())
            )));
        }
        let mut translated = Vec::with_capacity(ops.len());
        let mut leases = Vec::with_capacity(ops.len());
        for op in ops {
            let lease = op.lease();
            leases.push(lease);
            let part_lease = self.part_lease(lease, part)?;
            translated.push(rewrite_lease(op, part_lease));
        }
        let mut resp = self.parts[part].txn(translated).await?;
        // Hand back the sharded lease ids, not the backend's.
        for (result, lease) in resp.results.iter_mut().zip(leases) {
            if let crate::types::OpResult::Written(kv) = result {
                kv.lease = lease;
            }
        }
        Ok(resp)
    }

    async fn watch(&self, prefix: &[u8], after: Option<Revision>) -> Result<WatchStream> {
        check_prefix(prefix)?;
        let involved = match self.router.route_prefix(prefix) {
            Parts::One(i) => vec![i],
            Parts::Many(v) => v,
        };
        // Fix every involved part's starting point first, so that the composite position a
        // batch carries never runs ahead of events still to come from another part.
        let mut position = match after {
            Some(r) => self.composite(&r)?,
            None => {
                let mut v = vec![0; self.parts.len()];
                for &i in &involved {
                    v[i] = self.parts[i].current_revision().await?.expect_single()?;
                }
                v
            }
        };
        let mut streams = Vec::with_capacity(involved.len());
        for &i in &involved {
            if position[i] == 0 {
                return Err(StoreError::InvalidToken {
                    what: "revision",
                    reason: format!(
                        "{} does not cover backend {i}; watch from a revision returned by a list of the same prefix",
                        Revision::composite(position.clone())
                    ),
                });
            }
            let stream = self.parts[i]
                .watch(prefix, Some(Revision::single(position[i])))
                .await?;
            streams.push(stream.map(move |item| (i, item)).boxed());
        }
        let merged = futures::stream::select_all(streams).map(move |(i, item)| {
            let batch = item?;
            position[i] = batch.revision.expect_single()?;
            Ok(WatchBatch {
                events: batch.events,
                revision: Revision::composite(position.clone()),
            })
        });
        // End the merged stream after the first error, as a single backend's does.
        let mut failed = false;
        let merged = merged.take_while(move |item: &Result<WatchBatch>| {
            let go = !failed;
            failed |= item.is_err();
            futures::future::ready(go)
        });
        Ok(Box::pin(merged))
    }

    async fn lease_grant(&self, ttl: i64) -> Result<LeaseId> {
        check_ttl(ttl)?;
        let ids =
            futures::future::try_join_all(self.parts.iter().map(|p| p.lease_grant(ttl))).await?;
        let id = ids[0];
        self.leases.lock().insert(id, ids);
        Ok(id)
    }

    async fn lease_keep_alive(&self, id: LeaseId) -> Result<i64> {
        let ids = self
            .leases
            .lock()
            .get(&id)
            .cloned()
            .ok_or(StoreError::LeaseNotFound(id))?;
        let ttls = futures::future::join_all(
            self.parts
                .iter()
                .zip(ids)
                .map(|(p, part_id)| p.lease_keep_alive(part_id)),
        )
        .await;
        let mut min = i64::MAX;
        for ttl in ttls {
            match ttl {
                Ok(t) => min = min.min(t),
                Err(StoreError::LeaseNotFound(_)) => {
                    // Expired in one backend: expire it everywhere.
                    let _ = self.lease_revoke(id).await;
                    return Err(StoreError::LeaseNotFound(id));
                }
                Err(e) => return Err(e),
            }
        }
        Ok(min)
    }

    async fn lease_revoke(&self, id: LeaseId) -> Result<()> {
        let ids = self
            .leases
            .lock()
            .remove(&id)
            .ok_or(StoreError::LeaseNotFound(id))?;
        let results = futures::future::join_all(
            self.parts
                .iter()
                .zip(ids)
                .map(|(p, part)| p.lease_revoke(part)),
        )
        .await;
        for r in results {
            match r {
                Ok(()) | Err(StoreError::LeaseNotFound(_)) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    async fn compact(&self, revision: &Revision) -> Result<()> {
        let revs = self.composite(revision)?;
        let mut first_err = None;
        for (part, rev) in self.parts.iter().zip(revs) {
            if rev == 0 {
                continue;
            }
            match part.compact(&Revision::single(rev)).await {
                Ok(()) => {}
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    async fn current_revision(&self) -> Result<Revision> {
        let revs =
            futures::future::try_join_all(self.parts.iter().map(|p| p.current_revision())).await?;
        let parts = revs
            .iter()
            .map(Revision::expect_single)
            .collect::<Result<Vec<_>>>()?;
        Ok(Revision::composite(parts))
    }
}
