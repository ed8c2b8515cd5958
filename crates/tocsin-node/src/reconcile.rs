//! Keeps this node's replicas in line with the shards' committed
//! memberships, every [`ROUND`]:
//!
//! - refreshes the cluster view ([`crate::view`]) the balancer and request
//!   forwarding use;
//! - completes a membership change left in joint consensus (its leader was
//!   killed between the joint and the uniform entry) on shards this node
//!   leads, when no change is in progress;
//! - releases a replica whose shard moved on without it: a node that was
//!   down while it was removed keeps its copy, and the others no longer
//!   talk to it. Only when a newer *committed* membership names this node
//!   neither as voter nor learner, and the local replica is initialized (a
//!   replica being added starts uninitialized), so a replica that may still
//!   count towards a quorum is never dropped.

use std::sync::Arc;
use std::time::Duration;

use openraft::ChangeMembers;
use openraft::async_runtime::WatchReceiver as _;

use crate::node::NodeState;

/// How often the node reconciles.
const ROUND: Duration = Duration::from_secs(2);
/// Deadline of each other node's answer when the view is gathered.
const VIEW_TIMEOUT: Duration = Duration::from_secs(1);

/// Runs until the node stops.
pub async fn run(node: Arc<NodeState>) {
    loop {
        tokio::time::sleep(ROUND).await;
        if node.shutting_down() {
            return;
        }
        let view = crate::view::gather(&node, VIEW_TIMEOUT).await;
        for ctx in node.shards.all() {
            let m = ctx.raft.metrics().borrow_watched().clone();
            let membership = m.membership_config.membership();
            let leading = m.state == openraft::ServerState::Leader && m.current_leader == Some(node.node_id);
            if leading && membership.get_joint_config().len() > 1 {
                let Ok(_serial) = ctx.membership_change.try_lock() else { continue };
                let Some(target) = membership.get_joint_config().last().cloned() else { continue };
                tracing::info!(shard = ctx.shard, ?target, "completing a membership change left in joint consensus");
                if let Err(e) = ctx.raft.change_membership(ChangeMembers::ReplaceAllVoters(target), false).await {
                    tracing::warn!(shard = ctx.shard, error = %e, "completing the joint membership");
                }
                continue;
            }
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
        *node.remote_view.write().expect("view lock") = Some(view);
    }
}
