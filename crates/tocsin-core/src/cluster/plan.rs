//! What a cluster operation proposes: new shard targets by the token ring
//! ([`plan_add`], [`plan_remove`], [`plan_rebalance`], [`plan_move`]) and
//! the metadata group's voters ([`metadata_voters`]).

use std::collections::BTreeSet;

use crate::NodeId;
use crate::ShardId;
use crate::routing::Ring;

use super::ClusterMap;
use super::MAX_METADATA_VOTERS;
use super::MapError;
use super::NodeStatus;

pub(super) fn sorted(mut v: Vec<NodeId>) -> Vec<NodeId> {
    v.sort_unstable();
    v.dedup();
    v
}

/// New targets for some shards.
pub type Plan = Vec<(ShardId, Vec<NodeId>)>;

/// The targets that differ from the map's, by the ring over `nodes`, for
/// the shards whose ring placement passes `wanted`.
fn ring_plan(map: &ClusterMap, nodes: &BTreeSet<NodeId>, wanted: impl Fn(&[NodeId]) -> bool) -> Plan {
    let ring = Ring::new(nodes.iter().copied());
    let rf = (map.replication_factor as usize).min(nodes.len());
    (0..map.num_shards)
        .filter_map(|shard| {
            let to = sorted(ring.replicas(shard, rf));
            (wanted(&to) && to != map.replicas(shard) && !to.is_empty()).then_some((shard, to))
        })
        .collect()
}

/// Adding `new`: every shard the ring over the eligible nodes and `new`
/// places on `new` gets the ring's replica set. On a map whose targets
/// follow the ring, exactly one replica of each such shard moves to `new`.
pub fn plan_add(map: &ClusterMap, new: NodeId) -> Plan {
    let mut nodes = map.eligible();
    nodes.insert(new);
    ring_plan(map, &nodes, |to| to.contains(&new))
}

/// Removing `gone`: every shard with a replica on it gets, in its place,
/// the next node in ring order over the remaining eligible nodes that it
/// lacks (none if fewer nodes remain than replicas). Other shards stay.
pub fn plan_remove(map: &ClusterMap, gone: NodeId) -> Plan {
    let remaining: BTreeSet<NodeId> = map.eligible().into_iter().filter(|n| *n != gone).collect();
    let ring = Ring::new(remaining.iter().copied());
    let rf = (map.replication_factor as usize).min(remaining.len());
    (0..map.num_shards)
        .filter_map(|shard| {
            let from = map.replicas(shard);
            if !from.contains(&gone) {
                return None;
            }
            let mut to: Vec<NodeId> = from.iter().copied().filter(|n| *n != gone).collect();
            for n in ring.replicas(shard, remaining.len()) {
                if to.len() >= rf {
                    break;
                }
                if !to.contains(&n) {
                    to.push(n);
                }
            }
            Some((shard, sorted(to)))
        })
        .collect()
}

/// Rebalancing: every shard onto the ring's placement over the eligible
/// nodes.
pub fn plan_rebalance(map: &ClusterMap) -> Plan {
    ring_plan(map, &map.eligible(), |_| true)
}

/// Moving `shard`'s replica from `from` to `to`; `Ok(None)` if that is
/// already the target.
pub fn plan_move(
    map: &ClusterMap,
    shard: ShardId,
    from: NodeId,
    to: NodeId,
) -> Result<Option<(ShardId, Vec<NodeId>)>, MapError> {
    let current = map.replicas(shard);
    if shard >= map.num_shards {
        return Err(MapError::BadPlacement { shard, message: format!("there are only {} shards", map.num_shards) });
    }
    if current.contains(&to) && !current.contains(&from) {
        return Ok(None);
    }
    if !current.contains(&from) {
        return Err(MapError::BadPlacement { shard, message: format!("has no replica on node {from}") });
    }
    if current.contains(&to) {
        return Err(MapError::BadPlacement { shard, message: format!("already has a replica on node {to}") });
    }
    match map.status(to) {
        None => return Err(MapError::UnknownNode(to)),
        Some(s) if !s.may_hold_replicas() => {
            return Err(MapError::BadPlacement { shard, message: format!("node {to} is {}", s.name()) });
        }
        Some(_) => {}
    }
    let target = sorted(current.iter().copied().filter(|n| *n != from).chain([to]).collect());
    Ok(Some((shard, target)))
}

/// How many metadata voters a cluster of `nodes` active nodes has: all of
/// them up to [`MAX_METADATA_VOTERS`], odd above two, at least one.
pub fn metadata_voter_count(nodes: usize) -> usize {
    let size = nodes.clamp(1, MAX_METADATA_VOTERS);
    if size > 2 && size.is_multiple_of(2) { size - 1 } else { size }
}

/// The metadata group's voters as they should be: the current ones that
/// may still hold replicas, topped up from the active nodes (lowest id
/// first) to [`MAX_METADATA_VOTERS`], and kept odd above two (an even
/// count tolerates no more failures than the odd count below it).
pub fn metadata_voters(map: &ClusterMap, current: &[NodeId]) -> Vec<NodeId> {
    let active = map.with_status(NodeStatus::Active);
    let eligible = map.eligible();
    let size = metadata_voter_count(active.len());
    // Keep current voters (fewest changes), then add active nodes.
    let mut out: Vec<NodeId> = current.iter().copied().filter(|n| eligible.contains(n)).collect();
    out.sort_unstable();
    out.dedup();
    for n in &active {
        if out.len() >= size {
            break;
        }
        if !out.contains(n) {
            out.push(*n);
        }
    }
    // Too many (the cluster shrank): drop joining nodes first, then the
    // highest ids.
    while out.len() > size {
        let drop = out
            .iter()
            .copied()
            .filter(|n| !active.contains(n))
            .max()
            .or_else(|| out.iter().copied().max())
            .expect("out is not empty");
        out.retain(|n| *n != drop);
    }
    if out.is_empty() {
        // Nothing eligible (cannot happen on a valid map): keep what is.
        return sorted(current.to_vec());
    }
    sorted(out)
}
