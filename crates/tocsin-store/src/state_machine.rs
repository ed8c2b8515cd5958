//! [`StateMachine`]: openraft's `RaftStateMachine` for one group, applying
//! `tocsin-core`'s rules to the timers stored in RocksDB.
//!
//! Apply reads through an overlay (so later commands of a batch see earlier
//! ones), collects every change — timer rows, fire-time and retention index
//! entries, horizon counters, the shard's meta, `last_applied` and the
//! membership — into one `WriteBatch`, writes it, and answers openraft once
//! it is readable, without waiting for the WAL sync that covers it. The log
//! is the durable record: every applied entry was synced in the log first,
//! and the apply batch follows it in the node's one WAL, so a crash loses at
//! most a suffix of apply batches, never a part of one, and openraft applies
//! that suffix again from the log (`last_applied` is in the same batch). A
//! broken invariant stops the group: apply returns an error, which openraft
//! treats as fatal.
//!
//! Once a batch is written, and before openraft hears of it, the group's
//! [`ApplyObserver`] (the shard leader's fire loop, on the node) is told
//! what every entry did, in log order: each timer whose fire-time index
//! entry moved, and each command's result. That is how the leader's wheel
//! follows the applied log whether or not anyone still waits for a command.
//!
//! The metadata group ([`keys::META_GROUP`]) uses the same machinery with
//! other rules: its entries carry cluster-map commands, applied by
//! `tocsin_core::cluster` to the one cluster-map value it stores.

use std::collections::BTreeMap;
use std::collections::HashMap;
use std::io;
use std::sync::Arc;

use futures::Stream;
use futures::TryStreamExt;
use openraft::EntryPayload;
use openraft::OptionalSend;
use openraft::RaftSnapshotBuilder;
use openraft::entry::RaftEntry;
use openraft::storage::EntryResponder;
use openraft::storage::RaftStateMachine;
use rocksdb::WriteBatch;
use tocsin_core::Due;
use tocsin_core::ShardMeta;
use tocsin_core::TimerKey;
use tocsin_core::TimerRecord;
use tocsin_core::TimerTable;
use tocsin_core::apply::ApplyError;
use tocsin_core::apply::apply_cluster_proposal;
use tocsin_core::apply::apply_proposal;
use tocsin_core::cluster::ClusterMap;
use tocsin_core::command::ApplyResponse;
use tocsin_core::command::CommandResult;
use tocsin_core::command::Proposal;
use tocsin_core::fire::IndexChange;

use crate::Entry;
use crate::LogId;
use crate::SnapshotMeta;
use crate::StoredMembership;
use crate::TypeConfig;
use crate::codec;
use crate::db::Store;
use crate::db::to_io;
use crate::keys;
use crate::keys::GroupId;
use crate::keys::sm_meta;
use crate::snapshot;
use crate::snapshot::SnapshotFile;

/// Batches of at most this many commands are applied on the state
/// machine's own task; larger ones on the blocking pool. A small batch's
/// reads are point lookups that hit the memtable or the block cache (bloom
/// filters answer "no such timer" for a create) and its write is an
/// unsynced append to the WAL: tens of microseconds, less than the two
/// thread hand-offs through the blocking pool cost on two cores (measured:
/// a third of a three-node cluster's context switches per create). A
/// large batch (a burst of fires, a catch-up) may read from disk for
/// milliseconds and goes to the pool, so the Raft runtime's other groups
/// are not held up behind it.
const INLINE_APPLY_MAX_COMMANDS: usize = 32;

/// What one applied entry did, as its group's observer hears it.
pub struct AppliedEntry<'a> {
    /// The entry's log index.
    pub index: u64,
    /// The entry's commands (empty for blank and membership entries).
    pub commands: &'a [tocsin_core::Command],
    /// One result per command.
    pub results: &'a [CommandResult],
    /// Every timer whose fire-time index entry this entry moved, in the order
    /// the commands moved them (a timer moved twice appears twice).
    pub changes: &'a [IndexChange],
}

/// Hears about every applied entry of a group, in log order, once it is
/// written (see the module's note on durability). Called on openraft's state machine task: it must not block.
pub trait ApplyObserver: Send + Sync + 'static {
    fn applied(&self, entries: &[AppliedEntry<'_>]);
}

/// One group's state machine.
#[derive(Clone)]
pub struct StateMachine {
    store: Arc<Store>,
    group: GroupId,
    observer: Option<Arc<dyn ApplyObserver>>,
}

impl std::fmt::Debug for StateMachine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StateMachine").field("group", &self.group).finish()
    }
}

impl StateMachine {
    /// Opens the group's state machine, first completing an install that a
    /// crash interrupted.
    pub async fn open(store: Arc<Store>, group: GroupId) -> io::Result<StateMachine> {
        StateMachine::open_observed(store, group, None).await
    }

    /// Like [`open`](Self::open), with an observer told about every applied
    /// entry (see [`ApplyObserver`]).
    pub async fn open_observed(
        store: Arc<Store>,
        group: GroupId,
        observer: Option<Arc<dyn ApplyObserver>>,
    ) -> io::Result<StateMachine> {
        let sm = StateMachine { store, group, observer };
        if let Some(path) = snapshot::interrupted_install(&sm.store, group)? {
            tracing::warn!(group, path = %path.display(), "completing an interrupted snapshot install");
            let file = SnapshotFile::open(&path).map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("group {group}: interrupted install of {} cannot resume: {e}", path.display()),
                )
            })?;
            let store = sm.store.clone();
            tokio::task::spawn_blocking(move || snapshot::install(&store, group, &file)).await??;
        }
        Ok(sm)
    }

    pub fn group(&self) -> GroupId {
        self.group
    }

    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    fn get_meta<T: serde::de::DeserializeOwned>(&self, tag: u8) -> io::Result<Option<T>> {
        let cf = self.store.cf(keys::CF_SM_META);
        match self.store.db().get_cf(cf, keys::tag_key(self.group, tag)).map_err(to_io)? {
            Some(bytes) => Ok(Some(codec::decode(&bytes)?)),
            None => Ok(None),
        }
    }

    /// The shard's counters and fencing epoch, as last applied.
    pub fn shard_meta(&self) -> io::Result<ShardMeta> {
        Ok(self.get_meta(sm_meta::SHARD)?.unwrap_or_default())
    }

    /// Applies `entries` (consecutive, after the last applied one) in one
    /// write and returns each entry's response.
    pub async fn apply_entries(&self, entries: Vec<Entry>) -> io::Result<Vec<ApplyResponse>> {
        if entries.is_empty() {
            return Ok(Vec::new());
        }
        let started = std::time::Instant::now();
        let commands: usize = entries
            .iter()
            .map(|e| match &e.payload {
                EntryPayload::Normal(proposal) => proposal.commands.len(),
                _ => 1,
            })
            .sum();
        let this = self.clone();
        // Built and written in one go: timers, indexes, counters and
        // last_applied together, without waiting for a WAL sync (the entries
        // are already durable in the log, which is ahead of this batch in
        // the same WAL; module note). A failed sync latches the store
        // failed, and the next log append stops the group.
        let work = move || {
            let (batch, responses, changes) = this.apply_batch(&entries)?;
            this.store.write_now(batch)?;
            Ok::<_, io::Error>((responses, entries, changes))
        };
        let (responses, entries, changes) =
            if commands <= INLINE_APPLY_MAX_COMMANDS { work()? } else { tokio::task::spawn_blocking(work).await?? };
        metrics::histogram!("tocsin_raft_apply_seconds").record(started.elapsed().as_secs_f64());
        if let Some(observer) = &self.observer {
            let applied: Vec<AppliedEntry<'_>> = entries
                .iter()
                .zip(&responses)
                .zip(&changes)
                .map(|((entry, response), changes)| AppliedEntry {
                    index: entry.log_id().index(),
                    commands: match &entry.payload {
                        EntryPayload::Normal(proposal) => &proposal.commands[..],
                        _ => &[],
                    },
                    results: &response.results,
                    changes,
                })
                .collect();
            observer.applied(&applied);
        }
        Ok(responses)
    }

    /// Builds the write batch for applying `entries`, with each entry's
    /// response and the index changes it made. Blocking.
    fn apply_batch(&self, entries: &[Entry]) -> io::Result<(WriteBatch, Vec<ApplyResponse>, Vec<Vec<IndexChange>>)> {
        if self.group == keys::META_GROUP {
            let (batch, responses) = self.apply_cluster_batch(entries)?;
            let changes = vec![Vec::new(); responses.len()];
            return Ok((batch, responses, changes));
        }
        let mut meta = self.shard_meta()?;
        let mut overlay = Overlay {
            store: &self.store,
            group: self.group,
            batch: WriteBatch::default(),
            cache: HashMap::new(),
            written: HashMap::new(),
            horizon: BTreeMap::new(),
            changes: Vec::new(),
        };
        overlay.prefetch(entries)?;
        let mut changes = Vec::with_capacity(entries.len());
        let first_index = entries.first().map_or(0, |e| e.log_id().index());
        let applied = apply_entries(entries, |index, proposal| {
            let results = apply_proposal(&mut overlay, &mut meta, index, proposal).map_err(|e| match e {
                ApplyError::Storage(e) => e,
                ApplyError::Invariant { .. } => {
                    tracing::error!(group = self.group, error = %e, "stopping the group");
                    io::Error::new(io::ErrorKind::InvalidData, format!("group {}: {e}", self.group))
                }
            })?;
            // Only normal entries come here (blank and membership entries change
            // no timer); entries are consecutive, so the index gives the slot.
            changes.resize_with((index - first_index) as usize, Vec::new);
            changes.push(std::mem::take(&mut overlay.changes));
            Ok(results)
        })?;
        changes.resize_with(entries.len(), Vec::new);
        overlay.flush_rows()?;
        overlay.flush_horizon()?;
        let mut batch = overlay.batch;
        let cf = self.store.cf(keys::CF_SM_META);
        batch.put_cf(cf, keys::tag_key(self.group, sm_meta::SHARD), codec::encode(&meta)?);
        self.put_progress(&mut batch, &applied)?;
        Ok((batch, applied.responses, changes))
    }

    /// The metadata group's apply: the cluster map, `last_applied` and the
    /// membership in one batch. Blocking.
    fn apply_cluster_batch(&self, entries: &[Entry]) -> io::Result<(WriteBatch, Vec<ApplyResponse>)> {
        let mut map: ClusterMap = self.get_meta(sm_meta::CLUSTER_MAP)?.unwrap_or_default();
        let before = map.epoch;
        let applied = apply_entries(entries, |index, proposal| {
            apply_cluster_proposal::<io::Error>(&mut map, index, proposal).map_err(|e| {
                tracing::error!(group = self.group, error = %e, "stopping the metadata group");
                io::Error::new(io::ErrorKind::InvalidData, format!("metadata group: {e}"))
            })
        })?;
        let mut batch = WriteBatch::default();
        if map.epoch != before {
            let cf = self.store.cf(keys::CF_SM_META);
            batch.put_cf(cf, keys::tag_key(self.group, sm_meta::CLUSTER_MAP), codec::encode(&map)?);
            tracing::info!(epoch = map.epoch, "cluster map changed");
        }
        self.put_progress(&mut batch, &applied)?;
        Ok((batch, applied.responses))
    }

    /// Adds `last_applied` and the newest membership of `applied` to the
    /// batch that carries the state-machine changes, so that both land in
    /// one synced write.
    fn put_progress(&self, batch: &mut WriteBatch, applied: &Applied) -> io::Result<()> {
        let cf = self.store.cf(keys::CF_SM_META);
        if let Some(last_applied) = &applied.last_applied {
            batch.put_cf(cf, keys::tag_key(self.group, sm_meta::APPLIED), codec::encode(last_applied)?);
        }
        if let Some(membership) = &applied.membership {
            batch.put_cf(cf, keys::tag_key(self.group, sm_meta::MEMBERSHIP), codec::encode(membership)?);
        }
        Ok(())
    }
}

/// What one apply call went through.
struct Applied {
    responses: Vec<ApplyResponse>,
    last_applied: Option<LogId>,
    membership: Option<StoredMembership>,
}

/// Walks `entries` in order: normal entries through `apply` (with their log
/// index), membership entries remembered, blank ones answered empty.
fn apply_entries(
    entries: &[Entry],
    mut apply: impl FnMut(u64, &Proposal) -> io::Result<Vec<CommandResult>>,
) -> io::Result<Applied> {
    let mut applied = Applied { responses: Vec::with_capacity(entries.len()), last_applied: None, membership: None };
    for entry in entries {
        let log_id = entry.log_id();
        let results = match &entry.payload {
            EntryPayload::Blank => Vec::new(),
            EntryPayload::Normal(proposal) => apply(log_id.index(), proposal)?,
            EntryPayload::Membership(m) => {
                applied.membership = Some(StoredMembership::new(Some(log_id), m.clone()));
                Vec::new()
            }
        };
        applied.responses.push(ApplyResponse { results });
        applied.last_applied = Some(log_id);
    }
    Ok(applied)
}

/// The most timers an apply's overlay reserves room for up front (a batch
/// of entries can carry more commands; the map then grows as usual).
const MAX_OVERLAY_CAPACITY: usize = 65_536;

/// A timer's row as read from RocksDB, if there is one.
fn decode_record(bytes: Option<&[u8]>) -> io::Result<Option<TimerRecord>> {
    bytes.map(codec::decode::<TimerRecord>).transpose()
}

/// The rules' view of the group's timers: reads fall through to RocksDB,
/// writes are remembered for later reads in the batch, and go into the
/// batch once per timer at its end (`flush_rows`).
struct Overlay<'a> {
    store: &'a Store,
    group: GroupId,
    batch: WriteBatch,
    cache: HashMap<TimerKey, Option<TimerRecord>>,
    /// Every timer written in this batch, with the index positions its row
    /// had before the batch (its fire-time index entry, its retention
    /// entry). Its row and index entries are written once, at the end, from
    /// those to its last record in `cache`: a timer written by several
    /// commands of one batch (a `FireReserve` is a fire and a reservation;
    /// a reservation and its ack may share a batch) costs RocksDB one row
    /// and one move of each index entry, not one per command.
    written: HashMap<TimerKey, (Option<Due>, Option<u64>)>,
    /// Net change of each (namespace, minute) horizon counter, the pending
    /// counters (`keys::PENDING_MINUTE`) included.
    horizon: BTreeMap<(String, u64), i64>,
    /// Fire-time index changes of the entry being applied.
    changes: Vec<IndexChange>,
}

impl Overlay<'_> {
    /// Reads the record of every timer a command of `entries` names, in one
    /// batched lookup, into the cache the rules read through. Point lookups
    /// one command at a time were a fifth of a node's CPU in a burst's drain
    /// (a `Fire`, a `Reserve` and an `AttemptResult` each read their
    /// timer); RocksDB's MultiGet over sorted keys takes the column family's
    /// version once and visits each table's filter and index once per
    /// batch. The cache is also sized for every timer up front, so it never
    /// rehashes while the batch applies (that moved every cached record:
    /// another twentieth of the drain's CPU). Apply is the only writer of a
    /// group's timers, so what this reads is what each first `get` would.
    fn prefetch(&mut self, entries: &[Entry]) -> io::Result<()> {
        let mut wanted: Vec<(Vec<u8>, &TimerKey)> = entries
            .iter()
            .filter_map(|e| match &e.payload {
                EntryPayload::Normal(proposal) => Some(proposal.commands.iter().filter_map(|c| c.key())),
                _ => None,
            })
            .flatten()
            .map(|key| (keys::timer_key(self.group, key), key))
            .collect();
        wanted.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        wanted.dedup_by(|a, b| a.0 == b.0);
        self.cache.reserve(wanted.len().min(MAX_OVERLAY_CAPACITY));
        let cf = self.store.cf(keys::CF_TIMERS);
        let found = self.store.db().batched_multi_get_cf(cf, wanted.iter().map(|(k, _)| k), true);
        for ((_, key), record) in wanted.iter().zip(found) {
            let record = decode_record(record.map_err(to_io)?.as_deref())?;
            self.cache.insert((*key).clone(), record);
        }
        Ok(())
    }

    /// Writes the row and index entries of every timer in `written` into
    /// the batch: from where they stood before the batch to its last record.
    ///
    /// The batch holds them column family by column family, each in key
    /// order. RocksDB inserts a batch into each memtable (a skip list) in
    /// batch order and starts every insert's search from where the last one
    /// ended; in the order of a hash map every insert searched from the top
    /// (a 200,000-timer drain spent about a tenth of the node's CPU in
    /// `InlineSkipList::RecomputeSpliceLevels` and its key comparisons).
    /// Every operation here is on a key of its own (a timer's row, and index
    /// keys that embed the timer's key; a due entry that only changes kind is
    /// one put, not a delete and a put of the same key), so their order
    /// changes nothing else.
    fn flush_rows(&mut self) -> io::Result<()> {
        let group = self.group;
        let written = std::mem::take(&mut self.written);
        let mut rows: Vec<(Vec<u8>, Option<Vec<u8>>)> = Vec::with_capacity(written.len());
        let mut due: Vec<(Vec<u8>, Option<Vec<u8>>)> = Vec::new();
        let mut retention: Vec<(Vec<u8>, Option<Vec<u8>>)> = Vec::new();
        for (key, (due_before, purge_before)) in written {
            let record = self.cache.get(&key).and_then(Option::as_ref);
            rows.push((keys::timer_key(group, &key), record.map(codec::encode).transpose()?));
            let due_after = record.and_then(TimerRecord::due);
            if due_before != due_after {
                // Same instant, another kind: the put below overwrites the
                // key, and a delete beside it could sort after the put.
                if let Some(before) = due_before.filter(|b| due_after.map(|a| a.at_ms) != Some(b.at_ms)) {
                    due.push((keys::time_index_key(group, before.at_ms, &key), None));
                }
                if let Some(after) = due_after {
                    due.push((keys::time_index_key(group, after.at_ms, &key), Some(keys::due_value(after.kind))));
                }
            }
            let purge_after = record.and_then(TimerRecord::purge_after_ms);
            if purge_before != purge_after {
                if let Some(at) = purge_before {
                    retention.push((keys::time_index_key(group, at, &key), None));
                }
                if let Some(at) = purge_after {
                    retention.push((keys::time_index_key(group, at, &key), Some(Vec::new())));
                }
            }
        }
        let batch = &mut self.batch;
        write_sorted(batch, self.store.cf(keys::CF_TIMERS), rows);
        write_sorted(batch, self.store.cf(keys::CF_DUE), due);
        write_sorted(batch, self.store.cf(keys::CF_RETENTION), retention);
        Ok(())
    }

    fn flush_horizon(&mut self) -> io::Result<()> {
        let cf = self.store.cf(keys::CF_HORIZON);
        for ((namespace, minute), delta) in std::mem::take(&mut self.horizon) {
            if delta == 0 {
                continue;
            }
            let key = keys::horizon_key(self.group, &namespace, minute);
            let current = match self.store.db().get_cf(cf, &key).map_err(to_io)? {
                Some(bytes) => u64::from_be_bytes(
                    bytes
                        .as_slice()
                        .try_into()
                        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "horizon counter"))?,
                ),
                None => 0,
            };
            let next = current.checked_add_signed(delta).ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "group {}: horizon counter {namespace}/{minute} would go from {current} by {delta}",
                        self.group
                    ),
                )
            })?;
            if next == 0 {
                self.batch.delete_cf(cf, key);
            } else {
                self.batch.put_cf(cf, key, next.to_be_bytes());
            }
        }
        Ok(())
    }
}

/// Puts (`Some`) and deletes (`None`) into one column family in key order:
/// RocksDB inserts a sorted run into the memtable's skip list with shorter
/// searches, and one key appears at most once per batch, so order among
/// equal keys never matters.
fn write_sorted(batch: &mut WriteBatch, cf: &rocksdb::ColumnFamily, mut rows: Vec<(Vec<u8>, Option<Vec<u8>>)>) {
    rows.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    for (key, value) in rows {
        match value {
            Some(value) => batch.put_cf(cf, key, value),
            None => batch.delete_cf(cf, key),
        }
    }
}

impl TimerTable for Overlay<'_> {
    type Error = io::Error;

    fn get(&mut self, key: &TimerKey) -> io::Result<Option<TimerRecord>> {
        if let Some(cached) = self.cache.get(key) {
            return Ok(cached.clone());
        }
        let cf = self.store.cf(keys::CF_TIMERS);
        let found = self.store.db().get_pinned_cf(cf, keys::timer_key(self.group, key)).map_err(to_io)?;
        let record = decode_record(found.as_deref())?;
        self.cache.insert(key.clone(), record.clone());
        Ok(record)
    }

    fn write(&mut self, key: &TimerKey, old: Option<&TimerRecord>, new: Option<&TimerRecord>) -> io::Result<()> {
        // The row and its index entries go into the batch once, at its end
        // (`flush_rows`); here only where they stood before the batch is
        // remembered, the first time the timer is written.
        if !self.written.contains_key(key) {
            let before = (old.and_then(TimerRecord::due), old.and_then(TimerRecord::purge_after_ms));
            self.written.insert(key.clone(), before);
        }
        // Index entries are derived from the record, so they change only when
        // the derived value changes; the fire loop hears of each change in
        // the entry that made it.
        let (before, after) = (old.and_then(TimerRecord::due), new.and_then(TimerRecord::due));
        if before != after {
            self.changes.push(IndexChange { key: key.clone(), due: after });
        }
        let (before, after) = (old.is_some_and(|r| r.due().is_some()), new.is_some_and(|r| r.due().is_some()));
        if before != after {
            *self.horizon.entry((key.namespace.clone(), keys::PENDING_MINUTE)).or_default() +=
                if after { 1 } else { -1 };
        }
        let (before, after) = (old.and_then(TimerRecord::horizon_minute), new.and_then(TimerRecord::horizon_minute));
        if before != after {
            if let Some(m) = before {
                *self.horizon.entry((key.namespace.clone(), m)).or_default() -= 1;
            }
            if let Some(m) = after {
                *self.horizon.entry((key.namespace.clone(), m)).or_default() += 1;
            }
        }
        self.cache.insert(key.clone(), new.cloned());
        Ok(())
    }
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachine {
    type SnapshotData = SnapshotFile;

    async fn build_snapshot(&mut self) -> Result<openraft::alias::SnapshotOf<TypeConfig, SnapshotFile>, io::Error> {
        let this = self.clone();
        tokio::task::spawn_blocking(move || {
            let dir = this.store.snapshot_dir(this.group);
            let group = this.group;
            let file = snapshot::build(&this.store, group, &dir, |get| {
                let read = |tag: u8| get(keys::CF_SM_META, &keys::tag_key(group, tag));
                let last_log_id: Option<LogId> = read(sm_meta::APPLIED)?.map(|b| codec::decode(&b)).transpose()?;
                let last_membership: StoredMembership =
                    read(sm_meta::MEMBERSHIP)?.map(|b| codec::decode(&b)).transpose()?.unwrap_or_default();
                Ok(SnapshotMeta { last_log_id, last_membership })
            })?;
            let header = file.verify()?;
            tracing::info!(group, bytes = file.len(), last = ?header.meta.last_log_id, "built snapshot");
            Ok(openraft::alias::SnapshotOf::<TypeConfig, SnapshotFile> { meta: header.meta, snapshot: file })
        })
        .await?
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotData = SnapshotFile;
    type SnapshotBuilder = Self;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), io::Error> {
        let applied = self.get_meta(sm_meta::APPLIED)?;
        let membership = self.get_meta(sm_meta::MEMBERSHIP)?.unwrap_or_default();
        Ok((applied, membership))
    }

    async fn apply<Strm>(&mut self, mut entries: Strm) -> Result<(), io::Error>
    where
        Strm: Stream<Item = Result<EntryResponder<TypeConfig>, io::Error>> + Unpin + OptionalSend,
    {
        let mut batch_entries = Vec::new();
        let mut responders = Vec::new();
        while let Some((entry, responder)) = entries.try_next().await? {
            batch_entries.push(entry);
            responders.push(responder);
        }
        let responses = self.apply_entries(batch_entries).await?;
        for (responder, response) in responders.into_iter().zip(responses) {
            if let Some(responder) = responder {
                responder.send(response);
            }
        }
        Ok(())
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn install_snapshot(&mut self, meta: &SnapshotMeta, snapshot: SnapshotFile) -> Result<(), io::Error> {
        let this = self.clone();
        let meta = meta.clone();
        tokio::task::spawn_blocking(move || {
            let started = std::time::Instant::now();
            let header = snapshot.verify()?;
            if header.meta != meta {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("snapshot file meta {:?} differs from the announced {:?}", header.meta, meta),
                ));
            }
            let dir = this.store.snapshot_dir(this.group);
            let retained = snapshot::retain(&snapshot, &header, &dir)?;
            snapshot::install(&this.store, this.group, &retained)?;
            snapshot::remove_older(&dir, retained.path())?;
            tracing::info!(
                group = this.group,
                last = ?meta.last_log_id,
                bytes = retained.len(),
                ms = started.elapsed().as_millis() as u64,
                "installed snapshot"
            );
            Ok(())
        })
        .await?
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> Result<Option<openraft::alias::SnapshotOf<TypeConfig, SnapshotFile>>, io::Error> {
        let dir = self.store.snapshot_dir(self.group);
        Ok(snapshot::current(&dir)?.map(|(file, header)| openraft::alias::SnapshotOf::<TypeConfig, SnapshotFile> {
            meta: header.meta,
            snapshot: file,
        }))
    }
}
