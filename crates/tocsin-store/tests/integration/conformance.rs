//! openraft's storage conformance suite, for one group alone in a database
//! and for a group sharing its database with a busy neighbour.

use std::sync::Arc;

use openraft::StorageError;
use openraft::testing::log::StoreBuilder;
use openraft::testing::log::Suite;
use tempfile::TempDir;
use tocsin_store::LogStore;
use tocsin_store::StateMachine;
use tocsin_store::Store;
use tocsin_store::StoreConfig;
use tocsin_store::TypeConfig;

use crate::support;

struct OneGroup;

impl StoreBuilder<TypeConfig, LogStore, StateMachine, TempDir> for OneGroup {
    async fn build(&self) -> Result<(TempDir, LogStore, StateMachine), StorageError<TypeConfig>> {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open(&StoreConfig::new(dir.path())).expect("open");
        let sm = StateMachine::open(store.clone(), 0).await.expect("sm");
        Ok((dir, LogStore::new(store, 0), sm))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn suite_one_group() {
    Suite::test_all(OneGroup).await.expect("conformance suite");
}

/// Holds the neighbour's fingerprint; on drop (after each suite case)
/// checks that nothing the suite did to group 5 touched group 4.
struct Neighbour {
    _dir: TempDir,
    store: Arc<Store>,
    before: (Vec<tocsin_store::Entry>, tocsin_store::StateDigest, Option<tocsin_store::LogId>),
}

impl Drop for Neighbour {
    fn drop(&mut self) {
        let store = self.store.clone();
        let after = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(fingerprint(&store))
        })
        .join()
        .unwrap();
        if !std::thread::panicking() {
            assert_eq!(after, self.before, "the conformance suite on group 5 changed group 4");
        }
    }
}

async fn fingerprint(
    store: &Arc<Store>,
) -> (Vec<tocsin_store::Entry>, tocsin_store::StateDigest, Option<tocsin_store::LogId>) {
    let mut log = LogStore::new(store.clone(), 4);
    let mut sm = StateMachine::open(store.clone(), 4).await.unwrap();
    (support::read_all(&mut log).await, store.state_digest(4).unwrap(), support::applied(&mut sm).await)
}

struct SharedDb;

impl StoreBuilder<TypeConfig, LogStore, StateMachine, Neighbour> for SharedDb {
    async fn build(&self) -> Result<(Neighbour, LogStore, StateMachine), StorageError<TypeConfig>> {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open(&StoreConfig::new(dir.path())).expect("open");
        // The neighbour, group 4, has a log and timers of its own.
        let mut log4 = LogStore::new(store.clone(), 4);
        let sm4 = StateMachine::open(store.clone(), 4).await.expect("sm");
        let entries = crate::apply::sample_entries(1, 20);
        support::append(&mut log4, entries.clone()).await;
        support::apply(&sm4, entries).await;
        let before = fingerprint(&store).await;
        assert!(before.1.timer_count > 0, "the neighbour holds timers");
        let sm = StateMachine::open(store.clone(), 5).await.expect("sm");
        let log = LogStore::new(store.clone(), 5);
        Ok((Neighbour { _dir: dir, store, before }, log, sm))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn suite_two_groups_sharing_one_db() {
    Suite::test_all(SharedDb).await.expect("conformance suite");
}
