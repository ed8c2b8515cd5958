//! [`LogStore`]: openraft's `RaftLogStorage` and `RaftLogReader` for one
//! Raft group, over the shared store.
//!
//! Entries live under `raft_log` at `group · index`; the vote, the committed
//! log id and the last purged log id under `raft_meta`. Appends are
//! acknowledged to openraft only once the writer's WAL sync covers them;
//! votes, truncations and purges wait for their sync before returning.
//!
//! **Recent entries stay in memory** ([`LogCache`]): `append` returns as
//! soon as its batch is queued for the writer, and the leader's replication
//! reads the entries it just appended from the cache, without a trip to
//! the blocking pool and a decode each. On two cores each thread hand-off
//! costs a tenth of a millisecond or more, and these were four of them on
//! every entry's path. An entry leaves the cache only once the writer has
//! put it in RocksDB, so a read never finds a hole. Once it is there, it
//! stays only while the group's cache is within [`CACHE_ENTRIES`] and
//! [`CACHE_BYTES`]: a batched entry can hold thousands of creates, and 512
//! of those per group kept a loaded node's heap above a gigabyte.

use std::fmt::Debug;
use std::io;
use std::ops::Bound;
use std::ops::RangeBounds;
use std::sync::Arc;

use openraft::LogState;
use openraft::OptionalSend;
use openraft::RaftLogReader;
use openraft::entry::RaftEntry;
use openraft::storage::IOFlushed;
use openraft::storage::RaftLogStorage;
use rocksdb::Direction;
use rocksdb::IteratorMode;
use rocksdb::ReadOptions;
use rocksdb::WriteBatch;

use crate::Entry;
use crate::LogId;
use crate::TypeConfig;
use crate::Vote;
use crate::codec;
use crate::db::Store;
use crate::db::to_io;
use crate::keys;
use crate::keys::GroupId;
use crate::keys::raft_meta;

/// Most entries a `limited_get_log_entries` read returns, so a lagging
/// follower's catch-up cannot load an unbounded range into memory at once.
const MAX_ENTRIES_PER_LIMITED_READ: u64 = 4096;

/// Most entries kept in a group's [`LogCache`] once they are in RocksDB.
const CACHE_ENTRIES: usize = 512;

/// Most encoded bytes of entries kept in a group's [`LogCache`] once they
/// are in RocksDB. What the cache saves is the read of entries that
/// replication has not sent to a follower yet or that apply has not
/// applied yet, and both lag the append by the proposer's few entries in
/// flight, not by megabytes; a reader that lags further reads RocksDB
/// (counted by `tocsin_raft_log_uncached_entries_total`). 16 groups on a
/// node keep at most 32 MiB of them.
const CACHE_BYTES: usize = 2 << 20;

/// The group's newest entries, consecutive, each until it is in RocksDB and
/// newer ones fill [`CACHE_ENTRIES`] or [`CACHE_BYTES`].
#[derive(Default)]
struct LogCache {
    /// Each entry with its encoded size.
    entries: std::collections::VecDeque<(Entry, usize)>,
    /// The encoded sizes of `entries`, summed.
    bytes: usize,
    /// Every entry up to this index is in RocksDB (or was truncated away).
    written_upto: u64,
    /// Raised by every truncation: a write queued before one reports
    /// entries that are no longer those in the cache.
    generation: u64,
}

impl LogCache {
    fn first_index(&self) -> Option<u64> {
        self.entries.front().map(|(e, _)| e.log_id().index())
    }

    fn last_log_id(&self) -> Option<LogId> {
        self.entries.back().map(|(e, _)| e.log_id())
    }

    fn push(&mut self, entry: Entry, encoded_bytes: usize) {
        if let Some((last, _)) = self.entries.back()
            && last.log_id().index() + 1 != entry.log_id().index()
        {
            // Not consecutive (openraft truncates before it overwrites; this
            // only guards the cache's shape): start over.
            self.entries.clear();
            self.bytes = 0;
        }
        self.bytes += encoded_bytes;
        self.entries.push_back((entry, encoded_bytes));
    }

    fn pop_front(&mut self) {
        if let Some((_, n)) = self.entries.pop_front() {
            self.bytes -= n;
        }
    }

    fn truncate_from(&mut self, from: u64) {
        self.generation += 1;
        self.written_upto = self.written_upto.min(from.saturating_sub(1));
        while let Some((e, n)) = self.entries.back()
            && e.log_id().index() >= from
        {
            self.bytes -= n;
            self.entries.pop_back();
        }
    }

    fn purge_upto(&mut self, upto: u64) {
        while self.entries.front().is_some_and(|(e, _)| e.log_id().index() <= upto) {
            self.pop_front();
        }
    }

    fn written(&mut self, generation: u64, upto: u64) {
        if generation != self.generation {
            return;
        }
        self.written_upto = self.written_upto.max(upto);
        while (self.entries.len() > CACHE_ENTRIES || self.bytes > CACHE_BYTES)
            && self.entries.front().is_some_and(|(e, _)| e.log_id().index() <= self.written_upto)
        {
            self.pop_front();
        }
    }

    /// The cached entries in `[start, end)`.
    fn range(&self, start: u64, end: u64) -> Vec<Entry> {
        let Some(first) = self.first_index() else { return Vec::new() };
        let skip = start.saturating_sub(first) as usize;
        self.entries.iter().skip(skip).map(|(e, _)| e).take_while(|e| e.log_id().index() < end).cloned().collect()
    }
}

/// One group's Raft log.
#[derive(Clone)]
pub struct LogStore {
    store: Arc<Store>,
    group: GroupId,
    cache: Arc<std::sync::Mutex<LogCache>>,
    /// The newest committed log id openraft reported and no write has
    /// carried to RocksDB yet (see `save_committed`).
    committed: Arc<std::sync::Mutex<Option<Option<LogId>>>>,
}

impl Debug for LogStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogStore").field("group", &self.group).finish()
    }
}

impl LogStore {
    pub fn new(store: Arc<Store>, group: GroupId) -> LogStore {
        LogStore { store, group, cache: Arc::default(), committed: Arc::default() }
    }

    /// `[start, end)` from the cache where it holds them, the older part
    /// from RocksDB (on the blocking pool).
    async fn entries(&self, start: u64, end: u64) -> Result<Vec<Entry>, io::Error> {
        let (cached_from, mut cached) = {
            let cache = self.cache.lock().expect("log cache lock");
            match cache.first_index() {
                Some(first) if first < end => (first.max(start), cache.range(start, end)),
                _ => (end, Vec::new()),
            }
        };
        if start >= cached_from {
            return Ok(cached);
        }
        // Entries before the cache's first were written before it (the cache
        // drops only written entries).
        let this = self.clone();
        let mut out = tokio::task::spawn_blocking(move || this.read_range(start, cached_from)).await??;
        // Replication or apply fell behind the cache: each such entry cost a
        // RocksDB read and a decode on the blocking pool.
        metrics::counter!("tocsin_raft_log_uncached_entries_total").increment(out.len() as u64);
        if out.last().is_some_and(|e| e.log_id().index() + 1 == cached_from) || out.is_empty() {
            out.append(&mut cached);
        }
        Ok(out)
    }

    pub fn group(&self) -> GroupId {
        self.group
    }

    fn get_meta<T: serde::de::DeserializeOwned>(&self, tag: u8) -> io::Result<Option<T>> {
        let cf = self.store.cf(keys::CF_RAFT_META);
        match self.store.db().get_cf(cf, keys::tag_key(self.group, tag)).map_err(to_io)? {
            Some(bytes) => Ok(Some(codec::decode(&bytes)?)),
            None => Ok(None),
        }
    }

    /// Adds the committed log id that is waiting to be written, if any, to
    /// `batch` (every log write carries it; see `save_committed`).
    fn put_pending_committed(&self, batch: &mut WriteBatch) -> io::Result<()> {
        match self.committed.lock().expect("committed lock").take() {
            Some(committed) => self.put_meta(batch, raft_meta::COMMITTED, &committed),
            None => Ok(()),
        }
    }

    fn put_meta<T: serde::Serialize>(&self, batch: &mut WriteBatch, tag: u8, value: &T) -> io::Result<()> {
        batch.put_cf(self.store.cf(keys::CF_RAFT_META), keys::tag_key(self.group, tag), codec::encode(value)?);
        Ok(())
    }

    /// The last entry's log id, if the log holds any entry.
    fn last_entry_id(&self) -> io::Result<Option<LogId>> {
        let db = self.store.db();
        let mut opts = ReadOptions::default();
        opts.set_iterate_lower_bound(keys::group_start(self.group).to_vec());
        opts.set_iterate_upper_bound(keys::group_end(self.group).to_vec());
        let mut it = db.iterator_cf_opt(self.store.cf(keys::CF_RAFT_LOG), opts, IteratorMode::End);
        match it.next() {
            Some(Ok((_, value))) => Ok(Some(codec::decode::<Entry>(&value)?.log_id())),
            Some(Err(e)) => Err(to_io(e)),
            None => Ok(None),
        }
    }

    /// Every entry in `[start, end)` the log holds, read from one consistent
    /// iterator. Entries may be missing only at either end (purged, or not
    /// yet appended); a hole inside is corruption.
    fn read_range(&self, start: u64, end: u64) -> io::Result<Vec<Entry>> {
        if start >= end {
            return Ok(Vec::new());
        }
        let db = self.store.db();
        let mut opts = ReadOptions::default();
        opts.set_iterate_upper_bound(keys::log_key(self.group, end).to_vec());
        let from = keys::log_key(self.group, start);
        let it =
            db.iterator_cf_opt(self.store.cf(keys::CF_RAFT_LOG), opts, IteratorMode::From(&from, Direction::Forward));
        let mut out: Vec<Entry> = Vec::with_capacity((end - start).min(1024) as usize);
        for item in it {
            let (key, value) = item.map_err(to_io)?;
            let index = keys::log_index(&key);
            let entry: Entry = codec::decode(&value)?;
            if entry.log_id().index() != index {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("group {} log key {index} holds entry {}", self.group, entry.log_id()),
                ));
            }
            if let Some(prev) = out.last()
                && prev.log_id().index() + 1 != index
            {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("group {} log has a hole between {} and {index}", self.group, prev.log_id().index()),
                ));
            }
            out.push(entry);
        }
        Ok(out)
    }

    /// Deletes `[from, to)` of this group's log in `batch`.
    fn delete_log_range(&self, batch: &mut WriteBatch, from: u64, to: Option<u64>) {
        let end = match to {
            Some(to) => keys::log_key(self.group, to).to_vec(),
            None => keys::group_end(self.group).to_vec(),
        };
        batch.delete_range_cf(self.store.cf(keys::CF_RAFT_LOG), keys::log_key(self.group, from).to_vec(), end);
    }
}

fn bounds(range: &impl RangeBounds<u64>) -> (u64, u64) {
    let start = match range.start_bound() {
        Bound::Included(x) => *x,
        Bound::Excluded(x) => x + 1,
        Bound::Unbounded => 0,
    };
    let end = match range.end_bound() {
        Bound::Included(x) => x + 1,
        Bound::Excluded(x) => *x,
        Bound::Unbounded => u64::MAX,
    };
    (start, end)
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, io::Error> {
        let (start, end) = bounds(&range);
        self.entries(start, end).await
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, io::Error> {
        // A RocksDB read: off the async workers, like every other one.
        let this = self.clone();
        tokio::task::spawn_blocking(move || this.get_meta(raft_meta::VOTE)).await?
    }

    async fn limited_get_log_entries(&mut self, start: u64, end: u64) -> Result<Vec<Entry>, io::Error> {
        let end = end.min(start.saturating_add(MAX_ENTRIES_PER_LIMITED_READ));
        self.entries(start, end).await
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, io::Error> {
        let last_purged_log_id: Option<LogId> = self.get_meta(raft_meta::LAST_PURGED)?;
        let cached = self.cache.lock().expect("log cache lock").last_log_id();
        let last = match cached {
            Some(last) => Some(last),
            None => {
                let this = self.clone();
                tokio::task::spawn_blocking(move || this.last_entry_id()).await??
            }
        };
        Ok(LogState { last_log_id: last.or(last_purged_log_id), last_purged_log_id })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), io::Error> {
        let mut batch = WriteBatch::default();
        self.put_meta(&mut batch, raft_meta::VOTE, vote)?;
        // The vote must be on disk before this returns: a node that forgets its
        // vote after a crash can vote twice in one term.
        self.store.write_durable(batch).await
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), io::Error> {
        // Optional for safety (the committed index is soft state: a restarted
        // node learns it again from the leader, and never forgets what it
        // applied); it only lets a restart apply what it already knew was
        // committed without waiting for a leader. So it is not written on
        // its own, which cost every commit of every group a round trip
        // through the writer thread (two thread hand-offs on each node for
        // every entry): the next log write of the group carries it. A
        // restart then recovers a committed id no newer than the true one,
        // which is safe: everything up to it was committed.
        *self.committed.lock().expect("committed lock") = Some(committed);
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, io::Error> {
        if let Some(pending) = *self.committed.lock().expect("committed lock") {
            return Ok(pending);
        }
        Ok(self.get_meta::<Option<LogId>>(raft_meta::COMMITTED)?.flatten())
    }

    async fn append<I>(&mut self, entries: I, callback: IOFlushed<TypeConfig>) -> Result<(), io::Error>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let cf = self.store.cf(keys::CF_RAFT_LOG);
        let mut batch = WriteBatch::default();
        let mut last = None;
        let generation;
        {
            let mut cache = self.cache.lock().expect("log cache lock");
            generation = cache.generation;
            for entry in entries {
                let index = entry.log_id().index();
                let encoded = codec::encode(&entry)?;
                let encoded_bytes = encoded.len();
                batch.put_cf(cf, keys::log_key(self.group, index), encoded);
                cache.push(entry, encoded_bytes);
                last = Some(index);
            }
        }
        let Some(last) = last else {
            callback.io_completed(Ok(()));
            return Ok(());
        };
        self.put_pending_committed(&mut batch)?;
        let started = std::time::Instant::now();
        let cache = self.cache.clone();
        // Returns once queued: the entries are readable from the cache until
        // the writer has put them in RocksDB. openraft learns they are
        // durable only from the callback, after the WAL sync that covers them.
        self.store
            .write_queued(
                batch,
                move |res| {
                    if res.is_ok() {
                        cache.lock().expect("log cache lock").written(generation, last);
                    }
                },
                move |res| {
                    metrics::histogram!("tocsin_raft_log_append_seconds").record(started.elapsed().as_secs_f64());
                    callback.io_completed(res)
                },
            )
            .await
    }

    async fn truncate_after(&mut self, last_log_id: Option<LogId>) -> Result<(), io::Error> {
        let from = last_log_id.map_or(0, |id| id.index() + 1);
        self.cache.lock().expect("log cache lock").truncate_from(from);
        let mut batch = WriteBatch::default();
        self.delete_log_range(&mut batch, from, None);
        self.store.write_durable(batch).await
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), io::Error> {
        let mut batch = WriteBatch::default();
        // Record the purge point first, in the same batch as the delete, so
        // the log never has a hole that `get_log_state` cannot explain.
        self.put_meta(&mut batch, raft_meta::LAST_PURGED, &log_id)?;
        self.delete_log_range(&mut batch, 0, Some(log_id.index() + 1));
        self.cache.lock().expect("log cache lock").purge_upto(log_id.index());
        self.put_pending_committed(&mut batch)?;
        self.store.write_durable(batch).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blank(index: u64) -> Entry {
        Entry { log_id: openraft::testing::log_id::<TypeConfig>(1, 1, index), payload: openraft::EntryPayload::Blank }
    }

    fn indexes(cache: &LogCache) -> Vec<u64> {
        cache.entries.iter().map(|(e, _)| e.log_id().index()).collect()
    }

    #[test]
    fn written_entries_leave_once_the_cache_is_over_its_bytes_and_unwritten_ones_never_do() {
        let mut cache = LogCache::default();
        let entry_bytes = CACHE_BYTES / 4;
        for index in 1..=10 {
            cache.push(blank(index), entry_bytes);
        }
        // Nothing is in RocksDB yet: all ten stay, whatever they weigh.
        cache.written(cache.generation, 0);
        assert_eq!(indexes(&cache), (1..=10).collect::<Vec<_>>());

        // Up to 8 written: the oldest written leave until the cache is
        // within its bytes; 9 and 10 stay although the bound allows four.
        cache.written(cache.generation, 8);
        assert_eq!(indexes(&cache), (7..=10).collect::<Vec<_>>());
        assert_eq!(cache.bytes, 4 * entry_bytes);

        cache.written(cache.generation, 10);
        assert_eq!(indexes(&cache), (7..=10).collect::<Vec<_>>());
        assert_eq!(cache.range(8, 10).iter().map(|e| e.log_id().index()).collect::<Vec<_>>(), vec![8, 9]);
    }

    #[test]
    fn small_entries_are_bounded_by_count_and_the_byte_total_follows_every_removal() {
        let mut cache = LogCache::default();
        for index in 1..=(CACHE_ENTRIES as u64 + 100) {
            cache.push(blank(index), 10);
        }
        cache.written(cache.generation, CACHE_ENTRIES as u64 + 100);
        assert_eq!(cache.entries.len(), CACHE_ENTRIES);
        assert_eq!(cache.bytes, CACHE_ENTRIES * 10);

        let last = CACHE_ENTRIES as u64 + 100;
        cache.truncate_from(last - 9);
        assert_eq!(cache.bytes, (CACHE_ENTRIES - 10) * 10);
        cache.purge_upto(last - 20);
        assert_eq!(cache.first_index(), Some(last - 19));
        assert_eq!(cache.bytes, cache.entries.len() * 10);

        // A gap starts the cache over, bytes included.
        cache.push(blank(last + 5), 7);
        assert_eq!(cache.bytes, 7);
        assert_eq!(indexes(&cache), vec![last + 5]);
    }
}
