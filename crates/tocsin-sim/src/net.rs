//! The simulated wire: length-prefixed JSON over turmoil TCP, one
//! connection per call, every call under a deadline.
//!
//! turmoil TCP does not retransmit: a segment lost to a partition is lost,
//! so a call without a deadline could wait forever. Every client-side call
//! here has one; a call that misses it is an unknown outcome to its caller.

use std::future::Future;
use std::io;
use std::time::Duration;

use openraft::error::NetworkError;
use openraft::error::RPCError;
use openraft::error::ReplicationClosed;
use openraft::error::StreamingError;
use openraft::error::Unreachable;
use openraft::network::RPCOption;
use openraft::raft::AppendEntriesRequest;
use openraft::raft::AppendEntriesResponse;
use openraft::raft::SnapshotResponse;
use openraft::raft::VoteRequest;
use openraft::raft::VoteResponse;
use serde::Deserialize;
use serde::Serialize;
use tocsin_core::Command;
use tocsin_core::CommandResult;
use tocsin_core::TimerKey;
use tokio::io::AsyncReadExt as _;
use tokio::io::AsyncWriteExt as _;
use turmoil::net::TcpListener;
use turmoil::net::TcpStream;

use crate::types::SnapshotMeta;
use crate::types::TypeConfig;
use crate::types::Vote;

/// Every node serves Raft, the client API and pull consumers here.
pub const NODE_PORT: u16 = 7000;
/// The webhook receiver's port.
pub const RECEIVER_PORT: u16 = 8000;

pub fn node_host(id: u64) -> String {
    format!("n{id}")
}

/// One webhook attempt or one reserved pull item, as its receiver sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delivery {
    pub key: TimerKey,
    pub fire_index: u64,
    pub attempt: u32,
    /// The fencing token: the dispatching leader's epoch.
    pub epoch: u64,
    /// Log index of the entry that started this attempt.
    pub attempt_index: u64,
    pub fire_at_ms: u64,
    /// The node that sent it.
    pub from: u64,
}

/// What a client-API call answered.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum ClientReply {
    /// Applied at `index` with this result.
    Applied { index: u64, result: Box<CommandResult> },
    /// Not applied here: this node does not lead (the leader, if known).
    NotLeader { leader: Option<u64> },
    /// This node leads without a quorum: not proposed.
    NoQuorum,
    /// Proposed; whether it applied is unknown.
    Unknown,
}

#[derive(Serialize, Deserialize)]
pub enum Request {
    Append(AppendEntriesRequest<TypeConfig>),
    Vote(VoteRequest<TypeConfig>),
    PreVote(VoteRequest<TypeConfig>),
    Snapshot {
        vote: Vote,
        meta: SnapshotMeta,
        data: Vec<u8>,
    },
    /// A client command; `drop_reply` makes the node apply it and then close
    /// the connection without answering (the dropped-reply fault).
    Client {
        command: Command,
        drop_reply: bool,
    },
    /// A pull consumer asks for up to `max` ready timers, reserved for `ttr_ms`.
    Reserve {
        max: usize,
        ttr_ms: u64,
    },
    Ack {
        key: TimerKey,
        fire_index: u64,
        attempt: u32,
    },
    Deliver(Delivery),
}

#[derive(Serialize, Deserialize)]
pub enum Response {
    Append(Result<AppendEntriesResponse<TypeConfig>, String>),
    Vote(Result<VoteResponse<TypeConfig>, String>),
    Snapshot(Result<SnapshotResponse<TypeConfig>, String>),
    Client(ClientReply),
    Reserved(Vec<Delivery>),
    Acked(bool),
    /// An HTTP-like status: 200 accepted, 409 stale epoch, 503 down.
    Delivered(u16),
}

async fn write_frame(stream: &mut TcpStream, bytes: &[u8]) -> io::Result<()> {
    stream.write_all(&(bytes.len() as u32).to_be_bytes()).await?;
    stream.write_all(bytes).await?;
    stream.flush().await
}

async fn read_frame(stream: &mut TcpStream) -> io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    stream.read_exact(&mut len).await?;
    let mut buf = vec![0u8; u32::from_be_bytes(len) as usize];
    stream.read_exact(&mut buf).await?;
    Ok(buf)
}

/// One request and its response, within `timeout`.
pub async fn call(host: &str, port: u16, request: &Request, timeout: Duration) -> io::Result<Response> {
    let bytes = serde_json::to_vec(request).map_err(io::Error::other)?;
    let exchange = async {
        let mut stream = TcpStream::connect((host, port)).await?;
        write_frame(&mut stream, &bytes).await?;
        let reply = read_frame(&mut stream).await?;
        serde_json::from_slice::<Response>(&reply).map_err(io::Error::other)
    };
    match tokio::time::timeout(timeout, exchange).await {
        Ok(r) => r,
        Err(_) => Err(io::Error::new(io::ErrorKind::TimedOut, "call timed out")),
    }
}

/// Serves `port`: each connection carries one request; `handle` answers it
/// (`None`: close without answering).
pub async fn serve<H, Fut>(port: u16, handle: H) -> io::Result<()>
where
    H: Fn(Request) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Option<Response>> + Send + 'static,
{
    let listener = TcpListener::bind(("0.0.0.0", port)).await?;
    loop {
        let (mut stream, _) = listener.accept().await?;
        let handle = handle.clone();
        crate::types::spawn(async move {
            let Ok(bytes) = read_frame(&mut stream).await else { return };
            let Ok(request) = serde_json::from_slice::<Request>(&bytes) else { return };
            if let Some(response) = handle(request).await {
                let bytes = serde_json::to_vec(&response).expect("responses serialize");
                let _ = write_frame(&mut stream, &bytes).await;
            }
        });
    }
}

/// openraft's network factory: one [`Peer`] per target node.
pub struct Network;

pub struct Peer {
    host: String,
}

impl openraft::RaftNetworkFactory<TypeConfig> for Network {
    type Network = Peer;

    async fn new_client(&mut self, target: u64, _node: &openraft::BasicNode) -> Peer {
        Peer { host: node_host(target) }
    }
}

/// Longest a Raft RPC may take: heartbeats are every 50 ms, so a peer that
/// cannot answer within this is as good as unreachable.
const RPC_TIMEOUT: Duration = Duration::from_millis(500);

impl Peer {
    async fn rpc(&self, request: Request, option: &RPCOption) -> Result<Response, Unreachable<TypeConfig>> {
        let timeout = option.hard_ttl().min(RPC_TIMEOUT);
        call(&self.host, NODE_PORT, &request, timeout).await.map_err(|e| Unreachable::new(&e))
    }
}

fn remote<T>(r: Result<T, String>) -> Result<T, RPCError<TypeConfig>> {
    r.map_err(|e| RPCError::Network(NetworkError::from_string(e)))
}

impl openraft::RaftNetworkV2<TypeConfig> for Peer {
    type SnapshotData = Vec<u8>;

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig>> {
        match self.rpc(Request::Append(rpc), &option).await? {
            Response::Append(r) => remote(r),
            _ => Err(RPCError::Network(NetworkError::from_string("wrong response".to_string()))),
        }
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        match self.rpc(Request::Vote(rpc), &option).await? {
            Response::Vote(r) => remote(r),
            _ => Err(RPCError::Network(NetworkError::from_string("wrong response".to_string()))),
        }
    }

    async fn pre_vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        match self.rpc(Request::PreVote(rpc), &option).await? {
            Response::Vote(r) => remote(r),
            _ => Err(RPCError::Network(NetworkError::from_string("wrong response".to_string()))),
        }
    }

    async fn full_snapshot(
        &mut self,
        vote: Vote,
        snapshot: openraft::alias::SnapshotOf<TypeConfig, Vec<u8>>,
        cancel: impl Future<Output = ReplicationClosed> + Send + 'static,
        _option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        let request = Request::Snapshot { vote, meta: snapshot.meta, data: snapshot.snapshot };
        let send = call(&self.host, NODE_PORT, &request, Duration::from_secs(5));
        let result = tokio::select! {
            biased;
            closed = cancel => return Err(StreamingError::Closed(closed)),
            r = send => r,
        };
        match result {
            Ok(Response::Snapshot(Ok(r))) => Ok(r),
            Ok(Response::Snapshot(Err(e))) => Err(StreamingError::Network(NetworkError::from_string(e))),
            Ok(_) => Err(StreamingError::Network(NetworkError::from_string("wrong response".to_string()))),
            Err(e) => Err(StreamingError::Unreachable(Unreachable::new(&e))),
        }
    }
}
