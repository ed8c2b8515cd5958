//! The `AdminService`: cluster info and the shard map, as this node sees
//! them (the cluster map it caches, and its Raft groups' metrics and
//! memberships), and the cluster operations of `ops.rs`.

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

    /// Every node the cluster map records, with its state, plus any other
    /// node named in a hosted group's membership (before the map knows it).
    fn nodes(&self) -> Vec<pb::NodeInfo> {
        let map = self.node.map.get();
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
                        state: node_state(n.status) as i32,
                        reachable: false,
                        since_epoch: n.since_epoch,
                    },
                )
            })
            .collect();
        for (id, addr) in self.node.peers() {
            nodes.entry(id).or_insert(pb::NodeInfo {
                node_id: id,
                grpc_addr: addr.grpc_addr,
                http_addr: addr.http_addr,
                ..Default::default()
            });
        }
        // This node knows its own current address best, and answers.
        let me = nodes.entry(self.node.node_id).or_default();
        me.node_id = self.node.node_id;
        me.grpc_addr = self.node.self_addr.grpc_addr.clone();
        me.http_addr = self.node.self_addr.http_addr.clone();
        me.reachable = true;
        nodes.into_values().collect()
    }

    /// Cluster info, with each hosted shard's state digest if asked.
    pub async fn cluster_info_with_digests(&self) -> pb::ClusterInfo {
        let mut info = self.cluster_info().await;
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

    pub async fn cluster_info(&self) -> pb::ClusterInfo {
        let map = self.node.fresh_map().await;
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
                target: map.replicas(ctx.shard).to_vec(),
                shard_epoch: map.shard_epoch(ctx.shard),
                move_error: ctx.move_error(),
                snapshot_bytes_sent: self.node.router.snapshot_bytes(ctx.group),
            });
        }
        pb::ClusterInfo {
            node_id: self.node.node_id,
            map_epoch: map.epoch,
            num_shards: self.node.config.num_shards,
            nodes: self.nodes(),
            shards,
            metadata: Some(crate::meta::status(&self.node)),
        }
    }

    /// Every shard: its target and placement epoch from the cluster map,
    /// and, for the shards this node hosts, the committed membership and
    /// the leader as this node knows them.
    pub async fn shard_map(&self) -> pb::ShardMap {
        let info = self.cluster_info().await;
        let map = self.node.map.get();
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
                let (Some(s), Ok(ctx)) = (hosted.get(&shard), self.node.shard(shard)) else { return p };
                // A leader cut off from its quorum must not keep attracting
                // clients: report the leader as unknown instead.
                let cut_off = s.leader == self.node.node_id && ctx.proposer.quorum_lost();
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
        Ok(Response::new(self.cluster_info().await))
    }

    async fn get_shard_map(&self, _: Request<pb::GetShardMapRequest>) -> Result<Response<pb::ShardMap>, Status> {
        Ok(Response::new(self.shard_map().await))
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
