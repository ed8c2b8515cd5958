//! The queries a node runs against a group's applied state: point reads,
//! namespace listings, scans of the fire-time and retention indexes, horizon
//! counts and a state digest. All are blocking RocksDB reads: call them from
//! `spawn_blocking`.
//!
//! Each scan takes a limit, so no query can walk an unbounded range.

use std::io;

use rocksdb::Direction;
use rocksdb::IteratorMode;
use rocksdb::ReadOptions;
use tocsin_core::Due;
use tocsin_core::DueKind;
use tocsin_core::DuePos;
use tocsin_core::ShardMeta;
use tocsin_core::TimerKey;
use tocsin_core::TimerRecord;
use tocsin_core::TimerState;
use tocsin_core::fire::LoadFrom;
use xxhash_rust::xxh3::Xxh3;

use crate::codec;
use crate::db::Store;
use crate::db::to_io;
use crate::keys;
use crate::keys::GroupId;

impl Store {
    pub fn get_timer(&self, group: GroupId, key: &TimerKey) -> io::Result<Option<TimerRecord>> {
        match self.db().get_cf(self.cf(keys::CF_TIMERS), keys::timer_key(group, key)).map_err(to_io)? {
            Some(bytes) => Ok(Some(codec::decode(&bytes)?)),
            None => Ok(None),
        }
    }

    /// The records of `keys`, in order, in one batched lookup.
    pub fn get_timers(&self, group: GroupId, keys: &[TimerKey]) -> io::Result<Vec<Option<TimerRecord>>> {
        let cf = self.cf(keys::CF_TIMERS);
        let wanted: Vec<Vec<u8>> = keys.iter().map(|key| keys::timer_key(group, key)).collect();
        self.db()
            .batched_multi_get_cf(cf, &wanted, false)
            .into_iter()
            .map(|found| match found.map_err(to_io)? {
                Some(bytes) => Ok(Some(codec::decode(&bytes)?)),
                None => Ok(None),
            })
            .collect()
    }

    pub fn shard_meta(&self, group: GroupId) -> io::Result<ShardMeta> {
        match self.db().get_cf(self.cf(keys::CF_SM_META), keys::tag_key(group, keys::sm_meta::SHARD)).map_err(to_io)? {
            Some(bytes) => codec::decode(&bytes),
            None => Ok(ShardMeta::default()),
        }
    }

    /// The cluster map as this node's metadata replica last applied it
    /// (the default, epoch 0, if it hosts none or nothing is applied yet).
    pub fn cluster_map(&self) -> io::Result<tocsin_core::cluster::ClusterMap> {
        let key = keys::tag_key(keys::META_GROUP, keys::sm_meta::CLUSTER_MAP);
        match self.db().get_cf(self.cf(keys::CF_SM_META), key).map_err(to_io)? {
            Some(bytes) => codec::decode(&bytes),
            None => Ok(Default::default()),
        }
    }

    /// Entries of a time index (`due` or `retention`) with time in
    /// `[from_ms, before_ms)`, in time order, at most `limit`.
    pub fn scan_time_index(
        &self,
        cf: &str,
        group: GroupId,
        from_ms: u64,
        before_ms: u64,
        limit: usize,
    ) -> io::Result<Vec<(u64, TimerKey)>> {
        self.scan_time_index_from(cf, group, &keys::time_index_from(group, from_ms), before_ms, limit)
    }

    fn scan_time_index_from(
        &self,
        cf: &str,
        group: GroupId,
        from: &[u8],
        before_ms: u64,
        limit: usize,
    ) -> io::Result<Vec<(u64, TimerKey)>> {
        let mut opts = ReadOptions::default();
        opts.set_iterate_upper_bound(keys::time_index_from(group, before_ms).to_vec());
        let mut out = Vec::new();
        for item in self.db().iterator_cf_opt(self.cf(cf), opts, IteratorMode::From(from, Direction::Forward)) {
            if out.len() >= limit {
                break;
            }
            let (key, _) = item.map_err(to_io)?;
            let entry = keys::decode_time_index_key(&key)
                .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "malformed time index key"))?;
            out.push(entry);
        }
        Ok(out)
    }

    /// Timers due (to fire, retry or redeliver) in `[from_ms, before_ms)`.
    pub fn scan_due(
        &self,
        group: GroupId,
        from_ms: u64,
        before_ms: u64,
        limit: usize,
    ) -> io::Result<Vec<(u64, TimerKey)>> {
        self.scan_time_index(keys::CF_DUE, group, from_ms, before_ms, limit)
    }

    /// A page of the fire-time index for the shard leader's loader: entries
    /// from `from` and due before `before_ms`, at most `limit`, in index
    /// order, with what each is due for, and the log index the page reflects
    /// (read from the same RocksDB snapshot: apply writes both in one batch).
    pub fn due_page(&self, group: GroupId, from: &LoadFrom, before_ms: u64, limit: usize) -> io::Result<DuePage> {
        let snapshot = self.db().snapshot();
        let applied_index = self.applied_index_in(&snapshot, group)?;
        let start = match from {
            LoadFrom::Time(t) => keys::time_index_from(group, *t).to_vec(),
            LoadFrom::After(pos) => {
                let mut k = keys::time_index_key(group, pos.due_ms, &pos.key);
                k.push(0); // the smallest key after it
                k
            }
        };
        let mut opts = ReadOptions::default();
        opts.set_iterate_upper_bound(keys::time_index_from(group, before_ms).to_vec());
        let mut entries = Vec::new();
        for item in
            snapshot.iterator_cf_opt(self.cf(keys::CF_DUE), opts, IteratorMode::From(&start, Direction::Forward))
        {
            if entries.len() >= limit {
                break;
            }
            let (key, value) = item.map_err(to_io)?;
            let (due_ms, key) = keys::decode_time_index_key(&key)
                .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "malformed fire-time index key"))?;
            let kind = keys::decode_due_value(&value).ok_or_else(|| {
                io::Error::new(io::ErrorKind::InvalidData, format!("malformed fire-time index value {value:?}"))
            })?;
            entries.push((DuePos { due_ms, key }, kind));
        }
        Ok(DuePage { applied_index, entries })
    }

    /// One timer's fire-time index entry, and the log index it reflects
    /// (one RocksDB snapshot): what the fire loop re-reads when it does not
    /// know what became of a `Fire`.
    pub fn read_due(&self, group: GroupId, key: &TimerKey) -> io::Result<(u64, Option<Due>)> {
        let snapshot = self.db().snapshot();
        let applied_index = self.applied_index_in(&snapshot, group)?;
        let record: Option<TimerRecord> =
            match snapshot.get_cf(self.cf(keys::CF_TIMERS), keys::timer_key(group, key)).map_err(to_io)? {
                Some(bytes) => Some(codec::decode(&bytes)?),
                None => None,
            };
        Ok((applied_index, record.and_then(|r| r.due())))
    }

    fn applied_index_in(&self, snapshot: &rocksdb::Snapshot<'_>, group: GroupId) -> io::Result<u64> {
        let applied: Option<crate::LogId> = match snapshot
            .get_cf(self.cf(keys::CF_SM_META), keys::tag_key(group, keys::sm_meta::APPLIED))
            .map_err(to_io)?
        {
            Some(bytes) => Some(codec::decode(&bytes)?),
            None => None,
        };
        Ok(applied.map_or(0, |l| l.index))
    }

    /// Finished timers whose retention ends before `before_ms`.
    pub fn scan_expired(&self, group: GroupId, before_ms: u64, limit: usize) -> io::Result<Vec<TimerKey>> {
        Ok(self.scan_time_index(keys::CF_RETENTION, group, 0, before_ms, limit)?.into_iter().map(|(_, k)| k).collect())
    }

    /// A page of a namespace's timers after `after_id` (exclusive), keeping
    /// those `filter` accepts. Walks at most `scan_budget` rows, so a sparse
    /// filter returns a short page rather than a slow one. Returns the page
    /// and the id to resume after, if the namespace may hold more.
    pub fn list_namespace(
        &self,
        group: GroupId,
        namespace: &str,
        after_id: Option<&str>,
        page_size: usize,
        scan_budget: usize,
        mut filter: impl FnMut(&TimerRecord) -> bool,
    ) -> io::Result<(Vec<(TimerKey, TimerRecord)>, Option<String>)> {
        let (start, end) = keys::namespace_range(group, namespace);
        let from = match after_id {
            Some(id) => {
                let mut k = keys::timer_key(group, &TimerKey::new(namespace, id));
                k.push(0); // the smallest key after `id`
                k
            }
            None => start,
        };
        let mut opts = ReadOptions::default();
        opts.set_iterate_upper_bound(end);
        let mut page = Vec::new();
        let mut last_id = None;
        for (scanned, item) in self
            .db()
            .iterator_cf_opt(self.cf(keys::CF_TIMERS), opts, IteratorMode::From(&from, Direction::Forward))
            .enumerate()
        {
            if page.len() >= page_size || scanned >= scan_budget {
                return Ok((page, last_id));
            }
            let (key, value) = item.map_err(to_io)?;
            let timer_key = keys::decode_timer_key(&key[8..])
                .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "malformed timer key"))?;
            let record: TimerRecord = codec::decode(&value)?;
            last_id = Some(timer_key.id.clone());
            if filter(&record) {
                page.push((timer_key, record));
            }
        }
        Ok((page, None))
    }

    /// Scheduled timers of `namespace` firing in minutes `[from_minute,
    /// before_minute)`.
    pub fn horizon_count(
        &self,
        group: GroupId,
        namespace: &str,
        from_minute: u64,
        before_minute: u64,
    ) -> io::Result<u64> {
        let mut opts = ReadOptions::default();
        opts.set_iterate_upper_bound(keys::horizon_key(group, namespace, before_minute));
        let from = keys::horizon_key(group, namespace, from_minute);
        let mut total = 0u64;
        for item in
            self.db().iterator_cf_opt(self.cf(keys::CF_HORIZON), opts, IteratorMode::From(&from, Direction::Forward))
        {
            let (_, value) = item.map_err(to_io)?;
            let count: [u8; 8] =
                value.as_ref().try_into().map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "horizon counter"))?;
            total += u64::from_be_bytes(count);
        }
        Ok(total)
    }

    /// Scheduled timers of `namespace` per minute, for the `minutes`
    /// minutes from `from_minute`: one scan.
    pub fn horizon_minutes(
        &self,
        group: GroupId,
        namespace: &str,
        from_minute: u64,
        minutes: usize,
    ) -> io::Result<Vec<u64>> {
        let mut out = vec![0u64; minutes];
        let mut opts = ReadOptions::default();
        opts.set_iterate_upper_bound(keys::horizon_key(group, namespace, from_minute + minutes as u64));
        let from = keys::horizon_key(group, namespace, from_minute);
        for item in
            self.db().iterator_cf_opt(self.cf(keys::CF_HORIZON), opts, IteratorMode::From(&from, Direction::Forward))
        {
            let (key, value) = item.map_err(to_io)?;
            let minute: [u8; 8] = key[key.len() - 8..].try_into().expect("8 bytes");
            let count: [u8; 8] =
                value.as_ref().try_into().map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "horizon counter"))?;
            if let Some(slot) = out.get_mut((u64::from_be_bytes(minute) - from_minute) as usize) {
                *slot += u64::from_be_bytes(count);
            }
        }
        Ok(out)
    }

    /// The unfinished timers of `namespace` in `group` (those with a due
    /// time: scheduled, firing or retrying), as of the last applied entry.
    pub fn pending_count(&self, group: GroupId, namespace: &str) -> io::Result<u64> {
        let key = keys::horizon_key(group, namespace, keys::PENDING_MINUTE);
        match self.db().get_cf(self.cf(keys::CF_HORIZON), key).map_err(to_io)? {
            Some(bytes) => Ok(u64::from_be_bytes(
                bytes
                    .as_slice()
                    .try_into()
                    .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "pending counter"))?,
            )),
            None => Ok(0),
        }
    }

    /// The unfinished timers of every namespace that has any in `group`
    /// (see [`Store::pending_count`]), at most `max` namespaces: one seek
    /// per namespace, for the metrics.
    pub fn pending_by_namespace(&self, group: GroupId, max: usize) -> io::Result<Vec<(String, u64)>> {
        let prefix = group.to_be_bytes();
        let mut iter = self.db().raw_iterator_cf(self.cf(keys::CF_HORIZON));
        iter.seek(prefix);
        let mut out = Vec::new();
        while out.len() < max {
            let Some(key) = iter.key().filter(|k| k.starts_with(&prefix)) else { break };
            let Some(namespace) = keys::horizon_namespace(key) else { break };
            // The pending counter is the namespace's last key (minute
            // u64::MAX); without one, the seek lands on the next namespace.
            let pending_key = keys::horizon_key(group, &namespace, keys::PENDING_MINUTE);
            iter.seek(&pending_key);
            if iter.key() == Some(pending_key.as_slice()) {
                let value = iter.value().unwrap_or_default();
                let count: [u8; 8] =
                    value.try_into().map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "pending counter"))?;
                let count = u64::from_be_bytes(count);
                if count > 0 {
                    out.push((namespace, count));
                }
                iter.next();
            }
        }
        iter.status().map_err(to_io)?;
        Ok(out)
    }

    /// A digest of the group's timers (key, state, fire time, generation),
    /// equal on replicas that applied the same log: the chaos checker's
    /// replica-agreement check. Also returns the number of timers.
    pub fn state_digest(&self, group: GroupId) -> io::Result<StateDigest> {
        // One RocksDB snapshot for both reads: `apply` writes the timers and
        // `last_applied` in one batch, so the digest is exactly the state at
        // `applied_index` and replicas can be compared index for index.
        let snapshot = self.db().snapshot();
        let applied_index = self.applied_index_in(&snapshot, group)?;
        let mut opts = ReadOptions::default();
        opts.set_iterate_upper_bound(keys::group_end(group).to_vec());
        let start = keys::group_start(group);
        let mut h = Xxh3::new();
        let mut count = 0u64;
        for item in
            snapshot.iterator_cf_opt(self.cf(keys::CF_TIMERS), opts, IteratorMode::From(&start, Direction::Forward))
        {
            let (key, value) = item.map_err(to_io)?;
            let record: TimerRecord = codec::decode(&value)?;
            h.update(&(key.len() as u32).to_be_bytes());
            h.update(&key[8..]);
            h.update(&[state_code(record.state)]);
            h.update(&record.fire_at_ms.to_be_bytes());
            h.update(&record.generation.to_be_bytes());
            count += 1;
        }
        Ok(StateDigest { applied_index, digest: h.digest(), timer_count: count })
    }
}

/// A page of the fire-time index (see [`Store::due_page`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DuePage {
    pub applied_index: u64,
    pub entries: Vec<(DuePos, DueKind)>,
}

/// A replica's applied state in one number, and the log index it reflects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StateDigest {
    pub applied_index: u64,
    pub digest: u64,
    pub timer_count: u64,
}

fn state_code(state: TimerState) -> u8 {
    match state {
        TimerState::Scheduled => 1,
        TimerState::Firing => 2,
        TimerState::Delivered => 3,
        TimerState::Dead => 4,
        TimerState::Cancelled => 5,
        TimerState::Skipped => 6,
    }
}
