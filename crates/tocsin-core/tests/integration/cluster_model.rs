//! The cluster map's rules and planners under random operation sequences:
//! whatever operators do, in whatever order, every map keeps its rules, the
//! epoch rises by exactly one per applied change, a refused command changes
//! nothing, a removed id never comes back, and each planner's plan applies
//! and leaves nothing more to plan.

use std::collections::BTreeSet;

use proptest::prelude::*;
use tocsin_core::cluster::ClusterCommand;
use tocsin_core::cluster::ClusterMap;
use tocsin_core::cluster::ClusterOutcome;
use tocsin_core::cluster::MapChange;
use tocsin_core::cluster::NewNode;
use tocsin_core::cluster::NodeStatus;
use tocsin_core::cluster::apply_cluster;
use tocsin_core::cluster::plan_add;
use tocsin_core::cluster::plan_move;
use tocsin_core::cluster::plan_rebalance;
use tocsin_core::cluster::plan_remove;

const SHARDS: u32 = 24;

#[derive(Clone, Debug)]
enum Op {
    /// `node add` of a node with this id.
    Add(u64),
    /// `node remove` / `decommission`: drain, then mark removed.
    Remove(u64),
    Move {
        shard: u32,
        from: u64,
        to: u64,
    },
    Rebalance,
    /// An arbitrary change, planned against `epoch_lag` epochs ago: what a
    /// buggy or racing operator might send.
    Junk {
        epoch_lag: u64,
        status: Vec<(u64, u8)>,
        placements: Vec<(u32, Vec<u64>)>,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let id = 1u64..10;
    prop_oneof![
        3 => id.clone().prop_map(Op::Add),
        2 => id.clone().prop_map(Op::Remove),
        2 => (0..SHARDS, id.clone(), id.clone()).prop_map(|(shard, from, to)| Op::Move { shard, from, to }),
        1 => Just(Op::Rebalance),
        2 => (
            0u64..2,
            prop::collection::vec((id.clone(), 0u8..4), 0..3),
            prop::collection::vec((0..SHARDS + 1, prop::collection::vec(id, 0..5)), 0..3)
        )
            .prop_map(|(epoch_lag, status, placements)| Op::Junk { epoch_lag, status, placements }),
    ]
}

fn new_node(id: u64) -> NewNode {
    NewNode {
        id,
        grpc_addr: format!("10.0.0.{id}:7070"),
        http_addr: format!("10.0.0.{id}:7071"),
        peer_addr: format!("10.0.0.{id}:7072"),
    }
}

fn status_of(code: u8) -> NodeStatus {
    [NodeStatus::Joining, NodeStatus::Active, NodeStatus::Draining, NodeStatus::Removed][code as usize % 4]
}

/// Applies `change` and checks what every command must do to the epoch.
fn apply(map: &mut ClusterMap, change: MapChange, now_ms: u64) -> ClusterOutcome {
    let before = map.clone();
    let outcome = apply_cluster(map, &ClusterCommand::Change(change), now_ms).expect("the map stays valid");
    match &outcome {
        ClusterOutcome::Changed { epoch } => {
            assert_eq!(*epoch, before.epoch + 1);
            assert_eq!(map.epoch, *epoch);
            assert_ne!(*map, before);
        }
        ClusterOutcome::Unchanged { epoch } | ClusterOutcome::Refused { epoch, .. } => {
            assert_eq!(*epoch, before.epoch);
            assert_eq!(*map, before, "{outcome:?} changed the map");
        }
    }
    map.check().expect("every map keeps the rules");
    outcome
}

fn assert_changed_or_unchanged(outcome: &ClusterOutcome, what: &str) {
    assert!(!matches!(outcome, ClusterOutcome::Refused { .. }), "{what} was refused: {outcome:?}");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn any_sequence_of_operations_keeps_the_map_valid(ops in prop::collection::vec(op(), 1..40)) {
        let mut map = ClusterMap::default();
        let boot = ClusterCommand::Bootstrap {
            num_shards: SHARDS,
            replication_factor: 3,
            nodes: (1..=3).map(new_node).collect(),
            cluster_id: "0123456789abcdef".into(),
        };
        prop_assert_eq!(apply_cluster(&mut map, &boot, 1).unwrap(), ClusterOutcome::Changed { epoch: 1 });
        let mut removed: BTreeSet<u64> = BTreeSet::new();
        for (step, op) in ops.into_iter().enumerate() {
            let now_ms = 1_000 + step as u64;
            match op {
                Op::Add(id) => {
                    let plan = plan_add(&map, id);
                    let change = MapChange { expected_epoch: map.epoch, add: vec![new_node(id)], placements: plan, ..Default::default() };
                    let outcome = apply(&mut map, change, now_ms);
                    if removed.contains(&id) {
                        prop_assert!(matches!(outcome, ClusterOutcome::Refused { .. }), "a removed id came back: {:?}", outcome);
                        continue;
                    }
                    if map.status(id) == Some(NodeStatus::Draining) {
                        continue;
                    }
                    assert_changed_or_unchanged(&outcome, "a node add");
                    prop_assert!(plan_add(&map, id).is_empty(), "planning the add again proposes more");
                    // The node is placed; mark it active as the operation would.
                    let activate = MapChange { expected_epoch: map.epoch, status: vec![(id, NodeStatus::Active)], ..Default::default() };
                    assert_changed_or_unchanged(&apply(&mut map, activate, now_ms), "activating");
                }
                Op::Remove(id) => {
                    let Some(status) = map.status(id) else { continue };
                    if status == NodeStatus::Removed || map.eligible().len() <= 1 || !status.may_hold_replicas() {
                        continue;
                    }
                    let plan = plan_remove(&map, id);
                    let drain = MapChange { expected_epoch: map.epoch, status: vec![(id, NodeStatus::Draining)], placements: plan, ..Default::default() };
                    assert_changed_or_unchanged(&apply(&mut map, drain, now_ms), "a drain");
                    prop_assert!(map.shards_on(id).is_empty(), "the drained node still holds {:?}", map.shards_on(id));
                    let rf = 3.min(map.eligible().len());
                    for shard in 0..SHARDS {
                        prop_assert!(!map.replicas(shard).is_empty() && map.replicas(shard).len() <= rf);
                    }
                    let remove = MapChange { expected_epoch: map.epoch, status: vec![(id, NodeStatus::Removed)], ..Default::default() };
                    assert_changed_or_unchanged(&apply(&mut map, remove, now_ms), "a removal");
                    removed.insert(id);
                }
                Op::Move { shard, from, to } => {
                    if let Ok(Some(planned)) = plan_move(&map, shard, from, to) {
                        let change = MapChange { expected_epoch: map.epoch, placements: vec![planned], ..Default::default() };
                        assert_changed_or_unchanged(&apply(&mut map, change, now_ms), "a shard move");
                        prop_assert!(map.replicas(shard).contains(&to) && !map.replicas(shard).contains(&from));
                    }
                }
                Op::Rebalance => {
                    let change = MapChange { expected_epoch: map.epoch, placements: plan_rebalance(&map), ..Default::default() };
                    assert_changed_or_unchanged(&apply(&mut map, change, now_ms), "a rebalance");
                    prop_assert!(plan_rebalance(&map).is_empty());
                    let rf = 3.min(map.eligible().len());
                    for shard in 0..SHARDS {
                        prop_assert_eq!(map.replicas(shard).len(), rf);
                    }
                }
                Op::Junk { epoch_lag, status, placements } => {
                    let change = MapChange {
                        expected_epoch: map.epoch.saturating_sub(epoch_lag),
                        status: status.into_iter().map(|(id, s)| (id, status_of(s))).collect(),
                        placements,
                        ..Default::default()
                    };
                    apply(&mut map, change, now_ms);
                    // A junk change may remove a node that holds nothing.
                    removed.extend(map.with_status(NodeStatus::Removed));
                }
            }
            for id in &removed {
                prop_assert_eq!(map.status(*id), Some(NodeStatus::Removed), "removed node {} came back", id);
            }
            prop_assert!(map.changed_at_ms <= now_ms);
        }
    }
}
