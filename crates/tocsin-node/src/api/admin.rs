//! The `AdminService`: cluster info and the shard map, as this node sees
//! them (from its Raft groups' metrics and membership).

use openraft::async_runtime::WatchReceiver as _;
use std::collections::BTreeMap;
use std::sync::Arc;

use tocsin_proto::v1 as pb;
use tonic::Request;
use tonic::Response;
use tonic::Status;

use crate::api::error::ApiError;
use crate::node::NodeState;
use crate::ops;

#[derive(Clone)]
pub struct AdminApi {
    node: Arc<NodeState>,
}

impl AdminApi {
    pub fn new(node: Arc<NodeState>) -> AdminApi {
        AdminApi { node }
    }

    /// Every node named in any hosted group's membership, with addresses.
    fn nodes(&self) -> BTreeMap<u64, tocsin_store::NodeAddr> {
        let mut nodes = BTreeMap::new();
        for ctx in self.node.shards.all() {
            let metrics = ctx.raft.metrics().borrow_watched().clone();
            for (id, addr) in metrics.membership_config.membership().nodes() {
                nodes.insert(*id, addr.clone());
            }
        }
        // This node knows its own current address best.
        nodes.insert(self.node.node_id, self.node.self_addr.clone());
        nodes
    }

    /// Cluster info, with each hosted shard's state digest if asked.
    pub async fn cluster_info_with_digests(&self) -> pb::ClusterInfo {
        let mut info = self.cluster_info();
        for status in &mut info.shards {
            let Ok(ctx) = self.node.shard(status.shard) else { continue };
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

    pub fn cluster_info(&self) -> pb::ClusterInfo {
        let nodes = self.nodes();
        let mut shards = Vec::new();
        for ctx in self.node.shards.all() {
            let m = ctx.raft.metrics().borrow_watched().clone();
            let membership = m.membership_config.membership();
            let meta = ctx.store.shard_meta(ctx.group).unwrap_or_default();
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
            });
        }
        pb::ClusterInfo {
            node_id: self.node.node_id,
            map_epoch: 1,
            num_shards: self.node.config.num_shards,
            nodes: nodes
                .into_iter()
                .map(|(id, addr)| pb::NodeInfo {
                    node_id: id,
                    grpc_addr: addr.grpc_addr,
                    http_addr: addr.http_addr,
                    state: pb::node_info::State::Active as i32,
                    reachable: true,
                })
                .collect(),
            shards,
        }
    }

    pub fn shard_map(&self) -> pb::ShardMap {
        let info = self.cluster_info();
        let ring = tocsin_core::routing::Ring::new(info.nodes.iter().map(|n| n.node_id));
        pb::ShardMap {
            epoch: info.map_epoch,
            num_shards: info.num_shards,
            nodes: info.nodes,
            ring: ring.tokens().iter().map(|(token, node)| pb::RingToken { token: *token, node_id: *node }).collect(),
            shards: info
                .shards
                .into_iter()
                .map(|s| {
                    // A leader cut off from its quorum must not keep attracting
                    // clients: report the leader as unknown instead.
                    let cut_off = s.leader == self.node.node_id
                        && self.node.shard(s.shard).is_ok_and(|ctx| ctx.proposer.quorum_lost());
                    let leader = if cut_off { 0 } else { s.leader };
                    // The last committed membership, and its log index:
                    // newer replica sets have higher ones (see `view.rs`).
                    let (replicas, learners, shard_epoch) = match self.node.shard(s.shard) {
                        Ok(ctx) => {
                            let m = ctx.raft.metrics().borrow_watched().clone();
                            let committed = m.committed_membership_config.clone();
                            (
                                committed.membership().voter_ids().collect(),
                                committed.membership().learner_ids().collect(),
                                committed.log_id().as_ref().map_or(0, |l| l.index),
                            )
                        }
                        Err(_) => (s.replicas, s.learners, 0),
                    };
                    pb::ShardPlacement { shard: s.shard, replicas, leader, shard_epoch, term: s.term, learners }
                })
                .collect(),
        }
    }
}

type ProgressStream = std::pin::Pin<Box<dyn futures::Stream<Item = Result<pb::Progress, Status>> + Send>>;

impl AdminApi {
    /// Runs a cluster operation in its own task (it finishes even if the
    /// caller goes away) and streams its progress.
    fn spawn_op<F, Fut>(&self, op: F) -> Response<ProgressStream>
    where
        F: FnOnce(Arc<NodeState>, ops::Reporter) -> Fut,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        let (tx, rx) = tokio::sync::mpsc::channel(ops::PROGRESS_QUEUE);
        tokio::spawn(op(self.node.clone(), ops::Reporter::new(tx)));
        Response::new(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx)))
    }
}

#[tonic::async_trait]
impl pb::admin_service_server::AdminService for AdminApi {
    async fn get_cluster(&self, request: Request<pb::GetClusterRequest>) -> Result<Response<pb::ClusterInfo>, Status> {
        if request.into_inner().digests {
            return Ok(Response::new(self.cluster_info_with_digests().await));
        }
        Ok(Response::new(self.cluster_info()))
    }

    async fn get_shard_map(&self, _: Request<pb::GetShardMapRequest>) -> Result<Response<pb::ShardMap>, Status> {
        Ok(Response::new(self.shard_map()))
    }

    type AddNodeStream = ProgressStream;
    async fn add_node(&self, request: Request<pb::AddNodeRequest>) -> Result<Response<Self::AddNodeStream>, Status> {
        let req = request.into_inner();
        if req.grpc_addr.is_empty() {
            return Err(ApiError::invalid("grpc_addr", "give the new node's gRPC address, host:port").into());
        }
        Ok(self.spawn_op(|node, rep| ops::add_node(node, req.grpc_addr, req.http_addr, rep)))
    }

    type RemoveNodeStream = ProgressStream;
    async fn remove_node(
        &self,
        request: Request<pb::RemoveNodeRequest>,
    ) -> Result<Response<Self::RemoveNodeStream>, Status> {
        let id = request.into_inner().node_id;
        Ok(self.spawn_op(move |node, rep| ops::remove_node(node, id, false, rep)))
    }

    type DecommissionNodeStream = ProgressStream;
    async fn decommission_node(
        &self,
        request: Request<pb::DecommissionNodeRequest>,
    ) -> Result<Response<Self::DecommissionNodeStream>, Status> {
        let id = request.into_inner().node_id;
        Ok(self.spawn_op(move |node, rep| ops::remove_node(node, id, true, rep)))
    }

    type MoveShardStream = ProgressStream;
    async fn move_shard(
        &self,
        request: Request<pb::MoveShardRequest>,
    ) -> Result<Response<Self::MoveShardStream>, Status> {
        let req = request.into_inner();
        Ok(self.spawn_op(move |node, rep| ops::move_shard(node, req.shard, req.from_node, req.to_node, rep)))
    }

    /// Moves a shard's leadership to `to_node`. Must reach the current
    /// leader; elsewhere it answers UNAVAILABLE with the leader's address.
    async fn transfer_leader(
        &self,
        request: Request<pb::TransferLeaderRequest>,
    ) -> Result<Response<pb::TransferLeaderResponse>, Status> {
        let req = request.into_inner();
        let ctx = self.node.shard(req.shard)?;
        let metrics = ctx.raft.metrics().borrow_watched().clone();
        if metrics.current_leader != Some(self.node.node_id) {
            return Err(crate::api::error::ApiError::from_propose(
                ctx.shard,
                crate::proposer::ProposeError::NotLeader { leader: ctx.leader_hint() },
            )
            .into());
        }
        if !metrics.membership_config.membership().voter_ids().any(|id| id == req.to_node) {
            return Err(Status::invalid_argument(format!(
                "node {} is not a voter of shard {}",
                req.to_node, req.shard
            )));
        }
        if req.to_node != self.node.node_id {
            ctx.raft.trigger().transfer_leader(req.to_node).await.map_err(|e| Status::unavailable(e.to_string()))?;
        }
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(3);
        let mut rx = ctx.raft.metrics();
        loop {
            let leader = rx.borrow_watched().current_leader;
            if leader == Some(req.to_node) || tokio::time::Instant::now() > deadline {
                return Ok(Response::new(pb::TransferLeaderResponse { leader: leader.unwrap_or(0) }));
            }
            let _ = tokio::time::timeout(std::time::Duration::from_millis(100), rx.changed()).await;
        }
    }

    type RebalanceStream = ProgressStream;
    async fn rebalance(
        &self,
        request: Request<pb::RebalanceRequest>,
    ) -> Result<Response<Self::RebalanceStream>, Status> {
        let dry_run = request.into_inner().dry_run;
        Ok(self.spawn_op(move |node, rep| ops::rebalance(node, dry_run, rep)))
    }
}
