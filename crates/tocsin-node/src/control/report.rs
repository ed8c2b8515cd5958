//! What this node reports about the cluster and itself: `ClusterInfo`
//! (its hosted shards' Raft metrics and counters) and its `ShardMap` (the
//! cluster map it caches, and the memberships of the groups it hosts),
//! which the admin API serves; and [`gather`], which asks every node for
//! its `ShardMap` and merges them into a `ClusterView`.

use openraft::async_runtime::WatchReceiver as _;
use std::collections::BTreeMap;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use tocsin_proto::v1 as pb;
use tocsin_proto::v1::admin_service_client::AdminServiceClient;
use tocsin_store::NodeAddr;
use tonic::transport::Channel;

use crate::control::state::NodeState;
use crate::control::view::ClusterView;

/// Every node the cluster map records, with its state, plus any other
/// node named in a hosted group's membership (before the map knows it).
fn nodes(node: &Arc<NodeState>) -> Vec<pb::NodeInfo> {
    let map = node.map.get();
    let mut nodes: BTreeMap<u64, pb::NodeInfo> = map
        .nodes
        .iter()
        .map(|(id, n)| {
            (
                *id,
                pb::NodeInfo {
                    node_id: *id,
                    grpc_addr: n.grpc_addr.clone(),
                    http_addr: n.http_addr.clone(),
                    peer_addr: n.peer_addr.clone(),
                    state: node_state(n.status) as i32,
                    reachable: false,
                    since_epoch: n.since_epoch,
                },
            )
        })
        .collect();
    for (id, addr) in node.peers() {
        nodes.entry(id).or_insert(pb::NodeInfo {
            node_id: id,
            grpc_addr: addr.grpc_addr,
            http_addr: addr.http_addr,
            peer_addr: addr.peer_addr,
            ..Default::default()
        });
    }
    // This node knows its own current address best, and answers.
    let me = nodes.entry(node.node_id).or_default();
    me.node_id = node.node_id;
    me.grpc_addr = node.self_addr.grpc_addr.clone();
    me.http_addr = node.self_addr.http_addr.clone();
    me.peer_addr = node.self_addr.peer_addr.clone();
    me.reachable = true;
    nodes.into_values().collect()
}

/// Cluster info, with each hosted shard's state digest if asked.
pub async fn cluster_info_with_digests(node: &Arc<NodeState>) -> pb::ClusterInfo {
    let mut info = cluster_info(node).await;
    for status in &mut info.shards {
        let Ok(ctx) = node.shard(status.shard) else { continue };
        let store = ctx.store.clone();
        let group = ctx.group;
        if let Ok(Ok(d)) = tokio::task::spawn_blocking(move || store.state_digest(group)).await {
            status.state_digest = d.digest;
            status.timer_count = d.timer_count;
            status.digest_applied_index = d.applied_index;
        }
    }
    info
}

pub async fn cluster_info(node: &Arc<NodeState>) -> pb::ClusterInfo {
    let map = node.fresh_map().await;
    let mut shards = Vec::new();
    let ctxs = node.shards.all();
    // RocksDB reads, off the async workers, in one blocking task for every
    // shard: a task each was 16 wake-ups of the blocking pool per call,
    // and every node answers each peer's view every other second, idle or
    // not (`reconcile.rs`).
    let reads: Vec<_> = ctxs.iter().map(|ctx| (ctx.store.clone(), ctx.group)).collect();
    let metas = tokio::task::spawn_blocking(move || {
        reads.iter().map(|(store, group)| store.shard_meta(*group).unwrap_or_default()).collect::<Vec<_>>()
    })
    .await
    .unwrap_or_default();
    for (i, ctx) in ctxs.iter().enumerate() {
        let m = ctx.raft.metrics().borrow_watched().clone();
        let membership = m.membership_config.membership();
        let meta = metas.get(i).cloned().unwrap_or_default();
        let lag = m
            .replication
            .as_ref()
            .map(|r| {
                let last = m.last_log_index.unwrap_or(0);
                r.iter()
                    .map(|(id, matched)| (*id, last.saturating_sub(matched.as_ref().map_or(0, |l| l.index))))
                    .collect()
            })
            .unwrap_or_default();
        shards.push(pb::ShardStatus {
            shard: ctx.shard,
            replicas: membership.voter_ids().collect(),
            learners: membership.learner_ids().collect(),
            leader: m.current_leader.unwrap_or(0),
            term: m.current_term,
            epoch: meta.epoch,
            committed_index: m.local_committed.map_or(0, |l| l.index),
            applied_index: m.last_applied.map_or(0, |l| l.index),
            lag,
            pending_timers: meta.scheduled,
            firing_timers: meta.firing,
            wheel_size: 0,
            lateness_ms_p99: ctx.lateness_ms_p99(),
            state_digest: 0,
            timer_count: 0,
            digest_applied_index: 0,
            target: map.replicas(ctx.shard).to_vec(),
            shard_epoch: map.shard_epoch(ctx.shard),
            move_error: ctx.move_error(),
            snapshot_bytes_sent: node.router.snapshot_bytes(ctx.group),
        });
    }
    pb::ClusterInfo {
        node_id: node.node_id,
        map_epoch: map.epoch,
        num_shards: node.config.num_shards,
        nodes: nodes(node),
        shards,
        metadata: Some(node.meta_status()),
        cluster_id: map.cluster_id.clone(),
    }
}

/// Every shard: its target and placement epoch from the cluster map,
/// and, for the shards this node hosts, the committed membership and
/// the leader as this node knows them.
pub async fn shard_map(node: &Arc<NodeState>) -> pb::ShardMap {
    let info = cluster_info(node).await;
    let map = node.map.get();
    let ring = if map.is_bootstrapped() {
        map.ring.clone()
    } else {
        tocsin_core::routing::Ring::new(info.nodes.iter().map(|n| n.node_id)).tokens().to_vec()
    };
    let hosted: BTreeMap<u32, pb::ShardStatus> = info.shards.into_iter().map(|s| (s.shard, s)).collect();
    let shards = (0..info.num_shards)
        .map(|shard| {
            let mut p = pb::ShardPlacement {
                shard,
                target: map.replicas(shard).to_vec(),
                shard_epoch: map.shard_epoch(shard),
                ..Default::default()
            };
            let (Some(s), Ok(ctx)) = (hosted.get(&shard), node.shard(shard)) else { return p };
            // A leader cut off from its quorum must not keep attracting
            // clients: report the leader as unknown instead.
            let cut_off = s.leader == node.node_id && ctx.proposer.quorum_lost();
            p.leader = if cut_off { 0 } else { s.leader };
            p.term = s.term;
            // The last committed membership, and its log index: newer
            // replica sets have higher ones (see `view.rs`).
            let m = ctx.raft.metrics().borrow_watched().clone();
            let committed = m.committed_membership_config.clone();
            p.replicas = committed.membership().voter_ids().collect();
            p.learners = committed.membership().learner_ids().collect();
            p.membership_index = committed.log_id().as_ref().map_or(0, |l| l.index);
            p.move_error = s.move_error.clone();
            p.snapshot_bytes_sent = s.snapshot_bytes_sent;
            p
        })
        .collect();
    pb::ShardMap {
        epoch: info.map_epoch,
        num_shards: info.num_shards,
        nodes: info.nodes,
        ring: ring.iter().map(|(token, node)| pb::RingToken { token: *token, node_id: *node }).collect(),
        shards,
        metadata: info.metadata,
    }
}

/// The wire form of a node's state.
pub fn node_state(status: tocsin_core::cluster::NodeStatus) -> pb::node_info::State {
    use tocsin_core::cluster::NodeStatus;
    match status {
        NodeStatus::Joining => pb::node_info::State::Joining,
        NodeStatus::Active => pb::node_info::State::Active,
        NodeStatus::Draining => pb::node_info::State::Draining,
        NodeStatus::Removed => pb::node_info::State::Removed,
    }
}

/// Asks this node and every node it learns of (two rounds) for their shard
/// maps, each within `timeout`, and merges the answers.
pub async fn gather(node: &Arc<NodeState>, timeout: Duration) -> ClusterView {
    let num_shards = node.config.num_shards;
    let mut view = ClusterView::empty(num_shards);
    let local = shard_map(node).await;
    view.merge(node.node_id, &local);
    // Peers this node has talked to, even if it hosts no shard with them
    // any more (a drained node still finds the others), except removed
    // ones.
    let map = node.map.get();
    for (id, addr) in node.router.known() {
        if map.status(id) != Some(tocsin_core::cluster::NodeStatus::Removed) {
            view.nodes.entry(id).or_insert(NodeAddr { peer_addr: addr, ..NodeAddr::default() });
        }
    }
    let mut asked: BTreeSet<u64> = BTreeSet::from([node.node_id]);
    for _round in 0..2 {
        let targets: Vec<(u64, String)> = view
            .nodes
            .iter()
            .filter(|(id, a)| !asked.contains(id) && !a.peer_addr.is_empty())
            .map(|(id, a)| (*id, a.peer_addr.clone()))
            .collect();
        if targets.is_empty() {
            break;
        }
        let answers = futures::future::join_all(targets.iter().map(|(id, addr)| {
            let channel = node.forwarder.channel(addr);
            let id = *id;
            async move { (id, fetch_map(channel, timeout).await) }
        }))
        .await;
        for (id, answer) in answers {
            asked.insert(id);
            if let Some(map) = answer {
                view.merge(id, &map);
            }
        }
    }
    view
}

/// One node's shard map over its cached channel, or `None` if it did not
/// answer in time. The view is refreshed every few seconds on every node,
/// so it reuses connections rather than opening new ones.
async fn fetch_map(channel: Option<Channel>, timeout: Duration) -> Option<pb::ShardMap> {
    let mut admin = AdminServiceClient::new(channel?);
    let call = admin.get_shard_map(pb::GetShardMapRequest {});
    tokio::time::timeout(timeout, call).await.ok()?.ok().map(|r| r.into_inner())
}
