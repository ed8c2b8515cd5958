//! The peer API: the `ReplicaControl` service other nodes call to host or
//! release a replica here, and to propose or read the cluster map at this
//! node's metadata replica. (The Raft transport itself is the shard layer's
//! `raft.rs`.) It is served on the peer port only; on the client port the
//! peer services answer PERMISSION_DENIED ([`RefuseTransport`],
//! [`RefuseReplicas`]).

use std::sync::Arc;

use tocsin_proto::v1 as pb;

use crate::control::replicas::check_released;
use crate::control::state::NodeState;
use crate::error::NodeError;

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
        let req = request.into_inner();
        if !req.metadata && req.shard >= self.node.config.num_shards {
            return Err(NodeError::invalid("shard", format!("must be below {}", self.node.config.num_shards)).into());
        }
        if self.node.shutting_down() {
            return Err(tonic::Status::unavailable("this node is shutting down"));
        }
        let created = if req.metadata { self.node.host_meta().await } else { self.node.host_shard(req.shard).await };
        let created = created.map_err(|e| tonic::Status::internal(e.to_string()))?;
        Ok(tonic::Response::new(pb::HostShardResponse { created }))
    }

    async fn release_shard(
        &self,
        request: tonic::Request<pb::ReleaseShardRequest>,
    ) -> Result<tonic::Response<pb::ReleaseShardResponse>, tonic::Status> {
        let req = request.into_inner();
        let what = if req.metadata { "the metadata group".to_string() } else { format!("shard {}", req.shard) };
        let raft = if req.metadata {
            self.node.meta().map(|m| m.raft.clone())
        } else {
            self.node.shards.get(req.shard).map(|c| c.raft.clone())
        };
        let Some(raft) = raft else {
            return Ok(tonic::Response::new(pb::ReleaseShardResponse { released: false }));
        };
        // Decided from this replica's own committed membership, never from the
        // caller's word: a late release after this node was added back finds it
        // a voter again and deletes nothing.
        check_released(&raft, self.node.node_id, req.membership_index, &what).await?;
        let released =
            if req.metadata { self.node.release_meta().await } else { self.node.release_shard(req.shard).await };
        let released = released.map_err(|e| tonic::Status::internal(e.to_string()))?;
        Ok(tonic::Response::new(pb::ReleaseShardResponse { released }))
    }

    async fn propose_cluster(
        &self,
        request: tonic::Request<pb::ProposeClusterRequest>,
    ) -> Result<tonic::Response<pb::ProposeClusterResponse>, tonic::Status> {
        let req = request.into_inner();
        Ok(tonic::Response::new(crate::control::meta::serve_propose(&self.node, &req.command).await?))
    }

    async fn read_cluster_map(
        &self,
        request: tonic::Request<pb::ReadClusterMapRequest>,
    ) -> Result<tonic::Response<pb::ReadClusterMapResponse>, tonic::Status> {
        let linearizable = request.into_inner().linearizable;
        Ok(tonic::Response::new(crate::control::meta::serve_read(&self.node, linearizable).await?))
    }
}

/// Declares a service that answers every call to the gRPC service `$name`
/// with PERMISSION_DENIED: the client port's stand-in for a peer service,
/// so a caller learns why rather than getting UNIMPLEMENTED.
macro_rules! refused_on_client_port {
    ($ty:ident, $name:expr) => {
        #[derive(Clone, Copy, Debug)]
        pub struct $ty;

        impl tonic::server::NamedService for $ty {
            const NAME: &'static str = $name;
        }

        impl<B> tonic::codegen::Service<tonic::codegen::http::Request<B>> for $ty {
            type Response = tonic::codegen::http::Response<tonic::body::Body>;
            type Error = std::convert::Infallible;
            type Future = std::future::Ready<Result<Self::Response, Self::Error>>;

            fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Self::Error>> {
                std::task::Poll::Ready(Ok(()))
            }

            fn call(&mut self, _: tonic::codegen::http::Request<B>) -> Self::Future {
                let status = tonic::Status::permission_denied(concat!(
                    $name,
                    " is a peer service: it is served on the peer port, to other nodes only"
                ));
                std::future::ready(Ok(status.into_http()))
            }
        }
    };
}

refused_on_client_port!(RefuseTransport, "tocsin.v1.RaftTransport");
refused_on_client_port!(RefuseReplicas, "tocsin.v1.ReplicaControl");
