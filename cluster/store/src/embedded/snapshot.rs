//! Snapshots: the whole multi-version state at one log index, written beside the log so that
//! the log can be trimmed and a restart replays only what came after.

use std::collections::{BTreeMap, HashMap};
use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use bytes::Bytes;

use super::codec::{Reader, Writer};
use super::mvcc::{History, Mvcc, Version};
use super::wal::sync_dir;
use crate::error::{Result, StoreError, io};
use crate::types::KeyValue;

const MAGIC: &[u8; 8] = b"TSNAP01\n";

fn snapshot_path(dir: &Path, index: u64) -> PathBuf {
    dir.join(format!("snap-{index:020}.snap"))
}

/// Snapshot files, newest first.
fn snapshots(dir: &Path) -> Result<Vec<(u64, PathBuf)>> {
    let mut out = Vec::new();
    for entry in fs::read_dir(dir).map_err(io("listing the data directory"))? {
        let entry = entry.map_err(io("listing the data directory"))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if let Some(n) = name
            .strip_prefix("snap-")
            .and_then(|s| s.strip_suffix(".snap"))
            && let Ok(index) = n.parse::<u64>()
        {
            out.push((index, entry.path()));
        }
    }
    out.sort_by(|a, b| b.cmp(a));
    Ok(out)
}

/// What a snapshot restores.
pub(crate) struct Loaded {
    pub index: u64,
    /// Size of the snapshot file.
    pub bytes: u64,
    pub next_lease_id: i64,
    pub mvcc: Mvcc,
}

/// The state at one log index, detached from the live state so that it can be written while
/// the store goes on. Taking it clones the key map: one reference count per key; a key
/// written while the image is alive copies its own history (copy-on-write).
pub(crate) struct Image {
    index: u64,
    revision: i64,
    compacted: i64,
    next_lease_id: i64,
    leases: Vec<(i64, i64)>,
    keys: BTreeMap<Bytes, History>,
}

impl Image {
    /// Captures `mvcc` as of log `index`.
    pub fn capture(index: u64, next_lease_id: i64, mvcc: &Mvcc) -> Image {
        Image {
            index,
            revision: mvcc.revision(),
            compacted: mvcc.compacted(),
            next_lease_id,
            leases: mvcc.leases.iter().map(|(id, l)| (*id, l.ttl)).collect(),
            keys: mvcc.keys().clone(),
        }
    }

    /// The log index it was taken at.
    pub fn index(&self) -> u64 {
        self.index
    }
}

/// Writes an image durably (temp file, fsync, rename, fsync dir), then removes older snapshots
/// and the log segments that it covers. The log must have been rotated at the image's index,
/// so that every segment starting at or before it holds only records the image covers.
pub(crate) fn write(dir: &Path, image: &Image) -> Result<u64> {
    let index = image.index;
    let tmp = dir.join("snap.tmp");
    let written = encode(&tmp, image)?;
    fs::rename(&tmp, snapshot_path(dir, index)).map_err(io("installing a snapshot"))?;
    sync_dir(dir)?;

    for (old, path) in snapshots(dir)? {
        if old < index {
            fs::remove_file(path).map_err(io("removing an old snapshot"))?;
        }
    }
    // The log was rotated at `index`: segments starting at or before it end at or before it.
    for (first, path) in super::wal::segments(dir)? {
        if first <= index {
            fs::remove_file(path).map_err(io("removing a covered log segment"))?;
        }
    }
    sync_dir(dir)?;
    Ok(written)
}

/// Writes `image` to the new file `path` (owner-only) and syncs it: the snapshot format, a
/// checksum last. Returns the bytes written.
fn encode(path: &Path, image: &Image) -> Result<u64> {
    let index = image.index;
    let file = super::wal::private_file(path).map_err(io("creating a snapshot"))?;
    let mut out = BufWriter::with_capacity(1 << 20, file);
    let mut crc = crc32fast::Hasher::new();
    let mut buf = Vec::with_capacity(1 << 16);
    let mut written = 0u64;
    let mut flush = |buf: &mut Vec<u8>, out: &mut BufWriter<File>| -> Result<()> {
        crc.update(buf);
        out.write_all(buf).map_err(io("writing a snapshot"))?;
        written += buf.len() as u64;
        buf.clear();
        Ok(())
    };
    buf.extend_from_slice(MAGIC);
    {
        let mut w = Writer(&mut buf);
        w.u64(index);
        w.i64(image.revision);
        w.i64(image.compacted);
        w.i64(image.next_lease_id);
        w.u32(image.leases.len() as u32);
        for (id, ttl) in &image.leases {
            w.i64(*id);
            w.i64(*ttl);
        }
        w.u64(image.keys.len() as u64);
    }
    for (key, versions) in &image.keys {
        let mut w = Writer(&mut buf);
        w.bytes(key);
        w.u32(versions.len() as u32);
        for v in versions.iter() {
            w.u8(v.tombstone as u8);
            w.u32(v.sub);
            w.bytes(&v.kv.value);
            w.i64(v.kv.create_revision);
            w.i64(v.kv.mod_revision);
            w.i64(v.kv.version);
            w.i64(v.kv.lease);
        }
        if buf.len() >= 1 << 16 {
            flush(&mut buf, &mut out)?;
        }
    }
    flush(&mut buf, &mut out)?;
    let sum = crc.finalize();
    out.write_all(&sum.to_le_bytes())
        .map_err(io("writing a snapshot"))?;
    let file = out.into_inner().map_err(|e| StoreError::Io {
        step: "writing a snapshot",
        source: e.into_error(),
    })?;
    file.sync_all().map_err(io("syncing a snapshot"))?;
    Ok(written + 4)
}

/// What a backup holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BackupInfo {
    /// The store's revision when it was taken.
    pub revision: i64,
    /// Keys that exist in it (deleted ones not counted).
    pub keys: usize,
    /// Size of the file.
    pub bytes: u64,
}

/// Writes `image` to `out` as a backup (a snapshot file): written beside it first, synced,
/// then renamed, so `out` is whole or absent.
pub(crate) fn backup(image: &Image, out: &Path) -> Result<BackupInfo> {
    let tmp = out.with_extension("partial");
    let bytes = encode(&tmp, image)?;
    fs::rename(&tmp, out).map_err(io("installing the backup"))?;
    if let Some(parent) = out.parent().filter(|p| !p.as_os_str().is_empty()) {
        sync_dir(parent)?;
    }
    Ok(BackupInfo {
        revision: image.revision,
        keys: image
            .keys
            .values()
            .filter(|h| h.last().is_some_and(|v| !v.tombstone))
            .count(),
        bytes,
    })
}

/// Checks that `path` is a whole backup (snapshot format, checksum) and says what it holds.
pub fn verify_backup(path: &Path) -> Result<BackupInfo> {
    load_backup(path).map(|l| l.info())
}

fn load_backup(path: &Path) -> Result<Loaded> {
    load(path).map_err(|reason| StoreError::Io {
        step: "reading the backup",
        source: std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("{}: {reason}", path.display()),
        ),
    })
}

impl Loaded {
    fn info(&self) -> BackupInfo {
        BackupInfo {
            revision: self.mvcc.revision(),
            keys: self.mvcc.live_keys(),
            bytes: self.bytes,
        }
    }
}

/// Makes `dir` a store directory holding the backup `from`, as of its revision: the store
/// opens there as it was. `dir` must hold no store yet (no snapshot, no log).
pub fn restore_backup(from: &Path, dir: &Path) -> Result<BackupInfo> {
    let loaded = load_backup(from)?;
    std::os::unix::fs::DirBuilderExt::mode(fs::DirBuilder::new().recursive(true), 0o700)
        .create(dir)
        .map_err(io("creating the store directory"))?;
    if !snapshots(dir)?.is_empty() || !super::wal::segments(dir)?.is_empty() {
        return Err(StoreError::Io {
            step: "restoring a backup",
            source: std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                format!(
                    "{} holds a store already; restore into a new directory",
                    dir.display()
                ),
            ),
        });
    }
    let tmp = dir.join("snap.tmp");
    fs::copy(from, &tmp).map_err(io("copying the backup"))?;
    fs::set_permissions(&tmp, std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .map_err(io("copying the backup"))?;
    File::open(&tmp)
        .and_then(|f| f.sync_all())
        .map_err(io("syncing the restored snapshot"))?;
    fs::rename(&tmp, snapshot_path(dir, loaded.index))
        .map_err(io("installing the restored snapshot"))?;
    sync_dir(dir)?;
    Ok(loaded.info())
}

/// Loads the newest intact snapshot, if any. A damaged newest snapshot (a crash while writing
/// leaves only `snap.tmp`, so this means real damage) falls back to an older one.
pub(crate) fn load_latest(dir: &Path) -> Result<Option<Loaded>> {
    for (index, path) in snapshots(dir)? {
        match load(&path) {
            Ok(loaded) if loaded.index == index => return Ok(Some(loaded)),
            Ok(_) => {
                tracing::warn!(path = %path.display(), "snapshot index does not match its name; skipping")
            }
            Err(reason) => {
                tracing::warn!(path = %path.display(), %reason, "damaged snapshot; trying an older one")
            }
        }
    }
    Ok(None)
}

fn load(path: &Path) -> std::result::Result<Loaded, String> {
    let data = Bytes::from(fs::read(path).map_err(|e| e.to_string())?);
    if data.len() < MAGIC.len() + 4 || &data[..MAGIC.len()] != MAGIC {
        return Err("not a snapshot file".into());
    }
    let body_end = data.len() - 4;
    let want = u32::from_le_bytes(
        data[body_end..]
            .try_into()
            .map_err(|_| "short checksum".to_owned())?,
    );
    if crc32fast::hash(&data[..body_end]) != want {
        return Err("checksum mismatch".into());
    }
    let short = || "truncated snapshot".to_owned();
    let mut r = Reader::new(&data, MAGIC.len(), body_end);
    let index = r.u64().ok_or_else(short)?;
    let revision = r.i64().ok_or_else(short)?;
    let compacted = r.i64().ok_or_else(short)?;
    let next_lease_id = r.i64().ok_or_else(short)?;
    let nleases = r.u32().ok_or_else(short)?;
    let mut leases = HashMap::with_capacity(nleases as usize);
    for _ in 0..nleases {
        let id = r.i64().ok_or_else(short)?;
        let ttl = r.i64().ok_or_else(short)?;
        leases.insert(id, ttl);
    }
    let nkeys = r.u64().ok_or_else(short)?;
    let mut keys = BTreeMap::new();
    for _ in 0..nkeys {
        let key = r.bytes().ok_or_else(short)?;
        let n = r.u32().ok_or_else(short)?;
        let mut versions = Vec::with_capacity(n as usize);
        for _ in 0..n {
            let tombstone = r.u8().ok_or_else(short)? != 0;
            let sub = r.u32().ok_or_else(short)?;
            let value = r.bytes().ok_or_else(short)?;
            let kv = KeyValue {
                key: key.clone(),
                value,
                create_revision: r.i64().ok_or_else(short)?,
                mod_revision: r.i64().ok_or_else(short)?,
                version: r.i64().ok_or_else(short)?,
                lease: r.i64().ok_or_else(short)?,
            };
            versions.push(Version { kv, sub, tombstone });
        }
        keys.insert(key, std::sync::Arc::new(versions));
    }
    if r.pos() != body_end {
        return Err("trailing bytes".into());
    }
    Ok(Loaded {
        index,
        bytes: data.len() as u64,
        next_lease_id,
        mvcc: Mvcc::from_parts(keys, revision, compacted, leases),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::embedded::mvcc::{Mutation, Record, put};

    #[test]
    fn an_image_is_unaffected_by_later_writes_and_round_trips() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut m = Mvcc::new();
        m.apply(&Record::LeaseGrant { id: 5, ttl: 30 });
        m.apply(&Record::Txn {
            revision: 2,
            mutations: vec![put("/a", "1"), put("/b", "1")],
        });
        m.apply(&Record::Txn {
            revision: 3,
            mutations: vec![put("/a", "2")],
        });
        let image = Image::capture(7, 6, &m);
        // Written after the capture: copy-on-write keeps the image as it was.
        m.apply(&Record::Txn {
            revision: 4,
            mutations: vec![
                put("/a", "3"),
                Mutation::Delete {
                    key: Bytes::from_static(b"/b"),
                },
            ],
        });
        write(dir.path(), &image).expect("write");
        let loaded = load_latest(dir.path()).expect("load").expect("a snapshot");
        assert_eq!(loaded.index, 7);
        assert_eq!(loaded.next_lease_id, 6);
        let s = loaded.mvcc;
        assert_eq!(s.revision(), 3);
        assert_eq!(
            s.latest(b"/a").map(|kv| kv.value.clone()),
            Some(Bytes::from("2"))
        );
        assert!(s.latest(b"/b").is_some());
        assert_eq!(s.list(b"/", b"/", 2, 0).0.len(), 2, "history kept");
        assert!(s.leases.contains_key(&5));
        // The live state moved on.
        assert_eq!(
            m.latest(b"/a").map(|kv| kv.value.clone()),
            Some(Bytes::from("3"))
        );
        assert!(m.latest(b"/b").is_none());
    }

    #[test]
    fn a_damaged_snapshot_is_skipped() {
        let dir = tempfile::tempdir().expect("tempdir");
        let m = Mvcc::new();
        write(dir.path(), &Image::capture(3, 1, &m)).expect("write");
        let path = snapshot_path(dir.path(), 3);
        let mut data = fs::read(&path).expect("read");
        let n = data.len();
        data[n / 2] ^= 0x55;
        fs::write(&path, data).expect("damage");
        assert!(load_latest(dir.path()).expect("load").is_none());
    }
}
