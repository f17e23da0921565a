//! The write-ahead log: numbered records in segment files, appended in batches and made
//! durable with one `fdatasync` per batch (group commit). Recovery replays every intact record
//! and cuts a torn last record off, which is the only damage a crash can leave.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use bytes::Bytes;

use super::codec::{Reader, decode_record, encode_record};
use super::mvcc::Record;
use crate::error::{Result, StoreError};

/// Frame header: payload length (u32), CRC-32 of index and payload (u32), index (u64).
const HEADER: usize = 16;
/// A frame larger than this is damage, not data (requests are capped well below it).
const MAX_FRAME: usize = 64 << 20;

fn io(step: &'static str) -> impl FnOnce(std::io::Error) -> StoreError {
    move |source| StoreError::Io { step, source }
}

pub(crate) fn segment_path(dir: &Path, first_index: u64) -> PathBuf {
    dir.join(format!("wal-{first_index:020}.log"))
}

/// Segment files in index order, with the first index each holds.
pub(crate) fn segments(dir: &Path) -> Result<Vec<(u64, PathBuf)>> {
    let mut out = Vec::new();
    for entry in fs::read_dir(dir).map_err(io("listing the data directory"))? {
        let entry = entry.map_err(io("listing the data directory"))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if let Some(n) = name
            .strip_prefix("wal-")
            .and_then(|s| s.strip_suffix(".log"))
            && let Ok(first) = n.parse::<u64>()
        {
            out.push((first, entry.path()));
        }
    }
    out.sort();
    Ok(out)
}

/// Fsyncs a directory so that file creations, renames and removals in it are durable.
pub(crate) fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io("syncing the data directory"))
}

/// The open log: appends go to a buffer, `sync` writes and flushes them.
pub(crate) struct Wal {
    dir: PathBuf,
    file: File,
    next_index: u64,
    buf: Vec<u8>,
    /// Bytes written since the last snapshot.
    pub bytes_since_snapshot: u64,
}

impl Wal {
    /// Starts a new segment whose first record will have `next_index`.
    pub fn create(dir: &Path, next_index: u64) -> Result<Wal> {
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(segment_path(dir, next_index))
            .map_err(io("creating a log segment"))?;
        sync_dir(dir)?;
        Ok(Wal {
            dir: dir.to_owned(),
            file,
            next_index,
            buf: Vec::with_capacity(1 << 20),
            bytes_since_snapshot: 0,
        })
    }

    /// Index the next record will get; `next_index - 1` is the last one appended.
    pub fn next_index(&self) -> u64 {
        self.next_index
    }

    /// Frames a record into the pending buffer.
    pub fn append(&mut self, record: &Record) {
        let start = self.buf.len();
        self.buf.resize(start + HEADER, 0);
        encode_record(record, &mut self.buf);
        let len = (self.buf.len() - start - HEADER) as u32;
        let index = self.next_index;
        self.next_index += 1;
        self.buf[start + 8..start + 16].copy_from_slice(&index.to_le_bytes());
        let mut crc = crc32fast::Hasher::new();
        crc.update(&self.buf[start + 8..]);
        self.buf[start..start + 4].copy_from_slice(&len.to_le_bytes());
        self.buf[start + 4..start + 8].copy_from_slice(&crc.finalize().to_le_bytes());
    }

    /// Writes the pending records and waits until they are on disk. Returns bytes written.
    pub fn sync(&mut self) -> Result<usize> {
        let n = self.buf.len();
        if n == 0 {
            return Ok(0);
        }
        self.file
            .write_all(&self.buf)
            .map_err(io("writing the log"))?;
        self.file.sync_data().map_err(io("syncing the log"))?;
        self.buf.clear();
        self.bytes_since_snapshot += n as u64;
        Ok(n)
    }

    /// Closes this segment and starts the next (before a snapshot, so that the old segments
    /// hold only records the snapshot covers).
    pub fn rotate(&mut self) -> Result<()> {
        let next = Wal::create(&self.dir, self.next_index)?;
        *self = next;
        Ok(())
    }
}

/// Replays every record with an index above `after` through `apply`, in order. A torn or
/// damaged tail of the last segment is cut off (that is what a crash mid-write leaves); damage
/// anywhere else is reported. Returns the index the next record should get.
pub(crate) fn replay(
    dir: &Path,
    after: u64,
    mut apply: impl FnMut(u64, Record),
) -> Result<u64> {
    let segs = segments(dir)?;
    let mut next = after + 1;
    for (i, (_, path)) in segs.iter().enumerate() {
        let last = i + 1 == segs.len();
        let data = Bytes::from(fs::read(path).map_err(io("reading a log segment"))?);
        let mut pos = 0usize;
        let mut damage: Option<String> = None;
        while pos < data.len() {
            match read_frame(&data, pos) {
                Ok((index, record, end)) => {
                    if index > after {
                        if index != next {
                            return Err(StoreError::Corrupt {
                                path: path.display().to_string(),
                                offset: pos as u64,
                                reason: format!("expected record {next}, found {index}"),
                            });
                        }
                        apply(index, record);
                        next = index + 1;
                    }
                    pos = end;
                }
                Err(reason) => {
                    damage = Some(reason);
                    break;
                }
            }
        }
        if let Some(reason) = damage {
            if !last {
                return Err(StoreError::Corrupt {
                    path: path.display().to_string(),
                    offset: pos as u64,
                    reason,
                });
            }
            tracing::warn!(path = %path.display(), offset = pos, %reason, "cutting off a torn log tail");
            let f = OpenOptions::new()
                .write(true)
                .open(path)
                .map_err(io("opening a log segment to cut its torn tail"))?;
            f.set_len(pos as u64)
                .and_then(|_| f.sync_all())
                .map_err(io("cutting a torn log tail"))?;
        }
    }
    Ok(next)
}

fn read_frame(data: &Bytes, pos: usize) -> std::result::Result<(u64, Record, usize), String> {
    let header = data
        .get(pos..pos + HEADER)
        .ok_or_else(|| "truncated frame header".to_owned())?;
    let len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]) as usize;
    let crc = u32::from_le_bytes([header[4], header[5], header[6], header[7]]);
    if len > MAX_FRAME {
        return Err(format!("frame length {len} is implausible"));
    }
    let end = pos + HEADER + len;
    let body = data
        .get(pos + 8..end)
        .ok_or_else(|| "truncated frame".to_owned())?;
    if crc32fast::hash(body) != crc {
        return Err("checksum mismatch".to_owned());
    }
    let index = u64::from_le_bytes(body[..8].try_into().map_err(|_| "short index".to_owned())?);
    let mut r = Reader::new(data, pos + HEADER, end);
    let record = decode_record(&mut r).ok_or_else(|| "undecodable record".to_owned())?;
    if r.pos() != end {
        return Err("trailing bytes in frame".to_owned());
    }
    Ok((index, record, end))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(rev: i64) -> Record {
        Record::Compact { revision: rev }
    }

    #[test]
    fn replay_cuts_a_torn_tail_and_keeps_the_rest() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut wal = Wal::create(dir.path(), 1).expect("create");
        for i in 0..10 {
            wal.append(&rec(i));
        }
        wal.sync().expect("sync");
        drop(wal);
        let path = segment_path(dir.path(), 1);
        let len = fs::metadata(&path).expect("meta").len();
        // A crash mid-write: half of the last frame.
        let f = OpenOptions::new().write(true).open(&path).expect("open");
        f.set_len(len - 5).expect("truncate");
        let mut seen = Vec::new();
        let next = replay(dir.path(), 0, |i, _| seen.push(i)).expect("replay");
        assert_eq!(seen, (1..=9).collect::<Vec<_>>());
        assert_eq!(next, 10);
        // The tail was cut, so appending and replaying again is clean.
        let mut wal = Wal::create(dir.path(), next).expect("create");
        wal.append(&rec(99));
        wal.sync().expect("sync");
        let mut seen = Vec::new();
        replay(dir.path(), 3, |i, _| seen.push(i)).expect("replay");
        assert_eq!(seen, (4..=10).collect::<Vec<_>>());
    }

    #[test]
    fn damage_before_the_last_segment_is_an_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut wal = Wal::create(dir.path(), 1).expect("create");
        wal.append(&rec(1));
        wal.append(&rec(2));
        wal.sync().expect("sync");
        wal.rotate().expect("rotate");
        wal.append(&rec(3));
        wal.sync().expect("sync");
        let path = segment_path(dir.path(), 1);
        let mut data = fs::read(&path).expect("read");
        let n = data.len();
        data[n - 1] ^= 0xff;
        fs::write(&path, data).expect("write");
        assert!(matches!(
            replay(dir.path(), 0, |_, _| {}),
            Err(StoreError::Corrupt { .. })
        ));
    }
}
