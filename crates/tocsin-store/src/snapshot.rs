//! Snapshot files: built by streaming a group's key ranges out of a RocksDB
//! snapshot, installed by streaming them back in.
//!
//! Neither direction holds the group's state in memory: records flow through
//! a buffered file in both directions.
//!
//! # File format
//!
//! ```text
//! "TOCSNAP1" · header length (u32 BE) · header (codec: SnapshotHeader)
//! records: cf index (u8) · key length (u32 BE) · key without group prefix · value length (u32 BE) · value
//! 0xFF · record count (u64 BE) · xxh3-64 of every byte before it (u64 BE)
//! ```
//!
//! # Atomic install
//!
//! A group's range cannot be replaced in one bounded write batch, so install
//! is made atomic by redo:
//! 1. the verified file is copied into the group's snapshot directory and
//!    synced;
//! 2. one synced batch deletes the group's state-machine ranges and sets the
//!    `installing` marker (naming the file);
//! 3. records are written in bounded batches;
//! 4. one synced batch writes `applied` and the membership and removes the
//!    marker.
//!
//! If the node dies between 2 and 4, opening the state machine finds the
//! marker and runs the install again from the retained file, so a reader
//! never sees a half-installed group.

use std::fs::File;
use std::io;
use std::io::BufReader;
use std::io::BufWriter;
use std::io::Read;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::path::PathBuf;
use std::sync::Arc;

use rocksdb::Direction;
use rocksdb::IteratorMode;
use rocksdb::ReadOptions;
use rocksdb::WriteBatch;
use serde::Deserialize;
use serde::Serialize;
use xxhash_rust::xxh3::Xxh3;

use crate::SnapshotMeta;
use crate::codec;
use crate::db::Store;
use crate::db::to_io;
use crate::keys;
use crate::keys::GroupId;

const MAGIC: &[u8; 8] = b"TOCSNAP1";
const END_OF_RECORDS: u8 = 0xFF;
/// Largest key or value a snapshot record may carry; anything bigger is
/// corruption.
const MAX_RECORD_PART_BYTES: usize = 16 << 20;
/// Install writes in batches of about this many bytes.
const INSTALL_BATCH_BYTES: usize = 4 << 20;

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SnapshotHeader {
    /// The group the snapshot was taken from (informational: a snapshot can
    /// be installed into a group with another id).
    pub source_group: GroupId,
    pub meta: SnapshotMeta,
}

/// A complete snapshot file, opened for reading. Reads are positional, so
/// clones read independently, and the open handle keeps the data alive
/// even after a newer snapshot replaces the file.
#[derive(Clone, Debug)]
pub struct SnapshotFile {
    file: Arc<File>,
    len: u64,
    path: PathBuf,
}

impl SnapshotFile {
    pub fn open(path: impl Into<PathBuf>) -> io::Result<SnapshotFile> {
        let path = path.into();
        let file = File::open(&path)?;
        let len = file.metadata()?.len();
        Ok(SnapshotFile { file: Arc::new(file), len, path })
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Reads up to `buf.len()` bytes at `offset`; 0 at the end.
    pub fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        self.file.read_at(buf, offset)
    }

    /// A sequential reader from the start.
    pub fn reader(&self) -> impl Read + '_ {
        PositionalReader { file: self, offset: 0 }
    }

    /// Reads the header and checks the whole file's checksum.
    pub fn verify(&self) -> io::Result<SnapshotHeader> {
        let mut reader = HashingReader::new(BufReader::with_capacity(1 << 20, self.reader()));
        let header = read_header(&mut reader)?;
        let mut count = 0u64;
        while read_record(&mut reader)?.is_some() {
            count += 1;
        }
        let digest = reader.hasher.digest();
        let mut trailer = [0u8; 16];
        reader.inner.read_exact(&mut trailer)?;
        let want_count = u64::from_be_bytes(trailer[..8].try_into().expect("8 bytes"));
        let want_digest = u64::from_be_bytes(trailer[8..].try_into().expect("8 bytes"));
        if count != want_count || digest != want_digest {
            return Err(corrupt(format!(
                "snapshot {} has {count} records with checksum {digest:x}, the trailer says {want_count} and {want_digest:x}",
                self.path.display()
            )));
        }
        Ok(header)
    }
}

struct PositionalReader<'a> {
    file: &'a SnapshotFile,
    offset: u64,
}

impl Read for PositionalReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.file.read_at(self.offset, buf)?;
        self.offset += n as u64;
        Ok(n)
    }
}

struct HashingReader<R> {
    inner: R,
    hasher: Xxh3,
}

impl<R: Read> HashingReader<R> {
    fn new(inner: R) -> Self {
        HashingReader { inner, hasher: Xxh3::new() }
    }
}

impl<R: Read> Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }
}

struct HashingWriter<W> {
    inner: W,
    hasher: Xxh3,
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

fn corrupt(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

fn read_u32(r: &mut impl Read) -> io::Result<u32> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_be_bytes(b))
}

fn read_part(r: &mut impl Read) -> io::Result<Vec<u8>> {
    let len = read_u32(r)? as usize;
    if len > MAX_RECORD_PART_BYTES {
        return Err(corrupt(format!("snapshot record part of {len} bytes")));
    }
    let mut v = vec![0u8; len];
    r.read_exact(&mut v)?;
    Ok(v)
}

fn read_header(r: &mut impl Read) -> io::Result<SnapshotHeader> {
    let mut magic = [0u8; 8];
    r.read_exact(&mut magic)?;
    if &magic != MAGIC {
        return Err(corrupt("not a tocsin snapshot file".into()));
    }
    codec::decode(&read_part(r)?)
}

/// The next `(cf index, key without group, value)`, or `None` at the end
/// marker.
fn read_record(r: &mut impl Read) -> io::Result<Option<(usize, Vec<u8>, Vec<u8>)>> {
    let mut cf = [0u8; 1];
    r.read_exact(&mut cf)?;
    if cf[0] == END_OF_RECORDS {
        return Ok(None);
    }
    let cf = cf[0] as usize;
    if cf >= keys::STATE_MACHINE_CFS.len() {
        return Err(corrupt(format!("snapshot record for column family #{cf}")));
    }
    let key = read_part(r)?;
    let value = read_part(r)?;
    Ok(Some((cf, key, value)))
}

fn write_part(w: &mut impl Write, bytes: &[u8]) -> io::Result<()> {
    w.write_all(&(bytes.len() as u32).to_be_bytes())?;
    w.write_all(bytes)
}

/// The file name a snapshot is kept under: zero-padded index first, so names
/// sort in log order.
pub fn file_name(meta: &SnapshotMeta) -> String {
    match &meta.last_log_id {
        Some(id) => format!("{:020}-{}.snap", id.index(), id.committed_leader_id()),
        None => format!("{:020}-empty.snap", 0),
    }
}

/// Writes `group`'s state-machine ranges, as of a RocksDB snapshot, into a
/// new file in `dir`, and returns it. Blocking: run it off the async
/// workers. `meta_of` reads the snapshot's meta from the same consistent
/// view.
pub fn build(
    store: &Store,
    group: GroupId,
    dir: &Path,
    meta_of: impl FnOnce(&dyn Fn(&str, &[u8]) -> io::Result<Option<Vec<u8>>>) -> io::Result<SnapshotMeta>,
) -> io::Result<SnapshotFile> {
    let db = store.db();
    let view = db.snapshot();
    let get = |cf: &str, key: &[u8]| view.get_cf(store.cf(cf), key).map_err(to_io);
    let meta = meta_of(&get)?;

    std::fs::create_dir_all(dir)?;
    let final_path = dir.join(file_name(&meta));
    let tmp_path = dir.join(format!("{}.tmp", file_name(&meta)));
    let file = File::create(&tmp_path)?;
    let mut w = HashingWriter { inner: BufWriter::with_capacity(1 << 20, file), hasher: Xxh3::new() };
    w.write_all(MAGIC)?;
    write_part(&mut w, &codec::encode(&SnapshotHeader { source_group: group, meta: meta.clone() })?)?;
    let mut count = 0u64;
    for (i, cf_name) in keys::STATE_MACHINE_CFS.iter().enumerate() {
        let mut opts = ReadOptions::default();
        opts.set_iterate_upper_bound(keys::group_end(group).to_vec());
        let start = keys::group_start(group);
        for item in view.iterator_cf_opt(store.cf(cf_name), opts, IteratorMode::From(&start, Direction::Forward)) {
            let (key, value) = item.map_err(to_io)?;
            if *cf_name == keys::CF_SM_META && key.get(8) == Some(&keys::sm_meta::INSTALLING) {
                continue;
            }
            w.write_all(&[i as u8])?;
            write_part(&mut w, keys::strip_group(&key))?;
            write_part(&mut w, &value)?;
            count += 1;
        }
    }
    w.write_all(&[END_OF_RECORDS])?;
    let digest = w.hasher.digest();
    let mut inner = w.inner;
    inner.write_all(&count.to_be_bytes())?;
    inner.write_all(&digest.to_be_bytes())?;
    let file = inner.into_inner().map_err(|e| e.into_error())?;
    file.sync_all()?;
    drop(file);
    std::fs::rename(&tmp_path, &final_path)?;
    sync_dir(dir)?;
    remove_older(dir, &final_path)?;
    SnapshotFile::open(final_path)
}

/// The newest complete snapshot in `dir`, if any.
pub fn current(dir: &Path) -> io::Result<Option<(SnapshotFile, SnapshotHeader)>> {
    let Some(path) = newest(dir)? else { return Ok(None) };
    let file = SnapshotFile::open(&path)?;
    let header = read_header(&mut BufReader::new(file.reader()))?;
    Ok(Some((file, header)))
}

fn newest(dir: &Path) -> io::Result<Option<PathBuf>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut best: Option<PathBuf> = None;
    for entry in entries {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "snap") && best.as_ref().is_none_or(|b| path > *b) {
            best = Some(path);
        }
    }
    Ok(best)
}

/// Deletes every snapshot (and leftover temporary file) that sorts before
/// `keep`; a newer one, installed meanwhile, stays.
pub fn remove_older(dir: &Path, keep: &Path) -> io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.as_path() < keep || path.extension().is_some_and(|e| e == "tmp") && path.as_path() != keep {
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(())
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Copies a verified snapshot into `dir` (unless it is already there) and
/// returns the retained file.
pub fn retain(snapshot: &SnapshotFile, header: &SnapshotHeader, dir: &Path) -> io::Result<SnapshotFile> {
    std::fs::create_dir_all(dir)?;
    let final_path = dir.join(file_name(&header.meta));
    if snapshot.path() == final_path {
        return Ok(snapshot.clone());
    }
    let tmp_path = dir.join(format!("{}.tmp", file_name(&header.meta)));
    {
        let mut out = BufWriter::with_capacity(1 << 20, File::create(&tmp_path)?);
        io::copy(&mut snapshot.reader(), &mut out)?;
        out.into_inner().map_err(|e| e.into_error())?.sync_all()?;
    }
    std::fs::rename(&tmp_path, &final_path)?;
    sync_dir(dir)?;
    SnapshotFile::open(final_path)
}

/// Replaces `group`'s state-machine ranges with the snapshot's records, by
/// the redo protocol in the module docs. The file must be retained in the
/// group's directory first. Blocking: run it off the async workers.
pub fn install(store: &Store, group: GroupId, snapshot: &SnapshotFile) -> io::Result<SnapshotHeader> {
    let header = snapshot.verify()?;
    let marker_key = keys::tag_key(group, keys::sm_meta::INSTALLING);
    let marker = codec::encode(&snapshot.path().to_string_lossy().to_string())?;
    let rt = tokio::runtime::Handle::try_current().ok();
    let write = |batch: WriteBatch, durable: bool| -> io::Result<()> {
        // The writer keeps writes in order with the group's other writes.
        let fut = async { if durable { store.write_durable(batch).await } else { store.write_unsynced(batch).await } };
        match &rt {
            Some(rt) => rt.block_on(fut),
            None => futures::executor::block_on(fut),
        }
    };

    let mut batch = WriteBatch::default();
    for cf in keys::STATE_MACHINE_CFS {
        batch.delete_range_cf(store.cf(cf), keys::group_start(group).to_vec(), keys::group_end(group).to_vec());
    }
    batch.put_cf(store.cf(keys::CF_SM_META), marker_key, &marker);
    write(batch, true)?;

    let mut reader = BufReader::with_capacity(1 << 20, snapshot.reader());
    read_header(&mut reader)?;
    let mut batch = WriteBatch::default();
    while let Some((cf, key, value)) = read_record(&mut reader)? {
        batch.put_cf(store.cf(keys::STATE_MACHINE_CFS[cf]), keys::with_group(group, &key), value);
        if batch.size_in_bytes() >= INSTALL_BATCH_BYTES {
            write(std::mem::take(&mut batch), false)?;
        }
    }
    batch.delete_cf(store.cf(keys::CF_SM_META), marker_key);
    write(batch, true)?;
    Ok(header)
}

/// The snapshot file an interrupted install left behind, if any.
pub fn interrupted_install(store: &Store, group: GroupId) -> io::Result<Option<PathBuf>> {
    let key = keys::tag_key(group, keys::sm_meta::INSTALLING);
    match store.db().get_cf(store.cf(keys::CF_SM_META), key).map_err(to_io)? {
        Some(bytes) => Ok(Some(PathBuf::from(codec::decode::<String>(&bytes)?))),
        None => Ok(None),
    }
}
