//! Armed fires (`tocsin_core::arm`) against a commit slower than the lead:
//! a timer's `Fire` is proposed ahead of its time, the store's writer
//! stalls (the `store::writer` fault point) so that the `Fire` is applied
//! only after the timer's time, and a cancel stamped before that time sits
//! behind it in the log. The cancel answers CANCELLED (the attempt had not
//! started when it was stamped), so the leader must not have sent it: it
//! holds even an attempt whose start has passed until no cancel stamped
//! before the start is on its way, and reads the applied log first.
//!
//! In linear phases, repeated until the race was staged (a cancel answered
//! CANCELLED after the timers' time) at least once: the fault point is
//! process-wide and this binary's other tests may take the stall.

use std::collections::BTreeMap;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;

use tocsin_proto::v1 as pb;

use crate::cluster::Cluster;
use crate::cluster::now_ms;

const SHARDS: u32 = 4;
const TIMERS: usize = 80;

/// A webhook receiver on loopback: every delivery's id and arrival time.
async fn receiver() -> (String, Arc<Mutex<Vec<(String, u64)>>>) {
    let seen: Arc<Mutex<Vec<(String, u64)>>> = Arc::default();
    let log = seen.clone();
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |body: axum::body::Bytes| {
            let log = log.clone();
            async move {
                let at = now_ms();
                let json: serde_json::Value = serde_json::from_slice(&body).expect("a JSON delivery");
                let id = json["id"].as_str().expect("the delivery names its timer").to_string();
                log.lock().unwrap().push((id, at));
                "ok"
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, seen)
}

fn webhook_create(id: &str, fire_at_ms: u64, url: &str) -> pb::CreateTimerRequest {
    pb::CreateTimerRequest {
        namespace: "armed".into(),
        id: id.into(),
        fire_time: Some(pb::create_timer_request::FireTime::FireAtMs(fire_at_ms)),
        callback: Some(pb::Callback { target: Some(pb::callback::Target::Webhook(pb::Webhook { url: url.into() })) }),
        ..Default::default()
    }
}

/// The armed-fire settings both tests use: timers armed 300-250 ms ahead.
fn armed_config(config: &mut tocsin_node::NodeConfig) {
    config.firing.arm_ahead_ms = 300;
    config.firing.arm_step_ms = 50;
}

/// Creates `timers` in one batch, sending again the items refused with
/// UNAVAILABLE or RESOURCE_EXHAUSTED after their retry hint, as the client
/// library does, for up to 5 s; panics on any other refusal.
async fn create_all(
    client: &pb::timer_service_client::TimerServiceClient<tonic::transport::Channel>,
    mut timers: Vec<pb::CreateTimerRequest>,
) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let created = client
            .clone()
            .create_timers(pb::CreateTimersRequest { timers: timers.clone() })
            .await
            .expect("creates")
            .into_inner();
        assert_eq!(created.results.len(), timers.len(), "one result per item");
        let mut again = Vec::new();
        let mut wait_ms = 0;
        for (result, timer) in created.results.into_iter().zip(timers) {
            match result.result {
                Some(pb::create_timer_result::Result::Ok(_)) => {}
                Some(pb::create_timer_result::Result::Error(e))
                    if (e.code == "UNAVAILABLE" || e.code == "RESOURCE_EXHAUSTED")
                        && tokio::time::Instant::now() < deadline =>
                {
                    eprintln!("create {}: {} {} (retrying)", timer.id, e.code, e.message);
                    wait_ms = wait_ms.max(e.retry_after_ms.clamp(10, 1_000));
                    again.push(timer);
                }
                other => panic!("create {}: {other:?}", timer.id),
            }
        }
        if again.is_empty() {
            return;
        }
        timers = again;
        tokio::time::sleep(Duration::from_millis(wait_ms)).await;
    }
}

async fn sleep_until_ms(at_ms: u64) {
    tokio::time::sleep(Duration::from_millis(at_ms.saturating_sub(now_ms()))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cancel_stamped_before_a_late_armed_fire_wins_and_nothing_is_sent() {
    let cluster = Cluster::start(1, SHARDS, |_, config| armed_config(config)).await;
    let (url, seen) = receiver().await;
    let client = cluster.timers(0).await;
    let mut staged = 0usize;
    for round in 0..4 {
        // Phase: timers due together, far enough ahead to arm them later.
        let fire_at = now_ms() + 1_500;
        let ids: Vec<String> = (0..TIMERS).map(|i| format!("r{round}-{i}")).collect();
        create_all(&client, ids.iter().map(|id| webhook_create(id, fire_at, &url)).collect()).await;
        if now_ms() + 400 > fire_at {
            // The stall must start before the arming; the creates took too
            // long for this round to stage anything.
            eprintln!("round {round}: the creates were answered too late to stage the race; next round");
            wait_for_live(&seen, &ids.iter().collect(), round).await;
            continue;
        }

        // Phase: just before the arming (300-250 ms ahead) the writer stalls
        // for 600 ms: the `Fire`s are applied only after the timers' time.
        sleep_until_ms(fire_at - 330).await;
        fail::cfg("store::writer", "1*return(delay:600)").unwrap();

        // Phase: 100 ms before their time half the timers are cancelled; the
        // first cancels of each shard are stamped then, and wait behind the
        // stalled `Fire`s.
        sleep_until_ms(fire_at - 100).await;
        let cancels = ids.iter().step_by(2).map(|id| {
            let mut c = client.clone();
            let req = pb::CancelTimerRequest { namespace: "armed".into(), id: id.clone() };
            async move { (c.cancel_timer(req).await.expect("cancel answers").into_inner(), now_ms()) }
        });
        let answers = futures::future::join_all(cancels).await;
        fail::remove("store::writer");
        let mut cancelled = BTreeSet::new();
        let mut cancelled_while_firing = BTreeSet::new();
        for ((resp, acked_at), id) in answers.iter().zip(ids.iter().step_by(2)) {
            match pb::cancel_timer_response::Outcome::try_from(resp.outcome).unwrap() {
                pb::cancel_timer_response::Outcome::Cancelled => {
                    cancelled.insert(id.clone());
                    if *acked_at > fire_at {
                        staged += 1;
                    }
                }
                pb::cancel_timer_response::Outcome::CancelledWhileFiring => {
                    cancelled_while_firing.insert(id.clone());
                }
                other => panic!("{id}: cancel answered {other:?}"),
            }
        }

        // Phase: every timer not cancelled is delivered, none early; none
        // whose cancel answered CANCELLED ever is.
        let must: BTreeSet<&String> = ids.iter().skip(1).step_by(2).collect();
        wait_for_live(&seen, &must, round).await;
        for (id, at) in seen.lock().unwrap().iter().filter(|(id, _)| id.starts_with(&format!("r{round}-"))) {
            assert!(*at + 5 >= fire_at, "{id} delivered {} ms early", fire_at - at);
            assert!(!cancelled.contains(id), "{id} was delivered although its cancel answered CANCELLED");
        }
        eprintln!(
            "round {round}: {} cancelled, {} cancelled while firing, {staged} staged so far",
            cancelled.len(),
            cancelled_while_firing.len()
        );
        if staged > 0 {
            break;
        }
    }
    assert!(staged > 0, "the race was never staged: no cancel answered CANCELLED after the timers' time");
    cluster.shutdown().await;
}

/// Waits (15 s at most) until every timer in `must` was delivered, then
/// half a second more for a wrongly sent attempt to arrive.
async fn wait_for_live(seen: &Mutex<Vec<(String, u64)>>, must: &BTreeSet<&String>, round: usize) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let got: BTreeSet<String> = seen.lock().unwrap().iter().map(|(id, _)| id.clone()).collect();
        if must.iter().all(|id| got.contains(*id)) {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "round {round}: not every live timer was delivered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
}

/// A held attempt whose cancel's applied entry never reached the fire loop
/// (its queue was full: the `events::lose` fault point loses it the same
/// way) is not sent: the loop sends nothing held while events are lost and
/// not yet read again, and the timers that still stand are delivered at
/// their attempts' deadline instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cancel_whose_event_the_fire_loop_lost_still_wins() {
    let cluster = Cluster::start(1, SHARDS, |_, config| {
        armed_config(config);
        // A lost event's timers come due again at their attempt's deadline.
        config.delivery.webhook_timeout_ms = 1_000;
    })
    .await;
    let (url, seen) = receiver().await;
    let client = cluster.timers(0).await;

    // Phase: timers due together; 150 ms before their time they are armed
    // (300-250 ms ahead) and held by the leader.
    let fire_at = now_ms() + 1_500;
    let ids: Vec<String> = (0..TIMERS).map(|i| format!("lost-{i}")).collect();
    create_all(&client, ids.iter().map(|id| webhook_create(id, fire_at, &url)).collect()).await;

    // Phase: a first loss, long before the timers' time: the loop reads the
    // index again at once, and may not again for RESCAN_EVERY (5 s), so the
    // next loss below is one it has not yet read past.
    let decoy = webhook_create("lost-decoy", fire_at + 60_000, &url);
    client.clone().create_timer(decoy).await.expect("decoy create");
    fail::cfg("events::lose", "return(drop)").unwrap();
    let req = pb::CancelTimerRequest { namespace: "armed".into(), id: "lost-decoy".into() };
    client.clone().cancel_timer(req).await.expect("decoy cancel");
    fail::remove("events::lose");
    sleep_until_ms(fire_at - 150).await;

    // Phase: half are cancelled while the fire loop hears of no entry that
    // dispatched nothing: the cancels are applied, and lost to it.
    fail::cfg("events::lose", "return(drop)").unwrap();
    let cancels = ids.iter().step_by(2).map(|id| {
        let mut c = client.clone();
        let req = pb::CancelTimerRequest { namespace: "armed".into(), id: id.clone() };
        async move { c.cancel_timer(req).await.expect("cancel answers").into_inner() }
    });
    let answers = futures::future::join_all(cancels).await;
    fail::remove("events::lose");
    let mut cancelled = BTreeSet::new();
    for (resp, id) in answers.iter().zip(ids.iter().step_by(2)) {
        match pb::cancel_timer_response::Outcome::try_from(resp.outcome).unwrap() {
            pb::cancel_timer_response::Outcome::Cancelled => {
                cancelled.insert(id.clone());
            }
            pb::cancel_timer_response::Outcome::CancelledWhileFiring => {}
            other => panic!("{id}: cancel answered {other:?}"),
        }
    }
    assert!(!cancelled.is_empty(), "no cancel answered CANCELLED before the timers' time: nothing was staged");

    // Phase: every timer not cancelled is delivered, none early; none whose
    // cancel answered CANCELLED ever is.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let must: BTreeSet<&String> = ids.iter().skip(1).step_by(2).collect();
    loop {
        let got: BTreeMap<String, u64> = seen.lock().unwrap().iter().cloned().collect();
        if must.iter().all(|id| got.contains_key(*id)) {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "not every live timer was delivered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    for (id, at) in seen.lock().unwrap().iter() {
        assert!(*at + 5 >= fire_at, "{id} delivered {} ms early", fire_at - at);
        assert!(!cancelled.contains(id), "{id} was delivered although its cancel answered CANCELLED");
    }
    eprintln!("{} cancelled before their time with their events lost; none delivered", cancelled.len());
    cluster.shutdown().await;
}
