//! The store's error type: every way a store request can fail, named after the step that failed.

use bytes::Bytes;

use crate::types::{KeyValue, LeaseId};

/// The result of a store request.
pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// Why a transaction's precondition did not hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PreconditionKind {
    /// `Create` found the key already present.
    AlreadyExists,
    /// `Update`, `Delete` or `Check` found no such key.
    NotFound,
    /// The key exists but its mod revision is not the one the caller read.
    RevisionMismatch {
        /// The mod revision the caller expected.
        expected: i64,
        /// The key's mod revision now.
        actual: i64,
    },
}

/// A transaction that did not commit because one of its preconditions failed. Nothing was
/// written. `current` carries the key's present value so that a caller can retry without
/// another read (as Kubernetes' guaranteed update does).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PreconditionFailure {
    /// Index of the first failing operation in the transaction.
    pub index: usize,
    /// The key of that operation.
    pub key: Bytes,
    /// What was wrong.
    pub kind: PreconditionKind,
    /// The key's current value, if it exists.
    pub current: Option<KeyValue>,
}

/// Every way a store request can fail.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The key (or prefix) is not a valid store key.
    #[error("invalid key {key:?}: {reason}")]
    InvalidKey {
        /// The key as given (lossy UTF-8).
        key: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// One value is larger than the store accepts.
    #[error("value of key {key:?} is {size} bytes; the limit is {limit} bytes")]
    ValueTooLarge {
        /// The key.
        key: String,
        /// The value's size.
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// The request as a whole (keys and values of a transaction) is too large.
    #[error(
        "request is {size} bytes; the limit is {limit} bytes (split it into smaller transactions)"
    )]
    RequestTooLarge {
        /// The request's size.
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// The transaction has more operations than the store accepts.
    #[error("transaction has {count} operations; the limit is {limit}")]
    TooManyOps {
        /// Operations given.
        count: usize,
        /// The limit.
        limit: usize,
    },
    /// The transaction is empty or names a key twice.
    #[error("invalid transaction: {0}")]
    InvalidTxn(String),
    /// A precondition of the transaction failed; nothing was written.
    #[error("precondition failed on key {:?}: {:?}", String::from_utf8_lossy(&.0.key), .0.kind)]
    PreconditionFailed(Box<PreconditionFailure>),
    /// The requested revision has been compacted away.
    #[error("revision {requested} has been compacted (oldest available is {compacted})")]
    Compacted {
        /// The revision asked for.
        requested: i64,
        /// The store's compaction revision.
        compacted: i64,
    },
    /// The requested revision is newer than the store's current one.
    #[error("revision {requested} is in the future (current is {current})")]
    FutureRevision {
        /// The revision asked for.
        requested: i64,
        /// The store's current revision.
        current: i64,
    },
    /// A resource version or continue token that this store did not issue.
    #[error("invalid {what}: {reason}")]
    InvalidToken {
        /// "revision" or "continue token".
        what: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// The lease does not exist (never granted, revoked or expired).
    #[error("lease {0} not found")]
    LeaseNotFound(LeaseId),
    /// A lease TTL outside the accepted range.
    #[error("invalid lease TTL {0}s: it must be between 1 and 9000000000 seconds")]
    InvalidTtl(i64),
    /// A transaction whose keys live in different backends of a sharded store.
    #[error(
        "transaction spans several backends ({0}); keys of one transaction must share a namespace"
    )]
    CrossShardTxn(String),
    /// The backend could not be reached (after retries, for requests that are safe to retry).
    /// For a write, its outcome is unknown: read the key again before retrying.
    #[error("store backend {backend} unavailable during {op}: {source}")]
    Unavailable {
        /// Backend name.
        backend: String,
        /// The request.
        op: &'static str,
        /// The cause.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A disk operation of the embedded store failed.
    #[error("embedded store: {step} failed: {source}")]
    Io {
        /// What the store was doing.
        step: &'static str,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The embedded store's files are damaged beyond a torn last record.
    #[error("embedded store: {path}: corrupt at byte {offset}: {reason}")]
    Corrupt {
        /// The file.
        path: String,
        /// Byte offset of the damage.
        offset: u64,
        /// What was found.
        reason: String,
    },
    /// The store has been shut down, or its writer stopped after a disk error.
    #[error("store is closed: {0}")]
    Closed(String),
    /// A backend answered in a way the protocol does not allow (a bug, not bad input).
    #[error("internal store error: {0}")]
    Internal(String),
    /// The backend does not do this (it says what to use instead).
    #[error("{0}")]
    Unsupported(String),
}

/// Wraps an I/O error with the step of the embedded store that failed.
pub(crate) fn io(step: &'static str) -> impl FnOnce(std::io::Error) -> StoreError {
    move |source| StoreError::Io { step, source }
}

impl StoreError {
    /// The precondition failure, if this error is one.
    pub fn precondition(&self) -> Option<&PreconditionFailure> {
        match self {
            StoreError::PreconditionFailed(p) => Some(p),
            _ => None,
        }
    }

    /// True if the caller's input was wrong (a 4xx at the API), as opposed to the store failing.
    pub fn is_invalid_input(&self) -> bool {
        self.label() == "invalid"
    }

    /// A short, fixed label for metrics.
    pub fn label(&self) -> &'static str {
        match self {
            StoreError::InvalidKey { .. }
            | StoreError::ValueTooLarge { .. }
            | StoreError::RequestTooLarge { .. }
            | StoreError::TooManyOps { .. }
            | StoreError::InvalidTxn(_)
            | StoreError::InvalidToken { .. }
            | StoreError::InvalidTtl(_)
            | StoreError::CrossShardTxn(_) => "invalid",
            StoreError::PreconditionFailed(_) => "precondition_failed",
            StoreError::Compacted { .. } => "compacted",
            StoreError::FutureRevision { .. } => "future_revision",
            StoreError::LeaseNotFound(_) => "lease_not_found",
            StoreError::Unavailable { .. } => "unavailable",
            StoreError::Io { .. } | StoreError::Corrupt { .. } => "io",
            StoreError::Closed(_) => "closed",
            StoreError::Internal(_) => "internal",
            StoreError::Unsupported(_) => "unsupported",
        }
    }
}
