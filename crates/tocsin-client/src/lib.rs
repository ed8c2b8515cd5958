//! The shard-aware Tocsin client.
//!
//! It fetches the shard map from any seed node and caches it, hashes each
//! timer's `(namespace, id)` to its shard with the same function the servers
//! use, and sends the request straight to that shard's leader, skipping the
//! forwarding hop a plain HTTP or gRPC client pays. When a node answers "not
//! the leader" it follows the hint; on `UNAVAILABLE`, a transport error or a
//! timeout it refreshes the map and retries with bounded, jittered backoff.
//!
//! Every routed request carries the cluster map epoch it was routed by
//! (`x-tocsin-map-epoch`). A node refuses a request whose shard's replicas
//! changed after that epoch with `ABORTED` and its own epoch; the client then
//! refreshes its map (once, however many requests were refused) and retries.
//!
//! Retrying is safe because the API is idempotent by design: a create is
//! keyed by the client's id (a repeat with the same spec returns the existing
//! timer), and a cancel answers definitely whether it ran now or earlier.
//! `CreateTimers` batches are split per shard and sent concurrently.
//!
//! ```no_run
//! # async fn example() -> Result<(), tocsin_client::ClientError> {
//! use tocsin_client::Client;
//! let client = Client::connect(["127.0.0.1:7070"]).await?;
//! let created = client.create_timer(tocsin_client::webhook_timer("orders", "order-42", 1_800_000, "http://127.0.0.1:9000/hook")).await?;
//! println!("{:?}", created.timer);
//! # Ok(()) }
//! ```
//!
//! **Architecture Invariant:** this crate links neither RocksDB nor openraft;
//! routing uses `tocsin-core` only.

use std::collections::BTreeMap;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::RwLock;
use std::time::Duration;
use std::time::Instant;

use prost::Message;
use tocsin_proto::v1 as pb;
use tocsin_proto::v1::admin_service_client::AdminServiceClient;
use tocsin_proto::v1::timer_service_client::TimerServiceClient;
use tonic::transport::Channel;
use tonic::transport::Endpoint;

pub use tocsin_proto::v1;

/// Why a call failed.
#[derive(Clone, Debug, thiserror::Error)]
pub enum ClientError {
    /// The server answered with an error; `info` says what it needs.
    #[error("{code:?}: {message}")]
    Status { code: tonic::Code, message: String, info: pb::ErrorInfo },
    /// No node could be reached.
    #[error("no node reachable: {0}")]
    Unreachable(String),
    #[error("bad argument: {0}")]
    Argument(String),
}

impl ClientError {
    pub fn code(&self) -> tonic::Code {
        match self {
            ClientError::Status { code, .. } => *code,
            ClientError::Unreachable(_) => tonic::Code::Unavailable,
            ClientError::Argument(_) => tonic::Code::InvalidArgument,
        }
    }

    fn from_status(status: tonic::Status) -> ClientError {
        let info = pb::ErrorInfo::decode(status.details()).unwrap_or_default();
        // tonic reports the channel's own deadline as CANCELLED "Timeout
        // expired", a connection lost mid-call as UNKNOWN "transport
        // error", and one that closed with the call still queued on it as
        // CANCELLED "operation was canceled" (hyper's words); all mean "no
        // answer, outcome unknown", which every operation here may retry
        // (creates and cancels are idempotent). The last was 44,563 of the
        // 51,753 creates the chaos `flapping-partitions` row gave up on.
        let code = match status.code() {
            tonic::Code::Cancelled if status.message().contains("Timeout expired") => tonic::Code::DeadlineExceeded,
            tonic::Code::Cancelled if status.message().contains("operation was canceled") => tonic::Code::Unavailable,
            tonic::Code::Unknown if status.message().contains("transport error") => tonic::Code::Unavailable,
            code => code,
        };
        ClientError::Status { code, message: status.message().to_string(), info }
    }

    /// Whether retrying the same request may succeed.
    fn retryable(&self) -> bool {
        matches!(
            self.code(),
            tonic::Code::Unavailable
                | tonic::Code::DeadlineExceeded
                | tonic::Code::ResourceExhausted
                | tonic::Code::Aborted
        )
    }
}

/// Timeouts and retry bounds.
#[derive(Clone, Debug)]
pub struct ClientOptions {
    /// Deadline of one attempt.
    pub request_timeout: Duration,
    pub connect_timeout: Duration,
    /// Attempts per call, including the first.
    pub max_attempts: u32,
    /// First retry delay; doubles per attempt up to `max_backoff`, with jitter.
    pub initial_backoff: Duration,
    pub max_backoff: Duration,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            request_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(2),
            max_attempts: 10,
            initial_backoff: Duration::from_millis(20),
            max_backoff: Duration::from_secs(1),
        }
    }
}

struct Route {
    num_shards: u32,
    /// shard → leader node id (0 = unknown).
    leaders: Vec<u64>,
    /// shard → the Raft term the leader was learned in.
    terms: Vec<u64>,
    /// node id → gRPC address, for nodes not removed.
    addrs: BTreeMap<u64, String>,
    /// The cluster map epoch of the newest map installed.
    epoch: u64,
}

/// A shard-aware client. Cheap to clone; share one per process.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    seeds: Vec<String>,
    options: ClientOptions,
    route: RwLock<Option<Route>>,
    channels: Mutex<HashMap<String, Channel>>,
    /// Nodes that just failed to answer, until when they are avoided: a
    /// frozen or partitioned node costs one timeout, not one per request.
    suspects: Mutex<HashMap<String, Instant>>,
    /// Held while the map is refreshed after a stale-map refusal, so many
    /// refused requests cause one refresh.
    refreshing: tokio::sync::Mutex<()>,
}

/// How long a node that failed to answer is avoided.
const SUSPECT_FOR: Duration = Duration::from_secs(3);

/// After the first node answers a map refresh, how long to wait for the
/// others (their maps may know newer leaders).
const REFRESH_GRACE: Duration = Duration::from_millis(30);

/// The request header carrying the map epoch a request was routed by.
pub const MAP_EPOCH_HEADER: &str = "x-tocsin-map-epoch";
/// On a response: the node that answered a request the node it was sent
/// to forwarded, i.e. the shard's leader.
pub const LEADER_HEADER: &str = "x-tocsin-leader";

/// A long-running cluster operation, run by [`Client::admin_op`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AdminOp {
    /// Add the node listening at `grpc_addr`; it must be running, started
    /// with `--join`.
    AddNode { grpc_addr: String, http_addr: String },
    /// Drain a live node (every replica and leadership moves off), then
    /// remove it.
    RemoveNode { node_id: u64 },
    /// Replace a dead node's replicas from the survivors.
    DecommissionNode { node_id: u64 },
    /// Move one replica of `shard` from one node to another.
    MoveShard { shard: u32, from_node: u64, to_node: u64 },
    /// Place every shard as the ring over the current nodes says.
    Rebalance { dry_run: bool },
}

/// A create request for a webhook timer firing after `delay_ms`.
pub fn webhook_timer(namespace: &str, id: &str, delay_ms: u64, url: &str) -> pb::CreateTimerRequest {
    pb::CreateTimerRequest {
        namespace: namespace.into(),
        id: id.into(),
        fire_time: Some(pb::create_timer_request::FireTime::DelayMs(delay_ms)),
        callback: Some(pb::Callback { target: Some(pb::callback::Target::Webhook(pb::Webhook { url: url.into() })) }),
        ..Default::default()
    }
}

/// A create request for a pull timer on `topic` firing at `fire_at_ms`.
pub fn pull_timer(namespace: &str, id: &str, fire_at_ms: u64, topic: &str) -> pb::CreateTimerRequest {
    pb::CreateTimerRequest {
        namespace: namespace.into(),
        id: id.into(),
        fire_time: Some(pb::create_timer_request::FireTime::FireAtMs(fire_at_ms)),
        callback: Some(pb::Callback { target: Some(pb::callback::Target::Pull(pb::Pull { topic: topic.into() })) }),
        ..Default::default()
    }
}

impl Client {
    /// Connects through any of `seeds` (`host:port` of gRPC) and loads the
    /// shard map.
    pub async fn connect(seeds: impl IntoIterator<Item = impl Into<String>>) -> Result<Client, ClientError> {
        Self::with_options(seeds, ClientOptions::default()).await
    }

    pub async fn with_options(
        seeds: impl IntoIterator<Item = impl Into<String>>,
        options: ClientOptions,
    ) -> Result<Client, ClientError> {
        let seeds: Vec<String> = seeds.into_iter().map(Into::into).collect();
        if seeds.is_empty() {
            return Err(ClientError::Argument("give at least one node address".into()));
        }
        let client = Client {
            inner: Arc::new(Inner {
                seeds,
                options,
                route: RwLock::new(None),
                channels: Mutex::new(HashMap::new()),
                suspects: Mutex::new(HashMap::new()),
                refreshing: tokio::sync::Mutex::new(()),
            }),
        };
        client.refresh().await?;
        Ok(client)
    }

    fn channel(&self, addr: &str) -> Result<Channel, ClientError> {
        let mut channels = self.inner.channels.lock().expect("channels lock");
        if let Some(c) = channels.get(addr) {
            return Ok(c.clone());
        }
        let endpoint = Endpoint::from_shared(format!("http://{addr}"))
            .map_err(|e| ClientError::Argument(format!("bad address {addr}: {e}")))?
            .connect_timeout(self.inner.options.connect_timeout)
            .timeout(self.inner.options.request_timeout)
            .tcp_nodelay(true);
        let channel = endpoint.connect_lazy();
        channels.insert(addr.to_string(), channel.clone());
        Ok(channel)
    }

    /// Reloads the shard map from every node that answers within a short
    /// grace period after the first, merged (see [`merge_map`]).
    pub async fn refresh(&self) -> Result<pb::ShardMap, ClientError> {
        use futures::StreamExt;
        let mut candidates: Vec<String> = self.inner.seeds.clone();
        if let Some(route) = self.inner.route.read().expect("route lock").as_ref() {
            candidates.extend(route.addrs.values().cloned());
        }
        candidates.sort();
        candidates.dedup();
        // Ask every node at once: a frozen node must not hold the refresh
        // up, and each answer is merged by term, so the newest leader wins.
        let mut asks: futures::stream::FuturesUnordered<_> = candidates
            .into_iter()
            .filter_map(|addr| {
                let channel = self.channel(&addr).ok()?;
                let timeout = self.inner.options.request_timeout;
                Some(async move {
                    let mut admin = AdminServiceClient::new(channel);
                    let answer = tokio::time::timeout(timeout, admin.get_shard_map(pb::GetShardMapRequest {})).await;
                    (addr, answer)
                })
            })
            .collect();
        let mut best: Option<pb::ShardMap> = None;
        let mut last = String::from("no node to ask");
        let mut grace_until: Option<tokio::time::Instant> = None;
        loop {
            let next = match grace_until {
                Some(until) => match tokio::time::timeout_at(until, asks.next()).await {
                    Ok(next) => next,
                    Err(_) => break,
                },
                None => asks.next().await,
            };
            let Some((addr, answer)) = next else { break };
            match answer {
                Ok(Ok(map)) => {
                    let map = map.into_inner();
                    self.install(&map);
                    merge_map(&mut best, map);
                    grace_until.get_or_insert_with(|| tokio::time::Instant::now() + REFRESH_GRACE);
                }
                Ok(Err(e)) => last = format!("{addr}: {e}"),
                Err(_) => {
                    self.suspect(&addr);
                    last = format!("{addr}: no answer within {:?}", self.inner.options.request_timeout);
                }
            }
        }
        best.ok_or(ClientError::Unreachable(last))
    }

    /// Refreshes the map unless one at least as new as `epoch` is already
    /// installed (another request's refresh got there first).
    async fn refresh_to(&self, epoch: u64) {
        let _one = self.inner.refreshing.lock().await;
        if self.map_epoch() >= epoch {
            return;
        }
        let _ = self.refresh().await;
    }

    /// `message` as a request routed by the current map: it carries the
    /// map's epoch.
    fn routed<T>(&self, message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        let epoch = self.map_epoch();
        if epoch > 0 {
            request.metadata_mut().insert(MAP_EPOCH_HEADER, epoch.into());
        }
        request
    }

    /// Avoids `addr` for a while after it failed to answer.
    fn suspect(&self, addr: &str) {
        self.inner.suspects.lock().expect("suspects lock").insert(addr.to_string(), Instant::now() + SUSPECT_FOR);
    }

    fn is_suspect(&self, addr: &str) -> bool {
        let mut suspects = self.inner.suspects.lock().expect("suspects lock");
        match suspects.get(addr) {
            Some(until) if *until > Instant::now() => true,
            Some(_) => {
                suspects.remove(addr);
                false
            }
            None => false,
        }
    }

    /// Installs a freshly loaded map. Per shard, a leader learned in a lower
    /// term than the one cached is ignored: a node cut off from its peers
    /// may still answer with an old view. The node list comes from the
    /// newest cluster map seen (a node that lags may still list a removed
    /// node as active), and the epoch never goes back.
    fn install(&self, map: &pb::ShardMap) {
        let n = map.num_shards as usize;
        let mut route = self.inner.route.write().expect("route lock");
        let (mut leaders, mut terms) = match route.as_ref() {
            Some(r) if r.num_shards == map.num_shards => (r.leaders.clone(), r.terms.clone()),
            _ => (vec![0u64; n], vec![0u64; n]),
        };
        for s in &map.shards {
            let i = s.shard as usize;
            if i < n && s.leader != 0 && (s.term >= terms[i] || leaders[i] == 0) {
                leaders[i] = s.leader;
                terms[i] = terms[i].max(s.term);
            }
        }
        let removed = pb::node_info::State::Removed as i32;
        let listed: BTreeMap<u64, String> =
            map.nodes.iter().filter(|n| n.state != removed).map(|n| (n.node_id, n.grpc_addr.clone())).collect();
        let (addrs, epoch) = match route.as_ref() {
            Some(r) if r.epoch > map.epoch => {
                let mut addrs = r.addrs.clone();
                for (id, addr) in listed {
                    let gone = map.nodes.iter().any(|n| n.node_id == id && n.state == removed);
                    if !gone {
                        addrs.entry(id).or_insert(addr);
                    }
                }
                (addrs, r.epoch)
            }
            _ => (listed, map.epoch),
        };
        *route = Some(Route { num_shards: map.num_shards, leaders, terms, addrs, epoch });
    }

    /// Forgets the cached leader of `shard` after it failed to answer, so
    /// the next attempt goes to another node (which forwards it).
    fn forget_leader(&self, shard: Option<u32>) {
        let Some(shard) = shard else { return };
        if let Some(route) = self.inner.route.write().expect("route lock").as_mut()
            && let Some(l) = route.leaders.get_mut(shard as usize)
        {
            *l = 0;
        }
    }

    /// The shard map as last loaded.
    pub fn num_shards(&self) -> u32 {
        self.inner.route.read().expect("route lock").as_ref().map_or(0, |r| r.num_shards)
    }

    /// The map epoch as last loaded.
    pub fn map_epoch(&self) -> u64 {
        self.inner.route.read().expect("route lock").as_ref().map_or(0, |r| r.epoch)
    }

    /// The shard of a key.
    pub fn shard_of(&self, namespace: &str, id: &str) -> u32 {
        tocsin_core::routing::shard_for(namespace, id, self.num_shards().max(1))
    }

    /// Where to send a request for `shard`: its leader, or any node,
    /// avoiding nodes that just failed to answer while others remain.
    fn addr_for(&self, shard: Option<u32>, attempt: u32) -> Result<String, ClientError> {
        let route = self.inner.route.read().expect("route lock");
        let Some(route) = route.as_ref() else {
            return Ok(self.inner.seeds[attempt as usize % self.inner.seeds.len()].clone());
        };
        if let Some(shard) = shard
            && let Some(addr) = route.leaders.get(shard as usize).and_then(|l| route.addrs.get(l))
            && !self.is_suspect(addr)
        {
            return Ok(addr.clone());
        }
        let mut all: Vec<&String> = route.addrs.values().collect();
        if all.is_empty() {
            return Ok(self.inner.seeds[attempt as usize % self.inner.seeds.len()].clone());
        }
        all.sort();
        let healthy: Vec<&String> = all.iter().copied().filter(|a| !self.is_suspect(a)).collect();
        let pool = if healthy.is_empty() { &all } else { &healthy };
        Ok(pool[attempt as usize % pool.len()].clone())
    }

    /// Learns from an error: a leader hint updates the cached leader.
    fn learn(&self, shard: Option<u32>, err: &ClientError) -> bool {
        let ClientError::Status { info, .. } = err else { return false };
        let Some(hint) = &info.leader else { return false };
        let mut route = self.inner.route.write().expect("route lock");
        let Some(route) = route.as_mut() else { return false };
        if hint.grpc_addr.is_empty() {
            return false;
        }
        route.addrs.insert(hint.node_id, hint.grpc_addr.clone());
        let shard = shard.unwrap_or(hint.shard);
        if let Some(l) = route.leaders.get_mut(shard as usize) {
            let changed = *l != hint.node_id;
            *l = hint.node_id;
            return changed;
        }
        false
    }

    /// A node forwarded a request for `shard` to `leader`: route the shard
    /// there from now on, if the map says where that node is.
    fn learned_leader(&self, shard: Option<u32>, leader: u64) {
        let Some(shard) = shard else { return };
        let mut route = self.inner.route.write().expect("route lock");
        if let Some(route) = route.as_mut()
            && route.addrs.contains_key(&leader)
            && let Some(l) = route.leaders.get_mut(shard as usize)
        {
            *l = leader;
        }
    }

    fn backoff(&self, attempt: u32) -> Duration {
        let o = &self.inner.options;
        let base = o.initial_backoff.saturating_mul(1 << attempt.min(16)).min(o.max_backoff);
        // Equal jitter: half fixed, half random.
        base / 2 + base.mul_f64(rand::random::<f64>() / 2.0)
    }

    /// Runs `call` against the right node, following hints and retrying
    /// retryable failures.
    async fn call<T, F, Fut>(&self, shard: Option<u32>, mut call: F) -> Result<T, ClientError>
    where
        F: FnMut(TimerServiceClient<Channel>) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        self.call_channel(shard, |channel| call(TimerServiceClient::new(channel).max_decoding_message_size(64 << 20)))
            .await
    }

    /// [`Client::call`] for any service on the node's channel.
    async fn call_channel<T, F, Fut>(&self, shard: Option<u32>, mut call: F) -> Result<T, ClientError>
    where
        F: FnMut(Channel) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let mut last = ClientError::Unreachable("no attempt made".into());
        for attempt in 0..self.inner.options.max_attempts {
            let addr = self.addr_for(shard, attempt)?;
            let channel = self.channel(&addr)?;
            match tokio::time::timeout(self.inner.options.request_timeout, call(channel)).await {
                Ok(Ok(resp)) => {
                    // Forwarded to the shard's leader: route there next time.
                    if let Some(leader) =
                        resp.metadata().get(LEADER_HEADER).and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
                    {
                        self.learned_leader(shard, leader);
                    }
                    return Ok(resp.into_inner());
                }
                Ok(Err(status)) => {
                    let err = ClientError::from_status(status);
                    if !err.retryable() {
                        return Err(err);
                    }
                    // Routed by a stale map: refresh it and retry at once.
                    if let ClientError::Status { code: tonic::Code::Aborted, info, .. } = &err
                        && info.map_epoch > 0
                    {
                        self.refresh_to(info.map_epoch).await;
                        // The nodes asked may not have the new map yet
                        // either: give them a moment.
                        if self.map_epoch() < info.map_epoch {
                            tokio::time::sleep(self.backoff(attempt)).await;
                        }
                        last = err;
                        continue;
                    }
                    if err.code() == tonic::Code::DeadlineExceeded
                        || (err.code() == tonic::Code::Unavailable
                            && matches!(&err, ClientError::Status { info, .. } if info.leader.is_none()))
                    {
                        self.suspect(&addr);
                    }
                    // A fresh hint means retry now; otherwise try elsewhere,
                    // refresh and back off.
                    if !self.learn(shard, &err) {
                        self.forget_leader(shard);
                        let wait = match &err {
                            ClientError::Status { info, .. } if info.retry_after_ms > 0 => {
                                Duration::from_millis(info.retry_after_ms).max(self.backoff(attempt))
                            }
                            _ => self.backoff(attempt),
                        };
                        tokio::time::sleep(wait).await;
                        let _ = self.refresh().await;
                    }
                    last = err;
                }
                Err(_) => {
                    last = ClientError::Status {
                        code: tonic::Code::DeadlineExceeded,
                        message: format!("no answer from {addr} within {:?}", self.inner.options.request_timeout),
                        info: pb::ErrorInfo::default(),
                    };
                    self.suspect(&addr);
                    self.forget_leader(shard);
                    tokio::time::sleep(self.backoff(attempt)).await;
                    let _ = self.refresh().await;
                }
            }
        }
        Err(last)
    }

    /// Creates one timer (idempotent by `(namespace, id)`).
    pub async fn create_timer(&self, req: pb::CreateTimerRequest) -> Result<pb::CreateTimerResponse, ClientError> {
        let shard = self.shard_of(&req.namespace, &req.id);
        self.call(Some(shard), |mut c| {
            let req = self.routed(req.clone());
            async move { c.create_timer(req).await }
        })
        .await
    }

    /// Creates many timers: split per shard, sent to each leader
    /// concurrently, results in request order.
    pub async fn create_timers(
        &self,
        reqs: Vec<pb::CreateTimerRequest>,
    ) -> Vec<Result<pb::CreateTimerResponse, ClientError>> {
        let mut by_shard: BTreeMap<u32, Vec<(usize, pb::CreateTimerRequest)>> = BTreeMap::new();
        let n = reqs.len();
        let originals = reqs.clone();
        for (i, req) in reqs.into_iter().enumerate() {
            by_shard.entry(self.shard_of(&req.namespace, &req.id)).or_default().push((i, req));
        }
        let calls = by_shard.into_iter().flat_map(|(shard, items)| {
            // Keep each call within the server's batch limit.
            let chunks: Vec<Vec<(usize, pb::CreateTimerRequest)>> = items.chunks(1000).map(|c| c.to_vec()).collect();
            chunks.into_iter().map(move |chunk| async move {
                let (positions, timers): (Vec<usize>, Vec<pb::CreateTimerRequest>) = chunk.into_iter().unzip();
                let result = self
                    .call(Some(shard), |mut c| {
                        let req = self.routed(pb::CreateTimersRequest { timers: timers.clone() });
                        async move { c.create_timers(req).await }
                    })
                    .await;
                (positions, result)
            })
        });
        let mut out: Vec<Option<Result<pb::CreateTimerResponse, ClientError>>> = (0..n).map(|_| None).collect();
        for (positions, result) in futures::future::join_all(calls).await {
            match result {
                Ok(resp) => {
                    for (i, r) in positions.into_iter().zip(resp.results) {
                        out[i] = Some(match r.result {
                            Some(pb::create_timer_result::Result::Ok(ok)) => Ok(ok),
                            Some(pb::create_timer_result::Result::Error(info)) => Err(ClientError::Status {
                                code: code_from_name(&info.code),
                                message: info.message.clone(),
                                info,
                            }),
                            None => Err(ClientError::Unreachable("empty result".into())),
                        });
                    }
                }
                Err(e) => {
                    for i in positions {
                        out[i] = Some(Err(e.clone()));
                    }
                }
            }
        }
        let mut out: Vec<Result<pb::CreateTimerResponse, ClientError>> =
            out.into_iter().map(|r| r.unwrap_or_else(|| Err(ClientError::Unreachable("no result".into())))).collect();
        // Items refused for a retryable reason (a leader change mid-batch, say)
        // are retried one by one, with hints and backoff; creates are idempotent.
        let retry: Vec<usize> = (0..n).filter(|i| matches!(&out[*i], Err(e) if e.retryable())).collect();
        if !retry.is_empty() {
            let retried =
                futures::future::join_all(retry.iter().map(|i| self.create_timer(originals[*i].clone()))).await;
            for (i, r) in retry.into_iter().zip(retried) {
                out[i] = r;
            }
        }
        out
    }

    pub async fn get_timer(&self, namespace: &str, id: &str) -> Result<pb::Timer, ClientError> {
        let shard = self.shard_of(namespace, id);
        let req = pb::GetTimerRequest { namespace: namespace.into(), id: id.into() };
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
                            let mut stream = resp.into_inner();
                            loop {
                                tokio::select! {
                                    msg = stream.message() => match msg {
                                        Ok(Some(batch)) => {
                                            if tx.send(batch).await.is_err() {
                                                return;
                                            }
                                        }
                                        _ => break,
                                    },
                                    _ = tx.closed() => return,
                                }
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

    async fn settle(
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

    /// Starts a cluster operation on the first seed that answers and
    /// returns its progress stream. The operation runs on that node to the
    /// end even if the stream is dropped; re-running it is safe.
    pub async fn admin_op(&self, op: AdminOp) -> Result<tonic::Streaming<pb::Progress>, ClientError> {
        let mut last = ClientError::Unreachable("no seed given".into());
        for addr in self.inner.seeds.iter() {
            // No request timeout: catching a replica up may take minutes.
            let endpoint = Endpoint::from_shared(format!("http://{addr}"))
                .map_err(|e| ClientError::Argument(format!("bad address {addr}: {e}")))?
                .connect_timeout(self.inner.options.connect_timeout)
                .tcp_nodelay(true);
            let channel = match endpoint.connect().await {
                Ok(c) => c,
                Err(e) => {
                    last = ClientError::Unreachable(format!("{addr}: {e}"));
                    continue;
                }
            };
            let mut admin = AdminServiceClient::new(channel);
            let result = match op.clone() {
                AdminOp::AddNode { grpc_addr, http_addr } => {
                    admin.add_node(pb::AddNodeRequest { grpc_addr, http_addr }).await
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

/// Folds one node's shard map into `into`. A node knows the committed
/// membership and leader only of the shards it hosts, so those are merged
/// per shard: the voters of the newest membership (`membership_index`) and
/// the leader learned in the highest term. What the cluster map says (the
/// node list with states, targets, shard epochs, the metadata group) comes
/// from the answer with the highest map epoch.
pub fn merge_map(into: &mut Option<pb::ShardMap>, map: pb::ShardMap) {
    let Some(m) = into.as_mut() else {
        *into = Some(map);
        return;
    };
    let newer = map.epoch > m.epoch;
    if newer {
        m.epoch = map.epoch;
        m.ring = map.ring.clone();
        m.metadata = map.metadata.clone();
    }
    for n in map.nodes {
        match m.nodes.iter_mut().find(|x| x.node_id == n.node_id) {
            Some(x) if newer => *x = n,
            Some(_) => {}
            None => m.nodes.push(n),
        }
    }
    m.nodes.sort_by_key(|n| n.node_id);
    for p in map.shards {
        match m.shards.iter_mut().find(|x| x.shard == p.shard) {
            None => m.shards.push(p),
            Some(x) => {
                if !p.replicas.is_empty() && (p.membership_index > x.membership_index || x.replicas.is_empty()) {
                    x.replicas = p.replicas.clone();
                    x.learners = p.learners.clone();
                    x.membership_index = p.membership_index;
                }
                if newer {
                    x.target = p.target.clone();
                    x.shard_epoch = p.shard_epoch;
                }
                if p.leader != 0 && (p.term > x.term || x.leader == 0) {
                    x.leader = p.leader;
                    x.term = p.term;
                    x.move_error = p.move_error.clone();
                }
                x.snapshot_bytes_sent += p.snapshot_bytes_sent;
            }
        }
    }
    m.shards.sort_by_key(|s| s.shard);
}

fn code_from_name(name: &str) -> tonic::Code {
    match name {
        "INVALID_ARGUMENT" => tonic::Code::InvalidArgument,
        "NOT_FOUND" => tonic::Code::NotFound,
        "ALREADY_EXISTS" => tonic::Code::AlreadyExists,
        "FAILED_PRECONDITION" => tonic::Code::FailedPrecondition,
        "RESOURCE_EXHAUSTED" => tonic::Code::ResourceExhausted,
        "UNAVAILABLE" => tonic::Code::Unavailable,
        "DEADLINE_EXCEEDED" => tonic::Code::DeadlineExceeded,
        "ABORTED" => tonic::Code::Aborted,
        _ => tonic::Code::Internal,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merged_maps_take_the_newest_voters_and_the_highest_term_leader() {
        let placement = |shard, replicas: &[u64], leader, membership_index, term| pb::ShardPlacement {
            shard,
            replicas: replicas.to_vec(),
            leader,
            membership_index,
            term,
            ..Default::default()
        };
        let node = |id| pb::NodeInfo { node_id: id, ..Default::default() };
        let mut merged = None;
        merge_map(
            &mut merged,
            pb::ShardMap {
                num_shards: 3,
                nodes: vec![node(1), node(2)],
                shards: vec![placement(0, &[1, 2, 3], 1, 5, 2), placement(1, &[1, 2, 3], 2, 5, 2)],
                ..Default::default()
            },
        );
        merge_map(
            &mut merged,
            pb::ShardMap {
                num_shards: 3,
                nodes: vec![node(4)],
                shards: vec![placement(0, &[1, 2, 4], 0, 9, 2), placement(2, &[2, 3, 4], 4, 3, 1)],
                ..Default::default()
            },
        );
        let m = merged.unwrap();
        assert_eq!(m.nodes.iter().map(|n| n.node_id).collect::<Vec<_>>(), vec![1, 2, 4]);
        assert_eq!(m.shards.iter().map(|s| s.shard).collect::<Vec<_>>(), vec![0, 1, 2]);
        assert_eq!((m.shards[0].replicas.clone(), m.shards[0].leader), (vec![1, 2, 4], 1));
        assert_eq!(m.shards[2].leader, 4);
    }

    #[test]
    fn no_answer_is_retryable_but_a_real_cancel_is_not() {
        // What tonic's channel timeout and a dropped connection look like.
        let timed_out = ClientError::from_status(tonic::Status::cancelled("Timeout expired"));
        assert_eq!(timed_out.code(), tonic::Code::DeadlineExceeded);
        assert!(timed_out.retryable());
        let dropped = ClientError::from_status(tonic::Status::unknown("transport error"));
        assert!(dropped.retryable());
        let closed = ClientError::from_status(tonic::Status::cancelled("operation was canceled: connection closed"));
        assert_eq!(closed.code(), tonic::Code::Unavailable);
        assert!(closed.retryable());
        // A server-side verdict is passed through untouched.
        let cancelled = ClientError::from_status(tonic::Status::cancelled("client went away"));
        assert_eq!(cancelled.code(), tonic::Code::Cancelled);
        assert!(!cancelled.retryable());
        assert!(!ClientError::from_status(tonic::Status::invalid_argument("bad id")).retryable());
    }
}
