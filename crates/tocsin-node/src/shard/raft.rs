//! Raft plumbing shared by every group on a node: the openraft config, the
//! gRPC transport (one connection per peer node, shared by all groups, with
//! the group id in every message), and the server side of that transport.
//! All of it runs on the Raft runtime (`runtime.rs`).
//!
//! openraft's requests and responses travel opaquely as postcard bytes in
//! `tocsin.v1.RaftTransport` messages, so the `.proto` does not depend on
//! openraft's types. Snapshots stream in 1 MiB chunks from the snapshot file
//! to a temporary file on the receiver.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::sync::RwLock;
use std::time::Duration;
use std::time::Instant;

use openraft::error::NetworkError;
use openraft::error::RPCError;
use openraft::error::ReplicationClosed;
use openraft::error::StreamingError;
use openraft::error::Unreachable;
use openraft::network::RPCOption;
use openraft::raft::AppendEntriesRequest;
use openraft::raft::AppendEntriesResponse;
use openraft::raft::SnapshotResponse;
use openraft::raft::TransferLeaderRequest;
use openraft::raft::TransferLeaderResponse;
use openraft::raft::VoteRequest;
use openraft::raft::VoteResponse;
use openraft_multi::GroupNetworkAdapter;
use openraft_multi::GroupRouter;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tocsin_proto::v1 as pb;
use tocsin_proto::v1::raft_transport_client::RaftTransportClient;
use tocsin_store::GroupId;
use tocsin_store::NodeAddr;
use tocsin_store::Raft;
use tocsin_store::SnapshotFile;
use tocsin_store::TypeConfig;
use tocsin_store::Vote;
use tonic::transport::Channel;
use tonic::transport::Endpoint;

use crate::clock::Clock;
use crate::config::RaftTuning;
use crate::shard::link::LinkClient;
use crate::shard::link::LinkError;
use crate::shard::link::ReplyObserver;

type C = TypeConfig;

/// Bytes per snapshot chunk.
const SNAPSHOT_CHUNK_BYTES: usize = 1 << 20;
/// Snapshots streamed to one peer at a time; the other groups' streams
/// wait their turn. A peer catching up on every shard at once (after an
/// outage, or joining) over a link slower than the snapshots otherwise
/// shares it among all of them, so none completes until all do, each is
/// stale by then, and the peer installs them all at once; in turns, its
/// shards catch up one after another, each from a fresh snapshot.
const SNAPSHOT_STREAMS_PER_PEER: usize = 2;
/// How long a peer's "my free disk is low" counts after the reply that said it.
const LOW_DISK_FRESH: Duration = Duration::from_secs(3);

/// How much slower the metadata group's heartbeats and elections are than
/// a shard's: nothing waits on it but cluster operations, and every group's
/// heartbeats cost CPU the fire loops share.
pub const METADATA_TIMING_FACTOR: u64 = 4;

/// openraft's config for the metadata group: a shard's, with heartbeats
/// and election timeouts [`METADATA_TIMING_FACTOR`] times longer.
pub fn metadata_config(tuning: &RaftTuning) -> Arc<openraft::Config> {
    let slower = RaftTuning {
        heartbeat_ms: tuning.heartbeat_ms * METADATA_TIMING_FACTOR,
        election_timeout_min_ms: tuning.election_timeout_min_ms * METADATA_TIMING_FACTOR,
        election_timeout_max_ms: tuning.election_timeout_max_ms * METADATA_TIMING_FACTOR,
        ..tuning.clone()
    };
    openraft_config(&slower)
}

/// openraft's config for every group, from the node's tuning.
pub fn openraft_config(tuning: &RaftTuning) -> Arc<openraft::Config> {
    let config = openraft::Config {
        cluster_name: "tocsin".into(),
        heartbeat_interval: tuning.heartbeat_ms,
        election_timeout_min: tuning.election_timeout_min_ms,
        election_timeout_max: tuning.election_timeout_max_ms,
        // A snapshot chunk stream gets this long per RPC round.
        install_snapshot_timeout: 10_000,
        snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(tuning.snapshot_every_entries),
        max_in_snapshot_log_to_keep: tuning.keep_entries_after_snapshot,
        // Pre-vote: a node coming back from a partition does not raise the term
        // and depose a healthy leader.
        enable_pre_vote: Some(true),
        // Replicate an entry as soon as its append is queued (the log's cache
        // keeps it readable), not after the core's whole batch of messages:
        // the leader's fsync and the followers' then run side by side.
        broadcast_submitted_on_append: Some(true),
        // A leader that restarts must win a new election, in a new term. With
        // openraft's default (restore leadership at once, same term), a
        // leader killed before its own fsync of an entry it had already sent
        // (see the line above) comes back without that entry and proposes a
        // different one under the same log id: two replicas then hold
        // different committed entries at one index. Seen in the chaos
        // matrix's kill-all row (2026-11-26): shard 1's entry T2-N2.216 was a
        // cancel on one node and a batch of creates on the others.
        enable_leader_restore: Some(false),
        ..Default::default()
    };
    Arc::new(config.validate().expect("tuning was validated with the node config"))
}

fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    postcard::to_allocvec(value).expect("openraft messages serialize")
}

fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, String> {
    postcard::from_bytes(bytes).map_err(|e| format!("decode: {e}"))
}

/// What each peer's last Raft reply said of its free disk, and when.
#[derive(Default)]
pub struct LowDiskPeers(std::sync::Mutex<HashMap<u64, (bool, Instant)>>);

impl LowDiskPeers {
    /// Records a reply from `peer` received at `at`.
    pub fn note(&self, peer: u64, low: bool, at: Instant) {
        self.0.lock().expect("low-disk lock").insert(peer, (low, at));
    }

    /// Whether `peer`'s last reply, at most [`LOW_DISK_FRESH`] before `now`,
    /// said its disk is low.
    pub fn is_low(&self, peer: u64, now: Instant) -> bool {
        self.0
            .lock()
            .expect("low-disk lock")
            .get(&peer)
            .is_some_and(|(low, at)| *low && now.saturating_duration_since(*at) < LOW_DISK_FRESH)
    }
}

/// How long a peer may answer nothing, while calls to it time out, before
/// its connection is replaced, in election timeouts (the longest one drawn).
/// Every group's heartbeats (one per 50 ms) ride the link, so a link that
/// works is never silent that long; by then the followers behind it have
/// started elections, and waiting longer only keeps a healed path unused.
/// A new connection gets one election timeout to connect (see
/// [`link_connect_timeout`]).
/// Chaos `flapping-partitions` with 2 s here (twice the RPC timeout): due
/// while one node was cut off and the other two connected, p99 2.3 s.
const STALLED_AFTER_ELECTION_TIMEOUTS: u32 = 2;
/// Never less than this, whatever the election timeout (tests use short ones).
const STALLED_AFTER_AT_LEAST: Duration = Duration::from_millis(200);

/// The link silence after which a connection is replaced.
pub fn link_stalled_after(election_timeout_max: Duration) -> Duration {
    (election_timeout_max * STALLED_AFTER_ELECTION_TIMEOUTS).max(STALLED_AFTER_AT_LEAST)
}

/// How long a link waits for a new connection before trying again: one
/// election timeout. A SYN dropped by a partition is retried by the kernel
/// only after 1 s, so a connection begun just before the path healed would
/// otherwise keep the peer unreachable (and unelectable) for a second more
/// (chaos `flapping-partitions`: about 1 s from a pair's rejoining to its
/// first leader, most of it in the connect).
pub fn link_connect_timeout(election_timeout_max: Duration) -> Duration {
    election_timeout_max.max(STALLED_AFTER_AT_LEAST / 2)
}

/// Whether a peer's connection has stalled: the decision, from reply and
/// timeout events, with no clock or I/O inside.
///
/// A TCP connection whose packets were dropped (a partition by firewall, a
/// flapping link) is not closed: the kernel retransmits with exponential
/// back-off, so once the path is back it may stay silent for seconds more
/// (the retransmission timer doubles: 0.2, 0.4, ... 6.4 s), and HTTP/2's
/// keep-alive notices only after its interval and timeout (5 + 5 s). Every
/// group's heartbeats to that peer ride the one connection, so for those
/// seconds the peer cannot be led or elected (chaos `flapping-partitions`:
/// shards without a leader about 10 s after the last heal). A fresh
/// connection has no back-off to wait out.
#[derive(Clone, Copy, Debug)]
struct LinkHealth {
    /// The last reply on any connection to the peer, or when its current
    /// connection was made (a new connection gets a full grace period).
    last_heard: Instant,
    /// When the connection was last replaced.
    replaced_at: Option<Instant>,
}

impl LinkHealth {
    fn new(now: Instant) -> LinkHealth {
        LinkHealth { last_heard: now, replaced_at: None }
    }

    fn replied(&mut self, at: Instant) {
        self.last_heard = self.last_heard.max(at);
    }

    /// A call timed out at `now` with no reply: whether to replace the
    /// connection. Only when the peer has been silent for `stalled_after`,
    /// and at most once per `stalled_after` (a partitioned peer costs one
    /// connection attempt per period).
    fn timed_out(&mut self, now: Instant, stalled_after: Duration) -> bool {
        let quiet_since = |t: Instant| now.saturating_duration_since(t) >= stalled_after;
        if quiet_since(self.last_heard) && self.replaced_at.is_none_or(quiet_since) {
            self.replaced_at = Some(now);
            self.last_heard = now;
            return true;
        }
        false
    }
}

/// Where a peer listens, the link to it, and whether that has stalled.
struct Peer {
    addr: String,
    /// Raft messages (`link.rs`).
    link: Arc<LinkClient>,
    /// Snapshots, streamed over gRPC.
    snapshots: RaftTransportClient<Channel>,
    /// Turns for snapshot streams ([`SNAPSHOT_STREAMS_PER_PEER`]).
    snapshot_turns: Arc<tokio::sync::Semaphore>,
    health: std::sync::Mutex<LinkHealth>,
}

/// One link per peer, shared by every group's replication.
#[derive(Clone)]
pub struct Router {
    inner: Arc<RouterInner>,
}

struct RouterInner {
    node_id: u64,
    /// The Raft runtime (`runtime.rs`): a channel's tasks run where it is
    /// made.
    runtime: tokio::runtime::Handle,
    rpc_timeout: Duration,
    /// See [`link_stalled_after`].
    stalled_after: Duration,
    /// See [`link_connect_timeout`].
    connect_timeout: Duration,
    /// mTLS for links and snapshot streams, when on.
    tls: Option<Arc<crate::peer_tls::PeerTls>>,
    /// Measures this node's clock offset to each peer from the replies.
    clock: Arc<Clock>,
    peers: RwLock<HashMap<u64, Peer>>,
    /// Peers whose last reply said their free disk is low, and when.
    low_disk: Arc<LowDiskPeers>,
    /// Snapshot bytes sent per group: the progress of a replica catching up.
    snapshot_bytes: RwLock<HashMap<GroupId, u64>>,
    /// Stalled peer connections replaced (see [`LinkHealth`]).
    reconnects: std::sync::atomic::AtomicU64,
}

impl Router {
    pub fn new(
        node_id: u64,
        rpc_timeout: Duration,
        election_timeout_max: Duration,
        clock: Arc<Clock>,
        runtime: tokio::runtime::Handle,
        tls: Option<Arc<crate::peer_tls::PeerTls>>,
    ) -> Router {
        Router {
            inner: Arc::new(RouterInner {
                node_id,
                tls,
                runtime,
                rpc_timeout,
                stalled_after: link_stalled_after(election_timeout_max),
                connect_timeout: link_connect_timeout(election_timeout_max),
                clock,
                peers: RwLock::new(HashMap::new()),
                low_disk: Arc::new(LowDiskPeers::default()),
                snapshot_bytes: RwLock::new(HashMap::new()),
                reconnects: std::sync::atomic::AtomicU64::new(0),
            }),
        }
    }

    /// Every peer this node has an address for, `(id, grpc address)`.
    pub fn known(&self) -> Vec<(u64, String)> {
        let mut v: Vec<_> =
            self.inner.peers.read().expect("router lock").iter().map(|(id, peer)| (*id, peer.addr.clone())).collect();
        v.sort();
        v
    }

    /// Where `target`'s peer API listens, if this node knows.
    pub fn addr(&self, target: u64) -> Option<String> {
        self.inner.peers.read().expect("router lock").get(&target).map(|peer| peer.addr.clone())
    }

    /// Snapshot bytes this node has sent for `group` since it started.
    pub fn snapshot_bytes(&self, group: GroupId) -> u64 {
        self.inner.snapshot_bytes.read().expect("router lock").get(&group).copied().unwrap_or(0)
    }

    /// Records where `target` listens; a changed address gets a new link.
    pub fn set_addr(&self, target: u64, addr: &str) {
        if self.inner.peers.read().expect("router lock").get(&target).is_some_and(|peer| peer.addr == addr) {
            return;
        }
        match self.snapshot_client(addr) {
            Ok(snapshots) => {
                let observer = Arc::new(Observe(Arc::downgrade(&self.inner)));
                let link = Arc::new(LinkClient::new(
                    target,
                    addr,
                    self.inner.runtime.clone(),
                    self.inner.connect_timeout,
                    observer,
                    self.inner.tls.clone(),
                ));
                let health = std::sync::Mutex::new(LinkHealth::new(Instant::now()));
                let snapshot_turns = Arc::new(tokio::sync::Semaphore::new(SNAPSHOT_STREAMS_PER_PEER));
                let peer = Peer { addr: addr.to_string(), link, snapshots, snapshot_turns, health };
                let old = self.inner.peers.write().expect("router lock").insert(target, peer);
                if let Some(old) = old {
                    old.link.reconnect();
                }
            }
            Err(e) => tracing::warn!(target, addr, error = %e, "bad peer address"),
        }
    }

    /// A lazily connecting gRPC client for `addr`'s snapshot streams.
    fn snapshot_client(&self, addr: &str) -> Result<RaftTransportClient<Channel>, tonic::transport::Error> {
        let endpoint = Endpoint::from_shared(format!("http://{addr}"))?;
        // tonic spawns the channel's buffer and connection tasks on the
        // runtime it is made in: Raft's.
        let _raft_runtime = self.inner.runtime.enter();
        let endpoint = endpoint
            .connect_timeout(self.inner.rpc_timeout)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(5))
            .keep_alive_timeout(Duration::from_secs(5));
        Ok(RaftTransportClient::new(crate::peer_tls::peer_channel(self.inner.tls.as_ref(), endpoint))
            .max_decoding_message_size(64 << 20)
            .max_encoding_message_size(64 << 20))
    }

    /// How many times this node replaced a stalled connection to a peer.
    pub fn reconnects(&self) -> u64 {
        self.inner.reconnects.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// A call to `target` timed out unanswered: replaces its connection if
    /// it has stalled (see [`LinkHealth`]). Calls already sent on the old
    /// connection run their course.
    fn timed_out(&self, target: u64) {
        let stalled_after = self.inner.stalled_after;
        let peers = self.inner.peers.read().expect("router lock");
        let Some(peer) = peers.get(&target) else { return };
        if !peer.health.lock().expect("link health lock").timed_out(Instant::now(), stalled_after) {
            return;
        }
        peer.link.reconnect();
        self.inner.reconnects.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        metrics::counter!("tocsin_raft_reconnects_total").increment(1);
        tracing::info!(
            target,
            addr = %peer.addr,
            silent_ms = stalled_after.as_millis() as u64,
            "peer answered nothing while calls timed out; replacing its connection"
        );
    }

    /// Whether `peer` said in a reply of the last [`LOW_DISK_FRESH`] that its
    /// free disk is below its watermark: it would refuse creates and hand a
    /// leadership straight back (the balancer and the handover skip it).
    pub fn peer_low_disk(&self, peer: u64) -> bool {
        self.inner.low_disk.is_low(peer, Instant::now())
    }

    fn link(&self, target: u64) -> Result<Arc<LinkClient>, Unreachable<C>> {
        self.peer(target, |peer| peer.link.clone())
    }

    fn snapshots(
        &self,
        target: u64,
    ) -> Result<(RaftTransportClient<Channel>, Arc<tokio::sync::Semaphore>), Unreachable<C>> {
        self.peer(target, |peer| (peer.snapshots.clone(), peer.snapshot_turns.clone()))
    }

    /// `take` of `target`'s connections, or Unreachable if its address is
    /// unknown.
    fn peer<T>(&self, target: u64, take: impl FnOnce(&Peer) -> T) -> Result<T, Unreachable<C>> {
        self.inner
            .peers
            .read()
            .expect("router lock")
            .get(&target)
            .map(take)
            .ok_or_else(|| Unreachable::from_string(format!("no address known for node {target}")))
    }

    /// One Raft message to `target` over its link, answered within `wait`
    /// (and the transport's own timeout).
    async fn call<Req: Serialize, Resp: DeserializeOwned>(
        &self,
        target: u64,
        group_id: GroupId,
        kind: pb::RaftRpcKind,
        rpc: &Req,
        wait: Duration,
    ) -> Result<Resp, RPCError<C>> {
        let link = self.link(target)?;
        let delay = self.count_sent(target, kind).map_err(|_| Unreachable::from_string(DROPPED_BY_FAULT))?;
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        let wait = wait.min(self.inner.rpc_timeout);
        let sent_wall_ms = self.inner.clock.wall_ms();
        match link.call(kind, group_id, self.inner.node_id, encode(rpc), sent_wall_ms, wait).await {
            Ok(reply) => reply_to(reply),
            Err(e) => {
                if matches!(e, LinkError::TimedOut { .. }) {
                    self.timed_out(target);
                }
                Err(RPCError::Unreachable(Unreachable::from_string(e.to_string())))
            }
        }
    }

    /// Tells `target` which quiet groups this node leads (`quiet.rs`):
    /// `groups` as (group, term), one way (no reply).
    pub fn liveness(&self, target: u64, groups: &[(u64, u64)]) -> Result<(), String> {
        let kind = pb::RaftRpcKind::Liveness;
        // A one-way send cannot wait: a `delay:` action is ignored.
        self.count_sent(target, kind).map_err(|_| DROPPED_BY_FAULT.to_string())?;
        let link = self.link(target).map_err(|e| e.to_string())?;
        link.send(kind, self.inner.node_id, encode(&groups), self.inner.clock.wall_ms()).map_err(|e| e.to_string())
    }

    /// Counts one message of `kind` to `target` as sent, and reads the
    /// fault points `raft::to::<target>` and `raft::from::<this node>`:
    /// the fault when one of them drops it, else the delay their `delay:`
    /// actions ask for (zero when neither is armed).
    fn count_sent(&self, target: u64, kind: pb::RaftRpcKind) -> Result<Duration, crate::fault::Fault> {
        metrics::counter!("tocsin_raft_rpcs_sent_total", "rpc" => kind.as_str_name()).increment(1);
        let mut delay = Duration::ZERO;
        for point in [format!("raft::to::{target}"), format!("raft::from::{}", self.inner.node_id)] {
            delay += crate::fault::check_now(&point)?;
        }
        Ok(delay)
    }

    fn deadline(&self, option: &RPCOption) -> Duration {
        option.hard_ttl().min(self.inner.rpc_timeout)
    }
}

fn reply_to<T: DeserializeOwned>(reply: pb::RaftReply) -> Result<T, RPCError<C>> {
    if reply.unknown_group {
        return Err(RPCError::Unreachable(Unreachable::from_string("group not hosted on target")));
    }
    if !reply.error.is_empty() {
        return Err(RPCError::Unreachable(Unreachable::from_string(reply.error)));
    }
    decode(&reply.payload).map_err(|e| RPCError::Network(NetworkError::from_string(e)))
}

/// Why an RPC that a fault point dropped failed.
const DROPPED_BY_FAULT: &str = "dropped by a fault point";

/// Hears every reply on the links, including those whose caller stopped
/// waiting: openraft gives up on a heartbeat after 50 ms, but its reply
/// still measures the peer's clock and the link's health.
struct Observe(std::sync::Weak<RouterInner>);

impl ReplyObserver for Observe {
    fn replied(&self, target: u64, sent_wall_ms: u64, sent: Instant, kind: pb::RaftRpcKind, reply: &pb::RaftReply) {
        let Some(inner) = self.0.upgrade() else { return };
        let now = Instant::now();
        metrics::histogram!("tocsin_raft_rpc_seconds", "rpc" => kind.as_str_name())
            .record(now.saturating_duration_since(sent).as_secs_f64());
        inner.clock.record_peer(target, sent_wall_ms, sent, reply.replied_at_ms);
        inner.low_disk.note(target, reply.low_disk, now);
        if let Some(peer) = inner.peers.read().expect("router lock").get(&target) {
            peer.health.lock().expect("link health lock").replied(now);
        }
    }
}

impl GroupRouter<C, GroupId> for Router {
    type SnapshotData = SnapshotFile;

    async fn append_entries(
        &self,
        target: u64,
        group_id: GroupId,
        rpc: AppendEntriesRequest<C>,
        _option: RPCOption,
    ) -> Result<AppendEntriesResponse<C>, RPCError<C>> {
        // openraft's TTL for an append is the heartbeat interval (50 ms), which
        // a follower's fsync on a loaded node often exceeds; failing the append
        // then only makes the leader send it again after a back-off.
        self.call(target, group_id, pb::RaftRpcKind::AppendEntries, &rpc, self.inner.rpc_timeout).await
    }

    async fn vote(
        &self,
        target: u64,
        group_id: GroupId,
        rpc: VoteRequest<C>,
        option: RPCOption,
    ) -> Result<VoteResponse<C>, RPCError<C>> {
        self.call(target, group_id, pb::RaftRpcKind::Vote, &rpc, self.deadline(&option)).await
    }

    async fn pre_vote(
        &self,
        target: u64,
        group_id: GroupId,
        rpc: VoteRequest<C>,
        option: RPCOption,
    ) -> Result<VoteResponse<C>, RPCError<C>> {
        self.call(target, group_id, pb::RaftRpcKind::PreVote, &rpc, self.deadline(&option)).await
    }

    async fn transfer_leader(
        &self,
        target: u64,
        group_id: GroupId,
        req: TransferLeaderRequest<C>,
        option: RPCOption,
    ) -> Result<TransferLeaderResponse<C>, RPCError<C>> {
        self.call(target, group_id, pb::RaftRpcKind::TransferLeader, &req, self.deadline(&option)).await
    }

    async fn full_snapshot(
        &self,
        target: u64,
        group_id: GroupId,
        vote: Vote,
        snapshot: openraft::alias::SnapshotOf<C, SnapshotFile>,
        cancel: impl Future<Output = ReplicationClosed> + Send + 'static,
        _option: RPCOption,
    ) -> Result<SnapshotResponse<C>, StreamingError<C>> {
        let (mut client, turns) = self.snapshots(target)?;
        let mut cancel = std::pin::pin!(cancel);
        let waited = Instant::now();
        let _turn = tokio::select! {
            closed = &mut cancel => return Err(StreamingError::Closed(closed)),
            turn = turns.acquire_owned() => turn.expect("the semaphore is never closed"),
        };
        let waited_ms = waited.elapsed().as_millis() as u64;
        let from_node = self.inner.node_id;
        let header = encode(&(vote, snapshot.meta.clone()));
        let file = snapshot.snapshot;
        let len = file.len();
        // The reader runs on a blocking thread and feeds a bounded channel.
        let (tx, rx) = tokio::sync::mpsc::channel::<pb::SnapshotChunk>(4);
        let reader = tokio::task::spawn_blocking(move || -> std::io::Result<()> {
            let mut offset = 0u64;
            let mut first = true;
            loop {
                let mut buf = vec![0u8; SNAPSHOT_CHUNK_BYTES];
                let n = file.read_at(offset, &mut buf)?;
                buf.truncate(n);
                let done = offset + n as u64 >= len;
                let chunk = pb::SnapshotChunk {
                    group_id,
                    from_node,
                    header: if first { header.clone().into() } else { Default::default() },
                    offset,
                    data: buf.into(),
                    done,
                };
                first = false;
                offset += n as u64;
                if tx.blocking_send(chunk).is_err() || done {
                    return Ok(());
                }
                if n == 0 {
                    return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "snapshot file shrank"));
                }
            }
        });
        let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
        let started = Instant::now();
        let last = snapshot.meta.last_log_id;
        let send = client.install_snapshot(stream);
        let result = tokio::select! {
            closed = &mut cancel => return Err(StreamingError::Closed(closed)),
            r = send => r,
        };
        match reader.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(StreamingError::Unreachable(Unreachable::new(&e))),
            Err(e) => return Err(StreamingError::Unreachable(Unreachable::new(&e))),
        }
        if result.is_ok() {
            *self.inner.snapshot_bytes.write().expect("router lock").entry(group_id).or_default() += len;
        }
        tracing::info!(
            group = group_id,
            target,
            bytes = len,
            ?last,
            waited_ms,
            ms = started.elapsed().as_millis() as u64,
            error = result.as_ref().err().map(|e| e.to_string()),
            "sent snapshot"
        );
        match result {
            Ok(resp) => reply_to(resp.into_inner()).map_err(|e| match e {
                RPCError::Unreachable(u) => StreamingError::Unreachable(u),
                RPCError::Network(n) => StreamingError::Network(n),
                other => StreamingError::Network(NetworkError::from_string(other.to_string())),
            }),
            Err(status) => Err(StreamingError::Unreachable(Unreachable::from_string(status.message()))),
        }
    }
}

/// openraft's network factory for one group: adapters over the shared
/// router.
#[derive(Clone)]
pub struct NetworkFactory {
    router: Router,
    group: GroupId,
}

impl NetworkFactory {
    pub fn new(router: Router, group: GroupId) -> NetworkFactory {
        NetworkFactory { router, group }
    }
}

impl openraft::RaftNetworkFactory<C> for NetworkFactory {
    type Network = GroupNetworkAdapter<C, GroupId, Router>;

    async fn new_client(&mut self, target: u64, node: &NodeAddr) -> Self::Network {
        self.router.set_addr(target, &node.peer_addr);
        GroupNetworkAdapter::new(self.router.clone(), target, self.group)
    }
}

/// The groups this node hosts, by id: what the transport server routes to.
#[derive(Clone, Default)]
pub struct Groups {
    inner: Arc<RwLock<HashMap<GroupId, Raft>>>,
}

impl Groups {
    pub fn insert(&self, group: GroupId, raft: Raft) {
        self.inner.write().expect("groups lock").insert(group, raft);
    }

    pub fn remove(&self, group: GroupId) -> Option<Raft> {
        self.inner.write().expect("groups lock").remove(&group)
    }

    pub fn get(&self, group: GroupId) -> Option<Raft> {
        self.inner.read().expect("groups lock").get(&group).cloned()
    }

    pub fn contains(&self, group: GroupId) -> bool {
        self.inner.read().expect("groups lock").contains_key(&group)
    }

    pub fn all(&self) -> Vec<(GroupId, Raft)> {
        let mut v: Vec<_> = self.inner.read().expect("groups lock").iter().map(|(g, r)| (*g, r.clone())).collect();
        v.sort_by_key(|(g, _)| *g);
        v
    }
}

/// The server half of the transport.
pub struct TransportService {
    groups: Groups,
    /// Where incoming snapshot streams are spooled.
    spool_dir: std::path::PathBuf,
    /// Every reply carries this node's wall clock (peers measure offsets).
    clock: Arc<Clock>,
    /// And whether its free disk is below the watermark.
    low_disk: Arc<std::sync::atomic::AtomicBool>,
    /// Where `LIVENESS` messages are noted (`quiet.rs`).
    quiet: crate::shard::quiet::Quiet,
}

impl TransportService {
    pub fn new(
        groups: Groups,
        spool_dir: std::path::PathBuf,
        clock: Arc<Clock>,
        low_disk: Arc<std::sync::atomic::AtomicBool>,
        quiet: crate::shard::quiet::Quiet,
    ) -> TransportService {
        TransportService { groups, spool_dir, clock, low_disk, quiet }
    }

    fn low_disk(&self) -> bool {
        self.low_disk.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn group(&self, group_id: GroupId) -> Result<Raft, pb::RaftReply> {
        self.groups.get(group_id).ok_or_else(|| pb::RaftReply {
            payload: Default::default(),
            error: String::new(),
            unknown_group: true,
            replied_at_ms: self.clock.wall_ms(),
            low_disk: self.low_disk(),
        })
    }

    fn reply<T: Serialize, E: std::fmt::Display>(&self, result: Result<T, E>) -> pb::RaftReply {
        let replied_at_ms = self.clock.wall_ms();
        match result {
            Ok(v) => pb::RaftReply {
                payload: encode(&v).into(),
                error: String::new(),
                unknown_group: false,
                replied_at_ms,
                low_disk: self.low_disk(),
            },
            Err(e) => pb::RaftReply {
                payload: Default::default(),
                error: e.to_string(),
                unknown_group: false,
                replied_at_ms,
                low_disk: self.low_disk(),
            },
        }
    }
}

impl crate::shard::link::LinkHandler for TransportService {
    async fn handle(&self, req: pb::RaftLinkRequest) -> pb::RaftReply {
        self.clock.record_incoming(req.from_node, req.sent_at_ms);
        if req.kind == pb::RaftRpcKind::Liveness as i32 {
            return match decode::<Vec<(u64, u64)>>(&req.payload) {
                Ok(groups) => {
                    let now = tokio::time::Instant::now();
                    self.quiet.heard_from(req.from_node, &groups, now, |g| self.groups.contains(g));
                    self.reply::<(), String>(Ok(()))
                }
                Err(e) => self.reply::<(), _>(Err(format!("bad payload: {e}"))),
            };
        }
        let raft = match self.group(req.group_id) {
            Ok(r) => r,
            Err(reply) => return reply,
        };
        let bad = |e: String| self.reply::<(), _>(Err(format!("bad payload: {e}")));
        // The vote inside names its sender (the leader, the candidate): it
        // must be the node the frame says, which the link checked against
        // the peer's certificate.
        let not_sender = |vote: &Vote| {
            let named = vote.leader_id().node_id;
            (named != req.from_node).then(|| {
                metrics::counter!("tocsin_peer_refused_total", "reason" => "vote_node").increment(1);
                bad(format!("the message's vote names node {named}, but it came from node {}", req.from_node))
            })
        };
        match pb::RaftRpcKind::try_from(req.kind) {
            Ok(pb::RaftRpcKind::AppendEntries) => match decode::<AppendEntriesRequest<C>>(&req.payload) {
                Ok(rpc) => match not_sender(&rpc.vote) {
                    Some(refused) => refused,
                    None => {
                        let started = Instant::now();
                        let result = raft.append_entries(rpc).await;
                        metrics::histogram!("tocsin_raft_append_handled_seconds")
                            .record(started.elapsed().as_secs_f64());
                        self.reply(result)
                    }
                },
                Err(e) => bad(e),
            },
            Ok(pb::RaftRpcKind::Vote) => match decode::<VoteRequest<C>>(&req.payload) {
                Ok(rpc) => match not_sender(&rpc.vote) {
                    Some(refused) => refused,
                    None => self.reply(raft.vote(rpc).await),
                },
                Err(e) => bad(e),
            },
            Ok(pb::RaftRpcKind::PreVote) => match decode::<VoteRequest<C>>(&req.payload) {
                Ok(rpc) => match not_sender(&rpc.vote) {
                    Some(refused) => refused,
                    None => self.reply(raft.pre_vote(rpc).await),
                },
                Err(e) => bad(e),
            },
            Ok(pb::RaftRpcKind::TransferLeader) => match decode::<TransferLeaderRequest<C>>(&req.payload) {
                Ok(rpc) => match not_sender(rpc.from_leader()) {
                    Some(refused) => refused,
                    None => self.reply(raft.handle_transfer_leader(rpc).await),
                },
                Err(e) => bad(e),
            },
            Ok(pb::RaftRpcKind::Unspecified | pb::RaftRpcKind::Liveness) | Err(_) => {
                bad(format!("unknown message kind {}", req.kind))
            }
        }
    }
}

fn bad_payload(e: String) -> tonic::Status {
    tonic::Status::invalid_argument(e)
}

#[tonic::async_trait]
impl pb::raft_transport_server::RaftTransport for TransportService {
    async fn install_snapshot(
        &self,
        request: tonic::Request<tonic::Streaming<pb::SnapshotChunk>>,
    ) -> Result<tonic::Response<pb::RaftReply>, tonic::Status> {
        use tokio::io::AsyncWriteExt;
        let peer = request.extensions().get::<crate::peer_tls::PeerConn>().cloned();
        let mut stream = request.into_inner();
        let started = Instant::now();
        let Some(first) = stream.message().await? else {
            return Err(tonic::Status::invalid_argument("empty snapshot stream"));
        };
        let raft = match self.group(first.group_id) {
            Ok(r) => r,
            Err(reply) => return Ok(tonic::Response::new(reply)),
        };
        let (vote, meta): (Vote, tocsin_store::SnapshotMeta) = decode(&first.header).map_err(bad_payload)?;
        // A snapshot comes from the leader its vote names: with peer TLS,
        // that must be the node the connection's certificate names.
        let sender = vote.leader_id().node_id;
        if let Some(peer) = peer
            && !peer.speaks_for(sender)
        {
            metrics::counter!("tocsin_peer_refused_total", "reason" => "from_node").increment(1);
            return Err(tonic::Status::permission_denied(format!(
                "a snapshot from node {sender} must come on a connection with node {sender}'s certificate"
            )));
        }
        // File work goes through tokio::fs (the blocking pool): this runs on
        // the Raft runtime, whose threads carry every group's heartbeats,
        // and a snapshot is megabytes and a sync.
        let internal = |e: std::io::Error| tonic::Status::internal(e.to_string());
        tokio::fs::create_dir_all(&self.spool_dir).await.map_err(internal)?;
        let path = self.spool_dir.join(format!("incoming-{}-{}.snap", first.group_id, crate::clock::system_now_ms()));
        let mut file = tokio::fs::File::create(&path).await.map_err(internal)?;
        let mut expected = 0u64;
        let first_group = first.group_id;
        let mut chunk = Some(first);
        let mut done = false;
        while let Some(c) = chunk.take() {
            if c.offset != expected {
                let _ = tokio::fs::remove_file(&path).await;
                return Err(tonic::Status::invalid_argument(format!(
                    "snapshot chunk at {} but expected {expected}",
                    c.offset
                )));
            }
            file.write_all(&c.data).await.map_err(internal)?;
            expected += c.data.len() as u64;
            if c.done {
                done = true;
                break;
            }
            chunk = match stream.message().await {
                Ok(c) => c,
                Err(status) => {
                    tracing::info!(
                        group = first_group,
                        from = sender,
                        bytes = expected,
                        ms = started.elapsed().as_millis() as u64,
                        %status,
                        "snapshot stream broke off"
                    );
                    let _ = tokio::fs::remove_file(&path).await;
                    return Err(status);
                }
            };
        }
        if !done {
            let _ = tokio::fs::remove_file(&path).await;
            return Err(tonic::Status::aborted("snapshot stream ended early"));
        }
        file.flush().await.map_err(internal)?;
        file.sync_all().await.map_err(internal)?;
        drop(file);
        let received_ms = started.elapsed().as_millis() as u64;
        let snapshot = SnapshotFile::open(&path).map_err(|e| tonic::Status::internal(e.to_string()))?;
        let group = first_group;
        let result =
            raft.install_full_snapshot(vote, openraft::alias::SnapshotOf::<C, SnapshotFile> { meta, snapshot }).await;
        tracing::info!(
            group,
            from = sender,
            bytes = expected,
            received_ms,
            total_ms = started.elapsed().as_millis() as u64,
            ok = result.is_ok(),
            "snapshot stream handled"
        );
        // The state machine keeps its own copy; the spool file can go.
        let _ = tokio::fs::remove_file(&path).await;
        Ok(tonic::Response::new(self.reply(result)))
    }
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;
    use std::sync::atomic::AtomicU64;
    use std::sync::atomic::Ordering;

    use tokio::io::AsyncReadExt;
    use tokio::io::AsyncWriteExt;

    use super::*;

    const STALL: Duration = Duration::from_secs(2);

    #[test]
    fn a_link_that_answers_is_never_replaced() {
        let t0 = Instant::now();
        let mut health = LinkHealth::new(t0);
        for s in 1..10 {
            let now = t0 + Duration::from_secs(s);
            health.replied(now - Duration::from_millis(500));
            assert!(!health.timed_out(now, STALL), "replaced at {s} s although it answered 0.5 s before");
        }
    }

    #[test]
    fn a_silent_link_is_replaced_once_per_period() {
        let t0 = Instant::now();
        let mut health = LinkHealth::new(t0);
        // A new connection gets a full period before it counts as stalled.
        assert!(!health.timed_out(t0 + Duration::from_millis(1_999), STALL));
        assert!(health.timed_out(t0 + STALL, STALL));
        // Timeouts of calls sent on the old connection do not replace the new one at once.
        assert!(!health.timed_out(t0 + STALL + Duration::from_millis(100), STALL));
        assert!(!health.timed_out(t0 + STALL * 2 - Duration::from_millis(1), STALL));
        assert!(health.timed_out(t0 + STALL * 2, STALL));
        // A reply on the new connection resets the clock.
        health.replied(t0 + STALL * 2 + Duration::from_millis(10));
        assert!(!health.timed_out(t0 + STALL * 3, STALL));
        assert!(health.timed_out(t0 + STALL * 3 + Duration::from_millis(10), STALL));
    }

    /// A TCP proxy to `upstream` whose connections stop forwarding, without
    /// closing, once `stuck_before` passes their number: what a connection
    /// looks like to the application while the kernel backs off its
    /// retransmissions after a partition. Connections made later work.
    async fn proxy(upstream: SocketAddr, stuck_before: Arc<AtomicU64>) -> SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().expect("proxy address");
        tokio::spawn(async move {
            let mut number = 0u64;
            while let Ok((downstream, _)) = listener.accept().await {
                number += 1;
                let Ok(up) = tokio::net::TcpStream::connect(upstream).await else { continue };
                let (down_read, down_write) = downstream.into_split();
                let (up_read, up_write) = up.into_split();
                for (mut from, mut to) in [
                    (
                        Box::new(down_read) as Box<dyn tokio::io::AsyncRead + Send + Unpin>,
                        Box::new(up_write) as Box<dyn tokio::io::AsyncWrite + Send + Unpin>,
                    ),
                    (Box::new(up_read), Box::new(down_write)),
                ] {
                    let stuck_before = stuck_before.clone();
                    tokio::spawn(async move {
                        let mut buf = vec![0u8; 64 << 10];
                        loop {
                            let n = match from.read(&mut buf).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => n,
                            };
                            while stuck_before.load(Ordering::Relaxed) > number {
                                tokio::time::sleep(Duration::from_millis(10)).await;
                            }
                            if to.write_all(&buf[..n]).await.is_err() {
                                return;
                            }
                        }
                    });
                }
            }
        });
        addr
    }

    /// One vote call to node 2 for a group it does not host: `true` when it
    /// answered (that it does not host the group), `false` on a timeout.
    async fn answered(router: &Router) -> bool {
        let rpc = VoteRequest::<C>::new(Vote::new(1, 1), None);
        match router.vote(2, 7, rpc, RPCOption::new(Duration::from_secs(1))).await {
            Ok(_) => panic!("node 2 hosts no group"),
            Err(e) => {
                let e = e.to_string();
                assert!(e.contains("not hosted") || e.contains("timed out"), "unexpected error: {e}");
                e.contains("not hosted")
            }
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stalled_peer_connection_is_replaced_and_calls_are_answered_again() {
        let spool = tempfile::tempdir().expect("tempdir");
        let clock = Clock::system(500);
        let service = TransportService::new(
            Groups::default(),
            spool.path().to_path_buf(),
            clock.clone(),
            Arc::new(std::sync::atomic::AtomicBool::new(false)),
            Default::default(),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind server");
        let server_addr = listener.local_addr().expect("server address");
        let _grpc =
            crate::shard::link::split_incoming(listener, Arc::new(service), tokio::runtime::Handle::current(), None);
        let stuck_before = Arc::new(AtomicU64::new(0));
        let proxy_addr = proxy(server_addr, stuck_before.clone()).await;

        let rpc_timeout = Duration::from_millis(200);
        let election_timeout_max = Duration::from_millis(100);
        let stalled_after = link_stalled_after(election_timeout_max);
        let router = Router::new(1, rpc_timeout, election_timeout_max, clock, tokio::runtime::Handle::current(), None);
        router.set_addr(2, &proxy_addr.to_string());
        assert!(answered(&router).await, "the first call went unanswered");
        assert_eq!(router.reconnects(), 0);

        // Every connection made so far goes silent and stays open.
        stuck_before.store(u64::MAX, Ordering::Relaxed);
        let stuck_at = Instant::now();
        assert!(!answered(&router).await, "a stuck connection answered");
        stuck_before.store(2, Ordering::Relaxed);

        // Calls keep timing out until the router gives up on the connection
        // (two election timeouts of silence; here that is also the first
        // call's own timeout), then a new one answers.
        while !answered(&router).await {
            assert!(
                stuck_at.elapsed() < Duration::from_secs(3),
                "still no answer {:?} after the connection stalled (reconnects: {})",
                stuck_at.elapsed(),
                router.reconnects()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(router.reconnects(), 1, "one stall, one new connection");
        let recovered_ms = stuck_at.elapsed().as_millis();
        assert!(
            recovered_ms + 50 >= stalled_after.as_millis(),
            "replaced before it was silent long enough: {recovered_ms} ms"
        );
    }
}
