//! The calls: timers (create, batches split per leader node, get, cancel,
//! reschedule, list, horizon), pull delivery (reserve from every node, ack,
//! nack) and the admin API.

use std::collections::BTreeMap;

use tocsin_proto::v1 as pb;
use tocsin_proto::v1::admin_service_client::AdminServiceClient;
use tocsin_proto::v1::timer_service_client::TimerServiceClient;

use crate::AdminOp;
use crate::Client;
use crate::ClientError;
use crate::conn::Conn;

/// Most items in one `CreateTimers` call: the server's default batch limit.
const MAX_ITEMS_PER_CALL: usize = 1_000;

/// One item of a `CreateTimers` answer as the client's result.
pub(crate) fn item_result(r: pb::CreateTimerResult) -> Result<pb::CreateTimerResponse, ClientError> {
    match r.result {
        Some(pb::create_timer_result::Result::Ok(ok)) => Ok(ok),
        Some(pb::create_timer_result::Result::Error(info)) => Err(ClientError::Status {
            code: tocsin_contract::codes::code_from_name(&info.code),
            message: info.message.clone(),
            info,
        }),
        None => Err(ClientError::Unreachable("empty result".into())),
    }
}

impl Client {
    /// Creates one timer (idempotent by `(namespace, id)`).
    ///
    /// An id that holds a finished timer with the same spec is refused
    /// (FAILED_PRECONDITION, reason `TIMER_FINISHED`) unless
    /// `replace_finished`, except on a retry: an attempt whose outcome was
    /// unknown may have created the timer, which may have fired since, so
    /// a retry that finds it finished answers `created: false` with it.
    ///
    /// Concurrent creates bound for the same node share a `CreateTimers`
    /// call while that node has calls out (`coalesce.rs`): each still gets
    /// its own item's answer, the one `CreateTimer` would give.
    pub async fn create_timer(&self, req: pb::CreateTimerRequest) -> Result<pb::CreateTimerResponse, ClientError> {
        let shard = self.shard_of(&req.namespace, &req.id);
        // Whether a shared call may have created the timer already: the
        // single path then treats its first call as a retry.
        let mut ambiguous = false;
        if self.inner.options.coalesce_in_flight > 0 {
            let mut coalesced_attempts = 0;
            // Only to a leader the map knows: a create whose leader is
            // unknown takes the single path, which finds it.
            while let Some(addr) = self.leader_addr(shard) {
                coalesced_attempts += 1;
                let item = match self.create_coalesced(&addr, req.clone()).await {
                    crate::coalesce::LaneOutcome::Item(item) => *item,
                    // No answer for the whole call: the single path below
                    // retries (it may find the call's create done).
                    crate::coalesce::LaneOutcome::CallFailed => {
                        ambiguous = true;
                        break;
                    }
                    crate::coalesce::LaneOutcome::Full => break,
                };
                match item {
                    Ok(resp) => return Ok(resp),
                    // Refused at admission, which weighs a shared call's
                    // items of a namespace together: asked again alone.
                    Err(e) if e.code() == tonic::Code::ResourceExhausted => break,
                    Err(e) if !e.retryable() => return self.finished_on_retry(&req, Err(e), ambiguous).await,
                    Err(e) => {
                        ambiguous = true;
                        if coalesced_attempts >= self.inner.options.max_attempts {
                            return Err(e);
                        }
                        // A hint moves the shard's route to its new leader.
                        if !self.learn(Some(shard), &e) {
                            tokio::time::sleep(self.backoff(coalesced_attempts)).await;
                            self.forget_leader(Some(shard));
                            self.refresh_after_failure().await;
                        }
                    }
                }
            }
        }
        let (result, resent) = self
            .call_counting_sends(Some(shard), |mut c| {
                let req = self.routed(req.clone());
                async move { c.create_timer(req).await }
            })
            .await;
        self.finished_on_retry(&req, result, ambiguous || resent).await
    }

    /// See [`Client::create_timer`]: a retried create that found its id
    /// finished is the earlier attempt's timer, answered `created: false`.
    async fn finished_on_retry(
        &self,
        req: &pb::CreateTimerRequest,
        result: Result<pb::CreateTimerResponse, ClientError>,
        retried: bool,
    ) -> Result<pb::CreateTimerResponse, ClientError> {
        match result {
            Err(e) if retried && e.is_timer_finished() => {
                let timer = self.get_timer(&req.namespace, &req.id).await?;
                Ok(pb::CreateTimerResponse { timer: Some(timer), created: false })
            }
            other => other,
        }
    }

    /// Creates many timers: split per leader node (see
    /// `create_batches`), sent concurrently, results in request order.
    ///
    /// Items a leader refused for a retryable reason (a leader change
    /// mid-batch, a shard shedding load) are sent again, still batched per
    /// leader, after a backoff that honours the largest retry hint; creates
    /// are idempotent. A call that failed as a whole has already been
    /// retried by [`Client::call`]. As with [`Client::create_timer`], an
    /// item sent again that finds its id holding a finished timer (the
    /// earlier call created it, and it fired since) answers `created:
    /// false` with that timer. (Retried one by one, a refused batch of
    /// 100 became 100 calls each retrying on its own, and a cluster that
    /// refused batches for a moment was kept overloaded by the retries.)
    pub async fn create_timers(
        &self,
        reqs: Vec<pb::CreateTimerRequest>,
    ) -> Vec<Result<pb::CreateTimerResponse, ClientError>> {
        let (mut out, mut refused) = self.create_batches(&reqs).await;
        let mut round = 1;
        loop {
            let retry: Vec<usize> =
                (0..reqs.len()).filter(|i| refused[*i] && matches!(&out[*i], Err(e) if e.retryable())).collect();
            if retry.is_empty() || round >= self.inner.options.max_attempts {
                return out;
            }
            let hint_ms = retry
                .iter()
                .filter_map(|i| match &out[*i] {
                    Err(ClientError::Status { info, .. }) => Some(info.retry_after_ms),
                    _ => None,
                })
                .max()
                .unwrap_or(0);
            // Learn from the refusals as `call` does, once per shard: a
            // hint moves the shard's route; a refusal that names no leader
            // (a leader cut off from its quorum, an answer that did not
            // come in time) forgets it, so the next round finds the leader
            // instead of asking the same node again. Overload is not
            // misrouting: its route stays. (Chaos partition-leader: the
            // batched calls sent to a leader cut off for over a second,
            // refused at once, were sent to it again round after round.)
            let mut refusals: BTreeMap<u32, &ClientError> = BTreeMap::new();
            for i in &retry {
                if let Err(e) = &out[*i]
                    && e.code() != tonic::Code::ResourceExhausted
                {
                    refusals.entry(self.shard_of(&reqs[*i].namespace, &reqs[*i].id)).or_insert(e);
                }
            }
            let mut forgot = false;
            for (shard, e) in refusals {
                if !self.learn(Some(shard), e) {
                    self.forget_leader(Some(shard));
                    forgot = true;
                }
            }
            tokio::time::sleep(self.backoff(round).max(std::time::Duration::from_millis(hint_ms))).await;
            if forgot {
                self.refresh_after_failure().await;
            }
            let again: Vec<pb::CreateTimerRequest> = retry.iter().map(|i| reqs[*i].clone()).collect();
            let (results, item_refused) = self.create_batches(&again).await;
            let answers = retry.iter().zip(results).map(|(i, r)| self.finished_on_retry(&reqs[*i], r, true));
            for ((i, r), item) in retry.iter().zip(futures::future::join_all(answers).await).zip(item_refused) {
                out[*i] = r;
                refused[*i] = item;
            }
            round += 1;
        }
    }

    /// One round of [`Client::create_timers`]: each result, and whether it
    /// is an item's own refusal (inside an answered call) rather than the
    /// failure of its whole call.
    ///
    /// Items go one call per leader node, not per shard: the node splits a
    /// call per shard itself, proposes to its shards at once and forwards
    /// what it no longer leads. Per shard, a batch of 100 over 16 shards
    /// was 16 calls of six items on one node, and the per-call cost (HTTP/2
    /// stream, headers, token check, decode) on both ends was most of a
    /// batched create's. Shards whose leader the map does not name, and the
    /// items of a node's call that failed as a whole, go per shard through
    /// [`Client::call`], which finds the leader and retries.
    async fn create_batches(
        &self,
        reqs: &[pb::CreateTimerRequest],
    ) -> (Vec<Result<pb::CreateTimerResponse, ClientError>>, Vec<bool>) {
        let n = reqs.len();
        let mut by_shard: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
        for (i, req) in reqs.iter().enumerate() {
            by_shard.entry(self.shard_of(&req.namespace, &req.id)).or_default().push(i);
        }
        // One look at the route per shard, not per item.
        let mut by_node: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        by_shard.retain(|shard, positions| match self.leader_addr(*shard) {
            Some(addr) => {
                by_node.entry(addr).or_default().append(positions);
                false
            }
            None => true,
        });
        let mut out: Vec<Option<Result<pb::CreateTimerResponse, ClientError>>> = (0..n).map(|_| None).collect();
        let mut refused = vec![false; n];
        // Items whose node call got no answer: that call may have created
        // them, so their next call is a retry (`finished_on_retry`).
        let mut ambiguous = vec![false; n];
        let node_calls = chunked(by_node).map(|(addr, positions)| async move {
            let timers = positions.iter().map(|i| reqs[*i].clone()).collect();
            let result = self.create_timers_at(&addr, timers).await;
            (positions, result)
        });
        for (positions, result) in futures::future::join_all(node_calls).await {
            match result {
                Ok(results) if results.len() == positions.len() => {
                    for (i, r) in positions.into_iter().zip(results) {
                        refused[i] = true;
                        out[i] = Some(r);
                    }
                }
                // The call failed as a whole (or was answered short): its
                // items go per shard, with `call`'s retries.
                _ => {
                    for i in positions {
                        ambiguous[i] = true;
                        by_shard.entry(self.shard_of(&reqs[i].namespace, &reqs[i].id)).or_default().push(i);
                    }
                }
            }
        }
        let shard_calls = chunked(by_shard).map(|(shard, positions)| async move {
            let timers: Vec<pb::CreateTimerRequest> = positions.iter().map(|i| reqs[*i].clone()).collect();
            let (result, resent) = self
                .call_counting_sends(Some(shard), |mut c| {
                    let req = self.routed(pb::CreateTimersRequest { timers: timers.clone() });
                    async move { c.create_timers(req).await }
                })
                .await;
            (positions, result, resent)
        });
        let mut answers = Vec::new();
        for (positions, result, resent) in futures::future::join_all(shard_calls).await {
            match result {
                Ok(resp) => {
                    for (i, r) in positions.into_iter().zip(resp.results) {
                        refused[i] = true;
                        // A retried create whose timer has fired since is
                        // the earlier attempt's timer, as for `create_timer`
                        // (seen in the chaos partition-leader run: a node
                        // call that waited on a forward past the deadline
                        // had created its other items, which then fired).
                        // Looked up together: one by one, a batch of such
                        // items waited a round trip each.
                        let retried = resent || ambiguous[i];
                        answers
                            .push(async move { (i, self.finished_on_retry(&reqs[i], item_result(r), retried).await) });
                    }
                }
                Err(e) => {
                    for i in positions {
                        out[i] = Some(Err(e.clone()));
                    }
                }
            }
        }
        for (i, r) in futures::future::join_all(answers).await {
            out[i] = Some(r);
        }
        let out =
            out.into_iter().map(|r| r.unwrap_or_else(|| Err(ClientError::Unreachable("no result".into())))).collect();
        (out, refused)
    }

    pub async fn get_timer(&self, namespace: &str, id: &str) -> Result<pb::Timer, ClientError> {
        self.get_timer_with(namespace, id, false).await
    }

    /// [`Client::get_timer`], with its attempt history in `attempts` when
    /// `include_attempts`.
    pub async fn get_timer_with(
        &self,
        namespace: &str,
        id: &str,
        include_attempts: bool,
    ) -> Result<pb::Timer, ClientError> {
        let shard = self.shard_of(namespace, id);
        let req = pb::GetTimerRequest { namespace: namespace.into(), id: id.into(), include_attempts };
        let resp = self
            .call(Some(shard), |mut c| {
                let req = self.routed(req.clone());
                async move { c.get_timer(req).await }
            })
            .await?;
        resp.timer.ok_or_else(|| ClientError::Unreachable("empty response".into()))
    }

    /// Cancels a timer; the answer is definite (see `Outcome`).
    pub async fn cancel_timer(&self, namespace: &str, id: &str) -> Result<pb::CancelTimerResponse, ClientError> {
        let shard = self.shard_of(namespace, id);
        let req = pb::CancelTimerRequest { namespace: namespace.into(), id: id.into() };
        self.call(Some(shard), |mut c| {
            let req = self.routed(req.clone());
            async move { c.cancel_timer(req).await }
        })
        .await
    }

    pub async fn reschedule_timer(&self, req: pb::RescheduleTimerRequest) -> Result<pb::Timer, ClientError> {
        let shard = self.shard_of(&req.namespace, &req.id);
        let resp = self
            .call(Some(shard), |mut c| {
                let req = self.routed(req.clone());
                async move { c.reschedule_timer(req).await }
            })
            .await?;
        resp.timer.ok_or_else(|| ClientError::Unreachable("empty response".into()))
    }

    /// One page of a namespace's timers (any node answers for all shards).
    pub async fn list_timers(&self, req: pb::ListTimersRequest) -> Result<pb::ListTimersResponse, ClientError> {
        self.call(None, |mut c| {
            let req = req.clone();
            async move { c.list_timers(req).await }
        })
        .await
    }

    /// Starts these DEAD timers over (at most 1,000 ids); one result per
    /// id, in order.
    pub async fn redrive_timers(
        &self,
        namespace: &str,
        ids: Vec<String>,
    ) -> Result<pb::RedriveTimersResponse, ClientError> {
        let req = pb::RedriveTimersRequest { namespace: namespace.into(), ids };
        self.call(None, |mut c| {
            let req = req.clone();
            async move { c.redrive_timers(req).await }
        })
        .await
    }

    /// Starts every DEAD timer of `namespace` over (of one `dead_reason`,
    /// if not empty): lists them a page at a time and redrives each page,
    /// calling `progress(redriven so far, not redriven so far)` after each.
    /// Returns the totals. A page is listed afresh after each round, so
    /// timers that die meanwhile are redriven too, and it ends when a page
    /// comes back empty.
    pub async fn redrive_dead(
        &self,
        namespace: &str,
        dead_reason: &str,
        mut progress: impl FnMut(u64, u64),
    ) -> Result<(u64, u64), ClientError> {
        use pb::redrive_result::Outcome;
        let (mut redriven, mut other) = (0u64, 0u64);
        let mut page_token = String::new();
        loop {
            let page = self
                .list_timers(pb::ListTimersRequest {
                    namespace: namespace.into(),
                    state: pb::timer::State::Dead as i32,
                    dead_reason: dead_reason.into(),
                    page_size: 1_000,
                    page_token: page_token.clone(),
                    ..Default::default()
                })
                .await?;
            if !page.timers.is_empty() {
                let ids = page.timers.into_iter().map(|t| t.id).collect();
                for r in self.redrive_timers(namespace, ids).await?.results {
                    if r.outcome == Outcome::Redriven as i32 { redriven += 1 } else { other += 1 }
                }
                progress(redriven, other);
            }
            if page.next_page_token.is_empty() {
                return Ok((redriven, other));
            }
            page_token = page.next_page_token;
        }
    }

    pub async fn horizon(&self, namespace: &str) -> Result<pb::GetHorizonResponse, ClientError> {
        let req = pb::GetHorizonRequest { namespace: namespace.into() };
        self.call(None, |mut c| {
            let req = req.clone();
            async move { c.get_horizon(req).await }
        })
        .await
    }

    /// Opens a reserve stream on every node (each serves the shards it
    /// leads) and merges them into one channel of batches.
    pub async fn reserve(
        &self,
        req: pb::ReserveRequest,
    ) -> Result<tokio::sync::mpsc::Receiver<pb::ReserveResponse>, ClientError> {
        let addrs: Vec<String> = match self.inner.route.read().expect("route lock").as_ref() {
            Some(r) if !r.addrs.is_empty() => r.addrs.values().cloned().collect(),
            _ => self.inner.seeds.clone(),
        };
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        for addr in addrs {
            let this = self.clone();
            let tx = tx.clone();
            let req = req.clone();
            tokio::spawn(async move {
                // Re-open the stream if the node restarts, until the consumer is gone.
                let mut attempt = 0u32;
                while !tx.is_closed() {
                    if let Ok(channel) = this.channel(&addr) {
                        let mut client = TimerServiceClient::new(channel).max_decoding_message_size(64 << 20);
                        if let Ok(resp) = client.reserve(req.clone()).await {
                            attempt = 0;
                            let end = tocsin_contract::relay::relay(&mut resp.into_inner(), &tx).await;
                            if end == tocsin_contract::relay::RelayEnd::ConsumerGone {
                                return;
                            }
                        }
                    }
                    attempt += 1;
                    tokio::time::sleep(this.backoff(attempt)).await;
                }
            });
        }
        Ok(rx)
    }

    /// Acks deliveries; each goes to the leader of its shard.
    pub async fn ack(&self, refs: Vec<pb::DeliveryRef>) -> Result<Vec<pb::AckResult>, ClientError> {
        self.settle(refs, None).await
    }

    /// Hands deliveries back for a retry after `delay_ms`.
    pub async fn nack(
        &self,
        refs: Vec<pb::DeliveryRef>,
        delay_ms: u64,
        reason: &str,
    ) -> Result<Vec<pb::AckResult>, ClientError> {
        self.settle(refs, Some((delay_ms, reason.to_string()))).await
    }

    pub(crate) async fn settle(
        &self,
        refs: Vec<pb::DeliveryRef>,
        nack: Option<(u64, String)>,
    ) -> Result<Vec<pb::AckResult>, ClientError> {
        let mut by_shard: BTreeMap<u32, Vec<(usize, pb::DeliveryRef)>> = BTreeMap::new();
        let n = refs.len();
        for (i, r) in refs.into_iter().enumerate() {
            by_shard.entry(self.shard_of(&r.namespace, &r.id)).or_default().push((i, r));
        }
        let mut out = vec![pb::AckResult::default(); n];
        for (shard, items) in by_shard {
            let (positions, deliveries): (Vec<usize>, Vec<pb::DeliveryRef>) = items.into_iter().unzip();
            let results = match &nack {
                None => {
                    self.call(Some(shard), |mut c| {
                        let req = self.routed(pb::AckRequest { deliveries: deliveries.clone() });
                        async move { c.ack(req).await }
                    })
                    .await?
                    .results
                }
                Some((delay_ms, reason)) => {
                    self.call(Some(shard), |mut c| {
                        let req = self.routed(pb::NackRequest {
                            deliveries: deliveries.clone(),
                            delay_ms: *delay_ms,
                            reason: reason.clone(),
                        });
                        async move { c.nack(req).await }
                    })
                    .await?
                    .results
                }
            };
            for (i, r) in positions.into_iter().zip(results) {
                out[i] = r;
            }
        }
        Ok(out)
    }

    /// The cluster's shard map, freshly loaded.
    pub async fn shard_map(&self) -> Result<pb::ShardMap, ClientError> {
        self.refresh().await
    }

    /// Cluster info from any node.
    pub async fn cluster(&self) -> Result<pb::ClusterInfo, ClientError> {
        self.cluster_with(false).await
    }

    /// Makes `to_node` the leader of `shard` (sent to the current leader);
    /// returns the leader once the transfer settled or its deadline passed.
    pub async fn transfer_leader(&self, shard: u32, to_node: u64) -> Result<u64, ClientError> {
        let resp = self
            .call_channel(Some(shard), |channel| async move {
                AdminServiceClient::new(channel).transfer_leader(pb::TransferLeaderRequest { shard, to_node }).await
            })
            .await?;
        Ok(resp.leader)
    }

    /// Creates a bearer token (needs `admin`); the answer holds its secret,
    /// shown this once.
    pub async fn create_token(&self, req: pb::CreateTokenRequest) -> Result<pb::CreateTokenResponse, ClientError> {
        self.call_channel(None, |channel| {
            let req = req.clone();
            async move { AdminServiceClient::new(channel).create_token(req).await }
        })
        .await
    }

    /// Every token's id and grants (needs `admin`).
    pub async fn list_tokens(&self) -> Result<Vec<pb::TokenInfo>, ClientError> {
        let resp = self
            .call_channel(None, |channel| async move {
                AdminServiceClient::new(channel).list_tokens(pb::ListTokensRequest {}).await
            })
            .await?;
        Ok(resp.tokens)
    }

    /// Revokes token `id` (needs `admin`); whether one was revoked.
    pub async fn revoke_token(&self, id: &str) -> Result<pb::RevokeTokenResponse, ClientError> {
        let req = pb::RevokeTokenRequest { id: id.into() };
        self.call_channel(None, |channel| {
            let req = req.clone();
            async move { AdminServiceClient::new(channel).revoke_token(req).await }
        })
        .await
    }

    /// Pauses (`paused`) or resumes a namespace's firing or an endpoint's
    /// deliveries (needs `admin`): give one of `namespace` and `endpoint`.
    pub async fn set_paused(&self, req: pb::SetPausedRequest) -> Result<pb::SetPausedResponse, ClientError> {
        self.call_channel(None, |channel| {
            let req = req.clone();
            async move { AdminServiceClient::new(channel).set_paused(req).await }
        })
        .await
    }

    /// Every paused namespace and endpoint (needs `admin`).
    pub async fn list_paused(&self) -> Result<pb::ListPausedResponse, ClientError> {
        self.call_channel(None, |channel| async move {
            AdminServiceClient::new(channel).list_paused(pb::ListPausedRequest {}).await
        })
        .await
    }

    /// Sets `namespace`'s quota (needs `admin`); both limits 0 clear it.
    pub async fn set_namespace_quota(
        &self,
        namespace: &str,
        max_pending: u64,
        creates_per_sec: u64,
    ) -> Result<pb::SetNamespaceQuotaResponse, ClientError> {
        let quota = pb::NamespaceQuota { namespace: namespace.into(), max_pending, creates_per_sec };
        let req = pb::SetNamespaceQuotaRequest { quota: Some(quota) };
        self.call_channel(None, |channel| {
            let req = req.clone();
            async move { AdminServiceClient::new(channel).set_namespace_quota(req).await }
        })
        .await
    }

    /// Every namespace quota (needs `admin`).
    pub async fn list_namespace_quotas(&self) -> Result<Vec<pb::NamespaceQuota>, ClientError> {
        let resp = self
            .call_channel(None, |channel| async move {
                AdminServiceClient::new(channel).list_namespace_quotas(pb::ListNamespaceQuotasRequest {}).await
            })
            .await?;
        Ok(resp.quotas)
    }

    /// Rotates, finishes rotating or clears `namespace`'s signing secret in
    /// the cluster map (needs `admin`).
    pub async fn set_namespace_secret(
        &self,
        req: pb::SetNamespaceSecretRequest,
    ) -> Result<pb::SetNamespaceSecretResponse, ClientError> {
        self.call_channel(None, |channel| {
            let req = req.clone();
            async move { AdminServiceClient::new(channel).set_namespace_secret(req).await }
        })
        .await
    }

    /// Every namespace with signing secrets in the map, by fingerprint
    /// (needs `admin`).
    pub async fn list_namespace_secrets(&self) -> Result<Vec<pb::NamespaceSecretInfo>, ClientError> {
        let resp = self
            .call_channel(None, |channel| async move {
                AdminServiceClient::new(channel).list_namespace_secrets(pb::ListNamespaceSecretsRequest {}).await
            })
            .await?;
        Ok(resp.secrets)
    }

    /// Every node's webhook endpoints (needs `admin`): each node keeps its
    /// own breakers and disabled URLs. One answer per node of the cluster
    /// map, with the error of a node that did not answer.
    pub async fn endpoints_on_every_node(
        &self,
    ) -> Result<Vec<(pb::NodeInfo, Result<pb::ListEndpointsResponse, ClientError>)>, ClientError> {
        let mut out = Vec::new();
        for node in self.live_nodes().await? {
            let answer = match self.channel(&node.grpc_addr) {
                Ok(channel) => AdminServiceClient::new(channel)
                    .list_endpoints(pb::ListEndpointsRequest {})
                    .await
                    .map(tonic::Response::into_inner)
                    .map_err(ClientError::from_status),
                Err(e) => Err(e),
            };
            out.push((node, answer));
        }
        Ok(out)
    }

    /// Enables `url`, which a `410 Gone` disabled, on every node (needs
    /// `admin`); one answer per node.
    pub async fn enable_endpoint_everywhere(
        &self,
        url: &str,
    ) -> Result<Vec<(pb::NodeInfo, Result<pb::EnableEndpointResponse, ClientError>)>, ClientError> {
        let mut out = Vec::new();
        for node in self.live_nodes().await? {
            let answer = match self.channel(&node.grpc_addr) {
                Ok(channel) => AdminServiceClient::new(channel)
                    .enable_endpoint(pb::EnableEndpointRequest { url: url.into() })
                    .await
                    .map(tonic::Response::into_inner)
                    .map_err(ClientError::from_status),
                Err(e) => Err(e),
            };
            out.push((node, answer));
        }
        Ok(out)
    }

    /// The cluster map's nodes that are not removed.
    async fn live_nodes(&self) -> Result<Vec<pb::NodeInfo>, ClientError> {
        let info = self.cluster().await?;
        Ok(info.nodes.into_iter().filter(|n| n.state != pb::node_info::State::Removed as i32).collect())
    }

    /// Starts a cluster operation on the first seed that answers and
    /// returns its progress stream. The operation runs on that node to the
    /// end even if the stream is dropped; re-running it is safe.
    pub async fn admin_op(&self, op: AdminOp) -> Result<tonic::Streaming<pb::Progress>, ClientError> {
        let mut last = ClientError::Unreachable("no seed given".into());
        for addr in self.inner.seeds.iter() {
            // No request timeout: catching a replica up may take minutes.
            let endpoint = self.endpoint(addr)?;
            let channel = match endpoint.connect().await {
                Ok(c) => Conn::new(c, self.inner.authorization.clone()),
                Err(e) => {
                    last = ClientError::Unreachable(format!("{addr}: {e}"));
                    continue;
                }
            };
            let mut admin = AdminServiceClient::new(channel);
            let result = match op.clone() {
                AdminOp::AddNode { grpc_addr, http_addr, peer_addr } => {
                    admin.add_node(pb::AddNodeRequest { grpc_addr, http_addr, peer_addr }).await
                }
                AdminOp::RemoveNode { node_id } => admin.remove_node(pb::RemoveNodeRequest { node_id }).await,
                AdminOp::DecommissionNode { node_id } => {
                    admin.decommission_node(pb::DecommissionNodeRequest { node_id }).await
                }
                AdminOp::MoveShard { shard, from_node, to_node } => {
                    admin.move_shard(pb::MoveShardRequest { shard, from_node, to_node }).await
                }
                AdminOp::Rebalance { dry_run } => admin.rebalance(pb::RebalanceRequest { dry_run }).await,
            };
            match result {
                Ok(stream) => return Ok(stream.into_inner()),
                Err(status) => {
                    let err = ClientError::from_status(status);
                    if !err.retryable() {
                        return Err(err);
                    }
                    last = err;
                }
            }
        }
        Err(last)
    }

    /// Cluster info from any node; with `digests`, each of that node's
    /// replicas also reports a digest of its timers (slow on big shards).
    pub async fn cluster_with(&self, digests: bool) -> Result<pb::ClusterInfo, ClientError> {
        let mut last = String::new();
        for attempt in 0..self.inner.seeds.len().max(1) as u32 {
            let addr = self.addr_for(None, attempt)?;
            match AdminServiceClient::new(self.channel(&addr)?).get_cluster(pb::GetClusterRequest { digests }).await {
                Ok(info) => return Ok(info.into_inner()),
                Err(e) => last = e.to_string(),
            }
        }
        Err(ClientError::Unreachable(last))
    }
}

/// Each group's positions in calls of at most [`MAX_ITEMS_PER_CALL`] items,
/// with the group's key (a node's address or a shard) beside each call.
fn chunked<K: Clone>(groups: BTreeMap<K, Vec<usize>>) -> impl Iterator<Item = (K, Vec<usize>)> {
    groups.into_iter().flat_map(|(key, positions)| {
        positions.chunks(MAX_ITEMS_PER_CALL).map(|chunk| (key.clone(), chunk.to_vec())).collect::<Vec<_>>()
    })
}
