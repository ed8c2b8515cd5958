//! The `TimerService`: the one implementation behind both gRPC and the
//! HTTP/JSON mirror.
//!
//! Each request is validated (by `tocsin-core`'s rules), admitted (rate and
//! disk limits), routed to its shard, and executed there: writes as commands
//! through the shard's proposer, reads against the leader's applied state
//! after a lease check. A request for a shard this node does not lead is
//! forwarded to the leader in one hop when the leader is known. A request
//! that carries the cluster map epoch it was routed by (the shard-aware
//! client's `x-tocsin-map-epoch`) is refused with ABORTED when its shard's
//! replicas changed after that epoch: the client refreshes its map.

use std::collections::BTreeMap;
use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;

use futures::Stream;
use tocsin_core::Callback;
use tocsin_core::Command;
use tocsin_core::CommandResult;
use tocsin_core::RetryPolicy;
use tocsin_core::TimerKey;
use tocsin_core::TimerSpec;
use tocsin_core::command::SkipReason;
use tocsin_core::timer::FireTime;
use tocsin_core::validate;
use tocsin_proto::v1 as pb;
use tocsin_proto::v1::timer_service_client::TimerServiceClient;
use tonic::Request;
use tonic::Response;
use tonic::Status;
use tonic::transport::Channel;

use crate::api::error::ApiError;
use crate::delivery::pull::AckStatus;
use crate::delivery::pull::ReserveOptions;
use crate::forward;
use crate::forward::is_forwarded;
use crate::json;
use crate::node::NodeState;
use crate::shard::ShardCtx;

/// Most rows a list request reads in one shard before returning a short page.
const LIST_SCAN_BUDGET: usize = 10_000;

/// The `tocsin.v1.TimerService` implementation.
#[derive(Clone)]
pub struct TimerApi {
    node: Arc<NodeState>,
}

impl TimerApi {
    pub fn new(node: Arc<NodeState>) -> TimerApi {
        TimerApi { node }
    }

    fn limits(&self) -> &tocsin_core::Limits {
        &self.node.config.limits
    }

    /// The hosted shard owning `key`, or UNAVAILABLE.
    fn shard_of(&self, namespace: &str, id: &str) -> Result<Arc<ShardCtx>, ApiError> {
        let shard = tocsin_core::routing::shard_for(namespace, id, self.node.config.num_shards);
        self.node.shard(shard)
    }

    /// The shard's leader context, after a lease (or ReadIndex) check, for
    /// linearizable reads.
    async fn read_leader(&self, ctx: &Arc<ShardCtx>) -> Result<(), ApiError> {
        if ctx.raft.ensure_linearizable(openraft::ReadPolicy::LeaseRead).await.is_ok()
            || ctx.raft.ensure_linearizable(openraft::ReadPolicy::ReadIndex).await.is_ok()
        {
            return Ok(());
        }
        Err(ApiError::from_propose(ctx.shard, crate::proposer::ProposeError::NotLeader { leader: ctx.leader_hint() }))
    }

    async fn read_record(
        &self,
        ctx: &Arc<ShardCtx>,
        key: &TimerKey,
    ) -> Result<Option<tocsin_core::TimerRecord>, ApiError> {
        self.read_leader(ctx).await?;
        let store = ctx.store.clone();
        let group = ctx.group;
        let key = key.clone();
        tokio::task::spawn_blocking(move || store.get_timer(group, &key))
            .await
            .map_err(|e| ApiError::Internal(e.to_string()))?
            .map_err(|e| ApiError::Internal(format!("reading the timer: {e}")))
    }

    /// Checks a create request and turns it into a key and spec.
    fn parse_create(&self, req: pb::CreateTimerRequest) -> Result<(TimerKey, TimerSpec), ApiError> {
        let key = TimerKey::new(req.namespace, req.id);
        validate::check_key(&key)?;
        let fire_time = match req.fire_time {
            Some(pb::create_timer_request::FireTime::FireAtMs(at)) => FireTime::At(at),
            Some(pb::create_timer_request::FireTime::DelayMs(d)) => FireTime::Delay(d),
            None => return Err(ApiError::invalid("fire_at_ms", "give fire_at_ms or delay_ms")),
        };
        let callback = match req.callback.and_then(|c| c.target) {
            Some(pb::callback::Target::Webhook(w)) => Callback::Webhook { url: w.url },
            Some(pb::callback::Target::Pull(p)) => Callback::Pull { topic: p.topic },
            None => return Err(ApiError::invalid("callback", "give callback.webhook.url or callback.pull.topic")),
        };
        let retry = req.retry.map_or(RetryPolicy::default(), |r| RetryPolicy {
            max_attempts: r.max_attempts,
            initial_backoff_ms: r.initial_backoff_ms,
            max_backoff_ms: r.max_backoff_ms,
            give_up_after_ms: r.give_up_after_ms,
        });
        let spec =
            TimerSpec { fire_time, payload: req.payload, labels: req.labels.into_iter().collect(), callback, retry };
        validate::check_create(&key, &spec, self.limits())?;
        Ok((key, spec))
    }

    /// The create command, stamped with this leader's clock.
    fn create_command(&self, key: TimerKey, spec: TimerSpec) -> Result<Command, ApiError> {
        let limits = self.limits();
        let fire_at_ms = validate::resolve_fire_at(spec.fire_time, self.node.clock.now_ms(), limits)?;
        let retry = validate::effective_retry(&spec.retry, limits);
        Ok(Command::Create { key, spec, fire_at_ms, retry, retention_ms: limits.retention_ms })
    }

    fn create_result(
        &self,
        ctx: &ShardCtx,
        key: &TimerKey,
        result: CommandResult,
    ) -> Result<pb::CreateTimerResponse, ApiError> {
        match result {
            CommandResult::Created { record, created } => {
                Ok(pb::CreateTimerResponse { timer: Some(json::timer_proto(ctx.shard, key, &record)), created })
            }
            CommandResult::AlreadyExists { .. } => {
                Err(ApiError::AlreadyExists(format!("timer {key} already exists with a different spec")))
            }
            CommandResult::Skipped { reason: SkipReason::OverLimit } => {
                Err(ApiError::invalid("payload", "exceeds the compiled-in hard limit"))
            }
            other => Err(ApiError::Internal(format!("unexpected create result {other:?}"))),
        }
    }

    async fn create_one(&self, req: pb::CreateTimerRequest) -> Result<pb::CreateTimerResponse, ApiError> {
        let (key, spec) = self.parse_create(req)?;
        self.node.admission.admit_create(&key.namespace, 1)?;
        let ctx = self.shard_of(&key.namespace, &key.id)?;
        ctx.proposer.admit_create().map_err(|e| ApiError::from_propose(ctx.shard, e))?;
        let command = self.create_command(key.clone(), spec)?;
        let (_, result) = ctx.proposer.propose(command).await.map_err(|e| ApiError::from_propose(ctx.shard, e))?;
        self.create_result(&ctx, &key, result)
    }

    fn fire_time_of(fire_at: Option<u64>, delay: Option<u64>) -> Result<FireTime, ApiError> {
        match (fire_at, delay) {
            (Some(at), _) => Ok(FireTime::At(at)),
            (None, Some(d)) => Ok(FireTime::Delay(d)),
            (None, None) => Err(ApiError::invalid("fire_at_ms", "give fire_at_ms or delay_ms")),
        }
    }
}

type ReserveStream = Pin<Box<dyn Stream<Item = Result<pb::ReserveResponse, Status>> + Send>>;

/// The gRPC address and id of the leader an error points to, if any.
fn leader_addr(e: &ApiError) -> Option<(String, u64)> {
    match e {
        ApiError::Unavailable { leader: Some(l), .. } if !l.grpc_addr.is_empty() => {
            Some((l.grpc_addr.clone(), l.node_id))
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
            return Err(ApiError::Unavailable {
                message: format!("bad leader address {addr}"),
                leader: None,
                retry_after_ms: 100,
            }
            .into());
        };
        metrics::counter!("tocsin_forwarded_requests_total").increment(1);
        call(client, self.node.forwarder.request(req, shard)).await.map(Response::into_inner)
    }

    /// Refuses a request for the key's shard routed by a stale map.
    fn check_key_route(&self, namespace: &str, id: &str, map_epoch: u64) -> Result<(), Status> {
        let shard = tocsin_core::routing::shard_for(namespace, id, self.node.config.num_shards);
        self.node.check_route(shard, map_epoch).map_err(Status::from)
    }

    /// Runs `local`; if it says another node leads the shard, and this
    /// request was not forwarded already, runs `remote` there instead.
    async fn here_or_leader<Req, Resp, L, LF, R, RF>(
        &self,
        forwarded: bool,
        req: Req,
        local: L,
        remote: R,
    ) -> Result<Response<Resp>, Status>
    where
        Req: Clone,
        L: FnOnce(Req) -> LF,
        LF: std::future::Future<Output = Result<Resp, ApiError>>,
        R: FnOnce(TimerServiceClient<Channel>, Request<Req>) -> RF,
        RF: std::future::Future<Output = Result<Response<Resp>, Status>>,
    {
        match local(req.clone()).await {
            Ok(resp) => Ok(Response::new(resp)),
            Err(e) => match (forwarded, leader_addr(&e)) {
                (false, Some((addr, leader))) => {
                    let mut resp = self.forward(&addr, req, None, remote).await.map(Response::new)?;
                    forward::mark_leader(&mut resp, leader);
                    Ok(resp)
                }
                _ => Err(e.into()),
            },
        }
    }

    async fn get(&self, req: pb::GetTimerRequest) -> Result<pb::GetTimerResponse, ApiError> {
        let key = TimerKey::new(req.namespace, req.id);
        validate::check_key(&key)?;
        let ctx = self.shard_of(&key.namespace, &key.id)?;
        match self.read_record(&ctx, &key).await? {
            Some(record) => Ok(pb::GetTimerResponse { timer: Some(json::timer_proto(ctx.shard, &key, &record)) }),
            None => Err(ApiError::NotFound(format!("no timer {key}"))),
        }
    }

    async fn cancel(&self, req: pb::CancelTimerRequest) -> Result<pb::CancelTimerResponse, ApiError> {
        let key = TimerKey::new(req.namespace, req.id);
        validate::check_key(&key)?;
        let ctx = self.shard_of(&key.namespace, &key.id)?;
        let (index, result) = ctx
            .proposer
            .propose(Command::Cancel { key: key.clone() })
            .await
            .map_err(|e| ApiError::from_propose(ctx.shard, e))?;
        use pb::cancel_timer_response::Outcome;
        let (outcome, record) = match result {
            CommandResult::Cancelled { record } => (Outcome::Cancelled, Some(record)),
            CommandResult::AlreadyCancelled { record } => (Outcome::AlreadyCancelled, Some(record)),
            CommandResult::AlreadyFired { record } => (Outcome::AlreadyFired, Some(record)),
            CommandResult::NotFound => (Outcome::NotFound, None),
            other => return Err(ApiError::Internal(format!("unexpected cancel result {other:?}"))),
        };
        Ok(pb::CancelTimerResponse {
            outcome: outcome as i32,
            fire: record.as_ref().and_then(|r| json::fire_proto(ctx.shard, r)),
            timer: record.as_ref().map(|r| json::timer_proto(ctx.shard, &key, r)),
            applied_index: index,
        })
    }

    async fn reschedule(&self, req: pb::RescheduleTimerRequest) -> Result<pb::RescheduleTimerResponse, ApiError> {
        let key = TimerKey::new(req.namespace, req.id);
        validate::check_key(&key)?;
        if req.expected_generation == 0 {
            return Err(ApiError::invalid("expected_generation", "give the generation you last saw (1 or more)"));
        }
        let fire_time = match req.fire_time {
            Some(pb::reschedule_timer_request::FireTime::FireAtMs(at)) => Self::fire_time_of(Some(at), None)?,
            Some(pb::reschedule_timer_request::FireTime::DelayMs(d)) => Self::fire_time_of(None, Some(d))?,
            None => Self::fire_time_of(None, None)?,
        };
        let ctx = self.shard_of(&key.namespace, &key.id)?;
        let fire_at_ms = validate::resolve_fire_at(fire_time, self.node.clock.now_ms(), self.limits())?;
        let command =
            Command::Reschedule { key: key.clone(), expected_generation: req.expected_generation, fire_at_ms };
        let (_, result) = ctx.proposer.propose(command).await.map_err(|e| ApiError::from_propose(ctx.shard, e))?;
        match result {
            CommandResult::Rescheduled { record } => {
                Ok(pb::RescheduleTimerResponse { timer: Some(json::timer_proto(ctx.shard, &key, &record)) })
            }
            CommandResult::GenerationMismatch { current } => Err(ApiError::FailedPrecondition(format!(
                "generation is {current}, not {}: the timer changed since you read it",
                req.expected_generation
            ))),
            CommandResult::NotScheduled { state } => Err(ApiError::FailedPrecondition(format!(
                "timer is {}; only SCHEDULED timers can be rescheduled",
                state.name()
            ))),
            CommandResult::NotFound => Err(ApiError::NotFound(format!("no timer {key}"))),
            other => Err(ApiError::Internal(format!("unexpected reschedule result {other:?}"))),
        }
    }

    /// Creates a batch; every item gets its own result.
    async fn create_batch(
        &self,
        timers: Vec<pb::CreateTimerRequest>,
        map_epoch: u64,
    ) -> Result<Vec<Result<pb::CreateTimerResponse, ApiError>>, ApiError> {
        if timers.is_empty() {
            return Err(ApiError::invalid("timers", "give at least one timer"));
        }
        if timers.len() > self.limits().max_batch {
            return Err(ApiError::invalid("timers", format!("at most {} timers per call", self.limits().max_batch)));
        }
        let n = timers.len();
        let mut results: Vec<Option<Result<pb::CreateTimerResponse, ApiError>>> = (0..n).map(|_| None).collect();
        // Validate each; group the valid ones by shard.
        let mut by_shard: BTreeMap<u32, Vec<(usize, TimerKey, Command)>> = BTreeMap::new();
        let mut per_namespace: HashMap<String, u64> = HashMap::new();
        for (i, item) in timers.into_iter().enumerate() {
            let parsed = self.parse_create(item).and_then(|(key, spec)| {
                let command = self.create_command(key.clone(), spec)?;
                Ok((key, command))
            });
            match parsed {
                Ok((key, command)) => {
                    *per_namespace.entry(key.namespace.clone()).or_default() += 1;
                    let shard = tocsin_core::routing::shard_for(&key.namespace, &key.id, self.node.config.num_shards);
                    by_shard.entry(shard).or_default().push((i, key, command));
                }
                Err(e) => results[i] = Some(Err(e)),
            }
        }
        for (ns, count) in &per_namespace {
            if let Err(e) = self.node.admission.admit_create(ns, *count) {
                for items in by_shard.values_mut() {
                    for (i, key, _) in items.iter() {
                        if &key.namespace == ns {
                            results[*i] = Some(Err(e.clone()));
                        }
                    }
                    items.retain(|(_, key, _)| &key.namespace != ns);
                }
            }
        }
        let futures = by_shard.into_iter().map(|(shard, items)| async move {
            let ctx = match self.node.check_route(shard, map_epoch).and_then(|()| self.node.shard(shard)) {
                Ok(ctx) => ctx,
                Err(e) => return items.into_iter().map(|(i, _, _)| (i, Err(e.clone()))).collect::<Vec<_>>(),
            };
            if let Err(e) = ctx.proposer.admit_create() {
                let e = ApiError::from_propose(ctx.shard, e);
                return items.into_iter().map(|(i, _, _)| (i, Err(e.clone()))).collect::<Vec<_>>();
            }
            let (meta, commands): (Vec<(usize, TimerKey)>, Vec<Command>) =
                items.into_iter().map(|(i, key, command)| ((i, key), command)).unzip();
            let applied = ctx.proposer.propose_all(commands).await;
            meta.into_iter()
                .zip(applied)
                .map(|((i, key), result)| {
                    let result = result
                        .map_err(|e| ApiError::from_propose(ctx.shard, e))
                        .and_then(|(_, r)| self.create_result(&ctx, &key, r));
                    (i, result)
                })
                .collect::<Vec<_>>()
        });
        for (i, result) in futures::future::join_all(futures).await.into_iter().flatten() {
            results[i] = Some(result);
        }
        Ok(results.into_iter().map(|r| r.expect("every item has a result")).collect())
    }
}

#[tonic::async_trait]
impl pb::timer_service_server::TimerService for TimerApi {
    async fn create_timer(
        &self,
        request: Request<pb::CreateTimerRequest>,
    ) -> Result<Response<pb::CreateTimerResponse>, Status> {
        let forwarded = is_forwarded(&request);
        let map_epoch = forward::map_epoch(&request);
        let req = request.into_inner();
        self.check_key_route(&req.namespace, &req.id, map_epoch)?;
        self.here_or_leader(forwarded, req, |r| self.create_one(r), |mut c, r| async move { c.create_timer(r).await })
            .await
    }

    async fn create_timers(
        &self,
        request: Request<pb::CreateTimersRequest>,
    ) -> Result<Response<pb::CreateTimersResponse>, Status> {
        let forwarded = is_forwarded(&request);
        let map_epoch = forward::map_epoch(&request);
        let originals = request.into_inner().timers;
        let mut results = self.create_batch(originals.clone(), map_epoch).await?;
        let mut forwarded_to = None;
        // Items whose shard another node leads go there, one sub-batch per leader.
        if !forwarded {
            let mut by_leader: BTreeMap<(String, u64), Vec<usize>> = BTreeMap::new();
            for (i, r) in results.iter().enumerate() {
                if let Err(e) = r
                    && let Some(leader) = leader_addr(e)
                {
                    by_leader.entry(leader).or_default().push(i);
                }
            }
            // The shard-aware client sends one shard's items per call: then
            // one leader answered them all, and the client learns it.
            let only_leader = match by_leader.keys().collect::<Vec<_>>().as_slice() {
                [(_, id)] => Some(*id),
                _ => None,
            };
            let calls = by_leader.into_iter().map(|((addr, _), positions)| {
                let timers: Vec<pb::CreateTimerRequest> = positions.iter().map(|i| originals[*i].clone()).collect();
                async move {
                    let resp = self
                        .forward(&addr, pb::CreateTimersRequest { timers }, None, |mut c, r| async move {
                            c.create_timers(r).await
                        })
                        .await;
                    (positions, resp)
                }
            });
            for (positions, resp) in futures::future::join_all(calls).await {
                let Ok(resp) = resp else { continue };
                for (i, r) in positions.into_iter().zip(resp.results) {
                    results[i] = match r.result {
                        Some(pb::create_timer_result::Result::Ok(ok)) => Ok(ok),
                        // Keep the leader's own error code.
                        Some(pb::create_timer_result::Result::Error(info)) => {
                            Err(ApiError::from_info(crate::api::error::code_from_name(&info.code), info))
                        }
                        None => continue,
                    };
                }
            }
            forwarded_to = only_leader;
        }
        let results = results
            .into_iter()
            .map(|r| pb::CreateTimerResult {
                result: Some(match r {
                    Ok(ok) => pb::create_timer_result::Result::Ok(ok),
                    Err(e) => pb::create_timer_result::Result::Error(e.info()),
                }),
            })
            .collect();
        let mut resp = Response::new(pb::CreateTimersResponse { results });
        if let Some(leader) = forwarded_to {
            forward::mark_leader(&mut resp, leader);
        }
        Ok(resp)
    }

    async fn get_timer(&self, request: Request<pb::GetTimerRequest>) -> Result<Response<pb::GetTimerResponse>, Status> {
        let forwarded = is_forwarded(&request);
        let map_epoch = forward::map_epoch(&request);
        let req = request.into_inner();
        self.check_key_route(&req.namespace, &req.id, map_epoch)?;
        self.here_or_leader(forwarded, req, |r| self.get(r), |mut c, r| async move { c.get_timer(r).await }).await
    }

    async fn list_timers(
        &self,
        request: Request<pb::ListTimersRequest>,
    ) -> Result<Response<pb::ListTimersResponse>, Status> {
        let forwarded = is_forwarded(&request);
        let only = forward::only_shard(&request);
        let req = request.into_inner();
        self.list(req, forwarded, only).await.map(Response::new).map_err(Status::from)
    }

    async fn cancel_timer(
        &self,
        request: Request<pb::CancelTimerRequest>,
    ) -> Result<Response<pb::CancelTimerResponse>, Status> {
        let forwarded = is_forwarded(&request);
        let map_epoch = forward::map_epoch(&request);
        let req = request.into_inner();
        self.check_key_route(&req.namespace, &req.id, map_epoch)?;
        self.here_or_leader(forwarded, req, |r| self.cancel(r), |mut c, r| async move { c.cancel_timer(r).await }).await
    }

    async fn reschedule_timer(
        &self,
        request: Request<pb::RescheduleTimerRequest>,
    ) -> Result<Response<pb::RescheduleTimerResponse>, Status> {
        let forwarded = is_forwarded(&request);
        let map_epoch = forward::map_epoch(&request);
        let req = request.into_inner();
        self.check_key_route(&req.namespace, &req.id, map_epoch)?;
        self.here_or_leader(
            forwarded,
            req,
            |r| self.reschedule(r),
            |mut c, r| async move { c.reschedule_timer(r).await },
        )
        .await
    }

    type ReserveStream = ReserveStream;

    async fn reserve(&self, request: Request<pb::ReserveRequest>) -> Result<Response<Self::ReserveStream>, Status> {
        let local_only = forward::is_local_only(&request) || is_forwarded(&request);
        let req = request.into_inner();
        validate::check_namespace(&req.namespace).map_err(ApiError::from)?;
        validate::check_callback(&Callback::Pull { topic: req.topic.clone() }).map_err(ApiError::from)?;
        let options = ReserveOptions::new(req.ttr_ms, req.max_batch, req.max_in_flight);
        let mut local = self.node.dispatcher.pull.reserve(req.namespace.clone(), req.topic.clone(), options);
        if local_only {
            let stream = tokio_stream::StreamExt::map(tokio_stream::wrappers::ReceiverStream::new(local), Ok);
            return Ok(Response::new(Box::pin(stream)));
        }
        // A plain client gets every node's ready timers through this one stream:
        // this node reserves from its own shards and relays streams opened on
        // the others (each marked local-only).
        let (tx, rx) = tokio::sync::mpsc::channel(8);
        {
            let tx = tx.clone();
            // Watch the consumer too, not only the batches: dropping `local`
            // as soon as the consumer leaves is what stops this node from
            // reserving more timers for a consumer that is gone.
            tokio::spawn(async move {
                loop {
                    tokio::select! {
                        batch = local.recv() => match batch {
                            Some(batch) => if tx.send(batch).await.is_err() { return },
                            None => return,
                        },
                        _ = tx.closed() => return,
                    }
                }
            });
        }
        for addr in self.node.peer_grpc_addrs() {
            let tx = tx.clone();
            let req = req.clone();
            let forwarder = self.node.forwarder.clone();
            tokio::spawn(async move {
                while !tx.is_closed() {
                    if let Some(mut client) = forwarder.client(&addr) {
                        let mut request = Request::new(req.clone());
                        request.metadata_mut().insert(forward::LOCAL_ONLY, "1".parse().expect("ascii"));
                        if let Ok(resp) = client.reserve(request).await {
                            let mut stream = resp.into_inner();
                            loop {
                                tokio::select! {
                                    msg = stream.message() => match msg {
                                        Ok(Some(batch)) => if tx.send(batch).await.is_err() { return },
                                        _ => break,
                                    },
                                    _ = tx.closed() => return,
                                }
                            }
                        }
                    }
                    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                }
            });
        }
        drop(tx);
        let stream = tokio_stream::StreamExt::map(tokio_stream::wrappers::ReceiverStream::new(rx), Ok);
        Ok(Response::new(Box::pin(stream)))
    }

    async fn ack(&self, request: Request<pb::AckRequest>) -> Result<Response<pb::AckResponse>, Status> {
        let forwarded = is_forwarded(&request);
        let map_epoch = forward::map_epoch(&request);
        let refs = request.into_inner().deliveries;
        let results = self.settle(refs, None, forwarded, map_epoch).await?;
        Ok(Response::new(pb::AckResponse { results }))
    }

    async fn nack(&self, request: Request<pb::NackRequest>) -> Result<Response<pb::NackResponse>, Status> {
        let forwarded = is_forwarded(&request);
        let map_epoch = forward::map_epoch(&request);
        let req = request.into_inner();
        let reason = if req.reason.is_empty() {
            "nacked by consumer".to_string()
        } else {
            req.reason.chars().take(200).collect()
        };
        let results = self.settle(req.deliveries, Some((req.delay_ms, reason)), forwarded, map_epoch).await?;
        Ok(Response::new(pb::NackResponse { results }))
    }

    async fn get_horizon(
        &self,
        request: Request<pb::GetHorizonRequest>,
    ) -> Result<Response<pb::GetHorizonResponse>, Status> {
        let forwarded = is_forwarded(&request);
        let only = forward::only_shard(&request);
        let req = request.into_inner();
        self.horizon(&req.namespace, forwarded, only).await.map(Response::new).map_err(Status::from)
    }
}

/// A list page token: the shard to resume in and the id to resume after.
fn encode_token(shard: u32, after_id: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(format!("{shard}:{after_id}"))
}

fn decode_token(token: &str) -> Result<(u32, Option<String>), ApiError> {
    use base64::Engine;
    if token.is_empty() {
        return Ok((0, None));
    }
    let bad = || ApiError::invalid("page_token", "is not a token this API returned");
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(token).map_err(|_| bad())?;
    let text = String::from_utf8(bytes).map_err(|_| bad())?;
    let (shard, id) = text.split_once(':').ok_or_else(bad)?;
    let shard: u32 = shard.parse().map_err(|_| bad())?;
    Ok((shard, (!id.is_empty()).then(|| id.to_string())))
}

impl TimerApi {
    /// One page of a namespace's timers, shard by shard. Each shard is read
    /// at its leader: here, or by forwarding a one-shard request.
    async fn list(
        &self,
        req: pb::ListTimersRequest,
        forwarded: bool,
        only: Option<u32>,
    ) -> Result<pb::ListTimersResponse, ApiError> {
        validate::check_namespace(&req.namespace)?;
        let page_size = match req.page_size {
            0 => 100,
            n if n > 1000 => return Err(ApiError::invalid("page_size", "at most 1000")),
            n => n as usize,
        };
        let state = match req.state {
            0 => None,
            s => Some(
                pb::timer::State::try_from(s).map_err(|_| ApiError::invalid("state", format!("unknown state {s}")))?,
            ),
        };
        let (after_ms, before_ms) =
            (req.fire_after_ms, if req.fire_before_ms == 0 { u64::MAX } else { req.fire_before_ms });
        if after_ms >= before_ms {
            return Err(ApiError::invalid("fire_before_ms", "must be after fire_after_ms"));
        }
        let (mut shard, mut after_id) = decode_token(&req.page_token)?;
        let num_shards = self.node.config.num_shards;
        if shard >= num_shards || only.is_some_and(|o| o >= num_shards) {
            return Err(ApiError::invalid("page_token", "names a shard this cluster does not have"));
        }
        if let Some(o) = only
            && o != shard
        {
            shard = o;
            after_id = None;
        }
        let last_shard = only.unwrap_or(num_shards - 1);
        let mut timers = Vec::new();
        while shard <= last_shard && timers.len() < page_size {
            let want = page_size - timers.len();
            let ctx = self.node.shard(shard)?;
            let resume = match self.read_leader(&ctx).await {
                Ok(()) => {
                    let store = ctx.store.clone();
                    let group = ctx.group;
                    let namespace = req.namespace.clone();
                    let after = after_id.clone();
                    let (page, resume) = tokio::task::spawn_blocking(move || {
                        store.list_namespace(group, &namespace, after.as_deref(), want, LIST_SCAN_BUDGET, |r| {
                            state.is_none_or(|s| json::state_proto(r.state) == s)
                                && r.fire_at_ms >= after_ms
                                && r.fire_at_ms < before_ms
                        })
                    })
                    .await
                    .map_err(|e| ApiError::Internal(e.to_string()))?
                    .map_err(|e| ApiError::Internal(format!("listing: {e}")))?;
                    timers.extend(page.iter().map(|(k, r)| json::timer_proto(shard, k, r)));
                    resume
                }
                Err(e) => {
                    let Some((addr, _)) = leader_addr(&e).filter(|_| !forwarded) else { return Err(e) };
                    let sub = pb::ListTimersRequest {
                        page_size: want as u32,
                        page_token: encode_token(shard, after_id.as_deref().unwrap_or("")),
                        ..req.clone()
                    };
                    let resp = self
                        .forward(&addr, sub, Some(shard), |mut c, r| async move { c.list_timers(r).await })
                        .await
                        .map_err(|s| ApiError::Unavailable {
                            message: s.message().to_string(),
                            leader: None,
                            retry_after_ms: 100,
                        })?;
                    timers.extend(resp.timers);
                    match decode_token(&resp.next_page_token)? {
                        (s, Some(id)) if s == shard && !resp.next_page_token.is_empty() => Some(id),
                        _ => None,
                    }
                }
            };
            match resume {
                // The shard has more: resume there.
                Some(id) => return Ok(pb::ListTimersResponse { timers, next_page_token: encode_token(shard, &id) }),
                None => {
                    shard += 1;
                    after_id = None;
                }
            }
        }
        let next_page_token =
            if shard <= last_shard { encode_token(shard, after_id.as_deref().unwrap_or("")) } else { String::new() };
        Ok(pb::ListTimersResponse { timers, next_page_token })
    }

    async fn horizon(
        &self,
        namespace: &str,
        forwarded: bool,
        only: Option<u32>,
    ) -> Result<pb::GetHorizonResponse, ApiError> {
        validate::check_namespace(namespace)?;
        let now = self.node.clock.now_ms();
        let bucket = tocsin_core::limits::HORIZON_BUCKET_MS;
        let now_min = now / bucket;
        let mut out = pb::GetHorizonResponse { as_of_ms: now, bucket_ms: bucket, ..Default::default() };
        let shards: Vec<u32> = match only {
            Some(s) if s < self.node.config.num_shards => vec![s],
            Some(_) => return Err(ApiError::invalid("shard", "no such shard")),
            None => (0..self.node.config.num_shards).collect(),
        };
        for shard in shards {
            let ctx = self.node.shard(shard)?;
            if let Err(e) = self.read_leader(&ctx).await {
                let Some((addr, _)) = leader_addr(&e).filter(|_| !forwarded) else { return Err(e) };
                let req = pb::GetHorizonRequest { namespace: namespace.to_string() };
                let h = self
                    .forward(&addr, req, Some(shard), |mut c, r| async move { c.get_horizon(r).await })
                    .await
                    .map_err(|s| ApiError::Unavailable {
                    message: s.message().to_string(),
                    leader: None,
                    retry_after_ms: 100,
                })?;
                out.overdue += h.overdue;
                out.next_minute += h.next_minute;
                out.next_hour += h.next_hour;
                out.next_day += h.next_day;
                continue;
            }
            let store = ctx.store.clone();
            let group = ctx.group;
            let ns = namespace.to_string();
            let counts = tokio::task::spawn_blocking(move || -> std::io::Result<[u64; 4]> {
                Ok([
                    store.horizon_count(group, &ns, 0, now_min)?,
                    store.horizon_count(group, &ns, now_min, now_min + 1)?,
                    store.horizon_count(group, &ns, now_min, now_min + 60)?,
                    store.horizon_count(group, &ns, now_min, now_min + 1440)?,
                ])
            })
            .await
            .map_err(|e| ApiError::Internal(e.to_string()))?
            .map_err(|e| ApiError::Internal(format!("horizon: {e}")))?;
            out.overdue += counts[0];
            out.next_minute += counts[1];
            out.next_hour += counts[2];
            out.next_day += counts[3];
        }
        Ok(out)
    }

    async fn settle(
        &self,
        refs: Vec<pb::DeliveryRef>,
        nack: Option<(u64, String)>,
        forwarded: bool,
        map_epoch: u64,
    ) -> Result<Vec<pb::AckResult>, Status> {
        if refs.len() > 10_000 {
            return Err(ApiError::invalid("deliveries", "at most 10000 per call").into());
        }
        let mut statuses = vec![AckStatus::NotFound; refs.len()];
        let mut by_shard: BTreeMap<u32, Vec<(usize, pb::DeliveryRef, TimerKey, u64)>> = BTreeMap::new();
        for (i, r) in refs.into_iter().enumerate() {
            let key = TimerKey::new(r.namespace.clone(), r.id.clone());
            validate::check_key(&key).map_err(ApiError::from)?;
            let parsed = r.fire_id.strip_prefix("f-").and_then(|s| s.split_once('-'));
            let Some((shard, index)) = parsed.and_then(|(s, i)| Some((s.parse::<u32>().ok()?, i.parse::<u64>().ok()?)))
            else {
                return Err(ApiError::invalid("deliveries.fire_id", format!("{:?} is not a fire id", r.fire_id)).into());
            };
            let owner = tocsin_core::routing::shard_for(&key.namespace, &key.id, self.node.config.num_shards);
            if owner != shard {
                continue; // NOT_FOUND: that firing cannot belong to this key
            }
            by_shard.entry(shard).or_default().push((i, r, key, index));
        }
        let per_shard = by_shard.into_iter().map(|(shard, items)| {
            let nack = nack.clone();
            async move {
                self.node.check_route(shard, map_epoch)?;
                let ctx = self.node.shard(shard)?;
                if ctx.epoch().is_none() {
                    // Another node leads the shard: its hub holds the reservations.
                    let hint = ctx.leader_hint().map(|(_, addr)| addr.grpc_addr).filter(|_| !forwarded);
                    let Some(addr) = hint else {
                        return Err(ApiError::Unavailable {
                            message: format!("shard {shard} has no leader here; retry"),
                            leader: None,
                            retry_after_ms: 100,
                        });
                    };
                    let (positions, deliveries): (Vec<usize>, Vec<pb::DeliveryRef>) =
                        items.into_iter().map(|(i, r, _, _)| (i, r)).unzip();
                    let results = match &nack {
                        None => {
                            self.forward(&addr, pb::AckRequest { deliveries }, None, |mut c, r| async move {
                                c.ack(r).await
                            })
                            .await
                            .map(|r| r.results)
                        }
                        Some((delay_ms, reason)) => self
                            .forward(
                                &addr,
                                pb::NackRequest { deliveries, delay_ms: *delay_ms, reason: reason.clone() },
                                None,
                                |mut c, r| async move { c.nack(r).await },
                            )
                            .await
                            .map(|r| r.results),
                    }
                    .map_err(|s| ApiError::Unavailable {
                        message: s.message().to_string(),
                        leader: None,
                        retry_after_ms: 100,
                    })?;
                    use pb::ack_result::Status as S;
                    let statuses = results.into_iter().map(|r| match S::try_from(r.status) {
                        Ok(S::Ok) => AckStatus::Ok,
                        Ok(S::NotFound) => AckStatus::NotFound,
                        _ => AckStatus::Stale,
                    });
                    return Ok(positions.into_iter().zip(statuses).collect::<Vec<_>>());
                }
                let (positions, refs): (Vec<usize>, Vec<(TimerKey, u64, u32)>) =
                    items.into_iter().map(|(i, r, k, f)| (i, (k, f, r.attempt))).unzip();
                let results = self.node.dispatcher.pull.settle(&ctx, refs, nack).await;
                Ok::<_, ApiError>(positions.into_iter().zip(results).collect::<Vec<_>>())
            }
        });
        for shard_results in futures::future::join_all(per_shard).await {
            for (i, status) in shard_results.map_err(Status::from)? {
                statuses[i] = status;
            }
        }
        use pb::ack_result::Status as S;
        Ok(statuses
            .into_iter()
            .map(|s| pb::AckResult {
                status: match s {
                    AckStatus::Ok => S::Ok,
                    AckStatus::Stale => S::Stale,
                    AckStatus::NotFound => S::NotFound,
                } as i32,
            })
            .collect())
    }
}
