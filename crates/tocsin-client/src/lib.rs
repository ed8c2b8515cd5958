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
//! `CreateTimers` batches are split per leader node (the node splits them per
//! shard) and sent concurrently.
//! Concurrent single creates bound for the same node share a `CreateTimers`
//! call while that node has calls out (`coalesce.rs`; never delayed, and
//! answered exactly as `CreateTimer` would).
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
//! The code: the types here; [`Client`]'s routing in `routing.rs`, its
//! retries in `retry.rs`, its calls in `calls.rs`, the coalescing of single
//! creates in `coalesce.rs`. The wire contract (header
//! names, error codes, the map merge, the Reserve relay) is
//! `tocsin-contract`'s.
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

use crate::conn::Conn;
use tocsin_proto::v1 as pb;

pub use tocsin_proto::v1;

mod calls;
mod coalesce;
mod conn;
mod retry;
mod routing;

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
    /// A create refused because its id holds a finished timer with the
    /// same spec (see `CreateTimerRequest.replace_finished`).
    pub fn is_timer_finished(&self) -> bool {
        matches!(self, ClientError::Status { code: tonic::Code::FailedPrecondition, info, .. }
            if info.reason == tocsin_contract::codes::TIMER_FINISHED)
    }

    pub fn code(&self) -> tonic::Code {
        match self {
            ClientError::Status { code, .. } => *code,
            ClientError::Unreachable(_) => tonic::Code::Unavailable,
            ClientError::Argument(_) => tonic::Code::InvalidArgument,
        }
    }

    fn from_status(status: tonic::Status) -> ClientError {
        let info = tocsin_contract::codes::info_of(&status);
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
    /// The bearer token sent with every call (`tocsin admin token create`);
    /// none for a node that runs open.
    pub token: Option<String>,
    /// TLS to the nodes' client ports, for a cluster that runs with
    /// `client_tls`; every connection the client opens uses it, to seeds
    /// and to the nodes it learns of from shard maps and leader hints.
    pub tls: Option<ClientTls>,
    /// Concurrent single creates to one node share a `CreateTimers` call
    /// while this many calls to that node are out (`coalesce.rs`); 0: every
    /// create is a call of its own.
    pub coalesce_in_flight: usize,
    /// While calls to a node are out and nothing has come from it for this
    /// long, the client pings it; a ping unanswered for `ping_timeout`
    /// closes the connection, its calls fail as unavailable and are retried
    /// on a new one. Without it a connection that went silent (a network
    /// cut, a node frozen and replaced behind the same address, a
    /// middlebox that dropped the flow) holds every call sent on it until
    /// `request_timeout`, and the retries, sent on the same connection,
    /// wait as long again. None: no pings.
    pub ping_interval: Option<Duration>,
    pub ping_timeout: Duration,
}

/// How to reach nodes whose client ports speak TLS.
#[derive(Clone)]
pub struct ClientTls {
    /// The CA (PEM) that signed the nodes' certificates.
    pub ca_pem: String,
    /// This client's certificate and private key (PEM), for nodes that
    /// require one (`client_tls.client_ca_file`; `tocsin certs client`).
    pub identity: Option<(String, String)>,
    /// The name to expect in every node's certificate; None: the host of
    /// the address dialed (so each node's certificate must name the
    /// address clients reach it by).
    pub domain: Option<String>,
}

/// Written by hand so a printed options value never shows a private key.
impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTls")
            .field("identity", &self.identity.as_ref().map(|_| "<redacted>"))
            .field("domain", &self.domain)
            .finish_non_exhaustive()
    }
}

impl ClientTls {
    /// tonic's form of it, for callers that open a channel of their own.
    pub fn tonic(&self) -> tonic::transport::ClientTlsConfig {
        use tonic::transport::Certificate;
        use tonic::transport::Identity;
        let mut config = tonic::transport::ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&self.ca_pem));
        if let Some((cert, key)) = &self.identity {
            config = config.identity(Identity::from_pem(cert, key));
        }
        if let Some(domain) = &self.domain {
            config = config.domain_name(domain.clone());
        }
        config
    }
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            request_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(2),
            max_attempts: 10,
            initial_backoff: Duration::from_millis(20),
            max_backoff: Duration::from_secs(1),
            token: None,
            tls: None,
            coalesce_in_flight: 4,
            // Twice the nodes' own pings to each other (1 s and 1 s): a
            // client may sit farther away, and a busy node answers a ping
            // late; still well inside `request_timeout`.
            ping_interval: Some(Duration::from_secs(2)),
            ping_timeout: Duration::from_secs(2),
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
    channels: Mutex<HashMap<String, Conn>>,
    /// Each node's lane for coalesced creates.
    lanes: coalesce::Lanes,
    /// `Bearer <token>` for every call, if the client has a token.
    authorization: Option<tonic::codegen::http::HeaderValue>,
    /// Nodes that just failed to answer, until when they are avoided: a
    /// frozen or partitioned node costs one timeout, not one per request.
    suspects: Mutex<HashMap<String, Instant>>,
    /// Held while the map is refreshed after a stale-map refusal or a
    /// failed attempt, so many refused requests cause one refresh; it holds
    /// when the last refresh after a failure finished.
    refreshing: tokio::sync::Mutex<Option<Instant>>,
}

/// After a failed attempt the map is refreshed at most this often: every
/// failed request asking every node for the map at once (thousands, when a
/// batch falls back to retries during an outage) kept the nodes so busy
/// answering that the outage outlived its cause (chaos
/// `snapshot-catchup-kill`: most creates still failing 40 s after the
/// cluster was whole again).
const REFRESH_AFTER_FAILURE_EVERY: Duration = Duration::from_millis(200);

/// How long a node that failed to answer is avoided.
const SUSPECT_FOR: Duration = Duration::from_secs(3);

/// After the first node answers a map refresh, how long to wait for the
/// others (their maps may know newer leaders).
const REFRESH_GRACE: Duration = Duration::from_millis(30);

/// The request header carrying the map epoch a request was routed by.
pub const MAP_EPOCH_HEADER: &str = tocsin_contract::headers::MAP_EPOCH;
/// On a response: the node that answered a request the node it was sent
/// to forwarded, i.e. the shard's leader.
pub const LEADER_HEADER: &str = tocsin_contract::headers::LEADER;

/// A long-running cluster operation, run by [`Client::admin_op`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AdminOp {
    /// Add the node listening at `grpc_addr`; it must be running, started
    /// with `--join`.
    AddNode { grpc_addr: String, http_addr: String, peer_addr: String },
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
        callback: Some(pb::Callback {
            target: Some(pb::callback::Target::Pull(pb::Pull { topic: topic.into(), ttr_ms: 0 })),
        }),
        ..Default::default()
    }
}

impl Client {
    /// An endpoint for the node at `addr` (`host:port` of its client gRPC
    /// port): `https` with the client's TLS when it has one.
    pub(crate) fn endpoint(&self, addr: &str) -> Result<tonic::transport::Endpoint, ClientError> {
        let bad = |e: &dyn std::fmt::Display| ClientError::Argument(format!("bad address {addr}: {e}"));
        let options = &self.inner.options;
        let scheme = if options.tls.is_some() { "https" } else { "http" };
        let mut endpoint = tonic::transport::Endpoint::from_shared(format!("{scheme}://{addr}"))
            .map_err(|e| bad(&e))?
            .connect_timeout(options.connect_timeout)
            .tcp_nodelay(true);
        if let Some(interval) = options.ping_interval {
            // Pings go only while calls are open (hyper's default), so an
            // idle client costs its nodes nothing.
            endpoint = endpoint.http2_keep_alive_interval(interval).keep_alive_timeout(options.ping_timeout);
        }
        if let Some(tls) = &options.tls {
            endpoint = endpoint.tls_config(tls.tonic()).map_err(|e| bad(&e))?;
        }
        Ok(endpoint)
    }

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
        let authorization =
            options.token.as_deref().map(conn::authorization).transpose().map_err(ClientError::Argument)?;
        let client = Client {
            inner: Arc::new(Inner {
                seeds,
                options,
                authorization,
                route: RwLock::new(None),
                channels: Mutex::new(HashMap::new()),
                lanes: coalesce::Lanes::default(),
                suspects: Mutex::new(HashMap::new()),
                refreshing: tokio::sync::Mutex::new(None),
            }),
        };
        client.refresh().await?;
        Ok(client)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
