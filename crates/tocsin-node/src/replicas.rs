//! Moving a shard's replicas: the `ReplicaControl` service, and the leader's
//! side of changing a shard's voter set.
//!
//! A change to shard S's voters, as its leader carries it out
//! ([`set_replicas`]), is:
//!
//! 1. each new node hosts an empty replica of S (`HostShard`);
//! 2. the leader adds it as a learner and waits until it has caught up,
//!    by snapshot where the log was purged (`add_learner`, blocking);
//! 3. one joint-consensus change makes the target set the voters
//!    (`change_membership`), and the committed result is checked;
//! 4. each node left out drops its replica and data (`ReleaseShard`).
//!
//! Every step is idempotent, so an interrupted change (an admin command
//! cut off, or a leader killed between the joint and the uniform entry) is
//! completed by sending the same target again. Changes to one shard are
//! serialized by [`crate::shard::ShardCtx::membership_change`]. A leader
//! that is itself left out hands its leadership to a new voter first and
//! answers with that leader as the hint.

use std::collections::BTreeMap;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use openraft::ChangeMembers;
use openraft::async_runtime::WatchReceiver as _;
use tocsin_core::ShardId;
use tocsin_proto::v1 as pb;
use tocsin_proto::v1::replica_control_client::ReplicaControlClient;
use tocsin_store::NodeAddr;
use tonic::transport::Channel;
use tonic::transport::Endpoint;

use crate::api::error::ApiError;
use crate::node::NodeState;
use crate::proposer::ProposeError;
use crate::proposer::to_propose_error;
use crate::shard::ShardCtx;

/// How long a new replica may take to catch up before the change gives up
/// (it can be re-run; the learner keeps what it received).
const CATCH_UP_TIMEOUT: Duration = Duration::from_secs(300);
/// Deadline of the small node-to-node calls (host, release).
const CONTROL_RPC_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a leader that is left out waits for its handover.
const HANDOVER_TIMEOUT: Duration = Duration::from_secs(3);

/// A `ReplicaControl` client for `addr`, with `timeout` on every call.
pub async fn control_client(addr: &str, timeout: Duration) -> Result<ReplicaControlClient<Channel>, ApiError> {
    let endpoint = Endpoint::from_shared(format!("http://{addr}"))
        .map_err(|e| ApiError::invalid("grpc_addr", format!("{addr:?} is not an address: {e}")))?
        .connect_timeout(Duration::from_secs(2))
        .timeout(timeout)
        .tcp_nodelay(true);
    let channel =
        endpoint.connect().await.map_err(|e| ApiError::unavailable(format!("cannot reach {addr}: {e}"), 500))?;
    Ok(ReplicaControlClient::new(channel))
}

fn not_leader(ctx: &ShardCtx) -> ApiError {
    ApiError::from_propose(ctx.shard, ProposeError::NotLeader { leader: ctx.leader_hint() })
}

fn raft_error(
    ctx: &ShardCtx,
    what: &str,
    e: openraft::error::RaftError<
        tocsin_store::TypeConfig,
        openraft::error::ClientWriteError<tocsin_store::TypeConfig>,
    >,
) -> ApiError {
    match to_propose_error(e) {
        e @ (ProposeError::NotLeader { .. } | ProposeError::Discarded { .. }) => ApiError::from_propose(ctx.shard, e),
        other => ApiError::unavailable(format!("{what} of shard {} failed: {other}", ctx.shard), 500),
    }
}

fn is_leader(node: &NodeState, ctx: &ShardCtx) -> bool {
    let m = ctx.raft.metrics().borrow_watched().clone();
    m.state == openraft::ServerState::Leader && m.current_leader == Some(node.node_id)
}

/// The leader's side: makes `target` the voters of `shard` (see the module
/// doc).
pub async fn set_replicas(
    node: &Arc<NodeState>,
    shard: ShardId,
    target: BTreeMap<u64, NodeAddr>,
) -> Result<pb::SetReplicasResponse, ApiError> {
    if shard >= node.config.num_shards {
        return Err(ApiError::invalid("shard", format!("must be below {}", node.config.num_shards)));
    }
    if target.is_empty() {
        return Err(ApiError::invalid("voters", "must name at least one node"));
    }
    if let Some((id, _)) = target.iter().find(|(id, a)| **id == 0 || a.grpc_addr.is_empty()) {
        return Err(ApiError::invalid("voters", format!("node {id} needs an id above 0 and a grpc address")));
    }
    let ctx = node.shard(shard)?;
    let _serial = ctx.membership_change.lock().await;
    if !is_leader(node, &ctx) {
        return Err(not_leader(&ctx));
    }
    let want: BTreeSet<u64> = target.keys().copied().collect();
    let (current, joint, mut left_out) = {
        let m = ctx.raft.metrics().borrow_watched().clone();
        let membership = m.membership_config.membership();
        let current = membership.voter_ids().collect::<BTreeSet<u64>>();
        // Where the replicas left out live, read before the change drops
        // them from the membership.
        let left_out: BTreeMap<u64, NodeAddr> =
            current.difference(&want).map(|id| (*id, membership.get_node(id).cloned().unwrap_or_default())).collect();
        (current, membership.get_joint_config().len() > 1, left_out)
    };
    if current == want && !joint {
        return Ok(pb::SetReplicasResponse { voters: want.into_iter().collect(), bytes_streamed: 0, changed: false });
    }

    if !want.contains(&node.node_id)
        && let Some(to) = crate::balance::healthy_voters(&ctx).into_iter().find(|id| want.contains(id))
    {
        tracing::info!(shard, to, "left out of the new voter set: handing the leadership over first");
        let _ = ctx.raft.trigger().transfer_leader(to).await;
        let deadline = tokio::time::Instant::now() + HANDOVER_TIMEOUT;
        while is_leader(node, &ctx) && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        return Err(not_leader(&ctx));
    }

    let bytes_before = node.router.snapshot_bytes(ctx.group);
    for (id, addr) in target.iter().filter(|(id, _)| !current.contains(id)) {
        if *id != node.node_id {
            let mut client = control_client(&addr.grpc_addr, CONTROL_RPC_TIMEOUT).await?;
            client.host_shard(pb::HostShardRequest { shard }).await.map_err(|s| {
                ApiError::unavailable(format!("node {id} could not host shard {shard}: {}", s.message()), 500)
            })?;
            node.router.set_addr(*id, &addr.grpc_addr);
        }
        tracing::info!(shard, node = id, "adding a learner and waiting for it to catch up");
        let deadline = tokio::time::Instant::now() + CATCH_UP_TIMEOUT;
        let too_slow = || {
            ApiError::unavailable(
                format!("node {id} did not catch up on shard {shard} within {CATCH_UP_TIMEOUT:?}"),
                1000,
            )
        };
        // openraft's blocking add_learner counts a learner within
        // `replication_lag_threshold` entries (thousands) as caught up, so
        // it can return while a snapshot is still streaming: wait for the
        // learner to hold everything the log had once it was added.
        match tokio::time::timeout_at(deadline, ctx.raft.add_learner(*id, addr.clone(), false)).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Err(raft_error(&ctx, "adding a learner", e)),
            Err(_) => return Err(too_slow()),
        }
        let target = ctx.raft.metrics().borrow_watched().last_log_index.unwrap_or(0);
        let mut metrics = ctx.raft.metrics();
        loop {
            let (matched, leading) = {
                let m = metrics.borrow_watched();
                let matched = m.replication.as_ref().and_then(|r| r.get(id).cloned().flatten()).map_or(0, |l| l.index);
                (matched, m.state == openraft::ServerState::Leader)
            };
            if !leading {
                return Err(not_leader(&ctx));
            }
            if matched >= target {
                break;
            }
            match tokio::time::timeout_at(deadline, metrics.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => return Err(not_leader(&ctx)),
                Err(_) => return Err(too_slow()),
            }
        }
    }

    tracing::info!(shard, from = ?current, to = ?want, "changing the voter set");
    ctx.raft
        .change_membership(ChangeMembers::ReplaceAllVoters(want.clone()), false)
        .await
        .map_err(|e| raft_error(&ctx, "the membership change", e))?;
    let (after, committed) = {
        let m = ctx.raft.metrics().borrow_watched().clone();
        let after: BTreeSet<u64> = m.membership_config.membership().voter_ids().collect();
        let uniform = m.membership_config.membership().get_joint_config().len() == 1;
        (after, uniform && m.committed_membership_config.log_id() == m.membership_config.log_id())
    };
    if after != want || !committed {
        return Err(ApiError::Internal(format!(
            "shard {shard}: the membership is {after:?} (committed: {committed}), not {want:?}; run the command again"
        )));
    }

    // The replicas left out drop their data. A node that is down keeps its
    // copy until it is decommissioned or wiped; it can no longer vote in
    // this group.
    let self_left_out = left_out.remove(&node.node_id).is_some();
    for (id, addr) in left_out {
        if let Err(e) = release_on(&addr.grpc_addr, shard, &want).await {
            tracing::warn!(shard, node = id, error = %e, "could not release the left-out replica (node down?)");
        }
    }
    let bytes_streamed = node.router.snapshot_bytes(ctx.group).saturating_sub(bytes_before);
    if self_left_out {
        // This leader removed itself (no new voter could take over first).
        // Give the new voters a few heartbeats to learn that the change
        // committed, then drop the replica before answering.
        tokio::time::sleep(Duration::from_millis(4 * node.config.raft.heartbeat_ms)).await;
        drop(_serial);
        if let Err(e) = node.release_shard(shard).await {
            tracing::warn!(shard, error = %e, "releasing this node's own replica");
        }
    }
    Ok(pb::SetReplicasResponse { voters: want.into_iter().collect(), bytes_streamed, changed: true })
}

async fn release_on(addr: &str, shard: ShardId, voters: &BTreeSet<u64>) -> Result<bool, ApiError> {
    if addr.is_empty() {
        return Err(ApiError::unavailable("no address known", 0));
    }
    let mut client = control_client(addr, CONTROL_RPC_TIMEOUT).await?;
    let resp = client
        .release_shard(pb::ReleaseShardRequest { shard, voters: voters.iter().copied().collect() })
        .await
        .map_err(|s| ApiError::unavailable(s.message(), 0))?;
    Ok(resp.into_inner().released)
}

/// The `ReplicaControl` service.
pub struct ReplicaService {
    node: Arc<NodeState>,
}

impl ReplicaService {
    pub fn new(node: Arc<NodeState>) -> ReplicaService {
        ReplicaService { node }
    }
}

#[tonic::async_trait]
impl pb::replica_control_server::ReplicaControl for ReplicaService {
    async fn host_shard(
        &self,
        request: tonic::Request<pb::HostShardRequest>,
    ) -> Result<tonic::Response<pb::HostShardResponse>, tonic::Status> {
        let shard = request.into_inner().shard;
        if shard >= self.node.config.num_shards {
            return Err(ApiError::invalid("shard", format!("must be below {}", self.node.config.num_shards)).into());
        }
        if self.node.shutting_down() {
            return Err(tonic::Status::unavailable("this node is shutting down"));
        }
        let created = self.node.host_shard(shard).await.map_err(|e| tonic::Status::internal(e.to_string()))?;
        Ok(tonic::Response::new(pb::HostShardResponse { created }))
    }

    async fn release_shard(
        &self,
        request: tonic::Request<pb::ReleaseShardRequest>,
    ) -> Result<tonic::Response<pb::ReleaseShardResponse>, tonic::Status> {
        let req = request.into_inner();
        if req.voters.contains(&self.node.node_id) {
            return Err(tonic::Status::failed_precondition(format!(
                "node {} is still a voter of shard {}",
                self.node.node_id, req.shard
            )));
        }
        let released = self.node.release_shard(req.shard).await.map_err(|e| tonic::Status::internal(e.to_string()))?;
        Ok(tonic::Response::new(pb::ReleaseShardResponse { released }))
    }

    async fn set_replicas(
        &self,
        request: tonic::Request<pb::SetReplicasRequest>,
    ) -> Result<tonic::Response<pb::SetReplicasResponse>, tonic::Status> {
        let req = request.into_inner();
        let mut target = BTreeMap::new();
        for v in req.voters {
            if target.insert(v.node_id, NodeAddr { grpc_addr: v.grpc_addr, http_addr: v.http_addr }).is_some() {
                return Err(ApiError::invalid("voters", format!("node {} is named twice", v.node_id)).into());
            }
        }
        Ok(tonic::Response::new(set_replicas(&self.node, req.shard, target).await?))
    }
}
