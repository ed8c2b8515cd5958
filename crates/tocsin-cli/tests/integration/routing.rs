//! The shard-aware client sends each request to its shard's leader. When
//! its cached leader is stale, the node it asks forwards the request and
//! says who answered; the client routes there from then on instead of
//! paying the extra hop on every request.

use std::time::Duration;

use tocsin_client::Client;
use tocsin_client::ClientOptions;

use crate::support::NodeProcess;

/// `tocsin_forwarded_requests_total` of the node whose HTTP API is `http`.
async fn forwarded(http: &str) -> u64 {
    let body = crate::support::metrics_text(http).await;
    body.lines()
        .find_map(|l| l.strip_prefix("tocsin_forwarded_requests_total ")?.trim().parse::<f64>().ok())
        .map_or(0, |v| v as u64)
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
