//! The shard-aware client sends each request to its shard's leader. When
//! its cached leader is stale, the node it asks forwards the request and
//! says who answered; the client routes there from then on instead of
//! paying the extra hop on every request. A connection to a node that went
//! silent is found by a ping and replaced, not waited on.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering;
use std::time::Duration;
use std::time::Instant;

use tokio::io::AsyncReadExt;
use tokio::io::AsyncWriteExt;

use tocsin_client::Client;
use tocsin_client::ClientOptions;

use crate::support::NodeProcess;

/// `tocsin_forwarded_requests_total` of the node whose HTTP API is `http`.
async fn forwarded(http: &str) -> u64 {
    crate::support::metric_value(http, "tocsin_forwarded_requests_total").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_forwarded_request_teaches_the_client_the_leader() {
    let dir = tempfile::tempdir().unwrap();
    let nodes = NodeProcess::start_three(dir.path(), |_| Vec::new());
    let seeds: Vec<String> = nodes.iter().map(|n| n.grpc.clone()).collect();
    let options = ClientOptions { request_timeout: Duration::from_secs(2), max_attempts: 30, ..Default::default() };
    let client = Client::with_options(seeds.clone(), options.clone()).await.unwrap();
    let mut old = 0;
    for _ in 0..100 {
        old = client.refresh().await.unwrap().shards[0].leader;
        if old != 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_ne!(old, 0, "shard 0 has no leader");

    // Another client moves shard 0's leadership; this one still routes to
    // the old leader.
    let new = if old == 1 { 2 } else { 1 };
    let admin = Client::with_options(seeds, options).await.unwrap();
    assert_eq!(admin.transfer_leader(0, new).await.unwrap(), new, "the transfer did not settle");
    let old_http = nodes[old as usize - 1].http.clone();
    let before = forwarded(&old_http).await;

    let ids: Vec<String> =
        (0..10_000).map(|i| format!("t-{i}")).filter(|id| client.shard_of("route", id) == 0).take(20).collect();
    for id in &ids {
        let req = tocsin_client::pull_timer("route", id, tocsin_node::clock::system_now_ms() + 3_600_000, "nowhere");
        client.create_timer(req).await.unwrap();
    }
    let after = forwarded(&old_http).await;
    assert_eq!(
        after - before,
        1,
        "node {old} forwarded {} of {} creates after shard 0 moved to node {new}",
        after - before,
        ids.len()
    );
}

/// A TCP relay to a node whose open connections can all go silent at once:
/// from then on nothing moves on them either way and both ends stay open,
/// as across a network cut that no reset crosses (the kernel of the silent
/// side still acknowledges the bytes, so only the application can tell).
/// Connections opened afterwards relay normally.
struct SilencingRelay {
    /// Bumped by `silence`; a connection relays while it holds its value.
    epoch: Arc<AtomicU64>,
    accepted: Arc<AtomicU64>,
}

impl SilencingRelay {
    fn run(listener: tokio::net::TcpListener, target: String) -> SilencingRelay {
        let relay = SilencingRelay { epoch: Arc::new(AtomicU64::new(0)), accepted: Arc::new(AtomicU64::new(0)) };
        let (epoch, accepted) = (relay.epoch.clone(), relay.accepted.clone());
        tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                accepted.fetch_add(1, Ordering::SeqCst);
                let Ok(outbound) = tokio::net::TcpStream::connect(&target).await else { continue };
                let born = epoch.load(Ordering::SeqCst);
                let (in_read, in_write) = inbound.into_split();
                let (out_read, out_write) = outbound.into_split();
                tokio::spawn(Self::pipe(in_read, out_write, epoch.clone(), born));
                tokio::spawn(Self::pipe(out_read, in_write, epoch.clone(), born));
            }
        });
        relay
    }

    async fn pipe(
        mut from: tokio::net::tcp::OwnedReadHalf,
        mut to: tokio::net::tcp::OwnedWriteHalf,
        epoch: Arc<AtomicU64>,
        born: u64,
    ) {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let n = match from.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            if epoch.load(Ordering::SeqCst) != born {
                // Hold both halves open and move nothing, for good.
                let _held = (from, to);
                return std::future::pending().await;
            }
            if to.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    }

    fn silence(&self) {
        self.epoch.fetch_add(1, Ordering::SeqCst);
    }

    fn accepted(&self) -> u64 {
        self.accepted.load(Ordering::SeqCst)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_connection_gone_silent_is_closed_by_a_ping_and_the_call_retried_on_a_new_one() {
    let dir = tempfile::tempdir().unwrap();
    // The node advertises the relay's address, so the client reaches it
    // only through the relay, for the map and for every call.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let relay_addr = listener.local_addr().unwrap().to_string();
    let node = NodeProcess::start_with_args(dir.path(), &["--advertise-grpc", &relay_addr], &[]);
    let relay = SilencingRelay::run(listener, node.grpc.clone());
    // Far longer than the test waits: an attempt that sat out its deadline
    // on the silent connection fails the test. The pings are the defaults.
    let options = ClientOptions { request_timeout: Duration::from_secs(120), ..Default::default() };
    let ping_interval = options.ping_interval.expect("the client pings by default");
    let client = Client::with_options([relay_addr.clone()], options).await.unwrap();
    crate::support::wait_for("every shard's leader in the map", Duration::from_secs(10), async || {
        client.refresh().await.is_ok_and(|m| m.shards.iter().all(|s| s.leader != 0))
    })
    .await;
    let fire_at_ms = crate::support::now_ms() + 3_600_000;

    // Phase: a create through the relay, on the connection the map came by.
    client.create_timer(tocsin_client::pull_timer("silent", "before", fire_at_ms, "jobs")).await.unwrap();
    let connections = relay.accepted();

    // Phase: that connection goes silent; the next create is sent on it,
    // waits for the ping to go unanswered, and is retried on a new one.
    relay.silence();
    let started = Instant::now();
    let create = client.create_timer(tocsin_client::pull_timer("silent", "after", fire_at_ms, "jobs"));
    let got = tokio::time::timeout(Duration::from_secs(60), create).await;
    let took = started.elapsed();
    let got = got.unwrap_or_else(|_| panic!("the create still waited on the silent connection after {took:?}"));
    let created = got.unwrap_or_else(|e| panic!("the create failed after {took:?}: {e}"));
    assert!(created.created, "the retried create made the timer");
    println!("a create sent on a silent connection answered after {} ms", took.as_millis());
    assert!(
        took >= ping_interval,
        "answered after {took:?}, before any ping could have gone unanswered: the call did not go on the silent connection"
    );
    assert!(
        took < Duration::from_secs(20),
        "answered after {took:?}: pings every {ping_interval:?} should find the silence far sooner"
    );
    assert!(relay.accepted() > connections, "the retry did not open a new connection");

    // Phase: both timers are there, read on the new connection.
    for id in ["before", "after"] {
        assert_eq!(client.get_timer("silent", id).await.unwrap().fire_at_ms, fire_at_ms, "timer {id}");
    }
}
