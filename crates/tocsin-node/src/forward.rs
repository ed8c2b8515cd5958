//! One-hop forwarding: any node accepts any request and, when it does not
//! lead the shard, passes the request to the leader it knows of.
//!
//! A forwarded request carries `x-tocsin-forwarded`, and is never forwarded again:
//! if the receiver is not the leader either (leadership moved meanwhile) it
//! answers UNAVAILABLE with its own hint, and the client retries. The
//! shard-aware client sends to leaders directly and rarely pays this hop.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;

use tocsin_proto::v1::timer_service_client::TimerServiceClient;
use tonic::transport::Channel;
use tonic::transport::Endpoint;

use crate::peer_tls::PeerTls;

use tocsin_contract::headers::FORWARDED;
use tocsin_contract::headers::LEADER;
use tocsin_contract::headers::LOCAL_ONLY;
use tocsin_contract::headers::MAP_EPOCH;
use tocsin_contract::headers::SHARD;

/// Marks `response` as answered by `leader` (see `tocsin_contract::headers::LEADER`).
pub fn mark_leader<T>(response: &mut tonic::Response<T>, leader: u64) {
    response.metadata_mut().insert(LEADER, leader.to_string().parse().expect("ascii"));
}

/// How long a forward's connection may hear nothing while requests are
/// open before it is pinged (see [`Forwarder::endpoint`]).
pub const PEER_PING_INTERVAL: Duration = Duration::from_secs(1);
/// How long a ping may go unanswered before its connection is closed.
pub const PEER_PING_TIMEOUT: Duration = Duration::from_secs(1);

/// gRPC channels to other nodes' public API, by address.
pub struct Forwarder {
    channels: Mutex<HashMap<String, Channel>>,
    timeout: Duration,
    /// Peer ports are reached through mTLS when it is on.
    tls: Option<Arc<PeerTls>>,
}

impl Forwarder {
    pub fn new(timeout: Duration, tls: Option<Arc<PeerTls>>) -> Forwarder {
        Forwarder { channels: Mutex::new(HashMap::new()), timeout, tls }
    }

    pub fn client(&self, addr: &str) -> Option<TimerServiceClient<Channel>> {
        Some(TimerServiceClient::new(self.channel(addr)?).max_decoding_message_size(64 << 20))
    }

    /// The cached channel to the peer port at `addr` (any of its gRPC
    /// services), created lazily on first use.
    pub fn channel(&self, addr: &str) -> Option<Channel> {
        let mut channels = self.channels.lock().expect("channels lock");
        if let Some(c) = channels.get(addr) {
            return Some(c.clone());
        }
        let channel = crate::peer_tls::peer_channel(self.tls.as_ref(), self.endpoint(addr)?);
        channels.insert(addr.to_string(), channel.clone());
        Some(channel)
    }

    /// A channel to a node's client port at `addr`: how `node add` first
    /// asks a new node where its peer port is. Not cached.
    pub fn client_port_channel(&self, addr: &str) -> Option<Channel> {
        Some(self.endpoint(addr)?.connect_lazy())
    }

    fn endpoint(&self, addr: &str) -> Option<Endpoint> {
        Some(
            Endpoint::from_shared(format!("http://{addr}"))
                .ok()?
                .connect_timeout(Duration::from_secs(1))
                .timeout(self.timeout)
                .tcp_nodelay(true)
                // A connection that carried a request while the peer was
                // cut off holds unacknowledged bytes, which the kernel
                // resends at doubling intervals (0.2 s, 0.6, 1.4, ... 12.6,
                // 25.4 s): a request sent on it after the network heals
                // waits for the next resend, seconds later (chaos
                // partition-leader's 20 s cut: calls whose items were
                // forwarded right after the heal answered after the
                // client's 2 s deadline). A ping unanswered for
                // `PEER_PING_TIMEOUT` closes it, and the next request
                // opens a new connection. Pings go only while requests
                // are open and nothing has been heard for the interval.
                .http2_keep_alive_interval(PEER_PING_INTERVAL)
                .keep_alive_timeout(PEER_PING_TIMEOUT),
        )
    }

    /// A request marked as forwarded (and, optionally, for one shard).
    pub fn request<T>(&self, message: T, shard: Option<u32>) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        request.set_timeout(self.timeout);
        request.metadata_mut().insert(FORWARDED, "1".parse().expect("ascii"));
        if let Some(shard) = shard {
            request.metadata_mut().insert(SHARD, shard.to_string().parse().expect("ascii"));
        }
        request
    }
}

pub fn is_forwarded<T>(request: &tonic::Request<T>) -> bool {
    request.metadata().contains_key(FORWARDED)
}

pub fn is_local_only<T>(request: &tonic::Request<T>) -> bool {
    request.metadata().contains_key(LOCAL_ONLY)
}

/// The single shard a request is restricted to, if any.
pub fn only_shard<T>(request: &tonic::Request<T>) -> Option<u32> {
    request.metadata().get(SHARD)?.to_str().ok()?.parse().ok()
}

/// The map epoch a request was routed by; 0 when it carries none.
pub fn map_epoch<T>(request: &tonic::Request<T>) -> u64 {
    request.metadata().get(MAP_EPOCH).and_then(|v| v.to_str().ok()?.parse().ok()).unwrap_or(0)
}
