//! Checks every backend applies before it touches data: key syntax and etcd's size limits.
//!
//! All backends enforce the same limits so that code written against the embedded store does
//! not break on etcd: etcd refuses requests over `--max-request-bytes` (1.5 MiB by default) and
//! transactions over `--max-txn-ops` (128 by default).

use std::collections::HashSet;

use bytes::Bytes;

use crate::error::{Result, StoreError};
use crate::types::Op;

/// Largest request (keys plus values of one transaction) accepted. etcd's default
/// `--max-request-bytes` is 1.5 MiB (1,572,864 bytes); this leaves room for the request's own
/// encoding so that a request we accept is never refused by etcd.
pub const MAX_REQUEST_BYTES: usize = 1_536 * 1_000;

/// Most operations in one transaction (etcd's default `--max-txn-ops`).
pub const MAX_TXN_OPS: usize = 128;

/// Longest key accepted.
pub const MAX_KEY_BYTES: usize = 4_096;

/// Checks a key: `/`-separated, printable ASCII without spaces, no empty, `.` or `..`
/// segments, not ending in `/`.
pub fn check_key(key: &[u8]) -> Result<()> {
    check_path(key, false)
}

/// Checks a list or watch prefix: like a key, but it may end in `/`.
pub fn check_prefix(prefix: &[u8]) -> Result<()> {
    check_path(prefix, true)
}

fn check_path(path: &[u8], is_prefix: bool) -> Result<()> {
    let invalid = |reason| StoreError::InvalidKey {
        key: String::from_utf8_lossy(&path[..path.len().min(256)]).into_owned(),
        reason,
    };
    if path.is_empty() {
        return Err(invalid("it is empty"));
    }
    if path.len() > MAX_KEY_BYTES {
        return Err(invalid("it is longer than 4096 bytes"));
    }
    if path[0] != b'/' {
        return Err(invalid("it must start with '/'"));
    }
    if let Some(_bad) = path.iter().find(|b| !(0x21..=0x7e).contains(*b)) {
        return Err(invalid(
            "it may contain only printable ASCII characters without spaces",
        ));
    }
    let body = if is_prefix {
        path.strip_suffix(b"/").unwrap_or(path)
    } else {
        if path.len() > 1 && path.ends_with(b"/") {
            return Err(invalid("a key must not end with '/'"));
        }
        path
    };
    if body.is_empty() {
        // The prefix "/" (everything).
        return Ok(());
    }
    for segment in body[1..].split(|b| *b == b'/') {
        match segment {
            b"" => return Err(invalid("it has an empty segment ('//')")),
            b"." | b".." => return Err(invalid("it has a '.' or '..' segment")),
            _ => {}
        }
    }
    Ok(())
}

/// Checks a transaction: non-empty, within the op and size limits, valid keys, no key twice.
pub fn check_txn(ops: &[Op]) -> Result<()> {
    if ops.is_empty() {
        return Err(StoreError::InvalidTxn("it has no operations".into()));
    }
    if ops.len() > MAX_TXN_OPS {
        return Err(StoreError::TooManyOps {
            count: ops.len(),
            limit: MAX_TXN_OPS,
        });
    }
    let mut size = 0usize;
    for op in ops {
        let key = op.key();
        check_key(key)?;
        size += key.len();
        if let Some(value) = op.value() {
            if value.len() > MAX_REQUEST_BYTES {
                return Err(StoreError::ValueTooLarge {
                    key: String::from_utf8_lossy(key).into_owned(),
                    size: value.len(),
                    limit: MAX_REQUEST_BYTES,
                });
            }
            size += value.len();
        }
        match op {
            Op::Update { expected, .. }
            | Op::Delete {
                expected: Some(expected),
                ..
            } if *expected <= 0 => {
                return Err(StoreError::InvalidTxn(format!(
                    "expected mod revision {expected} of key {:?} must be positive (a key that exists has one)",
                    String::from_utf8_lossy(key)
                )));
            }
            Op::Check { expected, .. } if *expected < 0 => {
                return Err(StoreError::InvalidTxn(format!(
                    "expected mod revision {expected} must not be negative"
                )));
            }
            _ => {}
        }
        if op.lease() < 0 {
            return Err(StoreError::InvalidTxn(format!(
                "lease id {} is negative",
                op.lease()
            )));
        }
    }
    if size > MAX_REQUEST_BYTES {
        return Err(StoreError::RequestTooLarge {
            size,
            limit: MAX_REQUEST_BYTES,
        });
    }
    if ops.len() > 1 {
        let mut seen: HashSet<&Bytes> = HashSet::with_capacity(ops.len());
        for op in ops {
            if !seen.insert(op.key()) {
                return Err(StoreError::InvalidTxn(format!(
                    "key {:?} appears more than once",
                    String::from_utf8_lossy(op.key())
                )));
            }
        }
    }
    Ok(())
}

/// Checks a lease TTL (etcd's bounds).
pub fn check_ttl(ttl: i64) -> Result<()> {
    if !(1..=9_000_000_000).contains(&ttl) {
        return Err(StoreError::InvalidTtl(ttl));
    }
    Ok(())
}

/// The end of the key range covered by `prefix`: the smallest key greater than every key that
/// starts with it (etcd's `range_end`), or `None` when no such key exists.
pub fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_checked() {
        for good in [
            "/registry/pods/ns/a",
            "/a",
            "/registry/podgroups.tessera.io/x/y",
        ] {
            assert!(check_key(good.as_bytes()).is_ok(), "{good}");
        }
        for bad in [
            "",
            "registry/pods",
            "/a//b",
            "/a/../b",
            "/a/./b",
            "/a/b/",
            "/a b",
            "/a\u{0}",
            "/é",
        ] {
            assert!(check_key(bad.as_bytes()).is_err(), "{bad:?}");
        }
        assert!(check_key(b"/").is_err());
        assert!(check_key(&b"/a".repeat(3000)).is_err());
    }

    #[test]
    fn prefixes_may_end_in_slash() {
        assert!(check_prefix(b"/registry/pods/").is_ok());
        assert!(check_prefix(b"/").is_ok());
        assert!(check_prefix(b"/registry//").is_err());
    }

    #[test]
    fn txns_are_checked() {
        let put = |k: &str, n: usize| Op::Put {
            key: Bytes::from(k.to_owned()),
            value: Bytes::from(vec![0u8; n]),
            lease: 0,
        };
        assert!(check_txn(&[]).is_err());
        assert!(check_txn(&[put("/a", 10)]).is_ok());
        assert!(matches!(
            check_txn(&[put("/a", MAX_REQUEST_BYTES + 1)]),
            Err(StoreError::ValueTooLarge { .. })
        ));
        assert!(matches!(
            check_txn(&[put("/a", MAX_REQUEST_BYTES - 10), put("/b", 100)]),
            Err(StoreError::RequestTooLarge { .. })
        ));
        assert!(matches!(
            check_txn(&[put("/a", 1), put("/a", 1)]),
            Err(StoreError::InvalidTxn(_))
        ));
        let many: Vec<Op> = (0..=MAX_TXN_OPS)
            .map(|i| put(&format!("/k{i}"), 1))
            .collect();
        assert!(matches!(
            check_txn(&many),
            Err(StoreError::TooManyOps { .. })
        ));
    }

    #[test]
    fn prefix_end_is_etcd_range_end() {
        assert_eq!(prefix_end(b"/a/"), Some(b"/a0".to_vec()));
        assert_eq!(prefix_end(b"a\xff"), Some(b"b".to_vec()));
        assert_eq!(prefix_end(b"\xff\xff"), None);
    }
}
