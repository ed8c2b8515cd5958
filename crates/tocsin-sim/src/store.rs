//! In-memory openraft storage for a simulated node: the Raft log, the vote
//! and the timer state machine (tocsin-core's `apply_proposal` over a
//! `MemTable`).
//!
//! Everything durable lives in a [`Durable`] owned by the test, outside the
//! turmoil host, so a crashed and restarted host reopens what it had
//! acknowledged. The contract mirrors `tocsin-store`'s: an append is
//! acknowledged once it is in the log (the WAL sync, here immediate), a vote
//! before `save_vote` returns, and apply stores the timers and
//! `last_applied` together.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::io;
use std::ops::Bound;
use std::ops::RangeBounds;
use std::sync::Arc;
use std::sync::Mutex;

use futures::StreamExt as _;
use openraft::LogState;
use openraft::OptionalSend;
use openraft::RaftLogReader;
use openraft::RaftSnapshotBuilder;
use openraft::entry::RaftEntry;
use openraft::storage::EntryResponder;
use openraft::storage::IOFlushed;
use openraft::storage::RaftLogStorage;
use openraft::storage::RaftStateMachine;
use serde::Deserialize;
use serde::Serialize;
use tocsin_core::Command;
use tocsin_core::CommandResult;
use tocsin_core::ShardMeta;
use tocsin_core::TimerKey;
use tocsin_core::TimerRecord;
use tocsin_core::TimerTable;
use tocsin_core::command::ApplyResponse;
use tocsin_core::fire::IndexChange;
use tocsin_core::mem_table::MemTable;

use crate::types::Entry;
use crate::types::LogId;
use crate::types::SnapshotMeta;
use crate::types::StoredMembership;
use crate::types::TypeConfig;
use crate::types::Vote;

/// A timer whose `Fire` (under `epoch`) started an attempt or made it ready:
/// the leader delivers it.
#[derive(Clone, Debug)]
pub struct Dispatched {
    pub key: TimerKey,
    pub record: TimerRecord,
    pub epoch: u64,
}

/// One applied entry, as the leader's fire loop hears of it (the node's
/// `events.rs`).
#[derive(Clone, Debug)]
pub struct Applied {
    pub index: u64,
    pub changes: Vec<IndexChange>,
    pub dispatches: Vec<Dispatched>,
}

/// The applied state of the shard on one node.
#[derive(Clone, Debug, Default)]
pub struct SmState {
    pub table: MemTable,
    pub meta: ShardMeta,
    pub last_applied: Option<LogId>,
    pub membership: StoredMembership,
}

impl SmState {
    pub fn applied_index(&self) -> u64 {
        self.last_applied.map_or(0, |l| l.index())
    }

    /// I7's digest: a hash over every timer's key, due entry and state, and
    /// the shard's epoch.
    pub fn digest(&self) -> u64 {
        let mut h = xxhash_rust::xxh3::Xxh3::new();
        for (key, record) in &self.table.timers {
            h.update(format!("{key}|{:?}|{:?}|{}\n", record.due(), record.state, record.generation).as_bytes());
        }
        h.update(format!("epoch={}", self.meta.epoch).as_bytes());
        h.digest()
    }
}

/// What survives a crash of the node's host.
#[derive(Default)]
pub struct Durable {
    pub vote: Option<Vote>,
    pub committed: Option<LogId>,
    pub log: BTreeMap<u64, Entry>,
    pub last_purged: Option<LogId>,
    pub sm: SmState,
    pub snapshot: Option<(SnapshotMeta, Vec<u8>)>,
}

/// A snapshot's content: the timers, the meta (indexes are derived again).
#[derive(Serialize, Deserialize)]
struct SnapshotData {
    timers: Vec<(TimerKey, TimerRecord)>,
    meta: ShardMeta,
}

/// The rules' view of the table: writes go through `MemTable` and every
/// change of a timer's fire-time index entry is remembered, as the store's
/// overlay does.
struct Recording<'a> {
    table: &'a mut MemTable,
    changes: Vec<IndexChange>,
}

impl TimerTable for Recording<'_> {
    type Error = std::convert::Infallible;

    fn get(&mut self, key: &TimerKey) -> Result<Option<TimerRecord>, Self::Error> {
        self.table.get(key)
    }

    fn write(
        &mut self,
        key: &TimerKey,
        old: Option<&TimerRecord>,
        new: Option<&TimerRecord>,
    ) -> Result<(), Self::Error> {
        let (before, after) = (old.and_then(TimerRecord::due), new.and_then(TimerRecord::due));
        if before != after {
            self.changes.push(IndexChange { key: key.clone(), due: after });
        }
        self.table.write(key, old, new)
    }
}

/// Where applied entries go: the leader loop attaches a sender while it runs.
pub type EventSink = Arc<Mutex<Option<tokio::sync::mpsc::UnboundedSender<Applied>>>>;

/// The log store of one node.
#[derive(Clone)]
pub struct LogStore {
    pub durable: Arc<Mutex<Durable>>,
}

fn bounds(range: &impl RangeBounds<u64>) -> (Bound<u64>, Bound<u64>) {
    (range.start_bound().cloned(), range.end_bound().cloned())
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, io::Error> {
        let d = self.durable.lock().unwrap();
        Ok(d.log.range(bounds(&range)).map(|(_, e)| e.clone()).collect())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, io::Error> {
        Ok(self.durable.lock().unwrap().vote)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, io::Error> {
        let d = self.durable.lock().unwrap();
        let last = d.log.values().next_back().map(|e| e.log_id());
        Ok(LogState { last_log_id: last.or(d.last_purged), last_purged_log_id: d.last_purged })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), io::Error> {
        self.durable.lock().unwrap().vote = Some(*vote);
        Ok(())
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), io::Error> {
        self.durable.lock().unwrap().committed = committed;
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, io::Error> {
        Ok(self.durable.lock().unwrap().committed)
    }

    async fn append<I>(&mut self, entries: I, callback: IOFlushed<TypeConfig>) -> Result<(), io::Error>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        {
            let mut d = self.durable.lock().unwrap();
            for entry in entries {
                d.log.insert(entry.log_id().index(), entry);
            }
        }
        // Durable as soon as it is in the map: the map outlives the host.
        callback.io_completed(Ok(()));
        Ok(())
    }

    async fn truncate_after(&mut self, last_log_id: Option<LogId>) -> Result<(), io::Error> {
        let from = last_log_id.map_or(0, |id| id.index() + 1);
        let mut d = self.durable.lock().unwrap();
        d.log.split_off(&from);
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), io::Error> {
        let mut d = self.durable.lock().unwrap();
        d.last_purged = Some(log_id);
        let keep = d.log.split_off(&(log_id.index() + 1));
        d.log = keep;
        Ok(())
    }
}

/// The state machine of one node.
#[derive(Clone)]
pub struct StateMachine {
    pub durable: Arc<Mutex<Durable>>,
    pub events: EventSink,
}

impl StateMachine {
    /// Applies one normal entry with tocsin-core's rules; a broken invariant
    /// panics (the store would stop the group; the simulation reports it).
    fn apply_one(&self, d: &mut Durable, index: u64, proposal: &tocsin_core::Proposal) -> Vec<CommandResult> {
        let mut table = Recording { table: &mut d.sm.table, changes: Vec::new() };
        let results = match tocsin_core::apply::apply_proposal(&mut table, &mut d.sm.meta, index, proposal) {
            Ok(r) => r,
            Err(e) => panic!("apply failed at index {index}: {e}"),
        };
        let changes = table.changes;
        let dispatches: Vec<Dispatched> = proposal
            .commands
            .iter()
            .zip(&results)
            .filter_map(|(cmd, result)| match (cmd, result) {
                (Command::Fire { key, epoch, .. }, CommandResult::Dispatch { record }) => {
                    Some(Dispatched { key: key.clone(), record: record.clone(), epoch: *epoch })
                }
                _ => None,
            })
            .collect();
        if !changes.is_empty() || !dispatches.is_empty() {
            let sink = self.events.lock().unwrap();
            if let Some(tx) = sink.as_ref() {
                let _ = tx.send(Applied { index, changes, dispatches });
            }
        }
        results
    }
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachine {
    type SnapshotData = Vec<u8>;

    async fn build_snapshot(&mut self) -> Result<openraft::alias::SnapshotOf<TypeConfig, Vec<u8>>, io::Error> {
        let mut d = self.durable.lock().unwrap();
        let data = SnapshotData {
            timers: d.sm.table.timers.iter().map(|(k, r)| (k.clone(), r.clone())).collect(),
            meta: d.sm.meta.clone(),
        };
        let bytes = serde_json::to_vec(&data).map_err(io::Error::other)?;
        let last = d.sm.last_applied;
        let meta = SnapshotMeta { last_log_id: last, last_membership: d.sm.membership.clone() };
        d.snapshot = Some((meta.clone(), bytes.clone()));
        Ok(openraft::alias::SnapshotOf::<TypeConfig, Vec<u8>> { meta, snapshot: bytes })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotData = Vec<u8>;
    type SnapshotBuilder = Self;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), io::Error> {
        let d = self.durable.lock().unwrap();
        Ok((d.sm.last_applied, d.sm.membership.clone()))
    }

    async fn apply<Strm>(&mut self, mut entries: Strm) -> Result<(), io::Error>
    where
        Strm: futures::Stream<Item = Result<EntryResponder<TypeConfig>, io::Error>> + Unpin + OptionalSend,
    {
        while let Some(item) = entries.next().await {
            let (entry, responder) = item?;
            let log_id = entry.log_id();
            let response = {
                let mut d = self.durable.lock().unwrap();
                let results = match &entry.payload {
                    openraft::EntryPayload::Blank => Vec::new(),
                    openraft::EntryPayload::Normal(p) => self.apply_one(&mut d, log_id.index(), p),
                    openraft::EntryPayload::Membership(m) => {
                        d.sm.membership = StoredMembership::new(Some(log_id), m.clone());
                        Vec::new()
                    }
                };
                d.sm.last_applied = Some(log_id);
                ApplyResponse { results }
            };
            if let Some(responder) = responder {
                responder.send(response);
            }
        }
        Ok(())
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn install_snapshot(&mut self, meta: &SnapshotMeta, snapshot: Vec<u8>) -> Result<(), io::Error> {
        let data: SnapshotData = serde_json::from_slice(&snapshot).map_err(io::Error::other)?;
        let mut table = MemTable::default();
        for (key, record) in &data.timers {
            table.write(key, None, Some(record)).expect("infallible");
        }
        let mut d = self.durable.lock().unwrap();
        d.sm = SmState {
            table,
            meta: data.meta,
            last_applied: meta.last_log_id,
            membership: meta.last_membership.clone(),
        };
        d.snapshot = Some((meta.clone(), snapshot));
        // The leader loop re-reads the index after a jump (a snapshot moves
        // many timers at once); only followers install snapshots, and they
        // have no loop, so nothing to tell.
        Ok(())
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> Result<Option<openraft::alias::SnapshotOf<TypeConfig, Vec<u8>>>, io::Error> {
        let d = self.durable.lock().unwrap();
        Ok(d.snapshot
            .clone()
            .map(|(meta, snapshot)| openraft::alias::SnapshotOf::<TypeConfig, Vec<u8>> { meta, snapshot }))
    }
}
