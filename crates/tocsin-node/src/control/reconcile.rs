//! Keeps this node in line with the cluster map and the shards' committed
//! memberships, every [`ROUND`] (at once when a request showed it a newer
//! map epoch):
//!
//! - refreshes its cached cluster map, and every [`VIEW_EVERY_ROUNDS`]
//!   rounds the cluster view ([`crate::control::view`]) the balancer and request
//!   forwarding use;
//! - as a shard's leader, moves the shard's replicas to where the map says
//!   they belong when they differ ([`move_to_map`]): it reads the map at the
//!   metadata leader first, so a stale cache never moves anything, and runs
//!   at most `MOVES_AT_ONCE` moves at a time, so growing a cluster does not
//!   stream every snapshot at once;
//! - completes a membership change left in joint consensus (its leader was
//!   killed between the joint and the uniform entry) on shards this node
//!   leads, when no change is in progress;
//! - releases a replica whose shard moved on without it: a node that was
//!   down while it was removed keeps its copy, and the others no longer
//!   talk to it. Only when a newer *committed* membership names this node
//!   neither as voter nor learner, and the local replica is initialized (a
//!   replica being added starts uninitialized), so a replica that may still
//!   count towards a quorum is never dropped;
//! - as the metadata leader, runs [`crate::control::meta::drive`].

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use std::time::Instant;

use openraft::ChangeMembers;
use openraft::async_runtime::WatchReceiver as _;
use tocsin_core::cluster::ClusterMap;
use tocsin_store::NodeAddr;

use crate::control::replicas::Changed;
use crate::control::replicas::Group;
use crate::control::state::NodeState;
use crate::error::NodeError;
use crate::shard::ShardCtx;

/// How often the node reconciles.
const ROUND: Duration = Duration::from_secs(1);
/// How often it looks while it knows no cluster map yet.
const FIRST_MAP_POLL: Duration = Duration::from_millis(100);
/// Every how many rounds the cluster view is gathered from the other
/// nodes (one `GetShardMap` to each): moves need only local state and the
/// map, and the view's users can wait a little.
const VIEW_EVERY_ROUNDS: u64 = 2;
/// Deadline of each other node's answer when the view is gathered.
const VIEW_TIMEOUT: Duration = Duration::from_secs(1);
/// How long a shard whose move failed waits before the next attempt.
const RETRY_MOVE_AFTER: Duration = Duration::from_secs(3);

/// Runs until the node stops.
pub async fn run(node: Arc<NodeState>) {
    for round in 0u64.. {
        // A new cluster's metadata leader writes the first map as soon as
        // it is elected, not a round later.
        let wait = if node.map.get().is_bootstrapped() { ROUND } else { FIRST_MAP_POLL };
        tokio::select! {
            () = crate::grid::sleep_to_next_line(wait) => {}
            _ = node.map.stale.notified() => {}
        }
        if node.shutting_down() {
            return;
        }
        crate::control::meta::refresh(&node).await;
        let map = node.map.get();
        let view = if round.is_multiple_of(VIEW_EVERY_ROUNDS) {
            Some(crate::control::report::gather(&node, VIEW_TIMEOUT).await)
        } else {
            None
        };
        for ctx in node.shards.all() {
            let m = ctx.raft.metrics().borrow_watched().clone();
            let membership = m.membership_config.membership();
            if m.state == openraft::ServerState::Leader && m.current_leader == Some(node.node_id) {
                match membership.get_joint_config().as_slice() {
                    [_, target] => complete_joint(&ctx, target.clone()).await,
                    _ => maybe_move(&node, &ctx, &map),
                }
                continue;
            }
            let Some(view) = &view else { continue };
            let Some(local_index) = m.membership_config.log_id().as_ref().map(|l| l.index) else { continue };
            let Some(s) = view.shards.get(ctx.shard as usize) else { continue };
            let moved_on = !s.voters.is_empty()
                && s.membership_index > local_index
                && !s.voters.contains(&node.node_id)
                && !s.learners.contains(&node.node_id);
            if moved_on {
                tracing::warn!(
                    shard = ctx.shard,
                    local_index,
                    committed_index = s.membership_index,
                    voters = ?s.voters,
                    "the shard's committed membership no longer includes this node: releasing the stale replica"
                );
                if let Err(e) = node.release_shard(ctx.shard).await {
                    tracing::warn!(shard = ctx.shard, error = %e, "releasing a stale replica");
                }
            }
        }
        if let Some(view) = view {
            crate::control::meta::drive(&node, &view).await;
            *node.remote_view.write().expect("view lock") = Some(view);
        }
    }
}

/// Finishes a membership change its leader left in joint consensus, unless
/// a change of the shard is running here.
async fn complete_joint(ctx: &ShardCtx, target: std::collections::BTreeSet<u64>) {
    let Ok(_serial) = ctx.membership_change.try_lock() else { return };
    tracing::info!(shard = ctx.shard, ?target, "completing a membership change left in joint consensus");
    crate::shard::quiet::renew_lease(&ctx.raft).await;
    if let Err(e) = ctx.raft.change_membership(ChangeMembers::ReplaceAllVoters(target), false).await {
        tracing::warn!(shard = ctx.shard, error = %e, "completing the joint membership");
    }
}

/// Starts moving `ctx`'s replicas to the map's target if they differ, no
/// move of it is running, its last failure is old enough, and this node
/// has a move to spare.
fn maybe_move(node: &Arc<NodeState>, ctx: &Arc<ShardCtx>, map: &ClusterMap) {
    if !map.is_bootstrapped() || ctx.epoch().is_none() {
        return;
    }
    let target = map.replicas(ctx.shard);
    let (voters, strays) = {
        let m = ctx.raft.metrics().borrow_watched().clone();
        let membership = m.membership_config.membership();
        let mut v: Vec<u64> = membership.voter_ids().collect();
        v.sort_unstable();
        // Learners outside the target: voters a change left out (kept as
        // learners until released), whose removal a leader change cut short.
        let strays = membership.learner_ids().any(|id| !target.contains(&id));
        (v, strays)
    };
    if target.is_empty() || (voters == target && !strays) {
        ctx.move_error.lock().expect("move error lock").0.clear();
        return;
    }
    if ctx.moving.load(Ordering::SeqCst)
        || ctx.move_error.lock().expect("move error lock").1.is_some_and(|retry_at| Instant::now() < retry_at)
    {
        return;
    }
    let Ok(permit) = node.moves.clone().try_acquire_owned() else { return };
    ctx.moving.store(true, Ordering::SeqCst);
    let (node, ctx) = (node.clone(), ctx.clone());
    tokio::spawn(async move {
        let started = Instant::now();
        let result = move_to_map(&node, &ctx).await;
        let mut error = ctx.move_error.lock().expect("move error lock");
        match result {
            Ok(done) => {
                if done.changed {
                    tracing::info!(
                        shard = ctx.shard,
                        bytes_streamed = done.bytes_streamed,
                        took_ms = started.elapsed().as_millis() as u64,
                        "moved the shard's replicas to the cluster map's target"
                    );
                }
                *error = (String::new(), None);
            }
            // Left out of the target, this leader handed its leadership to
            // a new voter, which carries on.
            Err(NodeError::Unavailable { leader: Some(_), .. }) => *error = (String::new(), None),
            Err(e) => {
                tracing::warn!(shard = ctx.shard, error = %e, "moving the shard's replicas");
                *error = (e.to_string(), Some(Instant::now() + RETRY_MOVE_AFTER));
            }
        }
        drop(error);
        ctx.moving.store(false, Ordering::SeqCst);
        drop(permit);
    });
}

/// Reads the map at the metadata leader and makes its target for `ctx`'s
/// shard the voter set.
async fn move_to_map(node: &Arc<NodeState>, ctx: &Arc<ShardCtx>) -> Result<Changed, NodeError> {
    let map = crate::control::meta::read_latest(node).await?;
    let target: BTreeMap<u64, NodeAddr> = map
        .replicas(ctx.shard)
        .iter()
        .map(|id| {
            let n = map.nodes.get(id).ok_or_else(|| NodeError::Internal(format!("node {id} is not in the map")))?;
            Ok((*id, crate::control::map::node_addr(n)))
        })
        .collect::<Result<_, NodeError>>()?;
    crate::control::replicas::set_voters(node, &Group::Shard(ctx.clone()), target).await
}
