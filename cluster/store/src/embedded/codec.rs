//! Byte encoding of log records and snapshot entries: little-endian, length-prefixed, no
//! dependencies, and every read bounds-checked so damaged input is an error, never a panic.

use bytes::Bytes;

use super::mvcc::{Mutation, Record};

const TAG_TXN: u8 = 1;
const TAG_LEASE_GRANT: u8 = 2;
const TAG_LEASE_REVOKE: u8 = 3;
const TAG_COMPACT: u8 = 4;
const MUT_PUT: u8 = 1;
const MUT_DELETE: u8 = 2;

/// Appends little-endian fields to a buffer.
pub(crate) struct Writer<'a>(pub &'a mut Vec<u8>);

impl Writer<'_> {
    pub fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    pub fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    pub fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    pub fn i64(&mut self, v: i64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    pub fn bytes(&mut self, v: &[u8]) {
        self.u32(v.len() as u32);
        self.0.extend_from_slice(v);
    }
}

/// Reads fields back; `None` means the input ended early or is malformed.
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    base: &'a Bytes,
    pos: usize,
}

impl<'a> Reader<'a> {
    /// Reads from `buf`, a slice of `base` (values are returned as cheap slices of `base`).
    pub fn new(base: &'a Bytes, start: usize, end: usize) -> Self {
        Reader {
            buf: &base[..end],
            base,
            pos: start,
        }
    }
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.pos.checked_add(n)?;
        let s = self.buf.get(self.pos..end)?;
        self.pos = end;
        Some(s)
    }
    pub fn pos(&self) -> usize {
        self.pos
    }
    pub fn u8(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }
    pub fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    pub fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
    pub fn i64(&mut self) -> Option<i64> {
        Some(i64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
    pub fn bytes(&mut self) -> Option<Bytes> {
        let n = self.u32()? as usize;
        let start = self.pos;
        self.take(n)?;
        Some(self.base.slice(start..start + n))
    }
}

/// Encodes one record's payload.
pub(crate) fn encode_record(record: &Record, out: &mut Vec<u8>) {
    let mut w = Writer(out);
    match record {
        Record::Txn {
            revision,
            mutations,
        } => {
            w.u8(TAG_TXN);
            w.i64(*revision);
            w.u32(mutations.len() as u32);
            for m in mutations {
                match m {
                    Mutation::Put { key, value, lease } => {
                        w.u8(MUT_PUT);
                        w.bytes(key);
                        w.bytes(value);
                        w.i64(*lease);
                    }
                    Mutation::Delete { key } => {
                        w.u8(MUT_DELETE);
                        w.bytes(key);
                    }
                }
            }
        }
        Record::LeaseGrant { id, ttl } => {
            w.u8(TAG_LEASE_GRANT);
            w.i64(*id);
            w.i64(*ttl);
        }
        Record::LeaseRevoke { id } => {
            w.u8(TAG_LEASE_REVOKE);
            w.i64(*id);
        }
        Record::Compact { revision } => {
            w.u8(TAG_COMPACT);
            w.i64(*revision);
        }
    }
}

/// Decodes one record's payload.
pub(crate) fn decode_record(r: &mut Reader<'_>) -> Option<Record> {
    Some(match r.u8()? {
        TAG_TXN => {
            let revision = r.i64()?;
            let n = r.u32()? as usize;
            let mut mutations = Vec::with_capacity(n.min(1024));
            for _ in 0..n {
                mutations.push(match r.u8()? {
                    MUT_PUT => Mutation::Put {
                        key: r.bytes()?,
                        value: r.bytes()?,
                        lease: r.i64()?,
                    },
                    MUT_DELETE => Mutation::Delete { key: r.bytes()? },
                    _ => return None,
                });
            }
            Record::Txn {
                revision,
                mutations,
            }
        }
        TAG_LEASE_GRANT => Record::LeaseGrant {
            id: r.i64()?,
            ttl: r.i64()?,
        },
        TAG_LEASE_REVOKE => Record::LeaseRevoke { id: r.i64()? },
        TAG_COMPACT => Record::Compact { revision: r.i64()? },
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_truncation_is_detected() {
        let records = vec![
            Record::Txn {
                revision: 9,
                mutations: vec![
                    Mutation::Put {
                        key: Bytes::from_static(b"/a"),
                        value: Bytes::from_static(b"v"),
                        lease: 3,
                    },
                    Mutation::Delete {
                        key: Bytes::from_static(b"/b"),
                    },
                ],
            },
            Record::LeaseGrant { id: 3, ttl: 10 },
            Record::LeaseRevoke { id: 3 },
            Record::Compact { revision: 5 },
        ];
        for rec in records {
            let mut buf = Vec::new();
            encode_record(&rec, &mut buf);
            let base = Bytes::from(buf);
            let mut r = Reader::new(&base, 0, base.len());
            assert_eq!(decode_record(&mut r).as_ref(), Some(&rec));
            for cut in 0..base.len() {
                let mut r = Reader::new(&base, 0, cut);
                assert_eq!(decode_record(&mut r), None, "cut at {cut}");
            }
        }
    }
}
