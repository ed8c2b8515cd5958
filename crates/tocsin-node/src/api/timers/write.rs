//! Writes: creates (one, and batches split per shard and per leader),
//! cancels and reschedules, each proposed through its shard's proposer on
//! the node that leads it.

use std::collections::BTreeMap;
use std::collections::HashMap;

use tocsin_contract::json;
use tocsin_core::Command;
use tocsin_core::CommandResult;
use tocsin_core::TimerKey;
use tocsin_core::cluster::NamespaceQuota;
use tocsin_core::command::SkipReason;
use tocsin_core::validate;
use tocsin_proto::v1 as pb;
use tonic::Response;
use tonic::Status;

use crate::api::parse;
use crate::api::parse::Keyed;
use crate::api::parse::ValidCreate;
use crate::api::parse::ValidReschedule;
use crate::api::timers::TimerApi;
use crate::api::timers::leader_addr;
use crate::error::NodeError;
use crate::forward;
use crate::shard::ShardCtx;

impl TimerApi {
    /// The create command, stamped with this leader's clock: the fire
    /// time's range is checked here, against the clock that stamps it.
    pub(super) fn create_command(&self, valid: ValidCreate) -> Result<Command, NodeError> {
        let limits = self.limits();
        let now_ms = self.node.clock.now_ms();
        let mut fire_at_ms = validate::resolve_fire_at(valid.spec.fire_time, now_ms, limits)?;
        if let Some(recurrence) = &valid.spec.recurrence {
            // The fire time is the series' start; its first occurrence is
            // worked out here, by the clock that stamps it.
            fire_at_ms = validate::first_occurrence(recurrence, fire_at_ms, now_ms, limits)?;
        }
        let retry = validate::effective_retry(&valid.spec.retry, limits);
        Ok(Command::Create {
            key: valid.target.key,
            spec: Box::new(valid.spec),
            fire_at_ms,
            retry,
            retention_ms: limits.retention_ms,
            replace_finished: valid.replace_finished,
        })
    }

    pub(super) fn create_result(
        &self,
        ctx: &ShardCtx,
        key: &TimerKey,
        result: CommandResult,
    ) -> Result<pb::CreateTimerResponse, NodeError> {
        match result {
            // A create that finds its timer armed (`tocsin_core::arm`) shows it
            // as the scheduled timer it still is.
            CommandResult::Created { record, created } => Ok(pb::CreateTimerResponse {
                timer: Some(json::timer_proto(
                    ctx.cluster_id().unwrap_or_default(),
                    ctx.shard,
                    key,
                    &record.as_of(ctx.clock.now_ms()),
                )),
                created,
            }),
            CommandResult::AlreadyExists { record } if record.state.is_terminal() => {
                Err(NodeError::AlreadyExists(format!(
                    "timer {key} already exists with a different spec and is {} (finished); create with \
                     replace_finished to start a new timer under this id",
                    record.state.name()
                )))
            }
            CommandResult::AlreadyExists { .. } => {
                Err(NodeError::AlreadyExists(format!("timer {key} already exists with a different spec")))
            }
            CommandResult::Finished { record } => Err(NodeError::TimerFinished(format!(
                "timer {key} is {} (finished at {} ms, generation {}): nothing was created and nothing will \
                 fire; create with replace_finished to start a new timer under this id",
                record.state.name(),
                record.finished_at_ms,
                record.generation
            ))),
            CommandResult::Skipped { reason: SkipReason::OverLimit } => {
                Err(NodeError::invalid("payload", "exceeds the compiled-in hard limit"))
            }
            other => Err(NodeError::Internal(format!("unexpected create result {other:?}"))),
        }
    }

    pub(super) async fn create_one(&self, valid: ValidCreate) -> Result<pb::CreateTimerResponse, NodeError> {
        let ctx = self.node.shard(valid.target.shard)?;
        let propose_error = |e| NodeError::from_propose(ctx.shard, e);
        // Not the leader: answered before admission is charged, so the
        // request is forwarded and charged only where it is proposed.
        ctx.check_leader().map_err(propose_error)?;
        self.node.admission.admit_create(&valid.target.key.namespace, 1)?;
        self.admit_quota(&ctx, &valid.target.key.namespace, vec![valid.target.key.clone()]).await?;
        ctx.proposer.admit_create().map_err(propose_error)?;
        let key = valid.target.key.clone();
        let command = self.create_command(valid)?;
        let (_, result) = ctx.proposer.propose(command).await.map_err(propose_error)?;
        self.create_result(&ctx, &key, result)
    }

    /// Checks `namespace`'s quota (if it has one) for creates of `keys` on
    /// `ctx`'s shard: its create rate and its pending timers, each the
    /// shard's share of the cluster-wide limit. Pending is counted as of
    /// the last applied entry, so creates in flight at that moment can pass
    /// it by at most their number. When the pending limit is reached, a
    /// create (or a batch's creates in the namespace) whose keys all exist
    /// already, a client's retry answered by apply as before, is still let
    /// through: only creates that would add a timer are refused (an id
    /// holding a finished timer counts as free, since a create may replace it).
    pub(super) async fn admit_quota(
        &self,
        ctx: &ShardCtx,
        namespace: &str,
        keys: Vec<TimerKey>,
    ) -> Result<(), NodeError> {
        let map = self.node.map.get();
        let Some(quota) = map.quotas.get(namespace).copied() else { return Ok(()) };
        let num_shards = self.node.config.num_shards;
        let count = keys.len() as u64;
        let rate = NamespaceQuota::share(quota.creates_per_sec, num_shards);
        if rate > 0 {
            self.node.admission.admit_quota_rate(namespace, ctx.shard, rate, count)?;
        }
        let max_pending = NamespaceQuota::share(quota.max_pending, num_shards);
        if max_pending == 0 {
            return Ok(());
        }
        let (store, group, ns) = (ctx.store.clone(), ctx.group, namespace.to_string());
        let verdict = tokio::task::spawn_blocking(move || -> std::io::Result<Option<u64>> {
            let pending = store.pending_count(group, &ns)?;
            if pending.saturating_add(count) <= max_pending {
                return Ok(None);
            }
            for key in &keys {
                // A finished timer does not count as there: a create may
                // replace it (`replace_finished`), adding a pending one.
                if store.get_timer(group, key)?.is_none_or(|r| r.state.is_terminal()) {
                    return Ok(Some(pending));
                }
            }
            Ok(None)
        })
        .await
        .map_err(|e| NodeError::Internal(format!("quota check: {e}")))?
        .map_err(|e| NodeError::Internal(format!("quota check: {e}")))?;
        match verdict {
            None => Ok(()),
            Some(pending) => {
                metrics::counter!("tocsin_creates_over_quota_total", "quota" => "max_pending").increment(count);
                Err(NodeError::ResourceExhausted {
                    message: format!(
                        "namespace {namespace} is at its quota of {} unfinished timers ({pending} on shard {}, \
                         whose share is {max_pending}); cancel some or wait for them to fire",
                        quota.max_pending, ctx.shard
                    ),
                    retry_after_ms: 1_000,
                })
            }
        }
    }

    pub(super) async fn cancel(&self, target: Keyed) -> Result<pb::CancelTimerResponse, NodeError> {
        let Keyed { key, shard } = target;
        let ctx = self.node.shard(shard)?;
        let (index, result) = ctx
            .proposer
            .propose(Command::Cancel { key: key.clone() })
            .await
            .map_err(|e| NodeError::from_propose(ctx.shard, e))?;
        use pb::cancel_timer_response::Outcome;
        let mut attempt_in_flight = false;
        let (outcome, record) = match result {
            CommandResult::Cancelled { record } => (Outcome::Cancelled, Some(record)),
            CommandResult::CancelledWhileFiring { record, attempt_in_flight: in_flight } => {
                attempt_in_flight = in_flight;
                (Outcome::CancelledWhileFiring, Some(record))
            }
            CommandResult::AlreadyCancelled { record } => (Outcome::AlreadyCancelled, Some(record)),
            CommandResult::AlreadyFired { record } => (Outcome::AlreadyFired, Some(record)),
            CommandResult::NotFound => (Outcome::NotFound, None),
            other => return Err(NodeError::Internal(format!("unexpected cancel result {other:?}"))),
        };
        Ok(pb::CancelTimerResponse {
            outcome: outcome as i32,
            fire: record.as_ref().and_then(|r| json::fire_proto(ctx.cluster_id().unwrap_or_default(), ctx.shard, r)),
            timer: record.as_ref().map(|r| json::timer_proto(ctx.cluster_id().unwrap_or_default(), ctx.shard, &key, r)),
            applied_index: index,
            attempt_in_flight,
        })
    }

    pub(super) async fn reschedule(&self, valid: ValidReschedule) -> Result<pb::RescheduleTimerResponse, NodeError> {
        let ValidReschedule { target: Keyed { key, shard }, expected_generation, fire_time } = valid;
        let ctx = self.node.shard(shard)?;
        let fire_at_ms = validate::resolve_fire_at(fire_time, self.node.clock.now_ms(), self.limits())?;
        let command = Command::Reschedule { key: key.clone(), expected_generation, fire_at_ms };
        let (_, result) = ctx.proposer.propose(command).await.map_err(|e| NodeError::from_propose(ctx.shard, e))?;
        match result {
            CommandResult::Rescheduled { record } => Ok(pb::RescheduleTimerResponse {
                timer: Some(json::timer_proto(ctx.cluster_id().unwrap_or_default(), ctx.shard, &key, &record)),
            }),
            CommandResult::GenerationMismatch { current } => Err(NodeError::FailedPrecondition(format!(
                "generation is {current}, not {expected_generation}: the timer changed since you read it"
            ))),
            CommandResult::NotScheduled { state } => Err(NodeError::FailedPrecondition(format!(
                "timer is {}; only SCHEDULED timers can be rescheduled",
                state.name()
            ))),
            CommandResult::NotFound => Err(NodeError::NotFound(format!("no timer {key}"))),
            other => Err(NodeError::Internal(format!("unexpected reschedule result {other:?}"))),
        }
    }

    /// `RedriveTimers`: each id's shard's items are proposed where that
    /// shard is led (here, or one forwarded sub-request per shard), results
    /// in request order.
    pub(super) async fn redrive(
        &self,
        req: pb::RedriveTimersRequest,
        forwarded: bool,
    ) -> Result<pb::RedriveTimersResponse, NodeError> {
        validate::check_namespace(&req.namespace)?;
        if req.ids.is_empty() {
            return Err(NodeError::invalid("ids", "give at least one id"));
        }
        if req.ids.len() > self.limits().max_batch {
            return Err(NodeError::invalid("ids", format!("at most {} ids per call", self.limits().max_batch)));
        }
        let mut by_shard: BTreeMap<u32, Vec<(usize, TimerKey)>> = BTreeMap::new();
        for (i, id) in req.ids.iter().enumerate() {
            let target = parse::key(&req.namespace, id, self.node.config.num_shards)?;
            by_shard.entry(target.shard).or_default().push((i, target.key));
        }
        let calls = by_shard.into_iter().map(|(shard, items)| self.redrive_in_shard(shard, items, forwarded));
        let mut results: Vec<Option<pb::RedriveResult>> = vec![None; req.ids.len()];
        for (i, result) in futures::future::join_all(calls).await.into_iter().flatten() {
            results[i] = Some(result);
        }
        Ok(pb::RedriveTimersResponse {
            results: results.into_iter().map(|r| r.expect("every id has a result")).collect(),
        })
    }

    async fn redrive_in_shard(
        &self,
        shard: u32,
        items: Vec<(usize, TimerKey)>,
        forwarded: bool,
    ) -> Vec<(usize, pb::RedriveResult)> {
        use pb::redrive_result::Outcome;
        let failed = |items: &[(usize, TimerKey)], e: &NodeError| -> Vec<(usize, pb::RedriveResult)> {
            items
                .iter()
                .map(|(i, key)| {
                    let result = pb::RedriveResult {
                        id: key.id.clone(),
                        outcome: Outcome::Failed as i32,
                        error: Some(e.info()),
                        ..Default::default()
                    };
                    (*i, result)
                })
                .collect()
        };
        let ctx = match self.node.shard(shard) {
            Ok(ctx) => ctx,
            Err(e) => return failed(&items, &e),
        };
        if let Err(e) = ctx.check_leader() {
            let e = NodeError::from_propose(ctx.shard, e);
            let Some((addr, _)) = leader_addr(&self.node, &e).filter(|_| !forwarded) else {
                return failed(&items, &e);
            };
            let namespace = items[0].1.namespace.clone();
            let sub = pb::RedriveTimersRequest { namespace, ids: items.iter().map(|(_, k)| k.id.clone()).collect() };
            return match self
                .forward(&addr, sub, Some(shard), |mut c, r| async move { c.redrive_timers(r).await })
                .await
            {
                Ok(resp) => items.iter().map(|(i, _)| *i).zip(resp.results).collect(),
                Err(status) => failed(&items, &NodeError::from_status(&status)),
            };
        }
        let commands = items.iter().map(|(_, key)| Command::Redrive { key: key.clone() }).collect();
        let applied = ctx.proposer.propose_all(commands).await;
        let cluster_id = ctx.cluster_id().unwrap_or_default();
        items
            .into_iter()
            .zip(applied)
            .map(|((i, key), applied)| {
                let timer =
                    |record: &tocsin_core::TimerRecord| Some(json::timer_proto(cluster_id, shard, &key, record));
                let result = match applied {
                    Ok((_, CommandResult::Redriven { record })) => pb::RedriveResult {
                        id: key.id.clone(),
                        outcome: Outcome::Redriven as i32,
                        timer: timer(&record),
                        error: None,
                    },
                    Ok((_, CommandResult::NotDead { record })) => pb::RedriveResult {
                        id: key.id.clone(),
                        outcome: Outcome::NotDead as i32,
                        timer: timer(&record),
                        error: None,
                    },
                    Ok((_, CommandResult::NotFound)) => pb::RedriveResult {
                        id: key.id.clone(),
                        outcome: Outcome::NotFound as i32,
                        ..Default::default()
                    },
                    Ok((_, other)) => pb::RedriveResult {
                        id: key.id.clone(),
                        outcome: Outcome::Failed as i32,
                        error: Some(NodeError::Internal(format!("unexpected redrive result {other:?}")).info()),
                        ..Default::default()
                    },
                    Err(e) => pb::RedriveResult {
                        id: key.id.clone(),
                        outcome: Outcome::Failed as i32,
                        error: Some(NodeError::from_propose(shard, e).info()),
                        ..Default::default()
                    },
                };
                (i, result)
            })
            .collect()
    }

    /// Creates a batch; every item gets its own result. Items are parsed
    /// here once; each shard's items are charged admission and stamped
    /// only if this node leads that shard (the rest are forwarded by the
    /// caller and charged where they are proposed).
    pub(super) async fn create_batch(
        &self,
        timers: &[pb::CreateTimerRequest],
        map_epoch: u64,
    ) -> Result<Vec<Result<pb::CreateTimerResponse, NodeError>>, NodeError> {
        if timers.is_empty() {
            return Err(NodeError::invalid("timers", "give at least one timer"));
        }
        if timers.len() > self.limits().max_batch {
            return Err(NodeError::invalid("timers", format!("at most {} timers per call", self.limits().max_batch)));
        }
        let n = timers.len();
        let mut results: Vec<Option<Result<pb::CreateTimerResponse, NodeError>>> = (0..n).map(|_| None).collect();
        // Parse each; group the valid ones by shard.
        let mut by_shard: BTreeMap<u32, Vec<(usize, ValidCreate)>> = BTreeMap::new();
        for (i, item) in timers.iter().enumerate() {
            match parse::create(
                item,
                self.limits(),
                self.node.config.num_shards,
                self.node.dispatcher.webhook.egress(),
                &self.node.dispatcher.amqp,
            ) {
                Ok(valid) => by_shard.entry(valid.target.shard).or_default().push((i, valid)),
                Err(e) => results[i] = Some(Err(e)),
            }
        }
        let futures = by_shard.into_iter().map(|(shard, items)| self.create_in_shard(shard, items, map_epoch));
        for (i, result) in futures::future::join_all(futures).await.into_iter().flatten() {
            results[i] = Some(result);
        }
        Ok(results.into_iter().map(|r| r.expect("every item has a result")).collect())
    }

    /// One shard's part of a batch.
    pub(super) async fn create_in_shard(
        &self,
        shard: u32,
        items: Vec<(usize, ValidCreate)>,
        map_epoch: u64,
    ) -> Vec<(usize, Result<pb::CreateTimerResponse, NodeError>)> {
        let all_fail = |items: Vec<(usize, ValidCreate)>, e: NodeError| -> Vec<_> {
            items.into_iter().map(|(i, _)| (i, Err(e.clone()))).collect()
        };
        let ctx = match self.node.check_route(shard, map_epoch).and_then(|()| self.node.shard(shard)) {
            Ok(ctx) => ctx,
            Err(e) => return all_fail(items, e),
        };
        if let Err(e) = ctx.check_leader().and_then(|()| ctx.proposer.admit_create()) {
            return all_fail(items, NodeError::from_propose(ctx.shard, e));
        }
        let mut per_namespace: HashMap<&str, u64> = HashMap::new();
        for (_, valid) in &items {
            *per_namespace.entry(valid.target.key.namespace.as_str()).or_default() += 1;
        }
        let mut refused: HashMap<String, NodeError> = per_namespace
            .into_iter()
            .filter_map(|(ns, count)| self.node.admission.admit_create(ns, count).err().map(|e| (ns.to_string(), e)))
            .collect();
        let map = self.node.map.get();
        if !map.quotas.is_empty() {
            let mut by_namespace: BTreeMap<&str, Vec<TimerKey>> = BTreeMap::new();
            for (_, valid) in &items {
                let ns = valid.target.key.namespace.as_str();
                if map.quotas.contains_key(ns) && !refused.contains_key(ns) {
                    by_namespace.entry(ns).or_default().push(valid.target.key.clone());
                }
            }
            for (ns, keys) in by_namespace {
                if let Err(e) = self.admit_quota(&ctx, ns, keys).await {
                    refused.insert(ns.to_string(), e);
                }
            }
        }
        let mut out = Vec::with_capacity(items.len());
        let mut keys = Vec::with_capacity(items.len());
        let mut commands = Vec::with_capacity(items.len());
        for (i, valid) in items {
            if let Some(e) = refused.get(&valid.target.key.namespace) {
                out.push((i, Err(e.clone())));
                continue;
            }
            let key = valid.target.key.clone();
            match self.create_command(valid) {
                Ok(command) => {
                    keys.push((i, key));
                    commands.push(command);
                }
                Err(e) => out.push((i, Err(e))),
            }
        }
        let applied = ctx.proposer.propose_all(commands).await;
        out.extend(keys.into_iter().zip(applied).map(|((i, key), result)| {
            let result = result
                .map_err(|e| NodeError::from_propose(ctx.shard, e))
                .and_then(|(_, r)| self.create_result(&ctx, &key, r));
            (i, result)
        }));
        out
    }

    /// `CreateTimers`: the items this node leads are created here; the
    /// rest go to their leaders, one sub-batch per leader (unless this
    /// request was forwarded already).
    pub(super) async fn create_timers_routed(
        &self,
        originals: Vec<pb::CreateTimerRequest>,
        map_epoch: u64,
        forwarded: bool,
    ) -> Result<Response<pb::CreateTimersResponse>, Status> {
        let mut results = self.create_batch(&originals, map_epoch).await?;
        let mut forwarded_to = None;
        // Items whose shard another node leads go there, one sub-batch per leader.
        if !forwarded {
            let mut by_leader: BTreeMap<(String, u64), Vec<usize>> = BTreeMap::new();
            for (i, r) in results.iter().enumerate() {
                if let Err(e) = r
                    && let Some(leader) = leader_addr(&self.node, e)
                {
                    by_leader.entry(leader).or_default().push(i);
                }
            }
            // One leader answered every forwarded item: a call of one
            // shard's items tells the client where that shard went; of
            // several shards', that its map is stale (`coalesce.rs`).
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
                            Err(NodeError::from_info(tocsin_contract::codes::code_from_name(&info.code), info))
                        }
                        None => continue,
                    };
                }
            }
            forwarded_to = only_leader;
        }
        // A call answers OK with its items' own errors, which the call
        // counter cannot show: counted here, by the node the client called.
        if !forwarded {
            for e in results.iter().filter_map(|r| r.as_ref().err()) {
                let code = tocsin_contract::codes::code_name(e.code());
                metrics::counter!("tocsin_create_items_refused_total", "code" => code).increment(1);
            }
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
}
