//! The embedded store's in-memory multi-version state: every retained version of every key,
//! the event log that watches read, and the lease table. Pure data, no I/O: the committer
//! feeds it records (after they are durable) and readers query it under a read lock.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::ops::Bound;
use std::sync::Arc;

use bytes::Bytes;

use crate::error::{Result, StoreError};
use crate::types::{EventKind, KeyValue, LeaseId, WatchEvent};
use crate::validation::prefix_end;

/// A change to one key, as the log records it: preconditions already resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Mutation {
    /// Write a value.
    Put {
        key: Bytes,
        value: Bytes,
        lease: LeaseId,
    },
    /// Delete a key that exists.
    Delete { key: Bytes },
}

/// One durable state change; the WAL is a sequence of these.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Record {
    /// The mutations of one transaction, all at `revision`.
    Txn {
        revision: i64,
        mutations: Vec<Mutation>,
    },
    /// A lease was granted.
    LeaseGrant { id: LeaseId, ttl: i64 },
    /// A lease was revoked or expired; its keys are deleted at the next revision.
    LeaseRevoke { id: LeaseId },
    /// History before `revision` was dropped.
    Compact { revision: i64 },
}

/// One retained version of a key. `sub` orders the changes within one revision.
#[derive(Clone, Debug)]
pub(crate) struct Version {
    pub kv: KeyValue,
    pub sub: u32,
    pub tombstone: bool,
}

/// A granted lease.
#[derive(Clone, Debug, Default)]
pub(crate) struct Lease {
    pub ttl: i64,
    pub keys: BTreeSet<Bytes>,
}

struct LogEntry {
    revision: i64,
    event: WatchEvent,
}

/// The whole multi-version state.
/// Each key's retained versions, shared copy-on-write so that a snapshot can take the whole
/// map in one cheap clone (one reference count per key) while writes go on.
pub(crate) type History = Arc<Vec<Version>>;

pub(crate) struct Mvcc {
    keys: BTreeMap<Bytes, History>,
    log: VecDeque<LogEntry>,
    revision: i64,
    compacted: i64,
    live: usize,
    pub(crate) leases: HashMap<LeaseId, Lease>,
}

/// The first revision of an empty store, as in etcd.
pub(crate) const INITIAL_REVISION: i64 = 1;

impl Mvcc {
    pub fn new() -> Self {
        Mvcc {
            keys: BTreeMap::new(),
            log: VecDeque::new(),
            revision: INITIAL_REVISION,
            compacted: 0,
            live: 0,
            leases: HashMap::new(),
        }
    }

    /// Rebuilds state from a snapshot's parts.
    pub fn from_parts(
        keys: BTreeMap<Bytes, History>,
        revision: i64,
        compacted: i64,
        leases: HashMap<LeaseId, i64>,
    ) -> Self {
        let mut mvcc = Mvcc {
            keys,
            log: VecDeque::new(),
            revision,
            compacted,
            live: 0,
            leases: leases
                .into_iter()
                .map(|(id, ttl)| {
                    (
                        id,
                        Lease {
                            ttl,
                            keys: BTreeSet::new(),
                        },
                    )
                })
                .collect(),
        };
        let mut entries: Vec<(i64, u32, LogEntry)> = Vec::new();
        for (key, versions) in &mvcc.keys {
            if let Some(last) = versions.last()
                && !last.tombstone
            {
                mvcc.live += 1;
                if last.kv.lease != 0
                    && let Some(lease) = mvcc.leases.get_mut(&last.kv.lease)
                {
                    lease.keys.insert(key.clone());
                }
            }
            for (i, v) in versions.iter().enumerate() {
                if v.kv.mod_revision <= compacted {
                    continue;
                }
                let prev_kv = i
                    .checked_sub(1)
                    .map(|p| &versions[p])
                    .filter(|p| !p.tombstone)
                    .map(|p| p.kv.clone());
                let kind = if v.tombstone {
                    EventKind::Delete
                } else {
                    EventKind::Put
                };
                entries.push((
                    v.kv.mod_revision,
                    v.sub,
                    LogEntry {
                        revision: v.kv.mod_revision,
                        event: WatchEvent {
                            kind,
                            kv: v.kv.clone(),
                            prev_kv,
                        },
                    },
                ));
            }
        }
        entries.sort_by_key(|(rev, sub, _)| (*rev, *sub));
        mvcc.log = entries.into_iter().map(|(_, _, e)| e).collect();
        mvcc
    }

    pub fn revision(&self) -> i64 {
        self.revision
    }

    pub fn compacted(&self) -> i64 {
        self.compacted
    }

    /// Number of keys that exist now.
    pub fn live_keys(&self) -> usize {
        self.live
    }

    /// Every key with its retained versions (for snapshots).
    pub fn keys(&self) -> &BTreeMap<Bytes, History> {
        &self.keys
    }

    /// The key's current value.
    pub fn latest(&self, key: &[u8]) -> Option<&KeyValue> {
        let v = self.keys.get(key)?.last()?;
        (!v.tombstone).then_some(&v.kv)
    }

    /// Checks that `revision` can be read: not compacted and not in the future.
    pub fn check_read_revision(&self, revision: i64) -> Result<()> {
        if revision < self.compacted {
            return Err(StoreError::Compacted {
                requested: revision,
                compacted: self.compacted,
            });
        }
        if revision > self.revision {
            return Err(StoreError::FutureRevision {
                requested: revision,
                current: self.revision,
            });
        }
        Ok(())
    }

    /// Keys under `prefix` from `start` (inclusive) as of `revision`, at most `limit` (0: all).
    /// Returns the page and whether more keys follow.
    pub fn list(
        &self,
        prefix: &[u8],
        start: &[u8],
        revision: i64,
        limit: usize,
    ) -> (Vec<KeyValue>, bool) {
        let end = match prefix_end(prefix) {
            Some(end) => Bound::Excluded(end),
            None => Bound::Unbounded,
        };
        let start = if start < prefix { prefix } else { start };
        let range = self
            .keys
            .range::<[u8], _>((Bound::Included(start), end.as_ref().map(|e| e.as_slice())));
        // Most lists are short (a namespace's quotas, often none): no room taken up front.
        let mut out = Vec::with_capacity(limit.min(4096));
        for (_, versions) in range {
            let Some(v) = visible_at(versions, revision) else {
                continue;
            };
            if limit != 0 && out.len() == limit {
                return (out, true);
            }
            out.push(v.clone());
        }
        (out, false)
    }

    /// Events under `prefix` after revision `after`, whole revisions only, stopping once at
    /// least `max` are collected. Returns them with the revision they bring the reader to.
    pub fn events_after(
        &self,
        prefix: &[u8],
        after: i64,
        max: usize,
    ) -> Result<(Vec<WatchEvent>, i64)> {
        if after < self.compacted {
            return Err(StoreError::Compacted {
                requested: after,
                compacted: self.compacted,
            });
        }
        let start = self.log.partition_point(|e| e.revision <= after);
        let mut out = Vec::new();
        let mut position = self.revision.max(after);
        for entry in self.log.range(start..) {
            if out.len() >= max && entry.revision != position {
                return Ok((out, position));
            }
            position = entry.revision;
            if entry.event.kv.key.starts_with(prefix) {
                out.push(entry.event.clone());
            }
        }
        Ok((out, self.revision.max(after)))
    }

    /// Applies one durable record.
    pub fn apply(&mut self, record: &Record) {
        match record {
            Record::Txn {
                revision,
                mutations,
            } => self.apply_mutations(*revision, mutations.iter().cloned()),
            Record::LeaseGrant { id, ttl } => {
                self.leases.insert(
                    *id,
                    Lease {
                        ttl: *ttl,
                        keys: BTreeSet::new(),
                    },
                );
            }
            Record::LeaseRevoke { id } => {
                if let Some(lease) = self.leases.remove(id)
                    && !lease.keys.is_empty()
                {
                    let revision = self.revision + 1;
                    let deletes = lease.keys.into_iter().map(|key| Mutation::Delete { key });
                    self.apply_mutations(revision, deletes);
                }
            }
            Record::Compact { revision } => self.compact(*revision),
        }
    }

    fn apply_mutations(&mut self, revision: i64, mutations: impl Iterator<Item = Mutation>) {
        for (sub, m) in mutations.enumerate() {
            let sub = sub as u32;
            match m {
                Mutation::Put { key, value, lease } => {
                    let versions = Arc::make_mut(self.keys.entry(key.clone()).or_default());
                    let prev = versions
                        .last()
                        .filter(|v| !v.tombstone)
                        .map(|v| v.kv.clone());
                    let kv = KeyValue {
                        key: key.clone(),
                        value,
                        create_revision: prev.as_ref().map_or(revision, |p| p.create_revision),
                        mod_revision: revision,
                        version: prev.as_ref().map_or(1, |p| p.version + 1),
                        lease,
                    };
                    versions.push(Version {
                        kv: kv.clone(),
                        sub,
                        tombstone: false,
                    });
                    match &prev {
                        None => self.live += 1,
                        Some(p) if p.lease != 0 && p.lease != lease => {
                            if let Some(l) = self.leases.get_mut(&p.lease) {
                                l.keys.remove(&key);
                            }
                        }
                        Some(_) => {}
                    }
                    if lease != 0
                        && let Some(l) = self.leases.get_mut(&lease)
                    {
                        l.keys.insert(key);
                    }
                    self.log.push_back(LogEntry {
                        revision,
                        event: WatchEvent {
                            kind: EventKind::Put,
                            kv,
                            prev_kv: prev,
                        },
                    });
                }
                Mutation::Delete { key } => {
                    let versions = Arc::make_mut(self.keys.entry(key.clone()).or_default());
                    let Some(prev) = versions
                        .last()
                        .filter(|v| !v.tombstone)
                        .map(|v| v.kv.clone())
                    else {
                        continue;
                    };
                    let kv = KeyValue {
                        key: key.clone(),
                        value: Bytes::new(),
                        create_revision: 0,
                        mod_revision: revision,
                        version: 0,
                        lease: 0,
                    };
                    versions.push(Version {
                        kv: kv.clone(),
                        sub,
                        tombstone: true,
                    });
                    self.live -= 1;
                    if prev.lease != 0
                        && let Some(l) = self.leases.get_mut(&prev.lease)
                    {
                        l.keys.remove(&key);
                    }
                    self.log.push_back(LogEntry {
                        revision,
                        event: WatchEvent {
                            kind: EventKind::Delete,
                            kv,
                            prev_kv: Some(prev),
                        },
                    });
                }
            }
        }
        self.revision = revision;
    }

    /// Drops history before `revision`: reads at or after it still work, watches after it
    /// still work. Cost is proportional to the changes dropped, not to the number of keys.
    fn compact(&mut self, revision: i64) {
        if revision <= self.compacted {
            return;
        }
        let revision = revision.min(self.revision);
        let end = self.log.partition_point(|e| e.revision <= revision);
        let mut touched: Vec<Bytes> = self.log.drain(..end).map(|e| e.event.kv.key).collect();
        touched.sort_unstable();
        touched.dedup();
        for key in touched {
            let Some(history) = self.keys.get_mut(&key) else {
                continue;
            };
            let versions = Arc::make_mut(history);
            let visible = versions.partition_point(|v| v.kv.mod_revision <= revision);
            if visible == 0 {
                continue;
            }
            let mut keep_from = visible - 1;
            if versions[keep_from].tombstone {
                keep_from += 1;
            }
            versions.drain(..keep_from);
            if versions.is_empty() {
                self.keys.remove(&key);
            }
        }
        self.compacted = revision;
    }
}

fn visible_at(versions: &[Version], revision: i64) -> Option<&KeyValue> {
    let idx = versions.partition_point(|v| v.kv.mod_revision <= revision);
    let v = versions.get(idx.checked_sub(1)?)?;
    (!v.tombstone).then_some(&v.kv)
}

/// A put without a lease, for tests.
#[cfg(test)]
pub(crate) fn put(k: &str, v: &str) -> Mutation {
    Mutation::Put {
        key: Bytes::from(k.to_owned()),
        value: Bytes::from(v.to_owned()),
        lease: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_and_compaction() {
        let mut m = Mvcc::new();
        m.apply(&Record::Txn {
            revision: 2,
            mutations: vec![put("/a", "1"), put("/b", "1")],
        });
        m.apply(&Record::Txn {
            revision: 3,
            mutations: vec![put("/a", "2")],
        });
        m.apply(&Record::Txn {
            revision: 4,
            mutations: vec![Mutation::Delete {
                key: Bytes::from_static(b"/b"),
            }],
        });
        assert_eq!(m.latest(b"/a").map(|kv| kv.version), Some(2));
        assert_eq!(m.latest(b"/b"), None);
        assert_eq!(m.list(b"/", b"/", 2, 0).0.len(), 2);
        assert_eq!(m.list(b"/", b"/", 4, 0).0.len(), 1);
        let (events, pos) = m.events_after(b"/", 2, 100).expect("events");
        assert_eq!(events.len(), 2);
        assert_eq!(pos, 4);

        m.apply(&Record::Compact { revision: 3 });
        assert!(m.check_read_revision(2).is_err());
        assert_eq!(m.list(b"/", b"/", 3, 0).0.len(), 2);
        assert!(m.events_after(b"/", 2, 100).is_err());
        assert_eq!(m.events_after(b"/", 3, 100).expect("events").0.len(), 1);
        // The tombstone of /b is kept until a compaction passes it.
        m.apply(&Record::Compact { revision: 4 });
        assert!(!m.keys().contains_key(&b"/b"[..]));
        assert_eq!(m.keys()[&b"/a"[..]].len(), 1);
    }

    #[test]
    fn batches_end_on_revision_boundaries() {
        let mut m = Mvcc::new();
        m.apply(&Record::Txn {
            revision: 2,
            mutations: vec![put("/a", "1"), put("/b", "1"), put("/c", "1")],
        });
        m.apply(&Record::Txn {
            revision: 3,
            mutations: vec![put("/a", "2")],
        });
        let (events, pos) = m.events_after(b"/", 1, 1).expect("events");
        assert_eq!(events.len(), 3, "a revision is never split");
        assert_eq!(pos, 2);
    }

    #[test]
    fn lease_revoke_deletes_attached_keys() {
        let mut m = Mvcc::new();
        m.apply(&Record::LeaseGrant { id: 7, ttl: 10 });
        m.apply(&Record::Txn {
            revision: 2,
            mutations: vec![Mutation::Put {
                key: Bytes::from_static(b"/l"),
                value: Bytes::new(),
                lease: 7,
            }],
        });
        m.apply(&Record::LeaseRevoke { id: 7 });
        assert_eq!(m.latest(b"/l"), None);
        assert_eq!(m.revision(), 3);
    }
}
