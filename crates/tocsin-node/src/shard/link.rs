//! The Raft link: one TCP connection per peer node, shared by every Raft
//! group's messages in that direction, on the node's gRPC port.
//!
//! Why not a gRPC call per message: on two cores, each unary call costs a
//! new HTTP/2 stream, header encoding, a task per request on both sides and
//! a channel hop through tonic's buffer, about a millisecond of round trip
//! on loopback before the peer does any work (measured: appends answered in
//! 0.33 ms by the follower took 1.44 ms end to end), and every shard's
//! heartbeats pay it twenty times a second. The link writes whatever
//! messages are queued as one frame (a lone message waits one turn of the
//! runtime for company first), so a busy link carries many groups'
//! appends and heartbeats per write, and a message costs a queue push, a
//! frame slot and a map entry.
//!
//! Wire format (`proto/tocsin/v1/raft.proto`): the connecting side writes
//! [`PREFACE`], then both sides write frames, a 4-byte big-endian length
//! and a `RaftLinkFrame`. Requests carry an id; replies name it and come in
//! any order (an append that waits for its fsync does not hold up a vote).
//! The accepting side tells a link from an HTTP/2 client by the first byte
//! ([`split_incoming`]), or with peer TLS on (`peer_tls.rs`) by ALPN; then
//! each request's `from_node` must be a node the peer's certificate names.
//!
//! Failure: a connection that fails or closes fails every call waiting on
//! it (openraft sees `Unreachable` and backs off); the next call connects
//! again. A connection that stays open but answers nothing while calls time
//! out is replaced ([`LinkHealth`](crate::shard::raft)); a reply that comes after
//! its caller stopped waiting still measures the peer's clock.

use std::collections::HashMap;
use std::io;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering;
use std::time::Duration;
use std::time::Instant;

use tocsin_proto::v1 as pb;
use tokio::io::AsyncRead;
use tokio::io::AsyncReadExt;
use tokio::io::AsyncWrite;
use tokio::io::AsyncWriteExt;
use tokio::io::BufReader;
use tokio::net::TcpListener;
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::peer_tls::PeerConn;
use crate::peer_tls::PeerIo;
use crate::peer_tls::PeerTls;

// The framing itself is the contract's, fuzzed there.
pub use tocsin_contract::link_frame::MAX_FRAME_BYTES;
pub use tocsin_contract::link_frame::PREFACE;
pub use tocsin_contract::link_frame::read_frame;
/// The id of a request that wants no reply ([`LinkClient::send`]); calls
/// number theirs from 1.
pub const NO_REPLY: u64 = 0;
/// Most messages written as one frame.
const MAX_ITEMS_PER_FRAME: usize = 1024;
/// A frame is closed once its messages' payloads pass this.
const FRAME_SOFT_BYTES: usize = 4 << 20;
/// Most messages queued for a connection's writer; past it a call fails at
/// once (`Unreachable`) rather than queue behind a link that is not moving.
const QUEUE_DEPTH: usize = 8192;
/// After a failed connection attempt, calls fail at once for this long
/// instead of each trying again: a dead peer costs a few attempts a second,
/// not one per heartbeat per group.
const RECONNECT_AFTER: Duration = Duration::from_millis(100);
/// How long an accepted connection may take to send its first byte.
const FIRST_BYTE_WITHIN: Duration = Duration::from_secs(10);
/// How often a connection's writer forgets calls nobody answered.
const SWEEP_EVERY: Duration = Duration::from_millis(200);

/// Why a call failed without a reply.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    #[error("link to node {target}: {reason}")]
    Unreachable { target: u64, reason: String },
    #[error("timed out: no reply from node {target} within {waited:?}")]
    TimedOut { target: u64, waited: Duration },
}

/// What a link's reader does with each reply as it arrives, whether or not
/// its caller still waits: measure the peer's clock, note its disk and the
/// link's health.
pub trait ReplyObserver: Send + Sync + 'static {
    fn replied(&self, target: u64, sent_wall_ms: u64, sent: Instant, kind: pb::RaftRpcKind, reply: &pb::RaftReply);
}

struct Waiting {
    done: oneshot::Sender<pb::RaftReply>,
    sent: Instant,
    sent_wall_ms: u64,
    kind: pb::RaftRpcKind,
}

/// One connection (or the attempt to make one).
struct Conn {
    queue: mpsc::Sender<pb::RaftLinkRequest>,
    waiting: Mutex<HashMap<u64, Waiting>>,
    closed: AtomicBool,
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

impl Conn {
    /// Fails every waiting call and stops the connection's tasks.
    fn close(&self) {
        if self.closed.swap(true, Ordering::SeqCst) {
            return;
        }
        self.waiting.lock().expect("link lock").clear();
        for task in self.tasks.lock().expect("link lock").drain(..) {
            task.abort();
        }
    }

    /// Forgets calls older than `older_than`: their callers gave up long ago.
    fn sweep(&self, older_than: Duration) {
        let now = Instant::now();
        self.waiting.lock().expect("link lock").retain(|_, w| now.saturating_duration_since(w.sent) < older_than);
    }
}

/// The client half of the link to one peer.
pub struct LinkClient {
    target: u64,
    addr: String,
    runtime: tokio::runtime::Handle,
    connect_timeout: Duration,
    observer: Arc<dyn ReplyObserver>,
    tls: Option<Arc<PeerTls>>,
    next_id: AtomicU64,
    slot: Mutex<Slot>,
}

#[derive(Default)]
struct Slot {
    conn: Option<Arc<Conn>>,
    /// No new attempt before this, after one failed.
    retry_at: Option<Instant>,
}

impl LinkClient {
    pub fn new(
        target: u64,
        addr: &str,
        runtime: tokio::runtime::Handle,
        connect_timeout: Duration,
        observer: Arc<dyn ReplyObserver>,
        tls: Option<Arc<PeerTls>>,
    ) -> LinkClient {
        LinkClient {
            target,
            addr: addr.to_string(),
            runtime,
            connect_timeout,
            observer,
            tls,
            next_id: AtomicU64::new(1),
            slot: Mutex::new(Slot::default()),
        }
    }

    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Closes the current connection (calls waiting on it fail); the next
    /// call makes a new one.
    pub fn reconnect(&self) {
        let old = self.slot.lock().expect("link lock").conn.take();
        if let Some(conn) = old {
            conn.close();
        }
    }

    /// The open connection, or a new one being made.
    fn conn(self: &Arc<Self>) -> Result<Arc<Conn>, LinkError> {
        let mut slot = self.slot.lock().expect("link lock");
        if let Some(conn) = &slot.conn
            && !conn.closed.load(Ordering::SeqCst)
        {
            return Ok(conn.clone());
        }
        if slot.retry_at.is_some_and(|at| Instant::now() < at) {
            return Err(LinkError::Unreachable { target: self.target, reason: "reconnecting".into() });
        }
        let (tx, rx) = mpsc::channel(QUEUE_DEPTH);
        let conn = Arc::new(Conn {
            queue: tx,
            waiting: Mutex::new(HashMap::new()),
            closed: AtomicBool::new(false),
            tasks: Mutex::new(Vec::new()),
        });
        let task = self.runtime.spawn(run_client(self.clone(), conn.clone(), rx));
        conn.tasks.lock().expect("link lock").push(task);
        slot.conn = Some(conn.clone());
        slot.retry_at = None;
        Ok(conn)
    }

    fn connect_failed(&self, conn: &Arc<Conn>) {
        let mut slot = self.slot.lock().expect("link lock");
        if slot.conn.as_ref().is_some_and(|c| Arc::ptr_eq(c, conn)) {
            slot.conn = None;
            slot.retry_at = Some(Instant::now() + RECONNECT_AFTER);
        }
    }

    /// Sends one request that wants no reply (id 0: the server answers
    /// nothing), for messages whose loss costs only a moment's margin
    /// (`quiet.rs`'s LIVENESS): half the frames of a call.
    pub fn send(
        self: &Arc<Self>,
        kind: pb::RaftRpcKind,
        from_node: u64,
        payload: Vec<u8>,
        sent_wall_ms: u64,
    ) -> Result<(), LinkError> {
        let conn = self.conn()?;
        let request = pb::RaftLinkRequest {
            id: NO_REPLY,
            kind: kind as i32,
            group_id: 0,
            from_node,
            payload: payload.into(),
            sent_at_ms: sent_wall_ms,
        };
        conn.queue.try_send(request).map_err(|e| self.refused(e))
    }

    /// Why the connection's queue refused a request, as the caller's error.
    fn refused(&self, e: mpsc::error::TrySendError<pb::RaftLinkRequest>) -> LinkError {
        let reason = match e {
            mpsc::error::TrySendError::Full(_) => "send queue full",
            mpsc::error::TrySendError::Closed(_) => "connection closed",
        };
        LinkError::Unreachable { target: self.target, reason: reason.into() }
    }

    /// Sends one request and waits up to `wait` for its reply.
    pub async fn call(
        self: &Arc<Self>,
        kind: pb::RaftRpcKind,
        group_id: u64,
        from_node: u64,
        payload: Vec<u8>,
        sent_wall_ms: u64,
        wait: Duration,
    ) -> Result<pb::RaftReply, LinkError> {
        let conn = self.conn()?;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (done, rx) = oneshot::channel();
        {
            // Checked under the lock `close` clears the map under: a
            // connection that closed between `conn()` and here (connect,
            // refusal and close can all happen while this thread is
            // descheduled) has no one left to answer or to drop the entry,
            // so the call would wait out all of `wait`.
            let mut waiting = conn.waiting.lock().expect("link lock");
            if conn.closed.load(Ordering::SeqCst) {
                return Err(LinkError::Unreachable { target: self.target, reason: "connection closed".into() });
            }
            waiting.insert(id, Waiting { done, sent: Instant::now(), sent_wall_ms, kind });
        }
        let request = pb::RaftLinkRequest {
            id,
            kind: kind as i32,
            group_id,
            from_node,
            payload: payload.into(),
            sent_at_ms: sent_wall_ms,
        };
        if let Err(e) = conn.queue.try_send(request) {
            conn.waiting.lock().expect("link lock").remove(&id);
            return Err(self.refused(e));
        }
        match tokio::time::timeout(wait, rx).await {
            Ok(Ok(reply)) => Ok(reply),
            Ok(Err(_)) => Err(LinkError::Unreachable { target: self.target, reason: "connection closed".into() }),
            // The entry stays: a late reply still measures the peer's clock,
            // and the sweep forgets it if none comes.
            Err(_) => Err(LinkError::TimedOut { target: self.target, waited: wait }),
        }
    }
}

/// Connects, then writes queued requests and reads replies until either
/// side fails.
async fn run_client(link: Arc<LinkClient>, conn: Arc<Conn>, queue: mpsc::Receiver<pb::RaftLinkRequest>) {
    let (read, mut write) = match tokio::time::timeout(link.connect_timeout, open(&link)).await {
        Ok(Ok(halves)) => halves,
        Ok(Err(e)) => {
            tracing::debug!(target = link.target, addr = %link.addr, error = %e, "raft link: connect failed");
            link.connect_failed(&conn);
            conn.close();
            return;
        }
        Err(_) => {
            tracing::debug!(target = link.target, addr = %link.addr, "raft link: connect timed out");
            link.connect_failed(&conn);
            conn.close();
            return;
        }
    };
    if write.write_all(PREFACE).await.is_err() {
        link.connect_failed(&conn);
        conn.close();
        return;
    }
    metrics::counter!("tocsin_raft_link_connects_total").increment(1);
    let reader = {
        let (link, conn) = (link.clone(), conn.clone());
        tokio::spawn(async move {
            let mut read = BufReader::with_capacity(64 << 10, read);
            while let Ok(Some(frame)) = read_frame(&mut read).await {
                for reply in frame.replies {
                    let Some(w) = conn.waiting.lock().expect("link lock").remove(&reply.id) else { continue };
                    let reply = reply.reply.unwrap_or_default();
                    link.observer.replied(link.target, w.sent_wall_ms, w.sent, w.kind, &reply);
                    let _ = w.done.send(reply);
                }
            }
            conn.close();
        })
    };
    conn.tasks.lock().expect("link lock").push(reader);
    if conn.closed.load(Ordering::SeqCst) {
        // Closed while connecting: the reader was not there to be aborted.
        conn.close();
    }
    let sweep_conn = conn.clone();
    let mut last_sweep = Instant::now();
    let forget_after = link.connect_timeout * 4;
    write_frames(
        &mut write,
        queue,
        |requests| pb::RaftLinkFrame { requests, replies: Vec::new() },
        || {
            if last_sweep.elapsed() >= SWEEP_EVERY {
                last_sweep = Instant::now();
                sweep_conn.sweep(forget_after);
            }
        },
    )
    .await;
    conn.close();
}

type ReadHalf = Box<dyn AsyncRead + Send + Unpin>;
type WriteHalf = Box<dyn AsyncWrite + Send + Unpin>;

/// Connects to the link's peer: TCP, then TLS for the peer's own name when
/// peer TLS is on.
async fn open(link: &LinkClient) -> io::Result<(ReadHalf, WriteHalf)> {
    let stream = TcpStream::connect(&link.addr).await?;
    let _ = stream.set_nodelay(true);
    Ok(match &link.tls {
        Some(tls) => {
            let (read, write) = tokio::io::split(tls.connect_link(stream, link.target).await?);
            (Box::new(read), Box::new(write))
        }
        None => {
            let (read, write) = stream.into_split();
            (Box::new(read), Box::new(write))
        }
    })
}

/// A message's share of a frame, for [`FRAME_SOFT_BYTES`].
trait FrameItem {
    fn size(&self) -> usize;
}

impl FrameItem for pb::RaftLinkRequest {
    fn size(&self) -> usize {
        self.payload.len() + 32
    }
}

impl FrameItem for pb::RaftLinkReply {
    fn size(&self) -> usize {
        self.reply.as_ref().map_or(0, |r| r.payload.len() + r.error.len()) + 32
    }
}

/// Writes what `queue` holds as frames, as many messages per frame as are
/// waiting, until the queue closes or a write fails.
async fn write_frames<T: FrameItem, W: AsyncWrite + Unpin>(
    write: &mut W,
    mut queue: mpsc::Receiver<T>,
    frame_of: impl Fn(Vec<T>) -> pb::RaftLinkFrame,
    mut after_write: impl FnMut(),
) {
    let mut buf = Vec::with_capacity(64 << 10);
    while let Some(first) = queue.recv().await {
        let mut bytes = first.size();
        let mut items = vec![first];
        let mut yielded = false;
        while items.len() < MAX_ITEMS_PER_FRAME && bytes < FRAME_SOFT_BYTES {
            match queue.try_recv() {
                Ok(item) => {
                    bytes += item.size();
                    items.push(item);
                }
                // The first message's sender woke this task, and tokio runs a
                // task just woken next (its LIFO slot), ahead of the other
                // groups' tasks that are about to queue theirs (a heartbeat
                // round, replies to a frame of requests): yield once, so
                // they do and share this frame. A lone message waits one
                // turn of the runtime.
                Err(_) if !yielded && items.len() == 1 => {
                    yielded = true;
                    tokio::task::yield_now().await;
                }
                Err(_) => break,
            }
        }
        metrics::histogram!("tocsin_raft_link_messages_per_frame").record(items.len() as f64);
        let frame = frame_of(items);
        buf.clear();
        tocsin_contract::link_frame::encode_frame(&frame, &mut buf);
        if write.write_all(&buf).await.is_err() {
            return;
        }
        if buf.capacity() > 1 << 20 {
            buf = Vec::with_capacity(64 << 10);
        }
        after_write();
    }
}

/// Answers one request (the transport service's side).
pub trait LinkHandler: Send + Sync + 'static {
    fn handle(&self, request: pb::RaftLinkRequest) -> impl std::future::Future<Output = pb::RaftReply> + Send;
}

/// Serves one accepted link connection whose preface is next on `read`:
/// each request is answered by its own task, replies are written as they
/// come. A request whose `from_node` is not a node `peer`'s certificate
/// names is answered with an error and not handled.
pub async fn serve<H: LinkHandler, R: AsyncRead + Send + Unpin, W: AsyncWrite + Send + Unpin + 'static>(
    read: R,
    mut write: W,
    peer: PeerConn,
    handler: Arc<H>,
) {
    let mut read = BufReader::with_capacity(64 << 10, read);
    let mut preface = [0u8; 8];
    if read.read_exact(&mut preface).await.is_err() || &preface != PREFACE {
        tracing::debug!("raft link: bad preface; closing");
        return;
    }
    let (tx, rx) = mpsc::channel::<pb::RaftLinkReply>(QUEUE_DEPTH);
    let writer = tokio::spawn(async move {
        write_frames(&mut write, rx, |replies| pb::RaftLinkFrame { requests: Vec::new(), replies }, || {}).await;
    });
    loop {
        match read_frame(&mut read).await {
            Ok(Some(frame)) => {
                for request in frame.requests {
                    let (handler, tx) = (handler.clone(), tx.clone());
                    if !peer.speaks_for(request.from_node) {
                        metrics::counter!("tocsin_peer_refused_total", "reason" => "from_node").increment(1);
                        tracing::warn!(
                            from_node = request.from_node,
                            certificate = ?peer.node_ids,
                            remote = ?peer.remote,
                            "raft link: a message's from_node is not the node its connection's certificate names; refused"
                        );
                        let reply = pb::RaftReply {
                            error: format!(
                                "from_node {} is not the node this connection's certificate names",
                                request.from_node
                            ),
                            ..Default::default()
                        };
                        let _ = tx.send(pb::RaftLinkReply { id: request.id, reply: Some(reply) }).await;
                        continue;
                    }
                    tokio::spawn(async move {
                        let id = request.id;
                        let reply = handler.handle(request).await;
                        if id != NO_REPLY {
                            let _ = tx.send(pb::RaftLinkReply { id, reply: Some(reply) }).await;
                        }
                    });
                }
            }
            Ok(None) => break,
            Err(e) => {
                tracing::debug!(error = %e, "raft link: read failed; closing");
                break;
            }
        }
    }
    // Requests still being answered keep their sender; the writer ends once
    // they are written or the peer is gone.
    drop(tx);
    let _ = writer.await;
}

/// Accepts connections on `listener` (on the current runtime): Raft links
/// are moved to `links` and served there with `handler`; every other
/// connection (HTTP/2 for gRPC) is passed on through the returned stream.
///
/// Plaintext: a link is told by its first byte, and gRPC connections stay
/// on the current runtime. With `tls`, every connection's handshake runs
/// on `links` (a link is told by ALPN only after it, and its socket must
/// be registered where it is served); a connection whose certificate does
/// not verify goes no further.
pub fn split_incoming<H: LinkHandler>(
    listener: TcpListener,
    handler: Arc<H>,
    links: tokio::runtime::Handle,
    tls: Option<Arc<PeerTls>>,
) -> tokio_stream::wrappers::ReceiverStream<io::Result<PeerIo>> {
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(async move {
        loop {
            let stream = match listener.accept().await {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors, say: wait rather than spin.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            if tx.is_closed() {
                return;
            }
            let (tx, handler, links) = (tx.clone(), handler.clone(), links.clone());
            match &tls {
                Some(tls) => {
                    let acceptor = tls.acceptor();
                    // Re-registered with the links' runtime, so its reads
                    // wake tasks there.
                    let Ok(std) = stream.into_std() else { continue };
                    links.spawn(async move {
                        let Ok(stream) = TcpStream::from_std(std) else { return };
                        let _ = stream.set_nodelay(true);
                        let remote = stream.peer_addr().ok();
                        let stream = match tokio::time::timeout(FIRST_BYTE_WITHIN, acceptor.accept(stream)).await {
                            Ok(Ok(stream)) => stream,
                            Ok(Err(e)) => {
                                metrics::counter!("tocsin_peer_refused_total", "reason" => "tls").increment(1);
                                tracing::warn!(?remote, error = %e, "peer port: TLS handshake failed; closing");
                                return;
                            }
                            Err(_) => return,
                        };
                        let peer = PeerConn::of_tls(remote, &stream);
                        // A certificate the CA signed that names no node (a
                        // client certificate from the same CA, `tocsin certs
                        // client`) has no business on the peer port, where
                        // forwarded requests skip token checks.
                        if peer.node_ids.as_ref().is_some_and(|ids| ids.is_empty()) {
                            metrics::counter!("tocsin_peer_refused_total", "reason" => "not_a_node").increment(1);
                            tracing::warn!(?remote, "peer port: the certificate names no node; closing");
                            return;
                        }
                        if stream.get_ref().1.alpn_protocol() == Some(crate::peer_tls::LINK_ALPN) {
                            let (read, write) = tokio::io::split(stream);
                            serve(read, write, peer, handler).await;
                        } else {
                            let _ = tx.send(Ok(PeerIo::Tls(Box::new(stream), peer))).await;
                        }
                    });
                }
                None => {
                    tokio::spawn(async move {
                        let mut first = [0u8; 1];
                        match tokio::time::timeout(FIRST_BYTE_WITHIN, stream.peek(&mut first)).await {
                            Ok(Ok(1)) if first[0] == PREFACE[0] => {
                                // Re-registered with the links' runtime, so its
                                // reads wake tasks there.
                                let Ok(std) = stream.into_std() else { return };
                                links.spawn(async move {
                                    if let Ok(stream) = TcpStream::from_std(std) {
                                        let _ = stream.set_nodelay(true);
                                        let peer = PeerConn { remote: stream.peer_addr().ok(), node_ids: None };
                                        let (read, write) = stream.into_split();
                                        serve(read, write, peer, handler).await;
                                    }
                                });
                            }
                            Ok(Ok(1)) => {
                                let _ = stream.set_nodelay(true);
                                let _ = tx.send(Ok(PeerIo::Plain(stream))).await;
                            }
                            _ => {}
                        }
                    });
                }
            }
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

#[cfg(test)]
mod tests {
    use rustls::pki_types::pem::PemObject as _;

    use super::*;

    struct Echo;

    impl LinkHandler for Echo {
        async fn handle(&self, request: pb::RaftLinkRequest) -> pb::RaftReply {
            // Votes wait: replies come back out of order.
            if request.kind == pb::RaftRpcKind::Vote as i32 {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            pb::RaftReply { payload: request.payload, replied_at_ms: request.id, ..Default::default() }
        }
    }

    #[derive(Default)]
    struct Seen(AtomicU64);

    impl ReplyObserver for Seen {
        fn replied(&self, _: u64, _: u64, _: Instant, _: pb::RaftRpcKind, _: &pb::RaftReply) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    async fn server() -> (String, JoinHandle<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let mut rest = split_incoming(listener, Arc::new(Echo), tokio::runtime::Handle::current(), None);
        // Anything that is not a link comes out here.
        let passed = tokio::spawn(async move {
            use tokio_stream::StreamExt as _;
            while let Some(Ok(mut s)) = rest.next().await {
                let _ = s.write_all(b"not a link").await;
            }
        });
        (addr, passed)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn many_calls_share_one_connection_and_replies_find_their_callers() {
        let (addr, _server) = server().await;
        let seen = Arc::new(Seen::default());
        let link = Arc::new(LinkClient::new(
            2,
            &addr,
            tokio::runtime::Handle::current(),
            Duration::from_secs(1),
            seen.clone(),
            None,
        ));
        let calls = (0..500u32).map(|i| {
            let link = link.clone();
            async move {
                let kind = if i % 10 == 0 { pb::RaftRpcKind::Vote } else { pb::RaftRpcKind::AppendEntries };
                let reply =
                    link.call(kind, 7, 1, i.to_be_bytes().to_vec(), 0, Duration::from_secs(5)).await.expect("reply");
                assert_eq!(reply.payload.as_ref(), i.to_be_bytes(), "call {i} got another call's reply");
            }
        });
        futures::future::join_all(calls).await;
        assert_eq!(seen.0.load(Ordering::Relaxed), 500);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_closed_peer_fails_calls_at_once_and_a_new_one_is_reached() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        drop(listener);
        let link = Arc::new(LinkClient::new(
            2,
            &addr,
            tokio::runtime::Handle::current(),
            Duration::from_secs(1),
            Arc::new(Seen::default()),
            None,
        ));
        let started = Instant::now();
        let err = link.call(pb::RaftRpcKind::Vote, 1, 1, vec![], 0, Duration::from_secs(5)).await.unwrap_err();
        assert!(matches!(err, LinkError::Unreachable { .. }), "{err}");
        assert!(started.elapsed() < Duration::from_secs(1), "a refused connection took {:?}", started.elapsed());
        // Within the back-off, calls fail without another attempt.
        let err = link.call(pb::RaftRpcKind::Vote, 1, 1, vec![], 0, Duration::from_secs(5)).await.unwrap_err();
        assert!(err.to_string().contains("reconnecting"), "{err}");
        // Once a server listens there, the link reaches it.
        let listener = TcpListener::bind(&addr).await.unwrap();
        let _rest = split_incoming(listener, Arc::new(Echo), tokio::runtime::Handle::current(), None);
        tokio::time::sleep(RECONNECT_AFTER).await;
        let reply = link.call(pb::RaftRpcKind::AppendEntries, 1, 1, vec![9], 0, Duration::from_secs(5)).await.unwrap();
        assert_eq!(reply.payload.as_ref(), [9]);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn other_connections_pass_through_and_bad_frames_close_the_link() {
        let (addr, _server) = server().await;
        // An HTTP/2 client's preface starts with 'P': passed on.
        let mut s = TcpStream::connect(&addr).await.unwrap();
        s.write_all(b"PRI * HTTP/2.0\r\n").await.unwrap();
        let mut got = [0u8; 10];
        s.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"not a link");
        // A link announcing a frame larger than the limit is closed.
        let mut s = TcpStream::connect(&addr).await.unwrap();
        s.write_all(PREFACE).await.unwrap();
        s.write_all(&((MAX_FRAME_BYTES as u32) + 1).to_be_bytes()).await.unwrap();
        let mut rest = Vec::new();
        let n = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut rest)).await.unwrap().unwrap_or(0);
        assert_eq!(n, 0, "the server answered a bad frame");
    }

    /// A cluster CA, and node certificates from it (or from another CA) in
    /// a directory, as `tocsin certs` writes them.
    struct Pki {
        dir: tempfile::TempDir,
        ca: crate::peer_tls::Issued,
    }

    impl Pki {
        fn new() -> Pki {
            let dir = tempfile::tempdir().unwrap();
            let ca = crate::peer_tls::new_ca("test cluster CA", 30).unwrap();
            std::fs::write(dir.path().join("ca.pem"), &ca.cert_pem).unwrap();
            Pki { dir, ca }
        }

        /// Node `id`'s files, its certificate signed by `ca`.
        fn files(&self, id: u64, ca: &crate::peer_tls::Issued) -> crate::config::PeerTlsFiles {
            let issued = crate::peer_tls::issue_node(ca, id, &[], 30).unwrap();
            let cert = self.dir.path().join(format!("node-{id}-{}.pem", rand::random::<u32>()));
            let key = cert.with_extension("key");
            std::fs::write(&cert, issued.cert_pem).unwrap();
            std::fs::write(&key, issued.key_pem).unwrap();
            crate::config::PeerTlsFiles { ca: self.dir.path().join("ca.pem"), cert, key }
        }

        fn node(&self, id: u64) -> Arc<PeerTls> {
            PeerTls::load(&self.files(id, &self.ca), id).unwrap()
        }
    }

    async fn tls_server(tls: Arc<PeerTls>) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let rest = split_incoming(listener, Arc::new(Echo), tokio::runtime::Handle::current(), Some(tls));
        tokio::spawn(async move {
            let _keep = rest;
            std::future::pending::<()>().await
        });
        addr
    }

    fn tls_link(addr: &str, target: u64, tls: Option<Arc<PeerTls>>) -> Arc<LinkClient> {
        let current = tokio::runtime::Handle::current();
        Arc::new(LinkClient::new(target, addr, current, Duration::from_secs(2), Arc::new(Seen::default()), tls))
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn with_tls_a_link_carries_only_messages_from_the_node_its_certificate_names() {
        let pki = Pki::new();
        let addr = tls_server(pki.node(1)).await;
        let link = tls_link(&addr, 1, Some(pki.node(2)));
        let kind = pb::RaftRpcKind::AppendEntries;
        let reply = link.call(kind, 7, 2, vec![42], 0, Duration::from_secs(5)).await.expect("a reply");
        assert_eq!(reply.payload.as_ref(), [42]);
        assert!(reply.error.is_empty(), "{}", reply.error);
        // Node 2's certificate cannot speak for node 3.
        let forged = link.call(kind, 7, 3, vec![43], 0, Duration::from_secs(5)).await.expect("a reply");
        assert!(forged.payload.is_empty(), "a forged message was handled");
        assert!(forged.error.contains("from_node 3 is not the node"), "{}", forged.error);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_peer_port_with_tls_refuses_plaintext_foreign_certificates_and_the_wrong_node() {
        let pki = Pki::new();
        let addr = tls_server(pki.node(1)).await;
        let call = |link: Arc<LinkClient>| async move {
            link.call(pb::RaftRpcKind::Vote, 7, 2, vec![1], 0, Duration::from_secs(5)).await
        };
        // No TLS at all.
        let err = call(tls_link(&addr, 1, None)).await.expect_err("a plaintext link was answered");
        assert!(matches!(err, LinkError::Unreachable { .. }), "{err}");
        // The right node certificate, but dialing node 3: the server is
        // node 1, so the client refuses it.
        let err = call(tls_link(&addr, 3, Some(pki.node(2)))).await.expect_err("the wrong node was accepted");
        assert!(matches!(err, LinkError::Unreachable { .. }), "{err}");
        // A certificate from another CA, presented by a client that trusts
        // the cluster's CA: the server refuses it in the handshake.
        let foreign_ca = crate::peer_tls::new_ca("another CA", 30).unwrap();
        let foreign = pki.files(2, &foreign_ca);
        assert!(
            matches!(PeerTls::load(&foreign, 2), Err(crate::peer_tls::PeerTlsError::NotFromCa { .. })),
            "a node certificate from another CA was loaded"
        );
        let mut roots = rustls::RootCertStore::empty();
        roots.add(rustls::pki_types::CertificateDer::from_pem_file(&foreign.ca).unwrap()).unwrap();
        let chain = vec![rustls::pki_types::CertificateDer::from_pem_file(&foreign.cert).unwrap()];
        let key = rustls::pki_types::PrivateKeyDer::from_pem_file(&foreign.key).unwrap();
        let mut config =
            rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_root_certificates(roots)
                .with_client_auth_cert(chain, key)
                .unwrap();
        config.alpn_protocols = vec![crate::peer_tls::LINK_ALPN.to_vec()];
        let tcp = TcpStream::connect(&addr).await.unwrap();
        let name = rustls::pki_types::ServerName::try_from(crate::peer_tls::node_name(1)).unwrap();
        let answered = async {
            let mut s = tokio_rustls::TlsConnector::from(Arc::new(config)).connect(name, tcp).await?;
            s.write_all(PREFACE).await?;
            let request =
                pb::RaftLinkRequest { id: 1, kind: pb::RaftRpcKind::Vote as i32, from_node: 2, ..Default::default() };
            let mut buf = Vec::new();
            tocsin_contract::link_frame::encode_frame(
                &pb::RaftLinkFrame { requests: vec![request], replies: Vec::new() },
                &mut buf,
            );
            s.write_all(&buf).await?;
            let mut reader = BufReader::new(s);
            read_frame(&mut reader).await
        };
        let outcome =
            tokio::time::timeout(Duration::from_secs(5), answered).await.expect("the server answered in time");
        assert!(!matches!(outcome, Ok(Some(_))), "a foreign certificate's message was answered: {outcome:?}");
        // A node certificate for another node id is refused at load.
        let other = pki.files(5, &pki.ca);
        assert!(matches!(PeerTls::load(&other, 4), Err(crate::peer_tls::PeerTlsError::NotThisNode { .. })));
    }
}
