//! A node's wall clock jumps (issue 10's finding 9): +30 s on a shard
//! leader, then −10 min on a leader. Through the test-only offset file
//! (`TOCSIN_TEST_CLOCK_OFFSET_FILE`), on real processes: the jump forward
//! fires nothing early, the jump back holds nothing back, and the node whose
//! clock is off hands its leaderships over until it agrees again.

use std::collections::HashMap;
use std::time::Duration;

use tocsin_client::Client;
use tocsin_client::ClientOptions;
use tocsin_client::v1 as pb;

use crate::support::NodeProcess;
use crate::support::Receiver;
use crate::support::now_ms;
use crate::support::percentiles;

/// Shards `node` leads, by the cluster's own report.
async fn led_by(client: &Client, node: u64) -> Vec<u32> {
    let map = client.shard_map().await.unwrap();
    map.shards.iter().filter(|s| s.leader == node).map(|s| s.shard).collect()
}

async fn wait_until_leads_none(client: &Client, node: u64, timeout: Duration) -> Option<u64> {
    let started = now_ms();
    while now_ms() < started + timeout.as_millis() as u64 {
        if led_by(client, node).await.is_empty() {
            return Some(now_ms() - started);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_jumping_clock_fires_nothing_early_and_holds_nothing_back() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start().await;
    let offsets: Vec<std::path::PathBuf> = (1..=3).map(|i| dir.path().join(format!("clock-offset-{i}"))).collect();
    for f in &offsets {
        std::fs::write(f, "0").unwrap();
    }
    let nodes = NodeProcess::start_three(dir.path(), |i| {
        vec![("TOCSIN_TEST_CLOCK_OFFSET_FILE".into(), offsets[i].display().to_string())]
    });
    let options = ClientOptions { request_timeout: Duration::from_secs(2), max_attempts: 30, ..Default::default() };
    let client = Client::with_options(nodes.iter().map(|n| n.grpc.clone()), options).await.unwrap();
    // Let the peers measure each other.
    tokio::time::sleep(Duration::from_secs(2)).await;

    // Timers due every 50 ms over the next 30 s, on every shard.
    let base = now_ms() + 1_000;
    let mut want: HashMap<String, u64> = HashMap::new();
    for chunk in (0..600).collect::<Vec<u64>>().chunks(200) {
        let reqs: Vec<pb::CreateTimerRequest> = chunk
            .iter()
            .map(|i| {
                let at = base + i * 50;
                want.insert(format!("c-{i}"), at);
                let mut r = tocsin_client::webhook_timer("clock", &format!("c-{i}"), 0, &receiver.url);
                r.fire_time = Some(pb::create_timer_request::FireTime::FireAtMs(at));
                r
            })
            .collect();
        assert!(client.create_timers(reqs).await.iter().all(Result::is_ok));
    }

    // Phase: the leader of shard 0 jumps 30 s ahead. It must fire nothing
    // early and hand every leadership over.
    let map = client.shard_map().await.unwrap();
    let ahead = map.shards[0].leader;
    assert_ne!(ahead, 0);
    let forward_at = now_ms();
    std::fs::write(&offsets[ahead as usize - 1], "30000").unwrap();
    let handed_over_ms = wait_until_leads_none(&client, ahead, Duration::from_secs(5)).await;
    println!("+30 s on node {ahead}: led nothing {handed_over_ms:?} ms later");
    assert!(handed_over_ms.is_some(), "node {ahead} still leads {:?}", led_by(&client, ahead).await);
    tokio::time::sleep(Duration::from_secs(4)).await;
    // While off, it takes no leadership back (it does not campaign).
    assert!(led_by(&client, ahead).await.is_empty());
    std::fs::write(&offsets[ahead as usize - 1], "0").unwrap();

    // Phase: once it agrees again it may lead again; then the leader of shard
    // 1 jumps 10 min back: nothing due meanwhile may be held back.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let behind = client.shard_map().await.unwrap().shards[1].leader;
    let back_at = now_ms();
    std::fs::write(&offsets[behind as usize - 1], "-600000").unwrap();
    let handed_over_ms = wait_until_leads_none(&client, behind, Duration::from_secs(5)).await;
    println!("-10 min on node {behind}: led nothing {handed_over_ms:?} ms later");
    assert!(handed_over_ms.is_some(), "node {behind} still leads {:?}", led_by(&client, behind).await);
    tokio::time::sleep(Duration::from_secs(3)).await;
    std::fs::write(&offsets[behind as usize - 1], "0").unwrap();

    // Phase: everything delivered; none early; none late by a second.
    let deadline = now_ms() + 40_000;
    while now_ms() < deadline && receiver.delivered().len() < want.len() {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let seen = receiver.delivered();
    let missing: Vec<&String> = want.keys().filter(|id| !seen.contains_key(*id)).collect();
    assert!(missing.is_empty(), "{} never delivered, e.g. {:?}", missing.len(), &missing[..missing.len().min(5)]);
    let early: Vec<(&String, u64)> = want
        .iter()
        .filter_map(|(id, at)| {
            let first = seen[id].iter().map(|s| s.recv_ms).min().unwrap();
            (first < *at).then(|| (id, at - first))
        })
        .collect();
    assert!(early.is_empty(), "delivered early (id, ms early): {early:?}");
    let window_lateness = |from: u64, to: u64| -> Vec<u64> {
        want.iter()
            .filter(|(_, at)| **at >= from && **at <= to)
            .map(|(id, at)| seen[id].iter().map(|s| s.recv_ms).min().unwrap().saturating_sub(*at))
            .collect()
    };
    let forward = window_lateness(forward_at, forward_at + 6_000);
    let back = window_lateness(back_at, back_at + 6_000);
    println!("lateness, +30 s window: {}", percentiles(forward.clone()));
    println!("lateness, -10 min window: {}", percentiles(back.clone()));
    for (name, mut v) in [("+30 s", forward), ("-10 min", back)] {
        v.sort_unstable();
        let p99 = v[(v.len() - 1) * 99 / 100];
        assert!(p99 < 1_000, "{name} window: lateness p99 {p99} ms");
    }
}
