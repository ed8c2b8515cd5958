//! Groups sharing one database stay apart: purging, truncating,
//! snapshotting or installing into one never touches another. Snapshots
//! round-trip, and an interrupted install completes on reopen.

use openraft::RaftSnapshotBuilder;
use openraft::storage::RaftLogStorage;
use openraft::storage::RaftStateMachine;
use rocksdb::WriteBatch;
use tocsin_store::LogStore;
use tocsin_store::StateMachine;
use tocsin_store::codec;
use tocsin_store::keys;

use crate::apply::sample_entries;
use crate::support;

async fn fingerprint(
    store: &std::sync::Arc<tocsin_store::Store>,
    group: u64,
) -> (Vec<tocsin_store::Entry>, tocsin_store::StateDigest, Option<tocsin_store::LogId>) {
    let mut log = LogStore::new(store.clone(), group);
    let mut sm = StateMachine::open(store.clone(), group).await.unwrap();
    (support::read_all(&mut log).await, store.state_digest(group).unwrap(), support::applied(&mut sm).await)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_truncate_snapshot_and_install_stay_in_their_group() {
    let (_dir, store) = support::open_store();

    // Phase: two groups with their own logs and state.
    for group in [1u64, 2] {
        let mut log = LogStore::new(store.clone(), group);
        let sm = StateMachine::open(store.clone(), group).await.unwrap();
        let entries = sample_entries(1, 40);
        support::append(&mut log, entries.clone()).await;
        support::apply(&sm, entries).await;
    }
    let before = fingerprint(&store, 2).await;
    assert_eq!(before.0.len(), 40);

    // Phase: purge, truncate, snapshot group 1.
    let mut log1 = LogStore::new(store.clone(), 1);
    log1.purge(support::log_id(1, 1, 20)).await.unwrap();
    log1.truncate_after(Some(support::log_id(1, 1, 30))).await.unwrap();
    let remaining = support::read_all(&mut log1).await;
    assert_eq!(remaining.first().map(|e| e.log_id.index), Some(21));
    assert_eq!(remaining.last().map(|e| e.log_id.index), Some(30));
    let state = log1.get_log_state().await.unwrap();
    assert_eq!(state.last_purged_log_id.map(|id| id.index), Some(20));
    let mut sm1 = StateMachine::open(store.clone(), 1).await.unwrap();
    let snap = sm1.build_snapshot().await.unwrap();
    assert_eq!(fingerprint(&store, 2).await, before, "group 2 changed");

    // Phase: install group 1's snapshot into group 3; group 2 is untouched and
    // group 3 now equals group 1.
    let mut sm3 = StateMachine::open(store.clone(), 3).await.unwrap();
    sm3.install_snapshot(&snap.meta, snap.snapshot).await.unwrap();
    assert_eq!(store.state_digest(3).unwrap(), store.state_digest(1).unwrap());
    assert_eq!(store.scan_due(3, 0, u64::MAX, 1000).unwrap(), store.scan_due(1, 0, u64::MAX, 1000).unwrap());
    assert_eq!(store.shard_meta(3).unwrap(), store.shard_meta(1).unwrap());
    assert_eq!(support::applied(&mut sm3).await, support::applied(&mut sm1).await);
    assert_eq!(fingerprint(&store, 2).await, before, "group 2 changed");
    let current = sm3.get_current_snapshot().await.unwrap().expect("installed snapshot is current");
    assert_eq!(current.meta.last_log_id.map(|id| id.index), Some(40));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_moves_between_databases() {
    let (_a, leader) = support::open_store();
    let (_b, follower) = support::open_store();
    let mut sm = StateMachine::open(leader.clone(), 7).await.unwrap();
    support::apply(&sm, sample_entries(1, 300)).await;
    let snap = sm.build_snapshot().await.unwrap();
    assert!(snap.snapshot.len() > 300 * 100, "snapshot carries the payloads");

    // Phase: the follower had stale state of its own, which install replaces.
    let mut fsm = StateMachine::open(follower.clone(), 7).await.unwrap();
    support::apply(&fsm, sample_entries(1, 5)).await;
    fsm.install_snapshot(&snap.meta, snap.snapshot).await.unwrap();
    assert_eq!(follower.state_digest(7).unwrap(), leader.state_digest(7).unwrap());
    assert_eq!(
        follower.horizon_count(7, "orders", 0, u64::MAX / 60_000).unwrap(),
        leader.horizon_count(7, "orders", 0, u64::MAX / 60_000).unwrap()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_snapshot_is_refused_before_touching_state() {
    let (_dir, store) = support::open_store();
    let mut sm = StateMachine::open(store.clone(), 1).await.unwrap();
    support::apply(&sm, sample_entries(1, 50)).await;
    let snap = sm.build_snapshot().await.unwrap();

    let corrupt_path = store.path().join("corrupt.snap");
    let mut bytes = std::fs::read(snap.snapshot.path()).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x55;
    std::fs::write(&corrupt_path, bytes).unwrap();
    let corrupt = tocsin_store::SnapshotFile::open(&corrupt_path).unwrap();

    let before = store.state_digest(2).unwrap();
    let mut target = StateMachine::open(store.clone(), 2).await.unwrap();
    support::apply(&target, sample_entries(1, 3)).await;
    let before_install = store.state_digest(2).unwrap();
    assert_ne!(before, before_install);
    let err = target.install_snapshot(&snap.meta, corrupt).await.unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidData);
    assert_eq!(store.state_digest(2).unwrap(), before_install, "a refused snapshot changes nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interrupted_install_completes_on_reopen() {
    let (_dir, store) = support::open_store();
    let mut source = StateMachine::open(store.clone(), 1).await.unwrap();
    support::apply(&source, sample_entries(1, 60)).await;
    let snap = source.build_snapshot().await.unwrap();

    // Phase: group 2 holds other state, as a follower with an old log would.
    let stale = StateMachine::open(store.clone(), 2).await.unwrap();
    support::apply(&stale, sample_entries(1, 7)).await;
    drop(stale);
    assert_ne!(store.state_digest(2).unwrap(), store.state_digest(1).unwrap());

    // Phase: leave group 2 as a crash between "marker set" and "marker
    // cleared" would: the retained file is named by the marker, and the
    // group's range holds a mix that matches neither side.
    let header = snap.snapshot.verify().unwrap();
    let retained = tocsin_store::snapshot::retain(&snap.snapshot, &header, &store.snapshot_dir(2)).unwrap();
    let mut batch = WriteBatch::default();
    batch.put_cf(
        store.cf(keys::CF_SM_META),
        keys::tag_key(2, keys::sm_meta::INSTALLING),
        codec::encode(&retained.path().to_string_lossy().to_string()).unwrap(),
    );
    store.write_durable(batch).await.unwrap();
    assert!(tocsin_store::snapshot::interrupted_install(&store, 2).unwrap().is_some());

    // Phase: reopening group 2 finishes the install.
    let mut sm = StateMachine::open(store.clone(), 2).await.unwrap();
    assert!(tocsin_store::snapshot::interrupted_install(&store, 2).unwrap().is_none());
    assert_eq!(store.state_digest(2).unwrap(), store.state_digest(1).unwrap());
    assert_eq!(store.scan_due(2, 0, u64::MAX, 1000).unwrap(), store.scan_due(1, 0, u64::MAX, 1000).unwrap());
    assert_eq!(support::applied(&mut sm).await, support::applied(&mut source).await);
}

/// A data directory carries its store format: a format-7 directory (the
/// same bytes, before armed fires) is opened and marked 8, so a format-7
/// build no longer opens it; any other format is refused, naming both.
#[test]
fn a_format_7_directory_is_marked_8_and_another_format_is_refused() {
    use tocsin_store::db::STORE_FORMAT;
    use tocsin_store::db::UPGRADES_FROM;
    let format_key = keys::tag_key(keys::NODE_GROUP, keys::raft_meta::FORMAT);
    let set_format = |store: &tocsin_store::Store, format: u32| {
        let mut batch = WriteBatch::default();
        batch.put_cf(store.cf(keys::CF_RAFT_META), format_key, format.to_be_bytes());
        store.db().write(batch).unwrap();
        store.db().flush_wal(true).unwrap();
    };
    let stored = |store: &tocsin_store::Store| {
        let v = store.db().get_cf(store.cf(keys::CF_RAFT_META), format_key).unwrap().expect("a format");
        u32::from_be_bytes(v.as_slice().try_into().unwrap())
    };
    let (dir, store) = support::open_store();
    assert_eq!(stored(&store), STORE_FORMAT);
    set_format(&store, UPGRADES_FROM);
    drop(store);

    // Phase: reopened, the format-7 directory is marked 8.
    let config = tocsin_store::StoreConfig::new(dir.path());
    let store = tocsin_store::Store::open(&config).expect("a format-7 directory opens");
    assert_eq!(stored(&store), STORE_FORMAT);

    // Phase: an older format is refused, naming it and this build's.
    set_format(&store, UPGRADES_FROM - 1);
    drop(store);
    let err = tocsin_store::Store::open(&config).expect_err("format 6 is refused");
    let message = err.to_string();
    assert!(message.contains("store format 6") && message.contains(&format!("format {STORE_FORMAT}")), "{message}");
}
