//! The `TimerService`: the one implementation behind both gRPC and the
//! HTTP/JSON mirror.
//!
//! Each request is parsed once (`api/parse.rs`), routed to its shard, and
//! executed there: writes (`write.rs`) as commands through the shard's
//! proposer, admitted (rate and disk limits) only where they are proposed;
//! reads (`read.rs`) against the leader's applied state after a lease
//! check; pull delivery (`pull.rs`). This file holds the service's entry
//! points and the forwarding they share. A request for a shard this node does not lead is
//! forwarded to the leader in one hop when the leader is known. A request
//! that carries the cluster map epoch it was routed by (the shard-aware
//! client's `x-tocsin-map-epoch`) is refused with ABORTED when its shard's
//! replicas changed after that epoch: the client refreshes its map.

use std::pin::Pin;
use std::sync::Arc;

use futures::Stream;
use tocsin_core::TimerKey;
use tocsin_proto::v1 as pb;
use tocsin_proto::v1::timer_service_client::TimerServiceClient;
use tonic::Request;
use tonic::Response;
use tonic::Status;
use tonic::transport::Channel;

use crate::api::parse;
use crate::control::state::NodeState;
use crate::error::NodeError;
use crate::forward;
use crate::forward::is_forwarded;
use crate::shard::ShardCtx;
use tocsin_core::auth::Scope;

mod pull;
mod read;
mod write;

/// The `tocsin.v1.TimerService` implementation.
#[derive(Clone)]
pub struct TimerApi {
    node: Arc<NodeState>,
    /// Whether calls are checked against bearer tokens (the client ports);
    /// the peer port's forwarded requests were checked where they entered.
    authorize: bool,
}

impl TimerApi {
    /// The client ports' API: every call's token is checked.
    pub fn new(node: Arc<NodeState>) -> TimerApi {
        TimerApi { node, authorize: true }
    }

    /// The peer port's API: requests forwarded by other nodes.
    pub fn for_peers(node: Arc<NodeState>) -> TimerApi {
        TimerApi { node, authorize: false }
    }

    /// Refuses the call unless its token grants `scope` on every one of
    /// `namespaces` (see `auth.rs`).
    fn authorize<T>(&self, request: &Request<T>, scope: Scope, namespaces: &[&str]) -> Result<(), Status> {
        // Open nodes and the peer port: no map read on the request path.
        if !self.authorize || self.node.authority.is_open() {
            return Ok(());
        }
        let map = self.node.map.get();
        let bearer = crate::auth::bearer_of(request.metadata());
        self.node.authority.check(&map, bearer, Some(scope), namespaces).map_err(Status::from)
    }

    fn limits(&self) -> &tocsin_core::Limits {
        &self.node.config.limits
    }

    /// The shard's leader context, after a lease (or ReadIndex) check, for
    /// linearizable reads.
    async fn read_leader(&self, ctx: &Arc<ShardCtx>) -> Result<(), NodeError> {
        if ctx.raft.ensure_linearizable(openraft::ReadPolicy::LeaseRead).await.is_ok()
            || ctx.raft.ensure_linearizable(openraft::ReadPolicy::ReadIndex).await.is_ok()
        {
            return Ok(());
        }
        Err(NodeError::from_propose(
            ctx.shard,
            crate::shard::proposer::ProposeError::NotLeader { leader: ctx.leader_hint() },
        ))
    }

    async fn read_record(
        &self,
        ctx: &Arc<ShardCtx>,
        key: &TimerKey,
    ) -> Result<Option<tocsin_core::TimerRecord>, NodeError> {
        self.read_leader(ctx).await?;
        let store = ctx.store.clone();
        let group = ctx.group;
        let key = key.clone();
        tokio::task::spawn_blocking(move || store.get_timer(group, &key))
            .await
            .map_err(|e| NodeError::Internal(e.to_string()))?
            .map_err(|e| NodeError::Internal(format!("reading the timer: {e}")))
    }
}

pub(crate) type ReserveStream = Pin<Box<dyn Stream<Item = Result<pb::ReserveResponse, Status>> + Send>>;

/// The peer address and id of the leader an error points to, if this node
/// knows where that leader's peer API listens: forwarded requests go to the
/// peer port, never to the client port named in the hint.
pub(crate) fn leader_addr(node: &NodeState, e: &NodeError) -> Option<(String, u64)> {
    match e {
        NodeError::Unavailable { leader: Some(l), .. } if l.node_id != 0 => {
            Some((node.peer_addr_of(l.node_id)?, l.node_id))
        }
        _ => None,
    }
}

impl TimerApi {
    /// Sends `req` to the node at `addr`, marked as forwarded.
    async fn forward<Req, Resp, F, Fut>(
        &self,
        addr: &str,
        req: Req,
        shard: Option<u32>,
        call: F,
    ) -> Result<Resp, Status>
    where
        F: FnOnce(TimerServiceClient<Channel>, Request<Req>) -> Fut,
        Fut: std::future::Future<Output = Result<Response<Resp>, Status>>,
    {
        let Some(client) = self.node.forwarder.client(addr) else {
            return Err(NodeError::Unavailable {
                message: format!("bad leader address {addr}"),
                leader: None,
                retry_after_ms: 100,
            }
            .into());
        };
        metrics::counter!("tocsin_forwarded_requests_total").increment(1);
        call(client, self.node.forwarder.request(req, shard)).await.map(Response::into_inner)
    }

    /// Awaits `local`; if it says another node leads the shard, and this
    /// request was not forwarded already, sends `req` there with `remote`.
    async fn here_or_leader<Req, Resp, LF, R, RF>(
        &self,
        forwarded: bool,
        local: LF,
        req: Req,
        remote: R,
    ) -> Result<Response<Resp>, Status>
    where
        LF: std::future::Future<Output = Result<Resp, NodeError>>,
        R: FnOnce(TimerServiceClient<Channel>, Request<Req>) -> RF,
        RF: std::future::Future<Output = Result<Response<Resp>, Status>>,
    {
        match local.await {
            Ok(resp) => Ok(Response::new(resp)),
            Err(e) => match (forwarded, leader_addr(&self.node, &e)) {
                (false, Some((addr, leader))) => {
                    let mut resp = self.forward(&addr, req, None, remote).await.map(Response::new)?;
                    forward::mark_leader(&mut resp, leader);
                    Ok(resp)
                }
                _ => Err(e.into()),
            },
        }
    }
}

#[tonic::async_trait]
impl pb::timer_service_server::TimerService for TimerApi {
    async fn create_timer(
        &self,
        request: Request<pb::CreateTimerRequest>,
    ) -> Result<Response<pb::CreateTimerResponse>, Status> {
        self.authorize(&request, Scope::TimersWrite, &[&request.get_ref().namespace])?;
        let forwarded = is_forwarded(&request);
        let map_epoch = forward::map_epoch(&request);
        let req = request.into_inner();
        let valid = parse::create(
            &req,
            self.limits(),
            self.node.config.num_shards,
            self.node.dispatcher.webhook.egress(),
            &self.node.dispatcher.amqp,
        )?;
        self.node.check_route(valid.target.shard, map_epoch)?;
        self.here_or_leader(forwarded, self.create_one(valid), req, |mut c, r| async move { c.create_timer(r).await })
            .await
    }

    async fn create_timers(
        &self,
        request: Request<pb::CreateTimersRequest>,
    ) -> Result<Response<pb::CreateTimersResponse>, Status> {
        let namespaces: std::collections::BTreeSet<&str> =
            request.get_ref().timers.iter().map(|t| t.namespace.as_str()).collect();
        self.authorize(&request, Scope::TimersWrite, &namespaces.into_iter().collect::<Vec<_>>())?;
        let forwarded = is_forwarded(&request);
        let map_epoch = forward::map_epoch(&request);
        self.create_timers_routed(request.into_inner().timers, map_epoch, forwarded).await
    }

    async fn get_timer(&self, request: Request<pb::GetTimerRequest>) -> Result<Response<pb::GetTimerResponse>, Status> {
        self.authorize(&request, Scope::TimersRead, &[&request.get_ref().namespace])?;
        let forwarded = is_forwarded(&request);
        let map_epoch = forward::map_epoch(&request);
        let req = request.into_inner();
        let target = parse::key(&req.namespace, &req.id, self.node.config.num_shards)?;
        self.node.check_route(target.shard, map_epoch)?;
        let include_attempts = req.include_attempts;
        self.here_or_leader(forwarded, self.get(target, include_attempts), req, |mut c, r| async move {
            c.get_timer(r).await
        })
        .await
    }

    async fn list_timers(
        &self,
        request: Request<pb::ListTimersRequest>,
    ) -> Result<Response<pb::ListTimersResponse>, Status> {
        self.authorize(&request, Scope::TimersRead, &[&request.get_ref().namespace])?;
        let forwarded = is_forwarded(&request);
        let only = forward::only_shard(&request);
        let req = request.into_inner();
        self.list(req, forwarded, only).await.map(Response::new).map_err(Status::from)
    }

    async fn cancel_timer(
        &self,
        request: Request<pb::CancelTimerRequest>,
    ) -> Result<Response<pb::CancelTimerResponse>, Status> {
        self.authorize(&request, Scope::TimersWrite, &[&request.get_ref().namespace])?;
        let forwarded = is_forwarded(&request);
        let map_epoch = forward::map_epoch(&request);
        let req = request.into_inner();
        let target = parse::key(&req.namespace, &req.id, self.node.config.num_shards)?;
        self.node.check_route(target.shard, map_epoch)?;
        self.here_or_leader(forwarded, self.cancel(target), req, |mut c, r| async move { c.cancel_timer(r).await })
            .await
    }

    async fn reschedule_timer(
        &self,
        request: Request<pb::RescheduleTimerRequest>,
    ) -> Result<Response<pb::RescheduleTimerResponse>, Status> {
        self.authorize(&request, Scope::TimersWrite, &[&request.get_ref().namespace])?;
        let forwarded = is_forwarded(&request);
        let map_epoch = forward::map_epoch(&request);
        let req = request.into_inner();
        let valid = parse::reschedule(&req, self.node.config.num_shards)?;
        self.node.check_route(valid.target.shard, map_epoch)?;
        self.here_or_leader(
            forwarded,
            self.reschedule(valid),
            req,
            |mut c, r| async move { c.reschedule_timer(r).await },
        )
        .await
    }

    async fn redrive_timers(
        &self,
        request: Request<pb::RedriveTimersRequest>,
    ) -> Result<Response<pb::RedriveTimersResponse>, Status> {
        self.authorize(&request, Scope::TimersWrite, &[&request.get_ref().namespace])?;
        let forwarded = is_forwarded(&request);
        let req = request.into_inner();
        self.redrive(req, forwarded).await.map(Response::new).map_err(Status::from)
    }

    type ReserveStream = ReserveStream;

    async fn reserve(&self, request: Request<pb::ReserveRequest>) -> Result<Response<Self::ReserveStream>, Status> {
        self.authorize(&request, Scope::Pull, &[&request.get_ref().namespace])?;
        let local_only = forward::is_local_only(&request) || is_forwarded(&request);
        self.reserve_stream(request.into_inner(), local_only).map(Response::new).map_err(Status::from)
    }

    async fn ack(&self, request: Request<pb::AckRequest>) -> Result<Response<pb::AckResponse>, Status> {
        self.authorize(&request, Scope::Pull, &namespaces_of(&request.get_ref().deliveries))?;
        let forwarded = is_forwarded(&request);
        let map_epoch = forward::map_epoch(&request);
        let refs = request.into_inner().deliveries;
        let results = self.settle(refs, None, forwarded, map_epoch).await?;
        Ok(Response::new(pb::AckResponse { results }))
    }

    async fn nack(&self, request: Request<pb::NackRequest>) -> Result<Response<pb::NackResponse>, Status> {
        self.authorize(&request, Scope::Pull, &namespaces_of(&request.get_ref().deliveries))?;
        let forwarded = is_forwarded(&request);
        let map_epoch = forward::map_epoch(&request);
        let req = request.into_inner();
        let (delay_ms, reason) = parse::nack(&req, self.limits())?;
        let results = self.settle(req.deliveries, Some((delay_ms, reason)), forwarded, map_epoch).await?;
        Ok(Response::new(pb::NackResponse { results }))
    }

    async fn get_horizon(
        &self,
        request: Request<pb::GetHorizonRequest>,
    ) -> Result<Response<pb::GetHorizonResponse>, Status> {
        self.authorize(&request, Scope::TimersRead, &[&request.get_ref().namespace])?;
        let forwarded = is_forwarded(&request);
        let only = forward::only_shard(&request);
        let req = request.into_inner();
        self.horizon(&req.namespace, forwarded, only).await.map(Response::new).map_err(Status::from)
    }
}

/// The distinct namespaces of `refs`.
fn namespaces_of(refs: &[pb::DeliveryRef]) -> Vec<&str> {
    let set: std::collections::BTreeSet<&str> = refs.iter().map(|r| r.namespace.as_str()).collect();
    set.into_iter().collect()
}

/// A sub-request forwarded to another shard's leader failed: the caller
/// may retry the whole request shortly.
pub(crate) fn forward_failed(status: Status) -> NodeError {
    NodeError::Unavailable { message: status.message().to_string(), leader: None, retry_after_ms: 100 }
}
