//! Reads: one timer, listings across shards with page tokens, and the
//! horizon of upcoming fires, each against a leader's applied state after a
//! lease (or ReadIndex) check.

use tocsin_contract::json;
use tocsin_core::validate;
use tocsin_proto::v1 as pb;

use crate::api::parse::Keyed;
use crate::api::timers::TimerApi;
use crate::api::timers::leader_addr;
use crate::error::NodeError;

/// Most rows a list request reads in one shard before returning a short page.
const LIST_SCAN_BUDGET: usize = 10_000;

/// A list page token: the shard to resume in and the id to resume after.
fn encode_token(shard: u32, after_id: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(format!("{shard}:{after_id}"))
}

fn decode_token(token: &str) -> Result<(u32, Option<String>), NodeError> {
    use base64::Engine;
    if token.is_empty() {
        return Ok((0, None));
    }
    let bad = || NodeError::invalid("page_token", "is not a token this API returned");
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(token).map_err(|_| bad())?;
    let text = String::from_utf8(bytes).map_err(|_| bad())?;
    let (shard, id) = text.split_once(':').ok_or_else(bad)?;
    let shard: u32 = shard.parse().map_err(|_| bad())?;
    Ok((shard, (!id.is_empty()).then(|| id.to_string())))
}

impl TimerApi {
    pub(super) async fn get(&self, target: Keyed, include_attempts: bool) -> Result<pb::GetTimerResponse, NodeError> {
        let Keyed { key, shard } = target;
        let ctx = self.node.shard(shard)?;
        match self.read_record(&ctx, &key).await? {
            Some(record) => {
                let cluster_id = ctx.cluster_id().unwrap_or_default();
                // An armed fire whose time has not come reads as scheduled.
                let record = record.as_of(ctx.clock.now_ms());
                let mut timer = json::timer_proto(cluster_id, ctx.shard, &key, &record);
                if include_attempts {
                    timer.attempts = json::attempts_proto(cluster_id, ctx.shard, &record);
                }
                Ok(pb::GetTimerResponse { timer: Some(timer) })
            }
            None => Err(NodeError::NotFound(format!("no timer {key}"))),
        }
    }

    /// One page of a namespace's timers, shard by shard. Each shard is read
    /// at its leader: here, or by forwarding a one-shard request.
    pub(super) async fn list(
        &self,
        req: pb::ListTimersRequest,
        forwarded: bool,
        only: Option<u32>,
    ) -> Result<pb::ListTimersResponse, NodeError> {
        validate::check_namespace(&req.namespace)?;
        let page_size = match req.page_size {
            0 => 100,
            n if n as usize > self.limits().max_page_size => {
                return Err(NodeError::invalid("page_size", format!("at most {}", self.limits().max_page_size)));
            }
            n => n as usize,
        };
        let state = match req.state {
            0 => None,
            s => Some(
                pb::timer::State::try_from(s).map_err(|_| NodeError::invalid("state", format!("unknown state {s}")))?,
            ),
        };
        let dead_reason = match req.dead_reason.as_str() {
            "" => None,
            name => Some(tocsin_core::timer::DeadReason::from_name(name).ok_or_else(|| {
                let names: Vec<&str> = tocsin_core::timer::DeadReason::ALL.iter().map(|r| r.name()).collect();
                NodeError::invalid("dead_reason", format!("unknown reason {name:?}: use {}", names.join(", ")))
            })?),
        };
        if dead_reason.is_some() && state.is_some_and(|s| s != pb::timer::State::Dead) {
            return Err(NodeError::invalid("dead_reason", "filters DEAD timers; give state DEAD or none"));
        }
        let (after_ms, before_ms) =
            (req.fire_after_ms, if req.fire_before_ms == 0 { u64::MAX } else { req.fire_before_ms });
        if after_ms >= before_ms {
            return Err(NodeError::invalid("fire_before_ms", "must be after fire_after_ms"));
        }
        let (mut shard, mut after_id) = decode_token(&req.page_token)?;
        let num_shards = self.node.config.num_shards;
        if shard >= num_shards || only.is_some_and(|o| o >= num_shards) {
            return Err(NodeError::invalid("page_token", "names a shard this cluster does not have"));
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
                    // Filtered and shown as clients see them: an armed fire whose
                    // time has not come is scheduled.
                    let now_ms = ctx.clock.now_ms();
                    let (page, resume) = tokio::task::spawn_blocking(move || {
                        store.list_namespace(group, &namespace, after.as_deref(), want, LIST_SCAN_BUDGET, |r| {
                            state.is_none_or(|s| json::state_proto(r.as_of(now_ms).state) == s)
                                && dead_reason.is_none_or(|d| r.fire.as_ref().and_then(|f| f.dead_reason) == Some(d))
                                && r.fire_at_ms >= after_ms
                                && r.fire_at_ms < before_ms
                        })
                    })
                    .await
                    .map_err(|e| NodeError::Internal(e.to_string()))?
                    .map_err(|e| NodeError::Internal(format!("listing: {e}")))?;
                    let cluster_id = ctx.cluster_id().unwrap_or_default();
                    timers.extend(page.iter().map(|(k, r)| json::timer_proto(cluster_id, shard, k, &r.as_of(now_ms))));
                    resume
                }
                Err(e) => {
                    let Some((addr, _)) = leader_addr(&self.node, &e).filter(|_| !forwarded) else { return Err(e) };
                    let sub = pb::ListTimersRequest {
                        page_size: want as u32,
                        page_token: encode_token(shard, after_id.as_deref().unwrap_or("")),
                        ..req.clone()
                    };
                    let resp = self
                        .forward(&addr, sub, Some(shard), |mut c, r| async move { c.list_timers(r).await })
                        .await
                        .map_err(crate::api::timers::forward_failed)?;
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

    pub(super) async fn horizon(
        &self,
        namespace: &str,
        forwarded: bool,
        only: Option<u32>,
    ) -> Result<pb::GetHorizonResponse, NodeError> {
        validate::check_namespace(namespace)?;
        let now = self.node.clock.now_ms();
        let bucket = tocsin_core::limits::HORIZON_BUCKET_MS;
        let now_min = now / bucket;
        let mut out = pb::GetHorizonResponse {
            as_of_ms: now,
            bucket_ms: bucket,
            next_hour_by_minute: vec![0; 60],
            ..Default::default()
        };
        let add_minutes = |out: &mut pb::GetHorizonResponse, minutes: &[u64]| {
            for (sum, n) in out.next_hour_by_minute.iter_mut().zip(minutes) {
                *sum += n;
            }
        };
        let shards: Vec<u32> = match only {
            Some(s) if s < self.node.config.num_shards => vec![s],
            Some(_) => return Err(NodeError::invalid("shard", "no such shard")),
            None => (0..self.node.config.num_shards).collect(),
        };
        for shard in shards {
            let ctx = self.node.shard(shard)?;
            if let Err(e) = self.read_leader(&ctx).await {
                let Some((addr, _)) = leader_addr(&self.node, &e).filter(|_| !forwarded) else { return Err(e) };
                let req = pb::GetHorizonRequest { namespace: namespace.to_string() };
                let h = self
                    .forward(&addr, req, Some(shard), |mut c, r| async move { c.get_horizon(r).await })
                    .await
                    .map_err(crate::api::timers::forward_failed)?;
                out.overdue += h.overdue;
                out.next_minute += h.next_minute;
                out.next_hour += h.next_hour;
                out.next_day += h.next_day;
                add_minutes(&mut out, &h.next_hour_by_minute);
                continue;
            }
            let store = ctx.store.clone();
            let group = ctx.group;
            let ns = namespace.to_string();
            let (counts, minutes) = tokio::task::spawn_blocking(move || -> std::io::Result<([u64; 4], Vec<u64>)> {
                Ok((
                    [
                        store.horizon_count(group, &ns, 0, now_min)?,
                        store.horizon_count(group, &ns, now_min, now_min + 1)?,
                        store.horizon_count(group, &ns, now_min, now_min + 60)?,
                        store.horizon_count(group, &ns, now_min, now_min + 1440)?,
                    ],
                    store.horizon_minutes(group, &ns, now_min, 60)?,
                ))
            })
            .await
            .map_err(|e| NodeError::Internal(e.to_string()))?
            .map_err(|e| NodeError::Internal(format!("horizon: {e}")))?;
            out.overdue += counts[0];
            out.next_minute += counts[1];
            out.next_hour += counts[2];
            out.next_day += counts[3];
            add_minutes(&mut out, &minutes);
        }
        Ok(out)
    }
}
