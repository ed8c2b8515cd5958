//! Shared helpers: opening stores, making entries and proposals.

use std::sync::Arc;

use openraft::EntryPayload;
use openraft::Membership;
use openraft::RaftLogReader;
use openraft::storage::RaftLogStorage;
use openraft::storage::RaftStateMachine;
use tempfile::TempDir;
use tocsin_core::Proposal;
use tocsin_store::Entry;
use tocsin_store::LogId;
use tocsin_store::LogStore;
use tocsin_store::StateMachine;
use tocsin_store::Store;
use tocsin_store::StoreConfig;

pub fn open_store() -> (TempDir, Arc<Store>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(&StoreConfig::new(dir.path())).expect("open store");
    (dir, store)
}

pub fn log_id(term: u64, node: u64, index: u64) -> LogId {
    openraft::testing::log_id::<tocsin_store::TypeConfig>(term, node, index)
}

pub fn entry(term: u64, index: u64, proposal: Proposal) -> Entry {
    Entry { log_id: log_id(term, 1, index), payload: EntryPayload::Normal(proposal) }
}

pub fn membership_entry(term: u64, index: u64, voters: &[u64]) -> Entry {
    let voters = std::collections::BTreeSet::from_iter(voters.iter().copied());
    Entry {
        log_id: log_id(term, 1, index),
        payload: EntryPayload::Membership(Membership::new_with_defaults(vec![voters], [])),
    }
}

/// Applies `entries` to `sm` and returns each entry's response.
pub async fn apply(sm: &StateMachine, entries: Vec<Entry>) -> Vec<tocsin_core::command::ApplyResponse> {
    sm.apply_entries(entries).await.expect("apply")
}

/// Appends `entries` to `log` and waits for the durability callback.
pub async fn append(log: &mut LogStore, entries: Vec<Entry>) {
    let (tx, rx) = <tocsin_store::TypeConfig as openraft::type_config::TypeConfigExt>::oneshot();
    let callback = openraft::storage::IOFlushed::<tocsin_store::TypeConfig>::signal(tx);
    log.append(entries, callback).await.expect("append");
    rx.await.expect("callback").expect("durable");
}

pub async fn read_all(log: &mut LogStore) -> Vec<Entry> {
    log.try_get_log_entries(0..).await.expect("read")
}

pub async fn applied(sm: &mut StateMachine) -> Option<LogId> {
    sm.applied_state().await.expect("applied state").0
}
