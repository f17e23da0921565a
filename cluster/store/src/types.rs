//! The data the Store trait speaks: key-values, revisions, transactions, lists and watch events.

use std::fmt;
use std::pin::Pin;
use std::str::FromStr;

use bytes::Bytes;
use futures::Stream;

use crate::error::{Result, StoreError};

/// A lease identifier; 0 means "no lease".
pub type LeaseId = i64;

/// One key's value at one revision, with etcd's bookkeeping.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyValue {
    /// The key.
    pub key: Bytes,
    /// The value (empty for a deletion event's `kv`).
    pub value: Bytes,
    /// Revision at which the key was (last) created.
    pub create_revision: i64,
    /// Revision of the last change: what compare-and-swap compares.
    pub mod_revision: i64,
    /// Number of changes since creation (1 after create).
    pub version: i64,
    /// Lease the key is attached to, or 0.
    pub lease: LeaseId,
}

/// A point in the store's history: one revision per backend. A plain store has one part; a
/// sharded store has one part per backend, so that a list or watch spanning them resumes each.
///
/// Its string form (Kubernetes' `resourceVersion`) is opaque to clients: a single part prints as
/// the bare number, several as `c.<r0>.<r1>...`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct Revision(Vec<i64>);

impl Revision {
    /// A revision of a single-backend store.
    pub fn single(rev: i64) -> Self {
        Revision(vec![rev])
    }

    /// A revision with one part per backend (printed as a plain number when there is one).
    pub fn composite(parts: Vec<i64>) -> Self {
        Revision(parts)
    }

    /// The parts.
    pub fn parts(&self) -> &[i64] {
        &self.0
    }

    /// The revision of a single-backend store, or an error naming what was given.
    pub fn expect_single(&self) -> Result<i64> {
        match self.0.as_slice() {
            [r] => Ok(*r),
            _ => Err(StoreError::InvalidToken {
                what: "revision",
                reason: format!(
                    "{self} has {} parts but this store has one backend",
                    self.0.len()
                ),
            }),
        }
    }
}

impl fmt::Display for Revision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0.as_slice() {
            [r] => write!(f, "{r}"),
            parts => {
                f.write_str("c")?;
                for p in parts {
                    write!(f, ".{p}")?;
                }
                Ok(())
            }
        }
    }
}

impl FromStr for Revision {
    type Err = StoreError;

    fn from_str(s: &str) -> Result<Self> {
        let bad = |reason: &str| StoreError::InvalidToken {
            what: "revision",
            reason: format!("{s:?}: {reason}"),
        };
        let parse = |p: &str| -> Result<i64> {
            let v: i64 = p
                .parse()
                .map_err(|_| bad("expected a non-negative integer"))?;
            if v < 0 {
                return Err(bad("revisions are never negative"));
            }
            Ok(v)
        };
        match s.strip_prefix("c.") {
            Some(rest) => {
                let parts = rest.split('.').map(parse).collect::<Result<Vec<_>>>()?;
                if parts.len() < 2 {
                    return Err(bad("a composite revision has at least two parts"));
                }
                Ok(Revision(parts))
            }
            None => Ok(Revision(vec![parse(s)?])),
        }
    }
}

/// One operation of a transaction. Every operation but `Put` carries a precondition; the
/// transaction commits only if all of them hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// Write `value` if the key does not exist.
    Create {
        /// Key.
        key: Bytes,
        /// Value.
        value: Bytes,
        /// Lease to attach, or 0.
        lease: LeaseId,
    },
    /// Overwrite the key if its mod revision is still `expected`.
    Update {
        /// Key.
        key: Bytes,
        /// Value.
        value: Bytes,
        /// The mod revision the caller read.
        expected: i64,
        /// Lease to attach, or 0.
        lease: LeaseId,
    },
    /// Write the key whatever its state.
    Put {
        /// Key.
        key: Bytes,
        /// Value.
        value: Bytes,
        /// Lease to attach, or 0.
        lease: LeaseId,
    },
    /// Delete the key, which must exist; if `expected` is set, only at that mod revision.
    Delete {
        /// Key.
        key: Bytes,
        /// The mod revision the caller read, if the delete is conditional.
        expected: Option<i64>,
    },
    /// Write nothing; require the key's mod revision to be `expected` (0: the key must not
    /// exist). Lets a transaction depend on a key it does not change.
    Check {
        /// Key.
        key: Bytes,
        /// Required mod revision, or 0 for absence.
        expected: i64,
    },
}

impl Op {
    /// The key the operation touches.
    pub fn key(&self) -> &Bytes {
        match self {
            Op::Create { key, .. }
            | Op::Update { key, .. }
            | Op::Put { key, .. }
            | Op::Delete { key, .. }
            | Op::Check { key, .. } => key,
        }
    }

    /// The value it writes, if any.
    pub fn value(&self) -> Option<&Bytes> {
        match self {
            Op::Create { value, .. } | Op::Update { value, .. } | Op::Put { value, .. } => {
                Some(value)
            }
            Op::Delete { .. } | Op::Check { .. } => None,
        }
    }

    /// Why this operation's precondition fails against the key's `current` value, if it does.
    pub fn precondition_failure(
        &self,
        current: Option<&KeyValue>,
    ) -> Option<crate::PreconditionKind> {
        use crate::PreconditionKind as K;
        match (self, current) {
            (Op::Create { .. }, Some(_)) => Some(K::AlreadyExists),
            (Op::Update { .. } | Op::Delete { .. }, None) => Some(K::NotFound),
            (Op::Check { expected, .. }, None) if *expected != 0 => Some(K::NotFound),
            (
                Op::Update { expected, .. }
                | Op::Delete {
                    expected: Some(expected),
                    ..
                }
                | Op::Check { expected, .. },
                Some(kv),
            ) if kv.mod_revision != *expected => Some(K::RevisionMismatch {
                expected: *expected,
                actual: kv.mod_revision,
            }),
            _ => None,
        }
    }

    /// The lease it attaches (0 for none or for non-writes).
    pub fn lease(&self) -> LeaseId {
        match self {
            Op::Create { lease, .. } | Op::Update { lease, .. } | Op::Put { lease, .. } => *lease,
            Op::Delete { .. } | Op::Check { .. } => 0,
        }
    }
}

/// What one operation of a committed transaction did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OpResult {
    /// The key's new value.
    Written(KeyValue),
    /// The value the key had before it was deleted.
    Deleted(KeyValue),
    /// A `Check` that held.
    Checked,
}

/// A committed transaction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TxnResponse {
    /// The revision it committed at (the backend's own, for a sharded store), or the current
    /// revision for a transaction of checks only.
    pub revision: i64,
    /// One result per operation, in order.
    pub results: Vec<OpResult>,
}

/// A list request.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ListRequest {
    /// Keys that start with this prefix.
    pub prefix: Bytes,
    /// Read at this revision; `None` reads the latest.
    pub revision: Option<Revision>,
    /// At most this many keys; 0 for no limit.
    pub limit: usize,
    /// A token from a previous page's `continue_token`; it fixes prefix and revision.
    pub continue_token: Option<String>,
}

/// One page of a list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListResponse {
    /// The keys, in byte order.
    pub kvs: Vec<KeyValue>,
    /// The revision the page was read at; the same for every page of one list.
    pub revision: Revision,
    /// Set when more keys follow: pass it back to get the next page.
    pub continue_token: Option<String>,
}

/// What happened to a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// Created or changed.
    Put,
    /// Deleted (or its lease expired).
    Delete,
}

/// One change seen by a watch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WatchEvent {
    /// Put or delete.
    pub kind: EventKind,
    /// The key's new state; for a delete, the key with the deletion's `mod_revision` and an
    /// empty value.
    pub kv: KeyValue,
    /// The key's state before the change, if it existed.
    pub prev_kv: Option<KeyValue>,
}

/// What a watch yields: the events of one or more whole revisions, in order, and the position
/// after them. A batch without events is a progress notification (bookmark).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WatchBatch {
    /// Changes, in revision order.
    pub events: Vec<WatchEvent>,
    /// Watch from here (with `after`) to resume just after this batch.
    pub revision: Revision,
}

impl WatchBatch {
    /// True for a progress notification.
    pub fn is_progress(&self) -> bool {
        self.events.is_empty()
    }
}

/// A watch: batches until dropped. An `Err` item ends the stream (for example `Compacted` when
/// the watch fell behind compaction).
pub type WatchStream = Pin<Box<dyn Stream<Item = Result<WatchBatch>> + Send>>;
