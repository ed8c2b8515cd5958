//! Keeps shard leaderships spread evenly over the nodes.
//!
//! Every node computes the same preferred leader per shard
//! (`tocsin_core::routing::spread_leaders` over the ring's replica lists).
//! A node leading a shard whose preferred leader is another healthy, caught
//! up voter hands the leadership over, a few shards per round and each not
//! more often than the cooldown allows, so a node that restarts gets its
//! share back once it has caught up, and nothing flaps.
//!
//! Handing over is also how a node shuts down gracefully:
//! [`hand_over_all`] moves every leadership it holds to the best other
//! voter before the process exits, so a rolling restart costs no election
//! timeout.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use std::time::Instant;

use openraft::async_runtime::WatchReceiver as _;
use tocsin_core::ShardId;

use crate::node::NodeState;
use crate::shard::ShardCtx;

/// How long after a leadership change a shard is left alone.
const COOLDOWN: Duration = Duration::from_secs(10);
/// How far behind (in entries) a voter may be and still take leadership.
const MAX_LAG: u64 = 64;
/// How often the balancer looks, and how many leaderships it moves per
/// look. A handover costs the shard one epoch entry and a wheel rebuild on
/// the new leader (milliseconds), so a fresh cluster, where the first node
/// up wins most elections, is spread within a few seconds; a small batch
/// keeps the rebuilds from landing on the nodes all at once.
const ROUND: Duration = Duration::from_secs(1);
const MOVES_PER_ROUND: usize = 3;

/// Voters of `ctx`'s group that acknowledged a heartbeat recently and whose
/// log matches this leader's to within [`MAX_LAG`] entries.
pub fn healthy_voters(ctx: &ShardCtx) -> Vec<u64> {
    let m = ctx.raft.metrics().borrow_watched().clone();
    let last = m.last_log_index.unwrap_or(0);
    let Some(replication) = m.replication.as_ref() else { return Vec::new() };
    let heartbeats = m.heartbeat.clone().unwrap_or_default();
    m.membership_config
        .membership()
        .voter_ids()
        .filter(|id| *id != ctx.node_id)
        .filter(|id| {
            let matched = replication.get(id).cloned().flatten().map_or(0, |l| l.index);
            let fresh = heartbeats
                .get(id)
                .cloned()
                .flatten()
                .is_some_and(|t| openraft::Instant::elapsed(&t.into_inner()) < Duration::from_secs(1));
            fresh && matched + MAX_LAG >= last
        })
        .collect()
}

/// Runs the balancer until the node stops.
pub async fn run(node: Arc<NodeState>) {
    let mut last_move: BTreeMap<ShardId, Instant> = BTreeMap::new();
    loop {
        tokio::time::sleep(ROUND).await;
        if node.shutting_down() {
            return;
        }
        // Voter sets of the shards this node does not host come from the
        // other nodes (the view `reconcile.rs` refreshes); only needed once
        // the cluster has more nodes than replicas.
        let remote: Option<Vec<Vec<u64>>> = node
            .remote_view
            .read()
            .expect("view lock")
            .as_ref()
            .map(|view| view.shards.iter().map(|s| s.voters.clone()).collect());
        let preferred = preferred_leaders(&node, remote.as_deref());
        let mut moves = 0;
        for ctx in node.shards.all() {
            if ctx.epoch().is_none() {
                continue;
            }
            let Some(&Some(want)) = preferred.get(ctx.shard as usize) else { continue };
            if want == node.node_id || last_move.get(&ctx.shard).is_some_and(|t| t.elapsed() < COOLDOWN) {
                continue;
            }
            if !healthy_voters(&ctx).contains(&want) {
                continue;
            }
            tracing::info!(shard = ctx.shard, to = want, "handing leadership to the preferred node");
            last_move.insert(ctx.shard, Instant::now());
            let _ = ctx.raft.trigger().transfer_leader(want).await;
            moves += 1;
            if moves == MOVES_PER_ROUND {
                break;
            }
        }
    }
}

/// The preferred leader of each shard, spread over the current voter sets:
/// the same on every node that sees the same voter sets.
fn preferred_leaders(node: &NodeState, remote: Option<&[Vec<u64>]>) -> Vec<Option<u64>> {
    let placements: Vec<Vec<u64>> = (0..node.config.num_shards)
        .map(|shard| match node.shards.get(shard) {
            Some(ctx) => {
                let m = ctx.raft.metrics().borrow_watched().clone();
                m.membership_config.membership().voter_ids().collect()
            }
            None => remote.and_then(|r| r.get(shard as usize).cloned()).unwrap_or_default(),
        })
        .collect();
    tocsin_core::routing::spread_leaders(&placements)
}

/// Moves every leadership this node holds to a healthy voter, waiting up to
/// `timeout` in all; used before a graceful shutdown.
pub async fn hand_over_all(node: &NodeState, timeout: Duration) {
    let deadline = tokio::time::Instant::now() + timeout;
    let leading: Vec<Arc<ShardCtx>> = node.shards.all().into_iter().filter(|c| c.epoch().is_some()).collect();
    for ctx in &leading {
        if let Some(to) = healthy_voters(ctx.as_ref()).first() {
            let _ = ctx.raft.trigger().transfer_leader(*to).await;
        }
    }
    for ctx in leading {
        while ctx.raft.metrics().borrow_watched().current_leader == Some(node.node_id)
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}
