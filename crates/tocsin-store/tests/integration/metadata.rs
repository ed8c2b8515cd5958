//! The metadata group's state machine on real RocksDB: cluster-map commands
//! apply through the same durable batch as shard commands, the map is read
//! back after the state machine is reopened, moves between databases by
//! snapshot, stays out of the shards'
//! key ranges, and a command of the wrong kind stops the group.

use openraft::RaftSnapshotBuilder;
use openraft::storage::RaftStateMachine;
use tocsin_core::Command;
use tocsin_core::CommandResult;
use tocsin_core::Proposal;
use tocsin_core::cluster::ClusterCommand;
use tocsin_core::cluster::ClusterOutcome;
use tocsin_core::cluster::MapChange;
use tocsin_core::cluster::MapError;
use tocsin_core::cluster::NewNode;
use tocsin_core::cluster::NodeStatus;
use tocsin_store::StateMachine;
use tocsin_store::keys::META_GROUP;

use crate::apply::sample_entries;
use crate::support;

fn cluster(index: u64, cmd: ClusterCommand) -> tocsin_store::Entry {
    support::entry(1, index, Proposal { now_ms: 1_000 + index, commands: vec![Command::Cluster(cmd)].into() })
}

fn node(id: u64) -> NewNode {
    NewNode { id, grpc_addr: format!("n{id}:7070"), http_addr: format!("n{id}:7071"), peer_addr: format!("n{id}:7072") }
}

fn outcome(responses: &[tocsin_core::command::ApplyResponse], i: usize) -> ClusterOutcome {
    match &responses[i].results[..] {
        [CommandResult::Cluster(o)] => o.clone(),
        other => panic!("unexpected results {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_map_is_applied_durably_and_travels_by_snapshot() {
    let (_dir, store) = support::open_store();

    // Phase: a shard group next door, so key ranges can be compared.
    let shard = StateMachine::open(store.clone(), 0).await.unwrap();
    support::apply(&shard, sample_entries(1, 20)).await;
    let shard_before = store.state_digest(0).unwrap();

    // Phase: bootstrap, add a node, and a stale change that is refused.
    let sm = StateMachine::open(store.clone(), META_GROUP).await.unwrap();
    assert_eq!(store.cluster_map().unwrap().epoch, 0, "no map before the bootstrap");
    let boot = ClusterCommand::Bootstrap {
        num_shards: 8,
        replication_factor: 3,
        nodes: (1..=3).map(node).collect(),
        cluster_id: "00000000000000aa".into(),
    };
    let add = ClusterCommand::Change(MapChange { expected_epoch: 1, add: vec![node(4)], ..Default::default() });
    let stale = ClusterCommand::Change(MapChange { expected_epoch: 1, add: vec![node(5)], ..Default::default() });
    let responses = support::apply(
        &sm,
        vec![support::membership_entry(1, 1, &[1, 2, 3]), cluster(2, boot.clone()), cluster(3, add), cluster(4, stale)],
    )
    .await;
    assert_eq!(outcome(&responses, 1), ClusterOutcome::Changed { epoch: 1 });
    assert_eq!(outcome(&responses, 2), ClusterOutcome::Changed { epoch: 2 });
    assert_eq!(
        outcome(&responses, 3),
        ClusterOutcome::Refused { epoch: 2, error: MapError::StaleEpoch { expected: 1, current: 2 } }
    );
    let map = store.cluster_map().unwrap();
    assert_eq!(map.epoch, 2);
    assert_eq!(map.status(4), Some(NodeStatus::Joining));
    assert_eq!(map.changed_at_ms, 1_003, "time comes from the entry, not a clock");
    assert_eq!(store.state_digest(0).unwrap(), shard_before, "the shard's range did not change");

    // Phase: reopen the state machine: the map and last_applied are stored.
    let mut sm = sm;
    let applied = support::applied(&mut sm).await;
    assert_eq!(applied.map(|id| id.index), Some(4));
    drop(sm);
    let mut sm = StateMachine::open(store.clone(), META_GROUP).await.unwrap();
    assert_eq!(store.cluster_map().unwrap(), map);
    assert_eq!(support::applied(&mut sm).await, applied);

    // Phase: a snapshot carries the map to another database.
    let snap = sm.build_snapshot().await.unwrap();
    let (_other_dir, other) = support::open_store();
    let mut other_sm = StateMachine::open(other.clone(), META_GROUP).await.unwrap();
    other_sm.install_snapshot(&snap.meta, snap.snapshot).await.unwrap();
    assert_eq!(other.cluster_map().unwrap(), map);
    assert_eq!(support::applied(&mut other_sm).await, applied);

    // Phase: dropping the metadata replica deletes the map.
    drop(other_sm);
    other.drop_group(META_GROUP).await.unwrap();
    assert_eq!(other.cluster_map().unwrap().epoch, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_of_the_wrong_kind_stops_the_group() {
    let (_dir, store) = support::open_store();
    // A timer command in the metadata log.
    let sm = StateMachine::open(store.clone(), META_GROUP).await.unwrap();
    let err = sm.apply_entries(sample_entries(1, 1)).await.unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidData, "{err}");
    assert_eq!(store.cluster_map().unwrap().epoch, 0);
    // A cluster command in a shard's log.
    let shard = StateMachine::open(store.clone(), 3).await.unwrap();
    let boot = ClusterCommand::Bootstrap {
        num_shards: 1,
        replication_factor: 1,
        nodes: vec![node(1)],
        cluster_id: "00000000000000bb".into(),
    };
    let err = shard.apply_entries(vec![cluster(1, boot)]).await.unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidData, "{err}");
    assert_eq!(store.cluster_map().unwrap().epoch, 0);
}
