//! Webhook delivery across a kill -9: 10,000 timers due 2–10 s ahead, 20%
//! cancelled, the node killed mid-way and restarted. Every timer whose create
//! was acknowledged and which was not cancelled is delivered; no timer whose
//! cancel answered CANCELLED is delivered; none arrives early.

use std::collections::HashMap;
use std::time::Duration;

use tocsin_client::Client;
use tocsin_client::ClientOptions;
use tocsin_client::v1 as pb;

use crate::support::DueWindow;
use crate::support::Fate;
use crate::support::NodeProcess;
use crate::support::Receiver;
use crate::support::create_and_cancel_fifth;
use crate::support::now_ms;
use crate::support::percentiles;

const TOTAL: usize = 10_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn webhook_timers_survive_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start().await;
    let mut node = NodeProcess::start(dir.path(), &[]);
    let options = ClientOptions { request_timeout: Duration::from_secs(3), max_attempts: 20, ..Default::default() };
    let client = Client::with_options([node.grpc.clone()], options).await.unwrap();

    // Phase: create 10,000 timers due 2-10 s from now, in batches, and cancel
    // every fifth; the node is killed while this is going on.
    let base = now_ms();
    let window = DueWindow { base_ms: base, from_ms: 2_000, span_ms: 8_000, total: TOTAL };
    let mut fates: HashMap<String, (Fate, u64)> = HashMap::new();
    let reqs: Vec<pb::CreateTimerRequest> = (0..TOTAL)
        .map(|i| {
            let mut r = tocsin_client::webhook_timer("e2e", &format!("t-{i}"), 0, &receiver.url);
            r.fire_time = Some(pb::create_timer_request::FireTime::FireAtMs(window.fire_at(i)));
            r
        })
        .collect();
    let fates_list = create_and_cancel_fifth(&client, reqs).await;
    let created_in_ms = now_ms() - base;
    println!("created and cancelled in {created_in_ms} ms");
    window.kill_point().await;
    node.kill9();
    let killed_at = now_ms();
    tokio::time::sleep(Duration::from_secs(1)).await;
    node.restart();
    let restarted_at = now_ms();
    for (id, fate, fire_at) in fates_list {
        fates.insert(id, (fate, fire_at));
    }

    // Phase: wait for every timer that must fire.
    let must: Vec<&String> = fates.iter().filter(|(_, (f, _))| *f == Fate::MustFire).map(|(id, _)| id).collect();
    let deadline = now_ms() + 30_000;
    loop {
        let delivered = receiver.delivered();
        if must.iter().all(|id| delivered.contains_key(*id)) || now_ms() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Give late (wrong) deliveries of cancelled timers a chance to show up.
    tokio::time::sleep(Duration::from_secs(1)).await;

    // Phase: check.
    let delivered = receiver.delivered();
    let lost: Vec<&&String> = must.iter().filter(|id| !delivered.contains_key(**id)).collect();
    let cancelled_but_delivered: Vec<&String> = fates
        .iter()
        .filter(|(id, (f, _))| *f == Fate::Cancelled && delivered.contains_key(*id))
        .map(|(id, _)| id)
        .collect();
    let mut early = Vec::new();
    let mut lateness = Vec::new();
    let mut outage_lateness = Vec::new();
    let mut duplicates = 0;
    for (id, seen) in &delivered {
        duplicates += seen.len() - 1;
        // Redeliveries are the same firing (same fire_id), later attempts, and
        // never under an older epoch than an earlier delivery.
        assert!(seen.iter().all(|s| s.fire_id == seen[0].fire_id), "{id}: {seen:?}");
        let mut by_time = seen.clone();
        by_time.sort_by_key(|s| s.recv_ms);
        assert!(by_time.windows(2).all(|w| w[1].epoch >= w[0].epoch && w[1].attempt > w[0].attempt), "{id}: {seen:?}");
        let first = seen.iter().map(|s| s.recv_ms).min().unwrap();
        let fire_at = seen[0].fire_at_ms;
        if seen.iter().any(|s| s.recv_ms < s.fire_at_ms) {
            early.push(id.clone());
        }
        lateness.push(first.saturating_sub(fire_at));
        if fire_at >= killed_at.saturating_sub(500) && fire_at <= restarted_at {
            outage_lateness.push(first.saturating_sub(fire_at.max(restarted_at)));
        }
    }
    let counts = |f: Fate| fates.values().filter(|(x, _)| *x == f).count();
    println!(
        "timers {TOTAL}: must fire {}, cancelled {}, unknown {}; delivered {} ({duplicates} duplicate deliveries)",
        counts(Fate::MustFire),
        counts(Fate::Cancelled),
        counts(Fate::Unknown),
        delivered.len()
    );
    println!("lateness over the run: {}", percentiles(lateness));
    println!("lateness after restart for timers due during the outage: {}", percentiles(outage_lateness));
    assert!(
        lost.is_empty(),
        "{} acknowledged timers never delivered, e.g. {:?}\n{}",
        lost.len(),
        &lost[..lost.len().min(5)],
        node.log()
    );
    assert!(cancelled_but_delivered.is_empty(), "cancelled yet delivered: {cancelled_but_delivered:?}");
    assert!(early.is_empty(), "delivered early: {early:?}");
    assert!(counts(Fate::Cancelled) >= TOTAL / 5 / 2, "most cancels should succeed");
    assert!(counts(Fate::MustFire) >= TOTAL / 2);
}
